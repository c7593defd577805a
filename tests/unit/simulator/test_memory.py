"""Memory arithmetic (§1.2, §3.1), out-of-memory, orphans and the Python API
(simulator/README.md "Node state")."""
from __future__ import annotations

import os
import signal
import time

import pytest

from gpusim import node as gnode
from gpusim import procfs
from gpusim.node import DriverError, GpuLost, Node, OutOfMemory
from gpusim_testlib import wait_for


def _check_sum(sim):
    for idx, used, free, reserved, total in sim.query_gpu():
        assert int(total) == int(reserved) + int(used) + int(free), (idx, used, free, reserved)


def test_idle_defaults(sim):
    rows = sim.query_gpu()
    assert len(rows) == 8
    for idx, used, free, reserved, total in rows:
        assert 0 <= int(used) <= 4                          # §3.1: 0-4 MiB idle on H200
        assert int(reserved) > 0 and int(total) == 143771
        assert int(free) != int(total) - int(used)          # free is not total - used (§1.2)
    _check_sum(sim)


def test_arithmetic_with_holds_and_custom_reserved(make_sim):
    s = make_sim("n", 2, "H100")
    assert s.gpusim("init", "--gpus", "2", "--model", "H100", "--reserved-mib", "326",
                    "--idle-used-mib", "0").rc == 0
    assert s.query_gpu(ids="0") == [["0", "0", str(81559 - 326), "326", "81559"]]
    s.hold("--gpus", "0,1", "--mib", "29089")
    s.gpusim("orphan", "--gpu", "1", "--mib", "100")
    assert s.query_gpu() == [["0", "29089", str(81559 - 326 - 29089), "326", "81559"],
                             ["1", "29189", str(81559 - 326 - 29189), "326", "81559"]]
    _check_sum(s)


def test_out_of_memory_holds_nothing(sim):
    free0 = int(sim.query_gpu("memory.free", ids="0")[0][0])
    sim.hold("--gpus", "1", "--mib", "100000")
    before = sim.query_gpu()
    r = sim.gpusim("hold", "--gpus", "0,1", "--mib", str(free0 - 10))  # fits 0, not 1
    assert r.rc == 2
    assert r.out == ""
    assert "CUDA out of memory" in r.err and "GPU 1" in r.err and "Tried to allocate" in r.err
    assert sim.query_gpu() == before                                 # nothing held anywhere
    assert len(sim.apps()) == 1


def test_exact_fit_then_one_more_mib(sim):
    free0 = int(sim.query_gpu("memory.free", ids="0")[0][0])
    sim.hold("--gpus", "0", "--mib", str(free0))
    assert sim.query_gpu("memory.free", ids="0") == [["0"]]
    r = sim.gpusim("orphan", "--gpu", "0", "--mib", "1")
    assert r.rc == 2 and "CUDA out of memory" in r.err
    _check_sum(sim)


def test_orphan_counted_not_listed_reset_only(sim):
    r = sim.gpusim("orphan", "--gpu", "3", "--mib", "512")
    assert r.rc == 0 and r.out.startswith("o-")
    assert sim.used(3) == 513
    assert sim.apps() == []
    assert [h["state"] for h in sim.status()["holds"]] == ["orphan"]
    time.sleep(0.2)
    assert sim.used(3) == 513                                         # never frees by itself
    assert sim.smi("-r", "-i", "3").rc == 0
    assert sim.used(3) == 1


# ----------------------------------------------------------------- Python API
def test_api_from_env(sim, monkeypatch):
    monkeypatch.setenv("GPUSIM_ROOT", str(sim.root))
    n = Node.from_env()
    assert n.root == str(sim.root)
    monkeypatch.delenv("GPUSIM_ROOT")
    with pytest.raises(DriverError, match="GPUSIM_ROOT"):
        Node.from_env()


def test_api_gpus_have_used_and_free(sim):
    gpus = sim.node().gpus()
    assert [g["index"] for g in gpus] == list(range(8))
    for g in gpus:
        assert g["total_mib"] == g["reserved_mib"] + g["used_mib"] + g["free_mib"]
        assert g["name"] == "NVIDIA H200" and g["uuid"].startswith("GPU-")


