# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_router_worker
short_description: Manage an SGLang server's membership in an SGLang router (smg), and drain it before a restart
version_added: 0.1.0
description:
  - Adds a worker (an SGLang server) to a router or removes it, idempotently, and optionally waits until the
    removed server has no request left in flight. Supported routers are smg (Shepherd Model Gateway) 1.x and
    sglang-router 0.3.x, and the query-string API of sglang-router 0.1.x; see O(api_version) for how the module
    tells them apart.
  - With O(state=present) the worker is registered when the router does not list it as routable. The module first
    waits until the server itself answers C(GET /health) with 200 (O(wait_server)), registers it, and with
    O(wait_healthy=true) waits until the router reports it Ready (smg 1.x C(status=ready); 0.3.x C(is_healthy)).
    An entry the router keeps as C(not_ready) or C(failed) (smg 1.x) or unhealthy (0.3.x) is removed and registered
    again; an entry still C(draining) from a removal is waited out first.
  - With O(state=absent) every router entry whose URL matches O(url) (after normalisation, see notes) is removed,
    and the module waits until the router no longer lists it (smg 1.x keeps it C(draining) for its settle time
    first). It refuses to remove the last Ready worker of a model unless O(allow_last=true). With O(drain=true) it
    then polls the server's own load (see O(drain_url)) until no request is running or queued.
  - With O(state=drained) the router is not contacted at all; the module only waits until the server at
    O(drain_url) (or O(url)) has no request in flight. Use it to run the drain check on the GPU node after an
    O(state=absent) task ran on the controller.
  - "Why the order matters: SGLang's own SIGTERM drain keeps accepting new C(/generate) requests until the process
    exits, and smg's drain settle (5 s) ends whether or not the worker's requests are done. A safe restart removes
    the worker from the router first, waits until the server's own load reaches 0, and only then signals it."
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
      - It is normalised before comparison and registration (scheme and host lower-cased, default port and trailing
        slash removed, V(http://) added when no scheme is given).
    type: str
    required: true
    aliases: [worker_url]
  state:
    description:
      - V(present) makes the worker a routable member of the router, V(absent) removes it, V(drained) only waits
        until the server has no request in flight (the router is not contacted).
    type: str
    choices: [present, absent, drained]
    default: present
  api_version:
    description:
      - Worker-management API of the router.
      - V(1) is smg 1.x (RESTful C(/workers) routes; listed workers carry a C(status)).
      - V(0.3) is sglang-router 0.3.x (the same routes; workers carry C(is_healthy) only).
      - V(0.1) is the query-string API of sglang-router 0.1 (C(/list_workers), C(/add_worker?url=),
        C(/remove_worker?url=)).
      - "V(auto) probes C(GET /workers). A 404 there and a 200 on C(GET /list_workers) means V(0.1). A listed worker
        with a C(status) field means V(1), one without it V(0.3). With no worker listed, C(GET /get_loads) decides:
        smg 1.x answers it with C(\"version\": \"smg-1...\")."
    type: str
    choices: [auto, '1', '0.3', '0.1']
    default: auto
  api_key:
    description:
      - "The router's own key (C(--api-key) of the router), sent as C(Authorization: Bearer)."
      - Never returned or logged.
    type: str
  worker_api_key:
    description:
      - The worker's API key (C(--api-key) of the SGLang server).
      - On smg 1.x and 0.3.x it is sent in the registration body's C(api_key), because workers added at runtime do
        not inherit the router's key; the router then uses it for its checks and requests.
      - "It is also sent as C(Authorization: Bearer) when the drain check reads C(/v1/loads)."
      - The 0.1 API has no field for it; it is then used for the drain check only, with a warning.
      - In PD mode smg 1.x sends the caller's C(Authorization) header to the prefill and decode servers, never this
        key (measured on 1.13.0), so a keyed prefill or decode server behind an smg 1.x router without C(--api-key)
        is refused with state V(present); give the router the servers' key instead.
      - Never returned or logged.
    type: str
  worker_config:
    description:
      - Extra fields of the registration body, for example C(priority), C(labels), C(worker_type) or
        C(bootstrap_port) (prefill workers in PD mode); C(model_id) on 0.3.x. Ignored on the 0.1 API.
      - C(url) and C(api_key) are not allowed here; use O(url) and O(worker_api_key).
    type: dict
    default: {}
  wait_healthy:
    description:
      - With O(state=present), wait until the router reports the worker Ready (smg 1.x) or healthy (0.3.x). The 0.1
        API reports no health; there the module waits for the worker to be listed.
      - With V(false), an entry that is listed in any state counts as present.
    type: bool
    default: true
  wait_server:
    description:
      - With O(state=present), before registering, wait until the server itself answers C(GET /health) with 200 at
        O(drain_url) (else O(url)), within O(timeout). Set V(false) when the host running the task cannot reach the
        server; the router's own checks then decide.
    type: bool
    default: true
  allow_last:
    description:
      - With O(state=absent), remove the worker even when it is the last Ready worker of its model (and role,
        regular, prefill or decode) in the router, which leaves the router with no worker for that model.
      - With V(false) the task fails before anything is changed, naming this option. A worker that is still being
        added (an AddWorker job, or C(pending)) does not count as Ready.
    type: bool
    default: false
  check_readd:
    description:
      - With O(state=absent), first check that the router will take the server back that a redeploy starts next, with
        O(worker_api_key) and O(worker_config) of that server, and fail before anything is changed when it would not.
        The redeploy sets it, so that a refusal comes before the teardown, not after the outage.
      - The rules are those that O(state=present) probes against the running server, read here from the config (the
        new server does not run yet), for smg 1.x. Behind a router with C(--api-key) (O(api_key)) a keyed server must
        have the router's key; behind a router without one, a keyed prefill or decode server (C(worker_type) in
        O(worker_config)) is refused.
    type: bool
    default: false
  timeout:
    description:
      - Seconds to wait for the server's health (O(wait_server)), for the router to list the worker (and report it
        Ready), or to stop listing it (smg 1.x keeps a removed worker C(draining) for about 5 s).
    type: float
    default: 120
  drain:
    description:
      - With O(state=absent), wait after the removal until the server has no request running or queued.
      - The load is read from the server's C(/v1/loads) (SGLang 0.5.10 and later; the sum of C(num_running_reqs) and
        C(num_waiting_reqs), plus grammar and disaggregation queues, over all DP ranks), else from C(/metrics)
        (C(sglang:num_running_reqs) + C(sglang:num_queue_reqs); needs C(--enable-metrics)), else from C(/get_load)
        (SGLang 0.4.10 to 0.5.10).
      - A server that refuses connections has nothing in flight; the drain then ends at once with a warning.
    type: bool
    default: false
  drain_url:
    description:
      - Where the module reaches the server itself (its load for the drain, its C(/health) for O(wait_server)), when
        it runs somewhere that reaches the server under another address than the router does (for example
        V(http://127.0.0.1:30000) on the node itself). Defaults to O(url).
    type: str
    aliases: [server_url]
  drain_timeout:
    description:
      - Seconds to wait for the load to reach 0. The task fails when it does not.
    type: float
    default: 300
  drain_settle:
    description:
      - Seconds for which the load must stay 0 (over consecutive polls) before the server counts as drained. Covers
        requests the router had already sent that are still being tokenised.
    type: float
    default: 1.0
  poll_interval:
    description:
      - Seconds between two polls of the router or the server.
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
  - gpufleet.sglang.tls
  - gpufleet.sglang.option_labels
attributes:
  check_mode:
    support: full
    details:
      - The router is read to find out whether the worker would be added or removed; nothing is sent that changes it.
        The last-worker check runs. The waits are skipped; O(state=drained) reads the load once and does not wait.
  diff_mode:
    support: full
    details: The diff lists the worker URLs the router serves, before and after.
  idempotent:
    description: Running the task twice in a row with the same arguments reports no change the second time.
    support: full
  platform:
    platforms: posix
notes:
  - "Measured against smg 1.13.0: C(POST /workers) answers 202 with C(worker_id); the worker is not listed until its
    AddWorker job ends (0.2 s against a healthy server), then as C(ready). A second C(POST) of a listed URL answers 409.
    An AddWorker job that fails disappears (C(GET /workers/<id>) turns 404) without a message."
  - "smg 1.13.0 removal: C(DELETE /workers/<id>) answers 202, the worker turns C(draining) at once (no new requests,
    C(load) still counts the requests in flight) and is dropped 5 s later whether or not they are done; they go on to
    completion on the server. A C(POST) of the same URL while it drains answers 409. A C(failed) worker is dropped at once."
  - "smg 1.13.0 health: a worker whose probes fail turns C(not_ready) after 3 failed probes and C(failed) after 9 more
    (12 minutes at the default 60 s interval). It is still probed and returns to C(ready) when its server is back; the
    module does not wait for that and registers it again."
  - "sglang-router 0.3.2: the same routes; workers carry C(is_healthy) and no C(status); C(DELETE) drops the worker at
    once; a second C(POST) answers 202 with the same id and the job then fails with \"already exists\". Both answer
    400 for a URL in place of the UUID and 401 on the management routes without the router key."
  - "Both routers can briefly have no Ready worker when a new worker's C(POST) and the old one's C(DELETE) are sent
    together (sglang#38524; measured: 0.17 s, 162 of 391 requests failed on smg 1.13.0). The module only removes a
    worker while another Ready worker of the same model and role is listed (O(allow_last)), checks that again right
    after the removal, and with O(state=present) returns only once the router reports the worker Ready."
  - "The router stores the URL exactly as registered: V(http://h:1/) and V(http://h:1) are two different workers to
    it. This module compares normalised URLs, registers the normalised form, and removes every entry that matches."
  - "A worker added without its key (O(worker_api_key)) can still be reported healthy, because SGLang serves
    C(/health) without a key; every request routed to it would then fail with 401. Before registering, the module
    reads the worker's C(/model_info) with the key the router will use, and fails on 401 or 403."
  - "smg 1.13.0 sends the caller's C(Authorization) header to the worker in place of the worker's key, and falls back
    to the worker's key only when the caller sent none. Behind a router with C(--api-key), whose callers all send the
    router's key, a server must therefore accept the router's key; on smg 1.x with O(api_key) set the module checks
    that (a keyless C(GET /workers) tells whether the router has a key) and fails otherwise. sglang-router 0.3.2
    replaces the header with the worker's key."
  - "The 0.1 API (sglang-router 0.1.9) is implemented from the route table of its binary and was not run against a
    real 0.1 router; it reports no health, so the last-worker check counts listed workers."
seealso:
  - module: gpufleet.sglang.sglang_launch
  - name: smg (Shepherd Model Gateway)
    description: The router's worker management routes.
    link: https://github.com/smg-project/smg
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

- name: Put the new server back once it is healthy, and wait until the router reports it Ready
  gpufleet.sglang.sglang_router_worker:
    router_url: http://router.example:30000
    api_key: "{{ sglang_router_api_key }}"
    url: http://10.0.0.12:30000
    worker_api_key: "{{ sglang_server_api_key }}"
    state: present
    timeout: 120

- name: Scale a model to zero on purpose
  gpufleet.sglang.sglang_router_worker:
    router_url: http://router.example:30000
    url: http://10.0.0.12:30000
    state: absent
    allow_last: true
"""

RETURN = r"""
api_version:
  description: The router API that was used (V(1) is smg 1.x). V(null) with O(state=drained).
  returned: always
  type: str
  sample: "1"
url:
  description: The normalised worker URL.
  returned: always
  type: str
  sample: http://10.0.0.12:30000
worker:
  description:
    - The router's record of the worker. With O(state=present), as listed at the end; with O(state=absent), as
      listed before the removal. V(null) when the router did not list it.
  returned: unless O(state=drained)
  type: dict
  contains:
    id:
      description: The router's worker id (V(null) on 0.1).
      type: str
      sample: 01a2333f-442d-727f-ab0d-fb460bf1a5fb
    url:
      description: The URL exactly as the router lists it.
      type: str
      sample: http://10.0.0.12:30000
    status:
      description: >-
        smg 1.x state (V(pending), V(ready), V(not_ready), V(failed), V(draining)); on 0.3.x V(ready) or V(not_ready)
        from C(is_healthy); V(null) on 0.1.
      type: str
      sample: ready
    is_healthy:
      description: The router's health verdict; V(null) on the 0.1 API.
      type: bool
      sample: true
    load:
      description: The router's own count of requests in flight to this worker; V(null) on the 0.1 API.
      type: int
      sample: 0
    model_id:
      description: The model the router serves through this worker.
      type: str
      sample: Qwen/Qwen3-8B
    worker_type:
      description: V(regular), V(prefill) or V(decode).
      type: str
      sample: regular
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
ready_peers:
  description: Other Ready workers of the same model and role that the router listed before the removal.
  returned: when O(state=absent) and the worker was Ready
  type: int
  sample: 2
reregistered:
  description: With O(state=present), whether a stale entry (not_ready, failed, draining, unhealthy) was replaced.
  returned: when O(state=present) and the worker was registered
  type: bool
  sample: false
router_load:
  description: >-
    The router's own count of requests in flight to the worker, at the last poll while it still listed the worker
    after the removal (smg 1.x lists it as draining). Requests counted here are still running on the server.
  returned: when the router listed the worker after the removal
  type: int
  sample: 0
settle_s:
  description: Seconds from the removal request until the router stopped listing the worker (about 5 on smg 1.x).
  returned: when the router was waited on to stop listing the worker
  type: float
  sample: 5.1
drained_s:
  description: Seconds spent waiting for the server's load to reach 0. V(null) when no drain ran.
  returned: always
  type: float
  sample: 3.2
load:
  description: The server's last measured in-flight load (running plus queued requests); V(null) when not measured.
  returned: always
  type: int
  sample: 0
initial_load:
  description: The server's in-flight load at the first poll of the drain; V(null) when not measured.
  returned: always
  type: int
  sample: 3
load_source:
  description: >-
    Where the load was read: V(/v1/loads), V(/metrics), V(/get_load), or V(unreachable) when the server refused
    connections. V(null) when not measured.
  returned: always
  type: str
  sample: /v1/loads
elapsed:
  description: Seconds the module ran.
  returned: always
  type: float
  sample: 4.1
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import http
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import names as names_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.router.workers import RouterWorker, argument_spec


def main():
    module = AnsibleModule(
        argument_spec=dict(argument_spec(), **dict(http.TLS_ARGSPEC, **names_mod.ARGSPEC)),
        required_if=[
            ("state", "present", ("router_url",)),
            ("state", "absent", ("router_url",)),
        ],
        supports_check_mode=True,
    )
    http.configure_module(module)
    RouterWorker(module).run()


if __name__ == "__main__":
    main()
