"""module_utils/node/systemd.py with a fake ``run`` that records each argv."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils.node import systemd

SYSTEMCTL = "/usr/bin/systemctl"
UNIT = "sglang-llama.service"

# What `systemctl show --property=...` prints for a running unit (systemd 252).
SHOW_RUNNING = """\
LoadState=loaded
ActiveState=active
SubState=running
Result=success
MainPID=4242
ExecMainStatus=0
NeedDaemonReload=no
ControlGroup=/system.slice/sglang-llama.service
UnitFileState=enabled
FragmentPath=/etc/systemd/system/sglang-llama.service
"""


class FakeRun:
    def __init__(self, rc=0, out="", err=""):
        self.rc, self.out, self.err = rc, out, err
        self.calls = []

    def __call__(self, argv):
        assert isinstance(argv, list) and all(isinstance(a, str) for a in argv)
        self.calls.append(list(argv))
        return self.rc, self.out, self.err


def test_parse_properties():
    props = systemd.parse_properties(SHOW_RUNNING)
    assert props["MainPID"] == "4242" and props["ActiveState"] == "active"
    assert props["FragmentPath"] == "/etc/systemd/system/sglang-llama.service"
    assert len(props) == 10


def test_parse_properties_values_with_equals_blank_lines_and_junk():
    text = "\nExecStart={ path=/usr/bin/python ; argv[]=/usr/bin/python -m x --a=b }\nnot a property\n  Key = v  \n"
    props = systemd.parse_properties(text)
    assert props == {"ExecStart": "{ path=/usr/bin/python ; argv[]=/usr/bin/python -m x --a=b }", "Key": "v"}
    assert systemd.parse_properties("") == {} and systemd.parse_properties(None) == {}
    assert systemd.parse_properties("Empty=\n") == {"Empty": ""}


def test_show_argv_and_result():
    run = FakeRun(out=SHOW_RUNNING)
    props = systemd.show(run, SYSTEMCTL, UNIT)
    assert run.calls == [[SYSTEMCTL, "show", "--property=" + ",".join(systemd.UNIT_PROPERTIES), "--", UNIT]]
    assert props == systemd.parse_properties(SHOW_RUNNING)


def test_show_custom_properties_and_dash_unit():
    run = FakeRun(out="MainPID=0\n")
    systemd.show(run, SYSTEMCTL, "-weird.service", properties=("MainPID",))
    # "--" keeps a unit name that starts with "-" from being read as an option.
    assert run.calls == [[SYSTEMCTL, "show", "--property=MainPID", "--", "-weird.service"]]


def test_show_failure_names_unit_rc_and_stderr():
    run = FakeRun(rc=1, out="ignored", err="Failed to connect to bus: No such file or directory\n")
    with pytest.raises(systemd.SystemdError) as info:
        systemd.show(run, SYSTEMCTL, UNIT)
    msg = str(info.value)
    assert UNIT in msg and "rc=1" in msg and "Failed to connect to bus" in msg and "ignored" not in msg


def test_show_failure_falls_back_to_stdout():
    run = FakeRun(rc=4, out="Unit x not found.\n", err="")
    with pytest.raises(systemd.SystemdError) as info:
        systemd.show(run, SYSTEMCTL, UNIT)
    assert "rc=4" in str(info.value) and "Unit x not found." in str(info.value)


@pytest.mark.parametrize("verb, func", [("start", systemd.start), ("stop", systemd.stop), ("enable", systemd.enable)])
def test_unit_verbs_argv(verb, func):
    run = FakeRun(out="done\n")
    assert func(run, SYSTEMCTL, UNIT) == "done\n"
    assert run.calls == [[SYSTEMCTL, verb, "--", UNIT]]


@pytest.mark.parametrize("verb, func", [("start", systemd.start), ("stop", systemd.stop), ("enable", systemd.enable)])
def test_unit_verbs_errors(verb, func):
    run = FakeRun(rc=5, err="Job for %s failed because the control process exited with error code.\n" % UNIT)
    with pytest.raises(systemd.SystemdError) as info:
        func(run, SYSTEMCTL, UNIT)
    msg = str(info.value)
    assert msg.startswith("systemctl %s %s failed (rc=5)" % (verb, UNIT))
    assert "control process exited" in msg
    assert not msg.endswith("\n")


def test_daemon_reload():
    run = FakeRun()
    assert systemd.daemon_reload(run, SYSTEMCTL) == ""
    assert run.calls == [[SYSTEMCTL, "daemon-reload"]]
    failing = FakeRun(rc=1, err="Access denied")
    with pytest.raises(systemd.SystemdError) as info:
        systemd.daemon_reload(failing, SYSTEMCTL)
    assert str(info.value) == "systemctl daemon-reload failed (rc=1): Access denied"


@pytest.mark.parametrize("props, expected", [
    ({"MainPID": "4242"}, 4242),
    ({"MainPID": "0"}, None),
    ({"MainPID": ""}, None),
    ({}, None),
    ({"MainPID": "n/a"}, None),
])
def test_main_pid(props, expected):
    assert systemd.main_pid(props) == expected


@pytest.mark.parametrize("state, active", [
    ("active", True), ("activating", True), ("reloading", True), ("deactivating", True),
    ("inactive", False), ("failed", False), ("maintenance", False), ("", False), (None, False),
])
def test_is_active(state, active):
    assert systemd.is_active({"ActiveState": state}) is active


def test_loaded_and_describe():
    props = systemd.parse_properties(SHOW_RUNNING)
    assert systemd.loaded(props) and not systemd.loaded({"LoadState": "not-found"})
    text = systemd.describe(props, UNIT)
    for part in (UNIT, "LoadState=loaded", "ActiveState=active", "SubState=running", "Result=success", "ExecMainStatus=0"):
        assert part in text


def test_running(tmp_path):
    assert systemd.running(str(tmp_path)) is True
    assert systemd.running(str(tmp_path / "missing")) is False
