# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Weight-only redeploys: decide whether a new checkpoint can be swapped in place, and do it.

Sources (the SGLang 0.5.23 wheel): ``srt/entrypoints/http_server.py`` (the routes),
``srt/managers/io_struct.py`` (``UpdateWeightFromDiskReqInput``, ``CheckWeightsReqInput``,
``ChecksumInfo``), ``srt/managers/tokenizer_manager.py`` (``update_weights_from_disk``,
``_update_model_path_info``), ``srt/managers/scheduler_components/weight_updater.py`` and
``srt/model_executor/model_runner_components/weight_updater.py`` (the load itself).

What an in-place update does, and therefore what :func:`weights_plan` demands:

* The running ``ModelConfig`` keeps everything the server was launched with; only its ``model_path``
  is replaced. The HF config of the new checkpoint is **not** read again: the parameters keep their
  launch shapes and dtype (the load runs under ``set_default_torch_dtype(model_config.dtype)``), and
  the loader copies the new tensors into them by name. A checkpoint whose ``config.json`` differs in
  a shape key (layers, hidden size, heads, KV heads, vocabulary, experts, MLA ranks, quantization)
  either fails to load (SGLang then reloads the old checkpoint, "Rolling back to original weights")
  or loads partly (fewer layers or experts leave old tensors in place); a difference in any other
  key (rope scaling, context length, EOS ids, ...) is silently ignored, so the server would differ
  from what a restart with the same args gives. Hence: the whole ``config.json`` must be equal, apart
  from bookkeeping keys (:data:`IGNORED_CONFIG_KEYS`); :data:`SHAPE_CONFIG_KEYS` only sorts the
  reasons.
* The loader copies each tensor of the new checkpoint into the parameter of the same name, which keeps
  its launch shape: a tensor of another shape is not refused, it **kills the server** (the scheduler
  raises "size mismatch" and the whole process tree goes; measured on 0.5.23). Equal ``config.json``
  files do not prove equal tensors (a re-sharded, pruned or quantized export keeps its config), so for
  safetensors checkpoints :func:`weights_plan` also compares the two checkpoints' tensor layouts (name,
  dtype, shape) from the files' headers (:func:`..sglang.checkpoint.tensor_layout`: a few KB per
  shard, no tensor data read): a tensor the running model has that the new checkpoint lacks, or holds
  in another dtype or shape, rules the update out, and so does a new checkpoint whose headers are
  damaged (the load would fail on it).
* The tokenizer and ``generation_config.json`` are not reloaded either: when the tokenizer follows
  the model path, the tokenizer files of both checkpoints must be byte-identical.
* The update always goes through ``DefaultModelLoader`` (other load formats are refused by SGLang);
  with speculative decoding the same ``model_path`` is loaded into the draft runners too
  (``_select_runners('all')``), so a separate draft checkpoint rules the update out.
* After a successful update ``served_model_name`` becomes the checkpoint path
  (``_update_model_path_info``): an explicit served name would change, unlike after a restart.
* ``/model_info`` (0.5.10+) reports the model path, load format and weight version now served;
  ``/server_info`` keeps the launch values. ``/weights_checker`` answers per-rank checksums from
  0.5.23 on (0.5.10 can only snapshot the whole model into host memory and compare), so an update
  this module can verify needs SGLang 0.5.23.

Multi-node groups: the update is sent to rank 0's HTTP server only (the other nodes run no API);
real SGLang forwards it to every scheduler of the group. The simulator's rank 0 answers for every
rank and does not tell the other nodes' processes (simulator/README.md, "Weights").

Standard library only (Python 3.9+).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import time

from ansible_collections.gpufleet.sglang.plugins.module_utils.common import http
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import checkpoint as ckpt
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import versions

WEIGHTS = "weights"
RESTART = "restart"

# Bookkeeping written by tools, never read by SGLang's model construction.
IGNORED_CONFIG_KEYS = ("_name_or_path", "_commit_hash", "transformers_version")
# Keys that fix the parameters' shapes or dtype: a difference fails the load or loads it partly.
SHAPE_CONFIG_KEYS = (
    "architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings",
    "num_experts", "num_local_experts", "n_routed_experts", "n_shared_experts", "moe_intermediate_size",
    "shared_expert_intermediate_size", "first_k_dense_replace", "kv_lora_rank", "q_lora_rank",
    "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "num_nextn_predict_layers",
    "quantization_config", "compression_config", "torch_dtype", "dtype", "text_config", "vision_config",
)
# Files read once at startup and not by an update: the tokenizer's (read from the tokenizer path,
# which defaults to the model path) and the generation defaults (always from the model path).
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json", "vocab.json",
    "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json", "preprocessor_config.json",
)
MODEL_FILES = ("generation_config.json",)
STARTUP_FILES = TOKENIZER_FILES + MODEL_FILES
# load_format values that SGLang's update path accepts (DefaultModelLoader), with the files each reads.
LOAD_FORMAT_PATTERNS = {
    "auto": ("*.safetensors", "*.bin"),
    "safetensors": ("*.safetensors",),
    "fastsafetensors": ("*.safetensors",),
    "pt": ("*.pt",),
    "npcache": ("*.bin",),
}
# load_format values whose files are safetensors: their tensor layouts are compared from the headers.
SAFETENSORS_FORMATS = ("auto", "safetensors", "fastsafetensors")
# How many mismatched tensors a plan lists in its differences (the reason names the first five).
MAX_TENSOR_DIFFERENCES = 20
# Args that the in-place update itself changes.
UPDATED_ARGS = ("model_path", "weight_version")
# Args that follow the model path when they are unset or equal to it.
FOLLOWING_ARGS = ("tokenizer_path", "served_model_name", "speculative_draft_model_path")
MIN_VERSION = (0, 5, 23)
DEFAULT_TIMEOUT = 600.0


