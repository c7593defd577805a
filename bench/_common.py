"""Shared helpers of `make bench`: environment, process bookkeeping, tables.

Every process the benchmark starts is recorded here by PID (and start time)
and stopped by PID at the end: never by name or pattern.
"""
from __future__ import annotations

import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, "bench")
VENV_BIN = os.path.join(REPO, ".venv", "bin")
SIM_BIN = os.path.join(REPO, "simulator", "bin")
SIM_PY = os.path.join(REPO, "simulator", "python")
PYTHON = os.path.join(VENV_BIN, "python")
NVIDIA_SMI = os.path.join(SIM_BIN, "nvidia-smi")
GPUSIM = os.path.join(SIM_BIN, "gpusim")
# The venv comes first: the fake nvidia-smi is `#!/usr/bin/env python3`, and a
# pyenv shim there costs ~300 ms per call.
NODE_PATH = ":".join([VENV_BIN, SIM_BIN, "/usr/local/bin", "/usr/bin", "/bin"])

if SIM_PY not in sys.path:
    sys.path.insert(0, SIM_PY)


def base_env(**extra):
    env = dict(os.environ)
    env["PATH"] = "%s:%s:%s" % (VENV_BIN, SIM_BIN, env.get("PATH", ""))
    env["ANSIBLE_COLLECTIONS_PATH"] = os.path.join(REPO, ".collections")
    env["ANSIBLE_CONFIG"] = os.path.join(REPO, "ansible.cfg")
    env.pop("ANSIBLE_CALLBACKS_ENABLED", None)
    env["ANSIBLE_NOCOLOR"] = "1"
    env["ANSIBLE_DEPRECATION_WARNINGS"] = "0"
    env["ANSIBLE_LOCALHOST_WARNING"] = "0"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def loadavg():
    return [round(x, 2) for x in os.getloadavg()]


# ---------------------------------------------------------------------------
# Processes, by PID
# ---------------------------------------------------------------------------

def proc_starttime(pid):
    """/proc/<pid>/stat field 22 (clock ticks after boot), or None when gone."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            data = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = data[data.rfind(")") + 2:].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def proc_start_epoch(pid):
    """Wall-clock start of a live process (10 ms resolution), or None."""
    ticks = proc_starttime(pid)
    if ticks is None:
        return None
    with open("/proc/stat") as fh:
        btime = next(int(line.split()[1]) for line in fh if line.startswith("btime "))
    return btime + ticks / float(os.sysconf("SC_CLK_TCK"))


class Tracked(object):
    """One process we started (or the playbook started for us), pinned by a pidfd when possible."""

    def __init__(self, pid, what):
        self.pid = pid
        self.what = what
        self.starttime = proc_starttime(pid)
        self.pidfd = None
        try:
            self.pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            pass

    def alive(self):
        if self.starttime is None:
            return False
        return proc_starttime(self.pid) == self.starttime

    def send(self, sig):
        if not self.alive():
            return False
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, sig)
            else:
                os.kill(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def close(self):
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


class Registry(object):
    """Every process the benchmark is responsible for, stopped by PID at the end."""

    def __init__(self):
        self.items = []

    def add(self, pid, what):
        item = Tracked(pid, what)
        if item.starttime is not None:
            self.items.append(item)
        return item

    def stop(self, items=None, grace=10.0):
        items = list(self.items if items is None else items)
        for item in items:
            item.send(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(i.alive() for i in items):
            time.sleep(0.05)
        for item in items:
            if item.send(signal.SIGKILL):
                sys.stderr.write("bench: SIGKILL %s (PID %d)\n" % (item.what, item.pid))
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(i.alive() for i in items):
            time.sleep(0.05)
        for item in items:
            item.close()
            if item in self.items:
                self.items.remove(item)


REGISTRY = Registry()


def spawn_detached(argv, env, log_path, cwd=None):
    """Start ``argv`` in its own session, not as our child (its CPU stays out of our rusage).

    Returns the PID. The intermediate ``sh`` exits at once and is reaped here.
    """
    script = 'exec setsid "$@" >"$BENCH_LOG" 2>&1 </dev/null & echo $!'
    env = dict(env, BENCH_LOG=log_path)
    out = subprocess.run(["/bin/sh", "-c", script, "sh"] + list(argv), env=env, cwd=cwd, check=True,
                         stdout=subprocess.PIPE, stdin=subprocess.DEVNULL).stdout
    return int(out.decode().strip().splitlines()[-1])


def free_ports(count):
    """``count`` distinct TCP ports that are free on 127.0.0.1 right now."""
    socks, ports = [], []
    try:
        for dummy in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def wait_http_ok(ports, timeout=120.0):
    """Wait until ``GET /health`` answers 200 on every port; returns the ports that never did."""
    import urllib.request
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    pending = set(ports)
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for port in sorted(pending):
            try:
                if opener.open("http://127.0.0.1:%d/health" % port, timeout=2).status == 200:
                    pending.discard(port)
            except Exception:  # pylint: disable=broad-except
                pass
        if pending:
            time.sleep(0.2)
    return sorted(pending)


# ---------------------------------------------------------------------------
# ansible-playbook, measured
# ---------------------------------------------------------------------------

def children_cpu():
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_playbook(args, env, log_path, workdir, profile=False, cprofile=None):
    """Run ansible-playbook through bench/_playbook.py; returns the measurements.

    ``wall``: subprocess start to exit. ``cpu``: CPU seconds of the whole
    ansible-playbook process tree (RUSAGE_CHILDREN delta: the controller
    process, its forked workers and the modules they ran). ``cpu_main``: the
    controller's main process alone. ``timing``: the bench_timing callback's
    per-host task records.
    """
    timing = os.path.join(workdir, "timing-%d.json" % time.monotonic_ns())
    rusage = timing.replace("timing-", "rusage-")
    callbacks = ["bench_timing"]
    if profile:
        callbacks += ["ansible.posix.profile_tasks", "ansible.posix.profile_roles"]
    env = dict(env)
    env.update({
        "ANSIBLE_CALLBACK_PLUGINS": os.path.join(BENCH, "callback_plugins"),
        "ANSIBLE_CALLBACKS_ENABLED": ",".join(callbacks),
        "GPUFLEET_BENCH_TIMING": timing,
        "GPUFLEET_BENCH_RUSAGE": rusage,
    })
    if cprofile:
        env["GPUFLEET_BENCH_CPROFILE"] = cprofile
    argv = [PYTHON, os.path.join(BENCH, "_playbook.py")] + list(args)
    cpu0 = children_cpu()
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        rc = subprocess.call(argv, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    wall = time.monotonic() - t0
    cpu = children_cpu() - cpu0
    out = {"rc": rc, "wall": wall, "cpu": cpu, "cpu_main": None, "timing": None, "log": log_path}
    if os.path.exists(rusage):
        with open(rusage) as fh:
            data = json.load(fh)
        out["cpu_main"] = data["self"]
    if os.path.exists(timing):
        with open(timing) as fh:
            out["timing"] = [json.loads(line) for line in fh if line.strip()]
    return out


# ---------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------

def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(value, digits=2, suffix=""):
    if value is None:
        return "-"
    if isinstance(value, float):
        return ("%%.%df%%s" % digits) % (value, suffix)
    return "%s%s" % (value, suffix)


def table(headers, rows):
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        lines.append("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
