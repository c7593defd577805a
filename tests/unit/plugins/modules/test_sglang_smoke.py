"""Unit tests for the sglang_smoke module: ``summarise``/``gate`` as pure functions, and
``main()`` run in-process (``patch_module_args``, ``exit_json``/``fail_json`` patched to raise)
against a tiny HTTP server in a thread of this process that answers like SGLang
(``/generate`` with ``meta_info``, ``/server_info`` with ``internal_states``, ``/get_server_info``
for servers before 0.5.10, 503 for failures). No process is started.
"""
from __future__ import annotations

import json
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

from ansible_collections.gpufleet.sglang.plugins.modules import sglang_smoke


# ---------------------------------------------------------------------------
# A fake SGLang HTTP server
# ---------------------------------------------------------------------------

def meta(completion_tokens, verify_ct=None, prompt_tokens=7):
    """``meta_info`` as SGLang 0.5.x returns it (speculation on when ``verify_ct`` is given)."""
    m = {"id": "rid", "finish_reason": {"type": "length", "length": completion_tokens},
         "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "cached_tokens": 0,
         "e2e_latency": 0.4}
    if verify_ct is not None:
        m.update({"spec_verify_ct": verify_ct, "spec_accept_length": completion_tokens / float(verify_ct),
                  "spec_accept_rate": 0.6})
    return m


def server_info(avg=None, ranks=1):
    states = [{"last_gen_throughput": 98.1, "memory_usage": {"weight": 14.2}} for dummy in range(ranks)]
    if avg is not None:
        for st in states:
            st["avg_spec_accept_length"] = avg
    return {"model_path": "/models/Qwen2", "api_key": "k", "status": "ready", "internal_states": states,
            "version": "0.5.23"}


class FakeSGLang:
    """Answers from ``self.generate`` (a callable ``index -> (status, body)``), ``self.info``
    (``path -> (status, body)``) and records every request."""

    def __init__(self):
        self.lock = threading.Lock()
        self.requests = []
        self.api_key = None
        self.delay = 0.0
        self.delays = lambda index: 0.0           # per /generate request number (1-based), e.g. a hang from N on
        self.metrics = None                         # callable: number of answered /generate -> page text
        self.answered = 0
        self.generate = lambda index: (200, {"text": " GPUs are fast.", "meta_info": meta(64, 22)})
        self.info = {"/server_info": (200, server_info(2.95)), "/get_server_info": (200, server_info(2.95))}
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _send(self, status, body):
                raw = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json" if not isinstance(body, bytes) else "text/plain")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def _record(self, body=None):
                with fake.lock:
                    fake.requests.append({"method": self.command, "path": self.path, "body": body,
                                          "auth": self.headers.get("Authorization")})
                    return len([r for r in fake.requests if r["path"] == self.path])

            def _authorised(self):
                if fake.api_key and self.headers.get("Authorization") != "Bearer %s" % fake.api_key:
                    self._send(401, {"error": "Unauthorized"})
                    return False
                return True

            def do_GET(self):
                self._record()
                if not self._authorised():
                    return
                if self.path == "/metrics" and fake.metrics is not None:
                    with fake.lock:
                        answered = fake.answered
                    self._send(200, fake.metrics(answered).encode())
                    return
                status, body = fake.info.get(self.path, (404, {"detail": "Not Found"}))
                self._send(status, body)

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"null")
                index = self._record(body)
                # The module's own request number, from the SGLang request id it sends (its arrival order here
                # can differ: two threads race); the arrival count for a body without one.
                rid = (body or {}).get("rid") if isinstance(body, dict) else None
                if isinstance(rid, str) and rid.rpartition("-")[2].isdigit():
                    index = int(rid.rpartition("-")[2])
                if not self._authorised():
                    return
                if fake.delay:
                    time.sleep(fake.delay)
                if self.path != "/generate":
                    self._send(404, {"detail": "Not Found"})
                    return
                time.sleep(fake.delays(index))
                status, answer = fake.generate(index)
                with fake.lock:
                    fake.answered += 1
                self._send(status, answer)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.handle_error = lambda request, address: None     # a client that gave up (the timeout test)
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def paths(self, method=None):
        with self.lock:
            return [r["path"] for r in self.requests if method is None or r["method"] == method]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


@pytest.fixture
def server():
    fake = FakeSGLang()
    yield fake
    fake.close()


