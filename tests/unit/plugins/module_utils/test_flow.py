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
    got = flow.layout("n1", server, host)
    assert got.pop("lease_acquire") == ("always" if expected["nnodes"] > 1 else "if_needed")
    assert got == expected


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


# ---------------------------------------------------------------------------
# Failures, rollback, the host's message
# ---------------------------------------------------------------------------

FAILED = {"failed": True}


@pytest.mark.parametrize("results,failed_result,task,multinode,step,needs", [
    # the teardown signalled nothing: nothing to roll back (issue 28 part 2)
    ({"replace": dict(FAILED, failed_step="teardown", reason="nothing_touched", touched=False)}, {"msg": "x"}, None,
     False, "teardown", False),
    # ... but a multi-node rank joins its group's rollback
    ({"replace": dict(FAILED, failed_step="teardown", reason="nothing_touched", touched=False)}, {"msg": "x"}, None,
     True, "teardown", True),
    # the teardown signalled, then failed
    ({"replace": dict(FAILED, failed_step="teardown", reason="teardown_failed", touched=True)}, {}, None, False,
     "teardown", True),
    # a candidate that failed and was rolled back in place: no second rollback
    ({"replace": dict(FAILED, failed_step="launch", touched=True, rollback={"status": "succeeded"})}, {}, None, False,
     "launch", False),
    ({"replace": {"touched": True}, "smoke": FAILED}, {}, None, False, "smoke", True),
    ({"replace": {"touched": True}, "promote": dict(FAILED, failed_step="smoke")}, {}, None, False, "smoke", True),
    ({"replace": {"touched": True}, "promote": FAILED}, {}, None, False, "promote", False),
    ({"replace": {"touched": True}, "router_add": FAILED}, {}, None, False, "router add", False),
    ({"router_drain": FAILED}, {}, None, False, "router drain", False),
    ({"router_remove": FAILED, "replace": None}, {}, None, False, "router drain", False),
    # another rank failed a checkpoint: the code, not the message, says so
    ({"replace": {"touched": False}}, {"reason": "group_failed", "failed_step": "launch (another rank failed)"}, None,
     True, "launch (another rank failed)", True),
    ({}, {"msg": "boom"}, "Some task", False, "Some task", False),
    ({}, {}, None, False, "unknown", False),
])
def test_failure(results, failed_result, task, multinode, step, needs):
    got = flow.failure(results, failed_result, task, multinode)
    assert got["step"] == step and got["needs_rollback"] is needs and got["before_lease"] is False


def test_failure_never_reads_the_message():
    text = "Another rank of this multi-node server failed before the launch checkpoint"
    assert flow.failure({}, {"msg": text}, "Fail together")["step"] == "Fail together"


def test_early_failure_keeps_the_failure_under_the_lease():
    previous = {"step": "router add", "message": "m", "reason": "", "needs_rollback": False, "changed": False}
    assert flow.early_failure(previous, {"msg": "Redeploy of n failed"}) == {
        "step": "router add", "message": "m", "reason": "", "needs_rollback": False, "before_lease": False}
    got = flow.early_failure(None, {"msg": "refused", "failed_step": "preflight (another rank failed)"})
    assert got["step"] == "preflight (another rank failed)" and got["before_lease"] is True
    assert flow.early_failure({}, {})["step"] == "preflight"


def test_group_barrier():
    assert flow.group_barrier("launch", []) is None
    got = flow.group_barrier("preflight", ["n2", "n3"])
    assert got["failed"] and got["reason"] == "group_failed" and got["failed_step"] == "preflight (another rank failed)"
    assert got["msg"].endswith("(n2, n3); the whole group fails; nothing was touched.")
    assert flow.group_barrier("smoke", ["n1"])["msg"].endswith("the whole group fails and rolls back as one server.")


def test_rollback_status_and_classification():
    assert flow.rollback_of("succeeded", "ok", {"rollback": {"status": "failed"}}) == {"status": "succeeded", "detail": "ok"}
    assert flow.rollback_of(None, None, {"rollback": {"status": "failed", "detail": "d"}}) == {"status": "failed", "detail": "d"}
    assert flow.rollback_of("", None, None) == {"status": "", "detail": ""}
    assert flow.rollback_failed({"msg": "there is no known-good config", "reason": "no_known_good"})["status"] == "unavailable"
    # the words alone do not make it unavailable: only the code does
    assert flow.rollback_failed({"msg": "there is no known-good config"})["status"] == "failed"
    got = flow.rollback_failed({"msg": "drain refused", "failed_step": "teardown"})
    assert got["status"] == "failed" and got["detail"].startswith("the teardown before the relaunch failed")
    assert flow.journal_outcome({"status": "succeeded"}) == "rolled_back"
    assert flow.journal_outcome({"status": "unavailable"}) == "failed"


@pytest.mark.parametrize("fail,rollback,replace,multinode,tail", [
    ({"step": "launch", "message": "crashed."}, {"status": "succeeded", "detail": "known-good PID 5 healthy."}, {}, False,
     "Rollback succeeded: known-good PID 5 healthy."),
    ({"step": "teardown", "message": "x", "reason": "nothing_touched"}, {}, {}, False, "No rollback: nothing was touched."),
    ({"step": "teardown", "message": "x", "reason": "nothing_touched"}, {}, {}, True,
     "Nothing was torn down; the old server still serves."),
    ({"step": "promote", "message": "x"}, {}, {"touched": True}, False, "No rollback ran: the verified server keeps running."),
    ({"step": "smoke", "message": "x"}, {}, {}, False, "No rollback ran."),
])
def test_outcome_line(fail, rollback, replace, multinode, tail):
    line = flow.outcome_line("node1", fail, rollback, replace, multinode)
    assert line.startswith("Redeploy of node1 failed: %s failed: " % fail["step"]) and line.endswith(tail)
    assert ".." not in line


