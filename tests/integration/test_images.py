"""The server's container image against REAL podman and a REAL Docker engine (issue 24): module_utils/node/images.py
(inspect, pull, check) and oracle.resolve_in_image (the node oracle inside the image).

Each test runs against podman 4.3 (molecule/containers.conf) and against the private ``dockerd`` (Debian's docker.io
20.10 and its own client) of tests/integration/test_containers.py, whose fixture is imported from there. Pulls that
succeed come from :class:`container_images.Registry`, a registry served by this process on 127.0.0.1. Every image a
test creates is removed by its ID at the end; the simulated-SGLang image (:func:`container_images.sglang_sim_image`)
is a cache keyed by the simulator's content, like the node image, and stays in podman's store. The containers the
oracle runs are ``--rm``; the tests check that none is left.
"""
from __future__ import annotations

import io
import json
import os
import re
import shutil
import socket
import subprocess
import tarfile
import threading

import pytest

from conftest import wait_until
from container_images import Registry, node_image, podman_env, sglang_sim_image
# The private dockerd fixture of test_containers, reused (by getfixturevalue): imported, not copied.
from test_containers import DOCKER_IO_CLIENT, dockerd  # noqa: F401 # pylint: disable=unused-import

from ansible_collections.gpufleet.sglang.plugins.module_utils.common.names import Names
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import images
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import oracle

H200 = {"name": "NVIDIA H200", "compute_capability": "9.0", "memory_mib": 143771, "count": 8}
NAMES = Names({"image": "sglang_server_image"})
OTHER_ARCH = "arm64" if images.node_architecture() != "arm64" else "amd64"


class Runtime(object):
    """One engine: ``cli`` (absolute path), ``env`` (its client's environment), ``run(argv)`` as the module gives it."""

    def __init__(self, name, cli, env):
        self.name, self.cli, self.env = name, cli, env
        self.created = []                       # image IDs to remove at the end

    def run(self, argv):
        proc = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=120, check=False)
        return proc.returncode, proc.stdout, proc.stderr

    def cli_ok(self, *args, **kw):
        rc, out, err = self.run([self.cli] + [str(a) for a in args])
        assert rc == 0, "%s %s failed (%d): %s" % (self.name, " ".join(str(a) for a in args), rc, err)
        return out

    def oracle_containers(self):
        out = self.cli_ok("ps", "-a", "--filter", "label=gpufleet.sglang.role=oracle", "--format", "{{.Names}}")
        return [n for n in out.split() if n.startswith("gpufleet-oracle-%d-" % os.getpid())]


@pytest.fixture(params=["podman", "docker"])
def rt(request):
    if request.param == "podman":
        runtime = Runtime("podman", shutil.which("podman"), podman_env())
    else:
        daemon = request.getfixturevalue("dockerd")
        env = dict(os.environ, **daemon["env"])
        env["PATH"] = "%s:%s" % (daemon["bin"], env.get("PATH", ""))
        runtime = Runtime("docker", DOCKER_IO_CLIENT, env)
    yield runtime
    for image_id in runtime.created:           # by ID, whatever the test did
        runtime.run([runtime.cli, "rmi", "--force", image_id])


