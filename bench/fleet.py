"""Fleet benchmark: playbooks/redeploy.yml against 1, 8 and 32 simulated hosts at once.

Each host is `ansible_connection: local` with its own GPUSIM_ROOT (one
simulated H200), port, lock, config, state and log directories. Sizing for a
2-core machine: one GPU and `tp_size: 1` per host (a fake server is then three
Python processes: main, one scheduler, the detokenizer), a 2-request smoke of
16 tokens, no smoke gates. Two timed runs per size, on fresh nodes:

- adopt: the benchmark first starts every host's "incident" server itself
  (EAGLE3, topk 1, steps 1, 16 draft tokens, by hand as in the demo), so the
  redeploy does the whole job of a first deploy: preflight, lock, teardown of
  the old server, GPU verification, directories, launch, verification, smoke,
  promote, report.
- change: then a config change (schedule_policy lpm) is pushed to the fleet
  that adopt deployed: the managed server is restarted, the directories are in
  place (the common redeploy).

Each run uses `-e sglang_serial=100%` (one batch) and ansible.cfg's forks = 32.

Intrinsic waits, subtracted per host to show the orchestration overhead:
old server shutdown (gpu_drain's seconds_to_exit of the server: SGLang's drain
and scheduler shutdown), new server startup (process start to its "ready to
roll" log line: simulated load + warmup), and the smoke benchmark's elapsed.
Overhead = wall - max over hosts of (shutdown + startup + smoke).
"""
from __future__ import annotations

import datetime
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

READY = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3})\] The server is fired up and ready to roll!")


def server_env(root):
    return {
        "PYTHONPATH": c.SIM_PY,
        "GPUSIM_ROOT": root,
        "SGLANG_SIM_STARTUP_S": str(STARTUP_S),
        "SGLANG_SIM_DRAIN_POLL_S": str(DRAIN_POLL_S),
        "SGLANG_LOG_MS": "1",
    }


def server_args(models, **change):
    """The intended server args of every host (the incident's, which the policy corrects), plus ``change``."""
    args = {"model_path": "%s/kimi-k2.5" % models, "tp_size": 1, "port": "{{ sglang_server_port }}",
            "speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "%s/kimi-k2.5-eagle3" % models,
            "speculative_eagle_topk": 1, "speculative_num_steps": 1, "speculative_num_draft_tokens": 16}
    args.update(change)
    return args


def write_inventory(path, hosts, models):
    lines = ["---", "all:", "  children:", "    gpu-nodes:", "      hosts:"]
    for h in hosts:
        env = dict(server_env(h["root"]))
        lines += [
            "        %s:" % h["name"],
            "          ansible_connection: local",
            "          ansible_python_interpreter: %s" % c.PYTHON,
            "          sglang_node_environment:",
            "            GPUSIM_ROOT: %s" % h["root"],
            "            PATH: %s" % c.NODE_PATH,
            "          gpufleet_gpu_device_paths: [\"%s/dev/nvidia*\"]" % h["root"],
            "          sglang_lock_dir: %s" % h["state"],
            "          sglang_server_config_dir: %s" % h["etc"],
            "          sglang_server_state_dir: %s" % h["state"],
            "          sglang_server_log_file: %s" % h["log"],
            "          sglang_server_port: %d" % h["port"],
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
        "    sglang_server_args: %s" % json.dumps(server_args(models)),
        "    gpu_teardown_term_timeout: 30",
        "    gpu_teardown_nvidia_smi: %s" % c.NVIDIA_SMI,
        "    gpu_verify_timeout: 60",
        "    gpu_verify_nvidia_smi: %s" % c.NVIDIA_SMI,
        "    sglang_smoke_requests: %d" % SMOKE_REQUESTS,
        "    sglang_smoke_max_new_tokens: %d" % SMOKE_TOKENS,
    ]
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")


