"""The in-process engines (teardown.run_drain, gpu_verify.run_assert) on the GPU simulator.

Covers what sglang_replace relies on: the API without AnsibleModule, holders
that left their server's tree (their parent died before the redeploy and they
were reparented to a subreaper), expected_pids / on_unexpected, and secrets
in every command line a result carries.

Every process is started here, recorded by PID and start time, and SIGKILLed
by PID at teardown; this test process is a child subreaper while a test runs,
so the orphans are reparented to it and reaped here.
"""
from __future__ import annotations

import ctypes
import json
import os
import pathlib
import select
import signal
import subprocess
import sys
import time

import pytest

from ansible.module_utils.testing import patch_module_args

from ansible_collections.gpufleet.sglang.plugins.filter.sglang_mask import mask as filter_mask
from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import teardown
from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import target as gpu_target
from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import verify as gpu_verify
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import procfs
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import sockets
from ansible_collections.gpufleet.sglang.plugins.modules import gpu_drain

REPO = pathlib.Path(__file__).resolve().parents[4]
SIM_BIN = REPO / "simulator" / "bin"
SECRET = "hf_SeCrEt0123456789"
KEY = "sk-live-77aa"

# A "server": leads its own session (start_new_session), forks a scheduler that opens the GPU device and a
# detokenizer that listens on a port and holds no GPU memory, reports their PIDs as one JSON line, then
# either exits (the server died before the redeploy) or forks the scheduler through an intermediate that
# exits (the scheduler left the tree while the server lives).
SERVER = r"""
import json, os, signal, socket, sys, time
dev, mode, wfd = sys.argv[1], sys.argv[2], int(sys.argv[3])
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
    signal.signal(sig, signal.SIG_DFL)
def idle():
    while True:
        signal.pause()
def scheduler(ready):
    fd = os.open(dev, os.O_RDWR)
    os.write(ready, b"%d\n" % os.getpid())
    idle()
r, w = os.pipe()
if mode == "intermediate":
    if os.fork() == 0:
        if os.fork() == 0:
            scheduler(w)
        os._exit(0)
    os.wait()
elif os.fork() == 0:
    scheduler(w)
sched = int(os.read(r, 64).split()[0])
lsock = socket.socket()
lsock.bind(("127.0.0.1", 0))
port = lsock.getsockname()[1]
detok = os.fork()
if detok == 0:
    lsock.listen(1)
    idle()
lsock.close()
os.write(wfd, (json.dumps({"server": os.getpid(), "scheduler": sched, "detok": detok, "port": port}) + "\n").encode())
if mode == "die":
    os._exit(0)
idle()
"""


@pytest.fixture
def subreaper():
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(36, 1, 0, 0, 0) == 0          # PR_SET_CHILD_SUBREAPER
    started = []
    yield started
    for pid, start in started:
        stat = procfs.read_stat(pid)
        if stat is not None and stat["starttime"] == start:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            pid, dummy = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            time.sleep(0.02)
    libc.prctl(36, 0, 0, 0, 0)


@pytest.fixture
def node(tmp_path, monkeypatch):
    root = tmp_path / "gpusim"
    root.mkdir()
    env = dict(os.environ, GPUSIM_ROOT=str(root), PATH="%s:%s" % (SIM_BIN, os.environ["PATH"]))
    monkeypatch.setenv("GPUSIM_ROOT", str(root))
    monkeypatch.setenv("PATH", env["PATH"])
    subprocess.run([str(SIM_BIN / "gpusim"), "init", "--gpus", "4", "--model", "H200"], env=env, check=True,
                   capture_output=True)
    return {"root": root, "env": env, "dev": str(root / "dev" / "nvidia*")}


