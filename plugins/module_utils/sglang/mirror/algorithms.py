# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The other speculative algorithms (sglang-rules.md §1, §4, §8): NGRAM, DFLASH, DSPARK, UNO, FROZEN_KV_MTP."""
from __future__ import annotations

from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import rules as R_
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.rules import (
    MSG_MIXED_FROZEN,
    MSG_MIXED_NGRAM,
    MSG_MIXED_UNO,
    MSG_NGRAM_0510,
    MSG_NGRAM_DRAFT12,
    MSG_OVERLAP_CPU,
)
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.versions import (
    V0510 as _V0510,
    V0523 as _V0523,
)


class AlgorithmRules(object):
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