class WeightsError(Exception):
    """An in-place update (or its rollback) failed; ``result`` holds what was seen (see update_in_place)."""

    def __init__(self, msg, result=None):
        super().__init__(msg)
        self.msg = msg
        self.result = result if result is not None else {}


# --------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------

def _norm_key(key):
    return str(key).strip().lstrip("-").replace("-", "_")


def _canon(value):
    """Comparable form of an arg value: unset spellings as None, numbers as floats, JSON text parsed."""
    if value is None or value is False or value == "" or value == [] or value == {}:
        return None
    if value is True:
        return True
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [_canon(v) for v in value]
    if isinstance(value, dict):
        return dict((str(k), _canon(v)) for k, v in sorted(value.items(), key=lambda kv: str(kv[0])))
    text = str(value).strip()
    if text[:1] in ("{", "["):
        try:
            return _canon(json.loads(text))
        except ValueError:
            return text
    try:
        return float(text)
    except ValueError:
        return text


def _args(args):
    return dict((_norm_key(k), v) for k, v in (args or {}).items())


def _show(value):
    if value is None:
        return "unset"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def weight_files(path, load_format=None):
    """The files SGLang's loader would read from checkpoint ``path`` for ``load_format`` (``[]`` when none)."""
    patterns = LOAD_FORMAT_PATTERNS.get(load_format or "auto", ())
    for pattern in patterns:
        found = sorted(glob.glob(os.path.join(path, pattern)))
        if found:
            return found
    return []


def _digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_checkpoint(path, load_format=None):
    """Read a local checkpoint directory: ``{path, config, weight_files, startup_files, error, weights_error}``.

    ``error`` (None when fine) names the first thing missing: the directory, ``config.json`` (or one
    that is not a JSON object), or the weight files ``load_format`` reads (that last one also in
    ``weights_error``). ``startup_files`` maps each file of :data:`STARTUP_FILES` present to its sha256.
    """
    out = {"path": path, "config": None, "weight_files": [], "startup_files": {}, "error": None, "weights_error": None}
    if not path or not os.path.isdir(str(path)):
        out["error"] = "%s is not a directory on this node" % (path or "(no path)",)
        return out
    path = str(path)
    config_error = None
    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as fh:
            config = json.load(fh)
    except OSError as exc:
        config, config_error = None, "%s has no readable config.json (%s)" % (path, exc.strerror or exc)
    except ValueError as exc:
        config, config_error = None, "%s/config.json is not valid JSON (%s)" % (path, exc)
    if config is not None and not isinstance(config, dict):
        config, config_error = None, "%s/config.json is not a JSON object" % path
    out["config"] = config
    for name in STARTUP_FILES:
        full = os.path.join(path, name)
        if os.path.isfile(full):
            try:
                out["startup_files"][name] = _digest(full)
            except OSError as exc:
                out["startup_files"][name] = "unreadable: %s" % (exc.strerror or exc)
    files = weight_files(path, load_format)
    out["weight_files"] = [os.path.basename(f) for f in files]
    if not files:
        patterns = LOAD_FORMAT_PATTERNS.get(load_format or "auto")
        if patterns is None:
            out["weights_error"] = "load_format %s is not one an in-place update can use" % load_format
        else:
            out["weights_error"] = "%s holds no weight files (%s) for load_format %s" % (
                path, " or ".join(patterns), load_format or "auto")
    out["error"] = config_error or out["weights_error"]
    return out


def _config_differences(before, after):
    out = []
    for key in sorted(set(before) | set(after)):
        if key in IGNORED_CONFIG_KEYS:
            continue
        if _canon(before.get(key)) == _canon(after.get(key)):
            continue
        kind = "shape" if key in SHAPE_CONFIG_KEYS else "config"
        out.append({"field": "config.%s" % key, "before": before.get(key), "after": after.get(key), "kind": kind})
    return out