# ---------------------------------------------------------------------------
# The report row
# ---------------------------------------------------------------------------

PREFLIGHT = {"plan": {"action": "restart", "why": "config changed", "teardown_pids": [11], "holders": [{"pid": 11}],
                      "running_args": {"tp_size": 2, "api_key": "sk-0"}},
             "resolved": {"source": "node", "args": {"tp_size": 1}, "effective": {"tp_size": 1, "api_key": "sk-1"},
                          "adjustments": [{"arg": "x"}]},
             "node": {"gpus": [{"index": 0, "used_mib": 7}]}, "lease": {"waited": 2, "took_over": {"owner": "r0"}}}


def _row(**v):
    base = {"host": "n1", "run_id": "r1", "check_mode": False, "preflight": PREFLIGHT, "action": "restart"}
    base.update(v)
    return flow.report_row(base, lambda d: dict((k, "MASKED" if "key" in k else x) for k, x in d.items()))


def test_report_row_of_a_deployed_host():
    replace = {"launch": {"pid": 9, "startup_s": 3.5, "effective_args": {"tp_size": 1, "api_key": "k"}, "overrides": []},
               "signalled": [{"pid": 11, "signals": ["SIGTERM"]}, {"pid": 12, "signals": []}],
               "gpus_allocated": [{"index": 0}], "node_state": "candidate running", "details_file": "/s/details/r1.json"}
    row = _row(replace=replace, promote={"promoted": True, "smoke": {"tokens_per_s": 90.0, "accept_length": 2.9}})
    assert row["status"] == "deployed" and row["step"] == "done" and row["error"] is None
    assert row["mode"] == "restart" and row["plan"] == "restart" and row["plan_why"] == "config changed"
    assert row["effective_args"] == {"tp_size": 1, "api_key": "MASKED"} and row["effective_source"] == "server"
    assert row["predicted_args"]["api_key"] == "MASKED"
    # Only what was really signalled; the child that exited with its server is listed apart.
    assert row["signalled"] == [{"pid": 11, "signals": ["SIGTERM"]}] and row["exited"] == [{"pid": 12, "signals": []}]
    assert row["candidate_pid"] == 9 and row["startup_s"] == 3.5
    # The config it replaced (masked) and where the full module result is on the node.
    assert row["previous_args"] == {"tp_size": 2, "api_key": "MASKED"}
    assert row["details_files"] == ["/s/details/r1.json"]
    assert row["smoke"] == {"tokens_per_s": 90.0, "accept_length": 2.9}
    assert row["rollback"] == {"status": "not_needed", "detail": None}
    assert row["lease"] == {"waited_s": 2, "waited_for": None, "took_over": "r0", "took_over_reason": None}
    assert row["node_state"] == "promoted config running" and row["planned_teardown"] == []


def test_report_row_of_a_rolled_back_host_counts_both_runs():
    candidate = {"signalled": [{"pid": 11, "signals": ["SIGTERM"]}, {"pid": 13}], "launch": {"pid": 9},
                 "details_file": "/s/c.json"}
    rollback_run = {"signalled": [{"pid": 9, "signals": ["SIGTERM", "SIGKILL"]}], "launch": {"pid": 12, "effective_args": {"tp_size": 1}},
                    "node_state": "known-good running", "details_file": "/s/k.json"}
    fail = {"step": "launch", "message": "crashed", "reason": "launch_failed", "needs_rollback": True}
    row = _row(failure=fail, replace=rollback_run, candidate_replace=candidate, rollback_status="succeeded",
               rollback_detail="known-good PID 12 healthy")
    assert row["status"] == "rolled_back" and row["step"] == "launch" and row["error"] == "launch failed: crashed"
    assert [s["pid"] for s in row["signalled"]] == [11, 9] and row["candidate_pid"] == 9
    assert [s["pid"] for s in row["exited"]] == [13] and row["details_files"] == ["/s/c.json", "/s/k.json"]
    assert row["rollback"] == {"status": "succeeded", "detail": "known-good PID 12 healthy"}
    assert row["node_state"] == "known-good running"


def test_report_row_of_an_unchanged_and_of_a_refused_host():
    row = _row(action="none")
    assert row["status"] == "unchanged" and row["mode"] is None
    assert row["node_state"] == "promoted config running (nothing to do)"
    refused = _row(preflight=None, action="none", failure={"step": "preflight", "message": "tp_size: -1"})
    assert refused["status"] == "failed" and refused["step"] == "preflight" and refused["plan"] is None
    assert refused["effective_source"] == "prediction"


def test_check_mode_reports_planned_or_failed():
    planned = _row(check_mode=True)
    assert planned["status"] == "planned" and planned["planned_teardown"] == [11]
    # a host that fails in check mode is failed, not planned (issue 25)
    failed = _row(check_mode=True, preflight=None, failure={"step": "preflight", "message": "refused"})
    assert failed["status"] == "failed"


def test_result_line():
    row = _row(action="none")
    assert flow.result_line(row, "/r/x.json") == ("n1: unchanged (step done; smoke None tok/s, accept length None; "
                                                  "rollback not_needed); report /r/x.json")
