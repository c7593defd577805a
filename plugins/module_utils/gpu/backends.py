# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The two GPU backends: nvidia-smi (through a runner) and NVML (through pynvml, when installed).

Each returns the snapshot ``query.py`` describes; :func:`open_backend` picks one. Standard library only
(pynvml is optional and imported here alone).
"""
from __future__ import annotations

from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu.query import (
    APP_FIELDS,
    BACKEND_NVIDIA_SMI,
    BACKEND_NVML,
    BackendUnavailable,
    GPU_FIELDS,
    MIB,
    OPTIONAL_GPU_FIELDS,
    STATUS_ERROR,
    STATUS_NVML_INIT,
    driver_status,
    empty_snapshot,
    normalize_bus_id,
)
from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu.smi_csv import (
    MSG_INVALID_FIELD,
    RC_STATUS,
    detect_driver_failure,
    invalid_field,
    snapshot_from_outputs,
)


try:
    import pynvml  # nvidia-ml-py, optional
    HAS_PYNVML = True
    PYNVML_IMPORT_ERROR = None
except Exception as _pynvml_exc:  # pylint: disable=broad-except  # a broken pynvml install can raise anything
    pynvml = None
    HAS_PYNVML = False
    PYNVML_IMPORT_ERROR = _pynvml_exc


# ---------------------------------------------------------------------------
# Backends
# ---------------------------------------------------------------------------

class NvidiaSmiBackend(object):
    """Queries through the nvidia-smi binary (two runs per snapshot)."""

    name = BACKEND_NVIDIA_SMI

    def __init__(self, runner, nvidia_smi='nvidia-smi'):
        self.runner = runner
        self.nvidia_smi = nvidia_smi
        self.gpu_fields = GPU_FIELDS
        self.calls = 0

    def _run(self, argv):
        self.calls += 1
        return self.runner(argv)

    def query_gpu_argv(self):
        return [self.nvidia_smi, '--query-gpu=' + ','.join(self.gpu_fields), '--format=csv,nounits']

    def query_apps_argv(self):
        return [self.nvidia_smi, '--query-compute-apps=' + ','.join(APP_FIELDS), '--format=csv,nounits']

    def snapshot(self):
        """One snapshot of every GPU: one ``--query-gpu`` and one ``--query-compute-apps`` run.

        Drivers older than R510 lack ``memory.reserved`` (and some lack
        ``mig.mode.current``); on "not a valid field" the GPU query is repeated
        without the field named, and the smaller field list is kept for later
        snapshots.
        """
        calls_before = self.calls
        gpu_result = self._run(self.query_gpu_argv())
        for dummy in OPTIONAL_GPU_FIELDS:
            text = '%s %s' % (gpu_result[1], gpu_result[2])
            if gpu_result[0] == 0 or MSG_INVALID_FIELD not in text.lower():
                break
            field = invalid_field(text)
            drop = field if field in OPTIONAL_GPU_FIELDS and field in self.gpu_fields else None
            if drop is None:
                # An unnamed rejection: drop the newest optional field first.
                drop = next((f for f in reversed(OPTIONAL_GPU_FIELDS) if f in self.gpu_fields), None)
            if drop is None:
                break
            self.gpu_fields = tuple(f for f in self.gpu_fields if f != drop)
            gpu_result = self._run(self.query_gpu_argv())
        apps_result = None
        if detect_driver_failure(*gpu_result) is None:
            apps_result = self._run(self.query_apps_argv())
        snap = snapshot_from_outputs(gpu_result, apps_result, self.name, gpu_fields=self.gpu_fields)
        snap['calls'] = self.calls - calls_before
        return snap

    def reset_argv(self, index):
        return [self.nvidia_smi, '--gpu-reset', '-i', str(index)]

    def reset(self, index):
        """Run ``nvidia-smi --gpu-reset -i INDEX``; returns ``(rc, stdout, stderr)``."""
        return self._run(self.reset_argv(index))

    def close(self):
        pass


def _nvml_text(value):
    if isinstance(value, bytes):
        return value.decode('utf-8', 'replace')
    return value


def _bytes_to_mib(value, round_up=False):
    if value is None:
        return None
    value = int(value)
    if round_up:
        return (value + MIB - 1) // MIB
    return value // MIB


class NvmlBackend(object):
    """Queries through NVML (``pynvml`` from nvidia-ml-py); no process is spawned.

    Uses the v2 memory structure, whose ``used`` excludes reserved memory like
    nvidia-smi's ``memory.used`` (docs/reference/nvidia-smi.md §2.3); a library
    without it raises :class:`BackendUnavailable` so that ``auto`` falls back
    to nvidia-smi rather than compare v1 ``used`` (which includes reserved)
    with a small threshold.
    """

    name = BACKEND_NVML

    def __init__(self, nvml=None):
        self.nvml = nvml if nvml is not None else pynvml
        if self.nvml is None:
            raise BackendUnavailable('the pynvml module (nvidia-ml-py) is not installed')
        self.initialized = False
        self.calls = 0

    def _error_value(self, exc):
        return getattr(exc, 'value', None)

    def init(self):
        """Initialise NVML; returns None or a failed driver status dict."""
        if self.initialized:
            return None
        try:
            self.nvml.nvmlInit()
        except self.nvml.NVMLError as exc:
            value = self._error_value(exc)
            status = RC_STATUS.get(value, STATUS_NVML_INIT)
            return driver_status(status, value if isinstance(value, int) else -1, 'nvmlInit: %s' % exc)
        self.initialized = True
        return None

    def probe(self):
        """Raise BackendUnavailable unless NVML initialises and has v2 memory info."""
        failure = self.init()
        if failure is not None:
            raise BackendUnavailable(failure['message'])
        if not hasattr(self.nvml, 'nvmlMemory_v2'):
            raise BackendUnavailable('this pynvml has no nvmlMemory_v2 (memory.reserved)')

    def _memory(self, handle):
        info = self.nvml.nvmlDeviceGetMemoryInfo(handle, version=self.nvml.nvmlMemory_v2)
        return {
            'total_mib': _bytes_to_mib(info.total),
            'used_mib': _bytes_to_mib(info.used, round_up=True),
            'free_mib': _bytes_to_mib(info.free),
            'reserved_mib': _bytes_to_mib(getattr(info, 'reserved', None), round_up=True),
        }

    def _mig_mode(self, handle):
        """``Enabled``/``Disabled`` from ``nvmlDeviceGetMigMode``, None where MIG is not supported."""
        getter = getattr(self.nvml, 'nvmlDeviceGetMigMode', None)
        if getter is None:
            return None
        try:
            current = getter(handle)
        except self.nvml.NVMLError:
            return None
        if isinstance(current, (list, tuple)):
            current = current[0] if current else None
        if current is None:
            return None
        return 'Enabled' if int(current) == 1 else 'Disabled'

    def _process_name(self, pid):
        try:
            return _nvml_text(self.nvml.nvmlSystemGetProcessName(pid)), None
        except self.nvml.NVMLError as exc:
            return None, '[%s]' % exc

    def snapshot(self):
        nvml = self.nvml
        failure = self.init()
        if failure is not None:
            snap = empty_snapshot(self.name, failure)
            return snap
        gpus = []
        lost = []
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            return empty_snapshot(self.name, driver_status(STATUS_ERROR, self._error_value(exc) or -1,
                                                           'nvmlDeviceGetCount: %s' % exc))
        for index in range(count):
            gpu = {'index': index, 'uuid': None, 'name': None, 'bus_id': None, 'used_mib': None,
                   'reserved_mib': None, 'total_mib': None, 'free_mib': None, 'processes': [],
                   'unknown_fields': {}, 'mig_mode': None, 'lost': False, 'lost_reason': None}
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            except nvml.NVMLError as exc:
                gpu['lost'] = True
                gpu['lost_reason'] = str(exc)
                lost.append({'bus_id': None, 'reason': str(exc), 'index': index})
                gpus.append(gpu)
                continue
            for field, call, key in (('uuid', 'nvmlDeviceGetUUID', 'uuid'), ('name', 'nvmlDeviceGetName', 'name')):
                try:
                    gpu[key] = _nvml_text(getattr(nvml, call)(handle))
                except nvml.NVMLError as exc:
                    gpu['unknown_fields'][field] = '[%s]' % exc
            try:
                pci = nvml.nvmlDeviceGetPciInfo(handle)
                bus = _nvml_text(pci.busId)
                gpu['bus_id'] = normalize_bus_id(bus) or bus
            except nvml.NVMLError as exc:
                gpu['unknown_fields']['pci.bus_id'] = '[%s]' % exc
            try:
                gpu.update(self._memory(handle))
            except nvml.NVMLError as exc:
                for field in ('memory.used', 'memory.total', 'memory.free', 'memory.reserved'):
                    gpu['unknown_fields'][field] = '[%s]' % exc
                if self._error_value(exc) in (15, 999):
                    gpu['lost'] = True
                    gpu['lost_reason'] = str(exc)
            gpu['mig_mode'] = self._mig_mode(handle)
            try:
                procs = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except nvml.NVMLError as exc:
                gpu['unknown_fields']['processes'] = '[%s]' % exc
                procs = []
            for proc in procs:
                name, placeholder = self._process_name(proc.pid)
                entry = {'pid': int(proc.pid), 'used_mib': _bytes_to_mib(proc.usedGpuMemory, round_up=True),
                         'name': name}
                unknown = {}
                if placeholder:
                    unknown['process_name'] = placeholder
                if proc.usedGpuMemory is None:
                    unknown['used_gpu_memory'] = '[N/A]'
                if unknown:
                    entry['unknown_fields'] = unknown
                gpu['processes'].append(entry)
            gpus.append(gpu)
        snap = empty_snapshot(self.name)
        snap['gpus'] = gpus
        snap['lost'] = lost
        return snap

    def close(self):
        if self.initialized:
            try:
                self.nvml.nvmlShutdown()
            except self.nvml.NVMLError:
                pass
            self.initialized = False


def open_backend(kind, runner, nvidia_smi='nvidia-smi', nvml=None):
    """Return ``(backend, note)`` for ``kind`` = ``auto``, ``nvidia-smi`` or ``nvml``.

    ``auto`` uses NVML when ``pynvml`` imports, initialises and supports the
    v2 memory structure; otherwise nvidia-smi, and ``note`` says why.
    ``nvml`` raises :class:`BackendUnavailable` when NVML cannot be used.
    """
    if kind == BACKEND_NVIDIA_SMI:
        return NvidiaSmiBackend(runner, nvidia_smi), None
    lib = nvml if nvml is not None else pynvml
    if kind == BACKEND_NVML:
        backend = NvmlBackend(lib)
        backend.probe()
        return backend, None
    if kind != 'auto':
        raise BackendUnavailable('unknown backend %r' % (kind,))
    if lib is None:
        return NvidiaSmiBackend(runner, nvidia_smi), 'pynvml is not installed; using nvidia-smi'
    try:
        backend = NvmlBackend(lib)
        backend.probe()
        return backend, None
    except BackendUnavailable as exc:
        return NvidiaSmiBackend(runner, nvidia_smi), 'NVML unusable (%s); using nvidia-smi' % exc
    except Exception as exc:  # pylint: disable=broad-except  # any NVML failure falls back to nvidia-smi
        return NvidiaSmiBackend(runner, nvidia_smi), 'NVML failed (%s); using nvidia-smi' % exc
