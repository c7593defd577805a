# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_smoke
short_description: Smoke-benchmark an SGLang server and gate on hangs, throughput and speculative accept length
version_added: 0.1.0
description:
  - Sends O(requests) C(/generate) requests to a running SGLang server, O(concurrency) at a time, within an overall
    budget of O(timeout) seconds, each request waiting at most O(request_timeout) seconds for its answer.
  - Fails on the first request that does not answer in time, naming it, for example C(request 97 of 150 did not
    answer within 30 s), and sends no further requests. A server relaunched after a SIGKILL can pass C(/health) and
    then hang after about 80 to 140 requests (sglang issue 22779); O(requests=150) or more catches that failure.
  - The speculative accept length comes from two places and both are reported.
    The windowed gauges C(sglang:spec_accept_length) and C(sglang:spec_accept_rate) of C(/metrics) (server started
    with C(--enable-metrics)) are read before the first request, every O(metrics_interval) seconds while requests
    run and once after the last answer. SGLang sets them every C(--decode-log-interval) decode iterations (default
    40) to the mean over those iterations only, so only reports made inside the smoke window count, and their mean
    is the windowed figure.
    Each response's C(meta_info) gives the mean over the smoke requests (completion tokens divided by
    C(spec_verify_ct)), kept as a cross-check, with C(internal_states[].avg_spec_accept_length) of C(/server_info)
    (cumulative since the server started) as a last resort.
  - O(accept_length_source) says which figure gates; RV(accept_length_source) says which one did.
  - Fails when the throughput is below O(min_tokens_per_s) or the accept length below O(min_accept_length);
    the message carries both the measured value and the threshold.
