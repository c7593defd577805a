# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""nvidia-smi's text, parsed: CSV rows, headers, placeholders, driver failures, lost GPUs, reset output.

Pure functions over strings (docs/reference/nvidia-smi.md, "Parsing rules" and "Failures"); the backends
(``backends.py``) run nvidia-smi and hand its output here. Standard library only.
"""
from __future__ import annotations

import re

from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu.query import (
    normalize_bus_id,
    APP_FIELDS,
    BACKEND_NVIDIA_SMI,
    FIELD_ALIASES,
    GPU_FIELDS,
    MIB,
    STATUS_BAD_OPTION,
    STATUS_ERROR,
    STATUS_MISMATCH,
    STATUS_NOT_FOUND,
    STATUS_NOT_LOADED,
    STATUS_NO_DEVICES,
    STATUS_NO_LIBRARY,
    STATUS_NO_SUPPORTED,
    STATUS_NVML_INIT,
    STATUS_TIMEOUT,
    STATUS_UNPARSABLE,
    UNPARSABLE_PREFIX,
    driver_status,
    empty_snapshot,
)


RC_STATUS = {9: STATUS_NOT_LOADED, 12: STATUS_NO_LIBRARY, 18: STATUS_MISMATCH}

_MSG_NOT_LOADED = "couldn't communicate with the nvidia driver"
_MSG_NO_LIBRARY = "couldn't find libnvidia-ml.so"
_MSG_NVML_INIT = 'failed to initialize nvml'
_MSG_MISMATCH = 'version mismatch'
_MSG_NO_DEVICES = 'no devices were found'
MSG_INVALID_FIELD = 'is not a valid field to query'
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
                    MSG_INVALID_FIELD, 'unable to determine the number of gpus', _MSG_BAD_OPTION)

_PLACEHOLDER_RE = re.compile(r'^\[.*\]$')
_MIB_RE = re.compile(r'^(\d+)(?:\s*MiB)?$', re.IGNORECASE)
_UNIT_VALUE_RE = re.compile(r'^(\d+(?:\.\d+)?)\s*(KiB|MiB|GiB|B)$', re.IGNORECASE)
_UNIT_FACTORS = {'b': 1.0 / MIB, 'kib': 1.0 / 1024, 'mib': 1.0, 'gib': 1024.0}
_HEADER_RE = re.compile(r'^(?P<name>[A-Za-z_][A-Za-z0-9_.]*)(?:\s*\[(?P<unit>[^\]]*)\])?$')


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
