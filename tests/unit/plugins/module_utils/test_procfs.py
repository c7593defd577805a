"""Tests for module_utils/node/procfs.py on synthetic /proc trees and on the live /proc.

The only processes started here are short-lived children of the test process
itself (forked for signal and zombie checks); each is killed and reaped by PID.
"""
from __future__ import annotations

import ctypes
import os
import signal
import threading
import time

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils.common import secrets
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import procfs
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import stop


# ---------------------------------------------------------------------------
# Pure parsers
# ---------------------------------------------------------------------------

def stat_line(pid, comm, state="S", ppid=1, pgid=None, sid=None, starttime=1000, threads=1):
    pgid = pid if pgid is None else pgid
    sid = pid if sid is None else sid
    # fields 3.. : state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime stime
    # cutime cstime priority nice num_threads itrealvalue starttime vsize rss ...
    fields = [state, ppid, pgid, sid, 0, -1, 4194560, 0, 0, 0, 0, 0, 0, 0, 0, 20, 0, threads, 0, starttime,
              1000, 10, 0]
    return "%d (%s) %s\n" % (pid, comm, " ".join(str(f) for f in fields))


def test_parse_stat_with_spaces_and_parentheses_in_comm():
    info = procfs.parse_stat(stat_line(42, "evil) S 1 (name", state="D", ppid=7, pgid=40, sid=30, starttime=987654,
                                       threads=3))
    assert info == {"pid": 42, "comm": "evil) S 1 (name", "state": "D", "ppid": 7, "pgid": 40, "sid": 30,
                    "tty_nr": 0, "num_threads": 3, "starttime": 987654}


@pytest.mark.parametrize("text", ["", "garbage", "12 (x) S 1 2", "x (y) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20"])
def test_parse_stat_rejects_junk(text):
    assert procfs.parse_stat(text) is None


def test_parse_cmdline():
    assert procfs.parse_cmdline(b"python3\0-m\0sglang.launch_server\0--tp-size\0008\0") == [
        "python3", "-m", "sglang.launch_server", "--tp-size", "8"]
    assert procfs.parse_cmdline(b"sglang::scheduler_TP0") == ["sglang::scheduler_TP0"]
    assert procfs.parse_cmdline(b"") == []
    assert procfs.parse_cmdline(None) == []
    assert procfs.parse_cmdline(b"a\0\xff\xfe\0") == ["a", "\ufffd\ufffd"]
    assert procfs.parse_cmdline("x\0y") == ["x", "y"]


V2 = "0::/system.slice/sglang-main.service\n"
V1 = ("12:pids:/system.slice/sglang-main.service\n"
      "11:cpu,cpuacct:/system.slice/sglang-main.service\n"
      "1:name=systemd:/system.slice/sglang-main.service\n")
HYBRID = ("1:name=systemd:/system.slice/sglang-main.service\n"
          "0::/system.slice/sglang-main.service\n")


@pytest.mark.parametrize("text, expected", [
    (V2, ("sglang-main.service", "system", "/system.slice/sglang-main.service")),
    (V1, ("sglang-main.service", "system", "/system.slice/sglang-main.service")),
    (HYBRID, ("sglang-main.service", "system", "/system.slice/sglang-main.service")),
    ("0::/system.slice/sglang-main.service/payload/worker\n",
     ("sglang-main.service", "system", "/system.slice/sglang-main.service")),
    ("0::/user.slice/user-1000.slice/user@1000.service/app.slice/jupyter.service\n",
     ("jupyter.service", "user", "/user.slice/user-1000.slice/user@1000.service/app.slice/jupyter.service")),
    ("0::/user.slice/user-0.slice/session-3.scope\n", ("session-3.scope", "system", "/user.slice/user-0.slice/session-3.scope")),
    ("0::/\n", (None, None, None)),
    ("0::/docker/0123abcd\n", (None, None, None)),
    ("", (None, None, None)),
    # the machine these tests were written on: v1 with an empty name=systemd path
    ("9:name=systemd:/\n4:memory:/process_api/00eff027\n0::/\n", (None, None, None)),
])
def test_systemd_unit_from_cgroup(text, expected):
    assert procfs.systemd_unit_from_cgroup(text) == expected


def test_parse_cgroup_skips_malformed_lines():
    assert procfs.parse_cgroup("junk\n0::/a\n") == [("0", "", "/a")]


