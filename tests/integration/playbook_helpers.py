"""Helpers for the playbook integration tests (``test_redeploy_playbook.py``):
a simulated GPU node on localhost set up the way ``scripts/demo.sh`` does it,
the playbooks driven through ``ansible_runner``'s Python API, and results read
from runner **events** (``runner_on_ok``, ``runner_on_failed``, task names,
``event_data.res``), the play stats and the run report, never from printed text.

Pieces
------
``Procs``
    Every process a test causes: recorded by PID and start time, and at the end
    SIGKILLed by PID together with the members of its session (the fake SGLang
    server leads its own session; its schedulers and detokenizer are in it).
    Server PIDs are read from the PID files the role writes
    (``<state_dir>/server.pid``). Nothing is ever signalled by name or pattern.

``SimNode``
    One simulated 8 x H200 node in its own directory: ``GPUSIM_ROOT``, model
    directories with ``config.json``, per-node config/state/log/lock/report
    directories, a free port, a random API key marker, the inventory, and
    ``run(playbook, ...)`` / ``start(playbook, ...)`` which return a
    :class:`PlaybookRun`.

``PlaybookRun``
    ``rc``, ``status``, ``events`` (the runner events, as dicts), ``stats``
    (per-host counters from ``playbook_on_stats``), ``report`` (the rows of the
    JSON report this run wrote), ``report_md`` and accessors such as
    ``task_results(name)``, ``failed_tasks()``, ``host_stats()``.

Speed: every node command runs with ``.venv/bin`` first on PATH, so the fake
``nvidia-smi`` (``#!/usr/bin/env python3``) starts the venv interpreter, not
the pyenv shim (about 300 ms more per call). The fake server runs with short
start-up, shutdown and poll knobs (``FAST_SERVER_ENV``).
"""
from __future__ import annotations

import json
import os
import pathlib
import resource
import secrets
import signal
import socket
import subprocess
import sys
import threading

import pytest
import time
import urllib.error
import urllib.request

import ansible_runner

from gpusim.checkpoint import write_checkpoint

REPO = pathlib.Path(__file__).resolve().parents[2]
SIM_BIN = REPO / "simulator" / "bin"
SIM_PY = REPO / "simulator" / "python"
VENV_BIN = REPO / ".venv" / "bin"
if not (VENV_BIN / "python").exists():  # pragma: no cover - running from another venv
    VENV_BIN = pathlib.Path(sys.executable).parent
PLAYBOOKS = REPO / "playbooks"
COLLECTIONS = REPO / ".collections"

HOST = "node1"

# Fake SGLang server knobs (simulator/README.md "Knobs"): seconds instead of minutes.
FAST_SERVER_ENV = {
    "SGLANG_SIM_STARTUP_S": "0.3",
    "SGLANG_SIM_WARMUP_S": "0.05",
    "SGLANG_SIM_SHUTDOWN_S": "0.05",
    "SGLANG_SIM_DRAIN_POLL_S": "0.05",
    "SGLANG_SIM_KILL_RELEASE_S": "0.2",
    "SGLANG_SIM_WATCHDOG_INTERVAL_S": "0.2",
    "SGLANG_SIM_SCHEDULER_EXIT_TIMEOUT_S": "3",
}

# The incident (README "Why"): SGLang runs it with 2 draft tokens.
INCIDENT_SPEC = {
    "speculative_algorithm": "EAGLE3",
    "speculative_eagle_topk": 1,
    "speculative_num_steps": 1,
    "speculative_num_draft_tokens": 16,
}
# What honor_draft_tokens makes of it, and what SGLang then runs unchanged.
RESOLVED_SPEC = {"speculative_eagle_topk": 1, "speculative_num_steps": 15, "speculative_num_draft_tokens": 16}

# docs/report.md: the keys of each host object.
REPORT_KEYS = ("host", "run_id", "status", "step", "error", "effective_args", "adjustments", "plan", "signalled",
               "gpus_before", "gpus_after", "startup_s", "smoke", "rollback")


# --------------------------------------------------------------------------
# Processes, by PID
# --------------------------------------------------------------------------

