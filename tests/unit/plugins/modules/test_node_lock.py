"""Unit tests for the node_lock module (the node lease of module_utils/redeploy/lease.py, which test_lease.py covers
function by function): ``main()`` run in-process the ansible-core way (``patch_module_args``,
``exit_json``/``fail_json`` patched to raise): take, wait, take over, release, break, inspect, check mode,
the argument errors and the generation counter.

No process is started: the "other run" that holds a lease is a holder.json written by the test (or a
thread of this process that releases it); a dead controller is a forked child that exited and was reaped.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from redeploy_testlib import mode_of, run_module  # noqa: E402 - after this directory is put on sys.path

from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import lease as lease_mod
from ansible_collections.gpufleet.sglang.plugins.modules import node_lock

CONTROLLER = {"host": "ctl-1", "pid": 4242, "starttime": 1, "boot_id": "another-machine", "pidns": "pid:[1]", "user": "ops"}


@pytest.fixture
def run(monkeypatch):
    def _run(args, check=False):
        return run_module(node_lock, args, monkeypatch, check=check)
    return _run


def held_by(path, owner="other-run", expires_in=300.0, **fields):
    """A lease taken by another run (a record written the way lease.acquire writes it)."""
    now = time.time()
    record = lease_mod.new_record(owner, controller=fields.pop("controller", CONTROLLER), ttl=300, now=now)
    record.update(expires_at=now + expires_in, **fields)
    os.makedirs(str(path), 0o700)
    (path / lease_mod.HOLDER).write_text(json.dumps(record))
    return record


def dead_pid():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


# ---------------------------------------------------------------------------
# state=acquired
# ---------------------------------------------------------------------------

def test_acquire_a_free_lease_makes_the_parent_and_records_the_holder(run, tmp_path):
    lock = tmp_path / "a" / "b" / "lease"
    before = time.time()
    res = run({"path": str(lock), "owner": "run-1", "controller": CONTROLLER, "ttl": 120})
    assert res["failed"] is False and res["changed"] is True and res["acquired"] is True
    assert res["state"] == {"state": "free", "reason": "not held"} and "took_over" not in res
    holder = json.loads((lock / lease_mod.HOLDER).read_text())
    assert holder == res["holder"]
    assert holder["owner"] == "run-1" and holder["controller"] == CONTROLLER and holder["ttl"] == 120
    assert before <= holder["taken_at"] <= time.time() and holder["expires_at"] == holder["taken_at"] + 120
    assert holder["node"] == lease_mod.local_identity()
    assert mode_of(lock) == oct(0o700) and mode_of(lock / lease_mod.HOLDER) == oct(0o600)
    assert res["generation"] == 1 and (tmp_path / "a" / "b" / "lease.generation").read_text() == "1\n"
    assert res["warnings"] == []


def test_acquire_again_by_the_same_owner_renews_and_is_no_change(run, tmp_path):
    lock = tmp_path / "lease"
    first = run({"path": str(lock), "owner": "run-1"})
    again = run({"path": str(lock), "owner": "run-1", "ttl": 600})
    assert again["failed"] is False and again["changed"] is False and again["acquired"] is True
    assert again["state"]["state"] == "mine" and again["generation"] == first["generation"] == 1
    assert again["holder"]["taken_at"] == first["holder"]["taken_at"] and again["holder"]["ttl"] == 600
    assert again["holder"]["expires_at"] >= first["holder"]["expires_at"]


def test_a_live_holder_fails_at_once_naming_it_and_how_to_break_it(run, tmp_path):
    lock = tmp_path / "lease"
    held = held_by(lock, owner="run-A")
    res = run({"path": str(lock), "owner": "run-B"})
    assert res["failed"] is True and res["acquired"] is False and res["changed"] is False
    assert res["msg"].startswith("another redeploy holds the node lease %s: run run-A from controller ctl-1 PID 4242 (user ops)"
                                 % lock)
    assert "sglang_lock_timeout=0" in res["msg"] and "-e sglang_lease_break=run-A" in res["msg"]
    assert res["holder"] == held and res["state"]["state"] == "live"
    assert lease_mod.read_holder(str(lock)) == held                       # untouched


def test_a_live_holder_is_waited_for_up_to_the_timeout(run, tmp_path):
    lock = tmp_path / "lease"
    held_by(lock, owner="run-A")
    res = run({"path": str(lock), "owner": "run-B", "timeout": 0.6})
    assert res["failed"] is True and "run run-A" in res["msg"] and "sglang_lock_timeout=0.6" in res["msg"]
    assert res["waited"] >= 0.6                                           # it waited the whole timeout, then gave up
    assert lease_mod.read_holder(str(lock))["owner"] == "run-A"


def test_a_holder_that_releases_while_we_wait(run, tmp_path, monkeypatch):
    lock = tmp_path / "lease"
    held_by(lock, owner="run-A")
    judged = []
    seen_busy = threading.Event()
    real_judge = lease_mod.judge

    def judge(*args, **kwargs):
        out = real_judge(*args, **kwargs)
        judged.append(out[0])
        if len(judged) >= 2:          # the module's inspection, then the acquire loop found it held
            seen_busy.set()
        return out

    monkeypatch.setattr(lease_mod, "judge", judge)
    releaser = threading.Thread(target=lambda: seen_busy.wait(30) and lease_mod.release(str(lock), "run-A"))
    releaser.start()
    try:
        res = run({"path": str(lock), "owner": "run-B", "timeout": 60})
    finally:
        seen_busy.set()
        releaser.join()
    assert judged[:2] == ["live", "live"]
    assert res["failed"] is False and res["acquired"] is True and res["changed"] is True
    assert res["state"]["state"] == "live" and res["waited"] > 0
    assert res["holder"]["owner"] == "run-B" and "took_over" not in res
    assert lease_mod.read_holder(str(lock))["owner"] == "run-B"


def test_an_expired_lease_is_taken_over_and_said_loudly(run, tmp_path):
    lock = tmp_path / "lease"
    stale = held_by(lock, owner="dead-run", expires_in=-100)
    (tmp_path / "lease.generation").write_text("7\n")
    res = run({"path": str(lock), "owner": "run-B"})
    assert res["failed"] is False and res["acquired"] is True and res["changed"] is True
    assert res["took_over"] == stale and res["state"]["state"] == "expired"
    assert len(res["warnings"]) == 1
    assert res["warnings"][0].startswith("took over the node lease %s from run dead-run from controller ctl-1 PID 4242" % lock)
    assert "its deadline passed" in res["warnings"][0]
    assert lease_mod.read_holder(str(lock))["owner"] == "run-B" and res["generation"] == 8
    assert sorted(os.listdir(str(tmp_path))) == ["lease", "lease.generation"]      # no guard or stale copy left


def test_a_lease_whose_controller_on_this_machine_is_gone_is_taken_over_before_its_deadline(run, tmp_path):
    lock = tmp_path / "lease"
    local = lease_mod.local_identity()
    gone = dict(CONTROLLER, pid=dead_pid(), boot_id=local["boot_id"], pidns=local["pidns"])
    held_by(lock, owner="killed-run", controller=gone, expires_in=3000)
    res = run({"path": str(lock), "owner": "run-B"})
    assert res["acquired"] is True and res["took_over"]["owner"] == "killed-run" and res["state"]["state"] == "dead"
    assert "its controller (PID %d on ctl-1) is gone" % gone["pid"] in res["warnings"][0]


def test_a_controller_on_another_machine_is_judged_by_the_deadline_only(run, tmp_path):
    lock = tmp_path / "lease"
    held_by(lock, owner="remote-run", controller=dict(CONTROLLER, pid=dead_pid()), expires_in=3000)
    res = run({"path": str(lock), "owner": "run-B"})
    assert res["failed"] is True and res["state"]["state"] == "live"


# ---------------------------------------------------------------------------
# Check mode and state=inspected
# ---------------------------------------------------------------------------

def test_check_mode_and_inspected_only_look(run, tmp_path):
    lock = tmp_path / "locks" / "lease"
    free = run({"path": str(lock), "owner": "run-1"}, check=True)
    # Check mode says what the task would change (it would take the free lease) and changes nothing.
    assert free["changed"] is True and free["acquired"] is False and free["holder"] == {} and free["generation"] == 0
    assert free["state"]["state"] == "free" and not (tmp_path / "locks").exists()
    held = held_by(lock, owner="run-A")
    looks = [({"path": str(lock), "owner": "run-1"}, True), ({"path": str(lock), "owner": "run-1", "state": "inspected"}, False)]
    for args, check in looks:
        busy = run(args, check=check)
        assert busy["failed"] is False and busy["changed"] is False and busy["acquired"] is False
        assert busy["holder"] == held and busy["state"]["state"] == "live"
    mine = run({"path": str(lock), "owner": "run-A"}, check=True)
    assert mine["acquired"] is True and mine["state"]["state"] == "mine"
    rel = run({"path": str(lock), "owner": "run-A", "state": "released"}, check=True)
    assert rel["changed"] is True and lock.is_dir()                       # it would release it; check mode releases nothing
    assert lease_mod.read_holder(str(lock)) == held


def test_check_mode_reports_an_expired_lease_without_taking_it(run, tmp_path):
    lock = tmp_path / "lease"
    held_by(lock, owner="dead-run", expires_in=-10)
    res = run({"path": str(lock), "owner": "run-1"}, check=True)
    assert res["acquired"] is False and res["state"]["state"] == "expired" and "its deadline passed" in res["state"]["reason"]
    assert lease_mod.read_holder(str(lock))["owner"] == "dead-run"


# ---------------------------------------------------------------------------
# state=released and state=broken
# ---------------------------------------------------------------------------

def test_release_by_the_owner(run, tmp_path):
    lock = tmp_path / "lease"
    run({"path": str(lock), "owner": "run-1"})
    res = run({"path": str(lock), "owner": "run-1", "state": "released"})
    assert res["failed"] is False and res["changed"] is True and res["acquired"] is False
    assert res["holder"]["owner"] == "run-1" and res["generation"] == 1
    assert sorted(os.listdir(str(tmp_path))) == ["lease.generation"]       # kept across releases


def test_release_of_a_free_lease_is_a_no_op(run, tmp_path):
    res = run({"path": str(tmp_path / "lease"), "owner": "run-1", "state": "released"})
    assert res == {"changed": False, "acquired": False, "holder": {}, "state": {"state": "free", "reason": "not held"},
                   "waited": 0.0, "generation": 0, "failed": False, "warnings": []}


def test_release_by_another_owner_is_refused_unless_forced(run, tmp_path):
    lock = tmp_path / "lease"
    held = held_by(lock, owner="run-A")
    res = run({"path": str(lock), "owner": "run-B", "state": "released"})
    assert res["failed"] is True and res["holder"] == held and lock.is_dir()
    assert res["msg"].startswith("the node lease %s is held by run run-A" % lock)
    assert "not by run run-B" in res["msg"] and res["msg"].endswith("(set force=true to remove it anyway)")
    forced = run({"path": str(lock), "owner": "run-B", "state": "released", "force": True})
    assert forced["failed"] is False and forced["changed"] is True and forced["holder"] == held
    assert not lock.exists() and forced["warnings"] == []


def test_break_removes_whatever_holds_it_and_names_the_holder(run, tmp_path):
    lock = tmp_path / "lease"
    held = held_by(lock, owner="run-A")
    res = run({"path": str(lock), "owner": "operator", "state": "broken"})
    assert res["failed"] is False and res["changed"] is True and res["holder"] == held and not lock.exists()
    assert len(res["warnings"]) == 1 and res["warnings"][0].startswith("broke the node lease %s of run run-A" % lock)
    again = run({"path": str(lock), "owner": "operator", "state": "broken"})
    assert again["changed"] is False and again["warnings"] == []
    # A lease left without holder record (a run killed between mkdir and the write) can be broken too.
    lock.mkdir()
    empty = run({"path": str(lock), "owner": "operator", "state": "broken"})
    assert empty["changed"] is True and empty["holder"] == {} and not lock.exists()


# ---------------------------------------------------------------------------
# Arguments and the generation counter
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("args, text", [
    ({}, "owner"),
    ({"owner": "x", "state": "open"}, "state"),
    ({"owner": "x", "ttl": 29}, "ttl must be at least 30 seconds, got 29"),
    ({"owner": "x", "timeout": -1}, "timeout must be 0 or more seconds, got -1"),
])
def test_argument_errors_touch_nothing(run, tmp_path, args, text):
    res = run(dict({"path": str(tmp_path / "lease")}, **args))
    assert res["failed"] is True and text in res["msg"]
    assert os.listdir(str(tmp_path)) == []


def test_generation_counts_every_acquisition_across_releases_and_takeovers(run, tmp_path):
    lock = tmp_path / "lease"
    counter = tmp_path / "lease.generation"
    assert run({"path": str(lock), "owner": "run-1"})["generation"] == 1
    assert run({"path": str(lock), "owner": "run-1"})["generation"] == 1          # the same owner again
    busy = run({"path": str(lock), "owner": "run-2"})
    assert busy["failed"] is True and busy["generation"] == 1
    assert run({"path": str(lock), "owner": "run-1", "state": "released"})["generation"] == 1
    assert run({"path": str(lock), "owner": "run-2"})["generation"] == 2
    run({"path": str(lock), "owner": "run-2", "state": "released"})
    held_by(lock, owner="dead-run", expires_in=-5)
    assert run({"path": str(lock), "owner": "run-3"})["generation"] == 3
    assert counter.read_text() == "3\n" and mode_of(counter) == oct(0o644)
    run({"path": str(lock), "owner": "run-3", "state": "released"})
    counter.write_text("garbage")
    assert run({"path": str(lock), "owner": "run-4"})["generation"] == 1


# ---------------------------------------------------------------------------
# Bugs found by these tests (they fail until the fix in plugins/modules/node_lock.py)
# ---------------------------------------------------------------------------

def test_bug_check_mode_predicts_the_change(run, tmp_path):
    """check_mode support is ``full``, so ``changed`` is the prediction (the old module, and its tests, did so): a free
    or expired lease would be taken, the run's own lease would be released. The new main() exits with changed=False
    before it looks at what the state would do."""
    lock = tmp_path / "lease"
    assert run({"path": str(lock), "owner": "run-1"}, check=True)["changed"] is True
    run({"path": str(lock), "owner": "run-1"})
    assert run({"path": str(lock), "owner": "run-1", "state": "released"}, check=True)["changed"] is True
    assert run({"path": str(lock), "owner": "run-1"}, check=True)["changed"] is False          # already held: no change
    assert lock.is_dir()
