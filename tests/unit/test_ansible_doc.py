"""``ansible-doc`` renders every module, filter and role of the collection.

What is checked is discovered from the tree, so a new plugin is covered without
editing this file:

* modules: every ``plugins/modules/*.py``;
* filters: every filter that a ``plugins/filter/*.py`` registers in
  ``FilterModule.filters()``; each must be documented, either inline
  (``DOCUMENTATION`` in the ``.py``) or in a sidecar ``plugins/filter/<name>.yml``;
* roles: every ``roles/*/meta/argument_specs.yml``.

Each plugin type is rendered by one ``ansible-doc`` run (text) and one
``ansible-doc --json`` run over all its plugins: one run per plugin is several
seconds each on a loaded runner. A run must exit 0 with no ``WARNING`` or
``ERROR`` on stderr; when it does not, each plugin's test repeats the run for
that plugin alone, so the failure names the plugin at fault.
"""
from __future__ import annotations

import ast
import functools
import importlib
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
ANSIBLE_DOC = pathlib.Path(sys.executable).parent / "ansible-doc"
NS = "gpufleet.sglang"
TIMEOUT = 600


def _module_names() -> list[str]:
    return sorted(p.stem for p in (REPO / "plugins" / "modules").glob("*.py") if p.stem != "__init__")


