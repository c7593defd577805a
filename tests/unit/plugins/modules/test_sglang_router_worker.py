"""Unit tests for sglang_router_worker: the pure helpers (URL normalisation,
id lookup, API version detection, load parsing from /v1/loads, /metrics and
/get_load) and the module flow in-process against small fake routers (0.3 and
0.1 APIs) and a fake worker, served from threads on loopback (no processes).

The behaviour of the fake 0.3 router copies what the real smg 0.3.2 does (see
the module's notes): 202 + worker_id on POST, the worker listed only once the
job ends, DELETE by UUID, 400 for a non-UUID id, 401 without the key."""
from __future__ import annotations

import http.server
import json
import threading
import time
import uuid
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

from ansible_collections.gpufleet.sglang.plugins.modules import sglang_router_worker as m

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
    assert m.normalize_url(raw) == expected


@pytest.mark.parametrize("raw", ["", "   ", "http://:30000", "ftp://h:1", "http://h:notaport"])
def test_normalize_url_rejects(raw):
    with pytest.raises(ValueError):
        m.normalize_url(raw)


def test_same_url():
    assert m.same_url("http://H:1/", "h:1")
    assert not m.same_url("http://h:1", "http://h:2")
    assert not m.same_url("", "http://h:1")


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


def test_parse_workers_03():
    workers = m.parse_workers(ROUTER_03, "0.3")
    assert workers[0] == {"id": "67004696-985a-4e18-854b-9abdcbaa518b", "url": "http://127.0.0.1:41001",
                          "is_healthy": True, "load": 3}
    assert [w["is_healthy"] for w in workers] == [True, False, True]


def test_parse_workers_01_shapes():
    assert m.parse_workers({"urls": ["http://a:1", "http://b:2"]}, "0.1") == [
        {"id": None, "url": "http://a:1", "is_healthy": None, "load": None},
        {"id": None, "url": "http://b:2", "is_healthy": None, "load": None}]
    assert [w["url"] for w in m.parse_workers(["http://a:1"], "0.1")] == ["http://a:1"]
    assert [w["url"] for w in m.parse_workers({"workers": [{"url": "http://a:1"}, 7]}, "0.1")] == ["http://a:1"]


@pytest.mark.parametrize("data, version", [
    ({"urls": "x"}, "0.1"), ("text", "0.1"), ({"workers": None}, "0.3"), ([], "0.3"),
])
def test_parse_workers_rejects(data, version):
    with pytest.raises(ValueError):
        m.parse_workers(data, version)


def test_find_workers_matches_every_spelling():
    workers = m.parse_workers(ROUTER_03, "0.3")
    found = m.find_workers(workers, "http://127.0.0.1:41002")
    assert [w["id"] for w in found] == ["0bb65be2-4fa6-4b72-9bb2-5d84d730380f", "b44bf9b1-2f11-4996-8a67-36b73a70e901"]
    assert [w["id"] for w in m.find_workers(workers, "127.0.0.1:41001/")] == ["67004696-985a-4e18-854b-9abdcbaa518b"]
    assert m.find_workers(workers, "http://127.0.0.1:41003") == []


def test_detect_api_version():
    assert m.detect_api_version((200, {"workers": [], "total": 0})) == "0.3"
    assert m.detect_api_version((404, "Not Found")) is None
    assert m.detect_api_version((404, ""), (200, {"urls": []})) == "0.1"
    with pytest.raises(m.RouterError, match="api_key"):
        m.detect_api_version((401, ""))
    with pytest.raises(m.RouterError, match="api_key"):
        m.detect_api_version((404, ""), (403, ""))
    with pytest.raises(m.RouterError, match="list_workers"):
        m.detect_api_version((404, ""), (500, "boom"))
    with pytest.raises(m.RouterError, match="api_version"):
        m.detect_api_version((200, {"something": "else"}))
    with pytest.raises(m.RouterError, match="HTTP 502"):
        m.detect_api_version((502, "bad gateway"))


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
    assert m.load_from_v1_loads(V1_LOADS) == 3 + 2 + 1 + 1 + 2 + 1
    assert m.load_from_v1_loads({"loads": [{"dp_rank": 0, "num_running_reqs": 0, "num_waiting_reqs": 0}]}) == 0
    assert m.load_from_v1_loads([{"num_running_reqs": 2}]) == 2
    assert m.load_from_v1_loads({"loads": []}) is None
    assert m.load_from_v1_loads({"loads": [{"dp_rank": 0}]}) is None
    assert m.load_from_v1_loads({"loads": [{"num_running_reqs": True}, "x"]}) is None
    assert m.load_from_v1_loads("text") is None
    assert m.load_from_v1_loads({"loads": [{"num_running_reqs": 2.0}]}) == 2
    assert m.load_from_v1_loads({"loads": [{"num_running_reqs": float("inf")}]}) is None


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
    samples = m.parse_metrics(METRICS)
    assert ("sglang:num_used_tokens", {"model_name": "m", "tp_rank": "0"}, 999.0) in samples
    names = [s[0] for s in samples]
    assert "garbage" not in names


