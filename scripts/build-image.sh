#!/usr/bin/env bash
# Build, or reuse when present, the local podman image of the molecule
# container hosts. Prints progress on stderr and the image name on stdout:
#
#   image=$(scripts/build-image.sh)      # localhost/gpufleet-node:<hash>
#
# Two layers, so that a simulator change does not cost a debootstrap:
#   localhost/gpufleet-base:<hash>  debootstrap --variant=minbase of Debian
#       bookworm (or --suite) plus molecule/image/packages.txt, imported with
#       podman import;
#       hash of the recipe (the build_base function below), the package
#       list, suite and architecture.
#   localhost/gpufleet-node:<hash>  FROM the base, with simulator/ in
#       /opt/gpufleet-sim and the files of molecule/image/files/ (nvidia-smi
#       and gpusim wrappers in /usr/local/bin, a .pth file for python3);
#       hash of the base tag, molecule/image/Containerfile, files/ and every
#       file under simulator/ (names, modes and contents; caches excluded).
#   localhost/gpufleet-node-podman:<hash>  only with --podman: FROM the node
#       image, with podman, runc and conmon from the Debian mirror and
#       molecule/image/podman/files/ (/etc/containers: vfs, runc, the systemd
#       cgroup manager), for molecule/containerised; hash of the node tag and
#       every file under molecule/image/podman/.
#
# Options:
#   --suite S   Debian suite of the image (default bookworm, or
#               GPUFLEET_DEBIAN_SUITE). Another suite than bookworm gets its own
#               image names, localhost/gpufleet-base-S and gpufleet-node-S, so
#               that the node matrix (bullseye: Python 3.9, trixie: Python 3.13)
#               keeps one image per suite and --prune never removes another
#               suite's images.
#   --print     print the node image name and exit (nothing is built)
#   --base      build or reuse only the base image and print its name (the
#               execution environment's base: scripts/matrix-ee.sh)
#   --podman    also build or reuse the node image with podman inside and
#               print its name instead (needs the Debian mirror when built)
#   --force     rebuild both images even if they exist
#   --prune     afterwards remove other gpufleet-node/-base tags that no
#               container uses
#
# Environment:
#   CONTAINERS_CONF         defaults to molecule/containers.conf (runc, ulimits)
#   GPUFLEET_DEBIAN_MIRROR  mirror for debootstrap; default: the URIs: line of
#                           /etc/apt/sources.list.d/*.sources for the suite,
#                           else (a suite the machine does not use itself, such
#                           as bullseye on a bookworm machine) the URI of the
#                           machine's main Debian archive stanza, checked for
#                           dists/<suite>/Release before debootstrap runs
#   GPUFLEET_DEBIAN_SUITE   default bookworm
#   GPUFLEET_BUILD_DIR      where the root filesystem is assembled; needs a
#                           filesystem without nodev/noexec (default /var/tmp)
set -euo pipefail

SCRIPT_PATH="$(readlink -f "${BASH_SOURCE[0]}")"
REPO="$(cd "$(dirname "$SCRIPT_PATH")/.." && pwd)"
IMAGE_DIR="$REPO/molecule/image"
SIM_DIR="$REPO/simulator"
SUITE="${GPUFLEET_DEBIAN_SUITE:-bookworm}"
BUILD_DIR="${GPUFLEET_BUILD_DIR:-/var/tmp}"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$REPO/molecule/containers.conf}"

say() { printf 'build-image: %s\n' "$*" >&2; }
die() { printf 'build-image: ERROR: %s\n' "$*" >&2; exit 1; }

mode=build
force=0
prune=0
want_suite=0
for arg in "$@"; do
    if [[ $want_suite -eq 1 ]]; then SUITE="$arg"; want_suite=0; continue; fi
    case "$arg" in
        --suite) want_suite=1 ;;
        --suite=*) SUITE="${arg#--suite=}" ;;
        --print) mode=print ;;
        --base) mode=base ;;
        --podman) mode=podman ;;
        --force) force=1 ;;
        --prune) prune=1 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$SCRIPT_PATH"; exit 0 ;;
        *) die "unknown argument '$arg' (see --help)" ;;
    esac
