"""Fleet benchmark: playbooks/redeploy.yml against 1, 8 and 32 simulated hosts at once.

Each host is `ansible_connection: local` with its own GPUSIM_ROOT (one
simulated H200), port, lock, config, state and log directories. Sizing for a
2-core machine: one GPU and `tp_size: 1` per host (a fake server is then three
Python processes: main, one scheduler, the detokenizer), a 2-request smoke of
16 tokens, no smoke gates. Two timed runs per size, on fresh nodes:

- adopt: the benchmark first starts every host's "incident" server itself
  (EAGLE3, topk 1, steps 1, 16 draft tokens, by hand as in the demo), so the
  redeploy does the whole job of a first deploy.
- change: then a config change (schedule_policy lpm) is pushed to the fleet
  that adopt deployed: the managed server is restarted, the directories are in
  place (the common redeploy).

Each run uses `-e sglang_serial=100%` (one batch) and ansible.cfg's forks = 32.

Per host, from the bench_timing callback (tasks), the module interpreter
wrapper (module runs and their CPU, _common.MODULE_WRAPPER) and the servers'
own logs (SGLANG_LOG_MS stamps):

- intrinsic = the old server's exit (SIGTERM to exit, sglang_replace's
  seconds_to_exit) + the new server's startup (process start to its "ready to
  roll" line) + the smoke's elapsed; overhead = wall - max over hosts;
- the users' outage: the old server's "SIGTERM received" line to the new
  server's "ready to roll" line; added beyond startup = new process start -
  SIGTERM (exit, GPU and port checks, spawn);
- CPU: the ansible-playbook tree (RUSAGE_CHILDREN), its main process alone,
  the module processes (wrapper), and the controller = tree - modules.
"""
from __future__ import annotations

import json
import os
import re

import _common as c

STARTUP_S = 1.0
DRAIN_POLL_S = 0.5
SMOKE_REQUESTS = 2
SMOKE_TOKENS = 16

INCIDENT = ["--speculative-algorithm", "EAGLE3", "--speculative-eagle-topk", "1", "--speculative-num-steps", "1",
            "--speculative-num-draft-tokens", "16"]

# Actions that never start a module process (they run in the controller); used only as a cross-check of
# the wrapper's count.
CONTROLLER_ACTIONS = ("ansible.builtin.set_fact", "ansible.builtin.debug", "ansible.builtin.assert",
                      "ansible.builtin.include", "ansible.builtin.import", "ansible.builtin.meta",
                      "ansible.builtin.fail", "ansible.builtin.validate_argument_spec",
                      "gpufleet.sglang.controller_facts", "gpufleet.sglang.run_report")


def server_env(root, **extra):
    env = {
        "PYTHONPATH": c.SIM_PY,
        "GPUSIM_ROOT": root,
        "SGLANG_SIM_STARTUP_S": str(STARTUP_S),
        "SGLANG_SIM_DRAIN_POLL_S": str(DRAIN_POLL_S),
        "SGLANG_LOG_MS": "1",
    }
    env.update(extra)
    return env


def server_args(models, plain=False, **change):
    """The intended server args of every host (the incident's, which the policy corrects), plus ``change``.
    ``plain``: no speculative decoding (a weight-only redeploy needs a server without a separate draft model)."""
    args = {"model_path": "%s/kimi-k2.5" % models, "tp_size": 1, "port": "{{ sglang_server_port }}"}
    if not plain:
        args.update({"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "%s/kimi-k2.5-eagle3" % models,
                     "speculative_eagle_topk": 1, "speculative_num_steps": 1, "speculative_num_draft_tokens": 16})
    args.update(change)
    return args


