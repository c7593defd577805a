"""Regenerate ``sglang/srt/flag_table.py`` from an unpacked SGLang 0.5.23 wheel.

Developer tool, not used at run time.  Usage::

    pip download --no-deps sglang==0.5.23 -d /tmp/sgl
    cd /tmp/sgl && unzip -q sglang-0.5.23-*.whl -d w
    python3 simulator/python/sglang/tools/gen_flag_table.py /tmp/sgl/w \
        > simulator/python/sglang/srt/flag_table.py

``gen_flag_table.py --rewrap`` re-renders the checked-in table instead (for a
change of layout only; no wheel needed).

It reads the field declarations of ``sglang/srt/arg_groups/fields/*.py`` with
``ast`` (no import of the real package, which needs torch) and applies the
same derivation as ``arg_utils.add_cli_args_from_dataclass``
(sglang.md §5: flags generated from field names plus aliases; booleans are
``store_true``; fields without a default are required).  Choice lists that are
module constants are resolved from ``arg_groups/choices.py`` when they are
plain literal lists; anything else is left without choices (more lenient than
the real parser, never stricter).
"""
from __future__ import annotations

import ast
import glob
import importlib
import os
import sys


def _literal_consts(path):
    consts = {}
    tree = ast.parse(open(path).read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                consts[node.targets[0].id] = ast.literal_eval(node.value)
            except Exception:
                pass
    return consts


def _default(node):
    if node is None:
        return "REQUIRED"
    src = ast.unparse(node)
    if "default_factory=list" in src:
        return []
    if "default_factory=dict" in src:
        return {}
    try:
        return ast.literal_eval(node)
    except Exception:
        return eval(src, {"__builtins__": {}})  # arithmetic such as 1024 * 1024


def _kind(typ, kw):
    action = kw.get("action")
    tparser = kw.get("type_parser")
    nargs = kw.get("nargs")
    inner = typ
    if inner.startswith("Optional[") and inner.endswith("]"):
        inner = inner[len("Optional["):-1]
    if action == "argparse.BooleanOptionalAction":
        return "boolopt"
    if action is not None:
        return "strlist"  # e.g. LoRAPathAction, nargs="*"
    if tparser in ("json.loads",):
        return "json"
    if tparser == "json_list_type":
        return "jsonlist"
    if tparser == "human_readable_int":
        return "hrint"
    if tparser is not None:
        return "str"
    if inner.startswith("Literal["):
        vals = ast.literal_eval("[" + inner[len("Literal["):-1] + "]")
        first = vals[0] if vals else ""
        if first is None and len(vals) > 1:
            first = vals[1]
        return {int: "int", float: "float"}.get(type(first), "str")
    if inner.startswith(("List[", "Union[set[str], List[str]]")) or "List[" in inner and nargs:
        elem = inner[inner.index("List[") + 5:].split("]")[0]
        return {"int": "intlist", "float": "floatlist"}.get(elem, "strlist")
    if inner == "bool":
        return "bool"
    if nargs == "?":
        return "optstr"
    return {"int": "int", "float": "float"}.get(inner, "str")


def main(root):
    base = os.path.join(root, "sglang", "srt", "arg_groups")
    consts = _literal_consts(os.path.join(base, "choices.py"))
    order_src = open(os.path.join(base, "field_order.py")).read()
    order = []
    for node in ast.parse(order_src).body:
        if isinstance(node, ast.Assign) and node.targets[0].id == "POSITIONAL_FIELD_ORDER":
            order = list(ast.literal_eval(node.value))
    rows = {}
    decl = []
    for path in sorted(glob.glob(os.path.join(base, "fields", "*.py"))):
        if path.endswith("__init__.py"):
            continue
        for cls in ast.parse(open(path).read()).body:
            if not isinstance(cls, ast.ClassDef):
                continue
            for st in cls.body:
                if not isinstance(st, ast.AnnAssign) or not isinstance(st.target, ast.Name):
                    continue
                ann = st.annotation
                if not (isinstance(ann, ast.Subscript) and getattr(ann.value, "id", None) == "A"):
                    continue
                elts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
                typ = ast.unparse(elts[0])
                meta = elts[1] if len(elts) > 1 else None
                kw = {}
                if isinstance(meta, ast.Call):
                    kw = {k.arg: ast.unparse(k.value) for k in meta.keywords}
                if kw.get("no_cli") == "True":
                    continue
                name = st.target.id
                cli = ast.literal_eval(kw["cli_name"]) if "cli_name" in kw else "--" + name.replace("_", "-")
                aliases = ast.literal_eval(kw["aliases"]) if "aliases" in kw else []
                choices = None
                if "choices" in kw:
                    try:
                        choices = ast.literal_eval(kw["choices"])
                    except Exception:
                        choices = consts.get(kw["choices"])
                        if not isinstance(choices, list):
                            choices = None
                kind = _kind(typ, kw)
                if choices is None and typ.replace("Optional[", "").startswith("Literal[") and kind in ("str", "int", "float"):
                    inner = typ[len("Optional["):-1] if typ.startswith("Optional[") else typ
                    choices = list(ast.literal_eval("[" + inner[len("Literal["):-1] + "]"))
                rows[name] = (name, tuple([cli] + aliases), kind, _default(st.value), tuple(choices) if choices else None)
                decl.append(name)
    ordered = [n for n in order if n in rows] + [n for n in decl if n not in set(order)]
    sys.stdout.write(render([rows[n] for n in ordered]))


HEADER = '''"""Every command-line field of SGLang 0.5.23 (generated; do not edit).

Generated by ``sglang/tools/gen_flag_table.py`` from the field declarations of
the sglang 0.5.23 wheel (``sglang/srt/arg_groups/fields/*.py``), in the
``ServerArgs`` field order.  Row: (field, option strings, kind, default, choices).
Kinds: str int float hrint bool boolopt optstr strlist intlist floatlist json jsonlist.
``REQUIRED`` marks a field without a default (argparse ``required=True``).
"""
REQUIRED = "REQUIRED"

FIELDS = (
'''

# Rows longer than this are wrapped (ansible-test pep8 allows 160 characters).
MAX_LINE = 120
INDENT = "    "


def _pack(items, indent, width):
    """Lines of comma-separated ``items`` starting at ``indent``, each at most ``width`` long."""
    lines = []
    line = ""
    for item in items:
        cand = f"{line} {item}," if line else f"{indent}{item},"
        if line and len(cand) > width:
            lines.append(line)
            cand = f"{indent}{item},"
        line = cand
    if line:
        lines.append(line)
    return lines


def _row(row):
    """One FIELDS row as source lines: one line if it fits, otherwise the choices
    tuple is wrapped with a hanging indent."""
    name, names, kind, default, choices = row
    d = "REQUIRED" if default == "REQUIRED" else repr(default)
    flat = f"{INDENT}({name!r}, {names!r}, {kind!r}, {d}, {choices!r}),"
    if len(flat) <= MAX_LINE or not choices:
        return [flat]
    head = f"{INDENT}({name!r}, {names!r}, {kind!r}, {d}, ("
    body = _pack([repr(c) for c in choices], INDENT * 2, MAX_LINE)
    return [head] + body + [f"{INDENT})),"]


def render(rows):
    """The text of ``flag_table.py`` for ``rows`` of (field, option strings, kind, default, choices)."""
    out = [HEADER.rstrip("\n")]
    for row in rows:
        out.extend(_row(row))
    out.append(")")
    return "\n".join(out) + "\n"


def rewrap():
    """Re-render the checked-in table (``--rewrap``): a formatting change without the wheel."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.dirname(os.path.dirname(here)))
    flag_table = importlib.import_module("sglang.srt.flag_table")
    return render(flag_table.FIELDS)


if __name__ == "__main__":
    if sys.argv[1:] == ["--rewrap"]:
        sys.stdout.write(rewrap())
    else:
        main(sys.argv[1])
