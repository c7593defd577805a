"""Overlap benchmark: the outage the clients see through the router, in place against overlap (docs/user-guide.md,
"Overlap redeploy").

One simulated 8-GPU node (tests/integration/playbook_helpers.SimNode) behind the real smg 1.x router
(scripts/setup-smg.sh; GPUFLEET_SMG_VENV names a ready venv), its server deployed once by playbooks/redeploy.yml
(not timed). Per round, while a client thread sends about 10 requests per second through the router
(tests/integration/test_router_rolling.Load):

- in place: a restart redeploy of the server where it runs (schedule_policy flipped), sglang_redeploy_overlap off;
  the router's only worker is taken out (sglang_router_allow_last) for the teardown and the new server's start-up;
- overlap: the server moved to the other GPU pair and port (0,1 on port A <-> 2,3 on port B),
  sglang_redeploy_overlap auto.

Outage = from the first to the last failed client request of the run (0 when none failed), as the client saw it.
Every process (router, servers) is stopped by PID and session at the end (playbook_helpers.Procs).
"""
from __future__ import annotations

import os
import sys

import _common as c

INTEGRATION = os.path.join(c.REPO, "tests", "integration")
RATE = 10.0


def _imports():
    for path in (os.path.join(c.REPO, ".collections"), INTEGRATION):
        if path not in sys.path:
            sys.path.insert(0, path)
    import playbook_helpers  # pylint: disable=import-outside-toplevel
    import test_router_rolling  # pylint: disable=import-outside-toplevel
    return playbook_helpers, test_router_rolling


class _Servers(object):
    def __init__(self, procs):
        self.procs = procs

    def add(self, pid):
        self.procs.track(pid)


def outage_of(load):
    """Seconds from the first to the last failed request (plus one request interval), 0.0 when none failed."""
    times = [at for _index, at, _why in load.failures]
    if not times:
        return 0.0
    return round(max(times) - min(times) + 1.0 / RATE, 2)


def _round(ph, rr, state, kind, n):
    node = state["node"]
    if kind == "overlap":
        state["slot"] = 1 - state["slot"]
    else:
        state["policy"] = "lpm" if state["policy"] == "fcfs" else "fcfs"
    gpus, port = state["slots"][state["slot"]]
    hv = node.host_vars(sglang_server_args=node.server_args(port=port, schedule_policy=state["policy"]),
                        sglang_server_cuda_visible_devices=gpus, sglang_router_url=state["router"],
                        sglang_router_health_timeout=30, sglang_router_drain_timeout=60, sglang_router_allow_last=True,
                        sglang_redeploy_overlap="auto" if kind == "overlap" else "off")
    load = rr.Load(state["router"], rate=RATE, max_requests=int(RATE * 900), time_limit=900)
    loadavg = c.loadavg()
    load.start()
    try:
        run = node.run(host_vars=hv)
    finally:
        load.stop()
    path = run.task_results("Say which path the redeploy takes, overlap or in place, and why")
    line = path[-1].get("msg", "") if path else ""
    summary = load.summary()
    out = {"kind": kind, "round": n, "rc": run.rc, "wall": round(run.wall, 1), "path": line,
           "sent": summary["sent"], "failed": summary["failed"], "outage_s": outage_of(load), "load": loadavg,
           "ok": run.rc == 0 and (line.startswith("path: overlap:") if kind == "overlap" else "in place" in line)}
    print("  overlap round %d %-9s %s wall %5.1f s, %d requests, %d failed, outage %s s, load %.1f" % (
        n + 1, kind + ":", "ok  " if out["ok"] else "FAIL", out["wall"], out["sent"], out["failed"],
        c.fmt(out["outage_s"]), loadavg[0]), flush=True)
    return out


def run(opts, workdir):
    try:
        ph, rr = _imports()
        import launch_helpers  # pylint: disable=import-outside-toplevel
        binary = launch_helpers.smg1_binary()
    except Exception as exc:  # pylint: disable=broad-except
        return {"skipped": "smg 1.x or the test helpers are not available: %s" % str(exc)[-500:]}
    base = os.path.join(workdir, "overlap")
    os.makedirs(base)
    procs = ph.Procs()
    result = {"config": {"rounds": opts.overlap_runs, "rate": RATE}, "in_place": [], "overlap": []}
    try:
        node = ph.SimNode(os.path.join(base, "node"), procs)
        kind = {"name": "smg-1", "binary": binary, "api": "1", "flags": ["--policy", "cache_aware"]}
        router, _proc = rr.start_router(_Servers(procs), ph.pathlib.Path(base), kind)
        state = {"node": node, "router": router, "slot": 0, "policy": "fcfs",
                 "slots": [("0,1", node.port), ("2,3", ph.free_port())]}
        first = node.run(host_vars=node.host_vars(sglang_server_args=node.server_args(port=node.port, schedule_policy="fcfs"),
                                                  sglang_server_cuda_visible_devices="0,1", sglang_router_url=router))
        if first.rc != 0:
            raise RuntimeError("overlap benchmark: the first deploy failed: %s" % first.stdout_tail())
        for n in range(opts.overlap_runs):
            for kind_name in (("in_place", "overlap") if n % 2 == 0 else ("overlap", "in_place")):
                result[kind_name].append(_round(ph, rr, state, kind_name, n))
    except Exception as exc:  # pylint: disable=broad-except
        # Reported (and make bench fails); the other parts' figures are still written.
        result["error"] = str(exc)[-3000:]
    finally:
        left = procs.cleanup()
        if left:
            result["left"] = left
    result["summary"] = summarise(result)
    return result


def summarise(result):
    def med(kind, key):
        return c.median([r[key] for r in result[kind] if r.get("ok")])
    return {"in_place_outage_s": med("in_place", "outage_s"), "overlap_outage_s": med("overlap", "outage_s"),
            "in_place_failed": med("in_place", "failed"), "overlap_failed": med("overlap", "failed"),
            "in_place_wall_s": med("in_place", "wall"), "overlap_wall_s": med("overlap", "wall"),
            "failures": sum(1 for r in result["in_place"] + result["overlap"] if not r.get("ok"))}


def report(result):
    if "skipped" in result:
        return "Overlap: skipped (%s)" % result["skipped"]
    if "error" in result:
        return "Overlap: FAILED (%s)" % result["error"]
    s = result["summary"]
    cfg = result["config"]
    rows = [["in place (restart, the router's only worker out)", c.fmt(s["in_place_outage_s"]),
             c.fmt(s["in_place_failed"], 0), c.fmt(s["in_place_wall_s"], 1)],
            ["overlap (new GPUs and port, router switched)", c.fmt(s["overlap_outage_s"]),
             c.fmt(s["overlap_failed"], 0), c.fmt(s["overlap_wall_s"], 1)]]
    return "\n".join([
        "Overlap: the outage the clients see through smg on one simulated node (medians of %d round(s), %.0f requests/s;"
        " outage = first to last failed request)" % (cfg["rounds"], cfg["rate"]),
        c.table(["redeploy", "outage s", "failed requests", "playbook wall s"], rows),
    ])