def write_inventory(path, hosts, models, server_extra_env=None, plain=False):
    lines = ["---", "all:", "  children:", "    gpu-nodes:", "      hosts:"]
    for h in hosts:
        env = server_env(h["root"], **(server_extra_env or {}))
        lines += [
            "        %s:" % h["name"],
            "          ansible_connection: local",
            "          ansible_python_interpreter: %s" % h["wrapper"],
            "          sglang_node_environment:",
            "            GPUSIM_ROOT: %s" % h["root"],
            # The node's SGLang (the fake) must be importable by sglang_server_python for the preflight's oracle,
            # as on a real node where that interpreter has SGLang installed.
            "            PYTHONPATH: %s" % c.SIM_PY,
            "            PATH: %s" % c.NODE_PATH,
            "          gpufleet_gpu_device_paths: [\"%s/dev/nvidia*\"]" % h["root"],
            "          sglang_lock_dir: %s" % h["state"],
            "          sglang_server_config_dir: %s" % h["etc"],
            "          sglang_server_state_dir: %s" % h["state"],
            "          sglang_server_log_file: %s" % h["log"],
            "          sglang_server_port: %d" % h["port"],
            "          sglang_server_nvidia_smi: %s" % h["smi"],
            "          sglang_server_env:",
        ] + ["            %s: %s" % (k, json.dumps(v)) for k, v in sorted(env.items())]
    lines += [
        "  vars:",
        "    sglang_report_dir: %s" % os.path.dirname(path) + "/reports",
        "    sglang_server_name: bench",
        "    sglang_server_manager: process",
        "    sglang_server_python: %s" % c.PYTHON,
        "    sglang_server_version: \"0.5.23\"",
        "    sglang_server_spec_policy: honor_draft_tokens",
        "    sglang_server_health_timeout: 120",
        "    sglang_server_nvidia_smi: %s" % c.NVIDIA_SMI,
        "    sglang_server_args: %s" % json.dumps(server_args(models, plain=plain)),
        "    gpu_teardown_term_timeout: 30",
        "    gpu_teardown_nvidia_smi: %s" % c.NVIDIA_SMI,
        "    gpu_verify_timeout: 60",
        "    gpu_verify_nvidia_smi: %s" % c.NVIDIA_SMI,
        "    sglang_smoke_requests: %d" % SMOKE_REQUESTS,
        "    sglang_smoke_max_new_tokens: %d" % SMOKE_TOKENS,
    ]
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")


def write_models(models, weights=False):
    """The model directories: config.json and a tiny valid checkpoint (safetensors weights and tokenizer files, what
    the preflight checks); with ``weights``, a second checkpoint of the same architecture, config and tensor layout
    with other bytes, for weight-only redeploys."""
    from gpusim.checkpoint import write_checkpoint  # pylint: disable=import-outside-toplevel
    config = '{"architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2"}\n'
    write_checkpoint(os.path.join(models, "kimi-k2.5"), config=config, seed="kimi-k2.5")
    write_checkpoint(os.path.join(models, "kimi-k2.5-eagle3"), config='{"architectures": ["LlamaForCausalLMEagle3"]}\n',
                     seed="kimi-k2.5-eagle3")
    if weights:
        write_checkpoint(os.path.join(models, "kimi-k2.5-step2"), config=config, seed="kimi-k2.5-step2")


def make_hosts(base, size, prefix="node", profile=False):
    from gpusim.node import Node  # pylint: disable=import-outside-toplevel
    hosts = []
    for i, port in enumerate(c.free_ports(size)):
        name = "%s%02d" % (prefix, i)
        d = os.path.join(base, "hosts", name)
        h = {"name": name, "dir": d, "root": os.path.join(d, "node"), "state": os.path.join(d, "state"),
             "etc": os.path.join(d, "etc"), "log": os.path.join(d, "log", "server.log"),
             "incident_log": os.path.join(d, "log", "incident.log"), "port": port,
             "wrapper": os.path.join(d, "python"), "recdir": os.path.join(d, "module-runs"),
             "smi": os.path.join(d, "nvidia-smi"), "smi_log": os.path.join(d, "smi-calls.log")}
        for sub in ("state", "etc", "log"):
            os.makedirs(os.path.join(d, sub))
        c.write_module_wrapper(h["wrapper"], h["recdir"], profile=profile)
        c.write_timed_smi(h["smi"], h["smi_log"])
        Node.create(h["root"], gpus=1, model="H200")
        hosts.append(h)
    return hosts


def setup_size(workdir, size, n, profile=False):
    base = os.path.join(workdir, "fleet-%d-run%d" % (size, n))
    models = os.path.join(base, "models")
    write_models(models)
    os.makedirs(os.path.join(base, "reports"))
    hosts = make_hosts(base, size, profile=profile)
    write_inventory(os.path.join(base, "inventory.yml"), hosts, models)
    return base, models, hosts


def incident_argv(models, port, plain=False):
    argv = [c.PYTHON, "-m", "sglang.launch_server", "--model-path", os.path.join(models, "kimi-k2.5"),
            "--tp-size", "1", "--port", str(port)]
    if plain:
        return argv
    return argv + ["--speculative-draft-model-path", os.path.join(models, "kimi-k2.5-eagle3")] + INCIDENT


