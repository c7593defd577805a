# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the node shows, never what a run meant to do: who listens on the server's port, whether it answers
``/health``, and which processes have the target GPUs' device files open (standard library only).

``sglang_replace`` reports its node state from here after a failure (docs/design.md, "sglang_replace"): an operator
paged at 3 a.m. reads "the old server still serves" only when a process of the old server listens on the port and
answers, and "no server" only when nothing listens. It reads ``/proc`` and asks ``/health`` once; it never runs
nvidia-smi, which may be the very thing that failed.
"""

from __future__ import annotations

from ansible_collections.gpufleet.sglang.plugins.module_utils.common import http
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import procfs
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import sockets

HEALTH_TIMEOUT_S = 3.0
_WILDCARD = ("", "0.0.0.0", "::", "[::]")


def server_tree(table, pids):
    """The PIDs of the servers rooted at ``pids``: each root, its descendants and, for a session leader, its session."""
    out = set()
    for pid in pids or ():
        info = table.get(pid)
        if info is None:
            continue
        out.add(pid)
        out.update(procfs.descendants(table, pid))
        if info.sid == pid:
            out.update(p for p, other in table.items() if other.sid == pid)
    return out


def _url(host, port, tls=False):
    host = str(host or "")
    if host in _WILDCARD:
        host = "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = "[%s]" % host
    return "%s://%s:%d" % ("https" if tls else "http", host, port)


def gpu_users(table, gpus, patterns):
    """``{pid: [gpu indices]}`` of the processes with a target GPU's device file open (``/dev/nvidiaN``)."""
    wanted = set(str(g) for g in gpus or ())
    out = {}
    for pid, paths in procfs.device_holders(table, tuple(patterns)).items():
        found = sorted(set(procfs.device_gpu_index(path) for path in paths) - {None}, key=int)
        found = [g for g in found if str(g) in wanted]
        if found:
            out[pid] = found
    return out


def observe(port, host=None, gpus=(), patterns=(), groups=(), request=None, tls=False):
    """``(text, facts)``: the node now.

    ``groups``: ``[(label, root PIDs)]`` such as ``[("old server", [123]), ("candidate", [456])]``; a listener or GPU
    user in a group's tree is named by the group's label. ``facts``: ``{"port", "listener": {"pid", "name", "owner"}
    or None, "health": HTTP status or None, "gpu_users": [{"pid", "name", "gpus", "owner"}]}``. ``request`` replaces
    :func:`http.request` (tests). ``tls``: the server serves HTTPS (its args set ssl_certfile).
    """
    request = request or http.request
    table = procfs.process_table(with_cgroup=False)
    trees = [(label, server_tree(table, pids)) for label, pids in groups]

    def owner_of(pid):
        for label, tree in trees:
            if pid in tree:
                return label
        return None

    facts = {"port": port, "listener": None, "health": None, "gpu_users": []}
    listening, owners = sockets.port_listeners(port) if port else (False, [])
    if listening:
        pid = owners[0] if owners else None
        info = table.get(pid) if pid else None
        facts["listener"] = {"pid": pid, "name": info.comm if info else None, "owner": owner_of(pid) if pid else None}
        try:
            status, _headers, _body = request("GET", _url(host, port, tls) + "/health", timeout=HEALTH_TIMEOUT_S)
        except http.HTTPConnectionError:
            status = None
        facts["health"] = status
    for pid, indices in sorted(gpu_users(table, gpus, patterns).items()):
        info = table.get(pid)
        facts["gpu_users"].append({"pid": pid, "name": info.comm if info else None, "gpus": indices, "owner": owner_of(pid)})
    return describe(facts, gpus), facts


def describe(facts, gpus=()):
    """The node state in words, from :func:`observe`'s facts."""
    port = facts.get("port")
    listener = facts.get("listener")
    health = facts.get("health")
    if listener is None:
        text = "no server: nothing listens on port %s" % port
    else:
        who = "PID %s" % listener["pid"] if listener.get("pid") else "a process this user cannot see"
        answer = "/health answers %s" % health if health is not None else "/health does not answer"
        owner = listener.get("owner")
        if owner and health == 200:
            verb = "still serves" if owner == "old server" else "serves"
            text = "the %s %s: %s listens on port %s and %s" % (owner, verb, who, port, answer)
        elif owner:
            text = "the %s does not serve: %s listens on port %s but %s" % (owner, who, port, answer)
        else:
            text = "%s (%s, not this server's) listens on port %s and %s" % (who, listener.get("name") or "?", port, answer)
    label = ",".join(str(g) for g in gpus or ())
    users = facts.get("gpu_users") or []
    if not users:
        return "%s; no process has GPU %s open" % (text, label) if label else text
    parts = []
    for owner in sorted(set(u.get("owner") or "" for u in users)):
        pids = ",".join(str(u["pid"]) for u in users if (u.get("owner") or "") == owner)
        noun = "PIDs" if "," in pids else "PID"
        parts.append("the %s's %s %s" % (owner, noun, pids) if owner else "%s %s" % (noun, pids))
    return "%s; GPU %s open by %s" % (text, label, "; ".join(parts))


def patterns_for(device_paths):
    """The fnmatch globs of the GPU device files (``/dev/nvidia*`` when none are given)."""
    return [str(p) for p in (device_paths or ())] or list(procfs.DEFAULT_DEVICE_PATTERNS)


__all__ = ["observe", "describe", "server_tree", "gpu_users", "patterns_for", "HEALTH_TIMEOUT_S"]
