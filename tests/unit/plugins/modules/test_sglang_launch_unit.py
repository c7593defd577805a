"""Unit tests for sglang_launch's pure helpers and module_utils/http.py,
module_utils/sglang_process.py (masking, comparison, state file, stop)."""
from __future__ import annotations

import http.server
import json
import os
import socket
import stat
import threading
import time

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils import http as h
from ansible_collections.gpufleet.sglang.plugins.module_utils import sglang_process as sp
from ansible_collections.gpufleet.sglang.plugins.modules import sglang_launch as m

SECRET = "sk-unit-7f3a9c"


# --------------------------------------------------------------------------
# http.py
# --------------------------------------------------------------------------

class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest output clean
        pass

    def do_GET(self):
        if self.path == "/json":
            body = json.dumps({"ok": True, "auth": self.headers.get("Authorization")}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
        elif self.path == "/missing":
            body = b"not here"
            self.send_response(404)
            self.send_header("Content-Type", "text/plain")
        elif self.path == "/busy":
            body = json.dumps({"status": "starting"}).encode()
            self.send_response(503)
            self.send_header("Content-Type", "application/json")
        elif self.path == "/slow":
            time.sleep(1.0)
            body = b"late"
            self.send_response(200)
        else:
            body = b"plain text"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        length = int(self.headers.get("Content-Length", 0))
        data = json.loads(self.rfile.read(length))
        body = json.dumps({"echo": data, "ctype": self.headers.get("Content-Type")}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield "http://127.0.0.1:%d" % srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def _free_port():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


def test_http_json_and_bearer(server):
    status, headers, data = h.request("GET", server + "/json", api_key=SECRET)
    assert status == 200
    assert headers["content-type"] == "application/json"
    assert data == {"ok": True, "auth": "Bearer " + SECRET}


def test_http_errors_are_answers_not_exceptions(server):
    assert h.request("GET", server + "/missing")[0] == 404
    status, dummy, data = h.get_json(server + "/busy")
    assert status == 503 and data == {"status": "starting"}
    assert h.request("GET", server + "/text")[2] == "plain text"


def test_http_post_json_body(server):
    status, dummy, data = h.request("POST", server + "/echo", body={"a": 1})
    assert status == 200 and data == {"echo": {"a": 1}, "ctype": "application/json"}


def test_http_refused_is_distinguished():
    port = _free_port()
    with pytest.raises(h.ConnectionRefused) as info:
        h.request("GET", "http://127.0.0.1:%d/health" % port, timeout=2)
    assert info.value.kind == "refused"
    assert isinstance(info.value, h.HTTPConnectionError)


def test_http_timeout_is_distinguished(server):
    began = time.monotonic()
    with pytest.raises(h.RequestTimeout) as info:
        h.request("GET", server + "/slow", timeout=0.2)
    assert info.value.kind == "timeout"
    assert time.monotonic() - began < 0.9


def test_http_timeout_on_silent_listener():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)  # accepts the connection (backlog) but never answers
    try:
        with pytest.raises(h.RequestTimeout):
            h.request("GET", "http://127.0.0.1:%d/" % sock.getsockname()[1], timeout=0.3)
    finally:
        sock.close()


def test_http_ignores_proxy_environment(server, monkeypatch):
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    assert h.request("GET", server + "/json")[0] == 200


def test_http_unresolvable_host():
    with pytest.raises(h.HTTPConnectionError) as info:
        h.request("GET", "http://no-such-host.invalid:1/", timeout=2)
    assert info.value.kind in ("unreachable", "error")


# --------------------------------------------------------------------------
# Secrets
# --------------------------------------------------------------------------

@pytest.mark.parametrize("name,secret", [
    ("api_key", True), ("admin_api_key", True), ("hf_token", True), ("HF_TOKEN", True),
    ("ssl_password", True), ("watermark_secret", True), ("api-key", True),
    ("speculative_num_draft_tokens", False), ("max_prefill_tokens", False), ("tokenizer_path", False),
    ("ssl_keyfile", False), ("speculative_eagle_topk", False), ("model_path", False),
])
def test_is_secret_name(name, secret):
    assert sp.is_secret_name(name) is secret


def test_mask_text_server_args_line():
    line = ("server_args=ServerArgs(model_path='/m', api_key='%s', admin_api_key=None, "
            "hf_token=\"tok-1\", speculative_num_draft_tokens=16, ssl_keyfile='/k.pem')" % SECRET)
    out = sp.mask_text(line)
    assert SECRET not in out and "tok-1" not in out
    assert "api_key='********'" in out
    assert 'hf_token="********"' in out
    assert "speculative_num_draft_tokens=16" in out
    assert "ssl_keyfile='/k.pem'" in out
    assert "admin_api_key=None" in out


def test_mask_text_json_and_flags_and_literals():
    assert sp.mask_text('{"api_key": "%s", "port": 1}' % SECRET) == '{"api_key": "********", "port": 1}'
    assert sp.mask_text("launch: --api-key %s --port 1" % SECRET) == "launch: --api-key ******** --port 1"
    assert sp.mask_text("--admin-api-key=%s" % SECRET) == "--admin-api-key=********"
    assert sp.mask_text("the key is %s." % SECRET, [SECRET]) == "the key is ********."
    assert sp.mask_text(None) is None


def test_mask_argv():
    argv = ["python3", "-m", "sglang.launch_server", "--api-key", SECRET, "--admin-api-key=x1", "--port", "1",
            "--hf-token", "t0k"]
    assert sp.mask_argv(argv) == ["python3", "-m", "sglang.launch_server", "--api-key", "********",
                                  "--admin-api-key=********", "--port", "1", "--hf-token", "********"]
    assert sp.mask_argv(["--model-path", "/m/%s" % SECRET], [SECRET]) == ["--model-path", "/m/********"]


def test_redact_nested_and_launch_command():
    info = {"api_key": SECRET, "admin_api_key": None, "speculative_num_draft_tokens": 2,
            "launch_command": "python -m sglang.launch_server --api-key %s" % SECRET,
            "internal_states": [{"api_key": SECRET, "avg_spec_accept_length": 1.9}]}
    out = sp.redact(info, [SECRET])
    assert SECRET not in json.dumps(out)
    assert out["api_key"] == "********"
    assert out["admin_api_key"] is None
    assert out["speculative_num_draft_tokens"] == 2
    assert out["internal_states"][0]["avg_spec_accept_length"] == 1.9
    assert info["api_key"] == SECRET  # input untouched


# --------------------------------------------------------------------------
# State file
# --------------------------------------------------------------------------

def test_fingerprint_is_stable_and_sensitive():
    base = sp.fingerprint(["--port", "1"], "api_key: x\n", {"A": "1"}, "/d")
    assert base == sp.fingerprint(["--port", "1"], "api_key: x\n", {"A": "1"}, "/d")
    assert base != sp.fingerprint(["--port", "2"], "api_key: x\n", {"A": "1"}, "/d")
    assert base != sp.fingerprint(["--port", "1"], "api_key: y\n", {"A": "1"}, "/d")
    assert base != sp.fingerprint(["--port", "1"], "api_key: x\n", {"A": "2"}, "/d")
    assert base != sp.fingerprint(["--port", "1"], "api_key: x\n", {"A": "1"}, None)


def test_state_path_for():
    assert sp.state_path_for("/run/sglang/a/server.pid") == "/run/sglang/a/server.state.json"
    assert sp.state_path_for("/tmp/x/main") == "/tmp/x/main.state.json"


def test_state_roundtrip_and_private_mode(tmp_path):
    path = str(tmp_path / "server.state.json")
    assert sp.read_state(path) is None
    sp.write_state(path, {"pid": 12, "fingerprint": "abc"})
    assert sp.read_state(path) == {"pid": 12, "fingerprint": "abc"}
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    (tmp_path / "bad.json").write_text("[1, 2]")
    assert sp.read_state(str(tmp_path / "bad.json")) is None
    (tmp_path / "broken.json").write_text("{")
    assert sp.read_state(str(tmp_path / "broken.json")) is None
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]