def start_old_servers(hosts, models, server_extra_env=None, plain=False):
    """The servers someone started by hand (the incident), one per host; not our children."""
    items = []
    for h in hosts:
        env = c.base_env(**server_env(h["root"], **(server_extra_env or {})))
        env["PATH"] = c.NODE_PATH
        pid = c.spawn_detached(incident_argv(models, h["port"], plain), env, h["incident_log"])
        items.append(c.REGISTRY.add(pid, "incident server %s" % h["name"]))
    missing = c.wait_http_ok([h["port"] for h in hosts], timeout=180)
    if missing:
        raise RuntimeError("incident servers on ports %s never became healthy" % missing)
    return items


def _is_module_task(r):
    return r["status"] != "skipped" and not r["action"].startswith(CONTROLLER_ACTIONS)


def analyse_host(h, recs, module_runs, t0, t1, smi_calls=()):
    """One host's tasks, module runs, intrinsic waits and outage for the run in [t0, t1]."""
    c.attach_module_runs(recs, module_runs)
    out = {"host": h["name"], "tasks": len(recs), "skipped": sum(1 for r in recs if r["status"] == "skipped"),
           "module_runs": len(module_runs), "module_tasks": sum(1 for r in recs if _is_module_task(r)),
           "module_cpu": sum(m["cpu"] for m in module_runs), "wrapper_cpu": sum(m["shell_cpu"] for m in module_runs)}
    out["executed"] = out["tasks"] - out["skipped"]
    replace = [r for r in recs if r["action"].endswith(("sglang_replace", "sglang_launch")) and r["status"] == "ok"]
    # The smoke gate runs in sglang_promote (smoke_gate) on a single-node server, in sglang_smoke otherwise.
    smoke = [r.get("smoke") or r for r in recs if r["status"] == "ok" and (
        r["action"].endswith("sglang_smoke") or (r["action"].endswith("sglang_promote") and r.get("smoke")))]
    exits = [s.get("seconds_to_exit") for r in recs if r["action"].endswith(("sglang_replace", "gpu_drain"))
             for s in r.get("signalled") or [] if s.get("seconds_to_exit") is not None]
    out["shutdown_s"] = max(exits) if exits else 0.0
    out["smoke_s"] = (smoke[-1].get("elapsed") or 0.0) if smoke else 0.0
    launch = (replace[-1].get("launch") or {}) if replace else {}
    out["pid"] = launch.get("pid") or (replace[-1].get("pid") if replace else None)
    out["startup_s_module"] = launch.get("startup_s") or (replace[-1].get("startup_s") if replace else None)
    out["replace_timings"] = replace[-1].get("timings") if replace else None
    out["torn_down"] = replace[-1].get("torn_down") if replace else None
    out["weights_timings"] = ((replace[-1].get("weights") or {}).get("timings")) if replace else None
    started = c.proc_start_epoch(int(out["pid"])) if out["pid"] else None
    out["new_start"] = started
    events = c.server_events([h["incident_log"], h["log"]], t0, t1 + 1)
    out["outage"] = c.outage_from_events(events, started)
    if out["outage"] and out["outage"]["kind"] == "restart":
        # What the old clock (btime, whole seconds) would have said, to show what the fix changed.
        old = c.outage_from_events(events, c.proc_start_epoch_btime(int(out["pid"])))
        if old and old["kind"] == "restart":
            out["outage"].update(startup_s_btime=old["startup_s"], added_s_btime=old["added_s"])
    out["startup_s"] = out["outage"].get("startup_s") if out["outage"] else None
    if out["startup_s"] is None:
        out["startup_s"] = 0.0 if out["torn_down"] is False else (out["startup_s_module"] or 0.0)
    out["intrinsic_s"] = out["shutdown_s"] + out["startup_s"] + (out["smoke_s"] or 0.0)
    if out["outage"] and out["outage"]["kind"] == "weights":
        out["intrinsic_s"] += out["outage"]["outage_s"]       # the update itself (reading the checkpoint)
    if recs:
        out["span"] = max(r["end"] for r in recs) - min(r["start"] or r["end"] for r in recs)
    out["smi_calls"] = len(smi_calls)
    out["smi_s"] = sum(e - s for s, e, dummy in smi_calls)
    o = out["outage"]
    if o and o["kind"] == "restart":
        inside = [(s, e, a) for s, e, a in smi_calls if o["sigterm_at"] <= s <= o["new_start"]]
        o.update(smi_calls_in_window=len(inside), smi_s_in_window=sum(e - s for s, e, dummy in inside),
                 smi_in_window=[{"after_sigterm_s": round(s - o["sigterm_at"], 3), "s": round(e - s, 3), "args": a}
                                for s, e, a in inside])
    out["breakdown"] = breakdown(recs, t0, t1, out["intrinsic_s"])
    sources = [r.get("resolution_source") for r in recs if r["action"].endswith("sglang_preflight")]
    out["resolution_source"] = sources[-1] if sources else None
    out["failures"] = [{"task": r["task"], "msg": str(r.get("msg"))[:2000]} for r in recs if r["status"] == "failed"]
    out["task_rows"] = [{"task": r["task"], "action": r["action"], "status": r["status"],
                         "wall": (r["end"] - r["start"]) if r.get("start") else None,
                         "proc_wall": sum(m["end"] - m["start"] for m in r["module_runs"]),
                         "proc_cpu": sum(m["cpu"] for m in r["module_runs"]), "module_runs": len(r["module_runs"])}
                        for r in recs]
    return out


