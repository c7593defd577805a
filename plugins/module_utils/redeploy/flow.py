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

# The keys of an adopted container stopped through its runtime that the report row keeps (issue 24).
CONTAINER_KEYS = ("runtime", "id", "name", "image", "restart_policy", "restart_policy_set")

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
    # Every rank of a multi-node server takes its lease (the group decides), known from the args before the group is.
    return {"group_key": key, "nnodes": nnodes, "rank": _int(args.get("node_rank"), 0),
            "lease_acquire": "always" if nnodes > 1 else "if_needed"}


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


def pd_role(preflight):
    """``prefill`` or ``decode`` when the preflight resolved this server into that role, else ""."""
    role = _mapping(_mapping(_mapping(preflight).get("resolved")).get("args")).get("disaggregation_mode")
    return role if role in PD_ROLES else ""


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


# --------------------------------------------------------------------------
# Failures and the rollback
# --------------------------------------------------------------------------

def _failed(result):
    return bool(_mapping(result).get("failed"))


def group_barrier(checkpoint, members_failed):
    """The result of a multi-node checkpoint: None when no other rank failed, else the failure (codes, then message)."""
    if not members_failed:
        return None
    tail = "; nothing was touched" if checkpoint == "preflight" else " and rolls back as one server"
    return {"failed": True, "failed_step": "%s (another rank failed)" % checkpoint, "reason": "group_failed",
            "msg": "Another rank of this multi-node server failed before the %s checkpoint (%s); the whole group fails%s."
                   % (checkpoint, ", ".join(members_failed), tail)}


def early_failure(previous, failed_result):
    """A failure rescued outside the lease's block: the one already told apart under the lease (``previous``), or a
    failure before anything was touched (the batch check, the role's argument check, the preflight, a group check)."""
    previous = _mapping(previous)
    if previous.get("step"):
        out = dict((k, previous.get(k)) for k in ("step", "message", "reason", "needs_rollback"))
        out["before_lease"] = str(previous["step"]).startswith("preflight")
        return out
    failed_result = _mapping(failed_result)
    return {"step": failed_result.get("failed_step") or "preflight",
            "message": str(failed_result.get("msg") or "unknown error"),
            "reason": failed_result.get("reason") or "", "needs_rollback": False, "before_lease": True}


def failure(results, failed_result, failed_task=None, multinode=False):
    """What failed under the lease, and whether a rollback is needed; from codes, never from a message's text.

    ``results``: the registered results by role (``router_drain``, ``router_remove``, ``replace``, ``smoke``,
    ``promote``, ``router_add``), each a dict or None; ``failed_result``: Ansible's ``ansible_failed_result``.
    Returns ``{step, message, reason, needs_rollback, before_lease}``.
    """
    failed_result = _mapping(failed_result)
    replace = _mapping(results.get("replace"))
    if _failed(results.get("router_drain")) or _failed(results.get("router_remove")):
        step = "router drain"
    elif failed_result.get("reason") == "group_failed":
        step = failed_result.get("failed_step") or "group"
    elif _failed(replace):
        step = replace.get("failed_step") or "replace"
    elif _failed(results.get("smoke")):
        step = "smoke"
    elif _failed(results.get("promote")):
        step = _mapping(results.get("promote")).get("failed_step") or "promote"
    elif _failed(results.get("router_add")):
        step = "router add"
    else:
        step = failed_task or "unknown"
    reason = replace.get("reason") or failed_result.get("reason") or ""
    # A single-node run that touched nothing has nothing to roll back. A rank of a multi-node group still joins the
    # group's rollback: the other ranks may have torn the group down, and its old rank cannot serve alone.
    changed = bool(replace.get("touched")) or step == "smoke" or failed_result.get("reason") == "group_failed" \
        or (multinode and replace.get("reason") == "nothing_touched")
    needs = changed and "rollback" not in replace and step not in NO_ROLLBACK_STEPS
    return {"step": step, "message": str(failed_result.get("msg") or "unknown error"), "reason": reason,
            "needs_rollback": bool(needs), "before_lease": False}


