# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Resolve SGLang server arguments with the node's own SGLang, without touching a GPU.

A standalone script. ``oracle.py`` runs it in a separate process with the
interpreter of the node's SGLang (``python - < this file``, or as a file); it
reads one JSON request on stdin and writes one JSON answer on stdout. The
module level uses the standard library only; sglang and torch are imported
inside ``main`` after the guards below are in place.

It does what the launcher does (docs/reference/sglang-rules.md §1): the
release's own argparse and ``ServerArgs`` (``prepare_server_args(argv)``; up to
0.5.10 the dataclass resolves in ``__post_init__``), then ``resolve_once()``
where it exists (0.5.23), then ``check_server_args()``.

Request::

    {"argv": [...]} or {"requests": [{"argv": [...], "env": {...}}, ...]},
    "gpu": {"name", "compute_capability", "memory_mib", "count"},
    "env": {...}  (applied to os.environ around each resolution)

A batch resolves each request in a child forked after the import, so that the
import is paid once and no request sees another one's state.

Answer (for one ``argv``; a batch gets ``results``, one such dict per request)::

    {"ok", "sglang_version", "args": {field: JSON-safe value}, "warnings": [line],
     "error": {"type", "message"} or null, "cuda_guard": [blocked call], "import_s", "resolve_s"}

The GPU is never touched:

* ``CUDA_VISIBLE_DEVICES`` is set to the empty string before torch is
  imported, so a stray CUDA call finds no device and cannot create a context;
* the ``torch.cuda`` queries resolution makes (``is_available``,
  ``device_count``, ``get_device_capability``, ``get_device_name``,
  ``get_device_properties``, ``mem_get_info``, ``current_device``,
  ``is_initialized``) are answered from the ``gpu`` facts;
* ``torch.cuda.init`` and ``torch.cuda._lazy_init`` raise and are recorded in
  ``cuda_guard`` (a test asserts it stays empty);
* older releases run ``nvidia-smi --query-gpu=memory.total``: that call is
  answered from the facts too (no process is started); any other nvidia-smi
  call goes to the node's real nvidia-smi, which only reads.

No file is written: HOME and the XDG cache point to a temporary directory
(0.5.23 creates ``~/.cache/sglang/inductor`` at import), removed at exit.
"""
from __future__ import annotations

import json
import logging
import math
import os
import shutil
import sys
import tempfile
import time
import traceback
import warnings

GUARD_TRIPS = []
_SMI_MEMORY_QUERY = "--query-gpu=memory.total"


def _json_safe(value, depth=0):
    """``value`` as JSON types: enums by value, paths and unknown objects by str."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if depth > 6:
        return str(value)
    if isinstance(value, dict):
        return dict((str(k), _json_safe(v, depth + 1)) for k, v in value.items())
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [_json_safe(v, depth + 1) for v in value]
        return sorted(items, key=repr) if isinstance(value, (set, frozenset)) else items
    inner = getattr(value, "value", None)
    if inner is not None and type(value).__module__ != "builtins" and hasattr(type(value), "__members__"):
        return _json_safe(inner, depth + 1)
    return str(value)


class _Capture(logging.Handler):
    """Collects every log record's message (the lines SGLang prints while resolving)."""

    def __init__(self):
        logging.Handler.__init__(self, level=logging.DEBUG)
        self.lines = []

    def emit(self, record):
        try:
            message = record.getMessage()
        except Exception:  # a broken format string must not lose the record
            message = str(record.msg)
        if record.levelno >= logging.INFO:
            self.lines.append(message)


def _gpu_facts(raw):
    raw = raw or {}
    capability = str(raw.get("compute_capability") or "9.0")
    major, _sep, minor = capability.partition(".")
    return {
        "name": str(raw.get("name") or "NVIDIA H200"),
        "major": int(major or 9),
        "minor": int(minor or 0),
        "memory_mib": int(raw.get("memory_mib") or 143771),
        "count": int(raw.get("count") or 1),
    }


def _blocked(name):
    def refuse(*_args, **_kwargs):
        GUARD_TRIPS.append(name)
        raise RuntimeError("the SGLang oracle never initialises CUDA (%s was called)" % name)
    return refuse