def _follows(args, name):
    """True when arg ``name`` is unset or names the same path as this side's model path."""
    value = args.get(name)
    return _canon(value) is None or _canon(value) == _canon(args.get("model_path"))


def weights_plan(running_args, intended_args, running_model_config=None, new_model_config=None, version="0.5.23"):
    """Whether the intended config can be reached by an in-place weight update.

    ``running_args`` / ``intended_args``: the resolved server args (field -> value) of the running
    server and of the intended config. ``running_model_config`` / ``new_model_config``: the two
    checkpoints' ``config.json`` as a dict, or a checkpoint directory to read; None reads the
    directory named by the side's ``model_path``. ``version``: the SGLang version of the node.

    Returns ``{mode, why, differences, reasons, notes, checkpoint}``: ``mode`` is ``weights`` only
    when every arg other than the model path and the weight version is equal (the tokenizer path,
    served name and draft path may follow the model path), both ``config.json`` are equal apart from
    :data:`IGNORED_CONFIG_KEYS`, the startup files (tokenizer, generation config) are identical, the
    new checkpoint has weight files for the load format, the tensor layouts fit (below), and SGLang
    is 0.5.23 or newer; else ``restart``. ``differences``: ``[{field, before, after, kind}]`` with
    kind ``arg``, ``follows``, ``update``, ``shape``, ``config``, ``file`` or ``tensor``
    (``field`` ``tensor.<name>``, ``before``/``after`` ``{dtype, shape}`` or None where the tensor is
    missing; at most :data:`MAX_TENSOR_DIFFERENCES` of them); ``reasons``: why not ``weights``, one
    line each.

    Tensor layouts: when both checkpoints are safetensors (load format ``auto``, ``safetensors`` or
    ``fastsafetensors``, and ``*.safetensors`` files on both sides), every shard's header is read
    (names, dtypes, shapes; no tensor data) and every tensor of the running checkpoint must be in the
    new one with the same dtype and shape: a tensor of another shape would kill the server during
    the update. A new checkpoint whose header or index is damaged is refused (the reason names the
    file); a running checkpoint whose headers cannot be read cannot be compared, which rules the
    update out too. Tensors only the new checkpoint has are noted (SGLang skips them). When either
    side has no safetensors files (``*.bin``, ``*.pt``, or a running checkpoint of ``config.json``
    only), the layouts are not compared, and a note says so. ``checkpoint.<side>.tensors`` counts the
    tensors read (None when not read).
    """
    old = _args(running_args)
    new = _args(intended_args)
    notes = []
    differences = _arg_differences(old, new)
    load_format = new.get("load_format") or "auto"
    reasons = _arg_reasons(old, new, differences, load_format, version, notes)
    # The checkpoints.
    checkpoint = {"running": None, "new": None}
    before = _checkpoint_side(running_model_config, old.get("model_path"), old.get("load_format"), weights_needed=False)
    after = _checkpoint_side(new_model_config, new.get("model_path"), load_format, weights_needed=True)
    checkpoint["running"] = _summary(before)
    checkpoint["new"] = _summary(after)
    if before["error"]:
        reasons.append("the running checkpoint cannot be compared: %s" % before["error"])
    if after["error"]:
        reasons.append("the new checkpoint: %s" % after["error"])
    if before["config"] is not None and after["config"] is not None:
        _compare_configs(before, after, differences, reasons)
    if before["path"] and after["path"] and before["error"] is None and after["error"] is None:
        _compare_files_and_tensors(before, after, old, new, load_format, checkpoint, differences, reasons, notes)
    mode, why = _verdict(reasons, differences, checkpoint)
    return {"mode": mode, "why": why, "differences": differences, "reasons": reasons, "notes": notes,
            "checkpoint": checkpoint}


def _arg_differences(old, new):
    """The server args that differ between ``old`` and ``new``: ``[{field, before, after, kind}]`` (kind ``update``,
    ``follows`` or ``arg``)."""
    differences = []
    for key in sorted(set(old) | set(new)):
        if key in UPDATED_ARGS:
            if _canon(old.get(key)) != _canon(new.get(key)):
                differences.append({"field": "args.%s" % key, "before": old.get(key), "after": new.get(key),
                                    "kind": "update"})
            continue
        if _canon(old.get(key)) == _canon(new.get(key)):
            continue
        if key in FOLLOWING_ARGS and _follows(old, key) and _follows(new, key):
            differences.append({"field": "args.%s" % key, "before": old.get(key), "after": new.get(key),
                                "kind": "follows"})
            continue
        differences.append({"field": "args.%s" % key, "before": old.get(key), "after": new.get(key), "kind": "arg"})
    return differences


