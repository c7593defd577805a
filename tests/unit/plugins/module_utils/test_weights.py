"""Unit tests for module_utils/weights: the weights-or-restart plan (pure, on checkpoint directories in
tmp_path), and update_in_place / roll_back against the real fake SGLang server (simulator/python,
started on a free loopback port with a temporary GPUSIM_ROOT made by ``gpusim init`` and the fast
knobs of tests/integration/playbook_helpers.py; every process recorded and SIGKILLed by PID)."""
from __future__ import annotations

import json
import os
import shutil
import sys

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import weights

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "simulator"))

from sglang_helpers import QWEN_CONFIG, GpuNode, ProcessRegistry, Server  # noqa: E402 - after sys.path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "integration"))

from playbook_helpers import FAST_SERVER_ENV  # noqa: E402 - after sys.path
from checkpoint_files import SMALL_LAYOUT, write_safetensors, write_weights  # noqa: E402 - after sys.path

KEY = "sk-weights-test-6d1f"


def checkpoint(path, content="step 1000", config=None, extra=None, layout=None, shards=1):
    """A checkpoint directory: config.json, valid safetensors weights (``layout``, default SMALL_LAYOUT; their
    bytes derived from the seed ``content``; raw bytes as they are; None: no weights), plus ``extra`` files."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config if config is not None else QWEN_CONFIG))
    if isinstance(content, bytes):
        (path / "model.safetensors").write_bytes(content)
    elif content is not None:
        write_weights(path, layout, seed=content, shards=shards)
    for name, text in (extra or {}).items():
        (path / name).write_text(text)
    return str(path)


def args(model_path, **extra):
    out = {"model_path": model_path, "tp_size": 2, "port": 30000, "mem_fraction_static": 0.88,
           "tokenizer_path": model_path, "served_model_name": None, "weight_version": "default", "load_format": "auto"}
    out.update(extra)
    return out


# =============================================================================
# weights_plan
# =============================================================================
class TestPlan:
    def test_new_checkpoint_same_layout_is_weights(self, tmp_path):
        v1 = checkpoint(tmp_path / "v1", extra={"tokenizer.json": "{}"})
        v2 = checkpoint(tmp_path / "v2", "step 2000", extra={"tokenizer.json": "{}"})
        plan = weights.weights_plan(args(v1), args(v2, weight_version="step-2000"))
        assert plan["mode"] == "weights", plan["reasons"]
        assert plan["reasons"] == []
        assert "model_path %s -> %s" % (v1, v2) in plan["why"] and "weight_version default -> step-2000" in plan["why"]
        kinds = dict((d["field"], d["kind"]) for d in plan["differences"])
        assert kinds == {"args.model_path": "update", "args.weight_version": "update", "args.tokenizer_path": "follows"}
        assert plan["checkpoint"]["new"] == {"path": v2, "architecture": "Qwen2ForCausalLM",
                                             "weight_files": ["model.safetensors"], "error": None,
                                             "tensors": len(SMALL_LAYOUT)}
        assert plan["checkpoint"]["running"]["tensors"] == len(SMALL_LAYOUT)
        assert plan["why"].endswith("same tensor names, dtypes and shapes"), plan["why"]

    def test_another_arg_is_restart_naming_it(self, tmp_path):
        v1, v2 = checkpoint(tmp_path / "v1"), checkpoint(tmp_path / "v2", "x")
        plan = weights.weights_plan(args(v1), args(v2, tp_size=4, **{"--context-length": 8192}))
        assert plan["mode"] == "restart"
        assert "context_length: unset -> 8192" in plan["why"] and "tp_size: 2 -> 4" in plan["why"]

    def test_spellings_and_types_compare_as_values(self, tmp_path):
        v1, v2 = checkpoint(tmp_path / "v1"), checkpoint(tmp_path / "v2", "x")
        running = args(v1, model_loader_extra_config="{}", enable_metrics=False)
        intended = {("--" + k.replace("_", "-")): v for k, v in args(v2).items()}
        intended.update({"--tp-size": "2", "--mem-fraction-static": "0.88", "--model-loader-extra-config": {}})
        assert weights.weights_plan(running, intended)["mode"] == "weights"

    @pytest.mark.parametrize("key,value", [
        ("num_hidden_layers", 24), ("hidden_size", 4096), ("num_attention_heads", 32), ("num_key_value_heads", 8),
        ("vocab_size", 151936), ("quantization_config", {"quant_method": "fp8"}), ("torch_dtype", "float16"),
        ("architectures", ["LlamaForCausalLM"]), ("intermediate_size", 11008)])
    def test_layout_keys_force_restart(self, tmp_path, key, value):
        base = dict(QWEN_CONFIG, torch_dtype="bfloat16")
        v1 = checkpoint(tmp_path / "v1", config=base)
        v2 = checkpoint(tmp_path / "v2", "x", config=dict(base, **{key: value}))
        plan = weights.weights_plan(args(v1), args(v2))
        assert plan["mode"] == "restart"
        assert "model layout differs (%s:" % key in plan["why"] and "launch shapes and dtype" in plan["why"]
        assert [d["kind"] for d in plan["differences"] if d["field"] == "config." + key] == ["shape"]

    def test_other_config_keys_force_restart_as_ignored_by_an_update(self, tmp_path):
        v1 = checkpoint(tmp_path / "v1", config=dict(QWEN_CONFIG, rope_theta=1000000.0))
        v2 = checkpoint(tmp_path / "v2", "x", config=dict(QWEN_CONFIG, rope_theta=10000.0,
                                                          rope_scaling={"type": "yarn", "factor": 4}))
        plan = weights.weights_plan(args(v1), args(v2))
        assert plan["mode"] == "restart"
        assert "config.json differs (rope_scaling: unset -> " in plan["why"]
        assert "rope_theta: 1000000.0 -> 10000.0" in plan["why"] and "keeps the launch config" in plan["why"]

    def test_bookkeeping_keys_are_ignored(self, tmp_path):
        v1 = checkpoint(tmp_path / "v1", config=dict(QWEN_CONFIG, _name_or_path="a", transformers_version="4.44"))
        v2 = checkpoint(tmp_path / "v2", "x", config=dict(QWEN_CONFIG, _name_or_path="b", transformers_version="4.51"))
        assert weights.weights_plan(args(v1), args(v2))["mode"] == "weights"

    def test_configs_given_as_dicts_and_paths(self, tmp_path):
        v1, v2 = checkpoint(tmp_path / "v1"), checkpoint(tmp_path / "v2", "x")
        other = dict(QWEN_CONFIG, num_hidden_layers=2)
        assert weights.weights_plan(args(v1), args(v2), QWEN_CONFIG, QWEN_CONFIG)["mode"] == "weights"
        assert weights.weights_plan(args(v1), args(v2), QWEN_CONFIG, other)["mode"] == "restart"
        assert weights.weights_plan(args(v1), args(v2), v1, v2)["mode"] == "weights"

    def test_new_checkpoint_must_have_weights_and_config(self, tmp_path):
        v1 = checkpoint(tmp_path / "v1")
        empty = checkpoint(tmp_path / "empty", content=None)
        plan = weights.weights_plan(args(v1), args(empty))
        assert plan["mode"] == "restart"
        assert "the new checkpoint: %s holds no weight files (*.safetensors or *.bin) for load_format auto" % empty \
            in plan["why"]
        noconf = tmp_path / "noconf"
        noconf.mkdir()
        write_weights(noconf)
        assert "has no readable config.json" in weights.weights_plan(args(v1), args(str(noconf)))["why"]
        (noconf / "config.json").write_text("[1, 2]")
        assert "config.json is not a JSON object" in weights.weights_plan(args(v1), args(str(noconf)))["why"]
        missing = str(tmp_path / "nowhere")
        assert "the new checkpoint: %s is not a directory on this node" % missing in \
            weights.weights_plan(args(v1), args(missing))["why"]
        # load_format pt reads *.pt only
        plan = weights.weights_plan(args(v1, load_format="pt"), args(checkpoint(tmp_path / "v2", "x"), load_format="pt"))
        assert "holds no weight files (*.pt) for load_format pt" in plan["why"]

    def test_running_checkpoint_must_still_exist(self, tmp_path):
        v1, v2 = checkpoint(tmp_path / "v1", content=None), checkpoint(tmp_path / "v2", "x")
        assert weights.weights_plan(args(v1), args(v2))["mode"] == "weights"      # launched from config.json only
        shutil.rmtree(v1)
        plan = weights.weights_plan(args(v1), args(v2), running_model_config=QWEN_CONFIG)
        assert plan["mode"] == "restart"
        assert "the running checkpoint cannot be compared: %s is not a directory on this node (it is the rollback " \
               "target)" % v1 in plan["why"]

    def test_tokenizer_and_generation_files_must_match(self, tmp_path):
        v1 = checkpoint(tmp_path / "v1", extra={"tokenizer.json": "{\"v\": 1}", "generation_config.json": "{}"})
        v2 = checkpoint(tmp_path / "v2", "x", extra={"tokenizer.json": "{\"v\": 2}", "generation_config.json": "{}"})
        plan = weights.weights_plan(args(v1), args(v2))
        assert plan["mode"] == "restart" and "files read only at startup differ (tokenizer.json)" in plan["why"]
        # a tokenizer of its own (unchanged) makes the checkpoint's tokenizer files irrelevant ...
        tok = str(tmp_path / "tok")
        assert weights.weights_plan(args(v1, tokenizer_path=tok), args(v2, tokenizer_path=tok))["mode"] == "weights"
        # ... but not generation_config.json, which is read from the model path
        (tmp_path / "v2" / "generation_config.json").write_text("{\"temperature\": 0.6}")
        plan = weights.weights_plan(args(v1, tokenizer_path=tok), args(v2, tokenizer_path=tok))
        assert plan["mode"] == "restart" and "(generation_config.json)" in plan["why"]

    def test_served_name_draft_and_loader_rules(self, tmp_path):
        v1, v2 = checkpoint(tmp_path / "v1"), checkpoint(tmp_path / "v2", "x")
        plan = weights.weights_plan(args(v1, served_model_name="qwen"), args(v2, served_model_name="qwen"))
        assert plan["mode"] == "restart" and "served_model_name qwen: after an in-place update SGLang serves under " \
                                             "the checkpoint path" in plan["why"]
        follows = weights.weights_plan(args(v1, served_model_name=v1), args(v2, served_model_name=v2))
        assert follows["mode"] == "weights"
        draft = str(tmp_path / "draft")
        plan = weights.weights_plan(args(v1, speculative_algorithm="EAGLE3", speculative_draft_model_path=draft),
                                    args(v2, speculative_algorithm="EAGLE3", speculative_draft_model_path=draft))
        assert plan["mode"] == "restart" and "separate draft model" in plan["why"]
        ngram = weights.weights_plan(args(v1, speculative_algorithm="NGRAM"), args(v2, speculative_algorithm="NGRAM"))
        assert ngram["mode"] == "weights"
        mtp = weights.weights_plan(args(v1, speculative_algorithm="NEXTN", speculative_draft_model_path=v1),
                                   args(v2, speculative_algorithm="NEXTN", speculative_draft_model_path=v2))
        assert mtp["mode"] == "weights"
        gguf = weights.weights_plan(args(v1, load_format="gguf"), args(v2, load_format="gguf"))
        assert gguf["mode"] == "restart" and "load_format gguf" in gguf["why"]
        delete = weights.weights_plan(args(v1, delete_ckpt_after_loading=True), args(v2, delete_ckpt_after_loading=True))
        assert delete["mode"] == "restart" and "delete_ckpt_after_loading" in delete["why"]
        cache = weights.weights_plan(args(v1, weight_cache_mode="daemon"), args(v2, weight_cache_mode="daemon"))
        assert cache["mode"] == "restart" and "weight_cache_mode daemon" in cache["why"]

    def test_versions_and_multi_node(self, tmp_path):
        v1, v2 = checkpoint(tmp_path / "v1"), checkpoint(tmp_path / "v2", "x")
        for old in ("0.5.10", "0.5.22", "0.4.6.post5"):
            plan = weights.weights_plan(args(v1), args(v2), version=old)
            assert plan["mode"] == "restart" and "checksums arrived in 0.5.23" in plan["why"], old
        assert weights.weights_plan(args(v1), args(v2), version="0.5.24")["mode"] == "weights"
        plan = weights.weights_plan(args(v1, nnodes=2, node_rank=1), args(v2, nnodes=2, node_rank=1))
        assert plan["mode"] == "weights"
        assert any("sent to rank 0's server only" in n for n in plan["notes"])

    def test_nothing_to_swap_is_noted(self, tmp_path):
        v1 = checkpoint(tmp_path / "v1")
        plan = weights.weights_plan(args(v1), args(v1))
        assert plan["differences"] == [] and any("nothing to swap" in n for n in plan["notes"])

    # -- tensor layouts (safetensors headers) ----------------------------------------------------------------
    def test_same_tensors_other_bytes_is_weights_and_compared(self, tmp_path):
        v1, v2 = checkpoint(tmp_path / "v1", "one"), checkpoint(tmp_path / "v2", "two")
        assert (tmp_path / "v1" / "model.safetensors").read_bytes() != (tmp_path / "v2" / "model.safetensors").read_bytes()
        plan = weights.weights_plan(args(v1), args(v2))
        assert plan["mode"] == "weights", plan["reasons"]
        assert [d for d in plan["differences"] if d["kind"] == "tensor"] == []
        assert plan["checkpoint"]["running"]["tensors"] == plan["checkpoint"]["new"]["tensors"] == len(SMALL_LAYOUT)

    def test_another_shape_is_restart_naming_the_tensor_and_both_shapes(self, tmp_path):
        v1 = checkpoint(tmp_path / "v1")
        v2 = checkpoint(tmp_path / "v2", "x", layout=dict(SMALL_LAYOUT, **{"lm_head.weight": ("BF16", (64, 8))}))
        plan = weights.weights_plan(args(v1), args(v2))          # config.json is the same on both sides
        assert plan["mode"] == "restart"
        assert "the new checkpoint's tensors do not fit the running model (1 of its 10 tensors: lm_head.weight: " \
               "BF16 [32, 8] running, BF16 [64, 8] in the new checkpoint)" in plan["why"], plan["why"]
        assert "kills the server" in plan["why"] and len(plan["reasons"]) == 1
        assert [d for d in plan["differences"] if d["kind"] == "tensor"] == [
            {"field": "tensor.lm_head.weight", "before": {"dtype": "BF16", "shape": [32, 8]},
             "after": {"dtype": "BF16", "shape": [64, 8]}, "kind": "tensor"}]

    def test_a_missing_tensor_is_restart(self, tmp_path):
        v1 = checkpoint(tmp_path / "v1")
        layout = dict(SMALL_LAYOUT)
        del layout["model.layers.0.mlp.down_proj.weight"]
        plan = weights.weights_plan(args(v1), args(checkpoint(tmp_path / "v2", "x", layout=layout)))
        assert plan["mode"] == "restart"
        assert "model.layers.0.mlp.down_proj.weight: missing from the new checkpoint" in plan["why"], plan["why"]
        assert [(d["field"], d["after"]) for d in plan["differences"] if d["kind"] == "tensor"] == [
            ("tensor.model.layers.0.mlp.down_proj.weight", None)]

    def test_another_dtype_is_restart(self, tmp_path):
        v1 = checkpoint(tmp_path / "v1")
        v2 = checkpoint(tmp_path / "v2", "x", layout=dict(SMALL_LAYOUT, **{"model.norm.weight": ("F32", (8,))}))
        plan = weights.weights_plan(args(v1), args(v2))
        assert plan["mode"] == "restart"
        assert "model.norm.weight: BF16 [8] running, F32 [8] in the new checkpoint" in plan["why"], plan["why"]

    def test_many_mismatches_are_counted_and_the_differences_capped(self, tmp_path):
        wide = dict(("model.layers.%d.mlp.up_proj.weight" % i, ("BF16", (4, 2))) for i in range(30))
        v1 = checkpoint(tmp_path / "v1", layout=wide)
        v2 = checkpoint(tmp_path / "v2", "x", layout=dict((n, ("BF16", (8, 2))) for n in wide))
        plan = weights.weights_plan(args(v1), args(v2))
        assert plan["mode"] == "restart" and "(30 of its 30 tensors: " in plan["why"] and "... 25 more" in plan["why"]
        assert len([d for d in plan["differences"] if d["kind"] == "tensor"]) == weights.MAX_TENSOR_DIFFERENCES

    def test_tensors_only_in_the_new_checkpoint_are_noted(self, tmp_path):
        v1 = checkpoint(tmp_path / "v1")
        v2 = checkpoint(tmp_path / "v2", "x", layout=dict(SMALL_LAYOUT, **{"model.extra.bias": ("BF16", (8,))}))
        plan = weights.weights_plan(args(v1), args(v2))
        assert plan["mode"] == "weights", plan["reasons"]
        assert "1 tensor only in the new checkpoint (model.extra.bias): the update skips names the running model " \
               "does not have" in plan["notes"]

    def test_a_damaged_new_checkpoint_is_refused_naming_the_file(self, tmp_path):
        v1 = checkpoint(tmp_path / "v1")
        v2 = checkpoint(tmp_path / "v2", "x")
        weights_file = tmp_path / "v2" / "model.safetensors"
        weights_file.write_bytes(weights_file.read_bytes()[:-10])                 # an interrupted copy
        plan = weights.weights_plan(args(v1), args(v2))
        assert plan["mode"] == "restart"
        assert "the new checkpoint cannot be loaded, an in-place update would fail on it: %s: " % weights_file \
            in plan["why"] and "cut short" in plan["why"], plan["why"]
        assert plan["checkpoint"]["new"]["tensors"] is None
        weights_file.write_bytes(b"random bytes, no header")                     # not safetensors at all
        plan = weights.weights_plan(args(v1), args(v2))
        assert plan["mode"] == "restart" and "would fail on it: %s: the header claims" % weights_file in plan["why"]

    def test_a_damaged_running_checkpoint_cannot_be_compared(self, tmp_path):
        v1 = checkpoint(tmp_path / "v1", b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
        plan = weights.weights_plan(args(v1), args(checkpoint(tmp_path / "v2", "x")))
        assert plan["mode"] == "restart"
        assert "the running checkpoint's tensors cannot be compared with the new one's (%s/model.safetensors: the " \
               "header is not JSON" % v1 in plan["why"] and "only a restart is safe" in plan["why"], plan["why"]
        assert plan["checkpoint"]["running"]["tensors"] is None and plan["checkpoint"]["new"]["tensors"] == 10

    def test_sharded_checkpoints_are_compared_through_the_index(self, tmp_path):
        v1 = checkpoint(tmp_path / "v1")
        v2 = checkpoint(tmp_path / "v2", "x", shards=3)
        assert sorted(os.listdir(v2)) == ["config.json", "model-00001-of-00003.safetensors",
                                          "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors",
                                          "model.safetensors.index.json"]
        plan = weights.weights_plan(args(v1), args(v2))
        assert plan["mode"] == "weights", plan["reasons"]
        assert plan["checkpoint"]["new"]["tensors"] == len(SMALL_LAYOUT)
        # one shard of another layout (a half-finished copy of another export)
        index = json.loads((tmp_path / "v2" / "model.safetensors.index.json").read_text())
        shard = index["weight_map"]["model.norm.weight"]
        held = dict((n, SMALL_LAYOUT[n]) for n, f in index["weight_map"].items() if f == shard)
        write_safetensors(tmp_path / "v2" / shard, dict(held, **{"model.norm.weight": ("BF16", (16,))}), seed="x")
        plan = weights.weights_plan(args(v1), args(v2))
        assert plan["mode"] == "restart" and "model.norm.weight: BF16 [8] running, BF16 [16] in the new" in plan["why"]
        # a shard the index names is gone: the reason names it
        os.remove(str(tmp_path / "v2" / shard))
        plan = weights.weights_plan(args(v1), args(v2))
        assert plan["mode"] == "restart"
        assert "would fail on it: %s: is named by model.safetensors.index.json but missing" % (tmp_path / "v2" / shard) \
            in plan["why"], plan["why"]

    def test_layouts_are_compared_only_between_safetensors_checkpoints(self, tmp_path):
        v1 = checkpoint(tmp_path / "v1", content=None)
        (tmp_path / "v1" / "pytorch_model.bin").write_bytes(b"pickled")
        v2 = checkpoint(tmp_path / "v2", "x")
        plan = weights.weights_plan(args(v1), args(v2))
        assert plan["mode"] == "weights", plan["reasons"]
        assert "tensor layouts not compared: the running checkpoint %s has no safetensors weights for load_format " \
               "auto (pytorch_model.bin); only its config.json was compared" % v1 in plan["notes"]
        assert plan["checkpoint"]["new"]["tensors"] is None and not plan["why"].endswith("dtypes and shapes")

    def test_classify_failure_messages(self):
        # the texts of the 0.5.23 weight updater (and the simulator's architecture wording)
        assert weights.classify_failure("Failed to get weights iterator: Cannot find any model weights with `/x`.") == "path"
        assert weights.classify_failure("Failed to update weights: torch.OutOfMemoryError: CUDA out of memory. Tried "
                                        "to allocate 2.00 GiB.\nRolling back to original weights.") == "oom"
        assert weights.classify_failure("Failed to update weights: size mismatch for lm_head.\nRolling back to "
                                        "original weights.") == "load"
        assert weights.classify_failure("Weights were updated, but the cache was not flushed because requests are "
                                        "still running or queued.") == "flush"
        assert weights.classify_failure("something else") == "error"


# =============================================================================
# update_in_place / roll_back against the fake server
# =============================================================================
@pytest.fixture
def registry():
    reg = ProcessRegistry()
    try:
        yield reg
    finally:
        reg.kill_all()


@pytest.fixture
def start(tmp_path, registry):
    node = GpuNode(tmp_path / "gpusim", gpus=2)
    servers = []

    def _start(model_path, extra_args=(), env=None, api_key=None):
        argv = ["--model-path", model_path] + list(extra_args)
        if api_key:
            argv += ["--api-key", api_key]
        full_env = dict(FAST_SERVER_ENV)
        full_env.update(env or {})
        srv = Server(registry, node, tmp_path / ("server%d.log" % len(servers)), argv, env=full_env, api_key=api_key)
        servers.append(srv)
        srv.wait_healthy()
        return srv

    try:
        yield _start
    finally:
        registry.kill_all()
        for srv in servers:
            try:
                srv.proc.wait(timeout=10)
            except Exception:
                pass
            srv.close()


def url(srv):
    return "http://127.0.0.1:%d" % srv.port


class TestUpdate:
    def test_update_verify_and_roll_back(self, start, tmp_path):
        v1 = checkpoint(tmp_path / "ckpt" / "v1", "step 1000")
        v2 = checkpoint(tmp_path / "ckpt" / "v2", "step 2000")
        srv = start(v1, ["--tp-size", "2"], api_key=KEY)
        res = weights.update_in_place(url(srv), KEY, v2, "step-2000")
        assert res["changed"] is True and res["model_path_before"] == v1
        assert res["weight_version"] == {"before": "default", "after": "step-2000"}
        before, after = res["checksums"]["before"], res["checksums"]["after"]
        assert [r["tp_rank"] for r in before["ranks"]] == [0, 1] == [r["tp_rank"] for r in after["ranks"]]
        assert res["checksums_changed"] is True and before["per_engine_checksum"] != after["per_engine_checksum"]
        for b, a in zip(before["ranks"], after["ranks"]):
            # one checksum per parameter (q/k/v and gate/up fused as SGLang does), for every rank
            assert b["per_gpu_checksum"] != a["per_gpu_checksum"] and a["files"] == 7
        assert (res["model_info"]["model_path"], res["model_info"]["weight_version"]) == (v2, "step-2000")
        assert res["message"] == "Succeeded to update model weights. Weight version updated to step-2000."
        assert set(res["timings"]) == {"model_info_s", "checksum_before_s", "update_s", "checksum_after_s", "total_s"}
        # /server_info keeps the launch values
        info = srv.request("/server_info").json()
        assert (info["model_path"], info["weight_version"]) == (v1, "default")
        assert KEY not in json.dumps(res)
        # roll back, to exactly the weights that served before
        back = weights.roll_back(url(srv), KEY, v1, "default", expected_checksum=before["per_engine_checksum"])
        assert back["changed"] is True
        assert back["checksums"]["after"]["per_engine_checksum"] == before["per_engine_checksum"]
        assert (back["model_info"]["model_path"], back["model_info"]["weight_version"]) == (v1, "default")
        again = weights.roll_back(url(srv), KEY, v1, "default", expected_checksum=before["per_engine_checksum"])
        assert again["changed"] is False and "already serves" in again["message"]
        # a checkpoint that claims to be new but holds the same tensors does not verify
        same = checkpoint(tmp_path / "ckpt" / "copy", "step 1000")
        with pytest.raises(weights.WeightsError) as err:
            weights.update_in_place(url(srv), KEY, same, "copy")
        assert err.value.result["failure"] == "verify"
        assert "the checksums did not change although the model path did" in err.value.msg

    def test_failures_name_the_cause_and_the_old_weights_still_serve(self, start, tmp_path):
        v1 = checkpoint(tmp_path / "ckpt" / "v1")
        v2 = checkpoint(tmp_path / "ckpt" / "v2", "step 2000")
        srv = start(v1, env={"SGLANG_SIM_UPDATE_BUFFER_MIB": "500000"})
        launch = weights.checksums(url(srv))
        # Another architecture is no "load" failure on a 0.5.23 server: it loads tensors by name and shape (measured
        # on the real server, which the simulator follows); tensors of other shapes kill the server instead.
        cases = (
            (str(tmp_path / "nowhere"), "path", "the checkpoint path has no weights SGLang can read"),
            (v2, "oom", "CUDA ran out of memory while staging the new weights"),
        )
        for path, failure, text in cases:
            with pytest.raises(weights.WeightsError) as err:
                weights.update_in_place(url(srv), None, path, "v2")
            res = err.value.result
            assert res["failure"] == failure, err.value.msg
            assert text in err.value.msg
            assert res["old_weights_serving"] is True
            assert "the old weights still serve: /model_info shows %s (weight_version default) and every rank's " \
                   "checksum is unchanged" % v1 in err.value.msg
            assert res["checksums"]["after"] == res["checksums"]["before"] == launch
            assert res["model_info"]["model_path"] == v1 and res["weight_version"]["after"] == "default"
        # the rollback of a failed update has nothing to do
        assert weights.roll_back(url(srv), None, v1, "default")["changed"] is False
        # a rollback that fails raises, for the caller to restart
        with pytest.raises(weights.WeightsError) as err:
            weights.roll_back(url(srv), None, v2, "v2")
        assert err.value.msg.startswith("rollback failed, restart the server with the known-good config: ")
        assert err.value.result["failure"] == "oom"

    def test_wrong_key_and_old_server_touch_nothing(self, start, tmp_path):
        v1 = checkpoint(tmp_path / "ckpt" / "v1")
        v2 = checkpoint(tmp_path / "ckpt" / "v2", "step 2000")
        srv = start(v1, api_key=KEY)
        with pytest.raises(weights.WeightsError) as err:
            weights.update_in_place(url(srv), "wrong-key", v2)
        assert "/model_info answered HTTP 401" in err.value.msg and "nothing was changed" in err.value.msg
        assert srv.request("/model_info").json()["model_path"] == v1
        old = start(v1, env={"SGLANG_SIM_VERSION": "0.5.1", "CUDA_VISIBLE_DEVICES": "1"})
        with pytest.raises(weights.WeightsError) as err:
            weights.update_in_place(url(old), None, v2)
        assert "no /model_info (SGLang older than 0.5.10)" in err.value.msg
        assert old.request("/get_model_info").json()["model_path"] == v1