def install_cuda_guard(torch, gpu):
    """Answer torch.cuda's queries from ``gpu`` and refuse any CUDA initialisation."""
    cuda = torch.cuda

    class _Props(object):
        def __init__(self):
            self.name = gpu["name"]
            self.major = gpu["major"]
            self.minor = gpu["minor"]
            self.total_memory = gpu["memory_mib"] * 1024 * 1024
            self.multi_processor_count = 132
            self.is_integrated = False

    def device_count():
        return gpu["count"]

    cuda.is_available = lambda: gpu["count"] > 0
    cuda.device_count = device_count
    cuda.get_device_capability = lambda device=None: (gpu["major"], gpu["minor"])
    cuda.get_device_name = lambda device=None: gpu["name"]
    cuda.get_device_properties = lambda device=None: _Props()
    cuda.mem_get_info = lambda device=None: (gpu["memory_mib"] * 1024 * 1024, gpu["memory_mib"] * 1024 * 1024)
    cuda.current_device = lambda: 0
    cuda.is_initialized = lambda: False
    cuda.init = _blocked("torch.cuda.init")
    cuda._lazy_init = _blocked("torch.cuda._lazy_init")
    if getattr(torch.version, "cuda", None) is None:
        # A CPU build of torch (the differential test): SGLang tests torch.version.cuda
        # to tell a CUDA platform; a node's CUDA build has its own value.
        torch.version.cuda = "12.9"


def _torch_facade():
    import types

    torch = types.ModuleType("torch")
    torch.cuda = types.ModuleType("torch.cuda")
    torch.version = types.SimpleNamespace(cuda=None)
    torch.__oracle_facade__ = True
    sys.modules["torch"] = torch
    sys.modules["torch.cuda"] = torch.cuda
    return torch


def install_smi_answer(gpu):
    """Answer ``nvidia-smi --query-gpu=memory.total`` from the facts, without a process."""
    import subprocess

    real_run = subprocess.run

    def run(args, *pos, **kwargs):
        argv = list(args) if isinstance(args, (list, tuple)) else None
        if argv and os.path.basename(str(argv[0])) == "nvidia-smi" and _SMI_MEMORY_QUERY in argv:
            text = "\n".join([str(gpu["memory_mib"])] * gpu["count"]) + "\n"
            out = text if kwargs.get("text") or kwargs.get("universal_newlines") or kwargs.get("encoding") \
                else text.encode()
            return subprocess.CompletedProcess(argv, 0, out, "" if isinstance(out, str) else b"")
        check = kwargs.pop("check", False)
        # SGLang's own subprocess.run, called for SGLang inside its interpreter (no Ansible module here).
        return real_run(args, *pos, check=check, **kwargs)  # pylint: disable=ansible-bad-function

    subprocess.run = run


class _Env(object):
    """Set environment variables for one resolution and restore them after."""

    def __init__(self, env):
        self.env = dict((str(k), str(v)) for k, v in (env or {}).items())
        self.saved = {}

    def __enter__(self):
        for key, value in self.env.items():
            self.saved[key] = os.environ.get(key)
            os.environ[key] = value
        return self

    def __exit__(self, *exc):
        for key, value in self.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        return False


def _fields(server_args):
    """Every resolved field, JSON-safe (0.5.23: resolved_dict(); before: the dataclass fields)."""
    if hasattr(server_args, "resolved_dict"):
        values = server_args.resolved_dict()
    else:
        import dataclasses

        values = dict((f.name, getattr(server_args, f.name, None)) for f in dataclasses.fields(server_args))
    return dict((name, _json_safe(value)) for name, value in values.items())


def _argparse_message(stderr_text):
    lines = [line for line in stderr_text.splitlines() if line.strip()]
    for line in reversed(lines):
        if ": error: " in line:
            return line.split(": error: ", 1)[1]
    return lines[-1] if lines else "argparse rejected the arguments"


def resolve_one(argv, env, capture):
    """Parse and resolve ``argv`` as the launcher does; returns the answer dict."""
    from sglang.srt import server_args as sa_module

    capture.lines = []
    started = time.time()
    answer = {"ok": False, "args": None, "warnings": [], "error": None}
    guard_before = len(GUARD_TRIPS)
    with _Env(env), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stderr = sys.stderr
        sys.stderr = _StderrTap(stderr)
        try:
            try:
                server_args = sa_module.prepare_server_args(list(argv))
            except SystemExit as exc:
                answer["error"] = {"type": "ArgumentError", "message": _argparse_message(sys.stderr.text()),
                                   "exit": exc.code}
                server_args = None
            if server_args is not None:
                if hasattr(server_args, "resolve_once"):
                    server_args.resolve_once()
                server_args.check_server_args()
                answer["args"] = _fields(server_args)
                answer["ok"] = True
        except Exception as exc:  # SGLang refused the arguments: that is the answer
            answer["error"] = {"type": type(exc).__name__, "message": str(exc),
                               "where": _where(exc), "trace": _trace(exc)}
        finally:
            sys.stderr = stderr
        answer["warnings"] = list(capture.lines) + [
            str(w.message) for w in caught if "sglang" in str(getattr(w, "filename", "")).replace("\\", "/")]
    answer["cuda_guard"] = GUARD_TRIPS[guard_before:]
    answer["resolve_s"] = round(time.time() - started, 4)
    return answer


