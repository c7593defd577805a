# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Which container a process runs in, from its ``/proc/<pid>/cgroup`` (issue 24).

A server run by a container engine must not be adopted or signalled from the host: the engine (or its restart
policy, or the kubelet) starts it again and it takes the port and the GPUs back after the outage has begun.

* :func:`container_from_cgroup` (pure): ``{"runtime", "id", "part"}`` or None for a host process. Layouts:
  docker (``docker-<id>.scope``, ``/docker/<id>``), podman (``libpod-<id>.scope``, ``libpod-<id>``,
  ``libpod-conmon-<id>.scope``, ``.../libpod-<id>.scope/container``), containerd/CRI (``cri-containerd-<id>.scope``,
  ``cri-containerd:<id>``), CRI-O (``crio-<id>.scope``), kubernetes cgroupfs (``/kubepods/<qos>/pod<uid>/<id>``);
  cgroup v1 and v2 alike (every hierarchy line is read).
* :func:`container_of`: the same for a PID (None when it is gone or on the host).
* :func:`foreign_container`: the container of a PID unless it is the one this module itself runs in.
* :func:`inspect`: name, image and restart policy from ``<runtime> container inspect <id>`` where the
  CLI is installed; never raises (without the CLI, or when it fails, the id alone names the container).
* :func:`describe` and :func:`fix`: the words the preflight uses.
* :func:`adoptable` (pure), :func:`adopted_entry`: which containers the plan adopts (a docker or podman container that
  serves on the managed port, or one named in ``adopt_containers``) and what the plan records of one.
* :func:`stop_adopted` and :func:`start_adopted`: the teardown and the restore of an adopted container through its
  runtime's CLI (argv lists, a timeout; never a signal from the host). Verified against docker 20.10 and podman 4.3:
  ``docker update --restart=no`` changes the policy of a running container; ``podman update`` (4.3) cannot change it,
  but podman never restarts a container stopped with ``podman stop``. ``<cli> stop -t N`` sends the stop signal and
  SIGKILL after N s.
