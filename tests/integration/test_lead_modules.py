"""node_lock, sglang_smoke and the sglang_mask filter through real Ansible (``ansible`` /
``ansible-playbook`` on localhost, local connection, the venv's interpreter).

- node_lock: two runs ask for one lock at the same time; exactly one gets it, the other waits
  its timeout and fails naming the holder; a release by the other owner is refused, ``force``
  removes it.
- sglang_smoke against the simulator's fake SGLang server (``python -m sglang.launch_server``):
  the incident config (EAGLE3, topk 1, steps 1, draft 16, so SGLang runs 2 draft tokens) fails
  ``min_accept_length: 2.5`` with both numbers in the message; the fixed config (steps 15) passes.
- sglang_mask in a template rendered by ``ansible.builtin.debug``.

Processes: the fake servers are started through ``sim_node.spawn_sglang`` (tracked by PID and
start time in ``procs``, SIGKILLed by PID at teardown; their children die with them through
PDEATHSIG). The ``ansible`` commands are waited for.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
SIM_BIN = REPO / "simulator" / "bin"
COLLECTIONS = REPO / ".collections"
VENV_BIN = pathlib.Path(sys.executable).parent

pytestmark = pytest.mark.slow

SECRET = "sk-lead-7f3a9c21e0"
INCIDENT = ["--speculative-algorithm", "EAGLE3", "--speculative-eagle-topk", "1", "--speculative-num-steps", "1",
            "--speculative-num-draft-tokens", "16"]
FIXED = INCIDENT[:5] + ["15"] + INCIDENT[6:]
# Generation runs 50x faster than simulated time; with one request in flight the accept-length
# sampling is deterministic (SGLANG_SIM_SEED), so the numbers below do not flake.
SMOKE_ENV = {"SGLANG_SIM_TIME_SCALE": "0.02"}


def venv_first(env):
    """``env`` with the venv's bin first on PATH (then the simulator's), as on a tidy node."""
    env = dict(env)
    rest = [p for p in env.get("PATH", "").split(":") if p and p not in (str(VENV_BIN), str(SIM_BIN))]
    env["PATH"] = ":".join([str(VENV_BIN), str(SIM_BIN)] + rest)
    return env


# ---------------------------------------------------------------------------
# node_lock
# ---------------------------------------------------------------------------

def run_playbook(play, tmp_path, env=None, extra=()):
    """Run ``play`` (a dict) with ``ansible-playbook`` and the json callback; returns the parsed output."""
    path = tmp_path / "play.yml"
    path.write_text(json.dumps([play]))                         # JSON is YAML
    run_env = venv_first(env or os.environ)
    run_env.update({"ANSIBLE_STDOUT_CALLBACK": "json", "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_NOCOLOR": "1",
                    "ANSIBLE_LOCALHOST_WARNING": "0", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "0",
                    "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS),
                    "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"), "ANSIBLE_HOME": str(tmp_path / "ansible-home")})
    argv = [str(VENV_BIN / "ansible-playbook"), "-i", "%s," % ",".join(play["hosts"]), str(path),
            "-e", "ansible_python_interpreter=%s" % sys.executable, "-e", "ansible_connection=local"] + list(extra)
    proc = subprocess.run(argv, env=run_env, cwd=str(REPO), capture_output=True, text=True, timeout=600, check=False)
    try:
        return json.loads(proc.stdout)
    except ValueError:
        raise AssertionError("rc=%d\nstdout=%s\nstderr=%s" % (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:]))


def test_node_lock_two_runs_meet_release_is_owner_checked(tmp_path):
    """Two hosts of one play (both this machine, two forks) take the same lock at the same moment."""
    lock = str(tmp_path / "locks" / "gpufleet-sglang-main")
    owner = "run-{{ inventory_hostname }}"
    out = run_playbook({
        "name": "two runs", "hosts": ["run_a", "run_b"], "gather_facts": False,
        "tasks": [
            {"name": "take", "gpufleet.sglang.node_lock": {"path": lock, "owner": owner, "timeout": 2},
             "register": "lk", "ignore_errors": True},
            {"name": "release as the other run", "when": "lk is failed", "ignore_errors": True,
             "gpufleet.sglang.node_lock": {"path": lock, "owner": owner, "state": "released"}},
            {"name": "release with force", "when": "lk is failed",
             "gpufleet.sglang.node_lock": {"path": lock, "owner": owner, "state": "released", "force": True}},
        ]}, tmp_path)
    take, refused, forced = [t["hosts"] for t in out["plays"][0]["tasks"]]

    winners = [h for h, r in take.items() if r.get("acquired")]
    assert len(winners) == 1, take
    winner = winners[0]
    loser = "run_b" if winner == "run_a" else "run_a"
    won, lost = take[winner], take[loser]
    assert not won.get("failed") and won["changed"] is True and won["holder"]["owner"] == "run-" + winner
    assert lost["failed"] is True and lost["acquired"] is False
    assert lost["msg"].startswith("another redeploy holds the node lease %s: run run-%s, taken " % (lock, winner)), lost["msg"]
    assert "Waited 2.0 s" in lost["msg"] and "sglang_lease_break=run-%s" % winner in lost["msg"]
    assert lost["waited"] >= 1.9 and lost["holder"] == won["holder"]

    assert refused[winner].get("skipped") and forced[winner].get("skipped")
    assert refused[loser]["failed"] is True
    assert refused[loser]["msg"].startswith("the node lease %s is held by run run-%s, taken " % (lock, winner)), refused[loser]["msg"]
    assert "not by run run-%s;" % loser in refused[loser]["msg"] and "(set force=true to remove it anyway)" in refused[loser]["msg"]
    assert not forced[loser].get("failed") and forced[loser]["changed"] is True
    assert forced[loser]["holder"]["owner"] == "run-" + winner
    assert not os.path.exists(lock)
    assert out["stats"][winner]["failures"] == 0 and out["stats"][loser]["ignored"] == 2


# ---------------------------------------------------------------------------
# sglang_smoke
# ---------------------------------------------------------------------------

def test_smoke_gate_incident_fails_fixed_passes(sim_node, tmp_path, run_play):
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    spec = ["--speculative-draft-model-path", str(draft)]
    incident = sim_node.spawn_sglang(gpus=(0,), args=INCIDENT + spec, env=SMOKE_ENV)
    fixed = sim_node.spawn_sglang(gpus=(1,), args=FIXED + spec + ["--api-key", SECRET], env=SMOKE_ENV)

    smoke = {"requests": 8, "concurrency": 1, "max_new_tokens": 128, "min_accept_length": 2.5, "timeout": 120}
    env = venv_first(sim_node.env)
    bad, good = run_play([
        {"name": "smoke the incident config", "ignore_errors": True,
         "gpufleet.sglang.sglang_smoke": dict(smoke, url="http://127.0.0.1:%d" % incident["port"])},
        {"name": "smoke the fixed config",
         "gpufleet.sglang.sglang_smoke": dict(smoke, url="http://127.0.0.1:%d" % fixed["port"], api_key=SECRET)},
    ], env, tmp_dir=tmp_path)

    # Incident: SGLang runs 2 draft tokens, E[accept length] = 1.661.
    assert bad["failed"] is True, bad
    match = re.fullmatch(r"Smoke gate failed: accept length (\d+\.\d+) is below min_accept_length 2\.50", bad["msg"])
    assert match, bad["msg"]
    assert float(match.group(1)) == round(bad["accept_length"], 2)
    assert 1.5 < bad["accept_length"] < 1.8 and 1.5 < bad["server_accept_length"] < 1.8
    assert bad["requests"] == {"sent": 8, "ok": 8, "failed": 0}
    assert bad["completion_tokens"] == 8 * 128 and bad["tokens_per_s"] > 0

    # Fixed: 16 draft tokens, E[accept length] = 2.946; the API key went as a bearer token.
    assert good["failed"] is False, good.get("msg")
    assert 2.6 < good["accept_length"] < 3.3 and 2.6 < good["server_accept_length"] < 3.3
    assert good["requests"] == {"sent": 8, "ok": 8, "failed": 0} and good["errors"] == []
    assert SECRET not in json.dumps(good)


# ---------------------------------------------------------------------------
# sglang_mask
# ---------------------------------------------------------------------------

def test_mask_filter_in_a_debug_template(tmp_path):
    data = {
        "server_info": {"model_path": "/models/qwen", "api_key": SECRET, "speculative_token_map": "/models/map.pt",
                        "speculative_num_draft_tokens": 16,
                        "internal_states": [{"avg_spec_accept_length": 2.95, "hf_token": "hf_" + SECRET}]},
        "argv": ["python3", "-m", "sglang.launch_server", "--port", 30000, "--api-key", SECRET,
                 "--admin-api-key=" + SECRET, "--speculative-token-map", "/models/map.pt"],
        "log_line": "server_args=ServerArgs(model_path='/models/qwen', api_key='%s', admin_api_key=None)" % SECRET,
    }
    vars_file = tmp_path / "vars.json"
    vars_file.write_text(json.dumps(data))
    env = venv_first(os.environ)
    env.update({"ANSIBLE_STDOUT_CALLBACK": "json", "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_NOCOLOR": "1",
                "ANSIBLE_LOCALHOST_WARNING": "0", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "0",
                "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS),
                "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"), "ANSIBLE_HOME": str(tmp_path / "ansible-home")})
    template = ("{{ {'info': server_info | gpufleet.sglang.sglang_mask, 'argv': argv | gpufleet.sglang.sglang_mask, "
                "'line': log_line | gpufleet.sglang.sglang_mask} }}")
    proc = subprocess.run(
        [str(VENV_BIN / "ansible"), "localhost", "-i", "localhost,", "-c", "local", "-m", "ansible.builtin.debug",
         "-a", json.dumps({"msg": template}), "-e", "@%s" % vars_file,
         "-e", "ansible_python_interpreter=%s" % sys.executable],
        env=env, cwd=str(REPO), capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert SECRET not in proc.stdout and SECRET not in proc.stderr
    msg = json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]["msg"]
    assert msg["info"] == {"model_path": "/models/qwen", "api_key": "********", "speculative_token_map": "/models/map.pt",
                           "speculative_num_draft_tokens": 16,
                           "internal_states": [{"avg_spec_accept_length": 2.95, "hf_token": "********"}]}
    assert msg["argv"] == ["python3", "-m", "sglang.launch_server", "--port", 30000, "--api-key", "********",
                           "--admin-api-key=********", "--speculative-token-map", "/models/map.pt"]
    assert msg["line"] == "server_args=ServerArgs(model_path='/models/qwen', api_key='********', admin_api_key=None)"
