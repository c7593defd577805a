"""Starting the holder/decoy processes and cleaning them up, by PID only."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from . import SIM_PY

HOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "holder.py")


def proc_state(pid):
    """The one-letter state from ``/proc/<pid>/stat``, or None when there is no such process."""
    try:
        with open("/proc/%d/stat" % int(pid), "r", encoding="utf-8", errors="replace") as fh:
            data = fh.read()
    except (OSError, ValueError):
        return None
    try:
        return data[data.rindex(")") + 2]
    except (ValueError, IndexError):
        return None


def is_alive(pid):
    """True while the process exists and is not a zombie."""
    state = proc_state(pid)
    return state is not None and state not in ("Z", "X")


def reap(pid):
    try:
        os.waitpid(int(pid), os.WNOHANG)
    except (ChildProcessError, OSError):
        pass


def kill_pids(pids, sig=signal.SIGKILL, timeout=10.0):
    """Send ``sig`` to each live PID in ``pids``, then wait (and reap our own) until they are gone.

    Returns the PIDs still alive after ``timeout``.
    """
    pids = [int(p) for p in pids if p]
    for pid in pids:
        if is_alive(pid):
            try:
                os.kill(pid, sig)
            except OSError:
                pass
    end = time.monotonic() + timeout
    left = list(pids)
    while left and time.monotonic() < end:
        for pid in left:
            reap(pid)
        left = [p for p in left if is_alive(p)]
        if left:
            time.sleep(0.02)
    for pid in pids:
        reap(pid)
    return left


class Holder(object):
    """A started holder/decoy: ``pid``, ``info`` (its ready JSON), ``popen``."""

    def __init__(self, popen, info, log):
        self.popen = popen
        self.pid = popen.pid
        self.info = info
        self.log = log

    @property
    def child_pid(self):
        child = self.info.get("child") or {}
        return child.get("pid")

    @property
    def keeper_pid(self):
        return self.info.get("keeper_pid")

    def pids(self):
        return [p for p in (self.pid, self.child_pid, self.keeper_pid) if p]

    def poll(self):
        return self.popen.poll()


class Spawner(object):
    """Starts holders with a common environment and kills everything it started at :meth:`close`.

    ``allocator`` is passed to holder.py; ``env`` is the base environment (for
    real GPUs it gets ``CUDA_VISIBLE_DEVICES=<uuid>``; for the simulator the
    caller passes the SimNode env).
    """

    def __init__(self, allocator="auto", env=None, python=None, visible=None, workdir=None):
        self.allocator = allocator
        self.python = python or sys.executable
        self.env = dict(os.environ if env is None else env)
        if visible:
            self.env["CUDA_VISIBLE_DEVICES"] = visible
            self.env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        if allocator == "gpusim":
            path = self.env.get("PYTHONPATH", "")
            if SIM_PY not in path.split(os.pathsep):
                self.env["PYTHONPATH"] = SIM_PY + (os.pathsep + path if path else "")
        self._own_workdir = workdir is None
        self.workdir = workdir or tempfile.mkdtemp(prefix="gpukit-procs-")
        self.started = []
        self._n = 0

    def start(self, role, mib=0, child_mib=0, keeper=False, ignore_sigterm=False, timeout=120.0):
        self._n += 1
        ready = os.path.join(self.workdir, "%s-%d.json" % (role, self._n))
        log = os.path.join(self.workdir, "%s-%d.log" % (role, self._n))
        argv = [self.python, HOLDER, "--role", role, "--allocator", self.allocator, "--ready", ready,
                "--timeout", str(timeout)]
        if mib:
            argv += ["--mib", str(mib)]
        if child_mib:
            argv += ["--child-mib", str(child_mib)]
        if keeper:
            argv.append("--keeper")
        if ignore_sigterm:
            argv.append("--ignore-sigterm")
        with open(log, "wb") as fh:
            popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                     env=self.env, start_new_session=True, close_fds=True)
        holder = Holder(popen, {}, log)
        self.started.append(holder)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if os.path.exists(ready):
                with open(ready, "r", encoding="utf-8") as fh:
                    holder.info = json.load(fh)
                if not holder.info.get("ok"):
                    raise RuntimeError("holder %s failed: %s" % (role, holder.info.get("error")))
                return holder
            if popen.poll() is not None:
                raise RuntimeError("holder %s exited with %s before it was ready: %s" % (
                    role, popen.returncode, _tail(log)))
            time.sleep(0.05)
        raise RuntimeError("holder %s not ready after %.0f s: %s" % (role, timeout, _tail(log)))

    def all_pids(self):
        pids = []
        for h in self.started:
            pids.extend(h.pids())
        return pids

    def close(self):
        left = kill_pids(self.all_pids())
        for h in self.started:
            try:
                h.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self.started = []
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return left

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _tail(path, n=20):
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as fh:
            return " | ".join(fh.read().splitlines()[-n:])
    except OSError:
        return "(no log)"
