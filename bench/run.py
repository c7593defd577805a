"""`make bench`: the teardown benchmark and the fleet benchmark.

    .venv/bin/python bench/run.py [--only teardown|fleet] [--runs N] [--sizes 1,8,32]
                                  [--fleet-runs N] [--profile] [--playbook PATH] [--keep]

Prints tables and writes bench/results/<UTC timestamp>.json. Every process the
benchmark starts (simulated holders, fake SGLang servers, the servers the
playbook launches) is stopped by PID at the end. See bench/README.md.
"""
from __future__ import annotations

import argparse
import atexit
import datetime
import json
import os
import platform
import shutil
import signal
import sys
import time

import _common as c


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=["teardown", "fleet"], help="run one benchmark only")
    ap.add_argument("--runs", type=int, default=5, help="teardown runs per case (median; default 5)")
    ap.add_argument("--sizes", default="1,8,32", help="fleet sizes, comma-separated (default 1,8,32)")
    ap.add_argument("--fleet-runs", type=int, default=1, help="timed redeploys per fleet size (default 1)")
    ap.add_argument("--profile", action="store_true",
                    help="fleet: also enable profile_tasks/profile_roles and cProfile the controller process")
    ap.add_argument("--playbook", default=os.path.join(c.REPO, "playbooks", "redeploy.yml"),
                    help="fleet: the redeploy playbook to time (default playbooks/redeploy.yml)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (.cache/bench/<timestamp>)")
    opts = ap.parse_args(argv)
    if opts.runs < 1 or opts.fleet_runs < 1:
        ap.error("--runs and --fleet-runs must be >= 1")
    try:
        opts.sizes = [int(s) for s in opts.sizes.split(",") if s.strip()]
    except ValueError:
        ap.error("--sizes takes comma-separated host counts, e.g. 1,8,32")
    if not opts.sizes or min(opts.sizes) < 1:
        ap.error("--sizes takes positive host counts")
    return opts


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
        "workdir": workdir,
    }
    started = time.monotonic()
    print("make bench: %d CPUs, load average %s (other jobs on this machine make the figures noisy)"
          % (os.cpu_count(), " ".join("%.2f" % x for x in c.loadavg())), flush=True)
    texts = []
    if opts.only in (None, "teardown"):
        import teardown  # pylint: disable=import-outside-toplevel
        print("\n== teardown benchmark (%d runs per case)" % opts.runs, flush=True)
        result["teardown"] = teardown.run(opts, workdir)
        texts.append(teardown.report(result["teardown"]))
        print("\n" + texts[-1], flush=True)
    if opts.only in (None, "fleet"):
        import fleet  # pylint: disable=import-outside-toplevel
        print("\n== fleet benchmark (sizes %s)" % ",".join(map(str, opts.sizes)), flush=True)
        result["fleet"] = fleet.run(opts, workdir)
        texts.append(fleet.report(result["fleet"]))
        print("\n" + texts[-1], flush=True)
    c.REGISTRY.stop()
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
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
