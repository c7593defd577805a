"""Argument resolution of the fake server: the simulator's OWN implementation.

It reproduces the rules of docs/reference/sglang-rules.md for the emulated releases
0.4.6.post5, 0.4.10.post2, 0.5.1, 0.5.10 and 0.5.23, written after the real
code paths (cited per function) so that the same inputs fail in the same way:
ValueErrors with the real messages, the bare ``AssertionError`` when topk or
draft tokens are given without steps, the ``TypeError`` of ``None > 1`` when
steps are given without topk, and the real warning lines (logged with the
``[timestamp] message`` format of the real logger).

It must never import the collection (``plugins/module_utils/sglang/``):
the collection's resolver is cross-checked against this server.

Not modelled: out-of-tree platforms, ROCm auto rejection sampling (§1.3 step
11), IQuestQ1 strict draft checks (step 8), the feature constraints of §1.8
other than the attention-backend ones, adaptive configs from
``--speculative-adaptive-config`` files (the built-in candidate table is used),
UNO tree mode.
"""
from __future__ import annotations

import json
import logging
import os
import random

logger = logging.getLogger("sglang.srt.server_args")

# §1.3 step 7 / 0.5.10 :3029-3051: architectures whose MTP layer is in the checkpoint.
MTP_ARCHS_0523 = (
    "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV4ForCausalLM",
    "Glm4MoeForCausalLM", "Glm4MoeLiteForCausalLM", "GlmMoeDsaForCausalLM",
    "BailingMoeForCausalLM", "BailingMoeV2ForCausalLM", "BailingMoeV2_5ForCausalLM",
    "MistralLarge3ForCausalLM", "PixtralForConditionalGeneration",
    "HYV3ForCausalLM", "HYV4ForCausalLM", "Qwen4ExpForConditionalGeneration",
)
MTP_ARCHS_0510 = MTP_ARCHS_0523[:2] + MTP_ARCHS_0523[3:11]
NO_MTP_WARNING_ARCHS = ("MistralLarge3ForCausalLM", "PixtralForConditionalGeneration")
GEMMA4_DRAFT_ARCHS = ("Gemma4AssistantForCausalLM", "Gemma4UnifiedAssistantForCausalLM")
MLA_ARCH_PREFIXES = ("Deepseek", "KimiK2", "Glm4Moe", "GlmMoeDsa", "MistralLarge3")

BUILTIN_ALGORITHMS = ("DFLASH", "UNO", "DSPARK", "EAGLE", "EAGLE3", "FROZEN_KV_MTP",
                      "STANDALONE", "NGRAM")
MIXED_CHUNK_ALGORITHMS = ("EAGLE", "EAGLE3", "DFLASH", "DSPARK")
ADAPTIVE_CANDIDATE_STEPS = sorted({1, 3, 5, 7} | {0, 1, 3} | {0, 1} | {0})  # [0, 1, 3, 5, 7]

MAX_RUNNING_WARNING = (
    "Max running requests is reset to 48 for speculative decoding. You can override "
    "this by explicitly setting --max-running-requests.")
TOPK1_WARNING = ("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 "
                 "when speculative_eagle_topk == 1")


class ResolveContext:
    """What resolution needs besides the arguments."""

    def __init__(self, version_tuple, arch, draft_arch=None, gpu_name="NVIDIA H200",
                 gpu_total_mib=143771, enable_spec_v2=False, draft_config=None,
                 model_dir=None, capability=None, model_type=None):
        self.vt = tuple(version_tuple)
        self.model_type = model_type
        self.capability = tuple(capability) if capability else None
        self.arch = arch
        self.draft_arch = draft_arch
        self.draft_config = draft_config or {}
        self.gpu_name = gpu_name or ""
        self.gpu_total_mib = int(gpu_total_mib or 143771)
        self.enable_spec_v2 = enable_spec_v2
        self.model_dir = model_dir

    @property
    def is_hopper(self) -> bool:
        if self.capability:
            return self.capability[0] == 9
        return any(t in self.gpu_name for t in ("H100", "H200", "H800", "H20", "GH200"))

    @property
    def is_sm100(self) -> bool:
        if self.capability:
            return self.capability[0] == 10
        return any(t in self.gpu_name for t in ("B200", "GB200", "B300", "GB300"))


def read_model_config(path: str) -> dict:
    """``<path>/config.json`` as a dict; OSError shaped like transformers' when missing."""
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isdir(path):
        raise OSError(
            f"Can't load the configuration of '{path}'. If you were trying to load it from "
            f"'https://huggingface.co/models', make sure you don't have a local directory "
            f"with the same name. Otherwise, make sure '{path}' is the correct path to a "
            f"directory containing a config.json file")
    if not os.path.isfile(cfg_path):
        raise OSError(
            f"{path} does not appear to have a file named config.json. Checkout "
            f"'https://huggingface.co/{path}/tree/None' for available files.")
    with open(cfg_path, "r", encoding="utf-8") as fh:
        try:
            data = json.load(fh)
        except ValueError as e:
            raise OSError(f"It looks like the config file at '{cfg_path}' is not a valid "
                          f"JSON file.") from e
    if not isinstance(data, dict):
        raise OSError(f"It looks like the config file at '{cfg_path}' is not a valid JSON file.")
    return data


def architecture_of(config: dict) -> str:
    archs = config.get("architectures") or []
    if not archs:
        raise ValueError("The model config has no 'architectures' entry; cannot determine "
                         "the model architecture.")
    return archs[0]


def _is_mla(arch: str) -> bool:
    return arch.startswith(MLA_ARCH_PREFIXES)


def attn_dp_enabled(sa) -> bool:
    if sa.values.get("enable_dp_attention"):
        return True
    return (sa.values.get("attn_dp_size") or 1) > 1


