"""The execution environment, built and used: ``ansible-builder build`` of execution-environment.yml
on a local base image (scripts/matrix-ee.sh), then the incident redeploy inside the built EE, the way
AWX runs a job: ``ansible-runner run`` of the AWX project (docs/awx/runner-example) in the EE
container, as the image's own user.

The simulated node is local to the EE container (``ansible_connection: local``), because the
container shares no process table with this machine. The test support comes from the checkout:
``simulator/`` is bind-mounted read-only at its own path, and the node's directories (GPUSIM_ROOT,
models, state, reports, the runner's private data dir) sit in a temporary directory mounted at its own
path too, so that ``playbook_helpers.SimNode`` lays them out and this test reads the results. The
container has no network (``--network=none``): only its loopback. It is removed by its exact name at the
end, and every process in it goes with it.

Run: ``.venv/bin/python -m pytest tests/matrix/test_execution_environment.py`` (the ``ee`` stage).
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import secrets
import shutil
import subprocess
import sys
import time

import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "integration"))

from playbook_helpers import FAST_SERVER_ENV, RESOLVED_SPEC, SIM_BIN, SIM_PY, Procs, SimNode  # noqa: E402

CONTAINERS_CONF = str(REPO / "molecule" / "containers.conf")
NODE_PYTHON = "/usr/bin/python3"      # the node's Python inside the EE image (Debian's python3.11)
RUNNER_EXAMPLE = REPO / "docs" / "awx" / "runner-example"


def _podman(*args, timeout=300, check=True):
    env = dict(os.environ, CONTAINERS_CONF=os.environ.get("CONTAINERS_CONF", CONTAINERS_CONF))
    proc = subprocess.run(["podman"] + [str(a) for a in args], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    if check and proc.returncode != 0:
        what = " ".join(map(str, args[:3]))
        raise AssertionError("podman %s: rc %d\n%s\n%s" % (what, proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:]))
    return proc


@pytest.fixture(scope="module")
def ee_image():
    env = dict(os.environ, CONTAINERS_CONF=os.environ.get("CONTAINERS_CONF", CONTAINERS_CONF))
    proc = subprocess.run(["bash", str(REPO / "scripts" / "matrix-ee.sh")], cwd=str(REPO), env=env,
                          capture_output=True, text=True, timeout=1200, check=False)
    assert proc.returncode == 0, proc.stderr[-5000:]
    image = proc.stdout.strip().splitlines()[-1]
    assert image.startswith("localhost/gpufleet-sglang-ee:"), proc.stdout
    return image


@pytest.fixture
def container(ee_image, tmp_path):
    """A running EE container (idle), with the simulator and the work directory mounted at their own paths."""
    work = tmp_path / "work"
    work.mkdir()
    name = "gpufleet-ee-test-%s" % secrets.token_hex(4)
    _podman("run", "-d", "--name", name, "--pull=never", "--network=none",
            "--label", "gpufleet.test=execution-environment",
            "-v", "%s:%s:ro" % (REPO / "simulator", REPO / "simulator"),
            "-v", "%s:%s" % (work, work),
            ee_image, "sleep", "3600")
    try:
        yield {"name": name, "work": work, "image": ee_image}
    finally:
        _podman("rm", "--force", "--time", "0", name, check=False)


def _exec(c, *argv, env=None, detach=False, timeout=300, check=True):
    args = ["exec"] + (["-d"] if detach else [])
    for key, value in (env or {}).items():
        args += ["-e", "%s=%s" % (key, value)]
    return _podman(*(args + [c["name"]] + list(argv)), timeout=timeout, check=check)


def _give_to_the_ee_user(path, uid):
    """The EE runs as its image's user (uid 1000, group 0), which on this local node is the service user
    too: the role sets the owner and mode of the server's directories, and only their owner may."""
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.lchown(os.path.join(root, name), uid, 0)
    os.chown(path, uid, 0)


def _server_info(c, node, api_key):
    script = ("import json, os, urllib.request\n"
              "r = urllib.request.Request(os.environ['U'] + '/server_info',"
              " headers={'Authorization': 'Bearer ' + os.environ['K']})\n"
              "print(json.dumps(json.load(urllib.request.urlopen(r, timeout=10))))\n")
    return json.loads(_exec(c, NODE_PYTHON, "-c", script, env={"U": node.url, "K": api_key}).stdout)


def _wait_healthy(c, node, timeout=60):
    script = ("import os, time, urllib.request\n"
              "end = time.monotonic() + float(os.environ['T'])\n"
              "while True:\n"
              "    try:\n"
              "        urllib.request.urlopen(os.environ['U'] + '/health', timeout=2); break\n"
              "    except Exception:\n"
              "        if time.monotonic() > end: raise\n"
              "        time.sleep(0.2)\n")
    _exec(c, NODE_PYTHON, "-c", script, env={"U": node.url, "T": timeout}, timeout=timeout + 30)