@pytest.fixture
def run(monkeypatch):
    class ExitJson(Exception):
        pass

    def exit_json(self, **kwargs):
        kwargs.setdefault("changed", False)
        kwargs["failed"] = False
        raise ExitJson(kwargs)

    def fail_json(self, msg, **kwargs):
        kwargs.update(failed=True, msg=msg)
        raise ExitJson(kwargs)

    monkeypatch.setattr(basic.AnsibleModule, "exit_json", exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)

    def _run(args, check=False):
        args = dict(args)
        if check:
            args["_ansible_check_mode"] = True
        with patch_module_args(args):
            with pytest.raises(ExitJson) as info:
                sglang_smoke.main()
        return info.value.args[0]

    return _run


# ---------------------------------------------------------------------------
# Pure functions
# ---------------------------------------------------------------------------

def _r(tokens, verify, latency=0.5):
    return {"completion_tokens": tokens, "verify_ct": verify, "latency": latency}


def test_summarise_accept_length_from_meta_info():
    # The incident: 2 draft tokens, accept length 1.66 (128 tokens in 77 verify steps).
    s = sglang_smoke.summarise([_r(128, 77, 0.3), _r(128, 77, 0.5), _r(128, 77, 0.4)], [], 2.0, 3, 1.70)
    assert s["meta_accept_length"] == round(384 / 231.0, 3) == 1.662
    assert s["accept_length"] == 1.662                      # meta_info wins over /server_info
    assert s["server_accept_length"] == 1.7
    assert s["tokens_per_s"] == 192.0
    assert s["completion_tokens"] == 384
    assert s["requests"] == {"sent": 3, "ok": 3, "failed": 0}
    assert s["accept_length_source"] == "meta" and s["metrics_accept_length"] is None
    assert s["hang"] is None and s["budget_exhausted"] is False and s["requests_not_sent"] == 0
    assert s["latency_s"] == {"p50": 0.4, "max": 0.5}
    assert s["elapsed"] == 2.0 and s["errors"] == []


def test_summarise_sums_over_requests_not_a_mean_of_ratios():
    s = sglang_smoke.summarise([_r(100, 10), _r(10, 10)], [], 1.0, 2, None)
    assert s["meta_accept_length"] == 5.5                   # 110 / 20, not (10 + 1) / 2


def test_summarise_ignores_responses_without_verify_steps_for_the_accept_length():
    # One worker without speculation behind a router: its tokens must not inflate the figure.
    s = sglang_smoke.summarise([_r(64, 32), _r(64, 0)], [], 1.0, 2, None)
    assert s["meta_accept_length"] == 2.0
    assert s["completion_tokens"] == 128


def test_summarise_falls_back_to_server_info_and_handles_no_results():
    s = sglang_smoke.summarise([_r(64, 0)], [], 1.0, 1, 2.94567)
    assert s["meta_accept_length"] is None and s["accept_length"] == 2.946 and s["server_accept_length"] == 2.946
    assert s["accept_length_source"] == "server_info"
    none = sglang_smoke.summarise([], ["request 1: HTTP 503 x", "request 1: HTTP 503 x", "b"], 0.0, 2, None)
    assert none["accept_length"] is None and none["tokens_per_s"] == 0.0
    assert none["latency_s"] == {"p50": None, "max": None}
    assert none["requests"] == {"sent": 2, "ok": 0, "failed": 2}
    assert none["errors"] == ["b", "request 1: HTTP 503 x"]  # distinct, sorted
    many = sglang_smoke.summarise([], ["e%d" % i for i in range(9)], 1.0, 9, None)
    assert len(many["errors"]) == 5


def _summary(tps=100.0, acc=2.95, failed=0, sent=8, errors=()):
    return {"tokens_per_s": tps, "accept_length": acc, "requests": {"sent": sent, "ok": sent - failed, "failed": failed},
            "errors": list(errors)}


def test_gate_passes_and_disabled_gates():
    assert sglang_smoke.gate(_summary(), 80, 2.5) == []
    assert sglang_smoke.gate(_summary(tps=1.0, acc=None), 0, 0) == []


def test_gate_messages_carry_value_and_threshold():
    assert sglang_smoke.gate(_summary(acc=1.661), 0, 2.5) == ["accept length 1.66 is below min_accept_length 2.50"]
    assert sglang_smoke.gate(_summary(tps=56.76), 80, 0) == ["throughput 56.8 tok/s is below min_tokens_per_s 80.0"]
    assert sglang_smoke.gate(_summary(acc=None), 0, 2.5) == [
        "the server reports no speculative accept length (is speculation off?); min_accept_length is 2.50"]
    problems = sglang_smoke.gate(_summary(failed=2, sent=4, errors=["request 1: HTTP 503 a", "request 3: refused", "x"]), 0, 0)
    assert problems == ["2 of 4 requests failed (request 1: HTTP 503 a; request 3: refused)"]


