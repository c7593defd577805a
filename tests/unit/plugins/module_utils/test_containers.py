"""module_utils/node/containers.py: the container a process runs in, from its /proc/<pid>/cgroup, and its name, image
and restart policy from the runtime's ``container inspect`` (issue 24).

The cgroup texts are the layouts docker, podman, containerd/CRI, CRI-O and kubernetes write on cgroup v1 and v2 hosts
(the podman cgroupfs one recorded on the CI machine: tests/unit/plugins/data/containers/); the inspect samples are a
real podman 4.3.1 output and the Docker Engine API's documented example (see that folder's README.md).
"""
from __future__ import annotations

import json
import pathlib
import subprocess

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils.node import containers

DATA = pathlib.Path(__file__).resolve().parents[1] / "data" / "containers"
CID = "4f2bd6e1a6c5e0b1a3b7c9d8e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3"
OTHER = "0" * 63 + "1"
POD = "pod8f3c9a2e-1b7d-4c55-9e0a-2f6b8d1c4e7a"

CONTAINERS = [
    ("docker-v2-systemd", "0::/system.slice/docker-%s.scope\n" % CID, "docker", "container"),
    ("docker-v1-cgroupfs", "12:pids:/docker/%s\n4:memory:/docker/%s\n1:name=systemd:/docker/%s\n0::/\n" % (CID, CID, CID),
     "docker", "container"),
    ("docker-v1-systemd", "5:cpu,cpuacct:/system.slice/docker-%s.scope\n1:name=systemd:/system.slice/docker-%s.scope\n"
     % (CID, CID), "docker", "container"),
    ("docker-nested-subgroup", "0::/system.slice/docker-%s.scope/init.scope\n" % CID, "docker", "container"),
    ("podman-v2-rootful", "0::/machine.slice/libpod-%s.scope/container\n" % CID, "podman", "container"),
    ("podman-v2-rootless", "0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-%s.scope\n" % CID,
     "podman", "container"),
    ("podman-conmon", "0::/machine.slice/libpod-conmon-%s.scope\n" % CID, "podman", "conmon"),
    ("podman-v1-cgroupfs", "9:name=systemd:/libpod_parent/libpod-%s\n4:memory:/libpod_parent/libpod-%s\n0::/libpod_parent/"
     "libpod-%s\n" % (CID, CID, CID), "podman", "container"),
    ("containerd-v2-systemd", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-%s.slice/cri-containerd-%s.scope\n"
     % (POD.replace("-", "_"), CID), "containerd", "container"),
    ("containerd-v1-systemd", "1:name=systemd:/system.slice/containerd.service/kubepods-besteffort-%s.slice:cri-containerd:%s\n"
     % (POD.replace("-", "_"), CID), "containerd", "container"),
    ("kubepods-v1-cgroupfs", "11:memory:/kubepods/burstable/%s/%s\n1:name=systemd:/kubepods/burstable/%s/%s\n"
     % (POD, CID, POD, CID), "kubernetes", "container"),
    ("kubepods-v1-guaranteed", "11:memory:/kubepods/%s/%s\n" % (POD, CID), "kubernetes", "container"),
    ("crio-v2", "0::/kubepods.slice/kubepods-%s.slice/crio-%s.scope\n" % (POD.replace("-", "_"), CID), "cri-o", "container"),
]

HOSTS = [
    ("v2-service", "0::/system.slice/sglang-main.service\n"),
    ("v2-session", "0::/user.slice/user-1000.slice/session-3.scope\n"),
    ("v2-root", "0::/\n"),
    ("dockerd-itself", "0::/system.slice/docker.service\n"),
    ("containerd-itself", "0::/system.slice/containerd.service\n"),
    ("podman-restart-unit", "0::/system.slice/podman-restart.service\n"),
    ("v1-hybrid-host", "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/f823e29bf0d5d2095c8f53ac03dc68ed\n0::/\n"),
    ("short-id-is-no-container", "0::/system.slice/docker-%s.scope\n" % CID[:12]),
    ("empty", ""),
]


