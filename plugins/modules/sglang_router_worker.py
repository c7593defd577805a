# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_router_worker
short_description: Manage an SGLang server's membership in sglang-router, and drain it before a restart
version_added: 0.1.0
description:
  - Adds a worker (an SGLang server) to an sglang-router (SGLang Model Gateway, C(smg)) or removes it,
    idempotently, and optionally waits until the removed worker has no request left in flight.
  - With O(state=present) the worker is registered when the router does not list it yet. On the
    router 0.3 API the registration is an asynchronous job; the module waits until the router lists
    the worker, and with O(wait_healthy=true) until the router reports it healthy, within O(timeout).
    A failed registration job fails the task with the router's message.
  - With O(state=absent) every router entry whose URL matches O(url) (after normalisation, see notes)
    is removed, and the module waits until the router no longer lists it. With O(drain=true) it then
    polls the worker's own load (see O(drain_url)) until no request is running or queued.
  - With O(state=drained) the router is not contacted at all; the module only waits until the worker
    at O(drain_url) (or O(url)) has no request in flight. Use it to run the drain check on the GPU node
    after an O(state=absent) task ran on the controller.
  - "Why the order matters: SGLang's own SIGTERM drain keeps accepting new C(/generate) requests until
    the process exits, and the router has no drain API. A safe restart therefore removes the worker from
    the router first, waits until its load reaches 0, and only then signals the server."
