"""sglang_replace (plugins/module_utils/redeploy/replace.py): the outage window in one module run.

``main()`` runs in-process (``patch_module_args``) against a simulated 2 x H200 node: the old server is a
``gpusim hold`` process, the candidate and the known-good servers are the simulator's fake SGLang server
started by the module itself (``python -m sglang.launch_server`` from ``simulator/python``). Covered: the
journal at every step, the files of the candidate and their modes, secrets kept out of records, argv and
results, the readable ``lines``, ``ensure_directories``, and the failure paths: a failure before the
teardown (nothing torn down, journal ``failed``), a teardown failure, a candidate that fails its health
gate with ``rollback=true`` (the known-good record relaunched, its own secrets included), rollback
unavailable, a lease taken over by another run, and a SIGTERM in the middle of the health wait (journal
``interrupted``).

Processes: see redeploy_testlib.py (every PID recorded, SIGKILLed by PID at teardown).
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import signal
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from redeploy_testlib import alive, mode_of, node_context, run_module  # noqa: E402 - after this directory is put on sys.path

from ansible_collections.gpufleet.sglang.plugins.module_utils.common import http
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import secrets
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import journal as journal_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import lease as lease_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import replace as engine
from ansible_collections.gpufleet.sglang.plugins.module_utils.server import launcher as launch_mod
from ansible_collections.gpufleet.sglang.plugins.modules import sglang_promote
from ansible_collections.gpufleet.sglang.plugins.modules import sglang_replace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "integration"))

from checkpoint_files import SMALL_LAYOUT, write_weights  # noqa: E402 - after sys.path

API_KEY = "sk-replace-5d1e77a0"
OTHER_KEY = "sk-candidate-90c3b1f4"
HF_TOKEN = "hf_replace_secret_42"


@pytest.fixture
def node(tmp_path, monkeypatch):
    yield from node_context(tmp_path, monkeypatch)


def replace(node, monkeypatch, run_id="R1", pids=(), **extra):
    # -v (verbosity 1): the whole result; test_at_verbosity_0_the_result_is_lean_and_the_details_are_on_the_node
    # covers the lean one of verbosity 0.
    args = {"run_id": run_id, "launch": node.launch(), "api_key": API_KEY, "teardown": node.teardown(pids=pids),
            "verify": {"timeout": 20}, "directories": node.directories(), "_ansible_verbosity": 1}
    args.update(extra)
    result = run_module(sglang_replace, args, monkeypatch)
    for key in ("launch", "rollback_launch"):
        node.track_server((result.get(key) or {}).get("pid"))
    node.running_pid()
    return result


def deployed(node, monkeypatch, run_id="R0"):
    """A promoted known-good server (replace + promote of ``run_id``); returns its PID."""
    old = node.hold([0], 1000, "--name", "old-server")
    first = replace(node, monkeypatch, run_id=run_id, pids=[old])
    assert not first["failed"], first["msg"]
    promoted = run_module(sglang_promote, {"name": node.name, "config_dir": str(node.config_dir),
                                           "state_dir": str(node.state_dir), "run_id": run_id}, monkeypatch)
    assert promoted["promoted"] is True, promoted
    return first["launch"]["pid"]


def server_info(pid_url, key):
    status, _headers, body = http.request("GET", pid_url + "/server_info", api_key=key, timeout=10)
    return status, body


# ---------------------------------------------------------------------------
# The outage window
# ---------------------------------------------------------------------------

def test_replace_tears_down_proves_free_launches_and_journals_every_step(node, monkeypatch):
    old = node.hold([0], 1000, "--name", "old-server")
    lease_mod.acquire(str(node.lease_path), "R1", ttl=60)
    env = node.server_env(HF_TOKEN=HF_TOKEN)
    res = replace(node, monkeypatch, pids=[old], launch=node.launch(env=env), lease={"path": str(node.lease_path)})
    assert res["failed"] is False, res.get("msg")
    assert res["changed"] is True and res["torn_down"] is True
    assert [(s["pid"], s["signals"]) for s in res["signalled"]] == [(old, ["SIGTERM"])] and not alive(old)
    assert [g["index"] for g in res["gpus_free"]] == [0] and [g["index"] for g in res["gpus_allocated"]] == [0]
    pid = res["launch"]["pid"]
    assert alive(pid) and res["launch"]["overrides"] == [] and res["launch"]["url"] == "http://127.0.0.1:%d" % node.port
    assert node.used(0) > 1024
    assert [s["step"] for s in res["steps"]] == ["teardown", "torn_down", "launching", "launched"]
    assert res["node_state"] == "candidate running (not yet promoted)"

    # The node journal: the last step, the candidate by PID, start time and fingerprint, every step in the history.
    entry = node.journal()
    state = node.state()
    assert entry["run_id"] == "R1" and entry["step"] == journal_mod.LAUNCHED
    assert entry["candidate"] == {"pid": pid, "starttime": state["starttime"], "fingerprint": state["fingerprint"]}
    assert [h["step"] for h in entry["history"]] == ["teardown", "torn_down", "launching", "launched"]
    assert mode_of(node.state_dir / "journal.json") == oct(0o640)

    # The candidate's files, their modes, and no secret value where it does not belong.
    cand = node.config_dir / "candidate"
    assert mode_of(cand / "server.json") == oct(0o640)
    assert mode_of(cand / "secrets.json") == oct(0o600) and mode_of(cand / "config.yaml") == oct(0o600)
    assert mode_of(node.log_file) == oct(0o600)
    assert not (cand / "server.env").exists()                       # process manager: the env goes to the process
    record = json.loads((cand / "server.json").read_text())
    assert API_KEY not in (cand / "server.json").read_text() and HF_TOKEN not in (cand / "server.json").read_text()
    assert record["fingerprint"] == state["fingerprint"] and "api_key" not in record["args"]
    assert "HF_TOKEN" not in record["env"]
    assert record["cuda_visible_devices"] == "0"
    assert json.loads((cand / "secrets.json").read_text()) == {"args": {"api_key": API_KEY}, "env": {"HF_TOKEN": HF_TOKEN}}
    argv = pathlib.Path("/proc/%d/cmdline" % pid).read_bytes().split(b"\0")
    assert API_KEY.encode() not in b" ".join(argv) and argv[argv.index(b"--config") + 1] == str(cand / "config.yaml").encode()
    assert ("HF_TOKEN=%s" % HF_TOKEN).encode() in pathlib.Path("/proc/%d/environ" % pid).read_bytes().split(b"\0")
    dumped = json.dumps(res)
    assert API_KEY not in dumped and HF_TOKEN not in dumped
    # The server answers with its key only.
    assert server_info(res["launch"]["url"], API_KEY)[0] == 200
    assert server_info(res["launch"]["url"], None)[0] == 401

    # The directories were made as the preflight asked, and the readable lines say what happened.
    assert res["directories"] == node.directories()["paths"]
    assert all(mode_of(path) == oct(0o750) for path in res["directories"])
    assert res["lines"][0].startswith("signalled: PID %d old-server: SIGTERM, gone after " % old)
    # The GPUs are proven free on the drain's last reading (taken after the old server exited): no second query.
    assert res["lines"][1] == "1 GPU(s) free on the teardown's last nvidia-smi reading, after its processes exited: 0=%d MiB" % (
        res["gpus_free"][0]["used_mib"]), res["lines"]
    assert res["timings"]["verify_free_reused"] is True
    assert res["lines"][2].startswith("candidate PID %d healthy at http://127.0.0.1:%d after " % (pid, node.port))
    assert "effective config matches the prediction (0 override(s))" in res["lines"][2]
    assert res["lines"][3].startswith("1 GPU(s) allocated: 0=")
    assert res["lines"][-1].startswith("node: candidate running (not yet promoted) (")
    # The lease was renewed for this run and no longer names this module's process.
    holder = lease_mod.read_holder(str(node.lease_path))
    assert holder["owner"] == "R1" and holder["node_pid"] is None and holder["renewed_at"] >= holder["taken_at"]


def test_phase_teardown_only_leaves_no_server_and_journals_torn_down(node, monkeypatch):
    old = node.hold([0, 1], 1000, "--name", "old-server")
    res = replace(node, monkeypatch, pids=[old], phase="teardown", teardown=node.teardown(gpus=(0, 1), pids=[old]))
    assert res["failed"] is False and res["torn_down"] is True and not alive(old)
    assert res["node_state"] == "no server" and "launch" not in res and node.state() == {}
    assert [g["index"] for g in res["gpus_free"]] == [0, 1]
    assert node.journal()["step"] == journal_mod.TORN_DOWN
    assert not (node.config_dir / "candidate" / "server.json").exists()


def test_phase_verify_gates_the_running_candidate_without_restarting_it(node, monkeypatch):
    first = replace(node, monkeypatch, run_id="R1")
    assert not first["failed"], first.get("msg")
    pid = first["launch"]["pid"]
    again = replace(node, monkeypatch, run_id="R2", phase="verify")
    assert again["failed"] is False, again.get("msg")
    assert again["launch"]["pid"] == pid and alive(pid) and again["signalled"] == []
    assert [s["step"] for s in again["steps"]] == ["launching", "launched"]
    assert node.journal()["run_id"] == "R2" and node.journal()["step"] == journal_mod.LAUNCHED
    # Another config than the one that runs: refused, the running server is not touched (and it counts as torn down:
    # the server under test is an unverified candidate).
    other = replace(node, monkeypatch, run_id="R3", phase="verify", launch=node.launch(args={"mem_fraction_static": 0.8}))
    assert other["failed"] is True and "is not the intended config any more" in other["msg"]
    assert alive(pid)


# ---------------------------------------------------------------------------
# Failure paths
# ---------------------------------------------------------------------------

def test_failure_before_the_teardown_says_nothing_was_torn_down(node, monkeypatch):
    old = node.hold([0], 1000, "--name", "old-server")
    res = replace(node, monkeypatch, pids=[old], launch=node.launch(python="no-such-python-h7"))
    assert res["failed"] is True
    assert "python: no-such-python-h7 not found in PATH" in res["msg"]
    # The node state is what the node shows (the old server here holds GPU 0 and serves no port).
    state = "no server: nothing listens on port %d; GPU 0 open by the old server's PID %d" % (node.port, old)
    assert res["msg"].endswith("(nothing was touched; %s)" % state), res["msg"]
    assert res["torn_down"] is False and res["touched"] is False and res["reason"] == "nothing_touched"
    assert res["signalled"] == [] and alive(old) and node.used(0) >= 1000
    assert res["node_state"] == state
    assert res["node"] == {"port": node.port, "listener": None, "health": None,
                           "gpu_users": [{"pid": old, "name": "old-server", "gpus": [0], "owner": "old server"}]}
    entry = node.journal()
    assert entry["run_id"] == "R1" and entry["step"] == journal_mod.FAILED
    assert entry["detail"].startswith("before the teardown: the candidate config cannot be launched: python: ")
    assert entry["detail"].endswith("; nothing was touched")
    assert not (node.config_dir / "candidate" / "server.json").exists()
    assert "Rollback failed" not in res["msg"] and "rollback" not in res


def test_known_good_target_without_a_record_touches_nothing(node, monkeypatch):
    old = node.hold([0], 1000, "--name", "old-server")
    res = replace(node, monkeypatch, pids=[old], target="known_good")
    assert res["failed"] is True and "there is no known-good config to launch under %s" % (node.config_dir / "known-good") in res["msg"]
    assert res["torn_down"] is False and alive(old)
    assert node.journal()["step"] == journal_mod.FAILED


class _Ctx(object):
    """The few AnsibleModule methods the launch engine calls, for planning a launch outside a module run."""
    no_log_values = set()

    def warn(self, msg):
        pass

    def get_bin_path(self, name, required=False, opt_dirs=None):
        return shutil.which(name)

    def run_command(self, argv, **kwargs):
        raise AssertionError("planning runs nothing: %r" % (argv,))


def _planned(node, launch):
    """What a preflight would plan for ``launch`` with the test's API key (fingerprint and identity)."""
    probe = launch_mod.Launcher(_Ctx(), dict(launch, api_key=API_KEY), check_mode=True)
    assert probe.plan() == []
    # As it reaches sglang_replace: through the controller, the secret digests masked.
    return {"fingerprint": probe.fp, "identity": secrets.redact(probe.identity)}


