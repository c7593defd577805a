# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: sglang_mask
short_description: Mask secrets in SGLang arguments, server info and argv lists
version_added: 0.1.0
author: gpufleet maintainers (@gpufleet)
description:
  - Returns a copy of the input with every secret value replaced by V(********).
  - In dicts (at any depth), a value is secret when the last part of its key is C(key), C(token),
    C(secret), C(password) or similar, or any part names a password or secret, for example C(api_key),
    C(admin_api_key) or C(hf_token); C(speculative_token_map) is not a secret. SGLang's C(/server_info) returns C(api_key)
    in clear (docs/reference/sglang-processes.md, Secrets), so pass server info through this filter before showing it.
  - In lists of strings (argv, numbers allowed among them), the value after a secret flag such as
    C(--api-key), C(--hf-token) or C(--admin-api-key) is masked, and so is the value part of C(--api-key=VALUE).
  - Inside strings, C(key='value') assignments with a secret key, C(--api-key VALUE), C(HF_TOKEN=VALUE)
    environment words, passwords and tokens inside URLs (C(https://user:pw@host), C(?token=...)) and
    C(Bearer) tokens are masked.
  - The rules are the collection's one set, shared with every module and the report.
positional: _input
options:
  _input:
    description: A dict, a list (for example an argv list) or a string.
    type: raw
    required: true
"""

EXAMPLES = r"""
- name: Show the running server's config without its API key
  ansible.builtin.debug:
    msg: "{{ server_info | gpufleet.sglang.sglang_mask }}"

- name: Show an argv list safely
  ansible.builtin.debug:
    msg: "{{ ['--port', '30000', '--api-key', 's3cret'] | gpufleet.sglang.sglang_mask }}"
    # -> ['--port', '30000', '--api-key', '********']
"""

RETURN = r"""
_value:
  description: The input with secrets replaced by V(********).
  type: raw
"""

from ansible_collections.gpufleet.sglang.plugins.module_utils.common import secrets


def mask(value):
    """Return ``value`` with secrets masked (recursively).

    The rules are the collection's single implementation,
    ``module_utils/common/secrets.py`` (``secrets.redact``): secret-named keys,
    secret flags in argv lists, ``key='value'``, ``--api-key VALUE``,
    ``HF_TOKEN=VALUE`` and URL tokens inside strings.
    """
    return secrets.redact(value)


class FilterModule:
    """gpufleet.sglang secret masking."""

    def filters(self):
        return {"sglang_mask": mask}
