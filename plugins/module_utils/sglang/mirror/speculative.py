# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Speculative decoding, the common part (sglang-rules.md §1-2, §5-6): the algorithm's name and family, the
auxiliary hidden-state capture, multi-layer EAGLE, adaptive mode, automatic (steps, topk, draft)."""
from __future__ import annotations

import json

from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.rules import (
    MSG_ADAPTIVE_OFF,
    MSG_GEMMA4_PROMOTE,
)
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.versions import (
    V0410 as _V0410,
    V046 as _V046,
    V051 as _V051,
    V0510 as _V0510,
    V0523 as _V0523,
)
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.mirror.tables import (
    ADAPTIVE_DEFAULT_CANDIDATES,
    ALGORITHM_CHOICES,
    AUTO_314_0410,
    AUTO_314_051,
    AUTO_548_0510,
    BUILTIN_0523,
    EAGLE_FAMILY,
    GEMMA4_DRAFTS,
    MULTI_LAYER_0510,
    MULTI_LAYER_0523,
)


class SpeculativeRules(object):
    def argparse_choices(self):
        """Before 0.5.23 --speculative-algorithm is an argparse choice list: argparse refuses first."""
        raw = self.a.get("speculative_algorithm")
        if raw is not None and self.R < _V0523 and str(raw) not in ALGORITHM_CHOICES[self.R]:
            self.normalize_algorithm(str(raw))

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

        if alg in EAGLE_FAMILY:
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
        table = MULTI_LAYER_0523 if self.R >= _V0523 else MULTI_LAYER_0510 if self.R >= _V0510 else ()
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
            choices = ALGORITHM_CHOICES[R]
            if raw_alg not in choices:
                hint = ""
                upper = raw_alg.upper()
                if upper in choices:
                    hint = "; write it upper-case: speculative_algorithm: %s" % upper
                elif upper in BUILTIN_0523:
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
            and self.draft_arch in GEMMA4_DRAFTS
            and self.a.get("speculative_draft_model_path") is not None
        )
        if self.draft_arch in GEMMA4_DRAFTS and R >= _V0523 and not gemma4:
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
        if R >= _V0523 and alg not in BUILTIN_0523:
            self.stop(
                "speculative_algorithm: SGLang %s raises \"Unknown speculative algorithm name: %s\" (sglang-rules.md "
                "§2) unless a plugin registers it; use one of %s"
                % (self.version, alg, ", ".join(n for n in BUILTIN_0523 if n not in ("NEXTN", "FROZEN_KV_MTP"))))
        return alg

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
            return list(ADAPTIVE_DEFAULT_CANDIDATES)
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

    def topk_none_raises(self):
        """Whether SGLang reaches a `speculative_eagle_topk > 1` comparison with topk None (§9 "Unset topk")."""
        if self.R >= _V0510:
            return True  # the page-size check at the end compares topk first
        if self.R >= _V051:
            return "trtllm_mha" in self.backends()  # only the trtllm_mha check compares it
        if self.R == _V046:
            return self.page_size() > 1  # `page_size > 1 and topk > 1`: page first
        return False

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
            params = (3, 1, 4) if self.arch in AUTO_314_0410 else (5, 4, 8)
        elif R == _V051:
            params = (3, 1, 4) if self.arch in AUTO_314_051 else (5, 4, 8)
        else:
            params = (5, 4, 8) if self.arch in AUTO_548_0510 else (3, 1, 4)
        for field, value in zip(("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens"), params):
            self.set(field, value, "eagle.auto_params")
