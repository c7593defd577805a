"""Part 3 of the real-server stage: the collection's launch engine (module_utils/server/launcher.py) against what the real
SGLang 0.5.23 server does, and the simulator made to agree (each test runs on both kinds):

- a. a stop of a server killed by SIGTERM before its handler is installed (status 143) is a normal stop;
- b. a candidate whose child crashed is failed at once by the health gate, not after its budget nor after the server's
  crash diagnostics (5 s, then 60 s while a scheduler lives, the port in LISTEN and nothing answering), and the stop
  copes with a server sleeping in them (SIGTERM, then SIGKILL), the launcher's and the GPU drain's;
- c. a 2xx from the port is not proof: with a port conflict the loser's warmup reaches the incumbent (and it logs
  "fired up"), so the gate checks that the listener is in the candidate's process tree and fails when it is not;
- e. a server started as ``sglang serve`` is recognised (a PID file without a record) and drained by its root (real
  only: the simulator has no console script).

The engine runs here as the modules run it (``Launcher``: plan, write_files, start, wait_healthy, stop), with the
interpreter of the kind under test; every PID it starts goes into the fleet's registry (killed at the end).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import target as gpu_target
from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import teardown as drain
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import supervise as sp
from ansible_collections.gpufleet.sglang.plugins.module_utils.server import crash_watch
from ansible_collections.gpufleet.sglang.plugins.module_utils.server import launcher as engine

import real_env
import servers

KINDS = servers.KINDS


class Ctx(object):
    """The few AnsibleModule methods the launcher calls (manager process: no systemctl)."""

    def __init__(self):
        self.no_log_values = set()
        self.warnings = []

    def warn(self, msg):
        self.warnings.append(msg)

    def run_command(self, argv, environ_update=None):
        raise AssertionError("no command expected: %s" % argv)

    def get_bin_path(self, name, required=False, opt_dirs=None):
        return None


def _engine(kind, fleet, tmp_path, monkeypatch, port=None, args=None, env=None, **params):
    """A planned Launcher of ``kind`` on the fleet's node, its files written; the environment as servers.launch gives it."""
    monkeypatch.setenv("GPUSIM_ROOT", fleet.node.root)
    monkeypatch.setenv("PATH", "%s:%s" % (servers.sh.SIM_BIN, os.environ.get("PATH", "")))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    all_env = {"CUDA_VISIBLE_DEVICES": "0"}
    # The scheduler's store port (on all interfaces) is given: a port drawn at random from 22000-29999 can meet another
    # test's connection there on a busy machine (EADDRINUSE in the scheduler).
    all_args = {"model_path": fleet.models.path("base"), "host": "127.0.0.1", "port": port or servers.sh.free_port(),
                "nccl_port": servers.sh.free_port()}
    if kind == "real":
        monkeypatch.delenv("PYTHONPATH", raising=False)
        python = str(real_env.ensure(log=lambda *_: None))
        all_env.update(servers.REAL_ENV)
        all_env["GPUFLEET_STANDIN_CALLS"] = str(tmp_path / "standin-calls")
        all_args["max_total_tokens"] = 8192
    else:
        python = sys.executable
        all_env.update(servers.SIM_ENV)
        all_env["PYTHONPATH"] = str(servers.sh.SIM_PY)
    all_env.update(env or {})
    all_args.update(args or {})
    base = {"name": "gate", "version": "0.5.23", "manager": "process", "python": python, "args": all_args,
            "env": all_env, "config_dir": str(tmp_path / "etc"), "state_dir": str(tmp_path / "state"),
            "log_file": str(tmp_path / "server.log"), "health_timeout": 400, "check_config": False}
    base.update(params)
    launcher = engine.Launcher(Ctx(), base)
    assert launcher.plan() == []
    launcher.write_files()
    return launcher


def _start(launcher, fleet):
    pid, start, offset, is_child = launcher.start()
    fleet.registry.add(pid)
    return pid, start, offset, is_child


def _no_standin_calls(tmp_path):
    path = tmp_path / "standin-calls"
    calls = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    assert not calls, "a CUDA stand-in was called on the serving path: %s" % calls


def _log(launcher):
    with open(launcher.log_file, errors="replace") as fh:
        return fh.read()


@pytest.mark.parametrize("kind", KINDS)
def test_a_stop_by_sigterm_before_the_handler_is_a_normal_stop(fleet, kind, tmp_path, monkeypatch):
    # /model_info answers while the server starts and installs no SIGTERM handler; nor does --skip-server-warmup's
    # missing warmup: the SIGTERM finds the default action (0.5.23: the process dies by the signal, status 143).
    launcher = _engine(kind, fleet, tmp_path, monkeypatch, args={"skip_server_warmup": True}, health_path="/model_info")
    pid, start, offset, is_child = _start(launcher, fleet)
    launcher.wait_healthy(pid, start, offset, is_child, started=True)
    tree = sp.tree(pid)
    fleet.registry.add_tree(pid)
    assert len(tree) == 4, tree                      # main; its scheduler, detokenizer and resource tracker
    report = launcher.stop({"pid": pid, "start": start, "is_child": is_child})
    assert report["exit"] == {"code": -signal.SIGTERM, "signal": "SIGTERM"}, (report, _log(launcher)[-3000:])
    assert report["normal_stop"] is True and report["signalled"] == [pid] and report["still_running"] == []
    assert sp.describe_exit(report["exit"]) == "was stopped by SIGTERM (exit status 143)"
    assert not any(sp.alive(p, s) for p, s in tree)
    servers.sh.wait_for(lambda: fleet.node.compute_apps() == [], timeout=10, what="the GPU to be free")
    assert not os.path.exists(launcher.pid_file)
    _no_standin_calls(tmp_path)


