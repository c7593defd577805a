"""CPU self-tests of the GPU kit (not marked ``gpu``: they run in the normal CI suite).

They cover what can be proven without a GPU: run.sh's argument handling and
its refusal without a GPU, capture masking, the shape comparison (simulator
on both sides, doctored inputs, the real binary's rc 9 / rc 12 output
against the simulator's), results.json / summary.md, the holder's allocator
selection, and a full rehearsal of the real checks against the simulator
(``run.sh --sim``).

Every process started here is stopped by PID.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time

import pytest

KIT_DIR = os.path.dirname(os.path.abspath(__file__))
if KIT_DIR not in sys.path:
    sys.path.insert(0, KIT_DIR)

import mask as M  # noqa: E402 - after tests/gpu is put on sys.path
from gpukit import CAPTURES_DIR, REPO, ensure_collection_link, gpu_query  # noqa: E402 - after tests/gpu is put on sys.path
from gpukit import ansible_run as AR  # noqa: E402 - after tests/gpu is put on sys.path
from gpukit import gpu as G  # noqa: E402 - after tests/gpu is put on sys.path
from gpukit import queries as Q  # noqa: E402 - after tests/gpu is put on sys.path
from gpukit import results as R  # noqa: E402 - after tests/gpu is put on sys.path
from gpukit import scenario as SC  # noqa: E402 - after tests/gpu is put on sys.path
from gpukit import shape as S  # noqa: E402 - after tests/gpu is put on sys.path
from gpukit.procs import HOLDER, Spawner, is_alive, kill_pids  # noqa: E402 - after tests/gpu is put on sys.path

RUN_SH = os.path.join(KIT_DIR, "run.sh")
UUID_A = "GPU-107f0d10-3c1a-8d2e-9b7f-0123456789ab"
UUID_B = "GPU-a4461f2e-77aa-4e10-b0c1-fedcba987654"


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

def _masker():
    return M.Masker(hostnames=["gpu-node-17.cluster.example.org", "gpu-node-17"], homes=["/home/alice"])


@pytest.fixture(scope="module")
def sim_pair():
    """Two simulated 2 x H200 nodes with different seeds (different UUIDs, same shape)."""
    a = G.SimNode(2, "H200", seed="selftest-a")
    b = G.SimNode(2, "H200", seed="selftest-b")
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def _inproc(node):
    """The fake nvidia-smi called in-process (same output as the script, no interpreter start-up)."""
    from gpusim import smi

    def run(argv):
        return smi.run(list(argv[1:]), env=node.env)
    return run


@pytest.fixture(scope="module")
def sim_captures(sim_pair):
    """Idle captures of every query on both nodes, busy captures with a holder on GPU 0 of each."""
    a, b = sim_pair
    qs = Q.collection_queries()
    busy = Q.busy_queries(qs)
    ca = Q.capture(qs, state="idle", runner=_inproc(a))
    cb = Q.capture(qs, state="idle", runner=_inproc(b))
    a.hold(gpus="0", mib=1024)
    b.hold(gpus="0", mib=2048)
    try:
        ca += Q.capture(busy, state="busy", runner=_inproc(a))
        cb += Q.capture(busy, state="busy", runner=_inproc(b))
    finally:
        for node in (a, b):
            kill_pids(node.spawned)
            node.spawned = []
    return qs, busy, ca, cb


def _no_smi_path(tmp_path):
    """A PATH with bash and coreutils but no nvidia-smi."""
    path = "/usr/local/bin:/usr/bin:/bin"
    if shutil.which("nvidia-smi", path=path):
        pytest.skip("this machine has nvidia-smi in /usr/bin or /bin")
    return path


def _stub_smi(tmp_path, capture_file, rc):
    """An nvidia-smi stand-in that prints a checked-in capture and exits ``rc``."""
    d = tmp_path / "stubbin"
    d.mkdir(exist_ok=True)
    stub = d / "nvidia-smi"
    stub.write_text("#!/bin/sh\ncat '%s'\nexit %d\n" % (capture_file, rc))
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    return str(d)


def _run_sh(args, env=None, timeout=120):
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.run(["bash", RUN_SH] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env=full, timeout=timeout, check=False, universal_newlines=True)


# ---------------------------------------------------------------------------
# mask.py
# ---------------------------------------------------------------------------

def test_mask_uuids_consistently_across_captures():
    m = _masker()
    gpu = "0, %s, 00000000:18:00.0, 81559 MiB\n1, %s, 00000000:2A:00.0, 81559 MiB\n" % (UUID_A, UUID_B)
    apps = "%s, 4242, 70000 MiB, /usr/bin/python3\n" % UUID_B.upper()
    lst = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: %s)\n" % UUID_A
    mg, ma, ml = m.mask(gpu), m.mask(apps), m.mask(lst)
    fake_b = mg.splitlines()[1].split(", ")[1]
    assert fake_b.startswith("GPU-6d61736b-") and fake_b != UUID_B
    assert ma.startswith(fake_b + ", 4242")                      # same UUID (other case) -> same fake
    assert mg.splitlines()[0].split(", ")[1] in ml               # -L refers to the same fake
    assert UUID_A not in mg + ml and UUID_B.upper() not in ma
    assert m.uuid_count == 2


def test_mask_keeps_shape_and_is_idempotent():
    m = _masker()
    text = "0, %s, 00000000:18:00.0, 143771 MiB, 530 MiB, 1 MiB, 143240 MiB, NVIDIA H200\n" % UUID_A
    once = m.mask(text)
    assert S.shape_of("query-gpu", [], ("csv", "noheader"), 0, once) == S.shape_of("query-gpu", [], ("csv", "noheader"), 0, text)
    assert m.mask(once) == once
    assert M.Masker(hostnames=[], homes=[]).mask(once) == once   # a fresh masker keeps fakes too


def test_mask_serials_hostnames_and_home():
    m = _masker()
    text = ("serial 1654922001234 on gpu-node-17.cluster.example.org (gpu-node-17), "
            "/home/alice/venv/bin/python3, pid 1328667, 143771 MiB, 2026/01/02 03:04:05.678\n")
    out = m.mask(text)
    assert "1654922001234" not in out and "9000000000001" in out
    assert "gpu-node-17" not in out and out.count(M.MASKED_HOST) == 2
    assert "/home/alice" not in out and "/home/masked-user/venv/bin/python3" in out
    assert "pid 1328667, 143771 MiB, 2026/01/02 03:04:05.678" in out      # PIDs, figures, times kept
    assert m.leaks(text) and m.leaks(out) == []


def test_mask_does_not_touch_words_containing_the_hostname():
    m = M.Masker(hostnames=["gpu"], homes=[])
    text = "gpu_uuid, pid, used_gpu_memory [MiB], process_name\ngpu\n"
    assert m.mask(text) == "gpu_uuid, pid, used_gpu_memory [MiB], process_name\nmasked-host\n"


def test_mask_trivial_hostnames_ignored_and_cli(tmp_path):
    assert M.Masker(hostnames=["localhost", ""], homes=["/root", "/"]).hostnames == []
    f = tmp_path / "cap.txt"
    f.write_text("GPU 0: NVIDIA H200 (UUID: %s)\n" % UUID_A)
    run = subprocess.run([sys.executable, os.path.join(KIT_DIR, "mask.py"), "--check", str(f)],
                         stdout=subprocess.PIPE, universal_newlines=True, check=False)
    assert run.returncode == 1 and "uuid: " + UUID_A in run.stdout
    run = subprocess.run([sys.executable, os.path.join(KIT_DIR, "mask.py"), str(f)],
                         stdout=subprocess.PIPE, universal_newlines=True, check=False)
    assert run.returncode == 0 and "GPU-6d61736b-0000-0000-0000-000000000000" in run.stdout


def test_mask_obj_masks_nested_structures():
    m = _masker()
    obj = {"uuid": UUID_A, "list": [UUID_A, {"host": "gpu-node-17"}], "n": 3}
    out = m.mask_obj(obj)
    assert out["uuid"] == out["list"][0] != UUID_A and out["list"][1]["host"] == M.MASKED_HOST and out["n"] == 3


# ---------------------------------------------------------------------------
# queries.py
# ---------------------------------------------------------------------------

def test_queries_are_derived_from_the_collection_backend():
    gq = gpu_query()
    backend = gq.NvidiaSmiBackend(runner=None)
    qs = Q.collection_queries()
    argvs = [q.argv for q in qs]
    assert backend.query_gpu_argv() in argvs and backend.query_apps_argv() in argvs
    slugs = [q.slug for q in qs]
    assert len(slugs) == len(set(slugs))
    for kind in ("query-gpu", "query-apps"):
        fmts = set(q.fmt for q in qs if q.kind == kind and q.select is None and "noreserved" not in q.slug)
        assert fmts == set(Q.FORMAT_VARIANTS)
    assert "list-gpus" in slugs and "query-gpu_csv-nounits_i0" in slugs and "query-apps_csv-nounits_i0" in slugs
    noreserved = [q for q in qs if "noreserved" in q.slug][0]
    assert "memory.reserved" not in noreserved.fields and tuple(gq.GPU_FIELDS_NO_RESERVED) == noreserved.fields
    assert Q.collection_argvs() == [backend.query_gpu_argv(), backend.query_apps_argv()]


def test_describe_argv_and_names():
    kind, fields, fmt, select = Q.describe_argv(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader",
                                                 "-i", "GPU-ab"])
    assert (kind, fields, fmt, select) == ("query-gpu", ("index", "uuid"), ("csv", "noheader"), "GPU-ab")
    assert Q.query_slug(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv", "--id=0,1"]) == "query-gpu-noreserved_csv_i0-1"
    assert Q.model_slug("NVIDIA H100 80GB HBM3") == "h100-80gb-hbm3" and Q.model_slug("NVIDIA H200") == "h200"
    assert Q.capture_name("h200", "idle", "list-gpus") == "h200-idle-list-gpus.txt"
    assert Q.capture_name("no-driver", None, "list-gpus") == "no-driver-list-gpus.txt"


def test_write_captures_masks_and_merges_manifest(tmp_path, sim_captures):
    caps = [c for c in sim_captures[2] if c["state"] == "idle"]
    m = _masker()
    entries = Q.write_captures(caps, str(tmp_path), "h200", m, {"model": "H200", "gpu_count": 2})
    assert len(entries) == len(caps)
    again = Q.write_captures(caps[:2], str(tmp_path), "h200", m, {"model": "H200"})
    manifest = Q.load_manifest(str(tmp_path))
    assert len(manifest["captures"]) == len(caps) and len(again) == 2      # replaced, not duplicated
    for e in manifest["captures"]:
        text = Q.read_capture(e, str(tmp_path))
        assert M.Masker(hostnames=[], homes=[]).leaks(text) == []
        assert e["argv"][0] == "nvidia-smi" and e["masked"] is True
    lst = Q.read_capture({"file": "h200-idle-list-gpus.txt"}, str(tmp_path))
    gpu = Q.read_capture({"file": "h200-idle-query-gpu_csv.txt"}, str(tmp_path))
    assert [line.split("UUID: ")[1].rstrip(")") for line in lst.splitlines()] == \
        [line.split(", ")[1] for line in gpu.splitlines()[1:]]               # cross-references survive


# ---------------------------------------------------------------------------
# shape.py
# ---------------------------------------------------------------------------

def test_fidelity_simulator_on_both_sides_has_no_differences(sim_captures, sim_pair):
    qs, busy, ca, cb = sim_captures
    diffs = S.compare_captures(ca, cb, names=("a", "b"))
    assert len(diffs) == len(qs) + len(busy)
    assert {k: v for k, v in diffs.items() if v} == {}
    busy_apps = [c for c in ca if c["state"] == "busy" and c["slug"] == "query-apps_csv"][0]
    assert S.shape_of_capture(busy_apps)["rows"] == 1
    # One subprocess run of the fake binary has the in-process output's shape.
    a = sim_pair[0]
    sub = Q.capture([q for q in qs if q.slug == "query-gpu_csv"], env=a.env, state="idle")[0]
    inproc = [c for c in ca if c["slug"] == "query-gpu_csv" and c["state"] == "idle"][0]
    assert S.compare(S.shape_of_capture(sub), S.shape_of_capture(inproc)) == []


GPU_OUT = ("index, uuid, pci.bus_id, memory.total [MiB], memory.reserved [MiB], memory.used [MiB], memory.free [MiB], name\n"
           "0, GPU-6d61736b-0000-0000-0000-000000000000, 00000000:18:00.0, 143771 MiB, 530 MiB, 1 MiB, 143240 MiB, NVIDIA H200\n"
           "1, GPU-6d61736b-0000-0000-0000-000000000001, 00000000:2A:00.0, 143771 MiB, 530 MiB, 1 MiB, 143240 MiB, NVIDIA H200\n")
GPU_FIELDS = ("index", "uuid", "pci.bus_id", "memory.total", "memory.reserved", "memory.used", "memory.free", "name")
APPS_OUT = ("gpu_uuid, pid, used_gpu_memory [MiB], process_name\n"
            "GPU-6d61736b-0000-0000-0000-000000000000, 4242, 1530 MiB, /usr/bin/python3.11\n")
APPS_FIELDS = ("gpu_uuid", "pid", "used_gpu_memory", "process_name")

DOCTORED = [
    # (name, kind, original, doctored, expected words in a difference)
    ("no space after comma", "query-gpu", GPU_OUT, GPU_OUT.replace(", ", ",", 3), "separators"),
    ("unit MB instead of MiB", "query-gpu", GPU_OUT, GPU_OUT.replace(" MiB,", " MB,"), "value class"),
    ("header unit dropped", "query-gpu", GPU_OUT, GPU_OUT.replace("memory.used [MiB]", "memory.used"), "header token 5"),
    ("columns swapped", "query-gpu", GPU_OUT, GPU_OUT.replace("index, uuid", "uuid, index", 1), "header token 0"),
    ("header missing", "query-gpu", GPU_OUT, "\n".join(GPU_OUT.splitlines()[1:]) + "\n", "header present"),
    ("placeholder for used", "query-gpu", GPU_OUT, GPU_OUT.replace(", 1 MiB,", ", [N/A],", 1), "placeholder"),
    ("CRLF line endings", "query-gpu", GPU_OUT, GPU_OUT.replace("\n", "\r\n"), "CRLF"),
    ("no trailing newline", "query-gpu", GPU_OUT, GPU_OUT.rstrip("\n"), "trailing newline"),
    ("extra blank line", "query-gpu", GPU_OUT, GPU_OUT + "\n", "blank lines"),
    ("row missing", "query-gpu", GPU_OUT, "\n".join(GPU_OUT.splitlines()[:2]) + "\n", "row count"),
    ("upper-case uuid", "query-gpu", GPU_OUT,
     GPU_OUT.replace("GPU-6d61736b-0000-0000-0000-000000000000", "GPU-6D61736B-0000-0000-0000-000000000000"),
     "value class of uuid"),
    ("4-digit bus id domain", "query-gpu", GPU_OUT, GPU_OUT.replace("00000000:18", "0000:18"), "value class of pci.bus_id"),
    ("apps unit in nounits", "query-apps", APPS_OUT, APPS_OUT.replace("1530 MiB", "1530"), "unit suffix"),
    ("apps name column moved", "query-apps", APPS_OUT,
     APPS_OUT.replace("pid, used_gpu_memory [MiB], process_name", "pid, process_name, used_gpu_memory [MiB]"),
     "header token"),
    ("driver message", "query-gpu", GPU_OUT, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
                                             "driver. Make sure that the latest NVIDIA driver is installed and running.\n\n",
     "message lines"),
]


@pytest.mark.parametrize("name,kind,original,doctored,word", DOCTORED, ids=[d[0] for d in DOCTORED])
def test_shape_comparison_finds_doctored_differences(name, kind, original, doctored, word):
    fields = GPU_FIELDS if kind == "query-gpu" else APPS_FIELDS
    a = S.shape_of(kind, fields, ("csv",), 0, original)
    b = S.shape_of(kind, fields, ("csv",), 0, doctored)
    assert S.compare(a, a) == []
    diffs = S.compare(a, b)
    assert diffs, name
    assert any(word in d for d in diffs), diffs


def test_shape_comparison_exit_code_stderr_and_list_templates():
    a = S.shape_of("list", (), (), 0, "GPU 0: NVIDIA H200 (UUID: GPU-6d61736b-0000-0000-0000-000000000000)\n")
    b = S.shape_of("list", (), (), 0, "GPU 0: NVIDIA H200 (UUID: GPU-6D61736B-0000-0000-0000-000000000000)\n")
    c = S.shape_of("list", (), (), 9, "GPU 0: NVIDIA H200 (UUID: GPU-6d61736b-0000-0000-0000-000000000000)\n", "warn")
    assert S.compare(a, a) == []
    assert any("templates" in d for d in S.compare(a, b))
    assert any("exit code" in d for d in S.compare(a, c)) and any("stderr" in d for d in S.compare(a, c))
    # process lists differ between machines: rows are not compared for query-apps
    two = APPS_OUT + APPS_OUT.splitlines()[1].replace("4242", "4343") + "\n"
    sa = S.shape_of("query-apps", APPS_FIELDS, ("csv",), 0, APPS_OUT)
    sb = S.shape_of("query-apps", APPS_FIELDS, ("csv",), 0, two)
    assert S.compare(sa, sb, compare_rows=False) == [] and S.compare(sa, sb) != []


def test_shape_of_process_name_with_commas():
    out = APPS_OUT.replace("/usr/bin/python3.11", "chrome --type=gpu, --flags=a,b")
    s = S.shape_of("query-apps", APPS_FIELDS, ("csv",), 0, out)
    assert s["column_classes"][3] == ["text"] and s["columns"] == 4


@pytest.mark.parametrize("state,source,rc", [("unload", "no-driver", 9), ("nolib", "no-library", 12)])
def test_simulator_error_output_matches_the_real_binary(sim_pair, state, source, rc):
    """The checked-in real rc 9 / rc 12 captures against the simulator's, byte for byte and by shape."""
    b = sim_pair[1]
    entries = [e for e in Q.load_manifest()["captures"] if e["source"] == source]
    if not entries:
        pytest.skip("no %s captures checked in (run tests/gpu/make_error_captures.sh)" % source)
    b.gpusim(["driver", state])
    try:
        for e in entries:
            real = dict(e, stdout=Q.read_capture(e))
            rc_sim, out, err = _inproc(b)(e["argv"])
            sim = dict(e, rc=rc_sim, stdout=out, stderr=err)
            assert real["rc"] == rc
            assert S.compare(S.shape_of_capture(real), S.shape_of_capture(sim)) == [], e["file"]
            assert out == real["stdout"], e["file"]
    finally:
        b.gpusim(["driver", "load"])


