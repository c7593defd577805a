# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The teardown plan: which processes to signal for the GPU holders, as pure functions (standard library only).

Everything here is a function of a process-table snapshot (``procfs.process_table``)
and a :class:`PlanContext`; nothing reads ``/proc`` or signals anything, so the
rules are table-tested on synthetic trees (tests/unit/plugins/modules/test_gpu_drain_plan.py).

:func:`plan_drain` returns the roots (the first signal goes to them), every
process that may get SIGKILL (the roots' same-session descendants, the GPU
holders, and the *members* of each server: every process of its session,
process group and systemd cgroup, including those that left its tree when
their parent died and those that hold no GPU memory now), and the holders and
candidates that are never signalled, each with the reason.
"""

from __future__ import annotations

import os
import re

from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import query as gpu_query
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import procfs
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import secrets

DEFAULT_EXCLUDE = list(gpu_query.GPU_SYSTEM_DAEMONS)

# Programs that are never a server root: signalling them would end a login,
# a terminal multiplexer, a container or the whole machine.
SUPERVISOR_NAMES = frozenset((
    'systemd', 'init', '(sd-pam)', 'sshd', 'sshd-session', 'sshd-auth', 'login', 'su', 'sudo', 'doas', 'runuser',
    'bash', 'sh', 'zsh', 'dash', 'ksh', 'mksh', 'ash', 'fish', 'tcsh', 'csh', 'busybox',
    'tmux', 'screen', 'SCREEN', 'byobu', 'script', 'mosh-server',
    'conmon', 'runc', 'crun', 'containerd', 'dockerd', 'docker-init', 'docker-proxy', 'podman', 'tini', 'dumb-init',
    'catatonit', 'supervisord', 'runsv', 'runsvdir', 's6-supervise', 'agetty', 'cron', 'crond', 'atd',
))
SUPERVISOR_PREFIXES = ('containerd-shim', 'tmux:', 'systemd-', 'sshd:')


# ---------------------------------------------------------------------------
# Pure planning over a process-table snapshot
# ---------------------------------------------------------------------------

def compile_patterns(patterns, option):
    """Compile regexes; raises ValueError naming the option and the bad entry."""
    out = []
    for pattern in patterns or []:
        try:
            out.append(re.compile(pattern))
        except re.error as exc:
            raise ValueError('%s: invalid regular expression %r: %s' % (option, pattern, exc))
    return out


def exclude_match(info, exclude_res):
    """The pattern that excludes ``info``, or None.

    Each pattern must match in full (``re.fullmatch``) the process name
    (``comm``, at most 15 characters), the basename of ``argv[0]``, or the
    whole command line; ``.*`` matches part of a command line.
    """
    cmdline = ' '.join(info.cmdline)
    for regex in exclude_res:
        if regex.fullmatch(info.comm or '') or regex.fullmatch(info.exe_name or '') \
                or (cmdline and regex.fullmatch(cmdline)):
            return regex.pattern
    return None


def is_supervisor(info):
    """The shell/session/supervisor name of ``info`` (comm first, then argv[0]), or None."""
    for name in (info.comm or '', (info.exe_name or '').lstrip('-')):
        if name in SUPERVISOR_NAMES or name.startswith(SUPERVISOR_PREFIXES):
            return name
    return None


def is_ansible_process(info):
    for arg in info.cmdline[:3]:
        base = os.path.basename(arg)
        if base.startswith('AnsiballZ_') or base.startswith('ansible-') or base in ('ansible', 'ansible-runner'):
            return True
    return any('AnsiballZ_' in arg for arg in info.cmdline)


def matches_any(info, regexes):
    if not regexes:
        return True
    text = ' '.join(info.cmdline)
    return any((text and r.search(text)) or r.search(info.comm or '') for r in regexes)


class PlanContext(object):
    """Everything root selection needs besides the process table.

    ``self_chain``: the module's PID and its ancestors. ``unit_main_pids``:
    ``{unit: MainPID}`` from systemctl (missing or 0 when unknown);
    ``unit_cgroups``: ``{unit: ControlGroup}`` from systemctl.
    ``target_gpus``: the labels of the target GPUs. ``other_gpu_holders``:
    ``{pid: [gpus]}`` for processes that hold memory only outside the
    targets. ``device_fds``: ``pid -> list | None`` or None to skip the device
    check.
    """

    def __init__(self, self_chain=(), exclude_res=(), match_res=(), unit_main_pids=None, other_gpu_holders=None,
                 device_fds=None, unit_cgroups=None):
        self.self_chain = set(self_chain)
        self.exclude_res = list(exclude_res)
        self.match_res = list(match_res)
        self.unit_main_pids = dict(unit_main_pids or {})
        self.other_gpu_holders = dict(other_gpu_holders or {})
        self.device_fds = device_fds
        self.unit_cgroups = dict(unit_cgroups or {})


def never_signal_reason(info, ctx):
    """Why ``info`` may never be signalled at all, or None."""
    if info.pid <= 1:
        return 'PID %d is init' % info.pid
    if info.pid in ctx.self_chain:
        return 'the module itself or one of its ancestors'
    pattern = exclude_match(info, ctx.exclude_res)
    if pattern is not None:
        return 'excluded by %r' % pattern
    if info.pid in ctx.other_gpu_holders:
        return 'holds memory only on GPUs outside the targets (%s)' % _gpu_list(ctx.other_gpu_holders[info.pid])
    return None


def root_refusal(info, ctx):
    """Why ``info`` cannot be a root, or None."""
    reason = never_signal_reason(info, ctx)
    if reason:
        return reason
    name = is_supervisor(info)
    if name:
        return 'a shell, session or supervisor program (%s)' % name
    if is_ansible_process(info):
        return "one of Ansible's own processes"
    return None


def _gpu_list(gpus):
    return ','.join(str(g) for g in gpus)


def _walk_to_group_leader(table, holder):
    """The ancestor (or the holder) that leads the holder's process group.

    Returns ``(pid, None)`` or ``(None, why)``; never crosses a session.
    """
    info = holder
    seen = set()
    while info is not None and info.pid not in seen:
        seen.add(info.pid)
        if info.sid != holder.sid:
            return None, 'process-group leader %d not found before the session boundary at PID %d' % (
                holder.pgid, info.pid)
        if info.pid == holder.pgid:
            return info.pid, None
        if info.ppid <= 0:
            break
        parent = table.get(info.ppid)
        if parent is None:
            return None, 'process-group leader %d is not an ancestor (parent %d not visible)' % (
                holder.pgid, info.ppid)
        info = parent
    return None, 'process-group leader %d is not an ancestor in the same session (orphaned or re-parented)' % holder.pgid


def choose_root(table, holder_pid, ctx):
    """Pick the process to signal for one GPU holder.

    Returns ``(root_pid, how, notes)``: ``how`` says why this process is the
    root; ``notes`` lists refused candidates as ``{'pid', 'reason'}`` (pid
    None when there was no candidate). The holder itself is the fallback.
    Pure over ``table`` and ``ctx``.
    """
    holder = table[holder_pid]
    notes = []
    # 1. A systemd system service: its main process.
    if holder.unit and holder.unit.endswith('.service') and holder.unit_manager == 'system':
        main = ctx.unit_main_pids.get(holder.unit) or 0
        source = 'MainPID'
        if not main or main not in table:
            unit_path = None
            if holder.cgroup:
                marker = '/' + holder.unit
                cut = holder.cgroup.find(marker)
                if cut >= 0:
                    unit_path = holder.cgroup[:cut + len(marker)]
            main = procfs.oldest(table, procfs.processes_in_cgroup(table, unit_path)) if unit_path else None
            source = 'oldest process in its cgroup'
        if main and main in table:
            cand = table[main]
            refusal = root_refusal(cand, ctx)
            if refusal is None and cand.sid != holder.sid:
                refusal = 'in another session (%d) than holder %d (%d)' % (cand.sid, holder_pid, holder.sid)
            if refusal is None:
                return main, 'main process of %s (%s)' % (holder.unit, source), notes
            notes.append({'pid': main, 'reason': 'not used as the root of holder %d (%s of %s): %s' % (
                holder_pid, source, holder.unit, refusal)})
        else:
            notes.append({'pid': None, 'reason': 'no main process found for %s (holder %d)' % (holder.unit, holder_pid)})
    # 2. The ancestor that leads the holder's process group, within its session.
    leader, why = _walk_to_group_leader(table, holder)
    if leader is None:
        # 3. The holder left its server's tree (its parent died and it was reparented to PID 1 or a
        #    subreaper) while the server still runs: the live leader of its process group, in its session.
        cand = table.get(holder.pgid)
        if cand is not None and cand.pid != holder_pid and cand.sid == holder.sid and not cand.exited:
            refusal = root_refusal(cand, ctx)
            if refusal is None:
                return cand.pid, 'process-group leader of holder %d (which left its tree)' % holder_pid, notes
            notes.append({'pid': cand.pid, 'reason': 'not used as the root of holder %d (process-group leader, '
                                                     'not an ancestor): %s' % (holder_pid, refusal)})
            return holder_pid, 'holder itself (no usable root, see not_signalled)', notes
        notes.append({'pid': holder.pgid, 'reason': 'not used as the root of holder %d: %s' % (holder_pid, why)})
    elif leader == holder_pid:
        return holder_pid, 'holder leads its own process group', notes
    else:
        refusal = root_refusal(table[leader], ctx)
        if refusal is None:
            return leader, 'process-group leader of holder %d' % holder_pid, notes
        notes.append({'pid': leader, 'reason': 'not used as the root of holder %d (process-group leader): %s' % (
            holder_pid, refusal)})
    return holder_pid, 'holder itself (no usable root, see not_signalled)', notes


def tree_members(table, root_pid, ctx, kids=None):
    """Same-session descendants of a root that may be signalled, and the ones that may not.

    Returns ``(members, refused)`` where ``refused`` is ``[(pid, reason)]``.
    """
    root = table.get(root_pid)
    members = []
    refused = []
    if root is None:
        return members, refused
    for pid in procfs.descendants(table, root_pid, kids):
        info = table.get(pid)
        if info is None:
            continue
        if info.sid != root.sid:
            refused.append((pid, 'in another session than its root %d' % root_pid))
            continue
        reason = never_signal_reason(info, ctx)
        if reason:
            refused.append((pid, reason))
            continue
        members.append(pid)
    return members, refused


def unit_cgroup(info, ctx):
    """The cgroup path of the system service ``info`` runs in, or None.

    systemd's ``ControlGroup`` for the unit when the context has it, otherwise
    the part of the process's own cgroup path up to the unit.
    """
    if not (info.unit and info.unit.endswith('.service') and info.unit_manager == 'system'):
        return None
    known = ctx.unit_cgroups.get(info.unit)
    if known:
        return known
    if info.cgroup:
        marker = '/' + info.unit
        cut = info.cgroup.find(marker)
        if cut >= 0:
            return info.cgroup[:cut + len(marker)]
    return None


def server_members(table, root_pid, ctx, kids=None, unit_path=None):
    """The processes of a server that are not in its tree: ``[(pid, how)]``.

    A server is its root's session when the root leads it (``setsid``, as the
    launcher starts servers), its process group when the root leads that (a
    shell job), and its systemd cgroup when the root is a system service's
    main process. Processes there whose parent died were reparented to PID 1
    or a subreaper and are no longer descendants; they count all the same,
    whether or not they hold GPU memory now (a scheduler that freed its memory
    but keeps its ports). A root that leads neither its session nor its group
    (a process started by a shell without job control) has no members: its
    session is the shell's.
    """
    root = table.get(root_pid)
    if root is None:
        return []
    tree = set(procfs.descendants(table, root_pid, kids))
    out = []
    seen = set([root_pid])

    def add(pid, how):
        if pid not in seen and pid not in tree:
            seen.add(pid)
            out.append((pid, how))

    for info in sorted(table.values(), key=lambda i: i.pid):
        if root.sid == root.pid and info.sid == root.sid:
            add(info.pid, 'in the session of root %d' % root_pid)
        elif root.pgid == root.pid and info.pgid == root.pgid:
            add(info.pid, 'in the process group of root %d' % root_pid)
    if unit_path:
        for pid in procfs.processes_in_cgroup(table, unit_path):
            add(pid, 'in the cgroup of %s' % unit_path.rsplit('/', 1)[-1])
    return out


def orphan_members(table, holder_pid):
    """Processes that shared a dead server with ``holder_pid``: ``[(pid, how)]``.

    When the holder's process-group leader is gone (the server died and its
    children were reparented), the other members of that process group are the
    rest of the same server; when the dead leader also led the session, so are
    the session's members. A dead login shell's session is never taken: its
    members share only the session, not the group.
    """
    holder = table.get(holder_pid)
    if holder is None or holder.pgid <= 1 or holder.pgid in table:
        return []
    own_session = holder.sid == holder.pgid and holder.sid not in table
    out = []
    for info in sorted(table.values(), key=lambda i: i.pid):
        if info.pid == holder_pid:
            continue
        if info.pgid == holder.pgid:
            out.append((info.pid, 'in the process group of dead leader %d, like holder %d' % (holder.pgid, holder_pid)))
        elif own_session and info.sid == holder.sid:
            out.append((info.pid, 'in the session of dead leader %d, like holder %d' % (holder.sid, holder_pid)))
    return out


def member_refusal(info, ctx):
    """Why a member found by session, group or cgroup may not be signalled, or None."""
    reason = never_signal_reason(info, ctx)
    if reason:
        return reason
    name = is_supervisor(info)
    if name:
        return 'a shell, session or supervisor program (%s)' % name
    if is_ansible_process(info):
        return "one of Ansible's own processes"
    return None


def plan_drain(table, target_holders, ctx, explicit_pids=()):
    """Decide what to signal. Pure over the process table.

    ``target_holders``: ``{pid: {'pid', 'gpus', 'used_mib', 'name'}}`` for the
    processes nvidia-smi lists on the target GPUs. Returns a dict:

    * ``roots``: PIDs that get the first signal, in order;
    * ``targets``: ``{pid: {'pid', 'role', 'root', 'how', 'gpus', 'used_mib', 'first'}}``
      for every process that may get SIGKILL: roots, their same-session
      descendants, holders, and members (session, group or cgroup of a
      server, outside its tree). ``first`` is True for the processes that get
      the first signal: roots, and members, which no root tears down;
    * ``skipped``: ``[{'pid', 'name', 'cmdline', 'gpus', 'used_mib', 'reason'}]``.
    """
    planner = _Planner(table, target_holders, ctx)
    # Explicit roots first: they are the caller's intent.
    planner.take_explicit(explicit_pids)
    planner.take_holders()
    planner.take_members()
    return {'roots': planner.roots, 'targets': planner.targets, 'skipped': planner.skipped}


class _Planner(object):
    """The state of one :func:`plan_drain`: roots in order, targets by PID, what was skipped and why."""

    def __init__(self, table, target_holders, ctx):
        self.table = table
        self.holders = target_holders
        self.ctx = ctx
        self.roots = []
        self.targets = {}
        self.skipped = []
        self.kids = procfs.children_map(table)
        self.unit_paths = {}
        self.orphans = []

    def skip(self, pid, reason, holder=None):
        info = self.table.get(pid)
        self.skipped.append({
            'pid': pid,
            'name': (holder or {}).get('name') if info is None else info.comm,
            'cmdline': None if info is None else secrets.mask_cmdline(info.cmdline),
            'gpus': list((holder or {}).get('gpus', [])),
            'used_mib': (holder or {}).get('used_mib'),
            'reason': reason,
        })

    def entry(self, pid, role, root, how=None, first=False):
        holder = self.holders.get(pid) or {}
        return {'pid': pid, 'role': role, 'root': root, 'how': how, 'gpus': list(holder.get('gpus', [])),
                'used_mib': holder.get('used_mib'), 'first': first}

    def add_root(self, pid, how):
        if pid not in self.roots:
            self.roots.append(pid)
        current = self.targets.get(pid)
        if current is None or current['role'] != 'root':
            self.targets[pid] = self.entry(pid, 'root', pid, how, first=True)

    def take_explicit(self, explicit_pids):
        for pid in explicit_pids:
            info = self.table.get(pid)
            if info is None:
                self.skip(pid, 'pids: not running')
                continue
            if info.exited:
                self.skip(pid, 'pids: already exited (zombie, waiting for its parent %d)' % info.ppid)
                continue
            refusal = root_refusal(info, self.ctx)
            if refusal:
                self.skip(pid, 'pids: refused: %s' % refusal)
                continue
            if not matches_any(info, self.ctx.match_res):
                self.skip(pid, 'pids: does not match the match patterns')
                continue
            self.add_root(pid, 'explicit in pids')

    def holder_refusal(self, pid):
        """Why the GPU holder ``pid`` cannot be signalled, or None."""
        info = self.table.get(pid)
        if info is None:
            return ('listed by nvidia-smi but not visible in /proc (another PID namespace, or a stale listing); '
                    'run the task in the host PID namespace (on the host or with --pid=host)')
        if info.exited:
            return 'already exited (zombie, not yet reaped by its parent %d); its memory is being released' % info.ppid
        reason = never_signal_reason(info, self.ctx)
        if reason:
            return reason
        if self.ctx.device_fds is not None:
            fds = self.ctx.device_fds(pid)
            if fds is not None and not fds:
                return ('has no GPU device file open although nvidia-smi lists it: the PID probably names another '
                        'process in this PID namespace; run the task in the host PID namespace')
        return None

    def take_holders(self):
        table, ctx = self.table, self.ctx
        for pid in sorted(self.holders, key=lambda p: (p is None, p or 0)):
            holder = self.holders[pid]
            if pid is None:
                self.skip(None, 'nvidia-smi listed a process without a PID; it cannot be signalled', holder)
                continue
            refusal = self.holder_refusal(pid)
            if refusal:
                self.skip(pid, refusal, holder)
                continue
            info = table[pid]
            root, how, notes = choose_root(table, pid, ctx)
            if ctx.match_res and not (matches_any(info, ctx.match_res) or matches_any(table[root], ctx.match_res)):
                self.skip(pid, 'neither it nor its root %d matches the match patterns' % root, holder)
                continue
            for note in notes:
                self.skip(note['pid'], note['reason'])
            self.add_root(root, how)
            if how.startswith('main process of '):
                self.unit_paths[root] = unit_cgroup(info, ctx)
            if root != pid:
                # A holder outside its root's tree (reparented) is not torn down by the root: it gets the first signal.
                self.targets.setdefault(pid, self.entry(pid, 'holder', root, first=root not in procfs.ancestors(table, pid)))
            elif how.startswith('holder itself'):
                self.orphans.append(pid)

    def take_member(self, pid, root, how):
        if pid in self.targets:
            return
        info = self.table.get(pid)
        if info is None or info.exited:
            return
        reason = member_refusal(info, self.ctx)
        if reason:
            if pid not in [e['pid'] for e in self.skipped]:
                self.skip(pid, '%s but not signalled: %s' % (how, reason), self.holders.get(pid))
            return
        role = 'holder' if pid in self.holders else 'member'
        self.targets[pid] = self.entry(pid, role, root, how, first=True)

    def take_members(self):
        for root in list(self.roots):
            members, refused = tree_members(self.table, root, self.ctx, self.kids)
            for pid in members:
                if pid in self.targets:
                    continue
                holder = self.holders.get(pid) or {}
                self.targets[pid] = self.entry(pid, 'holder' if holder else 'descendant', root)
            for pid, reason in refused:
                if pid not in self.targets:
                    self.skip(pid, 'in the tree of root %d but not signalled: %s' % (root, reason), self.holders.get(pid))
            for pid, how in server_members(self.table, root, self.ctx, self.kids, self.unit_paths.get(root)):
                self.take_member(pid, root, how)
        for pid in self.orphans:
            for member, how in orphan_members(self.table, pid):
                self.take_member(member, pid, how)


def _leaders(info):
    return set((info.pid, info.pgid, info.sid))


def unexpected(plan, table, expected_pids):
    """The GPU holders the plan would signal that belong to none of ``expected_pids``.

    A holder is expected when it, its root, one of its ancestors, or the leader
    of its process group or session (alive or not: a reparented scheduler of
    an expected server that died) is an expected PID. Returns the PIDs, in
    order; empty when ``expected_pids`` is empty.
    """
    expected = set(int(p) for p in expected_pids or ())
    if not expected:
        return []
    out = []
    for pid in sorted(plan['targets']):
        target = plan['targets'][pid]
        if not target['gpus']:
            continue
        info = table.get(pid)
        related = set([pid, target['root']]) | set(procfs.ancestors(table, pid))
        if info is not None:
            related |= _leaders(info)
        if not related & expected:
            out.append(pid)
    return out