def rollback_of(role_status, role_detail, replace):
    """``{status, detail}`` of the rollback: the role's (a rollback run after the failure), else the one the failed
    ``sglang_replace`` ran in place, else none (status "")."""
    if role_status:
        return {"status": role_status, "detail": role_detail or ""}
    rollback = _mapping(_mapping(replace).get("rollback"))
    return {"status": rollback.get("status") or "", "detail": rollback.get("detail") or ""}


def rollback_failed(failed_result):
    """``{status, detail}`` of a rollback whose relaunch failed: unavailable without a known-good record."""
    failed_result = _mapping(failed_result)
    message = str(failed_result.get("msg") or "unknown error")
    if failed_result.get("reason") == "no_known_good":
        return {"status": "unavailable", "detail": message}
    if failed_result.get("failed_step") == "teardown":
        message = ("the teardown before the relaunch failed, so the last known-good config was not relaunched: "
                   + message)
    return {"status": "failed", "detail": message}


def _sentence(text):
    return str(text or "").strip().rstrip(".")


def outcome_line(host, fail, rollback, replace, multinode=False):
    """The failed host's message: what failed, why, what was done about it."""
    replace = _mapping(replace)
    head = "Redeploy of %s failed: %s failed: %s." % (host, fail["step"], _sentence(fail["message"]))
    if rollback.get("status"):
        tail = "Rollback %s: %s." % (rollback["status"], _sentence(rollback.get("detail")))
    elif fail.get("reason") == "nothing_touched" and not multinode:
        tail = "No rollback: nothing was touched."
    elif not replace.get("touched") and fail["step"] != "smoke":
        tail = "Nothing was torn down; the old server still serves."
    elif fail["step"] in ("promote", "router add"):
        tail = "No rollback ran: the verified server keeps running."
    else:
        tail = "No rollback ran."
    return "%s %s" % (head, tail)


def journal_outcome(rollback):
    """What the settled journal says: rolled_back when a rollback succeeded, else failed."""
    return "rolled_back" if rollback.get("status") == "succeeded" else "failed"


# --------------------------------------------------------------------------
# The report row (docs/report.md)
# --------------------------------------------------------------------------

def _get(data, *path):
    for key in path:
        data = _mapping(data).get(key)
    return data


