"""Shared fixtures for integration tests: a simulated GPU node, process
bookkeeping, and running modules through Ansible.

Fixtures
--------
``procs``
    A :class:`ProcTracker`. Every process a test starts goes through it
    (``procs.spawn(argv)`` or ``procs.track(pid)``); at teardown each one that
    is still the *same* process (PID and start time) is SIGKILLed by PID and
    reaped. Nothing is ever killed by name or pattern.

``sim_node``
    A :class:`SimNode`: a fresh ``GPUSIM_ROOT`` in the test's tmp dir,
    initialised with ``gpusim init --gpus 8 --model H200``, with ``env``
    (PATH with ``simulator/bin`` first, ``GPUSIM_ROOT``,
    ``ANSIBLE_COLLECTIONS_PATH``, ``PYTHONPATH`` for the simulator package)
    and helpers: ``gpusim(...)``, ``hold(...)`` (returns the holder PID and
    tracks every process it creates), ``smi(...)``, ``status()``,
    ``used(gpu)``, ``spawn_tree(...)`` (a small server tree: a session-leader
    root whose children hold GPU memory, like SGLang's launch_server and its
    ``sglang::scheduler_TP*`` children), ``spawn_sglang(...)`` (the
    simulator's fake SGLang server, healthy) and ``spawn_decoy(...)``.

``run_module``
    ``run_module(name, args, env, check=False, diff=False)`` runs
    ``ansible localhost -c local -m gpufleet.sglang.NAME -a JSON`` and returns
    the module result as a dict, with ``failed`` always present and
    ``_wall`` (seconds the ansible command took) added.

``run_play``
    ``run_play(tasks, env, check=False, diff=False)`` runs the task list (plain
    dicts, as in a playbook) in one ``ansible-playbook`` on localhost and
    returns one result dict per task, in order. Ansible starts once, which
    matters on a loaded 2-core CI machine. Add ``ignore_errors: true`` to a
    task that is expected to fail when later tasks must still run.
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
import urllib.request

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
SIM_BIN = REPO / "simulator" / "bin"
SIM_PY = REPO / "simulator" / "python"
COLLECTIONS = REPO / ".collections"
VENV_BIN = pathlib.Path(sys.executable).parent


def _starttime(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    rest = data[data.rfind(b")") + 2:].split()
    try:
        return int(rest[19])
    except (IndexError, ValueError):
        return None


def _state(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    return data[data.rfind(b")") + 2:].split()[0].decode()


def alive(pid, starttime=None):
    """True while ``pid`` runs (not a zombie), with ``starttime`` when given."""
    state = _state(pid)
    if state is None or state in ("Z", "X"):
        return False
    return starttime is None or _starttime(pid) == starttime


def wait_until(predicate, timeout=10.0, interval=0.02):
    """Poll ``predicate`` until true or ``timeout``; returns its last value."""
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= end:
            return value
        time.sleep(interval)


class ProcTracker:
    """Processes started by a test, killed by PID (and start time) at teardown."""

    def __init__(self):
        self.entries = []      # (pid, starttime)
        self.popens = []

    def track(self, pid):
        pid = int(pid)
        start = _starttime(pid)
        if start is not None and (pid, start) not in self.entries:
            self.entries.append((pid, start))
        return pid

    def spawn(self, argv, env=None, new_session=True, stdout=subprocess.DEVNULL, **kw):
        proc = subprocess.Popen(argv, env=env, start_new_session=new_session, stdin=subprocess.DEVNULL,
                                stdout=stdout, stderr=subprocess.DEVNULL, **kw)
        self.popens.append(proc)
        wait_until(lambda: _starttime(proc.pid) is not None, timeout=5)
        self.track(proc.pid)
        return proc

    wait_until = staticmethod(wait_until)

    def alive(self, pid):
        """True while a tracked (or any) PID runs as the same process, not a zombie."""
        for p, start in self.entries:
            if p == pid:
                return alive(pid, start)
        return alive(pid)

    def cleanup(self):
        for pid, start in reversed(self.entries):
            if _starttime(pid) == start:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        for proc in self.popens:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()


@pytest.fixture
def procs():
    tracker = ProcTracker()
    yield tracker
    tracker.cleanup()


# A small server tree: the root leads its own session and process group (as
# under systemd or setsid) and forks children that each hold memory on GPUs
# through the simulator, like SGLang's launch_server and its schedulers.
TREE_SCRIPT = textwrap.dedent(r'''
    import ctypes, json, os, signal, sys, time
    from gpusim import node as gnode
    from gpusim import procfs as gprocfs

    cfg = json.loads(sys.argv[1])
    node = gnode.Node.from_env()
    libc = ctypes.CDLL(None, use_errno=True)
    children = []
    ready_r, ready_w = os.pipe()
    for rank, gpus in enumerate(cfg["ranks"]):
        pid = os.fork()
        if pid == 0:
            os.close(ready_r)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)       # PR_SET_PDEATHSIG
            gprocfs.set_comm(cfg.get("child_name", "sglang::scheduler_TP%d") % rank)
            if cfg.get("child_ignore_sigterm"):
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            fds = [os.open(node.device_path(g), os.O_RDWR) for g in gpus]
            node.hold(os.getpid(), gpus=gpus, mib=cfg["mib"], name=cfg.get("proc_name"),
                      release_delay=cfg.get("release_delay", 0.0))
            os.write(ready_w, b"x")
            while True:
                signal.pause()
        children.append(pid)
    os.close(ready_w)
    for _ in children:
        os.read(ready_r, 1)

    def on_term(signum, frame):
        time.sleep(cfg.get("term_delay", 0.0))
        for pid in children:                  # like kill_process_tree(include_parent=False)
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for pid in children:
            try:
                os.waitpid(pid, 0)
            except OSError:
                pass
            node.mark_exited(pid)
        os._exit(0)

    if cfg.get("ignore_sigterm"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, on_term)
    sys.stdout.write(json.dumps({"root": os.getpid(), "children": children}) + "\n")
    sys.stdout.flush()
    while True:
        signal.pause()
''')


class SimNode:
    """A simulated 8 x H200 node in its own ``GPUSIM_ROOT``."""

    def __init__(self, root, procs, tmp_path):
        self.root = str(root)
        self.procs = procs
        self.tmp_path = tmp_path
        self.env = dict(os.environ)
        self.env.update({
            "GPUSIM_ROOT": self.root,
            "PATH": "%s:%s:%s" % (SIM_BIN, VENV_BIN, os.environ.get("PATH", "")),
            "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS),
            "PYTHONPATH": str(SIM_PY),
        })
        self.env.pop("ANSIBLE_CONFIG", None)
        self._tree_script = None

    # -- simulator control ---------------------------------------------------
    def gpusim(self, *args, check=True):
        proc = subprocess.run([str(SIM_BIN / "gpusim")] + [str(a) for a in args], env=self.env,
                              capture_output=True, text=True, timeout=60, check=False)
        if check and proc.returncode != 0:
            raise AssertionError("gpusim %s failed (rc %d): %s%s" % (
                " ".join(map(str, args)), proc.returncode, proc.stdout, proc.stderr))
        return proc

    def smi(self, *args):
        return subprocess.run([str(SIM_BIN / "nvidia-smi")] + [str(a) for a in args], env=self.env,
                              capture_output=True, text=True, timeout=60, check=False)

    def status(self):
        return json.loads(self.gpusim("status").stdout)

    def used(self, gpu):
        """Used MiB of one GPU, as the simulator counts it."""
        for g in self.status()["gpus"]:
            if g["index"] == gpu:
                return g["used_mib"]
        raise KeyError(gpu)

    def hold(self, gpus, mib, **opts):
        """``gpusim hold``; returns the holder PID (every process it made is tracked).

        ``opts``: name, ignore_sigterm, exit_delay, release_delay, stuck,
        na_memory, foreign_ns, children.
        """
        args = ["hold", "--gpus", ",".join(str(g) for g in gpus) if not isinstance(gpus, str) else gpus,
                "--mib", mib, "--json"]
        for key, value in opts.items():
            flag = "--" + key.replace("_", "-")
            if value is True:
                args.append(flag)
            elif value not in (None, False):
                args += [flag, value]
        info = json.loads(self.gpusim(*args).stdout)
        for key in ("watcher_pid", "pid"):
            if info.get(key):
                self.procs.track(info[key])
        for keeper in info.get("keepers") or []:
            self.procs.track(keeper["pid"] if isinstance(keeper, dict) else keeper)
        return info["pid"]

    def spawn_tree(self, ranks=((0,), (1,)), mib=1000, argv_extra=(), **cfg):
        """Start a server tree; returns ``{"root": pid, "children": [pids]}``.

        ``ranks``: GPUs held by each child. ``cfg``: ignore_sigterm,
        term_delay, child_ignore_sigterm, child_name, proc_name,
        release_delay. ``argv_extra`` lands on the root's command line.
        """
        if self._tree_script is None:
            path = self.tmp_path / "fake_launch_server.py"
            path.write_text(TREE_SCRIPT)
            self._tree_script = str(path)
        cfg = dict(cfg, ranks=[list(r) for r in ranks], mib=mib)
        argv = [sys.executable, self._tree_script, json.dumps(cfg)] + [str(a) for a in argv_extra]
        proc = self.procs.spawn(argv, env=self.env, stdout=subprocess.PIPE)
        line = proc.stdout.readline()
        if not line:
            raise AssertionError("the server tree did not start")
        info = json.loads(line)
        for pid in info["children"]:
            self.procs.track(pid)
        return info

    def spawn_sglang(self, gpus=(0, 1), args=(), env=None, timeout=60):
        """Start the simulator's fake SGLang server (``python -m sglang.launch_server``) in its own
        session, as systemd or setsid would, and wait until ``/health`` answers 200.

        Returns ``{"pid", "port", "model_path"}``; the main process is tracked (its
        children die with it through PDEATHSIG). Skips the test when the fake
        server is not in the checkout.
        """
        if not (SIM_PY / "sglang" / "launch_server.py").exists():
            pytest.skip("the fake SGLang server (simulator/python/sglang) is not available")
        model = self.tmp_path / "model"
        model.mkdir(exist_ok=True)
        (model / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"]}')
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        run_env = dict(self.env)
        run_env.update({"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus), "SGLANG_SIM_STARTUP_S": "0.2",
                        "SGLANG_SIM_WARMUP_S": "0.1", "SGLANG_SIM_DRAIN_POLL_S": "0.2",
                        "SGLANG_SIM_SHUTDOWN_S": "0.2"})
        run_env.update(env or {})
        argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model), "--host", "127.0.0.1",
                "--port", str(port), "--tp-size", str(len(gpus))] + [str(a) for a in args]
        log = open(self.tmp_path / ("sglang-%d.log" % port), "wb")
        proc = self.procs.spawn(argv, env=run_env, stdout=log, cwd=str(self.tmp_path))
        log.close()
        url = "http://127.0.0.1:%d/health" % port

        def healthy():
            if proc.poll() is not None:
                raise AssertionError("the fake SGLang server exited with %s" % proc.returncode)
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    return resp.status == 200
            except (OSError, ValueError):
                return False

        if not wait_until(healthy, timeout=timeout, interval=0.1):
            raise AssertionError("the fake SGLang server did not become healthy")
        return {"pid": proc.pid, "port": port, "model_path": str(model)}

    def spawn_decoy(self, code="import time; time.sleep(600)", argv_extra=()):
        """A Python process that holds no GPU memory; returns its PID."""
        proc = self.procs.spawn([sys.executable, "-c", code] + [str(a) for a in argv_extra], env=self.env)
        return proc.pid


@pytest.fixture
def sim_node(tmp_path, procs):
    root = tmp_path / "gpusim"
    root.mkdir()
    node = SimNode(root, procs, tmp_path)
    node.gpusim("init", "--gpus", 8, "--model", "H200")
    return node


def _run_module(name, args, env, check=False, diff=False, timeout=300):
    fqcn = name if "." in name else "gpufleet.sglang." + name
    run_env = _ansible_env(env)
    argv = [str(VENV_BIN / "ansible"), "localhost", "-c", "local", "-m", fqcn]
    if args:
        argv += ["-a", json.dumps(args)]
    if check:
        argv.append("--check")
    if diff:
        argv.append("--diff")
    start = time.monotonic()
    proc = subprocess.run(argv, env=run_env, capture_output=True, text=True, timeout=timeout, cwd=str(REPO),
                          check=False)
    wall = time.monotonic() - start
    try:
        data = json.loads(proc.stdout)
        result = data["plays"][0]["tasks"][0]["hosts"]["localhost"]
    except (ValueError, KeyError, IndexError) as exc:
        raise AssertionError("cannot parse the ansible output (%s): rc=%d\nstdout=%s\nstderr=%s" % (
            exc, proc.returncode, proc.stdout[-4000:], proc.stderr[-4000:]))
    result.setdefault("failed", False)
    result["_wall"] = wall
    result["_rc"] = proc.returncode
    return result


@pytest.fixture
def run_module():
    return _run_module


def _ansible_env(env):
    run_env = dict(env)
    run_env.update({
        "ANSIBLE_STDOUT_CALLBACK": "json",
        "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
        "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS),
        "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
        "ANSIBLE_LOCALHOST_WARNING": "0",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "0",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_RETRY_FILES_ENABLED": "0",
    })
    return run_env


def _run_play(tasks, env, check=False, diff=False, timeout=600, tmp_dir=None):
    play = [{"name": "integration", "hosts": "localhost", "connection": "local", "gather_facts": False,
             "tasks": list(tasks)}]
    if tmp_dir is None:
        tmp_dir = pathlib.Path(env["GPUSIM_ROOT"]).parent if env.get("GPUSIM_ROOT") else pathlib.Path("/tmp")
    directory = pathlib.Path(tmp_dir)
    path = directory / ("play-%d-%d.yml" % (os.getpid(), time.monotonic_ns()))
    path.write_text(json.dumps(play))            # JSON is YAML
    argv = [str(VENV_BIN / "ansible-playbook"), "-i", "localhost,", str(path)]
    if check:
        argv.append("--check")
    if diff:
        argv.append("--diff")
    start = time.monotonic()
    proc = subprocess.run(argv, env=_ansible_env(env), capture_output=True, text=True, timeout=timeout,
                          cwd=str(REPO), check=False)
    wall = time.monotonic() - start
    try:
        data = json.loads(proc.stdout)
        results = [t["hosts"]["localhost"] for t in data["plays"][0]["tasks"]]
    except (ValueError, KeyError, IndexError) as exc:
        raise AssertionError("cannot parse the ansible-playbook output (%s): rc=%d\nstdout=%s\nstderr=%s" % (
            exc, proc.returncode, proc.stdout[-4000:], proc.stderr[-4000:]))
    for result in results:
        result.setdefault("failed", False)
        result["_wall"] = wall
    return results


@pytest.fixture
def run_play():
    return _run_play
