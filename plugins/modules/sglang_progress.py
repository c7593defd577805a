# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_progress
short_description: Where a running redeploy stands on the node (journal step, server log, GPU holders), or that it ended
version_added: 0.2.0
description:
  - Waits at most O(wait) seconds for the Ansible async job O(jid) to finish. When it has, it returns RV(job) V(finished)
    and nothing else; the caller reads the job's result with C(ansible.builtin.async_status). It changes nothing on the
    node.
  - When it has not, it reads the node journal's step (C(<state_dir>/journal.json)), the last line of the server's log (secret values
    masked) and the processes that have a target GPU's device file open (from C(/proc); nvidia-smi is never run).
  - The C(sglang_replace) action runs it between its polls of the replace job, to print one progress line per host
    every C(progress_interval) seconds (docs/user-guide.md, "Progress while the server loads"); it is not meant to
    be called from a playbook, though nothing stops that.
options:
  jid:
    description: The async job to wait for (the C(ansible_job_id) of the job that runs the long module); none to only read.
    type: str
  async_dir:
    description: Where the async job files are (C(async_dir) of the shell plugin), expanded on the node.
    type: path
    default: ~/.ansible_async
  wait:
    description: Seconds to wait for the job to finish before reading the node; returns as soon as it finishes.
    type: float
    default: 0
  journal:
    description: The node journal's path (C(<state_dir>/journal.json)).
    type: path
  log_file:
    description: The server's log file; its last non-empty line is returned.
    type: path
  unit:
    description: With no O(log_file), the systemd unit whose last journald line is returned (C(journalctl -u UNIT -n 1)).
    type: str
  gpus:
    description: The target GPUs (indices); the processes that have one of their device files open are returned.
    type: list
    elements: str
    default: []
  device_paths:
    description: The GPU device files, as fnmatch globs (default C(/dev/nvidia*)).
    type: list
    elements: str
    default: []
  secrets:
    description: Secret values (the API key, secret args and env values) masked in the log line and the step detail.
    type: list
    elements: str
    default: []
author:
  - gpufleet maintainers (@gpufleet)
extends_documentation_fragment:
  - action_common_attributes
attributes:
  check_mode:
    support: full
    details: It only reads.
  diff_mode:
    support: none
  platform:
    platforms: posix
seealso:
  - module: gpufleet.sglang.sglang_replace
"""

EXAMPLES = r"""
- name: Where the redeploy stands
  gpufleet.sglang.sglang_progress:
    journal: /var/lib/sglang/main/journal.json
    log_file: /var/log/sglang/main.log
    gpus: [0, 1]
"""

RETURN = r"""
job:
  description: V(running), V(finished) (read its result with C(async_status)), or V(none) without O(jid). A missing job
    fails.
  returned: always
  type: str
step:
  description: The journal's step (null without a journal).
  returned: when the job has not finished
  type: str
step_s:
  description: Seconds since the journal reached that step (node clock).
  returned: when the job has not finished
  type: float
detail:
  description: The journal's detail of the step, secret values masked.
  returned: when the job has not finished
  type: str
log:
  description: The last non-empty line of the server's log, secret values masked, at most 200 characters.
  returned: when the job has not finished
  type: str
gpu_holders:
  description: C(pid), C(name), C(gpus) of each process with a target GPU's device file open.
  returned: when the job has not finished
  type: list
  elements: dict
"""

import shutil
import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import progress

JOURNALCTL_TIMEOUT_S = 5


def _unit_line(unit, secrets):
    journalctl = shutil.which("journalctl")
    if not journalctl:
        return None
    try:
        # subprocess for its timeout (run_command has none); argv list, never a shell.
        out = subprocess.run([journalctl, "-u", unit, "-n", "1", "--no-pager", "-o", "cat"], capture_output=True,  # pylint: disable=ansible-bad-function
                             text=True, timeout=JOURNALCTL_TIMEOUT_S, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return progress.last_line(out, secrets)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            jid=dict(type="str"),
            async_dir=dict(type="path", default="~/.ansible_async"),
            wait=dict(type="float", default=0),
            journal=dict(type="path"),
            log_file=dict(type="path"),
            unit=dict(type="str"),
            gpus=dict(type="list", elements="str", default=[]),
            device_paths=dict(type="list", elements="str", default=[]),
            secrets=dict(type="list", elements="str", default=[], no_log=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p["wait"] < 0:
        module.fail_json(msg="wait must be 0 or more seconds, got %s" % p["wait"])
    secrets = [s for s in p["secrets"] if s]
    job = progress.wait_job(p["async_dir"], p["jid"], p["wait"]) if p["jid"] else "none"
    if job == "missing":
        module.fail_json(msg="could not find async job %s in %s" % (p["jid"], p["async_dir"]), job=job)
    if job == "finished":
        # The job has ended: the action reads its result with async_status, as for any async job (a module returns
        # its result through exit_json only, never by printing another module's).
        module.exit_json(changed=False, job=job)
    node = progress.read(p["journal"], p["log_file"], p["gpus"], p["device_paths"], secrets)
    if node["log"] is None and p["unit"] and not p["log_file"]:
        node["log"] = _unit_line(p["unit"], secrets)
    module.exit_json(changed=False, job=job, **node)


if __name__ == "__main__":
    main()