def tiny_image(rt, tmp_path, name, podman_ids, arch=None, load=True):
    """A one-file image, unique to this test (so its ID is new), imported into podman (``--arch``) and, for docker
    with ``load``, loaded there from podman; returns its 64-hex ID, listed for removal by ID from both engines."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = os.urandom(16).hex().encode()
        info = tarfile.TarInfo("stamp")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    path = tmp_path / ("%s.tar" % os.urandom(4).hex())
    path.write_bytes(buf.getvalue())
    argv = ["podman", "import", "--quiet"] + (["--arch", arch] if arch else []) + [str(path), name]
    proc = subprocess.run(argv, env=podman_env(), capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    image_id = proc.stdout.strip().split(":")[-1]
    assert re.match(r"^[0-9a-f]{64}$", image_id), proc.stdout
    podman_ids.append(image_id)
    if rt.name == "docker" and load:
        save = subprocess.Popen(["podman", "save", name], env=podman_env(), stdout=subprocess.PIPE)
        load = subprocess.run([rt.cli, "load"], stdin=save.stdout, env=rt.env, capture_output=True, text=True,
                              timeout=300, check=False)
        save.stdout.close()
        assert save.wait(timeout=300) == 0 and load.returncode == 0, load.stderr
    if rt.name == "docker":
        rt.created.append(image_id)
    return image_id


@pytest.fixture
def podman_ids():
    """Image IDs to remove from podman at the end, by ID."""
    ids = []
    yield ids
    for image_id in ids:
        subprocess.run(["podman", "rmi", "--force", image_id], env=podman_env(), capture_output=True, check=False)


def test_inspect_of_the_node_image(rt, request):
    name = node_image() if rt.name == "podman" else request.getfixturevalue("dockerd")["image"]
    info = images.inspect(rt.run, rt.cli, name)
    podman_id = subprocess.run(["podman", "image", "inspect", "--format", "{{.Id}}", name], env=podman_env(),
                               capture_output=True, text=True, check=True).stdout.strip()
    assert info["id"] == "sha256:" + podman_id                 # the same config digest in both engines
    assert info["architecture"] == images.node_architecture() and info["os"] == "linux"
    assert name in info["tags"] and info["size"] > 1000000
    if rt.name == "podman":                                    # podman stores a manifest digest for a local build
        assert re.match(r"^localhost/gpufleet-node@sha256:[0-9a-f]{64}$", info["digest"]), info
        assert images.describe(info) == info["digest"]
    else:                                                      # docker load: no repo digest
        assert info["digest"] is None and info["repo_digests"] == []
        assert images.describe(info) == "%s (image %s)" % (name, info["id"])
    assert images.inspect(rt.run, rt.cli, "localhost/gpufleet-nope/absent:1") is None


def test_an_unreachable_registry_fails_the_pull_and_check_refuses(rt):
    ref = "localhost:1/gpufleet/nope:1"
    seen = []
    ok, error = images.pull(rt.cli, ref, 120, on_line=seen.append, env=rt.env)
    assert ok is False and "connection refused" in error and "did not finish" not in error, error
    assert error.startswith("%s pull %s exited " % (rt.name, ref))
    res = images.check(rt.run, rt.cli, ref, "missing", 120, names=NAMES, env=rt.env)
    assert res["ok"] is False and res["image"] is None and res["pulled"] is False
    assert res["error"].startswith("sglang_server_image %s: the image is not on the node and the pull failed (" % ref)
    assert "connection refused" in res["error"] and "check the name and tag, the registry" in res["error"]


def test_pull_policy_never_refuses_an_absent_image_without_pulling(rt):
    calls = []

    def spy(*args, **kw):
        calls.append(args)
        return True, None
    ref = "localhost/gpufleet-nope/absent:%s" % os.urandom(4).hex()
    res = images.check(rt.run, rt.cli, ref, "never", 60, names=NAMES, pull=spy, env=rt.env)
    assert res["ok"] is False and calls == []
    assert res["error"] == ("sglang_server_image %s: the image is not on the node and pull_policy is never; pull it "
                            "there first (%s pull %s), or set pull_policy to missing" % (ref, rt.name, ref))


def _closed(conn):
    """True when the peer closed ``conn`` (what it sent is read and dropped; then EOF or an error), False while it
    is open and silent."""
    conn.settimeout(0.01)
    try:
        while conn.recv(65536):
            pass
        return True
    except socket.timeout:
        return False
    except OSError:
        return True


def test_a_pull_that_hangs_is_killed_by_pid(rt):
    """A registry that accepts the connection and never answers: the pull is killed at the deadline."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held = []
    stop = threading.Event()

    def accept():
        server.settimeout(0.5)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except (socket.timeout, OSError):
                continue
    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        ref = "127.0.0.1:%d/gpufleet/hang:1" % server.getsockname()[1]
        ok, error = images.pull(rt.cli, ref, 8, env=rt.env)
        assert ok is False and "did not finish within 8 s" in error, error
        pid = int(re.search(r"PID (\d+), was killed", error).group(1))
        assert not os.path.exists("/proc/%d" % pid) or open("/proc/%d/stat" % pid).read().split(") ", 1)[1][0] == "Z"
        assert held, "the pull never reached the registry"
        # Nothing goes on pulling: the registry's connections are closed by the other end (for docker: the daemon
        # gives the pull up when its client goes away).
        assert wait_until(lambda: all(_closed(conn) for conn in list(held)), timeout=60, interval=0.5), \
            "a connection to the hanging registry stays open after the pull was killed"
    finally:
        stop.set()
        thread.join(timeout=10)
        for conn in held:
            conn.close()
        server.close()


