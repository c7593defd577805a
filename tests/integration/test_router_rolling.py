"""Router-aware rolling redeploy against the real routers, smg 1.13.0 (the
current line, in its own venv from scripts/setup-smg.sh) and sglang-router
0.3.2 (in .venv), in front of simulated SGLang workers on loopback.

``test_rolling_redeploy_behind_router``: a bounded client load (about 20
short ``/generate`` requests per second through the router, with a fixed
maximum count and a time limit) runs while ``playbooks/redeploy.yml`` rolls
the workers (three behind smg 1.x, two behind 0.3.2), one at a time
(``sglang_serial: 1``), from the incident
config (EAGLE3, topk 1, steps 1, 16 draft tokens, which SGLang runs as 2) to
the same config resolved with ``honor_draft_tokens`` (steps 15, 16 draft
tokens). The router runs with ``--disable-retries`` and slow health checks
(30 s), so a request that reaches a stopping worker fails visibly instead of
being retried or avoided by the router's own health checking; without the
router steps (sglang_router_url empty) the same scenario loses requests. It
asserts: no client request failed, every worker runs the new config, and the
router lists all of them as Ready at the end.

``test_module_against_real_router``: sglang_router_worker through Ansible
against a keyed router and a keyed worker: present/absent idempotence, check
mode, the worker key reaching the router, the last-worker guard, the drain,
and no secret in any output.

Every process (router, workers, the servers the playbook launches) is
recorded by PID and killed by PID and session at the end; the client load
runs in threads of the test process.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from gpusim.checkpoint import write_checkpoint

from ansible_collections.gpufleet.sglang.plugins.module_utils.common.http import HTTPConnectionError, request

from launch_helpers import Procs, free_port, run_module_raw, smg1_binary  # noqa: E402  (tests/integration is on sys.path)

pytestmark = pytest.mark.slow

REPO = pathlib.Path(__file__).resolve().parents[2]
SIM_PY = REPO / "simulator" / "python"
SIM_BIN = REPO / "simulator" / "bin"
VENV_BIN = pathlib.Path(sys.executable).parent
MODULE = "gpufleet.sglang.sglang_router_worker"

ROUTER_KEY = "rk-it-3b9c0e5d7a1f"
WORKER_KEY = "wk-it-8d2e4f6a0c1b"

FAST = {
    "SGLANG_SIM_STARTUP_S": "0.3",
    "SGLANG_SIM_WARMUP_S": "0.05",
    "SGLANG_SIM_SHUTDOWN_S": "0.05",
    "SGLANG_SIM_DRAIN_POLL_S": "0.05",
}
INCIDENT = {
    "tp_size": 2,
    "speculative_algorithm": "EAGLE3",
    "speculative_eagle_topk": 1,
    "speculative_num_steps": 1,
    "speculative_num_draft_tokens": 16,
}
# What honor_draft_tokens resolves INCIDENT to, and SGLang then runs unchanged.
RESOLVED = {"speculative_eagle_topk": 1, "speculative_num_steps": 15, "speculative_num_draft_tokens": 16}
PLAYBOOK_TIMEOUT = 900


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------


# name -> (binary, api_version the module must detect, extra router flags)
ROUTERS = {
    # smg 1.x streams a request body to the worker unbuffered (chunked) when retries are off and the policy
    # does not read the body; the simulated server reads only Content-Length bodies (real SGLang reads both),
    # so the test uses cache_aware, which parses the body and forwards it with a length.
    "smg-1.13.0": (smg1_binary, "1", ["--policy", "cache_aware"]),
    "sglang-router-0.3.2": (lambda: str(VENV_BIN / "smg"), "0.3", ["--policy", "round_robin"]),
}


@pytest.fixture(params=sorted(ROUTERS))
def router_kind(request):
    make, api, flags = ROUTERS[request.param]
    binary = make()
    assert os.access(binary, os.X_OK), binary
    return {"name": request.param, "binary": binary, "api": api, "flags": flags}


@pytest.fixture
def servers():
    tracker = Procs()
    yield tracker
    left = tracker.cleanup()
    assert not left, "processes survived SIGKILL: %s" % left


@pytest.fixture
def models(tmp_path):
    base = tmp_path / "models"
    for name, arch in (("target", "Qwen3ForCausalLM"), ("draft", "LlamaForCausalLMEagle3")):
        (base / name).mkdir(parents=True)
        (base / name / "config.json").write_text(json.dumps({"architectures": [arch], "model_type": "qwen3"}))
        write_checkpoint(base / name, seed=name)          # weights and tokenizer: what the preflight checks
    return base


def wait_for(predicate, timeout, interval=0.1, what="condition"):
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError("timed out after %.0f s waiting for %s (last: %r)" % (timeout, what, last))


def get(url, api_key=None, timeout=5):
    try:
        return request("GET", url, api_key=api_key, timeout=timeout)[0::2]
    except HTTPConnectionError:
        return None, None


def init_node(path, gpus=2):
    path.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, GPUSIM_ROOT=str(path))
    subprocess.run([str(SIM_BIN / "gpusim"), "init", "--gpus", str(gpus), "--model", "H200"], env=env, check=True,
                   capture_output=True, timeout=60)
    return str(path)


def start_worker(servers, node_root, port, args, log, api_key=None):
    """Start a simulated SGLang server by hand (own session), like an operator would."""
    argv = [sys.executable, "-m", "sglang.launch_server", "--port", str(port)]
    for key, value in args.items():
        argv += ["--" + key.replace("_", "-"), str(value)]
    if api_key:
        argv += ["--api-key", api_key]
    env = dict(os.environ, PYTHONPATH=str(SIM_PY), GPUSIM_ROOT=node_root, CUDA_VISIBLE_DEVICES="0,1", **FAST)
    with open(log, "w") as fh:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
    servers.add(proc.pid)
    return proc


def start_router(servers, tmp_path, kind, worker_urls=(), api_key=None):
    port, prom = free_port(), free_port()
    argv = [kind["binary"], "launch", "--host", "127.0.0.1", "--port", str(port),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom)] + kind["flags"]
    argv += [
        # Health checks stay slow (default 60 s, here 30 s) on purpose: with checks every second the
        # router would stop sending to a draining server on its own within about 2 s, and the test
        # could not tell whether the playbook took the worker out first. The add job does its own
        # health check, so re-adding does not wait for the interval. Startup timeout: seconds, not 30 min.
        "--health-check-interval-secs", "30",
        "--worker-startup-timeout-secs", "30", "--worker-startup-check-interval", "1",
        # No retries: a request routed to a stopping worker must show up as a failure.
        "--disable-retries", "--log-level", "warn"]
    if worker_urls:
        argv += ["--worker-urls"] + list(worker_urls)
    if api_key:
        argv += ["--api-key", api_key]
    env = dict(os.environ, HF_HUB_OFFLINE="1", NO_PROXY="*", no_proxy="*")
    with open(tmp_path / "router.log", "w") as fh:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
    servers.add(proc.pid)
    url = "http://127.0.0.1:%d" % port
    wait_for(lambda: get(url + "/workers", api_key)[0] == 200, 30, what="the router on %s" % url)
    return url, proc


def router_workers(url, api_key=None):
    status, data = get(url + "/workers", api_key)
    assert status == 200, (status, data)
    return data["workers"]


def all_healthy(url, expected, api_key=None):
    workers = router_workers(url, api_key)
    return sorted(w["url"] for w in workers if w["is_healthy"] and w.get("status", "ready") == "ready") == sorted(expected)


class Load(object):
    """Bounded open-loop client load through the router: ``rate`` requests
    per second, at most ``max_requests`` and at most ``time_limit`` seconds.
    Every tenth request asks for 900 tokens (about 10 s at the simulator's 90
    tokens/s, longer than smg's 5 s drain settle), so that the workers being
    removed still have requests in flight when the router lets them go (the
    server's own drain has work)."""

    def __init__(self, url, rate=20.0, max_requests=8000, time_limit=170.0, api_key=None):
        self.url = url + "/generate"
        self.rate = rate
        self.max_requests = max_requests
        self.time_limit = time_limit
        self.api_key = api_key
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.sent = 0
        self.ok = 0
        self.failures = []
        self.latencies = []
        self.pool = ThreadPoolExecutor(max_workers=32)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.started = None
        self.duration = None

    def _one(self, index):
        tokens = 900 if index % 10 == 0 else 8
        body = {"text": "request %d: say something about GPUs" % index, "sampling_params": {"max_new_tokens": tokens}}
        began = time.monotonic()
        try:
            status, _headers, data = request("POST", self.url, body=body, api_key=self.api_key, timeout=60)
        except HTTPConnectionError as exc:
            with self.lock:
                self.failures.append((index, round(time.monotonic() - self.started, 2), str(exc)))
            return
        with self.lock:
            if status == 200 and isinstance(data, dict) and "text" in data:
                self.ok += 1
                self.latencies.append(time.monotonic() - began)
            else:
                self.failures.append((index, round(time.monotonic() - self.started, 2), "HTTP %s %s" % (status, str(data)[:200])))

    def _run(self):
        self.started = time.monotonic()
        for index in range(self.max_requests):
            due = self.started + index / self.rate
            while not self.stop_event.is_set():
                left = due - time.monotonic()
                if left <= 0:
                    break
                self.stop_event.wait(min(left, 0.05))
            if self.stop_event.is_set() or time.monotonic() - self.started > self.time_limit:
                break
            with self.lock:
                self.sent += 1
            self.pool.submit(self._one, index)

    def start(self):
        self.thread.start()
        wait_for(lambda: self.ok > 0 or self.failures, 30, what="the first request through the router")

    def stop(self):
        self.stop_event.set()
        self.thread.join(timeout=10)
        self.pool.shutdown(wait=True)
        self.duration = time.monotonic() - self.started

    def summary(self):
        lat = sorted(self.latencies) or [0.0]
        return {"sent": self.sent, "ok": self.ok, "failed": len(self.failures), "duration_s": round(self.duration or 0, 1),
                "rate": round(self.sent / max(self.duration or 1, 1e-9), 1),
                "p50_s": round(lat[len(lat) // 2], 3), "max_s": round(lat[-1], 3)}


def host_results(playbook_json, task_name):
    out = {}
    for play in playbook_json.get("plays", []):
        for task in play.get("tasks", []):
            # A task of a role is named "<role> : <task>".
            if task["task"]["name"] == task_name or task["task"]["name"].endswith(" : " + task_name):
                for host, res in task["hosts"].items():
                    out.setdefault(host, []).append(res)
    return out


# --------------------------------------------------------------------------
# The rolling redeploy
# --------------------------------------------------------------------------

def test_rolling_redeploy_behind_router(servers, models, tmp_path, router_kind):
    began = time.monotonic()
    hosts = {}
    for i in range(1, 4 if router_kind["api"] == "1" else 3):
        name = "node%d" % i
        port = free_port()
        root = init_node(tmp_path / name / "gpusim")
        hosts[name] = {"port": port, "root": root, "dir": tmp_path / name, "url": "http://127.0.0.1:%d" % port}
        old_args = dict(INCIDENT, model_path=str(models / "target"), speculative_draft_model_path=str(models / "draft"))
        proc = start_worker(servers, root, port, old_args, tmp_path / name / "incident.log")
        hosts[name]["old_pid"] = proc.pid
    for name, h in hosts.items():
        wait_for(lambda h=h: get(h["url"] + "/health")[0] == 200, 60, what="%s healthy" % name)
        _status, info = get(h["url"] + "/server_info")
        assert info["speculative_num_draft_tokens"] == 2   # the incident: 16 asked, 2 running

    urls = [h["url"] for h in hosts.values()]
    router, _router_proc = start_router(servers, tmp_path, router_kind, worker_urls=urls)
    wait_for(lambda: all_healthy(router, urls), 30, what="all workers healthy in the router")

    inventory = {"all": {"children": {"gpu-nodes": {"hosts": {}}}, "vars": {
        "sglang_router_url": router,
        "sglang_router_drain_timeout": 60,
        "sglang_router_health_timeout": 30,
        "sglang_serial": 1,
        "sglang_report_dir": str(tmp_path / "reports"),
        "sglang_server_name": "rt",
        "sglang_server_manager": "process",
        "sglang_server_python": sys.executable,
        "sglang_server_version": "0.5.23",
        "sglang_server_spec_policy": "honor_draft_tokens",
        "sglang_server_health_timeout": 60,
        # A server that still gets requests never finishes SGLang's own drain; 15 s bounds that case.
        "gpu_teardown_term_timeout": 15,
        "gpu_verify_timeout": 30,
        "sglang_smoke_requests": 4,
        "sglang_smoke_max_new_tokens": 48,
        # Above 2.0, the ceiling of the incident config (2 draft tokens); the resolved config gives about 2.3-3.
        "sglang_smoke_min_accept_length": 2.0,
    }}}
    for name, h in hosts.items():
        d = h["dir"]
        inventory["all"]["children"]["gpu-nodes"]["hosts"][name] = {
            "ansible_host": "127.0.0.1",
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "sglang_node_environment": {"GPUSIM_ROOT": h["root"], "PATH": "%s:%s:/usr/bin:/bin" % (SIM_BIN, VENV_BIN)},
            "sglang_lock_dir": str(d / "state"),
            "sglang_server_config_dir": str(d / "etc"),
            "sglang_server_state_dir": str(d / "state"),
            "sglang_server_log_file": str(d / "log" / "server.log"),
            "sglang_server_env": dict(FAST, PYTHONPATH=str(SIM_PY), GPUSIM_ROOT=h["root"]),
            "sglang_server_args": dict(INCIDENT, model_path=str(models / "target"), port=h["port"],
                                       speculative_draft_model_path=str(models / "draft")),
        }
    inv_path = tmp_path / "inventory.json"
    inv_path.write_text(json.dumps(inventory, indent=1))

    env = dict(os.environ)
    env.update({
        "ANSIBLE_COLLECTIONS_PATH": str(REPO / ".collections"),
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_STDOUT_CALLBACK": "json",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"),
        "PATH": "%s:%s" % (VENV_BIN, os.environ.get("PATH", "")),
    })
    # About 35 s per host on an idle 2-core machine; several minutes per host when other test
    # suites share the cores, hence the generous bound. The load ends with the playbook.
    load = Load(router, rate=20.0, max_requests=20 * PLAYBOOK_TIMEOUT, time_limit=PLAYBOOK_TIMEOUT)
    load.start()
    time.sleep(1.0)
    playbook_began = time.monotonic()
    try:
        proc = subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", str(inv_path), "playbooks/redeploy.yml",
                               "-l", "gpu-nodes"], cwd=str(REPO), env=env, capture_output=True, text=True,
                              timeout=PLAYBOOK_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        # The json callback prints only at the end: say how far the roll got from the nodes' state.
        done = [n for n, h in hosts.items() if (h["dir"] / "etc" / "known-good" / "server.json").exists()]
        raise AssertionError("redeploy.yml did not finish within %d s; hosts promoted so far: %s; router: %s"
                             % (PLAYBOOK_TIMEOUT, done, [(w["url"], w["is_healthy"]) for w in router_workers(router)]))
    finally:
        playbook_s = time.monotonic() - playbook_began
        time.sleep(1.0)
        load.stop()
        for h in hosts.values():
            servers.add_pid_file(h["dir"] / "state" / "server.pid")
    (tmp_path / "playbook.json").write_text(proc.stdout)
    try:
        result = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError("playbook output is not JSON (rc %d): %s\n%s" % (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:]))
    stats = result.get("stats", {})
    summary = load.summary()
    drains = host_results(result, "Wait until the old server has no request in flight")
    removals = host_results(result, "Take the worker out of the router")
    figures = {
        "router": router_kind["name"],
        "load": summary,
        "playbook_s": round(playbook_s, 1),
        "total_s": round(time.monotonic() - began, 1),
        "drain": {h: {"drained_s": r[0].get("drained_s"), "initial_load": r[0].get("initial_load"),
                      "source": r[0].get("load_source")} for h, r in drains.items()},
        "removal": {h: {"settle_s": r[0].get("settle_s"), "router_load": r[0].get("router_load"),
                        "ready_peers": r[0].get("ready_peers")} for h, r in removals.items()},
    }
    print("\nrolling redeploy figures: %s" % json.dumps(figures))
    (tmp_path / "figures.json").write_text(json.dumps(figures, indent=1))

    assert proc.returncode == 0, "playbook failed: stats=%s\n%s" % (stats, proc.stderr[-3000:])
    for name in hosts:
        assert stats[name]["failures"] == 0 and stats[name]["unreachable"] == 0, stats

    # 1. No client request failed, and the load really ran through the whole roll.
    assert summary["failed"] == 0, "failed requests: %s" % load.failures[:10]
    assert summary["sent"] >= 20 * playbook_s * 0.8, summary
    assert summary["ok"] == summary["sent"]

    # 2. Every host was removed from the router, drained through /v1/loads, and re-added.
    assert sorted(removals) == sorted(hosts)
    for name, res in removals.items():
        assert res[0]["changed"] is True and res[0]["removed"][0]["url"] == hosts[name]["url"], res
        assert res[0]["api_version"] == router_kind["api"]
        assert len(res[0]["workers"]) == len(hosts) - 1   # the others kept serving
        assert res[0]["ready_peers"] == len(hosts) - 1
        if router_kind["api"] == "1":
            assert res[0]["settle_s"] >= 4.0, res   # smg kept it draining for its settle time
    for name, res in drains.items():
        assert res[0]["load_source"] == "/v1/loads" and res[0]["load"] == 0, res
    # The long requests of the load mean the drain really waited for requests in flight.
    assert sum(res[0]["initial_load"] for res in drains.values()) > 0, drains

    # 3. Every worker runs the new config, in a new process.
    for name, h in hosts.items():
        status, info = get(h["url"] + "/server_info")
        assert status == 200
        for key, value in RESOLVED.items():
            assert info[key] == value, (name, key, info[key])
        new_pid = int((h["dir"] / "state" / "server.pid").read_text().split()[0])
        assert new_pid != h["old_pid"]

    # 4. The router lists exactly the workers, all Ready.
    workers = router_workers(router)
    assert sorted(w["url"] for w in workers) == sorted(urls)
    assert all(w["is_healthy"] and w.get("status", "ready") == "ready" for w in workers), workers

    # 5. The run report says deployed for every host.
    reports = list((tmp_path / "reports").glob("*-redeploy.json"))
    assert len(reports) == 1
    rows = json.loads(reports[0].read_text())
    assert sorted((r["host"], r["status"]) for r in rows) == [(n, "deployed") for n in sorted(hosts)]


# --------------------------------------------------------------------------
# The module against the real router
# --------------------------------------------------------------------------

def test_module_against_real_router(servers, models, tmp_path, router_kind):
    root = init_node(tmp_path / "gpusim", gpus=2)
    port = free_port()
    worker = "http://127.0.0.1:%d" % port
    start_worker(servers, root, port, {"model_path": str(models / "target")}, tmp_path / "worker.log", api_key=WORKER_KEY)
    wait_for(lambda: get(worker + "/health")[0] == 200, 60, what="the worker")
    router, _router_proc = start_router(servers, tmp_path, router_kind, api_key=ROUTER_KEY)

    def run(check=False, diff=False, verbosity=0, **params):
        args = dict({"router_url": router, "api_key": ROUTER_KEY, "url": worker + "/", "timeout": 30}, **params)
        res = run_module_raw(args, tmp_path, check=check, diff=diff, verbosity=verbosity, module=MODULE)
        text = res.everything()
        assert ROUTER_KEY not in text and WORKER_KEY not in text, "a secret leaked into the output"
        return res

    wkey = WORKER_KEY
    if router_kind["api"] == "1":
        # smg 1.x sends the caller's Authorization header (a keyed router's callers send the router key) to the
        # worker in place of the worker's key: a server with another key is refused before anything is registered.
        res = run(worker_api_key=wkey)
        assert res.failed and "smg 1.x sends the caller's Authorization header" in res.get("msg", ""), res
        assert router_workers(router, ROUTER_KEY) == []
        # A server that takes the router's key is fine.
        port = free_port()
        worker = "http://127.0.0.1:%d" % port
        start_worker(servers, init_node(tmp_path / "gpusim2", gpus=2), port, {"model_path": str(models / "target")},
                     tmp_path / "worker2.log", api_key=ROUTER_KEY)
        wait_for(lambda: get(worker + "/health")[0] == 200, 60, what="the second worker")
        wkey = ROUTER_KEY
    else:
        # Without the worker key: refused before anything is registered (0.3.2 calls the worker with its own key).
        res = run()
        assert res.failed and "worker_api_key is not set" in res.get("msg", "")
        assert router_workers(router, ROUTER_KEY) == []

    # Check mode: reports the change, registers nothing.
    res = run(check=True, diff=True, worker_api_key=wkey)
    assert not res.failed, res
    assert res["changed"] is True and res["api_version"] == router_kind["api"]
    assert res["workers"] == [worker] and res["worker"] is None
    assert router_workers(router, ROUTER_KEY) == []

    # Present: registered under the normalised URL, healthy, and usable through the router.
    res = run(worker_api_key=wkey, verbosity=3)
    assert not res.failed, res
    assert res["changed"] is True and res["worker"]["url"] == worker and res["worker"]["is_healthy"] is True
    listed = router_workers(router, ROUTER_KEY)
    assert [w["url"] for w in listed] == [worker] and listed[0]["id"] == res["worker"]["id"]
    status, _headers, data = request("POST", router + "/generate", api_key=ROUTER_KEY, timeout=30,
                                     body={"text": "hello", "sampling_params": {"max_new_tokens": 4}})
    assert status == 200 and "text" in data, (status, data)   # the worker accepted what the router sent

    res = run(worker_api_key=wkey)
    assert not res.failed and res["changed"] is False

    # The only Ready worker is not removed without allow_last (check mode too); nothing changed.
    for check in (True, False):
        res = run(state="absent", check=check)
        assert res.failed and "last Ready worker" in res["msg"] and "allow_last=true" in res["msg"], res
    assert len(router_workers(router, ROUTER_KEY)) == 1

    # Absent, check mode: nothing removed.
    res = run(state="absent", drain=True, check=True, allow_last=True)
    assert not res.failed and res["changed"] is True and res["drained_s"] is None
    assert len(router_workers(router, ROUTER_KEY)) == 1

    # Absent with drain, while requests are in flight on the worker.
    def slow_request():
        request("POST", worker + "/generate", api_key=wkey, timeout=60,
                body={"text": "long", "sampling_params": {"max_new_tokens": 250}})
    threads = [threading.Thread(target=slow_request) for _thread in range(3)]
    for t in threads:
        t.start()
    wait_for(lambda: (get(worker + "/v1/loads", wkey)[1] or {}).get("loads", [{}])[0].get("num_running_reqs", 0) > 0,
             10, interval=0.02, what="requests in flight")
    res = run(state="absent", drain=True, worker_api_key=wkey, drain_timeout=60, allow_last=True)
    for t in threads:
        t.join(timeout=60)
    assert not res.failed, res
    assert res["changed"] is True and res["workers"] == []
    assert res["load"] == 0 and res["load_source"] == "/v1/loads" and res["drained_s"] > 0.2
    assert router_workers(router, ROUTER_KEY) == []

    res = run(state="absent")
    assert not res.failed and res["changed"] is False

    # A wrong router key is reported without echoing it.
    res = run(api_key="not-the-router-key-42")
    assert res.failed and "HTTP 401" in res.get("msg", "")