def test_load_from_metrics():
    # tp_rank 1 repeats tp_rank 0's requests and is skipped.
    assert m.load_from_metrics(METRICS) == 4 + 2 + 1
    assert m.load_from_metrics("sglang:num_running_reqs 0\nsglang:num_queue_reqs 0.0\n") == 0
    assert m.load_from_metrics("sglang:num_running_reqs NaN\n") is None
    assert m.load_from_metrics("sglang:num_running_reqs +Inf\n") is None
    assert m.load_from_metrics("# nothing\nsglang:token_usage 0.5\n") is None
    assert m.load_from_metrics("") is None


def test_load_from_get_load():
    assert m.load_from_get_load([{"dp_rank": 0, "num_reqs": 5, "num_waiting_reqs": 2, "num_tokens": 10},
                                 {"dp_rank": 1, "num_reqs": 1, "num_waiting_reqs": 0}]) == 6
    assert m.load_from_get_load({"num_running_reqs": 1, "num_waiting_reqs": 1}) == 2
    assert m.load_from_get_load([{"dp_rank": 0}]) is None
    assert m.load_from_get_load("x") is None


def test_deadline():
    d = m.Deadline(0.2)
    assert 0 < d.left() <= 0.2
    assert d.clamp(10) <= 0.2
    assert not d.expired()
    assert m.Deadline(0).expired()
    assert m.Deadline(0).clamp(5) == 0.05


def test_describe_truncates():
    assert m._describe("x" * 1000).endswith("...")
    assert m._describe({"a": 1}) == "{'a': 1}"


# --------------------------------------------------------------------------
# Fakes: a router (0.3 or 0.1 API) and a worker, on loopback threads
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
    """State of a fake router; ``api`` is "0.3" or "0.1"."""

    def __init__(self, api="0.3", api_key=None, add_delay=0.0, healthy_after=0.0, fail_add=None, ignore_delete=False):
        self.api = api
        self.api_key = api_key
        self.add_delay = add_delay          # seconds before a queued add shows up
        self.healthy_after = healthy_after  # seconds after listing until is_healthy
        self.fail_add = fail_add            # message of a failing AddWorker job
        self.ignore_delete = ignore_delete  # accept DELETE but never remove
        self.workers = {}                   # id -> {"url", "since", "api_key"}
        self.jobs = {}                      # id -> {"url", "status", "message", "at", "api_key"}
        self.calls = []                     # (method, path, body, authorization)
        self.lock = threading.Lock()

    def add_existing(self, url, healthy=True):
        wid = str(uuid.uuid4())
        self.workers[wid] = {"url": url, "since": time.monotonic() - (0 if healthy else -3600), "api_key": None}
        return wid

    def _promote(self):
        now = time.monotonic()
        for wid, job in list(self.jobs.items()):
            if job["status"] == "processing" and now >= job["at"]:
                if self.fail_add:
                    job.update(status="failed", message=self.fail_add)
                else:
                    self.workers[wid] = {"url": job["url"], "since": now, "api_key": job["api_key"]}
                    del self.jobs[wid]

    def listing(self):
        now = time.monotonic()
        return [{"id": wid, "url": w["url"], "model_id": "m", "is_healthy": now - w["since"] >= self.healthy_after,
                 "load": 0, "worker_type": "regular"} for wid, w in self.workers.items()]

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
                with router.lock:
                    router._promote()
                    if router.api == "0.3":
                        if path == "/workers":
                            return self.reply(200, {"workers": router.listing(), "total": len(router.workers), "stats": {}})
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
                    if router.api == "0.3" and parts.path == "/workers":
                        for wid, w in router.workers.items():
                            if w["url"] == body["url"]:
                                return self.reply(202, {"status": "accepted", "worker_id": wid})
                        wid = str(uuid.uuid4())
                        router.jobs[wid] = {"url": body["url"], "status": "processing", "message": None,
                                            "at": time.monotonic() + router.add_delay, "api_key": body.get("api_key")}
                        return self.reply(202, {"status": "accepted", "worker_id": wid, "url": body["url"],
                                                "location": "/workers/%s" % wid})
                    if router.api == "0.1" and parts.path in ("/add_worker", "/remove_worker"):
                        url = parse_qs(parts.query).get("url", [""])[0]
                        if not url:
                            return self.reply(400, "Worker URL required. Provide 'url' query parameter")
                        if parts.path == "/add_worker":
                            router.workers[str(uuid.uuid4())] = {"url": url, "since": time.monotonic(), "api_key": None}
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
                    if router.api == "0.3" and path.startswith("/workers/"):
                        wid = unquote(path.split("/", 2)[2])
                        try:
                            uuid.UUID(wid)
                        except ValueError:
                            return self.reply(400, {"error": "Invalid worker_id '%s' (expected UUID)" % wid})
                        if wid not in router.workers:
                            return self.reply(404, {"error": "Worker %s not found" % wid, "code": "WORKER_NOT_FOUND"})
                        if not router.ignore_delete:
                            del router.workers[wid]
                        return self.reply(202, {"status": "accepted", "worker_id": wid})
                return self.reply(404, "")

        return H


