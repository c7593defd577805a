# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""``sglang_promote`` with progress lines while its smoke gate runs (the ``sglang_replace`` action's machinery).

Only a promote with ``smoke_gate`` runs long (up to the gate's ``timeout``, 300 s by default); it runs as an async job
polled by ``sglang_progress`` (journal step ``verifying`` against the gate's budget, the server log's last line,
secrets masked). Every other promote (settling the journal, releasing the lease) is one plain module run, as before.
"""
from __future__ import annotations

from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.gpufleet.sglang.plugins.action import sglang_replace
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import journal as journal_mod

LIMIT_FLOOR_S = sglang_replace.LIMIT_FLOOR_S


def budgets(args):
    gate = args.get("smoke_gate") or {}
    return {journal_mod.VERIFYING: sglang_replace._seconds(gate.get("timeout"), 300)}  # pylint: disable=protected-access


def time_limit(args):
    """Twice the gate's budget and its last request's timeout, and an hour."""
    gate = args.get("smoke_gate") or {}
    total = budgets(args)[journal_mod.VERIFYING] + sglang_replace._seconds(gate.get("request_timeout"), 120)  # pylint: disable=protected-access
    return int(2 * total + LIMIT_FLOOR_S)


class ActionModule(sglang_replace.ActionModule):

    def _wants_progress(self, args):
        return bool(args.get("smoke_gate")) and boolean(args.get("promote", True), strict=False)

    def _what(self, args):
        return "smoke gate"

    def _budgets(self, args):
        return budgets(args)

    def _time_limit(self, args):
        return time_limit(args)

    def _probe(self, args):
        state_dir = args.get("state_dir")
        log_file = args.get("log_file") or None
        if not log_file and args.get("manager", "process") == "process" and state_dir:
            log_file = state_dir.rstrip("/") + "/server.log"
        gate = args.get("smoke_gate") or {}
        return {"journal": journal_mod.path_for(state_dir) if state_dir else None, "log_file": log_file,
                "unit": (args.get("unit") or "sglang-%s.service" % args.get("name", "main"))
                if args.get("manager") == "systemd" and not log_file else None,
                "secrets": sglang_replace.secret_values({"api_key": gate.get("api_key")})}
