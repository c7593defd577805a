"""sglang_preflight (plugins/module_utils/redeploy/preflight.py, preflight.py): ``main()`` run in-process
(``patch_module_args``) against a simulated 2 x H200 node (``simulator/bin/nvidia-smi`` on a tmp
``GPUSIM_ROOT``, the node's device files passed as ``device_paths``), with the collection's mirror
resolving the args (``resolution: mirror``; the node-side oracle has its own tests).

Covered: the node facts, every check that stops a redeploy before anything is touched (settings, secrets,
model paths, GPU selection, lost GPUs, the driver, the port, foreign GPU holders, unusable directories,
the lease), the managed server found by its PID file and state record or by its systemd unit, adoption of
a hand-started server on the managed port, the plan's action (start, restart, none) from what runs and the
known-good record, the lease taken only when there is something to do (and the plan journalled), the
read-only reports in check mode, and the directory report.

Processes: the "hand-started servers" are small Python processes that listen on a port and register GPU
memory through the gpusim Python API; the foreign GPU holders are ``gpusim hold`` processes. Each is
recorded by PID and start time and SIGKILLed by PID at teardown (redeploy_testlib.Node). Port owners that
must answer HTTP are threads of this test process.
"""
from __future__ import annotations

import http.server
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpusim.checkpoint import write_checkpoint  # noqa: E402 - the shared writer
from redeploy_testlib import NVIDIA_SMI, ROLE_LABELS, SIM_PY, node_context, run_module, starttime  # noqa: E402 - after sys.path

from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import journal as journal_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import lease as lease_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import procfs
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import sockets
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import preflight as plan_mod
from ansible_collections.gpufleet.sglang.plugins.modules import sglang_preflight as pf

SECRET = "s3cret-preflight-91ab"


@pytest.fixture
def node(tmp_path, monkeypatch):
    monkeypatch.setattr(plan_mod.systemd, "running", lambda root="/run/systemd/system": False)
    yield from node_context(tmp_path, monkeypatch)


@pytest.fixture
def run(node, monkeypatch):
    """``run(check=False, **options)``: the module on the simulated node, with this test's defaults."""
    def _run(check=False, **options):
        # -v (verbosity 1): the whole result; test_a_failure_at_verbosity_0_is_short_and_starts_with_the_message
        # covers the lean one an operator reads at verbosity 0.
        args = {
            "_ansible_verbosity": 1,
            "name": node.name, "label": "gpu-01", "args": {"model_path": node.model, "host": "127.0.0.1", "port": node.port},
            "gpus": ["0"], "config_dir": str(node.config_dir), "state_dir": str(node.state_dir), "log_file": str(node.log_file),
            "nvidia_smi": NVIDIA_SMI, "backend": "nvidia-smi", "device_paths": [str(node.root / "dev" / "nvidia*")],
            "resolution": "mirror", "python": sys.executable, "manager": "process",
            "lease": {"path": str(node.lease_path), "run_id": "R1"},
            # As the sglang_server role passes them, so the messages name its variables (the module alone names its
            # options: test_a_module_used_directly_names_its_options).
            "option_labels": ROLE_LABELS,
        }
        args.update(options)
        return run_module(pf, args, monkeypatch, check=check)
    return _run


