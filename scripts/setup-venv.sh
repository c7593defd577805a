#!/usr/bin/env bash
# Create or refresh the project virtualenv under .venv/ from the pinned
# requirements: requirements/dev.txt names what the project uses, and
# requirements/dev.lock pins the whole closure (transitive dependencies too), so a
# fresh machine installs exactly what CI tested. Installs nothing when the venv
# already matches both files; otherwise builds it anew and checks `pip freeze`
# against the lock (scripts/pins.py).
set -euo pipefail
cd "$(dirname "$0")/.."
REQ=requirements/dev.txt
LOCK=requirements/dev.lock
STAMP=.venv/.requirements.sha256
PY=${PYTHON:-python3}
want=$("$PY" scripts/pins.py digest "$REQ" "$LOCK")

if [ -x .venv/bin/python ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  echo "setup: .venv is up to date with $REQ and $LOCK (nothing to install)"
else
  if ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
    echo "setup: $PY is $("$PY" --version 2>&1); the controller needs Python 3.11 or newer" >&2
    exit 1
  fi
  # A venv built from other pins may hold packages the lock no longer names: start clean.
  if [ -e .venv ]; then
    echo "setup: .venv was built from other pins; rebuilding it"
    rm -rf .venv
  fi
  echo "setup: creating .venv with $("$PY" --version 2>&1)"
  "$PY" -m venv .venv
  echo "setup: installing pinned packages from $REQ (closure pinned by $LOCK) into .venv:"
  sed -n 's/^\([A-Za-z0-9_.\[\]-]*==[^ ]*\).*/  \1/p' "$REQ"
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -r "$REQ" -c "$LOCK"
  "$PY" scripts/pins.py check .venv "$LOCK"
  echo "$want" > "$STAMP"
  echo "setup: .venv ready ($(grep -c '==' "$LOCK") packages, as $LOCK pins them)"
fi

# The checkout is the collection: ansible_collections/gpufleet/sglang -> repo root.
mkdir -p .collections/ansible_collections/gpufleet
if [ "$(readlink .collections/ansible_collections/gpufleet/sglang 2>/dev/null)" != "../../.." ]; then
  ln -sfn ../../.. .collections/ansible_collections/gpufleet/sglang
  echo "setup: linked .collections/ansible_collections/gpufleet/sglang -> checkout"
fi
