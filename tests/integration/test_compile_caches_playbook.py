"""The compile caches through ``playbooks/redeploy.yml`` (docs/reference/compile-caches.md), on one simulated node
(``playbook_helpers.SimNode``, the process manager): the first deploy creates the cache directory and one sub-directory
per cache under the state directory (mode 0750), the running server's environment (``/proc/<pid>/environ``) points
each cache there except the one the operator set in ``sglang_server_env``, a forced restart of the same config keeps
a compiled file intact and hands the new server the same directories, and too little free space stops the redeploy at
the preflight with the running server untouched.

The tests share the node and run in file order. Every process is tracked by PID (``Procs``) and SIGKILLed by PID at
the end.
"""
from __future__ import annotations

import os
import stat

import pytest

from playbook_helpers import SimNode, alive, environ_of, module_procs  # noqa: F401  # pylint: disable=unused-import

pytestmark = pytest.mark.slow

PREFLIGHT = "Plan the redeploy (inspect the node, resolve the args as its SGLang will, take the lease)"
REPLACE = "Replace the server in one module run, candidate all"
SUBDIRS = ("jit", "deep_gemm", "inductor", "nv", "tilelang", "flashinfer", "torch_extensions")


@pytest.fixture(scope="module")
def node(tmp_path_factory, procs):
    n = SimNode(tmp_path_factory.mktemp("caches-node"), procs, name="caches")
    n.operator_triton = str(n.base / "operator-triton")
    return n


def host_vars(node, **overrides):
    return node.host_vars(server_env={"TRITON_CACHE_DIR": node.operator_triton}, **overrides)


def server_environ(pid):
    return dict(e.split("=", 1) for e in environ_of(pid).split("\0") if "=" in e)


def cache_root(node):
    return node.state / "cache"


def assert_server_uses_the_caches(node, pid):
    env = server_environ(pid)
    root = str(cache_root(node))
    assert env["SGLANG_CACHE_DIR"] == root, env
    assert env["TORCHINDUCTOR_CACHE_DIR"] == root + "/inductor" and env["SGLANG_DG_CACHE_DIR"] == root + "/deep_gemm"
    assert env["SGLANG_JIT_CACHE_DIR"] == root + "/jit" and env["CUDA_CACHE_PATH"] == root + "/nv"
    assert env["FLASHINFER_WORKSPACE_BASE"] == root + "/flashinfer" and env["TILELANG_CACHE_DIR"] == root + "/tilelang"
    assert env["TORCH_EXTENSIONS_DIR"] == root + "/torch_extensions"
    # The operator's own value is kept, not replaced by the collection's.
    assert env["TRITON_CACHE_DIR"] == node.operator_triton


def test_the_first_deploy_creates_the_cache_dirs_and_the_server_uses_them(node):
    run = node.run(host_vars=host_vars(node))
    assert run.rc == 0, run.summary()
    root = cache_root(node)
    for path in [root] + [root / sub for sub in SUBDIRS]:
        st = os.stat(str(path))
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o750 and st.st_uid == os.getuid(), path
    # The operator's TRITON_CACHE_DIR: no triton sub-directory is made for it.
    assert not (root / "triton").exists()
    pre = run.task_result(PREFLIGHT)
    assert pre["plan"]["cache"]["kept"] == ["TRITON_CACHE_DIR"] and pre["plan"]["cache"]["dir"] == str(root)
    assert any(line.startswith("compile caches: %s, " % root) for line in run.task_result("Show the plan")["msg"])
    made = run.task_result(REPLACE)["directories"]
    assert [p for p in made if p.startswith(str(root))] == [str(root)] + [str(root / sub) for sub in SUBDIRS]
    pid = node.server_pid()
    assert pid and alive(pid) and node.health() == 200
    assert_server_uses_the_caches(node, pid)


def test_a_restart_of_the_same_config_keeps_the_compiled_files(node):
    old_pid = node.server_pid()
    assert old_pid and alive(old_pid), "the first test left no server"
    kernel = cache_root(node) / "inductor" / "fx" / "kernel.so"
    kernel.parent.mkdir(parents=True, exist_ok=True)
    kernel.write_bytes(b"\x7fELF compiled once" * 64)
    before = (kernel.read_bytes(), os.stat(str(kernel)).st_mtime_ns)
    # The same config: the plan has nothing to do, so the restart is forced.
    run = node.run(host_vars=host_vars(node), extravars={"sglang_redeploy_force": True})
    assert run.rc == 0, run.summary()
    pre = run.task_result(PREFLIGHT)
    assert pre["plan"]["action"] == "restart", pre["plan"]
    # The preflight counted what was kept, and the deploy had no directory to create or fix.
    assert pre["plan"]["cache"]["size_bytes"] >= len(before[0]) and pre["plan"]["cache"]["files"] >= 1
    assert all(d["ok"] for d in pre["node"]["directories"]), pre["node"]["directories"]
    assert "directories" not in run.task_result(REPLACE)
    new_pid = node.server_pid()
    assert new_pid and new_pid != old_pid and not alive(old_pid) and node.health() == 200
    assert (kernel.read_bytes(), os.stat(str(kernel)).st_mtime_ns) == before
    assert_server_uses_the_caches(node, new_pid)


def test_too_little_room_for_the_caches_fails_the_preflight_and_leaves_the_server(node):
    pid = node.server_pid()
    assert pid and alive(pid)
    run = node.run(host_vars=host_vars(node, sglang_server_cache_min_free_gb=10 ** 9,
                                       sglang_server_args=node.server_args(chunked_prefill_size=4096)))
    assert run.rc != 0
    pre = run.task_result(PREFLIGHT)
    assert pre["failed"] is True
    assert any(p.startswith("sglang_server_cache_dir: the file system of ") and "sglang_server_cache_min_free_gb (1000000000 GiB)" in p
               for p in pre["problems"]), pre["problems"]
    assert not run.ran(REPLACE)
    assert node.server_pid() == pid and alive(pid) and node.health() == 200
