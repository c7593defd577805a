"""Real-server outage benchmark (issue 22 part 5): the users' outage of a restart redeploy with REAL SGLang 0.5.23
servers (tests/real_server's venv, on this CPU, holding a simulated node's GPUs), ours against the manual sequence.

Two simulated nodes (2 GPUs each, ``tp_size 1``, the real-server stage's tiny checkpoint, ``attention_backend
torch_native``), set up as tests/real_server/test_redeploy_real.py sets up its node:

- ours: ``playbooks/redeploy.yml`` deploys a real server once (forced, not timed), then each of its rounds pushes a
  config change that forces a restart (``max_total_tokens`` flipped between 6144 and 8192: the plan says restart);
- manual: the incident's sequence against a hand-started real server: SIGTERM to its PID (never a name), poll
  ``nvidia-smi --query-compute-apps`` by hand every ``MANUAL_POLL_S`` until the GPU is free (SIGKILL of its recorded
  tree after ``MANUAL_KILL_AFTER_S``), start the new server with the same config change, poll ``/health`` every
  ``MANUAL_POLL_S`` until 200.

Rounds alternate ours, manual, ours, manual (ABAB). The outage is read from the real servers' own log stamps
(``SGLANG_LOG_MS=1``) with the simulated part's definitions (``_common.outage_from_events``): the old server's
"SIGTERM received" line to the new server's "The server is fired up and ready to roll!"; startup = the new
server's process start (``/proc`` starttime on CLOCK_BOOTTIME) to that line; added beyond startup = process start
- SIGTERM. Every process is stopped by PID (``playbook_helpers.Procs``: PIDs, start times, the PID file, the
sessions they lead). Opt-in: ``bench/run.py --only real-outage``; ``make bench`` runs it when the venv is built.
"""
from __future__ import annotations

import os
import signal
import sys
import time

import _common as c

REAL_DIR = os.path.join(c.REPO, "tests", "real_server")
MANUAL_POLL_S = 1.0          # an operator's poll: once a second
MANUAL_KILL_AFTER_S = 60.0
TOKENS = (6144, 8192)


def venv_state():
    """(python, None) when the real-server venv is built (its stamp matches the requirements), else (None, why).

    Read-only: nothing is built or written here (``ensure_venv`` builds)."""
    sys.path.insert(0, REAL_DIR)
    import real_env  # pylint: disable=import-outside-toplevel
    stamp = real_env.VENV / ".gpufleet-stamp"
    if not real_env.PYTHON.exists():
        return None, "no real-server venv at %s" % real_env.VENV
    digest = real_env._digest(real_env.REQUIREMENTS, real_env.NODEPS, real_env.LOCK)  # pylint: disable=protected-access
    if not stamp.exists() or stamp.read_text() != digest:
        return None, "the real-server venv at %s is stale (requirements/real-server.* changed)" % real_env.VENV
    hooks = real_env.site_packages() / "gpufleet_real_server_hooks.py"
    if not hooks.exists() or hooks.read_bytes() != real_env.HOOKS.read_bytes():
        return None, "the real-server venv at %s lacks the current hooks module" % real_env.VENV
    return str(real_env.PYTHON), None


def ensure_venv(build):
    """The venv's python, or (None, why). ``build``: build it when missing (tests/real_server/real_env.py, network)."""
    python, why = venv_state()
    if python or not build:
        return python, why
    import real_env  # pylint: disable=import-outside-toplevel
    try:
        return str(real_env.ensure(log=lambda msg: print("  " + msg, flush=True))), None
    except Exception as exc:  # pylint: disable=broad-except
        return None, "building the real-server venv failed: %s" % str(exc).strip().splitlines()[-1][:300]


def _imports():
    sys.path.insert(0, REAL_DIR)
    sys.path.insert(0, os.path.join(c.REPO, "tests", "integration"))
    import servers  # pylint: disable=import-outside-toplevel
    import playbook_helpers as ph  # pylint: disable=import-outside-toplevel
    from test_redeploy_real import RealNode  # pylint: disable=import-outside-toplevel
    return servers, ph, RealNode


def _outage(logs, t0, new_pid):
    new_start = c.proc_start_epoch(new_pid) if new_pid else None
    events = c.server_events(logs, t0 - 0.5, time.time() + 1)
    return c.outage_from_events(events, new_start) or {}


