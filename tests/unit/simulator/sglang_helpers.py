"""Helpers for the fake SGLang server tests: GPU node, model dirs, server processes.

Every process a test starts is recorded with its start time (``/proc/<pid>/stat``
field 22), together with every descendant seen while the test ran; cleanup
SIGKILLs exactly those recorded processes (never by name or pattern) and
skips a PID whose start time changed (recycled).
"""
from __future__ import annotations

import json
import os
import pathlib
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

REPO = pathlib.Path(__file__).resolve().parents[3]
SIM_BIN = REPO / "simulator" / "bin"
SIM_PY = REPO / "simulator" / "python"
GPUSIM = SIM_BIN / "gpusim"
NVIDIA_SMI = SIM_BIN / "nvidia-smi"

# Fast knobs for tests: short load/warmup/drain and a 50x faster clock.
FAST_ENV = {
    "SGLANG_SIM_STARTUP_S": "0.2",
    "SGLANG_SIM_WARMUP_S": "0.05",
    "SGLANG_SIM_SHUTDOWN_S": "0.05",
    "SGLANG_SIM_DRAIN_POLL_S": "0.05",
    "SGLANG_SIM_WATCHDOG_INTERVAL_S": "0.1",
    "SGLANG_SIM_KILL_RELEASE_S": "0.3",
    "SGLANG_SIM_TIME_SCALE": "0.02",
    # 0.5.23's crash diagnostics (5 s, then 60 s while a scheduler lives) are off, as real SGLang's own
    # variables allow; tests of the diagnostics set them back.
    "SGLANG_PYSPY_DUMP_BEFORE_CRASH": "0",
    "SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "0",
}

QWEN_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
    "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
    "intermediate_size": 18944, "vocab_size": 152064, "max_position_embeddings": 32768,
}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _binds(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port_block(span: int) -> int:
    """A base port such that base .. base + span all bind now, for a server that derives ports from one base
    (SGLang's dist_init_port + 1..6 and + 13 with attention DP).

    Taken below the kernel's ephemeral range (ip_local_port_range) and below the simulator's NCCL ports
    (22000-29999): a block inside the ephemeral range collides, under load, with the local ports of other
    tests' outgoing connections and bind(0) ports, which the kernel hands out from that range (seen in CI:
    rpc_port dist + 3 taken while the base was free)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            ephemeral_low = int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    high = min(ephemeral_low, 22000) - span - 1
    rng = random.Random()
    for _attempt in range(500):
        base = rng.randint(10000, high)
        if all(_binds(p) for p in range(base, base + span + 1)):
            return base
    raise AssertionError("no %d free ports in a row between 10000 and %d" % (span + 1, high + span))


def starttime(pid: int):
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    rest = data[data.rfind(b")") + 2:].split()
    return int(rest[19])


def state(pid: int):
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    return data[data.rfind(b")") + 2:].split()[0].decode()


def alive(pid: int) -> bool:
    return state(pid) not in (None, "Z", "X")


def children(pid: int) -> list:
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        rest = data[data.rfind(b")") + 2:].split()
        if int(rest[1]) == pid:
            out.append(int(name))
    return out


def descendants(pid: int) -> list:
    out, todo = [], [pid]
    while todo:
        cur = todo.pop()
        for c in children(cur):
            if c not in out:
                out.append(c)
                todo.append(c)
    return out


def cmdline(pid: int) -> list:
    with open("/proc/%d/cmdline" % pid, "rb") as fh:
        return [p.decode() for p in fh.read().rstrip(b"\0").split(b"\0")]


def comm(pid: int) -> str:
    with open("/proc/%d/comm" % pid) as fh:
        return fh.read().strip()


def is_resource_tracker(argv) -> bool:
    """multiprocessing's resource_tracker, the third child of a 0.5.23 main process."""
    return len(argv) == 4 and argv[1:3] == ["-B", "-c"] and \
        argv[3].startswith("from multiprocessing.resource_tracker import main;main(")


def sglang_titles(pids) -> list:
    """The sorted titles of the SGLang processes among ``pids`` (the resource_tracker left out)."""
    return sorted(cmdline(p)[0] for p in pids if alive(p) and not is_resource_tracker(cmdline(p)))


def wait_for(pred, timeout=10.0, interval=0.05, what="condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError("timed out after %.1fs waiting for %s (last: %r)" % (timeout, what, last))


class ProcessRegistry:
    """Records (pid, starttime) of started processes and their descendants."""

    def __init__(self):
        self.known = {}

    def add(self, pid: int):
        st = starttime(pid)
        if st is not None:
            self.known.setdefault(pid, st)

    def add_tree(self, pid: int):
        self.add(pid)
        for d in descendants(pid):
            self.add(d)

    def refresh(self):
        for pid in list(self.known):
            if starttime(pid) == self.known[pid]:
                for d in descendants(pid):
                    self.add(d)

    def kill_all(self):
        self.refresh()
        for pid, st in self.known.items():
            if starttime(pid) == st:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass


class GpuNode:
    """A simulated GPU node in a temporary GPUSIM_ROOT."""

    def __init__(self, root: pathlib.Path, gpus: int = 4, model: str = "H200"):
        self.root = str(root)
        subprocess.run([str(GPUSIM), "init", "--gpus", str(gpus), "--model", model],
                       env=self.env(), check=True, capture_output=True)

    def env(self, extra=None) -> dict:
        env = dict(os.environ)
        env["GPUSIM_ROOT"] = self.root
        env.pop("CUDA_VISIBLE_DEVICES", None)
        if extra:
            env.update(extra)
        return env

    def smi(self, *args) -> str:
        r = subprocess.run([str(NVIDIA_SMI)] + list(args), env=self.env(),
                           capture_output=True, text=True, check=False)
        assert r.returncode == 0, "nvidia-smi %s failed: %s%s" % (args, r.stdout, r.stderr)
        return r.stdout

    def compute_apps(self) -> list:
        out = self.smi("--query-compute-apps=pid,process_name,used_memory,gpu_uuid",
                       "--format=csv,noheader,nounits")
        rows = []
        for line in out.splitlines():
            if not line.strip() or "No running" in line:
                continue
            pid, name, mib, uuid = [x.strip() for x in line.split(",")]
            rows.append({"pid": int(pid), "name": name, "mib": int(mib), "uuid": uuid})
        return rows

    def gpus(self) -> list:
        out = self.smi("--query-gpu=index,uuid,memory.used,memory.total",
                       "--format=csv,noheader,nounits")
        rows = []
        for line in out.splitlines():
            idx, uuid, used, total = [x.strip() for x in line.split(",")]
            rows.append({"index": int(idx), "uuid": uuid, "used": int(used), "total": int(total)})
        return rows

    def used(self) -> dict:
        return {g["index"]: g["used"] for g in self.gpus()}

    def gpusim(self, *args):
        return subprocess.run([str(GPUSIM)] + list(args), env=self.env(),
                              capture_output=True, text=True, check=True)


def make_model(path: pathlib.Path, config=None) -> str:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config or QWEN_CONFIG))
    return str(path)


