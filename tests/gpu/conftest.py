"""Fixtures of the GPU kit (tests/gpu).

``kit`` (session) builds the :class:`gpukit.scenario.KitContext` for
``test_real_gpu.py`` from the environment run.sh exports:

=========================  =================================================
``GPUKIT_MODE``            ``real`` (default) or ``sim`` (rehearsal on gpusim)
``GPUKIT_OUT``             results directory (default tests/gpu/results/<UTC timestamp>,
                           ``sim-<UTC timestamp>`` in sim mode)
``GPUKIT_ALLOCATOR``       ``auto`` | ``cuda`` | ``cupy`` | ``torch``
``GPUKIT_MIB``             MiB of the teardown/latency holder (default 10240)
``GPUKIT_UPDATE_CAPTURES`` ``1`` writes real captures into tests/gpu/captures
``GPUKIT_SIM_GPUS``        sim mode: GPU count (default 2)
``GPUKIT_SIM_MODEL``       sim mode: H200 (default) or H100
=========================  =================================================

Without a GPU (and not in sim mode) the fixture skips with the reason from
``nvidia-smi -L``, so ``pytest tests/gpu -m "gpu or not gpu"`` skips the real
checks visibly instead of failing them.
"""
from __future__ import annotations

import os
import sys

import pytest

KIT_DIR = os.path.dirname(os.path.abspath(__file__))
if KIT_DIR not in sys.path:
    sys.path.insert(0, KIT_DIR)

from gpukit import gpu as G  # noqa: E402 - after tests/gpu is put on sys.path
from gpukit.results import Results, default_out_dir  # noqa: E402 - after tests/gpu is put on sys.path
from gpukit.scenario import KitContext  # noqa: E402 - after tests/gpu is put on sys.path
from mask import Masker  # noqa: E402 - after tests/gpu is put on sys.path


def _env_int(name, default):
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


@pytest.fixture(scope="session")
def kit():
    mode = os.environ.get("GPUKIT_MODE", "real")
    sim = None
    env = dict(os.environ)
    if mode == "sim":
        sim = G.SimNode(_env_int("GPUKIT_SIM_GPUS", 2), os.environ.get("GPUKIT_SIM_MODEL", "H200"), seed="gpukit-rehearsal")
        env = dict(sim.env)
    else:
        info = G.detect(env=env)
        if not info.ok:
            pytest.skip(info.reason)
    out = os.environ.get("GPUKIT_OUT") or default_out_dir(os.path.join(KIT_DIR, "results"), mode)
    masker = Masker()
    results = Results(out, masker=masker, mode=mode)
    ctx = KitContext(mode, results, masker, env=env, allocator=os.environ.get("GPUKIT_ALLOCATOR", "auto"),
                     mib=_env_int("GPUKIT_MIB", 10240),
                     latency_repeats=1 if mode == "sim" else 3, polls=5 if mode == "sim" else 20,
                     update_captures=os.environ.get("GPUKIT_UPDATE_CAPTURES", "1") == "1", sim=sim)
    if not ctx.gpu.ok:
        if sim is not None:
            sim.close()
        pytest.skip(ctx.gpu.reason)
    ctx.out_dir = out
    ctx.set_environment()
    results.write()
    try:
        yield ctx
    finally:
        results.finish()
        ctx.close()
        if sim is not None:
            sim.close()
