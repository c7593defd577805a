# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_smoke
short_description: Smoke-benchmark an SGLang server and gate on throughput and speculative accept length
version_added: 0.1.0
description:
  - Sends O(requests) C(/generate) requests to a running SGLang server, O(concurrency) at a time, and
    measures the decode throughput and the speculative accept length.
  - The accept length is taken from each response's C(meta_info) (completion tokens divided by
    C(spec_verify_ct), summed over all requests) and cross-checked with C(internal_states[].avg_spec_accept_length)
    from C(/server_info) (falling back to C(/get_server_info) on SGLang before 0.5.10).
  - Fails when the throughput is below O(min_tokens_per_s) or the accept length below O(min_accept_length);
    the message carries both the measured value and the threshold.
  - A speculative config that SGLang silently changed, for example 2 draft tokens instead of 16, shows
    up here as a low accept length even when the server is healthy.
options:
  url:
    description: Base URL of the server, for example V(http://127.0.0.1:30000).
    type: str
    required: true
  api_key:
    description: Bearer key, when the server runs with C(--api-key).
    type: str
  requests:
    description: Number of requests.
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
      - Lowest acceptable mean speculative accept length (bonus token included). V(0) disables this gate.
      - With a positive value, a server that reports no accept length (speculation off) fails the gate.
    type: float
    default: 0
  timeout:
    description: Seconds for the whole run; each request gets the time that is left.
    type: float
    default: 300
author:
  - gpufleet maintainers (@gpufleet)
extends_documentation_fragment:
  - action_common_attributes
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
seealso:
  - module: gpufleet.sglang.sglang_launch
"""

EXAMPLES = r"""
- name: Gate the new EAGLE3 server on accept length and throughput
  gpufleet.sglang.sglang_smoke:
    url: http://127.0.0.1:30000
    requests: 8
    max_new_tokens: 128
    min_accept_length: 2.5
    min_tokens_per_s: 80
"""

RETURN = r"""
tokens_per_s:
  description: Completion tokens per second of wall time, over all requests.
  returned: always
  type: float
  sample: 131.4
accept_length:
  description:
    - Mean speculative accept length from the responses' C(meta_info), or from C(/server_info) when
      the responses carry none. V(null) when the server runs without speculation.
  returned: always
  type: float
  sample: 2.95
meta_accept_length:
  description: Accept length computed from C(meta_info) only.
  returned: always
  type: float
server_accept_length:
  description: C(avg_spec_accept_length) of the first DP rank in C(/server_info), cumulative since server start.
  returned: always
  type: float
requests:
  description: Requests sent, succeeded and failed.
  returned: always
  type: dict
  sample: {"sent": 8, "ok": 8, "failed": 0}
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
errors:
  description: Up to 5 distinct request errors.
  returned: always
  type: list
  elements: str
"""

import threading
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.sglang.plugins.module_utils.http import HTTPConnectionError, request


def _server_accept_length(base, api_key, timeout):
    for path in ("/server_info", "/get_server_info"):
        try:
            status, dummy, data = request("GET", base + path, api_key=api_key, timeout=timeout)
        except HTTPConnectionError:
            return None
        if status == 404:
            continue
        if status != 200 or not isinstance(data, dict):
            return None
        for state in data.get("internal_states") or []:
            if isinstance(state, dict) and state.get("avg_spec_accept_length") is not None:
                return float(state["avg_spec_accept_length"])
        return None
    return None


class Bench:
    def __init__(self, params):
        self.p = params
        self.base = params["url"].rstrip("/")
        self.lock = threading.Lock()
        self.next_index = 0
        self.results = []
        self.errors = []

    def _take(self):
        with self.lock:
            if self.next_index >= self.p["requests"]:
                return None
            self.next_index += 1
            return self.next_index

    def worker(self, deadline):
        body = {"text": self.p["prompt"], "sampling_params": {"max_new_tokens": self.p["max_new_tokens"], "temperature": 0}}
        while True:
            idx = self._take()
            if idx is None:
                return
            left = deadline - time.monotonic()
            if left <= 0:
                with self.lock:
                    self.errors.append("request %d: not sent, the run timed out" % idx)
                continue
            start = time.monotonic()
            try:
                status, dummy, data = request("POST", self.base + "/generate", body=body, api_key=self.p["api_key"], timeout=left)
            except HTTPConnectionError as exc:
                with self.lock:
                    self.errors.append("request %d: %s" % (idx, exc))
                continue
            latency = time.monotonic() - start
            if status != 200 or not isinstance(data, dict):
                with self.lock:
                    self.errors.append("request %d: HTTP %s %s" % (idx, status, str(data)[:200]))
                continue
            meta = data.get("meta_info") or {}
            with self.lock:
                self.results.append({
                    "latency": latency,
                    "completion_tokens": int(meta.get("completion_tokens") or 0),
                    "verify_ct": int(meta.get("spec_verify_ct") or 0),
                })

    def run(self):
        deadline = time.monotonic() + self.p["timeout"]
        start = time.monotonic()
        threads = [threading.Thread(target=self.worker, args=(deadline,), daemon=True) for dummy in range(max(1, self.p["concurrency"]))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()) + 1.0)
        return time.monotonic() - start


def summarise(results, errors, elapsed, sent, server_accept):
    tokens = sum(r["completion_tokens"] for r in results)
    # Only responses that report verify steps count for the accept length: tokens of a response
    # without spec_verify_ct (a worker without speculation behind a router) would inflate it.
    spec_tokens = sum(r["completion_tokens"] for r in results if r["verify_ct"] > 0)
    verify = sum(r["verify_ct"] for r in results if r["verify_ct"] > 0)
    latencies = sorted(r["latency"] for r in results)
    meta_accept = round(spec_tokens / verify, 3) if verify else None
    return dict(
        tokens_per_s=round(tokens / elapsed, 2) if elapsed > 0 and results else 0.0,
        meta_accept_length=meta_accept,
        server_accept_length=round(server_accept, 3) if server_accept is not None else None,
        accept_length=meta_accept if meta_accept is not None else (round(server_accept, 3) if server_accept is not None else None),
        requests=dict(sent=sent, ok=len(results), failed=sent - len(results)),
        completion_tokens=tokens,
        latency_s=dict(p50=round(latencies[len(latencies) // 2], 3) if latencies else None,
                       max=round(latencies[-1], 3) if latencies else None),
        elapsed=round(elapsed, 3),
        errors=sorted(set(errors))[:5],
    )


def _pair(value, threshold, digits):
    """``value`` and ``threshold`` as text with ``digits`` decimals, more when that would print them equal."""
    while digits < 6 and "%.*f" % (digits, value) == "%.*f" % (digits, threshold) and value != threshold:
        digits += 1
    return "%.*f" % (digits, value), "%.*f" % (digits, threshold)


def gate(summary, min_tps, min_accept):
    """Return the list of gate failures, each naming the figure and its threshold."""
    problems = []
    if summary["requests"]["failed"]:
        problems.append("%d of %d requests failed (%s)" % (
            summary["requests"]["failed"], summary["requests"]["sent"], "; ".join(summary["errors"][:2])))
    if min_tps > 0 and summary["tokens_per_s"] < min_tps:
        problems.append("throughput %s tok/s is below min_tokens_per_s %s" % _pair(summary["tokens_per_s"], min_tps, 1))
    if min_accept > 0:
        acc = summary["accept_length"]
        if acc is None:
            problems.append("the server reports no speculative accept length (is speculation off?); min_accept_length is %.2f" % min_accept)
        elif acc < min_accept:
            problems.append("accept length %s is below min_accept_length %s" % _pair(acc, min_accept, 2))
    return problems


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            api_key=dict(type="str", no_log=True),
            requests=dict(type="int", default=8),
            concurrency=dict(type="int", default=1),
            max_new_tokens=dict(type="int", default=64, no_log=False),
            prompt=dict(type="str", default="Write one sentence about GPUs."),
            min_tokens_per_s=dict(type="float", default=0, no_log=False),
            min_accept_length=dict(type="float", default=0),
            timeout=dict(type="float", default=300),
        ),
        supports_check_mode=False,
    )
    p = module.params
    for name in ("requests", "concurrency", "max_new_tokens"):
        if p[name] < 1:
            module.fail_json(msg="%s must be at least 1, got %s" % (name, p[name]))
    bench = Bench(p)
    elapsed = bench.run()
    server_accept = _server_accept_length(bench.base, p["api_key"], min(10.0, p["timeout"]))
    summary = summarise(bench.results, bench.errors, elapsed, p["requests"], server_accept)
    problems = gate(summary, p["min_tokens_per_s"], p["min_accept_length"])
    if problems:
        module.fail_json(msg="Smoke gate failed: " + "; ".join(problems), changed=False, **summary)
    module.exit_json(changed=False, **summary)


if __name__ == "__main__":
    main()
