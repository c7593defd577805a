"""sglang_launch through Ansible against the fake SGLang server and the GPU
simulator.

Every server a test causes is registered with ``servers`` (a
``launch_helpers.Procs``) and SIGKILLed at teardown by PID, together with the
members of its session (the server runs ``setsid``); nothing is matched by
name. Startup knobs keep each launch well under a second.
"""
from __future__ import annotations

import json
import os
import socket
import stat
import sys

import pytest

from gpusim.checkpoint import write_checkpoint

from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import render
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import resolve as sglang_resolve

from launch_helpers import (  # noqa: E402,F401  # pylint: disable=unused-import
    SIM_PY, cmdlines, fake_systemd, free_port, run_module_raw, servers, session_members, unit_pid, write_unit,
)

pytestmark = pytest.mark.slow

SECRET = "sk-launch-5e1f0c9a2b7d"
FAST = {
    "SGLANG_SIM_STARTUP_S": "0.3",
    "SGLANG_SIM_WARMUP_S": "0.05",
    "SGLANG_SIM_SHUTDOWN_S": "0.05",
    "SGLANG_SIM_DRAIN_POLL_S": "0.05",
}
INCIDENT = {
    "speculative_algorithm": "EAGLE",
    "speculative_eagle_topk": 1,
    "speculative_num_steps": 1,
    "speculative_num_draft_tokens": 16,
}
INCIDENT_MESSAGE = ("speculative_num_draft_tokens: intended 16, running 2 \u2014 SGLang sets it to num_steps + 1 when "
                    "speculative_eagle_topk == 1; set speculative_num_steps: 15")


@pytest.fixture
def models(tmp_path):
    base = tmp_path / "models"
    for name, arch in (("target", "Qwen3ForCausalLM"), ("draft", "LlamaForCausalLMEagle3")):
        (base / name).mkdir(parents=True)
        (base / name / "config.json").write_text(json.dumps({"architectures": [arch], "model_type": "qwen3"}))
        write_checkpoint(base / name, seed=name)          # weights and tokenizer: what the preflight checks
    return base


@pytest.fixture
def launch(sim_node, servers, models, tmp_path):
    """``launch(args=..., **params)`` runs sglang_launch with sensible test
    defaults and registers the server it reports for clean-up."""
    state = {"port": free_port(), "n": 0}

    def _launch(args=None, check=False, diff=False, sim_env=None, **params):
        full = {
            "name": "t",
            "args": dict({"model_path": str(models / "target"), "port": state["port"]}, **(args or {})),
            "state_dir": str(tmp_path / "state"),
            "python": sys.executable,
            "env": dict(FAST, PYTHONPATH=str(SIM_PY), GPUSIM_ROOT=sim_node.root, CUDA_VISIBLE_DEVICES="0,1",
                        **(sim_env or {})),
            "health_timeout": 60,
            "stop_timeout": 20,
        }
        if args is not None and "model_path" in args and args["model_path"] is None:
            full["args"].pop("model_path")
        full.update(params)
        run = run_module_raw(full, tmp_path, check=check, diff=diff, env=sim_node.env)
        result = run.result
        result["_stdout"] = run.stdout  # the --diff text is printed, not part of the result
        if result.get("pid"):
            servers.add(result["pid"])
        servers.add_pid_file(os.path.join(full["state_dir"], "server.pid"))
        return result

    _launch.port = lambda: state["port"]
    return _launch


def _alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _draft(models):
    return {"speculative_draft_model_path": str(models / "draft")}


# ---------------------------------------------------------------------------
# Launch, verify, idempotence
# ---------------------------------------------------------------------------

