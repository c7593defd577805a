"""A multi-node (tensor-parallel across nodes) SGLang server redeployed by
``playbooks/redeploy.yml`` as one unit, on localhost with two simulated nodes.

Two inventory hosts, ``rank0`` and ``rank1`` (``ansible_connection: local``),
each a :class:`playbook_helpers.SimNode` of its own: its own ``GPUSIM_ROOT``
(through ``sglang_node_environment`` and the server's ``sglang_server_env``),
config/state/log/lock directories and HTTP port. They share
``sglang_server_args`` with ``nnodes: 2``, ``tp_size: 2`` (one GPU per node)
and ``dist_init_addr: 127.0.0.1:<free port>``; ``sglang_server_host_args``
gives each its ``node_rank`` and ``port``. ``sglang_serial: '100%'`` puts both
ranks in one batch. The fake SGLang server does the rendezvous
(``simulator/python/sglang/srt/entrypoints/dist.py``): rank 0 serves only once
rank 1 has joined; rank 1 ignores SIGTERM until rank 0's ShutdownReq
broadcast.

The tests share the two nodes and run in file order: a fresh deploy, a
redeploy with a changed config (rank 0 torn down first), a no-op run, a run
whose batches would split the group (refused before anything is touched), a rank 1
whose new server crashes while loading (both ranks fail at the launch and roll
back together), and a rank 0 whose new server crashes after rank 1 joined
(rank 1 fails at the group barrier, and its orphaned candidate, which ignores
SIGTERM, is killed in the rollback). Each scenario starts from the state the
previous one should leave and restores it (a forced redeploy) when it does not.
Processes are cleaned up by PID (the role's PID files and every PID the tests
saw), never by name.

Every rank's server env has SGLANG_SIM_DIST_TIMEOUT_S (rank 0 gives up on a
missing rank after 15 s instead of 600) and the fast knobs of
``playbook_helpers.FAST_SERVER_ENV``.
"""
from __future__ import annotations

import json

import pytest

from playbook_helpers import (INCIDENT_SPEC, RESOLVED_SPEC, SimNode, alive, environ_of,  # noqa: F401  # pylint: disable=unused-import
                              free_port, http_get, module_procs, session_members)

pytestmark = pytest.mark.slow

RANK0, RANK1 = "rank0", "rank1"
HOSTS = (RANK0, RANK1)
GROUP_FAIL_TASK = "Fail together with the other ranks of this multi-node server (%s)"
PREFLIGHT = "Plan the redeploy (inspect the node, resolve the args as its SGLang will, take the lease)"
TEARDOWN_TASK = "Replace the server in one module run, candidate teardown"
LAUNCH_TASK = "Replace the server in one module run, candidate launch"
ROLLBACK_TEARDOWN = "Replace the server in one module run, known_good teardown"
ROLLBACK_LAUNCH = "Replace the server in one module run, known_good launch"
# Rank 0 gives up waiting for the other ranks after this long (the fake server's
# SGLANG_SIM_DIST_TIMEOUT_S), so a crashed rank 1 costs seconds, not ten minutes.
DIST_TIMEOUT_S = "15"


# --------------------------------------------------------------------------
# Fixtures and helpers
# --------------------------------------------------------------------------

