"""Helpers for the GPU simulator tests (imported by conftest.py and tests).

Every process a test starts goes through the simulator (``gpusim hold``) and
is recorded by PID *and* start time; teardown SIGKILLs exactly those PIDs
(never by name or pattern) and only while the start time still matches, so a
recycled PID is never hit.  While a test runs, this pytest process is a child
subreaper: the double-forked watchers re-parent to it and are reaped here
instead of piling up as zombies under a PID 1 that does not reap.
"""
from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[3]
SIM_BIN = REPO / "simulator" / "bin"
SIM_PY = REPO / "simulator" / "python"
if str(SIM_PY) not in sys.path:
    sys.path.insert(0, str(SIM_PY))

from gpusim import procfs  # noqa: E402 - after simulator/python is put on sys.path


class Result:
    def __init__(self, proc: subprocess.CompletedProcess):
        self.rc = proc.returncode
        self.out_bytes = proc.stdout
        self.err_bytes = proc.stderr
        self.out = proc.stdout.decode()
        self.err = proc.stderr.decode()

    @property
    def lines(self):
        return self.out.splitlines()

    def __repr__(self):
        return "Result(rc=%r, out=%r, err=%r)" % (self.rc, self.out[:400], self.err[:400])


class ProcTracker:
    """PIDs this test started, with their start times."""

    def __init__(self):
        self.procs = {}  # pid -> starttime
        self.reap = set()

    def add(self, pid: int, reap: bool = False) -> None:
        st = procfs.starttime(pid)
        if st is not None:
            self.procs[pid] = st
        if reap:
            self.reap.add(pid)

    def kill_all(self) -> None:
        for pid, st in list(self.procs.items()):
            cur = procfs.read_stat(pid)
            if cur is not None and cur[2] == st:
                try:
                    os.kill(pid, signal.SIGCONT)  # a test may have stopped it
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 5
        pending = set(self.reap) | set(self.procs)
        while pending and time.monotonic() < deadline:
            for pid in list(pending):
                try:
                    done, _status = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:  # not our child (or already reaped)
                    done = pid
                if done == pid:
                    pending.discard(pid)
            if pending:
                time.sleep(0.02)


class Sim:
    """One simulated node in a tmp_path GPUSIM_ROOT."""

    def __init__(self, root: pathlib.Path, tracker: ProcTracker):
        self.root = root
        self.tracker = tracker
        self.env = dict(os.environ)
        self.env["GPUSIM_ROOT"] = str(root)
        self.env["PATH"] = str(SIM_BIN) + os.pathsep + self.env.get("PATH", "")
        for k in list(self.env):
            if k.startswith("GPUSIM_SMI_"):
                del self.env[k]

    # -- running the two executables (through the real wrapper scripts)
    def _run(self, exe: str, args, env=None, timeout=30) -> Result:
        e = dict(self.env)
        e.update(env or {})
        proc = subprocess.run([str(SIM_BIN / exe)] + [str(a) for a in args],
                              env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, timeout=timeout, check=False)
        return Result(proc)

    def gpusim(self, *args, env=None) -> Result:
        return self._run("gpusim", args, env)

    def smi(self, *args, env=None) -> Result:
        return self._run("nvidia-smi", args, env)

    # -- conveniences
    def init(self, gpus=8, model="H200", *extra) -> Result:
        r = self.gpusim("init", "--gpus", gpus, "--model", model, *extra)
        assert r.rc == 0, r
        return r

    def node(self):
        from gpusim.node import Node

        return Node(str(self.root))

    def status(self) -> dict:
        r = self.gpusim("status")
        assert r.rc == 0, r
        return json.loads(r.out)

    def track_hold(self, pid: int) -> None:
        """Record a holder, its watcher and its forked children for teardown."""
        self.tracker.add(pid)
        for h in self.node().holds():
            if h.get("pid") == pid:
                if h.get("watcher_pid"):
                    self.tracker.add(h["watcher_pid"], reap=True)
                for k in h.get("keepers") or ():
                    self.tracker.add(k["pid"], reap=True)

    def hold(self, *args, expect_rc=0) -> int:
        r = self.gpusim("hold", *args)
        assert r.rc == expect_rc, r
        if expect_rc != 0:
            return None
        pid = int(r.out.strip())
        self.track_hold(pid)
        return pid

    def query_gpu(self, fields="index,memory.used,memory.free,memory.reserved,memory.total",
                  ids=None, env=None) -> list:
        args = ["--query-gpu=" + fields, "--format=csv,noheader,nounits"]
        if ids is not None:
            args += ["-i", ids]
        r = self.smi(*args, env=env)
        assert r.rc == 0, r
        return [line.split(", ") for line in r.lines]

    def used(self, gpu: int) -> int:
        rows = self.query_gpu("memory.used", ids=str(gpu))
        return int(rows[0][0])

    def apps(self, ids=None, env=None) -> list:
        args = ["--query-compute-apps=gpu_bus_id,pid,used_memory,process_name",
                "--format=csv,noheader,nounits"]
        if ids is not None:
            args += ["-i", ids]
        r = self.smi(*args, env=env)
        assert r.rc == 0, r
        # process_name last and split with a bound: names may contain ", " (§1.2)
        return [line.split(", ", 3) for line in r.lines]

    def bus(self, gpu: int) -> str:
        return self.node().config()["gpus"][gpu]["pci_bus_id"]


def wait_for(pred, timeout=5.0, interval=0.05, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %.1f s waiting for %s" % (timeout, what))
        time.sleep(interval)
