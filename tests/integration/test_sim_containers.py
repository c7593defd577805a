"""The simulator sees a containerised GPU process the way NVML does, against REAL podman (issue 24).

A container in its own PID namespace (podman's default, no ``--pid host``) is given simulated GPUs through CDI
(``sim_cdi.cdi_gpus``: ``--device nvidia.com/gpu=2 --device nvidia.com/gpu=3``). Inside, a small script takes its
GPUs from ``Node.resolve_visible`` (only the /dev/nvidia<N> present, ``GPUSIM_CDI=1`` from the spec) and holds them
with ``Node.hold(os.getpid())``: its in-container PID (1). On the host, ``nvidia-smi --query-compute-apps`` lists the
HOST PID (``podman inspect`` ``State.Pid``), on GPUs 2 and 3 only, as NVML does; ``podman stop`` ends the process
and its memory is free (the simulator finds the host PID through the namespace, so it sees it die).

simulator/python and the node's GPUSIM_ROOT are bind-mounted at the same paths; host network. Needs root, podman and
the molecule node image (scripts/build-image.sh). Every container is removed by its ID at teardown.
"""
from __future__ import annotations

import json
import os
import textwrap

import pytest

from conftest import SIM_PY, wait_until
from sim_cdi import cdi_gpus  # noqa: F401  (the fixture)
from test_containers import node_image, podman

HOLDER = textwrap.dedent(r'''
    import json, os, signal, sys
    from gpusim.node import Node
    node = Node(os.environ["GPUSIM_ROOT"])
    visible = node.resolve_visible(os.environ.get("CUDA_VISIBLE_DEVICES"))
    node.hold(os.getpid(), gpus=visible, mib=1000, name="python3")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))   # PID 1 has no default SIGTERM action
    print("ready " + json.dumps({"visible": visible, "pid": os.getpid(),
                                 "dev": sorted(n for n in os.listdir("/dev") if n.startswith("nvidia"))}), flush=True)
    while True:
        signal.pause()
''')


@pytest.fixture(scope="module")
def image():
    return node_image()


@pytest.fixture
def boxes():
    started = []
    yield started
    for cid in started:                                      # by ID, whatever the test did
        podman("rm", "--force", cid, check=False)


def run_holder(image, boxes, sim_node, tmp_path, devices, env=()):
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    root = str(sim_node.root)
    args = ["run", "-d", "--network", "host"]
    for dev in devices:
        args += ["--device", dev]
    for kv in env:
        args += ["-e", kv]
    args += ["-v", "%s:%s" % (root, root), "-v", "%s:%s:ro" % (SIM_PY, SIM_PY), "-v", "%s:/holder.py:ro" % script,
             "-e", "GPUSIM_ROOT=" + root, "-e", "PYTHONPATH=" + str(SIM_PY), image, "python3", "/holder.py"]
    cid = podman(*args).stdout.strip().splitlines()[-1]
    boxes.append(cid)

    def ready():
        logs = podman("logs", cid, check=False).stdout
        state = json.loads(podman("container", "inspect", cid).stdout)[0]["State"]
        if state["Status"] not in ("running", "created", "configured"):
            raise AssertionError("the container stopped: %s\n%s\n%s" % (state, logs, podman("logs", cid, check=False).stderr))
        return [line for line in logs.splitlines() if line.startswith("ready ")]
    lines = wait_until(ready, timeout=60, interval=0.2)
    assert lines, "the container did not get ready: %s" % podman("logs", cid, check=False).stderr
    info = json.loads(lines[-1][len("ready "):])
    info["id"] = cid
    info["host_pid"] = json.loads(podman("container", "inspect", cid).stdout)[0]["State"]["Pid"]
    return info


def compute_apps(sim_node):
    """``[(gpu index, pid, MiB)]`` from the host's nvidia-smi."""
    uuids = {}
    for line in sim_node.smi("--query-gpu=index,uuid", "--format=csv,noheader").stdout.splitlines():
        idx, uuid = [x.strip() for x in line.split(",")]
        uuids[uuid] = int(idx)
    proc = sim_node.smi("--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits")
    assert proc.returncode == 0, proc.stderr
    rows = []
    for line in proc.stdout.splitlines():
        uuid, pid, mib = [x.strip() for x in line.split(",")]
        rows.append((uuids[uuid], int(pid), int(mib)))
    return rows


def stop_and_check_free(box, sim_node, gpus):
    before = {g: sim_node.used(g) for g in gpus}
    podman("stop", "-t", "5", box["id"])
    state = json.loads(podman("container", "inspect", box["id"]).stdout)[0]["State"]
    assert state["Status"] == "exited", state
    assert compute_apps(sim_node) == []
    for g in gpus:
        assert sim_node.used(g) == before[g] - 1000, (g, before, sim_node.used(g))
    assert sim_node.status()["holds"] == []


def test_a_container_with_two_cdi_gpus_is_listed_under_its_host_pid_and_freed_when_stopped(image, boxes, sim_node,
                                                                                             tmp_path, cdi_gpus):
    box = run_holder(image, boxes, sim_node, tmp_path, [cdi_gpus["device"](2), cdi_gpus["device"](3)])
    assert box["dev"] == ["nvidia2", "nvidia3"], box            # only the device files CDI put there
    assert box["visible"] == [2, 3], box                        # CUDA ordinals 0, 1 = host GPUs 2, 3
    assert box["pid"] != box["host_pid"], box                   # its own PID namespace
    assert box["host_pid"] > 0
    assert compute_apps(sim_node) == [(2, box["host_pid"], 1000), (3, box["host_pid"], 1000)]
    hold, = sim_node.status()["holds"]
    assert hold["pid"] == box["pid"] and hold["display_pid"] == box["host_pid"], hold
    assert hold["pidns"] == "pid:[%d]" % os.stat("/proc/%d/ns/pid" % box["host_pid"]).st_ino, hold
    assert hold["pidns"] != os.readlink("/proc/self/ns/pid")
    table = sim_node.smi().stdout
    assert " %d " % box["host_pid"] in table and "python3" in table, table
    stop_and_check_free(box, sim_node, [2, 3])


def test_cuda_visible_devices_indexes_the_container_s_cdi_gpus(image, boxes, sim_node, tmp_path, cdi_gpus):
    box = run_holder(image, boxes, sim_node, tmp_path, [cdi_gpus["device"](2), cdi_gpus["device"](3)],
                     env=["CUDA_VISIBLE_DEVICES=1"])
    assert box["visible"] == [3], box                           # ordinal 1 of (2, 3)
    assert compute_apps(sim_node) == [(3, box["host_pid"], 1000)]
    assert sim_node.used(2) == sim_node.used(0)                 # GPU 2 untouched
    stop_and_check_free(box, sim_node, [3])
