"""The real SGLang releases, installed for the differential test (and the flag generator).

Layout under ``.cache/differential/`` (git-ignored; rebuilt when a requirements file changes):

* ``venv/``: one virtualenv with the CPU build of torch 2.13.0 and the pure-Python
  packages of ``requirements/differential.txt`` (shared by every release);
* ``sglang-<version>/``: ``pip install --no-deps --target`` of
  ``requirements/differential-sglang-<version>.txt`` (the release, and the transformers it
  pins where the shared one does not fit).

A release runs as ``venv/bin/python`` with ``PYTHONPATH=<standins>:<sglang-version>``;
``standins/sitecustomize.py`` supplies import-only stand-ins for the compiled CUDA
packages (see its docstring for why each exists).

Run as a script to build everything and print the timings::

    .venv/bin/python tests/differential/env.py
"""
from __future__ import annotations

import hashlib
import os
import pathlib
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
CACHE = pathlib.Path(os.environ.get("GPUFLEET_DIFFERENTIAL_CACHE") or REPO / ".cache" / "differential")
VENV = CACHE / "venv"
STANDINS = pathlib.Path(__file__).resolve().parent / "standins"
REQUIREMENTS = REPO / "requirements"
VERSIONS = ("0.4.6.post5", "0.4.10.post2", "0.5.1", "0.5.10", "0.5.23")


class Release(object):
    """One installed SGLang release: how to run Python with it."""

    def __init__(self, version):
        self.version = version
        self.target = CACHE / ("sglang-" + version)
        self.python = str(VENV / "bin" / "python")

    def env(self, base=None):
        env = dict(os.environ if base is None else base)
        env["PYTHONPATH"] = os.pathsep.join([str(STANDINS), str(self.target)])
        env.pop("PYTHONHOME", None)
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # cache the bytecode: the releases import thousands of modules
        env["HF_HUB_OFFLINE"] = "1"
        env["TRANSFORMERS_OFFLINE"] = "1"
        return env


def _digest(*paths):
    sha = hashlib.sha256()
    for path in paths:
        sha.update(path.read_bytes())
    return sha.hexdigest()


def _pip(args, log):
    cmd = [str(VENV / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q"] + args
    log("  $ pip " + " ".join(args))
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError("pip %s failed (rc %s):\n%s" % (" ".join(args), proc.returncode, proc.stdout[-4000:]))


def ensure_venv(log=print):
    req = REQUIREMENTS / "differential.txt"
    stamp = VENV / ".gpufleet-stamp"
    digest = _digest(req)
    if stamp.exists() and stamp.read_text() == digest:
        return False
    started = time.time()
    log("differential: building %s (torch 2.13.0 CPU + %s)" % (VENV.relative_to(REPO), req.relative_to(REPO)))
    if not (VENV / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    # One resolution, every package pinned by the file (torch's own dependencies included), then
    # checked: a package the file does not pin fails the build (scripts/pins.py).
    _pip(["install", "-r", str(req), "-c", str(req)], log)
    check = subprocess.run([sys.executable, str(REPO / "scripts" / "pins.py"), "check", str(VENV), str(req)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    if check.returncode != 0:
        raise RuntimeError(check.stdout)
    stamp.write_text(digest)
    log("differential: venv ready in %.0f s" % (time.time() - started))
    return True


def ensure_release(version, log=print):
    release = Release(version)
    req = REQUIREMENTS / ("differential-sglang-%s.txt" % version)
    stamp = release.target / ".gpufleet-stamp"
    digest = _digest(req)
    if stamp.exists() and stamp.read_text() == digest:
        return release, False
    started = time.time()
    log("differential: installing %s into %s" % (req.relative_to(REPO), release.target.relative_to(REPO)))
    if release.target.exists():
        subprocess.run(["rm", "-rf", "--", str(release.target)], check=True)
    _pip(["install", "--no-deps", "--target", str(release.target), "-r", str(req)], log)
    stamp.write_text(digest)
    log("differential: %s ready in %.0f s" % (version, time.time() - started))
    return release, True


def ensure(versions=VERSIONS, log=print):
    """Build what is missing; returns {version: Release}."""
    CACHE.mkdir(parents=True, exist_ok=True)
    ensure_venv(log)
    return dict((v, ensure_release(v, log)[0]) for v in versions)


if __name__ == "__main__":
    t0 = time.time()
    ensure()
    print("differential environment ready in %.0f s" % (time.time() - t0))
