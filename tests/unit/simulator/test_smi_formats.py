"""The fake nvidia-smi against the *literal* formats of the real 535.261.03
binary described in docs/reference/nvidia-smi.md (cited §N).  Expected strings are
written out here from the doc, never taken from the fake itself."""
from __future__ import annotations

import re

import pytest

# §1.5 [verified]: exact stdout of the real binary without a kernel driver.
DOC_DRIVER_FAILURE = (b"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
                      b"driver. Make sure that the latest NVIDIA driver is installed and running."
                      b"\n\n")
# §1.5 [verified]: library missing, two lines on stdout, rc 12.
DOC_NOLIB_1 = ("NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure "
               "that the NVIDIA Display Driver is properly installed and present in your system.")
DOC_NOLIB_2 = "Please also try adding directory that contains libnvidia-ml.so to your system PATH."

UUID_RE = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
BUS_RE = re.compile(r"^[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.0$")  # §1.2: %08X:%02X:%02X.0
MIB_RE = re.compile(r"^\d+ MiB$")                                  # §1.2: "29089 MiB"

GPU_FIELDS = ["index", "uuid", "name", "memory.used", "memory.total", "memory.free",
              "memory.reserved", "pci.bus_id", "persistence_mode", "compute_mode",
              "mig.mode.current", "mig.mode.pending", "reset_status.reset_required",
              "reset_status.drain_and_reset_recommended", "serial", "driver_version"]
APP_FIELDS = ["timestamp", "gpu_name", "gpu_bus_id", "gpu_serial", "gpu_uuid", "pid",
              "process_name", "used_gpu_memory"]


# ------------------------------------------------------------ driver / library
@pytest.mark.parametrize("args", [
    [], ["--bogus"], ["--query-gpu=index", "--format=csv"], ["--format=xml"],
    ["--query-gpu=not_a_field", "--format=csv"], ["-L"], ["-r", "-i", "0"],
    ["--help-query-gpu"], ["--help-query-compute-apps"],
    ["--query-compute-apps=pid", "--format=csv,noheader"],
])
def test_driver_unloaded_exact_bytes_whatever_the_arguments(sim, args):
    assert sim.gpusim("driver", "unload").rc == 0
    r = sim.smi(*args)
    assert r.out_bytes == DOC_DRIVER_FAILURE
    assert r.out_bytes.endswith(b"running.\n\n")
    assert r.err_bytes == b""
    assert r.rc == 9


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_works_without_a_driver(sim, flag):
    sim.gpusim("driver", "unload")
    r = sim.smi(flag)
    assert r.rc == 0
    assert "--query-gpu" in r.out and "--format" in r.out


def test_driver_load_restores_service(sim):
    sim.gpusim("driver", "unload")
    assert sim.smi("-L").rc == 9
    assert sim.gpusim("driver", "load").rc == 0
    assert sim.smi("-L").rc == 0


def test_library_missing_two_lines_rc12(sim):
    sim.gpusim("driver", "nolib")
    r = sim.smi("--query-gpu=index", "--format=csv")
    assert r.rc == 12
    assert r.lines == [DOC_NOLIB_1, DOC_NOLIB_2]
    assert r.err == ""


def test_version_mismatch_rc18(sim):
    sim.gpusim("driver", "mismatch")
    r = sim.smi("-L")
    assert r.rc == 18
    # §1.5: "Failed to initialize NVML: %s" then "NVML library version: %d.%02d"
    assert len(r.lines) == 2
    assert r.lines[0].startswith("Failed to initialize NVML: ")
    assert re.fullmatch(r"NVML library version: \d+\.\d{2,}", r.lines[1])


def test_no_root_behaves_like_missing_library(bare_sim):
    env = {"GPUSIM_ROOT": ""}
    r = bare_sim.smi("-L", env=env)
    assert r.rc == 12
    assert r.lines == [DOC_NOLIB_1, DOC_NOLIB_2]
    assert "GPUSIM_ROOT" in r.err  # a hint for the test author, on stderr only


def test_uninitialised_root_behaves_like_missing_library(bare_sim):
    r = bare_sim.smi("-L")
    assert r.rc == 12
    assert "gpusim init" in r.err


