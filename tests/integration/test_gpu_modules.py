"""gpu_drain and gpu_memory_assert through Ansible against the GPU simulator.

Each test gets its own simulated 8 x H200 node (``sim_node``); every process
a test starts is tracked by ``procs`` and SIGKILLed by PID at teardown.
"""
from __future__ import annotations

import json
import os
import re
import time

import pytest

pytestmark = pytest.mark.slow


def _by_pid(entries):
    return dict((e["pid"], e) for e in entries)


# ---------------------------------------------------------------------------
# gpu_drain
# ---------------------------------------------------------------------------

def test_drain_server_tree_signals_the_root_and_spares_decoys(sim_node, procs, run_module):
    tree = sim_node.spawn_tree(ranks=((0, 1), (2, 3)), mib=20000,
                               argv_extra=["-m", "sglang.launch_server", "--api-key", "s3cr3t", "--tp-size", "2"])
    decoy_sleep = sim_node.spawn_decoy()
    decoy_sglang = sim_node.spawn_decoy(argv_extra=["sglang.launch_server", "--port", "30001"])
    assert sim_node.used(0) > 20000

    res = run_module("gpu_drain", {"term_timeout": 20, "kill_timeout": 10}, sim_node.env)

    assert not res["failed"], res.get("msg")
    assert res["changed"] is True
    assert res["backend"] == "nvidia-smi"
    signalled = _by_pid(res["signalled"])
    root = signalled[tree["root"]]
    assert root["role"] == "root"
    assert root["signals"] == ["SIGTERM"]
    assert "process-group leader" in root["how"]
    assert "s3cr3t" not in json.dumps(res)
    assert "--api-key ********" in root["cmdline"]
    for child in tree["children"]:
        assert signalled[child]["role"] == "holder"
        assert signalled[child]["root"] == tree["root"]
        assert signalled[child]["signals"] == []          # the root stopped them itself
        assert signalled[child]["seconds_to_exit"] is not None
        assert signalled[child]["name"].startswith("sglang::schedul")
    assert sorted(signalled[tree["children"][0]]["gpus"]) == [0, 1]
    assert res["survivors"] == []
    assert res["remaining"] == []
    assert not procs.alive(tree["root"])
    assert all(not procs.alive(c) for c in tree["children"])
    # Python processes that are not on the GPUs survive every drain.
    assert procs.alive(decoy_sleep) and procs.alive(decoy_sglang)
    assert decoy_sleep not in signalled and decoy_sglang not in signalled
    assert all(g["used_mib"] <= 16 for g in res["gpus"])

    check = run_module("gpu_memory_assert", {"timeout": 10}, sim_node.env)
    assert not check["failed"], check.get("msg")
    assert check["polls"] == 1


def test_drain_escalates_to_sigkill_for_a_sigterm_ignoring_holder(sim_node, procs, run_module):
    pid = sim_node.hold([4], 30000, name="stubborn", ignore_sigterm=True)
    other = sim_node.hold([5], 1000, name="polite")

    res = run_module("gpu_drain", {"gpus": [4, 5], "term_timeout": 1.0, "kill_timeout": 5}, sim_node.env)

    assert not res["failed"], res.get("msg")
    signalled = _by_pid(res["signalled"])
    assert signalled[pid]["signals"] == ["SIGTERM", "SIGKILL"]
    assert 1.0 <= signalled[pid]["seconds_to_exit"] < 3.0
    assert signalled[other]["signals"] == ["SIGTERM"]
    assert signalled[other]["seconds_to_exit"] < 1.0
    assert not procs.alive(pid) and not procs.alive(other)
    # One grace period, not one per process.
    assert res["elapsed"] < 4.0


def test_drain_forked_children_that_inherited_the_device_are_stopped(sim_node, procs, run_module):
    pid = sim_node.hold([6], 8000, name="trainer", children=2)
    status = sim_node.status()
    keepers = [k["pid"] for h in status["holds"] if h["pid"] == pid for k in h["keepers"]]
    assert len(keepers) == 2

    res = run_module("gpu_drain", {"gpus": [6], "term_timeout": 5, "kill_timeout": 5}, sim_node.env)

    assert not res["failed"], res.get("msg")
    signalled = _by_pid(res["signalled"])
    assert signalled[pid]["role"] == "root"
    for keeper in keepers:
        assert signalled[keeper]["role"] == "descendant"
        assert not procs.alive(keeper)
    assert procs.wait_until(lambda: sim_node.used(6) <= 16, timeout=5)