@pytest.mark.parametrize("text,runtime,part", [c[1:] for c in CONTAINERS], ids=[c[0] for c in CONTAINERS])
def test_a_container_is_recognised_with_its_runtime_and_id(text, runtime, part):
    assert containers.container_from_cgroup(text) == {"runtime": runtime, "id": CID, "part": part}


@pytest.mark.parametrize("text", [h[1] for h in HOSTS], ids=[h[0] for h in HOSTS])
def test_a_host_process_is_in_no_container(text):
    assert containers.container_from_cgroup(text) is None


def test_the_recorded_podman_cgroupfs_file():
    text = (DATA / "podman-cgroupfs-v1-hybrid.cgroup").read_text()
    found = containers.container_from_cgroup(text)
    inspect = json.loads((DATA / "podman-4.3.1-inspect.json").read_text())[0]
    assert found == {"runtime": "podman", "id": inspect["Id"], "part": "container"}


def _proc(tmp_path, pid, text):
    (tmp_path / str(pid)).mkdir(parents=True, exist_ok=True)
    (tmp_path / str(pid) / "cgroup").write_text(text)


def test_container_of_a_pid_and_the_module_s_own_container(tmp_path):
    _proc(tmp_path, 10, "0::/machine.slice/libpod-%s.scope/container\n" % CID)
    _proc(tmp_path, 11, "0::/system.slice/sglang-main.service\n")
    _proc(tmp_path, "self", "0::/user.slice/user-0.slice/session-1.scope\n")
    assert containers.container_of(10, str(tmp_path))["id"] == CID
    assert containers.container_of(11, str(tmp_path)) is None
    assert containers.container_of(12, str(tmp_path)) is None             # gone
    assert containers.foreign_container(10, str(tmp_path))["runtime"] == "podman"
    # The module runs in that same container (molecule's container hosts): its processes are its own, as on a host.
    _proc(tmp_path, "self", "0::/machine.slice/libpod-%s.scope/container\n" % CID)
    assert containers.foreign_container(10, str(tmp_path)) is None
    _proc(tmp_path, "self", "0::/machine.slice/libpod-%s.scope/container\n" % OTHER)
    assert containers.foreign_container(10, str(tmp_path))["id"] == CID
    assert containers.foreign_container(10, str(tmp_path), own={"id": CID}) is None


def test_parse_the_real_podman_inspect_output():
    info = containers.parse_inspect((DATA / "podman-4.3.1-inspect.json").read_text())
    assert info == {"id": "92cd4aeb07257792d695fdf3d012dad7c32cc338ae538a9a3ed4fa5cb62e34c6", "name": "blissful_yalow",
                    "image": "localhost/gpufleet-node:b676eaafcd163673",
                    "image_id": "e36a0bd9c292e272fc336f4a01cdb8d1da3c868ff1445adc0fc51b7ef239f520",
                    "restart_policy": "always", "status": "running", "pid": 29895,
                    "labels": {"io.buildah.version": "1.28.2"}, "mounts": []}


def test_parse_docker_s_documented_inspect_output():
    info = containers.parse_inspect((DATA / "docker-engine-api-inspect.json").read_text())
    assert info["name"] == "boring_euclid" and info["image"] == "ubuntu" and info["restart_policy"] == "on-failure"
    assert info["id"].startswith("ba033ac44011") and info["image_id"].startswith("04c5d3b7b065") and info["pid"] == 234


@pytest.mark.parametrize("text", ["", "not json", "[]", "{}", "[1]", json.dumps([{"Name": "/"}])])
def test_parse_inspect_of_odd_output(text):
    info = containers.parse_inspect(text)
    assert info is None or (info["name"] is None and info["image"] is None and info["restart_policy"] == "no")


class Runs(object):
    def __init__(self, result=None, raises=None):
        self.argv = []
        self.kwargs = {}
        self.result = result
        self.raises = raises

    def __call__(self, argv, **kwargs):
        self.argv.append(argv)
        self.kwargs = kwargs
        if self.raises:
            raise self.raises
        return self.result


