# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The mirror: SGLang's argument resolution re-implemented per documented release.

``resolve(args, version, arch, policy, draft_arch, env, gpu)`` returns
``{"args", "adjustments", "errors", "notes"}``. Each adjustment is
``{arg, from, to, rule, doc, log}``: ``rule`` is a record id of
``rules.RECORDS``, ``doc`` its reference in docs/reference/sglang-rules.md,
``log`` the line SGLang prints for it or None. An adjustment whose ``from``
equals ``to`` is informational (SGLang prints a line but keeps the value).

Fixed point: the returned ``args`` are what the server runs when started with
exactly those args, so ``resolve(result["args"], version, policy="mirror")``
changes nothing. Three choices keep that (each is noted when it applies): the
upper-case algorithm name is rendered; a defaulted MTP draft path is rendered
explicitly, so its revision follows the draft-path rule; with
``--enable-return-aux-hidden-states`` the algorithm stays in the args because
it names the capture convention.

Standard library only, Python 3.9+: runs on the controller (filters) and on
targets (modules).
"""
from __future__ import annotations

import json

from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import rules as R_
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.flags import (
    FLAGS,
    availability_error,
    coerce,
    fmt,
    plain,
    same,
    unknown_key_message,
)
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.rules import (
    MSG_ADAPTIVE_OFF,
    MSG_GEMMA4_PROMOTE,
    MSG_MAX_RUNNING,
    MSG_MIXED_EAGLE_OLD,
    MSG_MIXED_FROZEN,
    MSG_MIXED_NGRAM,
    MSG_MIXED_STANDALONE,
    MSG_MIXED_UNO,
    MSG_MTP_DRAFT_PATH,
    MSG_NGRAM_0510,
    MSG_NGRAM_DRAFT12,
    MSG_OVERLAP_0510,
    MSG_OVERLAP_CPU,
    MSG_OVERLAP_OLD,
    MSG_PAGE_TOPK1_046,
    MSG_SPEC_V2_ON_0510,
    MSG_SPEC_V2_TOPK,
    MSG_SYNC_SPEC_V2,
    MSG_TOPK1,
    MSG_TRTLLM,
)
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.versions import (
    DEFAULT_VERSION,
    DOCUMENTED_VERSIONS,
    V046 as _V046,
    V0410 as _V0410,
    V051 as _V051,
    V0510 as _V0510,
    V0523 as _V0523,
    parse_version,
    rule_version,
    version_notes,
)

DEFAULT_POLICY = "honor_draft_tokens"
POLICIES = ("mirror", "honor_draft_tokens", "strict")

# ---------------------------------------------------------------------------
# Architecture and algorithm tables
# ---------------------------------------------------------------------------
# sglang-rules.md §9 "CLI choices"; 0.5.23 takes a free string (§1 built-in names).
_ALGORITHM_CHOICES = {
    _V046: ("EAGLE", "EAGLE3", "NEXTN"),
    _V0410: ("EAGLE", "EAGLE3", "NEXTN"),
    _V051: ("EAGLE", "EAGLE3", "NEXTN"),
    _V0510: ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"),
}
_BUILTIN_0523 = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO", "FROZEN_KV_MTP")
_EAGLE_FAMILY = ("EAGLE", "EAGLE3", "STANDALONE")
_GEMMA4_DRAFTS = ("Gemma4AssistantForCausalLM", "Gemma4UnifiedAssistantForCausalLM")

# sglang-rules.md §3 step 7 and §9 "Draft path defaults to model path"
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
# §3 step 7b: no warning for these two.
_MTP_NO_WARNING = ("MistralLarge3ForCausalLM", "PixtralForConditionalGeneration")

# sglang-rules.md §6 and §9 "Automatic (steps, topk, draft)".
_AUTO_314_0410 = ("DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM")
_AUTO_314_051 = _AUTO_314_0410 + ("GptOssForCausalLM",)
_AUTO_548_0510 = ("LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM")

# sglang-rules.md §8: multi-layer EAGLE is turned on when the raw algorithm is
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

# Models whose attention SGLang runs as MLA (its own default backend, sglang-rules.md §11).
_MLA_ARCHS = (
    "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "DeepseekV4ForCausalLM",
    "KimiK25ForConditionalGeneration", "KimiVLForConditionalGeneration", "DeepseekVL2ForCausalLM",
    "Glm4MoeLiteForCausalLM", "GlmMoeDsaForCausalLM", "MistralLarge3ForCausalLM",
)
# The DeepSeek-style model override picks trtllm_mla on SM100 when no backend is set (0.5.10+).
_TRTLLM_MLA_ON_SM100 = ("DeepseekV3ForCausalLM", "KimiK25ForConditionalGeneration", "MistralLarge3ForCausalLM",
                        "PixtralForConditionalGeneration")
# Architectures whose checkpoints an older release cannot read (the first documented release that can).
_ARCH_FIRST_RELEASE = {"KimiK25ForConditionalGeneration": _V0510}

# sglang-rules.md §5: union of the built-in candidate_steps tables.
_ADAPTIVE_DEFAULT_CANDIDATES = (0, 1, 3, 5, 7)


def _truthy_env(value):
    return str(value).strip().lower() in ("1", "true", "yes", "on")


# ---------------------------------------------------------------------------
# Resolution
# ---------------------------------------------------------------------------
class _Stop(Exception):
    """SGLang would stop at startup here; later rules cannot run."""


class _Resolver(object):
    def __init__(self, args, version, arch, policy, draft_arch, env, gpu=None):
        self.version = version
        self.gpu = gpu or normalize_gpu(None)
        self.arch = arch
        self.draft_arch = draft_arch
        self.policy = policy
        self.env = env
        self.raw = plain(dict(args))
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

    def set(self, field, value, rule, log=None, fix=None, force=False):
        current = self.a.get(field)
        if same(current, value) and not log and not force:
            return
        self.adjustments.append({
            "arg": field,
            "from": current,
            "to": value,
            "rule": rule,
            "doc": R_.doc_ref(rule),
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
        # sglang-rules.md §3 step 2 / §4: attention-DP. 0.5.23 turns the deprecated
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
        # sglang-rules.md §3 step 3, §4, §7, §9: every algorithm; message only from 0.5.10.
        if self.a.get("max_running_requests") is None:
            self.set("max_running_requests", 48, "spec.max_running_requests",
                     log=MSG_MAX_RUNNING if self.R >= _V0510 else None)

    # -- main ----------------------------------------------------------------
    def run(self):
        try:
            self.documented = rule_version(self.version)
        except ValueError as exc:
            self.error(str(exc))
            return self.result()
        self.R = DOCUMENTED_VERSIONS.index(self.documented)
        self.notes.extend(version_notes(self.version, self.documented))
        if not self.check_keys():
            return self.result()
        if self.a.get("config") is not None:
            self.notes.append(
                "values inside the --config file %s are not seen by the resolver; pass them as args instead "
                "(sglang-rules.md §12)" % self.a["config"])
        try:
            self.argparse_choices()
            self.before_speculation()
            algorithm = self.a.get("speculative_algorithm")
            if algorithm is None or algorithm == "":
                if self.R >= _V0523 and self.get("enable_return_aux_hidden_states", False):
                    # sglang-rules.md §1 hook 1: the algorithm names the capture convention.
                    self.error(
                        "speculative_algorithm: SGLang %s raises \"--enable-return-aux-hidden-states needs "
                        "--speculative-algorithm EAGLE3, DFLASH or DSPARK to name the capture convention\"; set one of "
                        "them or drop enable_return_aux_hidden_states" % self.version)
                    raise _Stop()
            else:
                self.resolve_speculation()
            self.check_server_args()
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
                self.error(unknown_key_message(key) + " (SGLang fails at startup with \"unrecognized arguments\")")
                continue
            problem = availability_error(key, self.version)
            if problem:
                if self.a[key] is not None and self.a[key] is not False:
                    self.error(problem)
                continue
            # the algorithm's choices have their own message (normalize_algorithm)
            value, problem = coerce(key, self.a[key], self.version, check_choices=key != "speculative_algorithm")
            if problem:
                self.error(problem)
                types_ok = False
                continue
            self.a[key] = value
            self.raw[key] = value
        return types_ok

    # -- before the speculative rules: parallel layout, attention backend, page size --
    def gpu_note(self, outcome):
        if not self.gpu["given"]:
            note = ("%s depends on the GPU; without gpu facts an H200 (SM 9.0) is assumed (sglang-rules.md §11); "
                    "pass gpu from nvidia-smi" % outcome)
            if note not in self.notes:
                self.notes.append(note)

    def sm(self, *majors):
        return self.gpu["major"] in majors

    def is_mla(self):
        return self.arch in _MLA_ARCHS

    def before_speculation(self):
        R = self.R
        if R >= _V0523:
            self.dp_attention_layout()
        if R <= _V051 and self.arch in _ARCH_FIRST_RELEASE and R < _ARCH_FIRST_RELEASE[self.arch]:
            # 0.5.1 reads the model config in every start; 0.4.x only for the EAGLE family
            alg = str(self.a.get("speculative_algorithm") or "").upper()
            if R == _V051 or alg in ("EAGLE", "EAGLE3", "NEXTN"):
                self.stop(
                    "model_path: SGLang %s cannot read a %s checkpoint (transformers raises \"The checkpoint you are "
                    "trying to load has model type ... but Transformers does not recognize this architecture\"); this "
                    "architecture needs SGLang %s or newer" % (self.version, self.arch,
                                                               DOCUMENTED_VERSIONS[_ARCH_FIRST_RELEASE[self.arch]]))
        self.attention_dp_checks()
        if R >= _V0510:
            self.default_attention_backend()
        self.backend_page_size()
        if R >= _V0510 and self.a.get("page_size") is None:
            pass  # stays unset in the args: SGLang's default 1
        if self.get("pp_size", 1) > 1 and not self.get("disable_overlap_schedule", False):
            self.set("disable_overlap_schedule", True, "parallel.pp_overlap_off",
                     log="Pipeline parallelism is incompatible with overlap schedule.")

    def argparse_choices(self):
        """Before 0.5.23 --speculative-algorithm is an argparse choice list: argparse refuses first."""
        raw = self.a.get("speculative_algorithm")
        if raw is not None and self.R < _V0523 and str(raw) not in _ALGORITHM_CHOICES[self.R]:
            self.normalize_algorithm(str(raw))

    def dp_attention_layout(self):
        """0.5.23: the deprecated --enable-dp-attention --dp-size N becomes attn_dp_size N, dp_size 1 (§8)."""
        if not self.get("enable_dp_attention", False):
            return
        if self.get("attn_dp_size", 1) == 1:
            self.set("attn_dp_size", self.get("dp_size", 1), "parallel.dp_attention_to_attn_dp")
            self.set("dp_size", 1, "parallel.dp_attention_to_attn_dp")
        # /server_info reports enable_dp_attention as attn_dp_size > 1
        self.set("enable_dp_attention", self.get("attn_dp_size", 1) > 1, "parallel.dp_attention_to_attn_dp")
        if self.get("attn_dp_size", 1) <= 1:
            self.notes.append(
                "enable_dp_attention without dp_size > 1 does not turn attention-DP on in SGLang %s: the deprecated "
                "flag becomes attn_dp_size = dp_size (sglang-rules.md §8); set attn_dp_size for attention-DP"
                % self.version)

    def attention_dp_checks(self):
        """Attention-DP needs tp_size divisible by the DP width (and, before 0.5.10, dp_size > 1) (§8)."""
        if self.R >= _V0523:
            width, enabled = self.get("attn_dp_size", 1), self.get("attn_dp_size", 1) > 1
        else:
            width, enabled = self.get("dp_size", 1), bool(self.get("enable_dp_attention", False))
        if not enabled:
            return
        if self.R <= _V051 and width <= 1:
            self.stop("dp_size: SGLang %s asserts \"Please set a dp-size > 1. You can use 1 < dp-size <= tp-size\" "
                      "with enable_dp_attention (sglang-rules.md §8); set dp_size to 2 or more" % self.version)
        if self.get("tp_size", 1) % width:
            self.stop("tp_size: %s is not a multiple of the attention-DP width %s; SGLang %s fails at startup with a bare "
                      "AssertionError (tp_size %% dp_size == 0, sglang-rules.md §8); use a dp_size that divides tp_size"
                      % (self.get("tp_size", 1), width, self.version))

    def default_attention_backend(self):
        """0.5.10 and 0.5.23: the backend SGLang picks when attention_backend is unset (§11)."""
        prefill, decode = self.a.get("prefill_attention_backend"), self.a.get("decode_attention_backend")
        if prefill is not None and prefill == decode:
            self.set("attention_backend", prefill, "attention.default_backend")
            return
        if self.a.get("attention_backend") is not None:
            return
        if self.device() == "cpu":
            self.set("attention_backend", "torch_native", "attention.default_backend")
            return
        if self.arch in _TRTLLM_MLA_ON_SM100 and prefill is None and decode is None:
            # the DeepSeek-style model override runs before the generic default (§11)
            self.gpu_note("the default attention_backend of %s" % self.arch)
            if self.sm(10):
                self.set("attention_backend", "trtllm_mla", "attention.default_backend",
                         log="Use trtllm_mla as attention backend on sm100 for DeepseekV3ForCausalLM")
                return
        if self.arch is None:
            self.notes.append("arch not given: SGLang's default attention backend differs for MLA models such as "
                              "DeepseekV3ForCausalLM; an MHA model is assumed (sglang-rules.md §11)")
        topk = self.a.get("speculative_eagle_topk")
        page = self.a.get("page_size")
        alg = self.a.get("speculative_algorithm")
        no_spec_or_topk1 = topk is None or (topk == 1 and page in (None, 1))
        if self.is_mla():
            backend = "fa3" if self.sm(9) else "flashinfer" if self.sm(10) else "triton"
        elif self.sm(9) and no_spec_or_topk1:
            backend = "fa3"
        elif self.sm(10) and no_spec_or_topk1 and (
                alg is None or topk is not None or (self.R >= _V0523 and str(alg).upper() == "DFLASH")):
            backend = "trtllm_mha"
        else:
            backend = "flashinfer"
        self.gpu_note("the default attention_backend (%s here)" % backend)
        self.set("attention_backend", backend, "attention.default_backend",
                 log="Attention backend not specified. Use %s backend by default." % backend)

    def backend_page_size(self):
        """Backends that need a page size force it; trtllm_mha needs the right GPU (§11)."""
        R = self.R
        attention, prefill, decode = self.backends()
        page = self.a.get("page_size")
        forced = None
        if attention == "flashmla" or (R >= _V0410 and decode == "flashmla"):
            forced = (64, "FlashMLA only supports a page_size of 64, change page_size to 64.")
        if attention == "cutlass_mla" or (R >= _V0410 and decode == "cutlass_mla"):
            if R < _V0523:
                forced = (128, "Cutlass MLA only supports a page_size of 128, change page_size to 128.")
        if attention == "trtllm_mla" or (R >= _V051 and decode == "trtllm_mla"):
            self.gpu_note("whether trtllm_mla is allowed")
            if R >= _V0410 and R <= _V0510 and not self.sm(10, 12):
                self.stop("attention_backend: SGLang %s raises \"TRTLLM MLA backend is only supported on Blackwell GPUs "
                          "(SM100). Please use a different backend.\" on this %s (SM %d.%d) (sglang-rules.md §11)"
                          % (self.version, self.gpu["name"], self.gpu["major"], self.gpu["minor"]))
            if R == _V0410 and self.a.get("speculative_algorithm") is not None:
                self.stop("attention_backend: SGLang %s raises \"trtllm_mla backend does not support speculative "
                          "decoding yet.\" (sglang-rules.md §11); use another attention_backend" % self.version)
            current = forced[0] if forced else page
            if R >= _V0410 and current not in (32, 64):
                forced = (64, "TensorRT-LLM MLA only supports page_size of 32 or 64, changing page_size from %s to 64."
                          % current)
        if "trtllm_mha" in (attention, prefill, decode) and R >= _V051:
            self.gpu_note("whether trtllm_mha is allowed")
            if R == _V051 and not self.sm(10):
                self.stop("attention_backend: SGLang %s raises \"TRTLLM MHA backend is only supported on Blackwell GPUs "
                          "(SM100). Please use a different backend.\" on this %s (SM %d.%d) (sglang-rules.md §11); use "
                          "fa3 or flashinfer" % (self.version, self.gpu["name"], self.gpu["major"], self.gpu["minor"]))
            if R == _V0510 and prefill == "trtllm_mha" and not self.sm(10):
                self.stop("attention_backend: SGLang %s raises \"TRTLLM MHA backend for prefill is only supported on "
                          "Blackwell GPUs (SM100). Please use a different prefill backend.\" on this %s (SM %d.%d) "
                          "(sglang-rules.md §11); use fa3 or flashinfer, or trtllm_mha for decode only"
                          % (self.version, self.gpu["name"], self.gpu["major"], self.gpu["minor"]))
            allowed = (16, 32, 64, 128) if R >= _V0523 else (16, 32, 64)
            current = forced[0] if forced else page
            if current not in allowed:
                forced = (64, "TensorRT-LLM MHA only supports page_size of %s, changing page_size from %s to 64."
                          % ("16, 32, 64 or 128" if R >= _V0523 else "16, 32 or 64", current))
        if forced and not same(page, forced[0]):
            self.set("page_size", forced[0], "attention.page_size_forced", log=forced[1])

    def check_server_args(self):
        """The final validation (check_server_args): pipeline parallelism with speculation (§8)."""
        if self.get("pp_size", 1) <= 1:
            return
        alg = self.a.get("speculative_algorithm")
        if self.R < _V0523:
            if alg is not None or self.get("enable_mixed_chunk", False):
                self.stop(
                    "pp_size: SGLang %s asserts \"Pipeline parallelism is not compatible with overlap schedule, "
                    "speculative decoding, mixed chunked prefill.\" (sglang-rules.md §8); set pp_size: 1 or drop "
                    "speculative_algorithm%s" % (self.version, " and enable_mixed_chunk" if self.get("enable_mixed_chunk") else ""))
            return
        if alg is None or self.get("enable_return_aux_hidden_states", False):
            return
        alg = str(alg).upper()
        prefill = self.a.get("disaggregation_mode") == "prefill"
        if alg == "DSPARK":
            if not prefill:
                self.stop("pp_size: SGLang %s asserts \"Pipeline parallel DSPARK requires disaggregation-mode=prefill\" "
                          "(sglang-rules.md §8); set pp_size: 1 or disaggregation_mode: prefill" % self.version)
            return
        if alg != "EAGLE" or self.get("enable_multi_layer_eagle", False):
            self.stop("pp_size: SGLang %s asserts \"Pipeline parallelism currently only supports EAGLE (non-multi-layer) "
                      "speculative decoding\" (sglang-rules.md §8); set pp_size: 1 or use single-layer EAGLE"
                      % self.version)
        if not prefill and not _truthy_env((self.env or {}).get("SGLANG_ENABLE_PP_SPEC", "")):
            self.stop("pp_size: SGLang %s asserts \"PP + speculative decoding (MTP) is only supported on prefill nodes "
                      "(disaggregation-mode=prefill)\" (sglang-rules.md §8); set pp_size: 1 or disaggregation_mode: "
                      "prefill" % self.version)

    # -- speculation -----------------------------------------------------------
    def resolve_speculation(self):
        raw_alg = str(self.a["speculative_algorithm"])
        self.raw_alg = raw_alg
        R = self.R

        # sglang-rules.md §1 hook 1 (0.5.23 only; the flag does not exist before).
        if R >= _V0523 and self.get("enable_return_aux_hidden_states", False):
            self.aux_capture(raw_alg)
            return

        # sglang-rules.md §8: flex attention rejects any speculation (0.5.23 attention hook).
        if R >= _V0523 and self.a.get("attention_backend") == "flex_attention":
            self.stop(
                "speculative_algorithm: SGLang %s rejects speculative decoding with attention_backend "
                "flex_attention (AssertionError \"Speculative decoding is currently not supported with Flex "
                "Attention backend\", sglang-rules.md §8); use another attention_backend or drop "
                "speculative_algorithm" % self.version)

        alg = self.normalize_algorithm(raw_alg)

        # sglang-rules.md §8: multi-layer EAGLE (model overrides run before the hook and see the raw name).
        if alg == "EAGLE":
            self.multi_layer_eagle(raw_alg)

        if R >= _V0510 and self.a.get("speculative_draft_model_path") is not None \
                and self.a.get("speculative_draft_model_revision") is None:
            # sglang-rules.md §2 (0.5.10: server_args.py:2960-2964 in the wheel).
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
        # sglang-rules.md §1 hook 1; conditions from the wheel (validation_hook.py:697-753).
        method = raw_alg.upper()
        if method not in ("EAGLE3", "DFLASH", "DSPARK"):
            self.stop(
                "speculative_algorithm: with enable_return_aux_hidden_states SGLang %s needs speculative_algorithm "
                "EAGLE3, DFLASH or DSPARK to name the capture convention, got %r (sglang-rules.md §1); set one of "
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
            "the capture convention and /server_info reports it as None (sglang-rules.md §1 hook 1); no other "
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
                "enable_multi_layer_eagle: true (sglang-rules.md §8)" % (self.arch, raw_alg))
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
                    "invalid choice: %r (choose from %s)\", sglang-rules.md §9); use one of %s%s"
                    % (self.sglang(), raw_alg, raw_alg, ", ".join("'%s'" % c for c in choices), ", ".join(choices), hint))
            alg = raw_alg
        else:
            # sglang-rules.md §2: upper-cased before anything else.
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
                "(sglang-rules.md §2)" % self.draft_arch)
        if gemma4 and alg == "EAGLE3":
            self.stop(
                "speculative_algorithm: SGLang %s raises \"Gemma4AssistantForCausalLM draft requires "
                "--speculative-algorithm NEXTN or EAGLE; EAGLE3 is not supported for this draft architecture.\" "
                "(sglang-rules.md §2); set speculative_algorithm: EAGLE" % self.version)
        if gemma4 and alg in ("NEXTN", "EAGLE"):
            self.set("speculative_algorithm", "FROZEN_KV_MTP", "algorithm.gemma4_frozen_kv_mtp",
                     log=MSG_GEMMA4_PROMOTE.format(alg=alg),
                     fix="set speculative_algorithm: FROZEN_KV_MTP, the algorithm SGLang runs for a Gemma4 assistant draft")
            return "FROZEN_KV_MTP"
        if alg == "NEXTN":
            # sglang-rules.md §2, §9 "NEXTN → EAGLE": every version, no message.
            self.set("speculative_algorithm", "EAGLE", "algorithm.nextn_alias")
            alg = "EAGLE"
        if R >= _V0523 and alg not in _BUILTIN_0523:
            self.stop(
                "speculative_algorithm: SGLang %s raises \"Unknown speculative algorithm name: %s\" (sglang-rules.md "
                "§2) unless a plugin registers it; use one of %s"
                % (self.version, alg, ", ".join(n for n in _BUILTIN_0523 if n not in ("NEXTN", "FROZEN_KV_MTP"))))
        return alg

    def checks_0523(self, alg):
        # sglang-rules.md §2: PD decode with radix cache.
        if (self.a.get("disaggregation_mode") == "decode" and self.get("disaggregation_decode_enable_radix_cache", False)
                and alg not in ("DSPARK", "EAGLE", "EAGLE3")):
            self.stop(
                "disaggregation_decode_enable_radix_cache: SGLang %s raises \"--disaggregation-decode-enable-radix-cache "
                "is incompatible with speculative decoding (--speculative-algorithm %s)\" (sglang-rules.md §2); drop it "
                "or use EAGLE, EAGLE3 or DSPARK" % (self.version, alg))

    # -- adaptive (sglang-rules.md §5) ------------------------------------------
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
                "candidate_steps %s. Pass one of those values.\" (sglang-rules.md §5); set speculative_num_steps to one "
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
                "speculative_num_steps is not checked against them (sglang-rules.md §5)" % (path, exc))
            steps = self.a.get("speculative_num_steps")
            if steps is None:
                self.stop(
                    "speculative_num_steps: adaptive mode picks the middle of the candidate_steps in %r, which cannot "
                    "be read here; set speculative_num_steps explicitly (sglang-rules.md §5)" % path)
            if self.a.get("speculative_eagle_topk") is None:
                self.set("speculative_eagle_topk", 1, "adaptive.topk_default")
            self.set("speculative_num_draft_tokens", steps + 1, "adaptive.draft_tokens")
            return None

    # -- EAGLE, EAGLE3, STANDALONE ---------------------------------------------
    def eagle_family(self, alg):
        R = self.R
        adaptive = R >= _V0523 and self.get("speculative_adaptive", False)

        # §3 step 2 (0.5.10 too: server_args.py:2987-2991 in the wheel).
        if alg == "STANDALONE" and self.attn_dp():
            self.stop(
                "enable_dp_attention: SGLang %s raises \"Currently standalone speculative decoding does not support "
                "dp attention.\" (sglang-rules.md §3 step 2); drop enable_dp_attention or use EAGLE/EAGLE3" % self.version)

        self.max_running()  # §3 step 3
        self.overlap_eagle(alg)  # §3 steps 4-5, §9
        self.mixed_chunk_eagle(alg)  # §3 step 6, §9
        self.mtp_draft_path()  # §3 step 7
        if R >= _V0523 and self.arch == "IQuestQ1ForCausalLM":
            self.honor_draft_tokens(adaptive)
            self.iquest()  # §3 step 8

        self.honor_draft_tokens(adaptive)
        steps = self.a.get("speculative_num_steps")
        topk = self.a.get("speculative_eagle_topk")
        draft = self.a.get("speculative_num_draft_tokens")
        if not adaptive and steps is None:
            if topk is not None or draft is not None:
                # §3 step 9, §9 "Bare assert".
                given = [f for f, v in (("speculative_eagle_topk", topk), ("speculative_num_draft_tokens", draft)) if v is not None]
                fix = "set all three of speculative_num_steps, speculative_eagle_topk and speculative_num_draft_tokens, or none of them"
                if topk == 1 and draft is not None and draft >= 2:
                    fix += " (for example speculative_num_steps: %d, or policy honor_draft_tokens)" % (draft - 1)
                self.stop(
                    "speculative_num_steps: not set while %s %s set; %s fails at startup with a bare AssertionError "
                    "and no message (sglang-rules.md §3 step 9); %s"
                    % (" and ".join(given), "is" if len(given) == 1 else "are", self.sglang(), fix))
            self.auto_params(alg)
            steps = self.a.get("speculative_num_steps")
            topk = self.a.get("speculative_eagle_topk")

        if topk is None and not adaptive and self.topk_none_raises():
            # §3 pitfall, §10 item 2: the first `topk > 1` comparison SGLang reaches raises.
            self.stop(
                "speculative_eagle_topk: not set while speculative_num_steps is; %s compares None > 1 and dies with a "
                "TypeError (sglang-rules.md §3 pitfall); set speculative_eagle_topk and speculative_num_draft_tokens too, "
                "or drop speculative_num_steps" % self.sglang())

        if R >= _V051 and topk is not None and topk > 1 and "trtllm_mha" in self.backends():
            # §3 step 10, §9.
            self.stop(
                "speculative_eagle_topk: %s raises \"%s\" (sglang-rules.md §3 step 10); set speculative_eagle_topk: 1 or "
                "use another attention backend than trtllm_mha" % (self.sglang(), MSG_TRTLLM))

        if R == _V046 and topk is not None and topk > 1 and self.page_size() > 1:
            # §9 "page_size > 1 and topk > 1", 0.4.6 column: silently forced, with a warning.
            self.set("speculative_eagle_topk", 1, "eagle.page_size_topk1", log=MSG_PAGE_TOPK1_046,
                     fix="set page_size: 1 to keep speculative_eagle_topk %s, or set speculative_eagle_topk: 1" % topk)
            topk = 1
            self.honor_draft_tokens(adaptive)

        steps = self.a.get("speculative_num_steps")
        draft = self.a.get("speculative_num_draft_tokens")
        if topk == 1 and draft != steps + 1:
            # §3 step 13, every version (§9).
            fix = "set speculative_num_steps: %d" % (draft - 1) if draft is not None and draft >= 2 else \
                "set speculative_num_draft_tokens: %d" % (steps + 1)
            self.set("speculative_num_draft_tokens", steps + 1, "eagle.topk1_draft_tokens", log=MSG_TOPK1, fix=fix)

        if topk is not None and topk > 1 and self.page_size() > 1 and R >= _V0510:
            self.page_size_check(topk)

        if topk is not None and topk > 1 and self.a.get("speculative_num_draft_tokens") is None:
            self.notes.append(
                "speculative_num_draft_tokens is unset with speculative_eagle_topk %s; SGLang does not fill it "
                "(sglang-rules.md §3); set it explicitly" % topk)

    def topk_none_raises(self):
        """Whether SGLang reaches a `speculative_eagle_topk > 1` comparison with topk None (§9 "Unset topk")."""
        if self.R >= _V0510:
            return True  # the page-size check at the end compares topk first
        if self.R >= _V051:
            return "trtllm_mha" in self.backends()  # only the trtllm_mha check compares it
        if self.R == _V046:
            return self.page_size() > 1  # `page_size > 1 and topk > 1`: page first
        return False

    def honor_draft_tokens(self, adaptive):
        """Policy honor_draft_tokens: steps := draft tokens - 1 when topk is 1 (sglang-rules.md §3 step 13)."""
        if self.policy != "honor_draft_tokens" or adaptive:
            return
        if self.a.get("speculative_eagle_topk") != 1 or not self.explicit("speculative_num_draft_tokens"):
            return
        draft = self.raw["speculative_num_draft_tokens"]
        if draft < 2 or self.a.get("speculative_num_steps") == draft - 1:
            return
        self.set("speculative_num_steps", draft - 1, "policy.honor_draft_tokens")

    def overlap_eagle(self, alg):
        R = self.R
        if R <= _V051:
            # §9 "Overlap scheduler": always off, warning printed every time.
            self.set("disable_overlap_schedule", True, "spec.overlap_schedule_off", log=MSG_OVERLAP_OLD,
                     fix="upgrade to SGLang 0.5.23, where the overlap scheduler stays on for EAGLE (sglang-rules.md §9)")
        elif R == _V0510:
            # §9: off unless SGLANG_ENABLE_SPEC_V2=1; spec v2 also required topk = 1 (wheel server_args.py:2999-3019).
            spec_v2 = _truthy_env((self.env or {}).get("SGLANG_ENABLE_SPEC_V2", "")) or getattr(self, "spec_v2_forced", False)
            if spec_v2:
                topk = self.a.get("speculative_eagle_topk")
                self.set("disable_overlap_schedule", False, "spec.overlap_schedule_spec_v2", log=MSG_SPEC_V2_ON_0510,
                         fix="unset SGLANG_ENABLE_SPEC_V2 to keep the overlap scheduler off")
                if topk is not None and topk > 1:
                    self.stop(
                        "speculative_eagle_topk: SGLang %s with SGLANG_ENABLE_SPEC_V2 raises \"%s\" (sglang-rules.md §9); "
                        "set speculative_eagle_topk: 1 or unset SGLANG_ENABLE_SPEC_V2" % (self.version, MSG_SPEC_V2_TOPK))
            else:
                self.set("disable_overlap_schedule", True, "spec.overlap_schedule_off", log=MSG_OVERLAP_0510,
                         fix="set SGLANG_ENABLE_SPEC_V2=1 in the server environment (topk 1 only) or upgrade to SGLang 0.5.23")
        else:
            # §3 steps 4-5: the overlap scheduler stays on, except on CPU.
            if self.device() == "cpu" and not self.get("disable_overlap_schedule", False):
                self.set("disable_overlap_schedule", True, "spec.overlap_schedule_off", log=MSG_OVERLAP_CPU,
                         fix="run on a GPU device; on CPU speculation needs the overlap scheduler off")
            if self.get("disable_overlap_schedule", False):
                self.set("disable_overlap_schedule", True, "spec.sync_spec_v2", log=MSG_SYNC_SPEC_V2)

    def mixed_chunk_eagle(self, alg):
        if not self.get("enable_mixed_chunk", False):
            return
        if _V0410 <= self.R <= _V0510:
            # §9 "Mixed chunk": off for the EAGLE family, with a warning (text from the wheel).
            self.set("enable_mixed_chunk", False, "spec.mixed_chunk_off", log=MSG_MIXED_EAGLE_OLD,
                     fix="drop enable_mixed_chunk; SGLang %s cannot mix chunked prefill with speculative decoding" % self.version)
        elif self.R >= _V0523 and alg == "STANDALONE":
            # §3 step 6.
            self.set("enable_mixed_chunk", False, "spec.mixed_chunk_off", log=MSG_MIXED_STANDALONE,
                     fix="drop enable_mixed_chunk or use EAGLE/EAGLE3, which can mix")

    def mtp_draft_path(self):
        archs = _MTP_DRAFT_PATH_ARCHS[self.R]
        if self.arch is None:
            if self.a.get("speculative_draft_model_path") is None:
                self.notes.append(
                    "arch not given: SGLang uses the model path as draft path for MTP architectures such as "
                    "DeepseekV3ForCausalLM (sglang-rules.md §3 step 7); pass arch to model it")
            return
        if self.arch not in archs:
            return
        if self.a.get("speculative_draft_model_path") is None and self.a.get("model_path") is None:
            self.notes.append("model_path is not set, so the MTP draft path default (sglang-rules.md §3 step 7) is not modelled")
        elif self.a.get("speculative_draft_model_path") is None:
            self.set("speculative_draft_model_path", self.a.get("model_path"), "eagle.mtp_draft_path")
            if self.R >= _V0510:
                revision = self.a.get("revision")
                # the draft revision becomes the model's revision; None when that is unset (§3 step 7)
                if revision is not None:
                    self.set("speculative_draft_model_revision", revision, "eagle.mtp_draft_path")
                else:
                    self.notes.append(
                        "the MTP draft path SGLang fills in has no revision (the model's revision is unset); rendered "
                        "explicitly, a draft path without a revision gets 'main' (sglang-rules.md §2), so set revision "
                        "to pin both")
        elif self.arch not in _MTP_NO_WARNING:
            self.set("speculative_draft_model_path", self.a["speculative_draft_model_path"],
                     "eagle.mtp_draft_path_warning", log=MSG_MTP_DRAFT_PATH)
        if self.R == _V051 and self.page_size() != 1 and self.a.get("attention_backend") == "flashinfer":
            # §9 "Draft path defaults to model path", 0.5.1 column; message from the wheel (server_args.py:642-645).
            self.stop(
                "page_size: SGLang %s raises \"Speculative decoding with page_size != 1 is not supported. Please set "
                "page_size to 1.\" for %s with attention_backend flashinfer (sglang-rules.md §9); set page_size: 1 or "
                "another attention_backend" % (self.version, self.arch))

    def iquest(self):
        # §3 step 8; messages from the wheel (speculative_hook.py:1014-1059).
        draft_path = self.a.get("speculative_draft_model_path")
        if draft_path is None or draft_path == self.a.get("model_path"):
            self.stop("speculative_draft_model_path: SGLang %s raises \"IQuest Q1 requires an independent draft model "
                      "path.\" (sglang-rules.md §3 step 8); set the path of the MTP draft checkpoint" % self.version)
        steps = self.a.get("speculative_num_steps")
        if steps is None:
            self.stop("speculative_num_steps: for IQuestQ1ForCausalLM SGLang takes the default from the draft "
                      "checkpoint's num_draft_slots, which the resolver cannot read (sglang-rules.md §3 step 8); set "
                      "speculative_num_steps explicitly")
        if steps < 1:
            self.stop("speculative_num_steps: SGLang %s raises \"MTP requires positive speculative_num_steps.\"; "
                      "set it to 1 or more" % self.version)
        if self.a.get("speculative_eagle_topk") not in (None, 1):
            self.stop("speculative_eagle_topk: SGLang %s raises \"MTP requires --speculative-eagle-topk 1.\" "
                      "(sglang-rules.md §3 step 8); set speculative_eagle_topk: 1" % self.version)
        if self.a.get("speculative_num_draft_tokens") not in (None, steps + 1):
            self.stop("speculative_num_draft_tokens: SGLang %s raises \"MTP verification width must equal draft "
                      "steps + 1.\" (sglang-rules.md §3 step 8); set speculative_num_draft_tokens: %d"
                      % (self.version, steps + 1))
        self.set("speculative_eagle_topk", 1, "eagle.iquest_mtp")
        self.set("speculative_num_draft_tokens", steps + 1, "eagle.iquest_mtp")

    def auto_params(self, alg):
        """§6 (0.5.10+) and §9 "Automatic (steps, topk, draft)" for older releases."""
        R = self.R
        if R == _V046:
            params = (5, 4, 8)
        elif R >= _V0510 and alg == "STANDALONE":
            params = (3, 1, 4)
        elif self.arch is None:
            self.stop(
                "speculative_num_steps, speculative_eagle_topk and speculative_num_draft_tokens are not set, so %s "
                "picks them from the target model's architectures[0] (sglang-rules.md §6); pass arch (architectures[0] "
                "of the model's config.json) or set all three explicitly" % self.sglang())
        elif R == _V0410:
            params = (3, 1, 4) if self.arch in _AUTO_314_0410 else (5, 4, 8)
        elif R == _V051:
            params = (3, 1, 4) if self.arch in _AUTO_314_051 else (5, 4, 8)
        else:
            params = (5, 4, 8) if self.arch in _AUTO_548_0510 else (3, 1, 4)
        for field, value in zip(("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens"), params):
            self.set(field, value, "eagle.auto_params")

    def page_size_check(self, topk):
        backend = self.a.get("attention_backend")
        allowed = ("flashinfer", "fa3", "triton") if self.R >= _V0523 else ("flashinfer", "fa3")
        if backend in allowed:
            return
        if self.R >= _V0523:
            quoted = ("speculative_eagle_topk > 1 with page_size > 1 is only supported on %r; got attention_backend=%r. "
                      "Use page_size == 1 or one of those backends." % (allowed, backend))
            doc = "sglang-rules.md §3 step 14"
        else:
            quoted = ("speculative_eagle_topk > 1 with page_size > 1 is unstable and produces incorrect results for paged "
                      "attention backends. This combination is only supported for the 'flashinfer' backend.")
            doc = "sglang-rules.md §9"
        if backend is None:
            self.stop(
                "attention_backend: not set, with speculative_eagle_topk %s and page_size %s; SGLang %s picks the backend "
                "by hardware (sglang-rules.md §8) and raises \"%s\" unless it is one of %s (%s); set attention_backend to one "
                "of them, or use page_size: 1 or speculative_eagle_topk: 1"
                % (topk, self.page_size(), self.version, quoted, ", ".join(allowed), doc))
        self.stop(
            "page_size: %s with speculative_eagle_topk %s and attention_backend %s: SGLang %s raises \"%s\" (%s); use "
            "page_size: 1, speculative_eagle_topk: 1, or attention_backend %s"
            % (self.page_size(), topk, backend, self.version, quoted, doc, " / ".join(allowed)))

    # -- NGRAM (sglang-rules.md §4; 0.5.10 from §9 and the wheel) ---------------------
    def ngram(self):
        R = self.R
        device = self.device()
        if R == _V0510 and not device.startswith("cuda"):
            self.stop("device: SGLang %s raises \"Ngram speculative decoding only supports CUDA device.\" (sglang-rules.md "
                      "§9); run NGRAM on cuda" % self.version)
        if R >= _V0523 and device not in ("cuda", "cpu", "xpu"):
            self.stop("device: SGLang %s raises \"Ngram speculative decoding only supports CUDA, CPU, or XPU devices.\" "
                      "(sglang-rules.md §4); use device cuda, cpu or xpu" % self.version)
        if R >= _V0523 and device == "cpu" and not self.get("disable_overlap_schedule", False):
            self.set("disable_overlap_schedule", True, "spec.overlap_schedule_off", log=MSG_OVERLAP_CPU)
        self.max_running()
        if R == _V0510:
            self.set("disable_overlap_schedule", True, "spec.overlap_schedule_off", log=MSG_NGRAM_0510,
                     fix="upgrade to SGLang 0.5.23, where NGRAM keeps the overlap scheduler on CUDA")
            self.set("enable_mixed_chunk", False, "spec.mixed_chunk_off", log=MSG_NGRAM_0510,
                     fix="drop enable_mixed_chunk; NGRAM cannot mix chunked prefill")
        else:
            self.set("enable_mixed_chunk", False, "spec.mixed_chunk_off", log=MSG_MIXED_NGRAM,
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
                          "speculative_num_draft_tokens by it (sglang-rules.md §4)" % self.version)
            self.set("speculative_num_steps", self.a["speculative_num_draft_tokens"] // breadth, "ngram.steps_default")
        topk = breadth
        if topk > 1 and self.page_size() > 1 and self.a.get("attention_backend") != "flashinfer":
            message = ("speculative_eagle_topk(%s) > 1 with page_size(%s) > 1 is unstable and produces incorrect results "
                       "for paged attention backends. This combination is only supported for the 'flashinfer' backend."
                       % (topk, self.page_size()))
            self.stop(
                "page_size: SGLang %s raises \"%s\" (sglang-rules.md §4); set attention_backend: flashinfer, page_size: 1, "
                "or speculative_ngram_max_bfs_breadth: 1" % (self.version, message))
        if self.attn_dp():
            self.stop(
                "enable_dp_attention: SGLang %s raises \"Currently ngram speculative decoding does not support dp "
                "attention.\" (sglang-rules.md §4); drop enable_dp_attention or use another algorithm" % self.version)

    # -- DFLASH, DSPARK, UNO, FROZEN_KV_MTP (sglang-rules.md §7, 0.5.23) --------------
    def force_one(self, field, rule, message):
        value = self.a.get(field)
        if value is None:
            self.set(field, 1, rule)
        elif value != 1:
            self.set(field, 1, rule, log=message % value, fix="set %s: 1; %s" % (field, R_.BY_ID[rule]["summary"]))

    def dflash(self):
        device = self.device()
        if not (device.startswith("cuda") or device in ("npu", "xpu")):
            self.stop("device: SGLang %s raises \"DFLASH speculative decoding is not supported by … on device %r.\" "
                      "(sglang-rules.md §7); DFLASH runs on CUDA, NPU or XPU" % (self.version, device))
        if self.attn_dp() and device != "npu" and not self.get("enable_dp_lm_head", False):
            self.stop("enable_dp_lm_head: SGLang %s raises \"DFLASH with dp attention requires --enable-dp-lm-head.\"; "
                      "set enable_dp_lm_head: true or drop attention-DP" % self.version)
        if self.get("pp_size", 1) != 1:
            self.stop("pp_size: SGLang %s raises \"Currently DFLASH speculative decoding only supports pp_size == 1.\" "
                      "(sglang-rules.md §7); set pp_size: 1" % self.version)
        if self.a.get("speculative_draft_model_path") is None:
            self.stop("speculative_draft_model_path: SGLang %s raises \"DFLASH speculative decoding requires setting "
                      "--speculative-draft-model-path.\" (sglang-rules.md §7); set the DFLASH draft path" % self.version)
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
                    "For DFLASH they must match.\" (sglang-rules.md §7); set them equal or drop one"
                    % (draft, block, self.version))
            self.set("speculative_num_draft_tokens", block, "dflash.block_size")
        elif draft is None:
            self.notes.append(
                "DFLASH: speculative_num_draft_tokens comes from the draft config's block size, or 16 with a warning "
                "(sglang-rules.md §7); set speculative_dflash_block_size to pin it")
        self.max_running()

    def dspark(self):
        device = self.device()
        if not device.startswith(("cuda", "npu", "xpu")):
            self.stop("device: SGLang %s raises \"DSpark speculative decoding only supports CUDA, NPU or XPU device.\" "
                      "(sglang-rules.md §7)" % self.version)
        if self.get("pp_size", 1) != 1 and self.a.get("disaggregation_mode") != "prefill":
            self.stop("pp_size: SGLang %s supports DSPARK with pipeline parallelism only on PD prefill "
                      "(sglang-rules.md §8); set pp_size: 1 or disaggregation_mode: prefill" % self.version)
        if self.a.get("speculative_draft_model_path") is None:
            self.notes.append(
                "DSPARK without speculative_draft_model_path: SGLang looks for a draft bundled in the target "
                "checkpoint or its dspark/ subfolder and fails if there is none (sglang-rules.md §7)")
        self.force_one("speculative_num_steps", "dspark.steps_topk_1",
                       "DSpark only supports speculative_num_steps == 1; overriding speculative_num_steps=%s to 1.")
        self.force_one("speculative_eagle_topk", "dspark.steps_topk_1",
                       "DSpark only supports speculative_eagle_topk == 1; overriding speculative_eagle_topk=%s to 1.")
        gamma = self.a.get("speculative_dspark_block_size")
        draft = self.a.get("speculative_num_draft_tokens")
        if gamma is not None:
            if gamma <= 0:
                self.stop("speculative_dspark_block_size: must be positive, got %s (sglang-rules.md §7)" % gamma)
            if draft is not None and draft != gamma + 1:
                self.stop(
                    "speculative_num_draft_tokens: %s, but DSPARK needs gamma + 1 = %d with speculative_dspark_block_size "
                    "%s; SGLang %s raises \"DSpark speculative_num_draft_tokens must equal gamma + 1 …\" (sglang-rules.md §7); "
                    "set speculative_num_draft_tokens: %d or drop it" % (draft, gamma + 1, gamma, self.version, gamma + 1))
            self.set("speculative_num_draft_tokens", gamma + 1, "dspark.gamma_draft_tokens")
        else:
            if draft is not None and draft < 2:
                self.stop("speculative_num_draft_tokens: SGLang %s raises \"DSpark speculative_num_draft_tokens must be "
                          ">= 2 (= gamma + 1), got %s.\"; set it to gamma + 1" % (self.version, draft))
            self.notes.append(
                "DSPARK: gamma comes from the draft config or a default (\"DSpark gamma is not set; defaulting to …\"); "
                "set speculative_dspark_block_size to pin speculative_num_draft_tokens = gamma + 1 (sglang-rules.md §7)")
        self.max_running()

    def uno(self):
        # sglang-rules.md §7; messages and the linear/tree split from the wheel (speculative_hook.py:449-611).
        if not self.device().startswith("cuda"):
            self.stop("device: SGLang %s raises \"UNO only supports CUDA.\" (sglang-rules.md §7)" % self.version)
        if self.a.get("speculative_draft_model_path") is not None:
            self.stop("speculative_draft_model_path: SGLang %s raises \"UNO reuses the target model and does not accept "
                      "--speculative-draft-model-path.\" (sglang-rules.md §7); drop it" % self.version)
        if self.a.get("uno_lora_path") is None:
            self.stop("uno_lora_path: SGLang %s raises \"UNO requires --uno-lora-path.\" (sglang-rules.md §7); set "
                      "uno_lora_path" % self.version)
        draft = self.a.get("speculative_num_draft_tokens")
        if draft is None or draft < 1:
            self.stop("speculative_num_draft_tokens: UNO requires a positive speculative_num_draft_tokens (the verify "
                      "width Q) (sglang-rules.md §7); set it")
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
            self.notes.append("UNO tree mode: the tree-capacity checks of SGLang are not modelled (sglang-rules.md §7)")
        else:
            for field in ("speculative_num_steps", "speculative_eagle_topk"):
                old = self.a.get(field)
                if old is None:
                    self.set(field, 1, "uno.steps_topk_1")
                elif old != 1:
                    self.set(field, 1, "uno.steps_topk_1", log="UNO uses %s=1; overriding %s." % (field, old),
                             fix="set %s: 1; UNO linear mode forces it" % field)
        if (self.get("tp_size", 1), self.get("pp_size", 1)) != (1, 1):
            self.stop("tp_size: SGLang %s raises \"UNO requires TP=PP=1.\" (sglang-rules.md §7); set tp_size: 1 and "
                      "pp_size: 1" % self.version)
        if self.attn_dp():
            self.stop("enable_dp_attention: UNO does not support DP attention (sglang-rules.md §7); drop it")
        if self.get("enable_lora", False) or self.a.get("lora_paths"):
            self.stop("enable_lora: SGLang %s raises \"UNO does not support public Multi-LoRA serving.\"; drop "
                      "enable_lora and lora_paths" % self.version)
        if self.get("enable_mixed_chunk", False):
            self.set("enable_mixed_chunk", False, "spec.mixed_chunk_off", log=MSG_MIXED_UNO,
                     fix="drop enable_mixed_chunk; UNO cannot mix chunked prefill")
        _attention, prefill, decode = self.backends()
        if (prefill is not None and prefill != "fa3") or (decode is not None and decode != "fa3"):
            self.stop("attention_backend: SGLang %s raises \"UNO requires FA3 for both prefill and decode attention; "
                      "got prefill=%r, decode=%r.\" (sglang-rules.md §7); set attention_backend: fa3"
                      % (self.version, prefill, decode))
        if prefill is None or decode is None:
            self.notes.append("UNO needs FA3 for prefill and decode; attention_backend is unset, so the hardware default "
                              "decides (sglang-rules.md §7); set attention_backend: fa3")
        self.max_running()

    def frozen_kv_mtp(self):
        # sglang-rules.md §7 (and §1: its own handler, no steps/topk rules).
        self.max_running()
        if self.get("enable_mixed_chunk", False):
            self.set("enable_mixed_chunk", False, "spec.mixed_chunk_off", log=MSG_MIXED_FROZEN,
                     fix="drop enable_mixed_chunk; Frozen-KV MTP cannot mix chunked prefill")

    # -- §8 feature constraints (0.5.23) ----------------------------------------
    def feature_constraints(self, alg):
        topk = self.a.get("speculative_eagle_topk")
        if self.get("enable_unified_memory", False):
            if alg not in ("DSPARK", "EAGLE", "EAGLE3", "DFLASH"):
                self.error("enable_unified_memory: SGLang %s supports it only with speculative_algorithm DSPARK, DFLASH, "
                           "EAGLE or EAGLE3, got %s (AssertionError, sglang-rules.md §8); drop enable_unified_memory"
                           % (self.version, alg))
            elif topk not in (None, 1):
                self.error("enable_unified_memory: needs speculative_eagle_topk 1 (a linear draft chain), got %s "
                           "(AssertionError, sglang-rules.md §8); set speculative_eagle_topk: 1" % topk)
        if self.get("enable_pd_role_switch", False):
            self.error("enable_pd_role_switch: SGLang %s refuses it with speculative decoding (sglang-rules.md §8); drop "
                       "enable_pd_role_switch or speculative_algorithm" % self.version)
        if (self.get("enable_lora", False) or self.a.get("lora_paths")) and alg not in ("NGRAM", "EAGLE", "EAGLE3", "DFLASH", "DSPARK"):
            self.error("enable_lora: SGLang %s raises \"LoRA is only compatible with NGRAM, EAGLE, NEXTN, EAGLE3, DFLASH, "
                       "or DSPARK speculative decoding, not %s.\" (sglang-rules.md §8); drop LoRA or change the algorithm"
                       % (self.version, alg))

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
            if same(final, intended):
                continue
            rule = None
            for adj in self.adjustments:
                if adj["arg"] == field and not same(adj["from"], adj["to"]):
                    rule = adj
            if rule is None:
                continue
            fix = self.fixes.get((field, rule["rule"])) or "set %s: %s explicitly, or change the settings that trigger %s" % (
                field, fmt(final), rule["rule"])
            self.error(
                "%s: intended %s, but %s would run %s (rule %s, %s); policy strict forbids changing a value you "
                "set. Fix: %s" % (field, fmt(intended), self.sglang(), fmt(final), rule["rule"], rule["doc"], fix))


DEFAULT_GPU = {"name": "NVIDIA H200", "compute_capability": "9.0", "memory_mib": 143771, "count": 8}


def normalize_gpu(gpu):
    """GPU facts as nvidia-smi gives them -> {name, major, minor, memory_mib, count, given}.

    ``compute_capability`` may be "9.0", 9.0, 10 or [9, 0]. None means the default
    (an H200, SM 9.0, 143771 MiB) with ``given`` False, so that the outcomes that
    depend on the GPU are noted instead of silently guessed.
    """
    given = gpu is not None
    facts = dict(DEFAULT_GPU)
    if given:
        if not hasattr(gpu, "get"):
            raise ValueError("gpu must be a dict {name, compute_capability, memory_mib, count}, got %s %r"
                             % (type(gpu).__name__, gpu))
        facts.update(dict((k, v) for k, v in plain(dict(gpu)).items() if v is not None))
    capability = facts.get("compute_capability")
    if isinstance(capability, (list, tuple)) and capability:
        major, minor = int(capability[0]), int(capability[1]) if len(capability) > 1 else 0
    else:
        text = str(capability).strip()
        try:
            major_text, _sep, minor_text = text.partition(".")
            major, minor = int(major_text), int(minor_text or 0)
        except ValueError:
            raise ValueError("gpu.compute_capability must look like '9.0' (nvidia-smi --query-gpu=compute_cap), "
                             "got %r" % (capability,))
    try:
        memory = int(float(facts.get("memory_mib")))
        count = int(facts.get("count"))
    except (TypeError, ValueError):
        raise ValueError("gpu.memory_mib and gpu.count must be numbers, got %r and %r"
                         % (facts.get("memory_mib"), facts.get("count")))
    return {"name": str(facts.get("name")), "major": major, "minor": minor, "memory_mib": memory, "count": count,
            "given": given}


def resolve(args, version=DEFAULT_VERSION, arch=None, policy=DEFAULT_POLICY, draft_arch=None, env=None, gpu=None):
    """Resolve intended SGLang args the way SGLang ``version`` would.

    :param args: dict of SGLang field names (snake_case) to intended values.
    :param version: SGLang version string (see the module docstring for ranges).
    :param arch: the target model's ``architectures[0]``; drives automatic
        defaults (sglang-rules.md §6) and MTP draft paths (§3 step 7).
    :param policy: ``mirror``, ``honor_draft_tokens`` (default) or ``strict``.
    :param draft_arch: the draft model's ``architectures[0]`` (Gemma4 promotion, §2).
    :param env: the server's environment variables (0.5.10 reads SGLANG_ENABLE_SPEC_V2).
    :param gpu: GPU facts {name, compute_capability, memory_mib, count} (see
        normalize_gpu); the default attention backend and what trtllm_mha
        allows depend on them (sglang-rules.md §11). None: an H200 is assumed
        and every outcome that depends on the GPU is noted.
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
                         str(draft_arch) if draft_arch else None, env, normalize_gpu(gpu))
    return resolver.run()


