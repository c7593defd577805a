"""Valid safetensors weights for test checkpoints (standard library only).

A safetensors file is 8 bytes of little-endian header length, a JSON header ``{name: {dtype, shape,
data_offsets}}`` and the tensors' bytes back to back. The weight-only plan reads the headers (tensor names,
dtypes, shapes) and the simulator's ``/weights_checker`` hashes the tensors' bytes, so a test picks the
layout and a ``seed``: two checkpoints of one layout and different seeds have the same shapes and
different weights (other checksums after an update).

Used by tests/integration/test_weights_redeploy.py and the unit tests of the weights plan, the
sglang_weights module and sglang_replace (they put this directory on sys.path).
"""
from __future__ import annotations

import hashlib
import json
import os
import struct

BYTES = {"BF16": 2, "F16": 2, "F32": 4, "I64": 8, "U8": 1}

# A small decoder-only layout (Llama/Qwen names, one layer): what the simulator fuses and orders as SGLang does.
SMALL_LAYOUT = {
    "model.embed_tokens.weight": ("BF16", (32, 8)),
    "model.layers.0.self_attn.q_proj.weight": ("BF16", (8, 8)),
    "model.layers.0.self_attn.k_proj.weight": ("BF16", (4, 8)),
    "model.layers.0.self_attn.v_proj.weight": ("BF16", (4, 8)),
    "model.layers.0.self_attn.o_proj.weight": ("BF16", (8, 8)),
    "model.layers.0.mlp.gate_proj.weight": ("BF16", (16, 8)),
    "model.layers.0.mlp.up_proj.weight": ("BF16", (16, 8)),
    "model.layers.0.mlp.down_proj.weight": ("BF16", (8, 16)),
    "model.norm.weight": ("BF16", (8,)),
    "lm_head.weight": ("BF16", (32, 8)),
}


def tensor_bytes(name, dtype, shape, seed):
    """The bytes of one tensor: a pattern derived from ``seed`` and the name (other seed, other bytes)."""
    count = 1
    for dim in shape:
        count *= int(dim)
    size = count * BYTES[dtype]
    block = hashlib.sha256(("%s:%s" % (seed, name)).encode()).digest()
    return (block * (size // len(block) + 1))[:size]


def safetensors_bytes(tensors, seed="1"):
    """A whole safetensors file: ``tensors`` is ``{name: (dtype, shape)}``."""
    header, data = {}, b""
    for name in sorted(tensors):
        dtype, shape = tensors[name]
        raw = tensor_bytes(name, dtype, shape, seed)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def write_safetensors(path, tensors, seed="1"):
    with open(str(path), "wb") as fh:
        fh.write(safetensors_bytes(tensors, seed))
    return str(path)


def write_weights(directory, layout=None, seed="1", shards=1):
    """The weights of a checkpoint ``directory``: ``model.safetensors``, or ``shards`` files and the index
    (``model-0000i-of-0000n.safetensors``, ``model.safetensors.index.json``). Returns the file names."""
    layout = dict(SMALL_LAYOUT if layout is None else layout)
    directory = str(directory)
    if shards <= 1:
        write_safetensors(os.path.join(directory, "model.safetensors"), layout, seed)
        return ["model.safetensors"]
    names = sorted(layout)
    files, weight_map = [], {}
    for i in range(shards):
        shard = "model-%05d-of-%05d.safetensors" % (i + 1, shards)
        part = dict((n, layout[n]) for n in names[i::shards])
        write_safetensors(os.path.join(directory, shard), part, seed)
        files.append(shard)
        weight_map.update((n, shard) for n in part)
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, fh)
    return files
