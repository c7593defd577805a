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
* :func:`inspect`: name, image and restart policy from ``<runtime> container inspect --format json <id>`` where the
  CLI is installed; never raises (without the CLI, or when it fails, the id alone names the container).
* :func:`describe` and :func:`fix`: the words the preflight uses.
"""

from __future__ import annotations

import json
import re
import shutil
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


def parse_inspect(text):
    """Name, image, image id, restart policy and status from ``docker/podman container inspect --format json``.

    Both print a JSON list with one object per container; docker's ``Name`` has a leading ``/``, podman adds
    ``ImageName``. Returns a dict (missing fields None) or None when the text is not such a list."""
    try:
        data = json.loads(text)
    except (TypeError, ValueError):
        return None
    if isinstance(data, list):
        data = data[0] if data else None
    if not isinstance(data, dict):
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
    }


def inspect(found, timeout=INSPECT_TIMEOUT, which=shutil.which, run=subprocess.run):
    """``found`` (from :func:`container_of`) with name, image, image_id, restart_policy and ``inspected`` added.

    ``<runtime> container inspect --format json <id>`` (argv list, ``timeout`` s) where the runtime's CLI is in PATH.
    A missing CLI, an error or unparsable output leaves those fields None and ``inspect_error`` says why."""
    out = dict(found, name=None, image=None, image_id=None, restart_policy=None, inspected=False, inspect_error=None)
    cli = CLIS.get(found.get('runtime'))
    path = which(cli) if cli else None
    if not path:
        out['inspect_error'] = ('%s is not installed here' % cli) if cli else 'no CLI of %s is used here' % found.get('runtime')
        return out
    try:
        # A helper with no module at hand (the preflight's census); argv list, a timeout, never a shell.
        proc = run([path, 'container', 'inspect', '--format', 'json', found['id']], stdin=subprocess.DEVNULL,  # pylint: disable=ansible-bad-function
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        out['inspect_error'] = '%s container inspect failed: %s' % (cli, exc)
        return out
    info = parse_inspect(proc.stdout.decode('utf-8', 'replace') if isinstance(proc.stdout, bytes) else proc.stdout)
    if proc.returncode != 0 or info is None:
        err = proc.stderr.decode('utf-8', 'replace') if isinstance(proc.stderr, bytes) else (proc.stderr or '')
        out['inspect_error'] = '%s container inspect exited %s: %s' % (cli, proc.returncode, err.strip()[:200] or 'no output')
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
        if c.get('restart_policy') not in ('no', '', None) or not c.get('inspected'):
            text += ' and `%s update --restart=no %s` (or `%s rm %s`) so that its restart policy does not start it again' % (
                cli, ref, cli, ref)
        if cli == 'podman' and not c.get('inspected'):
            text += ' (run as the user that owns it if it is a rootless container)'
        return text
    return ('stop it through what runs it (`kubectl scale`/`kubectl delete` of its pod, or `crictl stop %s`): the kubelet '
            'restarts containers it manages' % ref)