def explain(arg, intended, running, version=DEFAULT_VERSION, args=None, arch=None, adjustments=None):
    """One line explaining why ``arg`` runs with ``running`` instead of ``intended``.

    Form: ``<arg>: intended X, running Y — <why>; <fix>``. With ``adjustments``
    (a resolution already made) the adjustment that produced ``running`` is
    explained and nothing is resolved again. Otherwise, with ``args`` (the
    intended args), they are resolved under ``mirror`` to find it. Failing
    both, the usual rule for that argument is used when it fits the values,
    and any other difference gets a generic line. Secret values are masked.
    """
    rule = R_.find_rule(adjustments, arg, running) if adjustments is not None else None
    if rule is None and adjustments is None and args is not None and hasattr(args, "items"):
        probe = plain(dict(args))
        if intended is None:
            probe.pop(arg, None)
        else:
            probe[arg] = intended
        try:
            result = resolve(probe, version, arch=arch, policy="mirror")
        except ValueError:
            result = {"adjustments": []}
        rule = R_.find_rule(result["adjustments"], arg, running)
    if rule is None:
        rule = R_.default_rule(arg, intended, running, args)
    flag = FLAGS[arg]["flag"] if arg in FLAGS else None
    return R_.explain_line(arg, intended, running, rule, version, flag=flag, secret_args=_secret_args())


