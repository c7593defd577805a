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
# oracle helper on the image's python3 against the controller's (see below),
# then runs scripts/run-molecule.sh default with
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
# runs in the interpreter of the node's SGLang. Here that is the image's
# python3 with the simulator's SGLang (no torch: the helper stands in for it).
# It resolves the incident config (EAGLE3, topk 1, steps 1, 16 draft tokens,
# which SGLang runs with 2) on the node's Python, and once more on the
# controller's Python 3.11 with the same SGLang; the two answers must agree
# field for field (model paths aside, which differ by location).
helper=plugins/module_utils/sglang/oracle_helper.py
if [[ -f $helper ]]; then
    node_root=/tmp/gpufleet-oracle
    host_root="$(mktemp -d)"
    # shellcheck disable=SC2064 # expand $host_root now
    trap "rm -rf '$host_root'" EXIT
    request() {
        printf '{"argv": ["--model-path", "%s/target", "--speculative-algorithm", "EAGLE3",
                 "--speculative-draft-model-path", "%s/draft", "--speculative-eagle-topk", "1",
                 "--speculative-num-steps", "1", "--speculative-num-draft-tokens", "16", "--tp-size", "8",
                 "--random-seed", "1"],
                 "gpu": {"name": "NVIDIA H200", "compute_capability": "9.0", "memory_mib": 143771, "count": 8}}' "$1" "$1"
    }
    # shellcheck disable=SC2016 # $0 is the root, expanded by the sh -c that runs it
    models='mkdir -p "$0/target" "$0/draft"
        printf "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\"}" > "$0/target/config.json"
        printf "{\"architectures\": [\"LlamaForCausalLMEagle3\"], \"model_type\": \"llama\"}" > "$0/draft/config.json"'
    node_answer="$(request "$node_root" | podman run --rm -i --pull=never --network=none \
        -v "$REPO/$helper:/tmp/oracle_helper.py:ro" --entrypoint /bin/sh "$image" \
        -c "$models"'; exec python3 /tmp/oracle_helper.py' "$node_root" 2>/dev/null)" \
        || die "the oracle helper failed on $SUITE's python3: $node_answer"
    sh -c "$models" "$host_root"
    host_python="$REPO/.venv/bin/python"; [[ -x $host_python ]] || host_python=python3
    host_answer="$(request "$host_root" | PYTHONPATH="$REPO/simulator/python" "$host_python" "$helper" 2>/dev/null)" \
        || die "the oracle helper failed on the controller's Python: $host_answer"
    "$host_python" - "$node_answer" "$host_answer" "$host_root" "$node_root" "$SUITE" <<'PY' >&2 \
        || die "the oracle helper's answer on $SUITE differs from the controller's (above)"
import json, sys
node = json.loads(sys.argv[1])
host = json.loads(sys.argv[2].replace(sys.argv[3], sys.argv[4]))
for name, a in (("node", node), ("controller", host)):
    assert a.get("ok") is True and a.get("error") is None, "%s: %s" % (name, a)
    assert a["args"]["speculative_num_draft_tokens"] == 2, "%s: %s" % (name, a["args"]["speculative_num_draft_tokens"])
diff = {k: (node["args"].get(k), host["args"].get(k)) for k in set(node["args"]) | set(host["args"])
        if node["args"].get(k) != host["args"].get(k)}
assert not diff, "args differ (node, controller): %s" % diff
assert node.get("warnings") == host.get("warnings"), (node.get("warnings"), host.get("warnings"))
print("matrix-node: oracle helper on %s: SGLang %s resolves the incident to %d draft tokens, %d fields and %d "
      "warnings as on the controller's Python" % (sys.argv[5], node.get("sglang_version"),
                                                node["args"]["speculative_num_draft_tokens"], len(node["args"]),
                                                len(node.get("warnings") or [])))
PY
    rm -rf "$host_root"; trap - EXIT
fi

GPUFLEET_NODE_IMAGE="$image" exec scripts/run-molecule.sh default