def test_the_planned_launch_is_launched(node, monkeypatch):
    old = node.hold([0], 1000, "--name", "old-server")
    launch = node.launch()
    res = replace(node, monkeypatch, pids=[old], launch=launch, planned=_planned(node, launch))
    assert res["failed"] is False, res.get("msg")
    assert node.state()["fingerprint"] == _planned(node, launch)["fingerprint"]


@pytest.mark.parametrize("drift", ["env", "args", "api_key"])
def test_a_launch_that_is_not_the_planned_one_is_refused_before_the_teardown(node, monkeypatch, drift):
    old = node.hold([0], 1000, "--name", "old-server")
    planned = _planned(node, node.launch())
    if drift == "env":
        res = replace(node, monkeypatch, pids=[old], launch=node.launch(env=node.server_env(NCCL_DEBUG="INFO")),
                      planned=planned)
        field = "env.NCCL_DEBUG"
    elif drift == "args":
        res = replace(node, monkeypatch, pids=[old], launch=node.launch(args={"mem_fraction_static": 0.7}), planned=planned)
        field = "args.mem_fraction_static"
    else:
        res = replace(node, monkeypatch, pids=[old], launch=node.launch(), planned=planned, api_key=OTHER_KEY)
        field = "a secret value (the API key"
    assert res["failed"] is True and res["reason"] == "spec_mismatch" and res["touched"] is False
    assert "is not the one the preflight planned" in res["msg"] and "it differs in %s" % field in res["msg"], res["msg"]
    assert API_KEY not in res["msg"] and OTHER_KEY not in res["msg"]
    assert res["signalled"] == [] and alive(old)
    assert node.journal()["step"] == journal_mod.FAILED
    assert not (node.config_dir / "candidate" / "server.json").exists()


