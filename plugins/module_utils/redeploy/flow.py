# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The redeploy flow's decisions, as pure functions over plain data (table-tested in test_flow.py).

The role ``sglang_redeploy`` keeps the order of the phases and nothing else; every decision between
them is made here and reached through the action plugin ``redeploy_flow`` (controller side, no module
run):

* :func:`layout`: which multi-node group a host belongs to (hosts that share ``dist_init_addr`` when
  ``nnodes`` > 1), its node rank and the group's size;
* :func:`members` and :func:`batch_problem`: the group's hosts, and whether this batch holds all of them;
* :func:`group_action`: what the group does, from each rank's plan (none, verify, weights, start, restart);
* :func:`pd_hosts`: the prefill/decode servers of the play, for the rollout plan (``pd.py``);
* :func:`failure`: which step failed, from the registered results and the machine-readable codes the
  modules return (``failed_step``, ``reason``), never from a message's text; and whether to roll back;
* :func:`rollback_status` and :func:`outcome_line`: what the rollback did, and the host's last line;
* :func:`report_row`: the host's row of the run report (docs/report.md).

Standard library only; nothing here reads the node or the controller.
"""
from __future__ import annotations

ACTIONS = ("none", "verify", "weights", "start", "restart")
PD_ROLES = ("prefill", "decode")
# Steps whose failure leaves a verified (or untouched) server running: no rollback.
NO_ROLLBACK_STEPS = ("promote", "router add", "router drain")


def _mapping(value):
    return value if isinstance(value, dict) else {}


def _int(value, default):
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def merged_args(server_args, host_args):
    """``sglang_server_args`` with ``sglang_server_host_args`` on top (a non-mapping counts as empty)."""
    out = dict(_mapping(server_args))
    out.update(_mapping(host_args))
    return out


# --------------------------------------------------------------------------
# Multi-node groups
# --------------------------------------------------------------------------

def layout(host, server_args, host_args):
    """``{group_key, nnodes, rank}`` of ``host``: a multi-node server is the hosts that share its ``dist_init_addr``."""
    args = merged_args(server_args, host_args)
    nnodes = _int(args.get("nnodes"), 1)
    key = str(args.get("dist_init_addr") or host) if nnodes > 1 else host
    return {"group_key": key, "nnodes": nnodes, "rank": _int(args.get("node_rank"), 0)}


def members(host, nnodes, group_key, play_hosts, keys):
    """The hosts of ``host``'s group, in play order; ``keys`` maps a play host to its group key."""
    if nnodes <= 1:
        return [host]
    return [h for h in play_hosts if keys.get(h) == group_key]


def batch_problem(host, rank, nnodes, group_key, group, batch, ranks):
    """None when every rank of a multi-node group is in this batch, else the refusal (nothing was touched).

    ``ranks`` maps a host of the group to its node rank.
    """
    if nnodes <= 1:
        return None
    in_batch = [h for h in group if h in batch]
    batch_ranks = sorted(_int(ranks.get(h), -1) for h in in_batch)
    if batch_ranks == list(range(nnodes)):
        return None
    return ("%s is node rank %s of a %s-node server (dist_init_addr %s), but this batch holds node rank(s) %s of it (%s). "
            "Run all its ranks, one host each, in one batch: set sglang_serial as an extra var or a play var (serial does "
            "not see inventory variables), and do not limit the run to part of the group. Nothing was touched."
            % (host, rank, nnodes, group_key, ", ".join(str(r) for r in batch_ranks) or "none", ", ".join(in_batch) or "none"))


def group_action(actions, multinode):
    """What a host (or a multi-node group) does, from the plans' actions of its ranks.

    Any start or restart restarts a group; weights only when every rank says weights; verify when every rank
    that has something to do says verify; none when no rank has anything to do. A single host does what its
    plan says.
    """
    actions = [a or "none" for a in actions] or ["none"]
    busy = [a for a in actions if a != "none"]
    if not busy:
        return "none"
    if sorted(set(actions)) == ["weights"]:
        return "weights"
    if sorted(set(busy)) == ["verify"]:
        return "verify"
    if multinode:
        return "restart"
    return actions[0]


# --------------------------------------------------------------------------
# Prefill/decode
# --------------------------------------------------------------------------

def pd_hosts(hosts):
    """The prefill/decode servers of the play for ``pd.py``'s rollout plan.

    ``hosts``: ``[(host, merged_args, preflight)]`` in play order; ``preflight`` is the host's registered
    preflight result (or {} when this batch did not inspect it). What it will run is the preflight's
    resolved args (the merged args before the preflight ran); what it runs now is the plan's running args.
    """
    out = []
    for host, args, preflight in hosts:
        preflight = _mapping(preflight)
        new = _mapping(preflight.get("resolved")).get("args")
        new = new if isinstance(new, dict) else _mapping(args)
        role = new.get("disaggregation_mode") or ""
        if role in PD_ROLES:
            out.append({"host": host, "role": role, "new": new,
                        "old": _mapping(preflight.get("plan")).get("running_args")})
    return out


def pd_plan_lines(plan):
    """The rollout plan of ``pd.plan`` in readable lines."""
    pair = (" (%s)" % plan["pair_mode"]) if plan.get("pair_mode") else ""
    out = ["prefill/decode rollout: %s%s: %s" % (plan.get("order"), pair, plan.get("why"))]
    for step in plan.get("steps") or []:
        out.append("step %s: %s %s %s" % (step.get("step"), step.get("action"), step.get("role"),
                                          ", ".join(step.get("hosts") or [])))
    out.extend("note: %s" % note for note in plan.get("notes") or [])
    return out
