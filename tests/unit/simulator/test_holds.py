"""`gpusim hold` processes: structure, signals, release timing (§3.2), the
placeholders of §1.4 / §3.3, and the counting rule of docs/design.md."""
from __future__ import annotations

import os
import signal
import time

import pytest

from gpusim_testlib import wait_for
from gpusim import procfs


def _alive(pid):
    return procfs.is_alive(pid)


def _status_of(pid):
    with open("/proc/%d/status" % pid) as fh:
        return dict(line.rstrip("\n").split(":\t", 1) for line in fh if ":\t" in line)


def test_hold_prints_only_the_pid_and_is_visible_at_once(sim):
    r = sim.gpusim("hold", "--gpus", "0", "--mib", "1234")
    assert r.rc == 0, r
    assert r.out.endswith("\n") and r.out.strip().isdigit() and len(r.lines) == 1
    pid = int(r.out)
    sim.track_hold(pid)
    assert _alive(pid)
    # no polling: the hold is registered before the CLI exits
    assert sim.apps() == [[sim.bus(0), str(pid), "1234", os.readlink("/proc/%d/exe" % pid)]]
    assert sim.used(0) == 1 + 1234


def test_process_structure(sim):
    pid = sim.hold("--gpus", "1", "--mib", "100", "--name", "holder")
    sid, pgid = os.getsid(pid), os.getpgid(pid)
    assert sid == pid and pgid == pid                   # holder leads its own session/group
    watcher = int(_status_of(pid)["PPid"])
    assert watcher != os.getpid()
    assert procfs.comm(watcher) == "gpusim-watch"
    assert os.getsid(watcher) != sid                    # never in the holder's session
    assert os.getsid(watcher) != os.getsid(os.getpid())  # detached from the caller too
    h = [h for h in sim.status()["holds"] if h["pid"] == pid][0]
    assert h["watcher_pid"] == watcher and h["alive"] and h["state"] == "alive"


def test_holder_keeps_device_fds_open(sim):
    pid = sim.hold("--gpus", "2,5", "--mib", "10")
    targets = set()
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            targets.add(os.readlink("/proc/%d/fd/%s" % (pid, fd)))
        except OSError:
            pass
    dev = str(sim.root / "dev")
    assert {dev + "/nvidia2", dev + "/nvidia5", dev + "/nvidiactl", dev + "/nvidia-uvm"} <= targets
    assert dev + "/nvidia0" not in targets
    # stdio is detached, so a caller capturing `gpusim hold` output gets EOF
    assert os.readlink("/proc/%d/fd/1" % pid) == "/dev/null"


def test_name_sets_truncated_comm_and_full_process_name(sim):
    name = "sglang::scheduler_TP0"
    pid = sim.hold("--gpus", "0", "--mib", "10", "--name", name)
    assert procfs.comm(pid) == name[:15]               # the kernel keeps 15 bytes
    assert sim.apps()[0][3] == name


def test_default_process_name_is_exe_path(sim):
    pid = sim.hold("--gpus", "0", "--mib", "10")
    name = sim.apps()[0][3]
    assert name == os.readlink("/proc/%d/exe" % pid)
    assert name.startswith("/") and "python" in os.path.basename(name)


def test_commas_in_process_name(sim):
    name = "chrome --type=gpu-process, --field-trial=a,b"
    pid = sim.hold("--gpus", "4", "--mib", "64", "--name", name)
    r = sim.smi("--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader")
    assert r.lines == ["%d, %s, 64 MiB" % (pid, name)]    # printed as-is: naive split breaks


def test_duplicate_pid_one_row_per_gpu(sim):
    pid = sim.hold("--gpus", "0,1,2", "--mib", "500")
    rows = sim.apps()
    assert [r[:3] for r in rows] == [[sim.bus(i), str(pid), "500"] for i in (0, 1, 2)]


def test_sigterm_default_frees_memory(sim):
    pid = sim.hold("--gpus", "0", "--mib", "9000")
    os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not _alive(pid), 5, what="holder exit")
    wait_for(lambda: sim.used(0) == 1, 5, what="memory freed")
    assert sim.apps() == []


def test_ignore_sigterm(sim):
    pid = sim.hold("--gpus", "0", "--mib", "100", "--ignore-sigterm")
    os.kill(pid, signal.SIGTERM)
    time.sleep(0.5)
    assert _alive(pid)
    assert "SigIgn" in _status_of(pid) and int(_status_of(pid)["SigIgn"], 16) & (1 << 14)
    assert sim.used(0) == 101
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: sim.used(0) == 1, 5, what="memory freed after SIGKILL")


