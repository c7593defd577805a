# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The per-node redeploy lease: an exclusive lock that can be judged from the node alone.

On disk (see docs/design.md, "Node state"):

* ``<path>/`` is created with ``mkdir`` (atomic); whoever created it holds the lease.
* ``<path>/holder.json`` names the holder: the run id, the controller (host, PID, its start time,
  boot id), when the lease was taken and renewed, its deadline (``expires_at``), and the node-side
  process acting for the holder right now (``node_pid``: the module run that is working, if any).
* ``<path>.generation`` (next to it, kept across releases) counts the acquisitions.

A lease is **live** while its deadline is in the future or while its ``node_pid`` still runs (a
module that works for the holder renews the lease, see :class:`KeepAlive`). It can be taken over when
it **expired** (deadline passed, nobody acting on the node) or when its holder is **provably dead**:
the controller ran on this very machine (same boot id) and its PID is gone (or was reused), and no
node-side process acts for it. A controller on another machine is judged by the deadline only.

Every takeover is reported to the caller, with the previous holder, so that it can say so loudly and
continue from the node journal (``journal.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time

from ansible_collections.gpufleet.sglang.plugins.module_utils.node.supervise import write_private

HOLDER = "holder.json"
GENERATION_SUFFIX = ".generation"
DEFAULT_TTL = 300.0
MIN_TTL = 30.0
# A takeover guard older than this was left by a killed run.
GUARD_STALE_S = 60.0

FREE = "free"
MINE = "mine"
LIVE = "live"
EXPIRED = "expired"
DEAD = "dead"


class LeaseLost(Exception):
    """The lease this run held was taken over (or removed) by someone else."""


class LeaseBusy(Exception):
    """Another live holder kept the lease past the wait timeout."""

    def __init__(self, msg, holder=None, waited=0.0):
        super(LeaseBusy, self).__init__(msg)
        self.msg = msg
        self.holder = holder or {}
        self.waited = waited


# --------------------------------------------------------------------------
# Identity of processes and machines
# --------------------------------------------------------------------------

def boot_id(proc_root="/proc"):
    """This kernel's boot id (changes at every boot), or "" when unreadable."""
    try:
        with open(os.path.join(proc_root, "sys/kernel/random/boot_id"), encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def process_start(pid, proc_root="/proc"):
    """``/proc/<pid>/stat`` field 22 (start time in clock ticks), or None when the process is gone or a zombie."""
    try:
        with open(os.path.join(proc_root, str(int(pid)), "stat"), encoding="ascii", errors="replace") as fh:
            text = fh.read()
    except (OSError, ValueError, TypeError):
        return None
    fields = text[text.rfind(")") + 2:].split()
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    try:
        return int(fields[19])
    except ValueError:
        return None


def same_process_alive(pid, start, proc_root="/proc"):
    """True while ``pid`` runs and (when ``start`` is known) still has start time ``start``."""
    if not pid:
        return False
    now = process_start(pid, proc_root)
    if now is None:
        return False
    return start in (None, "") or int(start) == now


def pid_namespace(proc_root="/proc"):
    """The PID namespace of this process (``pid:[4026531836]``), or "" when unreadable."""
    try:
        return os.readlink(os.path.join(proc_root, "self/ns/pid"))
    except OSError:
        return ""


def local_identity():
    """``{host, boot_id, pidns}`` of this machine and PID namespace."""
    return {"host": socket.gethostname(), "boot_id": boot_id(), "pidns": pid_namespace()}


# --------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------

def generation_path(path):
    return path.rstrip("/") + GENERATION_SUFFIX


def read_generation(path):
    """How many times the lease at ``path`` was taken; 0 when never (or when the counter is unreadable)."""
    try:
        with open(generation_path(path), encoding="utf-8") as fh:
            value = int(fh.read().strip() or 0)
    except (OSError, ValueError):
        return 0
    return max(0, value)


def bump_generation(path):
    """Add one to the acquisition counter. Call it only while holding the lease."""
    value = read_generation(path) + 1
    write_private(generation_path(path), "%d\n" % value, mode=0o644)
    return value


def read_holder(path):
    """The holder record of the lease at ``path``, or None (no lease, no holder.json yet, not a JSON object)."""
    try:
        with open(os.path.join(path, HOLDER), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _num(value, default=None):
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def new_record(run_id, controller=None, ttl=DEFAULT_TTL, now=None, node_pid=None):
    """A holder record for ``run_id``. ``controller``: ``{host, pid, starttime, boot_id, pidns, user}`` as the
    controller reported it (see the ``controller_facts`` action), or None."""
    now = time.time() if now is None else now
    ttl = max(MIN_TTL, float(ttl))
    record = {
        "owner": run_id,          # kept under this name: node_lock and the docs call the run id the owner
        "controller": dict(controller or {}),
        "node": local_identity(),
        "taken_at": now,
        "renewed_at": now,
        "ttl": ttl,
        "expires_at": now + ttl,
        "node_pid": None,
        "node_pid_start": None,
    }
    if node_pid:
        record["node_pid"] = int(node_pid)
        record["node_pid_start"] = process_start(node_pid)
    return record


def judge(holder, run_id=None, now=None, local=None, proc_root="/proc", path=None):
    """``(state, reason)`` of a held lease whose holder record is ``holder`` (None: unknown holder).

    ``state``: MINE (``run_id`` holds it), LIVE, EXPIRED (deadline passed, nobody acts for it) or
    DEAD (its controller ran on this machine and is gone, nobody acts for it).
    """
    now = time.time() if now is None else now
    local = local or local_identity()
    if holder is None:
        # A run writes holder.json right after its mkdir: an empty lease directory older than a few seconds is
        # what a run killed in between left behind.
        try:
            age = time.time() - os.stat(path).st_mtime if path else 0.0     # a file time: real time, not ``now``
        except OSError:
            age = 0.0
        if age > GUARD_STALE_S:
            return EXPIRED, "the lease directory has had no holder record for %.0f s (a run was killed while taking it)" % age
        return LIVE, "the lease directory has no holder record yet (a run is taking it right now)"
    if run_id and holder.get("owner") == run_id:
        return MINE, "held by this run"
    acting = holder.get("node_pid")
    if acting and same_process_alive(acting, holder.get("node_pid_start"), proc_root):
        return LIVE, "process %s on this node is working for run %s" % (acting, holder.get("owner"))
    ctl = holder.get("controller")
    ctl = ctl if isinstance(ctl, dict) else {}
    # Only a controller on this machine, in this PID namespace, can be proven gone by its PID.
    same_machine = ctl.get("boot_id") and ctl.get("boot_id") == local.get("boot_id") and ctl.get("pidns") == local.get("pidns")
    if same_machine and ctl.get("pid"):
        if not same_process_alive(ctl.get("pid"), ctl.get("starttime"), proc_root):
            return DEAD, "its controller (PID %s on %s) is gone" % (ctl.get("pid"), ctl.get("host") or local.get("host"))
    expires = _num(holder.get("expires_at"))
    if expires is None:
        # A record from the old node_lock (no deadline): it expires DEFAULT_TTL after it was taken.
        since = _num(holder.get("since"), _num(holder.get("taken_at"), 0.0))
        expires = since + DEFAULT_TTL
    if now > expires:
        return EXPIRED, "its deadline passed %.0f s ago and nothing on this node works for it" % (now - expires)
    return LIVE, "renewed %.0f s ago, expires in %.0f s" % (now - _num(holder.get("renewed_at"), now), expires - now)


def describe(holder):
    """One line naming the holder: run id, controller, age."""
    if not holder:
        return "an unknown holder (no holder.json yet)"
    ctl = holder.get("controller")
    where = ""
    if isinstance(ctl, str) and ctl:
        where = " from controller %s" % ctl
    elif isinstance(ctl, dict) and ctl:
        where = " from controller %s PID %s" % (ctl.get("host") or "?", ctl.get("pid") or "?")
        if ctl.get("user"):
            where += " (user %s)" % ctl["user"]
    since = _num(holder.get("taken_at"), _num(holder.get("since")))
    age = (", taken %.0f s ago" % max(0.0, time.time() - since)) if since is not None else ""
    return "run %s%s%s" % (holder.get("owner"), where, age)


def inspect(path, run_id=None, now=None):
    """``{path, held, owner, holder, state, reason, generation}`` of the lease at ``path``, read-only."""
    held = os.path.isdir(path)
    holder = read_holder(path) if held else None
    state, reason = (judge(holder, run_id, now, path=path) if held else (FREE, "not held"))
    return {
        "path": path,
        "held": held,
        "owner": (holder or {}).get("owner"),
        "holder": holder or {},
        "state": state,
        "reason": reason,
        "generation": read_generation(path),
    }


# --------------------------------------------------------------------------
# Changes
# --------------------------------------------------------------------------

def _write_holder(path, record):
    write_private(os.path.join(path, HOLDER), json.dumps(record, sort_keys=True) + "\n", mode=0o600)


def _try_create(path, record):
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        return False
    _write_holder(path, record)
    return True


def _take_over(path, seen, record, now_fn, force=False):
    """Replace the holder of the lease ``path`` that was judged EXPIRED/DEAD (or broken, ``force``) while its holder
    record is still ``seen``; True when this run holds the lease now.

    Serialised by a guard directory next to the lease, and the holder is read and judged again under the guard, so
    that a waiter that saw the same lease a moment later never replaces the fresh holder the first waiter wrote.
    The lease directory never disappears during a takeover (holder.json is replaced atomically), so no third run
    can slip in and create a lease in between: the one that ends up holding it is the one that took it over.
    """
    base = path.rstrip("/")
    guard = base + ".takeover"
    try:
        os.mkdir(guard, 0o700)
    except FileExistsError:
        try:
            if time.time() - os.stat(guard).st_mtime > GUARD_STALE_S:
                os.rmdir(guard)
        except OSError:
            pass
        return False
    except OSError:
        return False
    try:
        holder = read_holder(path)
        if holder != seen or not os.path.isdir(path):
            return False
        if not force and judge(holder, record["owner"], now_fn(), path=path)[0] not in (EXPIRED, DEAD):
            return False
        _write_holder(path, record)
        return True
    finally:
        try:
            os.rmdir(guard)
        except OSError:
            pass


def acquire(path, run_id, controller=None, ttl=DEFAULT_TTL, timeout=0.0, node_pid=None,
            break_lease=None, clock=time.monotonic, sleep=time.sleep, now_fn=time.time):
    """Take the lease at ``path`` for ``run_id``, waiting up to ``timeout`` seconds for a live holder.

    ``break_lease``: a run id (or ``"*"``) whose live lease the operator asked to break.
    Returns ``{acquired, waited, generation, holder, took_over, took_over_reason, already_held}``.
    Raises LeaseBusy when a live holder keeps it past ``timeout``.
    """
    started = clock()
    parent = os.path.dirname(path.rstrip("/"))
    if parent and not os.path.isdir(parent):
        try:
            os.makedirs(parent, 0o755)
        except FileExistsError:
            pass    # another run made it in the meantime
    took_over = None
    took_reason = None
    delay = 0.1
    while True:
        record = new_record(run_id, controller, ttl, now_fn(), node_pid)
        if _try_create(path, record):
            return {"acquired": True, "already_held": False, "waited": round(clock() - started, 3),
                    "generation": bump_generation(path), "holder": record,
                    "took_over": took_over, "took_over_reason": took_reason}
        holder = read_holder(path)
        state, reason = judge(holder, run_id, now_fn(), path=path)
        if state == MINE:
            renewed = renew(path, run_id, ttl, node_pid=node_pid, now=now_fn())
            return {"acquired": True, "already_held": True, "waited": round(clock() - started, 3),
                    "generation": read_generation(path), "holder": renewed, "took_over": took_over,
                    "took_over_reason": took_reason}
        broken = bool(break_lease) and (break_lease == "*" or (holder is not None and break_lease == holder.get("owner")))
        if state in (EXPIRED, DEAD) or broken:
            if state not in (EXPIRED, DEAD):
                reason = "the operator broke it (sglang_lease_break=%s)" % break_lease
            if _take_over(path, holder, record, now_fn, force=state not in (EXPIRED, DEAD)):
                return {"acquired": True, "already_held": False, "waited": round(clock() - started, 3),
                        "generation": bump_generation(path), "holder": record,
                        "took_over": holder if holder is not None else {"owner": None, "note": "no holder record"},
                        "took_over_reason": reason}
            # Another run holds the takeover guard (and is taking the lease over right now): look again shortly.
        left = timeout - (clock() - started)
        if left <= 0:
            raise LeaseBusy(
                "another redeploy holds the node lease %s: %s (%s). Waited %.1f s (sglang_lock_timeout=%s). Wait for it, "
                "or, if that run is gone, break the lease with -e sglang_lease_break=%s (playbook "
                "gpufleet.sglang.break_lease shows the holder)" % (
                    path, describe(holder), reason, clock() - started, _fmt(timeout), (holder or {}).get("owner") or "'*'"),
                holder=holder, waited=round(clock() - started, 3))
        sleep(min(delay, left))
        delay = min(delay * 1.5, 2.0)


def _fmt(value):
    value = float(value)
    return ("%d" % value) if value.is_integer() else ("%g" % value)


def renew(path, run_id, ttl=None, node_pid=None, now=None, clear_node_pid=False):
    """Push the deadline of the lease ``run_id`` holds; returns the new record. Raises LeaseLost."""
    holder = read_holder(path)
    if holder is None or holder.get("owner") != run_id:
        raise LeaseLost("the node lease %s is no longer held by run %s (now: %s); another run took it over, so this run "
                        "stops here" % (path, run_id, describe(holder) if holder else "nobody"))
    now = time.time() if now is None else now
    ttl = max(MIN_TTL, float(ttl if ttl is not None else holder.get("ttl") or DEFAULT_TTL))
    holder.update(renewed_at=now, expires_at=now + ttl, ttl=ttl)
    if node_pid:
        holder.update(node_pid=int(node_pid), node_pid_start=process_start(node_pid))
    elif clear_node_pid:
        holder.update(node_pid=None, node_pid_start=None)
    _write_holder(path, holder)
    return holder


def release(path, run_id, force=False):
    """Give the lease back. Returns ``(released, holder_seen)``; raises LeaseLost when another run holds it and not ``force``."""
    if not os.path.isdir(path):
        return False, None
    holder = read_holder(path)
    if holder and holder.get("owner") != run_id and not force:
        raise LeaseLost("the node lease %s is held by %s, not by run %s; break it with force (sglang_lease_break) if that "
                        "run is gone" % (path, describe(holder), run_id))
    trash = "%s.released-%d-%d" % (path.rstrip("/"), os.getpid(), int(time.time() * 1000))
    try:
        os.rename(path, trash)
    except OSError:
        return False, holder
    shutil.rmtree(trash, ignore_errors=True)
    return True, holder


class KeepAlive(object):
    """Renew a held lease every ``ttl / 3`` seconds while a module works, and name the module's PID as
    the process acting for the holder, so that no other run takes the lease over while it works.

    Use as a context manager. Renewal errors are kept in ``lost`` (a LeaseLost) for the caller to check
    at its next step; the thread never raises.
    """

    def __init__(self, path, run_id, ttl=None):
        self.path = path
        self.run_id = run_id
        self.ttl = ttl
        self.lost = None
        self._stop = threading.Event()
        self._thread = None

    def check(self):
        if self.lost is not None:
            raise self.lost

    def beat(self):
        try:
            renew(self.path, self.run_id, self.ttl, node_pid=os.getpid())
        except LeaseLost as exc:
            self.lost = exc
        except OSError:
            pass    # a full disk for a moment: the next beat tries again

    def _loop(self, interval):
        while not self._stop.wait(interval):
            self.beat()

    def __enter__(self):
        if not self.path or not self.run_id:
            return self
        holder = read_holder(self.path) or {}
        ttl = float(self.ttl or holder.get("ttl") or DEFAULT_TTL)
        self.ttl = ttl
        self.beat()
        self._thread = threading.Thread(target=self._loop, args=(max(1.0, ttl / 3.0),))
        self._thread.daemon = True
        self._thread.start()
        return self

    def __exit__(self, *exc):
        if self._thread is not None:
            self._stop.set()
            self._thread.join(5)
            try:
                renew(self.path, self.run_id, self.ttl, clear_node_pid=True)
            except (LeaseLost, OSError):
                pass
        return False
