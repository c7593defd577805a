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
names cannot work. The spec has one fixed name, ``gpusim-tests.json`` (a leftover of a killed run is simply
overwritten), and the fixture holds an exclusive ``flock`` on /var/run/cdi/.gpusim-tests.lock from writing the spec
to removing it: a second pytest worker or run that needs it waits (up to ``LOCK_WAIT_S``) and then fails, naming the
lock. Under ``--dist loadfile`` the module that uses it runs on one worker anyway. The empty lock file stays (removing
it would let a waiter lock an unlinked file while a third run creates a new one).
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


def _lock(path):
    fd = os.open(str(path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    end = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= end:
                os.close(fd)
                raise AssertionError("another test run has held %s for %d s (it owns %s); wait for it to finish"
                                     % (path, LOCK_WAIT_S, CDI_DIR / SPEC_NAME))
            time.sleep(0.5)


@contextlib.contextmanager
def cdi_spec(dev_dir, gpus=8):
    """Write the spec of ``gpusim cdi-spec`` for ``gpus`` simulated GPUs (device files in ``dev_dir``) to
    /var/run/cdi under the flock, yield ``{"spec", "dev_dir", "kind", "device"}``, then remove the spec and drop the
    lock. For callers outside pytest (bench/container.py); the fixture :func:`cdi_gpus` is this with a tmp dir."""
    if os.geteuid() != 0:
        raise AssertionError("the CDI spec of the simulated GPUs goes into %s: run as root" % CDI_DIR)
    CDI_DIR.mkdir(parents=True, exist_ok=True)
    fd = _lock(CDI_DIR / LOCK_NAME)
    spec = CDI_DIR / SPEC_NAME
    try:
        dev_dir = pathlib.Path(dev_dir)
        dev_dir.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run([str(SIM_BIN / "gpusim"), "cdi-spec", "--out", str(spec), "--dev-dir", str(dev_dir),
                               "--gpus", str(gpus), "--kind", KIND], capture_output=True, text=True, timeout=60, check=False)
        if proc.returncode != 0:
            raise AssertionError("gpusim cdi-spec failed (%d): %s" % (proc.returncode, proc.stderr))
        devices = json.loads(proc.stdout)["devices"]
        if devices != [str(i) for i in range(gpus)] + ["all"]:
            raise AssertionError("gpusim cdi-spec wrote devices %s, not 0..%d and all: %s" % (devices, gpus - 1, proc.stdout))
        yield {"spec": spec, "dev_dir": dev_dir, "kind": KIND, "device": lambda i: "%s=%s" % (KIND, i)}
    finally:
        try:
            spec.unlink()
        except FileNotFoundError:
            pass
        os.close(fd)                                   # drops the flock


@pytest.fixture(scope="module")
def cdi_gpus(tmp_path_factory):
    """``{"spec", "dev_dir", "kind", "device"}``: the spec's path, the directory of its ``nvidia<N>`` files, the CDI
    kind, and ``device(i)`` -> ``"nvidia.com/gpu=<i>"`` for ``podman run --device``. 8 GPUs (as ``sim_node``)."""
    with cdi_spec(tmp_path_factory.mktemp("cdi-dev")) as spec:
        yield spec
