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
    GpuNode, ProcessRegistry, Server, alive, cmdline, comm, free_port, free_port_block, make_model, wait_for,
)

from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import metrics as sglang_metrics  # noqa: E402
from ansible_collections.gpufleet.sglang.plugins.module_utils.node.sockets import (  # noqa: E402
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
        # 0.5.23 serves its labels sorted by name (measured on the real server)
        assert re.search(r'^sglang:startup_time_seconds\{engine_type="unified",model_name="[^"]+",'
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
        # The server hangs after 5 requests in its arrival order; with 2 in flight, the module's request 5 or 6
        # is the 6th to arrive (two threads race), so the first one that hung is 6, or 5 when 6 overtook it.
        hang = res["hang"]
        assert hang["answered"] == 5 and hang["hung"] == 2 and hang["request"] in (5, 6), hang
        assert res["msg"].startswith("Smoke gate failed: request %d of 12 (rid %s) did not answer within 1 s "
                                     "(5 answered before the run stopped)" % (hang["request"], hang["rid"]))
        assert hang["rid"].endswith("-%d" % hang["request"])
        assert res["requests_not_sent"] == 12 - res["requests"]["sent"]

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
        from ansible_collections.gpufleet.sglang.plugins.module_utils.node.sockets import parse_net_tcp

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
        port = free_port_block(240)       # --port and port + 233 .. + 239, off the ephemeral range
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
        port = free_port_block(240)       # --port and port + 233 .. + 239, off the ephemeral range
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


# =============================================================================
# LoRA adapters, --delete-ckpt-after-loading
# =============================================================================
def make_adapter(path, rank=8):
    path.mkdir(parents=True, exist_ok=True)
    (path / "adapter_config.json").write_text(json.dumps({"r": rank, "lora_alpha": 16,
                                                          "target_modules": ["q_proj", "v_proj"]}))
    return str(path)


class TestLora:
    def test_load_list_use_unload_and_gone_after_restart(self, start, tmp_path, model):
        sql = make_adapter(tmp_path / "lora" / "sql")
        port = free_port()
        srv = start(["--enable-lora", "--max-lora-rank", "16", "--served-model-name", "base"], port=port)
        srv.wait_healthy()
        r = srv.request("/load_lora_adapter", "POST", {"lora_name": "sql", "lora_path": sql})
        assert r.status == 200
        assert r.json() == {"rid": None, "http_worker_ipc": None, "success": True, "error_message": "",
                            "loaded_adapters": {"sql": sql}}
        models = srv.request("/v1/models").json()["data"]
        assert [(m["id"], m["root"], m["parent"], m["max_model_len"]) for m in models] == [
            ("base", "base", None, models[0]["max_model_len"]), ("sql", sql, "base", None)]
        assert gen(srv, 4, lora_path="sql").status == 200
        again = srv.request("/load_lora_adapter", "POST", {"lora_name": "sql", "lora_path": sql})
        assert again.status == 400 and again.json()["error_message"] == (
            "Failed to load LoRA adapter sql because it is already loaded")
        info = srv.request("/server_info").json()
        assert info["lora_paths"] in (None, [])          # launch values only
        bad = gen(srv, 4, lora_path="nope")
        assert bad.status == 400 and bad.json()["error"]["message"].startswith(
            "The following requested LoRA adapters are not loaded: nope\nLoaded adapters: odict_keys(['sql']).")
        r = srv.request("/unload_lora_adapter", "POST", {"lora_name": "sql"})
        assert r.status == 200 and r.json()["loaded_adapters"] == {}
        r = srv.request("/unload_lora_adapter", "POST", {"lora_name": "sql"})
        assert r.status == 400 and r.json()["error_message"] == (
            "LoRA with name sql does not exist. Loaded LoRAs: odict_keys([])")
        assert srv.request("/load_lora_adapter", "POST", {"lora_name": "sql", "lora_path": sql}).status == 200
        srv.signal(signal.SIGTERM)
        assert srv.wait(20) == 0
        again = start(["--enable-lora", "--served-model-name", "base"], port=port, name="again")
        again.wait_healthy()
        assert [m["id"] for m in again.request("/v1/models").json()["data"]] == ["base"]   # runtime adapters vanish

    def test_launch_adapters_errors_and_disabled(self, start, tmp_path):
        a = make_adapter(tmp_path / "lora" / "a")
        big = make_adapter(tmp_path / "lora" / "big", rank=64)
        srv = start(["--lora-paths", "alpha=%s" % a, "--max-lora-rank", "16"])
        srv.wait_healthy()
        assert [m["id"] for m in srv.request("/v1/models").json()["data"]][1:] == ["alpha"]
        r = srv.request("/load_lora_adapter", "POST", {"lora_name": "big", "lora_path": big})
        assert r.status == 400 and "with rank 64 is incompatible" in r.json()["error_message"]
        assert r.json()["loaded_adapters"] == {"alpha": a}
        missing = srv.request("/load_lora_adapter", "POST", {"lora_name": "m", "lora_path": str(tmp_path / "no")})
        assert missing.status == 400 and "No such file or directory" in missing.json()["error_message"]
        assert srv.request("/load_lora_adapter", "POST", {"lora_name": "x"}).status == 400
        off = start([], name="off", env={"CUDA_VISIBLE_DEVICES": "1"})
        off.wait_healthy()
        r = off.request("/load_lora_adapter", "POST", {"lora_name": "a", "lora_path": a})
        assert r.status == 400 and r.json() == {
            "rid": None, "http_worker_ipc": None, "success": False,
            "error_message": "LoRA is not enabled. Please set `--enable-lora` to enable LoRA.",
            "loaded_adapters": None}


class TestDeleteCheckpoint:
    def test_model_directory_is_removed_after_the_ready_line(self, start, model):
        srv = start(["--delete-ckpt-after-loading"])
        srv.wait_healthy()
        wait_for(lambda: not os.path.exists(model), 5, what="checkpoint deleted")
        log = srv.log()
        assert log.index("The server is fired up and ready to roll!") < len(log)
        assert gen(srv, 4).status == 200                  # the weights are in GPU memory still
        assert srv.request("/weights_checker", "POST", {}).json()["success"] is True

    def test_without_the_flag_nothing_is_deleted(self, start, model):
        srv = start([])
        srv.wait_healthy()
        assert os.path.isfile(os.path.join(model, "config.json"))


# =============================================================================
# in-place weight updates
# =============================================================================
def make_checkpoint(path, content=b"weights v1", config=None):
    make_model(path, config)
    (path / "model.safetensors").write_bytes(content)
    return str(path)


def safetensors_bytes(tensors):
    """A safetensors file (stdlib): ``{name: (shape, fill byte)}``, bf16."""
    header, data = {}, b""
    for name, (shape, fill) in sorted(tensors.items()):
        size = 2
        for dim in shape:
            size *= dim
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [len(data), len(data) + size]}
        data += bytes([fill]) * size
    raw = json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw + data


def llama_tensors(hidden=8, fill=1):
    t = {"model.embed_tokens.weight": ([32, hidden], fill), "lm_head.weight": ([32, hidden], fill + 1),
         "model.norm.weight": ([hidden], fill + 2)}
    for proj, rows in (("q_proj", hidden), ("k_proj", hidden // 2), ("v_proj", hidden // 2), ("o_proj", hidden)):
        t["model.layers.0.self_attn.%s.weight" % proj] = ([rows, hidden], fill + 3)
    for proj in ("gate_proj", "up_proj"):
        t["model.layers.0.mlp.%s.weight" % proj] = ([2 * hidden, hidden], fill + 4)
    t["model.layers.0.mlp.down_proj.weight"] = ([hidden, 2 * hidden], fill + 5)
    return t


def make_safetensors_checkpoint(path, arch="LlamaForCausalLM", hidden=8, fill=1):
    make_model(path, {"architectures": [arch], "model_type": arch[:-len("ForCausalLM")].lower(),
                      "hidden_size": hidden, "num_hidden_layers": 1, "vocab_size": 32})
    (path / "model.safetensors").write_bytes(safetensors_bytes(llama_tensors(hidden, fill)))
    return str(path)


class TestWeightsByParameter:
    """The loader matches tensors to parameters by name and shape (measured on the real 0.5.23)."""

    def checksums(self, srv):
        r = srv.request("/weights_checker", "POST", {"action": "checksum"})
        assert r.status == 200, r.body
        return r.json()["ranks"][0]["checksums"]

    def test_checksums_are_keyed_by_fused_parameter_in_module_order(self, start, tmp_path):
        v1 = make_safetensors_checkpoint(tmp_path / "v1")
        srv = start(["--model-path", v1])
        srv.wait_healthy()
        sums = self.checksums(srv)
        assert list(sums) == ["model.embed_tokens.weight", "model.layers.0.self_attn.qkv_proj.weight",
                              "model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.gate_up_proj.weight",
                              "model.layers.0.mlp.down_proj.weight", "model.norm.weight", "lm_head.weight"]
        assert all(re.match(r"^[0-9a-f]{16}$", v) for v in sums.values())

    def test_another_architecture_with_the_same_tensors_loads_and_keeps_the_architecture(self, start, tmp_path):
        v1 = make_safetensors_checkpoint(tmp_path / "v1")
        mistral = make_safetensors_checkpoint(tmp_path / "mistral", arch="MistralForCausalLM", fill=7)
        srv = start(["--model-path", v1])
        srv.wait_healthy()
        before = self.checksums(srv)
        r = srv.request("/update_weights_from_disk", "POST", {"model_path": mistral})
        assert r.status == 200 and r.json()["success"] is True, r.body
        info = srv.request("/model_info").json()
        assert info["model_path"] == mistral and info["architectures"] == ["LlamaForCausalLM"]
        after = self.checksums(srv)
        assert list(after) == list(before) and all(after[k] != before[k] for k in before)

    def test_tensors_of_other_shapes_kill_the_server_without_an_answer(self, start, tmp_path, node):
        v1 = make_safetensors_checkpoint(tmp_path / "v1")
        wide = make_safetensors_checkpoint(tmp_path / "wide", hidden=16)
        srv = start(["--model-path", v1], env={"SGLANG_PYSPY_DUMP_BEFORE_CRASH": "1",
                                               "SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "1"})
        srv.wait_healthy()
        tree = srv.tree()
        with pytest.raises(OSError):        # the connection closes with the process, unanswered
            srv.request("/update_weights_from_disk", "POST", {"model_path": wide}, timeout=30)
        assert srv.wait(30) == -signal.SIGKILL
        log = srv.log()
        assert "Scheduler hit an exception" in log and "RuntimeError: The size of tensor a (8) must match the " \
            "size of tensor b (16) at non-singleton dimension 1" in log, log[-3000:]
        assert "Sleeping 5 seconds before crash diagnostics to let GPU activity settle." in log
        assert "No live scheduler processes found; skipping py-spy and CUDA coredump." in log
        wait_for(lambda: not any(alive(p) for p in tree), 10, what="the tree to be gone")


class TestWeights:
    def checksums(self, srv):
        r = srv.request("/weights_checker", "POST", {"action": "checksum"})
        assert r.status == 200, r.body
        return r.json()

    def test_update_swaps_weights_and_versions(self, start, tmp_path):
        v1 = make_checkpoint(tmp_path / "ckpt" / "v1", b"step 1000")
        v2 = make_checkpoint(tmp_path / "ckpt" / "v2", b"step 2000")
        srv = start(["--model-path", v1, "--tp-size", "2", "--enable-metrics"])
        srv.wait_healthy()
        before = self.checksums(srv)
        assert before["success"] is True and before["message"] == "Success."
        assert [r["parallelism_info"][0]["tp_rank"] for r in before["ranks"]] == [0, 1]
        assert set(before["ranks"][0]["checksums"]) == {"model.safetensors"}
        assert before["ranks"][0]["per_gpu_checksum"] != before["ranks"][1]["per_gpu_checksum"]
        assert self.checksums(srv) == before                                     # stable
        r = srv.request("/update_weights_from_disk", "POST",
                        {"model_path": v2, "weight_version": "v2", "abort_all_requests": True})
        assert r.status == 200
        assert r.json() == {"success": True, "message": "Succeeded to update model weights. Weight version "
                                                        "updated to v2.", "num_paused_requests": 0}
        after = self.checksums(srv)
        assert after["per_engine_checksum"] != before["per_engine_checksum"]
        info = srv.request("/model_info").json()
        assert (info["model_path"], info["served_model_name"], info["weight_version"], info["load_format"]) == (
            v2, v2, "v2", "auto")
        server_info = srv.request("/server_info").json()
        assert server_info["model_path"] == v1 and server_info["weight_version"] == "default"   # launch values
        assert gen(srv, 4).json()["meta_info"]["weight_version"] == "v2"
        assert "sglang:weight_load_duration_seconds{" in srv.request("/metrics").body.decode()
        r = srv.request("/update_weight_version", "POST", {"new_version": "v2.1"})
        assert r.status == 200 and r.json() == {"success": True, "message": "Weight version updated to v2.1",
                                                "new_version": "v2.1"}
        assert srv.request("/model_info").json()["weight_version"] == "v2.1"
        # back to v1: the checksums return to the launch ones
        assert srv.request("/update_weights_from_disk", "POST", {"model_path": v1}).status == 200
        assert self.checksums(srv)["per_engine_checksum"] == before["per_engine_checksum"]

    def test_failures_keep_the_old_weights(self, start, tmp_path, node):
        v1 = make_checkpoint(tmp_path / "ckpt" / "v1")
        empty = make_model(tmp_path / "ckpt" / "empty")
        v2 = make_checkpoint(tmp_path / "ckpt" / "v2", b"step 2000")
        srv = start(["--model-path", v1], env={"SGLANG_SIM_UPDATE_BUFFER_MIB": "500000"})
        srv.wait_healthy()
        before = self.checksums(srv)
        for path, message in (
                (str(tmp_path / "nowhere"), "Failed to get weights iterator: Cannot find any model weights with "
                                            "`%s`." % (tmp_path / "nowhere")),
                (empty, "Failed to get weights iterator: Cannot find any model weights with `%s`." % empty)):
            r = srv.request("/update_weights_from_disk", "POST", {"model_path": path})
            assert r.status == 400 and r.json()["success"] is False and r.json()["message"].startswith(message)
        oom = srv.request("/update_weights_from_disk", "POST", {"model_path": v2})   # the staging buffer
        assert oom.status == 400
        assert oom.json()["message"].startswith("Failed to update weights: torch.OutOfMemoryError: CUDA out of "
                                                "memory. Tried to allocate")
        assert oom.json()["message"].endswith("\nRolling back to original weights.")
        assert self.checksums(srv) == before
        assert srv.request("/model_info").json()["model_path"] == v1
        assert gen(srv, 4).status == 200                 # still serving
        assert node.used()[0] > 1                        # the buffer was freed, the server's memory is held
        # 0.5.23 answers a body that fails validation with 400 and an error object, not FastAPI's 422
        for path in ("/update_weights_from_disk", "/update_weight_version"):
            r = srv.request(path, "POST", {})
            assert r.status == 400 and r.json()["object"] == "error" and r.json()["code"] == 400, r.body
        bad = srv.request("/weights_checker", "POST", {"action": "explode"})
        assert bad.status == 400 and bad.json() == {"success": False, "message": "Unsupported action='explode'"}

    def test_update_waits_for_requests_in_flight(self, start, tmp_path):
        v1 = make_checkpoint(tmp_path / "ckpt" / "v1")
        v2 = make_checkpoint(tmp_path / "ckpt" / "v2", b"step 2000")
        srv = start(["--model-path", v1], env={"SGLANG_SIM_TIME_SCALE": "0.2"})
        srv.wait_healthy()
        out = {}
        t = threading.Thread(target=lambda: out.setdefault("r", gen(srv, 200)))
        t.start()
        wait_for(lambda: srv.request("/v1/loads").json()["loads"][0]["num_running_reqs"] == 1, 5, what="running")
        r = srv.request("/update_weights_from_disk", "POST", {"model_path": v2})
        t.join(30)
        assert r.status == 200
        # the request finished on the old weights before the swap (the update waited for it)
        assert out["r"].status == 200 and out["r"].json()["meta_info"]["completion_tokens"] == 200
        assert out["r"].json()["meta_info"]["finish_reason"]["type"] == "length"

    def test_snapshot_compare(self, start, tmp_path):
        v1 = make_checkpoint(tmp_path / "ckpt" / "v1")
        v2 = make_checkpoint(tmp_path / "ckpt" / "v2", b"step 2000")
        srv = start(["--model-path", v1])
        srv.wait_healthy()
        assert srv.request("/weights_checker", "POST", {"action": "snapshot"}).json() == {
            "success": True, "message": "Success."}
        assert srv.request("/weights_checker", "POST", {"action": "compare"}).status == 200
        assert srv.request("/update_weights_from_disk", "POST", {"model_path": v2}).status == 200
        assert srv.request("/weights_checker", "POST", {"action": "compare"}).status == 400


# =============================================================================
# PD disaggregation
# =============================================================================
def pd_request(prefill, decode, bootstrap_port, room, tokens=32, timeout=60):
    """What a PD router does: the same request to both roles, with the bootstrap fields."""
    body = {"text": "hello world", "sampling_params": {"max_new_tokens": tokens},
            "bootstrap_host": "127.0.0.1", "bootstrap_port": bootstrap_port, "bootstrap_room": room}
    out = {}

    def send(name, srv):
        try:
            out[name] = srv.request("/generate", "POST", body, timeout=timeout)
        except OSError as e:
            out[name] = e

    threads = [threading.Thread(target=send, args=("prefill", prefill)),
               threading.Thread(target=send, args=("decode", decode))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    return out["prefill"], out["decode"]


class TestDisaggregation:
    def pair(self, start, prefill_args=(), decode_args=(), env=None):
        boot = free_port()
        prefill = start(["--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(boot),
                         "--enable-metrics"] + list(prefill_args), env=dict(env or {}, CUDA_VISIBLE_DEVICES="0"),
                        name="prefill")
        decode = start(["--disaggregation-mode", "decode", "--enable-metrics"] + list(decode_args),
                       env=dict(env or {}, CUDA_VISIBLE_DEVICES="1"), name="decode")
        prefill.wait_healthy()
        decode.wait_healthy()
        return prefill, decode, boot

    def test_request_through_both_roles_and_queue_gauges(self, start):
        prefill, decode, boot = self.pair(start, env={"SGLANG_SIM_PD_TRANSFER_S": "0.5"})
        import urllib.request

        url = "http://127.0.0.1:%d/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"
        info = json.loads(urllib.request.urlopen(url % boot, timeout=5).read())
        assert info["page_size"] == 1 and info["kv_cache_dtype"] == "bfloat16"
        assert info["decode_allocation_policy"] == "early" and info["prefill_http_port"] == prefill.port
        assert "kv_layout" not in info and info["target_tp_rank"] is None
        assert urllib.request.urlopen("http://127.0.0.1:%d/health" % boot, timeout=5).read() == b"OK"
        seen = {}

        def watch():
            for _i in range(200):
                q = sglang_metrics.pd_queue_depths(decode.request("/metrics").body.decode())
                p = sglang_metrics.pd_queue_depths(prefill.request("/metrics").body.decode())
                for k, v in list(q.items()) + list(p.items()):
                    if v:
                        seen[k] = max(seen.get(k, 0), v)
                if "done" in seen:
                    return
                time.sleep(0.02)

        w = threading.Thread(target=watch)
        w.start()
        p_res, d_res = pd_request(prefill, decode, boot, room=4242)
        seen["done"] = 1
        w.join(10)
        assert p_res.status == 200 and p_res.json()["meta_info"]["completion_tokens"] == 1
        assert d_res.status == 200 and d_res.json()["meta_info"]["completion_tokens"] == 32
        assert d_res.json()["meta_info"]["cached_tokens"] == d_res.json()["meta_info"]["prompt_tokens"] - 1
        assert seen.get("decode_transfer") == 1 and seen.get("prefill_inflight") == 1, seen
        text = decode.request("/metrics").body.decode()
        assert re.search(r'^sglang:num_decode_transfer_queue_reqs\{[^}]*engine_type="decode"[^}]*\} 0\.0$',
                         text, re.M)
        assert decode.request("/model_info").json()["disaggregation_mode"] == "decode"
        loads = decode.request("/v1/loads?include=disagg").json()["loads"][0]
        assert loads["disaggregation"]["mode"] == "decode" and loads["disaggregation"]["decode_transfer_queue_reqs"] == 0
        prom = decode.request("/v1/loads?format=prometheus").body.decode()
        assert 'sglang_disagg_decode_transfer_queue_reqs{dp_rank="0"} 0' in prom
        assert 'sglang_num_running_reqs{dp_rank="0"} 0' in prom

    def test_allocation_policy_mismatch_fails_the_request(self, start):
        prefill, decode, boot = self.pair(
            start, prefill_args=["--disaggregation-decode-allocation-policy", "prefill_complete"],
            env={"SGLANG_SIM_PD_BOOTSTRAP_TIMEOUT_S": "1"})
        p_res, d_res = pd_request(prefill, decode, boot, room=1, timeout=20)
        assert p_res.status == 500 and "KVPoll.Bootstrapping" in p_res.json()["detail"]
        assert d_res.status == 500
        detail = d_res.json()["detail"]
        assert detail.startswith("Decode handshake failed for request rank=0 decode_req.req.rid=")
        assert ("Disaggregation decode allocation policy mismatch: prefill=prefill_complete, decode=early. "
                "Set --disaggregation-decode-allocation-policy identically on both roles.") in detail
        assert decode.poll() is None
        assert "sglang:num_bootstrap_failed_reqs_total" in decode.request("/metrics").body.decode()

    def test_transfer_backend_mismatch(self, start):
        prefill, decode, boot = self.pair(start, decode_args=["--disaggregation-transfer-backend", "nixl"],
                                          env={"SGLANG_SIM_PD_BOOTSTRAP_TIMEOUT_S": "1"})
        p_res, d_res = pd_request(prefill, decode, boot, room=7, timeout=20)
        assert d_res.status == 500
        assert "transfer backend mismatch: the prefill uses mooncake, the decode nixl" in d_res.json()["detail"]
        assert p_res.status == 500 and "timed out" in p_res.json()["detail"]   # its decode never came

    def test_page_size_mismatch_takes_the_decode_server_down(self, start):
        prefill, decode, boot = self.pair(start, prefill_args=["--page-size", "16"],
                                          env={"SGLANG_SIM_PD_BOOTSTRAP_TIMEOUT_S": "1"})
        pd_request(prefill, decode, boot, room=9, timeout=10)
        assert decode.wait(20) == -signal.SIGKILL
        assert ("RuntimeError: Page size mismatch: prefill server has page_size=16, but decode server has "
                "page_size=1. Both servers must use the same --page-size value.") in decode.log()

    def test_requests_without_bootstrap_fields_are_refused(self, start):
        prefill, decode, boot = self.pair(start)
        r = gen(prefill, 4)
        assert r.status == 400 and "no bootstrap_host/bootstrap_room" in r.json()["error"]["message"]


class TestMultiNodeAttentionDP:
    def test_two_nodes_bind_dist_init_port_plus_1_to_6_and_13(self, start):
        dist = free_port_block(20)        # the base and the ports derived from it, all free, off the ephemeral range
        common = ["--tp-size", "4", "--nnodes", "2", "--dist-init-addr", "127.0.0.1:%d" % dist,
                  "--enable-dp-attention", "--dp-size", "2"]
        rank0 = start(common + ["--node-rank", "0"], env={"CUDA_VISIBLE_DEVICES": "0,1"}, name="rank0")
        rank1 = start(common + ["--node-rank", "1"], env={"CUDA_VISIBLE_DEVICES": "2,3"}, name="rank1")
        rank0.wait_healthy(timeout=90)
        assert listeners(dist) == {rank0.pid}                     # the rendezvous store
        for offset in (1, 3, 5, 6):                               # tokenizer, rpc, scheduler input, load collector
            assert listeners(dist + offset) == {rank0.pid}, offset
        assert listeners(dist + 13) == {rank0.pid}                # worker-port handshake
        assert listeners(dist + 4) == set()                       # metrics: checked only
        rank0.signal(signal.SIGTERM)
        assert rank0.wait(30) == 0
        assert rank1.wait(30) == 0


# =============================================================================
# HTTP bodies: chunked requests, and a keep-alive connection after a 401 (uvicorn reads both right)
# =============================================================================
class TestRequestBodies:
    KEY = "sk-bodies-" + "0a1b2c3d"

    def _exchange(self, port, raw):
        """Send ``raw`` bytes on one connection and return every response's status line."""
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(raw)
            sock.shutdown(socket.SHUT_WR)
            data = b""
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        # A response's body runs straight into the next status line: find the status lines anywhere.
        return re.findall(rb"HTTP/1\.1 (\d{3}) ", data)

    def test_chunked_body_and_a_401_leave_the_connection_in_step(self, start):
        srv = start(["--api-key", self.KEY])
        srv.wait_healthy()
        body = json.dumps({"text": "hello", "sampling_params": {"max_new_tokens": 4}}).encode()
        auth = ("Authorization: Bearer %s\r\n" % self.KEY).encode()
        # 1. without the key (401, body never read by a handler), 2. chunked with the key, 3. a length-body
        # request with the key: all three on one keep-alive connection.
        first = (b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                 % len(body)) + body
        half = len(body) // 2
        second = (b"POST /generate HTTP/1.1\r\nHost: x\r\n" + auth + b"Content-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % half + body[:half] + b"\r\n"
                  + b"%x\r\n" % (len(body) - half) + body[half:] + b"\r\n0\r\n\r\n")
        third = (b"POST /generate HTTP/1.1\r\nHost: x\r\n" + auth + b"Content-Type: application/json\r\n"
                 b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body)) + body
        statuses = self._exchange(srv.port, first + second + third)
        assert statuses == [b"401", b"200", b"200"], statuses