def gpusim(node, *args):
    proc = subprocess.run([str(SIM_BIN / "gpusim")] + [str(a) for a in args], env=node["env"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def track(started, *pids):
    for pid in pids:
        stat = procfs.read_stat(pid)
        if stat is not None:
            started.append((pid, stat["starttime"]))


def start_server(node, started, mode, gpu=0, mib=20000, extra_args=()):
    r, w = os.pipe()
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(node["root"] / "dev" / ("nvidia%d" % gpu)), mode, str(w)]
                            + list(extra_args), pass_fds=(w,), start_new_session=True, env=node["env"])
    os.close(w)
    ready, dummy, dummy2 = select.select([r], [], [], 30)
    assert ready, "the server did not report"
    info = json.loads(os.read(r, 4096).decode().splitlines()[0])
    os.close(r)
    track(started, info["server"], info["scheduler"], info["detok"])
    if mode == "die":
        proc.wait(timeout=10)                     # the server is gone; its children live on, reparented
    gpusim(node, "attach", "--pid", info["scheduler"], "--gpus", gpu, "--mib", mib, "--name", "sglang::scheduler")
    return info


def alive(pid):
    stat = procfs.read_stat(pid)
    return stat is not None and not procfs.is_exited(stat["state"], stat["num_threads"])


def params(node, **kw):
    p = teardown.defaults()
    p.update(device_paths=[node["dev"]], term_timeout=10, kill_timeout=5)
    p.update(kw)
    return p


def test_defaults_are_the_module_options():
    assert teardown.defaults()["on_unexpected"] == "signal" and teardown.defaults()["expected_pids"] == []
    assert set(teardown.defaults()) == set(teardown.ARGUMENT_SPEC)
    assert gpu_verify.defaults()["mig_max_used_mib"] == 96 and set(gpu_verify.defaults()) == set(gpu_verify.ARGUMENT_SPEC)
    assert teardown.defaults()["device_paths"] == ["/dev/nvidia*"]


def test_holders_of_a_server_that_died_before_the_redeploy(node, subreaper):
    info = start_server(node, subreaper, "die")
    stat = procfs.read_stat(info["scheduler"])
    assert stat["ppid"] == os.getpid() and not alive(info["server"])          # reparented to this subreaper
    warnings = []
    res = teardown.run_drain(params(node, gpus=[0]), gpu_target.subprocess_run(), warn=warnings.append)
    by_pid = dict((e["pid"], e) for e in res["signalled"])
    assert by_pid[info["scheduler"]]["signals"] == ["SIGTERM"]
    detok = by_pid[info["detok"]]
    assert detok["role"] == "member" and detok["gpus"] == [] and detok["signals"] == ["SIGTERM"]
    assert "dead leader %d" % info["server"] in detok["how"]
    assert not alive(info["scheduler"]) and not alive(info["detok"])
    assert res["changed"] and res["survivors"] == []


def test_a_scheduler_that_left_the_tree_of_a_live_server(node, subreaper):
    info = start_server(node, subreaper, "intermediate")
    assert procfs.read_stat(info["scheduler"])["ppid"] != info["server"]
    res = teardown.run_drain(params(node, gpus=[0]), gpu_target.subprocess_run())
    by_pid = dict((e["pid"], e) for e in res["signalled"])
    assert by_pid[info["server"]]["role"] == "root" and "left its tree" in by_pid[info["server"]]["how"]
    assert by_pid[info["scheduler"]]["signals"] == ["SIGTERM"]         # no root tears it down: it gets the signal
    # The detokenizer is the server's child: the server exits on SIGTERM without it, so it gets SIGKILL after the grace.
    assert by_pid[info["detok"]]["role"] == "descendant" and by_pid[info["detok"]]["signals"] == ["SIGKILL"]
    assert not any(alive(p) for p in (info["server"], info["scheduler"], info["detok"]))