# ------------------------------------------------------------------ CSV basics
def test_query_gpu_headers_and_units(sim):
    r = sim.smi("--query-gpu=" + ",".join(GPU_FIELDS), "--format=csv")
    assert r.rc == 0, r
    # §1.2: "field [unit]" for fields with a unit, bare names otherwise, ", " separator
    assert r.lines[0] == (
        "index, uuid, name, memory.used [MiB], memory.total [MiB], memory.free [MiB], "
        "memory.reserved [MiB], pci.bus_id, persistence_mode, compute_mode, mig.mode.current, "
        "mig.mode.pending, reset_status.reset_required, "
        "reset_status.drain_and_reset_recommended, serial, driver_version")
    assert len(r.lines) == 9
    for i, line in enumerate(r.lines[1:]):
        cols = line.split(", ")
        assert len(cols) == len(GPU_FIELDS), line
        row = dict(zip(GPU_FIELDS, cols))
        assert row["index"] == str(i)
        assert UUID_RE.match(row["uuid"]), row["uuid"]
        assert row["name"] == "NVIDIA H200"
        for f in ("memory.used", "memory.total", "memory.free", "memory.reserved"):
            assert MIB_RE.match(row[f]), (f, row[f])
        assert row["memory.total"] == "143771 MiB"
        assert BUS_RE.match(row["pci.bus_id"]), row["pci.bus_id"]
        assert row["persistence_mode"] == "Enabled"
        assert row["compute_mode"] == "Default"
        assert row["mig.mode.current"] == row["mig.mode.pending"] == "Disabled"
        assert row["reset_status.reset_required"] == "No"
        assert row["reset_status.drain_and_reset_recommended"] == "No"
        assert re.fullmatch(r"\d{13}", row["serial"])
        assert row["driver_version"] == "535.261.03"
    assert r.out.endswith("\n") and "\r" not in r.out


def test_h100_preset(make_sim):
    s = make_sim("h100", 4, "H100")
    rows = s.query_gpu("name,memory.total,memory.used")
    assert rows == [["NVIDIA H100 80GB HBM3", "81559", "1"]] * 4


def test_nounits_keeps_header_units_and_strips_values(sim):
    r = sim.smi("--query-gpu=index,memory.used,memory.total", "--format=csv,nounits", "-i", "0")
    assert r.lines == ["index, memory.used [MiB], memory.total [MiB]", "0, 1, 143771"]


def test_noheader(sim):
    r = sim.smi("--query-gpu=index,memory.total", "--format=csv,noheader", "-i", "1")
    assert r.out == "1, 143771 MiB\n"


def test_format_spellings_are_equivalent(sim):
    a = sim.smi("--query-gpu=index,uuid", "--format=csv,noheader")
    b = sim.smi("--query-gpu", "index,uuid", "--format", "csv,noheader")
    assert a.rc == b.rc == 0
    assert a.out == b.out and len(a.lines) == 8


@pytest.mark.parametrize("fmt", [None, "--format=noheader", "--format=nounits"])
def test_csv_is_mandatory(sim, fmt):
    args = ["--query-gpu=index"] + ([fmt] if fmt else [])
    r = sim.smi(*args)
    assert r.rc == 2
    assert r.lines[0] == "Format modifier --format=csv is mandatory."


def test_unknown_format_modifier(sim):
    r = sim.smi("--query-gpu=index", "--format=csv,json")
    assert r.rc == 2
    assert r.lines[0] == "Format modifier is not recognized."


@pytest.mark.parametrize("query", ["--query-gpu=index,bogus.field",
                                   "--query-compute-apps=pid,bogus.field"])
def test_unknown_field(sim, query):
    r = sim.smi(query, "--format=csv")
    assert r.rc == 2
    assert r.lines[0] == 'Field "bogus.field" is not a valid field to query.'


def test_invalid_option(sim):
    # An option nvidia-smi does not know (capture option-not-recognized.txt) ...
    r = sim.smi("--no-such-option")
    assert r.rc == 2
    assert r.out.splitlines()[0] == "ERROR: Option --no-such-option is not recognized. Please run 'nvidia-smi -h' for help."
    # ... and known options that do not go together.
    r = sim.smi("--query-gpu=index", "--query-compute-apps=pid", "--format=csv")
    assert r.rc == 2 and "Invalid combination of input arguments" in r.out


def test_gpu_field_aliases_use_canonical_headers(sim):
    r = sim.smi("--query-gpu=gpu_name,gpu_uuid,gpu_bus_id,gpu_serial", "--format=csv", "-i", "0")
    assert r.rc == 0
    assert r.lines[0] == "name, uuid, pci.bus_id, serial"


# ------------------------------------------------------------ compute apps
def test_no_processes_noheader_is_empty_stdout_rc0(sim):
    r = sim.smi("--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader")
    assert r.rc == 0
    assert r.out_bytes == b""


