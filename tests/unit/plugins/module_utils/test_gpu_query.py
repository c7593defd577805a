"""Parser and backend tests for module_utils/gpu/query.py.

Outputs are the literal formats of nvidia-smi 535 quoted in
docs/reference/nvidia-smi.md (section numbers in the test names' docstrings).
"""
from __future__ import annotations

import types

import pytest


from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import smi_csv

from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import backends as gpu_backends
from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import query as gq

UUID0 = "GPU-107f0d10-1b2c-3d4e-5f60-718293a4b5c6"
UUID1 = "GPU-a4462c8e-9f1a-2b3c-4d5e-6f708192a3b4"
UUID2 = "GPU-c2947eb9-414f-1e10-0588-6a004603afd1"

# §1.5 [verified], byte-exact: the message is on stdout and ends in one extra empty line.
RC9_STDOUT = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
              "Make sure that the latest NVIDIA driver is installed and running.\n\n")
RC12_STDOUT = ("NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure that the NVIDIA "
               "Display Driver is properly installed and present in your system.\n"
               "Please also try adding directory that contains libnvidia-ml.so to your system PATH.\n")
RC18_STDOUT = "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 535.261\n"

GPU_HEADER_UNITS = ("index, uuid, pci.bus_id, memory.total [MiB], memory.reserved [MiB], memory.used [MiB], "
                    "memory.free [MiB], mig.mode.current, name")


def gpu_row(index, uuid, bus, total, reserved, used, free, name, units=True, mig="Disabled"):
    def v(x):
        return "%s MiB" % x if units and not str(x).startswith("[") and x != "N/A" else str(x)
    return ", ".join([str(index), uuid, bus, v(total), v(reserved), v(used), v(free), mig, name])


def smi_gpu_output(rows, header=True, units=True):
    lines = []
    if header:
        lines.append(GPU_HEADER_UNITS)
    lines.extend(gpu_row(*r, units=units) for r in rows)
    return "\n".join(lines) + "\n"


TWO_GPUS = [
    (0, UUID0, "00000000:18:00.0", 143771, 530, 70001, 73240, "NVIDIA H200"),
    (1, UUID1, "00000000:2A:00.0", 143771, 530, 1, 143240, "NVIDIA H200"),
]


# ---------------------------------------------------------------------------
# Values and placeholders (§1.2, §1.4)
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["[N/A]", "[Not Supported]", "[Insufficient Permissions]", "[Not Found]",
                                  "[Unknown Error]", "[GPU is lost]", "[GPU requires reset]",
                                  "[Requested functionality has been deprecated]", "N/A", " N/A ", "ERR!", ""])
def test_placeholders_are_unknown_never_zero(text):
    assert smi_csv.is_placeholder(text)
    value, raw = smi_csv.parse_mib(text)
    assert value is None
    assert raw  # the placeholder text is kept as the flag
    assert smi_csv.parse_int(text)[0] is None


@pytest.mark.parametrize("text, expected", [
    ("29089 MiB", 29089), ("29089", 29089), ("0 MiB", 0), (" 1 MiB ", 1), ("143771", 143771),
    ("2 GiB", 2048), ("512 KiB", 0), ("1048576 B", 1),
])
def test_parse_mib_with_and_without_units(text, expected):
    assert smi_csv.parse_mib(text) == (expected, None)


@pytest.mark.parametrize("text", ["12.5 MB", "lots", "-3 MiB"])
def test_parse_mib_junk_is_unknown(text):
    value, raw = smi_csv.parse_mib(text)
    assert value is None and raw == text.strip()


def test_parse_header_with_and_without_units():
    assert smi_csv.parse_header("index, memory.used [MiB], utilization.gpu [%], power.draw [W]") == [
        ("index", None), ("memory.used", "MiB"), ("utilization.gpu", "%"), ("power.draw", "W")]
    # used_memory is an alias whose header reads used_gpu_memory [MiB] (§1.1)
    assert smi_csv.parse_header("pid, used_memory [MiB]") == [("pid", None), ("used_gpu_memory", "MiB")]
    assert smi_csv.parse_header("0, GPU-107f0d10, NVIDIA H200") is None


