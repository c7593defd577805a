"""``make build`` produces a clean collection tarball that installs and documents itself.

The tarball must hold only what a commit would (no coverage data, caches or
other git-ignored files), ``ansible-galaxy collection build`` and ``install``
must not warn, and ``ansible-doc`` must render a module from the installed copy
(not from the checkout). Temporary directories are removed afterwards.
"""
from __future__ import annotations

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
def tarball():
    galaxy = yaml.safe_load((REPO / "galaxy.yml").read_text())
    path = REPO / ".cache" / "build" / ("%s-%s-%s.tar.gz" % (galaxy["namespace"], galaxy["name"], galaxy["version"]))
    build = subprocess.run(["make", "--no-print-directory", "build"], cwd=str(REPO), env=_env(),
                           capture_output=True, text=True, timeout=TIMEOUT, check=False)
    _assert_quiet(build, "make build")
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