def setup_size(workdir, size, n):
    from gpusim.node import Node  # pylint: disable=import-outside-toplevel
    base = os.path.join(workdir, "fleet-%d-run%d" % (size, n))
    models = os.path.join(base, "models")
    os.makedirs(os.path.join(models, "kimi-k2.5"))
    os.makedirs(os.path.join(models, "kimi-k2.5-eagle3"))
    os.makedirs(os.path.join(base, "reports"))
    with open(os.path.join(models, "kimi-k2.5", "config.json"), "w") as fh:
        fh.write('{"architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2"}\n')
    with open(os.path.join(models, "kimi-k2.5-eagle3", "config.json"), "w") as fh:
        fh.write('{"architectures": ["LlamaForCausalLMEagle3"]}\n')
    hosts = []
    for i, port in enumerate(c.free_ports(size)):
        d = os.path.join(base, "hosts", "node%02d" % i)
        h = {"name": "node%02d" % i, "dir": d, "root": os.path.join(d, "node"), "state": os.path.join(d, "state"),
             "etc": os.path.join(d, "etc"), "log": os.path.join(d, "log", "server.log"), "port": port}
        for sub in ("state", "etc", "log"):
            os.makedirs(os.path.join(d, sub))
        Node.create(h["root"], gpus=1, model="H200")
        hosts.append(h)
    write_inventory(os.path.join(base, "inventory.yml"), hosts, models)
    return base, models, hosts


def start_old_servers(hosts, models):
    """The servers someone started by hand (the incident), one per host; not our children."""
    items = []
    for h in hosts:
        env = c.base_env(**server_env(h["root"]))
        env["PATH"] = c.NODE_PATH
        argv = [c.PYTHON, "-m", "sglang.launch_server", "--model-path", os.path.join(models, "kimi-k2.5"),
                "--tp-size", "1", "--port", str(h["port"]), "--speculative-draft-model-path",
                os.path.join(models, "kimi-k2.5-eagle3")] + INCIDENT
        pid = c.spawn_detached(argv, env, os.path.join(h["dir"], "log", "incident.log"))
        items.append(c.REGISTRY.add(pid, "incident server %s" % h["name"]))
    missing = c.wait_http_ok([h["port"] for h in hosts], timeout=180)
    if missing:
        raise RuntimeError("incident servers on ports %s never became healthy" % missing)
    return items


def ready_time(log_path, after=0.0):
    """When the server started at ``after`` logged "ready to roll" (the log also holds earlier servers' lines)."""
    try:
        with open(log_path, errors="replace") as fh:
            for line in fh:
                m = READY.match(line)
                if m:
                    dt = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f")
                    # asctime is local time
                    if dt.timestamp() >= after - 1.0:   # /proc/stat btime has 1 s resolution
                        return dt.timestamp()
    except OSError:
        pass
    return None


def analyse_host(h, recs):
    """Intrinsic waits of one host from the callback records, and the new server's PID."""
    out = {"host": h["name"], "tasks": len(recs), "modules": 0, "skipped": 0}
    for r in recs:
        if r["status"] == "skipped":
            out["skipped"] += 1
        elif not r["action"].startswith(("ansible.builtin.set_fact", "ansible.builtin.debug", "ansible.builtin.assert",
                                         "ansible.builtin.include", "ansible.builtin.import", "ansible.builtin.meta",
                                         "ansible.builtin.fail", "ansible.builtin.validate_argument_spec")):
            out["modules"] += 1
    if recs:
        out["span"] = max(r["end"] for r in recs) - min(r["start"] or r["end"] for r in recs)
    drain = [r for r in recs if r["action"].endswith("gpu_drain") and r.get("signalled")]
    launch = [r for r in recs if r["action"].endswith("sglang_launch") and r.get("startup_s") is not None]
    smoke = [r for r in recs if r["action"].endswith("sglang_smoke") and r["status"] == "ok"]
    exits = [s.get("seconds_to_exit") for r in drain for s in r["signalled"] if s.get("seconds_to_exit") is not None]
    out["shutdown_s"] = max(exits) if exits else 0.0
    out["smoke_s"] = smoke[-1].get("elapsed") if smoke else 0.0
    out["startup_s_module"] = launch[-1]["startup_s"] if launch else None
    out["pid"] = launch[-1].get("pid") if launch else None
    out["startup_s"] = None
    if out["pid"]:
        started = c.proc_start_epoch(int(out["pid"]))
        ready = ready_time(h["log"], started) if started else None
        if started and ready:
            out["startup_s"] = ready - started
    if out["startup_s"] is None:
        out["startup_s"] = out["startup_s_module"] or 0.0
    out["health_lag_s"] = (out["startup_s_module"] - out["startup_s"]) if out["startup_s_module"] else None
    out["intrinsic_s"] = out["shutdown_s"] + out["startup_s"] + (out["smoke_s"] or 0.0)
    return out