class Group(object):
    """Two simulated nodes that run one multi-node server."""

    def __init__(self, base, procs):
        self.procs = procs
        # gpus=2: the server uses GPU 0 of each node; GPU 1 must stay idle.
        self.nodes = {RANK0: SimNode(base / RANK0, procs, gpus=2, tp_size=2, name="mn"),
                      RANK1: SimNode(base / RANK1, procs, gpus=2, tp_size=2, name="mn")}
        self.dist_port = free_port()
        self.dist_init_addr = "127.0.0.1:%d" % self.dist_port
        self.api_key = self.nodes[RANK0].api_key

    def __getitem__(self, host):
        return self.nodes[host]

    def shared_args(self, **overrides):
        n0 = self.nodes[RANK0]
        args = dict(INCIDENT_SPEC, model_path=str(n0.target), speculative_draft_model_path=str(n0.draft),
                    tp_size=2, nnodes=2, dist_init_addr=self.dist_init_addr, host="127.0.0.1")
        args.update(overrides)
        return {k: v for k, v in args.items() if v is not None}

    def host_vars(self, host, args=None, server_env=None, **overrides):
        node = self.nodes[host]
        env = {"SGLANG_SIM_DIST_TIMEOUT_S": DIST_TIMEOUT_S}
        env.update(server_env or {})
        hv = node.host_vars(server_env=env)
        hv.update({
            "sglang_server_args": args if args is not None else self.shared_args(),
            "sglang_server_host_args": {"node_rank": HOSTS.index(host), "port": node.port},
            "sglang_server_api_key": self.api_key,
            "sglang_report_dir": str(self.nodes[RANK0].reports),
            "sglang_server_health_timeout": 45,
            "gpu_teardown_term_timeout": 8,
            "gpu_teardown_kill_timeout": 8,
        })
        hv.update(overrides)
        return hv

    def run(self, vars_by_host=None, extravars=None):
        vars_by_host = vars_by_host or {}
        hosts = {h: vars_by_host.get(h) or self.host_vars(h) for h in HOSTS}
        ev = {"sglang_serial": "100%"}
        ev.update(extravars or {})
        run = self.nodes[RANK0].run(hosts=hosts, extravars=ev)
        for node in self.nodes.values():
            self.procs.track_pid_file(node.pid_file)
        return run

    # -- the running server ----------------------------------------------------
    def pids(self):
        return {h: n.server_pid() for h, n in self.nodes.items()}

    def info(self):
        n0 = self.nodes[RANK0]
        status, info = http_get(n0.url + "/server_info", api_key=self.api_key)
        assert status == 200, (status, info)
        return info

    def used(self):
        return {h: n.used() for h, n in self.nodes.items()}


@pytest.fixture(scope="module")
def group(tmp_path_factory, procs):
    return Group(tmp_path_factory.mktemp("multinode"), procs)


def assert_group_running(group, spec=None):
    """Both ranks run (PID files name live processes), rank 0 serves the resolved config with nnodes 2
    (``spec``, default RESOLVED_SPEC), and each node holds memory on GPU 0 only."""
    spec = RESOLVED_SPEC if spec is None else spec
    pids = group.pids()
    for host, pid in pids.items():
        assert pid and alive(pid), "%s: no live server (pid file says %s)" % (host, pid)
    assert group[RANK1].health() == 200          # rank 1's minimal health server
    info = group.info()
    assert info["nnodes"] == 2 and info["node_rank"] == 0 and info["tp_size"] == 2, info
    assert info["dist_init_addr"] == group.dist_init_addr
    assert {k: info[k] for k in spec} == spec, info
    for host, used in group.used().items():
        assert used[0] > 100000 and used[1] == 1, "%s: GPU 0 should hold the server, GPU 1 be idle: %s" % (host, used)
    return pids


def report_row(run, host):
    rows = [r for r in run.report if r.get("host") == host]
    assert len(rows) == 1, (host, run.report)
    return rows[0]


def ok_events(run, task, host):
    return run.task_events(task, ("runner_on_ok",), host)


def drain_events(run, host):
    """``runner_on_ok`` events of the teardown phases (sglang_replace, the drain inside) on ``host``, in order."""
    return [e for e in run.results(("runner_on_ok", "runner_on_failed"))
            if e["event_data"].get("task") in (TEARDOWN_TASK, ROLLBACK_TEARDOWN) and e["event_data"].get("host") == host]


def drain_result(event):
    res = event["event_data"].get("res") or {}
    drain = dict(res.get("drain") or {})
    # At verbosity 0 the drain leaves out its signalled list when it is the result's own (lean results): the same list.
    if "signalled" not in drain and "signalled" in res:
        drain["signalled"] = res["signalled"]
    return drain


def signals_sent(drain_res):
    return sorted(set(sig for p in drain_res.get("signalled", []) for sig in p.get("signals", [])))


CHANGED = {"chunked_prefill_size": 4096}     # the config change of the redeploy scenario


