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

HERE = os.path.dirname(os.path.abspath(__file__))
KIT_DIR = os.path.dirname(HERE)                       # tests/gpu
REPO = os.path.dirname(os.path.dirname(KIT_DIR))      # repository root
CAPTURES_DIR = os.path.join(KIT_DIR, "captures")
SIM_BIN = os.path.join(REPO, "simulator", "bin")
SIM_PY = os.path.join(REPO, "simulator", "python")
GPU_QUERY_PATH = os.path.join(REPO, "plugins", "module_utils", "gpu", "query.py")
COLLECTIONS = os.path.join(REPO, ".collections")

if KIT_DIR not in sys.path:
    sys.path.insert(0, KIT_DIR)

_GPU_QUERY = None


def gpu_query():
    """The collection's ``module_utils/gpu/query.py`` (stdlib only), loaded by path.

    Loading by path keeps the kit independent of Ansible's collection loader;
    the module is the same file the modules run.
    """
    global _GPU_QUERY
    if _GPU_QUERY is None:
        spec = importlib.util.spec_from_file_location("gpukit_gpu_query", GPU_QUERY_PATH)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _GPU_QUERY = module
    return _GPU_QUERY


def ensure_collection_link():
    """``.collections/ansible_collections/gpufleet/sglang -> ../../..`` (created if missing)."""
    link = os.path.join(COLLECTIONS, "ansible_collections", "gpufleet", "sglang")
    if not os.path.lexists(link):
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(os.path.join("..", "..", ".."), link)
    return COLLECTIONS
