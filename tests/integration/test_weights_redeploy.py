"""Weight-only redeploys (issue 16 section 1) through the real playbook against a simulated node.

When only the checkpoint changes (same architecture and config.json, same args but the model path), the plan
chooses ``weights``: the running server swaps its weights in place (``/update_weights_from_disk``), is checked
(``/model_info``, ``/weights_checker``, the config, the GPUs) and smoke-gated, and is promoted, without a
teardown: the server PID stays, and nothing is signalled. A failed update that leaves the old weights serving
changes nothing; a smoke failure after the update rolls the weights back in place.
"""
from __future__ import annotations

import json

import pytest

import playbook_helpers
from checkpoint_files import SMALL_LAYOUT, write_checkpoint, write_weights
from playbook_helpers import FAST_SERVER_ENV, SimNode, alive, http_get

pytestmark = pytest.mark.slow


procs = playbook_helpers.procs  # the shared fixture: what a test started is killed by PID at its end


def checkpoint(node, name, arch="DeepseekV3ForCausalLM", layout=None, **config):
    """A checkpoint directory: config.json as the node's model, plus valid safetensors weights (``layout``,
    default the node's) whose bytes are its own (derived from ``name``)."""
    path = node.models / name
    path.mkdir(parents=True, exist_ok=True)
    base = json.loads((node.target / "config.json").read_text())
    base.update(config)
    base["architectures"] = [arch]
    (path / "config.json").write_text(json.dumps(base))
    write_checkpoint(path, layout=layout, seed=name)      # weights and the tokenizer files the node's model has
    return path


# An in-place update loads the one model path into every model runner, draft runners included, so a server
# with a separate EAGLE draft model restarts (tested below); these nodes serve without speculative decoding.
NO_SPECULATION = {"speculative_algorithm": None, "speculative_eagle_topk": None, "speculative_num_steps": None,
                  "speculative_num_draft_tokens": None, "speculative_draft_model_path": None}


class PlainNode(SimNode):
    def server_args(self, **overrides):
        return super().server_args(**dict(NO_SPECULATION, **overrides))

    def host_vars(self, server_env=None, **overrides):
        overrides.setdefault("sglang_smoke_min_accept_length", 0)
        return super().host_vars(server_env=server_env, **overrides)


@pytest.fixture
def node(tmp_path, procs):
    n = PlainNode(tmp_path / "node", procs)
    write_weights(n.target, seed="launch")
    run = n.run()
    assert run.rc == 0 and run.row()["status"] == "deployed", run.summary()
    n.good_pid = n.server_pid()
    return n


def model_info(node):
    status, info = http_get(node.url + "/model_info", api_key=node.api_key)
    assert status == 200, (status, info)
    return info


def with_model(node, path, **extra):
    hv = node.host_vars(**extra)
    hv["sglang_server_args"] = dict(hv["sglang_server_args"], model_path=str(path))
    return hv


def test_a_new_checkpoint_is_swapped_in_place_without_a_teardown(node):
    new = checkpoint(node, "kimi-k2.5-step2")
    hv = with_model(node, new)
    check = node.run(host_vars=hv, check=True)
    assert check.row()["plan"] == "weights", check.row()
    run = node.run(host_vars=hv)
    row = run.row()
    assert run.rc == 0 and row["status"] == "deployed" and row["mode"] == "weights", row
    assert row["signalled"] == [] and row["plan_why"].startswith("only the weights change"), row
    assert node.server_pid() == node.good_pid and alive(node.good_pid), "the same server keeps serving"
    info = model_info(node)
    assert info["model_path"] == str(new) and info["weight_version"] == row["run_id"], info
    assert row["weights"]["version_after"] == row["run_id"]
    # What serves, from the server: /model_info after the update (/server_info keeps the launch's path).
    assert row["effective_source"] == "server" and row["effective_args"]["model_path"] == str(new), row["effective_args"]
    assert row["effective_args"]["weight_version"] == row["run_id"]
    assert row["weights"]["checksums_before"] != row["weights"]["checksums_after"]
    assert json.loads((node.etc / "known-good" / "server.json").read_text())["args"]["model_path"] == str(new)
    assert node.journal()["step"] == "promoted"
    again = node.run(host_vars=hv)
    assert again.row()["status"] == "unchanged", again.row()


def test_a_server_with_a_separate_draft_model_restarts_and_says_why(tmp_path, procs):
    eagle = SimNode(tmp_path / "eagle", procs)                  # the incident's EAGLE-3 config
    write_weights(eagle.target, seed="launch")
    assert eagle.run().row()["status"] == "deployed"
    new = checkpoint(eagle, "kimi-k2.5-step2")
    check = eagle.run(host_vars=with_model(eagle, new), check=True)
    row = check.row()
    assert row["plan"] == "restart", row
    plan = check.task_result("Plan the redeploy (inspect the node, resolve the args as its SGLang will, take the lease)")
    assert "draft model" in plan["plan"]["weights"]["why"], plan["plan"]["weights"]


