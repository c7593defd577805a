# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A checkpoint directory, checked without reading its tensors (standard library only).

What SGLang reads at startup, and fails on only after the old server is gone, is checked here before
anything is touched (docs/reference/checkpoints.md):

* the safetensors files: each file's header (8 bytes of little-endian length, then that many bytes of JSON
  naming every tensor's dtype, shape and byte range), and the file's size against the ranges, so that a
  truncated or garbled shard is found by reading a few KB of it;
* ``model.safetensors.index.json``: every shard its ``weight_map`` names exists, and holds the tensors the
  map puts there;
* the tokenizer: what ``tokenizer_config.json`` needs (a fast tokenizer's ``tokenizer.json``, or the slow
  tokenizer's vocabulary files);
* read access for the server's user (owner, group and mode bits, and search access on every directory
  above), not for the user the check runs as (root reads everything).

:func:`tensor_layout` and :func:`layout_differences` compare two checkpoints by tensor name, dtype and
shape: SGLang's ``/update_weights_from_disk`` copies tensors by name into the running model, and a shape
that differs kills the server (measured on 0.5.23, docs/reference/sglang-processes.md).
"""
from __future__ import annotations

import json
import os
import stat
import struct
import time

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
# Bytes per element of every safetensors dtype (the format's own list).
DTYPE_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "F4": 0.5, "F6_E2M3": 0.75, "F6_E3M2": 0.75,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8, "C64": 8,
}
# A header larger than this is not a safetensors header (the format's own reader caps it at 100 MB).
MAX_HEADER = 100 * 1024 * 1024
# Slow-tokenizer files, by what a tokenizer_config may need instead of tokenizer.json.
SLOW_TOKENIZER_FILES = ("tokenizer.model", "vocab.json", "vocab.txt", "spiece.model", "sentencepiece.bpe.model")


class CheckpointError(Exception):
    """The checkpoint cannot be served: ``path`` is the first broken file, the message says why and what to do."""

    def __init__(self, path, message):
        super().__init__("%s: %s" % (path, message))
        self.path = path


def read_header(path):
    """``(header, data_start, file_size)`` of one safetensors file; raises :class:`CheckpointError`."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise CheckpointError(path, "%d bytes, too short for a safetensors header (a truncated copy?); copy the "
                                            "file again" % size)
            (length,) = struct.unpack("<Q", head)
            if length <= 1 or length > MAX_HEADER or 8 + length > size:
                raise CheckpointError(path, "the header claims %d bytes in a file of %d bytes: not a safetensors file, or "
                                            "cut short; copy the file again" % (length, size))
            raw = fh.read(length)
    except OSError as exc:
        raise CheckpointError(path, "cannot be read: %s" % (exc.strerror or exc))
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(path, "the header is not JSON (%s): the file is damaged; copy it again" % exc)
    if not isinstance(header, dict):
        raise CheckpointError(path, "the header is not a JSON object: the file is damaged; copy it again")
    return header, 8 + length, size


def tensors_of(path):
    """``{name: (dtype, shape)}`` of one safetensors file, checked against the file's size."""
    header, data_start, size = read_header(path)
    out = {}
    ranges = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict):
            raise CheckpointError(path, "tensor %s has no dtype/shape/data_offsets entry: the file is damaged" % name)
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype not in DTYPE_SIZES or not isinstance(shape, list) or not (isinstance(offsets, list) and len(offsets) == 2) \
                or not all(isinstance(dim, int) and not isinstance(dim, bool) and dim >= 0 for dim in shape):
            raise CheckpointError(path, "tensor %s has an invalid entry %r: the file is damaged" % (name, entry))
        begin, end = offsets
        count = 1
        for dim in shape:
            count *= int(dim)
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end) or \
                end - begin != int(count * DTYPE_SIZES[dtype]):
            raise CheckpointError(path, "tensor %s: %s %s needs %d bytes, the header gives %r: the file is damaged"
                                  % (name, dtype, shape, int(count * DTYPE_SIZES[dtype]), offsets))
        ranges.append((begin, end, name))
        out[name] = (dtype, tuple(int(d) for d in shape))
    # The format's own reader wants the tensors to cover the data exactly: back to back, from byte 0 to the end.
    covered = 0
    for begin, end, name in sorted(ranges):
        if begin != covered:
            raise CheckpointError(path, "tensor %s starts at data byte %d, where %d was expected (a gap or an overlap): "
                                        "the file is damaged; copy it again" % (name, begin, covered))
        covered = end
    if data_start + covered > size:
        raise CheckpointError(path, "%d bytes, but its tensors end at byte %d: the file was cut short (an interrupted "
                                    "copy or download); copy it again" % (size, data_start + covered))
    if data_start + covered < size:
        extra = size - data_start - covered
        raise CheckpointError(path, "%d bytes, but its tensors end at byte %d: %d trailing bytes that no tensor names "
                                    "(a damaged or appended file); copy it again" % (size, data_start + covered, extra))
    return out


