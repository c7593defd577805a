"""Unit tests for sglang_launch's pure helpers and module_utils/http.py,
module_utils/sglang_process.py (masking, comparison, state file, stop)."""
from __future__ import annotations

import http.server
import json
import os
import socket
import stat
import sys
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
        try:
            self.wfile.write(body)
        except BrokenPipeError:  # the client gave up (timeout test)
            pass

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
    ("speculative_token_map", False), ("ssl_keyfile_password", True), ("secret_path", True), ("", False),
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
# Spawn and stop, with small Python sleepers (every PID is killed at the end)
# --------------------------------------------------------------------------

@pytest.fixture
def sleepers():
    pids = []
    yield pids
    for pid in pids:
        for member in [p for p, _s in sp.tree(pid)] + [pid]:
            try:
                os.kill(member, 9)
            except OSError:
                pass
        sp.reap(pid)


def _py(code):
    return [sys.executable, "-c", code]


def _wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_spawn_detached_session_fds_env_and_exit_code(tmp_path, sleepers):
    log = tmp_path / "child.log"
    code = ("import os, sys; print('fds', sorted(os.listdir('/proc/self/fd'))); print('sid', os.getsid(0) == os.getpid());"
            "print('env', os.environ['X_TEST']); print('cwd', os.getcwd()); print('stdin', repr(sys.stdin.read()));"
            "sys.stderr.write('to stderr\\n'); sys.exit(3)")
    pid = sp.spawn_detached(_py(code), dict(os.environ, X_TEST="yes"), str(log), chdir=str(tmp_path))
    sleepers.append(pid)
    status = None
    deadline = time.monotonic() + 10
    while status is None and time.monotonic() < deadline:
        status = sp.reap(pid)
        time.sleep(0.02)
    assert status == {"code": 3}
    text = log.read_text()
    assert "fds ['0', '1', '2', '3']" in text  # 3 is listdir's own descriptor
    assert "sid True" in text and "env yes" in text and "cwd %s" % tmp_path in text
    assert "stdin ''" in text and "to stderr" in text
    assert sp.reap(pid) is None  # already collected / not our child any more


def test_spawn_errors(tmp_path):
    with pytest.raises(sp.SpawnError) as info:
        sp.spawn_detached(["/nonexistent/python", "-V"], dict(os.environ), str(tmp_path / "log"))
    assert "cannot execute /nonexistent/python" in str(info.value)
    with pytest.raises(sp.SpawnError) as info:
        sp.spawn_detached(_py("pass"), dict(os.environ), str(tmp_path / "no" / "dir" / "log"))
    assert "cannot open log file" in str(info.value)


