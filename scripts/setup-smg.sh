#!/usr/bin/env bash
# Install smg (Shepherd Model Gateway) 1.x, pinned in requirements/smg.txt, into
# its own virtualenv (default .cache/smg-venv; GPUFLEET_SMG_VENV overrides it),
# and print the path of its `smg` command on stdout. smg 1.x and sglang-router
# 0.3.2 (in .venv) both install a `smg` command, so they cannot share a venv.
# Installs nothing when the venv already matches the pins. Concurrent callers
# (two pytest workers) are serialised with flock; a half-built venv (no stamp)
# is rebuilt. Progress goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
REQ=requirements/smg.txt
VENV=${GPUFLEET_SMG_VENV:-.cache/smg-venv}
STAMP=$VENV/.requirements.sha256
want=$(sha256sum "$REQ" | cut -d' ' -f1)

up_to_date() {
  [ -x "$VENV/bin/smg" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]
}

if ! up_to_date; then
  mkdir -p "$(dirname "$VENV")"
  exec 9>"$VENV.lock"
  flock 9
  if ! up_to_date; then
    PY=${PYTHON:-python3}
    if ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 9) else 1)'; then
      echo "setup-smg: $PY is $("$PY" --version 2>&1); smg needs Python 3.9 or newer" >&2
      exit 1
    fi
    rm -rf "$VENV"
    echo "setup-smg: installing $(grep -m1 '^smg==' "$REQ") into $VENV" >&2
    "$PY" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$REQ" -c "$REQ" >&2
    # The file is the whole closure: a package it does not pin fails here (scripts/pins.py).
    "$PY" scripts/pins.py check "$VENV" "$REQ" >&2
    "$VENV/bin/smg" --version >&2
    echo "$want" > "$STAMP"
  fi
fi
case $VENV in /*) echo "$VENV/bin/smg" ;; *) echo "$PWD/$VENV/bin/smg" ;; esac
