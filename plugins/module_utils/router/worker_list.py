# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A router's worker list: the router APIs' names, worker URLs, the list parsed, who is ready; and the error of a router
or worker answer that stops the module. Standard library only (target-side code)."""
from __future__ import annotations

import math
from urllib.parse import urlsplit, urlunsplit

API_1 = "1"
API_03 = "0.3"
API_01 = "0.1"
READY = "ready"
DRAINING = "draining"
# smg 1.x states in which the router no longer probes its way back quickly
# (not_ready, failed) or never will (an unhealthy 0.3 entry): re-registered.
STALE = ("not_ready", "failed")
DEFAULT_PORTS = {"http": 80, "https": 443}


class RouterError(Exception):
    """A router or worker answer that stops the module; ``msg`` is user-facing."""

    def __init__(self, msg, **extra):
        super().__init__(msg)
        self.msg = msg
        self.extra = extra


# --------------------------------------------------------------------------
# URLs and worker lists
# --------------------------------------------------------------------------

def normalize_url(url):
    """Canonical form of a worker or router URL, for comparison and registration.

    Lower-cases scheme and host, adds ``http://`` when no scheme is given,
    drops the scheme's default port, a trailing slash, the query and fragment.
    Raises ValueError for a URL without a host.
    """
    text = (url or "").strip()
    if not text:
        raise ValueError("empty URL")
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise ValueError("URL %r: scheme must be http or https" % url)
    host = parts.hostname
    if not host:
        raise ValueError("URL %r has no host" % url)
    try:
        port = parts.port
    except ValueError:
        raise ValueError("URL %r has an invalid port" % url) from None
    host = host.lower()
    if ":" in host:
        host = "[%s]" % host
    netloc = host if port is None or port == DEFAULT_PORTS[scheme] else "%s:%d" % (host, port)
    path = parts.path.rstrip("/")
    return urlunsplit((scheme, netloc, path, "", ""))


def same_url(a, b):
    try:
        return normalize_url(a) == normalize_url(b)
    except ValueError:
        return False


def _int(value):
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return int(round(value))
    return None


def _str(value):
    return value if isinstance(value, str) and value else None


def parse_workers(data, api_version):
    """Router answer -> list of ``{id, url, status, is_healthy, load, model_id, worker_type}``.

    ``status`` is the smg 1.x state as listed; on 0.3 it is derived from
    ``is_healthy`` (``ready`` or ``not_ready``); on 0.1 it is None.
    Raises ValueError when the shape is not recognised.
    """
    if api_version in (API_1, API_03):
        if not isinstance(data, dict) or not isinstance(data.get("workers"), list):
            raise ValueError("expected a JSON object with a 'workers' list, got %s" % describe(data))
        items = data["workers"]
    elif isinstance(data, dict):
        items = None
        for key in ("urls", "workers", "worker_urls"):
            if isinstance(data.get(key), list):
                items = data[key]
                break
        if items is None:
            raise ValueError("expected a JSON object with a 'urls' list, got %s" % describe(data))
    elif isinstance(data, list):
        items = data
    else:
        raise ValueError("expected a JSON list of URLs, got %s" % describe(data))
    workers = []
    for item in items:
        if isinstance(item, str):
            item = {"url": item}
        if not isinstance(item, dict) or not isinstance(item.get("url"), str):
            continue
        healthy = item.get("is_healthy")
        healthy = healthy if isinstance(healthy, bool) else None
        if api_version == API_1:
            status = (_str(item.get("status")) or "").lower() or None
        elif api_version == API_03 and healthy is not None:
            status = READY if healthy else "not_ready"
        else:
            status = None
        workers.append({
            "id": _str(item.get("id")),
            "url": item["url"],
            "status": status,
            "is_healthy": healthy,
            "load": _int(item.get("load")),
            "model_id": _str(item.get("model_id")),
            "worker_type": (_str(item.get("worker_type")) or "regular").lower(),
        })
    return workers


def find_workers(workers, url):
    """Entries of ``workers`` whose URL normalises to the same URL as ``url``."""
    return [w for w in workers if same_url(w.get("url"), url)]


def is_ready(entry, api_version):
    """Whether the router routes to ``entry`` (0.1 reports no health: listed counts)."""
    if api_version == API_01:
        return True
    return entry.get("status") == READY


def ready_peers(workers, url, entry, api_version):
    """Ready entries, other than ``url``'s, that serve the same model and role as ``entry``."""
    peers = []
    for w in workers:
        if same_url(w.get("url"), url) or not is_ready(w, api_version):
            continue
        if api_version != API_01 and (w.get("model_id"), w.get("worker_type")) != (entry.get("model_id"), entry.get("worker_type")):
            continue
        peers.append(w)
    return peers


def describe(data):
    text = str(data) if isinstance(data, (dict, list)) else repr(data)
    return text if len(text) <= 300 else text[:300] + "..."
