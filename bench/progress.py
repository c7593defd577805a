"""Progress benchmark: what the progress lines of sglang_replace cost the outage (issue 25).

One simulated single-GPU node (the outage benchmark's setup), deployed once (not timed), then per round three
restart redeploys (schedule_policy flipped between lpm and fcfs), in rotating order:

- off: sglang_server_progress_interval 0, the module as one plain run (as before progress existed);
- on: the default interval (15 s): the module as an async job, one sglang_progress long-poll that sees its end;
- on, 1 s: a line every second (the progress module reads the journal, the log and /proc every second).

Figures are the outage benchmark's (the servers' own log stamps: the old server's SIGTERM to the new server's
"ready to roll") and the playbook's wall time. It prints ratios (on / off), never asserts a time.
"""
from __future__ import annotations

import os

import _common as c
import fleet

CASES = (("off", 0), ("on", 15), ("on-1s", 1))


def run(opts, workdir):
    base = os.path.join(workdir, "progress")
    models = os.path.join(base, "models")
    fleet.write_models(models, weights=True)
    os.makedirs(os.path.join(base, "reports"))
    host = fleet.make_hosts(base, 1, prefix="progress")[0]
    fleet.write_inventory(os.path.join(base, "inventory.yml"), [host], models, plain=True)
    old = fleet.start_old_servers([host], models, plain=True)
    launched = []
    result = {"config": {"rounds": opts.outage_runs, "startup_s": fleet.STARTUP_S,
                         "cases": dict(CASES)}, "runs": dict((name, []) for name, _setting in CASES)}
    policy = "fcfs"
    try:
        first, new = fleet.timed_run(opts, base, [host], "adopt", {"sglang_server_progress_interval": 0}, "first", quiet=True)
        launched += new
        if first["rc"] != 0 or first["deployed"] != 1:
            raise RuntimeError("progress benchmark: the first deploy failed (%s)" % first["log"])
        for n in range(opts.outage_runs):
            for name, interval in CASES[n % 3:] + CASES[:n % 3]:
                policy = "lpm" if policy == "fcfs" else "fcfs"
                args = fleet.server_args(models, plain=True, schedule_policy=policy)
                out, new = fleet.timed_run(opts, base, [host], "restart", {
                    "sglang_server_args": args, "sglang_server_progress_interval": interval}, "%s-%d" % (name, n), quiet=True)
                launched += new
                h = out["hosts"][0]
                out["ok"] = (out["rc"] == 0 and out["deployed"] == 1 and out["modes"].get(host["name"]) == "restart"
                             and bool(h["outage"]))
                out["outage"] = h["outage"]
                result["runs"][name].append(out)
                print("  progress round %d %-6s %s wall %5.1f s, outage %s s, module runs %s" % (
                    n + 1, name + ":", "ok  " if out["ok"] else "FAIL", out["wall"],
                    c.fmt((h["outage"] or {}).get("outage_s")), c.fmt(out.get("module_runs_per_host"), 0)), flush=True)
    finally:
        c.REGISTRY.stop(old + launched)
    result["summary"] = summarise(result)
    return result


def summarise(result):
    s = {"failures": 0}
    for name, _setting in CASES:
        ok = [r for r in result["runs"][name] if r.get("ok")]
        s["failures"] += len(result["runs"][name]) - len(ok)
        s[name] = {"outage_s": c.median([r["outage"].get("outage_s") for r in ok]),
                   "wall_s": c.median([r["wall"] for r in ok]),
                   "module_runs": c.median([r.get("module_runs_per_host") for r in ok])}
    off = s["off"]
    for name in ("on", "on-1s"):
        if off["outage_s"] and s[name]["outage_s"] is not None:
            s[name]["outage_ratio"] = s[name]["outage_s"] / off["outage_s"]
        if off["wall_s"] and s[name]["wall_s"] is not None:
            s[name]["wall_ratio"] = s[name]["wall_s"] / off["wall_s"]
    return s


def report(result):
    s = result["summary"]
    cfg = result["config"]
    rows = [[name, str(interval), c.fmt(s[name]["outage_s"]), c.fmt(s[name].get("outage_ratio")),
             c.fmt(s[name]["wall_s"], 1), c.fmt(s[name].get("wall_ratio")), c.fmt(s[name]["module_runs"], 0)]
            for name, interval in CASES]
    return "\n".join([
        "Progress lines of sglang_replace (medians of %d rounds; startup %.1f s; outage from the servers' log stamps)"
        % (cfg["rounds"], cfg["startup_s"]),
        c.table(["progress", "interval s", "outage s", "outage / off", "playbook wall s", "wall / off", "module runs"], rows),
        "outage with progress on / off = %s (every 1 s: %s); playbook wall on / off = %s (every 1 s: %s)"
        % (c.fmt(s["on"].get("outage_ratio")), c.fmt(s["on-1s"].get("outage_ratio")),
           c.fmt(s["on"].get("wall_ratio")), c.fmt(s["on-1s"].get("wall_ratio"))),
    ])
