"""The health gate's view of a candidate SGLang server, and how a stop ends (issue 22, what the real 0.5.23 server does):

- a stop that ends by SIGTERM, or with exit status 143, is a normal stop (``supervise.normal_stop``, the stop report's
  ``exit`` and ``normal_stop``, the unit's ``SuccessExitStatus=143``);
- a candidate whose scheduler or detokenizer is gone, or whose log says a process failed, is a crash
  (``crash_watch.CrashWatch``), which the gate fails at once;
- an SGLang server's command line, ``python -m sglang.launch_server`` or ``sglang serve`` (``crash_watch.is_server_argv``).

Processes: small Python or shell processes started here, each stopped by the code under test or SIGKILLed by PID at
the end. The real server's side of each point is in tests/real_server/test_collection_gate.py.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils.node import supervise as sp
from ansible_collections.gpufleet.sglang.plugins.module_utils.server import crash_watch
from ansible_collections.gpufleet.sglang.plugins.module_utils.server import unit as unit_mod


@pytest.fixture
def spawned():
    pids = []
    yield pids
    for pid in pids:
        if sp.alive(pid):
            os.kill(pid, signal.SIGKILL)
        sp.reap(pid, block=True)


def _spawn(spawned, tmp_path, code, ready):
    """A detached child (spawn_detached: own session, our child) that prints ``ready`` once its handlers are set."""
    log = tmp_path / ("%d.log" % len(spawned))
    pid = sp.spawn_detached([sys.executable, "-c", code], dict(os.environ), str(log))
    spawned.append(pid)
    deadline = time.monotonic() + 30
    while ready not in log.read_text():
        assert time.monotonic() < deadline and sp.alive(pid), log.read_text()
        time.sleep(0.02)
    return pid


# ---------------------------------------------------------------------------
# a. exit status 143
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("info,normal", [
    ({"code": 0}, True),
    ({"code": -15, "signal": "SIGTERM"}, True),
    ({"code": 143}, True),
    ({"code": 3}, False),
    ({"code": 1}, False),
    ({"code": -9, "signal": "SIGKILL"}, False),
    ({}, None),
    (None, None),
])
def test_normal_stop(info, normal):
    assert sp.normal_stop(info) is normal


def test_describe_exit():
    assert sp.describe_exit({"code": -15, "signal": "SIGTERM"}) == "was stopped by SIGTERM (exit status 143)"
    assert sp.describe_exit({"code": 143}) == "was stopped by SIGTERM (exit status 143)"
    assert sp.describe_exit({"code": -9, "signal": "SIGKILL"}) == "was killed by SIGKILL"
    assert sp.describe_exit({"code": 3}) == "exited with code 3"
    assert sp.describe_exit({}) == "exited"


DIES_BY_SIGTERM = "import time; print('up', flush=True); time.sleep(120)"
EXITS_143 = ("import signal, sys, time\n"
             "signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))\n"
             "print('up', flush=True)\ntime.sleep(120)\n")
EXITS_1 = ("import signal, sys, time\n"
           "signal.signal(signal.SIGTERM, lambda *a: sys.exit(1))\n"
           "print('up', flush=True)\ntime.sleep(120)\n")


@pytest.mark.parametrize("code,exit_info,normal", [
    (DIES_BY_SIGTERM, {"code": -15, "signal": "SIGTERM"}, True),   # 0.5.23 before its handler: death by the signal
    (EXITS_143, {"code": 143}, True),                               # a wrapper that reports it as 128 + 15
    (EXITS_1, {"code": 1}, False),
])
def test_stop_tree_reports_the_exit_status_and_whether_the_stop_was_normal(spawned, tmp_path, code, exit_info, normal):
    pid = _spawn(spawned, tmp_path, code, "up")
    report = sp.stop_tree(pid, timeout=30, is_child=True)
    assert report["signalled"] == [pid] and report["killed"] == [] and report["still_running"] == []
    assert report["exit"] == exit_info and report["normal_stop"] is normal
    assert not sp.alive(pid)


def test_stop_tree_of_a_child_that_needs_sigkill_is_not_a_normal_stop(spawned, tmp_path):
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(120)"
    pid = _spawn(spawned, tmp_path, code, "up")
    report = sp.stop_tree(pid, timeout=0.3, is_child=True)
    assert report["killed"] == [pid] and report["exit"] == {"code": -9, "signal": "SIGKILL"}
    assert report["normal_stop"] is False


def test_stop_tree_of_a_server_that_is_not_our_child_has_no_exit_status(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", DIES_BY_SIGTERM], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout.readline() == b"up\n"
        report = sp.stop_tree(proc.pid, timeout=30)
        assert report["signalled"] == [proc.pid] and "exit" not in report and "normal_stop" not in report
        assert proc.wait(timeout=10) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def test_the_unit_counts_exit_status_143_as_success():
    text = unit_mod.render_unit("main", "0.5.23", "/usr/bin/python3", ["--model-path", "/m"], {}, "sha256:x")
    assert "SuccessExitStatus=143" in text.splitlines()
    assert text.index("KillSignal=SIGTERM") < text.index("SuccessExitStatus=143") < text.index("[Install]")


# ---------------------------------------------------------------------------
# b. a crashed candidate
# ---------------------------------------------------------------------------

class Procs(object):
    """Fake role_of/alive/parent_of for CrashWatch: ``titles`` {pid: title}, ``parents`` {pid: ppid} (default 10, the
    main process), ``dead`` a set of PIDs."""

    def __init__(self, titles, parents=None):
        self.titles = titles
        self.parents = parents or {}
        self.dead = set()

    def parent_of(self, pid):
        return self.parents.get(pid, 10)

    def role_of(self, pid):
        return self.titles.get(pid)

    def alive(self, pid, start=None):
        return pid not in self.dead


def test_crash_watch_reports_a_child_gone_while_the_main_process_runs():
    procs = Procs({11: "sglang::scheduler", 12: "sglang::detokenizer", 13: None})
    watch = crash_watch.CrashWatch(role_of=procs.role_of, alive=procs.alive, parent_of=procs.parent_of)
    assert watch.check(10, [(10, 1)]) is None                              # no child yet (still importing)
    assert watch.check(10, [(10, 1), (11, 2), (13, 4)]) is None           # a scheduler; 13 is the resource tracker
    assert watch.check(10, [(10, 1), (11, 2), (12, 3), (13, 4)]) is None
    procs.dead.add(13)
    assert watch.check(10, [(10, 1), (11, 2), (12, 3)]) is None           # not an SGLang child: not a crash
    procs.dead.add(12)
    why = watch.check(10, [(10, 1), (11, 2)])                               # gone from the tree as well: still noted
    assert why == "its process sglang::detokenizer (PID 12) is gone while the main process 10 still runs"


def test_crash_watch_ignores_what_a_scheduler_forks_and_follows_the_dp_controllers_schedulers():
    # 14: a process the scheduler 11 forked (it keeps the title that setproctitle wrote); 20: the DP controller,
    # 21-22 its schedulers (real 0.5.23 with dp > 1).
    procs = Procs({11: "sglang::scheduler", 14: "sglang::scheduler", 20: "sglang::data_parallel_controller",
                   21: "sglang::scheduler_DP0", 22: "sglang::scheduler_DP1", 12: "sglang::detokenizer"},
                  parents={14: 11, 21: 20, 22: 20})
    watch = crash_watch.CrashWatch(role_of=procs.role_of, alive=procs.alive, parent_of=procs.parent_of)
    assert watch.check(10, [(10, 1), (11, 2), (14, 5), (12, 3)]) is None
    assert watch.check(10, [(10, 1), (11, 2), (14, 5), (12, 3), (20, 6)]) is None
    assert watch.check(10, [(10, 1), (11, 2), (12, 3), (20, 6), (21, 7), (22, 8)]) is None
    procs.dead.add(14)                                                      # the forked helper ends: no crash
    assert watch.check(10, [(10, 1), (11, 2), (12, 3), (20, 6), (21, 7), (22, 8)]) is None
    assert sorted(watch.children) == [11, 12, 20, 21, 22]
    procs.dead.add(22)
    assert "sglang::scheduler_DP1 (PID 22) is gone" in watch.check(10, [(10, 1), (11, 2), (12, 3), (20, 6), (21, 7)])


def test_crash_watch_reads_the_crash_lines_of_the_log_as_they_come(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("=== an older run ===\nScheduler hit an exception: old\n")
    offset = log.stat().st_size
    watch = crash_watch.CrashWatch(str(log), offset, role_of=lambda pid: None, alive=lambda pid, start=None: True)
    assert watch.check(10, [(10, 1)]) is None                              # the older run's crash is not this one's
    with open(str(log), "a") as fh:
        fh.write("[2026-12-06 21:00:00] Load weight end.\n[2026-12-06 21:00:01] Sleeping 5 seconds before crash diag")
    assert watch.check(10, [(10, 1)]) is None                              # a line cut in the middle waits for its end
    assert watch.in_diagnostics is False
    with open(str(log), "a") as fh:
        fh.write("nostics to let GPU activity settle.\n")
    assert watch.check(10, [(10, 1)]) == ("its log says: [2026-12-06 21:00:01] Sleeping 5 seconds before crash "
                                          "diagnostics to let GPU activity settle.")
    assert watch.check(10, [(10, 1)]) is None                              # read once
    assert watch.in_diagnostics is True                                     # and remembered: stop it now


@pytest.mark.parametrize("line", [
    "[2026-12-06 21:00:00] Scheduler hit an exception: Traceback (most recent call last):",
    "[2026-12-06 21:00:00] DetokenizerManager hit an exception: boom",
    "[2026-12-06 21:00:00] Received sigquit from a child process. It usually means the child failed.",
    "[2026-12-06 21:00:00] Sleeping 5 seconds before crash diagnostics to let GPU activity settle.",
])
def test_crash_lines(line):
    assert crash_watch.crash_line("ok\n%s\nmore\n" % line) == line
    assert crash_watch.crash_line("The server is fired up and ready to roll!\n") is None


def test_child_role_reads_the_title_and_falls_back_to_comm(tmp_path):
    titled = subprocess.Popen(["bash", "-c", "exec -a sglang::scheduler_TP0 sleep 60"])
    plain = subprocess.Popen(["sleep", "60"])
    try:
        deadline = time.monotonic() + 30
        while sp.cmdline(titled.pid)[:1] != ["sglang::scheduler_TP0"]:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert crash_watch.child_role(titled.pid) == "sglang::scheduler_TP0"
        assert crash_watch.child_role(plain.pid) is None
        assert crash_watch.child_role(2 ** 22 + 7) is None                     # no such process
    finally:
        for proc in (titled, plain):
            proc.kill()
            proc.wait()


# ---------------------------------------------------------------------------
# e. sglang serve
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("argv,server", [
    (["/usr/bin/python3", "-m", "sglang.launch_server", "--model-path", "/m"], True),
    # 0.5.23's console script through its shebang: [interpreter, script, serve, ...] (kernel binfmt_script)
    (["/opt/venv/bin/python3.11", "/opt/venv/bin/sglang", "serve", "--model-path", "/m", "--port", "30000"], True),
    (["/opt/venv/bin/sglang", "serve", "--model-path", "/m"], True),
    (["python3", "-m", "sglang.cli.main", "serve", "--model-path", "/m"], True),
    (["/opt/venv/bin/python3", "/opt/venv/bin/sglang", "generate", "--model-path", "/m"], False),
    (["/opt/venv/bin/python3", "/opt/venv/bin/killall_sglang"], False),
    (["python3", "-m", "sglang.bench_serving", "--model", "sglang.launch_server"], False),
    (["python3", "tool.py", "--model-path", "/models/sglang", "serve"], False),
    (["sglang::scheduler"], False),
    ([], False),
])
def test_is_server_argv(argv, server):
    assert crash_watch.is_server_argv(argv) is server