def test_the_ee_holds_the_collection_and_the_pinned_controller(container):
    out = _exec(container, "bash", "-c", "ansible --version; ansible-runner --version; "
                "ansible-galaxy collection list --format json").stdout
    assert "ansible [core 2.19.14]" in out, out
    # Every Python package of the EE at the version CI tested (requirements/dev.lock, through PIP_CONSTRAINT):
    # ansible-core's transitive dependencies (cryptography, ...) included.
    frozen = _exec(container, "python3", "-m", "pip", "freeze", "--all").stdout.splitlines()
    locked = {}
    for line in (REPO / "requirements" / "dev.lock").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            locked[re.sub(r"[-_.]+", "-", name).lower()] = version.strip()
    held = dict((re.sub(r"[-_.]+", "-", n).lower(), v) for n, v in (line.split("==", 1) for line in frozen if "==" in line))
    assert "cryptography" in held, frozen
    # ansible-builder pins dumb-init itself (its ee_schema: dumb-init==1.2.5).
    assert held.get("dumb-init") == "1.2.5", frozen
    off = dict((n, (v, locked.get(n))) for n, v in held.items()
               if n not in ("pip", "setuptools", "wheel", "dumb-init") and locked.get(n) != v)
    assert not off, "EE packages outside requirements/dev.lock (installed, locked): %s" % off
    listed = json.loads(out[out.index("{"):])
    # ansible-core 2.19 also lists its internal ansible._protomatter; the collection is there once.
    ours = [path for path, found in listed.items() if "gpufleet.sglang" in found]
    assert ours == ["/usr/share/ansible/collections/ansible_collections"], listed
    assert set(listed[ours[0]]) == {"gpufleet.sglang"}, listed
    # The system packages the collection declares (meta/execution-environment.yml -> meta/ee-bindep.txt): the
    # OpenSSH client, which ansible-builder installed through bindep (the Debian base has none).
    ssh = _exec(container, "ssh", "-V")
    assert "OpenSSH" in ssh.stdout + ssh.stderr, ssh.stdout + ssh.stderr
    # The tarball's collection only: no test support came along.
    files = _exec(container, "ls", "/usr/share/ansible/collections/ansible_collections/gpufleet/sglang").stdout.split()
    assert "simulator" not in files and "tests" not in files and "plugins" in files, files


def test_incident_redeploy_inside_the_ee(container, tmp_path):
    procs = Procs()   # nothing of this test runs outside the container; kept for SimNode
    node = SimNode(container["work"] / "node", procs)
    node_env = {"GPUSIM_ROOT": str(node.root), "PATH": "%s:/usr/local/bin:/usr/bin:/bin" % SIM_BIN,
                "PYTHONPATH": str(SIM_PY), "NO_PROXY": "*"}
    # The AWX project and settings, with an inventory for the simulated node and no router.
    pdd = container["work"] / "runner"
    shutil.copytree(RUNNER_EXAMPLE, pdd)
    host_vars = node.host_vars(
        ansible_python_interpreter=NODE_PYTHON,
        sglang_server_python=NODE_PYTHON,
        sglang_node_environment={"GPUSIM_ROOT": node_env["GPUSIM_ROOT"], "PATH": node_env["PATH"]},
    )
    (pdd / "inventory" / "hosts.yml").write_text(yaml.safe_dump(
        {"all": {"children": {"gpu-nodes": {"hosts": {"node1": host_vars}}}}}))
    (pdd / "env" / "extravars").write_text(yaml.safe_dump({"sglang_hosts": "gpu-nodes", "sglang_serial": 1}))
    uid = int(_exec(container, "id", "-u").stdout.strip())
    assert uid != 0, "the EE image should not run as root"
    _give_to_the_ee_user(container["work"], uid)
    # The node is the EE container here: its simulated GPUs are set up again from inside it, so that the simulator's
    # host PID namespace is the container's (a server there is a host process of this node, as nvidia-smi lists it).
    _exec(container, str(SIM_BIN / "gpusim"), "init", "--gpus", "8", "--model", "H200", env=node_env)

    # The incident server, started by hand inside the EE container (its own session), as on the node.
    argv = [NODE_PYTHON] + node.server_argv(node.server_args())[1:]
    _exec(container, "setsid", *argv, env=dict(node_env, **FAST_SERVER_ENV), detach=True)
    _wait_healthy(container, node)
    assert _server_info(container, node, node.api_key)["speculative_num_draft_tokens"] == 2

    began = time.monotonic()
    run = _exec(container, "ansible-runner", "run", str(pdd), "-p", "redeploy.yml", "--ident", "ee", check=False,
                timeout=600)
    artifacts = pdd / "artifacts" / "ee"
    stdout = (artifacts / "stdout").read_text(errors="replace") if (artifacts / "stdout").exists() else run.stdout
    assert run.returncode == 0, "ansible-runner in the EE: rc %d after %.0f s\n%s\n%s" % (
        run.returncode, time.monotonic() - began, stdout[-5000:], run.stderr[-2000:])
    assert (artifacts / "status").read_text().strip() == "successful"
    assert (artifacts / "rc").read_text().strip() == "0"
    command = json.loads((artifacts / "command").read_text())
    assert command["command"][0] == "ansible-playbook", command

    reports = sorted(node.reports.glob("*-redeploy.json"))
    assert len(reports) == 1, reports
    rows = json.loads(reports[0].read_text())
    assert [r["host"] for r in rows] == ["node1"] and rows[0]["status"] == "deployed", rows
    assert {k: rows[0]["effective_args"][k] for k in RESOLVED_SPEC} == RESOLVED_SPEC
    info = _server_info(container, node, node.api_key)
    assert {k: info[k] for k in RESOLVED_SPEC} == RESOLVED_SPEC
    # The key never reached the runner's artifacts (events, stdout).
    for path in artifacts.rglob("*"):
        if path.is_file():
            assert node.api_key not in path.read_text(errors="replace"), path
