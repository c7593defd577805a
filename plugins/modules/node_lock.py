# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_lock
short_description: Take, release or break the per-node redeploy lease
version_added: 0.1.0
description:
  - Serialises the changes of one node (two shells, two AWX jobs) with the same lease the redeploy takes
    in M(gpufleet.sglang.sglang_preflight). The lease is a directory created atomically with C(mkdir) under
    O(path); C(holder.json) inside it names the run (O(owner)), the controller, when it was taken and its
    deadline (C(expires_at)), which the holder's modules renew while they work.
  - A run that finds the lease held waits up to O(timeout) seconds for a live holder, then fails naming it.
    It takes over at once a lease whose deadline passed with nothing working for it on the node, or whose
    controller ran on this machine and is gone (the takeover is reported in RV(took_over)).
  - Releasing only removes a lease that O(owner) holds, unless O(force=true). O(state=broken) removes a
    lease whatever holds it, and returns the holder (the C(break_lease) playbook).
  - C(<path>.generation), next to the lease and kept across releases, counts how many times it was taken.
options:
  path:
    description:
      - Lease directory. Its parent is created when missing.
    type: path
    required: true
  state:
    description:
      - V(acquired) takes the lease (waiting for it), V(released) gives it back, V(broken) removes it whoever
        holds it, V(inspected) only reports it.
    type: str
    choices: [acquired, released, broken, inspected]
    default: acquired
  owner:
    description:
      - Identifier of this run, for example the playbook's run id. Only the same owner can release the lease.
    type: str
    required: true
  timeout:
    description:
      - Seconds to wait for a live holder before failing. V(0) fails at once.
    type: float
    default: 0
  ttl:
    description:
      - Seconds the lease lives without renewal (at least 30).
    type: float
    default: 300
  controller:
    description:
      - The controller's identity as the C(gpufleet.sglang.controller_facts) action returns it, so that a later run
        on the same machine can prove this run's controller dead.
    type: dict
    default: {}
  force:
    description:
      - With O(state=released), remove the lease even when another owner holds it.
    type: bool
    default: false
author:
  - gpufleet maintainers (@gpufleet)
extends_documentation_fragment:
  - action_common_attributes
attributes:
  check_mode:
    support: full
    details: In check mode the lease is inspected but neither taken nor released.
  diff_mode:
    support: none
  platform:
    platforms: posix
notes:
  - The lease is advisory. Every playbook of this collection that changes a node takes it.
"""

EXAMPLES = r"""
- name: Take the redeploy lease (wait up to 10 minutes)
  gpufleet.sglang.node_lock:
    path: /run/lock/gpufleet-sglang-main.lock
    owner: "{{ sglang_run_id }}"
    timeout: 600

- name: Release the redeploy lease
  gpufleet.sglang.node_lock:
    path: /run/lock/gpufleet-sglang-main.lock
    owner: "{{ sglang_run_id }}"
    state: released
"""

RETURN = r"""
acquired:
  description: Whether this run holds the lease after the task.
  returned: always
  type: bool
  sample: true
holder:
  description: The holder record found (before a release or break) or written (after an acquire).
  returned: always
  type: dict
  sample: {"owner": "20261130T132900Z-1234-0042", "controller": {"host": "ctl", "pid": 4242}, "expires_at": 1764509640.1}
state:
  description: The lease's state before the task (free, mine, live, expired, dead) and why.
  returned: always
  type: dict
waited:
  description: Seconds spent waiting for the lease.
  returned: always
  type: float
  sample: 0.0
generation:
  description: How many times the lease has been taken (this acquisition included, after an acquire).
  returned: always
  type: int
  sample: 42
took_over:
  description: The holder record of a lease that was taken over (expired, or its controller gone), when that happened.
  returned: when a lease was taken over
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import lease as lease_mod


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            state=dict(type="str", choices=["acquired", "released", "broken", "inspected"], default="acquired"),
            owner=dict(type="str", required=True),
            timeout=dict(type="float", default=0),
            ttl=dict(type="float", default=300),
            controller=dict(type="dict", default={}),
            force=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    p = module.params
    path = p["path"]
    if p["ttl"] < lease_mod.MIN_TTL:
        module.fail_json(msg="ttl must be at least %d seconds, got %s" % (lease_mod.MIN_TTL, p["ttl"]))
    if p["timeout"] < 0:
        module.fail_json(msg="timeout must be 0 or more seconds, got %s" % p["timeout"])
    seen = lease_mod.inspect(path, p["owner"])
    state = {"state": seen["state"], "reason": seen["reason"]}
    base = dict(changed=False, acquired=seen["state"] == lease_mod.MINE, holder=seen["holder"], state=state, waited=0.0,
                generation=seen["generation"])
    if p["state"] == "inspected":
        module.exit_json(**base)
    if module.check_mode:
        # What the task would change: take a free (or expired/dead) lease, or remove one.
        if p["state"] == "acquired":
            base["changed"] = seen["state"] in (lease_mod.FREE, lease_mod.EXPIRED, lease_mod.DEAD)
        else:
            base["changed"] = seen["held"] and (p["state"] == "broken" or p["force"] or seen["state"] == lease_mod.MINE)
        module.exit_json(**base)
    if p["state"] in ("released", "broken"):
        try:
            released, holder = lease_mod.release(path, p["owner"], force=p["force"] or p["state"] == "broken")
        except lease_mod.LeaseLost as exc:
            module.fail_json(msg="%s (set force=true to remove it anyway)" % exc, **base)
        base.update(changed=released, acquired=False, holder=holder or {}, generation=lease_mod.read_generation(path))
        if released and p["state"] == "broken" and holder and holder.get("owner") != p["owner"]:
            module.warn("broke the node lease %s of %s" % (path, lease_mod.describe(holder)))
        module.exit_json(**base)
    try:
        got = lease_mod.acquire(path, p["owner"], controller=p["controller"], ttl=p["ttl"], timeout=p["timeout"])
    except lease_mod.LeaseBusy as exc:
        base.update(holder=exc.holder, waited=exc.waited)
        module.fail_json(msg=exc.msg, **base)
    base.update(changed=not got["already_held"], acquired=True, holder=got["holder"], waited=got["waited"],
                generation=got["generation"])
    if got["took_over"]:
        base["took_over"] = got["took_over"]
        module.warn("took over the node lease %s from %s: %s" % (path, lease_mod.describe(got["took_over"]), got["took_over_reason"]))
    module.exit_json(**base)


if __name__ == "__main__":
    main()
