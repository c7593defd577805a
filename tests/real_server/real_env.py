"""The real SGLang 0.5.23 server's venv, for the real-server stage.

Layout under ``.cache/real-server/`` (git-ignored; ``GPUFLEET_REAL_SERVER_CACHE`` moves it):

* ``venv/``: torch 2.13.0 (the CPU build on this machine's disk), the packages of
  ``requirements/real-server.txt``, then ``requirements/real-server-nodeps.txt`` (sglang
  0.5.23) with ``--no-deps``; ``requirements/real-server.lock`` pins the whole closure and
  ``scripts/pins.py check`` compares ``pip freeze`` with it after the install. Rebuilt from
  scratch when one of the three files changes (a stamp holds their digest).
* the venv's ``site-packages`` also gets ``gpufleet_real_server_hooks.py`` (a copy of
  ``tests/real_server/hooks/``, refreshed whenever it differs) and
  ``gpufleet-real-server.pth``, which imports it in every process of the venv: the
  import-only stand-ins and the simulated-GPU hook (see that module's docstring).

Usage::

    .venv/bin/python tests/real_server/real_env.py            # build what is missing, print the timings
    .venv/bin/python tests/real_server/real_env.py --relock   # build from the .txt files alone, rewrite the lock
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
CACHE = pathlib.Path(os.environ.get("GPUFLEET_REAL_SERVER_CACHE") or REPO / ".cache" / "real-server")
VENV = CACHE / "venv"
PYTHON = VENV / "bin" / "python"
REQUIREMENTS = REPO / "requirements" / "real-server.txt"
NODEPS = REPO / "requirements" / "real-server-nodeps.txt"
LOCK = REPO / "requirements" / "real-server.lock"
HOOKS = pathlib.Path(__file__).resolve().parent / "hooks" / "gpufleet_real_server_hooks.py"
PTH_NAME = "gpufleet-real-server.pth"
PTH_TEXT = "import gpufleet_real_server_hooks\n"
LOCK_HEADER = """The real-server stage's venv (.cache/real-server/venv): the whole closure of
requirements/real-server.txt and real-server-nodeps.txt (sglang 0.5.23, --no-deps).
Regenerate: .venv/bin/python tests/real_server/real_env.py --relock"""


def _digest(*paths):
    sha = hashlib.sha256()
    for path in paths:
        sha.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return sha.hexdigest()


def _pip(args, log):
    cmd = [str(PYTHON), "-m", "pip", "--disable-pip-version-check", "-q"] + args
    log("  $ pip " + " ".join(args))
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError("pip %s failed (rc %s):\n%s" % (" ".join(args), proc.returncode, proc.stdout[-4000:]))


@contextlib.contextmanager
def _locked():
    """One builder at a time (pytest-xdist workers, other checkouts sharing .cache)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def site_packages() -> pathlib.Path:
    return VENV / "lib" / ("python%d.%d" % sys.version_info[:2]) / "site-packages"


def _install_hooks() -> None:
    """Copy the hooks module and its .pth into the venv (atomic: a running server may read them)."""
    site = site_packages()
    for name, data in (("gpufleet_real_server_hooks.py", HOOKS.read_bytes()), (PTH_NAME, PTH_TEXT.encode())):
        path = site / name
        if path.exists() and path.read_bytes() == data:
            continue
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)


def _build(log, relock=False):
    if VENV.exists():
        shutil.rmtree(VENV)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    constraint = [] if relock else ["-c", str(LOCK)]
    _pip(["install", "-r", str(REQUIREMENTS)] + constraint, log)
    _pip(["install", "--no-deps", "-r", str(NODEPS)] + constraint, log)
    pins = [sys.executable, str(REPO / "scripts" / "pins.py")]
    if relock:
        subprocess.run(pins + ["freeze", str(VENV), str(LOCK), "--header", LOCK_HEADER], check=True)
    check = subprocess.run(pins + ["check", str(VENV), str(LOCK)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    if check.returncode != 0:
        raise RuntimeError(check.stdout)


def ensure(log=print, relock=False) -> pathlib.Path:
    """Build the venv if its files changed; install the hooks. Returns the venv's python."""
    with _locked():
        stamp = VENV / ".gpufleet-stamp"
        digest = None if relock else _digest(REQUIREMENTS, NODEPS, LOCK)
        if relock or not (stamp.exists() and stamp.read_text() == digest and PYTHON.exists()):
            started = time.time()
            log("real-server: building %s (torch 2.13.0 CPU, sglang 0.5.23 --no-deps, %s)"
                % (VENV, LOCK.relative_to(REPO)))
            _build(log, relock=relock)
            stamp.write_text(_digest(REQUIREMENTS, NODEPS, LOCK))
            log("real-server: venv ready in %.0f s" % (time.time() - started))
        _install_hooks()
    return PYTHON


if __name__ == "__main__":
    t0 = time.time()
    ensure(relock="--relock" in sys.argv[1:])
    print("real-server environment ready in %.0f s" % (time.time() - t0))