class Health(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        status = 200 if self.path == "/health" else 404
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.fixture
def answering():
    """A port owned by this test process that answers ``/health`` with 200 (a healthy server, as far as HTTP goes)."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


HAND_STARTED = textwrap.dedent(r'''
    import ctypes, json, os, signal, socket, sys
    from gpusim.node import Node
    node = Node(os.environ["GPUSIM_ROOT"])
    child = None
    gpus = [int(g) for g in sys.argv[2].split(",")]
    if sys.argv[1] == "child":
        r, w = os.pipe()
        child = os.fork()
        if child == 0:
            ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)     # PR_SET_PDEATHSIG
            node.hold(os.getpid(), gpus=gpus, mib=1000, name="sglang::scheduler")
            os.write(w, b"x")
            while True:
                signal.pause()
        os.read(r, 1)
    else:
        node.hold(os.getpid(), gpus=gpus, mib=1000)
    sock = socket.socket()
    sock.bind(("127.0.0.1", int(sys.argv[3])))
    sock.listen(8)
    print(json.dumps({"pid": os.getpid(), "child": child, "port": sock.getsockname()[1]}), flush=True)
    while True:
        signal.pause()
''')


def hand_started(node, argv_extra=(), hold_in_child=True, gpus=(0,), port=0):
    """A hand-started "server" in its own session: listens on ``port`` (0: any); it, or its forked child, holds
    1000 MiB on ``gpus``. Returns ``{"pid", "child", "port"}`` (every PID recorded for teardown)."""
    script = node.tmp / "hand_started.py"
    if not script.exists():
        script.write_text(HAND_STARTED)
    argv = [sys.executable, str(script), "child" if hold_in_child else "self", ",".join(str(g) for g in gpus),
            str(port)] + list(argv_extra)
    proc = subprocess.Popen(argv, env=dict(node.env, PYTHONPATH=str(SIM_PY)), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    node.tracked[proc.pid] = starttime(proc.pid)
    line = proc.stdout.readline()
    proc.stdout.close()
    assert line, "the hand-started server did not start"
    info = json.loads(line)
    if info["child"]:
        node.tracked[info["child"]] = starttime(info["child"])
    return info


def record_running(node, pid, fingerprint):
    """The state files the launcher writes for the server it started (PID file and state record)."""
    node.state_dir.mkdir(parents=True, exist_ok=True)
    (node.state_dir / "server.pid").write_text("%d\n" % pid)
    state = {"pid": pid, "starttime": starttime(pid), "fingerprint": fingerprint}
    (node.state_dir / "server.state.json").write_text(json.dumps(state))


def sleeper(node, *argv):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"] + list(argv), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    node.tracked[proc.pid] = starttime(proc.pid)
    return proc.pid


# ---------------------------------------------------------------------------
# A ready node
# ---------------------------------------------------------------------------

def test_ready_node_plans_a_start_takes_the_lease_and_journals_the_plan(node, run):
    draft = node.model_dir("draft", "LlamaForCausalLMEagle3")
    args = {"model_path": node.model, "speculative_algorithm": "EAGLE3", "speculative_draft_model_path": draft,
            "speculative_eagle_topk": 1, "speculative_num_steps": 1, "speculative_num_draft_tokens": 16, "tp_size": 2,
            "host": "127.0.0.1", "port": node.port}
    res = run(args=args, gpus=["0", "1"], api_key=SECRET, env={"HF_TOKEN": "hf_pf_secret"})
    assert res["failed"] is False, res.get("msg")
    assert res["problems"] == [] and res["changed"] is True
    facts = res["node"]
    assert facts["arch"] == "Qwen2ForCausalLM" and facts["draft_arch"] == "LlamaForCausalLMEagle3"
    assert facts["gpu_count"] == 2 and facts["backend"] == "nvidia-smi" and facts["systemd"] is False
    assert [g["index"] for g in facts["gpus"]] == [0, 1] and facts["gpus"][0]["name"] == "NVIDIA H200"
    assert facts["gpus"][0]["total_mib"] == 143771 and facts["gpus"][0]["uuid"].startswith("GPU-")
    assert facts["gpu"] == {"name": "NVIDIA H200", "compute_capability": "9.0", "memory_mib": 143771, "count": 2}
    assert [(p["what"], p["ok"]) for p in facts["probes"]] == [("config", True), ("state", True), ("log", True)]
    plan = res["plan"]
    assert plan["action"] == "start" and plan["why"] == "no server of ours runs on the target GPUs"
    assert plan["target_gpus"] == ["0", "1"] and plan["manager"] == "process" and plan["port_owner"] is None
    assert plan["holders"] == [] and plan["teardown_pids"] == [] and plan["running"] is None
    assert plan["rollback_ready"] is False and "no known-good config under" in plan["known_good"]["why"]
    assert plan["url"] == "http://127.0.0.1:%d" % node.port and plan["ports"][0] == node.port
    assert plan["argv"][-2:] == ["--config", str(node.config_dir / "candidate" / "config.yaml")]
    # The resolution (honor_draft_tokens): 16 draft tokens need 15 steps; the plan lines say so.
    resolved = res["resolved"]
    assert resolved["source"] == "mirror" and resolved["args"]["speculative_num_steps"] == 15
    assert any(line.startswith("speculative_num_steps: 1 -> 15 [") for line in res["lines"])
    assert res["lines"][0].startswith("gpu-01: start (no server of ours runs on the target GPUs); GPUs 0,1; manager process; "
                                      "args resolved by the collection's mirror; rollback not possible: ")
    # The lease is this run's, and the plan is in the node journal.
    assert res["lease"]["acquired"] is True and res["lease"]["generation"] == 1
    assert lease_mod.read_holder(str(node.lease_path))["owner"] == "R1"
    entry = node.journal()
    assert entry["run_id"] == "R1" and entry["step"] == journal_mod.PLANNED
    assert entry["plan"] == {"action": "start", "why": plan["why"]} and entry["intended"] == {"fingerprint": plan["fingerprint"]}
    dumped = json.dumps(res)
    assert SECRET not in dumped and "hf_pf_secret" not in dumped
    assert not (node.config_dir / "candidate").exists()                  # nothing but the lease and the journal written


def test_check_mode_plans_without_a_lease_or_journal(node, run):
    res = run(check=True)
    # changed: a real run would change the node (it would start the server).
    assert res["failed"] is False and res["changed"] is True and res["problems"] == []
    assert "diff" not in res                 # no --diff
    assert res["plan"]["action"] == "start"
    assert res["lease"] == {"acquired": False, "state": "free", "reason": "not held", "path": str(node.lease_path),
                            "holder": {}, "generation": 0, "waited": 0.0}
    assert not node.lease_path.parent.exists() and not node.state_dir.exists()


def test_auto_backend_falls_back_to_nvidia_smi(node, run, monkeypatch):
    monkeypatch.setattr(plan_mod.gpu_backends, "pynvml", None)
    res = run(backend="auto", check=True)
    assert res["problems"] == [] and res["node"]["backend"] == "nvidia-smi"


def test_nvml_backend_unavailable_fails(node, run, monkeypatch):
    monkeypatch.setattr(plan_mod.gpu_backends, "pynvml", None)
    res = run(backend="nvml", check=True)
    assert res["failed"] is True
    assert res["problems"][0] == "backend=nvml cannot be used: the pynvml module (nvidia-ml-py) is not installed"
    assert res["msg"].startswith("Preflight failed on gpu-01; the running server was not touched. backend=nvml cannot be used")


# ---------------------------------------------------------------------------
# Checks before anything is touched (each names the variable and the fix)
# ---------------------------------------------------------------------------

def test_bad_settings_fail_before_the_lease_naming_each_variable(node, run):
    res = run(settings={"sglang_server_health_timeout": 0, "gpu_verify_timeout": -1, "sglang_smoke_timeout": "soon",
                        "not_a_checked_variable": -5})
    assert res["failed"] is True
    text = "\n".join(res["problems"])
    for name in ("sglang_server_health_timeout: must be", "gpu_verify_timeout: must be", "sglang_smoke_timeout: must be"):
        assert name in text, name
    assert "not_a_checked_variable" not in text
    assert res["lease"]["acquired"] is False and not node.lease_path.exists() and not node.state_dir.exists()


@pytest.mark.parametrize("key", ["line\nbreak", "nul\0byte", " padded "])
def test_an_api_key_that_no_header_can_carry(node, run, key):
    res = run(api_key=key)
    assert res["failed"] is True and any(p.startswith("sglang_server_api_key: ") for p in res["problems"])
    assert not node.lease_path.exists()


def test_keys_in_args_are_refused_naming_the_variable_to_use(node, run):
    """Each secret form in the args is refused by field with its fix (there is no sglang_server_admin_api_key: the old
    message named it), and none of the values is in the result (at -vvv its invocation is masked too: no_log values)."""
    values = {"api_key": "sk-in-args-1", "admin_api_key": "adm-in-args-2", "hf_token": "hf_in_args_3",
              "encoder_urls": ["http://enc:urlpw-in-args-4@127.0.0.1:9/"]}
    res = run(args=dict({"model_path": node.model, "port": node.port}, **values))
    assert res["failed"] is True
    problems = " | ".join(res["problems"])
    for text in ("sglang_server_args.api_key: put the key in sglang_server_api_key instead",
                 "sglang_server_args.admin_api_key: this collection runs the server with sglang_server_api_key only",
                 "sglang_server_args.hf_token: SGLang takes no such flag; it reads the Hugging Face token from the "
                 "environment: set HF_TOKEN in sglang_server_env",
                 "sglang_server_args.encoder_urls: holds a URL with credentials"):
        assert text in problems, (text, problems)
    dumped = json.dumps(res)
    for secret in ("sk-in-args-1", "adm-in-args-2", "hf_in_args_3", "urlpw-in-args-4"):
        assert secret not in dumped


def test_a_secret_field_that_is_passed_on_is_named_never_shown(node, run):
    res = run(check=True, args={"model_path": node.model, "port": node.port, "ssl_keyfile_password": "keypw-in-args-5"})
    assert res["problems"] == [] and res["plan"]["private_args"] == ["ssl_keyfile_password"]
    assert "keypw-in-args-5" not in json.dumps(res)


def test_model_problems_name_the_variable(node, run):
    empty = node.model_dir("empty")
    res = run(args={"model_path": str(node.tmp / "nope"), "speculative_algorithm": "EAGLE3",
                    "speculative_draft_model_path": empty, "port": node.port}, check=True)
    assert res["node"]["arch"] is None and res["node"]["draft_arch"] is None
    assert ("sglang_server_args.model_path: %s does not exist or is not a directory on this node; copy the model there or fix "
            "the path" % (node.tmp / "nope")) in res["problems"]
    assert ("sglang_server_args.speculative_draft_model_path: %s has no readable config.json (No such file or directory) on "
            "this node; copy the draft model there or fix the path" % empty) in res["problems"]
    res = run(args={"port": node.port}, check=True)
    assert "sglang_server_args.model_path: not set; give the model directory on the node" in res["problems"]


def test_a_module_used_directly_names_its_options(node, run):
    """Without option_labels (ad-hoc use) the messages name the module's options, never a role's variables; with
    them, the caller's names (issue 23)."""
    bad = {"model_path": str(node.tmp / "nope"), "tp_size": -1, "port": node.port}
    plain = run(args=bad, option_labels={}, cache_dir="relative", check=True)
    assert ("args.model_path: %s does not exist or is not a directory on this node; copy the model there or fix "
            "the path" % (node.tmp / "nope")) in plain["problems"], plain["problems"]
    assert any(p.startswith("args.tp_size: must be an integer >= 1, got -1") for p in plain["problems"]), plain["problems"]
    assert any(p.startswith("cache_dir must be an absolute path, got 'relative'") for p in plain["problems"])
    assert not [p for p in plain["problems"] if "sglang_" in p], plain["problems"]
    labelled = run(args=bad, option_labels={"args": "my_args", "cache_dir": "my_cache"}, cache_dir="relative", check=True)
    assert any(p.startswith("my_args.tp_size: must be an integer >= 1, got -1") for p in labelled["problems"])
    assert any(p.startswith("my_cache must be an absolute path") for p in labelled["problems"]), labelled["problems"]
    role = run(args=bad, cache_dir="relative", check=True)
    assert any(p.startswith("sglang_server_args.tp_size: must be an integer >= 1, got -1") for p in role["problems"])
    assert any(p.startswith("sglang_server_cache_dir must be an absolute path") for p in role["problems"])


def test_a_failure_at_verbosity_0_is_short_and_starts_with_the_message(node, run):
    """What the default callback prints for a refused config: the message first, a small result (issue 25)."""
    args = {"model_path": str(node.tmp / "nope"), "port": node.port}
    full = run(args=args)
    res = run(args=args, _ansible_verbosity=0)
    assert res["failed"] is True and res["msg"] == full["msg"] and res["problems"] == full["problems"]
    assert res["msg"].startswith("Preflight failed on gpu-01; the running server was not touched. sglang_server_args.model_path: ")
    # The roles read the lease (acquired) and the report its waits and the resolution's source.
    assert res["lease"] == {"acquired": False, "waited": 0.0} and res["resolved"] == {"source": "mirror", "fallback": None}
    assert not {"node", "lines"} & set(res) and {"plan", "node", "lines"} <= set(full)
    assert res["plan"] == {"action": full["plan"]["action"], "holders": [], "port_owner": full["plan"]["port_owner"],
                           "teardown_pids": full["plan"]["teardown_pids"]}
    shown = dict((k, v) for k, v in res.items() if k not in ("invocation", "failed", "warnings"))
    text = json.dumps(shown, sort_keys=True)
    assert text.index('"msg"') < 100 and len(text) < 2048, text
    # Long options are left out of the invocation below -vvv, never a secret.
    assert res["invocation"]["module_args"]["label"] == "gpu-01"


def test_model_config_without_architectures_is_not_a_problem(node, run):
    model = node.model_dir("noarch", text='{"model_type": "qwen2"}')
    res = run(args={"model_path": model, "port": node.port}, check=True)
    assert res["problems"] == [] and res["node"]["arch"] is None


def test_gpu_selection_and_layout_problems(node, run):
    res = run(gpus=["0", "5"], args={"model_path": node.model, "port": node.port, "tp_size": 2}, check=True)
    assert [g["index"] for g in res["node"]["gpus"]] == [0]
    assert len(res["problems"]) == 1
    assert res["problems"][0].startswith("sglang_server_cuda_visible_devices / tp_size: no GPU matches '5'")
    assert res["problems"][0].endswith("; the node has 2 GPU(s)")
    res = run(gpus=["0", "1"], explicit_gpus=True, args={"model_path": node.model, "port": node.port, "tp_size": 4}, check=True)
    assert res["problems"] == ["sglang_server_cuda_visible_devices: tp_size 4 needs 4 GPU(s) per node, but it lists 2 (0,1); "
                               "list 4 GPU(s) or change the parallel layout"]


def test_lost_gpu_is_a_problem(node, run):
    node.gpusim("lose", "--gpu", 1)
    res = run(gpus=["0", "1"], args={"model_path": node.model, "port": node.port, "tp_size": 2}, check=True)
    assert res["node"]["gpu_count"] == 1
    assert len(res["problems"]) == 1 and res["problems"][0].startswith("GPU 1 is lost (")
    assert res["problems"][0].endswith("); the server cannot use it")


def test_driver_not_loaded_is_a_problem(node, run):
    node.gpusim("driver", "unload")
    res = run(check=True)
    assert res["failed"] is True and res["node"]["gpus"] == [] and res["node"]["gpu_count"] == 0
    assert res["problems"][0].startswith("nvidia-smi (sglang_server_nvidia_smi): cannot read the GPUs: the NVIDIA kernel driver "
                                         "is not loaded (nvidia-smi rc 9)")
    assert "couldn't communicate with the NVIDIA driver" in res["problems"][0]


def test_a_directory_under_a_regular_file_fails_naming_the_variable(node, run):
    blocker = node.tmp / "etc-file"
    blocker.write_text("a file")
    res = run(config_dir=str(blocker / "unit"))
    assert res["failed"] is True
    assert ("sglang_server_config_dir: the config directory %s is not usable: %s exists and is not a directory; fix it before "
            "the redeploy (nothing was touched)" % (blocker / "unit", blocker)) in res["problems"]
    assert [p["ok"] for p in res["node"]["probes"]] == [False, True, True]
    assert not node.lease_path.exists() and blocker.read_text() == "a file"
    res = run(log_file="/proc/gpufleet-h7/server.log", check=True)
    assert any(p.startswith("sglang_server_log_file: the log directory /proc/gpufleet-h7 is not usable: cannot create a file "
                            "in /proc: ") for p in res["problems"])


@pytest.mark.parametrize("mode", ["rwx", "0999", "17777", ""])
def test_bad_directory_mode_fails_naming_the_option(node, run, mode):
    res = run(directory_mode=mode, check=True)
    assert res["failed"] is True
    assert "directory_mode must be an octal string such as '0750', got %r" % mode in res["problems"]


# ---------------------------------------------------------------------------
# The port and the GPU holders
# ---------------------------------------------------------------------------

def test_foreign_port_owner_is_a_problem(node, run, answering):
    res = run(args={"model_path": node.model, "host": "127.0.0.1", "port": answering}, check=True)
    me = os.getpid()
    owner = res["plan"]["port_owner"]
    assert owner["pid"] == me and owner["managed"] is False and owner["adoptable"] is False
    assert owner["comm"] == procfs.read_comm(me)
    assert ("sglang_server_args.port: port %d is held by PID %d (%s), which is not the managed server; stop it or choose "
            "another port" % (answering, me, owner["cmdline"])) in res["problems"]


def test_a_port_listener_that_cannot_be_seen(node, run, monkeypatch):
    monkeypatch.setattr(sockets, "port_listeners", lambda port: (True, []))
    res = run(check=True)
    assert res["plan"]["port_owner"] == {"pid": None, "comm": None, "cmdline": None, "managed": False, "adoptable": False}
    assert ("sglang_server_args.port: port %d is held by a process this user cannot see, which is not the managed server; "
            "stop it or choose another port" % node.port) in res["problems"]


def test_the_managed_server_by_its_pid_file_and_record_owns_the_port(node, run, answering):
    record_running(node, os.getpid(), "sha256:older-config")
    res = run(args={"model_path": node.model, "host": "127.0.0.1", "port": answering}, check=True)
    assert res["problems"] == [], res["problems"]
    plan = res["plan"]
    assert plan["port_owner"]["managed"] is True
    assert plan["running"] == {"pid": os.getpid(), "fingerprint": "sha256:older-config", "source": "pid_file", "healthy": True}
    assert plan["action"] == "restart" and plan["why"] == "the running server (PID %d, pid_file) runs another config" % os.getpid()
    assert plan["teardown_pids"] == [os.getpid()]


def test_a_pid_file_that_names_another_process_now_is_not_the_managed_server(node, run, answering):
    other = sleeper(node, "not-a-server")
    (node.state_dir).mkdir(parents=True)
    (node.state_dir / "server.pid").write_text("%d\n" % other)
    (node.state_dir / "server.state.json").write_text(json.dumps({"pid": other, "starttime": starttime(other) + 1}))
    res = run(args={"model_path": node.model, "host": "127.0.0.1", "port": answering}, check=True)
    assert res["plan"]["running"] is None and res["plan"]["port_owner"]["managed"] is False
    assert len(res["problems"]) == 1 and "which is not the managed server" in res["problems"][0]


def test_an_unrecorded_server_in_the_pid_file_is_replaced(node, run):
    pid = sleeper(node, "-m", "sglang.launch_server", "--api-key", SECRET)
    node.state_dir.mkdir(parents=True)
    (node.state_dir / "server.pid").write_text("%d\n" % pid)
    res = run(check=True)
    running = res["plan"]["running"]
    assert running["pid"] == pid and running["source"] == "pid_file (no launch record)" and running["fingerprint"] is None
    assert res["plan"]["action"] == "restart"
    assert res["plan"]["why"] == ("the running server (PID %d, pid_file (no launch record)) was not started by this collection; "
                                  "replacing it" % pid)
    assert SECRET not in json.dumps(res)


def test_the_managed_systemd_unit_is_found_by_its_main_pid(node, run, answering, monkeypatch, tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "systemctl").write_text('#!/bin/sh\nprintf "LoadState=loaded\\nActiveState=active\\nMainPID=%s\\n'
                                      'NeedDaemonReload=no\\n" "$FAKE_MAIN_PID"\n')
    (bindir / "systemctl").chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (bindir, os.environ["PATH"]))
    monkeypatch.setenv("FAKE_MAIN_PID", str(os.getpid()))
    monkeypatch.setattr(plan_mod.systemd, "running", lambda root="/run/systemd/system": True)
    units = tmp_path / "units"
    units.mkdir()
    res = run(manager="systemd", unit_dir=str(units), args={"model_path": node.model, "host": "127.0.0.1", "port": answering},
              check=True)
    assert res["problems"] == [], res["problems"]
    assert res["node"]["systemd"] is True and res["plan"]["manager"] == "systemd"
    assert res["plan"]["running"]["pid"] == os.getpid() and res["plan"]["running"]["source"] == "unit"
    assert res["plan"]["port_owner"]["managed"] is True and res["plan"]["unit"] == "sglang-unit.service"
    assert [p["what"] for p in res["node"]["probes"]] == ["config", "state", "log", "unit"]
    monkeypatch.setattr(plan_mod.systemd, "running", lambda root="/run/systemd/system": False)
    res = run(manager="systemd", unit_dir=str(units), check=True)
    assert res["problems"][0].startswith("sglang_server_manager: systemd is not running on this node")