def test_drain_gpu_subset_leaves_other_gpus_alone(sim_node, procs, run_module):
    target = sim_node.hold([0, 1], 10000, name="target")
    bystander = sim_node.hold([5], 10000, name="bystander")

    res = run_module("gpu_drain", {"gpus": ["0", sim_node.status()["gpus"][1]["uuid"]], "term_timeout": 5},
                     sim_node.env)

    assert not res["failed"], res.get("msg")
    assert [e["pid"] for e in res["signalled"]] == [target]
    assert not procs.alive(target)
    assert procs.alive(bystander)
    assert [g["index"] for g in res["gpus"]] == [0, 1]

    only_targets = run_module("gpu_memory_assert", {"gpus": [0, 1], "timeout": 5}, sim_node.env)
    assert not only_targets["failed"], only_targets.get("msg")
    everything = run_module("gpu_memory_assert", {"timeout": 0}, sim_node.env)
    assert everything["failed"]
    assert everything["msg"].startswith("GPU 5: 10001 MiB held by PID %d (bystander" % bystander)
    assert [d["gpu"] for d in everything["diagnosis"]] == [5]


def test_drain_check_mode_signals_nothing_and_reports_the_plan(sim_node, procs, run_module):
    tree = sim_node.spawn_tree(ranks=((0,), (1,)), mib=5000)

    res = run_module("gpu_drain", {"gpus": [0, 1]}, sim_node.env, check=True, diff=True)

    assert not res["failed"], res.get("msg")
    assert res["changed"] is True
    signalled = _by_pid(res["signalled"])
    assert signalled[tree["root"]]["signals"] == ["SIGTERM"]
    assert all(signalled[c]["signals"] == [] for c in tree["children"])
    assert procs.alive(tree["root"]) and all(procs.alive(c) for c in tree["children"])
    assert "PID %d" % tree["children"][0] in res["diff"]["before"]
    assert res["diff"]["after"] == ""
    assert sim_node.used(0) > 5000


def test_drain_nothing_to_do_is_not_a_change(sim_node, procs, run_module):
    decoy = sim_node.spawn_decoy()
    res = run_module("gpu_drain", {}, sim_node.env)
    assert not res["failed"], res.get("msg")
    assert res["changed"] is False
    assert res["signalled"] == [] and res["holders"] == []
    assert procs.alive(decoy)


def test_drain_match_narrows_and_explicit_pids_add_roots(sim_node, procs, run_module):
    server = sim_node.spawn_tree(ranks=((2,),), mib=3000, argv_extra=["--serve", "sglang.launch_server"])
    other = sim_node.hold([3], 3000, name="jupyter-kernel")
    recorded = sim_node.spawn_decoy(argv_extra=["sglang.launch_server", "--recorded"])
    unrelated = sim_node.spawn_decoy(argv_extra=["--not-a-server"])

    res = run_module("gpu_drain", {"match": ["sglang"], "pids": [recorded, unrelated], "term_timeout": 5},
                     sim_node.env)

    assert not res["failed"], res.get("msg")
    signalled = _by_pid(res["signalled"])
    assert server["root"] in signalled and recorded in signalled
    assert signalled[recorded]["how"] == "explicit in pids"
    assert other not in signalled and unrelated not in signalled
    skipped = _by_pid(res["not_signalled"])
    assert "match" in skipped[other]["reason"]
    assert "match" in skipped[unrelated]["reason"]
    assert procs.alive(other) and procs.alive(unrelated)
    assert not procs.alive(recorded) and not procs.alive(server["root"])


def test_drain_never_signals_pids_from_another_namespace(sim_node, procs, run_module):
    real_pid = sim_node.hold([7], 2000, name="containerized", foreign_ns=True)
    listed = [e for e in json.loads(json.dumps(sim_node.status()["holds"])) if e["pid"] == real_pid][0]["display_pid"]
    assert listed != real_pid

    res = run_module("gpu_drain", {"gpus": [7]}, sim_node.env)

    assert not res["failed"], res.get("msg")
    assert res["changed"] is False
    skipped = _by_pid(res["not_signalled"])
    assert "another PID namespace" in skipped[listed]["reason"]
    assert "host PID namespace" in skipped[listed]["reason"]
    assert procs.alive(real_pid)
    assert any("not signalled" in w for w in res.get("warnings", []))