@pytest.mark.parametrize("text, canonical", [
    ("00000000:18:00.0", "00000000:18:00.0"),
    ("0000:18:00.0", "00000000:18:00.0"),
    ("18:00.0", "00000000:18:00.0"),
    ("0:2:0.0", "00000000:02:00.0"),
    ("00000000:db:00.0", "00000000:DB:00.0"),
])
def test_normalize_bus_id(text, canonical):
    assert gq.normalize_bus_id(text) == canonical


@pytest.mark.parametrize("text", ["3", "GPU-1", "00000000:18:00", "zz:00.0", None])
def test_normalize_bus_id_rejects(text):
    assert gq.normalize_bus_id(text) is None


# ---------------------------------------------------------------------------
# CSV (§1.2, §1.3)
# ---------------------------------------------------------------------------

def test_query_gpu_with_header_and_units():
    gpus, lost, anomalies = smi_csv.parse_query_gpu(smi_gpu_output(TWO_GPUS))
    assert lost == [] and anomalies == []
    assert gpus[0] == {
        "index": 0, "uuid": UUID0, "name": "NVIDIA H200", "bus_id": "00000000:18:00.0",
        "used_mib": 70001, "reserved_mib": 530, "total_mib": 143771, "free_mib": 73240,
        "processes": [], "unknown_fields": {}, "mig_mode": "Disabled", "lost": False, "lost_reason": None,
    }
    # total = reserved + used + free (§1.2): free is not total - used
    assert gpus[1]["total_mib"] == gpus[1]["reserved_mib"] + gpus[1]["used_mib"] + gpus[1]["free_mib"]


@pytest.mark.parametrize("header, units", [(True, False), (False, True), (False, False)])
def test_query_gpu_nounits_and_noheader(header, units):
    text = smi_gpu_output(TWO_GPUS, header=header, units=units)
    gpus, lost, anomalies = smi_csv.parse_query_gpu(text)
    assert [g["used_mib"] for g in gpus] == [70001, 1]
    assert [g["index"] for g in gpus] == [0, 1]
    assert anomalies == []


def test_header_order_is_followed():
    text = ("memory.used [MiB], index, uuid, pci.bus_id, memory.total [MiB], memory.reserved [MiB], memory.free [MiB], "
            "mig.mode.current, name\n5 MiB, 3, %s, 00000000:5D:00.0, 81559 MiB, 326 MiB, 81228 MiB, Disabled, "
            "NVIDIA H100 80GB HBM3\n" % UUID0)
    rows, anomalies = smi_csv.parse_csv(text, gq.GPU_FIELDS)
    assert anomalies == [] and len(rows) == 1
    assert rows[0]["index"] == "3" and rows[0]["memory.used"] == "5 MiB"


def test_doc_h100_row_and_crlf_line_endings():
    # §1.2 [reported]: "0, GPU-107f0d10-..., NVIDIA H100 80GB HBM3, 29089 MiB, 81559 MiB"
    text = "index, uuid, name, memory.used [MiB], memory.total [MiB]\r\n0, %s, NVIDIA H100 80GB HBM3, 29089 MiB, 81559 MiB\r\n" % UUID0
    rows, anomalies = smi_csv.parse_csv(text, ["index", "uuid", "name", "memory.used", "memory.total"])
    assert rows == [{"index": "0", "uuid": UUID0, "name": "NVIDIA H100 80GB HBM3", "memory.used": "29089 MiB",
                     "memory.total": "81559 MiB"}]
    assert anomalies == []


