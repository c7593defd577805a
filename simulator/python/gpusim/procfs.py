"""Minimal /proc helpers for the GPU simulator (Linux, standard library only).

Liveness follows docs/design.md: a process is alive when ``/proc/<pid>``
exists, its start time (``/proc/<pid>/stat`` field 22) equals the one recorded
when the hold was registered (so a recycled PID never keeps memory counted),
and it is not a zombie (docs/reference/nvidia-smi.md §3.2: a zombie has already closed its
device files).
"""
from __future__ import annotations

import os

DEAD_STATES = ("Z", "X", "x")


def read_stat(pid: int):
    """Return ``(state, ppid, starttime)`` for ``pid`` or ``None`` if it is gone.

    The comm field may contain spaces and parentheses, so the fields are taken
    after the *last* ``)``.
    """
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            data = fh.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    except OSError:
        return None
    end = data.rfind(b")")
    if end < 0:
        return None
    rest = data[end + 2:].split()
    # rest[0] is field 3 (state), rest[1] field 4 (ppid), rest[19] field 22.
    try:
        return rest[0].decode("ascii"), int(rest[1]), int(rest[19])
    except (IndexError, ValueError):
        return None


def starttime(pid: int):
    """Start time of ``pid`` in clock ticks since boot, or ``None``."""
    st = read_stat(pid)
    return None if st is None else st[2]


def is_alive(pid, start=None) -> bool:
    """True while ``pid`` exists, is not a zombie and (if given) has ``start``."""
    if pid is None:
        return False
    st = read_stat(int(pid))
    if st is None:
        return False
    if st[0] in DEAD_STATES:
        return False
    if start is not None and st[2] != start:
        return False
    return True


def exe_path(pid: int):
    """``/proc/<pid>/exe`` target (the interpreter for a script), or ``None``."""
    try:
        target = os.readlink("/proc/%d/exe" % pid)
    except OSError:
        return None
    if target.endswith(" (deleted)"):
        target = target[: -len(" (deleted)")]
    return target


def comm(pid: int):
    try:
        with open("/proc/%d/comm" % pid, "r", encoding="utf-8", errors="replace") as fh:
            return fh.read().rstrip("\n")
    except OSError:
        return None


def set_comm(name: str) -> str:
    """Set the calling thread's comm like ``prctl(PR_SET_NAME)``.

    The kernel keeps at most 15 bytes (TASK_COMM_LEN 16 with the NUL); the
    same truncation is applied here so callers can predict the result.
    Returns the name actually requested (truncated).
    """
    raw = name.encode("utf-8", errors="replace")[:15]
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_NAME = 15
        buf = ctypes.create_string_buffer(raw, 16)
        if libc.prctl(PR_SET_NAME, buf, 0, 0, 0) == 0:
            return raw.decode("utf-8", errors="replace")
    except Exception:  # pragma: no cover - ctypes missing or no prctl symbol
        pass
    try:
        with open("/proc/self/comm", "wb") as fh:
            fh.write(raw)
    except OSError:
        pass
    return raw.decode("utf-8", errors="replace")


def set_child_subreaper(on: bool = True) -> bool:
    """prctl(PR_SET_CHILD_SUBREAPER): orphaned descendants reparent to us."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_CHILD_SUBREAPER = 36
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1 if on else 0, 0, 0, 0) == 0
    except Exception:  # pragma: no cover
        return False


# ------------------------------------------------------------ PID namespaces
# A process in a container (its own PID namespace) knows itself by its
# in-namespace PID; NVML lists it under its host PID.  The simulator records
# the namespace (``readlink /proc/<pid>/ns/pid``), the in-namespace PID and the
# start time (field 22 counts clock ticks since boot: the same inside and
# outside), and a host-side reader finds the host PID with find_in_ns.
_SELF_NS = {}
_FOUND = {}


def pid_ns(pid="self"):
    """``pid:[inode]`` of ``pid``'s PID namespace, or ``None`` (gone, not permitted)."""
    try:
        return os.readlink("/proc/%s/ns/pid" % pid)
    except OSError:
        return None


def self_pid_ns():
    """The caller's PID namespace (cached per process: a fork re-reads it)."""
    me = os.getpid()
    ns = _SELF_NS.get(me)
    if ns is None:
        ns = pid_ns("self")
        _SELF_NS.clear()
        _SELF_NS[me] = ns
    return ns


def ns_pid(pid: int):
    """``pid``'s PID in its own (innermost) namespace: the last ``NSpid`` entry of /proc/<pid>/status."""
    try:
        with open("/proc/%d/status" % pid, "rb") as fh:
            for line in fh:
                if line.startswith(b"NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def find_in_ns(ns: str, nspid: int, start=None):
    """The PID, as this process sees it, of the live process that is ``nspid`` in namespace ``ns``.

    ``None`` when no such process is visible here (it exited, or this reader
    cannot see that namespace).  ``start`` (field 22) must match when given, so
    a recycled in-namespace PID is never taken for the recorded process.
    """
    key = (ns, int(nspid), start)
    hit = _FOUND.get(key)
    if hit is not None and pid_ns(hit) == ns and is_alive(hit, start) and ns_pid(hit) == int(nspid):
        return hit
    _FOUND.pop(key, None)
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    for name in names:
        if not name.isdigit():
            continue
        if pid_ns(name) != ns:
            continue
        pid = int(name)
        if ns_pid(pid) != int(nspid) or not is_alive(pid, start):
            continue
        if len(_FOUND) > 256:
            _FOUND.clear()
        _FOUND[key] = pid
        return pid
    return None
