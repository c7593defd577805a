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
import signal
import subprocess
import textwrap
import urllib.request

import pytest

from conftest import SIM_BIN, SIM_PY, wait_until
from sim_cdi import cdi_gpus  # noqa: F401  # pylint: disable=unused-import
from test_containers import free_port, node_image, podman

HOLDER = textwrap.dedent(r'''
    import json, os, signal, sys
    from gpusim.node import Node
    node = Node(os.environ["GPUSIM_ROOT"])
    visible = node.resolve_visible(os.environ.get("CUDA_VISIBLE_DEVICES"))
    node.hold(os.getpid(), gpus=visible, mib=1000, name="python3")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))   # PID 1 of a namespace: no default action, exits here
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
    args = ["run", "-d", "--network", "host", "--stop-signal", "TERM"]   # the node image's own is SIGRTMIN+3 (37)
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
    assert state["Status"] == "exited" and state["ExitCode"] == 0, state     # exited on SIGTERM, no cudaFree
    assert compute_apps(sim_node) == []
    for g in gpus:
        assert sim_node.used(g) == before[g] - 1000, (g, before, sim_node.used(g))
    assert sim_node.status()["holds"] == []


def test_a_container_with_two_cdi_gpus_is_listed_under_its_host_pid_and_freed_when_stopped(
        image, boxes, sim_node, tmp_path, cdi_gpus):
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


def _children(pid):
    out = []
    for task in os.listdir("/proc/%d/task" % pid):
        with open("/proc/%d/task/%s/children" % (pid, task)) as fh:
            out += [int(x) for x in fh.read().split()]
    return out


def _host_pid_of(root_pid, inner_pid):
    """Among the descendants of ``root_pid`` (host PIDs), the one that is ``inner_pid`` in its own namespace."""
    todo, seen = [root_pid], []
    while todo:
        pid = todo.pop()
        seen.append(pid)
        todo += _children(pid)
    for pid in seen:
        with open("/proc/%d/status" % pid) as fh:
            nspid = [line.split()[1:] for line in fh if line.startswith("NSpid:")][0]
        if len(nspid) > 1 and int(nspid[-1]) == inner_pid:
            return pid
    raise AssertionError("no descendant of %d is PID %d in its namespace" % (root_pid, inner_pid))


def test_holds_from_another_pid_namespace_are_listed_released_and_reaped_by_host_pid(sim_node, procs):
    """``unshare --pid`` (no container engine): two ``gpusim hold`` inside; host readers see host PIDs, name the
    process, release by host PID, and count a forked child's memory (unlisted) until that child dies too; a reader in
    the namespace lists the host PID with ``[Not Found]``, as nvidia-smi in a container does."""
    script = ("gpusim hold --gpus 0 --mib 500 --name ns-holder --children 1 --json; "
              "gpusim hold --gpus 1 --mib 300 --name ns-other --json; exec sleep 600")
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", script], env=sim_node.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    procs.popens.append(proc)
    procs.track(proc.pid)
    first, second = json.loads(proc.stdout.readline()), json.loads(proc.stdout.readline())
    init = _children(proc.pid)[0]                      # sleep: PID 1 of the namespace
    procs.track(init)
    holder, other = _host_pid_of(proc.pid, first["pid"]), _host_pid_of(proc.pid, second["pid"])
    keeper = _host_pid_of(proc.pid, first["keepers"][0])
    for pid in (holder, other, keeper):
        procs.track(pid)
    assert holder != first["pid"] and other != second["pid"]
    rows = sim_node.smi("--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader").stdout
    assert rows.splitlines() == ["%d, ns-holder, 500 MiB" % holder, "%d, ns-other, 300 MiB" % other], rows
    inside = subprocess.run(["nsenter", "-t", str(init), "-p", "-m", str(SIM_BIN / "nvidia-smi"),
                             "--query-compute-apps=pid,process_name", "--format=csv,noheader"],
                            env=sim_node.env, capture_output=True, text=True, timeout=60, check=False)
    assert inside.stdout.splitlines() == ["%d, [Not Found]" % holder, "%d, [Not Found]" % other], inside

    assert sim_node.gpusim("release", "--pid", other).stdout.strip() == "1"   # by its host PID
    assert os.path.exists("/proc/%d" % other) and sim_node.used(1) == sim_node.used(2)
    hid = sim_node.gpusim("attach", "--pid", other, "--gpus", "1", "--mib", "100").stdout.strip()   # from the host
    hold, = [h for h in sim_node.status()["holds"] if h["id"] == hid]
    assert (hold["pid"], hold["host_pid"], hold["display_pid"]) == (second["pid"], other, other), hold
    assert sim_node.gpusim("release", "--pid", other).stdout.strip() == "1"

    os.kill(holder, signal.SIGKILL)
    assert wait_until(lambda: not sim_node.smi("--query-compute-apps=pid", "--format=csv,noheader").stdout.strip())
    assert sim_node.used(0) == sim_node.used(2) + 500            # the forked child keeps it, unlisted
    os.kill(keeper, signal.SIGKILL)
    assert wait_until(lambda: sim_node.used(0) == sim_node.used(2))
    assert sim_node.status()["holds"] == []
    os.kill(init, signal.SIGKILL)                                # ends the namespace
    proc.wait(timeout=30)


def _descendants(pid):
    todo, out = [pid], []
    while todo:
        p = todo.pop()
        out.append(p)
        todo += _children(p)
    return out


def test_the_fake_sglang_server_in_a_container_shows_its_schedulers_host_pids(image, boxes, sim_node, tmp_path, cdi_gpus):
    """The issue-24 case: ``python -m sglang.launch_server --tp-size 2`` in a container given GPUs 2 and 3; its
    schedulers hold by their in-container PIDs, nvidia-smi on the host lists their host PIDs; a stop frees both."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"]}')
    port = free_port()
    root = str(sim_node.root)
    cid = podman("run", "-d", "--network", "host", "--device", cdi_gpus["device"](2), "--device", cdi_gpus["device"](3),
                 "-v", "%s:%s" % (root, root), "-v", "%s:%s:ro" % (SIM_PY, SIM_PY), "-v", "%s:%s:ro" % (model, model),
                 "-e", "GPUSIM_ROOT=" + root, "-e", "PYTHONPATH=" + str(SIM_PY), "-e", "SGLANG_SIM_STARTUP_S=0.2",
                 "-e", "SGLANG_SIM_WARMUP_S=0.1", "-e", "SGLANG_SIM_KILL_RELEASE_S=0", image,
                 "python3", "-m", "sglang.launch_server", "--model-path", str(model), "--tp-size", "2",
                 "--host", "127.0.0.1", "--port", port).stdout.strip().splitlines()[-1]
    boxes.append(cid)

    def healthy():
        state = json.loads(podman("container", "inspect", cid).stdout)[0]["State"]
        assert state["Status"] in ("running", "created", "configured"), (state, podman("logs", cid, check=False))
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=2) as resp:
                return resp.status == 200
        except (OSError, ValueError):
            return False
    assert wait_until(healthy, timeout=90, interval=0.3), podman("logs", cid, check=False).stderr[-3000:]
    main = json.loads(podman("container", "inspect", cid).stdout)[0]["State"]["Pid"]
    schedulers = []
    for pid in _descendants(main):
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            if fh.read().startswith(b"sglang::scheduler_TP"):
                schedulers.append(pid)
    assert len(schedulers) == 2, schedulers
    rows = compute_apps(sim_node)
    assert sorted(row[0] for row in rows) == [2, 3], rows
    assert sorted(row[1] for row in rows) == sorted(schedulers), (rows, schedulers)
    assert all(row[2] > 1000 for row in rows), rows
    podman("stop", "-t", "2", cid)     # PID 1 ignores the image's stop signal (37): SIGKILL after 2 s
    assert json.loads(podman("container", "inspect", cid).stdout)[0]["State"]["ExitCode"] == 137
    assert wait_until(lambda: compute_apps(sim_node) == [])
    assert sim_node.used(2) == sim_node.used(3) == sim_node.used(0)
