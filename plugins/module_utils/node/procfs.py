# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Linux ``/proc`` helpers for the GPU modules (standard library only).

Everything here reads ``/proc`` (or another root given as ``proc_root``, which
the unit tests use for synthetic trees) and never raises for a process that
vanished between two reads: such a process is simply absent from the result.

The main entry points:

* :func:`process_table` takes a snapshot ``{pid: ProcInfo}`` of every process;
  :func:`children_map`, :func:`descendants` and :func:`ancestors` walk it
  without touching ``/proc`` again, so decisions are pure functions of the
  snapshot.
* :func:`read_proc` reads one process; :func:`parse_stat`,
  :func:`parse_cmdline` and :func:`parse_cgroup` are the pure parsers behind it.
* :func:`systemd_unit_from_cgroup` finds the systemd service of a process from
  its ``/proc/<pid>/cgroup`` (cgroup v1 or v2).
* :func:`device_fds` lists the descriptors of a process that point at GPU
  device nodes (``/dev/nvidia*`` by default; the pattern is a parameter).
* Signalling and waiting are the stop engine's (``stop.py``: pinned process
  handles, ``wait_gone``) and the waiter's (``wait.py``: ``Deadline``);
  ``procfs.ProcessHandle``, ``procfs.wait_gone`` and ``procfs.Deadline`` name
  them for older callers.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import re
import signal

from ansible_collections.gpufleet.sglang.plugins.module_utils.common import secrets
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import wait

PROC_ROOT = '/proc'

# Default device-node patterns for "holds a GPU device open" (fnmatch globs).
DEFAULT_DEVICE_PATTERNS = ('/dev/nvidia*',)

# States that mean "has exited" for our purposes: zombie (exited, not reaped)
# and dead (being torn down). A zombie thread-group leader whose other threads
# still run is *not* exited: those threads keep the process's files, GPU
# contexts included (docs/reference/nvidia-smi.md §3.2 a); see :func:`is_exited`.
EXITED_STATES = frozenset(('Z', 'X', 'x'))

STATE_NAMES = {
    'R': 'running',
    'S': 'sleeping',
    'D': 'uninterruptible sleep',
    'Z': 'zombie',
    'T': 'stopped',
    't': 'tracing stop',
    'X': 'dead',
    'x': 'dead',
    'I': 'idle',
    'P': 'parked',
    'W': 'paging',
    'K': 'wakekill',
}

SECRET_FLAGS = secrets.SECRET_FLAGS
MASK = secrets.MASK

_UNIT_SUFFIXES = ('.service', '.scope')


class ProcInfo(object):
    """One process as seen in ``/proc`` at snapshot time.

    ``cmdline`` is a tuple of arguments (empty for kernel threads and
    zombies); ``starttime`` is field 22 of ``/proc/<pid>/stat`` in clock
    ticks since boot, which together with the PID identifies a process.
    ``cgroup`` is the path in the systemd hierarchy (v2 unified or v1
    ``name=systemd``); ``unit`` the service (or scope) it belongs to and
    ``unit_manager`` ``system`` or ``user``.
    """

    __slots__ = ('pid', 'ppid', 'pgid', 'sid', 'state', 'comm', 'cmdline', 'starttime',
                 'uid', 'cgroup', 'unit', 'unit_manager', 'num_threads')

    def __init__(self, pid, ppid=0, pgid=0, sid=0, state='S', comm='', cmdline=(), starttime=0,
                 uid=None, cgroup=None, unit=None, unit_manager=None, num_threads=1):
        self.pid = int(pid)
        self.ppid = int(ppid)
        self.pgid = int(pgid)
        self.sid = int(sid)
        self.state = state
        self.comm = comm
        self.cmdline = tuple(cmdline)
        self.starttime = int(starttime)
        self.uid = uid
        self.cgroup = cgroup
        self.unit = unit
        self.unit_manager = unit_manager
        self.num_threads = num_threads

    @property
    def exited(self):
        """True for a zombie or dead process that has released its files."""
        return is_exited(self.state, self.num_threads)

    @property
    def exe_name(self):
        """Basename of ``argv[0]``, or ``comm`` when there is no command line."""
        if self.cmdline and self.cmdline[0]:
            return os.path.basename(self.cmdline[0])
        return self.comm

    @property
    def cmdline_str(self):
        """The command line joined with spaces (``[comm]`` for kernel threads)."""
        if self.cmdline:
            return ' '.join(self.cmdline)
        return '[%s]' % self.comm

    def to_dict(self):
        return dict((name, getattr(self, name)) for name in self.__slots__)

    def __repr__(self):
        return 'ProcInfo(pid=%d, ppid=%d, pgid=%d, sid=%d, state=%r, comm=%r)' % (
            self.pid, self.ppid, self.pgid, self.sid, self.state, self.comm)


