"""Conformance, part 1: a running server. The same checks run against the simulated server and the real
SGLang 0.5.23 server, each started once for this module (``--enable-metrics``, the tiny Llama, a node of
its own); where a check compares payload shapes, the real server's answer is the reference.

The tests run in file order (a weight update changes the state; the drain at the end stops both).
Behaviours that a CPU run cannot show are listed in simulator/README.md ("Conformance with the real
server"), not here."""
from __future__ import annotations

import os
import re
import signal
import threading
import time

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils.node import sockets
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import metrics as sglang_metrics

import servers

KINDS = servers.KINDS


@pytest.fixture(scope="module")
def both(tmp_path_factory, models):
    import conftest

    fleets = dict((k, conftest.Fleet(tmp_path_factory.mktemp("serving-" + k), models)) for k in KINDS)
    try:
        # One at a time: two real-server imports at once on 2 cores only slow both down.
        srv = dict((k, fleets[k].start(k, args=["--enable-metrics"])) for k in KINDS)
        yield srv, fleets
    finally:
        for f in fleets.values():
            f.close()


def _get(srv, path, **kw):
    return srv.request(path, **kw)


def _post(srv, path, body, **kw):
    return srv.request(path, method="POST", body=body, **kw)


def _generate(srv, text="The capital city of France is", tokens=8, ignore_eos=False, **kw):
    sampling = dict({"max_new_tokens": tokens}, **({"ignore_eos": True} if ignore_eos else {}))
    r = _post(srv, "/generate", {"text": text, "sampling_params": sampling}, **kw)
    assert r.status == 200, r.body
    return r.json()


def _shape(value):
    """The key structure of a JSON value (dict keys recursively; lists by their first item)."""
    if isinstance(value, dict):
        return dict((k, _shape(v)) for k, v in value.items())
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    return None


# ---------------------------------------------------------------------------------------------- processes


@pytest.mark.parametrize("kind", KINDS)
def test_process_titles_and_tree(both, kind):
    srv = both[0][kind]
    main = servers.sh.cmdline(srv.pid)
    assert main[1:3] == ["-m", "sglang.launch_server"]
    kids = dict((pid, servers.sh.cmdline(pid)) for pid in servers.sh.children(srv.pid))
    titles = sorted(c[0] for c in kids.values() if c[0].startswith("sglang::"))
    assert titles == ["sglang::detokenizer", "sglang::scheduler"], kids
    trackers = [pid for pid, c in kids.items() if "from multiprocessing.resource_tracker import main" in " ".join(c)]
    assert len(trackers) == 1 and len(kids) == 3, kids             # multiprocessing's resource_tracker, comm python
    assert servers.sh.comm(trackers[0]) == "python"
    assert sorted(servers.sh.comm(p) for p in kids if p not in trackers) == ["sglang::detoken", "sglang::schedul"]
    for pid in kids:
        assert os.getpgid(pid) == os.getpgid(srv.pid) and os.getsid(pid) == os.getsid(srv.pid)


@pytest.mark.parametrize("kind", KINDS)
def test_only_the_scheduler_holds_the_gpu_and_listens_on_its_store_port_on_all_interfaces(both, kind):
    srv = both[0][kind]
    node = both[1][kind].node
    kids = dict((servers.sh.cmdline(pid)[0], pid) for pid in servers.sh.children(srv.pid))
    scheduler = kids["sglang::scheduler"]
    assert [a["pid"] for a in node.compute_apps()] == [scheduler]
    # --host 127.0.0.1, yet the scheduler's torch.distributed store listens on the wildcard address.
    wildcard = set()
    inodes = set()
    for fd in os.listdir("/proc/%d/fd" % scheduler):
        target = os.readlink("/proc/%d/fd/%s" % (scheduler, fd))
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as fh:
            for line in fh.read().splitlines()[1:]:
                f = line.split()
                address, port = f[1].split(":")
                if f[3] == "0A" and int(f[9]) in inodes and set(address) == {"0"}:
                    wildcard.add(int(port, 16))
    assert len(wildcard) == 1, "scheduler %d listens on %s" % (scheduler, sockets.listening_ports(scheduler))
    assert srv.port in sockets.listening_ports(srv.pid)


