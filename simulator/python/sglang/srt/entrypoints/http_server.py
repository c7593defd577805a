"""HTTP API of the fake server (docs/reference/sglang-processes.md, HTTP endpoints), on ``http.server``.

``ThreadingHTTPServer`` with HTTP/1.1 keep-alive (the real router keeps
connections open), one thread per connection, so requests run concurrently.
Routes per emulated version:

=====================  =====================================================
all versions           /health /health_generate /get_server_info
                       /get_model_info /generate /v1/models /v1/models/{id}
                       /v1/completions /v1/chat/completions /flush_cache
                       /abort_request /metrics (only with --enable-metrics)
0.4.10 - 0.5.10        /get_load
0.5.10+                /server_info /model_info /v1/loads; the /get_* names
                       log a deprecation warning
0.5.23                 /ready /ping /pause_generation /continue_generation
                       /set_internal_state
=====================  =====================================================

Authentication (§2.1): with ``--api-key`` every request needs
``Authorization: Bearer <key>`` (401 ``{"error": "Unauthorized"}``) except
OPTIONS and paths beginning with /health or /metrics, and from 0.5.23 /ready.
"""
from __future__ import annotations

import json
import logging
import socket
import ssl
import threading
import time
import uuid
from datetime import datetime, timezone
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from sglang.srt.managers.tokenizer_manager import ServerStatus

logger = logging.getLogger("sglang.srt.entrypoints.http_server")
access_logger = logging.getLogger("uvicorn.access")
uvicorn_logger = logging.getLogger("uvicorn.error")

HEALTH_PATHS = ("/health", "/health_generate")


class HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(self, addr, handler, engine):
        host = addr[0]
        if ":" in host:
            self.address_family = socket.AF_INET6
        self.engine = engine
        self.ssl_context = ssl_context(getattr(engine, "server_args", None))
        super().__init__(addr, handler)

    def finish_request(self, request, client_address):
        # TLS (--ssl-certfile): the handshake runs in the connection's own thread, so a client that
        # refuses the certificate (or never finishes the handshake) does not hold up accept().
        if self.ssl_context is not None:
            try:
                request = self.ssl_context.wrap_socket(request, server_side=True)
            except (ssl.SSLError, OSError) as exc:
                uvicorn_logger.warning("WARNING:  Invalid HTTP request received (TLS handshake: %s)", exc)
                return
        super().finish_request(request, client_address)


def ssl_context(server_args):
    """uvicorn's server context for SGLang's --ssl-certfile/--ssl-keyfile/--ssl-keyfile-password/--ssl-ca-certs
    (uvicorn's ssl_cert_reqs stays CERT_NONE: the CA file alone asks no client certificate); None without a
    certificate."""
    certfile = getattr(server_args, "ssl_certfile", None) if server_args is not None else None
    if not certfile:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    password = getattr(server_args, "ssl_keyfile_password", None)
    ctx.load_cert_chain(certfile, getattr(server_args, "ssl_keyfile", None) or None, password=password or None)
    ca_certs = getattr(server_args, "ssl_ca_certs", None)
    if ca_certs:
        ctx.load_verify_locations(ca_certs)
    return ctx


def make_http_server(engine, host, port):
    """Bind (raises OSError like uvicorn's bind would) and return the server."""
    return HTTPServer((host, port), Handler, engine)


def make_dummy_health_server(engine, host, port):
    return HTTPServer((host, port), DummyHealthHandler, engine)