# ---------------------------------------------------------------------------
# results.py
# ---------------------------------------------------------------------------

def test_results_json_and_markdown(tmp_path):
    m = _masker()
    res = R.Results(str(tmp_path / "out"), masker=m, mode="real")
    res.set_env(gpu={"count": 8, "name": "NVIDIA H200", "model": "H200", "uuid": UUID_A}, driver_version="535.261.03",
                allocator="cuda", host="gpu-node-17")
    res.check("format_fidelity", "passed", 1.234, "all good", {"uuid": UUID_A})
    res.check("teardown", "failed", 2.0, "GPU 0 used 512 MiB | still", {})
    res.check("teardown", "failed", 2.5, "replaced", {})
    res.check("release_latency", "skipped", 0, "busy", {})
    res.measure("idle_used_mib", 1)
    res.measure("release_latency", {"mib": 10240, "samples": [{"free_s": 0.5}], "median_s": 0.5, "max_s": 0.5,
                                    "median_exit_s": 0.01})
    res.measure("nvml_vs_smi", {"same": True, "nvml_ms_median": 0.4, "smi_ms_median": 80.0, "polls": 20})
    res.set_fidelity({"query-gpu_csv@idle": [], "query-apps_csv@busy": ["header token 2: real='a' sim='b'"]})
    json_path, md_path = res.finish()
    data = json.load(open(json_path))
    assert data["format"] == R.FORMAT and data["mode"] == "real" and data["finished_at"]
    assert data["summary"] == {"passed": 1, "failed": 1, "skipped": 1, "error": 0}
    assert [c["name"] for c in data["checks"]] == ["format_fidelity", "teardown", "release_latency"]
    text = open(json_path).read() + open(md_path).read()
    assert UUID_A not in text and "gpu-node-17" not in text
    md = open(md_path).read()
    assert md.startswith("# GPU validation kit: FAILED")
    assert "| teardown | failed | 2.5 | replaced |" in md
    assert "idle memory.used on GPU 0: 1 MiB" in md and "median 0.500 s" in md
    assert "1 with differences" in md and "header token 2" in md
    assert not res.ok
    with pytest.raises(ValueError):
        res.check("x", "bogus")


