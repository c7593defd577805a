# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_textfile
short_description: Write the node's last redeploy as a Prometheus node_exporter textfile
version_added: 0.3.0
description:
  - Writes the metrics of the last redeploy of a server on this node to O(path), in Prometheus' text exposition
    format, for node_exporter's textfile collector (C(--collector.textfile.directory)).
  - "Metrics (every one labelled C(server)): C(sglang_redeploy_last_timestamp_seconds), C(sglang_redeploy_last_info)
    (labels C(run_id), C(host)), C(sglang_redeploy_last_status) (label C(status), 1 for the outcome and 0 for the
    other ones), C(sglang_redeploy_last_mode) (label C(mode): C(restart), C(weights), C(none)),
    C(sglang_redeploy_last_outage_seconds), C(sglang_redeploy_last_tokens_per_second),
    C(sglang_redeploy_last_accept_length) and C(sglang_redeploy_known_good_age_seconds). A figure that is not known
    (no smoke gate ran, nothing was replaced, never promoted) is left out, never written as 0."
  - The file is written atomically (a temporary file in the same directory that the collector skips, fsync, mode
    0644, rename), so a scrape never reads half a file. An unchanged content leaves the file alone.
  - C(redeploy.yml) calls it at the end of every host's turn when C(sglang_textfile_path) is set (not in check mode).
options:
  path:
    description: The textfile; an absolute path ending in C(.prom), in a directory that exists.
    type: path
    required: true
  server:
    description: Server instance name (the C(server) label).
    type: str
    default: main
  host:
    description: Inventory hostname (a label of C(sglang_redeploy_last_info)).
    type: str
    default: ""
  run_id:
    description: The redeploy run id (a label of C(sglang_redeploy_last_info)).
    type: str
    default: ""
  status:
    description: The report's status of this host.
    type: str
    required: true
    choices: [deployed, unchanged, rolled_back, failed]
  mode:
    description: How the server was changed (the report's C(mode)); null when nothing was changed.
    type: str
    choices: [restart, weights]
  outage_s:
    description: Seconds the server did not serve; null when unknown.
    type: float
  tokens_per_s:
    description: The smoke gate's output tokens per second; null when no gate ran.
    type: float
  accept_length:
    description: The smoke gate's speculative accept length; null when unknown.
    type: float
  config_dir:
    description: The server's config directory; the age of C(<config_dir>/known-good) is exported when it exists.
    type: path
  on_error:
    description:
      - V(fail) fails the task when the file cannot be written; V(warn) only warns and returns RV(textfile_error),
        so that a missing directory never hides the outcome of a redeploy that already happened.
    type: str
    choices: [fail, warn]
    default: fail
author:
  - gpufleet maintainers (@gpufleet)
extends_documentation_fragment:
  - action_common_attributes
  - gpufleet.sglang.option_labels
attributes:
  check_mode:
    support: full
    details: In check mode the content is rendered and returned, nothing is written.
  diff_mode:
    support: none
  platform:
    platforms: posix
seealso:
  - name: node_exporter textfile collector
    description: How node_exporter reads C(*.prom) files.
    link: https://github.com/prometheus/node_exporter#textfile-collector
"""

EXAMPLES = r"""
- name: Export the last redeploy to node_exporter
  gpufleet.sglang.sglang_textfile:
    path: /var/lib/node_exporter/textfile_collector/sglang-main.prom
    server: main
    run_id: "{{ sglang_redeploy_run_id }}"
    status: deployed
    mode: restart
    outage_s: 41.2
    tokens_per_s: 812.5
    accept_length: 3.1
    config_dir: /etc/sglang/main
"""

RETURN = r"""
path:
  description: The textfile.
  returned: always
  type: str
  sample: /var/lib/node_exporter/textfile_collector/sglang-main.prom
content:
  description: What the file holds (or would hold, in check mode).
  returned: success
  type: str
textfile_error:
  description: Why the file could not be written (O(on_error=warn) only).
  returned: when the write failed and O(on_error=warn)
  type: str
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import textfile as textfile_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.common.names import ARGSPEC, Names


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            server=dict(type="str", default="main"),
            host=dict(type="str", default=""),
            run_id=dict(type="str", default=""),
            status=dict(type="str", required=True, choices=list(textfile_mod.STATUSES)),
            mode=dict(type="str", choices=["restart", "weights"]),
            outage_s=dict(type="float"),
            tokens_per_s=dict(type="float", no_log=False),      # a figure, not a token
            accept_length=dict(type="float"),
            config_dir=dict(type="path"),
            on_error=dict(type="str", default="fail", choices=["fail", "warn"]),
            **ARGSPEC
        ),
        supports_check_mode=True,
    )
    p = module.params
    label = Names.of_module(module).of("path")
    now = time.time()
    record = dict(server=p["server"], host=p["host"], run_id=p["run_id"], timestamp=now, status=p["status"],
                  mode=p["mode"], outage_s=p["outage_s"], tokens_per_s=p["tokens_per_s"], accept_length=p["accept_length"],
                  known_good_age_s=textfile_mod.known_good_age(p["config_dir"], now) if p["config_dir"] else None)
    try:
        problem = textfile_mod.check_path(p["path"])
        if problem:
            raise textfile_mod.TextfileError("%s %s" % (label, problem))
        content = textfile_mod.render(record)
        changed = True if module.check_mode else textfile_mod.write(p["path"], content, label=label)
    except textfile_mod.TextfileError as exc:
        if p["on_error"] == "warn":
            module.warn(str(exc))
            module.exit_json(changed=False, path=p["path"], textfile_error=str(exc))
        module.fail_json(msg=str(exc), path=p["path"])
    module.exit_json(changed=changed, path=p["path"], content=content)


if __name__ == "__main__":
    main()
