# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Tables the mirror's rules read: algorithms, architectures, model families (from the wheels)."""
from __future__ import annotations

from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.versions import (
    V0410 as _V0410,
    V046 as _V046,
    V051 as _V051,
    V0510 as _V0510,
    V0523 as _V0523,
)


# ---------------------------------------------------------------------------
# Architecture and algorithm tables
# ---------------------------------------------------------------------------
# sglang-rules.md §9 "CLI choices"; 0.5.23 takes a free string (§1 built-in names).
ALGORITHM_CHOICES = {
    _V046: ("EAGLE", "EAGLE3", "NEXTN"),
    _V0410: ("EAGLE", "EAGLE3", "NEXTN"),
    _V051: ("EAGLE", "EAGLE3", "NEXTN"),
    _V0510: ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"),
}
BUILTIN_0523 = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO", "FROZEN_KV_MTP")
EAGLE_FAMILY = ("EAGLE", "EAGLE3", "STANDALONE")
GEMMA4_DRAFTS = ("Gemma4AssistantForCausalLM", "Gemma4UnifiedAssistantForCausalLM")

# sglang-rules.md §3 step 7 and §9 "Draft path defaults to model path"
# (exact 0.5.10 list read in the wheel, server_args.py:3029-3051).
MTP_0510 = (
    "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM", "Glm4MoeForCausalLM", "Glm4MoeLiteForCausalLM",
    "GlmMoeDsaForCausalLM", "BailingMoeForCausalLM", "BailingMoeV2ForCausalLM", "BailingMoeV2_5ForCausalLM",
    "MistralLarge3ForCausalLM", "PixtralForConditionalGeneration",
)
MTP_DRAFT_PATH_ARCHS = {
    _V046: ("DeepseekV3ForCausalLM",),
    _V0410: ("DeepseekV3ForCausalLM", "Glm4MoeForCausalLM"),
    _V051: ("DeepseekV3ForCausalLM", "Glm4MoeForCausalLM"),
    _V0510: MTP_0510,
    _V0523: MTP_0510 + ("DeepseekV4ForCausalLM", "HYV3ForCausalLM", "HYV4ForCausalLM", "Qwen4ExpForConditionalGeneration"),
}
# §3 step 7b: no warning for these two.
MTP_NO_WARNING = ("MistralLarge3ForCausalLM", "PixtralForConditionalGeneration")

# sglang-rules.md §6 and §9 "Automatic (steps, topk, draft)".
AUTO_314_0410 = ("DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM")
AUTO_314_051 = AUTO_314_0410 + ("GptOssForCausalLM",)
AUTO_548_0510 = ("LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM")

# sglang-rules.md §8: multi-layer EAGLE is turned on when the raw algorithm is
# literally "EAGLE". Substring matches as in the wheel (0.5.10
# server_args.py:1794-1830; 0.5.23 overrides.py:331-350, model_overrides/).
MULTI_LAYER_0510 = (
    ("MiMoV2FlashForCausalLM", "Enable multi-layer EAGLE speculative decoding for MiMoV2FlashForCausalLM model."),
    ("Step3p5ForCausalLM", "Enable multi-layer EAGLE speculative decoding for Step3p5ForCausalLM model."),
)
MULTI_LAYER_0523 = (
    ("Step3p5ForCausalLM", "Enable multi-layer EAGLE speculative decoding for Step3p5ForCausalLM model."),
    ("Step3p7ForConditionalGeneration", "Enable multi-layer EAGLE speculative decoding for Step3p5ForCausalLM model."),
    ("MiMoV2ForCausalLM", "Enable multi-layer EAGLE speculative decoding for MiMoV2 model."),
    ("MiMoV2FlashForCausalLM", "Enable multi-layer EAGLE speculative decoding for MiMoV2 model."),
    ("GigaChat35ForCausalLM", "Enable multi-layer EAGLE speculative decoding for GigaChat 3.5 model."),
)

# Models whose attention SGLang runs as MLA (its own default backend, sglang-rules.md §11).
MLA_ARCHS = (
    "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "DeepseekV4ForCausalLM",
    "KimiK25ForConditionalGeneration", "KimiVLForConditionalGeneration", "DeepseekVL2ForCausalLM",
    "Glm4MoeLiteForCausalLM", "GlmMoeDsaForCausalLM", "MistralLarge3ForCausalLM",
)
# The DeepSeek-style model override picks trtllm_mla on SM100 when no backend is set (0.5.10+).
TRTLLM_MLA_ON_SM100 = ("DeepseekV3ForCausalLM", "KimiK25ForConditionalGeneration", "MistralLarge3ForCausalLM",
                       "PixtralForConditionalGeneration")
# Architectures whose checkpoints an older release cannot read (the first documented release that can).
ARCH_FIRST_RELEASE = {"KimiK25ForConditionalGeneration": _V0510}

# sglang-rules.md §5: union of the built-in candidate_steps tables.
ADAPTIVE_DEFAULT_CANDIDATES = (0, 1, 3, 5, 7)


def truthy_env(value):
    return str(value).strip().lower() in ("1", "true", "yes", "on")


# ---------------------------------------------------------------------------
# Resolution
# ---------------------------------------------------------------------------
class StopResolution(Exception):
    """SGLang would stop at startup here; later rules cannot run."""
