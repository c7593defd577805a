# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""``sglang_replace`` with progress lines while it runs (docs/user-guide.md, "Progress while the server loads").

The module is one silent run of up to ``health_timeout`` (1800 s by default). ansible-runner and AWX end a job
that prints nothing for ``idle_timeout`` seconds, while the redeploy goes on with no one watching. With
``progress_interval`` > 0 this action starts the module as an Ansible async job (``async_wrapper``, the machinery
of ``async:``), then runs the ``sglang_progress`` module, which waits on the node for the job to end, at most
``progress_interval`` seconds, and otherwise reads the journal step, the server log's last line (masked) and the GPU
holders; the action prints one line per host from them (``Display.display``: the terminal, ansible-runner's stdout and
AWX's job events). Once the job has finished, that same ``sglang_progress`` run says ``job: finished``; the job's
result is then read with ``async_status``, its file removed (``mode: cleanup``), and returned as the module returned
it, the async bookkeeping keys removed. When the progress cannot be read, the job is polled with ``async_status``.

Nothing here runs inside the outage: the job runs on the node on its own, and the progress runs only read. The job
ends as it would have without progress; its end is seen within about 0.2 s (the progress module watches the job file).

Falls back to one plain module run, exactly as before, with ``progress_interval`` 0, in check mode, when the task
has ``async:`` of its own, and on connections that cannot run an async job this way (native async, always
pipelined). A controller that dies leaves the job running on the node, as a dead controller always left the module
running; the journal and the lease tell the next run where it stands.
"""
from __future__ import annotations

import time

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible.utils.vars import merge_hash

from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import journal as journal_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import progress

display = Display()

PROGRESS_MODULE = "gpufleet.sglang.sglang_progress"
DEFAULT_INTERVAL = 15
# Keys that the async machinery adds to a module's result; the module's own result has none of them.
ASYNC_KEYS = ("ansible_job_id", "started", "finished", "results_file", "erased", "_ansible_suppress_tmpdir_delete")
# What async_wrapper gets as its time limit (it SIGKILLs the module past it): far beyond the module's own timeouts.
LIMIT_FLOOR_S = 3600
# The controller gives up on a job file that still says "started" this long after the wrapper's limit.
LIMIT_GRACE_S = 300


def _seconds(value, default):
    try:
        return float(value) if value not in (None, "") else float(default)
    except (TypeError, ValueError):
        return float(default)


def interval_of(value):
    """The progress interval in whole seconds (0: off); raises AnsibleActionFail naming the variable for bad input."""
    if value is None or value == "":
        return DEFAULT_INTERVAL
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = None
    if isinstance(value, bool) or number is None or number < 0 or number != int(number):
        raise AnsibleActionFail(
            "progress_interval (variable sglang_server_progress_interval) must be a whole number of seconds, 0 or more "
            "(0 turns the progress lines off); got %r. Set it to, for example, 15. Nothing was touched." % (value,))
    return int(number)


def budgets(args):
    """The seconds each journal step may take, from the module's arguments: the teardown (signal, kill, GPUs free),
    the health gate of the candidate and of a rollback."""
    launch = args.get("launch") or {}
    teardown = args.get("teardown") or {}
    verify = args.get("verify") or {}
    health = _seconds(launch.get("health_timeout"), 1800)
    td = _seconds(teardown.get("term_timeout"), 30) + _seconds(teardown.get("kill_timeout"), 15) + _seconds(verify.get("timeout"), 120)
    weights = _seconds((args.get("weights") or {}).get("timeout"), 600)
    return {journal_mod.TEARDOWN: td,
            journal_mod.LAUNCHING: weights if args.get("phase") == "weights" else health,
            journal_mod.ROLLING_BACK: _seconds(launch.get("health_timeout_configured"), health)}


def time_limit(args):
    """async_wrapper's limit: twice every budget (a candidate and a rollback), the LoRA loads, and an hour."""
    total = sum(budgets(args).values()) + _seconds((args.get("verify") or {}).get("timeout"), 120)
    loras = len(args.get("lora_adapters") or []) * _seconds(args.get("lora_timeout"), 300)
    return int(2 * total + loras + LIMIT_FLOOR_S)


def secret_values(args):
    values = [args.get("api_key")]
    for field in ("secret_args", "secret_env"):
        values.extend((args.get(field) or {}).values())
    return sorted(set(str(v) for v in values if v not in (None, "") and not isinstance(v, bool)))


class ActionModule(ActionBase):

    _supports_check_mode = True
    _supports_async = True

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        task_vars = task_vars or {}
        interval = interval_of(self._task.args.get("progress_interval"))
        plain = (not interval or self._task.async_val or self._task.check_mode or not self._wants_progress(self._task.args)
                 or self._connection.has_native_async or self._connection.always_pipeline_modules)
        if plain:
            return self._plain(result, task_vars)
        return merge_hash(result, self._with_progress(interval, task_vars))

    # ---- what the module at hand shows (sglang_promote's action overrides these) ----
    def _wants_progress(self, args):  # pylint: disable=unused-argument
        return True

    def _what(self, args):
        return "replacing the %s (phase %s)" % ("known-good config" if args.get("target") == "known_good" else "server",
                                                args.get("phase") or "all")

    def _budgets(self, args):
        return budgets(args)

    def _time_limit(self, args):
        return time_limit(args)

    def _probe(self, args):
        """sglang_progress's arguments less the job: the journal, the server log, the target GPUs, the secrets."""
        launch = args.get("launch") or {}
        teardown = args.get("teardown") or {}
        state_dir = launch.get("state_dir")
        log_file = launch.get("log_file") or None
        if not log_file and launch.get("manager", "process") == "process" and state_dir:
            log_file = state_dir.rstrip("/") + "/server.log"     # the launcher's default for a process server
        return {"gpus": [str(g) for g in teardown.get("gpus") or []],
                "journal": journal_mod.path_for(state_dir) if state_dir else None, "log_file": log_file,
                "unit": (launch.get("unit") or "sglang-%s.service" % launch.get("name", "main"))
                if launch.get("manager") == "systemd" else None,
                "device_paths": list(teardown.get("device_paths") or []), "secrets": secret_values(args)}

    def _plain(self, result, task_vars):
        """What the module did before this action existed (the ``normal`` action)."""
        wrap_async = bool(self._task.async_val) and not self._connection.has_native_async
        result = merge_hash(result, self._execute_module(task_vars=task_vars, wrap_async=wrap_async))
        if not wrap_async:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        return result

    def _run_module(self, name, args, task_vars):
        """One short module run (progress, async_status) in a temporary directory of its own."""
        self._connection._shell.tmpdir = None
        try:
            return self._execute_module(module_name=name, module_args=args, task_vars=task_vars)
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
            self._connection._shell.tmpdir = None

    def _with_progress(self, interval, task_vars):
        args = self._task.args
        limit = self._time_limit(args)
        self._task.async_val = limit
        try:
            started = self._execute_module(task_vars=task_vars, wrap_async=True)
        finally:
            self._task.async_val = 0
        jid = started.get("ansible_job_id")
        if started.get("failed") or not jid:
            return started
        # As the wrapper got it (ANSIBLE_ASYNC_DIR), expanded on the node by the modules themselves (type path): the
        # controller's expansion of "~" can name another home than the wrapper's (become, a HOME of the job's own).
        async_dir = self.get_shell_option("async_dir", default="~/.ansible_async")
        host = task_vars.get("inventory_hostname") or self._play_context.remote_addr
        probe = dict(self._probe(args), jid=jid, async_dir=async_dir, wait=interval)
        probe = dict((k, v) for k, v in probe.items() if v is not None)
        gpus = probe.get("gpus") or []
        what = self._what(args)
        steps = self._budgets(args)
        began = time.monotonic()
        blind = False
        while True:
            if time.monotonic() - began > limit + LIMIT_GRACE_S:
                raise AnsibleActionFail("the %s job %s on %s did not finish within %d s (its time limit); the node journal "
                                        "says where it stands (playbook gpufleet.sglang.status)" % (self._task.action, jid, host, limit))
            if blind:
                time.sleep(interval)
                state = self._run_module("ansible.legacy.async_status", {"jid": jid, "_async_dir": async_dir}, task_vars)
                if state.get("finished"):
                    self._run_module("ansible.legacy.async_status", {"jid": jid, "mode": "cleanup", "_async_dir": async_dir},
                                     task_vars)
                if state.get("finished") or state.get("failed"):
                    return _module_result(state)
                continue
            seen = self._run_module(PROGRESS_MODULE, probe, task_vars)
            if seen.get("job") == "finished":
                # The job has ended (sglang_progress saw its file say so): its result, then the file removed.
                state = self._run_module("ansible.legacy.async_status", {"jid": jid, "_async_dir": async_dir}, task_vars)
                if state.get("finished"):
                    self._run_module("ansible.legacy.async_status", {"jid": jid, "mode": "cleanup", "_async_dir": async_dir},
                                     task_vars)
                    return _module_result(state)
                continue
            if seen.get("failed"):
                # The progress is only a view: without it, the job is polled as plain async.
                display.display("%s: the progress cannot be read (%s); waiting for the job without it"
                                % (host, str(seen.get("msg") or "")[:200]))
                blind = True
                continue
            display.display(progress.line(host, what, time.monotonic() - began, seen, steps, gpus))


def _module_result(final):
    """The job's result less what the async machinery added to it."""
    final = dict(final)
    for key in ASYNC_KEYS:
        final.pop(key, None)
    for key in ("stdout", "stderr"):
        if final.get(key) == "":
            final.pop(key, None)
            final.pop(key + "_lines", None)
    return final