# ---------------------------------------------------------------------------------------------- health


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("path", ["/health", "/health_generate"])
def test_health_answers_200_after_a_one_token_generation_and_a_one_second_poll(both, kind, path):
    srv = both[0][kind]
    started = time.monotonic()
    r = _get(srv, path)
    took = time.monotonic() - started
    assert r.status == 200
    assert took >= 1.0, "%s %s answered in %.3f s; the real one polls asyncio.sleep(1) at least once" % (kind, path, took)


@pytest.mark.parametrize("kind", KINDS)
def test_ready_and_model_info_answer_at_once(both, kind):
    srv = both[0][kind]
    assert _get(srv, "/ready").status == 200
    assert _get(srv, "/model_info").status == 200


# ---------------------------------------------------------------------------------------------- payloads


def test_server_info_has_the_real_keys_and_layout(both):
    real = _get(both[0]["real"], "/server_info").json()
    sim = _get(both[0]["sim"], "/server_info").json()
    for key in ("launch_command", "status", "max_total_num_tokens", "max_req_input_len", "startup_time",
                "internal_states", "version", "frontend", "weight_version"):
        assert key in real and key in sim, key
    assert sim["version"] == real["version"] == "0.5.23"
    assert _shape(sim["startup_time"]) == _shape(real["startup_time"])
    assert _shape(sim["internal_states"][0]["memory_usage"]) == _shape(real["internal_states"][0]["memory_usage"])
    # Every key the simulator answers is one the real server has (the real one has a few internal fields more).
    assert sorted(set(sim) - set(real)) == []


def test_model_info_has_the_real_keys(both):
    real = _get(both[0]["real"], "/model_info").json()
    sim = _get(both[0]["sim"], "/model_info").json()
    assert sorted(sim) == sorted(real)
    for key in ("model_path", "served_model_name", "weight_version", "load_format", "architectures", "model_type"):
        assert sim[key] if key not in ("weight_version",) else sim[key] == real[key] == "default"


def test_generate_meta_info_has_the_real_keys(both):
    real = _generate(both[0]["real"])
    sim = _generate(both[0]["sim"])
    assert sorted(sim) == sorted(real)
    assert sorted(sim["meta_info"]) == sorted(real["meta_info"]), (
        sorted(set(real["meta_info"]) ^ set(sim["meta_info"])))
    assert len(real["meta_info"]) == 23
    for key in ("prompt_tokens", "completion_tokens"):
        assert sim["meta_info"][key] == real["meta_info"][key] > 0 if key == "completion_tokens" else True


def test_v1_loads_has_the_real_layout(both):
    real = _get(both[0]["real"], "/v1/loads").json()
    sim = _get(both[0]["sim"], "/v1/loads").json()
    assert _shape(sim) == _shape(real)


def test_weights_checker_checksums_are_keyed_by_parameter_name(both):
    out = {}
    for kind in KINDS:
        r = _post(both[0][kind], "/weights_checker", {"action": "checksum"})
        assert r.status == 200
        out[kind] = r.json()
    assert _shape(out["sim"]) == _shape(out["real"])
    names = list(out["real"]["ranks"][0]["checksums"])
    assert "model.layers.0.self_attn.qkv_proj.weight" in names and "lm_head.weight" in names
    assert list(out["sim"]["ranks"][0]["checksums"]) == names
    for kind in KINDS:
        assert re.match(r"^[0-9a-f]{64}$", out[kind]["per_engine_checksum"])
        assert all(re.match(r"^[0-9a-f]{16}$", v) for v in out[kind]["ranks"][0]["checksums"].values())


def test_a_body_error_is_a_400_with_an_error_object(both):
    for kind in KINDS:
        r = _post(both[0][kind], "/update_weights_from_disk", {})
        assert r.status == 400, (kind, r.status, r.body)
        body = r.json()
        assert body["object"] == "error" and body["code"] == 400 and "model_path" in body["message"], (kind, body)


# ---------------------------------------------------------------------------------------------- /metrics


def _families(text):
    samples = sglang_metrics.parse_prometheus(text)
    fams = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            name, kind = line.split()[2:4]
            fams[name] = {"type": kind, "labels": None}
    for sample in samples:
        name = sample["name"] if isinstance(sample, dict) else sample[0]
        labels = sample["labels"] if isinstance(sample, dict) else sample[1]
        base = re.sub(r"_(bucket|sum|count|created)$", "", name)
        fam = fams.get(name) or fams.get(base)
        if fam is not None and fam["labels"] is None:
            fam["labels"] = [k for k in labels if k != "le"]
    return fams