def test_the_planned_check_spares_the_rollback(node, monkeypatch):
    """A known-good relaunch is the record's config, not the candidate's plan: no refusal."""
    pid = deployed(node, monkeypatch)
    res = replace(node, monkeypatch, run_id="R2", pids=[pid], target="known_good", planned={"fingerprint": "0" * 16})
    assert res["failed"] is False, res.get("msg")


def test_with_diff_the_candidate_run_returns_the_running_launch_against_it_never_a_secret(node, monkeypatch):
    pid = deployed(node, monkeypatch)
    launch = node.launch(args={"mem_fraction_static": 0.7}, env=node.server_env(HF_TOKEN=HF_TOKEN))
    res = replace(node, monkeypatch, run_id="R2", pids=[pid], api_key=OTHER_KEY, launch=launch, _ansible_diff=True)
    assert res["failed"] is False and res["changed"] is True, res.get("msg")
    config_path = str(node.config_dir / "candidate" / "config.yaml")
    assert [d["after_header"].split(" (")[0] for d in res["diff"]] == [
        "SGLang server %s: command line" % node.name, config_path, "SGLang server %s: environment" % node.name]
    argv, config, env = res["diff"]
    # Taken before the teardown: "before" is the server that ran (its record), "after" the candidate.
    assert argv["before_header"].startswith("SGLang server %s: command line (running PID %d, identity " % (node.name, pid))
    assert argv["after_header"].startswith("SGLang server %s: command line (planned, identity %s" % (
        node.name, node.state()["fingerprint"].split(":")[1][:12]))
    assert "    --mem-fraction-static 0.7" in argv["after"].splitlines() and "--mem-fraction-static" not in argv["before"]
    # The key was rotated: marked, never shown.
    assert config["before"] == 'api-key: "********"\n' and config["after"] == 'api-key: "********" (changed)\n'
    assert "HF_TOKEN=********" in env["after"].splitlines() and "HF_TOKEN" not in env["before"]
    dumped = json.dumps(res)
    assert API_KEY not in dumped and OTHER_KEY not in dumped and HF_TOKEN not in dumped
    # A rollback (the known-good relaunch) returns no diff: one diff per run, on the candidate's task.
    back = replace(node, monkeypatch, run_id="R2", pids=[res["launch"]["pid"]], target="known_good", _ansible_diff=True)
    assert back["failed"] is False and "diff" not in back, back.get("msg")