def test_placeholder_fields_in_a_gpu_row_are_flagged():
    rows = [(0, UUID0, "00000000:18:00.0", "[N/A]", "[N/A]", "[N/A]", "[N/A]", "NVIDIA GB10"),
            (1, UUID1, "00000000:2A:00.0", 143771, "[Not Supported]", 3, "[Insufficient Permissions]", "NVIDIA H200")]
    gpus, dummy, dummy2 = smi_csv.parse_query_gpu(smi_gpu_output(rows))
    assert gpus[0]["used_mib"] is None and gpus[0]["total_mib"] is None
    assert gpus[0]["unknown_fields"] == {"memory.total": "[N/A]", "memory.reserved": "[N/A]",
                                         "memory.used": "[N/A]", "memory.free": "[N/A]"}
    assert gpus[1]["used_mib"] == 3
    assert gpus[1]["reserved_mib"] is None and gpus[1]["free_mib"] is None
    assert gpus[1]["unknown_fields"] == {"memory.reserved": "[Not Supported]", "memory.free": "[Insufficient Permissions]"}


def test_gpu_is_lost_placeholder_marks_the_gpu_lost():
    rows = [(3, UUID2, "00000000:5D:00.0", "[GPU is lost]", "[GPU is lost]", "[GPU is lost]", "[GPU is lost]",
             "NVIDIA H200")]
    gpus, dummy, dummy2 = smi_csv.parse_query_gpu(smi_gpu_output(rows))
    assert gpus[0]["lost"] is True
    assert gpus[0]["used_mib"] is None
    assert "GPU is lost" in gpus[0]["lost_reason"]


def test_compute_apps_process_name_with_commas_is_kept_whole():
    text = ("gpu_uuid, pid, used_gpu_memory [MiB], process_name\n"
            "%s, 1328667, 130004 MiB, /usr/bin/python3.10\n"
            "%s, 4242, 512 MiB, chrome --type=gpu-process --field-trial-handle=1,2,3, with, commas\n" % (UUID0, UUID1))
    procs, anomalies = smi_csv.parse_compute_apps(text)
    assert anomalies == []
    assert procs[0] == {"pid": 1328667, "used_mib": 130004, "name": "/usr/bin/python3.10", "gpu_uuid": UUID0,
                        "unknown_fields": {}}
    assert procs[1]["name"] == "chrome --type=gpu-process --field-trial-handle=1,2,3, with, commas"
    assert procs[1]["used_mib"] == 512


def test_compute_apps_doc_column_order_and_used_memory_alias():
    # §1.2 H200 capture: "GPU-a446..., 1328667, <absolute path of the python3.10 executable>, 130004 MiB"
    text = "gpu_uuid, pid, process_name, used_gpu_memory [MiB]\n%s, 1328667, /opt/venv/bin/python3.10, 130004 MiB\n" % UUID1
    rows, anomalies = smi_csv.parse_csv(text, ["gpu_uuid", "pid", "process_name", "used_memory"])
    assert anomalies == []
    assert rows[0]["used_gpu_memory"] == "130004 MiB" and rows[0]["process_name"] == "/opt/venv/bin/python3.10"


def test_compute_apps_placeholders():
    text = ("%s, 4194999, [N/A], [Not Found]\n%s, [N/A], 12 MiB, [Insufficient Permissions]\n" % (UUID0, UUID0))
    procs, anomalies = smi_csv.parse_compute_apps(text)
    assert procs[0]["pid"] == 4194999 and procs[0]["used_mib"] is None and procs[0]["name"] is None
    assert procs[0]["unknown_fields"] == {"used_gpu_memory": "[N/A]", "process_name": "[Not Found]"}
    assert procs[1]["pid"] is None and procs[1]["unknown_fields"]["pid"] == "[N/A]"


def test_no_compute_processes():
    # §1.3: header only with csv; empty stdout with csv,noheader
    assert smi_csv.parse_compute_apps("gpu_uuid, pid, used_gpu_memory [MiB], process_name\n") == ([], [])
    assert smi_csv.parse_compute_apps("") == ([], [])


def test_short_rows_are_anomalies_not_values():
    rows, anomalies = smi_csv.parse_csv("0, %s\n" % UUID0, gq.GPU_FIELDS)
    assert rows == [] and anomalies == ["0, %s" % UUID0]