def test_pid_file(tmp_path):
    path = tmp_path / "server.pid"
    assert sp.read_pid_file(str(path)) is None
    path.write_text("4242\n")
    assert sp.read_pid_file(str(path)) == 4242
    path.write_text("garbage")
    assert sp.read_pid_file(str(path)) is None
    path.write_text("0")
    assert sp.read_pid_file(str(path)) is None
    sp.remove_quietly(str(path), str(tmp_path / "nothing"))
    assert not path.exists()


def test_ensure_dir(tmp_path):
    target = tmp_path / "a" / "b"
    sp.ensure_dir(str(target))
    assert target.is_dir() and stat.S_IMODE(os.stat(target).st_mode) == 0o700
    sp.ensure_dir(str(target))


def test_read_log_offset_and_tail(tmp_path):
    log = tmp_path / "server.log"
    assert sp.read_log(str(log)) == ""
    log.write_text("old run\n")
    offset = sp.log_size(str(log))
    with open(log, "a") as fh:
        fh.write("".join("line %d\n" % i for i in range(100)))
    text = sp.read_log(str(log), offset)
    assert not text.startswith("old run")
    assert sp.tail(text, 3) == ["line 97", "line 98", "line 99"]
    assert sp.read_log(str(log), 10 ** 9).startswith("old run")  # truncated/rotated log: read all
    assert sp.read_log(str(log), 0, max_bytes=8) == "line 99\n"
    assert sp.log_size(str(tmp_path / "none")) == 0