def test_teardown_failure_is_not_a_rollback_and_says_so(node, monkeypatch):
    # A holder whose GPU memory stays after it exited (a driver that does not free it): the GPUs never get free.
    old = node.hold([0], 4000, "--name", "old-server", "--stuck")
    res = replace(node, monkeypatch, pids=[old], rollback=True,
                  teardown=node.teardown(pids=[old], release_timeout=0.5), verify={"timeout": 0.5})
    assert res["failed"] is True and res["torn_down"] is True
    assert [s["pid"] for s in res["signalled"]] == [old]
    assert re.match(r"GPU 0: \d+ MiB held by PID %d \(old-server" % old, res["msg"]), res["msg"]
    assert not alive(old)
    # What the node shows, not what the run meant: nothing listens, the dead holder's memory stays counted.
    assert res["node_state"] == "no server: nothing listens on port %d; no process has GPU 0 open" % node.port
    assert res["failed_step"] == "teardown" and res["reason"] == "teardown_failed" and res["touched"] is True
    assert "launch" not in res and "rollback" not in res                 # nothing was started, no rollback tried
    entry = node.journal()
    assert entry["step"] == journal_mod.FAILED and entry["detail"].startswith("teardown failed: ")
    assert [h["step"] for h in entry["history"]] == ["teardown", "failed"]
    assert not (node.config_dir / "candidate" / "server.json").exists()


def test_a_drain_that_fails_before_its_first_signal_touched_nothing_and_rolls_nothing_back(node, monkeypatch):
    """Issue 28 part 2: the teardown's drain refuses (a holder of the GPUs outside expected_pids) before it signals
    anything. Nothing changed, so there is no rollback even with rollback=true and a known-good record, the healthy old
    server is not signalled, and the node state is read from the node: the old server listens and answers."""
    good_pid = deployed(node, monkeypatch)
    intruder = node.hold([0], 500, "--name", "other-team")
    res = replace(node, monkeypatch, run_id="R2", pids=[good_pid], rollback=True,
                  teardown=node.teardown(pids=[good_pid], on_unexpected="fail"),
                  launch=node.launch(args={"mem_fraction_static": 0.8}))
    assert res["failed"] is True and "1 GPU holder(s) outside expected_pids" in res["msg"], res["msg"]
    assert res["touched"] is False and res["torn_down"] is False
    assert res["failed_step"] == "teardown" and res["reason"] == "nothing_touched"
    assert res["signalled"] == [] and "rollback" not in res and "rollback_launch" not in res
    assert alive(good_pid) and alive(intruder) and node.running_pid() == good_pid
    assert res["node_state"].startswith("the old server still serves: PID %d listens on port %d and /health answers 200; "
                                        "GPU 0 open by " % (good_pid, node.port)), res["node_state"]
    assert "PID %d" % intruder in res["node_state"]
    assert res["node"]["listener"] == {"pid": good_pid, "name": res["node"]["listener"]["name"], "owner": "old server"}
    assert res["msg"].endswith("(nothing was touched; %s)" % res["node_state"])
    entry = node.journal()
    assert entry["run_id"] == "R2" and entry["step"] == journal_mod.FAILED
    assert [h["step"] for h in entry["history"] if h["run_id"] == "R2"] == ["teardown", "failed"]
    assert entry["detail"].startswith("teardown failed before it changed anything: ")
    assert any(line.startswith("node: the old server still serves") for line in res["lines"])


def test_the_in_place_rollback_never_signals_a_holder_this_run_did_not_start_or_stop(node, monkeypatch):
    """The candidate crashes; before the rollback another process came onto the GPU. Stopping the failed candidate
    stops the candidate only (the old code drained every holder with on_unexpected=signal): the drain refuses the
    stranger, the rollback fails and says so, and the stranger lives."""
    good_pid = deployed(node, monkeypatch)
    strangers = []
    real_launch = engine.Replace.launch

    def launch(self, params, label):
        if label == "candidate" and not strangers:
            strangers.append(node.hold([0], 500, "--name", "other-team"))
        return real_launch(self, params, label)

    monkeypatch.setattr(engine.Replace, "launch", launch)
    res = replace(node, monkeypatch, run_id="R2", pids=[good_pid], rollback=True,
                  launch=node.launch(args={"mem_fraction_static": 0.8}, env=node.server_env(SGLANG_SIM_CRASH_ON_LOAD="1")))
    assert alive(strangers[0]), "the rollback killed a process this run neither started nor stopped"
    assert res["failed"] is True and res["touched"] is True and res["reason"] == "stop_failed", res.get("reason")
    assert not alive(good_pid)
    assert res["rollback"]["status"] == "failed" and "outside expected_pids" in res["rollback"]["detail"]
    assert str(strangers[0]) in res["rollback"]["detail"]
    assert res["node_state"].startswith("no server: nothing listens on port %d" % node.port), res["node_state"]


