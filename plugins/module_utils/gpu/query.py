# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""GPU memory and process queries through nvidia-smi or NVML (standard library only).

One call, :meth:`NvidiaSmiBackend.snapshot` (or :meth:`NvmlBackend.snapshot`),
returns everything the GPU modules need about every GPU of the node, using at
most one ``--query-gpu`` and one ``--query-compute-apps`` run of nvidia-smi.
A snapshot is a plain, JSON-ready dict::

    {
      "backend": "nvidia-smi",            # which backend answered
      "driver": {"ok": True, "status": "ok", "rc": 0, "message": "", "fatal": False},
      "gpus": [{
          "index": 0, "uuid": "GPU-...", "name": "NVIDIA H200", "bus_id": "00000000:18:00.0",
          "used_mib": 70001, "reserved_mib": 530, "total_mib": 143771, "free_mib": 73240,
          "processes": [{"pid": 1234, "used_mib": 70000, "name": "/usr/bin/python3"}],
          "unknown_fields": {},            # field -> placeholder text, e.g. {"memory.used": "[N/A]"}
          "lost": False, "lost_reason": None,
      }],
      "lost": [{"bus_id": "00000000:3B:00.0", "reason": "Unknown Error"}],
      "unmatched_processes": [],          # rows whose gpu_uuid matched no GPU row
      "anomalies": [],                    # lines that could not be parsed
      "calls": 2,                         # nvidia-smi runs made for this snapshot
    }

Rules (docs/reference/nvidia-smi.md, "Parsing rules" and "Failures"):

* A placeholder (any ``[...]`` token, bare ``N/A``, ``ERR!`` or an empty value)
  is *unknown*: the value is None and the field is listed in
  ``unknown_fields``. It is never read as 0.
* Rows are split with a bounded count and ``process_name`` is queried last,
  so process names containing commas survive.
* Headers are read with or without units (``memory.used [MiB]``), values with
  or without ``MiB`` (``nounits``), with or without a header line.
