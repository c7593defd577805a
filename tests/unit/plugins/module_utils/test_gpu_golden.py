"""The collection's nvidia-smi parser on real captures (tests/captures/nvidia-smi/).

Every lost-GPU spelling keeps its GPU in the result (by index where the line
names one), every failure is a clear status, and output that does not parse
says so instead of reading as "no GPUs".
"""
from __future__ import annotations

import os

import pytest


from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import smi_csv

from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import backends as gpu_backends
from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import query as gq

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
CAPTURES = os.path.join(REPO, "tests", "captures", "nvidia-smi")
UUIDS = ["GPU-%08x-1b2c-3d4e-5f60-718293a4b5c6" % i for i in range(4)]
HEADER = ("index, uuid, pci.bus_id, memory.total [MiB], memory.reserved [MiB], memory.used [MiB], memory.free [MiB], "
          "mig.mode.current, name\n")


def capture(name):
    with open(os.path.join(CAPTURES, name), "r", encoding="utf-8", newline="") as fh:
        return fh.read()


def rows(indices, used=0, reserved=614, mig="Disabled"):
    buses = {0: "00000000:16:00.0", 1: "00000000:34:00.0", 2: "00000000:AC:00.0", 3: "00000000:CA:00.0"}
    return "".join("%d, %s, %s, 143771, %d, %d, %d, %s, NVIDIA H200\n" % (
        i, UUIDS[i], buses[i], reserved, used, 143771 - reserved - used, mig) for i in indices)


@pytest.mark.parametrize("name, bus, index, reason", [
    ("lost-610-index-form.txt", "00000000:34:00.0", 1, "Unknown Error"),
    ("lost-525-nospace-form.txt", "00000000:65:00.0", None, "Unknown Error"),
    ("lost-520-space-form.txt", "00000000:0B:00.0", None, "Unknown Error"),
    ("lost-515-not-found.txt", "00000000:D8:00.0", None, "Not Found"),
    ("lost-gpu-is-lost.txt", "00000000:02:00.0", None, "GPU is lost. Reboot the system to recover this GPU"),
    ("table-lost-610.txt", "00000000:34:00.0", 1, "Unknown Error"),
])
def test_every_lost_gpu_spelling(name, bus, index, reason):
    assert smi_csv.parse_lost_lines(capture(name)) == [{"bus_id": bus, "index": index, "reason": reason}]
    assert smi_csv.parse_lost_lines(capture(name).lower())[0]["bus_id"] == bus        # "gpu" in lower case too


def test_driver_610_lost_gpu_never_drops_out_of_the_result():
    # The case: GPU 1 is lost on driver 610; "gpus: [1]" must find it lost, not "no GPU matches 1".
    out = capture("lost-610-index-form.txt") + HEADER + rows([0, 2, 3])
    snap = smi_csv.snapshot_from_outputs((15, out, ""), (15, capture("lost-610-index-form.txt"), ""))
    assert snap["driver"]["ok"]
    chosen, errors = gq.select_gpus(snap, [1])
    assert errors == [] and len(chosen) == 1
    assert chosen[0]["lost"] and chosen[0]["index"] == 1 and chosen[0]["bus_id"] == "00000000:34:00.0"
    everything, errors = gq.select_gpus(snap)
    assert errors == [] and [g["index"] for g in everything] == [0, 1, 2, 3]
    assert [g["lost"] for g in everything] == [False, True, False, False]
    chosen, errors = gq.select_gpus(snap, [0, 1, 2, 3])
    assert errors == [] and [g["index"] for g in chosen] == [0, 1, 2, 3]


@pytest.mark.parametrize("name, rc, status", [
    ("nvml-unknown-error.txt", 255, gq.STATUS_NVML_INIT),
    ("nvml-no-supported-gpus.txt", 255, gq.STATUS_NO_SUPPORTED),
    ("option-not-recognized.txt", 2, gq.STATUS_BAD_OPTION),
])
def test_failures_are_fatal_statuses_with_a_hint(name, rc, status):
    for stdout, stderr in ((capture(name), ""), ("", capture(name))):
        failure = smi_csv.detect_driver_failure(rc, stdout, stderr)
        assert failure["status"] == status and failure["fatal"] and failure["hint"]
    snap = smi_csv.snapshot_from_outputs((rc, capture(name), ""), None)
    assert not snap["driver"]["ok"] and snap["gpus"] == []