def is_server_of(pid, h):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            argv = fh.read().decode(errors="replace").split("\0")
    except OSError:
        return False
    return "sglang.launch_server" in argv and str(h["port"]) in argv


def task_profile(timing):
    """Per task name: hosts, median duration and the sum over hosts (where the time goes)."""
    by = {}
    for r in timing:
        if r["start"] is None or r["status"] == "skipped":
            continue
        by.setdefault((r["task"], r["action"]), []).append(r["end"] - r["start"])
    rows = [{"task": k[0], "action": k[1], "hosts": len(v), "median_s": c.median(v), "sum_s": sum(v)} for k, v in by.items()]
    rows.sort(key=lambda x: -x["sum_s"])
    return rows


def timed_run(opts, base, hosts, size, n, case, extravars):
    """One timed ansible-playbook run of the redeploy; returns (figures, the servers it launched)."""
    env = c.base_env()
    load = c.loadavg()
    tag = "%s-%d" % (case, n)
    prof = os.path.join(base, "controller-%s.prof" % tag) if opts.profile else None
    res = c.run_playbook(["-i", os.path.join(base, "inventory.yml"), opts.playbook,
                          "-l", "gpu-nodes", "-e", json.dumps(dict(extravars, sglang_serial="100%"))],
                         env, os.path.join(base, "ansible-%s.log" % tag), base, profile=opts.profile, cprofile=prof)
    timing = res["timing"] or []
    per_host = []
    new = []
    for h in hosts:
        a = analyse_host(h, [r for r in timing if r["host"] == h["name"]])
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
            if is_server_of(pid, h):
                new.append(c.REGISTRY.add(pid, "redeployed server %s (%s)" % (h["name"], case)))
    statuses = {}
    for name in sorted(os.listdir(os.path.join(base, "reports"))):
        if name.endswith(".json"):
            with open(os.path.join(base, "reports", name)) as fh:
                for row in json.load(fh):
                    statuses[row["host"]] = row["status"]
    for name in os.listdir(os.path.join(base, "reports")):
        os.unlink(os.path.join(base, "reports", name))
    deployed = sum(1 for s in statuses.values() if s == "deployed")
    intrinsic = max(a["intrinsic_s"] for a in per_host)
    out = {
        "size": size, "case": case, "run": n, "rc": res["rc"], "load": load, "wall": res["wall"], "cpu": res["cpu"],
        "cpu_main": res["cpu_main"], "cpu_per_host": res["cpu"] / size,
        "cpu_main_per_host": (res["cpu_main"] / size) if res["cpu_main"] is not None else None,
        "deployed": deployed, "statuses": statuses,
        "intrinsic_max": intrinsic, "overhead": res["wall"] - intrinsic,
        "shutdown_s": c.median([a["shutdown_s"] for a in per_host]),
        "startup_s": c.median([a["startup_s"] for a in per_host]),
        "smoke_s": c.median([a["smoke_s"] for a in per_host]),
        "health_lag_s": c.median([a["health_lag_s"] for a in per_host]),
        "modules_per_host": c.median([a["modules"] for a in per_host]),
        "tasks_per_host": c.median([a["tasks"] for a in per_host]),
        "hosts": per_host, "tasks": task_profile(timing), "log": res["log"], "profile": prof,
    }
    print("  fleet %2d hosts, %-6s run %d: %.1f s wall, %.1f CPU-s (%.2f/host), %d/%d deployed, overhead %.1f s, load %.1f"
          % (size, case, n + 1, out["wall"], out["cpu"], out["cpu_per_host"], deployed, size, out["overhead"], load[0]),
          flush=True)
    return out, new


