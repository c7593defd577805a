"""Fixtures for the GPU simulator tests (helpers live in gpusim_testlib.py).

Every process a test starts goes through the simulator (``gpusim hold``) and
is recorded by PID and start time; teardown SIGKILLs exactly those PIDs, never
by name or pattern.  While a test runs this pytest process is a child
subreaper, so the double-forked watchers are reaped here.
"""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpusim_testlib import ProcTracker, Sim  # noqa: E402 - after this directory is put on sys.path


@pytest.fixture
def procs():
    PR_SET_CHILD_SUBREAPER = 36
    on = False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        on = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except Exception:
        libc = None
    tracker = ProcTracker()
    try:
        yield tracker
    finally:
        tracker.kill_all()
        if on:
            libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


@pytest.fixture
def sim(tmp_path, procs) -> Sim:
    s = Sim(tmp_path / "node", procs)
    s.init()
    return s


@pytest.fixture
def make_sim(tmp_path, procs):
    """Factory for extra nodes: ``make_sim("name", gpus, model)``."""

    def make(name="node2", gpus=8, model="H200", init=True) -> Sim:
        s = Sim(tmp_path / name, procs)
        if init:
            s.init(gpus, model)
        return s

    return make


@pytest.fixture
def bare_sim(tmp_path, procs) -> Sim:
    """A Sim whose root has not been initialised yet."""
    return Sim(tmp_path / "node", procs)
