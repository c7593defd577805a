# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The smoke gate: requests against a running SGLang server, then gates on hangs, throughput and accept length.

Shared by ``sglang_smoke`` (the gate alone) and ``sglang_promote`` (the gate, then the promotion, in one
module run: the redeploy's last run on a single-node server). Standard library only.
"""

from __future__ import annotations

import threading
import time
import uuid

from ansible_collections.gpufleet.sglang.plugins.module_utils.common.http import HTTPConnectionError, request
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.metrics import AcceptWindow, MetricsFormatError

# The options of the gate, as AnsibleModule argument spec (sglang_smoke's options; sglang_promote's smoke_gate).
OPTIONS = dict(
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
)


def check_params(p, prefix=""):
    """The first problem with the gate's numbers, naming the option (``prefix`` + name), or None."""
    for name in ("requests", "concurrency", "max_new_tokens"):
        if p[name] < 1:
            return "%s%s must be at least 1, got %s" % (prefix, name, p[name])
    for name in ("timeout", "request_timeout", "metrics_interval"):
        if p[name] <= 0:
            return "%s%s must be a positive number of seconds, got %s" % (prefix, name, p[name])
    return None


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


def run(p):
    """Send the requests and gate: ``(summary, problems)``; the gate passed when ``problems`` is empty."""
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
    return summary, gate(summary, min_tps, min_accept, p["accept_length_source"], p["request_timeout"])


def failure_message(problems):
    return "Smoke gate failed: " + "; ".join(problems)