SPAWNS_CHILD = ("import os, signal, subprocess, sys, time\n"
                "if sys.argv[1] == 'stubborn':\n"
                "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                "child = subprocess.Popen([sys.executable, '-c', 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'])\n"
                "print('child', child.pid, flush=True)\n"
                "time.sleep(60)\n")


def _spawn_parent(tmp_path, mode, sleepers):
    log = tmp_path / ("%s.log" % mode)
    pid = sp.spawn_detached(_py(SPAWNS_CHILD) + [mode], dict(os.environ), str(log))
    sleepers.append(pid)
    assert _wait_for(lambda: "child" in log.read_text())
    child = int(log.read_text().split()[1])
    return pid, child


def test_tree_and_stop_with_escalation(tmp_path, sleepers):
    pid, child = _spawn_parent(tmp_path, "stubborn", sleepers)
    members = dict(sp.tree(pid))
    assert list(members)[:1] == [pid] and child in members
    assert sp.alive(pid, members[pid]) and not sp.alive(pid, members[pid] + 1)
    assert "-c" in sp.cmdline(pid) and sp.starttime(pid) == members[pid]
    report = sp.stop_tree(pid, timeout=0.3, is_child=True)
    assert report["signalled"] == [pid]
    assert sorted(report["killed"]) == sorted([pid, child])
    assert sorted(report["exited"]) == sorted([pid, child]) and report["still_running"] == []
    assert not sp.alive(pid) and not sp.alive(child)


def test_stop_graceful_and_orphan_cleanup(tmp_path, sleepers):
    pid, child = _spawn_parent(tmp_path, "polite", sleepers)
    start = sp.starttime(pid)
    report = sp.stop_tree(pid, start, timeout=5, is_child=True, orphan_grace=0.3)
    # The parent exits on SIGTERM; its child ignores SIGTERM and is SIGKILLed as a session member.
    assert report["signalled"] == [pid] and report["killed"] == [child]
    assert sp.stop_tree(pid, start) == {"signalled": [], "killed": [], "exited": [], "still_running": [], "elapsed": 0.0}


def test_kill_leftovers_of_a_dead_leader(tmp_path, sleepers):
    pid, child = _spawn_parent(tmp_path, "polite", sleepers)
    before = sp.tree(pid)
    os.kill(pid, 9)
    assert _wait_for(lambda: sp.reap(pid) is not None)
    leftovers = sp.tree(pid)  # the orphan keeps the session id of its dead leader
    assert [p for p, _s in leftovers] == [child] and (child, dict(before)[child]) in leftovers
    killed, still = sp.kill_leftovers(leftovers)
    assert killed == [child] and still == []


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
    ("json_model_override_args", {"rope": 2}, '{"rope": 2}'),
    ("json_model_override_args", '{"rope":2}', {"rope": 2}),
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


# --------------------------------------------------------------------------
# The module flow, in-process, with a fake AnsibleModule and no processes
# (process, HTTP and systemctl calls are replaced by fakes).
# --------------------------------------------------------------------------

class _Exit(Exception):
    def __init__(self, result):
        super().__init__(result.get("msg", ""))
        self.result = result


class _Fail(_Exit):
    pass


class FakeModule(object):
    def __init__(self, params, check_mode=False, diff=False, responder=None):
        defaults = dict((k, v.get("default")) for k, v in m.argument_spec().items())
        self.params = dict(defaults, **params)
        self.check_mode = check_mode
        self._diff = diff
        self.no_log_values = set()
        self.warnings = []
        self.commands = []
        self.responder = responder or (lambda argv: (0, "", ""))

    def warn(self, msg):
        self.warnings.append(msg)

    def fail_json(self, **kwargs):
        raise _Fail(dict(kwargs, failed=True))

    def exit_json(self, **kwargs):
        raise _Exit(kwargs)

    def run_command(self, argv, environ_update=None):
        self.commands.append(list(argv))
        return self.responder(list(argv))

    def get_bin_path(self, name, required=False, opt_dirs=None):
        return "/usr/bin/" + name


FAKE_PID = 4000001
INCIDENT = {"model_path": "/models/m", "speculative_algorithm": "EAGLE", "speculative_draft_model_path": "/d",
            "speculative_eagle_topk": 1, "speculative_num_steps": 1, "speculative_num_draft_tokens": 16}


class World(object):
    """Fake processes (pid -> starttime), HTTP answers and systemd units."""

    def __init__(self, monkeypatch, tmp_path):
        self.tmp = tmp_path
        self.procs = {}
        self.cmdlines = {}
        self.health = [200]
        self.info = {}
        self.info_status = {"/server_info": 200, "/get_server_info": 200}
        self.spawned = []
        self.unit_pid = 0
        self.http_calls = []
        self.exit_status = None
        self.exit_after = 1
        monkeypatch.setattr(m.sp, "alive", lambda pid, start=None: pid in self.procs and (start is None or self.procs[pid] == start))
        monkeypatch.setattr(m.sp, "starttime", self.procs.get)
        monkeypatch.setattr(m.sp, "cmdline", lambda pid: self.cmdlines.get(pid, []))
        monkeypatch.setattr(m.sp, "tree", lambda pid: [(p, s) for p, s in self.procs.items() if p == pid])
        monkeypatch.setattr(m.sp, "reap", self.reap)
        monkeypatch.setattr(m.sp, "spawn_detached", self.spawn)
        monkeypatch.setattr(m.sp, "stop_tree", self.stop_tree)
        monkeypatch.setattr(m.sp, "kill_leftovers", lambda members, grace=5.0: ([p for p, _s in members], []))
        monkeypatch.setattr(m.http, "request", self.request)
        monkeypatch.setattr(m, "port_in_use", lambda host, port, timeout=0.5: False)
        monkeypatch.setattr(m.sockets, "port_listeners", lambda port: (False, []))
        monkeypatch.setattr(m.time, "sleep", lambda s: None)

    def reap(self, pid, block=False):
        """The exit status once ``exit_after`` polls have passed."""
        if self.exit_status is None:
            return None
        self.exit_after -= 1
        return self.exit_status if self.exit_after < 0 else None

    def spawn(self, argv, env, log_path, chdir=None):
        pid = FAKE_PID + len(self.spawned)
        self.spawned.append((argv, env, chdir))
        self.procs[pid] = 100 + pid
        self.cmdlines[pid] = list(argv)
        with open(log_path, "a") as fh:
            fh.write("INFO server_args=ServerArgs(api_key='%s')\n" % SECRET)
            fh.write("WARNING speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
                     "speculative_eagle_topk == 1\n")
        return pid

    def stop_tree(self, pid, start=None, timeout=60.0, kill_grace=10.0, is_child=False):
        self.procs.pop(pid, None)
        return {"signalled": [pid], "killed": [], "exited": [pid], "still_running": [], "elapsed": 0.01}

    def request(self, method, url, body=None, api_key=None, timeout=10):
        path = "/" + url.split("/", 3)[3]
        self.http_calls.append((path, api_key))
        if path.startswith("/health"):
            answer = self.health.pop(0) if len(self.health) > 1 else self.health[0]
            if answer == "refused":
                raise h.ConnectionRefused(url, "connection refused")
            return answer, {}, ""
        status = self.info_status.get(path, 404)
        return status, {}, dict(self.info, version="0.5.23") if status == 200 else {}

    def systemctl(self, argv):
        verb = argv[1]
        if verb == "show":
            active = bool(self.unit_pid)
            return 0, "MainPID=%d\nActiveState=%s\nNeedDaemonReload=no\nResult=success\n" % (
                self.unit_pid, "active" if active else "inactive"), ""
        if verb == "start":
            self.unit_pid = FAKE_PID + 50
            self.procs[self.unit_pid] = 7
            self.cmdlines[self.unit_pid] = ["/usr/bin/python3", "-m", "sglang.launch_server", "--other"]
            return 0, "", ""
        if verb == "stop":
            self.procs.pop(self.unit_pid, None)
            self.unit_pid = 0
            return 0, "", ""
        if verb == "-u":
            return 0, "", ""
        return 0, "journal line\n", ""


@pytest.fixture
def world(monkeypatch, tmp_path):
    return World(monkeypatch, tmp_path)


def run_launcher(params, check_mode=False, diff=False, responder=None):
    module = FakeModule(params, check_mode=check_mode, diff=diff, responder=responder)
    with pytest.raises(_Exit) as info:
        m.Launcher(module).run()
    return info.value.result, module


def base_params(tmp_path, **extra):
    params = {"name": "unit", "args": dict(INCIDENT, port=31111), "state_dir": str(tmp_path / "state"),
              "python": "/bin/sh", "health_timeout": 5, "on_override": "ignore"}
    params.update(extra)
    return params


def test_flow_check_mode_plans_and_starts_nothing(world, tmp_path):
    result, module = run_launcher(base_params(tmp_path, api_key=SECRET), check_mode=True, diff=True)
    assert result["changed"] and result["action"] == "start"
    assert result["argv"][-2:] == ["--config", str(tmp_path / "state" / "config.yaml")]
    assert "--api-key" not in result["argv"] and SECRET not in json.dumps(result)
    assert result["diff"]["before"] == "" and 'api-key: "********"' in result["diff"]["after"]
    assert not world.spawned and not (tmp_path / "state").exists()
    assert SECRET in module.no_log_values


def test_flow_start_verify_idempotent_restart_stop(world, tmp_path):
    world.info = dict(INCIDENT, speculative_num_draft_tokens=2, port=31111, api_key=SECRET)
    world.health = ["refused", 503, 200]
    params = base_params(tmp_path, api_key=SECRET, env={"HF_TOKEN": "hf-secret", "A": "1"})
    result, module = run_launcher(params)
    assert result["action"] == "start" and result["pid"] == FAKE_PID
    assert result["overrides"][0]["arg"] == "speculative_num_draft_tokens"
    assert result["log_warnings"][0]["arg"] == "speculative_num_draft_tokens"
    assert result["effective"]["api_key"] == "********"
    assert result["server_info_endpoint"] == "/server_info" and result["version"] == "0.5.23"
    assert "startup_s" in result and SECRET not in json.dumps(result)
    assert stat.S_IMODE(os.stat(tmp_path / "state" / "config.yaml").st_mode) == 0o600
    assert ("/server_info", SECRET) in world.http_calls
    argv, env, dummy = world.spawned[0]
    assert env["HF_TOKEN"] == "hf-secret" and "hf-secret" in module.no_log_values
    record = sp.read_state(str(tmp_path / "state" / "server.state.json"))
    assert record["pid"] == FAKE_PID and record["env"]["HF_TOKEN"] == "********"
    assert SECRET not in json.dumps(record)

    again, dummy = run_launcher(params)
    assert again["changed"] is False and again["action"] == "none" and again["pid"] == FAKE_PID
    assert "startup_s" not in again and len(world.spawned) == 1

    changed = dict(params, args=dict(params["args"], mem_fraction_static=0.8))
    result, dummy = run_launcher(changed, check_mode=True, diff=True)
    assert result["action"] == "restart" and "--mem-fraction-static 0.8" in result["diff"]["after"]
    assert "--mem-fraction-static" not in result["diff"]["before"]
    result, dummy = run_launcher(changed)
    assert result["action"] == "restart" and result["pid"] == FAKE_PID + 1
    assert result["stop"]["signalled"] == [FAKE_PID]

    stopped, dummy = run_launcher(dict(changed, state="stopped"))
    assert stopped["changed"] and stopped["action"] == "stop"
    assert not (tmp_path / "state" / "server.pid").exists()
    stopped, dummy = run_launcher(dict(changed, state="stopped"))
    assert stopped["changed"] is False and stopped["action"] == "none"


def test_flow_launch_record_is_written_before_a_start_only(world, tmp_path):
    """record_file: the candidate config record (the rollback relaunches from it): written with mode 0640 just
    before a start or restart, with secret-named args masked and the environment as given; never in check
    mode, never when the server already runs as intended, and never when the start is refused."""
    world.info = dict(INCIDENT, port=31111)
    world.health = ["refused", 503, 200]
    record_file = tmp_path / "etc" / "candidate" / "server.json"
    params = base_params(tmp_path, record_file=str(record_file), record_extra={"adjustments": [{"arg": "x"}]},
                         env={"HF_TOKEN": "hf-secret", "CUDA_VISIBLE_DEVICES": "0,1"},
                         args=dict(INCIDENT, port=31111, admin_api_key="adm-secret-1"))
    planned, dummy = run_launcher(params, check_mode=True)
    assert planned["action"] == "start" and "record_file" not in planned and not record_file.parent.exists(), planned

    result, dummy = run_launcher(params)
    assert result["action"] == "start" and result["record_file"] == str(record_file)
    assert stat.S_IMODE(os.stat(record_file).st_mode) == 0o640
    record = json.loads(record_file.read_text())
    assert record["name"] == "unit" and record["version"] == "0.5.23" and record["manager"] == "process"
    assert record["python"] == "/bin/sh" and record["adjustments"] == [{"arg": "x"}]
    assert record["args"]["admin_api_key"] == "********" and "adm-secret-1" not in record_file.read_text() and record["args"]["port"] == 31111
    assert record["env"] == {"HF_TOKEN": "hf-secret"} and record["cuda_visible_devices"] == "0,1"
    assert record_file.read_text().endswith("}\n") and "    " in record_file.read_text()      # to_nice_json layout

    record_file.write_text("untouched\n")
    again, dummy = run_launcher(params)
    assert again["action"] == "none" and "record_file" not in again
    assert record_file.read_text() == "untouched\n"

    changed = dict(params, args=dict(params["args"], mem_fraction_static=0.8))
    result, dummy = run_launcher(changed)
    assert result["action"] == "restart" and json.loads(record_file.read_text())["args"]["mem_fraction_static"] == 0.8
    assert [p.name for p in record_file.parent.iterdir()] == ["server.json"]                   # no temporary file left


def test_flow_on_override_fail_leaves_server_running(world, tmp_path):
    world.info = dict(INCIDENT, speculative_num_draft_tokens=2, port=31111)
    with pytest.raises(_Fail) as info:
        m.Launcher(FakeModule(base_params(tmp_path, on_override="fail"))).run()
    res = info.value.result
    assert res["pid"] == FAKE_PID and FAKE_PID in world.procs
    assert ("speculative_num_draft_tokens: intended 16, running 2 \u2014 SGLang sets it to num_steps + 1 when "
            "speculative_eagle_topk == 1; set speculative_num_steps: 15") in res["msg"]
    assert "left running (pid %d)" % FAKE_PID in res["msg"]
    assert "SGLang logged" in res["msg"]


def test_flow_on_override_warn(world, tmp_path):
    world.info = dict(INCIDENT, speculative_num_draft_tokens=2, port=31111)
    result, module = run_launcher(base_params(tmp_path, on_override="warn"))
    assert result["overrides"] and any("intended 16, running 2" in w for w in module.warnings)


def test_flow_crash_before_healthy(world, tmp_path):
    world.health = ["refused"]
    world.exit_status = {"code": 3}
    with pytest.raises(_Fail) as info:
        m.Launcher(FakeModule(base_params(tmp_path, api_key=SECRET))).run()
    res = info.value.result
    assert "exited with code 3" in res["msg"] and res["last_status"] == "refused"
    assert any("api_key='********'" in line for line in res["log_tail"])
    assert SECRET not in json.dumps(res)
    assert "pid" not in res


def test_flow_timeout_stops_unless_keep(world, tmp_path):
    world.health = [503]
    with pytest.raises(_Fail) as info:
        m.Launcher(FakeModule(base_params(tmp_path, health_timeout=0.05))).run()
    res = info.value.result
    assert "did not become healthy within 0.05 s" in res["msg"] and "stopped it" in res["msg"]
    assert res["last_status"] == "HTTP 503" and res["stop"]["signalled"] == [FAKE_PID]
    with pytest.raises(_Fail) as info:
        m.Launcher(FakeModule(base_params(tmp_path, health_timeout=0.05, keep_on_failure=True))).run()
    assert "left it running" in info.value.result["msg"] and info.value.result["pid"] in world.procs


def test_flow_get_server_info_fallback_and_auth_errors(world, tmp_path):
    world.info = dict(INCIDENT, port=31111)
    world.info_status = {"/get_server_info": 200}
    result, dummy = run_launcher(base_params(tmp_path))
    assert result["server_info_endpoint"] == "/get_server_info"
    world.info_status = {"/server_info": 401}
    with pytest.raises(_Fail) as info:
        m.Launcher(FakeModule(base_params(tmp_path, state="restarted"))).run()
    assert "wants an API key" in info.value.result["msg"]


def test_flow_old_version_puts_key_only_where_allowed(world, tmp_path):
    params = base_params(tmp_path, version="0.5.1", api_key=SECRET, args={"model_path": "/m", "port": 31111})
    with pytest.raises(_Fail) as info:
        m.Launcher(FakeModule(params)).run()
    assert "allow_api_key_in_argv" in info.value.result["msg"] and not world.spawned
    result, module = run_launcher(dict(params, allow_api_key_in_argv=True), check_mode=True)
    assert result["argv"][-2:] == ["--api-key", "********"] and result["config_file"] is None
    assert any("ps" in w for w in module.warnings)


def test_flow_blockers_are_reported_together(world, tmp_path):
    params = base_params(tmp_path, name="bad name", port=1, args={"model_path": "/m", "port": 2, "bogus_flag": 1},
                         version="0.3.0", python="/nonexistent/python", chdir="/nonexistent")
    with pytest.raises(_Fail) as info:
        m.Launcher(FakeModule(params)).run()
    msg = info.value.result["msg"]
    for part in ("name 'bad name'", "port=1 conflicts", "version:", "python: /nonexistent/python", "chdir:"):
        assert part in msg, part


def test_flow_port_owner_blocks_start(world, tmp_path, monkeypatch):
    monkeypatch.setattr(m.sockets, "port_listeners", lambda port: (True, [FAKE_PID + 9]))
    world.cmdlines[FAKE_PID + 9] = ["nginx", "-g", "daemon off;"]
    with pytest.raises(_Fail) as info:
        m.Launcher(FakeModule(base_params(tmp_path))).run()
    assert "already in use by pid %d (nginx" % (FAKE_PID + 9) in info.value.result["msg"]
    assert not world.spawned
    result, module = run_launcher(base_params(tmp_path), check_mode=True)
    assert any("in use" in w for w in module.warnings)


def test_flow_systemd_start_none_stop(world, tmp_path):
    params = base_params(tmp_path, manager="systemd", args={"model_path": "/m", "port": 31111})
    world.info = {"model_path": "/m", "port": 31111}
    result, module = run_launcher(params, responder=world.systemctl)
    assert result["action"] == "start" and result["pid"] == FAKE_PID + 50
    assert ["/usr/bin/systemctl", "start", "sglang-unit.service"] in module.commands
    assert any("ExecStart" in w for w in module.warnings)
    again, module = run_launcher(params, responder=world.systemctl)
    assert again["action"] == "none" and not any(c[1] == "start" for c in module.commands)
    stopped, module = run_launcher(dict(params, state="stopped"), responder=world.systemctl)
    assert stopped["action"] == "stop" and ["/usr/bin/systemctl", "stop", "sglang-unit.service"] in module.commands


def test_flow_systemd_unit_without_main_pid(world, tmp_path):
    def responder(argv):
        if argv[1] == "show":
            return 0, "MainPID=0\nActiveState=failed\nResult=exit-code\nExecMainStatus=1\n", ""
        return 0, "boom from journal\n", ""
    params = base_params(tmp_path, manager="systemd", args={"model_path": "/m"})
    with pytest.raises(_Fail) as info:
        m.Launcher(FakeModule(params, responder=responder)).run()
    assert "has no main process" in info.value.result["msg"] and "boom from journal" in info.value.result["msg"]