@pytest.mark.parametrize("argv, masked", [
    (["python3", "-m", "sglang.launch_server", "--api-key", "s3cr3t", "--port", "30000"],
     ["python3", "-m", "sglang.launch_server", "--api-key", "********", "--port", "30000"]),
    (["x", "--admin-api-key=adm1n", "--api-key=k"], ["x", "--admin-api-key=********", "--api-key=********"]),
    (["x", "--api-key"], ["x", "--api-key"]),
    (["x", "--api-keys", "visible"], ["x", "--api-keys", "visible"]),
])
def test_mask_secrets(argv, masked):
    assert secrets.mask_argv(argv) == masked


def test_state_names_and_exited():
    assert procfs.state_name("D") == "D (uninterruptible sleep)"
    assert procfs.state_name(None) == "unknown"
    assert procfs.state_name("Q") == "Q"
    assert procfs.is_exited("Z", 1) and procfs.is_exited("X", 1)
    # A zombie leader whose other threads still run has not exited (nvidia-smi.md section 3.2 a).
    assert not procfs.is_exited("Z", 2)
    assert not procfs.is_exited("D", 1)


@pytest.mark.parametrize("value, expected", [("SIGTERM", signal.SIGTERM), ("term", signal.SIGTERM),
                                             ("KILL", signal.SIGKILL), (15, signal.SIGTERM), ("9", signal.SIGKILL)])
def test_parse_signal(value, expected):
    assert procfs.parse_signal(value) == expected


def test_parse_signal_rejects():
    with pytest.raises(ValueError):
        procfs.parse_signal("SIGNOPE")
    assert procfs.signal_name(signal.SIGQUIT) == "SIGQUIT"
    assert procfs.signal_name(999) == "999"


# ---------------------------------------------------------------------------
# Synthetic /proc trees
# ---------------------------------------------------------------------------

class FakeProc:
    """Writes a /proc-like tree under a tmp dir."""

    def __init__(self, root):
        self.root = root

    def add(self, pid, comm, argv=(), cgroup="0::/\n", uid=0, fds=(), **stat):
        d = self.root / str(pid)
        (d / "fd").mkdir(parents=True)
        (d / "stat").write_text(stat_line(pid, comm, **stat))
        (d / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in argv))
        (d / "comm").write_text(comm + "\n")
        (d / "cgroup").write_text(cgroup)
        (d / "status").write_text("Name:\t%s\nUid:\t%d\t%d\t%d\t%d\n" % (comm, uid, uid, uid, uid))
        for i, target in enumerate(fds):
            os.symlink(target, str(d / "fd" / str(i + 3)))


@pytest.fixture
def fake(tmp_path):
    proc = FakeProc(tmp_path)
    # systemd-started SGLang: launch_server leads its session and group,
    # schedulers (retitled) and the detokenizer share both.
    svc = "0::/system.slice/sglang-main.service\n"
    proc.add(1, "init", ["/sbin/init"], ppid=0, starttime=1)
    proc.add(100, "python3", ["python3", "-m", "sglang.launch_server", "--api-key", "k"], cgroup=svc, ppid=1,
             starttime=500)
    proc.add(101, "sglang::schedul", ["sglang::scheduler_TP0"], cgroup=svc, ppid=100, pgid=100, sid=100,
             starttime=600, fds=["/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-uvm", "/tmp/x.log"])
    proc.add(102, "sglang::schedul", ["sglang::scheduler_TP1"], cgroup=svc + "", ppid=100, pgid=100, sid=100,
             starttime=601, fds=["/sim/dev/nvidia1"])
    proc.add(103, "sglang::detoken", ["sglang::detokenizer"], cgroup="0::/system.slice/sglang-main.service/sub\n",
             ppid=100, pgid=100, sid=100, starttime=602)
    proc.add(200, "bash", ["-bash"], ppid=1, starttime=300, uid=1000)
    proc.add(201, "python3", ["python3", "train.py"], ppid=200, pgid=201, sid=200, starttime=700, state="D",
             threads=4)
    return proc


