"""Teardown benchmark: the operators' manual sequence against gpu_drain + gpu_memory_assert.

Per case and run, on one simulated node (2 x H200, GPUSIM_ROOT under the work
directory), a `gpusim hold --gpus 0,1 --mib 70000 --release-delay 0.3` holder is
started and then stopped by:

* manual: SIGTERM, sleep 2, SIGKILL, sleep 2, one nvidia-smi check, applied to
  the holder's PID only (through a pidfd, so a reused PID is never signalled);
* ansible: one `ansible-playbook` run of a two-task play against the node (local
  connection): gpufleet.sglang.gpu_drain (term_timeout 2, the manual sleep),
  then gpufleet.sglang.gpu_memory_assert (state free, sleep 0.5, timeout 30).
  This is what the gpu_teardown and gpu_verify roles do in redeploy.yml.

A third, diagnostic case (slow-release: memory back 10 s after the exit) makes
gpu_memory_assert poll while the memory is released, so its detection latency
is that of the polling; in the first two the memory is usually back before the
assert task has started, and the latency is Ansible's task start-up.

Detection latency: "last byte freed" is the hold's exited_at + release_delay
(stamped by the simulator's watcher when it reaps the holder, read from the
hold record); "success" is the end of gpu_memory_assert's final poll, taken
from a timestamping wrapper around nvidia-smi that only the assert task uses.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time

import _common as c

CASES = [
    ("graceful", ["--exit-delay", "0.5", "--release-delay", "0.3"],
     "exits 0.5 s after SIGTERM, memory freed 0.3 s after exit"),
    ("ignore-sigterm", ["--ignore-sigterm", "--release-delay", "0.3"],
     "ignores SIGTERM (SIG_IGN), memory freed 0.3 s after SIGKILL"),
    # Diagnostic: the memory comes back 10 s after the exit (as after a SIGKILL on a busy GPU), so
    # gpu_memory_assert is already polling when it does and the detection latency measures the polling
    # itself, not the time Ansible takes to start the next task. Not part of the ratio goal.
    ("slow-release", ["--exit-delay", "0.5", "--release-delay", "10"],
     "diagnostic: exits 0.5 s after SIGTERM, memory freed 10 s after exit"),
]
GPUS = "0,1"
MIB = 70000
TERM_TIMEOUT = 2.0
ASSERT_SLEEP = 0.5
MANUAL_SLEEP = 2.0
FREE_MIB = 16

PLAYBOOK = """---
- name: Teardown benchmark (gpu_drain + gpu_memory_assert, as the roles run them)
  hosts: bench-node
  gather_facts: false
  environment:
    GPUSIM_ROOT: {root}
    PATH: {path}
  tasks:
    - name: Drain GPUs 0,1
      gpufleet.sglang.gpu_drain:
        gpus: [0, 1]
        term_timeout: {term_timeout}
        nvidia_smi: {smi}
        device_paths: ["{root}/dev/nvidia*"]
    - name: Verify GPUs 0,1 are free
      gpufleet.sglang.gpu_memory_assert:
        gpus: [0, 1]
        state: free
        timeout: 30
        sleep: {sleep}
        nvidia_smi: {smi_timed}
        device_paths: ["{root}/dev/nvidia*"]
"""

INVENTORY = """---
all:
  hosts:
    bench-node:
      ansible_connection: local
      ansible_python_interpreter: {python}
