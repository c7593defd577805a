# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The SGLang flag table per release, and the value rules that go with it.

The table is generated from the real parsers (``scripts/gen-sglang-flags.py``
into ``flags_data.py``) and parsed on first use. Per release, a field has its
option strings, a type (int, float, str, bool, list, json), a kind (value,
store_true, boolopt for ``--x/--no-x``, store_const, nargs), choices, a
default and whether SGLang's ``--config`` file may carry it
(docs/reference/sglang-rules.md §12).

``FLAGS`` keeps the release-independent view: field -> ``flag`` (the spelling
rendered), ``type``, ``kind``, ``aliases``, ``min_version`` / ``max_version``
(the first and last documented release that has it), ``secret``,
``replaced_by`` and ``config``. ``spec(field, version)`` is one release's
entry. A field whose name is a secret by ``module_utils.secrets`` (api_key,
admin_api_key, ssl_keyfile_password, ...) is ``secret``.
"""
from __future__ import annotations

import difflib
import json
import re

from ansible_collections.gpufleet.sglang.plugins.module_utils.common import secrets as _secrets
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.versions import (
    DOCUMENTED_VERSIONS,
    rule_version,
)

_TRUE_STRINGS = ("true", "yes", "on", "1")
_FALSE_STRINGS = ("false", "no", "off", "0")
# Renamed flags: the old field and the one that replaced it.
REPLACED_BY = {"cuda_graph_max_bs": "cuda_graph_max_bs_decode"}
# watermark_config carries the watermark key; SGLang redacts it from its own launch command.
_EXTRA_SECRETS = ("watermark_config",)

_TABLE = {}


def _table():
    """The generated table, parsed once (a few milliseconds)."""
    if not _TABLE:
        from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import flags_data

        data = json.loads(flags_data.DATA)
        releases = data["releases"]
        if len(releases) != len(DOCUMENTED_VERSIONS):
            raise ValueError("flags_data.py lists %d releases, the rules know %d; regenerate it"
                             % (len(releases), len(DOCUMENTED_VERSIONS)))
        _TABLE["releases"] = releases
        _TABLE["fields"] = data["fields"]
        _TABLE["flags"] = dict((name, _summary(name, entry)) for name, entry in data["fields"].items())
    return _TABLE


def _summary(name, entry):
    mask = 0
    aliases = set()
    for release_mask, spec in entry["specs"]:
        mask |= release_mask
        aliases.update(spec["o"])
        for extra in spec.get("x", ()):
            aliases.update(extra["o"])
    aliases.discard(entry["flag"])
    present = [i for i in range(len(DOCUMENTED_VERSIONS)) if mask >> i & 1]
    newest = _spec_at(entry, present[-1])
    kind = "json" if newest["t"] == "json" else newest["k"]
    return {
        "flag": entry["flag"],
        "type": newest["t"],
        "kind": kind,
        "aliases": sorted(a for a in aliases if a.startswith("--") and not a.startswith("--no-")),
        "min_version": DOCUMENTED_VERSIONS[present[0]] if present[0] > 0 else None,
        "max_version": DOCUMENTED_VERSIONS[present[-1]] if present[-1] < len(DOCUMENTED_VERSIONS) - 1 else None,
        # a secret is a string value with a secret name (bucket_time_to_first_token is a list of floats)
        "secret": (_secrets.is_secret_name(name) and newest["t"] == "str") or name in _EXTRA_SECRETS,
        "replaced_by": REPLACED_BY.get(name),
        "config": bool(newest["cfg"]) and name != "config",
        "mask": mask,
    }


def _spec_at(entry, index):
    for release_mask, spec in entry["specs"]:
        if release_mask >> index & 1:
            return spec
    return None


class _Flags(object):
    """A read-only mapping field -> summary, loaded on first access."""

    def _d(self):
        return _table()["flags"]

    def __getitem__(self, key):
        return self._d()[key]

    def __contains__(self, key):
        return key in self._d()

    def __iter__(self):
        return iter(self._d())

    def __len__(self):
        return len(self._d())

    def keys(self):
        return self._d().keys()

    def items(self):
        return self._d().items()

    def values(self):
        return self._d().values()

    def get(self, key, default=None):
        return self._d().get(key, default)


FLAGS = _Flags()


def secret_args():
    """The secret fields, sorted."""
    return tuple(sorted(k for k, v in FLAGS.items() if v["secret"]))


def __getattr__(name):
    # SECRET_ARGS is computed on first use, so that importing this module parses nothing.
    if name == "SECRET_ARGS":
        return secret_args()
    raise AttributeError(name)


def release_index(version):
    return DOCUMENTED_VERSIONS.index(rule_version(version))


def spec(field, version=None):
    """``field``'s entry for ``version`` (the newest release that has it when None), or None.

    Keys: type, kind, nargs, choices, default, required, options, parser, config.
    """
    entry = _table()["fields"].get(field)
    if entry is None:
        return None
    if version is None:
        index = max(i for i in range(len(DOCUMENTED_VERSIONS)) if FLAGS[field]["mask"] >> i & 1)
    else:
        index = release_index(version)
    raw = _spec_at(entry, index)
    if raw is None:
        return None
    return {"type": raw["t"], "kind": raw["k"], "nargs": raw["n"], "choices": raw["c"], "default": raw["d"],
            "required": raw["r"], "options": list(raw["o"]) + [o for x in raw.get("x", ()) for o in x["o"]],
            "parser": raw["p"], "config": bool(raw["cfg"])}


def flag_available(field, version):
    """True when ``version`` accepts the flag of ``field``."""
    return bool(FLAGS[field]["mask"] >> release_index(version) & 1)


def availability_error(field, version):
    """Why ``version`` rejects ``field``'s flag, or None when it accepts it."""
    if flag_available(field, version):
        return None
    info = FLAGS[field]
    index = release_index(version)
    present = [i for i in range(len(DOCUMENTED_VERSIONS)) if info["mask"] >> i & 1]
    if index < present[0]:
        return (
            "argument '%s' (%s) needs SGLang %s or newer; SGLang %s fails at startup with "
            "\"unrecognized arguments: %s\". Drop '%s' or upgrade SGLang"
            % (field, info["flag"], DOCUMENTED_VERSIONS[present[0]], version, info["flag"], field)
        )
    hint = "; use '%s' instead" % info["replaced_by"] if info["replaced_by"] else ""
    last = max(i for i in present if i < index)
    return (
        "argument '%s' (%s) is not accepted after SGLang %s; SGLang %s rejects it at startup "
        "(\"unrecognized arguments\"). Drop '%s'%s" % (field, info["flag"], DOCUMENTED_VERSIONS[last], version, field, hint)
    )


