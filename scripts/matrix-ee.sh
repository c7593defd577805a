#!/usr/bin/env bash
# Build, or reuse when present, the execution environment of
# execution-environment.yml with ansible-builder, on a local base image
# instead of the registry's (none is reachable here). Prints progress on
# stderr and the EE image name on stdout:
#
#   ee=$(scripts/matrix-ee.sh)        # localhost/gpufleet-sglang-ee:<hash>
#
# Steps:
#   1. the Debian bookworm base of the node image (scripts/build-image.sh --base);
#   2. localhost/gpufleet-ee-base:<hash>: that base plus a Python virtualenv
#      for ansible-builder's steps and this machine's CA bundle
#      (tests/matrix/ee/Containerfile.base says why);
#   3. `make build` (the Galaxy tarball that execution-environment.yml installs);
#   4. `ansible-builder build -f execution-environment.yml` with
#      EE_BASE_IMAGE=<step 2>, PKGMGR=/usr/bin/apt-get (it installs the system
#      packages the collection declares in meta/ee-bindep.txt, openssh-client,
#      from the Debian mirror) and PYCMD=/opt/ee/bin/python3.11. The build's pip
#      steps fetch ansible-core, ansible-runner, bindep and dumb-init from PyPI.
# Tags are hashes of their inputs (base tag, Containerfile, CA bundle;
# the tarball's member names and contents, not its timestamps;
# execution-environment.yml, ansible-builder version), so a change rebuilds
# exactly what it affects. After a build, the older gpufleet-sglang-ee tags and
# the build's dangling stage images go (ansible-builder --prune-images), except
# what a container still uses. tests/matrix/test_execution_environment.py runs
# a redeploy inside the result.
#
# Options: --force (rebuild steps 2 and 4), --print (print the EE name the
# current inputs would have; runs only steps 1 and 3, which reuse or are cheap).
# Environment: CONTAINERS_CONF (default molecule/containers.conf),
# GPUFLEET_BUILD_DIR (temporary contexts, default /var/tmp).
set -euo pipefail
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."
REPO=$PWD
export CONTAINERS_CONF="${CONTAINERS_CONF:-$REPO/molecule/containers.conf}"
BUILD_DIR="${GPUFLEET_BUILD_DIR:-/var/tmp}"
EE_BASE_REPO=localhost/gpufleet-ee-base
EE_REPO=localhost/gpufleet-sglang-ee
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt

say() { printf 'matrix-ee: %s\n' "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

force=0
mode=build
for arg in "$@"; do
    case "$arg" in
        --force) force=1 ;;
        --print) mode=print ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) die "unknown argument '$arg' (see --help)" ;;
    esac
done

BUILDER="$REPO/.venv/bin/ansible-builder"
[[ -x $BUILDER ]] || die "no $BUILDER: run make setup"
command -v podman >/dev/null 2>&1 || die "podman is not installed; run scripts/install-system-deps.sh (as root)"
[[ -f $CA_BUNDLE ]] || die "no CA bundle at $CA_BUNDLE (the build's pip steps need it)"
t_start=$SECONDS

# ------------------------------------------------------------ 1. base
base="$(scripts/build-image.sh --base)" || die "the base image did not build"

# ------------------------------------------------------------ 2. EE base
CF_BASE=tests/matrix/ee/Containerfile.base
ee_base_hash="$({ printf 'base %s\n' "$base"; sha256sum < "$CF_BASE"; sha256sum < "$CA_BUNDLE"; } | sha256sum | cut -c1-16)"
EE_BASE="$EE_BASE_REPO:$ee_base_hash"