def test_failed_candidate_with_rollback_relaunches_the_known_good_record(node, monkeypatch):
    good_pid = deployed(node, monkeypatch)
    known_good = json.loads((node.config_dir / "known-good" / "server.json").read_text())
    crash_env = node.server_env(SGLANG_SIM_CRASH_ON_LOAD="1")
    res = replace(node, monkeypatch, run_id="R2", pids=[good_pid], rollback=True, api_key=OTHER_KEY,
                  launch=node.launch(args={"mem_fraction_static": 0.8}, env=crash_env))
    assert res["failed"] is True and res["torn_down"] is True
    assert res["msg"].startswith("SGLang server unit (pid ") and "/health_generate answered 2xx" in res["msg"]
    assert res["signalled"][0]["pid"] == good_pid and res["signalled"][0]["signals"] == ["SIGTERM"] and not alive(good_pid)
    rollback = res["rollback"]
    assert rollback["status"] == "succeeded" and rollback["detail"].startswith("relaunched the last known-good config (pid ")
    back = rollback["pid"]
    assert back != good_pid and alive(back) and res["rollback_launch"]["pid"] == back
    assert res["node_state"] == "known-good running"
    # What runs now is the known-good record: its args (no candidate change), its environment, its own API key.
    cmdline = pathlib.Path("/proc/%d/cmdline" % back).read_bytes().split(b"\0")
    assert b"--mem-fraction-static" not in cmdline
    assert b"SGLANG_SIM_CRASH_ON_LOAD=1" not in pathlib.Path("/proc/%d/environ" % back).read_bytes().split(b"\0")
    url = res["rollback_launch"]["url"]
    assert server_info(url, API_KEY)[0] == 200 and server_info(url, OTHER_KEY)[0] == 401
    assert node.state()["fingerprint"] == known_good["fingerprint"]     # a rerun of the known-good config is unchanged
    entry = node.journal()
    assert entry["run_id"] == "R2" and entry["step"] == journal_mod.ROLLED_BACK
    steps = [h["step"] for h in entry["history"] if h["run_id"] == "R2"]
    assert steps == ["teardown", "torn_down", "launching", "rolling_back", "rolling_back", "rolled_back"]
    assert [g["index"] for g in res["gpus_allocated"]] == [0]
    dumped = json.dumps(res)
    assert API_KEY not in dumped and OTHER_KEY not in dumped
    assert any(line.startswith("rollback succeeded: relaunched the last known-good config") for line in res["lines"])


def test_a_server_that_dies_during_a_weight_update_is_replaced_by_the_known_good_config(node, monkeypatch):
    """The in-place update kills the server: a tensor of another shape (SGLang 0.5.23 dies on it, and so does the
    fake; the preflight's plan refuses such a checkpoint, so here it comes after the plan, as a checkpoint copied
    over while the run went on would). The update gets no answer and the update back reaches no server: the module
    stops what is left and launches the known-good config in the same run."""
    write_weights(node.model, seed="good")
    good_pid = deployed(node, monkeypatch)
    known_good = json.loads((node.config_dir / "known-good" / "server.json").read_text())
    wide = node.model_dir("wide", "Qwen2ForCausalLM")
    write_weights(wide, dict(SMALL_LAYOUT, **{"lm_head.weight": ("BF16", (64, 8))}), seed="wide")
    res = replace(node, monkeypatch, run_id="R2", pids=[good_pid], rollback=True, phase="weights",
                  launch=node.launch(args={"model_path": wide}),
                  weights={"previous_model_path": node.model, "issue": True, "timeout": 120})
    assert res["failed"] is True and res["failed_step"] == "weights", res.get("msg")
    assert res["weights"]["failure"] == "http" and res["weights"]["old_weights_serving"] is None, res["weights"]
    assert res["msg"].startswith("in-place weight update to %s failed: the update request was refused" % wide), res["msg"]
    assert "the state after the update could not be read" in res["msg"]
    assert [w for w in res["warnings"] if w.startswith("updating back to the previous checkpoint failed (rollback to "
                                                       "%s impossible: cannot read the server's state" % node.model)]
    assert not alive(good_pid)
    rollback = res["rollback"]
    assert rollback["status"] == "succeeded" and rollback["detail"].startswith("relaunched the last known-good config (pid ")
    back = rollback["pid"]
    assert back != good_pid and alive(back) and res["node_state"] == "known-good running"
    status, _headers, info = http.request("GET", res["rollback_launch"]["url"] + "/model_info", api_key=API_KEY, timeout=10)
    assert status == 200 and info["model_path"] == node.model, info
    assert node.state()["fingerprint"] == known_good["fingerprint"]
    entry = node.journal()
    assert entry["run_id"] == "R2" and entry["step"] == journal_mod.ROLLED_BACK, entry
    # The server died of the update (the loader's error in its log), not of anything else.
    assert "The size of tensor a (32) must match the size of tensor b (64) at non-singleton dimension 0" in \
        node.log_file.read_text()


