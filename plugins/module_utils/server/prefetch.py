# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Warm a checkpoint into the page cache while the old server still serves (standard library only, python 3.9).

SGLang reads safetensors through the page cache: a checkpoint already in RAM loads several times faster than one
read from disk. :func:`prefetch` reads the shards that are not resident yet, at idle I/O and CPU priority, up to a
memory budget (MemAvailable less a reserve, never the old server's memory) and a time limit.

* :func:`read_meminfo` / :func:`budget`: the budget from ``/proc/meminfo``;
* :func:`residency`: the resident bytes of a file, by ``mincore(2)`` on a read-only shared map of it;
* :func:`idle_priority`: ``nice 19`` and the idle I/O class (``ioprio_set(2)``), for this process;
* :func:`prefetch`: the reads, chunk by chunk in file order (``posix_fadvise(WILLNEED)`` on the chunk, then a read of it;
  ``POSIX_FADV_RANDOM`` keeps the kernel's readahead from reading past the budget).
"""
from __future__ import annotations

import ctypes
import mmap
import os
import platform
import time

GIB = 1024 ** 3
CHUNK = 8 * 1024 * 1024
# A file (or a chunk) whose pages are all resident is not read again.
RESIDENT_SHARE = 1.0
# ioprio_set/ioprio_get syscall numbers by machine (include/uapi/asm-generic/unistd.h, arch/x86/entry/syscalls).
IOPRIO_SYSCALLS = {"x86_64": (251, 252), "amd64": (251, 252), "aarch64": (30, 31), "arm64": (30, 31),
                   "ppc64le": (273, 274), "s390x": (282, 283), "i686": (289, 290), "i386": (289, 290)}
IOPRIO_WHO_PROCESS = 1
IOPRIO_CLASS_IDLE = 3
IOPRIO_CLASS_SHIFT = 13


_LIBC = []


def _libc():
    """libc with the prototypes used here (the interpreter's own symbols: no ``ldconfig`` run), loaded once."""
    if _LIBC:
        return _LIBC[0]
    lib = ctypes.CDLL(None, use_errno=True)
    lib.mmap.restype = ctypes.c_void_p
    lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    lib.syscall.restype = ctypes.c_long
    _LIBC.append(lib)
    return lib


def read_meminfo(path="/proc/meminfo"):
    """``{field: bytes}`` of ``/proc/meminfo`` (its kB figures in bytes)."""
    out = {}
    with open(path) as fh:
        for line in fh:
            name, _sep, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                out[name.strip()] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return out


def budget(meminfo, reserve_gb=0.0, reserve_percent=10.0, max_gb=0.0):
    """``(budget_bytes, reserve_bytes)``: MemAvailable less the reserve (the larger of ``reserve_gb`` and
    ``reserve_percent`` of MemTotal), capped at ``max_gb`` when that is above 0; never below 0.

    MemAvailable counts neither the old server's memory nor anything else in use, so the budget never takes it."""
    if "MemAvailable" not in meminfo or "MemTotal" not in meminfo:
        raise ValueError("/proc/meminfo has no MemAvailable or MemTotal (a kernel older than 3.14?)")
    reserve = int(max(float(reserve_gb) * GIB, meminfo["MemTotal"] * float(reserve_percent) / 100.0))
    room = max(0, meminfo["MemAvailable"] - reserve)
    if max_gb and float(max_gb) > 0:
        room = min(room, int(float(max_gb) * GIB))
    return room, reserve


class _Map(object):
    """A read-only shared map of ``fd``'s bytes ``[offset, offset + length)`` (offset page-aligned)."""

    def __init__(self, lib, fd, offset, length):
        self.lib, self.length = lib, length
        addr = lib.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, offset)
        if addr in (None, ctypes.c_void_p(-1).value):
            err = ctypes.get_errno()
            raise OSError(err, "mmap: %s" % os.strerror(err))
        self.addr = addr

    def resident(self):
        """Resident bytes of the mapped range (mincore; the last page counts whole)."""
        page = mmap.PAGESIZE
        pages = (self.length + page - 1) // page
        vec = (ctypes.c_ubyte * pages)()
        if self.lib.mincore(self.addr, self.length, vec) != 0:
            err = ctypes.get_errno()
            raise OSError(err, "mincore: %s" % os.strerror(err))
        return min(self.length, sum(b & 1 for b in vec) * page)

    def close(self):
        if self.addr is not None:
            self.lib.munmap(self.addr, self.length)
            self.addr = None


def resident_range(fd, offset, length, lib=None):
    """Resident bytes of ``fd``'s ``[offset, offset + length)`` (counted from the page that holds ``offset``)."""
    if length <= 0:
        return 0
    lead = offset % mmap.PAGESIZE
    offset, length = offset - lead, length + lead
    m = _Map(lib or _libc(), fd, offset, length)
    try:
        return m.resident()
    finally:
        m.close()


def residency(path, window=GIB):
    """``(resident_bytes, size)`` of the file at ``path`` (mapped ``window`` bytes at a time)."""
    lib = _libc()
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        resident = 0
        for offset in range(0, size, window):
            resident += resident_range(fd, offset, min(window, size - offset), lib)
        return resident, size
    finally:
        os.close(fd)


def ioprio_syscalls():
    return IOPRIO_SYSCALLS.get(platform.machine().lower())


def get_ioprio(pid=0):
    """``(class, data)`` of ``pid``'s I/O priority (0: this process), or None where the syscall is unknown."""
    nums = ioprio_syscalls()
    if not nums:
        return None
    lib = _libc()
    value = lib.syscall(ctypes.c_long(nums[1]), ctypes.c_int(IOPRIO_WHO_PROCESS), ctypes.c_int(pid))
    if value < 0:
        return None
    return value >> IOPRIO_CLASS_SHIFT, value & ((1 << IOPRIO_CLASS_SHIFT) - 1)


def idle_priority():
    """Put this process at nice 19 and in the idle I/O class. Returns ``(nice, ioprio_ok, why_not)``: the I/O
    class may be refused (a kernel or seccomp profile without ioprio_set); the reads then go on at nice 19."""
    current = os.nice(0)
    nice = os.nice(19 - current) if current < 19 else current
    nums = ioprio_syscalls()
    if not nums:
        return nice, False, "ioprio_set: unknown syscall number on %s" % platform.machine()
    lib = _libc()
    value = (IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT) | 0
    ret = lib.syscall(ctypes.c_long(nums[0]), ctypes.c_int(IOPRIO_WHO_PROCESS), ctypes.c_int(0), ctypes.c_int(value))
    if ret != 0:
        err = ctypes.get_errno()
        return nice, False, "ioprio_set: %s" % os.strerror(err)
    return nice, True, None


def _share(part, whole):
    return round(100.0 * part / whole, 1) if whole else 100.0


def prefetch(files, budget_bytes, timeout, chunk=CHUNK, clock=time.monotonic):
    """Read the not yet resident part of ``files`` into the page cache, chunk by chunk, until every file is resident,
    ``budget_bytes`` are read or ``timeout`` seconds are over (checked before each chunk).

    A chunk whose pages are all resident is skipped and not counted against the budget; a file all resident is
    skipped without a read. Returns the result dict (``files``, ``bytes``, ``bytes_read``, ``resident_before``,
    ``resident_after`` (bytes and %), ``seconds``, ``stopped`` (None, ``budget``, ``timeout``), ``skipped``: per file
    why it was not read (``resident``), ``errors``)."""
    started = clock()
    lib = _libc()
    total = before = after = read = 0
    stopped = None
    skipped = []
    errors = []
    per_file = []
    for path in files:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            errors.append("%s: %s" % (path, exc.strerror or exc))
            continue
        try:
            size = os.fstat(fd).st_size
            res_before = sum(resident_range(fd, off, min(GIB, size - off), lib) for off in range(0, size, GIB))
            total += size
            before += res_before
            file_read = 0
            if res_before >= size:
                skipped.append({"path": path, "why": "resident"})
            elif stopped is None:
                # No readahead of the kernel's own beyond the chunks asked for: the budget counts every page read.
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
                buf = bytearray(chunk)
                view = memoryview(buf)
                offset = 0
                while offset < size:
                    length = min(chunk, size - offset)
                    if resident_range(fd, offset, length, lib) >= length:
                        offset += length
                        continue
                    if clock() - started >= timeout:
                        stopped = "timeout"
                        break
                    if read >= budget_bytes:
                        stopped = "budget"
                        break
                    length = min(length, budget_bytes - read)
                    # The whole chunk in one go (WILLNEED starts its reads at once), then the read that waits for it.
                    os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)
                    got = os.preadv(fd, [view[:length]], offset) if hasattr(os, "preadv") else \
                        len(os.pread(fd, length, offset))
                    if got <= 0:
                        break
                    read += got
                    file_read += got
                    offset += got
                if stopped and not file_read:
                    skipped.append({"path": path, "why": stopped})
            else:
                skipped.append({"path": path, "why": stopped})
            res_after = sum(resident_range(fd, off, min(GIB, size - off), lib) for off in range(0, size, GIB))
            after += res_after
            per_file.append({"path": path, "bytes": size, "resident_before": res_before, "resident_after": res_after,
                             "bytes_read": file_read})
        except OSError as exc:
            errors.append("%s: %s" % (path, exc.strerror or exc))
        finally:
            os.close(fd)
    return {
        "files": len(files), "bytes": total, "bytes_read": read,
        "resident_before": {"bytes": before, "percent": _share(before, total)},
        "resident_after": {"bytes": after, "percent": _share(after, total)},
        "seconds": round(clock() - started, 3), "stopped": stopped, "skipped": skipped, "errors": errors,
        "per_file": per_file,
    }


def line(result):
    """One line for the play output and the report."""
    if result.get("skipped_why"):
        return "prefetch: skipped, %s" % result["skipped_why"]
    mib = 1024.0 * 1024.0
    text = "prefetch: %d file(s), %.1f MiB, resident %.1f%% -> %.1f%%, read %.1f MiB in %.1f s" % (
        result["files"], result["bytes"] / mib, result["resident_before"]["percent"], result["resident_after"]["percent"],
        result["bytes_read"] / mib, result["seconds"])
    resident = sum(1 for s in result.get("skipped") or [] if s["why"] == "resident")
    if resident:
        text += ", %d file(s) already resident" % resident
    if result.get("stopped"):
        text += ", stopped at the %s (budget %.1f MiB, time limit %s s)" % (
            "memory budget" if result["stopped"] == "budget" else "time limit", result.get("budget_bytes", 0) / mib,
            result.get("timeout"))
    if result.get("priority_note"):
        text += "; %s" % result["priority_note"]
    return text
