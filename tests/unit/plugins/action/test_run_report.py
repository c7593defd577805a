"""Tests for the gpufleet.sglang.run_report action plugin (plugins/action/run_report.py): the Markdown
it renders (compared with the output of the Jinja template it replaced, kept in
``data/report_two_hosts.md``), the merge of a batch into an existing report, the atomic 0640 writes,
the errors for a report that cannot be read or written, and ``ActionModule.run`` itself (argument
checks, the result, no module executed)."""
from __future__ import annotations

import json
import os
import pathlib
import stat
from unittest.mock import MagicMock

import pytest

from ansible.errors import AnsibleActionFail

from ansible_collections.gpufleet.sglang.plugins.action import run_report

DATA = pathlib.Path(__file__).resolve().parents[1] / "data"
ROWS = json.loads((DATA / "report_two_hosts.json").read_text())


def test_markdown_is_the_documented_format():
    assert run_report.render_markdown("R1", ROWS) == (DATA / "report_two_hosts.md").read_text()


def test_markdown_of_sparse_rows_uses_dashes_and_none():
    text = run_report.render_markdown("R2", [{"host": "h", "status": "failed", "step": "preflight"}])
    assert "| h | failed | preflight | - / - / - / - | - | - | - | - | None |" in text
    assert "  - none\n- GPUs before: -\n- GPUs after: -\n- Signalled:\n  - none\n" in text
    assert "- Error" not in text and "- Rollback" not in text


def test_markdown_of_a_check_mode_row_says_what_would_be_signalled():
    rows = [{"host": "gpu-01", "status": "planned", "step": "done", "signalled": [], "planned_teardown": [4218, 4230],
             "holders": [{"pid": 4218, "class": "managed", "cmdline": "python3 -m sglang.launch_server --api-key ********"}]},
            {"host": "gpu-02", "status": "planned", "step": "done", "signalled": [], "planned_teardown": []}]
    text = run_report.render_markdown("R3", rows)
    assert ("- Signalled: none (check mode); a real run would signal:\n"
            "  - would signal PID 4218 (managed, python3 -m sglang.launch_server --api-key ********)\n"
            "  - would signal PID 4230\n") in text
    assert "- Signalled: none (check mode; a real run would signal nothing)\n" in text
    assert "- Signalled:\n  - none" not in text


def test_markdown_gives_the_plan_the_previous_config_the_lease_and_what_exited_on_its_own():
    row = {"host": "gpu-01", "status": "deployed", "step": "done", "plan": "restart", "plan_why": "config changed",
           "previous_args": {"tp_size": 8, "speculative_num_steps": 1},
           "lease": {"waited_s": 12.5, "waited_for": "run R0", "took_over": None},
           "signalled": [{"pid": 101, "name": "python3", "signals": ["SIGTERM"]}],
           "exited": [{"pid": 102, "name": "sglang::scheduler", "signals": []}],
           "details_files": ["/var/lib/sglang/main/details/R1-replace-candidate-all.json"]}
    text = run_report.render_markdown("R4", [row])
    assert "| 101 |" in text and "102" not in text.split("\n## ", maxsplit=1)[0], text      # the table lists what was signalled
    assert "- Plan: restart: config changed\n" in text
    assert "- Previous config: speculative_num_steps=1, tp_size=8\n" in text
    assert "- Lease: waited 12.5 s for run R0\n" in text
    assert "- Signalled:\n  - PID 101 (python3): SIGTERM\n" in text
    assert "- Exited with their server (not signalled): PID 102 (sglang::scheduler)\n" in text
    assert "- Full module result on the node: `/var/lib/sglang/main/details/R1-replace-candidate-all.json`\n" in text


def test_merge_replaces_a_host_and_keeps_the_others():
    old = [{"host": "a", "status": "deployed"}, {"host": "b", "status": "failed"}, "junk"]
    new = [{"host": "b", "status": "rolled_back"}, {"host": "c", "status": "deployed"}]
    assert run_report.merge_rows(old, new) == [old[0], "junk", new[0], new[1]]


def test_write_report_creates_the_directory_and_merges_batches(tmp_path):
    base = tmp_path / "reports" / "deep" / "R1-redeploy"
    json_path, md_path, rows = run_report.write_report(str(base), "R1", ROWS[:1])
    assert json_path == str(base) + ".json" and md_path == str(base) + ".md" and [r["host"] for r in rows] == ["gpu-01"]
    assert stat.S_IMODE(os.stat(base.parent).st_mode) == 0o750
    for path in (json_path, md_path):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
    # The next batch: gpu-01 again (updated) and gpu-02.
    updated = dict(ROWS[0], status="rolled_back")
    run_report.write_report(str(base), "R1", [updated, ROWS[1]])
    on_disk = json.loads(pathlib.Path(json_path).read_text())
    assert [(r["host"], r["status"]) for r in on_disk] == [("gpu-01", "rolled_back"), ("gpu-02", "rolled_back")]
    assert pathlib.Path(json_path).read_text().endswith("}\n]\n")
    assert "| gpu-01 | rolled_back |" in pathlib.Path(md_path).read_text()
    assert sorted(p.name for p in base.parent.iterdir()) == ["R1-redeploy.json", "R1-redeploy.md"]   # no temporary file left


