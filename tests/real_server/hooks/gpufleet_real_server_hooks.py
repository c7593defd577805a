"""Test-only hooks of the real-server venv (.cache/real-server/venv), loaded by a .pth file.

``tests/real_server/real_env.py`` copies this module into the venv's site-packages and writes
``gpufleet-real-server.pth`` (one line: ``import gpufleet_real_server_hooks``), so every
Python process of that venv runs it at start-up: the server's main process and every child
it spawns (multiprocessing's spawn starts a fresh interpreter). It never goes on a node.

1. **Import-only stand-ins** for the CUDA-only packages that SGLang 0.5.23 imports on a
   CPU machine (``sgl_kernel``, ``flashinfer``, ``torchvision``): no build of them loads
   next to the CPU torch (``sglang-kernel`` ships only sm90/sm100 objects). A real
   ``import`` gets a dummy package; every attribute of it **refuses to be called**: the
   call is appended to ``$GPUFLEET_STANDIN_CALLS`` (a JSON line: pid, name, process title)
   and raises ``RuntimeError``, so a test that checks that file fails loudly if a stand-in
   is ever used on the serving path. ``importlib.util.find_spec`` (the availability probe of
   SGLang and transformers) answers ``None`` for them, as on a machine without them, and
   ``importlib.metadata`` finds no distribution. A test may name calls in ``$GPUFLEET_STANDIN_NOOP``
   that then return None instead (recorded all the same); no serving-path test does.

2. **The simulated GPUs** (only where ``GPUSIM_ROOT`` names a node): when a process takes
   the title ``sglang::scheduler...`` (SGLang's ``configure_scheduler_process``), it opens
   the node's device files (``/dev/nvidia<N>``, ``nvidiactl``, ``nvidia-uvm`` under
   ``$GPUSIM_ROOT/dev``) and registers ``mem_fraction_static x total`` MiB (the resolved
   value, 0.716 on the CPU) on its GPU
   (``gpu_id`` of the scheduler, through ``CUDA_VISIBLE_DEVICES``) with ``gpusim``, as a
   CUDA context and SGLang's static pool do: ``nvidia-smi`` then lists the real scheduler's
   PID, and the memory goes when that process dies. ``GPUFLEET_REAL_SERVER_GPU_MIB``
   overrides the amount. Not enough free memory: the scheduler raises
   ``torch.OutOfMemoryError`` ("CUDA out of memory. ...") as the real one would. gpusim is
   found beside the ``gpusim`` command on PATH (``simulator/bin``), or in
   ``$GPUFLEET_GPUSIM_PYTHONPATH``.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import shutil
import sys
import types

STANDINS = ("sgl_kernel", "flashinfer", "torchvision")
CALLS_ENV = "GPUFLEET_STANDIN_CALLS"
NOOP_ENV = "GPUFLEET_STANDIN_NOOP"  # comma-separated names a test lets return None (recorded all the same)


def _title() -> str:
    try:
        with open("/proc/self/cmdline", "rb") as fh:
            return fh.read().split(b"\0")[0].decode("utf-8", "replace")
    except OSError:
        return ""


def _record(name: str) -> None:
    path = os.environ.get(CALLS_ENV)
    if not path:
        return
    line = json.dumps({"pid": os.getpid(), "name": name, "title": _title()}) + "\n"
    try:
        with open(path, "a") as fh:
            fh.write(line)
    except OSError:
        pass


class StandinCalled(RuntimeError):
    """A stand-in of a CUDA-only package was called: the CPU serving path must never do that."""


class _Refusing(object):
    """Any attribute of a stand-in package: it can be named, imported and passed around, never called."""

    __slots__ = ("_standin_name",)

    def __init__(self, name):
        object.__setattr__(self, "_standin_name", name)

    def __call__(self, *args, **kwargs):
        name = object.__getattribute__(self, "_standin_name")
        _record(name)
        if name in os.environ.get(NOOP_ENV, "").split(","):
            return None  # a test named this call a no-op (it is still recorded)
        raise StandinCalled("%s was called, but it is an import-only stand-in: %s is not installed "
                            "(no CPU build exists)" % (name, name.split(".")[0]))

    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _Refusing(object.__getattribute__(self, "_standin_name") + "." + attr)

    def __bool__(self):
        return False

    def __repr__(self):
        return "<stand-in %s>" % object.__getattribute__(self, "_standin_name")


class _StandinModule(types.ModuleType):
    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        value = _Refusing("%s.%s" % (self.__name__, attr))
        setattr(self, attr, value)
        return value


def _is_standin(fullname) -> bool:
    return isinstance(fullname, str) and fullname.split(".")[0] in STANDINS


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers ``import sgl_kernel[.x]`` with a stand-in package (only where the real one is absent)."""

    def find_spec(self, fullname, path=None, target=None):
        if not _is_standin(fullname):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = _StandinModule(spec.name)
        module.__path__ = []
        module.__gpufleet_standin__ = True
        return module

    def exec_module(self, module):
        return None


