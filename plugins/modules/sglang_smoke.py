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

import threading
import time
import uuid

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.sglang.plugins.module_utils.http import HTTPConnectionError, request
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang_metrics import AcceptWindow, MetricsFormatError

# SGLang's placeholder bootstrap host (srt/disaggregation/utils.py): a PD server runs such a request alone.
FAKE_BOOTSTRAP_HOST = "2.2.2.2"


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


def _metrics_page(base, api_key, timeout):
    """The ``/metrics`` text, or None (absent, failing, not text)."""
    try:
        status, dummy, data = request("GET", base + "/metrics", api_key=api_key, timeout=timeout)
    except HTTPConnectionError:
        return None
    if status != 200 or not isinstance(data, str):
        return None
    return data


class Bench:
    def __init__(self, params):
        self.p = params
        self.base = params["url"].rstrip("/")
        self.lock = threading.Lock()
        self.next_index = 0
        self.results = []
        self.errors = []
        self.hangs = []          # request indexes that did not answer within request_timeout
        self.sent = 0
        self.budget_out = False
        self.stop = threading.Event()
        self.window = AcceptWindow()
        self.metrics_ok = False
        # Every request carries its own SGLang request id (rid): a hang names the request the server still holds,
        # and its log lines can be found by that id. The server's arrival order may differ from ours.
        self.rid_prefix = "gpufleet-smoke-%s" % uuid.uuid4().hex[:12]

    def _take(self):
        with self.lock:
            if self.stop.is_set() or self.next_index >= self.p["requests"]:
                return None
            self.next_index += 1
            return self.next_index

    def worker(self, deadline):
        base_body = {"text": self.p["prompt"], "sampling_params": {"max_new_tokens": self.p["max_new_tokens"], "temperature": 0}}
        while True:
            idx = self._take()
            if idx is None:
                return
            body = dict(base_body, rid="%s-%d" % (self.rid_prefix, idx))
            if self.p["disaggregation_mode"] in ("prefill", "decode"):
                # SGLang's own fake bootstrap host: the server runs the request alone, as for its warm-up.
                body = dict(body, bootstrap_host=FAKE_BOOTSTRAP_HOST, bootstrap_port=0, bootstrap_room=idx)
            left = deadline - time.monotonic()
            if left <= 0:
                with self.lock:
                    self.budget_out = True
                    self.stop.set()
                return
            with self.lock:
                self.sent += 1
            wait = min(left, self.p["request_timeout"])
            start = time.monotonic()
            try:
                status, dummy, data = request("POST", self.base + "/generate", body=body, api_key=self.p["api_key"], timeout=wait)
            except HTTPConnectionError as exc:
                with self.lock:
                    if exc.kind == "timeout" and wait >= self.p["request_timeout"]:
                        self.hangs.append(idx)
                        self.stop.set()
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

    def _observe_metrics(self, first=False):
        page = _metrics_page(self.base, self.p["api_key"], min(10.0, max(1.0, self.p["metrics_interval"] * 4)))
        if page is None:
            return
        try:
            if first:
                self.window.start(page)
            else:
                self.window.observe(page)
            self.metrics_ok = True
        except MetricsFormatError:
            return

    def sampler(self, done):
        while not done.wait(self.p["metrics_interval"]):
            self._observe_metrics()

    def run(self):
        use_metrics = self.p["accept_length_source"] != "meta"
        if use_metrics:
            self._observe_metrics(first=True)
        deadline = time.monotonic() + self.p["timeout"]
        start = time.monotonic()
        done = threading.Event()
        sampler = None
        if use_metrics and self.metrics_ok:
            sampler = threading.Thread(target=self.sampler, args=(done,), daemon=True)
            sampler.start()
        threads = [threading.Thread(target=self.worker, args=(deadline,), daemon=True) for dummy in range(max(1, self.p["concurrency"]))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()) + self.p["request_timeout"] + 1.0)
        elapsed = time.monotonic() - start
        done.set()
        if sampler is not None:
            sampler.join(10)
            self._observe_metrics()
        return elapsed