# ---------------------------------------------------------------------------
# Pure parsers
# ---------------------------------------------------------------------------

def parse_stat(text):
    """Parse the text of ``/proc/<pid>/stat``.

    ``comm`` sits in parentheses and may itself contain spaces and
    parentheses, so the fields after it are found from the *last* ``)``.
    Returns a dict with ``pid``, ``comm``, ``state``, ``ppid``, ``pgid``,
    ``sid``, ``tty_nr``, ``num_threads`` and ``starttime``, or None when the
    text is not a stat line.
    """
    if not text:
        return None
    open_paren = text.find('(')
    close_paren = text.rfind(')')
    if open_paren < 0 or close_paren < open_paren:
        return None
    try:
        pid = int(text[:open_paren].strip())
    except ValueError:
        return None
    comm = text[open_paren + 1:close_paren]
    rest = text[close_paren + 1:].split()
    # rest[0] is field 3 (state); field N is rest[N - 3].
    if len(rest) < 20:
        return None
    try:
        return {
            'pid': pid,
            'comm': comm,
            'state': rest[0],
            'ppid': int(rest[1]),
            'pgid': int(rest[2]),
            'sid': int(rest[3]),
            'tty_nr': int(rest[4]),
            'num_threads': int(rest[17]),
            'starttime': int(rest[19]),
        }
    except ValueError:
        return None


def parse_cmdline(data):
    """Split the NUL-separated bytes (or text) of ``/proc/<pid>/cmdline``.

    A trailing NUL does not produce an empty argument; a process that
    rewrote its title with spaces (``sglang::scheduler_TP0``) stays one
    argument. Undecodable bytes are replaced, never fatal.
    """
    if not data:
        return []
    if isinstance(data, bytes):
        data = data.decode('utf-8', 'replace')
    if data.endswith('\0'):
        data = data[:-1]
    return data.split('\0')


def parse_cgroup(text):
    """Parse ``/proc/<pid>/cgroup`` into ``[(hierarchy_id, controllers, path)]``."""
    entries = []
    for line in (text or '').splitlines():
        parts = line.split(':', 2)
        if len(parts) != 3:
            continue
        entries.append((parts[0], parts[1], parts[2]))
    return entries


def systemd_cgroup_path(text):
    """Return the path of the systemd hierarchy from ``/proc/<pid>/cgroup``.

    cgroup v2 (and hybrid) exposes it as ``0::<path>``; pure v1 as
    ``N:name=systemd:<path>``. The v1 ``name=systemd`` entry wins when both
    exist (hybrid mode keeps systemd's tree there), otherwise the unified one.
    """
    unified = None
    for hier, controllers, path in parse_cgroup(text):
        if 'name=systemd' in controllers.split(','):
            return path
        if hier == '0' and controllers == '':
            unified = path
    return unified


def systemd_unit_from_cgroup(text):
    """Find the systemd unit of a process from its ``/proc/<pid>/cgroup`` text.

    Returns ``(unit, manager, unit_path)`` where ``unit`` is e.g.
    ``sglang-main.service``, ``manager`` is ``system`` or ``user`` (a unit of a
    ``user@UID.service`` manager) and ``unit_path`` the cgroup path of the unit
    itself (sub-cgroups a delegated service creates are cut off). Returns
    ``(None, None, None)`` outside any service or scope, e.g. for ``/`` or a
    container's cgroup.
    """
    path = systemd_cgroup_path(text)
    if not path:
        return None, None, None
    parts = [p for p in path.split('/') if p]
    unit = None
    unit_index = None
    manager = 'system'
    for i, part in enumerate(parts):
        if part.startswith('user@') and part.endswith('.service'):
            # Everything below is managed by the per-user systemd instance.
            manager = 'user'
            unit, unit_index = None, None
            continue
        if part.endswith(_UNIT_SUFFIXES):
            unit, unit_index = part, i
    if unit is None:
        return None, None, None
    return unit, manager, '/' + '/'.join(parts[:unit_index + 1])


def is_exited(state, num_threads=1):
    """True for a zombie/dead process with no live thread left.

    A ``Z`` leader that still counts more than one thread has only lost its
    main thread; the others run on and hold the process's descriptors.
    """
    return state in EXITED_STATES and (num_threads is None or num_threads <= 1)


def state_name(state):
    """``'D'`` -> ``'D (uninterruptible sleep)'``."""
    if not state:
        return 'unknown'
    name = STATE_NAMES.get(state)
    return '%s (%s)' % (state, name) if name else state


