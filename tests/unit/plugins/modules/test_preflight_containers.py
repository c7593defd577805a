"""sglang_preflight and servers in containers (issue 24), in-process on the simulated node of test_sglang_preflight.py.

The processes are host processes (hand-started servers, ``gpusim monitor`` agents); which container each one runs in
is what ``containers.container_of`` reads from /proc/<pid>/cgroup, replaced here so that one PID "is" in a docker
container without a docker engine (the real podman case is tests/integration/test_containers.py). ``docker
container inspect`` is not run: the CLI is "not installed", so the container is named by its id.
"""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_sglang_preflight import hand_started, monitor, node, run  # noqa: E402,F401 - the fixtures and helpers

__all__ = ["node", "run"]   # the fixtures, used as test parameters

from ansible_collections.gpufleet.sglang.plugins.module_utils.node import containers
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import procfs

CID = "ab" * 32


@pytest.fixture
def boxed(monkeypatch):
    """``boxed(pids, own=None)``: these PIDs run in docker container CID; this module in ``own`` (None: on the host)."""
    def _boxed(pids, own=None):
        real = containers.container_of

        def container_of(pid, proc_root=procfs.PROC_ROOT):
            if pid == "self":
                return {"runtime": "docker", "id": own, "part": "container"} if own else None
            if pid in pids:
                return {"runtime": "docker", "id": CID, "part": "container"}
            return real(pid, proc_root)
        monkeypatch.setattr(containers, "container_of", container_of)
        inspect = containers.inspect
        monkeypatch.setattr(containers, "inspect", lambda found: inspect(found, which=lambda name: None))
    return _boxed


def test_a_server_in_a_container_on_the_managed_port_is_not_adopted(node, run, boxed):
    srv = hand_started(node, ["-m", "sglang.launch_server"], port=node.port)
    boxed({srv["pid"], srv["child"]})
    res = run()
    assert res["failed"] is True and not node.lease_path.exists()
    owner = res["plan"]["port_owner"]
    assert owner["adoptable"] is False and owner["container"]["id"] == CID and owner["container"]["inspected"] is False
    assert res["plan"]["running"] is None and res["plan"]["teardown_pids"] == []
    assert [(h["pid"], h["class"], h["container"]["id"]) for h in res["plan"]["holders"]] == [(srv["child"], "foreign", CID)]
    assert len(res["problems"]) == 1, res["problems"]
    text = res["problems"][0]
    expected = ("on port %d; GPU holder PID %d (foreign, GPUs 0) run in the docker container (id %s, not inspected: "
                "docker is not installed here)" % (node.port, srv["child"], CID[:12]))
    assert text.startswith("PID %d (" % srv["pid"]) and expected in text
    assert "and docker starts it again" in text
    assert "`docker stop %s` and `docker update --restart=no %s`" % (CID, CID) in text
    # Neither allow_foreign nor adopt_pids makes it a teardown root.
    for options in ({"allow_foreign": True}, {"adopt_pids": [srv["pid"]]}, {"adopt_patterns": ["launch_server"]}):
        again = run(check=True, **options)
        assert again["plan"]["teardown_pids"] == [] and any("run in the docker container" in p for p in again["problems"]), options


def test_a_server_in_the_module_s_own_container_is_adopted_as_on_a_host(node, run, boxed):
    """Molecule's container hosts: Ansible and the server run in the same container; nothing changes there."""
    srv = hand_started(node, port=node.port)
    boxed({srv["pid"], srv["child"]}, own=CID)
    res = run(check=True)
    assert res["problems"] == [] and res["plan"]["port_owner"]["adoptable"] is True
    assert "container" not in res["plan"]["port_owner"] and res["plan"]["teardown_pids"] == [srv["pid"]]


def test_a_monitoring_agent_in_a_container_is_named_never_refused(node, run, boxed):
    agent = monitor(node, "--name", "nv-exporter")
    boxed({agent})
    res = run(check=True)
    assert res["problems"] == [], res["problems"]
    [holder] = res["plan"]["holders"]
    assert holder["pid"] == agent and holder["class"] == "watcher" and holder["container"]["id"] == CID
    assert agent not in res["plan"]["teardown_pids"]