def test_results_written_incrementally(tmp_path):
    res = R.Results(str(tmp_path), mode="sim")
    res.check("a", "passed", 1)
    res.write()
    data = json.load(open(tmp_path / "results.json"))
    assert data["finished_at"] is None and data["summary"]["passed"] == 1
    assert "NOTHING RAN" in R.render_markdown({"summary": {}}) and res.ok


# ---------------------------------------------------------------------------
# gpu.py, holder.py, procs.py
# ---------------------------------------------------------------------------

def test_detect_without_nvidia_smi(tmp_path):
    info = G.detect(env={"PATH": _no_smi_path(tmp_path)})
    assert not info.ok and info.reason == "no NVIDIA GPU: nvidia-smi not found on PATH"


def test_detect_with_the_real_rc9_output(tmp_path):
    cap = os.path.join(CAPTURES_DIR, "no-driver-list-gpus.txt")
    if not os.path.exists(cap):
        pytest.skip("no-driver capture missing")
    info = G.detect(env={"PATH": _stub_smi(tmp_path, cap, 9) + ":/usr/bin:/bin"})
    assert not info.ok and info.rc == 9
    assert info.reason.startswith("no NVIDIA GPU: nvidia-smi -L exited 9: NVIDIA-SMI has failed")


def test_detect_empty_list_and_simulator(tmp_path, sim_pair):
    empty = tmp_path / "empty.txt"
    empty.write_text("No devices found.\n")
    info = G.detect(env={"PATH": _stub_smi(tmp_path, str(empty), 0) + ":/usr/bin:/bin"})
    assert not info.ok and "listed no GPU" in info.reason
    a = sim_pair[0]
    info = G.detect(env=a.env)
    assert info.ok and info.count == 2 and info.model == "H200" and info.name == "NVIDIA H200"
    assert G.sim_model("NVIDIA H100 80GB HBM3") == "H100" and G.sim_model("NVIDIA H200 NVL") == "H200"
    assert G.sim_model("NVIDIA A100-SXM4-80GB") is None and G.sim_model(None) is None
    assert G.parse_list("GPU 0: X (UUID: GPU-1)\n  MIG 1g.10gb Device 0: (UUID: MIG-2)\n") == \
        [{"index": 0, "name": "X", "uuid": "GPU-1"}]


