# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The collection's one stop engine: signal, wait, escalate (standard library only).

:func:`stop` takes the processes to stop, pinned by PID *and* start time,
sends the first signal to the ones marked ``first`` (a server's root: SGLang
drains its requests and tears its own tree down), waits until everything is
gone or ``term_timeout`` passes, sends ``SIGKILL`` to what is left and waits
``kill_timeout`` more. Once every ``first`` process is gone, the rest get
``grace`` seconds (a child that outlives its server will not exit by itself).

Every wait goes through :func:`wait.wait_for`; on Linux 5.3+ each process is
held through a pidfd, so a signal can never reach a process that reused the
PID, and the wait wakes the moment a process exits.

The result has one report per process, in the order given::

    {"pid", "name", "signals": ["SIGTERM", "SIGKILL"], "seconds_to_exit": 2.41,
     "first_signal": "default" | "ignored" | "caught" | "blocked" | None,
     "state": None | "D (uninterruptible sleep)"}

``first_signal`` says how the process disposed of the first signal when it was
sent (from ``/proc/<pid>/status``): a process that ignores SIGQUIT or SIGTERM
(it may have inherited SIG_IGN from a background shell job) can only end by
SIGKILL, and the report says so instead of leaving a mystery.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import time

from ansible_collections.gpufleet.sglang.plugins.module_utils.node import procfs
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import wait

POLL_S = 0.02
# Seconds from the first signal to SIGKILL: the one default of the collection (gpu_drain's term_timeout, the
# roles' gpu_teardown_term_timeout): SGLang drains its requests, then waits up to 15 s for its schedulers.
DEFAULT_TERM_TIMEOUT = 60.0
DEFAULT_GRACE_S = 1.0


def _pidfd_supported():
    return hasattr(os, 'pidfd_open') and hasattr(signal, 'pidfd_send_signal')


class ProcessHandle(object):
    """A process pinned by PID and start time.

    :meth:`open` checks the start time, opens a pidfd (Linux 5.3+, Python
    3.9+) and checks the start time again, so the pidfd provably refers to
    the process that was planned. Signals then go through the pidfd and
    cannot reach a process that reused the PID. Without pidfds the start time
    is re-checked right before each ``os.kill``.
    """

    def __init__(self, pid, starttime, proc_root=procfs.PROC_ROOT):
        self.pid = int(pid)
        self.starttime = int(starttime)
        self.proc_root = proc_root
        self.pidfd = None
        self.signals = []
        self.exited_at = None

    @classmethod
    def open(cls, pid, starttime, proc_root=procfs.PROC_ROOT):
        """Return a handle, or None when ``pid`` no longer has ``starttime``."""
        handle = cls(pid, starttime, proc_root)
        if not handle.same_process():
            return None
        if _pidfd_supported() and proc_root == procfs.PROC_ROOT:
            try:
                handle.pidfd = os.pidfd_open(handle.pid)
            except OSError:
                handle.pidfd = None
            if not handle.same_process():
                handle.close()
                return None
        return handle

    def same_process(self):
        stat = procfs.read_stat(self.pid, self.proc_root)
        return stat is not None and stat['starttime'] == self.starttime

    def stat(self):
        """Current parsed stat, or None when the process is gone or replaced."""
        stat = procfs.read_stat(self.pid, self.proc_root)
        if stat is None or stat['starttime'] != self.starttime:
            return None
        return stat

    def state(self):
        """Current state letter, or None when the process is gone or replaced."""
        stat = self.stat()
        return None if stat is None else stat['state']

    def gone(self):
        """True when the process no longer runs: absent, replaced, or exited.

        A zombie counts as exited once its last thread is gone (the pidfd
        turns readable at exactly that moment).
        """
        if self.pidfd is not None:
            try:
                poller = select.poll()
                poller.register(self.pidfd, select.POLLIN)
                if poller.poll(0):
                    return True
            except (OSError, ValueError):
                pass
        stat = self.stat()
        return stat is None or procfs.is_exited(stat['state'], stat['num_threads'])

    def send(self, sig):
        """Send ``sig``; True when delivered, False when the process is gone (or a zombie).

        Raises OSError for anything else (e.g. EPERM).
        """
        if self.gone():
            return False
        if self.pidfd is not None:
            try:
                signal.pidfd_send_signal(self.pidfd, sig)
            except OSError as exc:
                if exc.errno == errno.ESRCH:
                    return False
                raise
        else:
            if not self.same_process():
                return False
            try:
                os.kill(self.pid, sig)
            except OSError as exc:
                if exc.errno == errno.ESRCH:
                    return False
                raise
        self.signals.append(procfs.signal_name(sig))
        return True

    def close(self):
        if self.pidfd is not None:
            try:
                os.close(self.pidfd)
            except OSError:
                pass
            self.pidfd = None


