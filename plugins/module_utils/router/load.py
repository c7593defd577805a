# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The in-flight load of an SGLang server (``/v1/loads``, ``/metrics``, ``/get_load``), read while a removed worker
drains. Standard library only (target-side code)."""
from __future__ import annotations

import math
import re

from ansible_collections.gpufleet.sglang.plugins.module_utils.common.http import request
from ansible_collections.gpufleet.sglang.plugins.module_utils.router.worker_list import RouterError, _int

LOAD_SOURCES = ("/v1/loads", "/metrics", "/get_load")
METRIC_RE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
LABEL_RE = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')
DRAIN_METRICS = ("sglang:num_running_reqs", "sglang:num_queue_reqs")
# /v1/loads: extra in-flight queues beyond running + waiting (load_snapshot.py sections).
EXTRA_QUEUE_KEYS = (("queues", "grammar"),
                    ("disaggregation", "prefill_bootstrap_queue_reqs"),
                    ("disaggregation", "prefill_inflight_queue_reqs"),
                    ("disaggregation", "decode_prealloc_queue_reqs"),
                    ("disaggregation", "decode_transfer_queue_reqs"),
                    ("disaggregation", "decode_retracted_queue_reqs"))


def load_from_v1_loads(data):
    """In-flight requests from SGLang's ``/v1/loads`` JSON, summed over DP ranks.

    Counts ``num_running_reqs`` + ``num_waiting_reqs`` per rank, plus the
    grammar queue and the PD-disaggregation queues when those sections exist.
    Returns None when the answer has no usable ``loads`` list.
    """
    if isinstance(data, dict):
        loads = data.get("loads")
    elif isinstance(data, list):
        loads = data
    else:
        return None
    if not isinstance(loads, list) or not loads:
        return None
    total = 0
    seen = False
    for rank in loads:
        if not isinstance(rank, dict):
            continue
        running = _int(rank.get("num_running_reqs"))
        waiting = _int(rank.get("num_waiting_reqs"))
        if running is None and waiting is None:
            continue
        seen = True
        total += (running or 0) + (waiting or 0)
        for section, key in EXTRA_QUEUE_KEYS:
            sec = rank.get(section)
            if isinstance(sec, dict):
                total += _int(sec.get(key)) or 0
    return total if seen else None


def parse_metrics(text):
    """Prometheus text -> list of ``(name, labels_dict, float_value)``."""
    samples = []
    for line in (text or "").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = METRIC_RE.match(line)
        if not match:
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        labels = dict(LABEL_RE.findall(match.group(2) or ""))
        samples.append((match.group(1), labels, value))
    return samples


def load_from_metrics(text, names=DRAIN_METRICS):
    """In-flight requests from SGLang's Prometheus text: the sum of the
    ``sglang:num_running_reqs`` and ``sglang:num_queue_reqs`` gauges.

    Samples of tensor-parallel ranks other than 0 are skipped (every TP rank
    of one DP rank reports the same requests). Returns None when neither gauge
    is present.
    """
    total = 0.0
    seen = False
    for name, labels, value in parse_metrics(text):
        if name not in names or labels.get("tp_rank", "0") != "0" or not math.isfinite(value):
            continue
        seen = True
        total += value
    return int(round(total)) if seen else None


def load_from_get_load(data):
    """In-flight requests from the old ``/get_load`` answer (SGLang 0.4.10 to 0.5.10):
    a list (one per DP rank) of ``{"num_reqs", "num_waiting_reqs", ...}`` where
    ``num_reqs`` already counts the waiting ones."""
    items = data if isinstance(data, list) else [data] if isinstance(data, dict) else []
    total = 0
    seen = False
    for item in items:
        if not isinstance(item, dict):
            continue
        reqs = _int(item.get("num_reqs"))
        if reqs is None:
            running = _int(item.get("num_running_reqs"))
            waiting = _int(item.get("num_waiting_reqs"))
            if running is None and waiting is None:
                continue
            reqs = (running or 0) + (waiting or 0)
        seen = True
        total += reqs
    return total if seen else None


def read_load(base, api_key, timeout, source=None):
    """Read the server's in-flight load once: ``(load, source)``.

    Tries ``source`` only when given, else ``/v1/loads``, ``/metrics``,
    ``/get_load`` in that order. Raises ConnectionRefused when nothing
    listens, RouterError when no endpoint gives a usable answer.
    """
    sources = (source,) if source else LOAD_SOURCES
    tried = []
    for path in sources:
        status, dummy, data = request("GET", base + path, api_key=api_key, timeout=timeout)
        if status == 200:
            if path == "/v1/loads":
                load = load_from_v1_loads(data)
            elif path == "/metrics":
                load = load_from_metrics(data if isinstance(data, str) else "")
            else:
                load = load_from_get_load(data)
            if load is not None:
                return load, path
            tried.append("%s: 200 without load fields" % path)
        else:
            tried.append("%s: HTTP %s" % (path, status))
    hint = ""
    if any(": HTTP 401" in t or ": HTTP 403" in t for t in tried):
        hint = " Set worker_api_key to the server's --api-key."
    raise RouterError("cannot read the load of %s (%s).%s Start SGLang with --enable-metrics on versions without "
                      "/v1/loads, or set drain=false." % (base, "; ".join(tried), hint))
