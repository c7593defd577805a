# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: run_report
short_description: Write the redeploy report (JSON and Markdown) on the controller
version_added: 0.1.0
description:
  - Adds host records to C(<path>.json) and rewrites C(<path>.md) from all of them, on the controller.
    A host that is already in the report has its record replaced; the others are kept, so a rolling
    run that writes after every batch never loses a row.
  - The format is the stable one of C(docs/report.md). C(redeploy.yml) calls it once per batch.
  - It is an action plugin that runs in the controller and executes no module on any host, so it costs
    no module round trip. Files are written atomically with mode 0640, the directory is made with 0750.
  - The rows are written as given. Mask secrets before (the C(gpufleet.sglang.sglang_mask) filter).
options:
  path:
    description: Report path on the controller without the extension; C(.json) and C(.md) are added.
    type: str
    required: true
  rows:
    description: Host records, each a dict with at least C(host) (see C(docs/report.md) for the keys).
    type: list
    elements: dict
    required: true
  title:
    description: Shown in the Markdown heading; the run id.
    type: str
    default: ""
  on_error:
    description:
      - V(fail) fails the task when the report cannot be written; V(warn) only warns and returns
        RV(report_error), so that a failed write never hides the outcome of a redeploy that already happened.
    type: str
    choices: [fail, warn]
    default: fail
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
    details: The report is written in check mode too; it is the record of the planned run, not a change to a host.
  diff_mode:
    support: none
  platform:
    platforms: posix
seealso:
  - plugin: gpufleet.sglang.sglang_mask
    plugin_type: filter
"""

EXAMPLES = r"""
- name: Add this batch's hosts to the run report
  gpufleet.sglang.run_report:
    path: "{{ lookup('ansible.builtin.env', 'HOME') }}/.gpufleet/reports/{{ sglang_run_id }}-redeploy"
    title: "{{ sglang_run_id }}"
    rows: "{{ ansible_play_batch | map('extract', hostvars, 'sglang_host_report') | select('defined') | list }}"
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
json_path:
  description: The JSON report.
  returned: success
  type: str
  sample: /home/ops/.gpufleet/reports/20261130T132900Z-1234-redeploy.json
markdown_path:
  description: The Markdown report.
  returned: success
  type: str
  sample: /home/ops/.gpufleet/reports/20261130T132900Z-1234-redeploy.md
report_error:
  description: Why the report could not be written (O(on_error=warn) only).
  returned: when the write failed and O(on_error=warn)
  type: str
hosts:
  description: Every host in the report now, in report order.
  returned: success
  type: list
  elements: str
  sample: [gpu-01, gpu-02]
"""
