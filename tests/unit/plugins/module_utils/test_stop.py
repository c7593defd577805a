"""The waiter (wait.py) and the stop engine (stop.py).

The waiter runs on a fake clock, so its schedule is exact. The engine stops
real processes this test forks (SIGKILLed and reaped by PID at teardown).
"""
from __future__ import annotations

import os
import signal
import time

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils.node import procfs
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import supervise as sp
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import stop
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import wait


# ---------------------------------------------------------------------------
# wait_for on a fake clock
# ---------------------------------------------------------------------------

class FakeClock:
    def __init__(self):
        self.now = 100.0
        self.sleeps = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(round(seconds, 6))
        self.now += seconds


def schedule(poll_s, true_after, interval, timeout):
    clock = FakeClock()
    starts = []

    def predicate():
        starts.append(round(clock.now - 100.0, 6))
        clock.now += poll_s
        return len(starts) >= true_after and "done"

    res = wait.wait_for(predicate, timeout=timeout, interval=interval, sleep=clock.sleep, clock=clock)
    return res, starts, clock.sleeps


def test_polls_start_every_interval_whatever_a_poll_takes():
    res, starts, sleeps = schedule(0.2, 4, 0.5, 10)
    assert res.ok and res.value == "done" and res.polls == 4
    assert starts == [0.0, 0.5, 1.0, 1.5] and sleeps == [0.3, 0.3, 0.3]


def test_slow_polls_follow_at_once_and_the_last_poll_is_at_the_deadline():
    dummy, starts, sleeps = schedule(0.7, 3, 0.5, 10)
    assert starts == [0.0, 0.7, 1.4] and sleeps == []
    res, starts, dummy = schedule(0.2, 99, 0.5, 1.3)
    assert not res.ok and starts == [0.0, 0.5, 1.0, 1.3]
    res, starts, dummy = schedule(0.2, 99, 0.5, 1.2)          # a poll that ends at the deadline is the last
    assert not res.ok and starts == [0.0, 0.5, 1.0]


def test_interval_zero_looks_once_and_on_poll_can_shorten_the_deadline():
    res, starts, dummy = schedule(0.1, 99, 0.0, 5)
    assert not res.ok and starts == [0.0]
    clock = FakeClock()
    seen = []

    def on_poll(value, polls, deadline):
        seen.append(polls)
        if polls == 2:
            deadline.shorten(0.15)

    res = wait.wait_for(lambda: False, timeout=60, interval=0.1, on_poll=on_poll, sleep=clock.sleep, clock=clock)
    assert not res.ok and res.polls == 4 and seen == [1, 2, 3, 4] and round(res.elapsed, 6) == 0.25   # last look at the new end


def test_deadline_clamps_and_never_goes_negative():
    clock = FakeClock()
    deadline = wait.Deadline(5, clock=clock)
    clock.now += 4
    assert deadline.clamp(3) == 1 and not deadline.expired()
    clock.now += 2
    assert deadline.remaining() == 0 and deadline.expired() and deadline.clamp(3) == 0
    assert wait.Deadline(-3, clock=clock).expired()
    assert procfs.Deadline is wait.Deadline                       # older callers get the same class


# ---------------------------------------------------------------------------
# The stop engine on real processes
# ---------------------------------------------------------------------------

def _fork(target):
    pid = os.fork()
    if pid == 0:
        try:
            target()
        finally:
            os._exit(0)
    return pid


def _sleeper(ignore=None):
    def run():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)
        if ignore is not None:
            signal.signal(ignore, signal.SIG_IGN)
        while True:
            signal.pause()
    return run


@pytest.fixture
def kids():
    pids = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def _start(kids, target):
    pid = _fork(target)
    kids.append(pid)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:                 # wait until it runs its own code
        if procfs.read_signal_masks(pid) and procfs.read_signal_masks(pid)["SigIgn"] != -1:
            break
        time.sleep(0.01)
    time.sleep(0.05)
    return pid