def test_at_verbosity_0_the_result_is_lean_and_the_details_are_on_the_node(node, monkeypatch):
    """A failed candidate at verbosity 0: no /server_info, log tail or per-GPU bulk in the result (AWX stores every
    result as a job event), the message first; the whole result, masked, in the details file on the node."""
    old = node.hold([0], 1000, "--name", "old-server")
    res = replace(node, monkeypatch, pids=[old], rollback=True, run_id="R7", _ansible_verbosity=0,
                  launch=node.launch(env=node.server_env(SGLANG_SIM_CRASH_ON_LOAD="1", HF_TOKEN=HF_TOKEN)))
    assert res["failed"] is True and res["reason"] == "launch_failed" and res["rollback"]["status"] == "unavailable"
    assert "log_tail" not in res["launch"] and "effective" not in res["launch"] and "Last " in res["msg"]
    assert set(res["gpus_free"][0]) == {"index", "used_mib", "pids"}
    assert res["signalled"][0]["pid"] == old and "gpus" not in res["drain"] and "signalled" not in res["drain"]
    assert isinstance(res["invocation"]["module_args"]["launch"], str)       # its size, not the 5 KB launch
    path = pathlib.Path(res["details_file"])
    assert path == node.state_dir / "details" / "R7-replace-candidate-all.json"
    details = json.loads(path.read_text())
    assert details["launch"]["log_tail"] and details["drain"]["gpus"] and details["msg"] == res["msg"]
    assert details["signalled"] == res["signalled"] and details["node_state"] == res["node_state"]
    assert HF_TOKEN not in path.read_text() and API_KEY not in path.read_text()
    assert len(json.dumps(res)) < len(path.read_text())


def test_failed_candidate_without_known_good_reports_rollback_unavailable(node, monkeypatch):
    old = node.hold([0], 1000, "--name", "old-server")
    res = replace(node, monkeypatch, pids=[old], rollback=True,
                  launch=node.launch(env=node.server_env(SGLANG_SIM_CRASH_ON_LOAD="1")))
    assert res["failed"] is True and res["torn_down"] is True and not alive(old)
    assert res["rollback"]["status"] == "unavailable"
    assert res["rollback"]["detail"] == ("no known-good config under %s (this node was never deployed successfully by this "
                                         "collection)" % (node.config_dir / "known-good"))
    assert res["node_state"] == "no server: nothing listens on port %d; no process has GPU 0 open" % node.port
    assert node.running_pid() is None and res["reason"] == "launch_failed"
    assert node.used(0) <= 16                                              # the failed candidate holds nothing
    entry = node.journal()
    assert entry["step"] == journal_mod.FAILED and "/health_generate answered 2xx" in entry["detail"]
    assert "rollback unavailable: no known-good config" in " ".join(res["lines"])


def test_failed_candidate_without_rollback_is_stopped_and_journalled(node, monkeypatch):
    old = node.hold([0], 1000, "--name", "old-server")
    res = replace(node, monkeypatch, pids=[old], rollback=False,
                  launch=node.launch(health_timeout=1.5, env=node.server_env(SGLANG_SIM_STARTUP_S="120")))
    assert res["failed"] is True and "did not become healthy within 1.5 s" in res["msg"]
    assert "rollback" not in res and res["failed_step"] == "launch" and res["reason"] == "launch_failed"
    assert res["node_state"] == "no server: nothing listens on port %d; no process has GPU 0 open" % node.port
    assert node.running_pid() is None and node.used(0) <= 16
    assert node.journal()["step"] == journal_mod.FAILED


def test_a_lease_taken_over_by_another_run_stops_before_the_teardown(node, monkeypatch):
    old = node.hold([0], 1000, "--name", "old-server")
    lease_mod.acquire(str(node.lease_path), "someone-else", ttl=60)
    res = replace(node, monkeypatch, pids=[old], lease={"path": str(node.lease_path)})
    assert res["failed"] is True and "is no longer held by run R1" in res["msg"] and "someone-else" in res["msg"]
    assert res["torn_down"] is False and alive(old) and res["signalled"] == []
    assert lease_mod.read_holder(str(node.lease_path))["owner"] == "someone-else"
    assert not (node.state_dir / "journal.json").exists()               # only the lease holder writes the journal


