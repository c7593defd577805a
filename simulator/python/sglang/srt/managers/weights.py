"""In-place weight updates of the fake server (SGLang 0.5.23 semantics).

* ``POST /update_weights_from_disk`` (``UpdateWeightFromDiskReqInput``:
  model_path, load_format, abort_all_requests, weight_version, flush_cache,
  ...): waits for the requests in flight (the real model_update_lock is a
  writer lock; new requests wait behind it), checks the checkpoint, stages it
  on every local scheduler (``SGLANG_SIM_UPDATE_BUFFER_MIB`` extra GPU memory
  through gpusim, so a full GPU gives a CUDA OOM), then swaps.  On success
  ``/model_info`` carries the new model_path (``served_model_name`` follows
  it, as TokenizerManager._update_model_path_info does), load_format and
  weight_version; ``/server_info`` keeps the launch values.  Failures leave
  the old weights serving:

  - no weight files (``*.safetensors``/``*.bin`` for ``auto``; a missing
    path too): "Failed to get weights iterator: Cannot find any model
    weights with `<path>`.";
  - CUDA OOM while staging.

  The loader matches tensors to the model's parameters by name and shape, not by
  architecture (measured on the real 0.5.23): a checkpoint of another architecture
  with the same tensor names and shapes loads (200; ``architectures`` keeps the
  launch value; tensors the model has no parameter for are skipped). A tensor
  whose shape differs from its parameter's **kills the server**: the scheduler
  raises "size mismatch" in the loader, sends SIGQUIT, the HTTP request gets no
  answer and the tree goes after the crash diagnostics (5 s). Shapes come from the
  safetensors headers, with SGLang's fused parameters (``q/k/v_proj`` ->
  ``qkv_proj``, ``gate/up_proj`` -> ``gate_up_proj``, stacked on dim 0); a
  checkpoint without readable headers is compared by the shape fields of its
  ``config.json``.

* ``/weights_checker``: per-rank checksums keyed by parameter name (the fused
  names, in the model's module order) from the tensors' bytes, as the real
  weight_checker.py; a checkpoint without readable safetensors headers (a fake
  one) gets one entry per weight file. ``per_gpu_checksum`` and
  ``per_engine_checksum`` computed as weight_checker.py / the control mixin do.
* ``/update_weight_version``.
"""
from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import time

logger = logging.getLogger("sglang.srt.managers.tokenizer_manager")

LOAD_FORMAT_PATTERNS = {
    "auto": ("*.safetensors", "*.bin"),
    "safetensors": ("*.safetensors",),
    "fastsafetensors": ("*.safetensors",),
    "pt": ("*.pt",),
    "npcache": ("*.bin",),
}


class WeightsError(Exception):
    pass


def weight_files(path, load_format):
    """Weight files of a local checkpoint as DefaultModelLoader._prepare_weights finds them."""
    patterns = LOAD_FORMAT_PATTERNS.get(load_format or "auto")
    if patterns is None:
        raise WeightsError("Unknown load_format: %s" % load_format)
    files = []
    if os.path.isdir(path):
        for pattern in patterns:
            files = sorted(glob.glob(os.path.join(path, pattern)))
            if files:
                break
    if not files:
        raise WeightsError("Cannot find any model weights with `%s`" % path)
    return files


def _file_digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def overall_checksum(checksums):
    """utils/weight_checker.py overall_checksum."""
    h = hashlib.sha256()
    for name in sorted(checksums):
        h.update(name.encode())
        h.update(checksums[name].encode())
    return h.hexdigest()


FUSED = ((".q_proj.", ".qkv_proj."), (".k_proj.", ".qkv_proj."), (".v_proj.", ".qkv_proj."),
         (".gate_proj.", ".gate_up_proj."), (".up_proj.", ".gate_up_proj."))
LAYER_ORDER = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj", "input_layernorm",
               "post_attention_layernorm")
SHAPE_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "vocab_size", "head_dim")
MAX_HASHED_BYTES = 64 << 20


