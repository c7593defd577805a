"""Shared helpers of the redeploy module tests (sglang_replace, sglang_promote, sglang_preflight, node_lock).

- :func:`run_module`: ``main()`` of a module in-process, the ansible-core way (``patch_module_args``),
  with ``exit_json``/``fail_json`` patched to raise and ``warn`` recorded.
- :class:`Node`: one simulated GPU node in a tmp ``GPUSIM_ROOT`` (``simulator/bin/nvidia-smi`` and
  ``gpusim``), its model directory, the server's config/state/log directories, and the launch of the
  simulator's fake SGLang server (``python -m sglang.launch_server`` from ``simulator/python``, with the
  fast start-up and shutdown knobs of ``tests/integration/playbook_helpers.py``).

Processes: GPU holders come from ``gpusim hold --json`` (the holder, its watcher and keepers are recorded
by PID and start time). Servers started by a module under test are recorded by the test from the module's
result (and from the state file); at teardown every recorded PID, and every member of a recorded server's
session (the server is its session leader), is SIGKILLed by PID while its start time still matches.
Nothing is ever matched by name or pattern.
"""
from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import pytest
import yaml

from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

from ansible_collections.gpufleet.sglang.plugins.module_utils.node import procfs
from gpusim.checkpoint import write_checkpoint

REPO = pathlib.Path(__file__).resolve().parents[4]
SIM_BIN = REPO / "simulator" / "bin"
SIM_PY = REPO / "simulator" / "python"
NVIDIA_SMI = str(SIM_BIN / "nvidia-smi")
# The option_labels the sglang_server role gives its modules (roles/sglang_server/vars/main.yml): a module run with
# them names the role's variables, as a playbook shows them.
with open(REPO / "roles" / "sglang_server" / "vars" / "main.yml") as _vars:
    ROLE_LABELS = yaml.safe_load(_vars)["_sglang_server_option_labels"]

# tests/integration/playbook_helpers.py FAST_SERVER_ENV: short load, warmup, shutdown and poll intervals.
FAST_SERVER_ENV = {
    "SGLANG_SIM_STARTUP_S": "0.3",
    "SGLANG_SIM_WARMUP_S": "0.05",
    "SGLANG_SIM_SHUTDOWN_S": "0.05",
    "SGLANG_SIM_DRAIN_POLL_S": "0.05",
    "SGLANG_SIM_KILL_RELEASE_S": "0.2",
    "SGLANG_SIM_WATCHDOG_INTERVAL_S": "0.2",
    "SGLANG_SIM_SCHEDULER_EXIT_TIMEOUT_S": "3",
}


class ModuleExit(Exception):
    pass


def run_module(module, args, monkeypatch, check=False):
    """``module.main()`` with ``args``; the result dict (``failed`` always set, ``warnings`` = what ``warn`` got)."""
    warnings = []

    def exit_json(self, **kwargs):
        kwargs.setdefault("changed", False)
        kwargs["failed"] = False
        raise ModuleExit(kwargs)

    def fail_json(self, msg, **kwargs):
        kwargs.update(failed=True, msg=msg)
        raise ModuleExit(kwargs)

    monkeypatch.setattr(basic.AnsibleModule, "exit_json", exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)
    monkeypatch.setattr(basic.AnsibleModule, "warn", lambda self, msg, **kw: warnings.append(msg))
    args = dict(args)
    if check:
        args["_ansible_check_mode"] = True
    with patch_module_args(args):
        with pytest.raises(ModuleExit) as info:
            module.main()
    result = info.value.args[0]
    result["warnings"] = warnings
    return result


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def starttime(pid):
    stat = procfs.read_stat(pid)
    return None if stat is None else stat["starttime"]


def alive(pid):
    stat = procfs.read_stat(pid)
    return stat is not None and not procfs.is_exited(stat["state"], stat["num_threads"])


