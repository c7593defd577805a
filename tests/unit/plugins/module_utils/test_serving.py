# -*- coding: utf-8 -*-
"""sglang/serving.py: the values SGLang's resolution accepts and a server cannot serve, each rule tested just
inside and just outside its range, after the resolution of two SGLang versions (the mirror's)."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import resolve
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import serving

VERSIONS = ("0.5.10", "0.5.23")
EIGHT = [str(i) for i in range(8)]


def full_check(args, version, gpus=None, node_gpus=8, nnodes=None, arch="LlamaForCausalLM"):
    """What the preflight runs: the values as given, then the layout of the resolved args."""
    problems = serving.check_values(args)
    if problems:
        return problems
    resolved = resolve.resolve(dict(args, model_path="/models/m"), version=version, arch=arch)
    assert not resolved["errors"], resolved["errors"]
    if gpus is None:
        gpus = [str(i) for i in range(serving.gpus_per_node(args, nnodes)[1])]
    return serving.check_layout(resolved["args"], gpus, node_gpu_count=node_gpus, nnodes=nnodes, gpu_memory_mib=143771)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("field", ["tp_size", "pp_size", "dp_size", "ep_size", "nnodes", "speculative_num_steps",
                                   "speculative_eagle_topk", "speculative_num_draft_tokens", "gpu_id_step"])
def test_sizes_at_one_pass_and_below_are_refused(field, version):
    assert full_check({field: 1}, version) == []
    for bad in (0, -1, "-1", 1.5, "two", True):
        problems = full_check({field: bad}, version)
        assert len(problems) == 1, (bad, problems)
        assert problems[0].startswith("args.%s: must be an integer >= 1, got %r" % (field, bad))
        assert "set a positive integer" in problems[0]


@pytest.mark.parametrize("value", [2, 2.0, "2", " 2 "])
def test_numbers_as_ansible_passes_them(value):
    assert serving.check_values({"tp_size": value}) == []


@pytest.mark.parametrize("version", VERSIONS)
def test_node_rank_and_base_gpu_id_start_at_zero(version):
    assert full_check({"base_gpu_id": 0}, version) == []
    assert full_check({"node_rank": -1}, version)[0].startswith("args.node_rank: must be an integer >= 0, got -1")
    assert full_check({"base_gpu_id": -1}, version)[0].startswith("args.base_gpu_id: must be an integer >= 0")


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("value,ok", [(0.01, True), (0.99, True), ("0.88", True), (0, False), (1, False), (1.0, False),
                                      (1.5, False), (-0.1, False), ("lots", False), (float("nan"), False)])
def test_mem_fraction_static_is_an_open_fraction(value, ok, version):
    problems = full_check({"mem_fraction_static": value}, version)
    if ok:
        assert problems == []
    else:
        assert len(problems) == 1
        assert problems[0].startswith("args.mem_fraction_static: must be a fraction between 0 and 1")
        assert "typical values are 0.8 to 0.9" in problems[0]


@pytest.mark.parametrize("version", VERSIONS)
def test_ports_in_range_and_distinct(version):
    assert full_check({"port": 1}, version) == []
    assert full_check({"port": 65535}, version) == []
    for bad in (0, 65536, -5, "http"):
        assert full_check({"port": bad}, version)[0].startswith("args.port: must be a TCP port between 1 and 65535")
    problems = full_check({"port": 30000, "nccl_port": 30000}, version)
    assert problems == ["args.port and args.nccl_port: all use port 30000; the second bind "
                        "fails with \"Address already in use\" at launch; give each its own port"]
    assert full_check({"port": 30000, "nccl_port": 30001}, version) == []


@pytest.mark.parametrize("version", VERSIONS)
def test_layout_against_the_node_gpu_count(version):
    # 8 GPUs on the node: tp 8 fits, tp 16 on one node does not; tp 16 over two nodes does.
    assert full_check({"tp_size": 8}, version) == []
    problems = full_check({"tp_size": 16}, version, gpus=[str(i) for i in range(16)])
    assert len(problems) == 1
    assert problems[0].startswith("args.tp_size: the layout needs 16 GPU(s) per node (tp_size 16 x pp_size 1)")
    assert "this node has 8 GPU(s), 143771 MiB each" in problems[0]
    assert full_check({"tp_size": 16, "nnodes": 2, "node_rank": 1, "dist_init_addr": "10.0.0.1:5000"}, version, nnodes=2) == []
    # tp 4 x pp 2 = 8 fits; tp 4 x pp 4 = 16 does not.
    assert full_check({"tp_size": 4, "pp_size": 2}, version) == []
    assert "needs 16 GPU(s) per node" in full_check({"tp_size": 4, "pp_size": 4}, version, gpus=EIGHT * 2)[0]


@pytest.mark.parametrize("version", VERSIONS)
def test_node_rank_within_the_group(version):
    args = {"tp_size": 16, "nnodes": 2, "dist_init_addr": "10.0.0.1:5000"}
    assert full_check(dict(args, node_rank=1), version, nnodes=2) == []
    problems = full_check(dict(args, node_rank=2), version, nnodes=2)
    assert problems == ["args.node_rank: 2 is not a rank of a 2-node server (ranks 0 to 1); set node_rank "
                        "per host in host_args"]


def test_tp_pp_must_split_over_the_nodes():
    # SGLang asserts it too (check_server_args), so the resolution may stop first; the check itself:
    assert serving.check_layout({"tp_size": 4, "nnodes": 2}, ["0", "1"], node_gpu_count=8) == []
    problems = serving.check_layout({"tp_size": 3, "nnodes": 2}, ["0"], node_gpu_count=8)
    assert problems[0].startswith("args.tp_size: tp_size 3 x pp_size 1 does not split over 2 nodes")


def test_attention_dp_width_divides_tp():
    assert serving.check_layout({"tp_size": 8, "dp_size": 4, "enable_dp_attention": True}, EIGHT, node_gpu_count=8) == []
    problems = serving.check_layout({"tp_size": 8, "dp_size": 3, "enable_dp_attention": True}, EIGHT, node_gpu_count=8)
    assert problems == ["args.dp_size: the attention-DP width 3 does not divide tp_size 8; SGLang asserts "
                        "tp_size % dp == 0 at startup; use a width that divides tp_size"]
    assert "attn_dp_size: the attention-DP width 3" in serving.check_layout(
        {"tp_size": 8, "attn_dp_size": 3}, EIGHT, node_gpu_count=8)[0]


def test_moe_dense_tp_size_is_one_or_tp():
    for ok in (None, 1, 8):
        assert serving.check_layout({"tp_size": 8, "moe_dense_tp_size": ok}, EIGHT, node_gpu_count=8) == []
    problems = serving.check_layout({"tp_size": 8, "moe_dense_tp_size": 2}, EIGHT, node_gpu_count=8)
    assert problems == ["args.moe_dense_tp_size: must be 1 or tp_size (8), got 2; SGLang supports only those"]


def test_base_gpu_id_within_the_visible_gpus():
    assert serving.check_layout({"tp_size": 2, "base_gpu_id": 0}, ["4", "5"], node_gpu_count=8) == []
    problems = serving.check_layout({"tp_size": 2, "base_gpu_id": 1}, ["4", "5"], node_gpu_count=8)
    assert problems[0].startswith("args.base_gpu_id/gpu_id_step: the server would use GPU indices 1 to 2 of "
                                  "CUDA_VISIBLE_DEVICES, which lists 2 GPU(s) (4,5)")
    assert serving.check_layout({"tp_size": 2, "gpu_id_step": 2}, ["0", "1", "2"], node_gpu_count=8) == []
    assert serving.check_layout({"tp_size": 2, "gpu_id_step": 2}, ["0", "1"], node_gpu_count=8)


@pytest.mark.parametrize("version", VERSIONS)
def test_eagle_needs_a_draft_model_unless_the_model_has_an_mtp_head(version):
    spec = {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 1, "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": 2}
    problems = full_check(spec, version)
    assert len(problems) == 1
    assert problems[0].startswith("args.speculative_draft_model_path: speculative_algorithm EAGLE3 needs a "
                                  "draft model")
    assert full_check(dict(spec, speculative_draft_model_path="/models/draft"), version) == []
    # DeepSeek-V3 has an MTP head: SGLang fills the draft path in with the model path, and so does the resolution.
    assert full_check(dict(spec, speculative_algorithm="EAGLE"), version, arch="DeepseekV3ForCausalLM") == []
    # Unknown architecture: the check cannot tell, and stays silent.
    assert serving.check_layout({"speculative_algorithm": "EAGLE3"}, ["0"], arch_known=False) == []


@pytest.mark.parametrize("args,nnodes,expected", [
    ({}, None, (1, 1)), ({"tp_size": 8}, None, (8, 8)), ({"tp_size": 4, "pp_size": 2}, None, (8, 8)),
    ({"tp_size": 2, "dp_size": 2}, None, (4, 4)), ({"tp_size": 4, "dp_size": 4, "enable_dp_attention": True}, None, (4, 4)),
    ({"tp_size": 8, "attn_dp_size": 2}, None, (8, 8)), ({"tp_size": 16, "nnodes": 2}, None, (16, 8)),
    ({"tp_size": 16}, 2, (16, 8)), ({"tp_size": 16, "nnodes": 0}, None, (16, 16)),
])
def test_gpus_per_node(args, nnodes, expected):
    assert serving.gpus_per_node(args, nnodes) == expected