def _stat(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            data = fh.read().decode("utf-8", "replace")
    except OSError:
        return None
    rest = data[data.rfind(")") + 2:].split()
    return {"state": rest[0], "ppid": int(rest[1]), "pgid": int(rest[2]), "sid": int(rest[3]),
            "starttime": int(rest[19])}


def starttime(pid):
    st = _stat(pid)
    return st["starttime"] if st else None


def alive(pid, start=None):
    """True while ``pid`` runs (not a zombie), and is the process that started at ``start`` when given."""
    st = _stat(int(pid))
    if st is None or st["state"] in ("Z", "X"):
        return False
    return start is None or st["starttime"] == start


def session_members(sid):
    """Live PIDs of session ``sid``."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None and st["sid"] == sid and st["state"] not in ("Z", "X"):
                out.append(int(name))
    return sorted(out)


def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            return fh.read().decode("utf-8", "replace").split("\0")
    except OSError:
        return []


def environ_of(pid):
    try:
        with open("/proc/%d/environ" % pid, "rb") as fh:
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def wait_for(predicate, timeout, interval=0.1, what="condition"):
    end = time.monotonic() + timeout
    last = None
    while True:
        last = predicate()
        if last:
            return last
        if time.monotonic() >= end:
            raise AssertionError("timed out after %.0f s waiting for %s (last: %r)" % (timeout, what, last))
        time.sleep(interval)


def free_port():
    """A TCP port nothing listens on right now."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


class Procs(object):
    """Processes a test caused, killed by PID (and their session) at the end."""

    def __init__(self):
        self.entries = []        # (pid, starttime)
        self.pid_files = []
        self.popens = []

    def track(self, pid):
        pid = int(pid)
        start = starttime(pid)
        if start is not None and (pid, start) not in self.entries:
            self.entries.append((pid, start))
        return pid

    def track_pid_file(self, path):
        """Remember a PID file (read again at clean-up) and track the PID it names now."""
        path = pathlib.Path(path)
        if path not in self.pid_files:
            self.pid_files.append(path)
        pid = read_pid_file(path)
        if pid:
            self.track(pid)
        return pid

    def spawn(self, argv, env=None, log=None):
        """Start a process in its own session; stdout/stderr to ``log`` (or /dev/null)."""
        out = open(log, "ab") if log else subprocess.DEVNULL
        try:
            proc = subprocess.Popen([str(a) for a in argv], env=env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            if log:
                out.close()
        self.popens.append(proc)
        wait_for(lambda: starttime(proc.pid) is not None, 5, 0.01, "process %d" % proc.pid)
        self.track(proc.pid)
        return proc

    def cleanup(self, grace=5.0):
        """SIGKILL every tracked process that is still the same process, and its session. Returns survivors."""
        for path in self.pid_files:
            pid = read_pid_file(path)
            if pid:
                self.track(pid)
        targets = set()
        for pid, start in self.entries:
            if alive(pid, start):
                targets.add(pid)
                st = _stat(pid)
                if st and st["sid"] == pid:        # a session leader: its whole session is ours
                    targets.update(session_members(pid))
        for pid in sorted(targets):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for proc in self.popens:
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(alive(p) for p in targets):
            time.sleep(0.05)
        return sorted(p for p in targets if alive(p))


def read_pid_file(path):
    try:
        return int(pathlib.Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


# --------------------------------------------------------------------------
# HTTP (loopback, no proxy)
# --------------------------------------------------------------------------

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_get(url, api_key=None, timeout=5):
    """``(status, json-or-text)``; ``(None, error)`` when nothing answers."""
    req = urllib.request.Request(url)
    if api_key:
        req.add_header("Authorization", "Bearer %s" % api_key)
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            status, body = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read()
    except (OSError, ValueError) as exc:
        return None, str(exc)
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body.decode("utf-8", "replace")


# --------------------------------------------------------------------------
# A playbook run, read from runner events
# --------------------------------------------------------------------------

RESULT_EVENTS = ("runner_on_ok", "runner_on_failed", "runner_on_skipped", "runner_on_unreachable",
                 "runner_item_on_ok", "runner_item_on_failed")


class PlaybookRun(object):
    """The outcome of one ``ansible_runner.run``."""

    def __init__(self, node, playbook, runner, artifacts, report_paths, wall):
        self.node = node
        self.playbook = playbook
        self.rc = runner.rc
        self.status = runner.status
        self.events = [dict(e) for e in runner.events]
        self.stats = runner.stats or {}
        self.artifacts = pathlib.Path(artifacts)
        self.wall = wall
        self.run_id = None
        for e in self.results(("runner_on_ok",)):
            facts = (e["event_data"].get("res") or {}).get("ansible_facts") or {}
            if isinstance(facts.get("sglang_redeploy_run"), dict):
                self.run_id = facts["sglang_redeploy_run"].get("run_id")
        if self.run_id:     # runs in parallel write to the same directory: keep this run's files only
            report_paths = [p for p in report_paths if p.name.startswith(self.run_id + "-")]
        self.report_paths = report_paths
        self.report = []
        self.report_md = ""
        for path in report_paths:
            if path.suffix == ".json":
                self.report = json.loads(path.read_text())
            elif path.suffix == ".md":
                self.report_md = path.read_text()

    # -- events -------------------------------------------------------------
    def results(self, kinds=RESULT_EVENTS):
        return [e for e in self.events if e.get("event") in kinds]

    def task_events(self, name, kinds=RESULT_EVENTS, host=HOST):
        """Result events of the task called ``name`` (exact task name) on ``host`` (any host: None)."""
        return [e for e in self.results(kinds)
                if e["event_data"].get("task") == name and host in (None, e["event_data"].get("host"))]

    def task_results(self, name, host=HOST, kinds=("runner_on_ok", "runner_on_failed")):
        """``event_data.res`` of every ok/failed run of task ``name``, with ``failed`` set from the event kind
        (the runner keeps the task status in the event, not always in ``res``)."""
        out = []
        for e in self.task_events(name, kinds, host):
            res = dict(e["event_data"].get("res") or {})
            res["failed"] = e["event"] == "runner_on_failed"
            out.append(res)
        return out

    def task_result(self, name, host=HOST, kinds=("runner_on_ok", "runner_on_failed")):
        res = self.task_results(name, host, kinds)
        assert res, "task %r did not run (ok/failed) on %s; tasks that ran: %s" % (name, host, self.task_names())
        return res[-1]

    def ran(self, name, host=HOST):
        return bool(self.task_events(name, ("runner_on_ok", "runner_on_failed"), host))

    def task_names(self, kinds=("runner_on_ok", "runner_on_failed")):
        return [e["event_data"].get("task") for e in self.results(kinds)]

    def failed_tasks(self, host=HOST, include_ignored=False):
        """``[(task name, res)]`` of every ``runner_on_failed`` event (rescued ones included)."""
        out = []
        for e in self.results(("runner_on_failed",)):
            data = e["event_data"]
            if data.get("host") != host:
                continue
            if data.get("ignore_errors") and not include_ignored:
                continue
            out.append((data.get("task"), data.get("res", {})))
        return out

    def host_stats(self, host=HOST):
        """The counters of ``host``: ok, changed, failures, skipped, rescued, ... (0 when absent)."""
        return {key: (value or {}).get(host, 0) for key, value in self.stats.items() if isinstance(value, dict)}

    def row(self, host=HOST):
        rows = [r for r in self.report if r.get("host") == host]
        assert len(rows) == 1, "report rows for %s: %s (files %s)" % (host, self.report, self.report_paths)
        return rows[0]

    def everything(self):
        """All text this run produced: every event as JSON and every artifact file (stdout, job events)."""
        parts = [json.dumps(self.events)]
        for path in sorted(self.artifacts.rglob("*")):
            if path.is_file():
                parts.append(path.read_text(errors="replace"))
        return "\n".join(parts)

    def stdout(self):
        """What ansible-playbook printed (the default callback's output, the runner's stdout artifact)."""
        return (self.artifacts / "run" / "stdout").read_text(errors="replace")

    def stdout_tail(self, chars=3000):
        try:
            return (self.artifacts / "run" / "stdout").read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def summary(self):
        failed = [(t, (r.get("msg") or "")[:1500]) for t, r in self.failed_tasks()]
        text = "%s rc=%s status=%s wall=%.1fs cpu=%.1fs stats=%s failed=%s" % (
            self.playbook, self.rc, self.status, self.wall, getattr(self, "cpu", 0.0), self.host_stats(), failed)
        if self.rc != 0 and not failed:
            text += "\nstdout tail:\n" + self.stdout_tail()
        return text

    __repr__ = summary


class RunHandle(object):
    """A run started in a thread (``SimNode.start``); ``wait()`` returns its :class:`PlaybookRun`."""

    def __init__(self, target):
        self._result = None
        self._error = None
        self._thread = threading.Thread(target=self._run, args=(target,), daemon=True)
        self._thread.start()

    def _run(self, target):
        try:
            self._result = target()
        except BaseException as exc:  # surfaced by wait()
            self._error = exc

    def done(self):
        return not self._thread.is_alive()

    def wait(self, timeout=600):
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise AssertionError("the playbook run did not end within %s s" % timeout)
        if self._error is not None:
            raise self._error
        return self._result


class Controller(object):
    """An ``ansible-playbook`` child started by :meth:`SimNode.spawn_playbook`."""

    def __init__(self, node, proc, log):
        self.node = node
        self.proc = proc
        self.log = log

    def wait_for_step(self, steps, timeout=120):
        """Wait until the node journal shows one of ``steps`` for a run that is not finished; returns the entry."""
        steps = (steps,) if isinstance(steps, str) else tuple(steps)
        found = {}

        def reached():
            entry = self.node.journal()
            if entry.get("step") in steps:
                found.update(entry)
                return True
            assert self.proc.poll() is None, "the controller ended (rc %s) before step %s; log:\n%s" % (
                self.proc.returncode, steps, self.log.read_text(errors="replace")[-4000:])
            return False

        wait_for(reached, timeout, 0.02, "journal step %s" % (steps,))
        return found

    def kill(self, sig=signal.SIGKILL, group=True):
        """Send ``sig`` to the controller (its PID), or to its whole process group (the session this test made)."""
        if group:
            os.killpg(self.proc.pid, sig)
        else:
            os.kill(self.proc.pid, sig)

    def wait(self, timeout=300):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError("ansible-playbook did not end within %s s; log:\n%s" % (
                timeout, self.log.read_text(errors="replace")[-4000:]))

    def output(self):
        return self.log.read_text(errors="replace")


# --------------------------------------------------------------------------
# The simulated node
# --------------------------------------------------------------------------

class SimNode(object):
    """A simulated 8 x H200 node on localhost, with everything a redeploy needs in ``base``."""

    def __init__(self, base, procs, gpus=8, tp_size=2, name="it"):
        self.base = pathlib.Path(base)
        self.procs = procs
        self.name = name
        self.tp_size = tp_size
        self.root = self.base / "gpusim"
        self.models = self.base / "models"
        self.etc = self.base / "etc"
        self.state = self.base / "state"
        self.logs = self.base / "log"
        self.lock_dir = self.base / "lock"
        self.reports = self.base / "reports"
        self.runs = self.base / "runner"
        for d in (self.root, self.models, self.logs, self.lock_dir, self.reports, self.runs):
            d.mkdir(parents=True, exist_ok=True)
        self.target = self.models / "kimi-k2.5"
        self.draft = self.models / "kimi-k2.5-eagle3"
        self.make_model(self.target, "DeepseekV3ForCausalLM", model_type="kimi_k2")
        self.make_model(self.draft, "LlamaForCausalLMEagle3")
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.api_key = "sk-itmarker-" + secrets.token_hex(12)
        self.path_env = "%s:%s:/usr/local/bin:/usr/bin:/bin" % (VENV_BIN, SIM_BIN)
        self.env = dict(os.environ, GPUSIM_ROOT=str(self.root), PATH="%s:%s" % (self.path_env, os.environ.get("PATH", "")),
                        PYTHONPATH=str(SIM_PY), NO_PROXY="*", no_proxy="*")
        self._run_count = 0
        self.runs_done = []
        self.gpusim("init", "--gpus", gpus, "--model", "H200")

    # -- files ----------------------------------------------------------------
    @staticmethod
    def make_model(path, arch, **extra):
        path = pathlib.Path(path)
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(dict({"architectures": [arch]}, **extra)))
        write_checkpoint(path, seed=path.name)          # weights and tokenizer: what the preflight checks
        return path

    @property
    def pid_file(self):
        return self.state / "server.pid"

    @property
    def lock_path(self):
        return self.lock_dir / ("gpufleet-sglang-%s.lock" % self.name)

    def server_pid(self):
        return read_pid_file(self.pid_file)

    def files_under(self, directory):
        """``{relative path: (size, mtime_ns)}`` of every file below ``directory``."""
        directory = pathlib.Path(directory)
        out = {}
        if directory.exists():
            for path in sorted(directory.rglob("*")):
                st = path.lstat()
                out[str(path.relative_to(directory))] = (st.st_size, st.st_mtime_ns, st.st_mode)
        return out

    # -- simulator -----------------------------------------------------------
    def gpusim(self, *args, check=True):
        proc = subprocess.run([str(SIM_BIN / "gpusim")] + [str(a) for a in args], env=self.env,
                              capture_output=True, text=True, timeout=60, check=False)
        if check and proc.returncode != 0:
            raise AssertionError("gpusim %s failed (rc %d): %s%s" % (" ".join(map(str, args)), proc.returncode,
                                                                     proc.stdout, proc.stderr))
        return proc

    def smi(self, *args):
        return subprocess.run([str(SIM_BIN / "nvidia-smi")] + [str(a) for a in args], env=self.env,
                              capture_output=True, text=True, timeout=60, check=False)

    def status(self):
        return json.loads(self.gpusim("status").stdout)

    def used(self):
        """``{gpu index: used MiB}``."""
        return {g["index"]: g["used_mib"] for g in self.status()["gpus"]}

    def holds(self):
        return self.status().get("holds", [])

    def hold(self, gpus, mib, **opts):
        """``gpusim hold ... --json``; returns its JSON (``pid``, ``watcher_pid``, ``id``); every process is tracked."""
        args = ["hold", "--gpus", ",".join(str(g) for g in gpus), "--mib", mib, "--json"]
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
        return info

    def monitor(self, gpus="all", name="gpu-monitor", uvm=True):
        """``gpusim monitor``: a monitoring agent (NVML exporter, nvtop, gpustat --watch) with the device files of
        ``gpus`` open, polling, holding no memory, never a compute process; returns its PID (tracked)."""
        args = ["monitor", "--gpus", gpus if isinstance(gpus, str) else ",".join(str(g) for g in gpus), "--name", name,
                "--json"] + ([] if uvm else ["--no-uvm"])
        pid = json.loads(self.gpusim(*args).stdout)["pid"]
        self.procs.track(pid)
        return pid

    # -- processes the test starts itself -----------------------------------
    def start_decoy(self, seconds=3600):
        """An unrelated Python process, the kind ``pkill -9 -f python3`` killed in the incident."""
        proc = self.procs.spawn(["python3", "-c", "import time; time.sleep(%d)" % seconds], env=self.env)
        return proc.pid

    def server_argv(self, args):
        argv = [str(VENV_BIN / "python"), "-m", "sglang.launch_server"]
        for key, value in args.items():
            flag = "--" + key.replace("_", "-")
            if value is True:
                argv.append(flag)
            else:
                argv += [flag, str(value)]
        return argv

    def start_server_by_hand(self, args, env=None, log_name="by-hand.log"):
        """Start a fake SGLang server like an engineer would (own session, not recorded); waits for health."""
        full_env = dict(self.env, **FAST_SERVER_ENV)
        full_env.update(env or {})
        proc = self.procs.spawn(self.server_argv(args), env=full_env, log=self.logs / log_name)
        wait_for(lambda: http_get(self.url + "/health")[0] == 200 or proc.poll() is not None, 60,
                 what="the hand-started server on %s" % self.url)
        assert proc.poll() is None, (self.logs / log_name).read_text()[-3000:]
        return proc.pid

    def server_info(self, api_key=None):
        status, info = http_get(self.url + "/server_info", api_key=api_key or self.api_key)
        assert status == 200, (status, info)
        return info

    def health(self):
        return http_get(self.url + "/health")[0]

    def server_tree(self, pid=None):
        """The server's session members (main process, schedulers, detokenizer)."""
        pid = pid or self.server_pid()
        return session_members(pid) if pid and alive(pid) else []

    # -- inventory -----------------------------------------------------------
    def server_args(self, **overrides):
        args = dict(INCIDENT_SPEC, model_path=str(self.target), speculative_draft_model_path=str(self.draft),
                    tp_size=self.tp_size, port=self.port)
        args.update(overrides)
        return {k: v for k, v in args.items() if v is not None}

    def host_vars(self, server_env=None, **overrides):
        """Host variables for the inventory, as in scripts/demo.sh, with small timeouts."""
        env = dict(FAST_SERVER_ENV, PYTHONPATH=str(SIM_PY), GPUSIM_ROOT=str(self.root))
        env.update(server_env or {})
        hv = {
            "ansible_connection": "local",
            "ansible_python_interpreter": str(VENV_BIN / "python"),
            "sglang_node_environment": {"GPUSIM_ROOT": str(self.root), "PATH": self.path_env},
            # The simulator's device files (modules never read GPUSIM_ROOT themselves).
            "gpufleet_gpu_device_paths": [str(self.root / "dev" / "nvidia*")],
            "sglang_report_dir": str(self.reports),
            "sglang_lock_dir": str(self.lock_dir),
            "sglang_lock_timeout": 120,
            "sglang_server_name": self.name,
            "sglang_server_manager": "process",
            "sglang_server_python": str(VENV_BIN / "python"),
            "sglang_server_version": "0.5.23",
            "sglang_server_spec_policy": "honor_draft_tokens",
            "sglang_server_config_dir": str(self.etc),
            "sglang_server_state_dir": str(self.state),
            "sglang_server_log_file": str(self.logs / "server.log"),
            "sglang_server_health_timeout": 60,
            "sglang_server_api_key": self.api_key,
            "sglang_server_env": env,
            "sglang_server_args": self.server_args(),
            "gpu_teardown_term_timeout": 20,
            "gpu_teardown_kill_timeout": 10,
            "gpu_verify_timeout": 15,
            "gpu_verify_sleep": 0.2,
            "sglang_smoke_requests": 3,
            "sglang_smoke_max_new_tokens": 32,
            "sglang_smoke_min_accept_length": 2.0,
        }
        hv.update(overrides)
        return hv

    def write_inventory(self, hosts, path):
        """``hosts``: ``{inventory hostname: host vars}``, all in group ``gpu-nodes``."""
        inventory = {"all": {"children": {"gpu-nodes": {"hosts": hosts}}}}
        path.write_text(json.dumps(inventory, indent=1))
        return path

    # -- running playbooks ---------------------------------------------------
    def _prepare(self, playbook, host_vars, extravars, check, hosts=None, verbosity=None, diff=False):
        self._run_count += 1
        ident = "%02d-%s%s" % (self._run_count, pathlib.Path(playbook).stem, "-check" if check else "")
        pdd = self.runs / ident
        pdd.mkdir(parents=True)
        if hosts is None:
            hosts = {HOST: host_vars if host_vars is not None else self.host_vars()}
        inventory = self.write_inventory(hosts, pdd / "inventory.json")
        envvars = {
            "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS),
            "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
            "ANSIBLE_LOCAL_TEMP": str(self.base / "ansible-tmp"),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_PIPELINING": "1",
            "ANSIBLE_DEPRECATION_WARNINGS": "0",
            "ANSIBLE_LOCALHOST_WARNING": "0",
            "PATH": "%s:%s" % (VENV_BIN, os.environ.get("PATH", "")),
            "NO_PROXY": "*",
            "no_proxy": "*",
        }
        kwargs = dict(private_data_dir=str(pdd), ident="run", playbook=str(PLAYBOOKS / playbook),
                      inventory=str(inventory), extravars=extravars or {}, envvars=envvars, quiet=True,
                      cmdline="--check --diff" if check else ("--diff" if diff else None), timeout=540)
        if verbosity:
            kwargs["verbosity"] = int(verbosity)
        return kwargs

    def _execute(self, playbook, kwargs):
        before = set(self.reports.glob("*-redeploy.*"))
        began = time.monotonic()
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        runner = ansible_runner.run(**kwargs)
        wall = time.monotonic() - began
        after_usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after_usage.ru_utime + after_usage.ru_stime) - (usage.ru_utime + usage.ru_stime)
        after = sorted(set(self.reports.glob("*-redeploy.*")) - before)
        self.procs.track_pid_file(self.pid_file)
        run = PlaybookRun(self, playbook, runner, pathlib.Path(kwargs["private_data_dir"]) / "artifacts", after, wall)
        run.cpu = cpu           # CPU seconds of the children reaped meanwhile (approximate with concurrent runs)
        self.runs_done.append(run)
        return run

    def run(self, playbook="redeploy.yml", host_vars=None, extravars=None, check=False, hosts=None, verbosity=None,
            diff=False):
        """Run ``playbooks/<playbook>`` to the end; returns a :class:`PlaybookRun`.

        ``host_vars``: the variables of the one host ``node1`` (default ``self.host_vars()``);
        ``hosts``: ``{name: host vars}`` for several inventory hosts on this node instead;
        ``verbosity``: 3 runs it as ``-vvv`` (the runner's stdout artifact then holds what an operator's job log shows);
        ``diff``: a real run with ``--diff`` (a check run always has it).
        """
        kwargs = self._prepare(playbook, host_vars, extravars, check, hosts, verbosity, diff)
        return self._execute(playbook, kwargs)

    def start(self, playbook="redeploy.yml", host_vars=None, extravars=None, check=False, hosts=None):
        """Start a run in a thread; returns a :class:`RunHandle` (``.wait()``)."""
        kwargs = self._prepare(playbook, host_vars, extravars, check, hosts)
        return RunHandle(lambda: self._execute(playbook, kwargs))

    # -- a controller this test can kill ---------------------------------------
    def spawn_playbook(self, playbook="redeploy.yml", host_vars=None, extravars=None, check=False):
        """Start ``ansible-playbook`` as a child in its own session (a controller the test can SIGKILL,
        SIGINT or SIGTERM by its PID); returns a :class:`Controller`."""
        kwargs = self._prepare(playbook, host_vars, extravars, check)
        pdd = pathlib.Path(kwargs["private_data_dir"])
        argv = [str(VENV_BIN / "ansible-playbook"), "-i", kwargs["inventory"], str(PLAYBOOKS / playbook)]
        if extravars:
            extra = pdd / "extravars.json"
            extra.write_text(json.dumps(extravars))
            argv += ["-e", "@%s" % extra]
        if check:
            argv += ["--check", "--diff"]
        env = dict(os.environ, **kwargs["envvars"])
        log = pdd / "controller.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, cwd=str(pdd))
        self.procs.popens.append(proc)
        wait_for(lambda: starttime(proc.pid) is not None or proc.poll() is not None, 5, 0.01, "ansible-playbook")
        self.procs.track(proc.pid)
        return Controller(self, proc, log)

    def journal(self):
        """The node journal (``<state_dir>/journal.json``), or {}."""
        try:
            return json.loads((self.state / "journal.json").read_text())
        except (OSError, ValueError):
            return {}

    def lease_holder(self):
        try:
            return json.loads((self.lock_path / "holder.json").read_text())
        except (OSError, ValueError):
            return None

    # -- secrets -------------------------------------------------------------
    def leaks(self):
        """Where the API key marker shows up: runner events/artifacts of every run, report files, server cmdlines."""
        found = []
        for run in self.runs_done:
            if self.api_key in run.everything():
                found.append("run %s (%s)" % (run.artifacts, run.playbook))
        for path in self.reports.glob("*"):
            if self.api_key in path.read_text(errors="replace"):
                found.append(str(path))
        for pid in self.server_tree():
            if self.api_key in "\0".join(cmdline(pid)):
                found.append("/proc/%d/cmdline" % pid)
        return found


@pytest.fixture
def procs():
    """A :class:`Procs` for one test; fails the test if anything it started survives SIGKILL. A playbook test
    module takes it with ``procs = playbook_helpers.procs`` (it replaces conftest's ProcTracker fixture there)."""
    tracker = Procs()
    yield tracker
    left = tracker.cleanup()
    assert not left, "processes survived SIGKILL: %s" % left


@pytest.fixture(scope="module", name="procs")
def module_procs():
    """The module-scoped :class:`Procs` of a playbook test module whose :class:`SimNode` lives across its tests
    (``from playbook_helpers import module_procs``); fails the module if anything it started survives SIGKILL."""
    tracker = Procs()
    yield tracker
    left = tracker.cleanup()
    assert not left, "processes survived SIGKILL: %s" % left


def node_with_decoy(base, procs, **kwargs):
    """A :class:`SimNode` with an unrelated ``python3 -c sleep`` beside it (``decoy``, ``decoy_start``) that every
    test of the module must leave alive (:func:`decoy_survives`)."""
    node = SimNode(base, procs, **kwargs)
    node.decoy = node.start_decoy()
    node.decoy_start = starttime(node.decoy)
    return node


@pytest.fixture(autouse=True, name="decoy_survives")
def decoy_survives_fixture(request):
    """Imported by a module whose ``node`` is a :func:`node_with_decoy`: the unrelated process outlives every test."""
    yield
    if "node" in request.fixturenames:
        node = request.getfixturevalue("node")
        assert alive(node.decoy, node.decoy_start), "the unrelated process %d (python3 -c sleep) was killed" % node.decoy
