"""The fake nvidia-smi against real captures (tests/captures/nvidia-smi/, sources in manifest.json).

Each test puts the simulated node in the state the capture shows (driver
branch, bus id, lost GPU, busy GPU, NVML failure) and compares the output
byte for byte. Where the source shows only part of the output (its first
line) or values that depend on the hardware (temperatures, power), the test
says so and compares the rest exactly.
"""
from __future__ import annotations

import json
import os
import re

import pytest

from gpusim_testlib import REPO

CAPTURES = REPO / "tests" / "captures" / "nvidia-smi"
MANIFEST = json.loads((CAPTURES / "manifest.json").read_text(encoding="utf-8"))


def capture(name):
    with open(str(CAPTURES / name), "r", encoding="utf-8", newline="") as fh:
        return fh.read()


def node(make_sim, driver, gpus=1, model="H200", buses=(), extra=()):
    s = make_sim("golden", gpus, model, init=False)
    r = s.gpusim("init", "--gpus", gpus, "--model", model, "--driver-version", driver, *extra)
    assert r.rc == 0, r
    for index, bus in buses:
        r = s.gpusim("set", "--gpu", index, "--attr", "pci_bus_id", "--value", bus)
        assert r.rc == 0, r
    return s


def test_every_capture_is_in_the_manifest_with_a_source():
    files = sorted(p.name for p in CAPTURES.iterdir() if p.suffix == ".txt")
    entries = dict((c["file"], c) for c in MANIFEST["captures"])
    assert files == sorted(entries)
    for entry in entries.values():
        src = entry["source"]
        assert src.get("url") or (src.get("repo") and src.get("path")) or src.get("ref"), entry["file"]
        if src.get("commit"):
            assert re.match(r"^[0-9a-f]{40}$", src["commit"])


@pytest.mark.parametrize("name, driver, index, gpus, bus, reason", [
    ("lost-610-index-form.txt", "610.57.04", 1, 4, "00000000:34:00.0", "unknown"),
    ("lost-525-nospace-form.txt", "535.261.03", 0, 1, "00000000:65:00.0", "unknown"),
    ("lost-520-space-form.txt", "520.61.05", 0, 1, "00000000:0B:00.0", "unknown"),
    ("lost-515-not-found.txt", "515.43.04", 0, 1, "00000000:D8:00.0", "not-found"),
])
def test_lost_gpu_line_byte_for_byte(make_sim, name, driver, index, gpus, bus, reason):
    s = node(make_sim, driver, gpus=gpus, buses=[(index, bus)])
    assert s.gpusim("lose", "--gpu", index, "--reason", reason).rc == 0
    r = s.smi("--query-gpu=index", "--format=csv,noheader")
    assert r.rc == 15
    assert r.lines[0] + "\n" == capture(name)
    assert r.lines[1:] == [str(i) for i in range(gpus) if i != index]   # the others answer


def test_gpu_is_lost_text_differs_from_the_capture_only_in_its_spacing(make_sim):
    # The source shows one space after "lost."; the binary's own string has two (§1.5), which the simulator keeps.
    s = node(make_sim, "520.61.05", buses=[(0, "00000000:02:00.0")])
    s.gpusim("lose", "--gpu", 0, "--reason", "gpu-is-lost")
    line = s.smi("-L").lines[0]
    assert line.replace(".  ", ". ") + "\n" == capture("lost-gpu-is-lost.txt")


@pytest.mark.parametrize("name, driver, bus", [
    ("reset-in-use-client.txt", "590.48.01", "00000000:00:06.0"),
    ("reset-in-use-process-old.txt", "535.261.03", "00000000:C1:00.0"),
])
def test_reset_refusal_byte_for_byte(make_sim, name, driver, bus):
    s = node(make_sim, driver, buses=[(0, bus)])
    s.hold("--gpus", "0", "--mib", "100")
    r = s.smi("--gpu-reset", "-i", "0", env={"GPUSIM_SMI_EUID": "0"})
    assert r.rc == 255 and r.err == ""
    assert r.out == capture(name)


@pytest.mark.parametrize("name, state", [
    ("nvml-unknown-error.txt", "nvml_unknown"),
    ("nvml-no-supported-gpus.txt", "nosupported"),
])
def test_nvml_initialisation_failures_byte_for_byte(sim, name, state):
    assert sim.gpusim("driver", state).rc == 0
    for argv in (["--query-gpu=index,memory.used", "--format=csv,noheader"], ["-L"], []):
        r = sim.smi(*argv)
        assert r.rc == 255 and r.out == capture(name) and r.err == ""


