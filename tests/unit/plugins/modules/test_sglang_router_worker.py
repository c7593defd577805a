"""Unit tests for sglang_router_worker (logic in module_utils/router/workers.py, worker_list.py, client.py, load.py): the
pure helpers (URL normalisation, worker lists, API detection, the last-worker
check, load parsing from /v1/loads, /metrics and /get_load) and the module
flow in-process against small fake routers and a fake server, served from
threads on loopback (no processes).

The fake routers copy what the real binaries did when measured (docs/router.md):
smg 1.13.0 ("1": workers carry ``status``; DELETE -> draining for ``settle``
seconds, still counted in ``load``; 409 for a URL it already has; a failed
AddWorker job vanishes; ``/get_loads`` carries ``"version": "smg-1.13.0"``) and
sglang-router 0.3.2 ("0.3": ``is_healthy`` only, DELETE drops at once, a
repeated POST gives the same id). tests/integration/test_router_rolling.py runs
the real binaries."""
from __future__ import annotations

import http.server
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
import uuid
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils.common import wait
from ansible_collections.gpufleet.sglang.plugins.module_utils.router import client
from ansible_collections.gpufleet.sglang.plugins.module_utils.router import load
from ansible_collections.gpufleet.sglang.plugins.module_utils.router import worker_list
from ansible_collections.gpufleet.sglang.plugins.module_utils.router import workers as r
from ansible_collections.gpufleet.sglang.plugins.modules import sglang_router_worker as module

ROUTER_KEY = "rk-unit-51d0"
WORKER_KEY = "wk-unit-9e22"


# --------------------------------------------------------------------------
# Pure helpers
# --------------------------------------------------------------------------

@pytest.mark.parametrize("raw, expected", [
    ("http://10.0.0.1:30000", "http://10.0.0.1:30000"),
    ("http://10.0.0.1:30000/", "http://10.0.0.1:30000"),
    ("http://10.0.0.1:30000//", "http://10.0.0.1:30000"),
    ("HTTP://Node-A.Example:30000/", "http://node-a.example:30000"),
    ("node-a:30000", "http://node-a:30000"),
    ("  http://h:1  ", "http://h:1"),
    ("http://h:80/", "http://h"),
    ("https://h:443", "https://h"),
    ("https://h:8443/v1/", "https://h:8443/v1"),
    ("http://[::1]:30000/", "http://[::1]:30000"),
    ("http://[FE80::1]:30000", "http://[fe80::1]:30000"),
    ("http://h:1/?x=1#frag", "http://h:1"),
])
def test_normalize_url(raw, expected):
    assert worker_list.normalize_url(raw) == expected


@pytest.mark.parametrize("raw", ["", "   ", "http://:30000", "ftp://h:1", "http://h:notaport"])
def test_normalize_url_rejects(raw):
    with pytest.raises(ValueError):
        worker_list.normalize_url(raw)


def test_same_url():
    assert worker_list.same_url("http://H:1/", "h:1")
    assert not worker_list.same_url("http://h:1", "http://h:2")
    assert not worker_list.same_url("", "http://h:1")


ROUTER_03 = {
    "workers": [
        {"id": "67004696-985a-4e18-854b-9abdcbaa518b", "url": "http://127.0.0.1:41001", "model_id": "m", "priority": 50,
         "cost": 1.0, "worker_type": "regular", "is_healthy": True, "load": 3, "connection_mode": "HTTP",
         "metadata": {"model_path": "/m"}, "disable_health_check": False},
        {"id": "0bb65be2-4fa6-4b72-9bb2-5d84d730380f", "url": "http://127.0.0.1:41002/", "is_healthy": False, "load": 0},
        {"id": "b44bf9b1-2f11-4996-8a67-36b73a70e901", "url": "HTTP://127.0.0.1:41002", "is_healthy": True, "load": 1},
    ],
    "total": 3,
    "stats": {"prefill_count": 0, "decode_count": 0, "regular_count": 3},
}
# Trimmed from a real smg 1.13.0 answer (labels, models and engine_load shortened).
ROUTER_1 = {
    "workers": [
        {"id": "01a2333f-442d-727f-ab0d-fb460bf1a5fb", "model_id": "/models/qwen", "url": "http://127.0.0.1:50653",
         "worker_type": "regular", "connection_mode": "http", "runtime_type": "sglang", "priority": 50, "cost": 1.0,
         "is_healthy": True, "status": "ready", "load": 2, "labels": {"tp_size": "1"},
         "engine_load": {"loads": [{"dp_rank": 0, "num_running_reqs": 2, "num_waiting_reqs": 0}]}},
        {"id": "01a2333f-4505-7710-9dda-583dfab81cc1", "model_id": "/models/qwen", "url": "http://127.0.0.1:56765",
         "worker_type": "regular", "is_healthy": False, "status": "draining", "load": 6},
        {"id": "01a2333f-4505-7710-9dda-583dfab81cc2", "model_id": "/models/qwen", "url": "http://127.0.0.1:56766",
         "worker_type": "Decode", "is_healthy": False, "status": "FAILED"},
    ],
    "total": 3,
    "stats": {"prefill_count": 0, "decode_count": 1, "regular_count": 2},
}


def test_parse_workers_03():
    workers = worker_list.parse_workers(ROUTER_03, "0.3")
    assert workers[0] == {"id": "67004696-985a-4e18-854b-9abdcbaa518b", "url": "http://127.0.0.1:41001",
                          "status": "ready", "is_healthy": True, "load": 3, "model_id": "m", "worker_type": "regular"}
    assert [w["status"] for w in workers] == ["ready", "not_ready", "ready"]
    assert workers[1]["model_id"] is None and workers[1]["worker_type"] == "regular"


def test_parse_workers_1():
    workers = worker_list.parse_workers(ROUTER_1, "1")
    assert workers[0] == {"id": "01a2333f-442d-727f-ab0d-fb460bf1a5fb", "url": "http://127.0.0.1:50653",
                          "status": "ready", "is_healthy": True, "load": 2, "model_id": "/models/qwen",
                          "worker_type": "regular"}
    assert [(w["status"], w["load"], w["worker_type"]) for w in workers] == [
        ("ready", 2, "regular"), ("draining", 6, "regular"), ("failed", None, "decode")]


def test_parse_workers_01_shapes():
    assert worker_list.parse_workers({"urls": ["http://a:1", "http://b:2"]}, "0.1") == [
        {"id": None, "url": "http://a:1", "status": None, "is_healthy": None, "load": None, "model_id": None,
         "worker_type": "regular"},
        {"id": None, "url": "http://b:2", "status": None, "is_healthy": None, "load": None, "model_id": None,
         "worker_type": "regular"}]
    assert [w["url"] for w in worker_list.parse_workers(["http://a:1"], "0.1")] == ["http://a:1"]
    assert [w["url"] for w in worker_list.parse_workers({"workers": [{"url": "http://a:1"}, 7]}, "0.1")] == ["http://a:1"]


@pytest.mark.parametrize("data, version", [
    ({"urls": "x"}, "0.1"), ("text", "0.1"), ({"workers": None}, "0.3"), ([], "0.3"), ({"workers": {}}, "1"),
])
def test_parse_workers_rejects(data, version):
    with pytest.raises(ValueError):
        worker_list.parse_workers(data, version)


def test_find_workers_matches_every_spelling():
    workers = worker_list.parse_workers(ROUTER_03, "0.3")
    found = worker_list.find_workers(workers, "http://127.0.0.1:41002")
    assert [w["id"] for w in found] == ["0bb65be2-4fa6-4b72-9bb2-5d84d730380f", "b44bf9b1-2f11-4996-8a67-36b73a70e901"]
    assert [w["id"] for w in worker_list.find_workers(workers, "127.0.0.1:41001/")] == ["67004696-985a-4e18-854b-9abdcbaa518b"]
    assert worker_list.find_workers(workers, "http://127.0.0.1:41003") == []


def _w(url, status="ready", model="m", role="regular"):
    return {"id": None, "url": url, "status": status, "is_healthy": status == "ready", "load": 0, "model_id": model,
            "worker_type": role}


def test_ready_peers_same_model_and_role_only():
    me = _w("http://a:1")
    workers = [me, _w("http://a:1/", "ready"), _w("http://b:1", "pending"), _w("http://c:1", "not_ready"),
               _w("http://d:1", "draining"), _w("http://e:1", model="other"), _w("http://f:1", role="decode")]
    assert worker_list.ready_peers(workers, "http://a:1", me, "1") == []
    workers.append(_w("http://g:1"))
    assert [w["url"] for w in worker_list.ready_peers(workers, "http://a:1", me, "1")] == ["http://g:1"]
    # 0.1 reports neither health nor model: every other listed URL counts.
    plain = [{"url": u, "status": None, "model_id": None, "worker_type": "regular"} for u in ("http://a:1", "http://b:1")]
    assert [w["url"] for w in worker_list.ready_peers(plain, "http://a:1", plain[0], "0.1")] == ["http://b:1"]
    assert worker_list.is_ready(plain[0], "0.1") and not worker_list.is_ready(_w("x", "failed"), "1")