def publish(rt, tmp_path, registry, podman_ids, tag):
    """A fresh image pushed to ``registry`` as gpufleet/tiny:<tag> and removed from podman again (so that the pull
    is a real one): ``(image id, manifest digest)``."""
    image_id = tiny_image(rt, tmp_path, "localhost/gpufleet-images-test/src:%s" % os.urandom(3).hex(), podman_ids,
                          load=False)
    digest = registry.add(image_id, "gpufleet/tiny", tag)
    subprocess.run(["podman", "rmi", "--force", image_id], env=podman_env(), capture_output=True, check=True)
    return image_id, digest


def test_a_real_pull_shows_progress_and_records_the_registrys_digest(rt, tmp_path, podman_ids):
    registry = Registry(tmp_path / "registry")
    try:
        image_id, digest = publish(rt, tmp_path, registry, podman_ids, "1")
        ref = "%s/gpufleet/tiny:1" % registry.host
        env = registry.podman_env() if rt.name == "podman" else rt.env
        node = Runtime(rt.name, rt.cli, env)
        seen = []
        res = images.check(node.run, rt.cli, ref, "missing", 300, on_line=seen.append, names=NAMES, env=env)
        assert res["ok"] is True and res["pulled"] is True and res["error"] is None, res
        info = res["image"]
        assert info["id"] == "sha256:" + image_id
        assert info["digest"] == "%s/gpufleet/tiny@%s" % (registry.host, digest)
        assert images.describe(info) == info["digest"]
        progress = "Copying blob" if rt.name == "podman" else "Pull complete"
        assert any(progress in line for line in seen), seen
        # Present now: missing does not pull again; always does.
        again = images.check(node.run, rt.cli, ref, "missing", 300, env=env)
        assert again["ok"] is True and again["pulled"] is False and again["image"]["id"] == info["id"]
        # The tag moves to another image: the old image ID still names exactly the old image.
        other_id, other_digest = publish(rt, tmp_path, registry, podman_ids, "1")
        moved = images.check(node.run, rt.cli, ref, "always", 300, env=env)
        assert moved["ok"] is True and moved["pulled"] is True and moved["image"]["id"] == "sha256:" + other_id
        assert moved["image"]["digest"] == "%s/gpufleet/tiny@%s" % (registry.host, other_digest)
        assert images.inspect(node.run, rt.cli, images.run_ref(info))["id"] == info["id"]
    finally:
        registry.close()


def test_an_image_for_another_architecture_is_refused(rt, tmp_path, podman_ids):
    name = "localhost/gpufleet-images-test/arch:%s" % os.urandom(3).hex()
    tiny_image(rt, tmp_path, name, podman_ids, arch=OTHER_ARCH)
    res = images.check(rt.run, rt.cli, name, "never", 60, names=NAMES, env=rt.env)
    assert res["ok"] is False and res["image"]["architecture"] == OTHER_ARCH
    node = images.node_architecture()
    assert res["error"] == ("sglang_server_image %s: the image is built for linux/%s but this node is %s; use a tag or "
                            "digest of the image for %s (a multi-arch tag pulled on this node gets it)"
                            % (name, OTHER_ARCH, node, node))


