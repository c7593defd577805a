"""module_utils/node/images.py: the server's container image (issue 24): inspect, pull, check, run_ref, describe.

The inspect texts in tests/unit/plugins/data/images/ were recorded on the CI machine (see its README.md): podman
4.3.1 (a local build and an ``import --arch arm64``) and docker.io 20.10.24 (an ``import`` and a ``load`` of the
podman arm64 image), and what each prints for an absent image. ``check`` runs with a fake ``run`` (those texts) and
a fake ``pull``; ``pull`` itself runs real child processes (small scripts standing in for the runtime's CLI).
"""
from __future__ import annotations

import json
import os
import pathlib
import stat

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils.common.names import Names
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import images

DATA = pathlib.Path(__file__).resolve().parents[1] / "data" / "images"
NODE_ID = "3b234dd23dad5ab55eac902f7f22f131d194b1a7eea278026b937ffe02378620"
ARM_ID = "f51e121ac1a94deed96794a593a12f7a1b2cf3e0369e0a02e37b47ae5b144d06"


def text(name):
    return (DATA / name).read_text()


def absent(runtime):
    rec = json.loads(text("absent.json"))[runtime]
    return rec["rc"], rec["stdout"], rec["stderr"]


class FakeRun(object):
    """``run(argv)`` answering ``image inspect`` from recorded outputs, one per call (the last one repeats)."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.calls = []

    def __call__(self, argv):
        self.calls.append(list(argv))
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def found(name):
    return (0, text(name), "")


def test_podman_local_build():
    info = images.inspect(FakeRun(found("podman-4.3.1-node.json")), "podman", "localhost/gpufleet-node:02f35d0d9bd72844")
    assert info["id"] == "sha256:" + NODE_ID                       # podman prints the Id without sha256:
    assert info["digest"] == ("localhost/gpufleet-node@sha256:05706b19fff4b0d4d69c73aad4b69717a95e436f0d848d2761242ba8"
                              "2419d47e")                          # podman keeps a manifest digest for a local build
    assert info["repo_digests"] == [info["digest"]]
    assert (info["architecture"], info["os"], info["size"]) == ("amd64", "linux", 199976380)
    assert info["tags"] == ["localhost/gpufleet-node:02f35d0d9bd72844"]
    assert images.run_ref(info) == NODE_ID
    assert images.describe(info) == info["digest"]


def test_podman_import_for_another_architecture():
    info = images.inspect(FakeRun(found("podman-4.3.1-import-arm64.json")), "podman", "localhost/gpufleet-rec/arm:1")
    assert info["id"] == "sha256:" + ARM_ID and info["architecture"] == "arm64" and info["os"] == "linux"
    assert info["digest"].startswith("localhost/gpufleet-rec/arm@sha256:abc5f0b2")


def test_docker_import_has_no_repo_digest():
    info = images.inspect(FakeRun(found("docker-20.10-import.json")), "/usr/bin/docker", "gpufleet-rec/tiny:1")
    assert info["id"] == "sha256:5d3d83ef785b42b198db760ebc7e62841341b996169bb65e3a9a774b42755305"
    assert info["repo_digests"] == [] and info["digest"] is None
    assert info["size"] == 3 and info["architecture"] == "amd64"
    assert images.describe(info) == "gpufleet-rec/tiny:1 (image %s)" % info["id"]
    assert images.run_ref(info) == "5d3d83ef785b42b198db760ebc7e62841341b996169bb65e3a9a774b42755305"


REGISTRY_DIGEST = "sha256:53f7a67b3cdb7828821d0c778c4935d837cdcb783c576df70babb9cb843cb55b"


def test_docker_pull_records_the_registrys_manifest_digest():
    info = images.inspect(FakeRun(found("docker-20.10-pulled.json")), "docker", "127.0.0.1:39433/gpufleet/tiny:1")
    assert info["digest"] == "127.0.0.1:39433/gpufleet/tiny@" + REGISTRY_DIGEST
    assert info["id"] == "sha256:5d07a7229c84db6fca7df517f6f49cfea40319cac8965451c002583f3a23c3dc"


def test_podman_pull_over_a_local_image_picks_the_registrys_digest_not_the_local_one():
    raw = json.loads(text("podman-4.3.1-pulled-over-local.json"))[0]
    assert len(raw["RepoDigests"]) == 4 and raw["Digest"] != REGISTRY_DIGEST     # what podman recorded
    info = images.inspect(FakeRun(found("podman-4.3.1-pulled-over-local.json")), "podman", "127.0.0.1:39433/gpufleet/tiny:1")
    assert info["digest"] == "127.0.0.1:39433/gpufleet/tiny@" + REGISTRY_DIGEST
    assert info["id"] == "sha256:5d07a7229c84db6fca7df517f6f49cfea40319cac8965451c002583f3a23c3dc"   # docker's too
    assert images.describe(info) == info["digest"]
    local = images.inspect(FakeRun(found("podman-4.3.1-pulled-over-local.json")), "podman", "localhost/gpufleet-rec/tiny:1")
    assert local["digest"].startswith("localhost/gpufleet-rec/tiny@sha256:")


def test_docker_load_keeps_the_image_id_and_architecture_of_podman():
    info = images.inspect(FakeRun(found("docker-20.10-load-arm64.json")), "docker", "localhost/gpufleet-rec/arm:1")
    assert info["id"] == "sha256:" + ARM_ID and info["architecture"] == "arm64" and info["digest"] is None


@pytest.mark.parametrize("runtime", ["podman", "docker"])
def test_absent_image_is_none(runtime):
    run = FakeRun(absent(runtime))
    assert images.inspect(run, runtime, "x/nope:1") is None
    assert run.calls == [[runtime, "image", "inspect", "x/nope:1"]]        # plain inspect: no --format


def test_other_inspect_failures_raise():
    with pytest.raises(images.ImageError) as err:
        images.inspect(FakeRun((125, "", "Error: cannot connect to the podman socket\n")), "podman", "x:1")
    assert "podman image inspect x:1 exited 125: Error: cannot connect" in str(err.value)
    with pytest.raises(images.ImageError):
        images.inspect(FakeRun((0, "json\n", "")), "docker", "x:1")       # what 20.10 prints for --format json


@pytest.mark.parametrize("ref, digests, want", [
    ("lmsysorg/sglang:v0.5.4", ["lmsysorg/sglang@sha256:" + "a" * 64], "lmsysorg/sglang@sha256:" + "a" * 64),
    ("docker.io/lmsysorg/sglang:v0.5.4", ["lmsysorg/sglang@sha256:" + "a" * 64],
     "lmsysorg/sglang@sha256:" + "a" * 64),
    ("lmsysorg/sglang:v0.5.4", ["docker.io/lmsysorg/sglang@sha256:" + "b" * 64],
     "docker.io/lmsysorg/sglang@sha256:" + "b" * 64),
    ("ubuntu:22.04", ["docker.io/library/ubuntu@sha256:" + "c" * 64], "docker.io/library/ubuntu@sha256:" + "c" * 64),
    ("lmsysorg/sglang:v1", ["other/sglang@sha256:" + "a" * 64], None),
    ("registry.example:5000/team/sglang:v1", ["registry.example:5000/team/sglang@sha256:" + "d" * 64,
                                              "mirror.example/team/sglang@sha256:" + "e" * 64],
     "registry.example:5000/team/sglang@sha256:" + "d" * 64),
    # podman may list several digests of one repository: the one the ref names, else the first.
    ("q.io/a/b@sha256:" + "2" * 64, ["q.io/a/b@sha256:" + "1" * 64, "q.io/a/b@sha256:" + "2" * 64],
     "q.io/a/b@sha256:" + "2" * 64),
    ("q.io/a/b:t", ["q.io/a/b@sha256:" + "1" * 64, "q.io/a/b@sha256:" + "2" * 64], "q.io/a/b@sha256:" + "1" * 64),
    ("gpufleet-rec/tiny:1", ["localhost/gpufleet-rec/tiny@sha256:" + "f" * 64],
     "localhost/gpufleet-rec/tiny@sha256:" + "f" * 64),            # podman names a short-name import localhost/
    ("127.0.0.1:5000/x:1", ["localhost/x@sha256:" + "f" * 64], None),   # an explicit registry matches itself only
])
def test_the_repo_digest_of_the_refs_repository(ref, digests, want):
    assert images._pick_digest(ref, digests) == want


@pytest.mark.parametrize("machine, arch", [("x86_64", "amd64"), ("aarch64", "arm64"), ("arm64", "arm64"),
                                           ("ppc64le", "ppc64le"), ("s390x", "s390x"), ("armv7l", "arm"),
                                           ("i686", "386"), ("Weird9", "weird9")])
def test_node_architecture(machine, arch):
    assert images.node_architecture(machine) == arch


def test_node_architecture_of_this_machine():
    assert images.node_architecture() == images.ARCHES.get(os.uname().machine, os.uname().machine.lower())


class FakePull(object):
    def __init__(self, ok=True, error=None, then=None, lines=("Trying to pull x...", "Writing manifest")):
        self.ok, self.error, self.then, self.lines, self.calls = ok, error, then, lines, []

    def __call__(self, cli, ref, timeout, on_line=None, env=None):
        self.calls.append((cli, ref, timeout))
        for line in self.lines:
            if on_line:
                on_line(line)
        if self.then is not None:
            self.then()
        return self.ok, self.error


def test_check_finds_a_present_image_without_pulling():
    pull = FakePull()
    res = images.check(FakeRun(found("podman-4.3.1-node.json")), "podman", "localhost/gpufleet-node:1", "missing", 60,
                       pull=pull, arch="amd64")
    assert res["ok"] is True and res["pulled"] is False and res["error"] is None and pull.calls == []
    assert res["image"]["id"] == "sha256:" + NODE_ID


def test_check_pulls_a_missing_image_and_shows_the_progress():
    run = FakeRun(absent("docker"), found("docker-20.10-import.json"))
    seen = []
    pull = FakePull()
    res = images.check(run, "docker", "gpufleet-rec/tiny:1", "missing", 600, on_line=seen.append, pull=pull, arch="amd64")
    assert res["ok"] is True and res["pulled"] is True and res["image"]["digest"] is None
    assert pull.calls == [("docker", "gpufleet-rec/tiny:1", 600)] and seen == ["Trying to pull x...", "Writing manifest"]
    assert len(run.calls) == 2                             # inspected before and after the pull


def test_check_always_pulls_even_a_present_image():
    run = FakeRun(found("podman-4.3.1-node.json"))
    pull = FakePull()
    res = images.check(run, "podman", "localhost/gpufleet-node:1", "always", 60, pull=pull, arch="amd64")
    assert res["ok"] is True and res["pulled"] is True and len(pull.calls) == 1 and len(run.calls) == 1


def test_check_always_refuses_when_the_pull_fails_even_with_a_local_copy():
    run = FakeRun(found("podman-4.3.1-node.json"))
    res = images.check(run, "podman", "localhost/gpufleet-node:1", "always", 60, pull=FakePull(ok=False, error="boom"),
                       arch="amd64")
    assert res["ok"] is False and res["image"] is None and run.calls == []
    assert res["error"].startswith("image localhost/gpufleet-node:1: pull_policy is always and the pull failed (boom); ")


def test_check_never_refuses_an_absent_image_and_names_the_variable():
    pull = FakePull()
    names = Names({"image": "sglang_server_image", "pull_policy": "sglang_server_image_pull"})
    res = images.check(FakeRun(absent("podman")), "podman", "lmsysorg/sglang:v9", "never", 60, names=names, pull=pull)
    assert res["ok"] is False and res["image"] is None and pull.calls == []
    assert res["error"] == ("sglang_server_image lmsysorg/sglang:v9: the image is not on the node and "
                            "sglang_server_image_pull is never; pull it there first (podman pull lmsysorg/sglang:v9), or "
                            "set sglang_server_image_pull to missing")


def test_check_refuses_when_the_pull_fails_and_says_why():
    pull = FakePull(ok=False, error="docker pull x exited 1: Error response from daemon: manifest unknown")
    res = images.check(FakeRun(absent("docker")), "docker", "lmsysorg/sglang:nope", "missing", 60,
                       names=Names({"image": "sglang_server_image"}), pull=pull)
    assert res["ok"] is False and res["pulled"] is False
    assert res["error"].startswith("sglang_server_image lmsysorg/sglang:nope: the image is not on the node and the pull "
                                   "failed (docker pull x exited 1: Error response from daemon: manifest unknown); ")
    assert "check the name and tag, the registry and its credentials on the node" in res["error"]


def test_check_refuses_another_architecture_naming_both():
    res = images.check(FakeRun(found("podman-4.3.1-import-arm64.json")), "podman", "localhost/gpufleet-rec/arm:1",
                       "missing", 60, names=Names({"image": "sglang_server_image"}), pull=FakePull(), arch="amd64")
    assert res["ok"] is False and res["image"]["architecture"] == "arm64"
    assert res["error"] == ("sglang_server_image localhost/gpufleet-rec/arm:1: the image is built for linux/arm64 but "
                            "this node is amd64; use a tag or digest of the image for amd64 (a multi-arch tag pulled on "
                            "this node gets it)")
    # The same image on an arm64 node is fine.
    ok = images.check(FakeRun(found("podman-4.3.1-import-arm64.json")), "podman", "localhost/gpufleet-rec/arm:1",
                      "missing", 60, pull=FakePull(), arch="arm64")
    assert ok["ok"] is True


@pytest.mark.parametrize("ref, policy, words", [
    ("", "missing", "image must be an image reference"),
    ("a b:1", "missing", "image must be an image reference"),
    (None, "missing", "image must be an image reference"),
    ("x:1", "sometimes", "pull_policy must be one of missing, always, never, not 'sometimes'"),
])
def test_check_refuses_bad_input_before_running_anything(ref, policy, words):
    run = FakeRun((0, "[]", ""))
    res = images.check(run, "podman", ref, policy, 60, pull=FakePull())
    assert res["ok"] is False and words in res["error"] and run.calls == []


def test_check_never_raises():
    def broken(argv):
        raise OSError("no such file: podman")
    res = images.check(broken, "podman", "x:1", "missing", 60, pull=FakePull())
    assert res["ok"] is False and res["error"] == "image x:1 could not be checked: no such file: podman"
    res = images.check(FakeRun((125, "", "Error: database is locked")), "podman", "x:1", "never", 60, pull=FakePull())
    assert res["ok"] is False and "database is locked" in res["error"]


def test_run_ref_needs_an_id():
    with pytest.raises(ValueError):
        images.run_ref({"id": "sha256:short"})


# ---------------------------------------------------------------------------------------------------- pull


def fake_cli(tmp_path, body):
    path = tmp_path / "podman"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_pull_streams_both_outputs_line_by_line(tmp_path):
    cli = fake_cli(tmp_path, 'echo "Trying to pull $2..." >&2; printf "Copying blob 1\\rCopying blob 2\\n"; '
                             'echo "Writing manifest" >&2; echo "$1" > %s/argv' % tmp_path)
    seen = []
    ok, error = images.pull(cli, "q.io/a/b:1", 30, on_line=seen.append)
    assert (ok, error) == (True, None)
    assert seen == ["Trying to pull q.io/a/b:1...", "Copying blob 1", "Copying blob 2", "Writing manifest"]
    assert (tmp_path / "argv").read_text() == "pull\n"


def test_pull_failure_names_the_error_line(tmp_path):
    cli = fake_cli(tmp_path, 'echo "Trying to pull $2..." >&2; echo "Error: initializing source docker://$2: '
                             'connection refused" >&2; echo "some trailer" >&2; exit 125')
    ok, error = images.pull(cli, "localhost:1/x:1", 30)
    assert ok is False
    assert error == "podman pull localhost:1/x:1 exited 125: Error: initializing source docker://localhost:1/x:1: connection refused"


def test_a_progress_display_that_fails_does_not_fail_the_pull(tmp_path):
    def bad(line):
        raise RuntimeError("display broke")
    assert images.pull(fake_cli(tmp_path, "echo hi"), "x:1", 30, on_line=bad) == (True, None)


def test_pull_timeout_kills_the_pull_by_pid(tmp_path):
    pidfile = tmp_path / "pid"
    cli = fake_cli(tmp_path, 'echo $$ > %s; echo "Copying blob" >&2; sleep 300 & echo $! >> %s; wait' % (pidfile, pidfile))
    ok, error = images.pull(cli, "x:1", 2)
    assert ok is False
    assert "podman pull x:1 did not finish within 2 s" in error and "was killed" in error and "Copying blob" in error
    pids = [int(p) for p in pidfile.read_text().split()]
    assert len(pids) == 2
    for pid in pids:                                       # the CLI and its child: the whole group
        assert not _alive(pid), pid


def _alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def test_pull_of_a_missing_cli(tmp_path):
    ok, error = images.pull(str(tmp_path / "nope" / "docker"), "x:1", 5)
    assert ok is False and "docker pull x:1 could not start" in error
