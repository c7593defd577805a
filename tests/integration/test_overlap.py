"""Overlap redeploy (sglang_redeploy_overlap: auto) through playbooks/redeploy.yml on the simulated 8-GPU node,
behind the real smg 1.x router (scripts/setup-smg.sh; GPUFLEET_SMG_VENV names a ready venv).

One node, one router, in order (module-scoped fixture; each test reads the node as the previous one left it):

``test_overlap_switches_with_no_failed_request``
    the managed server on GPUs 0,1 moves to GPUs 2,3 and another port while a client thread sends requests
    through the router for the whole run: the plan says overlap, not one request fails, the router lists only the
    new worker, the old server's PIDs are gone and its GPUs free, known-good names the new GPUs and port.
``test_failed_candidate_is_stopped_and_the_old_server_still_serves``
    a candidate on GPUs 4,5 that fails its smoke gate: it is stopped by its PID (GPUs 4,5 free, nothing on its
    port), the old server keeps its PID, its records and its router entry, and no client request fails.
``test_gpus_shared_with_the_old_server_fall_back_in_place`` / ``test_no_router_falls_back_in_place``
    check-mode runs: the plan names the reason and the in-place path.
``test_candidate_that_crashes_on_load_is_stopped_and_the_records_come_back``
    the launch gate fails: sglang_replace stops the candidate, the router is never touched, the records come back.
``test_an_interrupted_overlap_is_refused_with_what_to_do``
    a kept copy of the old server's records naming a running process: the preflight refuses and says what to do.
``test_a_bad_overlap_setting_is_refused_before_anything``
    sglang_redeploy_overlap: yes fails the role's argument check, naming the variable and its values.

Every process is tracked by PID (Procs) and killed by PID and session at the end.
"""
from __future__ import annotations

import json

import pytest

from launch_helpers import smg1_binary
from playbook_helpers import SimNode, alive, free_port, http_get, module_procs, starttime  # noqa: F401  # pylint: disable=unused-import
from test_router_rolling import Load, router_workers, start_router

pytestmark = pytest.mark.slow

PATH_TASK = "Say which path the redeploy takes, overlap or in place, and why"


class _Servers(object):
    """The tracker interface start_router expects (``add``), on top of Procs."""

    def __init__(self, procs):
        self.procs = procs

    def add(self, pid):
        self.procs.track(pid)


@pytest.fixture(scope="module")
def setup(tmp_path_factory, procs):
    base = tmp_path_factory.mktemp("overlap")
    node = SimNode(base / "node", procs)
    kind = {"name": "smg-1", "binary": smg1_binary(), "api": "1", "flags": ["--policy", "cache_aware"]}
    router, _proc = start_router(_Servers(procs), base, kind)
    state = {"node": node, "router": router, "base": base}
    first = node.run(host_vars=host_vars(state, gpus="0,1", port=node.port))
    assert first.rc == 0, first.stdout_tail()
    assert "no managed server runs" in path_line(first)
    assert [w["url"] for w in router_workers(router)] == [node.url]
    return state


def host_vars(state, gpus, port, **extra):
    node = state["node"]
    hv = node.host_vars(sglang_server_args=node.server_args(port=port), sglang_server_cuda_visible_devices=gpus,
                        sglang_redeploy_overlap="auto", sglang_router_url=state["router"],
                        sglang_router_health_timeout=30, sglang_router_drain_timeout=60)
    hv.update(extra)
    return hv


def path_line(run):
    return run.task_result(PATH_TASK)["msg"]


def state_record(node):
    return json.loads((node.state / "server.state.json").read_text())


def healthy_urls(router):
    return sorted(w["url"] for w in router_workers(router) if w["is_healthy"] and w.get("status", "ready") == "ready")


def busy(node, gpus):
    """The GPUs of ``gpus`` that hold memory (gpusim's idle GPU uses 1 MiB)."""
    used = node.used()
    return [g for g in gpus if used[g] > 16]


def run_under_load(state, hv):
    load = Load(state["router"], rate=10.0, max_requests=6000, time_limit=600)
    load.start()
    try:
        run = state["node"].run(host_vars=hv)
    finally:
        load.stop()
    return run, load


