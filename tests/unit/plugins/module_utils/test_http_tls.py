"""common/http.py over TLS, against an in-process HTTPS server with certificates made at test time
(tests/integration/tls_certs.py): validation against the given CA, the messages that name the fix, client
certificates (mutual TLS), validate_certs=false and its warning, unusable options refused up front."""
from __future__ import annotations

import http.server
import pathlib
import ssl
import sys
import threading

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils.common import http as client

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "integration"))
import tls_certs  # noqa: E402


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        peer = self.connection.getpeercert() if hasattr(self.connection, "getpeercert") else None
        body = b'{"client": %s}' % (b'"yes"' if peer else b"null")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class _TLSServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, ctx):
        self.ctx = ctx
        super().__init__(("127.0.0.1", 0), _Handler)

    def finish_request(self, request, client_address):
        try:
            request = self.ctx.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError):
            return
        super().finish_request(request, client_address)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return tls_certs.make(str(tmp_path_factory.mktemp("pki")))


@pytest.fixture(scope="module")
def serve(certs):
    """``serve(name, client_ca=None)``: the base URL of an HTTPS server with the ``name`` certificate; with
    ``client_ca`` it requires a client certificate signed by it."""
    started = []

    def _serve(name, client_ca=None):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(certs[name + "_cert"], certs[name + "_key"])
        if client_ca:
            ctx.load_verify_locations(client_ca)
            ctx.verify_mode = ssl.CERT_REQUIRED
            # TLS 1.2: the client certificate is checked inside the handshake, so a client without one always gets
            # the handshake alert (with TLS 1.3 it may see the alert or a closed connection, depending on timing).
            ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        server = _TLSServer(ctx)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        started.append(server)
        return "https://127.0.0.1:%d" % server.server_address[1]

    yield _serve
    for server in started:
        server.shutdown()
        server.server_close()


@pytest.fixture(autouse=True)
def reset_tls():
    yield
    client.configure_tls(None)


def _get(url, **settings):
    return client.request("GET", url + "/x", timeout=5, tls=client.tls_settings(settings) if settings else None)


def test_valid_certificate_with_its_ca(serve, certs):
    status, _h, data = _get(serve("server"), tls_ca_path=certs["ca"])
    assert status == 200 and data == {"client": None}


def test_configure_tls_is_the_default_of_later_requests(serve, certs):
    url = serve("server")
    with pytest.raises(client.TLSError):          # the system CAs do not know the test CA
        _get(url)
    assert client.configure_tls(client.tls_settings({"tls_ca_path": certs["ca"]})) == []
    assert _get(url)[0] == 200
    client.configure_tls(None)
    with pytest.raises(client.TLSError):
        _get(url)


@pytest.mark.parametrize("name, ca, words", [
    ("server", "other_ca", ["does not chain to a trusted CA", "set tls_ca_path to the CA bundle",
                            "CA bundle that signed the server's certificate"]),
    ("expired", "ca", ["certificate has expired", "renew the certificate"]),
    ("wrong_host", "ca", ["not valid for 127.0.0.1", "subjectAltName IP:127.0.0.1", "set the server's host arg"]),
])
def test_refused_certificates_name_the_fix(serve, certs, name, ca, words):
    with pytest.raises(client.TLSError) as info:
        _get(serve(name), tls_ca_path=certs[ca])
    assert info.value.kind == "tls" and isinstance(info.value, client.HTTPConnectionError)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_a_refused_certificate_names_the_callers_label_for_the_option(serve, certs):
    """configure_tls keeps the module's option_labels: the fix names what the caller calls tls_ca_path."""
    url = serve("server")
    try:
        client.configure_tls(client.tls_settings({"tls_ca_path": certs["other_ca"],
                                                  "option_labels": {"tls_ca_path": "sglang_server_tls_ca_path"}}))
        with pytest.raises(client.TLSError) as info:
            client.request("GET", url + "/x", timeout=5)
        assert "set sglang_server_tls_ca_path to the CA bundle" in str(info.value), str(info.value)
        client.configure_tls(client.tls_settings({"tls_ca_path": certs["other_ca"]}))
        with pytest.raises(client.TLSError) as info:
            client.request("GET", url + "/x", timeout=5)
        assert "set tls_ca_path to the CA bundle" in str(info.value) and "sglang_" not in str(info.value)
    finally:
        client.configure_tls(None)


def test_client_certificate_for_mutual_tls(serve, certs):
    url = serve("server", client_ca=certs["ca"])
    status, _h, data = _get(url, tls_ca_path=certs["ca"], tls_client_cert=certs["client_cert"],
                            tls_client_key=certs["client_key"])
    assert status == 200 and data == {"client": "yes"}
    with pytest.raises(client.TLSError) as info:    # no client certificate: refused by the server, with the fix
        _get(url, tls_ca_path=certs["ca"])
    assert "when the server asks for a client certificate" in str(info.value), info.value
    assert "tls_client_cert/tls_client_key" in str(info.value), info.value


def test_validate_certs_false_accepts_anything_and_warns(serve, certs):
    warnings = client.configure_tls(client.tls_settings({"validate_certs": False}))
    assert len(warnings) == 1 and "validate_certs=false" in warnings[0] and "NOT checked" in warnings[0]
    assert _get(serve("wrong_host"))[0] == 200
    assert _get(serve("expired"))[0] == 200


def test_unusable_options_are_refused_before_any_request(certs, tmp_path):
    missing = str(tmp_path / "nope.pem")
    with pytest.raises(client.TLSConfigError, match="tls_ca_path=%s: no such file" % missing):
        client.configure_tls(client.tls_settings({"tls_ca_path": missing}))
    with pytest.raises(client.TLSConfigError, match="holds no PEM CA certificate"):
        client.configure_tls(client.tls_settings({"tls_ca_path": certs["client_key"]}))
    with pytest.raises(client.TLSConfigError, match="without tls_client_cert"):
        client.configure_tls(client.tls_settings({"tls_client_key": certs["client_key"]}))
    # An encrypted key is refused (OpenSSL would otherwise prompt for its password on a terminal).
    with pytest.raises(client.TLSConfigError, match="tls_client_cert="):
        client.configure_tls(client.tls_settings({"tls_client_cert": certs["server_cert"],
                                                  "tls_client_key": certs["server_key_encrypted"]}))
