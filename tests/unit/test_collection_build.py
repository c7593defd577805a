"""``make build`` produces a clean collection tarball that installs and documents itself.

The tarball must hold the collection only (plugins, roles, playbooks, meta,
docs, changelogs, README.md, CHANGELOG.rst, LICENSE, and the MANIFEST.json/FILES.json that
the build writes): no simulator (its Python package ``sglang`` would shadow
the real SGLang wherever the collection lands on ``sys.path``), no tests,
benchmarks, molecule scenarios or developer tooling, and nothing that a commit
would not hold (no coverage data, caches or other git-ignored files).
``ansible-galaxy collection build`` and ``install`` must not warn, and
``ansible-doc`` must render a module from the installed copy (not from the
checkout). Temporary directories are removed afterwards.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
VENV_BIN = pathlib.Path(sys.executable).parent
TIMEOUT = 600

# Top-level entries a user's copy of the collection may have (galaxy.yml build_ignore keeps the rest out).
ALLOWED_TOP = {"plugins", "roles", "playbooks", "meta", "docs", "changelogs", "README.md", "CHANGELOG.rst", "LICENSE",
               "MANIFEST.json", "FILES.json"}
# Must be there: without them the tarball is not the collection.
REQUIRED = {"MANIFEST.json", "FILES.json", "README.md", "LICENSE", "meta/runtime.yml", "playbooks/redeploy.yml",
            "docs/user-guide.md", "CHANGELOG.rst", "changelogs/changelog.yaml", "meta/execution-environment.yml",
            "meta/ee-bindep.txt"}
# Contributor pages and unreleased changelog fragments: in the repository, not in a user's copy.
CONTRIBUTOR_ONLY = ("docs/development.md", "docs/design.md", "changelogs/fragments/", "changelogs/.plugin-cache.yaml")
# Top-level import names of the test support (simulator/python): a package or module of that name anywhere in
# the tarball could end up on sys.path and shadow the real one. Everything under plugins/ is imported through
# Ansible's collection loader (ansible_collections.gpufleet.sglang.plugins...), so plugins/filter/sglang.py and
# plugins/module_utils/sglang/ are namespaced and cannot shadow anything.
TEST_SUPPORT_PACKAGES = ("sglang", "gpusim")
NAMESPACED = "plugins/"


def _env(**extra):
    env = dict(os.environ)
    # No ansible.cfg from the checkout (it points collections_path at .collections).
    for key in ("ANSIBLE_CONFIG", "ANSIBLE_COLLECTIONS_PATH", "ANSIBLE_COLLECTIONS_PATHS"):
        env.pop(key, None)
    env.update({"ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0", "PAGER": "cat"}, **extra)
    return env


def _assert_quiet(proc, what):
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, "%s: rc %d\n%s" % (what, proc.returncode, out)
    assert "WARNING" not in out and "ERROR" not in out, "%s:\n%s" % (what, out)


@pytest.fixture(scope="module")
def tarball(tmp_path_factory):
    galaxy = yaml.safe_load((REPO / "galaxy.yml").read_text())
    name = "%s-%s-%s.tar.gz" % (galaxy["namespace"], galaxy["name"], galaxy["version"])
    if os.environ.get("GPUFLEET_MATRIX_CORE"):
        # A controller matrix leg (scripts/matrix-controller.sh): the build command of `make build`, with the leg's
        # own ansible-galaxy (make would use .venv's), into a directory of this test.
        out = tmp_path_factory.mktemp("build")
        path = out / name
        argv = [str(VENV_BIN / "ansible-galaxy"), "collection", "build", "--force", "--output-path", str(out), "."]
    else:
        path = REPO / ".cache" / "build" / name
        argv = ["make", "--no-print-directory", "build"]
    build = subprocess.run(argv, cwd=str(REPO), env=_env(), capture_output=True, text=True, timeout=TIMEOUT,
                           check=False)
    _assert_quiet(build, " ".join(argv[:3]))
    assert path.is_file(), build.stdout
    return path


def test_tarball_holds_only_committable_files(tarball):
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=str(REPO),
                            capture_output=True, check=True, timeout=TIMEOUT).stdout.decode().split("\0")
    committable = {p for p in listed if p}
    with tarfile.open(tarball) as tar:
        files = {m.name for m in tar.getmembers() if m.isfile()}
    assert {"MANIFEST.json", "FILES.json"} <= files
    extra = sorted(files - committable - {"MANIFEST.json", "FILES.json"})
    assert extra == [], "files in the tarball that git ignores"
    assert not any(re.search(r"(^|/)(__pycache__|\.pytest_cache)/|\.pyc$", f) for f in files)
    assert "galaxy.yml" not in files


def _members(tarball):
    with tarfile.open(tarball) as tar:
        return {m.name: m for m in tar.getmembers()}


def test_tarball_holds_only_the_collection(tarball):
    members = _members(tarball)
    names = set(members)
    assert REQUIRED <= names, "missing from the tarball: %s" % sorted(REQUIRED - names)
    top = {n.split("/", 1)[0] for n in names}
    assert top <= ALLOWED_TOP, "not part of the collection (add to galaxy.yml build_ignore): %s" % sorted(top - ALLOWED_TOP)
    for gone in ("simulator", "tests", "bench", "molecule", "scripts", "requirements"):
        assert not any(n == gone or n.startswith(gone + "/") for n in names), gone
    for contributor in CONTRIBUTOR_ONLY:
        assert not any(n == contributor or n.startswith(contributor) for n in names if n != contributor.rstrip("/")), (
            "a contributor page or an unreleased fragment in the tarball: %s" % contributor)
    # Only files and directories: a packed link makes the tarball uninstallable or points outside it.
    odd = sorted(n for n, m in members.items() if not (m.isfile() or m.isdir()))
    assert odd == [], "links or special files in the tarball: %s" % odd


def test_tarball_has_no_test_support_package(tarball):
    shadowing = sorted(n for n in _members(tarball) if not n.startswith(NAMESPACED) and any(
        part in TEST_SUPPORT_PACKAGES or part in ("%s.py" % p for p in TEST_SUPPORT_PACKAGES)
        for part in n.split("/")))
    assert shadowing == [], "test-support packages in the tarball: %s" % shadowing
    # The simulator's entry points, wherever they might hide.
    assert not [n for n in _members(tarball) if n.endswith(("/launch_server.py", "/gpusim_cli.py", "/nvidia-smi"))]


def test_license_is_the_gpl_v3(tarball):
    galaxy = yaml.safe_load((REPO / "galaxy.yml").read_text())
    assert galaxy["license"] == ["GPL-3.0-or-later"]
    with tarfile.open(tarball) as tar:
        text = tar.extractfile("LICENSE").read().decode()
        manifest = json.load(tar.extractfile("MANIFEST.json"))
    assert "GNU GENERAL PUBLIC LICENSE" in text and "Version 3, 29 June 2007" in text
    assert manifest["collection_info"]["license"] == ["GPL-3.0-or-later"]


def test_installed_tarball_renders_a_module(tarball):
    tmp = tempfile.mkdtemp(prefix="gpufleet-build-test-")
    try:
        root = pathlib.Path(tmp)
        home = root / "home"
        collections = root / "collections"
        env = _env(ANSIBLE_HOME=str(home), ANSIBLE_LOCAL_TEMP=str(home / "tmp"),
                   ANSIBLE_GALAXY_CACHE_DIR=str(home / "galaxy_cache"), ANSIBLE_COLLECTIONS_PATH=str(collections))
        install = subprocess.run([str(VENV_BIN / "ansible-galaxy"), "collection", "install", "--offline", str(tarball),
                                  "-p", str(collections)], cwd=tmp, env=env, capture_output=True, text=True,
                                 timeout=TIMEOUT, check=False)
        _assert_quiet(install, "ansible-galaxy collection install")
        installed = collections / "ansible_collections" / "gpufleet" / "sglang"
        assert (installed / "MANIFEST.json").is_file() and (installed / "plugins" / "modules" / "node_lock.py").is_file()

        doc = subprocess.run([str(VENV_BIN / "ansible-doc"), "gpufleet.sglang.node_lock"], cwd=tmp, env=env,
                             capture_output=True, text=True, timeout=TIMEOUT, check=False)
        _assert_quiet(doc, "ansible-doc gpufleet.sglang.node_lock")
        first = doc.stdout.splitlines()[0]
        assert "gpufleet.sglang.node_lock" in first and str(installed) in first, first
        assert "EXAMPLES:" in doc.stdout and "RETURN VALUES:" in doc.stdout
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert not pathlib.Path(tmp).exists()
