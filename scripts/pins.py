#!/usr/bin/env python
"""Lock files: the whole dependency closure of each virtualenv the project builds.

Every venv is installed with ``pip install -c requirements/<name>.lock ...``, so a
transitive dependency (cryptography under ansible-core, say) gets the version that CI
tested, not whatever the index serves that day. After the install, ``check`` compares
``pip freeze`` with the lock and fails on any difference: a package the lock does not
name (a new transitive dependency), or another version. An update is one deliberate
commit: build the venv from its top-level requirements without the lock, run its tests,
then ``freeze`` it into the lock.

Usage:
  scripts/pins.py check  VENV LOCK [--allow NAME ...] [--subset]
  scripts/pins.py freeze VENV LOCK --header TEXT
  scripts/pins.py digest FILE...          (one sha256 over the files: the venv stamps)

``--allow`` names packages that are installed another way (a local wheel, torch's CPU
build) and are checked by name only. ``--subset``: the venv holds part of what the lock
pins (a tool installed apart, with the lock as constraints): every installed package must
be in the lock at its version, and lock entries that are not installed are fine.
"""
from __future__ import annotations

import argparse
import hashlib
import pathlib
import re
import subprocess
import sys

# pip's own tooling is not part of what a venv's code imports; venv creates them.
BOOTSTRAP = {"pip", "setuptools", "wheel"}


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse(lines) -> dict[str, str]:
    """{normalised name: version} from freeze or lock lines (comments and options skipped)."""
    pins = {}
    for raw in lines:
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\s*([^\s;]+)", line)
        if not match:
            raise SystemExit("pins: not an exact pin: %r" % raw.rstrip())
        pins[normalise(match.group(1))] = match.group(2)
    return pins


def frozen(venv: pathlib.Path) -> dict[str, str]:
    python = venv / "bin" / "python"
    out = subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", "freeze", "--all"],
                         check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout
    pins = {}
    for line in out.splitlines():
        if " @ " in line:  # a direct URL: name only
            name = line.split(" @ ", 1)[0].strip()
            pins[normalise(name)] = "@" + line.split(" @ ", 1)[1].strip()
            continue
        pins.update(parse([line]))
    for name in BOOTSTRAP:
        pins.pop(name, None)
    return pins


def differences(installed: dict[str, str], locked: dict[str, str], allow=(), subset=False) -> list[str]:
    allow = {normalise(a) for a in allow}
    problems = []
    for name in sorted(set(installed) | (set() if subset else set(locked))):
        have, want = installed.get(name), locked.get(name)
        if name in BOOTSTRAP:
            continue
        if want is None:
            problems.append("%s==%s is installed but not in the lock (a new transitive dependency? "
                            "pin it deliberately)" % (name, have))
        elif have is None:
            problems.append("%s==%s is in the lock but not installed" % (name, want))
        elif have != want and name not in allow and not have.split("+", 1)[0] == want:
            problems.append("%s: installed %s, the lock pins %s" % (name, have, want))
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    check = sub.add_parser("check")
    check.add_argument("venv", type=pathlib.Path)
    check.add_argument("lock", type=pathlib.Path)
    check.add_argument("--allow", action="append", default=[])
    check.add_argument("--subset", action="store_true")
    freeze = sub.add_parser("freeze")
    freeze.add_argument("venv", type=pathlib.Path)
    freeze.add_argument("lock", type=pathlib.Path)
    freeze.add_argument("--header", required=True)
    digest = sub.add_parser("digest")
    digest.add_argument("files", nargs="+", type=pathlib.Path)
    args = parser.parse_args(argv)

    if args.cmd == "digest":
        sha = hashlib.sha256()
        for path in args.files:
            sha.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        print(sha.hexdigest())
        return 0
    if args.cmd == "freeze":
        pins = frozen(args.venv)
        header = "".join("# %s\n" % line if line else "#\n" for line in args.header.splitlines())
        body = "".join("%s==%s\n" % (name, version) for name, version in sorted(pins.items()))
        args.lock.write_text(header + body)
        print("pins: wrote %d pins to %s" % (len(pins), args.lock))
        return 0
    problems = differences(frozen(args.venv), parse(args.lock.read_text().splitlines()), args.allow, args.subset)
    if problems:
        print("pins: %s does not match %s:" % (args.venv, args.lock), file=sys.stderr)
        for problem in problems:
            print("  " + problem, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
