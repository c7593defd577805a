"""A tiny YAML reader for ``--config`` files (no PyYAML on the targets).

Real SGLang reads the file with ``yaml.safe_load`` (docs/reference/sglang-processes.md, Config file,
``utils/server_args_config_parser.py``).  This reader covers the subset a
server config uses and follows PyYAML's ``safe_load`` typing for it:

* comments (``#`` at the start of a line or after white space), blank lines,
  an optional leading ``---`` and a trailing ``...``;
* a root block mapping ``key: value`` (keys plain or quoted); duplicate keys:
  the last one wins, as in PyYAML;
* scalars: ``null``/``~``/empty -> None; YAML 1.1 booleans (``true``,
  ``false``, ``yes``, ``no``, ``on``, ``off`` in lower, Title or UPPER case);
  integers (decimal, ``0x`` hex, YAML 1.1 ``0``-prefixed octal, ``_`` separators); floats in PyYAML's
  form (a dot is required: ``1.0e3`` is a float, ``1e3`` a string),
  ``.inf``/``.nan``; anything else is a string;
* ``'single'`` (``''`` escapes a quote) and ``"double"`` quoted strings
  (backslash escapes);
* lists: flow ``[a, b, "c"]`` or a block of ``- item`` lines under the key;
* one level of nested mapping: flow ``{a: 1, b: x}`` or an indented block of
  ``k: v`` lines under the key (passed to SGLang as JSON, like PyYAML dicts).

Not supported (``YamlSubsetError`` naming the line): anchors and aliases,
tags, block scalars (``|``, ``>``), multi-line flow collections, deeper
nesting, multiple documents.  A root that is a list or a scalar is returned
as such, so the caller can reject it the way SGLang does ("Config file must
contain a dictionary at root level").
"""
from __future__ import annotations

import re

__all__ = ["YamlSubsetError", "load", "loads"]


class YamlSubsetError(ValueError):
    """The document uses YAML outside the supported subset, or is malformed."""


_BOOL = {}
for _w, _v in (("true", True), ("yes", True), ("on", True),
               ("false", False), ("no", False), ("off", False)):
    for _form in (_w, _w.title(), _w.upper()):
        _BOOL[_form] = _v
_NULL = ("", "~", "null", "Null", "NULL")
_INT_RE = re.compile(r"^[-+]?(0|[1-9][0-9_]*)$")
_HEX_RE = re.compile(r"^[-+]?0x[0-9a-fA-F_]+$")
_OCT_RE = re.compile(r"^[-+]?0[0-7_]+$")
_FLOAT_RE = re.compile(r"^[-+]?([0-9][0-9_]*)?\.[0-9_]*([eE][-+][0-9]+)?$")
_INF_RE = re.compile(r"^[-+]?\.(inf|Inf|INF)$")
_NAN_RE = re.compile(r"^\.(nan|NaN|NAN)$")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\", '"': '"',
            "/": "/", " ": " ", "a": "\a", "b": "\b", "e": "\x1b", "f": "\f", "v": "\v"}


def _strip_comment(line: str) -> str:
    """Remove a ``#`` comment that is outside quotes."""
    quote = None
    i = 0
    while i < len(line):
        ch = line[i]
        if quote:
            if ch == "\\" and quote == '"':
                i += 2
                continue
            if ch == quote:
                if quote == "'" and i + 1 < len(line) and line[i + 1] == "'":
                    i += 2
                    continue
                quote = None
        elif ch in ("'", '"'):
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i]
        i += 1
    return line


