"""The TCP ports SGLang 0.5.23 binds besides ``--port`` (``srt/server_args.py``
``PortArgs.init_new``, ``srt/utils/network.py``), for the fake server.

* NCCL port: ``--nccl-port``, else a free port picked at random (64 tries)
  from 22000 up to ``min(29999, ephemeral_low - 1)``
  (``get_free_port_below_ephemeral``).  Without ``--dist-init-addr`` the
  torch.distributed TCPStore of scheduler rank 0 listens on it (at
  ``--host``); with ``--dist-init-addr`` the store uses that address and the
  NCCL port is only picked.
* Attention data parallelism (``--enable-dp-attention`` or
  ``--attn-dp-size > 1``): ZMQ over TCP instead of IPC.  ``dist_init_port``
  is ``--port + 233`` on one node without ``--dist-init-addr`` (``--port -
  233`` when that passes 65535), else the ``--dist-init-addr`` port;
  ``port_base = dist_init_port + 1`` (``dist_init_port - 7`` when
  ``dist_init_port + 6 > 65535``), and the six derived ports are
  port_base + 0 tokenizer (bound by the main process), + 1 detokenizer (the
  detokenizer process), + 2 rpc (main process, node rank 0), + 3 metrics
  (checked, bound by nobody), + 4 scheduler input (main process) and + 5 load
  collector (main process, multi-node only).  Before binding, the main
  process waits up to ``SGLANG_WAIT_PORT_TIMEOUT`` (30) seconds for each of
  dist_init_port, port_base .. + 4, the NCCL port (and + 5 with nnodes > 1)
  to be free, then fails with "Port is already in use. ...".  Multi-node
  attention DP also binds ``dist_init_port + 13`` (the worker-port handshake)
  on node rank 0.
"""
from __future__ import annotations

import logging
import os
import random
import socket
import time

logger = logging.getLogger("sglang.srt.server_args")

ZMQ_TCP_PORT_DELTA = 233
DP_ATTENTION_HANDSHAKE_PORT_DELTA = 13
NUM_DERIVED_PORTS = 6
MAX_VALID_PORT = 65535
NCCL_LOW, NCCL_HIGH = 22000, 29999


def attn_dp_enabled(sa) -> bool:
    return bool(sa.values.get("enable_dp_attention")) or int(sa.values.get("attn_dp_size") or 1) > 1


def _parse(addr):
    host, _colon, port = addr.rpartition(":")
    return (host.strip("[]") or "127.0.0.1"), int(port)


def _family(host):
    return socket.AF_INET6 if ":" in (host or "") else socket.AF_INET


def is_port_available(port) -> bool:
    """utils/network.py is_port_available: a wildcard bind with SO_REUSEADDR succeeds."""
    for family, host in ((socket.AF_INET, "0.0.0.0"),):
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
        except OSError:
            return False
        finally:
            sock.close()
    return True


def ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port_below_ephemeral(low=NCCL_LOW, high=NCCL_HIGH, attempts=64, rng=None) -> int:
    rng = rng or random.Random()
    high = min(high, ephemeral_low() - 1)
    if high - low + 1 >= attempts:
        for port in rng.sample(range(low, high + 1), attempts):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind(("0.0.0.0", port))   # reuse_addr=False, as the real probe
                return port
            except OSError:
                continue
            finally:
                sock.close()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("", 0))
        return sock.getsockname()[1]
    finally:
        sock.close()


