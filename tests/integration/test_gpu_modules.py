"""gpu_drain and gpu_memory_assert through Ansible against the GPU simulator.

Each test gets its own simulated 8 x H200 node (``sim_node``); every process
a test starts is tracked by ``procs`` and SIGKILLed by PID at teardown.
Timing assertions use the modules' own ``elapsed`` (monotonic, inside the
module), never the wall time of ``ansible``, which depends on machine load.
"""
from __future__ import annotations

import json
import os
import re
import sys

import pytest

pytestmark = pytest.mark.slow

DRAIN = "gpufleet.sglang.gpu_drain"
ASSERT = "gpufleet.sglang.gpu_memory_assert"


def _by_pid(entries):
    return dict((e["pid"], e) for e in entries)


# The modules never read GPUSIM_ROOT: like the simulator's inventory (gpufleet_gpu_device_paths), every task
# names the simulated node's device files through device_paths.
_NODE = {}


@pytest.fixture(autouse=True)
def _device_paths(sim_node):
    _NODE["device_paths"] = [os.path.join(sim_node.root, "dev", "nvidia*")]
    yield
    _NODE.clear()


def _dev(args=None):
    args = dict(args or {})
    args.setdefault("device_paths", list(_NODE["device_paths"]))
    return args


def _task(module, args=None, **keywords):
    task = {"name": "%s %s" % (module.split(".")[-1], json.dumps(args or {})), module: _dev(args)}
    task.update(keywords)
    return task


def _gpusim(*args):
    return {"name": "gpusim " + " ".join(map(str, args)),
            "ansible.builtin.command": {"argv": ["gpusim"] + [str(a) for a in args]}}


# ---------------------------------------------------------------------------
# gpu_drain
# ---------------------------------------------------------------------------

def test_drain_server_tree_signals_the_root_and_spares_decoys(sim_node, procs, run_play):
    tree = sim_node.spawn_tree(ranks=((0, 1), (2, 3)), mib=20000,
                               argv_extra=["-m", "sglang.launch_server", "--api-key", "s3cr3t", "--tp-size", "2"])
    decoy_sleep = sim_node.spawn_decoy()
    decoy_sglang = sim_node.spawn_decoy(argv_extra=["sglang.launch_server", "--port", "30001"])
    assert sim_node.used(0) > 20000

    res, check = run_play([_task(DRAIN, {"term_timeout": 20, "kill_timeout": 10}),
                           _task(ASSERT, {"timeout": 10})], sim_node.env)

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
    assert res["elapsed"] < 20
    assert not procs.alive(tree["root"])
    assert all(not procs.alive(c) for c in tree["children"])
    # Python processes that are not on the GPUs survive every drain.
    assert procs.alive(decoy_sleep) and procs.alive(decoy_sglang)
    assert decoy_sleep not in signalled and decoy_sglang not in signalled
    assert all(g["used_mib"] <= 16 for g in res["gpus"])

    assert not check["failed"], check.get("msg")
    assert check["polls"] == 1
    assert [g["ok"] for g in check["gpus"]] == [True] * 8


@pytest.mark.parametrize("version, signals", [("0.5.23", ["SIGTERM"]), ("0.5.10", ["SIGTERM"])])
def test_drain_fake_sglang_server(sim_node, procs, run_play, version, signals):
    """The simulator's SGLang: 0.5.23 drains, sends ShutdownReq and exits 0 (schedulers release
    their memory); 0.5.10 SIGKILLs its whole tree, whose memory lingers for 2 s."""
    server = sim_node.spawn_sglang(gpus=(2, 3), args=["--api-key", "t0ps3cret"], env={"SGLANG_SIM_VERSION": version})
    bystander = sim_node.spawn_sglang(gpus=(6,), env={"SGLANG_SIM_VERSION": version})
    assert sim_node.used(2) > 100000 and sim_node.used(3) > 100000

    res, check = run_play([_task(DRAIN, {"gpus": [2, 3], "match": ["sglang"], "term_timeout": 30}),
                           _task(ASSERT, {"gpus": [2, 3], "timeout": 30, "sleep": 0.2})], sim_node.env)

    assert not res["failed"], res.get("msg")
    root = res["signalled"][0]
    assert root["pid"] == server["pid"] and root["role"] == "root"
    assert root["signals"] == signals
    assert "sglang.launch_server" in root["cmdline"] and "t0ps3cret" not in json.dumps(res)
    schedulers = [e for e in res["signalled"] if e["role"] == "holder"]
    assert sorted(e["name"] for e in schedulers) == ["sglang::schedul", "sglang::schedul"]
    assert sorted(g for e in schedulers for g in e["gpus"]) == [2, 3]
    assert all(e["signals"] == [] for e in schedulers)        # the server stopped its own children
    assert res["survivors"] == []
    assert not procs.alive(server["pid"])
    assert not check["failed"], check.get("msg")
    # The other server, on GPU 6, is untouched.
    assert procs.alive(bystander["pid"]) and sim_node.used(6) > 100000


