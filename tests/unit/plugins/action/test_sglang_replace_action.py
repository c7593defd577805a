"""Tests for the gpufleet.sglang.sglang_replace action plugin (plugins/action/sglang_replace.py): the interval check
(the variable named, nothing run), the budgets and the async time limit, the plain fallbacks (interval 0, check mode,
a task with async, native async), and the async path with module runs mocked: one progress line per poll, the
module's result returned by the last progress run without the async keys, async_status when the progress fails."""
from __future__ import annotations

import re
from unittest.mock import MagicMock

import pytest

from ansible.errors import AnsibleActionFail

from ansible_collections.gpufleet.sglang.plugins.action import sglang_replace as act

ARGS = {"phase": "all", "target": "candidate", "run_id": "R1", "api_key": "sk-action-secret-123",
        "secret_env": {"HF_TOKEN": "hf_secret_456"}, "secret_args": {},
        "launch": {"name": "main", "manager": "process", "state_dir": "/var/lib/sglang/main", "health_timeout": "900",
                   "log_file": "/var/log/sglang/main.log"},
        "teardown": {"gpus": [0, 1], "term_timeout": 20, "kill_timeout": 10, "device_paths": ["/dev/nvidia*"]},
        "verify": {"timeout": 15}}
MODULE_RESULT = {"changed": True, "failed": False, "phase": "all", "steps": [{"step": "launched", "at": 9.0}],
                 "lines": ["candidate PID 9 healthy"], "node_state": "candidate running"}


def action(args, check_mode=False, async_val=0, native_async=False):
    task = MagicMock()
    task.args = args
    task.async_val = async_val
    task.check_mode = check_mode
    task.action = "gpufleet.sglang.sglang_replace"
    connection = MagicMock()
    connection._shell.tmpdir = None
    connection.has_native_async = native_async
    connection.always_pipeline_modules = False
    plugin = act.ActionModule(task, connection, MagicMock(), loader=None, templar=None, shared_loader_obj=None)
    plugin.get_shell_option = MagicMock(return_value="~/.ansible_async")
    plugin._remove_tmp_path = MagicMock()
    return plugin


@pytest.mark.parametrize("value, expected", [(None, 15), ("", 15), (0, 0), ("0", 0), (15, 15), ("30", 30), (5.0, 5)])
def test_interval_of_accepts_whole_seconds(value, expected):
    assert act.interval_of(value) == expected


@pytest.mark.parametrize("value", ["soon", -1, "-5", 2.5, True, [15]])
def test_a_bad_interval_names_the_variable_and_the_fix(value):
    with pytest.raises(AnsibleActionFail) as err:
        act.interval_of(value)
    msg = str(err.value)
    assert "sglang_server_progress_interval" in msg and repr(value) in msg and "Nothing was touched" in msg, msg


def test_a_bad_interval_fails_before_any_module_runs():
    plugin = action(dict(ARGS, progress_interval="soon"))
    plugin._execute_module = MagicMock(side_effect=AssertionError("no module may run"))
    with pytest.raises(AnsibleActionFail):
        plugin.run(task_vars={"inventory_hostname": "n1"})


def test_budgets_and_the_time_limit_cover_the_module_timeouts():
    steps = act.budgets(ARGS)
    assert steps == {"teardown": 45.0, "launching": 900.0, "rolling_back": 900.0}
    assert act.budgets(dict(ARGS, phase="weights", weights={"timeout": 300}))["launching"] == 300.0
    rollback = dict(ARGS, launch=dict(ARGS["launch"], health_timeout_configured=1800))
    assert act.budgets(rollback)["rolling_back"] == 1800.0
    # The wrapper SIGKILLs the module at its limit: twice every budget (candidate and rollback) and an hour more.
    assert act.time_limit(ARGS) >= 2 * (45 + 900 + 900 + 15) + act.LIMIT_FLOOR_S
    loras = dict(ARGS, lora_adapters=[{"name": "a"}, {"name": "b"}], lora_timeout=300)
    assert act.time_limit(loras) == act.time_limit(ARGS) + 600
    assert act.budgets({})["launching"] == 1800.0


def test_secret_values_are_the_api_key_and_the_secret_fields():
    assert act.secret_values(ARGS) == ["hf_secret_456", "sk-action-secret-123"]
    assert act.secret_values({"api_key": None, "secret_args": {"ssl_keyfile_password": "pw"}}) == ["pw"]