def test_clean_launch_is_verified_and_idempotent(launch, models, tmp_path):
    args = {"tp_size": 2, "mem_fraction_static": 0.8, "served_model_name": "qwen"}
    res = launch(args=args)
    assert not res["failed"], res.get("msg")
    assert res["changed"] is True and res["action"] == "start"
    pid = res["pid"]
    assert _alive(pid)
    assert res["url"] == "http://127.0.0.1:%d" % launch.port()
    assert 0 < res["startup_s"] < 20
    assert res["overrides"] == [] and res["unverified"] == []
    eff = res["effective"]
    assert eff["tp_size"] == 2 and eff["served_model_name"] == "qwen" and eff["mem_fraction_static"] == 0.8
    assert eff["model_path"] == str(models / "target")
    assert res["version"] == "0.5.23" and res["server_info_endpoint"] == "/server_info"
    assert res["argv"][:3] == [sys.executable, "-m", "sglang.launch_server"]
    assert res["config_file"] is None  # no secret, no --config
    record = json.loads((tmp_path / "state" / "server.state.json").read_text())
    assert record["pid"] == pid and record["port"] == launch.port()
    assert stat.S_IMODE(os.stat(tmp_path / "state" / "server.state.json").st_mode) == 0o600
    log = (tmp_path / "state" / "server.log").read_text()
    assert "=== gpufleet.sglang: starting t at " in log

    again = launch(args=args)
    assert not again["failed"], again.get("msg")
    assert again["changed"] is False and again["action"] == "none" and again["pid"] == pid
    assert "startup_s" not in again and again["overrides"] == []

    changed = launch(args=dict(args, mem_fraction_static=0.7), diff=True)
    assert not changed["failed"], changed.get("msg")
    assert "---" in changed["_stdout"] and "+argv: " in changed["_stdout"] and "-argv: " in changed["_stdout"]
    assert "--mem-fraction-static 0.7" in changed["_stdout"]
    assert changed["changed"] is True and changed["action"] == "restart"
    assert changed["pid"] != pid and not _alive(pid)
    assert changed["stop"]["signalled"] == [pid] and changed["stop"]["still_running"] == []
    assert changed["effective"]["mem_fraction_static"] == 0.7


def test_incident_config_fails_with_the_explanation(launch, models):
    res = launch(args=dict(INCIDENT, **_draft(models)))
    assert res["failed"]
    assert INCIDENT_MESSAGE in res["msg"], res["msg"]
    assert "left running (pid %d)" % res["pid"] in res["msg"]
    assert _alive(res["pid"])  # healthy: left running so the playbook can roll back
    assert res["overrides"] == [{"arg": "speculative_num_draft_tokens", "intended": 16, "running": 2,
                                 "explanation": INCIDENT_MESSAGE}]
    assert res["effective"]["speculative_num_draft_tokens"] == 2
    assert any(w["arg"] == "speculative_num_draft_tokens" and "adjusted to speculative_num_steps + 1" in w["line"]
               for w in res["log_warnings"])


def test_incident_resolved_with_honor_draft_tokens_runs_16_draft_tokens(launch, models):
    intended = dict({"model_path": str(models / "target")}, **INCIDENT, **_draft(models))
    resolved = sglang_resolve.resolve(intended, "0.5.23", arch="Qwen3ForCausalLM", policy="honor_draft_tokens")
    assert not resolved["errors"], resolved["errors"]
    assert resolved["args"]["speculative_num_steps"] == 15
    res = launch(args=resolved["args"])
    assert not res["failed"], res.get("msg")
    assert res["overrides"] == []
    assert res["effective"]["speculative_num_draft_tokens"] == 16
    assert res["effective"]["speculative_num_steps"] == 15
    assert not [w for w in res["log_warnings"] if w["arg"] == "speculative_num_draft_tokens"]


# ---------------------------------------------------------------------------
# Failures: crash, hang, port in use
# ---------------------------------------------------------------------------

def test_crash_during_load_fails_fast_with_the_log(launch, servers, tmp_path):
    res = launch(sim_env={"SGLANG_SIM_CRASH_ON_LOAD": "1"}, health_timeout=120, api_key=SECRET)
    assert res["failed"]
    # Fails at once, not after health_timeout (elapsed: the module's own time; _wall: with Ansible's start-up).
    assert res["elapsed"] < 20 and res["_wall"] < 60, (res["elapsed"], res["_wall"])
    # It exits (SIGQUIT path: the tree SIGKILLed) or, seen first, its log says "Scheduler hit an exception": a crash
    # that the gate fails at once, stopping what is left.
    assert "exited with code" in res["msg"] or "was killed by" in res["msg"] or "crashed" in res["msg"], res["msg"]
    assert "Last" in res["msg"] and res["log_tail"]
    assert 0 < len(res["log_tail"]) <= 40
    assert "pid" not in res
    assert SECRET not in json.dumps(res)
    dead = json.loads((tmp_path / "state" / "server.state.json").read_text())["pid"]
    assert not _alive(dead) and session_members(dead) == []  # no scheduler left holding GPU memory


def test_hang_times_out_and_stops_the_server(launch):
    res = launch(sim_env={"SGLANG_SIM_HANG": "load"}, health_timeout=3)
    assert res["failed"]
    assert "did not become healthy within 3 s" in res["msg"], res["msg"]
    assert "stopped it" in res["msg"] and "keep_on_failure" in res["msg"]
    assert res["last_status"] and res["log_tail"]
    assert 3 <= res["elapsed"] < 20 and res["_wall"] < 60
    stopped = res["stop"]["signalled"][0]
    assert not _alive(stopped) and session_members(stopped) == []