options:
  url:
    description: Base URL of the server, for example V(http://127.0.0.1:30000).
    type: str
    required: true
  api_key:
    description: Bearer key, when the server runs with C(--api-key).
    type: str
  requests:
    description:
      - Number of requests. Use 150 or more to catch the hang after a relaunch that follows a SIGKILL
        (sglang issue 22779, a healthy C(/health) and then no answer after about 80 to 140 requests).
    type: int
    default: 8
  concurrency:
    description: Requests in flight at once.
    type: int
    default: 1
  max_new_tokens:
    description: C(sampling_params.max_new_tokens) of every request.
    type: int
    default: 64
  prompt:
    description: Prompt text of every request.
    type: str
    default: Write one sentence about GPUs.
  min_tokens_per_s:
    description:
      - Lowest acceptable throughput, completion tokens per second of wall time over the whole run.
        V(0) disables this gate.
    type: float
    default: 0
  min_accept_length:
    description:
      - Lowest acceptable speculative accept length (bonus token included). V(0) disables this gate.
      - With a positive value, a server that reports no accept length (speculation off) fails the gate.
    type: float
    default: 0
  accept_length_source:
    description:
      - Which accept length gates.
      - V(metrics) is the windowed C(/metrics) gauge; the gate fails when the server has no C(/metrics) or made no
        report during the window (it decoded fewer than C(--decode-log-interval) iterations; send more tokens).
      - V(meta) is the mean over the smoke responses' C(meta_info), or C(/server_info) when they carry none.
      - V(auto) takes the windowed gauge when the window has a report, else V(meta).
    type: str
    choices: [auto, metrics, meta]
    default: auto
  metrics_interval:
    description: Seconds between two reads of C(/metrics) while requests run.
    type: float
    default: 1.0
  timeout:
    description: Overall budget of the run in seconds; no request is sent once it is spent.
    type: float
    default: 300
  request_timeout:
    description:
      - Seconds one request may take before it counts as a hang (never more than what is left of O(timeout)).
    type: float
    default: 120
  disaggregation_mode:
    description:
      - The server's C(--disaggregation-mode). A prefill or decode server serves only requests that carry the
        bootstrap fields a PD router adds; each smoke request carries SGLang's own fake bootstrap host
        (C(2.2.2.2), what its warm-up and health check send), so the server answers it alone.
      - A V(prefill) server returns one token per request, so O(min_tokens_per_s) and O(min_accept_length) are
        not applied to it (the result says so in RV(gates_skipped)); the requests must still all answer.
    type: str
    choices: ["null", prefill, decode]
    default: "null"
author:
  - gpufleet maintainers (@gpufleet)
extends_documentation_fragment:
  - action_common_attributes
  - gpufleet.sglang.tls
  - gpufleet.sglang.option_labels
attributes:
  check_mode:
    support: none
    details: The benchmark sends real requests, so it is skipped in check mode.
  diff_mode:
    support: none
  platform:
    platforms: posix
notes:
  - Throughput depends on the request mix; compare like with like (same prompt, O(max_new_tokens) and
    O(concurrency)) when you set O(min_tokens_per_s).
  - Reading C(/server_info) installs SGLang's SIGTERM drain handler on a server that had none yet.
seealso:
  - module: gpufleet.sglang.sglang_launch
"""

EXAMPLES = r"""
- name: Gate the relaunched EAGLE3 server on hangs, windowed accept length and throughput
  gpufleet.sglang.sglang_smoke:
    url: http://127.0.0.1:30000
    requests: 150
    concurrency: 8
    request_timeout: 60
    timeout: 600
    max_new_tokens: 128
    min_accept_length: 2.5
    accept_length_source: metrics
    min_tokens_per_s: 80
"""

RETURN = r"""
tokens_per_s:
  description: Completion tokens per second of wall time, over all requests.
  returned: always
  type: float
  sample: 131.4
accept_length:
  description: The accept length that gated (see RV(accept_length_source)); V(null) when there is none.
  returned: always
  type: float
  sample: 2.95
accept_length_source:
  description: Where RV(accept_length) comes from, V(metrics), V(meta), V(server_info), or V(null).
  returned: always
  type: str
  sample: metrics
metrics_accept_length:
  description: Mean of the C(sglang:spec_accept_length) reports made during the smoke window.
  returned: always
  type: float
metrics_accept_rate:
  description: Mean of the C(sglang:spec_accept_rate) reports made during the smoke window.
  returned: always
  type: float
metrics_reports:
  description: Number of gauge reports seen during the window (V(0) also when C(/metrics) is absent).
  returned: always
  type: int
metrics_available:
  description: Whether the server answered C(/metrics) with the speculative gauges.
  returned: always
  type: bool
meta_accept_length:
  description: Accept length computed from the responses' C(meta_info) only.
  returned: always
  type: float
server_accept_length:
  description: C(avg_spec_accept_length) of the first DP rank in C(/server_info), cumulative since server start.
  returned: always
  type: float
hang:
  description:
    - The first request that did not answer within O(request_timeout), or V(null).
    - C(rid) is the SGLang request id the module gave it (every request carries one), to find it in the server's log.
  returned: always
  type: dict
  sample: {"request": 97, "of": 150, "timeout": 30.0, "answered": 96, "hung": 8, "rid": "gpufleet-smoke-3f9c0a1b2d4e-97"}
requests:
  description: Requests sent, succeeded and failed (failed includes those that hung, see RV(hang)).
  returned: always
  type: dict
  sample: {"sent": 8, "ok": 8, "failed": 0}
requests_not_sent:
  description: Requests never sent, after a hang or because the budget ran out.
  returned: always
  type: int
  sample: 0
budget_exhausted:
  description: Whether O(timeout) ran out before every request was sent.
  returned: always
  type: bool
completion_tokens:
  description: Completion tokens over all successful requests.
  returned: always
  type: int
latency_s:
  description: Per-request end-to-end latency, median and maximum, in seconds.
  returned: always
  type: dict
  sample: {"p50": 0.41, "max": 0.52}
elapsed:
  description: Wall time of the run in seconds.
  returned: always
  type: float
gates_skipped:
  description: Gates that were not applied, with why (a prefill server).
  returned: always
  type: list
  elements: str
errors:
  description: Up to 5 distinct request errors.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import http
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import names as names_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import smoke

# The engine's names, for callers and tests that know them from this module.
Bench = smoke.Bench
summarise = smoke.summarise
gate = smoke.gate
_pair = smoke._pair


def main():
    module = AnsibleModule(argument_spec=dict(smoke.OPTIONS, **dict(http.TLS_ARGSPEC, **names_mod.ARGSPEC)), supports_check_mode=False)
    http.configure_module(module)
    p = module.params
    problem = smoke.check_params(p)
    if problem:
        module.fail_json(msg=problem)
    summary, problems = smoke.run(p)
    if problems:
        module.fail_json(msg=smoke.failure_message(problems), changed=False, **summary)
    module.exit_json(changed=False, **summary)


if __name__ == "__main__":
    main()