def report_row(v, mask):
    """The host's row of the run report, from what its tasks registered.

    ``v``: ``host``, ``run_id``, ``check_mode``, ``preflight`` (None when it never ran), ``action`` (the group's),
    ``failure`` (:func:`failure`'s answer, or None), ``replace``, ``candidate_replace`` (the candidate's result when a
    rollback ran after it, else None), ``promote``, ``smoke`` (a multi-node rank 0's gate), ``rollback_status`` and
    ``rollback_detail`` (the role's rollback, when one ran after the failure). ``mask``: the secret masking of module_utils/common/secrets.py.
    """
    preflight = v.get("preflight") if isinstance(v.get("preflight"), dict) else {"failed": True}
    action = v.get("action") or "none"
    fail = v.get("failure")
    replace = _mapping(v.get("replace"))
    cand_given = isinstance(v.get("candidate_replace"), dict)
    candidate = v["candidate_replace"] if cand_given else replace
    promote = _mapping(v.get("promote"))
    resolved = _mapping(preflight.get("resolved"))
    plan = _mapping(preflight.get("plan"))
    has_plan = not preflight.get("failed") and "plan" in preflight
    predicted = resolved.get("effective") or resolved.get("args") or {}
    if cand_given:
        launch = _mapping(replace.get("launch"))
    else:
        launch = _mapping(replace["rollback_launch"] if "rollback_launch" in replace else replace.get("launch"))
    smoke = promote.get("smoke") or _mapping(v.get("smoke"))
    rollback = rollback_of(v.get("rollback_status"), v.get("rollback_detail"), replace)
    weights = _mapping(candidate.get("weights"))
    lease = _mapping(preflight.get("lease"))
    stopped = list(candidate.get("signalled") or []) + list(candidate.get("rollback_signalled") or [])
    if cand_given:
        stopped += list(replace.get("signalled") or [])
    # What was really signalled; a child that exited with its server (no signal of its own) is listed apart.
    signalled = [p for p in stopped if _mapping(p).get("signals")]
    exited = [p for p in stopped if not _mapping(p).get("signals")]
    details = [r.get("details_file") for r in ((candidate, replace) if cand_given else (replace,)) if r.get("details_file")]
    nothing_to_do = fail is None and action == "none" and has_plan
    if v.get("check_mode"):
        status = "planned" if fail is None and has_plan else "failed"
    elif promote.get("promoted"):
        status = "deployed"
    elif nothing_to_do:
        status = "unchanged"
    elif rollback.get("status") == "succeeded":
        status = "rolled_back"
    else:
        status = "failed"
    if promote.get("promoted"):
        node_state = "promoted config running"
    elif nothing_to_do:
        node_state = "promoted config running (nothing to do)"
    else:
        node_state = replace.get("node_state")
    return {
        "host": v.get("host"),
        "run_id": v.get("run_id") or "",
        "status": status,
        "step": ((fail or {}).get("step") or "preflight") if (fail is not None or not has_plan) else "done",
        "error": ("%s failed: %s" % (fail["step"], fail["message"])) if fail is not None else None,
        "plan": action if "plan" in preflight else None,
        "plan_why": plan.get("why"),
        "previous_args": mask(plan["running_args"]) if isinstance(plan.get("running_args"), dict) else None,
        "mode": "weights" if action == "weights" else "restart" if action in ("start", "restart") else None,
        "weights": {
            "why": _get(plan, "weights", "why"),
            "version_before": _get(weights, "weight_version", "before"),
            "version_after": _get(weights, "weight_version", "after"),
            "checksums_before": _get(weights, "checksums", "before"),
            "checksums_after": _get(weights, "checksums", "after"),
        },
        "resolution": {"source": resolved.get("source"), "fallback": resolved.get("fallback")},
        "effective_args": mask(launch["effective_args"] if "effective_args" in launch else predicted),
        "effective_source": "server" if "effective_args" in launch else "prediction",
        "predicted_args": mask(predicted),
        "overrides": launch.get("overrides") or [],
        "adjustments": resolved.get("adjustments") or [],
        "signalled": signalled,
        "exited": exited,
        # Adopted containers stopped through their runtime (issue 24): runtime, id, name, image, restart policy.
        "containers_stopped": [dict((k, _mapping(c).get(k)) for k in CONTAINER_KEYS) for c in candidate.get("containers_stopped") or []],
        # The server's image before and after (managers docker, podman): reference, image ID, repository digest.
        "image": {"before": _image(plan.get("running_image")), "after": _image(plan.get("image"))}
        if (plan.get("image") or plan.get("running_image")) else None,
        "planned_teardown": (plan.get("teardown_pids") or []) if v.get("check_mode") else [],
        "holders": plan.get("holders") or [],
        "gpus_before": _mapping(preflight.get("node")).get("gpus") or [],
        "gpus_after": replace.get("gpus_allocated") or [],
        "candidate_pid": _get(candidate, "launch", "pid"),
        "startup_s": launch.get("startup_s"),
        "smoke": {"tokens_per_s": _mapping(smoke).get("tokens_per_s"), "accept_length": _mapping(smoke).get("accept_length")},
        "rollback": {"status": rollback.get("status") or "not_needed", "detail": rollback.get("detail") or None},
        "lease": {"waited_s": lease.get("waited") or 0, "waited_for": lease.get("waited_for"),
                  "took_over": _mapping(lease.get("took_over")).get("owner"),
                  "took_over_reason": lease.get("took_over_reason")},
        "node_state": node_state,
        "details_files": details,
        # The checkpoint prefetch before the teardown (sglang_server_prefetch): its line, None when it did not run.
        "prefetch": _mapping(v.get("prefetch")).get("line"),
    }


def _image(image):
    """``{ref, id, digest}`` of a plan's or a record's image (None when there is none)."""
    image = _mapping(image)
    if not image:
        return None
    return {"ref": image.get("ref"), "id": image.get("id"), "digest": image.get("digest")}


def result_line(row, report_path):
    """The host's one line at the end of the play."""
    smoke = row.get("smoke") or {}
    return ("%s: %s (step %s; smoke %s tok/s, accept length %s; rollback %s); report %s"
            % (row["host"], row["status"], row["step"], smoke.get("tokens_per_s"), smoke.get("accept_length"),
               row["rollback"]["status"], report_path))