def test_drain_refuses_init_and_its_own_ancestors_as_explicit_roots(sim_node, procs, run_module):
    res = run_module("gpu_drain", {"pids": [1, os.getpid()], "term_timeout": 1}, sim_node.env)
    assert not res["failed"], res.get("msg")
    assert res["changed"] is False
    skipped = _by_pid(res["not_signalled"])
    assert "init" in skipped[1]["reason"]
    assert "ancestor" in skipped[os.getpid()]["reason"]


def test_drain_fails_clearly_when_the_driver_is_unloaded(sim_node, procs, run_module):
    sim_node.gpusim("driver", "unload")
    res = run_module("gpu_drain", {}, sim_node.env)
    assert res["failed"]
    assert "driver is not loaded" in res["msg"]
    assert res["driver"]["rc"] == 9


def test_drain_reset_orphaned(sim_node, procs, run_module):
    sim_node.gpusim("orphan", "--gpu", 3, "--mib", 512)

    planned = run_module("gpu_drain", {"gpus": [3], "reset_orphaned": True}, sim_node.env, check=True)
    assert not planned["failed"], planned.get("msg")
    assert planned["reset"][0]["result"] == "would reset"
    assert planned["changed"] is True
    assert sim_node.used(3) > 500

    res = run_module("gpu_drain", {"gpus": [3], "reset_orphaned": True}, sim_node.env)
    assert not res["failed"], res.get("msg")
    assert res["changed"] is True
    entry = res["reset"][0]
    assert entry["gpu"] == 3 and entry["result"] == "reset"
    assert entry["used_mib_before"] == 513 and entry["used_mib_after"] <= 16
    assert (sim_node.root and os.path.exists(os.path.join(sim_node.root, "resets.log")))
    assert sim_node.used(3) <= 16


def test_drain_reset_orphaned_waits_for_release_and_respects_preconditions(sim_node, procs, run_module):
    slow = sim_node.hold([2], 4000, name="slow", release_delay=1.5)
    sim_node.gpusim("orphan", "--gpu", 4, "--mib", 256)
    busy = sim_node.hold([6], 1000, name="busy")

    res = run_module("gpu_drain", {"gpus": [2, 4], "reset_orphaned": True, "release_timeout": 10}, sim_node.env)

    assert not res["failed"], res.get("msg")
    assert not procs.alive(slow)
    resets = dict((e["gpu"], e) for e in res["reset"])
    # GPU 2's memory came back by itself: no reset.
    assert 2 not in resets
    # GPU 4 is orphaned, but a compute process runs on GPU 6: nvidia-smi forbids the reset.
    assert resets[4]["result"] == "skipped"
    assert "PIDs %d" % busy in resets[4]["reason"]
    assert procs.alive(busy)
    assert sim_node.used(4) > 200


# ---------------------------------------------------------------------------
# gpu_memory_assert
# ---------------------------------------------------------------------------

def test_assert_waits_for_slow_release(sim_node, procs, run_module):
    pid = sim_node.hold([1], 50000, name="releasing", release_delay=2.0)
    os.kill(pid, 9)
    assert procs.wait_until(lambda: not procs.alive(pid), timeout=5)

    res = run_module("gpu_memory_assert", {"gpus": [1], "timeout": 15, "sleep": 0.2}, sim_node.env)

    assert not res["failed"], res.get("msg")
    assert res["polls"] > 1
    assert 1.0 < res["elapsed"] < 8.0
    assert res["gpus"][0]["used_mib"] <= 16 and res["gpus"][0]["ok"] is True


def test_assert_stuck_memory_times_out_with_a_diagnosis(sim_node, procs, run_module):
    pid = sim_node.hold([2], 60000, name="stuckproc", stuck=True)
    drain = run_module("gpu_drain", {"gpus": [2], "term_timeout": 2}, sim_node.env)
    assert not drain["failed"], drain.get("msg")
    assert not procs.alive(pid)

    start = time.monotonic()
    res = run_module("gpu_memory_assert", {"gpus": [2], "timeout": 1.5, "sleep": 0.3}, sim_node.env)

    assert res["failed"]
    assert 1.5 <= res["elapsed"] < 4.0
    assert res["polls"] >= 3
    diag = res["diagnosis"][0]
    assert diag["gpu"] == 2 and diag["kind"] == "held"
    assert diag["processes"][0]["pid"] == pid and diag["processes"][0]["visible"] is False
    assert res["msg"].startswith("GPU 2: 60001 MiB held by PID %d (stuckproc, not visible in /proc" % pid)
    assert re.search(r"\) after (1\.[5-9]|2|3) s$", res["msg"]), res["msg"]
    assert "stale" in diag["hint"]
    assert time.monotonic() - start < 10


