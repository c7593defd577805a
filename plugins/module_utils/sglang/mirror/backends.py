# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Attention backend rules (sglang-rules.md §11): the default backend per GPU and model, and the page size
it forces."""
from __future__ import annotations

from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.flags import same
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.versions import (
    V0410 as _V0410,
    V051 as _V051,
    V0510 as _V0510,
    V0523 as _V0523,
)
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.mirror.tables import (
    TRTLLM_MLA_ON_SM100,
)


class BackendRules(object):
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
        if self.arch in TRTLLM_MLA_ON_SM100 and prefill is None and decode is None:
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