def _secret_args():
    return tuple(k for k, v in FLAGS.items() if v["secret"])


# ---------------------------------------------------------------------------
# The plan: the policy through the mirror, then the node's own SGLang (the oracle)
# ---------------------------------------------------------------------------
ORACLE_POLICIES = ("auto", "node", "mirror")


def _oracle_error_line(version, error):
    return "SGLang %s on the node refuses the arguments at startup: %s: %s" % (
        version, error.get("type") or "Error", error.get("message") or "(no message)")


def _compared_fields(rendered, mirror_args):
    fields = [k for k in rendered if not (k in FLAGS and FLAGS[k]["secret"])]
    fields += [k for k in mirror_args if k not in fields and not (k in FLAGS and FLAGS[k]["secret"])]
    return fields


def _log_for(rule, warnings):
    if not rule or rule not in R_.BY_ID:
        return None
    for line in warnings:
        for pattern in R_.BY_ID[rule]["logs"]:
            if pattern["text"] in line:
                return line
    return None


def plan_resolution(args, version=DEFAULT_VERSION, arch=None, policy=DEFAULT_POLICY, gpu=None, draft_arch=None,
                    env=None, oracle=None, oracle_policy="auto"):
    """What the server will run: the policy applied through the mirror, then the node's SGLang asked.

    ``oracle`` is a callable ``oracle(rendered_args) -> answer`` (for example
    ``lambda a: oracle.resolve_on_node(python, a, version, gpu, env)``); it may
    raise ``oracle.OracleUnavailable``. ``oracle_policy``: ``mirror`` never
    asks it; ``auto`` falls back to the mirror when it is unavailable and says
    why; ``node`` makes that an error.

    Returns ``{"source": "node"|"mirror", "fallback_reason", "args" (the
    effective config), "rendered" (what is rendered), "adjustments", "errors",
    "notes", "log" (SGLang's own warning lines), "disagreements" (mirror vs
    node per field), "mirror" (the mirror's prediction), "node" (the oracle's
    answer or None)}``. Adjustments are the policy's (intended -> rendered)
    followed by SGLang's (rendered -> running); an SGLang adjustment carries
    the mirror's rule id when the mirror explains the same change, else None.
    """
    if oracle_policy not in ORACLE_POLICIES:
        raise ValueError("oracle_policy must be one of %s, got %r" % (", ".join(ORACLE_POLICIES), oracle_policy))
    planned = resolve(args, version, arch=arch, policy=policy, draft_arch=draft_arch, env=env, gpu=gpu)
    rendered = planned["args"]
    predicted = resolve(rendered, version, arch=arch, policy="mirror", draft_arch=draft_arch, env=env, gpu=gpu)
    policy_errors = [e for e in planned["errors"] if e not in predicted["errors"]]
    policy_adjustments = [a for a in planned["adjustments"] if a["rule"].startswith("policy.")]
    result = {
        "source": "mirror", "fallback_reason": None, "rendered": rendered, "args": dict(planned["args"]),
        "adjustments": list(planned["adjustments"]), "errors": list(planned["errors"]),
        "notes": list(planned["notes"]), "log": [a["log"] for a in planned["adjustments"] if a["log"]],
        "disagreements": [], "mirror": predicted, "node": None,
    }
    if oracle is None or oracle_policy == "mirror":
        result["fallback_reason"] = "oracle_policy mirror" if oracle_policy == "mirror" else "no node oracle given"
        return result
    try:
        answer = oracle(rendered)
    except Exception as exc:  # OracleUnavailable, or anything the runner could not turn into an answer
        reason = str(exc) or type(exc).__name__
        if oracle_policy == "node":
            result["errors"].append("%s; oracle_policy node does not fall back to the mirror (use auto to allow it)"
                                    % reason)
            result["source"] = "none"
        result["fallback_reason"] = reason
        result["notes"].append("resolved by the collection's mirror of SGLang %s: %s" % (version, reason))
        return result
    result["source"] = "node"
    result["node"] = answer
    warnings = list(answer.get("warnings") or [])
    result["log"] = warnings
    result["notes"].append("resolved by the node's SGLang %s (%s)" % (answer.get("sglang_version"), answer.get("python")))
    if not answer.get("ok"):
        error = answer.get("error") or {}
        # SGLang's own refusal first; when the mirror predicted a refusal too, its lines follow: they say why and
        # what to set, where SGLang often says little (0.5.23's bare AssertionError for steps unset).
        result["errors"] = policy_errors + [_oracle_error_line(answer.get("sglang_version") or version, error)] + [
            "the collection's mirror of SGLang %s agrees: %s" % (version, e) for e in predicted["errors"] if e not in policy_errors]
        result["args"] = dict(rendered)
        result["adjustments"] = policy_adjustments
        if not predicted["errors"]:
            result["disagreements"].append({"arg": None, "mirror": "starts", "node": "refuses: %s" % error.get("message")})
        return result
    node_args = answer.get("args") or {}
    intended = plain(dict(args))
    effective = {}
    adjustments = []
    for field in _compared_fields(intended, rendered):
        if field not in node_args:
            continue  # a field this release does not have
        running = node_args[field]
        effective[field] = running
        before = intended.get(field)
        if same(before, running) or (before is None and field not in rendered and running is None):
            continue
        if field not in intended and not any(a["arg"] == field for a in planned["adjustments"]):
            continue  # an SGLang default that neither the operator nor the mirror named
        # the mirror's rule when it explains the same change (the policy's included)
        rule = R_.find_rule(planned["adjustments"], field, running)
        adjustments.append({"arg": field, "from": before, "to": running, "rule": rule,
                            "doc": R_.doc_ref(rule) if rule else None, "log": _log_for(rule, warnings)})
    for field, mirror_value in predicted["args"].items():
        if field in node_args and not same(mirror_value, node_args[field]) and not (field in FLAGS and FLAGS[field]["secret"]):
            result["disagreements"].append({"arg": field, "mirror": mirror_value, "node": node_args[field]})
    if predicted["errors"]:
        result["disagreements"].append({"arg": None, "mirror": "refuses: %s" % predicted["errors"][0], "node": "starts"})
    errors = list(policy_errors)
    if policy == "strict":
        raw = plain(dict(args))
        for adj in adjustments:
            if adj["arg"] in raw and raw[adj["arg"]] is not None and not adj["rule"] == "policy.honor_draft_tokens" \
                    and not same(raw[adj["arg"]], adj["to"]):
                line = ("%s: intended %s, but the node's SGLang %s runs %s%s; policy strict forbids changing a value you "
                        "set" % (adj["arg"], fmt(raw[adj["arg"]]), answer.get("sglang_version"), fmt(adj["to"]),
                                 " (rule %s)" % adj["rule"] if adj["rule"] else ""))
                if not any(e.startswith(adj["arg"] + ": intended") for e in errors):
                    errors.append(line)
    result["errors"] = errors
    result["args"] = dict(rendered, **effective)
    result["adjustments"] = adjustments
    return result