def _arg_reasons(old, new, differences, load_format, version, notes):
    """Why the args (and the SGLang version) rule an in-place update out, one line each; adds to ``notes``."""
    reasons = []
    if versions.release_tuple(version) < MIN_VERSION:
        reasons.append("SGLang %s cannot verify an in-place update: per-rank /weights_checker checksums arrived in "
                       "0.5.23 (0.5.10 can only snapshot the whole model into host memory)" % version)
    changed_args = [d for d in differences if d["kind"] == "arg"]
    if changed_args:
        reasons.append("server args other than the model path differ (%s); only a restart applies them" % "; ".join(
            "%s: %s -> %s" % (d["field"][5:], _show(d["before"]), _show(d["after"])) for d in changed_args[:8]))
    if not [d for d in differences if d["kind"] == "update"]:
        notes.append("the model path and the weight version are unchanged: an in-place update has nothing to swap")
    if load_format not in LOAD_FORMAT_PATTERNS:
        reasons.append("load_format %s: SGLang updates weights in place only through its default loader (%s)"
                       % (load_format, ", ".join(sorted(LOAD_FORMAT_PATTERNS))))
    served = new.get("served_model_name")
    if _canon(served) is not None and not _follows(new, "served_model_name"):
        reasons.append("served_model_name %s: after an in-place update SGLang serves under the checkpoint path "
                       "(TokenizerManager._update_model_path_info), a restart keeps %s" % (served, served))
    for side, args in (("running", old), ("intended", new)):
        if args.get("speculative_algorithm") and not _follows(args, "speculative_draft_model_path"):
            reasons.append("speculative decoding with a separate draft model (%s config, speculative_draft_model_path "
                           "%s): an in-place update loads the one model path into the draft runners too"
                           % (side, args.get("speculative_draft_model_path")))
            break
    if _canon(new.get("delete_ckpt_after_loading")) or _canon(old.get("delete_ckpt_after_loading")):
        reasons.append("delete_ckpt_after_loading is set: the old checkpoint is gone (no rollback target) and an "
                       "update does not delete the new one as a restart would")
    if _canon(new.get("weight_cache_mode")) not in (None, "off"):
        reasons.append("weight_cache_mode %s: SGLang refuses in-place updates while the weight cache is active"
                       % new.get("weight_cache_mode"))
    try:
        nnodes = int(float(new.get("nnodes") or 1))
    except (TypeError, ValueError):
        nnodes = 1
    if nnodes > 1:
        notes.append("multi-node group (nnodes %d): the update is sent to rank 0's server only; SGLang forwards it to "
                     "every node's schedulers (the simulator's rank 0 answers for all ranks and does not tell the "
                     "other nodes' processes)" % nnodes)
    return reasons


def _compare_configs(before, after, differences, reasons):
    """The two ``config.json`` compared: their differences, and why they rule an in-place update out."""
    config_diffs = _config_differences(before["config"], after["config"])
    differences.extend(config_diffs)
    shape = [d for d in config_diffs if d["kind"] == "shape"]
    other = [d for d in config_diffs if d["kind"] == "config"]
    if shape:
        reasons.append("the checkpoint's model layout differs (%s): the running model's parameters keep their "
                       "launch shapes and dtype, so the load fails or is partial" % "; ".join(
                           "%s: %s -> %s" % (d["field"][7:], _show(d["before"]), _show(d["after"])) for d in shape[:6]))
    if other:
        reasons.append("config.json differs (%s): an in-place update keeps the launch config, a restart would use "
                       "the new values" % "; ".join(
                           "%s: %s -> %s" % (d["field"][7:], _show(d["before"]), _show(d["after"])) for d in other[:6]))


def _compare_files_and_tensors(before, after, old, new, load_format, checkpoint, differences, reasons, notes):
    """The startup files and the tensor layouts of two readable checkpoints compared (see :func:`weights_plan`)."""
    names = MODEL_FILES
    if _follows(old, "tokenizer_path") and _follows(new, "tokenizer_path"):
        names = STARTUP_FILES
    file_diffs = []
    for name in sorted(n for n in set(before["startup_files"]) | set(after["startup_files"]) if n in names):
        if before["startup_files"].get(name) != after["startup_files"].get(name):
            file_diffs.append({"field": "file.%s" % name, "before": before["startup_files"].get(name),
                               "after": after["startup_files"].get(name), "kind": "file"})
    differences.extend(file_diffs)
    if file_diffs:
        reasons.append("files read only at startup differ (%s): an in-place update keeps the running tokenizer and "
                       "generation defaults" % ", ".join(d["field"][5:] for d in file_diffs))
    tensors = _tensor_check(before, after, old.get("load_format") or "auto", load_format)
    differences.extend(tensors["differences"])
    reasons.extend(tensors["reasons"])
    notes.extend(tensors["notes"])
    checkpoint["running"]["tensors"] = tensors["counts"][0]
    checkpoint["new"]["tensors"] = tensors["counts"][1]


