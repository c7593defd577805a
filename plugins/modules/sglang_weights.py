# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_weights
short_description: Swap the weights of a running SGLang server in place, verified, or roll them back
version_added: 0.2.0
description:
  - Updates the weights of a running SGLang server from a checkpoint directory on its node with
    C(/update_weights_from_disk), without a restart, and verifies the result with C(/model_info) (the model path
    and weight version now served; C(/server_info) keeps the launch values) and the per-rank checksums of
    C(/weights_checker).
  - With O(state=rolled_back) it updates back to O(previous), and fails when that does not verify; the caller then
    restarts the server with its known-good config.
  - Needs SGLang 0.5.23 or newer (per-rank checksums). The new checkpoint must have the architecture, layout and
    C(config.json) of the running one, and the server args must not change; the C(sglang_preflight) plan decides
    that (mode C(weights) or C(restart)).
  - A failed update names the cause (no weights at the path, a checkpoint that does not fit the model, CUDA out of
    memory while staging) and says whether the old weights still serve, from C(/model_info) and the checksums.
  - A multi-node group is updated through the URL of rank 0 (node rank 0); SGLang forwards the update to every
    node's schedulers.
  - Idempotent. Nothing is sent when the server already serves O(model_path) with O(weight_version) (for
    O(state=rolled_back), O(previous)). A checkpoint rewritten at the same path with the same version is not
    noticed; give it a new O(weight_version).
