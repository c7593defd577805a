#!/usr/bin/env bash
# Golden error captures from the REAL nvidia-smi 535.261.03 binary, on a machine
# WITHOUT an NVIDIA driver (see ../shared/docs/nvidia-smi.md section 0):
#   no-library-*.txt  rc 12  libnvidia-ml.so.1 cannot be loaded
#   no-driver-*.txt   rc 9   library present, no kernel driver
# for every query the collection makes (tests/gpu/kit.py queries).
#
# It downloads the Debian bookworm non-free packages nvidia-smi and libnvidia-ml1
# with a private apt configuration in a temporary directory, using the mirror and
# keyring named in this machine's apt sources (nothing is installed; the system
# apt configuration is not touched; no mirror is named in this repository), runs
# the binary from there, writes the captures and deletes the directory.
#
# Usage: tests/gpu/make_error_captures.sh [--out DIR]     (run as root, on Debian)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out="$here/captures"
case "${1:-}" in
  -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  --out) out=${2:?--out needs a directory}; shift 2 ;;
  "") ;;
  *) echo "make_error_captures.sh: unknown argument $1" >&2; exit 2 ;;
esac

if [ -e /proc/driver/nvidia/version ]; then
  echo "make_error_captures.sh: this machine has an NVIDIA driver; the rc 9 / rc 12 captures need a machine without one" >&2
  exit 3
fi
src=""
for f in /etc/apt/sources.list.d/*.sources; do
  if [ -e "$f" ]; then src=$f; break; fi
done
if [ -z "$src" ]; then
  echo "make_error_captures.sh: no deb822 apt source in /etc/apt/sources.list.d/*.sources (Debian 12 layout needed)" >&2
  exit 3
fi
mirror=$(awk '/^URIs:/ {print $2; exit}' "$src")
keyring=$(awk '/^Signed-By:/ {print $2; exit}' "$src")

# Run as root, the binary (through libnvidia-ml) creates the /dev/nvidia* device
# nodes it misses; remove the ones that were not there before.
before=$(ls -1 /dev/nvidia* 2>/dev/null || true)
d=$(mktemp -d)
cleanup() {
  rm -rf "$d"
  for n in /dev/nvidia*; do
    [ -c "$n" ] || continue
    grep -qxF "$n" <<<"$before" || rm -f "$n"
  done
}
trap cleanup EXIT
mkdir -p "$d/parts" "$d/lists/partial" "$d/cache/archives/partial" "$d/pkg"
: > "$d/empty.list"
printf 'Types: deb\nURIs: %s\nSuites: bookworm\nComponents: non-free\nSigned-By: %s\n' \
  "$mirror" "$keyring" > "$d/parts/non-free.sources"
A=(-o "Dir::Etc::SourceList=$d/empty.list" -o "Dir::Etc::SourceParts=$d/parts"
   -o "Dir::State::Lists=$d/lists" -o "Dir::Cache=$d/cache" -o "APT::Sandbox::User=root")
apt-get "${A[@]}" -qq update
(cd "$d" && apt-get "${A[@]}" -qq download nvidia-smi libnvidia-ml1)
for f in "$d"/*.deb; do dpkg -x "$f" "$d/pkg"; done
smi="$d/pkg/usr/lib/nvidia/current/nvidia-smi"
lib="$d/pkg/usr/lib/x86_64-linux-gnu/nvidia/current"
[ -x "$smi" ] || { echo "make_error_captures.sh: $smi missing from the package" >&2; exit 1; }

py=python3
[ -x "$here/../../.venv/bin/python" ] && py="$here/../../.venv/bin/python"
"$py" "$here/kit.py" capture-errors --smi "$smi" --lib "$lib" --out "$out"
