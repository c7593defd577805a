#!/usr/bin/env bash
# One leg of the controller matrix: the collection under another ansible-core
# than .venv's.
#
#   scripts/matrix-controller.sh VERSION STEP
#
#   VERSION  2.17, 2.18, 2.20, 2.21: requirements/core-VERSION.txt pins the
#            exact patch release. (The 2.19 leg is .venv itself: `make test`'s
#            unit, integration and sanity stages already run everything there.)
#   STEP     venv      create or reuse the leg's virtualenv (only)
#            unit      tests/unit (pytest-xdist, like `make unit`, no coverage
#                      floor: coverage is the 2.19 leg's job)
#            sanity    every ansible-test sanity test of that ansible-core,
#                      offline, on the leg's Python, zero findings, no ignore file
#            redeploy  the incident redeploy on a simulated node:
#                      tests/integration/test_redeploy_playbook.py::
#                      test_happy_path_replaces_the_incident_server, with the
#                      leg's ansible-playbook (tests/matrix/matrix_controller.py)
#            lock      resolve the leg's pins again (requirements/dev.lock, less
#                      ansible-core, as constraints) and write
#                      requirements/core-VERSION.lock with scripts/pins.py freeze
#
# Where a leg runs:
#   - on this machine's Python 3.11 (2.17, 2.18): the virtualenv is
#     .cache/matrix/core-VERSION, rebuilt only when its pins or lock change;
#   - in a container (2.20 and later need Python 3.12+): requirements/core-
#     VERSION.txt names a Debian suite ("# container: trixie", Python 3.13). The
#     leg's image is localhost/gpufleet-core-VERSION:<hash>, FROM the suite's
#     debootstrapped base (scripts/build-image.sh --suite SUITE --base) plus
#     tests/matrix/controller/Containerfile.tools (localhost/gpufleet-
#     controller-SUITE:<hash>) and the virtualenv /opt/core-VERSION
#     (Containerfile.core); the tags are hashes of their inputs, so a warm leg
#     builds nothing. The script runs itself again inside a throw-away
#     container of that image (tini as PID 1) with the checkout bind-mounted at
#     the same path (.venv read-only: it is this machine's), and no network for
#     unit and redeploy (loopback only). The sanity leg has the network
#     (ansible-test installs its test requirements from PyPI; the image's trust
#     store is this machine's CA bundle, copied in at build time) and keeps ansible-test's
#     virtualenvs in a podman volume named after the image
#     (gpufleet-core-VERSION-ansible-test-<hash>), so only its first run
#     installs them.
#
# The virtualenv holds that ansible-core and the test tools at the versions
# requirements/dev.txt pins (pytest, pytest-xdist, pyyaml, jinja2,
# ansible-runner), constrained by and checked against requirements/
# core-VERSION.lock (scripts/pins.py). pytest steps write JUnit XML to
# tests/output/core-VERSION-STEP.xml (scripts/run-tests.py counts the cases
# from it).
set -euo pipefail
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."
REPO=$PWD

