"""Real-GPU checks of the kit (marker ``gpu``); run them with ``tests/gpu/run.sh``.

Without an NVIDIA GPU every test here is skipped with the reason
``no NVIDIA GPU: nvidia-smi ...`` (see conftest.py). ``run.sh --sim`` runs
them against the gpusim simulator instead (a rehearsal of the kit itself,
not a validation of anything on a GPU).

Each test records its outcome, measurements and details in
``<out>/results.json`` and ``<out>/summary.md`` as it finishes.
"""
from __future__ import annotations

import time
import traceback

import pytest

from gpukit import scenario

pytestmark = pytest.mark.gpu


def _run(kit, name, fn, *args):
    start = time.monotonic()
    try:
        status, message, details = fn(kit, *args)
    except Exception as exc:  # record, then let pytest show it
        kit.results.check(name, "error", time.monotonic() - start, "%s: %s" % (type(exc).__name__, exc),
                          {"traceback": traceback.format_exc()})
        kit.results.write()
        raise
    kit.results.check(name, status, time.monotonic() - start, message, details)
    kit.results.write()
    if status == "skipped":
        pytest.skip(message)
    if status != "passed":
        pytest.fail("%s: %s" % (name, message), pytrace=False)


def test_format_fidelity(kit):
    """Every query the collection makes: real output parses, and has the simulator's shape."""
    _run(kit, "format_fidelity", scenario.check_fidelity, kit.out_dir)


def test_nvml_matches_nvidia_smi(kit):
    """NVML (nvidia-ml-py) and nvidia-smi report the same numbers; time per poll of each."""
    _run(kit, "nvml_vs_nvidia_smi", scenario.check_nvml_vs_smi)


def test_teardown_through_ansible(kit):
    """gpu_drain + gpu_memory_assert via ansible: holders gone, decoys alive, memory back to idle."""
    _run(kit, "teardown", scenario.check_teardown)


def test_sigterm_ignoring_process_is_killed(kit):
    """A CUDA process that ignores SIGTERM is escalated to SIGKILL and verified gone."""
    _run(kit, "sigterm_escalation", scenario.check_sigterm_escalation)


def test_release_latency_after_sigkill(kit):
    """Memory-release latency after SIGKILL (tight NVML polling), and the forked-keeper case."""
    _run(kit, "release_latency", scenario.check_release_latency)