def _reap(pid):
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def test_first_signal_then_grace_then_sigkill(kids):
    root = _start(kids, _sleeper())
    child = _start(kids, _sleeper(ignore=signal.SIGTERM))     # outlives its "server"
    res = stop.stop([stop.Target(root, name="root", first=True), stop.Target(child, name="child")],
                    term_timeout=30, kill_timeout=5, grace=0.2, on_exit=_reap)
    stop.close_all(res)
    by_pid = dict((r["pid"], r) for r in res["reports"])
    assert by_pid[root]["signals"] == ["SIGTERM"] and by_pid[root]["first_signal"] == "default"
    assert by_pid[child]["signals"] == ["SIGKILL"] and by_pid[child]["first_signal"] is None
    assert by_pid[child]["seconds_to_exit"] >= by_pid[root]["seconds_to_exit"]
    assert res["survivors"] == [] and res["elapsed"] < 30           # the grace, not term_timeout, ended the wait
    assert [r["pid"] for r in res["reports"]] == [root, child]


def test_an_ignored_first_signal_is_reported_and_escalated(kids):
    pid = _start(kids, _sleeper(ignore=signal.SIGQUIT))
    res = stop.stop([stop.Target(pid, first=True)], first_signal=signal.SIGQUIT, term_timeout=0.3, kill_timeout=5,
                    on_exit=_reap)
    stop.close_all(res)
    report = res["reports"][0]
    assert report["first_signal"] == "ignored" and report["signals"] == ["SIGQUIT", "SIGKILL"]
    assert report["seconds_to_exit"] is not None and res["survivors"] == []


def test_sigkill_first_is_sent_once_and_before_kill_adds_late_children(kids):
    a = _start(kids, _sleeper(ignore=signal.SIGTERM))
    late = _start(kids, _sleeper())
    calls = []

    def before_kill(live):
        calls.append(list(live))
        return [stop.Target(late, name="late")]

    res = stop.stop([stop.Target(a, first=True)], term_timeout=0.2, kill_timeout=5, before_kill=before_kill,
                    on_exit=_reap)
    stop.close_all(res)
    assert calls == [[a]]
    assert [(r["pid"], r["signals"]) for r in res["reports"]] == [(a, ["SIGTERM", "SIGKILL"]), (late, ["SIGKILL"])]
    b = _start(kids, _sleeper())
    killed, still = stop.kill([(b, procfs.read_stat(b)["starttime"])], grace=5)
    assert killed == [b] and still == []


def test_a_reused_pid_is_never_signalled(kids):
    pid = _start(kids, _sleeper())
    start = procfs.read_stat(pid)["starttime"]
    res = stop.stop([stop.Target(pid, starttime=start + 1, first=True)], term_timeout=0.1, kill_timeout=0.1)
    assert res["reports"][0]["signals"] == [] and res["reports"][0]["seconds_to_exit"] == 0.0
    assert procfs.read_stat(pid)["state"] not in ("Z", "X")


def test_survivors_are_reported_with_their_state(kids, monkeypatch):
    pid = _start(kids, _sleeper(ignore=signal.SIGTERM))
    real_send = stop.ProcessHandle.send

    def send(self, sig):
        if sig == signal.SIGKILL:                  # pretend SIGKILL cannot take it (state D)
            self.signals.append("SIGKILL")
            return True
        return real_send(self, sig)

    monkeypatch.setattr(stop.ProcessHandle, "send", send)
    res = stop.stop([stop.Target(pid, first=True)], term_timeout=0.1, kill_timeout=0.2)
    stop.close_all(res)
    assert res["survivors"] == [pid] and res["reports"][0]["state"].startswith("S")


def test_sglang_process_stop_tree_delegates_with_its_old_result_shape(kids):
    pid = _start(kids, _sleeper())
    report = sp.stop_tree(pid, timeout=5, is_child=True)
    kids.remove(pid)
    assert report["signalled"] == [pid] and report["killed"] == [] and report["still_running"] == []
    assert report["exited"] == [pid] and isinstance(report["elapsed"], float)
    assert sp.stop_tree(pid) == {"signalled": [], "killed": [], "exited": [], "still_running": [], "elapsed": 0.0}