@pytest.mark.parametrize("case", ["interval 0", "check mode", "task async", "native async"])
def test_the_plain_fallbacks_run_the_module_once_as_before(case):
    args = dict(ARGS, progress_interval=0 if case == "interval 0" else 15)
    plugin = action(args, check_mode=case == "check mode", async_val=600 if case == "task async" else 0,
                    native_async=case == "native async")
    plugin._execute_module = MagicMock(return_value=dict(MODULE_RESULT))
    result = plugin.run(task_vars={"inventory_hostname": "n1"})
    assert plugin._execute_module.call_count == 1
    kwargs = plugin._execute_module.call_args.kwargs
    assert "module_name" not in kwargs and kwargs["wrap_async"] is (case == "task async")
    assert result["lines"] == MODULE_RESULT["lines"] and result["changed"] is True


def test_the_async_path_prints_one_line_per_poll_and_returns_the_modules_result(monkeypatch):
    plugin = action(dict(ARGS, progress_interval=7))
    calls = []
    polls = [{"job": "running", "step": "teardown", "step_s": 3.0, "detail": "signalling 4 on GPUs 0,1",
              "log": "SIGTERM received", "gpu_holders": [{"pid": 5, "name": "sglang::schedul", "gpus": ["0", "1"]}]},
             {"job": "running", "step": "launching", "step_s": 40.0, "detail": "candidate PID 9 started",
              "log": "[TP0] Load weight begin.", "gpu_holders": []},
             {"job": "finished", "changed": False}]
    statuses = [dict(MODULE_RESULT, ansible_job_id="j1.2", finished=True, results_file="/x/j1.2"),
                {"erased": "/x/j1.2"}]

    def execute(module_name=None, module_args=None, task_vars=None, wrap_async=False, **kw):
        calls.append((module_name, dict(module_args or {}), wrap_async, plugin._task.async_val))
        if module_name is None:
            return {"ansible_job_id": "j1.2", "started": True, "finished": False, "changed": True}
        if module_name == act.PROGRESS_MODULE:
            return polls.pop(0)
        if module_name == "ansible.legacy.async_status":
            return statuses.pop(0)
        raise AssertionError("no other module runs: the progress, then async_status for the result and the cleanup")

    plugin._execute_module = execute
    shown = []
    monkeypatch.setattr(act.display, "display", lambda msg, *a, **kw: shown.append(msg))
    result = plugin.run(task_vars={"inventory_hostname": "gpu-01"})

    assert result == MODULE_RESULT
    start = calls[0]
    assert start[0] is None and start[2] is True and start[3] == act.time_limit(ARGS)
    assert plugin._task.async_val == 0                     # restored
    probes = [c[1] for c in calls if c[0] == act.PROGRESS_MODULE]
    assert len(probes) == 3
    assert probes[0] == {"jid": "j1.2", "async_dir": "~/.ansible_async", "wait": 7, "gpus": ["0", "1"],
                         "journal": "/var/lib/sglang/main/journal.json", "log_file": "/var/log/sglang/main.log",
                         "device_paths": ["/dev/nvidia*"], "secrets": ["hf_secret_456", "sk-action-secret-123"]}
    status = [c[1] for c in calls if c[0] == "ansible.legacy.async_status"]
    assert status == [{"jid": "j1.2", "_async_dir": "~/.ansible_async"},
                      {"jid": "j1.2", "mode": "cleanup", "_async_dir": "~/.ansible_async"}]
    assert len(calls) == 6                      # the start, three progress runs, the result and the cleanup
    assert len(shown) == 2
    assert shown[0].startswith("gpu-01: replacing the server (phase all) ") and "step teardown for 3 s of 45 s" in shown[0]
    assert "GPUs held: PID 5 (sglang::schedul) on GPU 0,1" in shown[0] and shown[0].endswith("log: SIGTERM received")
    assert "step launching for 40 s of 900 s (candidate PID 9 started)" in shown[1] and "GPU 0,1 free" in shown[1]


def test_a_failed_start_is_returned_and_nothing_is_polled():
    plugin = action(dict(ARGS, progress_interval=5))
    plugin._execute_module = MagicMock(return_value={"failed": True, "msg": "module is missing interpreter line"})
    result = plugin.run(task_vars={"inventory_hostname": "n1"})
    assert result["failed"] is True and plugin._execute_module.call_count == 1


