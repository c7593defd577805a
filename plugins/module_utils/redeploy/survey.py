# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The preflight of a redeploy, in one module run: inspect the node, resolve the args as the node's
SGLang will, decide what to do, and (when there is something to do) take the node lease.

Nothing on the node changes before the lease is taken, and the lease is taken only when every check
passed: a failure here leaves the running server untouched and serving. See docs/design.md, "The
plan", for the order of the checks and what each reports.
"""

from __future__ import annotations

import json
import os
import re
import time

from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import query as gpu_query
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import procfs
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import secrets as secret_rules
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import sockets
from ansible_collections.gpufleet.sglang.plugins.module_utils.common.names import PLAIN

PROBE_BYTES = 64 * 1024
MIN_FREE_MIB = 64
# A GPU's memory is accounted for when what nvidia-smi lists for processes of this PID namespace covers its used memory
# up to the idle baseline plus this slack. A CUDA context alone costs hundreds of MiB (docs/reference/gpu-watchers.md),
# so a user nvidia-smi cannot name cannot hide in it.
WATCH_SLACK_MIB = 64
# Compute capability by GPU name, for nodes whose nvidia-smi cannot answer compute_cap (docs/reference/nvidia-smi.md).
_CC_BY_NAME = (("B300", "10.3"), ("B200", "10.0"), ("GB200", "10.0"), ("H200", "9.0"), ("H100", "9.0"), ("H800", "9.0"),
               ("GH200", "9.0"), ("L40S", "8.9"), ("L40", "8.9"), ("L4", "8.9"), ("A100", "8.0"), ("A800", "8.0"),
               ("A10", "8.6"), ("A40", "8.6"), ("V100", "7.0"))


def read_arch(path):
    """``(arch, error)`` from ``<path>/config.json``."""
    if not os.path.isdir(path):
        return None, "does not exist or is not a directory"
    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as fh:
            data = json.load(fh)
    except OSError as exc:
        return None, "has no readable config.json (%s)" % exc.strerror
    except ValueError as exc:
        return None, "has a config.json that is not valid JSON (%s)" % exc
    archs = data.get("architectures") if isinstance(data, dict) else None
    if isinstance(archs, list) and archs and isinstance(archs[0], str):
        return archs[0], None
    return None, None


def compute_capability(name):
    for key, cc in _CC_BY_NAME:
        if key in (name or ""):
            return cc
    return None


def gpu_facts(gpus):
    """``{name, compute_capability, memory_mib, count}`` of the target GPUs, as SGLang's resolution sees them."""
    if not gpus:
        return None
    first = gpus[0]
    totals = [g.get("total_mib") for g in gpus if g.get("total_mib")]
    cc = first.get("compute_cap") or compute_capability(first.get("name"))
    return {"name": first.get("name"), "compute_capability": cc, "memory_mib": min(totals) if totals else None,
            "count": len(gpus)}


def probe_writable(path, min_free_mib=MIN_FREE_MIB):
    """None when a file can be created in ``path`` (or the nearest existing parent, for a directory still to be
    made) and it has room; else the reason. The probe file is removed at once."""
    directory = path
    while directory and not os.path.isdir(directory):
        if os.path.exists(directory):
            return "%s exists and is not a directory" % directory
        parent = os.path.dirname(directory.rstrip("/"))
        if parent == directory:
            break
        directory = parent
    if not directory:
        return "no existing parent directory"
    name = os.path.join(directory, ".gpufleet-probe-%d-%d" % (os.getpid(), int(time.time() * 1000)))
    try:
        fd = os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except OSError as exc:
        return "cannot create a file in %s: %s" % (directory, exc.strerror)
    try:
        os.write(fd, b"\0" * PROBE_BYTES)
        os.fsync(fd)
    except OSError as exc:
        return "cannot write to %s: %s" % (directory, exc.strerror)
    finally:
        os.close(fd)
        try:
            os.unlink(name)
        except OSError:
            pass
    try:
        st = os.statvfs(directory)
        free_mib = st.f_bavail * st.f_frsize / (1024.0 * 1024.0)
        if free_mib < min_free_mib:
            return "%s has only %.1f MiB free (at least %d MiB needed)" % (directory, free_mib, min_free_mib)
    except OSError:
        pass
    return None


def _inode_ports():
    out = {}
    for name in ("tcp", "tcp6"):
        try:
            with open(os.path.join("/proc/net", name), encoding="ascii", errors="replace") as fh:
                text = fh.read()
        except OSError:
            continue
        for port, inode in sockets.parse_net_tcp(text):
            out[inode] = port
    return out


def listening_ports(pids):
    """Ports that any of ``pids`` listens on (their fds must be readable)."""
    by_inode = _inode_ports()
    ports = set()
    for pid in pids:
        fd_dir = "/proc/%d/fd" % pid
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if target.startswith("socket:["):
                try:
                    port = by_inode.get(int(target[8:-1]))
                except ValueError:
                    port = None
                if port:
                    ports.add(port)
    return sorted(ports)


