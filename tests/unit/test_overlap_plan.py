"""module_utils/redeploy/overlap.py: the node's facts about room for a second server, and the path decision."""
from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading

import pytest

from ansible_collections.gpufleet.sglang.plugins.action.redeploy_flow import OVERLAP_LABELS
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import supervise as sp
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import overlap


def gpu(index, used=0, pids=()):
    return {"index": index, "used_mib": used, "processes": [{"pid": p} for p in pids]}


NODE = [gpu(0, 60000, [100]), gpu(1, 60000, [101]), gpu(2, 3), gpu(3, 3)]
CURRENT = {"pid": 99, "record": {"pid": 99, "port": 30000, "url": "http://127.0.0.1:30000"}}
RUNNING = {"pid": 99, "healthy": True}
RECORD = {"cuda_visible_devices": "0,1"}


def facts(**over):
    args = dict(current=CURRENT, running=RUNNING, running_record=RECORD, port_owner=None, node_gpus=NODE,
                new_gpus=["2", "3"], new_port=30001, max_used_mib=16, probe=lambda url: url == "http://127.0.0.1:30000")
    args.update(over)
    return overlap.node_facts(**args)


def decide(f=None, **over):
    """The decision as the redeploy_flow action makes it (its messages name the role's variables)."""
    args = dict(setting="auto", facts=f if f is not None else facts(), action="restart", router_url="http://r:1",
                names=OVERLAP_LABELS)
    args.update(over)
    return overlap.decide(**args)


def test_used_directly_the_decision_names_its_own_inputs():
    got = overlap.decide("auto", facts(), "restart", router_url="", manager="systemd")
    assert got["why"].startswith("overlap refused: no router to switch clients (router_url is empty)"), got
    assert any("use manager: process for overlap" in r for r in got["reasons"]), got
    with pytest.raises(ValueError, match=r"^overlap must be one of off, auto, got 'yes'"):
        overlap.decide("yes", facts(), "restart")


def test_facts_of_a_node_with_room():
    f = facts()
    assert f["old_pid"] == 99
    assert f["old_gpus"] == ["0", "1"] and f["old_port"] == 30000 and f["old_url"] == "http://127.0.0.1:30000"
    assert f["new_gpus"] == ["2", "3"] and f["new_gpus_busy"] == [] and f["new_port_free"] is True


def test_busy_gpus_are_named_with_their_holder_or_memory():
    f = facts(node_gpus=[gpu(0, 60000, [100]), gpu(1, 60000, [101]), gpu(2, 0, [555]), gpu(3, 900)])
    assert f["new_gpus_busy"][0] == "2 (held by PID 555)"
    assert "3 (900 MiB used" in f["new_gpus_busy"][1]
    assert facts(new_gpus="2,7")["new_gpus_busy"] == ["7 (not on this node)"]


def test_an_unrecorded_server_is_not_managed():
    f = facts(current={"pid": 99, "record": {"pid": 98}})
    assert f["old_pid"] is None and f["old_gpus"] == [] and f["old_port"] is None


def test_overlap_when_everything_holds():
    got = decide()
    assert got["path"] == "overlap" and got["reasons"] == []
    assert "GPUs 2,3 and port 30001 are free beside the old server (PID 99, GPUs 0,1, port 30000)" in got["why"]


def test_off_and_actions_without_a_new_server_stay_in_place():
    assert decide(setting="off")["path"] == "in_place"
    assert decide(setting=None)["why"] == "sglang_redeploy_overlap is off; in place"
    assert decide(setting=False)["path"] == "in_place"      # an unquoted YAML off
    assert decide(action="weights")["path"] == "in_place"
    assert decide(action="none")["path"] == "in_place"


def test_a_bad_setting_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"sglang_redeploy_overlap must be one of off, auto, got 'yes'"):
        decide(setting="yes")
    with pytest.raises(ValueError, match=r"got 'true'"):
        decide(setting=True)


@pytest.mark.parametrize("over, reason", [
    ({"router_url": ""}, "no router to switch clients"),
    ({"worker_url": "http://w:1"}, "sglang_router_worker_url is set"),
    ({"multinode": True}, "multi-node"),
    ({"pd_role": "prefill"}, "prefill/decode (prefill)"),
    ({"manager": "systemd"}, "the systemd manager runs one unit per server name"),
    ({"recovering": True}, "did not finish"),
])
def test_each_setting_condition_refuses_with_its_reason(over, reason):
    got = decide(**over)
    assert got["path"] == "in_place"
    assert reason in got["why"] and got["why"].startswith("overlap refused: ") and got["why"].endswith("; in place")


@pytest.mark.parametrize("over, reason", [
    ({"new_gpus": ["1", "2"]}, "the new config's GPUs 1,2 overlap the old server's GPUs 0,1"),
    ({"new_port": 30000}, "the new config listens on the old server's port 30000"),
    ({"port_owner": {"pid": 7}}, "the new port 30001 is in use"),
    ({"probe": lambda url: False}, "does not answer /health"),
    ({"probe": None}, "does not answer /health"),
    ({"running_record": {}}, "the old server's GPUs are not in its launch record"),
    ({"running": None}, "no managed server runs"),
    ({"node_gpus": [gpu(0), gpu(1), gpu(2, 0, [7]), gpu(3)]}, "the new config's GPUs are not free: 2 (held by PID 7)"),
])
def test_each_node_condition_refuses_with_its_reason(over, reason):
    got = decide(facts(**over))
    assert got["path"] == "in_place"
    assert any(reason in r for r in got["reasons"]), got


def test_every_failed_condition_is_listed_the_first_is_why():
    got = decide(facts(new_gpus=["0", "1"], new_port=30000), router_url="")
    assert len(got["reasons"]) >= 3
    assert got["why"] == "overlap refused: %s; in place" % got["reasons"][0]
    assert "no router" in got["reasons"][0]


def write_kept(tmp_path, pid, start):
    (tmp_path / overlap.KEPT_STATE).write_text(json.dumps({"pid": pid, "starttime": start, "port": 30000,
                                                           "url": "http://127.0.0.1:30000"}))


def test_an_interrupted_overlap_with_the_old_server_running_is_a_problem_that_says_what_to_do(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        write_kept(tmp_path, proc.pid, sp.starttime(proc.pid))
        got = overlap.leftover(str(tmp_path), current_pid=4242)
        assert len(got) == 1
        assert "old server PID %d (port 30000" % proc.pid in got[0] and "(PID 4242)" in got[0]
        assert "kill -TERM %d" % proc.pid in got[0] and str(tmp_path / overlap.KEPT_STATE) in got[0]
        # The server the records name now is the kept one: nothing left over.
        assert overlap.leftover(str(tmp_path), current_pid=proc.pid) == []
    finally:
        proc.kill()
        proc.wait()
    # Its server is gone (or the PID was reused by another process): a stale copy says nothing.
    assert overlap.leftover(str(tmp_path), current_pid=4242) == []
    write_kept(tmp_path, os.getpid(), 1)
    assert overlap.leftover(str(tmp_path), current_pid=4242) == []


def test_no_kept_copy_no_problem(tmp_path):
    assert overlap.leftover(str(tmp_path), 1) == []
    assert overlap.leftover(None, 1) == []


def test_health_probe_reads_the_url_given():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        probe = overlap.health_probe()
        assert probe("http://127.0.0.1:%d" % srv.server_port) is True
        port = srv.server_port
    finally:
        srv.shutdown()
        srv.server_close()
    assert probe("http://127.0.0.1:%d" % port) is False
