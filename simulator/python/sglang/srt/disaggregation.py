"""Prefill/decode disaggregation of the fake server (``--disaggregation-mode``).

Real 0.5.23 (``srt/disaggregation/``): a router sends every request to a
prefill and a decode server at once, each with ``bootstrap_host``,
``bootstrap_port`` (the prefill's ``--disaggregation-bootstrap-port``, 8998)
and ``bootstrap_room``.  The prefill's main process runs a bootstrap HTTP
server (``CommonKVBootstrapServer``: ``GET /route``, ``GET /health``); the
decode fetches ``PrefillServerInfo`` from ``/route?prefill_dp_rank=-1&...``,
checks it, then the prefill's scheduler pushes the KV cache through the
transfer backend and the decode generates.

The fake keeps the real bootstrap routes and answers, and stands in for the
transfer with one simulator route on the same server,
``GET /sim/transfer?room=R&backend=B``: the decode asks it for room R; it
returns once the prefill has run that room's prefill plus
``SGLANG_SIM_PD_TRANSFER_S``.  A decode whose transfer backend differs gets
409 there (the transfer cannot happen).

Queues (the gauges ``sglang:num_prefill_bootstrap_queue_reqs``,
``num_prefill_inflight_queue_reqs``, ``num_decode_prealloc_queue_reqs``,
``num_decode_transfer_queue_reqs``): prefill bootstrap = waiting for its
decode to connect; prefill inflight = prefilled, KV being sent; decode
prealloc = fetching the prefill's info and reserving KV; decode transfer =
waiting for the KV.

Layout checks, as the real decode does them:
* page_size, kv_cache_dtype differ (``try_ensure_parallel_info``): a
  RuntimeError in the decode scheduler ("Page size mismatch: ...", "KV cache
  dtype mismatch: ..."), which is not caught there, so the decode server goes
  down (SIGQUIT path) on the first request to that prefill;
* decode allocation policy differs: the request fails, HTTP 500
  ``{"detail": "Decode handshake failed for request ... Disaggregation decode
  allocation policy mismatch: ..."}``;
* transfer backend differs: the request fails the same way (simulator
  wording of the reason).
Requests with ``bootstrap_host`` 2.2.2.2 (FAKE_BOOTSTRAP_HOST: warmup and
health checks) run locally.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

logger = logging.getLogger("sglang.srt.disaggregation")

FAKE_BOOTSTRAP_HOST = "2.2.2.2"


class PDError(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def _dtype(sa, model_config):
    value = sa.values.get("kv_cache_dtype") or "auto"
    if value == "auto":
        return str(model_config.get("torch_dtype") or model_config.get("dtype") or "bfloat16")
    return str(value)


class _Room:
    def __init__(self):
        self.cond = threading.Condition()
        self.decode_connected = False
        self.prefilled = None       # prompt token count once the prefill forward ran
        self.transferred = False
        self.failed = None


class PDState:
    def __init__(self, engine):
        sa = engine.server_args
        self.engine = engine
        self.mode = sa.values.get("disaggregation_mode") or "null"
        self.backend = sa.values.get("disaggregation_transfer_backend") or "mooncake"
        self.bootstrap_port = int(sa.values.get("disaggregation_bootstrap_port") or 8998)
        self.page_size = int(sa.values.get("page_size") or 1)
        self.kv_cache_dtype = _dtype(sa, engine.model_config)
        self.policy = sa.values.get("disaggregation_decode_allocation_policy") or "early"
        self.lock = threading.Lock()
        self.queues = {"prefill_bootstrap": 0, "prefill_inflight": 0, "decode_prealloc": 0,
                       "decode_transfer": 0}
        self.bootstrap_failed = 0
        self.transfer_failed = 0
        self.rooms = {}
        self.info_cache = {}
        self.server = None

    # ------------------------------------------------------------ common
    def queue_depths(self):
        with self.lock:
            return dict(self.queues)

    def _count(self, key, delta):
        with self.lock:
            self.queues[key] += delta

    def prefill_info(self):
        """PrefillServerInfo as ``_handle_route_get`` returns it (no None kv_layout)."""
        eng = self.engine
        attn_dp = int(eng.server_args.values.get("attn_dp_size") or 1) if eng._attn_dp() else 1
        return {"attn_tp_size": eng.tp_size // max(1, attn_dp), "attn_cp_size": 1,
                "dp_size": attn_dp if eng._attn_dp() else eng.dp_size, "pp_size": eng.pp_size,
                "page_size": self.page_size, "kv_cache_dtype": self.kv_cache_dtype,
                "follow_bootstrap_room": True, "enable_dsa_cache_layer_split": False,
                "decode_allocation_policy": self.policy, "enable_kv_cache_sharding": False,
                "prefill_http_port": int(eng.server_args.port), "target_tp_rank": None,
                "target_tp_ranks": None, "target_cp_ranks": None, "target_pp_ranks": None,
                "required_dst_info_num": None, "required_prefill_response_num": None}

    # ------------------------------------------------------------ prefill side
    def start_bootstrap_server(self):
        if self.mode != "prefill":
            return
        host = self.engine.server_args.host or "127.0.0.1"
        self.server = _BootstrapServer((host, self.bootstrap_port), _BootstrapHandler, self)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1},
                         name="pd-bootstrap", daemon=True).start()

    def room(self, room):
        with self.lock:
            return self.rooms.setdefault(int(room), _Room())

    def run_prefill(self, bootstrap, rid, run_local):
        """Bootstrap queue -> prefill forward -> inflight queue; returns run_local's result."""
        timeout = self.engine.sk.pd_bootstrap_timeout_s
        room_id = int(bootstrap["bootstrap_room"])
        room = self.room(room_id)
        self._count("prefill_bootstrap", 1)
        try:
            with room.cond:
                if not room.cond.wait_for(lambda: room.decode_connected, timeout):
                    with self.lock:
                        self.bootstrap_failed += 1
                    raise PDError(500, "Prefill bootstrap failed for request rank=0 req.rid=%r "
                                       "req.bootstrap_room=%d with exception KVTransferError(bootstrap_room=%d): "
                                       "Request %d timed out after %.1fs in KVPoll.Bootstrapping"
                                  % (rid, room_id, room_id, room_id, timeout))
        finally:
            self._count("prefill_bootstrap", -1)
        result = run_local(1)
        self._count("prefill_inflight", 1)
        try:
            with room.cond:
                room.prefilled = result["meta_info"]["prompt_tokens"]
                room.cond.notify_all()
                room.cond.wait_for(lambda: room.transferred or room.failed, timeout)
        finally:
            self._count("prefill_inflight", -1)
            with self.lock:
                self.rooms.pop(room_id, None)
        return result

    def serve_transfer(self, room_id, backend):
        """The decode's side of a transfer, run in the prefill's bootstrap server."""
        if backend != self.backend:
            with self.lock:
                self.transfer_failed += 1
            return 409, {"error": "transfer backend mismatch: the prefill uses %s, the decode %s"
                                  % (self.backend, backend)}
        timeout = self.engine.sk.pd_bootstrap_timeout_s
        room = self.room(room_id)
        with room.cond:
            room.decode_connected = True
            room.cond.notify_all()
            if not room.cond.wait_for(lambda: room.prefilled is not None, timeout):
                room.failed = "timeout"
                room.cond.notify_all()
                return 404, {"error": "no prefill request for bootstrap_room %d within %.1fs" % (room_id, timeout)}
        time.sleep(self.engine.sk.pd_transfer_s)
        with room.cond:
            room.transferred = True
            room.cond.notify_all()
            return 200, {"bootstrap_room": room_id, "prompt_tokens": room.prefilled}

    # ------------------------------------------------------------ decode side
    def _fetch_info(self, addr):
        if addr in self.info_cache:
            return self.info_cache[addr]
        url = ("http://%s/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"
               % addr)
        for _attempt in range(20):
            try:
                with urllib.request.urlopen(url, timeout=5) as resp:
                    info = json.loads(resp.read().decode())
                self._check_layout(info)
                self.info_cache[addr] = info
                return info
            except urllib.error.HTTPError as e:
                logger.error("Failed to get prefill server info: %s, %s", e.code, e.read().decode(errors="replace"))
            except (OSError, ValueError) as e:
                logger.error("Error fetching prefill server info from bootstrap: %s", e)
            time.sleep(0.25)
        logger.error("Could not fetch prefill parallel info from %s after 20 attempts", addr)
        return None

    def _check_layout(self, info):
        if info.get("page_size") is not None and int(info["page_size"]) != self.page_size:
            self._crash("Page size mismatch: prefill server has page_size=%s, but decode server has "
                        "page_size=%s. Both servers must use the same --page-size value."
                        % (info["page_size"], self.page_size))
        if info.get("kv_cache_dtype") is not None and info["kv_cache_dtype"] != self.kv_cache_dtype:
            self._crash("KV cache dtype mismatch: prefill server has kv_cache_dtype=%s, but decode server "
                        "has kv_cache_dtype=%s. Both servers must use the same --kv-cache-dtype value."
                        % (info["kv_cache_dtype"], self.kv_cache_dtype))

    def _crash(self, message):
        """The decode scheduler dies on the uncaught RuntimeError (scheduler.py)."""
        logger.error("Scheduler hit an exception: Traceback (most recent call last):\n"
                     '  File "sglang/srt/disaggregation/common/conn.py", line 1320, in try_ensure_parallel_info\n'
                     "RuntimeError: %s\n", message)
        os.kill(os.getpid(), signal.SIGQUIT)
        raise PDError(500, message)

    def run_decode(self, bootstrap, rid, run_local):
        room_id = int(bootstrap["bootstrap_room"])
        addr = "%s:%s" % (bootstrap["bootstrap_host"], bootstrap["bootstrap_port"])
        prefix = ("Decode handshake failed for request rank=0 decode_req.req.rid=%r "
                  "decode_req.req.bootstrap_room=%d" % (rid, room_id))
        self._count("decode_prealloc", 1)
        try:
            info = self._fetch_info(addr)
            if info is None:
                with self.lock:
                    self.bootstrap_failed += 1
                raise PDError(500, prefix)
            if info.get("decode_allocation_policy", "early") != self.policy:
                with self.lock:
                    self.bootstrap_failed += 1
                raise PDError(500, prefix + " with exception KVTransferError(bootstrap_room=%d): "
                              "Disaggregation decode allocation policy mismatch: prefill=%s, decode=%s. "
                              "Set --disaggregation-decode-allocation-policy identically on both roles."
                              % (room_id, info.get("decode_allocation_policy"), self.policy))
        finally:
            self._count("decode_prealloc", -1)
        self._count("decode_transfer", 1)
        try:
            url = "http://%s/sim/transfer?room=%d&backend=%s" % (addr, room_id, self.backend)
            try:
                with urllib.request.urlopen(url, timeout=self.engine.sk.pd_bootstrap_timeout_s + 30) as resp:
                    json.loads(resp.read().decode())
            except urllib.error.HTTPError as e:
                with self.lock:
                    self.transfer_failed += 1
                try:
                    reason = json.loads(e.read().decode()).get("error")
                except ValueError:
                    reason = "HTTP %s" % e.code
                raise PDError(500, prefix + " with exception KVTransferError(bootstrap_room=%d): %s"
                              % (room_id, reason))
            except OSError:
                with self.lock:
                    self.transfer_failed += 1
                raise PDError(500, "Prefill server with bootstrap_addr: %s is healthy before, but now it is "
                                   "down. Request (bootstrap_room: %d) has been marked as failed." % (addr, room_id))
        finally:
            self._count("decode_transfer", -1)
        return run_local(None)


