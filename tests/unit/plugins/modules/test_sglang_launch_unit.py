"""Unit tests for sglang_launch: module_utils/common/http.py, module_utils/node/supervise.py (masking, state file,
spawn and stop), the effective-config comparison it runs (module_utils/sglang/compare.py), and the module
itself: ``main()`` in-process (``patch_module_args``) over the launch engine (module_utils/server/launcher.py and the modules it is built from)
with the process, HTTP and systemctl calls replaced by fakes, so that no server process is started.

module_utils/server/launcher.py itself (plan, current, write_files, records: launch_plan.py, process_control.py,
stored_launch.py) is tested in
tests/unit/plugins/module_utils/test_launcher.py, and the engine against the real fake SGLang server in
test_sglang_replace.py."""
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

from ansible.module_utils import basic

from ansible_collections.gpufleet.sglang.plugins.module_utils.common import http as h
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import supervise as sp
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import sockets
from ansible_collections.gpufleet.sglang.plugins.module_utils.server import crash_watch
from ansible_collections.gpufleet.sglang.plugins.module_utils.server import health_gate
from ansible_collections.gpufleet.sglang.plugins.module_utils.server import process_control
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import systemd
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import compare
from ansible_collections.gpufleet.sglang.plugins.modules import sglang_launch as m

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from redeploy_testlib import run_module  # noqa: E402 - after this directory is put on sys.path

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
    status, dummy, data = h.request("GET", server + "/busy")
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
    assert compare.same_value(arg, intended, running)


@pytest.mark.parametrize("arg,intended,running", [
    ("speculative_num_draft_tokens", 16, 2),
    ("speculative_algorithm", "EAGLE3", "EAGLE"),
    ("model_path", "/models/a", "/models/b"),
    ("enable_metrics", True, False),
    ("served_model_name", "Qwen", "qwen"),
    ("mem_fraction_static", 0.85, 0.8),
])
def test_different_value(arg, intended, running):
    assert not compare.same_value(arg, intended, running)


def test_normalise_edge_cases():
    assert compare.normalise("x", None) is None
    assert compare.normalise("x", "None") is None
    assert compare.normalise("x", " 7 ") == 7.0
    assert compare.normalise("x", "nan") == "nan"
    assert compare.normalise("x", "abc") == "abc"


def _explain(arg, intended, running, version, args=None, adjustments=()):
    return "because %s" % arg


def test_compare_reports_overrides_and_unverified(monkeypatch):
    monkeypatch.setattr(compare, "explain", _explain)
    expect = {"speculative-num-draft-tokens": 16, "speculative_num_steps": 1, "tp_size": "8",
              "not_reported": 3, "skip_me": None}
    info = {"speculative_num_draft_tokens": 2, "speculative_num_steps": 1, "tp_size": 8,
            "internal_states": [{"not_top": 1}]}
    overrides, unverified = compare.compare(expect, info, "0.5.23", args=expect)
    assert overrides == [{"arg": "speculative_num_draft_tokens", "intended": 16, "running": 2,
                          "explanation": "because speculative_num_draft_tokens"}]
    assert unverified == ["not_reported"]
    assert compare.lookup_effective(info, "not_top") == (True, 1)
    assert compare.lookup_effective({}, "x") == (False, None)


def test_compare_survives_a_failing_explain(monkeypatch):
    def broken(*args, **kwargs):
        raise KeyError("nope")
    monkeypatch.setattr(compare, "explain", broken)
    overrides, dummy = compare.compare({"a": 1}, {"a": 2}, "0.5.23")
    assert overrides[0]["explanation"].startswith("no explanation available")


