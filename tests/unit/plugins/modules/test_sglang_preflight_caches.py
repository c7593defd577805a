"""sglang_preflight's compile caches (cache_dir, cache_min_free_gb): the launch spec's env points each cache at its
sub-directory (the operator's own variables kept), the directories are reported like the server's others, the caches'
size is in the plan, and too little room, a relative path or a negative minimum stop the redeploy before anything is
touched. ``main()`` runs in-process on the simulated node of redeploy_testlib (as in test_sglang_preflight.py)."""
from __future__ import annotations

import os
import pwd
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from redeploy_testlib import NVIDIA_SMI, ROLE_LABELS, node_context, run_module  # noqa: E402 - after sys.path

from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import preflight as plan_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.server import caches
from ansible_collections.gpufleet.sglang.plugins.modules import sglang_preflight as pf


@pytest.fixture
def node(tmp_path, monkeypatch):
    monkeypatch.setattr(plan_mod.systemd, "running", lambda root="/run/systemd/system": False)
    yield from node_context(tmp_path, monkeypatch)


@pytest.fixture
def run(node, monkeypatch):
    def _run(check=False, **options):
        args = {
            "name": node.name, "label": "gpu-01", "args": {"model_path": node.model, "host": "127.0.0.1", "port": node.port},
            "gpus": ["0"], "config_dir": str(node.config_dir), "state_dir": str(node.state_dir), "log_file": str(node.log_file),
            "nvidia_smi": NVIDIA_SMI, "backend": "nvidia-smi", "device_paths": [str(node.root / "dev" / "nvidia*")],
            "resolution": "mirror", "python": sys.executable, "manager": "process",
            "lease": {"path": str(node.lease_path), "run_id": "R1"},
            # -v: the whole result (plan and node); at verbosity 0 a failure returns only what the roles read.
            "_ansible_verbosity": 1,
            "option_labels": ROLE_LABELS,       # as the role runs it: the messages name its variables
        }
        args.update(options)
        return run_module(pf, args, monkeypatch, check=check)
    return _run


def test_the_spec_env_points_the_caches_at_the_cache_dir_and_keeps_the_operators(node, run):
    cache_dir = str(node.state_dir / "cache")
    res = run(check=True, cache_dir=cache_dir, cache_min_free_gb=0, env={"TRITON_CACHE_DIR": "/fast/triton", "HF_TOKEN": "hf_x"})
    assert res["failed"] is False, res.get("msg")
    env = res["plan"]["spec"]["env"]
    assert env["TORCHINDUCTOR_CACHE_DIR"] == cache_dir + "/inductor" and env["SGLANG_CACHE_DIR"] == cache_dir
    assert env["SGLANG_DG_CACHE_DIR"] == cache_dir + "/deep_gemm" and env["SGLANG_JIT_CACHE_DIR"] == cache_dir + "/jit"
    assert env["TRITON_CACHE_DIR"] == "/fast/triton" and env["CUDA_VISIBLE_DEVICES"] == "0"
    cache = res["plan"]["cache"]
    assert cache["kept"] == ["TRITON_CACHE_DIR"] and "TRITON_CACHE_DIR" not in cache["env"]
    assert cache["dirs"][0] == cache_dir and cache_dir + "/triton" not in cache["dirs"]
    # The cache directories are reported with the server's others (missing here: the deploy creates them).
    reported = dict((d["path"], d) for d in res["node"]["directories"])
    assert all(reported[d]["exists"] is False and reported[d]["ok"] is False for d in cache["dirs"])
    assert not os.path.exists(cache_dir)                                   # the preflight creates nothing
    assert res["lines"][-1].startswith("compile caches: %s, 0.00 GiB in 0 file(s), " % cache_dir)
    assert "hf_x" not in str(res)


def test_existing_cache_dirs_with_the_right_mode_and_owner_are_ok_and_counted(node, run):
    cache_dir = node.state_dir / "cache"
    user = pwd.getpwuid(os.getuid()).pw_name
    added, _kept = caches.cache_env(str(cache_dir), {})
    for path in caches.cache_dirs(str(cache_dir), added):
        os.makedirs(path, exist_ok=True)
        os.chmod(path, 0o750)
    (cache_dir / "triton" / "k.cubin").write_bytes(b"k" * 2048)
    os.chmod(str(cache_dir / "nv"), 0o700)                                 # a wrong mode: the deploy fixes it
    res = run(check=True, cache_dir=str(cache_dir), cache_min_free_gb=0, directory_owner=user)
    assert res["failed"] is False, res.get("msg")
    reported = dict((d["path"], d) for d in res["node"]["directories"])
    assert reported[str(cache_dir / "triton")]["ok"] is True and reported[str(cache_dir / "triton")]["owner"] == user
    assert reported[str(cache_dir / "nv")]["ok"] is False and reported[str(cache_dir / "nv")]["mode"] == "0700"
    assert res["plan"]["cache"]["size_bytes"] == 2048 and res["plan"]["cache"]["files"] == 1


def test_too_little_room_for_the_caches_stops_before_the_lease(node, run, monkeypatch):
    class Small(object):
        f_frsize = 4096
        f_bavail = 3 * caches.GIB // 4096
    monkeypatch.setattr(caches.os, "statvfs", lambda path: Small())
    res = run(cache_dir=str(node.state_dir / "cache"), cache_min_free_gb=20)
    assert res["failed"] is True
    assert any(p.startswith("sglang_server_cache_dir: the file system of ") and "has 3.0 GiB free, less than "
               "sglang_server_cache_min_free_gb (20 GiB)" in p and p.endswith("(nothing was touched)") for p in res["problems"])
    assert "Preflight failed on gpu-01; the running server was not touched." in res["msg"]
    assert not node.lease_path.exists() and not (node.state_dir / "cache").exists()
    assert res["plan"]["cache"]["free_bytes"] == 3 * caches.GIB


@pytest.mark.parametrize("options, text", [
    ({"cache_dir": "relative/cache"}, "sglang_server_cache_dir must be an absolute path, got 'relative/cache'"),
    ({"cache_min_free_gb": -1}, "sglang_server_cache_min_free_gb must be a number of GiB >= 0, got -1.0"),
])
def test_bad_cache_options_name_the_variable(node, run, options, text):
    options.setdefault("cache_dir", str(node.state_dir / "cache"))
    res = run(**options)
    assert res["failed"] is True and any(p.startswith(text) for p in res["problems"]), res["problems"]
    assert not node.lease_path.exists()


def test_an_empty_cache_dir_leaves_the_env_alone(node, run):
    res = run(check=True, cache_dir="")
    assert res["failed"] is False, res.get("msg")
    assert sorted(res["plan"]["spec"]["env"]) == ["CUDA_VISIBLE_DEVICES"]
    assert res["plan"]["cache"]["dirs"] == [] and res["lines"][-1].startswith("compile caches: SGLang's defaults")


def test_the_same_cache_dir_gives_the_same_fingerprint_and_another_one_a_new_one(node, run):
    one = run(check=True, cache_dir=str(node.state_dir / "cache"), cache_min_free_gb=0)
    two = run(check=True, cache_dir=str(node.state_dir / "cache"), cache_min_free_gb=0)
    other = run(check=True, cache_dir=str(node.tmp / "elsewhere"), cache_min_free_gb=0)
    assert one["plan"]["fingerprint"] == two["plan"]["fingerprint"] != other["plan"]["fingerprint"]