class _Base(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""

    def log_message(self, fmt, *args):  # http.server's own logging: silenced
        pass

    def _access_log(self, code):
        engine = self.server.engine
        path = urlsplit(self.path).path
        counts = getattr(engine, "http_counts", None)
        if counts is not None and path in self._routes():
            # 0.5.23's sglang:http_requests_total / http_responses_total (by route, method, status)
            counts[(path, self.command, str(code))] += 1
        if not engine.access_log_enabled:
            return
        for prefix in engine.access_log_exclude:
            if path.startswith(prefix):
                return
        try:
            phrase = HTTPStatus(code).phrase
        except ValueError:
            phrase = ""
        client = "%s:%s" % (self.client_address[0], self.client_address[1])
        access_logger.info('INFO:     %s - "%s %s %s" %s %s',
                           client, self.command, self.path, self.request_version, code, phrase)

    def send_body(self, code, body=b"", content_type="application/json", headers=None):
        if isinstance(body, (dict, list)):
            body = json.dumps(body, default=str).encode()
        elif isinstance(body, str):
            body = body.encode()
        self.send_response_only(code)
        self.send_header("date", self.date_time_string())
        self.send_header("server", "uvicorn")
        if body or code not in (204, 304):
            self.send_header("content-length", str(len(body)))
        if body:
            self.send_header("content-type", content_type)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)
        self._access_log(code)

    def read_body(self) -> bytes:
        """The request body, read once per request: ``Content-Length`` or ``Transfer-Encoding: chunked``
        (uvicorn reads both; smg 1.x streams bodies chunked when it does not parse them)."""
        if getattr(self, "_body", None) is not None:
            return self._body
        if "chunked" in (self.headers.get("transfer-encoding") or "").lower():
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    break
                parts.append(self.rfile.read(size))
                self.rfile.readline()  # the CRLF after each chunk
            raw = b"".join(parts)
        else:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length > 0 else b""
        self._body = raw
        return raw

    def discard_body(self):
        """After an answer that did not read the body (401, 404, 405): read it, as uvicorn does, or the next
        request on this keep-alive connection would be parsed from the middle of it."""
        try:
            self.read_body()
        except (OSError, ValueError):
            self.close_connection = True

    def read_json(self):
        raw = self.read_body()
        if not raw.strip():
            return {}
        return json.loads(raw.decode("utf-8"))


class DummyHealthHandler(_Base):
    """Node rank >= 1: /health, /health_generate, /ping always 200 (§2.2)."""

    def do_GET(self):
        path = urlsplit(self.path).path
        engine = self.server.engine
        if path in ("/health", "/health_generate", "/ping"):
            self.send_body(200)
        elif path == "/metrics" and engine.server_args.enable_metrics:
            self.send_body(200, "", "text/plain; version=0.0.4; charset=utf-8")
        else:
            self.send_body(404, {"detail": "Not Found"})

    do_HEAD = do_GET

    def do_POST(self):
        self.send_body(405 if urlsplit(self.path).path in ("/health", "/health_generate", "/ping")
                       else 404, {"detail": "Not Found"})