def test_inspect_names_the_container_through_its_cli():
    text = (DATA / "podman-4.3.1-inspect.json").read_bytes()
    run = Runs(subprocess.CompletedProcess([], 0, text, b""))
    found = {"runtime": "podman", "id": CID, "part": "container"}
    out = containers.inspect(found, which=lambda name: "/usr/bin/" + name, run=run)
    assert run.argv == [["/usr/bin/podman", "container", "inspect", CID]]
    assert run.kwargs["timeout"] == containers.INSPECT_TIMEOUT and run.kwargs["check"] is False
    assert out["inspected"] is True and out["name"] == "blissful_yalow" and out["restart_policy"] == "always"
    assert out["id"] == CID and out["runtime"] == "podman"
    assert containers.describe(out) == ("podman container blissful_yalow (id %s, image localhost/gpufleet-node:b676eaafcd163673, "
                                        "restart policy always)" % CID[:12])
    assert containers.fix(out) == ("`podman stop blissful_yalow` (podman does not restart a container stopped with `podman stop`; "
                                   "`podman rm blissful_yalow` removes it)")


def test_docker_fix_without_a_restart_policy_is_only_a_stop():
    out = {"runtime": "docker", "id": CID, "part": "container", "name": "web", "inspected": True, "restart_policy": "no"}
    assert containers.fix(out) == "`docker stop web`"


@pytest.mark.parametrize("case", ["no-cli", "fails", "timeout", "garbage"])
def test_inspect_never_fails_it_falls_back_to_the_id(case):
    found = {"runtime": "docker", "id": CID, "part": "container"}
    which = (lambda name: None) if case == "no-cli" else (lambda name: "/usr/local/bin/" + name)
    run = {
        "no-cli": Runs(raises=AssertionError("not run")),
        "fails": Runs(subprocess.CompletedProcess([], 1, b"[]", b"Cannot connect to the Docker daemon at unix:///var/run/docker.sock")),
        "timeout": Runs(raises=subprocess.TimeoutExpired(["docker"], 10)),
        "garbage": Runs(subprocess.CompletedProcess([], 0, b"oops", b"")),
    }[case]
    out = containers.inspect(found, which=which, run=run)
    assert out["inspected"] is False and out["name"] is None and out["restart_policy"] is None and out["id"] == CID
    assert out["inspect_error"]
    if case == "no-cli":
        assert run.argv == [] and out["inspect_error"] == "docker is not installed here"
    if case == "fails":
        assert "Cannot connect to the Docker daemon" in out["inspect_error"]
    words = containers.describe(out)
    assert words.startswith("docker container (id %s, not inspected: " % CID[:12])
    # Not knowing its restart policy, the fix names both steps, by id.
    assert containers.fix(out).startswith("`docker stop %s` and `docker update --restart=no %s`" % (CID, CID))


def test_kubernetes_containers_are_named_by_id_and_stopped_through_the_orchestrator():
    found = {"runtime": "containerd", "id": CID, "part": "container"}
    out = containers.inspect(found, which=lambda name: "/usr/bin/" + name, run=Runs(raises=AssertionError("not run")))
    assert out["inspect_error"] == "no CLI of containerd is used here"
    assert "crictl stop %s" % CID in containers.fix(out) and "kubelet" in containers.fix(out)


def test_podman_conmon_is_described_as_the_monitor():
    out = {"runtime": "podman", "id": CID, "part": "conmon", "name": "web", "restart_policy": "always"}
    assert containers.describe(out).startswith("container monitor (conmon) of the podman container web (id ")


def test_an_uninspected_podman_container_may_be_rootless():
    out = containers.inspect({"runtime": "podman", "id": CID, "part": "container"}, which=lambda name: None)
    assert out["inspect_error"] == "podman is not installed here"
    assert containers.fix(out).endswith("(run as the user that owns it if it is a rootless container)")
    assert "rootless" not in containers.fix(dict(out, inspected=True, restart_policy="no"))
