"""Helpers of the preflight (module_utils/redeploy/survey.py).

classify_holders runs on a synthetic process table (procfs.ProcInfo) whose PIDs lie above the
kernel's largest possible pid_max (2**22), so no real process can stand in for them; only the
"foreign with ports" case adds this test process itself, with a socket it listens on.
"""
from __future__ import annotations

import json
import os
import re
import socket

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import query as gpu_query
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import survey as pf
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import secrets
from ansible_collections.gpufleet.sglang.plugins.module_utils.node.procfs import ProcInfo

B = 5_000_000       # above any pid_max


# ---------------------------------------------------------------------------
# read_arch / compute_capability / gpu_facts
# ---------------------------------------------------------------------------

def test_read_arch(tmp_path):
    model = tmp_path / "llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM", "Other"]}))
    assert pf.read_arch(str(model)) == ("LlamaForCausalLM", None)


def test_read_arch_problems(tmp_path):
    arch, err = pf.read_arch(str(tmp_path / "missing"))
    assert arch is None and "does not exist" in err
    afile = tmp_path / "file"
    afile.write_text("x")
    assert pf.read_arch(str(afile))[1] == "does not exist or is not a directory"
    empty = tmp_path / "empty"
    empty.mkdir()
    arch, err = pf.read_arch(str(empty))
    assert arch is None and "no readable config.json" in err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{nope")
    arch, err = pf.read_arch(str(bad))
    assert arch is None and "not valid JSON" in err


@pytest.mark.parametrize("content", [{}, {"architectures": []}, {"architectures": "Llama"}, {"architectures": [3]}, [1, 2],
                                     "text"])
def test_read_arch_without_architecture(tmp_path, content):
    (tmp_path / "config.json").write_text(json.dumps(content))
    assert pf.read_arch(str(tmp_path)) == (None, None)


@pytest.mark.parametrize("name, cc", [
    ("NVIDIA H100 80GB HBM3", "9.0"), ("NVIDIA H100 NVL", "9.0"), ("NVIDIA H200", "9.0"), ("NVIDIA H800", "9.0"),
    ("NVIDIA GH200 480GB", "9.0"), ("NVIDIA B200", "10.0"), ("NVIDIA GB200", "10.0"), ("NVIDIA B300 SXM6 AC", "10.3"),
    ("NVIDIA A100-SXM4-80GB", "8.0"), ("NVIDIA A800 80GB PCIe", "8.0"), ("NVIDIA A10G", "8.6"), ("NVIDIA A10", "8.6"),
    ("NVIDIA A40", "8.6"), ("NVIDIA L40S", "8.9"), ("NVIDIA L40", "8.9"), ("NVIDIA L4", "8.9"),
    ("Tesla V100-SXM2-16GB", "7.0"),
    # the captures' second GPU (tests/captures/nvidia-smi): not in the table, and not mistaken for another
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", None), ("NVIDIA GeForce RTX 4090", None),
    ("Tesla T4", None), ("", None), (None, None), ("Some Future GPU", None),
])
def test_compute_capability(name, cc):
    assert pf.compute_capability(name) == cc


def test_gpu_facts():
    gpus = [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "total_mib": 81559},
            {"index": 1, "name": "NVIDIA H100 80GB HBM3", "total_mib": 80000}]
    assert pf.gpu_facts(gpus) == {"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "memory_mib": 80000,
                                  "count": 2}
    # nvidia-smi's compute_cap wins over the name table.
    assert pf.gpu_facts([dict(gpus[0], compute_cap="9.1")])["compute_capability"] == "9.1"
    unknown = {"name": "Unknown", "compute_capability": None, "memory_mib": None, "count": 1}
    assert pf.gpu_facts([{"name": "Unknown", "total_mib": None}]) == unknown
    assert pf.gpu_facts([]) is None and pf.gpu_facts(None) is None


# ---------------------------------------------------------------------------
# probe_writable
# ---------------------------------------------------------------------------