done
[[ $want_suite -eq 0 ]] || die "--suite needs a suite name (e.g. bullseye)"
[[ "$SUITE" =~ ^[a-z][a-z0-9-]*$ ]] || die "bad suite name '$SUITE' (a Debian code name such as bookworm)"
# bookworm keeps the historical names; every other suite has its own repositories.
if [[ "$SUITE" == bookworm ]]; then name_suffix=""; else name_suffix="-$SUITE"; fi
BASE_REPO="localhost/gpufleet-base$name_suffix"
NODE_REPO="localhost/gpufleet-node$name_suffix"

# ---------------------------------------------------------------- inputs
# Files of a tree, sorted, without Python caches and editor droppings.
list_tree() {
    (cd "$1" && find . \( -name __pycache__ -o -name .pytest_cache -o -name .mypy_cache \) -prune \
        -o -type f ! -name '*.pyc' ! -name '*.pyo' ! -name '*~' ! -name '.*.swp' -print | LC_ALL=C sort)
}

# Hash of names, modes and contents of the files given relative to $1.
hash_tree_files() {
    local root="$1"; shift
    local f
    for f in "$@"; do
        printf '%s %s ' "$f" "$(stat -c %a "$root/$f")"
        sha256sum < "$root/$f" | cut -d' ' -f1
    done
}

[[ -f "$IMAGE_DIR/packages.txt" ]] || die "missing $IMAGE_DIR/packages.txt"
[[ -f "$IMAGE_DIR/Containerfile" ]] || die "missing $IMAGE_DIR/Containerfile"
[[ -d "$SIM_DIR" ]] || die "missing $SIM_DIR (the simulator)"

