"""Multi-node rendezvous of the fake server over ``--dist-init-addr``.

Stands in for the torch.distributed TCPStore that rank 0 hosts: node rank 0
listens on ``host:port``; every other rank connects, says ``hello <rank>``,
then ``ready`` once its schedulers hold their GPUs.  Rank 0 serves only when
all ``nnodes - 1`` ranks are ready.  On a graceful 0.5.23 shutdown rank 0
sends ``shutdown`` (the ShutdownReq broadcast, docs/reference/sglang-processes.md, Signals) and the other
ranks stop their schedulers and exit.  When rank 0 dies without sending it
(SIGKILL, or the SIGKILL-based shutdown of 0.4.6-0.5.10) the connection just
drops: the other ranks log it and keep their GPUs (§3.4 item 4).
"""
from __future__ import annotations

import logging
import socket
import threading
import time

logger = logging.getLogger("sglang.srt.entrypoints.dist")


def _parse_addr(addr: str):
    host, _colon, port = addr.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port)


class DistServer:
    def __init__(self, addr, nnodes):
        from sglang.srt.entrypoints.engine import DistNetworkError

        self.host, self.port = _parse_addr(addr)
        self.nnodes = nnodes
        self.conns = {}
        self.ready = set()
        self.lock = threading.Condition()
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((self.host, self.port))
        except OSError as e:
            self.sock.close()
            raise DistNetworkError(
                "The server socket has failed to listen on any local network address. "
                f"port: {self.port}, useIPv6: {int(family == socket.AF_INET6)}, "
                f"code: -{e.errno or 98}, name: EADDRINUSE, message: address already in use")
        self.sock.listen(64)
        threading.Thread(target=self._accept, name="dist-accept", daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _addr = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        rank = None
        buf = b""
        try:
            while True:
                data = conn.recv(4096)
                if not data:
                    break
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    words = line.decode().split()
                    if words[:1] == ["hello"] and len(words) == 2:
                        rank = int(words[1])
                        with self.lock:
                            self.conns[rank] = conn
                            self.lock.notify_all()
                    elif words == ["ready"] and rank is not None:
                        with self.lock:
                            self.ready.add(rank)
                            self.lock.notify_all()
        except OSError:
            pass
        with self.lock:
            if rank is not None and self.conns.get(rank) is conn:
                del self.conns[rank]
                self.ready.discard(rank)
            self.lock.notify_all()

    def wait_ready(self, timeout, alive=lambda: True):
        deadline = time.monotonic() + timeout
        logged = False
        with self.lock:
            while len(self.ready) < self.nnodes - 1:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"Timed out after {int(timeout)} seconds waiting for "
                        f"{self.nnodes - 1 - len(self.ready)} node(s) to join at "
                        f"{self.host}:{self.port}")
                if not alive():
                    raise EOFError("Rank 0 scheduler is dead while waiting for the other nodes.")
                if not logged:
                    logger.info("Waiting for %s more node(s) to join at %s:%s",
                                self.nnodes - 1 - len(self.ready), self.host, self.port)
                    logged = True
                self.lock.wait(0.2)

    def broadcast_shutdown(self):
        with self.lock:
            conns = list(self.conns.values())
        for conn in conns:
            try:
                conn.sendall(b"shutdown\n")
            except OSError:
                pass


class DistClient:
    def __init__(self, addr, node_rank, timeout, on_shutdown):
        self.host, self.port = _parse_addr(addr)
        self.node_rank = node_rank
        self.timeout = timeout
        self.on_shutdown = on_shutdown
        self.sock = None

    def connect(self):
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                self.sock = socket.create_connection((self.host, self.port), timeout=5)
                self.sock.settimeout(None)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"Timed out after {int(self.timeout)} seconds connecting to rank 0 at "
                        f"{self.host}:{self.port} (--dist-init-addr)")
                time.sleep(0.2)
        self.sock.sendall(f"hello {self.node_rank}\n".encode())
        threading.Thread(target=self._listen, name="dist-listen", daemon=True).start()

    def send_ready(self):
        try:
            self.sock.sendall(b"ready\n")
        except OSError:
            pass

    def _listen(self):
        buf = b""
        while True:
            try:
                data = self.sock.recv(4096)
            except OSError:
                data = b""
            if not data:
                logger.error("[node_rank %s] Connection to rank 0 at %s:%s lost without a ShutdownReq; the "
                             "schedulers keep running (and keep their GPUs).", self.node_rank, self.host, self.port)
                return
            buf += data
            if b"shutdown\n" in buf:
                self.on_shutdown()
                return