@pytest.mark.parametrize("kind", KINDS)
def test_b_a_candidate_whose_detokenizer_died_fails_at_once_and_is_stopped_through_its_crash_diagnostics(
        fleet, kind, tmp_path, monkeypatch):
    # A health path that never answers 2xx keeps the gate polling after the server is up; the detokenizer is killed
    # then, as a crash while it runs: the real server sleeps 5 s "before crash diagnostics", then waits 60 s "for CUDA
    # coredumps" while its scheduler lives, its port in LISTEN. The gate must not wait for that (nor for its 400 s).
    launcher = _engine(kind, fleet, tmp_path, monkeypatch, health_path="/no-such-health-path")
    pid, start, offset, is_child = _start(launcher, fleet)
    killed = {}

    def crash_the_detokenizer():
        if killed or servers.READY_LINE not in _log(launcher):
            return
        fleet.registry.add_tree(pid)
        kids = dict((servers.sh.cmdline(p)[0], p) for p in servers.sh.children(pid))
        killed.update(detokenizer=kids["sglang::detokenizer"], scheduler=kids["sglang::scheduler"])
        os.kill(killed["detokenizer"], signal.SIGKILL)

    with pytest.raises(engine.LaunchError) as info:
        launcher.wait_healthy(pid, start, offset, is_child, started=True, on_poll=crash_the_detokenizer)
    msg = info.value.msg
    assert killed, "the detokenizer was never killed; log:\n" + _log(launcher)[-3000:]
    assert "crashed" in msg and "did not become healthy within" not in msg, msg
    assert "its process sglang::detokenizer (PID %d) is gone" % killed["detokenizer"] in msg or \
        "its log says:" in msg, msg
    assert info.value.extra["server_exited"] is True and "SIGTERM, then SIGKILL after 5 s" in msg, msg
    report = launcher.result["stop"]
    assert report["signalled"] == [pid] and report["still_running"] == []
    assert not sp.alive(pid, start) and not servers.alive(killed["scheduler"])
    servers.sh.wait_for(lambda: fleet.node.compute_apps() == [], timeout=10, what="the GPU to be free")
    if kind == "real":
        # What the gate spared: the server had not ended by itself; SIGTERM did not stop it in its diagnostics sleep.
        assert report["exit"] == {"code": -signal.SIGKILL, "signal": "SIGKILL"} and pid in report["killed"], \
            (report, _log(launcher)[-3000:])
    _no_standin_calls(tmp_path)


@pytest.mark.parametrize("kind", KINDS)
def test_c_a_200_from_an_incumbent_on_the_port_is_not_the_candidate_being_healthy(fleet, kind, tmp_path, monkeypatch):
    port = servers.sh.free_port()
    incumbent = fleet.start("sim", port=port, env={"CUDA_VISIBLE_DEVICES": "1"})
    assert incumbent.status("/health_generate") == 200           # what a gate without the listener check would take
    launcher = _engine(kind, fleet, tmp_path, monkeypatch, port=port)
    # The incumbent took the port after the launcher's own check (a race the check cannot close): the check is
    # made to see a free port, so that the candidate starts on a port another server holds.
    monkeypatch.setattr(launcher, "port_owner", lambda: None)
    pid, start, offset, is_child = _start(launcher, fleet)
    with pytest.raises(engine.LaunchError) as info:
        launcher.wait_healthy(pid, start, offset, is_child, started=True, on_poll=lambda: fleet.registry.add_tree(pid))
    msg = info.value.msg
    # The candidate went through its startup, its warmup reached the incumbent ("fired up"), and it exited 3.
    assert info.value.extra.get("exit") == {"code": 3}, msg
    assert "which is not in the candidate's process tree (PID %d): another server holds port %d" % (pid, port) in msg, msg
    assert "PID %d" % incumbent.pid in launcher.result["last_status"], launcher.result["last_status"]
    assert servers.READY_LINE in _log(launcher)
    assert incumbent.poll() is None and incumbent.status("/model_info") == 200
    servers.sh.wait_for(lambda: [a["pid"] for a in fleet.node.compute_apps()] ==
                        [p for p in servers.sh.children(incumbent.pid) if servers.sh.cmdline(p)[0] == "sglang::scheduler"],
                        timeout=15, what="only the incumbent on the GPUs")
    _no_standin_calls(tmp_path)


