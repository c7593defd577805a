"""The collection as a user installs it: the tarball of ``make build``, in a clean virtualenv
that holds nothing but ansible-core.

1. ``ansible-galaxy collection install`` of the tarball into an empty directory, which is then the
   only collection path (``ANSIBLE_COLLECTIONS_PATH``; no ansible.cfg, ``ANSIBLE_HOME`` of its own,
   no ``sys.path`` scan), so the checkout cannot stand in for a missing file.
2. ``ansible-doc`` renders every module, filter and role of the installed copy; the lists come from
   the installed copy (its ``plugins/modules/``, the ``FilterModule`` classes of its
   ``plugins/filter/``, ``ansible-doc -l``), not from a list in this file.
3. The incident redeploy (``gpufleet.sglang.redeploy``, by FQCN, from the installed copy) replaces
   a hand-started incident server on a simulated node. The node is test support from the checkout
   (``simulator/`` through ``playbook_helpers.SimNode``): the tarball has no simulator.

The virtualenv is ``.cache/matrix/user-core-<version>`` (ansible-core at the version
requirements/dev.txt pins), made on first use and reused while that pin stands.
Run: ``.venv/bin/python -m pytest tests/matrix/test_user_install.py`` (the ``user-install`` stage).
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import subprocess
import sys

import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "integration"))

from playbook_helpers import RESOLVED_SPEC, Procs, SimNode, alive, session_members  # noqa: E402

TIMEOUT = 540


def _pin(name):
    for line in (REPO / "requirements" / "dev.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith(name + "=="):
            return line.split("==", 1)[1]
    raise AssertionError("%s is not pinned in requirements/dev.txt" % name)


CORE = _pin("ansible-core")
UVENV = REPO / ".cache" / "matrix" / ("user-core-%s" % CORE)
UBIN = UVENV / "bin"


def _run(argv, **kw):
    kw.setdefault("timeout", TIMEOUT)
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, check=False, **kw)


def _ok(proc, what):
    assert proc.returncode == 0, "%s: rc %d\n%s\n%s" % (what, proc.returncode, proc.stdout[-4000:], proc.stderr[-4000:])
    return proc


@pytest.fixture(scope="module")
def user_venv():
    stamp = UVENV / ".gpufleet-user-venv"
    # ansible-core's own dependencies at the versions CI tested (requirements/dev.lock holds them).
    lock = REPO / "requirements" / "dev.lock"
    want = CORE + " " + hashlib.sha256(lock.read_bytes()).hexdigest()
    if not (stamp.is_file() and stamp.read_text() == want and (UBIN / "ansible-playbook").exists()):
        _ok(_run([sys.executable, "-m", "venv", "--clear", UVENV]), "python -m venv")
        _ok(_run([UBIN / "python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                  "-c", lock, "ansible-core==%s" % CORE]), "pip install ansible-core==%s" % CORE)
        stamp.write_text(want)
    # Only ansible-core and what it depends on: no ansible package, no bundled collections.
    site = _ok(_run([UBIN / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]), "purelib")
    assert not (pathlib.Path(site.stdout.strip()) / "ansible_collections").exists()
    frozen = _ok(_run([UBIN / "python", "-m", "pip", "freeze", "--all"]), "pip freeze").stdout.lower()
    assert "ansible-core==%s" % CORE in frozen
    assert not any(line.startswith(("ansible==", "ansible-lint", "ansible-runner", "molecule", "pytest"))
                   for line in frozen.splitlines()), frozen
    return UVENV


@pytest.fixture(scope="module")
def tarball():
    galaxy = yaml.safe_load((REPO / "galaxy.yml").read_text())
    path = REPO / ".cache" / "build" / ("%s-%s-%s.tar.gz" % (galaxy["namespace"], galaxy["name"], galaxy["version"]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    _ok(_run(["make", "--no-print-directory", "build"], cwd=REPO, env=env), "make build")
    assert path.is_file()
    return path


@pytest.fixture(scope="module")
def user(tmp_path_factory, user_venv, tarball):
    """The user's side: an empty collection path with the tarball installed, and the env to use it."""
    base = tmp_path_factory.mktemp("user")
    home = base / "home"
    collections = base / "collections"
    for d in (home, collections):
        d.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "PYTHON", "VIRTUAL_ENV"))}
    env.update({
        "PATH": "%s:/usr/local/bin:/usr/bin:/bin" % UBIN,
        "ANSIBLE_HOME": str(home),
        "ANSIBLE_LOCAL_TEMP": str(home / "tmp"),
        "ANSIBLE_GALAXY_CACHE_DIR": str(home / "galaxy_cache"),
        "ANSIBLE_COLLECTIONS_PATH": str(collections),
        "ANSIBLE_COLLECTIONS_SCAN_SYS_PATH": "False",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        "PAGER": "cat",
        "NO_PROXY": "*",
        "no_proxy": "*",
    })
    install = _ok(_run([UBIN / "ansible-galaxy", "collection", "install", "--offline", tarball, "-p", collections],
                       cwd=base, env=env), "ansible-galaxy collection install")
    assert "WARNING" not in install.stdout + install.stderr, install.stdout + install.stderr
    root = collections / "ansible_collections" / "gpufleet" / "sglang"
    assert (root / "MANIFEST.json").is_file()
    return {"base": base, "env": env, "collections": collections, "root": root}