def test_format_override():
    item = {"arg": "speculative_num_draft_tokens", "intended": 16, "running": 2,
            "explanation": "SGLang sets it to num_steps + 1 when speculative_eagle_topk == 1; set speculative_num_steps: 15"}
    assert compare.format_override(item) == (
        "speculative_num_draft_tokens: intended 16, running 2 \u2014 SGLang sets it to num_steps + 1 when "
        "speculative_eagle_topk == 1; set speculative_num_steps: 15")
    full = dict(item, explanation=compare.format_override(item))
    assert compare.format_override(full) == full["explanation"]
    assert compare.format_override({"arg": "a", "intended": "x", "running": None, "explanation": ""}) == "a: intended x, running null"


def test_scan_log_masks_and_dedupes():
    line = "WARNING speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1"
    text = "\n".join(["INFO server_args=ServerArgs(api_key='%s')" % SECRET, line, line,
                      "WARNING Max running requests is reset to 48 for speculative decoding. You can override this by "
                      "explicitly setting --max-running-requests. key %s" % SECRET])
    found = compare.scan_log(text, "0.5.23", [SECRET])
    assert [f["arg"] for f in found] == ["speculative_num_draft_tokens", "max_running_requests"]
    assert found[0]["line"] == line and found[0]["rule"] == "eagle.topk1_draft_tokens"
    assert SECRET not in json.dumps(found)
    assert compare.scan_log(text, "0.4.6", [SECRET])[0]["arg"] == "speculative_num_draft_tokens"


def test_incident_explanation_text():
    args = {"model_path": "/m", "speculative_algorithm": "EAGLE", "speculative_draft_model_path": "/d",
            "speculative_eagle_topk": 1, "speculative_num_steps": 1, "speculative_num_draft_tokens": 16}
    overrides, dummy = compare.compare(args, dict(args, speculative_num_draft_tokens=2), "0.5.23", args=args)
    assert [compare.format_override(o) for o in overrides] == [
        "speculative_num_draft_tokens: intended 16, running 2 \u2014 SGLang sets it to num_steps + 1 when "
        "speculative_eagle_topk == 1; set speculative_num_steps: 15"]


def test_supports_config_and_small_helpers():
    assert compare.supports_config("0.5.23") and compare.supports_config("0.5.10")
    assert not compare.supports_config("0.5.1") and not compare.supports_config("0.4.6.post5")
    assert not compare.supports_config("latest")
    assert compare.norm_key("--speculative-num-steps") == "speculative_num_steps"
    assert compare.is_path_arg("speculative_draft_model_path") and not compare.is_path_arg("tp_size")
    props = systemd.parse_properties("MainPID=42\nActiveState=active\nbogus\nResult=success\n")
    assert props == {"MainPID": "42", "ActiveState": "active", "Result": "success"}
    assert systemd.main_pid(props) == 42 and systemd.main_pid({"MainPID": "0"}) is None
    assert systemd.main_pid({"MainPID": "n/a"}) is None and systemd.is_active(props) and not systemd.loaded(props)


# --------------------------------------------------------------------------
# The module flow: main() in-process over the launch engine, with fakes for the processes
# (pid -> starttime), the HTTP answers and systemctl; no process is started.
# --------------------------------------------------------------------------

FAKE_PID = 4000001
INCIDENT = {"model_path": "/models/m", "speculative_algorithm": "EAGLE", "speculative_draft_model_path": "/d",
            "speculative_eagle_topk": 1, "speculative_num_steps": 1, "speculative_num_draft_tokens": 16}
SERVER_ARGS_LINE = "INFO server_args=ServerArgs(api_key='%s')\n" % SECRET
OVERRIDE_LINE = ("WARNING speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
                 "speculative_eagle_topk == 1\n")


