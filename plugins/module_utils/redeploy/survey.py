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

from ansible_collections.gpufleet.sglang.plugins.module_utils.node import procfs
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import secrets as secret_rules
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import sockets

PROBE_BYTES = 64 * 1024
MIN_FREE_MIB = 64
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


def classify_holders(table, holder_gpus, managed_pids, managed_unit, recorded_pids, adopt_pids, adopt_res, port_owner_pids,
                     exclude_names):
    """Sort the processes holding the target GPUs: managed, adopted, orphan, system or foreign.

    ``holder_gpus``: ``{pid: [gpu indices]}``. Returns a list of dicts (pid, class, why, user, cmdline masked,
    session, ports for foreign ones).
    """
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
                                                     "sglang_adopt_pids)"})
        elif any(r.search(cmd) for r in adopt_res) or (leader is not None and any(
                r.search(" ".join(leader.cmdline)) for r in adopt_res)):
            entry.update({"class": "adopted", "why": "matches sglang_adopt_patterns"})
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
        out.append(entry)
    return out


def describe_foreign(entry):
    ports = ", ".join(str(p) for p in entry.get("ports") or []) or "none"
    gpus = ",".join(str(g) for g in entry["gpus"])
    return "PID %s (user %s, GPUs %s, ports %s): %s" % (entry["pid"], entry.get("user"), gpus, ports, entry.get("cmdline"))


def compile_patterns(patterns):
    out = []
    problems = []
    for text in patterns or []:
        try:
            out.append(re.compile(text))
        except re.error as exc:
            problems.append("sglang_adopt_patterns: %r is not a valid regular expression (%s)" % (text, exc))
    return out, problems