_real_find_spec = importlib.util.find_spec


def find_spec(name, package=None):
    """``importlib.util.find_spec`` that does not see the stand-ins (an availability probe)."""
    resolved = importlib.util.resolve_name(name, package) if name.startswith(".") else name
    if _is_standin(resolved):
        return None
    return _real_find_spec(name, package)


find_spec.__doc__ = _real_find_spec.__doc__


def _install_standins() -> None:
    missing = []
    for root in STANDINS:
        if _real_find_spec(root) is None:
            missing.append(root)
    if len(missing) != len(STANDINS):
        # A real package is installed: that venv is not the one this module is for.
        raise ImportError("gpufleet real-server hooks: %s is installed; the stand-ins expect none of %s"
                          % (sorted(set(STANDINS) - set(missing)), ", ".join(STANDINS)))
    sys.meta_path.append(_Finder())
    importlib.util.find_spec = find_spec


# ---------------------------------------------------------------------------------------------
# The simulated GPUs


def _gpusim_node():
    extra = os.environ.get("GPUFLEET_GPUSIM_PYTHONPATH")
    if not extra:
        exe = shutil.which("gpusim")
        if exe:
            extra = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(exe))), "python")
    if extra and extra not in sys.path:
        sys.path.append(extra)
    from gpusim.node import Node  # noqa: the simulator's own API

    return Node.from_env()


_HELD = []  # device files and hold ids, kept for the process's lifetime


def _mem_fraction_static(server_args) -> float:
    """The resolved --mem-fraction-static: 0.5.23 publishes it in its runtime context before the scheduler
    takes its title (``get_schedule()``); older layouts keep it on ServerArgs."""
    try:
        from sglang.srt.runtime_context import get_schedule

        value = get_schedule().mem_fraction_static
    except Exception:  # noqa: BLE001 - another release's layout
        value = getattr(server_args, "mem_fraction_static", None)
    if not value:
        raise RuntimeError("gpufleet real-server hooks: no resolved mem_fraction_static in the scheduler; "
                           "set GPUFLEET_REAL_SERVER_GPU_MIB")
    return float(value)


def _hold_gpu(server_args, gpu_id) -> None:
    node = _gpusim_node()
    visible = node.resolve_visible(os.environ.get("CUDA_VISIBLE_DEVICES"))
    if gpu_id >= len(visible):
        raise RuntimeError("CUDA error: invalid device ordinal")
    index = visible[gpu_id]
    gpu = [g for g in node.gpus() if g["index"] == index][0]
    mib = os.environ.get("GPUFLEET_REAL_SERVER_GPU_MIB")
    if mib:
        mib = int(mib)
    else:
        mib = int(_mem_fraction_static(server_args) * gpu["total_mib"])
    for name in ("nvidia%d" % index, "nvidiactl", "nvidia-uvm"):
        _HELD.append(open(os.path.join(node.dev_dir, name), "rb"))
    from gpusim.node import OutOfMemory

    try:
        _HELD.append(node.hold(os.getpid(), [index], mib))
    except OutOfMemory as e:
        import torch

        raise torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate %.2f GiB. GPU %d has a total capacity of %.2f GiB of "
            "which %.2f GiB is free." % (e.requested_mib / 1024.0, gpu_id, e.total_mib / 1024.0,
                                         e.free_mib / 1024.0)) from None


def _on_title(title) -> None:
    if not str(title).startswith("sglang::scheduler") or not os.environ.get("GPUSIM_ROOT"):
        return
    frame = sys._getframe(2)  # configure_scheduler_process(server_args, gpu_id, ...)
    server_args = frame.f_locals.get("server_args")
    gpu_id = frame.f_locals.get("gpu_id")
    if gpu_id is None:
        raise RuntimeError("gpufleet real-server hooks: %s set outside configure_scheduler_process (%s)"
                           % (title, frame.f_code.co_name))
    _hold_gpu(server_args, int(gpu_id))


class _SetproctitleHook(importlib.abc.MetaPathFinder):
    """After ``import setproctitle``: its ``setproctitle()`` also takes the GPU (above)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "setproctitle":
            return None
        sys.meta_path.remove(self)
        spec = _real_find_spec("setproctitle")
        if spec is None or spec.loader is None:
            return spec
        real_exec = spec.loader.exec_module

        def exec_module(module):
            real_exec(module)
            real = module.setproctitle

            def setproctitle(title, *args, **kwargs):
                real(title, *args, **kwargs)
                _on_title(title)

            module.setproctitle = setproctitle

        spec.loader.exec_module = exec_module
        return spec


_install_standins()
sys.meta_path.insert(0, _SetproctitleHook())
