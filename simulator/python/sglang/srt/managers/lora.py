"""LoRA adapters of the fake server (SGLang 0.5.23 shapes).

* ``--lora-paths`` (``PATH``, ``NAME=PATH`` or JSON with lora_name/lora_path/
  pinned) loads adapters at launch, with ``LoRARef.deterministic_id`` ids;
  ``--enable-lora`` is implied by ``--lora-paths``.
* ``POST /load_lora_adapter`` (lora_name, lora_path, pinned) and
  ``POST /unload_lora_adapter`` (lora_name) answer ``LoRAUpdateOutput``:
  ``{"rid": null, "http_worker_ipc": null, "success", "error_message",
  "loaded_adapters": {name: path}}``, 200 or 400.
* Loaded adapters show in ``/v1/models`` (id = name, root = path, parent =
  the served model, max_model_len null).  ``/server_info`` keeps the launch
  ``lora_paths``, so adapters loaded at runtime show only in ``/v1/models``;
  they live in the process and vanish on restart.
* An adapter directory needs ``adapter_config.json`` (its ``r`` is checked
  against ``--max-lora-rank`` when that is set).
"""
from __future__ import annotations

import json
import logging
import os
import threading
import uuid
from collections import OrderedDict

logger = logging.getLogger("sglang.srt.managers.tokenizer_manager")


def deterministic_id(name, path):
    return uuid.uuid5(uuid.NAMESPACE_URL, "%s\0%s" % (name, path)).hex


class LoraRegistry:
    def __init__(self, server_args):
        values = server_args.values
        paths = values.get("lora_paths") or []
        enable = values.get("enable_lora")
        self.enabled = bool(enable) or (enable is None and bool(paths))
        self.max_rank = values.get("max_lora_rank")
        self.lock = threading.Lock()
        self.registry = OrderedDict()   # name -> {"lora_id", "lora_name", "lora_path", "pinned"}
        if self.enabled:
            for item in paths:
                if isinstance(item, dict):
                    name, path, pinned = item["lora_name"], item["lora_path"], bool(item.get("pinned", False))
                elif isinstance(item, str) and item.strip().startswith("{"):
                    obj = json.loads(item)
                    name, path, pinned = obj["lora_name"], obj["lora_path"], bool(obj.get("pinned", False))
                elif "=" in item:
                    name, path = item.split("=", 1)
                    pinned = False
                else:
                    name = path = item
                    pinned = False
                self.registry[name] = {"lora_id": deterministic_id(name, path), "lora_name": name,
                                       "lora_path": path, "pinned": pinned}

    def _loaded(self):
        return OrderedDict((n, r["lora_path"]) for n, r in self.registry.items())

    @staticmethod
    def output(success, error_message="", loaded_adapters=None):
        return {"rid": None, "http_worker_ipc": None, "success": success,
                "error_message": error_message, "loaded_adapters": loaded_adapters}

    def load(self, body):
        """(status, LoRAUpdateOutput dict)."""
        if not self.enabled:
            return 400, self.output(False, "LoRA is not enabled. Please set `--enable-lora` to enable LoRA.")
        name, path = body["lora_name"], body["lora_path"]
        pinned = bool(body.get("pinned", False))
        logger.info("Start load Lora adapter. Lora name=%s, path=%s", name, path)
        with self.lock:
            try:
                self._validate(name, path)
            except (OSError, ValueError) as e:
                return 400, self.output(False, str(e), dict(self._loaded()))
            self.registry[name] = {"lora_id": uuid.uuid4().hex, "lora_name": name, "lora_path": path,
                                   "pinned": pinned}
            return 200, self.output(True, "", dict(self._loaded()))

    def _validate(self, name, path):
        with open(os.path.join(path, "adapter_config.json")) as fh:
            config = json.load(fh)
        if name in self.registry:
            raise ValueError("Failed to load LoRA adapter %s because it is already loaded" % name)
        for ref in self.registry.values():
            if ref["lora_path"] == path:
                logger.warning("%s is already loaded with name: %s, but another copy is being loaded with name: %s",
                               path, ref["lora_name"], name)
        rank = config.get("r")
        if self.max_rank is not None and rank is not None and int(rank) > int(self.max_rank):
            raise ValueError(
                "LoRA adapter %s with rank %s is incompatible with the current LoRA memory pool configuration. "
                "Please ensure that the LoRA adapter's rank is within the configured `--max-lora-rank` and that "
                "the target modules are included in `--lora-target-modules`." % (name, rank))

    def unload(self, body):
        if not self.enabled:
            return 400, self.output(False, "LoRA is not enabled. Please set `--enable-lora` to enable LoRA.")
        name = body["lora_name"]
        logger.info("Start unload Lora adapter. Lora name=%s", name)
        with self.lock:
            if name not in self.registry:
                return 400, self.output(False, "LoRA with name %s does not exist. Loaded LoRAs: %r"
                                        % (name, OrderedDict(self.registry).keys()))
            del self.registry[name]
            return 200, self.output(True, "", dict(self._loaded()))

    def lookup(self, name):
        """LoRARegistry.acquire for a request's ``lora_path``; raises ValueError."""
        with self.lock:
            if name not in self.registry:
                raise ValueError("The following requested LoRA adapters are not loaded: %s\n"
                                 "Loaded adapters: %r." % (name, OrderedDict(self.registry).keys()))
            self.registry.move_to_end(name)

    def model_cards(self, parent, created):
        if not self.enabled:
            return []
        with self.lock:
            refs = list(self.registry.values())
        return [{"id": r["lora_name"], "object": "model", "created": created, "owned_by": "sglang",
                 "root": r["lora_path"], "parent": parent, "max_model_len": None} for r in refs]
