"""Unit tests for the SGLang engine in plugins/module_utils/sglang/ (versions, flags, rules, resolve, render)."""
from __future__ import annotations

import ast
import json
import pathlib
import sys

import pytest
import yaml

from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import flags, render, rules, versions
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import resolve as engine

PLUGINS_TESTS = pathlib.Path(__file__).resolve().parents[1]
if str(PLUGINS_TESTS) not in sys.path:
    sys.path.insert(0, str(PLUGINS_TESTS))

from sglang_cases import CASES, INCIDENT, LOG_TOPK1  # noqa: E402 - after tests/unit/plugins is put on sys.path

PACKAGE_DIR = pathlib.Path(engine.__file__).parent
REPO_COLLECTIONS = pathlib.Path(__file__).resolve().parents[4] / ".collections"
H200 = {"name": "NVIDIA H200", "compute_capability": "9.0", "memory_mib": 143771, "count": 8}
B200 = {"name": "NVIDIA B200", "compute_capability": "10.0", "memory_mib": 183359, "count": 8}
WHEEL_FLAGS = json.loads((PLUGINS_TESTS / "data" / "sglang_wheel_flags.json").read_text())["flags"]


def run_case(case, policy=None):
    return engine.resolve(
        case["args"], case["version"], arch=case["arch"], policy=policy or case["policy"],
        draft_arch=case.get("draft_arch"), env=case.get("env"), gpu=case.get("gpu"),
    )


def changing(result):
    return [a for a in result["adjustments"] if not flags.same(a["from"], a["to"])]


# ---------------------------------------------------------------------------
# The shared case table
# ---------------------------------------------------------------------------
def test_case_table_shape():
    assert len(CASES) >= 40
    ids = [c["id"] for c in CASES]
    assert len(ids) == len(set(ids))
    documented = {versions.rule_version(c["version"]) for c in CASES if c["version"] != "0.4.5"}
    assert documented == set(versions.DOCUMENTED_VERSIONS)
    for case in CASES:
        assert set(case) >= {"id", "version", "arch", "policy", "args", "expect", "errors", "doc"}, case["id"]
        assert case["policy"] in engine.POLICIES
        assert case["doc"].startswith("sglang-rules.md §"), case["id"]
        for rule in case.get("rules", []):
            assert rule in rules.BY_ID, (case["id"], rule)
    incident = [c for c in CASES if c["args"] == INCIDENT and c["version"] == "0.5.23"]
    assert {c["policy"] for c in incident} == set(engine.POLICIES)


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_case(case):
    result = run_case(case)
    assert set(result) == {"args", "adjustments", "errors", "notes"}
    for field, value in case["expect"].items():
        assert flags.same(result["args"].get(field), value), (field, result["args"].get(field), value)
    if "rules" in case:
        assert sorted({a["rule"] for a in changing(result)}) == sorted(set(case["rules"]))
    logs = [a["log"] for a in result["adjustments"] if a["log"]]
    for line in case.get("logs", []):
        assert line in logs
    if case["errors"]:
        joined = "\n".join(result["errors"])
        for fragment in case["errors"]:
            assert fragment in joined
    else:
        assert result["errors"] == []
    for adj in result["adjustments"]:
        assert set(adj) == {"arg", "from", "to", "rule", "doc", "log"}
        assert adj["rule"] in rules.BY_ID
        assert adj["doc"] == rules.doc_ref(adj["rule"])
        assert adj["log"] is None or isinstance(adj["log"], str) and adj["log"]


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_case_fixed_point(case):
    """Rendering the effective args makes the server run exactly them (mirror changes nothing)."""
    first = run_case(case)
    second = engine.resolve(first["args"], case["version"], arch=case["arch"], policy="mirror",
                            draft_arch=case.get("draft_arch"), env=case.get("env"), gpu=case.get("gpu"))
    assert changing(second) == []
    assert second["args"] == first["args"]
    if not first["errors"]:
        assert second["errors"] == []
        # and rendering them works for the target version
        argv = render.to_argv(first["args"], case["version"])
        assert argv[:2] == ["--model-path", first["args"]["model_path"]]


def test_incident_three_policies():
    mirror = engine.resolve(INCIDENT, "0.5.23", arch="LlamaForCausalLM", policy="mirror")
    adj = [a for a in mirror["adjustments"] if a["arg"] == "speculative_num_draft_tokens"]
    assert adj == [{
        "arg": "speculative_num_draft_tokens", "from": 16, "to": 2, "rule": "eagle.topk1_draft_tokens",
        "doc": rules.doc_ref("eagle.topk1_draft_tokens"), "log": LOG_TOPK1,
    }]
    honor = engine.resolve(INCIDENT, "0.5.23", arch="LlamaForCausalLM")
    assert honor["args"]["speculative_num_steps"] == 15
    assert honor["args"]["speculative_num_draft_tokens"] == 16
    policy_adj = [a for a in honor["adjustments"] if a["rule"] == "policy.honor_draft_tokens"]
    assert policy_adj == [{"arg": "speculative_num_steps", "from": 1, "to": 15, "rule": "policy.honor_draft_tokens",
                           "doc": rules.doc_ref("policy.honor_draft_tokens"), "log": None}]
    assert not [a for a in honor["adjustments"] if a["rule"] == "eagle.topk1_draft_tokens"]
    strict = engine.resolve(INCIDENT, "0.5.23", arch="LlamaForCausalLM", policy="strict")
    assert len(strict["errors"]) == 1
    assert strict["errors"][0].startswith("speculative_num_draft_tokens: intended 16, but SGLang 0.5.23 would run 2")
    assert "Fix: set speculative_num_steps: 15" in strict["errors"][0]


def test_honor_default_policy_and_silent_reset_0_4_6():
    result = engine.resolve(INCIDENT, "0.4.6", arch="LlamaForCausalLM", policy="mirror")
    reset = [a for a in result["adjustments"] if a["rule"] == "spec.max_running_requests"]
    assert reset and reset[0]["log"] is None and reset[0]["doc"] == rules.doc_ref("spec.max_running_requests")


def test_honor_not_applied_for_small_draft_or_topk_gt_1():
    args = dict(INCIDENT, speculative_num_draft_tokens=1)
    result = engine.resolve(args, "0.5.23")
    assert result["args"]["speculative_num_steps"] == 1
    assert result["args"]["speculative_num_draft_tokens"] == 2
    args = dict(INCIDENT, speculative_eagle_topk=4, speculative_num_steps=5, speculative_num_draft_tokens=8)
    result = engine.resolve(args, "0.5.23")
    assert result["args"]["speculative_num_steps"] == 5
    assert {a["rule"] for a in changing(result)} == {"spec.draft_revision_main", "spec.max_running_requests",
                                                     "attention.default_backend"}