@pytest.mark.parametrize("name, bus, reason", [
    ("reset-in-use-client.txt", "00000000:00:06.0", "In use by another client"),
    ("reset-in-use-process-old.txt", "00000000:C1:00.0", "In use by another process"),
])
def test_reset_refusals(name, bus, reason):
    res = smi_csv.parse_reset_output(255, capture(name))
    assert res["ok"] is False and res["failed"] == {bus: reason} and res["reset"] == []
    assert "could not be reset" in res["message"] or "currently in use" in res["message"]


def test_reset_success_and_nvsentinel_refusal():
    ok = smi_csv.parse_reset_output(0, "GPU 00000000:1A:00.0 was successfully reset.\nAll done.\n")
    assert ok["ok"] and ok["reset"] == ["00000000:1A:00.0"] and ok["failed"] == {}
    text = "The following GPUs could not be reset:\n  GPU 00000000:1A:00.0: In use by another client\n"
    assert smi_csv.parse_reset_output(255, text)["failed"] == {"00000000:1A:00.0": "In use by another client"}


def test_bare_na_values_are_unknown_never_zero():
    out = HEADER + "0, %s, 00000000:16:00.0, N/A, N/A, N/A, N/A, N/A, NVIDIA GB10\n" % UUIDS[0]
    snap = smi_csv.snapshot_from_outputs((0, out, ""), (0, "gpu_uuid, pid, used_gpu_memory [MiB], process_name\n", ""))
    gpu = snap["gpus"][0]
    assert snap["driver"]["ok"] and gpu["used_mib"] is None and gpu["unknown_fields"]["memory.used"] == "N/A"
    assert gpu["mig_mode"] is None and not gq.mig_enabled(gpu)


@pytest.mark.parametrize("out, what", [
    ("", "empty output"),
    (HEADER, "a header and nothing else"),
    (HEADER + rows([0]) + "1, GPU-0000", "1, GPU-0000"),                   # a row cut off mid-write
    (HEADER + "x, y, z, garbage, 1, 2, 3, Disabled, q\n", "unreadable values"),
    ("\x00\x01garbage from a wedged tool\n", "garbage from a wedged tool"),     # the line is quoted
])
def test_garbage_and_truncated_output_is_unparsable_not_zero_gpus(out, what):
    snap = smi_csv.snapshot_from_outputs((0, out, ""), (0, "", ""))
    driver = snap["driver"]
    assert driver["status"] == gq.STATUS_UNPARSABLE and not driver["ok"] and not driver["fatal"]
    assert driver["message"].startswith("nvidia-smi output could not be parsed: ") and what in driver["message"]
    assert snap["gpus"] == []


def test_garbage_process_rows_are_unparsable_too():
    apps = "gpu_uuid, pid, used_gpu_memory [MiB], process_name\n%s, lots, 12, x\n" % UUIDS[0]
    snap = smi_csv.snapshot_from_outputs((0, HEADER + rows([0]), ""), (0, apps, ""))
    assert snap["driver"]["status"] == gq.STATUS_UNPARSABLE and "pid='lots'" in snap["driver"]["message"]


def test_mig_gpu_idle_limit():
    snap = smi_csv.snapshot_from_outputs((0, HEADER + rows([0], used=59, mig="Enabled") + rows([1]), ""), (0, "", ""))
    mig, plain = snap["gpus"]
    assert mig["mig_mode"] == "Enabled" and gq.mig_enabled(mig) and not gq.mig_enabled(plain)
    assert gq.idle_limit(mig, 16) == gq.DEFAULT_MIG_MAX_USED_MIB and gq.idle_limit(plain, 16) == 16
    assert gq.idle_limit(mig, 16, 64) == 64 and gq.idle_limit(mig, 200, 64) == 200


def test_backend_drops_a_field_an_older_driver_rejects():
    calls = []
    answers = [(2, 'Field "mig.mode.current" is not a valid field to query.\n\n', ""),
               (0, "0, %s, 00000000:16:00.0, 143771, 614, 0, 143157, NVIDIA H200\n" % UUIDS[0], ""), (0, "", "")]

    def runner(argv):
        calls.append(argv)
        return answers.pop(0)

    snap = gpu_backends.NvidiaSmiBackend(runner).snapshot()
    assert snap["driver"]["ok"] and snap["gpus"][0]["used_mib"] == 0 and snap["gpus"][0]["mig_mode"] is None
    assert "mig.mode.current" not in calls[1][1] and "memory.reserved" in calls[1][1]