def test_probe_writable_dir(tmp_path):
    before = sorted(os.listdir(str(tmp_path)))
    assert pf.probe_writable(str(tmp_path)) is None
    assert sorted(os.listdir(str(tmp_path))) == before          # the probe file is gone


def test_probe_missing_dir_under_writable_parent(tmp_path):
    target = tmp_path / "config" / "deeper" / "sglang"
    assert pf.probe_writable(str(target)) is None
    assert not (tmp_path / "config").exists()                    # checked, not made
    assert os.listdir(str(tmp_path)) == []


def test_probe_path_under_a_regular_file(tmp_path):
    afile = tmp_path / "reports"
    afile.write_text("a file where a directory should be")
    why = pf.probe_writable(str(afile / "2026" / "report.d"))
    assert why == "%s exists and is not a directory" % afile
    why = pf.probe_writable(str(afile))
    assert "not a directory" in why
    assert os.listdir(str(tmp_path)) == ["reports"]


@pytest.mark.parametrize("path", ["/proc", "/proc/gpufleet-not-there/state"])
def test_probe_unwritable_dir(path):
    # Even root cannot create a file in /proc.
    why = pf.probe_writable(path)
    assert why and why.startswith("cannot create a file in /proc:")
    assert not [n for n in os.listdir("/proc") if n.startswith(".gpufleet-probe")]


def test_probe_not_enough_room(tmp_path):
    st = os.statvfs(str(tmp_path))
    free_mib = st.f_bavail * st.f_frsize / (1024.0 * 1024.0)
    need = int(free_mib * 4) + 1024
    why = pf.probe_writable(str(tmp_path), min_free_mib=need)
    assert why and "MiB free" in why and ("at least %d MiB" % need) in why and str(tmp_path) in why
    assert os.listdir(str(tmp_path)) == []
    assert pf.probe_writable(str(tmp_path), min_free_mib=0) is None


def test_probe_relative_path_without_existing_parent():
    assert pf.probe_writable("gpufleet-no-such-relative-dir/x") == "no existing parent directory"


# ---------------------------------------------------------------------------
# listening_ports
# ---------------------------------------------------------------------------

@pytest.fixture
def listener():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    yield sock.getsockname()[1]
    sock.close()


def test_listening_ports_of_this_process(listener):
    bound = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    bound.bind(("127.0.0.1", 0))                   # bound, not listening: not a port it serves
    try:
        ports = pf.listening_ports([os.getpid()])
        assert listener in ports
        assert bound.getsockname()[1] not in ports
        assert ports == sorted(set(ports))
    finally:
        bound.close()
    assert listener not in pf.listening_ports([B + 1])            # no such process
    assert pf.listening_ports([]) == []


def test_listening_ports_closed_socket(listener):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    port = sock.getsockname()[1]
    assert port in pf.listening_ports([os.getpid()])
    sock.close()
    assert port not in pf.listening_ports([os.getpid()])


# ---------------------------------------------------------------------------
# classify_holders
# ---------------------------------------------------------------------------

SECRET = "sk-holder-secret-1"
FOREIGN_SECRET = "sk-foreign-secret-2"


def P(pid, ppid=1, sid=None, pgid=None, comm="python3", cmdline=("python3",), uid=0, unit=None, state="S"):
    return ProcInfo(pid, ppid=ppid, pgid=pgid if pgid is not None else (sid or pid), sid=sid or pid, state=state,
                    comm=comm, cmdline=cmdline, uid=uid, unit=unit)