class Handler(_Base):
    # ------------------------------------------------------------- dispatch
    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def do_PUT(self):
        self._dispatch("PUT")

    def do_DELETE(self):
        self._dispatch("DELETE")

    def do_OPTIONS(self):
        self._dispatch("OPTIONS")

    def do_HEAD(self):
        self._dispatch("HEAD")

    def _authorized(self, method, path) -> bool:
        engine = self.server.engine
        api_key = engine.server_args.api_key
        if not api_key:
            return True
        if method == "OPTIONS":
            return True
        exempt = ["/health", "/metrics"]
        if engine.knobs.at_least(0, 5, 23):
            exempt.append("/ready")
        if any(path.startswith(p) for p in exempt):
            return True
        header = self.headers.get("Authorization")
        if engine.knobs.at_least(0, 5, 10):
            if not header:
                return False
            parts = header.split(" ", 1)
            return len(parts) == 2 and parts[0].lower() == "bearer" and parts[1] == api_key
        return header == "Bearer " + api_key

    def _routes(self):
        engine = self.server.engine
        k = engine.knobs
        r = {
            "/health": (("GET",), self.h_health),
            "/health_generate": (("GET",), self.h_health),
            "/get_server_info": (("GET",), self.h_get_server_info),
            "/get_model_info": (("GET",), self.h_get_model_info),
            "/generate": (("POST", "PUT"), self.h_generate),
            "/v1/models": (("GET",), self.h_models),
            "/v1/completions": (("POST",), self.h_completions),
            "/v1/chat/completions": (("POST",), self.h_chat_completions),
            "/flush_cache": (("GET", "POST"), self.h_flush_cache),
            "/abort_request": (("POST",), self.h_abort_request),
        }
        r["/update_weights_from_disk"] = (("POST",), self.h_update_weights_from_disk)
        if k.at_least(0, 5, 1):
            r["/update_weight_version"] = (("POST",), self.h_update_weight_version)
            r["/load_lora_adapter"] = (("POST",), self.h_load_lora_adapter)
            r["/unload_lora_adapter"] = (("POST",), self.h_unload_lora_adapter)
            r["/freeze_gc"] = (("GET", "POST"), self.h_freeze_gc)
        if k.at_least(0, 5, 10):
            r["/weights_checker"] = (("GET", "POST"), self.h_weights_checker)
        if engine.server_args.enable_metrics:
            r["/metrics"] = (("GET",), self.h_metrics)
        if (0, 4, 10) <= k.vt < (0, 5, 23):
            r["/get_load"] = (("GET",), self.h_get_load)
        if k.at_least(0, 5, 10):
            r["/server_info"] = (("GET",), self.h_server_info)
            r["/model_info"] = (("GET",), self.h_model_info)
            r["/v1/loads"] = (("GET",), self.h_v1_loads)
        if k.at_least(0, 5, 23):
            r["/ready"] = (("GET",), self.h_ready)
            r["/ping"] = (("GET",), self.h_ping)
            r["/pause_generation"] = (("POST",), self.h_pause)
            r["/continue_generation"] = (("POST",), self.h_continue)
            r["/set_internal_state"] = (("POST", "PUT"), self.h_set_internal_state)
        return r

    def _dispatch(self, method):
        while getattr(self.server.engine, "crashing", False):
            time.sleep(3600)  # crash diagnostics (engine.dump_requests_before_crash): no answer until the end
        self._body = None  # one handler object serves every request of a keep-alive connection
        try:
            self._dispatch_one(method)
        finally:
            if self._body is None and not self.close_connection:
                self.discard_body()

    def _dispatch_one(self, method):
        split = urlsplit(self.path)
        path = split.path
        self.query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        try:
            if not self._authorized(method, path):
                self.send_body(401, {"error": "Unauthorized"})
                return
            routes = self._routes()
            handler = None
            if path in routes:
                methods, handler = routes[path]
                if method == "HEAD" and "GET" in methods:
                    method = "GET"
                if method not in methods:
                    self.send_body(405, {"detail": "Method Not Allowed"},
                                   headers={"allow": ", ".join(methods)})
                    return
            elif path.startswith("/v1/models/") and method == "GET":
                handler = self.h_model_card
            if handler is None:
                if method == "OPTIONS":
                    self.send_body(405, {"detail": "Method Not Allowed"})
                else:
                    self.send_body(404, {"detail": "Not Found"})
                return
            handler()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except json.JSONDecodeError as e:
            self.send_body(400, {"error": {"message": f"Invalid JSON body: {e}"}})
        except Exception as e:  # pragma: no cover - defensive
            logger.error("Error in request handler: %r", e)
            try:
                self.send_body(500, {"error": {"message": str(e)}})
            except OSError:
                pass

    # ------------------------------------------------------------- health
    def h_health(self):
        engine = self.server.engine
        tm = engine.tokenizer_manager
        vt = engine.knobs.vt
        path = urlsplit(self.path).path
        if vt < (0, 4, 10) and path == "/health":
            self.send_body(200)  # 0.4.6: HTTP liveness only (§2.2)
            return
        if vt >= (0, 4, 10) and tm.gracefully_exit:
            if vt >= (0, 5, 23):
                logger.info("Health check request received during shutdown. Returning 503.")
            self.send_body(503)
            return
        if vt >= (0, 5, 10) and tm.server_status == ServerStatus.Starting:
            self.send_body(503)
            return
        if path == "/health" and not engine.sk.health_endpoint_generation:
            self.send_body(200)  # SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false
            return
        if path == "/health_generate" or vt >= (0, 5, 10):
            tm.auto_create_handle_loop()  # the health request goes through generate_request
        if engine.flap_fail():
            self.send_body(503)
            return
        if not engine.schedulers_alive() or tm.hung:
            timeout = engine.knobs.health_check_timeout
            tic = time.time()
            time.sleep(timeout)
            logger.error(
                "Health check failed. Server couldn't get a response from detokenizer for last "
                "%s seconds. tic start time: %s. last_heartbeat time: %s",
                int(timeout), time.strftime('%H:%M:%S', time.localtime(tic)),
                time.strftime('%H:%M:%S', time.localtime(tm.last_receive_tstamp)))
            tm.server_status = ServerStatus.UnHealthy
            self.send_body(503)
            return
        tm.last_receive_tstamp = time.time()
        # health_generate polls ``await asyncio.sleep(1)`` before it looks for the answer of its one-token
        # generation: a healthy server answers after one second at the earliest (measured on the real 0.5.23).
        time.sleep(1.0)
        if tm.server_status == ServerStatus.UnHealthy:
            tm.server_status = ServerStatus.Up  # a successful health generate sets Up
        self.send_body(200)

    def h_ready(self):
        tm = self.server.engine.tokenizer_manager
        self.send_body(200 if tm.is_ready() else 503)

    def h_ping(self):
        tm = self.server.engine.tokenizer_manager
        ok = tm.server_status == ServerStatus.Up and not tm.gracefully_exit
        self.send_body(200 if ok else 503)

    # ------------------------------------------------------------- info
    def _deprecated(self, old, new):
        if self.server.engine.knobs.at_least(0, 5, 10):
            logger.warning("Endpoint '%s' is deprecated and will be removed in a future "
                           "version. Please use '%s' instead.", old, new)

    def h_get_server_info(self):
        self._deprecated("/get_server_info", "/server_info")
        self.server.engine.tokenizer_manager.auto_create_handle_loop()  # get_internal_state
        self.send_body(200, self.server.engine.server_info())

    def h_server_info(self):
        self.server.engine.tokenizer_manager.auto_create_handle_loop()  # get_internal_state
        self.send_body(200, self.server.engine.server_info())

    def h_get_model_info(self):
        self._deprecated("/get_model_info", "/model_info")
        self.send_body(200, self.server.engine.model_info())

    def h_model_info(self):
        self.send_body(200, self.server.engine.model_info())

    def h_models(self):
        self.send_body(200, {"object": "list", "data": self.server.engine.model_cards()})

    def h_model_card(self):
        engine = self.server.engine
        model = urlsplit(self.path).path[len("/v1/models/"):]
        card = engine.model_card()
        if model != card["id"]:
            kind = "invalid_request_error" if engine.knobs.at_least(0, 5, 23) else "NotFoundError"
            self.send_body(404, {"error": {"message": f"The model '{model}' does not exist",
                                           "type": kind, "param": "model",
                                           "code": "model_not_found"}})
            return
        self.send_body(200, card)

    def h_get_load(self):
        tm = self.server.engine.tokenizer_manager
        out = []
        for d in range(tm.dp_size):
            out.append({"dp_rank": d, "num_reqs": tm.running[d] + tm.waiting[d],
                        "num_waiting_reqs": tm.waiting[d],
                        "num_tokens": tm.used_tokens(d)})
        self.send_body(200, out)

    def h_v1_loads(self):
        engine = self.server.engine
        engine.tokenizer_manager.auto_create_handle_loop()  # get_loads
        include = self.query.get("include")
        include_set = {s.strip() for s in include.split(",")} if include else None
        valid = {"core", "memory", "spec", "lora", "disagg", "queues", "all"}
        if include_set is not None and not include_set <= valid:
            self.send_body(400, {"detail": f"Invalid include sections: {include_set - valid}. "
                                           f"Valid options: {sorted(valid)}"})
            return
        loads = engine.loads(include_set)
        dp_rank = self.query.get("dp_rank")
        if dp_rank is not None:
            try:
                loads = [l for l in loads if l["dp_rank"] == int(dp_rank)]
            except ValueError:
                self.send_body(422, {"detail": "dp_rank must be an integer"})
                return
        if self.query.get("format") == "prometheus":
            if not engine.knobs.at_least(0, 5, 23):
                lines = []
                for l in loads:
                    for key in ("num_running_reqs", "num_waiting_reqs", "num_used_tokens",
                                "token_usage", "gen_throughput"):
                        lines.append(f'sglang:{key}{{dp_rank="{l["dp_rank"]}"}} {float(l[key])}')
                self.send_body(200, "\n".join(lines) + "\n", "text/plain; version=0.0.4; charset=utf-8")
                return
            # v1_loads.py _format_loads_prometheus: every numeric field, sections prefixed
            prefixes = {"speculative": "spec", "disaggregation": "disagg"}
            samples = {}
            for l in loads:
                l = dict(l)
                rank = l.pop("dp_rank")
                for key, value in l.items():
                    if isinstance(value, dict):
                        for sub, v in value.items():
                            if isinstance(v, (int, float)) and not isinstance(v, bool):
                                samples.setdefault("sglang_%s_%s" % (prefixes.get(key, key), sub), []).append((rank, v))
                    elif isinstance(value, (int, float)) and not isinstance(value, bool):
                        samples.setdefault("sglang_%s" % key, []).append((rank, value))
            lines = []
            for name, pairs in samples.items():
                lines.append("# TYPE %s gauge" % name)
                lines += ['%s{dp_rank="%s"} %s' % (name, rank, v) for rank, v in pairs]
            self.send_body(200, "\n".join(lines) + "\n", "text/plain; version=0.0.4; charset=utf-8")
            return
        self.send_body(200, {"timestamp": datetime.now(timezone.utc).isoformat(),
                             "version": engine.knobs.version,
                             "accelerator": engine.gpu_name,
                             "num_accelerators": engine.server_args.tp_size,
                             "loads": loads})

    def h_metrics(self):
        self.send_body(200, self.server.engine.metrics_text(),
                       "text/plain; version=0.0.4; charset=utf-8")

    # ------------------------------------------------------------- control
    def h_flush_cache(self):
        engine = self.server.engine
        tm = engine.tokenizer_manager
        tm.auto_create_handle_loop()
        if not engine.knobs.at_least(0, 5, 23):
            if tm.num_running() or tm.num_waiting():
                self.send_body(400, "Cache not flushed. Please check for pending requests.",
                               "text/plain; charset=utf-8")
                return
            tm.seen_prompts.clear()
        else:
            # ?timeout=S waits up to S seconds for the server to go idle (flush_wrapper.py)
            try:
                timeout = float(self.query.get("timeout", 0.0))
            except ValueError:
                self._validation_error([{"type": "float_parsing", "loc": ["query", "timeout"],
                                         "msg": "Input should be a valid number, unable to parse string as a number",
                                         "input": self.query.get("timeout")}])
                return
            deadline = time.monotonic() + max(0.0, timeout)
            ok = tm.flush_cache()
            while not ok and time.monotonic() < deadline:
                time.sleep(0.05)
                ok = tm.flush_cache()
            if not ok:
                self.send_body(400, "Timed out waiting for idle state." if timeout > 0 else "Flush cache failed.\n",
                               "text/plain; charset=utf-8")
                return
        self.send_body(200, "Cache flushed.\nPlease check backend logs for more details. "
                            "(When there are running or waiting requests, the operation will "
                            "not be performed.)\n", "text/plain; charset=utf-8")

    # ------------------------------------------------------------- weights, LoRA
    def _validation_error(self, errors):
        """FastAPI's 422 detail list; 0.5.23 overrides it app-wide (``validation_exception_handler``):
        400 with the ErrorResponse shape, the message being pydantic's text of the errors."""
        if not self.server.engine.knobs.at_least(0, 5, 23):
            self.send_body(422, {"detail": errors})
            return
        lines = ["%d validation error%s:" % (len(errors), "" if len(errors) == 1 else "s")]
        for err in errors:
            lines.append("  " + repr(dict(err, loc=tuple(err["loc"]))))
        self.send_body(400, {"object": "error", "message": "\n".join(lines) + "\n", "type": "Bad Request",
                             "param": None, "code": 400})

    def _body_with(self, *required):
        """The JSON body, or None after a validation error naming the missing fields."""
        body = self.read_json()
        if not isinstance(body, dict):
            self._validation_error([{"type": "model_attributes_type", "loc": ["body"],
                                     "msg": "Input should be a valid dictionary or object to extract fields from",
                                     "input": body}])
            return None
        missing = [f for f in required if f not in body]
        if missing:
            self._validation_error([{"type": "missing", "loc": ["body", f], "msg": "Field required", "input": body}
                                    for f in missing])
            return None
        return body

    def h_update_weights_from_disk(self):
        engine = self.server.engine
        body = self._body_with("model_path")
        if body is None:
            return
        engine.tokenizer_manager.auto_create_handle_loop()
        status, out = engine.weights.update_from_disk(body)
        self.send_body(status, out)

    def h_update_weight_version(self):
        engine = self.server.engine
        body = self._body_with("new_version")
        if body is None:
            return
        engine.tokenizer_manager.auto_create_handle_loop()
        status, out = engine.weights.update_version(body)
        self.send_body(status, out)

    def h_weights_checker(self):
        engine = self.server.engine
        body = self._body_with()
        if body is None:
            return
        engine.tokenizer_manager.auto_create_handle_loop()
        status, out = engine.weights.check(body)
        self.send_body(status, out)

    def h_load_lora_adapter(self):
        engine = self.server.engine
        body = self._body_with("lora_name", "lora_path")
        if body is None:
            return
        engine.tokenizer_manager.auto_create_handle_loop()
        status, out = engine.lora.load(body)
        self.send_body(status, out)

    def h_unload_lora_adapter(self):
        engine = self.server.engine
        body = self._body_with("lora_name")
        if body is None:
            return
        engine.tokenizer_manager.auto_create_handle_loop()
        status, out = engine.lora.unload(body)
        self.send_body(status, out)

    def h_freeze_gc(self):
        self.send_body(200, "Garbage collection frozen.\n", "text/plain; charset=utf-8")

    def h_abort_request(self):
        body = self.read_json()
        tm = self.server.engine.tokenizer_manager
        tm.abort_request(body.get("rid"), bool(body.get("abort_all")))
        self.send_body(200)

    def h_pause(self):
        body = self.read_json()
        tm = self.server.engine.tokenizer_manager
        tm.paused = True
        if (body.get("mode") or "abort") == "abort":
            tm.abort_request(abort_all=True)
        self.send_body(200, {"message": "Generation paused successfully.", "status": "ok"})

    def h_continue(self):
        self.server.engine.tokenizer_manager.paused = False
        self.send_body(200, {"message": "Generation continued successfully.", "status": "ok"})

    def h_set_internal_state(self):
        body = self.read_json()
        allowed = ("pp_max_micro_batch_size", "speculative_accept_threshold_single",
                   "speculative_accept_threshold_acc", "dspark_force_budget_frac",
                   "dspark_clear_info_records")
        args = body.get("server_args") or {}
        engine = self.server.engine
        engine.tokenizer_manager.auto_create_handle_loop()
        ok = bool(args) and all(k in allowed for k in args)
        if ok:
            for key, value in args.items():
                engine.internal_overrides[key] = value
        self.send_body(200, {"updated": ok, "server_args": engine.resolved_args()})

    # ------------------------------------------------------------- generate
    def _run_one(self, text, input_ids, sampling_params, rid, stream_cb=None, extra=None):
        engine = self.server.engine
        tm = engine.tokenizer_manager
        extra = extra or {}
        prompt_tokens = tm.count_prompt_tokens(text, input_ids)
        max_new = (sampling_params or {}).get("max_new_tokens")
        if max_new is None:
            max_new = 128  # SamplingParams default
        key = repr(input_ids) if input_ids is not None else (text or "")
        if extra.get("lora_path"):
            engine.lora.lookup(extra["lora_path"])      # ValueError -> 400
        engine.wait_schedulers_or_hang()

        def run_local(new_tokens, cached_prompt=False):
            ids, out_text, meta = tm.generate(rid, prompt_tokens, max_new if new_tokens is None else new_tokens,
                                              on_progress=stream_cb, prompt_key=key,
                                              cached_prompt=cached_prompt)
            return {"text": out_text, "output_ids": ids, "meta_info": meta}

        pd = engine.pd
        if pd is None or tm.server_status != ServerStatus.Up:
            return run_local(None)
        from sglang.srt.disaggregation import FAKE_BOOTSTRAP_HOST, PDError

        boot = {k: extra.get(k) for k in ("bootstrap_host", "bootstrap_port", "bootstrap_room")}
        if boot["bootstrap_host"] == FAKE_BOOTSTRAP_HOST:
            return run_local(1 if pd.mode == "prefill" else None)
        if boot["bootstrap_host"] is None or boot["bootstrap_room"] is None:
            raise PDError(400, "PD %s server: the request carries no bootstrap_host/bootstrap_room; send it "
                               "through a PD router (simulator)" % pd.mode)
        if boot["bootstrap_port"] is None:
            boot["bootstrap_port"] = pd.bootstrap_port
        rid = rid or uuid.uuid4().hex
        if pd.mode == "prefill":
            return pd.run_prefill(boot, rid, run_local)
        return pd.run_decode(boot, rid, lambda n: run_local(n, cached_prompt=True))

    def h_generate(self):
        body = self.read_json()
        if not isinstance(body, dict):
            self.send_body(400, {"error": {"message": "Request body must be a JSON object"}})
            return
        text = body.get("text")
        input_ids = body.get("input_ids")
        if text is None and input_ids is None and body.get("input_embeds") is None:
            self.send_body(400, {"error": {"message":
                                           "Either text, input_ids or input_embeds should be provided."}})
            return
        sampling = body.get("sampling_params") or {}
        rid = body.get("rid")
        batch = isinstance(text, list) or (isinstance(input_ids, list) and input_ids
                                           and isinstance(input_ids[0], list))
        extra_keys = ("lora_path", "bootstrap_host", "bootstrap_port", "bootstrap_room")

        def extra_of(i=None):
            out = {}
            for k in extra_keys:
                v = body.get(k)
                out[k] = v[i] if (i is not None and isinstance(v, list)) else v
            return out

        from sglang.srt.disaggregation import PDError

        if body.get("stream") and not batch:
            self._stream_generate(text, input_ids, sampling, rid, extra_of())
            return
        try:
            if not batch:
                self.send_body(200, self._run_one(text, input_ids, sampling, rid, extra=extra_of()))
                return
            items = text if isinstance(text, list) else input_ids
            results = [None] * len(items)
            errors = []

            def work(i):
                try:
                    sp = sampling[i] if isinstance(sampling, list) else sampling
                    r = rid[i] if isinstance(rid, list) else None
                    if isinstance(text, list):
                        results[i] = self._run_one(items[i], None, sp, r, extra=extra_of(i))
                    else:
                        results[i] = self._run_one(None, items[i], sp, r, extra=extra_of(i))
                except Exception as e:  # pragma: no cover
                    errors.append(e)

            threads = [threading.Thread(target=work, args=(i,)) for i in range(len(items))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if errors:
                raise errors[0]
            self.send_body(200, results)
        except PDError as e:
            self.send_body(e.status, {"detail": str(e)} if e.status != 400 else {"error": {"message": str(e)}})
        except ValueError as e:
            self.send_body(400, {"error": {"message": str(e)}})

    def _stream_generate(self, text, input_ids, sampling, rid, extra=None):
        self.send_response_only(200)
        self.send_header("date", self.date_time_string())
        self.send_header("server", "uvicorn")
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("connection", "close")
        self.end_headers()
        self.close_connection = True
        rid = rid or uuid.uuid4().hex

        def cb(ids, out_text, steps):
            chunk = {"text": out_text, "output_ids": ids,
                     "meta_info": {"id": rid, "finish_reason": None,
                                   "completion_tokens": len(ids)}}
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self.wfile.flush()

        try:
            result = self._run_one(text, input_ids, sampling, rid, stream_cb=cb, extra=extra)
        except Exception as e:  # ValueError, PDError: reported in the stream (serve_generate_request)
            err = {"error": {"message": str(e), "type": "invalid_request_error",
                             "code": getattr(e, "status", 400), "retryable": False}}
            self.wfile.write(b"data: " + json.dumps(err).encode() + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self._access_log(200)
            return
        self.wfile.write(b"data: " + json.dumps(result).encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self._access_log(200)

    def _openai(self, chat):
        engine = self.server.engine
        body = self.read_json()
        if chat:
            messages = body.get("messages") or []
            prompt = "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
            max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 64
        else:
            prompt = body.get("prompt", "")
            if isinstance(prompt, list):
                prompt = " ".join(str(p) for p in prompt)
            max_tokens = body.get("max_tokens") or 16
        res = self._run_one(prompt, None, {"max_new_tokens": max_tokens}, None)
        meta = res["meta_info"]
        usage = {"prompt_tokens": meta["prompt_tokens"],
                 "completion_tokens": meta["completion_tokens"],
                 "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"],
                 "prompt_tokens_details": None}
        model = body.get("model") or engine.server_args.served_model_name
        created = int(time.time())
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": res["text"].strip(),
                                              "reasoning_content": None, "tool_calls": None},
                      "logprobs": None, "finish_reason": "length", "matched_stop": None}
            out = {"id": meta["id"], "object": "chat.completion", "created": created,
                   "model": model, "choices": [choice], "usage": usage}
        else:
            choice = {"index": 0, "text": res["text"], "logprobs": None,
                      "finish_reason": "length", "matched_stop": None}
            out = {"id": meta["id"], "object": "text_completion", "created": created,
                   "model": model, "choices": [choice], "usage": usage}
        self.send_body(200, out)

    def h_completions(self):
        self._openai(chat=False)

    def h_chat_completions(self):
        self._openai(chat=True)


def metric_block(name, kind, help_text, samples, sort_labels=False):
    """Prometheus text for one metric; samples: [(labels dict, value, suffix)].

    Label order as given (prometheus_client writes labelnames in declaration order), or sorted by
    name (``sort_labels``: 0.5.23 serves the multiprocess collector's samples, whose labels are
    sorted, measured on the real server)."""
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    for labels, value, suffix in samples:
        items = sorted(labels.items()) if sort_labels else labels.items()
        lab = ",".join(f'{k}="{v}"' for k, v in items)
        lines.append(f"{name}{suffix}{{{lab}}} {float(value)}")
    return lines


__all__ = ["make_http_server", "make_dummy_health_server", "metric_block"]
