# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_prefetch
short_description: Warm a checkpoint into the page cache while the old server still serves
version_added: 0.3.0
description:
  - Reads the safetensors shards of the checkpoints in O(paths) (the files SGLang will load, as the preflight's
    checkpoint check lists them) into the page cache, so that the new server loads them from RAM rather than from
    disk. C(redeploy.yml) runs it after the preflight and before the router drain and the teardown, while the old
    server still serves.
  - The reads run at idle priority (nice 19 and the idle I/O class through C(ioprio_set(2))); where the idle I/O class
    is refused, they go on at nice 19 and the result says so (RV(prefetch.priority_note)).
  - "Budget: C(MemAvailable) of C(/proc/meminfo) less a reserve (the larger of O(reserve_gb) and O(reserve_percent)
    of C(MemTotal)), capped at O(max_gb). C(MemAvailable) never counts the old server's memory, so the reads only
    take memory that is free or reclaimable cache. The reads stop at the budget and at O(timeout) seconds."
  - Files whose pages are all resident already (measured with C(mincore(2))) are skipped and do not count against
    the budget; so are the resident chunks of a partly resident file. The result gives the resident share before
    and after, in bytes and percent.
  - Nothing on the node changes but the page cache; the task never reports changed, and does nothing in check mode.
options:
  paths:
    description: Checkpoint directories (the model, the draft model); their safetensors shards are read, in order.
    type: list
    elements: path
    required: true
  mode:
    description:
      - V(auto) reads up to the budget and the time limit; V(on) does the same, and warns when the checkpoint could
        not be warmed entirely (no budget, the budget or the time limit reached, a file that could not be read, no
        idle I/O class); V(off) reads nothing.
    type: str
    choices: [auto, 'on', 'off']
    default: auto
  reserve_gb:
    description: GiB of MemAvailable never used by the reads.
    type: float
    default: 0
  reserve_percent:
    description: Percent of MemTotal never used by the reads; the larger of this and O(reserve_gb) is the reserve.
    type: float
    default: 10
  max_gb:
    description: At most this many GiB are read; V(0) no cap beyond the budget.
    type: float
    default: 0
  timeout:
    description: Seconds after which no further chunk is read.
    type: float
    default: 600
author:
  - gpufleet maintainers (@gpufleet)
extends_documentation_fragment:
  - action_common_attributes
  - gpufleet.sglang.option_labels
attributes:
  check_mode:
    support: full
    details: In check mode nothing is read; the result says it was skipped.
  diff_mode:
    support: none
  platform:
    platforms: posix
    details: Linux (C(/proc/meminfo), C(mincore(2)), C(ioprio_set(2))).
"""

EXAMPLES = r"""
- name: Warm the new checkpoint while the old server serves
  gpufleet.sglang.sglang_prefetch:
    paths: [/models/llama-3.1-70b]
    mode: auto
    reserve_percent: 10
    timeout: 600
"""

RETURN = r"""
prefetch:
  description: What was read.
  returned: always
  type: dict
  contains:
    files:
      description: Number of shards.
      type: int
    bytes:
      description: Their size in bytes.
      type: int
    bytes_read:
      description: Bytes read into the page cache by this run.
      type: int
    resident_before:
      description: Resident bytes and percent of the shards before the reads.
      type: dict
    resident_after:
      description: Resident bytes and percent after the reads.
      type: dict
    seconds:
      description: Seconds the reads took.
      type: float
    stopped:
      description: Why the reads stopped short (V(budget), V(timeout)); null when every shard is resident.
      type: str
    skipped:
      description: The shards that were not read, each with C(path) and C(why) (V(resident), V(budget), V(timeout)).
      type: list
      elements: dict
    skipped_why:
      description: Why nothing was read at all (V(off), check mode, no budget); null otherwise.
      type: str
    budget_bytes:
      description: The memory budget.
      type: int
    reserve_bytes:
      description: The reserve kept out of the budget.
      type: int
    priority_note:
      description: Why the reads did not run in the idle I/O class; null when they did.
      type: str
    line:
      description: One line for the play output and the report.
      type: str
      sample: "prefetch: 4 file(s), 16.0 MiB, resident 25.0% -> 100.0%, read 12.0 MiB in 0.1 s, 1 file(s) already resident"
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.sglang.plugins.module_utils.server import prefetch as pf
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import checkpoint as ckpt
from ansible_collections.gpufleet.sglang.plugins.module_utils.common.names import ARGSPEC, Names


