# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The EAGLE family (EAGLE, EAGLE3, NEXTN, STANDALONE; sglang-rules.md §3, §7, §9): topk 1 draft tokens, the
overlap scheduler, mixed chunked prefill, MTP draft paths."""
from __future__ import annotations

from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.rules import (
    MSG_MIXED_EAGLE_OLD,
    MSG_MIXED_STANDALONE,
    MSG_MTP_DRAFT_PATH,
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
    V0410 as _V0410,
    V046 as _V046,
    V051 as _V051,
    V0510 as _V0510,
    V0523 as _V0523,
)
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.mirror.tables import (
    MTP_DRAFT_PATH_ARCHS,
    MTP_NO_WARNING,
    truthy_env,
)


class EagleRules(object):
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
            spec_v2 = truthy_env((self.env or {}).get("SGLANG_ENABLE_SPEC_V2", "")) or getattr(self, "spec_v2_forced", False)
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
        archs = MTP_DRAFT_PATH_ARCHS[self.R]
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
        elif self.arch not in MTP_NO_WARNING:
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