def test_drain_escalation_forked_children_and_gpu_subsets(sim_node, procs, run_play):
    stubborn = sim_node.hold([4], 30000, name="stubborn", ignore_sigterm=True)
    polite = sim_node.hold([5], 1000, name="polite")
    trainer = sim_node.hold([6], 8000, name="trainer", children=2)
    keepers = [k["pid"] for h in sim_node.status()["holds"] if h["pid"] == trainer for k in h["keepers"]]
    assert len(keepers) == 2
    bystander = sim_node.hold([7], 10000, name="bystander")
    uuid5 = sim_node.status()["gpus"][5]["uuid"]

    res, subset, everything = run_play([
        _task(DRAIN, {"gpus": [4, uuid5, "6"], "term_timeout": 1.0, "kill_timeout": 5}),
        _task(ASSERT, {"gpus": [4, 5, 6], "timeout": 10, "sleep": 0.2}),
        _task(ASSERT, {"timeout": 0}, ignore_errors=True),
    ], sim_node.env)

    assert not res["failed"], res.get("msg")
    signalled = _by_pid(res["signalled"])
    # A SIGTERM-ignoring holder is escalated to SIGKILL after term_timeout.
    assert signalled[stubborn]["signals"] == ["SIGTERM", "SIGKILL"]
    assert 1.0 <= signalled[stubborn]["seconds_to_exit"] < 2.5
    assert signalled[polite]["signals"] == ["SIGTERM"]          # gone before the escalation
    # Forked children that inherited the device files (not listed by nvidia-smi) go with their root.
    assert signalled[trainer]["role"] == "root"
    for keeper in keepers:
        assert signalled[keeper]["role"] == "descendant"
        assert not procs.alive(keeper)
    assert not procs.alive(stubborn) and not procs.alive(polite) and not procs.alive(trainer)
    # A holder on a GPU outside the targets survives.
    assert bystander not in signalled
    assert procs.alive(bystander)
    assert [g["index"] for g in res["gpus"]] == [4, 5, 6]

    assert not subset["failed"], subset.get("msg")
    assert everything["failed"]
    assert everything["msg"].startswith("GPU 7: 10001 MiB held by PID %d (bystander" % bystander)
    assert [d["gpu"] for d in everything["diagnosis"]] == [7]


def test_drain_check_mode_signals_nothing_and_reports_the_plan(sim_node, procs, run_module):
    tree = sim_node.spawn_tree(ranks=((0,), (1,)), mib=5000)

    res = run_module("gpu_drain", _dev({"gpus": [0, 1]}), sim_node.env, check=True, diff=True)

    assert not res["failed"], res.get("msg")
    assert res["changed"] is True
    signalled = _by_pid(res["signalled"])
    assert signalled[tree["root"]]["signals"] == ["SIGTERM"]
    assert all(signalled[c]["signals"] == [] for c in tree["children"])
    assert procs.alive(tree["root"]) and all(procs.alive(c) for c in tree["children"])
    assert "PID %d" % tree["children"][0] in res["diff"]["before"]
    assert res["diff"]["after"] == ""
    assert sim_node.used(0) > 5000