"""

from __future__ import annotations

import json
import re
import shutil
import math
import subprocess

from ansible_collections.gpufleet.sglang.plugins.module_utils.node import procfs

_ID = r'([0-9a-f]{64})'
# (regex on one cgroup path segment or path tail, runtime, part). First match wins; "conmon" is podman's monitor.
_PATTERNS = (
    (re.compile(r'(?:^|/)libpod-conmon-' + _ID + r'(?:\.scope)?(?:/|$)'), 'podman', 'conmon'),
    (re.compile(r'(?:^|/)libpod-' + _ID + r'(?:\.scope)?(?:/|$)'), 'podman', 'container'),
    (re.compile(r'(?:^|/)docker-' + _ID + r'\.scope(?:/|$)'), 'docker', 'container'),
    (re.compile(r'(?:^|/)docker/' + _ID + r'(?:/|$)'), 'docker', 'container'),
    (re.compile(r'(?:^|/)cri-containerd-' + _ID + r'\.scope(?:/|$)'), 'containerd', 'container'),
    (re.compile(r':cri-containerd:' + _ID + r'(?:/|$)'), 'containerd', 'container'),
    (re.compile(r'(?:^|/)crio-' + _ID + r'\.scope(?:/|$)'), 'cri-o', 'container'),
    (re.compile(r'(?:^|/)kubepods(?:/[a-z]+)?/pod[0-9a-f_-]+/' + _ID + r'(?:/|$)'), 'kubernetes', 'container'),
)
# The runtimes whose CLI names a container by ``container inspect``; the others are named by id only.
CLIS = {'docker': 'docker', 'podman': 'podman'}
INSPECT_TIMEOUT = 10


def container_from_cgroup(text):
    """``{"runtime", "id", "part"}`` of the container a ``/proc/<pid>/cgroup`` text places the process in, else None."""
    # Every hierarchy: v2 has one line (0::), v1 one per controller; a hybrid host may show the container in either.
    for dummy, dummy2, path in procfs.parse_cgroup(text):
        for regex, runtime, part in _PATTERNS:
            match = regex.search(path)
            if match:
                return {'runtime': runtime, 'id': match.group(1), 'part': part}
    return None


def container_of(pid, proc_root=procfs.PROC_ROOT):
    """The container of ``pid`` (``"self"`` works), or None on the host or when the process is gone."""
    text = procfs.read_cgroup(pid, proc_root)
    return container_from_cgroup(text) if text else None


def foreign_container(pid, proc_root=procfs.PROC_ROOT, own=None):
    """The container of ``pid`` unless this module runs in that same container (then signals from here are the
    container's own business, as on a host). ``own``: this process's container (looked up when omitted)."""
    found = container_of(pid, proc_root)
    if found is None:
        return None
    mine = own if own is not None else container_of('self', proc_root)
    if mine and mine.get('id') == found['id']:
        return None
    return found


def first_object(text):
    """The first object of an ``inspect`` output (a JSON list of objects, or one object), else None."""
    try:
        data = json.loads(text)
    except (TypeError, ValueError):
        return None
    if isinstance(data, list):
        data = data[0] if data else None
    return data if isinstance(data, dict) else None


def parse_inspect(text):
    """Name, image, image id, restart policy and status from ``docker/podman container inspect <id>``.

    Both print a JSON list with one object per container by default (no ``--format``: docker 20.10's CLI, the one
    Debian 12 ships, prints the word ``json`` for ``--format json``; measured); docker's ``Name`` has a leading
    ``/``, podman adds ``ImageName``. A single object is read too. Returns a dict (missing fields None) or None when
    the text is neither."""
    data = first_object(text)
    if data is None:
        return None
    config = data.get('Config') if isinstance(data.get('Config'), dict) else {}
    host = data.get('HostConfig') if isinstance(data.get('HostConfig'), dict) else {}
    policy = host.get('RestartPolicy') if isinstance(host.get('RestartPolicy'), dict) else {}
    state = data.get('State') if isinstance(data.get('State'), dict) else {}
    name = data.get('Name')
    return {
        'id': data.get('Id'),
        'name': name.lstrip('/') if isinstance(name, str) and name.strip('/') else None,
        'image': data.get('ImageName') or config.get('Image') or None,
        'image_id': data.get('Image') or None,
        'restart_policy': policy.get('Name') or 'no',
        'status': state.get('Status'),
        'pid': state.get('Pid'),
        'labels': dict(config.get('Labels') or {}) if isinstance(config.get('Labels'), dict) else {},
        'mounts': [(m.get('Source'), m.get('Destination')) for m in data.get('Mounts') or [] if isinstance(m, dict)],
    }


def inspect(found, timeout=INSPECT_TIMEOUT, which=shutil.which, run=subprocess.run):
    """``found`` (from :func:`container_of`) with name, image, image_id, restart_policy and ``inspected`` added.

    ``<runtime> container inspect <id>`` (argv list, ``timeout`` s) where the runtime's CLI is in PATH.
    A missing CLI, an error or unparsable output leaves those fields None and ``inspect_error`` says why."""
    out = dict(found, name=None, image=None, image_id=None, restart_policy=None, inspected=False, inspect_error=None)
    cli = CLIS.get(found.get('runtime'))
    path = which(cli) if cli else None
    if not path:
        out['inspect_error'] = ('%s is not installed here' % cli) if cli else 'no CLI of %s is used here' % found.get('runtime')
        return out
    try:
        rc, text, err = _run([path, 'container', 'inspect', found['id']], timeout, run)     # the preflight's census
    except (OSError, subprocess.SubprocessError) as exc:
        out['inspect_error'] = '%s container inspect failed: %s' % (cli, exc)
        return out
    info = parse_inspect(text)
    if rc != 0 or info is None:
        out['inspect_error'] = '%s container inspect exited %s: %s' % (cli, rc, err[:200] or 'no output')
        return out
    for key in ('name', 'image', 'image_id', 'restart_policy'):
        out[key] = info[key]
    out['inspected'] = True
    return out


def describe(c):
    """``podman container web (id 92cd4aeb07a1, image localhost/x:1, restart policy always)``."""
    short = (c.get('id') or '')[:12]
    words = ['id %s' % short]
    if c.get('image'):
        words.append('image %s' % c['image'])
    if c.get('restart_policy'):
        words.append('restart policy %s' % c['restart_policy'])
    elif c.get('inspect_error'):
        words.append('not inspected: %s' % c['inspect_error'])
    what = 'container monitor (conmon) of the podman container' if c.get('part') == 'conmon' else '%s container' % c['runtime']
    return '%s %s(%s)' % (what, (c['name'] + ' ') if c.get('name') else '', ', '.join(words))


def fix(c):
    """How to stop the container through its runtime so that it stays stopped."""
    ref = c.get('name') or c.get('id')
    runtime = c.get('runtime')
    if runtime in CLIS:
        cli = CLIS[runtime]
        text = '`%s stop %s`' % (cli, ref)
        if cli == 'podman' and c.get('restart_policy') not in ('no', '', None):
            # podman 4.3's `podman update` cannot change a restart policy; a container stopped with `podman stop` is
            # not restarted by it (verified, tests/integration/test_containers.py).
            text += ' (podman does not restart a container stopped with `podman stop`; `podman rm %s` removes it)' % ref
        elif c.get('restart_policy') not in ('no', '', None) or not c.get('inspected'):
            text += ' and `%s update --restart=no %s` (or `%s rm %s`) so that its restart policy does not start it again' % (
                cli, ref, cli, ref)
        if cli == 'podman' and not c.get('inspected'):
            text += ' (run as the user that owns it if it is a rootless container)'
        return text
    return ('stop it through what runs it (`kubectl scale`/`kubectl delete` of its pod, or `crictl stop %s`): the kubelet '
            'restarts containers it manages' % ref)


# What the plan records of an adopted container (never its environment or command line: they can hold secrets).
ADOPTED_FIELDS = ('runtime', 'id', 'name', 'image', 'restart_policy')
STOP_MARGIN_S = 30


class ContainerError(Exception):
    """A runtime command failed; ``record`` says what was done before (the policy change, for example)."""

    def __init__(self, msg, record=None):
        super(ContainerError, self).__init__(msg)
        self.msg = msg
        self.record = record or {}


def matches(c, refs):
    """The entry of ``refs`` (names or ids; an id prefix of at least 12 hex digits) that names container ``c``, or None."""
    for ref in refs or ():
        ref = str(ref).strip().lstrip('/')
        if not ref:
            continue
        if ref == c.get('name') or ref == c.get('id'):
            return ref
        if len(ref) >= 12 and re.match(r'^[0-9a-f]+$', ref) and (c.get('id') or '').startswith(ref):
            return ref
    return None


def adoptable(c, port_owner=False, refs=()):
    """Why the plan adopts container ``c`` (inspected, from :func:`inspect`), or None when it stays refused.

    Adopted: a docker or podman container, inspected (its CLI answered), not podman's monitor, that serves on the
    managed port (``port_owner``) or is named in ``refs`` (``adopt_containers``)."""
    if not c or c.get('runtime') not in CLIS or c.get('part') != 'container' or not c.get('inspected'):
        return None
    named = matches(c, refs)
    if named:
        return 'named in adopt_containers (%s)' % named
    if port_owner:
        return 'serves on the managed port'
    return None


def adopted_entry(c, why, pids=()):
    """The plan's record of an adopted container: runtime, id, name, image, restart policy, why, its PIDs seen."""
    entry = dict((k, c.get(k)) for k in ADOPTED_FIELDS)
    entry.update(why=why, pids=sorted(set(int(x) for x in pids)))
    return entry


def run_cli(argv, timeout):
    """``(rc, stdout, stderr)`` of a container CLI argv (no shell), ``timeout`` s (subprocess.TimeoutExpired after); the
    whole of both streams (``<cli> logs`` writes the container's stderr to its own)."""
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,  # pylint: disable=ansible-bad-function
                          timeout=timeout, check=False)
    return proc.returncode, proc.stdout.decode('utf-8', 'replace'), proc.stderr.decode('utf-8', 'replace')


