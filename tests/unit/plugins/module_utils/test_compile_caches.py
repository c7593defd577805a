"""The compile caches (plugins/module_utils/server/caches.py): the variables added to the server's env, the operator's
own kept, the directories to create, the free-space check (os.statvfs monkeypatched) and the size count; and the
rendered systemd unit carrying them (docs/reference/compile-caches.md)."""
from __future__ import annotations

import os

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils.server import caches
from ansible_collections.gpufleet.sglang.plugins.module_utils.server import unit as unit_mod

ROOT = "/var/lib/sglang/main/cache"


def test_every_cache_variable_points_at_its_own_sub_directory():
    added, kept = caches.cache_env(ROOT, {"HF_HOME": "/models/hf"})
    assert kept == []
    assert added == {
        "SGLANG_CACHE_DIR": ROOT,
        "SGLANG_JIT_CACHE_DIR": ROOT + "/jit",
        "SGLANG_DG_CACHE_DIR": ROOT + "/deep_gemm",
        "TORCHINDUCTOR_CACHE_DIR": ROOT + "/inductor",
        "TRITON_CACHE_DIR": ROOT + "/triton",
        "CUDA_CACHE_PATH": ROOT + "/nv",
        "TILELANG_CACHE_DIR": ROOT + "/tilelang",
        "FLASHINFER_WORKSPACE_BASE": ROOT + "/flashinfer",
        "TORCH_EXTENSIONS_DIR": ROOT + "/torch_extensions",
    }
    # HF_HOME (the model download cache) is no compile cache: never added, never touched.
    assert "HF_HOME" not in added and "XDG_CACHE_HOME" not in added
    dirs = caches.cache_dirs(ROOT, added)
    assert dirs[0] == ROOT and len(dirs) == len(set(dirs)) == 9
    assert all(d == ROOT or os.path.dirname(d) == ROOT for d in dirs)


def test_the_operators_variables_are_kept():
    added, kept = caches.cache_env(ROOT, {"TRITON_CACHE_DIR": "/fast/triton", "CUDA_CACHE_PATH": ""})
    assert kept == ["TRITON_CACHE_DIR", "CUDA_CACHE_PATH"]
    assert "TRITON_CACHE_DIR" not in added and "CUDA_CACHE_PATH" not in added
    assert added["TORCHINDUCTOR_CACHE_DIR"] == ROOT + "/inductor"
    assert ROOT + "/triton" not in caches.cache_dirs(ROOT, added)


def test_an_operators_sglang_cache_dir_keeps_what_follows_it():
    # SGLang derives DeepGEMM, inductor, Triton, CUDA, TileLang and FlashInfer from SGLANG_CACHE_DIR: an operator who
    # moved it keeps them there; the two whose defaults do not follow it still come here.
    added, kept = caches.cache_env(ROOT, {"SGLANG_CACHE_DIR": "/nvme/sglang"})
    assert kept == ["SGLANG_CACHE_DIR"]
    assert added == {"SGLANG_JIT_CACHE_DIR": ROOT + "/jit", "TORCH_EXTENSIONS_DIR": ROOT + "/torch_extensions"}


def test_an_empty_cache_dir_adds_nothing():
    assert caches.cache_env("", {}) == ({}, [])
    assert caches.cache_dirs("", {}) == []
    info, problem = caches.describe("", 20, {})
    assert problem is None and info["env"] == {} and info["dirs"] == []
    assert caches.summary_line(info) == "compile caches: SGLang's defaults (cache_dir is empty)"


class FakeStatvfs(object):
    def __init__(self, free_gib):
        self.f_frsize = 4096
        self.f_bavail = int(free_gib * caches.GIB) // 4096


