"""The checkpoint prefetch (plugins/module_utils/server/prefetch.py): how much faster a load reads a checkpoint that
the prefetch warmed into the page cache than one read from the disk.

    .venv/bin/python bench/run.py --only prefetch [--prefetch-mib 256]

A checkpoint of real safetensors files (8 shards) is dropped from the page cache (posix_fadvise DONTNEED), then read
whole, file by file, as a load reads it (cold); dropped again, warmed by the prefetch (its own time is what the old
server's last minutes pay, not the outage), and read whole again (prefetched). The ratio cold / prefetched is printed,
never asserted: a virtual disk the host caches itself makes the cold read fast, and so the ratio small.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import statistics
import time

import _common as c

from gpusim.checkpoint import write_weights

SOURCE = os.path.join(c.REPO, "plugins", "module_utils", "server", "prefetch.py")
RUNS = 3
SHARDS = 8
MIB = 1024 * 1024


def _prefetch_module():
    """The collection's prefetch.py (standard library only: loaded from its file)."""
    spec = importlib.util.spec_from_file_location("gpufleet_bench_prefetch", SOURCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _drop_cache(files):
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _read_all(files):
    """Every byte of every file, in order, 16 MiB at a time (a load's sequential read)."""
    buf = bytearray(16 * MIB)
    total = 0
    for path in files:
        with open(path, "rb", buffering=0) as fh:
            while True:
                got = fh.readinto(buf)
                if not got:
                    break
                total += got
    return total


def run(opts, workdir):
    pf = _prefetch_module()
    mib = max(SHARDS, int(getattr(opts, "prefetch_mib", None) or 256))
    per_shard = mib // SHARDS
    # One BF16 tensor of per_shard MiB in each shard: rows of 512 KiB (256 Ki elements).
    layout = dict(("model.layers.%d.weight" % i, ("BF16", (per_shard * 2, 256 * 1024))) for i in range(SHARDS))
    directory = os.path.join(workdir, "prefetch-checkpoint")
    os.makedirs(directory)
    names = write_weights(directory, layout=layout, shards=SHARDS)
    files = [os.path.join(directory, n) for n in names if n.endswith(".safetensors")]
    load = c.loadavg()
    cold, warmed, prefetch_s, resident = [], [], [], []
    for _run in range(RUNS):
        _drop_cache(files)
        resident.append(sum(pf.residency(f)[0] for f in files))
        tic = time.perf_counter()
        total = _read_all(files)
        cold.append(time.perf_counter() - tic)
        _drop_cache(files)
        tic = time.perf_counter()
        result = pf.prefetch(files, budget_bytes=2 * total, timeout=600)
        prefetch_s.append(time.perf_counter() - tic)
        tic = time.perf_counter()
        _read_all(files)
        warmed.append(time.perf_counter() - tic)
    row = {"files": len(files), "bytes": total, "cold_s": round(statistics.median(cold), 3),
           "prefetch_s": round(statistics.median(prefetch_s), 3), "prefetched_s": round(statistics.median(warmed), 3),
           "resident_dropped_pct": round(100.0 * max(resident) / total, 1),
           "resident_after_pct": result["resident_after"]["percent"], "load": load}
    row["ratio"] = round(row["cold_s"] / row["prefetched_s"], 1) if row["prefetched_s"] else None
    print("  checkpoint of %d shards, %.0f MiB: read cold %.3f s, prefetch %.3f s, read prefetched %.3f s: %sx faster "
          "(resident after the drop %.1f%%, after the prefetch %.1f%%), load %.1f"
          % (len(files), total / float(MIB), row["cold_s"], row["prefetch_s"], row["prefetched_s"], row["ratio"],
             row["resident_dropped_pct"], row["resident_after_pct"], load[0]), flush=True)
    shutil.rmtree(directory, ignore_errors=True)
    return {"runs": RUNS, "rows": [row]}


def report(res):
    rows = [[r["files"], c.fmt(r["bytes"] / float(MIB), 0), c.fmt(r["cold_s"], 3), c.fmt(r["prefetch_s"], 3),
             c.fmt(r["prefetched_s"], 3), c.fmt(r["ratio"], 1), c.fmt(r["load"][0], 1)] for r in res["rows"]]
    return "\n".join([
        "Checkpoint prefetch: a whole sequential read of the checkpoint, page cache dropped (cold) against after the "
        "prefetch, median of %d (a ratio, never asserted)" % res["runs"],
        c.table(["files", "MiB", "cold s", "prefetch s", "prefetched s", "cold/prefetched", "load"], rows),
    ])
