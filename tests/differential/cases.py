"""Configurations for the differential test: every documented rule, plus seeded random combinations.

``generate(version, count, seed)`` returns cases ``{"id", "gpu", "model", "args", "env", "draft"}``:
``gpu`` is ``"sm90"`` (an H200) or ``"sm100"`` (a B200); ``model`` one of MODELS (local
directories holding a config.json only, written by ``write_models``); ``args`` SGLang field
names to values (the model path is filled in by the driver). The same seed gives the same
cases on every machine.
"""
from __future__ import annotations

import json
import pathlib
import random
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[0] / "unit" / "plugins"))

GPUS = {
    "sm90": {"name": "NVIDIA H200", "compute_capability": "9.0", "memory_mib": 143771, "count": 8},
    "sm100": {"name": "NVIDIA B200", "compute_capability": "10.0", "memory_mib": 183359, "count": 8},
}

_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "torch_dtype": "bfloat16",
    "hidden_act": "silu", "tie_word_embeddings": False, "head_dim": 128,
}
_QWEN2 = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
    "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4, "vocab_size": 152064,
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "torch_dtype": "bfloat16",
    "hidden_act": "silu", "tie_word_embeddings": False, "sliding_window": 131072, "use_sliding_window": False,
}
_DSV3_TEXT = {
    "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_attention_heads": 128,
    "num_hidden_layers": 61, "num_key_value_heads": 128, "vocab_size": 129280, "max_position_embeddings": 163840,
    "rms_norm_eps": 1e-06, "rope_theta": 10000, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 256, "n_shared_experts": 1,
    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1, "n_group": 8, "topk_group": 4,
    "routed_scaling_factor": 2.5, "norm_topk_prob": True, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
    "num_nextn_predict_layers": 1, "hidden_act": "silu", "torch_dtype": "bfloat16", "tie_word_embeddings": False,
}
_DSV3 = dict(_DSV3_TEXT, architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3")
_KIMI_K25 = {
    "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
    "text_config": dict(_DSV3_TEXT, architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3",
                        vocab_size=163840, num_attention_heads=64, num_key_value_heads=64, n_routed_experts=384,
                        first_k_dense_replace=1, rope_theta=50000.0),
    "vision_config": {"patch_size": 14, "hidden_size": 1152, "num_hidden_layers": 27, "num_attention_heads": 16},
    "media_placeholder_token_id": 163605, "pad_token_id": 163839, "torch_dtype": "bfloat16",
}
_EAGLE3_DRAFT = dict(_LLAMA, architectures=["LlamaForCausalLMEagle3"], num_hidden_layers=1, draft_vocab_size=32000)

MODELS = {
    "llama": _LLAMA,
    "qwen2": _QWEN2,
    "dsv3": _DSV3,
    "kimi": _KIMI_K25,
}
DRAFTS = {"eagle3": _EAGLE3_DRAFT}
ARCH = dict((k, v["architectures"][0]) for k, v in MODELS.items())


def write_models(root):
    """Write the model and draft directories (config.json only) under ``root``; returns {key: path}."""
    root = pathlib.Path(root)
    paths = {}
    for key, config in list(MODELS.items()) + list(DRAFTS.items()):
        path = root / key
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True))
        paths[key] = str(path)
    return paths


ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "eagle", None)
BACKENDS = (None, None, None, "fa3", "flashinfer", "triton", "trtllm_mha", "flashmla")
PAGE_SIZES = (None, None, 1, 16, 32, 64)