def shard_files(paths):
    """The shards of every checkpoint directory, each once, in order; and the problems (a broken index)."""
    files, problems = [], []
    for directory in paths:
        try:
            found, _index = ckpt.weight_files(directory)
        except ckpt.CheckpointError as exc:
            problems.append(str(exc))
            continue
        files.extend(f for f in found if f not in files)
    return files, problems


def main():
    module = AnsibleModule(
        argument_spec=dict(
            paths=dict(type="list", elements="path", required=True),
            mode=dict(type="str", default="auto", choices=["auto", "on", "off"]),
            reserve_gb=dict(type="float", default=0),
            reserve_percent=dict(type="float", default=10),
            max_gb=dict(type="float", default=0),
            timeout=dict(type="float", default=600),
            **ARGSPEC
        ),
        supports_check_mode=True,
    )
    p = module.params
    names = Names.of_module(module)
    for name in ("reserve_gb", "max_gb", "timeout"):
        if p[name] < 0:
            module.fail_json(msg="%s: %s is negative; give 0 or more" % (names.of(name), p[name]))
    if not 0 <= p["reserve_percent"] <= 100:
        module.fail_json(msg="%s: %s is not between 0 and 100; give a percent of MemTotal"
                             % (names.of("reserve_percent"), p["reserve_percent"]))
    result = {"files": 0, "bytes": 0, "bytes_read": 0, "resident_before": {"bytes": 0, "percent": 0.0},
              "resident_after": {"bytes": 0, "percent": 0.0}, "seconds": 0.0, "stopped": None, "skipped": [],
              "errors": [], "skipped_why": None, "budget_bytes": 0, "reserve_bytes": 0, "priority_note": None,
              "timeout": p["timeout"]}
    warn = p["mode"] == "on"
    if p["mode"] == "off":
        result["skipped_why"] = "%s is off" % names.of("mode")
    elif module.check_mode:
        result["skipped_why"] = "check mode"
    else:
        files, problems = shard_files(p["paths"])
        try:
            room, reserve = pf.budget(pf.read_meminfo(), p["reserve_gb"], p["reserve_percent"], p["max_gb"])
        except (OSError, ValueError) as exc:
            room, reserve = 0, 0
            problems.append("the memory budget is unknown: %s" % exc)
        result.update(budget_bytes=room, reserve_bytes=reserve, errors=problems)
        if not files:
            result["skipped_why"] = "no safetensors shards in %s" % ", ".join(p["paths"])
        elif room <= 0:
            result["skipped_why"] = "no memory budget (MemAvailable less the reserve of %.1f GiB is 0)" % (reserve / float(pf.GIB))
        else:
            nice, io_ok, why = pf.idle_priority()
            if not io_ok:
                result["priority_note"] = "read at nice %d, not in the idle I/O class (%s)" % (nice, why)
            done = pf.prefetch(files, room, p["timeout"])
            done.pop("per_file", None)
            done["errors"] = problems + done["errors"]
            result.update(done)
        if warn:
            if result["skipped_why"]:
                module.warn("%s on: nothing was read: %s" % (names.of("mode"), result["skipped_why"]))
            elif result["stopped"]:
                module.warn("%s on: stopped at the %s with %.1f%% of the checkpoint resident; raise %s"
                            % (names.of("mode"), "memory budget" if result["stopped"] == "budget" else "time limit",
                               result["resident_after"]["percent"],
                               "%s or lower the reserve" % names.of("max_gb") if result["stopped"] == "budget"
                               else names.of("timeout")))
            if result["priority_note"]:
                module.warn("%s on: %s" % (names.of("mode"), result["priority_note"]))
            for error in result["errors"]:
                module.warn("%s on: %s" % (names.of("mode"), error))
    result["line"] = pf.line(result)
    module.exit_json(changed=False, prefetch=result)


if __name__ == "__main__":
    main()
