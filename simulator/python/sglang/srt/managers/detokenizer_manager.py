"""Detokenizer child process (``sglang::detokenizer``); holds no GPU memory.

It arms PDEATHSIG like the real one (detokenizer_manager.py:545-551) and
waits until its parent asks it to stop or goes away.
"""
from __future__ import annotations

import os
import socket
import sys

from sglang.srt.managers.scheduler import child_bootstrap


def run_detokenizer_process():
    cfg, chan = child_bootstrap()
    # attention DP: ZMQ over TCP, the detokenizer binds port_base + 1 (entrypoints/ports.py)
    from sglang.srt.entrypoints.ports import listen

    bound = [listen(host, int(port)) for host, port in cfg.get("bind") or ()]
    while True:
        try:
            msg = chan.recv(timeout=None)
        except socket.timeout:
            continue
        except OSError:
            msg = None
        if msg is None or msg.get("cmd") == "shutdown":
            break
    for sock in bound:
        sock.close()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    run_detokenizer_process()
