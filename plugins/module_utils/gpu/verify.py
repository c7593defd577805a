# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The memory assert engine: wait until the GPUs are free (or allocated), and say why not (standard library only).

``run_assert(params, runner, check_mode=False, warn=None) -> result`` is the
whole of ``gpu_memory_assert`` without AnsibleModule (for ``sglang_replace``,
which proves the GPUs free between teardown and launch in one module run).
``params`` is the option dict with defaults applied (:func:`defaults`),
``runner`` is ``runner(argv, timeout) -> (rc, stdout, stderr)``. A failure
raises :class:`VerifyError` with the message and the result (``diagnosis``
says for each GPU why).

"Free" is judged against the GPU's own idle baseline: at most
``max_used_mib`` used (an idle H100 or H200 reads 0 to 4 MiB), and for a GPU
in MIG mode at most ``mig_max_used_mib`` (its instances keep 55-59 MiB in use
when idle, so 16 MiB could never pass); with ``require_no_processes`` also no
compute process listed. A MIG GPU is judged as one whole GPU (see
docs/reference/nvidia-smi.md, "MIG").
"""

from __future__ import annotations

import copy
import os
import time

from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import query as gpu_query
from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import target as gpu_target
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import procfs
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import secrets
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import wait

PREFIX = 'gpu_memory_assert'
DEFAULT_MIN_USED_MIB = 1024

ARGUMENT_SPEC = dict(
    gpu_target.COMMON_SPEC,
    state=dict(type='str', default='free', choices=['free', 'allocated']),
    max_used_mib=dict(type='int', default=16),
    mig_max_used_mib=dict(type='int', default=gpu_query.DEFAULT_MIG_MAX_USED_MIB),
    min_used_mib=dict(type='int'),
    require_no_processes=dict(type='bool', default=True),
    require_processes=dict(type='bool', default=False),
    timeout=dict(type='float', default=120),
    sleep=dict(type='float', default=0.5),
    delay=dict(type='float', default=0),
    msg=dict(type='str'),
)

RESET_PRECONDITIONS = ('as root, with no process using the GPU (CUDA applications, X, monitoring tools such as '
                       'another nvidia-smi, DCGM, Fabric Manager) and no compute application on any other GPU')


class VerifyError(Exception):
    """The GPUs did not reach the wanted state; ``result`` holds the readings and the diagnosis."""

    def __init__(self, msg, result):
        super(VerifyError, self).__init__(msg)
        self.msg = msg
        self.result = result


def defaults():
    """The option dict with every default applied."""
    return dict((name, copy.deepcopy(spec.get('default'))) for name, spec in ARGUMENT_SPEC.items())


# ---------------------------------------------------------------------------
# Pure judgement
# ---------------------------------------------------------------------------

def judge(gpu, params):
    """Return the list of problems of one GPU reading (empty when it meets the condition)."""
    problems = []
    if gpu.get('lost'):
        return ['lost']
    used = gpu.get('used_mib')
    procs = gpu.get('processes') or []
    if params['state'] == 'free':
        limit = gpu_query.idle_limit(gpu, params['max_used_mib'], params.get('mig_max_used_mib'))
        if used is None:
            problems.append('unknown')
        elif used > limit:
            problems.append('used')
        if params['require_no_processes'] and procs:
            problems.append('processes')
        if 'processes' in gpu.get('unknown_fields', {}):
            problems.append('unknown')
    else:
        minimum = params['min_used_mib']
        if used is None:
            problems.append('unknown')
        elif used < minimum:
            problems.append('not_allocated')
        if params['require_processes'] and not procs:
            problems.append('no_processes')
    return problems


def proc_detail(proc, proc_root=procfs.PROC_ROOT):
    pid = proc.get('pid')
    detail = {'pid': pid, 'name': proc.get('name'), 'used_mib': proc.get('used_mib'), 'visible': False,
              'cmdline': None, 'comm': None, 'state': None}
    if pid is None:
        return detail
    info = procfs.read_proc(pid, proc_root, with_cgroup=False)
    if info is None:
        return detail
    detail.update({'visible': True, 'cmdline': secrets.mask_cmdline(info.cmdline) or None,
                   'comm': info.comm, 'state': procfs.state_name(info.state), 'ppid': info.ppid,
                   'exited': info.exited, 'state_code': info.state})
    return detail


def describe_proc(detail):
    if detail['pid'] is None:
        return 'a process without PID (%s)' % (detail.get('name') or 'unknown')
    if not detail['visible']:
        return 'PID %d (%s, not visible in /proc: another PID namespace or a stale listing)' % (
            detail['pid'], detail.get('name') or '[Not Found]')
    label = detail.get('comm') or detail.get('name') or '?'
    cmd = detail.get('cmdline')
    if cmd and cmd != label:
        if len(cmd) > 80:
            cmd = cmd[:77] + '...'
        label = '%s: %s' % (label, cmd)
    extra = ''
    if detail.get('exited'):
        extra = ', exited; parent %s has not reaped it' % detail.get('ppid')
    elif detail.get('state_code') in ('D', 'T', 't', 'Z'):
        extra = ', state %s' % detail['state']
    return 'PID %d (%s%s)' % (detail['pid'], label, extra)


def fmt_seconds(value):
    if value >= 10 or float(value).is_integer():
        return '%d' % round(value)
    return '%.1f' % value


def diagnose(gpu, problems, params, waited, device_users=None):
    """Explain one failing GPU. ``device_users``: ``{pid: comm}`` with its device file open (unlisted)."""
    label = gpu_query.gpu_label(gpu)
    used = gpu.get('used_mib')
    after = 'after %s s' % fmt_seconds(waited) if waited > 0 else 'at the only check (timeout 0)'
    entry = {'gpu': gpu.get('index'), 'uuid': gpu.get('uuid'), 'bus_id': gpu.get('bus_id'), 'used_mib': used,
             'kind': None, 'summary': None, 'processes': [], 'hint': '', 'unknown_fields': dict(gpu.get('unknown_fields', {}))}
    if 'lost' in problems:
        entry['kind'] = 'lost'
        where = ' (%s)' % gpu['bus_id'] if gpu.get('bus_id') and gpu.get('index') is not None else ''
        entry['summary'] = '%s%s is lost: %s' % (label, where, gpu.get('lost_reason') or 'unknown error')
        entry['hint'] = 'the GPU fell off the bus or needs a reset; reboot the node (or reset the GPU) and check its health'
        return entry
    details = [proc_detail(p) for p in gpu.get('processes') or []]
    entry['processes'] = details
    if params['state'] == 'allocated':
        parts = []
        if 'unknown' in problems:
            entry['kind'] = 'unknown'
            parts.append('memory.used is unknown (%s)' % entry['unknown_fields'].get('memory.used', 'placeholder'))
        if 'not_allocated' in problems:
            entry['kind'] = entry['kind'] or 'not_allocated'
            parts.append('%s MiB used, expected at least %d MiB' % (used, params['min_used_mib']))
        if 'no_processes' in problems:
            entry['kind'] = entry['kind'] or 'no_processes'
            parts.append('no compute process listed')
        entry['summary'] = '%s: %s %s' % (label, ', '.join(parts), after)
        entry['hint'] = 'check the server log: it may still be loading, or it failed to start'
        return entry
    if 'unknown' in problems and used is None:
        entry['kind'] = 'unknown'
        placeholder = entry['unknown_fields'].get('memory.used', 'placeholder')
        entry['summary'] = '%s: used memory is unknown (%s) %s; it cannot be verified' % (label, placeholder, after)
        entry['hint'] = 'nvidia-smi reports no value for memory.used on this GPU (permissions or an unsupported part)'
        if details:
            entry['summary'] += '; listed: %s' % ', '.join(describe_proc(d) for d in details)
        return entry
    if details:
        entry['kind'] = 'held'
        pids = ', '.join(describe_proc(d) for d in details)
        amount = '%d MiB held' % used if used is not None else 'held'
        entry['summary'] = '%s: %s by %s %s' % (label, amount, pids, after)
        hints = []
        if any(not d['visible'] for d in details):
            hints.append('PIDs not visible in /proc belong to another PID namespace (run in the host PID namespace), '
                         'or are stale listings that only a GPU reset clears')
        if any(d.get('state_code') == 'D' for d in details):
            hints.append('a process in state D is stuck in the kernel or driver; it cannot be killed until the call '
                         'returns; otherwise reset the GPU or reboot')
        if any(d.get('exited') for d in details):
            hints.append('an exited process keeps its listing until its memory is released')
        if not hints:
            hints.append('stop these processes (gpufleet.sglang.gpu_drain) or wait longer for them to exit')
        entry['hint'] = '; '.join(hints)
        return entry
    if 'unknown' in problems:
        entry['kind'] = 'unknown'
        entry['summary'] = '%s: the process list is unknown (%s) %s' % (
            label, entry['unknown_fields'].get('processes', 'placeholder'), after)
        return entry
    if gpu_query.mig_enabled(gpu):
        entry['mig'] = True
    index = gpu.get('index')
    reset_cmd = 'nvidia-smi --gpu-reset -i %s' % (index if index is not None else gpu.get('bus_id'))
    if device_users:
        entry['kind'] = 'kept_open'
        users = ', '.join('PID %d (%s)' % (pid, name) for pid, name in sorted(device_users.items()))
        entry['summary'] = '%s: %d MiB held by no listed process %s; %s keep its device file open' % (
            label, used, after, users)
        entry['hint'] = ('unlisted processes with the device open (for example forked workers that inherited it) '
                         'keep the memory; stop them, then check again')
        entry['device_users'] = sorted(device_users)
        return entry
    entry['kind'] = 'orphaned'
    mig = ''
    if gpu_query.mig_enabled(gpu):
        limit = gpu_query.idle_limit(gpu, params['max_used_mib'], params.get('mig_max_used_mib'))
        mig = ' (MIG mode: idle up to %d MiB)' % limit
    entry['summary'] = '%s: %d MiB held by no process %s%s (orphaned context); a GPU reset is needed' % (
        label, used, after, mig)
    entry['hint'] = '%s: %s (gpufleet.sglang.gpu_drain reset_orphaned=true does this when it is safe)' % (
        RESET_PRECONDITIONS, reset_cmd)
    return entry


def device_users(index, patterns, listed):
    """``{pid: comm}`` of processes not in ``listed`` that have GPU ``index``'s device file open.

    System daemons (persistenced, DCGM, Fabric Manager, X, MPS) keep the device
    open without holding compute memory and are left out.
    """
    paths = tuple(set(os.path.join(os.path.dirname(p), 'nvidia%d' % index) for p in patterns))
    daemons = set(gpu_query.GPU_SYSTEM_DAEMONS)
    users = {}
    for pid in procfs.list_pids():
        if pid in listed or pid == os.getpid():
            continue
        if procfs.device_fds(pid, paths):
            comm = procfs.read_comm(pid) or '?'
            args = procfs.read_cmdline(pid)
            if comm in daemons or (args and os.path.basename(args[0]) in daemons):
                continue
            users[pid] = comm
    return users


# ---------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------

class _Assert(object):
    def __init__(self, params, runner, warn, which=None, nvml=None, clock=None, sleep=None, first=None):
        self.p = params
        self.first = first
        self.runner = runner
        self.warn_cb = warn
        self.which = which
        self.nvml = nvml
        self.clock = clock or time.monotonic
        self.sleep = sleep or time.sleep
        self.start = self.clock()
        self.result = {'changed': False, 'gpus': [], 'polls': 0, 'backend': None, 'driver': None}
        self.target = None

    def elapsed(self):
        return round(self.clock() - self.start, 3)

    def fail(self, msg, **extra):
        self.result.update(extra)
        self.result['elapsed'] = self.elapsed()
        raise VerifyError(self.p.get('msg') or msg, self.result)

    def setup(self):
        p = self.p
        for name in ('timeout', 'sleep', 'delay'):
            if p[name] is None or p[name] < 0:
                self.fail('%s must be >= 0, got %s' % (name, p[name]))
        if p['state'] == 'allocated' and p['min_used_mib'] is None:
            p['min_used_mib'] = DEFAULT_MIN_USED_MIB
        for name in ('min_used_mib', 'max_used_mib', 'mig_max_used_mib'):
            if p[name] is not None and p[name] < 0:
                self.fail('%s must be >= 0, got %s' % (name, p[name]))
        try:
            gpu_target.check_common(p, PREFIX)
            self.target = gpu_target.setup(p, self.runner, PREFIX, which=self.which, nvml=self.nvml)
        except gpu_target.TargetError as exc:
            extra = {}
            if exc.missing_lib:
                extra['missing_lib'] = exc.missing_lib
            if exc.driver is not None:
                extra['diagnosis'] = [{'gpu': None, 'kind': 'driver', 'summary': exc.driver['message'], 'processes': [],
                                       'hint': exc.driver['hint']}]
            self.fail(exc.msg, **extra)

    def poll(self):
        snap = self.target.snapshot()
        self.result['polls'] += 1
        self.result['backend'] = snap['backend']
        self.result['driver'] = snap['driver']
        return snap

    def given(self, snap):
        self.result['reused_snapshot'] = True
        self.result['backend'] = snap['backend']
        self.result['driver'] = snap['driver']
        return snap

    def evaluate(self, snap):
        """Returns ``(done, targets, problems)``; fails at once for errors waiting cannot fix."""
        driver = snap['driver']
        if not driver['ok']:
            if driver['fatal']:
                summary = 'nvidia-smi: %s (%s, rc %s)' % (driver['hint'] or driver['status'], driver['status'], driver['rc'])
                self.fail('%s: %s: %s' % (PREFIX, summary, driver['message']),
                          diagnosis=[{'gpu': None, 'kind': 'driver', 'summary': summary, 'processes': [],
                                      'hint': driver['hint'], 'message': driver['message']}])
            return False, None, None
        targets, errors = gpu_query.select_gpus(snap, self.p['gpus'])
        if errors:
            self.fail('%s: gpus: %s' % (PREFIX, '; '.join(errors)))
        problems = [judge(g, self.p) for g in targets]
        return not any(problems), targets, problems

    def run(self):
        self.setup()
        try:
            return self._run()
        finally:
            self.target.close()

    def _run(self):
        p = self.p
        deadline = wait.Deadline(p['timeout'], clock=self.clock, start=self.start)
        if p['delay']:
            self.sleep(deadline.clamp(p['delay']))
        seen = {'targets': None, 'problems': None}

        usable = self.first is not None and (self.first.get('driver') or {}).get('ok') and not p['delay']
        first = [self.first] if usable else []

        def check():
            # A snapshot the caller took just before (the drain's last, after its processes exited) is judged
            # first; only when it does not pass yet does the assert query the GPUs itself.
            done, targets, problems = self.evaluate(self.given(first.pop()) if first else self.poll())
            if targets is not None:
                seen['targets'], seen['problems'] = targets, problems
            return done

        res = wait.wait_for(check, deadline=deadline, interval=p['sleep'], sleep=self.sleep)
        targets, problems = seen['targets'], seen['problems']
        if targets is not None:
            self.result['gpus'] = []
            for gpu, probs in zip(targets, problems):
                reading = gpu_query.summarize(gpu)
                reading['ok'] = not probs
                self.result['gpus'].append(reading)
        if res.ok:
            self.result['elapsed'] = self.elapsed()
            return self.result
        waited = p['timeout']
        if targets is None:
            driver = self.result['driver'] or {}
            if driver.get('status') == gpu_query.STATUS_UNPARSABLE:
                summary = '%s (kept failing for %s s)' % (driver.get('message'), fmt_seconds(waited))
            else:
                summary = 'nvidia-smi kept failing for %s s: %s (rc %s) %s' % (
                    fmt_seconds(waited), driver.get('status'), driver.get('rc'), driver.get('message', ''))
            self.fail('%s: %s' % (PREFIX, summary.strip()),
                      diagnosis=[{'gpu': None, 'kind': 'error', 'summary': summary.strip(), 'processes': [],
                                  'hint': driver.get('hint', '')}])
        diagnosis = []
        for gpu, probs in zip(targets, problems):
            if not probs:
                continue
            users = None
            if p['state'] == 'free' and not gpu.get('processes') and gpu.get('index') is not None \
                    and gpu.get('used_mib') is not None and not gpu.get('lost'):
                users = device_users(gpu['index'], self.target.device_patterns, set())
            diagnosis.append(diagnose(gpu, probs, p, waited, users))
        self.fail('; '.join(d['summary'] for d in diagnosis), diagnosis=diagnosis)


def run_assert(params, runner, check_mode=False, warn=None, which=None, nvml=None, clock=None, sleep=None,
               first_snapshot=None):
    """Wait for the GPUs; returns the result or raises :class:`VerifyError` (see the module docstring).

    The assert only reads, so ``check_mode`` changes nothing. ``clock`` and
    ``sleep`` are injectable for tests (a fake clock makes the schedule exact).
    ``first_snapshot``: a snapshot from the same backend, taken just before by the caller (sglang_replace hands
    over the drain's last one), judged before the first query of its own (never with a ``delay``).
    """
    full = defaults()
    full.update(params or {})
    return _Assert(full, runner, warn, which=which, nvml=nvml, clock=clock, sleep=sleep, first=first_snapshot).run()


__all__ = ['ARGUMENT_SPEC', 'VerifyError', 'defaults', 'judge', 'diagnose', 'device_users', 'run_assert']