# ---------------------------------------------------------------------------
# Readers
# ---------------------------------------------------------------------------

def _read(path, binary=False):
    try:
        with open(path, 'rb' if binary else 'r') as fh:
            return fh.read()
    except (IOError, OSError, UnicodeDecodeError):
        return None


def read_stat(pid, proc_root=PROC_ROOT):
    """Parsed ``/proc/<pid>/stat``, or None when the process is gone."""
    data = _read(os.path.join(proc_root, str(pid), 'stat'), binary=True)
    if data is None:
        return None
    return parse_stat(data.decode('utf-8', 'replace'))


def read_cmdline(pid, proc_root=PROC_ROOT):
    """Arguments of a process (``[]`` for kernel threads, zombies, or when gone)."""
    return parse_cmdline(_read(os.path.join(proc_root, str(pid), 'cmdline'), binary=True))


def read_comm(pid, proc_root=PROC_ROOT):
    """``/proc/<pid>/comm`` without the newline, or None."""
    data = _read(os.path.join(proc_root, str(pid), 'comm'), binary=True)
    if data is None:
        return None
    return data.decode('utf-8', 'replace').rstrip('\n')


def read_cgroup(pid, proc_root=PROC_ROOT):
    """Raw text of ``/proc/<pid>/cgroup``, or None."""
    return _read(os.path.join(proc_root, str(pid), 'cgroup'))


def read_uid(pid, proc_root=PROC_ROOT):
    """Real UID from ``/proc/<pid>/status``, or None."""
    text = _read(os.path.join(proc_root, str(pid), 'status'))
    for line in (text or '').splitlines():
        if line.startswith('Uid:'):
            fields = line.split()
            if len(fields) > 1 and fields[1].isdigit():
                return int(fields[1])
    return None


def read_proc(pid, proc_root=PROC_ROOT, with_cgroup=True):
    """Read one process into a :class:`ProcInfo`, or None if it is gone."""
    stat = read_stat(pid, proc_root)
    if stat is None:
        return None
    info = ProcInfo(
        pid=stat['pid'], ppid=stat['ppid'], pgid=stat['pgid'], sid=stat['sid'],
        state=stat['state'], comm=stat['comm'], starttime=stat['starttime'],
        num_threads=stat['num_threads'],
        cmdline=read_cmdline(pid, proc_root),
        uid=read_uid(pid, proc_root),
    )
    if with_cgroup:
        text = read_cgroup(pid, proc_root)
        info.cgroup = systemd_cgroup_path(text)
        info.unit, info.unit_manager, dummy = systemd_unit_from_cgroup(text)
    return info


def list_pids(proc_root=PROC_ROOT):
    """Numeric entries of ``/proc`` (thread-group leaders), sorted."""
    try:
        names = os.listdir(proc_root)
    except OSError:
        return []
    return sorted(int(n) for n in names if n.isdigit())


def process_table(proc_root=PROC_ROOT, with_cgroup=True):
    """Snapshot every process: ``{pid: ProcInfo}``.

    Processes that exit while the snapshot is taken are left out.
    """
    table = {}
    for pid in list_pids(proc_root):
        info = read_proc(pid, proc_root, with_cgroup=with_cgroup)
        if info is not None:
            table[pid] = info
    return table


# ---------------------------------------------------------------------------
# Tree walks over a snapshot (pure)
# ---------------------------------------------------------------------------

def children_map(table):
    """``{ppid: [child pids, ascending]}`` for a process table."""
    kids = {}
    for info in table.values():
        kids.setdefault(info.ppid, []).append(info.pid)
    for pids in kids.values():
        pids.sort()
    return kids


def children(table, pid, kids=None):
    """Direct children of ``pid`` in the snapshot."""
    kids = children_map(table) if kids is None else kids
    return list(kids.get(pid, ()))


def descendants(table, pid, kids=None):
    """Every descendant of ``pid`` (breadth first, nearest first), never ``pid``."""
    kids = children_map(table) if kids is None else kids
    out = []
    seen = set([pid])
    queue = list(kids.get(pid, ()))
    while queue:
        child = queue.pop(0)
        if child in seen:
            continue
        seen.add(child)
        out.append(child)
        queue.extend(kids.get(child, ()))
    return out


def ancestors(table, pid):
    """Ancestors of ``pid``, parent first, up to (and including) PID 1.

    Stops at PID 0 (the kernel), at a parent missing from the snapshot, and on
    a cycle (a PID reused while the snapshot was taken).
    """
    out = []
    seen = set([pid])
    info = table.get(pid)
    while info is not None and info.ppid > 0 and info.ppid not in seen:
        out.append(info.ppid)
        seen.add(info.ppid)
        info = table.get(info.ppid)
    return out


