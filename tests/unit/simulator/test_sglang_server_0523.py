"""The fake SGLang server's 0.5.23 features, from the outside (server processes on free
loopback ports, a temporary GPUSIM_ROOT, every process recorded and SIGKILLed by PID):
startup timings and metrics, the windowed speculative gauges, the hang after N requests
following an unclean stop (sglang#22779) seen by the smoke gate, derived ports and a
lingering port, LoRA adapters, --delete-ckpt-after-loading, in-place weight updates and
PD disaggregation.  Shapes and messages are those of the 0.5.23 wheel (see the modules'
docstrings for the source files).
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from sglang_helpers import (  # noqa: E402 - after this directory is put on sys.path
    GpuNode, ProcessRegistry, Server, alive, cmdline, comm, free_port, make_model, wait_for,
)

from ansible_collections.gpufleet.sglang.plugins.module_utils import sglang_metrics  # noqa: E402
from ansible_collections.gpufleet.sglang.plugins.module_utils.sockets import (  # noqa: E402
    listening_inodes, socket_owners,
)

INCIDENT = ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "1",
            "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "16"]


@pytest.fixture
def registry():
    reg = ProcessRegistry()
    try:
        yield reg
    finally:
        reg.kill_all()


@pytest.fixture
def node(tmp_path):
    return GpuNode(tmp_path / "gpusim", gpus=4)


@pytest.fixture
def model(tmp_path):
    return make_model(tmp_path / "models" / "qwen")


@pytest.fixture
def start(tmp_path, registry, node, model):
    servers = []

    def _start(args=(), env=None, with_model=True, port=None, name=None):
        args = list(args)
        if with_model and "--model-path" not in args:
            args = ["--model-path", model] + args
        log = tmp_path / ("%s.log" % (name or "server%d" % len(servers)))
        srv = Server(registry, node, log, args, env=env, port=port)
        servers.append(srv)
        return srv

    try:
        yield _start
    finally:
        registry.kill_all()
        for srv in servers:
            try:
                srv.proc.wait(timeout=10)
            except Exception:
                pass
            srv.close()


def gen(srv, tokens=8, timeout=30.0, **extra):
    body = {"text": "hello", "sampling_params": {"max_new_tokens": tokens}}
    body.update(extra)
    return srv.request("/generate", "POST", body, timeout=timeout)


def listeners(port):
    return socket_owners(listening_inodes(port))


# =============================================================================
# startup timings
# =============================================================================
class TestStartupTimings:
    LINE = re.compile(r"Engine startup timings \(s\): load_weight=\d+\.\d\d, kv_cache_allocation=\d+\.\d\d, "
                      r"scheduler_e2e=\d+\.\d\d, cuda_graph=\{prefill=\d+\.\d\d, decode=\d+\.\d\d, "
                      r"target_verify=\d+\.\d\d, draft_prefill=\d+\.\d\d, draft_decode=\d+\.\d\d, "
                      r"draft_extend=\d+\.\d\d\}, tokenizer_e2e=\d+\.\d\d$", re.M)

    def test_log_line_metrics_and_server_info_agree(self, start):
        srv = start(["--enable-metrics", "--tp-size", "2"], env={"SGLANG_SIM_STARTUP_S": "0.4"})
        srv.wait_healthy()
        log = srv.log()
        assert self.LINE.search(log), log[-2000:]
        from_log = sglang_metrics.startup_phases_from_log(log)
        assert from_log["load_weight"] >= 0.4 and from_log["cuda_graph"]["decode"] > 0
        assert from_log["tokenizer_e2e"] >= from_log["scheduler_e2e"] >= from_log["load_weight"]
        text = srv.request("/metrics").body.decode()
        assert re.search(r'^sglang:startup_time_seconds\{model_name="[^"]+",engine_type="unified",'
                         r'phase="load_weight"\} [0-9.]+$', text, re.M)
        from_metrics = sglang_metrics.startup_phases_from_metrics(text)
        for phase in sglang_metrics.STARTUP_PHASES:          # the log rounds to 2 decimals
            assert abs(from_metrics[phase] - from_log[phase]) < 0.006, phase
        info = srv.request("/server_info").json()
        assert set(info["startup_time"]) == {"load_weight", "kv_cache_allocation", "scheduler_e2e",
                                             "cuda_graph", "tokenizer_e2e"}
        assert abs(info["startup_time"]["tokenizer_e2e"] - from_metrics["tokenizer_e2e"]) < 1e-6
        assert set(info["internal_states"][0]["startup_time"]) == {"load_weight", "kv_cache_allocation",
                                                                   "scheduler_e2e", "cuda_graph"}
        budget, source = sglang_metrics.startup_budget(from_metrics, default=900, margin=2.0, floor=1, cap=60)
        assert source == "previous" and budget == pytest.approx(2.0 * from_metrics["tokenizer_e2e"])

    def test_speculation_captures_verify_and_draft_graphs(self, start):
        srv = start(INCIDENT)
        srv.wait_healthy()
        phases = sglang_metrics.startup_phases_from_log(srv.log())
        assert phases["cuda_graph"]["decode"] == 0 and phases["cuda_graph"]["target_verify"] > 0
        assert phases["cuda_graph"]["draft_decode"] > 0


# =============================================================================
# windowed speculative gauges
# =============================================================================
class TestWindowedGauges:
    def gauges(self, srv):
        return sglang_metrics.spec_gauges(srv.request("/metrics").body.decode())

    def test_gauges_hold_the_last_decode_log_interval_report(self, start):
        srv = start(INCIDENT + ["--enable-metrics", "--decode-log-interval", "20"])
        srv.wait_healthy()
        before = list(self.gauges(srv).values())[0]
        assert before == {"accept_length": 0.0, "accept_rate": 0.0}       # the warmup made no report
        assert gen(srv, tokens=256).status == 200
        log = srv.log()
        lines = re.findall(r"Decode batch, #running-req: \d+, #token: \d+, token usage: [0-9.]+, "
                           r"accept len: ([0-9.]+), accept rate: ([0-9.]+), cuda graph: True, "
                           r"gen throughput \(token/s\): [0-9.]+, #queue-req: \d+$", log, re.M)
        assert len(lines) >= 3          # 256 tokens at ~1.66 per step: ~154 steps, a report every 20
        after = list(self.gauges(srv).values())[0]
        # the gauge is the last report, not a cumulative mean
        assert "%.2f" % after["accept_length"] == lines[-1][0]
        assert "%.2f" % after["accept_rate"] == lines[-1][1]
        assert 1.0 <= after["accept_length"] <= 2.0 and 0.0 <= after["accept_rate"] <= 1.0

    def test_too_few_iterations_leave_the_gauge_unchanged(self, start):
        srv = start(INCIDENT + ["--enable-metrics", "--decode-log-interval", "5000"])
        srv.wait_healthy()
        res = gen(srv, tokens=64).json()
        assert res["meta_info"]["spec_accept_length"] > 1.0      # meta_info has its figure
        assert list(self.gauges(srv).values())[0]["accept_length"] == 0.0   # no report in the window


# =============================================================================
# hang after N requests following an unclean stop (sglang#22779), and the smoke gate
# =============================================================================
@pytest.fixture
def run_smoke(monkeypatch):
    from ansible.module_utils import basic
    from ansible.module_utils.testing import patch_module_args
    from ansible_collections.gpufleet.sglang.plugins.modules import sglang_smoke

    class Done(Exception):
        pass

    def exit_json(self, **kwargs):
        kwargs["failed"] = False
        raise Done(kwargs)

    def fail_json(self, msg, **kwargs):
        kwargs.update(failed=True, msg=msg)
        raise Done(kwargs)

    monkeypatch.setattr(basic.AnsibleModule, "exit_json", exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)

    def _run(args):
        with patch_module_args(args):
            with pytest.raises(Done) as info:
                sglang_smoke.main()
        return info.value.args[0]

    return _run


class TestHangAfterUncleanStop:
    ENV = {"SGLANG_SIM_HANG_AFTER_REQUESTS": "5"}

    def test_relaunch_after_sigkill_hangs_and_the_smoke_gate_names_the_request(self, start, run_smoke, node):
        port = free_port()
        first = start(INCIDENT + ["--enable-metrics"], env=self.ENV, port=port, name="first")
        first.wait_healthy()
        ok = run_smoke({"url": "http://127.0.0.1:%d" % port, "requests": 12, "concurrency": 1,
                        "request_timeout": 5, "max_new_tokens": 16})
        assert ok["failed"] is False, ok["msg"]        # first launch: no hang
        first.signal(signal.SIGKILL)
        first.wait(10)
        wait_for(lambda: node.compute_apps() == [], 10, what="memory released after the SIGKILL")
        second = start(INCIDENT + ["--enable-metrics"], env=self.ENV, port=port, name="second")
        second.wait_healthy()                          # /health passes ...
        res = run_smoke({"url": "http://127.0.0.1:%d" % port, "requests": 12, "concurrency": 2,
                         "request_timeout": 1, "timeout": 60, "max_new_tokens": 16})
        assert res["failed"] is True
        assert res["hang"]["request"] == 6 and res["hang"]["answered"] == 5
        assert res["msg"].startswith("Smoke gate failed: request 6 of 12 did not answer within 1 s "
                                     "(5 answered before the run stopped)")
        assert res["requests"]["not_sent"] == 12 - res["requests"]["sent"]

    def test_clean_stop_then_relaunch_does_not_hang(self, start, node):
        port = free_port()
        first = start([], env=self.ENV, port=port, name="first")
        first.wait_healthy()
        first.signal(signal.SIGTERM)
        assert first.wait(20) == 0
        second = start([], env=self.ENV, port=port, name="second")
        second.wait_healthy()
        for _i in range(8):
            assert gen(second, tokens=2, timeout=10).status == 200

    def test_always_hangs_without_a_previous_server(self, start):
        srv = start([], env={"SGLANG_SIM_HANG_AFTER_REQUESTS": "2", "SGLANG_SIM_HANG_WHEN": "always"})
        srv.wait_healthy()
        assert gen(srv, 2).status == 200 and gen(srv, 2).status == 200
        with pytest.raises(OSError):
            gen(srv, 2, timeout=1.0)


# =============================================================================
# ports
# =============================================================================
class TestPorts:
    def test_scheduler_rank0_listens_on_the_nccl_port(self, start):
        srv = start(["--tp-size", "2"])
        srv.wait_healthy()
        kids = srv.tree()
        tp0 = [p for p in kids if cmdline(p) == ["sglang::scheduler_TP0"]]
        assert len(tp0) == 1
        from ansible_collections.gpufleet.sglang.plugins.module_utils.sockets import parse_net_tcp

        with open("/proc/net/tcp") as fh:
            table = list(parse_net_tcp(fh.read()))
        ports = [port for port, inode in table if socket_owners({inode}) == {tp0[0]}]
        assert len(ports) == 1 and 22000 <= ports[0] <= 29999, ports

    def test_explicit_nccl_port(self, start):
        nccl = free_port()
        srv = start(["--nccl-port", str(nccl)])
        srv.wait_healthy()
        owners = listeners(nccl)
        assert len(owners) == 1 and comm(owners.pop()) == "sglang::schedul"

    def test_attention_dp_binds_port_plus_233_plus_1_to_6(self, start):
        port = free_port()
        while port + 240 > 65535:
            port = free_port()
        srv = start(["--tp-size", "2", "--enable-dp-attention", "--dp-size", "2"], port=port)
        srv.wait_healthy()
        kids = srv.tree()
        detok = [p for p in kids if comm(p) == "sglang::detoken"]
        base = port + 233 + 1
        assert listeners(base) == {srv.pid}              # tokenizer
        assert listeners(base + 1) == set(detok)         # detokenizer
        assert listeners(base + 2) == {srv.pid}          # rpc
        assert listeners(base + 3) == set()              # metrics: checked, not bound
        assert listeners(base + 4) == {srv.pid}          # scheduler input
        assert listeners(port + 233) == set()            # dist_init_port itself: checked only

    def test_attention_dp_waits_for_a_busy_derived_port_then_fails(self, start):
        port = free_port()
        while port + 240 > 65535:
            port = free_port()
        blocker = socket.socket()
        blocker.bind(("127.0.0.1", port + 234 + 2))      # rpc_port (port_base + 2) taken
        blocker.listen(1)
        try:
            srv = start(["--enable-dp-attention", "--dp-size", "2", "--tp-size", "2"], port=port,
                        env={"SGLANG_WAIT_PORT_TIMEOUT": "2"})
            rc = srv.wait(20)
        finally:
            blocker.close()
        log = srv.log()
        assert rc == 1
        assert "Port is already in use. dist_init_port=%d port_base=%d" % (port + 233, port + 234) in log
        assert "ValueError: rpc_port at %d is not available in 2 seconds." % (port + 236) in log

    def test_killed_servers_scheduler_child_keeps_the_port(self, start, registry):
        nccl = free_port()
        srv = start(["--nccl-port", str(nccl)], env={"SGLANG_SIM_PORT_LINGER_S": "2"})
        srv.wait_healthy()
        srv.tree()                                       # records the keeper too
        srv.signal(signal.SIGKILL)
        srv.wait(10)
        holders = wait_for(lambda: listeners(nccl), 5, what="a process holding the NCCL port")
        holder = holders.pop()
        assert holder != srv.pid and comm(holder) == "sglang::schedul"
        wait_for(lambda: not listeners(nccl), 15, what="the lingering port released")

    def test_graceful_stop_releases_the_port_at_once(self, start):
        nccl = free_port()
        srv = start(["--nccl-port", str(nccl)], env={"SGLANG_SIM_PORT_LINGER_S": "30"})
        srv.wait_healthy()
        srv.signal(signal.SIGTERM)
        assert srv.wait(20) == 0
        assert listeners(nccl) == set()
