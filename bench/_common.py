"""Shared helpers of `make bench`: environment, process bookkeeping, tables.

Every process the benchmark starts is recorded here by PID (and start time)
and stopped by PID at the end: never by name or pattern.
"""
from __future__ import annotations

import datetime
import json
import os
import re
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


def _clk_tck():
    return float(os.sysconf("SC_CLK_TCK"))


def boot_offset():
    """Epoch seconds at CLOCK_BOOTTIME zero, to ~1 us: ``time.time() - clock_gettime(CLOCK_BOOTTIME)``.

    /proc/<pid>/stat's starttime counts clock ticks of CLOCK_BOOTTIME (Linux >= 5.5; CLOCK_MONOTONIC
    before, identical on a machine that never suspended). Pairing the two clocks here gives an offset
    with the precision of the clocks themselves, where /proc/stat's ``btime`` is truncated to whole
    seconds (the old bench was off by up to 1 s; see ``clock_check``). The tightest of a few paired
    readings is kept.
    """
    best = None
    for dummy in range(5):
        a = time.time()
        b = time.clock_gettime(time.CLOCK_BOOTTIME)
        c = time.time()
        if best is None or c - a < best[0]:
            best = (c - a, (a + c) / 2.0 - b)
    return best[1]


def proc_start_epoch(pid):
    """Wall-clock start of a live process, or None. starttime is truncated to a clock tick (10 ms), so
    the start lies in [ticks, ticks + 1) / CLK_TCK: the middle of that tick is returned (error <= 5 ms)."""
    ticks = proc_starttime(pid)
    if ticks is None:
        return None
    return boot_offset() + (ticks + 0.5) / _clk_tck()


def proc_start_epoch_btime(pid):
    """The old bench's conversion (btime, whole seconds): kept only to measure its error."""
    ticks = proc_starttime(pid)
    if ticks is None:
        return None
    with open("/proc/stat") as fh:
        btime = next(int(line.split()[1]) for line in fh if line.startswith("btime "))
    return btime + ticks / _clk_tck()


def clock_check(samples=20):
    """How far each conversion puts a process's start from when it really started.

    Each sample forks a ``sleep`` between two time.time() readings (the fork happens inside that
    bracket) and converts its starttime both ways. Returns the signed error against the middle of
    the bracket (median, and the largest in absolute value) per method, and the bracket's width.
    """
    errs = {"btime": [], "boottime": []}
    widths = []
    for dummy in range(samples):
        t0 = time.time()
        proc = subprocess.Popen(["sleep", "5"], stdin=subprocess.DEVNULL)
        t1 = time.time()
        try:
            mid = (t0 + t1) / 2.0
            widths.append(t1 - t0)
            errs["btime"].append(proc_start_epoch_btime(proc.pid) - mid)
            errs["boottime"].append(proc_start_epoch(proc.pid) - mid)
        finally:
            proc.kill()
            proc.wait()
    out = {"samples": samples, "bracket_s": median(widths), "clk_tck": _clk_tck()}
    for key, vals in errs.items():
        out[key] = {"median_s": median(vals), "max_abs_s": max(abs(v) for v in vals)}
    return out


def tree_cpu(pid):
    """CPU seconds (user + system, with reaped children) of a live process and its live descendants."""
    total, todo, seen = 0.0, [pid], set()
    tck = _clk_tck()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            with open("/proc/%d/stat" % p, "rb") as fh:
                data = fh.read().decode("ascii", "replace")
        except OSError:
            continue
        f = data[data.rfind(")") + 2:].split()
        total += sum(int(x) for x in f[11:15]) / tck
        try:
            for tid in os.listdir("/proc/%d/task" % p):
                with open("/proc/%d/task/%s/children" % (p, tid)) as fh:
                    todo.extend(int(x) for x in fh.read().split())
        except OSError:
            pass
    return total


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
# Module runs, counted and timed on the node side
# ---------------------------------------------------------------------------

