"""A server run by a container engine on the managed port and the target GPUs, against REAL podman (issue 24).

The container (``--restart always``, host network and host PID namespace so that its process holds a simulated GPU
by its host PID) runs a small "server": it listens on the managed port and holds 1000 MiB of GPU 0 through the
simulator (GPUSIM_ROOT and simulator/python bind-mounted at the same paths). Run on the host, that process would be
adopted as the port owner and SIGTERMed by the teardown; podman would then start it again. The preflight must refuse,
name the container (id, name, image, restart policy) and leave it running: same container id, same PID, no restart.

Needs podman and a local molecule node image (scripts/build-image.sh builds ``localhost/gpufleet-node:<tag>``);
podman runs with molecule/containers.conf (runc, explicit ulimits). Each container is removed by its ID at teardown.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap

import pytest

from conftest import REPO, SIM_BIN, SIM_PY, wait_until
from checkpoint_files import write_checkpoint

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


def podman(*args, check=True, timeout=120):
    env = dict(os.environ, CONTAINERS_CONF=str(CONF))
    proc = subprocess.run(["podman"] + [str(a) for a in args], env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)
    if check and proc.returncode != 0:
        raise AssertionError("podman %s failed (%d): %s" % (" ".join(str(a) for a in args), proc.returncode, proc.stderr))
    return proc


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


def inspect(cid):
    return json.loads(podman("container", "inspect", "--format", "json", cid).stdout)[0]


@pytest.fixture
def boxed_server(sim_node, tmp_path):
    """``start(port, gpu=True)`` -> ``{"id", "name", "image", "pid", "restarts"}`` of a running container serving ``port``.

    With ``gpu``, in the host PID namespace, holding GPU 0 by its host PID; without, in its own PID namespace (the
    usual ``docker run``), holding nothing."""
    started = []
    script = tmp_path / "boxed_server.py"
    script.write_text(SERVER)
    root = str(sim_node.root)

    def start(port, gpu=True):
        image = node_image()
        name = "gpufleet-issue24-%d-%d" % (os.getpid(), len(started))
        proc = podman("run", "-d", "--name", name, "--restart", "always", "--network", "host", "--pid", "host" if gpu else "private",
                      "-v", "%s:%s" % (root, root), "-v", "%s:%s:ro" % (SIM_PY, SIM_PY), "-v", "%s:/boxed_server.py:ro" % script,
                      "-e", "GPUSIM_ROOT=" + root, "-e", "PYTHONPATH=" + str(SIM_PY), image,
                      "python3", "/boxed_server.py", port, "hold" if gpu else "serve")
        cid = proc.stdout.strip().splitlines()[-1]
        started.append(cid)

        def ready():
            info = inspect(cid)
            logs = podman("logs", cid, check=False).stdout
            if info["State"]["Status"] not in ("running", "created", "configured"):
                raise AssertionError("the container stopped: %s %s" % (info["State"], logs))
            return "ready" in logs
        assert wait_until(ready, timeout=60, interval=0.2), "the container did not get ready"
        info = inspect(cid)
        return {"id": cid, "name": name, "image": image, "pid": info["State"]["Pid"], "restarts": info["RestartCount"]}

    yield start
    for cid in started:                                      # by ID, whatever the test did
        podman("rm", "--force", "--time", "0", cid, check=False)


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


def test_a_server_in_a_container_is_refused_named_and_left_running(sim_node, tmp_path, boxed_server, run_module):
    port = free_port()
    box = boxed_server(port)
    pid = box["pid"]
    # The simulated node sees the container's process as the holder of GPU 0 (by its host PID).
    assert sim_node.used(0) >= 1000 and str(pid) in sim_node.smi("--query-compute-apps=pid", "--format=csv,noheader").stdout
    short = box["id"][:12]
    for extra in ({}, {"allow_foreign": True}, {"adopt_pids": [pid]}):
        res = run_module("sglang_preflight", preflight_args(sim_node, tmp_path, port, **extra), sim_node.env)
        assert res["failed"] is True, (extra, res.get("msg"))
        assert not (tmp_path / "lease.json").exists()
        plan = res["plan"]
        owner = plan["port_owner"]
        assert owner["pid"] == pid and owner["adoptable"] is False and owner["managed"] is False
        assert owner["container"]["runtime"] == "podman" and owner["container"]["id"] == box["id"]
        assert owner["container"]["name"] == box["name"] and owner["container"]["image"] == box["image"]
        assert owner["container"]["restart_policy"] == "always" and owner["container"]["inspected"] is True
        assert [(h["pid"], h["container"]["id"]) for h in plan["holders"]] == [(pid, box["id"])], plan["holders"]
        assert plan["teardown_pids"] == [], plan["teardown_pids"]          # never a signal to it, whatever the options
        assert plan.get("running") is None, plan.get("running")  # (left out of a lean failure; None at -v)
        refusal = [p for p in res["problems"] if "in the podman container" in p]
        assert len(refusal) == 1, res["problems"]
        text = refusal[0]
        assert ("PID %d (python3 /boxed_server.py %d hold) on port %d" % (pid, port, port)) in text
        assert ("GPU holder PID %d (" % pid) in text
        assert ("podman container %s (id %s, image %s, restart policy always)" % (box["name"], short, box["image"])) in text
        assert "does not adopt, stop or signal a process in a container" in text
        assert "`podman stop %s` and `podman update --restart=no %s`" % (box["name"], box["name"]) in text
        assert "not managed by this collection yet" in text and "nothing was touched" in text
        # Not also reported as an ordinary foreign holder with fixes that would signal it.
        assert not any(p.startswith("the target GPUs are held by") for p in res["problems"]), res["problems"]
        if extra.get("adopt_pids"):
            assert ("teardown root PID %d" % pid) in text
    # Untouched: the same container, the same process, never restarted.
    after = inspect(box["id"])
    assert after["State"]["Status"] == "running" and after["State"]["Pid"] == pid
    assert after["RestartCount"] == box["restarts"]
    assert os.path.exists("/proc/%d" % pid)


def test_the_same_container_without_the_gpu_is_still_refused_as_port_owner(sim_node, tmp_path, boxed_server, run_module):
    """A port owner in its own PID namespace that holds no GPU was refused before too; now the refusal names its
    container (found by the host PID the socket table gives)."""
    port = free_port()
    box = boxed_server(port, gpu=False)
    res = run_module("sglang_preflight", preflight_args(sim_node, tmp_path, port), sim_node.env)
    assert res["failed"] is True
    owner = res["plan"]["port_owner"]
    assert owner["container"]["id"] == box["id"] and owner["adoptable"] is False
    assert res["plan"]["holders"] == []
    text = [p for p in res["problems"] if "in the podman container" in p]
    assert len(text) == 1 and ("on port %d runs in the podman container %s" % (port, box["name"])) in text[0]
    after = inspect(box["id"])
    assert after["State"]["Status"] == "running" and after["State"]["Pid"] == box["pid"]
    assert after["RestartCount"] == box["restarts"]