def _ours(node, tokens, n):
    t0 = time.time()
    old = node.server_pid()
    run = node.run(host_vars=node.host_vars(server_env={"SGLANG_LOG_MS": "1"},
                                            sglang_server_args=node.server_args(max_total_tokens=tokens)))
    wall = time.time() - t0
    row = run.row() or {}
    new = node.server_pid()
    out = _outage([str(node.logs / "server.log")], t0, new)
    out.update({"wall": wall, "rc": run.rc, "mode": row.get("mode"), "status": row.get("status"), "old_pid": old,
                "new_pid": new})
    out["ok"] = bool(run.rc == 0 and row.get("status") == "deployed" and row.get("mode") == "restart" and new != old
                     and out.get("kind") == "restart")
    return out


def _gpu_busy(node):
    proc = node.smi("--query-compute-apps=pid", "--format=csv,noheader")
    return proc.returncode != 0 or bool(proc.stdout.strip())


def _hand_start(node, tokens, log):
    """The real server started by hand (its own session, tracked by PID), as test_redeploy_real's engineer does."""
    env = dict(node.env)
    env.pop("PYTHONPATH", None)          # the simulator's fake sglang package must not shadow the real one
    env.update(node.server_env(), SGLANG_LOG_MS="1")
    flags = node._flags(node.server_args(max_total_tokens=tokens))  # pylint: disable=protected-access
    return node.procs.spawn([node.real_python, "-m", "sglang.launch_server"] + flags, env=env, log=log)


def _manual(node, ph, current, tokens, n):
    """SIGTERM the PID, poll nvidia-smi by hand until the GPU is free, start the new server, poll /health."""
    t0 = time.time()
    tree = ph.session_members(current.pid)
    current.send_signal(signal.SIGTERM)
    polls, killed = 0, False
    while True:
        time.sleep(MANUAL_POLL_S)
        polls += 1
        if not _gpu_busy(node):
            break
        if not killed and time.time() - t0 > MANUAL_KILL_AFTER_S:
            for pid in tree:
                if ph.alive(pid):
                    os.kill(pid, signal.SIGKILL)
            killed = True
    freed = time.time()
    current.wait(timeout=30)
    log = node.logs / ("manual-%d.log" % n)
    new = _hand_start(node, tokens, log)
    health_polls = 0
    while new.poll() is None and time.time() - t0 < 600:
        time.sleep(MANUAL_POLL_S)
        health_polls += 1
        if node.health() == 200:
            break
    up = time.time()
    logs = [str(node.logs / ("manual-%d.log" % (n - 1))) if n else str(node.logs / "by-hand.log"), str(log)]
    out = _outage(logs, t0, new.pid)
    out.update({"wall": up - t0, "gpu_free_after_s": freed - t0, "smi_polls": polls, "health_polls": health_polls,
                "sigkill": killed, "first_200_after_s": up - t0 if new.poll() is None else None})
    out["ok"] = bool(new.poll() is None and out.get("kind") == "restart")
    return out, new


def run(opts, workdir, python):
    servers, ph, RealNode = _imports()
    base = os.path.join(workdir, "real-outage")
    os.makedirs(base)
    procs = ph.Procs()
    result = {"config": {"rounds": opts.real_outage_runs, "python": python, "poll_s": MANUAL_POLL_S,
                         "manual": "SIGTERM by PID, poll nvidia-smi every %gs until the GPU is free, start, poll /health "
                                   "every %gs" % (MANUAL_POLL_S, MANUAL_POLL_S),
                         "change": "max_total_tokens %d <-> %d (restart)" % TOKENS},
              "ours": [], "manual": []}
    try:
        t = time.time()
        models = servers.Models.build(os.path.join(base, "models"), python=python)
        ours = RealNode(os.path.join(base, "ours"), procs, models, python)
        man = RealNode(os.path.join(base, "manual"), procs, models, python)
        print("  real-outage: tiny models and two simulated nodes in %.0f s" % (time.time() - t), flush=True)
        t = time.time()
        first = ours.run(host_vars=ours.host_vars(server_env={"SGLANG_LOG_MS": "1"},
                                                  sglang_server_args=ours.server_args(max_total_tokens=TOKENS[0])),
                         extravars={"sglang_redeploy_force": True})
        if first.rc != 0:
            raise RuntimeError("real-outage: the first deploy failed:\n%s" % first.summary()[-3000:])
        current = _hand_start(man, TOKENS[0], man.logs / "by-hand.log")
        ph.wait_for(lambda: man.health() == 200 or current.poll() is not None, 300, 0.5, "the hand-started real server")
        if current.poll() is not None:
            raise RuntimeError("real-outage: the hand-started real server exited:\n%s"
                               % (man.logs / "by-hand.log").read_text(errors="replace")[-3000:])
        print("  real-outage: first deploy and hand-started server ready in %.0f s" % (time.time() - t), flush=True)
        for n in range(opts.real_outage_runs):
            tokens = TOKENS[(n + 1) % 2]
            for kind in ("ours", "manual"):
                load = c.loadavg()
                if kind == "ours":
                    out = _ours(ours, tokens, n)
                else:
                    out, current = _manual(man, ph, current, tokens, n)
                out["load"] = load
                result[kind].append(out)
                print("  real-outage round %d %-7s %s wall %5.1f s, outage %s s, startup %s s, beyond startup %s s,"
                      " load %.1f" % (n + 1, kind + ":", "ok  " if out["ok"] else "FAIL", out["wall"],
                                      c.fmt(out.get("outage_s")), c.fmt(out.get("startup_s")), c.fmt(out.get("added_s")),
                                      load[0]), flush=True)
    finally:
        left = procs.cleanup()
        if left:
            sys.stderr.write("bench: real-outage: processes survived SIGKILL: %s\n" % left)
    result["summary"] = summarise(result)
    return result