def test_when_the_progress_cannot_be_read_the_job_is_polled_without_it(monkeypatch):
    plugin = action(dict(ARGS, progress_interval=1))
    statuses = [{"started": True, "finished": False, "ansible_job_id": "j3"},
                dict(MODULE_RESULT, finished=True, ansible_job_id="j3", results_file="/x/j3"), {"erased": "x"}]
    names = []

    def execute(module_name=None, module_args=None, task_vars=None, wrap_async=False, **kw):
        names.append((module_name, (module_args or {}).get("mode")))
        if module_name is None:
            return {"ansible_job_id": "j3", "started": True}
        if module_name == act.PROGRESS_MODULE:
            return {"failed": True, "msg": "No module named x"}
        return statuses.pop(0)

    plugin._execute_module = execute
    shown = []
    monkeypatch.setattr(act.display, "display", lambda msg, *a, **kw: shown.append(msg))
    monkeypatch.setattr(act.time, "sleep", lambda s: None)
    result = plugin.run(task_vars={"inventory_hostname": "n1"})
    assert result == MODULE_RESULT
    assert names == [(None, None), (act.PROGRESS_MODULE, None), ("ansible.legacy.async_status", None),
                     ("ansible.legacy.async_status", None), ("ansible.legacy.async_status", "cleanup")]
    assert not statuses
    assert len(shown) == 1 and "the progress cannot be read (No module named x)" in shown[0]


# ---------------------------------------------------------------------------
# sglang_promote's action: the smoke gate with the same machinery
# ---------------------------------------------------------------------------

from ansible_collections.gpufleet.sglang.plugins.action import sglang_promote as promote_act  # noqa: E402

PROMOTE_ARGS = {"name": "main", "config_dir": "/etc/sglang/main", "state_dir": "/var/lib/sglang/main", "manager": "process",
                "run_id": "R1", "progress_interval": 2, "log_file": "/var/log/sglang/main.log",
                "smoke_gate": {"url": "http://127.0.0.1:30000", "api_key": "sk-gate-secret", "timeout": 120}}


def promote_action(args, **kw):
    plugin = action(args, **kw)
    plugin.__class__ = promote_act.ActionModule
    return plugin


@pytest.mark.parametrize("args", [dict(PROMOTE_ARGS, smoke_gate=None), dict(PROMOTE_ARGS, promote=False),
                                  dict(PROMOTE_ARGS, promote="no"), dict(PROMOTE_ARGS, progress_interval=0)])
def test_a_promote_without_a_gate_to_run_is_one_plain_run(args):
    plugin = promote_action(args)
    plugin._execute_module = MagicMock(return_value={"changed": True, "promoted": False})
    result = plugin.run(task_vars={"inventory_hostname": "n1"})
    assert plugin._execute_module.call_count == 1 and plugin._execute_module.call_args.kwargs["wrap_async"] is False
    assert result["changed"] is True


def test_the_gate_is_polled_with_its_own_budget_log_and_secret(monkeypatch):
    plugin = promote_action(dict(PROMOTE_ARGS))
    probes = []
    answers = [{"job": "running", "step": "verifying", "step_s": 5.0, "detail": "smoke gate", "log": "Decode batch",
                "gpu_holders": []}, {"job": "finished", "changed": False}]
    statuses = [{"changed": True, "promoted": True, "finished": True, "ansible_job_id": "j9"}, {"erased": "x"}]

    def execute(module_name=None, module_args=None, task_vars=None, wrap_async=False, **kw):
        if module_name is None:
            assert wrap_async is True and plugin._task.async_val == promote_act.time_limit(PROMOTE_ARGS)
            return {"ansible_job_id": "j9", "started": True}
        if module_name == act.PROGRESS_MODULE:
            probes.append(dict(module_args))
            return answers.pop(0)
        if module_name == "ansible.legacy.async_status":
            return statuses.pop(0)
        raise AssertionError("no other module runs")

    plugin._execute_module = execute
    shown = []
    monkeypatch.setattr(act.display, "display", lambda msg, *a, **kw: shown.append(msg))
    assert plugin.run(task_vars={"inventory_hostname": "n1"}) == {"changed": True, "promoted": True}
    assert probes[0] == {"jid": "j9", "async_dir": "~/.ansible_async", "wait": 2, "journal": "/var/lib/sglang/main/journal.json",
                         "log_file": "/var/log/sglang/main.log", "secrets": ["sk-gate-secret"]}
    assert len(shown) == 1 and re.match(r"^n1: smoke gate \d+ s; step verifying for 5 s of 120 s \(smoke gate\); "
                                        r"log: Decode batch$", shown[0]), shown
    assert promote_act.time_limit(PROMOTE_ARGS) == 2 * (120 + 120) + promote_act.LIMIT_FLOOR_S