class FakeWorker(object):
    """A worker whose load the test controls; ``endpoints`` selects what it serves."""

    def __init__(self, endpoints=("/v1/loads",), api_key=None, loads=(0,)):
        self.endpoints = endpoints
        self.api_key = api_key
        self.loads = list(loads)   # successive load readings; the last one repeats
        self.reads = 0
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
                if path != "/metrics" and worker.api_key and self.headers.get("Authorization") != "Bearer %s" % worker.api_key:
                    return self.reply(401, {"error": "Unauthorized"})
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
        defaults = dict((k, v.get("default")) for k, v in m.argument_spec().items())
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
    module = FakeModule(dict(FAST, **params), check_mode=check_mode, diff=diff)
    with pytest.raises(_Exit) as info:
        m.RouterWorker(module).run()
    result = info.value.result
    assert isinstance(info.value, _Fail) == expect_fail, result
    result["_warnings"] = module.warnings
    return result


def _no_secret(result, *secrets):
    text = json.dumps(result, default=str)
    for secret in secrets:
        assert secret not in text


# --------------------------------------------------------------------------
# Module flow, router 0.3
# --------------------------------------------------------------------------

def test_present_adds_waits_and_is_idempotent(serve):
    router = FakeRouter(api_key=ROUTER_KEY, add_delay=0.15, healthy_after=0.1)
    router.add_existing("http://127.0.0.1:41001")
    base = serve(router)
    args = {"router_url": base + "/", "url": "HTTP://127.0.0.1:41002/", "api_key": ROUTER_KEY, "worker_api_key": WORKER_KEY}
    res = run(args, diff=True)
    assert res["changed"] is True
    assert res["api_version"] == "0.3"
    assert res["url"] == "http://127.0.0.1:41002"
    assert res["worker"]["url"] == "http://127.0.0.1:41002" and res["worker"]["is_healthy"] is True
    assert sorted(res["workers"]) == ["http://127.0.0.1:41001", "http://127.0.0.1:41002"]
    assert res["diff"]["before"]["workers"] == ["http://127.0.0.1:41001"]
    posts = [c for c in router.calls if c[0] == "POST"]
    assert len(posts) == 1
    # The normalised URL is registered, the worker key travels in the body only.
    assert posts[0][2] == {"url": "http://127.0.0.1:41002", "api_key": WORKER_KEY}
    assert all(c[3] == "Bearer %s" % ROUTER_KEY for c in router.calls)
    _no_secret(res, ROUTER_KEY, WORKER_KEY)

    again = run(args)
    assert again["changed"] is False
    assert len([c for c in router.calls if c[0] == "POST"]) == 1


def test_present_check_mode_sends_nothing(serve):
    router = FakeRouter()
    base = serve(router)
    res = run({"router_url": base, "url": "http://127.0.0.1:41002"}, check_mode=True, diff=True)
    assert res["changed"] is True
    assert res["worker"] is None
    assert res["workers"] == ["http://127.0.0.1:41002"]
    assert res["diff"] == {"before": {"workers": []}, "after": {"workers": ["http://127.0.0.1:41002"]}}
    assert [c[0] for c in router.calls] == ["GET", "GET"]   # probe + list