def _verdict(reasons, differences, checkpoint):
    """``(mode, why)`` of :func:`weights_plan`."""
    if reasons:
        mode = RESTART
        why = "restart: " + "; ".join(reasons)
    else:
        mode = WEIGHTS
        changes = ["%s %s -> %s" % (d["field"][5:], _show(d["before"]), _show(d["after"]))
                   for d in differences if d["kind"] == "update"]
        why = "weights: only %s change%s; same args, same model layout and config.json, same tokenizer files%s" % (
            " and ".join(changes) or "nothing", "" if len(changes) != 1 else "s",
            ", same tensor names, dtypes and shapes" if checkpoint["new"].get("tensors") is not None else "")
    return mode, why


def _checkpoint_side(given, model_path, load_format, weights_needed):
    """One side's checkpoint: the directory (``given`` when it is a path, else ``model_path``) read from
    disk, with ``given``'s config instead of its ``config.json`` when ``given`` is a dict. The running
    side needs no weight files (its weights are in GPU memory), but its directory must exist: it is
    the rollback target and the reference for the startup files."""
    path = given if isinstance(given, str) and given else model_path
    side = read_checkpoint(str(path) if path else "", load_format)
    if isinstance(given, dict):
        side["config"] = given
    if not os.path.isdir(str(path or "")):
        if not weights_needed:
            side["error"] += " (it is the rollback target)"
        return side
    if side["config"] is None:
        return side
    side["error"] = side["weights_error"] if weights_needed else None
    return side


def _summary(side):
    config = side.get("config") or {}
    archs = config.get("architectures") if isinstance(config, dict) else None
    return {"path": side.get("path"), "architecture": (archs or [None])[0] if isinstance(archs, list) else archs,
            "weight_files": list(side.get("weight_files") or []), "error": side.get("error"), "tensors": None}


def _spec(spec):
    return {"dtype": spec[0], "shape": list(spec[1])} if spec else None


def _tensor_check(before, after, old_format, new_format):
    """Compare the two checkpoints' tensor layouts from their safetensors headers (see weights_plan).

    Returns ``{differences, reasons, notes, counts}``; ``counts``: the tensors read per side (None when not read).
    """
    out = {"differences": [], "reasons": [], "notes": [], "counts": [None, None]}
    sides = (("running", before, old_format), ("new", after, new_format))
    for label, side, load_format in sides:
        files = side.get("weight_files") or []
        if load_format not in SAFETENSORS_FORMATS or not files or not all(f.endswith(".safetensors") for f in files):
            out["notes"].append("tensor layouts not compared: the %s checkpoint %s has no safetensors weights for "
                                "load_format %s (%s); only its config.json was compared"
                                % (label, side.get("path"), load_format, ", ".join(files[:3]) or "no weight files"))
            return out
    layouts = []
    for label, side, _format in sides:
        try:
            layout, _files = ckpt.tensor_layout(str(side["path"]))
        except ckpt.CheckpointError as exc:
            if label == "new":
                out["reasons"].append("the new checkpoint cannot be loaded, an in-place update would fail on it: %s"
                                      % exc)
            else:
                out["reasons"].append("the running checkpoint's tensors cannot be compared with the new one's (%s): "
                                      "whether the new tensors fit the running model is unknown, so only a restart "
                                      "is safe" % exc)
            layouts.append(None)
            continue
        layouts.append(layout)
    running, new = layouts
    out["counts"] = [len(running) if running is not None else None, len(new) if new is not None else None]
    if running is None or new is None:
        return out
    mismatched = sorted(name for name in running if new.get(name) != running[name])
    for name in mismatched[:MAX_TENSOR_DIFFERENCES]:
        out["differences"].append({"field": "tensor.%s" % name, "before": _spec(running[name]),
                                   "after": _spec(new.get(name)), "kind": "tensor"})
    if mismatched:
        out["reasons"].append(
            "the new checkpoint's tensors do not fit the running model (%d of its %d tensors: %s): an in-place update "
            "copies each tensor into the parameter of the same name and launch shape, and a tensor of another shape "
            "kills the server (SGLang 0.5.23); only a restart loads this checkpoint"
            % (len(mismatched), len(running), "; ".join(ckpt.layout_differences(running, new))))
    extra = sorted(set(new) - set(running))
    if extra:
        out["notes"].append("%d tensor%s only in the new checkpoint (%s%s): the update skips names the running model "
                            "does not have" % (len(extra), "" if len(extra) == 1 else "s", ", ".join(extra[:3]),
                                               ", ..." if len(extra) > 3 else ""))
    return out


# --------------------------------------------------------------------------
# The update
# --------------------------------------------------------------------------

def _clock():
    return time.monotonic()


def _call(method, base_url, path, api_key, timeout, body=None):
    """(status, data); a connection failure becomes WeightsError by the caller."""
    status, dummy, data = http.request(method, base_url.rstrip("/") + path, body=body, api_key=api_key, timeout=timeout)
    return status, data


