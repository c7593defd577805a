#!/usr/bin/env bash
# make demo: the incident, replayed on an embedded simulated 8xH200 node.
#
# 1. A simulated node (GPUSIM_ROOT=.demo/node) runs the incident's server,
#    started by hand: EAGLE3, topk 1, steps 1, 16 draft tokens (SGLang runs 2),
#    plus an unrelated Python process that must survive.
# 2. redeploy.yml replaces it: preflight picks steps 15, the drain signals only
#    the server's processes, the GPUs are verified idle, the new server is
#    launched and verified, and the smoke gate proves the accept length.
# 3. The fixed server keeps running; `make demo-clean` stops it by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
DEMO=$REPO/.demo
PIDS=$DEMO/pids
export PATH="$REPO/.venv/bin:$REPO/simulator/bin:$PATH"
export ANSIBLE_COLLECTIONS_PATH=$REPO/.collections
export ANSIBLE_CONFIG=$REPO/ansible.cfg
export GPUSIM_ROOT=$DEMO/node
PORT=${DEMO_PORT:-31000}

stop_pid() {  # stop one recorded process tree by PID: SIGTERM, wait, SIGKILL
  local pid=$1 name=$2
  kill -0 "$pid" 2>/dev/null || return 0
  echo "demo-clean: stopping $name (PID $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
}

clean() {
  if [ -f "$PIDS" ]; then
    while read -r pid name; do stop_pid "$pid" "$name"; done < "$PIDS"
  fi
  if [ -f "$DEMO/state/server.pid" ]; then
    stop_pid "$(cat "$DEMO/state/server.pid")" "redeployed SGLang server"
  fi
  rm -rf "$DEMO"
  echo "demo-clean: done"
}

if [ "${1:-}" = "--clean" ]; then clean; exit 0; fi
if [ -d "$DEMO" ]; then
  echo "== A previous demo is still set up; cleaning it first"
  clean
fi

banner() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

mkdir -p "$DEMO"/models/kimi-k2.5 "$DEMO"/models/kimi-k2.5-eagle3 "$DEMO"/reports "$DEMO"/state "$DEMO"/etc "$DEMO"/log
echo '{"architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2"}' > "$DEMO/models/kimi-k2.5/config.json"
echo '{"architectures": ["LlamaForCausalLMEagle3"]}' > "$DEMO/models/kimi-k2.5-eagle3/config.json"
# Tiny valid checkpoints (safetensors weights, tokenizer files): what the preflight checks.
gpusim checkpoint "$DEMO/models/kimi-k2.5" >/dev/null
gpusim checkpoint "$DEMO/models/kimi-k2.5-eagle3" >/dev/null
: > "$PIDS"

banner "Simulated node: 8 x NVIDIA H200 (GPUSIM_ROOT=.demo/node)"
gpusim init --gpus 8 --model H200 >/dev/null
nvidia-smi -L

banner "The incident: the server an engineer started by hand"
INCIDENT_ARGS=(--model-path "$DEMO/models/kimi-k2.5" --tp-size 8 --port "$PORT"
  --speculative-algorithm EAGLE3 --speculative-draft-model-path "$DEMO/models/kimi-k2.5-eagle3"
  --speculative-eagle-topk 1 --speculative-num-steps 1 --speculative-num-draft-tokens 16)
echo "python3 -m sglang.launch_server ${INCIDENT_ARGS[*]}"
PYTHONPATH="$REPO/simulator/python" SGLANG_SIM_STARTUP_S=1.0 \
  setsid python3 -m sglang.launch_server "${INCIDENT_ARGS[@]}" > "$DEMO/log/incident.log" 2>&1 < /dev/null &
echo "$! incident SGLang server" >> "$PIDS"
setsid python3 -c 'import time; time.sleep(86400)' > /dev/null 2>&1 < /dev/null &
DECOY=$!
echo "$DECOY unrelated Python process (decoy)" >> "$PIDS"
echo "unrelated Python process (must survive): PID $DECOY"

python3 - "$PORT" <<'PY'
import sys, time, urllib.request
url = "http://127.0.0.1:%s/health" % sys.argv[1]
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    try:
        if opener.open(url, timeout=2).status == 200:
            break
    except Exception:
        pass
    time.sleep(0.2)
else:
    sys.exit("the incident server did not become healthy; see .demo/log/incident.log")
PY
echo "SGLang's own startup log says:"
grep -F "speculative_num_draft_tokens is adjusted" "$DEMO/log/incident.log" | sed 's/^/    /' || true
nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv

banner "Before: smoke benchmark against the incident server"
ansible localhost -o -m gpufleet.sglang.sglang_smoke \
  -a "url=http://127.0.0.1:$PORT requests=4 max_new_tokens=256" 2>/dev/null \
  | sed -E 's/.*"accept_length": ([0-9.]+).*"tokens_per_s": ([0-9.]+).*/    accept length \1, \2 tok\/s/'

cat > "$DEMO/inventory.yml" <<EOF
all:
  children:
    gpu-nodes:
      hosts:
        demo-node:
          ansible_connection: local
          ansible_python_interpreter: $REPO/.venv/bin/python
  vars:
    sglang_node_environment:
      GPUSIM_ROOT: $GPUSIM_ROOT
      PATH: $REPO/simulator/bin:/usr/local/bin:/usr/bin:/bin
    gpufleet_gpu_device_paths: ["$GPUSIM_ROOT/dev/nvidia*"]
    sglang_report_dir: $DEMO/reports
    sglang_lock_dir: $DEMO/state
    sglang_server_name: demo
    sglang_server_manager: process
    sglang_server_python: python3
    sglang_server_version: "0.5.23"
    sglang_server_spec_policy: honor_draft_tokens
    sglang_server_config_dir: $DEMO/etc
    sglang_server_state_dir: $DEMO/state
    sglang_server_log_file: $DEMO/log/server.log
    sglang_server_health_timeout: 120
    sglang_server_env:
      PYTHONPATH: $REPO/simulator/python
      GPUSIM_ROOT: $GPUSIM_ROOT
      SGLANG_SIM_STARTUP_S: "1.0"
    sglang_server_args:
      model_path: $DEMO/models/kimi-k2.5
      tp_size: 8
      port: $PORT
      speculative_algorithm: EAGLE3
      speculative_draft_model_path: $DEMO/models/kimi-k2.5-eagle3
      speculative_eagle_topk: 1
      speculative_num_steps: 1
      speculative_num_draft_tokens: 16
    gpu_teardown_term_timeout: 30
    gpu_verify_timeout: 60
    sglang_smoke_requests: 4
    sglang_smoke_max_new_tokens: 256
    sglang_smoke_min_accept_length: 2.5
    sglang_smoke_min_tokens_per_s: 80
EOF

banner "ansible-playbook playbooks/redeploy.yml -l gpu-nodes"
ansible-playbook -i "$DEMO/inventory.yml" playbooks/redeploy.yml -l gpu-nodes

banner "After"
nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv
if kill -0 "$DECOY" 2>/dev/null; then
  echo "the unrelated Python process (PID $DECOY) is still running"
else
  echo "ERROR: the unrelated Python process (PID $DECOY) was killed" >&2
  exit 1
fi
echo "reports: $(ls "$DEMO"/reports/*.md)"
echo "the fixed server keeps running on port $PORT; 'make demo-clean' stops it by PID"
