"""Unit tests for module_utils/pd: the fields prefill and decode must share per release, check_pair's
verdicts, and rollout_order's plans with every intermediate state checked. The verdicts are held against
the fake SGLang server (simulator/python): a prefill/decode pair started with the same args on two
simulated GPUs (temporary GPUSIM_ROOT from ``gpusim init``, fast knobs of playbook_helpers, every process
recorded and SIGKILLed by PID), one request sent through both roles the way a PD router does."""
from __future__ import annotations

import os
import sys
import threading

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import pd

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "simulator"))

from sglang_helpers import GpuNode, ProcessRegistry, Server, free_port, make_model  # noqa: E402 - after sys.path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "integration"))

from playbook_helpers import FAST_SERVER_ENV  # noqa: E402 - after sys.path

P = {"disaggregation_mode": "prefill", "model_path": "/models/qwen", "max_running_requests": 64}
D = {"disaggregation_mode": "decode", "model_path": "/models/qwen", "max_running_requests": 64}


def fields(version):
    return dict((f["field"], f["consequence"]) for f in pd.layout_fields(version))


# =============================================================================
# layout_fields / check_pair
# =============================================================================
def test_layout_fields_per_release():
    assert fields("0.5.23") == {
        "page_size": "decode_crash", "kv_cache_dtype": "decode_crash", "disaggregation_transfer_backend": "request_fails",
        "disaggregation_decode_allocation_policy": "request_fails", "disaggregation_enable_kv_checksum": "warning",
        "model_path": "silent"}
    assert fields("0.5.10") == {"page_size": "decode_crash", "kv_cache_dtype": "decode_crash",
                                "disaggregation_transfer_backend": "request_fails", "model_path": "silent"}
    old = fields("0.5.1")
    assert old["page_size"] == old["kv_cache_dtype"] == "silent" and "disaggregation_decode_allocation_policy" not in old
    assert fields("0.4.6.post5") == old
    assert "does not check it" in pd.layout_fields("0.5.1")[0]["detail"]


def test_compatible_pair_has_no_problem():
    assert pd.check_pair(P, D) == []
    # spellings, defaults and aliases compare as the server does
    assert pd.check_pair(dict(P, **{"--page-size": 1, "--kv-cache-dtype": "bf16"}),
                         dict(D, page_size=None, kv_cache_dtype="bfloat16")) == []
    assert pd.check_pair(dict(P, disaggregation_transfer_backend="mooncake_tcp"), D) == []   # 0.5.23 rewrites it
    assert pd.check_pair(dict(P, tp_size=4), dict(D, tp_size=2)) == []      # attention TP sizes may differ


@pytest.mark.parametrize("field,p_value,d_value,consequence", [
    ("page_size", 16, 1, "decode_crash"),
    ("kv_cache_dtype", "fp8_e4m3", "auto", "decode_crash"),
    ("disaggregation_transfer_backend", "mooncake", "nixl", "request_fails"),
    ("disaggregation_decode_allocation_policy", "prefill_complete", "early", "request_fails"),
    ("model_path", "/models/qwen-v2", "/models/qwen", "silent"),
])
def test_each_mismatch_names_field_values_and_consequence(field, p_value, d_value, consequence):
    problems = pd.check_pair(dict(P, **{field: p_value}), dict(D, **{field: d_value}), model_dtype="bfloat16")
    assert len(problems) == 1
    prob = problems[0]
    assert prob["field"] == field and prob["consequence"] == consequence and prob["blocking"] is True
    shown_d = "bfloat16" if d_value == "auto" else str(d_value)
    assert (prob["prefill"], prob["decode"]) == (str(p_value), shown_d)
    assert prob["message"].startswith("%s: prefill %s, decode %s: " % (field, p_value, shown_d))


def test_kv_checksum_only_warns():
    problems = pd.check_pair(P, dict(D, disaggregation_enable_kv_checksum=True))
    assert [(x["field"], x["consequence"], x["blocking"]) for x in problems] == [
        ("disaggregation_enable_kv_checksum", "warning", False)]
    assert pd.blocking(problems) == []
    assert pd.check_pair(P, dict(D, disaggregation_enable_kv_checksum=True), version="0.5.10") == []


