"""The checkpoint prefetch (module_utils/server/prefetch.py, modules/sglang_prefetch.py).

The residency tests use real files on the repository's file system (disk-backed; a tmpfs file is always resident):
a file written, fsynced and dropped with ``posix_fadvise(DONTNEED)`` has few resident pages, and after the prefetch
all of them. The priority test runs in a child process (the test process must not end up at nice 19).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils.server import prefetch as pf
from ansible_collections.gpufleet.sglang.plugins.modules import sglang_prefetch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "modules"))
from redeploy_testlib import run_module  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
MIB = 1024 * 1024
GIB = 1024 ** 3


def meminfo_file(tmp_path, total_kb, available_kb):
    path = tmp_path / "meminfo"
    path.write_text("MemTotal:       %d kB\nMemFree:         1234 kB\nMemAvailable:   %d kB\nHugePages_Total:       0\n"
                    % (total_kb, available_kb))
    return str(path)


# --------------------------------------------------------------------------
# Budget
# --------------------------------------------------------------------------

def test_meminfo_is_read_in_bytes(tmp_path):
    info = pf.read_meminfo(meminfo_file(tmp_path, 100 * 1024 * 1024, 60 * 1024 * 1024))
    assert info["MemTotal"] == 100 * GIB and info["MemAvailable"] == 60 * GIB and info["HugePages_Total"] == 0


def test_budget_is_available_memory_less_the_larger_reserve(tmp_path):
    info = pf.read_meminfo(meminfo_file(tmp_path, 100 * 1024 * 1024, 60 * 1024 * 1024))
    # 10% of 100 GiB = 10 GiB is larger than 4 GiB.
    assert pf.budget(info, reserve_gb=4, reserve_percent=10) == (50 * GIB, 10 * GIB)
    # 25 GiB is larger than 10%.
    assert pf.budget(info, reserve_gb=25, reserve_percent=10) == (35 * GIB, 25 * GIB)
    # The cap.
    assert pf.budget(info, reserve_gb=0, reserve_percent=10, max_gb=2) == (2 * GIB, 10 * GIB)
    assert pf.budget(info, reserve_gb=0, reserve_percent=10, max_gb=500) == (50 * GIB, 10 * GIB)


def test_budget_is_never_negative_and_never_takes_the_used_memory(tmp_path):
    # 90 GiB in use (the old server's memory among it): 10 GiB available, a 20% reserve leaves nothing.
    info = pf.read_meminfo(meminfo_file(tmp_path, 100 * 1024 * 1024, 10 * 1024 * 1024))
    assert pf.budget(info, reserve_percent=20) == (0, 20 * GIB)
    assert pf.budget(info, reserve_percent=0)[0] == 10 * GIB


def test_budget_without_memavailable_is_an_error(tmp_path):
    path = tmp_path / "meminfo"
    path.write_text("MemTotal: 1000 kB\nMemFree: 10 kB\n")
    with pytest.raises(ValueError, match="MemAvailable"):
        pf.budget(pf.read_meminfo(str(path)))


# --------------------------------------------------------------------------
# Residency and the reads, on a disk-backed file
# --------------------------------------------------------------------------

@pytest.fixture
def disk_dir():
    d = tempfile.mkdtemp(prefix=".prefetch-test-", dir=REPO)
    yield d
    for name in os.listdir(d):
        os.unlink(os.path.join(d, name))
    os.rmdir(d)


def write_cold(path, size):
    """A file of ``size`` random bytes, written to disk and dropped from the page cache."""
    with open(path, "wb") as fh:
        fh.write(os.urandom(size))
        fh.flush()
        os.fsync(fh.fileno())
    evict(path)


def evict(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def evictable(path):
    """Whether this file system drops clean pages on DONTNEED (a disk-backed one does; tmpfs never)."""
    return pf.residency(path)[0] < os.path.getsize(path) // 2


def test_residency_of_a_dropped_then_read_file(disk_dir):
    path = os.path.join(disk_dir, "shard.bin")
    write_cold(path, 8 * MIB)
    if evictable(path):
        assert pf.residency(path)[0] < 4 * MIB
    with open(path, "rb") as fh:
        while fh.read(MIB):
            pass
    resident, size = pf.residency(path)
    assert size == 8 * MIB and resident == size


def test_residency_counts_in_windows(disk_dir):
    path = os.path.join(disk_dir, "shard.bin")
    with open(path, "wb") as fh:
        fh.write(b"x" * (3 * MIB + 5))
    # A freshly written file is resident (its pages are in the cache), counted over 1 MiB windows and a partial page.
    assert pf.residency(path, window=MIB) == (3 * MIB + 5, 3 * MIB + 5)
    empty = os.path.join(disk_dir, "empty.bin")
    open(empty, "wb").close()
    assert pf.residency(empty) == (0, 0)


def test_prefetch_reads_cold_files_and_skips_resident_ones(disk_dir):
    cold = [os.path.join(disk_dir, "cold-%d.safetensors" % i) for i in range(2)]
    for path in cold:
        write_cold(path, 4 * MIB)
    warm = os.path.join(disk_dir, "warm.safetensors")
    with open(warm, "wb") as fh:
        fh.write(os.urandom(2 * MIB))
    if not evictable(cold[0]):
        pytest.fail("the repository's file system keeps dropped pages: the residency test needs a disk-backed one")
    result = pf.prefetch(cold + [warm], budget_bytes=100 * MIB, timeout=600, chunk=MIB)
    assert result["files"] == 3 and result["bytes"] == 10 * MIB
    assert result["skipped"] == [{"path": warm, "why": "resident"}]
    assert result["resident_after"] == {"bytes": 10 * MIB, "percent": 100.0}
    assert result["resident_before"]["bytes"] < 6 * MIB
    # Only the cold pages were read, and only once.
    assert 0 < result["bytes_read"] <= 8 * MIB and result["stopped"] is None and result["errors"] == []
    per = {f["path"]: f for f in result["per_file"]}
    assert per[warm]["bytes_read"] == 0 and per[cold[0]]["resident_after"] == 4 * MIB
    # A second run finds everything resident and reads nothing.
    again = pf.prefetch(cold + [warm], budget_bytes=100 * MIB, timeout=600, chunk=MIB)
    assert again["bytes_read"] == 0 and [s["why"] for s in again["skipped"]] == ["resident"] * 3
    assert again["resident_before"]["percent"] == 100.0


def test_prefetch_stops_at_the_budget(disk_dir):
    files = [os.path.join(disk_dir, "s%d.safetensors" % i) for i in range(3)]
    for path in files:
        write_cold(path, 4 * MIB)
    if not evictable(files[0]):
        pytest.fail("the repository's file system keeps dropped pages: the budget test needs a disk-backed one")
    result = pf.prefetch(files, budget_bytes=3 * MIB + 4096, timeout=600, chunk=MIB)
    assert result["stopped"] == "budget"
    assert result["bytes_read"] == 3 * MIB + 4096
    # The files after the one the budget ran out in are not opened for reading.
    assert result["skipped"] == [{"path": files[1], "why": "budget"}, {"path": files[2], "why": "budget"}]
    assert result["per_file"][1]["bytes_read"] == 0 and result["per_file"][2]["bytes_read"] == 0


def test_prefetch_stops_at_the_time_limit(disk_dir):
    files = [os.path.join(disk_dir, "s%d.safetensors" % i) for i in range(2)]
    for path in files:
        write_cold(path, 2 * MIB)
    if not evictable(files[0]):
        pytest.fail("the repository's file system keeps dropped pages: the time-limit test needs a disk-backed one")
    ticks = iter(range(1000))
    # A fake clock: one second per call; started at 0, 2 s allowed: the first chunk is read, then the limit is hit.
    result = pf.prefetch(files, budget_bytes=100 * MIB, timeout=2, chunk=MIB, clock=lambda: next(ticks))
    assert result["stopped"] == "timeout"
    assert result["bytes_read"] == MIB
    assert result["skipped"] == [{"path": files[1], "why": "timeout"}]


def test_prefetch_names_a_missing_file(disk_dir):
    missing = os.path.join(disk_dir, "gone.safetensors")
    result = pf.prefetch([missing], budget_bytes=MIB, timeout=10)
    assert result["errors"] and result["errors"][0].startswith(missing + ": ")
    assert result["bytes"] == 0 and result["bytes_read"] == 0


# --------------------------------------------------------------------------
# Priority (in a child process)
# --------------------------------------------------------------------------

PRIORITY_CHILD = r"""
import json, os
from ansible_collections.gpufleet.sglang.plugins.module_utils.server import prefetch as pf
nice, io_ok, why = pf.idle_priority()
fields = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
print(json.dumps({"nice": nice, "io_ok": io_ok, "why": why, "stat_nice": int(fields[16]), "ioprio": pf.get_ioprio()}))
"""


def test_idle_priority_sets_nice_19_and_the_idle_io_class():
    # The child imports the collection from the checkout's .collections (on the older cores the parent finds it
    # through pytest-ansible's in-process finder, which sys.path does not show).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(REPO, ".collections")] + [p for p in sys.path if p]))
    out = subprocess.run([sys.executable, "-c", PRIORITY_CHILD], capture_output=True, text=True, timeout=60, env=env,
                         check=False)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["nice"] == 19 and got["stat_nice"] == 19
    if pf.ioprio_syscalls() is None:
        assert got["io_ok"] is False and "unknown syscall" in got["why"]
    elif got["io_ok"]:
        assert got["why"] is None and got["ioprio"][0] == pf.IOPRIO_CLASS_IDLE
    else:
        # A kernel or seccomp profile that refuses ioprio_set: the reason is given (the reads go on at nice 19).
        assert got["why"].startswith("ioprio_set: ")
    # This (the test's) process was not touched.
    assert os.nice(0) < 19


# --------------------------------------------------------------------------
# The module
# --------------------------------------------------------------------------

@pytest.fixture
def no_priority(monkeypatch):
    monkeypatch.setattr(pf, "idle_priority", lambda: (19, False, "ioprio_set: Operation not permitted"))


def test_module_reads_the_shards_of_the_index(disk_dir, monkeypatch, no_priority):
    for name in ("a.safetensors", "b.safetensors", "stray.safetensors"):
        write_cold(os.path.join(disk_dir, name), MIB)
    with open(os.path.join(disk_dir, "model.safetensors.index.json"), "w") as fh:
        json.dump({"weight_map": {"w1": "a.safetensors", "w2": "b.safetensors"}}, fh)
    monkeypatch.setattr(pf, "read_meminfo", lambda: {"MemTotal": 100 * GIB, "MemAvailable": 50 * GIB})
    res = run_module(sglang_prefetch, {"paths": [disk_dir, disk_dir]}, monkeypatch)
    p = res["prefetch"]
    assert res["failed"] is False and res["changed"] is False
    # The index's two shards, each once (the stray file is not loaded by SGLang, so not read).
    assert p["files"] == 2 and p["bytes"] == 2 * MIB and p["resident_after"]["percent"] == 100.0
    assert p["budget_bytes"] == 40 * GIB and p["reserve_bytes"] == 10 * GIB
    assert p["priority_note"] == "read at nice 19, not in the idle I/O class (ioprio_set: Operation not permitted)"
    assert p["line"].startswith("prefetch: 2 file(s), 2.0 MiB, resident ") and "idle I/O class" in p["line"]
    # auto: no warnings.
    assert res["warnings"] == []


def test_module_on_warns_when_stopped_at_the_budget(disk_dir, monkeypatch, no_priority):
    for name in ("a.safetensors", "b.safetensors"):
        write_cold(os.path.join(disk_dir, name), 2 * MIB)
    if not evictable(os.path.join(disk_dir, "a.safetensors")):
        pytest.fail("the repository's file system keeps dropped pages: the budget test needs a disk-backed one")
    monkeypatch.setattr(pf, "read_meminfo", lambda: {"MemTotal": 100 * GIB, "MemAvailable": 50 * GIB})
    res = run_module(sglang_prefetch, {"paths": [disk_dir], "mode": "on", "max_gb": 1.0 / 1024}, monkeypatch)
    p = res["prefetch"]
    assert p["stopped"] == "budget" and p["bytes_read"] == MIB and p["budget_bytes"] == MIB
    assert "stopped at the memory budget" in p["line"]
    assert any(w.startswith("mode on: stopped at the memory budget") and "raise max_gb or" in w
               for w in res["warnings"]), res["warnings"]


def test_module_without_budget_reads_nothing(disk_dir, monkeypatch, no_priority):
    write_cold(os.path.join(disk_dir, "a.safetensors"), MIB)
    monkeypatch.setattr(pf, "read_meminfo", lambda: {"MemTotal": 100 * GIB, "MemAvailable": 5 * GIB})
    res = run_module(sglang_prefetch, {"paths": [disk_dir], "mode": "on"}, monkeypatch)
    assert res["prefetch"]["bytes_read"] == 0
    assert res["prefetch"]["skipped_why"].startswith("no memory budget")
    assert res["warnings"] == ["mode on: nothing was read: " + res["prefetch"]["skipped_why"]]


@pytest.mark.parametrize("args, check, why", [
    ({"mode": "off"}, False, "mode is off"),
    ({"mode": "off", "option_labels": {"mode": "sglang_server_prefetch"}}, False, "sglang_server_prefetch is off"),
    ({}, True, "check mode"),
])
def test_module_off_and_check_mode_read_nothing(disk_dir, monkeypatch, args, check, why):
    write_cold(os.path.join(disk_dir, "a.safetensors"), MIB)
    monkeypatch.setattr(pf, "prefetch", lambda *a, **k: pytest.fail("prefetch ran"))
    monkeypatch.setattr(pf, "idle_priority", lambda: pytest.fail("the priority was changed"))
    res = run_module(sglang_prefetch, dict(args, paths=[disk_dir]), monkeypatch, check=check)
    assert res["prefetch"]["skipped_why"] == why and res["prefetch"]["line"] == "prefetch: skipped, " + why


ROLE_LABELS = {"mode": "sglang_server_prefetch", "timeout": "sglang_server_prefetch_timeout",
               "reserve_percent": "sglang_server_prefetch_reserve_percent"}


@pytest.mark.parametrize("args, field", [
    ({"timeout": -1}, "timeout: -1.0 is negative"),
    ({"reserve_percent": 150}, "reserve_percent: 150.0 is not between 0 and 100"),
    # With the role's option_labels, the role's variables.
    ({"timeout": -1, "option_labels": ROLE_LABELS}, "sglang_server_prefetch_timeout: -1.0 is negative"),
    ({"reserve_percent": 150, "option_labels": ROLE_LABELS}, "sglang_server_prefetch_reserve_percent: 150.0 is not between"),
])
def test_module_refuses_bad_settings(disk_dir, monkeypatch, args, field):
    monkeypatch.setattr(pf, "prefetch", lambda *a, **k: pytest.fail("prefetch ran"))
    res = run_module(sglang_prefetch, dict(args, paths=[disk_dir]), monkeypatch)
    assert res["failed"] is True and res["msg"].startswith(field), res["msg"]
