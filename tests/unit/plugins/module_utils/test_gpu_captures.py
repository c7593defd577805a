"""Golden nvidia-smi outputs (tests/gpu/captures) through the collection's parser.

Parametrised over ``tests/gpu/captures/manifest.json``, so every capture
there is picked up automatically: today the real 535.261.03 binary's rc 9
(driver missing) and rc 12 (library missing) outputs for every query the
collection makes (tests/gpu/make_error_captures.sh); after the first real
run of tests/gpu/run.sh also the real GPU outputs (``<model>-idle-*``,
``<model>-busy-*``).
"""
from __future__ import annotations

import json
import os
import re
import sys
from collections import defaultdict

import pytest


from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import smi_csv

from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import backends as gpu_backends
from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import query as gq

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
KIT_DIR = os.path.join(REPO, "tests", "gpu")
# GPUKIT_CAPTURES_DIR: only for the kit's own self-test (a rehearsal's captures).
CAPTURES = os.environ.get("GPUKIT_CAPTURES_DIR") or os.path.join(KIT_DIR, "captures")
if KIT_DIR not in sys.path:
    sys.path.insert(0, KIT_DIR)

from mask import Masker  # noqa: E402 - after tests/gpu is put on sys.path

EXPECTED_STATUS = {9: gq.STATUS_NOT_LOADED, 12: gq.STATUS_NO_LIBRARY, 18: gq.STATUS_MISMATCH}
LIST_RE = re.compile(r"^GPU (\d+): (.+) \(UUID: (GPU-[0-9a-f-]+)\)$")


def _manifest():
    path = os.path.join(CAPTURES, "manifest.json")
    if not os.path.exists(path):
        return []
    with open(path, "r", encoding="utf-8") as fh:
        return json.load(fh).get("captures", [])


ENTRIES = _manifest()
FAILURES = [e for e in ENTRIES if e.get("rc") != 0]
SUCCESSES = [e for e in ENTRIES if e.get("rc") == 0]
NO_REAL_GPU = pytest.mark.skip(reason="no real-GPU captures yet: run tests/gpu/run.sh on a machine with an NVIDIA GPU")


def _params(entries, empty_mark):
    if not entries:
        return [pytest.param(None, marks=empty_mark, id="none")]
    return [pytest.param(e, id=e["file"]) for e in entries]


def _text(entry):
    with open(os.path.join(CAPTURES, entry["file"]), "r", encoding="utf-8", newline="") as fh:
        return fh.read()


def _describe(argv):
    kind, fields, fmt, select = None, [], [], None
    for i, a in enumerate(argv):
        if a.startswith("--query-gpu="):
            kind, fields = "query-gpu", a.split("=", 1)[1].split(",")
        elif a.startswith("--query-compute-apps="):
            kind, fields = "query-apps", a.split("=", 1)[1].split(",")
        elif a.startswith("--format="):
            fmt = a.split("=", 1)[1].split(",")
        elif a == "-i" and i + 1 < len(argv):
            select = argv[i + 1]
        elif a == "-L":
            kind = "list"
    return kind, fields, fmt, select


def test_real_binary_error_captures_are_checked_in():
    rcs = set(e["rc"] for e in ENTRIES if e.get("source_kind") == "real-binary-without-gpu")
    assert {9, 12} <= rcs, "run tests/gpu/make_error_captures.sh"
    backend = gpu_backends.NvidiaSmiBackend(runner=None)
    for source in ("no-driver", "no-library"):
        # On 535 the driver check runs before the arguments are read, so a capture of the same query kind and
        # format stands for the collection's current field list (which grew mig.mode.current after the capture).
        kinds = set((e["kind"], tuple(e["format"])) for e in ENTRIES if e["source"] == source)
        for argv in (backend.query_gpu_argv(), backend.query_apps_argv()):
            kind, dummy, fmt, dummy2 = _describe(argv)
            assert (kind, tuple(fmt)) in kinds, (source, argv)


@pytest.mark.parametrize("entry", _params(ENTRIES, pytest.mark.skip(reason="no captures")))
def test_capture_file_matches_manifest_and_is_masked(entry):
    text = _text(entry)
    assert entry["argv"][0] == "nvidia-smi"
    kind, fields, fmt, select = _describe(entry["argv"])
    assert kind == entry["kind"] and fields == list(entry["fields"]) and fmt == list(entry["format"])
    assert select == entry.get("select")
    assert entry["masked"] is True
    # No real UUID or serial may remain (masked UUIDs start with 6d61736b, "mask").
    assert Masker(hostnames=[], homes=[]).leaks(text + entry.get("stderr", "")) == []


@pytest.mark.parametrize("entry", _params(FAILURES, pytest.mark.skip(reason="no failure captures")))
def test_driver_failure_capture_is_recognised(entry):
    out, err, rc = _text(entry), entry.get("stderr", ""), entry["rc"]
    expected = EXPECTED_STATUS[rc]
    failure = smi_csv.detect_driver_failure(rc, out, err)
    assert failure is not None and failure["status"] == expected and failure["fatal"] and failure["hint"]
    assert failure["rc"] == rc
    # The message alone is enough (docs/reference/nvidia-smi.md §1.5: it is on stdout).
    assert smi_csv.detect_driver_failure(255, out, "")["status"] == expected
    # The parsers skip the message lines instead of reading them as rows.
    if entry["kind"] == "query-gpu":
        assert smi_csv.parse_query_gpu(out, entry["fields"]) == ([], [], [])
    elif entry["kind"] == "query-apps":
        assert smi_csv.parse_compute_apps(out, entry["fields"]) == ([], [])
    snap = smi_csv.snapshot_from_outputs((rc, out, err), None)
    assert snap["driver"]["status"] == expected and not snap["driver"]["ok"] and snap["gpus"] == []