def table(me=None):
    procs = [
        P(1, ppid=0, comm="systemd", cmdline=("/sbin/init",)),
        # the managed server: leader, a child, a member of its session reparented to init
        P(B + 100, cmdline=("python3", "-m", "sglang.launch_server", "--api-key", SECRET, "--port", "30000")),
        P(B + 101, ppid=B + 100, sid=B + 100, comm="sglang::schedul"),
        P(B + 102, ppid=1, sid=B + 100, comm="sglang::detoken"),
        P(B + 103, ppid=B + 100, sid=B + 100, comm="nvidia-persistenced", cmdline=("/usr/bin/nvidia-persistenced",)),
        # a process of the managed systemd unit
        P(B + 150, unit="sglang-llama.service"),
        # left over from the recorded (dead) session B+200, and a process group B+210
        P(B + 201, sid=B + 200, comm="sglang::schedul"),
        P(B + 211, sid=B + 211, pgid=B + 210),
        # adopted by PID (and its child), and by the managed port
        P(B + 300, cmdline=("python3", "-m", "sglang.launch_server", "--port", "30000")),
        P(B + 301, ppid=B + 300, sid=B + 300, comm="sglang::schedul"),
        P(B + 350, cmdline=("python3", "-m", "sglang.launch_server")),
        # adopted by pattern: its own command line, or its session leader's
        P(B + 400, cmdline=("python3", "-m", "sglang.launch_server", "--served-model-name", "team-x")),
        P(B + 450, comm="tmux", cmdline=("tmux", "new", "-s", "team-y")),
        P(B + 451, ppid=B + 450, sid=B + 450, cmdline=("python3", "worker.py")),
        # orphans: session leader gone, or a zombie
        P(B + 501, sid=B + 500, comm="sglang::schedul"),
        P(B + 510, comm="bash", cmdline=(), state="Z"),
        P(B + 511, ppid=1, sid=B + 510, comm="sglang::schedul"),
        # GPU system daemons, by comm and by argv[0]
        P(B + 600, comm="nvidia-persistenced", cmdline=("/usr/bin/nvidia-persistenced", "--user", "nvidia")),
        P(B + 601, comm="nv-hostengi", cmdline=("/usr/bin/nv-hostengine", "-n")),
        # another team's server: leader is a live shell
        P(B + 700, comm="bash", cmdline=("bash", "-l"), uid=4_000_001),
    ]
    if me is not None:
        procs.append(P(me, ppid=B + 700, sid=B + 700, uid=0,
                       cmdline=("python3", "-m", "sglang.launch_server", "--api-key", FOREIGN_SECRET, "--port", "31000")))
    return dict((p.pid, p) for p in procs)


def classify(tab, holders, **kw):
    args = dict(managed_pids=[B + 100], managed_unit="sglang-llama.service", recorded_pids=[B + 200, B + 210, None],
                adopt_pids=[B + 300], adopt_res=[re.compile("team-x"), re.compile(r"tmux .*team-y")],
                port_owner_pids=[B + 350], exclude_names=set(gpu_query.GPU_SYSTEM_DAEMONS))
    args.update(kw)
    out = pf.classify_holders(tab, holders, args["managed_pids"], args["managed_unit"], args["recorded_pids"],
                              args["adopt_pids"], args["adopt_res"], args["port_owner_pids"], args["exclude_names"],
                              watchers=args.get("watchers"), suspects=args.get("suspects"))
    return dict((e["pid"], e) for e in out), out


EXPECTED = {
    B + 100: "managed", B + 101: "managed", B + 102: "managed", B + 103: "system", B + 150: "managed",
    B + 201: "managed", B + 211: "managed", B + 300: "adopted", B + 301: "adopted", B + 350: "adopted",
    B + 400: "adopted", B + 451: "adopted", B + 501: "orphan", B + 511: "orphan", B + 600: "system", B + 601: "system",
    B + 900: "gone",
}


def test_classify_every_kind(listener):
    me = os.getpid()
    tab = table(me)
    holders = dict((pid, {pid % 4, 3}) for pid in EXPECTED)
    holders[me] = {2}
    holders[None] = {1}
    by_pid, out = classify(tab, holders)
    assert [e["pid"] for e in out] == sorted(list(EXPECTED) + [me])       # None skipped, sorted
    got = dict((pid, e["class"]) for pid, e in by_pid.items())
    expected = dict(EXPECTED)
    expected[me] = "foreign"
    assert got == expected
    for pid, entry in by_pid.items():
        assert entry["gpus"] == sorted(holders[pid])
        assert entry["why"] or entry["class"] == "foreign"
    foreign = by_pid[me]
    assert listener in foreign["ports"]
    assert "31000" in foreign["cmdline"] and FOREIGN_SECRET not in foreign["cmdline"] and secrets.MASK in foreign["cmdline"]
    assert str(B + 700) in foreign["why"] and "bash -l" in foreign["why"]
    assert foreign["session"] == B + 700
    text = pf.describe_foreign(foreign)
    assert str(me) in text and "GPUs 2" in text and str(listener) in text and FOREIGN_SECRET not in text
    # No secret anywhere in the classification.
    assert SECRET not in repr(out) and FOREIGN_SECRET not in repr(out)
    assert "ports" not in by_pid[B + 100]