# ---------------------------------------------------------------------------
# Driver failures and lost GPUs (§1.5, §1.7)
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("rc, stdout, status", [
    (9, RC9_STDOUT, gq.STATUS_NOT_LOADED),
    (12, RC12_STDOUT, gq.STATUS_NO_LIBRARY),
    (18, RC18_STDOUT, gq.STATUS_MISMATCH),
    (6, "No devices were found\n", gq.STATUS_NO_DEVICES),
    (6, "No devices were found. Please make sure /dev/nvidia* files are readable by current user.\n",
     gq.STATUS_NO_DEVICES),
    (255, "Failed to initialize NVML: Unknown Error\n", gq.STATUS_NVML_INIT),
    (127, "", gq.STATUS_NOT_FOUND),
])
def test_driver_failures(rc, stdout, status):
    failure = smi_csv.detect_driver_failure(rc, stdout, "")
    assert failure["status"] == status
    assert failure["ok"] is False
    assert failure["rc"] == rc
    assert failure["fatal"] is True
    assert failure["hint"]


def test_driver_failure_is_recognised_from_the_text_alone():
    # Whatever rc a wrapper reports, the stdout text is enough.
    assert smi_csv.detect_driver_failure(1, RC9_STDOUT)["status"] == gq.STATUS_NOT_LOADED
    assert smi_csv.detect_driver_failure(1, RC12_STDOUT)["status"] == gq.STATUS_NO_LIBRARY
    assert smi_csv.detect_driver_failure(1, RC18_STDOUT)["status"] == gq.STATUS_MISMATCH
    # ... and the rc alone too, when the text is missing.
    assert smi_csv.detect_driver_failure(9, "")["status"] == gq.STATUS_NOT_LOADED
    assert smi_csv.detect_driver_failure(0, "index\n0\n") is None


@pytest.mark.parametrize("rc, stdout", [(9, RC9_STDOUT), (12, RC12_STDOUT), (18, RC18_STDOUT)])
def test_snapshot_on_driver_failure_has_no_gpus(rc, stdout):
    snap = smi_csv.snapshot_from_outputs((rc, stdout, ""), None)
    assert snap["driver"]["ok"] is False
    assert snap["gpus"] == []
    assert snap["calls"] == 1
    assert snap["backend"] == "nvidia-smi"


def test_lost_gpu_line_marks_only_that_gpu():
    text = ("Unable to determine the device handle for GPU 00000000:5D:00.0: Unknown Error\n"
            + smi_gpu_output(TWO_GPUS))
    snap = smi_csv.snapshot_from_outputs((15, text, ""), (15, text.splitlines()[0] + "\n", ""))
    assert snap["driver"]["ok"] is True
    assert [g["index"] for g in snap["gpus"]] == [0, 1]
    assert snap["lost"] == [{"bus_id": "00000000:5D:00.0", "reason": "Unknown Error", "index": None}]
    chosen, errors = gq.select_gpus(snap)
    assert errors == []
    assert [g["lost"] for g in chosen] == [False, False, True]
    assert chosen[2]["bus_id"] == "00000000:5D:00.0"


@pytest.mark.parametrize("line, bus", [
    ("Unable to determine the device handle for GPU 0000:3B:00.0: Unknown Error", "00000000:3B:00.0"),
    ("Unable to determine the device handle for gpu 0000:3b:00.0: GPU is lost", "00000000:3B:00.0"),
    ("Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error", "00000000:3B:00.0"),
])
def test_lost_line_variants(line, bus):
    assert smi_csv.parse_lost_lines(line + "\n")[0]["bus_id"] == bus


def test_bare_gpu_is_lost_message():
    lost = smi_csv.parse_lost_lines("GPU is lost.  Reboot the system to recover this GPU\n")
    assert lost == [{"bus_id": None, "reason": "GPU is lost.  Reboot the system to recover this GPU", "index": None}]