# ------------------------------------------------------------ 3. tarball
make --no-print-directory build >&2 || die "make build failed"
tarball="$(sed -n 's/^  - src: \(.*\.tar\.gz\)$/\1/p' execution-environment.yml)"
[[ -n $tarball && -f $tarball ]] || die "execution-environment.yml names no tarball that make build wrote (${tarball:-none})"
# make build writes a new tarball every time (member mtimes): hash what it holds.
tar_content="$("$REPO/.venv/bin/python" - "$tarball" <<'PY'
import hashlib, sys, tarfile
digest = hashlib.sha256()
with tarfile.open(sys.argv[1]) as tar:
    for member in sorted(tar.getmembers(), key=lambda m: m.name):
        digest.update(("%s %o %s\n" % (member.name, member.mode, member.type.decode())).encode())
        if member.isfile():
            digest.update(hashlib.sha256(tar.extractfile(member).read()).digest())
print(digest.hexdigest())
PY
)" || die "could not read $tarball"
ee_hash="$({ printf 'ee-base %s\ntarball %s\n' "$EE_BASE" "$tar_content"; sha256sum < execution-environment.yml
             sha256sum < requirements/dev.lock; "$BUILDER" --version; } | sha256sum | cut -c1-16)"
EE="$EE_REPO:$ee_hash"
if [[ $mode == print ]]; then printf '%s\n' "$EE"; exit 0; fi

# One build at a time (the image store is shared with build-image.sh's builds).
exec 9>"$BUILD_DIR/gpufleet-matrix-ee.lock"
flock 9

if [[ $force -eq 0 ]] && podman image exists "$EE_BASE"; then
    say "reusing $EE_BASE"
else
    ctx="$(mktemp -d "$BUILD_DIR/gpufleet-ee-base.XXXXXX")"
    # shellcheck disable=SC2064 # expand $ctx now
    trap "rm -rf '$ctx'" EXIT
    cp "$CF_BASE" "$ctx/Containerfile"
    cp "$CA_BUNDLE" "$ctx/ca.crt"
    t0=$SECONDS
    say "podman build FROM $base -> $EE_BASE ..."
    if ! podman build --pull=never --layers=false --build-arg "BASE_IMAGE=$base" -t "$EE_BASE" "$ctx" >"$ctx.log" 2>&1; then
        tail -n 30 "$ctx.log" >&2; rm -f "$ctx.log"
        die "podman build of $EE_BASE failed (log above)"
    fi
    rm -rf "$ctx" "$ctx.log"; trap - EXIT
    say "EE base built in $((SECONDS - t0)) s"
fi

# ------------------------------------------------------------ 4. ansible-builder
if [[ $force -eq 0 ]] && podman image exists "$EE"; then
    say "reusing $EE"
else
    ctx="$(mktemp -d "$BUILD_DIR/gpufleet-ee-context.XXXXXX")"
    # shellcheck disable=SC2064 # expand $ctx now
    trap "rm -rf '$ctx'" EXIT
    t0=$SECONDS
    say "ansible-builder build -f execution-environment.yml (base $EE_BASE) -> $EE ..."
    if ! "$BUILDER" build -f execution-environment.yml -c "$ctx/context" -t "$EE" --container-runtime podman \
            --build-arg "EE_BASE_IMAGE=$EE_BASE" --build-arg PKGMGR=/usr/bin/apt-get \
            --build-arg PYCMD=/opt/ee/bin/python3.11 --prune-images -v 3 >"$ctx/build.log" 2>&1; then
        tail -n 40 "$ctx/build.log" >&2
        die "ansible-builder build failed (log above)"
    fi
    rm -rf "$ctx"; trap - EXIT
    say "EE built in $((SECONDS - t0)) s"
    in_use="$(podman ps -a --format '{{.Image}}' | sort -u)"
    while read -r img; do
        [[ -z "$img" || "$img" == "$EE" ]] && continue
        if grep -qxF "$img" <<<"$in_use"; then
            say "keeping $img (used by a container)"
        elif podman rmi "$img" >/dev/null 2>&1; then
            say "removed the older $img"
        fi
    done < <(podman images --format '{{.Repository}}:{{.Tag}}' | grep -F "$EE_REPO:" || true)
fi

say "ready: $EE in $((SECONDS - t_start)) s"
printf '%s\n' "$EE"
