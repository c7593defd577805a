"""Certificates made at test time (cryptography): a CA, server certificates good, expired and for another host,
a second (untrusted) CA, and a client certificate for mutual TLS. ``make(dir)`` writes them as PEM files and
returns their paths by name."""
from __future__ import annotations

import datetime
import ipaddress
import os

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

KEY_PASSWORD = "tls-key-pass-5e3b9"   # the encrypted server key's password (a secret the tests look for)


def _name(cn):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _key():
    return ec.generate_private_key(ec.SECP256R1())


def _ca(cn, now):
    key = _key()
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn)).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return key, cert


def _leaf(ca_key, ca_cert, cn, sans, before, after, usage):
    key = _key()
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(before).not_valid_after(after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
    if sans:
        cert = cert.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return key, cert.sign(ca_key, hashes.SHA256())


def _write(path, data):
    with open(path, "wb") as fh:
        fh.write(data)
    os.chmod(path, 0o600)
    return str(path)


def _pem_key(key, password=None):
    algo = serialization.BestAvailableEncryption(password.encode()) if password else serialization.NoEncryption()
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, algo)


def make(directory):
    """Write the certificates under ``directory``; ``{name: path}``:

    ca, other_ca: CA certificates; server_cert/server_key: for IP:127.0.0.1 and DNS:localhost, signed by ca;
    server_key_encrypted: server_key encrypted with KEY_PASSWORD; expired_cert/expired_key: like server, expired
    yesterday; wrong_host_cert/wrong_host_key: for DNS:gpu-node-7.example only; client_cert/client_key: a client
    certificate signed by ca."""
    os.makedirs(str(directory), exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    day = datetime.timedelta(days=1)
    ca_key, ca = _ca("gpufleet test CA", now)
    _other_key, other_ca = _ca("gpufleet other CA", now)
    local = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    server = ExtendedKeyUsageOID.SERVER_AUTH
    out = {"ca": _write(os.path.join(directory, "ca.pem"), ca.public_bytes(serialization.Encoding.PEM)),
           "other_ca": _write(os.path.join(directory, "other-ca.pem"), other_ca.public_bytes(serialization.Encoding.PEM))}
    leaves = {
        "server": _leaf(ca_key, ca, "127.0.0.1", local, now - day, now + 30 * day, server),
        "expired": _leaf(ca_key, ca, "127.0.0.1", local, now - 30 * day, now - day, server),
        "wrong_host": _leaf(ca_key, ca, "gpu-node-7.example", [x509.DNSName("gpu-node-7.example")], now - day,
                            now + 30 * day, server),
        "client": _leaf(ca_key, ca, "gpufleet controller", None, now - day, now + 30 * day, ExtendedKeyUsageOID.CLIENT_AUTH),
    }
    for name, (key, cert) in leaves.items():
        out[name + "_cert"] = _write(os.path.join(directory, name + ".crt"), cert.public_bytes(serialization.Encoding.PEM))
        out[name + "_key"] = _write(os.path.join(directory, name + ".key"), _pem_key(key))
    out["server_key_encrypted"] = _write(os.path.join(directory, "server-enc.key"), _pem_key(leaves["server"][0], KEY_PASSWORD))
    return out
