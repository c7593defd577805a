# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""SGLang argument-resolution engine: flag table, resolution rules, argv and
``--config`` rendering, override explanations.

Ground truth is ``shared/docs/sglang.md`` (cited as "sglang.md §N"). A few
details that sglang.md leaves open (exact architecture lists and warning texts
of 0.5.10, the 0.5.1 MTP/flashinfer message, the adaptive "disabled" reasons,
the DFLASH/DSPARK/UNO messages, per-version flag availability) were read in the
published wheels of the same versions; the comments say "wheel" there.

Standard library only, Python 3.9+; this file runs on the controller (filters)
and on targets (``sglang_launch``).

Public API (see ``docs/design.md``, "Resolution engine")::

    resolve(args, version="0.5.23", arch=None, policy="honor_draft_tokens",
            draft_arch=None, env=None) -> {"args", "adjustments", "errors", "notes"}
    to_argv(args, version="0.5.23", secrets="include") -> [str, ...]
    to_config_yaml(args, version=None) -> str
    explain(arg, intended, running, version="0.5.23", args=None) -> str
    scan_override_log(text, version=None) -> [{"arg", "rule", "line"}, ...]
    FLAGS, OVERRIDE_LOG_PATTERNS, RULES, POLICIES, DOCUMENTED_VERSIONS

Versions
--------
Rules are modelled for the documented releases 0.4.6 (read as 0.4.6.post5),
0.4.10 (0.4.10.post2), 0.5.1, 0.5.10 and 0.5.23 (sglang.md §1.9). Any other
version is resolved with the rules of the nearest documented version at or
below it: 0.5.5 behaves like 0.5.1, 0.4.6.post5 like 0.4.6, a pre-release or
dev build counts as older than its final release (0.5.10rc1 behaves like
0.5.1). Versions newer than 0.5.23 get the 0.5.23 rules plus a note; versions
older than 0.4.6 are refused (an entry in ``errors`` from ``resolve``, a
``ValueError`` from ``to_argv``). A version must be a string with three
release numbers (``"0.5.10"``), so that a YAML float such as ``0.5`` is never
silently taken for a release.

Adjustments
-----------
Each adjustment is ``{arg, from, to, rule, doc, log}``. ``log`` is the line
SGLang prints for it (for messages with a variable tail, the line as SGLang
formats it for these values), or ``None`` when SGLang prints nothing. An
adjustment whose ``from`` equals ``to`` is informational: SGLang prints the
line but keeps the value (for example the NGRAM mixed-chunk warning, which is
printed even when mixed chunk was never requested).

Fixed point
-----------
The returned ``args`` are the values the server runs when it is started with
exactly those args: ``resolve(result["args"], version, policy="mirror")``
changes no value. Three deliberate choices keep that property (each is noted
in ``notes`` when it applies):

* the upper-case canonical algorithm name is rendered (sglang.md §1.10 item 1),
  so for architectures that turn on multi-layer EAGLE when the algorithm is
  literally ``EAGLE`` (sglang.md §1.8) the effective args include
  ``enable_multi_layer_eagle: true`` even if the raw value was ``nextn``;
* when the MTP draft path defaults to the model path (sglang.md §1.3 step 7)
  and ``revision`` is unset, the draft revision is reported as ``main``, which
  is what the server picks once the draft path is rendered explicitly (§1.2);
* ``--enable-return-aux-hidden-states`` keeps ``speculative_algorithm`` in the
  args, because it names the capture convention and must be rendered; SGLang
  then reports ``speculative_algorithm: None`` (sglang.md §1.1 hook 1).