def test_kv_dtype_resolution_per_release():
    # 0.5.23 compares the resolved dtype: auto follows --dtype, then the model's torch_dtype
    half = pd.check_pair(dict(P, dtype="float16"), D, model_dtype="bfloat16")
    assert [(x["field"], x["prefill"], x["decode"]) for x in half] == [("kv_cache_dtype", "float16", "bfloat16")]
    assert pd.check_pair(P, dict(D, kv_cache_dtype="bfloat16"), model_dtype="bfloat16") == []
    unknown = pd.check_pair(P, dict(D, kv_cache_dtype="bfloat16"))
    assert unknown[0]["prefill"] == "auto (the model's torch_dtype)" and unknown[0]["blocking"] is True
    # 0.5.10 compares the arg as given: auto against an explicit bfloat16 kills the decode
    old = pd.check_pair(P, dict(D, kv_cache_dtype="bfloat16"), version="0.5.10", model_dtype="bfloat16")
    assert [(x["prefill"], x["decode"], x["consequence"]) for x in old] == [("auto", "bfloat16", "decode_crash")]


def test_roles_are_checked():
    problems = pd.check_pair(P, dict(D, disaggregation_mode="prefill"))
    assert [x["message"] for x in problems] == ["disaggregation_mode: the decode server runs prefill, not decode"]


# =============================================================================
# rollout_order
# =============================================================================
def fleet(role_args, n, **new):
    name = "p" if role_args["disaggregation_mode"] == "prefill" else "d"
    return dict(("%s%d" % (name, i), (role_args, dict(role_args, **new))) for i in range(n))


def test_a_change_outside_the_layout_rolls_one_role_at_a_time():
    plan = pd.rollout_order(fleet(P, 2, max_running_requests=32), fleet(D, 2, max_running_requests=32))
    assert plan["order"] == "rolling" and plan["pair_mode"] is None and plan["layout_changed"] is False
    assert [(s["role"], s["hosts"]) for s in plan["steps"]] == [
        ("prefill", ["p0"]), ("prefill", ["p1"]), ("decode", ["d0"]), ("decode", ["d1"])]
    assert [s["router"] for s in plan["states"]] == [["d0", "d1", "p1"], ["d0", "d1", "p0"], ["d1", "p0", "p1"],
                                                     ["d0", "p0", "p1"]]
    assert plan["problems"] == [] and plan["outage"] is False
    # hosts whose args do not change are not touched
    unchanged = fleet(D, 2)
    plan = pd.rollout_order(fleet(P, 2, max_running_requests=32), unchanged)
    assert [s["hosts"] for s in plan["steps"]] == [["p0"], ["p1"]]


def test_rolling_with_a_single_server_of_a_role_is_an_outage():
    plan = pd.rollout_order(fleet(P, 1, max_running_requests=32), fleet(D, 2))
    assert plan["order"] == "rolling" and plan["outage"] is True and plan["problems"] == []
    assert plan["notes"] == ["step 1 (prefill p0 out): 0 Ready prefill server(s) left while it is replaced, fewer "
                             "than 1: requests fail meanwhile (add a prefill server to avoid it)"]


def test_a_layout_change_stops_both_roles_without_a_second_router():
    plan = pd.rollout_order(fleet(P, 2, page_size=16), fleet(D, 2, page_size=16))
    assert (plan["order"], plan["pair_mode"], plan["outage"], plan["layout_changed"]) == ("pair", "stop_both", True, True)
    assert plan["layout_differences"] == [{"field": "page_size", "old": ["1"], "new": ["16"], "consequence": "decode_crash"}]
    assert "page_size 1 -> 16" in plan["why"] and "both roles leave it" in plan["why"]
    assert [s["action"] for s in plan["steps"]] == ["remove_from_router", "replace", "add_to_router"]
    assert plan["problems"] == []
    assert {m["field"] for m in plan["mixed_pairs"]} == {"page_size"}


