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

try:
    import pynvml  # nvidia-ml-py, optional
    HAS_PYNVML = True
    PYNVML_IMPORT_ERROR = None
except Exception as _pynvml_exc:  # pylint: disable=broad-except  # a broken pynvml install can raise anything
    pynvml = None
    HAS_PYNVML = False
    PYNVML_IMPORT_ERROR = _pynvml_exc

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

_RC_STATUS = {9: STATUS_NOT_LOADED, 12: STATUS_NO_LIBRARY, 18: STATUS_MISMATCH}

_MSG_NOT_LOADED = "couldn't communicate with the nvidia driver"
_MSG_NO_LIBRARY = "couldn't find libnvidia-ml.so"
_MSG_NVML_INIT = 'failed to initialize nvml'
_MSG_MISMATCH = 'version mismatch'
_MSG_NO_DEVICES = 'no devices were found'
_MSG_INVALID_FIELD = 'is not a valid field to query'
_MSG_NO_SUPPORTED = 'no supported gpus were found'
_MSG_BAD_OPTION = 'is not recognized. please run'
_INVALID_FIELD_RE = re.compile(r'Field "([^"]+)" is not a valid field to query|(\S+) : not a valid field to query',
                               re.IGNORECASE)

# The lost-GPU line in its real spellings: "for GPU1: 0000:34:00.0: Unknown
# Error" (driver 610: index, then the bus id with a four-digit domain), "for
# GPU0000:07:00.0: ..." and "for GPU 0000:0B:00.0: ..." (older drivers), and a
# lower-case "gpu". The index form needs a space after its colon, which a bus
# id never has, so "GPU0000:07:00.0" is not read as index 0000.
_LOST_RE = re.compile(r'Unable to determine the device handle for gpu\s*(?:(\d+):\s+)?'
                      r'([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f]+)\s*:\s*(.*)$', re.IGNORECASE)
_GPU_IS_LOST_RE = re.compile(r'GPU is lost\.', re.IGNORECASE)
_MESSAGE_MARKERS = (_MSG_NOT_LOADED, _MSG_NO_LIBRARY, 'please also try adding directory', _MSG_NVML_INIT,
                    'nvml library version', _MSG_NO_DEVICES, 'unable to determine the device handle', 'gpu is lost.',
                    _MSG_INVALID_FIELD, 'unable to determine the number of gpus', _MSG_BAD_OPTION)

_PLACEHOLDER_RE = re.compile(r'^\[.*\]$')
_MIB_RE = re.compile(r'^(\d+)(?:\s*MiB)?$', re.IGNORECASE)
_UNIT_VALUE_RE = re.compile(r'^(\d+(?:\.\d+)?)\s*(KiB|MiB|GiB|B)$', re.IGNORECASE)
_UNIT_FACTORS = {'b': 1.0 / MIB, 'kib': 1.0 / 1024, 'mib': 1.0, 'gib': 1024.0}
_HEADER_RE = re.compile(r'^(?P<name>[A-Za-z_][A-Za-z0-9_.]*)(?:\s*\[(?P<unit>[^\]]*)\])?$')
_BUS_ID_RE = re.compile(r'^(?:([0-9A-Fa-f]{1,8}):)?([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})\.([0-7])$')


