"""Outage benchmark: what the users lose while one node is redeployed, ours against the manual sequence.

Two simulated single-GPU nodes, set up like the fleet benchmark's hosts but without speculative decoding
(SGLang updates the weights of a server with a separate draft model only by a restart):

- ours: deployed once by playbooks/redeploy.yml (the first deploy replaces a hand-started server;
  not timed), then, per round, a restart redeploy (schedule_policy flipped between lpm and fcfs: the
  plan says restart) and a weight-only redeploy (model_path flipped between two checkpoints with
  the same config.json and other weight bytes: the plan says weights), on the same node;
- manual: a hand-started server replaced the way an operator does it: SIGTERM, sleep 2, SIGKILL,
  sleep 2, one nvidia-smi, then the new server started by hand with the argv our launcher used.

The rounds alternate the order of the three. Every figure comes from the servers' own log stamps
(SGLANG_LOG_MS) and the new server's process start (/proc/<pid>/stat starttime on CLOCK_BOOTTIME,
_common.proc_start_epoch):

- restart outage = the old server's "SIGTERM received" to the new server's "ready to roll";
- its startup = the new server's process start to "ready to roll" (its own work);
- added beyond startup = process start - SIGTERM (the old server's exit, proving the GPUs and the
  port free, the spawn): the part a tool can shorten;
- weights outage = "Start update_weights" to "Update weights end." / the cache flush (requests wait
  on the update lock, running ones are aborted).

The fake server loads weights in SGLANG_SIM_STARTUP_S at startup; its in-place update is given the
same time (SGLANG_SIM_UPDATE_WEIGHTS_S), so both paths read the checkpoint equally long.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time

import _common as c
import fleet

MANUAL_SLEEP = 2.0


def _cmdline(pid):
    with open("/proc/%d/cmdline" % pid, "rb") as fh:
        return [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]


def manual_argv(pid, port):
    """The argv our launcher started ``pid`` with, on ``port``."""
    argv = _cmdline(pid)
    i = argv.index("--port")
    return argv[:i + 1] + [str(port)] + argv[i + 2:]


def wait_ready(log_path, after, timeout=180.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ev = c.server_events([log_path], after - 0.01, time.time() + 1)
        ready = next((at for at, kind in ev if kind == "ready"), None)
        if ready is not None:
            return ready
        time.sleep(0.02)
    return None


def manual_replace(h, current, old_log, argv, env, n):
    """SIGTERM, sleep 2, SIGKILL, sleep 2, nvidia-smi, start by hand; returns (figures, new server item)."""
    t0 = time.time()
    current.send(signal.SIGTERM)
    time.sleep(MANUAL_SLEEP)
    killed = current.send(signal.SIGKILL)
    time.sleep(MANUAL_SLEEP)
    smi = subprocess.run([c.NVIDIA_SMI, "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"], env=env,
                         stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, check=False)
    new_log = os.path.join(h["dir"], "log", "manual-%d.log" % n)
    pid = c.spawn_detached(argv, env, new_log)
    item = c.REGISTRY.add(pid, "hand-started server %s" % h["name"])
    started = c.proc_start_epoch(pid)
    ready = wait_ready(new_log, t0)
    c.REGISTRY.stop([current], grace=2.0)
    events = c.server_events([old_log, new_log], t0 - 0.5, time.time() + 1)
    out = c.outage_from_events(events, started) or {}
    out.update({"wall": (ready or time.time()) - t0, "sigkill_sent": killed, "smi_rc": smi.returncode,
                "ready": ready is not None})
    return out, item, new_log


def _redeploy(opts, base, host, models, kind, state, n, launched):
    if kind == "restart":
        state["policy"] = "lpm" if state["policy"] == "fcfs" else "fcfs"
    else:
        state["model"] = "kimi-k2.5-step2" if state["model"] == "kimi-k2.5" else "kimi-k2.5"
    args = fleet.server_args(models, plain=True, model_path=os.path.join(models, state["model"]),
                             schedule_policy=state["policy"])
    # Progress lines off: this part counts the redeploy's own module runs against issue 15's goal; the "progress"
    # part measures what the lines cost (its async job and progress reads) on their own.
    out, new = fleet.timed_run(opts, base, [host], kind, {"sglang_server_args": args, "sglang_server_progress_interval": 0},
                               "%s-%d" % (kind, n), quiet=True)
    launched += new
    h = out["hosts"][0]
    out["mode"] = out["modes"].get(host["name"])
    out["outage"] = h["outage"]
    out["ok"] = (out["rc"] == 0 and out["deployed"] == 1 and out["mode"] == kind
                 and bool(h["outage"]) and h["outage"]["kind"] == kind)
    return out


def run(opts, workdir):
    base = os.path.join(workdir, "outage")
    models = os.path.join(base, "models")
    fleet.write_models(models, weights=True)
    os.makedirs(os.path.join(base, "reports"))
    extra = {"SGLANG_SIM_UPDATE_WEIGHTS_S": str(fleet.STARTUP_S)}
    ours = fleet.make_hosts(base, 1, prefix="ours", profile=opts.profile)[0]
    man = fleet.make_hosts(base, 1, prefix="manual")[0]
    fleet.write_inventory(os.path.join(base, "inventory.yml"), [ours], models, server_extra_env=extra, plain=True)
    old = fleet.start_old_servers([ours, man], models, server_extra_env=extra, plain=True)
    launched = []
    result = {"config": {"rounds": opts.outage_runs, "startup_s": fleet.STARTUP_S,
                         "update_weights_s": fleet.STARTUP_S, "drain_poll_s": fleet.DRAIN_POLL_S,
                         "manual": "SIGTERM, sleep %g, SIGKILL, sleep %g, nvidia-smi, start by hand"
                                   % (MANUAL_SLEEP, MANUAL_SLEEP)},
              "restart": [], "weights": [], "manual": []}
    try:
        first, new = fleet.timed_run(opts, base, [ours], "adopt", {}, "first", quiet=True)
        launched += new
        if first["rc"] != 0 or first["deployed"] != 1:
            raise RuntimeError("outage benchmark: the first deploy failed (%s)" % first["log"])
        argv = manual_argv(int(first["hosts"][0]["pid"]), man["port"])
        env = c.base_env(**fleet.server_env(man["root"], **extra))
        env["PATH"] = c.NODE_PATH
        state = {"policy": "fcfs", "model": "kimi-k2.5"}
        current, current_log = old[1], man["incident_log"]
        kinds = ["restart", "weights", "manual"]
        for n in range(opts.outage_runs):
            for kind in kinds[n % 3:] + kinds[:n % 3]:
                load = c.loadavg()
                if kind == "manual":
                    out, current, current_log = manual_replace(man, current, current_log, argv, env, n)
                    out["ok"] = bool(out.get("ready") and out.get("kind") == "restart")
                    shown = out
                else:
                    out = _redeploy(opts, base, ours, models, kind, state, n, launched)
                    shown = out["outage"] or {}
                out["load"] = load
                result[kind].append(out)
                print("  outage round %d %-8s %s wall %5.1f s, outage %s s%s, load %.1f" % (
                    n + 1, kind + ":", "ok  " if out["ok"] else "FAIL", out["wall"], c.fmt(shown.get("outage_s")),
                    (", beyond startup %s s" % c.fmt(shown.get("added_s"))) if shown.get("added_s") is not None else "",
                    load[0]), flush=True)
        launched.append(current)
    finally:
        c.REGISTRY.stop(old + launched)
    result["summary"] = summarise(result)
    return result


def _med(runs, key, sub="outage"):
    vals = []
    for r in runs:
        src = r.get(sub) if sub else r
        if src and r.get("ok"):
            vals.append(src.get(key))
    return c.median(vals)


def summarise(result):
    rs, ws, ms = result["restart"], result["weights"], result["manual"]
    s = {
        "ours_outage_s": _med(rs, "outage_s"), "ours_startup_s": _med(rs, "startup_s"), "ours_added_s": _med(rs, "added_s"),
        "ours_added_max_s": max([r["outage"]["added_s"] for r in rs if r.get("ok")] or [0]) or None,
        "ours_added_s_btime": _med(rs, "added_s_btime"), "ours_startup_s_btime": _med(rs, "startup_s_btime"),
        "manual_outage_s": _med(ms, "outage_s", None), "manual_startup_s": _med(ms, "startup_s", None),
        "manual_added_s": _med(ms, "added_s", None),
        "weights_outage_s": _med(ws, "outage_s"),
        "smi_calls_in_window": _med(rs, "smi_calls_in_window"), "smi_s_in_window": _med(rs, "smi_s_in_window"),
        "smi_calls": c.median([r["hosts"][0]["smi_calls"] for r in rs if r.get("ok")]),
        "smi_s": c.median([r["hosts"][0]["smi_s"] for r in rs if r.get("ok")]),
        "restart_wall_s": c.median([r["wall"] for r in rs if r.get("ok")]),
        "weights_wall_s": c.median([r["wall"] for r in ws if r.get("ok")]),
        "overhead_s": c.median([r["overhead"] for r in rs if r.get("ok")]),
        "intrinsic_s": c.median([r["intrinsic_max"] for r in rs if r.get("ok")]),
        "shutdown_s": c.median([r["shutdown_s"] for r in rs if r.get("ok")]),
        "smoke_s": c.median([r["smoke_s"] for r in rs if r.get("ok")]),
        "module_runs": c.median([r["module_runs_per_host"] for r in rs if r.get("ok")]),
        "tasks": c.median([r["tasks_per_host"] for r in rs if r.get("ok")]),
        "executed": c.median([r["executed_per_host"] for r in rs if r.get("ok")]),
        "skipped": c.median([r["skipped_per_host"] for r in rs if r.get("ok")]),
        "fork_workers": c.median([r["fork_workers_per_host"] for r in rs if r.get("ok")]),
        "cpu_controller": c.median([r["cpu_controller_per_host"] for r in rs if r.get("ok")]),
        "cpu_main": c.median([r["cpu_main_per_host"] for r in rs if r.get("ok")]),
        "cpu_modules": c.median([r["cpu_modules_per_host"] for r in rs if r.get("ok")]),
        "weights_module_runs": c.median([r["module_runs_per_host"] for r in ws if r.get("ok")]),
        "weights_tasks": c.median([r["tasks_per_host"] for r in ws if r.get("ok")]),
        "failures": sum(1 for r in rs + ws + ms if not r.get("ok")),
        "load_1min": c.median([r["load"][0] for r in rs + ws + ms]),
    }
    if s["ours_added_s"] is not None and s["manual_added_s"]:
        s["added_ratio"] = s["ours_added_s"] / s["manual_added_s"]
    if s["ours_outage_s"] is not None and s["manual_outage_s"]:
        s["outage_ratio"] = s["ours_outage_s"] / s["manual_outage_s"]
    if s["weights_outage_s"] is not None and s["ours_outage_s"]:
        s["weights_ratio"] = s["weights_outage_s"] / s["ours_outage_s"]
    return s


def report(result):
    s = result["summary"]
    cfg = result["config"]
    rows = [
        ["ours: restart redeploy", c.fmt(s["ours_outage_s"]), c.fmt(s["ours_startup_s"]), c.fmt(s["ours_added_s"]),
         c.fmt(s["restart_wall_s"], 1)],
        ["manual sequence", c.fmt(s["manual_outage_s"]), c.fmt(s["manual_startup_s"]), c.fmt(s["manual_added_s"]), "-"],
        ["ours: weight-only redeploy", c.fmt(s["weights_outage_s"]), "-", "-", c.fmt(s["weights_wall_s"], 1)],
    ]
    lines = [
        "Outage on one simulated node (medians of %d rounds; the server logs' own stamps; manual = %s;"
        % (cfg["rounds"], cfg["manual"]),
        " startup %.1f s load + warmup, weight update %.1f s, drain poll %.1f s)"
        % (cfg["startup_s"], cfg["update_weights_s"], cfg["drain_poll_s"]),
        c.table(["redeploy", "outage s", "new server startup s", "added beyond startup s", "playbook wall s"], rows),
        "added ours / manual = %s; outage ours / manual = %s; weight-only / restart outage = %s"
        % (c.fmt(s.get("added_ratio")), c.fmt(s.get("outage_ratio")), c.fmt(s.get("weights_ratio"))),
        "(with the old clock, btime in whole seconds, the same restarts read: startup %s s, added %s s)"
        % (c.fmt(s.get("ours_startup_s_btime")), c.fmt(s.get("ours_added_s_btime"))),
        "(of ours' added %s s: the old server's own exit %s s (SIGTERM to exit, as sglang_replace saw it), then %s s to"
        " the new server's process start, of which nvidia-smi %s calls, %s s; nvidia-smi in the whole redeploy: %s calls,"
        " %s s)" % (c.fmt(s.get("ours_added_s")), c.fmt(s.get("shutdown_s")),
                    c.fmt((s["ours_added_s"] - s["shutdown_s"]) if s.get("ours_added_s") is not None
                          and s.get("shutdown_s") is not None else None),
                    c.fmt(s.get("smi_calls_in_window"), 0), c.fmt(s.get("smi_s_in_window")), c.fmt(s.get("smi_calls"), 0),
                    c.fmt(s.get("smi_s"))),
    ]
    last = [r for r in result["restart"] if r.get("ok")]
    if last:
        b = last[-1]["hosts"][0]["breakdown"]
        brows = [[k, c.fmt(v)] for k, v in b["parts"].items()]
        brows.append(["wall (sum of the above)", c.fmt(sum(b["parts"].values()))])
        lines.append("\nA 1-host restart redeploy, part by part (round %d: %d module tasks, %d controller-only tasks,"
                     " %d skipped):" % (len(last), b["counts"]["module"], b["counts"]["controller"], b["counts"]["skipped"]))
        lines.append(c.table(["part", "s"], brows))
        if last[-1].get("profiles"):
            import profiles  # pylint: disable=import-outside-toplevel
            lines.append("\n" + profiles.report(last[-1]["profiles"]))
        lines.append("\nWhere a 1-host restart redeploy spent its time (round %d):" % (len(last)))
        lines.append(fleet.profile_table(last[-1]["tasks"], limit=8))
    return "\n".join(lines)
