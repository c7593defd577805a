# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The TLS options of every module that calls an SGLang server or a router (module_utils/common/http.py)."""
from __future__ import annotations


class ModuleDocFragment(object):
    # sglang_launch, sglang_preflight, sglang_replace, sglang_promote, sglang_smoke, sglang_weights, sglang_router_worker.
    DOCUMENTATION = r"""
options:
  tls_ca_path:
    description:
      - PEM bundle of the CA(s) that signed the HTTPS certificates of the server (and router), on the host that makes
        the calls. When set, only these CAs are trusted; unset, the system's CA store is used.
      - HTTPS is used for a server whose args set C(ssl_certfile) (SGLang's C(--ssl-certfile)), and for every
        C(https://) URL given to the module.
      - The certificate must be valid for the host name the module connects to. For a server bound to V(0.0.0.0) or
        V(::) that is V(127.0.0.1), so its certificate needs C(subjectAltName IP:127.0.0.1); otherwise set the
        server's C(host) arg to a name or address the certificate carries.
      - The roles set it from C(sglang_server_tls_ca_path) (the router's from C(sglang_router_tls_ca_path)).
    type: path
  tls_client_cert:
    description:
      - PEM client certificate presented to a server or router that asks for one (mutual TLS, for example smg with
        C(--ca-cert-paths) in front of it). Give O(tls_client_key) with it unless the file holds the key too.
    type: path
  tls_client_key:
    description:
      - PEM private key (unencrypted) of O(tls_client_cert).
    type: path
  validate_certs:
    description:
      - Validate the HTTPS certificates (chain and host name). V(false) turns every check off, which the module
        reports as a warning (anyone on the path can then read the API key and the answers). Prefer O(tls_ca_path).
    type: bool
    default: true
"""