class Response:
    def __init__(self, status, body, headers):
        self.status = status
        self.body = body
        self.headers = headers

    def json(self):
        return json.loads(self.body.decode())


class Server:
    """One ``python -m sglang.launch_server`` process with its log file."""

    def __init__(self, registry: ProcessRegistry, node: GpuNode, log_path: pathlib.Path,
                 args: list, env=None, port=None, api_key=None, cwd=None):
        self.registry = registry
        self.node = node
        self.port = port if port is not None else free_port()
        self.api_key = api_key
        self.log_path = log_path
        full_env = node.env(FAST_ENV)
        full_env["PYTHONPATH"] = str(SIM_PY)
        full_env.update(env or {})
        self.argv = [sys.executable, "-m", "sglang.launch_server"] + list(args)
        if "--port" not in args:
            self.argv += ["--port", str(self.port)]
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=full_env, cwd=cwd or str(REPO))
        self.pid = self.proc.pid
        registry.add(self.pid)

    # -------------------------------------------------------------- state
    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def tree(self) -> list:
        d = descendants(self.pid)
        for pid in d:
            self.registry.add(pid)
        return d

    def poll(self):
        return self.proc.poll()

    def wait(self, timeout=20.0):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError("server pid %d did not exit within %.0fs; log:\n%s"
                                 % (self.pid, timeout, self.log()[-3000:]))

    def signal(self, sig):
        self.tree()
        os.kill(self.pid, sig)

    # -------------------------------------------------------------- http
    def request(self, path, method="GET", body=None, key="default", timeout=30.0, headers=None):
        url = "http://127.0.0.1:%d%s" % (self.port, path)
        data = None
        hdrs = dict(headers or {})
        if body is not None:
            data = json.dumps(body).encode()
            hdrs["Content-Type"] = "application/json"
        if key == "default":
            key = self.api_key
        if key:
            hdrs["Authorization"] = "Bearer " + key
        req = urllib.request.Request(url, data=data, headers=hdrs, method=method)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return Response(r.status, r.read(), dict(r.headers))
        except urllib.error.HTTPError as e:
            return Response(e.code, e.read(), dict(e.headers))

    def status(self, path, **kw):
        try:
            return self.request(path, **kw).status
        except (urllib.error.URLError, ConnectionError, OSError):
            return None

    # 90 s: the budget of a hang, not a speed goal. A start takes 1-3 s here alone, but the CI runs real SGLang
    # servers and other suites beside this one on 2 cores, and under that load a start was seen to take over 20 s.
    def wait_healthy(self, timeout=90.0, path="/health", ready_line=True):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.poll() is not None:
                raise AssertionError("server exited with %s before becoming healthy; log:\n%s"
                                     % (self.poll(), self.log()[-4000:]))
            if self.status(path, key=None, timeout=2) == 200 and (
                    not ready_line or "fired up and ready to roll" in self.log()):
                self.tree()
                return
            time.sleep(0.05)
        raise AssertionError("server not healthy after %.0fs; log:\n%s" % (timeout, self.log()[-4000:]))

    def close(self):
        try:
            self._log.close()
        except OSError:
            pass