@pytest.mark.parametrize("source", sorted(set(e["source"] for e in FAILURES)) or ["none"])
def test_backend_stops_after_a_fatal_capture(source):
    """Replaying the real output for any argv: one nvidia-smi call, a fatal driver status."""
    entries = [e for e in FAILURES if e["source"] == source]
    if not entries:
        pytest.skip("no failure captures")
    by_argv = {tuple(e["argv"]): e for e in entries}
    by_kind = {}
    for e in entries:
        by_kind.setdefault((e["kind"], tuple(e["format"])), e)
    calls = []

    def runner(argv):
        calls.append(list(argv))
        kind, dummy, fmt, dummy2 = _describe(argv)
        e = by_argv.get(tuple(argv)) or by_kind[(kind, tuple(fmt))]     # the driver check comes first (see above)
        return e["rc"], _text(e), e.get("stderr", "")

    snap = gpu_backends.NvidiaSmiBackend(runner, "nvidia-smi").snapshot()
    assert snap["calls"] == 1 and len(calls) == 1
    assert snap["driver"]["status"] == EXPECTED_STATUS[entries[0]["rc"]] and snap["driver"]["fatal"]


def test_error_capture_bytes():
    """The exact layout the fake nvidia-smi copies (docs/reference/nvidia-smi.md §1.5)."""
    for e in FAILURES:
        text = _text(e)
        if e["rc"] == 9:
            assert text.startswith("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
            assert text.endswith("running.\n\n")
        elif e["rc"] == 12:
            lines = text.splitlines()
            assert len(lines) == 2 and lines[0].startswith("NVIDIA-SMI couldn't find libnvidia-ml.so library")
            assert lines[1] == "Please also try adding directory that contains libnvidia-ml.so to your system PATH."


@pytest.mark.parametrize("entry", _params(SUCCESSES, NO_REAL_GPU))
def test_real_gpu_capture_parses(entry):
    text = _text(entry)
    expected = 1 if entry.get("select") is not None else entry.get("gpu_count")
    if entry["kind"] == "query-gpu":
        gpus, lost, anomalies = smi_csv.parse_query_gpu(text, entry["fields"])
        assert anomalies == [] and lost == []
        if expected:
            assert len(gpus) == expected
        assert gpus
        for g in gpus:
            for key in ("index", "uuid", "bus_id", "used_mib", "total_mib", "free_mib", "name"):
                assert g[key] is not None, (key, g["unknown_fields"])
            assert gq.normalize_bus_id(g["bus_id"]) == g["bus_id"]
            if "memory.reserved" in entry["fields"]:
                assert g["reserved_mib"] is not None
    elif entry["kind"] == "query-apps":
        procs, anomalies = smi_csv.parse_compute_apps(text, entry["fields"])
        assert anomalies == []
        for p in procs:
            assert isinstance(p["pid"], int) and p["gpu_uuid"].startswith("GPU-")
        if entry.get("state") == "busy":
            assert procs, "a busy capture lists the kit's holder"
    elif entry["kind"] == "list":
        lines = [line for line in text.splitlines() if line.strip()]
        assert all(LIST_RE.match(line) for line in lines if not line.startswith(" "))
        if expected:
            assert len([line for line in lines if LIST_RE.match(line)]) == expected


def _pairs():
    """(query-gpu entry, query-apps entry) captured together: same source, state, format and -i."""
    groups = defaultdict(dict)
    for e in SUCCESSES:
        if e["kind"] == "query-apps" or (e["kind"] == "query-gpu" and "memory.reserved" in e["fields"]):
            key = (e["source"], e.get("state"), tuple(e["format"]), e.get("select"))
            groups[key][e["kind"]] = e
    return [(g["query-gpu"], g["query-apps"]) for g in groups.values() if len(g) == 2]


@pytest.mark.parametrize("pair", [pytest.param(p, id="%s+%s" % (p[0]["file"], p[1]["slug"])) for p in _pairs()]
                         or [pytest.param(None, marks=NO_REAL_GPU, id="none")])
def test_real_gpu_snapshot_cross_references(pair):
    """Processes attach to their GPUs by (masked) UUID: masking kept the cross-references."""
    gpu_e, apps_e = pair
    snap = smi_csv.snapshot_from_outputs((0, _text(gpu_e), gpu_e.get("stderr", "")),
                                         (0, _text(apps_e), apps_e.get("stderr", "")), gpu_fields=gpu_e["fields"],
                                         app_fields=apps_e["fields"])
    assert snap["driver"]["ok"] and snap["anomalies"] == [] and snap["unmatched_processes"] == []
    if gpu_e.get("state") == "busy":
        assert any(g["processes"] for g in snap["gpus"])
