"""The release a user gets agrees with itself: galaxy.yml's version is the newest release of
changelogs/changelog.yaml (antsibull-changelog), CHANGELOG.rst is what that file generates, and every
place that names the collection's tarball or EE image names that version.

Fragments added after the release (changelogs/fragments/) are the next release's and are allowed.
"""
from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
VENV_BIN = pathlib.Path(sys.executable).parent


def _version(text):
    return tuple(int(x) for x in text.split("."))


def _galaxy_version():
    return yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]


def test_galaxy_version_is_the_newest_release():
    releases = yaml.safe_load((REPO / "changelogs" / "changelog.yaml").read_text())["releases"]
    assert releases, "changelogs/changelog.yaml has no release"
    newest = max(releases, key=_version)
    assert newest == _galaxy_version(), (newest, _galaxy_version())
    for version, release in releases.items():
        assert release.get("release_date"), version
        assert (release.get("changes") or {}).get("release_summary"), "release %s has no release summary" % version


def test_changelog_rst_is_generated_from_changelog_yaml(tmp_path):
    for name in ("galaxy.yml", "CHANGELOG.rst"):
        shutil.copy(REPO / name, tmp_path / name)
    shutil.copytree(REPO / "changelogs", tmp_path / "changelogs")
    tool = shutil.which("antsibull-changelog", path=str(VENV_BIN)) or str(REPO / ".venv" / "bin" / "antsibull-changelog")
    try:
        proc = subprocess.run([tool, "generate"], cwd=str(tmp_path), capture_output=True, text=True, timeout=120,
                              check=False)
    except FileNotFoundError:
        if os.environ.get("GPUFLEET_MATRIX_CORE"):
            # A controller leg's container has the leg's venv only (its .venv is this machine's, not runnable there).
            pytest.skip("antsibull-changelog (requirements/dev.txt) is not in this controller leg; the unit stage "
                        "(.venv) checks CHANGELOG.rst")
        raise
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = (REPO / "CHANGELOG.rst").read_text()
    assert (tmp_path / "CHANGELOG.rst").read_text() == text, "CHANGELOG.rst is stale: run antsibull-changelog generate"
    version = _galaxy_version()
    assert "\nv%s\n" % version in text
    first = text.index("\nv")
    assert text[first:].startswith("\nv%s\n" % version), "the newest section of CHANGELOG.rst is not v%s" % version


def test_every_tarball_and_ee_image_name_carries_the_version():
    version = _galaxy_version()
    for rel in ("execution-environment.yml", "docs/awx.md", "docs/user-guide.md", "README.md"):
        text = (REPO / rel).read_text()
        named = set(re.findall(r"gpufleet-sglang-(?:ee:)?(\d+\.\d+\.\d+)", text))
        assert named <= {version}, "%s names collection version(s) %s, galaxy.yml says %s" % (rel, sorted(named), version)
    assert "gpufleet-sglang-%s.tar.gz" % version in (REPO / "execution-environment.yml").read_text()
    assert "gpufleet-sglang-%s.tar.gz" % version in (REPO / "docs" / "awx.md").read_text()