say() { printf 'matrix-controller: %s\n' "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

[[ $# -eq 2 ]] || die "usage: scripts/matrix-controller.sh VERSION venv|unit|sanity|redeploy|lock"
VERSION=$1
STEP=$2
REQ=requirements/core-$VERSION.txt
LOCK=requirements/core-$VERSION.lock
[[ -f $REQ ]] || die "no $REQ (known: $(cd requirements && printf "%s " core-*.txt))"
CORE=$(sed -n 's/^ansible-core==\([0-9.]*\).*/\1/p' "$REQ")
[[ $CORE == "$VERSION".* ]] || die "$REQ must pin ansible-core==$VERSION.<patch> (found '${CORE:-nothing}')"
# A leg whose ansible-core needs a newer Python than this machine's runs in a container of that suite.
SUITE=$(sed -n 's/^# container: *\([a-z][a-z0-9-]*\) *$/\1/p' "$REQ" | head -n 1)
IN_CONTAINER=${GPUFLEET_MATRIX_IN_CONTAINER:-0}
if [[ -n $SUITE ]]; then VENV=/opt/core-$VERSION; else VENV=$REPO/.cache/matrix/core-$VERSION; fi
TOOLS=(pytest pytest-xdist pyyaml jinja2 ansible-runner)
OUT=$REPO/tests/output
CONTAINER_DIR=tests/matrix/controller
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
BUILD_DIR=${GPUFLEET_BUILD_DIR:-/var/tmp}
export CONTAINERS_CONF=${CONTAINERS_CONF:-$REPO/molecule/containers.conf}
mkdir -p "$OUT"

pins() {
    local t line
    cat "$REQ"
    for t in "${TOOLS[@]}"; do
        line=$(grep -iE "^${t}==" requirements/dev.txt) || die "requirements/dev.txt pins no $t"
        printf '%s\n' "$line"
    done
}

stamp_of_pins() { (pins; cat "$LOCK") | sha256sum | cut -d' ' -f1; }

# Everything the EXIT trap must undo (a temporary directory, a container by its exact name).
CLEANUP=()
cleanup() {
    local item
    for item in "${CLEANUP[@]}"; do
        case $item in
            container:*) podman rm -f --time 0 "${item#container:}" >/dev/null 2>&1 || true ;;
            *) rm -rf "$item" ;;
        esac
    done
}
trap cleanup EXIT

# ------------------------------------------------------------ virtualenv
ensure_venv() {
    local want stamp=$VENV/.requirements.sha256 py=${PYTHON:-python3}
    want=$(stamp_of_pins)
    if [[ -n $SUITE ]]; then
        # Inside the leg's container: the image's virtualenv, built from these very files (its tag says so).
        [[ $IN_CONTAINER == 1 ]] || die "internal: ensure_venv of a container leg outside its container"
        [[ -f $stamp && "$(cat "$stamp")" == "$want" ]] || die "$VENV in this image was built from other pins than $REQ + $LOCK"
        python3 scripts/pins.py check "$VENV" "$LOCK" || die "$VENV does not match $LOCK"
        say "ansible-core $CORE in $VENV ($("$VENV/bin/python" --version 2>&1), Debian $(cat /etc/debian_version))"
        return 0
    fi
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

# ------------------------------------------------------------ container legs: the images
TOOLS_IMAGE=""
IMAGE=""

build_from() {  # build_from IMAGE CONTEXT BUILD-ARG...: podman build, the log's tail on failure
    local image=$1 ctx=$2; shift 2
    if ! podman build --pull=never --layers=false "$@" -t "$image" "$ctx" >"$ctx.log" 2>&1; then
        tail -n 30 "$ctx.log" >&2
        die "podman build of $image failed (log above)"
    fi
}

ensure_tools_image() {
    local base hash ctx
    command -v podman >/dev/null 2>&1 || die "podman is not installed; run scripts/install-system-deps.sh (as root)"
    [[ -f $CA_BUNDLE ]] || die "no CA bundle at $CA_BUNDLE (the image's pip steps need it)"
    base=$(scripts/build-image.sh --suite "$SUITE" --base) || die "the $SUITE base image did not build"
    hash=$({ printf 'base %s\n' "$base"; sha256sum < "$CONTAINER_DIR/Containerfile.tools"; sha256sum < "$CA_BUNDLE"; } \
           | sha256sum | cut -c1-16)
    TOOLS_IMAGE=localhost/gpufleet-controller-$SUITE:$hash
    if podman image exists "$TOOLS_IMAGE"; then say "reusing $TOOLS_IMAGE"; return 0; fi
    ctx=$(mktemp -d "$BUILD_DIR/gpufleet-controller.XXXXXX")
    CLEANUP+=("$ctx" "$ctx.log")
    cp "$CONTAINER_DIR/Containerfile.tools" "$ctx/Containerfile"
    cp "$CA_BUNDLE" "$ctx/ca.crt"
    say "podman build FROM $base -> $TOOLS_IMAGE ..."
    build_from "$TOOLS_IMAGE" "$ctx" --build-arg "BASE_IMAGE=$base"
}

# sglang-router as requirements/dev.txt pins it: the router unit tests' 0.3.x (in .venv on the host).
router_pin() { grep -iE '^sglang-router==' requirements/dev.txt || die "requirements/dev.txt pins no sglang-router"; }

volume_of() { printf 'gpufleet-core-%s-ansible-test-%s' "$VERSION" "${1##*:}"; }

ensure_image() {
    local want hash ctx repo t0=$SECONDS
    # One build at a time (two legs may start together; the image store is shared).
    exec 8>"$BUILD_DIR/gpufleet-matrix-controller.lock"
    flock 8
    ensure_tools_image
    want=$(stamp_of_pins)
    hash=$({ printf 'tools %s\nstamp %s\n' "$TOOLS_IMAGE" "$want"; sha256sum < "$CONTAINER_DIR/Containerfile.core"
             sha256sum < scripts/pins.py; sha256sum < requirements/smg.txt; sha256sum < requirements/dev.lock
             router_pin; } | sha256sum | cut -c1-16)
    repo=localhost/gpufleet-core-$VERSION
    IMAGE=$repo:$hash
    if podman image exists "$IMAGE"; then
        say "reusing $IMAGE"
    else
        ctx=$(mktemp -d "$BUILD_DIR/gpufleet-core.XXXXXX")
        CLEANUP+=("$ctx" "$ctx.log")
        cp "$CONTAINER_DIR/Containerfile.core" "$ctx/Containerfile"
        pins > "$ctx/pins.txt"
        cp "$LOCK" "$ctx/core.lock"
        cp scripts/pins.py requirements/smg.txt requirements/dev.lock "$ctx/"
        router_pin > "$ctx/router.txt"
        say "podman build FROM $TOOLS_IMAGE -> $IMAGE: $(pins | grep -v '^#' | tr '\n' ' ')"
        build_from "$IMAGE" "$ctx" --build-arg "TOOLS_IMAGE=$TOOLS_IMAGE" --build-arg "VERSION=$VERSION" \
            --build-arg "STAMP=$want"
        say "built $IMAGE in $((SECONDS - t0)) s"
        # The leg's older images and their ansible-test volumes go, then the older controller images that no
        # leg's image is built on any more.
        prune_older "$repo" "$IMAGE" volumes
        prune_older "${TOOLS_IMAGE%:*}" "$TOOLS_IMAGE"
    fi
    flock -u 8
}

prune_older() {  # prune_older REPOSITORY KEEP [volumes]: remove the other tags that no container uses
    local repo=$1 keep=$2 img in_use
    in_use=$(podman ps -a --format '{{.Image}}' | sort -u)
    while read -r img; do
        [[ -z $img || $img == "$keep" ]] && continue
        if grep -qxF "$img" <<<"$in_use"; then say "keeping $img (used by a container)"; continue; fi
        # An image that another image is built on stays (podman refuses); it goes with the last of those.
        if podman rmi "$img" >/dev/null 2>&1; then say "removed the older $img"; else continue; fi
        if [[ ${3:-} == volumes ]]; then podman volume rm "$(volume_of "$img")" >/dev/null 2>&1 || true; fi
    done < <(podman images --format '{{.Repository}}:{{.Tag}}' | grep -F "$repo:" || true)
}

# Run this script's STEP again inside a throw-away container of the leg's image (extra podman options after it).
in_container() {
    local step=$1 name common; shift
    local mounts=(-v "$REPO:$REPO")
    # .venv is this machine's (its interpreter is not in the image): read-only, so that nothing replaces it.
    [[ -d $REPO/.venv ]] && mounts+=(-v "$REPO/.venv:$REPO/.venv:ro")
    # A git worktree keeps its repository elsewhere; the tests list the checkout's files with git.
    common=$(git rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)
    if [[ -n $common && -d $common && $common != "$REPO"/* ]]; then mounts+=(-v "$common:$common:ro"); fi
    name=gpufleet-core-$VERSION-$step-$$
    CLEANUP+=("container:$name")
    say "ansible-core $CORE: $step in a container of $IMAGE"
    podman run --rm --name "$name" --label gpufleet.matrix=controller "${mounts[@]}" "$@" -w "$REPO" \
        -e GPUFLEET_MATRIX_IN_CONTAINER=1 -e GPUFLEET_SMG_VENV=/opt/smg-venv -e GPUFLEET_SGLANG_ROUTER_BIN=/opt/sglang-router/bin \
        ${GPUFLEET_TEST_WORKERS:+-e "GPUFLEET_TEST_WORKERS=$GPUFLEET_TEST_WORKERS"} \
        "$IMAGE" tini -g -- bash scripts/matrix-controller.sh "$VERSION" "$step"
}

# ------------------------------------------------------------ the legs
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

# Four pytest-xdist workers, also on 2 cores: the unit suite mostly waits on the processes it starts (simulated
# servers, nvidia-smi, ansible-doc). Measured on this 2-core machine (ansible-core 2.21 leg): 2 workers 130-160 s,
# 4 workers 80 s (the CPUs 55 % busy), 6 workers 64 s (73 % busy). GPUFLEET_TEST_WORKERS overrides it.
workers() { printf '%s' "${GPUFLEET_TEST_WORKERS:-4}"; }

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

# As scripts/sanity.sh does for .venv's ansible-core: ansible-test wants a clean copy laid out as
# ansible_collections/gpufleet/sglang with a git file list (made on the host: a worktree's git
# repository may be elsewhere) ...
SANITY_WORK=""
sanity_copy() {
    local dest
    SANITY_WORK=$(mktemp -d)
    CLEANUP+=("$SANITY_WORK")
    dest=$SANITY_WORK/ansible_collections/gpufleet/sglang
    mkdir -p "$dest"
    git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
        [[ -e $f ]] || continue
        mkdir -p "$dest/$(dirname "$f")"
        cp -p "$f" "$dest/$f"
    done
    (cd "$dest" && git init -q && git add -A && git -c user.name=sanity -c user.email=sanity@localhost commit -qm sanity)
}

# ... and a get-pip.py it cannot download here (served from the cache path it checks first, with this
# ansible-test's pip pin); then every sanity test on the leg's Python.
sanity_run() {
    local dest=$1 pip_version cache py
    pip_version=$("$VENV/bin/python" - <<'PY'
import re, inspect
from ansible_test._internal import python_requirements as pr
print(re.search(r"pip='([^']+)'", inspect.getsource(pr.get_venv_packages)).group(1))
PY
)
    cache=$HOME/.ansible/test/cache/get_pip_${pip_version//./_}.py
    mkdir -p "$(dirname "$cache")"
    cp scripts/sanity/get_pip_offline.py "$cache"
    py=$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    say "ansible-core $CORE: ansible-test sanity --local --python $py --requirements"
    (cd "$dest" && "$VENV/bin/ansible-test" sanity --local --python "$py" --requirements --color no)
}

# The lock: the leg's pins resolved with requirements/dev.lock (less its ansible-core) as constraints, frozen.
make_lock() {
    local tmp header
    tmp=$(mktemp -d "$BUILD_DIR/gpufleet-lock.XXXXXX")
    CLEANUP+=("$tmp")
    pins > "$tmp/pins.txt"
    grep -v '^ansible-core==' requirements/dev.lock > "$tmp/constraints.txt"
    header="The whole closure of the ansible-core $VERSION matrix venv ($VENV${SUITE:+ in the Debian $SUITE image of the leg}:
$REQ plus the test tools that requirements/dev.txt pins), resolved with requirements/dev.lock
(its other packages) as constraints. scripts/matrix-controller.sh installs with -c this file and checks
pip freeze against it (scripts/pins.py); scripts/matrix-controller.sh $VERSION lock writes it again."
    printf '%s\n' "$header" > "$tmp/header.txt"
    if [[ -n $SUITE ]]; then
        ensure_tools_image
        say "resolving $(pins | grep -v '^#' | tr '\n' ' ') in $TOOLS_IMAGE"
        podman run --rm -v "$REPO:$REPO" -v "$tmp:$tmp" -w "$REPO" \
            "$TOOLS_IMAGE" bash -ec "python3 -m venv $tmp/venv
                $tmp/venv/bin/python -m pip install --quiet --disable-pip-version-check -r $tmp/pins.txt -c $tmp/constraints.txt
                python3 scripts/pins.py freeze $tmp/venv $LOCK --header \"\$(cat $tmp/header.txt)\""
    else
        say "resolving $(pins | grep -v '^#' | tr '\n' ' ') with $(python3 --version)"
        python3 -m venv "$tmp/venv"
        "$tmp/venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$tmp/pins.txt" -c "$tmp/constraints.txt"
        python3 scripts/pins.py freeze "$tmp/venv" "$LOCK" --header "$header"
    fi
}

case $STEP in
    venv|unit|sanity|redeploy|lock) ;;
    *) die "unknown step '$STEP' (venv, unit, sanity, redeploy, lock)" ;;
esac

if [[ $STEP == lock ]]; then
    make_lock
elif [[ -n $SUITE && $IN_CONTAINER != 1 ]]; then
    # The host side of a container leg: the image, then the step inside a container of it.
    ensure_image
    case $STEP in
        venv) printf '%s\n' "$IMAGE" ;;
        unit|redeploy) in_container "$STEP" --network=none ;;
        sanity)
            sanity_copy
            in_container sanity -v "$SANITY_WORK:$SANITY_WORK" -e "GPUFLEET_SANITY_COPY=$SANITY_WORK" \
                -v "$(volume_of "$IMAGE"):/root/.ansible/test"
            ;;
    esac
else
    case $STEP in
        venv) ensure_venv ;;
        unit) ensure_venv; leg_env; run_unit ;;
        redeploy) ensure_venv; leg_env; run_redeploy ;;
        sanity)
            ensure_venv; leg_env
            if [[ $IN_CONTAINER != 1 ]]; then sanity_copy; fi
            sanity_run "${GPUFLEET_SANITY_COPY:-$SANITY_WORK}/ansible_collections/gpufleet/sglang"
            ;;
    esac
fi
