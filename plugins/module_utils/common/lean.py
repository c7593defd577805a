# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Lean module results: what an operator reads first, and what AWX stores per job event.

Ansible's default callback prints a failed task's whole result, keys sorted, before anything else; a result of
25 KB put the sentence that says what failed at its 2,000th character, and AWX stored every result (58 KB for
one replace) as a job event. At verbosity 0 the modules return only the keys the roles and the report read, with
the bulk (the full ``/server_info``, log tails, per-GPU readings, the drain's plan) left out: the replace writes its
full result to a details file on the node (:func:`write_details`), and ``-v`` returns it whole.
"""

from __future__ import annotations

import json
import os

from ansible.module_utils.common.parameters import remove_values
from ansible_collections.gpufleet.sglang.plugins.module_utils.node.supervise import write_private

# The per-GPU reading the report keeps (docs/report.md gpus_before / gpus_after).
GPU_KEYS = ("index", "used_mib")
# The lease keys the roles and the report read (acquired; the waits and take-overs).
LEASE_KEYS = ("acquired", "waited", "waited_for", "took_over", "took_over_reason")
# Keys of a launch result left out at verbosity 0: the server's whole /server_info (``effective_args`` keeps the
# predicted fields), the log tail (the message quotes its last lines), the startup phases.
LAUNCH_BULK = ("effective", "log_tail", "startup_phases")
# Keys of the drain result left out at verbosity 0: its GPU readings (``gpus_free`` has them) and the holders.
DRAIN_BULK = ("gpus", "holders")
DETAILS_DIR = "details"
# The details files kept per state directory (the oldest go first).
DETAILS_KEEP = 50
# An option value longer than this (as JSON) is left out of ``invocation`` below -vvv (where the callback shows it).
INVOCATION_LIMIT = 160


def invocation(module, limit=INVOCATION_LIMIT):
    """The ``invocation`` a module returns: None (AnsibleModule's whole ``module_args``) at -vvv, where the default
    callback shows it, else the options with every long value replaced by its size (a replace's ``launch`` alone
    was 5.5 KB of every job event), every option left at its documented default left out (``defaulted`` counts
    them; a refused config's preflight event was 8.3 KB, a third of it its invocation) and every no_log
    option's value replaced as Ansible does."""
    if module._verbosity >= 3:
        return None
    spec = getattr(module, "argument_spec", None) or {}
    args = {}
    defaulted = []
    for key, value in (module.params or {}).items():
        option = spec.get(key) or {}
        if key in spec and value == option.get("default") and type(value) is type(option.get("default")):
            defaulted.append(key)
            continue
        if option.get("no_log") and value is not None:
            args[key] = "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"
            continue
        size = len(json.dumps(value, default=str))
        args[key] = value if size <= limit else "(%d bytes; -vvv shows it)" % size
    # The values the module learnt are secret (AnsibleModule masks them in the whole result too).
    out = {"module_args": remove_values(args, set(getattr(module, "no_log_values", None) or ()))}
    if defaulted:
        out["defaulted"] = len(defaulted)
    return out


def gpus(readings):
    """Per-GPU readings, each reduced to :data:`GPU_KEYS` plus the PIDs of its processes (``pids``); the whole reading
    (uuid, total and free MiB, MIG mode, ...) is in the details file and at -v."""
    out = []
    for g in readings or []:
        if not isinstance(g, dict):
            continue
        item = dict((k, g.get(k)) for k in GPU_KEYS if k in g)
        if "processes" in g:
            item["pids"] = [p.get("pid") for p in g.get("processes") or [] if isinstance(p, dict)]
        out.append(item)
    return out


def lease(info):
    """The lease as the roles and the report read it (``acquired``, the waits, a take-over, the holder's run), without
    null keys."""
    info = info if isinstance(info, dict) else {}
    out = dict((k, info[k]) for k in LEASE_KEYS if info.get(k) not in (None, "", {}))
    out["acquired"] = bool(info.get("acquired"))
    holder = info.get("holder") if isinstance(info.get("holder"), dict) else {}
    if holder.get("owner"):
        out["holder"] = {"owner": holder["owner"]}          # the run that holds the lease (the message names it too)
    return out


def launch(result):
    if not isinstance(result, dict):
        return result
    return dict((k, v) for k, v in result.items() if k not in LAUNCH_BULK)


def drain(result, signalled):
    """The drain without its bulk; its ``signalled`` only when it differs from the run's (a planned, never signalled list)."""
    if not isinstance(result, dict):
        return result
    out = dict((k, v) for k, v in result.items() if k not in DRAIN_BULK)
    if out.get("signalled") == signalled:
        out.pop("signalled", None)
    return out


# What a process that exited with its server (signalled by nobody) keeps at verbosity 0: no command line.
EXITED_KEYS = ("pid", "ppid", "name", "role", "signals")


def stopped(items):
    """The drain's list: a process that was signalled whole, one that exited with its server without its command line."""
    out = []
    for item in items or []:
        if isinstance(item, dict) and not item.get("signals"):
            item = dict((k, item[k]) for k in EXITED_KEYS if k in item)
        out.append(item)
    return out


def replace_result(result, details_file=None):
    """An sglang_replace result for verbosity 0 (docs: plugins/modules/sglang_replace.py RETURN)."""
    out = dict(result)
    for key in ("signalled", "rollback_signalled"):
        if key in out:
            out[key] = stopped(out[key])
    for key in ("launch", "rollback_launch"):
        if key in out:
            out[key] = launch(out[key])
    if "drain" in out:
        out["drain"] = drain(out["drain"], result.get("signalled"))
    for key in ("gpus_free", "gpus_allocated"):
        if key in out:
            out[key] = gpus(out[key])
    if isinstance(out.get("weights"), dict):
        out["weights"] = dict((k, v) for k, v in out["weights"].items() if k != "model_info")
    if details_file:
        out["details_file"] = details_file
    return out


# What a failed preflight returns at verbosity 0: the message, the problems, the lease as the roles read it, the
# resolution's source (the report's ``resolution``) and the plan's action and GPU holders but the managed server's;
# the rest of the plan, the node and the lines come with -v.
PREFLIGHT_FAILURE_KEYS = ("changed", "msg", "problems", "reason", "notes")


def preflight_result(result):
    """A passed preflight for verbosity 0: the node's GPU readings reduced (:func:`gpus`); the plan is read whole."""
    out = dict(result)
    if isinstance(out.get("node"), dict):
        out["node"] = dict(out["node"])
        for key in ("gpus", "all_gpus"):
            if key in out["node"]:
                out["node"][key] = gpus(out["node"][key])
        # The role reads each directory's path and whether it is as it should be; mode, owner and group are in -v.
        if isinstance(out["node"].get("directories"), list):
            out["node"]["directories"] = [dict((k, d.get(k)) for k in ("path", "ok")) if isinstance(d, dict) else d
                                          for d in out["node"]["directories"]]
    plan = out.get("plan")
    if isinstance(plan, dict) and isinstance(plan.get("cache"), dict) and "env" in plan["cache"]:
        # The compile caches' variables are in the launch spec's env already (plan.spec.env).
        out["plan"] = dict(plan, cache=dict((k, v) for k, v in plan["cache"].items() if k != "env"))
    return out


def preflight_failure(result):
    out = dict((k, result[k]) for k in PREFLIGHT_FAILURE_KEYS if k in result)
    out["lease"] = lease(result.get("lease"))
    resolved = result.get("resolved")
    if isinstance(resolved, dict):
        out["resolved"] = dict((k, resolved.get(k)) for k in ("source", "fallback"))
    plan = result.get("plan")
    if isinstance(plan, dict):
        # The GPU holders that are not the managed server's (a foreign user, a watcher, an orphan): often why it
        # failed; the report lists them.
        out["plan"] = {"action": plan.get("action"),
                       "holders": [h for h in plan.get("holders") or [] if isinstance(h, dict) and h.get("class") != "managed"]}
        # Who holds the managed port (a container-run server is refused by it) and what the teardown would signal: as
        # often why it failed, and small (the running server's record is in -v and the report).
        for key in ("port_owner", "teardown_pids"):
            if key in plan:
                out["plan"][key] = plan[key]
    return out


def details_path(state_dir, run_id, name):
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in "%s-%s" % (run_id, name))
    return os.path.join(state_dir, DETAILS_DIR, safe + ".json")


def write_details(state_dir, run_id, name, result):
    """Write ``result`` (already masked) to ``<state_dir>/details/<run_id>-<name>.json`` (0600); return the path, or
    None when it cannot be written (the details never make a run fail)."""
    if not state_dir or not run_id:
        return None
    path = details_path(state_dir, run_id, name)
    try:
        os.makedirs(os.path.dirname(path), 0o750, exist_ok=True)
        write_private(path, json.dumps(result, indent=1, sort_keys=True, default=str) + "\n", mode=0o600)
    except (OSError, TypeError, ValueError):
        return None
    prune(os.path.dirname(path), keep=path)
    return path


def prune(directory, keep, limit=None):
    """Remove the oldest details files beyond ``limit`` (default :data:`DETAILS_KEEP`; never ``keep``, the one just
    written)."""
    limit = DETAILS_KEEP if limit is None else limit
    try:
        names = [n for n in os.listdir(directory) if n.endswith(".json") and not n.startswith(".")]
        paths = sorted((os.path.join(directory, n) for n in names), key=lambda p: (os.path.getmtime(p), p))
    except OSError:
        return
    for old in paths[:max(0, len(paths) - limit)]:
        if old != keep:
            try:
                os.unlink(old)
            except OSError:
                pass