def test_holder_probe_reports_missing_cuda():
    try:
        import ctypes
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("libcuda.so.1 is present here")
    except OSError:
        pass
    run = subprocess.run([sys.executable, HOLDER, "--role", "probe", "--allocator", "cuda"], stdout=subprocess.PIPE,
                         universal_newlines=True, check=False)
    res = json.loads(run.stdout)
    assert run.returncode == 3 and not res["ok"] and "libcuda.so.1 cannot be loaded" in res["error"]
    env = dict(os.environ, PYTHONPATH="")
    run = subprocess.run([sys.executable, "-S", HOLDER, "--role", "probe", "--allocator", "auto"],
                         stdout=subprocess.PIPE, universal_newlines=True, check=False, env=env)
    res = json.loads(run.stdout)
    assert run.returncode == 3 and all(n + ":" in res["error"] for n in ("cuda", "cupy", "torch"))


FAKE_LIBCUDA = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
typedef unsigned long long CUdeviceptr;
static void note(const char *what, unsigned long long v) {
    const char *p = getenv("FAKE_CUDA_LOG"); FILE *f;
    if (!p || !(f = fopen(p, "a"))) return;
    fprintf(f, "%d %s %llu\n", (int)getpid(), what, v); fclose(f);
}
int cuInit(unsigned int flags) { note("cuInit", flags); return 0; }
int cuDeviceGet(int *dev, int ordinal) { *dev = ordinal; note("cuDeviceGet", ordinal); return 0; }
int cuDeviceGetName(char *name, int len, int dev) { strncpy(name, "Fake H200", len); return 0; }
int cuDeviceGetUuid(unsigned char *uuid, int dev) { int i; for (i = 0; i < 16; i++) uuid[i] = 0x10 + i; return 0; }
int cuDevicePrimaryCtxRetain(void **ctx, int dev) { *ctx = (void *)0x1234; return 0; }
int cuCtxSetCurrent(void *ctx) { note("cuCtxSetCurrent", (unsigned long long)ctx); return 0; }
int cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    note("cuMemAlloc_v2", n); if (n > ((size_t)1 << 40)) return 2; *p = 0x7f0000000000ULL; return 0; }
int cuMemsetD8_v2(CUdeviceptr p, unsigned char v, size_t n) { note("cuMemsetD8_v2", n); return p == 0x7f0000000000ULL ? 0 : 1; }
int cuCtxSynchronize(void) { return 0; }
int cuMemFree_v2(CUdeviceptr p) { note("cuMemFree_v2", p); return 0; }
int cuGetErrorString(int e, const char **s) { *s = e == 2 ? "out of memory" : "unknown error"; return 0; }
"""


@pytest.fixture(scope="module")
def fake_libcuda(tmp_path_factory):
    """A stand-in libcuda.so.1 (compiled here) that logs the driver-API calls the ctypes allocator makes."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler to build the fake libcuda.so.1")
    d = tmp_path_factory.mktemp("fakecuda")
    (d / "fake.c").write_text(FAKE_LIBCUDA)
    run = subprocess.run([cc, "-shared", "-fPIC", "-o", str(d / "libcuda.so.1"), str(d / "fake.c")],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, check=False)
    if run.returncode != 0:
        pytest.skip("cannot build the fake libcuda.so.1: %s" % run.stdout[-500:])
    return d


