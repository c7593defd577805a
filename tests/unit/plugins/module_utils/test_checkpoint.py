"""Checkpoint checks without reading tensors (module_utils/sglang/checkpoint.py), on real files under tmp_path.

The files are written here in the safetensors format (8-byte little-endian header length, JSON header, data);
tests/differential/test_checkpoint_oracle.py checks the same reader against files the real ``safetensors``
package writes, and its own loader's verdict on the damaged ones.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import struct
import tempfile

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import checkpoint as ck

SIZES = {"BF16": 2, "F32": 4, "I64": 8}


def write_safetensors(path, tensors, metadata=None):
    """``tensors``: {name: (dtype, shape)}; the data is zeros. Returns the file's size."""
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        count = 1
        for dim in shape:
            count *= dim
        size = count * SIZES[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    if metadata:
        header["__metadata__"] = metadata
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)
    return 8 + len(raw) + offset


LAYOUT_A = {"model.embed_tokens.weight": ("BF16", (1024, 64)), "model.layers.0.mlp.up_proj.weight": ("BF16", (128, 64))}
LAYOUT_B = {"model.layers.1.mlp.up_proj.weight": ("BF16", (128, 64)), "lm_head.weight": ("BF16", (1024, 64))}


def make_checkpoint(root, sharded=True, tokenizer=True):
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    if sharded:
        write_safetensors(root / "model-00001-of-00002.safetensors", LAYOUT_A)
        write_safetensors(root / "model-00002-of-00002.safetensors", LAYOUT_B)
        weight_map = dict([(n, "model-00001-of-00002.safetensors") for n in LAYOUT_A]
                          + [(n, "model-00002-of-00002.safetensors") for n in LAYOUT_B])
        (root / ck.INDEX).write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    else:
        write_safetensors(root / "model.safetensors", dict(LAYOUT_A, **LAYOUT_B))
    if tokenizer:
        (root / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
        (root / "tokenizer.json").write_text("{}")
    return root


@pytest.mark.parametrize("sharded", [True, False])
def test_a_good_checkpoint_passes_and_is_counted(tmp_path, sharded):
    root = make_checkpoint(tmp_path / "m", sharded=sharded)
    got = ck.verify(str(root))
    assert got["files"] == (2 if sharded else 1) and got["tensors"] == 4 and got["complete"]
    assert got["bytes"] == sum(os.path.getsize(str(p)) for p in root.glob("*.safetensors"))
    layout, files = ck.tensor_layout(str(root))
    assert layout == dict((n, (d, tuple(s))) for n, (d, s) in dict(LAYOUT_A, **LAYOUT_B).items())


def test_the_index_naming_a_missing_shard_is_refused(tmp_path):
    root = make_checkpoint(tmp_path / "m")
    os.remove(str(root / "model-00002-of-00002.safetensors"))
    with pytest.raises(ck.CheckpointError) as err:
        ck.verify(str(root))
    assert err.value.path.endswith("model-00002-of-00002.safetensors")
    assert "is named by model.safetensors.index.json but missing" in str(err.value)


def test_a_shard_truncated_to_half_is_refused_by_its_size(tmp_path):
    root = make_checkpoint(tmp_path / "m")
    shard = root / "model-00001-of-00002.safetensors"
    with open(str(shard), "r+b") as fh:
        fh.truncate(os.path.getsize(str(shard)) // 2)
    with pytest.raises(ck.CheckpointError) as err:
        ck.verify(str(root))
    assert err.value.path == str(shard)
    assert "cut short" in str(err.value) and "copy it again" in str(err.value)


@pytest.mark.parametrize("damage,expected", [
    (b"", "not a safetensors file"),        # a header length of 0
    (struct.pack("<Q", 10 ** 12), "not a safetensors file"),
    (struct.pack("<Q", 4) + b"{no}", "not JSON"),
    (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
])
def test_a_damaged_header_is_refused(tmp_path, damage, expected):
    root = make_checkpoint(tmp_path / "m", sharded=False)
    (root / "model.safetensors").write_bytes(damage + b"\0" * 8)
    with pytest.raises(ck.CheckpointError, match=expected):
        ck.verify(str(root))


def test_a_file_shorter_than_a_header_is_refused(tmp_path):
    root = make_checkpoint(tmp_path / "m", sharded=False)
    (root / "model.safetensors").write_bytes(b"\x10\x00\x00")
    with pytest.raises(ck.CheckpointError, match="too short for a safetensors header"):
        ck.verify(str(root))


def test_a_tensor_whose_range_does_not_match_its_shape_is_refused(tmp_path):
    path = tmp_path / "x.safetensors"
    raw = json.dumps({"w": {"dtype": "BF16", "shape": [4, 4], "data_offsets": [0, 16]}}).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 32)
    with pytest.raises(ck.CheckpointError, match=r"needs 32 bytes"):
        ck.tensors_of(str(path))


@pytest.mark.parametrize("shape", [["a", 2], [2, 1.5], [2, -2], [True, 4], [[2], 4]])
def test_a_shape_that_is_not_a_list_of_sizes_is_refused_naming_the_file(tmp_path, shape):
    path = tmp_path / "x.safetensors"
    raw = json.dumps({"w": {"dtype": "BF16", "shape": shape, "data_offsets": [0, 16]}}).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 16)
    with pytest.raises(ck.CheckpointError, match="tensor w has an invalid entry") as err:
        ck.tensors_of(str(path))
    assert err.value.path == str(path)


def test_an_index_and_shards_from_different_checkpoints_are_refused(tmp_path):
    root = make_checkpoint(tmp_path / "m")
    index = json.loads((root / ck.INDEX).read_text())
    index["weight_map"]["model.layers.9.self_attn.o_proj.weight"] = "model-00002-of-00002.safetensors"
    (root / ck.INDEX).write_text(json.dumps(index))
    with pytest.raises(ck.CheckpointError, match="does not hold the tensor model.layers.9"):
        ck.verify(str(root))


def test_an_index_outside_the_directory_is_refused(tmp_path):
    root = make_checkpoint(tmp_path / "m")
    (root / ck.INDEX).write_text(json.dumps({"weight_map": {"w": "../elsewhere.safetensors"}}))
    with pytest.raises(ck.CheckpointError, match="outside the checkpoint directory"):
        ck.verify(str(root))


def test_no_weights_at_all(tmp_path):
    root = tmp_path / "m"
    root.mkdir()
    (root / "config.json").write_text("{}")
    with pytest.raises(ck.CheckpointError, match="holds no weights"):
        ck.verify(str(root))
    (root / "pytorch_model.bin").write_bytes(b"pickle")
    assert ck.verify(str(root))["files"] == 0        # not safetensors: only its presence can be checked


def test_a_fast_tokenizer_without_tokenizer_json_is_refused(tmp_path):
    root = make_checkpoint(tmp_path / "m")
    os.remove(str(root / "tokenizer.json"))
    with pytest.raises(ck.CheckpointError, match="PreTrainedTokenizerFast.*tokenizer.json is missing"):
        ck.verify(str(root))
    assert ck.verify(str(root), skip_tokenizer_init=True)["tensors"] == 4


def test_tokenizer_rules(tmp_path):
    root = tmp_path / "t"
    root.mkdir()
    assert ck.tokenizer_problem(str(root)) is None                      # no tokenizer config: nothing to check
    (root / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer"}))
    assert "needs tokenizer.json or a slow tokenizer" in ck.tokenizer_problem(str(root))
    (root / "tokenizer.model").write_bytes(b"sp")
    assert ck.tokenizer_problem(str(root)) is None
    (root / "tokenizer_config.json").write_text(json.dumps({"tokenizer_file": "tok/custom.json"}))
    assert "names tokenizer_file tok/custom.json" in ck.tokenizer_problem(str(root))
    (root / "tokenizer_config.json").write_text("{broken")
    assert "cannot be read as JSON" in ck.tokenizer_problem(str(root))


@pytest.fixture
def shared_dir():
    """A directory every user may enter (pytest's own base directory is 0700), removed afterwards."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="gpufleet-ck-", dir="/var/tmp"))
    os.chmod(str(path), 0o755)
    yield path
    shutil.rmtree(str(path))


def test_read_access_is_judged_for_the_servers_user(shared_dir):
    root = make_checkpoint(shared_dir / "m")
    uid, gid = 4242, 4343
    shard = root / "model-00001-of-00002.safetensors"
    for path in [root] + list(root.iterdir()):
        os.chmod(str(path), 0o755 if path.is_dir() else 0o644)
    assert ck.verify(str(root), uid=uid, gids=[gid])["files"] == 2
    os.chmod(str(shard), 0o600)                                         # root's file, only root reads it
    with pytest.raises(ck.CheckpointError) as err:
        ck.verify(str(root), uid=uid, gids=[gid])
    assert err.value.path == str(shard) and "(uid 4242) cannot read this file" in str(err.value)
    os.chown(str(shard), 0, gid)
    os.chmod(str(shard), 0o640)                                         # the server's group may read it
    assert ck.verify(str(root), uid=uid, gids=[gid])["files"] == 2
    os.chmod(str(root), 0o750)
    os.chown(str(root), 0, 0)
    with pytest.raises(ck.CheckpointError, match="cannot enter this directory") as err:
        ck.verify(str(root), uid=uid, gids=[gid])
    assert err.value.path == str(root)


def test_layout_differences_name_what_blocks_an_in_place_update():
    running = {"a": ("BF16", (4, 4)), "b": ("BF16", (8,)), "c": ("F32", (2,))}
    assert ck.layout_differences(running, dict(running, extra=("BF16", (1,)))) == []   # extra tensors are skipped
    diffs = ck.layout_differences(running, {"a": ("BF16", (4, 8)), "c": ("BF16", (2,))})
    assert diffs == ["a: BF16 [4, 4] running, BF16 [4, 8] in the new checkpoint",
                     "b: missing from the new checkpoint",
                     "c: F32 [2] running, BF16 [2] in the new checkpoint"]
    many = dict(("t%02d" % i, ("BF16", (i + 1,))) for i in range(9))
    assert ck.layout_differences(many, {})[-1] == "... 4 more"


def test_many_shards_are_checked_by_their_headers_only(tmp_path):
    root = tmp_path / "big"
    root.mkdir()
    (root / "config.json").write_text("{}")
    weight_map = {}
    for i in range(64):
        name = "model-%05d-of-00064.safetensors" % (i + 1)
        write_safetensors(root / name, {"layer.%d.w" % i: ("F32", (256, 256))})
        weight_map["layer.%d.w" % i] = name
    (root / ck.INDEX).write_text(json.dumps({"weight_map": weight_map}))
    got = ck.verify(str(root))
    assert got["files"] == 64 and got["tensors"] == 64 and got["bytes"] > 64 * 256 * 256 * 4
    stopped = ck.verify(str(root), deadline=0)                        # a deadline long past: nothing more is read
    assert stopped["complete"] is False and stopped["files"] == 64 and stopped["tensors"] == 0
