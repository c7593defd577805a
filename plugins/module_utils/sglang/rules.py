# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The SGLang resolution rules, one record each.

Every adjustment the resolver reports names one of these records by ``id``.
A record says which releases have the rule (``versions``), where the real
code is (``source``, a path inside that release's wheel), what it does
(``summary``), the lines SGLang prints for it (``logs``: a literal substring
of the line, the field it concerns and the releases that print it), why the
running value differs from the intended one (``why``) and what to change
(``fix``). ``docs/reference/sglang-rules.md`` is generated from these records
(``scripts/gen-sglang-flags.py docs``).

``why`` and ``fix`` are format strings over ``arg``, ``intended``,
``running`` and ``algorithm`` (the rule's algorithm name, upper-case);
``fix_int`` is used instead of ``fix`` when the intended value is an integer
of 2 or more, with ``intended_minus_one``.
"""
from __future__ import annotations

import json

from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.versions import (
    DOCUMENTED_VERSIONS,
    rule_version,
)

DOC_FILE = "docs/reference/sglang-rules.md"

# ---------------------------------------------------------------------------
# Lines SGLang prints (read in the wheels; for a variable tail, the fixed head)
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

_ALL = DOCUMENTED_VERSIONS
_FROM_0510 = ("0.5.10", "0.5.23")
_ONLY_0523 = ("0.5.23",)


def _log(text, arg, versions):
    return {"text": text, "arg": arg, "versions": tuple(versions)}


def _rule(rule_id, versions, source, summary, why, fix, logs=(), arg=None, fix_int=None):
    return {
        "id": rule_id,
        "arg": arg,
        "versions": tuple(versions),
        "source": source,
        "summary": summary,
        "why": why,
        "fix": fix,
        "fix_int": fix_int,
        "logs": list(logs),
    }


RECORDS = [
    _rule("algorithm.uppercase", _ONLY_0523, "0.5.23 arg_groups/speculative_hook.py:138-143",
          "the algorithm name is upper-cased before anything else",
          "SGLang upper-cases the algorithm name", "write it upper-case", arg="speculative_algorithm"),
    _rule("algorithm.nextn_alias", _ALL, "0.5.23 arg_groups/speculative_hook.py:109-116; older server_args.py",
          "NEXTN is an alias of EAGLE, reported as EAGLE",
          "NEXTN is an alias that SGLang reports as EAGLE", "write speculative_algorithm: EAGLE",
          arg="speculative_algorithm"),
    _rule("algorithm.gemma4_frozen_kv_mtp", _ONLY_0523, "0.5.23 arg_groups/speculative_hook.py:102-116",
          "NEXTN or EAGLE with a Gemma4 assistant draft becomes FROZEN_KV_MTP",
          "a Gemma4 assistant draft promotes NEXTN/EAGLE to FROZEN_KV_MTP",
          "write speculative_algorithm: FROZEN_KV_MTP", arg="speculative_algorithm",
          logs=[_log("Detected Gemma4AssistantForCausalLM draft; promoting", "speculative_algorithm", _ONLY_0523)]),
    _rule("aux.disables_speculation", _ONLY_0523, "0.5.23 arg_groups/validation_hook.py:697-753",
          "--enable-return-aux-hidden-states turns speculation off; the algorithm only names the capture convention",
          "enable_return_aux_hidden_states turns speculative decoding off and reports the algorithm as None",
          "expected", arg="speculative_algorithm"),
    _rule("spec.draft_revision_main", _FROM_0510, "0.5.23 arg_groups/speculative_hook.py:123-131",
          "a draft path without a draft revision gets the revision main",
          "SGLang gives a draft path without a draft revision the revision main",
          "set speculative_draft_model_revision", arg="speculative_draft_model_revision"),
    _rule("spec.draft_revision_unset", _FROM_0510, "0.5.23 arg_groups/speculative_hook.py:1120-1148",
          "the MTP draft path defaulted from the model path takes the model's revision, None when unset",
          "the MTP draft path SGLang fills in takes the model's revision, which is unset",
          "set revision to pin it", arg="speculative_draft_model_revision"),
    _rule("spec.max_running_requests", _ALL, "0.5.23 arg_groups/speculative_hook.py:1086-1094",
          "an unset max_running_requests becomes 48 (a warning only from 0.5.10)",
          "SGLang resets an unset max_running_requests to 48 for speculative decoding",
          "set max_running_requests explicitly", arg="max_running_requests",
          logs=[_log(MSG_MAX_RUNNING, "max_running_requests", _FROM_0510)]),
    _rule("spec.overlap_schedule_off", _ALL, "older server_args.py; 0.5.23 arg_groups/speculative_hook.py:66-78",
          "the overlap scheduler is turned off (before 0.5.23 for EAGLE, 0.5.10 also for NGRAM, 0.5.23 on CPU)",
          "SGLang turns the overlap scheduler off for this speculative setup (before 0.5.23 always for EAGLE, "
          "on CPU, and for NGRAM in 0.5.10)", "set disable_overlap_schedule: true to match",
          arg="disable_overlap_schedule",
          logs=[_log(MSG_OVERLAP_OLD, "disable_overlap_schedule", ("0.4.6", "0.4.10", "0.5.1")),
                _log("Overlap scheduler is disabled when spec v2 is off", "disable_overlap_schedule", ("0.5.10",)),
                _log(MSG_OVERLAP_CPU, "disable_overlap_schedule", _ONLY_0523),
                _log(MSG_NGRAM_0510, "disable_overlap_schedule", ("0.5.10",))]),
    _rule("spec.overlap_schedule_spec_v2", ("0.5.10",), "0.5.10 server_args.py:2999-3019",
          "SGLANG_ENABLE_SPEC_V2 (or a multi-layer EAGLE model) keeps the overlap scheduler on",
          "SGLANG_ENABLE_SPEC_V2 (or a multi-layer EAGLE model) turns the overlap scheduler on in 0.5.10",
          "unset it to keep overlap off", arg="disable_overlap_schedule",
          logs=[_log(MSG_SPEC_V2_ON_0510, "disable_overlap_schedule", ("0.5.10",))]),
    _rule("spec.sync_spec_v2", _ONLY_0523, "0.5.23 arg_groups/speculative_hook.py:1098-1102",
          "with the overlap scheduler off the synchronous spec-v2 path is used",
          "with the overlap scheduler off SGLang 0.5.23 runs the synchronous spec-v2 path", "expected",
          arg="disable_overlap_schedule"),
    _rule("spec.mixed_chunk_off", _ALL, "0.5.23 arg_groups/speculative_hook.py:1107-1118; older server_args.py",
          "mixed chunked prefill is turned off for an algorithm that cannot mix",
          "SGLang turns mixed chunked prefill off because the speculative algorithm cannot mix",
          "drop enable_mixed_chunk", arg="enable_mixed_chunk",
          logs=[_log(MSG_NGRAM_0510, "enable_mixed_chunk", ("0.5.10",)),
                _log(MSG_MIXED_EAGLE_OLD, "enable_mixed_chunk", ("0.4.10", "0.5.1", "0.5.10")),
                _log(MSG_MIXED_STANDALONE, "enable_mixed_chunk", _ONLY_0523),
                _log(MSG_MIXED_NGRAM, "enable_mixed_chunk", _ONLY_0523),
                _log(MSG_MIXED_FROZEN, "enable_mixed_chunk", _ONLY_0523),
                _log(MSG_MIXED_UNO, "enable_mixed_chunk", _ONLY_0523)]),
    _rule("model.multi_layer_eagle", _FROM_0510, "0.5.23 arg_groups/overrides.py:331-350, model_overrides/",
          "the algorithm EAGLE turns on multi-layer EAGLE for some architectures (the raw name is tested)",
          "SGLang turns multi-layer EAGLE on for this architecture when the algorithm is EAGLE",
          "expected; write the algorithm upper-case so that the rendered name triggers it too",
          arg="enable_multi_layer_eagle"),
    _rule("eagle.mtp_draft_path", _ALL, "0.5.23 arg_groups/speculative_hook.py:1120-1148",
          "MTP checkpoints use the model path as the draft path when none is given",
          "for MTP checkpoints SGLang uses the model path as draft path when none is given",
          "set speculative_draft_model_path", arg="speculative_draft_model_path"),
    _rule("eagle.mtp_draft_path_warning", _ALL, "0.5.23 arg_groups/speculative_hook.py:1149-1156",
          "an explicit draft path for an MTP checkpoint is only warned about",
          "SGLang only warns that MTP checkpoints need no draft path", "the value is kept",
          arg="speculative_draft_model_path",
          logs=[_log(MSG_MTP_DRAFT_PATH, "speculative_draft_model_path", _ALL)]),
    _rule("eagle.iquest_mtp", _ONLY_0523, "0.5.23 arg_groups/speculative_hook.py:1014-1059",
          "IQuest Q1 MTP drafts: topk 1 and draft tokens = steps + 1",
          "IQuest Q1 MTP drafts force topk 1 and draft tokens = steps + 1", "set them so"),
    _rule("eagle.auto_params", _ALL, "0.5.23 arg_groups/speculative_hook.py:1430-1461; older server_args.py",
          "steps, topk and draft tokens are chosen by architecture when none of them is set",
          "steps, topk and draft tokens were all unset, so SGLang chose them by architecture",
          "set all three of speculative_num_steps, speculative_eagle_topk and speculative_num_draft_tokens"),
    _rule("eagle.page_size_topk1", ("0.4.6",), "0.4.6.post5 server_args.py:414-418",
          "0.4.6 forces topk to 1 when page_size > 1",
          "SGLang 0.4.6 forces topk to 1 when page_size > 1", "set page_size: 1 to keep topk {intended}",
          arg="speculative_eagle_topk",
          logs=[_log(MSG_PAGE_TOPK1_046, "speculative_eagle_topk", ("0.4.6",))]),
    _rule("eagle.topk1_draft_tokens", _ALL, "0.5.23 arg_groups/speculative_hook.py:1255-1266; older server_args.py",
          "topk == 1 sets the draft tokens to steps + 1, also when they were given",
          "SGLang sets it to num_steps + 1 when speculative_eagle_topk == 1",
          "set speculative_num_draft_tokens to speculative_num_steps + 1",
          fix_int="set speculative_num_steps: {intended_minus_one}", arg="speculative_num_draft_tokens",
          logs=[_log(MSG_TOPK1, "speculative_num_draft_tokens", _ALL)]),
    _rule("attention.default_backend", _FROM_0510,
          "0.5.10 arg_groups/... server_args.py _get_default_attn_backend; 0.5.23 arg_groups/model_override_base.py",
          "an unset attention backend is chosen by GPU, model (MHA or MLA) and speculative settings",
          "SGLang picked the attention backend for this GPU and model because none was set",
          "set attention_backend explicitly",
          arg="attention_backend",
          logs=[_log("Attention backend not specified. Use", "attention_backend", _FROM_0510)]),
    _rule("attention.page_size_forced", _ALL, "0.5.23 arg_groups/overrides.py _mla_backend_page_constraints; older "
          "server_args.py",
          "flashmla, cutlass_mla and trtllm_mha force the page size they support",
          "the attention backend only supports certain page sizes, so SGLang changed it",
          "set page_size to a value the backend supports (64)", arg="page_size",
          logs=[_log("only supports a page_size of", "page_size", _ALL),
                _log("TensorRT-LLM MHA only supports page_size of", "page_size", DOCUMENTED_VERSIONS[2:])]),
    _rule("parallel.pp_overlap_off", _ALL, "0.5.23 arg_groups/overrides.py _pipeline_parallel_overlap_disable",
          "pipeline parallelism turns the overlap scheduler off",
          "SGLang turns the overlap scheduler off with pp_size > 1", "set disable_overlap_schedule: true to match",
          arg="disable_overlap_schedule",
          logs=[_log("Pipeline parallelism is incompatible with overlap schedule.", "disable_overlap_schedule", _ALL)]),
    _rule("parallel.dp_attention_to_attn_dp", _ONLY_0523, "0.5.23 arg_groups/parallel_hook.py handle_deprecated_dp_attention",
          "--enable-dp-attention --dp-size N becomes attn_dp_size N and dp_size 1",
          "SGLang 0.5.23 moves the attention-DP width from dp_size to attn_dp_size",
          "set attn_dp_size: N and drop enable_dp_attention and dp_size"),
    _rule("policy.honor_draft_tokens", _ALL, "the collection's policy (not SGLang)",
          "policy: steps = draft tokens - 1, so that the server keeps the draft tokens",
          "the honor_draft_tokens policy set num_steps = num_draft_tokens - 1 so that SGLang keeps the draft tokens",
          "expected", arg="speculative_num_steps"),
    _rule("adaptive.disabled", _ONLY_0523, "0.5.23 speculative/adaptive_spec_params.py:56-100",
          "adaptive mode is switched off for an unsupported setup",
          "SGLang switched adaptive mode off for an unsupported setup (see the 'speculative_adaptive disabled:' log line)",
          "drop speculative_adaptive or change the setting the log line names", arg="speculative_adaptive",
          logs=[_log("speculative_adaptive disabled:", "speculative_adaptive", _ONLY_0523)]),
    _rule("adaptive.topk_default", _ONLY_0523, "0.5.23 arg_groups/speculative_hook.py:1392-1427",
          "adaptive mode defaults topk to 1",
          "adaptive mode sets it to its default", "set it explicitly"),
    _rule("adaptive.steps_default", _ONLY_0523, "0.5.23 arg_groups/speculative_hook.py:1392-1427",
          "adaptive mode defaults steps to the middle candidate step",
          "adaptive mode sets it to its default", "set it explicitly"),
    _rule("adaptive.draft_tokens", _ONLY_0523, "0.5.23 arg_groups/speculative_hook.py:1392-1427",
          "adaptive mode always sets draft tokens = steps + 1",
          "adaptive mode sets it to num_steps + 1", "set it explicitly"),
    _rule("ngram.topk_bfs_breadth", _FROM_0510, "0.5.23 arg_groups/speculative_hook.py:1309-1313",
          "NGRAM sets topk to speculative_ngram_max_bfs_breadth",
          "NGRAM replaces speculative_eagle_topk with speculative_ngram_max_bfs_breadth",
          "set speculative_ngram_max_bfs_breadth: {intended}", arg="speculative_eagle_topk"),
    _rule("ngram.draft_tokens_default", _FROM_0510, "0.5.23 arg_groups/speculative_hook.py:1314-1323",
          "NGRAM defaults the draft tokens to 12",
          "NGRAM defaults an unset speculative_num_draft_tokens to 12", "set it explicitly",
          logs=[_log("speculative_num_draft_tokens is set to 12 by default for ngram speculative decoding.",
                     "speculative_num_draft_tokens", _FROM_0510)]),
    _rule("ngram.steps_default", _ONLY_0523, "0.5.23 arg_groups/speculative_hook.py:1324-1330",
          "NGRAM defaults steps to draft tokens // topk",
          "NGRAM defaults speculative_num_steps to num_draft_tokens // topk", "set it explicitly"),
    _rule("dflash.steps_topk_1", _ONLY_0523, "0.5.23 arg_groups/speculative_hook.py:287-446",
          "DFLASH forces steps and topk to 1",
          "{algorithm} forces it to 1", "set {arg}: 1",
          logs=[_log("DFLASH only supports speculative_num_steps == 1; overriding", "speculative_num_steps", _ONLY_0523),
                _log("DFLASH only supports speculative_eagle_topk == 1; overriding", "speculative_eagle_topk", _ONLY_0523)]),
    _rule("dflash.block_size", _ONLY_0523, "0.5.23 arg_groups/speculative_hook.py:287-446",
          "DFLASH draft tokens follow --speculative-dflash-block-size",
          "DFLASH sets speculative_num_draft_tokens to speculative_dflash_block_size", "set them equal"),
    _rule("dspark.steps_topk_1", _ONLY_0523, "0.5.23 arg_groups/speculative_hook.py:666-883",
          "DSPARK forces steps and topk to 1",
          "{algorithm} forces it to 1", "set {arg}: 1",
          logs=[_log("DSpark only supports speculative_num_steps == 1; overriding", "speculative_num_steps", _ONLY_0523),
                _log("DSpark only supports speculative_eagle_topk == 1; overriding", "speculative_eagle_topk", _ONLY_0523)]),
    _rule("dspark.gamma_draft_tokens", _ONLY_0523, "0.5.23 arg_groups/speculative_hook.py:666-883",
          "DSPARK draft tokens = gamma + 1",
          "DSPARK sets speculative_num_draft_tokens to gamma + 1", "set speculative_dspark_block_size accordingly"),
    _rule("uno.steps_topk_1", _ONLY_0523, "0.5.23 arg_groups/speculative_hook.py:449-611",
          "UNO linear mode forces steps and topk to 1",
          "{algorithm} forces it to 1", "set {arg}: 1",
          logs=[_log("UNO uses speculative_num_steps=1; overriding", "speculative_num_steps", _ONLY_0523),
                _log("UNO uses speculative_eagle_topk=1; overriding", "speculative_eagle_topk", _ONLY_0523)]),
]

BY_ID = dict((r["id"], r) for r in RECORDS)


def anchor(rule_id):
    """The Markdown anchor of a rule's heading in DOC_FILE (GitHub style: dots dropped)."""
    return rule_id.replace(".", "").lower()


def doc_ref(rule_id):
    """The reference an adjustment carries in ``doc``."""
    return "%s#%s" % (DOC_FILE, anchor(rule_id))


def log_patterns(version=None):
    """``[{arg, rule, text, versions, doc}]`` of every log line, for ``version`` only when given."""
    documented = rule_version(version) if version is not None else None
    out = []
    for record in RECORDS:
        for line in record["logs"]:
            if documented is None or documented in line["versions"]:
                out.append({"arg": line["arg"], "rule": record["id"], "text": line["text"],
                            "versions": list(line["versions"]), "doc": doc_ref(record["id"])})
    return out


def scan_override_log(text, version=None):
    """Known override lines in server log ``text``: ``[{arg, rule, line}]`` in log order.

    With ``version`` only the lines that release prints are looked for.
    """
    patterns = log_patterns(version)
    found = []
    for line in str(text).splitlines():
        for pattern in patterns:
            if pattern["text"] in line:
                found.append({"arg": pattern["arg"], "rule": pattern["rule"], "line": line.strip()})
    return found


def _same(a, b):
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    return a == b


def fmt(value):
    """A value as the explanations write it (``unset`` for None)."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def rule_text(rule_id, arg, intended, running):
    """``why; fix`` of a rule for these values, or None for an unknown rule."""
    record = BY_ID.get(rule_id)
    if record is None:
        return None
    values = {"arg": arg, "intended": fmt(intended), "running": fmt(running),
              "algorithm": rule_id.split(".")[0].upper(), "intended_minus_one": None}
    fix = record["fix"]
    if record["fix_int"] and isinstance(intended, int) and not isinstance(intended, bool) and intended >= 2:
        values["intended_minus_one"] = intended - 1
        fix = record["fix_int"]
    return "%s; %s" % (record["why"].format(**values), fix.format(**values))


_EXPECTED_RUNNING = {
    "max_running_requests": (48, "spec.max_running_requests"),
    "disable_overlap_schedule": (True, "spec.overlap_schedule_off"),
    "enable_mixed_chunk": (False, "spec.mixed_chunk_off"),
    "speculative_draft_model_revision": ("main", "spec.draft_revision_main"),
    "speculative_adaptive": (False, "adaptive.disabled"),
    "enable_multi_layer_eagle": (True, "model.multi_layer_eagle"),
}


def default_rule(arg, intended, running, args=None):
    """The usual rule behind a difference in ``arg``, when it fits the values seen; else None."""
    args = args if hasattr(args, "get") else {}
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
    if arg in _EXPECTED_RUNNING and _same(running, _EXPECTED_RUNNING[arg][0]):
        return _EXPECTED_RUNNING[arg][1]
    if arg == "speculative_draft_model_path" and running is not None and running == args.get("model_path"):
        return "eagle.mtp_draft_path"
    return None


def _mask(arg, intended, running, secret_args):
    if arg in secret_args:
        return ("********" if intended is not None else None), ("********" if running is not None else None)
    return intended, running


def explain_line(arg, intended, running, rule_id=None, version=None, flag=None, secret_args=()):
    """``<arg>: intended X, running Y — <why>; <fix>`` for a known rule, else a generic line."""
    text = rule_text(rule_id, arg, intended, running) if rule_id else None
    intended, running = _mask(arg, intended, running, secret_args)
    head = "%s: intended %s, running %s" % (arg, fmt(intended), fmt(running))
    if text:
        return "%s \u2014 %s" % (head, text)
    flag = flag or "--" + str(arg).replace("_", "-")
    release = "SGLang %s" % version if version else "SGLang"
    return ("%s \u2014 no known %s rule changes this argument; check the server log for a warning naming %s and "
            "make sure the server was started with the rendered arguments" % (head, release, flag))


def find_rule(adjustments, arg, running):
    """The rule of the last adjustment in ``adjustments`` that set ``arg`` to ``running``, or None."""
    found = None
    for adj in adjustments or ():
        if adj.get("arg") == arg and _same(adj.get("to"), running) and not _same(adj.get("from"), adj.get("to")):
            found = adj.get("rule")
    return found