class _BootstrapServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr, handler, pd):
        self.pd = pd
        if ":" in addr[0]:
            import socket

            self.address_family = socket.AF_INET6
        super().__init__(addr, handler)


class _BootstrapHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "Python/aiohttp"
    sys_version = ""

    def log_message(self, fmt, *args):
        pass

    def _send(self, status, body, ctype="application/json; charset=utf-8"):
        raw = json.dumps(body).encode() if not isinstance(body, (bytes, str)) else (
            body.encode() if isinstance(body, str) else body)
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self):
        split = urlsplit(self.path)
        q = {k: v[-1] for k, v in parse_qs(split.query).items()}
        pd = self.server.pd
        if split.path == "/health":
            self._send(200, "OK", "text/plain; charset=utf-8")
        elif split.path == "/route":
            keys = ("prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank")
            if not all(q.get(k) for k in keys):
                self._send(400, "Missing inputs for bootstrap server.", "text/plain; charset=utf-8")
            elif all(q[k] == "-1" for k in keys):
                self._send(200, pd.prefill_info())
            else:
                self._send(200, {"rank_ip": pd.engine.server_args.host or "127.0.0.1",
                                 "rank_port": pd.bootstrap_port})
        elif split.path == "/sim/transfer":
            try:
                status, body = pd.serve_transfer(int(q.get("room", "")), q.get("backend") or "")
            except ValueError:
                status, body = 400, {"error": "room must be an integer"}
            self._send(status, body)
        else:
            self._send(404, "404: Not Found", "text/plain; charset=utf-8")

    def do_PUT(self):
        self._send(200, "OK", "text/plain; charset=utf-8")