def test_expected_pids_fail_before_anything_is_signalled_and_name_the_holder(node, subreaper):
    ours = start_server(node, subreaper, "live", gpu=1)
    foreign = start_server(node, subreaper, "live", gpu=2, extra_args=["--hf-token", SECRET, "--api-key=" + KEY])
    p = params(node, gpus=[1, 2], expected_pids=[ours["server"]], on_unexpected="fail")
    with pytest.raises(teardown.DrainError) as exc:
        teardown.run_drain(p, gpu_target.subprocess_run())
    err = exc.value
    assert alive(ours["server"]) and alive(foreign["server"]) and alive(foreign["scheduler"])
    assert all(not e["signals"] for e in err.result["signalled"])
    unexpected = err.result["unexpected"]
    assert [u["pid"] for u in unexpected] == [foreign["scheduler"]]
    assert unexpected[0]["user"] and unexpected[0]["gpus"] == [2]
    assert "outside expected_pids" in err.msg and "PID %d (user " % foreign["scheduler"] in err.msg
    assert SECRET not in err.msg and SECRET not in json.dumps(err.result) and KEY not in json.dumps(err.result)
    assert "--hf-token ********" in json.dumps(err.result)
    # The entry names the ports its server listens on (here its detokenizer's).
    assert foreign["port"] in sockets.listening_ports(foreign["detok"])
    assert unexpected[0]["ports"] == [foreign["port"]] and "listening on %d" % foreign["port"] in err.msg
    # on_unexpected=signal (the standalone default) stops both and warns.
    warnings = []
    res = teardown.run_drain(dict(p, on_unexpected="signal"), gpu_target.subprocess_run(), warn=warnings.append)
    assert any("outside expected_pids" in w for w in warnings) and SECRET not in " ".join(warnings)
    assert not alive(foreign["scheduler"]) and not alive(ours["scheduler"])
    assert SECRET not in json.dumps(res)


def test_secrets_in_a_holders_command_line_never_leave_the_module(node, subreaper, capsys):
    holder = start_server(node, subreaper, "live", gpu=3,
                          extra_args=["--hf-token", SECRET, "--api-key", KEY, "HF_TOKEN=" + SECRET,
                                      "--admin-api-key=" + KEY, "--model-path", "https://bob:%s@hub.example/m" % SECRET,
                                      "--tokenizer-path", "https://hub.example/t?access_token=%s" % SECRET])
    args = {"gpus": [3], "device_paths": [node["dev"]], "_ansible_check_mode": True}
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            gpu_drain.main()
    out = capsys.readouterr().out
    assert SECRET not in out and KEY not in out
    res = json.loads(out)
    root = [e for e in res["signalled"] if e["pid"] == holder["server"]][0]
    assert "--hf-token ******** --api-key ********" in root["cmdline"] and "HF_TOKEN=********" in root["cmdline"]
    assert "--admin-api-key=********" in root["cmdline"] and "https://bob:********@hub.example/m" in root["cmdline"]
    assert "?access_token=********" in root["cmdline"]
    assert filter_mask(res) == res                                       # the filter finds nothing left to mask
    raw = " ".join(procfs.read_cmdline(holder["server"]))
    assert SECRET in raw and SECRET not in filter_mask(raw)


def test_run_assert_in_process_and_its_error(node, subreaper):
    res = gpu_verify.run_assert(dict(gpu_verify.defaults(), gpus=[0, 1], device_paths=[node["dev"]], timeout=0),
                                gpu_target.subprocess_run())
    assert [g["ok"] for g in res["gpus"]] == [True, True] and res["polls"] == 1
    gpusim(node, "orphan", "--gpu", 1, "--mib", 64)
    with pytest.raises(gpu_verify.VerifyError) as exc:
        gpu_verify.run_assert(dict(gpu_verify.defaults(), gpus=[1], device_paths=[node["dev"]], timeout=0),
                              gpu_target.subprocess_run())
    assert exc.value.result["diagnosis"][0]["kind"] == "orphaned"
    assert exc.value.msg.startswith("GPU 1: 65 MiB held by no process at the only check (timeout 0)")


