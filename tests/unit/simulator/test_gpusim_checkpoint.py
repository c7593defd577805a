"""``gpusim checkpoint`` and the fake server's load check (simulator/python/gpusim/checkpoint.py): the checkpoints it
writes pass the preflight's check (plugins/module_utils/sglang/checkpoint.py), and ``load_problem`` finds what the
fake server fails its start on (a missing or truncated shard) while leaving the simulator's fake weight files alone."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gpusim.checkpoint import load_problem, write_checkpoint

from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import checkpoint as ckpt

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
GPUSIM = os.path.join(REPO, "simulator", "bin", "gpusim")


@pytest.mark.parametrize("shards", [1, 4])
def test_the_cli_writes_a_checkpoint_the_preflight_accepts(tmp_path, shards):
    directory = tmp_path / "models" / "m"
    out = subprocess.run([GPUSIM, "checkpoint", str(directory), "--shards", str(shards), "--seed", "s"],
                         env=dict(os.environ, GPUSIM_PYTHON=sys.executable), capture_output=True, text=True, check=True)
    files = json.loads(out.stdout)["files"]
    assert len(files) == shards and all((directory / f).is_file() for f in files)
    assert (directory / ckpt.INDEX).exists() is (shards > 1)
    assert not (directory / "config.json").exists()            # the config is the caller's
    (directory / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    info = ckpt.verify(str(directory), uid=os.geteuid(), gids=os.getgroups())
    assert info["files"] == shards and info["tensors"] == 10 and info["complete"] is True
    assert load_problem(directory) is None


def test_load_problem_names_a_missing_or_truncated_shard(tmp_path):
    write_checkpoint(tmp_path, shards=3)
    shard = tmp_path / "model-00002-of-00003.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[:-1])
    problem = load_problem(tmp_path)
    assert str(shard) in problem and "MetadataIncompleteBuffer" in problem
    shard.write_bytes(data[:12])                                   # the header itself cut
    assert str(shard) in load_problem(tmp_path)
    shard.unlink()
    problem = load_problem(tmp_path)
    assert "No such file or directory" in problem and str(shard) in problem
    assert load_problem(tmp_path, "dummy") is None                # another loader reads no safetensors


def test_load_problem_leaves_fake_weight_files_and_empty_directories_alone(tmp_path):
    assert load_problem(tmp_path) is None
    (tmp_path / "model.safetensors").write_bytes(b"weights v1")     # no safetensors header: a fake weight file
    assert load_problem(tmp_path) is None