"""

# Logs "<start> <end> <args>" (epoch seconds) per call, after the call.
TIMED_SMI = """#!/bin/bash
s=$EPOCHREALTIME
{smi} "$@"
rc=$?
printf '%s %s %s\\n' "$s" "$EPOCHREALTIME" "$*" >> {log}
exit $rc
"""


class HoldWatch(threading.Thread):
    """Reads holds/<id>.json until exited_at is stamped: wakes on the holder's pidfd, no busy loop."""

    def __init__(self, root, hold_id, pid):
        super(HoldWatch, self).__init__(daemon=True)
        self.path = os.path.join(root, "holds", hold_id + ".json")
        self.pid = pid
        self.exited_at = None
        self.release_delay = None
        self.stop = threading.Event()

    def _read(self):
        try:
            with open(self.path) as fh:
                rec = json.load(fh)
        except (OSError, ValueError):
            return None
        self.release_delay = rec.get("release_delay")
        return rec.get("exited_at")

    def run(self):
        self._read()
        fd = None
        try:
            fd = os.pidfd_open(self.pid)
            import select  # pylint: disable=import-outside-toplevel
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            while not self.stop.is_set() and not poller.poll(100):
                pass
        except (AttributeError, OSError):
            pass
        finally:
            if fd is not None:
                os.close(fd)
        while not self.stop.is_set():
            at = self._read()
            if at is not None:
                self.exited_at = at
                return
            time.sleep(0.002)

    @property
    def freed_at(self):
        if self.exited_at is None:
            return None
        return self.exited_at + (self.release_delay or 0.0)


def wait_idle(root, timeout=30.0):
    """Wait until the node holds nothing (a slow-release hold of the previous run may still count)."""
    from gpusim.node import Node  # pylint: disable=import-outside-toplevel
    node = Node(root)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not [h for h in node.holds() if h.get("counted")]:
            return
        time.sleep(0.1)


def start_holder(env, extra):
    out = subprocess.run([c.GPUSIM, "hold", "--gpus", GPUS, "--mib", str(MIB), "--name", "bench-holder", "--json"] + extra,
                         env=env, check=True, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL).stdout
    info = json.loads(out.decode())
    holder = c.REGISTRY.add(info["pid"], "gpusim holder")
    if info.get("watcher_pid"):
        c.REGISTRY.add(info["watcher_pid"], "gpusim watcher")
    return info, holder


def cleanup_holder(info):
    items = [i for i in c.REGISTRY.items if i.pid in (info["pid"], info.get("watcher_pid"))]
    c.REGISTRY.stop(items, grace=2.0)


