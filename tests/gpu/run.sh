#!/usr/bin/env bash
# tests/gpu/run.sh: the real-GPU validation kit of gpufleet.sglang, as one command.
#
# Usage: tests/gpu/run.sh [OPTIONS] [-- PYTEST_ARGS...]
#
#   --out DIR             write results.json, summary.md, junit.xml and the masked
#                         captures there (default tests/gpu/results/<UTC timestamp>/)
#   --skip-install        install nothing: use the repo .venv (else python3) as it is
#   --self-test           run the kit's CPU self-tests (no GPU needed) and exit
#   --sim                 rehearsal: run the real-GPU checks against the gpusim
#                         simulator (no GPU needed; nothing is installed)
#   --allocator NAME      auto (default: ctypes on libcuda.so.1, then cupy, then torch),
#                         cuda, cupy or torch
#   --mib N               MiB the teardown and latency holders allocate (default 10240)
#   --no-update-captures  do not write the real captures into tests/gpu/captures/
#   -h, --help            this text
#
# Needs: an NVIDIA driver and GPU (nvidia-smi -L lists one), python3 (3.9+; with the
# repo .venv or Python 3.11+ for ansible-core 2.19), network access to PyPI unless
# --skip-install. Installs into a temporary directory only: nvidia-ml-py (and, if
# libcuda.so.1 cannot allocate, cupy-cuda12x); ansible-core and pytest too when the
# repo has no .venv. GPU 0 must be idle: the kit allocates about 10 GiB there and
# runs gpu_drain on it (only ever signalling processes it started).
# Budget: the whole run is cut at 6 minutes (typically 2-3 minutes).
#
# Exit codes: 0 every check passed; 1 a check failed or was skipped (see summary.md); 2 usage
# error; 3 no NVIDIA GPU; 4 setup failed (python, venv, pip); 5 time budget exceeded.
set -euo pipefail

KIT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$KIT/../.." && pwd)
BUDGET_S=${GPUKIT_BUDGET_S:-360}
START=$(date +%s)

out=""
skip_install=0
self_test=0
sim=0
allocator=auto
mib=10240
update_captures=1
pytest_args=()

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { local rc=$1; shift; echo "run.sh: $*" >&2; exit "$rc"; }
note() { echo "run.sh: $*"; }

while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --out) [ -n "${2:-}" ] || die 2 "--out needs a directory"; out=$2; shift 2 ;;
    --out=*) out=${1#--out=}; [ -n "$out" ] || die 2 "--out needs a directory"; shift ;;
    --skip-install) skip_install=1; shift ;;
    --self-test) self_test=1; shift ;;
    --sim) sim=1; shift ;;
    --allocator) [ $# -ge 2 ] || die 2 "--allocator needs a name"; allocator=$2; shift 2 ;;
    --allocator=*) allocator=${1#--allocator=}; shift ;;
    --mib) [ $# -ge 2 ] || die 2 "--mib needs a number"; mib=$2; shift 2 ;;
    --mib=*) mib=${1#--mib=}; shift ;;
    --no-update-captures) update_captures=0; shift ;;
    --) shift; pytest_args=("$@"); break ;;
    *) usage >&2; die 2 "unknown argument '$1' (see --help)" ;;
  esac
done
case "$allocator" in auto|cuda|cupy|torch) ;; *) die 2 "--allocator must be auto, cuda, cupy or torch, not '$allocator'" ;; esac
if ! [[ "$mib" =~ ^[0-9]+$ ]] || [ "$mib" -lt 64 ]; then die 2 "--mib must be a whole number >= 64, not '$mib'"; fi
[ $self_test -eq 1 ] && [ $sim -eq 1 ] && die 2 "--self-test and --sim are exclusive"

# ---------------------------------------------------------------- python
pick_python() {
  if [ -x "$REPO/.venv/bin/python" ]; then echo "$REPO/.venv/bin/python"; return; fi
  command -v python3 || true
}
has_modules() { "$1" -c "import $2" >/dev/null 2>&1; }

PY=$(pick_python)
[ -n "$PY" ] || die 4 "no python3 found (and no repo .venv)"

if [ $self_test -eq 1 ]; then
  has_modules "$PY" "pytest, ansible" || die 4 "$PY lacks pytest or ansible-core; run 'make setup' first"
  cd "$REPO"
  note "self-test with $PY (no GPU needed)"
  set +e
  "$PY" -m pytest tests/gpu/test_kit_selftest.py tests/unit/plugins/module_utils/test_gpu_captures.py \
    -p no:cacheprovider -q "${pytest_args[@]}"
  rc=$?
  set -e
  [ $rc -eq 0 ] && exit 0
  exit 1
fi

# ---------------------------------------------------------------- GPU present?
if [ $sim -eq 0 ]; then
  command -v nvidia-smi >/dev/null 2>&1 || die 3 "no NVIDIA GPU: nvidia-smi not found on PATH.
run.sh: this kit needs a machine with an NVIDIA driver and GPU; elsewhere use --self-test or --sim"
  set +e
  list=$(LC_ALL=C timeout 60 nvidia-smi -L 2>&1)
  rc=$?
  set -e
  first=$(printf '%s\n' "$list" | sed -n '/./{p;q}')
  [ $rc -eq 0 ] || die 3 "no NVIDIA GPU: nvidia-smi -L exited $rc: ${first:-no output}
run.sh: this kit needs a machine with an NVIDIA driver and GPU; elsewhere use --self-test or --sim"
  printf '%s\n' "$list" | grep -q '^GPU [0-9]' || die 3 "no NVIDIA GPU: nvidia-smi -L listed no GPU: ${first:-no output}