# The host's ansible_python_interpreter. Every module run (AnsiballZ, piped on stdin with pipelining)
# goes through it: it runs the real interpreter as its child, waits, and writes one record per run
# with the start and end (EPOCHREALTIME, us) and bash's `times` (the shell's own CPU, then that of its
# waited-for children: the module process and everything it waited for, nvidia-smi included; a
# server the module launched is not waited for and not counted). `times` runs in this shell with a
# redirection, no subshell, so the children's figures are this shell's own. ~2 ms CPU per run.
MODULE_WRAPPER = """#!/bin/bash
# make bench: module interpreter wrapper (bench/_common.py)
s=$EPOCHREALTIME
{run}
rc=$?
e=$EPOCHREALTIME
rec={recdir}/$$.rec
printf '%s %s %s\\n' "$s" "$e" "$rc" >"$rec"
times >>"$rec"
exit $rc
"""
RUN_PLAIN = '{python} "$@"'
# --profile: the module process runs under cProfile (<recdir>/<pid>.prof). The payload (piped with
# pipelining) is saved to a file and run from a -c bootstrap, so that __main__ has no __file__ (AnsiballZ
# strips the directory of __main__.__file__ from sys.path: with `-m cProfile` that is the stdlib).
RUN_PROFILED = """src={recdir}/$$.py
if [ $# -eq 0 ]; then cat >"$src"; else cp "$1" "$src"; fi
{python} -c 'import cProfile, sys
p, out = sys.argv[1], sys.argv[2]
sys.argv = [p]
cProfile.runctx(compile(open(p).read(), p, "exec"), {{"__name__": "__main__"}}, None, out)' "$src" {recdir}/$$.prof"""


def write_module_wrapper(path, recdir, profile=False):
    os.makedirs(recdir, exist_ok=True)
    run = (RUN_PROFILED if profile else RUN_PLAIN).format(python=PYTHON, recdir=recdir)
    with open(path, "w") as fh:
        fh.write(MODULE_WRAPPER.format(run=run, recdir=recdir))
    os.chmod(path, 0o755)
    return path


# The nodes' nvidia-smi: the simulator's, with one line per call ("<start> <end> <args>", epoch seconds)
# appended after the call, to count the calls and place them against the outage window.
TIMED_SMI = """#!/bin/bash
s=$EPOCHREALTIME
{smi} "$@"
rc=$?
printf '%s %s %s\\n' "$s" "$EPOCHREALTIME" "$*" >>{log}
exit $rc
"""


def write_timed_smi(path, log):
    with open(path, "w") as fh:
        fh.write(TIMED_SMI.format(smi=NVIDIA_SMI, log=log))
    os.chmod(path, 0o755)
    return path


def read_smi_calls(log, clear=True):
    calls = []
    try:
        with open(log) as fh:
            for line in fh:
                parts = line.split(" ", 2)
                if len(parts) >= 2:
                    calls.append((float(parts[0]), float(parts[1]), parts[2].strip() if len(parts) > 2 else ""))
    except (OSError, ValueError):
        return calls
    if clear:
        os.unlink(log)
    return calls


def _bash_seconds(text):
    minutes, rest = text.rstrip("s").split("m")
    return 60 * int(minutes) + float(rest)


def read_module_runs(recdir, clear=True):
    """The wrapper's records, oldest first: start, end, rc, cpu (the module tree), shell_cpu."""
    runs = []
    for name in sorted(os.listdir(recdir)) if os.path.isdir(recdir) else []:
        if not name.endswith(".rec"):
            continue
        path = os.path.join(recdir, name)
        with open(path) as fh:
            lines = fh.read().split("\n")
        try:
            start, end, rc = lines[0].split()
            own = [_bash_seconds(x) for x in lines[1].split()]
            kids = [_bash_seconds(x) for x in lines[2].split()]
        except (ValueError, IndexError):
            continue
        prof = path[:-4] + ".prof"
        runs.append({"start": float(start), "end": float(end), "rc": int(rc), "cpu": sum(kids),
                     "shell_cpu": sum(own), "prof": prof if os.path.exists(prof) else None})
        if clear:
            os.unlink(path)
    runs.sort(key=lambda r: r["start"])
    return runs