# --------------------------------------------------------------------------
# Comparison and normalisation
# --------------------------------------------------------------------------

@pytest.mark.parametrize("arg,intended,running", [
    ("speculative_num_draft_tokens", 16, "16"),
    ("tp_size", "8", 8),
    ("mem_fraction_static", 0.85, "0.85"),
    ("speculative_algorithm", "eagle", "EAGLE"),
    ("speculative_algorithm", "NEXTN", "EAGLE"),
    ("attention_backend", "FA3", "fa3"),
    ("model_path", "/models/m/", "/models/m"),
    ("model_path", "/models/./m", "/models/m"),
    ("enable_metrics", True, "true"),
    ("enable_mixed_chunk", False, None),
    ("served_model_name", "qwen", "qwen"),
    ("json_model_override_args", {"a-b": 1}, {"a_b": "1"}),
    ("cuda_graph_bs", [1, 2], ["1", "2"]),
])
def test_same_value(arg, intended, running):
    assert m.same_value(arg, intended, running)


@pytest.mark.parametrize("arg,intended,running", [
    ("speculative_num_draft_tokens", 16, 2),
    ("speculative_algorithm", "EAGLE3", "EAGLE"),
    ("model_path", "/models/a", "/models/b"),
    ("enable_metrics", True, False),
    ("served_model_name", "Qwen", "qwen"),
    ("mem_fraction_static", 0.85, 0.8),
])
def test_different_value(arg, intended, running):
    assert not m.same_value(arg, intended, running)


def test_normalise_edge_cases():
    assert m.normalise("x", None) is None
    assert m.normalise("x", "None") is None
    assert m.normalise("x", " 7 ") == 7.0
    assert m.normalise("x", "nan") == "nan"
    assert m.normalise("x", "abc") == "abc"


def _explain(arg, intended, running, version, args=None):
    return "because %s" % arg


def test_compare_reports_overrides_and_unverified():
    expect = {"speculative-num-draft-tokens": 16, "speculative_num_steps": 1, "tp_size": "8",
              "not_reported": 3, "skip_me": None}
    info = {"speculative_num_draft_tokens": 2, "speculative_num_steps": 1, "tp_size": 8,
            "internal_states": [{"not_top": 1}]}
    overrides, unverified = m.compare(expect, info, "0.5.23", args=expect, explain=_explain)
    assert overrides == [{"arg": "speculative_num_draft_tokens", "intended": 16, "running": 2,
                          "explanation": "because speculative_num_draft_tokens"}]
    assert unverified == ["not_reported"]
    assert m.lookup_effective(info, "not_top") == (True, 1)
    assert m.lookup_effective({}, "x") == (False, None)


def test_compare_survives_a_failing_explain():
    def broken(*args, **kwargs):
        raise KeyError("nope")
    overrides, dummy = m.compare({"a": 1}, {"a": 2}, "0.5.23", explain=broken)
    assert overrides[0]["explanation"].startswith("no explanation available")