def summarise(result):
    def med(rows, key):
        return c.median([r.get(key) for r in rows if r.get("ok") and r.get(key) is not None])
    o, m = result["ours"], result["manual"]
    s = {"ours_outage_s": med(o, "outage_s"), "ours_startup_s": med(o, "startup_s"), "ours_added_s": med(o, "added_s"),
         "manual_outage_s": med(m, "outage_s"), "manual_startup_s": med(m, "startup_s"),
         "manual_added_s": med(m, "added_s"), "ours_wall_s": med(o, "wall"), "manual_wall_s": med(m, "wall"),
         "failures": sum(1 for r in o + m if not r.get("ok")),
         "load_1min": c.median([r["load"][0] for r in o + m])}
    if s["ours_outage_s"] is not None and s["manual_outage_s"]:
        s["outage_ratio"] = s["ours_outage_s"] / s["manual_outage_s"]
    if s["ours_added_s"] is not None and s["manual_added_s"]:
        s["added_ratio"] = s["ours_added_s"] / s["manual_added_s"]
    return s


def report(result):
    if "skipped" in result:
        return "Real-server outage: skipped (%s)" % result["skipped"]
    if "error" in result:
        return "Real-server outage: FAILED (every process it started was stopped):\n%s" % result["error"]
    s, cfg = result["summary"], result["config"]
    rows = []
    for n in range(max(len(result["ours"]), len(result["manual"]))):
        for kind in ("ours", "manual"):
            if n < len(result[kind]):
                r = result[kind][n]
                rows.append([n + 1, kind, "ok" if r["ok"] else "FAIL", c.fmt(r.get("outage_s")), c.fmt(r.get("startup_s")),
                             c.fmt(r.get("added_s")), c.fmt(r.get("wall"), 1), c.fmt(r["load"][0], 1)])
    rows.append(["median", "ours", "", c.fmt(s["ours_outage_s"]), c.fmt(s["ours_startup_s"]), c.fmt(s["ours_added_s"]),
                 c.fmt(s["ours_wall_s"], 1), ""])
    rows.append(["median", "manual", "", c.fmt(s["manual_outage_s"]), c.fmt(s["manual_startup_s"]),
                 c.fmt(s["manual_added_s"]), c.fmt(s["manual_wall_s"], 1), ""])
    return "\n".join([
        "Real-server outage: REAL SGLang 0.5.23 on this CPU, simulated GPUs (%d rounds each, ABAB; change: %s;"
        % (cfg["rounds"], cfg["change"]),
        " manual = %s; from the servers' own stamps: SIGTERM received -> fired up)" % cfg["manual"],
        c.table(["round", "redeploy", "", "outage s", "new server startup s", "added beyond startup s",
                 "wall s (playbook / until the first 200)", "load"], rows),
        "outage ours / manual = %s; added beyond startup ours / manual = %s"
        % (c.fmt(s.get("outage_ratio")), c.fmt(s.get("added_ratio"))),
    ])