def safetensors_header(path):
    """``{name: {"dtype", "shape", "data_offsets"}}`` and the data start, or (None, 0) if not a safetensors file."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(8)
            if len(raw) != 8:
                return None, 0
            size = int.from_bytes(raw, "little")
            if size <= 0 or size > (100 << 20):
                return None, 0
            header = json.loads(fh.read(size).decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None, 0
    if not isinstance(header, dict):
        return None, 0
    header.pop("__metadata__", None)
    for entry in header.values():
        if not (isinstance(entry, dict) and isinstance(entry.get("shape"), list)):
            return None, 0
    return header, 8 + size


def fused_name(name):
    for old, new in FUSED:
        if old in name:
            return name.replace(old, new)
    return name


def _order(name):
    parts = name.split(".")
    if name.startswith("model.embed_tokens."):
        return (0, 0, 0, name)
    if name.startswith("model.layers.") and len(parts) > 3 and parts[2].isdigit():
        rest = ".".join(parts[3:-1])
        return (1, int(parts[2]), LAYER_ORDER.index(rest) if rest in LAYER_ORDER else len(LAYER_ORDER), name)
    if name.startswith("lm_head."):
        return (3, 0, 0, name)
    return (2, 0, 0, name)


def read_parameters(files):
    """The model parameters a checkpoint's tensors load into: ``{fused name: [(file, entry, data start), ...]}``
    in module order, or None when a file is not safetensors."""
    params = {}
    for path in files:
        header, start = safetensors_header(path)
        if header is None:
            return None
        for name in sorted(header):
            params.setdefault(fused_name(name), []).append((path, header[name], start))
    return dict((k, params[k]) for k in sorted(params, key=_order))


def param_shape(parts):
    shapes = [list(entry["shape"]) for _path, entry, _start in parts]
    if len(shapes) == 1:
        return shapes[0]
    return [sum(s[0] for s in shapes)] + shapes[0][1:] if all(s[1:] == shapes[0][1:] for s in shapes) else shapes


def _param_digest(parts):
    h = hashlib.sha256()
    for path, entry, start in parts:
        begin, end = entry.get("data_offsets") or (0, 0)
        if end - begin > MAX_HASHED_BYTES:
            h.update(("%s:%s:%s" % (_file_digest(path), begin, end)).encode())
            continue
        try:
            with open(path, "rb") as fh:
                fh.seek(start + begin)
                h.update(fh.read(end - begin))
        except OSError:
            h.update(b"missing")
    return h.hexdigest()


def _config(path):
    try:
        with open(os.path.join(path, "config.json")) as fh:
            data = json.load(fh)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


class WeightState:
    """The weights a server serves now; owned by the engine (main process)."""

    def __init__(self, engine):
        sa = engine.server_args
        self.engine = engine
        self.model_path = sa.model_path
        self.served_model_name = sa.served_model_name
        self.load_format = sa.values.get("load_format") or "auto"
        self.weight_version = getattr(sa, "weight_version", None) or sa.values.get("weight_version") or "default"
        # digests are taken when weights load: what the GPU holds, even if the
        # files change or go away later (--delete-ckpt-after-loading)
        self.shapes, self.digests = self._load_digests(self._files_or_all(self.model_path))
        self.config = _config(self.model_path)
        self.draft_path = sa.speculative_draft_model_path if engine.spec.enabled else None
        self.draft_digests = self._load_digests(self._files_or_all(self.draft_path))[1] if self.draft_path else {}
        self.snapshot = None
        self.last_load_s = None

    @staticmethod
    def _files_or_all(path):
        """Launch checkpoint: its weight files, else every regular file (the fake's
        startup accepts a directory holding only config.json)."""
        try:
            return weight_files(path, "auto")
        except WeightsError:
            try:
                return sorted(os.path.join(path, n) for n in os.listdir(path)
                              if os.path.isfile(os.path.join(path, n)))
            except OSError:
                return []

    # ------------------------------------------------------------ checksums
    def _load_digests(self, files):
        """(parameter shapes or None, {checksum key: digest}): by parameter for safetensors, else by file."""
        params = read_parameters(files) if files else None
        if not params:
            return None, self._digests(files)
        return (dict((name, param_shape(parts)) for name, parts in params.items()),
                dict((name, _param_digest(parts)) for name, parts in params.items()))

    def _digests(self, files):
        out = {}
        for f in files:
            try:
                out[os.path.basename(f)] = _file_digest(f)
            except OSError:
                out[os.path.basename(f)] = "missing"
        return out

    def ranks(self):
        """One ChecksumInfo (io_struct wire shape) per TP rank of every DP group."""
        eng = self.engine
        tp, pp = eng.tp_size, eng.pp_size
        attn_dp = eng._attn_dp()
        dp_groups = 1 if attn_dp else eng.dp_size
        dp_size = int(eng.server_args.values.get("attn_dp_size") or 1) if attn_dp else 1
        target = self.digests
        draft = self.draft_digests
        out = []
        for d in range(dp_groups):
            for rank in range(tp * pp):
                tp_rank = rank % tp
                checksums = {}
                roles = [("target", target)] + ([("draft", draft)] if draft else [])
                infos = []
                for role, digests in roles:
                    for name, digest in digests.items():
                        key = name if role == "target" else "%s.%s" % (role, name)
                        h = hashlib.blake2b(("%s:%d:%d" % (digest, tp_rank, tp)).encode(), digest_size=8)
                        checksums[key] = h.hexdigest()
                    infos.append({"role": role, "tp_rank": tp_rank, "tp_size": tp,
                                  "dp_rank": (tp_rank * dp_size // tp) if attn_dp else d,
                                  "dp_size": dp_size, "pp_rank": rank // tp, "pp_size": pp,
                                  "rank": rank, "size": tp * pp})
                out.append({"checksums": checksums, "per_gpu_checksum": overall_checksum(checksums),
                            "parallelism_info": infos})
        return out

    def check(self, body):
        """``/weights_checker``: (status, body)."""
        action = (body or {}).get("action", "checksum")
        ranks = None
        if action == "checksum":
            ranks = self.ranks()
        elif action == "snapshot":
            self.snapshot = self.ranks()
        elif action == "compare":
            if self.snapshot is None:
                return 400, {"success": False, "message": ""}
            if self.snapshot != self.ranks():
                return 400, {"success": False, "message": "Weights differ from the snapshot."}
        else:
            return 400, {"success": False, "message": "Unsupported action=%r" % action}
        out = {"success": True, "message": " | ".join(["Success."] * self._dp_results())}
        if ranks is not None:
            out["ranks"] = ranks
            h = hashlib.sha256()
            for info in ranks:
                h.update(info["per_gpu_checksum"].encode())
            out["per_engine_checksum"] = h.hexdigest()
        return 200, out

    def _dp_results(self):
        eng = self.engine
        return 1 if eng._attn_dp() else max(1, eng.dp_size)

    # ------------------------------------------------------------ updates
    def update_from_disk(self, body):
        """``/update_weights_from_disk``: (status, body)."""
        eng, tm, sk = self.engine, self.engine.tokenizer_manager, self.engine.sk
        model_path = body["model_path"]
        load_format = body.get("load_format") or self.load_format
        logger.info("Start update_weights. Load format=%s", load_format)
        if body.get("abort_all_requests"):
            tm.abort_request(abort_all=True)
        tic = time.perf_counter()
        with tm.model_update_lock.writer():
            try:
                success, message = self._load(model_path, load_format)
                if success:
                    if body.get("flush_cache", True) and not tm.flush_cache():
                        success = False
                        message = ("Weights were updated, but the cache was not flushed because "
                                   "requests are still running or queued. Retract or finish them, "
                                   "then call /flush_cache.")
                    if not success:
                        logger.error(message)
            finally:
                self.last_load_s = time.perf_counter() - tic
        if success and body.get("weight_version") is not None:
            self.weight_version = str(body["weight_version"])
            tm.weight_version = self.weight_version
            message += " Weight version updated to %s." % body["weight_version"]
        return (200 if success else 400), {"success": success, "message": message, "num_paused_requests": 0}

    def _load(self, model_path, load_format):
        eng, sk = self.engine, self.engine.sk
        logger.info("Update engine weights online from disk begin. avail mem=%.2f GB", eng.free_gib())
        try:
            files = weight_files(model_path, load_format)
        except WeightsError as e:
            return False, "Failed to get weights iterator: %s." % e
        shapes, digests = self._load_digests(files)
        mismatch = self._shape_mismatch(shapes, _config(model_path))
        if mismatch:
            eng.crash_schedulers(mismatch)  # the server dies; this request is never answered
        oom = eng.stage_on_schedulers(sk.update_buffer_mib)
        if oom:
            return False, "Failed to update weights: %s.\nRolling back to original weights." % oom
        time.sleep(sk.update_weights_s)
        if shapes is not None and self.shapes is not None:
            # tensors the model has no parameter for are skipped; parameters the checkpoint lacks keep their weights
            digests = dict((name, digests.get(name, old)) for name, old in self.digests.items())
        else:
            self.shapes = shapes
        self.digests = digests
        self.model_path = model_path
        self.served_model_name = model_path
        self.load_format = load_format
        eng.tokenizer_manager.served_model_name = model_path
        logger.info("Update weights end.")
        return True, "Succeeded to update model weights."

    def _shape_mismatch(self, shapes, config):
        """The loader's error for a tensor whose shape is not its parameter's, or None."""
        if shapes is not None and self.shapes is not None:
            for name, shape in shapes.items():
                have = self.shapes.get(name)
                if have is not None and have != shape:
                    # the weight loader's param.data.copy_(loaded_weight), on the first parameter in module order
                    if len(have) == len(shape) and all(isinstance(d, int) for d in have + shape):
                        dim = [i for i, (a, b) in enumerate(zip(have, shape)) if a != b][-1]
                        return ("The size of tensor a (%d) must match the size of tensor b (%d) at non-singleton "
                                "dimension %d" % (have[dim], shape[dim], dim))
                    return "size mismatch for %s: the checkpoint has %s, the model %s" % (name, shape, have)
            return None
        for field in SHAPE_FIELDS:
            if field in config and field in self.config and config[field] != self.config[field]:
                return ("size mismatch: the checkpoint's %s is %s, the model's %s (config.json; the simulator "
                        "compares shapes there when the checkpoint has no safetensors headers)"
                        % (field, config[field], self.config[field]))
        return None

    def update_version(self, body):
        tm = self.engine.tokenizer_manager
        if body.get("abort_all_requests", True):
            tm.abort_request(abort_all=True)
        self.weight_version = str(body["new_version"])
        tm.weight_version = self.weight_version
        return 200, {"success": True, "message": "Weight version updated to %s" % body["new_version"],
                     "new_version": body["new_version"]}
