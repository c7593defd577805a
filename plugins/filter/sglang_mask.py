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
    in clear (sglang.md section 2.1), so pass server info through this filter before showing it.
  - In lists of strings (argv, numbers allowed among them), the value after a secret flag such as
    C(--api-key) is masked, and so is the value part of C(--api-key=VALUE).
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

from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang_process import MASK, is_secret_name, mask_argv, mask_text


def mask(value):
    """Return ``value`` with secrets masked (recursively).

    The rules are the collection's single implementation in
    ``module_utils/sglang_process.py``: secret-named keys (``is_secret_name``),
    secret flags in argv lists (``mask_argv``) and ``key='value'`` or
    ``--api-key VALUE`` inside free text (``mask_text``).
    """
    if isinstance(value, dict):
        return {k: (MASK if is_secret_name(k) and value[k] not in (None, "", False) else mask(v)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if any(isinstance(v, str) for v in value) and not any(isinstance(v, (dict, list, tuple)) for v in value):
            # An argv list, possibly with numbers in it (``['--port', 30000, '--api-key', KEY]``):
            # masked as text, non-strings kept as they are unless they are a secret flag's value.
            masked = mask_argv([str(v) for v in value])
            return [m if isinstance(v, str) or m != str(v) else v for v, m in zip(value, masked)]
        return [mask(v) for v in value]
    if isinstance(value, str):
        return mask_text(value)
    return value


class FilterModule:
    """gpufleet.sglang secret masking."""

    def filters(self):
        return {"sglang_mask": mask}