def test_strict_reports_every_explicit_change():
    args = dict(INCIDENT, disable_overlap_schedule=False, enable_mixed_chunk=True)
    result = engine.resolve(args, "0.5.1", arch="LlamaForCausalLM", policy="strict")
    fields = sorted(e.split(":")[0] for e in result["errors"])
    assert fields == ["disable_overlap_schedule", "enable_mixed_chunk", "speculative_num_draft_tokens"]
    for error in result["errors"]:
        assert "intended" in error and "Fix:" in error


def test_strict_accepts_normalised_algorithm_names():
    args = dict(INCIDENT, speculative_algorithm="nextn", speculative_num_steps=15,
                speculative_draft_model_revision="main", max_running_requests=8)
    result = engine.resolve(args, "0.5.23", policy="strict")
    assert result["errors"] == []
    assert result["args"]["speculative_algorithm"] == "EAGLE"


def test_strict_gemma4_promotion_is_an_error():
    args = {"model_path": "/m", "speculative_algorithm": "NEXTN", "speculative_draft_model_path": "/d",
            "speculative_draft_model_revision": "main"}
    result = engine.resolve(args, "0.5.23", policy="strict", draft_arch="Gemma4UnifiedAssistantForCausalLM")
    assert result["args"]["speculative_algorithm"] == "FROZEN_KV_MTP"
    assert any("FROZEN_KV_MTP" in e and e.startswith("speculative_algorithm") for e in result["errors"])
    promo = [a for a in result["adjustments"] if a["rule"] == "algorithm.gemma4_frozen_kv_mtp"][0]
    assert promo["log"] == ("Detected Gemma4AssistantForCausalLM draft; promoting --speculative-algorithm NEXTN "
                            "to FROZEN_KV_MTP.")


def test_gemma4_draft_arch_without_draft_path_is_ignored():
    args = {"model_path": "/m", "speculative_algorithm": "EAGLE", "speculative_num_steps": 3,
            "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}
    result = engine.resolve(args, "0.5.23", draft_arch="Gemma4AssistantForCausalLM")
    assert result["args"]["speculative_algorithm"] == "EAGLE"
    assert any("draft_arch" in n for n in result["notes"])


# ---------------------------------------------------------------------------
# Versions
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("version, documented", [
    ("0.4.6", "0.4.6"), ("0.4.6.post5", "0.4.6"), ("0.4.9", "0.4.6"), ("0.4.10.post2", "0.4.10"),
    ("0.5.0rc2", "0.4.10"), ("0.5.1", "0.5.1"), ("0.5.5", "0.5.1"), ("0.5.10rc1", "0.5.1"),
    ("0.5.10", "0.5.10"), ("0.5.10.post1", "0.5.10"), ("0.5.22", "0.5.10"), ("0.5.23", "0.5.23"),
    ("v0.5.23", "0.5.23"), ("0.5.23.dev3", "0.5.10"), ("0.6.0", "0.5.23"), ("1.2.3+cu128", "0.5.23"),
])
def test_rule_version(version, documented):
    assert versions.rule_version(version) == documented


@pytest.mark.parametrize("version", [0.5, 1, None, "0.5", "latest", "0.5.x", "", True])
def test_unparseable_versions(version):
    with pytest.raises(ValueError) as err:
        versions.parse_version(version)
    assert repr(version) in str(err.value)
    with pytest.raises(ValueError):
        engine.resolve({}, version)


def test_version_notes():
    assert engine.resolve(INCIDENT, "0.5.23", arch="LlamaForCausalLM", gpu=H200)["notes"] == []
    # without gpu facts, the outcome that depends on the GPU is named
    notes = engine.resolve(INCIDENT, "0.5.23", arch="LlamaForCausalLM")["notes"]
    assert len(notes) == 1 and "depends on the GPU" in notes[0] and "default attention_backend" in notes[0]
    assert engine.resolve(INCIDENT, "0.4.6.post5", arch="LlamaForCausalLM")["notes"] == []
    assert "nearest documented" in engine.resolve(INCIDENT, "0.5.5")["notes"][0]
    assert "newer than 0.5.23" in engine.resolve(INCIDENT, "0.7.1")["notes"][0]
    too_old = engine.resolve(INCIDENT, "0.3.9")
    assert too_old["args"] == INCIDENT and "older than 0.4.6" in too_old["errors"][0]
    with pytest.raises(ValueError, match="older than 0.4.6"):
        render.to_argv(INCIDENT, "0.4.5")


# ---------------------------------------------------------------------------
# Malformed input and argument validation
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, message", [
    ({"args": ["--tp-size", "8"]}, "must be a dict"),
    ({"args": {}, "policy": "lenient"}, "unknown resolution policy 'lenient'"),
    ({"args": {}, "arch": ["LlamaForCausalLM"]}, "arch must be a string"),
    ({"args": {}, "draft_arch": 3}, "draft_arch must be a string"),
    ({"args": {}, "env": "SGLANG_ENABLE_SPEC_V2=1"}, "env must be a dict"),
    ({"args": {1: 2}}, "arg names must be strings"),
])
def test_resolve_malformed(kwargs, message):
    with pytest.raises(ValueError, match=message):
        engine.resolve(**kwargs)


def test_unknown_key_and_gated_flag_are_errors_but_resolution_continues():
    args = dict(INCIDENT, speculative_num_draft_token=16, admin_api_key="x")
    result = engine.resolve(args, "0.5.1", arch="LlamaForCausalLM", policy="mirror")
    assert any("unknown SGLang argument 'speculative_num_draft_token'" in e and "'speculative_num_draft_tokens'" in e
               for e in result["errors"])
    assert any("admin_api_key" in e and "0.5.10" in e for e in result["errors"])
    assert result["args"]["speculative_num_draft_tokens"] == 2


def test_type_errors_stop_resolution():
    result = engine.resolve(dict(INCIDENT, speculative_num_steps="two"), "0.5.23")
    assert result["adjustments"] == []
    assert "invalid int value: 'two'" in result["errors"][0]


@pytest.mark.parametrize("field, value, coerced", [
    ("speculative_num_steps", "15", 15), ("speculative_num_steps", 15.0, 15), ("enable_metrics", "true", True),
    ("enable_metrics", "no", False), ("mem_fraction_static", "0.85", 0.85), ("mem_fraction_static", 1, 1),
    ("revision", 123, "123"), ("lora_paths", ("a", "b"), ["a", "b"]), ("json_model_override_args", '{"a": 1}', '{"a": 1}'),
])
def test_coercion(field, value, coerced):
    result = engine.resolve({"model_path": "/m", field: value}, "0.5.23")
    assert result["errors"] == []
    assert flags.same(result["args"][field], coerced)


