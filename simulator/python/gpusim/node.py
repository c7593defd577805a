"""The simulated GPU node: state under ``$GPUSIM_ROOT`` and its rules.

Contract: simulator/README.md, section "Node state (GPUSIM_ROOT)".
Ground truth for behaviour: real captures (tests/captures/nvidia-smi/, named
in its manifest.json) and docs/reference/nvidia-smi.md (cited as §N).

Layout::

    $GPUSIM_ROOT/node.json        GPUs, model, driver state (``gpusim init``)
    $GPUSIM_ROOT/lock             fcntl.flock guard (shared: readers, exclusive: writers)
    $GPUSIM_ROOT/holds/<id>.json  one allocation each
    $GPUSIM_ROOT/dev/nvidia<N>    per-GPU "device files" holders keep open
    $GPUSIM_ROOT/dev/nvidiactl, dev/nvidia-uvm
    $GPUSIM_ROOT/resets.log       one line per successful ``nvidia-smi --gpu-reset``

Every file is replaced atomically (write a temporary file, then
``os.replace``), so a reader never sees a half-written JSON document; every
read-modify-write runs under the exclusive lock.

This module is imported by the fake ``nvidia-smi`` on every call: keep its
imports light (no argparse, no hashlib at import time).
"""
from __future__ import annotations

import fcntl
import os
import time

from . import procfs

ROOT_ENV = "GPUSIM_ROOT"
DRIVER_VERSION = "535.261.03"
NVML_VERSION = "535.261"
CUDA_VERSION = "12.2"
# Driver branches the simulator can be, with what their nvidia-smi prints that
# differs (docs/reference/nvidia-smi.md, "Versions"): the CUDA version in the
# banner, and from 610 on the banner's "KMD Version" / "CUDA UMD Version".
DRIVERS = {
    "515.43.04": {"cuda": "11.7", "nvml": "515.43"},
    "520.61.05": {"cuda": "11.8", "nvml": "520.61"},
    "535.261.03": {"cuda": "12.2", "nvml": "535.261"},
    "550.90.07": {"cuda": "12.4", "nvml": "550.90"},
    "580.173.02": {"cuda": "13.0", "nvml": "580.173"},
    "590.48.01": {"cuda": "13.1", "nvml": "590.48"},
    "610.57.04": {"cuda": "13.3", "nvml": "610.57"},
}
# loaded: normal; unloaded: rc 9; nolib: rc 12; mismatch: rc 18;
# nosupported: "Failed to initialize NVML: No supported GPUs were found" (rc 255);
# nvml_unknown: "Failed to initialize NVML: Unknown Error" (rc 255).
DRIVER_STATES = ("loaded", "unloaded", "nolib", "mismatch", "nosupported", "nvml_unknown")
LOST_MODES = ("handle", "fields")
# The NVML error text after a lost GPU's bus id (captures: Unknown Error after
# Xid 79, Not Found, GPU is lost).
LOST_REASONS = ("Unknown Error", "Not Found", "GPU is lost.  Reboot the system to recover this GPU")


def driver_major(version) -> int:
    try:
        return int(str(version).split(".", 1)[0])
    except ValueError:
        return 0


# docs/reference/nvidia-smi.md §1.2: totals and names of common parts.
MODELS = {
    "H200": {"name": "NVIDIA H200", "total_mib": 143771, "pci_device_id": "0x233510DE",
             "power_limit_w": 700},
    "H100": {"name": "NVIDIA H100 80GB HBM3", "total_mib": 81559, "pci_device_id": "0x233010DE",
             "power_limit_w": 700},
}
DEFAULT_RESERVED_MIB = 530
DEFAULT_IDLE_USED_MIB = 1  # §3.1: 0, 1 or 4 MiB on an idle H200

# Reserved memory per model and driver, as idle GPUs report it
# (docs/reference/nvidia-smi.md, "Idle baselines"): an H200 reads 614 MiB on
# 590.48.01 and 616 MiB on 580.173.02, an H100 479 MiB. Other H200 drivers keep
# the simulator's historical 530 MiB (no capture names a figure for them).
RESERVED_MIB = {("H200", "590.48.01"): 614, ("H200", "580.173.02"): 616, ("H100", None): 479, ("H200", None): 530}
# With MIG enabled an idle GPU reads 55-59 MiB used (H200, 590.48.01).
MIG_IDLE_USED_MIB = (55, 59)


def preset_reserved_mib(model: str, driver_version: str) -> int:
    return RESERVED_MIB.get((model, driver_version), RESERVED_MIB.get((model, None), DEFAULT_RESERVED_MIB))


def preset_idle_used_mib(driver_version: str) -> int:
    """0 MiB on an idle GPU of driver 580 and later (H200, 590.48.01), 1 MiB before (H100, 550.90.07)."""
    return 0 if driver_major(driver_version) >= 580 else DEFAULT_IDLE_USED_MIB


# PCI buses of the eight GPUs of a typical HGX H100/H200 baseboard.
HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)

# A hold marked ``foreign_ns`` belongs to a process in another PID namespace
# (the container case of §3.3).  nvidia-smi then lists it under a "host" PID
# that this namespace cannot see: the real PID plus this offset, which is
# above the largest possible pid_max (2**22), so it never names a real process.
PID_NS_OFFSET = 1 << 22

