# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: controller_facts
short_description: Name a redeploy run and identify its controller
version_added: 0.2.0
description:
  - Returns a run id (UTC time, the controller's PID and a random number) and the controller's identity, that is
    the host name, the PID and start time of the C(ansible-playbook) process, the boot id and the PID namespace.
  - The node lease records this identity, so that a later run on the same machine can prove the
    controller of an abandoned lease dead (its PID gone) and take the lease over at once, instead of
    waiting for the lease to expire.
  - It is an action plugin that runs in the controller and executes no module on any host.
  - With O(report_dir), it also checks that the run report can be written there, so that a run whose
    report cannot be written fails before any node is touched.
  - The result is also returned as the fact C(sglang_redeploy_run) (C(run_id), C(controller), C(report_dir)).
    Read it as C(ansible_facts['sglang_redeploy_run']) (with C(delegate_facts), of the host it was delegated to),
    not as a top-level variable, which ansible-core 2.20 deprecates.
options:
  run_id:
    description: Use this run id instead of a new one (a rerun that continues a named run).
    type: str
    default: ""
  report_dir:
    description: Controller directory of the run report to check (made later if missing; a probe file is created and removed).
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
"""

EXAMPLES = r"""
- name: Name this run (once, on the controller)
  gpufleet.sglang.controller_facts:
  register: sglang_controller
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
run_id:
  description: The run id.
  returned: always
  type: str
  sample: 20261201T101500Z-4242-0815
controller:
  description: C(host), C(pid), C(starttime) (clock ticks since boot), C(boot_id), C(pidns), C(user).
  returned: always
  type: dict
"""
