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
  - In dicts (at any depth), a value is secret when its key names a key, token, secret or password,
    for example C(api_key), C(admin_api_key) or C(hf_token). SGLang's C(/server_info) returns C(api_key)
    in clear (sglang.md section 2.1), so pass server info through this filter before showing it.
  - In lists of strings (argv), the value after a secret flag such as C(--api-key) is masked, and so
    is the value part of C(--api-key=VALUE).
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

import re

MASK = "********"
_SECRET_KEY = re.compile(r"(^|_|-)(api_?key|key|token|secret|password|passwd)($|_|-)", re.IGNORECASE)
_SECRET_FLAG = re.compile(r"^--[a-z0-9-]*(api-key|token|secret|password)$", re.IGNORECASE)


def _is_secret_key(key):
    return isinstance(key, str) and bool(_SECRET_KEY.search(key))


def mask(value):
    """Return ``value`` with secrets masked (recursively)."""
    if isinstance(value, dict):
        return {k: (MASK if _is_secret_key(k) and v not in (None, "") else mask(v)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        out = []
        hide_next = False
        for item in value:
            if hide_next and isinstance(item, str):
                out.append(MASK)
                hide_next = False
                continue
            hide_next = False
            if isinstance(item, str):
                flag, sep = item.partition("=")[:2]
                if sep and _SECRET_FLAG.match(flag):
                    out.append(flag + "=" + MASK)
                    continue
                if _SECRET_FLAG.match(item):
                    hide_next = True
                out.append(item)
            else:
                out.append(mask(item))
        return out
    return value


class FilterModule:
    """gpufleet.sglang secret masking."""

    def filters(self):
        return {"sglang_mask": mask}