# Hold states (see Node.snapshot):
#   alive      process alive                               counted, listed
#   inherited  process dead, a forked child keeps the fds  counted, not listed (§3.2 b)
#   releasing  dead, within exited_at + release_delay       counted, listed
#   stale      dead but ``stuck``: until a GPU reset        counted, listed (§3.2 stale listing)
#   orphan     no process at all (pid null)                 counted, not listed
#   gone       nothing left                                 not counted (deleted on sight)
COUNTED_STATES = ("alive", "inherited", "releasing", "stale", "orphan")
LISTED_STATES = ("alive", "releasing", "stale")


CDI_ENV = "GPUSIM_CDI"
CDI_DEV_ENV = "GPUSIM_CDI_DEV"


def cdi_devices(env=None) -> list:
    """Host GPU indices whose ``nvidia<N>`` file is in /dev (or ``$GPUSIM_CDI_DEV``), sorted."""
    env = os.environ if env is None else env
    d = env.get(CDI_DEV_ENV) or "/dev"
    try:
        names = os.listdir(d)
    except OSError:
        return []
    return sorted(int(n[6:]) for n in names if n.startswith("nvidia") and n[6:].isdigit())


class SimError(Exception):
    """Base class of simulator errors."""


class DriverError(SimError):
    """The simulated driver cannot be used (not initialised, unloaded, lost GPU)."""


class GpuLost(DriverError):
    def __init__(self, gpu: int, bus_id: str = ""):
        self.gpu = gpu
        self.bus_id = bus_id
        super().__init__("GPU %d (%s) is lost: CUDA error: unknown error" % (gpu, bus_id))


class OutOfMemory(SimError):
    """Raised by ``Node.hold`` / ``Node.orphan``: nothing was allocated."""

    def __init__(self, gpu: int, requested_mib: int, free_mib: int, total_mib: int = 0):
        self.gpu = gpu
        self.requested_mib = requested_mib
        self.free_mib = free_mib
        self.total_mib = total_mib
        super().__init__(
            "CUDA out of memory. Tried to allocate %d MiB. GPU %d has a total capacity of "
            "%d MiB of which %d MiB is free." % (requested_mib, gpu, total_mib, free_mib))


class GpuInUse(SimError):
    """A GPU reset was refused because live processes hold memory on it."""

    def __init__(self, gpus, pids):
        self.gpus = list(gpus)
        self.pids = sorted(set(pids))
        super().__init__("GPU(s) %s in use by PID(s) %s" % (self.gpus, self.pids))


class _ScanContext:
    """Settings object for the C JSON scanner (the same values json.loads uses)."""
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    memo = {}

    @staticmethod
    def parse_constant(name):
        return {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}[name]


_SCANNER = []


def loads(text: str):
    """``json.loads`` without importing ``json`` (which pulls in ``re`` and
    ``enum``: ~12 ms of every nvidia-smi call).  Uses the C scanner from
    ``_json`` directly and falls back to ``json`` for errors and odd input."""
    try:
        if not _SCANNER:
            import _json

            _SCANNER.append(_json.make_scanner(_ScanContext))
        start = len(text) - len(text.lstrip())
        obj, end = _SCANNER[0](text, start)
        if text[end:].strip():
            raise ValueError("trailing data")
        return obj
    except Exception:
        import json

        return json.loads(text)


def dumps(obj, **kw) -> str:
    import json

    return json.dumps(obj, **kw)


def _atomic_write(path: str, data: str) -> None:
    d = os.path.dirname(path)
    tmp = os.path.join(d, ".tmp-%d-%s-%s" % (os.getpid(), os.urandom(4).hex(),
                                             os.path.basename(path)))
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(data)
    os.replace(tmp, path)


def _new_id(prefix: str, pid) -> str:
    return "%s-%d-%s" % (prefix, pid or 0, os.urandom(4).hex())


def evaluate(hold: dict, now: float):
    """Classify one hold at time ``now``.

    Returns ``(state, end)`` where ``end`` is the effective exit time used for
    the release delay (``None`` while something still keeps the memory).  The
    caller stamps ``exited_at`` when the hold has none and the process is seen
    dead (the "first reader that sees the process gone" rule).
    """
    pid = hold.get("pid")
    if pid is None:
        return "orphan", None
    if proc_alive(hold):
        return "alive", None
    if hold.get("stuck"):
        return "stale", None
    keepers = hold.get("keepers") or []
    if any(proc_alive(hold, k.get("pid"), k.get("starttime")) for k in keepers):
        return "inherited", None
    end = hold.get("exited_at")
    if end is None:
        end = now
    if keepers:
        kend = hold.get("keepers_exited_at")
        end = max(end, now if kend is None else kend)
    if now < end + float(hold.get("release_delay") or 0.0):
        return "releasing", end
    return "gone", end


# ------------------------------------------------------- PID namespaces
# A hold made by a process in another PID namespace than the one ``gpusim
# init`` ran in (a container without ``--pid host``) records ``pidns`` (that
# namespace), ``pid`` (the PID inside it), ``starttime`` and ``host_pidns``.
# Readers in the host namespace find the host PID (procfs.find_in_ns) and list
# it, as NVML lists host PIDs; readers inside a container list the host PID if
# a host reader recorded it (``host_pid``), else an invisible PID, as NVML in a
# container does (§3.3).  Holds without ``pidns`` behave as they always did.
UNSEEN = -1  # locate(): the process lives in a namespace this reader cannot see