@pytest.mark.parametrize("hold_in_child", [True, False], ids=["child-holds", "listener-holds"])
def test_a_hand_started_server_on_the_managed_port_is_adopted(node, run, hold_in_child):
    srv = hand_started(node, ["-m", "sglang.launch_server", "--api-key", SECRET, "--hf-token", "hf_abc"],
                       hold_in_child=hold_in_child, port=node.port)
    res = run(check=True)
    assert res["problems"] == [], res["problems"]
    owner = res["plan"]["port_owner"]
    assert owner["pid"] == srv["pid"] and owner["managed"] is False and owner["adoptable"] is True
    holder = srv["child"] if hold_in_child else srv["pid"]
    assert [(h["pid"], h["class"]) for h in res["plan"]["holders"]] == [(holder, "adopted")]
    # The drain signals the server (SGLang stops its own schedulers); every holder of the plan is expected.
    assert res["plan"]["teardown_pids"] == [srv["pid"]] and holder in res["plan"]["expected_pids"]
    assert [p["pid"] for p in res["node"]["gpus"][0]["processes"]] == [holder]
    # The command line is shown with every secret masked.
    assert SECRET not in json.dumps(res) and "hf_abc" not in json.dumps(res)
    assert owner["cmdline"].endswith("-m sglang.launch_server --api-key ******** --hf-token ********")


