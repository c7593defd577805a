"""A prefill/decode (PD) disaggregated fleet redeployed by ``playbooks/redeploy.yml`` (issue 16 section 2).

Two inventory hosts on localhost, each a simulated node of its own (one GPU): ``prefill0`` runs
``--disaggregation-mode prefill`` with its KV bootstrap port, ``decode0`` runs ``--disaggregation-mode
decode``. Both serve the same model path (a PD pair must). The fake SGLang implements the 0.5.23 PD
handshake, the layout checks a real decode makes (page size, KV dtype, transfer backend, allocation
policy) and the queue gauges (simulator/python/sglang/srt/disaggregation.py).

What is checked: the play shows the rollout order (also in check mode); a change outside the shared KV
layout rolls one host at a time; a layout change with the hosts in different batches is refused before
anything is touched, and with both in one batch replaces the pair together, after which a request
through both roles works; a change that would leave the roles incompatible is refused whatever the batch;
the smoke gate runs on each role alone (SGLang's fake bootstrap host).
"""
from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request

import pytest

import playbook_helpers
from playbook_helpers import SimNode, alive, free_port, http_get
from launch_helpers import smg1_binary  # noqa: E402
from test_router_rolling import Load, wait_for as rr_wait  # noqa: E402 - helpers, not tests

pytestmark = pytest.mark.slow

PREFILL, DECODE = "prefill0", "decode0"
HOSTS = (PREFILL, DECODE)
SHOW_PD = "Show the prefill/decode rollout order"
PD_CHECK = "Check that the prefill/decode rollout never pairs incompatible servers"
PREFLIGHT = "Plan the redeploy (inspect the node, resolve the args as its SGLang will, take the lease)"


procs = playbook_helpers.procs  # the shared fixture: what a test started is killed by PID at its end


class Fleet(object):
    def __init__(self, base, procs, hosts=HOSTS):
        self.hosts = tuple(hosts)
        self.nodes = {h: SimNode(base / h, procs, gpus=1, tp_size=1, name="pd") for h in self.hosts}
        self.procs = procs
        self.model = self.nodes[self.hosts[0]].target      # one model path for both roles
        # Every prefill server has a KV bootstrap port of its own (they share this machine's loopback).
        self.bootstrap_ports = dict((h, free_port()) for h in self.hosts if h.startswith("prefill"))
        self.bootstrap_port = self.bootstrap_ports.get(PREFILL)

    def __getitem__(self, host):
        return self.nodes[host]

    def host_vars(self, host, shared=None, own=None, **overrides):
        node = self.nodes[host]
        hv = node.host_vars(sglang_smoke_min_accept_length=0, sglang_smoke_requests=3)
        args = {"model_path": str(self.model), "tp_size": 1, "port": node.port, "host": "127.0.0.1",
                "enable_metrics": True}
        args.update(shared or {})
        role = {"disaggregation_mode": "prefill" if host.startswith("prefill") else "decode"}
        if host.startswith("prefill"):
            role["disaggregation_bootstrap_port"] = self.bootstrap_ports[host]
        role.update(own or {})
        hv.update({"sglang_server_args": args, "sglang_server_host_args": role,
                   "sglang_report_dir": str(self.nodes[self.hosts[0]].reports)})
        hv.update(overrides)
        return hv

    def run(self, shared=None, own=None, serial="100%", check=False, **overrides):
        own = own or {}
        hosts = dict((h, self.host_vars(h, shared, own.get(h), **overrides)) for h in self.hosts)
        run = self.nodes[self.hosts[0]].run(hosts=hosts, extravars={"sglang_serial": serial}, check=check)
        for node in self.nodes.values():
            self.procs.track_pid_file(node.pid_file)
        return run

    def pids(self):
        return dict((h, n.server_pid()) for h, n in self.nodes.items())

    def info(self, host):
        status, info = http_get(self.nodes[host].url + "/server_info", api_key=self.nodes[host].api_key)
        assert status == 200, (host, status, info)
        return info


def pd_lines(run, host=PREFILL):
    res = run.task_result(SHOW_PD, host=host)
    return res["msg"]


def http_post(url, body, api_key, timeout=60):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer %s" % api_key})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")
    except OSError as exc:
        return None, str(exc)