@pytest.mark.parametrize("field, value, fragment", [
    ("enable_metrics", "maybe", "store_true flag"), ("mem_fraction_static", "lots", "invalid float value"),
    ("speculative_num_steps", True, "invalid int value"), ("lora_paths", "a b", "takes a list"),
    ("json_model_override_args", "{bad", "does not parse"), ("json_model_override_args", 3, "takes a dict"),
    ("revision", ["main"], "takes one string value"), ("mem_fraction_static", [1], "invalid float value"),
])
def test_bad_types(field, value, fragment):
    result = engine.resolve({"model_path": "/m", field: value}, "0.5.23")
    assert field in result["errors"][0] and fragment in result["errors"][0]


def test_no_speculation_changes_nothing():
    args = {"model_path": "/m", "speculative_algorithm": "", "max_running_requests": None, "config": "/etc/x.yaml"}
    result = engine.resolve(args, "0.5.23", policy="strict", arch="LlamaForCausalLM", gpu=H200)
    # only the attention backend SGLang picks for this GPU is added
    assert result["args"] == dict(args, attention_backend="fa3") and result["errors"] == []
    assert [a["rule"] for a in result["adjustments"]] == ["attention.default_backend"]
    assert "--config" in result["notes"][0]
    plain = {"model_path": "/m", "max_running_requests": None}
    result = engine.resolve(plain, "0.5.1", policy="strict")
    assert result["args"] == plain and result["adjustments"] == [] and result["errors"] == []


def test_input_is_not_mutated():
    args = dict(INCIDENT)
    engine.resolve(args, "0.5.23")
    assert args == INCIDENT


# ---------------------------------------------------------------------------
# Individual rules not covered by the table
# ---------------------------------------------------------------------------
def spec_args(**extra):
    args = {"model_path": "/m", "speculative_algorithm": "EAGLE", "speculative_draft_model_path": "/d",
            "speculative_draft_model_revision": "main"}
    args.update(extra)
    return args


