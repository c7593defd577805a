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

HTTPS (a server started with ``ssl_certfile``, a router with ``--tls-cert-path``):
``https://`` URLs use the TLS settings given to :func:`configure_tls` (once per
module run, from the ``tls_ca_path``, ``tls_client_cert``, ``tls_client_key``
and ``validate_certs`` options of the ``gpufleet.sglang.tls`` doc fragment), or
``tls=`` of one call. The certificate is validated against the host name of the
URL (the host the collection connects to: ``127.0.0.1`` for a server bound to
``0.0.0.0``). A refused certificate raises :class:`TLSError`, whose message
names the cause and the option that fixes it.
"""
from __future__ import annotations

import errno
import ipaddress
import json
import os
import socket
import ssl
import urllib.error
import urllib.parse
import urllib.request
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import names as names_mod

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


class TLSError(HTTPConnectionError):
    """The TLS handshake failed: the certificate was refused (bad CA, expired, wrong host name) or the
    server wants what the client does not have. Retrying does not help; the message names the fix."""

    kind = "tls"


class TLSConfigError(ValueError):
    """A TLS option is unusable (a file that is missing or no PEM certificate/key); raised before any request."""


# The messages name the TLS options, or what the caller calls them (option_labels): see _hint.
_HOST_ERRORS = (62, 64)          # X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH
_DATE_ERRORS = (9, 10)           # X509_V_ERR_CERT_NOT_YET_VALID, X509_V_ERR_CERT_HAS_EXPIRED


def tls_context(ca_path=None, client_cert=None, client_key=None, validate_certs=True):
    """An ``ssl.SSLContext`` for the options. ``ca_path``: a PEM bundle, which replaces the system's CAs; none:
    the system's CAs. Raises TLSConfigError naming the option for a file that is missing or not PEM."""
    for name, path in (("tls_ca_path", ca_path), ("tls_client_cert", client_cert), ("tls_client_key", client_key)):
        if path and not os.path.isfile(path):
            raise TLSConfigError("%s=%s: no such file on the host that makes the HTTPS calls; give the path of a PEM "
                                 "file there" % (name, path))
    if client_key and not client_cert:
        raise TLSConfigError("tls_client_key=%s is given without tls_client_cert; give the client certificate too" % client_key)
    if validate_certs and not ca_path:
        ctx = ssl.create_default_context()
    elif validate_certs:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)   # host name check and CERT_REQUIRED; only the given CAs
        try:
            ctx.load_verify_locations(cafile=ca_path)
        except (ssl.SSLError, ValueError, OSError) as exc:   # OSError: unreadable (permissions)
            raise TLSConfigError("tls_ca_path=%s holds no PEM CA certificate (%s); give the CA bundle that signed "
                                 "the server's certificate" % (ca_path, exc))
    else:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if client_cert:
        try:
            # An empty password: an encrypted key fails here instead of OpenSSL prompting on a terminal.
            ctx.load_cert_chain(client_cert, client_key or None, password=b"")
        except (ssl.SSLError, ValueError, OSError) as exc:
            raise TLSConfigError("tls_client_cert=%s / tls_client_key=%s: not a PEM certificate and its unencrypted key "
                                 "(%s); give the client certificate and its key" % (client_cert, client_key, exc))
    return ctx


def _opener(ctx):
    handlers = [urllib.request.ProxyHandler({})]
    if ctx is not None:
        handlers.append(urllib.request.HTTPSHandler(context=ctx))
    return urllib.request.build_opener(*handlers)


_OPENER = _opener(None)
_TLS = {"settings": None, "opener": _OPENER}


def tls_settings(params):
    """The TLS options out of a module's params (the ``gpufleet.sglang.tls`` doc fragment)."""
    params = params or {}
    return {"ca_path": params.get("tls_ca_path") or None, "client_cert": params.get("tls_client_cert") or None,
            "client_key": params.get("tls_client_key") or None,
            "validate_certs": params.get("validate_certs") is not False, "labels": dict(params.get("option_labels") or {})}


