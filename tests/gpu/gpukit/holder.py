"""CUDA memory holder for the GPU kit (standalone script, standard library only).

Roles (``--role``):

``parent``
    Allocates ``--mib`` MiB on the first visible CUDA device (the caller
    sets ``CUDA_VISIBLE_DEVICES`` to the UUID of GPU 0), then

    * with ``--child-mib N``, starts a **child** with ``subprocess`` (a fresh
      ``exec`` of this script, like SGLang's ``sglang::scheduler_TP*``
      children, which multiprocessing starts with "spawn"): the child does
      its own ``cuInit`` and allocates N MiB. It is a CUDA process of its
      own and appears in ``--query-compute-apps``;
    * with ``--keeper``, **forks** a keeper *after* the allocation. CUDA does
      not allow a forked child to use the parent's context (no CUDA call is
      made in it), but the child inherits the open ``/dev/nvidia*``
      descriptors, exactly like forked data-loader workers
      (nvidia-smi.md section 3.2 b). It is usually *not* listed as a compute
      process, and may keep the parent's memory allocated after the parent
      dies. That is what the kit measures.

    Then it writes the ready file and waits for a signal.
``child``
    Allocates ``--mib`` MiB, writes the ready file, waits.
``decoy``
    Holds no GPU memory and never touches CUDA; its command line looks like
    the holders' (``holder.py``), so a name-based ``pkill -f`` would kill it
    while ``gpu_drain`` must not.
``nvml-decoy``
    A monitoring-agent look-alike: opens NVML (``pynvml``) when it can, else
    the control device, so it has ``/dev/nvidia*`` open but no CUDA context.
    ``gpu_drain`` must not touch it either.
``probe``
    Tries the allocator, allocates and frees 64 MiB, prints JSON, exits.

Allocators (``--allocator``): ``cuda`` (ctypes on ``libcuda.so.1``, which
comes with the driver: no pip needed), ``cupy``, ``torch``, ``gpusim`` (the
simulator: registers a hold with ``gpusim.node.Node.hold`` and opens
``$GPUSIM_ROOT/dev/nvidia*``), and ``auto`` = cuda, then cupy, then torch.

``--ignore-sigterm`` sets SIGTERM to SIG_IGN before allocating.
The ready file receives one JSON object (``{"ok": false, "error"}`` on failure,
then exit 3).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import time

MIB = 1024 * 1024


class AllocError(Exception):
    pass


def _uuid_text(raw):
    b = bytes(bytearray(raw))[:16]
    h = b.hex()
    return "GPU-%s-%s-%s-%s-%s" % (h[0:8], h[8:12], h[12:16], h[16:20], h[20:32])


class CudaCtypes(object):
    """Driver API through ctypes: cuInit, primary context, cuMemAlloc + cuMemsetD8."""

    name = "cuda"

    def __init__(self):
        self.lib = None
        self.ptrs = []
        self.device_name = None
        self.device_uuid = None

    def _check(self, rc, what):
        if rc != 0:
            msg = ctypes.c_char_p()
            try:
                self.lib.cuGetErrorString(rc, ctypes.byref(msg))
                text = (msg.value or b"").decode()
            except Exception:  # pylint: disable=broad-except  # any failure is handled right here
                text = ""
            raise AllocError("%s failed: CUDA error %d %s" % (what, rc, text))

    def init(self):
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise AllocError("libcuda.so.1 cannot be loaded: %s" % exc)
        lib = self.lib
        lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
        lib.cuMemsetD8_v2.argtypes = [ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t]
        self._check(lib.cuInit(0), "cuInit")
        dev = ctypes.c_int()
        self._check(lib.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet(0)")
        name = ctypes.create_string_buffer(256)
        if lib.cuDeviceGetName(name, 256, dev) == 0:
            self.device_name = name.value.decode("utf-8", "replace")
        uuid = (ctypes.c_ubyte * 16)()
        if lib.cuDeviceGetUuid(ctypes.byref(uuid), dev) == 0:
            self.device_uuid = _uuid_text(uuid)
        ctx = ctypes.c_void_p()
        self._check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        self._check(lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    def alloc(self, mib):
        nbytes = int(mib) * MIB
        ptr = ctypes.c_uint64()
        self._check(self.lib.cuMemAlloc_v2(ctypes.byref(ptr), nbytes), "cuMemAlloc(%d MiB)" % mib)
        self._check(self.lib.cuMemsetD8_v2(ptr.value, 0, nbytes), "cuMemsetD8")
        self._check(self.lib.cuCtxSynchronize(), "cuCtxSynchronize")
        self.ptrs.append(ptr)

    def free_all(self):
        for ptr in self.ptrs:
            self.lib.cuMemFree_v2(ctypes.c_uint64(ptr.value))
        self.ptrs = []

    def commit(self, keepers):
        pass


class Cupy(object):
    name = "cupy"

    def __init__(self):
        self.cp = None
        self.arrays = []
        self.device_name = None
        self.device_uuid = None

    def init(self):
        try:
            import cupy  # pylint: disable=import-outside-toplevel  # optional, only for the cupy allocator
        except Exception as exc:  # pylint: disable=broad-except  # any failure is handled right here
            raise AllocError("cupy is not importable: %s" % exc)
        self.cp = cupy
        try:
            props = cupy.cuda.runtime.getDeviceProperties(0)
            self.device_name = props.get("name", b"").decode() if isinstance(props.get("name"), bytes) else props.get("name")
            if props.get("uuid"):
                self.device_uuid = _uuid_text(props["uuid"])
        except Exception:  # pylint: disable=broad-except  # any failure is handled right here
            pass

    def alloc(self, mib):
        try:
            self.arrays.append(self.cp.zeros(int(mib) * MIB, dtype=self.cp.uint8))
            self.cp.cuda.Device(0).synchronize()
        except Exception as exc:  # pylint: disable=broad-except  # any failure is handled right here
            raise AllocError("cupy allocation of %d MiB failed: %s" % (mib, exc))

    def free_all(self):
        self.arrays = []
        try:
            self.cp.get_default_memory_pool().free_all_blocks()
        except Exception:  # pylint: disable=broad-except  # any failure is handled right here
            pass

    def commit(self, keepers):
        pass


class Torch(object):
    name = "torch"

    def __init__(self):
        self.torch = None
        self.tensors = []
        self.device_name = None
        self.device_uuid = None

    def init(self):
        try:
            import torch  # pylint: disable=import-outside-toplevel  # optional, imported only when used
        except Exception as exc:  # pylint: disable=broad-except  # any failure is handled right here
            raise AllocError("torch is not importable: %s" % exc)
        if not torch.cuda.is_available():
            raise AllocError("torch.cuda.is_available() is False")
        self.torch = torch
        try:
            props = torch.cuda.get_device_properties(0)
            self.device_name = props.name
            uuid = getattr(props, "uuid", None)
            if uuid is not None:
                self.device_uuid = "GPU-" + str(uuid)
        except Exception:  # pylint: disable=broad-except  # any failure is handled right here
            pass

    def alloc(self, mib):
        try:
            self.tensors.append(self.torch.zeros(int(mib) * MIB, dtype=self.torch.uint8, device="cuda:0"))
            self.torch.cuda.synchronize()
        except Exception as exc:  # pylint: disable=broad-except  # any failure is handled right here
            raise AllocError("torch allocation of %d MiB failed: %s" % (mib, exc))

    def free_all(self):
        self.tensors = []
        try:
            self.torch.cuda.empty_cache()
        except Exception:  # pylint: disable=broad-except  # any failure is handled right here
            pass

    def commit(self, keepers):
        pass


class GpuSim(object):
    """The simulator: device files under $GPUSIM_ROOT/dev, a hold per process."""

    name = "gpusim"

    def __init__(self, index=0):
        self.index = int(index)
        self.node = None
        self.fds = []
        self.mib = 0
        self.hold_id = None
        self.device_name = None
        self.device_uuid = None

    def init(self):
        try:
            from gpusim.node import Node  # pylint: disable=import-outside-toplevel  # optional, imported only when used
        except Exception as exc:  # pylint: disable=broad-except  # any failure is handled right here
            raise AllocError("the gpusim package is not importable (PYTHONPATH=simulator/python): %s" % exc)
        try:
            self.node = Node.from_env()
            gpu = [g for g in self.node.gpus() if g["index"] == self.index][0]
        except Exception as exc:  # pylint: disable=broad-except  # any failure is handled right here
            raise AllocError("no simulated GPU %d: %s" % (self.index, exc))
        self.device_name = gpu["name"]
        self.device_uuid = gpu["uuid"]
        for dev in ("nvidiactl", "nvidia-uvm", "nvidia%d" % self.index):
            self.fds.append(os.open(os.path.join(self.node.dev_dir, dev), os.O_RDWR))

    def alloc(self, mib):
        self.mib += int(mib)

    def commit(self, keepers):
        if self.mib:
            try:
                self.hold_id = self.node.hold(os.getpid(), [self.index], self.mib, keepers=list(keepers),
                                              meta={"source": "gpukit holder"})
            except Exception as exc:  # pylint: disable=broad-except  # any failure is handled right here
                raise AllocError("gpusim hold of %d MiB failed: %s" % (self.mib, exc))

    def free_all(self):
        if self.hold_id:
            self.node.release(self.hold_id)
            self.hold_id = None


ALLOCATORS = {"cuda": CudaCtypes, "cupy": Cupy, "torch": Torch, "gpusim": GpuSim}
AUTO_ORDER = ("cuda", "cupy", "torch")


def open_allocator(kind, gpu_index=0):
    """An initialised allocator; ``auto`` tries cuda, cupy, torch. Raises AllocError listing each failure."""
    names = AUTO_ORDER if kind == "auto" else (kind,)
    errors = []
    for name in names:
        cls = ALLOCATORS.get(name)
        if cls is None:
            raise AllocError("unknown allocator %r (known: auto, %s)" % (name, ", ".join(sorted(ALLOCATORS))))
        alloc = cls(gpu_index) if name == "gpusim" else cls()
        try:
            alloc.init()
            return alloc
        except AllocError as exc:
            errors.append("%s: %s" % (name, exc))
    raise AllocError("; ".join(errors))


def write_json(path, obj):
    if not path:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()
        return
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh)
    os.replace(tmp, path)


def wait_file(path, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if os.path.exists(path):
            with open(path, "r", encoding="utf-8") as fh:
                return json.load(fh)
        time.sleep(0.05)
    raise AllocError("no ready file %s after %.0f s" % (path, timeout))


def idle_forever():
    while True:
        signal.pause()


def run_keeper():
    """The forked keeper: no CUDA call, only the inherited descriptors."""
    try:
        idle_forever()
    finally:
        os._exit(0)


def role_allocating(a):
    if a.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    t0 = time.monotonic()
    alloc = open_allocator(a.allocator, a.gpu_index)
    alloc.alloc(a.mib)
    info = {"ok": True, "pid": os.getpid(), "role": a.role, "allocator": alloc.name, "mib": a.mib,
            "device_name": alloc.device_name, "device_uuid": alloc.device_uuid,
            "ignore_sigterm": bool(a.ignore_sigterm), "child": None, "keeper_pid": None}
    keepers = []
    try:
        if a.role == "parent" and a.keeper:
            pid = os.fork()
            if pid == 0:
                run_keeper()
            keepers.append(pid)
            info["keeper_pid"] = pid
        alloc.commit(keepers)
        if a.role == "parent" and a.child_mib:
            info["child"] = start_child(a, alloc)
    except BaseException:
        for pid in keepers:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        raise
    # Reap children automatically from now on (a dead child must not linger as a zombie).
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    info["seconds_to_ready"] = round(time.monotonic() - t0, 3)
    write_json(a.ready, info)
    idle_forever()


def start_child(a, alloc):
    """Start the allocating child (fresh exec) and wait for its ready file."""
    child_ready = a.ready + ".child" if a.ready else None
    argv = [sys.executable, os.path.abspath(__file__), "--role", "child", "--allocator", alloc.name,
            "--mib", str(a.child_mib), "--gpu-index", str(a.gpu_index)]
    if child_ready:
        argv += ["--ready", child_ready]
    if a.ignore_sigterm:
        argv.append("--ignore-sigterm")
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, close_fds=True)
    try:
        res = wait_file(child_ready, a.timeout) if child_ready else {"pid": child.pid, "ok": True}
        if not res.get("ok", True):
            raise AllocError("child failed: %s" % res.get("error"))
    except BaseException:
        child.kill()
        raise
    return res


def role_decoy(a):
    info = {"ok": True, "pid": os.getpid(), "role": a.role, "mode": None}
    keep = []
    if a.role == "nvml-decoy":
        root = os.environ.get("GPUSIM_ROOT")
        if a.allocator == "gpusim" and root:
            keep.append(os.open(os.path.join(root, "dev", "nvidiactl"), os.O_RDWR))
            info["mode"] = "gpusim nvidiactl open"
        else:
            try:
                import pynvml  # pylint: disable=import-outside-toplevel  # optional, imported only when used
                pynvml.nvmlInit()
                pynvml.nvmlDeviceGetCount()
                keep.append(pynvml)
                info["mode"] = "pynvml initialised"
            except Exception as exc:  # pylint: disable=broad-except  # any failure is handled right here
                try:
                    keep.append(os.open("/dev/nvidiactl", os.O_RDONLY))
                    info["mode"] = "/dev/nvidiactl open (pynvml: %s)" % exc
                except OSError as exc2:
                    info["mode"] = "nothing open (%s; %s)" % (exc, exc2)
    write_json(a.ready, info)
    idle_forever()


def role_probe(a):
    try:
        alloc = open_allocator(a.allocator, a.gpu_index)
        alloc.alloc(min(64, a.mib or 64))
        alloc.free_all()
        write_json(a.ready, {"ok": True, "allocator": alloc.name, "device_name": alloc.device_name,
                             "device_uuid": alloc.device_uuid})
        return 0
    except AllocError as exc:
        write_json(a.ready, {"ok": False, "allocator": a.allocator, "error": str(exc)})
        return 3


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    p.add_argument("--role", required=True, choices=["parent", "child", "decoy", "nvml-decoy", "probe"])
    p.add_argument("--allocator", default="auto", choices=["auto"] + sorted(ALLOCATORS))
    p.add_argument("--mib", type=int, default=0)
    p.add_argument("--child-mib", type=int, default=0)
    p.add_argument("--keeper", action="store_true")
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument("--gpu-index", type=int, default=0, help="simulator GPU index (gpusim only)")
    p.add_argument("--ready", help="ready file (JSON); default: stdout")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the child")
    return p


def main(argv=None):
    a = build_parser().parse_args(argv)
    if a.role == "probe":
        return role_probe(a)
    if a.role in ("decoy", "nvml-decoy"):
        role_decoy(a)
        return 0
    if a.mib <= 0:
        write_json(a.ready, {"ok": False, "error": "--mib must be > 0"})
        return 2
    try:
        role_allocating(a)
    except AllocError as exc:
        write_json(a.ready, {"ok": False, "pid": os.getpid(), "role": a.role, "error": str(exc)})
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
