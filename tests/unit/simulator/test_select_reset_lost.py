"""``-i`` selection forms (§1.1), ``--gpu-reset`` preconditions (§1.8) and a
lost GPU (§1.7), with the literal messages of §1.5."""
from __future__ import annotations

import os
import signal

import pytest

from gpusim import procfs
from gpusim_testlib import wait_for


def _gpu3(sim):
    return sim.status()["gpus"][3]


@pytest.mark.parametrize("form", ["index", "uuid", "uuid_upper", "bus8", "bus4", "bus_short",
                                  "bus_lower", "bus_nodomain", "serial"])
def test_id_forms(sim, form):
    g = _gpu3(sim)
    bus = g["pci_bus_id"]                          # 00000000:5D:00.0
    ident = {
        "index": "3",
        "uuid": g["uuid"],
        "uuid_upper": "GPU-" + g["uuid"][4:].upper(),
        "bus8": bus,
        "bus4": bus[4:],                           # 0000:5D:00.0 (legacy 4-digit domain)
        "bus_short": "0:5d:0.0",                   # §1.1 short form, compared numerically
        "bus_lower": bus.lower(),
        "bus_nodomain": "5D:00.0",
        "serial": g["serial"],
    }[form]
    for flag in (["-i", ident], ["--id=" + ident], ["--id", ident]):
        r = sim.smi("--query-gpu=index,pci.bus_id", "--format=csv,noheader", *flag)
        assert r.rc == 0, (flag, r)
        assert r.out == "3, %s\n" % bus


def test_id_comma_list_mixed_forms(sim):
    g = sim.status()["gpus"]
    r = sim.smi("--query-gpu=index", "--format=csv,noheader",
                "-i", "%s,1,%s" % (g[5]["uuid"], g[7]["pci_bus_id"]))
    assert r.rc == 0
    assert r.lines == ["5", "1", "7"]


@pytest.mark.parametrize("ident", ["8", "GPU-00000000-0000-0000-0000-000000000000",
                                   "00000000:99:00.0", "nonsense", "0,42"])
def test_unknown_id(sim, ident):
    r = sim.smi("--query-gpu=index", "--format=csv", "-i", ident)
    assert r.rc == 6
    assert r.out.startswith("No devices were found")


def test_id_restricts_compute_apps(sim):
    a = sim.hold("--gpus", "0,1", "--mib", "10")
    b = sim.hold("--gpus", "2", "--mib", "20")
    assert [r[1] for r in sim.apps(ids="1")] == [str(a)]
    assert [r[1] for r in sim.apps(ids="2")] == [str(b)]
    assert [r[1] for r in sim.apps(ids="1,2")] == [str(a), str(b)]
    assert [r[1] for r in sim.apps(ids="4")] == []


def test_id_restricts_list_and_table(sim):
    assert sim.smi("-L", "-i", "2").out.startswith("GPU 2: NVIDIA H200 (UUID: GPU-")
    out = sim.smi("-i", "6").out
    assert sim.bus(6) in out and sim.bus(5) not in out


# ------------------------------------------------------------------- reset
def test_reset_requires_root(sim):
    sim.gpusim("orphan", "--gpu", "0", "--mib", "64")
    r = sim.smi("--gpu-reset", "-i", "0", env={"GPUSIM_SMI_EUID": "1000"})
    assert r.rc == 4
    assert "Insufficient Permissions" in r.out and sim.bus(0) in r.out
    assert sim.used(0) == 65
    assert not (sim.root / "resets.log").exists()


def test_reset_uses_real_euid_without_knob(sim):
    sim.gpusim("orphan", "--gpu", "0", "--mib", "64")
    r = sim.smi("-r", "-i", "0")
    if os.geteuid() == 0:
        assert r.rc == 0 and sim.used(0) == 1
    else:
        assert r.rc == 4 and sim.used(0) == 65


def test_reset_refused_while_in_use(sim):
    root = {"GPUSIM_SMI_EUID": "0"}
    pid = sim.hold("--gpus", "0", "--mib", "100")
    sim.gpusim("orphan", "--gpu", "0", "--mib", "64")
    r = sim.smi("-r", "-i", "0", env=root)
    assert r.rc == 255
    assert r.lines[0] == "GPU %s is currently in use by another process." % sim.bus(0)
    assert sim.used(0) == 165                      # nothing was freed
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not procfs.is_alive(pid), 5, what="death")
    r = sim.smi("-r", "-i", "0", env=root)
    assert r.rc == 0, r
    assert r.out == "GPU %s was successfully reset.\n" % sim.bus(0)
    assert sim.used(0) == 1


def test_reset_success_frees_and_logs(sim):
    sim.gpusim("orphan", "--gpu", "2", "--mib", "300")
    pid = sim.hold("--gpus", "2,3", "--mib", "200", "--stuck")
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not procfs.is_alive(pid), 5, what="death")
    r = sim.smi("--gpu-reset", "-i", "2", env={"GPUSIM_SMI_EUID": "0"})
    assert r.rc == 0, r
    assert r.out == "GPU %s was successfully reset.\n" % sim.bus(2)
    assert sim.used(2) == 1
    assert sim.used(3) == 201                       # the stuck hold stays on GPU 3
    assert [r[0] for r in sim.apps()] == [sim.bus(3)]
    log = (sim.root / "resets.log").read_text().splitlines()
    assert len(log) == 1 and "gpu=2" in log[0] and "freed_mib=500" in log[0]


