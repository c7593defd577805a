"""Adopting a hand-run docker/podman container and stopping it through its runtime (issue 24): containers.adoptable,
adopted_entry, check_adopt_refs, stop_adopted, start_adopted; the preflight's refuse_container/report_containers and
sglang_replace's stop_containers/restart_containers hooks.

The runtime is a fake CLI (a small Python script named ``docker`` or ``podman`` on PATH) that logs its argv and keeps
the container's status and restart policy in a JSON file; tests/integration/test_containers.py runs the same code
against the real podman and docker engines.
"""
from __future__ import annotations

import json
import os
import sys
import textwrap
import types

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils.common.names import PLAIN
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import containers
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import preflight as preflight_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import replace as replace_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import teardown

CID = "4f2bd6e1a6c5e0b1a3b7c9d8e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3"
OTHER = "0" * 63 + "1"

FAKE = textwrap.dedent('''\
    #!%s
    import json, os, sys
    state_path = os.environ["FAKE_RUNTIME_STATE"]
    with open(state_path) as fh:
        state = json.load(fh)
    with open(state_path + ".log", "a") as fh:
        fh.write(json.dumps([os.path.basename(sys.argv[0])] + sys.argv[1:]) + "\\n")
    args = sys.argv[1:]
    fail = state.get("fail") or {}
    if args[0] in fail:
        sys.stderr.write(fail[args[0]] + "\\n")
        sys.exit(125)
    if args[:2] == ["container", "inspect"]:
        print(json.dumps([{"Id": state["id"], "Name": "/" + state["name"], "Config": {"Image": "img:1"},
                           "HostConfig": {"RestartPolicy": {"Name": state["policy"]}},
                           "State": {"Status": state["status"], "Pid": 42 if state["status"] == "running" else 0}}]))
    elif args[0] == "update":
        state["policy"] = args[1].split("=", 1)[1]
    elif args[0] == "stop":
        state["status"] = state.get("after_stop", "exited")
    elif args[0] == "start":
        state["status"] = "running"
    with open(state_path, "w") as fh:
        json.dump(state, fh)
''') % sys.executable