def test_holder_ctypes_allocator_against_a_fake_libcuda(fake_libcuda, tmp_path):
    log = tmp_path / "cuda.log"
    env = dict(os.environ, LD_LIBRARY_PATH=str(fake_libcuda), FAKE_CUDA_LOG=str(log))
    run = subprocess.run([sys.executable, HOLDER, "--role", "probe", "--allocator", "auto"], stdout=subprocess.PIPE,
                         universal_newlines=True, check=False, env=env)
    res = json.loads(run.stdout)
    assert run.returncode == 0 and res == {"ok": True, "allocator": "cuda", "device_name": "Fake H200",
                                           "device_uuid": "GPU-10111213-1415-1617-1819-1a1b1c1d1e1f"}
    calls = [line.split(" ", 1)[1] for line in log.read_text().splitlines()]
    assert calls == ["cuInit 0", "cuDeviceGet 0", "cuCtxSetCurrent 4660", "cuMemAlloc_v2 67108864",
                     "cuMemsetD8_v2 67108864", "cuMemFree_v2 %d" % 0x7f0000000000]
    run = subprocess.run([sys.executable, HOLDER, "--role", "child", "--allocator", "cuda", "--mib", "2000000"],
                         stdout=subprocess.PIPE, universal_newlines=True, check=False, env=env)
    res = json.loads(run.stdout)
    assert run.returncode == 3 and res["error"] == "cuMemAlloc(2000000 MiB) failed: CUDA error 2 out of memory"


