#!/usr/bin/env bash
# ansible-test sanity, offline, against a clean copy of the collection laid out
# as ansible_collections/gpufleet/sglang (ansible-test reads the file list from
# git). Uses its own virtualenv (.cache/sanity-venv) so that the sanity
# requirements never change the pins of .venv. Zero findings are required and
# there is no tests/sanity/ignore-*.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
CORE=$(sed -n 's/^ansible-core==//p' requirements/dev.txt)
SVENV=$REPO/.cache/sanity-venv

LOCKSUM=$(sha256sum requirements/dev.lock | cut -d' ' -f1)
if [ ! -x "$SVENV/bin/ansible-test" ] || [ "$(cat "$SVENV/.lock.sha256" 2>/dev/null)" != "$LOCKSUM" ] \
   || ! "$SVENV/bin/python" -c "import ansible, sys; sys.exit(ansible.__version__ != '$CORE')" 2>/dev/null; then
  echo "sanity: creating $SVENV with ansible-core==$CORE"
  rm -rf "$SVENV"
  python3 -m venv "$SVENV"
  # ansible-core's own dependencies at the versions CI tested (ansible-test pins its sanity tools itself).
  "$SVENV/bin/python" -m pip install --quiet --disable-pip-version-check -c requirements/dev.lock "ansible-core==$CORE"
  echo "$LOCKSUM" > "$SVENV/.lock.sha256"
fi

# ansible-test bootstraps pip in each test venv with get-pip.py, downloaded from
# a host this machine cannot reach; serve it from the cache path it checks first.
PIP_VERSION=$("$SVENV/bin/python" - <<'PY'
import re, inspect
from ansible_test._internal import python_requirements as pr
print(re.search(r"pip='([^']+)'", inspect.getsource(pr.get_venv_packages)).group(1))
PY
)
CACHE=$HOME/.ansible/test/cache/get_pip_${PIP_VERSION//./_}.py
mkdir -p "$(dirname "$CACHE")"
cp scripts/sanity/get_pip_offline.py "$CACHE"

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
DEST=$WORK/ansible_collections/gpufleet/sglang
mkdir -p "$DEST"
# Tracked files plus untracked files that git does not ignore: what a commit would hold.
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
  [ -e "$f" ] || continue
  mkdir -p "$DEST/$(dirname "$f")"
  cp -p "$f" "$DEST/$f"
done
(cd "$DEST" && git init -q && git add -A && git -c user.name=sanity -c user.email=sanity@localhost commit -qm sanity)

cd "$DEST"
echo "sanity: ansible-test sanity --local --python 3.11 --requirements (ansible-core $CORE)"
"$SVENV/bin/ansible-test" sanity --local --python 3.11 --requirements --color no "$@"
