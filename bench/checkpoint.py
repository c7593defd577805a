"""The preflight's checkpoint check (plugins/module_utils/sglang/checkpoint.py ``verify``) on checkpoints of many
shards: what reading every shard's header and size costs, with a cold and a warm page cache of the headers.

    .venv/bin/python bench/run.py --only checkpoint [--checkpoint-shards 200,1000]

Each shard holds 4 small tensors (the header is what is read, not the data); the figure is printed, never asserted.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import statistics
import time

import _common as c

from gpusim.checkpoint import write_checkpoint

SOURCE = os.path.join(c.REPO, "plugins", "module_utils", "sglang", "checkpoint.py")
RUNS = 5


def _verify():
    """``verify`` of the collection's checkpoint.py (standard library only: loaded from its file)."""
    spec = importlib.util.spec_from_file_location("gpufleet_bench_checkpoint", SOURCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.verify


def _drop_cache(directory):
    """Ask the kernel to forget the files' pages (posix_fadvise DONTNEED): the next read comes from the disk."""
    for name in os.listdir(directory):
        fd = os.open(os.path.join(directory, name), os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def run(opts, workdir):
    verify = _verify()
    layout = dict(("model.layers.%d.w%d" % (i // 4, i % 4), ("BF16", (64, 64))) for i in range(4 * 1000))
    rows = []
    for shards in getattr(opts, "checkpoint_shards", None) or (200,):
        directory = os.path.join(workdir, "checkpoint-%d" % shards)
        names = sorted(layout)[:4 * shards]
        write_checkpoint(directory, config={"architectures": ["LlamaForCausalLM"]}, shards=shards,
                         layout=dict((n, layout[n]) for n in names))
        load = c.loadavg()
        cold, warm, info = [], [], None
        for _run in range(RUNS):
            _drop_cache(directory)
            tic = time.perf_counter()
            info = verify(directory, uid=os.geteuid(), gids=os.getgroups())
            cold.append(time.perf_counter() - tic)
            tic = time.perf_counter()
            verify(directory, uid=os.geteuid(), gids=os.getgroups())
            warm.append(time.perf_counter() - tic)
        row = {"shards": shards, "files": info["files"], "tensors": info["tensors"], "bytes": info["bytes"],
               "cold_ms": round(1000 * statistics.median(cold), 1), "warm_ms": round(1000 * statistics.median(warm), 1),
               "load": load}
        rows.append(row)
        print("  checkpoint of %d shards (%d tensors, %.1f MiB): verify %s ms (page cache dropped), %s ms (warm), load %.1f"
              % (shards, row["tensors"], row["bytes"] / 1048576.0, c.fmt(row["cold_ms"], 1), c.fmt(row["warm_ms"], 1),
                 load[0]), flush=True)
        shutil.rmtree(directory, ignore_errors=True)
    return {"runs": RUNS, "rows": rows}


def report(res):
    rows = [[r["shards"], r["tensors"], c.fmt(r["bytes"] / 1048576.0, 1), c.fmt(r["cold_ms"], 1), c.fmt(r["warm_ms"], 1),
             c.fmt(r["load"][0], 1)] for r in res["rows"]]
    return "\n".join([
        "Checkpoint check: the preflight's verify (every shard's header and size, the index, the tokenizer files, read "
        "access), median of %d" % res["runs"],
        c.table(["shards", "tensors", "MiB", "cold ms", "warm ms", "load"], rows),
    ])