mapfile -t PACKAGES < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$IMAGE_DIR/packages.txt" | grep -v '^$')
[[ ${#PACKAGES[@]} -gt 0 ]] || die "no packages in $IMAGE_DIR/packages.txt"
ARCH="$(dpkg --print-architecture 2>/dev/null || uname -m)"

# ---------------------------------------------------------------- base
find_mirror() {
    if [[ -n "${GPUFLEET_DEBIAN_MIRROR:-}" ]]; then
        printf '%s\n' "$GPUFLEET_DEBIAN_MIRROR"; return 0
    fi
    local f uri
    # deb822 sources: the first URI of a "Types: deb" stanza listing the suite.
    for f in /etc/apt/sources.list.d/*.sources; do
        [[ -f "$f" ]] || continue
        uri="$(awk -v suite="$SUITE" '
            function flush() { if (deb && has && uri != "" && !done) { print uri; done = 1 }
                               deb = 0; has = 0; uri = "" }
            /^[[:space:]]*$/ { flush(); next }
            /^[[:space:]]*#/ { next }
            tolower($1) == "types:"  { for (i = 2; i <= NF; i++) if ($i == "deb") deb = 1 }
            tolower($1) == "uris:"   { uri = $2 }
            tolower($1) == "suites:" { for (i = 2; i <= NF; i++) if ($i == suite) has = 1 }
            END { flush() }' "$f")"
        if [[ -n "$uri" ]]; then printf '%s\n' "$uri"; return 0; fi
    done
    # One-line sources: "deb [options] URI SUITE COMPONENTS".
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [[ -f "$f" ]] || continue
        uri="$(awk -v suite="$SUITE" '$1 == "deb" {
                i = 2; if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
                if ($(i + 1) == suite) { print $i; exit } }' "$f")"
        if [[ -n "$uri" ]]; then printf '%s\n' "$uri"; return 0; fi
    done
    # The suite is not one this machine installs from: the main archive of a
    # deb822 stanza (one whose suites are plain code names, not -security,
    # -updates or -backports) carries every current Debian release.
    for f in /etc/apt/sources.list.d/*.sources; do
        [[ -f "$f" ]] || continue
        uri="$(awk '
            function flush() { if (deb && plain && uri != "" && !done) { print uri; done = 1 }
                               deb = 0; plain = 0; uri = "" }
            /^[[:space:]]*$/ { flush(); next }
            /^[[:space:]]*#/ { next }
            tolower($1) == "types:"  { for (i = 2; i <= NF; i++) if ($i == "deb") deb = 1 }
            tolower($1) == "uris:"   { uri = $2 }
            tolower($1) == "suites:" { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+$/) plain = 1 }
            END { flush() }' "$f")"
        if [[ -n "$uri" ]]; then
            say "suite $SUITE is not in the apt sources; trying the main archive stanza of $(basename "$f")"
            printf '%s\n' "$uri"; return 0
        fi
    done
    return 1
}

# debootstrap's own error for a suite the mirror lacks is a bare "Failed
# getting release file"; say which file, first.
check_suite_on_mirror() {
    local mirror="$1" url="${1%/}/dists/$SUITE/Release"
    case "$mirror" in
        http://*|https://*) ;;
        *) return 0 ;;  # file:// and the like: debootstrap reports it
    esac
    if ! wget -q --spider --tries=1 --timeout=20 "$url" 2>/dev/null; then
        die "the mirror has no suite '$SUITE' ($url is not reachable); set GPUFLEET_DEBIAN_MIRROR to a mirror that has it"
    fi
}

build_base() {
    command -v debootstrap >/dev/null 2>&1 || [[ -x /usr/sbin/debootstrap ]] \
        || die "debootstrap is not installed; run scripts/install-system-deps.sh (as root)"
    [[ $(id -u) -eq 0 ]] || die "debootstrap needs root to build $BASE_IMAGE"
    local mirror
    mirror="$(find_mirror)" \
        || die "no apt mirror for '$SUITE' in /etc/apt/sources.list.d/*.sources or sources.list; set GPUFLEET_DEBIAN_MIRROR"
    check_suite_on_mirror "$mirror"
    ROOTFS="$(mktemp -d "$BUILD_DIR/gpufleet-rootfs.XXXXXX")"
    trap 'cleanup_rootfs' EXIT
    local include
    include="$(IFS=,; printf '%s' "${PACKAGES[*]}")"
    say "debootstrap --variant=minbase --include=$include $SUITE (mirror from apt sources) ..."
    local t0=$SECONDS log="$ROOTFS.log"
    if ! PATH="/usr/sbin:/sbin:$PATH" debootstrap --variant=minbase --components=main \
            --include="$include" "$SUITE" "$ROOTFS" "$mirror" >"$log" 2>&1; then
        tail -n 30 "$log" >&2
        [[ -f "$ROOTFS/debootstrap/debootstrap.log" ]] && tail -n 30 "$ROOTFS/debootstrap/debootstrap.log" >&2
        die "debootstrap failed (log above; mirror $mirror)"
    fi
    say "debootstrap done in $((SECONDS - t0)) s"
    # Trim and make the image neutral: no package caches, no fixed machine id
    # (systemd makes a fresh one per container at boot).
    rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/cache/apt/*.bin \
        "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/log/*.log "$ROOTFS"/tmp/* "$ROOTFS"/root/.cache
    : > "$ROOTFS/etc/machine-id"
    rm -f "$ROOTFS/var/lib/dbus/machine-id"
    say "podman import -> $BASE_IMAGE ..."
    t0=$SECONDS
    tar --numeric-owner --xattrs -C "$ROOTFS" -c . \
        | podman import --quiet --change 'CMD ["/sbin/init"]' --change 'STOPSIGNAL SIGRTMIN+3' \
            --message "gpufleet base: debootstrap $SUITE minbase + ${PACKAGES[*]}" \
            - "$BASE_IMAGE" >/dev/null \
        || die "podman import of $BASE_IMAGE failed"
    say "import done in $((SECONDS - t0)) s"
    cleanup_rootfs
    trap - EXIT
}

cleanup_rootfs() {
    if [[ -n "${ROOTFS:-}" && -d "$ROOTFS" ]]; then
        # debootstrap may leave /proc or /sys mounted in the target on failure.
        local m
        for m in proc sys dev/pts dev; do
            if mountpoint -q "$ROOTFS/$m" 2>/dev/null; then
                umount -l "$ROOTFS/$m" 2>/dev/null || true
            fi
        done
        rm -rf --one-file-system "$ROOTFS" "$ROOTFS.log"
    fi
    ROOTFS=""
}

# ---------------------------------------------------------------- tags
base_hash="$(
    {
        printf 'suite %s arch %s\n' "$SUITE" "$ARCH"
        printf 'package %s\n' "${PACKAGES[@]}"
        # The recipe, as bash normalises it: comments and changes elsewhere
        # in this script do not force a new debootstrap.
        declare -f build_base
    } | sha256sum | cut -c1-16
)"
BASE_IMAGE="$BASE_REPO:$base_hash"

mapfile -t SIM_FILES < <(list_tree "$SIM_DIR")
mapfile -t IMG_FILES < <(list_tree "$IMAGE_DIR/files")
node_hash="$(
    {
        printf 'base %s\n' "$BASE_IMAGE"
        sha256sum < "$IMAGE_DIR/Containerfile" | cut -d' ' -f1
        printf 'files\n'; hash_tree_files "$IMAGE_DIR/files" "${IMG_FILES[@]}"
        printf 'simulator\n'; hash_tree_files "$SIM_DIR" "${SIM_FILES[@]}"
    } | sha256sum | cut -c1-16
)"
NODE_IMAGE="$NODE_REPO:$node_hash"

PODMAN_DIR="$IMAGE_DIR/podman"
PODMAN_REPO="localhost/gpufleet-node-podman$name_suffix"
if [[ $mode == podman ]]; then
    [[ -f "$PODMAN_DIR/Containerfile" ]] || die "missing $PODMAN_DIR/Containerfile"
    mapfile -t PODMAN_FILES < <(list_tree "$PODMAN_DIR")
    podman_hash="$(
        {
            printf 'node %s\n' "$NODE_IMAGE"
            hash_tree_files "$PODMAN_DIR" "${PODMAN_FILES[@]}"
        } | sha256sum | cut -c1-16
    )"
    PODMAN_IMAGE="$PODMAN_REPO:$podman_hash"
fi

if [[ $mode == print ]]; then
    printf '%s\n' "$NODE_IMAGE"
    exit 0
fi

# ---------------------------------------------------------------- tools
command -v podman >/dev/null 2>&1 \
    || die "podman is not installed; run scripts/install-system-deps.sh (as root)"
grep -qs '^[[:space:]]*runtime[[:space:]]*=[[:space:]]*"runc"' "$CONTAINERS_CONF" \
    || say "warning: $CONTAINERS_CONF does not select runc; crun fails on cgroup v1 hybrid hosts"
command -v runc >/dev/null 2>&1 || [[ -x /usr/sbin/runc ]] \
    || die "runc is not installed; run scripts/install-system-deps.sh (as root)"

# One build at a time on this machine (the image store is shared).
exec 9>"$BUILD_DIR/gpufleet-build-image.lock"
flock 9

t_start=$SECONDS

# ---------------------------------------------------------------- build
if [[ $force -eq 0 ]] && podman image exists "$BASE_IMAGE"; then
    say "reusing $BASE_IMAGE"
else
    build_base
fi
if [[ $mode == base ]]; then
    say "ready: $BASE_IMAGE in $((SECONDS - t_start)) s"
    printf '%s\n' "$BASE_IMAGE"
    exit 0
fi

# ---------------------------------------------------------------- node
build_node() {
    [[ ${#SIM_FILES[@]} -gt 0 ]] || say "warning: $SIM_DIR has no files; the image has no simulator"
    local ctx t0=$SECONDS f
    ctx="$(mktemp -d "$BUILD_DIR/gpufleet-node-ctx.XXXXXX")"
    # shellcheck disable=SC2064 # expand $ctx now: it is a local, gone when the trap runs
    trap "rm -rf '$ctx'" EXIT
    mkdir -p "$ctx/sim" "$ctx/files"
    for f in "${SIM_FILES[@]}"; do
        mkdir -p "$ctx/sim/$(dirname "$f")"
        cp -p "$SIM_DIR/$f" "$ctx/sim/$f"
    done
    cp -a "$IMAGE_DIR/files/." "$ctx/files/"
    cp "$IMAGE_DIR/Containerfile" "$ctx/Containerfile"
    say "podman build FROM $BASE_IMAGE -> $NODE_IMAGE (${#SIM_FILES[@]} simulator files) ..."
    if ! podman build --pull=never --network=none --layers=false \
            --build-arg "BASE_IMAGE=$BASE_IMAGE" -f "$ctx/Containerfile" -t "$NODE_IMAGE" \
            "$ctx" >"$ctx.log" 2>&1; then
        tail -n 30 "$ctx.log" >&2
        rm -f "$ctx.log"
        die "podman build of $NODE_IMAGE failed (log above)"
    fi
    rm -rf "$ctx" "$ctx.log"
    trap - EXIT
    say "node image built in $((SECONDS - t0)) s"
}

if [[ $force -eq 0 ]] && podman image exists "$NODE_IMAGE"; then
    say "reusing $NODE_IMAGE"
else
    build_node
fi

# ---------------------------------------------------------------- podman
build_podman() {
    local ctx t0=$SECONDS
    ctx="$(mktemp -d "$BUILD_DIR/gpufleet-podman-ctx.XXXXXX")"
    # shellcheck disable=SC2064 # expand $ctx now: it is a local, gone when the trap runs
    trap "rm -rf '$ctx'" EXIT
    cp -a "$PODMAN_DIR/." "$ctx/"
    say "podman build FROM $NODE_IMAGE -> $PODMAN_IMAGE (apt-get install podman from the Debian mirror) ..."
    if ! podman build --pull=never --layers=false --build-arg "NODE_IMAGE=$NODE_IMAGE" \
            -f "$ctx/Containerfile" -t "$PODMAN_IMAGE" "$ctx" >"$ctx.log" 2>&1; then
        tail -n 30 "$ctx.log" >&2
        rm -f "$ctx.log"
        die "podman build of $PODMAN_IMAGE failed (log above)"
    fi
    rm -rf "$ctx" "$ctx.log"
    trap - EXIT
    say "podman node image built in $((SECONDS - t0)) s"
}

if [[ $mode == podman ]]; then
    if [[ $force -eq 0 ]] && podman image exists "$PODMAN_IMAGE"; then
        say "reusing $PODMAN_IMAGE"
    else
        build_podman
    fi
fi

# ---------------------------------------------------------------- prune
if [[ $prune -eq 1 ]]; then
    in_use="$(podman ps -a --format '{{.Image}}' | sort -u)"
    # Node images first: an old base cannot go while a node image uses it.
    prune_repos=("$NODE_REPO" "$BASE_REPO")
    # The podman layer's other tags only when this run knows the current one.
    [[ $mode == podman ]] && prune_repos=("$PODMAN_REPO" "${prune_repos[@]}")
    for repo in "${prune_repos[@]}"; do
        while read -r img; do
            [[ -z "$img" || "$img" == "$NODE_IMAGE" || "$img" == "$BASE_IMAGE" || "$img" == "${PODMAN_IMAGE:-}" ]] && continue
            if grep -qxF "$img" <<<"$in_use"; then
                say "keeping $img (used by a container)"
            elif podman rmi "$img" >/dev/null 2>&1; then
                say "removed $img"
            else
                say "could not remove $img (still in use?)"
            fi
        done < <(podman images --format '{{.Repository}}:{{.Tag}}' | grep -F "$repo:" || true)
    done
fi

if [[ $mode == podman ]]; then
    say "ready: $PODMAN_IMAGE (node $NODE_IMAGE) in $((SECONDS - t_start)) s"
    printf '%s\n' "$PODMAN_IMAGE"
    exit 0
fi
say "ready: $NODE_IMAGE (base $BASE_IMAGE) in $((SECONDS - t_start)) s"
printf '%s\n' "$NODE_IMAGE"