def test_option_not_recognized_first_line(sim):
    r = sim.smi("--query-gpu=power.draw", "--format=csv,noheader,nounits", "-lms100")
    assert r.rc == 2
    # The source (a Markdown code block) shows the one line; what follows it is not known.
    assert r.lines[0] + "\n" == capture("option-not-recognized.txt")


def _frame(lines):
    """The lines that do not depend on the hardware: borders, headers, banner, the lost line."""
    keep = []
    for line in lines:
        if line.startswith(("+", "|=", "Unable")) or "NVIDIA-SMI" in line or line.strip() == "" \
                or any(k in line for k in ("GPU  Name", "Fan  Temp", "MIG M. |", "Processes:", "GI   CI", "ID   ID")):
            keep.append(line)
    return keep


def _mask(line):
    """Mask temperature, power, performance state and fan of a GPU row."""
    line = re.sub(r"\d+C ", "NNC ", line)
    line = re.sub(r"\d+W /\s+\d+W", "NNW / NNW", line)
    return re.sub(r"^\|( N/A|\s*\d+%) ", "| FAN ", line.replace("P0", "PN").replace("P1", "PN").replace("P8", "PN"))


def test_table_layout_of_an_idle_h100_on_550(make_sim):
    s = node(make_sim, "550.90.07", gpus=2, model="H100", buses=[(0, "00000000:53:00.0"), (1, "00000000:64:00.0")])
    r = s.smi()
    assert r.rc == 0
    want = capture("table-h100-idle-550.txt").splitlines()
    got = r.lines[1:1 + len(want)]                      # the capture starts after the timestamp line
    assert _frame(got) == _frame(want)
    assert [_mask(x) for x in got] == [_mask(x) for x in want]      # the rows, up to temperature and power
    assert "       1MiB /  81559MiB " in r.out                     # idle H100: 1 MiB used (the capture)


def test_table_layout_of_driver_610_with_a_lost_gpu(make_sim):
    s = node(make_sim, "610.57.04", gpus=4, buses=[(1, "00000000:34:00.0")])
    s.gpusim("lose", "--gpu", 1)
    r = s.smi()
    want = capture("table-lost-610.txt").splitlines()
    assert r.lines[0] == want[0]                                    # the lost line first, then the table
    assert re.match(r"^\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}       $", r.lines[1])
    frame_got = [x for x in _frame(r.lines[2:]) if "No running" not in x]
    frame_want = _frame(want[2:])
    # Same frame, banner and headers; the capture's node has 3 answering GPUs, like this one.
    assert frame_got == frame_want
    assert all(len(x) == 91 for x in r.lines[2:] if x)


def test_mig_node_reads_as_the_captures_describe(make_sim):
    s = node(make_sim, "590.48.01", gpus=8, extra=["--mig"])
    rows = s.query_gpu("index,memory.used,memory.reserved,mig.mode.current,utilization.gpu")
    assert len(rows) == 8
    for index, used, reserved, mig, util in rows:
        assert 55 <= int(used) <= 59 and reserved == "614" and mig == "Enabled" and util == "[N/A]"
    plain = node(make_sim, "590.48.01", gpus=2)
    assert plain.query_gpu("memory.used,memory.reserved,mig.mode.current,utilization.gpu") == \
        [["0", "614", "Disabled", "0"]] * 2                         # idle H200 on 590: 0 used, 614 reserved
    older = node(make_sim, "580.173.02", gpus=1)
    assert older.query_gpu("memory.used,memory.reserved") == [["0", "616"]]
    h100 = node(make_sim, "535.261.03", gpus=1, model="H100")
    assert h100.query_gpu("memory.reserved") == [["479"]]


def test_mig_gpu_util_reads_na_in_the_table(make_sim):
    s = node(make_sim, "590.48.01", gpus=1, extra=["--mig"])
    row = [x for x in s.smi().lines if "MiB / 143771MiB" in x][0]
    assert row.split("|")[3].split()[0] == "N/A"
    assert any(x.rstrip().endswith("Enabled |") for x in s.smi().lines)


def test_simulator_figures_are_listed_as_figures():
    text = json.dumps(MANIFEST["figures"])
    for figure in ("614 MiB reserved", "616", "479", "55-59 MiB"):
        assert figure in text
    assert os.path.basename(str(CAPTURES)) == "nvidia-smi"