# --------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------
def resolve(sa, ctx: ResolveContext) -> None:
    """Resolve ``sa`` in place, logging the real warnings; raises like SGLang."""
    _common_defaults(sa, ctx)
    _unreadable_checkpoint(sa, ctx)
    _attention_dp_width(sa, ctx)
    if ctx.vt >= (0, 5, 10):
        _default_attention_backend(sa, ctx)  # runs before the speculative hook (§1.8)
    _backend_page_size(sa, ctx)
    if (sa.values.get("pp_size") or 1) > 1:
        sa.disable_overlap_schedule = True
        logger.warning("Pipeline parallelism is incompatible with overlap schedule.")
    if ctx.vt >= (0, 5, 23):
        if sa.enable_return_aux_hidden_states and sa.speculative_algorithm is not None:
            # pipeline.py:94 / validation_hook.py:697-753
            sa.speculative_algorithm = None
        handle_speculative_decoding_0523(sa, ctx)
        _validate_0523(sa, ctx)
    elif ctx.vt >= (0, 5, 10):
        handle_speculative_decoding_0510(sa, ctx)
    else:
        handle_speculative_decoding_legacy(sa, ctx)
        if sa.attention_backend is None:
            sa.attention_backend = "flashinfer"
    _late_defaults(sa, ctx)


def _common_defaults(sa, ctx):
    if sa.served_model_name is None:
        sa.served_model_name = sa.model_path  # serving_hook.py:642-646
    if sa.tokenizer_path is None:
        sa.tokenizer_path = sa.model_path
    if sa.device is None:
        sa.device = "cuda"
    if sa.random_seed is None:
        sa.random_seed = random.randint(0, 1 << 30)
    if sa.values.get("enable_amd_monokernel") == "amd":
        sa.enable_amd_monokernel = True
    if ctx.vt >= (0, 5, 23) and sa.values.get("enable_dp_attention"):
        # Deprecated flag (0.5.23 parallel_hook.py handle_deprecated_dp_attention): the
        # attention-DP width moves from dp_size to attn_dp_size, and dp_size counts replicas again.
        if (sa.values.get("attn_dp_size") or 1) == 1:
            sa.attn_dp_size = sa.dp_size
            sa.dp_size = 1
        sa.enable_dp_attention = False  # /server_info reports attn_dp_size > 1 again at the end
    if ctx.vt >= (0, 5, 23) and sa.served_model_name and ":" in sa.served_model_name:
        raise ValueError(  # validation_hook.py:214-219
            f"--served-model-name must not contain ':' (got {sa.served_model_name!r}).")


def _late_defaults(sa, ctx):
    if sa.page_size is None:
        sa.page_size = 1
    if sa.mem_fraction_static is None:
        sa.mem_fraction_static = auto_mem_fraction_static(sa, ctx)
    if sa.values.get("chunked_prefill_size") is None:
        sa.chunked_prefill_size = 8192 if ctx.gpu_total_mib > 60 * 1024 else 4096
    if sa.values.get("cuda_graph_max_bs") is None:
        sa.cuda_graph_max_bs = 256 if sa.speculative_algorithm is None else 64
    if ctx.vt >= (0, 5, 23):
        sa.enable_dp_attention = attn_dp_enabled(sa)


def auto_mem_fraction_static(sa, ctx) -> float:
    """Approximation of ``_handle_gpu_memory_settings`` (0.5.10 server_args.py:1141-1325)."""
    gpu_mem = float(ctx.gpu_total_mib)
    reserved = 512.0
    reserved += max(sa.values.get("chunked_prefill_size") or 8192, 2048) * 1.5
    reserved += (sa.values.get("cuda_graph_max_bs") or 256) * 2
    reserved += (sa.tp_size or 1) * (sa.values.get("pp_size") or 1) / 8 * 1024
    if sa.speculative_algorithm is not None:
        reserved += 1.5 * 1024
    if attn_dp_enabled(sa):
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mem - reserved) / gpu_mem, 3)


def _is_no_spec_infer_or_topk_one(sa) -> bool:
    # utils/common.py:3960-3966
    return sa.speculative_eagle_topk is None or (
        sa.speculative_eagle_topk == 1 and (sa.page_size == 1 or sa.page_size is None))


# The checkpoints a release's transformers cannot read (model_type -> first release that can).
UNREADABLE_BEFORE = {"kimi_k25": (0, 5, 10)}
# DeepSeek-style models get trtllm_mla on SM100 from their model override (0.5.10+).
TRTLLM_MLA_SM100_ARCHS = ("DeepseekV3ForCausalLM", "KimiK25ForConditionalGeneration",
                          "MistralLarge3ForCausalLM", "PixtralForConditionalGeneration")


def _unreadable_checkpoint(sa, ctx):
    """0.5.1 reads the HF config in every start, 0.4.x only for EAGLE speculation."""
    first = UNREADABLE_BEFORE.get(ctx.model_type)
    if first is None or ctx.vt >= first:
        return
    if ctx.vt >= (0, 5, 1) or str(sa.speculative_algorithm or "").upper() in ("EAGLE", "EAGLE3", "NEXTN"):
        raise ValueError(
            f"The checkpoint you are trying to load has model type `{ctx.model_type}` but Transformers "
            "does not recognize this architecture. This could be because of an issue with the checkpoint, "
            "or because your version of Transformers is out of date.")


def _attention_dp_width(sa, ctx):
    """Attention-DP splits the TP group: tp_size must be a multiple of its width."""
    if ctx.vt >= (0, 5, 23):
        width = sa.values.get("attn_dp_size") or 1
        if width <= 1:
            return
    else:
        if not sa.values.get("enable_dp_attention"):
            return
        width = sa.dp_size or 1
        if ctx.vt < (0, 5, 10):
            assert width > 1, "Please set a dp-size > 1. You can use 1 < dp-size <= tp-size "
    assert (sa.tp_size or 1) % width == 0