def test_gate_never_prints_a_value_equal_to_the_threshold_it_is_below():
    assert sglang_smoke.gate(_summary(acc=2.497), 0, 2.5) == ["accept length 2.497 is below min_accept_length 2.500"]
    assert sglang_smoke.gate(_summary(tps=79.96), 80, 0) == ["throughput 79.96 tok/s is below min_tokens_per_s 80.00"]
    assert sglang_smoke._pair(1.0, 1.0, 2) == ("1.00", "1.00")
    assert sglang_smoke._pair(1.0, 1.0 + 1e-9, 2) == ("1.000000", "1.000000")   # bounded


# ---------------------------------------------------------------------------
# main() against the fake server
# ---------------------------------------------------------------------------

def test_run_passes_gates_and_sends_what_sglang_expects(server, run):
    res = run({"url": server.url + "/", "requests": 4, "concurrency": 2, "max_new_tokens": 64, "prompt": "Hi",
               "min_accept_length": 2.5, "min_tokens_per_s": 1})
    assert res["failed"] is False and res["changed"] is False, res
    assert res["requests"] == {"sent": 4, "ok": 4, "failed": 0}
    assert res["completion_tokens"] == 256
    assert res["meta_accept_length"] == res["accept_length"] == round(64 / 22.0, 3)
    assert res["server_accept_length"] == 2.95
    assert res["tokens_per_s"] > 1 and res["elapsed"] > 0
    assert res["latency_s"]["p50"] <= res["latency_s"]["max"]
    posts = [r for r in server.requests if r["method"] == "POST"]
    assert len(posts) == 4 and all(r["path"] == "/generate" for r in posts)
    rid = posts[0]["body"].pop("rid")
    assert posts[0]["body"] == {"text": "Hi", "sampling_params": {"max_new_tokens": 64, "temperature": 0}}
    assert re.match(r"^gpufleet-smoke-[0-9a-f]{12}-[0-9]+$", rid), rid      # SGLang's request id field
    assert all(r["auth"] is None for r in server.requests)
    assert server.paths("GET") == ["/metrics", "/server_info"]     # no /metrics here (404): meta gates
    assert res["metrics_available"] is False and res["accept_length_source"] == "meta"


def test_incident_accept_length_fails_the_gate_with_both_numbers(server, run):
    # EAGLE3 topk 1 steps 1 draft 16: SGLang runs 2 draft tokens; 64 tokens in 39 verify steps.
    server.generate = lambda index: (200, {"text": "x", "meta_info": meta(64, 39)})
    server.info["/server_info"] = (200, server_info(1.661))
    res = run({"url": server.url, "requests": 2, "min_accept_length": 2.5})
    assert res["failed"] is True
    assert res["msg"] == "Smoke gate failed: accept length 1.64 is below min_accept_length 2.50"
    assert res["accept_length"] == 1.641 and res["server_accept_length"] == 1.661
    assert res["requests"]["ok"] == 2                            # the result is still returned in full


def test_api_key_is_sent_as_bearer_to_every_endpoint(server, run):
    server.api_key = "s3cret"
    res = run({"url": server.url, "requests": 2, "api_key": "s3cret"})
    assert res["failed"] is False and res["requests"]["ok"] == 2
    assert {r["auth"] for r in server.requests} == {"Bearer s3cret"}
    wrong = run({"url": server.url, "requests": 1, "api_key": "nope"})
    assert wrong["failed"] is True and "HTTP 401" in wrong["msg"]
    assert "nope" not in wrong["msg"]


def test_server_info_404_falls_back_to_get_server_info(server, run):
    # SGLang before 0.5.10 has no /server_info; 0.4.6 reports only spec_verify_ct in meta_info.
    server.info.pop("/server_info")
    server.info["/get_server_info"] = (200, server_info(2.5, ranks=2))
    res = run({"url": server.url, "requests": 1})
    assert res["server_accept_length"] == 2.5
    assert server.paths("GET") == ["/metrics", "/server_info", "/get_server_info"]


def test_accept_length_from_server_info_when_meta_info_has_none(server, run):
    server.generate = lambda index: (200, {"text": "x", "meta_info": meta(64)})
    server.info["/server_info"] = (200, server_info(2.2))
    res = run({"url": server.url, "requests": 2, "min_accept_length": 2.0})
    assert res["failed"] is False
    assert res["meta_accept_length"] is None and res["accept_length"] == 2.2


