# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The effective-config check: what the healthy server reports (``/server_info``) against what the
preflight predicted, field by field.

The expected values are the resolution's effective args, so a difference is something the
prediction did not foresee. It is explained from the adjustments the preflight already made (the
rule that changed the value, with its fix); the check never resolves a second time. Only when no
adjustment explains a difference does it ask the rules for the usual cause of that field.
"""

from __future__ import annotations

import json
import math
import os
import re

from ansible_collections.gpufleet.sglang.plugins.module_utils.common import secrets as secret_rules
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import flags as flag_table
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import rules

# Spellings SGLang normalises without changing behaviour (docs/reference/sglang-rules.md).
VALUE_ALIASES = {"speculative_algorithm": {"NEXTN": "EAGLE"}}
# 0.5.23 reports the deprecated ``--enable-dp-attention --dp-size N`` as attn_dp_size N and dp_size 1.
FIELD_ALIASES = {"dp_size": ("attn_dp_size",)}


def supports_config(version):
    """True when ``version`` has ``--config`` (0.5.10 and later)."""
    try:
        return flag_table.flag_available("config", version)
    except (ValueError, KeyError):
        return False


def norm_key(key):
    return str(key).strip().lstrip("-").replace("-", "_")


def is_path_arg(arg):
    return arg.endswith(("_path", "_dir", "_file")) or arg in ("model", "tokenizer", "download_dir")


def normalise(arg, value):
    """Comparable form: numbers as float, booleans as bool, ``'true'``/``'16'`` converted, algorithm and
    backend names upper-cased, paths normalised, lists element-wise."""
    if value is None:
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [normalise(arg, v) for v in value]
    if isinstance(value, dict):
        return dict((norm_key(k), normalise(norm_key(k), v)) for k, v in value.items())
    text = str(value).strip()
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    try:
        return float(int(text))
    except ValueError:
        pass
    try:
        num = float(text)
        if not math.isnan(num):
            return num
    except ValueError:
        pass
    if arg.endswith(("_algorithm", "_backend")):
        text = text.upper()
        return VALUE_ALIASES.get(arg, {}).get(text, text)
    if is_path_arg(arg) and text:
        text = os.path.normpath(text)
    return text


def _maybe_json(value, other):
    if isinstance(value, str) and isinstance(other, (dict, list)):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def same_value(arg, intended, running):
    a = normalise(arg, _maybe_json(intended, running))
    b = normalise(arg, _maybe_json(running, intended))
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(a, bool) or isinstance(b, bool):
        return bool(a) == bool(b) if (a in (None, False, True) and b in (None, False, True)) else a == b
    return a == b


def lookup_effective(info, arg):
    """``(found, value)`` of ``arg`` in a server_info answer: top level first, then the first DP rank's ``internal_states``."""
    if arg in info:
        return True, info[arg]
    states = info.get("internal_states")
    if isinstance(states, list) and states and isinstance(states[0], dict) and arg in states[0]:
        return True, states[0][arg]
    return False, None


def explain(arg, intended, running, version, args=None, adjustments=()):
    """One line: why ``arg`` runs ``running`` instead of ``intended``, from the preflight's adjustments (never a
    second resolution).

    The resolution mirror is imported here, on the first override only: a replace whose config runs as
    intended never compiles it (module runs compile their imports from the AnsiballZ zip every time)."""
    from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import resolve as resolve_mod

    return resolve_mod.explain(arg, intended, running, version, args=args, adjustments=list(adjustments or []))


def compare(expect, info, version, args=None, adjustments=()):
    """``(overrides, unverified)``: one dict per expected value the server does not run, and the names it does not report."""
    overrides = []
    unverified = []
    for raw_key in sorted(expect or {}):
        arg = norm_key(raw_key)
        intended = expect[raw_key]
        if intended is None:
            continue
        found, running = lookup_effective(info, arg)
        if not found:
            unverified.append(arg)
            continue
        if same_value(arg, intended, running):
            continue
        alias_ok = False
        for alias in FIELD_ALIASES.get(arg, ()):
            found_alias, value = lookup_effective(info, alias)
            if found_alias and same_value(arg, intended, value):
                alias_ok = True
        if alias_ok:
            continue
        try:
            why = explain(arg, intended, running, version, args=args, adjustments=adjustments)
        except Exception as exc:  # the explanation must never hide the difference itself
            why = "no explanation available (%s)" % exc
        overrides.append({"arg": arg, "intended": intended, "running": running, "explanation": why})
    return overrides, unverified


def format_override(item):
    why = item.get("explanation") or ""
    if why.startswith("%s:" % item["arg"]):
        return why
    prefix = "%s: intended %s, running %s" % (item["arg"], _show(item["intended"]), _show(item["running"]))
    return "%s \u2014 %s" % (prefix, why) if why else prefix


def _show(value):
    if isinstance(value, str):
        return value
    return json.dumps(value)


def scan_log(text, version, secrets=()):
    """Known override warnings in the log, once each, secrets masked: ``[{arg, rule, line}]``."""
    found = []
    seen = set()
    for item in rules.scan_override_log(text, version):
        line = secret_rules.mask_text(item["line"], secrets)
        if (line, item["arg"]) in seen:
            continue
        seen.add((line, item["arg"]))
        found.append({"arg": item["arg"], "rule": item.get("rule"), "line": line})
    return found


_CONFIG_LINE_RE = re.compile(r'^([A-Za-z0-9_-]+):\s*(.*?)\s*$')


_YAML_UNESCAPES = {'"': '"', "\\": "\\", "n": "\n", "t": "\t", "r": "\r", "0": "\0", "/": "/", " ": " ",
                   "a": "\a", "b": "\b", "e": "\x1b", "f": "\f", "v": "\v"}


def _yaml_unquote(text):
    """A YAML scalar as ``render.yaml_quote`` writes it: double-quoted with escapes (read left to right, so an
    escaped backslash before a ``0`` stays a backslash and a ``0``), single-quoted, or plain."""
    if len(text) >= 2 and text[0] == text[-1] == '"':
        body, out, i = text[1:-1], [], 0
        while i < len(body):
            char = body[i]
            if char != "\\" or i + 1 >= len(body):
                out.append(char)
                i += 1
                continue
            code = body[i + 1]
            width = {"x": 2, "u": 4, "U": 8}.get(code)
            if width:
                try:
                    out.append(chr(int(body[i + 2:i + 2 + width], 16)))
                    i += 2 + width
                    continue
                except ValueError:
                    pass
            out.append(_YAML_UNESCAPES.get(code, "\\" + code))
            i += 2
        return "".join(out)
    if len(text) >= 2 and text[0] == text[-1] == "'":
        return text[1:-1].replace("''", "'")
    return text


def read_config_yaml(path):
    """The top-level scalars of a ``--config`` file this collection wrote (``key: "value"`` lines); {} when missing."""
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return {}
    out = {}
    for line in lines:
        match = _CONFIG_LINE_RE.match(line)
        if match and match.group(2) not in ("", "{}"):
            out[match.group(1)] = _yaml_unquote(match.group(2))
    return out