def test_the_installed_copy_is_the_only_one(user):
    listed = _ok(_run([UBIN / "ansible-galaxy", "collection", "list", "gpufleet.sglang", "--format", "json"],
                      cwd=user["base"], env=user["env"]), "ansible-galaxy collection list")
    found = json.loads(listed.stdout)
    assert list(found) == [str(user["collections"] / "ansible_collections")], found
    config = _ok(_run([UBIN / "ansible-config", "dump", "--only-changed"], cwd=user["base"], env=user["env"]),
                 "ansible-config dump").stdout
    assert "COLLECTIONS_PATHS" in config and str(user["collections"]) in config, config
    assert str(REPO) not in config, config
    version = _ok(_run([UBIN / "ansible-playbook", "--version"], cwd=user["base"], env=user["env"]), "--version").stdout
    assert "core %s" % CORE in version and "config file = None" in version, version
    # The simulator is test support: not in the installed copy.
    assert not (user["root"] / "simulator").exists() and not (user["root"] / "tests").exists()


def _doc(user, kind, name):
    proc = _ok(_run([UBIN / "ansible-doc", "-t", kind, name], cwd=user["base"], env=user["env"]),
               "ansible-doc -t %s %s" % (kind, name))
    out = proc.stdout + proc.stderr
    assert "WARNING" not in out and "ERROR" not in out, out
    return proc.stdout


def _listed(user, kind):
    proc = _ok(_run([UBIN / "ansible-doc", "-t", kind, "-l", "gpufleet.sglang", "--json"], cwd=user["base"],
                    env=user["env"]), "ansible-doc -t %s -l" % kind)
    return sorted(json.loads(proc.stdout))


def test_every_module_renders_from_the_installed_copy(user):
    files = sorted("gpufleet.sglang." + p.stem for p in (user["root"] / "plugins" / "modules").glob("*.py")
                   if not p.name.startswith("_"))
    assert files, "no modules in the installed copy"
    assert _listed(user, "module") == files
    for name in files:
        text = _doc(user, "module", name)
        first = text.splitlines()[0]
        assert name in first and str(user["root"]) in first, first
        assert "EXAMPLES:" in text and "RETURN VALUES:" in text, name


def test_every_filter_renders_from_the_installed_copy(user):
    # The filters each FilterModule of the installed copy registers, loaded through Ansible's
    # collection loader from the installed path only.
    script = (
        "import importlib, json, pathlib, sys\n"
        "from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder\n"
        "_AnsibleCollectionFinder(paths=[sys.argv[1]])._install()\n"
        "names = []\n"
        "for f in sorted(pathlib.Path(sys.argv[2]).glob('*.py')):\n"
        "    m = importlib.import_module('ansible_collections.gpufleet.sglang.plugins.filter.' + f.stem)\n"
        "    assert m.__file__.startswith(sys.argv[1]), m.__file__\n"
        "    names += ['gpufleet.sglang.' + n for n in m.FilterModule().filters()]\n"
        "print(json.dumps(sorted(names)))\n")
    proc = _ok(_run([UBIN / "python", "-c", script, user["collections"], user["root"] / "plugins" / "filter"],
                    cwd=user["base"], env=user["env"]), "list the filters")
    registered = json.loads(proc.stdout)
    assert registered, "no filters in the installed copy"
    assert _listed(user, "filter") == registered
    for name in registered:
        text = _doc(user, "filter", name)
        assert name in text.splitlines()[0] and str(user["root"]) in text.splitlines()[0], text.splitlines()[0]
        assert "EXAMPLES:" in text and "RETURN VALUES:" in text, name


def test_every_role_renders_from_the_installed_copy(user):
    roles = sorted("gpufleet.sglang." + p.parent.parent.name
                   for p in (user["root"] / "roles").glob("*/meta/argument_specs.yml"))
    assert roles, "no role argument specs in the installed copy"
    assert _listed(user, "role") == roles
    for name in roles:
        assert "ENTRY POINT:" in _doc(user, "role", name), name


@pytest.fixture(scope="module")
def procs():
    tracker = Procs()
    yield tracker
    left = tracker.cleanup()
    assert not left, "processes survived SIGKILL: %s" % left


def test_incident_redeploy_from_the_installed_copy(user, procs, tmp_path):
    node = SimNode(tmp_path / "node", procs)
    old_pid = node.start_server_by_hand(node.server_args(), log_name="incident.log")
    old_tree = session_members(old_pid)
    assert node.server_info()["speculative_num_draft_tokens"] == 2       # the incident, as SGLang runs it
    inventory = node.write_inventory({"node1": node.host_vars()}, tmp_path / "inventory.json")
    procs.track_pid_file(node.pid_file)
    run = _run([UBIN / "ansible-playbook", "-i", inventory, "gpufleet.sglang.redeploy"], cwd=user["base"],
               env=user["env"])
    procs.track_pid_file(node.pid_file)
    _ok(run, "ansible-playbook gpufleet.sglang.redeploy (installed copy)")

    reports = sorted(node.reports.glob("*-redeploy.json"))
    assert len(reports) == 1, reports
    rows = json.loads(reports[0].read_text())
    assert [r["host"] for r in rows] == ["node1"], rows
    row = rows[0]
    assert row["status"] == "deployed" and row["step"] == "done", row
    assert {k: row["effective_args"][k] for k in RESOLVED_SPEC} == RESOLVED_SPEC
    assert old_pid in [p["pid"] for p in row["signalled"]]

    # The node itself: the incident server is gone, the new one runs the resolved config.
    assert not any(alive(p) for p in old_tree)
    new_pid = node.server_pid()
    assert new_pid and new_pid != old_pid and alive(new_pid)
    info = node.server_info()
    assert {k: info[k] for k in RESOLVED_SPEC} == RESOLVED_SPEC