def test_holder_parent_child_keeper_with_the_ctypes_allocator(fake_libcuda, tmp_path):
    log = tmp_path / "cuda.log"
    env = dict(os.environ, LD_LIBRARY_PATH=str(fake_libcuda), FAKE_CUDA_LOG=str(log))
    with Spawner(allocator="cuda", env=env, visible="GPU-10111213-1415-1617-1819-1a1b1c1d1e1f") as sp:
        parent = sp.start("parent", mib=100, child_mib=10, keeper=True, ignore_sigterm=True)
        pids = parent.pids()
        assert len(set(pids)) == 3 and all(is_alive(p) for p in pids)
        assert parent.info["allocator"] == "cuda" and parent.info["child"]["mib"] == 10
        lines = log.read_text().splitlines()
        inits = sorted(int(line.split()[0]) for line in lines if " cuInit " in line)
        assert inits == sorted([parent.pid, parent.child_pid])           # the keeper never calls CUDA
        allocs = [line for line in lines if "cuMemAlloc_v2" in line]
        assert "%d cuMemAlloc_v2 %d" % (parent.pid, 100 * 1024 * 1024) in allocs
        assert "%d cuMemAlloc_v2 %d" % (parent.child_pid, 10 * 1024 * 1024) in allocs
        with open("/proc/%d/environ" % parent.child_pid, "rb") as fh:
            assert b"CUDA_VISIBLE_DEVICES=GPU-10111213-1415-1617-1819-1a1b1c1d1e1f" in fh.read()
        os.kill(parent.pid, signal.SIGTERM)                              # ignored
        time.sleep(0.3)
        assert is_alive(parent.pid)
    assert not any(is_alive(p) for p in pids)


def test_holder_on_the_simulator_with_child_keeper_and_decoys(sim_pair):
    a = sim_pair[0]
    with Spawner(allocator="gpusim", env=a.env) as sp:
        decoy = sp.start("decoy")
        parent = sp.start("parent", mib=3000, child_mib=1000, keeper=True)
        pids = parent.pids()
        assert len(pids) == 3 and all(is_alive(p) for p in pids) and is_alive(decoy.pid)
        status = json.loads(a.gpusim(["status"]))
        held = {h["pid"]: h for h in status["holds"]}
        assert held[parent.pid]["mib"] == 3000 and held[parent.child_pid]["mib"] == 1000
        assert [k["pid"] for k in held[parent.pid]["keepers"]] == [parent.keeper_pid]
        assert status["gpus"][0]["used_mib"] == 4001
        all_pids = sp.all_pids()
    assert not any(is_alive(p) for p in all_pids)


def test_holder_failure_is_reported(sim_pair):
    a = sim_pair[0]
    with Spawner(allocator="gpusim", env=a.env) as sp:
        with pytest.raises(RuntimeError, match="gpusim hold of 999999 MiB failed"):
            sp.start("parent", mib=999999)


# ---------------------------------------------------------------------------
# scenario.py pieces, ansible_run.py
# ---------------------------------------------------------------------------

def _snap(used=1, procs=(), name="NVIDIA H200"):
    return {"gpus": [{"index": 0, "uuid": "GPU-x", "name": name, "bus_id": "00000000:18:00.0", "total_mib": 143771,
                      "used_mib": used, "free_mib": 143771 - 530 - used, "reserved_mib": 530,
                      "processes": [{"pid": p, "used_mib": m} for p, m in procs]}]}


def test_compare_snapshots():
    assert SC.compare_snapshots(_snap(), _snap(used=2)) == []                      # within 2 MiB
    diffs = SC.compare_snapshots(_snap(used=1, procs=[(1, 10)]), _snap(used=600, procs=[(2, 10)], name="Y"))
    assert any("used_mib" in d for d in diffs) and any("processes" in d for d in diffs) and any("name" in d for d in diffs)


def test_parse_problems_and_memory_arithmetic():
    good = {"kind": "query-gpu", "fields": list(GPU_FIELDS), "rc": 0, "stdout": GPU_OUT, "stderr": "", "select": None}
    assert SC.parse_problems(good, 2) == []
    assert SC.parse_problems(good, 3) == ["2 GPU rows parsed, expected 3"]
    assert SC.memory_arithmetic(good) == [(0, 143771, 143771), (1, 143771, 143771)]
    bad = dict(good, stdout=GPU_OUT.replace(", 1 MiB,", ", [N/A],", 1))
    assert any("used_mib unknown" in p for p in SC.parse_problems(bad, 2))
    failed = dict(good, rc=9, stdout="NVIDIA-SMI has failed because ...\n\n")
    assert SC.parse_problems(failed, 2)[0].startswith("nvidia-smi exited 9")
    apps = {"kind": "query-apps", "fields": list(APPS_FIELDS), "rc": 0, "stdout": APPS_OUT, "select": None}
    assert SC.parse_problems(apps, 2) == []


class _FakeHolder(object):
    pid = 4242

    def __init__(self):
        self.n = 0

    def poll(self):
        return 0 if self.n >= 2 else None


