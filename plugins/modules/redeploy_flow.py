# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: redeploy_flow
short_description: The decisions of the redeploy flow, made on the controller
version_added: 0.3.0
description:
  - The role C(gpufleet.sglang.sglang_redeploy) orders the phases of a redeploy; every decision between them is made
    by this action plugin, in Python (C(module_utils/redeploy/flow.py), table-tested), never by a Jinja expression and
    never by reading a message's text. It runs in the controller and executes no module on any host.
  - V(layout) finds the host's multi-node group (hosts that share C(dist_init_addr) when C(nnodes) > 1), its node
    rank and whether its lease is always taken; V(members) lists the group's hosts and fails when this batch does not
    hold all of them; V(action) decides what the host or its group does from each rank's plan; V(pd) plans the
    prefill/decode rollout of the play and fails when it would pair incompatible servers; V(barrier) fails a rank
    when another rank of its group failed a checkpoint.
  - V(failure) tells which step failed and whether a rollback is needed, from the modules' codes (C(failed_step),
    C(reason), C(touched)); V(rollback_failed) classifies a failed rollback; V(settle) says what the rollback did,
    what the journal records and the host's last message; V(report) builds the host's row of the run report.
  - The group decisions read the other hosts' registered results C(sglang_redeploy_layout),
    C(sglang_redeploy_group) and C(sglang_server_preflight); register each decision's result under that name.
options:
  decision:
    description: Which decision to make.
    type: str
    required: true
    choices: [layout, members, action, pd, barrier, failure, rollback_failed, settle, report]
  args:
    description: With O(decision=layout), the server's args (C(sglang_server_args)).
    type: raw
  host_args:
    description: With O(decision=layout), the host's args (C(sglang_server_host_args)).
    type: raw
  checkpoint:
    description: With O(decision=barrier), the checkpoint.
    type: str
    choices: [preflight, teardown, launch, smoke]
  version:
    description: With O(decision=pd), the SGLang version whose prefill/decode rules apply.
    type: str
    default: 0.5.23
  results:
    description:
      - With O(decision=failure), the registered results C(router_drain), C(router_remove), C(replace), C(smoke),
        C(promote) and C(router_add) (each a dict, or null when the step did not run).
      - With O(decision=settle), C(replace).
    type: dict
    default: {}
  failed_result:
    description: With O(decision=failure) and O(decision=rollback_failed), C(ansible_failed_result).
    type: raw
  failed_task:
    description: With O(decision=failure), the failed task's name (the step when no registered result failed).
    type: str
  before_lease:
    description: With O(decision=failure), the failure was rescued outside the lease's block.
    type: bool
    default: false
  previous:
    description: With O(before_lease=true), the failure already told apart under the lease, if any.
    type: raw
  multinode:
    description: With O(decision=failure) and O(decision=settle), the host is a rank of a multi-node group.
    type: bool
    default: false
  failure:
    description: With O(decision=settle), the result of O(decision=failure).
    type: raw
  rollback:
    description: With O(decision=settle), C(status) and C(detail) of the role's rollback, when one ran.
    type: raw
  report:
    description:
      - With O(decision=report), what the host registered, C(host), C(run_id), C(check_mode), C(preflight),
        C(action), C(failure), C(replace), C(candidate_replace), C(promote), C(smoke), C(rollback_status) and
        C(rollback_detail) (docs/report.md).
    type: dict
    default: {}
  report_path:
    description: With O(decision=report), the report's path, for the host's last line.
    type: str
    default: ""
author:
  - gpufleet maintainers (@gpufleet)
extends_documentation_fragment:
  - action_common_attributes
  - action_common_attributes.flow
attributes:
  action:
    support: full
  async:
    support: none
  bypass_host_loop:
    support: none
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
seealso:
  - module: gpufleet.sglang.sglang_preflight
  - module: gpufleet.sglang.sglang_replace
  - module: gpufleet.sglang.run_report
"""

EXAMPLES = r"""
- name: Find this host's multi-node group
  gpufleet.sglang.redeploy_flow:
    decision: layout
    args: "{{ sglang_server_args }}"
    host_args: "{{ sglang_server_host_args | default({}) }}"
  register: sglang_redeploy_layout

- name: Decide what this host (or its group) does
  gpufleet.sglang.redeploy_flow:
    decision: action
  register: sglang_redeploy_decided

- name: Remember what failed, and decide whether to roll back
  gpufleet.sglang.redeploy_flow:
    decision: failure
    results:
      replace: "{{ sglang_server_replace | default(none) }}"
    failed_result: "{{ ansible_failed_result }}"
  register: sglang_redeploy_failure
"""

RETURN = r"""
group_key:
  description: With O(decision=layout), what names the host's group (its C(dist_init_addr), or the host).
  returned: decision=layout
  type: str
nnodes:
  description: With O(decision=layout), the group's size.
  returned: decision=layout
  type: int
rank:
  description: With O(decision=layout), the host's node rank.
  returned: decision=layout
  type: int
lease_acquire:
  description: With O(decision=layout), V(always) for a rank of a multi-node group, else V(if_needed).
  returned: decision=layout
  type: str
members:
  description: With O(decision=members), the hosts of the group in play order.
  returned: decision=members
  type: list
  elements: str
multinode:
  description: With O(decision=members), whether the group has more than one host.
  returned: decision=members
  type: bool
action:
  description: With O(decision=action), V(none), V(verify), V(weights), V(start) or V(restart).
  returned: decision=action
  type: str
pd_role:
  description: With O(decision=action), V(prefill), V(decode) or an empty string.
  returned: decision=action
  type: str
path:
  description:
    - With O(decision=action), how the host is redeployed, V(overlap) (the new server starts beside the old one, the
      router switches, then the old one stops) or V(in_place) (the old server stops first); C(sglang_redeploy_overlap).
  returned: decision=action
  type: str
path_why:
  description: With O(decision=action), why that path (the first condition that refused the overlap).
  returned: decision=action
  type: str
path_reasons:
  description: With O(decision=action), every condition that refused the overlap (empty for V(overlap)).
  returned: decision=action
  type: list
  elements: str
overlap:
  description: With O(decision=action), the preflight's facts about room for a second server (C(plan.overlap)).
  returned: decision=action
  type: dict
plan:
  description: With O(decision=pd), the rollout plan (C(order), C(steps), C(problems), C(notes), ...).
  returned: decision=pd
  type: dict
lines:
  description: With O(decision=pd), the plan in readable lines.
  returned: decision=pd
  type: list
  elements: str
step:
  description: With O(decision=failure), the step that failed.
  returned: decision=failure
  type: str
needs_rollback:
  description: With O(decision=failure), whether the known-good config must be brought back.
  returned: decision=failure
  type: bool
before_lease:
  description: With O(decision=failure), whether the failure came before the lease's block (nothing was touched).
  returned: decision=failure
  type: bool
status:
  description: With O(decision=rollback_failed), V(unavailable) or V(failed).
  returned: decision=rollback_failed
  type: str
outcome:
  description: With O(decision=settle), what the node journal records, V(rolled_back) or V(failed).
  returned: decision=settle
  type: str
message:
  description: With O(decision=settle), the host's failure message; with O(decision=failure), the failed task's.
  returned: decision=settle or decision=failure
  type: str
row:
  description: With O(decision=report), the host's row of the run report (docs/report.md).
  returned: decision=report
  type: dict
msg:
  description: With O(decision=report), the host's one line; with a refusal, why.
  returned: decision=report or on failure
  type: str
"""