def suggest_field(key):
    """The known field closest to ``key`` (dash or flag spellings accepted), or None."""
    norm = str(key).lstrip("-").replace("-", "_").lower()
    if norm in FLAGS:
        return norm
    for field, info in FLAGS.items():
        if "--" + norm.replace("_", "-") in info["aliases"]:
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


def _choice_error(field, value, choices, version, flag):
    shown = ", ".join("'%s'" % c for c in choices)
    return ("%s: SGLang %s rejects %r at startup (argparse: \"argument %s: invalid choice: %r (choose from %s)\"); "
            "use one of %s" % (field, version, value, flag, value, shown, ", ".join(str(c) for c in choices)))


def coerce(field, value, version=None, check_choices=True):
    """Coerce ``value`` to ``field``'s type (for ``version``); returns (value, error).

    With ``version``, a value outside that release's argparse choices is an error.
    """
    info = FLAGS[field]
    entry = spec(field, version) if version is not None else None
    ftype = entry["type"] if entry else info["type"]
    flag = info["flag"]
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
            coerced = value
        elif isinstance(value, float) and value.is_integer():
            coerced = int(value)
        elif isinstance(value, str) and re.match(r"^\s*-?\d+\s*$", value):
            coerced = int(value)
        else:
            return value, "%s: SGLang fails at startup with \"argument %s: invalid int value: %r\"; give an integer" % (
                field, flag, str(value))
        return _checked_choice(field, coerced, entry, version, flag, check_choices)
    if ftype == "float":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value, None
        if isinstance(value, str):
            try:
                return float(value), None
            except ValueError:
                pass
        return value, "%s: SGLang fails at startup with \"argument %s: invalid float value: %r\"; give a number" % (
            field, flag, str(value))
    if ftype == "list":
        if not isinstance(value, (list, tuple)):
            return value, "%s: %s takes a list of values, got %s %r; write it as a YAML list" % (
                field, flag, type(value).__name__, value)
        value = list(value)
        if check_choices and entry and entry["choices"]:
            for item in value:
                if str(item) not in [str(c) for c in entry["choices"]]:
                    return value, _choice_error(field, item, entry["choices"], version, flag)
        return value, None
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
    return _checked_choice(field, value if isinstance(value, str) else str(value), entry, version, flag, check_choices)


def _checked_choice(field, value, entry, version, flag, check_choices):
    if check_choices and entry and entry["choices"] and value not in entry["choices"] \
            and str(value) not in [str(c) for c in entry["choices"]]:
        return value, _choice_error(field, value, entry["choices"], version, flag)
    return value, None
