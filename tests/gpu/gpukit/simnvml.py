"""A minimal pynvml stand-in backed by the gpusim simulator (rehearsal mode only).

It implements exactly the calls ``gpu_query.NvmlBackend`` and the kit's fast
poller make, so the NVML-versus-nvidia-smi comparison and the release-latency
loop run end to end against the simulator. It is not a model of NVML.
"""
from __future__ import annotations

import os

MIB = 1024 * 1024


class NVMLError(Exception):
    def __init__(self, value, text=""):
        super().__init__(text or "NVML error %d" % value)
        self.value = value

    def __str__(self):
        return self.args[0]


class _Memory(object):
    def __init__(self, total, reserved, used, free):
        self.total = total
        self.reserved = reserved
        self.used = used
        self.free = free


class _Proc(object):
    def __init__(self, pid, used):
        self.pid = pid
        self.usedGpuMemory = used


class _Pci(object):
    def __init__(self, bus_id):
        self.busId = bus_id


class SimNvml(object):
    """``SimNvml(root)`` quacks like the ``pynvml`` module for one simulated node."""

    NVMLError = NVMLError
    nvmlMemory_v2 = 0x02000028

    def __init__(self, root=None):
        self.root = root or os.environ.get("GPUSIM_ROOT")
        self.node = None

    # -- lifecycle ---------------------------------------------------------
    def nvmlInit(self):
        from gpusim.node import Node  # pylint: disable=import-outside-toplevel  # optional, imported only when used
        if not self.root:
            raise NVMLError(12, "NVML Shared Library Not Found")
        self.node = Node(self.root)
        state = self.node.driver_state()
        if state == "unloaded":
            raise NVMLError(9, "Driver Not Loaded")
        if state == "nolib":
            raise NVMLError(12, "NVML Shared Library Not Found")
        if state == "mismatch":
            raise NVMLError(18, "RM has detected an NVML/RM version mismatch.")

    def nvmlShutdown(self):
        pass

    # -- devices -------------------------------------------------------------
    def _snap(self):
        return self.node.snapshot()

    def _gpu(self, handle):
        for g in self._snap()["gpus"]:
            if g["index"] == handle:
                return g
        raise NVMLError(15, "GPU is lost")

    def nvmlDeviceGetCount(self):
        return len(self._snap()["gpus"])

    def nvmlDeviceGetHandleByIndex(self, index):
        self._gpu(index)
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid):
        for g in self._snap()["gpus"]:
            if g["uuid"].lower() == str(uuid).lower():
                return g["index"]
        raise NVMLError(6, "Not Found")

    def nvmlDeviceGetUUID(self, handle):
        return self._gpu(handle)["uuid"]

    def nvmlDeviceGetName(self, handle):
        return self._gpu(handle)["name"]

    def nvmlDeviceGetPciInfo(self, handle):
        return _Pci(self._gpu(handle)["pci_bus_id"])

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        g = self._gpu(handle)
        return _Memory(g["total_mib"] * MIB, g["reserved_mib"] * MIB, g["used_mib"] * MIB, g["free_mib"] * MIB)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        from gpusim.node import pid_for_display  # pylint: disable=import-outside-toplevel  # optional, imported only when used
        snap = self._snap()
        by_pid = {}
        for h in snap["holds"]:
            if h.get("listed") and handle in h.get("gpus", ()):
                pid = pid_for_display(h)
                by_pid[pid] = by_pid.get(pid, 0) + int(h["mib"]) * MIB
        return [_Proc(pid, used) for pid, used in sorted(by_pid.items())]

    def nvmlSystemGetProcessName(self, pid):
        try:
            return os.readlink("/proc/%d/exe" % pid)
        except OSError:
            raise NVMLError(6, "Not Found")