def _user(uid):
    try:
        import pwd
        return pwd.getpwuid(uid).pw_name
    except (KeyError, TypeError, ImportError):
        return str(uid)


def _root(table, pid):
    """The top-most live ancestor of ``pid`` in its own session, below init (or a systemd manager): the server tree
    it belongs to. It never climbs into another session (the shell, tmux or supervisor that started the server)."""
    cur = table[pid]
    sid = cur.sid
    seen = set()
    while cur.ppid in table and cur.ppid not in (0, 1) and cur.ppid not in seen:
        parent = table[cur.ppid]
        if parent.comm in ("systemd", "init") or parent.exited or parent.sid != sid:
            break
        seen.add(cur.pid)
        cur = parent
    return cur


def _session(table, sid):
    return [p for p, info in table.items() if info.sid == sid]


def memory_accounting(gpus, table, device_fds, max_used_mib=16):
    """``{gpu index: None or why}``: None when the memory nvidia-smi shows used on the GPU is covered by the compute
    processes it lists that this PID namespace can see (each in ``/proc`` with a GPU device file open), up to the idle
    baseline and WATCH_SLACK_MIB; otherwise why not (memory or a row unknown, a listed PID that is not visible here, as
    inside a container without the host's PID namespace, memory no listed process accounts for).

    ``device_fds(pid)``: the process's GPU device files, ``[]`` for none, None when they cannot be read.
    """
    out = {}
    for gpu in gpus:
        index = gpu.get("index")
        used = gpu.get("used_mib")
        if gpu.get("lost") or used is None:
            out[index] = "its used memory is unknown"
            continue
        why = None
        seen = 0
        for proc in gpu.get("processes") or []:
            pid, mib = proc.get("pid"), proc.get("used_mib")
            if pid is None or mib is None:
                why = "nvidia-smi lists a process without %s" % ("a PID" if pid is None else "its memory")
                break
            if pid not in table:
                why = ("nvidia-smi lists PID %d (%s MiB), which is not visible in /proc: another PID namespace (a container "
                       "without the host's), so the user of that memory cannot be named" % (pid, mib))
                break
            fds = device_fds(pid)
            if not fds:
                what = ("has no GPU device file open here: the PID names another process in this namespace" if fds == []
                        else "cannot be inspected (its descriptors are not readable)")
                why = "nvidia-smi lists PID %d, which %s" % (pid, what)
                break
            seen += mib
        limit = gpu_query.idle_limit(gpu, max_used_mib) + WATCH_SLACK_MIB
        if why is None and used - seen > limit:
            why = "%d of its %d MiB used belong to no process nvidia-smi lists" % (used - seen, used)
        out[index] = why
    return out


def find_watchers(table, listed_gpus, fd_paths, accounting, index_of):
    """``({pid: why}, {pid: why not})``: the watchers, and the processes that hold only device files but cannot be told
    from a user because a GPU's memory is not accounted for.

    A watcher is a process whose only tie to a target GPU is an open device file: nvidia-smi lists no compute
    context of theirs (nor of their session or server tree) on a target GPU, and the memory of every target GPU whose
    device file they hold is accounted for by listed processes (:func:`memory_accounting`). Monitoring agents (NVML
    exporters, nvtop, gpustat --watch) look like this; they watch, they do not use the GPU, and they are never
    signalled (docs/reference/gpu-watchers.md).

    ``listed_gpus``: ``{pid: set of target GPU indices}`` from nvidia-smi; ``fd_paths``: ``{pid: [device paths]}``;
    ``index_of(path)``: the target GPU index of a device file, or None.
    """
    listed = set(listed_gpus)
    out = {}
    suspects = {}
    for pid, paths in sorted(fd_paths.items()):
        gpus = sorted(set(index_of(path) for path in paths) - {None})
        if not gpus or pid in listed or pid not in table:
            continue
        info = table[pid]
        if (info.comm or "").startswith("sglang::"):
            continue          # an SGLang server process is never a monitoring agent (an orphaned scheduler, ...)
        tree = {pid, _root(table, pid).pid} | set(procfs.descendants(table, _root(table, pid).pid))
        tree |= set(_session(table, info.sid))
        if tree & listed:
            continue          # its session or server tree runs a compute context on a target GPU: part of that user
        unaccounted = [(g, accounting.get(g, "it was not read")) for g in gpus if accounting.get(g, "it was not read")]
        if unaccounted:
            suspects[pid] = ("it only has device files open, but it may be the user nvidia-smi cannot name: %s" % "; ".join(
                "on GPU %s %s" % (g, why) for g, why in unaccounted))
            continue
        uvm = any(os.path.basename(path) == "nvidia-uvm" for path in paths)
        out[pid] = ("watches GPU %s: it only has device files open (%s), nvidia-smi lists no compute context of it there "
                    "and the GPUs' memory is accounted for by listed processes; %s; never signalled" % (
                        ",".join(str(g) for g in gpus), ", ".join(sorted(os.path.basename(x) for x in paths)),
                        "it has /dev/nvidia-uvm open but no context on these GPUs" if uvm else
                        "without /dev/nvidia-uvm it cannot hold a CUDA context at all"))
    return out, suspects