def test_an_adopted_server_on_the_managed_port_is_the_running_server_of_the_plan(node, run):
    """The incident case: the hand-started server on the managed port is the plan's running server, and it is replaced."""
    srv = hand_started(node, port=node.port)
    res = run(check=True)
    assert res["problems"] == [] and srv["pid"] in res["plan"]["teardown_pids"]
    running = res["plan"]["running"]
    assert running is not None and running["pid"] == srv["pid"] and running["source"] == "adopted (port owner)"
    assert res["plan"]["action"] == "restart"
    assert res["plan"]["why"] == ("the running server (PID %d, adopted (port owner)) was not started by this collection; "
                                  "replacing it" % srv["pid"])


def test_a_hand_started_server_on_other_gpus_is_not_adopted(node, run):
    srv = hand_started(node, gpus=(1,), port=node.port)
    res = run(check=True)
    assert res["plan"]["port_owner"]["adoptable"] is False and len(res["problems"]) == 1
    assert "port %d is held by PID %d (" % (node.port, srv["pid"]) in res["problems"][0]


def test_a_foreign_holder_of_the_target_gpus_fails_naming_it_unless_allowed(node, run):
    other = hand_started(node, ["-m", "sglang.launch_server", "--api-key", SECRET], hold_in_child=False, gpus=(0,))
    res = run()
    assert res["failed"] is True and not node.lease_path.exists()
    holders = res["plan"]["holders"]
    assert [(h["pid"], h["class"]) for h in holders] == [(other["pid"], "foreign")]
    assert holders[0]["ports"] == [other["port"]] and holders[0]["user"] == plan_mod.pf._user(os.getuid())
    problem = [p for p in res["problems"] if p.startswith("the target GPUs are held by 1 process(es)")][0]
    assert ("PID %d (user %s, GPUs 0, ports %d): " % (other["pid"], holders[0]["user"], other["port"])) in problem
    assert "--api-key ********" in problem and SECRET not in json.dumps(res)
    assert "sglang_adopt_pids" in problem and "sglang_teardown_foreign: true" in problem
    assert res["plan"]["teardown_pids"] == []
    # Named by PID or by pattern: adopted; with allow_foreign: torn down as foreign.
    for options in ({"adopt_pids": [other["pid"]]}, {"adopt_patterns": ["launch_server .*--api-key"]}):
        adopted = run(check=True, **options)
        assert adopted["problems"] == [] and adopted["plan"]["holders"][0]["class"] == "adopted", options
    allowed = run(check=True, allow_foreign=True)
    assert allowed["problems"] == [] and allowed["plan"]["holders"][0]["class"] == "foreign"
    assert other["pid"] in allowed["plan"]["expected_pids"]
    assert any(line.startswith("GPU holder PID %d (foreign, user " % other["pid"]) for line in allowed["lines"])
    bad = run(check=True, adopt_patterns=["(unclosed"])
    assert any(p.startswith("sglang_adopt_patterns: '(unclosed' is not a valid regular expression") for p in bad["problems"])