def _reader_is_host(hold: dict) -> bool:
    me = procfs.self_pid_ns()
    return me is not None and me == hold.get("host_pidns")


def locate(hold: dict, pid=None, start=None):
    """The hold's process (or its keeper ``pid``/``start``) as this reader sees it.

    Returns a PID of this reader's namespace (liveness still to be checked
    with the start time), ``None`` when the process is known to be gone, or
    ``UNSEEN`` when it lives in a namespace this reader cannot look into.
    """
    keeper = pid is not None
    if not keeper:
        pid, start = hold.get("pid"), hold.get("starttime")
    if pid is None:
        return None
    ns = hold.get("pidns")
    if not ns or ns == procfs.self_pid_ns():
        return int(pid)
    if not keeper:
        hint = hold.get("host_pid")
        if hint and procfs.pid_ns(hint) == ns and procfs.is_alive(hint, start) and procfs.ns_pid(hint) == int(pid):
            return int(hint)
    found = procfs.find_in_ns(ns, int(pid), start)
    if found is not None:
        return found
    return None if _reader_is_host(hold) else UNSEEN


def proc_alive(hold: dict, pid=None, start=None) -> bool:
    """Liveness of the hold's process (or keeper), across PID namespaces.

    A process in a namespace this reader cannot see counts as alive: only a
    reader that can see it may declare it gone.
    """
    if pid is None:
        start = hold.get("starttime")
    where = locate(hold, pid, start)
    if where is None:
        return False
    if where == UNSEEN:
        return True
    return procfs.is_alive(where, start)


def same_process(hold: dict, pid) -> bool:
    """True when ``pid`` (a PID of this reader's namespace) names the hold's process."""
    if hold.get("pid") is None or pid is None:
        return False
    pid = int(pid)
    if not hold.get("pidns") or hold.get("pidns") == procfs.self_pid_ns():
        return hold.get("pid") == pid
    if hold.get("host_pid") == pid and _reader_is_host(hold):
        return True
    return locate(hold) == pid


def local_pid(hold: dict, pid=None, start=None):
    """A PID of this reader's namespace for messages: the located one, else the recorded one."""
    where = locate(hold, pid, start)
    if where is None or where == UNSEEN:
        if pid is None and hold.get("host_pid") and _reader_is_host(hold):
            return int(hold["host_pid"])
        return hold.get("pid") if pid is None else pid
    return where


def hidden(hold: dict, container: bool = False) -> bool:
    """nvidia-smi cannot name the process: another namespace (§3.3)."""
    if hold.get("foreign_ns") or container:
        return True
    return bool(hold.get("pidns")) and not _reader_is_host(hold)


def _needs_host_pid(hold: dict, state: str) -> bool:
    """A host reader sees a live namespaced hold whose host PID is not recorded yet."""
    return state == "alive" and bool(hold.get("pidns")) and not hold.get("host_pid") and _reader_is_host(hold)


def _needs_stamp(hold: dict, state: str) -> bool:
    if hold.get("pid") is None or state == "alive":
        return False
    if hold.get("exited_at") is None:
        return True
    if hold.get("keepers") and state != "inherited" and hold.get("keepers_exited_at") is None:
        return True
    return False