def summarise(results, errors, elapsed, sent, server_accept, window=None, hangs=(), total=None, source="auto",
              budget_out=False, request_timeout=None, rid_prefix=None):
    tokens = sum(r["completion_tokens"] for r in results)
    # Only responses that report verify steps count for the accept length: tokens of a response
    # without spec_verify_ct (a worker without speculation behind a router) would inflate it.
    spec_tokens = sum(r["completion_tokens"] for r in results if r["verify_ct"] > 0)
    verify = sum(r["verify_ct"] for r in results if r["verify_ct"] > 0)
    latencies = sorted(r["latency"] for r in results)
    meta_accept = round(spec_tokens / verify, 3) if verify else None
    server_accept = round(server_accept, 3) if server_accept is not None else None
    win = window or {}
    metrics_accept = win.get("accept_length")
    if source == "metrics":
        chosen = (metrics_accept, "metrics" if metrics_accept is not None else None)
    elif source == "meta" or metrics_accept is None:
        chosen = (meta_accept, "meta") if meta_accept is not None else (
            (server_accept, "server_info") if server_accept is not None else (None, None))
    else:
        chosen = (metrics_accept, "metrics")
    total = sent if total is None else total
    hang = None
    if hangs:
        first = min(hangs)
        hang = dict(request=first, of=total, answered=len(results), timeout=request_timeout, hung=len(hangs))
        if rid_prefix:
            hang["rid"] = "%s-%d" % (rid_prefix, first)
    not_sent = max(0, total - sent)
    if budget_out or (not_sent and not hangs):
        budget_out = True
    return dict(
        tokens_per_s=round(tokens / elapsed, 2) if elapsed > 0 and results else 0.0,
        accept_length=chosen[0],
        accept_length_source=chosen[1],
        metrics_accept_length=metrics_accept,
        metrics_accept_rate=win.get("accept_rate"),
        metrics_reports=int(win.get("reports") or 0),
        metrics_available=bool(win.get("present")),
        meta_accept_length=meta_accept,
        server_accept_length=server_accept,
        hang=hang,
        requests=dict(sent=sent, ok=len(results), failed=sent - len(results)),
        requests_not_sent=not_sent,
        budget_exhausted=bool(budget_out),
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


def _seconds(value):
    return ("%d" % value) if float(value).is_integer() else ("%g" % value)


def gate(summary, min_tps, min_accept, source="auto", request_timeout=None):
    """Return the list of gate failures, each naming the figure and its threshold."""
    problems = []
    hang = summary.get("hang")
    if hang:
        limit = request_timeout if request_timeout is not None else hang.get("timeout") or 0
        problems.append("request %d of %d%s did not answer within %s s (%d answered before the run stopped)" % (
            hang["request"], hang["of"], " (rid %s)" % hang["rid"] if hang.get("rid") else "", _seconds(limit),
            hang["answered"]))
    req = summary["requests"]
    hung = hang["hung"] if hang else 0
    if req["failed"] - hung > 0:
        problems.append("%d of %d requests failed (%s)" % (
            req["failed"] - hung, req["sent"],
            "; ".join([e for e in summary["errors"] if not hang or "timeout" not in e][:2] or summary["errors"][:2])))
    not_sent = summary.get("requests_not_sent") or 0
    if summary.get("budget_exhausted") and not_sent:
        problems.append("the run's budget (timeout) ran out: %d of %d requests were not sent" % (
            not_sent, req["sent"] + not_sent))
    if min_tps > 0 and summary["tokens_per_s"] < min_tps:
        problems.append("throughput %s tok/s is below min_tokens_per_s %s" % _pair(summary["tokens_per_s"], min_tps, 1))
    if min_accept > 0:
        acc = summary["accept_length"]
        if acc is None and source == "metrics":
            if not summary.get("metrics_available"):
                problems.append("accept_length_source is metrics but the server has no sglang:spec_accept_length gauge "
                                "(start it with --enable-metrics); min_accept_length is %.2f" % min_accept)
            else:
                problems.append("sglang:spec_accept_length made no report during the smoke window (fewer decode "
                                "iterations than --decode-log-interval: send more requests or tokens); "
                                "min_accept_length is %.2f" % min_accept)
        elif acc is None:
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
            accept_length_source=dict(type="str", default="auto", choices=["auto", "metrics", "meta"]),
            metrics_interval=dict(type="float", default=1.0),
            timeout=dict(type="float", default=300),
            request_timeout=dict(type="float", default=120),
            disaggregation_mode=dict(type="str", default="null", choices=["null", "prefill", "decode"]),
        ),
        supports_check_mode=False,
    )
    p = module.params
    for name in ("requests", "concurrency", "max_new_tokens"):
        if p[name] < 1:
            module.fail_json(msg="%s must be at least 1, got %s" % (name, p[name]))
    for name in ("timeout", "request_timeout", "metrics_interval"):
        if p[name] <= 0:
            module.fail_json(msg="%s must be a positive number of seconds, got %s" % (name, p[name]))
    bench = Bench(p)
    elapsed = bench.run()
    server_accept = _server_accept_length(bench.base, p["api_key"], min(10.0, p["timeout"]))
    summary = summarise(bench.results, bench.errors, elapsed, bench.sent, server_accept, window=bench.window.result(),
                        hangs=bench.hangs, total=p["requests"], source=p["accept_length_source"],
                        budget_out=bench.budget_out, request_timeout=p["request_timeout"], rid_prefix=bench.rid_prefix)
    min_tps, min_accept = p["min_tokens_per_s"], p["min_accept_length"]
    summary["gates_skipped"] = []
    if p["disaggregation_mode"] == "prefill":
        for name, value in (("min_tokens_per_s", min_tps), ("min_accept_length", min_accept)):
            if value > 0:
                summary["gates_skipped"].append("%s: a prefill server returns one token per request; the gate applies to "
                                                "the decode servers" % name)
        min_tps = min_accept = 0
    problems = gate(summary, min_tps, min_accept, p["accept_length_source"], p["request_timeout"])
    if problems:
        module.fail_json(msg="Smoke gate failed: " + "; ".join(problems), changed=False, **summary)
    module.exit_json(changed=False, **summary)


if __name__ == "__main__":
    main()
