"""gpu_drain and gpu_memory_assert run in-process (``main()``) against the GPU simulator.

The only processes started are simulator ones (``gpusim hold``); each is
recorded by PID and start time and SIGKILLed by PID at teardown. The module
runs ``nvidia-smi`` through ``AnsibleModule.run_command``, as on a target.
The modules never read ``GPUSIM_ROOT``: ``run()`` passes the simulated node's
device directory as ``device_paths``, as the simulator's inventory does.
"""
from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess

import pytest

from ansible.module_utils.testing import patch_module_args

from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import teardown
from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import backends as gpu_backends
from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import verify as gpu_verify
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import procfs
from ansible_collections.gpufleet.sglang.plugins.modules import gpu_drain
from ansible_collections.gpufleet.sglang.plugins.modules import gpu_memory_assert as gma

REPO = pathlib.Path(__file__).resolve().parents[4]
SIM_BIN = REPO / "simulator" / "bin"


class Sim:
    def __init__(self, root, env):
        self.root = str(root)
        self.env = env
        self.pids = []          # (pid, starttime)

    def gpusim(self, *args):
        proc = subprocess.run([str(SIM_BIN / "gpusim")] + [str(a) for a in args], env=self.env,
                              capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    def _track(self, pid):
        stat = procfs.read_stat(pid)
        if stat is not None:
            self.pids.append((pid, stat["starttime"]))

    def hold(self, gpus, mib, *flags):
        info = json.loads(self.gpusim("hold", "--gpus", ",".join(map(str, gpus)), "--mib", mib, "--json", *flags))
        for pid in [info["pid"], info["watcher_pid"]] + list(info.get("keepers") or []):
            self._track(pid)
        return info["pid"]

    def alive(self, pid):
        stat = procfs.read_stat(pid)
        return stat is not None and not procfs.is_exited(stat["state"], stat["num_threads"])

    def used(self, gpu):
        return [g for g in json.loads(self.gpusim("status"))["gpus"] if g["index"] == gpu][0]["used_mib"]

    def cleanup(self):
        for pid, start in reversed(self.pids):
            stat = procfs.read_stat(pid)
            if stat is not None and stat["starttime"] == start:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass


@pytest.fixture
def sim(tmp_path, monkeypatch):
    root = tmp_path / "gpusim"
    root.mkdir()
    monkeypatch.setenv("GPUSIM_ROOT", str(root))
    monkeypatch.setenv("PATH", "%s:%s" % (SIM_BIN, os.environ["PATH"]))
    node = Sim(root, dict(os.environ))
    node.gpusim("init", "--gpus", 8, "--model", "H200")
    yield node
    node.cleanup()


def run(module, args, capsys, check=False, diff=False):
    """Run ``module.main()`` with ``args``; returns the parsed result (with ``failed``)."""
    args = dict(args)
    if os.environ.get("GPUSIM_ROOT"):
        args.setdefault("device_paths", [os.path.join(os.environ["GPUSIM_ROOT"], "dev", "nvidia*")])
    if check:
        args["_ansible_check_mode"] = True
    if diff:
        args["_ansible_diff"] = True
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            module.main()
    result = json.loads(capsys.readouterr().out)
    result.setdefault("failed", False)
    return result


# ---------------------------------------------------------------------------
# gpu_drain
# ---------------------------------------------------------------------------

def test_drain_signal_option_sigkill_skips_the_graceful_phase(sim, capsys):
    pid = sim.hold([0], 1000, "--name", "victim")
    res = run(gpu_drain, {"gpus": [0], "signal": "SIGKILL", "term_timeout": 30}, capsys)
    assert not res["failed"], res["msg"]
    assert res["signalled"][0]["signals"] == ["SIGKILL"]
    assert res["signalled"][0]["seconds_to_exit"] < 5          # term_timeout (30) was not waited for
    assert not sim.alive(pid)


def test_drain_other_signals_and_exclude_option(sim, capsys):
    quitter = sim.hold([1], 1000, "--name", "quitter")
    keeper = sim.hold([2], 1000, "--name", "keepme")
    res = run(gpu_drain, {"gpus": [1, 2], "signal": "SIGQUIT", "exclude": ["keep.*"], "kill_timeout": 5}, capsys)
    assert not res["failed"], res["msg"]
    assert [e["pid"] for e in res["signalled"]] == [quitter]
    assert res["signalled"][0]["signals"] == ["SIGQUIT"]
    assert res["not_signalled"][0]["pid"] == keeper and "excluded" in res["not_signalled"][0]["reason"]
    assert sim.alive(keeper) and not sim.alive(quitter)
    assert [h["pid"] for h in res["remaining"]] == [keeper]


def test_drain_device_paths_option(sim, capsys):
    pid = sim.hold([3], 1000, "--name", "mine")
    # The simulated node's device files are recognised through the option only (GPUSIM_ROOT is set here too).
    res = run(gpu_drain, {"gpus": [3], "device_paths": [sim.root + "/dev/nvidia*"]}, capsys, check=True)
    assert [e["pid"] for e in res["signalled"]] == [pid]
    # Without any pattern that matches its descriptors, the listed PID looks like another
    # namespace's process that happens to share the number: never signalled.
    for paths in (["/nonexistent/nvidia*"], ["/dev/nvidia*"]):
        res = run(gpu_drain, {"gpus": [3], "device_paths": paths}, capsys)
        assert res["signalled"] == [] and res["changed"] is False
        assert "no GPU device file open" in res["not_signalled"][0]["reason"]
    assert sim.alive(pid)
    res = run(gpu_drain, {"device_paths": ["dev/nvidia*"]}, capsys)
    assert res["failed"] and "device_paths: 'dev/nvidia*' is not an absolute path pattern" in res["msg"]


def test_drain_survivor_fails_with_pid_state_and_gpus(sim, capsys, monkeypatch):
    pid = sim.hold([4], 1000, "--name", "immortal", "--ignore-sigterm")
    real_send = procfs.ProcessHandle.send

    def send(self, sig):
        if sig == signal.SIGKILL:           # pretend SIGKILL cannot take it (state D)
            self.signals.append("SIGKILL")
            return True
        return real_send(self, sig)

    monkeypatch.setattr(procfs.ProcessHandle, "send", send)
    res = run(gpu_drain, {"gpus": [4], "term_timeout": 0.2, "kill_timeout": 0.3}, capsys)
    assert res["failed"]
    assert res["survivors"][0]["pid"] == pid
    assert res["survivors"][0]["gpus"] == [4]
    assert "1 process(es) still running 0.3 s after SIGKILL: PID %d (immortal, state S (sleeping), GPUs 4)" % pid \
        in res["msg"]
    assert sim.alive(pid)


def test_drain_check_mode_with_diff_and_reset_plan(sim, capsys):
    pid = sim.hold([5], 2000, "--name", "busy")
    sim.gpusim("orphan", "--gpu", 6, "--mib", 100)
    res = run(gpu_drain, {"gpus": [5, 6], "reset_orphaned": True}, capsys, check=True, diff=True)
    assert not res["failed"], res["msg"]
    assert res["changed"] is True
    assert res["signalled"][0]["pid"] == pid and res["signalled"][0]["signals"] == ["SIGTERM"]
    assert res["reset"] == [{"gpu": 6, "bus_id": "00000000:BA:00.0", "used_mib_before": 101, "used_mib_after": None,
                             "result": "would reset", "reason": "101 MiB held by no process"}]
    assert "PID %d busy on GPU 5: 2000 MiB" % pid in res["diff"]["before"]
    assert res["diff"]["after"] == ""
    assert sim.alive(pid)
    assert sim.used(6) == 101


def test_drain_reset_failure_fails_the_task(sim, capsys, monkeypatch):
    sim.gpusim("orphan", "--gpu", 7, "--mib", 64)
    monkeypatch.setenv("GPUSIM_SMI_EUID", "1000")          # the fake nvidia-smi refuses: not root
    res = run(gpu_drain, {"gpus": [7], "reset_orphaned": True, "max_used_mib": 8}, capsys)
    assert res["failed"]
    assert res["msg"].startswith("gpu_drain: GPU reset failed: GPU 7: rc 4:")
    assert res["reset"][0]["result"] == "failed"


def test_drain_lost_gpu_is_reported(sim, capsys, monkeypatch):
    # (in-process runs do not return warnings, so catch them on the way)
    warned = []
    monkeypatch.setattr(gpu_drain.AnsibleModule, "warn", lambda self, text, **kw: warned.append(text))
    sim.gpusim("lose", "--gpu", 2)
    res = run(gpu_drain, {"gpus": [2, 3]}, capsys)
    assert not res["failed"], res["msg"]
    assert res["changed"] is False
    assert [g["lost"] for g in res["gpus"]] == [True, False]
    assert any("GPU 2 is lost" in w for w in warned)


@pytest.mark.parametrize("args, words", [
    ({"match": ["(oops"]}, "match: invalid regular expression"),
    ({"exclude": ["[x"]}, "exclude: invalid regular expression"),
    ({"gpus": ["MIG-abc"]}, "gpus: MIG device"),
    ({"gpus": [42]}, "no GPU matches 42"),
    ({"term_timeout": -1}, "term_timeout must be >= 0"),
    ({"max_used_mib": -1}, "max_used_mib must be >= 0"),
    ({"backend": "nvml"}, "nvidia-ml-py"),
    ({"nvidia_smi": "/nonexistent/nvidia-smi"}, "nvidia_smi: /nonexistent/nvidia-smi is not an executable file"),
])
def test_drain_option_errors(sim, capsys, args, words):
    if args.get("backend") == "nvml" and gpu_backends.HAS_PYNVML:
        pytest.skip("pynvml is installed here")
    res = run(gpu_drain, args, capsys)
    assert res["failed"]
    assert words in res["msg"]


def test_drain_without_nvidia_smi_on_path(sim, capsys, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(gpu_backends, "HAS_PYNVML", False)
    res = run(gpu_drain, {}, capsys)
    assert res["failed"] and "nvidia-smi was not found" in res["msg"]


def test_unit_info_uses_systemctl_only_when_systemd_runs(monkeypatch):
    calls = []

    def runner(argv, timeout):
        calls.append((argv, timeout))
        return 0, "MainPID=2000\nControlGroup=/system.slice/sglang-main.service\n", ""

    engine = teardown._Drain(teardown.defaults(), runner, False, None, which=lambda name: "/bin/systemctl")
    t = {5: procfs.ProcInfo(5, unit="sglang-main.service", unit_manager="system"),
         6: procfs.ProcInfo(6, unit="app.service", unit_manager="user"),
         7: procfs.ProcInfo(7)}
    monkeypatch.setattr(teardown.systemd, "running", lambda: False)
    assert engine.unit_info(t, [5, 6, 7]) == ({}, {})
    monkeypatch.setattr(teardown.systemd, "running", lambda: True)
    assert engine.unit_info(t, [5, 6, 7, 99]) == ({"sglang-main.service": 2000},
                                                  {"sglang-main.service": "/system.slice/sglang-main.service"})
    assert calls == [(["/bin/systemctl", "show", "--property=MainPID,ControlGroup", "--", "sglang-main.service"],
                      teardown.SYSTEMCTL_TIMEOUT_S)]


# ---------------------------------------------------------------------------
# gpu_memory_assert
# ---------------------------------------------------------------------------

def test_assert_free_passes_at_once(sim, capsys):
    res = run(gma, {"gpus": ["0", 1]}, capsys, check=True)
    assert not res["failed"], res["msg"]
    assert res["polls"] == 1 and res["changed"] is False
    assert res["backend"] == "nvidia-smi"
    assert [g["index"] for g in res["gpus"]] == [0, 1]
    assert res["gpus"][0]["total_mib"] == 143771 and res["gpus"][0]["reserved_mib"] == 530


def test_assert_times_out_on_a_live_holder_with_its_command_line(sim, capsys):
    pid = sim.hold([2], 3000, "--name", "worker")
    res = run(gma, {"gpus": [2], "timeout": 3, "sleep": 0.1, "delay": 0.1}, capsys)
    assert res["failed"]
    assert res["polls"] >= 2
    assert res["elapsed"] >= 3
    diag = res["diagnosis"][0]
    assert diag["kind"] == "held" and diag["processes"][0]["visible"] is True
    assert "hold --gpus 2 --mib 3000" in diag["processes"][0]["cmdline"]
    assert res["msg"].startswith("GPU 2: 3001 MiB held by PID %d (worker: " % pid)
    assert res["msg"].endswith("after 3 s")
    assert "gpu_drain" in diag["hint"]


def test_assert_allocated_with_default_minimum_and_required_processes(sim, capsys):
    sim.hold([0, 1], 2000, "--name", "srv")
    res = run(gma, {"gpus": [0, 1], "state": "allocated"}, capsys)
    assert not res["failed"], res["msg"]
    res = run(gma, {"gpus": [1, 3], "state": "allocated", "require_processes": True, "min_used_mib": 0,
                    "timeout": 0}, capsys)
    assert res["failed"]
    assert res["msg"] == "GPU 3: no compute process listed at the only check (timeout 0)"
    assert res["diagnosis"][0]["kind"] == "no_processes"


def test_assert_transient_errors_are_retried_until_the_deadline(sim, capsys, tmp_path):
    broken = tmp_path / "nvidia-smi"
    broken.write_text("#!/bin/sh\necho 'Internal error'\nexit 255\n")
    broken.chmod(0o755)
    # 3 s leaves room for several polls of 0.1 s even on a loaded 2-core machine (with 1 s, one slow
    # first poll could end past the deadline).
    res = run(gma, {"nvidia_smi": str(broken), "timeout": 3, "sleep": 0.1, "backend": "nvidia-smi"}, capsys)
    assert res["failed"]
    assert res["polls"] >= 2
    assert res["diagnosis"][0]["kind"] == "error"
    assert "nvidia-smi kept failing for 3 s: error (rc 255) Internal error" in res["msg"]


@pytest.mark.parametrize("args, words", [
    ({"timeout": -1}, "timeout must be >= 0"),
    ({"max_used_mib": -5}, "max_used_mib must be >= 0"),
    ({"min_used_mib": -5, "state": "allocated"}, "min_used_mib must be >= 0"),
    ({"gpus": ["nope"]}, "invalid GPU selector"),
    ({"backend": "nvml"}, "nvidia-ml-py"),
    ({"nvidia_smi": "PLAIN_FILE"}, "is not an executable file"),
])
def test_assert_option_errors(sim, capsys, tmp_path, args, words):
    if args.get("backend") == "nvml" and gpu_backends.HAS_PYNVML:
        pytest.skip("pynvml is installed here")
    if args.get("nvidia_smi") == "PLAIN_FILE":
        plain = tmp_path / "nvidia-smi.txt"
        plain.write_text("not a program")
        plain.chmod(0o644)
        args = {"nvidia_smi": str(plain)}
    res = run(gma, args, capsys)
    assert res["failed"] and words in res["msg"]


def test_assert_without_nvidia_smi(sim, capsys, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(gpu_backends, "HAS_PYNVML", False)
    res = run(gma, {}, capsys)
    assert res["failed"] and "nvidia-smi was not found" in res["msg"]
    assert res["diagnosis"][0]["kind"] == "driver"


def test_assert_no_devices_is_immediate(sim, capsys):
    sim.gpusim("init", "--gpus", 0, "--model", "H200")
    res = run(gma, {"timeout": 30}, capsys)
    assert res["failed"] and res["polls"] == 1
    assert "no NVIDIA GPU is visible" in res["msg"]


# ---------------------------------------------------------------------------
# Pure judgement and diagnosis
# ---------------------------------------------------------------------------

FREE = {"state": "free", "max_used_mib": 16, "require_no_processes": True, "min_used_mib": None,
        "require_processes": False}


def gpu(**kw):
    base = {"index": 0, "uuid": "GPU-x", "bus_id": "00000000:18:00.0", "used_mib": 1, "processes": [],
            "unknown_fields": {}, "lost": False, "lost_reason": None}
    base.update(kw)
    return base


def test_judge():
    assert gpu_verify.judge(gpu(), FREE) == []
    assert gpu_verify.judge(gpu(used_mib=17), FREE) == ["used"]
    assert gpu_verify.judge(gpu(used_mib=None), FREE) == ["unknown"]
    assert gpu_verify.judge(gpu(processes=[{"pid": 1}]), FREE) == ["processes"]
    assert gpu_verify.judge(gpu(processes=[{"pid": 1}]), dict(FREE, require_no_processes=False)) == []
    assert gpu_verify.judge(gpu(unknown_fields={"processes": "[Unknown Error]"}), FREE) == ["unknown"]
    assert gpu_verify.judge(gpu(lost=True), FREE) == ["lost"]
    alloc = dict(FREE, state="allocated", min_used_mib=100, require_processes=True)
    assert gpu_verify.judge(gpu(used_mib=100, processes=[{"pid": 1}]), alloc) == []
    assert gpu_verify.judge(gpu(used_mib=None), alloc) == ["unknown", "no_processes"]


def test_diagnose_d_state_and_zombie(monkeypatch):
    infos = {
        11: procfs.ProcInfo(11, ppid=1, state="D", comm="python3", cmdline=["python3", "-m", "sglang.launch_server",
                                                                            "--api-key", "k"]),
        12: procfs.ProcInfo(12, ppid=99, state="Z", comm="python3", cmdline=[]),
    }
    monkeypatch.setattr(gpu_verify.procfs, "read_proc", lambda pid, root, with_cgroup=True: infos.get(pid))
    listed = [{"pid": 11, "used_mib": 8000, "name": "python3"}, {"pid": 12, "used_mib": 1000, "name": "python3"}]
    entry = gpu_verify.diagnose(gpu(used_mib=9000, processes=listed), ["used", "processes"], FREE, 120)
    assert entry["kind"] == "held"
    assert entry["summary"] == ("GPU 0: 9000 MiB held by PID 11 (python3: python3 -m sglang.launch_server --api-key "
                                "********, state D (uninterruptible sleep)), PID 12 (python3, exited; parent 99 has "
                                "not reaped it) after 120 s")
    assert "state D" in entry["hint"] and "exited process" in entry["hint"]


def test_diagnose_other_kinds():
    lost = gpu_verify.diagnose(gpu(index=None, lost=True, lost_reason="did not answer"), ["lost"], FREE, 5)
    assert lost["summary"] == "GPU 00000000:18:00.0 is lost: did not answer"
    kept = gpu_verify.diagnose(gpu(used_mib=700), ["used"], FREE, 2.5, device_users={77: "python3"})
    assert kept["summary"] == "GPU 0: 700 MiB held by no listed process after 2.5 s; PID 77 (python3) keep its device file open"
    unknown = gpu_verify.diagnose(gpu(unknown_fields={"processes": "[Unknown Error]"}), ["unknown"], FREE, 1)
    assert unknown["summary"] == "GPU 0: the process list is unknown ([Unknown Error]) after 1 s"
    unknown_used = gpu_verify.diagnose(gpu(used_mib=None, unknown_fields={"memory.used": "[N/A]"},
                                           processes=[{"pid": None, "name": "x"}]), ["unknown"], FREE, 1)
    assert "used memory is unknown ([N/A])" in unknown_used["summary"]
    assert "a process without PID (x)" in unknown_used["summary"]
    alloc = gpu_verify.diagnose(gpu(used_mib=None, unknown_fields={"memory.used": "[N/A]"}), ["unknown"],
                                dict(FREE, state="allocated", min_used_mib=10), 3)
    assert alloc["kind"] == "unknown" and "memory.used is unknown ([N/A])" in alloc["summary"]


def test_device_users_skips_daemons_and_listed(monkeypatch):
    monkeypatch.setattr(gpu_verify.procfs, "list_pids", lambda: [10, 11, 12, os.getpid()])
    monkeypatch.setattr(gpu_verify.procfs, "device_fds", lambda pid, paths: ["/dev/nvidia3"])
    monkeypatch.setattr(gpu_verify.procfs, "read_comm", lambda pid: {10: "nvidia-persiste", 11: "python3", 12: "x"}[pid])
    monkeypatch.setattr(gpu_verify.procfs, "read_cmdline",
                        lambda pid: {10: ["/usr/bin/nvidia-persistenced"], 11: ["python3"], 12: []}[pid])
    assert gpu_verify.device_users(3, ["/dev/nvidia*"], {12}) == {11: "python3"}


@pytest.mark.parametrize("module", [gpu_drain, gma], ids=["gpu_drain", "gpu_memory_assert"])
def test_bare_nvidia_smi_name_is_looked_up_on_path(sim, capsys, module):
    # Users write `nvidia_smi: nvidia-smi`; that is a name to find on PATH, not a
    # file in the task's working directory. The simulator is first on PATH here.
    res = run(module, {"nvidia_smi": "nvidia-smi"}, capsys)
    assert not res["failed"], res["msg"]
    assert res["gpus"]


@pytest.mark.parametrize("module", [gpu_drain, gma], ids=["gpu_drain", "gpu_memory_assert"])
def test_bare_nvidia_smi_name_missing_from_path_names_the_fix(sim, capsys, module):
    res = run(module, {"nvidia_smi": "nvidia-smi-525"}, capsys)
    assert res["failed"]
    assert "nvidia_smi: nvidia-smi-525 was not found on PATH; give its absolute path or fix PATH" in res["msg"]