def weight_files(directory):
    """The safetensors files SGLang loads from ``directory``: the index's shards, else every ``*.safetensors``.

    Returns ``(files, index)``: ``files`` sorted paths, ``index`` the parsed index (or None). Raises
    :class:`CheckpointError` for a missing or broken index entry.
    """
    index_path = os.path.join(directory, INDEX)
    if os.path.exists(index_path):
        try:
            with open(index_path) as fh:
                index = json.load(fh)
        except (OSError, ValueError) as exc:
            raise CheckpointError(index_path, "cannot be read as JSON (%s); restore it from the checkpoint's source" % exc)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(index_path, "has no weight_map: restore it from the checkpoint's source")
        shards = sorted(set(str(v) for v in weight_map.values()))
        for shard in shards:
            if os.path.basename(shard) != shard:
                raise CheckpointError(index_path, "names the shard %r outside the checkpoint directory" % shard)
            if not os.path.isfile(os.path.join(directory, shard)):
                raise CheckpointError(os.path.join(directory, shard), "is named by %s but missing; copy it from the "
                                                                      "checkpoint's source" % INDEX)
        return [os.path.join(directory, s) for s in shards], index
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".safetensors"))
    except OSError as exc:
        raise CheckpointError(directory, "cannot be listed: %s" % (exc.strerror or exc))
    return [os.path.join(directory, n) for n in names], None


def tensor_layout(directory):
    """``({name: (dtype, shape)}, files)`` of a checkpoint directory, every shard's header checked."""
    files, index = weight_files(directory)
    layout = {}
    for path in files:
        layout.update(tensors_of(path))
    _check_index(directory, index, layout)
    return layout, files


def _check_index(directory, index, layout):
    """Every tensor the index maps is in the shard it names (the index and the shards belong together)."""
    if index is None:
        return
    for name, shard in sorted(index["weight_map"].items()):
        if name not in layout:
            raise CheckpointError(os.path.join(directory, str(shard)),
                                  "does not hold the tensor %s that %s puts there: the index and the shards come from "
                                  "different checkpoints; copy them again together" % (name, INDEX))


def _show_spec(spec):
    return "%s %s" % (spec[0], list(spec[1])) if spec else "missing"


def layout_differences(running, new, limit=5):
    """What stops ``new`` from replacing ``running`` in place: tensors ``new`` lacks, or holds in another dtype or shape.

    Tensors only ``new`` has are left out: SGLang skips names the running model does not have.
    """
    problems = []
    for name in sorted(running):
        have, want = running[name], new.get(name)
        if want is None:
            problems.append("%s: missing from the new checkpoint" % name)
        elif want != have:
            problems.append("%s: %s running, %s in the new checkpoint" % (name, _show_spec(have), _show_spec(want)))
    if len(problems) > limit:
        problems = problems[:limit] + ["... %d more" % (len(problems) - limit)]
    return problems