def monitor(node, *flags):
    """A monitoring agent (``gpusim monitor``): device files open, polling, no memory, no compute process."""
    info = json.loads(node.gpusim("monitor", "--json", *flags))
    node.tracked[info["pid"]] = starttime(info["pid"])
    return info["pid"]


def test_monitoring_agents_on_the_target_gpus_are_watchers_never_blockers_or_teardown_roots(node, run):
    """Issue 28 part 1: two NVML-style agents keep the target GPU's device files open (one with /dev/nvidia-uvm, one
    without) and another team's process really uses the GPU. Only the user is refused; the agents are watchers, never
    teardown roots or expected PIDs, also with allow_foreign."""
    agents = [monitor(node, "--name", "nv-exporter"), monitor(node, "--name", "gpustat", "--no-uvm")]
    user = node.hold([0], 3000, "--name", "other-team")
    res = run(check=True)
    classes = dict((h["pid"], h["class"]) for h in res["plan"]["holders"])
    assert classes == {agents[0]: "watcher", agents[1]: "watcher", user: "foreign"}, res["plan"]["holders"]
    problem = [p for p in res["problems"] if p.startswith("the target GPUs are held by 1 process(es)")]
    assert len(problem) == 1 and "PID %d " % user in problem[0], res["problems"]
    assert all("PID %d " % pid not in " ".join(res["problems"]) for pid in agents)
    why = dict((h["pid"], h["why"]) for h in res["plan"]["holders"])
    assert why[agents[0]].startswith("watches GPU 0: it only has device files open (nvidia-uvm, nvidia0, nvidia1, nvidiactl)")
    assert "without /dev/nvidia-uvm it cannot hold a CUDA context" in why[agents[1]]
    assert any(line.startswith("GPU holder PID %d (watcher, " % agents[0]) for line in res["lines"])
    allowed = run(check=True, allow_foreign=True)
    assert allowed["problems"] == []
    for pid in agents:
        assert pid not in allowed["plan"]["teardown_pids"] and pid not in allowed["plan"]["expected_pids"]
    assert user in allowed["plan"]["teardown_pids"]
    # Without the user (stopped by its PID): nothing to refuse, the agents are only reported.
    os.kill(user, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while starttime(user) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    clean = run(check=True)
    assert clean["problems"] == [] and sorted(h["class"] for h in clean["plan"]["holders"]) == ["watcher", "watcher"]


def test_a_device_file_holder_is_no_watcher_where_nvidia_smi_cannot_name_the_user(node, run):
    """Inside a container NVML lists host PIDs that /proc does not show: the memory of that GPU is not accounted for,
    so a process that only has its device file open may be that user and is not cleared as a watcher."""
    node.hold([0], 3000, "--name", "in-a-container", "--foreign-ns")
    agent = monitor(node, "--name", "nv-exporter")
    res = run(check=True)
    entry = [h for h in res["plan"]["holders"] if h["pid"] == agent][0]
    assert entry["class"] != "watcher" and "it may be the user nvidia-smi cannot name: on GPU 0 nvidia-smi lists PID " \
        in entry["why"] and "not visible in /proc" in entry["why"], entry
    assert any("PID %d " % agent in p for p in res["problems"]), res["problems"]


def test_a_gpu_holder_that_another_port_serves_on_fails_the_port_check(node, run):
    other = hand_started(node, hold_in_child=False, gpus=(1,))
    res = run(check=True, args={"model_path": node.model, "host": "127.0.0.1", "port": node.port,
                                "nccl_port": other["port"]})
    assert any(p.startswith("port %d (" % other["port"]) and "which this deploy does not replace" in p
               for p in res["problems"]), res["problems"]


def test_a_derived_port_bound_on_all_interfaces_fails_the_port_check_of_a_loopback_server(node, run):
    """SGLang 0.5.23's scheduler store (the NCCL port) listens on all interfaces even with --host 127.0.0.1: a wildcard
    listener there holds the port for a server that binds it on loopback, and the check names it so."""
    wild = socket.socket()
    wild.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    wild.bind(("0.0.0.0", 0))
    wild.listen(1)
    try:
        port = wild.getsockname()[1]
        res = run(check=True, args={"model_path": node.model, "host": "127.0.0.1", "port": node.port, "nccl_port": port})
    finally:
        wild.close()
    found = [p for p in res["problems"] if p.startswith("port %d (" % port)]
    assert found and "which this deploy does not replace" in found[0] and "all interfaces" in found[0], res["problems"]
    entry = [e for e in res["plan"]["port_checks"] if e["port"] == port][0]
    assert entry["free"] is False and entry["held_by"] == [os.getpid()]


# ---------------------------------------------------------------------------
# The plan's action and the lease
# ---------------------------------------------------------------------------

def known_good_record(node, fingerprint, args):
    kg = node.config_dir / "known-good"
    kg.mkdir(parents=True)
    (kg / "server.json").write_text(json.dumps({"name": node.name, "version": "0.5.23", "manager": "process",
                                                "python": sys.executable, "args": args, "env": {"CUDA_VISIBLE_DEVICES": "0"},
                                                "fingerprint": fingerprint}))


def test_the_promoted_config_already_running_is_left_alone_and_takes_no_lease(node, run, answering):
    args = {"model_path": node.model, "host": "127.0.0.1", "port": answering}
    intended = run(check=True, args=args)["plan"]["fingerprint"]
    record_running(node, os.getpid(), intended)
    known_good_record(node, intended, args)
    res = run(args=args)
    assert res["failed"] is False and res["changed"] is False, res.get("msg")
    plan = res["plan"]
    assert plan["action"] == "none" and plan["why"] == "the healthy server already runs the promoted (known-good) intended config"
    assert plan["rollback_ready"] is True and plan["known_good"]["fingerprint"] == intended
    assert res["lease"]["acquired"] is False and not node.lease_path.exists()
    assert not (node.state_dir / "journal.json").exists()
    forced = run(args=args, force=True)
    assert forced["plan"]["action"] == "restart" and forced["plan"]["why"] == "sglang_redeploy_force is set"
    assert forced["lease"]["acquired"] is True and node.journal()["step"] == journal_mod.PLANNED


def test_check_mode_with_diff_shows_the_running_launch_against_the_plan_never_a_secret(node, run, answering):
    args = {"model_path": node.model, "host": "127.0.0.1", "port": answering, "mem_fraction_static": 0.85}
    secrets = dict(api_key=SECRET, env={"HF_TOKEN": "hf_pf_secret"})
    first = run(check=True, args=dict(args, port=node.port), _ansible_diff=True, **secrets)
    # A first deploy: nothing runs, every "before" is empty.
    assert first["changed"] is True and first["plan"]["action"] == "start", first.get("msg")
    assert [d["before"] for d in first["diff"]] == ["", "", ""]
    assert first["diff"][0]["before_header"] == "SGLang server %s: command line (nothing runs)" % node.name
    assert first["diff"][1]["after"] == 'api-key: "********"\n'
    assert first["diff"][2]["after"] == "CUDA_VISIBLE_DEVICES=0\nHF_TOKEN=********\n"
    intended = run(check=True, args=args, **secrets)["plan"]["fingerprint"]     # its port is not ours yet: a problem
    record_running(node, os.getpid(), intended)
    known_good_record(node, intended, args)
    res = run(check=True, args=dict(args, mem_fraction_static=0.8), _ansible_diff=True, **secrets)
    assert res["changed"] is True and res["plan"]["action"] == "restart", res["plan"]["why"]
    argv = res["diff"][0]
    assert argv["before_header"].startswith("SGLang server %s: command line (running PID %d, identity " % (node.name, os.getpid()))
    assert argv["after_header"].startswith("SGLang server %s: command line (planned, identity " % node.name)
    assert "    --mem-fraction-static 0.85" in argv["before"].splitlines()
    assert "    --mem-fraction-static 0.8" in argv["after"].splitlines()
    dumped = json.dumps(res)
    assert SECRET not in dumped and "hf_pf_secret" not in dumped
    # The plan already runs: nothing would change, no diff.
    same = run(check=True, args=args, _ansible_diff=True, **secrets)
    assert same["plan"]["action"] == "none" and same["changed"] is False and same["diff"] == []
    # A real run returns none (sglang_replace, the task that changes the node, shows it once).
    real = run(args=dict(args, mem_fraction_static=0.8), _ansible_diff=True, **secrets)
    assert real["changed"] is True and real["lease"]["acquired"] is True and "diff" not in real


def test_an_interrupted_run_is_named_in_the_plan(node, run):
    journal_mod.record(journal_mod.path_for(str(node.state_dir)), "R0", journal_mod.TEARDOWN, detail="signalling 4242")
    res = run(check=True)
    plan = res["plan"]
    assert plan["interrupted"] is True and plan["recovering"] is True and plan["action"] == "start"
    assert plan["why"] == "run R0 stopped at step teardown without settling the node and left no server running: redeploying"
    assert plan["journal"]["entry"]["run_id"] == "R0" and "history" not in plan["journal"]["entry"]
    assert any(line.startswith("journal: run R0 reached step teardown ") for line in res["lines"])


def test_a_live_lease_of_another_run_fails_the_preflight_naming_it(node, run):
    lease_mod.acquire(str(node.lease_path), "R-other", ttl=300)
    res = run()
    assert res["failed"] is True and res["lease"]["acquired"] is False
    problem = [p for p in res["problems"] if p.startswith("another redeploy holds the node lease")][0]
    assert "run R-other" in problem and "sglang_lease_break=R-other" in problem
    assert lease_mod.read_holder(str(node.lease_path))["owner"] == "R-other"
    assert not (node.state_dir / "journal.json").exists()


def test_an_expired_lease_is_taken_over_loudly(node, run):
    lease_mod.acquire(str(node.lease_path), "R-dead", ttl=30, now_fn=lambda: 1000.0)
    res = run()
    assert res["failed"] is False and res["lease"]["acquired"] is True
    assert res["lease"]["took_over"]["owner"] == "R-dead" and "its deadline passed" in res["lease"]["took_over_reason"]
    assert any(w.startswith("took over the node lease %s from run R-dead" % node.lease_path) for w in res["warnings"])
    assert any(line.startswith("lease: TOOK OVER the lease of run R-dead (") for line in res["lines"])
    assert lease_mod.read_holder(str(node.lease_path))["owner"] == "R1" and node.journal()["step"] == journal_mod.PLANNED


def test_the_lease_state_is_reported_read_only_in_check_mode(node, run):
    res = run(check=True, lease={})
    assert res["lease"] == {"acquired": False, "state": "none", "path": None}
    lease_mod.acquire(str(node.lease_path), "run-A", ttl=300)
    (node.lease_path.parent / (node.lease_path.name + ".generation")).write_text("41\n")
    res = run(check=True)
    assert res["lease"]["state"] == "live" and res["lease"]["holder"]["owner"] == "run-A" and res["lease"]["generation"] == 41
    assert lease_mod.read_holder(str(node.lease_path))["owner"] == "run-A"


# ---------------------------------------------------------------------------
# The server's directories (a read-only report)
# ---------------------------------------------------------------------------

def test_directories_report_what_exists_with_the_wanted_mode_and_owner(node, run):
    import grp
    import pwd
    me = pwd.getpwuid(os.getuid()).pw_name
    group = grp.getgrgid(os.getgid()).gr_name
    good = node.tmp / "etc-good"
    good.mkdir()
    good.chmod(0o750)
    wide = node.tmp / "state-wide"
    wide.mkdir()
    wide.chmod(0o755)
    plain = node.tmp / "a-file"
    plain.write_text("x")
    plain.chmod(0o750)
    missing = node.tmp / "log-missing" / "sub"
    dirs = [str(good), str(wide), str(plain), str(missing)]
    res = run(check=True, directories=dirs)
    got = res["node"]["directories"]
    assert [d["path"] for d in got] == dirs                              # as given, in order
    by_path = dict((d["path"], d) for d in got)
    assert by_path[str(good)] == {"path": str(good), "exists": True, "mode": "0750", "owner": me, "group": group, "ok": True}
    assert by_path[str(wide)]["mode"] == "0755" and by_path[str(wide)]["ok"] is False
    assert by_path[str(plain)]["exists"] is True and by_path[str(plain)]["ok"] is False      # not a directory
    assert by_path[str(missing)] == {"path": str(missing), "exists": False, "mode": None, "owner": None, "group": None,
                                     "ok": False}
    assert not missing.exists()                                          # read-only
    for owner, grp_ in ((me, group), (str(os.getuid()), str(os.getgid()))):
        res = run(check=True, directories=[str(good)], directory_owner=owner, directory_group=grp_)
        assert res["node"]["directories"][0]["ok"] is True, (owner, grp_)
    res = run(check=True, directories=[str(good)], directory_owner="no-such-user-x")
    assert res["node"]["directories"][0]["ok"] is False
    res = run(check=True, directories=[str(good)], directory_group="no-such-group-x")
    assert res["node"]["directories"][0]["ok"] is False
    res = run(check=True, directories=[str(good), str(wide)], directory_mode="755")
    assert [d["ok"] for d in res["node"]["directories"]] == [False, True]


def test_directory_owner_without_a_name_on_the_node(tmp_path, monkeypatch):
    def no_name(ident):
        raise KeyError(ident)

    monkeypatch.setattr(plan_mod.pwd, "getpwuid", no_name)
    monkeypatch.setattr(plan_mod.grp, "getgrgid", no_name)
    entry = plan_mod.inspect_directory(str(tmp_path), os.stat(str(tmp_path)).st_mode & 0o7777, str(os.getuid()), "")
    assert entry["owner"] == str(os.getuid()) and entry["group"] == str(os.getgid()) and entry["ok"] is True


# ---------------------------------------------------------------------------
# Bugs found by these tests (they fail until the fix in plugins/module_utils/redeploy/preflight.py / launcher.py)
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("port", [0, 70000, -1])
def test_bug_a_port_out_of_range_fails_the_preflight_naming_it(node, run, port):
    """The old preflight refused it ("port must be between 1 and 65535"); the new one plans a start with it, so the
    old server is torn down and the candidate can never bind or answer its health check (issue 12, section 3)."""
    res = run(args={"model_path": node.model, "host": "127.0.0.1", "port": port})
    assert res["failed"] is True, res["plan"]["action"]
    assert any("port" in p and "65535" in p for p in res["problems"]), res["problems"]
    assert not node.lease_path.exists()


def test_bug_the_teardown_root_of_a_foreign_server_stays_inside_its_session(node, run):
    """preflight._root climbs from a GPU holder to the top-most live ancestor below init, across session boundaries.
    A foreign server started with setsid (its own session) by some process gets that process (here the tool that
    runs the tests: the top of this test process's tree) as its "root": with allow_foreign=true the plan's
    teardown_pids name it, and the drain would SIGTERM a shell, tmux server, sshd session or supervisor that merely
    started the server. Check mode only here: nothing is signalled."""
    other = hand_started(node, hold_in_child=False, gpus=(0,))
    res = run(check=True, allow_foreign=True)
    holder = res["plan"]["holders"][0]
    assert holder["pid"] == other["pid"] and holder["class"] == "foreign"
    assert holder["root"] == other["pid"], "root %s is outside the server's session %s" % (holder["root"], holder["session"])
    assert res["plan"]["teardown_pids"] == [other["pid"]]


def test_layout_worked_out_from_the_args(node, run):
    # No GPUs given: the preflight takes the first tp_size x pp_size (x dp_size) GPUs of the node.
    res = run(gpus=[], args={"model_path": node.model, "port": node.port, "tp_size": 2}, check=True)
    assert res["problems"] == [] and res["plan"]["target_gpus"] == ["0", "1"]
    res = run(gpus=[], args={"model_path": node.model, "port": node.port, "tp_size": 1, "dp_size": 2}, check=True)
    assert res["problems"] == [] and res["plan"]["target_gpus"] == ["0", "1"]
    # More than the node has: one message with the layout and the node's GPU count.
    res = run(gpus=[], args={"model_path": node.model, "port": node.port, "tp_size": 4}, check=True)
    assert len(res["problems"]) == 1
    assert res["problems"][0].startswith("sglang_server_args.tp_size: the layout needs 4 GPU(s) per node (tp_size 4 x "
                                         "pp_size 1), but this node has 2 GPU(s)")


@pytest.mark.parametrize("field,value", [("tp_size", -1), ("tp_size", 0), ("nnodes", 0), ("mem_fraction_static", 1.5),
                                         ("speculative_num_steps", 0)])
def test_values_sglang_accepts_but_cannot_serve_are_refused(node, run, field, value):
    res = run(gpus=[], args={"model_path": node.model, "port": node.port, field: value}, check=True)
    assert len(res["problems"]) == 1, res["problems"]
    assert res["problems"][0].startswith("sglang_server_args.%s: must be " % field)
    assert res["lease"]["acquired"] is False


# -- the checkpoint, checked as the server will load it (sglang/checkpoint.py; issue 26) -------------------------
def _sharded(node, name, shards=3, arch="Qwen2ForCausalLM"):
    path = node.tmp / name
    write_checkpoint(path, config={"architectures": [arch], "model_type": "x"}, seed=name, shards=shards)
    return path


def _refused(node, run, res, field, path, *words):
    """A real run refused before the lease: one problem naming the variable and the file; nothing written."""
    assert res["failed"] is True and res["lease"]["acquired"] is False
    text = [p for p in res["problems"] if p.startswith("sglang_server_args.%s: the checkpoint " % field)]
    assert len(text) == 1, res["problems"]
    assert str(path) in text[0] and "nothing was touched" in text[0], text[0]
    for word in words:
        assert word in text[0], text[0]
    assert not node.lease_path.exists() and not (node.state_dir / "journal.json").exists()
    assert not (node.config_dir / "candidate").exists()
    return text[0]


def test_a_complete_checkpoint_passes_and_is_reported(node, run):
    model = _sharded(node, "sharded")
    res = run(check=True, args={"model_path": str(model), "host": "127.0.0.1", "port": node.port})
    assert res["problems"] == [], res["problems"]
    check = res["node"]["checkpoints"]["model_path"]
    assert check["ok"] is True and check["complete"] is True and check["files"] == 3 and check["tensors"] == 10
    assert check["bytes"] == sum(p.stat().st_size for p in model.glob("*.safetensors"))


def test_a_shard_the_index_names_but_missing_is_refused_naming_it(node, run):
    model = _sharded(node, "noshard")
    (model / "model-00002-of-00003.safetensors").unlink()
    res = run(args={"model_path": str(model), "host": "127.0.0.1", "port": node.port})
    _refused(node, run, res, "model_path", model / "model-00002-of-00003.safetensors",
             "is named by model.safetensors.index.json but missing", "copy it from the checkpoint's source")


def test_a_truncated_shard_is_refused_naming_it(node, run):
    model = _sharded(node, "truncated")
    shard = model / "model-00003-of-00003.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[:len(data) // 2])
    res = run(args={"model_path": str(model), "host": "127.0.0.1", "port": node.port})
    _refused(node, run, res, "model_path", shard, "copy it again")


def test_a_shard_whose_header_is_not_json_is_refused_naming_it(node, run):
    model = _sharded(node, "badheader")
    shard = model / "model-00001-of-00003.safetensors"
    data = bytearray(shard.read_bytes())
    data[8:12] = b"}}}}"                      # the header's length and the file's size stay
    shard.write_bytes(bytes(data))
    res = run(args={"model_path": str(model), "host": "127.0.0.1", "port": node.port})
    _refused(node, run, res, "model_path", shard, "the header is not JSON", "copy it again")


def test_a_missing_tokenizer_file_is_refused_naming_it(node, run):
    model = _sharded(node, "notokenizer", shards=1)
    (model / "tokenizer.json").unlink()
    res = run(args={"model_path": str(model), "host": "127.0.0.1", "port": node.port})
    _refused(node, run, res, "model_path", model / "tokenizer.json", "PreTrainedTokenizerFast", "tokenizer.json is missing",
             "set tokenizer_path")
    # The tokenizer from elsewhere (tokenizer_path): the model's own is not needed, the one there is checked.
    res = run(check=True, args={"model_path": str(model), "tokenizer_path": str(node.model), "host": "127.0.0.1",
                                "port": node.port})
    assert res["problems"] == [], res["problems"]
    res = run(check=True, args={"model_path": node.model, "tokenizer_path": str(model), "host": "127.0.0.1", "port": node.port})
    assert res["problems"] == ["sglang_server_args.tokenizer_path: %s asks for a fast tokenizer (PreTrainedTokenizerFast), but "
                               "tokenizer.json is missing; copy the tokenizer files there or fix the path (SGLang would fail "
                               "on it only while loading; nothing was touched)" % (model / "tokenizer_config.json")]


def test_a_model_directory_without_weights_is_refused(node, run):
    bare = node.tmp / "bare"
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    res = run(args={"model_path": str(bare), "host": "127.0.0.1", "port": node.port})
    _refused(node, run, res, "model_path", bare, "holds no weights", "Cannot find any model weights",
             "copy the checkpoint there")


def test_a_broken_draft_model_is_refused_naming_the_draft_variable(node, run):
    draft = _sharded(node, "draftbroken", shards=2, arch="LlamaForCausalLMEagle3")
    shard = draft / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-5])
    (draft / "tokenizer.json").unlink()       # the draft worker uses the target's tokenizer: not a problem
    args = {"model_path": node.model, "speculative_algorithm": "EAGLE3", "speculative_draft_model_path": str(draft),
            "speculative_eagle_topk": 1, "speculative_num_steps": 1, "speculative_num_draft_tokens": 2,
            "host": "127.0.0.1", "port": node.port}
    res = run(args=args)
    text = _refused(node, run, res, "speculative_draft_model_path", shard, "cut short")
    assert "tokenizer" not in text and len(res["problems"]) == 1
    assert res["node"]["checkpoints"]["model_path"]["ok"] is True