def test_classify_reasons():
    by_pid, dummy = classify(table(), dict((pid, {0}) for pid in EXPECTED))
    assert "recorded session %d" % (B + 200) in by_pid[B + 201]["why"]
    assert "matches adopt_patterns" in by_pid[B + 400]["why"] and "matches adopt_patterns" in by_pid[B + 451]["why"]
    assert "named by adopt_pids)" in by_pid[B + 300]["why"]
    assert ("session leader %d is gone" % (B + 500)) in by_pid[B + 501]["why"]
    assert "never signalled" in by_pid[B + 600]["why"]
    assert "exited" in by_pid[B + 900]["why"] and by_pid[B + 900]["user"] is None


def test_classify_users_and_masked_cmdline():
    by_pid, dummy = classify(table(), {B + 100: {0}, B + 700: {0}})
    assert by_pid[B + 100]["user"] == "root"
    assert by_pid[B + 700]["user"] == "4000001"             # no passwd entry: the uid
    assert SECRET not in by_pid[B + 100]["cmdline"] and "--api-key " + secrets.MASK in by_pid[B + 100]["cmdline"]
    assert by_pid[B + 700]["class"] == "foreign"           # a live session leader that is not ours


def test_classify_without_adoption_inputs_makes_them_foreign_or_orphan():
    by_pid, dummy = classify(table(), dict((pid, {0}) for pid in (B + 300, B + 350, B + 400, B + 451, B + 150, B + 201)),
                             adopt_pids=[], adopt_res=[], port_owner_pids=[], managed_unit=None, recorded_pids=[])
    assert by_pid[B + 300]["class"] == "foreign"
    assert by_pid[B + 350]["class"] == "foreign"
    assert by_pid[B + 400]["class"] == "foreign"
    assert by_pid[B + 451]["class"] == "foreign"
    assert by_pid[B + 150]["class"] == "foreign"            # the unit only counts when it is the managed one
    assert by_pid[B + 201]["class"] == "orphan"             # without the record it is only an orphan


def test_classify_managed_session_only_from_a_session_leader():
    # B+101 is managed as a descendant; B+102 only because B+100 leads their session.
    tab = table()
    by_pid, dummy = classify(tab, {B + 101: {0}, B + 102: {0}}, managed_pids=[B + 101])
    assert by_pid[B + 101]["class"] == "managed"
    assert by_pid[B + 102]["class"] != "managed"


def test_classify_missing_managed_pid_is_harmless():
    by_pid, dummy = classify(table(), {B + 101: {0}}, managed_pids=[B + 999])
    assert by_pid[B + 101]["class"] != "managed"


# ---------------------------------------------------------------------------
# compile_patterns
# ---------------------------------------------------------------------------

def test_compile_patterns():
    compiled, problems = pf.compile_patterns(["team-x", r"--port\s+3100\d"])
    assert problems == [] and [c.pattern for c in compiled] == ["team-x", r"--port\s+3100\d"]
    assert compiled[1].search("python -m sglang.launch_server --port 31001")
    assert pf.compile_patterns(None) == ([], []) and pf.compile_patterns([]) == ([], [])


def test_compile_patterns_reports_each_bad_one():
    compiled, problems = pf.compile_patterns(["(unclosed", "ok", "[z-a]"])
    assert [c.pattern for c in compiled] == ["ok"]
    assert len(problems) == 2
    assert all(p.startswith("adopt_patterns:") for p in problems)
    assert "'(unclosed'" in problems[0] and "'[z-a]'" in problems[1]