def _spec_triple(rng):
    """steps/topk/draft: all three, none, or the inconsistent shapes SGLang refuses."""
    shape = rng.choice(("all", "all", "all", "none", "none", "steps_only", "no_steps", "topk1"))
    steps = rng.choice((1, 2, 3, 5, 7))
    topk = rng.choice((1, 1, 2, 4, 8))
    draft = rng.choice((2, 4, 8, 16))
    if shape == "all":
        return {"speculative_num_steps": steps, "speculative_eagle_topk": topk, "speculative_num_draft_tokens": draft}
    if shape == "topk1":
        return {"speculative_num_steps": steps, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": draft}
    if shape == "steps_only":
        out = {"speculative_num_steps": steps}
        if rng.random() < 0.5:
            out["speculative_num_draft_tokens"] = draft
        return out
    if shape == "no_steps":
        return {"speculative_eagle_topk": topk, "speculative_num_draft_tokens": draft}
    return {}


def random_case(rng, index, release=None):
    model = rng.choice(tuple(MODELS))
    gpu = rng.choice(tuple(GPUS))
    algorithm = rng.choice(ALGORITHMS)
    if release in ("0.4.6", "0.4.10", "0.5.1") and algorithm in ("STANDALONE", "NGRAM", "eagle") and rng.random() < 0.8:
        algorithm = rng.choice(("EAGLE", "EAGLE3", "NEXTN"))  # mostly names the old parser accepts
    if release in ("0.4.6", "0.4.10", "0.5.1") and model == "kimi" and rng.random() < 0.7:
        model = rng.choice(("llama", "qwen2", "dsv3"))  # Kimi-K2.5 checkpoints need 0.5.10
    args = {}
    draft = None
    if algorithm is not None:
        args["speculative_algorithm"] = algorithm
        args.update(_spec_triple(rng))
        if algorithm.upper() in ("EAGLE", "EAGLE3", "STANDALONE") and model in ("llama", "qwen2") and rng.random() < 0.8:
            draft = "eagle3"
    backend = rng.choice(BACKENDS)
    if backend:
        args["attention_backend"] = backend
    page = rng.choice(PAGE_SIZES)
    if page:
        args["page_size"] = page
    if rng.random() < 0.3:
        args["max_running_requests"] = rng.choice((8, 32, 64))
    if rng.random() < 0.2:
        args["disable_overlap_schedule"] = True
    if rng.random() < 0.15:
        args["enable_mixed_chunk"] = True
    roll = rng.random()
    if roll < 0.15:
        args["enable_dp_attention"] = True
        args["dp_size"] = rng.choice((2, 4, 8))
        args["tp_size"] = 8
    elif roll < 0.25:
        args["tp_size"] = rng.choice((2, 4, 8))
    elif roll < 0.33:
        args["pp_size"] = 2
        args["tp_size"] = 4
    env = {}
    if rng.random() < 0.1:
        env["SGLANG_ENABLE_SPEC_V2"] = "1"
    return {"id": "random-%03d" % index, "gpu": gpu, "model": model, "args": args, "env": env, "draft": draft}


def rule_cases():
    """The shared rule table (tests/unit/plugins/sglang_cases.py) as differential cases, per documented release."""
    from sglang_cases import CASES

    by_arch = dict((v, k) for k, v in ARCH.items())
    out = []
    for case in CASES:
        arch = case.get("arch")
        if case.get("draft_arch") or arch not in by_arch:
            continue  # needs an architecture the test has no config for
        args = dict(case["args"])
        args.pop("model_path", None)
        draft = None
        if args.get("speculative_draft_model_path"):
            if arch == "DeepseekV3ForCausalLM":
                draft = "dsv3"
            else:
                draft = "eagle3"
        args.pop("speculative_draft_model_path", None)
        if any(str(v).startswith("/") for v in args.values() if isinstance(v, str)):
            continue  # another file the case names (adaptive config, lora path, ...)
        out.append({"id": "rule-" + case["id"], "version": case["version"], "gpu": "sm90",
                    "model": by_arch[arch], "args": args, "env": dict(case.get("env") or {}), "draft": draft})
    return out


def _release_of(version):
    return ".".join(str(version).split(".")[:3])


def targeted_cases():
    """One case per class of difference found against the real code (sglang-rules.md §11 and §9)."""
    out = []
    eagle = {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 3, "speculative_eagle_topk": 4,
             "speculative_num_draft_tokens": 8}
    for gpu in GPUS:
        out.append({"id": "gpu-default-backend-topk4-page16-" + gpu, "gpu": gpu, "model": "llama",
                    "args": dict(eagle, page_size=16), "env": {}, "draft": "eagle3"})
        out.append({"id": "gpu-trtllm-topk1-" + gpu, "gpu": gpu, "model": "llama",
                    "args": dict(eagle, speculative_eagle_topk=1, attention_backend="trtllm_mha"), "env": {},
                    "draft": "eagle3"})
        out.append({"id": "gpu-default-backend-plain-" + gpu, "gpu": gpu, "model": "qwen2", "args": {}, "env": {},
                    "draft": None})
        out.append({"id": "dp-attention-" + gpu, "gpu": gpu, "model": "dsv3",
                    "args": {"enable_dp_attention": True, "dp_size": 8, "tp_size": 8}, "env": {}, "draft": None})
        out.append({"id": "pp-eagle-" + gpu, "gpu": gpu, "model": "llama",
                    "args": dict(eagle, speculative_eagle_topk=1, pp_size=2), "env": {}, "draft": "eagle3"})
        out.append({"id": "flashmla-page-" + gpu, "gpu": gpu, "model": "dsv3",
                    "args": {"attention_backend": "flashmla", "speculative_algorithm": "EAGLE"}, "env": {}, "draft": None})
        out.append({"id": "unset-topk-page16-" + gpu, "gpu": gpu, "model": "llama",
                    "args": {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3, "page_size": 16},
                    "env": {}, "draft": "eagle3"})
        out.append({"id": "mtp-no-draft-" + gpu, "gpu": gpu, "model": "dsv3",
                    "args": {"speculative_algorithm": "EAGLE"}, "env": {}, "draft": None})
        out.append({"id": "kimi-mtp-" + gpu, "gpu": gpu, "model": "kimi",
                    "args": {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
                             "speculative_num_draft_tokens": 16}, "env": {}, "draft": "eagle3"})
    out.append({"id": "incident", "gpu": "sm90", "model": "llama",
                "args": {"speculative_algorithm": "EAGLE3", "speculative_eagle_topk": 1, "speculative_num_steps": 1,
                         "speculative_num_draft_tokens": 16}, "env": {}, "draft": "eagle3"})
    return out


def generate(version, count=300, seed=20261201):
    """At least ``count`` cases for ``version``: the rules, the targeted classes, then random ones."""
    release = _release_of(version)
    cases = [c for c in rule_cases() if _release_of(c["version"]) == release]
    cases += targeted_cases()
    rng = random.Random("%s-%s" % (seed, release))
    index = 0
    while len(cases) < count:
        cases.append(random_case(rng, index, release))
        index += 1
    for case in cases:
        case["version"] = version
    return cases