def self_and_ancestors(proc_root=PROC_ROOT):
    """The current process and its live ancestors, read from ``/proc``."""
    chain = [os.getpid()]
    pid = os.getpid()
    for dummy in range(4096):
        stat = read_stat(pid, proc_root)
        if stat is None or stat['ppid'] <= 0 or stat['ppid'] in chain:
            break
        pid = stat['ppid']
        chain.append(pid)
    return chain


def processes_in_cgroup(table, unit_path):
    """PIDs whose systemd cgroup is ``unit_path`` or below it."""
    prefix = unit_path.rstrip('/') + '/'
    return sorted(info.pid for info in table.values()
                  if info.cgroup and (info.cgroup == unit_path or info.cgroup.startswith(prefix)))


def oldest(table, pids):
    """The PID with the smallest start time (ties: the smallest PID), or None."""
    candidates = [table[p] for p in pids if p in table]
    if not candidates:
        return None
    return min(candidates, key=lambda i: (i.starttime, i.pid)).pid


# ---------------------------------------------------------------------------
# Device descriptors
# ---------------------------------------------------------------------------

def device_fds(pid, patterns=DEFAULT_DEVICE_PATTERNS, proc_root=PROC_ROOT):
    """Targets of ``/proc/<pid>/fd/*`` links that match one of ``patterns``.

    ``patterns`` are fnmatch globs such as ``/dev/nvidia*`` (pass
    ``$GPUSIM_ROOT/dev/nvidia*`` for the simulator). Returns a sorted list of
    distinct paths, ``[]`` when none match or the process is gone, and None
    when the descriptors cannot be read (permission denied): "unknown" is
    never reported as "none".
    """
    fd_dir = os.path.join(proc_root, str(pid), 'fd')
    try:
        names = os.listdir(fd_dir)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM):
            return None
        return []
    found = set()
    for name in names:
        try:
            target = os.readlink(os.path.join(fd_dir, name))
        except OSError:
            continue
        if target.endswith(' (deleted)'):
            target = target[:-len(' (deleted)')]
        for pattern in patterns:
            if fnmatch.fnmatchcase(target, pattern):
                found.add(target)
                break
    return sorted(found)


def device_holders(table, patterns=DEFAULT_DEVICE_PATTERNS, proc_root=PROC_ROOT):
    """``{pid: [device paths]}`` for every process of ``table`` with a matching descriptor."""
    out = {}
    for pid in sorted(table):
        paths = device_fds(pid, patterns, proc_root)
        if paths:
            out[pid] = paths
    return out


_GPU_NODE_RE = re.compile(r'(\d+)$')


def device_gpu_index(path):
    """``/dev/nvidia3`` -> 3 (the device minor; usually, not always, the index)."""
    base = os.path.basename(path)
    if not base.startswith('nvidia'):
        return None
    match = _GPU_NODE_RE.search(base)
    if match and base[len('nvidia'):].isdigit():
        return int(match.group(1))
    return None


# ---------------------------------------------------------------------------
# Signalling and waiting live in stop.py and wait.py
# ---------------------------------------------------------------------------

Deadline = wait.Deadline


def __getattr__(name):
    """``procfs.ProcessHandle`` and ``procfs.wait_gone`` are the stop engine's (``stop.py``)."""
    if name in ('ProcessHandle', 'wait_gone'):
        from ansible_collections.gpufleet.sglang.plugins.module_utils.node import stop
        return getattr(stop, name)
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def read_signal_masks(pid, proc_root=PROC_ROOT):
    """``{'SigIgn': int, 'SigCgt': int, 'SigBlk': int, 'SigPnd': int}`` from ``/proc/<pid>/status``, or None."""
    text = _read(os.path.join(proc_root, str(pid), 'status'))
    if text is None:
        return None
    masks = {}
    for line in text.splitlines():
        name, sep, value = line.partition(':')
        if sep and name in ('SigIgn', 'SigCgt', 'SigBlk', 'SigPnd'):
            try:
                masks[name] = int(value.strip(), 16)
            except ValueError:
                pass
    return masks


def signal_name(sig):
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


def parse_signal(value):
    """``'SIGTERM'``, ``'TERM'``, ``'term'`` or ``15`` -> ``signal.SIGTERM``.

    Raises ValueError for anything else.
    """
    if isinstance(value, int):
        return signal.Signals(value)
    text = str(value).strip().upper()
    if text.isdigit():
        return signal.Signals(int(text))
    if not text.startswith('SIG'):
        text = 'SIG' + text
    try:
        return signal.Signals[text]
    except KeyError:
        raise ValueError('unknown signal %r' % (value,))