def plan(sa, nccl_port=None) -> dict:
    """The port plan of a server: ``{"nccl_port", "store" (host, port) or None, and with
    attention DP "dist_init_host", "dist_init_port", "port_base", "derived" {name: port},
    "handshake_port" (multi-node) }``."""
    nnodes = max(1, int(sa.nnodes or 1))
    out = {"nccl_port": nccl_port if nccl_port is not None else (
        sa.values.get("nccl_port") or free_port_below_ephemeral())}
    if sa.dist_init_addr:
        out["store"] = None   # the rendezvous uses --dist-init-addr (dist.py)
    else:
        out["store"] = (sa.host or "127.0.0.1", out["nccl_port"])
    out["attn_dp"] = attn_dp_enabled(sa)
    if not out["attn_dp"]:
        return out
    if nnodes == 1 and sa.dist_init_addr is None:
        port = int(sa.port) + ZMQ_TCP_PORT_DELTA
        if port > MAX_VALID_PORT:
            port = int(sa.port) - ZMQ_TCP_PORT_DELTA
        host = "127.0.0.1"
    else:
        host, port = _parse(sa.dist_init_addr)
    base = port - NUM_DERIVED_PORTS - 1 if port + NUM_DERIVED_PORTS > MAX_VALID_PORT else port + 1
    out.update({
        "dist_init_host": host, "dist_init_port": port, "port_base": base,
        "derived": {"port_base": base, "detokenizer_port": base + 1, "rpc_port": base + 2,
                    "metrics_port": base + 3, "scheduler_input_port": base + 4,
                    "load_collector_port": base + 5},
    })
    if nnodes > 1:
        out["handshake_port"] = port + DP_ATTENTION_HANDSHAKE_PORT_DELTA
    return out


def wait_available(port_plan, nnodes, timeout_s=None):
    """PortArgs.init_new's checks (attention DP only); raises ValueError after the timeout."""
    if not port_plan.get("attn_dp"):
        return
    if timeout_s is None:
        timeout_s = int(os.environ.get("SGLANG_WAIT_PORT_TIMEOUT", "30"))
    d = port_plan["derived"]
    checks = [("dist_init_port", port_plan["dist_init_port"]), ("port_base", d["port_base"]),
              ("detokenizer_port", d["detokenizer_port"]), ("nccl_port", port_plan["nccl_port"]),
              ("rpc_port", d["rpc_port"]), ("metrics_port", d["metrics_port"])]
    if nnodes > 1:
        checks.append(("load_collector_port", d["load_collector_port"]))
    checks.append(("scheduler_input_port", d["scheduler_input_port"]))
    try:
        for name, port in checks:
            _wait_port_available(port, name, timeout_s)
    except ValueError:
        logger.exception("Port is already in use. dist_init_port=%s port_base=%s detokenizer_port=%s "
                         "nccl_port=%s scheduler_input_port=%s", port_plan["dist_init_port"],
                         d["port_base"], d["detokenizer_port"], port_plan["nccl_port"],
                         d["scheduler_input_port"])
        raise


def _wait_port_available(port, name, timeout_s):
    if port < 0 or port > MAX_VALID_PORT:
        raise ValueError("%s has invalid port number %s. Valid TCP port range is 0-%s."
                         % (name, port, MAX_VALID_PORT))
    error_message = "%s at %s is not available" % (name, port)
    for i in range(int(timeout_s)):
        if is_port_available(port):
            return True
        if i > 10 and i % 5 == 0:
            logger.info("port %s is in use. Waiting for %s seconds for %s to be available. %s",
                        port, i, name, error_message)
        time.sleep(1)
    raise ValueError("%s at %s is not available in %s seconds. %s" % (name, port, timeout_s, error_message))


def listen(host, port):
    """A listening TCP socket (SO_REUSEADDR, like zmq and the TCPStore)."""
    sock = socket.socket(_family(host), socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(16)
    except OSError:
        sock.close()
        raise
    return sock


def main_process_ports(port_plan, nnodes, node_rank):
    """(name, host, port) the main process binds (besides --port)."""
    if not port_plan.get("attn_dp"):
        return []
    d, host = port_plan["derived"], port_plan["dist_init_host"]
    out = []
    if node_rank == 0:
        out += [("port_base", host, d["port_base"]), ("scheduler_input_port", host, d["scheduler_input_port"]),
                ("rpc_port", host, d["rpc_port"])]
        if nnodes > 1:
            out += [("load_collector_port", host, d["load_collector_port"]),
                    ("handshake_port", host, port_plan["handshake_port"])]
    return out