def _run(argv, timeout, run):
    # A helper with no module at hand (the replace module's teardown); argv list, a timeout, never a shell.
    proc = run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,  # pylint: disable=ansible-bad-function
               timeout=timeout, check=False)
    err = proc.stderr.decode('utf-8', 'replace') if isinstance(proc.stderr, bytes) else (proc.stderr or '')
    out = proc.stdout.decode('utf-8', 'replace') if isinstance(proc.stdout, bytes) else (proc.stdout or '')
    return proc.returncode, out, err.strip()[:300]


def _cli(c, which):
    cli = CLIS.get(c.get('runtime'))
    path = which(cli) if cli else None
    if not path:
        raise ContainerError('%s is not installed here (or not in PATH): the adopted %s cannot be stopped through its runtime'
                             % (cli or c.get('runtime'), describe(c)))
    return cli, path


def _call(path, cli, args, timeout, run, what, record):
    try:
        rc, out, err = _run([path] + list(args), timeout, run)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ContainerError('`%s %s` failed: %s' % (cli, ' '.join(args), exc), record)
    if rc != 0:
        raise ContainerError('`%s %s` exited %s: %s (%s)' % (cli, ' '.join(args), rc, err or 'no output', what), record)
    return out


def state(c, which=shutil.which, run=subprocess.run, timeout=INSPECT_TIMEOUT):
    """``(status, pid)`` of container ``c`` now, from its runtime (``(None, None)`` when it cannot be inspected)."""
    cli = CLIS.get(c.get('runtime'))
    path = which(cli) if cli else None
    if not path:
        return None, None
    try:
        rc, out, dummy = _run([path, 'container', 'inspect', c['id']], timeout, run)
    except (OSError, subprocess.SubprocessError):
        return None, None
    info = parse_inspect(out) if rc == 0 else None
    return (info['status'], info['pid']) if info else (None, None)