def test_process_table_and_tree_walks(fake):
    table = procfs.process_table(str(fake.root))
    assert sorted(table) == [1, 100, 101, 102, 103, 200, 201]
    main = table[100]
    assert (main.ppid, main.pgid, main.sid, main.starttime) == (1, 100, 100, 500)
    assert main.cmdline == ("python3", "-m", "sglang.launch_server", "--api-key", "k")
    assert main.unit == "sglang-main.service" and main.unit_manager == "system"
    assert main.cgroup == "/system.slice/sglang-main.service"
    assert table[103].cgroup == "/system.slice/sglang-main.service/sub"
    assert table[200].uid == 1000 and table[200].exe_name == "-bash"
    assert table[201].state == "D" and table[201].num_threads == 4 and not table[201].exited
    assert table[101].cmdline_str == "sglang::scheduler_TP0"
    assert "pid=100" in repr(main) and main.to_dict()["comm"] == "python3"

    kids = procfs.children_map(table)
    assert procfs.children(table, 100) == [101, 102, 103]
    assert procfs.children(table, 1, kids) == [100, 200]
    assert procfs.descendants(table, 1) == [100, 200, 101, 102, 103, 201]
    assert procfs.ancestors(table, 101) == [100, 1]
    assert procfs.ancestors(table, 1) == []
    assert procfs.processes_in_cgroup(table, "/system.slice/sglang-main.service") == [100, 101, 102, 103]
    assert procfs.oldest(table, [101, 103, 100]) == 100
    assert procfs.oldest(table, [999]) is None


def test_read_one_process(fake):
    info = procfs.read_proc(101, str(fake.root), with_cgroup=False)
    assert info.comm == "sglang::schedul" and info.cgroup is None
    assert procfs.read_comm(101, str(fake.root)) == "sglang::schedul"
    assert procfs.read_cmdline(999, str(fake.root)) == []
    assert procfs.read_proc(999, str(fake.root)) is None
    assert procfs.read_comm(999, str(fake.root)) is None
    assert procfs.read_uid(999, str(fake.root)) is None


def test_ancestors_stop_on_cycles_and_missing_parents():
    table = {5: procfs.ProcInfo(5, ppid=6), 6: procfs.ProcInfo(6, ppid=5), 7: procfs.ProcInfo(7, ppid=99)}
    assert procfs.ancestors(table, 5) == [6]
    assert procfs.ancestors(table, 7) == [99]
    assert procfs.descendants(table, 5) == [6]


def test_device_fds_with_patterns(fake):
    root = str(fake.root)
    assert procfs.device_fds(101, proc_root=root) == ["/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidiactl"]
    assert procfs.device_fds(101, ("/dev/nvidia[0-9]*",), root) == ["/dev/nvidia0"]
    # the simulator's device directory is a parameter
    assert procfs.device_fds(102, proc_root=root) == []
    assert procfs.device_fds(102, ("/dev/nvidia*", "/sim/dev/nvidia*"), root) == ["/sim/dev/nvidia1"]
    assert procfs.device_fds(999, proc_root=root) == []
    table = procfs.process_table(root)
    assert procfs.device_holders(table, ("/dev/nvidia*", "/sim/dev/nvidia*"), root) == {
        101: ["/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidiactl"], 102: ["/sim/dev/nvidia1"]}
    assert procfs.device_gpu_index("/dev/nvidia3") == 3
    assert procfs.device_gpu_index("/sim/dev/nvidia12") == 12
    assert procfs.device_gpu_index("/dev/nvidiactl") is None
    assert procfs.device_gpu_index("/dev/nvidia-uvm") is None
    assert procfs.device_gpu_index("/dev/null") is None


def test_device_fds_unreadable_is_unknown_not_none(fake, monkeypatch):
    real = os.listdir

    def listdir(path):
        if path.endswith("/101/fd"):
            raise PermissionError(13, "Permission denied")
        return real(path)

    monkeypatch.setattr(procfs.os, "listdir", listdir)
    assert procfs.device_fds(101, proc_root=str(fake.root)) is None


def test_deleted_device_target(tmp_path):
    proc = FakeProc(tmp_path)
    proc.add(5, "x", fds=["/dev/nvidia2 (deleted)"])
    assert procfs.device_fds(5, proc_root=str(tmp_path)) == ["/dev/nvidia2"]


def test_missing_proc_root(tmp_path):
    assert procfs.list_pids(str(tmp_path / "nope")) == []
    assert procfs.process_table(str(tmp_path / "nope")) == {}


# ---------------------------------------------------------------------------
# Deadline
# ---------------------------------------------------------------------------

class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_deadline_is_monotonic_and_clamps():
    clock = Clock()
    deadline = procfs.Deadline(5, clock=clock)
    assert deadline.remaining() == 5 and not deadline.expired()
    assert deadline.clamp(0.5) == 0.5
    clock.now = 104.8
    assert abs(deadline.clamp(0.5) - 0.2) < 1e-9
    assert abs(deadline.elapsed() - 4.8) < 1e-9
    deadline.shorten(10)                      # never later
    assert abs(deadline.remaining() - 0.2) < 1e-9
    deadline.shorten(0.1)
    assert abs(deadline.remaining() - 0.1) < 1e-9
    clock.now = 106
    assert deadline.remaining() == 0 and deadline.expired() and deadline.clamp(1) == 0
    assert procfs.Deadline(-3, clock=clock).expired()


