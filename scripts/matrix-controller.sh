#!/usr/bin/env bash
# One leg of the controller matrix: the collection under another ansible-core
# than .venv's, on this machine's Python 3.11.
#
#   scripts/matrix-controller.sh VERSION STEP
#
#   VERSION  2.17 or 2.18: requirements/core-VERSION.txt pins the exact patch
#            release. (The 2.19 leg is .venv itself: `make test`'s unit,
#            integration and sanity stages already run everything there.)
#   STEP     venv      create or reuse .cache/matrix/core-VERSION (only)
#            unit      tests/unit (pytest-xdist, like `make unit`, no coverage
#                      floor: coverage is the 2.19 leg's job)
#            sanity    every ansible-test sanity test of that ansible-core,
#                      offline, --python 3.11, zero findings, no ignore file
#            redeploy  the incident redeploy on a simulated node:
#                      tests/integration/test_redeploy_playbook.py::
#                      test_happy_path_replaces_the_incident_server, with the
#                      leg's ansible-playbook (tests/matrix/matrix_controller.py)
#
# The virtualenv holds that ansible-core and the test tools at the versions
# requirements/dev.txt pins (pytest, pytest-xdist, pyyaml, jinja2,
# ansible-runner); it is rebuilt only when either file changes. pytest steps
# write JUnit XML to tests/output/core-VERSION-STEP.xml (scripts/run-tests.py
# counts the cases from it).
set -euo pipefail
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."
REPO=$PWD

say() { printf 'matrix-controller: %s\n' "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

[[ $# -eq 2 ]] || die "usage: scripts/matrix-controller.sh VERSION venv|unit|sanity|redeploy"
VERSION=$1
STEP=$2
REQ=requirements/core-$VERSION.txt
LOCK=requirements/core-$VERSION.lock
[[ -f $REQ ]] || die "no $REQ (known: $(cd requirements && printf "%s " core-*.txt))"
CORE=$(sed -n 's/^ansible-core==\([0-9.]*\).*/\1/p' "$REQ")
[[ $CORE == "$VERSION".* ]] || die "$REQ must pin ansible-core==$VERSION.<patch> (found '${CORE:-nothing}')"
VENV=$REPO/.cache/matrix/core-$VERSION
TOOLS=(pytest pytest-xdist pyyaml jinja2 ansible-runner)
OUT=$REPO/tests/output
mkdir -p "$OUT"

pins() {
    local t line
    cat "$REQ"
    for t in "${TOOLS[@]}"; do
        line=$(grep -iE "^${t}==" requirements/dev.txt) || die "requirements/dev.txt pins no $t"
        printf '%s\n' "$line"
    done
}

ensure_venv() {
    local want stamp=$VENV/.requirements.sha256 py=${PYTHON:-python3}
    want=$( (pins; cat "$LOCK") | sha256sum | cut -d' ' -f1)
    if [[ -x $VENV/bin/python && -f $stamp && "$(cat "$stamp")" == "$want" ]]; then
        say "reusing $VENV (ansible-core $CORE)"
        return 0
    fi
    "$py" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' \
        || die "$py is $("$py" --version 2>&1); the matrix runs on the controller's Python 3.11"
    say "creating $VENV: $(pins | grep -v '^#' | tr '\n' ' ')"
    rm -rf "$VENV"
    "$py" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r <(pins) -c "$LOCK"
    "$py" scripts/pins.py check "$VENV" "$LOCK" || die "$VENV does not match $LOCK"
    "$VENV/bin/python" -c "import ansible.release as r, sys; sys.exit(r.__version__ != '$CORE')" \
        || die "$VENV does not hold ansible-core $CORE after the install"
    echo "$want" > "$stamp"
}

# What a leg's commands see: its own tools first, the checkout as the collection.
leg_env() {
    export PATH="$VENV/bin:$PATH"
    export ANSIBLE_COLLECTIONS_PATH=$REPO/.collections
    export ANSIBLE_CONFIG=$REPO/ansible.cfg
    export PYTHONDONTWRITEBYTECODE=1
    export GPUFLEET_MATRIX_CORE=$VERSION
    export PYTHONPATH=$REPO/tests/matrix${PYTHONPATH:+:$PYTHONPATH}
    link=$REPO/.collections/ansible_collections/gpufleet/sglang
    if [[ ! -e $link ]]; then mkdir -p "$(dirname "$link")"; ln -sfn ../../.. "$link"; fi
}

workers() { printf '%s' "${GPUFLEET_TEST_WORKERS:-$(n=$(nproc); ((n < 2)) && n=2; ((n > 4)) && n=4; echo "$n")}"; }

run_unit() {
    local w xdist=()
    w=$(workers)
    [[ $w == 0 || $w == 1 ]] || xdist=(-n "$w" --dist loadfile)
    say "ansible-core $CORE: pytest tests/unit ${xdist[*]}"
    "$VENV/bin/python" -m pytest -p matrix_controller "--junitxml=$OUT/core-$VERSION-unit.xml" "${xdist[@]}" tests/unit
}

run_redeploy() {
    say "ansible-core $CORE: the incident redeploy (test_redeploy_playbook.py::test_happy_path_replaces_the_incident_server)"
    "$VENV/bin/python" -m pytest -p matrix_controller "--junitxml=$OUT/core-$VERSION-redeploy.xml" \
        "tests/integration/test_redeploy_playbook.py::test_happy_path_replaces_the_incident_server"
}

run_sanity() {
    # As scripts/sanity.sh does for .venv's ansible-core: ansible-test wants a
    # clean copy laid out as ansible_collections/gpufleet/sglang with a git
    # file list, and a get-pip.py it cannot download here (served from the
    # cache path it checks first, with this ansible-test's pip pin).
    local pip_version cache work dest
    pip_version=$("$VENV/bin/python" - <<'PY'
import re, inspect
from ansible_test._internal import python_requirements as pr
print(re.search(r"pip='([^']+)'", inspect.getsource(pr.get_venv_packages)).group(1))
PY
)
    cache=$HOME/.ansible/test/cache/get_pip_${pip_version//./_}.py
    mkdir -p "$(dirname "$cache")"
    cp scripts/sanity/get_pip_offline.py "$cache"
    work=$(mktemp -d)
    # shellcheck disable=SC2064 # expand $work now
    trap "rm -rf '$work'" EXIT
    dest=$work/ansible_collections/gpufleet/sglang
    mkdir -p "$dest"
    git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
        [[ -e $f ]] || continue
        mkdir -p "$dest/$(dirname "$f")"
        cp -p "$f" "$dest/$f"
    done
    (cd "$dest" && git init -q && git add -A && git -c user.name=sanity -c user.email=sanity@localhost commit -qm sanity)
    say "ansible-core $CORE: ansible-test sanity --local --python 3.11 --requirements"
    (cd "$dest" && "$VENV/bin/ansible-test" sanity --local --python 3.11 --requirements --color no)
}

case $STEP in
    venv) ensure_venv ;;
    unit) ensure_venv; leg_env; run_unit ;;
    sanity) ensure_venv; leg_env; run_sanity ;;
    redeploy) ensure_venv; leg_env; run_redeploy ;;
    *) die "unknown step '$STEP' (venv, unit, sanity, redeploy)" ;;
esac