class Node:
    """One simulated GPU node rooted at a directory (``$GPUSIM_ROOT``)."""

    def __init__(self, root: str):
        if not root:
            raise DriverError("%s is not set: no simulated GPU node" % ROOT_ENV)
        self.root = os.path.abspath(root)
        self.node_path = os.path.join(self.root, "node.json")
        self.lock_path = os.path.join(self.root, "lock")
        self.holds_dir = os.path.join(self.root, "holds")
        self.dev_dir = os.path.join(self.root, "dev")
        self.resets_log = os.path.join(self.root, "resets.log")

    # ------------------------------------------------------------------ setup
    @classmethod
    def from_env(cls, env=None) -> "Node":
        """The node named by ``GPUSIM_ROOT``; raises DriverError if unset."""
        env = os.environ if env is None else env
        root = env.get(ROOT_ENV)
        if not root:
            raise DriverError("%s is not set: no simulated GPU node" % ROOT_ENV)
        return cls(root)

    @classmethod
    def create(cls, root: str, gpus: int = 8, model: str = "H200",
               reserved_mib=None, idle_used_mib=None, seed=None,
               driver_version: str = DRIVER_VERSION, mig: bool = False) -> "Node":
        """(Re)initialise a node: ``gpusim init``.

        ``reserved_mib`` and ``idle_used_mib`` default to the figures real
        GPUs of ``model`` show on ``driver_version`` (``RESERVED_MIB``,
        :func:`preset_idle_used_mib`); with ``mig`` every GPU is in MIG mode
        and shows 55-59 MiB used when idle.

        Re-initialising wipes every hold record (the holder processes are not
        signalled; their memory simply stops being counted), clears overrides,
        lost GPUs and the driver state, and keeps ``resets.log``.
        """
        import hashlib

        if model not in MODELS:
            raise ValueError("unknown GPU model %r (known: %s)" % (model, ", ".join(sorted(MODELS))))
        if driver_version not in DRIVERS:
            raise ValueError("unknown driver version %r (known: %s)" % (driver_version, ", ".join(sorted(DRIVERS))))
        if gpus < 0 or gpus > 64:
            raise ValueError("--gpus must be between 0 and 64, got %d" % gpus)
        spec = MODELS[model]
        if reserved_mib is None:
            reserved_mib = preset_reserved_mib(model, driver_version)
        base_idle = preset_idle_used_mib(driver_version) if idle_used_mib is None else int(idle_used_mib)
        idle_used_mib = base_idle
        if reserved_mib < 0 or idle_used_mib < 0 or reserved_mib + idle_used_mib >= spec["total_mib"]:
            raise ValueError("reserved (%d MiB) + idle used (%d MiB) must be >= 0 and below the "
                             "total of %d MiB" % (reserved_mib, idle_used_mib, spec["total_mib"]))
        node = cls(root)
        os.makedirs(node.root, exist_ok=True)
        seed = os.path.realpath(node.root) if seed is None else str(seed)
        gpu_list = []
        for i in range(gpus):
            h = hashlib.sha256(("gpusim:%s:%d" % (seed, i)).encode()).hexdigest()
            uuid = "GPU-%s-%s-%s-%s-%s" % (h[0:8], h[8:12], h[12:16], h[16:20], h[20:32])
            bus = HGX_BUSES[i] if i < len(HGX_BUSES) else (0xE0 + i - len(HGX_BUSES)) & 0xFF
            domain = 0 if i < 32 else 1
            serial = "1654%09d" % (int(h[32:44], 16) % 10 ** 9)
            idle = base_idle
            if mig:
                low, high = MIG_IDLE_USED_MIB
                idle = low + int(h[44:48], 16) % (high - low + 1)
            gpu_list.append({
                "index": i, "uuid": uuid, "name": spec["name"],
                "pci_bus_id": "%08X:%02X:%02X.0" % (domain, bus, 0),
                "serial": serial,
                "total_mib": spec["total_mib"], "reserved_mib": int(reserved_mib),
                "idle_used_mib": int(idle),
                "mig_mode": "Enabled" if mig else "Disabled",
                "lost": False, "lost_mode": "handle", "lost_reason": LOST_REASONS[0],
                "persistence_mode": "Enabled", "reset_required": "No",
                "drain_and_reset_recommended": "No",
                "overrides": {},
            })
        data = {"model": model, "driver": "loaded", "driver_version": driver_version,
                "pci_device_id": spec["pci_device_id"], "power_limit_w": spec["power_limit_w"],
                "seed": seed, "created_at": time.time(), "gpus": gpu_list,
                "host_pidns": procfs.self_pid_ns()}
        os.makedirs(node.holds_dir, exist_ok=True)
        os.makedirs(node.dev_dir, exist_ok=True)
        with node._locked(True):
            for name in os.listdir(node.holds_dir):
                try:
                    os.unlink(os.path.join(node.holds_dir, name))
                except FileNotFoundError:
                    pass
            for name in os.listdir(node.dev_dir):
                if name.startswith("nvidia") and name[6:].isdigit() and int(name[6:]) >= gpus:
                    os.unlink(os.path.join(node.dev_dir, name))
            for name in ["nvidia%d" % i for i in range(gpus)] + ["nvidiactl", "nvidia-uvm"]:
                p = os.path.join(node.dev_dir, name)
                if not os.path.exists(p):
                    with open(p, "w"):
                        pass
            _atomic_write(node.node_path, dumps(data, indent=1) + "\n")
        return node

    def device_path(self, gpu) -> str:
        """The per-GPU "device file" a holder keeps open (``dev/nvidia<N>``)."""
        return os.path.join(self.dev_dir, "nvidia%s" % gpu)

    # ---------------------------------------------------------------- locking
    class _Lock:
        def __init__(self, path: str, exclusive: bool):
            self.path = path
            self.exclusive = exclusive
            self.fd = None

        def __enter__(self):
            try:
                self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
            except PermissionError:
                if self.exclusive:
                    raise
                try:  # a read-only caller can still take a shared lock
                    self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
                except OSError:
                    self.fd = None  # lock-free read: files are replaced atomically
                    return self
            except FileNotFoundError:
                raise DriverError("simulated node %s is not initialised (run `gpusim init`)"
                                  % os.path.dirname(self.path))
            fcntl.flock(self.fd, fcntl.LOCK_EX if self.exclusive else fcntl.LOCK_SH)
            return self

        def __exit__(self, *exc):
            if self.fd is not None:
                os.close(self.fd)  # closing drops the flock
                self.fd = None
            return False

    def _locked(self, exclusive: bool = True) -> "Node._Lock":
        return Node._Lock(self.lock_path, exclusive)

    # ------------------------------------------------------------- raw state
    def _read_node(self) -> dict:
        try:
            with open(self.node_path, "r", encoding="utf-8") as fh:
                return loads(fh.read())
        except FileNotFoundError:
            raise DriverError("simulated node %s is not initialised (run `gpusim init`)" % self.root)

    def _write_node(self, data: dict) -> None:
        _atomic_write(self.node_path, dumps(data, indent=1) + "\n")

    def _read_holds(self) -> list:
        holds = []
        try:
            names = os.listdir(self.holds_dir)
        except FileNotFoundError:
            return holds
        for name in names:
            if name.startswith(".") or not name.endswith(".json"):
                continue
            try:
                with open(os.path.join(self.holds_dir, name), "r", encoding="utf-8") as fh:
                    holds.append(loads(fh.read()))
            except (FileNotFoundError, ValueError):
                continue  # released meanwhile (or a foreign file): skip
        holds.sort(key=lambda h: (h.get("created_at") or 0, h.get("id") or ""))
        return holds

    def _write_hold(self, hold: dict) -> None:
        _atomic_write(os.path.join(self.holds_dir, hold["id"] + ".json"), dumps(hold) + "\n")

    def _delete_hold(self, hid: str) -> bool:
        try:
            os.unlink(os.path.join(self.holds_dir, hid + ".json"))
            return True
        except FileNotFoundError:
            return False

    def initialised(self) -> bool:
        return os.path.exists(self.node_path)

    def config(self) -> dict:
        """node.json as stored."""
        return self._read_node()

    # --------------------------------------------------------------- reading
    def snapshot(self, now=None, maintain: bool = True) -> dict:
        """A consistent view: ``{"node", "gpus", "holds", "time"}``.

        ``gpus`` are node.json GPUs plus ``used_mib``/``free_mib``
        (total = reserved + used + free, §1.2); ``holds`` carry ``state``,
        ``counted`` and ``listed``.  With ``maintain`` (default) holds seen
        dead get their ``exited_at`` stamped and finished holds are deleted.
        """
        with self._locked(False):
            node = self._read_node()
            holds = self._read_holds()
        now = time.time() if now is None else now
        todo = []
        for h in holds:
            state, _end = evaluate(h, now)
            h["state"] = state
            h["counted"] = state in COUNTED_STATES
            h["listed"] = state in LISTED_STATES
            if maintain and (state == "gone" or _needs_stamp(h, state) or _needs_host_pid(h, state)):
                todo.append(h["id"])
        if todo:
            self._maintain(todo, now)
        gpus = []
        for g in node["gpus"]:
            g = dict(g)
            used = int(g.get("idle_used_mib", 0))
            for h in holds:
                if h["counted"] and g["index"] in h.get("gpus", ()):
                    used += int(h["mib"])
            g["used_mib"] = used
            g["free_mib"] = int(g["total_mib"]) - int(g["reserved_mib"]) - used
            gpus.append(g)
        return {"node": node, "gpus": gpus, "holds": [h for h in holds if h["state"] != "gone"],
                "time": now}

    def _maintain(self, ids, now: float) -> None:
        """Stamp exit times first seen by this reader; delete finished holds."""
        try:
            lock = self._locked(True)
            lock.__enter__()
        except (PermissionError, DriverError):
            return  # a read-only caller: leave the bookkeeping to writers
        try:
            for hid in ids:
                path = os.path.join(self.holds_dir, hid + ".json")
                try:
                    with open(path, "r", encoding="utf-8") as fh:
                        h = loads(fh.read())
                except (FileNotFoundError, ValueError):
                    continue
                self._settle(h, now)
        except PermissionError:
            pass
        finally:
            lock.__exit__(None, None, None)

    def _settle(self, h: dict, now: float) -> str:
        """Under the exclusive lock: stamp, delete if gone; returns the state."""
        state, _end = evaluate(h, now)
        changed = False
        if _needs_host_pid(h, state):
            where = locate(h)
            if where is not None and where != UNSEEN:
                h["host_pid"] = where
                changed = True
        if h.get("pid") is not None and state != "alive":
            if h.get("exited_at") is None:
                h["exited_at"] = now
                changed = True
            if h.get("keepers") and state not in ("inherited",) and h.get("keepers_exited_at") is None:
                h["keepers_exited_at"] = now
                changed = True
        if changed:
            state, _end = evaluate(h, now)
        if state == "gone":
            self._delete_hold(h["id"])
        elif changed:
            self._write_hold(h)
        return state

    def gpus(self) -> list:
        """GPU dicts as in node.json plus ``used_mib`` and ``free_mib``."""
        return self.snapshot()["gpus"]

    def holds(self) -> list:
        """Current holds with ``state``, ``counted`` and ``listed``."""
        return self.snapshot()["holds"]

    def driver_state(self) -> str:
        return self._read_node().get("driver", "loaded")

    def resolve_visible(self, spec=None) -> list:
        """CUDA_VISIBLE_DEVICES -> list of GPU indices, with CUDA's rules.

        ``None`` means every GPU; an empty string means none.  Entries are
        indices or UUIDs (a unique ``GPU-`` prefix is enough, as in CUDA).
        Like CUDA, parsing stops at the first invalid or repeated entry and
        the devices before it stay visible.

        With ``GPUSIM_CDI=1`` (set by the CDI spec of ``gpusim cdi-spec`` in a
        container) only the GPUs whose ``/dev/nvidia<N>`` exists are there
        (N = host index; ``GPUSIM_CDI_DEV`` names another directory), in
        index order, and an index in CUDA_VISIBLE_DEVICES counts among them
        (0 is the first GPU the container was given), as CUDA does.
        """
        gpus = self._read_node()["gpus"]
        if os.environ.get(CDI_ENV, "") not in ("", "0"):
            present = cdi_devices()
            gpus = [g for g in gpus if g["index"] in present]
        if spec is None:
            return [g["index"] for g in gpus]
        out = []
        for tok in str(spec).split(","):
            tok = tok.strip()
            idx = None
            if tok.isdigit():
                i = int(tok)
                if i < len(gpus):
                    idx = gpus[i]["index"]
            elif tok.upper().startswith("GPU-") and len(tok) > 4:
                hits = [g["index"] for g in gpus if g["uuid"].lower().startswith(tok.lower())]
                if len(hits) == 1:
                    idx = hits[0]
            if idx is None or idx in out:
                break
            out.append(idx)
        return out

    # --------------------------------------------------------------- writing
    def _check_alloc(self, node: dict, holds: list, gpus, mib: int, now: float) -> None:
        state = node.get("driver", "loaded")
        if state != "loaded":
            raise DriverError("CUDA driver initialization failed: the NVIDIA driver is %s "
                              "(simulated node %s)" % (state, self.root))
        by_index = {g["index"]: g for g in node["gpus"]}
        for gi in gpus:
            if gi not in by_index:
                raise ValueError("no GPU with index %r on this node (it has %d GPUs)"
                                 % (gi, len(by_index)))
            if by_index[gi].get("lost"):
                raise GpuLost(gi, by_index[gi]["pci_bus_id"])
        used = {gi: int(by_index[gi].get("idle_used_mib", 0)) for gi in gpus}
        for h in holds:
            st = self._settle(dict(h), now)
            if st in COUNTED_STATES:
                for gi in h.get("gpus", ()):
                    if gi in used:
                        used[gi] += int(h["mib"])
        for gi in gpus:
            g = by_index[gi]
            free = int(g["total_mib"]) - int(g["reserved_mib"]) - used[gi]
            if mib > free:
                raise OutOfMemory(gi, mib, max(free, 0), int(g["total_mib"]))

    @staticmethod
    def _norm_gpus(gpus) -> list:
        if isinstance(gpus, int):
            gpus = [gpus]
        out = []
        for g in gpus:
            g = int(g)
            if g in out:
                raise ValueError("GPU %d listed twice" % g)
            out.append(g)
        if not out:
            raise ValueError("a hold needs at least one GPU")
        return out

    def hold(self, pid: int, gpus, mib: int, name=None, release_delay: float = 0.0,
             stuck: bool = False, *, na_memory: bool = False, foreign_ns: bool = False,
             keepers=(), watcher_pid=None, meta=None) -> str:
        """Register ``mib`` MiB on each of ``gpus`` for live process ``pid``.

        ``name`` is what nvidia-smi prints as process_name; default the
        process's executable path (``/proc/<pid>/exe``, §1.2 H200 capture).
        Raises OutOfMemory (nothing held), DriverError / GpuLost,
        ProcessLookupError when ``pid`` is not a live process, ValueError for
        bad arguments.  Returns the hold id.

        Extensions: ``na_memory`` (used_gpu_memory reads ``[N/A]``, §1.4),
        ``foreign_ns`` (process in another PID namespace: listed with a PID
        this namespace cannot see and name ``[Not Found]``, §3.3),
        ``keepers`` (PIDs of forked children sharing the device fds: memory
        stays while any lives, unlisted, §3.2 b), ``watcher_pid``, ``meta``.
        """
        pid = int(pid)
        gpus = self._norm_gpus(gpus)
        mib = int(mib)
        if mib <= 0:
            raise ValueError("mib must be a positive number of MiB, got %d" % mib)
        release_delay = float(release_delay or 0.0)
        if release_delay < 0:
            raise ValueError("release_delay must be >= 0")
        start = procfs.starttime(pid)
        if start is None or not procfs.is_alive(pid, start):
            raise ProcessLookupError("no live process with PID %d" % pid)
        if name is None:
            name = procfs.exe_path(pid) or procfs.comm(pid) or "[Not Found]"
        keeper_list = []
        for k in keepers or ():
            ks = procfs.starttime(int(k))
            if ks is None:
                raise ProcessLookupError("no live process with PID %d (keeper)" % int(k))
            keeper_list.append({"pid": int(k), "starttime": ks})
        now = time.time()
        hold = {"id": _new_id("h", pid), "pid": pid, "starttime": start, "gpus": gpus,
                "mib": mib, "name": str(name), "release_delay": release_delay,
                "stuck": bool(stuck), "exited_at": None, "created_at": now,
                "na_memory": bool(na_memory), "foreign_ns": bool(foreign_ns),
                "keepers": keeper_list, "keepers_exited_at": None,
                "watcher_pid": watcher_pid, "meta": meta or {}}
        with self._locked(True):
            node = self._read_node()
            self._check_alloc(node, self._read_holds(), gpus, mib, now)
            self._mark_namespace(hold, node.get("host_pidns"))
            self._write_hold(hold)
        return hold["id"]

    @staticmethod
    def _mark_namespace(hold: dict, host_ns) -> None:
        """A process in another PID namespace than ``gpusim init``'s (a container): record that namespace and keep
        the PIDs (holder, keepers) as that namespace numbers them; a caller in the host namespace also records
        the host PID.  Nodes initialised before ``host_pidns`` existed keep the plain behaviour."""
        ns = procfs.pid_ns(hold["pid"])
        if not host_ns or not ns or ns == host_ns:
            return
        pid = hold["pid"]
        hold["pidns"] = ns
        hold["host_pidns"] = host_ns
        if procfs.self_pid_ns() == host_ns:
            hold["host_pid"] = pid
        hold["pid"] = procfs.ns_pid(pid) or pid
        for k in hold["keepers"]:
            k["pid"] = procfs.ns_pid(k["pid"]) or k["pid"]

    def orphan(self, gpu, mib: int) -> str:
        """Memory with no process: never listed, freed only by a GPU reset."""
        gpus = self._norm_gpus(gpu)
        mib = int(mib)
        if mib <= 0:
            raise ValueError("mib must be a positive number of MiB, got %d" % mib)
        now = time.time()
        hold = {"id": _new_id("o", None), "pid": None, "starttime": None, "gpus": gpus,
                "mib": mib, "name": None, "release_delay": 0.0, "stuck": True,
                "exited_at": None, "created_at": now, "na_memory": False,
                "foreign_ns": False, "keepers": [], "keepers_exited_at": None,
                "watcher_pid": None, "meta": {}}
        with self._locked(True):
            node = self._read_node()
            self._check_alloc(node, self._read_holds(), gpus, mib, now)
            self._write_hold(hold)
        return hold["id"]

    def mark_exited(self, pid: int, at=None) -> int:
        """Stamp ``exited_at`` (default now) on every unstamped hold of ``pid``.

        Called by the waiting parent right after it reaps the process, so the
        release delay starts at the real exit.  An existing stamp is kept
        (whoever saw the exit first wins).  Returns the number stamped.
        """
        at = time.time() if at is None else float(at)
        n = 0
        with self._locked(True):
            for h in self._read_holds():
                if h.get("exited_at") is None and same_process(h, pid):
                    if proc_alive(h):
                        continue  # a recycled PID: that hold belongs to a live process
                    h["exited_at"] = at
                    self._write_hold(h)
                    n += 1
        return n

    def mark_keepers_exited(self, hid=None, at=None, pid=None) -> int:
        """Stamp when the last forked child (keeper) of a hold was reaped.

        Select the hold by ``hid`` or by its holder ``pid``.  Returns the
        number of holds stamped (an existing stamp is kept).
        """
        at = time.time() if at is None else float(at)
        n = 0
        with self._locked(True):
            for h in self._read_holds():
                if hid is not None and h.get("id") != hid:
                    continue
                if pid is not None and not same_process(h, pid):
                    continue
                if h.get("keepers") and h.get("keepers_exited_at") is None:
                    if any(proc_alive(h, k.get("pid"), k.get("starttime")) for k in h["keepers"]):
                        continue
                    h["keepers_exited_at"] = at
                    self._write_hold(h)
                    n += 1
        return n

    def release(self, hid: str) -> bool:
        """Free a hold immediately (a graceful cudaFree); False if unknown."""
        with self._locked(True):
            return self._delete_hold(hid)

    def release_pid(self, pid: int) -> int:
        """Free every hold of ``pid`` immediately; returns how many."""
        n = 0
        with self._locked(True):
            for h in self._read_holds():
                if same_process(h, pid):
                    n += self._delete_hold(h["id"])
        return n

    def reset(self, indices=None, now=None) -> dict:
        """``nvidia-smi --gpu-reset``: free what no live process holds.

        Refused (GpuInUse, nothing changes) when a live process holds memory
        on a selected GPU; GpuLost for a lost GPU.  Frees orphans, stale
        (stuck) and releasing holds on the selected GPUs (a multi-GPU hold
        only loses the reset GPUs), logs to resets.log and returns
        ``{index: freed_mib}``.
        """
        now = time.time() if now is None else now
        with self._locked(True):
            node = self._read_node()
            by_index = {g["index"]: g for g in node["gpus"]}
            sel = list(by_index) if indices is None else [int(i) for i in indices]
            for i in sel:
                if i not in by_index:
                    raise ValueError("no GPU with index %r" % i)
                if by_index[i].get("lost"):
                    raise GpuLost(i, by_index[i]["pci_bus_id"])
            holds = self._read_holds()
            busy, pids = [], []
            states = {}
            for h in holds:
                states[h["id"]] = evaluate(h, now)[0]
            for i in sel:
                for h in holds:
                    if i in h.get("gpus", ()) and states[h["id"]] in ("alive", "inherited"):
                        if i not in busy:
                            busy.append(i)
                        pids.append(local_pid(h))
                        pids.extend(local_pid(h, k["pid"], k.get("starttime")) for k in h.get("keepers") or ()
                                    if proc_alive(h, k.get("pid"), k.get("starttime")))
            if busy:
                raise GpuInUse(busy, pids)
            freed = {i: 0 for i in sel}
            freed_ids = {i: [] for i in sel}
            for h in holds:
                hit = [i for i in sel if i in h.get("gpus", ())]
                if not hit:
                    continue
                if states[h["id"]] in COUNTED_STATES:
                    for i in hit:
                        freed[i] += int(h["mib"])
                        freed_ids[i].append(h["id"])
                rest = [i for i in h["gpus"] if i not in hit]
                if rest:
                    h["gpus"] = rest
                    self._write_hold(h)
                else:
                    self._delete_hold(h["id"])
            for i in sel:
                by_index[i]["reset_required"] = "No"
                by_index[i]["drain_and_reset_recommended"] = "No"
            self._write_node(node)
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
            with open(self.resets_log, "a", encoding="utf-8") as fh:
                for i in sel:
                    fh.write("%s gpu=%d bus=%s freed_mib=%d holds=%s euid=%d\n" % (
                        stamp, i, by_index[i]["pci_bus_id"], freed[i],
                        ",".join(freed_ids[i]) or "-", os.geteuid()))
        return freed

    def _update_node(self, fn) -> dict:
        with self._locked(True):
            node = self._read_node()
            fn(node)
            self._write_node(node)
            return node

    def _gpu(self, node: dict, gpu) -> dict:
        for g in node["gpus"]:
            if g["index"] == int(gpu):
                return g
        raise ValueError("no GPU with index %r on this node (it has %d GPUs)"
                         % (gpu, len(node["gpus"])))

    def set_driver(self, state: str) -> None:
        """Driver fault injection: loaded | unloaded | nolib | mismatch.

        Holds are kept: this models nvidia-smi/NVML failing to reach the
        driver, not a real module unload (which the kernel refuses while
        processes hold /dev/nvidia*).
        """
        if state not in DRIVER_STATES:
            raise ValueError("driver state must be one of %s, got %r" % (", ".join(DRIVER_STATES), state))
        self._update_node(lambda n: n.__setitem__("driver", state))

    def lose(self, gpu, mode: str = "handle", reason: str = LOST_REASONS[0]) -> None:
        """GPU fell off the bus (Xid 79).  ``mode``: ``handle`` (nvidia-smi
        cannot get a device handle: "Unable to determine the device handle")
        or ``fields`` (handle works, values read ``[GPU is lost]``);
        ``reason``: the NVML error text after the bus id."""
        if mode not in LOST_MODES:
            raise ValueError("lost mode must be one of %s" % ", ".join(LOST_MODES))
        if reason not in LOST_REASONS:
            raise ValueError("lost reason must be one of %s" % "; ".join(LOST_REASONS))

        def fn(node):
            g = self._gpu(node, gpu)
            g["lost"] = True
            g["lost_mode"] = mode
            g["lost_reason"] = reason
        self._update_node(fn)

    def recover(self, gpu) -> None:
        def fn(node):
            g = self._gpu(node, gpu)
            g["lost"] = False
        self._update_node(fn)

    def set_override(self, gpu, field: str, value=None) -> None:
        """Force the text nvidia-smi prints for ``--query-gpu`` ``field``
        (e.g. ``[Insufficient Permissions]``); ``value=None`` clears it."""
        def fn(node):
            g = self._gpu(node, gpu)
            ov = g.setdefault("overrides", {})
            if value is None:
                ov.pop(field, None)
            else:
                ov[field] = str(value)
        self._update_node(fn)

    def set_gpu_attr(self, gpu, key: str, value) -> None:
        """Set a stored GPU attribute (persistence_mode, reset_required, ...)."""
        allowed = ("persistence_mode", "reset_required", "drain_and_reset_recommended",
                   "idle_used_mib", "reserved_mib", "mig_mode", "pci_bus_id")
        if key == "mig_mode" and value not in ("Enabled", "Disabled"):
            raise ValueError("mig_mode must be Enabled or Disabled")
        if key == "pci_bus_id":
            parts = str(value).split(":")
            try:
                ok = len(parts) == 3 and len(parts[0]) == 8 and int(parts[0], 16) >= 0 \
                    and int(parts[1], 16) >= 0 and int(parts[2].split(".")[0], 16) >= 0
            except ValueError:
                ok = False
            if not ok:
                raise ValueError("pci_bus_id must look like 00000000:18:00.0, got %r" % value)
            value = str(value).upper()
        if key not in allowed:
            raise ValueError("attribute must be one of %s" % ", ".join(allowed))
        self._update_node(lambda n: self._gpu(n, gpu).__setitem__(key, value))


def pid_for_display(hold: dict, container: bool = False) -> int:
    """The PID nvidia-smi prints for a hold: the host PID, as NVML reports it.

    A hold from another PID namespace: seen from the host namespace, the host
    PID found for it (recorded as ``host_pid`` once seen); seen from inside a
    container, ``host_pid`` when a host reader recorded it, else the
    in-namespace PID plus PID_NS_OFFSET (a PID this reader cannot see).
    """
    if hold.get("pidns"):
        if _reader_is_host(hold) and not (hold.get("foreign_ns") or container):
            where = locate(hold)
            if where is not None and where != UNSEEN:
                return int(where)
        if hold.get("host_pid"):
            return int(hold["host_pid"])
        return int(hold["pid"]) + PID_NS_OFFSET
    if hold.get("foreign_ns") or container:
        return int(hold["pid"]) + PID_NS_OFFSET
    return int(hold["pid"])


__all__ = ["Node", "SimError", "DriverError", "GpuLost", "OutOfMemory", "GpuInUse",
           "MODELS", "DRIVER_VERSION", "DRIVERS", "PID_NS_OFFSET", "evaluate", "pid_for_display",
           "locate", "proc_alive", "same_process", "hidden", "UNSEEN"]