@pytest.fixture
def runtime(tmp_path, monkeypatch):
    """``make(cli, **state)`` -> ``(state_path, log())``: a fake ``cli`` first in PATH with one container."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    state_path = tmp_path / "state.json"
    monkeypatch.setenv("PATH", "%s%s%s" % (bindir, os.pathsep, os.environ.get("PATH", "")))
    monkeypatch.setenv("FAKE_RUNTIME_STATE", str(state_path))

    def make(cli, **state):
        script = bindir / cli
        script.write_text(FAKE)
        script.chmod(0o755)
        state_path.write_text(json.dumps(dict({"id": CID, "name": "web", "policy": "always", "status": "running"}, **state)))

        def log():
            path = str(state_path) + ".log"
            return [json.loads(line) for line in open(path)] if os.path.exists(path) else []

        def now():
            return json.loads(state_path.read_text())
        return now, log
    return make


def box(runtime="docker", part="container", inspected=True, name="web", cid=CID, policy="always"):
    return {"runtime": runtime, "id": cid, "part": part, "name": name, "image": "img:1", "image_id": "sha256:1",
            "restart_policy": policy, "inspected": inspected, "inspect_error": None}


# ---------------------------------------------------------------- which containers are adopted
def test_the_port_owner_is_adopted_and_a_named_container_too():
    assert containers.adoptable(box(), port_owner=True) == "serves on the managed port"
    assert containers.adoptable(box(), refs=["web"]) == "named in adopt_containers (web)"
    assert containers.adoptable(box(), refs=[CID[:12]]) == "named in adopt_containers (%s)" % CID[:12]
    assert containers.adoptable(box(), refs=["/web"]) == "named in adopt_containers (web)"
    assert containers.adoptable(box(runtime="podman"), refs=[CID]) is not None


@pytest.mark.parametrize("c, port_owner, refs", [
    (box(), False, []),                                      # a GPU holder, not named: foreign, refused
    (box(), False, ["other", CID[:11], OTHER[:12]]),          # too short an id prefix, other names and ids
    (box(runtime="kubernetes"), True, ["web"]),               # the kubelet restarts it: never adopted
    (box(runtime="containerd"), True, ["web"]),
    (box(runtime="podman", part="conmon"), True, ["web"]),    # podman's monitor is not the container
    (box(inspected=False), True, ["web"]),                    # its CLI did not answer: it cannot be stopped through it
    (None, True, ["web"]),
])
def test_what_stays_refused(c, port_owner, refs):
    assert containers.adoptable(c, port_owner=port_owner, refs=refs) is None


def test_the_adopted_entry_holds_no_command_line_or_environment():
    c = dict(box(), cmdline="python3 -m sglang --api-key s3cret", env=["HF_TOKEN=s3cret"])
    entry = containers.adopted_entry(c, "serves on the managed port", [7, 3, 7])
    assert entry == {"runtime": "docker", "id": CID, "name": "web", "image": "img:1", "restart_policy": "always",
                     "why": "serves on the managed port", "pids": [3, 7]}
    assert "s3cret" not in json.dumps(entry)


def test_adopt_refs_are_checked_before_anything():
    problems, notes = [], []
    adopted = containers.check_adopt_refs(["web", "gone-one", "bad name;rm", ""], [containers.adopted_entry(box(), "x")],
                                          problems.append, notes.append)
    assert [c["id"] for c in adopted] == [CID]
    assert len(problems) == 2 and "'bad name;rm' is not a container name or id" in problems[0]
    assert "adopt_containers: '' is not" in problems[1]
    assert notes == ["adopt_containers: gone-one names none of the containers that hold the "
                     "managed port or the target GPUs; nothing of it is touched"]
    # A caller's label for the option (the role: sglang_adopt_containers) names it instead.
    labelled = []
    containers.check_adopt_refs(["bad name;rm"], [], labelled.append, notes.append, label="sglang_adopt_containers")
    assert labelled[0].startswith("sglang_adopt_containers: 'bad name;rm' is not a container name or id"), labelled


# ---------------------------------------------------------------- the preflight's hook
def _preflight(refs=()):
    fake = types.SimpleNamespace(p={"adopt_containers": list(refs)}, _boxed={}, _adopted={}, problems=[], notes=[],
                                 names=PLAIN)
    fake.problem = fake.problems.append
    return fake


def test_preflight_adopts_the_port_owner_s_container_and_its_gpu_holders():
    pf = _preflight()
    assert preflight_mod.Preflight.refuse_container(pf, box(), "PID 5 on port 30000", 5, port_owner=True) is True
    # The same container's GPU holder and teardown root are its processes, not refused.
    assert preflight_mod.Preflight.refuse_container(pf, box(), "GPU holder PID 6", 6) is True
    assert preflight_mod.Preflight.refuse_container(pf, box(cid=OTHER, name="other"), "GPU holder PID 9", 9) is False
    adopted = preflight_mod.Preflight.report_containers(pf)
    assert [(c["id"], c["pids"], c["why"]) for c in adopted] == [(CID, [5, 6], "serves on the managed port")]
    assert len(pf.problems) == 1 and "GPU holder PID 9 runs in the docker container other" in pf.problems[0]
    assert "name it in adopt_containers to have the teardown stop it" in pf.problems[0]


def test_preflight_refuses_the_port_owner_s_container_beside_a_managed_server():
    pf = _preflight()
    assert preflight_mod.Preflight.refuse_container(pf, box(), "PID 5 on port 30000", 5, port_owner=False) is False
    assert preflight_mod.Preflight.report_containers(pf) == [] and len(pf.problems) == 1


def test_preflight_adopts_a_named_gpu_holder():
    pf = _preflight(refs=["web"])
    assert preflight_mod.Preflight.refuse_container(pf, box(runtime="podman"), "GPU holder PID 6", 6) is True
    adopted = preflight_mod.Preflight.report_containers(pf)
    assert adopted[0]["runtime"] == "podman" and adopted[0]["why"] == "named in adopt_containers (web)"
    assert pf.problems == [] and pf.notes == []


# ---------------------------------------------------------------- the teardown through the runtime
def test_docker_turns_the_restart_policy_off_then_stops_with_the_grace(runtime):
    now, log = runtime("docker")
    record = containers.stop_adopted(containers.adopted_entry(box(), "x"), 7.2)
    assert [a[1:] for a in log()] == [["update", "--restart=no", CID], ["stop", "-t", "8", CID],
                                      ["container", "inspect", CID]]
    assert now()["status"] == "exited" and now()["policy"] == "no"
    assert record["stopped"] is True and record["restart_policy_set"] is True and record["restart_policy"] == "always"
    assert "turned off" in containers.stopped_line(record)
    # The rollback without a known-good config: the policy is restored, then it is started.
    started = containers.start_adopted(record)
    assert started["started"] is True and now() == dict(now(), status="running", policy="always")
    assert [a[1:] for a in log()][-2:] == [["update", "--restart=always", CID], ["start", CID]]


def test_docker_without_a_restart_policy_is_only_stopped(runtime):
    now, log = runtime("docker", policy="no")
    record = containers.stop_adopted(containers.adopted_entry(box(policy="no"), "x"), 30)
    assert [a[1] for a in log()] == ["stop", "container"] and record["restart_policy_set"] is False


def test_podman_keeps_its_policy_and_is_stopped(runtime):
    now, log = runtime("podman")
    record = containers.stop_adopted(containers.adopted_entry(box(runtime="podman"), "x"), 0)
    assert list(log())[0] == ["podman", "stop", "-t", "0", CID]
    assert record["restart_policy_set"] is False and now()["policy"] == "always" and now()["status"] == "exited"
    containers.start_adopted(record)
    assert [a[1] for a in log()][-1] == "start" and "update" not in [a[1] for a in log()]


def test_a_failed_policy_change_stops_nothing(runtime):
    now, log = runtime("docker", fail={"update": "Error response from daemon: no such container"})
    with pytest.raises(containers.ContainerError) as err:
        containers.stop_adopted(containers.adopted_entry(box(), "x"), 5)
    assert "`docker update --restart=no %s` exited 125: Error response from daemon: no such container" % CID in err.value.msg
    assert "nothing was stopped" in err.value.msg and err.value.record["restart_policy_set"] is False
    assert now()["status"] == "running" and [a[1] for a in log()] == ["update"]


def test_a_container_still_running_after_stop_is_an_error(runtime):
    now, log = runtime("docker", after_stop="running")
    with pytest.raises(containers.ContainerError) as err:
        containers.stop_adopted(containers.adopted_entry(box(), "x"), 5)
    assert "still running (PID 42) after `docker stop`" in err.value.msg and err.value.record["restart_policy_set"] is True


def test_no_cli_is_an_error_naming_it(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(containers.ContainerError, match="docker is not installed here"):
        containers.stop_adopted(containers.adopted_entry(box(), "x"), 5)
    assert containers.start_adopted(containers.adopted_entry(box(), "x"))["start_error"].startswith("docker is not installed")


# ---------------------------------------------------------------- sglang_replace's hooks
def _replace():
    fake = types.SimpleNamespace(result={"touched": False, "changed": False, "torn_down": False})
    fake.touch = lambda: fake.result.update(touched=True, changed=True)
    return fake


def test_replace_stops_the_plan_s_containers_and_restarts_them_without_known_good(runtime):
    now, log = runtime("docker")
    rp = _replace()
    replace_mod.Replace.stop_containers(rp, [containers.adopted_entry(box(), "serves on the managed port")], {"term_timeout": 3})
    assert rp.result["touched"] and rp.result["torn_down"] and now()["status"] == "exited"
    assert rp.result["containers_stopped"][0]["id"] == CID
    lines = replace_mod.result_lines(dict(rp.result, timings={}))
    assert lines[0] == "stopped through its runtime: docker container web (id %s, image img:1, restart policy always, " \
                       "turned off)" % CID[:12]
    detail = replace_mod.Replace.restart_containers(rp)
    assert detail == "; started the adopted docker container web (id %s, image img:1, restart policy always, turned off) " \
                     "again" % CID[:12]
    assert now()["status"] == "running" and now()["policy"] == "always"


def test_replace_reports_a_failed_stop_as_a_drain_error(runtime):
    now, log = runtime("docker", fail={"stop": "permission denied"})
    rp = _replace()
    with pytest.raises(teardown.DrainError) as err:
        replace_mod.Replace.stop_containers(rp, [containers.adopted_entry(box(), "x")], {})
    assert "could not be stopped through its runtime" in err.value.msg and "permission denied" in err.value.msg
    # The policy was turned off: the node was touched, and the record says so.
    assert rp.result["touched"] is True and err.value.result["containers_stopped"][0]["restart_policy_set"] is True
    assert ["stop", "-t", str(int(teardown.stop.DEFAULT_TERM_TIMEOUT + 0.999)), CID] in [a[1:] for a in log()]


def test_replace_with_no_containers_does_nothing():
    rp = _replace()
    replace_mod.Replace.stop_containers(rp, [], {})
    assert rp.result["touched"] is False and replace_mod.Replace.restart_containers(rp) == ""
