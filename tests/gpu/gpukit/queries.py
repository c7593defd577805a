"""The nvidia-smi command lines the collection runs, their captures and the manifest.

The list is *derived* from ``gpu_query.NvidiaSmiBackend.query_gpu_argv()``
and ``query_apps_argv()`` (so it follows the collection when it changes),
plus the variants a user or a newer collection could hit: every
``--format`` combination of ``csv``/``noheader``/``nounits``, the fallback
query without ``memory.reserved`` (drivers before R510), ``-i 0``, and ``-L``.

Capture files live in ``tests/gpu/captures/`` and are named
``<source>-<state>-<query-slug>.txt`` (see ``capture_name``):

* ``<source>``: the GPU model as a slug for a real GPU (``h200``,
  ``h100-80gb-hbm3``) or the failure for the real binary without a GPU
  (``no-driver`` = rc 9, ``no-library`` = rc 12);
* ``<state>``: ``idle`` (nothing running), ``busy`` (the kit's CUDA holder
  runs on GPU 0); absent for the failure captures;
* ``<query-slug>``: e.g. ``query-gpu_csv-nounits``, ``query-apps_csv-noheader``,
  ``query-gpu-noreserved_csv-nounits``, ``query-gpu_csv-nounits_i0``, ``list-gpus``.

Each file holds the exact stdout (masked, see ``mask.py``); ``manifest.json``
holds argv, rc, stderr and where the capture came from.
"""
from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import time

from . import CAPTURES_DIR, gpu_query

FORMAT_VARIANTS = (("csv",), ("csv", "noheader"), ("csv", "nounits"), ("csv", "noheader", "nounits"))
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
C_LOCALE = {"LC_ALL": "C", "LANG": "C", "LANGUAGE": "C"}
KINDS = ("query-gpu", "query-apps", "list")


class Query(object):
    """One nvidia-smi command line: ``slug``, ``argv``, ``kind``, ``fields``, ``fmt``, ``select``."""

    def __init__(self, slug, argv, kind, fields=(), fmt=(), select=None):
        self.slug = slug
        self.argv = list(argv)
        self.kind = kind
        self.fields = tuple(fields)
        self.fmt = tuple(fmt)
        self.select = select

    def __repr__(self):
        return "Query(%r, %r)" % (self.slug, self.argv)

    def to_dict(self):
        return {"slug": self.slug, "argv": self.argv, "kind": self.kind, "fields": list(self.fields),
                "format": list(self.fmt), "select": self.select}


def describe_argv(argv):
    """``(kind, fields, fmt, select)`` read back from an nvidia-smi argv."""
    kind, fields, fmt, select = None, (), (), None
    args = list(argv[1:])
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("--query-gpu="):
            kind, fields = "query-gpu", tuple(f for f in a.split("=", 1)[1].split(",") if f)
        elif a.startswith("--query-compute-apps="):
            kind, fields = "query-apps", tuple(f for f in a.split("=", 1)[1].split(",") if f)
        elif a.startswith("--format="):
            fmt = tuple(m for m in a.split("=", 1)[1].split(",") if m)
        elif a in ("-i", "--id") and i + 1 < len(args):
            select = args[i + 1]
            i += 1
        elif a.startswith("--id="):
            select = a.split("=", 1)[1]
        elif a in ("-L", "--list-gpus"):
            kind = "list"
        i += 1
    return kind, fields, fmt, select


def with_format(argv, fmt):
    """``argv`` with its ``--format=`` replaced by ``fmt`` (a tuple of modifiers)."""
    out = [a for a in argv if not a.startswith("--format=")]
    out.append("--format=" + ",".join(fmt))
    return out


def query_slug(argv):
    kind, fields, fmt, select = describe_argv(argv)
    if kind == "list":
        slug = "list-gpus"
    else:
        base = "query-gpu" if kind == "query-gpu" else "query-apps"
        if kind == "query-gpu" and "memory.reserved" not in fields:
            base += "-noreserved"
        slug = base + "_" + "-".join(fmt)
    if select is not None:
        slug += "_i" + re.sub(r"[^A-Za-z0-9]+", "-", select)
    return slug


def _query(argv):
    kind, fields, fmt, select = describe_argv(argv)
    return Query(query_slug(argv), argv, kind, fields, fmt, select)


def collection_queries(nvidia_smi="nvidia-smi"):
    """Every command line to capture, derived from the collection's backend."""
    gq = gpu_query()
    backend = gq.NvidiaSmiBackend(runner=None, nvidia_smi=nvidia_smi)
    base_gpu = backend.query_gpu_argv()
    base_apps = backend.query_apps_argv()
    backend.gpu_fields = gq.GPU_FIELDS_NO_RESERVED
    no_reserved = backend.query_gpu_argv()
    collection_fmt = describe_argv(base_gpu)[2]
    queries = []
    for base in (base_gpu, base_apps):
        for fmt in FORMAT_VARIANTS:
            queries.append(_query(with_format(base, fmt)))
    queries.append(_query(no_reserved))
    queries.append(_query(list(base_gpu) + ["-i", "0"]))
    queries.append(_query(list(base_apps) + ["-i", "0"]))
    queries.append(_query([nvidia_smi, "-L"]))
    seen = set()
    unique = []
    for q in queries:
        if q.slug not in seen:
            seen.add(q.slug)
            unique.append(q)
    assert any(q.argv == base_gpu for q in unique) and any(q.argv == base_apps for q in unique)
    assert collection_fmt, "the collection's query has no --format"
    return unique


