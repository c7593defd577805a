"""`make bench`: the clock check, the outage benchmark, the overlap benchmark (in place against overlap behind smg),
the container benchmark (a server in podman against a host process),
the teardown benchmark, the fleet benchmark, the node oracle's cost and the checkpoint check's, then the ratios of this run against the goals.

    .venv/bin/python bench/run.py [--only clock,outage,overlap,container,progress,teardown,fleet,oracle,checkpoint,prefetch,real-outage]
                                  [--outage-runs N] [--overlap-runs N] [--container-runs N] [--real-outage-runs N] [--runs N]
                                  [--sizes 1,8,32] [--fleet-runs N] [--oracle newest|all|none]
                                  [--profile] [--playbook PATH] [--keep]

Prints tables and writes bench/results/<UTC timestamp>.json. Every process the
benchmark starts (simulated holders, fake SGLang servers, the servers the
playbook launches) is stopped by PID at the end. See bench/README.md.
"""
from __future__ import annotations

import argparse
import atexit
import datetime
import importlib
import json
import os
import platform
import shutil
import signal
import sys
import time

import _common as c

PARTS = ("clock", "outage", "overlap", "container", "progress", "teardown", "fleet", "oracle", "checkpoint", "prefetch", "real-outage")

# Goals of issue 15 (and the per-host counts of its "what to build").
GOAL_ADDED_S = 1.0
GOAL_ADDED_VS_MANUAL = 0.3
GOAL_OVERHEAD_S = 5.0
GOAL_CTRL_CPU_32 = 2.0
GOAL_WALL_32_VS_1 = 4.0
GOAL_MODULE_RUNS = 5
GOAL_TASKS = 40


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated parts to run (default all): %s" % ",".join(PARTS))
    ap.add_argument("--outage-runs", type=int, default=3,
                    help="outage rounds (restart, weights, manual each; median; default 3)")
    ap.add_argument("--overlap-runs", type=int, default=1,
                    help="overlap rounds (in place and overlap each, through the smg router; median; default 1)")
    ap.add_argument("--container-runs", type=int, default=2,
                    help="container rounds (a config change of a server in podman and of a host process each, alternating;"
                         " median; default 2). Needs root and podman, else skipped")
    ap.add_argument("--real-outage-runs", type=int, default=2,
                    help="real-outage rounds (ours and manual each, alternating; median; default 2). The part runs "
                         "with real SGLang 0.5.23 servers: in the default parts only when tests/real_server's venv "
                         "is built; --only real-outage builds it when missing")
    ap.add_argument("--runs", type=int, default=3, help="teardown runs per case (median; default 3)")
    ap.add_argument("--sizes", default="1,8,32", help="fleet sizes, comma-separated (default 1,8,32)")
    ap.add_argument("--fleet-runs", type=int, default=1, help="timed redeploys per fleet size (default 1)")
    ap.add_argument("--oracle", choices=["newest", "all", "none"], default="newest",
                    help="oracle cost: the fake SGLang and the newest installed real release (default), every "
                         "installed release, or none")
    ap.add_argument("--profile", action="store_true",
                    help="fleet: also enable profile_tasks/profile_roles and cProfile the controller process")
    ap.add_argument("--playbook", default=os.path.join(c.REPO, "playbooks", "redeploy.yml"),
                    help="outage/fleet: the redeploy playbook to time (default playbooks/redeploy.yml)")
    ap.add_argument("--checkpoint-shards", default="200",
                    help="checkpoint: shard counts of the checkpoints to verify, comma-separated (default 200)")
    ap.add_argument("--prefetch-mib", type=int, default=256, help="prefetch: size of the checkpoint in MiB (default 256)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (.cache/bench/<timestamp>)")
    opts = ap.parse_args(argv)
    if opts.runs < 1 or opts.fleet_runs < 1 or opts.outage_runs < 1 or opts.real_outage_runs < 1 or opts.overlap_runs < 1 \
            or opts.container_runs < 1:
        ap.error("--runs, --outage-runs, --overlap-runs, --container-runs, --real-outage-runs and --fleet-runs must be >= 1")
    opts.real_outage_asked = bool(opts.only) and "real-outage" in opts.only
    opts.parts = PARTS if not opts.only else tuple(p.strip() for p in opts.only.split(",") if p.strip())
    unknown = [p for p in opts.parts if p not in PARTS]
    if unknown:
        ap.error("--only: unknown part(s) %s; choose from %s" % (", ".join(unknown), ",".join(PARTS)))
    try:
        opts.sizes = [int(s) for s in opts.sizes.split(",") if s.strip()]
    except ValueError:
        ap.error("--sizes takes comma-separated host counts, e.g. 1,8,32")
    try:
        opts.checkpoint_shards = [int(s) for s in opts.checkpoint_shards.split(",") if s.strip()]
    except ValueError:
        ap.error("--checkpoint-shards takes comma-separated shard counts, e.g. 200,1000")
    if not opts.checkpoint_shards or min(opts.checkpoint_shards) < 2:
        ap.error("--checkpoint-shards takes shard counts of 2 or more")
    if not opts.sizes or min(opts.sizes) < 1:
        ap.error("--sizes takes positive host counts")
    return opts