options:
  router_url:
    description:
      - Base URL of the router, for example V(http://router.example:30000).
      - Required unless O(state=drained).
    type: str
    aliases: [router]
  url:
    description:
      - The worker's base URL B(as the router uses it), for example V(http://10.0.0.12:30000).
      - It is normalised before comparison and registration (scheme and host lower-cased, default
        port and trailing slash removed, V(http://) added when no scheme is given).
    type: str
    required: true
    aliases: [worker_url]
  state:
    description:
      - V(present) makes the worker a member of the router, V(absent) removes it, V(drained) only waits
        until the worker has no request in flight (the router is not contacted).
    type: str
    choices: [present, absent, drained]
    default: present
  api_version:
    description:
      - Worker-management API of the router.
      - V(0.3) is the RESTful API of sglang-router 0.3 (C(GET/POST /workers), C(DELETE /workers/{id})).
      - V(0.1) is the query-string API of sglang-router 0.1 (C(/list_workers), C(/add_worker?url=),
        C(/remove_worker?url=)).
      - V(auto) probes C(GET /workers) and falls back to C(GET /list_workers) when the router answers 404.
    type: str
    choices: [auto, '0.3', '0.1']
    default: auto
  api_key:
    description:
      - "The router's own key (C(--api-key) of the router), sent as C(Authorization: Bearer)."
      - Never returned or logged.
    type: str
  worker_api_key:
    description:
      - The worker's API key (C(--api-key) of the SGLang server).
      - On the 0.3 API it is sent in the registration body's C(api_key), because workers added at
        runtime do not inherit the router's key; the router then uses it for health checks and requests.
      - "It is also sent as C(Authorization: Bearer) when the drain check reads C(/v1/loads)."
      - The 0.1 API has no field for it; it is then used for the drain check only, with a warning.
      - Never returned or logged.
    type: str
  worker_config:
    description:
      - Extra fields of the 0.3 registration body (C(WorkerConfigRequest)), for example C(model_id),
        C(priority), C(labels) or C(worker_type). Ignored on the 0.1 API.
      - C(url) and C(api_key) are not allowed here; use O(url) and O(worker_api_key).
    type: dict
    default: {}
  wait_healthy:
    description:
      - With O(state=present), wait until the router reports the worker healthy (C(is_healthy) on the
        0.3 API). The 0.1 API reports no health; there the module waits for the worker to be listed.
    type: bool
    default: true
  timeout:
    description:
      - Seconds to wait for the router to list the worker (and report it healthy), or to stop listing it.
    type: float
    default: 120
  drain:
    description:
      - With O(state=absent), wait after the removal until the worker has no request running or queued.
      - The load is read from the worker's C(/v1/loads) (SGLang 0.5.10 and later; the sum of
        C(num_running_reqs) and C(num_waiting_reqs), plus grammar and disaggregation queues, over all DP
        ranks), else from C(/metrics) (C(sglang:num_running_reqs) + C(sglang:num_queue_reqs); needs
        C(--enable-metrics)), else from C(/get_load) (SGLang 0.4.10 to 0.5.10).
      - A worker that refuses connections has nothing in flight; the drain then ends at once with a warning.
    type: bool
    default: false
  drain_url:
    description:
      - Where the drain check reads the worker's load, when the module runs somewhere that reaches the
        worker under another address than the router does (for example V(http://127.0.0.1:30000) on the
        node itself). Defaults to O(url).
    type: str
  drain_timeout:
    description:
      - Seconds to wait for the load to reach 0. The task fails when it does not.
    type: float
    default: 300
  drain_settle:
    description:
      - Seconds for which the load must stay 0 (over consecutive polls) before the worker counts as
        drained. Covers requests the router had already sent that are still being tokenised.
    type: float
    default: 1.0
  poll_interval:
    description:
      - Seconds between two polls of the router or the worker.
    type: float
    default: 0.5
  request_timeout:
    description:
      - Seconds for one HTTP request; clamped to the time left.
    type: float
    default: 10
author:
  - gpufleet maintainers (@gpufleet)
extends_documentation_fragment:
  - action_common_attributes
attributes:
  check_mode:
    support: full
    details:
      - The router is read to find out whether the worker would be added or removed; nothing is sent
        that changes it. The drain wait is skipped; O(state=drained) reads the load once and does not wait.
  diff_mode:
    support: full
    details: The diff lists the worker URLs the router serves, before and after.
  idempotent:
    description: Running the task twice in a row with the same arguments reports no change the second time.
    support: full
  platform:
    platforms: posix
notes:
  - "sglang-router 0.3.2, as observed against the real C(smg) binary: C(POST /workers) with a JSON body
    (C(url), optional C(api_key), C(model_id), C(priority), C(labels), ...) answers 202 with
    C({\"status\": \"accepted\", \"worker_id\": <uuid>, \"location\": \"/workers/<uuid>\"}) and runs an
    AddWorker job (health check, metadata discovery through the worker's C(/server_info) and
    C(/model_info), registration, activation as healthy). Until the job ends the worker is B(not) in
    C(GET /workers), but C(GET /workers/<uuid>) shows C(job_status) (C(processing), C(failed) with a
    message). A failed health check fails the job only after C(--worker-startup-timeout-secs)."
  - "C(GET /workers) answers C({\"workers\": [{\"id\", \"url\", \"model_id\", \"priority\", \"cost\",
    \"worker_type\", \"is_healthy\", \"load\", \"connection_mode\", \"metadata\", ...}], \"total\", \"stats\"}).
    C(load) is the router's own count of requests in flight to that worker."
  - "C(DELETE /workers/<uuid>) answers 202 and queues the removal; the worker disappears from
    C(GET /workers) within milliseconds. A URL instead of the UUID is rejected with 400, an unknown
    UUID with 404 (C(WORKER_NOT_FOUND)). The removal does not wait for requests in flight."
  - "The router stores the URL exactly as registered: V(http://h:1/) and V(http://h:1) are two different
    workers to it. This module compares normalised URLs, registers the normalised form, and removes every
    entry that matches. A second C(POST) of a URL already registered (or pending) returns the same UUID
    and the job fails with \"Worker ... already exists\"."
  - "With C(--api-key), the worker-management routes answer 401 without C(Authorization: Bearer <key>).
    C(/list_workers), C(/add_worker) and C(/remove_worker) answer 404 on 0.3.2."
  - "A worker added without its key (O(worker_api_key)) is still reported healthy by smg 0.3.2, because
    SGLang serves C(/health) without a key; every request routed to it then fails with 401. Before registering,
    the module therefore reads the worker's C(/model_info) with the key the router will use, and fails on 401 or 403."
  - "The 0.1 API (sglang-router 0.1.9: C(GET /list_workers), C(POST /add_worker?url=), C(POST /remove_worker?url=))
    is implemented from the route table of its binary and was not run against a real 0.1 router."
seealso:
  - module: gpufleet.sglang.sglang_launch
  - name: sglang-router worker API
    description: The Model Gateway's worker management routes.
    link: https://github.com/sgl-project/sglang/tree/main/sgl-model-gateway
"""

EXAMPLES = r"""
- name: Take the worker out of the router and wait until its requests are done
  gpufleet.sglang.sglang_router_worker:
    router_url: http://router.example:30000
    api_key: "{{ sglang_router_api_key }}"
    url: http://10.0.0.12:30000
    state: absent
    drain: true
    drain_timeout: 300

- name: Remove from the router on the controller, then drain-check on the node itself
  block:
    - name: Remove the worker from the router
      gpufleet.sglang.sglang_router_worker:
        router_url: http://router.example:30000
        url: http://10.0.0.12:30000
        state: absent
      delegate_to: localhost

    - name: Wait until the worker has no request in flight
      gpufleet.sglang.sglang_router_worker:
        url: http://127.0.0.1:30000
        worker_api_key: "{{ sglang_server_api_key }}"
        state: drained
        drain_timeout: 300

- name: Put the new server back and wait until the router reports it healthy
  gpufleet.sglang.sglang_router_worker:
    router_url: http://router.example:30000
    api_key: "{{ sglang_router_api_key }}"
    url: http://10.0.0.12:30000
    worker_api_key: "{{ sglang_server_api_key }}"
    state: present
    timeout: 120
"""

RETURN = r"""
api_version:
  description: The router API that was used. V(null) with O(state=drained).
  returned: always
  type: str
  sample: "0.3"
url:
  description: The normalised worker URL.
  returned: always
  type: str
  sample: http://10.0.0.12:30000
worker:
  description:
    - The router's record of the worker. With O(state=present), as listed at the end; with O(state=absent),
      as listed before the removal. V(null) when the router did not list it.
  returned: unless O(state=drained)
  type: dict
  contains:
    id:
      description: The router's worker id (a UUID on the 0.3 API, V(null) on 0.1).
      type: str
      sample: b44bf9b1-2f11-4996-8a67-36b73a70e901
    url:
      description: The URL exactly as the router lists it.
      type: str
      sample: http://10.0.0.12:30000
    is_healthy:
      description: The router's health verdict; V(null) on the 0.1 API.
      type: bool
      sample: true
    load:
      description: The router's count of requests in flight to this worker; V(null) on the 0.1 API.
      type: int
      sample: 0
workers:
  description: URLs of all workers the router lists at the end.
  returned: unless O(state=drained)
  type: list
  elements: str
  sample: [http://10.0.0.11:30000, http://10.0.0.13:30000]
removed:
  description: Router entries that were (or in check mode would be) removed.
  returned: when O(state=absent)
  type: list
  elements: dict
drained_s:
  description: Seconds spent waiting for the worker's load to reach 0. V(null) when no drain ran.
  returned: always
  type: float
  sample: 3.2
load:
  description: The worker's last measured in-flight load (running plus queued requests); V(null) when not measured.
  returned: always
  type: int
  sample: 0
initial_load:
  description: The worker's in-flight load at the first poll of the drain; V(null) when not measured.
  returned: always
  type: int
  sample: 3
load_source:
  description: >-
    Where the load was read: V(/v1/loads), V(/metrics), V(/get_load), or V(unreachable) when the worker
    refused connections. V(null) when not measured.
  returned: always
  type: str
  sample: /v1/loads
elapsed:
  description: Seconds the module ran.
  returned: always
  type: float
  sample: 4.1
"""

import math
import re
import time
from urllib.parse import quote, urlsplit, urlunsplit

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.sglang.plugins.module_utils.http import (
    ConnectionRefused,
    HTTPConnectionError,
    request,
)

API_03 = "0.3"
API_01 = "0.1"
DEFAULT_PORTS = {"http": 80, "https": 443}
LOAD_SOURCES = ("/v1/loads", "/metrics", "/get_load")
METRIC_RE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
LABEL_RE = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')
DRAIN_METRICS = ("sglang:num_running_reqs", "sglang:num_queue_reqs")
# /v1/loads: extra in-flight queues beyond running + waiting (load_snapshot.py sections).
EXTRA_QUEUE_KEYS = (("queues", "grammar"),
                    ("disaggregation", "prefill_bootstrap_queue_reqs"),
                    ("disaggregation", "prefill_inflight_queue_reqs"),
                    ("disaggregation", "decode_prealloc_queue_reqs"),
                    ("disaggregation", "decode_transfer_queue_reqs"))


class RouterError(Exception):
    """A router or worker answer that stops the module; ``msg`` is user-facing."""

    def __init__(self, msg, **extra):
        super().__init__(msg)
        self.msg = msg
        self.extra = extra


# --------------------------------------------------------------------------
# Pure helpers (unit-tested)
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


def parse_workers(data, api_version):
    """Router answer -> list of ``{id, url, is_healthy, load}``.

    0.3: ``{"workers": [{"id", "url", "is_healthy", "load", ...}], ...}``.
    0.1: ``{"urls": [...]}`` or a bare list of URLs (or of dicts with ``url``).
    Raises ValueError when the shape is not recognised.
    """
    if api_version == API_03:
        if not isinstance(data, dict) or not isinstance(data.get("workers"), list):
            raise ValueError("expected a JSON object with a 'workers' list, got %s" % _describe(data))
        items = data["workers"]
    else:
        if isinstance(data, dict):
            items = None
            for key in ("urls", "workers", "worker_urls"):
                if isinstance(data.get(key), list):
                    items = data[key]
                    break
            if items is None:
                raise ValueError("expected a JSON object with a 'urls' list, got %s" % _describe(data))
        elif isinstance(data, list):
            items = data
        else:
            raise ValueError("expected a JSON list of URLs, got %s" % _describe(data))
    workers = []
    for item in items:
        if isinstance(item, str):
            workers.append({"id": None, "url": item, "is_healthy": None, "load": None})
        elif isinstance(item, dict) and isinstance(item.get("url"), str):
            load = item.get("load")
            healthy = item.get("is_healthy")
            workers.append({
                "id": item.get("id"),
                "url": item["url"],
                "is_healthy": healthy if isinstance(healthy, bool) else None,
                "load": load if isinstance(load, int) and not isinstance(load, bool) else None,
            })
    return workers


def find_workers(workers, url):
    """Entries of ``workers`` whose URL normalises to the same URL as ``url``."""
    return [w for w in workers if same_url(w.get("url"), url)]


def detect_api_version(workers_probe, list_probe=None):
    """Decide the router API from probe answers.

    ``workers_probe`` is ``(status, data)`` of ``GET /workers``; ``list_probe``
    that of ``GET /list_workers`` (only needed when the first was a 404).
    Returns ``"0.3"``, ``"0.1"``, or ``None`` when ``list_probe`` is needed.
    Raises RouterError with an actionable message otherwise.
    """
    status, data = workers_probe
    if status in (401, 403):
        raise RouterError("the router rejected the request with HTTP %d; set api_key to the router's --api-key" % status)
    if status == 200 and isinstance(data, dict) and isinstance(data.get("workers"), list):
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
                          "sglang-router? Set api_version to skip the probe." % (lstatus, _describe(ldata)))
    raise RouterError("GET /workers answered HTTP %s with %s; expected 200 with a 'workers' list (router 0.3) or 404 "
                      "(router 0.1). Set api_version to skip the probe." % (status, _describe(data)))


def _int(value):
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return int(round(value))
    return None


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
        m = METRIC_RE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        labels = dict(LABEL_RE.findall(m.group(2) or ""))
        samples.append((m.group(1), labels, value))
    return samples


def load_from_metrics(text, names=DRAIN_METRICS):
    """In-flight requests from SGLang's Prometheus text: the sum of the
    ``sglang:num_running_reqs`` and ``sglang:num_queue_reqs`` gauges.

    Samples of tensor-parallel ranks other than 0 are skipped (every TP rank
    of one DP rank reports the same requests). Returns None when neither gauge
    is present (for example a server without ``--enable-metrics`` behind a
    proxy that answers 200).
    """
    total = 0.0
    seen = False
    for name, labels, value in parse_metrics(text):
        if name not in names:
            continue
        if labels.get("tp_rank", "0") != "0":
            continue
        if not math.isfinite(value):
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


def _describe(data):
    if isinstance(data, (dict, list)):
        text = str(data)
    else:
        text = repr(data)
    return text if len(text) <= 300 else text[:300] + "..."


# --------------------------------------------------------------------------
# Router and worker I/O
# --------------------------------------------------------------------------

class Deadline(object):
    def __init__(self, seconds):
        self.start = time.monotonic()
        self.end = self.start + max(float(seconds), 0.0)

    def left(self):
        return self.end - time.monotonic()

    def expired(self):
        return self.left() <= 0

    def clamp(self, value):
        return max(min(value, self.left()), 0.05)

    def elapsed(self):
        return round(time.monotonic() - self.start, 3)


class Router(object):
    """Thin client of the router's worker-management routes."""

    def __init__(self, base, api_key, request_timeout, api_version):
        self.base = base
        self.api_key = api_key
        self.request_timeout = request_timeout
        self.api_version = api_version

    def _call(self, method, path, body=None, timeout=None, ok=(200,)):
        url = self.base + path
        try:
            status, dummy, data = request(method, url, body=body, api_key=self.api_key,
                                          timeout=timeout or self.request_timeout)
        except HTTPConnectionError as exc:
            raise RouterError("cannot reach the router: %s" % exc) from None
        if status in (401, 403):
            raise RouterError("%s %s: the router rejected the request with HTTP %d; set api_key to the router's --api-key"
                              % (method, path.split("?")[0], status))
        return status, data

    def detect(self):
        if self.api_version != "auto":
            return self.api_version
        status, data = self._call("GET", "/workers")
        version = detect_api_version((status, data))
        if version is None:
            lstatus, ldata = self._call("GET", "/list_workers")
            version = detect_api_version((status, data), (lstatus, ldata))
        self.api_version = version
        return version

    def list(self, timeout=None):
        path = "/workers" if self.api_version == API_03 else "/list_workers"
        status, data = self._call("GET", path, timeout=timeout)
        if status != 200:
            raise RouterError("GET %s answered HTTP %s: %s" % (path, status, _describe(data)))
        try:
            return parse_workers(data, self.api_version)
        except ValueError as exc:
            raise RouterError("GET %s: %s" % (path, exc)) from None

    def job(self, worker_id, timeout=None):
        """0.3: the worker or job record behind ``/workers/{id}``; None on 404."""
        status, data = self._call("GET", "/workers/%s" % quote(worker_id, safe=""), timeout=timeout)
        if status == 200 and isinstance(data, dict):
            return data
        return None

    def add(self, url, worker_api_key, extra):
        if self.api_version == API_03:
            body = dict(extra)
            body["url"] = url
            if worker_api_key:
                body["api_key"] = worker_api_key
            status, data = self._call("POST", "/workers", body=body)
            if status not in (200, 201, 202):
                raise RouterError("POST /workers for %s answered HTTP %s: %s" % (url, status, _describe(data)))
            return data.get("worker_id") if isinstance(data, dict) else None
        status, data = self._call("POST", "/add_worker?url=%s" % quote(url, safe=""))
        if status not in (200, 201, 202):
            raise RouterError("POST /add_worker for %s answered HTTP %s: %s" % (url, status, _describe(data)))
        return None

    def remove(self, entry):
        """Ask the router to drop one listed entry; False when it was already gone."""
        if self.api_version == API_03:
            if not entry.get("id"):
                raise RouterError("the router lists %s without an id; cannot remove it" % entry["url"])
            status, data = self._call("DELETE", "/workers/%s" % quote(str(entry["id"]), safe=""))
            if status == 404:
                return False
            if status not in (200, 202, 204):
                raise RouterError("DELETE /workers/%s (%s) answered HTTP %s: %s" % (entry["id"], entry["url"], status, _describe(data)))
            return True
        status, data = self._call("POST", "/remove_worker?url=%s" % quote(entry["url"], safe=""))
        if status == 404:
            return False
        if status not in (200, 202, 204):
            raise RouterError("POST /remove_worker for %s answered HTTP %s: %s" % (entry["url"], status, _describe(data)))
        return True


def read_load(base, api_key, timeout, source=None):
    """Read the worker's in-flight load once.

    Returns ``(load, source)``. Tries ``source`` only when given, else
    ``/v1/loads``, ``/metrics``, ``/get_load`` in that order. Raises
    ConnectionRefused when nothing listens, RouterError when no endpoint
    gives a usable answer.
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


# --------------------------------------------------------------------------
# The module
# --------------------------------------------------------------------------

class RouterWorker(object):
    def __init__(self, module):
        self.module = module
        p = module.params
        self.p = p
        self.started = time.monotonic()
        self.result = {"changed": False, "api_version": None, "drained_s": None, "load": None, "load_source": None,
                       "initial_load": None}
        try:
            self.url = normalize_url(p["url"])
        except ValueError as exc:
            self.fail("url: %s" % exc)
        self.result["url"] = self.url
        drain_url = p["drain_url"] or p["url"]
        try:
            self.drain_base = normalize_url(drain_url)
        except ValueError as exc:
            self.fail("drain_url: %s" % exc)
        for key in ("url", "api_key"):
            if key in p["worker_config"]:
                self.fail("worker_config must not contain %r; use the %s option" % (key, "url" if key == "url" else "worker_api_key"))
        for key in ("timeout", "drain_timeout", "poll_interval", "request_timeout", "drain_settle"):
            if p[key] < 0:
                self.fail("%s must not be negative, got %s" % (key, p[key]))
        self.router = None
        if p["state"] != "drained":
            try:
                base = normalize_url(p["router_url"])
            except ValueError as exc:
                self.fail("router_url: %s" % exc)
            self.router = Router(base, p["api_key"], p["request_timeout"] or 10, p["api_version"])

    def fail(self, msg, **extra):
        self.result.update(extra)
        self.result["elapsed"] = round(time.monotonic() - self.started, 3)
        self.module.fail_json(msg=msg, **self.result)

    def sleep(self, deadline):
        time.sleep(min(self.p["poll_interval"], max(deadline.left(), 0)))

    # ---- present ---------------------------------------------------------

    def present(self):
        router = self.router
        workers = router.list()
        before = [w["url"] for w in workers]
        found = find_workers(workers, self.url)
        entry = found[0] if found else None
        if entry is None:
            self.result["changed"] = True
            self.check_worker_auth()
            if self.module.check_mode:
                return workers, before, before + [self.url], None
            job_id = router.add(self.url, self.p["worker_api_key"], self.p["worker_config"])
        else:
            job_id = None
            if not self.p["wait_healthy"] or entry["is_healthy"] is not False or self.module.check_mode:
                return workers, before, before, entry
        entry, workers = self.wait_member(job_id)
        return workers, before, [w["url"] for w in workers], entry

    def check_worker_auth(self):
        """Fail before registering a worker that would reject the router's requests.

        The router's health check uses /health, which SGLang exempts from auth, so a
        worker registered without its key is reported healthy while every request
        through the router fails with 401. Probe /model_info (or /get_model_info)
        with the key the router will use. Only a definite 401/403 fails; when this
        host cannot reach the worker URL, the router's own wait decides.
        """
        key = self.p["worker_api_key"]
        for path in ("/model_info", "/get_model_info"):
            try:
                status, dummy, dummy2 = request("GET", self.url + path, api_key=key, timeout=min(self.p["request_timeout"] or 10, 5))
            except HTTPConnectionError:
                return
            if status in (401, 403):
                if key:
                    self.fail("%s rejects worker_api_key (HTTP %d on %s); the router would fail every request to it. "
                              "Set worker_api_key to the server's --api-key." % (self.url, status, path))
                self.fail("%s requires an API key (HTTP %d on %s) and worker_api_key is not set; the router would report it "
                          "healthy (/health needs no key) but every request through the router would fail with 401."
                          % (self.url, status, path))
            if status != 404:
                return

    def wait_member(self, job_id):
        """Poll until the router lists the worker (healthy, with wait_healthy)."""
        router = self.router
        deadline = Deadline(self.p["timeout"])
        last = "not listed yet"
        while True:
            workers = router.list(timeout=deadline.clamp(router.request_timeout))
            found = find_workers(workers, self.url)
            if found:
                entry = found[0]
                if not self.p["wait_healthy"] or entry["is_healthy"] is not False:
                    return entry, workers
                last = "listed, but the router reports it unhealthy (load %s)" % entry["load"]
            elif job_id and router.api_version == API_03:
                job = router.job(job_id, timeout=deadline.clamp(router.request_timeout)) or {}
                status = (job.get("job_status") or {}) if isinstance(job.get("job_status"), dict) else {}
                if status.get("status") == "failed":
                    self.fail("the router could not add %s: %s" % (self.url, status.get("message") or "the AddWorker job failed"),
                              workers=[w["url"] for w in workers])
                if status.get("status"):
                    last = "AddWorker job %s" % status["status"]
            if deadline.expired():
                break
            self.sleep(deadline)
        self.fail("%s is not %s in the router %s after %.0f s (%s). Check that the router reaches the worker under "
                  "this URL, and the router's --worker-startup-timeout-secs and health-check settings."
                  % (self.url, "healthy" if self.p["wait_healthy"] else "listed", router.base, self.p["timeout"], last),
                  workers=[w["url"] for w in workers])

    # ---- absent ----------------------------------------------------------

    def absent(self):
        router = self.router
        workers = router.list()
        before = [w["url"] for w in workers]
        found = find_workers(workers, self.url)
        self.result["removed"] = found
        if not found:
            return workers, before, before, None
        self.result["changed"] = True
        after_planned = [u for u in before if not same_url(u, self.url)]
        if self.module.check_mode:
            return workers, before, after_planned, found[0]
        removed_any = False
        for entry in found:
            removed_any = router.remove(entry) or removed_any
        if not removed_any:
            # Someone else removed it between our GET and our DELETE.
            self.result["changed"] = False
            self.result["removed"] = []
        deadline = Deadline(self.p["timeout"])
        while True:
            workers = router.list(timeout=deadline.clamp(router.request_timeout))
            still = find_workers(workers, self.url)
            if not still:
                break
            if deadline.expired():
                self.fail("the router %s still lists %s %.0f s after the removal was requested"
                          % (router.base, ", ".join(w["url"] for w in still), self.p["timeout"]),
                          workers=[w["url"] for w in workers])
            self.sleep(deadline)
        return workers, before, [w["url"] for w in workers], found[0]

    # ---- drain -----------------------------------------------------------

    def drain(self):
        """Wait until the worker's own load is 0 for drain_settle seconds."""
        deadline = Deadline(self.p["drain_timeout"])
        api_key = self.p["worker_api_key"]
        source = None
        zero_since = None
        load = None
        while True:
            try:
                load, source = read_load(self.drain_base, api_key, deadline.clamp(self.p["request_timeout"] or 10), source)
            except ConnectionRefused:
                self.module.warn("%s refuses connections, so nothing is in flight there; treating it as drained" % self.drain_base)
                self.result.update(load=None, load_source="unreachable", drained_s=deadline.elapsed())
                return
            except HTTPConnectionError as exc:
                if deadline.expired():
                    self.fail("cannot read the load of %s: %s" % (self.drain_base, exc), drained_s=None)
                self.sleep(deadline)
                continue
            except RouterError as exc:
                self.fail(exc.msg, drained_s=None)
            self.result.update(load=load, load_source=source)
            if self.result["initial_load"] is None:
                self.result["initial_load"] = load
            now = time.monotonic()
            if load == 0:
                if zero_since is None:
                    zero_since = now
                if now - zero_since >= self.p["drain_settle"]:
                    self.result["drained_s"] = deadline.elapsed()
                    return
            else:
                zero_since = None
            if deadline.expired():
                break
            self.sleep(deadline)
        self.fail("%s still has %s request(s) in flight (%s) after %.0f s; the server was not stopped. Raise drain_timeout, "
                  "or find out what keeps it busy." % (self.drain_base, load, source, self.p["drain_timeout"]),
                  drained_s=None)

    def check_load_once(self):
        try:
            load, source = read_load(self.drain_base, self.p["worker_api_key"], self.p["request_timeout"] or 10)
        except ConnectionRefused:
            self.result.update(load=None, load_source="unreachable")
            return
        except HTTPConnectionError as exc:
            self.fail("cannot read the load of %s: %s" % (self.drain_base, exc))
        except RouterError as exc:
            self.fail(exc.msg)
        self.result.update(load=load, load_source=source)

    # ---- run -------------------------------------------------------------

    def run(self):
        p = self.p
        try:
            if p["state"] == "drained":
                if self.module.check_mode:
                    self.check_load_once()
                else:
                    self.drain()
            else:
                version = self.router.detect()
                self.result["api_version"] = version
                if version == API_01 and p["worker_api_key"] and p["state"] == "present":
                    self.module.warn("the router 0.1 API cannot pass a worker API key; the router will call %s without one"
                                     % self.url)
                if p["state"] == "present":
                    workers, before, after, entry = self.present()
                else:
                    workers, before, after, entry = self.absent()
                    if p["drain"] and not self.module.check_mode:
                        self.drain()
                self.result["worker"] = entry
                self.result["workers"] = after if self.module.check_mode else [w["url"] for w in workers]
                if self.module._diff:
                    self.result["diff"] = {
                        "before": {"workers": before},
                        "after": {"workers": after if self.module.check_mode else self.result["workers"]},
                    }
        except RouterError as exc:
            self.fail(exc.msg, **exc.extra)
        self.result["elapsed"] = round(time.monotonic() - self.started, 3)
        self.module.exit_json(**self.result)


def argument_spec():
    return dict(
        router_url=dict(type="str", aliases=["router"]),
        url=dict(type="str", required=True, aliases=["worker_url"]),
        state=dict(type="str", choices=["present", "absent", "drained"], default="present"),
        api_version=dict(type="str", choices=["auto", API_03, API_01], default="auto"),
        api_key=dict(type="str", no_log=True),
        worker_api_key=dict(type="str", no_log=True),
        worker_config=dict(type="dict", default={}),
        wait_healthy=dict(type="bool", default=True),
        timeout=dict(type="float", default=120),
        drain=dict(type="bool", default=False),
        drain_url=dict(type="str"),
        drain_timeout=dict(type="float", default=300),
        drain_settle=dict(type="float", default=1.0),
        poll_interval=dict(type="float", default=0.5),
        request_timeout=dict(type="float", default=10),
    )


def main():
    module = AnsibleModule(
        argument_spec=argument_spec(),
        required_if=[
            ("state", "present", ("router_url",)),
            ("state", "absent", ("router_url",)),
        ],
        supports_check_mode=True,
    )
    RouterWorker(module).run()


if __name__ == "__main__":
    main()