def test_drain_selection_rules(sim_node, procs, run_play):
    """Nothing to do; match narrows; explicit pids add roots; PID 1, own ancestors and
    PIDs from another PID namespace are never signalled."""
    decoy = sim_node.spawn_decoy()
    server = sim_node.spawn_tree(ranks=((2,),), mib=3000, argv_extra=["--serve", "sglang.launch_server"])
    other = sim_node.hold([3], 3000, name="jupyter-kernel")
    recorded = sim_node.spawn_decoy(argv_extra=["sglang.launch_server", "--recorded"])
    unrelated = sim_node.spawn_decoy(argv_extra=["--not-a-server"])
    containerized = sim_node.hold([7], 2000, name="containerized", foreign_ns=True)
    listed = [h for h in sim_node.status()["holds"] if h["pid"] == containerized][0]["display_pid"]
    assert listed != containerized

    nothing, narrowed, namespaced, protected = run_play([
        _task(DRAIN, {"gpus": [0, 1]}),
        _task(DRAIN, {"gpus": [2, 3], "match": ["sglang"], "pids": [recorded, unrelated], "term_timeout": 5}),
        _task(DRAIN, {"gpus": [7]}),
        _task(DRAIN, {"gpus": [4], "pids": [1, os.getpid()], "term_timeout": 1}),
    ], sim_node.env)

    assert not nothing["failed"], nothing.get("msg")
    assert nothing["changed"] is False
    assert nothing["signalled"] == [] and nothing["holders"] == []

    assert not narrowed["failed"], narrowed.get("msg")
    signalled = _by_pid(narrowed["signalled"])
    assert server["root"] in signalled and recorded in signalled
    assert signalled[recorded]["how"] == "explicit in pids"
    assert other not in signalled and unrelated not in signalled
    spared = _by_pid(narrowed["not_signalled"])
    assert "match" in spared[other]["reason"]
    assert "match" in spared[unrelated]["reason"]
    assert procs.alive(other) and procs.alive(unrelated) and procs.alive(decoy)
    assert not procs.alive(recorded) and not procs.alive(server["root"])

    assert not namespaced["failed"], namespaced.get("msg")
    assert namespaced["changed"] is False
    spared = _by_pid(namespaced["not_signalled"])
    assert "another PID namespace" in spared[listed]["reason"]
    assert "host PID namespace" in spared[listed]["reason"]
    assert any("not signalled" in w for w in namespaced.get("warnings", []))
    assert procs.alive(containerized)

    assert not protected["failed"], protected.get("msg")
    assert protected["changed"] is False
    spared = _by_pid(protected["not_signalled"])
    assert "init" in spared[1]["reason"]
    assert "ancestor" in spared[os.getpid()]["reason"]


def test_drain_reset_orphaned(sim_node, procs, run_play):
    sim_node.gpusim("orphan", "--gpu", 3, "--mib", 512)

    planned, res, check = run_play([
        _task(DRAIN, {"gpus": [3], "reset_orphaned": True}, check_mode=True),
        _task(DRAIN, {"gpus": [3], "reset_orphaned": True}),
        _task(ASSERT, {"gpus": [3], "timeout": 0}),
    ], sim_node.env)

    assert not planned["failed"], planned.get("msg")
    assert planned["reset"][0]["result"] == "would reset"
    assert planned["changed"] is True

    assert not res["failed"], res.get("msg")
    assert res["changed"] is True
    entry = res["reset"][0]
    assert entry["gpu"] == 3 and entry["result"] == "reset"
    assert entry["used_mib_before"] == 513 and entry["used_mib_after"] <= 16
    with open(os.path.join(sim_node.root, "resets.log")) as fh:
        assert len(fh.read().splitlines()) == 1          # the check-mode run reset nothing
    assert not check["failed"], check.get("msg")


def test_drain_reset_orphaned_waits_for_release_and_respects_preconditions(sim_node, procs, run_module):
    slow = sim_node.hold([2], 4000, name="slow", release_delay=1.5)
    sim_node.gpusim("orphan", "--gpu", 4, "--mib", 256)
    busy = sim_node.hold([6], 1000, name="busy")

    res = run_module("gpu_drain", _dev({"gpus": [2, 4], "reset_orphaned": True, "release_timeout": 10}), sim_node.env)

    assert not res["failed"], res.get("msg")
    assert not procs.alive(slow)
    resets = dict((e["gpu"], e) for e in res["reset"])
    # GPU 2's memory came back by itself within release_timeout: no reset.
    assert 2 not in resets
    assert res["elapsed"] >= 1.4
    # GPU 4 is orphaned, but a compute process runs on GPU 6: nvidia-smi forbids the reset.
    assert resets[4]["result"] == "skipped"
    assert "PIDs %d" % busy in resets[4]["reason"]
    assert any("GPU 4" in w for w in res.get("warnings", []))
    assert procs.alive(busy)
    assert sim_node.used(4) > 200
    assert not os.path.exists(os.path.join(sim_node.root, "resets.log")) or \
        open(os.path.join(sim_node.root, "resets.log")).read() == ""