def session_of(sid):
    """PIDs of the live processes in session ``sid``."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        stat = procfs.read_stat(int(name))
        if stat is not None and stat.get("sid") == sid:
            out.append(int(name))
    return sorted(out)


def mode_of(path):
    return oct(os.stat(str(path)).st_mode & 0o7777)


class Node(object):
    """A simulated node (``gpus`` x H200) with the directories of one server named ``name``."""

    def __init__(self, tmp_path, gpus=2, name="unit"):
        self.tmp = pathlib.Path(tmp_path)
        self.root = self.tmp / "gpusim"
        self.root.mkdir()
        self.name = name
        self.env = dict(os.environ, GPUSIM_ROOT=str(self.root), PATH="%s:%s" % (SIM_BIN, os.environ.get("PATH", "")))
        self.config_dir = self.tmp / "etc" / name
        self.state_dir = self.tmp / "state" / name
        self.log_file = self.tmp / "log" / name / "server.log"
        self.lease_path = self.tmp / "lock" / ("gpufleet-sglang-%s.lock" % name)
        self.model = self.model_dir("model", "Qwen2ForCausalLM")
        self.port = free_port()
        self.tracked = {}          # pid -> starttime (GPU holders and their helpers)
        self.servers = {}          # pid -> starttime (session leaders started by a module under test)
        self.gpusim("init", "--gpus", gpus, "--model", "H200")

    # -- the simulator ---------------------------------------------------------
    def gpusim(self, *args):
        proc = subprocess.run([str(SIM_BIN / "gpusim")] + [str(a) for a in args], env=self.env, capture_output=True,
                              text=True, timeout=60, check=False)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    def hold(self, gpus, mib=1000, *flags):
        info = json.loads(self.gpusim("hold", "--gpus", ",".join(str(g) for g in gpus), "--mib", mib, "--json", *flags))
        for pid in [info["pid"], info.get("watcher_pid")] + list(info.get("keepers") or []):
            pid = pid.get("pid") if isinstance(pid, dict) else pid
            if pid and starttime(pid) is not None:
                self.tracked[pid] = starttime(pid)
        return info["pid"]

    def used(self, gpu):
        return [g for g in json.loads(self.gpusim("status"))["gpus"] if g["index"] == gpu][0]["used_mib"]

    def model_dir(self, name, arch=None, text=None):
        path = self.tmp / name
        path.mkdir()
        if text is None and arch is not None:
            text = json.dumps({"architectures": [arch], "model_type": "x"})
        if text is not None:
            (path / "config.json").write_text(text)
            # A model the preflight accepts: valid tiny safetensors weights and tokenizer files (the shared writer).
            write_checkpoint(path, seed=name)
        return str(path)

    # -- the server's launch, as the role passes it to sglang_replace ------------
    def server_env(self, gpus=(0,), **extra):
        env = dict(FAST_SERVER_ENV, PYTHONPATH=str(SIM_PY), GPUSIM_ROOT=str(self.root),
                   CUDA_VISIBLE_DEVICES=",".join(str(g) for g in gpus))
        env.update(extra)
        return env

    def launch(self, args=None, env=None, **extra):
        params = {
            "name": self.name, "version": "0.5.23", "manager": "process", "python": sys.executable,
            "args": dict({"model_path": self.model, "host": "127.0.0.1", "port": self.port}, **(args or {})),
            "env": env if env is not None else self.server_env(),
            "config_dir": str(self.config_dir), "state_dir": str(self.state_dir), "log_file": str(self.log_file),
            "health_path": "/health_generate", "health_timeout": 60, "stop_timeout": 10, "on_override": "fail",
        }
        params.update(extra)
        return params

    def teardown(self, gpus=(0,), pids=(), **extra):
        params = {"gpus": list(gpus), "pids": list(pids), "expected_pids": list(pids), "nvidia_smi": NVIDIA_SMI,
                  "device_paths": [str(self.root / "dev" / "nvidia*")], "term_timeout": 10, "kill_timeout": 5}
        params.update(extra)
        return params

    def directories(self):
        return {"paths": [str(self.config_dir), str(self.config_dir / "candidate"), str(self.config_dir / "known-good"),
                          str(self.state_dir), str(self.log_file.parent)], "mode": "0750"}

    # -- what runs ---------------------------------------------------------------
    def track_server(self, pid):
        if pid and pid != os.getpid() and starttime(pid) is not None:
            self.servers[pid] = starttime(pid)
        return pid

    def state(self):
        try:
            return json.loads((self.state_dir / "server.state.json").read_text())
        except (OSError, ValueError):
            return {}

    def journal(self):
        return json.loads((self.state_dir / "journal.json").read_text())

    def running_pid(self):
        """The PID in the state file while that process still runs (recorded for teardown)."""
        state = self.state()
        pid = state.get("pid")
        if pid and starttime(pid) == state.get("starttime"):
            return self.track_server(pid)
        return None

    def cleanup(self):
        # Never this test process, its session or its ancestors (a test may name this process as "the server").
        mine = set([os.getpid(), os.getsid(0)] + list(procfs.self_and_ancestors()))
        pid = self.state().get("pid")
        if pid and pid not in mine and starttime(pid) == self.state().get("starttime"):
            self.servers.setdefault(pid, starttime(pid))
        victims = []
        for leader, start in self.servers.items():
            if leader in mine:
                continue
            if starttime(leader) == start:
                victims.append((leader, start))
            stat = procfs.read_stat(leader)
            if stat is not None and stat["sid"] == leader:         # a session leader: the server's own session
                for member in session_of(leader):
                    if member != leader:
                        victims.append((member, starttime(member)))
        victims += [(pid, start) for pid, start in self.tracked.items() if pid not in mine]
        for pid, start in victims:
            if start is not None and starttime(pid) == start:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        deadline = time.monotonic() + 10
        for pid, _start in victims:
            while alive(pid) and time.monotonic() < deadline:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
                time.sleep(0.02)


def node_context(tmp_path, monkeypatch):
    """The body of a ``node`` fixture (``yield from node_context(tmp_path, monkeypatch)``): a :class:`Node` with
    GPUSIM_ROOT and PATH set for the modules, the signal handlers restored and every process cleaned up after."""
    n = Node(tmp_path)
    monkeypatch.setenv("GPUSIM_ROOT", str(n.root))
    monkeypatch.setenv("PATH", n.env["PATH"])
    # sglang_replace installs SIGTERM/SIGINT/SIGHUP handlers in the process that runs it: put pytest's back.
    saved = dict((sig, signal.getsignal(sig)) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP))
    try:
        yield n
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        n.cleanup()