@pytest.fixture
def sim_image(rt):
    name = sglang_sim_image(None if rt.name == "podman" else {k: rt.env[k] for k in ("DOCKER_HOST", "PATH")},
                            runtime=rt.name)
    info = images.inspect(rt.run, rt.cli, name)
    assert info is not None
    return info


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "llama"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    return str(path)


def test_the_oracle_answers_with_the_sglang_inside_the_image(rt, sim_image, model):
    ref = images.run_ref(sim_image)
    answer = oracle.resolve_in_image(rt.cli, ref, {"model_path": model, "tp_size": 2}, "0.5.10", H200,
                                     env={"SGLANG_SIM_VERSION": "0.5.10"}, mounts=[model], cli_env=rt.env)
    assert answer["ok"] is True and answer["sglang_version"] == "0.5.10" and answer["image"] == ref, answer
    assert answer["args"]["tp_size"] == 2 and answer["args"]["model_path"] == model
    default = oracle.resolve_in_image(rt.cli, ref, ["--model-path", model], None, H200, mounts=[model], cli_env=rt.env)
    assert default["ok"] is True and default["sglang_version"] == "0.5.23"       # the simulator's default release
    # Without the model mounted, the image's SGLang cannot read it: the host's files are not visible inside.
    unmounted = oracle.resolve_in_image(rt.cli, ref, ["--model-path", model], None, H200, cli_env=rt.env)
    assert unmounted["ok"] is False and "Can't load the configuration of '%s'" % model in unmounted["error"]["message"]
    assert rt.oracle_containers() == []                                           # --rm


def _probe(tmp_path, body):
    probe = tmp_path / "probe"
    probe.mkdir(exist_ok=True)
    script = probe / "python3"
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(0o755)
    probe.chmod(0o755)
    return str(probe), str(script)


def test_the_oracle_container_has_no_network(rt, sim_image, tmp_path):
    """The interpreter is a probe that lists the container's network interfaces and fails: only the loopback."""
    probe, script = _probe(tmp_path, 'echo "NETS $(ls /sys/class/net | tr "\\n" " ")" >&2; '
                                     'echo "DEVS $(ls /dev | grep -c nvidia)" >&2; exit 7')
    with pytest.raises(oracle.OracleUnavailable) as err:
        oracle.resolve_in_image(rt.cli, images.run_ref(sim_image), ["--model-path", "/m"], None, H200, mounts=[probe],
                                python=script, cli_env=rt.env)
    text = str(err.value)
    assert "the helper exited 7 without a JSON answer" in text, text
    assert re.search(r"NETS lo\s*\|", text), text
    assert "DEVS 0" in text, text
    assert rt.oracle_containers() == []
    # The probe sees more than the loopback where the container has the host's network (so the check above can fail).
    rc, out, err = rt.run([rt.cli, "run", "--rm", "--network", "host", "-v", "%s:%s:ro" % (probe, probe), "--entrypoint",
                           script, images.run_ref(sim_image)])
    nets = re.search(r"NETS (.*)", err).group(1).split()
    assert rc == 7 and "lo" in nets and len(nets) > 1, err


def test_an_oracle_that_hangs_is_killed_and_its_container_removed(rt, sim_image, tmp_path):
    probe, script = _probe(tmp_path, "sleep 300")
    with pytest.raises(oracle.OracleUnavailable) as err:
        oracle.resolve_in_image(rt.cli, images.run_ref(sim_image), ["--model-path", "/m"], None, H200, mounts=[probe],
                                python=script, cli_env=rt.env, timeout=15)
    assert "no answer within 15 s" in str(err.value)
    assert wait_until(lambda: rt.oracle_containers() == [], timeout=60, interval=0.5), rt.oracle_containers()