def test_free_space_below_the_minimum_is_a_problem_naming_both_variables(tmp_path, monkeypatch):
    seen = []

    def statvfs(path):
        seen.append(path)
        return FakeStatvfs(5)
    monkeypatch.setattr(caches.os, "statvfs", statvfs)
    cache_dir = str(tmp_path / "state" / "cache")             # not there yet: its nearest existing parent is measured
    free, problem = caches.check_free(cache_dir, 20)
    assert seen == [str(tmp_path)]
    assert free == 5 * caches.GIB
    assert problem == ("cache_dir: the file system of %s has 5.0 GiB free, less than "
                       "cache_min_free_gb (20 GiB) that the compile caches may need; free some space there, "
                       "point cache_dir at a larger file system, or lower cache_min_free_gb "
                       "(0 turns the check off)" % tmp_path)
    assert not (tmp_path / "state").exists()                   # the check creates nothing


@pytest.mark.parametrize("free_gib, minimum, ok", [(20, 20, True), (19.9, 20, False), (1, 0, True), (100, 20.5, True)])
def test_free_space_boundaries(tmp_path, monkeypatch, free_gib, minimum, ok):
    monkeypatch.setattr(caches.os, "statvfs", lambda path: FakeStatvfs(free_gib))
    _free, problem = caches.check_free(str(tmp_path), minimum)
    assert (problem is None) is ok


def test_statvfs_failure_is_a_problem(tmp_path, monkeypatch):
    def statvfs(path):
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(caches.os, "statvfs", statvfs)
    free, problem = caches.check_free(str(tmp_path), 20)
    assert free is None and "cannot read the free space of %s: [Errno 5] Input/output error" % tmp_path in problem


def test_describe_counts_the_caches_and_the_line_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(caches.os, "statvfs", lambda path: FakeStatvfs(50))
    root = tmp_path / "cache"
    (root / "triton" / "abc").mkdir(parents=True)
    (root / "triton" / "abc" / "kernel.cubin").write_bytes(b"x" * 3000)
    (root / "inductor").mkdir()
    (root / "inductor" / "fx.py").write_bytes(b"y" * 1000)
    os.symlink("/etc", str(root / "link"))                     # not followed
    info, problem = caches.describe(str(root), 20, {"TRITON_CACHE_DIR": "/else"})
    assert problem is None
    assert info["size_bytes"] == 4000 and info["files"] == 2 and info["size_complete"] is True
    assert info["free_bytes"] == 50 * caches.GIB and info["kept"] == ["TRITON_CACHE_DIR"]
    assert caches.summary_line(info) == ("compile caches: %s, 0.00 GiB in 2 file(s), 50.0 GiB free; kept from env: "
                                         "TRITON_CACHE_DIR" % root)


def test_a_size_count_that_runs_out_of_time_says_at_least(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f").write_bytes(b"z")
    total, files, complete = caches.tree_size(str(tmp_path), seconds=-1)
    assert (total, files, complete) == (0, 0, False)
    info = {"dir": str(tmp_path), "size_bytes": 0, "files": 0, "size_complete": False, "free_bytes": None}
    assert "at least 0.00 GiB" in caches.summary_line(info)


def test_the_systemd_unit_carries_the_cache_variables_and_the_operators_value():
    added, _kept = caches.cache_env("/var/lib/sglang/main/cache", {"TRITON_CACHE_DIR": "/fast/triton"})
    env = {"TRITON_CACHE_DIR": "/fast/triton", "CUDA_VISIBLE_DEVICES": "0"}
    for key, value in added.items():
        env.setdefault(key, value)
    text = unit_mod.render_unit("main", "0.5.23", "/usr/bin/python3", ["--model-path", "/m"], env, "f" * 16, user="sglang")
    lines = text.splitlines()
    assert "Environment=TORCHINDUCTOR_CACHE_DIR=/var/lib/sglang/main/cache/inductor" in lines
    assert "Environment=SGLANG_CACHE_DIR=/var/lib/sglang/main/cache" in lines
    assert "Environment=TRITON_CACHE_DIR=/fast/triton" in lines
    assert not any("/var/lib/sglang/main/cache/triton" in line for line in lines)
    assert "User=sglang" in lines