def test_sigterm_during_the_health_wait_writes_journal_step_interrupted(node, monkeypatch):
    old = node.hold([0], 1000, "--name", "old-server")
    sent = []
    real_tick = engine.Replace.tick

    def tick(self):
        if not sent:                  # the first probe of the health wait: an AWX cancel arrives
            sent.append(self.step)
            os.kill(os.getpid(), signal.SIGTERM)
        return real_tick(self)

    monkeypatch.setattr(engine.Replace, "tick", tick)
    res = replace(node, monkeypatch, pids=[old], launch=node.launch(env=node.server_env(SGLANG_SIM_STARTUP_S="30")))
    assert sent == [journal_mod.LAUNCHING]
    assert res["failed"] is True
    assert res["msg"] == ("sglang_replace was interrupted by SIGTERM at step launching; the node journal records it, and the "
                          "next run continues from there")
    assert res["failed_step"] == "launch"
    entry = node.journal()
    assert entry["step"] == journal_mod.INTERRUPTED and entry["detail"] == "interrupted by SIGTERM at step launching"
    # The candidate the journal names is what the next run finds (and verifies or replaces).
    assert entry["candidate"]["pid"] == node.state()["pid"]
    assert journal_mod.unfinished(entry)


# ---------------------------------------------------------------------------
# ensure_directories and result_lines (no process)
# ---------------------------------------------------------------------------

class FakeModule(object):
    check_mode = False

    def __init__(self, **params):
        self.params = dict({"run_id": "R1", "launch": {}, "lease": {}, "phase": "all", "target": "candidate"}, **params)
        self.warnings = []

    def warn(self, msg):
        self.warnings.append(msg)


def test_ensure_directories_creates_and_fixes_mode_owner_and_group(tmp_path):
    import grp
    import pwd
    existing = tmp_path / "etc"
    existing.mkdir()
    existing.chmod(0o700)
    missing = tmp_path / "a" / "b" / "state"
    rep = engine.Replace(FakeModule(directories={"paths": [str(existing), str(missing), ""], "mode": "0750",
                                                 "owner": pwd.getpwuid(os.getuid()).pw_name,
                                                 "group": str(os.getgid())}))
    rep.ensure_directories()
    assert rep.result["directories"] == [str(existing), str(missing)] and rep.result["changed"] is True
    for path in (existing, missing):
        st = os.stat(str(path))
        assert oct(st.st_mode & 0o7777) == oct(0o750) and st.st_uid == os.getuid() and st.st_gid == os.getgid()
    assert grp.getgrgid(os.getgid())                                      # the group given by number exists


def test_ensure_directories_without_paths_changes_nothing(tmp_path):
    rep = engine.Replace(FakeModule(directories={"paths": [], "mode": "0700"}))
    rep.ensure_directories()
    assert "directories" not in rep.result and rep.result["changed"] is False
    rep = engine.Replace(FakeModule(directories={}))
    rep.ensure_directories()
    assert "directories" not in rep.result


def test_ensure_directories_default_mode_and_unknown_owner(tmp_path):
    rep = engine.Replace(FakeModule(directories={"paths": [str(tmp_path / "d")]}))
    rep.ensure_directories()
    assert mode_of(tmp_path / "d") == oct(0o750)
    rep = engine.Replace(FakeModule(directories={"paths": [str(tmp_path / "e")], "owner": "no-such-user-h7"}))
    with pytest.raises(KeyError):
        rep.ensure_directories()


def test_result_lines_of_a_full_run():
    result = {
        "torn_down": True, "target": "candidate", "node_state": "candidate running (not yet promoted)", "elapsed": 4.26,
        "signalled": [{"pid": 11, "name": "python3", "signals": ["SIGTERM", "SIGKILL"], "seconds_to_exit": 2.5},
                      {"pid": 12, "name": "sglang::scheduler", "signals": []},
                      {"pid": 13, "signals": ["SIGTERM"]}],
        "gpus_free": [{"index": 0, "used_mib": 1}, {"index": 1, "used_mib": 0}], "timings": {"verify_free_s": 0.3},
        "launch": {"pid": 77, "url": "http://127.0.0.1:30000", "startup_s": 1.5, "overrides": [{"arg": "x"}],
                   "effective": {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 15, "speculative_eagle_topk": 1,
                                 "speculative_num_draft_tokens": 16}},
        "gpus_allocated": [{"index": 0, "used_mib": 120000}, {"index": 1, "used_mib": 120001}],
    }
    assert engine.result_lines(result) == [
        "signalled: PID 11 python3: SIGTERM then SIGKILL, gone after 2.5 s; PID 12 sglang::scheduler: exited with its server; "
        "PID 13 ?: SIGTERM",
        "2 GPU(s) free after 0.3 s: 0=1 MiB, 1=0 MiB",
        "candidate PID 77 healthy at http://127.0.0.1:30000 after 1.5 s; effective config matches the prediction "
        "(1 override(s)): speculative EAGLE3 steps 15 topk 1 draft tokens 16",
        "2 GPU(s) allocated: 0=120000 MiB, 1=120001 MiB",
        "node: candidate running (not yet promoted) (4.3 s in this module run)",
    ]


