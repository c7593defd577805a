"""Tests for the gpufleet.sglang.controller_facts action plugin (plugins/action/controller_facts.py): the run id,
the identity of the controller (the parent of the worker process the action runs in), the report directory
check (made later, probed now, nothing left behind, the variable named when it cannot be used), and
``ActionModule.run`` itself (no module executed, the ``sglang_redeploy_run`` fact)."""
from __future__ import annotations

import calendar
import getpass
import os
import re
import socket
import time
from unittest.mock import MagicMock

import pytest

from ansible.errors import AnsibleActionFail

from ansible_collections.gpufleet.sglang.plugins.action import controller_facts as cf
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import lease as lease_mod

RUN_ID_RE = re.compile(r"^(\d{8}T\d{6}Z)-(\d+)-(\d{4})$")


# ---------------------------------------------------------------------------
# Run id
# ---------------------------------------------------------------------------

def test_run_id_is_utc_time_controller_pid_and_four_random_digits():
    now = calendar.timegm((2026, 12, 1, 10, 15, 0)) + 0.75
    run_id = cf.new_run_id(now=now, pid=4242)
    match = RUN_ID_RE.match(run_id)
    assert match, run_id
    assert match.group(1) == "20261201T101500Z" and match.group(2) == "4242" and 0 <= int(match.group(3)) <= 9999


def test_run_id_defaults_to_now_and_the_parent_pid():
    before = time.time()
    match = RUN_ID_RE.match(cf.new_run_id())
    assert match and int(match.group(2)) == os.getppid()
    stamp = calendar.timegm(time.strptime(match.group(1), "%Y%m%dT%H%M%SZ"))
    assert int(before) - 1 <= stamp <= time.time() + 1


def test_run_ids_of_one_second_differ_by_the_random_part():
    ids = set(cf.new_run_id(now=1800000000.0, pid=7) for dummy in range(50))
    assert len(ids) > 1 and all(RUN_ID_RE.match(i).group(1) == "20270115T080000Z" for i in ids)


# ---------------------------------------------------------------------------
# Controller identity
# ---------------------------------------------------------------------------

def test_identity_is_the_parent_process_of_the_worker():
    ident = cf.controller_identity()
    parent = os.getppid()
    assert ident["pid"] == parent
    assert ident["starttime"] == lease_mod.process_start(parent) and ident["starttime"] is not None
    assert ident["boot_id"] == lease_mod.boot_id() and ident["boot_id"]
    assert ident["pidns"] == lease_mod.pid_namespace() and ident["pidns"].startswith("pid:[")
    assert ident["host"] == socket.gethostname() and ident["user"] == getpass.getuser()
    # A lease recorded with this identity is judged from the node alone: this controller is alive ...
    holder = lease_mod.new_record("R1", controller=ident, ttl=60)
    assert lease_mod.judge(holder, "R2")[0] == lease_mod.LIVE


def test_identity_of_a_gone_controller_proves_it_dead():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    ident = cf.controller_identity(pid)
    assert ident["pid"] == pid and ident["starttime"] is None           # gone: no start time
    holder = lease_mod.new_record("R1", controller=dict(ident, starttime=12345), ttl=600)
    assert lease_mod.judge(holder, "R2")[0] == lease_mod.DEAD


def test_identity_without_a_user_name_gives_the_uid(monkeypatch):
    def nameless():
        raise KeyError("uid has no name")

    monkeypatch.setattr(cf.getpass, "getuser", nameless)
    assert cf.controller_identity()["user"] == str(os.getuid())


# ---------------------------------------------------------------------------
# The report directory
# ---------------------------------------------------------------------------

def test_report_dir_that_exists_or_can_be_made_is_fine_and_left_as_it_was(tmp_path):
    assert cf.report_dir_problem(str(tmp_path)) is None
    assert cf.report_dir_problem(str(tmp_path / "reports" / "2026")) is None
    assert os.listdir(str(tmp_path)) == []                               # not made, no probe file left


def test_report_dir_under_a_regular_file(tmp_path):
    blocker = tmp_path / "reports"
    blocker.write_text("not a directory")
    assert cf.report_dir_problem(str(blocker / "deep" / "er")) == "%s exists and is not a directory" % blocker
    assert cf.report_dir_problem(str(blocker)) == "%s exists and is not a directory" % blocker
    assert blocker.read_text() == "not a directory" and os.listdir(str(tmp_path)) == ["reports"]


def test_report_dir_where_no_file_can_be_created():
    why = cf.report_dir_problem("/proc/gpufleet-h7-not-there/reports")
    assert why and why.startswith("cannot create a file in /proc: ")


# ---------------------------------------------------------------------------
# ActionModule.run
# ---------------------------------------------------------------------------

def action(args, check_mode=False):
    task = MagicMock()
    task.args = args
    task.async_val = 0
    task.check_mode = check_mode
    connection = MagicMock()
    connection._shell.tmpdir = None
    plugin = cf.ActionModule(task, connection, MagicMock(), loader=None, templar=None, shared_loader_obj=None)
    plugin._execute_module = MagicMock(side_effect=AssertionError("no module may run"))
    # Set by the plugin loader; ansible-core 2.17/2.18 name it in the unsupported-parameter message.
    plugin._load_name = "gpufleet.sglang.controller_facts"
    return plugin, connection


def test_action_returns_the_run_and_sets_the_fact(tmp_path):
    plugin, connection = action({"report_dir": str(tmp_path / "reports")}, check_mode=True)
    result = plugin.run(task_vars={})
    assert result["changed"] is False and not result.get("failed")
    assert RUN_ID_RE.match(result["run_id"]) and int(RUN_ID_RE.match(result["run_id"]).group(2)) == os.getppid()
    assert result["controller"] == cf.controller_identity()
    assert result["report_dir"] == str(tmp_path / "reports") and not (tmp_path / "reports").exists()
    assert result["ansible_facts"] == {"sglang_redeploy_run": {"run_id": result["run_id"], "controller": result["controller"],
                                                               "report_dir": str(tmp_path / "reports")}}
    assert not connection.exec_command.called and not connection.put_file.called


def test_action_keeps_a_given_run_id_and_expands_the_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    plugin, dummy = action({"run_id": "20261201T101500Z-1-0001", "report_dir": "~/reports"})
    result = plugin.run(task_vars={})
    assert result["run_id"] == "20261201T101500Z-1-0001" and result["report_dir"] == str(tmp_path / "reports")
    plugin, dummy = action({})
    result = plugin.run(task_vars={})
    assert "report_dir" not in result and "report_dir" not in result["ansible_facts"]["sglang_redeploy_run"]


def test_action_fails_naming_sglang_report_dir_for_a_path_under_a_regular_file(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    plugin, dummy = action({"report_dir": str(blocker / "reports")})
    result = plugin.run(task_vars={})
    assert result["failed"] is True and "ansible_facts" not in result
    assert result["msg"] == ("sglang_report_dir: the report directory %s is not usable: %s exists and is not a directory; fix it "
                             "or choose another one (nothing was touched)" % (blocker / "reports", blocker))


def test_action_argument_errors():
    plugin, dummy = action({"report_dir": "/tmp", "bogus": 1})
    with pytest.raises(AnsibleActionFail) as info:
        plugin.run(task_vars={})
    assert "Unsupported parameters" in str(info.value) and "bogus" in str(info.value)