def test_no_processes_header_only(sim):
    r = sim.smi("--query-compute-apps=pid,process_name,used_gpu_memory", "--format=csv")
    assert r.rc == 0
    assert r.out == "pid, process_name, used_gpu_memory [MiB]\n"
    assert "No running processes found" not in r.out  # table mode only (§1.3)


def test_used_memory_alias_header(sim):
    r = sim.smi("--query-compute-apps=pid,used_memory", "--format=csv")
    assert r.lines == ["pid, used_gpu_memory [MiB]"]


def test_all_compute_app_fields(sim):
    pid = sim.hold("--gpus", "3", "--mib", "4096", "--name", "worker")
    r = sim.smi("--query-compute-apps=" + ",".join(APP_FIELDS), "--format=csv")
    assert r.rc == 0, r
    assert r.lines[0] == ("timestamp, gpu_name, gpu_bus_id, gpu_serial, gpu_uuid, pid, "
                          "process_name, used_gpu_memory [MiB]")
    assert len(r.lines) == 2
    row = dict(zip(APP_FIELDS, r.lines[1].split(", ")))
    g = sim.status()["gpus"][3]
    assert re.fullmatch(r"\d{4}/\d{2}/\d{2} \d{2}:\d{2}:\d{2}\.\d{3}", row["timestamp"])
    assert row["gpu_name"] == "NVIDIA H200"
    assert row["gpu_bus_id"] == g["pci_bus_id"]
    assert row["gpu_serial"] == g["serial"]
    assert row["gpu_uuid"] == g["uuid"]
    assert row["pid"] == str(pid)
    assert row["process_name"] == "worker"
    assert row["used_gpu_memory"] == "4096 MiB"


# ------------------------------------------------------------------ -L, table
def test_list_gpus_format(sim):
    r = sim.smi("-L")
    assert r.rc == 0
    assert len(r.lines) == 8
    for i, line in enumerate(r.lines):
        m = re.fullmatch(r"GPU (\d+): NVIDIA H200 \(UUID: (GPU-[0-9a-f-]+)\)", line)
        assert m, line
        assert m.group(1) == str(i) and UUID_RE.match(m.group(2))


def test_list_gpus_empty(make_sim):
    s = make_sim("empty", 0, "H200")
    r = s.smi("-L")
    assert r.rc == 0
    assert r.out == "No devices found.\n"
    assert s.smi("--query-gpu=index", "--format=csv").rc == 6


def test_table_idle(sim):
    r = sim.smi()
    assert r.rc == 0
    assert "No running processes found" in r.out
    assert r.out.count("1MiB / 143771MiB") == 8          # §1.10 "<used>MiB / <total>MiB"
    assert "Driver Version: 535.261.03" in r.out
    assert "00000000:18:00.0" in r.out
    body = [l for l in r.lines[1:] if l.strip()]
    # 89 columns inside the frame, as the captures print it (tests/captures/nvidia-smi/table-*.txt)
    assert all(len(l) == 91 for l in body), [l for l in body if len(l) != 91]


def test_table_with_processes(sim):
    pid = sim.hold("--gpus", "0,1", "--mib", "70000", "--name", "sglang::scheduler_TP0")
    r = sim.smi()
    assert "No running processes found" not in r.out
    assert r.out.count("70001MiB / 143771MiB") == 2
    rows = [l for l in r.lines if str(pid) in l]
    assert len(rows) == 2                                  # one row per GPU
    for gpu, line in zip((0, 1), rows):
        cols = line.strip("| ").split()
        assert cols[0] == str(gpu) and cols[3] == str(pid) and cols[4] == "C"
        assert cols[-1] == "70000MiB"
        assert "sglang::scheduler_TP0" in line


def test_version_flag(sim):
    r = sim.smi("--version")
    assert r.rc == 0
    assert "535.261.03" in r.out and "CUDA Version" in r.out


def test_help_query_lists_fields(sim):
    r = sim.smi("--help-query-gpu")
    assert r.rc == 0
    for f in GPU_FIELDS:
        assert f in r.lines
    r = sim.smi("--help-query-compute-apps")
    assert set(APP_FIELDS) <= set(r.lines)


def test_executable_through_path_and_shebang(sim):
    """The bin scripts work as plain executables found on PATH."""
    import subprocess

    p = subprocess.run(["nvidia-smi", "--query-gpu=count", "--format=csv,noheader", "-i", "0"],
                       env=sim.env, capture_output=True, timeout=30, check=False)
    assert p.returncode == 0, p
    assert p.stdout == b"8\n"
    p = subprocess.run(["gpusim", "status"], env=sim.env, capture_output=True, timeout=30, check=False)
    assert p.returncode == 0 and b'"driver": "loaded"' in p.stdout