def classify_holders(table, holder_gpus, managed_pids, managed_unit, recorded_pids, adopt_pids, adopt_res, port_owner_pids,
                     exclude_names, watchers=None, suspects=None, names=PLAIN):
    """Sort the processes holding the target GPUs: managed, adopted, watcher, orphan, system or foreign.

    ``holder_gpus``: ``{pid: [gpu indices]}``; ``watchers`` and ``suspects``: ``{pid: why}`` from :func:`find_watchers`
    (a suspect's reason is added to its own). Returns a list of dicts (pid, class, why, user, cmdline masked, session,
    ports for foreign ones).
    """
    watchers = watchers or {}
    suspects = suspects or {}

    def tree_of(pids):
        out = set()
        for pid in pids:
            if pid in table:
                out.add(pid)
                out.update(procfs.descendants(table, pid))
                out.update(_session(table, table[pid].sid) if table[pid].sid == pid else [])
        return out

    managed = tree_of(managed_pids)
    adopted = tree_of(adopt_pids) | tree_of(port_owner_pids)
    recorded = set()
    for item in recorded_pids or []:
        pid, start = (item if isinstance(item, (list, tuple)) else (item, None))
        if not pid:
            continue
        # The recorded server's session counts only while that PID was not reused by another process.
        info = table.get(pid)
        if info is not None and start is not None and not info.exited and info.starttime != int(start):
            continue
        recorded.add(pid)
    out = []
    for pid in sorted(p for p in holder_gpus if p is not None):
        info = table.get(pid)
        entry = {"pid": pid, "gpus": sorted(holder_gpus[pid]), "class": "foreign", "why": "", "user": None, "comm": None,
                 "cmdline": None, "session": None}
        if info is None:
            entry.update({"class": "gone", "why": "exited before it could be inspected"})
            out.append(entry)
            continue
        cmd = " ".join(secret_rules.mask_argv(list(info.cmdline))) or info.comm
        entry.update(user=_user(info.uid), comm=info.comm, cmdline=cmd[:400], session=info.sid)
        leader = table.get(info.sid)
        if info.comm in exclude_names or (info.cmdline and os.path.basename(info.cmdline[0]) in exclude_names):
            entry.update({"class": "system", "why": "a GPU system daemon (never signalled)"})
        elif pid in managed or (managed_unit and info.unit == managed_unit):
            entry.update({"class": "managed", "why": "part of the managed server"})
        elif info.sid in recorded or info.pgid in recorded:
            entry.update({"class": "managed", "why": "left over from the managed server (its recorded session %d)" % info.sid})
        elif pid in adopted:
            entry.update({"class": "adopted", "why": "part of the server this deploy adopts (on the managed port, or named by "
                                                     "%s)" % names.of("adopt_pids")})
        elif pid in watchers:
            entry.update({"class": "watcher", "why": watchers[pid]})
        elif any(r.search(cmd) for r in adopt_res) or (leader is not None and any(
                r.search(" ".join(leader.cmdline)) for r in adopt_res)):
            entry.update({"class": "adopted", "why": "matches %s" % names.of("adopt_patterns")})
        else:
            root = _root(table, pid)
            own_ports = listening_ports([pid]) if root.pid == pid else []
            worker = (info.comm or "").startswith("sglang::")
            if (leader is None or leader.exited) and root.pid == pid and (worker or not own_ports):
                # Reparented to init, its session leader gone, and it serves nothing itself: what a dead server
                # leaves behind (a scheduler that outlived its launcher).
                entry.update({"class": "orphan", "why": "its session leader %d is gone and it was reparented to init: a "
                                                        "leftover of a dead server" % info.sid})
            else:
                members = set(_session(table, info.sid)) | {root.pid} | set(procfs.descendants(table, root.pid))
                entry["ports"] = listening_ports(sorted(members))
                entry["root"] = root.pid
                entry["why"] = "another server: PID %d (%s)%s" % (
                    root.pid, " ".join(secret_rules.mask_argv(list(root.cmdline)))[:200] or root.comm,
                    "" if leader is not None and not leader.exited else ", whose session leader %d is gone" % info.sid)
        if pid in suspects and entry["class"] in ("foreign", "orphan"):
            entry["why"] = "%s; %s" % (entry["why"], suspects[pid])
        out.append(entry)
    return out


def describe_foreign(entry):
    ports = ", ".join(str(p) for p in entry.get("ports") or []) or "none"
    gpus = ",".join(str(g) for g in entry["gpus"])
    return "PID %s (user %s, GPUs %s, ports %s): %s" % (entry["pid"], entry.get("user"), gpus, ports, entry.get("cmdline"))


def compile_patterns(patterns, names=PLAIN):
    out = []
    problems = []
    for text in patterns or []:
        try:
            out.append(re.compile(text))
        except re.error as exc:
            problems.append("%s: %r is not a valid regular expression (%s)" % (names.of("adopt_patterns"), text, exc))
    return out, problems
