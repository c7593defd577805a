"""Guard (issue 23 point 4): the engines never name a role's variables in their messages or results.

plugins/module_utils/ and the code of plugins/modules/ name module OPTIONS (``args.tp_size``, ``cache_dir``); a role
that wants its own names passes ``option_labels`` (module_utils/common/names.py). This reads every string constant
of that code with ast (docstrings, comments and the modules' DOCUMENTATION/EXAMPLES/RETURN are prose and left out)
and fails on any that holds a role variable: the roles' documented variables (meta/argument_specs.yml), their
defaults and vars, and the names of the redeploy's own variables.
"""
from __future__ import annotations

import ast
import functools
import glob
import os
import re

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Prefixes of the roles' variables (a name such as sglang_server_foo that no role defines yet is caught too).
PATTERN = re.compile(r"\b(?:sglang_(?:server|redeploy|router|smoke|adopt|prefetch|gpu|teardown|lock|lease|oracle|textfile|"
                     r"report|hosts|serial|max_fail)|gpu_(?:teardown|verify))_?[a-z0-9_]*")
PROSE = {"DOCUMENTATION", "EXAMPLES", "RETURN"}
# Whole-string constants that are data, not a name shown to anyone, by file:
ALLOWED = {
    # The keys of the sglang_preflight option ``settings``: a dict of role variables to range-check by design (the
    # role passes sglang_redeploy_settings); a message names the key the caller gave.
    "plugins/module_utils/redeploy/settings.py": "RULES",
    "plugins/module_utils/redeploy/preflight.py": "RULES",
    "plugins/module_utils/redeploy/target_inspection.py": "RULES",
    # The metric names' prefix: an output format (node_exporter textfile), not a variable.
    "plugins/module_utils/redeploy/textfile.py": {"sglang_redeploy_"},
}
# Left to do (role variables in a message, still): each is a play or flow variable that no module option carries, or
# was outside issue 23's list. Remove an entry once its file names the option; a new one fails.
KNOWN = {
    ("plugins/module_utils/redeploy/flow.py", "sglang_serial"),
    ("plugins/module_utils/redeploy/pd.py", "sglang_serial"),
    ("plugins/module_utils/redeploy/lease.py", "sglang_lease_break"),
    ("plugins/module_utils/redeploy/lease.py", "sglang_lock_timeout"),
}


@functools.lru_cache(maxsize=None)
def role_variables():
    names = set()
    for path in glob.glob(os.path.join(ROOT, "roles", "*", "meta", "argument_specs.yml")):
        for spec in (yaml.safe_load(open(path)) or {}).get("argument_specs", {}).values():
            names.update((spec or {}).get("options") or {})
    for path in glob.glob(os.path.join(ROOT, "roles", "*", "defaults", "main.yml")) + glob.glob(
            os.path.join(ROOT, "roles", "*", "vars", "main.yml")):
        names.update(k for k in (yaml.safe_load(open(path)) or {}) if not k.startswith("_"))
    return frozenset(names)


def settings_keys():
    from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import settings
    return set(settings.RULES) | set(settings.CHOICES)


def docstring_nodes(tree):
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = getattr(node, "body", [])
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in PROSE for t in node.targets):
            out.update(id(n) for n in ast.walk(node.value))
    return out


def role_names_in(path, variables):
    """``[(line, name, text)]``: the role variables in the string constants of ``path``."""
    tree = ast.parse(open(path).read(), path)
    skip = docstring_nodes(tree)
    rel = os.path.relpath(path, ROOT)
    allowed = ALLOWED.get(rel, set())
    if allowed == "RULES":
        allowed = settings_keys()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if node.value in allowed:
                continue
            names = set(PATTERN.findall(node.value)) | set(n for n in variables if re.search(r"\b%s\b" % n, node.value))
            for name in sorted(names):
                if (rel, name) not in KNOWN:
                    found.append((node.lineno, name, node.value[:120]))
    return found


def engine_files():
    return sorted(glob.glob(os.path.join(ROOT, "plugins", "module_utils", "**", "*.py"), recursive=True)
                  + glob.glob(os.path.join(ROOT, "plugins", "modules", "*.py")))


def test_the_guard_sees_role_variables():
    """The guard itself: a role variable in a message is found, one in a docstring or DOCUMENTATION is not."""
    variables = role_variables()
    assert {"sglang_server_args", "sglang_adopt_pids", "sglang_redeploy_force", "gpu_teardown_term_timeout"} <= variables
    sample = os.path.join(ROOT, "tests", "output", "guard_sample.py")
    os.makedirs(os.path.dirname(sample), exist_ok=True)
    with open(sample, "w") as handle:
        handle.write('"""Mentions sglang_server_args."""\nDOCUMENTATION = "sglang_server_env"\n\n\n'
                     'def f(x):\n    """sglang_adopt_pids."""\n    # sglang_server_cache_dir\n'
                     '    return "sglang_server_args.tp_size: bad %s" % x, "fix sglang_server_future_knob"\n')
    try:
        assert sorted((line, name) for line, name, _text in role_names_in(sample, variables)) == [
            (8, "sglang_server_args"), (8, "sglang_server_future_knob")]
    finally:
        os.unlink(sample)


@pytest.mark.parametrize("path", engine_files(), ids=lambda p: os.path.relpath(p, ROOT))
def test_no_role_variable_in_engine_strings(path):
    found = role_names_in(path, role_variables())
    assert not found, ("%s names role variables in string constants; name the module option through "
                       "module_utils/common/names.py (option_labels) instead: %s" % (os.path.relpath(path, ROOT), found))


def test_known_leftovers_are_still_there():
    """An entry of KNOWN that no longer matches is removed from it (the list only shrinks)."""
    for rel, name in sorted(KNOWN):
        text = open(os.path.join(ROOT, rel)).read()
        assert name in text, "%s no longer names %s: remove it from KNOWN" % (rel, name)
