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