def clock_report(res):
    return "\n".join([
        "Clock: where a process's start lands, against a bracket of time.time() around its fork (%d forks, bracket %.1f ms)"
        % (res["samples"], 1000 * res["bracket_s"]),
        c.table(["conversion of /proc/<pid>/stat starttime", "median error ms", "max |error| ms"], [
            ["before: btime (/proc/stat, whole seconds) + ticks / %d" % res["clk_tck"],
             c.fmt(1000 * res["btime"]["median_s"], 1), c.fmt(1000 * res["btime"]["max_abs_s"], 1)],
            ["after: time.time() - CLOCK_BOOTTIME + (ticks + 0.5) / %d" % res["clk_tck"],
             c.fmt(1000 * res["boottime"]["median_s"], 1), c.fmt(1000 * res["boottime"]["max_abs_s"], 1)],
        ]),
    ])


def oracle_used(result):
    """What the preflights of this run resolved with: {source: hosts} (``node``: the node's SGLang answered)."""
    counts = {}
    for s in result.get("fleet", {}).get("sizes", []):
        for r in s["runs"]:
            for h in r["hosts"]:
                counts[str(h.get("resolution_source"))] = counts.get(str(h.get("resolution_source")), 0) + 1
    for kind in ("restart", "weights"):
        for r in result.get("outage", {}).get(kind, []):
            for h in r["hosts"]:
                counts[str(h.get("resolution_source"))] = counts.get(str(h.get("resolution_source")), 0) + 1
    return counts


def run_oracle(opts):
    """The oracle's cost per host with H1's bench/oracle.py (measure: one preflight call, the import, per config)."""
    import tempfile  # pylint: disable=import-outside-toplevel
    try:
        import oracle as oracle_bench  # pylint: disable=import-outside-toplevel
        # tests/differential is on sys.path once bench/oracle.py is imported
        import cases as cases_mod  # pylint: disable=import-outside-toplevel
    except ImportError as exc:
        return {"missing": "the oracle's bench (bench/oracle.py) or its runner cannot be imported: %s" % exc}
    hosts = oracle_bench._hosts()  # pylint: disable=protected-access
    if opts.oracle == "newest":
        hosts = hosts[:1] + hosts[-1:] if len(hosts) > 1 else hosts
    model = cases_mod.write_models(tempfile.mkdtemp(prefix="bench-oracle-", dir=os.path.join(c.REPO, ".cache")))["llama"]
    rows = []
    for label, python, env in hosts:
        load = c.loadavg()
        try:
            row = oracle_bench.measure(label, python, env, model, 1, 20)
        except Exception as exc:  # pylint: disable=broad-except
            row = {"host": label, "error": str(exc)[:300]}
        row["load"] = load
        rows.append(row)
        print("  oracle %-44s import %s s, one preflight call %s s, per config %s ms, load %.1f" % (
            label, c.fmt(row.get("import_s")), c.fmt(row.get("single_s")), c.fmt(row.get("per_config_ms"), 1), load[0]),
            flush=True)
    shutil.rmtree(os.path.dirname(model), ignore_errors=True)
    releases = len(oracle_bench._hosts()) - 1  # pylint: disable=protected-access
    return {"rows": rows, "real_releases_installed": releases}


