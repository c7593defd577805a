"""Part 1 of the real-server stage: the venv, its stand-ins, and a real server holding simulated GPUs
that the collection's own drain and GPU proof take down."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import target as gpu_target
from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import teardown as drain
from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import verify as gpu_verify

import real_env
import servers

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_the_venv_is_exactly_its_lock(real_python):
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "pins.py"), "check", str(real_env.VENV),
                           str(real_env.LOCK)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    out = subprocess.run([str(real_python), "-c", "import torch, sglang, transformers, huggingface_hub; print(torch.__version__, "
                          "sglang.__version__, transformers.__version__, huggingface_hub.__version__)"],
                         capture_output=True, text=True, check=True, env=dict(os.environ, **servers.REAL_ENV)).stdout
    assert out.split() == ["2.13.0+cpu", "0.5.23", "5.19.0", "1.31.0"]


STANDIN_PROBE = r"""
import importlib.metadata, importlib.util, json, sys
out = {}
for name in ("sgl_kernel", "flashinfer", "torchvision"):
    out[name + ".find_spec"] = importlib.util.find_spec(name)
    try:
        importlib.metadata.version(name)
        out[name + ".dist"] = "found"
    except importlib.metadata.PackageNotFoundError:
        out[name + ".dist"] = None
import sgl_kernel
from flashinfer.sampling import top_k_top_p_sampling_from_probs as f
out["after-import.find_spec"] = importlib.util.find_spec("sgl_kernel")
try:
    f(1, 2)
    out["call"] = "returned"
except RuntimeError as e:
    out["call"] = type(e).__name__ + ": " + str(e)
out["bool"] = bool(sgl_kernel.anything)
print(json.dumps(out, default=repr))
"""


def test_the_standins_import_refuse_every_call_record_it_and_hide_from_probes(real_python, tmp_path):
    calls = tmp_path / "calls.jsonl"
    env = dict(os.environ, GPUFLEET_STANDIN_CALLS=str(calls))
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([str(real_python), "-c", STANDIN_PROBE], capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    for name in ("sgl_kernel", "flashinfer", "torchvision"):
        assert out[name + ".find_spec"] is None and out[name + ".dist"] is None, out
    assert out["after-import.find_spec"] is None          # still "not installed" once imported
    assert out["call"].startswith("StandinCalled: flashinfer.sampling.top_k_top_p_sampling_from_probs was called")
    assert out["bool"] is False
    recorded = [json.loads(line) for line in calls.read_text().splitlines()]
    assert [c["name"] for c in recorded] == ["flashinfer.sampling.top_k_top_p_sampling_from_probs"]


def test_a_real_server_holds_the_simulated_gpu_and_the_collections_drain_takes_it_down(fleet, monkeypatch):
    srv = fleet.start("real")
    tree = srv.tree()
    titles = dict((pid, servers.sh.cmdline(pid)[0]) for pid in tree)
    scheduler = [pid for pid, title in titles.items() if title == "sglang::scheduler"]
    assert len(scheduler) == 1, titles
    # nvidia-smi (the simulator's) lists the real scheduler's PID, and only it.
    apps = fleet.node.compute_apps()
    assert [a["pid"] for a in apps] == scheduler
    resolved = srv.request("/server_info").json()["mem_fraction_static"]
    assert apps[0]["mib"] == int(resolved * fleet.node.gpus()[0]["total"])   # mem_fraction_static x total
    fds = [os.readlink("/proc/%d/fd/%s" % (scheduler[0], fd)) for fd in os.listdir("/proc/%d/fd" % scheduler[0])]
    assert os.path.join(fleet.node.root, "dev", "nvidia0") in fds
    # The collection's drain finds the holder, walks to the server's root and signals it; the GPU proof follows.
    monkeypatch.setenv("GPUSIM_ROOT", fleet.node.root)
    monkeypatch.setenv("PATH", "%s:%s" % (servers.sh.SIM_BIN, os.environ["PATH"]))
    params = drain.defaults()
    params.update(gpus=[0], device_paths=[os.path.join(fleet.node.root, "dev", "nvidia*")], term_timeout=60,
                  kill_timeout=15)
    res = drain.run_drain(params, gpu_target.subprocess_run())
    by_pid = dict((e["pid"], e) for e in res["signalled"])
    assert by_pid[srv.pid]["role"] == "root" and by_pid[srv.pid]["signals"] == ["SIGTERM"], res["signalled"]
    assert res["survivors"] == [] and res["changed"]
    assert srv.proc.wait(timeout=30) == 0                    # a SIGTERM of an idle real server: exit status 0
    assert not any(servers.alive(pid) for pid in tree)
    proof = gpu_verify.defaults()
    proof.update(gpus=[0], device_paths=params["device_paths"], timeout=30)
    verified = gpu_verify.run_assert(proof, gpu_target.subprocess_run())
    assert not verified.get("failed") and fleet.node.compute_apps() == []