def collection_argvs(nvidia_smi="nvidia-smi"):
    """The two command lines the collection itself runs per snapshot."""
    backend = gpu_query().NvidiaSmiBackend(runner=None, nvidia_smi=nvidia_smi)
    return [backend.query_gpu_argv(), backend.query_apps_argv()]


def busy_queries(queries):
    """The subset worth capturing again while a process holds memory."""
    return [q for q in queries if q.kind in ("query-gpu", "query-apps") and q.select is None
            and "noreserved" not in q.slug]


# ---------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------

def run_argv(argv, env=None, timeout=60):
    """``(rc, stdout, stderr, seconds)`` under the C locale; argv[0] is found on env's PATH."""
    full_env = dict(os.environ if env is None else env)
    full_env.update(C_LOCALE)
    start = time.monotonic()
    try:
        proc = subprocess.run(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=full_env,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        return 124, (exc.stdout or b"").decode("utf-8", "replace"), "timed out after %s s" % timeout, \
            time.monotonic() - start
    except OSError as exc:
        return 127, "", str(exc), time.monotonic() - start
    return (proc.returncode, proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace"),
            time.monotonic() - start)


def capture(queries, env=None, state="idle", timeout=60, nvidia_smi=None, runner=None):
    """Run each query; returns capture dicts (unmasked).

    ``nvidia_smi`` replaces argv[0] when running (the recorded argv keeps
    the plain ``nvidia-smi``). ``runner(argv) -> (rc, stdout, stderr)``
    replaces the subprocess (the self-tests call the simulator in-process).
    """
    out = []
    for q in queries:
        argv = list(q.argv)
        if nvidia_smi:
            argv[0] = nvidia_smi
        if runner is not None:
            start = time.monotonic()
            rc, stdout, stderr = runner(argv)
            seconds = time.monotonic() - start
        else:
            rc, stdout, stderr, seconds = run_argv(argv, env=env, timeout=timeout)
        rec = q.to_dict()
        rec["argv"] = ["nvidia-smi"] + list(q.argv[1:])
        rec.update({"state": state, "rc": rc, "stdout": stdout, "stderr": stderr, "seconds": round(seconds, 4)})
        out.append(rec)
    return out


# ---------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------

def model_slug(name):
    """``'NVIDIA H100 80GB HBM3'`` -> ``'h100-80gb-hbm3'``; ``'NVIDIA H200'`` -> ``'h200'``."""
    text = re.sub(r"^nvidia\s+", "", (name or "unknown").strip(), flags=re.IGNORECASE)
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def capture_name(source, state, slug):
    return "-".join(p for p in (source, state, slug) if p) + ".txt"


def load_manifest(directory=CAPTURES_DIR):
    path = os.path.join(directory, MANIFEST)
    if not os.path.exists(path):
        return {"format": MANIFEST_FORMAT, "captures": []}
    with open(path, "r", encoding="utf-8") as fh:
        data = json.load(fh)
    data.setdefault("captures", [])
    return data


def write_captures(captures, directory, source, masker, meta=None):
    """Write masked stdout files and merge their entries into ``manifest.json``.

    Entries with the same file name are replaced. Returns the new entries.
    """
    os.makedirs(directory, exist_ok=True)
    manifest = load_manifest(directory)
    entries = []
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    for rec in captures:
        name = capture_name(source, rec.get("state") if source not in ("no-driver", "no-library") else None,
                            rec["slug"])
        with open(os.path.join(directory, name), "w", encoding="utf-8", newline="") as fh:
            fh.write(masker.mask(rec["stdout"]))
        entry = {
            "file": name,
            "source": source,
            "slug": rec["slug"],
            "kind": rec["kind"],
            "state": rec.get("state") if source not in ("no-driver", "no-library") else None,
            "argv": rec["argv"],
            "fields": rec.get("fields", []),
            "format": rec.get("format", []),
            "select": rec.get("select"),
            "rc": rec["rc"],
            "stderr": masker.mask(rec.get("stderr") or ""),
            "captured_at": stamp,
            "masked": True,
        }
        entry.update(masker.mask_obj(dict(meta or {})))
        entries.append(entry)
    names = set(e["file"] for e in entries)
    kept = [e for e in manifest["captures"] if e.get("file") not in names]
    manifest["format"] = MANIFEST_FORMAT
    manifest["naming"] = ("<source>-<state>-<query-slug>.txt; source: GPU model slug, or no-driver (rc 9) / "
                          "no-library (rc 12) for the real binary without a GPU; state: idle or busy; "
                          "see tests/gpu/README.md")
    manifest["captures"] = sorted(kept + entries, key=lambda e: e["file"])
    tmp = os.path.join(directory, MANIFEST + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, indent=1, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, os.path.join(directory, MANIFEST))
    return entries


def read_capture(entry, directory=CAPTURES_DIR):
    with open(os.path.join(directory, entry["file"]), "r", encoding="utf-8", newline="") as fh:
        return fh.read()
