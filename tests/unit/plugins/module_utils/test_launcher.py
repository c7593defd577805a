"""module_utils/server/launcher.py: the launch engine shared by sglang_launch, sglang_replace and sglang_preflight.

- ``plan()``: secrets out of argv into the 0600 ``--config`` file, secret env values into ``server.env`` for
  systemd, and the blockers (an API key on argv before 0.5.10, a python that is not there, a newline in a
  secret, conflicting options), all reported together before anything is touched;
- ``current()``: a recorded server, an unrecorded one, a PID file naming something else, and a server that
  systemd started at boot, recognised by the identity comment of the unit file;
- ``write_files()``: every file and its mode, the unit only rewritten when it changed, the identity salt;
- ``load_record()`` / ``launch_params_from_record()``: the rollback relaunch of a stored record, including
  records written before ``secrets.json`` existed (the API key from ``config.yaml``), and the round trip
  (a relaunch of the promoted record has the promoted identity).

Processes: the "servers" of ``current()`` are small Python sleepers started here (argv mentions
``sglang.launch_server``), SIGKILLed by PID at teardown. ``systemctl`` is a fake ``run_command``.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils.server import launcher as engine
from ansible_collections.gpufleet.sglang.plugins.module_utils.server import address
from ansible_collections.gpufleet.sglang.plugins.module_utils.server import health_gate
from ansible_collections.gpufleet.sglang.plugins.module_utils.server import launch_params
from ansible_collections.gpufleet.sglang.plugins.module_utils.server import server_logs
from ansible_collections.gpufleet.sglang.plugins.module_utils.server import stored_launch
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import identity
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import supervise as sp
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import compare
from ansible_collections.gpufleet.sglang.plugins.module_utils.server import unit as unit_mod

KEY = "sk-launcher-3b9f0e"
ADMIN = "adm-launcher-77c1"
TOKEN = "hf_launcher_5e2d"


class Ctx(object):
    """The few AnsibleModule methods the launcher calls."""

    def __init__(self, responder=None):
        self.no_log_values = set()
        self.warnings = []
        self.commands = []
        self.responder = responder or (lambda argv: (0, "", ""))

    def warn(self, msg):
        self.warnings.append(msg)

    def run_command(self, argv, environ_update=None):
        self.commands.append(list(argv))
        return self.responder(list(argv))

    def get_bin_path(self, name, required=False, opt_dirs=None):
        if name in ("systemctl", "journalctl"):
            return "/fake/bin/" + name
        for directory in list(opt_dirs or []) + os.environ.get("PATH", "").split(os.pathsep):
            path = os.path.join(directory, name)
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
        return None


def mode(path):
    return oct(os.stat(str(path)).st_mode & 0o7777)


def params(tmp_path, **extra):
    out = {"name": "unit", "version": "0.5.23", "manager": "process", "python": sys.executable,
           "args": {"model_path": "/models/m", "port": 31000}, "config_dir": str(tmp_path / "etc"),
           "state_dir": str(tmp_path / "state"), "log_file": str(tmp_path / "log" / "server.log")}
    out.update(extra)
    return out


def planned(tmp_path, ctx=None, **extra):
    launcher = engine.Launcher(ctx or Ctx(), params(tmp_path, **extra))
    return launcher, launcher.plan()


# ---------------------------------------------------------------------------
# plan(): secrets
# ---------------------------------------------------------------------------

def test_secrets_leave_argv_for_the_0600_config_file(tmp_path):
    ctx = Ctx()
    args = {"model_path": "/models/m", "admin_api_key": ADMIN, "port": 31000}
    launcher, blockers = planned(tmp_path, ctx, api_key=KEY, args=args)
    assert blockers == []
    config = str(tmp_path / "etc" / "candidate" / "config.yaml")
    assert launcher.config_path == config and launcher.argv[:3] == [sys.executable, "-m", "sglang.launch_server"]
    assert launcher.argv[-2:] == ["--config", config]
    assert KEY not in " ".join(launcher.argv) and ADMIN not in " ".join(launcher.argv)
    assert launcher.masked(launcher.argv) == launcher.argv
    assert launcher.secret_args == {"api_key": KEY, "admin_api_key": ADMIN} and "admin_api_key" not in launcher.args
    assert {KEY, ADMIN} <= ctx.no_log_values and launcher.api_key == KEY
    assert launcher.url == "http://127.0.0.1:31000"

    launcher.write_files()
    assert mode(config) == oct(0o600)
    written = dict((compare.norm_key(k), v) for k, v in compare.read_config_yaml(config).items())
    assert written == {"api_key": KEY, "admin_api_key": ADMIN}
    cand = tmp_path / "etc" / "candidate"
    assert json.loads((cand / "secrets.json").read_text()) == {"args": {"admin_api_key": ADMIN, "api_key": KEY}, "env": {}}
    assert mode(cand / "secrets.json") == oct(0o600) and mode(cand / "server.json") == oct(0o640)
    record_text = (cand / "server.json").read_text()
    assert KEY not in record_text and ADMIN not in record_text
    record = json.loads(record_text)
    assert record["args"] == {"model_path": "/models/m", "port": 31000} and record["fingerprint"] == launcher.fp


def test_the_api_key_may_come_through_args_once(tmp_path):
    launcher, blockers = planned(tmp_path, args={"model_path": "/m", "api-key": KEY})
    assert blockers == [] and launcher.api_key == KEY and launcher.argv[-2] == "--config"
    launcher, blockers = planned(tmp_path, api_key=KEY, args={"model_path": "/m", "api_key": KEY})
    assert blockers == []
    launcher, blockers = planned(tmp_path, api_key=KEY, args={"model_path": "/m", "api_key": "other"})
    assert blockers == ["api_key is given both as the api_key option and in args with different values; give it once"]


def test_secret_env_goes_to_server_env_for_systemd_and_never_into_the_unit(tmp_path):
    units = tmp_path / "units"
    units.mkdir()
    env = {"HF_TOKEN": TOKEN, "CUDA_VISIBLE_DEVICES": "0,1", "A": "1"}
    launcher, blockers = planned(tmp_path, manager="systemd", unit_dir=str(units), env=env, api_key=KEY)
    assert blockers == []
    assert launcher.secret_env == {"HF_TOKEN": TOKEN} and launcher.env == {"CUDA_VISIBLE_DEVICES": "0,1", "A": "1"}
    assert launcher.unit_path == str(units / "sglang-unit.service")
    assert launcher.write_files() is True
    env_file = tmp_path / "etc" / "candidate" / "server.env"
    assert env_file.read_text() == 'HF_TOKEN="%s"\n' % TOKEN and mode(env_file) == oct(0o600)
    unit_text = (units / "sglang-unit.service").read_text()
    assert mode(units / "sglang-unit.service") == oct(0o644)
    assert TOKEN not in unit_text and KEY not in unit_text
    assert "EnvironmentFile=%s" % env_file in unit_text.splitlines()
    assert unit_mod.identity_of(unit_text) == launcher.fp
    record = json.loads((tmp_path / "etc" / "candidate" / "server.json").read_text())
    assert TOKEN not in json.dumps(record) and record["env"] == {"CUDA_VISIBLE_DEVICES": "0,1", "A": "1"}
    assert record["cuda_visible_devices"] == "0,1" and record["unit"] == "sglang-unit.service"
    # Unchanged unit: not rewritten; another config: rewritten.
    again, dummy = planned(tmp_path, manager="systemd", unit_dir=str(units), env=env, api_key=KEY)
    assert again.write_files() is False
    other, dummy = planned(tmp_path, manager="systemd", unit_dir=str(units), env=env, api_key=KEY,
                           args={"model_path": "/models/m", "port": 31000, "tp_size": 2})
    assert other.write_files() is True and "--tp-size" in (units / "sglang-unit.service").read_text()


def test_secret_env_of_a_process_server_goes_to_the_process_only(tmp_path):
    launcher, blockers = planned(tmp_path, env={"HF_TOKEN": TOKEN})
    assert blockers == [] and launcher.secret_env == {"HF_TOKEN": TOKEN}
    launcher.write_files()
    cand = tmp_path / "etc" / "candidate"
    assert not (cand / "server.env").exists() and not (cand / "config.yaml").exists()      # no secret arg: no --config
    assert "--config" not in launcher.argv
    assert json.loads((cand / "secrets.json").read_text()) == {"args": {}, "env": {"HF_TOKEN": TOKEN}}
    assert TOKEN not in (cand / "server.json").read_text()


# ---------------------------------------------------------------------------
# plan(): blockers
# ---------------------------------------------------------------------------

def test_api_key_on_argv_before_0_5_10_is_refused_unless_allowed(tmp_path):
    ctx = Ctx()
    launcher, blockers = planned(tmp_path, ctx, version="0.5.1", api_key=KEY)
    assert len(blockers) == 1
    assert blockers[0].startswith("SGLang 0.5.1 has no --config option (added in 0.5.10), so api_key would have to go on the "
                                  "command line where ps shows it")
    assert "allow_api_key_in_argv=true" in blockers[0] and KEY not in blockers[0] and ctx.warnings == []
    launcher, blockers = planned(tmp_path, ctx, version="0.5.1", api_key=KEY, allow_api_key_in_argv=True)
    assert blockers == [] and launcher.argv[-2:] == ["--api-key", KEY] and "--config" not in launcher.argv
    assert launcher.masked(launcher.argv)[-2:] == ["--api-key", "********"]
    assert len(ctx.warnings) == 1 and "readable by every local user through ps" in ctx.warnings[0]
    # Without a secret the old version needs no --config.
    launcher, blockers = planned(tmp_path, version="0.4.6.post5")
    assert blockers == [] and "--config" not in launcher.argv


@pytest.mark.parametrize("python, text", [
    ("no-such-python-h7", "python: no-such-python-h7 not found in PATH"),
    ("/nonexistent/bin/python3", "python: /nonexistent/bin/python3 is not an executable file"),
])
def test_a_python_that_is_not_there(tmp_path, python, text):
    launcher, blockers = planned(tmp_path, python=python)
    assert blockers == [text]


def test_python_is_found_in_the_servers_own_path(tmp_path):
    bindir = tmp_path / "venv" / "bin"
    bindir.mkdir(parents=True)
    (bindir / "sglang-python").write_text("#!/bin/sh\n")
    (bindir / "sglang-python").chmod(0o755)
    launcher, blockers = planned(tmp_path, python="sglang-python", env={"PATH": str(bindir)})
    assert blockers == [] and launcher.argv[0] == str(bindir / "sglang-python")


@pytest.mark.parametrize("where", ["api_key", "env", "args"])
@pytest.mark.parametrize("bad", ["line\nbreak", "cr\rhere", "nul\0byte"])
def test_a_newline_in_a_secret_is_refused_naming_the_variables(tmp_path, where, bad):
    extra = {"api_key": bad} if where == "api_key" else {"env": {"HF_TOKEN": bad}} if where == "env" else \
        {"args": {"model_path": "/m", "admin_api_key": bad}}
    launcher, blockers = planned(tmp_path, **extra)
    assert ("a secret value (API key or secret env variable) contains a newline or NUL byte, which no HTTP header and no "
            "config file can carry; fix api_key / env") in blockers
    assert not any(bad in b for b in blockers)


def test_every_blocker_is_reported_together(tmp_path):
    launcher, blockers = planned(tmp_path, port=1, host="10.0.0.1", version="0.3.0", python="/nonexistent/python",
                                 chdir=str(tmp_path / "nowhere"),
                                 args={"model_path": "/m", "port": 2, "host": "0.0.0.0", "bogus_flag_h7": 1})
    text = "\n".join(blockers)
    for part in ("version: ", "port=1 conflicts with args.port=2; give one of them",
                 "host=10.0.0.1 conflicts with args.host=0.0.0.0; give one of them", "args: ",
                 "python: /nonexistent/python is not an executable file", "chdir: %s is not a directory" % (tmp_path / "nowhere")):
        assert part in text, part
    launcher, blockers = planned(tmp_path, args={"model_path": "/m", "port": "http"})
    assert "args.port must be an integer from 1 to 65535, got 'http'" in blockers


def test_hosts_urls_and_argv_helpers():
    assert address.base_url("0.0.0.0", 30000) == "http://127.0.0.1:30000"
    assert address.base_url("::", 1) == "http://[::1]:1" and address.base_url("[::]", 2) == "http://[::1]:2"
    assert address.base_url("10.1.2.3", 5) == "http://10.1.2.3:5" and address.base_url("", 6) == "http://127.0.0.1:6"
    assert address.probe_host("[::1]") == "::1"
    assert launch_params.norm_key("--speculative-num-steps") == "speculative_num_steps"
    long_line = "x" * 500
    assert server_logs.short_lines(["a", long_line]) == "a\n" + "x" * 400 + " [... 100 more characters]"
    assert health_gate.num_text(1800.0) == "1800" and health_gate.num_text(0.05) == "0.05"


def test_port_in_use():
    import socket
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    port = sock.getsockname()[1]
    try:
        assert address.port_in_use("127.0.0.1", port) and address.port_in_use("0.0.0.0", port)
    finally:
        sock.close()
    assert not address.port_in_use("127.0.0.1", port)
    assert not address.port_in_use("no-such-host.invalid", port)


# ---------------------------------------------------------------------------
# current()
# ---------------------------------------------------------------------------

@pytest.fixture
def sleepers():
    """Start small processes that look like SGLang servers; SIGKILL them by PID at the end."""
    started = []

    def start(*argv):
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"] + list(argv),
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        started.append(proc)
        # Until the child has exec'd, /proc/<pid>/cmdline is still pytest's (fork, then exec): under load the
        # launcher would read a process that is "not a server" yet. Wait for the exec.
        want = "\0".join(["import time; time.sleep(300)"] + list(argv)).encode()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with open("/proc/%d/cmdline" % proc.pid, "rb") as fh:
                    if want in fh.read():
                        break
            except OSError:
                pass
            time.sleep(0.005)
        return proc.pid

    yield start
    for proc in started:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def record_state(launcher, pid, fingerprint=None, start=None):
    sp.ensure_dir(os.path.dirname(launcher.pid_file))
    with open(launcher.pid_file, "w") as fh:
        fh.write("%d\n" % pid)
    sp.write_state(launcher.state_file, {"pid": pid, "starttime": sp.starttime(pid) if start is None else start,
                                         "fingerprint": fingerprint})


def test_current_of_nothing_and_of_a_recorded_server(tmp_path, sleepers):
    launcher, dummy = planned(tmp_path)
    assert launcher.current() == {"pid": None, "start": None, "record": None, "fingerprint": None, "source": None, "argv": None}
    pid = sleepers("-m", "sglang.launch_server", "--api-key", KEY)
    launcher.secret(KEY)
    record_state(launcher, pid, "sha256:recorded")
    cur = launcher.current()
    assert cur["pid"] == pid and cur["start"] == sp.starttime(pid) and cur["source"] == "pid_file"
    assert cur["fingerprint"] == "sha256:recorded" and cur["record"]["pid"] == pid
    assert cur["argv"][-2:] == ["--api-key", "********"] and KEY not in json.dumps(cur)


def test_current_of_an_unrecorded_server_and_of_a_reused_pid(tmp_path, sleepers):
    launcher, dummy = planned(tmp_path)
    pid = sleepers("-m", "sglang.launch_server")
    record_state(launcher, pid, "sha256:other", start=sp.starttime(pid) + 1)      # the record is of an older process
    cur = launcher.current()
    assert cur["pid"] == pid and cur["source"] == "pid_file (no launch record)" and cur["fingerprint"] is None
    other = sleepers("not-a-server")
    record_state(launcher, other, "sha256:x", start=sp.starttime(other) + 1)
    assert launcher.current()["pid"] is None                             # the PID now names something else
    gone = subprocess.Popen([sys.executable, "-c", "pass", "sglang"])
    gone.wait()
    record_state(launcher, gone.pid, "sha256:x", start=1)
    assert launcher.current()["pid"] is None


def systemd_show(pid, active="active", reload="no"):
    def responder(argv):
        if argv[1] == "show":
            return 0, "LoadState=loaded\nActiveState=%s\nMainPID=%d\nNeedDaemonReload=%s\n" % (active, pid, reload), ""
        return 0, "", ""
    return responder


def test_current_of_a_server_systemd_started_at_boot_reads_the_unit_identity(tmp_path, sleepers, monkeypatch):
    monkeypatch.setattr(engine.systemd, "running", lambda root="/run/systemd/system": True)
    units = tmp_path / "units"
    units.mkdir()
    pid = sleepers("-m", "sglang.launch_server")
    ctx = Ctx(systemd_show(pid))
    launcher, blockers = planned(tmp_path, ctx, manager="systemd", unit_dir=str(units))
    assert blockers == []
    (units / "sglang-unit.service").write_text(launcher.unit_text)
    cur = launcher.current()
    assert cur["pid"] == pid and cur["source"] == "unit (started by systemd)" and cur["fingerprint"] == launcher.fp
    assert ["/fake/bin/systemctl", "show", "--property=" + ",".join(engine.systemd.UNIT_PROPERTIES), "--",
            "sglang-unit.service"] in ctx.commands
    # A record of this very process wins over the unit file.
    record_state(launcher, pid, "sha256:recorded")
    cur = launcher.current()
    assert cur["source"] == "unit" and cur["fingerprint"] == "sha256:recorded"
    os.unlink(launcher.state_file)
    # A unit file changed on disk but not reloaded: it does not say what runs.
    launcher.ctx = Ctx(systemd_show(pid, reload="yes"))
    cur = launcher.current()
    assert cur["pid"] == pid and cur["source"] == "unit" and cur["fingerprint"] is None
    # Inactive unit: nothing runs.
    launcher.ctx = Ctx(systemd_show(pid, active="inactive"))
    assert launcher.current()["pid"] is None


def test_current_of_a_systemd_server_without_a_unit_file_of_ours(tmp_path, sleepers, monkeypatch):
    monkeypatch.setattr(engine.systemd, "running", lambda root="/run/systemd/system": True)
    pid = sleepers("-m", "sglang.launch_server")
    launcher, dummy = planned(tmp_path, Ctx(systemd_show(pid)), manager="systemd")        # no unit_dir
    cur = launcher.current()
    assert cur["pid"] == pid and cur["fingerprint"] is None and cur["source"] == "unit"
    failing = engine.Launcher(Ctx(lambda argv: (1, "", "Failed to connect to bus")), params(tmp_path, manager="systemd"))
    failing.plan()
    with pytest.raises(engine.LaunchError) as info:
        failing.current()
    assert "systemctl show sglang-unit.service failed (rc=1): Failed to connect to bus" in info.value.msg


# ---------------------------------------------------------------------------
# write_files() and the identity
# ---------------------------------------------------------------------------

def test_write_files_makes_private_directories_and_a_stable_identity(tmp_path):
    launcher, dummy = planned(tmp_path, api_key=KEY, record_extra={"adjustments": [{"arg": "x"}]})
    unsalted = launcher.fp
    launcher.write_files()
    for directory in (tmp_path / "state", tmp_path / "log", tmp_path / "etc" / "candidate"):
        assert mode(directory) == oct(0o700), directory
    salt = tmp_path / "state" / identity.SALT_NAME
    assert mode(salt) == oct(0o600) and len(salt.read_text().strip()) == 64
    assert launcher.fp != unsalted                                        # fingerprinted with the node's salt now
    record = json.loads((tmp_path / "etc" / "candidate" / "server.json").read_text())
    assert record["fingerprint"] == launcher.fp and record["adjustments"] == [{"arg": "x"}]
    assert launcher.result["record_file"] == str(tmp_path / "etc" / "candidate" / "server.json")
    # The next run plans the same config to the same identity (the salt exists now), another key to another one.
    again, dummy = planned(tmp_path, api_key=KEY)
    assert again.fp == launcher.fp
    other, dummy = planned(tmp_path, api_key=KEY + "-rotated")
    assert other.fp != launcher.fp and KEY not in json.dumps(other.identity)


def test_write_files_without_config_dir_keeps_the_files_in_the_state_dir(tmp_path):
    launcher = engine.Launcher(Ctx(), {"name": "u", "python": sys.executable, "args": {"model_path": "/m"},
                                       "state_dir": str(tmp_path / "s"), "api_key": KEY})
    assert launcher.plan() == []
    assert launcher.record_file is None and launcher.config_path == str(tmp_path / "s" / "config.yaml")
    launcher.write_files()
    assert sorted(os.listdir(str(tmp_path / "s"))) == [".identity-salt", "config.yaml"]
    assert mode(tmp_path / "s" / "config.yaml") == oct(0o600)


# ---------------------------------------------------------------------------
# load_record() and launch_params_from_record()
# ---------------------------------------------------------------------------

def test_load_record_of_nothing_of_a_record_and_of_broken_files(tmp_path):
    assert stored_launch.load_record(str(tmp_path / "known-good")) == (None, None)
    kg = tmp_path / "known-good"
    kg.mkdir()
    (kg / "server.json").write_text(json.dumps({"name": "kg", "args": {"model_path": "/m"}}))
    (kg / "secrets.json").write_text(json.dumps({"args": {"api_key": KEY}, "env": {"HF_TOKEN": TOKEN}}))
    record, stored = stored_launch.load_record(str(kg))
    assert record == {"name": "kg", "args": {"model_path": "/m"}}
    assert stored == {"args": {"api_key": KEY}, "env": {"HF_TOKEN": TOKEN}}
    (kg / "secrets.json").write_text(json.dumps({"args": None}))
    assert stored_launch.load_record(str(kg))[1] == {"args": {}, "env": {}}
    (kg / "server.json").write_text("{not json")
    with pytest.raises(engine.LaunchError) as info:
        stored_launch.load_record(str(kg))
    assert info.value.msg.startswith("%s cannot be read: " % (kg / "server.json"))
    (kg / "server.json").write_text("[1, 2]")
    with pytest.raises(engine.LaunchError) as info:
        stored_launch.load_record(str(kg))
    assert info.value.msg == "%s does not hold a JSON object" % (kg / "server.json")


def test_load_record_written_before_secrets_json_existed_takes_the_key_from_config_yaml(tmp_path):
    kg = tmp_path / "known-good"
    kg.mkdir()
    (kg / "server.json").write_text(json.dumps({"name": "kg", "args": {"model_path": "/m", "api_key": "********"}}))
    (kg / "config.yaml").write_text('api-key: "%s"\nadmin-api-key: "%s"\n' % (KEY, ADMIN))
    record, stored = stored_launch.load_record(str(kg))
    assert stored == {"args": {"api_key": KEY, "admin_api_key": ADMIN}, "env": {}}
    params_ = stored_launch.launch_params_from_record(record, stored, {"state_dir": str(tmp_path / "state")})
    assert params_["args"] == {"model_path": "/m", "api_key": KEY, "admin_api_key": ADMIN}
    # Neither secrets.json nor config.yaml: no secrets at all.
    os.unlink(str(kg / "config.yaml"))
    assert stored_launch.load_record(str(kg))[1] == {"args": {}, "env": {}}


def test_launch_params_from_record_over_the_runs_base():
    record = {"name": "kg", "version": "0.5.10", "manager": "process", "python": "/opt/sglang/bin/python",
              "args": {"model_path": "/m", "tp_size": 2}, "env": {"A": "1"}, "cuda_visible_devices": "2,3",
              "chdir": "/srv", "effective": {"tp_size": 2}, "adjustments": [{"arg": "tp_size"}]}
    stored = {"args": {"api_key": KEY}, "env": {"HF_TOKEN": TOKEN}}
    base = {"name": "main", "version": "0.5.23", "manager": "systemd", "python": "python3", "state_dir": "/s",
            "config_dir": "/c", "health_timeout": 99, "api_key": "candidate-key", "expect": {"x": 1}, "args": {"x": 1},
            "env": {"B": "2"}}
    out = stored_launch.launch_params_from_record(record, stored, base)
    assert out["name"] == "kg" and out["version"] == "0.5.10" and out["manager"] == "process"
    assert out["python"] == "/opt/sglang/bin/python" and out["chdir"] == "/srv"
    assert out["args"] == {"model_path": "/m", "tp_size": 2, "api_key": KEY}
    assert out["env"] == {"A": "1", "HF_TOKEN": TOKEN, "CUDA_VISIBLE_DEVICES": "2,3"}
    assert out["api_key"] is None and out["expect"] == {"tp_size": 2} and out["adjustments"] == [{"arg": "tp_size"}]
    assert out["state_dir"] == "/s" and out["config_dir"] == "/c" and out["health_timeout"] == 99
    assert base["api_key"] == "candidate-key" and record["args"] == {"model_path": "/m", "tp_size": 2}    # inputs untouched
    # The record's own CUDA_VISIBLE_DEVICES wins; a record without one, and without effective, takes the base's names.
    out = stored_launch.launch_params_from_record(dict(record, env={"CUDA_VISIBLE_DEVICES": "7"}, effective=None, name=None),
                                                  {"args": {}, "env": {}}, base)
    assert out["env"] == {"CUDA_VISIBLE_DEVICES": "7"} and out["expect"] is None and out["name"] == "main"


def test_a_relaunch_of_the_promoted_record_has_the_promoted_identity(tmp_path):
    env = {"HF_TOKEN": TOKEN, "CUDA_VISIBLE_DEVICES": "0", "A": "1"}
    args = {"model_path": "/models/m", "port": 31000, "admin_api_key": ADMIN, "tp_size": 1}
    first, blockers = planned(tmp_path, api_key=KEY, env=env, args=args)
    assert blockers == []
    first.write_files()
    shutil.copytree(str(tmp_path / "etc" / "candidate"), str(tmp_path / "etc" / "known-good"))
    record, stored = stored_launch.load_record(stored_launch.known_good_dir(str(tmp_path / "etc")))
    base = params(tmp_path, args={"model_path": "/models/other"}, api_key="candidate-key", env={"X": "candidate"})
    again = engine.Launcher(Ctx(), stored_launch.launch_params_from_record(record, stored, base))
    assert again.plan() == []
    assert again.fp == first.fp and again.argv == first.argv and again.secret_args == first.secret_args
    assert again.secret_env == {"HF_TOKEN": TOKEN} and again.api_key == KEY


# ---------------------------------------------------------------------------
# Bugs found by these tests (they fail until the fix in plugins/module_utils/server/launcher.py)
# ---------------------------------------------------------------------------

def test_bug_the_record_keeps_the_names_of_the_secret_args_and_env(tmp_path):
    """Launcher.launch_record writes ``secret_args`` and ``env_secrets`` (the names, never the values), then redacts
    the whole record, which masks every value under a secret-named key: both lists come out as "********"."""
    launcher, dummy = planned(tmp_path, api_key=KEY, env={"HF_TOKEN": TOKEN})
    launcher.write_files()
    record = json.loads((tmp_path / "etc" / "candidate" / "server.json").read_text())
    assert record["secret_args"] == ["api_key"] and record["env_secrets"] == ["HF_TOKEN"]