def _unquote(text: str, lineno: int):
    if text[0] == "'":
        if len(text) < 2 or text[-1] != "'":
            raise YamlSubsetError("line %d: unterminated single-quoted string" % lineno)
        return text[1:-1].replace("''", "'")
    if len(text) < 2 or text[-1] != '"':
        raise YamlSubsetError("line %d: unterminated double-quoted string" % lineno)
    body = text[1:-1]
    out = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt in _ESCAPES:
                out.append(_ESCAPES[nxt])
                i += 2
                continue
            if nxt in "xuU":
                width = {"x": 2, "u": 4, "U": 8}[nxt]
                code = body[i + 2:i + 2 + width]
                try:
                    out.append(chr(int(code, 16)))
                except ValueError:
                    raise YamlSubsetError("line %d: bad escape \\%s%s" % (lineno, nxt, code))
                i += 2 + width
                continue
            raise YamlSubsetError("line %d: unknown escape \\%s" % (lineno, nxt))
        out.append(ch)
        i += 1
    return "".join(out)


def _scalar(text: str, lineno: int):
    text = text.strip()
    if text[:1] in ("'", '"'):
        return _unquote(text, lineno)
    if text[:1] in ("&", "*", "!", "|", ">", "%", "@", "`"):
        raise YamlSubsetError("line %d: %r is outside the supported YAML subset "
                              "(anchors, aliases, tags and block scalars are not supported)"
                              % (lineno, text))
    if text in _NULL:
        return None
    if text in _BOOL:
        return _BOOL[text]
    if _INT_RE.match(text):
        return int(text.replace("_", ""))
    if _HEX_RE.match(text):
        return int(text.replace("_", ""), 16)
    if _OCT_RE.match(text):  # YAML 1.1 octal, as PyYAML: 017 -> 15
        digits = text.replace("_", "")
        sign = -1 if digits.startswith("-") else 1
        return sign * int(digits.lstrip("+-"), 8)
    if _FLOAT_RE.match(text) and text not in (".", "+.", "-."):
        return float(text.replace("_", ""))
    if _INF_RE.match(text):
        return float("-inf") if text.startswith("-") else float("inf")
    if _NAN_RE.match(text):
        return float("nan")
    return text


def _split_flow(body: str, lineno: int) -> list:
    """Split the inside of ``[...]`` / ``{...}`` on top-level commas."""
    items, cur, quote = [], [], None
    i = 0
    while i < len(body):
        ch = body[i]
        if quote:
            cur.append(ch)
            if ch == "\\" and quote == '"' and i + 1 < len(body):
                cur.append(body[i + 1])
                i += 2
                continue
            if ch == quote:
                quote = None
        elif ch in ("'", '"'):
            quote = ch
            cur.append(ch)
        elif ch in "[]{}":
            raise YamlSubsetError("line %d: nested flow collections are not supported" % lineno)
        elif ch == ",":
            items.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
        i += 1
    if quote:
        raise YamlSubsetError("line %d: unterminated quoted string" % lineno)
    last = "".join(cur).strip()
    if last or items:
        items.append(last)
    if items and items[-1] == "":
        items.pop()  # a trailing comma is allowed in flow collections
    return items


def _split_key(text: str, lineno: int):
    """``key: value`` -> (key, value text) or None when there is no mapping colon."""
    if text[:1] in ("'", '"'):
        quote = text[0]
        end = 1
        while end < len(text):
            if text[end] == "\\" and quote == '"':
                end += 2
                continue
            if text[end] == quote:
                if quote == "'" and end + 1 < len(text) and text[end + 1] == "'":
                    end += 2
                    continue
                break
            end += 1
        key = _unquote(text[:end + 1], lineno)
        rest = text[end + 1:].lstrip()
        if not rest.startswith(":"):
            return None
        return key, rest[1:].strip()
    m = re.match(r"^([^:#]*?[^\s:])\s*:(\s+|$)(.*)$", text)
    if not m:
        return None
    return m.group(1), m.group(3).strip()


