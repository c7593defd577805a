# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The server's container image on the node: find it, pull it, check it, and name exactly that image (issue 24).

A pull of a 30 GB SGLang image takes minutes, so the preflight does it (or finds the image) before anything is
touched, and refuses an image that is missing or built for another architecture.

* :func:`inspect` ``(run, cli, ref)``: None when the image is absent, else ``{"ref", "id" ("sha256:<64 hex>", the
  image ID: the digest of its config, the same in docker and podman), "repo_digests", "digest" (the repo digest
  ``repo@sha256:...`` of ``ref``'s repository, or None), "architecture", "os", "variant", "tags", "size"}``. Raises
  :class:`ImageError` when the runtime fails otherwise. ``run(argv)`` returns ``(rc, stdout, stderr)`` like
  ``AnsibleModule.run_command``. Plain ``image inspect`` (a JSON list) is parsed: docker 20.10's client prints the
  word ``json`` for ``--format json``. Podman prints the ``Id`` without ``sha256:`` and docker with it; both are
  normalised to ``sha256:<hex>``.
* :func:`pull` ``(cli, ref, timeout, on_line=None, env=None)``: ``(ok, error_text)``. The runtime's pull output (podman
  writes it on stderr, docker on stdout; both are read, merged) goes to ``on_line`` line by line; past ``timeout`` s
  the pull is killed by its PID (its own process group). Registry credentials come from the runtime's own auth file
  (``REGISTRY_AUTH_FILE`` / ``DOCKER_CONFIG`` through ``env``), never from argv.
* :func:`node_architecture`: this node's architecture in OCI words (``x86_64`` -> ``amd64``, ``aarch64`` -> ``arm64``).
* :func:`check` ``(run, cli, ref, pull_policy, timeout, on_line=None, names=PLAIN, pull=pull, arch=None, env=None)``:
  ``{"ok", "image", "pulled", "error"}``; ``pull_policy`` ``missing`` (pull when absent), ``always`` (pull first; a
  failed pull refuses even when an older copy is on the node) or ``never``. Refuses a missing image and one for
  another architecture, naming the variables (``names.of("image")``, ``names.of("pull_policy")``) and the fix. ``arch``: the node's (default
  :func:`node_architecture`); ``env``: the pull's environment. Never raises.
* :func:`run_ref` ``(info)``: what to give ``<cli> run`` to start exactly this image: its 64-hex image ID (both
  runtimes take it as an ID; a tag that moves after the check does not change what runs).
* :func:`describe` ``(info)``: ``repo@sha256:...`` (the repo digest) when there is one, else ``ref (image sha256:...)``
  for the plan text.

Digests: ``RepoDigests`` are manifest digests, one per repository the image came from. Docker records one only for
an image pulled from (or pushed to) a registry: a ``docker load`` or ``docker import`` has none, so ``digest`` is None
and the image ID names it. Podman records the digest of the manifest it stored for every image, local builds and
imports included (``localhost/x@sha256:...``); a pull of an image it already holds under another name adds the
name to that image, and ``RepoDigests`` becomes every name with every manifest digest the image was stored with:
in the one case recorded (podman 4.3.1) the registry's digest came first, while the ``Digest`` field kept the
earlier local one, which the registry does not have, so ``Digest`` is not used. Standard library only, Python 3.9+, argv lists, no shell.
"""

from __future__ import annotations

import os
import platform
import re
import select
import signal
import subprocess
import time

from ansible_collections.gpufleet.sglang.plugins.module_utils.common.names import PLAIN
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import containers

POLICIES = ('missing', 'always', 'never')
INSPECT_TIMEOUT = 30
_HEX = re.compile(r'^(?:sha256:)?([0-9a-f]{64})$')
# What the runtimes print for an image they do not have (podman 4.3.1: rc 125, "image not known";
# docker 20.10: rc 1, "No such image"; both print "[]" on stdout).
_ABSENT = re.compile(r'image not known|no such image|no such object', re.I)
# platform.machine() (uname -m) -> the OCI/GOARCH name images carry in their config.
ARCHES = {
    'x86_64': 'amd64', 'amd64': 'amd64', 'i386': '386', 'i686': '386',
    'aarch64': 'arm64', 'arm64': 'arm64', 'armv7l': 'arm', 'armv6l': 'arm',
    'ppc64le': 'ppc64le', 's390x': 's390x', 'riscv64': 'riscv64', 'mips64': 'mips64le',
}


class ImageError(Exception):
    """The runtime could not say whether it has the image (not: the image is absent)."""


def node_architecture(machine=None):
    """The OCI architecture of this node (``platform.machine()`` mapped; an unknown name is returned lower-cased)."""
    name = (machine if machine is not None else platform.machine()) or ''
    return ARCHES.get(name.lower(), name.lower())


def runtime_of(cli):
    """``docker`` or ``podman`` from the CLI's path or name (``/usr/bin/podman`` -> ``podman``)."""
    base = os.path.basename(str(cli))
    return 'podman' if 'podman' in base else 'docker'