def test_detect_api_version():
    one = {"workers": [{"url": "http://a:1", "status": "ready", "is_healthy": True}]}
    three = {"workers": [{"url": "http://a:1", "is_healthy": True}]}
    empty = {"workers": [], "total": 0}
    assert client.detect_api_version((200, one)) == "1"
    assert client.detect_api_version((200, three)) == "0.3"
    assert client.detect_api_version((200, empty)) is None
    assert client.detect_api_version((200, empty), loads_probe=(200, {"version": "smg-1.13.0", "loads": []})) == "1"
    assert client.detect_api_version((200, empty), loads_probe=(200, {"workers": []})) == "0.3"
    assert client.detect_api_version((200, empty), loads_probe=(404, "")) == "0.3"
    assert client.detect_api_version((404, "Not Found")) is None
    assert client.detect_api_version((404, ""), (200, {"urls": []})) == "0.1"
    with pytest.raises(worker_list.RouterError, match="api_key"):
        client.detect_api_version((401, ""))
    with pytest.raises(worker_list.RouterError, match="api_key"):
        client.detect_api_version((404, ""), (403, ""))
    with pytest.raises(worker_list.RouterError, match="list_workers"):
        client.detect_api_version((404, ""), (500, "boom"))
    with pytest.raises(worker_list.RouterError, match="api_version"):
        client.detect_api_version((200, {"something": "else"}))
    with pytest.raises(worker_list.RouterError, match="HTTP 502"):
        client.detect_api_version((502, "bad gateway"))


V1_LOADS = {
    "timestamp": "2026-11-30T13:00:00+00:00", "version": "0.5.23", "accelerator": "NVIDIA H200", "num_accelerators": 8,
    "loads": [
        {"dp_rank": 0, "num_running_reqs": 3, "num_waiting_reqs": 2, "num_used_tokens": 100, "token_usage": 0.1,
         "queues": {"waiting": 2, "grammar": 1, "paused": 0, "retracted": 0}},
        {"dp_rank": 1, "num_running_reqs": 1, "num_waiting_reqs": 0,
         "disaggregation": {"mode": "decode", "decode_prealloc_queue_reqs": 2, "decode_transfer_queue_reqs": 1}},
    ],
}


def test_load_from_v1_loads():
    assert load.load_from_v1_loads(V1_LOADS) == 3 + 2 + 1 + 1 + 2 + 1
    assert load.load_from_v1_loads({"loads": [{"dp_rank": 0, "num_running_reqs": 0, "num_waiting_reqs": 0}]}) == 0
    assert load.load_from_v1_loads([{"num_running_reqs": 2}]) == 2
    assert load.load_from_v1_loads({"loads": []}) is None
    assert load.load_from_v1_loads({"loads": [{"dp_rank": 0}]}) is None
    assert load.load_from_v1_loads({"loads": [{"num_running_reqs": True}, "x"]}) is None
    assert load.load_from_v1_loads("text") is None
    assert load.load_from_v1_loads({"loads": [{"num_running_reqs": 2.0}]}) == 2
    assert load.load_from_v1_loads({"loads": [{"num_running_reqs": float("inf")}]}) is None


