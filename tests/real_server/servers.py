"""Start a real SGLang 0.5.23 server, or the simulated one, holding a simulated node's GPUs.

The fixture API of the real-server stage (tests/real_server), meant for any suite that needs a
server process of either kind::

    registry = ProcessRegistry()                      # every PID started, killed at teardown
    node = GpuNode(tmp / "node", gpus=2, model="H100")
    models = Models.build(tmp / "models")            # tiny checkpoints: base, reseeded, wide, mistral
    srv = launch("real", registry, node, tmp / "real.log", models.path("base"), args=["--enable-metrics"])
    srv.wait_ready()                                 # "fired up" in its log, or AssertionError with the log
    srv.pid, srv.url, srv.port, srv.log_path, srv.tree()
    srv.request("/generate", method="POST", body={...}).json()
    rc = srv.stop()                                  # SIGTERM, wait; SIGKILL of the recorded tree on timeout

``kind`` is ``"real"`` (``.cache/real-server/venv``, tests/real_server/real_env.py) or ``"sim"``
(simulator/python). Both are started as ``python -m sglang.launch_server --model-path M
--host 127.0.0.1 --port P`` plus ``args``, on the same node (``GPUSIM_ROOT``), with
``simulator/bin`` first on PATH (``nvidia-smi``, ``gpusim``). The real one also gets
``--max-total-tokens 8192`` (unless given: without a cap its KV pool is sized from the RAM),
``SGLANG_USE_CPU_ENGINE=1`` (else its scheduler needs vllm's rotary kernels), HF offline, and
``GPUFLEET_STANDIN_CALLS`` (the stand-ins' call record: :func:`standin_calls`).
"""
from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests" / "unit" / "simulator"))
sys.path.insert(0, str(HERE))

import real_env  # noqa: E402
import sglang_helpers as sh  # noqa: E402
from sglang_helpers import GpuNode, ProcessRegistry, alive, descendants  # noqa: E402 - re-exported (__all__)

KINDS = ("sim", "real")
MODEL_SCRIPT = HERE / "model.py"
# The simulator with its own defaults, but a faster clock for generation and a short load.
SIM_ENV = {"SGLANG_SIM_STARTUP_S": "0.3", "SGLANG_SIM_WARMUP_S": "0.1", "SGLANG_SIM_TIME_SCALE": "0.05"}
REAL_ENV = {"SGLANG_USE_CPU_ENGINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
READY_LINE = "The server is fired up and ready to roll!"


class Models(object):
    """The tiny checkpoints of tests/real_server/model.py, made once (one process for all variants)."""

    VARIANTS = ("base", "reseeded", "wide", "mistral")

    def __init__(self, root: pathlib.Path):
        self.root = pathlib.Path(root)

    @classmethod
    def build(cls, root, python=None):
        root = pathlib.Path(root)
        python = python or str(real_env.ensure(log=lambda *_: None))
        code = ("import sys, pathlib; sys.path.insert(0, %r); import model\n"
                "for v in %r: model.make_model(pathlib.Path(%r) / v, v)\n" % (str(HERE), cls.VARIANTS, str(root)))
        env = dict(os.environ, **REAL_ENV)
        env.pop("PYTHONPATH", None)
        proc = subprocess.run([python, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError("making the tiny models failed:\n" + proc.stdout[-4000:])
        return cls(root)

    def path(self, variant="base") -> str:
        return str(self.root / variant)


class Server(sh.Server):
    """One server process (either kind), its log, its tree; see the module docstring."""

    kind = "sim"

    @property
    def url(self) -> str:
        return "http://127.0.0.1:%d" % self.port

    def wait_ready(self, timeout=180.0):
        """Until the ready line is in the log (the warmup done); AssertionError if it exits first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if READY_LINE in self.log():
                self.tree()
                return self
            if self.poll() is not None:
                raise AssertionError("%s server exited with %s before it was ready; log:\n%s"
                                     % (self.kind, self.poll(), self.log()[-5000:]))
            time.sleep(0.1)
        raise AssertionError("%s server not ready after %.0f s; log:\n%s" % (self.kind, timeout, self.log()[-5000:]))

    def wait_listening(self, timeout=180.0):
        """Until the HTTP port answers at all (any status)."""
        sh.wait_for(lambda: self.poll() is not None or self.status("/model_info", key=None, timeout=1) is not None,
                    timeout=timeout, interval=0.05, what="port %d to answer" % self.port)
        return self

    def stop(self, sig=signal.SIGTERM, timeout=60.0):
        """Signal the main process and wait for it; on timeout SIGKILL the recorded tree. The exit status."""
        if self.poll() is None:
            self.signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.registry.kill_all()
                self.proc.wait(timeout=10)
                raise AssertionError("%s server pid %d did not exit within %.0f s of %s; log:\n%s"
                                     % (self.kind, self.pid, timeout, sig, self.log()[-4000:]))
        self.close()
        return self.proc.returncode


class RealServer(Server):
    kind = "real"


def launch(kind, registry, node, log_path, model, args=(), env=None, port=None, host="127.0.0.1",
           calls_path=None) -> Server:
    """Start a server of ``kind`` ("real" or "sim") on ``node``; returns at once (see :meth:`Server.wait_ready`)."""
    args = list(args)
    full = ["--model-path", str(model), "--host", host] + args
    if port is None:
        port = sh.free_port()
    extra = {"PATH": "%s:%s" % (sh.SIM_BIN, os.environ.get("PATH", ""))}
    if kind == "real":
        python = str(real_env.ensure(log=lambda *_: None))
        if "--max-total-tokens" not in args:
            full += ["--max-total-tokens", "8192"]
        extra.update(REAL_ENV)
        extra["GPUFLEET_STANDIN_CALLS"] = str(calls_path or pathlib.Path(str(log_path) + ".standin-calls"))
        cls = RealServer
    elif kind == "sim":
        python = sys.executable
        extra.update(SIM_ENV)
        extra["PYTHONPATH"] = str(sh.SIM_PY)
        cls = Server
    else:
        raise ValueError("kind must be 'real' or 'sim', got %r" % (kind,))
    extra.update(env or {})
    srv = cls.__new__(cls)
    srv.registry = registry
    srv.node = node
    srv.port = port
    srv.api_key = None
    srv.log_path = pathlib.Path(log_path)
    srv.calls_path = extra.get("GPUFLEET_STANDIN_CALLS")
    full_env = node.env()
    if kind == "real":
        full_env.pop("PYTHONPATH", None)
    full_env.update(extra)
    srv.argv = [python, "-m", "sglang.launch_server"] + full + ["--port", str(port)]
    srv._log = open(srv.log_path, "wb")
    srv.proc = subprocess.Popen(srv.argv, stdout=srv._log, stderr=subprocess.STDOUT, env=full_env, cwd=str(REPO),
                                start_new_session=True)  # its own session, as a server started from a login shell or a unit
    srv.pid = srv.proc.pid
    registry.add(srv.pid)
    return srv


def standin_calls(server) -> list:
    """The stand-in calls a real server's processes recorded (empty: none was called)."""
    path = getattr(server, "calls_path", None)
    if not path or not os.path.exists(path):
        return []
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


__all__ = ["KINDS", "GpuNode", "Models", "ProcessRegistry", "RealServer", "Server", "alive", "descendants", "launch",
           "standin_calls"]