options:
  url:
    description: Base URL of the server (rank 0 of a multi-node group), for example V(http://127.0.0.1:30000).
    type: str
    required: true
  api_key:
    description: Bearer key, when the server runs with C(--api-key) (or C(--admin-api-key)).
    type: str
  model_path:
    description: The checkpoint directory to load, as the server's node sees it. Required for O(state=updated).
    type: str
  weight_version:
    description: The weight version tag to set with the update (shown by C(/model_info) and in every response's
      C(meta_info)). Unset keeps the server's tag.
    type: str
  load_format:
    description: C(load_format) of the update. Unset uses the server's own.
    type: str
  previous:
    description: The checkpoint to roll back to, for O(state=rolled_back).
    type: dict
    suboptions:
      model_path:
        description: Its checkpoint directory.
        type: str
        required: true
      weight_version:
        description: Its weight version tag; unset accepts any.
        type: str
      checksum:
        description:
          - The C(per_engine_checksum) recorded while it served (C(checksums.before.per_engine_checksum) of the update); with it the
            rollback must restore exactly those weights.
        type: str
  state:
    description: V(updated) swaps in O(model_path); V(rolled_back) swaps O(previous) back in.
    type: str
    choices: [updated, rolled_back]
    default: updated
  abort_all_requests:
    description: Abort requests still running before the swap (drain the server from its router first).
    type: bool
    default: true
  flush_cache:
    description: Flush the radix cache after the swap (prefixes computed with the old weights).
    type: bool
    default: true
  timeout:
    description: Seconds to wait for the update, and for each checksum pass.
    type: float
    default: 600
author:
  - gpufleet maintainers (@gpufleet)
extends_documentation_fragment:
  - action_common_attributes
  - gpufleet.sglang.tls
  - gpufleet.sglang.option_labels
attributes:
  check_mode:
    support: full
    details: In check mode the module reads C(/model_info) and the checksums and reports whether it would update.
  diff_mode:
    support: none
  platform:
    platforms: posix
seealso:
  - module: gpufleet.sglang.sglang_preflight
  - module: gpufleet.sglang.sglang_smoke
"""

EXAMPLES = r"""
- name: Swap in the new checkpoint without a restart
  gpufleet.sglang.sglang_weights:
    url: http://127.0.0.1:30000
    api_key: "{{ sglang_api_key }}"
    model_path: /models/qwen2-7b-step-2000
    weight_version: step-2000
  register: swap

- name: Roll back to the checkpoint that served before
  gpufleet.sglang.sglang_weights:
    url: http://127.0.0.1:30000
    api_key: "{{ sglang_api_key }}"
    state: rolled_back
    previous:
      model_path: "{{ swap.model_path_before }}"
      weight_version: "{{ swap.weight_version.before }}"
      checksum: "{{ swap.checksums.before.per_engine_checksum }}"
"""

RETURN = r"""
model_path:
  description: The checkpoint the module swapped in (or would, in check mode).
  returned: always
  type: str
model_path_before:
  description: The model path C(/model_info) showed before the module.
  returned: always
  type: str
weight_version:
  description: C(before) and C(after) the module, from C(/model_info).
  returned: always
  type: dict
checksums:
  description:
    - C(before) and C(after) the module, from C(/weights_checker); each C(per_engine_checksum) and C(ranks), a list
      of C(rank), C(tp_rank), C(dp_rank), C(pp_rank), C(per_gpu_checksum) and C(files) (checked entries).
  returned: always
  type: dict
checksums_changed:
  description: Whether the per-engine checksum changed.
  returned: when the checksums were read after the update
  type: bool
model_info:
  description: C(/model_info) after the module (C(model_path), C(weight_version), C(load_format), C(served_model_name),
    C(architectures), C(disaggregation_mode)).
  returned: always
  type: dict
message:
  description: SGLang's answer to the update.
  returned: always
  type: str
failure:
  description: On failure, the cause, one of V(path), V(oom), V(load), V(flush), V(error), V(timeout), V(http) or V(verify).
  returned: on failure
  type: str
old_weights_serving:
  description: On failure, whether C(/model_info) and every rank's checksum are those from before the module.
  returned: on failure
  type: bool
timings:
  description: Seconds of C(model_info_s), C(checksum_before_s), C(update_s), C(checksum_after_s) and C(total_s).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import http
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import names as names_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import weights


def _already(info, sums, target, version, checksum):
    return (info.get("model_path") == target
            and (version is None or str(info.get("weight_version")) == str(version))
            and (not checksum or sums.get("per_engine_checksum") == checksum))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            api_key=dict(type="str", no_log=True),
            model_path=dict(type="str"),
            weight_version=dict(type="str"),
            load_format=dict(type="str"),
            previous=dict(type="dict", options=dict(
                model_path=dict(type="str", required=True),
                weight_version=dict(type="str"),
                checksum=dict(type="str"),
            )),
            state=dict(type="str", choices=["updated", "rolled_back"], default="updated"),
            abort_all_requests=dict(type="bool", default=True),
            flush_cache=dict(type="bool", default=True),
            timeout=dict(type="float", default=600.0),
            **dict(http.TLS_ARGSPEC, **names_mod.ARGSPEC)
        ),
        required_if=[("state", "updated", ("model_path",)), ("state", "rolled_back", ("previous",))],
        supports_check_mode=True,
    )
    http.configure_module(module)
    p = module.params
    if p["timeout"] <= 0:
        module.fail_json(msg="timeout: must be a positive number of seconds, got %s" % p["timeout"])
    url = p["url"].rstrip("/")
    if not url.startswith(("http://", "https://")):
        module.fail_json(msg="url: %s is not an http(s) URL; give the server's base URL, for example "
                             "http://127.0.0.1:30000" % p["url"])
    if p["state"] == "updated":
        target, version, checksum = p["model_path"], p["weight_version"], None
    else:
        prev = p["previous"]
        target, version, checksum = prev["model_path"], prev.get("weight_version"), prev.get("checksum")
    short = min(p["timeout"], 60.0)
    try:
        info = weights.model_info(url, p["api_key"], short)
        sums = weights.checksums(url, p["api_key"], p["timeout"])
    except (http.HTTPConnectionError, weights.WeightsError) as exc:
        module.fail_json(msg="cannot read the weights of %s: %s; nothing was changed" % (url, getattr(exc, "msg", exc)),
                         failure="http", model_path=target, model_path_before=None, weight_version={},
                         checksums={}, model_info={}, message="", timings={})
    base = {"model_path": target, "model_path_before": info.get("model_path"),
            "weight_version": {"before": info.get("weight_version"), "after": info.get("weight_version")},
            "checksums": {"before": sums, "after": sums}, "model_info": info, "message": "", "timings": {}}
    if _already(info, sums, target, version, checksum):
        base["message"] = "the server already serves %s (weight_version %s)" % (target, info.get("weight_version"))
        module.exit_json(changed=False, checksums_changed=False, **base)
    if module.check_mode:
        base["message"] = "would update %s to %s" % (info.get("model_path"), target)
        module.exit_json(changed=True, **base)
    try:
        if p["state"] == "updated":
            result = weights.update_in_place(url, p["api_key"], target, version, load_format=p["load_format"],
                                             abort_all_requests=p["abort_all_requests"], flush_cache=p["flush_cache"],
                                             timeout=p["timeout"])
        else:
            result = weights.roll_back(url, p["api_key"], target, version, load_format=p["load_format"],
                                       expected_checksum=checksum, abort_all_requests=p["abort_all_requests"],
                                       flush_cache=p["flush_cache"], timeout=p["timeout"])
    except weights.WeightsError as exc:
        out = dict(base)
        out.update(exc.result or {})
        out.pop("changed", None)
        module.fail_json(msg=exc.msg, changed=out.get("old_weights_serving") is False, **out)
    for key in ("failure", "old_weights_serving"):
        result.pop(key, None)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