def test_reset_all_gpus(sim):
    sim.gpusim("orphan", "--gpu", "1", "--mib", "300")
    r = sim.smi("-r", env={"GPUSIM_SMI_EUID": "0"})
    assert r.rc == 0, r
    assert r.lines[:8] == ["GPU %s was successfully reset." % g["pci_bus_id"]
                           for g in sim.status()["gpus"]]
    assert r.lines[8] == "All done."
    assert sim.used(1) == 1


def test_reset_clears_reset_required(sim):
    assert sim.gpusim("set", "--gpu", "4", "--attr", "reset_required", "--value", "Yes").rc == 0
    q = "--query-gpu=reset_status.reset_required"
    assert sim.smi(q, "--format=csv,noheader", "-i", "4").out == "Yes\n"
    assert sim.smi("-r", "-i", "4", env={"GPUSIM_SMI_EUID": "0"}).rc == 0
    assert sim.smi(q, "--format=csv,noheader", "-i", "4").out == "No\n"


# -------------------------------------------------------------------- lost
def _handle_error(bus):
    # Driver 535 (525 and later, before 610): no space, a four-digit domain
    # (capture lost-525-nospace-form.txt); the text after Xid 79 is "Unknown Error".
    return "Unable to determine the device handle for GPU%s: Unknown Error" % bus[4:]


def test_lost_gpu_query(sim):
    assert sim.gpusim("lose", "--gpu", "1").rc == 0
    r = sim.smi("--query-gpu=index,memory.used", "--format=csv,noheader,nounits")
    assert r.rc == 15
    assert _handle_error(sim.bus(1)) in r.lines
    rows = [l for l in r.lines if not l.startswith("Unable")]
    assert [l.split(", ")[0] for l in rows] == ["0", "2", "3", "4", "5", "6", "7"]


def test_lost_gpu_healthy_selection_still_answers(sim):
    sim.gpusim("lose", "--gpu", "1")
    r = sim.smi("--query-gpu=index", "--format=csv,noheader", "-i", "0,2")
    assert r.rc == 0 and r.lines == ["0", "2"]
    r = sim.smi("--query-compute-apps=pid", "--format=csv,noheader", "-i", "0")
    assert r.rc == 0 and r.out == ""


def test_lost_gpu_on_stderr_knob(sim):
    sim.gpusim("lose", "--gpu", "1")
    r = sim.smi("--query-gpu=index", "--format=csv,noheader", "-i", "1,2",
                env={"GPUSIM_SMI_LOST_STREAM": "stderr"})
    assert r.rc == 15 and r.out == "2\n"
    assert r.err.strip() == _handle_error(sim.bus(1))


def test_lost_gpu_list_table_apps_reset(sim):
    sim.gpusim("lose", "--gpu", "3")
    r = sim.smi("-L")
    assert r.rc == 15 and _handle_error(sim.bus(3)) in r.lines and len(r.lines) == 8
    r = sim.smi()
    assert r.rc == 15 and r.lines == [_handle_error(sim.bus(3))]
    r = sim.smi("--query-compute-apps=pid", "--format=csv,noheader")
    assert r.rc == 15 and r.lines == [_handle_error(sim.bus(3))]
    r = sim.smi("-r", "-i", "3", env={"GPUSIM_SMI_EUID": "0"})
    assert r.rc == 15
    assert sim.gpusim("recover", "--gpu", "3").rc == 0
    assert sim.smi("-L").rc == 0


def test_lost_gpu_fields_mode_placeholders(sim):
    sim.gpusim("lose", "--gpu", "2", "--mode", "fields")
    r = sim.smi("--query-gpu=index,uuid,memory.used,memory.free,memory.total",
                "--format=csv,noheader,nounits", "-i", "2")
    assert r.rc == 0
    cols = r.out.rstrip("\n").split(", ")
    assert cols[0] == "2" and cols[1].startswith("GPU-")
    assert cols[2:] == ["[GPU is lost]"] * 3
    assert "ERR!" in sim.smi("-i", "2").out


def test_override_placeholder(sim):
    assert sim.gpusim("override", "--gpu", "0", "--field", "memory.free",
                      "--value", "[Insufficient Permissions]").rc == 0
    r = sim.smi("--query-gpu=memory.free,memory.used", "--format=csv,noheader", "-i", "0")
    assert r.out == "[Insufficient Permissions], 1 MiB\n"
    assert sim.gpusim("override", "--gpu", "0", "--field", "memory.free", "--clear").rc == 0
    r = sim.smi("--query-gpu=memory.free", "--format=csv,noheader", "-i", "0")
    assert r.out == "143240 MiB\n"
    r = sim.gpusim("override", "--gpu", "0", "--field", "nope", "--value", "x")
    assert r.rc == 2 and "unknown" in r.err