def oracle_report(res):
    if "missing" in res:
        return "Oracle: missing (%s)" % res["missing"]
    rows = [[r["host"], c.fmt(r.get("import_s")), c.fmt(r.get("per_config_ms"), 1), c.fmt(r.get("single_s")),
             r.get("error", "")[:60]] for r in res["rows"]]
    lines = ["Oracle: the node's SGLang resolving the args (bench/oracle.py; one host's preflight pays 'one call')",
             c.table(["SGLang", "import s", "per config ms", "one call s", "error"], rows)]
    if not res["real_releases_installed"]:
        lines.append("(no real release is installed here: `scripts/run-tests.py differential` installs them)")
    used = res.get("used") or {}
    if used:
        lines.append("(this run's preflights resolved with: %s; node = the node's SGLang (the fake) answered, so the"
                     " outage and fleet figures include one oracle call per host)"
                     % ", ".join("%s on %d host-runs" % kv for kv in sorted(used.items())))
    return "\n".join(lines)


def _size(result, size, case="change"):
    return next((s for s in result.get("fleet", {}).get("sizes", []) if s["size"] == size and s["case"] == case), None)


def goals(result):
    """The ratios of this run and the goals of issue 15, met or missed."""
    rows = []

    def add(what, value, goal, met, note=""):
        rows.append([what, value, goal, "-" if met is None else ("met" if met else "MISSED"), note])

    out = result.get("outage", {}).get("summary")
    if out:
        added, manual = out.get("ours_added_s"), out.get("manual_added_s")
        add("outage added beyond startup, ours", c.fmt(added, 2, " s"), "<= %.1f s" % GOAL_ADDED_S,
            None if added is None else added <= GOAL_ADDED_S, "max %s s" % c.fmt(out.get("ours_added_max_s")))
        add("  ours / manual sequence", c.fmt(out.get("added_ratio")), "<= %.1f" % GOAL_ADDED_VS_MANUAL,
            None if out.get("added_ratio") is None else out["added_ratio"] <= GOAL_ADDED_VS_MANUAL,
            "manual adds %s s" % c.fmt(manual))
        add("outage ours / manual (whole window)", c.fmt(out.get("outage_ratio")), "", None,
            "%s s / %s s" % (c.fmt(out.get("ours_outage_s")), c.fmt(out.get("manual_outage_s"))))
        add("weight-only / restart outage, same node", c.fmt(out.get("weights_ratio")), "", None,
            "%s s / %s s" % (c.fmt(out.get("weights_outage_s")), c.fmt(out.get("ours_outage_s"))))
        add("1-host overhead (wall - intrinsic)", c.fmt(out.get("overhead_s"), 2, " s"), "<= %.0f s" % GOAL_OVERHEAD_S,
            None if out.get("overhead_s") is None else out["overhead_s"] <= GOAL_OVERHEAD_S,
            "wall %s s - intrinsic %s s, load %s"
            % (c.fmt(out.get("restart_wall_s"), 1), c.fmt(out.get("intrinsic_s"), 2), c.fmt(out.get("load_1min"), 1)))
        fleet_one = _size(result, 1)
        if fleet_one:
            add("  the same, fleet benchmark's 1 host (change)", c.fmt(fleet_one["overhead"], 2, " s"),
                "<= %.0f s" % GOAL_OVERHEAD_S, fleet_one["overhead"] <= GOAL_OVERHEAD_S,
                "wall %s s - intrinsic %s s, load %s"
                % (c.fmt(fleet_one["wall"], 1), c.fmt(fleet_one["intrinsic_max"], 2), c.fmt(fleet_one["load_1min"], 1)))
        add("module runs per host (restart)", c.fmt(out.get("module_runs"), 0), "<= %d" % GOAL_MODULE_RUNS,
            None if out.get("module_runs") is None else out["module_runs"] <= GOAL_MODULE_RUNS,
            "weight-only: %s" % c.fmt(out.get("weights_module_runs"), 0))
        add("tasks per host, executed + skipped", "%s + %s" % (c.fmt(out.get("executed"), 0), c.fmt(out.get("skipped"), 0)),
            "<= %d" % GOAL_TASKS, None if out.get("tasks") is None else out["tasks"] <= GOAL_TASKS,
            "%s fork workers" % c.fmt(out.get("fork_workers"), 0))
        split = "%s / %s s" % (c.fmt(out.get("cpu_controller")), c.fmt(out.get("cpu_modules")))
        add("CPU per host, 1 host: controller / modules", split, "", None,
            "main process alone %s s" % c.fmt(out.get("cpu_main")))
    real = result.get("real_outage", {}).get("summary")
    if real:
        add("real SGLang: outage ours / manual (restart)", c.fmt(real.get("outage_ratio")), "", None,
            "%s s / %s s" % (c.fmt(real.get("ours_outage_s")), c.fmt(real.get("manual_outage_s"))))
        add("  added beyond startup ours / manual", c.fmt(real.get("added_ratio")), "", None,
            "%s s / %s s" % (c.fmt(real.get("ours_added_s")), c.fmt(real.get("manual_added_s"))))
    one, big = _size(result, 1), _size(result, 32)
    for s in result.get("fleet", {}).get("sizes", []):
        if s["case"] != "change":
            continue
        note = "main %s s, modules %s s" % (c.fmt(s["cpu_main_per_host"]), c.fmt(s["cpu_modules_per_host"]))
        if s["size"] == 32:
            add("controller CPU per host, 32 hosts", c.fmt(s["cpu_controller_per_host"], 2, " s"),
                "<= %.0f s" % GOAL_CTRL_CPU_32, s["cpu_controller_per_host"] <= GOAL_CTRL_CPU_32, note)
        else:
            add("controller CPU per host, %d host(s)" % s["size"], c.fmt(s["cpu_controller_per_host"], 2, " s"), "", None,
                note)
    for s in result.get("fleet", {}).get("sizes", []):
        if s["case"] != "change" or s["size"] == 1 or not s.get("wall_vs_1"):
            continue
        add("%d hosts wall / 1-host wall (change)" % s["size"], c.fmt(s["wall_vs_1"]),
            "<= %.0f" % GOAL_WALL_32_VS_1 if s["size"] == 32 else "",
            (s["wall_vs_1"] <= GOAL_WALL_32_VS_1) if s["size"] == 32 else None,
            "%s s vs %s s, load %s" % (c.fmt(s["wall"], 1), c.fmt(one["wall"], 1) if one else "-", c.fmt(s["load_1min"], 1)))
    if one and big:
        est = estimate_cores(one, big, 4, measured_cores=os.cpu_count() or 2)
        figures = (c.fmt(est["low"], 0), c.fmt(est["high"], 0), c.fmt(est["low_ratio"], 1), c.fmt(est["high_ratio"], 1))
        value = "%s-%s s = %s-%s x 1-host" % figures
        rows.append(["4-core controller, 32 hosts (ESTIMATE)", value, "<= %.0f" % GOAL_WALL_32_VS_1, "estimate",
                     "low: all CPU %s s / 4; high: the wall x %d / 4" % (c.fmt(est["cpu"], 0), os.cpu_count() or 2)])
        cores = os.cpu_count() or 2
        est = estimate_remote_nodes(one, big, cores)
        figures = (c.fmt(est["low"], 0), c.fmt(est["high"], 0), c.fmt(est["low_ratio"], 1), c.fmt(est["high_ratio"], 1))
        rows.append(["%d-core controller, 32 real nodes (ESTIMATE)" % cores, "%s-%s s = %s-%s x 1-host" % figures,
                     "<= %.0f" % GOAL_WALL_32_VS_1, "estimate",
                     "the nodes' %s CPU-s elsewhere; low: controller %s CPU-s / %d; high: the wall x its share %s"
                     % (c.fmt(est["node_cpu"], 0), c.fmt(est["controller_cpu"], 0), cores, c.fmt(est["share"], 2))])
    return rows