def test_drain_and_assert_fail_clearly_when_the_driver_is_broken(sim_node, procs, run_play):
    sim_node.gpusim("driver", "unload")

    results = run_play([
        _task(ASSERT, {"timeout": 60}, ignore_errors=True),
        _task(DRAIN, {}, ignore_errors=True),
        _gpusim("driver", "nolib"),
        _task(ASSERT, {"timeout": 60}, ignore_errors=True),
        _gpusim("driver", "mismatch"),
        _task(ASSERT, {"timeout": 60}, ignore_errors=True),
    ], sim_node.env)
    unloaded, drain, nolib, mismatch = results[0], results[1], results[3], results[5]

    for res, rc, words in ((unloaded, 9, "driver is not loaded"),
                           (nolib, 12, "libnvidia-ml.so cannot be loaded"),
                           (mismatch, 18, "versions differ")):
        assert res["failed"]
        assert res["polls"] == 1                          # no pointless polling
        assert res["elapsed"] < 10                        # timeout is 60
        assert words in res["msg"]
        assert res["diagnosis"][0]["kind"] == "driver"
        assert res["driver"]["rc"] == rc
    assert "couldn't communicate with the NVIDIA driver" in unloaded["msg"]
    assert drain["failed"]
    assert "driver is not loaded" in drain["msg"]
    assert drain["driver"]["rc"] == 9


# ---------------------------------------------------------------------------
# gpu_memory_assert
# ---------------------------------------------------------------------------

# Kills one PID (if it still has the given start time) as soon as an nvidia-smi query runs
# against the given GPUSIM_ROOT, i.e. right when gpu_memory_assert starts polling, however
# long Ansible took to start on a loaded machine.
KILL_ON_FIRST_QUERY = r"""
import os, signal, sys, time
root, pid, start = sys.argv[1], int(sys.argv[2]), sys.argv[3]
marker = ("GPUSIM_ROOT=%s" % root).encode()
def starttime(p):
    with open("/proc/%d/stat" % p, "rb") as fh:
        return fh.read().rsplit(b")", 1)[1].split()[19].decode()
deadline = time.monotonic() + 300
while time.monotonic() < deadline:
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % name, "rb") as fh:
                cmd = fh.read()
            if b"--query-gpu" not in cmd and b"--query-compute-apps" not in cmd:
                continue
            with open("/proc/%s/environ" % name, "rb") as fh:
                env = fh.read().split(b"\0")
        except OSError:
            continue
        if marker in env:
            time.sleep(0.2)
            if starttime(pid) == start:
                os.kill(pid, signal.SIGKILL)
            sys.exit(0)
    time.sleep(0.02)
"""


def test_assert_waits_for_slow_release(sim_node, procs, run_module):
    # Killed processes give their memory back later (nvidia-smi.md section 3.2): here 3 s after the kill,
    # which happens while the module polls.
    pid = sim_node.hold([1], 50000, name="releasing", release_delay=3)
    with open("/proc/%d/stat" % pid, "rb") as fh:
        start = fh.read().rsplit(b")", 1)[1].split()[19].decode()
    procs.spawn([sys.executable, "-c", KILL_ON_FIRST_QUERY, sim_node.root, str(pid), start])

    res = run_module("gpu_memory_assert", _dev({"gpus": [1], "timeout": 60, "sleep": 0.2}), sim_node.env)

    assert not procs.alive(pid)
    assert not res["failed"], res.get("msg")
    assert res["polls"] > 1
    assert res["elapsed"] > 2.5
    assert res["gpus"][0]["used_mib"] <= 16 and res["gpus"][0]["ok"] is True


def test_assert_stuck_memory_times_out_with_a_diagnosis(sim_node, procs, run_play):
    pid = sim_node.hold([2], 60000, name="stuckproc", stuck=True)

    drain, res = run_play([_task(DRAIN, {"gpus": [2], "term_timeout": 2}),
                           _task(ASSERT, {"gpus": [2], "timeout": 3, "sleep": 0.3}, ignore_errors=True)],
                          sim_node.env)

    assert not drain["failed"], drain.get("msg")
    assert not procs.alive(pid)
    assert res["failed"]
    assert res["elapsed"] >= 3
    assert res["polls"] >= 2
    diag = res["diagnosis"][0]
    assert diag["gpu"] == 2 and diag["kind"] == "held"
    assert diag["processes"][0]["pid"] == pid and diag["processes"][0]["visible"] is False
    assert res["msg"] == ("GPU 2: 60001 MiB held by PID %d (stuckproc, not visible in /proc: another PID namespace "
                          "or a stale listing) after 3 s" % pid)
    assert "stale" in diag["hint"]