def configure_tls(settings=None):
    """Make ``settings`` (see :func:`tls_settings`) the TLS settings of every later ``https://`` request of this
    process; ``None`` restores the defaults (the system's CAs, validation on). Raises TLSConfigError. Returns a list
    of warnings (validation off)."""
    if not settings:
        _TLS.update(settings=None, opener=_OPENER)
        return []
    ctx = tls_context(settings.get("ca_path"), settings.get("client_cert"), settings.get("client_key"),
                      settings.get("validate_certs", True))
    _TLS.update(settings=dict(settings), opener=_opener(ctx))
    if settings.get("validate_certs", True) is False:
        return ["validate_certs=false: the HTTPS certificates of the server and router are NOT checked, so anyone on the "
                "path can read the API key and the answers; set tls_ca_path to the CA that signed them instead"]
    return []


# The argument spec of the options of the gpufleet.sglang.tls doc fragment.
TLS_ARGSPEC = dict(
    tls_ca_path=dict(type="path"),
    tls_client_cert=dict(type="path"),
    tls_client_key=dict(type="path", no_log=False),
    validate_certs=dict(type="bool", default=True),
)


def configure_module(module):
    """Configure TLS from a module's params, before the module touches anything: fail_json for an unusable option,
    a warning when validation is off. Returns the settings."""
    settings = tls_settings(module.params)
    try:
        warnings = configure_tls(settings)
    except TLSConfigError as exc:
        module.fail_json(msg="%s; nothing was changed" % exc)
    for text in warnings:
        module.warn(text)
    return settings


def _tls_error(url, reason):
    """A TLSError whose message says what to fix."""
    host = urllib.parse.urlsplit(url).hostname
    code = getattr(reason, "verify_code", None)
    detail = getattr(reason, "verify_message", None) or getattr(reason, "reason", None) or str(reason)
    if code in _HOST_ERRORS:
        try:
            san = "IP:%s" % ipaddress.ip_address(host)
        except ValueError:
            san = "DNS:%s" % host
        fix = ("the server's certificate is not valid for %s, the host the collection connects to (127.0.0.1 when the "
               "server binds 0.0.0.0 or ::); reissue it with subjectAltName %s, or set the server's host arg to a name "
               "the certificate carries" % (host, san))
    elif code in _DATE_ERRORS:
        fix = ("the server's certificate is outside its validity dates (%s); renew the certificate (ssl_certfile on the "
               "server) and restart it" % detail)
    elif code is not None:
        fix = ("the server's certificate does not chain to a trusted CA (%s); set %s to the CA bundle that signed the "
               "server's certificate" % (detail, _hint("tls_ca_path")))
    elif "CERTIFICATE_REQUIRED" in str(detail).upper() or "certificate required" in str(reason):
        fix = "the server asks for a client certificate; set %s" % _hint("tls_client_cert", "tls_client_key")
    elif "WRONG_VERSION_NUMBER" in str(detail).upper() or "wrong version number" in str(reason):
        fix = "the server at %s does not speak TLS; remove ssl_certfile from its args or use an http:// URL" % host
    else:
        fix = ("TLS handshake failed (%s); check the certificates: %s for the server's CA, and %s when the server asks "
               "for a client certificate" % (reason, _hint("tls_ca_path"), _hint("tls_client_cert", "tls_client_key")))
    return TLSError(url, fix)


def _hint(*options):
    """The options to set, as the module's caller calls them (its option_labels, kept by configure_tls)."""
    names = names_mod.Names((_TLS["settings"] or {}).get("labels"))
    return "/".join(names.of(option) for option in options)


def _classify(url, exc):
    """Map a low-level exception to one of the HTTPConnectionError classes."""
    reason = getattr(exc, "reason", exc)
    if isinstance(reason, ssl.SSLError) or isinstance(exc, ssl.SSLError):
        return _tls_error(url, reason if isinstance(reason, ssl.SSLError) else exc)
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


def request(method, url, body=None, api_key=None, timeout=DEFAULT_TIMEOUT, headers=None, tls=None):
    """Send one HTTP request and return ``(status, headers, data)``.

    ``body`` may be a dict/list (sent as JSON), a str or bytes. ``data`` is the
    parsed JSON when the answer is JSON, else the text. ``headers`` in the
    result is a plain dict with lower-case names.

    ``tls``: TLS settings (:func:`tls_settings`) for this call; default: the ones of :func:`configure_tls`.

    Raises ConnectionRefused, RequestTimeout, Unreachable, TLSError or
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
        opener = _opener(tls_context(tls.get("ca_path"), tls.get("client_cert"), tls.get("client_key"),
                                     tls.get("validate_certs", True))) if tls else _TLS["opener"]
        resp = opener.open(req, timeout=timeout)
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
