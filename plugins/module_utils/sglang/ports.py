# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The TCP ports an SGLang server will bind, from its resolved args (docs/reference/sglang-processes.md, "Ports").

Read in the 0.5.23 wheel (``srt/server_args.py``, ``srt/utils/network.py``) and reproduced by the fake server:

* the HTTP port (``--port``, default 30000);
* ``--nccl-port`` when it is given (scheduler rank 0 listens on it; without it SGLang picks a random free
  port from 22000 to 29999, which cannot be checked ahead);
* with attention data parallelism: ``dist_init_port`` is ``--port + 233`` on one node, else the port of
  ``--dist-init-addr``; from ``port_base = dist_init_port + 1`` the main process binds ``port_base``,
  ``port_base + 2`` and ``port_base + 4`` and the detokenizer ``port_base + 1``; a multi-node group also
  binds ``port_base + 5`` and ``dist_init_port + 13``;
* on node rank 0 of a multi-node group, the ``--dist-init-addr`` port (the torch.distributed store);
* on a prefill server (``--disaggregation-mode prefill``), the KV bootstrap server's port
  (``--disaggregation-bootstrap-port``, default 8998), which the decode servers connect to.

A server killed with SIGKILL can keep these ports for a while (its children, or TIME_WAIT); SGLang waits
up to 30 s per port and then fails with "Port is already in use". The preflight checks them before the
teardown and ``sglang_replace`` waits for them after it.
"""

from __future__ import annotations

DEFAULT_PORT = 30000
ATTN_DP_OFFSET = 233
DEFAULT_BOOTSTRAP_PORT = 8998


def _int(value, default=None):
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _addr_port(addr):
    text = str(addr or "")
    if not text:
        return None
    host, sep, port = text.rpartition(":")
    return _int(port) if sep else None


def attention_dp(args):
    return bool(args.get("enable_dp_attention")) or (_int(args.get("attn_dp_size"), 1) or 1) > 1


def bound_ports(args, node_rank=0):
    """``[{port, what}]``: every port the server with these (resolved) args binds on this node, sorted."""
    args = dict(args or {})
    out = {}
    http_port = _int(args.get("port"), DEFAULT_PORT) or DEFAULT_PORT
    out[http_port] = "the HTTP port"
    nnodes = _int(args.get("nnodes"), 1) or 1
    rank = _int(args.get("node_rank"), node_rank) or 0
    if args.get("nccl_port") not in (None, "") and rank == 0:
        out.setdefault(_int(args["nccl_port"]), "the NCCL port (--nccl-port, scheduler rank 0)")
    dist_port = _addr_port(args.get("dist_init_addr"))
    if nnodes > 1 and rank == 0 and dist_port:
        out.setdefault(dist_port, "the dist-init port of node rank 0 (--dist-init-addr)")
    if str(args.get("disaggregation_mode") or "") == "prefill" and rank == 0:
        boot = _int(args.get("disaggregation_bootstrap_port"), DEFAULT_BOOTSTRAP_PORT) or DEFAULT_BOOTSTRAP_PORT
        out.setdefault(boot, "the KV bootstrap port of a prefill server (--disaggregation-bootstrap-port)")
    if attention_dp(args):
        base_port = (http_port + ATTN_DP_OFFSET) if nnodes <= 1 or not dist_port else dist_port
        port_base = base_port + 1
        for offset, what in ((0, "the tokenizer's port (attention DP: dist_init_port + 1)"),
                             (1, "the detokenizer's port (attention DP: dist_init_port + 2)"),
                             (2, "the RPC port (attention DP: dist_init_port + 3)"),
                             (4, "the scheduler input port (attention DP: dist_init_port + 5)")):
            out.setdefault(port_base + offset, what)
        if nnodes > 1:
            out.setdefault(port_base + 5, "a multi-node port (attention DP: dist_init_port + 6)")
            out.setdefault(base_port + 13, "a multi-node port (attention DP: dist_init_port + 13)")
    return [{"port": port, "what": what} for port, what in sorted(out.items()) if port and 0 < port < 65536]