def changed_vars(**server_env):
    """Host variables of the changed config; ``server_env``: ``{host: extra sglang_server_env}``."""
    return lambda group: {h: group.host_vars(h, args=group.shared_args(**CHANGED), server_env=server_env.get(h))
                          for h in HOSTS}


def ensure_changed_config(group):
    """The group runs the changed config (redeployed, forced, when an earlier test left it otherwise)."""
    try:
        pids = assert_group_running(group, dict(RESOLVED_SPEC, **CHANGED))
        if not any("SGLANG_SIM_CRASH" in environ_of(p) for p in pids.values()):
            return pids
    except AssertionError:
        pass
    run = group.run(changed_vars()(group), extravars={"sglang_redeploy_force": True})
    assert run.rc == 0, run.summary()
    return assert_group_running(group, dict(RESOLVED_SPEC, **CHANGED))


def assert_group_rolled_back(run, group, old_pids, steps, messages):
    """Both ranks failed (at ``steps[host]``, with ``messages[host]`` in the error), rolled back, and run the
    changed config again (new PIDs)."""
    assert run.rc != 0, run.summary()
    for host in HOSTS:
        assert run.host_stats(host)["failures"] == 1, (host, run.host_stats(host))
        row = report_row(run, host)
        assert row["status"] == "rolled_back" and row["step"] == steps[host], (
            row["status"], row["step"], row["rollback"], row["error"],
            [(h, t, (r.get("msg") or r.get("node_state"))[-300:], r.get("timings")) for h in HOSTS
             for t in (ROLLBACK_TEARDOWN, ROLLBACK_LAUNCH) for r in run.task_results(t, host=h)])
        assert row["rollback"]["status"] == "succeeded", row["rollback"]
        assert messages[host] in row["error"], (host, row["error"])
        fail = run.task_result("Fail the host", host=host)
        assert fail["failed"] and "Rollback succeeded" in fail["msg"], fail
        assert group[host].journal()["step"] == "rolled_back", (host, group[host].journal())
    pids = assert_group_running(group, dict(RESOLVED_SPEC, **CHANGED))
    for host, pid in pids.items():
        assert pid != old_pids[host] and not alive(old_pids[host]), (host, pid, old_pids)
        env = environ_of(pid).split("\0")
        assert not any(e.startswith("SGLANG_SIM_CRASH") for e in env), (host, [e for e in env if "SIM" in e])
        known_good = json.loads((group[host].etc / "known-good" / "server.json").read_text())
        assert known_good["args"]["chunked_prefill_size"] == 4096 and "SGLANG_SIM_CRASH_ON_LOAD" not in known_good["env"]
    return pids


# --------------------------------------------------------------------------
# Scenarios
# --------------------------------------------------------------------------

def test_fresh_deploy_of_a_two_node_group(group):
    run = group.run()
    assert run.rc == 0, run.summary()
    for host in HOSTS:
        assert run.host_stats(host)["failures"] == 0, (host, run.host_stats(host))
        row = report_row(run, host)
        assert row["status"] == "deployed" and row["step"] == "done" and row["error"] is None, row
        assert [g["index"] for g in row["gpus_after"]] == [0], row["gpus_after"]
    pids = assert_group_running(group)
    info = group.info()
    assert info["speculative_algorithm"] == "EAGLE3" and info["speculative_num_steps"] == 15
    assert info["speculative_num_draft_tokens"] == 16

    # Health, effective config and smoke are judged on rank 0; rank 1 only has to be healthy.
    launch = {h: run.task_result(LAUNCH_TASK, host=h)["launch"] for h in HOSTS}
    assert launch[RANK0]["overrides"] == [] and launch[RANK0]["pid"] == pids[RANK0], launch[RANK0]
    assert launch[RANK1]["pid"] == pids[RANK1] and launch[RANK1]["url"].endswith(":%d" % group[RANK1].port)
    assert "overrides" not in launch[RANK1], launch[RANK1]      # no /server_info on a rank >= 1
    pre1 = run.task_result(PREFLIGHT, host=RANK1)["plan"]["argv"]
    assert "--node-rank" in pre1 and "--nnodes" in pre1
    assert run.task_result("Run the smoke benchmark", host=RANK0)["accept_length"] >= 2.0
    assert not run.ran("Run the smoke benchmark", host=RANK1)
    for host in HOSTS:
        assert run.task_result(PREFLIGHT, host=host)["lease"]["acquired"] is True     # every rank took its lease
        assert not group[host].lock_path.exists(), host                                 # and gave it back

    # Rank 1's server is the follower: schedulers for global TP rank 1, no detokenizer (and multiprocessing's
    # resource_tracker, as every 0.5.23 main process has).
    titles = sorted(open("/proc/%d/cmdline" % p).read().strip("\0") for p in session_members(pids[RANK1])
                    if p != pids[RANK1])
    trackers = [t for t in titles if "from multiprocessing.resource_tracker import main" in t]
    assert len(trackers) == 1 and [t for t in titles if t not in trackers] == ["sglang::scheduler_TP1"], titles
    for host, pid in pids.items():
        assert group.api_key not in open("/proc/%d/cmdline" % pid).read(), host
        known_good = json.loads((group[host].etc / "known-good" / "server.json").read_text())
        assert known_good["args"]["node_rank"] == HOSTS.index(host) and known_good["args"]["nnodes"] == 2