def breakdown(recs, t0, t1, intrinsic):
    """Where a 1-host run's wall went, part by part (the parts add up to the wall).

    Tasks run one after the other on one host, so each task is charged the time from the previous
    task's end to its own end: for a module task, the part before its module process started (the gap,
    the fork worker, templating, building the AnsiballZ payload), the process itself, and the part after
    it (the result's way back to the controller's main process).
    """
    recs = sorted([r for r in recs if r.get("end") is not None], key=lambda r: r["end"])
    parts = {"playbook start (process start to the first task)": 0.0,
             "module runs, before the module process (worker fork, templating, AnsiballZ)": 0.0,
             "module processes: intrinsic waits (old server exit, new server startup, smoke)": 0.0,
             "module processes: the rest (interpreter, imports, the modules' own checks)": 0.0,
             "module runs, after the module process (result back to the controller)": 0.0,
             "controller-only tasks (set_fact, debug, assert, include, argument specs)": 0.0,
             "skipped tasks": 0.0,
             "playbook end (last task to exit)": 0.0}
    counts = {"module": 0, "controller": 0, "skipped": 0}
    if not recs:
        return {"parts": parts, "counts": counts}
    first = min(r.get("task_start") or r.get("start") or r["end"] for r in recs)
    parts["playbook start (process start to the first task)"] = first - t0
    prev = first
    proc = 0.0
    for r in recs:
        span = r["end"] - prev
        runs = r.get("module_runs") or []
        if runs:
            counts["module"] += 1
            before = runs[0]["start"] - prev
            inside = sum(m["end"] - m["start"] for m in runs)
            parts["module runs, before the module process (worker fork, templating, AnsiballZ)"] += before
            proc += inside
            parts["module runs, after the module process (result back to the controller)"] += span - before - inside
        elif r["status"] == "skipped":
            counts["skipped"] += 1
            parts["skipped tasks"] += span
        else:
            counts["controller"] += 1
            parts["controller-only tasks (set_fact, debug, assert, include, argument specs)"] += span
        prev = r["end"]
    parts["module processes: intrinsic waits (old server exit, new server startup, smoke)"] = intrinsic
    parts["module processes: the rest (interpreter, imports, the modules' own checks)"] = proc - intrinsic
    parts["playbook end (last task to exit)"] = t1 - prev
    return {"parts": parts, "counts": counts}


def is_server_of(pid, h):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            argv = fh.read().decode(errors="replace").split("\0")
    except OSError:
        return False
    return "sglang.launch_server" in argv and str(h["port"]) in argv


def task_profile(timing):
    """Per task name: hosts, median duration, module process wall and CPU, sums over hosts."""
    by = {}
    for r in timing:
        if r["start"] is None or r["status"] == "skipped":
            continue
        runs = r.get("module_runs") or []
        by.setdefault((r["task"], r["action"]), []).append(
            (r["end"] - r["start"], sum(m["end"] - m["start"] for m in runs), sum(m["cpu"] for m in runs),
             (runs[0]["start"] - r["start"]) if runs else None))
    rows = [{"task": k[0], "action": k[1], "hosts": len(v), "median_s": c.median([x[0] for x in v]),
             "sum_s": sum(x[0] for x in v), "proc_median_s": c.median([x[1] for x in v]),
             "cpu_median_s": c.median([x[2] for x in v]), "before_median_s": c.median([x[3] for x in v])}
            for k, v in by.items()]
    rows.sort(key=lambda x: -x["sum_s"])
    return rows