# ---------------------------------------------------------------------------
# Live /proc
# ---------------------------------------------------------------------------

def _fork_child(target):
    pid = os.fork()
    if pid == 0:
        try:
            target()
        finally:
            os._exit(0)
    return pid


def _pause_forever():
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    while True:
        signal.pause()


@pytest.fixture
def children():
    """PIDs forked by a test; SIGKILLed and reaped by PID at teardown."""
    pids = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def test_live_table_contains_this_process_and_its_ancestors():
    table = procfs.process_table()
    me = table[os.getpid()]
    assert me.ppid == os.getppid()
    assert me.pgid == os.getpgid(0) and me.sid == os.getsid(0)
    # (compared with /proc itself: pytest-xdist retitles its workers)
    with open("/proc/self/cmdline", "rb") as fh:
        assert list(me.cmdline) == [a.decode() for a in fh.read().split(b"\0")[:-1]] and me.cmdline
    chain = procfs.self_and_ancestors()
    assert chain[0] == os.getpid() and chain[1] == os.getppid()
    assert procfs.ancestors(table, os.getpid())[:1] == [os.getppid()]
    assert procfs.read_stat(os.getpid())["starttime"] == me.starttime


def test_live_children_and_handles(children):
    pid = _fork_child(_pause_forever)
    children.append(pid)
    assert procfs.ProcessHandle.open(pid, 1) is None         # wrong start time: not that process
    time.sleep(0.05)
    table = procfs.process_table(with_cgroup=False)
    assert pid in procfs.descendants(table, os.getpid())
    handle = procfs.ProcessHandle.open(pid, table[pid].starttime)
    assert handle is not None and handle.same_process() and not handle.gone()
    assert handle.state() in ("S", "R")
    seen = []
    deadline = procfs.Deadline(0.1)
    assert procfs.wait_gone([handle], deadline, interval=0.02, on_exit=seen.append) == [handle]
    assert deadline.expired()
    assert handle.send(signal.SIGTERM) is True
    assert handle.signals == ["SIGTERM"]
    # The child is now a zombie (we have not reaped it): that counts as gone.
    start = time.monotonic()
    assert procfs.wait_gone([handle], procfs.Deadline(5), on_exit=seen.append) == []
    assert time.monotonic() - start < 1.0
    assert seen == [handle]
    assert procfs.read_stat(pid)["state"] == "Z"
    assert handle.send(signal.SIGKILL) is False               # exited: nothing more is sent
    assert handle.signals == ["SIGTERM"]
    os.waitpid(pid, 0)
    children.remove(pid)
    assert handle.gone() and handle.state() is None
    assert handle.send(signal.SIGKILL) is False               # gone: never delivered to anyone
    handle.close()


def test_handle_without_pidfd_rechecks_start_time(children, monkeypatch):
    monkeypatch.setattr(stop, "_pidfd_supported", lambda: False)
    pid = _fork_child(_pause_forever)
    children.append(pid)
    time.sleep(0.05)
    start = procfs.read_stat(pid)["starttime"]
    handle = procfs.ProcessHandle.open(pid, start)
    assert handle.pidfd is None
    handle.starttime = start + 1                              # pretend the PID was reused
    assert handle.send(signal.SIGKILL) is False
    assert procfs.read_stat(pid)["state"] != "Z"
    handle.starttime = start
    assert handle.send(signal.SIGKILL) is True
    assert procfs.wait_gone([handle], procfs.Deadline(5), sleep=time.sleep) == []


def test_zombie_leader_with_live_threads_is_not_gone(children):
    def leader_exits_first():
        threading.Thread(target=time.sleep, args=(30,), daemon=False).start()
        ctypes.CDLL(None).pthread_exit(None)

    pid = _fork_child(leader_exits_first)
    children.append(pid)
    assert procfs.wait_gone([], procfs.Deadline(0)) == []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        stat = procfs.read_stat(pid)
        if stat["state"] == "Z":
            break
        time.sleep(0.01)
    stat = procfs.read_stat(pid)
    assert stat["state"] == "Z" and stat["num_threads"] == 2
    handle = procfs.ProcessHandle.open(pid, stat["starttime"])
    assert not handle.gone()                                 # its thread still holds the files
    assert not procfs.read_proc(pid).exited
    assert handle.send(signal.SIGKILL)
    assert procfs.wait_gone([handle], procfs.Deadline(5)) == []