def test_exit_delay(sim):
    pid = sim.hold("--gpus", "0", "--mib", "100", "--exit-delay", "1.0")
    t0 = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    time.sleep(0.4)
    assert _alive(pid), "exited before its --exit-delay"
    wait_for(lambda: not _alive(pid), 5, what="delayed exit")
    assert time.monotonic() - t0 >= 0.9
    wait_for(lambda: sim.used(0) == 1, 5, what="memory freed")


def test_release_delay_timing(sim):
    # The state after death, with a delay no load can outlast (a 1.5 s delay had ended before the third nvidia-smi
    # call at load 16: the checks below spawn the simulator's nvidia-smi three times).
    pid = sim.hold("--gpus", "0", "--mib", "5000", "--release-delay", "120")
    t_kill = time.time()
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not _alive(pid), 5, what="death")
    # still counted, and still listed, after death (§3.2)
    assert sim.used(0) == 5001
    assert [r[1] for r in sim.apps(ids="0")] == [str(pid)]
    h = [h for h in sim.status()["holds"] if h["pid"] == pid][0]
    assert h["state"] == "releasing" and not h["alive"] and h["counted"]
    # exited_at was stamped by the watcher when it reaped the holder: after the kill, before this read
    assert t_kill - 0.05 <= h["exited_at"] <= time.time()

    # The release itself: never before the delay (load can only make it look later).
    pid = sim.hold("--gpus", "1", "--mib", "3000", "--release-delay", "1.5")
    t_kill = time.time()
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: sim.used(1) == 1, 30, what="release after the delay")
    assert time.time() - t_kill >= 1.4
    assert sim.apps(ids="1") == []


def test_stuck_memory_and_stale_listing_until_reset(sim):
    pid = sim.hold("--gpus", "6", "--mib", "2048", "--stuck")
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not _alive(pid), 5, what="death")
    time.sleep(0.5)
    assert sim.used(6) == 2049
    assert [r[1] for r in sim.apps()] == [str(pid)]          # stale listing
    assert [h["state"] for h in sim.status()["holds"]] == ["stale"]
    r = sim.smi("--gpu-reset", "-i", "6")
    assert r.rc == 0, r
    assert sim.used(6) == 1 and sim.apps() == []


def test_zombie_holds_no_memory(sim):
    """A holder killed while its watcher cannot reap it is a zombie: not alive."""
    pid = sim.hold("--gpus", "0", "--mib", "300")
    watcher = int(_status_of(pid)["PPid"])
    os.kill(watcher, signal.SIGSTOP)
    try:
        # SIGSTOP takes effect only when the watcher next runs: until it reads "T", a watcher that is still in
        # waitpid() would reap the holder first (seen under load on 2 CPUs), and no zombie would ever show.
        wait_for(lambda: (procfs.read_stat(watcher) or ("?",))[0] == "T", 5, what="watcher stopped")
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: (procfs.read_stat(pid) or ("?",))[0] == "Z", 5, what="zombie")
        assert sim.used(0) == 1
        assert sim.apps() == []
    finally:
        os.kill(watcher, signal.SIGCONT)


def test_children_keep_memory_unlisted(sim):
    r = sim.gpusim("hold", "--gpus", "1", "--mib", "700", "--children", "2", "--json")
    assert r.rc == 0, r
    import json

    info = json.loads(r.out)
    pid, keepers = info["pid"], info["keepers"]
    sim.track_hold(pid)
    assert len(keepers) == 2
    for k in keepers:
        assert int(_status_of(k)["PPid"]) == pid
        assert os.getsid(k) == pid                           # same session as the holder
        assert any(os.readlink("/proc/%d/fd/%s" % (k, fd)).endswith("/dev/nvidia1")
                   for fd in os.listdir("/proc/%d/fd" % k))
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not _alive(pid), 5, what="holder death")
    time.sleep(0.2)
    assert sim.used(1) == 701                                # §3.2 (b): children keep it
    assert sim.apps() == []                                  # ... without being listed
    assert [h["state"] for h in sim.status()["holds"]] == ["inherited"]
    assert sim.smi("-r", "-i", "1").rc == 255                # live users block a reset
    for k in keepers:
        os.kill(k, signal.SIGKILL)
    wait_for(lambda: sim.used(1) == 1, 5, what="release after the last child")