def attach_module_runs(recs, runs):
    """Give each task record of one host the module runs that started inside it (task start..end)."""
    for r in recs:
        r.setdefault("module_runs", [])
    for run in runs:
        owner = None
        for r in recs:
            if r.get("start") is not None and r["start"] - 0.01 <= run["start"] <= r["end"] + 0.01:
                owner = r
        if owner is not None:
            owner["module_runs"].append(run)
    return recs


# ---------------------------------------------------------------------------
# The servers' own stamps (SGLANG_LOG_MS=1: "[YYYY-mm-dd HH:MM:SS.mmm] message", local time)
# ---------------------------------------------------------------------------

LOG_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3})[^\]]*\] (.*)$")
EVENTS = (
    ("sigterm", "SIGTERM received. "),
    ("ready", "The server is fired up and ready to roll!"),
    ("weights_start", "Start update_weights"),
    ("weights_end", "Update weights end."),
    ("flushed", "Cache flushed successfully!"),
)


def server_events(paths, t0, t1):
    """(epoch, kind) of the life-cycle lines logged in [t0, t1] in these log files, in time order."""
    out = []
    for path in paths:
        try:
            fh = open(path, errors="replace")
        except OSError:
            continue
        with fh:
            for line in fh:
                m = LOG_LINE.match(line)
                if not m:
                    continue
                kind = next((k for k, prefix in EVENTS if m.group(2).startswith(prefix)), None)
                if kind is None:
                    continue
                at = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp()
                if t0 <= at <= t1:
                    out.append((at, kind))
    out.sort()
    return out


def _first(events, kind, after):
    return next((at for at, k in events if k == kind and at >= after), None)


def outage_from_events(events, new_start):
    """The users' outage of one redeploy, from the servers' stamps and the new server's process start.

    restart: from the old server's "SIGTERM received" to the new server's "ready to roll" (the first one
    logged after its process started); startup = ready - process start; added = process start - SIGTERM
    (the old server's exit, the GPU and port checks, the spawn). weights: from "Start update_weights" to
    "Update weights end." (or the cache flush that follows it). None when the lines are not there.
    """
    sig = _first(events, "sigterm", 0.0)
    if sig is not None and new_start is not None:
        ready = _first(events, "ready", new_start - 0.005)
        if ready is None:
            return None
        return {"kind": "restart", "sigterm_at": sig, "new_start": new_start, "ready_at": ready,
                "outage_s": ready - sig, "startup_s": ready - new_start, "added_s": new_start - sig}
    start = _first(events, "weights_start", 0.0)
    if start is not None:
        end = _first(events, "weights_end", start)
        if end is None:
            return None
        flushed = _first(events, "flushed", end)
        if flushed is not None and flushed - end < 2.0:
            end = flushed
        return {"kind": "weights", "update_at": start, "outage_s": end - start}
    return None


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
    if profile:
        env["GPUFLEET_BENCH_WORKER_PROFILE"] = timing.replace("timing-", "workers-")[:-5]
        os.makedirs(env["GPUFLEET_BENCH_WORKER_PROFILE"])
    argv = [PYTHON, os.path.join(BENCH, "_playbook.py")] + list(args)
    cpu0 = children_cpu()
    t0_epoch = time.time()
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        rc = subprocess.call(argv, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    wall = time.monotonic() - t0
    cpu = children_cpu() - cpu0
    out = {"rc": rc, "wall": wall, "cpu": cpu, "cpu_main": None, "cpu_main_children": None, "workers": None,
           "worker_profiles": env.get("GPUFLEET_BENCH_WORKER_PROFILE"),
           "timing": None, "log": log_path, "t0": t0_epoch, "t1": t0_epoch + wall}
    if os.path.exists(rusage):
        with open(rusage) as fh:
            data = json.load(fh)
        out["cpu_main"] = data["self"]
        out["cpu_main_children"] = data.get("children")
        out["workers"] = data.get("workers")
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
