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
  - the checkpoint's ``config.json`` ``architectures[0]`` differs from the
    served model's (the real loader fails inside load_weights; the wording
    after "Failed to update weights: " is the simulator's);
  - CUDA OOM while staging.

* ``/weights_checker``: per-rank checksums derived from the checkpoint files'
  content (one entry per weight file and TP rank), ``per_gpu_checksum`` and
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


def _architecture(path):
    try:
        with open(os.path.join(path, "config.json")) as fh:
            archs = json.load(fh).get("architectures") or []
        return archs[0] if archs else None
    except (OSError, ValueError, AttributeError):
        return None


class WeightState:
    """The weights a server serves now; owned by the engine (main process)."""

    def __init__(self, engine):
        sa = engine.server_args
        self.engine = engine
        self.model_path = sa.model_path
        self.served_model_name = sa.served_model_name
        self.load_format = sa.values.get("load_format") or "auto"
        self.weight_version = getattr(sa, "weight_version", None) or sa.values.get("weight_version") or "default"
        self.architecture = (engine.model_config.get("architectures") or [None])[0]
        # digests are taken when weights load: what the GPU holds, even if the
        # files change or go away later (--delete-ckpt-after-loading)
        self.digests = self._digests(self._files_or_all(self.model_path))
        self.draft_path = sa.speculative_draft_model_path if engine.spec.enabled else None
        self.draft_digests = self._digests(self._files_or_all(self.draft_path)) if self.draft_path else {}
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
        new_arch = _architecture(model_path)
        if new_arch is not None and self.architecture is not None and new_arch != self.architecture:
            return False, ("Failed to update weights: the checkpoint at %s is %s, the loaded model is %s; "
                           "its tensors do not match the model's parameters.\nRolling back to original "
                           "weights." % (model_path, new_arch, self.architecture))
        oom = eng.stage_on_schedulers(sk.update_buffer_mib)
        if oom:
            return False, "Failed to update weights: %s.\nRolling back to original weights." % oom
        time.sleep(sk.update_weights_s)
        self.digests = self._digests(files)
        self.model_path = model_path
        self.served_model_name = model_path
        self.load_format = load_format
        eng.tokenizer_manager.served_model_name = model_path
        logger.info("Update weights end.")
        return True, "Succeeded to update model weights."

    def update_version(self, body):
        tm = self.engine.tokenizer_manager
        if body.get("abort_all_requests", True):
            tm.abort_request(abort_all=True)
        self.weight_version = str(body["new_version"])
        tm.weight_version = self.weight_version
        return 200, {"success": True, "message": "Weight version updated to %s" % body["new_version"],
                     "new_version": body["new_version"]}