class World(object):
    """Fake processes, HTTP answers and systemd units, patched into the launch engine and AnsibleModule."""

    def __init__(self, monkeypatch):
        self.procs = {}
        self.cmdlines = {}
        self.health = [200]
        self.info = {}
        self.info_status = {"/server_info": 200, "/get_server_info": 200}
        self.spawned = []
        self.unit_pid = 0
        self.http_calls = []
        self.commands = []
        self.exit_status = None
        self.exit_after = 1
        self.responder = self.systemctl
        self.journal = "journal line\n"
        sp_ = sp
        monkeypatch.setattr(sp_, "alive", lambda pid, start=None: pid in self.procs and (start is None or self.procs[pid] == start))
        monkeypatch.setattr(sp_, "starttime", self.procs.get)
        monkeypatch.setattr(sp_, "cmdline", lambda pid: self.cmdlines.get(pid, []))
        monkeypatch.setattr(sp_, "tree", lambda pid: [(p, s) for p, s in self.procs.items() if p == pid])
        monkeypatch.setattr(sp_, "reap", self.reap)
        monkeypatch.setattr(sp_, "spawn_detached", self.spawn)
        monkeypatch.setattr(sp_, "stop_tree", self.stop_tree)
        monkeypatch.setattr(sp_, "kill_leftovers", lambda members, grace=5.0: ([p for p, _s in members], []))
        monkeypatch.setattr(h, "request", self.request)
        monkeypatch.setattr(process_control, "port_in_use", lambda host, port, timeout=0.5: False)
        monkeypatch.setattr(sockets, "port_listeners", lambda port: (False, []))
        monkeypatch.setattr(systemd, "running", lambda root="/run/systemd/system": True)
        monkeypatch.setattr(basic.AnsibleModule, "run_command", self.run_command)
        monkeypatch.setattr(basic.AnsibleModule, "get_bin_path",
                            lambda module, name, required=False, opt_dirs=None: "/usr/bin/" + name)

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
            fh.write(SERVER_ARGS_LINE + OVERRIDE_LINE)
        return pid

    def stop_tree(self, pid, start=None, timeout=60.0, kill_grace=10.0, is_child=False, **kwargs):
        self.procs.pop(pid, None)
        return {"signalled": [pid], "killed": [], "exited": [pid], "still_running": [], "elapsed": 0.01}

    def request(self, method, url, body=None, api_key=None, timeout=10, **kwargs):
        path = "/" + url.split("/", 3)[3]
        self.http_calls.append((path, api_key))
        if path.startswith("/health"):
            answer = self.health.pop(0) if len(self.health) > 1 else self.health[0]
            if answer == "refused":
                raise h.ConnectionRefused(url, "connection refused")
            return answer, {}, ""
        status = self.info_status.get(path, 404)
        return status, {}, dict(self.info, version="0.5.23") if status == 200 else {}

    def run_command(self, argv, environ_update=None, **kwargs):
        self.commands.append(list(argv))
        return self.responder(list(argv))

    def systemctl(self, argv):
        if argv[0].endswith("journalctl"):
            return 0, self.journal, ""
        verb = argv[1]
        if verb == "show":
            active = bool(self.unit_pid)
            return 0, "LoadState=loaded\nMainPID=%d\nActiveState=%s\nNeedDaemonReload=no\nResult=success\n" % (
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
        return 0, "", ""


@pytest.fixture
def world(monkeypatch):
    return World(monkeypatch)


def launch(monkeypatch, params, check=False, diff=False):
    params = dict(params)
    if diff:
        params["_ansible_diff"] = True
    return run_module(m, params, monkeypatch, check=check)


def base_params(tmp_path, **extra):
    params = {"name": "unit", "args": dict(INCIDENT, port=31111), "state_dir": str(tmp_path / "state"),
              "python": "/bin/sh", "health_timeout": 5, "on_override": "ignore"}
    params.update(extra)
    return params


def test_flow_check_mode_plans_and_starts_nothing(world, tmp_path, monkeypatch):
    result = launch(monkeypatch, base_params(tmp_path, api_key=SECRET), check=True, diff=True)
    assert result["failed"] is False and result["changed"] and result["action"] == "start"
    assert result["argv"][-2:] == ["--config", str(tmp_path / "state" / "config.yaml")]
    assert result["config_file"] == str(tmp_path / "state" / "config.yaml")
    assert "--api-key" not in result["argv"] and SECRET not in json.dumps(result)
    assert result["diff"]["before"] == ""
    # The argv, then the --config file as it will be written, its secret masked.
    assert result["diff"]["after"] == "argv: %s\nconfig %s (0600):\n  api-key: \"********\"\n" % (
        " ".join(result["argv"]), result["config_file"])
    assert not world.spawned and not (tmp_path / "state").exists()


def test_flow_start_verify_idempotent_restart_stop(world, tmp_path, monkeypatch):
    world.info = dict(INCIDENT, speculative_num_draft_tokens=2, port=31111, api_key=SECRET)
    world.health = ["refused", 503, 200]
    params = base_params(tmp_path, api_key=SECRET, env={"HF_TOKEN": "hf-secret", "A": "1"})
    result = launch(monkeypatch, params)
    assert result["failed"] is False, result.get("msg")
    assert result["action"] == "start" and result["pid"] == FAKE_PID
    assert result["overrides"][0]["arg"] == "speculative_num_draft_tokens"
    assert result["log_warnings"][0]["arg"] == "speculative_num_draft_tokens"
    assert result["effective"]["api_key"] == "********"
    assert result["server_info_endpoint"] == "/server_info" and result["version"] == "0.5.23"
    assert "startup_s" in result and SECRET not in json.dumps(result) and "hf-secret" not in json.dumps(result)
    assert stat.S_IMODE(os.stat(tmp_path / "state" / "config.yaml").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "state" / "server.log").st_mode) == 0o600
    assert ("/server_info", SECRET) in world.http_calls
    argv, env, dummy = world.spawned[0]
    assert env["HF_TOKEN"] == "hf-secret" and env["A"] == "1" and SECRET not in " ".join(argv)
    record = sp.read_state(str(tmp_path / "state" / "server.state.json"))
    assert record["pid"] == FAKE_PID and record["fingerprint"] and SECRET not in json.dumps(record)
    assert "hf-secret" not in json.dumps(record)

    again = launch(monkeypatch, params)
    assert again["changed"] is False and again["action"] == "none" and again["pid"] == FAKE_PID
    assert "startup_s" not in again and len(world.spawned) == 1

    changed = dict(params, args=dict(params["args"], mem_fraction_static=0.8))
    result = launch(monkeypatch, changed, check=True, diff=True)
    assert result["action"] == "restart" and "--mem-fraction-static 0.8" in result["diff"]["after"]
    assert "--mem-fraction-static" not in result["diff"]["before"] and result["diff"]["before"].startswith("argv: /bin/sh")
    result = launch(monkeypatch, changed)
    assert result["action"] == "restart" and result["pid"] == FAKE_PID + 1
    assert result["stop"]["signalled"] == [FAKE_PID]

    stopped = launch(monkeypatch, dict(changed, state="stopped"))
    assert stopped["changed"] and stopped["action"] == "stop" and "pid" not in stopped
    assert not (tmp_path / "state" / "server.pid").exists() and not (tmp_path / "state" / "server.state.json").exists()
    stopped = launch(monkeypatch, dict(changed, state="stopped"))
    assert stopped["changed"] is False and stopped["action"] == "none"


