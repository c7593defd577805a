"""Unit tests for the node_lock module: the pure helpers, and ``main()`` run in-process the
ansible-core way (``patch_module_args``, ``exit_json``/``fail_json`` patched to raise).

No process is started; the "other run" that holds a lock is a holder.json written by the test
or a thread of this process.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time

import pytest

from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

from ansible_collections.gpufleet.sglang.plugins.modules import node_lock


class ExitJson(Exception):
    pass


class FailJson(Exception):
    pass


@pytest.fixture
def run(monkeypatch):
    """``run(args, check=False)`` -> the result dict of ``node_lock.main()`` (``failed`` always set,
    ``warnings`` = what ``module.warn`` got)."""
    warnings = []

    def exit_json(self, **kwargs):
        kwargs.setdefault("changed", False)
        kwargs["failed"] = False
        raise ExitJson(kwargs)

    def fail_json(self, msg, **kwargs):
        kwargs.update(failed=True, msg=msg)
        raise FailJson(kwargs)

    monkeypatch.setattr(basic.AnsibleModule, "exit_json", exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)
    monkeypatch.setattr(basic.AnsibleModule, "warn", lambda self, msg, **kw: warnings.append(msg))

    def _run(args, check=False):
        args = dict(args)
        if check:
            args["_ansible_check_mode"] = True
        del warnings[:]
        with patch_module_args(args):
            with pytest.raises((ExitJson, FailJson)) as info:
                node_lock.main()
        result = info.value.args[0]
        result["warnings"] = list(warnings)
        return result

    return _run


def write_holder(path, **record):
    os.mkdir(str(path))
    data = dict(owner="other-run", host="gpu-01", pid=4242, since=time.time(), controller="")
    data.update(record)
    (path / node_lock.HOLDER).write_text(json.dumps(data))
    return data


# ---------------------------------------------------------------------------
# Pure helpers
# ---------------------------------------------------------------------------

def test_try_acquire_creates_the_lock_once(tmp_path):
    lock = tmp_path / "lock"
    record = {"owner": "a", "since": 1.0}
    assert node_lock.try_acquire(str(lock), record) is True
    assert node_lock.read_holder(str(lock)) == record
    assert sorted(os.listdir(str(lock))) == [node_lock.HOLDER]          # the .tmp file is gone
    assert oct(os.stat(str(lock)).st_mode & 0o777) == oct(0o700)
    assert node_lock.try_acquire(str(lock), {"owner": "b"}) is False
    assert node_lock.read_holder(str(lock))["owner"] == "a"


def test_try_acquire_missing_parent_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        node_lock.try_acquire(str(tmp_path / "no" / "lock"), {"owner": "a"})


def test_read_holder_missing_broken_and_non_object(tmp_path):
    lock = tmp_path / "lock"
    assert node_lock.read_holder(str(lock)) is None
    lock.mkdir()
    assert node_lock.read_holder(str(lock)) is None                      # taken, holder.json not yet written
    (lock / node_lock.HOLDER).write_text("{not json")
    assert node_lock.read_holder(str(lock)) is None
    (lock / node_lock.HOLDER).write_text("[1, 2]")
    assert node_lock.read_holder(str(lock)) is None
    (lock / node_lock.HOLDER).write_text('{"owner": "x"}')
    assert node_lock.read_holder(str(lock)) == {"owner": "x"}


def test_lock_age_from_since_from_mtime_and_when_gone(tmp_path):
    lock = tmp_path / "lock"
    assert node_lock.lock_age(str(lock), None) == 0.0                    # no lock at all
    lock.mkdir()
    assert 99 < node_lock.lock_age(str(lock), {"since": time.time() - 100}) < 110
    assert node_lock.lock_age(str(lock), {"since": time.time() + 100}) == 0.0   # clock skew: never negative
    old = time.time() - 500
    os.utime(str(lock), (old, old))
    assert 499 < node_lock.lock_age(str(lock), None) < 510               # no holder.json: the directory's age
    assert 499 < node_lock.lock_age(str(lock), {"owner": "x"}) < 510
    assert 499 < node_lock.lock_age(str(lock), {"since": "garbage"}) < 510


def test_describe_names_run_host_pid_controller_and_age():
    text = node_lock.describe({"owner": "run-7", "host": "gpu-01", "pid": 99, "since": time.time() - 42,
                               "controller": "awx-3"})
    assert text.startswith("run run-7 on gpu-01 (pid 99, controller awx-3) since 4")
    assert text.endswith(" s ago")
    plain = node_lock.describe({"owner": "run-8", "host": "gpu-02", "pid": 5, "since": time.time(), "controller": ""})
    assert plain.startswith("run run-8 on gpu-02 (pid 5) since ") and "controller" not in plain
    assert node_lock.describe({"owner": "run-9"}) == "run run-9 on ? (pid None)"
    assert node_lock.describe({"owner": "run-9", "since": None}) == "run run-9 on ? (pid None)"
    assert node_lock.describe(None) == "an unknown holder (no holder.json yet)"
    assert node_lock.describe({}) == "an unknown holder (no holder.json yet)"


def test_take_over_removes_only_the_stale_lock_it_saw(tmp_path):
    lock = tmp_path / "lock"
    seen = write_holder(lock, since=time.time() - 10000)
    # Someone else took it over and holds it fresh now: not removed.
    assert node_lock.take_over(str(lock), dict(seen, owner="someone-else"), 7200) is False
    assert lock.is_dir()
    # Not older than stale_after: not removed.
    assert node_lock.take_over(str(lock), seen, 20000) is False
    assert lock.is_dir()
    assert node_lock.take_over(str(lock), seen, 7200) is True
    assert not lock.exists()
    assert sorted(os.listdir(str(tmp_path))) == []                       # no guard, no renamed leftovers
    assert node_lock.take_over(str(lock), seen, 7200) is False           # gone already


def test_take_over_waits_for_a_running_takeover_and_clears_an_abandoned_guard(tmp_path):
    lock = tmp_path / "lock"
    seen = write_holder(lock, since=time.time() - 10000)
    guard = tmp_path / "lock.takeover"
    guard.mkdir()
    assert node_lock.take_over(str(lock), seen, 7200) is False           # another waiter is at it
    assert guard.is_dir() and lock.is_dir()
    old = time.time() - node_lock.GUARD_STALE_S - 5
    os.utime(str(guard), (old, old))
    assert node_lock.take_over(str(lock), seen, 7200) is False           # clears the abandoned guard ...
    assert not guard.exists()
    assert node_lock.take_over(str(lock), seen, 7200) is True            # ... so the next try works


def test_take_over_with_a_lock_without_holder_json(tmp_path):
    lock = tmp_path / "lock"
    lock.mkdir()
    old = time.time() - 10000
    os.utime(str(lock), (old, old))
    assert node_lock.take_over(str(lock), None, 7200) is True


def test_take_over_fails_cleanly_when_the_lock_cannot_be_moved(tmp_path, monkeypatch):
    lock = tmp_path / "lock"
    seen = write_holder(lock, since=time.time() - 10000)

    def refuse(src, dst):
        raise PermissionError(13, "Permission denied", src)

    monkeypatch.setattr(node_lock.os, "rename", refuse)
    assert node_lock.take_over(str(lock), seen, 7200) is False
    assert lock.is_dir() and not (tmp_path / "lock.takeover").exists()


def test_take_over_guard_cannot_be_created(tmp_path):
    assert node_lock.take_over(str(tmp_path / "missing" / "lock"), None, 1) is False


def test_two_takeovers_of_one_stale_lock_leave_exactly_one_fresh_holder(tmp_path):
    """The race the guard exists for: both waiters saw the same stale lock."""
    lock = tmp_path / "lock"
    seen = write_holder(lock, since=time.time() - 10000)
    assert node_lock.take_over(str(lock), seen, 7200) is True
    assert node_lock.try_acquire(str(lock), {"owner": "first", "since": time.time()}) is True
    # The second waiter, late: its view of the holder is the stale record; the fresh lock stays.
    assert node_lock.take_over(str(lock), seen, 7200) is False
    assert node_lock.read_holder(str(lock))["owner"] == "first"


# ---------------------------------------------------------------------------
# main()
# ---------------------------------------------------------------------------

def test_acquire_free_lock_creates_parent_and_records_the_holder(run, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUFLEET_CONTROLLER", "ctl-1")
    lock = tmp_path / "a" / "b" / "lock"
    res = run({"path": str(lock), "owner": "run-1"})
    assert res["failed"] is False and res["changed"] is True and res["acquired"] is True
    assert res["waited"] < 1.0
    assert "stale_takeover" not in res
    holder = json.loads((lock / node_lock.HOLDER).read_text())
    assert holder == res["holder"]
    assert holder["owner"] == "run-1" and holder["host"] == socket.gethostname()
    assert holder["controller"] == "ctl-1" and holder["pid"] == os.getppid()
    assert abs(holder["since"] - time.time()) < 30


def test_acquire_again_by_the_same_owner_is_a_no_op(run, tmp_path):
    lock = tmp_path / "lock"
    first = run({"path": str(lock), "owner": "run-1"})
    again = run({"path": str(lock), "owner": "run-1"})
    assert again["failed"] is False and again["changed"] is False and again["acquired"] is True
    assert again["holder"] == first["holder"]


def test_acquire_held_lock_fails_at_once_naming_the_holder(run, tmp_path):
    lock = tmp_path / "lock"
    held = write_holder(lock, owner="run-A", host="ctl-host", pid=777, since=time.time() - 30)
    res = run({"path": str(lock), "owner": "run-B"})
    assert res["failed"] is True and res["acquired"] is False
    assert res["msg"].startswith("Another redeploy holds the node lock %s: run run-A on ctl-host (pid 777) since 3" % lock)
    assert "timeout=0.0" in res["msg"] and "force=true" in res["msg"]
    assert res["holder"] == held
    assert res["waited"] < 1.0
    assert node_lock.read_holder(str(lock)) == held                      # untouched


def test_acquire_waits_then_times_out(run, tmp_path):
    lock = tmp_path / "lock"
    write_holder(lock, owner="run-A")
    began = time.monotonic()
    res = run({"path": str(lock), "owner": "run-B", "timeout": 0.6})
    assert res["failed"] is True and "run run-A" in res["msg"] and "timeout=0.6" in res["msg"]
    assert 0.55 <= res["waited"] and time.monotonic() - began < 10


def test_acquire_waits_for_the_holder_to_release(run, tmp_path):
    lock = tmp_path / "lock"
    write_holder(lock, owner="run-A")

    def release_later():
        time.sleep(0.4)
        os.unlink(str(lock / node_lock.HOLDER))
        os.rmdir(str(lock))

    releaser = threading.Thread(target=release_later)
    releaser.start()
    try:
        res = run({"path": str(lock), "owner": "run-B", "timeout": 30})
    finally:
        releaser.join()
    assert res["failed"] is False and res["acquired"] is True and res["changed"] is True
    assert 0.3 <= res["waited"] < 25
    assert node_lock.read_holder(str(lock))["owner"] == "run-B"


def test_acquire_takes_over_a_stale_lock_and_warns(run, tmp_path):
    lock = tmp_path / "lock"
    stale = write_holder(lock, owner="dead-run", since=time.time() - 8000)
    res = run({"path": str(lock), "owner": "run-B"})
    assert res["failed"] is False and res["acquired"] is True
    assert res["stale_takeover"] == stale
    assert len(res["warnings"]) == 1 and "Took over an abandoned lock" in res["warnings"][0]
    assert "run dead-run" in res["warnings"][0]
    assert node_lock.read_holder(str(lock))["owner"] == "run-B"
    assert sorted(os.listdir(str(tmp_path))) == ["lock", "lock.generation"]     # no guard or stale copy left


def test_acquire_stale_takeover_disabled(run, tmp_path):
    lock = tmp_path / "lock"
    write_holder(lock, owner="dead-run", since=time.time() - 8000)
    res = run({"path": str(lock), "owner": "run-B", "stale_after": 0})
    assert res["failed"] is True and "run dead-run" in res["msg"]


def test_acquire_stale_lock_that_cannot_be_removed_times_out_instead_of_spinning(run, tmp_path, monkeypatch):
    lock = tmp_path / "lock"
    write_holder(lock, owner="dead-run", since=time.time() - 8000)
    calls = []

    def refuse(src, dst):
        calls.append(src)
        raise PermissionError(13, "Permission denied", src)

    monkeypatch.setattr(node_lock.os, "rename", refuse)
    res = run({"path": str(lock), "owner": "run-B", "timeout": 0.5})
    assert res["failed"] is True and "run dead-run" in res["msg"]
    assert 1 <= len(calls) < 20                                            # retried with back-off, not a busy loop


def test_check_mode_inspects_only(run, tmp_path):
    lock = tmp_path / "lock"
    free = run({"path": str(lock), "owner": "run-1"}, check=True)
    assert free["changed"] is True and free["acquired"] is False and free["holder"] == {}
    assert not lock.exists()
    held = write_holder(lock, owner="run-A")
    busy = run({"path": str(lock), "owner": "run-1"}, check=True)
    assert busy["failed"] is False and busy["changed"] is False and busy["holder"] == held
    mine = run({"path": str(lock), "owner": "run-A"}, check=True)
    assert mine["changed"] is False and mine["acquired"] is True
    rel = run({"path": str(lock), "owner": "run-A", "state": "released"}, check=True)
    assert rel["changed"] is True and lock.is_dir()                        # would release, did not


def test_check_mode_reports_a_stale_lock_as_takeable(run, tmp_path):
    lock = tmp_path / "lock"
    write_holder(lock, owner="dead-run", since=time.time() - 8000)
    res = run({"path": str(lock), "owner": "run-1"}, check=True)
    assert res["changed"] is True and res["acquired"] is False
    assert node_lock.read_holder(str(lock))["owner"] == "dead-run"


def test_release_by_the_owner(run, tmp_path):
    lock = tmp_path / "lock"
    run({"path": str(lock), "owner": "run-1"})
    res = run({"path": str(lock), "owner": "run-1", "state": "released"})
    assert res["failed"] is False and res["changed"] is True and res["acquired"] is False
    assert res["holder"]["owner"] == "run-1"
    assert not lock.exists()


def test_release_of_a_free_lock_is_a_no_op(run, tmp_path):
    res = run({"path": str(tmp_path / "lock"), "owner": "run-1", "state": "released"})
    assert res == {"changed": False, "acquired": False, "holder": {}, "waited": 0.0, "generation": 0, "failed": False, "warnings": []}


def test_release_by_another_owner_is_refused_unless_forced(run, tmp_path):
    lock = tmp_path / "lock"
    held = write_holder(lock, owner="run-A")
    res = run({"path": str(lock), "owner": "run-B", "state": "released"})
    assert res["failed"] is True and res["holder"] == held
    assert res["msg"].startswith("Lock %s is held by run run-A on gpu-01 (pid 4242)" % lock)
    assert "not by run-B; set force=true" in res["msg"]
    assert lock.is_dir()
    forced = run({"path": str(lock), "owner": "run-B", "state": "released", "force": True})
    assert forced["failed"] is False and forced["changed"] is True and forced["holder"] == held
    assert not lock.exists()


def test_release_of_a_lock_without_holder_json(run, tmp_path):
    lock = tmp_path / "lock"
    lock.mkdir()
    res = run({"path": str(lock), "owner": "run-B", "state": "released"})
    assert res["changed"] is True and res["holder"] == {} and not lock.exists()


def test_argument_errors(run, tmp_path):
    res = run({"path": str(tmp_path / "lock")})
    assert res["failed"] is True and "owner" in res["msg"]
    res = run({"path": str(tmp_path / "lock"), "owner": "x", "state": "open"})
    assert res["failed"] is True and "state" in res["msg"]


def test_generation_counts_every_acquisition_across_releases(run, tmp_path):
    lock = tmp_path / "lock"
    counter = tmp_path / "lock.generation"
    assert node_lock.read_generation(str(lock)) == 0
    first = run({"path": str(lock), "owner": "run-1"})
    assert first["generation"] == 1 and counter.read_text() == "1\n"
    again = run({"path": str(lock), "owner": "run-1"})                   # the same owner again: not a new acquisition
    assert again["changed"] is False and again["generation"] == 1
    check = run({"path": str(lock), "owner": "run-2"}, check=True)
    assert check["generation"] == 1
    busy = run({"path": str(lock), "owner": "run-2"})
    assert busy["failed"] is True and busy["generation"] == 1
    released = run({"path": str(lock), "owner": "run-1", "state": "released"})
    assert released["generation"] == 1 and counter.exists() and not lock.exists()   # kept across releases
    second = run({"path": str(lock), "owner": "run-2"})
    assert second["generation"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lock", "lock.generation"]     # no temporary file left
    assert counter.read_text() == "2\n" and oct(counter.stat().st_mode & 0o777) == oct(0o644)


def test_generation_of_a_stale_takeover_and_of_a_broken_counter(run, tmp_path):
    lock = tmp_path / "lock"
    write_holder(lock, owner="dead-run", since=time.time() - 8000)
    (tmp_path / "lock.generation").write_text("7\n")
    res = run({"path": str(lock), "owner": "run-1"})
    assert res["stale_takeover"]["owner"] == "dead-run" and res["generation"] == 8
    run({"path": str(lock), "owner": "run-1", "state": "released"})
    (tmp_path / "lock.generation").write_text("garbage")
    assert node_lock.read_generation(str(lock)) == 0
    assert run({"path": str(lock), "owner": "run-2"})["generation"] == 1
