"""Import-only stand-ins for compiled CUDA packages, for the differential test.

SGLang's ``server_args`` imports modules that pull in packages built for CUDA
(triton, sgl_kernel, flashinfer, ...). On the CPU test machine they either do
not exist for a CPU torch or fail to load. Argument resolution never *calls*
them: it only needs ``import x`` and ``from x import y`` to succeed at module
level (decorators such as ``@triton.jit`` are applied at import). So each name
in STANDINS, when the real package cannot be imported, becomes a module whose
every attribute is a permissive placeholder: callable (a decorator call
returns the decorated function unchanged), subscriptable, iterable as empty,
usable as a base class; CamelCase names are real classes (torch itself tests
isinstance against triton's JITFunction). Called with no argument it raises RuntimeError, as
the real device queries do on a machine without a GPU. ``__version__`` is a plain version string.

This file is put on PYTHONPATH only by tests/differential (never on a node);
``python -S`` would skip it. The torch.cuda queries are answered by the
oracle helper itself, not here.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

# Why each exists: none of these has a build that loads next to the CPU build of torch 2.13.0.
STANDINS = {
    "triton": "3.5.0",            # GPU kernel compiler; imported at module level by srt/utils/common.py
    "sgl_kernel": "0.3.0",        # SGLang's CUDA kernels
    "sglang_kernel": "0.4.10",    # its new name (0.5.23)
    "flashinfer": "0.7.2",        # CUDA attention kernels
    "torchvision": "0.24.0",      # PyPI's build fails to load beside the CPU torch ('torchvision::nms')
    "vllm": "0.0.0",              # optional CUDA runtime some old quantization paths import
    "cuda": "13.0.0",             # cuda-python bindings
    "deep_gemm": "0.2.3",
    "deep_ep": "0.1.2",
    "flash_mla": "1.0.0",
    "tvm_ffi": "0.1.11",
    "tilelang": "0.1.12",
    "quack": "0.6.5",
    "humming": "0.1.12",
    "cutlass": "4.8.0",
    "flash_attn": "4.0.0",
    "torch_memory_saver": "0.0.9",
    "decord": "0.6.0",
}


class _Placeholder(object):
    """Anything: a function, a class, a constant, a decorator."""

    def __init__(self, name="placeholder"):
        self._name = name

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]) and not isinstance(args[0], _Placeholder):
            return args[0]  # used as a bare decorator
        if not args and not kwargs:
            # A query such as triton.runtime.driver.active.get_current_target(): the real
            # package raises without a GPU, and SGLang's callers expect that.
            raise RuntimeError("%s: stand-in package, no CUDA device here" % self._name)
        return _Placeholder(self._name + "()")

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Placeholder(self._name + "." + name)

    def __getitem__(self, key):
        return _Placeholder(self._name + "[]")

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False

    def __mro_entries__(self, bases):
        return (object,)

    def __repr__(self):
        return "<stand-in %s>" % self._name


class _StandinMeta(type):
    """Class attributes (``InterpolationMode.NEAREST_EXACT``) are placeholders too."""

    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Placeholder(cls.__name__ + "." + name)


class _StandinClass(object, metaclass=_StandinMeta):
    """Base of the class-like names (``JITFunction``, ``Config``): isinstance works, so does construction."""

    def __init__(self, *args, **kwargs):
        self._args = args

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Placeholder(type(self).__name__ + "." + name)


class _StandinModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        if name[:1].isupper() and not name.isupper():
            value = type(name, (_StandinClass,), {"__module__": self.__name__})
        else:
            value = _Placeholder("%s.%s" % (self.__name__, name))
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots):
        self.roots = roots

    def find_spec(self, fullname, path=None, target=None):
        root = fullname.split(".")[0]
        if root not in self.roots:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = _StandinModule(spec.name)
        module.__path__ = []
        module.__version__ = self.roots[spec.name.split(".")[0]]
        module.__standin__ = True
        return module

    def exec_module(self, module):
        return None


def _missing(name):
    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):
        return True


class _TorchShims(importlib.abc.MetaPathFinder):
    """After ``import torch``: names an older release calls that torch 2.13 no longer has.

    0.5.1 asks ``torch._C._cpu._is_amx_tile_supported()`` at import (its CPU-kernel
    check); torch 2.13 dropped it. The answer on this machine is irrelevant to
    argument resolution, so it is False.
    """

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec("torch")
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        real_exec = spec.loader.exec_module

        def exec_module(module):
            real_exec(module)
            cpu = getattr(module._C, "_cpu", None)
            if cpu is not None and not hasattr(cpu, "_is_amx_tile_supported"):
                cpu._is_amx_tile_supported = lambda: False

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _TorchShims())

_ROOTS = dict((name, version) for name, version in STANDINS.items() if _missing(name))
if _ROOTS:
    sys.meta_path.append(_Finder(_ROOTS))