def open_handle(pid, starttime=None, proc_root=procfs.PROC_ROOT):
    """A :class:`ProcessHandle` for ``pid`` (its current start time when not given), or None."""
    if starttime is None:
        stat = procfs.read_stat(pid, proc_root)
        if stat is None:
            return None
        starttime = stat['starttime']
    return ProcessHandle.open(pid, starttime, proc_root)


def _pidfd_sleep(handles):
    """A ``sleep`` for :func:`wait.wait_for` that wakes when one of ``handles`` exits."""
    state = {'poll': True}

    def sleep(seconds):
        fds = [h.pidfd for h in handles if h.pidfd is not None and not h.gone()]
        if state['poll'] and fds and len(fds) == len([h for h in handles if not h.gone()]):
            try:
                poller = select.poll()
                for fd in fds:
                    poller.register(fd, select.POLLIN)
                if poller.poll(max(1, int(seconds * 1000))):
                    # A readable pidfd of a handle that is not gone() would spin: sleep after this.
                    state['poll'] = any(h.gone() for h in handles)
                return
            except (OSError, ValueError):
                state['poll'] = False
        time.sleep(seconds)
    return sleep


def wait_gone(handles, deadline, interval=POLL_S, sleep=None, on_exit=None, on_poll=None):
    """Wait until every handle is gone or ``deadline`` expires; returns the handles still running.

    ``on_exit(handle)`` runs once per handle when its exit is first seen;
    ``on_poll(pending)`` after each round (it may shorten ``deadline``).
    """
    pending = list(handles)

    def check():
        still = []
        for handle in pending:
            if handle.gone():
                if on_exit is not None:
                    on_exit(handle)
            else:
                still.append(handle)
        pending[:] = still
        return not pending

    def polled(dummy_value, dummy_polls, dummy_deadline):
        if on_poll is not None:
            on_poll(list(pending))

    wait.wait_for(check, deadline=deadline, interval=interval, on_poll=polled,
                  sleep=sleep or _pidfd_sleep(pending))
    return list(pending)


def disposition(pid, sig, proc_root=procfs.PROC_ROOT):
    """How ``pid`` disposes of ``sig``: ``ignored``, ``caught``, ``blocked``, ``default`` or None (unknown)."""
    masks = procfs.read_signal_masks(pid, proc_root)
    if masks is None:
        return None
    bit = 1 << (int(sig) - 1)
    if masks.get('SigIgn', 0) & bit:
        return 'ignored'
    if masks.get('SigBlk', 0) & bit:
        return 'blocked'
    if masks.get('SigCgt', 0) & bit:
        return 'caught'
    return 'default'


class Target(object):
    """One process to stop: ``pid`` and ``starttime`` (None: read now), its ``name``,
    and whether it gets the ``first`` signal (otherwise only SIGKILL, when it
    outlives the wait)."""

    __slots__ = ('pid', 'starttime', 'name', 'first')

    def __init__(self, pid, starttime=None, name=None, first=False):
        self.pid = int(pid)
        self.starttime = starttime
        self.name = name
        self.first = bool(first)


def _report(target):
    return {'pid': target.pid, 'name': target.name, 'signals': [], 'seconds_to_exit': None,
            'first_signal': None, 'state': None}


