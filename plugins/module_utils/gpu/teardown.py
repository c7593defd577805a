# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The teardown engine: stop what holds the target GPUs, and only that (standard library only).

``run_drain(params, runner, check_mode=False, warn=None) -> result`` is the
whole of ``gpu_drain`` without AnsibleModule, so that a module that must not
return to the controller between teardown and launch (``sglang_replace``)
runs it in-process. ``params`` is the module's option dict with defaults
applied (:func:`defaults`); ``runner`` is ``runner(argv, timeout) -> (rc,
stdout, stderr)`` (``gpu_target.module_run`` / ``subprocess_run``). A failure
raises :class:`DrainError` with the message and the partial result.

Steps: read the GPUs (one snapshot), plan over one process-table snapshot
(``drain_plan``), refuse unexpected holders when told to (``expected_pids``,
``on_unexpected``), stop through the one stop engine (``stop``), read the
GPUs again, and reset GPUs left with orphaned memory when asked.
"""

from __future__ import annotations

import copy
import os
import pwd
import time

from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import teardown_plan
from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import query as gpu_query
from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import smi_csv
from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import target as gpu_target
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import procfs
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import secrets
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import sockets
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import stop
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import systemd
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import wait

PREFIX = 'gpu_drain'
SIGNALS = ['SIGTERM', 'SIGINT', 'SIGQUIT', 'SIGHUP', 'SIGUSR1', 'SIGUSR2', 'SIGKILL']

ARGUMENT_SPEC = dict(
    gpu_target.COMMON_SPEC,
    match=dict(type='list', elements='str', default=[]),
    pids=dict(type='list', elements='int', default=[]),
    expected_pids=dict(type='list', elements='int', default=[]),
    on_unexpected=dict(type='str', default='signal', choices=['fail', 'signal']),
    exclude=dict(type='list', elements='str', default=list(teardown_plan.DEFAULT_EXCLUDE)),
    term_timeout=dict(type='float', default=stop.DEFAULT_TERM_TIMEOUT),
    kill_timeout=dict(type='float', default=15),
    signal=dict(type='str', default='SIGTERM', choices=SIGNALS),
    reset_orphaned=dict(type='bool', default=False),
    max_used_mib=dict(type='int', default=16),
    mig_max_used_mib=dict(type='int', default=gpu_query.DEFAULT_MIG_MAX_USED_MIB),
    release_timeout=dict(type='float', default=30),
)

STATE_HINTS = {
    'D': 'uninterruptible sleep inside the kernel or driver: it dies when the call returns; '
         'otherwise only a GPU reset or a reboot frees it',
    'T': 'stopped: it exits as soon as it is continued (SIGCONT)',
    't': 'stopped by a tracer: detach the debugger',
    'Z': 'zombie leader whose other threads still run',
}

ROOT_GRACE_S = 1.0
POLL_S = 0.02
SYSTEMCTL_TIMEOUT_S = 10


class DrainError(Exception):
    """The drain failed; ``result`` is what it did (and reports) up to there."""

    def __init__(self, msg, result):
        super(DrainError, self).__init__(msg)
        self.msg = msg
        self.result = result


def defaults():
    """The option dict with every default applied (copy it, then set what you need)."""
    return dict((name, copy.deepcopy(spec.get('default'))) for name, spec in ARGUMENT_SPEC.items())


def _gpu_list(gpus):
    return ','.join(str(g) for g in gpus)


def holder_lines(holder_list):
    """The diff text of a holder list (one line per PID, sorted)."""
    lines = []
    for h in holder_list:
        used = '?' if h.get('used_mib') is None else '%d MiB' % h['used_mib']
        lines.append('PID %s %s on GPU %s: %s' % (h.get('pid'), h.get('name') or '?', _gpu_list(h.get('gpus', [])), used))
    return '\n'.join(sorted(lines)) + ('\n' if lines else '')


def _holder_list(by_pid):
    """``{pid: holder}`` -> list ordered by PID (unknown PID last), without internal keys."""
    out = []
    for pid in sorted(by_pid, key=lambda p: (p is None, p or 0)):
        entry = dict(by_pid[pid])
        entry.pop('unknown', None)
        out.append(entry)
    return out


def _user(uid):
    if uid is None:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


class _Drain(object):
    """One run of the drain."""

    def __init__(self, params, runner, check_mode, warn, which=None, nvml=None):
        self.p = params
        self.runner = runner
        self.check_mode = check_mode
        self.warn_cb = warn
        self.which = which
        self.nvml = nvml
        self.clock = time.monotonic
        self.start = self.clock()
        self.result = {'changed': False, 'signalled': [], 'not_signalled': [], 'survivors': [], 'holders': [],
                       'remaining': [], 'gpus': [], 'backend': None, 'unexpected': []}
        self.warnings = []
        self.target = None

    # -- helpers ----------------------------------------------------------
    def elapsed(self):
        return round(self.clock() - self.start, 3)

    def warn(self, text):
        if self.warn_cb is not None:
            self.warn_cb(text)
        else:
            self.warnings.append(text)

    def fail(self, msg, **extra):
        self.result.update(extra)
        self.result['elapsed'] = self.elapsed()
        if self.warnings:
            self.result['warnings'] = list(self.warnings)
        raise DrainError(msg, self.result)

    def snapshot(self):
        snap = self.target.snapshot()
        self.result['backend'] = snap['backend']
        self.last_snapshot = snap
        return snap

    # -- setup ------------------------------------------------------------
    def setup(self):
        p = self.p
        for name in ('term_timeout', 'kill_timeout', 'release_timeout'):
            if p[name] is not None and p[name] < 0:
                self.fail('%s must be >= 0, got %s' % (name, p[name]))
        for name in ('max_used_mib', 'mig_max_used_mib'):
            if p[name] is not None and p[name] < 0:
                self.fail('%s must be >= 0, got %s' % (name, p[name]))
        if p['on_unexpected'] not in ('fail', 'signal'):
            self.fail('on_unexpected must be fail or signal, got %r' % (p['on_unexpected'],))
        try:
            gpu_target.check_common(p, PREFIX)
            self.exclude_res = teardown_plan.compile_patterns(p['exclude'], 'exclude')
            self.match_res = teardown_plan.compile_patterns(p['match'], 'match')
            self.signal = procfs.parse_signal(p['signal'])
            self.target = gpu_target.setup(p, self.runner, PREFIX, which=self.which, nvml=self.nvml)
        except gpu_target.TargetError as exc:
            extra = {'missing_lib': exc.missing_lib} if exc.missing_lib else {}
            self.fail(exc.msg, **extra)
        except ValueError as exc:
            self.fail(str(exc))
        if self.target.note and p['backend'] != 'auto':
            self.warn(self.target.note)

    def unit_info(self, table, pids):
        """``({unit: MainPID}, {unit: ControlGroup})`` of the system services the PIDs run in."""
        units = set()
        for pid in pids:
            info = table.get(pid)
            if info is not None and info.unit and info.unit.endswith('.service') and info.unit_manager == 'system':
                units.add(info.unit)
        mains, cgroups = {}, {}
        if not units or not systemd.running():
            return mains, cgroups
        systemctl = (self.which or gpu_target.find_executable)('systemctl')
        if not systemctl:
            return mains, cgroups

        def run(argv):
            return self.runner(argv, SYSTEMCTL_TIMEOUT_S)

        for unit in sorted(units):
            try:
                props = systemd.show(run, systemctl, unit, properties=('MainPID', 'ControlGroup'))
            except systemd.SystemdError as exc:
                self.warn('%s: %s' % (unit, exc))
                continue
            main = systemd.main_pid(props)
            if main:
                mains[unit] = main
            if props.get('ControlGroup'):
                cgroups[unit] = props['ControlGroup']
        return mains, cgroups

    def describe(self, pid, entry, info):
        return {
            'pid': pid,
            'ppid': info.ppid if info else None,
            'name': info.comm if info else None,
            'user': _user(info.uid) if info else None,
            'cmdline': secrets.mask_cmdline(info.cmdline) if info else None,
            'role': entry['role'],
            'root': entry['root'],
            'how': entry.get('how'),
            'gpus': entry['gpus'],
            'used_mib': entry['used_mib'],
            'signals': [],
            'seconds_to_exit': None,
            'first_signal': None,
        }

    # -- main flow ---------------------------------------------------------
    def run(self):
        self.setup()
        try:
            return self._run()
        finally:
            self.target.close()

    def _run(self):
        p = self.p
        snap = self.snapshot()
        if not snap['driver']['ok']:
            self.fail(gpu_target.driver_failure_text(snap['driver'], PREFIX), driver=snap['driver'])
        targets, errors = gpu_query.select_gpus(snap, p['gpus'])
        if errors:
            self.fail('%s: gpus: %s' % (PREFIX, '; '.join(errors)))
        for gpu in targets:
            if gpu.get('lost'):
                self.warn('%s is lost (%s): its processes cannot be listed'
                          % (gpu_query.gpu_label(gpu), gpu.get('lost_reason')))
        target_holders = gpu_query.holders(targets)
        target_pids = set(target_holders)
        all_holders = gpu_query.holders(snap['gpus'])
        other = dict((pid, h['gpus']) for pid, h in all_holders.items() if pid is not None and pid not in target_pids)
        self.result['holders'] = _holder_list(target_holders)

        table = procfs.process_table()
        mains, cgroups = self.unit_info(table, list(target_pids) + list(p['pids']))
        patterns = self.target.device_patterns
        ctx = teardown_plan.PlanContext(
            self_chain=procfs.self_and_ancestors(), exclude_res=self.exclude_res, match_res=self.match_res,
            unit_main_pids=mains, unit_cgroups=cgroups, other_gpu_holders=other,
            device_fds=lambda pid: procfs.device_fds(pid, patterns))
        plan = teardown_plan.plan_drain(table, target_holders, ctx, explicit_pids=p['pids'])
        self.result['not_signalled'] = plan['skipped']
        order = self.ordered_targets(plan)
        reports = dict((pid, self.describe(pid, plan['targets'][pid], table.get(pid))) for pid in order)
        self.result['signalled'] = [reports[pid] for pid in order]
        for entry in plan['skipped']:
            if entry.get('gpus'):
                self.warn('PID %s on GPU %s not signalled: %s' % (entry['pid'], _gpu_list(entry['gpus']), entry['reason']))
        self.check_unexpected(plan, table, reports)

        if self.check_mode:
            first = procfs.signal_name(self.signal)
            for pid in order:
                if plan['targets'][pid].get('first'):
                    reports[pid]['signals'] = [first]
            self.result['changed'] = bool(plan['roots'])
            self.result['remaining'] = [h for h in self.result['holders'] if h['pid'] not in plan['targets']]
            self.result['gpus'] = [gpu_query.summarize(g) for g in targets]
            if p['reset_orphaned']:
                self.result['reset'] = self.plan_resets(snap, targets, signalled_gpus=set(), check_only=True,
                                                        planned_pids=plan['targets'])
                if any(r['result'] == 'would reset' for r in self.result['reset']):
                    self.result['changed'] = True
            return self.finish()

        survivors = self.terminate(plan, order, table, reports, ctx)
        self.result['changed'] = any(r['signals'] for r in reports.values())
        after = self.snapshot()
        after_targets = []
        if after['driver']['ok']:
            after_targets, dummy = gpu_query.select_gpus(after, p['gpus'])
            self.result['remaining'] = _holder_list(gpu_query.holders(after_targets))
            self.result['gpus'] = [gpu_query.summarize(g) for g in after_targets]
        if survivors:
            self.report_survivors(survivors, reports)
        if p['reset_orphaned'] and after['driver']['ok']:
            signalled_gpus = set()
            for r in reports.values():
                signalled_gpus.update(r['gpus'])
            self.result['reset'] = self.plan_resets(after, after_targets, signalled_gpus, check_only=False)
        elif p['reset_orphaned']:
            self.result['reset'] = []
        return self.finish()

    def ordered_targets(self, plan):
        order = list(plan['roots'])
        rest = [pid for pid in plan['targets'] if pid not in order]
        members = sorted(pid for pid in rest if plan['targets'][pid]['role'] == 'member')
        descendants = sorted(pid for pid in rest if plan['targets'][pid]['role'] == 'descendant')
        holders = sorted(pid for pid in rest if plan['targets'][pid]['role'] not in ('descendant', 'member'))
        return order + members + descendants + holders

    def check_unexpected(self, plan, table, reports):
        """With ``expected_pids``: name every holder outside them; fail before any signal when told to."""
        p = self.p
        pids = teardown_plan.unexpected(plan, table, p['expected_pids'])
        if not pids:
            return
        entries = []
        for pid in pids:
            report = reports[pid]
            # The ports its server listens on: the holder's, its root's and its fellow members' (the API port is
            # usually the root's or the tokenizer's, not the scheduler's that holds the memory).
            server = [t for t, e in plan['targets'].items() if e['root'] == report['root']] + [pid]
            ports = sorted(set(port for member in server for port in sockets.listening_ports(member)))
            entries.append({'pid': pid, 'user': report['user'], 'name': report['name'], 'cmdline': report['cmdline'],
                            'gpus': report['gpus'], 'root': report['root'], 'ports': ports})
        self.result['unexpected'] = entries
        text = '; '.join('PID %d (user %s, GPU %s%s): %s' % (
            e['pid'], e['user'] or '?', _gpu_list(e['gpus']),
            ', listening on %s' % ','.join(str(x) for x in e['ports']) if e['ports'] else '', e['cmdline'] or e['name'])
            for e in entries)
        if p['on_unexpected'] == 'fail':
            self.fail('%s: %d GPU holder(s) outside expected_pids %s; nothing was signalled: %s. Stop them yourself, '
                      'add them to expected_pids, or set on_unexpected=signal' % (
                          PREFIX, len(entries), sorted(p['expected_pids']), text))
        self.warn('holders outside expected_pids are signalled (on_unexpected=signal): %s' % text)

    def terminate(self, plan, order, table, reports, ctx):
        """The first signal to roots and members, then SIGKILL for what is left (stop.py); returns survivors."""
        p = self.p
        if not plan['roots']:
            return []
        targets = []
        for pid in order:
            info = table.get(pid)
            if info is None:
                reports[pid]['seconds_to_exit'] = 0.0
                continue
            targets.append(stop.Target(pid, info.starttime, reports[pid]['name'], first=plan['targets'][pid].get('first')))

        def before_kill(live_firsts):
            # Children spawned after the plan, still attached to a live root.
            fresh = procfs.process_table(with_cgroup=False)
            kids = procfs.children_map(fresh)
            extra = []
            for root in plan['roots']:
                if root not in live_firsts:
                    continue
                members, dummy = teardown_plan.tree_members(fresh, root, ctx, kids)
                for member in members:
                    if member in reports or member not in fresh:
                        continue
                    entry = {'pid': member, 'role': 'descendant', 'root': root, 'how': None, 'gpus': [],
                             'used_mib': None}
                    reports[member] = self.describe(member, entry, fresh[member])
                    self.result['signalled'].append(reports[member])
                    extra.append(stop.Target(member, fresh[member].starttime, fresh[member].comm))
            return extra

        res = stop.stop(targets, first_signal=self.signal, term_timeout=p['term_timeout'], kill_timeout=p['kill_timeout'],
                        grace=ROOT_GRACE_S, interval=POLL_S, before_kill=before_kill, warn=self.warn)
        stop.close_all(res)
        for report in res['reports']:
            target = reports[report['pid']]
            target['signals'] = list(report['signals'])
            target['seconds_to_exit'] = report['seconds_to_exit']
            target['first_signal'] = report['first_signal']
            if report['state']:
                target['state'] = report['state']
        return res['survivors']

    def report_survivors(self, survivors, reports):
        out = []
        parts = []
        for pid in survivors:
            stat = procfs.read_stat(pid)
            state = stat['state'] if stat else None
            report = reports[pid]
            entry = {'pid': pid, 'name': report['name'], 'state': procfs.state_name(state), 'gpus': report['gpus'],
                     'signals': report['signals'], 'hint': STATE_HINTS.get(state, '')}
            out.append(entry)
            text = 'PID %d (%s, state %s' % (pid, report['name'], procfs.state_name(state))
            if report['gpus']:
                text += ', GPUs %s' % _gpu_list(report['gpus'])
            text += ')'
            parts.append(text)
        self.result['survivors'] = out
        hints = sorted(set(e['hint'] for e in out if e['hint']))
        msg = '%s: %d process(es) still running %.1f s after SIGKILL: %s' % (
            PREFIX, len(out), self.p['kill_timeout'], '; '.join(parts))
        if hints:
            msg += '. ' + '; '.join(hints)
        self.fail(msg)

    # -- GPU reset ---------------------------------------------------------
    def device_users(self, index):
        """PIDs with the device file of GPU ``index`` open (under any device pattern directory)."""
        paths = set()
        for pattern in self.target.device_patterns:
            paths.add(os.path.join(os.path.dirname(pattern), 'nvidia%d' % index))
        return [pid for pid in procfs.list_pids() if procfs.device_fds(pid, tuple(paths))]

    def plan_resets(self, snap, targets, signalled_gpus, check_only, planned_pids=()):
        """Find orphaned memory on the target GPUs and reset each one where the preconditions hold.

        Before judging, waits up to ``release_timeout`` for the GPUs whose
        processes were just stopped to release their memory. In check mode,
        ``planned_pids`` (the processes the drain would stop) do not count as
        blockers. A GPU in MIG mode is idle up to ``mig_max_used_mib``.
        """
        p = self.p

        def limit(gpu):
            return gpu_query.idle_limit(gpu, p['max_used_mib'], p['mig_max_used_mib'])

        def orphaned(gpu):
            return (not gpu.get('lost') and not gpu.get('processes') and gpu.get('used_mib') is not None
                    and gpu['used_mib'] > limit(gpu))

        def settled(gpus):
            return not [g for g in gpus if g.get('index') in signalled_gpus and not g.get('lost')
                        and (g.get('processes') or g.get('used_mib') is None or g['used_mib'] > limit(g))]

        if not check_only and signalled_gpus and not settled(targets):
            state = {'snap': snap, 'targets': targets}

            def poll():
                fresh = self.snapshot()
                if not fresh['driver']['ok']:
                    return 'driver'
                state['snap'] = fresh
                state['targets'], dummy = gpu_query.select_gpus(fresh, p['gpus'])
                return settled(state['targets'])

            wait.wait_for(poll, timeout=p['release_timeout'], interval=0.2)
            snap, targets = state['snap'], state['targets']
            self.result['gpus'] = [gpu_query.summarize(g) for g in targets]
        entries = []
        planned = set(planned_pids)
        busy = sorted(set(pr.get('pid') for g in snap['gpus'] for pr in g.get('processes', [])
                          if pr.get('pid') not in planned))
        for gpu in targets:
            if not orphaned(gpu):
                continue
            index = gpu.get('index')
            entry = {'gpu': index, 'bus_id': gpu.get('bus_id'), 'used_mib_before': gpu['used_mib'],
                     'used_mib_after': None, 'result': None,
                     'reason': '%d MiB held by no process' % gpu['used_mib']}
            blockers = []
            if os.geteuid() != 0:
                blockers.append('not running as root (use become: true)')
            if busy:
                blockers.append('compute processes are listed on the node (PIDs %s) and nvidia-smi --gpu-reset needs '
                                'none on any GPU' % ', '.join(str(x) for x in busy))
            users = [pid for pid in self.device_users(index) if pid not in planned] if index is not None else []
            if users:
                blockers.append('PIDs %s have the device file of GPU %s open' % (', '.join(str(x) for x in users), index))
            if blockers:
                entry['result'] = 'skipped'
                entry['reason'] += '; not reset: ' + '; '.join(blockers)
                self.warn('GPU %s: %s' % (index, entry['reason']))
                entries.append(entry)
                continue
            if check_only:
                entry['result'] = 'would reset'
                entries.append(entry)
                continue
            rc, out, err = self.target.smi.reset(index)
            parsed = smi_csv.parse_reset_output(rc, out, err)
            entry['rc'] = rc
            entry['output'] = parsed['message']
            entry['result'] = 'reset' if rc == 0 and parsed['ok'] else 'failed'
            if parsed['failed']:
                entry['refused'] = parsed['failed']
            entries.append(entry)
        if any(e['result'] in ('reset', 'failed') for e in entries):
            self.result['changed'] = True
            after = self.snapshot()
            if after['driver']['ok']:
                for e in entries:
                    for gpu in after['gpus']:
                        if gpu.get('index') == e['gpu']:
                            e['used_mib_after'] = gpu.get('used_mib')
                after_targets, dummy = gpu_query.select_gpus(after, p['gpus'])
                self.result['gpus'] = [gpu_query.summarize(g) for g in after_targets]
        failed = [e for e in entries if e['result'] == 'failed']
        if failed:
            self.result['reset'] = entries
            self.fail('%s: GPU reset failed: %s' % (PREFIX, '; '.join(
                'GPU %s: rc %s: %s' % (e['gpu'], e['rc'], e['output']) for e in failed)))
        return entries

    def finish(self):
        self.result['elapsed'] = self.elapsed()
        if self.warnings:
            self.result['warnings'] = list(self.warnings)
        return self.result


def run_drain(params, runner, check_mode=False, warn=None, which=None, nvml=None, keep=None):
    """Run the drain; returns the result dict or raises :class:`DrainError` (see the module docstring).

    ``warn(text)`` receives each warning; without it they are returned in
    ``result['warnings']``. ``which(name)`` finds executables (default: PATH).
    ``keep`` (a dict) receives ``last_snapshot``: the last GPU snapshot the drain took, after everything it
    did, so that a caller that proves the GPUs free next can judge it before querying again.
    """
    full = defaults()
    full.update(params or {})
    drain = _Drain(full, runner, check_mode, warn, which=which, nvml=nvml)
    drain.last_snapshot = None
    try:
        return drain.run()
    finally:
        if keep is not None:
            keep['last_snapshot'] = drain.last_snapshot


__all__ = ['ARGUMENT_SPEC', 'DrainError', 'defaults', 'holder_lines', 'run_drain']
