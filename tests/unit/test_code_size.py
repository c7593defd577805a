"""The size limits of issue 23, so that they cannot regress: no product file under plugins/ over 900 lines (generated
data excepted), no function or method over 100 lines (``end_lineno - lineno + 1``, decorators not counted)."""
from __future__ import annotations

import ast
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLUGINS = os.path.join(REPO, "plugins")
MAX_FILE_LINES = 900
MAX_FUNCTION_LINES = 100
# Generated data, not code that anyone reads or edits by hand.
GENERATED = {"plugins/module_utils/sglang/flags_data.py"}


def plugin_files():
    found = []
    for root, dirs, files in os.walk(PLUGINS):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                found.append(os.path.relpath(os.path.join(root, name), REPO))
    return found


def file_lines(text):
    return len(text.splitlines())


def long_functions(text, limit=MAX_FUNCTION_LINES):
    """``[(name, first line, lines)]`` of the functions and methods of ``text`` longer than ``limit`` lines."""
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            size = node.end_lineno - node.lineno + 1
            if size > limit:
                out.append((node.name, node.lineno, size))
    return out


def read(rel):
    with open(os.path.join(REPO, rel), encoding="utf-8") as fh:
        return fh.read()


def test_the_walk_finds_the_plugins():
    files = plugin_files()
    assert "plugins/module_utils/server/launcher.py" in files and "plugins/module_utils/router/workers.py" in files
    assert GENERATED <= set(files), "a generated file named here is gone; update GENERATED"


def test_no_plugin_file_over_900_lines():
    over = [(rel, n) for rel, n in ((rel, file_lines(read(rel))) for rel in plugin_files() if rel not in GENERATED)
            if n > MAX_FILE_LINES]
    assert over == [], "split these files into cohesive modules (at most %d lines each): %s" % (MAX_FILE_LINES, over)


def test_no_function_over_100_lines():
    over = ["%s:%d %s (%d lines)" % (rel, line, name, size)
            for rel in plugin_files() for name, line, size in long_functions(read(rel))]
    assert over == [], "extract well-named helpers from: %s" % "; ".join(over)


def test_the_checks_count_what_they_claim():
    # The measures have teeth: a 101-line function and a 901-line file are caught, a 100-line function is not.
    body = "".join("    x = %d\n" % i for i in range(99))
    assert long_functions("def f():\n" + body) == []
    assert long_functions("def g():\n" + body + "    return x\n") == [("g", 1, 101)]
    method = "    " + body.replace("\n    ", "\n        ") + "        return x\n"
    assert long_functions("class C:\n    def m(self):\n" + method) == [("m", 2, 101)]
    assert file_lines("x = 1\n" * 901) == 901 > MAX_FILE_LINES