def test_lost_line_on_stderr_is_seen():
    snap = smi_csv.snapshot_from_outputs(
        (15, smi_gpu_output(TWO_GPUS), "Unable to determine the device handle for GPU 00000000:5D:00.0: Unknown Error\n"),
        (0, "", ""))
    assert snap["lost"][0]["bus_id"] == "00000000:5D:00.0"


def test_unexpected_failure_is_retryable_error():
    snap = smi_csv.snapshot_from_outputs((255, "Something odd happened\n", ""), None)
    assert snap["driver"]["status"] == gq.STATUS_ERROR and snap["driver"]["fatal"] is False
    snap = smi_csv.snapshot_from_outputs((124, "", "timed out"), None)
    assert snap["driver"]["status"] == gq.STATUS_TIMEOUT


def test_process_query_failure_is_reported():
    snap = smi_csv.snapshot_from_outputs((0, smi_gpu_output(TWO_GPUS), ""), (255, "oops\n", ""))
    assert snap["driver"]["status"] == gq.STATUS_ERROR
    assert "process query failed" in snap["driver"]["message"]


# ---------------------------------------------------------------------------
# Snapshot assembly, duplicates, selection
# ---------------------------------------------------------------------------

def test_snapshot_attaches_processes_and_duplicate_pids():
    apps = ("gpu_uuid, pid, used_gpu_memory [MiB], process_name\n"
            "%s, 777, 25 MiB, nvidia-cuda-mps-server\n"
            "%s, 777, 27 MiB, nvidia-cuda-mps-server\n"
            "%s, 1328667, 70000 MiB, /usr/bin/python3\n"
            "GPU-ffffffff-0000-0000-0000-000000000000, 9, 1 MiB, ghost\n" % (UUID0, UUID1, UUID0.upper()))
    snap = smi_csv.snapshot_from_outputs((0, smi_gpu_output(TWO_GPUS), ""), (0, apps, ""))
    assert snap["calls"] == 2
    assert [p["pid"] for p in snap["gpus"][0]["processes"]] == [777, 1328667]
    assert [p["pid"] for p in snap["gpus"][1]["processes"]] == [777]
    assert snap["unmatched_processes"][0]["pid"] == 9
    agg = gq.holders(snap["gpus"])
    assert agg[777] == {"pid": 777, "gpus": [0, 1], "used_mib": 52, "name": "nvidia-cuda-mps-server", "unknown": False}
    assert agg[1328667]["gpus"] == [0] and agg[1328667]["used_mib"] == 70000


def test_holders_unknown_memory_makes_the_sum_unknown():
    gpus = [{"index": 0, "processes": [{"pid": 5, "used_mib": 10, "name": "a"}]},
            {"index": 1, "processes": [{"pid": 5, "used_mib": None, "name": "a"}]}]
    assert gq.holders(gpus)[5]["used_mib"] is None
    assert gq.holders(gpus)[5]["unknown"] is True


def _snap():
    return smi_csv.snapshot_from_outputs((0, smi_gpu_output(TWO_GPUS), ""), (0, "", ""))


@pytest.mark.parametrize("selectors, expected", [
    (None, [0, 1]),
    ([], [0, 1]),
    ([1], [1]),
    (["1", 0], [0, 1]),
    ([UUID1.upper()], [1]),
    (["0000:18:00.0"], [0]),
    (["2A:00.0", 1, UUID1], [1]),
])
def test_select_gpus(selectors, expected):
    chosen, errors = gq.select_gpus(_snap(), selectors)
    assert errors == []
    assert [g["index"] for g in chosen] == expected


def test_select_gpus_errors_name_the_gpus_present():
    chosen, errors = gq.select_gpus(_snap(), [5, "GPU-nope", "MIG-1234", "bogus", True])
    assert chosen == []
    assert "no GPU matches 5" in errors[0] and UUID0 in errors[0]
    assert "no GPU matches 'GPU-nope'" in errors[1]
    assert "MIG device" in errors[2]
    assert "invalid GPU selector" in errors[3]
    assert "invalid GPU selector" in errors[4]


