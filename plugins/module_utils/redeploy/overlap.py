# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Overlap: start the new server before the old one stops, when the node has room for both (docs/user-guide.md,
"Overlap redeploy").

Two halves (tests/unit/test_overlap_plan.py), and the check for an overlap that did not finish (leftover):

* :func:`node_facts` runs in the preflight module on the node: what the node says about the room for a second
  server (the old server's GPUs and port from its records, whether the new config's GPUs are free, whether the new
  port is free). It decides nothing.
* :func:`decide` runs on the controller (``redeploy_flow`` decision ``action``): the path, ``overlap`` or
  ``in_place``, and why, from those facts and the play's settings (``sglang_redeploy_overlap``, the router, the
  layout). Every condition that fails is named; the first one is the reason shown in the plan.
"""

from __future__ import annotations

import os

from ansible_collections.gpufleet.sglang.plugins.module_utils.common import http
from ansible_collections.gpufleet.sglang.plugins.module_utils.common.names import PLAIN
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import supervise as sp

SETTINGS = ("off", "auto")
# The copy of the old server's state file that roles/sglang_redeploy/tasks/overlap.yml keeps while both servers run.
KEPT_STATE = "overlap-old.server.state.json"
OVERLAP = "overlap"
IN_PLACE = "in_place"


def _gpu_list(value):
    """``"0,1"``, ``[0, 1]`` or ``["0", "1"]`` as a list of strings ([] for none)."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        items = value
    else:
        items = str(value).split(",")
    return [str(x).strip() for x in items if str(x).strip() != ""]


def health_probe(api_key=None, timeout=3.0):
    """One quick /health probe of a URL: True (2xx), False (refused, non-2xx) or None (timed out: busy)."""
    def probe(url):
        try:
            status, _h, _b = http.request("GET", url.rstrip("/") + "/health", api_key=api_key, timeout=timeout)
        except http.RequestTimeout:
            return None
        except http.HTTPConnectionError:
            return False
        return 200 <= status < 300
    return probe


def node_facts(current, running, running_record, port_owner, node_gpus, new_gpus, new_port, max_used_mib, probe=None):
    """What the node says about room for the new server beside the old one.

    ``current``: the launcher's :meth:`current` (its ``record`` is the old server's state file: pid, port, url);
    ``running``: the preflight's running server (pid, fingerprint, healthy) or None; ``running_record``: the old
    server's launch record (its ``cuda_visible_devices``); ``port_owner``: who listens on the new port (None: nobody);
    ``node_gpus``: every GPU of the node (summaries with ``used_mib`` and ``processes``); ``max_used_mib``: the most
    memory a GPU may use and still count as free; ``probe``: the old server's health probe (a URL -> True/False/None;
    the preflight's own probe reads the new config's URL, not the old one's)."""
    current = current or {}
    state = current.get("record") or {}
    running = running or {}
    old_pid = running.get("pid")
    managed = bool(old_pid) and current.get("pid") == old_pid and state.get("pid") == old_pid
    old_gpus = _gpu_list((running_record or {}).get("cuda_visible_devices")) if managed else []
    by_index = dict((str(g.get("index")), g) for g in node_gpus or [])
    busy = []
    for gpu in _gpu_list(new_gpus):
        info = by_index.get(gpu)
        if info is None:
            busy.append("%s (not on this node)" % gpu)
            continue
        procs = [p.get("pid") for p in info.get("processes") or []]
        used = info.get("used_mib")
        if procs:
            busy.append("%s (held by PID %s)" % (gpu, ", ".join(str(p) for p in procs)))
        elif used is None or used > max_used_mib:
            busy.append("%s (%s MiB used, free means at most %s MiB)" % (gpu, used if used is not None else "unknown",
                                                                         max_used_mib))
    return {
        "old_pid": old_pid if managed else None,
        "old_healthy": (probe(state["url"]) if probe and managed and state.get("url") else None),
        "old_port": state.get("port") if managed else None,
        "old_url": state.get("url") if managed else None,
        "old_gpus": old_gpus,
        "new_gpus": _gpu_list(new_gpus),
        "new_port": new_port,
        "new_port_free": port_owner is None,
        "new_gpus_busy": busy,
    }


