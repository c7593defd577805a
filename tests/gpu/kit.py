"""Helper commands of the GPU kit (run.sh and make_error_captures.sh call these).

``kit.py detect``
    Print the ``nvidia-smi -L`` verdict as JSON; exit 0 with a GPU, 3 without.
``kit.py capture-errors --smi PATH --lib DIR [--out DIR]``
    Run every query the collection makes with the real nvidia-smi binary on a
    machine without an NVIDIA driver: once without the library (rc 12) and
    once with ``LD_LIBRARY_PATH=DIR`` (rc 9). Writes ``no-library-*.txt`` and
    ``no-driver-*.txt`` plus their manifest entries (default
    ``tests/gpu/captures``). A capture whose exit code is not the expected
    one is not written (for example on a machine that has a driver).
``kit.py merge-captures DIR``
    Merge the captures of a real run made elsewhere (``<out>/captures`` brought
    back from a GPU machine) into ``tests/gpu/captures``: files are copied and
    manifest entries replaced by file name. Simulator captures are refused.
``kit.py queries``
    Print the command lines the kit captures (derived from gpu_query).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpukit import CAPTURES_DIR  # noqa: E402 - after tests/gpu is put on sys.path
from gpukit import gpu as G  # noqa: E402 - after tests/gpu is put on sys.path
from gpukit import queries as Q  # noqa: E402 - after tests/gpu is put on sys.path
from mask import Masker  # noqa: E402 - after tests/gpu is put on sys.path

EXPECTED = {"no-library": 12, "no-driver": 9}


def binary_version(smi):
    """``535.261.03`` from the binary's ``-h`` banner (works without a driver), or None."""
    try:
        out = subprocess.run([smi, "-h"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30,
                             check=False).stdout.decode("utf-8", "replace")
    except OSError:
        return None
    for token in out.split():
        token = token.lstrip("v")
        if token.count(".") == 2 and token.replace(".", "").isdigit():
            return token
    return None


def cmd_capture_errors(a):
    queries = Q.collection_queries("nvidia-smi")
    masker = Masker()
    version = binary_version(a.smi)
    base = dict(os.environ)
    base.pop("LD_LIBRARY_PATH", None)
    rc_all = 0
    for source, lib in (("no-library", None), ("no-driver", a.lib)):
        env = dict(base)
        if lib:
            env["LD_LIBRARY_PATH"] = lib
        caps = Q.capture(queries, env=env, state=None, nvidia_smi=a.smi)
        good = [c for c in caps if c["rc"] == EXPECTED[source]]
        bad = [c for c in caps if c["rc"] != EXPECTED[source]]
        for c in bad:
            sys.stderr.write("kit.py: %s %s gave rc %s, expected %d; not written: %s\n" % (
                source, c["slug"], c["rc"], EXPECTED[source], (c["stdout"] or c["stderr"]).strip()[:200]))
            rc_all = 1
        meta = {"source_kind": "real-binary-without-gpu", "binary": "nvidia-smi %s (Debian bookworm non-free "
                "packages nvidia-smi and libnvidia-ml1)" % (version or "?"), "binary_version": version,
                "model": None, "gpu_count": 0,
                "captured_with": "tests/gpu/make_error_captures.sh"}
        written = Q.write_captures(good, a.out, source, masker, meta)
        sys.stdout.write("%s: %d captures written to %s (rc %d)\n" % (source, len(written), a.out, EXPECTED[source]))
    return rc_all


def cmd_merge_captures(a):
    import shutil
    src = Q.load_manifest(a.dir)["captures"]
    real = [e for e in src if e.get("source_kind") in ("real-gpu", "real-binary-without-gpu")]
    for e in src:
        if e not in real:
            sys.stderr.write("kit.py: not merging %s (source_kind %r)\n" % (e["file"], e.get("source_kind")))
    masker = Masker(hostnames=[], homes=[])
    for e in real:
        text = Q.read_capture(e, a.dir)
        leaks = masker.leaks(text)
        if leaks or not e.get("masked"):
            sys.stderr.write("kit.py: %s is not masked (%s); nothing merged\n" % (e["file"], leaks))
            return 1
    manifest = Q.load_manifest(a.out)
    names = set(e["file"] for e in real)
    for e in real:
        shutil.copyfile(os.path.join(a.dir, e["file"]), os.path.join(a.out, e["file"]))
    manifest["captures"] = sorted([e for e in manifest["captures"] if e["file"] not in names] + real,
                                  key=lambda e: e["file"])
    with open(os.path.join(a.out, Q.MANIFEST), "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, indent=1, sort_keys=True)
        fh.write("\n")
    sys.stdout.write("merged %d captures into %s\n" % (len(real), a.out))
    return 0 if real else 1


def cmd_detect(a):
    info = G.detect()
    sys.stdout.write(json.dumps(info.to_dict(), indent=1) + "\n")
    return 0 if info.ok else 3


def cmd_queries(a):
    for q in Q.collection_queries("nvidia-smi"):
        sys.stdout.write("%-40s %s\n" % (q.slug, " ".join(q.argv)))
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(prog="kit.py", description="GPU kit helper commands")
    sub = p.add_subparsers(dest="cmd")
    sub.required = True
    s = sub.add_parser("capture-errors", help="golden rc 9 / rc 12 captures from the real binary")
    s.add_argument("--smi", required=True, help="path of the real nvidia-smi binary")
    s.add_argument("--lib", required=True, help="directory holding libnvidia-ml.so.1")
    s.add_argument("--out", default=CAPTURES_DIR)
    s.set_defaults(fn=cmd_capture_errors)
    s = sub.add_parser("merge-captures", help="merge <out>/captures of a real run into tests/gpu/captures")
    s.add_argument("dir")
    s.add_argument("--out", default=CAPTURES_DIR)
    s.set_defaults(fn=cmd_merge_captures)
    s = sub.add_parser("detect", help="is there a GPU (nvidia-smi -L)")
    s.set_defaults(fn=cmd_detect)
    s = sub.add_parser("queries", help="list the captured command lines")
    s.set_defaults(fn=cmd_queries)
    a = p.parse_args(argv)
    return a.fn(a)


if __name__ == "__main__":
    sys.exit(main())