def test_overlap_switches_with_no_failed_request(setup):
    node, router = setup["node"], setup["router"]
    old = state_record(node)
    new_port = free_port()
    new_url = "http://127.0.0.1:%d" % new_port
    run, load = run_under_load(setup, host_vars(setup, gpus="2,3", port=new_port))
    summary = load.summary()
    print("\noverlap redeploy: %s, playbook %.1f s" % (json.dumps(summary), run.wall))
    assert run.rc == 0, run.stdout_tail()
    assert path_line(run).startswith("path: overlap: GPUs 2,3 and port %d are free beside the old server (PID %d, GPUs 0,1, "
                                     "port %d)" % (new_port, old["pid"], old["port"])), path_line(run)
    # Not one client request failed, and the load ran through the whole run.
    assert summary["failed"] == 0, load.failures[:10]
    assert summary["ok"] == summary["sent"] and summary["sent"] > 10, summary
    # The router lists only the new worker, Ready.
    assert healthy_urls(router) == [new_url]
    assert [w["url"] for w in router_workers(router)] == [new_url]
    # The old server is gone and its GPUs free; the new one serves on GPUs 2,3.
    assert not alive(old["pid"])
    assert busy(node, (0, 1)) == []
    new = state_record(node)
    assert new["port"] == new_port and new["pid"] != old["pid"] and alive(new["pid"])
    assert busy(node, (2, 3)) == [2, 3] and http_get(new_url + "/health")[0] == 200
    assert http_get("http://127.0.0.1:%d/health" % old["port"])[0] is None
    # Promoted: known-good names the new GPUs and port; no copy of the old records is left.
    known_good = json.loads((node.etc / "known-good" / "server.json").read_text())
    assert known_good["cuda_visible_devices"] == "2,3" and int(known_good["args"]["port"]) == new_port
    assert not list(node.state.glob("overlap-old.*"))
    # The old server was stopped through the stop engine, by its PID, after the router switch.
    stop = run.task_result("Replace the server in one module run, candidate teardown")
    assert [item["pid"] for item in stop["signalled"] if item.get("signals")] == [old["pid"]], stop["signalled"]
    assert sorted(g["index"] for g in stop["gpus_free"]) == [0, 1]
    assert node.journal()["step"] == "promoted", node.journal()
    # The run report: deployed, the new server's PID, the old server's PID as the one signalled.
    row = run.row()
    assert row["status"] == "deployed" and row["candidate_pid"] == new["pid"], row
    assert [item["pid"] for item in row["signalled"]] == [old["pid"]], row["signalled"]
    setup["port"] = new_port


def test_failed_candidate_is_stopped_and_the_old_server_still_serves(setup):
    node, router = setup["node"], setup["router"]
    old = state_record(node)
    old_url = "http://127.0.0.1:%d" % old["port"]
    assert healthy_urls(router) == [old_url]
    cand_port = free_port()
    # The candidate starts and passes its health gate, then fails the smoke gate (an acceptance it cannot reach).
    hv = host_vars(setup, gpus="4,5", port=cand_port, sglang_smoke_min_accept_length=50.0)
    run, load = run_under_load(setup, hv)
    assert run.rc != 0
    assert path_line(run).startswith("path: overlap: GPUs 4,5 and port %d" % cand_port), path_line(run)
    failed = run.failed_tasks()
    assert any(name == "Run the smoke benchmark" for name, _res in failed), [name for name, _res in failed]
    launched = run.task_result("Replace the server in one module run, candidate launch")
    cand_pid = launched["launch"]["pid"]
    assert cand_pid and cand_pid != old["pid"]
    # The candidate was stopped by its PID; its GPUs and port are free.
    stop = run.task_result("Replace the server in one module run, candidate teardown")
    assert [item["pid"] for item in stop["signalled"] if item.get("signals")] == [cand_pid], stop["signalled"]
    assert not alive(cand_pid)
    assert busy(node, (4, 5)) == []
    assert http_get("http://127.0.0.1:%d/health" % cand_port)[0] is None
    # The old server never stopped: same PID, healthy, its records back, still (and only) in the router.
    assert alive(old["pid"]) and http_get(old_url + "/health")[0] == 200
    assert state_record(node)["pid"] == old["pid"]
    assert int((node.state / "server.pid").read_text()) == old["pid"]
    assert healthy_urls(router) == [old_url]
    assert load.summary()["failed"] == 0, load.failures[:10]
    assert "never stopped serving" in json.dumps(run.task_result("Overlap | fail this host; the old server never stopped serving"))
    assert not list(node.state.glob("overlap-old.*"))