METRICS = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 4.0
sglang:num_running_reqs{engine_type="unified",model_name="m",pp_rank="0",tp_rank="1"} 4.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 2.0
sglang:num_queue_reqs{model_name="m",dp_rank="1",tp_rank="0"} 1
sglang:num_used_tokens{model_name="m",tp_rank="0"} 999.0
sglang:gen_throughput{model_name="m"} NaN
garbage line
sglang:num_running_reqs{model_name="m",dp_rank="1",tp_rank="0"} not-a-number
"""


def test_parse_metrics():
    samples = load.parse_metrics(METRICS)
    assert ("sglang:num_used_tokens", {"model_name": "m", "tp_rank": "0"}, 999.0) in samples
    assert "garbage" not in [s[0] for s in samples]


def test_load_from_metrics():
    # tp_rank 1 repeats tp_rank 0's requests and is skipped.
    assert load.load_from_metrics(METRICS) == 4 + 2 + 1
    assert load.load_from_metrics("sglang:num_running_reqs 0\nsglang:num_queue_reqs 0.0\n") == 0
    assert load.load_from_metrics("sglang:num_running_reqs NaN\n") is None
    assert load.load_from_metrics("sglang:num_running_reqs +Inf\n") is None
    assert load.load_from_metrics("# nothing\nsglang:token_usage 0.5\n") is None
    assert load.load_from_metrics("") is None


def test_load_from_get_load():
    assert load.load_from_get_load([{"dp_rank": 0, "num_reqs": 5, "num_waiting_reqs": 2, "num_tokens": 10},
                                    {"dp_rank": 1, "num_reqs": 1, "num_waiting_reqs": 0}]) == 6
    assert load.load_from_get_load({"num_running_reqs": 1, "num_waiting_reqs": 1}) == 2
    assert load.load_from_get_load([{"dp_rank": 0}]) is None
    assert load.load_from_get_load("x") is None


def test_request_timeouts_stay_inside_the_deadline_and_never_reach_zero():
    d = wait.Deadline(0.2)
    assert 0 < r._request_timeout(d, 10) <= 0.2
    assert r._request_timeout(wait.Deadline(0), 5) == 0.05      # urllib's timeout 0 would not wait at all


def test_describe_truncates():
    assert worker_list.describe("x" * 1000).endswith("...")
    assert worker_list.describe({"a": 1}) == "{'a': 1}"


def test_module_uses_the_shared_argument_spec():
    assert module.argument_spec is r.argument_spec
    spec = r.argument_spec()
    assert spec["api_version"]["choices"] == ["auto", "1", "0.3", "0.1"]
    assert spec["allow_last"] == {"type": "bool", "default": False}
    assert spec["api_key"]["no_log"] is True and spec["worker_api_key"]["no_log"] is True
    for name, opt in spec.items():
        assert "type" in opt, name


# --------------------------------------------------------------------------
# Fakes: a router (smg 1.x, 0.3 or 0.1 API) and a server, on loopback threads
# --------------------------------------------------------------------------

class _Base(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, code, body=None, ctype="application/json"):
        if isinstance(body, (dict, list)):
            raw = json.dumps(body).encode()
        else:
            raw = (body or "").encode()
            if ctype == "application/json" and not raw:
                ctype = "text/plain"
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        return json.loads(raw) if raw else None


class FakeRouter(object):
    """State of a fake router; ``api`` is "1" (smg 1.x), "0.3" or "0.1"."""

    def __init__(self, api="0.3", api_key=None, add_delay=0.0, healthy_after=0.0, fail_add=None, ignore_delete=False,
                 settle=0.0, model="m", list_after=0.0, stall_list_after_add=0.0):
        self.api = api
        self.stall_list_after_add = stall_list_after_add  # seconds every GET /workers hangs once an add came in
        self.list_after = list_after        # seconds between a finished AddWorker job and the worker's listing
        self.api_key = api_key
        self.add_delay = add_delay          # seconds before a queued add shows up
        self.healthy_after = healthy_after  # seconds after listing until healthy (0.3) / ready (1: pending before)
        self.fail_add = fail_add            # message of a failing AddWorker job (1: the job just vanishes)
        self.ignore_delete = ignore_delete  # accept DELETE but never remove
        self.settle = settle                # smg 1.x: seconds a removed worker stays "draining"
        self.model = model
        self.workers = {}                   # id -> {"url", "since", "api_key", "status", "load", "gone_at", ...}
        self.jobs = {}                      # id -> {"url", "status", "message", "at", "api_key"}
        self.calls = []                     # (method, path, body, authorization)
        self.lock = threading.Lock()

    def add_existing(self, url, healthy=True, status=None, load=0, model=None, worker_type="regular"):
        wid = str(uuid.uuid4())
        self.workers[wid] = {"url": url, "since": time.monotonic() - (0 if healthy else -3600), "api_key": None,
                             "status": status or ("ready" if healthy else "not_ready"), "load": load,
                             "gone_at": None, "model": model or self.model, "worker_type": worker_type}
        return wid

    def _promote(self):
        now = time.monotonic()
        for wid, job in list(self.jobs.items()):
            if job["status"] == "processing" and now >= job["at"]:
                if self.fail_add:
                    if self.api == "1":
                        del self.jobs[wid]
                    else:
                        job.update(status="failed", message=self.fail_add)
                else:
                    self.workers[wid] = {"url": job["url"], "since": now, "api_key": job["api_key"], "status": "pending",
                                         "load": 0, "gone_at": None, "model": self.model,
                                         "worker_type": job["worker_type"], "listed_at": now + self.list_after}
                    del self.jobs[wid]
        for wid, w in list(self.workers.items()):
            if w["gone_at"] is not None and now >= w["gone_at"]:
                del self.workers[wid]
            elif w["status"] == "pending" and now - w["since"] >= self.healthy_after:
                w["status"] = "ready"

    def listing(self):
        now = time.monotonic()
        out = []
        for wid, w in self.workers.items():
            if w.get("listed_at", 0) > now:
                continue
            item = {"id": wid, "url": w["url"], "model_id": w["model"], "load": w["load"], "worker_type": w["worker_type"]}
            if self.api == "1":
                item.update(status=w["status"], is_healthy=w["status"] == "ready")
            else:
                item["is_healthy"] = w["status"] != "not_ready" and now - w["since"] >= self.healthy_after
            out.append(item)
        return out

    def handler(self):
        router = self

        class H(_Base):
            def _auth(self):
                if router.api_key and self.headers.get("Authorization") != "Bearer %s" % router.api_key:
                    self.reply(401, "")
                    return False
                return True

            def _record(self, body=None):
                router.calls.append((self.command, self.path, body, self.headers.get("Authorization")))

            def do_GET(self):
                self._record()
                if not self._auth():
                    return
                path = urlsplit(self.path).path
                if path == "/workers" and router.stall_list_after_add and router.jobs:
                    time.sleep(router.stall_list_after_add)
                with router.lock:
                    router._promote()
                    if router.api in ("1", "0.3"):
                        if path == "/workers":
                            return self.reply(200, {"workers": router.listing(), "total": len(router.workers), "stats": {}})
                        if path == "/get_loads":
                            if router.api == "1":
                                return self.reply(200, {"version": "smg-1.13.0", "dp_rank_count": 0, "loads": []})
                            return self.reply(200, {"workers": []})
                        if path.startswith("/workers/"):
                            wid = path.split("/", 2)[2]
                            for w in router.listing():
                                if w["id"] == wid:
                                    return self.reply(200, w)
                            if wid in router.jobs:
                                job = router.jobs[wid]
                                return self.reply(200, {"id": wid, "url": job["url"], "is_healthy": False, "job_status": {
                                    "job_type": "AddWorker", "status": job["status"], "message": job["message"]}})
                            return self.reply(404, {"error": "Worker %s not found" % wid, "code": "WORKER_NOT_FOUND"})
                    elif path == "/list_workers":
                        return self.reply(200, {"urls": [w["url"] for w in router.workers.values()]})
                return self.reply(404, "")

            def do_POST(self):
                body = self.body()
                self._record(body)
                if not self._auth():
                    return
                parts = urlsplit(self.path)
                with router.lock:
                    router._promote()
                    if router.api in ("1", "0.3") and parts.path == "/workers":
                        for wid, w in router.workers.items():
                            if w["url"] == body["url"]:
                                if router.api == "1":
                                    return self.reply(409, {"error": "Worker already exists at URL '%s' with ID %s"
                                                            % (w["url"], wid), "code": "WORKER_ALREADY_EXISTS"})
                                return self.reply(202, {"status": "accepted", "worker_id": wid})
                        wid = str(uuid.uuid4())
                        router.jobs[wid] = {"url": body["url"], "status": "processing", "message": None,
                                            "at": time.monotonic() + router.add_delay, "api_key": body.get("api_key"),
                                            "worker_type": body.get("worker_type", "regular")}
                        return self.reply(202, {"status": "accepted", "worker_id": wid, "url": body["url"],
                                                "location": "/workers/%s" % wid})
                    if router.api == "0.1" and parts.path in ("/add_worker", "/remove_worker"):
                        url = parse_qs(parts.query).get("url", [""])[0]
                        if not url:
                            return self.reply(400, "Worker URL required. Provide 'url' query parameter")
                        if parts.path == "/add_worker":
                            router.add_existing(url)
                            return self.reply(200, "Successfully added worker: %s" % url)
                        for wid, w in list(router.workers.items()):
                            if w["url"] == url:
                                del router.workers[wid]
                                return self.reply(200, "Successfully removed worker: %s" % url)
                        return self.reply(404, "Worker %s not found" % url)
                return self.reply(404, "")

            def do_DELETE(self):
                self._record()
                if not self._auth():
                    return
                path = urlsplit(self.path).path
                with router.lock:
                    router._promote()
                    if router.api in ("1", "0.3") and path.startswith("/workers/"):
                        wid = unquote(path.split("/", 2)[2])
                        try:
                            uuid.UUID(wid)
                        except ValueError:
                            return self.reply(400, {"error": "Invalid worker_id '%s' (expected UUID)" % wid})
                        if wid not in router.workers:
                            return self.reply(404, {"error": "Worker %s not found" % wid, "code": "WORKER_NOT_FOUND"})
                        w = router.workers[wid]
                        if router.ignore_delete:
                            pass
                        elif router.api == "1" and w["status"] != "failed" and router.settle > 0:
                            w["status"] = "draining"
                            if w["gone_at"] is None:
                                w["gone_at"] = time.monotonic() + router.settle
                        else:
                            del router.workers[wid]
                        return self.reply(202, {"status": "accepted", "worker_id": wid})
                return self.reply(404, "")

        return H


class FakeWorker(object):
    """A server whose load and health the test controls; ``endpoints`` selects what it serves."""

    def __init__(self, endpoints=("/v1/loads", "/health"), api_key=None, loads=(0,), health=(200,)):
        self.endpoints = endpoints
        self.api_key = api_key
        self.loads = list(loads)    # successive load readings; the last one repeats
        self.health = list(health)  # successive /health codes; the last one repeats
        self.reads = 0
        self.health_reads = 0
        self.auth_seen = []

    def next_load(self):
        self.reads += 1
        return self.loads.pop(0) if len(self.loads) > 1 else self.loads[0]

    def handler(self):
        worker = self

        class H(_Base):
            def do_GET(self):
                path = urlsplit(self.path).path
                worker.auth_seen.append(self.headers.get("Authorization"))
                if path not in worker.endpoints:
                    return self.reply(404, {"detail": "Not Found"})
                if path == "/health":
                    worker.health_reads += 1
                    code = worker.health.pop(0) if len(worker.health) > 1 else worker.health[0]
                    return self.reply(code, "")
                if path != "/metrics" and worker.api_key and self.headers.get("Authorization") != "Bearer %s" % worker.api_key:
                    return self.reply(401, {"error": "Unauthorized"})
                if path in ("/model_info", "/get_model_info"):
                    return self.reply(200, {"model_path": "/m"})
                load = worker.next_load()
                if path == "/v1/loads":
                    return self.reply(200, {"loads": [{"dp_rank": 0, "num_running_reqs": load, "num_waiting_reqs": 0}]})
                if path == "/metrics":
                    return self.reply(200, "sglang:num_running_reqs{tp_rank=\"0\"} %d\nsglang:num_queue_reqs{tp_rank=\"0\"} 0\n"
                                      % load, ctype="text/plain; version=0.0.4")
                return self.reply(200, [{"dp_rank": 0, "num_reqs": load, "num_waiting_reqs": 0, "num_tokens": 0}])

        return H


@pytest.fixture
def serve():
    servers = []

    def start(fake):
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), fake.handler())
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        servers.append(srv)
        return "http://127.0.0.1:%d" % srv.server_address[1]

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def _closed_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class _Exit(Exception):
    def __init__(self, result):
        super().__init__(result.get("msg", ""))
        self.result = result


class _Fail(_Exit):
    pass


class FakeModule(object):
    def __init__(self, params, check_mode=False, diff=False):
        defaults = dict((k, v.get("default")) for k, v in r.argument_spec().items())
        self.params = dict(defaults, **params)
        self.check_mode = check_mode
        self._diff = diff
        self.warnings = []

    def warn(self, msg):
        self.warnings.append(msg)

    def fail_json(self, **kwargs):
        raise _Fail(dict(kwargs, failed=True))

    def exit_json(self, **kwargs):
        raise _Exit(kwargs)


FAST = {"poll_interval": 0.02, "drain_settle": 0.0, "request_timeout": 2}


def run(params, check_mode=False, diff=False, expect_fail=False):
    mod = FakeModule(dict(FAST, **params), check_mode=check_mode, diff=diff)
    with pytest.raises(_Exit) as info:
        r.RouterWorker(mod).run()
    result = info.value.result
    assert isinstance(info.value, _Fail) == expect_fail, result
    result["_warnings"] = mod.warnings
    return result


def _no_secret(result, *secrets):
    text = json.dumps(result, default=str)
    for secret in secrets:
        assert secret not in text


def _calls(router, method):
    return [c for c in router.calls if c[0] == method]


# --------------------------------------------------------------------------
# present
# --------------------------------------------------------------------------

@pytest.mark.parametrize("api", ["1", "0.3"])
def test_present_adds_waits_and_is_idempotent(serve, api):
    router = FakeRouter(api=api, api_key=ROUTER_KEY, add_delay=0.15, healthy_after=0.1)
    router.add_existing("http://127.0.0.1:41001")
    server = FakeWorker(endpoints=("/health", "/model_info"), health=(503, 503, 200))
    url = serve(server)
    base = serve(router)
    args = {"router_url": base + "/", "url": url.upper() + "/", "api_key": ROUTER_KEY, "worker_api_key": WORKER_KEY}
    res = run(args, diff=True)
    assert res["changed"] is True and res["reregistered"] is False
    assert res["api_version"] == api
    assert res["url"] == url
    assert res["worker"]["url"] == url and res["worker"]["status"] == "ready" and res["worker"]["is_healthy"] is True
    assert sorted(res["workers"]) == sorted(["http://127.0.0.1:41001", url])
    assert res["diff"]["before"]["workers"] == ["http://127.0.0.1:41001"]
    # Registered only once the server answered /health with 200 (two 503 first).
    assert server.health_reads == 3
    posts = _calls(router, "POST")
    assert len(posts) == 1
    # The normalised URL is registered, the worker key travels in the body only.
    assert posts[0][2] == {"url": url, "api_key": WORKER_KEY}
    assert all(c[3] == "Bearer %s" % ROUTER_KEY for c in router.calls if c[3] is not None)
    # smg 1.x only: one keyless GET /workers tells whether the router has a key (then it forwards that key).
    assert [c[1] for c in router.calls if c[3] is None] == (["/workers"] if api == "1" else [])
    _no_secret(res, ROUTER_KEY, WORKER_KEY)

    again = run(args)
    assert again["changed"] is False and "reregistered" not in again
    assert len(_calls(router, "POST")) == 1


def test_detects_smg1_on_an_empty_router(serve):
    router = FakeRouter(api="1")
    base = serve(router)
    res = run({"router_url": base, "url": "http://127.0.0.1:41002", "state": "absent"})
    assert res["api_version"] == "1" and res["changed"] is False
    assert [c[1] for c in router.calls][:2] == ["/workers", "/get_loads"]
    router03 = FakeRouter(api="0.3")
    res = run({"router_url": serve(router03), "url": "http://127.0.0.1:41002", "state": "absent"})
    assert res["api_version"] == "0.3"
    # A forced api_version skips the probes.
    res = run({"router_url": base, "url": "http://127.0.0.1:41002", "state": "absent", "api_version": "1"})
    assert res["api_version"] == "1" and router.calls[-1][1] == "/workers" and len(router.calls) == 4


def test_present_check_mode_sends_nothing(serve):
    router = FakeRouter()
    base = serve(router)
    res = run({"router_url": base, "url": "http://127.0.0.1:%d" % _closed_port()}, check_mode=True, diff=True)
    assert res["changed"] is True
    assert res["worker"] is None
    assert res["workers"] == [res["url"]]
    assert res["diff"] == {"before": {"workers": []}, "after": {"workers": [res["url"]]}}
    assert [c[1] for c in router.calls] == ["/workers", "/get_loads", "/workers"]   # probes + list


def test_present_worker_config_and_no_wait(serve):
    router = FakeRouter(healthy_after=30)
    base = serve(router)
    res = run({"router_url": base, "url": "http://127.0.0.1:41002", "wait_healthy": False, "wait_server": False,
               "api_version": "0.3", "worker_config": {"model_id": "m", "priority": 10}})
    assert res["changed"] is True
    assert res["worker"]["is_healthy"] is False
    assert _calls(router, "POST")[0][2] == {"model_id": "m", "priority": 10, "url": "http://127.0.0.1:41002"}


def test_present_waits_for_a_healthy_server_and_gives_up(serve):
    router = FakeRouter(api="1")
    server = FakeWorker(endpoints=("/health",), health=(503,))
    url = serve(server)
    res = run({"router_url": serve(router), "url": url, "timeout": 0.3}, expect_fail=True)
    assert "%s/health did not answer 200" % url in res["msg"] and "HTTP 503" in res["msg"]
    assert "wait_server=false" in res["msg"]
    assert not _calls(router, "POST")
    res = run({"router_url": serve(router), "url": "http://127.0.0.1:%d" % _closed_port(), "timeout": 0.2},
              expect_fail=True)
    assert "refused" in res["msg"]


@pytest.mark.parametrize("api, status", [("1", "failed"), ("1", "not_ready"), ("0.3", None)])
def test_present_replaces_a_stale_entry(serve, api, status):
    router = FakeRouter(api=api, settle=0.2)
    server = FakeWorker(endpoints=("/health",))
    url = serve(server)
    old = router.add_existing(url, healthy=False, status=status)
    res = run({"router_url": serve(router), "url": url})
    assert res["changed"] is True and res["reregistered"] is True
    assert res["worker"]["status"] == "ready" and res["worker"]["id"] != old
    assert [c[0] for c in router.calls if c[0] != "GET"] == ["DELETE", "POST"]


def test_present_waits_out_a_draining_entry(serve):
    router = FakeRouter(api="1", settle=0.3)
    url = serve(FakeWorker())
    wid = router.add_existing(url, status="draining")
    router.workers[wid]["gone_at"] = time.monotonic() + 0.3
    res = run({"router_url": serve(router), "url": url})
    assert res["changed"] is True and res["reregistered"] is True
    assert [c[0] for c in router.calls if c[0] != "GET"] == ["POST"]   # no 409: posted after the entry was gone
    assert res["worker"]["status"] == "ready"


def test_present_waits_for_a_pending_member(serve):
    router = FakeRouter(api="1", healthy_after=0.2)
    url = serve(FakeWorker())
    wid = router.add_existing(url, status="pending")
    router.workers[wid]["since"] = time.monotonic()
    res = run({"router_url": serve(router), "url": url})
    assert res["changed"] is False and res["worker"]["status"] == "ready"
    assert not _calls(router, "POST")


def test_present_a_listing_cut_short_by_the_end_of_the_wait_says_what_it_last_saw(serve):
    # The last read's timeout is the time left; when the budget ends during it, the worker is reported not Ready with
    # what the router last showed, not as a router that cannot be reached.
    router = FakeRouter(api="1", add_delay=60, stall_list_after_add=10)
    res = run({"router_url": serve(router), "url": "http://127.0.0.1:41009", "timeout": 2, "wait_server": False},
              expect_fail=True)
    assert "is not Ready in the router" in res["msg"] and "cut short by the end of the wait" in res["msg"], res["msg"]
    assert "cannot reach the router" not in res["msg"]


def test_present_failed_job_fails_with_router_message(serve):
    router = FakeRouter(fail_add="Both HTTP and gRPC health checks failed for http://127.0.0.1:41009")
    res = run({"router_url": serve(router), "url": "http://127.0.0.1:41009", "timeout": 5, "wait_server": False},
              expect_fail=True)
    assert "could not add http://127.0.0.1:41009" in res["msg"]
    assert "health checks failed" in res["msg"]


def test_present_smg1_dropped_job_fails_after_the_grace_not_the_timeout(serve):
    # A job that is gone while the worker is not listed counts as dropped after JOB_GONE_GRACE_S (5 s): behind a
    # real SGLang server (/health takes 1 s or more) a job that succeeded is gone for 1-2 s before the listing.
    router = FakeRouter(api="1", fail_add="x", add_delay=0.05)
    res = run({"router_url": serve(router), "url": "http://127.0.0.1:41009", "timeout": 60, "wait_server": False},
              expect_fail=True)
    assert "dropped the AddWorker job" in res["msg"] and 5.0 <= res["elapsed"] < 30


def test_present_a_job_gone_before_the_listing_is_not_dropped(serve):
    # The job ends before the router lists the worker (its health check takes a while): no failure.
    router = FakeRouter(api="1", healthy_after=0.2, list_after=2.0)
    res = run({"router_url": serve(router), "url": "http://127.0.0.1:41009", "timeout": 30, "wait_server": False})
    assert res["changed"] is True and res["worker"]["status"] == "ready"


def test_present_times_out_while_job_pending(serve):
    router = FakeRouter(add_delay=30)
    # A budget that leaves room for the job's status read under load (the request timeouts come out of it: with 0.3 s
    # the module's first read could time out on a loaded machine, and it failed without having seen the job; with 3 s
    # the first listing of the in-process fake router took longer than that in the clean-clone run at load 16).
    res = run({"router_url": serve(router), "url": "http://127.0.0.1:41009", "timeout": 8, "wait_server": False},
              expect_fail=True)
    assert "not Ready" in res["msg"] and "AddWorker job processing" in res["msg"]


def test_present_refuses_a_worker_that_needs_a_key(serve):
    router = FakeRouter()
    worker = FakeWorker(endpoints=("/model_info", "/health"), api_key=WORKER_KEY)
    base = serve(router)
    wbase = serve(worker)
    res = run({"router_url": base, "url": wbase}, expect_fail=True)
    assert "requires an API key" in res["msg"] and "worker_api_key is not set" in res["msg"]
    res = run({"router_url": base, "url": wbase, "worker_api_key": "wrong-key-123"}, expect_fail=True)
    assert "rejects worker_api_key" in res["msg"]
    _no_secret(res, "wrong-key-123")
    assert not _calls(router, "POST")
    res = run({"router_url": base, "url": wbase, "worker_api_key": WORKER_KEY})
    assert res["changed"] is True
    assert [c[2] for c in _calls(router, "POST")] == [{"url": wbase, "api_key": WORKER_KEY}]
    # Old servers: /model_info is 404, /get_model_info answers.
    old = FakeWorker(endpoints=("/get_model_info", "/health"), api_key=WORKER_KEY)
    res = run({"router_url": base, "url": serve(old)}, expect_fail=True)
    assert "/get_model_info" in res["msg"]


def test_present_smg1_keyed_router_needs_a_server_that_takes_its_key(serve):
    router = FakeRouter(api="1", api_key=ROUTER_KEY)
    base = serve(router)
    other = FakeWorker(endpoints=("/model_info", "/health"), api_key=WORKER_KEY)
    res = run({"router_url": base, "api_key": ROUTER_KEY, "url": serve(other), "worker_api_key": WORKER_KEY},
              expect_fail=True)
    assert "rejects the router's api_key" in res["msg"] and "smg 1.x sends the caller's Authorization header" in res["msg"]
    assert not _calls(router, "POST")
    assert "Bearer %s" % ROUTER_KEY in other.auth_seen and "Bearer %s" % WORKER_KEY not in other.auth_seen
    _no_secret(res, ROUTER_KEY, WORKER_KEY)
    same = FakeWorker(endpoints=("/model_info", "/health"), api_key=ROUTER_KEY)
    res = run({"router_url": base, "api_key": ROUTER_KEY, "url": serve(same), "worker_api_key": WORKER_KEY})
    assert res["changed"] is True
    # A keyless smg router passes the worker's own key: the usual check applies.
    open_router = FakeRouter(api="1")
    res = run({"router_url": serve(open_router), "api_key": ROUTER_KEY, "url": serve(other)}, expect_fail=True)
    assert "worker_api_key is not set" in res["msg"]


# --------------------------------------------------------------------------
# absent
# --------------------------------------------------------------------------

def test_absent_removes_every_spelling_and_drains(serve):
    router = FakeRouter(api_key=ROUTER_KEY)
    router.add_existing("http://127.0.0.1:41001")
    router.add_existing("http://127.0.0.1:41002/")
    router.add_existing("http://127.0.0.1:41002")
    worker = FakeWorker(api_key=WORKER_KEY, loads=(3, 1, 0))
    wbase = serve(worker)
    base = serve(router)
    res = run({"router_url": base, "url": wbase.replace("127.0.0.1", "localhost"), "drain_url": wbase,
               "api_key": ROUTER_KEY, "worker_api_key": WORKER_KEY, "state": "absent", "drain": True}, diff=True)
    # The worker URL does not match any entry (localhost vs 127.0.0.1): nothing removed, but the drain ran.
    assert res["changed"] is False and res["removed"] == []
    assert res["load"] == 0 and res["load_source"] == "/v1/loads" and res["drained_s"] is not None
    assert res["initial_load"] == 3
    assert worker.reads == 3

    res = run({"router_url": base, "url": "http://127.0.0.1:41002", "api_key": ROUTER_KEY, "state": "absent"}, diff=True)
    assert res["changed"] is True
    assert len(res["removed"]) == 2 and res["ready_peers"] == 1
    assert res["workers"] == ["http://127.0.0.1:41001"]
    assert res["diff"]["after"]["workers"] == ["http://127.0.0.1:41001"]
    assert res["drained_s"] is None
    assert len(_calls(router, "DELETE")) == 2
    _no_secret(res, ROUTER_KEY, WORKER_KEY)

    again = run({"router_url": base, "url": "http://127.0.0.1:41002", "api_key": ROUTER_KEY, "state": "absent"})
    assert again["changed"] is False and again["worker"] is None


def test_absent_smg1_waits_for_the_settle_and_reports_the_router_load(serve):
    router = FakeRouter(api="1", settle=0.3)
    router.add_existing("http://127.0.0.1:41001")
    wid = router.add_existing("http://127.0.0.1:41002", load=4)
    base = serve(router)
    res = run({"router_url": base, "url": "http://127.0.0.1:41002", "state": "absent"})
    assert res["changed"] is True and res["removed"][0]["id"] == wid
    assert res["router_load"] == 4          # still counted while draining
    assert res["settle_s"] >= 0.25
    assert res["workers"] == ["http://127.0.0.1:41001"]
    # Run again while an entry drains: nothing more is sent, the module waits it out.
    wid2 = router.add_existing("http://127.0.0.1:41003", status="draining")
    router.workers[wid2]["gone_at"] = time.monotonic() + 0.2
    res = run({"router_url": base, "url": "http://127.0.0.1:41003", "state": "absent"})
    assert res["changed"] is False and res["removed"] == [] and len(_calls(router, "DELETE")) == 1


def test_absent_check_readd_refuses_a_new_server_key_a_keyed_smg1_router_cannot_pass(serve):
    """The redeploy's removal (check_readd) refuses, before anything is changed, a new server whose key is not
    the router's: smg 1.x would send the router's key to it (state=present probes the same rule, after the outage)."""
    router = FakeRouter(api="1", api_key=ROUTER_KEY)
    router.add_existing("http://127.0.0.1:41001")
    router.add_existing("http://127.0.0.1:41002")
    base = serve(router)
    args = {"router_url": base, "api_key": ROUTER_KEY, "url": "http://127.0.0.1:41002", "state": "absent",
            "check_readd": True, "worker_api_key": WORKER_KEY}
    for check in (True, False):
        res = run(args, check_mode=check, expect_fail=True)
        assert "has another API key than the router" in res["msg"], res["msg"]
        assert "smg 1.x sends the caller's Authorization header" in res["msg"]
        assert res["msg"].endswith("Nothing was touched: http://127.0.0.1:41002 is still in the router and the old "
                                   "server serves."), res["msg"]
        _no_secret(res, ROUTER_KEY, WORKER_KEY)
    assert not _calls(router, "DELETE") and len(router.workers) == 2
    # Without check_readd (a plain removal), or with the router's key on the new server, the removal goes on.
    res = run(dict(args, worker_api_key=ROUTER_KEY))
    assert res["changed"] is True and len(_calls(router, "DELETE")) == 1
    router.add_existing("http://127.0.0.1:41002")
    res = run(dict(args, check_readd=False))
    assert res["changed"] is True and len(_calls(router, "DELETE")) == 2


@pytest.mark.parametrize("role, refused", [("decode", True), ("prefill", True), ("regular", False), (None, False)])
def test_absent_check_readd_refuses_a_keyed_pd_server_behind_a_keyless_smg1_router(serve, role, refused):
    router = FakeRouter(api="1")
    router.add_existing("http://127.0.0.1:41001", worker_type=role or "regular")
    router.add_existing("http://127.0.0.1:41002", worker_type=role or "regular")
    base = serve(router)
    config = {"worker_type": role, "bootstrap_port": 8998} if role == "prefill" else ({"worker_type": role} if role else {})
    args = {"router_url": base, "url": "http://127.0.0.1:41002", "state": "absent", "check_readd": True,
            "worker_api_key": WORKER_KEY, "worker_config": config}
    res = run(args, expect_fail=refused)
    if refused:
        assert "the %s server this redeploy starts has an API key" % role in res["msg"], res["msg"]
        assert "In PD mode smg 1.x sends the caller's Authorization header" in res["msg"]
        assert "Nothing was touched" in res["msg"] and not _calls(router, "DELETE")
        _no_secret(res, WORKER_KEY)
        # A keyless PD server is fine behind a keyless router.
        res = run(dict(args, worker_api_key=None))
    assert res["changed"] is True and len(_calls(router, "DELETE")) == 1


@pytest.mark.parametrize("api", ["0.3", "0.1"])
def test_absent_check_readd_applies_to_smg1_only(serve, api):
    # 0.3.x calls the worker with its registered key, in PD mode too; 0.1 has no key field (a warning at add).
    router = FakeRouter(api=api, api_key=ROUTER_KEY if api == "0.3" else None)
    router.add_existing("http://127.0.0.1:41001")
    router.add_existing("http://127.0.0.1:41002")
    base = serve(router)
    res = run({"router_url": base, "api_key": ROUTER_KEY, "url": "http://127.0.0.1:41002", "state": "absent",
               "check_readd": True, "worker_api_key": WORKER_KEY, "worker_config": {"worker_type": "decode"}})
    assert res["changed"] is True


@pytest.mark.parametrize("api", ["1", "0.3", "0.1"])
def test_absent_refuses_the_last_ready_worker(serve, api):
    router = FakeRouter(api=api, healthy_after=60 if api == "1" else 0)
    router.add_existing("http://127.0.0.1:41002")
    if api != "0.1":
        router.add_existing("http://127.0.0.1:41003", model="another-model")
        router.add_existing("http://127.0.0.1:41004", status="pending" if api == "1" else "not_ready", healthy=api == "1")
        router.add_existing("http://127.0.0.1:41005", worker_type="decode")
    base = serve(router)
    args = {"router_url": base, "url": "http://127.0.0.1:41002", "state": "absent"}
    for check in (True, False):
        res = run(args, check_mode=check, expect_fail=True)
        assert "last Ready worker" in res["msg"] and "allow_last=true" in res["msg"]
        assert res["changed"] is False and res["ready_peers"] == 0
    assert not _calls(router, "DELETE") and not [c for c in router.calls if c[0] == "POST"]
    res = run(dict(args, allow_last=True))
    assert res["changed"] is True and res["ready_peers"] == 0
    assert len(_calls(router, "DELETE") or [c for c in router.calls if "remove_worker" in c[1]]) == 1


def test_absent_allows_removing_a_worker_that_is_not_ready(serve):
    router = FakeRouter(api="1")
    router.add_existing("http://127.0.0.1:41002", status="failed")
    res = run({"router_url": serve(router), "url": "http://127.0.0.1:41002", "state": "absent"})
    assert res["changed"] is True and "ready_peers" not in res and router.workers == {}


def test_absent_detects_a_concurrent_removal(serve, monkeypatch):
    router = FakeRouter(api="1")
    peer = router.add_existing("http://127.0.0.1:41001")
    router.add_existing("http://127.0.0.1:41002")
    base = serve(router)
    real_remove = client.Router.remove

    def racing_remove(self, entry):
        router.workers[peer]["status"] = "draining"   # another host removed its worker at the same time
        return real_remove(self, entry)

    monkeypatch.setattr(client.Router, "remove", racing_remove)
    res = run({"router_url": base, "url": "http://127.0.0.1:41002", "state": "absent"}, expect_fail=True)
    assert "no other worker of the model 'm' (regular workers) is Ready any more" in res["msg"]
    assert res["changed"] is True and res["removed"][0]["url"] == "http://127.0.0.1:41002"


def test_absent_check_mode(serve):
    router = FakeRouter()
    router.add_existing("http://127.0.0.1:41002")
    worker = FakeWorker(loads=(5,))
    base = serve(router)
    wbase = serve(worker)
    res = run({"router_url": base, "url": "http://127.0.0.1:41002", "drain_url": wbase, "state": "absent", "drain": True,
               "allow_last": True}, check_mode=True, diff=True)
    assert res["changed"] is True
    assert res["workers"] == []
    assert res["diff"]["before"]["workers"] == ["http://127.0.0.1:41002"]
    assert len(router.workers) == 1
    assert not _calls(router, "DELETE")
    assert worker.reads == 0 and res["drained_s"] is None


def test_absent_router_keeps_listing(serve):
    router = FakeRouter(ignore_delete=True)
    router.add_existing("http://127.0.0.1:41002")
    res = run({"router_url": serve(router), "url": "http://127.0.0.1:41002", "state": "absent", "timeout": 0.2,
               "allow_last": True}, expect_fail=True)
    assert "still lists" in res["msg"]


def test_absent_entry_vanishes_before_delete(serve, monkeypatch):
    router = FakeRouter()
    wid = router.add_existing("http://127.0.0.1:41002")
    base = serve(router)
    real_remove = client.Router.remove

    def racing_remove(self, entry):
        router.workers.pop(wid, None)   # someone else removed it first
        return real_remove(self, entry)

    monkeypatch.setattr(client.Router, "remove", racing_remove)
    res = run({"router_url": base, "url": "http://127.0.0.1:41002", "state": "absent", "allow_last": True})
    assert res["changed"] is False and res["removed"] == []


# --------------------------------------------------------------------------
# Router 0.1
# --------------------------------------------------------------------------

def test_router_01_add_remove(serve):
    router = FakeRouter(api="0.1", api_key=ROUTER_KEY)
    base = serve(router)
    args = {"router_url": base, "url": "http://127.0.0.1:41002/", "api_key": ROUTER_KEY, "worker_api_key": WORKER_KEY,
            "wait_server": False}
    res = run(args)
    assert res["api_version"] == "0.1" and res["changed"] is True
    assert res["worker"]["url"] == "http://127.0.0.1:41002" and res["worker"]["status"] is None
    assert any("cannot pass a worker API key" in w for w in res["_warnings"])
    add = [c for c in router.calls if c[0] == "POST"][0]
    assert add[1] == "/add_worker?url=http%3A%2F%2F127.0.0.1%3A41002"
    assert WORKER_KEY not in json.dumps(router.calls)
    assert run(args)["changed"] is False

    rm = run(dict(args, state="absent", api_version="0.1", allow_last=True))
    assert rm["changed"] is True and rm["workers"] == []
    assert [c[1] for c in router.calls if c[0] == "POST"][-1] == "/remove_worker?url=http%3A%2F%2F127.0.0.1%3A41002"
    assert run(dict(args, state="absent"))["changed"] is False


def test_router_01_remove_not_found_is_no_change(serve, monkeypatch):
    router = FakeRouter(api="0.1")
    router.add_existing("http://127.0.0.1:41001")
    wid = router.add_existing("http://127.0.0.1:41002")
    base = serve(router)
    real_remove = client.Router.remove

    def racing_remove(self, entry):
        router.workers.pop(wid, None)
        return real_remove(self, entry)

    monkeypatch.setattr(client.Router, "remove", racing_remove)
    res = run({"router_url": base, "url": "http://127.0.0.1:41002", "state": "absent"})
    assert res["changed"] is False


# --------------------------------------------------------------------------
# Drain (state=drained and drain=true)
# --------------------------------------------------------------------------

@pytest.mark.parametrize("endpoints, source", [
    (("/v1/loads", "/metrics", "/get_load"), "/v1/loads"),
    (("/metrics", "/get_load"), "/metrics"),
    (("/get_load",), "/get_load"),
])
def test_drained_fallback_order(serve, endpoints, source):
    worker = FakeWorker(endpoints=endpoints, loads=(2, 0))
    res = run({"url": serve(worker), "state": "drained"})
    assert res["changed"] is False
    assert res["load"] == 0 and res["load_source"] == source
    assert res["api_version"] is None and "workers" not in res


def test_drained_uses_metrics_when_loads_needs_a_key(serve):
    worker = FakeWorker(endpoints=("/v1/loads", "/metrics"), api_key=WORKER_KEY, loads=(0,))
    wbase = serve(worker)
    res = run({"url": wbase, "state": "drained"})
    assert res["load_source"] == "/metrics"
    res = run({"url": wbase, "state": "drained", "worker_api_key": WORKER_KEY})
    assert res["load_source"] == "/v1/loads"
    assert "Bearer %s" % WORKER_KEY in worker.auth_seen
    _no_secret(res, WORKER_KEY)


def test_drained_no_endpoint(serve):
    worker = FakeWorker(endpoints=("/v1/loads",), api_key=WORKER_KEY)
    res = run({"url": serve(worker), "state": "drained"}, expect_fail=True)
    assert "cannot read the load" in res["msg"] and "worker_api_key" in res["msg"]


def test_drained_settle_restarts_on_new_load(serve):
    worker = FakeWorker(loads=(0, 1, 0))
    res = run({"url": serve(worker), "state": "drained", "drain_settle": 0.05})
    assert res["load"] == 0
    assert worker.reads >= 4   # 0, 1 (settle restarts), 0, then 0 again after the settle time


def test_drained_times_out(serve):
    worker = FakeWorker(loads=(4,))
    res = run({"url": serve(worker), "state": "drained", "drain_timeout": 0.2}, expect_fail=True)
    assert "still has 4 request(s) in flight" in res["msg"]
    assert res["load"] == 4


def test_drained_refused_counts_as_drained():
    res = run({"url": "http://127.0.0.1:%d" % _closed_port(), "state": "drained"})
    assert res["load_source"] == "unreachable" and res["load"] is None
    assert any("refuses connections" in w for w in res["_warnings"])


def test_drained_check_mode_reads_once(serve):
    worker = FakeWorker(loads=(7,))
    res = run({"url": serve(worker), "state": "drained"}, check_mode=True)
    assert res["load"] == 7 and worker.reads == 1 and res["drained_s"] is None
    res = run({"url": "http://127.0.0.1:%d" % _closed_port(), "state": "drained"}, check_mode=True)
    assert res["load_source"] == "unreachable"
    worker2 = FakeWorker(endpoints=())
    res = run({"url": serve(worker2), "state": "drained"}, check_mode=True, expect_fail=True)
    assert "cannot read the load" in res["msg"]


# --------------------------------------------------------------------------
# Errors and validation
# --------------------------------------------------------------------------

def test_router_key_missing(serve):
    router = FakeRouter(api_key=ROUTER_KEY)
    base = serve(router)
    res = run({"router_url": base, "url": "http://h:1"}, expect_fail=True)
    assert "HTTP 401" in res["msg"] and "api_key" in res["msg"]
    res = run({"router_url": base, "url": "http://h:1", "api_version": "1"}, expect_fail=True)
    assert "GET /workers" in res["msg"] and "HTTP 401" in res["msg"]


def test_router_unreachable():
    res = run({"router_url": "http://127.0.0.1:%d" % _closed_port(), "url": "http://h:1"}, expect_fail=True)
    assert "cannot reach the router" in res["msg"]


def test_not_a_router(serve):
    res = run({"router_url": serve(FakeWorker(endpoints=())), "url": "http://h:1"}, expect_fail=True)
    assert "is this an sglang-router or smg" in res["msg"]


@pytest.mark.parametrize("params, text", [
    ({"url": "ftp://h:1"}, "url: "),
    ({"url": "http://h:1", "drain_url": "http://:1"}, "drain_url: "),
    ({"url": "http://h:1", "router_url": "nohost://"}, "router_url: "),
    ({"url": "http://h:1", "worker_config": {"api_key": "x"}}, "worker_api_key"),
    ({"url": "http://h:1", "worker_config": {"url": "x"}}, "use the url option"),
    ({"url": "http://h:1", "timeout": -1}, "timeout must not be negative"),
])
def test_validation(params, text):
    params = dict({"router_url": "http://127.0.0.1:9"}, **params)
    res = run(params, expect_fail=True)
    assert text in res["msg"]


# --------------------------------------------------------------------------
# Real routers: smg 1.13.0 (scripts/setup-smg.sh) and sglang-router 0.3.2
# (.venv), on loopback, in front of simulated SGLang servers; the module's
# flow runs in-process. Every process is started in its own session, recorded
# by PID and killed by process group at the end.
# --------------------------------------------------------------------------

REPO = pathlib.Path(__file__).resolve().parents[4]
SIM_PY = REPO / "simulator" / "python"
SIM_BIN = REPO / "simulator" / "bin"
SIM_FAST = {"SGLANG_SIM_STARTUP_S": "0.2", "SGLANG_SIM_WARMUP_S": "0.05", "SGLANG_SIM_SHUTDOWN_S": "0.05",
            "SGLANG_SIM_DRAIN_POLL_S": "0.05"}


def _smg1():
    out = subprocess.run([str(REPO / "scripts" / "setup-smg.sh")], capture_output=True, text=True, timeout=600,
                         check=False)
    assert out.returncode == 0, "scripts/setup-smg.sh failed:\n%s" % out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


def _router_032():
    """sglang-router 0.3.2's ``smg`` entry point: in the project's .venv (requirements), which the ansible-core
    2.17/2.18 matrix venvs do not hold (they run this file with their own interpreter); the container legs
    (2.20, 2.21) have their own copy, named by GPUFLEET_SGLANG_ROUTER_BIN (scripts/matrix-controller.sh)."""
    places = [pathlib.Path(sys.executable).parent, REPO / ".venv" / "bin"]
    if os.environ.get("GPUFLEET_SGLANG_ROUTER_BIN"):
        places.insert(0, pathlib.Path(os.environ["GPUFLEET_SGLANG_ROUTER_BIN"]))
    for place in places:
        if (place / "smg").is_file():
            return str(place / "smg")
    raise AssertionError("sglang-router 0.3.2 is not installed: run make setup (requirements/dev.txt pins it)")


ROUTER_BINARIES = {"1": _smg1, "0.3": _router_032}


class Real(object):
    """Processes of one real-router test: simulated servers and the router."""

    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.procs = []
        self.model = tmp_path / "model"
        self.model.mkdir()
        (self.model / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}))

    def _spawn(self, argv, env, log):
        with open(log, "w") as fh:
            proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self.procs.append(proc)
        return proc

    def server(self, name, port=None, args=()):
        """A simulated SGLang server on its own simulated GPU node; waits until /health is 200."""
        root = self.tmp / name
        root.mkdir()
        env = dict(os.environ, GPUSIM_ROOT=str(root))
        subprocess.run([str(SIM_BIN / "gpusim"), "init", "--gpus", "1", "--model", "H200"], env=env, check=True,
                       capture_output=True, timeout=60)
        port = port or _closed_port()
        env.update(SIM_FAST, PYTHONPATH=str(SIM_PY), CUDA_VISIBLE_DEVICES="0")
        proc = self._spawn([sys.executable, "-m", "sglang.launch_server", "--port", str(port), "--model-path",
                            str(self.model)] + list(args), env, root / "server.log")
        url = "http://127.0.0.1:%d" % port
        _wait(lambda: _get(url + "/health")[0] == 200, 60, "%s healthy" % name)
        return url, proc

    def router(self, binary, extra=()):
        port = _closed_port()
        argv = [binary, "launch", "--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1",
                "--prometheus-port", str(_closed_port()), "--worker-startup-timeout-secs", "20",
                "--worker-startup-check-interval", "1", "--log-level", "warn"] + list(extra)
        env = dict(os.environ, HF_HUB_OFFLINE="1", NO_PROXY="*", no_proxy="*")
        self._spawn(argv, env, self.tmp / "router.log")
        url = "http://127.0.0.1:%d" % port
        _wait(lambda: _get(url + "/workers")[0] == 200, 60, "the router")
        return url

    def kill(self, proc):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)

    def cleanup(self):
        for proc in self.procs:
            self.kill(proc)


@pytest.fixture
def real(tmp_path):
    procs = Real(tmp_path)
    yield procs
    procs.cleanup()


def _get(url, timeout=5):
    try:
        status, dummy, data = r.request("GET", url, timeout=timeout)
        return status, data
    except r.HTTPConnectionError:
        return None, None


def _wait(predicate, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("timed out after %s s waiting for %s" % (timeout, what))


def _generate(url, tokens):
    status, dummy, data = r.request("POST", url + "/generate", timeout=60,
                                    body={"text": "tell me about GPUs", "sampling_params": {"max_new_tokens": tokens}})
    return status


@pytest.mark.parametrize("api", ["1", "0.3"])
def test_real_router(real, api):
    binary = ROUTER_BINARIES[api]()
    # Health checks every second, one failure marks a worker unhealthy: the Failed case below takes seconds.
    # Round robin, so that both servers get requests. Retries stay on: then smg 1.x buffers a request body (with
    # retries off it streams it chunked, which the simulated server does not read; real SGLang does).
    # Health checks every second; one failure marks a worker unhealthy, ten successes are needed to recover:
    # the stale-entry case below takes seconds, and the router does not heal the entry before the module does.
    router = real.router(binary, ["--policy", "round_robin", "--health-check-interval-secs", "1",
                                  "--health-failure-threshold", "1", "--health-success-threshold", "10"])
    a, proc_a = real.server("a")
    b, dummy = real.server("b")
    base = {"router_url": router, "poll_interval": 0.1, "request_timeout": 5, "timeout": 30}

    # Detection on an empty router, then registration of a healthy server.
    res = run(dict(base, url=a))
    assert res["api_version"] == api and res["changed"] is True
    assert res["worker"]["status"] == "ready" and res["worker"]["is_healthy"] is True
    assert run(dict(base, url=a + "/"))["changed"] is False

    # The only Ready worker of its model is not removed without allow_last; nothing changed.
    res = run(dict(base, url=a, state="absent"), expect_fail=True)
    assert "last Ready worker" in res["msg"] and "allow_last=true" in res["msg"]
    assert [w["url"] for w in worker_list.parse_workers(_get(router + "/workers")[1], api)] == [a]

    # With a second Ready worker, the removal goes through while a's requests are in flight. They take about
    # 12 s (1100 tokens at the simulator's 90 tokens/s), well beyond smg's 5 s drain settle.
    assert run(dict(base, url=b))["changed"] is True
    statuses = []
    threads = [threading.Thread(target=lambda: statuses.append(_generate(router, 1100))) for _thread in range(6)]
    for t in threads:
        t.start()
    _wait(lambda: (load.load_from_v1_loads(_get(a + "/v1/loads")[1]) or 0) > 0, 20, "requests in flight on a")
    res = run(dict(base, url=a, state="absent", drain=True, drain_timeout=60))
    for t in threads:
        t.join(timeout=60)
    assert res["changed"] is True and res["ready_peers"] == 1 and res["workers"] == [b]
    assert res["load"] == 0 and res["load_source"] == "/v1/loads" and res["initial_load"] > 0
    assert statuses == [200] * 6, statuses       # every request routed before the removal finished
    if api == "1":
        # smg 1.x keeps the removed worker draining for its settle time (5 s), still counting its requests, and
        # drops it while they still run: only the server's own load shows when they are done.
        assert res["settle_s"] >= 4.0 and res["router_load"] > 0, res
    else:
        # sglang-router 0.3.2 drops the worker at once; under load its /workers list can still name it for a
        # poll or so (CI, core-2.17 leg: one listing 0.1 s after the removal), never for a settle time.
        assert res["settle_s"] < 2.0, res

    # The server dies and comes back on the same port: the router's entry goes stale (smg 1.x: not_ready,
    # then failed) and present registers it again once the new server is healthy.
    assert run(dict(base, url=a))["changed"] is True
    real.kill(proc_a)
    stale = ("failed",) if api == "1" else ("not_ready",)
    _wait(lambda: [w["status"] for w in worker_list.parse_workers(_get(router + "/workers")[1], api) if w["url"] == a] == list(stale),
          30, "the router to mark a %s" % stale[0])
    port = int(a.rsplit(":", 1)[1])
    real.server("a2", port=port)
    res = run(dict(base, url=a))
    assert res["changed"] is True and res["reregistered"] is True, res
    assert res["worker"]["status"] == "ready"
    assert _generate(router, 4) == 200


def test_real_smg1_pd_mode(real):
    """smg 1.13.0 in PD mode in front of simulated prefill and decode servers: workers are registered with
    their role (and a prefill's bootstrap port), and the last-worker check counts Ready workers per role."""
    router = real.router(_smg1(), ["--pd-disaggregation", "--policy", "round_robin"])
    boot1, boot2 = _closed_port(), _closed_port()
    p1, dummy = real.server("p1", args=["--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(boot1)])
    p2, dummy = real.server("p2", args=["--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(boot2)])
    d1, dummy = real.server("d1", args=["--disaggregation-mode", "decode"])
    base = {"router_url": router, "poll_interval": 0.1, "request_timeout": 5, "timeout": 30}
    for url, config in ((p1, {"worker_type": "prefill", "bootstrap_port": boot1}), (d1, {"worker_type": "decode"})):
        res = run(dict(base, url=url, worker_config=config))
        assert res["api_version"] == "1" and res["changed"] is True and res["worker"]["status"] == "ready"
        assert res["worker"]["worker_type"] == config["worker_type"]
    listed = _get(router + "/workers")[1]["workers"]
    assert sorted((w["worker_type"], w.get("bootstrap_port")) for w in listed) == [("decode", None), ("prefill", boot1)]
    assert _generate(router, 8) == 200          # through both roles

    # The only decode server and the only prefill server are each the last of their role.
    for url in (d1, p1):
        res = run(dict(base, url=url, state="absent"), expect_fail=True)
        assert "last Ready worker" in res["msg"] and "(%s workers)" % ("decode" if url == d1 else "prefill") in res["msg"]

    # With a second prefill, one prefill is rolled out while requests flow through the router.
    assert run(dict(base, url=p2, worker_config={"worker_type": "prefill", "bootstrap_port": boot2}))["changed"] is True
    statuses = []
    threads = [threading.Thread(target=lambda: statuses.extend(_generate(router, 100) for _req in range(5))) for _thread in range(3)]
    for t in threads:
        t.start()
    res = run(dict(base, url=p1, state="absent", drain=True, drain_timeout=60))
    for t in threads:
        t.join(timeout=120)
    assert res["changed"] is True and res["ready_peers"] == 1 and res["settle_s"] >= 4.0
    assert res["load"] == 0 and res["load_source"] == "/v1/loads"
    assert statuses == [200] * 15, statuses
    assert sorted(w["url"] for w in worker_list.parse_workers(_get(router + "/workers")[1], "1")) == sorted([p2, d1])
    # And back, with its role and bootstrap port.
    res = run(dict(base, url=p1, worker_config={"worker_type": "prefill", "bootstrap_port": boot1}))
    assert res["changed"] is True and res["worker"]["worker_type"] == "prefill"


def test_real_smg1_pd_mode_sends_the_callers_key_not_the_workers(real):
    """smg 1.13.0 in PD mode dispatches with the caller's Authorization header, never the key registered for the
    worker: behind a router without --api-key a keyed prefill/decode pair fails every request (measured here
    first, so that the refusal below stays tied to what the router really does)."""
    key = "wk-pd-" + "5e1f0c9a7b3d"
    router = real.router(_smg1(), ["--pd-disaggregation", "--policy", "round_robin"])
    boot = _closed_port()
    p1, dummy = real.server("p1", args=["--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(boot),
                                        "--api-key", key])
    d1, dummy = real.server("d1", args=["--disaggregation-mode", "decode", "--api-key", key])
    for url, config in ((p1, {"worker_type": "prefill", "bootstrap_port": boot}), (d1, {"worker_type": "decode"})):
        status, dummy, job = r.request("POST", router + "/workers", body=dict(config, url=url, api_key=key), timeout=10)
        assert status in (200, 202), (status, job)
    _wait(lambda: len([w for w in (_get(router + "/workers")[1] or {}).get("workers", [])
                       if w.get("status") == "ready"]) == 2, 60, "both PD workers ready")
    body = {"text": "tell me about GPUs", "sampling_params": {"max_new_tokens": 8}}
    with_key = r.request("POST", router + "/generate", body=body, api_key=key, timeout=60)[0]
    without = r.request("POST", router + "/generate", body=body, timeout=60)[0]
    assert (with_key, without) == (200, 500), (with_key, without)     # 500: the router's prefill/decode 401

    # So the module refuses to register a keyed PD server behind this keyless router, naming the fix.
    r.request("DELETE", router + "/workers/" + [w["id"] for w in _get(router + "/workers")[1]["workers"]
                                                if w["url"] == d1][0], timeout=10)
    # smg answers the DELETE at once and removes the worker in a job: wait until it is gone (under load the module
    # could otherwise still find d1 registered, with nothing to register; seen once in a CI run).
    _wait(lambda: d1 not in [w.get("url") for w in (_get(router + "/workers")[1] or {}).get("workers", [])], 60,
          "the decode worker removed")
    base = {"router_url": router, "poll_interval": 0.1, "request_timeout": 5, "timeout": 30}
    res = run(dict(base, url=d1, worker_api_key=key, worker_config={"worker_type": "decode"}), expect_fail=True)
    assert "In PD mode smg 1.x sends the caller's Authorization header" in res["msg"], res["msg"]
    assert "(a decode server) requires an API key" in res["msg"] and key not in json.dumps(res)
    # And a redeploy of the prefill server is refused before its worker is taken out (check_readd), not after the
    # outage: the real router still lists it afterwards.
    res = run(dict(base, url=p1, state="absent", check_readd=True, worker_api_key=key,
                   worker_config={"worker_type": "prefill", "bootstrap_port": boot}), expect_fail=True)
    assert "the prefill server this redeploy starts has an API key" in res["msg"] and "Nothing was touched" in res["msg"]
    assert key not in json.dumps(res)
    listed = [w for w in worker_list.parse_workers(_get(router + "/workers")[1], "1") if worker_list.same_url(w["url"], p1)]
    assert [w["status"] for w in listed] == ["ready"], listed