def _value(text: str, lineno: int):
    if text.startswith("["):
        if not text.endswith("]"):
            raise YamlSubsetError("line %d: multi-line flow lists are not supported" % lineno)
        return [_scalar(item, lineno) for item in _split_flow(text[1:-1], lineno)]
    if text.startswith("{"):
        if not text.endswith("}"):
            raise YamlSubsetError("line %d: multi-line flow mappings are not supported" % lineno)
        out = {}
        for item in _split_flow(text[1:-1], lineno):
            kv = _split_key(item, lineno)
            if kv is None:
                raise YamlSubsetError("line %d: expected 'key: value' in %r" % (lineno, item))
            out[kv[0]] = _scalar(kv[1], lineno)
        return out
    return _scalar(text, lineno)


def loads(text: str):
    """Parse ``text``; returns a dict (or a list / scalar for a non-mapping root)."""
    lines = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        if "\t" in raw[:len(raw) - len(raw.lstrip())]:
            raise YamlSubsetError("line %d: tabs are not allowed for indentation" % lineno)
        stripped = _strip_comment(raw).rstrip()
        if not stripped.strip():
            continue
        if stripped.strip() == "---" and not lines:
            continue
        if stripped.strip() == "...":
            break
        if stripped.strip() == "---":
            raise YamlSubsetError("line %d: multiple documents are not supported" % lineno)
        indent = len(stripped) - len(stripped.lstrip(" "))
        lines.append((lineno, indent, stripped.strip()))
    if not lines:
        return None

    first_lineno, first_indent, first = lines[0]
    if first.startswith("- ") or first == "-":
        # A root sequence: return a list so the caller reports the real error.
        out = []
        for lineno, indent, item in lines:
            if indent != first_indent or not (item.startswith("- ") or item == "-"):
                raise YamlSubsetError("line %d: unexpected content in a root list" % lineno)
            out.append(_value(item[1:].strip(), lineno))
        return out
    if _split_key(first, first_lineno) is None:
        if len(lines) > 1:
            raise YamlSubsetError("line %d: expected 'key: value'" % lines[1][0])
        return _value(first, first_lineno)

    root = {}
    i = 0
    while i < len(lines):
        lineno, indent, body = lines[i]
        if indent != first_indent:
            raise YamlSubsetError("line %d: unexpected indentation" % lineno)
        kv = _split_key(body, lineno)
        if kv is None:
            raise YamlSubsetError("line %d: expected 'key: value', got %r" % (lineno, body))
        key, rest = kv
        i += 1
        if rest:
            root[key] = _value(rest, lineno)
            continue
        # Empty value: a block list / mapping may follow, indented (or, for a
        # list, at the same indentation, as PyYAML allows).
        block = []
        while i < len(lines):
            l2, ind2, b2 = lines[i]
            is_item = b2.startswith("- ") or b2 == "-"
            if ind2 > first_indent or (ind2 == first_indent and is_item):
                block.append(lines[i])
                i += 1
            else:
                break
        if not block:
            root[key] = None
            continue
        block_indent = block[0][1]
        if block[0][2].startswith("- ") or block[0][2] == "-":
            items = []
            for l2, ind2, b2 in block:
                if ind2 != block_indent or not (b2.startswith("- ") or b2 == "-"):
                    raise YamlSubsetError("line %d: nested structures inside a list are not "
                                          "supported" % l2)
                item = b2[1:].strip()
                if item.startswith(("[", "{")) or (_split_key(item, l2) is not None
                                                   and item[:1] not in ("'", '"')):
                    raise YamlSubsetError("line %d: nested structures inside a list are not "
                                          "supported" % l2)
                items.append(_scalar(item, l2))
            root[key] = items
        else:
            mapping = {}
            for l2, ind2, b2 in block:
                if ind2 != block_indent:
                    raise YamlSubsetError("line %d: only one level of nested mapping is "
                                          "supported" % l2)
                kv2 = _split_key(b2, l2)
                if kv2 is None or not kv2[1]:
                    raise YamlSubsetError("line %d: expected 'key: value' in a nested mapping"
                                          % l2)
                mapping[kv2[0]] = _value(kv2[1], l2)
            root[key] = mapping
    return root


def load(path: str):
    with open(path, "r", encoding="utf-8") as fh:
        return loads(fh.read())