# The families the collection and its docs read (smoke gate, drain, startup budget, the runbook's checks).
RELIED_FAMILIES = (
    "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:spec_accept_length", "sglang:spec_accept_rate",
    "sglang:startup_time_seconds", "sglang:startup_cuda_graph_time_seconds", "sglang:num_prefill_bootstrap_queue_reqs",
    "sglang:num_prefill_inflight_queue_reqs", "sglang:num_decode_prealloc_queue_reqs",
    "sglang:num_decode_transfer_queue_reqs", "sglang:token_usage", "sglang:gen_throughput",
    "sglang:max_total_num_tokens", "sglang:kv_used_tokens", "sglang:kv_available_tokens", "sglang:num_paused_reqs",
    "sglang:num_retracted_reqs", "sglang:utilization", "sglang:http_requests_total", "sglang:http_responses_total",
    "sglang:time_to_first_token_seconds", "sglang:queue_time_seconds", "sglang:weight_memory_usage_gb",
    "sglang:is_cuda_graph", "sglang:context_len", "sglang:e2e_request_latency_seconds",
    "sglang:prompt_tokens_total", "sglang:generation_tokens_total", "sglang:num_requests_total",
)


def test_metrics_families_types_and_label_order(both):
    pages = dict((k, _get(both[0][k], "/metrics").body.decode()) for k in KINDS)
    fams = dict((k, _families(pages[k])) for k in KINDS)
    for name in RELIED_FAMILIES:
        assert name in fams["real"], name
        assert name in fams["sim"], "the simulator has no %s" % name
        assert fams["sim"][name]["type"] == fams["real"][name]["type"], name
    for name in sorted(set(fams["sim"]) & set(fams["real"])):
        assert fams["sim"][name]["labels"] == fams["real"][name]["labels"], name
    # Labels sorted by name in every sample of both.
    for kind in KINDS:
        for name, fam in fams[kind].items():
            if fam["labels"]:
                assert fam["labels"] == sorted(fam["labels"]), (kind, name, fam["labels"])
    # A family appears only after its first sample: no speculation, no spec_verify_calls_total.
    for kind in KINDS:
        assert "sglang:spec_verify_calls_total" not in fams[kind], kind
    assert sorted(set(fams["sim"]) - set(fams["real"])) == []
    # The collection's own parser reads the startup phases from both.
    for kind in KINDS:
        phases = sglang_metrics.startup_phases_from_metrics(pages[kind])
        assert phases and "tokenizer_e2e" in phases, (kind, phases)


# ---------------------------------------------------------------------------------------------- logs


LOG_LINES = (
    r"Load weight begin\. avail mem=\d+\.\d\d GB",
    r"Load weight end\. elapsed=\d+\.\d\d s, type=LlamaForCausalLM, avail mem=\d+\.\d\d GB, mem usage=-?\d+\.\d\d GB\.",
    r"KV Cache is allocated\. dtype: torch\.bfloat16, #tokens: \d+, K size: \d+\.\d\d GB, V size: \d+\.\d\d GB",
    r"Memory pool end\. avail mem=\d+\.\d\d GB",
    r"max_total_num_tokens=\d+, chunked_prefill_size=\d+, max_prefill_tokens=\d+, max_running_requests=\d+, "
    r"context_len=\d+, ",
    r"Engine startup timings \(s\): load_weight=",
    r"INFO:     Started server process \[\d+\]",
    r"INFO:     Uvicorn running on http://127\.0\.0\.1:\d+ \(Press CTRL\+C to quit\)",
    r"Prefill batch, #new-seq: 1, #new-token: \d+, #cached-token: \d+, token usage: \d+\.\d\d, #running-req: \d+, "
    r"#queue-req: \d+",
    r"The server is fired up and ready to roll!",
)