def test_result_lines_of_a_rollback_and_of_a_run_that_touched_nothing():
    rolled = {"torn_down": True, "target": "known_good", "signalled": [], "node_state": "known-good running", "elapsed": 1,
              "timings": {}, "launch": {"pid": 5, "url": "http://[::1]:1", "startup_s": 0.4},
              "rollback": {"status": "failed", "detail": "the last known-good config did not come back healthy: boom"}}
    assert engine.result_lines(rolled) == [
        "signalled: nothing held the target GPUs",
        "known-good PID 5 healthy at http://[::1]:1 after 0.4 s; healthy (no effective-config check on this rank)",
        "rollback failed: the last known-good config did not come back healthy: boom",
        "node: known-good running (1.0 s in this module run)",
    ]
    # The in-place weight rollback restarts nothing: its launch has no URL or start-up time (seen on the real 0.5.23).
    in_place = dict(rolled, launch={"pid": 5, "effective": {}}, rollback={"status": "succeeded", "detail": None})
    assert engine.result_lines(in_place)[1] == "known-good PID 5 healthy; healthy (no effective-config check on this rank)"
    untouched = {"torn_down": False, "signalled": [], "launch": {"url": "x"}, "node_state": "unchanged", "timings": {}}
    assert engine.result_lines(untouched) == ["node: unchanged (0.0 s in this module run)"]


def lora_dir(node, name, config=True):
    path = node.tmp / name
    path.mkdir()
    if config:
        (path / "adapter_config.json").write_text(json.dumps({"r": 8, "target_modules": ["q_proj"]}))
    return str(path)


def test_runtime_lora_adapters_are_loaded_again_before_the_smoke_gate(node, monkeypatch):
    old = node.hold([0], 1000, "--name", "old-server")
    adapter = lora_dir(node, "adapter-a")
    res = replace(node, monkeypatch, pids=[old], launch=node.launch(args={"enable_lora": True}),
                  lora_adapters=[{"name": "ad-a", "path": adapter}])
    assert res["failed"] is False, res.get("msg")
    assert res["launch"]["lora_adapters"] == [{"name": "ad-a", "path": adapter, "loaded": True}]
    status, _headers, body = http.request("GET", res["launch"]["url"] + "/v1/models", api_key=API_KEY, timeout=10)
    assert status == 200 and [(c["id"], c["root"]) for c in body["data"] if c.get("parent")] == [("ad-a", adapter)]


def test_a_runtime_lora_adapter_that_does_not_load_fails_the_candidate(node, monkeypatch):
    old = node.hold([0], 1000, "--name", "old-server")
    broken = lora_dir(node, "adapter-b", config=False)
    res = replace(node, monkeypatch, pids=[old], launch=node.launch(args={"enable_lora": True}),
                  lora_adapters=[{"name": "ad-b", "path": broken}])
    assert res["failed"] is True and res["torn_down"] is True
    assert res["msg"].startswith("loading the LoRA adapter ad-b (%s) again failed: HTTP 400 " % broken)
    assert res["node_state"] == "no server: nothing listens on port %d; no process has GPU 0 open" % node.port
    assert node.running_pid() is None and node.used(0) <= 16
    assert node.journal()["step"] == journal_mod.FAILED


def test_a_port_the_new_server_binds_that_stays_held_fails_the_teardown(node, monkeypatch):
    import socket
    old = node.hold([0], 1000, "--name", "old-server")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    busy = sock.getsockname()[1]
    try:
        res = replace(node, monkeypatch, pids=[old], verify={"timeout": 1},
                      teardown=dict(node.teardown(pids=[old]), ports=[node.port, busy]))
    finally:
        sock.close()
    assert res["failed"] is True and res["torn_down"] is True and not alive(old)
    assert res["msg"].startswith("the new server's ports are still in use 1 s after the teardown: ")
    assert str(busy) in res["msg"] and "launch" not in res and res["failed_step"] == "teardown"
    assert node.journal()["step"] == journal_mod.FAILED and node.journal()["detail"].startswith("teardown failed: ")
    assert "ports_free_s" in res["timings"]


# ---------------------------------------------------------------------------
# Bugs found by these tests (they fail until the fix in plugins/module_utils/redeploy/replace.py)
# ---------------------------------------------------------------------------

def test_bug_sigterm_during_the_in_place_rollback_writes_journal_step_interrupted(node, monkeypatch):
    """Replace.run: the in-place rollback runs inside ``except (LaunchError, ...)`` (``failed()`` ->
    ``rollback_in_place()``), so an Interrupted raised there is not caught by the sibling ``except Interrupted``:
    it escapes main() as a traceback (MODULE FAILURE) and the journal stays at ``rolling_back``, not ``interrupted``."""
    good_pid = deployed(node, monkeypatch)
    sent = []
    real_tick = engine.Replace.tick

    def tick(self):
        if self.step == journal_mod.ROLLING_BACK and not sent:     # an AWX cancel during the known-good's health wait
            sent.append(self.step)
            os.kill(os.getpid(), signal.SIGTERM)
        return real_tick(self)

    monkeypatch.setattr(engine.Replace, "tick", tick)
    try:
        res = replace(node, monkeypatch, run_id="R2", pids=[good_pid], rollback=True,
                      launch=node.launch(args={"mem_fraction_static": 0.8}, env=node.server_env(SGLANG_SIM_CRASH_ON_LOAD="1")))
    except engine.Interrupted as exc:
        node.running_pid()
        pytest.fail("Interrupted escaped the module: %s (journal step %s)" % (exc, node.journal()["step"]))
    assert sent == [journal_mod.ROLLING_BACK]
    assert res["failed"] is True and "interrupted by SIGTERM at step rolling_back" in res["msg"]
    assert node.journal()["step"] == journal_mod.INTERRUPTED