# ===========================================================================
# BUGS FOUND (tests below fail until the lead's fix; see H6's report)
# ===========================================================================

def test_serving_process_whose_session_leader_is_gone_is_not_an_orphan(listener):
    # Issue 12 section 5: another team's hand-started server, launched with nohup from an ssh
    # shell that has since logged out (its session leader is gone), under its own user and on its
    # own port. Nothing links it to this deploy (no record, not adopted), yet it is classified
    # "orphan", and orphans are torn down without consent.
    me = os.getpid()
    tab = table()
    tab[me] = P(me, ppid=1, sid=B + 800, uid=4_000_001,
                cmdline=("python3", "-m", "sglang.launch_server", "--port", "31000"))
    by_pid, dummy = classify(tab, {me: {2, 3}})
    assert listener in pf.listening_ports([me])
    assert by_pid[me]["class"] == "foreign", by_pid[me]


# ---------------------------------------------------------------------------
# Watchers: memory_accounting and find_watchers (issue 28 part 1, docs/reference/gpu-watchers.md)
# ---------------------------------------------------------------------------

DEV = "/dev/nvidia%s"


def gpu(index, used, procs=(), **extra):
    return dict({"index": index, "used_mib": used, "mig_mode": None, "lost": False,
                 "processes": [{"pid": pid, "used_mib": mib} for pid, mib in procs]}, **extra)


def watch_table():
    procs = [
        P(1, ppid=0, comm="systemd", cmdline=("/sbin/init",)),
        P(B + 10, comm="python3", cmdline=("python3", "-m", "sglang.launch_server")),       # a server; its scheduler:
        P(B + 11, ppid=B + 10, sid=B + 10, comm="sglang::schedul"),
        P(B + 12, ppid=B + 10, sid=B + 10, comm="sglang::detoken"),                         # no context, in its session
        P(B + 20, comm="dcgm-exporter2", cmdline=("/usr/bin/exporter",)),                    # an NVML exporter
        P(B + 21, comm="nvtop", cmdline=("nvtop",)),                                         # nvtop, with uvm open
        P(B + 30, sid=B + 30, comm="sglang::schedul"),                                      # an orphaned scheduler
    ]
    return dict((p.pid, p) for p in procs)


def fds_of(mapping):
    return lambda pid: mapping.get(pid, [])


def index_of(path):
    base = os.path.basename(path)
    return int(base[6:]) if base[6:].isdigit() else None


def test_memory_accounting_a_gpu_whose_memory_listed_processes_cover():
    tab = watch_table()
    fds = fds_of({B + 11: [DEV % 0, "/dev/nvidiactl", "/dev/nvidia-uvm"]})
    got = pf.memory_accounting([gpu(0, 70001, [(B + 11, 70000)]), gpu(1, 1), gpu(2, 16 + pf.WATCH_SLACK_MIB)], tab, fds)
    assert got == {0: None, 1: None, 2: None}
    # MIG: the idle baseline of a MIG GPU (96 MiB) plus the slack.
    assert pf.memory_accounting([gpu(3, 96 + pf.WATCH_SLACK_MIB, mig_mode="Enabled")], tab, fds) == {3: None}