@pytest.mark.parametrize("kind", KINDS)
def test_startup_log_lines_and_warmup_requests(both, kind):
    text = both[0][kind].log()
    for pattern in LOG_LINES:
        assert re.search(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] " + pattern, text, re.M), (kind, pattern)
    before_ready = text.split("The server is fired up and ready to roll!")[0]
    warmup = re.findall(r'INFO:     127\.0\.0\.1:\d+ - "(\w+ /\w+) HTTP/1\.1" 200 OK', before_ready)
    assert warmup == ["GET /model_info", "POST /generate", "POST /freeze_gc"], (kind, warmup)
    phases = sglang_metrics.startup_phases_from_log(text)
    assert phases and set(phases) >= {"load_weight", "kv_cache_allocation", "scheduler_e2e", "tokenizer_e2e"}


# ---------------------------------------------------------------------------------------------- weights


@pytest.mark.parametrize("kind", KINDS)
def test_weight_update_with_the_same_shapes(both, kind, models):
    srv = both[0][kind]
    before = _post(srv, "/weights_checker", {"action": "checksum"}).json()["per_engine_checksum"]
    r = _post(srv, "/update_weights_from_disk", {"model_path": models.path("reseeded"), "weight_version": "v2"})
    assert r.status == 200 and r.json() == {"success": True, "num_paused_requests": 0,
                                            "message": "Succeeded to update model weights. Weight version updated to v2."} \
        or r.json()["message"].startswith("Succeeded to update model weights."), r.body
    info = _get(srv, "/model_info").json()
    assert info["model_path"] == info["served_model_name"] == models.path("reseeded")
    assert info["weight_version"] == "v2"
    launch = _get(srv, "/server_info").json()
    assert launch["model_path"] == launch["served_model_name"] == models.path("base")
    after = _post(srv, "/weights_checker", {"action": "checksum"}).json()["per_engine_checksum"]
    assert after != before
    _generate(srv)


@pytest.mark.parametrize("kind", KINDS)
def test_weight_update_from_another_architecture_with_the_same_tensors_loads(both, kind, models):
    srv = both[0][kind]
    r = _post(srv, "/update_weights_from_disk", {"model_path": models.path("mistral")})
    assert r.status == 200 and r.json()["success"] is True, r.body
    info = _get(srv, "/model_info").json()
    assert info["model_path"] == models.path("mistral") and info["architectures"] == ["LlamaForCausalLM"]
    _generate(srv)


@pytest.mark.parametrize("kind", KINDS)
def test_weight_update_failures_keep_the_server(both, kind, models, tmp_path):
    srv = both[0][kind]
    r = _post(srv, "/update_weights_from_disk", {"model_path": str(tmp_path / "missing")})
    assert r.status == 400 and r.json()["success"] is False
    assert r.json()["message"].startswith("Failed to get weights iterator: "), r.body
    only_config = tmp_path / "config-only"
    only_config.mkdir()
    with open(os.path.join(models.path("base"), "config.json")) as fh:
        (only_config / "config.json").write_text(fh.read())
    r = _post(srv, "/update_weights_from_disk", {"model_path": str(only_config)})
    assert r.status == 400 and "Cannot find any model weights with" in r.json()["message"], r.body
    assert _get(srv, "/model_info").json()["model_path"] == models.path("mistral")


# ---------------------------------------------------------------------------------------------- drain


@pytest.mark.parametrize("kind", KINDS)
def test_sigterm_drains_the_request_in_flight_then_exits_0(both, kind):
    srv = both[0][kind]
    result = {}

    def slow():
        # ignore_eos: the random-weight model may sample its EOS token before the budget (seen once: "stop").
        result["r"] = _generate(srv, tokens=400 if kind == "real" else 2000, ignore_eos=True, timeout=120)

    t = threading.Thread(target=slow)
    t.start()
    servers.sh.wait_for(lambda: "#running-req: 1" in srv.log() or "Prefill batch" in srv.log().rsplit(
        '"POST /weights_checker', 1)[-1], timeout=30, what="the request to start")
    srv.signal(signal.SIGTERM)
    servers.sh.wait_for(lambda: srv.status("/health", timeout=5) == 503, timeout=10, what="/health 503")
    # New requests are still accepted while it drains.
    assert _get(srv, "/model_info").status == 200
    t.join(timeout=120)
    assert result["r"]["meta_info"]["finish_reason"]["type"] == "length"
    assert srv.wait(timeout=60) == 0
    assert re.search(r"Gracefully exiting\.\.\. Remaining number of requests \d+", srv.log())
    assert both[1][kind].node.compute_apps() == []