def test_hang_with_keep_on_failure_leaves_it_running(launch, servers, tmp_path):
    res = launch(sim_env={"SGLANG_SIM_HANG": "load"}, health_timeout=1.5, keep_on_failure=True)
    assert res["failed"] and "keep_on_failure=true" in res["msg"]
    assert _alive(res["pid"])


def test_port_in_use_fails_before_starting(launch, tmp_path):
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", launch.port()))
    blocker.listen(1)
    try:
        res = launch(health_timeout=120)
    finally:
        blocker.close()
    assert res["failed"]
    assert "port %d is already in use by pid %d" % (launch.port(), os.getpid()) in res["msg"], res["msg"]
    assert "Nothing was started" in res["msg"]
    assert res["elapsed"] < 5 and res["_wall"] < 60
    assert not (tmp_path / "state" / "server.pid").exists()


def test_port_in_use_reported_by_the_server_fails_fast(launch):
    res = launch(sim_env={"SGLANG_SIM_PORT_IN_USE": "1"}, health_timeout=120)
    assert res["failed"]
    assert res["elapsed"] < 20 and res["_wall"] < 60
    assert "exited" in res["msg"] or "killed by" in res["msg"]
    assert any("address already in use" in line.lower() or "errno 98" in line.lower() for line in res["log_tail"]), res["log_tail"]


# ---------------------------------------------------------------------------
# Secrets
# ---------------------------------------------------------------------------

def test_api_key_never_leaves_the_config_file(sim_node, models, servers, tmp_path):
    port = free_port()
    params = {
        "name": "secret", "state_dir": str(tmp_path / "state"), "python": sys.executable, "api_key": SECRET,
        "args": {"model_path": str(models / "target"), "port": port, "tp_size": 2},
        "env": dict(FAST, PYTHONPATH=str(SIM_PY), GPUSIM_ROOT=sim_node.root, CUDA_VISIBLE_DEVICES="0,1"),
        "health_timeout": 60,
    }
    run = run_module_raw(params, tmp_path, env=sim_node.env, verbosity=3)
    servers.add(run.get("pid"))
    assert not run.failed, run
    pid = run["pid"]
    # Not in ps: the main process and every child.
    members = session_members(pid)
    assert pid in members and len(members) >= 3  # main + 2 schedulers (+ detokenizer)
    for member, argv in cmdlines(members).items():
        assert SECRET not in "\0".join(argv), (member, argv)
    assert run["argv"][-2:] == ["--config", str(tmp_path / "state" / "config.yaml")]
    config = tmp_path / "state" / "config.yaml"
    assert stat.S_IMODE(os.stat(config).st_mode) == 0o600 and SECRET in config.read_text()
    # Not in the module result, nor anywhere in Ansible's (-vvv) output.
    assert SECRET not in run.everything()
    assert run["effective"]["api_key"] == "********"
    # The key works: /server_info needed it.
    assert run["server_info_endpoint"] == "/server_info"
    # Not in the state file, nor in the environment of the server.
    assert SECRET not in (tmp_path / "state" / "server.state.json").read_text()
    with open("/proc/%d/environ" % pid, "rb") as fh:
        assert SECRET.encode() not in fh.read()

    # The log tail we return on failure is masked too: the server logs server_args=... with the key.
    crash = dict(params, name="secret2", state_dir=str(tmp_path / "state2"), args=dict(params["args"], port=free_port()),
                 env=dict(params["env"], SGLANG_SIM_CRASH_ON_LOAD="1"))
    failed = run_module_raw(crash, tmp_path, env=sim_node.env)
    servers.add_pid_file(str(tmp_path / "state2" / "server.pid"))
    assert failed.failed and failed["log_tail"]
    crash_log = (tmp_path / "state2" / "server.log").read_text()
    assert SECRET in crash_log  # the server really printed it ...
    assert any("server_args=" in line and "'api_key': '********'" in line for line in failed["log_tail"])
    assert SECRET not in failed.everything()  # ... and the module masked it


def test_old_version_refuses_api_key_on_argv_unless_allowed(launch, tmp_path):
    res = launch(version="0.5.1", api_key=SECRET, sim_env={"SGLANG_SIM_VERSION": "0.5.1"})
    assert res["failed"]
    assert "no --config option" in res["msg"] and "allow_api_key_in_argv" in res["msg"]
    assert not (tmp_path / "state" / "server.pid").exists()

    res = launch(version="0.5.1", api_key=SECRET, allow_api_key_in_argv=True, sim_env={"SGLANG_SIM_VERSION": "0.5.1"})
    assert not res["failed"], res.get("msg")
    assert res["argv"][-2:] == ["--api-key", "********"] and res["config_file"] is None
    assert any("ps" in w for w in res.get("warnings", []))
    assert SECRET not in json.dumps(res)
    # The documented limit: on 0.5.1 the key is visible on the command line.
    assert SECRET in "\0".join(cmdlines([res["pid"]])[res["pid"]])
    # 0.5.1 has no /server_info: the module used /get_server_info.
    assert res["server_info_endpoint"] == "/get_server_info" and res["version"].startswith("0.5.1")


