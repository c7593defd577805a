# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Worker membership in an SGLang router, and the drain of a removed worker.

Used by the ``sglang_router_worker`` module. Three router APIs are spoken:

* ``"1"``: smg (Shepherd Model Gateway) 1.x. ``GET/POST /workers``,
  ``DELETE /workers/{id}``; every listed worker carries a ``status``
  (``pending``, ``ready``, ``not_ready``, ``failed``, ``draining``). A removal
  first puts the worker into ``draining`` (not routable, still listed, the
  router still counts its requests in ``load``) for the router's drain settle
  time (5 s), then drops it.
* ``"0.3"``: sglang-router 0.3.x. The same routes, but workers carry only
  ``is_healthy``; a removal drops the worker at once.
* ``"0.1"``: sglang-router 0.1.x. ``/list_workers``, ``/add_worker?url=``,
  ``/remove_worker?url=``; no health and no load.

docs/router.md has what was measured against the real binaries. Standard
library only (target-side code).

This module holds the module's flow (``RouterWorker``); ``worker_list.py`` parses the
router's worker lists, ``client.py`` speaks its routes, ``load.py`` reads a server's
in-flight load.
"""
from __future__ import annotations

import time

from ansible_collections.gpufleet.sglang.plugins.module_utils.common.http import (
    ConnectionRefused,
    HTTPConnectionError,
    request,
)
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import names as names_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import wait
from ansible_collections.gpufleet.sglang.plugins.module_utils.router.client import Router
from ansible_collections.gpufleet.sglang.plugins.module_utils.router.load import read_load
from ansible_collections.gpufleet.sglang.plugins.module_utils.router.worker_list import (
    API_01,
    API_03,
    API_1,
    DRAINING,
    STALE,
    RouterError,
    find_workers,
    is_ready,
    normalize_url,
    ready_peers,
    same_url,
)

# How long an AddWorker job may be gone (404) while the router does not list the worker yet, before the job
# counts as dropped: the router lists a worker only after its health check, and real SGLang's /health takes at
# least 1 s (measured: the job was gone for 1-2 s before the worker was listed, smg 1.13.0 and sglang-router 0.3.2).
JOB_GONE_GRACE_S = 5.0


# --------------------------------------------------------------------------
# The module's flow
# --------------------------------------------------------------------------

def _request_timeout(deadline, seconds):
    """A request's timeout inside ``deadline``: the time left, at most ``seconds``, never zero (urllib's 0 is no wait)."""
    return max(deadline.clamp(seconds), 0.05)


def _urls(workers):
    return [w["url"] for w in workers]


class RouterWorker(object):
    """What ``sglang_router_worker`` does; ``module`` is its AnsibleModule."""

    def __init__(self, module):
        self.module = module
        self.names = names_mod.Names.of_module(module)
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
        try:
            self.server_base = normalize_url(p["drain_url"] or p["url"])
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

    def poll(self, predicate, deadline):
        """``predicate()`` every poll_interval until it returns something truthy or ``deadline`` passes (wait.py)."""
        return wait.wait_for(predicate, deadline=deadline, interval=self.p["poll_interval"])

    def ready(self, entry):
        return is_ready(entry, self.router.api_version)

    # ---- present ---------------------------------------------------------

    def present(self):
        """Make the worker a routable member; returns ``(workers, before, after, entry)``."""
        router = self.router
        workers = router.list()
        before = _urls(workers)
        found = find_workers(workers, self.url)
        ready = [e for e in found if self.ready(e)]
        if ready or (found and not self.p["wait_healthy"]):
            return workers, before, before, (ready or found)[0]
        stale = [e for e in found if e["status"] in STALE]
        draining = [e for e in found if e["status"] == DRAINING]
        if found and not stale and not draining:
            # Pending: the router is adding it already (an AddWorker job or its first probes).
            if self.module.check_mode:
                return workers, before, before, found[0]
            entry, workers = self.wait_member(None)
            return workers, before, _urls(workers), entry
        self.result["changed"] = True
        self.result["reregistered"] = bool(found)
        if self.module.check_mode:
            self.check_worker_auth()
            return workers, before, before if found else before + [self.url], None
        self.wait_server_healthy()
        self.check_worker_auth()
        for entry in stale:
            router.remove(entry)
        if found:
            self.wait_gone()
        job_id = router.add(self.url, self.p["worker_api_key"], self.p["worker_config"])
        entry, workers = self.wait_member(job_id)
        return workers, before, _urls(workers), entry

    def wait_server_healthy(self):
        """Register only a server that is healthy itself: ``GET /health`` answers 200."""
        if not self.p["wait_server"]:
            return
        deadline = wait.Deadline(self.p["timeout"])
        last = [None]

        def healthy():
            try:
                status, dummy, dummy2 = request("GET", self.server_base + "/health",
                                                timeout=_request_timeout(deadline, self.p["request_timeout"] or 10))
                if status == 200:
                    return True
                last[0] = "HTTP %s" % status
            except HTTPConnectionError as exc:
                last[0] = str(exc)
            return False

        if not self.poll(healthy, deadline):
            self.fail("%s/health did not answer 200 within %.0f s (last: %s), so the server was not put into the "
                      "router. Start the server first; set drain_url when this host reaches it under another address, "
                      "or wait_server=false when it cannot reach it at all." % (self.server_base, self.p["timeout"], last[0]))

    def check_readd(self):
        """With state=absent and check_readd: refuse, before the worker is taken out, a redeploy whose new server
        this router could not use once it is put back (the same rules as check_worker_auth, read from the config,
        since the new server does not run yet): the outage would end in a router that fails every request."""
        key = self.p["worker_api_key"]
        if self.router.api_version != API_1 or not key:
            return
        untouched = (" Nothing was touched: %s is still in the router and the old server serves." % self.url)
        keyed = self.router_keyed()     # one GET /workers without a key, for both rules
        if self.p["api_key"] and keyed:
            if key != self.p["api_key"]:
                self.fail("the server this redeploy starts behind %s has another API key than the router (worker_api_key "
                          "is not api_key). smg 1.x sends the caller's Authorization header, which for a router with "
                          "--api-key is the router's key, to the worker instead of worker_api_key, so every request routed "
                          "to the new server would fail with 401. Give the server the router's key (--api-key), or run "
                          "the router without --api-key.%s" % (self.router.base, untouched))
            return
        role = str((self.p.get("worker_config") or {}).get("worker_type") or "").lower()
        if role in ("prefill", "decode") and not keyed:
            self.fail("the %s server this redeploy starts has an API key (worker_api_key), and the smg 1.x router %s has "
                      "none. In PD mode smg 1.x sends the caller's Authorization header to the prefill and decode "
                      "servers, never worker_api_key, so every request through the router would fail with 401. Give "
                      "the router the servers' key (--api-key, and %s), or run the PD servers "
                      "without --api-key.%s" % (role, self.router.base, self.names.of("api_key"), untouched))

    def check_worker_auth(self):
        """Fail before registering a worker that would reject the router's requests.

        SGLang serves /health without a key, so a worker registered without its
        key is reported healthy while every request through the router fails
        with 401. Probe /model_info (or /get_model_info) with the key the
        router will use. Only a definite 401/403 fails; when this host cannot
        reach the worker URL, the router's own checks decide.
        """
        key = self.p["worker_api_key"]
        if self.router.api_version == API_1 and self.p["api_key"] and self.router_keyed():
            # smg 1.x forwards the caller's Authorization header in place of the worker's key (measured on
            # 1.13.0; "Caller Authorization takes precedence"), and a keyed router's callers all send its key.
            self.probe_worker_key(self.p["api_key"], (
                "%s rejects the router's api_key (HTTP %%d on %%s). smg 1.x sends the caller's Authorization header, "
                "which for a router with --api-key is the router's key, to the worker instead of worker_api_key, so "
                "every request routed to this server would fail with 401. Give the server the router's key "
                "(--api-key), or run the router without --api-key." % self.url))
            return
        role = str((self.p.get("worker_config") or {}).get("worker_type") or "").lower()
        if self.router.api_version == API_1 and role in ("prefill", "decode") and not self.router_keyed():
            # In PD mode smg 1.x dispatches to the prefill and the decode server with the caller's Authorization
            # header and never with the key registered for the worker (measured on 1.13.0: a caller without a key
            # gets 401 from a keyed prefill server, a caller with the servers' key gets 200). Behind a router
            # without --api-key its callers send no key, so a keyed PD server fails every request.
            self.probe_worker_key(None, (
                "%s (a %s server) requires an API key (HTTP %%d on %%s), and this smg 1.x router has none. In PD mode "
                "smg 1.x sends the caller's Authorization header to the prefill and decode servers, never "
                "worker_api_key, so every request through the router would fail with 401. Give the router the "
                "servers' key (--api-key, and %s), or run the PD servers without --api-key."
                % (self.url, role, self.names.of("api_key"))))
            return
        self.probe_worker_key(key, None)

    def router_keyed(self):
        """Whether the router's management routes need its key (asked without one)."""
        try:
            status, dummy, dummy2 = request("GET", self.router.base + "/workers", timeout=self.router.request_timeout)
        except HTTPConnectionError:
            return True
        return status in (401, 403)

    def probe_worker_key(self, key, message):
        for path in ("/model_info", "/get_model_info"):
            try:
                status, dummy, dummy2 = request("GET", self.url + path, api_key=key, timeout=min(self.p["request_timeout"] or 10, 5))
            except HTTPConnectionError:
                return
            if status in (401, 403):
                if message:
                    self.fail(message % (status, path))
                if key:
                    self.fail("%s rejects worker_api_key (HTTP %d on %s); the router would fail every request to it. "
                              "Set worker_api_key to the server's --api-key." % (self.url, status, path))
                self.fail("%s requires an API key (HTTP %d on %s) and worker_api_key is not set; the router would report it "
                          "healthy (/health needs no key) but every request through the router would fail with 401."
                          % (self.url, status, path))
            if status != 404:
                return

    def check_add_job(self, job_id, deadline, state):
        """An AddWorker job the router failed, or dropped without a message: fail with what it said."""
        router = self.router
        status, job = router.job(job_id, timeout=_request_timeout(deadline, router.request_timeout))
        job_status = job.get("job_status") if isinstance(job, dict) else None
        job_status = job_status if isinstance(job_status, dict) else {}
        if job_status.get("status") == "failed":
            self.fail("the router could not add %s: %s" % (self.url, job_status.get("message") or "the AddWorker job failed"),
                      workers=_urls(state["workers"]))
        if job_status.get("status"):
            state["last"] = "AddWorker job %s" % job_status["status"]
        if status != 404:
            state["gone_since"] = None
        elif state["gone_since"] is None:
            state["gone_since"] = time.monotonic()
        if state["gone_since"] is not None and (time.monotonic() - state["gone_since"] >= JOB_GONE_GRACE_S
                                                or deadline.expired()):
            # smg 1.x drops a failed AddWorker job without a message (measured on 1.13.0). A job that succeeded is
            # gone too until the router lists the worker, which waits for the worker's health check: about 2 s
            # behind a real SGLang server, whose /health takes 1 s or more.
            self.fail("the router dropped the AddWorker job for %s and does not list it: its health check or "
                      "metadata discovery failed (the router's log says which). Check that the router reaches the "
                      "worker under this URL, and --worker-startup-timeout-secs." % self.url, workers=_urls(state["workers"]))

    def wait_member(self, job_id):
        """Poll until the router lists the worker as routable (listed, without wait_healthy)."""
        router = self.router
        deadline = wait.Deadline(self.p["timeout"])
        state = {"last": "not listed yet", "gone_since": None, "workers": []}

        def member():
            try:
                return listed()
            except RouterError:
                if not deadline.expired():
                    raise
                # A read that the end of the budget cut short (its timeout is the time left): the wait is over, and
                # the message says what the router last showed, not that it cannot be reached.
                state["last"] += "; the last read of the router was cut short by the end of the wait"
                return None

        def listed():
            workers = state["workers"] = router.list(timeout=_request_timeout(deadline, router.request_timeout))
            found = find_workers(workers, self.url)
            if found:
                state["gone_since"] = None
                ready = [e for e in found if self.ready(e)]
                if ready or not self.p["wait_healthy"]:
                    return (ready or found)[0], workers
                state["last"] = "listed as %s" % (found[0]["status"] or "unhealthy")
            elif job_id and router.restful:
                self.check_add_job(job_id, deadline, state)
            return None

        got = self.poll(member, deadline)
        if got:
            return got.value
        last, workers = state["last"], state["workers"]
        self.fail("%s is not %s in the router %s after %.0f s (%s). Check that the router reaches the worker under "
                  "this URL, and the router's --worker-startup-timeout-secs and health-check settings."
                  % (self.url, "Ready" if self.p["wait_healthy"] else "listed", router.base, self.p["timeout"], last),
                  workers=_urls(workers))

    def wait_gone(self):
        """Poll until the router no longer lists the worker; smg 1.x keeps it Draining first.

        Records the router's own in-flight count for the worker while it is
        still listed (``router_load``) and how long the router took (``settle_s``).
        """
        router = self.router
        deadline = wait.Deadline(self.p["timeout"])
        state = {"workers": [], "still": []}

        def gone():
            workers = state["workers"] = router.list(timeout=_request_timeout(deadline, router.request_timeout))
            still = state["still"] = find_workers(workers, self.url)
            loads = [e["load"] for e in still if e["load"] is not None]
            if loads:
                self.result["router_load"] = sum(loads)
            return not still

        if self.poll(gone, deadline):
            self.result["settle_s"] = round(deadline.elapsed(), 3)
            return state["workers"]
        still = state["still"]
        self.fail("the router %s still lists %s (%s) %.0f s after the removal was requested"
                  % (router.base, ", ".join(w["url"] for w in still), ", ".join(str(w["status"]) for w in still),
                     self.p["timeout"]), workers=_urls(state["workers"]))

    # ---- absent ----------------------------------------------------------

    def last_worker_message(self, entry, after=False):
        model = entry.get("model_id") or "unknown"
        what = "the model %r (%s workers)" % (model, entry.get("worker_type")) if self.router.api_version != API_01 else "this router"
        if after:
            return ("%s was removed from the router %s, but no other worker of %s is Ready any more: another removal or a "
                    "failing health check happened at the same time. The server was not stopped; put it back into the "
                    "router (state=present) before retrying, and roll fewer hosts at once."
                    % (self.url, self.router.base, what))
        return ("refusing to remove %s from the router %s: it is the last Ready worker of %s, so the router would have no "
                "worker left for those requests (a worker being added does not count until the router reports it Ready). "
                "Add or repair another worker first, or set allow_last=true to remove it anyway."
                % (self.url, self.router.base, what))

    def absent(self):
        """Take the worker out of the router; returns ``(workers, before, after, entry)``."""
        router = self.router
        if self.p["check_readd"]:
            self.check_readd()
        workers = router.list()
        before = _urls(workers)
        found = find_workers(workers, self.url)
        targets = [e for e in found if e["status"] != DRAINING]
        self.result["removed"] = targets
        if not found:
            return workers, before, before, None
        after_planned = [u for u in before if not same_url(u, self.url)]
        ready = [e for e in targets if self.ready(e)]
        guarded = bool(ready) and not self.p["allow_last"]
        if ready:
            self.result["ready_peers"] = len(ready_peers(workers, self.url, ready[0], router.api_version))
            if guarded and not self.result["ready_peers"]:
                self.fail(self.last_worker_message(ready[0]), workers=before)
        self.result["changed"] = bool(targets)
        if self.module.check_mode:
            return workers, before, after_planned, found[0]
        removed_any = False
        for entry in targets:
            removed_any = router.remove(entry) or removed_any
        if not removed_any:
            # Already being removed (Draining), or someone else removed it between our GET and our DELETE.
            self.result["changed"] = False
            self.result["removed"] = []
        elif guarded:
            # Check-then-act: a concurrent removal may have passed the same check (sglang#38524 is the router's
            # own form of this race). Say so at once rather than let the caller stop the server.
            now = router.list()
            if not ready_peers(now, self.url, ready[0], router.api_version):
                self.fail(self.last_worker_message(ready[0], after=True), workers=_urls(now))
        workers = self.wait_gone()
        return workers, before, _urls(workers), found[0]

    # ---- drain -----------------------------------------------------------

    def drain(self):
        """Wait until the server's own load is 0 for drain_settle seconds."""
        deadline = wait.Deadline(self.p["drain_timeout"])
        api_key = self.p["worker_api_key"]
        state = {"source": None, "zero_since": None, "load": None}

        def drained():
            try:
                load, source = read_load(self.server_base, api_key,
                                         _request_timeout(deadline, self.p["request_timeout"] or 10), state["source"])
            except ConnectionRefused:
                self.module.warn("%s refuses connections, so nothing is in flight there; treating it as drained" % self.server_base)
                self.result.update(load=None, load_source="unreachable", drained_s=round(deadline.elapsed(), 3))
                return True
            except HTTPConnectionError as exc:
                if deadline.expired():
                    self.fail("cannot read the load of %s: %s" % (self.server_base, exc), drained_s=None)
                return False
            except RouterError as exc:
                self.fail(exc.msg, drained_s=None)
            state.update(load=load, source=source)
            self.result.update(load=load, load_source=source)
            if self.result["initial_load"] is None:
                self.result["initial_load"] = load
            now = time.monotonic()
            if load != 0:
                state["zero_since"] = None
                return False
            if state["zero_since"] is None:
                state["zero_since"] = now
            if now - state["zero_since"] >= self.p["drain_settle"]:
                self.result["drained_s"] = round(deadline.elapsed(), 3)
                return True
            return False

        if self.poll(drained, deadline):
            return
        load, source = state["load"], state["source"]
        self.fail("%s still has %s request(s) in flight (%s) after %.0f s; the server was not stopped. Raise drain_timeout, "
                  "or find out what keeps it busy." % (self.server_base, load, source, self.p["drain_timeout"]),
                  drained_s=None)

    def check_load_once(self):
        try:
            load, source = read_load(self.server_base, self.p["worker_api_key"], self.p["request_timeout"] or 10)
        except ConnectionRefused:
            self.result.update(load=None, load_source="unreachable")
            return
        except HTTPConnectionError as exc:
            self.fail("cannot read the load of %s: %s" % (self.server_base, exc))
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
                self.result["workers"] = after if self.module.check_mode else _urls(workers)
                if self.module._diff:
                    self.result["diff"] = {"before": {"workers": before}, "after": {"workers": self.result["workers"]}}
        except RouterError as exc:
            self.fail(exc.msg, **exc.extra)
        self.result["elapsed"] = round(time.monotonic() - self.started, 3)
        self.module.exit_json(**self.result)


def argument_spec():
    return dict(
        router_url=dict(type="str", aliases=["router"]),
        url=dict(type="str", required=True, aliases=["worker_url"]),
        state=dict(type="str", choices=["present", "absent", "drained"], default="present"),
        api_version=dict(type="str", choices=["auto", API_1, API_03, API_01], default="auto"),
        api_key=dict(type="str", no_log=True),
        worker_api_key=dict(type="str", no_log=True),
        worker_config=dict(type="dict", default={}),
        wait_healthy=dict(type="bool", default=True),
        wait_server=dict(type="bool", default=True),
        allow_last=dict(type="bool", default=False),
        check_readd=dict(type="bool", default=False),
        timeout=dict(type="float", default=120),
        drain=dict(type="bool", default=False),
        drain_url=dict(type="str", aliases=["server_url"]),
        drain_timeout=dict(type="float", default=300),
        drain_settle=dict(type="float", default=1.0),
        poll_interval=dict(type="float", default=0.5),
        request_timeout=dict(type="float", default=10),
    )
