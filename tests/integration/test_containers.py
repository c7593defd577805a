"""Servers run by a container engine, against REAL podman and a REAL Docker engine (issue 24).

The container (``--restart always``, host network; with ``gpu``, the host PID namespace so that its process holds a
simulated GPU by its host PID) runs a small "server": it listens on a port and holds 1000 MiB of GPU 0 through the
simulator (GPUSIM_ROOT and simulator/python bind-mounted at the same paths). A signal from the host would end only
that process, and the engine would start it again.

* A container holder of the target GPUs that neither serves on the managed port nor is named in
  ``adopt_containers`` is refused, named (id, name, image, restart policy) and left running: same id, same PID, no
  restart.
* A container on the managed port (the incident's ``docker run`` by hand), or one named in ``adopt_containers``, is
  adopted: the plan lists it (runtime, id, name, image, restart policy; never its env or command line), and
  ``redeploy.yml`` stops it through its runtime (docker: ``update --restart=no`` first), replaces it by the
  collection's server, and it stays stopped (same id, exited, no restart).

Each runtime test runs against podman (molecule/containers.conf: runc, explicit ulimits) and against a private
``dockerd`` (Debian's docker.io) that this module starts on a socket under its tmp directory with ``--bridge=none
--iptables=false --ip-masq=false`` (containers use the host network: the host's firewall and podman's networks are
not touched) and stops by its PID at the end; the node image is copied into it with ``podman save | docker load``.
Needs podman, docker.io (scripts/install-system-deps.sh), root (dockerd) and a local molecule node image
(scripts/build-image.sh builds ``localhost/gpufleet-node:<tag>``). Each container is removed by its ID at teardown.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import tempfile
import textwrap

import pytest

from conftest import REPO, SIM_BIN, SIM_PY, wait_until
from checkpoint_files import write_checkpoint
import playbook_helpers as ph

CONF = REPO / "molecule" / "containers.conf"
SERVER = textwrap.dedent(r'''
    import os, signal, socket, sys
    from gpusim.node import Node
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", int(sys.argv[1])))
    sock.listen(8)
    if sys.argv[2] == "hold":
        Node(os.environ["GPUSIM_ROOT"]).hold(os.getpid(), gpus=[0], mib=1000, name="python3")
    print("ready", flush=True)
    while True:
        signal.pause()
''')
REPLACE = "Replace the server in one module run, candidate all"
PREFLIGHT = "Plan the redeploy (inspect the node, resolve the args as its SGLang will, take the lease)"


class Engine(object):
    """One container runtime: ``cli(*args)`` runs its CLI with ``env`` (CONTAINERS_CONF or DOCKER_HOST) and ``bin``
    (a directory with the engine's own client, or None) first on PATH; :meth:`over` gives the same to a node env."""

    def __init__(self, runtime, env, image, bin_dir=None):
        self.runtime = runtime
        self.env = env
        self.image = image
        self.bin = bin_dir

    def over(self, base):
        """``base`` (an environment) with this engine's variables, and its client first on ``base``'s PATH."""
        env = dict(base, **self.env)
        if self.bin:
            env["PATH"] = "%s:%s" % (self.bin, base.get("PATH") or os.environ.get("PATH", ""))
        return env

    def cli(self, *args, check=True, timeout=120):
        proc = subprocess.run([self.runtime] + [str(a) for a in args], env=self.over(dict(os.environ)), capture_output=True,
                              text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise AssertionError("%s %s failed (%d): %s" % (self.runtime, " ".join(str(a) for a in args), proc.returncode,
                                                            proc.stderr))
        return proc

    def inspect(self, cid):
        return json.loads(self.cli("container", "inspect", cid).stdout)[0]


def podman(*args, check=True, timeout=120):
    return Engine("podman", {"CONTAINERS_CONF": str(CONF)}, None).cli(*args, check=check, timeout=timeout)


def node_image():
    """This checkout's molecule node image (it has python3): scripts/build-image.sh prints its name, building it
    first when it is missing (the ``containers`` stage runs after the ``image`` stage, so it is there already)."""
    assert shutil.which("podman"), "podman is not installed: run scripts/install-system-deps.sh (as root)"
    env = dict(os.environ, CONTAINERS_CONF=str(CONF))
    proc = subprocess.run(["bash", str(REPO / "scripts" / "build-image.sh")], env=env, capture_output=True, text=True,
                          timeout=1800, check=False)
    assert proc.returncode == 0, "scripts/build-image.sh failed (%d): %s" % (proc.returncode, proc.stderr[-2000:])
    name = proc.stdout.strip().splitlines()[-1]
    assert name.startswith("localhost/gpufleet-node:"), name
    return name


def _mounted_under(path):
    with open("/proc/self/mountinfo") as fh:
        points = [line.split()[4] for line in fh]
    return sorted((p for p in points if p == str(path) or p.startswith(str(path) + "/")), key=len, reverse=True)


# Debian's docker.io client (dpkg -S /usr/bin/docker: docker.io), the one that matches its dockerd.
DOCKER_IO_CLIENT = "/usr/bin/docker"


@pytest.fixture(scope="module")
def dockerd():
    """A private Docker engine for this module: ``{"env", "image"}``; stopped by its PID at the end."""
    assert shutil.which("dockerd") and os.path.exists(DOCKER_IO_CLIENT), "docker.io is not installed: run scripts/install-system-deps.sh"
    assert os.geteuid() == 0, "dockerd needs root"
    base = pathlib.Path(tempfile.mkdtemp(prefix="gpufleet-dockerd-", dir="/tmp"))    # a short path: the socket's
    sock = base / "docker.sock"
    log = open(base / "dockerd.log", "wb")
    proc = subprocess.Popen(["dockerd", "--data-root", str(base / "data"), "--exec-root", str(base / "exec"),
                             "-H", "unix://%s" % sock, "--pidfile", str(base / "dockerd.pid"), "--bridge=none",
                             "--iptables=false", "--ip-masq=false"], stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    # The engine's own client (docker.io's /usr/bin/docker, what a Debian node has) first on PATH, for the tests and
    # for the collection's modules: a newer client elsewhere on PATH reads some options differently (docker 20.10
    # prints the word "json" for `container inspect --format json`, which 28.x reads as "the object as JSON").
    shim = base / "bin"
    shim.mkdir()
    (shim / "docker").symlink_to(DOCKER_IO_CLIENT)
    env = {"DOCKER_HOST": "unix://%s" % sock}
    try:
        engine = Engine("docker", env, None, str(shim))
        assert engine.cli("--version").stdout.startswith("Docker version 20.10"), "not docker.io's client"
        assert wait_until(lambda: proc.poll() is None and engine.cli("version", check=False).returncode == 0, timeout=60,
                          interval=0.5), "dockerd did not start: %s" % (base / "dockerd.log").read_text()[-2000:]
        image = node_image()
        save = subprocess.Popen(["podman", "save", image], env=dict(os.environ, CONTAINERS_CONF=str(CONF)),
                                stdout=subprocess.PIPE)
        load = subprocess.run(["docker", "load"], stdin=save.stdout, env=engine.over(dict(os.environ)), capture_output=True,
                              text=True, timeout=600, check=False)
        save.stdout.close()
        assert save.wait(timeout=600) == 0 and load.returncode == 0, load.stderr
        yield {"env": env, "image": image, "bin": str(shim)}
    finally:
        proc.send_signal(signal.SIGTERM)                   # by its PID; it stops its containerd itself
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        log.close()
        for point in _mounted_under(base):                 # the netns dockerd leaves mounted
            subprocess.run(["umount", point], check=False, capture_output=True)
        shutil.rmtree(str(base), ignore_errors=True)


@pytest.fixture(params=["podman", "docker"])
def engine(request):
    if request.param == "podman":
        return Engine("podman", {"CONTAINERS_CONF": str(CONF)}, node_image())
    daemon = request.getfixturevalue("dockerd")
    return Engine("docker", daemon["env"], daemon["image"], daemon["bin"])


def start_box(engine, started, script, root, port, gpu=True, secret="none"):
    """A running container serving ``port`` (and holding GPU 0 with ``gpu``): ``{"id", "name", "image", "pid",
    "restarts"}``. ``secret`` is in its environment and on its command line (``--api-key``)."""
    name = "gpufleet-issue24-%s-%d-%d" % (engine.runtime, os.getpid(), len(started))
    pid_ns = ["--pid", "host"] if gpu else []                 # else its own PID namespace (docker has no "private")
    proc = engine.cli("run", "-d", "--name", name, "--restart", "always", "--network", "host", *pid_ns,
                      "-v", "%s:%s" % (root, root), "-v", "%s:%s:ro" % (SIM_PY, SIM_PY), "-v", "%s:/boxed_server.py:ro" % script,
                      "-e", "GPUSIM_ROOT=" + str(root), "-e", "PYTHONPATH=" + str(SIM_PY), "-e", "SGLANG_API_KEY=" + secret,
                      engine.image, "python3", "/boxed_server.py", port, "hold" if gpu else "serve", "--api-key", secret)
    cid = proc.stdout.strip().splitlines()[-1]
    started.append(cid)

    def ready():
        info = engine.inspect(cid)
        logs = engine.cli("logs", cid, check=False).stdout
        if info["State"]["Status"] not in ("running", "created", "configured"):
            raise AssertionError("the container stopped: %s %s" % (info["State"], logs))
        return "ready" in logs
    assert wait_until(ready, timeout=60, interval=0.2), "the container did not get ready"
    info = engine.inspect(cid)
    return {"id": cid, "name": name, "image": engine.image, "pid": info["State"]["Pid"], "restarts": info["RestartCount"]}


@pytest.fixture
def boxed_server(engine, sim_node, tmp_path):
    """``start(port, gpu=True)``: :func:`start_box` on the simulated node; removed by ID at the end."""
    started = []
    script = tmp_path / "boxed_server.py"
    script.write_text(SERVER)
    yield lambda port, gpu=True, secret="none": start_box(engine, started, script, sim_node.root, port, gpu, secret)
    for cid in started:                                      # by ID, whatever the test did
        engine.cli("rm", "--force", cid, check=False)


def preflight_args(sim_node, tmp_path, port, **extra):
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"]}')
    write_checkpoint(model, seed="issue24")
    args = {
        "name": "issue24", "label": "gpu-01", "args": {"model_path": str(model), "host": "127.0.0.1", "port": port},
        "gpus": ["0"], "config_dir": str(tmp_path / "etc"), "state_dir": str(tmp_path / "state"),
        "log_file": str(tmp_path / "log" / "server.log"), "nvidia_smi": str(SIM_BIN / "nvidia-smi"),
        "backend": "nvidia-smi", "device_paths": [os.path.join(str(sim_node.root), "dev", "nvidia*")], "resolution": "mirror",
        "manager": "process", "lease": {"path": str(tmp_path / "lease.json"), "run_id": "R24"},
    }
    args.update(extra)
    return args


def free_port():
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def assert_untouched(engine, box):
    after = engine.inspect(box["id"])
    assert after["State"]["Status"] == "running" and after["State"]["Pid"] == box["pid"]
    assert after["RestartCount"] == box["restarts"]
    assert os.path.exists("/proc/%d" % box["pid"])


def test_a_foreign_container_on_the_target_gpus_is_refused_named_and_left_running(engine, sim_node, tmp_path, boxed_server,
                                                                                  run_module):
    """Not on the managed port, not named in adopt_containers: refused whatever allow_foreign and adopt_pids say."""
    port = free_port()
    box = boxed_server(free_port())
    pid = box["pid"]
    # The simulated node sees the container's process as the holder of GPU 0 (by its host PID).
    assert sim_node.used(0) >= 1000 and str(pid) in sim_node.smi("--query-compute-apps=pid", "--format=csv,noheader").stdout
    short = box["id"][:12]
    env = engine.over(sim_node.env)
    for extra in ({}, {"allow_foreign": True}, {"adopt_pids": [pid]}, {"adopt_containers": ["some-other-box"]}):
        res = run_module("sglang_preflight", preflight_args(sim_node, tmp_path, port, **extra), env)
        assert res["failed"] is True, (extra, res.get("msg"))
        assert not (tmp_path / "lease.json").exists()
        plan = res["plan"]
        assert plan.get("port_owner") is None
        holder = [h for h in plan["holders"] if h["pid"] == pid]
        assert len(holder) == 1 and holder[0]["container"]["id"] == box["id"], plan["holders"]
        assert holder[0]["container"]["runtime"] == engine.runtime and holder[0]["container"]["restart_policy"] == "always"
        assert plan["teardown_pids"] == [], plan["teardown_pids"]          # never a signal to it, whatever the options
        refusal = [p for p in res["problems"] if "in the %s container" % engine.runtime in p]
        assert len(refusal) == 1, res["problems"]
        text = refusal[0]
        assert ("GPU holder PID %d (" % pid) in text
        assert ("%s container %s (id %s, image %s, restart policy always)" % (engine.runtime, box["name"], short, box["image"])) in text
        if engine.runtime == "docker":
            assert "`docker stop %s` and `docker update --restart=no %s`" % (box["name"], box["name"]) in text
        else:           # podman 4.3 cannot change the policy; `podman stop` is enough (verified below by the redeploy)
            assert "`podman stop %s` (podman does not restart a container stopped with `podman stop`" % box["name"] in text
        assert "name it in adopt_containers to have the teardown stop it" in text and "nothing was touched" in text  # the module, run directly
        # Not also reported as an ordinary foreign holder with fixes that would signal it.
        assert not any(p.startswith("the target GPUs are held by") for p in res["problems"]), res["problems"]
        if extra.get("adopt_pids"):
            assert ("teardown root PID %d" % pid) in text
        if extra.get("adopt_containers"):
            assert any("some-other-box names none of the containers" in n for n in res.get("notes") or []), res.get("notes")
    assert_untouched(engine, box)


@pytest.mark.parametrize("how", ["port", "name", "id"])
def test_the_preflight_adopts_the_port_owner_s_container_or_a_named_one(how, engine, sim_node, tmp_path, boxed_server,
                                                                        run_module):
    """The incident's ``docker run`` by hand on the managed port, with no extra variable; or a container named (or
    its id prefix) in adopt_containers. The plan lists it; nothing is touched by the preflight."""
    port = free_port()
    secret = "sk-issue24-" + os.urandom(8).hex()
    box = boxed_server(port if how == "port" else free_port(), secret=secret)
    pid = box["pid"]
    extra = {} if how == "port" else {"adopt_containers": [box["name"] if how == "name" else box["id"][:12]]}
    res = run_module("sglang_preflight", preflight_args(sim_node, tmp_path, port, **extra), engine.over(sim_node.env))
    assert res["failed"] is False, (res.get("msg"), res.get("problems"))
    plan = res["plan"]
    why = "serves on the managed port" if how == "port" else "named in adopt_containers (%s)" % extra["adopt_containers"][0]
    assert plan["containers"] == [{"runtime": engine.runtime, "id": box["id"], "name": box["name"], "image": box["image"],
                                   "restart_policy": "always", "why": why, "pids": [pid]}], plan["containers"]
    assert plan["teardown_pids"] == [] and pid in plan["expected_pids"]
    if how == "port":
        assert plan["port_owner"]["pid"] == pid and plan["port_owner"]["adoptable"] is True
        assert plan["running"]["source"] == "adopted (port owner, in a container)"
    else:
        assert plan.get("port_owner") is None
    # Its secret (environment, command line) is in no output.
    assert secret not in json.dumps(res)
    assert_untouched(engine, box)


def test_a_port_owner_in_its_own_pid_namespace_is_adopted_too(engine, sim_node, tmp_path, boxed_server, run_module):
    """The usual ``docker run`` (own PID namespace) holding no GPU on the managed port: found by the host PID the socket
    table gives, adopted as the port owner (it was refused before issue 24's adoption)."""
    port = free_port()
    box = boxed_server(port, gpu=False)
    res = run_module("sglang_preflight", preflight_args(sim_node, tmp_path, port), engine.over(sim_node.env))
    assert res["failed"] is False, (res.get("msg"), res.get("problems"))
    owner = res["plan"]["port_owner"]
    assert owner["pid"] == box["pid"] and owner["container"]["id"] == box["id"] and owner["adoptable"] is True
    assert res["plan"]["holders"] == [] and res["plan"]["teardown_pids"] == []
    assert [(c["id"], c["pids"]) for c in res["plan"]["containers"]] == [(box["id"], [box["pid"]])]
    assert_untouched(engine, box)


@pytest.fixture
def playbook_node(tmp_path):
    """A :class:`playbook_helpers.SimNode` for ``redeploy.yml``; every process it caused is SIGKILLed by PID at the end."""
    procs = ph.Procs()
    yield ph.SimNode(tmp_path / "node", procs)
    left = procs.cleanup()
    assert not left, "processes survived SIGKILL: %s" % left


@pytest.mark.parametrize("how", ["port", "name"])
def test_redeploy_stops_an_adopted_container_through_its_runtime_and_it_stays_stopped(how, engine, playbook_node, tmp_path):
    """The incident, with the hand-run server in a container (``--restart always``): ``redeploy.yml`` adopts it (as the
    port owner without any variable, or named in ``sglang_adopt_containers``), stops it through its runtime, starts
    the collection's server on the GPUs, and the container stays stopped: same id, exited, never restarted."""
    node = playbook_node
    started = []
    script = tmp_path / "boxed_server.py"
    script.write_text(SERVER)
    try:
        box = start_box(engine, started, script, node.root, node.port if how == "port" else ph.free_port(),
                        secret=node.api_key)
        assert node.used()[0] >= 1000                        # GPU 0 is held by the container's process
        env = engine.over(node.host_vars()["sglang_node_environment"])
        hv = node.host_vars(sglang_node_environment=env, sglang_server_cuda_visible_devices="0,1")
        if how == "name":
            hv["sglang_adopt_containers"] = [box["name"]]
        run = node.run(host_vars=hv)
        assert run.rc == 0, run.summary()

        plan = run.task_result(PREFLIGHT)["plan"]
        why = "serves on the managed port" if how == "port" else "named in adopt_containers (%s)" % box["name"]
        assert [(c["runtime"], c["id"], c["why"], c["pids"]) for c in plan["containers"]] == \
            [(engine.runtime, box["id"], why, [box["pid"]])], plan["containers"]
        assert box["pid"] not in plan["teardown_pids"]
        replaced = run.task_result(REPLACE)
        docker = engine.runtime == "docker"
        assert [(c["id"], c["name"], c["image"], c["restart_policy"], c["restart_policy_set"], c["stopped"])
                for c in replaced["containers_stopped"]] == [(box["id"], box["name"], box["image"], "always", docker, True)]
        assert all(item.get("pid") != box["pid"] for item in replaced.get("signalled") or []), replaced.get("signalled")
        line = "stopped through its runtime: %s container %s (id %s, image %s, restart policy always%s)" % (
            engine.runtime, box["name"], box["id"][:12], box["image"], ", turned off" if docker else "")
        assert line in replaced["lines"], replaced["lines"]
        assert "stopping %s container %s (id %s" % (engine.runtime, box["name"], box["id"][:12]) in json.dumps(node.journal())
        row = run.row()
        assert row["containers_stopped"] == [{"runtime": engine.runtime, "id": box["id"], "name": box["name"],
                                              "image": box["image"], "restart_policy": "always", "restart_policy_set": docker}]
        assert all(p.get("pid") != box["pid"] for p in row["signalled"]), row["signalled"]
        assert "- Stopped through its runtime: %s container %s (id %s, image %s, restart policy always%s)" % (
            engine.runtime, box["name"], box["id"][:12], box["image"], ", turned off" if docker else "") in run.report_md

        # The collection's server serves now; the container stays stopped (the run went on through the launch and the
        # smoke test after the stop: a restart policy would have started it again meanwhile).
        new = node.server_pid()
        assert new and ph.alive(new) and new != box["pid"] and node.health() == 200
        after = engine.inspect(box["id"])
        assert after["Id"] == box["id"] and after["State"]["Status"] == "exited", after["State"]
        assert after["RestartCount"] == box["restarts"]
        assert after["HostConfig"]["RestartPolicy"]["Name"] == ("no" if docker else "always")
        assert not ph.alive(box["pid"])
        # The secret in the container's env and command line is in no output, record or report.
        assert node.leaks() == []
    finally:
        for cid in started:                                  # by ID, whatever the test did
            engine.cli("rm", "--force", cid, check=False)


def test_a_failed_candidate_without_known_good_starts_the_adopted_container_again(engine, playbook_node, tmp_path):
    """The collection's first server crashes while loading and this node has no known-good config: the in-place
    rollback starts the adopted container again, its restart policy restored (docker), and no signal reaches it."""
    node = playbook_node
    started = []
    script = tmp_path / "boxed_server.py"
    script.write_text(SERVER)
    try:
        box = start_box(engine, started, script, node.root, node.port, secret=node.api_key)
        env = engine.over(node.host_vars()["sglang_node_environment"])
        hv = node.host_vars(sglang_node_environment=env, sglang_server_cuda_visible_devices="0,1",
                            server_env={"SGLANG_SIM_CRASH_ON_LOAD": "1"})
        run = node.run(host_vars=hv)
        assert run.rc != 0, run.summary()
        replaced = run.task_result(REPLACE)
        assert replaced["rollback"]["status"] == "unavailable", replaced.get("rollback")
        line = "started the adopted %s container %s (id %s" % (engine.runtime, box["name"], box["id"][:12])
        assert line in replaced["rollback"]["detail"], replaced["rollback"]
        assert [(c["id"], c["started"]) for c in replaced["containers_restarted"]] == [(box["id"], True)]
        after = engine.inspect(box["id"])
        assert after["State"]["Status"] == "running" and after["State"]["Pid"] != box["pid"], after["State"]
        assert after["HostConfig"]["RestartPolicy"]["Name"] == "always"
        # Its new process holds GPU 0 again and serves on the port; it was never signalled from the host.
        assert wait_until(lambda: node.used()[0] >= 1000, timeout=30, interval=0.2)
        assert all(p.get("pid") not in (box["pid"], after["State"]["Pid"]) for p in replaced.get("signalled") or [])
        assert node.leaks() == []
    finally:
        for cid in started:                                  # by ID, whatever the test did
            engine.cli("rm", "--force", cid, check=False)