# ---------------------------------------------------------------------------
# Check mode, states, endpoint fallback
# ---------------------------------------------------------------------------

def test_check_mode_starts_nothing(launch, tmp_path):
    res = launch(check=True, diff=True, api_key=SECRET)
    assert not res["failed"], res.get("msg")
    assert res["changed"] is True and res["action"] == "start"
    assert res["argv"][3:5] == ["--model-path", res["argv"][4]] and "--config" in res["argv"]
    assert "pid" not in res
    assert not (tmp_path / "state").exists()
    assert not socket.socket().connect_ex(("127.0.0.1", launch.port())) == 0
    assert SECRET not in json.dumps(res)
    diff = res["_stdout"]
    assert "+++ after: t (intended)" in diff and "+argv: %s -m sglang.launch_server --model-path" % sys.executable in diff
    assert '+  api-key: "********"' in diff


def test_restarted_and_stopped(launch):
    first = launch()
    assert not first["failed"], first.get("msg")
    again = launch(state="restarted")
    assert not again["failed"], again.get("msg")
    assert again["changed"] and again["action"] == "restart" and again["pid"] != first["pid"]
    assert not _alive(first["pid"])

    plan = launch(state="stopped", check=True)
    assert plan["changed"] and plan["action"] == "stop" and _alive(again["pid"])
    stopped = launch(state="stopped")
    assert stopped["changed"] and stopped["action"] == "stop"
    assert stopped["stop"]["signalled"] == [again["pid"]] and stopped["stop"]["still_running"] == []
    assert not _alive(again["pid"]) and session_members(again["pid"]) == []
    assert stopped["stop"]["elapsed"] < 20
    noop = launch(state="stopped")
    assert noop["changed"] is False and noop["action"] == "none"


def test_get_server_info_fallback_when_server_info_is_missing(launch):
    # The target version says 0.5.23, the server really is 0.5.1: /server_info answers 404.
    res = launch(sim_env={"SGLANG_SIM_VERSION": "0.5.1"})
    assert not res["failed"], res.get("msg")
    assert res["server_info_endpoint"] == "/get_server_info"
    assert res["version"].startswith("0.5.1")
    assert res["effective"]["port"] == launch.port()


# ---------------------------------------------------------------------------
# manager: systemd (with a stand-in systemctl/journalctl)
# ---------------------------------------------------------------------------

def test_systemd_manager_start_idempotent_stop(sim_node, models, servers, tmp_path):
    bin_dir, root = fake_systemd(tmp_path)
    port = free_port()
    args = {"model_path": str(models / "target"), "port": port}
    unit = "sglang-sd.service"
    flags = render.to_argv(args, "0.5.23")
    write_unit(root, unit, [sys.executable, "-m", "sglang.launch_server"] + flags,
               dict(FAST, PYTHONPATH=str(SIM_PY), GPUSIM_ROOT=sim_node.root, CUDA_VISIBLE_DEVICES="0"),
               tmp_path / "unit.log")
    env = dict(sim_node.env, PATH="%s:%s" % (bin_dir, sim_node.env["PATH"]), FAKE_SYSTEMD_ROOT=str(root))
    params = {"name": "sd", "manager": "systemd", "args": args, "state_dir": str(tmp_path / "state"), "health_timeout": 60}
    try:
        res = run_module_raw(params, tmp_path, env=env).result
        servers.add(unit_pid(root, unit))
        assert not res["failed"], res.get("msg")
        assert res["action"] == "start" and res["pid"] == unit_pid(root, unit)
        assert res["effective"]["port"] == port and res["overrides"] == []
        again = run_module_raw(params, tmp_path, env=env).result
        assert again["changed"] is False and again["pid"] == res["pid"], again.get("msg")
        stopped = run_module_raw(dict(params, state="stopped"), tmp_path, env=env).result
        assert stopped["changed"] and not _alive(res["pid"])
        calls = (root / "calls.log").read_text().splitlines()
        assert "start -- %s" % unit in calls and "stop -- %s" % unit in calls, calls
    finally:
        servers.add(unit_pid(root, unit))