def test_a_layout_change_goes_blue_green_with_a_second_router():
    plan = pd.rollout_order(fleet(P, 2, kv_cache_dtype="fp8_e4m3"), fleet(D, 3, kv_cache_dtype="fp8_e4m3"),
                            separate_router=True, model_dtype="bfloat16")
    assert (plan["order"], plan["pair_mode"], plan["outage"]) == ("pair", "blue_green", False)
    assert [(s["action"], s["hosts"]) for s in plan["steps"]] == [
        ("replace_into_green", ["p0", "d0"]), ("switch_traffic", ["d0", "p0"]), ("replace_into_green", ["p1", "d1"]),
        ("replace_into_green", ["d2"])]
    assert [(s["blue"], s["green"], s["live"]) for s in plan["states"]] == [
        (["d1", "d2", "p1"], ["d0", "p0"], "blue"), (["d1", "d2", "p1"], ["d0", "p0"], "green"),
        (["d2"], ["d0", "d1", "p0", "p1"], "green"), ([], ["d0", "d1", "d2", "p0", "p1"], "green")]
    assert plan["problems"] == []


def test_blue_green_needs_two_servers_of_each_role():
    plan = pd.rollout_order(fleet(P, 1, page_size=16), fleet(D, 2, page_size=16), separate_router=True)
    assert plan["pair_mode"] == "stop_both"
    assert "blue/green needs at least 2 serving servers of each role (prefill 1, decode 2)" in plan["notes"][0]


def test_a_weight_change_in_a_pd_fleet_rolls_both_roles_together():
    plan = pd.rollout_order(fleet(P, 2, model_path="/models/qwen-v2"), fleet(D, 2, model_path="/models/qwen-v2"))
    assert plan["order"] == "pair" and plan["layout_differences"][0]["field"] == "model_path"


def test_forced_and_contradicted_layout_flags():
    forced = pd.rollout_order(fleet(P, 2, max_running_requests=8), fleet(D, 2), layout_changed=True)
    assert forced["order"] == "pair" and "forced by layout_changed" in forced["why"]
    contradicted = pd.rollout_order(fleet(P, 2, page_size=16), fleet(D, 2, page_size=16), layout_changed=False)
    assert contradicted["order"] == "pair"
    assert contradicted["notes"] == ["layout_changed was given as false, but the args change the shared layout (page_size)"]


def test_a_target_or_an_intermediate_state_that_is_incompatible_is_a_problem():
    # the new fleet itself disagrees (only the prefills get the new page size)
    plan = pd.rollout_order(fleet(P, 2, page_size=16), fleet(D, 2))
    assert any(p.startswith("the new fleet: prefill p0 with decode d0: page_size: prefill 16, decode 1") for p in plan["problems"])
    # an old fleet that already mixes layouts: every state that still pairs them is named
    old_mixed = {"p0": (dict(P, page_size=16), dict(P, page_size=16)), "p1": (dict(P, page_size=16), dict(P, page_size=16))}
    plan = pd.rollout_order(old_mixed, fleet(D, 2, page_size=16), separate_router=True)
    assert plan["pair_mode"] == "blue_green"
    assert [s["step"] for s in plan["states"] if s["problems"]] == [1, 2]     # while blue still pairs p1 with d1
    assert plan["problems"][0] == ("step 1, blue router: prefill p1 with decode d1: page_size: prefill 16, decode 1: "
                                   "the decode scheduler raises \"Page size mismatch\" on its first request from "
                                   "that prefill and the decode server goes down")
    # the rolling order proves each state too: a state without the role's last server is a gap, not a mix
    plan = pd.rollout_order(fleet(P, 2, max_running_requests=8), fleet(D, 1, max_running_requests=8))
    assert [s["gaps"] != [] for s in plan["states"]] == [False, False, True]


