"""CDI devices for the simulated GPUs, for tests that run containers with real podman (issue 24).

``cdi_gpus`` (module scope) writes the spec of ``gpusim cdi-spec`` where podman reads it, so that
``podman run --device nvidia.com/gpu=2`` gives a container simulated GPU 2 the way the NVIDIA Container Toolkit's
spec gives a real one (/dev/nvidia2 inside; ``GPUSIM_CDI=1`` makes ``Node.resolve_visible`` count only the GPUs
present in /dev, numbered from 0 in index order, as CUDA does). It removes the spec at teardown.
:func:`cdi_spec` is the same as a context manager, for callers outside pytest (bench/container.py).

Where: podman 4.3.1 reads specs only from /etc/cdi and /var/run/cdi (containers.conf has no ``cdi_spec_dirs`` before
podman 4.4), so the spec goes to /var/run/cdi (the higher-priority directory: on a real GPU host it overrides a
toolkit spec in /etc/cdi instead of conflicting with it). Needs root.

Two runs at once: two spec files of one directory that both define ``nvidia.com/gpu=2`` make it unresolvable
(podman 4.3.1: ``Error: setting up CDI devices: unresolvable CDI devices nvidia.com/gpu=2``), so per-worker file
names cannot work. The spec has one fixed name, ``gpusim-tests.json``, and one fixed content (8 GPUs whose device
files are in /run/gpusim-cdi-dev), so every user shares it: a user writes it under an exclusive ``flock`` on
/var/run/cdi/.gpusim-tests.lock, holds a shared one while it runs containers, and the last user removes it (a
leftover of a killed run is simply rewritten). Two pytest workers, the bench and a second run never wait for each
other's tests. The empty lock file and the device files stay.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pathlib
import subprocess
import time

import pytest

from conftest import SIM_BIN

CDI_DIR = pathlib.Path("/var/run/cdi")
SPEC_NAME = "gpusim-tests.json"
LOCK_NAME = ".gpusim-tests.lock"   # not *.json / *.yaml: CDI ignores it
KIND = "nvidia.com/gpu"
LOCK_WAIT_S = 600


DEV_DIR = pathlib.Path("/run/gpusim-cdi-dev")   # the simulated device files every user of the spec shares
GPUS = 8


def _lock(fd, mode):
    """``flock(fd, mode)`` within LOCK_WAIT_S (it waits while another user rewrites or removes the spec)."""
    end = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= end:
                raise AssertionError("%s stayed locked for %d s by another user of %s"
                                     % (CDI_DIR / LOCK_NAME, LOCK_WAIT_S, CDI_DIR / SPEC_NAME))
            time.sleep(0.2)


@contextlib.contextmanager
def cdi_spec():
    """The spec of ``gpusim cdi-spec`` for 8 simulated GPUs (device files in DEV_DIR) in /var/run/cdi while the block
    runs: ``{"spec", "dev_dir", "kind", "device"}``. Every user writes the same spec, so any number share it: each
    holds a shared flock on /var/run/cdi/.gpusim-tests.lock while it uses the spec, writes it under an exclusive one,
    and the last user (the one that gets the exclusive lock at the end without waiting) removes it. Two pytest
    workers, the bench, or two runs never wait for one another's tests. For callers outside pytest
    (bench/container.py); the fixture :func:`cdi_gpus` is this for a test module."""
    if os.geteuid() != 0:
        raise AssertionError("the CDI spec of the simulated GPUs goes into %s: run as root" % CDI_DIR)
    CDI_DIR.mkdir(parents=True, exist_ok=True)
    fd = os.open(str(CDI_DIR / LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    spec = CDI_DIR / SPEC_NAME
    try:
        _lock(fd, fcntl.LOCK_EX)
        DEV_DIR.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run([str(SIM_BIN / "gpusim"), "cdi-spec", "--out", str(spec), "--dev-dir", str(DEV_DIR),
                               "--gpus", str(GPUS), "--kind", KIND], capture_output=True, text=True, timeout=60, check=False)
        if proc.returncode != 0:
            raise AssertionError("gpusim cdi-spec failed (%d): %s" % (proc.returncode, proc.stderr))
        devices = json.loads(proc.stdout)["devices"]
        if devices != [str(i) for i in range(GPUS)] + ["all"]:
            raise AssertionError("gpusim cdi-spec wrote devices %s, not 0..%d and all: %s" % (devices, GPUS - 1, proc.stdout))
        _lock(fd, fcntl.LOCK_SH)                      # in use: others may rewrite the same spec, none removes it
        yield {"spec": spec, "dev_dir": DEV_DIR, "kind": KIND, "device": lambda i: "%s=%s" % (KIND, i)}
    finally:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            spec.unlink()                             # the last user
        except (BlockingIOError, FileNotFoundError):
            pass                                      # another user still holds it: that one removes it
        os.close(fd)                                  # drops the flock


@pytest.fixture(scope="module")
def cdi_gpus():
    """``{"spec", "dev_dir", "kind", "device"}``: the spec's path, the directory of its ``nvidia<N>`` files, the CDI
    kind, and ``device(i)`` -> ``"nvidia.com/gpu=<i>"`` for ``podman run --device``. 8 GPUs (as ``sim_node``)."""
    with cdi_spec() as spec:
        yield spec