class _FakePoller(object):
    def __init__(self, holder):
        self.holder = holder

    def poll(self):
        self.holder.n += 1
        n = self.holder.n
        return (10241 if n < 4 else 1), ([4242] if n < 3 else [])


def test_measure_release_orders_the_events():
    h = _FakeHolder()
    s = SC.measure_release(_FakePoller(h), h, threshold=17, kill=False, timeout=5)
    assert s["exit_s"] is not None and s["unlisted_s"] is not None and s["free_s"] is not None
    assert s["exit_s"] <= s["unlisted_s"] <= s["free_s"] and s["polls"] == 4


def test_parse_ansible_output_and_collection_link():
    out = 'localhost | SUCCESS => {\n    "changed": false,\n    "gpus": []\n}\n'
    assert AR.parse_adhoc_output(out) == {"changed": False, "gpus": []}
    out = 'noise\nlocalhost | FAILED! => {"failed": true, "msg": "x => y"}\ntrailing text\n'
    assert AR.parse_adhoc_output(out) == {"failed": True, "msg": "x => y"}
    assert AR.parse_adhoc_output("otherhost | SUCCESS => {}") is None
    out = 'warning\n{"plays": [{"tasks": [{"hosts": {"localhost": {"changed": false, "gpus": []}}}]}]}'
    assert AR.parse_adhoc_output(out) == {"changed": False, "gpus": []}          # json callback, if configured
    assert AR.parse_json_callback("no json") is None and AR.parse_json_callback("{bad") is None
    link = os.path.join(ensure_collection_link(), "ansible_collections", "gpufleet", "sglang")
    assert os.path.realpath(link) == os.path.realpath(REPO)


# ---------------------------------------------------------------------------
# run.sh and kit.py
# ---------------------------------------------------------------------------

def test_run_sh_help():
    run = _run_sh(["--help"])
    assert run.returncode == 0
    for opt in ("--out", "--skip-install", "--self-test", "--sim", "--allocator", "Exit codes"):
        assert opt in run.stdout


@pytest.mark.parametrize("args,word", [
    (["--bogus"], "unknown argument '--bogus'"),
    (["--out"], "--out needs a directory"),
    (["--out="], "--out needs a directory"),
    (["--mib", "ten"], "--mib must be a whole number"),
    (["--allocator", "opencl"], "--allocator must be"),
    (["--self-test", "--sim"], "exclusive"),
])
def test_run_sh_usage_errors(args, word):
    run = _run_sh(args)
    assert run.returncode == 2 and word in run.stderr


def test_run_sh_refuses_without_a_gpu(tmp_path):
    out = tmp_path / "out"
    run = _run_sh(["--out", str(out), "--skip-install"], env={"PATH": _no_smi_path(tmp_path)})
    assert run.returncode == 3
    assert "run.sh: no NVIDIA GPU: nvidia-smi not found on PATH" in run.stderr and "--self-test" in run.stderr
    assert not out.exists()                                      # refused before writing anything


@pytest.mark.parametrize("capture,rc,word", [("no-driver-list-gpus.txt", 9, "exited 9: NVIDIA-SMI has failed"),
                                             ("no-library-list-gpus.txt", 12, "exited 12: NVIDIA-SMI couldn't find")])
def test_run_sh_refuses_with_a_failing_nvidia_smi(tmp_path, capture, rc, word):
    cap = os.path.join(CAPTURES_DIR, capture)
    if not os.path.exists(cap):
        pytest.skip("%s not checked in" % capture)
    run = _run_sh(["--skip-install"], env={"PATH": _stub_smi(tmp_path, cap, rc) + ":" + _no_smi_path(tmp_path)})
    assert run.returncode == 3 and word in run.stderr


def test_run_sh_real_mode_needs_an_allocator(tmp_path, sim_pair):
    """A GPU is listed (the simulator's nvidia-smi) but nothing can allocate CUDA memory: rc 4."""
    try:
        import ctypes
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("libcuda.so.1 is present here")
    except OSError:
        pass
    a = sim_pair[0]
    run = _run_sh(["--skip-install", "--out", str(tmp_path / "out")], env=a.env)
    assert run.returncode == 4, run.stdout + run.stderr
    assert "2 GPU(s): NVIDIA H200" in run.stdout and "no way to allocate GPU memory: " in run.stderr
    assert "libcuda.so.1 cannot be loaded" in run.stderr


def test_run_sh_real_mode_reaches_the_checks(tmp_path, sim_pair, fake_libcuda):
    """With an allocator, run.sh runs the gpu-marked checks in real mode and writes results (here: one check)."""
    a = sim_pair[0]
    env = dict(a.env, LD_LIBRARY_PATH=str(fake_libcuda))
    out = tmp_path / "out"
    run = _run_sh(["--skip-install", "--out", str(out), "--no-update-captures", "--",
                   "-k", "test_nvml_matches_nvidia_smi"], env=env, timeout=300)
    assert 'allocator: {"ok": true, "allocator": "cuda", "device_name": "Fake H200"' in run.stdout, run.stdout
    data = json.load(open(out / "results.json"))
    assert data["mode"] == "real" and data["environment"]["gpu"]["count"] == 2
    assert [c["name"] for c in data["checks"]] == ["nvml_vs_nvidia_smi"]
    # pynvml is not in the dev venv (skipped), or cannot reach a driver (failed): never a pass here.
    assert run.returncode == 1 and data["checks"][0]["status"] in ("skipped", "failed")
    assert (out / "summary.md").exists() and (out / "junit.xml").exists()