@pytest.mark.parametrize("info", [
    (200, server_info(None)),                  # speculation off: no avg_spec_accept_length
    (200, {"internal_states": None}),
    (200, {"internal_states": ["junk", {"avg_spec_accept_length": None}]}),
    (200, b"not json"),
    (500, {"detail": "boom"}),
])
def test_no_accept_length_anywhere_fails_a_positive_gate(server, run, info):
    server.generate = lambda index: (200, {"text": "x", "meta_info": meta(32)})
    server.info["/server_info"] = info
    res = run({"url": server.url, "requests": 1, "min_accept_length": 1.5})
    assert res["failed"] is True
    assert "reports no speculative accept length (is speculation off?); min_accept_length is 1.50" in res["msg"]
    assert res["accept_length"] is None and res["server_accept_length"] is None
    assert server.paths("GET") == ["/metrics", "/server_info"]   # only a 404 moves on to /get_server_info
    assert run({"url": server.url, "requests": 1})["failed"] is False   # gate off: passes


def test_both_info_endpoints_missing(server, run):
    server.info.clear()
    res = run({"url": server.url, "requests": 1})
    assert res["server_accept_length"] is None
    assert server.paths("GET") == ["/metrics", "/server_info", "/get_server_info"]


def test_failed_requests_fail_the_gate(server, run):
    def generate(index):
        if index % 2 == 0:
            return 503, {"error": {"message": "The server is shutting down", "code": 503}}
        return 200, {"text": "x", "meta_info": meta(64, 22)}

    server.generate = generate
    res = run({"url": server.url, "requests": 4, "concurrency": 1})
    assert res["failed"] is True
    assert res["requests"] == {"sent": 4, "ok": 2, "failed": 2}
    assert res["msg"].startswith("Smoke gate failed: 2 of 4 requests failed (request ")
    assert "HTTP 503" in res["msg"] and "shutting down" in res["msg"]
    assert res["completion_tokens"] == 128


def test_non_json_answer_counts_as_a_failure(server, run):
    server.generate = lambda index: (200, b"plain text")
    res = run({"url": server.url, "requests": 1})
    assert res["failed"] is True and "HTTP 200 plain text" in res["msg"]


def test_nothing_listening(run):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    res = run({"url": "http://127.0.0.1:%d" % port, "requests": 2, "concurrency": 4, "timeout": 5})
    assert res["failed"] is True
    assert res["requests"] == {"sent": 2, "ok": 0, "failed": 2}
    assert "refused" in res["msg"]
    assert res["tokens_per_s"] == 0.0 and res["server_accept_length"] is None


def test_run_timeout_leaves_requests_unsent(server, run):
    server.delay = 0.6
    began = time.monotonic()
    res = run({"url": server.url, "requests": 3, "concurrency": 1, "timeout": 0.3})
    assert res["failed"] is True
    assert res["requests"] == {"sent": 1, "ok": 0, "failed": 1} and res["requests_not_sent"] == 2
    assert res["budget_exhausted"] is True and res["hang"] is None   # cut by the budget, not a hang
    assert any("timeout" in e for e in res["errors"]), res["errors"]
    assert "the run's budget (timeout) ran out: 2 of 3 requests were not sent" in res["msg"]
    assert time.monotonic() - began < 15


def test_throughput_gate(server, run):
    res = run({"url": server.url, "requests": 1, "min_tokens_per_s": 1e9})
    assert res["failed"] is True
    assert "tok/s is below min_tokens_per_s 1000000000.0" in res["msg"]


@pytest.mark.parametrize("name", ["requests", "concurrency", "max_new_tokens"])
def test_counts_must_be_positive(run, name):
    res = run({"url": "http://127.0.0.1:1", name: 0})
    assert res["failed"] is True and res["msg"] == "%s must be at least 1, got 0" % name


def test_check_mode_is_skipped(server, run):
    res = run({"url": server.url}, check=True)
    assert res.get("skipped") is True
    assert server.requests == []


@pytest.mark.parametrize("name", ["timeout", "request_timeout", "metrics_interval"])
def test_durations_must_be_positive(run, name):
    res = run({"url": "http://127.0.0.1:1", name: 0})
    assert res["failed"] is True and res["msg"] == "%s must be a positive number of seconds, got 0.0" % name