def test_input_shapes():
    as_dicts = dict((h, {"old": o, "new": n}) for h, (o, n) in fleet(P, 2, max_running_requests=8).items())
    as_list = [(h, o, n) for h, (o, n) in fleet(D, 2).items()] + [("d9", None, D)]
    plan = pd.rollout_order(as_dicts, as_list)
    assert plan["order"] == "rolling" and [s["hosts"] for s in plan["steps"]][-1] == ["d9"]
    with pytest.raises(ValueError, match="decode host d0: no new args given"):
        pd.rollout_order(as_dicts, {"d0": (D, None)})


# =============================================================================
# check_pair's verdicts against the fake server
# =============================================================================
@pytest.fixture
def pair(tmp_path):
    registry = ProcessRegistry()
    node = GpuNode(tmp_path / "gpusim", gpus=2)
    model = make_model(tmp_path / "models" / "qwen", dict(
        architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=3584, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, intermediate_size=18944, vocab_size=152064,
        torch_dtype="bfloat16"))
    servers = []

    def _start(prefill_args, decode_args):
        boot = free_port()
        env = dict(FAST_SERVER_ENV, SGLANG_SIM_PD_BOOTSTRAP_TIMEOUT_S="1")
        argv = ["--model-path", model]
        p = Server(registry, node, tmp_path / "prefill.log", argv + ["--disaggregation-bootstrap-port", str(boot)]
                   + prefill_args, env=dict(env, CUDA_VISIBLE_DEVICES="0"))
        d = Server(registry, node, tmp_path / "decode.log", argv + decode_args, env=dict(env, CUDA_VISIBLE_DEVICES="1"))
        servers.extend([p, d])
        p.wait_healthy()
        d.wait_healthy()
        return p, d, boot

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


def through_both(prefill, decode, boot):
    """One request the way a PD router sends it; the outcome as check_pair names it."""
    body = {"text": "hello", "sampling_params": {"max_new_tokens": 8}, "bootstrap_host": "127.0.0.1",
            "bootstrap_port": boot, "bootstrap_room": 77}
    out = {}

    def send(name, srv):
        try:
            # Hang budgets, not speed goals: under the CI's load (real SGLang servers beside it on 2 cores) one
            # simulated transfer was seen to take over 20 s.
            out[name] = srv.request("/generate", "POST", body, timeout=60).status
        except OSError:
            out[name] = None

    threads = [threading.Thread(target=send, args=(n, s)) for n, s in (("p", prefill), ("d", decode))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    if out.get("d") is None or decode.poll() is not None:
        try:
            decode.proc.wait(timeout=20)
        except Exception:
            pass
        if decode.poll() is not None:
            return "decode_crash"
    if out.get("d") == 200 and out.get("p") == 200:
        return "ok"
    return "request_fails" if out.get("d") == 500 else "other: %s" % out


def flag_args(args):
    argv = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        argv += [flag] if value is True else [flag, str(value)]
    return argv


@pytest.mark.parametrize("p_extra,d_extra", [
    ({}, {}),
    ({"page_size": 16}, {}),
    ({}, {"kv_cache_dtype": "fp8_e4m3"}),
    ({"kv_cache_dtype": "bfloat16"}, {}),
    ({"disaggregation_decode_allocation_policy": "prefill_complete"}, {}),
    ({}, {"disaggregation_transfer_backend": "nixl"}),
    ({}, {"disaggregation_enable_kv_checksum": True}),
], ids=["same", "page_size", "kv_dtype", "kv_dtype_auto_equals_model", "allocation_policy", "backend", "checksum"])
def test_verdicts_match_the_server(pair, p_extra, d_extra):
    p_args = dict({"disaggregation_mode": "prefill"}, **p_extra)
    d_args = dict({"disaggregation_mode": "decode"}, **d_extra)
    blocking = pd.blocking(pd.check_pair(p_args, d_args, model_dtype="bfloat16"))
    expected = blocking[0]["consequence"] if blocking else "ok"
    prefill, decode, boot = pair(flag_args(p_args), flag_args(d_args))
    assert through_both(prefill, decode, boot) == expected