def collect_report(base):
    rows = {}
    for name in sorted(os.listdir(os.path.join(base, "reports"))):
        if name.endswith(".json"):
            with open(os.path.join(base, "reports", name)) as fh:
                for row in json.load(fh):
                    rows[row["host"]] = row
    for name in os.listdir(os.path.join(base, "reports")):
        os.unlink(os.path.join(base, "reports", name))
    return rows


def timed_run(opts, base, hosts, case, extravars, tag, quiet=False):
    """One timed ansible-playbook run of the redeploy; returns (figures, the servers it launched)."""
    env = c.base_env()
    load = c.loadavg()
    size = len(hosts)
    for h in hosts:
        c.read_module_runs(h["recdir"])      # drop what an earlier run left
        c.read_smi_calls(h["smi_log"])
    prof = os.path.join(base, "controller-%s.prof" % tag) if opts.profile else None
    res = c.run_playbook(["-i", os.path.join(base, "inventory.yml"), opts.playbook,
                          "-l", "gpu-nodes", "-e", json.dumps(dict(extravars, sglang_serial="100%"))],
                         env, os.path.join(base, "ansible-%s.log" % tag), base, profile=opts.profile, cprofile=prof)
    timing = res["timing"] or []
    per_host = []
    new = []
    for h in hosts:
        runs = c.read_module_runs(h["recdir"])
        a = analyse_host(h, [r for r in timing if r["host"] == h["name"]], runs, res["t0"], res["t1"],
                         c.read_smi_calls(h["smi_log"]))
        per_host.append(a)
        pids = set([int(a["pid"])] if a["pid"] else [])
        # Also the playbook's own record, in case the run failed before the launch result came back.
        for name in os.listdir(h["state"]):
            if name.endswith(".pid"):
                with open(os.path.join(h["state"], name)) as fh:
                    m = re.match(r"\s*(\d+)", fh.read())
                if m:
                    pids.add(int(m.group(1)))
        for pid in sorted(pids):
            # Only this host's server: a stale PID file may name a PID that now belongs to someone else.
            if is_server_of(pid, h) and not any(i.pid == pid for i in c.REGISTRY.items):
                new.append(c.REGISTRY.add(pid, "redeployed server %s (%s)" % (h["name"], case)))
    server_cpu = sum(c.tree_cpu(int(a["pid"])) for a in per_host if a["pid"])
    rows = collect_report(base)
    deployed = sum(1 for r in rows.values() if r.get("status") == "deployed")
    intrinsic = max(a["intrinsic_s"] for a in per_host)
    module_cpu = sum(a["module_cpu"] for a in per_host)
    wrapper_cpu = sum(a["wrapper_cpu"] for a in per_host)
    controller = res["cpu"] - module_cpu - wrapper_cpu
    workers = (res["cpu_main_children"] - module_cpu - wrapper_cpu) if res["cpu_main_children"] is not None else None
    outages = [a["outage"] for a in per_host if a["outage"]]
    out = {
        "size": size, "case": case, "tag": tag, "rc": res["rc"], "load": load, "wall": res["wall"], "cpu": res["cpu"],
        "cpu_main": res["cpu_main"], "cpu_per_host": res["cpu"] / size, "server_cpu": server_cpu,
        "cpu_main_per_host": (res["cpu_main"] / size) if res["cpu_main"] is not None else None,
        "cpu_workers_per_host": (workers / size) if workers is not None else None,
        "cpu_controller_per_host": controller / size, "cpu_modules_per_host": module_cpu / size,
        "fork_workers": res["workers"], "fork_workers_per_host": (res["workers"] / size) if res["workers"] else None,
        "deployed": deployed, "statuses": dict((h, r.get("status")) for h, r in rows.items()),
        "modes": dict((h, r.get("mode") or r.get("plan")) for h, r in rows.items()),
        "intrinsic_max": intrinsic, "overhead": res["wall"] - intrinsic,
        "shutdown_s": c.median([a["shutdown_s"] for a in per_host]),
        "startup_s": c.median([a["startup_s"] for a in per_host]),
        "smoke_s": c.median([a["smoke_s"] for a in per_host]),
        "module_runs_per_host": c.median([a["module_runs"] for a in per_host]),
        "module_tasks_per_host": c.median([a["module_tasks"] for a in per_host]),
        "tasks_per_host": c.median([a["tasks"] for a in per_host]),
        "executed_per_host": c.median([a["executed"] for a in per_host]),
        "skipped_per_host": c.median([a["skipped"] for a in per_host]),
        "outage_s": c.median([o.get("outage_s") for o in outages]),
        "outage_max_s": max([o.get("outage_s") or 0 for o in outages] or [0]) if outages else None,
        "added_s": c.median([o.get("added_s") for o in outages]),
        "added_max_s": max([o.get("added_s") or 0 for o in outages] or [0]) if outages else None,
        "hosts": per_host, "tasks": task_profile(timing), "log": res["log"], "profile": prof,
    }
    if res.get("worker_profiles"):
        import profiles  # pylint: disable=import-outside-toplevel
        mods = {}
        for r in timing:
            for m in r.get("module_runs") or []:
                if m.get("prof"):
                    mods.setdefault(r["action"], []).append(m["prof"])
        out["profiles"] = profiles.summarise(res["worker_profiles"], mods)
        if not quiet:
            print(profiles.report(out["profiles"]), flush=True)
    out["resolution_sources"] = sorted(set(str(a["resolution_source"]) for a in per_host))
    for a in per_host:
        if out["statuses"].get(a["host"]) != "deployed":
            for f in a["failures"][:1]:
                print("  %s FAILED (%s): %s" % (a["host"], f["task"], f["msg"][:1500]), flush=True)
    if not quiet:
        print("  %-22s %5.1f s wall, CPU/host %.2f (controller %.2f, modules %.2f), %d/%d deployed, overhead %.1f s,"
              " outage +%s s beyond startup, load %.1f"
              % ("fleet %d hosts, %s:" % (size, case), out["wall"], out["cpu_per_host"], out["cpu_controller_per_host"],
                 out["cpu_modules_per_host"], deployed, size, out["overhead"], c.fmt(out["added_s"]), load[0]), flush=True)
    return out, new


