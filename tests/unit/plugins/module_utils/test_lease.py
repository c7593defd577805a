"""The node lease (module_utils/redeploy/lease.py), judged on real directories and real processes.

"Alive" and "dead" PIDs are real children of this test (``python3 -c 'import time; time.sleep(30)'``),
killed and reaped by PID. The wall clock of the lease (``now_fn``) and the wait clock
(``clock``/``sleep``) are injected, so no test waits for real and every deadline is exact.
Holder records are planted with plain ``os.mkdir`` + ``json.dump``, independently of the code
under test.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import socket
import stat
import subprocess
import sys
import threading
import time

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import lease

NOW = 1_900_000_000.0       # the lease's wall clock in these tests (a fixed epoch second)


def now_fn():
    return NOW


class FakeWait:
    """``clock``/``sleep`` pair: sleeping advances the clock and never waits for real."""

    def __init__(self):
        self.t = 0.0
        self.sleeps = []

    def clock(self):
        return self.t

    def sleep(self, seconds):
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.t += seconds
        time.sleep(0)           # yield to other threads, do not wait


def acquire(path, run_id, **kw):
    wait = kw.pop("wait", None) or FakeWait()
    kw.setdefault("now_fn", now_fn)
    return lease.acquire(str(path), run_id, clock=wait.clock, sleep=wait.sleep, **kw)


# ---------------------------------------------------------------------------
# Real processes
# ---------------------------------------------------------------------------

def _sleeper():
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])


@pytest.fixture
def procs():
    started = []

    def start():
        proc = _sleeper()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            os.kill(proc.pid, 9)
        proc.wait()


def _start_of(pid):
    with open("/proc/%d/stat" % pid, encoding="ascii") as fh:
        text = fh.read()
    return int(text[text.rfind(")") + 2:].split()[19])


@pytest.fixture
def live(procs):
    """A live PID and its start time (field 22 of /proc/PID/stat, read here independently)."""
    proc = procs()
    return proc.pid, _start_of(proc.pid)


@pytest.fixture
def dead(procs):
    """The PID of a child that ran and was reaped (gone from /proc)."""
    proc = procs()
    os.kill(proc.pid, 9)
    proc.wait()
    assert not os.path.exists("/proc/%d" % proc.pid)
    return proc.pid


def _boot_id():
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
        return fh.read().strip()


def _pidns():
    return os.readlink("/proc/self/ns/pid")


def controller(pid, start=None, boot=None, pidns=None, host="ctl-01", user="alice"):
    return {"host": host, "pid": pid, "starttime": start, "boot_id": _boot_id() if boot is None else boot,
            "pidns": _pidns() if pidns is None else pidns, "user": user}


def record(owner, ctl=None, expires_in=200.0, node_pid=None, node_pid_start=None, ttl=300.0):
    taken = NOW + expires_in - ttl
    return {"owner": owner, "controller": ctl or {}, "node": {"host": socket.gethostname()}, "taken_at": taken,
            "renewed_at": taken, "ttl": ttl, "expires_at": NOW + expires_in, "node_pid": node_pid,
            "node_pid_start": node_pid_start}


def plant(path, holder):
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    os.mkdir(str(path), 0o700)
    if holder is not None:
        with open(os.path.join(str(path), "holder.json"), "w", encoding="utf-8") as fh:
            json.dump(holder, fh)
    return holder


def holder_of(path):
    with open(os.path.join(str(path), "holder.json"), encoding="utf-8") as fh:
        return json.load(fh)


@pytest.fixture
def lp(tmp_path):
    return tmp_path / "locks" / "sglang.lease"


# ---------------------------------------------------------------------------
# Free, mine, renew on acquire
# ---------------------------------------------------------------------------

def test_acquire_free_lease_creates_private_dir_and_holder(lp):
    ctl = controller(os.getpid(), _start_of(os.getpid()))
    got = acquire(lp, "run-a", controller=ctl, ttl=120)
    assert got["acquired"] is True and got["already_held"] is False
    assert got["took_over"] is None and got["took_over_reason"] is None
    assert got["waited"] == 0
    assert stat.S_IMODE(os.stat(str(lp)).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(os.path.join(str(lp), "holder.json")).st_mode) == 0o600
    on_disk = holder_of(lp)
    assert on_disk == got["holder"]
    assert on_disk["owner"] == "run-a"
    assert on_disk["controller"] == ctl
    assert on_disk["taken_at"] == NOW and on_disk["renewed_at"] == NOW
    assert on_disk["expires_at"] == NOW + 120
    assert on_disk["node_pid"] is None
    assert on_disk["node"]["boot_id"] == _boot_id() and on_disk["node"]["pidns"] == _pidns()
    assert got["generation"] == 1


def test_acquire_clamps_ttl_to_minimum(lp):
    got = acquire(lp, "run-a", ttl=1)
    assert got["holder"]["ttl"] == lease.MIN_TTL
    assert got["holder"]["expires_at"] == NOW + lease.MIN_TTL


def test_acquire_again_by_same_run_renews_without_new_generation(lp):
    first = acquire(lp, "run-a", ttl=60)
    later = [NOW + 45.0]
    again = acquire(lp, "run-a", ttl=60, now_fn=lambda: later[0])
    assert again["acquired"] is True and again["already_held"] is True
    assert again["generation"] == first["generation"]
    assert lease.read_generation(str(lp)) == first["generation"]
    on_disk = holder_of(lp)
    assert on_disk["taken_at"] == NOW
    assert on_disk["renewed_at"] == later[0]
    assert on_disk["expires_at"] == later[0] + 60


def test_acquire_same_run_even_after_its_deadline_passed(lp):
    plant(lp, record("run-a", expires_in=-500))
    got = acquire(lp, "run-a", ttl=60)
    assert got["already_held"] is True and got["took_over"] is None
    assert holder_of(lp)["expires_at"] == NOW + 60


def test_acquire_makes_missing_parents(tmp_path):
    path = tmp_path / "a" / "b" / "c" / "lease"
    assert acquire(path, "run-a")["acquired"]
    assert os.path.isdir(str(path))


# ---------------------------------------------------------------------------
# A live holder: wait, then LeaseBusy
# ---------------------------------------------------------------------------

def test_live_holder_waits_the_timeout_then_lease_busy(lp, live):
    pid, start = live
    held = plant(lp, record("run-old", controller(pid, start, user="bob"), expires_in=200))
    wait = FakeWait()
    with pytest.raises(lease.LeaseBusy) as info:
        acquire(lp, "run-new", timeout=7.5, wait=wait)
    exc = info.value
    # It really waited (on the fake clock) exactly the timeout, in bounded steps.
    assert len(wait.sleeps) > 1
    assert sum(wait.sleeps) == pytest.approx(7.5)
    assert max(wait.sleeps) <= 2.0
    assert exc.waited == pytest.approx(7.5)
    assert exc.holder == held
    msg = str(exc)
    assert "run-old" in msg                         # the holder
    assert "sglang_lease_break=run-old" in msg      # the break variable, with the value to give
    assert "ctl-01" in msg and str(pid) in msg      # the controller
    assert "bob" in msg
    assert str(lp) in msg
    assert "7.5" in msg
    # Nothing changed.
    assert holder_of(lp) == held
    assert lease.read_generation(str(lp)) == 0


def test_live_holder_timeout_zero_fails_at_once(lp, live):
    plant(lp, record("run-old", controller(*live), expires_in=200))
    wait = FakeWait()
    with pytest.raises(lease.LeaseBusy):
        acquire(lp, "run-new", timeout=0, wait=wait)
    assert wait.sleeps == []


def test_live_holder_that_releases_while_waiting_is_taken(lp, live):
    plant(lp, record("run-old", controller(*live), expires_in=200))
    wait = FakeWait()
    real_sleep = wait.sleep

    def sleep(seconds):
        real_sleep(seconds)
        if len(wait.sleeps) == 3:
            lease.release(str(lp), "run-old")

    wait.sleep = sleep
    got = acquire(lp, "run-new", timeout=60, wait=wait)
    assert got["acquired"] and got["took_over"] is None
    assert got["waited"] == pytest.approx(sum(wait.sleeps))
    assert holder_of(lp)["owner"] == "run-new"


def test_lease_busy_without_holder_record_suggests_star(lp):
    plant(lp, None)
    with pytest.raises(lease.LeaseBusy) as info:
        acquire(lp, "run-new", timeout=0)
    assert "sglang_lease_break='*'" in str(info.value)


# ---------------------------------------------------------------------------
# EXPIRED
# ---------------------------------------------------------------------------

def test_expired_lease_is_taken_over_and_reported(lp):
    old = plant(lp, record("run-old", controller(12345, boot="other-boot"), expires_in=-90))
    got = acquire(lp, "run-new", timeout=0)
    assert got["acquired"] and not got["already_held"]
    assert got["took_over"] == old
    assert "deadline passed 90 s ago" in got["took_over_reason"]
    assert holder_of(lp)["owner"] == "run-new"
    assert got["generation"] == 1
    leftovers = sorted(os.listdir(str(lp.parent)))
    assert leftovers == sorted([lp.name, lp.name + ".generation"])     # nothing half-removed left behind


def test_lease_at_its_deadline_is_still_live(lp):
    plant(lp, record("run-old", controller(12345, boot="other-boot"), expires_in=0))
    with pytest.raises(lease.LeaseBusy):
        acquire(lp, "run-new")


def test_expired_lease_of_live_controller_on_this_machine_is_taken_over(lp, live):
    # The deadline rules: a controller that stopped renewing loses the lease even if it still runs.
    old = plant(lp, record("run-old", controller(*live), expires_in=-1))
    got = acquire(lp, "run-new")
    assert got["took_over"] == old
    assert lease.inspect(str(lp), now=NOW)["owner"] == "run-new"


# ---------------------------------------------------------------------------
# DEAD: only provable on this machine and PID namespace
# ---------------------------------------------------------------------------

def test_dead_controller_on_this_machine_is_taken_over_before_expiry(lp, dead):
    old = plant(lp, record("run-old", controller(dead, 4242), expires_in=250))
    assert lease.inspect(str(lp), "run-new", now=NOW)["state"] == lease.DEAD
    got = acquire(lp, "run-new")
    assert got["took_over"] == old
    assert str(dead) in got["took_over_reason"] and "gone" in got["took_over_reason"]
    assert holder_of(lp)["owner"] == "run-new"


def test_dead_controller_without_start_time_is_taken_over(lp, dead):
    old = plant(lp, record("run-old", controller(dead, None), expires_in=250))
    assert acquire(lp, "run-new")["took_over"] == old


def test_reused_controller_pid_with_other_start_time_is_dead(lp, live):
    pid, start = live
    old = plant(lp, record("run-old", controller(pid, start + 777), expires_in=250))
    got = acquire(lp, "run-new")
    assert got["took_over"] == old
    assert str(pid) in got["took_over_reason"]


def test_live_controller_with_matching_start_time_keeps_lease(lp, live):
    plant(lp, record("run-old", controller(*live), expires_in=250))
    assert lease.inspect(str(lp), "run-new", now=NOW)["state"] == lease.LIVE
    with pytest.raises(lease.LeaseBusy):
        acquire(lp, "run-new", timeout=3)


@pytest.mark.parametrize("where", ["other boot id", "other pid namespace", "no boot id"])
def test_controller_on_another_machine_is_never_dead(lp, dead, where):
    boot, pidns = None, None
    if where == "other boot id":
        boot = "00000000-0000-0000-0000-000000000000"
    elif where == "other pid namespace":
        pidns = "pid:[1]"
    else:
        boot = ""
    ctl = controller(dead, 4242, boot=boot, pidns=pidns)
    held = plant(lp, record("run-old", ctl, expires_in=250))
    info = lease.inspect(str(lp), "run-new", now=NOW)
    assert info["state"] == lease.LIVE
    with pytest.raises(lease.LeaseBusy):
        acquire(lp, "run-new", timeout=5)
    assert holder_of(lp) == held
    # Only the deadline counts for it.
    assert lease.inspect(str(lp), "run-new", now=NOW + 251)["state"] == lease.EXPIRED
    got = acquire(lp, "run-new", now_fn=lambda: NOW + 251)
    assert got["took_over"] == held
    assert "deadline" in got["took_over_reason"]


def test_judge_uses_the_given_local_identity(dead):
    ctl = controller(dead, 4242)
    holder = record("run-old", ctl, expires_in=250)
    here = {"host": "n1", "boot_id": ctl["boot_id"], "pidns": ctl["pidns"]}
    assert lease.judge(holder, "run-new", NOW, local=here)[0] == lease.DEAD
    elsewhere = dict(here, boot_id="another")
    assert lease.judge(holder, "run-new", NOW, local=elsewhere)[0] == lease.LIVE
    assert lease.judge(holder, "run-new", NOW + 251, local=elsewhere)[0] == lease.EXPIRED
    assert lease.judge(holder, "run-old", NOW, local=here)[0] == lease.MINE
    assert lease.judge(None, "run-new", NOW, local=here)[0] == lease.LIVE


# ---------------------------------------------------------------------------
# node_pid: a module acting for the holder keeps it live
# ---------------------------------------------------------------------------

def test_live_node_pid_keeps_lease_past_deadline(lp, live, dead):
    pid, start = live
    held = plant(lp, record("run-old", controller(dead, 4242), expires_in=-1000, node_pid=pid, node_pid_start=start))
    info = lease.inspect(str(lp), "run-new", now=NOW)
    assert info["state"] == lease.LIVE
    assert str(pid) in info["reason"]
    with pytest.raises(lease.LeaseBusy) as exc:
        acquire(lp, "run-new", timeout=4)
    assert str(pid) in str(exc.value)
    assert holder_of(lp) == held


def test_node_pid_with_other_start_time_does_not_count(lp, live):
    pid, start = live
    old = plant(lp, record("run-old", controller(12345, boot="x"), expires_in=-10, node_pid=pid,
                           node_pid_start=start + 1))
    assert acquire(lp, "run-new")["took_over"] == old


def test_dead_node_pid_and_dead_controller_is_dead(lp, procs):
    a, b = procs(), procs()
    for proc in (a, b):
        os.kill(proc.pid, 9)
        proc.wait()
    old = plant(lp, record("run-old", controller(a.pid, 1), expires_in=250, node_pid=b.pid, node_pid_start=2))
    assert lease.inspect(str(lp), "run-new", now=NOW)["state"] == lease.DEAD
    assert acquire(lp, "run-new")["took_over"] == old


# ---------------------------------------------------------------------------
# The operator's break
# ---------------------------------------------------------------------------

def test_break_of_a_live_lease_by_its_run_id(lp, live):
    held = plant(lp, record("run-old", controller(*live), expires_in=250))
    got = acquire(lp, "run-new", break_lease="run-old")
    assert got["acquired"] and got["took_over"] == held
    assert "sglang_lease_break=run-old" in got["took_over_reason"]
    assert holder_of(lp)["owner"] == "run-new"
    assert [n for n in os.listdir(str(lp.parent)) if "broken" in n or "stale" in n] == []


def test_break_star_breaks_any_live_lease(lp, live):
    held = plant(lp, record("run-old", controller(*live), expires_in=250))
    got = acquire(lp, "run-new", break_lease="*")
    assert got["took_over"] == held


def test_break_naming_another_run_breaks_nothing(lp, live):
    held = plant(lp, record("run-old", controller(*live), expires_in=250))
    with pytest.raises(lease.LeaseBusy):
        acquire(lp, "run-new", break_lease="run-something-else", timeout=2)
    assert holder_of(lp) == held


def test_break_of_own_lease_keeps_it(lp):
    acquire(lp, "run-a")
    got = acquire(lp, "run-a", break_lease="*")
    assert got["already_held"] is True and got["took_over"] is None
    assert lease.read_generation(str(lp)) == 1


# ---------------------------------------------------------------------------
# Concurrent takeovers of one expired lease
# ---------------------------------------------------------------------------

def _contender(path, run_id, barrier, results):
    wait = FakeWait()
    barrier.wait()
    try:
        got = lease.acquire(path, run_id, timeout=3.0, clock=wait.clock, sleep=wait.sleep, now_fn=now_fn)
        results.append((run_id, "acquired", got["took_over"] is not None))
    except lease.LeaseBusy as exc:
        results.append((run_id, "busy", (exc.holder or {}).get("owner")))


def test_concurrent_takeovers_by_threads_leave_one_holder(lp):
    old = record("run-old", controller(12345, boot="other"), expires_in=-100)
    for attempt in range(5):
        if os.path.isdir(str(lp)):
            lease.release(str(lp), None, force=True)
        plant(lp, old)
        runs = ["run-%d-%d" % (attempt, i) for i in range(8)]
        barrier = threading.Barrier(len(runs))
        results = []
        threads = [threading.Thread(target=_contender, args=(str(lp), r, barrier, results)) for r in runs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(results) == len(runs)
        winners = [r for r in results if r[1] == "acquired"]
        assert len(winners) == 1, results
        winner = winners[0][0]
        assert holder_of(lp)["owner"] == winner
        # Each loser saw the old lease (being taken), no record yet, or the winner's fresh lease.
        assert set(r[2] for r in results if r[1] == "busy") <= {winner, "run-old", None}
        assert lease.read_generation(str(lp)) == attempt + 1              # one acquisition per round
        names = set(os.listdir(str(lp.parent)))
        assert names == {lp.name, lp.name + ".generation"}, names


def _contender_process(path, run_id, barrier, queue):
    wait = FakeWait()
    barrier.wait()
    try:
        lease.acquire(path, run_id, timeout=3.0, clock=wait.clock, sleep=wait.sleep, now_fn=now_fn)
        queue.put((run_id, "acquired"))
    except lease.LeaseBusy:
        queue.put((run_id, "busy"))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        queue.put((run_id, "error %r" % exc))


def test_concurrent_takeovers_by_processes_leave_one_holder(lp):
    plant(lp, record("run-old", controller(12345, boot="other"), expires_in=-100))
    ctx = multiprocessing.get_context("fork")
    runs = ["proc-%d" % i for i in range(4)]
    barrier = ctx.Barrier(len(runs))
    queue = ctx.Queue()
    children = [ctx.Process(target=_contender_process, args=(str(lp), r, barrier, queue)) for r in runs]
    try:
        for child in children:
            child.start()
        results = [queue.get(timeout=60) for dummy in runs]
    finally:
        for child in children:
            child.join(30)
            if child.is_alive():
                os.kill(child.pid, 9)
                child.join()
    assert sorted(r[1] for r in results) == ["acquired"] + ["busy"] * (len(runs) - 1), results
    winner = [r[0] for r in results if r[1] == "acquired"][0]
    assert holder_of(lp)["owner"] == winner
    assert lease.read_generation(str(lp)) == 1


# ---------------------------------------------------------------------------
# Records of the old node_lock format (owner/since, no expires_at)
# ---------------------------------------------------------------------------

def _legacy(since_ago, controller_value=""):
    return {"owner": "run-legacy", "host": socket.gethostname(), "pid": 4242, "since": NOW - since_ago,
            "controller": controller_value}


def test_legacy_record_recent_is_live(lp):
    held = plant(lp, _legacy(10))
    assert lease.inspect(str(lp), "run-new", now=NOW)["state"] == lease.LIVE
    with pytest.raises(lease.LeaseBusy) as info:
        acquire(lp, "run-new", timeout=1)
    assert "run-legacy" in str(info.value)
    assert holder_of(lp) == held


def test_legacy_record_older_than_default_ttl_expires(lp):
    held = plant(lp, _legacy(lease.DEFAULT_TTL + 5))
    got = acquire(lp, "run-new")
    assert got["took_over"] == held
    assert holder_of(lp)["owner"] == "run-new"


# ---------------------------------------------------------------------------
# renew / release
# ---------------------------------------------------------------------------

def test_renew_pushes_deadline_and_keeps_taken_at(lp):
    acquire(lp, "run-a", ttl=100)
    out = lease.renew(str(lp), "run-a", ttl=45, now=NOW + 10)
    assert out == holder_of(lp)
    assert out["renewed_at"] == NOW + 10 and out["expires_at"] == NOW + 55 and out["ttl"] == 45
    assert out["taken_at"] == NOW
    again = lease.renew(str(lp), "run-a", now=NOW + 20)        # keeps the ttl it had
    assert again["expires_at"] == NOW + 65
    clamped = lease.renew(str(lp), "run-a", ttl=2, now=NOW + 30)
    assert clamped["expires_at"] == NOW + 30 + lease.MIN_TTL


def test_renew_sets_and_clears_node_pid(lp, live):
    pid, start = live
    acquire(lp, "run-a")
    out = lease.renew(str(lp), "run-a", node_pid=pid, now=NOW)
    assert out["node_pid"] == pid and out["node_pid_start"] == start
    kept = lease.renew(str(lp), "run-a", now=NOW + 1)
    assert kept["node_pid"] == pid
    cleared = lease.renew(str(lp), "run-a", clear_node_pid=True, now=NOW + 2)
    assert cleared["node_pid"] is None and cleared["node_pid_start"] is None
    assert holder_of(lp)["node_pid"] is None


def test_renew_raises_lease_lost_when_another_run_holds_it(lp):
    acquire(lp, "run-b")
    before = holder_of(lp)
    with pytest.raises(lease.LeaseLost) as info:
        lease.renew(str(lp), "run-a", now=NOW + 5)
    assert "run-a" in str(info.value) and "run-b" in str(info.value)
    assert holder_of(lp) == before


def test_renew_raises_lease_lost_when_lease_is_gone(lp):
    with pytest.raises(lease.LeaseLost):
        lease.renew(str(lp), "run-a")
    assert not os.path.exists(str(lp))


def test_release_by_owner(lp):
    acquire(lp, "run-a")
    released, seen = lease.release(str(lp), "run-a")
    assert released is True and seen["owner"] == "run-a"
    assert not os.path.exists(str(lp))
    assert set(os.listdir(str(lp.parent))) == {lp.name + ".generation"}


def test_release_by_other_run_raises_and_keeps_lease(lp):
    acquire(lp, "run-a")
    before = holder_of(lp)
    with pytest.raises(lease.LeaseLost) as info:
        lease.release(str(lp), "run-b")
    assert "run-a" in str(info.value)
    assert holder_of(lp) == before


def test_release_force_removes_other_runs_lease(lp):
    acquire(lp, "run-a")
    released, seen = lease.release(str(lp), "run-b", force=True)
    assert released is True and seen["owner"] == "run-a"
    assert not os.path.exists(str(lp))


def test_release_of_free_lease(lp):
    assert lease.release(str(lp), "run-a") == (False, None)


# ---------------------------------------------------------------------------
# KeepAlive
# ---------------------------------------------------------------------------

def test_keepalive_names_this_process_while_inside_and_clears_on_exit(lp):
    acquire(lp, "run-a", ttl=90)
    with lease.KeepAlive(str(lp), "run-a") as ka:
        inside = holder_of(lp)
        assert inside["node_pid"] == os.getpid()
        assert inside["node_pid_start"] == _start_of(os.getpid())
        assert ka.ttl == 90
        # Another run sees the lease live even when the deadline has long passed.
        info = lease.inspect(str(lp), "run-b", now=NOW + 10_000)
        assert info["state"] == lease.LIVE
        with pytest.raises(lease.LeaseBusy):
            acquire(lp, "run-b", now_fn=lambda: NOW + 10_000, timeout=2)
        ka.check()
        assert ka.lost is None
    after = holder_of(lp)
    assert after["owner"] == "run-a"
    assert after["node_pid"] is None and after["node_pid_start"] is None
    assert ka._thread is not None and not ka._thread.is_alive()
    # Once nobody acts for it, the deadline counts again.
    assert lease.inspect(str(lp), "run-b", now=after["expires_at"] + 1)["state"] == lease.EXPIRED


def test_keepalive_beat_renews(lp):
    acquire(lp, "run-a", ttl=60)
    first = holder_of(lp)["expires_at"]
    with lease.KeepAlive(str(lp), "run-a") as ka:
        # The beat uses the real clock; NOW lies in the future, so set the deadline back first.
        holder = holder_of(lp)
        holder["expires_at"] = 1.0
        with open(os.path.join(str(lp), "holder.json"), "w", encoding="utf-8") as fh:
            json.dump(holder, fh)
        ka.beat()
        assert holder_of(lp)["expires_at"] > 1.0
        assert holder_of(lp)["ttl"] == 60
        assert holder_of(lp)["node_pid"] == os.getpid()
    assert first == NOW + 60 and holder_of(lp)["node_pid"] is None


def test_keepalive_records_lease_lost_when_taken(lp):
    acquire(lp, "run-a", ttl=60)
    with lease.KeepAlive(str(lp), "run-a") as ka:
        lease.release(str(lp), "run-a", force=True)
        acquire(lp, "run-b", ttl=60)
        theirs = holder_of(lp)
        ka.beat()
        assert isinstance(ka.lost, lease.LeaseLost)
        with pytest.raises(lease.LeaseLost) as info:
            ka.check()
        assert "run-b" in str(info.value)
    # The exit never touches the new holder's record.
    assert holder_of(lp) == theirs


def test_keepalive_without_lease_is_a_no_op(tmp_path):
    with lease.KeepAlive(None, "run-a") as ka:
        ka.check()
    with lease.KeepAlive(str(tmp_path / "x"), "") as ka:
        ka.check()
    assert ka._thread is None


def test_keepalive_on_lost_lease_at_entry(lp):
    with lease.KeepAlive(str(lp), "run-a") as ka:
        assert isinstance(ka.lost, lease.LeaseLost)
    assert not os.path.exists(str(lp))


# ---------------------------------------------------------------------------
# inspect and the generation counter
# ---------------------------------------------------------------------------

def test_inspect_free_and_held(lp, live):
    free = lease.inspect(str(lp))
    assert free["held"] is False and free["state"] == lease.FREE and free["owner"] is None
    assert free["holder"] == {} and free["generation"] == 0
    acquire(lp, "run-a")
    mine = lease.inspect(str(lp), "run-a", now=NOW)
    assert mine["held"] is True and mine["state"] == lease.MINE and mine["owner"] == "run-a"
    assert mine["holder"] == holder_of(lp) and mine["generation"] == 1
    other = lease.inspect(str(lp), "run-b", now=NOW)
    assert other["state"] == lease.LIVE
    later = lease.inspect(str(lp), "run-b", now=NOW + lease.DEFAULT_TTL + 1)
    assert later["state"] == lease.EXPIRED
    # Read-only: inspecting changed nothing.
    assert holder_of(lp) == mine["holder"] and lease.read_generation(str(lp)) == 1


def test_generation_counts_acquisitions_across_releases_and_takeovers(lp):
    seen = []
    for i in range(3):
        seen.append(acquire(lp, "run-%d" % i)["generation"])
        lease.release(str(lp), "run-%d" % i)
    plant(lp, record("run-dead", controller(1, boot="x"), expires_in=-5))
    seen.append(acquire(lp, "run-new")["generation"])
    seen.append(acquire(lp, "run-new")["generation"])          # already held: not counted
    assert seen == [1, 2, 3, 4, 4]
    assert lease.read_generation(str(lp)) == 4
    assert lease.inspect(str(lp))["generation"] == 4
    with open(lease.generation_path(str(lp)), encoding="utf-8") as fh:
        assert fh.read().strip() == "4"


def test_unreadable_generation_counts_as_zero(lp):
    lp.parent.mkdir(parents=True)
    with open(lease.generation_path(str(lp)), "w", encoding="utf-8") as fh:
        fh.write("garbage")
    assert lease.read_generation(str(lp)) == 0
    assert acquire(lp, "run-a")["generation"] == 1


# ---------------------------------------------------------------------------
# Process and machine identity helpers
# ---------------------------------------------------------------------------

def test_process_start_and_same_process_alive(live, dead):
    pid, start = live
    assert lease.process_start(pid) == start
    assert lease.same_process_alive(pid, start)
    assert lease.same_process_alive(pid, None)
    assert not lease.same_process_alive(pid, start + 1)
    assert lease.process_start(dead) is None
    assert not lease.same_process_alive(dead, None)
    assert not lease.same_process_alive(None, None)
    assert lease.process_start("not-a-pid") is None


def test_zombie_is_not_alive(procs):
    proc = procs()
    os.kill(proc.pid, 9)
    # Not reaped yet: a zombie until proc.wait() in the fixture.
    for dummy in range(2000):
        with open("/proc/%d/stat" % proc.pid, encoding="ascii") as fh:
            if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        time.sleep(0.005)
    else:
        pytest.fail("the killed child never became a zombie")
    assert lease.process_start(proc.pid) is None


def test_local_identity_matches_proc():
    ident = lease.local_identity()
    assert ident == {"host": socket.gethostname(), "boot_id": _boot_id(), "pidns": _pidns()}


def test_describe_names_run_controller_user():
    ctl = controller(4321, host="ctl-07", user="carol")
    text = lease.describe(record("run-x", ctl))
    assert "run-x" in text and "ctl-07" in text and "4321" in text and "carol" in text
    assert "unknown" in lease.describe(None)


# ===========================================================================
# BUGS FOUND (tests below fail until the lead's fix; see H6's report)
# ===========================================================================

def test_break_star_breaks_a_lease_left_without_holder_record(lp):
    # A run killed between mkdir and writing holder.json leaves an empty lease directory. The
    # operator's documented break (sglang_lease_break='*', which LeaseBusy itself suggests for it)
    # must clear it; nothing else can.
    plant(lp, None)
    got = acquire(lp, "run-new", break_lease="*")
    assert got["acquired"] is True
    assert holder_of(lp)["owner"] == "run-new"


def test_lease_dir_without_holder_record_does_not_block_forever(lp):
    # The same leftover, long after any run could still be writing its holder record.
    plant(lp, None)
    old = time.time() - 10 * lease.DEFAULT_TTL
    os.utime(str(lp), (old, old))
    got = acquire(lp, "run-new", now_fn=time.time, timeout=0)
    assert got["acquired"] is True and got["took_over_reason"]


def test_takeover_is_reported_by_the_run_that_ends_up_holding_the_lease(lp, monkeypatch):
    # Run A removes the expired lease of run-old; run B, arriving in that instant, finds the path
    # free. Whoever ends up holding the lease must be told it took over from run-old, so that it
    # says so and continues from the journal; the other run must not hold it.
    old = plant(lp, record("run-old", controller(12345, boot="other"), expires_in=-100))
    real_rmtree = lease.shutil.rmtree
    outcome = {}

    def run_b():
        try:
            outcome["b"] = acquire(lp, "run-b", timeout=0)
        except lease.LeaseBusy as exc:
            outcome["b"] = exc

    def rmtree(path, *args, **kwargs):
        if "b" not in outcome:
            run_b()
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(lease.shutil, "rmtree", rmtree)
    try:
        outcome["a"] = acquire(lp, "run-a", timeout=0)
    except lease.LeaseBusy as exc:
        outcome["a"] = exc
    if "b" not in outcome:
        run_b()
    holder = holder_of(lp)["owner"]
    assert holder in ("run-a", "run-b")
    mine, other = (outcome["a"], outcome["b"]) if holder == "run-a" else (outcome["b"], outcome["a"])
    assert isinstance(other, lease.LeaseBusy)
    assert mine["took_over"] == old, "the takeover of run-old was reported to nobody: %r" % (outcome,)


def test_legacy_record_with_controller_string(lp):
    # node_lock wrote controller=$GPUFLEET_CONTROLLER, a plain string (e.g. the AWX host name).
    held = plant(lp, _legacy(lease.DEFAULT_TTL + 5, "awx-01"))
    assert lease.inspect(str(lp), "run-new", now=NOW)["state"] == lease.EXPIRED
    got = acquire(lp, "run-new")
    assert got["took_over"] == held
    assert "run-legacy" in lease.describe(held)


def test_parent_made_by_a_concurrent_run_is_fine(lp, monkeypatch):
    # Two first runs on a fresh node: the other run makes the lock directory between this run's
    # isdir() check and its makedirs(); acquire must not fail with FileExistsError.
    lp.parent.mkdir(parents=True)
    real_isdir = lease.os.path.isdir
    parent = str(lp.parent)
    monkeypatch.setattr(lease.os.path, "isdir", lambda p: False if str(p).rstrip("/") == parent else real_isdir(p))
    got = acquire(lp, "run-a")
    assert got["acquired"] is True
