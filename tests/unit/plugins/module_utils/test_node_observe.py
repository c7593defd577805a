"""module_utils/node/observe.py: the node state after a failure, read from the node (issue 28 part 2).

``observe`` runs against this test process: it listens on a loopback port and has a "device file" open under a
temporary directory; ``/health`` is answered by a fake ``request``. ``describe`` is checked on facts.
"""
from __future__ import annotations

import os
import socket

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils.common import http
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import observe as node_state


@pytest.fixture
def listener():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    yield sock.getsockname()[1]
    sock.close()


@pytest.fixture
def device(tmp_path):
    path = tmp_path / "dev" / "nvidia1"
    path.parent.mkdir()
    path.write_text("")
    fd = os.open(str(path), os.O_RDONLY)
    yield str(tmp_path / "dev" / "nvidia*")
    os.close(fd)


def answer(status):
    def request(method, url, timeout=None, **kw):
        assert method == "GET" and url.endswith("/health") and timeout == node_state.HEALTH_TIMEOUT_S
        if status is None:
            raise http.HTTPConnectionError(url, "refused")
        return status, {}, ""
    return request


def test_the_old_server_still_serves_when_its_process_listens_and_answers(listener, device):
    me = os.getpid()
    text, facts = node_state.observe(listener, "0.0.0.0", gpus=[0, 1], patterns=[device],
                                     groups=[("old server", [me]), ("candidate", [])], request=answer(200))
    assert text == ("the old server still serves: PID %d listens on port %d and /health answers 200; "
                    "GPU 0,1 open by the old server's PID %d" % (me, listener, me))
    assert facts["listener"]["pid"] == me and facts["listener"]["owner"] == "old server" and facts["health"] == 200
    assert facts["gpu_users"] == [{"pid": me, "name": facts["gpu_users"][0]["name"], "gpus": [1], "owner": "old server"}]


def test_a_listener_that_does_not_answer_and_one_that_is_not_ours(listener, device):
    me = os.getpid()
    text, dummy = node_state.observe(listener, "127.0.0.1", gpus=[0], patterns=[device],
                                     groups=[("candidate", [me])], request=answer(None))
    assert text.startswith("the candidate does not serve: PID %d listens on port %d but /health does not answer; " % (
        me, listener)), text
    assert text.endswith("no process has GPU 0 open")
    text, dummy = node_state.observe(listener, None, gpus=[1], patterns=[device], groups=[], request=answer(503))
    assert "not this server's) listens on port %d and /health answers 503; GPU 1 open by PID %d" % (listener, me) in text


def test_nothing_listens():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    text, facts = node_state.observe(port, "127.0.0.1", gpus=[3], patterns=["/nonexistent/nvidia*"],
                                     request=answer(200))
    assert text == "no server: nothing listens on port %d; no process has GPU 3 open" % port
    assert facts == {"port": port, "listener": None, "health": None, "gpu_users": []}


def test_describe_groups_gpu_users_by_owner():
    facts = {"port": 30000, "listener": None, "health": None,
             "gpu_users": [{"pid": 5, "gpus": [0], "owner": "failed candidate"}, {"pid": 6, "gpus": [0], "owner": None},
                           {"pid": 7, "gpus": [1], "owner": "failed candidate"}]}
    assert node_state.describe(facts, [0, 1]) == ("no server: nothing listens on port 30000; GPU 0,1 open by PID 6; "
                                                  "the failed candidate's PIDs 5,7")
    unseen = dict(facts, listener={"pid": None, "name": None, "owner": None}, health=None, gpu_users=[])
    assert node_state.describe(unseen) == ("a process this user cannot see (?, not this server's) listens on port 30000 "
                                           "and /health does not answer")


def test_urls_of_wildcard_and_ipv6_hosts():
    assert node_state._url("0.0.0.0", 1) == "http://127.0.0.1:1"
    assert node_state._url("::", 2) == "http://127.0.0.1:2"
    assert node_state._url("::1", 3) == "http://[::1]:3"
    assert node_state._url("10.0.0.5", 4) == "http://10.0.0.5:4"