def stop(targets, first_signal=signal.SIGTERM, term_timeout=DEFAULT_TERM_TIMEOUT, kill_timeout=15.0, grace=DEFAULT_GRACE_S,
         interval=POLL_S, before_kill=None, on_exit=None, warn=None, clock=None):
    """Stop ``targets`` (a list of :class:`Target`); returns ``{"reports", "survivors", "elapsed", "handles"}``.

    ``before_kill(live_first_pids)`` runs once, right before the SIGKILL round,
    and may return more :class:`Target` objects (children a live root spawned
    after the plan): they are pinned and killed with the rest. ``on_exit(pid)``
    runs once per process when its exit is seen (a parent reaps its child
    there). ``warn(text)`` receives signalling errors (EPERM...).
    ``reports`` has one entry per target, in order (later ones appended);
    ``seconds_to_exit`` counts from the first signal. ``survivors`` lists the
    PIDs still running after ``kill_timeout``.
    """
    warn = warn or (lambda text: None)
    clock = clock or time.monotonic
    start = clock()
    reports = []
    by_pid = {}
    handles = {}
    order = []

    def seen_gone(handle):
        report = by_pid[handle.pid]
        if report['seconds_to_exit'] is None:
            report['seconds_to_exit'] = round(clock() - start, 3)
        if on_exit is not None:
            on_exit(handle.pid)

    def add(target):
        if target.pid in by_pid:
            return None
        report = _report(target)
        by_pid[target.pid] = report
        reports.append(report)
        order.append(target)
        handle = open_handle(target.pid, target.starttime)
        if handle is None:
            report['seconds_to_exit'] = 0.0
            return None
        handles[target.pid] = handle
        return handle

    for target in targets:
        add(target)

    killed = set()

    def send(handle, sig):
        if sig == signal.SIGKILL:
            if handle.pid in killed:
                return True
            killed.add(handle.pid)
        try:
            if handle.send(sig):
                by_pid[handle.pid]['signals'].append(procfs.signal_name(sig))
                return True
            seen_gone(handle)
        except OSError as exc:
            warn('PID %d: %s failed: %s' % (handle.pid, procfs.signal_name(sig), exc))
        return False

    firsts = []
    for target in order:
        handle = handles.get(target.pid)
        if handle is None or not target.first:
            continue
        by_pid[target.pid]['first_signal'] = disposition(target.pid, first_signal)
        if send(handle, first_signal):
            firsts.append(handle)
    pending = [h for pid, h in handles.items() if by_pid[pid]['seconds_to_exit'] is None]
    if first_signal != signal.SIGKILL:
        deadline = wait.Deadline(term_timeout, clock=clock)
        shortened = []

        def on_poll(still):
            if not shortened and not any(h in still for h in firsts):
                shortened.append(True)
                deadline.shorten(grace)

        pending = wait_gone(pending, deadline, interval=interval, on_exit=seen_gone, on_poll=on_poll)
    if pending and before_kill is not None:
        live = [h.pid for h in firsts if not h.gone()]
        for target in before_kill(live) or ():
            handle = add(target)
            if handle is not None:
                pending.append(handle)
    for handle in pending:
        send(handle, signal.SIGKILL)
    survivors = wait_gone(pending, wait.Deadline(kill_timeout, clock=clock), interval=interval,
                          on_exit=seen_gone) if pending else []
    for handle in survivors:
        by_pid[handle.pid]['state'] = procfs.state_name(handle.state())
    return {'reports': reports, 'survivors': [h.pid for h in survivors], 'elapsed': round(clock() - start, 3),
            'handles': handles}


def close_all(result):
    """Close the pidfds a :func:`stop` result still holds."""
    for handle in result.get('handles', {}).values():
        handle.close()


def kill(members, grace=5.0):
    """SIGKILL every ``(pid, starttime)`` still running; returns ``(killed, still_running)``."""
    targets = [Target(pid, start, first=True) for pid, start in members]
    result = stop(targets, first_signal=signal.SIGKILL, kill_timeout=grace)
    close_all(result)
    killed = [r['pid'] for r in result['reports'] if r['signals']]
    return killed, result['survivors']