def test_first_hang_names_its_request_and_stops_sending(server, run):
    # sglang#22779: the server answers 3 requests, then none; with 2 in flight, requests 4 and 5 hang.
    server.delays = lambda index: 3.0 if index > 3 else 0.0
    began = time.monotonic()
    res = run({"url": server.url, "requests": 10, "concurrency": 2, "request_timeout": 0.5, "timeout": 60})
    assert res["failed"] is True
    rid = res["hang"].pop("rid")
    assert res["hang"] == {"request": 4, "of": 10, "answered": 3, "timeout": 0.5, "hung": 2}
    assert re.match(r"^gpufleet-smoke-[0-9a-f]{12}-4$", rid), rid
    assert res["msg"] == ("Smoke gate failed: request 4 of 10 (rid %s) did not answer within 0.5 s "
                          "(3 answered before the run stopped)" % rid)
    rids = [r["body"]["rid"] for r in server.requests if r["method"] == "POST"]
    assert sorted(rids) == sorted(rid[:-1] + str(n) for n in range(1, 6))      # one id per request, one run prefix
    assert res["requests"] == {"sent": 5, "ok": 3, "failed": 2} and res["requests_not_sent"] == 5
    assert len(server.paths("POST")) == 5                      # nothing sent after the hang
    assert time.monotonic() - began < 20


def test_per_request_timeout_and_budget_are_separate(server, run):
    # Slow but answering within request_timeout: no hang, even though the run takes a while.
    server.delays = lambda index: 0.3
    res = run({"url": server.url, "requests": 3, "concurrency": 1, "request_timeout": 2, "timeout": 30})
    assert res["failed"] is False and res["hang"] is None and res["requests"]["ok"] == 3


LBL = 'model_name="m",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"'


def metrics_page(length, rate):
    return ("# TYPE sglang:spec_accept_length gauge\nsglang:spec_accept_length{%s} %s\n"
            "# TYPE sglang:spec_accept_rate gauge\nsglang:spec_accept_rate{%s} %s\n" % (LBL, length, LBL, rate))


def test_windowed_gauge_gates_over_meta_info(server, run):
    # meta_info says 2.9 (over the responses); the gauge reports made during the window say 1.66, 1.70.
    server.generate = lambda index: (200, {"text": "x", "meta_info": meta(58, 20)})
    server.delays = lambda index: 0.3
    server.metrics = lambda answered: metrics_page(2.95, 0.65) if answered < 2 else (
        metrics_page(1.66, 0.661) if answered < 4 else metrics_page(1.70, 0.70))
    res = run({"url": server.url, "requests": 6, "concurrency": 1, "metrics_interval": 0.05,
               "min_accept_length": 2.5})
    assert res["failed"] is True
    assert res["accept_length_source"] == "metrics" and res["metrics_available"] is True
    assert res["metrics_reports"] == 2
    assert res["metrics_accept_length"] == res["accept_length"] == 1.68
    assert res["metrics_accept_rate"] == 0.68
    assert res["meta_accept_length"] == 2.9                         # the cross-check is reported too
    assert res["msg"] == "Smoke gate failed: accept length 1.68 is below min_accept_length 2.50"
    meta_gated = run({"url": server.url, "requests": 2, "accept_length_source": "meta", "min_accept_length": 2.5})
    assert meta_gated["failed"] is False and meta_gated["accept_length_source"] == "meta"


def test_stale_gauge_is_not_a_measurement(server, run):
    # The gauge never changes during the window (too few decode iterations): auto falls back to
    # meta_info, metrics fails with the reason.
    server.metrics = lambda answered: metrics_page(2.95, 0.65)
    auto = run({"url": server.url, "requests": 2, "metrics_interval": 0.05, "min_accept_length": 2.5})
    assert auto["failed"] is False and auto["accept_length_source"] == "meta" and auto["metrics_reports"] == 0
    strict = run({"url": server.url, "requests": 2, "metrics_interval": 0.05, "min_accept_length": 2.5,
                  "accept_length_source": "metrics"})
    assert strict["failed"] is True and strict["accept_length"] is None
    assert "sglang:spec_accept_length made no report during the smoke window" in strict["msg"]


def test_metrics_source_without_metrics_endpoint(server, run):
    res = run({"url": server.url, "requests": 1, "min_accept_length": 2.0, "accept_length_source": "metrics"})
    assert res["failed"] is True and res["metrics_available"] is False
    assert "no sglang:spec_accept_length gauge (start it with --enable-metrics)" in res["msg"]
    assert server.paths("GET") == ["/metrics", "/server_info"]