def test_select_index_of_a_lost_gpu_maps_to_the_lost_bus_id():
    text = "Unable to determine the device handle for GPU 00000000:5D:00.0: Unknown Error\n" + smi_gpu_output(TWO_GPUS)
    snap = smi_csv.snapshot_from_outputs((15, text, ""), (0, "", ""))
    chosen, errors = gq.select_gpus(snap, [2, "5D:00.0"])
    assert errors == []
    assert len(chosen) == 1
    assert chosen[0]["lost"] and chosen[0]["index"] == 2 and chosen[0]["bus_id"] == "00000000:5D:00.0"
    assert gq.gpu_label(chosen[0]) == "GPU 2"
    # an index beyond the node is still an error
    chosen, errors = gq.select_gpus(snap, [7])
    assert errors and chosen == []


def test_gpu_label_and_summarize():
    assert gq.gpu_label({"index": None, "bus_id": "00000000:5D:00.0"}) == "GPU 00000000:5D:00.0"
    assert gq.gpu_label({"index": None, "bus_id": None, "selector": "x"}) == "GPU x"
    assert gq.gpu_label({}) == "GPU ?"
    summary = gq.summarize(_snap()["gpus"][0])
    assert set(summary) == {"index", "uuid", "name", "bus_id", "used_mib", "reserved_mib", "total_mib", "free_mib",
                            "processes", "unknown_fields", "mig_mode", "lost", "lost_reason"}


# ---------------------------------------------------------------------------
# nvidia-smi backend through a fake runner
# ---------------------------------------------------------------------------

class FakeRunner:
    def __init__(self, responses):
        self.responses = list(responses)
        self.calls = []

    def __call__(self, argv):
        self.calls.append(list(argv))
        return self.responses.pop(0)


def test_nvidia_smi_backend_makes_two_calls_for_all_gpus():
    runner = FakeRunner([(0, smi_gpu_output(TWO_GPUS, units=False), ""),
                         (0, "%s, 42, 70000, python3\n" % UUID0, "")])
    backend = gpu_backends.NvidiaSmiBackend(runner, "/usr/bin/nvidia-smi")
    snap = backend.snapshot()
    assert snap["calls"] == 2 and len(runner.calls) == 2
    assert runner.calls[0] == ["/usr/bin/nvidia-smi", "--query-gpu=" + ",".join(gq.GPU_FIELDS), "--format=csv,nounits"]
    assert runner.calls[1] == ["/usr/bin/nvidia-smi", "--query-compute-apps=gpu_uuid,pid,used_gpu_memory,process_name",
                               "--format=csv,nounits"]
    assert all("-i" not in c for c in runner.calls)           # one call for all GPUs
    assert snap["gpus"][0]["processes"] == [{"pid": 42, "used_mib": 70000, "name": "python3"}]
    assert backend.reset_argv(3) == ["/usr/bin/nvidia-smi", "--gpu-reset", "-i", "3"]


def test_nvidia_smi_backend_falls_back_without_memory_reserved():
    # index, uuid, pci.bus_id, memory.total, memory.used, memory.free, name (no header, nounits)
    old = "".join("%d, %s, %s, %d, %d, %d, Disabled, %s\n" % (r[0], r[1], r[2], r[3], r[5], r[6], r[7]) for r in TWO_GPUS)
    runner = FakeRunner([(2, 'Field "memory.reserved" is not a valid field to query.\n\n', ""),
                         (0, old, ""), (0, "", ""),
                         (0, old, ""), (0, "", "")])
    backend = gpu_backends.NvidiaSmiBackend(runner)
    snap = backend.snapshot()
    assert snap["calls"] == 3
    assert "memory.reserved" not in runner.calls[1][1]
    assert snap["gpus"][0]["used_mib"] == 70001
    assert snap["gpus"][0]["reserved_mib"] is None
    assert snap["gpus"][0]["unknown_fields"] == {"memory.reserved": "(not queried)"}
    assert backend.snapshot()["calls"] == 2                   # the smaller field list is kept


