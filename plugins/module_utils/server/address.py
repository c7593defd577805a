# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Where a server is reached: the probe host of a bind address, the base URL, whether its port answers."""

from __future__ import annotations

import socket

WILDCARD_HOSTS = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1", "[::]": "::1"}


def probe_host(host):
    host = (host or "").strip()
    if host in WILDCARD_HOSTS:
        return WILDCARD_HOSTS[host]
    return host.strip("[]")


def base_url(host, port, tls=False):
    """The URL the collection calls the server at: https when its args turn TLS on (ssl_certfile)."""
    host = probe_host(host)
    if ":" in host:
        host = "[%s]" % host
    return "%s://%s:%d" % ("https" if tls else "http", host, port)


def port_in_use(host, port, timeout=0.5):
    try:
        infos = socket.getaddrinfo(probe_host(host), port, 0, socket.SOCK_STREAM)
    except socket.gaierror:
        return False
    for family, socktype, proto, _canon, addr in infos:
        sock = socket.socket(family, socktype, proto)
        sock.settimeout(timeout)
        try:
            sock.connect(addr)
            return True
        except OSError:
            continue
        finally:
            sock.close()
    return False