def _backend_page_size(sa, ctx):
    """Attention backends with a fixed set of page sizes, and the GPUs the TRT-LLM kernels need."""
    vt = ctx.vt
    attention = sa.attention_backend
    prefill = sa.values.get("prefill_attention_backend") or attention
    decode = sa.values.get("decode_attention_backend") or attention
    if attention == "flashmla" or (vt >= (0, 4, 10) and decode == "flashmla"):
        logger.warning("FlashMLA only supports a page_size of 64, change page_size to 64.")
        sa.page_size = 64
    if vt < (0, 5, 23) and (attention == "cutlass_mla" or (vt >= (0, 4, 10) and decode == "cutlass_mla")):
        logger.warning("Cutlass MLA only supports a page_size of 128, change page_size to 128.")
        sa.page_size = 128
    if vt >= (0, 4, 10) and (attention == "trtllm_mla" or (vt >= (0, 5, 1) and decode == "trtllm_mla")):
        if vt < (0, 5, 23) and not ctx.is_sm100:
            raise ValueError("TRTLLM MLA backend is only supported on Blackwell GPUs (SM100). "
                             "Please use a different backend.")
        if vt < (0, 5, 1) and sa.speculative_algorithm is not None:
            raise ValueError("trtllm_mla backend does not support speculative decoding yet.")
        if sa.page_size not in (32, 64):
            logger.warning("TensorRT-LLM MLA only supports page_size of 32 or 64, changing page_size "
                           "from %s to 64.", sa.page_size)
            sa.page_size = 64
    if vt >= (0, 5, 1) and "trtllm_mha" in (attention, prefill, decode):
        if vt < (0, 5, 10) and not ctx.is_sm100:
            raise ValueError("TRTLLM MHA backend is only supported on Blackwell GPUs (SM100). "
                             "Please use a different backend.")
        if (0, 5, 10) <= vt < (0, 5, 23) and prefill == "trtllm_mha" and not ctx.is_sm100:
            raise ValueError("TRTLLM MHA backend for prefill is only supported on Blackwell GPUs (SM100). "
                             "Please use a different prefill backend.")
        sizes = (16, 32, 64, 128) if vt >= (0, 5, 23) else (16, 32, 64)
        if sa.page_size not in sizes:
            logger.warning("TensorRT-LLM MHA only supports page_size of %s, changing page_size from %s to 64.",
                           ", ".join(str(x) for x in sizes), sa.page_size)
            sa.page_size = 64


def _default_attention_backend(sa, ctx):
    """get_default_attn_backend (model_override_base.py:277-325), §1.8."""
    if sa.attention_backend is not None:
        return
    if sa.device == "cpu":
        sa.attention_backend = "torch_native"
        return
    if (ctx.arch in TRTLLM_MLA_SM100_ARCHS and ctx.is_sm100
            and sa.values.get("prefill_attention_backend") is None
            and sa.values.get("decode_attention_backend") is None):
        sa.attention_backend = "trtllm_mla"
        return
    if _is_mla(ctx.arch):
        sa.attention_backend = "fa3" if ctx.is_hopper else ("flashinfer" if ctx.is_sm100
                                                            else "triton")
        return
    if ctx.is_hopper and _is_no_spec_infer_or_topk_one(sa):
        sa.attention_backend = "fa3"
    elif (ctx.is_sm100 and _is_no_spec_infer_or_topk_one(sa)
          and (sa.speculative_algorithm is None or sa.speculative_eagle_topk is not None
               or (ctx.vt >= (0, 5, 23) and str(sa.speculative_algorithm).upper() == "DFLASH"))):
        sa.attention_backend = "trtllm_mha"
    else:
        sa.attention_backend = "flashinfer"


def _attention_backends(sa):
    return (sa.attention_backend, sa.values.get("prefill_attention_backend"),
            sa.values.get("decode_attention_backend"))


def _reset_max_running_requests(sa, with_warning=True):
    if sa.max_running_requests is None:
        sa.max_running_requests = 48
        if with_warning:
            logger.warning(MAX_RUNNING_WARNING)


# --------------------------------------------------------------------------
# 0.5.23: arg_groups/speculative_hook.py
# --------------------------------------------------------------------------
def handle_speculative_decoding_0523(sa, ctx):
    """handle_speculative_decoding (speculative_hook.py:121-284), §1.2."""
    if sa.speculative_draft_model_path is not None and sa.speculative_draft_model_revision is None:
        sa.speculative_draft_model_revision = "main"

    # _speculative_moe_runner_default (overrides.py:1632-1656)
    if sa.speculative_moe_runner_backend is None:
        runner = sa.moe_runner_backend
        if runner == "flashinfer_megamoe":
            runner = "flashinfer_trtllm"
        elif runner and runner.startswith("lora_"):
            runner = "auto"
        sa.speculative_moe_runner_backend = runner

    if sa.speculative_algorithm is not None:
        sa.speculative_algorithm = sa.speculative_algorithm.upper()
    sa.speculative_algorithm = _resolve_speculative_algorithm_alias(
        sa.speculative_algorithm, ctx.draft_arch)

    if sa.speculative_draft_window_size is not None:
        window_size = int(sa.speculative_draft_window_size)
        if window_size <= 0:
            raise ValueError(f"--speculative-draft-window-size must be positive, got {window_size}.")
        if sa.speculative_algorithm not in ("EAGLE", "EAGLE3", "DFLASH"):
            logger.warning(
                "--speculative-draft-window-size has no effect with speculative_algorithm=%s "
                "(honored by DFLASH, Llama EAGLE-3, and the EAGLE/MTP/NEXTN draft-decode path "
                "on the Triton/FlashInfer draft backends).", sa.speculative_algorithm)
    if sa.speculative_draft_sink_size is not None:
        sink_size = int(sa.speculative_draft_sink_size)
        if sink_size < 0:
            raise ValueError(f"--speculative-draft-sink-size must be non-negative, got {sink_size}.")
        if sa.speculative_draft_window_size is None:
            raise ValueError("--speculative-draft-sink-size requires --speculative-draft-window-size.")

    algo = None
    if sa.speculative_algorithm is not None:
        algo = speculative_algorithm_from_string(sa.speculative_algorithm)

    if sa.speculative_adaptive:
        reason = _adaptive_unsupported_reason(sa)
        if reason is not None:
            logger.warning("speculative_adaptive disabled: %s. "
                           "Falling back to static speculative params.", reason)
            sa.speculative_adaptive = False
        if sa.speculative_adaptive:
            _init_adaptive_speculative_params(sa)

    if algo is None:
        return
    if algo == "DFLASH":
        _handle_dflash(sa, ctx)
    elif algo == "UNO":
        _handle_uno(sa, ctx)
    elif algo == "DSPARK":
        _handle_dspark(sa, ctx)
    elif algo == "FROZEN_KV_MTP":
        _handle_frozen_kv_mtp(sa, ctx)
    elif algo in ("EAGLE", "EAGLE3", "STANDALONE"):
        _handle_eagle_family(sa, ctx)
    elif algo == "NGRAM":
        _handle_ngram(sa, ctx)