def pd_request(fleet, room):
    """What a PD router does: the same request to both roles, with the prefill's bootstrap fields."""
    body = {"text": "hello", "sampling_params": {"max_new_tokens": 16}, "bootstrap_host": "127.0.0.1",
            "bootstrap_port": fleet.bootstrap_port, "bootstrap_room": room}
    out = {}

    def send(host):
        node = fleet[host]
        out[host] = http_post(node.url + "/generate", body, node.api_key)

    threads = [threading.Thread(target=send, args=(h,)) for h in HOSTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(70)
    return out


@pytest.fixture
def fleet(tmp_path, procs):
    f = Fleet(tmp_path, procs)
    run = f.run()
    assert run.rc == 0, run.summary()
    for h in HOSTS:
        assert run.row(h)["status"] == "deployed", run.row(h)
    assert pd_lines(run)[0].startswith("prefill/decode rollout: rolling"), pd_lines(run)
    return f


def test_the_pair_serves_and_each_role_passed_its_own_smoke_gate(fleet):
    out = pd_request(fleet, room=11)
    assert out[PREFILL][0] == 200 and out[DECODE][0] == 200, out
    assert out[DECODE][1]["meta_info"]["completion_tokens"] == 16
    assert fleet.info(PREFILL)["disaggregation_mode"] == "prefill"
    assert fleet.info(DECODE)["disaggregation_mode"] == "decode"


def test_a_change_outside_the_layout_rolls_one_host_at_a_time(fleet):
    before = fleet.pids()
    change = {"mem_fraction_static": 0.8}
    check = fleet.run(shared=change, serial=1, check=True)
    lines = pd_lines(check)
    assert lines[0].startswith("prefill/decode rollout: rolling: the change does not touch the shared KV layout"), lines
    assert "step 1: replace prefill prefill0" in lines and "step 2: replace decode decode0" in lines, lines
    assert fleet.pids() == before, "check mode touched a server"
    run = fleet.run(shared=change, serial=1)
    assert run.rc == 0, run.summary()
    after = fleet.pids()
    for h in HOSTS:
        assert run.row(h)["status"] == "deployed" and after[h] != before[h] and not alive(before[h]), run.row(h)
        assert fleet.info(h)["mem_fraction_static"] == 0.8
    assert pd_request(fleet, room=12)[DECODE][0] == 200


def test_a_layout_change_needs_both_roles_in_one_batch(fleet):
    before = fleet.pids()
    layout = {"page_size": 16}
    refused = fleet.run(shared=layout, serial=1)
    assert refused.rc != 0
    first = refused.row(PREFILL)
    assert first["status"] == "failed" and first["step"] == "preflight", first
    assert "every prefill and decode host must be redeployed in one batch" in first["error"], first["error"]
    assert "decode0" in first["error"] and 'sglang_serial: "100%"' in first["error"]
    assert fleet.pids() == before and all(alive(p) for p in before.values()), "a refused rollout touched a server"
    assert fleet[PREFILL].lease_holder() is None, "the refused run kept its lease"

    run = fleet.run(shared=layout, serial="100%")
    assert run.rc == 0, run.summary()
    lines = pd_lines(run)
    assert lines[0].startswith("prefill/decode rollout: pair (stop_both): the change alters the shared KV layout "
                               "(page_size 1 -> 16)"), lines
    for h in HOSTS:
        assert run.row(h)["status"] == "deployed", run.row(h)
        assert fleet.info(h)["page_size"] == 16
    out = pd_request(fleet, room=13)
    assert out[PREFILL][0] == 200 and out[DECODE][0] == 200, out


def test_a_change_that_splits_the_layout_is_refused_whatever_the_batch(fleet):
    before = fleet.pids()
    run = fleet.run(own={DECODE: {"page_size": 16}}, serial="100%")
    assert run.rc != 0
    for h in HOSTS:
        row = run.row(h)
        assert row["status"] == "failed" and row["step"] == "preflight", row
        assert "page_size" in row["error"] and "Nothing was touched" in row["error"], row["error"]
    assert fleet.pids() == before
    assert pd_request(fleet, room=14)[DECODE][0] == 200, "the old pair still serves"


# --------------------------------------------------------------------------
# A PD fleet rolled behind the real router (smg 1.13.0 in PD mode)
# --------------------------------------------------------------------------

FOUR = ("prefill0", "prefill1", "decode0", "decode1")
SMG_PD_FLAGS = [
    "--pd-disaggregation", "--policy", "round_robin",
    # As in test_router_rolling: slow health checks (the playbook, not the router's own checking, must take a
    # worker out before its server stops), no retries (a request that reaches a stopping server fails visibly).
    "--health-check-interval-secs", "30", "--worker-startup-timeout-secs", "30",
    "--worker-startup-check-interval", "1", "--disable-retries", "--log-level", "warn"]


def start_pd_router(procs, tmp_path, api_key):
    """smg 1.13.0 in PD mode with no worker: the playbook registers each one (worker_type, bootstrap_port, key).
    The router has the servers' key: in PD mode smg 1.x sends its caller's Authorization header to the prefill and
    decode servers, never the worker's registered key (test_sglang_router_worker measures it)."""
    port, prom = free_port(), free_port()
    argv = [smg1_binary(), "launch", "--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(prom), "--api-key", api_key] + SMG_PD_FLAGS
    env = dict(os.environ, HF_HUB_OFFLINE="1", NO_PROXY="*", no_proxy="*")
    proc = procs.spawn(argv, env=env, log=tmp_path / "router.log")
    procs.track(proc.pid)
    url = "http://127.0.0.1:%d" % port
    rr_wait(lambda: http_get(url + "/workers", api_key=api_key)[0] == 200, 30, what="smg on %s" % url)
    return url


def pd_workers(router, api_key):
    status, data = http_get(router + "/workers", api_key=api_key)
    assert status == 200, (status, data)
    return dict((w["url"], w) for w in data["workers"])


def test_a_rolling_redeploy_behind_the_real_smg_in_pd_mode_loses_no_request(tmp_path, procs):
    fleet = Fleet(tmp_path, procs, hosts=FOUR)
    key = fleet[FOUR[0]].api_key
    for host in FOUR:
        fleet[host].api_key = key              # one key for the fleet and its router (see start_pd_router)
    router = start_pd_router(procs, tmp_path, key)
    urls = dict((h, fleet[h].url) for h in FOUR)
    router_vars = {"sglang_router_url": router, "sglang_router_api_key": key, "sglang_router_drain_timeout": 60,
                   "sglang_router_health_timeout": 30}

    # 1. The first deploy registers every server with its role (and a prefill server's bootstrap port).
    first = fleet.run(**router_vars)
    assert first.rc == 0, first.summary()
    workers = pd_workers(router, key)
    assert sorted(workers) == sorted(urls.values()), workers
    for host, url in urls.items():
        w = workers[url]
        assert w["worker_type"] == ("prefill" if host.startswith("prefill") else "decode"), w
        assert w["is_healthy"] and w["status"] == "ready", w
        if host.startswith("prefill"):
            assert w["bootstrap_port"] == fleet.bootstrap_ports[host], w
    before = fleet.pids()

    # 2. A change outside the shared KV layout rolls host by host while clients keep sending through smg.
    load = Load(router, rate=10.0, max_requests=10 * 900, time_limit=900, api_key=key)
    load.start()
    try:
        run = fleet.run(shared={"mem_fraction_static": 0.8}, serial=1, **router_vars)
    finally:
        time.sleep(1.0)
        load.stop()
    summary = load.summary()
    print("\nPD rolling redeploy behind smg 1.13.0: %s" % json.dumps(summary))
    assert run.rc == 0, run.summary()
    lines = pd_lines(run, host="prefill0")
    assert lines[0].startswith("prefill/decode rollout: rolling"), lines
    after = fleet.pids()
    for host in FOUR:
        assert run.row(host)["status"] == "deployed", run.row(host)
        assert after[host] != before[host] and not alive(before[host]), host
        assert fleet.info(host)["mem_fraction_static"] == 0.8
        removed = run.task_result("Take the worker out of the router", host=host)
        assert removed["changed"] is True and removed["removed"][0]["url"] == urls[host], removed
        assert removed["ready_peers"] == 1, removed           # the other server of its role kept serving

    # 3. No client request failed, and the load ran through the whole roll.
    assert summary["failed"] == 0, "failed requests: %s" % load.failures[:10]
    assert summary["ok"] == summary["sent"] and summary["sent"] >= 20, summary

    # 4. The router lists the same four workers, with their roles, all Ready.
    workers = pd_workers(router, key)
    assert sorted(workers) == sorted(urls.values()), workers
    assert all(w["is_healthy"] and w["status"] == "ready" for w in workers.values()), workers
    assert sorted(w["worker_type"] for w in workers.values()) == ["decode", "decode", "prefill", "prefill"]

    # 5. A new API key for one server, which this keyed smg router could not pass to it (smg 1.x sends the caller's
    #    key): refused at the router step, before the worker is taken out or anything is stopped (check_readd),
    #    instead of after the outage at the re-add.
    other_key = "sk-itmarker-" + "0f1e" * 6
    fleet.nodes["prefill0"].api_key = other_key
    refused = fleet.run(serial=1, **router_vars)
    assert refused.rc != 0
    row = refused.row("prefill0")
    assert row["status"] == "failed" and row["step"] == "router drain", row
    assert "has another API key than the router" in row["error"] and "Nothing was touched" in row["error"], row["error"]
    assert row["signalled"] == [], row["signalled"]
    assert fleet.pids() == after, "nothing may be stopped"
    workers = pd_workers(router, key)
    assert sorted(workers) == sorted(urls.values()) and all(w["status"] == "ready" for w in workers.values()), workers
    assert other_key not in refused.everything() and key not in refused.everything()