def run_manual(env, root, extra):
    wait_idle(root)
    info, holder = start_holder(env, extra)
    watch = HoldWatch(root, info["id"], info["pid"])
    watch.start()
    t0 = time.time()
    m0 = time.monotonic()
    holder.send(signal.SIGTERM)
    time.sleep(MANUAL_SLEEP)
    killed = holder.send(signal.SIGKILL)
    time.sleep(MANUAL_SLEEP)
    out = subprocess.run([c.NVIDIA_SMI, "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                         env=env, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, check=False).stdout.decode()
    wall = time.monotonic() - m0
    checked = t0 + wall
    used = [int(line.split(",")[1]) for line in out.strip().splitlines() if line.strip()]
    watch.join(5)
    watch.stop.set()
    cleanup_holder(info)
    return {
        "wall": wall,
        "sigkill_sent": killed,
        "free_at_check": bool(used) and max(used) <= FREE_MIB,
        "freed_at": watch.freed_at,
        "detection_latency": (checked - watch.freed_at) if watch.freed_at else None,
    }


def _task(timing, action_suffix):
    for rec in timing or []:
        if rec["action"].endswith(action_suffix):
            return rec
    return None


def run_ansible(env, root, extra, files, workdir, n):
    wait_idle(root)
    info, dummy = start_holder(env, extra)
    watch = HoldWatch(root, info["id"], info["pid"])
    watch.start()
    if os.path.exists(files["smi_log"]):
        os.unlink(files["smi_log"])
    res = c.run_playbook(["-i", files["inventory"], files["playbook"]], env,
                         os.path.join(workdir, "ansible-%s-%d.log" % (files["case"], n)), workdir)
    watch.join(5)
    watch.stop.set()
    cleanup_holder(info)
    drain = _task(res["timing"], "gpu_drain")
    check = _task(res["timing"], "gpu_memory_assert")
    polls = []
    if os.path.exists(files["smi_log"]):
        with open(files["smi_log"]) as fh:
            for line in fh:
                start, end, args = line.split(" ", 2)
                polls.append((float(start), float(end), args.strip()))
    out = {
        "rc": res["rc"],
        "wall": res["wall"],
        "cpu": res["cpu"],
        "log": res["log"],
        "freed_at": watch.freed_at,
        "drain_ok": bool(drain and drain["status"] == "ok"),
        "assert_ok": bool(check and check["status"] == "ok"),
    }
    if drain and check:
        out.update({
            "module_time": check["end"] - drain["start"],
            "drain_task": drain["end"] - drain["start"],
            "assert_task": check["end"] - check["start"],
            "drain_elapsed": drain.get("elapsed"),
            "assert_elapsed": check.get("elapsed"),
            "assert_polls": check.get("polls"),
            "between_tasks": check["start"] - drain["end"],
            "seconds_to_exit": max([s.get("seconds_to_exit") or 0 for s in drain.get("signalled") or []] or [None]),
            "signals": sorted(set(sig for s in drain.get("signalled") or [] for sig in (s.get("signals") or []))),
        })
    if polls and watch.freed_at:
        success = polls[-1][1]
        out["success_at"] = success
        out["detection_latency"] = success - watch.freed_at
        # First assert poll relative to the free: > 0 means the task only started after the memory was back.
        out["first_poll_after_free"] = polls[0][0] - watch.freed_at
        out["final_poll_start_after_free"] = polls[-2][0] - watch.freed_at if len(polls) >= 2 else None
        out["smi_calls"] = len(polls)
    return out


def run(opts, workdir):
    from gpusim.node import Node  # pylint: disable=import-outside-toplevel
    workdir = os.path.join(workdir, "teardown")
    root = os.path.join(workdir, "node")
    os.makedirs(workdir)
    Node.create(root, gpus=2, model="H200")
    env = c.base_env(GPUSIM_ROOT=root)
    smi_log = os.path.join(workdir, "smi-calls.log")
    timed = os.path.join(workdir, "nvidia-smi-timed")
    with open(timed, "w") as fh:
        fh.write(TIMED_SMI.format(smi=c.NVIDIA_SMI, log=smi_log))
    os.chmod(timed, 0o755)
    inventory = os.path.join(workdir, "inventory.yml")
    with open(inventory, "w") as fh:
        fh.write(INVENTORY.format(python=c.PYTHON))
    playbook = os.path.join(workdir, "teardown.yml")
    with open(playbook, "w") as fh:
        fh.write(PLAYBOOK.format(root=root, path=c.NODE_PATH, term_timeout=TERM_TIMEOUT, smi=c.NVIDIA_SMI,
                                 smi_timed=timed, sleep=ASSERT_SLEEP))
    out = {"config": {"gpus": GPUS, "mib": MIB, "term_timeout": TERM_TIMEOUT, "assert_sleep": ASSERT_SLEEP,
                      "manual": "SIGTERM, sleep %g, SIGKILL, sleep %g, one nvidia-smi" % (MANUAL_SLEEP, MANUAL_SLEEP),
                      "ansible": "one ansible-playbook: gpu_drain then gpu_memory_assert (local connection)",
                      "runs": opts.runs},
           "cases": {}}
    for name, extra, desc in CASES:
        files = {"case": name, "inventory": inventory, "playbook": playbook, "smi_log": smi_log}
        runs = []
        for n in range(opts.runs):
            load = c.loadavg()
            manual = run_manual(env, root, extra)
            ansible = run_ansible(env, root, extra, files, workdir, n)
            runs.append({"load": load, "manual": manual, "ansible": ansible})
            print("  teardown %-14s run %d/%d: manual %.2f s, ansible %.2f s (modules %s s), detection %s s, load %s"
                  % (name, n + 1, opts.runs, manual["wall"], ansible["wall"], c.fmt(ansible.get("module_time")),
                     c.fmt(ansible.get("detection_latency"), 3), load[0]), flush=True)
        out["cases"][name] = {"description": desc, "holder_args": extra, "runs": runs, "summary": summarise(runs)}
    return out


def summarise(runs):
    ok = [r for r in runs if r["ansible"]["rc"] == 0]
    man = c.median([r["manual"]["wall"] for r in runs])
    ans = c.median([r["ansible"]["wall"] for r in ok])
    mod = c.median([r["ansible"].get("module_time") for r in ok])
    return {
        "runs": len(runs),
        "ansible_failures": len(runs) - len(ok),
        "manual_wall": man,
        "manual_free_at_check": all(r["manual"]["free_at_check"] for r in runs),
        "manual_detection_latency": c.median([r["manual"]["detection_latency"] for r in runs]),
        "ansible_wall": ans,
        "ansible_cpu": c.median([r["ansible"]["cpu"] for r in ok]),
        "module_time": mod,
        "drain_task": c.median([r["ansible"].get("drain_task") for r in ok]),
        "assert_task": c.median([r["ansible"].get("assert_task") for r in ok]),
        "between_tasks": c.median([r["ansible"].get("between_tasks") for r in ok]),
        "drain_elapsed": c.median([r["ansible"].get("drain_elapsed") for r in ok]),
        "assert_elapsed": c.median([r["ansible"].get("assert_elapsed") for r in ok]),
        "assert_polls": c.median([r["ansible"].get("assert_polls") for r in ok]),
        "seconds_to_exit": c.median([r["ansible"].get("seconds_to_exit") for r in ok]),
        "ratio_wall": (ans / man) if ans and man else None,
        "ratio_modules": (mod / man) if mod and man else None,
        "detection_latency": c.median([r["ansible"].get("detection_latency") for r in ok]),
        "detection_latency_max": max([r["ansible"].get("detection_latency") or 0 for r in ok] or [0]) if ok else None,
        "first_poll_after_free": c.median([r["ansible"].get("first_poll_after_free") for r in ok]),
        "load_1min": c.median([r["load"][0] for r in runs]),
    }


def report(result):
    rows = []
    for name, case in result["cases"].items():
        s = case["summary"]
        rows.append([name, c.fmt(s["manual_wall"]), c.fmt(s["ansible_wall"]), c.fmt(s["ratio_wall"]),
                     c.fmt(s["module_time"]), c.fmt(s["ratio_modules"]), c.fmt(s["drain_elapsed"]),
                     c.fmt(s["assert_elapsed"]), c.fmt(s["assert_polls"], 0), c.fmt(s["first_poll_after_free"]),
                     c.fmt(s["detection_latency"], 3), c.fmt(s["detection_latency_max"], 3),
                     c.fmt(s["manual_detection_latency"], 2), c.fmt(s["load_1min"], 1),
                     "%d/%d" % (s["runs"] - s["ansible_failures"], s["runs"])])
    lines = [
        "Teardown: manual (SIGTERM, sleep 2, SIGKILL, sleep 2, nvidia-smi) vs gpu_drain + gpu_memory_assert",
        "(medians of %d runs; 'ansible' = whole ansible-playbook command, 'modules' = drain task start to assert task end;"
        % result["config"]["runs"],
        " detection = end of the assert's final poll minus exited_at + release_delay; goals: ratio <= 0.5 graceful,"
        " detection <= %.1f s)" % (ASSERT_SLEEP + 0.1),
        c.table(["case", "manual s", "ansible s", "ratio", "modules s", "ratio(mod)", "drain s", "assert s", "polls",
                 "1st poll-free s", "detect s", "detect max", "manual detect", "load", "ok"], rows),
        "(drain s / assert s: the modules' own elapsed; 1st poll-free s < 0: the assert was polling when the memory came back)",
    ]
    return "\n".join(lines)