def test_redeploy_tears_down_rank_0_first(group):
    """A changed config: rank 0's teardown (its graceful shutdown broadcasts the ShutdownReq that stops
    rank 1) finishes before rank 1's starts, both ranks are verified free, then both relaunch."""
    pids = assert_group_running(group)
    run = group.run(changed_vars()(group))
    assert run.rc == 0, run.summary()
    for host in HOSTS:
        row = report_row(run, host)
        assert row["status"] == "deployed" and row["plan"] == "restart", row

    drains = {h: drain_events(run, h) for h in HOSTS}
    assert all(len(d) == 1 for d in drains.values()), drains
    d0, d1 = drains[RANK0][0], drains[RANK1][0]
    assert d0["counter"] < d1["counter"] and d0["event_data"]["end"] <= d1["event_data"]["start"], (
        d0["event_data"]["end"], d1["event_data"]["start"])
    # The task order itself: the rank-0 teardown ran (and was skipped on rank 1) before the other one.
    names = [e["event_data"]["task"] for e in run.events if e.get("event") == "playbook_on_task_start"]
    first = names.index("Tear down node rank 0")
    assert first < names.index("Tear down node ranks 1 and up")
    assert run.task_events("Tear down node rank 0", ("runner_on_skipped",), RANK1)
    assert run.task_events("Tear down node ranks 1 and up", ("runner_on_skipped",), RANK0)

    res0 = drain_result(d0)
    assert pids[RANK0] in [p["pid"] for p in res0["signalled"]] and signals_sent(res0) == ["SIGTERM"], res0
    # Rank 1 needed no SIGKILL: rank 0's shutdown broadcast stopped it (it ignores SIGTERM until then).
    assert "SIGKILL" not in signals_sent(drain_result(d1)), drain_result(d1)
    assert not alive(pids[RANK1])
    log1 = (group[RANK1].logs / "server.log").read_text(errors="replace")
    assert "lost without a ShutdownReq" not in log1

    for host in HOSTS:
        torn = run.task_result(TEARDOWN_TASK, host=host)
        assert not torn["failed"] and [g["index"] for g in torn["gpus_free"]] == [0], (host, torn)
    new = assert_group_running(group, dict(RESOLVED_SPEC, **CHANGED))
    assert all(new[h] != pids[h] and not alive(pids[h]) for h in HOSTS), (pids, new)


def test_a_second_run_is_a_no_op_for_both_ranks(group):
    pids = ensure_changed_config(group)
    run = group.run(changed_vars()(group))
    assert run.rc == 0, run.summary()
    for host in HOSTS:
        assert run.host_stats(host)["changed"] == 0, (host, run.host_stats(host))
        row = report_row(run, host)
        assert row["status"] == "unchanged" and row["plan"] == "none", row
        given_back = run.task_result("Give back the lease of a multi-node group with nothing to do", host=host)
        assert given_back["released"] is True and not group[host].lock_path.exists(), given_back   # taken by the group, given back
    assert not drain_events(run, RANK0) and not drain_events(run, RANK1)
    assert assert_group_running(group, dict(RESOLVED_SPEC, **CHANGED)) == pids