"""
from __future__ import annotations

import difflib
import json
import math
import re

DEFAULT_VERSION = "0.5.23"
DEFAULT_POLICY = "honor_draft_tokens"
POLICIES = ("mirror", "honor_draft_tokens", "strict")

# sglang.md header and §1.9: the releases whose rules were read.
DOCUMENTED_VERSIONS = ("0.4.6", "0.4.10", "0.5.1", "0.5.10", "0.5.23")

_V046, _V0410, _V051, _V0510, _V0523 = range(5)

# ---------------------------------------------------------------------------
# Messages SGLang prints (double-quoted literals of sglang.md, completed from
# the wheels where sglang.md elides the tail with "…").
# ---------------------------------------------------------------------------
MSG_MAX_RUNNING = (
    "Max running requests is reset to 48 for speculative decoding. "
    "You can override this by explicitly setting --max-running-requests."
)
MSG_TOPK1 = "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1"
MSG_PAGE_TOPK1_046 = "speculative_eagle_topk is adjusted to 1 when page_size > 1"
MSG_OVERLAP_OLD = "Overlap scheduler is disabled because of using eagle speculative decoding."
MSG_OVERLAP_0510 = (
    "Overlap scheduler is disabled when spec v2 is off or using unsupported speculative algorithm. "
    "You can set env SGLANG_ENABLE_SPEC_V2=True to enable the experimental overlap scheduler."
)
MSG_SPEC_V2_ON_0510 = "Spec v2 is enabled for eagle/eagle3 speculative decoding and overlap schedule is turned on."
MSG_OVERLAP_CPU = "Overlap schedule is not implemented for speculative decoding on CPU."
MSG_SYNC_SPEC_V2 = "Non-overlap (synchronous) spec v2 is used for eagle/eagle3/standalone speculative decoding."
MSG_MIXED_EAGLE_OLD = "Mixed chunked prefill is disabled because of using eagle speculative decoding."
MSG_MIXED_STANDALONE = "Mixed chunked prefill is disabled: STANDALONE speculative decoding does not support it."
MSG_MIXED_NGRAM = "The mixed chunked prefill are disabled because of using ngram speculative decoding."
MSG_NGRAM_0510 = "The overlap scheduler and mixed chunked prefill are disabled because of using ngram speculative decoding."
MSG_MIXED_FROZEN = "Mixed chunked prefill is disabled because of using Frozen-KV MTP speculative decoding."
MSG_MIXED_UNO = "Mixed chunked prefill is disabled for UNO speculative decoding."
MSG_NGRAM_DRAFT12 = (
    "speculative_num_draft_tokens is set to 12 by default for ngram speculative decoding. "
    "You can override this by explicitly setting --speculative-num-draft-tokens."
)
MSG_MTP_DRAFT_PATH = "DeepSeek MTP does not require setting speculative_draft_model_path."
MSG_GEMMA4_PROMOTE = "Detected Gemma4AssistantForCausalLM draft; promoting --speculative-algorithm {alg} to FROZEN_KV_MTP."
MSG_ADAPTIVE_OFF = "speculative_adaptive disabled: {reason}. Falling back to static speculative params."
MSG_TRTLLM = "trtllm_mha backend only supports topk = 1 for speculative decoding."
MSG_SPEC_V2_TOPK = "Spec v2 currently only supports topk = 1 for speculative decoding."

# ---------------------------------------------------------------------------
# Rules: id -> (sglang.md section, one-line description). Every adjustment
# carries one of these ids.
# ---------------------------------------------------------------------------
RULES = {
    "algorithm.uppercase": ("sglang.md §1.2", "the algorithm name is upper-cased (0.5.23)"),
    "algorithm.nextn_alias": ("sglang.md §1.2", "NEXTN is an alias of EAGLE"),
    "algorithm.gemma4_frozen_kv_mtp": ("sglang.md §1.2", "NEXTN/EAGLE with a Gemma4 assistant draft becomes FROZEN_KV_MTP"),
    "aux.disables_speculation": ("sglang.md §1.1 hook 1", "--enable-return-aux-hidden-states turns speculation off"),
    "spec.draft_revision_main": ("sglang.md §1.2", "a draft path without a draft revision gets revision main"),
    "spec.max_running_requests": ("sglang.md §1.3 step 3", "unset max_running_requests becomes 48"),
    "spec.overlap_schedule_off": ("sglang.md §1.9", "the overlap scheduler is turned off"),
    "spec.overlap_schedule_spec_v2": ("sglang.md §1.9", "0.5.10 spec v2 turns the overlap scheduler on"),
    "spec.sync_spec_v2": ("sglang.md §1.3 step 5", "overlap off: the synchronous spec-v2 path is used"),
    "spec.mixed_chunk_off": ("sglang.md §1.9", "mixed chunked prefill is turned off"),
    "model.multi_layer_eagle": ("sglang.md §1.8", "EAGLE turns on multi-layer EAGLE for some architectures"),
    "eagle.mtp_draft_path": ("sglang.md §1.3 step 7", "MTP checkpoints use the model path as draft path"),
    "eagle.mtp_draft_path_warning": ("sglang.md §1.3 step 7b", "an explicit draft path for an MTP checkpoint is only warned about"),
    "eagle.iquest_mtp": ("sglang.md §1.3 step 8", "IQuest Q1 MTP draft: topk 1, draft tokens = steps + 1"),
    "eagle.auto_params": ("sglang.md §1.6", "steps/topk/draft tokens chosen by architecture when none is set"),
    "eagle.page_size_topk1": ("sglang.md §1.9", "0.4.6 forces topk to 1 when page_size > 1"),
    "eagle.topk1_draft_tokens": ("sglang.md §1.3 step 13", "topk == 1 forces draft tokens = steps + 1"),
    "policy.honor_draft_tokens": ("sglang.md §1.3 step 13", "policy: steps = draft tokens - 1 so the server keeps the draft tokens"),
    "adaptive.disabled": ("sglang.md §1.5", "adaptive mode is switched off for an unsupported setup"),
    "adaptive.topk_default": ("sglang.md §1.5", "adaptive mode defaults topk to 1"),
    "adaptive.steps_default": ("sglang.md §1.5", "adaptive mode defaults steps to the middle candidate step"),
    "adaptive.draft_tokens": ("sglang.md §1.5", "adaptive mode always sets draft tokens = steps + 1"),
    "ngram.topk_bfs_breadth": ("sglang.md §1.4", "NGRAM sets topk to speculative_ngram_max_bfs_breadth"),
    "ngram.draft_tokens_default": ("sglang.md §1.4", "NGRAM defaults draft tokens to 12"),
    "ngram.steps_default": ("sglang.md §1.4", "NGRAM defaults steps to draft tokens // topk (0.5.23)"),
    "dflash.steps_topk_1": ("sglang.md §1.7", "DFLASH forces steps and topk to 1"),
    "dflash.block_size": ("sglang.md §1.7", "DFLASH draft tokens follow --speculative-dflash-block-size"),
    "dspark.steps_topk_1": ("sglang.md §1.7", "DSPARK forces steps and topk to 1"),
    "dspark.gamma_draft_tokens": ("sglang.md §1.7", "DSPARK draft tokens = gamma + 1"),
    "uno.steps_topk_1": ("sglang.md §1.7", "UNO linear mode forces steps and topk to 1"),
}

# ---------------------------------------------------------------------------
# Flag table (sglang.md §5; availability per version read in the wheels).
# min_version / max_version name documented releases: the first and the last
# one that accept the flag. Types: int, float, str, bool (store_true), list
# (nargs: ``--flag a b``), json (one JSON text argument).
# ---------------------------------------------------------------------------


def _flag(ftype, aliases=(), min_version=None, max_version=None, secret=False, replaced_by=None, config=True, flag=None):
    return {
        "flag": flag,
        "type": ftype,
        "aliases": list(aliases),
        "min_version": min_version,
        "max_version": max_version,
        "secret": secret,
        "replaced_by": replaced_by,
        "config": config,
    }


_FLAG_SPECS = {
    # model and serving (sglang.md §5)
    "model_path": _flag("str", ["--model"]),
    "tokenizer_path": _flag("str"),
    "revision": _flag("str"),
    "trust_remote_code": _flag("bool"),
    "context_length": _flag("int"),
    "dtype": _flag("str"),
    "quantization": _flag("str"),
    "kv_cache_dtype": _flag("str"),
    "load_format": _flag("str"),
    "download_dir": _flag("str"),
    "json_model_override_args": _flag("json"),
    "chat_template": _flag("str"),
    "reasoning_parser": _flag("str"),
    "tool_call_parser": _flag("str"),
    "weight_cache_mode": _flag("str", min_version="0.5.23"),
    "host": _flag("str"),
    "port": _flag("int"),
    "served_model_name": _flag("str"),
    "api_key": _flag("str", secret=True),
    "admin_api_key": _flag("str", min_version="0.5.10", secret=True),
    "skip_server_warmup": _flag("bool", min_version="0.4.10"),
    "tokenizer_worker_num": _flag("int", min_version="0.5.10"),
    "config": _flag("str", min_version="0.5.10", config=False),
    # observability
    "log_level": _flag("str"),
    "log_level_http": _flag("str"),
    "enable_metrics": _flag("bool"),
    "decode_log_interval": _flag("int"),
    "enable_cache_report": _flag("bool"),
    # parallelism
    "tp_size": _flag("int", ["--tensor-parallel-size"]),
    "dp_size": _flag("int", ["--data-parallel-size"]),
    "pp_size": _flag("int", ["--pipeline-parallel-size"]),
    "ep_size": _flag("int", ["--expert-parallel-size"]),
    "attn_dp_size": _flag("int", min_version="0.5.23"),
    "enable_dp_attention": _flag("bool"),
    "enable_dp_lm_head": _flag("bool"),
    "nnodes": _flag("int"),
    "node_rank": _flag("int"),
    "dist_init_addr": _flag("str", ["--nccl-init-addr"]),
    "base_gpu_id": _flag("int"),
    # device and memory
    "device": _flag("str"),
    "mem_fraction_static": _flag("float"),
    "max_running_requests": _flag("int"),
    "max_total_tokens": _flag("int"),
    "max_prefill_tokens": _flag("int"),
    "chunked_prefill_size": _flag("int"),
    "page_size": _flag("int"),
    "cpu_offload_gb": _flag("int"),
    "watchdog_timeout": _flag("float"),
    "random_seed": _flag("int"),
    # scheduling and kernels
    "schedule_policy": _flag("str"),
    "stream_interval": _flag("int"),
    "attention_backend": _flag("str"),
    "prefill_attention_backend": _flag("str", min_version="0.4.10"),
    "decode_attention_backend": _flag("str", min_version="0.4.10"),
    "sampling_backend": _flag("str"),
    "grammar_backend": _flag("str"),
    "moe_runner_backend": _flag("str", min_version="0.5.1"),
    "disable_overlap_schedule": _flag("bool"),
    "enable_mixed_chunk": _flag("bool"),
    "disable_radix_cache": _flag("bool"),
    "enable_hierarchical_cache": _flag("bool"),
    "disable_cuda_graph": _flag("bool"),
    "cuda_graph_max_bs": _flag("int", max_version="0.5.10", replaced_by="cuda_graph_max_bs_decode"),
    "cuda_graph_max_bs_decode": _flag("int", min_version="0.5.23"),
    "cuda_graph_max_bs_prefill": _flag("int", min_version="0.5.23"),
    "enable_torch_compile": _flag("bool"),
    "enable_two_batch_overlap": _flag("bool", min_version="0.4.10"),
    "enable_pdmux": _flag("bool", min_version="0.4.10"),
    "enable_deterministic_inference": _flag("bool", min_version="0.5.10"),
    "enable_unified_memory": _flag("bool", min_version="0.5.23"),
    "enable_return_aux_hidden_states": _flag("bool", min_version="0.5.23"),
    "return_aux_hidden_state_layer_ids": _flag("list", min_version="0.5.23"),
    # LoRA (lora_paths uses a custom argparse action that --config cannot express)
    "enable_lora": _flag("bool", min_version="0.4.10"),
    "lora_paths": _flag("list", config=False),
    "max_loaded_loras": _flag("int", min_version="0.4.10"),
    # PD disaggregation
    "disaggregation_mode": _flag("str"),
    "disaggregation_decode_enable_radix_cache": _flag("bool", min_version="0.5.23"),
    "enable_pd_role_switch": _flag("bool", min_version="0.5.23"),
    # speculative decoding (sglang.md §5, §1)
    "speculative_algorithm": _flag("str"),
    "speculative_draft_model_path": _flag("str", ["--speculative-draft-model"]),
    "speculative_draft_model_revision": _flag("str", min_version="0.5.10"),
    "speculative_num_steps": _flag("int"),
    "speculative_eagle_topk": _flag("int"),
    "speculative_num_draft_tokens": _flag("int"),
    "speculative_token_map": _flag("str"),
    "speculative_accept_threshold_single": _flag("float"),
    "speculative_accept_threshold_acc": _flag("float"),
    "speculative_attention_mode": _flag("str", min_version="0.5.10"),
    "speculative_moe_runner_backend": _flag("str", min_version="0.5.10"),
    "speculative_ngram_max_bfs_breadth": _flag("int", min_version="0.5.10"),
    "speculative_ngram_min_bfs_breadth": _flag("int", min_version="0.5.10"),
    "enable_multi_layer_eagle": _flag("bool", min_version="0.5.10"),
    "speculative_adaptive": _flag("bool", min_version="0.5.23"),
    "speculative_adaptive_config": _flag("str", min_version="0.5.23"),
    "speculative_dflash_block_size": _flag("int", min_version="0.5.23"),
    "speculative_dspark_block_size": _flag("int", min_version="0.5.23"),
    "speculative_use_rejection_sampling": _flag("bool", min_version="0.5.23"),
    "speculative_draft_window_size": _flag("int", min_version="0.5.23"),
    "speculative_draft_sink_size": _flag("int", min_version="0.5.23"),
    "uno_lora_path": _flag("str", min_version="0.5.23"),
}

FLAGS = {}
for _name, _spec in _FLAG_SPECS.items():
    _spec["flag"] = _spec["flag"] or "--" + _name.replace("_", "-")
    _spec["kind"] = {"bool": "store_true", "list": "nargs", "json": "json"}.get(_spec["type"], "value")
    FLAGS[_name] = _spec
del _name, _spec

SECRET_ARGS = tuple(sorted(k for k, v in FLAGS.items() if v["secret"]))

# ---------------------------------------------------------------------------
# Override log lines a server prints when it changes an argument, so that
# sglang_launch can scan a log. ``text`` is a literal substring of the line.
# ---------------------------------------------------------------------------
OVERRIDE_LOG_PATTERNS = [
    {"arg": "speculative_num_draft_tokens", "rule": "eagle.topk1_draft_tokens", "text": MSG_TOPK1,
     "versions": list(DOCUMENTED_VERSIONS), "doc": "sglang.md §1.3 step 13"},
    {"arg": "max_running_requests", "rule": "spec.max_running_requests", "text": MSG_MAX_RUNNING,
     "versions": ["0.5.10", "0.5.23"], "doc": "sglang.md §1.3 step 3"},
    {"arg": "speculative_eagle_topk", "rule": "eagle.page_size_topk1", "text": MSG_PAGE_TOPK1_046,
     "versions": ["0.4.6"], "doc": "sglang.md §1.9"},
    {"arg": "disable_overlap_schedule", "rule": "spec.overlap_schedule_off", "text": MSG_OVERLAP_OLD,
     "versions": ["0.4.6", "0.4.10", "0.5.1"], "doc": "sglang.md §1.9"},
    {"arg": "disable_overlap_schedule", "rule": "spec.overlap_schedule_off",
     "text": "Overlap scheduler is disabled when spec v2 is off", "versions": ["0.5.10"], "doc": "sglang.md §1.9"},
    {"arg": "disable_overlap_schedule", "rule": "spec.overlap_schedule_spec_v2", "text": MSG_SPEC_V2_ON_0510,
     "versions": ["0.5.10"], "doc": "sglang.md §1.9"},
    {"arg": "disable_overlap_schedule", "rule": "spec.overlap_schedule_off", "text": MSG_OVERLAP_CPU,
     "versions": ["0.5.23"], "doc": "sglang.md §1.3 step 4"},
    {"arg": "disable_overlap_schedule", "rule": "spec.overlap_schedule_off", "text": MSG_NGRAM_0510,
     "versions": ["0.5.10"], "doc": "sglang.md §1.9"},
    {"arg": "enable_mixed_chunk", "rule": "spec.mixed_chunk_off", "text": MSG_NGRAM_0510,
     "versions": ["0.5.10"], "doc": "sglang.md §1.9"},
    {"arg": "enable_mixed_chunk", "rule": "spec.mixed_chunk_off", "text": MSG_MIXED_EAGLE_OLD,
     "versions": ["0.4.10", "0.5.1", "0.5.10"], "doc": "sglang.md §1.9"},
    {"arg": "enable_mixed_chunk", "rule": "spec.mixed_chunk_off", "text": MSG_MIXED_STANDALONE,
     "versions": ["0.5.23"], "doc": "sglang.md §1.3 step 6"},
    {"arg": "enable_mixed_chunk", "rule": "spec.mixed_chunk_off", "text": MSG_MIXED_NGRAM,
     "versions": ["0.5.23"], "doc": "sglang.md §1.4"},
    {"arg": "enable_mixed_chunk", "rule": "spec.mixed_chunk_off", "text": MSG_MIXED_FROZEN,
     "versions": ["0.5.23"], "doc": "sglang.md §1.7"},
    {"arg": "enable_mixed_chunk", "rule": "spec.mixed_chunk_off", "text": MSG_MIXED_UNO,
     "versions": ["0.5.23"], "doc": "sglang.md §1.7"},
    {"arg": "speculative_num_draft_tokens", "rule": "ngram.draft_tokens_default",
     "text": "speculative_num_draft_tokens is set to 12 by default for ngram speculative decoding.",
     "versions": ["0.5.10", "0.5.23"], "doc": "sglang.md §1.4"},
    {"arg": "speculative_algorithm", "rule": "algorithm.gemma4_frozen_kv_mtp", "text": "Detected Gemma4AssistantForCausalLM draft; promoting",
     "versions": ["0.5.23"], "doc": "sglang.md §1.2"},
    {"arg": "speculative_adaptive", "rule": "adaptive.disabled", "text": "speculative_adaptive disabled:",
     "versions": ["0.5.23"], "doc": "sglang.md §1.5"},
    {"arg": "speculative_num_steps", "rule": "dflash.steps_topk_1", "text": "DFLASH only supports speculative_num_steps == 1; overriding",
     "versions": ["0.5.23"], "doc": "sglang.md §1.7"},
    {"arg": "speculative_eagle_topk", "rule": "dflash.steps_topk_1", "text": "DFLASH only supports speculative_eagle_topk == 1; overriding",
     "versions": ["0.5.23"], "doc": "sglang.md §1.7"},
    {"arg": "speculative_num_steps", "rule": "dspark.steps_topk_1", "text": "DSpark only supports speculative_num_steps == 1; overriding",
     "versions": ["0.5.23"], "doc": "sglang.md §1.7"},
    {"arg": "speculative_eagle_topk", "rule": "dspark.steps_topk_1", "text": "DSpark only supports speculative_eagle_topk == 1; overriding",
     "versions": ["0.5.23"], "doc": "sglang.md §1.7"},
    {"arg": "speculative_num_steps", "rule": "uno.steps_topk_1", "text": "UNO uses speculative_num_steps=1; overriding",
     "versions": ["0.5.23"], "doc": "sglang.md §1.7"},
    {"arg": "speculative_eagle_topk", "rule": "uno.steps_topk_1", "text": "UNO uses speculative_eagle_topk=1; overriding",
     "versions": ["0.5.23"], "doc": "sglang.md §1.7"},
]

# ---------------------------------------------------------------------------
# Architecture and algorithm tables
# ---------------------------------------------------------------------------
# sglang.md §1.9 "CLI choices"; 0.5.23 takes a free string (§1.1 built-in names).
_ALGORITHM_CHOICES = {
    _V046: ("EAGLE", "EAGLE3", "NEXTN"),
    _V0410: ("EAGLE", "EAGLE3", "NEXTN"),
    _V051: ("EAGLE", "EAGLE3", "NEXTN"),
    _V0510: ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"),
}
_BUILTIN_0523 = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO", "FROZEN_KV_MTP")
_EAGLE_FAMILY = ("EAGLE", "EAGLE3", "STANDALONE")
_GEMMA4_DRAFTS = ("Gemma4AssistantForCausalLM", "Gemma4UnifiedAssistantForCausalLM")

# sglang.md §1.3 step 7 and §1.9 "Draft path defaults to model path"
# (exact 0.5.10 list read in the wheel, server_args.py:3029-3051).
_MTP_0510 = (
    "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM", "Glm4MoeForCausalLM", "Glm4MoeLiteForCausalLM",
    "GlmMoeDsaForCausalLM", "BailingMoeForCausalLM", "BailingMoeV2ForCausalLM", "BailingMoeV2_5ForCausalLM",
    "MistralLarge3ForCausalLM", "PixtralForConditionalGeneration",
)
_MTP_DRAFT_PATH_ARCHS = {
    _V046: ("DeepseekV3ForCausalLM",),
    _V0410: ("DeepseekV3ForCausalLM", "Glm4MoeForCausalLM"),
    _V051: ("DeepseekV3ForCausalLM", "Glm4MoeForCausalLM"),
    _V0510: _MTP_0510,
    _V0523: _MTP_0510 + ("DeepseekV4ForCausalLM", "HYV3ForCausalLM", "HYV4ForCausalLM", "Qwen4ExpForConditionalGeneration"),
}
# §1.3 step 7b: no warning for these two.
_MTP_NO_WARNING = ("MistralLarge3ForCausalLM", "PixtralForConditionalGeneration")

# sglang.md §1.6 and §1.9 "Automatic (steps, topk, draft)".
_AUTO_314_0410 = ("DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM")
_AUTO_314_051 = _AUTO_314_0410 + ("GptOssForCausalLM",)
_AUTO_548_0510 = ("LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM")

# sglang.md §1.8: multi-layer EAGLE is turned on when the raw algorithm is
# literally "EAGLE". Substring matches as in the wheel (0.5.10
# server_args.py:1794-1830; 0.5.23 overrides.py:331-350, model_overrides/).
_MULTI_LAYER_0510 = (
    ("MiMoV2FlashForCausalLM", "Enable multi-layer EAGLE speculative decoding for MiMoV2FlashForCausalLM model."),
    ("Step3p5ForCausalLM", "Enable multi-layer EAGLE speculative decoding for Step3p5ForCausalLM model."),
)
_MULTI_LAYER_0523 = (
    ("Step3p5ForCausalLM", "Enable multi-layer EAGLE speculative decoding for Step3p5ForCausalLM model."),
    ("Step3p7ForConditionalGeneration", "Enable multi-layer EAGLE speculative decoding for Step3p5ForCausalLM model."),
    ("MiMoV2ForCausalLM", "Enable multi-layer EAGLE speculative decoding for MiMoV2 model."),
    ("MiMoV2FlashForCausalLM", "Enable multi-layer EAGLE speculative decoding for MiMoV2 model."),
    ("GigaChat35ForCausalLM", "Enable multi-layer EAGLE speculative decoding for GigaChat 3.5 model."),
)

# sglang.md §1.5: union of the built-in candidate_steps tables.
_ADAPTIVE_DEFAULT_CANDIDATES = (0, 1, 3, 5, 7)

_TRUE_STRINGS = ("true", "yes", "on", "1")
_FALSE_STRINGS = ("false", "no", "off", "0")
_VERSION_RE = re.compile(
    r"^v?(\d+)\.(\d+)\.(\d+)"
    r"(?:[-_.]?(a|b|c|rc|alpha|beta|pre|preview)[-_.]?(\d*))?"
    r"(?:[-_.]?(post|rev|r)[-_.]?(\d*))?"
    r"(?:[-_.]?(dev)[-_.]?(\d*))?"
    r"(?:\+[0-9A-Za-z.]+)?$"
)


# ---------------------------------------------------------------------------
# Versions
# ---------------------------------------------------------------------------
def parse_version(version):
    """Parse an SGLang version string.

    Returns ``(release_tuple, is_final)`` where ``is_final`` is False for
    pre-releases and dev builds. Post-releases (``0.4.6.post5``) are final.
    Raises ValueError for anything else, naming the bad value and its type.
    """
    if not isinstance(version, str) or isinstance(version, bool):
        raise ValueError(
            "SGLang version must be a string such as '0.5.10', got %s %r; quote it in YAML "
            "(an unquoted 0.5.10 is read as a string, but 0.5 or 1.0 become floats)" % (type(version).__name__, version)
        )
    match = _VERSION_RE.match(version.strip())
    if not match:
        raise ValueError(
            "cannot parse SGLang version %r (str): expected MAJOR.MINOR.PATCH with an optional "
            "pre-release, .postN or .devN suffix, for example '0.5.10' or '0.4.6.post5'" % (version,)
        )
    release = (int(match.group(1)), int(match.group(2)), int(match.group(3)))
    is_final = match.group(4) is None and match.group(8) is None
    return release, is_final


def _version_key(version):
    release, is_final = parse_version(version)
    return release + (1 if is_final else 0,)


def rule_version(version):
    """Return the documented release whose rules apply to ``version``.

    Raises ValueError for unparseable versions and for versions older than
    0.4.6 (no rules are modelled there).
    """
    key = _version_key(version)
    chosen = None
    for documented in DOCUMENTED_VERSIONS:
        if key >= _version_key(documented):
            chosen = documented
    if chosen is None:
        raise ValueError(
            "SGLang %s is older than 0.4.6, the oldest release whose argument rules are modelled "
            "(sglang.md §1.9); upgrade SGLang to 0.4.6 or newer" % (version,)
        )
    return chosen


def _version_notes(version, documented):
    release, is_final = parse_version(version)
    documented_release = _version_key(documented)[:3]
    if documented == DOCUMENTED_VERSIONS[-1] and release > documented_release:
        return [
            "SGLang %s is newer than %s, the newest release whose rules were read; the %s rules are applied, "
            "check that release's notes for changes (sglang.md §1.9)" % (version, documented, documented)
        ]
    if release != documented_release or not is_final:
        return [
            "SGLang %s is not one of the documented releases %s; the rules of %s, the nearest documented "
            "release at or below it, are applied (sglang.md §1.9)" % (version, ", ".join(DOCUMENTED_VERSIONS), documented)
        ]
    return []


def flag_available(field, version):
    """True when ``version`` accepts the flag of ``field`` (by FLAGS min/max)."""
    spec = FLAGS[field]
    documented = rule_version(version)
    idx = DOCUMENTED_VERSIONS.index(documented)
    if spec["min_version"] and idx < DOCUMENTED_VERSIONS.index(spec["min_version"]):
        return False
    if spec["max_version"] and idx > DOCUMENTED_VERSIONS.index(spec["max_version"]):
        return False
    return True


def _availability_error(field, version):
    spec = FLAGS[field]
    idx = DOCUMENTED_VERSIONS.index(rule_version(version))
    if spec["min_version"] and idx < DOCUMENTED_VERSIONS.index(spec["min_version"]):
        return (
            "argument '%s' (%s) needs SGLang %s or newer; SGLang %s fails at startup with "
            "\"unrecognized arguments: %s\". Drop '%s' or upgrade SGLang"
            % (field, spec["flag"], spec["min_version"], version, spec["flag"], field)
        )
    if spec["max_version"] and idx > DOCUMENTED_VERSIONS.index(spec["max_version"]):
        hint = "; use '%s' instead" % spec["replaced_by"] if spec["replaced_by"] else ""
        return (
            "argument '%s' (%s) is not accepted after SGLang %s; SGLang %s rejects it at startup. Drop '%s'%s"
            % (field, spec["flag"], spec["max_version"], version, field, hint)
        )
    return None


def suggest_field(key):
    """The known field closest to ``key`` (dash or flag spellings accepted), or None."""
    norm = str(key).lstrip("-").replace("-", "_").lower()
    if norm in FLAGS:
        return norm
    for field, spec in FLAGS.items():
        if "--" + norm.replace("_", "-") in spec["aliases"]:
            return field
    close = difflib.get_close_matches(norm, list(FLAGS), n=1, cutoff=0.6)
    if close:
        return close[0]
    prefixed = sorted(f for f in FLAGS if f.startswith(norm + "_"))
    return prefixed[0] if prefixed else None


def _unknown_key_message(key):
    message = "unknown SGLang argument '%s'" % (key,)
    suggestion = suggest_field(key)
    if suggestion and suggestion != key:
        message += "; did you mean '%s' (%s)?" % (suggestion, FLAGS[suggestion]["flag"])
    else:
        message += "; keys are SGLang field names in snake_case, for example 'tp_size' for --tp-size"
    return message


# ---------------------------------------------------------------------------
# Value helpers
# ---------------------------------------------------------------------------
def _plain(value):
    """Copy ``value`` into plain Python types (Ansible passes tagged subclasses)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, dict) or hasattr(value, "items"):
        return dict((str(k), _plain(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _same(a, b):
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    return a == b


def _fmt(value):
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _coerce(field, value):
    """Coerce ``value`` to the FLAGS type of ``field``; returns (value, error)."""
    ftype = FLAGS[field]["type"]
    flag = FLAGS[field]["flag"]
    if value is None:
        return None, None
    if ftype == "bool":
        if isinstance(value, bool):
            return value, None
        if isinstance(value, str) and value.strip().lower() in _TRUE_STRINGS + _FALSE_STRINGS:
            return value.strip().lower() in _TRUE_STRINGS, None
        return value, "%s: %s is a store_true flag; give true or false, not %s %r" % (field, flag, type(value).__name__, value)
    if ftype == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value, None
        if isinstance(value, float) and value.is_integer():
            return int(value), None
        if isinstance(value, str) and re.match(r"^\s*-?\d+\s*$", value):
            return int(value), None
        return value, "%s: SGLang fails at startup with \"argument %s: invalid int value: %r\"; give an integer" % (field, flag, str(value))
    if ftype == "float":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value, None
        if isinstance(value, str):
            try:
                return float(value), None
            except ValueError:
                pass
        return value, "%s: SGLang fails at startup with \"argument %s: invalid float value: %r\"; give a number" % (field, flag, str(value))
    if ftype == "list":
        if isinstance(value, (list, tuple)):
            return list(value), None
        return value, "%s: %s takes a list of values, got %s %r; write it as a YAML list" % (field, flag, type(value).__name__, value)
    if ftype == "json":
        if isinstance(value, (dict, list)):
            return value, None
        if isinstance(value, str):
            try:
                json.loads(value)
                return value, None
            except ValueError as exc:
                return value, "%s: %s must be JSON text or a dict; %r does not parse (%s)" % (field, flag, value, exc)
        return value, "%s: %s takes a dict or JSON text, got %s %r" % (field, flag, type(value).__name__, value)
    if isinstance(value, (dict, list, bool)):
        return value, "%s: %s takes one string value, got %s %r" % (field, flag, type(value).__name__, value)
    return value if isinstance(value, str) else str(value), None


def _truthy_env(value):
    return str(value).strip().lower() in ("1", "true", "yes", "on")


# ---------------------------------------------------------------------------
# Resolution
# ---------------------------------------------------------------------------
class _Stop(Exception):
    """SGLang would stop at startup here; later rules cannot run."""


class _Resolver(object):
    def __init__(self, args, version, arch, policy, draft_arch, env):
        self.version = version
        self.arch = arch
        self.draft_arch = draft_arch
        self.policy = policy
        self.env = env
        self.raw = _plain(dict(args))
        self.a = dict(self.raw)
        self.adjustments = []
        self.errors = []
        self.notes = []
        self.fixes = {}
        self.documented = None
        self.R = None

    # -- recording ---------------------------------------------------------
    def explicit(self, field):
        return self.raw.get(field) is not None

    def set(self, field, value, rule, log=None, doc=None, fix=None, force=False):
        current = self.a.get(field)
        if _same(current, value) and not log and not force:
            return
        self.adjustments.append({
            "arg": field,
            "from": current,
            "to": value,
            "rule": rule,
            "doc": doc or RULES[rule][0],
            "log": log or None,
        })
        if fix:
            self.fixes[(field, rule)] = fix
        if value is None and field not in self.a:
            return
        self.a[field] = value

    def error(self, message):
        if message not in self.errors:
            self.errors.append(message)

    def stop(self, message):
        self.error(message)
        raise _Stop()

    def sglang(self):
        return "SGLang %s" % self.version

    # -- helpers -----------------------------------------------------------
    def get(self, field, default=None):
        value = self.a.get(field)
        return default if value is None else value

    def page_size(self):
        return self.get("page_size", 1)

    def device(self):
        return str(self.get("device", "cuda"))

    def attn_dp(self):
        # sglang.md §1.3 step 2 / §1.4: attention-DP. 0.5.23 turns the deprecated
        # --enable-dp-attention with --dp-size N into attn_dp_size N (wheel
        # parallel_hook.py:40-61) and tests attn_dp_size > 1.
        if self.R >= _V0523:
            if self.get("attn_dp_size", 1) > 1:
                return True
            return bool(self.get("enable_dp_attention", False)) and self.get("dp_size", 1) > 1
        return bool(self.get("enable_dp_attention", False))

    def backends(self):
        backend = self.a.get("attention_backend")
        return (
            backend,
            self.a.get("prefill_attention_backend") or backend,
            self.a.get("decode_attention_backend") or backend,
        )

    def max_running(self):
        # sglang.md §1.3 step 3, §1.4, §1.7, §1.9: every algorithm; message only from 0.5.10.
        if self.a.get("max_running_requests") is None:
            self.set("max_running_requests", 48, "spec.max_running_requests",
                     log=MSG_MAX_RUNNING if self.R >= _V0510 else None,
                     doc="sglang.md §1.3 step 3" if self.R >= _V0523 else "sglang.md §1.9")

    # -- main ----------------------------------------------------------------
    def run(self):
        try:
            self.documented = rule_version(self.version)
        except ValueError as exc:
            self.error(str(exc))
            return self.result()
        self.R = DOCUMENTED_VERSIONS.index(self.documented)
        self.notes.extend(_version_notes(self.version, self.documented))
        if not self.check_keys():
            return self.result()
        if self.a.get("config") is not None:
            self.notes.append(
                "values inside the --config file %s are not seen by the resolver; pass them as args instead "
                "(sglang.md §5)" % self.a["config"])
        algorithm = self.a.get("speculative_algorithm")
        if algorithm is None or algorithm == "":
            if self.R >= _V0523 and self.get("enable_return_aux_hidden_states", False):
                # sglang.md §1.1 hook 1: the algorithm names the capture convention (wheel validation_hook.py:711-716).
                self.error(
                    "speculative_algorithm: SGLang %s raises \"--enable-return-aux-hidden-states needs "
                    "--speculative-algorithm EAGLE3, DFLASH or DSPARK to name the capture convention\"; set one of "
                    "them or drop enable_return_aux_hidden_states" % self.version)
            return self.result()
        try:
            self.resolve_speculation()
        except _Stop:
            pass
        if self.policy == "strict":
            self.strict_check()
        return self.result()

    def result(self):
        return {
            "args": self.a,
            "adjustments": self.adjustments,
            "errors": self.errors,
            "notes": self.notes,
        }

    def check_keys(self):
        """Validate keys and value types; False when a value has the wrong type (nothing else can run)."""
        types_ok = True
        for key in list(self.a):
            if key not in FLAGS:
                self.error(_unknown_key_message(key) + " (SGLang fails at startup with \"unrecognized arguments\")")
                continue
            value, problem = _coerce(key, self.a[key])
            if problem:
                self.error(problem)
                types_ok = False
                continue
            self.a[key] = value
            self.raw[key] = value
            if value is None or value is False:
                continue
            problem = _availability_error(key, self.version)
            if problem:
                self.error(problem)
        return types_ok

    # -- speculation -----------------------------------------------------------
    def resolve_speculation(self):
        raw_alg = str(self.a["speculative_algorithm"])
        self.raw_alg = raw_alg
        R = self.R

        # sglang.md §1.1 hook 1 (0.5.23 only; the flag does not exist before).
        if R >= _V0523 and self.get("enable_return_aux_hidden_states", False):
            self.aux_capture(raw_alg)
            return

        # sglang.md §1.8: flex attention rejects any speculation (0.5.23 attention hook).
        if R >= _V0523 and self.a.get("attention_backend") == "flex_attention":
            self.stop(
                "speculative_algorithm: SGLang %s rejects speculative decoding with attention_backend "
                "flex_attention (AssertionError \"Speculative decoding is currently not supported with Flex "
                "Attention backend\", sglang.md §1.8); use another attention_backend or drop "
                "speculative_algorithm" % self.version)

        if R >= _V0523 and self.get("enable_dp_attention", False) and not self.attn_dp():
            self.notes.append(
                "enable_dp_attention without dp_size > 1 does not turn attention-DP on in SGLang %s: the deprecated "
                "flag becomes attn_dp_size = dp_size (sglang.md §2.3); set dp_size or attn_dp_size for attention-DP"
                % self.version)

        alg = self.normalize_algorithm(raw_alg)

        # sglang.md §1.8: multi-layer EAGLE (model overrides run before the hook and see the raw name).
        if alg == "EAGLE":
            self.multi_layer_eagle(raw_alg)

        if R >= _V0510 and self.a.get("speculative_draft_model_path") is not None \
                and self.a.get("speculative_draft_model_revision") is None:
            # sglang.md §1.2 (0.5.10: server_args.py:2960-2964 in the wheel).
            self.set("speculative_draft_model_revision", "main", "spec.draft_revision_main")

        if R >= _V0523:
            self.checks_0523(alg)
            if self.get("speculative_adaptive", False):
                self.adaptive(alg)

        if alg in _EAGLE_FAMILY:
            self.eagle_family(alg)
        elif alg == "NGRAM":
            self.ngram()
        elif alg == "DFLASH":
            self.dflash()
        elif alg == "DSPARK":
            self.dspark()
        elif alg == "UNO":
            self.uno()
        elif alg == "FROZEN_KV_MTP":
            self.frozen_kv_mtp()

        if R >= _V0523:
            self.feature_constraints(alg)

    def aux_capture(self, raw_alg):
        # sglang.md §1.1 hook 1; conditions from the wheel (validation_hook.py:697-753).
        method = raw_alg.upper()
        if method not in ("EAGLE3", "DFLASH", "DSPARK"):
            self.stop(
                "speculative_algorithm: with enable_return_aux_hidden_states SGLang %s needs speculative_algorithm "
                "EAGLE3, DFLASH or DSPARK to name the capture convention, got %r (sglang.md §1.1); set one of "
                "those or drop enable_return_aux_hidden_states" % (self.version, raw_alg))
        if self.a.get("speculative_draft_model_path") is not None:
            self.stop(
                "speculative_draft_model_path: enable_return_aux_hidden_states captures without a draft; SGLang "
                "%s raises \"--enable-return-aux-hidden-states captures without a draft; drop "
                "--speculative-draft-model-path.\" Drop speculative_draft_model_path" % self.version)
        if self.get("pp_size", 1) != 1:
            self.stop("pp_size: enable_return_aux_hidden_states only supports pp_size == 1; set pp_size: 1")
        if method != "EAGLE3" and not self.a.get("return_aux_hidden_state_layer_ids"):
            self.stop(
                "return_aux_hidden_state_layer_ids: enable_return_aux_hidden_states with %s requires "
                "return_aux_hidden_state_layer_ids; set the target layer ids" % method)
        if method != raw_alg:
            self.set("speculative_algorithm", method, "algorithm.uppercase")
        self.set("speculative_algorithm", method, "aux.disables_speculation", force=True)
        self.notes.append(
            "enable_return_aux_hidden_states turns speculative decoding off: speculative_algorithm only names "
            "the capture convention and /server_info reports it as None (sglang.md §1.1 hook 1); no other "
            "speculative rule applies")

    def multi_layer_eagle(self, raw_alg):
        table = _MULTI_LAYER_0523 if self.R >= _V0523 else _MULTI_LAYER_0510 if self.R >= _V0510 else ()
        if not self.arch or not table:
            return
        for arch_part, message in table:
            if arch_part in self.arch:
                break
        else:
            return
        if raw_alg != "EAGLE":
            self.notes.append(
                "%s: the raw speculative_algorithm %r would not turn on multi-layer EAGLE (the model override "
                "sees the raw name), but the rendered canonical name EAGLE does; the effective args include "
                "enable_multi_layer_eagle: true (sglang.md §1.8)" % (self.arch, raw_alg))
        self.set("enable_multi_layer_eagle", True, "model.multi_layer_eagle", log=message)
        if self.R == _V0510:
            # 0.5.10 also switches spec v2 on for multi-layer EAGLE (wheel server_args.py:1800-1804).
            self.spec_v2_forced = True

    def normalize_algorithm(self, raw_alg):
        R = self.R
        if R < _V0523:
            choices = _ALGORITHM_CHOICES[R]
            if raw_alg not in choices:
                hint = ""
                upper = raw_alg.upper()
                if upper in choices:
                    hint = "; write it upper-case: speculative_algorithm: %s" % upper
                elif upper in _BUILTIN_0523:
                    first = "0.5.10" if upper in ("STANDALONE", "NGRAM") else "0.5.23"
                    hint = "; %s needs SGLang %s or newer" % (upper, first)
                self.stop(
                    "speculative_algorithm: %s rejects %r at startup (argparse: \"argument --speculative-algorithm: "
                    "invalid choice: %r (choose from %s)\", sglang.md §1.9); use one of %s%s"
                    % (self.sglang(), raw_alg, raw_alg, ", ".join("'%s'" % c for c in choices), ", ".join(choices), hint))
            alg = raw_alg
        else:
            # sglang.md §1.2: upper-cased before anything else.
            alg = raw_alg.upper()
            if alg != raw_alg:
                self.set("speculative_algorithm", alg, "algorithm.uppercase")
        gemma4 = (
            R >= _V0523
            and self.draft_arch in _GEMMA4_DRAFTS
            and self.a.get("speculative_draft_model_path") is not None
        )
        if self.draft_arch in _GEMMA4_DRAFTS and R >= _V0523 and not gemma4:
            self.notes.append(
                "draft_arch %s is ignored: without speculative_draft_model_path SGLang reads no draft config "
                "(sglang.md §1.2)" % self.draft_arch)
        if gemma4 and alg == "EAGLE3":
            self.stop(
                "speculative_algorithm: SGLang %s raises \"Gemma4AssistantForCausalLM draft requires "
                "--speculative-algorithm NEXTN or EAGLE; EAGLE3 is not supported for this draft architecture.\" "
                "(sglang.md §1.2); set speculative_algorithm: EAGLE" % self.version)
        if gemma4 and alg in ("NEXTN", "EAGLE"):
            self.set("speculative_algorithm", "FROZEN_KV_MTP", "algorithm.gemma4_frozen_kv_mtp",
                     log=MSG_GEMMA4_PROMOTE.format(alg=alg),
                     fix="set speculative_algorithm: FROZEN_KV_MTP, the algorithm SGLang runs for a Gemma4 assistant draft")
            return "FROZEN_KV_MTP"
        if alg == "NEXTN":
            # sglang.md §1.2, §1.9 "NEXTN → EAGLE": every version, no message.
            self.set("speculative_algorithm", "EAGLE", "algorithm.nextn_alias")
            alg = "EAGLE"
        if R >= _V0523 and alg not in _BUILTIN_0523:
            self.stop(
                "speculative_algorithm: SGLang %s raises \"Unknown speculative algorithm name: %s\" (sglang.md "
                "§1.2) unless a plugin registers it; use one of %s"
                % (self.version, alg, ", ".join(n for n in _BUILTIN_0523 if n not in ("NEXTN", "FROZEN_KV_MTP"))))
        return alg

    def checks_0523(self, alg):
        # sglang.md §1.2: PD decode with radix cache.
        if (self.a.get("disaggregation_mode") == "decode" and self.get("disaggregation_decode_enable_radix_cache", False)
                and alg not in ("DSPARK", "EAGLE", "EAGLE3")):
            self.stop(
                "disaggregation_decode_enable_radix_cache: SGLang %s raises \"--disaggregation-decode-enable-radix-cache "
                "is incompatible with speculative decoding (--speculative-algorithm %s)\" (sglang.md §1.2); drop it "
                "or use EAGLE, EAGLE3 or DSPARK" % (self.version, alg))

    # -- adaptive (sglang.md §1.5) ------------------------------------------
    def adaptive(self, alg):
        reason = None
        topk = self.a.get("speculative_eagle_topk")
        # Reasons and their order as in the wheel (adaptive_spec_params.py:56-100).
        if alg not in ("EAGLE", "EAGLE3"):
            reason = "speculative_algorithm=%s (only EAGLE/EAGLE3 are supported)" % alg
        elif topk is not None and topk != 1:
            reason = "speculative_eagle_topk=%s (only topk=1 is supported)" % topk
        elif self.attn_dp():
            reason = "attention DP is not supported (adaptive tier decisions are not synchronized across DP ranks)"
        elif self.get("enable_multi_layer_eagle", False):
            reason = "enable_multi_layer_eagle=True is not supported (MultiLayerEagleWorkerV2 does not implement adaptive)"
        elif self.get("enable_two_batch_overlap", False):
            reason = "enable_two_batch_overlap=True is not supported (adaptive state swap would discard the TboAttnBackend wrapper)"
        elif self.get("enable_pdmux", False):
            reason = "enable_pdmux=True is not supported (adaptive state swap does not update decode_attn_backend_group)"
        if reason:
            self.set("speculative_adaptive", False, "adaptive.disabled", log=MSG_ADAPTIVE_OFF.format(reason=reason),
                     fix="drop speculative_adaptive, or change the setting it names: %s" % reason)
            return
        candidates = self.adaptive_candidates()
        if candidates is None:
            return
        if topk is None:
            self.set("speculative_eagle_topk", 1, "adaptive.topk_default")
        if self.a.get("speculative_num_steps") is None:
            self.set("speculative_num_steps", candidates[len(candidates) // 2], "adaptive.steps_default")
        steps = self.a["speculative_num_steps"]
        if steps not in candidates:
            self.stop(
                "speculative_num_steps: SGLang %s raises \"--speculative-num-steps=%s is not in the adaptive config "
                "candidate_steps %s. Pass one of those values.\" (sglang.md §1.5); set speculative_num_steps to one "
                "of %s" % (self.version, steps, list(candidates), ", ".join(str(c) for c in candidates)))
        self.set("speculative_num_draft_tokens", steps + 1, "adaptive.draft_tokens",
                 fix="drop speculative_num_draft_tokens or set it to speculative_num_steps + 1 (%d); adaptive mode "
                     "always uses steps + 1" % (steps + 1))

    def adaptive_candidates(self):
        path = self.a.get("speculative_adaptive_config")
        if path is None:
            return list(_ADAPTIVE_DEFAULT_CANDIDATES)
        try:
            with open(path) as handle:
                config = json.load(handle)
            steps = set()
            for key, entry in config.items():
                if str(key).isdigit():
                    values = entry.get("candidate_steps")
                    if not isinstance(values, list) or not values or not all(
                            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in values):
                        raise ValueError("BS %s: candidate_steps must be a list of non-negative ints, got %r" % (key, values))
                    steps.update(values)
            if not steps:
                raise ValueError("speculative_adaptive_config must contain at least one integer-string BS key")
            return sorted(steps)
        except (OSError, ValueError, AttributeError) as exc:
            self.notes.append(
                "speculative_adaptive_config %r cannot be read here (%s); its candidate_steps are unknown, so "
                "speculative_num_steps is not checked against them (sglang.md §1.5)" % (path, exc))
            steps = self.a.get("speculative_num_steps")
            if steps is None:
                self.stop(
                    "speculative_num_steps: adaptive mode picks the middle of the candidate_steps in %r, which cannot "
                    "be read here; set speculative_num_steps explicitly (sglang.md §1.5)" % path)
            if self.a.get("speculative_eagle_topk") is None:
                self.set("speculative_eagle_topk", 1, "adaptive.topk_default")
            self.set("speculative_num_draft_tokens", steps + 1, "adaptive.draft_tokens")
            return None

    # -- EAGLE, EAGLE3, STANDALONE ---------------------------------------------
    def eagle_family(self, alg):
        R = self.R
        adaptive = R >= _V0523 and self.get("speculative_adaptive", False)

        # §1.3 step 2 (0.5.10 too: server_args.py:2987-2991 in the wheel).
        if alg == "STANDALONE" and self.attn_dp():
            self.stop(
                "enable_dp_attention: SGLang %s raises \"Currently standalone speculative decoding does not support "
                "dp attention.\" (sglang.md §1.3 step 2); drop enable_dp_attention or use EAGLE/EAGLE3" % self.version)

        self.max_running()  # §1.3 step 3
        self.overlap_eagle(alg)  # §1.3 steps 4-5, §1.9
        self.mixed_chunk_eagle(alg)  # §1.3 step 6, §1.9
        self.mtp_draft_path()  # §1.3 step 7
        if R >= _V0523 and self.arch == "IQuestQ1ForCausalLM":
            self.honor_draft_tokens(adaptive)
            self.iquest()  # §1.3 step 8

        self.honor_draft_tokens(adaptive)
        steps = self.a.get("speculative_num_steps")
        topk = self.a.get("speculative_eagle_topk")
        draft = self.a.get("speculative_num_draft_tokens")
        if not adaptive and steps is None:
            if topk is not None or draft is not None:
                # §1.3 step 9, §1.9 "Bare assert".
                given = [f for f, v in (("speculative_eagle_topk", topk), ("speculative_num_draft_tokens", draft)) if v is not None]
                fix = "set all three of speculative_num_steps, speculative_eagle_topk and speculative_num_draft_tokens, or none of them"
                if topk == 1 and draft is not None and draft >= 2:
                    fix += " (for example speculative_num_steps: %d, or policy honor_draft_tokens)" % (draft - 1)
                self.stop(
                    "speculative_num_steps: not set while %s %s set; %s fails at startup with a bare AssertionError "
                    "and no message (sglang.md §1.3 step 9); %s"
                    % (" and ".join(given), "is" if len(given) == 1 else "are", self.sglang(), fix))
            self.auto_params(alg)
            steps = self.a.get("speculative_num_steps")
            topk = self.a.get("speculative_eagle_topk")

        if topk is None and not adaptive:
            # §1.3 pitfall, §1.10 item 2.
            self.stop(
                "speculative_eagle_topk: not set while speculative_num_steps is; %s compares None > 1 and dies with a "
                "TypeError (sglang.md §1.3 pitfall); set speculative_eagle_topk and speculative_num_draft_tokens too, "
                "or drop speculative_num_steps" % self.sglang())

        if R >= _V051 and topk is not None and topk > 1 and "trtllm_mha" in self.backends():
            # §1.3 step 10, §1.9.
            self.stop(
                "speculative_eagle_topk: %s raises \"%s\" (sglang.md §1.3 step 10); set speculative_eagle_topk: 1 or "
                "use another attention backend than trtllm_mha" % (self.sglang(), MSG_TRTLLM))

        if R == _V046 and topk is not None and topk > 1 and self.page_size() > 1:
            # §1.9 "page_size > 1 and topk > 1", 0.4.6 column: silently forced, with a warning.
            self.set("speculative_eagle_topk", 1, "eagle.page_size_topk1", log=MSG_PAGE_TOPK1_046,
                     fix="set page_size: 1 to keep speculative_eagle_topk %s, or set speculative_eagle_topk: 1" % topk)
            topk = 1
            self.honor_draft_tokens(adaptive)

        steps = self.a.get("speculative_num_steps")
        draft = self.a.get("speculative_num_draft_tokens")
        if topk == 1 and draft != steps + 1:
            # §1.3 step 13, every version (§1.9).
            fix = "set speculative_num_steps: %d" % (draft - 1) if draft is not None and draft >= 2 else \
                "set speculative_num_draft_tokens: %d" % (steps + 1)
            self.set("speculative_num_draft_tokens", steps + 1, "eagle.topk1_draft_tokens", log=MSG_TOPK1,
                     doc="sglang.md §1.3 step 13" if R >= _V0523 else "sglang.md §1.3 step 13, §1.9", fix=fix)

        if topk is not None and topk > 1 and self.page_size() > 1 and R >= _V0510:
            self.page_size_check(topk)

        if topk is not None and topk > 1 and self.a.get("speculative_num_draft_tokens") is None:
            self.notes.append(
                "speculative_num_draft_tokens is unset with speculative_eagle_topk %s; SGLang does not fill it "
                "(sglang.md §1.3); set it explicitly" % topk)

    def honor_draft_tokens(self, adaptive):
        """Policy honor_draft_tokens: steps := draft tokens - 1 when topk is 1 (sglang.md §1.3 step 13)."""
        if self.policy != "honor_draft_tokens" or adaptive:
            return
        if self.a.get("speculative_eagle_topk") != 1 or not self.explicit("speculative_num_draft_tokens"):
            return
        draft = self.raw["speculative_num_draft_tokens"]
        if draft < 2 or self.a.get("speculative_num_steps") == draft - 1:
            return
        self.set("speculative_num_steps", draft - 1, "policy.honor_draft_tokens", doc="sglang.md §1.3 step 13")

    def overlap_eagle(self, alg):
        R = self.R
        if R <= _V051:
            # §1.9 "Overlap scheduler": always off, warning printed every time.
            self.set("disable_overlap_schedule", True, "spec.overlap_schedule_off", log=MSG_OVERLAP_OLD,
                     fix="upgrade to SGLang 0.5.23, where the overlap scheduler stays on for EAGLE (sglang.md §1.9)")
        elif R == _V0510:
            # §1.9: off unless SGLANG_ENABLE_SPEC_V2=1; spec v2 also required topk = 1 (wheel server_args.py:2999-3019).
            spec_v2 = _truthy_env((self.env or {}).get("SGLANG_ENABLE_SPEC_V2", "")) or getattr(self, "spec_v2_forced", False)
            if spec_v2:
                topk = self.a.get("speculative_eagle_topk")
                self.set("disable_overlap_schedule", False, "spec.overlap_schedule_spec_v2", log=MSG_SPEC_V2_ON_0510,
                         fix="unset SGLANG_ENABLE_SPEC_V2 to keep the overlap scheduler off")
                if topk is not None and topk > 1:
                    self.stop(
                        "speculative_eagle_topk: SGLang %s with SGLANG_ENABLE_SPEC_V2 raises \"%s\" (sglang.md §1.9); "
                        "set speculative_eagle_topk: 1 or unset SGLANG_ENABLE_SPEC_V2" % (self.version, MSG_SPEC_V2_TOPK))
            else:
                self.set("disable_overlap_schedule", True, "spec.overlap_schedule_off", log=MSG_OVERLAP_0510,
                         fix="set SGLANG_ENABLE_SPEC_V2=1 in the server environment (topk 1 only) or upgrade to SGLang 0.5.23")
        else:
            # §1.3 steps 4-5: the overlap scheduler stays on, except on CPU.
            if self.device() == "cpu" and not self.get("disable_overlap_schedule", False):
                self.set("disable_overlap_schedule", True, "spec.overlap_schedule_off", log=MSG_OVERLAP_CPU,
                         doc="sglang.md §1.3 step 4", fix="run on a GPU device; on CPU speculation needs the overlap scheduler off")
            if self.get("disable_overlap_schedule", False):
                self.set("disable_overlap_schedule", True, "spec.sync_spec_v2", log=MSG_SYNC_SPEC_V2)

    def mixed_chunk_eagle(self, alg):
        if not self.get("enable_mixed_chunk", False):
            return
        if _V0410 <= self.R <= _V0510:
            # §1.9 "Mixed chunk": off for the EAGLE family, with a warning (text from the wheel).
            self.set("enable_mixed_chunk", False, "spec.mixed_chunk_off", log=MSG_MIXED_EAGLE_OLD,
                     fix="drop enable_mixed_chunk; SGLang %s cannot mix chunked prefill with speculative decoding" % self.version)
        elif self.R >= _V0523 and alg == "STANDALONE":
            # §1.3 step 6.
            self.set("enable_mixed_chunk", False, "spec.mixed_chunk_off", log=MSG_MIXED_STANDALONE,
                     doc="sglang.md §1.3 step 6", fix="drop enable_mixed_chunk or use EAGLE/EAGLE3, which can mix")

    def mtp_draft_path(self):
        archs = _MTP_DRAFT_PATH_ARCHS[self.R]
        if self.arch is None:
            if self.a.get("speculative_draft_model_path") is None:
                self.notes.append(
                    "arch not given: SGLang uses the model path as draft path for MTP architectures such as "
                    "DeepseekV3ForCausalLM (sglang.md §1.3 step 7); pass arch to model it")
            return
        if self.arch not in archs:
            return
        if self.a.get("speculative_draft_model_path") is None and self.a.get("model_path") is None:
            self.notes.append("model_path is not set, so the MTP draft path default (sglang.md §1.3 step 7) is not modelled")
        elif self.a.get("speculative_draft_model_path") is None:
            self.set("speculative_draft_model_path", self.a.get("model_path"), "eagle.mtp_draft_path")
            if self.R >= _V0510:
                revision = self.a.get("revision")
                if revision is None:
                    # Rendering the draft path makes the server apply §1.2 (revision main); see module docstring.
                    self.set("speculative_draft_model_revision", "main", "spec.draft_revision_main")
                    self.notes.append(
                        "the MTP draft path is rendered explicitly, so SGLang gives it revision 'main' (sglang.md §1.2); "
                        "started without it, SGLang would report speculative_draft_model_revision None")
                else:
                    self.set("speculative_draft_model_revision", revision, "eagle.mtp_draft_path")
        elif self.arch not in _MTP_NO_WARNING:
            self.set("speculative_draft_model_path", self.a["speculative_draft_model_path"],
                     "eagle.mtp_draft_path_warning", log=MSG_MTP_DRAFT_PATH)
        if self.R == _V051 and self.page_size() != 1 and self.a.get("attention_backend") == "flashinfer":
            # §1.9 "Draft path defaults to model path", 0.5.1 column; message from the wheel (server_args.py:642-645).
            self.stop(
                "page_size: SGLang %s raises \"Speculative decoding with page_size != 1 is not supported. Please set "
                "page_size to 1.\" for %s with attention_backend flashinfer (sglang.md §1.9); set page_size: 1 or "
                "another attention_backend" % (self.version, self.arch))

    def iquest(self):
        # §1.3 step 8; messages from the wheel (speculative_hook.py:1014-1059).
        draft_path = self.a.get("speculative_draft_model_path")
        if draft_path is None or draft_path == self.a.get("model_path"):
            self.stop("speculative_draft_model_path: SGLang %s raises \"IQuest Q1 requires an independent draft model "
                      "path.\" (sglang.md §1.3 step 8); set the path of the MTP draft checkpoint" % self.version)
        steps = self.a.get("speculative_num_steps")
        if steps is None:
            self.stop("speculative_num_steps: for IQuestQ1ForCausalLM SGLang takes the default from the draft "
                      "checkpoint's num_draft_slots, which the resolver cannot read (sglang.md §1.3 step 8); set "
                      "speculative_num_steps explicitly")
        if steps < 1:
            self.stop("speculative_num_steps: SGLang %s raises \"MTP requires positive speculative_num_steps.\"; "
                      "set it to 1 or more" % self.version)
        if self.a.get("speculative_eagle_topk") not in (None, 1):
            self.stop("speculative_eagle_topk: SGLang %s raises \"MTP requires --speculative-eagle-topk 1.\" "
                      "(sglang.md §1.3 step 8); set speculative_eagle_topk: 1" % self.version)
        if self.a.get("speculative_num_draft_tokens") not in (None, steps + 1):
            self.stop("speculative_num_draft_tokens: SGLang %s raises \"MTP verification width must equal draft "
                      "steps + 1.\" (sglang.md §1.3 step 8); set speculative_num_draft_tokens: %d"
                      % (self.version, steps + 1))
        self.set("speculative_eagle_topk", 1, "eagle.iquest_mtp")
        self.set("speculative_num_draft_tokens", steps + 1, "eagle.iquest_mtp")

    def auto_params(self, alg):
        """§1.6 (0.5.10+) and §1.9 "Automatic (steps, topk, draft)" for older releases."""
        R = self.R
        if R == _V046:
            params = (5, 4, 8)
        elif R >= _V0510 and alg == "STANDALONE":
            params = (3, 1, 4)
        elif self.arch is None:
            self.stop(
                "speculative_num_steps, speculative_eagle_topk and speculative_num_draft_tokens are not set, so %s "
                "picks them from the target model's architectures[0] (sglang.md §1.6); pass arch (architectures[0] "
                "of the model's config.json) or set all three explicitly" % self.sglang())
        elif R == _V0410:
            params = (3, 1, 4) if self.arch in _AUTO_314_0410 else (5, 4, 8)
        elif R == _V051:
            params = (3, 1, 4) if self.arch in _AUTO_314_051 else (5, 4, 8)
        else:
            params = (5, 4, 8) if self.arch in _AUTO_548_0510 else (3, 1, 4)
        doc = "sglang.md §1.6" if R >= _V0510 else "sglang.md §1.9"
        for field, value in zip(("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens"), params):
            self.set(field, value, "eagle.auto_params", doc=doc)

    def page_size_check(self, topk):
        backend = self.a.get("attention_backend")
        allowed = ("flashinfer", "fa3", "triton") if self.R >= _V0523 else ("flashinfer", "fa3")
        if backend in allowed:
            return
        if self.R >= _V0523:
            quoted = ("speculative_eagle_topk > 1 with page_size > 1 is only supported on %r; got attention_backend=%r. "
                      "Use page_size == 1 or one of those backends." % (allowed, backend))
            doc = "sglang.md §1.3 step 14"
        else:
            quoted = ("speculative_eagle_topk > 1 with page_size > 1 is unstable and produces incorrect results for paged "
                      "attention backends. This combination is only supported for the 'flashinfer' backend.")
            doc = "sglang.md §1.9"
        if backend is None:
            self.stop(
                "attention_backend: not set, with speculative_eagle_topk %s and page_size %s; SGLang %s picks the backend "
                "by hardware (sglang.md §1.8) and raises \"%s\" unless it is one of %s (%s); set attention_backend to one "
                "of them, or use page_size: 1 or speculative_eagle_topk: 1"
                % (topk, self.page_size(), self.version, quoted, ", ".join(allowed), doc))
        self.stop(
            "page_size: %s with speculative_eagle_topk %s and attention_backend %s: SGLang %s raises \"%s\" (%s); use "
            "page_size: 1, speculative_eagle_topk: 1, or attention_backend %s"
            % (self.page_size(), topk, backend, self.version, quoted, doc, " / ".join(allowed)))

    # -- NGRAM (sglang.md §1.4; 0.5.10 from §1.9 and the wheel) ---------------------
    def ngram(self):
        R = self.R
        device = self.device()
        if R == _V0510 and not device.startswith("cuda"):
            self.stop("device: SGLang %s raises \"Ngram speculative decoding only supports CUDA device.\" (sglang.md "
                      "§1.9); run NGRAM on cuda" % self.version)
        if R >= _V0523 and device not in ("cuda", "cpu", "xpu"):
            self.stop("device: SGLang %s raises \"Ngram speculative decoding only supports CUDA, CPU, or XPU devices.\" "
                      "(sglang.md §1.4); use device cuda, cpu or xpu" % self.version)
        if R >= _V0523 and device == "cpu" and not self.get("disable_overlap_schedule", False):
            self.set("disable_overlap_schedule", True, "spec.overlap_schedule_off", log=MSG_OVERLAP_CPU, doc="sglang.md §1.4")
        self.max_running()
        if R == _V0510:
            self.set("disable_overlap_schedule", True, "spec.overlap_schedule_off", log=MSG_NGRAM_0510,
                     fix="upgrade to SGLang 0.5.23, where NGRAM keeps the overlap scheduler on CUDA")
            self.set("enable_mixed_chunk", False, "spec.mixed_chunk_off", log=MSG_NGRAM_0510,
                     fix="drop enable_mixed_chunk; NGRAM cannot mix chunked prefill")
        else:
            self.set("enable_mixed_chunk", False, "spec.mixed_chunk_off", log=MSG_MIXED_NGRAM, doc="sglang.md §1.4",
                     fix="drop enable_mixed_chunk; NGRAM cannot mix chunked prefill")
        breadth = self.get("speculative_ngram_max_bfs_breadth", 10)
        wanted = self.a.get("speculative_eagle_topk")
        self.set("speculative_eagle_topk", breadth, "ngram.topk_bfs_breadth",
                 fix="set speculative_ngram_max_bfs_breadth: %s instead of speculative_eagle_topk (NGRAM ignores it)" % wanted)
        if self.a.get("speculative_num_draft_tokens") is None:
            self.set("speculative_num_draft_tokens", 12, "ngram.draft_tokens_default", log=MSG_NGRAM_DRAFT12)
        if R >= _V0523 and self.a.get("speculative_num_steps") is None:
            if breadth < 1:
                self.stop("speculative_ngram_max_bfs_breadth: must be at least 1; SGLang %s divides "
                          "speculative_num_draft_tokens by it (sglang.md §1.4)" % self.version)
            self.set("speculative_num_steps", self.a["speculative_num_draft_tokens"] // breadth, "ngram.steps_default")
        topk = breadth
        if topk > 1 and self.page_size() > 1 and self.a.get("attention_backend") != "flashinfer":
            message = ("speculative_eagle_topk(%s) > 1 with page_size(%s) > 1 is unstable and produces incorrect results "
                       "for paged attention backends. This combination is only supported for the 'flashinfer' backend."
                       % (topk, self.page_size()))
            self.stop(
                "page_size: SGLang %s raises \"%s\" (sglang.md §1.4); set attention_backend: flashinfer, page_size: 1, "
                "or speculative_ngram_max_bfs_breadth: 1" % (self.version, message))
        if self.attn_dp():
            self.stop(
                "enable_dp_attention: SGLang %s raises \"Currently ngram speculative decoding does not support dp "
                "attention.\" (sglang.md §1.4); drop enable_dp_attention or use another algorithm" % self.version)

    # -- DFLASH, DSPARK, UNO, FROZEN_KV_MTP (sglang.md §1.7, 0.5.23) --------------
    def force_one(self, field, rule, message):
        value = self.a.get(field)
        if value is None:
            self.set(field, 1, rule)
        elif value != 1:
            self.set(field, 1, rule, log=message % value, fix="set %s: 1; %s" % (field, RULES[rule][1]))

    def dflash(self):
        device = self.device()
        if not (device.startswith("cuda") or device in ("npu", "xpu")):
            self.stop("device: SGLang %s raises \"DFLASH speculative decoding is not supported by … on device %r.\" "
                      "(sglang.md §1.7); DFLASH runs on CUDA, NPU or XPU" % (self.version, device))
        if self.attn_dp() and device != "npu" and not self.get("enable_dp_lm_head", False):
            self.stop("enable_dp_lm_head: SGLang %s raises \"DFLASH with dp attention requires --enable-dp-lm-head.\"; "
                      "set enable_dp_lm_head: true or drop attention-DP" % self.version)
        if self.get("pp_size", 1) != 1:
            self.stop("pp_size: SGLang %s raises \"Currently DFLASH speculative decoding only supports pp_size == 1.\" "
                      "(sglang.md §1.7); set pp_size: 1" % self.version)
        if self.a.get("speculative_draft_model_path") is None:
            self.stop("speculative_draft_model_path: SGLang %s raises \"DFLASH speculative decoding requires setting "
                      "--speculative-draft-model-path.\" (sglang.md §1.7); set the DFLASH draft path" % self.version)
        self.force_one("speculative_num_steps", "dflash.steps_topk_1",
                       "DFLASH only supports speculative_num_steps == 1; overriding speculative_num_steps=%s to 1.")
        self.force_one("speculative_eagle_topk", "dflash.steps_topk_1",
                       "DFLASH only supports speculative_eagle_topk == 1; overriding speculative_eagle_topk=%s to 1.")
        block = self.a.get("speculative_dflash_block_size")
        draft = self.a.get("speculative_num_draft_tokens")
        if block is not None:
            if block <= 0:
                self.stop("speculative_dflash_block_size: SGLang %s raises \"DFLASH requires "
                          "--speculative-dflash-block-size to be positive, got %s.\"; give a positive block size"
                          % (self.version, block))
            if draft is not None and draft != block:
                self.stop(
                    "speculative_num_draft_tokens: %s and speculative_dflash_block_size %s differ; SGLang %s raises "
                    "\"Both --speculative-num-draft-tokens and --speculative-dflash-block-size are set but they differ. "
                    "For DFLASH they must match.\" (sglang.md §1.7); set them equal or drop one"
                    % (draft, block, self.version))
            self.set("speculative_num_draft_tokens", block, "dflash.block_size")
        elif draft is None:
            self.notes.append(
                "DFLASH: speculative_num_draft_tokens comes from the draft config's block size, or 16 with a warning "
                "(sglang.md §1.7); set speculative_dflash_block_size to pin it")
        self.max_running()

    def dspark(self):
        device = self.device()
        if not device.startswith(("cuda", "npu", "xpu")):
            self.stop("device: SGLang %s raises \"DSpark speculative decoding only supports CUDA, NPU or XPU device.\" "
                      "(sglang.md §1.7)" % self.version)
        if self.get("pp_size", 1) != 1 and self.a.get("disaggregation_mode") != "prefill":
            self.stop("pp_size: SGLang %s supports DSPARK with pipeline parallelism only on PD prefill "
                      "(sglang.md §1.8); set pp_size: 1 or disaggregation_mode: prefill" % self.version)
        if self.a.get("speculative_draft_model_path") is None:
            self.notes.append(
                "DSPARK without speculative_draft_model_path: SGLang looks for a draft bundled in the target "
                "checkpoint or its dspark/ subfolder and fails if there is none (sglang.md §1.7)")
        self.force_one("speculative_num_steps", "dspark.steps_topk_1",
                       "DSpark only supports speculative_num_steps == 1; overriding speculative_num_steps=%s to 1.")
        self.force_one("speculative_eagle_topk", "dspark.steps_topk_1",
                       "DSpark only supports speculative_eagle_topk == 1; overriding speculative_eagle_topk=%s to 1.")
        gamma = self.a.get("speculative_dspark_block_size")
        draft = self.a.get("speculative_num_draft_tokens")
        if gamma is not None:
            if gamma <= 0:
                self.stop("speculative_dspark_block_size: must be positive, got %s (sglang.md §1.7)" % gamma)
            if draft is not None and draft != gamma + 1:
                self.stop(
                    "speculative_num_draft_tokens: %s, but DSPARK needs gamma + 1 = %d with speculative_dspark_block_size "
                    "%s; SGLang %s raises \"DSpark speculative_num_draft_tokens must equal gamma + 1 …\" (sglang.md §1.7); "
                    "set speculative_num_draft_tokens: %d or drop it" % (draft, gamma + 1, gamma, self.version, gamma + 1))
            self.set("speculative_num_draft_tokens", gamma + 1, "dspark.gamma_draft_tokens")
        else:
            if draft is not None and draft < 2:
                self.stop("speculative_num_draft_tokens: SGLang %s raises \"DSpark speculative_num_draft_tokens must be "
                          ">= 2 (= gamma + 1), got %s.\"; set it to gamma + 1" % (self.version, draft))
            self.notes.append(
                "DSPARK: gamma comes from the draft config or a default (\"DSpark gamma is not set; defaulting to …\"); "
                "set speculative_dspark_block_size to pin speculative_num_draft_tokens = gamma + 1 (sglang.md §1.7)")
        self.max_running()

    def uno(self):
        # sglang.md §1.7; messages and the linear/tree split from the wheel (speculative_hook.py:449-611).
        if not self.device().startswith("cuda"):
            self.stop("device: SGLang %s raises \"UNO only supports CUDA.\" (sglang.md §1.7)" % self.version)
        if self.a.get("speculative_draft_model_path") is not None:
            self.stop("speculative_draft_model_path: SGLang %s raises \"UNO reuses the target model and does not accept "
                      "--speculative-draft-model-path.\" (sglang.md §1.7); drop it" % self.version)
        if self.a.get("uno_lora_path") is None:
            self.stop("uno_lora_path: SGLang %s raises \"UNO requires --uno-lora-path.\" (sglang.md §1.7); set "
                      "uno_lora_path" % self.version)
        draft = self.a.get("speculative_num_draft_tokens")
        if draft is None or draft < 1:
            self.stop("speculative_num_draft_tokens: UNO requires a positive speculative_num_draft_tokens (the verify "
                      "width Q) (sglang.md §1.7); set it")
        topk = self.get("speculative_eagle_topk", 1)
        if topk < 1:
            self.stop("speculative_eagle_topk: UNO requires at least 1, got %s" % topk)
        if topk > 1:
            steps = self.a.get("speculative_num_steps")
            if steps is None or steps < 1:
                self.stop("speculative_num_steps: UNO tree mode (speculative_eagle_topk > 1) requires a positive "
                          "speculative_num_steps; set it")
            if draft < steps + 1 or draft > 128 or draft * topk > 2048:
                self.stop("speculative_num_draft_tokens: UNO tree mode needs steps + 1 <= Q <= 128 and Q * topk <= 2048; "
                          "got Q=%s, steps=%s, topk=%s" % (draft, steps, topk))
            self.notes.append("UNO tree mode: the tree-capacity checks of SGLang are not modelled (sglang.md §1.7)")
        else:
            for field in ("speculative_num_steps", "speculative_eagle_topk"):
                old = self.a.get(field)
                if old is None:
                    self.set(field, 1, "uno.steps_topk_1")
                elif old != 1:
                    self.set(field, 1, "uno.steps_topk_1", log="UNO uses %s=1; overriding %s." % (field, old),
                             fix="set %s: 1; UNO linear mode forces it" % field)
        if (self.get("tp_size", 1), self.get("pp_size", 1)) != (1, 1):
            self.stop("tp_size: SGLang %s raises \"UNO requires TP=PP=1.\" (sglang.md §1.7); set tp_size: 1 and "
                      "pp_size: 1" % self.version)
        if self.attn_dp():
            self.stop("enable_dp_attention: UNO does not support DP attention (sglang.md §1.7); drop it")
        if self.get("enable_lora", False) or self.a.get("lora_paths"):
            self.stop("enable_lora: SGLang %s raises \"UNO does not support public Multi-LoRA serving.\"; drop "
                      "enable_lora and lora_paths" % self.version)
        if self.get("enable_mixed_chunk", False):
            self.set("enable_mixed_chunk", False, "spec.mixed_chunk_off", log=MSG_MIXED_UNO, doc="sglang.md §1.7",
                     fix="drop enable_mixed_chunk; UNO cannot mix chunked prefill")
        _attention, prefill, decode = self.backends()
        if (prefill is not None and prefill != "fa3") or (decode is not None and decode != "fa3"):
            self.stop("attention_backend: SGLang %s raises \"UNO requires FA3 for both prefill and decode attention; "
                      "got prefill=%r, decode=%r.\" (sglang.md §1.7); set attention_backend: fa3"
                      % (self.version, prefill, decode))
        if prefill is None or decode is None:
            self.notes.append("UNO needs FA3 for prefill and decode; attention_backend is unset, so the hardware default "
                              "decides (sglang.md §1.7); set attention_backend: fa3")
        self.max_running()

    def frozen_kv_mtp(self):
        # sglang.md §1.7 (and §1.1: its own handler, no steps/topk rules).
        self.max_running()
        if self.get("enable_mixed_chunk", False):
            self.set("enable_mixed_chunk", False, "spec.mixed_chunk_off", log=MSG_MIXED_FROZEN, doc="sglang.md §1.7",
                     fix="drop enable_mixed_chunk; Frozen-KV MTP cannot mix chunked prefill")

    # -- §1.8 feature constraints (0.5.23) ----------------------------------------
    def feature_constraints(self, alg):
        topk = self.a.get("speculative_eagle_topk")
        if self.get("enable_unified_memory", False):
            if alg not in ("DSPARK", "EAGLE", "EAGLE3", "DFLASH"):
                self.error("enable_unified_memory: SGLang %s supports it only with speculative_algorithm DSPARK, DFLASH, "
                           "EAGLE or EAGLE3, got %s (AssertionError, sglang.md §1.8); drop enable_unified_memory"
                           % (self.version, alg))
            elif topk not in (None, 1):
                self.error("enable_unified_memory: needs speculative_eagle_topk 1 (a linear draft chain), got %s "
                           "(AssertionError, sglang.md §1.8); set speculative_eagle_topk: 1" % topk)
        if self.get("enable_pd_role_switch", False):
            self.error("enable_pd_role_switch: SGLang %s refuses it with speculative decoding (sglang.md §1.8); drop "
                       "enable_pd_role_switch or speculative_algorithm" % self.version)
        if (self.get("enable_lora", False) or self.a.get("lora_paths")) and alg not in ("NGRAM", "EAGLE", "EAGLE3", "DFLASH", "DSPARK"):
            self.error("enable_lora: SGLang %s raises \"LoRA is only compatible with NGRAM, EAGLE, NEXTN, EAGLE3, DFLASH, "
                       "or DSPARK speculative decoding, not %s.\" (sglang.md §1.8); drop LoRA or change the algorithm"
                       % (self.version, alg))
        if self.get("pp_size", 1) > 1 and alg != "DSPARK":
            if alg != "EAGLE" or self.get("enable_multi_layer_eagle", False):
                self.error("pp_size: SGLang %s asserts \"Pipeline parallelism currently only supports EAGLE "
                           "(non-multi-layer) speculative decoding\" (sglang.md §1.8); set pp_size: 1 or use "
                           "single-layer EAGLE" % self.version)

    # -- strict policy -----------------------------------------------------------
    def strict_check(self):
        for field, intended in self.raw.items():
            if intended is None or field not in FLAGS:
                continue
            final = self.a.get(field)
            if field == "speculative_algorithm" and final is not None:
                canon = str(intended).upper()
                canon = "EAGLE" if canon == "NEXTN" else canon
                if canon == final:
                    continue
            if _same(final, intended):
                continue
            rule = None
            for adj in self.adjustments:
                if adj["arg"] == field and not _same(adj["from"], adj["to"]):
                    rule = adj
            if rule is None:
                continue
            fix = self.fixes.get((field, rule["rule"])) or "set %s: %s explicitly, or change the settings that trigger %s" % (
                field, _fmt(final), rule["rule"])
            self.error(
                "%s: intended %s, but %s would run %s (rule %s, %s); policy strict forbids changing a value you "
                "set. Fix: %s" % (field, _fmt(intended), self.sglang(), _fmt(final), rule["rule"], rule["doc"], fix))


def resolve(args, version=DEFAULT_VERSION, arch=None, policy=DEFAULT_POLICY, draft_arch=None, env=None):
    """Resolve intended SGLang args the way SGLang ``version`` would.

    :param args: dict of SGLang field names (snake_case) to intended values.
    :param version: SGLang version string (see the module docstring for ranges).
    :param arch: the target model's ``architectures[0]``; drives automatic
        defaults (sglang.md §1.6) and MTP draft paths (§1.3 step 7).
    :param policy: ``mirror``, ``honor_draft_tokens`` (default) or ``strict``.
    :param draft_arch: the draft model's ``architectures[0]`` (Gemma4 promotion, §1.2).
    :param env: the server's environment variables (0.5.10 reads SGLANG_ENABLE_SPEC_V2).
    :returns: ``{"args", "adjustments", "errors", "notes"}``.
    :raises ValueError: only for malformed input (non-dict args, unparseable
        version, unknown policy, non-string arch); SGLang configuration errors
        are returned in ``errors``.
    """
    if not isinstance(args, dict) and not (hasattr(args, "items") and hasattr(args, "keys")):
        raise ValueError("SGLang args must be a dict of field names to values, got %s %r" % (type(args).__name__, args))
    if policy not in POLICIES:
        raise ValueError("unknown resolution policy %r (%s); use one of %s" % (policy, type(policy).__name__, ", ".join(POLICIES)))
    parse_version(version)
    for name, value in (("arch", arch), ("draft_arch", draft_arch)):
        if value is not None and not isinstance(value, str):
            raise ValueError("%s must be a string such as 'LlamaForCausalLM' (architectures[0]), got %s %r"
                             % (name, type(value).__name__, value))
    if env is not None and not hasattr(env, "get"):
        raise ValueError("env must be a dict of environment variables, got %s %r" % (type(env).__name__, env))
    for key in args:
        if not isinstance(key, str):
            raise ValueError("SGLang arg names must be strings, got %s %r" % (type(key).__name__, key))
    resolver = _Resolver(args, str(version), str(arch) if arch else None, policy,
                         str(draft_arch) if draft_arch else None, env)
    return resolver.run()


# ---------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------
def _scalar_token(field, value):
    if isinstance(value, bool):
        raise ValueError("argument '%s' (%s) takes a value, not a boolean %r" % (field, FLAGS[field]["flag"], value))
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise ValueError("argument '%s' must be a finite number, got %r" % (field, value))
        return repr(value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return str(value)


def _checked_items(args, version):
    if not isinstance(args, dict) and not hasattr(args, "items"):
        raise ValueError("SGLang args must be a dict of field names to values, got %s %r" % (type(args).__name__, args))
    items = []
    for key, value in _plain(dict(args)).items():
        if key not in FLAGS:
            raise ValueError(_unknown_key_message(key))
        value, problem = _coerce(key, value)
        if problem:
            raise ValueError(problem)
        if value is None or value is False:
            continue
        if version is not None:
            problem = _availability_error(key, version)
            if problem:
                raise ValueError(problem)
        items.append((key, value))
    return items


def to_argv(args, version=DEFAULT_VERSION, secrets="include"):
    """Render args as an argv token list with SGLang's exact flag spellings.

    Booleans true become the bare store_true flag and false is omitted; None
    is omitted; lists become ``--flag a b`` (SGLang declares list flags with
    ``nargs``, sglang.md §5; an empty list is omitted); dicts and JSON
    arguments become one compact JSON token; ``model_path`` comes first, the
    rest keeps the order of ``args``. A value that starts with ``-`` is written
    ``--flag=value`` so argparse cannot take it for an option, except
    ``config``, which SGLang only detects as the separate token ``--config``
    (sglang.md §5 pitfall).

    ``secrets="omit"`` leaves out ``api_key`` and ``admin_api_key`` (pass them
    through a 0600 ``--config`` file instead, 0.5.10+).

    Raises ValueError naming the key for unknown keys (with the closest known
    name), wrong value types, and flags the target version does not accept.
    """
    if secrets not in ("include", "omit"):
        raise ValueError("secrets must be 'include' or 'omit', got %s %r" % (type(secrets).__name__, secrets))
    rule_version(version)
    items = _checked_items(args, version)
    items.sort(key=lambda item: 0 if item[0] == "model_path" else 1)
    argv = []
    for key, value in items:
        spec = FLAGS[key]
        if secrets == "omit" and spec["secret"]:
            continue
        flag = spec["flag"]
        if spec["type"] == "bool":
            argv.append(flag)
        elif spec["type"] == "list":
            if not value:
                continue
            argv.append(flag)
            argv.extend(_scalar_token(key, item) for item in value)
        else:
            token = _scalar_token(key, value)
            if key == "config":
                if token.startswith("-"):
                    raise ValueError("argument 'config': the path %r starts with '-'; SGLang needs '--config FILE' as "
                                     "two tokens, so use a path like ./%s" % (token, token))
                argv.extend([flag, token])
            elif token.startswith("-"):
                argv.append("%s=%s" % (flag, token))
            else:
                argv.extend([flag, token])
    return argv


_YAML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r", "\0": "\\0"}


def yaml_quote(text):
    """Quote ``text`` as a YAML double-quoted scalar (safe for any string)."""
    out = ['"']
    for char in str(text):
        code = ord(char)
        if char in _YAML_ESCAPES:
            out.append(_YAML_ESCAPES[char])
        elif code < 0x20 or 0x7F <= code <= 0x9F or code in (0x2028, 0x2029, 0xFEFF) or 0xD800 <= code <= 0xDFFF:
            out.append("\\u%04x" % code)
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def _yaml_scalar(field, value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _scalar_token(field, value)
    if isinstance(value, (dict, list)):
        return yaml_quote(json.dumps(value, sort_keys=True, separators=(",", ":")))
    return yaml_quote(value)


def to_config_yaml(args, version=None):
    """Render args as the text of an SGLang ``--config`` YAML file (sglang.md §5).

    Keys are the flag spellings without ``--`` (``api-key``), because SGLang
    turns each key into ``--<key>`` as written. Booleans: true only (false and
    None are omitted); lists become YAML sequences (empty lists omitted); dicts
    and JSON arguments become one quoted JSON string; strings are always
    double-quoted. ``config`` itself and ``lora_paths`` cannot go into the file
    (ValueError). With ``version`` the flags are version-checked and
    ``--config`` needs 0.5.10 or newer.
    """
    if version is not None and not flag_available("config", version):
        raise ValueError("--config needs SGLang 0.5.10 or newer; SGLang %s has no config file support (sglang.md §5); "
                         "pass the arguments on the command line" % version)
    lines = []
    for key, value in _checked_items(args, version):
        spec = FLAGS[key]
        if not spec["config"]:
            raise ValueError("argument '%s' (%s) cannot be written to a --config file; SGLang raises \"Unsupported config "
                             "option\" or allows only one config (sglang.md §5); pass it on the command line"
                             % (key, spec["flag"]))
        name = spec["flag"][2:]
        if spec["type"] == "list":
            if not value:
                continue
            lines.append("%s:" % name)
            lines.extend("  - %s" % _yaml_scalar(key, item) for item in value)
        elif spec["type"] == "json":
            text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))
            lines.append("%s: %s" % (name, yaml_quote(text)))
        else:
            lines.append("%s: %s" % (name, _yaml_scalar(key, value)))
    return "\n".join(lines) + "\n" if lines else "{}\n"


# ---------------------------------------------------------------------------
# Explanations and log scanning
# ---------------------------------------------------------------------------
_DEFAULT_RULE_FOR_ARG = {
    "speculative_num_draft_tokens": "eagle.topk1_draft_tokens",
    "max_running_requests": "spec.max_running_requests",
    "disable_overlap_schedule": "spec.overlap_schedule_off",
    "enable_mixed_chunk": "spec.mixed_chunk_off",
    "speculative_draft_model_revision": "spec.draft_revision_main",
    "speculative_draft_model_path": "eagle.mtp_draft_path",
    "speculative_adaptive": "adaptive.disabled",
    "enable_multi_layer_eagle": "model.multi_layer_eagle",
}


def _explain_rule(rule, arg, intended, running, args):
    args = args or {}
    steps = args.get("speculative_num_steps")
    if rule == "eagle.topk1_draft_tokens":
        if isinstance(intended, int) and not isinstance(intended, bool) and intended >= 2:
            fix = "set speculative_num_steps: %d" % (intended - 1)
        else:
            fix = "set speculative_num_draft_tokens to speculative_num_steps + 1"
        return "SGLang sets it to num_steps + 1 when speculative_eagle_topk == 1; " + fix
    if rule == "policy.honor_draft_tokens":
        return "the honor_draft_tokens policy set num_steps = num_draft_tokens - 1 so that SGLang keeps the draft tokens"
    if rule == "spec.max_running_requests":
        return "SGLang resets an unset max_running_requests to 48 for speculative decoding; set max_running_requests explicitly"
    if rule == "spec.overlap_schedule_off":
        return ("SGLang turns the overlap scheduler off for this speculative setup (before 0.5.23 always for EAGLE, "
                "on CPU, and for NGRAM in 0.5.10); set disable_overlap_schedule: true to match")
    if rule == "spec.overlap_schedule_spec_v2":
        return "SGLANG_ENABLE_SPEC_V2 (or a multi-layer EAGLE model) turns the overlap scheduler on in 0.5.10; unset it to keep overlap off"
    if rule == "spec.sync_spec_v2":
        return "with the overlap scheduler off SGLang 0.5.23 runs the synchronous spec-v2 path; expected"
    if rule == "eagle.mtp_draft_path_warning":
        return "SGLang only warns that MTP checkpoints need no draft path; the value is kept"
    if rule == "spec.mixed_chunk_off":
        return "SGLang turns mixed chunked prefill off because the speculative algorithm cannot mix; drop enable_mixed_chunk"
    if rule == "algorithm.nextn_alias":
        return "NEXTN is an alias that SGLang reports as EAGLE; write speculative_algorithm: EAGLE"
    if rule == "algorithm.uppercase":
        return "SGLang upper-cases the algorithm name; write it upper-case"
    if rule == "algorithm.gemma4_frozen_kv_mtp":
        return "a Gemma4 assistant draft promotes NEXTN/EAGLE to FROZEN_KV_MTP; write speculative_algorithm: FROZEN_KV_MTP"
    if rule == "aux.disables_speculation":
        return "enable_return_aux_hidden_states turns speculative decoding off and reports the algorithm as None; expected"
    if rule == "spec.draft_revision_main":
        return "SGLang gives a draft path without a draft revision the revision main; set speculative_draft_model_revision"
    if rule == "eagle.mtp_draft_path":
        return "for MTP checkpoints SGLang uses the model path as draft path when none is given; set speculative_draft_model_path"
    if rule == "eagle.auto_params":
        return ("steps, topk and draft tokens were all unset, so SGLang chose them by architecture; set all three of "
                "speculative_num_steps, speculative_eagle_topk and speculative_num_draft_tokens")
    if rule == "eagle.page_size_topk1":
        return "SGLang 0.4.6 forces topk to 1 when page_size > 1; set page_size: 1 to keep topk %s" % _fmt(intended)
    if rule == "ngram.topk_bfs_breadth":
        return ("NGRAM replaces speculative_eagle_topk with speculative_ngram_max_bfs_breadth; set "
                "speculative_ngram_max_bfs_breadth: %s" % _fmt(intended))
    if rule == "ngram.draft_tokens_default":
        return "NGRAM defaults an unset speculative_num_draft_tokens to 12; set it explicitly"
    if rule == "ngram.steps_default":
        return "NGRAM defaults speculative_num_steps to num_draft_tokens // topk; set it explicitly"
    if rule in ("dflash.steps_topk_1", "dspark.steps_topk_1", "uno.steps_topk_1"):
        return "%s forces it to 1; set %s: 1" % (rule.split(".")[0].upper(), arg)
    if rule == "dflash.block_size":
        return "DFLASH sets speculative_num_draft_tokens to speculative_dflash_block_size; set them equal"
    if rule == "dspark.gamma_draft_tokens":
        return "DSPARK sets speculative_num_draft_tokens to gamma + 1; set speculative_dspark_block_size accordingly"
    if rule == "adaptive.disabled":
        return "SGLang switched adaptive mode off for an unsupported setup (see the 'speculative_adaptive disabled:' log line)"
    if rule in ("adaptive.topk_default", "adaptive.steps_default", "adaptive.draft_tokens"):
        detail = "num_steps + 1" if rule == "adaptive.draft_tokens" else "its default"
        return "adaptive mode sets it to %s%s; set it explicitly" % (
            detail, " (num_steps %s)" % steps if steps is not None and rule == "adaptive.draft_tokens" else "")
    if rule == "model.multi_layer_eagle":
        return "SGLang turns multi-layer EAGLE on for this architecture when the algorithm is EAGLE"
    if rule == "eagle.iquest_mtp":
        return "IQuest Q1 MTP drafts force topk 1 and draft tokens = steps + 1"
    return None


def _default_rule(arg, intended, running, args):
    """The usual rule behind a difference in ``arg``, when it fits the values seen."""
    args = args or {}
    if arg == "speculative_algorithm":
        if str(intended).upper() == "NEXTN" and running == "EAGLE":
            return "algorithm.nextn_alias"
        if running == "FROZEN_KV_MTP":
            return "algorithm.gemma4_frozen_kv_mtp"
        if running is None:
            return "aux.disables_speculation"
        return "algorithm.uppercase" if str(intended).upper() == str(running) else None
    if arg == "speculative_eagle_topk":
        return "eagle.page_size_topk1" if running == 1 and isinstance(intended, int) and intended > 1 else None
    if arg == "speculative_num_draft_tokens":
        fits = args.get("speculative_eagle_topk") in (None, 1) and isinstance(running, int) and running >= 1
        return "eagle.topk1_draft_tokens" if fits else None
    expected_running = {
        "max_running_requests": 48,
        "disable_overlap_schedule": True,
        "enable_mixed_chunk": False,
        "speculative_draft_model_revision": "main",
        "speculative_adaptive": False,
        "enable_multi_layer_eagle": True,
    }
    if arg in expected_running and _same(running, expected_running[arg]):
        return _DEFAULT_RULE_FOR_ARG[arg]
    if arg == "speculative_draft_model_path" and running is not None and running == args.get("model_path"):
        return _DEFAULT_RULE_FOR_ARG[arg]
    return None


def explain(arg, intended, running, version=DEFAULT_VERSION, args=None, arch=None):
    """One line explaining why ``arg`` runs with ``running`` instead of ``intended``.

    Form: ``<arg>: intended X, running Y — <why>; <fix>``. ``args`` (the
    intended args) lets the engine find the exact rule: the args are resolved
    under ``mirror`` and the adjustment that produced ``running`` is
    explained. Otherwise the usual rule for that argument is used when it fits
    the values; any other difference gets a generic line. Secret values are
    masked.
    """
    rule = None
    if args is not None and hasattr(args, "items"):
        probe = _plain(dict(args))
        if intended is None:
            probe.pop(arg, None)
        else:
            probe[arg] = intended
        try:
            result = resolve(probe, version, arch=arch, policy="mirror")
        except ValueError:
            result = {"adjustments": []}
        for adj in result["adjustments"]:
            if adj["arg"] == arg and _same(adj["to"], running) and not _same(adj["from"], adj["to"]):
                rule = adj["rule"]
    if rule is None:
        rule = _default_rule(arg, intended, running, args if hasattr(args, "get") else None)
    text = _explain_rule(rule, arg, intended, running, args) if rule else None
    if arg in SECRET_ARGS:
        intended, running = ("********" if intended is not None else None), ("********" if running is not None else None)
    head = "%s: intended %s, running %s" % (arg, _fmt(intended), _fmt(running))
    if text:
        return "%s \u2014 %s" % (head, text)
    flag = FLAGS[arg]["flag"] if arg in FLAGS else "--" + str(arg).replace("_", "-")
    return ("%s \u2014 no known SGLang %s rule changes this argument; check the server log for a warning naming %s and "
            "make sure the server was started with the rendered arguments" % (head, version, flag))


def scan_override_log(text, version=None):
    """Find known override warnings in server log ``text``.

    Returns ``[{"arg", "rule", "line"}]`` in log order. With ``version`` only
    the patterns documented for that release are used.
    """
    documented = rule_version(version) if version is not None else None
    patterns = [p for p in OVERRIDE_LOG_PATTERNS if documented is None or documented in p["versions"]]
    found = []
    for line in str(text).splitlines():
        for pattern in patterns:
            if pattern["text"] in line:
                found.append({"arg": pattern["arg"], "rule": pattern["rule"], "line": line.strip()})
    return found