class GpuQueryError(Exception):
    """A query failed in a way the caller must report (bad selector, missing library)."""


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
            proc = subprocess.run(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=full_env,
                                  timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            return 124, (exc.stdout or b'').decode('utf-8', 'replace'), 'timed out after %s s' % timeout
        except OSError as exc:
            return 127, '', str(exc)
        return proc.returncode, proc.stdout.decode('utf-8', 'replace'), proc.stderr.decode('utf-8', 'replace')
    return run


# ---------------------------------------------------------------------------
# Value parsing
# ---------------------------------------------------------------------------

def is_placeholder(value):
    """True for ``[N/A]``, ``[Not Supported]``, ``[GPU is lost]``, bare ``N/A``, ``ERR!`` or ''."""
    if value is None:
        return True
    text = value.strip()
    return text == '' or text.upper() in ('N/A', 'NA', 'ERR!') or bool(_PLACEHOLDER_RE.match(text))


def parse_mib(value):
    """``'29089 MiB'`` or ``'29089'`` -> ``(29089, None)``; placeholders -> ``(None, text)``.

    Other units (``KiB``, ``GiB``, ``B``) are converted to whole MiB. Anything
    unparseable is unknown, never 0.
    """
    if is_placeholder(value):
        return None, (value or '').strip() or '(empty)'
    text = value.strip()
    match = _MIB_RE.match(text)
    if match:
        return int(match.group(1)), None
    match = _UNIT_VALUE_RE.match(text)
    if match:
        mib = float(match.group(1)) * _UNIT_FACTORS[match.group(2).lower()]
        return int(round(mib)), None
    return None, text


def parse_int(value):
    """``'3'`` -> ``(3, None)``; placeholders and junk -> ``(None, text)``."""
    if is_placeholder(value):
        return None, (value or '').strip() or '(empty)'
    text = value.strip()
    if re.match(r'^-?\d+$', text):
        return int(text), None
    return None, text


def parse_text(value):
    """Plain text field: placeholders -> ``(None, text)``."""
    if is_placeholder(value):
        return None, (value or '').strip() or '(empty)'
    return value.strip(), None


def normalize_bus_id(value):
    """Canonical PCI bus id ``DDDDDDDD:BB:DD.F`` (upper case) or None.

    Accepts the 8-digit NVML form ``00000000:18:00.0``, the legacy 4-digit
    domain ``0000:18:00.0`` and the short ``18:00.0``.
    """
    if value is None:
        return None
    match = _BUS_ID_RE.match(str(value).strip())
    if not match:
        return None
    domain, bus, dev, func = match.groups()
    return '%08X:%02X:%02X.%X' % (int(domain or '0', 16), int(bus, 16), int(dev, 16), int(func, 16))


def split_row(line, nfields):
    """Split a CSV row into exactly ``nfields`` values (the last keeps any commas)."""
    parts = line.split(',', nfields - 1)
    return [p.strip() for p in parts]


def canonical_field(name):
    name = name.strip()
    return FIELD_ALIASES.get(name, name)


def parse_header(line):
    """``'index, memory.used [MiB]'`` -> ``[('index', None), ('memory.used', 'MiB')]`` or None."""
    names = []
    for part in line.split(','):
        match = _HEADER_RE.match(part.strip())
        if not match:
            return None
        names.append((canonical_field(match.group('name')), match.group('unit')))
    return names


def is_message_line(line):
    low = line.lower()
    return any(marker in low for marker in _MESSAGE_MARKERS)


def parse_lost_lines(text):
    """``[{'bus_id', 'reason', 'index'}]`` from "Unable to determine the device handle for GPU ..." lines.

    Bus ids are normalised to the eight-digit domain; ``index`` is the GPU
    index when the line names one (driver 610 and later), else None. A bare
    "GPU is lost.  Reboot the system..." line with no such line beside it
    gives one entry whose ``bus_id`` is None.
    """
    lost = []
    seen = set()
    bare = None
    for line in (text or '').splitlines():
        match = _LOST_RE.search(line)
        if match:
            bus = normalize_bus_id(match.group(2)) or match.group(2)
            if bus not in seen:
                seen.add(bus)
                index = int(match.group(1)) if match.group(1) is not None else None
                lost.append({'bus_id': bus, 'reason': match.group(3).strip() or 'unknown', 'index': index})
        elif bare is None and _GPU_IS_LOST_RE.search(line):
            bare = {'bus_id': None, 'reason': line.strip()}
    if not lost and bare is not None:
        bare['index'] = None
        lost.append(bare)
    return lost


def invalid_field(text):
    """The field name nvidia-smi rejected as "not a valid field to query", or None."""
    match = _INVALID_FIELD_RE.search(text or '')
    if not match:
        return None
    return (match.group(1) or match.group(2) or '').strip() or None


_RESET_FAILED_RE = re.compile(r'^\s*GPU\s+([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f]+)\s*:\s*(.+?)\s*$')
_RESET_IN_USE_OLD_RE = re.compile(r'GPU\s+([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f]+)\s+is currently in use '
                                  r'by another process', re.IGNORECASE)
_RESET_OK_RE = re.compile(r'GPU\s+([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f]+)\s+was successfully reset',
                          re.IGNORECASE)


def parse_reset_output(rc, stdout, stderr=''):
    """Read ``nvidia-smi --gpu-reset`` output: ``{'ok', 'reset': [bus ids], 'failed': {bus id: reason}, 'message'}``.

    Newer drivers refuse with "The following GPUs could not be reset:" and one
    indented "GPU 00000000:1A:00.0: In use by another client" line per GPU
    (rc 255); older ones with "GPU ... is currently in use by another
    process."; success is "GPU ... was successfully reset.".
    """
    text = '%s\n%s' % (stdout or '', stderr or '')
    reset = []
    failed = {}
    in_list = False
    for line in text.splitlines():
        if line.strip().lower().startswith('the following gpus could not be reset'):
            in_list = True
            continue
        ok = _RESET_OK_RE.search(line)
        if ok:
            reset.append(normalize_bus_id(ok.group(1)) or ok.group(1))
            continue
        old = _RESET_IN_USE_OLD_RE.search(line)
        if old:
            failed[normalize_bus_id(old.group(1)) or old.group(1)] = 'In use by another process'
            continue
        if in_list:
            match = _RESET_FAILED_RE.match(line)
            if match:
                failed[normalize_bus_id(match.group(1)) or match.group(1)] = match.group(2)
                continue
            if line.strip():
                in_list = False
    message = ' '.join(line.strip() for line in text.splitlines() if line.strip())
    return {'ok': rc == 0 and not failed, 'reset': reset, 'failed': failed, 'message': message}


def parse_csv(text, fields):
    """Parse nvidia-smi CSV output for the requested ``fields``.

    Works with and without the header line and with or without units.
    Message lines (driver errors, lost GPUs) are skipped; rows with too few
    values are reported as anomalies. Returns ``(rows, anomalies)``, each row
    a dict ``{field: raw text}``.
    """
    fields = [canonical_field(f) for f in fields]
    columns = list(fields)
    rows = []
    anomalies = []
    first = True
    for raw in (text or '').splitlines():
        line = raw.strip()
        if not line or is_message_line(line):
            continue
        if first:
            first = False
            header = parse_header(line)
            if header is not None:
                # A data row never parses as a header (values start with a
                # digit, contain '-' or spaces), so this line is the header.
                names = [h[0] for h in header]
                if len(names) == len(fields) and set(names) == set(fields):
                    columns = names
                continue
        values = split_row(line, len(columns))
        if len(values) != len(columns):
            anomalies.append(line)
            continue
        rows.append(dict(zip(columns, values)))
    return rows, anomalies


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


def detect_driver_failure(rc, stdout, stderr=''):
    """Recognise a node-wide nvidia-smi failure; returns a driver status dict or None.

    The messages are on stdout (docs/reference/nvidia-smi.md §1.5), so both the text
    and the exit code are checked: rc 9 or "couldn't communicate with the
    NVIDIA driver"; rc 12 or "couldn't find libnvidia-ml.so"; rc 18 or
    "Failed to initialize NVML: ... version mismatch"; "No devices were
    found". A lost GPU alone is *not* a node-wide failure (see
    :func:`parse_lost_lines`).
    """
    text = '%s\n%s' % (stdout or '', stderr or '')
    low = text.lower()
    message = ' '.join(line.strip() for line in text.splitlines() if line.strip())
    if rc == 9 or _MSG_NOT_LOADED in low:
        return driver_status(STATUS_NOT_LOADED, rc, message)
    if rc == 12 or _MSG_NO_LIBRARY in low:
        return driver_status(STATUS_NO_LIBRARY, rc, message)
    if rc == 18 or (_MSG_NVML_INIT in low and _MSG_MISMATCH in low):
        return driver_status(STATUS_MISMATCH, rc, message)
    if _MSG_NO_SUPPORTED in low:
        return driver_status(STATUS_NO_SUPPORTED, rc, message)
    if _MSG_BAD_OPTION in low:
        return driver_status(STATUS_BAD_OPTION, rc, message)
    if _MSG_NVML_INIT in low:
        return driver_status(STATUS_NVML_INIT, rc, message)
    if _MSG_NO_DEVICES in low:
        return driver_status(STATUS_NO_DEVICES, rc, message)
    if rc in (126, 127) and not (stdout or '').strip():
        return driver_status(STATUS_NOT_FOUND, rc, message)
    return None


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


def _junk(row, field, value):
    """True when ``row[field]`` is neither a value nor a placeholder (garbage or a cut-off row)."""
    return field in row and value is None and not is_placeholder(row[field])


def gpu_from_row(row, junk=None):
    """One GPU dict from a parsed ``--query-gpu`` row.

    Fields that hold neither a value nor a placeholder are appended to
    ``junk`` (a list) as ``field=text``.
    """
    unknown = {}

    def take(field, parser):
        if field not in row:
            return None
        value, placeholder = parser(row[field])
        if placeholder is not None:
            unknown[field] = placeholder
            if junk is not None and _junk(row, field, value):
                junk.append('%s=%r' % (field, row[field][:40]))
        return value

    gpu = {
        'index': take('index', parse_int),
        'uuid': take('uuid', parse_text),
        'name': take('name', parse_text),
        'bus_id': None,
        'used_mib': take('memory.used', parse_mib),
        'reserved_mib': take('memory.reserved', parse_mib),
        'total_mib': take('memory.total', parse_mib),
        'free_mib': take('memory.free', parse_mib),
        'processes': [],
        'unknown_fields': unknown,
        'lost': False,
        'lost_reason': None,
    }
    bus = take('pci.bus_id', parse_text)
    gpu['bus_id'] = normalize_bus_id(bus) or bus
    if junk is not None and bus is not None and normalize_bus_id(bus) is None:
        junk.append('pci.bus_id=%r' % bus[:40])
    if junk is not None and gpu['uuid'] is not None and not gpu['uuid'].upper().startswith('GPU-'):
        junk.append('uuid=%r' % gpu['uuid'][:40])
    mig = take('mig.mode.current', parse_text)
    gpu['mig_mode'] = mig
    if 'memory.reserved' not in row:
        unknown['memory.reserved'] = '(not queried)'
    for field, placeholder in unknown.items():
        low = placeholder.lower()
        if 'gpu is lost' in low:
            gpu['lost'] = True
            gpu['lost_reason'] = '%s: %s' % (field, placeholder)
    return gpu


def process_from_row(row, junk=None):
    """One process dict from a parsed ``--query-compute-apps`` row (junk fields go to ``junk``)."""
    unknown = {}
    pid, placeholder = parse_int(row.get('pid'))
    if placeholder is not None:
        unknown['pid'] = placeholder
        if junk is not None and _junk(row, 'pid', pid):
            junk.append('pid=%r' % row['pid'][:40])
    used, placeholder = parse_mib(row.get('used_gpu_memory'))
    if placeholder is not None:
        unknown['used_gpu_memory'] = placeholder
        if junk is not None and _junk(row, 'used_gpu_memory', used):
            junk.append('used_gpu_memory=%r' % row['used_gpu_memory'][:40])
    name, placeholder = parse_text(row.get('process_name'))
    if placeholder is not None:
        unknown['process_name'] = placeholder
    uuid, placeholder = parse_text(row.get('gpu_uuid'))
    if placeholder is not None:
        unknown['gpu_uuid'] = placeholder
    elif junk is not None and not uuid.upper().startswith(('GPU-', 'MIG-')):
        junk.append('gpu_uuid=%r' % uuid[:40])
    return {'pid': pid, 'used_mib': used, 'name': name, 'gpu_uuid': uuid, 'unknown_fields': unknown}


def assemble(gpus, processes, lost, backend, driver=None, anomalies=None, calls=0):
    """Attach processes to their GPUs (by UUID) and mark lost GPUs; returns a snapshot."""
    snap = empty_snapshot(backend, driver)
    snap['calls'] = calls
    snap['anomalies'] = list(anomalies or [])
    by_uuid = {}
    for gpu in gpus:
        if gpu.get('uuid'):
            by_uuid[gpu['uuid'].upper()] = gpu
    for proc in processes:
        uuid = (proc.get('gpu_uuid') or '').upper()
        gpu = by_uuid.get(uuid)
        entry = {'pid': proc['pid'], 'used_mib': proc['used_mib'], 'name': proc['name']}
        if proc.get('unknown_fields'):
            entry['unknown_fields'] = dict(proc['unknown_fields'])
        if gpu is None:
            entry['gpu_uuid'] = proc.get('gpu_uuid')
            snap['unmatched_processes'].append(entry)
        else:
            gpu['processes'].append(entry)
    lost = list(lost or [])
    for entry in lost:
        for gpu in gpus:
            if entry.get('bus_id') and gpu.get('bus_id') == entry['bus_id']:
                gpu['lost'] = True
                gpu['lost_reason'] = entry['reason']
    snap['gpus'] = sorted(gpus, key=lambda g: (g['index'] is None, g['index'] if g['index'] is not None else 0))
    snap['lost'] = lost
    return snap


def parse_query_gpu(text, fields=GPU_FIELDS):
    """GPU dicts from ``--query-gpu`` output; returns ``(gpus, lost, anomalies)``.

    ``anomalies`` lists the lines that could not be read: rows with the wrong
    number of columns (a cut-off row) and rows whose values are neither values
    nor placeholders (garbage).
    """
    rows, anomalies = parse_csv(text, fields)
    gpus = []
    for row in rows:
        junk = []
        gpus.append(gpu_from_row(row, junk))
        if junk:
            anomalies.append('row with unreadable values (%s)' % ', '.join(junk))
    return gpus, parse_lost_lines(text), anomalies


def parse_compute_apps(text, fields=APP_FIELDS):
    """Process dicts from ``--query-compute-apps`` output; returns ``(processes, anomalies)``."""
    rows, anomalies = parse_csv(text, fields)
    processes = []
    for row in rows:
        junk = []
        processes.append(process_from_row(row, junk))
        if junk:
            anomalies.append('process row with unreadable values (%s)' % ', '.join(junk))
    return processes, anomalies


def _unparsable(what, details):
    shown = '; '.join(d[:160] for d in details[:3])
    if len(details) > 3:
        shown += '; ... (%d more)' % (len(details) - 3)
    return '%s: %s: %s' % (UNPARSABLE_PREFIX, what, shown)


def _has_header(text, fields):
    for raw in (text or '').splitlines():
        line = raw.strip()
        if not line or is_message_line(line):
            continue
        header = parse_header(line)
        return header is not None and set(h[0] for h in header) == set(canonical_field(f) for f in fields)
    return False


def snapshot_from_outputs(gpu_result, apps_result, backend=BACKEND_NVIDIA_SMI, gpu_fields=GPU_FIELDS,
                          app_fields=APP_FIELDS):
    """Build a snapshot from two ``(rc, stdout, stderr)`` results (pure; used by tests).

    ``apps_result`` may be None when the GPU query already failed.
    """
    rc, out, err = gpu_result
    calls = 1 if apps_result is None else 2
    failure = detect_driver_failure(rc, out, err)
    if failure is not None:
        snap = empty_snapshot(backend, failure)
        snap['calls'] = calls
        return snap
    gpus, lost, anomalies = parse_query_gpu(out, gpu_fields)
    lost = lost or parse_lost_lines(err)
    if rc != 0 and not gpus and not lost:
        status = STATUS_TIMEOUT if rc == 124 else STATUS_ERROR
        message = ' '.join(line.strip() for line in ('%s\n%s' % (out, err)).splitlines() if line.strip())
        snap = empty_snapshot(backend, driver_status(status, rc, message))
        snap['calls'] = calls
        return snap
    if anomalies or (not gpus and not lost):
        details = list(anomalies) or ['no GPU rows (%s)' % ('a header and nothing else' if _has_header(out, gpu_fields)
                                                            else 'empty output' if not (out or '').strip()
                                                            else 'no line looks like a GPU row')]
        snap = empty_snapshot(backend, driver_status(STATUS_UNPARSABLE, rc, _unparsable('--query-gpu', details)))
        snap['calls'] = calls
        snap['anomalies'] = list(anomalies)
        return snap
    processes = []
    driver = driver_status()
    if apps_result is not None:
        arc, aout, aerr = apps_result
        failure = detect_driver_failure(arc, aout, aerr)
        if failure is not None:
            snap = empty_snapshot(backend, failure)
            snap['calls'] = calls
            return snap
        processes, app_anomalies = parse_compute_apps(aout, app_fields)
        if app_anomalies:
            snap = empty_snapshot(backend, driver_status(STATUS_UNPARSABLE, arc,
                                                         _unparsable('--query-compute-apps', app_anomalies)))
            snap['calls'] = calls
            snap['anomalies'] = list(app_anomalies)
            return snap
        for entry in parse_lost_lines('%s\n%s' % (aout, aerr)):
            if entry['bus_id'] not in [e['bus_id'] for e in lost]:
                lost.append(entry)
        if arc != 0 and not processes and not parse_lost_lines('%s\n%s' % (aout, aerr)):
            status = STATUS_TIMEOUT if arc == 124 else STATUS_ERROR
            message = ' '.join(line.strip() for line in ('%s\n%s' % (aout, aerr)).splitlines() if line.strip())
            driver = driver_status(status, arc, 'process query failed: %s' % message)
    return assemble(gpus, processes, lost, backend, driver=driver, anomalies=anomalies, calls=calls)


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
            if gpu_result[0] == 0 or _MSG_INVALID_FIELD not in text.lower():
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
            status = _RC_STATUS.get(value, STATUS_NVML_INIT)
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


# ---------------------------------------------------------------------------
# Selection and aggregation
# ---------------------------------------------------------------------------

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
