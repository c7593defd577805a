# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Tiny standard-library HTTP client for talking to SGLang servers and routers.

``request()`` never raises for an HTTP status: a 404 or a 503 is an answer and
comes back as ``(status, headers, body)``. It raises only when no answer came
back at all, with the cause told apart (refused, timed out, unreachable), so a
health poll can keep waiting on "refused" and report the last cause on timeout.

Proxies are never used: the opener carries an empty ``ProxyHandler``, so
``http_proxy``/``https_proxy``/``no_proxy`` in the environment cannot route a
probe of ``127.0.0.1`` through a corporate proxy.

The API key, when given, is only ever sent as an ``Authorization: Bearer``
header; it is never put into the URL, and error messages never contain it.
"""
from __future__ import annotations

import errno
import json
import socket
import urllib.error
import urllib.request

DEFAULT_TIMEOUT = 10.0
USER_AGENT = "gpufleet.sglang"


class HTTPConnectionError(Exception):
    """No HTTP answer came back. ``kind`` is one of ``refused``, ``timeout``,
    ``unreachable`` or ``error``; ``url`` is the URL that was asked."""

    kind = "error"

    def __init__(self, url, reason):
        self.url = url
        self.reason = reason
        super().__init__("%s %s: %s" % (self.kind, url, reason))


class ConnectionRefused(HTTPConnectionError):
    """Nothing listens on the port (yet)."""

    kind = "refused"


class RequestTimeout(HTTPConnectionError):
    """Connected (or tried to) but no complete answer within the timeout."""

    kind = "timeout"


class Unreachable(HTTPConnectionError):
    """The address cannot be reached or resolved."""

    kind = "unreachable"


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _classify(url, exc):
    """Map a low-level exception to one of the HTTPConnectionError classes."""
    reason = getattr(exc, "reason", exc)
    if isinstance(reason, (socket.timeout, TimeoutError)):
        return RequestTimeout(url, "timed out")
    if isinstance(reason, ConnectionRefusedError):
        return ConnectionRefused(url, "connection refused")
    if isinstance(reason, (ConnectionResetError, BrokenPipeError)):
        # The listener went away mid-request (a server dying during start-up).
        return ConnectionRefused(url, "connection reset")
    if isinstance(reason, socket.gaierror):
        return Unreachable(url, "cannot resolve host: %s" % reason)
    if isinstance(reason, OSError) and reason.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL):
        return Unreachable(url, str(reason))
    return HTTPConnectionError(url, str(reason))


def _decode(raw, content_type):
    text = raw.decode("utf-8", errors="replace")
    if "json" in (content_type or "") or text[:1] in ("{", "["):
        try:
            return json.loads(text)
        except ValueError:
            return text
    return text


def request(method, url, body=None, api_key=None, timeout=DEFAULT_TIMEOUT, headers=None):
    """Send one HTTP request and return ``(status, headers, data)``.

    ``body`` may be a dict/list (sent as JSON), a str or bytes. ``data`` is the
    parsed JSON when the answer is JSON, else the text. ``headers`` in the
    result is a plain dict with lower-case names.

    Raises ConnectionRefused, RequestTimeout, Unreachable or
    HTTPConnectionError when no HTTP answer was received.
    """
    send_headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
    if headers:
        send_headers.update(headers)
    data = None
    if body is not None:
        if isinstance(body, (dict, list)):
            data = json.dumps(body).encode("utf-8")
            send_headers.setdefault("Content-Type", "application/json")
        elif isinstance(body, str):
            data = body.encode("utf-8")
        else:
            data = body
    if api_key:
        send_headers["Authorization"] = "Bearer %s" % api_key
    req = urllib.request.Request(url, data=data, headers=send_headers, method=method.upper())
    try:
        resp = _OPENER.open(req, timeout=timeout)
    except urllib.error.HTTPError as exc:
        try:
            raw = exc.read()
        except Exception:  # the error body is optional
            raw = b""
        hdrs = {k.lower(): v for k, v in (exc.headers or {}).items()}
        return exc.code, hdrs, _decode(raw, hdrs.get("content-type"))
    except (urllib.error.URLError, OSError) as exc:
        raise _classify(url, exc) from None
    except Exception as exc:  # http.client.HTTPException (bad status line, ...) is no OSError
        raise HTTPConnectionError(url, "%s: %s" % (type(exc).__name__, exc)) from None
    try:
        with resp:
            raw = resp.read()
            hdrs = {k.lower(): v for k, v in resp.headers.items()}
            status = resp.status
    except OSError as exc:
        raise _classify(url, exc) from None
    except Exception as exc:  # http.client.IncompleteRead and friends
        raise HTTPConnectionError(url, "%s: %s" % (type(exc).__name__, exc)) from None
    return status, hdrs, _decode(raw, hdrs.get("content-type"))
