"""What the node-side SGLang oracle costs per host: import, then per configuration.

For every SGLang installed for the differential test (``.cache/differential/``: the real
releases, CPU torch) and for the simulator's fake SGLang, it measures with the
collection's own runner (``plugins/module_utils/sglang/oracle.py``):

* ``single``: one ``resolve_on_node`` call as the preflight makes it (a fresh process:
  interpreter start, import, one resolution), median of ``--runs``;
* ``import``: the helper's own import time (sglang.srt.server_args and its pipeline);
* ``per config``: the median resolution time of ``--configs`` configurations in one
  batch (each resolved in a child forked after the import).

    .venv/bin/python bench/oracle.py [--runs 3] [--configs 20] [--json FILE]

Nothing is installed here: a release that is not in ``.cache/differential/`` is skipped
(``scripts/run-tests.py differential`` installs them). The load average is printed: on a
shared 2-core machine the import time varies a lot with the load.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / ".collections"))
sys.path.insert(0, str(REPO / "tests" / "differential"))

H200 = {"name": "NVIDIA H200", "compute_capability": "9.0", "memory_mib": 143771, "count": 8}
INCIDENT = ["--speculative-algorithm", "EAGLE3", "--speculative-eagle-topk", "1", "--speculative-num-steps", "1",
            "--speculative-num-draft-tokens", "16"]


def _hosts():
    """(label, python, env) for every SGLang this machine has for the oracle."""
    import env as env_mod

    hosts = [("fake SGLang 0.5.23 (simulator)", sys.executable,
              dict(os.environ, PYTHONPATH=str(REPO / "simulator" / "python"), SGLANG_SIM_VERSION="0.5.23"))]
    for version in env_mod.VERSIONS:
        release = env_mod.Release(version)
        if (release.target / ".gpufleet-stamp").exists() and os.path.exists(release.python):
            hosts.append(("SGLang %s (real wheel, CPU torch)" % version, release.python, release.env()))
    return hosts


def measure(label, python, env, model, runs, configs):
    from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import oracle

    argv = ["--model-path", model] + INCIDENT
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        singles = []
        for _run in range(runs):
            started = time.monotonic()
            answer = oracle.resolve_on_node(python, argv, "0.5.23", H200)
            singles.append(time.monotonic() - started)
        batch = oracle.run_helper(python, {"gpu": H200, "requests": [{"argv": argv}] * configs}, timeout=900)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    per_config = [r["resolve_s"] for r in batch["results"]]
    return {"host": label, "version": answer["sglang_version"], "single_s": statistics.median(singles),
            "import_s": batch["import_s"], "per_config_ms": 1000 * statistics.median(per_config),
            "batch_s": batch["elapsed_s"], "configs": configs, "runs": runs}


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--configs", type=int, default=20)
    parser.add_argument("--json", help="write the figures to this file")
    opts = parser.parse_args(argv)
    import cases as cases_mod

    model = cases_mod.write_models(tempfile.mkdtemp(prefix="bench-oracle-"))["llama"]
    print("oracle cost per host (load average %s)" % " ".join("%.2f" % x for x in os.getloadavg()))
    print("%-44s %8s %9s %14s %14s" % ("host", "import", "single", "per config", "batch of %d" % opts.configs))
    rows = []
    for label, python, env in _hosts():
        row = measure(label, python, env, model, opts.runs, opts.configs)
        rows.append(row)
        print("%-44s %7.2fs %8.2fs %12.1fms %13.1fs" % (label, row["import_s"], row["single_s"], row["per_config_ms"],
                                                        row["batch_s"]))
    if opts.json:
        pathlib.Path(opts.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
