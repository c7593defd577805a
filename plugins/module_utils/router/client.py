# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The router's worker-management routes: which API it speaks (the probe) and a thin client of them. Standard library
only (target-side code)."""
from __future__ import annotations

from urllib.parse import quote

from ansible_collections.gpufleet.sglang.plugins.module_utils.common.http import HTTPConnectionError, request
from ansible_collections.gpufleet.sglang.plugins.module_utils.router.worker_list import API_01, API_03, API_1, RouterError, describe, parse_workers


def detect_api_version(workers_probe, list_probe=None, loads_probe=None):
    """Decide the router API from probe answers.

    ``workers_probe`` is ``(status, data)`` of ``GET /workers``, ``list_probe``
    that of ``GET /list_workers`` (asked after a 404), ``loads_probe`` that of
    ``GET /get_loads`` (asked when the worker list is empty, so no entry tells
    smg 1.x, whose entries carry ``status``, from 0.3: smg 1.x answers
    ``/get_loads`` with ``"version": "smg-1..."``). Returns ``"1"``, ``"0.3"``,
    ``"0.1"``, or None when another probe is needed (``list_probe`` after a
    404, ``loads_probe`` for an empty list). Raises RouterError otherwise.
    """
    status, data = workers_probe
    if status in (401, 403):
        raise RouterError("the router rejected the request with HTTP %d; set api_key to the router's --api-key" % status)
    if status == 200 and isinstance(data, dict) and isinstance(data.get("workers"), list):
        items = [w for w in data["workers"] if isinstance(w, dict)]
        if any(isinstance(w.get("status"), str) for w in items):
            return API_1
        if items:
            return API_03
        if loads_probe is None:
            return None
        lstatus, ldata = loads_probe
        if lstatus == 200 and isinstance(ldata, dict) and str(ldata.get("version") or "").startswith("smg-1"):
            return API_1
        return API_03
    if status == 404:
        if list_probe is None:
            return None
        lstatus, ldata = list_probe
        if lstatus in (401, 403):
            raise RouterError("the router rejected the request with HTTP %d; set api_key to the router's --api-key" % lstatus)
        if lstatus == 200:
            return API_01
        raise RouterError("the router answered 404 on GET /workers and HTTP %s on GET /list_workers (%s); is this an "
                          "sglang-router or smg? Set api_version to skip the probe." % (lstatus, describe(ldata)))
    raise RouterError("GET /workers answered HTTP %s with %s; expected 200 with a 'workers' list (smg 1.x, sglang-router "
                      "0.3) or 404 (sglang-router 0.1). Set api_version to skip the probe." % (status, describe(data)))


class Router(object):
    """Thin client of the router's worker-management routes."""

    def __init__(self, base, api_key, request_timeout, api_version):
        self.base = base
        self.api_key = api_key
        self.request_timeout = request_timeout
        self.api_version = api_version

    def _call(self, method, path, body=None, timeout=None):
        try:
            status, dummy, data = request(method, self.base + path, body=body, api_key=self.api_key,
                                          timeout=timeout or self.request_timeout)
        except HTTPConnectionError as exc:
            raise RouterError("cannot reach the router: %s" % exc) from None
        if status in (401, 403):
            raise RouterError("%s %s: the router rejected the request with HTTP %d; set api_key to the router's --api-key"
                              % (method, path.split("?")[0], status))
        return status, data

    @property
    def restful(self):
        return self.api_version in (API_1, API_03)

    def detect(self):
        if self.api_version != "auto":
            return self.api_version
        probe = self._call("GET", "/workers")
        version = detect_api_version(probe)
        if version is None and probe[0] == 404:
            version = detect_api_version(probe, list_probe=self._call("GET", "/list_workers"))
        elif version is None:
            version = detect_api_version(probe, loads_probe=self._call("GET", "/get_loads"))
        self.api_version = version
        return version

    def list(self, timeout=None):
        path = "/workers" if self.restful else "/list_workers"
        status, data = self._call("GET", path, timeout=timeout)
        if status != 200:
            raise RouterError("GET %s answered HTTP %s: %s" % (path, status, describe(data)))
        try:
            return parse_workers(data, self.api_version)
        except ValueError as exc:
            raise RouterError("GET %s: %s" % (path, exc)) from None

    def job(self, worker_id, timeout=None):
        """The worker or job record behind ``/workers/{id}``: ``(status, data)``."""
        return self._call("GET", "/workers/%s" % quote(worker_id, safe=""), timeout=timeout)

    def add(self, url, worker_api_key, extra):
        """Register ``url``; returns the router's worker id (None on 0.1)."""
        if self.restful:
            body = dict(extra)
            body["url"] = url
            if worker_api_key:
                body["api_key"] = worker_api_key
            status, data = self._call("POST", "/workers", body=body)
            if status == 409:
                raise RouterError("POST /workers: the router already has an entry for %s (%s); it was listed neither "
                                  "as a member nor as draining a moment ago, so another client is changing it. Run the "
                                  "task again." % (url, describe(data)))
            if status not in (200, 201, 202):
                raise RouterError("POST /workers for %s answered HTTP %s: %s" % (url, status, describe(data)))
            return data.get("worker_id") if isinstance(data, dict) else None
        status, data = self._call("POST", "/add_worker?url=%s" % quote(url, safe=""))
        if status not in (200, 201, 202):
            raise RouterError("POST /add_worker for %s answered HTTP %s: %s" % (url, status, describe(data)))
        return None

    def remove(self, entry):
        """Ask the router to drop one listed entry; False when it was already gone."""
        if self.restful:
            if not entry.get("id"):
                raise RouterError("the router lists %s without an id; cannot remove it" % entry["url"])
            status, data = self._call("DELETE", "/workers/%s" % quote(str(entry["id"]), safe=""))
            what = "DELETE /workers/%s (%s)" % (entry["id"], entry["url"])
        else:
            status, data = self._call("POST", "/remove_worker?url=%s" % quote(entry["url"], safe=""))
            what = "POST /remove_worker for %s" % entry["url"]
        if status == 404:
            return False
        if status not in (200, 202, 204):
            raise RouterError("%s answered HTTP %s: %s" % (what, status, describe(data)))
        return True
