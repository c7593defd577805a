# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Parallel layout, memory and scheduling rules (sglang-rules.md §3-4, §10, §12): attention DP, page size,
the checks of ServerArgs.check_server_args, and the strict policy."""
from __future__ import annotations

from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.flags import (
    FLAGS,
    fmt,
    same,
)
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.versions import (
    DOCUMENTED_VERSIONS,
    V051 as _V051,
    V0510 as _V0510,
    V0523 as _V0523,
)
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.mirror.tables import (
    ARCH_FIRST_RELEASE,
    truthy_env,
)


class LayoutRules(object):
    def before_speculation(self):
        R = self.R
        if R >= _V0523:
            self.dp_attention_layout()
        if R <= _V051 and self.arch in ARCH_FIRST_RELEASE and R < ARCH_FIRST_RELEASE[self.arch]:
            # 0.5.1 reads the model config in every start; 0.4.x only for the EAGLE family
            alg = str(self.a.get("speculative_algorithm") or "").upper()
            if R == _V051 or alg in ("EAGLE", "EAGLE3", "NEXTN"):
                self.stop(
                    "model_path: SGLang %s cannot read a %s checkpoint (transformers raises \"The checkpoint you are "
                    "trying to load has model type ... but Transformers does not recognize this architecture\"); this "
                    "architecture needs SGLang %s or newer" % (self.version, self.arch,
                                                               DOCUMENTED_VERSIONS[ARCH_FIRST_RELEASE[self.arch]]))
        self.attention_dp_checks()
        if R >= _V0510:
            self.default_attention_backend()
        self.backend_page_size()
        if R >= _V0510 and self.a.get("page_size") is None:
            pass  # stays unset in the args: SGLang's default 1
        if self.get("pp_size", 1) > 1 and not self.get("disable_overlap_schedule", False):
            self.set("disable_overlap_schedule", True, "parallel.pp_overlap_off",
                     log="Pipeline parallelism is incompatible with overlap schedule.")

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
        if not prefill and not truthy_env((self.env or {}).get("SGLANG_ENABLE_PP_SPEC", "")):
            self.stop("pp_size: SGLang %s asserts \"PP + speculative decoding (MTP) is only supported on prefill nodes "
                      "(disaggregation-mode=prefill)\" (sglang-rules.md §8); set pp_size: 1 or disaggregation_mode: "
                      "prefill" % self.version)

    def checks_0523(self, alg):
        # sglang-rules.md §2: PD decode with radix cache.
        if (self.a.get("disaggregation_mode") == "decode" and self.get("disaggregation_decode_enable_radix_cache", False)
                and alg not in ("DSPARK", "EAGLE", "EAGLE3")):
            self.stop(
                "disaggregation_decode_enable_radix_cache: SGLang %s raises \"--disaggregation-decode-enable-radix-cache "
                "is incompatible with speculative decoding (--speculative-algorithm %s)\" (sglang-rules.md §2); drop it "
                "or use EAGLE, EAGLE3 or DSPARK" % (self.version, alg))

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