def split_ref(ref):
    """``(repository, tag, digest)`` of an image reference; the repository fully qualified the way docker reads a
    short name (``lmsysorg/sglang`` -> ``docker.io/lmsysorg/sglang``, ``ubuntu`` -> ``docker.io/library/ubuntu``)."""
    ref = str(ref or '').strip()
    digest = None
    if '@' in ref:
        ref, digest = ref.split('@', 1)
    tag = None
    last = ref.rsplit('/', 1)[-1]
    if ':' in last:
        ref, tag = ref.rsplit(':', 1)
    return qualify(ref), tag, digest


def qualify(repo):
    """A repository name with its registry: ``docker.io`` (and ``library/``) for a docker short name."""
    parts = repo.split('/')
    if len(parts) > 1 and ('.' in parts[0] or ':' in parts[0] or parts[0] == 'localhost'):
        return repo
    if len(parts) == 1:
        return 'docker.io/library/' + repo
    return 'docker.io/' + repo


def _path_of(repo):
    """The repository without its registry (``docker.io/library/x`` -> ``x``; ``localhost/a/b`` -> ``a/b``)."""
    parts = qualify(repo).split('/')[1:]
    if parts[:1] == ['library'] and len(parts) == 2:
        parts = parts[1:]
    return '/'.join(parts)


def _explicit_registry(ref):
    first = str(ref).split('@', 1)[0].split('/')
    return len(first) > 1 and ('.' in first[0] or ':' in first[0] or first[0] == 'localhost')


def _pick_digest(ref, repo_digests):
    """The repo digest of ``ref``'s repository among ``repo_digests``: the one ``ref`` names, else the first (the
    order the runtime lists them in; see the module docstring), or None."""
    repo, dummy, want = split_ref(ref)
    same = [d for d in repo_digests if '@' in d and split_ref(d)[0] == repo]
    if not same and not _explicit_registry(ref):
        # A short name that the runtime resolved elsewhere (podman: localhost/, a search registry).
        same = [d for d in repo_digests if '@' in d and _path_of(split_ref(d)[0]) == _path_of(repo)]
    for d in same:
        if want and d.endswith('@' + want):
            return d
    return same[0] if same else None


def parse_inspect(ref, text):
    """The image dict of :func:`inspect` from plain ``image inspect`` output (podman 4.3 or docker 20.10), else None."""
    data = containers.first_object(text)
    if data is None or not isinstance(data.get('Id'), str):
        return None
    match = _HEX.match(data['Id'].strip())
    if not match:
        return None
    repo_digests = [str(d) for d in (data.get('RepoDigests') or [])]
    return {
        'ref': str(ref),
        'id': 'sha256:' + match.group(1),
        'repo_digests': repo_digests,
        'digest': _pick_digest(ref, repo_digests),
        'architecture': data.get('Architecture') or None,
        'os': data.get('Os') or None,
        'variant': data.get('Variant') or None,
        'tags': [str(t) for t in (data.get('RepoTags') or [])],
        'size': data.get('Size'),
    }


def inspect(run, cli, ref):
    """The image ``ref`` as ``cli`` has it (see the module docstring), or None when it is absent."""
    rc, out, err = run([str(cli), 'image', 'inspect', str(ref)])
    if rc != 0:
        if _ABSENT.search(err or '') or _ABSENT.search(out or ''):
            return None
        raise ImageError('%s image inspect %s exited %s: %s' % (runtime_of(cli), ref, rc, _last_error(err or out)))
    info = parse_inspect(ref, out)
    if info is None:
        raise ImageError('%s image inspect %s printed no image: %r' % (runtime_of(cli), ref, (out or '')[:200]))
    return info


def _last_error(text):
    """The line of a runtime's output that says what failed (the last ``Error`` line, else the last line)."""
    lines = [line.strip() for line in (text or '').splitlines() if line.strip()]
    errors = [line for line in lines if 'error' in line.lower()]
    return (errors or lines or ['no output'])[-1][:500]


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        try:
            proc.kill()
        except OSError:
            pass
    try:
        proc.wait(timeout=10)
    except (subprocess.TimeoutExpired, OSError):
        pass


def _lines(buf, on_line, keep):
    """Split complete lines (``\\n`` or ``\\r``) off ``buf``; report them; keep the last ones for the error."""
    parts = re.split(r'\r\n|\r|\n', buf)
    for line in parts[:-1]:
        line = line.rstrip()
        if not line:
            continue
        keep.append(line)
        del keep[:-40]
        if on_line is not None:
            # A progress display that fails never fails the pull.
            try:
                on_line(line)
            except Exception:  # pylint: disable=broad-except
                pass
    return parts[-1]


