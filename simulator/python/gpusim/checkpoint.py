"""Valid tiny safetensors checkpoints, written and read with the standard library only.

A safetensors file is 8 bytes of little-endian header length, a JSON header ``{name: {dtype, shape,
data_offsets}}`` and the tensors' bytes back to back (docs/reference/checkpoints.md). The weight-only plan
reads the headers (tensor names, dtypes, shapes), the preflight checks them against the file sizes, the
fake server loads what the index names at startup (:func:`load_problem`) and its ``/weights_checker``
hashes the tensors' bytes, so a test picks the layout and a ``seed``: two checkpoints of one layout and
different seeds have the same shapes and different weights (other checksums after an update).

The one writer of test and simulated-node checkpoints: tests/integration/checkpoint_files.py re-exports
it, and ``gpusim checkpoint DIR`` writes one on a simulated node (molecule, scripts/demo.sh, the bench).
"""
from __future__ import annotations

import hashlib
import json
import os
import struct

# The safetensors reader's own cap on a header.
MAX_HEADER = 100 * 1024 * 1024
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


def write_checkpoint(directory, config=None, layout=None, seed="1", shards=1, tokenizer=True):
    """A whole tiny checkpoint in ``directory``: ``config.json`` (when ``config`` is given), the weights
    (:func:`write_weights`) and, with ``tokenizer``, ``tokenizer_config.json`` and ``tokenizer.json``."""
    directory = str(directory)
    os.makedirs(directory, exist_ok=True)
    if config is not None:
        with open(os.path.join(directory, "config.json"), "w") as fh:
            fh.write(config if isinstance(config, str) else json.dumps(config))
    files = write_weights(directory, layout, seed=seed, shards=shards)
    if tokenizer:
        with open(os.path.join(directory, "tokenizer_config.json"), "w") as fh:
            json.dump({"tokenizer_class": "PreTrainedTokenizerFast"}, fh)
        with open(os.path.join(directory, "tokenizer.json"), "w") as fh:
            json.dump({"version": "1.0", "model": {"type": "BPE", "vocab": {}, "merges": []}}, fh)
    return files


def load_problem(directory, load_format="auto"):
    """What stops a safetensors load of ``directory`` at startup, as the loader meets it, else None.

    Every shard the index names (else every ``*.safetensors``) must exist, and a shard whose header is a
    safetensors header must hold all of it and every byte its tensors' ranges name (a copy cut short fails).
    A file with no safetensors header at all is a fake weight file of the simulator's own tests and passes
    (the fake server hashes it whole); so does a directory with no weights (the preflight refuses both).
    """
    if load_format not in ("auto", "safetensors", "fastsafetensors"):
        return None
    directory = str(directory)
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        try:
            with open(index) as fh:
                shards = sorted(set(str(v) for v in json.load(fh)["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            return "cannot read %s: %s" % (index, exc)
        files = [os.path.join(directory, s) for s in shards]
    else:
        try:
            files = sorted(os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(".safetensors"))
        except OSError:
            return None
    for path in files:
        if not os.path.isfile(path):
            return "[Errno 2] No such file or directory: '%s'" % path
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            raw = fh.read(8)
            length = struct.unpack("<Q", raw)[0] if len(raw) == 8 else 0
            if not 2 <= length <= MAX_HEADER:
                continue      # no safetensors header: a fake weight file
            if 8 + length > size:
                return ("Error while deserializing header: MetadataIncompleteBuffer (%s: %d bytes, its header alone "
                        "needs %d)" % (path, size, 8 + length))
            try:
                header = json.loads(fh.read(length).decode("utf-8"))
                end = max([int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"] or [0])
            except (ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError, IndexError):
                continue      # not a safetensors header: a fake weight file
        if 8 + length + end > size:
            return ("Error while deserializing header: MetadataIncompleteBuffer (%s: %d bytes, its tensors end at "
                    "byte %d)" % (path, size, 8 + length + end))
    return None
