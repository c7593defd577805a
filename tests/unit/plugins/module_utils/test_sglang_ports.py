"""The ports an SGLang server binds (plugins/module_utils/sglang/ports.py), from its resolved args."""
from __future__ import annotations

from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import ports


def _ports(args, node_rank=0):
    return [p["port"] for p in ports.bound_ports(args, node_rank)]


def test_a_plain_server_binds_its_http_port_only():
    assert _ports({}) == [30000]
    assert _ports({"port": 31000}) == [31000]


def test_attention_dp_on_one_node_binds_from_port_plus_233():
    got = _ports({"port": 30000, "enable_dp_attention": True, "dp_size": 2})
    assert got == [30000, 30234, 30235, 30236, 30238]
    assert _ports({"port": 30000, "attn_dp_size": 2}) == got      # 0.5.23's resolved form


def test_multi_node_rank0_binds_the_store_and_the_extra_ports():
    args = {"port": 30000, "nnodes": 2, "dist_init_addr": "10.0.0.1:5000", "enable_dp_attention": True}
    assert _ports(dict(args, node_rank=0)) == [5000, 5001, 5002, 5003, 5005, 5006, 5013, 30000]
    assert 5000 not in _ports(dict(args, node_rank=1))


def test_nccl_port_when_given():
    assert _ports({"nccl_port": 23456}) == [23456, 30000]


def test_a_prefill_server_binds_its_bootstrap_port():
    assert _ports({"disaggregation_mode": "prefill"}) == [8998, 30000]
    assert _ports({"disaggregation_mode": "prefill", "disaggregation_bootstrap_port": 9100, "port": 31000}) == [9100, 31000]
    assert _ports({"disaggregation_mode": "decode"}) == [30000]
    described = dict((p["port"], p["what"]) for p in ports.bound_ports({"disaggregation_mode": "prefill"}))
    assert "bootstrap" in described[8998]
