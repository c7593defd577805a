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
redeploy with a changed config (rank 0 torn down first), a rank whose new
server crashes (the whole group rolls back), a rank-0 smoke failure (the other
rank fails at the group barrier and both roll back), and a no-op run.
Processes are cleaned up by PID (the role's PID files and every PID the tests
saw), never by name.
"""
from __future__ import annotations

import json

import pytest

from playbook_helpers import (FAST_SERVER_ENV, INCIDENT_SPEC, RESOLVED_SPEC, Procs, SimNode, alive, environ_of,
                              free_port, http_get, session_members)

pytestmark = pytest.mark.slow

RANK0, RANK1 = "rank0", "rank1"
HOSTS = (RANK0, RANK1)
GROUP_FAIL_TASK = "Fail together with the other ranks of a multi-node server (%s)"
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
def procs():
    tracker = Procs()
    yield tracker
    left = tracker.cleanup()
    assert not left, "processes survived SIGKILL: %s" % left


@pytest.fixture(scope="module")
def group(tmp_path_factory, procs):
    return Group(tmp_path_factory.mktemp("multinode"), procs)


def assert_group_running(group, spec=RESOLVED_SPEC):
    """Both ranks run (PID files name live processes), rank 0 serves the resolved config with nnodes 2,
    and each node holds memory on GPU 0 only."""
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


# --------------------------------------------------------------------------
# Scenarios
# --------------------------------------------------------------------------

def test_fresh_deploy_of_a_two_node_group(group):
    run = group.run()
    assert run.rc == 0, run.summary()
    for host in HOSTS:
        assert run.host_stats(host)["failures"] == 0, (host, run.host_stats(host))
        row = report_row(run, host)
        assert row["status"] == "deployed" and row["step"] == "done", row
    assert_group_running(group)
    # Health and smoke on rank 0 only.
    assert run.task_result("Run the smoke benchmark", host=RANK0)["accept_length"] >= 2.0
    assert not run.ran("Run the smoke benchmark", host=RANK1)
    launch1 = run.task_result("Launch the server and verify its effective config", host=RANK1)
    assert launch1["url"].endswith(":%d" % group[RANK1].port)


def test_redeploy_tears_down_rank_0_first(group):
    pass