def run_size(opts, workdir, size, n):
    """The two cases on fresh nodes: ``adopt`` replaces the hand-started incident servers (the first
    deploy: every directory is created); ``change`` then pushes a config change (schedule_policy lpm)
    to the fleet that ``adopt`` deployed (a managed server to restart, directories in place)."""
    base, models, hosts = setup_size(workdir, size, n, profile=opts.profile)
    old = start_old_servers(hosts, models)
    launched = []
    try:
        adopt, new = timed_run(opts, base, hosts, "adopt", {}, "adopt-%d" % n)
        launched += new
        change, new = timed_run(opts, base, hosts, "change",
                                {"sglang_server_args": server_args(models, schedule_policy="lpm")}, "change-%d" % n)
        launched += new
    finally:
        c.REGISTRY.stop(old + launched)
    return {"adopt": adopt, "change": change}


CASES = ("adopt", "change")
# The 1-host wall is every ratio's denominator, and one 6 s run varies by a second or more (seen: 5.8 vs 7.1 s
# back to back): the 1-host size runs at least this often and its median is taken. It costs ~13 s a run.
ONE_HOST_RUNS = 3


def runs_for(opts, size):
    return max(opts.fleet_runs, ONE_HOST_RUNS) if size == 1 else opts.fleet_runs


def run(opts, workdir):
    by_size = {size: [run_size(opts, workdir, size, n) for n in range(runs_for(opts, size))] for size in opts.sizes}
    sizes = [summarise(size, case, [r[case] for r in by_size[size]]) for case in CASES for size in opts.sizes]
    for case in CASES:
        one = next((s for s in sizes if s["size"] == 1 and s["case"] == case), None)
        for s in sizes:
            if s["case"] == case and one and one["wall"]:
                s["wall_vs_1"] = s["wall"] / one["wall"]
                s["wall_per_host_vs_1"] = s["wall"] / s["size"] / one["wall"]
                s["cpu_per_host_vs_1"] = s["cpu_per_host"] / one["cpu_per_host"]
    return {"config": {"gpus_per_host": 1, "tp_size": 1, "startup_s": STARTUP_S, "drain_poll_s": DRAIN_POLL_S,
                       "smoke": "%d requests x %d tokens, no gates" % (SMOKE_REQUESTS, SMOKE_TOKENS),
                       "serial": "100%", "forks": 32, "fleet_runs": opts.fleet_runs,
                       "one_host_runs": runs_for(opts, 1),
                       "cases": {"adopt": "first deploy: replace the hand-started incident server",
                                 "change": "config change (schedule_policy lpm) on the fleet that adopt deployed"}},
            "sizes": sizes}