def estimate_cores(one, big, cores, measured_cores=2):
    """32-host wall on ``cores`` cores, from the measured CPU. An estimate, not a measurement: a range.

    low: no faster than the 1-host wall (the critical path), than the single-threaded main process, or
    than all of this run's CPU (playbook tree + the servers it started) spread over every core;
    high: the measured wall scaled by the core count (as if everything on the machine, the other jobs
    included, sped up with the cores)."""
    run = big["runs"][0]
    cpu = run["cpu"] + (run.get("server_cpu") or 0.0)
    low = max(one["wall"], run["cpu_main"] or 0.0, cpu / cores)
    high = max(low, big["wall"] * measured_cores / float(cores))
    return {"low": low, "high": high, "low_ratio": low / one["wall"], "high_ratio": high / one["wall"], "cpu": cpu,
            "cores": cores}


def estimate_remote_nodes(one, big, cores):
    """32-host wall when each node runs its own modules and server (a real fleet), on this controller's ``cores``.

    The bench runs the 32 simulated nodes on the controller's own cores, so their module processes and servers
    compete with ansible-playbook for the same CPU. An estimate, not a measurement: a range.
    low: the controller's CPU (main process + fork workers) spread over its cores, no faster than the 1-host wall
    (the critical path) or the single-threaded main process; high: the measured wall scaled by the controller's
    share of all the CPU this run used (as if the wall were CPU-bound throughout)."""
    run = big["runs"][0]
    controller = run["cpu_controller_per_host"] * run["size"]
    total = run["cpu"] + (run.get("server_cpu") or 0.0)
    share = controller / total if total > 0 else 1.0
    low = max(one["wall"], run["cpu_main"] or 0.0, controller / float(cores))
    high = max(low, big["wall"] * share)
    return {"low": low, "high": high, "low_ratio": low / one["wall"], "high_ratio": high / one["wall"],
            "controller_cpu": controller, "node_cpu": total - controller, "share": share, "cores": cores}