def test_present_worker_config_and_no_wait(serve):
    router = FakeRouter(healthy_after=30)
    base = serve(router)
    res = run({"router_url": base, "url": "http://127.0.0.1:41002", "wait_healthy": False, "api_version": "0.3",
               "worker_config": {"model_id": "m", "priority": 10}})
    assert res["changed"] is True
    assert res["worker"]["is_healthy"] is False
    post = [c for c in router.calls if c[0] == "POST"][0]
    assert post[2] == {"model_id": "m", "priority": 10, "url": "http://127.0.0.1:41002"}


def test_present_waits_for_unhealthy_member_then_times_out(serve):
    router = FakeRouter(healthy_after=30)
    router.add_existing("http://127.0.0.1:41002", healthy=False)
    base = serve(router)
    res = run({"router_url": base, "url": "http://127.0.0.1:41002", "timeout": 0.3}, expect_fail=True)
    assert "not healthy" in res["msg"] and "unhealthy" in res["msg"]
    assert not [c for c in router.calls if c[0] == "POST"]


def test_present_failed_job_fails_with_router_message(serve):
    router = FakeRouter(fail_add="Both HTTP and gRPC health checks failed for http://127.0.0.1:41009")
    base = serve(router)
    res = run({"router_url": base, "url": "http://127.0.0.1:41009", "timeout": 5}, expect_fail=True)
    assert "could not add http://127.0.0.1:41009" in res["msg"]
    assert "health checks failed" in res["msg"]


def test_present_times_out_while_job_pending(serve):
    router = FakeRouter(add_delay=30)
    base = serve(router)
    res = run({"router_url": base, "url": "http://127.0.0.1:41009", "timeout": 0.3}, expect_fail=True)
    assert "not healthy" in res["msg"] and "AddWorker job processing" in res["msg"]


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
    assert len(res["removed"]) == 2
    assert res["workers"] == ["http://127.0.0.1:41001"]
    assert res["diff"]["after"]["workers"] == ["http://127.0.0.1:41001"]
    assert res["drained_s"] is None
    deletes = [c for c in router.calls if c[0] == "DELETE"]
    assert len(deletes) == 2
    _no_secret(res, ROUTER_KEY, WORKER_KEY)

    again = run({"router_url": base, "url": "http://127.0.0.1:41002", "api_key": ROUTER_KEY, "state": "absent"})
    assert again["changed"] is False and again["worker"] is None


def test_absent_check_mode(serve):
    router = FakeRouter()
    router.add_existing("http://127.0.0.1:41002")
    worker = FakeWorker(loads=(5,))
    base = serve(router)
    wbase = serve(worker)
    res = run({"router_url": base, "url": "http://127.0.0.1:41002", "drain_url": wbase, "state": "absent", "drain": True},
              check_mode=True, diff=True)
    assert res["changed"] is True
    assert res["workers"] == []
    assert res["diff"]["before"]["workers"] == ["http://127.0.0.1:41002"]
    assert len(router.workers) == 1
    assert not [c for c in router.calls if c[0] == "DELETE"]
    assert worker.reads == 0 and res["drained_s"] is None


def test_absent_router_keeps_listing(serve):
    router = FakeRouter(ignore_delete=True)
    router.add_existing("http://127.0.0.1:41002")
    base = serve(router)
    res = run({"router_url": base, "url": "http://127.0.0.1:41002", "state": "absent", "timeout": 0.2}, expect_fail=True)
    assert "still lists" in res["msg"]


def test_absent_entry_vanishes_before_delete(serve, monkeypatch):
    router = FakeRouter()
    wid = router.add_existing("http://127.0.0.1:41002")
    base = serve(router)
    real_remove = m.Router.remove

    def racing_remove(self, entry):
        router.workers.pop(wid, None)   # someone else removed it first
        return real_remove(self, entry)

    monkeypatch.setattr(m.Router, "remove", racing_remove)
    res = run({"router_url": base, "url": "http://127.0.0.1:41002", "state": "absent"})
    assert res["changed"] is False and res["removed"] == []


# --------------------------------------------------------------------------
# Module flow, router 0.1
# --------------------------------------------------------------------------

def test_router_01_add_remove(serve):
    router = FakeRouter(api="0.1", api_key=ROUTER_KEY)
    base = serve(router)
    args = {"router_url": base, "url": "http://127.0.0.1:41002/", "api_key": ROUTER_KEY, "worker_api_key": WORKER_KEY}
    res = run(args)
    assert res["api_version"] == "0.1" and res["changed"] is True
    assert res["worker"] == {"id": None, "url": "http://127.0.0.1:41002", "is_healthy": None, "load": None}
    assert any("cannot pass a worker API key" in w for w in res["_warnings"])
    add = [c for c in router.calls if c[0] == "POST"][0]
    assert add[1] == "/add_worker?url=http%3A%2F%2F127.0.0.1%3A41002"
    assert WORKER_KEY not in json.dumps(router.calls)
    assert run(args)["changed"] is False

    rm = run(dict(args, state="absent", api_version="0.1"))
    assert rm["changed"] is True and rm["workers"] == []
    assert [c[1] for c in router.calls if c[0] == "POST"][-1] == "/remove_worker?url=http%3A%2F%2F127.0.0.1%3A41002"
    assert run(dict(args, state="absent"))["changed"] is False


