"""The `gpusim` control CLI: init, status, driver, lose/recover, set."""
from __future__ import annotations

import json
import os
import re

import pytest


def test_init_layout_and_identity(sim):
    st = sim.status()
    assert st["model"] == "H200" and st["driver"] == "loaded"
    assert st["driver_version"] == "535.261.03"
    assert len(st["gpus"]) == 8
    uuids = [g["uuid"] for g in st["gpus"]]
    assert len(set(uuids)) == 8
    assert all(re.fullmatch(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", u) for u in uuids)
    assert st["gpus"][0]["pci_bus_id"] == "00000000:18:00.0"
    assert len({g["pci_bus_id"] for g in st["gpus"]}) == 8
    assert len({g["serial"] for g in st["gpus"]}) == 8
    for name in ["nvidia%d" % i for i in range(8)] + ["nvidiactl", "nvidia-uvm"]:
        assert (sim.root / "dev" / name).exists(), name
    assert (sim.root / "node.json").exists() and (sim.root / "holds").is_dir()
    assert json.loads((sim.root / "node.json").read_text())["gpus"][0]["total_mib"] == 143771


def test_two_nodes_differ_and_reinit_is_stable(sim, make_sim):
    other = make_sim("other")
    a = [g["uuid"] for g in sim.status()["gpus"]]
    b = [g["uuid"] for g in other.status()["gpus"]]
    assert not set(a) & set(b)
    sim.init()
    assert [g["uuid"] for g in sim.status()["gpus"]] == a


def test_init_wipes_holds_and_warns(sim):
    pid = sim.hold("--gpus", "0", "--mib", "1000")
    sim.gpusim("orphan", "--gpu", "1", "--mib", "10")
    sim.gpusim("driver", "unload")
    sim.gpusim("lose", "--gpu", "2")
    r = sim.gpusim("init", "--gpus", "4", "--model", "H100")
    assert r.rc == 0
    assert "warning" in r.err and str(pid) in r.err
    st = sim.status()
    assert st["holds"] == [] and st["driver"] == "loaded" and len(st["gpus"]) == 4
    assert not any(g["lost"] for g in st["gpus"])
    assert not (sim.root / "dev" / "nvidia5").exists()
    assert sim.query_gpu("memory.used") == [["1"]] * 4


@pytest.mark.parametrize("args,needle", [
    (["--gpus", "2", "--model", "A100"], "invalid choice"),
    (["--gpus", "-1", "--model", "H200"], ">= 0"),
    (["--gpus", "2", "--model", "H200", "--reserved-mib", "200000"], "below the total"),
])
def test_init_validation(bare_sim, args, needle):
    r = bare_sim.gpusim("init", *args)
    assert r.rc == 2 and needle in r.err


def test_commands_need_root_env(bare_sim):
    r = bare_sim.gpusim("status", env={"GPUSIM_ROOT": ""})
    assert r.rc == 1 and "GPUSIM_ROOT" in r.err
    r = bare_sim.gpusim("init", "--gpus", "1", "--model", "H200", env={"GPUSIM_ROOT": ""})
    assert r.rc == 1 and "GPUSIM_ROOT" in r.err


def test_status_on_uninitialised_root(bare_sim):
    r = bare_sim.gpusim("status")
    assert r.rc == 1 and "gpusim init" in r.err


def test_status_reports_holds_with_liveness(sim):
    pid = sim.hold("--gpus", "0,1", "--mib", "2000", "--name", "svc", "--release-delay", "3")
    sim.gpusim("orphan", "--gpu", "2", "--mib", "5")
    st = sim.status()
    by_state = {h["state"]: h for h in st["holds"]}
    h = by_state["alive"]
    assert h["pid"] == pid and h["alive"] and h["counted"] and h["listed"]
    assert h["gpus"] == [0, 1] and h["mib"] == 2000 and h["name"] == "svc"
    assert h["release_delay"] == 3.0 and h["exited_at"] is None and h["display_pid"] == pid
    o = by_state["orphan"]
    assert o["pid"] is None and o["counted"] and not o["listed"] and not o["alive"]
    g = st["gpus"]
    assert (g[0]["used_mib"], g[2]["used_mib"], g[3]["used_mib"]) == (2001, 6, 1)
    for x in g:
        assert x["total_mib"] == x["reserved_mib"] + x["used_mib"] + x["free_mib"]


@pytest.mark.parametrize("state,expected", [("unload", "unloaded"), ("nolib", "nolib"),
                                            ("mismatch", "mismatch"), ("load", "loaded")])
def test_driver_states(sim, state, expected):
    assert sim.gpusim("driver", state).rc == 0
    assert sim.status()["driver"] == expected


def test_driver_bad_state(sim):
    assert sim.gpusim("driver", "explode").rc == 2


def test_lose_and_recover_status(sim):
    assert sim.gpusim("lose", "--gpu", "5").rc == 0
    assert sim.status()["gpus"][5]["lost"] is True
    assert sim.gpusim("recover", "--gpu", "5").rc == 0
    assert sim.status()["gpus"][5]["lost"] is False
    r = sim.gpusim("lose", "--gpu", "9")
    assert r.rc == 2 and "no GPU" in r.err


def test_set_attr(sim):
    assert sim.gpusim("set", "--gpu", "1", "--attr", "persistence_mode", "--value",
                      "Disabled").rc == 0
    r = sim.smi("--query-gpu=persistence_mode", "--format=csv,noheader", "-i", "1")
    assert r.out == "Disabled\n"
    assert "Off" in [l for l in sim.smi("-i", "1").lines if "NVIDIA H200" in l][0]
    assert sim.gpusim("set", "--gpu", "1", "--attr", "idle_used_mib", "--value", "4").rc == 0
    assert sim.used(1) == 4
    assert sim.gpusim("set", "--gpu", "1", "--attr", "idle_used_mib", "--value", "x").rc == 2


def test_hold_json_output(sim):
    r = sim.gpusim("hold", "--gpus", "0", "--mib", "1", "--json")
    assert r.rc == 0
    info = json.loads(r.out)
    sim.track_hold(info["pid"])
    assert set(info) >= {"pid", "watcher_pid", "id", "keepers"} and info["ok"] is True
    assert os.path.exists("/proc/%d" % info["pid"])


def test_python_m_gpusim(sim):
    import subprocess
    import sys

    from gpusim_testlib import SIM_PY

    env = dict(sim.env, PYTHONPATH=str(SIM_PY))
    p = subprocess.run([sys.executable, "-m", "gpusim", "status"], env=env,
                       capture_output=True, timeout=30, check=False)
    assert p.returncode == 0 and json.loads(p.stdout)["model"] == "H200"