def run_size(opts, workdir, size, n):
    """The two cases on fresh nodes: ``adopt`` replaces the hand-started incident servers (the first
    deploy: every directory is created); ``change`` then pushes a config change (schedule_policy lpm)
    to the fleet that ``adopt`` deployed (a managed server to restart, directories in place)."""
    base, models, hosts = setup_size(workdir, size, n)
    old = start_old_servers(hosts, models)
    launched = []
    try:
        adopt, new = timed_run(opts, base, hosts, size, n, "adopt", {})
        launched += new
        change, new = timed_run(opts, base, hosts, size, n, "change",
                                {"sglang_server_args": server_args(models, schedule_policy="lpm")})
        launched += new
    finally:
        c.REGISTRY.stop(old + launched)
    return {"adopt": adopt, "change": change}


CASES = ("adopt", "change")


def run(opts, workdir):
    by_size = {size: [run_size(opts, workdir, size, n) for n in range(opts.fleet_runs)] for size in opts.sizes}
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
                       "cases": {"adopt": "first deploy: replace the hand-started incident server",
                                 "change": "config change (schedule_policy lpm) on the fleet that adopt deployed"}},
            "sizes": sizes}


def summarise(size, case, runs):
    keys = ("wall", "cpu", "cpu_per_host", "cpu_main_per_host", "overhead", "intrinsic_max", "shutdown_s", "startup_s",
            "smoke_s", "health_lag_s", "modules_per_host", "tasks_per_host")
    s = {"size": size, "case": case, "runs": runs}
    for k in keys:
        s[k] = c.median([r[k] for r in runs])
    s["load_1min"] = c.median([r["load"][0] for r in runs])
    s["failed"] = any(r["rc"] != 0 or r["deployed"] != size for r in runs)
    s["deployed"] = min(r["deployed"] for r in runs)
    return s


def report(result):
    rows = []
    for s in result["sizes"]:
        rows.append([s["case"], s["size"], c.fmt(s["wall"], 1), c.fmt(s.get("wall_vs_1")), c.fmt(s.get("wall_per_host_vs_1"), 3),
                     c.fmt(s["cpu_per_host"]), c.fmt(s["cpu_main_per_host"]), c.fmt(s["intrinsic_max"], 1),
                     c.fmt(s["overhead"], 1), c.fmt(s["modules_per_host"], 0), "%d/%d" % (s["deployed"], s["size"]),
                     c.fmt(s["load_1min"], 1)])
    cfg = result["config"]
    lines = [
        "Fleet: redeploy.yml, serial 100%%, forks 32; each host 1 simulated H200, tp_size 1, startup %.1f s, smoke %s"
        % (cfg["startup_s"], cfg["smoke"]),
        "(adopt = %s; change = %s)" % (cfg["cases"]["adopt"], cfg["cases"]["change"]),
        "(CPU = the ansible-playbook process tree incl. modules, main = its controller process alone; intrinsic = max over"
        " hosts of old-server shutdown + new-server startup + smoke; overhead = wall - intrinsic; goals: overhead <= 3 s"
        " for 1 host, 32 hosts <= 3x the 1-host wall, CPU/host flat)",
        c.table(["case", "hosts", "wall s", "x 1-host", "per host x", "CPU-s/host", "main/host", "intrinsic s", "overhead s",
                 "module tasks/host", "deployed", "load"], rows),
    ]
    for big in [s for s in result["sizes"] if s["size"] == max(x["size"] for x in result["sizes"])]:
        if big["runs"] and big["runs"][0]["tasks"]:
            lines.append("\nWhere the %d-host %s run spent its host-seconds (task start to end, summed over hosts):"
                         % (big["size"], big["case"]))
            trows = [[t["task"][:60], t["action"].replace("ansible.builtin.", "").replace("gpufleet.sglang.", ""), t["hosts"],
                      c.fmt(t["median_s"]), c.fmt(t["sum_s"], 1)] for t in big["runs"][0]["tasks"][:10]]
            lines.append(c.table(["task", "action", "hosts", "median s", "sum s"], trows))
    return "\n".join(lines)