def tokenizer_problem(directory, skip_init=False):
    """None when the tokenizer files that ``tokenizer_config.json`` needs are there, else what is missing."""
    if skip_init:
        return None
    config_path = os.path.join(directory, "tokenizer_config.json")
    if not os.path.exists(config_path):
        return None      # no tokenizer config: SGLang takes the tokenizer from --tokenizer-path or the hub name
    try:
        with open(config_path) as fh:
            config = json.load(fh)
    except (OSError, ValueError) as exc:
        return "%s cannot be read as JSON (%s)" % (config_path, exc)
    config = config if isinstance(config, dict) else {}
    named = config.get("tokenizer_file")
    if named and not os.path.isabs(str(named)) and not os.path.exists(os.path.join(directory, str(named))):
        return "%s names tokenizer_file %s, which is missing" % (config_path, named)
    if os.path.exists(os.path.join(directory, "tokenizer.json")):
        return None
    cls = str(config.get("tokenizer_class") or "")
    if cls == "PreTrainedTokenizerFast":
        return "%s asks for a fast tokenizer (PreTrainedTokenizerFast), but tokenizer.json is missing" % config_path
    if any(os.path.exists(os.path.join(directory, name)) for name in SLOW_TOKENIZER_FILES):
        return None
    return ("%s needs tokenizer.json or a slow tokenizer's vocabulary (%s), and the directory has none"
            % (config_path, ", ".join(SLOW_TOKENIZER_FILES)))


def readable_by(path, uid, gids, directory=False):
    """Whether ``uid`` (with groups ``gids``) may read ``path`` (and search it, for a directory) by its mode bits."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    if uid == 0:
        return True
    need = (stat.S_IRUSR | stat.S_IXUSR) if directory else stat.S_IRUSR
    if st.st_uid == uid:
        return st.st_mode & need == need
    need >>= 3
    if st.st_gid in gids:
        return st.st_mode & need == need
    need >>= 3
    return st.st_mode & need == need


def access_problem(paths, uid, gids):
    """``(path, why)`` for the first of ``paths`` (or a directory above one) that ``uid`` cannot read; None when all can."""
    checked = set()
    for path in paths:
        parent = os.path.dirname(os.path.abspath(path))
        chain = []
        while parent not in checked and parent != os.path.dirname(parent):
            chain.append(parent)
            parent = os.path.dirname(parent)
        for directory in reversed(chain):
            checked.add(directory)
            if not readable_by(directory, uid, gids, directory=True):
                return directory, "the server's user (uid %s) cannot enter this directory; give it r-x there" % uid
        if not readable_by(path, uid, gids):
            return path, "the server's user (uid %s) cannot read this file; give it read access" % uid
    return None


def verify(directory, what="model_path", uid=None, gids=(), skip_tokenizer_init=False, deadline=None):
    """Check a checkpoint directory as the server will load it; raises :class:`CheckpointError` for the first problem.

    Returns ``{files, tensors, bytes, seconds}``. ``deadline`` (monotonic seconds) bounds a checkpoint of very many
    shards: past it the rest is left unchecked and ``complete`` is False.
    """
    started = time.monotonic()
    if not os.path.isdir(directory):
        raise CheckpointError(directory, "%s is not a directory on this node" % what)
    files, index = weight_files(directory)
    if not files:
        bins = [n for n in os.listdir(directory) if n.endswith(".bin") or n.endswith(".pt")]
        if not bins:
            raise CheckpointError(directory, "%s holds no weights (no *.safetensors, no %s, no *.bin): SGLang would stop "
                                             "with \"Cannot find any model weights\"; copy the checkpoint there" % (what, INDEX))
    tensors = 0
    total = 0
    complete = True
    layout = {}
    for path in files:
        if deadline is not None and time.monotonic() > deadline:
            complete = False
            break
        found = tensors_of(path)
        layout.update(found)
        tensors += len(found)
        total += os.path.getsize(path)
    if complete:
        _check_index(directory, index, layout)
    problem = tokenizer_problem(directory, skip_tokenizer_init)
    if problem:
        raise CheckpointError(os.path.join(directory, "tokenizer.json"),
                              problem + "; copy the tokenizer files with the checkpoint, or set tokenizer_path")
    if uid is not None:
        problem = access_problem([os.path.join(directory, "config.json")] + files, uid, set(gids))
        if problem:
            raise CheckpointError(*problem)
    return {"files": len(files), "tensors": tensors, "bytes": total, "complete": complete,
            "seconds": round(time.monotonic() - started, 3)}