def test_assert_orphaned_memory_and_memory_kept_by_unlisted_children(sim_node, procs, run_play):
    sim_node.gpusim("orphan", "--gpu", 3, "--mib", 512)
    parent = sim_node.hold([5], 7000, name="parent", children=1)
    keeper = [k["pid"] for h in sim_node.status()["holds"] if h["pid"] == parent for k in h["keepers"]][0]
    os.kill(parent, 9)
    assert procs.wait_until(lambda: not procs.alive(parent), timeout=5)

    res, kept = run_play([_task(ASSERT, {"gpus": [0, 1, 2, 3], "timeout": 1, "sleep": 0.5}, ignore_errors=True),
                          _task(ASSERT, {"gpus": [5], "timeout": 0}, ignore_errors=True)], sim_node.env)

    assert res["failed"]
    assert res["msg"] == "GPU 3: 513 MiB held by no process after 1 s (orphaned context); a GPU reset is needed"
    diag = res["diagnosis"][0]
    assert diag["kind"] == "orphaned"
    assert "nvidia-smi --gpu-reset -i 3" in diag["hint"]
    assert "as root" in diag["hint"]
    assert [g["ok"] for g in res["gpus"]] == [True, True, True, False]

    assert kept["failed"]
    diag = kept["diagnosis"][0]
    assert diag["kind"] == "kept_open"
    assert diag["device_users"] == [keeper]
    assert "PID %d" % keeper in kept["msg"]
    assert "at the only check" in kept["msg"]


def test_assert_lost_gpu_placeholder_and_selector(sim_node, procs, run_play):
    sim_node.gpusim("lose", "--gpu", 3)
    sim_node.gpusim("override", "--gpu", 2, "--field", "memory.used", "--value", "[N/A]")

    lost, healthy, unknown, bad_selector = run_play([
        _task(ASSERT, {"gpus": [3, 4], "timeout": 0}, ignore_errors=True),
        _task(ASSERT, {"gpus": [0, 1], "timeout": 0}),
        _task(ASSERT, {"gpus": [2], "timeout": 0}, ignore_errors=True),
        _task(ASSERT, {"gpus": [9], "timeout": 30}, ignore_errors=True),
    ], sim_node.env)

    assert lost["failed"]
    assert lost["diagnosis"][0]["kind"] == "lost"
    assert "00000000:5D:00.0" in lost["msg"] and "Unknown Error" in lost["msg"]
    assert [g["ok"] for g in lost["gpus"]] == [False, True]

    assert not healthy["failed"], healthy.get("msg")

    # A placeholder is unknown, never 0.
    assert unknown["failed"]
    assert unknown["gpus"][0]["used_mib"] is None
    assert unknown["gpus"][0]["unknown_fields"] == {"memory.used": "[N/A]"}
    assert unknown["diagnosis"][0]["kind"] == "unknown"
    assert "[N/A]" in unknown["msg"]

    assert bad_selector["failed"]
    assert re.search(r"no GPU matches 9", bad_selector["msg"])
    assert bad_selector["elapsed"] < 10                   # timeout is 30


def test_assert_allocated_judges_only_target_gpus(sim_node, procs, run_play):
    sim_node.hold([0, 1], 20000, name="server")

    ok, bad = run_play([
        _task(ASSERT, {"gpus": [0, 1], "state": "allocated", "min_used_mib": 10000, "require_processes": True,
                       "timeout": 0}, check_mode=True),
        _task(ASSERT, {"gpus": [0, 2], "state": "allocated", "min_used_mib": 10000, "timeout": 2, "sleep": 0.2,
                       "msg": "server did not load"}, ignore_errors=True),
    ], sim_node.env)

    assert not ok["failed"], ok.get("msg")
    assert ok["changed"] is False
    assert bad["failed"]
    assert bad["msg"] == "server did not load"
    assert [d["gpu"] for d in bad["diagnosis"]] == [2]
    assert "expected at least 10000 MiB" in bad["diagnosis"][0]["summary"]
    assert bad["polls"] >= 2
