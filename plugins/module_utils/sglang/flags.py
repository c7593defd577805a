# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The SGLang flag table and the value rules that go with it.

``FLAGS`` maps a field name (snake_case, as in ``ServerArgs``) to its flag:
``flag`` (the spelling rendered), ``type`` (int, float, str, bool for
store_true, list for nargs, json for one JSON text), ``kind``, ``aliases``,
``min_version`` / ``max_version`` (the first and last documented release that
accept it), ``secret`` and ``config`` (may go into a --config file).
See docs/reference/sglang-rules.md, "Flags".
"""
from __future__ import annotations

import difflib
import json
import re

from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.versions import (
    DOCUMENTED_VERSIONS,
    rule_version,
)

_TRUE_STRINGS = ("true", "yes", "on", "1")
_FALSE_STRINGS = ("false", "no", "off", "0")

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
    # model and serving
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
    # speculative decoding
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


def availability_error(field, version):
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


def unknown_key_message(key):
    message = "unknown SGLang argument '%s'" % (key,)
    suggestion = suggest_field(key)
    if suggestion and suggestion != key:
        message += "; did you mean '%s' (%s)?" % (suggestion, FLAGS[suggestion]["flag"])
    else:
        message += "; keys are SGLang field names in snake_case, for example 'tp_size' for --tp-size"
    return message


def plain(value):
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
        return dict((str(k), plain(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def same(a, b):
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    return a == b


def fmt(value):
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def coerce(field, value):
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
