"""The redeploy flow's decisions (module_utils/redeploy/flow.py), table-tested."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import flow


@pytest.mark.parametrize("server,host,expected", [
    ({}, {}, {"group_key": "n1", "nnodes": 1, "rank": 0}),
    ({"tp_size": 8}, {"port": 1}, {"group_key": "n1", "nnodes": 1, "rank": 0}),
    ({"nnodes": 2, "dist_init_addr": "10.0.0.1:5000"}, {"node_rank": 1},
     {"group_key": "10.0.0.1:5000", "nnodes": 2, "rank": 1}),
    ({"nnodes": "2"}, {"node_rank": "1"}, {"group_key": "n1", "nnodes": 2, "rank": 1}),   # no address: alone
    ({"nnodes": 1, "dist_init_addr": "x:1"}, {}, {"group_key": "n1", "nnodes": 1, "rank": 0}),
    ("not a mapping", ["nor this"], {"group_key": "n1", "nnodes": 1, "rank": 0}),
    ({"nnodes": "two"}, {}, {"group_key": "n1", "nnodes": 1, "rank": 0}),
])
def test_layout(server, host, expected):
    assert flow.layout("n1", server, host) == expected


def test_host_args_win_over_server_args():
    assert flow.merged_args({"a": 1, "b": 2}, {"b": 3}) == {"a": 1, "b": 3}


def test_members_keep_play_order_and_single_hosts_are_alone():
    keys = {"a": "g", "b": "h", "c": "g", "d": "g"}
    assert flow.members("c", 3, "g", ["a", "b", "c", "d"], keys) == ["a", "c", "d"]
    assert flow.members("b", 1, "h", ["a", "b", "c", "d"], keys) == ["b"]


def test_batch_problem():
    group, ranks = ["a", "c"], {"a": 0, "c": 1}
    assert flow.batch_problem("a", 0, 2, "g", group, ["a", "c", "x"], ranks) is None
    assert flow.batch_problem("x", 0, 1, "x", ["x"], ["x"], {"x": 0}) is None
    text = flow.batch_problem("a", 0, 2, "g:1", group, ["a"], ranks)
    assert text.startswith("a is node rank 0 of a 2-node server (dist_init_addr g:1), but this batch holds node rank(s) 0")
    assert "(a)" in text and text.endswith("Nothing was touched.")
    # two hosts claim the same rank: still refused
    assert flow.batch_problem("a", 0, 2, "g", group, ["a", "c"], {"a": 0, "c": 0})


@pytest.mark.parametrize("actions,multinode,expected", [
    ([], False, "none"),
    (["none"], False, "none"),
    ([None], False, "none"),
    (["verify"], False, "verify"),
    (["weights"], False, "weights"),
    (["restart"], False, "restart"),
    (["start"], False, "start"),
    (["none", "none"], True, "none"),
    (["weights", "weights"], True, "weights"),
    (["weights", "none"], True, "restart"),        # a group swaps weights only when every rank does
    (["verify", "none"], True, "verify"),
    (["verify", "verify"], True, "verify"),
    (["verify", "start"], True, "restart"),
    (["none", "start"], True, "restart"),
    (["weights", "restart"], True, "restart"),
])
def test_group_action(actions, multinode, expected):
    assert flow.group_action(actions, multinode) == expected
    assert expected in flow.ACTIONS


def test_pd_hosts_take_the_resolved_args_and_the_running_ones():
    hosts = [
        ("p1", {"disaggregation_mode": "prefill"}, {"resolved": {"args": {"disaggregation_mode": "prefill", "tp_size": 2}},
                                                    "plan": {"running_args": {"tp_size": 1}}}),
        ("d1", {"disaggregation_mode": "decode"}, {}),                       # not in this batch: its inventory args
        ("plain", {"tp_size": 8}, {"resolved": {"args": {"tp_size": 8}}}),
        ("odd", {"disaggregation_mode": "null"}, None),
    ]
    assert flow.pd_hosts(hosts) == [
        {"host": "p1", "role": "prefill", "new": {"disaggregation_mode": "prefill", "tp_size": 2}, "old": {"tp_size": 1}},
        {"host": "d1", "role": "decode", "new": {"disaggregation_mode": "decode"}, "old": None},
    ]


def test_pd_plan_lines():
    plan = {"order": "rolling", "pair_mode": None, "why": "compatible", "notes": ["n"],
            "steps": [{"step": 1, "action": "replace", "role": "decode", "hosts": ["d1", "d2"]}]}
    assert flow.pd_plan_lines(plan) == ["prefill/decode rollout: rolling: compatible",
                                        "step 1: replace decode d1, d2", "note: n"]
    assert flow.pd_plan_lines(dict(plan, pair_mode="stop_both", steps=[], notes=[]))[0].endswith("(stop_both): compatible")
