#!/usr/bin/env bash
# Create or refresh the project virtualenv under .venv/ from the pinned
# requirements. Installs nothing when the venv already matches the pins.
set -euo pipefail
cd "$(dirname "$0")/.."
REQ=requirements/dev.txt
STAMP=.venv/.requirements.sha256
want=$(sha256sum "$REQ" | cut -d' ' -f1)

if [ -x .venv/bin/python ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  echo "setup: .venv is up to date with $REQ (nothing to install)"
else
  PY=${PYTHON:-python3}
  if ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
    echo "setup: $PY is $("$PY" --version 2>&1); the controller needs Python 3.11 or newer" >&2
    exit 1
  fi
  if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv with $("$PY" --version 2>&1)"
    "$PY" -m venv .venv
  fi
  echo "setup: installing pinned packages from $REQ into .venv:"
  sed -n 's/^\([A-Za-z0-9_.\[\]-]*==[^ ]*\).*/  \1/p' "$REQ"
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -r "$REQ"
  echo "$want" > "$STAMP"
  echo "setup: .venv ready"
fi

# The checkout is the collection: ansible_collections/gpufleet/sglang -> repo root.
mkdir -p .collections/ansible_collections/gpufleet
if [ "$(readlink .collections/ansible_collections/gpufleet/sglang 2>/dev/null)" != "../../.." ]; then
  ln -sfn ../../.. .collections/ansible_collections/gpufleet/sglang
  echo "setup: linked .collections/ansible_collections/gpufleet/sglang -> checkout"
fi
