#!/usr/bin/env bash
# Install the system packages that the container-host (molecule) tests and
# the shellcheck sanity test need, and only those that are missing.
#
#   scripts/install-system-deps.sh           install what is missing
#   scripts/install-system-deps.sh --check   only report; exit 1 if something is missing
#
# Packages (Debian 12, run as root; see docs/development.md):
#   podman        container engine (pulls conmon, containers-common)
#   runc          OCI runtime; crun fails on this kernel ("cgroups in hybrid
#                 mode not supported"), molecule/containers.conf selects runc
#   netavark      podman's network backend: scenario networks for the hosts
#   aardvark-dns  name resolution between containers on a scenario network
#   iptables      used by netavark to set up bridge networks
#   debootstrap   builds the base root filesystem of the test image
#   wget          debootstrap's downloader (a Depends, listed for clarity)
#   ca-certificates  lets debootstrap use an https mirror
#   docker.io     the Docker engine (dockerd, docker CLI): tests/integration/test_containers.py
#                 runs a private dockerd (its own socket, no bridge, no iptables) to test the
#                 adoption of a hand-run docker container (issue 24)
#   ShellCheck    (package shellcheck) for ansible-test sanity's shellcheck
#                 test, skipped with only a warning when it is missing
#
# Not installed on purpose (only needed for rootless podman, and the tests run
# as root): uidmap, slirp4netns, fuse-overlayfs, buildah, catatonit.
# Recommends are not installed (--no-install-recommends), so without netavark
# in this list apt would fall back to containernetworking-plugins.
set -euo pipefail

PACKAGES=(podman runc netavark aardvark-dns iptables debootstrap wget ca-certificates shellcheck docker.io)

check_only=0
case "${1:-}" in
    --check) check_only=1 ;;
    "") ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "install-system-deps: unknown argument '$1' (use --check or nothing)" >&2; exit 2 ;;
esac

missing=()
for pkg in "${PACKAGES[@]}"; do
    # shellcheck disable=SC2016 # ${Status} is dpkg-query's field, not a shell variable
    status="$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)"
    if [[ "$status" == "install ok installed" ]]; then
        echo "install-system-deps: $pkg already installed"
    else
        missing+=("$pkg")
    fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
    echo "install-system-deps: nothing to install"
    exit 0
fi

echo "install-system-deps: missing: ${missing[*]}"
if [[ $check_only -eq 1 ]]; then
    exit 1
fi

if [[ $(id -u) -ne 0 ]]; then
    echo "install-system-deps: must run as root to install: ${missing[*]}" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-system-deps: apt-get not found; install by hand: ${missing[*]}" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
echo "install-system-deps: apt-get update"
apt-get update -q
echo "install-system-deps: apt-get install --no-install-recommends ${missing[*]}"
apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "install-system-deps: installed: ${missing[*]}"
