"""Progress lines while the server is replaced (issue 25): the ``sglang_replace`` action runs the module as an async
job and prints one line per host every ``sglang_server_progress_interval`` seconds, read from the node (journal
step, GPU holders, the server log's last line, secrets masked), through ``ansible_runner`` against one simulated
node whose server takes seconds to load. The registered result is the module's own either way.
"""
from __future__ import annotations

import re

import pytest

import playbook_helpers
from playbook_helpers import FAST_SERVER_ENV, SimNode, alive

pytestmark = pytest.mark.slow

REPLACE = "Replace the server in one module run, candidate all"
# The fake server logs its weight load as SGLang does ("Load weight begin/end"); its schedulers load for this long.
SLOW_STARTUP_S = "6"
LINE = re.compile(r"^node1: replacing the server \(phase all\) \d+ s; step (\w+) for \d+ s(?: of (\d+) s)?")

procs = playbook_helpers.procs


@pytest.fixture
def node(tmp_path, procs):
    n = SimNode(tmp_path / "node", procs)
    run = n.run(host_vars=n.host_vars(sglang_server_progress_interval=0))
    assert run.rc == 0 and run.row()["status"] == "deployed", run.summary()
    return n


def _changed(node, interval, **extra):
    """Host vars that change the server (a new schedule policy), with a slow weight load."""
    hv = node.host_vars(server_env=dict(FAST_SERVER_ENV, SGLANG_SIM_STARTUP_S=SLOW_STARTUP_S),
                        sglang_server_progress_interval=interval, **extra)
    hv["sglang_server_args"] = dict(hv["sglang_server_args"], schedule_policy="lpm")
    return hv


def _progress_lines(run):
    return [line for line in run.stdout().splitlines() if line.startswith("node1: replacing the server")]


def _replace_result(run):
    res = run.task_result(REPLACE)
    return dict((k, v) for k, v in res.items() if not k.startswith("_ansible"))


def test_progress_lines_show_the_step_the_gpus_and_the_log_and_the_result_is_the_modules(node):
    old = node.server_pid()
    run = node.run(host_vars=_changed(node, 1))
    assert run.rc == 0, run.summary()
    assert run.row()["status"] == "deployed", run.row()
    new = node.server_pid()
    assert new and new != old and alive(new) and not alive(old)

    lines = _progress_lines(run)
    assert lines, run.stdout_tail()
    steps = []
    for line in lines:
        match = LINE.match(line)
        assert match, line
        steps.append(match.group(1))
        if match.group(1) == "launching":
            assert match.group(2) == "60", line         # sglang_server_health_timeout of the host vars
    assert "launching" in steps, lines
    loading = [line for line in lines if " step launching " in line]
    # While the weights load, the candidate's schedulers hold the target GPUs (from their start on) and its log is shown.
    assert any("GPUs held: PID " in line for line in loading), loading
    assert any("log: " in line for line in loading), loading
    assert any("Load weight" in line or "Capture cuda graph" in line for line in loading), loading
    # The lines reach ansible-runner's job events too (what AWX shows), not only the terminal.
    shown = [e.get("stdout") or "" for e in run.events]
    assert any(line in text for text in shown for line in lines[:1]), "the first progress line is in no job event"
    # The secret is masked everywhere.
    assert node.api_key not in run.everything()

    res = _replace_result(run)
    assert res["failed"] is False and res["changed"] is True, res
    for key in ("ansible_job_id", "started", "finished", "results_file"):
        assert key not in res, (key, sorted(res))
    assert [s["step"] for s in res["steps"]][-1] == "launched", res["steps"]
    assert res["launch"]["pid"] == new


def test_interval_zero_runs_the_module_as_one_plain_run_with_the_same_result_keys(node):
    on = node.run(host_vars=_changed(node, 1))
    assert on.rc == 0, on.summary()
    back = node.run(host_vars=node.host_vars(sglang_server_progress_interval=0))
    assert back.rc == 0 and back.row()["status"] == "deployed", back.summary()
    assert not _progress_lines(back), back.stdout_tail()
    plain = _replace_result(back)
    async_keys = set(_replace_result(on))
    assert set(plain) == async_keys, (sorted(set(plain) ^ async_keys))


def test_a_bad_interval_fails_before_anything_is_touched_naming_the_variable(node):
    old = node.server_pid()
    run = node.run(host_vars=_changed(node, "soon"))
    assert run.rc != 0
    failed = dict(run.failed_tasks())
    assert REPLACE in failed, run.summary()
    msg = failed[REPLACE]["msg"]
    assert "sglang_server_progress_interval" in msg and "'soon'" in msg and "Nothing was touched" in msg, msg
    assert node.server_pid() == old and alive(old) and node.health() == 200


PROMOTE = "Promote the verified config to known-good and release the lease (the smoke gate first, when given)"


def test_the_smoke_gate_shows_progress_too_and_promotes_as_before(node):
    # A slow decode (20 tok/s before speculation) and more requests: the gate takes seconds.
    hv = node.host_vars(server_env=dict(FAST_SERVER_ENV, SGLANG_SIM_BASE_TPS="20"), sglang_server_progress_interval=1,
                        sglang_smoke_requests=8, sglang_smoke_max_new_tokens=48)
    hv["sglang_server_args"] = dict(hv["sglang_server_args"], schedule_policy="lpm")
    run = node.run(host_vars=hv)
    assert run.rc == 0 and run.row()["status"] == "deployed", run.summary()
    lines = [line for line in run.stdout().splitlines() if line.startswith("node1: smoke gate ")]
    assert lines, run.stdout_tail()
    assert any(re.match(r"^node1: smoke gate \d+ s; step verifying for \d+ s of 300 s", line) for line in lines), lines
    assert node.api_key not in run.everything()
    res = run.task_result(PROMOTE)
    assert res["promoted"] is True and res["failed"] is False, res
    for key in ("ansible_job_id", "started", "finished", "results_file"):
        assert key not in res, (key, sorted(res))
    assert node.journal()["step"] == "promoted"