def _inline_doc_name(path: pathlib.Path):
    """``name`` of a plugin file's inline DOCUMENTATION (its stem when not set), or None."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "DOCUMENTATION" for t in node.targets):
            doc = yaml.safe_load(ast.literal_eval(node.value)) or {}
            return doc.get("name", path.stem)
    return None


def _documented_filters() -> dict[str, str]:
    """Documented filter name -> the file that documents it (sidecar .yml or inline .py)."""
    found = {}
    filter_dir = REPO / "plugins" / "filter"
    for path in sorted(filter_dir.glob("*.yml")) + sorted(filter_dir.glob("*.yaml")):
        doc = (yaml.safe_load(path.read_text()) or {}).get("DOCUMENTATION") or {}
        found[doc.get("name", path.stem)] = path.name
    for path in sorted(filter_dir.glob("*.py")):
        name = _inline_doc_name(path)
        if name is not None:
            found[name] = path.name
    return found


def _registered_filters() -> dict[str, str]:
    """Filter name -> the plugin file whose FilterModule registers it."""
    found = {}
    for path in sorted((REPO / "plugins" / "filter").glob("*.py")):
        if path.stem == "__init__":
            continue
        mod = importlib.import_module("ansible_collections.gpufleet.sglang.plugins.filter." + path.stem)
        for name in mod.FilterModule().filters():
            found[name] = path.name
    return found


def _role_names() -> list[str]:
    return sorted(p.parent.parent.name for p in (REPO / "roles").glob("*/meta/argument_specs.yml"))


MODULES = _module_names()
FILTERS = sorted(_documented_filters())
ROLES = _role_names()


@pytest.fixture(scope="session")
def doc_env(tmp_path_factory):
    home = tmp_path_factory.mktemp("ansible-doc-home")
    env = dict(os.environ)
    env.update({
        "ANSIBLE_COLLECTIONS_PATH": str(REPO / ".collections"),
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_HOME": str(home),
        "ANSIBLE_LOCAL_TEMP": str(home / "tmp"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        "PAGER": "cat",
    })
    return env


def _run(env, plugin_type, names, as_json=False):
    argv = [str(ANSIBLE_DOC), "-t", plugin_type] + (["--json"] if as_json else []) + ["%s.%s" % (NS, n) for n in names]
    return subprocess.run(argv, env=env, cwd=str(REPO), capture_output=True, text=True, timeout=TIMEOUT, check=False)


def _core_warning_about_its_own_internal_collection() -> str:
    """The one warning that is ansible-core's, not ours: ``ansible-doc -t role`` of ansible-core 2.20 and 2.21
    warns about its internal ``ansible._protomatter`` collection, inside its own package, for any collection
    (ansible/ansible#85689, fixed by ansible/ansible#86815). Matched exactly, with the path of the running
    ansible-core."""
    import ansible
    return ("[WARNING]: Collection at '%s' does not have a MANIFEST.json file, nor has it galaxy.yml: cannot "
            "detect version." % os.path.join(os.path.dirname(ansible.__file__), "_internal", "ansible_collections",
                                             "ansible", "_protomatter"))


def _stderr(proc) -> str:
    """stderr without ansible-core's warning about its own internal collection."""
    known = _core_warning_about_its_own_internal_collection()
    return "\n".join(line for line in proc.stderr.splitlines() if line.strip() != known)


def _clean(proc) -> bool:
    return proc.returncode == 0 and "WARNING" not in _stderr(proc) and "ERROR" not in _stderr(proc)


def _assert_clean(proc, what):
    assert proc.returncode == 0, "%s: rc %d\n%s" % (what, proc.returncode, proc.stderr)
    assert "WARNING" not in _stderr(proc), "%s:\n%s" % (what, proc.stderr)
    assert "ERROR" not in _stderr(proc), "%s:\n%s" % (what, proc.stderr)


@functools.lru_cache(maxsize=None)
def _batch(env_key, plugin_type, names, as_json):
    return _run(dict(env_key), plugin_type, list(names), as_json)


def rendered(env, plugin_type, name, names):
    """(text run, json run) for ``name``: the batch runs over ``names`` when they are clean,
    else runs for ``name`` alone."""
    key = tuple(sorted(env.items()))
    text = _batch(key, plugin_type, tuple(names), False)
    as_json = _batch(key, plugin_type, tuple(names), True)
    if not (_clean(text) and _clean(as_json)):
        text = _run(env, plugin_type, [name])
        as_json = _run(env, plugin_type, [name], as_json=True)
    what = "ansible-doc -t %s %s.%s" % (plugin_type, NS, name)
    _assert_clean(text, what)
    _assert_clean(as_json, what + " --json")
    data = json.loads(as_json.stdout)
    fqcn = "%s.%s" % (NS, name)
    assert fqcn in data, "%s --json did not render it:\n%s" % (what, as_json.stderr)
    return text.stdout, data[fqcn]


def test_the_tree_has_plugins_to_check():
    assert MODULES and FILTERS and ROLES


@pytest.mark.parametrize("name", MODULES)
def test_module_doc_renders(doc_env, name):
    text, doc = rendered(doc_env, "module", name, MODULES)
    assert re.search(r"^> MODULE \*?%s\.%s\*? " % (re.escape(NS), name), text, re.M)
    assert "EXAMPLES:" in text and "RETURN VALUES:" in text
    assert doc["doc"]["module"] == name and doc["doc"]["short_description"]
    assert doc["doc"]["collection"] == NS
    assert isinstance(doc["examples"], str) and doc["examples"].strip()
    assert isinstance(doc["return"], dict) and doc["return"]


def test_every_registered_filter_is_documented():
    registered = _registered_filters()
    documented = _documented_filters()
    assert sorted(set(registered) - set(documented)) == [], "filters without documentation"
    assert sorted(set(documented) - set(registered)) == [], "documentation for filters that are not registered"


@pytest.mark.parametrize("name", FILTERS)
def test_filter_doc_renders(doc_env, name):
    text, doc = rendered(doc_env, "filter", name, FILTERS)
    assert re.search(r"^> FILTER \*?%s\.%s\*? " % (re.escape(NS), name), text, re.M)
    assert "EXAMPLES:" in text and "RETURN VALUES:" in text
    assert doc["doc"]["name"] == name and doc["doc"]["short_description"]
    assert doc["doc"]["collection"] == NS
    assert "_input" in doc["doc"]["options"]
    assert isinstance(doc["examples"], str) and doc["examples"].strip()
    assert "_value" in doc["return"]


# Entry points each role must have (every one it has must render): main, except the router steps, which the redeploy
# role includes one by one.
ENTRY_POINTS = {"sglang_router": ["add", "remove"]}


@pytest.mark.parametrize("name", ROLES)
def test_role_doc_renders(doc_env, name):
    text, doc = rendered(doc_env, "role", name, ROLES)
    assert re.search(r"^> ROLE: \*?%s\.%s\*? " % (re.escape(NS), name), text, re.M)
    assert doc["collection"] == NS
    names = ENTRY_POINTS.get(name, ["main"])
    assert set(names) <= set(doc["entry_points"]), sorted(doc["entry_points"])
    for entry in sorted(doc["entry_points"]):
        assert re.search(r"^ENTRY POINT: \*?%s\*? - " % entry, text, re.M)
        spec = doc["entry_points"][entry]
        assert spec["short_description"] and spec["options"]
        assert "attributes" not in spec  # deprecated in role specs (ansible-doc 2.19 warns)
