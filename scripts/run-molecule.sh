#!/usr/bin/env bash
# Run molecule scenarios against podman container hosts.
#
#   scripts/run-molecule.sh SCENARIO...        e.g. scripts/run-molecule.sh default
#   scripts/run-molecule.sh --all              every molecule/*/molecule.yml
#
# For each scenario: `molecule test -s SCENARIO` from the repository root
# (where molecule finds molecule/<scenario>/, see docs/development.md). The
# node image is built or reused once first (scripts/build-image.sh). Whatever
# happens, every scenario's containers are destroyed at the end, and one
# summary line per scenario is printed. Exit status: 0 when all passed.
#
# Environment: CONTAINERS_CONF (default molecule/containers.conf),
# GPUFLEET_NODE_IMAGE (skip the build and use this image),
# MOLECULE_OPTS (extra options for `molecule test`, e.g. --destroy=never).
set -uo pipefail

REPO="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)"
cd "$REPO" || exit 1

say() { printf 'run-molecule: %s\n' "$*" >&2; }

if [[ $# -eq 0 ]]; then
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}" >&2
    exit 2
fi

scenarios=()
if [[ "$1" == "--all" ]]; then
    for f in molecule/*/molecule.yml; do
        [[ -f "$f" ]] && scenarios+=("$(basename "$(dirname "$f")")")
    done
else
    for s in "$@"; do
        if [[ ! -f "molecule/$s/molecule.yml" ]]; then
            say "no scenario '$s' (missing molecule/$s/molecule.yml)"
            exit 2
        fi
        scenarios+=("$s")
    done
fi
[[ ${#scenarios[@]} -gt 0 ]] || { say "no scenarios under molecule/"; exit 2; }

# Tools from the project's virtual environment first.
if [[ -x "$REPO/.venv/bin/molecule" ]]; then
    export PATH="$REPO/.venv/bin:$PATH"
fi
command -v molecule >/dev/null 2>&1 \
    || { say "molecule not found: create the venv (.venv) with molecule and molecule-plugins[podman]"; exit 1; }
command -v podman >/dev/null 2>&1 \
    || { say "podman not found: run scripts/install-system-deps.sh (as root)"; exit 1; }

export CONTAINERS_CONF="${CONTAINERS_CONF:-$REPO/molecule/containers.conf}"
# molecule/ at the top of a collection: use it, not extensions/molecule/.
export MOLECULE_GLOB="molecule/*/molecule.yml"
export ANSIBLE_FORCE_COLOR="${ANSIBLE_FORCE_COLOR:-0}"
export PY_COLORS="${PY_COLORS:-0}"

# The collection as gpufleet.sglang (also done by make; idempotent here).
link="$REPO/.collections/ansible_collections/gpufleet/sglang"
if [[ ! -e "$link" ]]; then
    mkdir -p "$(dirname "$link")"
    ln -sfn ../../.. "$link"
fi

if [[ -z "${GPUFLEET_NODE_IMAGE:-}" ]]; then
    t0=$SECONDS
    GPUFLEET_NODE_IMAGE="$("$REPO/scripts/build-image.sh")" || { say "image build failed"; exit 1; }
    say "image $GPUFLEET_NODE_IMAGE ready in $((SECONDS - t0)) s"
fi
export GPUFLEET_NODE_IMAGE

# shellcheck disable=SC2317 # run by the EXIT trap below (ShellCheck 0.9 misses trap handlers)
destroy_all() {
    local s left
    for s in "${scenarios[@]}"; do
        # molecule test destroys at its end; only act if containers are left.
        left="$(podman ps -a -q --filter "label=gpufleet.scenario=$s" 2>/dev/null)"
        [[ -z "$left" ]] && continue
        say "destroying what is left of scenario $s"
        molecule destroy -s "$s" >/dev/null 2>&1 \
            || say "warning: 'molecule destroy -s $s' failed; remove its containers by name: podman rm -f NAME"
    done
}
trap destroy_all EXIT
trap 'say "interrupted"; exit 130' INT TERM

declare -A result seconds
rc_all=0
for s in "${scenarios[@]}"; do
    say "=== molecule test -s $s"
    t0=$SECONDS
    # shellcheck disable=SC2086 # MOLECULE_OPTS holds several options: split it into words
    if molecule test -s "$s" ${MOLECULE_OPTS:-}; then
        result[$s]=PASS
    else
        result[$s]=FAIL
        rc_all=1
    fi
    seconds[$s]=$((SECONDS - t0))
done

printf '\n' >&2
for s in "${scenarios[@]}"; do
    printf 'molecule %-12s %s in %ss (image %s)\n' "$s" "${result[$s]}" "${seconds[$s]}" "$GPUFLEET_NODE_IMAGE"
done
exit $rc_all
