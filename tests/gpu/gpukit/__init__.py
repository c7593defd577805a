"""Library of the real-GPU validation kit (tests/gpu/run.sh); standard library only.

Modules:

* :mod:`gpukit.gpu`       - is there a GPU (``nvidia-smi -L``), which model, simulator set-up
* :mod:`gpukit.queries`   - the nvidia-smi command lines the collection runs, captures, manifest
* :mod:`gpukit.shape`     - shape of nvidia-smi output and the real-versus-simulator comparison
* :mod:`gpukit.results`   - results.json and summary.md
* :mod:`gpukit.holder`    - the CUDA memory holder (ctypes on libcuda, cupy, torch, or gpusim)
* :mod:`gpukit.procs`     - starting and cleaning up holder/decoy processes (by PID)
* :mod:`gpukit.ansible_run` - running the collection's modules through ``ansible`` ad hoc
* :mod:`gpukit.scenario`  - the checks: fidelity, teardown, SIGTERM escalation, latency, NVML vs nvidia-smi

``tests/gpu`` must be on ``sys.path`` (``mask.py`` lives there).
"""
from __future__ import annotations

import importlib.util
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
KIT_DIR = os.path.dirname(HERE)                       # tests/gpu
REPO = os.path.dirname(os.path.dirname(KIT_DIR))      # repository root
CAPTURES_DIR = os.path.join(KIT_DIR, "captures")
SIM_BIN = os.path.join(REPO, "simulator", "bin")
SIM_PY = os.path.join(REPO, "simulator", "python")
COLLECTIONS = os.path.join(REPO, ".collections")

if KIT_DIR not in sys.path:
    sys.path.insert(0, KIT_DIR)

_GPU_QUERY = None


def gpu_query():
    """The collection's GPU query code (stdlib only): ``module_utils/gpu/query.py`` with its nvidia-smi parser
    (``smi_csv.py``) and backends (``backends.py``), as one namespace.

    Imported from the checkout through ``.collections`` with plain Python imports (no Ansible collection
    loader), so the kit stays independent of Ansible; the modules are the same files the modules run.
    """
    global _GPU_QUERY
    if _GPU_QUERY is None:
        collections = ensure_collection_link()
        if collections not in sys.path:
            sys.path.insert(0, collections)
        merged = {}
        for name in ("query", "smi_csv", "backends"):
            module = importlib.import_module("ansible_collections.gpufleet.sglang.plugins.module_utils.gpu." + name)
            merged.update((k, v) for k, v in vars(module).items() if not k.startswith("__"))
        _GPU_QUERY = types.SimpleNamespace(**merged)
    return _GPU_QUERY


def ensure_collection_link():
    """``.collections/ansible_collections/gpufleet/sglang -> ../../..`` (created if missing)."""
    link = os.path.join(COLLECTIONS, "ansible_collections", "gpufleet", "sglang")
    if not os.path.lexists(link):
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(os.path.join("..", "..", ".."), link)
    return COLLECTIONS