def _warm_up(items, capture):
    """Resolve a plain config once in the parent: the modules SGLang imports lazily on its first
    resolution are then imported once, not again in every forked child."""
    for item in items:
        argv = list(item.get("argv") or [])
        if "--model-path" in argv[:-1]:
            resolve_one(["--model-path", argv[argv.index("--model-path") + 1]], None, capture)
            return


def _isolated(item, capture):
    """Resolve one request of a batch in a forked child, so that no state of one resolution
    (SGLang's caches, its runtime context, environment overrides) reaches the next one."""
    if not hasattr(os, "fork"):
        return resolve_one(item.get("argv") or [], item.get("env"), capture)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: resolve, write the answer, leave without cleanup handlers
        os.close(read_fd)
        try:
            data = json.dumps(resolve_one(item.get("argv") or [], item.get("env"), capture), default=str).encode()
        except BaseException as exc:  # never let the child run the parent's code after this point
            data = json.dumps({"ok": False, "args": None, "warnings": [], "cuda_guard": list(GUARD_TRIPS),
                               "error": {"type": type(exc).__name__, "message": str(exc)}}).encode()
        view = memoryview(data)
        while view:
            view = view[os.write(write_fd, view):]
        os.close(write_fd)
        os._exit(0)
    os.close(write_fd)
    chunks = []
    while True:
        chunk = os.read(read_fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read_fd)
    _pid, status = os.waitpid(pid, 0)
    try:
        return json.loads(b"".join(chunks).decode())
    except ValueError:
        return {"ok": False, "args": None, "warnings": [], "cuda_guard": [],
                "error": {"type": "OracleChildDied", "message": "the resolution process ended with status %s" % status}}


def _where(exc):
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        if "sglang" in frame.filename:
            path = frame.filename.replace("\\", "/")
            return "%s:%s" % (path.split("/sglang/", 1)[-1], frame.lineno)
    return None


def _trace(exc, frames=8):
    out = []
    for frame in traceback.extract_tb(exc.__traceback__)[-frames:]:
        path = frame.filename.replace("\\", "/")
        out.append("%s:%s %s" % (path.split("/sglang/", 1)[-1], frame.lineno, frame.name))
    return out


class _StderrTap(object):
    """stderr that also keeps what argparse writes (its error line)."""

    def __init__(self, real):
        self.real = real
        self.parts = []

    def write(self, text):
        self.parts.append(text)
        return len(text)

    def flush(self):
        return None

    def text(self):
        return "".join(self.parts)


def main():
    request = json.loads(sys.stdin.read() or "{}")
    gpu = _gpu_facts(request.get("gpu"))
    home = tempfile.mkdtemp(prefix="sglang-oracle-")
    saved_stdout = os.dup(1)
    out = os.fdopen(saved_stdout, "w")
    # Everything SGLang prints goes to stderr; stdout carries the answer only.
    os.dup2(2, 1)
    try:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        os.environ["HOME"] = home
        os.environ["XDG_CACHE_HOME"] = os.path.join(home, ".cache")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        for key, value in (request.get("env") or {}).items():
            os.environ[str(key)] = str(value)
        capture = _Capture()
        real_handle = logging.Logger.handle

        def handle(logger_self, record):
            # Every record any logger handles is kept, whatever handlers SGLang
            # installs or removes (basicConfig(force=True) drops the root's).
            if not logger_self.disabled:
                capture.emit(record)
            return real_handle(logger_self, record)

        logging.Logger.handle = handle
        started = time.time()
        try:
            try:
                import torch
            except ImportError:
                # No torch, so no CUDA: an SGLang without torch (the simulator's fake) still
                # asks torch.cuda for the GPU; it gets the facts from a stand-in module.
                torch = _torch_facade()
            install_cuda_guard(torch, gpu)
            install_smi_answer(gpu)
            import sglang
            from sglang.srt import server_args  # noqa: F401 - the import whose cost is reported

            try:  # 0.5.23 imports its resolution pipeline lazily: count it as import, not as the first config
                __import__("sglang.srt.arg_groups.pipeline")
            except ImportError:
                pass

            version = getattr(sglang, "__version__", None)
        except Exception as exc:
            answer = {"ok": False, "import_error": {"type": type(exc).__name__, "message": str(exc)},
                      "import_s": round(time.time() - started, 3), "python": sys.executable}
            out.write(json.dumps(answer))
            return 3
        import_s = round(time.time() - started, 3)
        if "requests" in request:
            results = []
            _warm_up(request["requests"], capture)
            for item in request["requests"]:
                results.append(_isolated(item, capture))
            answer = {"ok": True, "results": results}
        else:
            answer = resolve_one(request.get("argv") or [], None, capture)
        answer.update({"sglang_version": version, "import_s": import_s, "python": sys.executable,
                       "gpu": gpu, "cuda_guard_total": list(GUARD_TRIPS)})
        out.write(json.dumps(answer, default=str))
        return 0
    finally:
        out.flush()
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
