# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the GPU engines share about the node they read (standard library only).

The options every GPU engine takes (``gpus``, ``device_paths``, ``backend``,
``nvidia_smi``, ``command_timeout``), their checks, and :func:`setup`, which
finds nvidia-smi and opens a backend. Nothing here reads ``GPUSIM_ROOT`` or
any other environment variable to decide where the GPUs are: the device paths
and the nvidia-smi command are options, which a simulated node's inventory
sets (``gpufleet_gpu_device_paths``, ``gpufleet_nvidia_smi``).

A *runner* is ``runner(argv, timeout) -> (rc, stdout, stderr)``: argv lists
only, never a shell; ``timeout`` in seconds (None: no limit). :func:`module_run`
builds one on ``AnsibleModule.run_command``, :func:`subprocess_run` on the
standard library (for in-process callers and tests).
"""

from __future__ import annotations

import os
import subprocess

from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import query as gpu_query
from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import backends as gpu_backends

DEFAULT_DEVICE_PATHS = ['/dev/nvidia*']

# The argument-spec entries every GPU engine has (merged into each engine's spec).
COMMON_SPEC = dict(
    gpus=dict(type='list', elements='raw', default=[]),
    device_paths=dict(type='list', elements='str', default=list(DEFAULT_DEVICE_PATHS)),
    backend=dict(type='str', default='auto', choices=['auto', 'nvidia-smi', 'nvml']),
    nvidia_smi=dict(type='path'),
    command_timeout=dict(type='float', default=60),
)

# Directories searched after PATH, as AnsibleModule.get_bin_path does.
EXTRA_BIN_DIRS = ('/sbin', '/usr/sbin', '/usr/local/sbin', '/usr/local/bin', '/usr/bin', '/bin')


class TargetError(Exception):
    """Bad options or an unusable backend: the message names the option and the fix."""

    def __init__(self, msg, driver=None, missing_lib=None):
        super(TargetError, self).__init__(msg)
        self.msg = msg
        self.driver = driver
        self.missing_lib = missing_lib


def find_executable(name, path=None):
    """``name`` on ``PATH`` (then the usual system directories), or None."""
    dirs = [d for d in (path if path is not None else os.environ.get('PATH', '')).split(os.pathsep) if d]
    for directory in dirs + [d for d in EXTRA_BIN_DIRS if d not in dirs]:
        candidate = os.path.join(directory, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def resolve_nvidia_smi(value, which=None):
    """The nvidia-smi to run for the option value, or None when none is found.

    A value with a slash is a path and must be an executable file; a bare
    name (``nvidia-smi``, as users often write it) is looked up on PATH like
    the default. Raises ValueError with a message that names the fix.
    """
    which = which or find_executable
    if not value:
        return which('nvidia-smi')
    if os.sep not in value:
        found = which(value)
        if not found:
            raise ValueError('%s was not found on PATH; give its absolute path or fix PATH' % value)
        return found
    if not (os.path.isfile(value) and os.access(value, os.X_OK)):
        raise ValueError('%s is not an executable file' % value)
    return value


def device_patterns(params):
    """The fnmatch globs of the GPU device nodes (the ``device_paths`` option, no environment)."""
    return [str(p) for p in (params.get('device_paths') or DEFAULT_DEVICE_PATHS)]


def check_common(params, prefix):
    """Raise TargetError for a bad common option (before anything is touched)."""
    timeout = params.get('command_timeout')
    if timeout is not None and timeout < 0:
        raise TargetError('%s: command_timeout must be >= 0, got %s' % (prefix, timeout))
    for pattern in params.get('device_paths') or ():
        if not str(pattern).startswith('/'):
            raise TargetError('%s: device_paths: %r is not an absolute path pattern (for example /dev/nvidia*)'
                              % (prefix, pattern))
    for sel in params.get('gpus') or ():
        try:
            gpu_query.parse_selector(sel)
        except ValueError as exc:
            raise TargetError('%s: gpus: %s' % (prefix, exc))


class Target(object):
    """The GPUs of this node as an engine reads them."""

    def __init__(self, backend, smi, nvidia_smi, patterns, note=None):
        self.backend = backend
        self.smi = smi
        self.nvidia_smi = nvidia_smi
        self.device_patterns = patterns
        self.note = note

    def snapshot(self):
        return self.backend.snapshot()

    def close(self):
        try:
            self.backend.close()
        except Exception:  # pylint: disable=broad-except  # closing NVML must never hide the result
            pass


def bind(runner, timeout):
    """A gpu_query runner (``argv -> (rc, out, err)``) from an engine runner."""
    return lambda argv: runner(list(argv), timeout or None)


def setup(params, runner, prefix, which=None, nvml=None):
    """Find nvidia-smi and open the backend; returns a :class:`Target`.

    Raises TargetError naming the option and the fix: nvidia-smi not found or
    not executable, ``backend=nvml`` without pynvml, an unusable NVML.
    """
    backend_kind = params.get('backend') or 'auto'
    has_nvml = gpu_backends.HAS_PYNVML if nvml is None else True
    if backend_kind == gpu_query.BACKEND_NVML and not has_nvml:
        raise TargetError('%s: backend=nvml needs the nvidia-ml-py (pynvml) Python library on the target'
                          % prefix, missing_lib='nvidia-ml-py (pynvml)')
    try:
        nvidia_smi = resolve_nvidia_smi(params.get('nvidia_smi'), which)
    except ValueError as exc:
        raise TargetError('%s: nvidia_smi: %s' % (prefix, exc))
    if not nvidia_smi and (backend_kind == gpu_query.BACKEND_NVIDIA_SMI or not has_nvml):
        raise TargetError('%s: nvidia-smi was not found on PATH; install the NVIDIA driver utilities or set nvidia_smi'
                          % prefix, driver=gpu_query.driver_status(gpu_query.STATUS_NOT_FOUND, 127, 'nvidia-smi not found'))
    nvidia_smi = nvidia_smi or 'nvidia-smi'
    query_runner = bind(runner, params.get('command_timeout'))
    try:
        backend, note = gpu_backends.open_backend(backend_kind, query_runner, nvidia_smi, nvml=nvml)
    except gpu_query.BackendUnavailable as exc:
        raise TargetError('%s: backend %s unavailable: %s' % (prefix, backend_kind, exc))
    smi = gpu_backends.NvidiaSmiBackend(query_runner, nvidia_smi)
    return Target(backend, smi, nvidia_smi, device_patterns(params), note)


def module_run(module):
    """An engine runner on ``module.run_command``: C locale, coreutils ``timeout`` when installed.

    A command that runs past its timeout shows as rc 124.
    """
    timeout_bin = module.get_bin_path('timeout')

    def run(argv, timeout=None):
        prefix = [timeout_bin, '-k', '5', '%g' % float(timeout)] if timeout and timeout_bin else []
        rc, out, err = module.run_command(prefix + list(argv), check_rc=False, environ_update=dict(gpu_query.C_LOCALE))
        return rc, out, err
    return run


def subprocess_run(env=None):
    """An engine runner on :mod:`subprocess` (in-process callers, tests): C locale, rc 124 on timeout."""
    def run(argv, timeout=None):
        full_env = dict(os.environ if env is None else env)
        full_env.update(gpu_query.C_LOCALE)
        try:
            # Not AnsibleModule.run_command: it has no timeout (and in-process callers have no module).
            proc = subprocess.run(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=full_env,  # pylint: disable=ansible-bad-function
                                  timeout=timeout or None, check=False)
        except subprocess.TimeoutExpired as exc:
            return 124, (exc.stdout or b'').decode('utf-8', 'replace'), 'timed out after %s s' % timeout
        except OSError as exc:
            return 127, '', str(exc)
        return proc.returncode, proc.stdout.decode('utf-8', 'replace'), proc.stderr.decode('utf-8', 'replace')
    return run


def driver_failure_text(driver, prefix):
    """The failure message for a snapshot whose driver status is not ok."""
    if driver.get('status') == gpu_query.STATUS_UNPARSABLE:
        return '%s: %s' % (prefix, driver.get('message'))
    return ('%s: cannot read the GPUs: %s (%s): %s' % (
        prefix, driver.get('hint') or driver.get('status'), driver.get('status'), driver.get('message') or '')).strip()
