# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Benchmark-only callback: per host and task, wall-clock start and end, plus a few result fields.

Used by `make bench` (bench/_common.run_playbook), never shipped: enabled with
ANSIBLE_CALLBACK_PLUGINS=bench/callback_plugins ANSIBLE_CALLBACKS_ENABLED=bench_timing;
appends one JSON line per host and task to $GPUFLEET_BENCH_TIMING.
"""
from __future__ import annotations

DOCUMENTATION = r"""
name: bench_timing
type: aggregate
short_description: per-host task timings for make bench
description:
  - Records when each task started and ended on each host (epoch seconds) and a few result fields.
  - Appends them as JSON lines to E(GPUFLEET_BENCH_TIMING), one per host and task, as results come in (so a run that
    aborts still leaves its records).
requirements:
  - enabled with ANSIBLE_CALLBACKS_ENABLED=bench_timing
"""

import json
import os
import time

from ansible.plugins.callback import CallbackBase

KEEP = ("elapsed", "startup_s", "polls", "pid", "tokens_per_s", "accept_length", "acquired", "msg")


def _plain(value, depth=0):
    if depth > 4:
        return None
    if isinstance(value, dict):
        return dict((str(k), _plain(v, depth + 1)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return [_plain(v, depth + 1) for v in value]
    if isinstance(value, bool):
        return bool(value)
    if value is None or isinstance(value, (int, float)):
        return value
    return str(value)


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "bench_timing"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super(CallbackModule, self).__init__(*args, **kwargs)
        self._open = {}
        self._task_start = {}

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._task_start[task._uuid] = time.time()

    def v2_runner_on_start(self, host, task):
        self._open[(host.get_name(), task._uuid)] = time.time()

    def _end(self, result, status):
        now = time.time()
        host = result._host.get_name()
        task = result._task
        res = getattr(result, "result", None)
        if res is None:
            res = result._result
        rec = {
            "host": host,
            "task": task.get_name(),
            "action": task.action,
            "uuid": task._uuid,
            "task_start": self._task_start.get(task._uuid),
            "start": self._open.pop((host, task._uuid), None),
            "end": now,
            "status": status,
        }
        for key in KEEP:
            if key in res:
                rec[key] = _plain(res[key])
        if "action" in res:
            rec["result_action"] = _plain(res["action"])
        for key in ("timings", "steps", "torn_down"):
            if key in res:
                rec[key] = _plain(res[key])
        gate = res.get("smoke")
        if isinstance(gate, dict) and "elapsed" in gate:      # sglang_promote's smoke_gate
            rec["smoke"] = {"elapsed": _plain(gate.get("elapsed")), "tokens_per_s": _plain(gate.get("tokens_per_s"))}
        launch = res.get("launch")
        if isinstance(launch, dict):
            rec["launch"] = {"pid": _plain(launch.get("pid")), "startup_s": _plain(launch.get("startup_s"))}
        weights = res.get("weights")
        if isinstance(weights, dict):
            rec["weights"] = {"timings": _plain(weights.get("timings")), "changed": _plain(weights.get("changed"))}
        resolved = res.get("resolved")
        if isinstance(resolved, dict) and "source" in resolved:
            rec["resolution_source"] = _plain(resolved.get("source"))
        plan = res.get("plan")
        if isinstance(plan, dict) and "action" in plan:
            rec["plan_action"] = _plain(plan.get("action"))
        if "signalled" in res:
            rec["signalled"] = [{"pid": _plain(s.get("pid")), "seconds_to_exit": _plain(s.get("seconds_to_exit")),
                                 "signals": _plain(s.get("signals"))} for s in res["signalled"] or []]
        path = os.environ.get("GPUFLEET_BENCH_TIMING")
        if path:
            with open(path, "a") as fh:
                fh.write(json.dumps(rec) + "\n")

    def v2_runner_on_ok(self, result):
        self._end(result, "ok")

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._end(result, "failed")

    def v2_runner_on_skipped(self, result):
        self._end(result, "skipped")

    def v2_runner_on_unreachable(self, result):
        self._end(result, "unreachable")
