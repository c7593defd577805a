"""Every command-line field of the emulated SGLang releases, from the generated table.

``flag_table.json`` beside this file is written by ``scripts/gen-sglang-flags.py``
from the argparse parsers of the real releases (0.4.6.post5, 0.4.10.post2, 0.5.1,
0.5.10, 0.5.23); it is the same JSON text the collection embeds in
``plugins/module_utils/sglang/flags_data.py`` (a test checks that). The fake
server reads that data; it never imports the collection's code.

``fields(version_tuple)`` gives the rows of one release:
``(field, option strings, kind, default, choices, nargs)`` with kinds
``str int float hrint bool boolopt optstr strlist intlist floatlist json jsonlist
nullstr constchoice``; ``REQUIRED`` marks a field without a default.
"""
from __future__ import annotations

import json
import os

REQUIRED = "REQUIRED"
RELEASE_TUPLES = ((0, 4, 6), (0, 4, 10), (0, 5, 1), (0, 5, 10), (0, 5, 23))
_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "flag_table.json")
_CACHE = {}


def table() -> dict:
    if not _CACHE:
        with open(_PATH, "r", encoding="utf-8") as fh:
            _CACHE.update(json.load(fh))
    return _CACHE


def release_index(version_tuple) -> int:
    """The newest emulated release at or below ``version_tuple``."""
    index = 0
    for i, release in enumerate(RELEASE_TUPLES):
        if tuple(version_tuple) >= release:
            index = i
    return index


def _kind(spec) -> str:
    kind, ftype, parser, nargs = spec["k"], spec["t"], spec["p"] or "", spec["n"]
    if kind in ("store_true", "boolopt"):
        return "bool" if kind == "store_true" else "boolopt"
    if kind == "store_const":
        return "constchoice"
    if kind == "nargs":
        return {"int": "intlist", "float": "floatlist"}.get(parser, "strlist")
    if nargs == "?":
        return "optstr"
    if parser.endswith("human_readable_int"):
        return "hrint"
    if parser.endswith("json_list_type"):
        return "jsonlist"
    if parser == "loads":
        return "json"
    if parser.endswith("nullable_str"):
        return "nullstr"
    return {"int": "int", "float": "float"}.get(parser, "str")


def _row(name, spec):
    default = REQUIRED if spec["r"] else spec["d"]
    choices = tuple(spec["c"]) if spec["c"] is not None else None
    return (name, tuple(spec["o"]), _kind(spec), default, choices, spec["n"])


def fields(version_tuple) -> list:
    """The rows of the release emulated for ``version_tuple`` (deprecated extra spellings included)."""
    index = release_index(version_tuple)
    rows = []
    for name, entry in table()["fields"].items():
        for mask, spec in entry["specs"]:
            if mask >> index & 1:
                rows.append(_row(name, spec))
                rows.extend(_row(name, extra) for extra in spec.get("x", ()))
                break
    return rows
