"""CDI for the simulated GPUs: ``gpusim cdi-spec`` and ``GPUSIM_CDI`` in ``Node.resolve_visible`` (issue 24).

The podman side (the spec in /var/run/cdi, ``--device nvidia.com/gpu=N``, host PIDs) is
tests/integration/test_sim_containers.py.
"""
from __future__ import annotations

import json
import os

import pytest

from gpusim import node as gnode


@pytest.fixture
def cdi_dev(tmp_path, monkeypatch):
    """A container's /dev with host GPUs 2 and 5 (as ``--device nvidia.com/gpu=2 --device nvidia.com/gpu=5``)."""
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia2", "nvidia5", "nvidiactl", "nvidia-uvm", "null"):
        (dev / name).write_text("")
    monkeypatch.setenv("GPUSIM_CDI", "1")
    monkeypatch.setenv("GPUSIM_CDI_DEV", str(dev))
    return dev


def test_cdi_visible_gpus_are_the_device_files_present_numbered_from_zero(sim, cdi_dev):
    node = gnode.Node(str(sim.root))
    uuids = {g["index"]: g["uuid"] for g in node.config()["gpus"]}
    assert node.resolve_visible(None) == [2, 5]
    assert node.resolve_visible("0,1") == [2, 5]
    assert node.resolve_visible("1") == [5]                  # CUDA ordinal 1 = the second GPU given
    assert node.resolve_visible("1,0") == [5, 2]
    assert node.resolve_visible("2") == []                   # invalid ordinal: none (CUDA stops there)
    assert node.resolve_visible("0,7,1") == [2]              # parsing stops at the first invalid entry
    assert node.resolve_visible(uuids[5]) == [5]
    assert node.resolve_visible(uuids[0]) == []              # a GPU the container was not given
    assert node.resolve_visible("") == []


def test_without_gpusim_cdi_every_gpu_is_visible_by_host_index(sim, cdi_dev, monkeypatch):
    monkeypatch.delenv("GPUSIM_CDI")
    node = gnode.Node(str(sim.root))
    assert node.resolve_visible(None) == list(range(8))
    assert node.resolve_visible("1") == [1]
    monkeypatch.setenv("GPUSIM_CDI", "0")
    assert node.resolve_visible("2,5") == [2, 5]


def test_cdi_spec_writes_the_device_files_and_a_spec_podman_reads(sim, tmp_path):
    out = tmp_path / "cdi" / "gpusim.json"
    dev = tmp_path / "devs"
    r = sim.gpusim("cdi-spec", "--out", str(out), "--dev-dir", str(dev), "--gpus", "4")
    assert r.rc == 0, r
    assert json.loads(r.out) == {"out": str(out), "kind": "nvidia.com/gpu", "devices": ["0", "1", "2", "3", "all"]}
    spec = json.loads(out.read_text())
    assert spec["cdiVersion"] == "0.3.0" and spec["kind"] == "nvidia.com/gpu"
    assert spec["containerEdits"] == {"env": ["GPUSIM_CDI=1"]}
    by_name = {d["name"]: d["containerEdits"]["mounts"] for d in spec["devices"]}
    assert by_name["2"] == [{"hostPath": str(dev / "nvidia2"), "containerPath": "/dev/nvidia2",
                             "options": ["ro", "nosuid", "nodev", "bind"]}]
    assert [m["containerPath"] for m in by_name["all"]] == ["/dev/nvidia%d" % i for i in range(4)]
    assert sorted(os.listdir(dev)) == ["nvidia0", "nvidia1", "nvidia2", "nvidia3"]
    assert all(os.path.isfile(dev / n) for n in os.listdir(dev))
    assert [n for n in os.listdir(out.parent) if n != "gpusim.json"] == []   # no temporary file left


def test_cdi_spec_refuses_a_file_name_cdi_would_ignore_and_writes_nothing(sim, tmp_path):
    out = tmp_path / "gpusim.txt"
    r = sim.gpusim("cdi-spec", "--out", str(out), "--dev-dir", str(tmp_path / "devs"))
    assert r.rc == 2 and "--out must name a .json file" in r.err and str(out) in r.err, r
    assert not out.exists() and not (tmp_path / "devs").exists()
    r = sim.gpusim("cdi-spec", "--out", str(tmp_path / "x.json"), "--dev-dir", str(tmp_path / "d"), "--kind", "gpu")
    assert r.rc == 2 and "--kind must be vendor/class" in r.err, r
