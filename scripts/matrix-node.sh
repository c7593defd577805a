#!/usr/bin/env bash
# One leg of the node matrix: the `default` molecule scenario (the incident
# redeploy on two systemd container hosts: the modules, the node-side helpers
# and the systemd path) against a node image of another Debian suite.
#
#   scripts/matrix-node.sh SUITE        e.g. bullseye (Python 3.9), trixie (3.13)
#
# Builds or reuses the suite's image (scripts/build-image.sh --suite SUITE --prune:
# localhost/gpufleet-node-SUITE:<hash>; older tags of that suite go), prints
# what the node runs (Python, systemd), checks that python3 is one the
# collection supports on nodes (3.9 or later), runs the node-side SGLang
# oracle helper once on the image's python3 (see below), then runs
# scripts/run-molecule.sh default with
# GPUFLEET_NODE_IMAGE set to that image. The scenario, its inventory and its
# verify are default's, unchanged: only the node's operating system differs.
# Exit status: run-molecule.sh's (0 when the scenario passed).
set -euo pipefail
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."
REPO=$PWD

say() { printf 'matrix-node: %s\n' "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

[[ $# -eq 1 ]] || die "usage: scripts/matrix-node.sh SUITE (e.g. bullseye, trixie)"
SUITE=$1
export CONTAINERS_CONF="${CONTAINERS_CONF:-$REPO/molecule/containers.conf}"

t0=$SECONDS
image="$(scripts/build-image.sh --suite "$SUITE" --prune)" || die "the $SUITE image did not build"
say "image $image ready in $((SECONDS - t0)) s"

# What the node runs: one throw-away container, no network, no systemd boot.
facts="$(podman run --rm --pull=never --network=none --entrypoint /usr/bin/python3 "$image" -c '
import platform, subprocess, sys
out = subprocess.run(["systemctl", "--version"], stdout=subprocess.PIPE, universal_newlines=True).stdout
print("python=%s systemd=%s os=%s ok=%d" % (platform.python_version(), out.split()[1],
      open("/etc/debian_version").read().strip(), sys.version_info[:2] >= (3, 9)))
')" || die "could not start python3 in $image"
say "node $SUITE: $facts"
[[ $facts == *" ok=1" ]] || die "$image has a python3 older than 3.9, which the collection does not support on nodes"

# The node-side SGLang oracle helper (plugins/module_utils/sglang/oracle_helper.py)
# runs in the interpreter of the node's SGLang, on the node's Python. The
# images have no real SGLang or torch, so it must get as far as its guarded
# import and answer in its documented shape (one JSON object, "ok" false with
# an import_error), not die with a traceback: this is what its module level
# and request handling do on this Python. Once the preflight calls it, the
# scenario below runs it too.
helper=plugins/module_utils/sglang/oracle_helper.py
if [[ -f $helper ]]; then
    request='{"argv": ["--model-path", "/models/llama", "--speculative-algorithm", "EAGLE3"],
              "gpu": {"name": "NVIDIA H200", "compute_capability": "9.0", "memory_mib": 143771, "count": 8}}'
    answer="$(printf '%s' "$request" | podman run --rm -i --pull=never --network=none \
        -v "$REPO/$helper:/tmp/oracle_helper.py:ro" --entrypoint /usr/bin/python3 "$image" /tmp/oracle_helper.py 2>&1)" \
        || die "the oracle helper failed on $SUITE: $answer"
    printf '%s' "$answer" | python3 -c '
import json, sys
a = json.loads(sys.stdin.read())
assert a["ok"] is True or (a.get("import_error") or a.get("error") or {}).get("type"), a
print("oracle helper: ok=%s %s" % (a["ok"], (a.get("import_error") or a.get("error") or {}).get("message", "")))
' >&2 || die "the oracle helper's answer on $SUITE is not what it documents: $answer"
fi

GPUFLEET_NODE_IMAGE="$image" exec scripts/run-molecule.sh default