def test_gpus_shared_with_the_old_server_fall_back_in_place(setup):
    node = setup["node"]
    old = state_record(node)
    run = node.run(host_vars=host_vars(setup, gpus="3,4", port=free_port()), check=True)
    assert run.rc == 0, run.stdout_tail()
    line = path_line(run)
    assert "overlap refused: the new config's GPUs 3,4 overlap the old server's GPUs 2,3; in place" in line, line
    assert state_record(node)["pid"] == old["pid"]


def test_no_router_falls_back_in_place(setup):
    node = setup["node"]
    run = node.run(host_vars=host_vars(setup, gpus="4,5", port=free_port(), sglang_router_url=""), check=True)
    assert run.rc == 0, run.stdout_tail()
    assert "overlap refused: no router to switch clients" in path_line(run)
    assert path_line(run).endswith("; in place")


def test_a_bad_overlap_setting_is_refused_before_anything(setup):
    node = setup["node"]
    old = state_record(node)
    run = node.run(host_vars=host_vars(setup, gpus="4,5", port=free_port(), sglang_redeploy_overlap="yes"))
    assert run.rc != 0
    messages = " ".join(str(res.get("msg")) for _name, res in run.failed_tasks())
    assert "value of sglang_redeploy_overlap must be one of: auto, off, False, got: yes" in messages, messages
    assert not run.ran(PATH_TASK)
    assert state_record(node)["pid"] == old["pid"] and alive(old["pid"])


def test_candidate_that_crashes_on_load_is_stopped_and_the_records_come_back(setup):
    """The launch gate fails (the candidate's scheduler raises while loading): sglang_replace stops what is left of
    the candidate by its PID, the router is never touched, the old server's records are restored."""
    node, router = setup["node"], setup["router"]
    old = state_record(node)
    old_url = "http://127.0.0.1:%d" % old["port"]
    before = [(w["url"], w["id"]) for w in router_workers(router)]
    cand_port = free_port()
    hv = host_vars(setup, gpus="4,5", port=cand_port)
    hv["sglang_server_env"] = dict(hv["sglang_server_env"], SGLANG_SIM_CRASH_ON_LOAD="1")
    run, load = run_under_load(setup, hv)
    assert run.rc != 0
    assert path_line(run).startswith("path: overlap: GPUs 4,5 and port %d" % cand_port), path_line(run)
    launched = run.task_result("Replace the server in one module run, candidate launch")
    assert launched["failed"] and launched["reason"] == "launch_failed", launched.get("reason")
    assert not run.ran("Run the smoke benchmark")
    assert not run.ran("Overlap | take the failed candidate out of the router")
    assert busy(node, (4, 5)) == []
    assert alive(old["pid"]) and http_get(old_url + "/health")[0] == 200
    assert state_record(node)["pid"] == old["pid"]
    assert int((node.state / "server.pid").read_text()) == old["pid"]
    # The same entry (its id): never removed and re-added.
    assert [(w["url"], w["id"]) for w in router_workers(router)] == before and healthy_urls(router) == [old_url]
    assert load.summary()["failed"] == 0, load.failures[:10]


def test_an_interrupted_overlap_is_refused_with_what_to_do(setup, procs):
    """A kept copy of the old server's records that names a process still running (a run stopped with two servers
    up): the preflight refuses, touching nothing, and says which PID to stop and which files to delete."""
    node = setup["node"]
    old = state_record(node)
    other = procs.spawn(["sleep", "600"])
    kept = node.state / "overlap-old.server.state.json"
    kept.write_text(json.dumps({"pid": other.pid, "starttime": starttime(other.pid), "port": 40999,
                                "url": "http://127.0.0.1:40999"}))
    try:
        run = node.run(host_vars=host_vars(setup, gpus="4,5", port=free_port()), check=True)
    finally:
        kept.unlink()
    assert run.rc != 0
    messages = " ".join(str(res.get("msg")) for _name, res in run.failed_tasks())
    assert "an overlap redeploy did not finish: the old server PID %d (port 40999" % other.pid in messages, messages
    assert "kill -TERM %d" % other.pid in messages and str(kept) in messages
    assert alive(other.pid) and state_record(node)["pid"] == old["pid"] and alive(old["pid"])
