# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One deadline and one wait loop for every wait of the GPU side (standard library only).

In the manner of kubernetes.core's ``k8s/waiter.py``: a caller names *what*
it waits for (a predicate), *how long* (a timeout or a :class:`Deadline` it
shares with other steps) and *how often* (an interval); the loop owns the
*when*:

* polls start every ``interval`` seconds on monotonic time; the time a poll
  itself takes comes off the wait, so a change is seen at most one interval
  plus one poll after it happens;
* every wait is clamped to the time left, and the last poll happens at the
  deadline, so a timeout never cuts the last look short;
* there is no sleep after success, and ``interval <= 0`` means "look once";
* ``on_poll(value, polls, deadline)`` runs after each unsuccessful poll: it may
  shorten the deadline (a grace period that starts when something happened)
  or raise to abort;
* ``sleep`` may return early (the process engine sleeps on pidfds, which wake
  it the moment a process exits).
"""

from __future__ import annotations

import time


class Deadline(object):
    """A monotonic deadline: ``remaining()`` never goes below zero.

    ``clock`` is injectable for tests; it defaults to :func:`time.monotonic`.
    A negative number of seconds means an already expired deadline.
    """

    def __init__(self, seconds, clock=None, start=None):
        self.clock = clock or time.monotonic
        self.start = self.clock() if start is None else start
        self.end = self.start + max(0.0, float(seconds))

    def remaining(self):
        return max(0.0, self.end - self.clock())

    def expired(self):
        return self.clock() >= self.end

    def elapsed(self):
        return self.clock() - self.start

    def clamp(self, seconds):
        """``seconds`` limited to the time left."""
        return max(0.0, min(float(seconds), self.remaining()))

    def shorten(self, seconds):
        """Move the end earlier to ``now + seconds`` (never later)."""
        self.end = min(self.end, self.clock() + max(0.0, float(seconds)))


class WaitResult(object):
    """What :func:`wait_for` saw: ``ok``, the last ``value``, ``polls`` and ``elapsed`` seconds."""

    __slots__ = ('ok', 'value', 'polls', 'elapsed')

    def __init__(self, ok, value, polls, elapsed):
        self.ok = ok
        self.value = value
        self.polls = polls
        self.elapsed = elapsed

    def __bool__(self):
        return bool(self.ok)

    def __repr__(self):
        return 'WaitResult(ok=%r, polls=%d, elapsed=%.3f)' % (self.ok, self.polls, self.elapsed)


def wait_for(predicate, timeout=None, interval=0.5, deadline=None, on_poll=None, sleep=None, clock=None):
    """Poll ``predicate()`` until it returns something truthy or the deadline passes.

    Give either ``timeout`` (seconds) or a ``deadline`` shared with other
    steps. Returns a :class:`WaitResult`; ``result.value`` is the last value
    the predicate returned (what the caller reports on failure).
    """
    if deadline is None:
        deadline = Deadline(0.0 if timeout is None else timeout, clock=clock)
    sleep = sleep or time.sleep
    polls = 0
    while True:
        started = deadline.clock()
        value = predicate()
        polls += 1
        if value:
            return WaitResult(True, value, polls, deadline.elapsed())
        if on_poll is not None:
            on_poll(value, polls, deadline)
        if interval <= 0 or deadline.expired():
            return WaitResult(False, value, polls, deadline.elapsed())
        wait = min(started + float(interval), deadline.end) - deadline.clock()
        if wait > 0:
            sleep(wait)
