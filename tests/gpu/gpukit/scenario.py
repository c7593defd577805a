"""The kit's checks, runnable against a real GPU or (rehearsal) the simulator.

Each ``check_*`` function takes a :class:`KitContext`, records its
measurements in ``ctx.results`` and returns ``(status, message, details)``
with status ``passed``, ``failed`` or ``skipped``. ``tests/gpu/test_real_gpu.py``
calls them one per test; the self-tests call them in simulator mode.

Only processes the kit started are ever signalled, by PID; on a real GPU the
teardown checks refuse to run when GPU 0 has compute processes the kit did
not start.
"""
from __future__ import annotations

import os
import shutil
import signal
import statistics
import tempfile
import time

from . import CAPTURES_DIR, gpu_query
from . import queries as Q
from . import shape as S
from .ansible_run import run_module
from .gpu import SimNode, detect, DEFAULT_SIM_MODEL
from .procs import Spawner, is_alive, kill_pids

MIB = 1024 * 1024
HOLDER_MATCH = r"gpukit/holder\.py"     # gpu_drain `match`: only the kit's holders can ever be targeted
IDLE_TOLERANCE_MIB = 16                  # gpu_memory_assert's default max_used_mib


class KitContext(object):
    """Everything the checks share.

    ``mode`` is ``real`` (nvidia-smi on PATH, CUDA allocator, pynvml) or
    ``sim`` (a private simulator node plays the GPU, allocator ``gpusim``,
    :class:`gpukit.simnvml.SimNvml` plays NVML).
    """

    def __init__(self, mode, results, masker, env=None, python=None, allocator="auto", mib=10240,
                 child_mib=1024, busy_mib=1024, latency_repeats=3, polls=20, update_captures=True,
                 captures_dir=CAPTURES_DIR, sim=None, workdir=None):
        import sys
        self.mode = mode
        self.results = results
        self.masker = masker
        self.env = dict(os.environ if env is None else env)
        self.python = python or sys.executable
        self.allocator = "gpusim" if mode == "sim" else allocator
        self.mib = int(mib)
        self.child_mib = int(child_mib)
        self.busy_mib = int(busy_mib)
        self.latency_repeats = int(latency_repeats)
        self.polls = int(polls)
        self.update_captures = update_captures and mode == "real"
        self.captures_dir = captures_dir
        self.sim = sim                       # the SimNode playing the GPU in sim mode
        self.workdir = workdir or tempfile.mkdtemp(prefix="gpukit-")
        self.gpu = detect(env=self.env)
        self.uuid0 = self.gpu.gpus[0]["uuid"] if self.gpu.ok else None
        self._nvml = None

    # -- helpers -------------------------------------------------------------
    def close(self):
        """Remove the scratch directory (holders are stopped by their Spawner)."""
        shutil.rmtree(self.workdir, ignore_errors=True)

    def spawner(self):
        return Spawner(allocator=self.allocator, env=self.env, python=self.python,
                       visible=self.uuid0 if self.mode == "real" else None,
                       workdir=tempfile.mkdtemp(prefix="procs-", dir=self.workdir))

    def smi_backend(self):
        gq = gpu_query()
        return gq.NvidiaSmiBackend(gq.subprocess_runner(timeout=60, env=self.env), "nvidia-smi")

    def nvml_module(self):
        """pynvml (real) or SimNvml (sim); None when pynvml is missing."""
        if self._nvml is None:
            if self.mode == "sim":
                from .simnvml import SimNvml
                self._nvml = SimNvml(self.env.get("GPUSIM_ROOT"))
            else:
                try:
                    import pynvml  # pylint: disable=import-outside-toplevel  # optional, imported only when used
                    self._nvml = pynvml
                except ImportError:
                    return None
        return self._nvml

    def nvml_backend(self):
        lib = self.nvml_module()
        if lib is None:
            return None
        return gpu_query().NvmlBackend(lib)

    def poller(self):
        """Fast GPU-0 poller: ``poll() -> (used_mib, [pids])`` through NVML (or SimNvml)."""
        lib = self.nvml_module()
        if lib is not None:
            return NvmlPoller(lib, self.uuid0)
        return SmiPoller(self.smi_backend())

    def sim_model(self):
        return self.gpu.model or DEFAULT_SIM_MODEL

    def set_environment(self):
        res = self.run_quick(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        driver = res[1].strip().splitlines()[0] if res[0] == 0 and res[1].strip() else None
        self.results.set_env(gpu=self.gpu.to_dict(), driver_version=driver, allocator=self.allocator,
                             mode=self.mode)
        return driver

    def run_quick(self, argv):
        rc, out, err, _seconds = Q.run_argv(argv, env=self.env, timeout=60)
        return rc, out, err


class NvmlPoller(object):
    def __init__(self, lib, uuid):
        self.lib = lib
        lib.nvmlInit()
        self.handle = lib.nvmlDeviceGetHandleByUUID(uuid) if uuid else lib.nvmlDeviceGetHandleByIndex(0)

    def poll(self):
        mem = self.lib.nvmlDeviceGetMemoryInfo(self.handle, version=getattr(self.lib, "nvmlMemory_v2", None)) \
            if hasattr(self.lib, "nvmlMemory_v2") else self.lib.nvmlDeviceGetMemoryInfo(self.handle)
        procs = self.lib.nvmlDeviceGetComputeRunningProcesses(self.handle)
        return (int(mem.used) + MIB - 1) // MIB, [int(p.pid) for p in procs]


class SmiPoller(object):
    def __init__(self, backend):
        self.backend = backend

    def poll(self):
        snap = self.backend.snapshot()
        gpu = next((g for g in snap["gpus"] if g.get("index") == 0), None)
        if gpu is None:
            return None, []
        return gpu.get("used_mib"), [p["pid"] for p in gpu.get("processes", [])]


def wait_for(fn, timeout, interval=0.05):
    """Call ``fn`` until it returns a truthy value or ``timeout`` passes; returns the last value."""
    end = time.monotonic() + timeout
    value = fn()
    while not value and time.monotonic() < end:
        time.sleep(interval)
        value = fn()
    return value


def poll_until(poller, pred):
    """A ``wait_for`` function: ``poller.poll()`` when ``pred`` holds for it, else None."""
    def check():
        polled = poller.poll()
        return polled if pred(polled) else None
    return check


def _percentile(values, q):
    if not values:
        return None
    values = sorted(values)
    k = max(0, min(len(values) - 1, int(round(q * (len(values) - 1)))))
    return values[k]


# ---------------------------------------------------------------------------
# 1. Format fidelity
# ---------------------------------------------------------------------------

def parse_problems(rec, gpu_count):
    """What the collection's parser makes of one capture: a list of problems (empty = fine)."""
    gq = gpu_query()
    problems = []
    if rec["rc"] != 0:
        return ["nvidia-smi exited %s: %s" % (rec["rc"], (rec["stdout"] or rec["stderr"]).strip()[:200])]
    expected = 1 if rec.get("select") is not None else gpu_count
    if rec["kind"] == "query-gpu":
        gpus, lost, anomalies = gq.parse_query_gpu(rec["stdout"], rec["fields"])
        if anomalies:
            problems.append("unparsed lines: %r" % anomalies[:3])
        if lost:
            problems.append("lost GPUs reported: %r" % lost)
        if len(gpus) != expected:
            problems.append("%d GPU rows parsed, expected %d" % (len(gpus), expected))
        for g in gpus:
            for key in ("index", "uuid", "bus_id", "used_mib", "total_mib", "free_mib", "name"):
                if g.get(key) is None:
                    problems.append("GPU %s: %s unknown (%s)" % (g.get("index"), key, g.get("unknown_fields")))
            if "memory.reserved" in rec["fields"] and g.get("reserved_mib") is None:
                problems.append("GPU %s: reserved_mib unknown" % g.get("index"))
    elif rec["kind"] == "query-apps":
        procs, anomalies = gq.parse_compute_apps(rec["stdout"], rec["fields"])
        if anomalies:
            problems.append("unparsed lines: %r" % anomalies[:3])
        for p in procs:
            if p.get("pid") is None or p.get("gpu_uuid") is None:
                problems.append("process row without pid/uuid: %r" % p)
    elif rec["kind"] == "list":
        from .gpu import parse_list
        if len(parse_list(rec["stdout"])) != expected:
            problems.append("-L listed %d GPUs, expected %d" % (len(parse_list(rec["stdout"])), expected))
    return problems


def memory_arithmetic(rec):
    """``[(index, total, reserved + used + free)]`` for a --query-gpu capture with all four figures."""
    gq = gpu_query()
    out = []
    if rec["kind"] != "query-gpu" or rec["rc"] != 0:
        return out
    gpus, _lost, _anomalies = gq.parse_query_gpu(rec["stdout"], rec["fields"])
    for g in gpus:
        parts = (g.get("reserved_mib"), g.get("used_mib"), g.get("free_mib"))
        if g.get("total_mib") is not None and None not in parts:
            out.append((g["index"], g["total_mib"], sum(parts)))
    return out


def check_fidelity(ctx, out_dir=None):
    queries = Q.collection_queries("nvidia-smi")
    busy = Q.busy_queries(queries)
    details = {"queries": [q.to_dict() for q in queries]}
    real = Q.capture(queries, env=ctx.env, state="idle")
    with ctx.spawner() as sp:
        holder = sp.start("parent", mib=ctx.busy_mib)
        poller = ctx.poller()
        wait_for(lambda: holder.pid in poller.poll()[1], 30)
        real += Q.capture(busy, env=ctx.env, state="busy")
        busy_pid = holder.pid
    other_name = "sim"
    with SimNode(ctx.gpu.count, ctx.sim_model(), seed="gpukit-fidelity") as sim:
        sim_caps = Q.capture(queries, env=sim.env, state="idle")
        sim.hold(gpus="0", mib=ctx.busy_mib)
        sim_caps += Q.capture(busy, env=sim.env, state="busy")
    problems = {}
    for rec in real:
        p = parse_problems(rec, ctx.gpu.count)
        if rec["state"] == "busy" and rec["kind"] == "query-apps" and rec["rc"] == 0:
            procs, _anomalies = gpu_query().parse_compute_apps(rec["stdout"], rec["fields"])
            if busy_pid not in [x["pid"] for x in procs]:
                p.append("the kit's holder (PID %d) is not listed" % busy_pid)
        if p:
            problems["%s@%s" % (rec["slug"], rec["state"])] = p
    diffs = S.compare_captures(real, sim_caps, names=(ctx.mode if ctx.mode == "real" else "sim-a", other_name))
    ctx.results.set_fidelity(diffs)
    arithmetic = [a for rec in real for a in memory_arithmetic(rec)]
    details["memory_arithmetic"] = {"checked": len(arithmetic),
                                    "mismatches": [a for a in arithmetic if a[1] != a[2]]}
    details["parse_problems"] = problems
    details["capture_seconds"] = {"%s@%s" % (r["slug"], r["state"]): r["seconds"] for r in real}
    source = Q.model_slug(ctx.gpu.name) if ctx.mode == "real" else "sim-" + Q.model_slug(ctx.gpu.name)
    meta = {"model": ctx.gpu.model, "gpu_name": ctx.gpu.name, "gpu_count": ctx.gpu.count,
            "driver_version": ctx.results.data["environment"].get("driver_version"),
            "captured_with": "tests/gpu/run.sh"}
    written = []
    if out_dir:
        kind = "real-gpu" if ctx.mode == "real" else "sim"
        entries = Q.write_captures(real, os.path.join(out_dir, "captures"), source, ctx.masker, dict(meta, source_kind=kind))
        written += [e["file"] for e in entries]
    if ctx.update_captures:
        Q.write_captures(real, ctx.captures_dir, source, ctx.masker, dict(meta, source_kind="real-gpu"))
        details["captures_updated"] = ctx.captures_dir
    details["captures_written"] = written
    leaks = []
    for rec in real:
        leaks += ctx.masker.leaks(ctx.masker.mask(rec["stdout"]))
    if leaks:
        problems["masking"] = leaks
    n_diff = sum(1 for v in diffs.values() if v)
    if problems or n_diff:
        msg = "%d of %d queries differ in shape from the simulator; %d with parse problems" % (
            n_diff, len(diffs), len(problems))
        return "failed", msg, details
    return "passed", "%d captures parsed; all %d queries have the simulator's shape" % (len(real), len(diffs)), details


# ---------------------------------------------------------------------------
# 2. NVML versus nvidia-smi
# ---------------------------------------------------------------------------

def compare_snapshots(a, b, tolerance_mib=2):
    """Differences between two backend snapshots (numbers, identity, processes)."""
    diffs = []
    ga = {g.get("uuid"): g for g in a.get("gpus", [])}
    gb = {g.get("uuid"): g for g in b.get("gpus", [])}
    if set(ga) != set(gb):
        diffs.append("GPU sets differ: %s vs %s" % (sorted(ga), sorted(gb)))
    for uuid in sorted(set(ga) & set(gb), key=str):
        x, y = ga[uuid], gb[uuid]
        label = "GPU %s" % x.get("index")
        for key in ("index", "name", "bus_id", "total_mib"):
            if x.get(key) != y.get(key):
                diffs.append("%s %s: %r vs %r" % (label, key, x.get(key), y.get(key)))
        for key in ("used_mib", "free_mib", "reserved_mib"):
            vx, vy = x.get(key), y.get(key)
            if vx is None or vy is None:
                if vx != vy:
                    diffs.append("%s %s: %r vs %r" % (label, key, vx, vy))
            elif abs(vx - vy) > tolerance_mib:
                diffs.append("%s %s: %d vs %d" % (label, key, vx, vy))
        px = {p["pid"]: p.get("used_mib") for p in x.get("processes", [])}
        py = {p["pid"]: p.get("used_mib") for p in y.get("processes", [])}
        if set(px) != set(py):
            diffs.append("%s processes: %s vs %s" % (label, sorted(px), sorted(py)))
        for pid in set(px) & set(py):
            if px[pid] is not None and py[pid] is not None and abs(px[pid] - py[pid]) > tolerance_mib:
                diffs.append("%s PID %d used_mib: %d vs %d" % (label, pid, px[pid], py[pid]))
    return diffs


def _time_polls(backend, n, budget_s=20.0):
    """Milliseconds per full snapshot, ``n`` times or until ``budget_s`` is spent (at least 3)."""
    times = []
    end = time.monotonic() + budget_s
    for i in range(n):
        if i >= 3 and time.monotonic() > end:
            break
        t = time.perf_counter()
        backend.snapshot()
        times.append((time.perf_counter() - t) * 1000.0)
    return times


def check_nvml_vs_smi(ctx):
    nvml = ctx.nvml_backend()
    if nvml is None:
        return "skipped", "pynvml (nvidia-ml-py) is not installed", {}
    smi = ctx.smi_backend()
    t = time.perf_counter()
    init_fail = nvml.init()
    nvml_init_ms = (time.perf_counter() - t) * 1000.0
    if init_fail:
        return "failed", "NVML did not initialise: %s" % init_fail.get("message"), {"driver": init_fail}
    details = {"nvml_init_ms": round(nvml_init_ms, 3)}
    states = {}
    idle_n, idle_s = nvml.snapshot(), smi.snapshot()
    states["idle"] = compare_snapshots(idle_n, idle_s)
    g0n = next((g for g in idle_n["gpus"] if g.get("uuid") == ctx.uuid0), {})
    g0s = next((g for g in idle_s["gpus"] if g.get("uuid") == ctx.uuid0), {})
    ctx.results.measure("idle_used_mib", g0s.get("used_mib"))
    details["idle_gpu0"] = {"nvml": {k: g0n.get(k) for k in ("used_mib", "reserved_mib", "free_mib", "total_mib")},
                            "nvidia-smi": {k: g0s.get(k) for k in ("used_mib", "reserved_mib", "free_mib", "total_mib")},
                            "processes": [p["pid"] for p in g0s.get("processes", [])]}
    with ctx.spawner() as sp:
        holder = sp.start("parent", mib=ctx.busy_mib)
        poller = ctx.poller()
        wait_for(lambda: holder.pid in poller.poll()[1], 30)
        busy_n, busy_s = nvml.snapshot(), smi.snapshot()
        states["busy"] = compare_snapshots(busy_n, busy_s)
        g0 = next((g for g in busy_s["gpus"] if g.get("uuid") == ctx.uuid0), {})
        mine = [p for p in g0.get("processes", []) if p["pid"] == holder.pid]
        details["busy_gpu0"] = {"used_mib": g0.get("used_mib"), "holder_listed_mib": mine[0].get("used_mib") if mine else None,
                                "allocated_mib": ctx.busy_mib}
        nvml_ms = _time_polls(nvml, ctx.polls)
        smi_ms = _time_polls(smi, ctx.polls)
    nvml.close()
    diffs = ["%s: %s" % (state, d) for state, ds in states.items() for d in ds]
    measurement = {
        "same": not diffs, "differences": diffs, "polls": ctx.polls,
        "nvml_ms_median": round(statistics.median(nvml_ms), 3), "nvml_ms_p95": round(_percentile(nvml_ms, 0.95), 3),
        "smi_ms_median": round(statistics.median(smi_ms), 3), "smi_ms_p95": round(_percentile(smi_ms, 0.95), 3),
        "smi_polls": len(smi_ms), "nvml_polls": len(nvml_ms),
        "nvml_init_ms": details["nvml_init_ms"], "gpu_count": ctx.gpu.count,
        "note": "one poll = one full snapshot of every GPU (nvidia-smi: --query-gpu + --query-compute-apps)",
    }
    ctx.results.measure("nvml_vs_smi", measurement)
    details.update(measurement)
    if diffs:
        return "failed", "NVML and nvidia-smi disagree: %s" % "; ".join(diffs[:4]), details
    return "passed", "same numbers idle and busy; per poll NVML %.2f ms, nvidia-smi %.1f ms" % (
        measurement["nvml_ms_median"], measurement["smi_ms_median"]), details


# ---------------------------------------------------------------------------
# 3. Real teardown through Ansible
# ---------------------------------------------------------------------------

def _signalled(result):
    return {int(e["pid"]): e for e in result.get("signalled", []) if e.get("pid") is not None}


def check_teardown(ctx):
    poller = ctx.poller()
    used0, pids0 = poller.poll()
    if pids0:
        return "skipped", "GPU 0 already has compute processes %s the kit did not start; refusing to drain it" % pids0, {}
    threshold = max(IDLE_TOLERANCE_MIB, (used0 or 0) + IDLE_TOLERANCE_MIB)
    details = {"baseline_used_mib": used0, "threshold_mib": threshold}
    with ctx.spawner() as sp:
        decoy = sp.start("decoy")
        nvml_decoy = sp.start("nvml-decoy")
        parent = sp.start("parent", mib=max(ctx.mib - ctx.child_mib, 1), child_mib=ctx.child_mib, keeper=True)
        holders = {"parent": parent.pid, "child": parent.child_pid, "keeper": parent.keeper_pid}
        details["processes"] = dict(holders, decoy=decoy.pid, nvml_decoy=nvml_decoy.pid,
                                    nvml_decoy_mode=nvml_decoy.info.get("mode"),
                                    allocator=parent.info.get("allocator"),
                                    seconds_to_ready=parent.info.get("seconds_to_ready"))
        # CUDA_VISIBLE_DEVICES=<GPU 0's UUID> selects the device; the holder's own view of
        # the UUID is recorded, and being listed on GPU 0 below is what counts.
        if ctx.mode == "real" and parent.info.get("device_uuid"):
            details["processes"]["device_uuid_matches"] = parent.info["device_uuid"].lower() == (ctx.uuid0 or "").lower()
        listed = wait_for(poll_until(poller, lambda r: parent.pid in r[1] and parent.child_pid in r[1]), 30)
        if not listed:
            return "failed", "holders not listed on GPU 0 within 30 s: %r" % (poller.poll(),), details
        details["before"] = {"used_mib": listed[0], "listed_pids": listed[1],
                             "keeper_listed": parent.keeper_pid in listed[1]}
        drain = run_module("gpu_drain", dict({"gpus": [0], "match": [HOLDER_MATCH], "term_timeout": 10, "kill_timeout": 30},
                                             **_dev(ctx)), env=ctx.env, python=ctx.python, timeout=150)
        verify = run_module("gpu_memory_assert", dict({"gpus": [0], "timeout": 90, "sleep": 0.2, "max_used_mib": threshold},
                                                      **_dev(ctx)), env=ctx.env, python=ctx.python, timeout=150)
        alive = {name: is_alive(pid) for name, pid in holders.items() if pid}
        decoys_alive = {"decoy": is_alive(decoy.pid), "nvml_decoy": is_alive(nvml_decoy.pid)}
        after = poller.poll()
        sig = _signalled(drain.result)
        details.update({
            "drain": {"summary": drain.summary(), "backend": drain.result.get("backend"),
                      "elapsed": drain.result.get("elapsed"),
                      "signalled": [{k: e.get(k) for k in ("pid", "role", "signals", "seconds_to_exit", "how")}
                                    for e in drain.result.get("signalled", [])],
                      "skipped": drain.result.get("skipped"), "survivors": drain.result.get("survivors")},
            "assert": {"summary": verify.summary(), "backend": verify.result.get("backend"),
                       "elapsed": verify.result.get("elapsed"), "msg": verify.result.get("msg")},
            "after": {"used_mib": after[0], "listed_pids": after[1]},
            "holders_alive": alive, "decoys_alive": decoys_alive,
        })
    problems = []
    if drain.failed:
        problems.append("gpu_drain failed: %s" % drain.summary())
    if verify.failed:
        problems.append("gpu_memory_assert failed: %s" % verify.summary())
    problems += ["%s (PID %s) still alive" % (n, holders[n]) for n, a in alive.items() if a]
    problems += ["%s was killed" % n for n, a in decoys_alive.items() if not a]
    for name in ("decoy", "nvml_decoy"):
        pid = details["processes"][name]
        if pid in sig:
            problems.append("%s (PID %d) was signalled: %s" % (name, pid, sig[pid].get("signals")))
    for name in ("parent", "child"):
        if holders[name] not in sig:
            problems.append("%s (PID %s) not in gpu_drain's signalled list" % (name, holders[name]))
    if after[0] is None or after[0] > threshold:
        problems.append("GPU 0 used %s MiB after the drain (threshold %d)" % (after[0], threshold))
    if any(p in after[1] for p in holders.values() if p):
        problems.append("holder PIDs still listed: %s" % after[1])
    if problems:
        return "failed", "; ".join(problems), details
    return "passed", "holders (parent, spawned child, forked keeper) gone, decoys alive, GPU 0 back to %s MiB" % after[0], details


def _dev(ctx):
    """The simulator's device files (the modules never read GPUSIM_ROOT); on a real node the default /dev/nvidia*."""
    root = (ctx.env or {}).get("GPUSIM_ROOT")
    return {"device_paths": [root.rstrip("/") + "/dev/nvidia*"]} if ctx.mode != "real" and root else {}


def check_sigterm_escalation(ctx):
    poller = ctx.poller()
    used0, pids0 = poller.poll()
    if pids0:
        return "skipped", "GPU 0 already has compute processes %s the kit did not start; refusing to drain it" % pids0, {}
    threshold = max(IDLE_TOLERANCE_MIB, (used0 or 0) + IDLE_TOLERANCE_MIB)
    term_timeout = 3
    with ctx.spawner() as sp:
        h = sp.start("parent", mib=min(ctx.mib, 2048), ignore_sigterm=True)
        wait_for(lambda: h.pid in poller.poll()[1], 30)
        drain = run_module("gpu_drain", dict({"gpus": [0], "match": [HOLDER_MATCH], "term_timeout": term_timeout,
                                              "kill_timeout": 30}, **_dev(ctx)), env=ctx.env, python=ctx.python, timeout=150)
        verify = run_module("gpu_memory_assert", dict({"gpus": [0], "timeout": 60, "sleep": 0.2, "max_used_mib": threshold},
                                                      **_dev(ctx)), env=ctx.env, python=ctx.python, timeout=150)
        alive = is_alive(h.pid)
        entry = _signalled(drain.result).get(h.pid, {})
    signals = entry.get("signals")
    details = {"pid": h.pid, "signals": signals, "seconds_to_exit": entry.get("seconds_to_exit"),
               "term_timeout": term_timeout, "drain": drain.summary(), "assert": verify.summary(),
               "alive_after": alive}
    ctx.results.measure("sigterm_escalation", {"signals": signals, "seconds_to_exit": entry.get("seconds_to_exit"),
                                               "term_timeout": term_timeout})
    problems = []
    if drain.failed:
        problems.append("gpu_drain failed: %s" % drain.summary())
    if signals != ["SIGTERM", "SIGKILL"]:
        problems.append("signals sent were %r, expected ['SIGTERM', 'SIGKILL']" % (signals,))
    if alive:
        problems.append("the SIGTERM-ignoring holder is still alive")
    if verify.failed:
        problems.append("gpu_memory_assert failed: %s" % verify.summary())
    if problems:
        return "failed", "; ".join(problems), details
    return "passed", "SIGTERM ignored, SIGKILL after %d s, gone after %s s, memory free" % (
        term_timeout, entry.get("seconds_to_exit")), details


# ---------------------------------------------------------------------------
# 4. Memory-release latency after SIGKILL
# ---------------------------------------------------------------------------

def measure_release(poller, holder, threshold, timeout=60.0, kill=True):
    """SIGKILL ``holder`` (unless ``kill`` is False: already killed) and poll tightly.

    Returns seconds from the kill until: the process was reaped (``exit_s``),
    its PID left the compute list (``unlisted_s``), used memory fell to
    ``threshold`` (``free_s``); plus the number of polls.
    """
    t0 = time.monotonic()
    if kill:
        os.kill(holder.pid, signal.SIGKILL)
    exit_s = unlisted_s = free_s = None
    polls = 0
    while time.monotonic() - t0 < timeout:
        now = time.monotonic() - t0
        if exit_s is None and holder.poll() is not None:
            exit_s = now
        used, pids = poller.poll()
        polls += 1
        now = time.monotonic() - t0
        if unlisted_s is None and holder.pid not in pids:
            unlisted_s = now
        if free_s is None and used is not None and used <= threshold:
            free_s = now
        if exit_s is not None and unlisted_s is not None and free_s is not None:
            break
        time.sleep(0.001)
    return {"exit_s": _round4(exit_s), "unlisted_s": _round4(unlisted_s), "free_s": _round4(free_s), "polls": polls}


def _round4(value):
    return None if value is None else round(value, 4)


def check_release_latency(ctx):
    poller = ctx.poller()
    used0, pids0 = poller.poll()
    if pids0:
        return "skipped", "GPU 0 already has compute processes %s the kit did not start" % pids0, {}
    threshold = max(IDLE_TOLERANCE_MIB, (used0 or 0) + IDLE_TOLERANCE_MIB)
    samples = []
    with ctx.spawner() as sp:
        for _repeat in range(ctx.latency_repeats):
            h = sp.start("parent", mib=ctx.mib)
            full = wait_for(poll_until(poller, lambda r: h.pid in r[1] and (r[0] or 0) >= used0 + ctx.mib * 0.9), 30)
            s = measure_release(poller, h, threshold)
            s["used_before_mib"] = full[0] if full else None
            samples.append(s)
        # A forked keeper (inherited descriptors, no CUDA call) after its parent's SIGKILL.
        keeper_mib = min(ctx.mib, 2048)
        k = sp.start("parent", mib=keeper_mib, keeper=True)
        wait_for(lambda: k.pid in poller.poll()[1], 30)
        os.kill(k.pid, signal.SIGKILL)
        k.popen.wait(timeout=30)
        time.sleep(3.0)
        used_k, pids_k = poller.poll()
        keeper = {"mib": keeper_mib, "keeper_alive": is_alive(k.keeper_pid),
                  "used_mib_3s_after_parent_kill": used_k,
                  "memory_held_while_keeper_alive": (used_k or 0) >= used0 + keeper_mib * 0.9,
                  "keeper_listed": k.keeper_pid in pids_k, "parent_listed": k.pid in pids_k, "listed": pids_k}
        t0 = time.monotonic()
        kill_pids([k.keeper_pid], timeout=10)
        t_free = wait_for(lambda: (poller.poll()[0] or 0) <= threshold, 60, interval=0.002)
        keeper["free_s_after_keeper_kill"] = round(time.monotonic() - t0, 4) if t_free else None
    free = [s["free_s"] for s in samples if s["free_s"] is not None]
    exits = [s["exit_s"] for s in samples if s["exit_s"] is not None]
    measurement = {"mib": ctx.mib, "threshold_mib": threshold, "samples": samples,
                   "median_s": round(statistics.median(free), 4) if free else None,
                   "max_s": round(max(free), 4) if free else None,
                   "median_exit_s": round(statistics.median(exits), 4) if exits else None}
    ctx.results.measure("release_latency", measurement)
    ctx.results.measure("forked_keeper", keeper)
    details = {"release_latency": measurement, "forked_keeper": keeper}
    if len(free) != len(samples):
        return "failed", "memory not back to idle within 60 s after SIGKILL in %d of %d runs" % (
            len(samples) - len(free), len(samples)), details
    if keeper["free_s_after_keeper_kill"] is None:
        return "failed", "memory not back to idle after the forked keeper was killed", details
    return "passed", "%d MiB freed after SIGKILL in median %.3f s (max %.3f s); forked keeper held memory: %s" % (
        ctx.mib, measurement["median_s"], measurement["max_s"], keeper["memory_held_while_keeper_alive"]), details
