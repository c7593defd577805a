# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The server's JIT and compile caches, kept in one persistent directory (docs/reference/compile-caches.md).

SGLang, torch inductor, Triton, DeepGEMM, FlashInfer, TileLang and the CUDA driver each compile kernels on the first
start of a config and reuse them from a cache directory on the next. Left at their defaults, several of those land in
/tmp or under the service user's HOME, which PrivateTmp, a tmpfs /tmp, a missing HOME or a container's writable layer
throw away: every restart would compile again. :func:`cache_env` points each at a sub-directory of the configured
cache directory, leaving alone any variable the operator set in the server's env.
"""

from __future__ import annotations

import os
import time
from ansible_collections.gpufleet.sglang.plugins.module_utils.common.names import PLAIN

# (variable, sub-directory, what it holds). The sub-directory names are SGLang's own layout under SGLANG_CACHE_DIR
# (sglang/srt/environ.py, third_party_cache_defaults), except FlashInfer's, which gets a folder of its own.
CACHES = (
    ("SGLANG_CACHE_DIR", "", "SGLang's own caches: CuTe AOT objects, FlashInfer autotune results, P2P access table, "
                             "Rust extensions; and the default root of the ones below"),
    ("SGLANG_JIT_CACHE_DIR", "jit", "SGLang's JIT kernel builds (default ~/.cache/sglang/jit, which does not follow "
                                    "SGLANG_CACHE_DIR)"),
    ("SGLANG_DG_CACHE_DIR", "deep_gemm", "DeepGEMM JIT kernels (SGLang copies it to DG_JIT_CACHE_DIR)"),
    ("TORCHINDUCTOR_CACHE_DIR", "inductor", "torch.compile / inductor (default /tmp/torchinductor_<user>)"),
    ("TRITON_CACHE_DIR", "triton", "Triton kernels (default ~/.triton/cache)"),
    ("CUDA_CACHE_PATH", "nv", "the CUDA driver's PTX JIT cache (default ~/.nv/ComputeCache)"),
    ("TILELANG_CACHE_DIR", "tilelang", "TileLang kernels"),
    ("FLASHINFER_WORKSPACE_BASE", "flashinfer", "FlashInfer JIT modules (FlashInfer adds .cache/flashinfer to this base)"),
    ("TORCH_EXTENSIONS_DIR", "torch_extensions", "torch C++/CUDA extensions built at run time"),
)
# Variables whose SGLang default follows SGLANG_CACHE_DIR: an operator who sets SGLANG_CACHE_DIR keeps them there.
FOLLOW_SGLANG_CACHE_DIR = ("SGLANG_DG_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "CUDA_CACHE_PATH",
                           "TILELANG_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE")
GIB = 1024 ** 3


def cache_env(cache_dir, operator_env):
    """The variables to add to the server's env: ``(added, kept)``.

    ``added`` maps each cache variable to its directory under ``cache_dir``; ``kept`` lists the cache variables the
    operator set in the server env (never overridden). An operator's SGLANG_CACHE_DIR also keeps, where SGLang puts
    them, the caches that follow it. An empty ``cache_dir`` adds nothing.
    """
    operator_env = operator_env or {}
    if not cache_dir:
        return {}, []
    kept = [var for var, _sub, _what in CACHES if var in operator_env]
    added = {}
    for var, sub, _what in CACHES:
        if var in operator_env:
            continue
        if var in FOLLOW_SGLANG_CACHE_DIR and "SGLANG_CACHE_DIR" in operator_env:
            continue
        added[var] = os.path.join(cache_dir, sub) if sub else cache_dir
    return added, kept


def cache_dirs(cache_dir, added):
    """The directories to create (owned by the server's user): the cache directory, then one per added variable."""
    if not cache_dir:
        return []
    dirs = [cache_dir]
    for var, _sub, _what in CACHES:
        path = added.get(var)
        if path and path not in dirs:
            dirs.append(path)
    return dirs


def existing_ancestor(path):
    """``path`` or its nearest existing parent (the file system the caches will be on)."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def free_bytes(path):
    """Bytes an unprivileged user may still write on the file system of ``path`` (or of its nearest existing parent)."""
    st = os.statvfs(existing_ancestor(path))
    return st.f_bavail * st.f_frsize


def check_free(cache_dir, min_free_gb, var="cache_dir", min_var="cache_min_free_gb"):
    """``(free_bytes, problem)``: a problem text when the cache directory's file system has less than the minimum."""
    if not cache_dir:
        return None, None
    try:
        free = free_bytes(cache_dir)
    except OSError as exc:
        return None, "%s: cannot read the free space of %s: %s; fix the path or set %s: '' to leave SGLang's cache defaults" % (
            var, cache_dir, exc, var)
    if min_free_gb and free < float(min_free_gb) * GIB:
        return free, ("%s: the file system of %s has %.1f GiB free, less than %s (%s GiB) that the compile caches may need; "
                      "free some space there, point %s at a larger file system, or lower %s (0 turns the check off)"
                      % (var, existing_ancestor(cache_dir), free / float(GIB), min_var, _num(min_free_gb), var, min_var))
    return free, None


def _num(value):
    value = float(value)
    return str(int(value)) if value.is_integer() else str(value)


def tree_size(path, seconds=10.0):
    """``(bytes, files, complete)`` of the files under ``path`` (no symlinks followed); stops after ``seconds``."""
    total = files = 0
    deadline = time.monotonic() + seconds
    stack = [path]
    while stack:
        if time.monotonic() > deadline:
            return total, files, False
        current = stack.pop()
        try:
            entries = list(os.scandir(current))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
                    files += 1
            except OSError:
                continue
    return total, files, True


def describe(cache_dir, min_free_gb, operator_env, names=PLAIN):
    """The plan's ``cache`` entry: where each cache goes, what the operator kept, the current size and the free space."""
    added, kept = cache_env(cache_dir, operator_env)
    info = {"dir": cache_dir or "", "env": added, "kept": kept, "dirs": cache_dirs(cache_dir, added),
            "min_free_gb": min_free_gb, "free_bytes": None, "size_bytes": 0, "files": 0, "size_complete": True}
    if not cache_dir:
        return info, None
    free, problem = check_free(cache_dir, min_free_gb, names.of("cache_dir"), names.of("cache_min_free_gb"))
    info["free_bytes"] = free
    if os.path.isdir(cache_dir):
        info["size_bytes"], info["files"], info["size_complete"] = tree_size(cache_dir)
    return info, problem


def summary_line(info, names=PLAIN):
    """One plan line about the caches."""
    if not info.get("dir"):
        return "compile caches: SGLang's defaults (%s is empty)" % names.of("cache_dir")
    line = "compile caches: %s, %s%.2f GiB in %d file(s)" % (
        info["dir"], "" if info.get("size_complete", True) else "at least ", info["size_bytes"] / float(GIB), info["files"])
    if info.get("free_bytes") is not None:
        line += ", %.1f GiB free" % (info["free_bytes"] / float(GIB))
    if info.get("kept"):
        line += "; kept from %s: %s" % (names.of("env"), ", ".join(info["kept"]))
    return line