def decide(setting, facts, action, router_url="", worker_url="", manager="process", multinode=False, pd_role="",
           recovering=False, names=PLAIN):
    """``{"path", "why", "reasons"}``: ``overlap`` only when every condition holds, else ``in_place`` with the
    conditions that failed (the first one is ``why``). ``names`` labels the inputs (``overlap``, ``router_url``,
    ``router_worker_url``, ``manager``) as the caller knows them (the redeploy_flow action: its role variables)."""
    # An unquoted YAML ``off`` reads as false.
    setting = "off" if setting is None or setting is False else str(setting).strip().lower()
    facts = facts or {}
    if setting not in SETTINGS:
        raise ValueError("%s must be one of %s, got %r; set it to auto (overlap when the node has "
                         "room for both servers) or off (always in place)" % (names.of("overlap"), ", ".join(SETTINGS), setting))
    if setting == "off":
        return {"path": IN_PLACE, "why": "%s is off; in place" % names.of("overlap"), "reasons": ["%s is off" % names.of("overlap")]}
    if action not in ("start", "restart"):
        return {"path": IN_PLACE, "why": "the action is %s, which starts no new server; in place" % action, "reasons": []}
    reasons = []
    if not str(router_url or "").strip():
        reasons.append("no router to switch clients (%s is empty): the new server cannot take the old "
                       "one's port while the old one still holds it" % names.of("router_url"))
    elif str(worker_url or "").strip():
        reasons.append("%s is set, so the old and the new worker would have the same URL in the "
                       "router" % names.of("router_worker_url"))
    if multinode:
        reasons.append("a multi-node server (nnodes > 1) is replaced as one group")
    if pd_role:
        reasons.append("a prefill/decode (%s) server follows the prefill/decode rollout" % pd_role)
    if manager in ("docker", "podman"):
        reasons.append("the %s manager runs one container per server name (sglang-<name>) and a second one for the "
                       "candidate is not supported; use %s: process for overlap" % (manager, names.of("manager")))
    elif manager != "process":
        reasons.append("the %s manager runs one unit per server name (sglang-<name>.service) and a second unit for the "
                       "candidate is not supported; use %s: process for overlap" % (manager, names.of("manager")))
    if recovering:
        reasons.append("the node journal says an earlier run did not finish; this run recovers in place")
    if not facts.get("old_pid"):
        reasons.append("no managed server runs (nothing to keep serving, or its GPUs are not on record)")
    else:
        if not facts.get("old_healthy"):
            reasons.append("the old server (PID %s) does not answer /health" % facts.get("old_pid"))
        old = set(facts.get("old_gpus") or [])
        new = set(facts.get("new_gpus") or [])
        if not old:
            reasons.append("the old server's GPUs are not in its launch record")
        elif old & new:
            reasons.append("the new config's GPUs %s overlap the old server's GPUs %s" % (
                ",".join(sorted(new)), ",".join(sorted(old))))
        if facts.get("old_port") is None or facts.get("old_port") == facts.get("new_port"):
            reasons.append("the new config listens on the old server's port %s, which both cannot hold at once"
                           % facts.get("new_port"))
    if facts.get("new_gpus_busy"):
        reasons.append("the new config's GPUs are not free: %s" % "; ".join(facts["new_gpus_busy"]))
    if not facts.get("new_port_free", False):
        reasons.append("the new port %s is in use" % facts.get("new_port"))
    if reasons:
        return {"path": IN_PLACE, "why": "overlap refused: %s; in place" % reasons[0], "reasons": reasons}
    return {"path": OVERLAP, "why": "overlap: GPUs %s and port %s are free beside the old server (PID %s, GPUs %s, port %s) "
                                    "and the router switches the clients" % (
                                        ",".join(facts["new_gpus"]), facts["new_port"], facts["old_pid"],
                                        ",".join(facts["old_gpus"]), facts["old_port"]),
            "reasons": []}


def leftover(state_dir, current_pid=None):
    """Problems (texts) of an overlap that did not finish: overlap.yml keeps a copy of the old server's records
    while the candidate runs beside it, and removes it when the old server was stopped or the failed candidate
    was; a copy whose server still runs (same PID and start time) and is not the server the records name now
    means a run was interrupted with two servers up. A copy whose server is gone is stale and says nothing."""
    path = os.path.join(state_dir or "", KEPT_STATE)
    kept = sp.read_state(path) if state_dir else None
    if not kept or not kept.get("pid"):
        return []
    pid = kept["pid"]
    if pid == current_pid or not sp.alive(pid, kept.get("starttime")):
        return []
    return ["an overlap redeploy did not finish: the old server PID %s (port %s, %s) still runs beside the server "
            "the node's records name now (PID %s), and the router may list both. Keep one: take the other's worker "
            "out of the router, stop it by its PID (kill -TERM %s for the old one; SGLang drains on SIGTERM), "
            "delete %s and %s (to keep the old server instead, copy them back over server.state.json and server.pid "
            "after stopping the new one), then run the redeploy again (nothing was touched)"
            % (pid, kept.get("port"), kept.get("url"), current_pid or "none", pid, path,
               os.path.join(state_dir, "overlap-old.server.pid"))]