@pytest.mark.parametrize("content, error", [
    ("{not json", "cannot be read"),
    ('{"host": "a"}', "is not a JSON list of hosts"),
])
def test_a_file_that_is_not_a_report_is_never_overwritten(tmp_path, content, error):
    base = tmp_path / "R1-redeploy"
    (tmp_path / "R1-redeploy.json").write_text(content)
    with pytest.raises(AnsibleActionFail) as info:
        run_report.write_report(str(base), "R1", ROWS)
    assert error in str(info.value) and "sglang_report_dir" in str(info.value)
    assert (tmp_path / "R1-redeploy.json").read_text() == content
    assert not (tmp_path / "R1-redeploy.md").exists()


def test_failed_write_keeps_the_old_report_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    from ansible_collections.gpufleet.sglang.plugins.module_utils.node import supervise

    base = tmp_path / "R1-redeploy"
    run_report.write_report(str(base), "R1", ROWS[:1])
    before = sorted((p.name, p.read_text()) for p in tmp_path.iterdir())

    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(supervise.os, "replace", refuse)
    with pytest.raises(OSError):
        run_report.write_report(str(base), "R1", ROWS)
    assert sorted((p.name, p.read_text()) for p in tmp_path.iterdir()) == before


def action(args, check_mode=False):
    task = MagicMock()
    task.args = args
    task.async_val = 0
    task.check_mode = check_mode
    connection = MagicMock()
    connection._shell.tmpdir = None
    return run_report.ActionModule(task, connection, MagicMock(), loader=None, templar=None, shared_loader_obj=None), connection


def test_action_writes_the_report_without_running_a_module(tmp_path):
    plugin, connection = action({"path": str(tmp_path / "R1-redeploy"), "title": "R1", "rows": ROWS}, check_mode=True)
    plugin._execute_module = MagicMock(side_effect=AssertionError("no module may run"))
    result = plugin.run(task_vars={})
    assert result["changed"] is False and not result.get("failed")
    assert result["json_path"] == str(tmp_path / "R1-redeploy.json") and result["hosts"] == ["gpu-01", "gpu-02"]
    assert (tmp_path / "R1-redeploy.md").read_text() == (DATA / "report_two_hosts.md").read_text()
    assert not connection.exec_command.called and not connection.put_file.called


def test_action_argument_errors(tmp_path):
    plugin, dummy = action({"path": str(tmp_path / "r"), "rows": [{"host": "a"}, {"status": "x"}]})
    with pytest.raises(AnsibleActionFail) as info:
        plugin.run(task_vars={})
    assert "rows[1] has no host" in str(info.value)
    plugin, dummy = action({"rows": []})
    with pytest.raises(AnsibleActionFail) as info:
        plugin.run(task_vars={})
    assert "missing required arguments: path" in str(info.value)
    assert not (tmp_path / "r.json").exists()


def test_action_names_the_variable_when_the_directory_cannot_be_written(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    plugin, dummy = action({"path": str(blocker / "R1-redeploy"), "rows": ROWS})
    with pytest.raises(AnsibleActionFail) as info:
        plugin.run(task_vars={})
    assert str(info.value).startswith("Cannot write the report under %s: " % blocker) and "sglang_report_dir" in str(info.value)


def test_on_error_warn_returns_the_error_without_failing(tmp_path):
    """A report that cannot be written must never hide the outcome of a redeploy that already happened."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    plugin, connection = action({"path": str(blocker / "R1-redeploy"), "rows": ROWS, "on_error": "warn"})
    result = plugin.run(task_vars={})
    assert result["failed"] is False and result["changed"] is False
    assert result["report_error"].startswith("Cannot write the report under %s: " % blocker)
    assert "fix sglang_report_dir or its permissions" in result["report_error"]
    assert result["warnings"] == [result["report_error"]]
    assert result["json_path"] is None and result["markdown_path"] is None and result["hosts"] == []
    assert blocker.read_text() == "" and not connection.exec_command.called


def test_on_error_warn_for_a_file_that_is_not_a_report(tmp_path):
    (tmp_path / "R1-redeploy.json").write_text('{"host": "a"}')
    plugin, dummy = action({"path": str(tmp_path / "R1-redeploy"), "rows": ROWS, "on_error": "warn"})
    result = plugin.run(task_vars={})
    assert result["failed"] is False and "is not a JSON list of hosts" in result["report_error"]
    assert (tmp_path / "R1-redeploy.json").read_text() == '{"host": "a"}' and not (tmp_path / "R1-redeploy.md").exists()


def test_on_error_warn_when_the_write_works_is_the_plain_result(tmp_path):
    plugin, dummy = action({"path": str(tmp_path / "R1-redeploy"), "title": "R1", "rows": ROWS, "on_error": "warn"})
    result = plugin.run(task_vars={})
    assert "report_error" not in result and result["hosts"] == ["gpu-01", "gpu-02"]
    assert (tmp_path / "R1-redeploy.md").read_text() == (DATA / "report_two_hosts.md").read_text()


def test_on_error_fail_is_the_default_and_other_values_are_refused(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    plugin, dummy = action({"path": str(blocker / "R1-redeploy"), "rows": ROWS, "on_error": "fail"})
    with pytest.raises(AnsibleActionFail) as info:
        plugin.run(task_vars={})
    assert "sglang_report_dir" in str(info.value)
    plugin, dummy = action({"path": str(tmp_path / "R1-redeploy"), "rows": ROWS, "on_error": "ignore"})
    with pytest.raises(AnsibleActionFail) as info:
        plugin.run(task_vars={})
    assert "on_error" in str(info.value) and not (tmp_path / "R1-redeploy.json").exists()
