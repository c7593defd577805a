# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filter ``gpufleet.sglang.sglang_pd_plan`` (documentation in ``sglang_pd_plan.yml``).

The rules are in ``plugins/module_utils/redeploy/pd.py``; this wrapper turns the play's hosts into the rollout's
inputs and adds the batch rule: a layout change can only be rolled with every prefill and decode host in
the same batch.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import pd


def sglang_pd_plan(hosts, version="0.5.23", batch=None):
    """The PD rollout of ``hosts`` (``[{host, role, old, new}]``); see sglang_pd_plan.yml."""
    if not isinstance(hosts, Sequence) or isinstance(hosts, (str, bytes)):
        raise AnsibleFilterError("sglang_pd_plan: the input must be a list of {host, role, old, new}, got %r" % (hosts,))
    prefills, decodes = {}, {}
    for item in hosts:
        if not isinstance(item, Mapping) or not item.get("host"):
            raise AnsibleFilterError("sglang_pd_plan: every item needs host, role, old and new; got %r" % (item,))
        role = str(item.get("role") or "")
        old = dict(item.get("old") or {}) or None
        new = dict(item.get("new") or {})
        if role == "prefill":
            prefills[item["host"]] = (old, new)
        elif role == "decode":
            decodes[item["host"]] = (old, new)
    if not prefills and not decodes:
        return {"order": "none", "problems": [], "why": "no prefill/decode hosts in this play", "steps": []}
    plan = pd.rollout_order(prefills, decodes, version=version)
    problems = list(plan.get("problems") or [])
    if plan.get("layout_changed") and batch is not None:
        outside = sorted((set(prefills) | set(decodes)) - set(batch))
        if outside:
            problems.append(
                "the shared KV layout changes (%s), so every prefill and decode host must be redeployed in one batch; "
                "%s are in other batches: set sglang_serial: \"100%%\" for this run" % (
                    ", ".join(d.get("field", "?") for d in plan.get("layout_differences") or []) or "layout",
                    ", ".join(outside)))
    if plan.get("order") == pd.ROLLING and batch is not None:
        # One host at a time, role by role: a batch that takes every serving server of a role out at once breaks
        # the rolling plan's promise (a Ready server of each role) where the role has more than one.
        changing = set(h for step in plan.get("steps") or [] for h in step.get("hosts") or [])
        for role, hosts in (("prefill", prefills), ("decode", decodes)):
            serving = sorted(h for h, (old, _new) in hosts.items() if old is not None)
            out = [h for h in serving if h in changing and h in batch]
            if len(serving) >= 2 and len(out) == len(serving):
                problems.append(
                    "this batch replaces every serving %s server at once (%s), so none would stay Ready while they are "
                    "replaced; run with sglang_serial: 1 (the rolling order replaces one host at a time)"
                    % (role, ", ".join(out)))
    plan["problems"] = problems
    return plan


class FilterModule(object):
    """Prefill/decode rollout filter."""

    def filters(self):
        return {"sglang_pd_plan": sglang_pd_plan}