def test_engines_need_no_gpusim_root(node, monkeypatch):
    # The engines find the simulated node through their options alone.
    monkeypatch.delenv("GPUSIM_ROOT")
    env = dict(node["env"])
    res = gpu_verify.run_assert(dict(gpu_verify.defaults(), timeout=0), gpu_target.subprocess_run(env=env))
    assert len(res["gpus"]) == 4
    with pytest.raises(gpu_verify.VerifyError) as exc:
        gpu_verify.run_assert(dict(gpu_verify.defaults(), timeout=0), gpu_target.subprocess_run(env=dict(env, GPUSIM_ROOT="")))
    assert "libnvidia-ml.so" in exc.value.msg


def test_bad_options_fail_before_anything_is_read():
    calls = []

    def runner(argv, timeout):
        calls.append(argv)
        return 0, "", ""

    for bad, words in (({"term_timeout": -1}, "term_timeout must be >= 0"),
                       ({"on_unexpected": "maybe"}, "on_unexpected must be fail or signal"),
                       ({"exclude": ["(x"]}, "exclude: invalid regular expression"),
                       ({"gpus": ["MIG-1"]}, "gpus: MIG device")):
        with pytest.raises(teardown.DrainError) as exc:
            teardown.run_drain(bad, runner)
        assert words in exc.value.msg
    assert calls == []


def counting_runner():
    calls = []
    inner = gpu_target.subprocess_run()

    def run(argv, *args, **kwargs):
        calls.append(list(argv))
        return inner(argv, *args, **kwargs)
    return run, calls


def test_the_drains_last_snapshot_proves_the_gpus_free_without_a_second_query(node, subreaper):
    started = []
    start_server(node, started, "graceful", gpu=0)
    kept = {}
    res = teardown.run_drain(params(node, gpus=[0]), gpu_target.subprocess_run(), keep=kept)
    assert res["signalled"] and kept["last_snapshot"]["driver"]["ok"], (res, kept)
    run, calls = counting_runner()
    verified = gpu_verify.run_assert(dict(gpu_verify.defaults(), gpus=[0], device_paths=[node["dev"]], timeout=5),
                                     run, first_snapshot=kept["last_snapshot"])
    assert [g["ok"] for g in verified["gpus"]] == [True] and verified["polls"] == 0, verified
    assert verified["reused_snapshot"] is True and calls == []          # no nvidia-smi round of its own


def test_a_snapshot_that_does_not_pass_yet_is_followed_by_queries(node, subreaper):
    # The caller's snapshot still shows memory held; the assert does not trust it and polls until it passes.
    gpusim(node, "orphan", "--gpu", 0, "--mib", 64)
    held = gpu_target.setup(dict(gpu_verify.defaults(), gpus=[0], device_paths=[node["dev"]]), gpu_target.subprocess_run(),
                            gpu_verify.PREFIX).snapshot()
    run, calls = counting_runner()
    with pytest.raises(gpu_verify.VerifyError) as exc:
        gpu_verify.run_assert(dict(gpu_verify.defaults(), gpus=[0], device_paths=[node["dev"]], timeout=0.3, sleep=0.1),
                              run, first_snapshot=held)
    assert exc.value.result["polls"] >= 1 and calls, exc.value.result    # it queried on its own after the snapshot
    # With a delay the caller's snapshot is never used: the assert waits, then queries.
    run2, calls2 = counting_runner()
    clean = gpu_target.setup(dict(gpu_verify.defaults(), gpus=[1], device_paths=[node["dev"]]), gpu_target.subprocess_run(),
                             gpu_verify.PREFIX).snapshot()
    res = gpu_verify.run_assert(dict(gpu_verify.defaults(), gpus=[1], device_paths=[node["dev"]], timeout=2, delay=0.1),
                                run2, first_snapshot=clean)
    assert res["polls"] == 1 and calls2 and "reused_snapshot" not in res