def test_format_override():
    item = {"arg": "speculative_num_draft_tokens", "intended": 16, "running": 2,
            "explanation": "SGLang sets it to num_steps + 1 when speculative_eagle_topk == 1; set speculative_num_steps: 15"}
    assert m.format_override(item) == (
        "speculative_num_draft_tokens: intended 16, running 2 \u2014 SGLang sets it to num_steps + 1 when "
        "speculative_eagle_topk == 1; set speculative_num_steps: 15")
    full = dict(item, explanation=m.format_override(item))
    assert m.format_override(full) == full["explanation"]
    assert m.format_override({"arg": "a", "intended": "x", "running": None, "explanation": ""}) == "a: intended x, running null"


def test_scan_log_masks_and_dedupes():
    line = "WARNING speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1"
    text = "\n".join(["INFO server_args=ServerArgs(api_key='%s')" % SECRET, line, line,
                      "WARNING Max running requests is reset to 48 for speculative decoding. You can override this by "
                      "explicitly setting --max-running-requests. key %s" % SECRET])
    found = m.scan_log(text, "0.5.23", [SECRET])
    assert [f["arg"] for f in found] == ["speculative_num_draft_tokens", "max_running_requests"]
    assert found[0]["line"] == line and found[0]["rule"] == "eagle.topk1_draft_tokens"
    assert SECRET not in json.dumps(found)
    assert m.scan_log(text, "0.4.6", [SECRET])[0]["arg"] == "speculative_num_draft_tokens"


def test_incident_explanation_text():
    args = {"model_path": "/m", "speculative_algorithm": "EAGLE", "speculative_draft_model_path": "/d",
            "speculative_eagle_topk": 1, "speculative_num_steps": 1, "speculative_num_draft_tokens": 16}
    overrides, dummy = m.compare(args, dict(args, speculative_num_draft_tokens=2), "0.5.23", args=args)
    assert [m.format_override(o) for o in overrides] == [
        "speculative_num_draft_tokens: intended 16, running 2 \u2014 SGLang sets it to num_steps + 1 when "
        "speculative_eagle_topk == 1; set speculative_num_steps: 15"]


# --------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------

def test_supports_config():
    assert m.supports_config("0.5.23") and m.supports_config("0.5.10")
    assert not m.supports_config("0.5.1") and not m.supports_config("0.4.6.post5")
    assert not m.supports_config("latest")


def test_flags_of():
    flags = ["--model-path", "/m", "--port", "1"]
    assert m.flags_of(["/usr/bin/python3", "-m", "sglang.launch_server"] + flags) == flags
    assert m.flags_of(["/venv/bin/sglang", "serve"] + flags) == flags
    assert m.flags_of(["python", "/x/sglang.launch_server"] + flags) == flags
    assert m.flags_of(["weird", "--model-path", "/m"]) == ["--model-path", "/m"]
    assert m.flags_of(["sleep", "9"]) == []


def test_urls_and_hosts():
    assert m.base_url("0.0.0.0", 30000) == "http://127.0.0.1:30000"
    assert m.base_url("::", 1) == "http://[::1]:1"
    assert m.base_url("10.1.2.3", 5) == "http://10.1.2.3:5"
    assert m.probe_host("[::1]") == "::1"


def test_port_in_use():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    port = sock.getsockname()[1]
    try:
        assert m.port_in_use("127.0.0.1", port)
        assert m.port_in_use("0.0.0.0", port)
    finally:
        sock.close()
    assert not m.port_in_use("127.0.0.1", port)
    assert not m.port_in_use("no-such-host.invalid", port)


def test_parse_properties():
    props = m.parse_properties("MainPID=42\nActiveState=active\nbogus\nResult=success\n")
    assert props == {"MainPID": "42", "ActiveState": "active", "Result": "success"}


def test_norm_key_and_paths():
    assert m.norm_key("--speculative-num-steps") == "speculative_num_steps"
    assert m.is_path_arg("speculative_draft_model_path")
    assert not m.is_path_arg("tp_size")
