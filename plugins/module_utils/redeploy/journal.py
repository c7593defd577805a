# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The node journal: the node's own record of where a redeploy stands.

``<state_dir>/journal.json`` (mode 0640) is rewritten atomically (temporary file + rename) at every
step of a redeploy, by the module doing the step, before and after it acts. So whatever happens to
the controller (SIGKILL, Ctrl-C, an AWX cancel, a lost connection), the next run reads on the node
which step was reached, which candidate config was being tried, what the last known-good config is,
and which PIDs were involved (docs/user-guide.md, "When a run is interrupted").

Only the holder of the node lease writes it (``lease.py``).
"""

from __future__ import annotations

import json
import os
import signal
import time

from ansible_collections.gpufleet.sglang.plugins.module_utils.node.supervise import write_private

NAME = "journal.json"
FORMAT = 1
HISTORY_MAX = 40

# The steps in the order a redeploy passes them.
PLANNED = "planned"          # the preflight decided to act and took the lease
DRAINING = "draining"        # waiting for the old server's in-flight requests (router drain)
TEARDOWN = "teardown"        # signalling the old server
TORN_DOWN = "torn_down"      # the old server is gone and its GPUs are free
LAUNCHING = "launching"      # the candidate runs (PID known) and is waited for
LAUNCHED = "launched"        # the candidate is healthy, runs the intended config, holds its GPUs
VERIFYING = "verifying"      # the smoke gate runs against the candidate
VERIFIED = "verified"        # the smoke gate passed
PROMOTED = "promoted"        # the candidate is the known-good config: the redeploy is done
ROLLING_BACK = "rolling_back"
ROLLED_BACK = "rolled_back"  # the known-good config runs again
FAILED = "failed"            # the run ended in failure; ``node`` says what runs now
INTERRUPTED = "interrupted"  # a module was stopped (SIGTERM/SIGINT/SIGHUP) in the middle of a step
STOPPED = "stopped"          # the teardown playbook stopped the server on purpose

# What stops a module in the middle of a step: a cancelled job (SIGTERM, SIGINT) or the end of its connection
# (SIGHUP, as a remote node sees a dead controller). SIGKILL cannot be caught: the next run reads the step.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Interrupted(BaseException):
    """The module got SIGTERM, SIGINT or SIGHUP (a cancelled job, a dead controller's connection).

    A BaseException, as KeyboardInterrupt is: the handler raises it wherever the main thread is, and the
    ``except Exception`` of a step in progress (an HTTP call that maps any error to a connection error, an NVML
    read that falls back to nvidia-smi) must not swallow it, or the signal would be lost and the step go on."""

    def __init__(self, signum):
        super(Interrupted, self).__init__("interrupted by %s" % signal.Signals(signum).name)
        self.signum = signum


def raise_interrupted(signum, frame):  # pylint: disable=unused-argument
    """A signal handler for STOP_SIGNALS: the step in progress sees Interrupted, and records it."""
    raise Interrupted(signum)


STEPS = (PLANNED, DRAINING, TEARDOWN, TORN_DOWN, LAUNCHING, LAUNCHED, VERIFYING, VERIFIED, PROMOTED,
         ROLLING_BACK, ROLLED_BACK, FAILED, INTERRUPTED, STOPPED)
# After these the node is in a settled state that needs nothing from the run that wrote them.
SETTLED = frozenset((PROMOTED, ROLLED_BACK, FAILED, STOPPED))
# The old server may be gone from here on.
PAST_TEARDOWN = frozenset((TEARDOWN, TORN_DOWN, LAUNCHING, LAUNCHED, VERIFYING, VERIFIED, ROLLING_BACK))


def path_for(state_dir):
    return os.path.join(state_dir, NAME)


def read(path):
    """The journal entry at ``path``: ``{}`` when there is none, ``{"corrupt": reason}`` when unreadable."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        return {"corrupt": "cannot read %s: %s" % (path, exc.strerror)}
    try:
        data = json.loads(text)
    except ValueError as exc:
        return {"corrupt": "%s is not valid JSON (%s)" % (path, exc)}
    if not isinstance(data, dict):
        return {"corrupt": "%s does not hold a JSON object" % path}
    return data


def record(path, run_id, step, now=None, **fields):
    """Write step ``step`` of run ``run_id`` into the journal at ``path`` and return the new entry.

    ``fields`` are merged into the entry (``None`` removes a field). The previous entry's run id and
    step are kept in ``history`` (newest last, at most HISTORY_MAX entries).
    """
    if step not in STEPS:
        raise ValueError("unknown journal step %r; one of %s" % (step, ", ".join(STEPS)))
    now = time.time() if now is None else now
    entry = read(path)
    replaced = None
    if "corrupt" in entry:
        replaced = entry["corrupt"]
        entry = {}
    history = list(entry.get("history") or [])
    history.append({"run_id": run_id, "step": step, "at": round(now, 3), "detail": fields.get("detail")})
    del history[:-HISTORY_MAX]
    if entry.get("run_id") != run_id:
        entry = {"previous_run": {"run_id": entry.get("run_id"), "step": entry.get("step"), "at": entry.get("at")}
                 if entry.get("run_id") else None}
        entry["run_started_at"] = round(now, 3)
    if replaced:
        entry["replaced_corrupt"] = replaced
    entry.update(format=FORMAT, run_id=run_id, step=step, at=round(now, 3), history=history)
    for key, value in fields.items():
        if value is None:
            entry.pop(key, None)
        else:
            entry[key] = value
    directory = os.path.dirname(path)
    if directory and not os.path.isdir(directory):
        os.makedirs(directory, 0o750)
    write_private(path, json.dumps(entry, indent=1, sort_keys=True) + "\n", mode=0o640)
    return entry


def unfinished(entry):
    """True when the journal shows a run that stopped before its node was settled."""
    return bool(entry.get("run_id")) and entry.get("step") not in SETTLED


def describe(entry):
    """One line: which run reached which step, when."""
    if not entry:
        return "no journal (no redeploy by this collection recorded here)"
    if entry.get("corrupt"):
        return "journal unreadable: %s" % entry["corrupt"]
    age = max(0.0, time.time() - float(entry.get("at") or 0))
    text = "run %s reached step %s %.0f s ago" % (entry.get("run_id"), entry.get("step"), age)
    if entry.get("detail"):
        text += " (%s)" % entry["detail"]
    return text