run.sh: this kit needs a machine with an NVIDIA driver and GPU; elsewhere use --self-test or --sim"
  note "$(printf '%s\n' "$list" | grep -c '^GPU [0-9]') GPU(s): $(printf '%s\n' "$list" | sed -n 's/^GPU 0: \(.*\) (UUID.*/\1/p')"
  uuid0=$(printf '%s\n' "$list" | sed -n 's/^GPU 0: .* (UUID: \(GPU-[0-9a-fA-F-]*\)).*/\1/p')
fi

# ---------------------------------------------------------------- output dir
if [ -z "$out" ]; then
  stamp=$(date -u +%Y%m%dT%H%M%SZ)
  if [ $sim -eq 1 ]; then out="$KIT/results/sim-$stamp"; else out="$KIT/results/$stamp"; fi
fi
mkdir -p "$out" || die 2 "cannot create the output directory $out"
out=$(cd "$out" && pwd)

# ---------------------------------------------------------------- environment
TMP=""
# shellcheck disable=SC2317 # run by the EXIT trap below (ShellCheck 0.9 misses trap handlers)
cleanup() { [ -n "$TMP" ] && rm -rf "$TMP"; return 0; }
trap cleanup EXIT
export PYTHONDONTWRITEBYTECODE=1

if [ $sim -eq 0 ] && [ $skip_install -eq 0 ]; then
  TMP=$(mktemp -d -t gpufleet-gpukit.XXXXXX)
  pipq() { "$@" --quiet --disable-pip-version-check --no-input; }
  if has_modules "$PY" "pytest, ansible"; then
    note "reusing $PY (ansible-core, pytest); installing nvidia-ml-py into $TMP/site"
  else
    base=$(command -v python3 || true)
    [ -n "$base" ] || die 4 "no python3 to create a venv with"
    note "creating a venv in $TMP/venv with $("$base" --version 2>&1)"
    "$base" -m venv "$TMP/venv" || die 4 "python3 -m venv failed (install python3-venv)"
    PY="$TMP/venv/bin/python"
    pipq "$PY" -m pip install ansible-core pytest || die 4 "pip install ansible-core pytest failed (PyPI reachable?)"
  fi
  pipq "$PY" -m pip install --target "$TMP/site" nvidia-ml-py || die 4 "pip install nvidia-ml-py failed (PyPI reachable?)"
  export PYTHONPATH="$TMP/site${PYTHONPATH:+:$PYTHONPATH}"
fi
if [ $sim -eq 0 ]; then
  has_modules "$PY" "pytest, ansible" || die 4 "$PY lacks pytest or ansible-core (drop --skip-install, or run 'make setup')"
  probe() { CUDA_VISIBLE_DEVICES="$uuid0" CUDA_DEVICE_ORDER=PCI_BUS_ID "$PY" "$KIT/gpukit/holder.py" --role probe --allocator "$1" 2>&1; }
  set +e
  p=$(probe "$allocator"); prc=$?
  if [ $prc -ne 0 ] && [ $skip_install -eq 0 ] && { [ "$allocator" = auto ] || [ "$allocator" = cupy ]; }; then
    note "allocator probe failed ($p); installing cupy-cuda12x"
    pipq "$PY" -m pip install --target "$TMP/site" cupy-cuda12x && { p=$(probe "$allocator"); prc=$?; }
  fi
  set -e
  [ $prc -eq 0 ] || die 4 "no way to allocate GPU memory: $p"
  note "allocator: $p"
fi

# ---------------------------------------------------------------- run
mkdir -p "$REPO/.collections/ansible_collections/gpufleet"
[ -e "$REPO/.collections/ansible_collections/gpufleet/sglang" ] || ln -sfn ../../.. "$REPO/.collections/ansible_collections/gpufleet/sglang"
export ANSIBLE_COLLECTIONS_PATH="$REPO/.collections"
export GPUKIT_OUT="$out" GPUKIT_ALLOCATOR="$allocator" GPUKIT_MIB="$mib" GPUKIT_UPDATE_CAPTURES="$update_captures"
if [ $sim -eq 1 ]; then export GPUKIT_MODE=sim; else export GPUKIT_MODE=real; fi
left=$(( BUDGET_S - ($(date +%s) - START) - 5 ))
[ $left -gt 30 ] || die 5 "setup used the time budget ($BUDGET_S s)"
note "mode $GPUKIT_MODE, python $PY, results in $out, $left s left"
cd "$REPO"
set +e
timeout -k 10 "$left" "$PY" -m pytest tests/gpu/test_real_gpu.py -m gpu -v -p no:cacheprovider \
  --junitxml="$out/junit.xml" "${pytest_args[@]}"
rc=$?
set -e
echo
[ -f "$out/summary.md" ] && cat "$out/summary.md"
note "results: $out/results.json and $out/summary.md"
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then die 5 "time budget of $BUDGET_S s exceeded (partial results kept)"; fi
verdict=$("$PY" - "$out/results.json" <<'EOF'
import json, sys
try:
    s = json.load(open(sys.argv[1]))["summary"]
except Exception as exc:
    print("no results (%s)" % exc); sys.exit(1)
ok = s["failed"] == 0 and s["error"] == 0 and s["skipped"] == 0 and s["passed"] > 0
print("%d passed, %d failed, %d error, %d skipped" % (s["passed"], s["failed"], s["error"], s["skipped"]))
sys.exit(0 if ok else 1)
EOF
) && vrc=0 || vrc=$?
note "$verdict"
[ "$rc" -eq 0 ] && [ "$vrc" -eq 0 ] && exit 0
exit 1