def model_info(base_url, api_key=None, timeout=30.0):
    """``/model_info``: ``{model_path, weight_version, load_format, served_model_name, architectures}``."""
    status, data = _call("GET", base_url, "/model_info", api_key, timeout)
    if status == 404:
        raise WeightsError("the server has no /model_info (SGLang older than 0.5.10): an in-place update cannot be "
                           "verified there; restart instead")
    if status != 200 or not isinstance(data, dict):
        raise WeightsError("/model_info answered HTTP %s: %s" % (status, _short(data)))
    keys = ("model_path", "weight_version", "load_format", "served_model_name", "architectures", "disaggregation_mode")
    return dict((k, data.get(k)) for k in keys)


def checksums(base_url, api_key=None, timeout=120.0):
    """``/weights_checker`` action ``checksum``: ``{per_engine_checksum, ranks: [{rank, tp_rank, dp_rank, pp_rank,
    per_gpu_checksum, files}]}`` (``files``: the number of checked tensors or files of that rank)."""
    status, data = _call("POST", base_url, "/weights_checker", api_key, timeout, body={"action": "checksum"})
    if status == 404:
        raise WeightsError("the server has no /weights_checker (SGLang older than 0.5.10): an in-place update cannot "
                           "be verified there; restart instead")
    if status != 200 or not isinstance(data, dict) or not data.get("success") or not isinstance(data.get("ranks"), list):
        raise WeightsError("/weights_checker gave no checksums (HTTP %s: %s); per-rank checksums need SGLang 0.5.23"
                           % (status, _short(data)))
    ranks = []
    for info in data["ranks"]:
        par = ((info or {}).get("parallelism_info") or [{}])[0] or {}
        ranks.append({"rank": par.get("rank"), "tp_rank": par.get("tp_rank"), "dp_rank": par.get("dp_rank"),
                      "pp_rank": par.get("pp_rank"), "per_gpu_checksum": (info or {}).get("per_gpu_checksum"),
                      "files": len((info or {}).get("checksums") or {})})
    return {"per_engine_checksum": data.get("per_engine_checksum"), "ranks": ranks}


def _short(data, limit=300):
    text = data if isinstance(data, str) else json.dumps(data, sort_keys=True)
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


def classify_failure(message):
    """What a failed ``/update_weights_from_disk`` says went wrong: ``path``, ``oom``, ``load``, ``flush`` or ``error``."""
    text = message or ""
    if "Cannot find any model weights" in text or "Failed to get weights iterator" in text:
        return "path"
    if "OutOfMemory" in text or "out of memory" in text:
        return "oom"
    if "cache was not flushed" in text:
        return "flush"
    if "Failed to update weights" in text or "Failed to get model loader" in text:
        return "load"
    return "error"


FAILURE_TEXT = {
    "path": "the checkpoint path has no weights SGLang can read (wrong path or load format)",
    "oom": "CUDA ran out of memory while staging the new weights",
    "load": "the new checkpoint does not fit the loaded model (architecture or tensor mismatch)",
    "flush": "the weights were swapped but the radix cache was not flushed (requests were still running)",
    "error": "the update failed",
    "timeout": "no answer to the update within the timeout",
    "http": "the update request was refused",
}


def _same_state(info_a, info_b, sums_a, sums_b):
    return (info_a.get("model_path") == info_b.get("model_path")
            and info_a.get("weight_version") == info_b.get("weight_version")
            and sums_a.get("per_engine_checksum") == sums_b.get("per_engine_checksum")
            and [r["per_gpu_checksum"] for r in sums_a.get("ranks", [])] == [r["per_gpu_checksum"] for r in sums_b.get("ranks", [])])