def test_nvidia_smi_backend_stops_after_a_driver_failure():
    runner = FakeRunner([(9, RC9_STDOUT, "")])
    snap = gpu_backends.NvidiaSmiBackend(runner).snapshot()
    assert len(runner.calls) == 1
    assert snap["driver"]["status"] == gq.STATUS_NOT_LOADED


def test_module_runner_uses_argv_c_locale_and_timeout():
    seen = {}

    class FakeModule:
        def get_bin_path(self, name):
            return "/usr/bin/" + name

        def run_command(self, argv, check_rc=True, environ_update=None):
            seen["argv"] = argv
            seen["check_rc"] = check_rc
            seen["env"] = environ_update
            return 0, "out", "err"

    run = gq.module_runner(FakeModule(), timeout=30)
    assert run(["nvidia-smi", "-L"]) == (0, "out", "err")
    assert seen["argv"] == ["/usr/bin/timeout", "-k", "5", "30", "nvidia-smi", "-L"]
    assert seen["check_rc"] is False
    assert seen["env"]["LC_ALL"] == "C"
    gq.module_runner(FakeModule())(["x"])
    assert seen["argv"] == ["x"]


def test_subprocess_runner(tmp_path):
    run = gq.subprocess_runner(timeout=5)
    rc, out, err = run(["sh", "-c", "echo $LC_ALL; echo oops >&2; exit 3"])
    assert (rc, out, err) == (3, "C\n", "oops\n")
    assert run([str(tmp_path / "missing")])[0] == 127
    assert gq.subprocess_runner(timeout=0.2)(["sleep", "5"])[0] == 124


# ---------------------------------------------------------------------------
# NVML backend through a fake pynvml
# ---------------------------------------------------------------------------

class NVMLError(Exception):
    def __init__(self, value):
        super().__init__(value)
        self.value = value

    def __str__(self):
        return {9: "Driver Not Loaded", 12: "NVML Shared Library Not Found", 15: "GPU is lost",
                3: "Not Supported", 999: "Unknown Error"}.get(self.value, "error %s" % self.value)


def fake_nvml(devices, init_error=None, v2=True):
    """A minimal pynvml: ``devices`` is a list of dicts or NVMLError values (lost)."""
    mib = 1024 * 1024
    lib = types.SimpleNamespace()
    lib.NVMLError = NVMLError
    lib.calls = []
    if v2:
        lib.nvmlMemory_v2 = 0x02000028

    def init():
        lib.calls.append("init")
        if init_error is not None:
            raise NVMLError(init_error)

    def handle(i):
        dev = devices[i]
        if isinstance(dev, int):
            raise NVMLError(dev)
        return dev

    def memory(h, version=None):
        assert version == 0x02000028
        if h.get("mem_error"):
            raise NVMLError(h["mem_error"])
        return types.SimpleNamespace(total=h["total"] * mib, used=h["used"] * mib, free=h["free"] * mib,
                                     reserved=h["reserved"] * mib)

    def procs(h):
        return [types.SimpleNamespace(pid=p, usedGpuMemory=None if m is None else m * mib) for p, m in h["procs"]]

    def name_of(pid):
        if pid == 4194999:
            raise NVMLError(3)
        return b"/usr/bin/python3"

    lib.nvmlInit = init
    lib.nvmlShutdown = lambda: lib.calls.append("shutdown")
    lib.nvmlDeviceGetCount = lambda: len(devices)
    lib.nvmlDeviceGetHandleByIndex = handle
    lib.nvmlDeviceGetUUID = lambda h: h["uuid"]
    lib.nvmlDeviceGetName = lambda h: h["name"].encode()
    lib.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=h["bus"].encode())
    lib.nvmlDeviceGetMemoryInfo = memory
    lib.nvmlDeviceGetComputeRunningProcesses = procs
    lib.nvmlSystemGetProcessName = name_of
    return lib


