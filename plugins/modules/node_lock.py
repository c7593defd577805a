# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_lock
short_description: Take or release an exclusive per-node lock for a redeploy
version_added: 0.1.0
description:
  - Serialises redeploys of one node so that two runs (two shells, two AWX jobs) cannot interleave
    their teardown and launch steps.
  - The lock is a directory created atomically with C(mkdir) under O(path). A C(holder.json) inside it
    records the run id, the controller, the host and the time it was taken.
  - A run that finds the lock held waits up to O(timeout) seconds, then fails with a message naming
    the holder. A lock older than O(stale_after) seconds is considered abandoned (a controller that
    was killed before its C(always) section ran) and is taken over; the takeover is reported.
  - Releasing only removes a lock that this O(owner) holds, unless O(force=true).
  - C(<path>.generation), next to the lock and kept across releases, counts how many times the lock
    was taken. M(gpufleet.sglang.sglang_preflight) reads it, see its O(gpufleet.sglang.sglang_preflight#module:lock_path)
    option. A run that planned at generation N with the lock free and then takes it at N+1 knows that
    no other run held the lock in between, so its plan is still current.
options:
  path:
    description:
      - Lock directory. Its parent must exist or be creatable.
    type: path
    required: true
  state:
    description:
      - V(acquired) takes the lock (waiting for it), V(released) gives it back.
    type: str
    choices: [acquired, released]
    default: acquired
  owner:
    description:
      - Identifier of this run, for example the playbook's run id. Only the same owner can release the lock.
    type: str
    required: true
  timeout:
    description:
      - Seconds to wait for a held lock before failing. V(0) fails at once.
    type: float
    default: 0
  stale_after:
    description:
      - Age in seconds after which a held lock is taken over. V(0) disables takeover.
    type: float
    default: 7200
  force:
    description:
      - With O(state=released), remove the lock even when another owner holds it.
    type: bool
    default: false
author:
  - gpufleet maintainers (@gpufleet)
extends_documentation_fragment:
  - action_common_attributes
attributes:
  check_mode:
    support: full
    details: In check mode the lock is inspected but neither taken nor released.
  diff_mode:
    support: none
  platform:
    platforms: posix
notes:
  - The lock is advisory. Every playbook of this collection that changes a node takes it.
"""

EXAMPLES = r"""
- name: Take the redeploy lock (wait up to 10 minutes)
  gpufleet.sglang.node_lock:
    path: /run/lock/gpufleet-sglang-main
    owner: "{{ sglang_run_id }}"
    timeout: 600

- name: Release the redeploy lock
  gpufleet.sglang.node_lock:
    path: /run/lock/gpufleet-sglang-main
    owner: "{{ sglang_run_id }}"
    state: released
"""

RETURN = r"""
acquired:
  description: Whether this run holds the lock after the task.
  returned: always
  type: bool
  sample: true
holder:
  description: The holder record found (before a release) or written (after an acquire).
  returned: always
  type: dict
  sample: {"owner": "20261130T132900Z-1234", "host": "gpu-01", "pid": 4242, "since": 1764509340.1}
waited:
  description: Seconds spent waiting for the lock.
  returned: always
  type: float
  sample: 0.0
generation:
  description:
    - How many times the lock has been taken, this acquisition included (after an acquire); the
      current count otherwise. V(0) when it was never taken.
  returned: always
  type: int
  sample: 42
stale_takeover:
  description: The holder record of an abandoned lock that was taken over, when that happened.
  returned: when a stale lock was taken over
  type: dict
"""

import json
import os
import shutil
import socket
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.sglang.plugins.module_utils.lock import HOLDER, bump_generation, read_generation, read_holder

# A takeover guard older than this is left over from a killed run.
GUARD_STALE_S = 60.0


def try_acquire(path, record):
    """Create the lock directory atomically; return True when this call created it."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        return False
    tmp = os.path.join(path, HOLDER + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(record, fh)
    os.replace(tmp, os.path.join(path, HOLDER))
    return True


def _since(holder):
    try:
        return float((holder or {}).get("since"))
    except (TypeError, ValueError):
        return None


def lock_age(path, holder):
    """Seconds since the lock was taken: the holder's ``since``, else the directory's mtime; 0 when gone."""
    since = _since(holder)
    if since is None:
        try:
            since = os.stat(path).st_mtime
        except OSError:
            return 0.0
    return max(0.0, time.time() - since)


def describe(holder):
    """One line naming the holder: run id, host, pid, controller (when known) and age."""
    if not holder:
        return "an unknown holder (no holder.json yet)"
    since = _since(holder)
    extra = ", controller %s" % holder["controller"] if holder.get("controller") else ""
    age = (" since %.0f s ago" % max(0.0, time.time() - since)) if since is not None else ""
    return "run %s on %s (pid %s%s)%s" % (holder.get("owner"), holder.get("host", "?"), holder.get("pid"), extra, age)


def take_over(path, seen, stale_after):
    """Remove the abandoned lock ``path`` whose holder record was ``seen``; True when it was removed.

    Takeovers are serialised by a guard directory next to the lock, and the holder is read again
    under the guard: a waiter that saw the same stale lock a moment later must not remove the
    fresh lock that the first waiter has taken since. The lock is renamed away before it is deleted,
    so ``path`` never exists half-removed.
    """
    base = path.rstrip("/")
    guard = base + ".takeover"
    try:
        os.mkdir(guard, 0o700)
    except FileExistsError:
        # Another waiter is taking over right now (milliseconds); a guard left by a killed run is cleared.
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
        if holder != seen or not os.path.isdir(path) or lock_age(path, holder) <= stale_after:
            return False
        trash = "%s.stale-%d-%d" % (base, os.getpid(), int(time.time() * 1000))
        try:
            os.rename(path, trash)
        except OSError:
            return False
        shutil.rmtree(trash, ignore_errors=True)
        return True
    finally:
        try:
            os.rmdir(guard)
        except OSError:
            pass


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            state=dict(type="str", choices=["acquired", "released"], default="acquired"),
            owner=dict(type="str", required=True),
            timeout=dict(type="float", default=0),
            stale_after=dict(type="float", default=7200),
            force=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    p = module.params
    path = p["path"]
    start = time.monotonic()

    if p["state"] == "released":
        holder = read_holder(path)
        if not os.path.isdir(path):
            module.exit_json(changed=False, acquired=False, holder={}, waited=0.0, generation=read_generation(path))
        if holder and holder.get("owner") != p["owner"] and not p["force"]:
            module.fail_json(msg="Lock %s is held by %s, not by %s; set force=true to remove it anyway" % (path, describe(holder), p["owner"]),
                             acquired=False, holder=holder, waited=0.0, generation=read_generation(path))
        if not module.check_mode:
            shutil.rmtree(path, ignore_errors=True)
        module.exit_json(changed=True, acquired=False, holder=holder or {}, waited=0.0, generation=read_generation(path))

    record = dict(owner=p["owner"], host=socket.gethostname(), pid=os.getppid(), since=time.time(),
                  controller=os.environ.get("GPUFLEET_CONTROLLER", ""))
    holder = read_holder(path)
    if holder and holder.get("owner") == p["owner"]:
        module.exit_json(changed=False, acquired=True, holder=holder, waited=0.0, generation=read_generation(path))
    if module.check_mode:
        free = not os.path.isdir(path) or (p["stale_after"] > 0 and lock_age(path, holder) > p["stale_after"])
        module.exit_json(changed=free, acquired=False, holder=holder or {}, waited=0.0, generation=read_generation(path))

    parent = os.path.dirname(path.rstrip("/"))
    if parent and not os.path.isdir(parent):
        os.makedirs(parent, 0o755, exist_ok=True)

    deadline = start + max(0.0, p["timeout"])
    delay = 0.2
    stale = None
    while True:
        if try_acquire(path, record):
            break
        holder = read_holder(path)
        if p["stale_after"] > 0 and lock_age(path, holder) > p["stale_after"] and take_over(path, holder, p["stale_after"]):
            stale = holder or {}
            continue
        left = deadline - time.monotonic()
        if left <= 0:
            module.fail_json(
                msg="Another redeploy holds the node lock %s: %s. Waited %.1f s (timeout=%s). "
                    "Wait for it to finish, or if it is dead, release it with force=true." % (
                        path, describe(holder), time.monotonic() - start, p["timeout"]),
                acquired=False, holder=holder or {}, waited=round(time.monotonic() - start, 3), generation=read_generation(path))
        time.sleep(min(delay, left))
        delay = min(delay * 1.5, 2.0)

    # Counted under the lock: only the holder writes the counter.
    result = dict(changed=True, acquired=True, holder=record, waited=round(time.monotonic() - start, 3), generation=bump_generation(path))
    if stale is not None:
        result["stale_takeover"] = stale
        module.warn("Took over an abandoned lock %s from %s" % (path, describe(stale)))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
