"""Unit tests for the sglang_preflight module: ``read_arch`` and the PID-file check as functions,
and ``main()`` run in-process (``patch_module_args``, ``exit_json``/``fail_json`` patched to
raise) against a simulated 2 x H200 node (a tmp ``GPUSIM_ROOT``, ``simulator/bin/nvidia-smi``).

Processes: the "foreign" port owner is a socket of this test process. The "hand-started server"
is one small Python process (optionally with one forked child) that listens on a port and
registers GPU memory through the gpusim Python API; it is recorded by PID and start time and
SIGKILLed by PID at teardown. Dead and zombie PIDs come from ``os.fork()`` children that exit at
once and are reaped here.
"""
from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

from ansible_collections.gpufleet.sglang.plugins.module_utils import procfs, sglang_process
from ansible_collections.gpufleet.sglang.plugins.modules import sglang_preflight as pf

REPO = pathlib.Path(__file__).resolve().parents[4]
SIM_BIN = REPO / "simulator" / "bin"
SIM_PY = REPO / "simulator" / "python"
NVIDIA_SMI = str(SIM_BIN / "nvidia-smi")
VENV_BIN = pathlib.Path(sys.executable).parent


# ---------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------

class Node:
    """A simulated node: GPUSIM_ROOT, model dirs, and the processes this test started."""

    def __init__(self, tmp_path, env):
        self.tmp = tmp_path
        self.root = str(tmp_path / "gpusim")
        self.env = env
        self.procs = []              # (Popen, [(pid, starttime)])
        self.model = self.model_dir("target", "Qwen2ForCausalLM")
        self.draft = self.model_dir("draft", "LlamaForCausalLMEagle3")

    def model_dir(self, name, arch=None, text=None):
        path = self.tmp / name
        path.mkdir()
        if text is None and arch is not None:
            text = json.dumps({"architectures": [arch], "model_type": "x"})
        if text is not None:
            (path / "config.json").write_text(text)
        return str(path)

    def gpusim(self, *args):
        proc = subprocess.run([str(SIM_BIN / "gpusim")] + [str(a) for a in args], env=self.env,
                              capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    def server(self, argv_extra=(), hold_in_child=True):
        """A hand-started "server": listens on a free port; it (or its forked child) holds 1000 MiB on
        GPU 0. Returns ``{"pid", "child", "port"}``."""
        code = textwrap.dedent(r'''
            import ctypes, json, os, signal, socket, sys
            from gpusim.node import Node
            node = Node(os.environ["GPUSIM_ROOT"])
            child = None
            if sys.argv[1] == "child":
                r, w = os.pipe()
                child = os.fork()
                if child == 0:
                    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)     # PR_SET_PDEATHSIG
                    node.hold(os.getpid(), gpus=[0], mib=1000, name="sglang::scheduler")
                    os.write(w, b"x")
                    while True:
                        signal.pause()
                os.read(r, 1)
            else:
                node.hold(os.getpid(), gpus=[0], mib=1000)
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sock.listen(8)
            print(json.dumps({"pid": os.getpid(), "child": child, "port": sock.getsockname()[1]}), flush=True)
            while True:
                signal.pause()
        ''')
        argv = [sys.executable, "-c", code, "child" if hold_in_child else "self"] + list(argv_extra)
        env = dict(self.env, PYTHONPATH=str(SIM_PY))
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        entry = (proc, [])
        self.procs.append(entry)
        self._track(entry, proc.pid)
        line = proc.stdout.readline()
        assert line, "the test server did not start"
        info = json.loads(line)
        if info["child"]:
            self._track(entry, info["child"])
        return info

    def decoy(self):
        """A process outside the server's tree (stands for a managed server elsewhere); returns its PID."""
        proc = subprocess.Popen(["sleep", "120"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL)
        entry = (proc, [])
        self.procs.append(entry)
        self._track(entry, proc.pid)
        return proc.pid

    @staticmethod
    def _track(entry, pid):
        stat = procfs.read_stat(pid)
        if stat is not None:
            entry[1].append((pid, stat["starttime"]))

    def cleanup(self):
        for proc, pids in self.procs:
            for pid, start in reversed(pids):
                stat = procfs.read_stat(pid)
                if stat is not None and stat["starttime"] == start:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
            proc.wait(timeout=10)
            proc.stdout.close()


@pytest.fixture
def node(tmp_path, monkeypatch):
    root = tmp_path / "gpusim"
    root.mkdir()
    monkeypatch.setenv("GPUSIM_ROOT", str(root))
    monkeypatch.setenv("PATH", "%s:%s" % (VENV_BIN, os.environ.get("PATH", "")))
    n = Node(tmp_path, dict(os.environ))
    n.gpusim("init", "--gpus", 2, "--model", "H200")
    yield n
    n.cleanup()


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
    monkeypatch.setattr(pf, "systemd_running", lambda: False)     # the container may or may not run systemd

    def _run(args, check=False):
        args = dict(args)
        args.setdefault("nvidia_smi", NVIDIA_SMI)
        args.setdefault("backend", "nvidia-smi")
        if check:
            args["_ansible_check_mode"] = True
        with patch_module_args(args):
            with pytest.raises(ExitJson) as info:
                pf.main()
        return info.value.args[0]

    return _run


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def listener():
    """A socket of this test process listening on 127.0.0.1 (a "foreign" port owner)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    yield sock.getsockname()[1]
    sock.close()


def dead_pid():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


# ---------------------------------------------------------------------------
# Pure helpers
# ---------------------------------------------------------------------------

def test_read_arch(tmp_path):
    good = tmp_path / "good"
    good.mkdir()
    (good / "config.json").write_text('{"architectures": ["DeepseekV3ForCausalLM", "X"]}')
    assert pf.read_arch(str(good)) == ("DeepseekV3ForCausalLM", None)
    missing = pf.read_arch(str(tmp_path / "missing"))
    assert missing == (None, "does not exist or is not a directory")
    assert pf.read_arch(str(good / "config.json"))[1] == "does not exist or is not a directory"   # a file
    empty = tmp_path / "empty"
    empty.mkdir()
    assert pf.read_arch(str(empty)) == (None, "has no readable config.json (No such file or directory)")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{oops")
    arch, err = pf.read_arch(str(bad))
    assert arch is None and err.startswith("has a config.json that is not valid JSON (")
    for text in ('{"model_type": "llama"}', '{"architectures": []}', '{"architectures": [3]}',
                 '{"architectures": "LlamaForCausalLM"}', '["LlamaForCausalLM"]'):
        (bad / "config.json").write_text(text)
        assert pf.read_arch(str(bad)) == (None, None), text


def test_pid_file_server_checks_liveness_and_start_time(tmp_path):
    pid_file = tmp_path / "server.pid"
    state_file = pathlib.Path(sglang_process.state_path_for(str(pid_file)))
    me = os.getpid()
    assert pf.pid_file_server(str(pid_file)) is None                     # no PID file
    pid_file.write_text("garbage\n")
    assert pf.pid_file_server(str(pid_file)) is None
    pid_file.write_text("%d\n" % me)
    assert pf.pid_file_server(str(pid_file)) == me                       # no state file: liveness only
    start = procfs.read_stat(me)["starttime"]
    state_file.write_text(json.dumps({"pid": me, "starttime": start}))
    assert pf.pid_file_server(str(pid_file)) == me
    state_file.write_text(json.dumps({"pid": me, "starttime": start + 1}))
    assert pf.pid_file_server(str(pid_file)) is None                     # the PID was reused
    state_file.write_text(json.dumps({"pid": me + 1, "starttime": start + 1}))
    assert pf.pid_file_server(str(pid_file)) == me                       # the record is about another PID
    state_file.write_text(json.dumps({"pid": me, "starttime": "not a number"}))
    assert pf.pid_file_server(str(pid_file)) == me
    pid_file.write_text("%d\n" % dead_pid())
    assert pf.pid_file_server(str(pid_file)) is None


def test_pid_file_server_zombie_is_not_running(tmp_path):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        deadline = time.monotonic() + 10
        while (procfs.read_stat(pid) or {}).get("state") != "Z" and time.monotonic() < deadline:
            time.sleep(0.01)
        (tmp_path / "server.pid").write_text(str(pid))
        assert pf.pid_file_server(str(tmp_path / "server.pid")) is None
    finally:
        os.waitpid(pid, 0)


def test_unit_main_pid(tmp_path, monkeypatch):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "systemctl").write_text('#!/bin/sh\n[ "$FAKE_RC" = 0 ] || exit "$FAKE_RC"\nprintf "%s\\n" "$FAKE_OUT"\n')
    (fake / "systemctl").chmod(0o755)

    class Module:
        def get_bin_path(self, name):
            return str(fake / name)

        def run_command(self, argv, check_rc=False):
            assert argv[1:] == ["show", "--property=MainPID", "--value", "sglang-main.service"]
            proc = subprocess.run(argv, capture_output=True, text=True, check=False)
            return proc.returncode, proc.stdout, proc.stderr

    for rc, out, expected in (("0", "4242", 4242), ("0", "0", None), ("0", "", None), ("0", "n/a", None), ("1", "4242", None)):
        monkeypatch.setenv("FAKE_RC", rc)
        monkeypatch.setenv("FAKE_OUT", out)
        assert pf.unit_main_pid(Module(), "sglang-main.service") == expected, (rc, out)
    assert pf.unit_main_pid(Module(), None) is None

    class NoSystemctl(Module):
        def get_bin_path(self, name):
            return None

    assert pf.unit_main_pid(NoSystemctl(), "sglang-main.service") is None


def test_systemd_running_reads_the_run_directory(monkeypatch):
    monkeypatch.setattr(pf.os.path, "isdir", lambda path: path == "/run/systemd/system")
    assert pf.systemd_running() is True


# ---------------------------------------------------------------------------
# main()
# ---------------------------------------------------------------------------

def test_ready_node(node, run):
    port = free_port()
    res = run({"model_path": node.model, "draft_model_path": node.draft, "port": port, "gpus": ["0", "1"],
               "api_key": "s3cret"}, check=True)
    assert res["failed"] is False and res["changed"] is False
    assert res["problems"] == []
    assert res["arch"] == "Qwen2ForCausalLM" and res["draft_arch"] == "LlamaForCausalLMEagle3"
    assert res["gpu_count"] == 2 and res["backend"] == "nvidia-smi"
    assert [g["index"] for g in res["gpus"]] == [0, 1]
    assert res["gpus"][0]["name"] == "NVIDIA H200" and res["gpus"][0]["total_mib"] == 143771
    assert res["gpus"][0]["uuid"].startswith("GPU-") and res["gpus"][0]["processes"] == []
    assert res["port_owner"] is None
    assert res["managed"] == {"pid": None, "source": None, "running": False}
    assert res["systemd"] is False


def test_auto_backend_falls_back_to_nvidia_smi_and_all_gpus_by_default(node, run):
    res = run({"model_path": node.model, "port": free_port(), "backend": "auto"})
    assert res["problems"] == [] and res["backend"] == "nvidia-smi"
    assert [g["index"] for g in res["gpus"]] == [0, 1] and res["draft_arch"] is None


def test_nvml_backend_unavailable_fails(node, run, monkeypatch):
    monkeypatch.setattr(pf.gpu_query, "pynvml", None)
    res = run({"model_path": node.model, "backend": "nvml"})
    assert res["failed"] is True and res["msg"].startswith("backend=nvml cannot be used: ")


@pytest.mark.parametrize("port", [0, 70000, -1])
def test_bad_port_fails(node, run, port):
    res = run({"model_path": node.model, "port": port})
    assert res["failed"] is True and res["msg"] == "port must be between 1 and 65535, got %d" % port


def test_model_problems_name_the_variable(node, run):
    empty = node.model_dir("empty")
    res = run({"model_path": str(node.tmp / "nope"), "draft_model_path": empty, "port": free_port()})
    assert res["failed"] is False
    assert res["arch"] is None and res["draft_arch"] is None
    assert res["problems"] == [
        "sglang_server_args.model_path: %s does not exist or is not a directory on this node; "
        "copy the model there or fix the path" % (node.tmp / "nope"),
        "sglang_server_args.speculative_draft_model_path: %s has no readable config.json (No such file or directory) "
        "on this node; copy the draft model there or fix the path" % empty,
    ]


def test_model_config_without_architectures_is_not_a_problem(node, run):
    model = node.model_dir("noarch", text='{"model_type": "qwen2"}')
    res = run({"model_path": model, "port": free_port()})
    assert res["problems"] == [] and res["arch"] is None


def test_gpu_selection_problems(node, run):
    res = run({"model_path": node.model, "port": free_port(), "gpus": ["0", "5"]})
    assert [g["index"] for g in res["gpus"]] == [0]
    assert len(res["problems"]) == 1
    assert res["problems"][0].startswith("sglang_server_cuda_visible_devices / tp_size: no GPU matches '5'")
    assert res["problems"][0].endswith("; the node has 2 GPU(s)")


def test_lost_gpu_is_a_problem(node, run):
    node.gpusim("lose", "--gpu", 1)
    res = run({"model_path": node.model, "port": free_port(), "gpus": ["0", "1"]})
    assert res["gpu_count"] == 1
    assert len(res["problems"]) == 1 and res["problems"][0].startswith("GPU 1 is lost (")
    assert res["problems"][0].endswith("); the server cannot use it")


def test_driver_not_loaded_is_a_problem(node, run):
    node.gpusim("driver", "unload")
    res = run({"model_path": node.model, "port": free_port(), "gpus": ["0"]})
    assert res["failed"] is False
    assert res["gpus"] == [] and res["gpu_count"] == 0
    assert len(res["problems"]) == 1
    problem = res["problems"][0]
    assert problem.startswith("nvidia-smi does not answer: the NVIDIA kernel driver is not loaded (nvidia-smi rc 9)")
    assert "couldn't communicate with the NVIDIA driver" in problem


def test_foreign_port_owner_is_a_problem(node, run, listener):
    res = run({"model_path": node.model, "port": listener, "gpus": ["0"]})
    me = os.getpid()
    owner = res["port_owner"]
    assert owner["pid"] == me and owner["managed"] is False and "adoptable" not in owner
    assert owner["comm"] == procfs.read_comm(me)
    assert owner["cmdline"] == " ".join(procfs.read_cmdline(me))
    assert res["problems"] == [
        "sglang_server_args.port: port %d is held by PID %d (%s), which is not the managed server; "
        "stop it or choose another port" % (listener, me, owner["cmdline"])]


def test_port_owner_in_the_managed_tree_via_pid_file(node, run, listener, tmp_path):
    pid_file = tmp_path / "state" / "server.pid"
    pid_file.parent.mkdir()
    pid_file.write_text("%d\n" % os.getpid())
    res = run({"model_path": node.model, "port": listener, "pid_file": str(pid_file)})
    assert res["problems"] == []
    assert res["managed"] == {"pid": os.getpid(), "source": "pid_file", "running": True}
    assert res["port_owner"]["managed"] is True


def test_stale_pid_file_is_not_the_managed_server(node, run, listener, tmp_path):
    """The PID in the file now names another process (start time differs): a problem, not managed."""
    pid_file = tmp_path / "server.pid"
    pid_file.write_text(str(os.getpid()))
    start = procfs.read_stat(os.getpid())["starttime"]
    pathlib.Path(sglang_process.state_path_for(str(pid_file))).write_text(json.dumps({"pid": os.getpid(), "starttime": start - 1}))
    res = run({"model_path": node.model, "port": listener, "pid_file": str(pid_file)})
    assert res["managed"] == {"pid": None, "source": None, "running": False}
    assert res["port_owner"]["managed"] is False and len(res["problems"]) == 1


def test_dead_pid_file_and_unit_fallback(node, run, listener, tmp_path, monkeypatch):
    pid_file = tmp_path / "server.pid"
    pid_file.write_text(str(dead_pid()))
    calls = []

    def main_pid(module, unit):
        calls.append(unit)
        return os.getpid()

    monkeypatch.setattr(pf, "unit_main_pid", main_pid)
    without = run({"model_path": node.model, "port": listener, "pid_file": str(pid_file), "unit": "sglang-main.service"})
    assert without["managed"]["pid"] is None and calls == []           # no systemd on the node: the unit is not asked
    monkeypatch.setattr(pf, "systemd_running", lambda: True)
    res = run({"model_path": node.model, "port": listener, "pid_file": str(pid_file), "unit": "sglang-main.service"})
    assert calls == ["sglang-main.service"]
    assert res["systemd"] is True
    assert res["managed"] == {"pid": os.getpid(), "source": "unit", "running": True}
    assert res["port_owner"]["managed"] is True and res["problems"] == []
    monkeypatch.setattr(pf, "unit_main_pid", lambda module, unit: None)
    stopped = run({"model_path": node.model, "port": listener, "unit": "sglang-main.service"})
    assert stopped["managed"] == {"pid": None, "source": None, "running": False}


def test_port_listener_that_cannot_be_seen(node, run, monkeypatch):
    monkeypatch.setattr(pf.sockets, "port_listeners", lambda port: (True, []))
    res = run({"model_path": node.model, "port": 30000})
    assert res["port_owner"] == {"pid": None, "comm": None, "cmdline": None, "managed": False}
    assert res["problems"] == ["sglang_server_args.port: port 30000 is held by a process this user cannot see, "
                               "which is not the managed server; stop it or choose another port"]


@pytest.mark.parametrize("hold_in_child", [True, False], ids=["child-holds", "listener-holds"])
def test_hand_started_server_holding_the_target_gpus_is_adoptable(node, run, hold_in_child):
    srv = node.server(argv_extra=["-m", "sglang.launch_server", "--api-key", "s3cret", "--hf-token", "hf_abc"],
                      hold_in_child=hold_in_child)
    res = run({"model_path": node.model, "port": srv["port"], "gpus": ["0", "1"]})
    owner = res["port_owner"]
    assert owner["pid"] == srv["pid"] and owner["managed"] is False and owner["adoptable"] is True
    assert res["problems"] == []
    holder = srv["child"] if hold_in_child else srv["pid"]
    assert [p["pid"] for p in res["gpus"][0]["processes"]] == [holder]
    # The command line is shown with every secret masked.
    assert "s3cret" not in json.dumps(res) and "hf_abc" not in json.dumps(res)
    assert owner["cmdline"].endswith("-m sglang.launch_server --api-key ******** --hf-token ********")


def test_hand_started_server_on_other_gpus_or_beside_a_managed_server_is_a_problem(node, run, tmp_path):
    srv = node.server(hold_in_child=True)
    other = run({"model_path": node.model, "port": srv["port"], "gpus": ["1"]})
    assert "adoptable" not in other["port_owner"] and len(other["problems"]) == 1
    assert "port %d is held by PID %d (" % (srv["port"], srv["pid"]) in other["problems"][0]
    managed = node.decoy()                           # a managed server runs, elsewhere
    pid_file = tmp_path / "server.pid"
    pid_file.write_text(str(managed))
    beside = run({"model_path": node.model, "port": srv["port"], "gpus": ["0"], "pid_file": str(pid_file)})
    assert beside["managed"]["pid"] == managed
    assert "adoptable" not in beside["port_owner"] and len(beside["problems"]) == 1


# ---------------------------------------------------------------------------
# The node lock's state and the server's directories (read-only reports)
# ---------------------------------------------------------------------------

def test_lock_state_is_reported_without_touching_the_lock(node, run, tmp_path):
    lock = tmp_path / "locks" / "gpufleet-sglang-main.lock"
    res = run({"model_path": node.model, "port": free_port()})
    assert res["lock"] is None                                           # not asked
    res = run({"model_path": node.model, "port": free_port(), "lock_path": str(lock)})
    assert res["lock"] == {"path": str(lock), "held": False, "owner": None, "generation": 0}
    assert not lock.parent.exists()                                      # read-only: nothing created
    lock.parent.mkdir()
    lock.mkdir()
    (lock / "holder.json").write_text(json.dumps({"owner": "run-A"}))
    (tmp_path / "locks" / "gpufleet-sglang-main.lock.generation").write_text("41\n")
    res = run({"model_path": node.model, "port": free_port(), "lock_path": str(lock)}, check=True)
    assert res["lock"] == {"path": str(lock), "held": True, "owner": "run-A", "generation": 41}
    assert (lock / "holder.json").exists()


def test_directories_report_what_exists_with_the_wanted_mode_and_owner(node, run, tmp_path):
    import grp
    import pwd
    me = pwd.getpwuid(os.getuid()).pw_name
    group = grp.getgrgid(os.getgid()).gr_name
    good = tmp_path / "etc"
    good.mkdir()
    good.chmod(0o750)
    wide = tmp_path / "state"
    wide.mkdir()
    wide.chmod(0o755)
    plain = tmp_path / "a-file"
    plain.write_text("x")
    plain.chmod(0o750)
    missing = tmp_path / "log" / "sub"
    dirs = [str(good), str(wide), str(plain), str(missing)]
    res = run({"model_path": node.model, "port": free_port(), "directories": dirs})
    assert [d["path"] for d in res["directories"]] == dirs              # as given, in order
    by_path = {d["path"]: d for d in res["directories"]}
    assert by_path[str(good)] == {"path": str(good), "exists": True, "mode": "0750", "owner": me, "group": group, "ok": True}
    assert by_path[str(wide)]["mode"] == "0755" and by_path[str(wide)]["ok"] is False
    assert by_path[str(plain)]["exists"] is True and by_path[str(plain)]["ok"] is False      # not a directory
    assert by_path[str(missing)] == {"path": str(missing), "exists": False, "mode": None, "owner": None, "group": None, "ok": False}
    assert not missing.exists()                                          # read-only
    # The owner and group count when given, by name or by number.
    for owner, grp_ in ((me, group), (str(os.getuid()), str(os.getgid()))):
        res = run({"model_path": node.model, "port": free_port(), "directories": [str(good)],
                   "directory_owner": owner, "directory_group": grp_})
        assert res["directories"][0]["ok"] is True, (owner, grp_)
    res = run({"model_path": node.model, "port": free_port(), "directories": [str(good)], "directory_owner": "no-such-user-x"})
    assert res["directories"][0]["ok"] is False
    res = run({"model_path": node.model, "port": free_port(), "directories": [str(good)], "directory_group": "no-such-group-x"})
    assert res["directories"][0]["ok"] is False
    # Another mode is asked for: the 0750 directory needs a change.
    res = run({"model_path": node.model, "port": free_port(), "directories": [str(good), str(wide)], "directory_mode": "755"})
    assert [d["ok"] for d in res["directories"]] == [False, True]


@pytest.mark.parametrize("mode", ["rwx", "0999", "17777", ""])
def test_bad_directory_mode_fails_naming_the_option(node, run, mode):
    res = run({"model_path": node.model, "port": free_port(), "directory_mode": mode})
    assert res["failed"] is True
    assert res["msg"] == "directory_mode must be an octal string such as '0750', got %r" % mode


def test_directory_owner_without_a_name_on_the_node(tmp_path, monkeypatch):
    def no_name(ident):
        raise KeyError(ident)

    monkeypatch.setattr(pf.pwd, "getpwuid", no_name)
    monkeypatch.setattr(pf.grp, "getgrgid", no_name)
    entry = pf.inspect_directory(str(tmp_path), pf.stat.S_IMODE(os.stat(str(tmp_path)).st_mode), str(os.getuid()), "")
    assert entry["owner"] == str(os.getuid()) and entry["group"] == str(os.getgid()) and entry["ok"] is True