def test_na_memory_placeholder(sim):
    pid = sim.hold("--gpus", "0", "--mib", "800", "--na-memory")
    r = sim.smi("--query-compute-apps=pid,used_gpu_memory", "--format=csv,noheader")
    assert r.lines == ["%d, [N/A]" % pid]
    r = sim.smi("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
    assert r.lines == ["%d, [N/A]" % pid]
    assert sim.used(0) == 801                                # still counted in memory.used


def test_na_memory_env_knob(sim):
    pid = sim.hold("--gpus", "0", "--mib", "800")
    r = sim.smi("--query-compute-apps=pid,used_memory", "--format=csv,noheader",
                env={"GPUSIM_SMI_PROCESS_MEMORY": "na"})
    assert r.lines == ["%d, [N/A]" % pid]


def test_foreign_pid_namespace_not_found(sim):
    pid = sim.hold("--gpus", "2", "--mib", "1024", "--foreign-ns")
    rows = sim.apps()
    assert len(rows) == 1
    shown = int(rows[0][1])
    assert shown != pid and not os.path.exists("/proc/%d" % shown)
    assert rows[0][2] == "1024" and rows[0][3] == "[Not Found]"
    assert sim.used(2) == 1025                               # totals stay correct (§3.3)
    assert str(shown) not in sim.smi().out                   # table: not listed
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: sim.used(2) == 1, 5, what="release")


def test_container_env_knob(sim):
    pid = sim.hold("--gpus", "0", "--mib", "64", "--name", "visible")
    rows = sim.apps(env={"GPUSIM_SMI_CONTAINER": "1"})
    assert rows[0][3] == "[Not Found]" and rows[0][1] != str(pid)
    assert "No running processes found" in sim.smi(env={"GPUSIM_SMI_CONTAINER": "1"}).out


def test_mutually_exclusive_signal_options(sim):
    r = sim.gpusim("hold", "--gpus", "0", "--mib", "1", "--ignore-sigterm", "--exit-delay", "1")
    assert r.rc == 2 and "mutually exclusive" in r.err
    assert sim.apps() == []


@pytest.mark.parametrize("gpus,needle", [("8", "does not exist"), ("0,0", "twice"),
                                         ("x", "indices")])
def test_hold_bad_gpus(sim, gpus, needle):
    r = sim.gpusim("hold", "--gpus", gpus, "--mib", "1")
    assert r.rc == 2 and needle in r.err
    assert sim.status()["holds"] == []


def test_hold_all_gpus(sim):
    pid = sim.hold("--gpus", "all", "--mib", "10")
    assert [r[1] for r in sim.apps()] == [str(pid)] * 8


def test_release_by_pid(sim):
    pid = sim.hold("--gpus", "0,1", "--mib", "10")
    r = sim.gpusim("release", "--pid", pid)
    assert r.rc == 0 and r.out.strip() == "1"
    assert _alive(pid) and sim.apps() == [] and sim.used(0) == 1
    assert sim.gpusim("release", "--pid", pid).rc == 1


def test_attach_to_existing_process_aggregates_rows(sim):
    pid = sim.hold("--gpus", "0", "--mib", "100")
    r = sim.gpusim("attach", "--pid", pid, "--gpus", "0,3", "--mib", "50")
    assert r.rc == 0 and r.out.startswith("h-")
    rows = sim.apps()
    # one row per (GPU, PID): 100 + 50 on GPU 0, 50 on GPU 3
    assert [r[:3] for r in rows] == [[sim.bus(0), str(pid), "150"], [sim.bus(3), str(pid), "50"]]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: sim.used(0) == 1 and sim.used(3) == 1, 5, what="both holds freed")


def test_attach_refuses_dead_pid(sim):
    r = sim.gpusim("attach", "--pid", "4194303", "--gpus", "0", "--mib", "1")
    assert r.rc == 2 and "no live process" in r.err


def _ignore_int_quit():
    # What a non-interactive shell does to a background job (`cmd &`): SIGINT and
    # SIGQUIT ignored, and ignored dispositions survive fork and exec.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)


def test_holder_starts_with_default_signal_actions_even_from_a_background_job(sim):
    import subprocess
    from gpusim_testlib import SIM_BIN

    proc = subprocess.run([str(SIM_BIN / "gpusim"), "hold", "--gpus", "3", "--mib", "10", "--name", "bgjob"],
                          env=sim.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30, check=False,
                          preexec_fn=_ignore_int_quit)
    assert proc.returncode == 0, proc.stderr
    pid = int(proc.stdout.strip())
    sim.track_hold(pid)
    ignored = int(_status_of(pid)["SigIgn"], 16)
    assert not ignored & (1 << (signal.SIGQUIT - 1)) and not ignored & (1 << (signal.SIGINT - 1))
    os.kill(pid, signal.SIGQUIT)                       # the default action ends it
    wait_for(lambda: not _alive(pid), timeout=10, what="the SIGQUIT holder to exit")