def test_another_architecture_restarts_and_says_why(node):
    other = checkpoint(node, "other-arch", arch="LlamaForCausalLM", model_type="llama")
    run = node.run(host_vars=with_model(node, other), check=True)
    row = run.row()
    assert row["plan"] == "restart", row
    plan = run.task_result("Plan the redeploy (inspect the node, resolve the args as its SGLang will, take the lease)")
    assert plan["plan"]["weights"]["mode"] == "restart" and "architectures" in json.dumps(plan["plan"]["weights"]), plan
    forced = node.run(host_vars=with_model(node, other, sglang_redeploy_mode="weights"))
    assert forced.rc != 0 and forced.row()["step"] == "preflight" and "sglang_redeploy_mode" in forced.row()["error"]
    assert node.server_pid() == node.good_pid


def test_a_checkpoint_with_other_tensor_shapes_is_not_updated_in_place(node):
    # The same config.json, but lm_head of another shape (the fake, like SGLang 0.5.23, dies on such an update).
    wide = checkpoint(node, "kimi-k2.5-wide", layout=dict(SMALL_LAYOUT, **{"lm_head.weight": ("BF16", (64, 8))}))
    mismatch = "lm_head.weight: BF16 [32, 8] running, BF16 [64, 8] in the new checkpoint"
    # Asked to update in place: the preflight refuses, naming the tensor, before anything is touched.
    forced = node.run(host_vars=with_model(node, wide, sglang_redeploy_mode="weights"))
    row = forced.row()
    assert forced.rc != 0 and row["step"] == "preflight" and "sglang_redeploy_mode" in row["error"], row
    assert mismatch in row["error"], row["error"]
    assert node.server_pid() == node.good_pid and alive(node.good_pid)
    assert model_info(node)["model_path"] == str(node.target)
    # auto: the plan restarts instead, and says why (the report row and the plan's lines).
    run = node.run(host_vars=with_model(node, wide))
    row = run.row()
    assert run.rc == 0 and row["status"] == "deployed" and row["plan"] == "restart" and row["mode"] == "restart", row
    assert mismatch in row["weights"]["why"], row["weights"]
    plan = run.task_result("Plan the redeploy (inspect the node, resolve the args as its SGLang will, take the lease)")
    assert [line for line in plan["lines"] if line.startswith("no in-place weight update: ") and mismatch in line], \
        plan["lines"]
    # A new server process serves the new checkpoint; the old one was stopped (not crashed by an update).
    assert node.server_pid() != node.good_pid and not alive(node.good_pid)
    assert node.good_pid in [s["pid"] for s in row["signalled"]], row["signalled"]
    assert model_info(node)["model_path"] == str(wide)
    assert json.loads((node.etc / "known-good" / "server.json").read_text())["args"]["model_path"] == str(wide)


def test_an_update_that_runs_out_of_memory_keeps_the_old_weights_serving(node, tmp_path):
    # The running server cannot stage the new weights (the fake's staging-buffer knob, set at its launch).
    env = dict(FAST_SERVER_ENV, SGLANG_SIM_UPDATE_BUFFER_MIB="999999")
    hv0 = node.host_vars(server_env=env)
    assert node.run(host_vars=hv0, extravars={"sglang_redeploy_force": True}).row()["status"] == "deployed"
    pid = node.server_pid()
    old_info = model_info(node)
    new = checkpoint(node, "kimi-k2.5-big")
    run = node.run(host_vars=with_model(node, new, server_env=env))
    row = run.row()
    assert run.rc != 0 and row["status"] == "failed" and row["step"] == "weights", row
    assert "old weights still serve" in row["error"], row["error"]
    assert node.server_pid() == pid and model_info(node)["model_path"] == old_info["model_path"]
    assert row["rollback"]["status"] == "not_needed"


def test_a_smoke_failure_after_the_update_rolls_the_weights_back_in_place(node):
    new = checkpoint(node, "kimi-k2.5-slow")
    hv = with_model(node, new, sglang_smoke_min_tokens_per_s=1e9)        # a gate no server passes
    run = node.run(host_vars=hv)
    row = run.row()
    assert run.rc != 0 and row["status"] == "rolled_back" and row["step"] == "smoke", row
    assert node.server_pid() == node.good_pid, "the rollback updates back; it does not restart"
    assert model_info(node)["model_path"] == str(node.target)
    assert node.journal()["step"] == "rolled_back"
