# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The mirror's state and bookkeeping: the args as they resolve, adjustments, errors, notes; the run order."""
from __future__ import annotations

from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import rules as R_
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.flags import (
    availability_error,
    coerce,
    FLAGS,
    plain,
    same,
    unknown_key_message,
)
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.rules import MSG_MAX_RUNNING
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.versions import (
    DOCUMENTED_VERSIONS,
    rule_version,
    V0510 as _V0510,
    V0523 as _V0523,
    version_notes,
)
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.mirror.tables import (
    MLA_ARCHS,
    StopResolution,
)


class Base(object):
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
        raise StopResolution()

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
                    raise StopResolution()
            else:
                self.resolve_speculation()
            self.check_server_args()
        except StopResolution:
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
        return self.arch in MLA_ARCHS


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