def test_assert_orphaned_memory_message(sim_node, procs, run_module):
    sim_node.gpusim("orphan", "--gpu", 3, "--mib", 512)

    res = run_module("gpu_memory_assert", {"timeout": 1, "sleep": 0.5}, sim_node.env)

    assert res["failed"]
    assert res["msg"] == "GPU 3: 513 MiB held by no process after 1 s (orphaned context); a GPU reset is needed"
    diag = res["diagnosis"][0]
    assert diag["kind"] == "orphaned"
    assert "nvidia-smi --gpu-reset -i 3" in diag["hint"]
    assert "as root" in diag["hint"]
    assert [g["ok"] for g in res["gpus"]] == [True, True, True, False, True, True, True, True]


def test_assert_memory_kept_by_unlisted_children(sim_node, procs, run_module):
    pid = sim_node.hold([5], 7000, name="parent", children=1)
    keeper = [k["pid"] for h in sim_node.status()["holds"] if h["pid"] == pid for k in h["keepers"]][0]
    os.kill(pid, 9)
    assert procs.wait_until(lambda: not procs.alive(pid), timeout=5)

    res = run_module("gpu_memory_assert", {"gpus": [5], "timeout": 0}, sim_node.env)

    assert res["failed"]
    diag = res["diagnosis"][0]
    assert diag["kind"] == "kept_open"
    assert diag["device_users"] == [keeper]
    assert "PID %d" % keeper in res["msg"]


@pytest.mark.parametrize("state, rc, words", [
    ("unload", 9, "driver is not loaded"),
    ("nolib", 12, "libnvidia-ml.so cannot be loaded"),
    ("mismatch", 18, "versions differ"),
])
def test_assert_driver_failure_is_immediate(sim_node, procs, run_module, state, rc, words):
    sim_node.gpusim("driver", state)

    res = run_module("gpu_memory_assert", {"timeout": 60}, sim_node.env)

    assert res["failed"]
    assert res["polls"] == 1
    assert res["elapsed"] < 5
    assert words in res["msg"]
    assert res["diagnosis"][0]["kind"] == "driver"
    assert res["driver"]["rc"] == rc


def test_assert_lost_gpu(sim_node, procs, run_module):
    sim_node.gpusim("lose", "--gpu", 3)

    res = run_module("gpu_memory_assert", {"timeout": 0}, sim_node.env)
    assert res["failed"]
    diag = res["diagnosis"][0]
    assert diag["kind"] == "lost"
    assert "00000000:5D:00.0" in res["msg"] and "Unknown Error" in res["msg"]

    healthy = run_module("gpu_memory_assert", {"gpus": [0, 1], "timeout": 0}, sim_node.env)
    assert not healthy["failed"], healthy.get("msg")


def test_assert_placeholder_is_unknown_not_zero(sim_node, procs, run_module):
    sim_node.gpusim("override", "--gpu", 2, "--field", "memory.used", "--value", "[N/A]")

    res = run_module("gpu_memory_assert", {"gpus": [2], "timeout": 0}, sim_node.env)

    assert res["failed"]
    assert res["gpus"][0]["used_mib"] is None
    assert res["gpus"][0]["unknown_fields"] == {"memory.used": "[N/A]"}
    assert res["diagnosis"][0]["kind"] == "unknown"
    assert "[N/A]" in res["msg"]


def test_assert_allocated_judges_only_target_gpus(sim_node, procs, run_module):
    sim_node.hold([0, 1], 20000, name="server")

    ok = run_module("gpu_memory_assert", {"gpus": [0, 1], "state": "allocated", "min_used_mib": 10000,
                                          "require_processes": True, "timeout": 0}, sim_node.env, check=True)
    assert not ok["failed"], ok.get("msg")
    assert ok["changed"] is False

    bad = run_module("gpu_memory_assert", {"gpus": [0, 2], "state": "allocated", "min_used_mib": 10000,
                                           "timeout": 0.6, "sleep": 0.2, "msg": "server did not load"}, sim_node.env)
    assert bad["failed"]
    assert bad["msg"] == "server did not load"
    assert [d["gpu"] for d in bad["diagnosis"]] == [2]
    assert "expected at least 10000 MiB" in bad["diagnosis"][0]["summary"]


def test_assert_rejects_unknown_gpu_selector(sim_node, procs, run_module):
    res = run_module("gpu_memory_assert", {"gpus": [9], "timeout": 30}, sim_node.env)
    assert res["failed"]
    assert "no GPU matches 9" in res["msg"]
    assert res["elapsed"] < 5
