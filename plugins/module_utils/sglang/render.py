# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Rendering SGLang arguments: the ONLY place that builds the server's argv,
its ``--config`` YAML file and the systemd unit's ExecStart value.

* ``to_argv(args, version, secrets)``: argv tokens with SGLang's own spellings.
* ``server_argv(args, version, config_path)``: the server's flags with the
  secrets left out, plus ``--config PATH`` when a config file carries them.
* ``to_config_yaml(args, version)``: the text of a ``--config`` file.
* ``systemd_exec_start(python, argv)``: ``<python> -m sglang.launch_server ...``
  quoted for systemd.

See docs/reference/sglang-rules.md §12 (flags and the config file).
"""
from __future__ import annotations

import json
import math
import re

from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.flags import (
    FLAGS,
    availability_error,
    coerce,
    flag_available,
    plain,
    unknown_key_message,
)
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.versions import (
    DEFAULT_VERSION,
    rule_version,
)


def _scalar_token(field, value):
    if isinstance(value, bool):
        raise ValueError("argument '%s' (%s) takes a value, not a boolean %r" % (field, FLAGS[field]["flag"], value))
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise ValueError("argument '%s' must be a finite number, got %r" % (field, value))
        return repr(value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return str(value)


def _checked_items(args, version):
    if not isinstance(args, dict) and not hasattr(args, "items"):
        raise ValueError("SGLang args must be a dict of field names to values, got %s %r" % (type(args).__name__, args))
    items = []
    for key, value in plain(dict(args)).items():
        if key not in FLAGS:
            raise ValueError(unknown_key_message(key))
        value, problem = coerce(key, value)
        if problem:
            raise ValueError(problem)
        if value is None or (value is False and FLAGS[key]["kind"] != "boolopt"):
            continue
        if version is not None:
            problem = availability_error(key, version)
            if problem:
                raise ValueError(problem)
            value, problem = coerce(key, value, version)
            if problem:
                raise ValueError(problem)
        items.append((key, value))
    return items


def _order(item):
    """model_path first, then by field name: one config, one rendering (argv and config.yaml alike)."""
    return (0, "") if item[0] == "model_path" else (1, item[0])


def to_argv(args, version=DEFAULT_VERSION, secrets="include"):
    """Render args as an argv token list with SGLang's exact flag spellings.

    Booleans true become the bare store_true flag and false is omitted; None
    is omitted; lists become ``--flag a b`` (SGLang declares list flags with
    ``nargs``, sglang-rules.md §12; an empty list is omitted); dicts and JSON
    arguments become one compact JSON token; ``model_path`` comes first, the
    rest in the order of their field names, so that one config renders to one argv
    whatever route its dict took (the inventory, a record written with sorted keys,
    the known-good copy of a rollback). A value that starts with ``-`` is written
    ``--flag=value`` so argparse cannot take it for an option, except
    ``config``, which SGLang only detects as the separate token ``--config``
    (sglang-rules.md §12).

    ``secrets="omit"`` leaves out ``api_key`` and ``admin_api_key`` (pass them
    through a 0600 ``--config`` file instead, 0.5.10+).

    Raises ValueError naming the key for unknown keys (with the closest known
    name), wrong value types, and flags the target version does not accept.
    """
    if secrets not in ("include", "omit"):
        raise ValueError("secrets must be 'include' or 'omit', got %s %r" % (type(secrets).__name__, secrets))
    rule_version(version)
    items = _checked_items(args, version)
    items.sort(key=_order)
    argv = []
    for key, value in items:
        spec = FLAGS[key]
        if secrets == "omit" and spec["secret"]:
            continue
        flag = spec["flag"]
        if spec["type"] == "bool":
            # store_true: the bare flag; --x/--no-x (BooleanOptionalAction): false is --no-x
            argv.append(flag if value else "--no-" + flag[2:])
        elif spec["type"] == "list":
            if not value:
                continue
            argv.append(flag)
            argv.extend(_scalar_token(key, item) for item in value)
        else:
            token = _scalar_token(key, value)
            if key == "config":
                if token.startswith("-"):
                    raise ValueError("argument 'config': the path %r starts with '-'; SGLang needs '--config FILE' as "
                                     "two tokens, so use a path like ./%s" % (token, token))
                argv.extend([flag, token])
            elif token.startswith("-"):
                argv.append("%s=%s" % (flag, token))
            else:
                argv.extend([flag, token])
    return argv


_YAML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r", "\0": "\\0"}


def yaml_quote(text):
    """Quote ``text`` as a YAML double-quoted scalar (safe for any string)."""
    out = ['"']
    for char in str(text):
        code = ord(char)
        if char in _YAML_ESCAPES:
            out.append(_YAML_ESCAPES[char])
        elif code < 0x20 or 0x7F <= code <= 0x9F or code in (0x2028, 0x2029, 0xFEFF) or 0xD800 <= code <= 0xDFFF:
            out.append("\\u%04x" % code)
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def _yaml_scalar(field, value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _scalar_token(field, value)
    if isinstance(value, (dict, list)):
        return yaml_quote(json.dumps(value, sort_keys=True, separators=(",", ":")))
    return yaml_quote(value)


def to_config_yaml(args, version=None):
    """Render args as the text of an SGLang ``--config`` YAML file (sglang-rules.md §12).

    Keys are the flag spellings without ``--`` (``api-key``), because SGLang
    turns each key into ``--<key>`` as written. Booleans: true only (false and
    None are omitted); lists become YAML sequences (empty lists omitted); dicts
    and JSON arguments become one quoted JSON string; strings are always
    double-quoted. ``config`` itself and ``lora_paths`` cannot go into the file
    (ValueError). With ``version`` the flags are version-checked and
    ``--config`` needs 0.5.10 or newer.
    """
    if version is not None and not flag_available("config", version):
        raise ValueError("--config needs SGLang 0.5.10 or newer; SGLang %s has no config file support (sglang-rules.md §12); "
                         "pass the arguments on the command line" % version)
    lines = []
    for key, value in sorted(_checked_items(args, version), key=_order):
        spec = FLAGS[key]
        if not spec["config"]:
            raise ValueError("argument '%s' (%s) cannot be written to a --config file; SGLang raises \"Unsupported config "
                             "option\" or allows only one config (sglang-rules.md §12); pass it on the command line"
                             % (key, spec["flag"]))
        name = spec["flag"][2:]
        if spec["type"] == "list":
            if not value:
                continue
            lines.append("%s:" % name)
            lines.extend("  - %s" % _yaml_scalar(key, item) for item in value)
        elif spec["type"] == "json":
            text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))
            lines.append("%s: %s" % (name, yaml_quote(text)))
        else:
            lines.append("%s: %s" % (name, _yaml_scalar(key, value)))
    return "\n".join(lines) + "\n" if lines else "{}\n"


def secret_fields(args):
    """The keys of ``args`` that are secrets (api_key, admin_api_key) and have a value."""
    return [k for k, v in plain(dict(args)).items() if k in FLAGS and FLAGS[k]["secret"] and v not in (None, False, "")]


def server_argv(args, version=DEFAULT_VERSION, config_path=None):
    """The server's flags: every arg but the secrets, plus ``--config PATH`` for them.

    Secrets (``api_key``, ``admin_api_key``) never go on the command line:
    they belong in the 0600 config file at ``config_path`` (write it with
    ``to_config_yaml(secret args, version)``). ``--config`` is appended as two
    tokens, because SGLang ignores ``--config=FILE`` (sglang-rules.md §12).

    Raises ValueError when secrets are present and ``config_path`` is not
    given, or the version has no ``--config`` (before 0.5.10), naming the fix;
    and for everything ``to_argv`` refuses.
    """
    argv = to_argv(args, version, secrets="omit")
    secrets = secret_fields(args)
    if not secrets:
        if config_path is not None:
            argv.extend(["--config", _config_token(config_path)])
        return argv
    if not flag_available("config", version):
        raise ValueError(
            "%s: SGLang %s has no --config option (added in 0.5.10), so the secret would have to go on the command "
            "line, readable by every local user through ps and /proc/PID/cmdline; upgrade SGLang to 0.5.10 or newer, "
            "or drop %s" % (", ".join(secrets), version, " and ".join(secrets)))
    if config_path is None:
        raise ValueError("%s: secrets go into a --config file; give config_path (the 0600 file written with "
                         "to_config_yaml) so that --config PATH is rendered" % ", ".join(secrets))
    argv.extend(["--config", _config_token(config_path)])
    return argv


def _config_token(path):
    token = str(path)
    if not token or token.startswith("-"):
        raise ValueError("config_path %r must be a file path that does not start with '-'; SGLang needs "
                         "'--config FILE' as two tokens (use ./%s)" % (token, token))
    return token


_SYSTEMD_BARE = re.compile(r"^[A-Za-z0-9_@+=:,./-]+$")


def systemd_quote(token, exec_word=True):
    """One ExecStart word: bare when it is plainly safe, else double-quoted.

    Inside the quotes ``\\`` becomes ``\\\\``, ``"`` becomes ``\\"`` and ``%``
    becomes ``%%`` (systemd expands % specifiers even inside quotes). The same
    rules as the ``q()`` macro of roles/sglang_server/templates/sglang.service.j2.
    A newline, carriage return or NUL is refused: a unit file is line-based,
    so such a word would end the ExecStart line and inject the next one.
    """
    text = str(token)
    if any(c in text for c in "\n\r\0"):
        raise ValueError("ExecStart word %r contains a newline, carriage return or NUL, which a systemd unit line "
                         "cannot carry; remove it" % (text,))
    if _SYSTEMD_BARE.match(text):
        return text
    quoted = text.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    # An ExecStart word: "$" too, since systemd substitutes $NAME and ${NAME} there even inside quotes ("$$" is a
    # literal "$"). Environment= assignments are not substituted (exec_word=False).
    return '"%s"' % (quoted.replace("$", "$$") if exec_word else quoted)


def systemd_exec_start(python, argv):
    """The unit's ExecStart value: ``<python> -m sglang.launch_server <argv>``, each word quoted for systemd."""
    python = str(python)
    if not python.startswith("/"):
        raise ValueError("python must be an absolute path to the server's interpreter (systemd needs one), got %r"
                         % (python,))
    words = [python, "-m", "sglang.launch_server"] + [str(t) for t in argv]
    return " ".join(systemd_quote(w) for w in words)