STATIC = {"speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}


def errors_of(args, version="0.5.23", **kwargs):
    return "\n".join(engine.resolve(args, version, **kwargs)["errors"])


def test_aux_hidden_states_variants():
    assert "EAGLE3, DFLASH or DSPARK" in errors_of({"speculative_algorithm": "EAGLE", "enable_return_aux_hidden_states": True})
    assert "captures without a draft" in errors_of(spec_args(speculative_algorithm="EAGLE3", enable_return_aux_hidden_states=True))
    assert "pp_size" in errors_of({"speculative_algorithm": "EAGLE3", "enable_return_aux_hidden_states": True, "pp_size": 2})
    assert "return_aux_hidden_state_layer_ids" in errors_of(
        {"speculative_algorithm": "DFLASH", "enable_return_aux_hidden_states": True})
    ok = engine.resolve({"speculative_algorithm": "dflash", "enable_return_aux_hidden_states": True,
                         "return_aux_hidden_state_layer_ids": [1, 2]}, "0.5.23")
    assert ok["errors"] == [] and ok["args"]["speculative_algorithm"] == "DFLASH"
    assert "to name the capture convention" in errors_of({"model_path": "/m", "enable_return_aux_hidden_states": True})
    # older versions do not know the flag
    assert "0.5.23 or newer" in errors_of(dict(INCIDENT, enable_return_aux_hidden_states=True), "0.5.10")


def test_flex_attention_and_radix_cache():
    assert "Flex Attention" in errors_of(spec_args(attention_backend="flex_attention", **STATIC))
    assert "incompatible with speculative decoding" in errors_of(
        {"speculative_algorithm": "NGRAM", "disaggregation_mode": "decode", "disaggregation_decode_enable_radix_cache": True})
    assert errors_of(spec_args(disaggregation_mode="decode", disaggregation_decode_enable_radix_cache=True, **STATIC)) == ""


def test_algorithm_choices_older_versions():
    msg = errors_of({"speculative_algorithm": "ngram"}, "0.5.10")
    assert "invalid choice: 'ngram'" in msg and "upper-case: speculative_algorithm: NGRAM" in msg
    msg = errors_of({"speculative_algorithm": "UNO"}, "0.5.10")
    assert "0.5.23 or newer" in msg
    msg = errors_of({"speculative_algorithm": "MEDUSA"}, "0.4.6")
    assert "choose from 'EAGLE', 'EAGLE3', 'NEXTN'" in msg


def test_spec_v2_0_5_10():
    env = {"SGLANG_ENABLE_SPEC_V2": "true"}
    msg = errors_of(spec_args(speculative_num_steps=5, speculative_eagle_topk=4, speculative_num_draft_tokens=8),
                    "0.5.10", env=env)
    assert "Spec v2 currently only supports topk = 1" in msg
    # Step3p5 with EAGLE: multi-layer EAGLE turns spec v2 on by itself
    result = engine.resolve(spec_args(**STATIC), "0.5.10", arch="Step3p5ForCausalLM")
    assert result["args"]["enable_multi_layer_eagle"] is True
    assert result["args"]["disable_overlap_schedule"] is False
    # raw lower-case nextn would not trigger it, the rendered EAGLE does: noted
    result = engine.resolve(spec_args(speculative_algorithm="NEXTN", **STATIC), "0.5.10", arch="Step3p5ForCausalLM")
    assert result["args"]["enable_multi_layer_eagle"] is True
    assert any("multi-layer" in n for n in result["notes"])


def test_multi_layer_eagle_disables_adaptive_and_pp():
    result = engine.resolve(spec_args(speculative_adaptive=True), "0.5.23", arch="GigaChat35ForCausalLM")
    assert result["args"]["speculative_adaptive"] is False
    disabled = [a for a in result["adjustments"] if a["rule"] == "adaptive.disabled"]
    assert "enable_multi_layer_eagle=True is not supported" in disabled[0]["log"]
    msg = errors_of(spec_args(pp_size=2, **STATIC), arch="MiMoV2ForCausalLM")
    assert "Pipeline parallelism currently only supports EAGLE" in msg
    # pipeline parallelism with EAGLE: only on a PD prefill node
    assert "only supported on prefill nodes" in errors_of(spec_args(pp_size=2, **STATIC), arch="LlamaForCausalLM")
    assert errors_of(spec_args(pp_size=2, disaggregation_mode="prefill", **STATIC), arch="LlamaForCausalLM") == ""
    assert "Pipeline parallelism" in errors_of(spec_args(speculative_algorithm="EAGLE3", pp_size=2, **STATIC))
    # before 0.5.23 any speculation is refused with pp_size > 1
    old = dict(spec_args(pp_size=2, **STATIC))
    del old["speculative_draft_model_revision"]
    assert "not compatible with overlap schedule, speculative decoding" in errors_of(old, "0.5.1")


@pytest.mark.parametrize("extra, reason", [
    ({"enable_dp_attention": True, "dp_size": 2, "tp_size": 2}, "attention DP is not supported"),
    ({"attn_dp_size": 2, "tp_size": 2}, "attention DP is not supported"),
    ({"enable_two_batch_overlap": True}, "enable_two_batch_overlap=True"),
    ({"enable_pdmux": True}, "enable_pdmux=True"),
])
def test_adaptive_disabled_reasons(extra, reason):
    result = engine.resolve(spec_args(speculative_adaptive=True, **STATIC, **extra), "0.5.23", arch="LlamaForCausalLM")
    adj = [a for a in result["adjustments"] if a["rule"] == "adaptive.disabled"]
    assert adj and reason in adj[0]["log"] and adj[0]["log"].endswith("Falling back to static speculative params.")


def test_enable_dp_attention_without_dp_size_is_not_attention_dp_in_0_5_23():
    args = {"model_path": "/m", "speculative_algorithm": "NGRAM", "enable_dp_attention": True}
    assert errors_of(args, "0.5.23") == ""
    assert any("does not turn attention-DP on" in n for n in engine.resolve(args, "0.5.23")["notes"])
    assert "does not support dp attention" in errors_of(args, "0.5.10")


def test_adaptive_config_file(tmp_path):
    config = tmp_path / "adaptive.json"
    config.write_text(json.dumps({"1": {"candidate_steps": [2, 4, 6]}, "meta": {}}))
    result = engine.resolve(spec_args(speculative_adaptive=True, speculative_adaptive_config=str(config)), "0.5.23",
                            arch="LlamaForCausalLM")
    assert (result["args"]["speculative_num_steps"], result["args"]["speculative_num_draft_tokens"]) == (4, 5)
    msg = errors_of(spec_args(speculative_adaptive=True, speculative_adaptive_config=str(config), speculative_num_steps=3))
    assert "candidate_steps [2, 4, 6]" in msg
    config.write_text(json.dumps({"1": {"candidate_steps": "all"}}))
    missing = spec_args(speculative_adaptive=True, speculative_adaptive_config=str(config))
    assert "set speculative_num_steps explicitly" in errors_of(missing)
    result = engine.resolve(dict(missing, speculative_num_steps=9), "0.5.23")
    assert result["errors"] == [] and result["args"]["speculative_num_draft_tokens"] == 10
    assert result["args"]["speculative_eagle_topk"] == 1
    assert any("cannot be read" in n for n in result["notes"])
    config.write_text(json.dumps({"x": {}}))
    assert "set speculative_num_steps explicitly" in errors_of(missing)


def test_page_size_unset_backend_and_0_4_6_topk():
    # attention_backend unset: SGLang picks flashinfer for topk > 1 on an H200, which allows paged trees
    tree = spec_args(page_size=16, speculative_num_steps=5, speculative_eagle_topk=4, speculative_num_draft_tokens=8)
    result = engine.resolve(tree, "0.5.23", gpu=H200, arch="LlamaForCausalLM")
    assert result["errors"] == [] and result["args"]["attention_backend"] == "flashinfer"
    # trtllm_mha (the SM100 default with topk 1) forces page_size 64 and allows no tree
    msg = errors_of(dict(tree, attention_backend="trtllm_mha"))
    assert "trtllm_mha backend only supports topk = 1" in msg
    assert errors_of(spec_args(page_size=16, attention_backend="fa3", speculative_num_steps=5,
                               speculative_eagle_topk=4, speculative_num_draft_tokens=8), "0.5.10") == ""
    old = spec_args(page_size=16, attention_backend="triton", speculative_num_steps=5, speculative_eagle_topk=4,
                    speculative_num_draft_tokens=8)
    del old["speculative_draft_model_revision"]
    assert errors_of(old, "0.5.1") == ""
    forced = engine.resolve(old, "0.4.6", policy="strict")
    assert forced["args"]["speculative_eagle_topk"] == 1
    assert "set page_size: 1 to keep speculative_eagle_topk 4" in "\n".join(forced["errors"])


def test_topk_gt_1_without_draft_tokens_is_noted():
    result = engine.resolve(spec_args(speculative_num_steps=5, speculative_eagle_topk=4), "0.5.23")
    assert result["errors"] == [] and any("unset with speculative_eagle_topk 4" in n for n in result["notes"])


def test_mtp_draft_path_variants():
    result = engine.resolve({"model_path": "/m", "speculative_algorithm": "EAGLE", **STATIC}, "0.5.23",
                            arch="DeepseekV3ForCausalLM")
    assert result["args"]["speculative_draft_model_path"] == "/m"
    # the draft takes the model's revision, unset here: SGLang reports None
    assert result["args"].get("speculative_draft_model_revision") is None
    assert any("has no revision" in n for n in result["notes"])
    result = engine.resolve({"model_path": "/m", "revision": "r1", "speculative_algorithm": "EAGLE", **STATIC},
                            "0.5.23", arch="DeepseekV3ForCausalLM")
    assert result["args"]["speculative_draft_model_revision"] == "r1"
    # no model_path: not modelled
    result = engine.resolve({"speculative_algorithm": "EAGLE", **STATIC}, "0.5.23", arch="DeepseekV3ForCausalLM")
    assert "speculative_draft_model_path" not in result["args"]
    # Pixtral: explicit draft path, no warning
    result = engine.resolve(spec_args(**STATIC), "0.5.23", arch="PixtralForConditionalGeneration")
    assert not [a for a in result["adjustments"] if a["rule"] == "eagle.mtp_draft_path_warning"]
    # 0.4.6 knows only DeepseekV3; 0.5.10 does not know DeepseekV4
    result = engine.resolve({"model_path": "/m", "speculative_algorithm": "EAGLE", **STATIC}, "0.4.6",
                            arch="Glm4MoeForCausalLM")
    assert "speculative_draft_model_path" not in result["args"]
    result = engine.resolve({"model_path": "/m", "speculative_algorithm": "EAGLE", **STATIC}, "0.5.10",
                            arch="DeepseekV4ForCausalLM")
    assert "speculative_draft_model_path" not in result["args"]


def test_iquest():
    arch = "IQuestQ1ForCausalLM"
    assert "independent draft model path" in errors_of({"model_path": "/m", "speculative_algorithm": "EAGLE"}, arch=arch)
    assert "num_draft_slots" in errors_of(spec_args(), arch=arch)
    assert "MTP requires positive" in errors_of(spec_args(speculative_num_steps=0), arch=arch)
    assert "--speculative-eagle-topk 1" in errors_of(spec_args(speculative_num_steps=2, speculative_eagle_topk=2), arch=arch)
    assert "steps + 1" in errors_of(spec_args(speculative_num_steps=2, speculative_num_draft_tokens=8), arch=arch,
                                    policy="mirror")
    ok = engine.resolve(spec_args(speculative_num_steps=2), "0.5.23", arch=arch)
    assert ok["errors"] == []
    assert (ok["args"]["speculative_eagle_topk"], ok["args"]["speculative_num_draft_tokens"]) == (1, 3)
    honor = engine.resolve(spec_args(speculative_num_steps=1, speculative_eagle_topk=1, speculative_num_draft_tokens=8),
                           "0.5.23", arch=arch)
    assert honor["errors"] == [] and honor["args"]["speculative_num_steps"] == 7


def test_dflash_rules():
    base = {"model_path": "/m", "speculative_algorithm": "DFLASH", "speculative_draft_model_path": "/d"}
    assert "on device 'cpu'" in errors_of(dict(base, device="cpu"))
    assert "--enable-dp-lm-head" in errors_of(dict(base, attn_dp_size=2, tp_size=2))
    assert "pp_size == 1" in errors_of(dict(base, pp_size=2))
    assert "to be positive" in errors_of(dict(base, speculative_dflash_block_size=0))
    assert "must match" in errors_of(dict(base, speculative_dflash_block_size=8, speculative_num_draft_tokens=16))
    result = engine.resolve(dict(base, speculative_eagle_topk=2), "0.5.23")
    assert result["args"]["speculative_eagle_topk"] == 1 and result["args"]["speculative_num_steps"] == 1
    assert "DFLASH only supports speculative_eagle_topk == 1; overriding speculative_eagle_topk=2 to 1." in [
        a["log"] for a in result["adjustments"]]
    assert "speculative_num_draft_tokens" not in result["args"]
    assert any("block size" in n for n in result["notes"])


def test_dspark_rules():
    base = {"model_path": "/m", "speculative_algorithm": "DSPARK"}
    assert "CUDA, NPU or XPU" in errors_of(dict(base, device="cpu"))
    assert "PD prefill" in errors_of(dict(base, pp_size=2))
    assert errors_of(dict(base, pp_size=2, disaggregation_mode="prefill", speculative_dspark_block_size=3)) == ""
    assert "must be positive" in errors_of(dict(base, speculative_dspark_block_size=0))
    assert "gamma + 1" in errors_of(dict(base, speculative_dspark_block_size=3, speculative_num_draft_tokens=8))
    assert ">= 2" in errors_of(dict(base, speculative_num_draft_tokens=1))
    result = engine.resolve(dict(base, speculative_num_steps=4, speculative_num_draft_tokens=5), "0.5.23")
    assert result["errors"] == [] and result["args"]["speculative_num_steps"] == 1
    assert any("dspark/ subfolder" in n for n in result["notes"]) and any("gamma" in n for n in result["notes"])


def test_uno_rules():
    base = {"model_path": "/m", "speculative_algorithm": "UNO", "uno_lora_path": "/l",
            "speculative_num_draft_tokens": 4, "attention_backend": "fa3"}
    assert "UNO only supports CUDA" in errors_of(dict(base, device="cpu"))
    assert "does not accept" in errors_of(dict(base, speculative_draft_model_path="/d"))
    assert "--uno-lora-path" in errors_of(dict(base, uno_lora_path=None))
    assert "positive speculative_num_draft_tokens" in errors_of(dict(base, speculative_num_draft_tokens=None))
    assert "at least 1" in errors_of(dict(base, speculative_eagle_topk=0))
    assert "tree mode" in errors_of(dict(base, speculative_eagle_topk=2))
    assert "Q=4" in errors_of(dict(base, speculative_eagle_topk=2, speculative_num_steps=5))
    tree = engine.resolve(dict(base, speculative_eagle_topk=2, speculative_num_steps=3), "0.5.23")
    assert tree["errors"] == [] and any("tree-capacity" in n for n in tree["notes"])
    assert "TP=PP=1" in errors_of(dict(base, tp_size=2))
    # attention-DP needs tp_size divisible by its width, and UNO needs TP 1: the assert comes first
    assert "bare AssertionError" in errors_of(dict(base, attn_dp_size=2))
    assert "Multi-LoRA" in errors_of(dict(base, enable_lora=True))
    assert "FA3 for both" in errors_of(dict(base, decode_attention_backend="triton"))
    result = engine.resolve(dict(base, attention_backend=None, enable_mixed_chunk=True, speculative_eagle_topk=1), "0.5.23")
    assert result["args"]["enable_mixed_chunk"] is False
    assert "Mixed chunked prefill is disabled for UNO speculative decoding." in [a["log"] for a in result["adjustments"]]
    assert any("fa3" in n for n in result["notes"])


def test_ngram_rules():
    assert "CUDA device" in errors_of({"speculative_algorithm": "NGRAM", "device": "cpu"}, "0.5.10")
    assert "CUDA, CPU, or XPU" in errors_of({"speculative_algorithm": "NGRAM", "device": "npu"})
    cpu = engine.resolve({"speculative_algorithm": "NGRAM", "device": "cpu"}, "0.5.23")
    assert cpu["args"]["disable_overlap_schedule"] is True
    assert "must be at least 1" in errors_of({"speculative_algorithm": "NGRAM", "speculative_ngram_max_bfs_breadth": 0})
    assert errors_of({"speculative_algorithm": "NGRAM", "page_size": 16, "attention_backend": "flashinfer"}) == ""
    one = engine.resolve({"speculative_algorithm": "NGRAM", "page_size": 16, "speculative_ngram_max_bfs_breadth": 1},
                         "0.5.23")
    assert one["errors"] == [] and one["args"]["speculative_num_steps"] == 12


def test_feature_constraints_0_5_23():
    assert "enable_unified_memory" in errors_of({"speculative_algorithm": "NGRAM", "enable_unified_memory": True})
    assert "linear draft chain" in errors_of(spec_args(enable_unified_memory=True, speculative_num_steps=5,
                                                       speculative_eagle_topk=4, speculative_num_draft_tokens=8))
    assert errors_of(spec_args(enable_unified_memory=True, **STATIC)) == ""
    assert "enable_pd_role_switch" in errors_of(spec_args(enable_pd_role_switch=True, **STATIC))
    assert "LoRA is only compatible" in errors_of(spec_args(speculative_algorithm="STANDALONE", lora_paths=["a"], **STATIC))
    assert errors_of(spec_args(enable_lora=True, **STATIC)) == ""


def test_cpu_eagle_already_disabled_overlap_only_informs():
    result = engine.resolve(spec_args(device="cpu", disable_overlap_schedule=True, **STATIC), "0.5.23")
    info = [a for a in result["adjustments"] if a["arg"] == "disable_overlap_schedule"]
    assert [a["rule"] for a in info] == ["spec.sync_spec_v2"]
    assert info[0]["from"] is True and info[0]["to"] is True


# ---------------------------------------------------------------------------
# FLAGS
# ---------------------------------------------------------------------------
REFERENCE_FLAGS = [
    "model_path", "tp_size", "port", "host", "speculative_algorithm", "speculative_draft_model_path",
    "speculative_draft_model_revision", "speculative_num_steps", "speculative_eagle_topk",
    "speculative_num_draft_tokens", "speculative_ngram_max_bfs_breadth", "speculative_adaptive",
    "speculative_adaptive_config", "mem_fraction_static", "api_key", "admin_api_key", "enable_metrics", "nnodes",
    "node_rank", "dist_init_addr", "trust_remote_code", "served_model_name", "log_level", "log_level_http",
    "max_running_requests", "page_size", "attention_backend", "prefill_attention_backend",
    "decode_attention_backend", "disable_overlap_schedule", "enable_mixed_chunk", "watchdog_timeout",
    "skip_server_warmup", "tokenizer_worker_num", "dp_size", "enable_dp_attention", "weight_cache_mode", "device",
    "revision", "context_length", "chunked_prefill_size", "cuda_graph_max_bs", "disable_cuda_graph",
    "enable_return_aux_hidden_states", "decode_log_interval", "random_seed", "config", "pp_size",
]


def test_flags_cover_the_reference_flags():
    missing = [f for f in REFERENCE_FLAGS if f not in flags.FLAGS]
    assert missing == []


def test_flags_shape():
    for field, spec in flags.FLAGS.items():
        assert spec["flag"].startswith("--")
        assert spec["type"] in ("int", "float", "str", "bool", "list", "json")
        assert spec["kind"] in ("store_true", "store_const", "boolopt", "value", "nargs", "json")
        assert all(a.startswith("--") for a in spec["aliases"])
        for key in ("min_version", "max_version"):
            assert spec[key] is None or spec[key] in versions.DOCUMENTED_VERSIONS
        if spec["replaced_by"]:
            assert spec["replaced_by"] in flags.FLAGS
    assert flags.FLAGS["tp_size"]["flag"] == "--tp-size"
    assert flags.FLAGS["tp_size"]["aliases"] == ["--tensor-parallel-size"]
    assert "--tp" not in [s["flag"] for s in flags.FLAGS.values()] + sum((s["aliases"] for s in flags.FLAGS.values()), [])
    assert flags.FLAGS["config"]["min_version"] == "0.5.10" and not flags.FLAGS["config"]["config"]
    assert flags.FLAGS["speculative_adaptive"]["min_version"] == "0.5.23"
    assert not flags.FLAGS["lora_paths"]["config"]
    assert flags.FLAGS["json_model_override_args"]["type"] == "json"
    assert flags.FLAGS["enable_tf32_matmul"]["kind"] == "boolopt"
    assert flags.SECRET_ARGS == ("admin_api_key", "api_key", "ssl_keyfile_password", "watermark_config")
    assert len(flags.FLAGS) > 550


@pytest.mark.parametrize("version", versions.DOCUMENTED_VERSIONS)
def test_generated_table_matches_the_wheel_capture(version):
    """The table generated from the real parsers names exactly the option strings that an
    independent capture (string literals read in each wheel) found, plus the --no-x spellings
    that argparse's BooleanOptionalAction adds by itself."""
    declared = set(WHEEL_FLAGS[version])
    mine = set()
    for field in flags.FLAGS:
        spec = flags.spec(field, version)
        if spec:
            mine.update(spec["options"])
        assert (spec is not None) == flags.flag_available(field, version)
    extra = sorted(o for o in mine - declared if not (o.startswith("--no-") and "--" + o[5:] in declared))
    assert extra == [] and sorted(declared - mine) == []


@pytest.mark.parametrize("field, version, value, ok", [
    ("attention_backend", "0.4.6", "trtllm_mha", False),
    ("attention_backend", "0.5.1", "trtllm_mha", True),
    ("attention_backend", "0.5.23", "trtllm_mha", True),
    ("attention_backend", "0.5.23", "bogus", False),
    ("attention_backend", "0.4.6", "fa3", True),
    ("speculative_algorithm", "0.4.6", "NGRAM", False),
    ("speculative_algorithm", "0.5.10", "NGRAM", True),
    ("tp_size", "0.4.6", 8, True),
])
def test_choices_per_version(field, version, value, ok):
    _value, problem = flags.coerce(field, value, version)
    assert (problem is None) == ok, problem
    if not ok:
        assert "invalid choice" in problem and field in problem
        with pytest.raises(ValueError, match="invalid choice"):
            render.to_argv({"model_path": "/m", field: value}, version)


def test_boolopt_renders_no_flag_for_false():
    argv = render.to_argv({"model_path": "/m", "enable_tf32_matmul": False}, "0.5.23")
    assert argv == ["--model-path", "/m", "--no-enable-tf32-matmul"]
    assert render.to_argv({"model_path": "/m", "enable_tf32_matmul": True}, "0.5.23")[-1] == "--enable-tf32-matmul"


def test_table_is_parsed_lazily():
    """Importing the flag module parses nothing (modules import it on every run)."""
    import subprocess
    import sys

    code = ("import sys; sys.path.insert(0, %r); "
            "from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import flags, resolve, render; "
            "print(bool(flags._TABLE)); flags.FLAGS['tp_size']; print(bool(flags._TABLE))" % str(REPO_COLLECTIONS))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True"]


def test_suggestions():
    assert flags.suggest_field("tp") == "tp_size"
    assert flags.suggest_field("--tensor-parallel-size") == "tp_size"
    assert flags.suggest_field("speculative-num-steps") == "speculative_num_steps"
    assert flags.suggest_field("zzzz") is None


# ---------------------------------------------------------------------------
# to_argv
# ---------------------------------------------------------------------------
def test_to_argv_spellings_and_order():
    args = {"tp_size": 8, "model_path": "/m", "host": "0.0.0.0", "port": 30000, "enable_metrics": True,
            "trust_remote_code": False, "revision": None, "mem_fraction_static": 0.85,
            "speculative_algorithm": "EAGLE", "speculative_num_draft_tokens": 16, "dist_init_addr": "10.0.0.1:5000"}
    # model_path first, then by field name
    assert render.to_argv(args) == [
        "--model-path", "/m", "--dist-init-addr", "10.0.0.1:5000", "--enable-metrics", "--host", "0.0.0.0",
        "--mem-fraction-static", "0.85", "--port", "30000", "--speculative-algorithm", "EAGLE",
        "--speculative-num-draft-tokens", "16", "--tp-size", "8",
    ]


def test_to_argv_lists_json_and_dash_values():
    argv = render.to_argv({"lora_paths": ["a=/x", {"lora_name": "b", "lora_path": "/y"}], "return_aux_hidden_state_layer_ids": [],
                           "json_model_override_args": {"rope_scaling": {"factor": 2}}, "api_key": "-secret",
                           "config": "/etc/sglang.yaml"}, "0.5.23")
    assert argv == ["--api-key=-secret", "--config", "/etc/sglang.yaml",
                    "--json-model-override-args", '{"rope_scaling":{"factor":2}}',
                    "--lora-paths", "a=/x", '{"lora_name":"b","lora_path":"/y"}']
    with pytest.raises(ValueError, match="two tokens"):
        render.to_argv({"config": "-x.yaml"})


def test_to_argv_secrets_omit():
    args = {"model_path": "/m", "api_key": "k1", "admin_api_key": "k2", "tp_size": 2}
    assert render.to_argv(args, "0.5.10", secrets="omit") == ["--model-path", "/m", "--tp-size", "2"]
    assert "k2" in render.to_argv(args, "0.5.10")
    with pytest.raises(ValueError, match="secrets must be"):
        render.to_argv(args, secrets="mask")


@pytest.mark.parametrize("args, version, fragment", [
    ({"tp": 8}, "0.5.23", "unknown SGLang argument 'tp'; did you mean 'tp_size' (--tp-size)?"),
    ({"speculative_num_draft_token": 16}, "0.5.23", "did you mean 'speculative_num_draft_tokens'"),
    ({"qqqqq": 1}, "0.5.23", "keys are SGLang field names"),
    ({"config": "/c.yaml"}, "0.5.1", "needs SGLang 0.5.10 or newer"),
    ({"speculative_adaptive": True}, "0.5.10", "'speculative_adaptive' (--speculative-adaptive) needs SGLang 0.5.23"),
    ({"cuda_graph_max_bs": 8}, "0.5.23", "use 'cuda_graph_max_bs_decode' instead"),
    ({"speculative_num_steps": "x"}, "0.5.23", "invalid int value"),
    ({"port": True}, "0.5.23", "invalid int value"),
    ({"mem_fraction_static": float("nan")}, "0.5.23", "finite number"),
    (["--tp-size", "8"], "0.5.23", "must be a dict"),
])
def test_to_argv_errors(args, version, fragment):
    with pytest.raises(ValueError) as err:
        render.to_argv(args, version)
    assert fragment in str(err.value)


def test_to_argv_false_and_gated_false_are_omitted():
    assert render.to_argv({"speculative_adaptive": False, "cuda_graph_max_bs": None}, "0.5.10") == []
    assert render.to_argv({"cuda_graph_max_bs": 8}, "0.5.10") == ["--cuda-graph-max-bs", "8"]


# ---------------------------------------------------------------------------
# to_config_yaml
# ---------------------------------------------------------------------------
def sglang_config_to_argv(text):
    """SGLang's config merger as described in sglang-rules.md §12 (store_true true only, lists expand, dicts as JSON)."""
    argv = []
    for key, value in yaml.safe_load(text).items():
        if isinstance(value, bool):
            if value:
                argv.append("--" + key)
        elif isinstance(value, list):
            argv.append("--" + key)
            argv.extend(str(v) for v in value)
        elif isinstance(value, dict):
            argv.extend(["--" + key, json.dumps(value)])
        else:
            argv.extend(["--" + key, str(value)])
    return argv


def test_to_config_yaml_round_trip():
    args = {"model_path": "/m", "api_key": 'we"ird: #key\n\t\u2028\x01é😀', "tp_size": 4, "enable_metrics": True,
            "skip_server_warmup": False, "served_model_name": None, "mem_fraction_static": 0.8,
            "return_aux_hidden_state_layer_ids": [3, 7], "json_model_override_args": {"a": [1, "x"]},
            "watchdog_timeout": 600, "log_level": "yes", "revision": "0123", "host": ""}
    text = render.to_config_yaml(args, "0.5.23")
    loaded = yaml.safe_load(text)
    assert loaded["api-key"] == args["api_key"]
    assert loaded["tp-size"] == 4 and loaded["enable-metrics"] is True and loaded["mem-fraction-static"] == 0.8
    assert loaded["return-aux-hidden-state-layer-ids"] == [3, 7]
    assert json.loads(loaded["json-model-override-args"]) == {"a": [1, "x"]}
    assert loaded["log-level"] == "yes" and loaded["revision"] == "0123" and loaded["host"] == ""
    assert "skip-server-warmup" not in loaded and "served-model-name" not in loaded
    assert sglang_config_to_argv(text) == render.to_argv(dict(args), "0.5.23")
    assert 'json-model-override-args: "{\\"a\\":[1,\\"x\\"]}"' in text.splitlines()


def test_to_config_yaml_json_text_and_empty():
    assert render.to_config_yaml({"json_model_override_args": '{"b": 2}', "lora_paths": None}) == \
        'json-model-override-args: "{\\"b\\": 2}"\n'
    assert yaml.safe_load(render.to_config_yaml({})) == {}
    assert render.to_config_yaml({"return_aux_hidden_state_layer_ids": []}) == "{}\n"


@pytest.mark.parametrize("args, version, fragment", [
    ({"api_key": "k"}, "0.5.1", "needs SGLang 0.5.10"),
    ({"config": "/x.yaml"}, None, "cannot be written to a --config file"),
    ({"lora_paths": ["a"]}, None, "cannot be written to a --config file"),
    ({"speculative_adaptive": True}, "0.5.10", "needs SGLang 0.5.23"),
    ({"bogus": 1}, None, "unknown SGLang argument 'bogus'"),
])
def test_to_config_yaml_errors(args, version, fragment):
    with pytest.raises(ValueError) as err:
        render.to_config_yaml(args, version)
    assert fragment in str(err.value)


def test_yaml_quote_is_loadable_for_awkward_strings():
    for text in ["", "null", "true", "- x", "a: b", "'", '"', "\\", "\x7f\x85", "\ufeffbom", "\U0001F600", "\ud800"]:
        assert yaml.safe_load("k: " + render.yaml_quote(text))["k"] == text


# ---------------------------------------------------------------------------
# explain and log patterns
# ---------------------------------------------------------------------------
def test_explain_incident_exact():
    expected = ("speculative_num_draft_tokens: intended 16, running 2 — SGLang sets it to num_steps + 1 when "
                "speculative_eagle_topk == 1; set speculative_num_steps: 15")
    assert engine.explain("speculative_num_draft_tokens", 16, 2, "0.5.23") == expected
    assert engine.explain("speculative_num_draft_tokens", 16, 2, "0.5.23", args=INCIDENT) == expected


@pytest.mark.parametrize("arg, intended, running, version, args, fragment", [
    ("max_running_requests", None, 48, "0.5.23", None, "intended unset, running 48 — SGLang resets"),
    ("speculative_eagle_topk", 4, 10, "0.5.23", {"speculative_algorithm": "NGRAM"},
     "set speculative_ngram_max_bfs_breadth: 4"),
    ("speculative_eagle_topk", 4, 1, "0.4.6", None, "page_size: 1"),
    ("speculative_algorithm", "NEXTN", "EAGLE", "0.5.23", None, "alias"),
    ("speculative_algorithm", "eagle", "EAGLE", "0.5.23", None, "upper-cases"),
    ("speculative_algorithm", "EAGLE", "FROZEN_KV_MTP", "0.5.23", None, "Gemma4"),
    ("speculative_algorithm", "EAGLE3", None, "0.5.23", None, "aux_hidden_states"),
    ("speculative_algorithm", "EAGLE", "EAGLE3", "0.5.23", None, "no known SGLang 0.5.23 rule"),
    ("disable_overlap_schedule", False, True, "0.5.1", None, "overlap scheduler off"),
    ("enable_mixed_chunk", True, False, "0.4.10", None, "drop enable_mixed_chunk"),
    ("speculative_num_draft_tokens", None, 4, "0.5.23", None, "set speculative_num_draft_tokens to"),
    ("tp_size", 8, 4, "0.5.23", None, "check the server log for a warning naming --tp-size"),
    ("made_up", 1, 2, "0.5.23", None, "--made-up"),
    ("speculative_num_steps", 3, 1, "0.5.23",
     {"speculative_algorithm": "DFLASH", "speculative_draft_model_path": "/d"}, "DFLASH forces it to 1"),
    ("speculative_num_draft_tokens", 16, 4, "0.5.23",
     {"speculative_algorithm": "EAGLE", "speculative_adaptive": True, "speculative_num_steps": 3}, "num_steps + 1"),
    # the effective args say steps 15, yet the server runs 2: the usual rule still explains it
    ("speculative_num_draft_tokens", 16, 2, "0.5.23", {"speculative_algorithm": "EAGLE", "bogus": 1,
                                                       "speculative_num_steps": 15, "speculative_eagle_topk": 1},
     "num_steps + 1 when speculative_eagle_topk == 1; set speculative_num_steps: 15"),
    ("speculative_num_draft_tokens", 8, 2, "0.5.23", {"speculative_algorithm": "EAGLE", "speculative_eagle_topk": 4,
                                                      "speculative_num_steps": 5},
     "no known SGLang 0.5.23 rule"),
    ("max_running_requests", None, 48, "0.5.23", {"speculative_algorithm": "EAGLE"}, "resets an unset"),
    ("max_running_requests", 64, 32, "0.5.23", None, "no known SGLang"),
    ("speculative_draft_model_path", None, "/m", "0.5.23", {"model_path": "/m"}, "uses the model path"),
    ("speculative_draft_model_revision", None, "main", "0.5.23", None, "revision main"),
    ("speculative_adaptive", True, False, "0.5.23", None, "switched adaptive mode off"),
    ("enable_multi_layer_eagle", None, True, "0.5.23", None, "multi-layer EAGLE on"),
    ("speculative_eagle_topk", 4, 2, "0.5.23", None, "no known SGLang"),
])
def test_explain_variants(arg, intended, running, version, args, fragment):
    line = engine.explain(arg, intended, running, version, args=args)
    assert line.startswith("%s: intended" % arg) and "\n" not in line
    assert fragment in line


def test_explain_masks_secrets():
    line = engine.explain("api_key", "s3cret", "other", "0.5.23")
    assert "s3cret" not in line and "other" not in line and "intended ********, running ********" in line


def test_explain_covers_every_rule():
    for rule in rules.BY_ID:
        assert rules.rule_text(rule, "speculative_num_steps", 3, 1)


def test_override_log_patterns():
    for pattern in rules.log_patterns():
        assert pattern["arg"] in flags.FLAGS and pattern["rule"] in rules.BY_ID
        assert set(pattern["versions"]) <= set(versions.DOCUMENTED_VERSIONS) and pattern["text"]
        assert pattern["doc"] == rules.doc_ref(pattern["rule"])
    texts = [p["text"] for p in rules.log_patterns()]
    assert LOG_TOPK1 in texts
    log = ("[2025-01-01] WARNING server_args.py:3075: " + LOG_TOPK1 + "\n"
           "INFO unrelated\n"
           "WARNING Overlap scheduler is disabled because of using eagle speculative decoding.\n")
    found = rules.scan_override_log(log, "0.5.1")
    assert [(f["arg"], f["rule"]) for f in found] == [
        ("speculative_num_draft_tokens", "eagle.topk1_draft_tokens"),
        ("disable_overlap_schedule", "spec.overlap_schedule_off")]
    assert found[0]["line"].endswith(LOG_TOPK1)
    assert [f["arg"] for f in rules.scan_override_log(log, "0.5.23")] == ["speculative_num_draft_tokens"]
    assert len(rules.scan_override_log(log)) == 2


def test_every_logged_adjustment_has_a_log_pattern():
    """Each log line the engine emits for a changed value can be found by scan_override_log."""
    for case in CASES:
        result = run_case(case)
        for adj in changing(result):
            if adj["log"] and adj["rule"] not in ("model.multi_layer_eagle",):
                assert rules.scan_override_log(adj["log"]), (case["id"], adj)


# ---------------------------------------------------------------------------
# Module hygiene (runs on targets: stdlib only, no print/assert/sys.exit)
# ---------------------------------------------------------------------------
MODULE_FILES = ["versions.py", "flags.py", "rules.py", "resolve.py", "render.py"]
OWN_PACKAGE = "ansible_collections"


@pytest.mark.parametrize("name", MODULE_FILES)
def test_module_hygiene(name):
    """Target-side code: stdlib (and the package itself) only, no print/assert/sys.exit, short lines."""
    path = PACKAGE_DIR / name
    tree = ast.parse(path.read_text())
    imports = set()
    for node in ast.walk(tree):
        assert not isinstance(node, ast.Assert)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in ("print", "exit")
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            assert (node.value.id, node.attr) != ("sys", "exit")
        if isinstance(node, ast.Import):
            imports.update(a.name.split(".")[0] for a in node.names)
        if isinstance(node, ast.ImportFrom):
            imports.add(node.module.split(".")[0])
    assert imports <= {"__future__", "difflib", "json", "math", "re", OWN_PACKAGE}
    assert "from __future__ import annotations" in path.read_text()
    assert "shared/docs" not in path.read_text() and "sglang.md" not in path.read_text()
    for line in path.read_text().splitlines():
        assert len(line) <= 160