def test_a_group_split_over_batches_is_refused_before_anything_is_touched(group):
    """With serial 1 (the default; an inventory-level sglang_serial does not reach the play's serial), rank 0
    would be redeployed alone and wait for a rank 1 that never joins: the run stops at the first batch."""
    pids = ensure_changed_config(group)
    run = group.run(changed_vars()(group), extravars={"sglang_serial": 1, "sglang_redeploy_force": True})
    assert run.rc != 0, run.summary()
    check = run.task_result("Find the other ranks of a multi-node server, and check that they are all in this batch", host=RANK0)
    assert check["failed"] and "this batch holds node rank(s) 0 of it (rank0)" in check["msg"], check
    assert "Nothing was touched" in check["msg"]
    assert [r["host"] for r in run.report] == [RANK0], run.report
    row = report_row(run, RANK0)
    assert row["status"] == "failed" and row["step"] == "preflight" and row["rollback"]["status"] == "not_needed", row
    assert not run.ran(PREFLIGHT, host=RANK0) and not run.ran(PREFLIGHT, host=RANK1)
    assert not drain_events(run, RANK0) and not drain_events(run, RANK1)
    assert assert_group_running(group, dict(RESOLVED_SPEC, **CHANGED)) == pids


def test_a_crashing_rank_1_rolls_the_whole_group_back(group):
    """Rank 1's new server crashes while loading; rank 0 cannot become healthy without it. Both ranks fail
    at the launch, roll back together and run the previous (changed) config again."""
    pids = ensure_changed_config(group)
    run = group.run(changed_vars(rank1={"SGLANG_SIM_CRASH_ON_LOAD": "1"})(group))
    # Rank 0's own config did not change, but the group redeploys it with rank 1.
    assert run.task_result(PREFLIGHT, host=RANK0)["plan"]["action"] == "none"
    assert report_row(run, RANK0)["plan"] == "restart"
    assert_group_rolled_back(run, group, pids, {RANK0: "launch", RANK1: "launch"},
                             {RANK0: "launch failed", RANK1: "launch failed"})
    assert "SGLANG_SIM_CRASH_ON_LOAD" in (group[RANK1].logs / "server.log").read_text(errors="replace")


def test_a_failed_rank_0_makes_rank_1_fail_at_the_group_barrier(group):
    """Rank 0's new server crashes while loading (after rank 1 joined). Rank 1's candidate is healthy and
    holds its GPU, but fails at the barrier with the group message; its candidate (which rank 0 never told
    to stop) is torn down in the rollback, and both ranks run the previous config again."""
    pids = ensure_changed_config(group)
    # Rank 0 loads for a few seconds before it crashes, so rank 1 has joined by then.
    run = group.run(changed_vars(rank0={"SGLANG_SIM_CRASH_ON_LOAD": "1", "SGLANG_SIM_STARTUP_S": "12"})(group))
    rank1_launch = run.task_result(LAUNCH_TASK, host=RANK1)
    assert not rank1_launch["failed"], ("rank 1 must be up before rank 0 crashes", rank1_launch.get("msg"))
    barrier = run.task_result(GROUP_FAIL_TASK % "launch", host=RANK1)
    assert barrier["failed"] and "failed before the launch checkpoint (rank0)" in barrier["msg"], barrier
    assert not run.ran(GROUP_FAIL_TASK % "launch", host=RANK0)       # rank 0 was in the rescue already
    assert [g["index"] for g in rank1_launch["gpus_allocated"]] == [0]
    assert_group_rolled_back(run, group, pids, {RANK0: "launch", RANK1: "launch (another rank failed)"},
                             {RANK0: "launch failed", RANK1: "failed before the launch checkpoint (rank0)"})
    # The orphaned rank-1 candidate ignored SIGTERM (no ShutdownReq came) and needed a SIGKILL.
    rollback_drain = drain_result(drain_events(run, RANK1)[-1])
    assert "SIGKILL" in signals_sent(rollback_drain), rollback_drain