def _resolve_speculative_algorithm_alias(algorithm, draft_arch):
    """speculative_hook.py:102-116."""
    if algorithm is None:
        return None
    if draft_arch in GEMMA4_DRAFT_ARCHS:
        if algorithm == "EAGLE3":
            raise ValueError(
                f"{draft_arch} draft requires --speculative-algorithm NEXTN or EAGLE; "
                f"got {algorithm}.")
        if algorithm in ("NEXTN", "EAGLE"):
            logger.info("Detected %s draft; promoting --speculative-algorithm %s to FROZEN_KV_MTP.",
                        draft_arch, algorithm)
            return "FROZEN_KV_MTP"
    if algorithm == "NEXTN":
        return "EAGLE"
    return algorithm


def speculative_algorithm_from_string(name):
    """SpeculativeAlgorithm.from_string (spec_info.py:50-65)."""
    upper = name.upper()
    if upper in BUILTIN_ALGORITHMS:
        return upper
    if upper == "NEXTN":
        return "EAGLE"
    raise ValueError(f"Unknown speculative algorithm name: {name}")


def _adaptive_unsupported_reason(sa):
    """adaptive_spec_params.py:56-100."""
    if sa.speculative_algorithm not in ("EAGLE", "EAGLE3"):
        return (f"speculative_algorithm={sa.speculative_algorithm} "
                "(only EAGLE/EAGLE3 are supported)")
    if sa.speculative_eagle_topk is not None and sa.speculative_eagle_topk != 1:
        return f"speculative_eagle_topk={sa.speculative_eagle_topk} (only topk=1 is supported)"
    if attn_dp_enabled(sa):
        return ("attention DP is not supported "
                "(adaptive tier decisions are not synchronized across DP ranks)")
    if sa.values.get("enable_multi_layer_eagle"):
        return ("enable_multi_layer_eagle=True is not supported "
                "(MultiLayerEagleWorkerV2 does not implement adaptive)")
    if sa.values.get("enable_two_batch_overlap"):
        return ("enable_two_batch_overlap=True is not supported "
                "(adaptive state swap would discard the TboAttnBackend wrapper)")
    if sa.values.get("enable_pdmux"):
        return ("enable_pdmux=True is not supported "
                "(adaptive state swap does not update decode_attn_backend_group)")
    return None