DEV0 = {"uuid": UUID0, "name": "NVIDIA H200", "bus": "00000000:18:00.0", "total": 143771, "used": 70001,
        "free": 73240, "reserved": 530, "procs": [(42, 70000), (4194999, None)]}
DEV1 = {"uuid": UUID1, "name": "NVIDIA H200", "bus": "00000000:2A:00.0", "total": 143771, "used": 1,
        "free": 143240, "reserved": 530, "procs": []}


def test_nvml_backend_snapshot():
    lib = fake_nvml([DEV0, DEV1])
    backend = gpu_backends.NvmlBackend(lib)
    snap = backend.snapshot()
    assert snap["backend"] == "nvml" and snap["driver"]["ok"]
    gpu0 = snap["gpus"][0]
    assert (gpu0["index"], gpu0["uuid"], gpu0["name"], gpu0["bus_id"]) == (0, UUID0, "NVIDIA H200", "00000000:18:00.0")
    assert (gpu0["used_mib"], gpu0["reserved_mib"], gpu0["total_mib"], gpu0["free_mib"]) == (70001, 530, 143771, 73240)
    assert gpu0["processes"][0] == {"pid": 42, "used_mib": 70000, "name": "/usr/bin/python3"}
    assert gpu0["processes"][1]["used_mib"] is None
    assert gpu0["processes"][1]["unknown_fields"] == {"process_name": "[Not Supported]", "used_gpu_memory": "[N/A]"}
    backend.snapshot()
    assert lib.calls.count("init") == 1
    backend.close()
    assert lib.calls[-1] == "shutdown"


def test_nvml_backend_lost_gpu_and_memory_error():
    lib = fake_nvml([DEV0, 15, dict(DEV1, mem_error=999)])
    snap = gpu_backends.NvmlBackend(lib).snapshot()
    assert snap["gpus"][1]["lost"] is True and snap["gpus"][1]["index"] == 1
    assert snap["gpus"][2]["lost"] is True and snap["gpus"][2]["used_mib"] is None
    chosen, errors = gq.select_gpus(snap)
    assert errors == [] and len(chosen) == 3


@pytest.mark.parametrize("code, status", [(9, gq.STATUS_NOT_LOADED), (12, gq.STATUS_NO_LIBRARY),
                                          (18, gq.STATUS_MISMATCH), (999, gq.STATUS_NVML_INIT)])
def test_nvml_backend_init_failures(code, status):
    snap = gpu_backends.NvmlBackend(fake_nvml([], init_error=code)).snapshot()
    assert snap["driver"]["status"] == status and snap["gpus"] == []


def test_open_backend_selection():
    runner = FakeRunner([])
    backend, note = gpu_backends.open_backend("nvidia-smi", runner, "/x/nvidia-smi", nvml=fake_nvml([DEV0]))
    assert backend.name == "nvidia-smi" and note is None
    backend, note = gpu_backends.open_backend("auto", runner, nvml=fake_nvml([DEV0]))
    assert backend.name == "nvml" and note is None
    backend, note = gpu_backends.open_backend("auto", runner, nvml=fake_nvml([DEV0], init_error=9))
    assert backend.name == "nvidia-smi" and "Driver Not Loaded" in note
    backend, note = gpu_backends.open_backend("auto", runner, nvml=fake_nvml([DEV0], v2=False))
    assert backend.name == "nvidia-smi" and "nvmlMemory_v2" in note
    with pytest.raises(gq.BackendUnavailable):
        gpu_backends.open_backend("nvml", runner, nvml=fake_nvml([DEV0], init_error=12))
    with pytest.raises(gq.BackendUnavailable):
        gpu_backends.open_backend("bogus", runner)
    if not gpu_backends.HAS_PYNVML:
        backend, note = gpu_backends.open_backend("auto", runner)
        assert backend.name == "nvidia-smi" and "not installed" in note
        with pytest.raises(gq.BackendUnavailable):
            gpu_backends.NvmlBackend()