SUMMARY_KEYS = ("wall", "cpu", "cpu_per_host", "cpu_main_per_host", "cpu_workers_per_host", "cpu_controller_per_host",
                "cpu_modules_per_host", "fork_workers_per_host", "overhead", "intrinsic_max", "shutdown_s", "startup_s",
                "smoke_s", "module_runs_per_host", "module_tasks_per_host", "tasks_per_host", "executed_per_host",
                "skipped_per_host", "outage_s", "outage_max_s", "added_s", "added_max_s")


def summarise(size, case, runs):
    s = {"size": size, "case": case, "runs": runs}
    for k in SUMMARY_KEYS:
        s[k] = c.median([r[k] for r in runs])
    s["load_1min"] = c.median([r["load"][0] for r in runs])
    s["failed"] = any(r["rc"] != 0 or r["deployed"] != size for r in runs)
    s["deployed"] = min(r["deployed"] for r in runs)
    return s


def profile_table(rows, limit=10):
    trows = [[t["task"][:58], t["action"].replace("ansible.builtin.", "").replace("gpufleet.sglang.", ""), t["hosts"],
              c.fmt(t["median_s"]), c.fmt(t.get("before_median_s")),
              c.fmt(t["proc_median_s"]) if t["proc_median_s"] else "-",
              c.fmt(t["cpu_median_s"]) if t["cpu_median_s"] else "-", c.fmt(t["sum_s"], 1)] for t in rows[:limit]]
    return c.table(["task", "action", "hosts", "task s", "before proc s", "module proc s", "module CPU s", "sum s"],
                   trows)


def report(result):
    rows = []
    for s in result["sizes"]:
        rows.append([s["case"], s["size"], c.fmt(s["wall"], 1), c.fmt(s.get("wall_vs_1")), c.fmt(s.get("wall_per_host_vs_1"), 3),
                     c.fmt(s["cpu_controller_per_host"]), c.fmt(s["cpu_main_per_host"]), c.fmt(s["cpu_modules_per_host"]),
                     c.fmt(s["intrinsic_max"], 1), c.fmt(s["overhead"], 1), c.fmt(s["module_runs_per_host"], 0),
                     "%s+%s" % (c.fmt(s["executed_per_host"], 0), c.fmt(s["skipped_per_host"], 0)),
                     c.fmt(s["fork_workers_per_host"], 0), c.fmt(s["added_s"]), c.fmt(s["added_max_s"]),
                     "%d/%d" % (s["deployed"], s["size"]), c.fmt(s["load_1min"], 1)])
    cfg = result["config"]
    lines = [
        "Fleet: redeploy.yml, serial 100%%, forks 32; each host 1 simulated H200, tp_size 1, startup %.1f s, smoke %s"
        % (cfg["startup_s"], cfg["smoke"]),
        "(adopt = %s; change = %s)" % (cfg["cases"]["adopt"], cfg["cases"]["change"]),
        "(CPU-s per host: ctrl = the ansible-playbook tree minus the module processes (main process + fork workers),"
        " main = the main process alone, modules = the module processes and what they waited for; intrinsic = max over"
        " hosts of old-server exit + new-server startup + smoke; overhead = wall - intrinsic; tasks = executed+skipped;"
        " added = outage beyond the new server's startup, median and max over hosts)",
        c.table(["case", "hosts", "wall s", "x 1-host", "per host x", "ctrl", "main", "modules", "intrinsic s",
                 "overhead s", "module runs", "tasks", "forks", "added s", "added max", "deployed", "load"], rows),
    ]
    for big in [s for s in result["sizes"] if s["size"] == max(x["size"] for x in result["sizes"])]:
        if big["runs"] and big["runs"][0]["tasks"]:
            lines.append("\nWhere the %d-host %s run spent its host-seconds (task start to end, summed over hosts):"
                         % (big["size"], big["case"]))
            lines.append(profile_table(big["runs"][0]["tasks"]))
    return "\n".join(lines)