def pull(cli, ref, timeout, on_line=None, env=None):
    """``<cli> pull <ref>`` with its output streamed to ``on_line``; ``(ok, error_text)``; killed by PID at ``timeout``."""
    argv = [str(cli), 'pull', str(ref)]
    try:
        # Not run_command: the output is streamed while it runs, and the pull is killed as a group at the deadline.
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,  # pylint: disable=ansible-bad-function
                                stderr=subprocess.STDOUT, env=env, start_new_session=True, close_fds=True)
    except OSError as exc:
        return False, '%s pull %s could not start: %s' % (runtime_of(cli), ref, exc)
    deadline = time.monotonic() + float(timeout)
    buf, keep, fd = '', [], proc.stdout.fileno()
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                _kill_group(proc)
                return False, ('%s pull %s did not finish within %.0f s (the pull, PID %d, was killed); last output: %s'
                               % (runtime_of(cli), ref, float(timeout), proc.pid, keep[-1] if keep else 'none'))
            ready, dummy, dummy2 = select.select([fd], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            buf = _lines(buf + chunk.decode('utf-8', 'replace'), on_line, keep)
        _lines(buf + '\n', on_line, keep)
        try:
            rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return False, '%s pull %s did not exit after its output ended (killed)' % (runtime_of(cli), ref)
    finally:
        proc.stdout.close()
    if rc != 0:
        return False, '%s pull %s exited %s: %s' % (runtime_of(cli), ref, rc, _last_error('\n'.join(keep)))
    return True, None


def _refusal(names, ref, why, fix):
    return '%s %s: %s; %s' % (names.of('image'), ref, why, fix)


def check(run, cli, ref, pull_policy, timeout, on_line=None, names=PLAIN, pull=pull, arch=None, env=None):
    """Find or pull ``ref`` as ``pull_policy`` says and check its architecture; never raises (see the docstring)."""
    out = {'ok': False, 'image': None, 'pulled': False, 'error': None}
    var = names.of('image')
    try:
        if not ref or not isinstance(ref, str) or any(c.isspace() for c in ref):
            out['error'] = '%s must be an image reference (a tag such as lmsysorg/sglang:v0.5.4 or repo@sha256:...), ' \
                           'not %r' % (var, ref)
            return out
        if pull_policy not in POLICIES:
            out['error'] = '%s must be one of %s, not %r' % (names.of('pull_policy'), ', '.join(POLICIES), pull_policy)
            return out
        info = None if pull_policy == 'always' else inspect(run, cli, ref)
        if info is None and pull_policy == 'never':
            out['error'] = _refusal(names, ref, 'the image is not on the node and %s is never' % names.of('pull_policy'),
                                    'pull it there first (%s pull %s), or set %s to missing'
                                    % (runtime_of(cli), ref, names.of('pull_policy')))
            return out
        if info is None:
            ok, why = pull(cli, ref, timeout, on_line=on_line, env=env)
            if not ok:
                what = '%s is always and the pull failed' % names.of('pull_policy') if pull_policy == 'always' else \
                    'the image is not on the node and the pull failed'
                out['error'] = _refusal(names, ref, '%s (%s)' % (what, why),
                                        'check the name and tag, the registry and its credentials on the node, or '
                                        'load the image there (%s load)' % runtime_of(cli))
                return out
            out['pulled'] = True
            info = inspect(run, cli, ref)
            if info is None:
                out['error'] = _refusal(names, ref, 'the pull said it succeeded but the image is not there',
                                        'pull it by hand and look at the output')
                return out
        out['image'] = info
        node = arch or node_architecture()
        if info.get('architecture') and info['architecture'] != node:
            out['error'] = _refusal(names, ref, 'the image is built for %s/%s but this node is %s' % (
                info.get('os') or '?', info['architecture'], node),
                'use a tag or digest of the image for %s (a multi-arch tag pulled on this node gets it)' % node)
            return out
        out['ok'] = True
    except Exception as exc:  # pylint: disable=broad-except
        # The preflight reports, never crashes.
        out['error'] = '%s %s could not be checked: %s' % (var, ref, exc)
    return out


def run_ref(info):
    """The 64-hex image ID of ``info``: ``<cli> run`` starts exactly that image whatever its tag says by then."""
    match = _HEX.match(str((info or {}).get('id') or ''))
    if not match:
        raise ValueError('no image ID in %r' % (info,))
    return match.group(1)


def describe(info):
    """``repo@sha256:...`` when the image has a repo digest, else ``<ref> (image sha256:...)``."""
    if info.get('digest'):
        return info['digest']
    return '%s (image %s)' % (info.get('ref'), info.get('id'))