def test_e_a_real_server_started_as_sglang_serve_is_recognised_and_drained_by_its_root(fleet, tmp_path, monkeypatch):
    # `sglang serve` (0.5.23's recommended entry point) runs the server in the console script's own process. Real only:
    # the simulator has no console script; its command line is [python, .../bin/sglang, serve, ...] through the shebang.
    python = real_env.ensure(log=lambda *_: None)
    script = python.parent / "sglang"
    port = servers.sh.free_port()
    env = fleet.node.env(dict(servers.REAL_ENV, CUDA_VISIBLE_DEVICES="0", GPUFLEET_STANDIN_CALLS=str(tmp_path / "standin-calls"),
                              PATH="%s:%s" % (servers.sh.SIM_BIN, os.environ.get("PATH", ""))))
    env.pop("PYTHONPATH", None)
    argv = [str(script), "serve", "--model-path", fleet.models.path("base"), "--host", "127.0.0.1", "--port", str(port),
            "--max-total-tokens", "8192", "--nccl-port", str(servers.sh.free_port())]
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    fleet.registry.add(proc.pid)
    try:
        servers.sh.wait_for(lambda: proc.poll() is not None or servers.READY_LINE in log_path.read_text(errors="replace"),
                            timeout=240, interval=0.2, what="sglang serve to be ready")
        assert proc.poll() is None, log_path.read_text(errors="replace")[-3000:]
        fleet.registry.add_tree(proc.pid)
        cmd = sp.cmdline(proc.pid)
        assert cmd[1:3] == [str(script), "serve"] and crash_watch.is_server_argv(cmd), cmd
        # A PID file without a launch record names it: the launcher takes it for the server.
        launcher = _engine("real", fleet, tmp_path, monkeypatch, port=port)
        sp.ensure_dir(os.path.dirname(launcher.pid_file))
        with open(launcher.pid_file, "w") as fh:
            fh.write("%d\n" % proc.pid)
        cur = launcher.current()
        assert cur["pid"] == proc.pid and cur["source"] == "pid_file (no launch record)", cur
        # As a GPU holder: the drain walks from its scheduler to the `sglang serve` process and stops it there.
        apps = fleet.node.compute_apps()
        assert len(apps) == 1 and apps[0]["pid"] in servers.sh.children(proc.pid)
        monkeypatch.setenv("GPUSIM_ROOT", fleet.node.root)
        params = drain.defaults()
        params.update(gpus=[0], device_paths=[os.path.join(fleet.node.root, "dev", "nvidia*")], term_timeout=60,
                      kill_timeout=15)
        res = drain.run_drain(params, gpu_target.subprocess_run())
        by_pid = dict((e["pid"], e) for e in res["signalled"])
        assert by_pid[proc.pid]["role"] == "root" and by_pid[proc.pid]["signals"] == ["SIGTERM"], res["signalled"]
        assert res["survivors"] == [] and proc.wait(timeout=30) == 0
        servers.sh.wait_for(lambda: fleet.node.compute_apps() == [], timeout=10, what="the GPU to be free")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
    _no_standin_calls(tmp_path)


@pytest.mark.parametrize("kind", KINDS)
def test_b_the_drain_stops_a_server_sleeping_in_its_crash_diagnostics_by_sigterm_then_sigkill(fleet, kind, monkeypatch):
    # The teardown side of b: an old server that crashed while it ran sits in its diagnostics (here the coredump wait
    # is 300 s, so that it cannot end by itself during the test), holding its GPU through the live scheduler. The
    # drain's SIGTERM does nothing there; its escalation ends it.
    srv = fleet.start(kind, env={"SGLANG_CUDA_COREDUMP_BEFORE_CRASH_WAIT_SECS": "300"})
    tree = srv.tree()
    kids = dict((servers.sh.cmdline(p)[0], p) for p in servers.sh.children(srv.pid))
    os.kill(kids["sglang::detokenizer"], signal.SIGKILL)
    servers.sh.wait_for(lambda: "Waiting 300.0 seconds for CUDA coredumps before exiting." in srv.log(), timeout=60,
                        what="the coredump wait line")
    assert [a["pid"] for a in fleet.node.compute_apps()] == [kids["sglang::scheduler"]] and srv.poll() is None
    monkeypatch.setenv("GPUSIM_ROOT", fleet.node.root)
    monkeypatch.setenv("PATH", "%s:%s" % (servers.sh.SIM_BIN, os.environ["PATH"]))
    params = drain.defaults()
    params.update(gpus=[0], device_paths=[os.path.join(fleet.node.root, "dev", "nvidia*")], term_timeout=5,
                  kill_timeout=15)
    res = drain.run_drain(params, gpu_target.subprocess_run())
    by_pid = dict((e["pid"], e) for e in res["signalled"])
    assert by_pid[srv.pid]["role"] == "root" and by_pid[srv.pid]["signals"] == ["SIGTERM", "SIGKILL"], res["signalled"]
    assert res["survivors"] == [] and srv.wait(timeout=30) == -signal.SIGKILL
    assert not any(servers.alive(p) for p in tree)
    servers.sh.wait_for(lambda: fleet.node.compute_apps() == [], timeout=10, what="the GPU to be free")