def update_in_place(base_url, api_key, model_path, weight_version=None, load_format=None, abort_all_requests=True,
                    flush_cache=True, timeout=DEFAULT_TIMEOUT, expected_checksum=None):
    """Swap the weights of the running server at ``base_url`` for the checkpoint ``model_path``, and verify.

    Reads ``/model_info`` and the ``/weights_checker`` checksums, sends ``/update_weights_from_disk``
    (``model_path``, ``load_format`` when given, ``abort_all_requests``, ``weight_version``,
    ``flush_cache``), then reads both again. Success means HTTP 200 with ``success``, ``/model_info``
    showing ``model_path`` (and ``weight_version`` when given), and the checksums changed when the path
    did (or equal to ``expected_checksum``, a ``per_engine_checksum``, when given). A multi-node group
    is updated through rank 0's URL.

    Returns ``{changed, model_path, weight_version: {before, after}, model_path_before, checksums:
    {before, after}, checksums_changed, model_info, message, num_paused_requests, timings: {model_info_s,
    checksum_before_s, update_s, checksum_after_s, total_s}}``. Raises :class:`WeightsError` with that
    result plus ``failure`` (path, oom, load, flush, error, timeout, http, verify) and ``old_weights_serving``
    (True when ``/model_info`` and every rank's checksum are as before the call, False when not, None when
    they could not be read).
    """
    started = _clock()
    timings = {}
    result = {"changed": False, "model_path": model_path, "model_path_before": None,
              "weight_version": {"before": None, "after": None}, "checksums": {"before": None, "after": None},
              "checksums_changed": None, "model_info": None, "message": "", "num_paused_requests": 0,
              "failure": None, "old_weights_serving": None, "timings": timings}
    short = min(float(timeout), 60.0)
    info_before, sums_before = _state_before(base_url, api_key, short, timeout, timings, result)
    result.update(model_path_before=info_before["model_path"], model_info=info_before)
    result["weight_version"]["before"] = info_before["weight_version"]
    result["checksums"]["before"] = sums_before
    body = {"model_path": model_path, "abort_all_requests": bool(abort_all_requests), "flush_cache": bool(flush_cache)}
    if load_format:
        body["load_format"] = load_format
    if weight_version is not None:
        body["weight_version"] = str(weight_version)
    failure, message = _send_update(base_url, api_key, timeout, body, timings, result)
    result["message"] = message
    # Read the state after, whatever happened.
    info_after, sums_after, after_error = _state_after(base_url, api_key, short, timeout, timings)
    if info_after is not None:
        result["model_info"] = info_after
        result["weight_version"]["after"] = info_after["weight_version"]
    result["checksums"]["after"] = sums_after
    if sums_after is not None:
        result["checksums_changed"] = sums_after.get("per_engine_checksum") != sums_before.get("per_engine_checksum")
    timings["total_s"] = round(_clock() - started, 3)
    if failure == "flush" and info_after is not None and info_after.get("model_path") == model_path:
        failure, message = _flush_again(base_url, api_key, short, message)
        result["message"] = message
    if failure is not None:
        result["failure"] = failure
        if info_after is not None and sums_after is not None:
            result["old_weights_serving"] = _same_state(info_before, info_after, sums_before, sums_after)
        raise WeightsError(_failure_message(failure, message, info_before, info_after, result, after_error), result)
    # Verify the success.
    problems = _verify_update(info_before, info_after, sums_after, after_error, model_path, weight_version,
                              expected_checksum, result)
    if problems:
        result["failure"] = "verify"
        raise WeightsError("the update of %s answered success but does not verify: %s" % (base_url, "; ".join(problems)), result)
    result["changed"] = True
    return result


def _state_before(base_url, api_key, short, timeout, timings, result):
    """``(model_info, checksums)`` before the update; raises :class:`WeightsError` (nothing was changed)."""
    try:
        tic = _clock()
        info_before = model_info(base_url, api_key, short)
        timings["model_info_s"] = round(_clock() - tic, 3)
        tic = _clock()
        sums_before = checksums(base_url, api_key, timeout)
        timings["checksum_before_s"] = round(_clock() - tic, 3)
    except http.HTTPConnectionError as exc:
        result["failure"] = "http"
        raise WeightsError("cannot read the server's state before the update (%s); nothing was changed" % exc, result)
    except WeightsError as exc:
        result["failure"] = "http"
        raise WeightsError("%s; nothing was changed" % exc.msg, result)
    return info_before, sums_before


def _send_update(base_url, api_key, timeout, body, timings, result):
    """Send ``/update_weights_from_disk``: ``(failure, message)``, failure None on success."""
    failure = None
    message = ""
    tic = _clock()
    try:
        status, data = _call("POST", base_url, "/update_weights_from_disk", api_key, timeout, body=body)
    except http.RequestTimeout:
        status, data = None, None
        failure = "timeout"
        message = "no answer to /update_weights_from_disk within %s s" % timeout
    except http.HTTPConnectionError as exc:
        status, data = None, None
        failure = "http"
        message = "the update request got no answer: %s" % exc
    timings["update_s"] = round(_clock() - tic, 3)
    if status is not None:
        if isinstance(data, dict):
            message = str(data.get("message") or "")
            paused = data.get("num_paused_requests")
            result["num_paused_requests"] = sum(paused) if isinstance(paused, list) else (paused or 0)
        else:
            message = _short(data)
        if status == 200 and isinstance(data, dict) and data.get("success"):
            failure = None
        elif status in (401, 403, 422):
            failure = "http"
            message = "HTTP %s: %s" % (status, _short(data))
        else:
            failure = classify_failure(message)
    return failure, message


def _state_after(base_url, api_key, short, timeout, timings):
    """``(model_info, checksums, error)`` after the update, whatever happened (None where unread)."""
    info_after = sums_after = None
    try:
        info_after = model_info(base_url, api_key, short)
        tic = _clock()
        sums_after = checksums(base_url, api_key, timeout)
        timings["checksum_after_s"] = round(_clock() - tic, 3)
    except (http.HTTPConnectionError, WeightsError) as exc:
        after_error = getattr(exc, "msg", None) or str(exc)
    else:
        after_error = None
    return info_after, sums_after, after_error