def test_api_hold_mark_exited_release(sim):
    pid = sim.hold("--gpus", "0", "--mib", "10")
    n = sim.node()
    hid = n.hold(pid, gpus=[1, 2], mib=2000, name="sglang::scheduler_TP1", release_delay=30)
    assert sim.used(1) == 2001 and sim.used(2) == 2001
    assert ["sglang::scheduler_TP1"] * 2 == [r[3] for r in sim.apps() if r[0] != sim.bus(0)]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not procfs.is_alive(pid), 5, what="death")
    # the watcher stamps its own holds (it reaps the holder, a moment after the death);
    # stamp again explicitly: the first stamp wins
    wait_for(lambda: [h for h in n.holds() if h["id"] == hid][0]["exited_at"] is not None, 5, what="watcher's stamp")
    first = [h for h in n.holds() if h["id"] == hid][0]["exited_at"]
    assert n.mark_exited(pid, at=time.time() + 100) == 0
    assert [h for h in n.holds() if h["id"] == hid][0]["exited_at"] == first
    assert sim.used(1) == 2001                                         # release delay 30 s
    assert n.release(hid) is True and n.release(hid) is False
    assert sim.used(1) == 1


def test_api_mark_exited_stamps_precisely(sim):
    pid = sim.hold("--gpus", "0", "--mib", "10")
    n = sim.node()
    hid = n.hold(pid, gpus=[5], mib=100, release_delay=0.8)
    watcher = n.holds()[0]["watcher_pid"]
    os.kill(watcher, signal.SIGSTOP)                 # nobody reaps: we stamp ourselves
    try:
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not procfs.is_alive(pid), 5, what="death")
        t = time.time() - 0.5
        assert n.mark_exited(pid, at=t) == 2         # both holds of the PID
        h = [h for h in n.holds() if h["id"] == hid][0]
        assert h["exited_at"] == t and h["state"] == "releasing"
        wait_for(lambda: sim.used(5) == 1, 3, what="release 0.8 s after the stamp")
    finally:
        os.kill(watcher, signal.SIGCONT)


def test_api_out_of_memory_attributes(sim):
    pid = sim.hold("--gpus", "0", "--mib", "10")
    n = sim.node()
    with pytest.raises(OutOfMemory) as ei:
        n.hold(pid, gpus=[3], mib=10 ** 6)
    e = ei.value
    assert (e.gpu, e.requested_mib, e.free_mib) == (3, 10 ** 6, 143240)
    assert "CUDA out of memory" in str(e)
    assert sim.used(3) == 1


def test_api_hold_rejects_dead_pid_and_bad_args(sim):
    n = sim.node()
    with pytest.raises(ProcessLookupError):
        n.hold(4194303, gpus=[0], mib=1)
    pid = sim.hold("--gpus", "0", "--mib", "10")
    with pytest.raises(ValueError):
        n.hold(pid, gpus=[9], mib=1)
    with pytest.raises(ValueError):
        n.hold(pid, gpus=[0], mib=0)
    with pytest.raises(ValueError):
        n.hold(pid, gpus=[], mib=1)


def test_api_default_name_is_exe(sim):
    pid = sim.hold("--gpus", "0", "--mib", "10", "--name", "x")
    n = sim.node()
    n.hold(pid, gpus=[7], mib=1)
    assert sim.apps(ids="7")[0][3] == os.readlink("/proc/%d/exe" % pid)


def test_api_driver_and_lost_errors(sim):
    pid = sim.hold("--gpus", "0", "--mib", "10")
    n = sim.node()
    sim.gpusim("lose", "--gpu", "2")
    with pytest.raises(GpuLost):
        n.hold(pid, gpus=[2], mib=1)
    sim.gpusim("driver", "unload")
    with pytest.raises(DriverError):
        n.hold(pid, gpus=[1], mib=1)


def test_recycled_pid_is_not_alive(sim):
    """Liveness checks the start time: a hold whose PID was reused by another
    process must not count (design.md counting rule)."""
    pid = sim.hold("--gpus", "0", "--mib", "10")
    real = procfs.starttime(pid)
    assert procfs.is_alive(pid, real)
    assert not procfs.is_alive(pid, real + 1)
    fake = {"pid": pid, "starttime": real + 1, "release_delay": 0, "exited_at": None}
    assert gnode.evaluate(fake, time.time())[0] == "gone"


@pytest.mark.parametrize("spec,expected", [
    (None, list(range(8))), ("", []), ("0,1", [0, 1]), ("3, 1", [3, 1]),
    ("0,9,1", [0]),       # CUDA stops at the first invalid entry
    ("2,2,3", [2]),       # ... and at a repeated one
    ("-1", []),
])
def test_resolve_visible_indices(sim, spec, expected):
    assert sim.node().resolve_visible(spec) == expected


def test_resolve_visible_uuids(sim):
    n = sim.node()
    gpus = n.gpus()
    assert n.resolve_visible(gpus[4]["uuid"] + "," + gpus[1]["uuid"]) == [4, 1]
    assert n.resolve_visible(gpus[6]["uuid"][:15]) == [6]   # a unique prefix is enough
    assert n.resolve_visible("GPU-zzzz") == []