def test_a_load_format_that_reads_no_safetensors_is_noted_not_checked(node, run):
    bare = node.tmp / "dummy"
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    res = run(check=True, args={"model_path": str(bare), "load_format": "dummy", "host": "127.0.0.1", "port": node.port})
    assert res["problems"] == [], res["problems"]
    assert res["node"]["checkpoints"]["model_path"] == {"path": str(bare), "checked": False}
    assert any("load_format dummy, the checkpoint's weight files were not checked" in n for n in res["notes"])


def test_a_shard_the_service_user_cannot_read_is_refused(node, run, monkeypatch, tmp_path):
    # The server's user (systemd User=nobody), not this test's (root reads everything): a world-searchable
    # directory of its own, so that only the shard's mode bits decide.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "systemctl").write_text('#!/bin/sh\nprintf "LoadState=not-found\\nActiveState=inactive\\nMainPID=0\\n'
                                      'NeedDaemonReload=no\\n"\n')
    (bindir / "systemctl").chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (bindir, os.environ["PATH"]))
    monkeypatch.setattr(plan_mod.systemd, "running", lambda root="/run/systemd/system": True)
    units = tmp_path / "units"
    units.mkdir()
    base = tempfile.mkdtemp(prefix="gpufleet-ckpt-")
    try:
        os.chmod(base, 0o755)
        model = os.path.join(base, "model")
        write_checkpoint(model, config={"architectures": ["Qwen2ForCausalLM"]}, shards=2)
        os.chmod(model, 0o755)
        for name in os.listdir(model):
            os.chmod(os.path.join(model, name), 0o644)
        args = {"model_path": model, "host": "127.0.0.1", "port": node.port}
        res = run(check=True, manager="systemd", unit_dir=str(units), user="nobody", group="nogroup", args=args)
        assert res["problems"] == [], res["problems"]
        shard = os.path.join(model, "model-00002-of-00002.safetensors")
        os.chmod(shard, 0o600)
        res = run(check=True, manager="systemd", unit_dir=str(units), user="nobody", group="nogroup", args=args)
        text = [p for p in res["problems"] if p.startswith("sglang_server_args.model_path: the checkpoint ")]
        assert len(text) == 1 and shard in text[0], res["problems"]
        assert "uid %d" % pwd.getpwnam("nobody").pw_uid in text[0] and "give it read access" in text[0]
        # A process-managed server runs as this module's user (root here): the same shard is readable to it.
        res = run(check=True, args=args)
        assert res["problems"] == [], res["problems"]
    finally:
        shutil.rmtree(base)