def _init_adaptive_speculative_params(sa):
    """speculative_hook.py:1392-1427, §1.5."""
    candidate_steps = list(ADAPTIVE_CANDIDATE_STEPS)
    if sa.speculative_eagle_topk is None:
        sa.speculative_eagle_topk = 1
    if sa.speculative_num_steps is None:
        sa.speculative_num_steps = candidate_steps[len(candidate_steps) // 2]
    if sa.speculative_num_steps not in candidate_steps:
        raise ValueError(
            f"--speculative-num-steps={sa.speculative_num_steps} "
            f"is not in the adaptive config candidate_steps {candidate_steps}. "
            "Pass one of those values.")
    sa.speculative_num_draft_tokens = sa.speculative_num_steps + 1


def _disable_overlap_schedule_for_cpu(sa):
    if sa.device == "cpu" and not sa.disable_overlap_schedule:
        sa.disable_overlap_schedule = True
        logger.warning("Overlap schedule is not implemented for speculative decoding on CPU.")


def _auto_choose_speculative_params_0523(sa, model_arch):
    """speculative_hook.py:1430-1461, §1.6."""
    if sa.speculative_algorithm == "STANDALONE":
        return (3, 1, 4)
    if model_arch in ["LlamaForCausalLM"]:
        return (5, 4, 8)
    elif model_arch in [
        "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM",
        "GptOssForCausalLM", "Glm4MoeForCausalLM", "Glm4MoeLiteForCausalLM",
        "GlmMoeDsaForCausalLM", "BailingMoeForCausalLM", "BailingMoeV2ForCausalLM",
        "BailingMoeV2_5ForCausalLM", "MistralLarge3ForCausalLM",
        "PixtralForConditionalGeneration", "MiMoV2ForCausalLM", "MiMoV2FlashForCausalLM",
    ]:
        return (3, 1, 4)
    elif model_arch in ["Grok1ForCausalLM", "Grok1VForCausalLM"]:
        return (5, 4, 8)
    else:
        return (3, 1, 4)


def _handle_eagle_family(sa, ctx):
    """_handle_eagle_family (speculative_hook.py:1072-1282), §1.3."""
    if sa.speculative_algorithm == "STANDALONE" and attn_dp_enabled(sa):
        raise ValueError(
            "Currently standalone speculative decoding does not support dp attention.")

    _reset_max_running_requests(sa)
    _disable_overlap_schedule_for_cpu(sa)
    if sa.disable_overlap_schedule:
        logger.warning("Non-overlap (synchronous) spec v2 is used for eagle/eagle3/standalone "
                       "speculative decoding.")

    if sa.enable_mixed_chunk and sa.speculative_algorithm not in MIXED_CHUNK_ALGORITHMS:
        sa.enable_mixed_chunk = False
        logger.warning("Mixed chunked prefill is disabled: %s speculative decoding does "
                       "not support it.", sa.speculative_algorithm)

    model_arch = ctx.arch
    if model_arch in MTP_ARCHS_0523:
        if sa.speculative_draft_model_path is None:
            sa.speculative_draft_model_path = sa.model_path
            sa.speculative_draft_model_revision = sa.revision
        elif model_arch not in NO_MTP_WARNING_ARCHS:
            logger.warning("DeepSeek MTP does not require setting speculative_draft_model_path.")

    if not sa.speculative_adaptive and sa.speculative_num_steps is None:
        assert (
            sa.speculative_eagle_topk is None
            and sa.speculative_num_draft_tokens is None
        )
        (
            sa.speculative_num_steps,
            sa.speculative_eagle_topk,
            sa.speculative_num_draft_tokens,
        ) = _auto_choose_speculative_params_0523(sa, model_arch)

    if "trtllm_mha" in _attention_backends(sa):
        if sa.speculative_eagle_topk > 1:
            raise ValueError("trtllm_mha backend only supports topk = 1 for speculative decoding.")

    if sa.speculative_use_rejection_sampling:
        if sa.speculative_algorithm not in ("EAGLE", "EAGLE3"):
            raise NotImplementedError(
                "--speculative-use-rejection-sampling is only supported for "
                "EAGLE / EAGLE3 / NEXTN, not "
                f"speculative_algorithm={sa.speculative_algorithm}.")
        if sa.speculative_eagle_topk != 1:
            raise ValueError("--speculative-use-rejection-sampling requires --speculative-eagle-topk=1.")
        if (sa.speculative_accept_threshold_single != 1.0
                or sa.speculative_accept_threshold_acc != 1.0):
            raise ValueError(
                "--speculative-use-rejection-sampling is incompatible with "
                "--speculative-accept-threshold-single / "
                "--speculative-accept-threshold-acc; rejection sampling ignores "
                "the accept thresholds.")
        logger.info("Rejection sampling is enabled for speculative decoding "
                    "(speculative_use_rejection_sampling=True).")

    if (
        sa.speculative_eagle_topk == 1
        and sa.speculative_num_draft_tokens != sa.speculative_num_steps + 1
    ):
        logger.warning(TOPK1_WARNING)
        sa.speculative_num_draft_tokens = sa.speculative_num_steps + 1

    page_tree_spec_backends = ("flashinfer", "fa3", "triton")
    page_size = 1 if sa.page_size is None else sa.page_size
    if (
        sa.speculative_eagle_topk > 1
        and page_size > 1
        and sa.attention_backend not in page_tree_spec_backends
    ):
        raise ValueError(
            f"speculative_eagle_topk > 1 with page_size > 1 is only supported on "
            f"{page_tree_spec_backends}; got attention_backend="
            f"{sa.attention_backend!r}. Use page_size == 1 or one of those backends.")


def _handle_ngram(sa, ctx):
    """_handle_ngram (speculative_hook.py:1285-1371), §1.4."""
    if sa.device not in ("cuda", "cpu", "xpu"):
        raise ValueError("Ngram speculative decoding only supports CUDA, CPU, or XPU devices.")
    _disable_overlap_schedule_for_cpu(sa)
    _reset_max_running_requests(sa)
    sa.enable_mixed_chunk = False
    sa.speculative_eagle_topk = sa.speculative_ngram_max_bfs_breadth
    if sa.speculative_num_draft_tokens is None:
        sa.speculative_num_draft_tokens = 12
        logger.warning(
            "speculative_num_draft_tokens is set to 12 by default for ngram speculative decoding. "
            "You can override this by explicitly setting --speculative-num-draft-tokens.")
    if sa.speculative_num_steps is None:
        sa.speculative_num_steps = sa.speculative_num_draft_tokens // sa.speculative_eagle_topk
    logger.warning("The mixed chunked prefill are disabled because of "
                   "using ngram speculative decoding.")
    page_size = 1 if sa.page_size is None else sa.page_size
    if sa.speculative_eagle_topk > 1 and page_size > 1 and sa.attention_backend != "flashinfer":
        raise ValueError(
            f"speculative_eagle_topk({sa.speculative_eagle_topk}) > 1 "
            f"with page_size({page_size}) > 1 is unstable "
            "and produces incorrect results for paged attention backends. "
            "This combination is only supported for the 'flashinfer' backend.")
    if attn_dp_enabled(sa):
        raise ValueError("Currently ngram speculative decoding does not support dp attention.")


def _handle_dflash(sa, ctx):
    """_handle_dflash (speculative_hook.py:287-446), §1.7 (simplified)."""
    if not (sa.device.startswith("cuda") or sa.device in ("npu", "xpu")):
        raise ValueError(f"DFLASH speculative decoding is not supported by CudaPlatform on "
                         f"device {sa.device!r}.")
    if (sa.values.get("pp_size") or 1) != 1:
        raise ValueError("Currently DFLASH speculative decoding only supports pp_size == 1.")
    if sa.speculative_draft_model_path is None:
        raise ValueError(
            "DFLASH speculative decoding requires setting --speculative-draft-model-path.")
    for field in ("speculative_num_steps", "speculative_eagle_topk"):
        value = sa.values.get(field)
        if value is not None and int(value) != 1:
            logger.warning("DFLASH only supports %s == 1; overriding %s=%s to 1.", field, field, value)
        sa.values[field] = 1
    block = sa.speculative_dflash_block_size
    if block is not None:
        if int(block) <= 0:
            raise ValueError("DFLASH requires --speculative-dflash-block-size to be positive, "
                             f"got {block}.")
        if (sa.speculative_num_draft_tokens is not None
                and int(sa.speculative_num_draft_tokens) != int(block)):
            raise ValueError(
                "Both --speculative-num-draft-tokens and --speculative-dflash-block-size are set "
                "but they differ. For DFLASH they must match. "
                f"speculative_num_draft_tokens={sa.speculative_num_draft_tokens}, "
                f"speculative_dflash_block_size={block}.")
        sa.speculative_num_draft_tokens = int(block)
    if sa.speculative_num_draft_tokens is None:
        inferred = ctx.draft_config.get("block_size")
        if not isinstance(inferred, int):
            inferred = 16
            logger.warning("speculative_num_draft_tokens is not set; defaulting to %d for DFLASH.",
                           inferred)
        sa.speculative_num_draft_tokens = inferred
    _reset_max_running_requests(sa)


def _handle_dspark(sa, ctx):
    """_handle_dspark (speculative_hook.py:666-883), §1.7 (simplified)."""
    if not sa.device.startswith(("cuda", "npu", "xpu")):
        raise ValueError("DSpark speculative decoding only supports CUDA, NPU or XPU device.")
    if sa.speculative_draft_model_path is None:
        sub = os.path.join(ctx.model_dir or sa.model_path, "dspark")
        if os.path.isfile(os.path.join(sub, "config.json")):
            sa.speculative_draft_model_path = sub
            logger.info("DSpark draft found in the target checkpoint's %s/ subfolder; "
                        "defaulting --speculative-draft-model-path to %s.", "dspark", sub)
        else:
            raise ValueError("DSpark dense speculative decoding requires setting "
                             "--speculative-draft-model-path.")
    for field, label in (("speculative_num_steps", "speculative_num_steps"),
                         ("speculative_eagle_topk", "speculative_eagle_topk")):
        value = sa.values.get(field)
        if value is not None and int(value) != 1:
            logger.warning("DSpark only supports %s == 1; overriding %s=%s to 1.", label, label, value)
        sa.values[field] = 1
    gamma = None
    if sa.speculative_dspark_block_size is not None:
        if int(sa.speculative_dspark_block_size) <= 0:
            raise ValueError("DSpark requires --speculative-dspark-block-size to be positive, "
                             f"got {sa.speculative_dspark_block_size}.")
        gamma = int(sa.speculative_dspark_block_size)
    else:
        g = ctx.draft_config.get("block_size")
        gamma = g if isinstance(g, int) else None
        if gamma is None and sa.speculative_num_draft_tokens is None:
            gamma = 7  # DEFAULT_DSPARK_GAMMA
            logger.warning("DSpark gamma is not set; defaulting to %d.", gamma)
    if gamma is not None:
        verify_window = int(gamma) + 1
        if (sa.speculative_num_draft_tokens is not None
                and int(sa.speculative_num_draft_tokens) != verify_window):
            raise ValueError(
                "DSpark speculative_num_draft_tokens must equal gamma + 1 "
                f"(= {verify_window} for gamma={gamma}), but got "
                f"speculative_num_draft_tokens={sa.speculative_num_draft_tokens}.")
        sa.speculative_num_draft_tokens = verify_window
    if int(sa.speculative_num_draft_tokens) < 2:
        raise ValueError("DSpark speculative_num_draft_tokens must be >= 2 (= gamma + 1), "
                         f"got {sa.speculative_num_draft_tokens}.")
    _reset_max_running_requests(sa)


def _handle_uno(sa, ctx):
    """_handle_uno (speculative_hook.py:449-611), linear mode only."""
    if not sa.device.startswith("cuda"):
        raise ValueError("UNO only supports CUDA.")
    if sa.speculative_draft_model_path is not None:
        raise ValueError("UNO reuses the target model and does not accept "
                         "--speculative-draft-model-path.")
    if sa.uno_lora_path is None:
        raise ValueError("UNO requires --uno-lora-path.")
    verify_width = sa.speculative_num_draft_tokens
    if verify_width is None or int(verify_width) < 1:
        raise ValueError("UNO requires --speculative-num-draft-tokens to be a positive "
                         "integer denoting the linear width or tree verify width Q.")
    for field in ("speculative_num_steps", "speculative_eagle_topk"):
        old_value = sa.values.get(field)
        if old_value not in (None, 1):
            logger.warning("UNO uses %s=1; overriding %s.", field, old_value)
        sa.values[field] = 1
    if (sa.tp_size, sa.values.get("pp_size") or 1) != (1, 1):
        raise ValueError("UNO requires TP=PP=1.")
    if attn_dp_enabled(sa):
        raise ValueError("UNO does not support DP attention or context parallelism.")
    if sa.enable_mixed_chunk:
        sa.enable_mixed_chunk = False
        logger.warning("Mixed chunked prefill is disabled because of using UNO speculative "
                       "decoding.")
    prefill = sa.values.get("prefill_attention_backend") or sa.attention_backend
    decode = sa.values.get("decode_attention_backend") or sa.attention_backend
    if (prefill, decode) != ("fa3", "fa3"):
        raise ValueError("UNO requires the FA3 attention backend for prefill and decode; got "
                         f"prefill={prefill!r}, decode={decode!r}.")
    _reset_max_running_requests(sa)


def _handle_frozen_kv_mtp(sa, ctx):
    """speculative_hook.py:990-1011."""
    _reset_max_running_requests(sa)
    if sa.enable_mixed_chunk:
        sa.enable_mixed_chunk = False
        logger.warning("Mixed chunked prefill is disabled because of using "
                       "Frozen-KV MTP speculative decoding.")


def _validate_0523(sa, ctx):
    """check_server_args, speculative part (validation_hook.py:225-238)."""
    if sa.enable_mixed_chunk and sa.speculative_algorithm is not None:
        assert sa.speculative_algorithm in MIXED_CHUNK_ALGORITHMS, (
            f"enable_mixed_chunk is not supported with speculative_algorithm="
            f"{sa.speculative_algorithm}")


def check_server_args(sa, vt) -> None:
    """The final validation of the emulated release (``check_server_args``): pipeline parallelism.

    Up to 0.5.10 it accepts neither speculation nor mixed chunked prefill next to pp_size > 1;
    0.5.23 accepts DSPARK on a PD prefill node, and single-layer EAGLE there too (or with
    SGLANG_ENABLE_PP_SPEC).
    """
    if (sa.values.get("pp_size") or 1) <= 1:
        return
    algorithm = sa.speculative_algorithm
    if vt < (0, 5, 23):
        if algorithm is not None or sa.values.get("enable_mixed_chunk"):
            raise AssertionError(
                "Pipeline parallelism is not compatible with overlap schedule, speculative decoding, "
                "mixed chunked prefill.")
        return
    if algorithm is None:
        return
    on_prefill = sa.values.get("disaggregation_mode") == "prefill"
    if str(algorithm).upper() == "DSPARK":
        if not on_prefill:
            raise AssertionError("Pipeline parallel DSPARK requires disaggregation-mode=prefill")
        return
    if str(algorithm).upper() != "EAGLE" or sa.values.get("enable_multi_layer_eagle"):
        raise AssertionError("Pipeline parallelism currently only supports EAGLE (non-multi-layer) "
                             "speculative decoding")
    if not on_prefill and (os.environ.get("SGLANG_ENABLE_PP_SPEC") or "").lower() not in ("1", "true"):
        raise AssertionError("PP + speculative decoding (MTP) is only supported on prefill nodes "
                             "(disaggregation-mode=prefill)")


# --------------------------------------------------------------------------
# 0.5.10: srt/server_args.py:2959-3133
# --------------------------------------------------------------------------
def _auto_choose_speculative_params_0510(sa, arch):
    """0.5.10 server_args.py:6711-6745."""
    if sa.speculative_algorithm == "STANDALONE":
        return (3, 1, 4)
    if arch in ["LlamaForCausalLM"]:
        return (5, 4, 8)
    elif arch in [
        "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM",
        "GptOssForCausalLM", "Glm4MoeForCausalLM", "Glm4MoeLiteForCausalLM",
        "GlmMoeDsaForCausalLM", "BailingMoeForCausalLM", "BailingMoeV2ForCausalLM",
        "BailingMoeV2_5ForCausalLM", "MistralLarge3ForCausalLM",
        "PixtralForConditionalGeneration", "MiMoV2FlashForCausalLM",
    ]:
        return (3, 1, 4)
    elif arch in ["Grok1ForCausalLM", "Grok1VForCausalLM"]:
        return (5, 4, 8)
    else:
        return (3, 1, 4)


def handle_speculative_decoding_0510(sa, ctx):
    if sa.speculative_draft_model_path is not None and sa.speculative_draft_model_revision is None:
        sa.speculative_draft_model_revision = "main"
    if sa.speculative_moe_runner_backend is None:
        sa.speculative_moe_runner_backend = (
            "auto" if sa.moe_runner_backend in ["flashinfer_trtllm", "flashinfer_trtllm_routed"]
            else sa.moe_runner_backend)

    if sa.speculative_algorithm == "NEXTN":
        sa.speculative_algorithm = "EAGLE"

    if sa.speculative_algorithm in ("EAGLE", "EAGLE3", "STANDALONE"):
        if sa.speculative_algorithm == "STANDALONE" and sa.enable_dp_attention:
            raise ValueError(
                "Currently standalone speculative decoding does not support dp attention.")
        _reset_max_running_requests(sa)
        if ctx.enable_spec_v2:
            sa.disable_overlap_schedule = False
            logger.warning("Spec v2 is enabled for eagle/eagle3 speculative decoding and "
                           "overlap schedule is turned on.")
            if sa.speculative_eagle_topk is not None and sa.speculative_eagle_topk > 1:
                raise ValueError(
                    "Spec v2 currently only supports topk = 1 for speculative decoding.")
        else:
            sa.disable_overlap_schedule = True
            logger.warning(
                "Overlap scheduler is disabled when spec v2 is off or using unsupported "
                "speculative algorithm. You can set env SGLANG_ENABLE_SPEC_V2=True to enable "
                "the experimental overlap scheduler. ")
        if sa.enable_mixed_chunk:
            sa.enable_mixed_chunk = False
            logger.warning("Mixed chunked prefill is disabled because of using "
                           "eagle speculative decoding.")

        model_arch = ctx.arch
        if model_arch in MTP_ARCHS_0510:
            if sa.speculative_draft_model_path is None:
                sa.speculative_draft_model_path = sa.model_path
                sa.speculative_draft_model_revision = sa.revision
            elif model_arch not in NO_MTP_WARNING_ARCHS:
                logger.warning("DeepSeek MTP does not require setting "
                               "speculative_draft_model_path.")

        if sa.speculative_num_steps is None:
            assert (
                sa.speculative_eagle_topk is None
                and sa.speculative_num_draft_tokens is None
            )
            (
                sa.speculative_num_steps,
                sa.speculative_eagle_topk,
                sa.speculative_num_draft_tokens,
            ) = _auto_choose_speculative_params_0510(sa, model_arch)

        if "trtllm_mha" in _attention_backends(sa):
            if sa.speculative_eagle_topk > 1:
                raise ValueError(
                    "trtllm_mha backend only supports topk = 1 for speculative decoding.")

        if (
            sa.speculative_eagle_topk == 1
            and sa.speculative_num_draft_tokens != sa.speculative_num_steps + 1
        ):
            logger.warning(TOPK1_WARNING)
            sa.speculative_num_draft_tokens = sa.speculative_num_steps + 1

        page_size = 1 if sa.page_size is None else sa.page_size
        if (
            sa.speculative_eagle_topk > 1
            and page_size > 1
            and sa.attention_backend not in ["flashinfer", "fa3"]
        ):
            raise ValueError(
                "speculative_eagle_topk > 1 with page_size > 1 is unstable and produces "
                "incorrect results for paged attention backends. This combination is only "
                "supported for the 'flashinfer' backend.")

    if sa.speculative_algorithm == "NGRAM":
        if not sa.device.startswith("cuda"):
            raise ValueError("Ngram speculative decoding only supports CUDA device.")
        _reset_max_running_requests(sa)
        sa.disable_overlap_schedule = True
        sa.enable_mixed_chunk = False
        sa.speculative_eagle_topk = sa.speculative_ngram_max_bfs_breadth
        if sa.speculative_num_draft_tokens is None:
            sa.speculative_num_draft_tokens = 12
            logger.warning(
                "speculative_num_draft_tokens is set to 12 by default for ngram speculative "
                "decoding. You can override this by explicitly setting "
                "--speculative-num-draft-tokens.")
        logger.warning("The overlap scheduler and mixed chunked prefill are disabled because of "
                       "using ngram speculative decoding.")
        page_size = 1 if sa.page_size is None else sa.page_size
        if sa.speculative_eagle_topk > 1 and page_size > 1 and sa.attention_backend != "flashinfer":
            raise ValueError(
                f"speculative_eagle_topk({sa.speculative_eagle_topk}) > 1 "
                f"with page_size({page_size}) > 1 is unstable "
                "and produces incorrect results for paged attention backends. "
                "This combination is only supported for the 'flashinfer' backend.")
        if sa.enable_dp_attention:
            raise ValueError("Currently ngram speculative decoding does not support dp attention.")


# --------------------------------------------------------------------------
# 0.4.6.post5 (:377-431), 0.4.10.post2 (:529-582), 0.5.1 (:613-680)
# --------------------------------------------------------------------------
def _auto_choose_speculative_params_legacy(vt, arch):
    if arch in ["LlamaForCausalLM"]:
        return (5, 4, 8)
    if vt >= (0, 5, 1) and arch in ["DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM",
                                    "GptOssForCausalLM"]:
        return (3, 1, 4)
    if vt >= (0, 4, 10) and arch in ["DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM"]:
        return (3, 1, 4)
    return (5, 4, 8)


def handle_speculative_decoding_legacy(sa, ctx):
    vt = ctx.vt
    if sa.speculative_algorithm == "NEXTN":
        sa.speculative_algorithm = "EAGLE"
    if sa.speculative_algorithm not in ("EAGLE", "EAGLE3"):
        return
    # No message before 0.5.10 (§1.9).
    _reset_max_running_requests(sa, with_warning=False)
    sa.disable_overlap_schedule = True
    logger.warning("Overlap scheduler is disabled because of using "
                   "eagle speculative decoding.")
    if vt >= (0, 4, 10) and sa.enable_mixed_chunk:
        sa.enable_mixed_chunk = False
        logger.warning("Mixed chunked prefill is disabled because of using "
                       "eagle speculative decoding.")

    model_arch = ctx.arch
    mtp_archs = ["DeepseekV3ForCausalLM"] if vt < (0, 4, 10) else ["DeepseekV3ForCausalLM",
                                                                   "Glm4MoeForCausalLM"]
    if model_arch in mtp_archs:
        if sa.speculative_draft_model_path is None:
            sa.speculative_draft_model_path = sa.model_path
        else:
            logger.warning("DeepSeek MTP does not require setting speculative_draft_model_path.")
        if vt >= (0, 5, 1) and (sa.page_size or 1) != 1 and sa.attention_backend == "flashinfer":
            raise ValueError("Speculative decoding with page_size != 1 is not supported. "
                             "Please set page_size to 1.")

    if sa.speculative_num_steps is None:
        assert (
            sa.speculative_eagle_topk is None
            and sa.speculative_num_draft_tokens is None
        )
        (
            sa.speculative_num_steps,
            sa.speculative_eagle_topk,
            sa.speculative_num_draft_tokens,
        ) = _auto_choose_speculative_params_legacy(vt, model_arch)

    page_size = 1 if sa.page_size is None else sa.page_size
    if vt < (0, 4, 10):
        if page_size > 1 and sa.speculative_eagle_topk > 1:
            sa.speculative_eagle_topk = 1
            logger.warning("speculative_eagle_topk is adjusted to 1 when page_size > 1")

    if vt >= (0, 5, 1) and "trtllm_mha" in _attention_backends(sa):
        if sa.speculative_eagle_topk > 1:
            raise ValueError("trtllm_mha backend only supports topk = 1 for speculative decoding.")

    if (
        sa.speculative_eagle_topk == 1
        and sa.speculative_num_draft_tokens != sa.speculative_num_steps + 1
    ):
        logger.warning(TOPK1_WARNING)
        sa.speculative_num_draft_tokens = sa.speculative_num_steps + 1