def goals_report(rows):
    return "\n".join(["Ratios of this run, against the goals (issue 15)",
                      c.table(["figure", "value", "goal", "", "note"], rows)])


# The parts that are a module of bench/ with run(opts, workdir) and report(result), in the order they run:
# (part and result key, module, the heading printed before it).
MODULE_PARTS = (
    ("outage", "outage", lambda opts: "outage benchmark (%d rounds)" % opts.outage_runs),
    ("overlap", "overlap", lambda opts: "overlap benchmark (%d round(s), in place and overlap behind smg)" % opts.overlap_runs),
    ("container", "container",
     lambda opts: "container benchmark (%d round(s), podman container and host process each)" % opts.container_runs),
    ("progress", "progress", lambda opts: "progress benchmark (%d rounds)" % opts.outage_runs),
    ("teardown", "teardown", lambda opts: "teardown benchmark (%d runs per case)" % opts.runs),
    ("fleet", "fleet", lambda opts: "fleet benchmark (sizes %s)" % ",".join(map(str, opts.sizes))),
    ("checkpoint", "checkpoint", lambda opts: "checkpoint check (shards %s)" % ",".join(map(str, opts.checkpoint_shards))),
    ("prefetch", "prefetch", lambda opts: "checkpoint prefetch (%d MiB)" % opts.prefetch_mib),
)