@pytest.mark.parametrize("reading,fds,why", [
    # a forked child keeps its dead parent's memory unlisted (docs/reference/nvidia-smi.md §3.2 b), or an orphan context
    (gpu(0, 4001), {}, "4001 of its 4001 MiB used belong to no process nvidia-smi lists"),
    (gpu(0, 70001, [(B + 11, 60000)]), {B + 11: [DEV % 0]}, "10001 of its 70001 MiB used belong to no process"),
    # inside a container: NVML reports host PIDs, which /proc here does not show
    (gpu(0, 70001, [(4_194_304 + 77, 70000)]), {}, "which is not visible in /proc: another PID namespace"),
    # a listed PID that names another process here (no device file open)
    (gpu(0, 70001, [(B + 20, 70000)]), {}, "has no GPU device file open here: the PID names another process"),
    (gpu(0, 70001, [(B + 11, 70000)]), {B + 11: None}, "cannot be inspected"),
    (gpu(0, 70001, [(B + 11, None)]), {B + 11: [DEV % 0]}, "nvidia-smi lists a process without its memory"),
    (gpu(0, 70001, [(None, 70000)]), {}, "nvidia-smi lists a process without a PID"),
    (gpu(0, None), {}, "its used memory is unknown"),
    (dict(gpu(0, 1), lost=True), {}, "its used memory is unknown"),
])
def test_memory_accounting_names_why_memory_is_not_accounted_for(reading, fds, why):
    got = pf.memory_accounting([reading], watch_table(), lambda pid: fds.get(pid, []))
    assert why in got[0], got


def test_find_watchers_tells_watchers_from_users():
    tab = watch_table()
    listed = {B + 11: {0}}
    paths = {
        B + 12: [DEV % 0, "/dev/nvidiactl", "/dev/nvidia-uvm"],              # in the listed scheduler's session
        B + 20: ["/dev/nvidiactl", DEV % 0, DEV % 1],                         # pure NVML: no uvm
        B + 21: ["/dev/nvidiactl", "/dev/nvidia-uvm", DEV % 0, DEV % 1],
        B + 30: [DEV % 1, "/dev/nvidia-uvm"],                                 # an SGLang process: never a watcher
        B + 11: [DEV % 0, "/dev/nvidia-uvm"],                                 # listed: a user
    }
    watchers, suspects = pf.find_watchers(tab, listed, paths, {0: None, 1: None}, index_of)
    assert sorted(watchers) == [B + 20, B + 21] and suspects == {}
    assert watchers[B + 20].startswith("watches GPU 0,1: it only has device files open (nvidia0, nvidia1, nvidiactl)")
    assert "without /dev/nvidia-uvm it cannot hold a CUDA context at all; never signalled" in watchers[B + 20]
    assert "it has /dev/nvidia-uvm open but no context on these GPUs" in watchers[B + 21]


def test_find_watchers_clears_no_one_on_a_gpu_whose_memory_nobody_listed_accounts_for():
    tab = watch_table()
    paths = {B + 20: ["/dev/nvidiactl", DEV % 0, DEV % 1], B + 21: ["/dev/nvidiactl", DEV % 0]}
    accounting = {0: None, 1: "nvidia-smi lists PID 4194381 (70000 MiB), which is not visible in /proc"}
    watchers, suspects = pf.find_watchers(tab, {}, paths, accounting, index_of)
    assert sorted(watchers) == [B + 21]
    assert suspects[B + 20] == ("it only has device files open, but it may be the user nvidia-smi cannot name: on GPU 1 "
                                "nvidia-smi lists PID 4194381 (70000 MiB), which is not visible in /proc")
    # classify_holders: the watcher is a watcher; the suspect stays what it was, with the reason added.
    by_pid, dummy = classify(tab, {B + 20: {0, 1}, B + 21: {0}}, watchers=watchers, suspects=suspects)
    assert by_pid[B + 21]["class"] == "watcher" and by_pid[B + 21]["why"] == watchers[B + 21]
    assert by_pid[B + 20]["class"] in ("foreign", "orphan") and suspects[B + 20] in by_pid[B + 20]["why"]


def test_classify_keeps_managed_and_adopted_before_watchers():
    # A process of the managed server that holds only device files is the server's, not a watcher.
    by_pid, dummy = classify(table(), {B + 102: {0}, B + 301: {0}}, watchers={B + 102: "w", B + 301: "w"})
    assert by_pid[B + 102]["class"] == "managed" and by_pid[B + 301]["class"] == "adopted"
    # An adopt pattern does not make a watcher a server to replace (watchers are never signalled).
    by_pid, dummy = classify(table(), {B + 400: {0}}, watchers={B + 400: "watches GPU 0"})
    assert by_pid[B + 400]["class"] == "watcher"