def stop_adopted(c, term_timeout, which=shutil.which, run=subprocess.run):
    """Stop adopted container ``c`` (from :func:`adopted_entry`) through its runtime so that it stays stopped.

    docker: ``docker update --restart=no <id>`` first when it has a restart policy (restored by :func:`start_adopted`);
    podman: its policy stays (podman 4.3 cannot change it on a container; a container stopped with ``podman stop`` is
    not restarted). Then ``<cli> stop -t <term_timeout> <id>`` (the runtime sends SIGKILL after that) and a check that
    it is no longer running. Returns the record (``restart_policy_set``: whether the policy was changed); raises
    :class:`ContainerError` with the record of what was done."""
    cli, path = _cli(c, which)
    grace = max(0, int(math.ceil(float(term_timeout))))
    record = dict((k, c.get(k)) for k in ADOPTED_FIELDS)
    record.update(restart_policy_set=False, stopped=False)
    policy = c.get('restart_policy') or 'no'
    if cli == 'docker' and policy not in ('no', ''):
        _call(path, cli, ['update', '--restart=no', c['id']], INSPECT_TIMEOUT + STOP_MARGIN_S, run,
              'its restart policy %s could not be turned off; nothing was stopped' % policy, record)
        record['restart_policy_set'] = True
    _call(path, cli, ['stop', '-t', str(grace), c['id']], grace + STOP_MARGIN_S, run,
          'it may still run', record)
    status, pid = state(c, which, run)
    if status in ('running', 'restarting', 'paused', 'stopping'):
        raise ContainerError('%s still %s (PID %s) after `%s stop`' % (describe(c), status, pid, cli), record)
    record.update(stopped=True, status=status)
    return record


def start_adopted(record, which=shutil.which, run=subprocess.run):
    """Undo :func:`stop_adopted`: restore the restart policy it turned off, then ``<cli> start <id>``. Returns the
    record with ``started`` (and ``start_error`` when it failed); never raises."""
    out = dict(record, started=False)
    try:
        cli, path = _cli(record, which)
        if record.get('restart_policy_set') and record.get('restart_policy'):
            _call(path, cli, ['update', '--restart=%s' % record['restart_policy'], record['id']],
                  INSPECT_TIMEOUT + STOP_MARGIN_S, run, 'restart policy not restored', out)
        _call(path, cli, ['start', record['id']], INSPECT_TIMEOUT + STOP_MARGIN_S, run, 'not started', out)
    except ContainerError as exc:
        out['start_error'] = exc.msg
        return out
    out['started'] = True
    return out


def stopped_line(record):
    """``stopped docker container web (id 92cd4aeb07a1, image x:1, restart policy always, turned off)``."""
    words = ['id %s' % (record.get('id') or '')[:12]]
    if record.get('image'):
        words.append('image %s' % record['image'])
    if record.get('restart_policy'):
        words.append('restart policy %s%s' % (record['restart_policy'], ', turned off' if record.get('restart_policy_set') else ''))
    return '%s container %s(%s)' % (record.get('runtime'), (record['name'] + ' ') if record.get('name') else '', ', '.join(words))


_REF = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_.-]{0,254}$')


def check_adopt_refs(refs, adopted, problem, note, label='adopt_containers'):
    """Check ``adopt_containers`` (names or ids) and return the adopted entries, sorted by id.

    An entry that is no container name or id is a ``problem`` (before anything is touched); one that names none of
    the containers holding the managed port or the target GPUs is a ``note`` (it was stopped by an earlier run, or it
    runs elsewhere): nothing of it is touched. ``label``: what the caller calls the option (option_labels)."""
    adopted = sorted(adopted, key=lambda c: c.get('id') or '')
    for ref in refs or ():
        text = str(ref)
        if not _REF.match(text.strip().lstrip('/')):
            problem('%s: %r is not a container name or id (letters, digits, '
                    '"_", "." and "-"; an id of at least 12 hex digits); fix the entry' % (label, text))
        elif not any(matches(c, [text]) for c in adopted):
            note('%s: %s names none of the containers that hold the managed port '
                 'or the target GPUs; nothing of it is touched' % (label, text))
    return adopted