def main(argv=None):
    opts = parse_args(argv)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    workdir = os.path.join(c.REPO, ".cache", "bench", stamp)
    os.makedirs(workdir)
    atexit.register(c.REGISTRY.stop)

    def on_signal(signum, frame):  # pylint: disable=unused-argument
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    result = {
        "timestamp": stamp,
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_start": c.loadavg()},
        "workdir": workdir, "parts": list(opts.parts),
    }
    started = time.monotonic()
    print("make bench: %d CPUs, load average %s (other jobs on this machine make the figures noisy)"
          % (os.cpu_count(), " ".join("%.2f" % x for x in c.loadavg())), flush=True)
    texts = []
    if "clock" in opts.parts:
        result["clock"] = c.clock_check()
        texts.append(clock_report(result["clock"]))
        print("\n" + texts[-1], flush=True)
    for part, module, title in MODULE_PARTS:
        if part not in opts.parts:
            continue
        runner = importlib.import_module(module)
        print("\n== " + title(opts), flush=True)
        result[part] = runner.run(opts, workdir)
        texts.append(runner.report(result[part]))
        print("\n" + texts[-1], flush=True)
    if "oracle" in opts.parts and opts.oracle != "none":
        print("\n== oracle cost", flush=True)
        result["oracle"] = run_oracle(opts)
        result["oracle"]["used"] = oracle_used(result)
        texts.append(oracle_report(result["oracle"]))
        print("\n" + texts[-1], flush=True)
    if "real-outage" in opts.parts:
        import real_outage  # pylint: disable=import-outside-toplevel
        print("\n== real-server outage benchmark (%d rounds each, real SGLang 0.5.23)" % opts.real_outage_runs, flush=True)
        python, why = real_outage.ensure_venv(build=opts.real_outage_asked)
        if python:
            try:
                result["real_outage"] = real_outage.run(opts, workdir, python)
            # Any failure of this part is reported; the other parts' figures are still written.
            except Exception as exc:  # pylint: disable=broad-except
                result["real_outage"] = {"error": str(exc)[-3000:]}
        else:
            result["real_outage"] = {"skipped": why + ("" if opts.real_outage_asked else
                                                       "; build it with `.venv/bin/python tests/real_server/real_env.py`"
                                                       " or run `bench/run.py --only real-outage`")}
        texts.append(real_outage.report(result["real_outage"]))
        print("\n" + texts[-1], flush=True)
    c.REGISTRY.stop()
    result["goals"] = goals(result)
    if result["goals"]:
        print("\n" + goals_report(result["goals"]), flush=True)
    result["host"]["load_end"] = c.loadavg()
    result["duration_s"] = round(time.monotonic() - started, 1)
    outdir = os.path.join(c.REPO, "bench", "results")
    os.makedirs(outdir, exist_ok=True)
    path = os.path.join(outdir, stamp + ".json")
    with open(path, "w") as fh:
        json.dump(result, fh, indent=1, sort_keys=True)
    if not opts.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    print("\nmake bench: %.0f s, load average at the end %s; results: %s%s" % (
        result["duration_s"], " ".join("%.2f" % x for x in c.loadavg()), os.path.relpath(path, c.REPO),
        ("; work directory kept: %s" % os.path.relpath(workdir, c.REPO)) if opts.keep else ""))
    failed = any(case["summary"]["ansible_failures"] for case in result.get("teardown", {}).get("cases", {}).values())
    failed = failed or any(size.get("failed") for size in result.get("fleet", {}).get("sizes", []))
    failed = failed or bool(result.get("outage", {}).get("summary", {}).get("failures"))
    failed = failed or bool(result.get("overlap", {}).get("summary", {}).get("failures")) or "error" in result.get("overlap", {})
    failed = failed or bool(result.get("container", {}).get("summary", {}).get("failures")) or "error" in result.get("container", {})
    failed = failed or bool(result.get("progress", {}).get("summary", {}).get("failures"))
    failed = failed or bool(result.get("real_outage", {}).get("summary", {}).get("failures"))
    failed = failed or "error" in result.get("real_outage", {})
    failed = failed or (opts.real_outage_asked and "skipped" in result.get("real_outage", {}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