def _verify_update(info_before, info_after, sums_after, after_error, model_path, weight_version, expected_checksum, result):
    """Why an update that answered success does not verify, one line each."""
    problems = []
    if info_after is None or sums_after is None:
        problems.append("the state after the update could not be read (%s)" % after_error)
    else:
        if info_after.get("model_path") != model_path:
            problems.append("/model_info shows model_path %s, not %s" % (info_after.get("model_path"), model_path))
        if weight_version is not None and str(info_after.get("weight_version")) != str(weight_version):
            problems.append("/model_info shows weight_version %s, not %s" % (info_after.get("weight_version"), weight_version))
        if expected_checksum and sums_after.get("per_engine_checksum") != expected_checksum:
            problems.append("the weights' per_engine_checksum is %s, not the expected %s" % (
                sums_after.get("per_engine_checksum"), expected_checksum))
        elif (not expected_checksum and model_path != info_before.get("model_path")
              and not result["checksums_changed"]):
            problems.append("the checksums did not change although the model path did (%s -> %s)" % (
                info_before.get("model_path"), model_path))
    return problems


def _flush_again(base_url, api_key, timeout, message):
    """The swap happened but the cache kept old-weight prefixes: flush once more (waiting for idle, 0.5.23)."""
    try:
        status, data = _call("POST", base_url, "/flush_cache?timeout=%d" % max(1, int(timeout)), api_key, timeout + 5)
    except http.HTTPConnectionError as exc:
        return "flush", "%s; a second /flush_cache got no answer: %s" % (message, exc)
    if status == 200:
        return None, "%s; the cache was flushed by a second /flush_cache" % message
    return "flush", "%s; a second /flush_cache answered HTTP %s: %s" % (message, status, _short(data))


def _failure_message(failure, message, info_before, info_after, result, after_error):
    what = FAILURE_TEXT.get(failure, "the update failed")
    text = "in-place weight update to %s failed: %s" % (result["model_path"], what)
    if message:
        text += " (SGLang: %s)" % message.replace("\n", " ")
    serving = result.get("old_weights_serving")
    if serving is True:
        text += "; the old weights still serve: /model_info shows %s (weight_version %s) and every rank's checksum " \
                "is unchanged" % (info_before.get("model_path"), info_before.get("weight_version"))
    elif serving is False:
        text += "; the server's weights changed: /model_info shows %s (weight_version %s), checksums changed: %s" % (
            info_after.get("model_path"), info_after.get("weight_version"), result.get("checksums_changed"))
    else:
        text += "; the state after the update could not be read (%s)" % (after_error or "unknown")
    return text


def roll_back(base_url, api_key, previous_model_path, previous_weight_version=None, load_format=None,
              expected_checksum=None, abort_all_requests=True, flush_cache=True, timeout=DEFAULT_TIMEOUT):
    """Update back to the previous checkpoint (and version); a no-op when the server already serves it.

    ``expected_checksum``: the ``per_engine_checksum`` recorded while the previous checkpoint served
    (update_in_place's ``checksums.before``); when given, the rollback must restore exactly it.
    Returns update_in_place's result (``changed`` False for the no-op). Raises :class:`WeightsError`
    when the rollback fails or does not verify: the caller then restarts the server with its
    known-good config.
    """
    short = min(float(timeout), 60.0)
    try:
        info = model_info(base_url, api_key, short)
        sums = checksums(base_url, api_key, timeout)
    except (http.HTTPConnectionError, WeightsError) as exc:
        raise WeightsError("rollback to %s impossible: cannot read the server's state (%s); restart the server with "
                           "the known-good config" % (previous_model_path, getattr(exc, "msg", None) or exc),
                           {"failure": "http", "changed": False})
    same_version = previous_weight_version is None or str(info.get("weight_version")) == str(previous_weight_version)
    same_sum = not expected_checksum or sums.get("per_engine_checksum") == expected_checksum
    if info.get("model_path") == previous_model_path and same_version and same_sum:
        return {"changed": False, "model_path": previous_model_path, "model_path_before": info.get("model_path"),
                "weight_version": {"before": info.get("weight_version"), "after": info.get("weight_version")},
                "checksums": {"before": sums, "after": sums}, "checksums_changed": False, "model_info": info,
                "message": "the server already serves %s" % previous_model_path, "num_paused_requests": 0,
                "failure": None, "old_weights_serving": None, "timings": {}}
    try:
        return update_in_place(base_url, api_key, previous_model_path, previous_weight_version, load_format=load_format,
                               abort_all_requests=abort_all_requests, flush_cache=flush_cache, timeout=timeout,
                               expected_checksum=expected_checksum)
    except WeightsError as exc:
        raise WeightsError("rollback failed, restart the server with the known-good config: %s" % exc.msg, exc.result)