def test_flow_launch_record_is_written_before_a_start_only(world, tmp_path, monkeypatch):
    """record_file: the launch record (mode 0640), written just before a start or restart, with no secret value in it;
    never in check mode, never when the server already runs as intended."""
    world.info = dict(INCIDENT, port=31111)
    world.health = ["refused", 503, 200]
    record_file = tmp_path / "etc" / "candidate" / "server.json"
    params = base_params(tmp_path, record_file=str(record_file), record_extra={"adjustments": [{"arg": "x"}]},
                         env={"HF_TOKEN": "hf-secret", "CUDA_VISIBLE_DEVICES": "0,1"},
                         args=dict(INCIDENT, port=31111, admin_api_key="adm-secret-1"))
    planned = launch(monkeypatch, params, check=True)
    assert planned["action"] == "start" and "record_file" not in planned and not record_file.parent.exists(), planned

    result = launch(monkeypatch, params)
    assert result["action"] == "start" and result["record_file"] == str(record_file)
    assert stat.S_IMODE(os.stat(record_file).st_mode) == 0o640
    text = record_file.read_text()
    record = json.loads(text)
    assert record["name"] == "unit" and record["version"] == "0.5.23" and record["manager"] == "process"
    assert record["python"] == "/bin/sh" and record["adjustments"] == [{"arg": "x"}]
    assert "adm-secret-1" not in text and "hf-secret" not in text and "admin_api_key" not in record["args"]
    assert record["args"]["port"] == 31111 and record["env"] == {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert record["cuda_visible_devices"] == "0,1" and record["fingerprint"]
    assert text.endswith("}\n") and "  " in text
    secrets = json.loads((tmp_path / "state" / "secrets.json").read_text())
    assert secrets == {"args": {"admin_api_key": "adm-secret-1"}, "env": {"HF_TOKEN": "hf-secret"}}

    record_file.write_text("untouched\n")
    again = launch(monkeypatch, params)
    assert again["action"] == "none" and "record_file" not in again
    assert record_file.read_text() == "untouched\n"

    changed = dict(params, args=dict(params["args"], mem_fraction_static=0.8))
    result = launch(monkeypatch, changed)
    assert result["action"] == "restart" and json.loads(record_file.read_text())["args"]["mem_fraction_static"] == 0.8
    assert [p.name for p in record_file.parent.iterdir()] == ["server.json"]                   # no temporary file left


def test_flow_on_override_fail_leaves_server_running(world, tmp_path, monkeypatch):
    world.info = dict(INCIDENT, speculative_num_draft_tokens=2, port=31111)
    res = launch(monkeypatch, base_params(tmp_path, on_override="fail"))
    assert res["failed"] is True
    assert res["pid"] == FAKE_PID and FAKE_PID in world.procs
    assert ("speculative_num_draft_tokens: intended 16, running 2 \u2014 SGLang sets it to num_steps + 1 when "
            "speculative_eagle_topk == 1; set speculative_num_steps: 15") in res["msg"]
    assert "left running (pid %d)" % FAKE_PID in res["msg"] and "SGLang logged" in res["msg"]
    assert "config_mismatch" not in res and res["overrides"][0]["running"] == 2


def test_flow_on_override_warn(world, tmp_path, monkeypatch):
    world.info = dict(INCIDENT, speculative_num_draft_tokens=2, port=31111)
    result = launch(monkeypatch, base_params(tmp_path, on_override="warn"))
    assert result["failed"] is False and result["overrides"]
    assert any("intended 16, running 2" in w for w in result["warnings"])


def test_flow_crash_before_healthy(world, tmp_path, monkeypatch):
    world.health = ["refused"]
    world.exit_status = {"code": 3}
    res = launch(monkeypatch, base_params(tmp_path, api_key=SECRET))
    assert res["failed"] is True
    assert "exited with code 3" in res["msg"] and res["last_status"] == "refused" and res["exit"] == {"code": 3}
    assert any("api_key='********'" in line for line in res["log_tail"])
    assert SECRET not in json.dumps(res)
    assert "pid" not in res and "server_exited" not in res


@pytest.mark.parametrize("manager", ["process", "systemd"])
def test_flow_a_crashed_candidate_fails_at_once_and_is_stopped_even_with_keep_on_failure(world, tmp_path, monkeypatch,
                                                                                         manager):
    """Its detokenizer is gone while its main process runs (0.5.23's crash diagnostics: the port listens, nothing
    answers): the gate fails at once, well before health_timeout, and stops it by PID (SIGTERM, SIGKILL after 5 s; a
    unit is stopped by PID too, then `systemctl stop` settles it)."""
    main = FAKE_PID if manager == "process" else FAKE_PID + 50
    world.health = ["timeout"]
    kids = {FAKE_PID + 7: "sglang::detokenizer", FAKE_PID + 8: "sglang::scheduler"}
    polls = {"n": 0}

    def tree(pid):
        polls["n"] += 1
        if pid not in world.procs:
            return []
        members = [(pid, world.procs[pid])] + [(k, 9) for k in sorted(kids) if k in world.procs]
        if polls["n"] == 3:
            world.procs.pop(FAKE_PID + 7)                 # SIGKILLed between two polls
        return members

    def request(method, url, **kwargs):
        if "/health" in url:
            raise h.RequestTimeout(url, "timed out")
        return World.request(world, method, url, **kwargs)

    stops = []

    def stop_tree(pid, start=None, timeout=60.0, kill_grace=10.0, is_child=False, **kwargs):
        stops.append(timeout)
        return World.stop_tree(world, pid, start, timeout, kill_grace, is_child)

    for kid, title in kids.items():
        world.procs[kid] = 9
        world.cmdlines[kid] = [title]
    monkeypatch.setattr(sp, "tree", tree)
    monkeypatch.setattr(sp, "stop_tree", stop_tree)
    monkeypatch.setattr(crash_watch, "_parent_of", lambda pid: main)
    monkeypatch.setattr(health_gate, "CRASH_EXIT_WAIT_S", 0.3)
    monkeypatch.setattr(h, "request", request)
    res = launch(monkeypatch, base_params(tmp_path, health_timeout=600, keep_on_failure=True, manager=manager))
    assert res["failed"] is True and "crashed" in res["msg"] and "did not become healthy" not in res["msg"], res["msg"]
    assert res["crashed"] == "its process sglang::detokenizer (PID %d) is gone while the main process %d still runs" % (
        FAKE_PID + 7, main)
    assert "SIGTERM, then SIGKILL after 5 s" in res["msg"] and stops == [5.0]
    assert res["stop"]["signalled"] == [main] and main not in world.procs
    assert (["/usr/bin/systemctl", "stop", "--", "sglang-unit.service"] in world.commands) is (manager == "systemd")


def test_flow_the_crash_lines_of_earlier_servers_in_the_log_do_not_fail_a_running_one(world, tmp_path, monkeypatch):
    world.info = dict(INCIDENT, port=31111)
    params = base_params(tmp_path)
    assert launch(monkeypatch, params)["failed"] is False
    log = tmp_path / "state" / "server.log"
    with open(str(log), "a") as fh:                 # what a server before it logged when it crashed
        fh.write("[2026-12-06 20:00:00] Scheduler hit an exception: Traceback (most recent call last):\n")
    again = launch(monkeypatch, params)               # the same server, already running: the gate runs again
    assert again["failed"] is False and again["action"] == "none", again.get("msg")
    log.write_text("")                               # a fresh start reads its own lines only (after its header)
    with open(str(log), "a") as fh:
        fh.write("[2026-12-06 20:00:00] Scheduler hit an exception: old\n")
    restart = launch(monkeypatch, dict(params, args=dict(INCIDENT, port=31111, mem_fraction_static=0.7)))
    assert restart["failed"] is False and restart["action"] == "restart", restart.get("msg")


def test_flow_a_200_from_another_process_on_the_port_is_not_health(world, tmp_path, monkeypatch):
    """The loser of a port conflict: the incumbent (PID 4242) answers 200 until the candidate exits 3."""
    world.exit_status = {"code": 3}
    world.exit_after = 3
    asked = []

    def held_by(port, pids, proc_root=None):
        asked.append((port, list(pids)))
        return {"listening": True, "ours": False, "known": True, "others": [4242]}

    monkeypatch.setattr(sockets, "port_held_by", held_by)
    world.cmdlines[4242] = ["python3", "-m", "sglang.launch_server", "--port", "31111"]
    res = launch(monkeypatch, base_params(tmp_path, health_timeout=600))
    assert res["failed"] is True and "exited with code 3" in res["msg"], res["msg"]
    assert ("HTTP 200 from PID 4242 (python3 -m sglang.launch_server --port 31111), which is not in the candidate's "
            "process tree (PID %d): another server holds port 31111" % FAKE_PID) in res["last_status"]
    assert asked and asked[0] == (31111, [FAKE_PID])


def test_flow_a_200_with_the_listener_in_the_tree_or_unknown_is_health(world, tmp_path, monkeypatch):
    answers = [{"listening": True, "ours": False, "known": False, "others": []}]
    monkeypatch.setattr(sockets, "port_held_by", lambda port, pids, proc_root=None: answers[0])
    world.info = dict(INCIDENT, port=31111)
    res = launch(monkeypatch, base_params(tmp_path))
    assert res["failed"] is False, res.get("msg")
    assert any("cannot tell which process listens on port 31111" in w for w in res["warnings"]), res["warnings"]
    answers[0] = {"listening": True, "ours": True, "known": True, "others": []}
    res = launch(monkeypatch, base_params(tmp_path, args=dict(INCIDENT, port=31111, mem_fraction_static=0.7)))
    assert res["failed"] is False and not any("cannot tell" in w for w in res.get("warnings", [])), res


def test_flow_timeout_stops_unless_keep(world, tmp_path, monkeypatch):
    world.health = [503]
    res = launch(monkeypatch, base_params(tmp_path, health_timeout=0.05))
    assert res["failed"] is True
    assert "did not become healthy within 0.05 s" in res["msg"] and "stopped it" in res["msg"]
    assert res["last_status"] == "HTTP 503" and res["stop"]["signalled"] == [FAKE_PID] and "pid" not in res
    res = launch(monkeypatch, base_params(tmp_path, health_timeout=0.05, keep_on_failure=True))
    assert "left it running" in res["msg"] and res["pid"] in world.procs


def test_flow_get_server_info_fallback_and_auth_errors(world, tmp_path, monkeypatch):
    world.info = dict(INCIDENT, port=31111)
    world.info_status = {"/get_server_info": 200}
    result = launch(monkeypatch, base_params(tmp_path))
    assert result["server_info_endpoint"] == "/get_server_info"
    world.info_status = {"/server_info": 401}
    res = launch(monkeypatch, base_params(tmp_path, state="restarted"))
    assert res["failed"] is True and "wants an API key; set api_key" in res["msg"]
    world.info_status = {}
    res = launch(monkeypatch, base_params(tmp_path, state="restarted"))
    assert "answers neither /server_info nor /get_server_info" in res["msg"]


def test_flow_old_version_puts_key_only_where_allowed(world, tmp_path, monkeypatch):
    params = base_params(tmp_path, version="0.5.1", api_key=SECRET, args={"model_path": "/m", "port": 31111})
    res = launch(monkeypatch, params)
    assert res["failed"] is True and "allow_api_key_in_argv" in res["msg"] and not world.spawned
    assert res["msg"].startswith("sglang_launch unit: cannot proceed, nothing was changed:")
    result = launch(monkeypatch, dict(params, allow_api_key_in_argv=True), check=True)
    assert result["argv"][-2:] == ["--api-key", "********"] and result["config_file"] is None
    assert any("ps" in w for w in result["warnings"]) and SECRET not in json.dumps(result)


def test_flow_blockers_are_reported_together(world, tmp_path, monkeypatch):
    params = base_params(tmp_path, name="bad name", port=1, args={"model_path": "/m", "port": 2, "bogus_flag": 1},
                         version="0.3.0", python="/nonexistent/python", chdir="/nonexistent")
    res = launch(monkeypatch, params)
    assert res["failed"] is True and res["action"] == "none"
    for part in ("name 'bad name'", "port=1 conflicts", "version:", "python: /nonexistent/python", "chdir:"):
        assert part in res["msg"], part
    assert not world.spawned and not (tmp_path / "state").exists()


def test_flow_port_owner_blocks_start(world, tmp_path, monkeypatch):
    monkeypatch.setattr(sockets, "port_listeners", lambda port: (True, [FAKE_PID + 9]))
    world.cmdlines[FAKE_PID + 9] = ["nginx", "-g", "daemon off;"]
    res = launch(monkeypatch, base_params(tmp_path))
    assert res["failed"] is True and "already in use by pid %d (nginx" % (FAKE_PID + 9) in res["msg"]
    assert "Nothing was started" in res["msg"] and not world.spawned
    result = launch(monkeypatch, base_params(tmp_path), check=True)
    assert result["failed"] is False and any("port 31111 is in use by pid" in w for w in result["warnings"])


def test_flow_required_args(world, tmp_path, monkeypatch):
    res = launch(monkeypatch, {"name": "unit", "state": "started"})
    assert res["failed"] is True and "args" in res["msg"]
    stopped = launch(monkeypatch, {"name": "unit", "state": "stopped", "state_dir": str(tmp_path / "s")})
    assert stopped["failed"] is False and stopped["action"] == "none" and "argv" not in stopped


def test_flow_systemd_start_none_stop(world, tmp_path, monkeypatch):
    params = base_params(tmp_path, manager="systemd", args={"model_path": "/m", "port": 31111})
    world.info = {"model_path": "/m", "port": 31111}
    result = launch(monkeypatch, params)
    assert result["failed"] is False, result.get("msg")
    assert result["action"] == "start" and result["pid"] == FAKE_PID + 50
    assert ["/usr/bin/systemctl", "start", "--", "sglang-unit.service"] in world.commands
    assert not any(c[1:2] == ["daemon-reload"] for c in world.commands)                  # the unit is the caller's
    del world.commands[:]
    again = launch(monkeypatch, params)
    assert again["action"] == "none" and again["pid"] == FAKE_PID + 50
    assert not any(c[1] == "start" for c in world.commands)
    stopped = launch(monkeypatch, dict(params, state="stopped"))
    assert stopped["action"] == "stop" and ["/usr/bin/systemctl", "stop", "--", "sglang-unit.service"] in world.commands
    assert stopped["stop"]["signalled"] == [FAKE_PID + 50] and stopped["stop"]["still_running"] == []


def test_flow_systemd_renders_the_unit_and_reloads_when_it_changed(world, tmp_path, monkeypatch):
    units = tmp_path / "units"
    units.mkdir()
    params = base_params(tmp_path, manager="systemd", unit_dir=str(units), python="/usr/bin/python3",
                         args={"model_path": "/m", "port": 31111}, env={"HF_TOKEN": "hf-unit-1"}, api_key=SECRET)
    world.info = {"model_path": "/m", "port": 31111}
    result = launch(monkeypatch, params)
    assert result["failed"] is False, result.get("msg")
    unit_text = (units / "sglang-unit.service").read_text()
    assert "ExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /m --port 31111 --config " in unit_text
    assert SECRET not in unit_text and "hf-unit-1" not in unit_text
    assert "EnvironmentFile=%s" % (tmp_path / "state" / "server.env") in unit_text
    assert (tmp_path / "state" / "server.env").read_text() == 'HF_TOKEN="hf-unit-1"\n'
    assert ["/usr/bin/systemctl", "daemon-reload"] in world.commands
    assert world.commands.index(["/usr/bin/systemctl", "daemon-reload"]) < world.commands.index(
        ["/usr/bin/systemctl", "start", "--", "sglang-unit.service"])


def test_flow_systemd_unit_without_main_pid(world, tmp_path, monkeypatch):
    def responder(argv):
        if argv[0].endswith("journalctl"):
            return 0, "boom from journal\n", ""
        if argv[1] == "show":
            return 0, "MainPID=0\nActiveState=failed\nResult=exit-code\nExecMainStatus=1\n", ""
        return 0, "", ""
    world.responder = responder
    res = launch(monkeypatch, base_params(tmp_path, manager="systemd", args={"model_path": "/m"}))
    assert res["failed"] is True
    assert "has no main process" in res["msg"] and "boom from journal" in res["msg"] and res["log_tail"] == ["boom from journal"]