def test_router_01_remove_not_found_is_no_change(serve, monkeypatch):
    router = FakeRouter(api="0.1")
    wid = router.add_existing("http://127.0.0.1:41002")
    base = serve(router)
    real_remove = m.Router.remove

    def racing_remove(self, entry):
        router.workers.pop(wid, None)
        return real_remove(self, entry)

    monkeypatch.setattr(m.Router, "remove", racing_remove)
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
    wbase = serve(worker)
    res = run({"url": wbase, "state": "drained"})
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
    wbase = serve(worker)
    res = run({"url": wbase, "state": "drained"}, expect_fail=True)
    assert "cannot read the load" in res["msg"] and "worker_api_key" in res["msg"]


def test_drained_settle_restarts_on_new_load(serve):
    worker = FakeWorker(loads=(0, 1, 0))
    wbase = serve(worker)
    res = run({"url": wbase, "state": "drained", "drain_settle": 0.05})
    assert res["load"] == 0
    assert worker.reads >= 4   # 0, 1 (settle restarts), 0, then 0 again after the settle time


def test_drained_times_out(serve):
    worker = FakeWorker(loads=(4,))
    wbase = serve(worker)
    res = run({"url": wbase, "state": "drained", "drain_timeout": 0.2}, expect_fail=True)
    assert "still has 4 request(s) in flight" in res["msg"]
    assert res["load"] == 4


def test_drained_refused_counts_as_drained():
    res = run({"url": "http://127.0.0.1:%d" % _closed_port(), "state": "drained"})
    assert res["load_source"] == "unreachable" and res["load"] is None
    assert any("refuses connections" in w for w in res["_warnings"])


def test_drained_check_mode_reads_once(serve):
    worker = FakeWorker(loads=(7,))
    wbase = serve(worker)
    res = run({"url": wbase, "state": "drained"}, check_mode=True)
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
    res = run({"router_url": base, "url": "http://h:1", "api_version": "0.3"}, expect_fail=True)
    assert "GET /workers" in res["msg"] and "HTTP 401" in res["msg"]


def test_router_unreachable():
    res = run({"router_url": "http://127.0.0.1:%d" % _closed_port(), "url": "http://h:1"}, expect_fail=True)
    assert "cannot reach the router" in res["msg"]


def test_not_a_router(serve):
    worker = FakeWorker(endpoints=())
    base = serve(worker)
    res = run({"router_url": base, "url": "http://h:1"}, expect_fail=True)
    assert "is this an sglang-router" in res["msg"]


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


def test_argument_spec_marks_secrets_no_log():
    spec = m.argument_spec()
    assert spec["api_key"]["no_log"] is True
    assert spec["worker_api_key"]["no_log"] is True
    for name, opt in spec.items():
        assert "type" in opt, name


def test_present_refuses_a_worker_that_needs_a_key(serve):
    router = FakeRouter()
    worker = FakeWorker(endpoints=("/model_info",), api_key=WORKER_KEY)
    base = serve(router)
    wbase = serve(worker)
    res = run({"router_url": base, "url": wbase}, expect_fail=True)
    assert "requires an API key" in res["msg"] and "worker_api_key is not set" in res["msg"]
    res = run({"router_url": base, "url": wbase, "worker_api_key": "wrong-key-123"}, expect_fail=True)
    assert "rejects worker_api_key" in res["msg"]
    _no_secret(res, "wrong-key-123")
    assert not [c for c in router.calls if c[0] == "POST"]
    res = run({"router_url": base, "url": wbase, "worker_api_key": WORKER_KEY})
    assert res["changed"] is True
    assert [c[2] for c in router.calls if c[0] == "POST"] == [{"url": wbase, "api_key": WORKER_KEY}]
    # Old servers: /model_info is 404, /get_model_info answers.
    old = FakeWorker(endpoints=("/get_model_info",), api_key=WORKER_KEY)
    res = run({"router_url": base, "url": serve(old)}, expect_fail=True)
    assert "/get_model_info" in res["msg"]