def test_run_sh_time_budget(tmp_path):
    run = _run_sh(["--sim", "--out", str(tmp_path / "o")], env={"GPUKIT_BUDGET_S": "20"})
    assert run.returncode == 5 and "time budget" in run.stderr


def test_run_sh_self_test_subset():
    run = _run_sh(["--self-test", "--", "-k", "test_mask_obj_masks_nested_structures"], timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout


def test_kit_py_queries_and_detect(tmp_path):
    run = subprocess.run([sys.executable, os.path.join(KIT_DIR, "kit.py"), "queries"], stdout=subprocess.PIPE,
                         universal_newlines=True, check=False)
    assert run.returncode == 0 and len(run.stdout.splitlines()) == len(Q.collection_queries())
    env = dict(os.environ, PATH=_no_smi_path(tmp_path))
    run = subprocess.run([sys.executable, os.path.join(KIT_DIR, "kit.py"), "detect"], stdout=subprocess.PIPE,
                         universal_newlines=True, check=False, env=env)
    assert run.returncode == 3 and json.loads(run.stdout)["ok"] is False


def test_kit_py_merge_captures(tmp_path, sim_captures):
    src, dst = tmp_path / "src", tmp_path / "dst"
    idle = [c for c in sim_captures[2] if c["state"] == "idle"][:3]
    Q.write_captures(idle, str(src), "h200", _masker(), {"source_kind": "real-gpu", "gpu_count": 2})
    Q.write_captures(idle[:1], str(src), "sim-h200", _masker(), {"source_kind": "sim"})
    dst.mkdir()
    kit = os.path.join(KIT_DIR, "kit.py")
    run = subprocess.run([sys.executable, kit, "merge-captures", str(src), "--out", str(dst)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, universal_newlines=True, check=False)
    assert run.returncode == 0 and "merged 3 captures" in run.stdout and "not merging sim-h200" in run.stderr
    assert sorted(e["file"] for e in Q.load_manifest(str(dst))["captures"]) == sorted(
        f.name for f in dst.iterdir() if f.name != Q.MANIFEST)
    # an unmasked capture stops the merge
    first = Q.load_manifest(str(src))["captures"][0]
    (src / first["file"]).write_text("GPU 0: NVIDIA H200 (UUID: %s)\n" % UUID_A)
    run = subprocess.run([sys.executable, kit, "merge-captures", str(src), "--out", str(dst)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, universal_newlines=True, check=False)
    assert run.returncode == 1 and "is not masked" in run.stderr


@pytest.mark.slow
def test_run_sh_sim_rehearsal_end_to_end(tmp_path):
    """run.sh --sim: every real check against the simulator, results and captures written."""
    manifest_before = open(os.path.join(CAPTURES_DIR, Q.MANIFEST)).read() \
        if os.path.exists(os.path.join(CAPTURES_DIR, Q.MANIFEST)) else None
    out = tmp_path / "rehearsal"
    run = _run_sh(["--sim", "--out", str(out), "--mib", "2048"], timeout=340)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    data = json.load(open(out / "results.json"))
    assert data["mode"] == "sim" and data["finished_at"]
    assert data["summary"] == {"passed": 5, "failed": 0, "skipped": 0, "error": 0}, data["checks"]
    names = [c["name"] for c in data["checks"]]
    assert names == ["format_fidelity", "nvml_vs_nvidia_smi", "teardown", "sigterm_escalation", "release_latency"]
    m = data["measurements"]
    assert m["sigterm_escalation"]["signals"] == ["SIGTERM", "SIGKILL"]
    assert m["forked_keeper"]["memory_held_while_keeper_alive"] is True
    assert m["nvml_vs_smi"]["same"] is True and m["idle_used_mib"] == 1
    teardown = [c for c in data["checks"] if c["name"] == "teardown"][0]["details"]
    assert teardown["decoys_alive"] == {"decoy": True, "nvml_decoy": True}
    assert not any(teardown["holders_alive"].values())
    assert (out / "summary.md").read_text().startswith("# GPU validation kit: PASSED")
    caps = Q.load_manifest(str(out / "captures"))["captures"]
    assert caps and all(c["file"].startswith("sim-h200-") for c in caps)
    after = open(os.path.join(CAPTURES_DIR, Q.MANIFEST)).read() \
        if os.path.exists(os.path.join(CAPTURES_DIR, Q.MANIFEST)) else None
    assert after == manifest_before                              # the rehearsal never touches tests/gpu/captures
    # The CPU unit test of the captures picks up real-GPU-style captures automatically:
    # feed it the checked-in ones plus the rehearsal's.
    merged = tmp_path / "captures"
    shutil.copytree(CAPTURES_DIR, str(merged))
    manifest = Q.load_manifest(str(merged))
    for entry in caps:
        shutil.copy(str(out / "captures" / entry["file"]), str(merged / entry["file"]))
    manifest["captures"] = sorted(manifest["captures"] + caps, key=lambda e: e["file"])
    (merged / Q.MANIFEST).write_text(json.dumps(manifest, indent=1))
    unit = os.path.join(REPO, "tests", "unit", "plugins", "module_utils", "test_gpu_captures.py")
    run = subprocess.run([sys.executable, "-m", "pytest", unit, "-q", "-p", "no:cacheprovider", "-rs"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, cwd=REPO,
                         env=dict(os.environ, GPUKIT_CAPTURES_DIR=str(merged)), timeout=300, check=False)
    assert run.returncode == 0, run.stdout[-3000:]
    assert "no real-GPU captures yet" not in run.stdout and " passed" in run.stdout