* Driver failures are recognised from the exit code *and* the stdout text
  (rc 9 no driver, 12 no library, 18 library/driver mismatch, "No devices
  were found", "Failed to initialize NVML: No supported GPUs were found",
  "Failed to initialize NVML: Unknown Error", an option this nvidia-smi does
  not know); a lost GPU ("Unable to determine the device handle for GPU1:
  0000:34:00.0: Unknown Error" and its older spellings) marks that GPU lost,
  by index when the line names one, while the others still answer. A lost GPU
  never drops out of a result.
* Output that does not parse (junk rows, a truncated row, a header without
  rows, empty output) is its own status, ``unparsable``, whose message starts
  "nvidia-smi output could not be parsed:"; it is never read as "no GPUs".
* ``mig.mode.current`` is queried with the memory: a GPU in MIG mode keeps a
  few tens of MiB in use when idle (see :func:`idle_limit`).

Commands run through a *runner*, a callable ``runner(argv) -> (rc, stdout,
stderr)``: :func:`module_runner` wraps ``AnsibleModule.run_command`` under
``LC_ALL=C``; :func:`subprocess_runner` serves tests and other tools.
"""

from __future__ import annotations

import os
import re
import subprocess

BACKEND_NVIDIA_SMI = 'nvidia-smi'
BACKEND_NVML = 'nvml'

MIB = 1024 * 1024

# System daemons that keep GPU device files open and must never be stopped by
# a drain (docs/reference/nvidia-smi.md §3.7): persistence, DCGM, Fabric Manager, X, MPS.
GPU_SYSTEM_DAEMONS = (
    'nvidia-persistenced', 'nv-hostengine', 'dcgm', 'dcgm-exporter', 'nvidia-fabricmanager', 'nv-fabricmanager',
    'Xorg', 'Xwayland', 'nvidia-cuda-mps-control', 'nvidia-cuda-mps-server',
)

# --query-gpu fields; name last so that a name with a comma cannot shift columns.
GPU_FIELDS = ('index', 'uuid', 'pci.bus_id', 'memory.total', 'memory.reserved', 'memory.used', 'memory.free',
              'mig.mode.current', 'name')
# Fields an older driver may not know; each is dropped (once) when nvidia-smi
# says it "is not a valid field to query" (memory.reserved: before R510).
OPTIONAL_GPU_FIELDS = ('memory.reserved', 'mig.mode.current')
GPU_FIELDS_NO_RESERVED = tuple(f for f in GPU_FIELDS if f != 'memory.reserved')

# With MIG enabled an idle GPU shows its instances' bookkeeping as used
# memory: 55-59 MiB on an idle H200 (docs/reference/nvidia-smi.md, "Idle
# baselines"). The default allowance for a MIG GPU to still count as free.
DEFAULT_MIG_MAX_USED_MIB = 96
# --query-compute-apps fields; process_name last (it may contain commas).
APP_FIELDS = ('gpu_uuid', 'pid', 'used_gpu_memory', 'process_name')

# Header spellings that differ from the requested field name.
FIELD_ALIASES = {
    'used_memory': 'used_gpu_memory',
    'gpu_bus_id': 'gpu_bus_id',
    'pci.bus_id': 'pci.bus_id',
}

# Driver/library status values.
STATUS_OK = 'ok'
STATUS_NOT_LOADED = 'driver_not_loaded'          # rc 9
STATUS_NO_LIBRARY = 'library_not_found'          # rc 12
STATUS_MISMATCH = 'version_mismatch'             # rc 18
STATUS_NVML_INIT = 'nvml_init_failed'            # "Failed to initialize NVML: ..." with another rc
STATUS_NO_DEVICES = 'no_devices'                 # "No devices were found"
STATUS_NOT_FOUND = 'nvidia_smi_not_found'        # the binary is missing
STATUS_NO_SUPPORTED = 'no_supported_gpus'       # "Failed to initialize NVML: No supported GPUs were found" (rc 255)
STATUS_BAD_OPTION = 'option_not_recognized'      # "ERROR: Option X is not recognized. ..."
STATUS_TIMEOUT = 'timeout'                       # the command did not finish in time
STATUS_UNPARSABLE = 'unparsable'                 # output that does not parse (junk, truncated, empty)
STATUS_ERROR = 'error'                           # anything else (retryable)

# Failures that waiting cannot fix: report them at once.
FATAL_STATUSES = frozenset((STATUS_NOT_LOADED, STATUS_NO_LIBRARY, STATUS_MISMATCH, STATUS_NVML_INIT,
                            STATUS_NO_DEVICES, STATUS_NOT_FOUND, STATUS_NO_SUPPORTED, STATUS_BAD_OPTION))

UNPARSABLE_PREFIX = 'nvidia-smi output could not be parsed'

STATUS_HINTS = {
    STATUS_NOT_LOADED: 'the NVIDIA kernel driver is not loaded (nvidia-smi rc 9); load it (modprobe nvidia) or reboot',
    STATUS_NO_LIBRARY: 'libnvidia-ml.so cannot be loaded (nvidia-smi rc 12); install the NVIDIA driver user-space libraries',
    STATUS_MISMATCH: 'the NVML library and the kernel driver versions differ (rc 18); reload the driver or reboot',
    STATUS_NVML_INIT: 'NVML failed to initialise (rc 255); in a container this usually means it lost access to '
                      '/dev/nvidia* (restart it); on the host, check dmesg for Xid errors and reboot if the driver is wedged',
    STATUS_NO_SUPPORTED: 'the driver found no GPU it supports (rc 255): the GPUs are bound to another driver (vfio-pci), '
                         'not supported by this driver branch, or gone from the PCI bus; check lspci -k and dmesg',
    STATUS_BAD_OPTION: 'this nvidia-smi does not accept an option the collection uses; check the driver version '
                       'and the nvidia_smi option',
    STATUS_UNPARSABLE: UNPARSABLE_PREFIX,
    STATUS_NO_DEVICES: 'no NVIDIA GPU is visible (check /dev/nvidia* permissions and the driver)',
    STATUS_NOT_FOUND: 'nvidia-smi was not found',
    STATUS_TIMEOUT: 'nvidia-smi did not answer in time (is persistence mode off, or is a GPU hung?)',
    STATUS_ERROR: 'nvidia-smi failed',
}


BUS_ID_RE = re.compile(r'^(?:([0-9A-Fa-f]{1,8}):)?([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})\.([0-7])$')


class BackendUnavailable(Exception):
    """The requested backend cannot be used here (the reason is the message)."""


# ---------------------------------------------------------------------------
# Runners
# ---------------------------------------------------------------------------

C_LOCALE = {'LC_ALL': 'C', 'LANG': 'C', 'LANGUAGE': 'C'}


def module_runner(module, timeout=None):
    """A runner on ``module.run_command`` with argv lists and the C locale.

    With ``timeout`` (seconds) the command is wrapped in coreutils
    ``timeout`` when that is installed, so a hung nvidia-smi cannot hang the
    task; a timeout shows as rc 124.
    """
    prefix = []
    if timeout:
        timeout_bin = module.get_bin_path('timeout')
        if timeout_bin:
            prefix = [timeout_bin, '-k', '5', '%g' % float(timeout)]

    def run(argv):
        rc, out, err = module.run_command(prefix + list(argv), check_rc=False, environ_update=dict(C_LOCALE))
        return rc, out, err
    return run


def resolve_nvidia_smi(module, value):
    """Return the nvidia-smi to run for the option value, or None when none is found.

    A value with a slash is a path and must be an executable file; a bare name
    (V(nvidia-smi), as users often write it) is looked up on PATH like the
    default. Raises ValueError with a message that names the fix.
    """
    if not value:
        return module.get_bin_path('nvidia-smi')
    if os.sep not in value:
        found = module.get_bin_path(value)
        if not found:
            raise ValueError('%s was not found on PATH; give its absolute path or fix PATH' % value)
        return found
    if not (os.path.isfile(value) and os.access(value, os.X_OK)):
        raise ValueError('%s is not an executable file' % value)
    return value


def subprocess_runner(timeout=60, env=None):
    """A runner on :mod:`subprocess` (for tests and controller-side tools)."""
    def run(argv):
        full_env = dict(os.environ if env is None else env)
        full_env.update(C_LOCALE)
        try:
            # Not AnsibleModule.run_command: it has no timeout, and this runner must end a hung nvidia-smi.
            proc = subprocess.run(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=full_env,  # pylint: disable=ansible-bad-function
                                  timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            return 124, (exc.stdout or b'').decode('utf-8', 'replace'), 'timed out after %s s' % timeout
        except OSError as exc:
            return 127, '', str(exc)
        return proc.returncode, proc.stdout.decode('utf-8', 'replace'), proc.stderr.decode('utf-8', 'replace')
    return run


# ---------------------------------------------------------------------------
# Driver status
# ---------------------------------------------------------------------------

def driver_status(status=STATUS_OK, rc=0, message=''):
    """Build the ``driver`` part of a snapshot."""
    hint = STATUS_HINTS.get(status, '')
    return {
        'ok': status == STATUS_OK,
        'status': status,
        'rc': rc,
        'message': message,
        'hint': hint if status != STATUS_OK else '',
        'fatal': status in FATAL_STATUSES,
    }


# ---------------------------------------------------------------------------
# Snapshot assembly
# ---------------------------------------------------------------------------

def empty_snapshot(backend, driver=None):
    return {
        'backend': backend,
        'driver': driver or driver_status(),
        'gpus': [],
        'lost': [],
        'unmatched_processes': [],
        'anomalies': [],
        'calls': 0,
    }


# ---------------------------------------------------------------------------
# Selection and aggregation
# ---------------------------------------------------------------------------

def normalize_bus_id(value):
    """Canonical PCI bus id ``DDDDDDDD:BB:DD.F`` (upper case) or None.

    Accepts the 8-digit NVML form ``00000000:18:00.0``, the legacy 4-digit
    domain ``0000:18:00.0`` and the short ``18:00.0``.
    """
    if value is None:
        return None
    match = BUS_ID_RE.match(str(value).strip())
    if not match:
        return None
    domain, bus, dev, func = match.groups()
    return '%08X:%02X:%02X.%X' % (int(domain or '0', 16), int(bus, 16), int(dev, 16), int(func, 16))


def parse_selector(value):
    """``3`` / ``'3'`` -> ``('index', 3)``; ``'GPU-…'`` -> ``('uuid', 'GPU-…')``; bus ids -> ``('bus_id', canonical)``.

    Raises ValueError for anything else (MIG device UUIDs included).
    """
    if isinstance(value, bool):
        raise ValueError('invalid GPU selector %r' % (value,))
    if isinstance(value, int):
        if value < 0:
            raise ValueError('GPU index must not be negative: %r' % (value,))
        return 'index', value
    text = str(value).strip()
    if text.isdigit():
        return 'index', int(text)
    if text.upper().startswith('GPU-') and len(text) > 4:
        return 'uuid', 'GPU-' + text[4:].lower()
    if text.upper().startswith('MIG-'):
        raise ValueError('MIG device %s: select the parent GPU by index, UUID or bus id' % text)
    bus = normalize_bus_id(text)
    if bus:
        return 'bus_id', bus
    raise ValueError('invalid GPU selector %r: use an index (3), a UUID (GPU-...) or a PCI bus id (00000000:18:00.0)' % (text,))


def select_gpus(snapshot, selectors=None):
    """Pick the GPUs named by ``selectors`` (all when empty) from a snapshot.

    Returns ``(gpus, errors)``. A lost GPU never drops out: it is a lost
    placeholder entry, with its index when nvidia-smi named one (driver 610
    prints "GPU1: 0000:34:00.0"), so "GPU 1" matches it. A selector that
    names no answering GPU while nvidia-smi reported lost GPUs without an
    index yields a lost placeholder too (the GPU is unreachable, not
    misspelled); otherwise it is an error naming the GPUs that exist. Each GPU
    appears once, in index order.
    """
    gpus = snapshot.get('gpus', [])
    lost_entries = list(snapshot.get('lost', []))
    # Lost GPUs without a row of their own (nvidia-smi prints a message line
    # instead of a row); NVML lost entries already have a GPU entry.
    rowless = []
    for entry in lost_entries:
        if entry.get('bus_id') and any(g.get('bus_id') == entry['bus_id'] for g in gpus):
            continue
        if entry.get('index') is not None and any(g.get('index') == entry['index'] for g in gpus):
            continue
        rowless.append(entry)
    if not selectors:
        chosen = list(gpus) + [_lost_placeholder(e.get('index'), e) for e in rowless]
        chosen.sort(key=lambda g: (g.get('index') is None, g.get('index') or 0))
        return chosen, []
    unindexed = [e for e in rowless if e.get('index') is None]
    chosen = []
    errors = []
    seen = set()
    node_size = len(gpus) + len(rowless)
    for selector in selectors:
        try:
            kind, key = parse_selector(selector)
        except ValueError as exc:
            errors.append(str(exc))
            continue
        match = None
        for gpu in gpus:
            if kind == 'index' and gpu.get('index') == key:
                match = gpu
            elif kind == 'uuid' and (gpu.get('uuid') or '').lower() == key.lower():
                match = gpu
            elif kind == 'bus_id' and gpu.get('bus_id') == key:
                match = gpu
            if match is not None:
                break
        if match is None and rowless:
            entry = None
            if kind == 'bus_id':
                entry = next((e for e in rowless if e.get('bus_id') == key), None)
            elif kind == 'index':
                entry = next((e for e in rowless if e.get('index') == key), None)
            if entry is None and unindexed and (kind != 'index' or key < node_size) and kind != 'bus_id':
                entry = unindexed[0] if len(unindexed) == 1 else {'bus_id': None, 'reason': '; '.join(
                    '%s: %s' % (e.get('bus_id') or 'unknown bus id', e.get('reason')) for e in unindexed)}
            if entry is not None:
                index = key if kind == 'index' else entry.get('index')
                match = _lost_placeholder(index, entry, selector=selector)
        if match is None:
            errors.append('no GPU matches %r (GPUs present: %s)' % (
                selector, ', '.join('%s %s' % (g.get('index'), g.get('uuid')) for g in gpus) or 'none'))
            continue
        if match.get('lost') and match.get('bus_id'):
            ident = ('lost', match['bus_id'])
        else:
            ident = (match.get('index'), match.get('uuid'), match.get('bus_id'))
        if ident in seen:
            continue
        seen.add(ident)
        chosen.append(match)
    chosen.sort(key=lambda g: (g.get('index') is None, g.get('index') or 0))
    return chosen, errors


def _lost_placeholder(index, entry, selector=None):
    return {
        'index': index, 'uuid': None, 'name': None, 'bus_id': entry.get('bus_id'),
        'used_mib': None, 'reserved_mib': None, 'total_mib': None, 'free_mib': None,
        'processes': [], 'unknown_fields': {}, 'mig_mode': None, 'lost': True,
        'lost_reason': 'did not answer; nvidia-smi reported: %s' % (
            entry.get('reason') if entry.get('bus_id') is None else '%s: %s' % (entry['bus_id'], entry.get('reason'))),
        'selector': selector,
    }


def gpu_label(gpu):
    """``'GPU 3'``, or ``'GPU 00000000:3B:00.0'`` when the index is unknown."""
    if gpu.get('index') is not None:
        return 'GPU %s' % gpu['index']
    if gpu.get('bus_id'):
        return 'GPU %s' % gpu['bus_id']
    if gpu.get('selector') is not None:
        return 'GPU %s' % gpu['selector']
    return 'GPU ?'


def holders(gpus):
    """Aggregate processes over ``gpus`` by PID (one PID can hold several GPUs).

    Returns ``{pid: {'pid', 'gpus': [indices], 'used_mib', 'name', 'unknown'}}``;
    ``used_mib`` is the sum over the GPUs, None when any part is unknown.
    Rows without a PID (placeholder) are collected under key None.
    """
    out = {}
    for gpu in gpus:
        for proc in gpu.get('processes', []):
            pid = proc.get('pid')
            entry = out.setdefault(pid, {'pid': pid, 'gpus': [], 'used_mib': 0, 'name': proc.get('name'),
                                         'unknown': False})
            label = gpu.get('index') if gpu.get('index') is not None else gpu.get('uuid')
            if label not in entry['gpus']:
                entry['gpus'].append(label)
            if proc.get('used_mib') is None or entry['used_mib'] is None:
                entry['used_mib'] = None
                entry['unknown'] = True
            else:
                entry['used_mib'] += proc['used_mib']
            if not entry['name'] and proc.get('name'):
                entry['name'] = proc['name']
    return out


def summarize(gpu):
    """The per-GPU reading returned by the modules (no internal keys)."""
    return {
        'index': gpu.get('index'),
        'uuid': gpu.get('uuid'),
        'name': gpu.get('name'),
        'bus_id': gpu.get('bus_id'),
        'used_mib': gpu.get('used_mib'),
        'reserved_mib': gpu.get('reserved_mib'),
        'total_mib': gpu.get('total_mib'),
        'free_mib': gpu.get('free_mib'),
        'processes': [dict(p) for p in gpu.get('processes', [])],
        'unknown_fields': dict(gpu.get('unknown_fields', {})),
        'mig_mode': gpu.get('mig_mode'),
        'lost': bool(gpu.get('lost')),
        'lost_reason': gpu.get('lost_reason'),
    }


def mig_enabled(gpu):
    """True when ``mig.mode.current`` reads Enabled (unknown or Disabled: False)."""
    return str(gpu.get('mig_mode') or '').strip().lower() == 'enabled'


def idle_limit(gpu, max_used_mib, mig_max_used_mib=None):
    """The most used MiB at which ``gpu`` still counts as idle.

    ``max_used_mib`` for a GPU in normal mode (an idle H100 or H200 reads 0 to
    4 MiB); the larger of it and ``mig_max_used_mib`` for a GPU in MIG mode,
    whose instances keep 55-59 MiB in use when idle (H200, driver 590). The
    collection treats a MIG GPU as one whole GPU: its instances are not
    selected or judged one by one (docs/reference/nvidia-smi.md, "MIG").
    """
    if mig_enabled(gpu):
        allowance = DEFAULT_MIG_MAX_USED_MIB if mig_max_used_mib is None else mig_max_used_mib
        return max(int(max_used_mib), int(allowance))
    return int(max_used_mib)
