# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The redeploy flow's decisions on the controller (documented in plugins/modules/redeploy_flow.py).

Every decision is a pure function of ``module_utils/redeploy/flow.py`` (table-tested); this plugin hands it
what the play registered and returns the answer, which the role registers (a registered result, not a fact:
facts would be shadowed by role vars and read only through ``ansible_facts`` from ansible-core 2.24 on). The
group decisions read the other hosts' registered results: ``sglang_redeploy_layout`` (decision ``layout``),
``sglang_redeploy_group`` (``members``) and ``sglang_server_preflight``. It runs in the controller and executes
no module.
"""
from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.gpufleet.sglang.plugins.module_utils.common import secrets
from ansible_collections.gpufleet.sglang.plugins.module_utils.common.names import Names
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import flow
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import overlap
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import pd

# What the overlap decision's messages call its inputs: the variables this action reads.
OVERLAP_LABELS = Names({"overlap": "sglang_redeploy_overlap", "router_url": "sglang_router_url",
                        "router_worker_url": "sglang_router_worker_url", "manager": "sglang_server_manager"})
DECISIONS = ("layout", "members", "action", "pd", "barrier", "failure", "rollback_failed", "settle", "report")
# What each multi-node checkpoint reads of the other ranks.
CHECKPOINT_RESULTS = {"preflight": "sglang_server_preflight", "teardown": "sglang_server_replace",
                      "launch": "sglang_server_replace", "smoke": "sglang_smoke_result"}

ARGUMENT_SPEC = dict(
    decision=dict(type="str", required=True, choices=list(DECISIONS)),
    args=dict(type="raw"),
    host_args=dict(type="raw"),
    checkpoint=dict(type="str", choices=list(CHECKPOINT_RESULTS)),
    version=dict(type="str", default="0.5.23"),
    results=dict(type="dict", default={}),
    failed_result=dict(type="raw"),
    failed_task=dict(type="str"),
    before_lease=dict(type="bool", default=False),
    previous=dict(type="raw"),
    multinode=dict(type="bool", default=False),
    failure=dict(type="raw"),
    rollback=dict(type="raw"),
    report=dict(type="dict", default={}),
    report_path=dict(type="str", default=""),
)


def _plain(value):
    """A registered result as plain data (None for an unset value)."""
    if value is None or value == "":
        return None
    return value


class ActionModule(ActionBase):

    TRANSFERS_FILES = False
    _supports_check_mode = True
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        super().run(tmp, task_vars)
        dummy, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        self.vars = task_vars or {}
        self.host = self.vars.get("inventory_hostname")
        return getattr(self, "_" + args["decision"])(args)

    # ---- helpers -----------------------------------------------------------
    def _hostvar(self, host, name, default=None):
        """``hostvars[host][name]`` (templated by HostVars), or ``default``."""
        hostvars = self.vars.get("hostvars") or {}
        try:
            values = hostvars[host]
            return values[name] if name in values else default
        except KeyError:
            return default

    def _own(self, name, default=None):
        return self._hostvar(self.host, name, default)

    def _layout_of(self, host):
        return _plain(self._hostvar(host, "sglang_redeploy_layout")) or {}

    def _group(self):
        """This host's multi-node group (from the ``members`` decision), or the host alone."""
        return list((_plain(self._own("sglang_redeploy_group")) or {}).get("members") or [self.host])

    # ---- multi-node groups ---------------------------------------------------
    def _layout(self, args):
        got = flow.layout(self.host, args["args"], args["host_args"])
        return dict(changed=False, **got)

    def _members(self, args):
        play = list(self.vars.get("ansible_play_hosts_all") or [self.host])
        own = self._layout_of(self.host)
        keys = dict((h, self._layout_of(h).get("group_key")) for h in play)
        nnodes = int(own.get("nnodes") or 1)
        key = own.get("group_key") or self.host
        group = flow.members(self.host, nnodes, key, play, keys)
        ranks = dict((h, self._layout_of(h).get("rank", 0)) for h in group)
        problem = flow.batch_problem(self.host, own.get("rank", 0), nnodes, key, group,
                                     list(self.vars.get("ansible_play_batch") or [self.host]), ranks)
        result = dict(changed=False, members=group, multinode=len(group) > 1)
        if problem:
            result.update(failed=True, msg=problem, failed_step="preflight", reason="group_split")
        return result

    def _action(self, args):
        group = self._group()
        actions = [(_plain(self._hostvar(h, "sglang_server_preflight")) or {}).get("plan", {}).get("action") or "none"
                   for h in group]
        action = flow.group_action(actions, len(group) > 1)
        role = flow.pd_role(_plain(self._own("sglang_server_preflight")))
        got = dict(changed=False, action=action, pd_role=role, smoke_mode=role or "null")
        got.update(self._overlap_path(action, len(group) > 1, role))
        return got

    def _overlap_path(self, action, multinode, role):
        """The path of this host's redeploy, overlap or in place, and why (module_utils/redeploy/overlap.py)."""
        plan = (_plain(self._own("sglang_server_preflight")) or {}).get("plan") or {}
        try:
            got = overlap.decide(self._own("sglang_redeploy_overlap", "off"), plan.get("overlap"), action,
                                 router_url=self._own("sglang_router_url", ""), worker_url=self._own("sglang_router_worker_url", ""),
                                 manager=plan.get("manager"), multinode=multinode, pd_role=role, recovering=plan.get("recovering"),
                                 names=OVERLAP_LABELS)
        except ValueError as exc:
            return dict(failed=True, msg=str(exc), failed_step="preflight", reason="bad_setting")
        return dict(path=got["path"], path_why=got["why"], path_reasons=got["reasons"], overlap=plan.get("overlap") or {})

    def _barrier(self, args):
        result_var = CHECKPOINT_RESULTS[args["checkpoint"]]
        group = self._group()
        checked = [group[0]] if args["checkpoint"] == "smoke" else [h for h in group if h != self.host]
        failed = [h for h in checked if (self._hostvar(h, result_var) or {"failed": True}).get("failed")]
        outcome = flow.group_barrier(args["checkpoint"], failed)
        return outcome or dict(changed=False, checkpoint=args["checkpoint"])

    # ---- prefill/decode ------------------------------------------------------
    def _pd(self, args):
        play = list(self.vars.get("ansible_play_hosts_all") or [self.host])
        hosts = [(h, flow.merged_args(self._hostvar(h, "sglang_server_args"), self._hostvar(h, "sglang_server_host_args")),
                  _plain(self._hostvar(h, "sglang_server_preflight")) or {}) for h in play]
        try:
            plan = pd.play_plan(flow.pd_hosts(hosts), version=args["version"],
                                batch=list(self.vars.get("ansible_play_batch") or [self.host]))
        except ValueError as exc:
            return dict(failed=True, msg="prefill/decode rollout: %s" % exc)
        result = dict(changed=False, plan=plan, lines=flow.pd_plan_lines(plan))
        if plan.get("problems"):
            result.update(failed=True, failed_step="preflight", reason="pd_refused",
                          msg="The prefill/decode rollout of this play is refused (%s): %s. Nothing was touched."
                              % (plan.get("order"), "; ".join(str(p) for p in plan["problems"])))
        return result

    # ---- failures ------------------------------------------------------------
    def _failure(self, args):
        if args["before_lease"]:
            got = flow.early_failure(_plain(args["previous"]), _plain(args["failed_result"]) or {})
            return dict(changed=False, **got)
        results = dict((k, _plain(v)) for k, v in (args["results"] or {}).items())
        got = flow.failure(results, _plain(args["failed_result"]) or {}, args["failed_task"], args["multinode"])
        return dict(changed=False, **got)

    def _rollback_failed(self, args):
        got = flow.rollback_failed(_plain(args["failed_result"]) or {})
        return dict(changed=False, **got)

    def _settle(self, args):
        fail = _plain(args["failure"]) or {"step": "unknown", "message": "unknown error", "reason": ""}
        rollback = _plain(args["rollback"]) or {}
        replace = _plain((args["results"] or {}).get("replace")) or {}
        rb = flow.rollback_of(rollback.get("status"), rollback.get("detail"), replace)
        settled = {"rollback": rb, "outcome": flow.journal_outcome(rb),
                   "detail": "%s failed: %s" % (fail["step"], str(fail["message"])[:300]),
                   "message": flow.outcome_line(self.host, fail, rb, replace, args["multinode"])}
        return dict(changed=False, **settled)

    # ---- the report ----------------------------------------------------------
    def _report(self, args):
        data = dict((k, _plain(v)) for k, v in (args["report"] or {}).items())
        data.setdefault("host", self.host)
        data["check_mode"] = bool(self._task.check_mode) if data.get("check_mode") is None else data["check_mode"]
        row = flow.report_row(data, secrets.redact)
        line = flow.result_line(row, args["report_path"])
        return dict(changed=False, msg=line, row=row)
