# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The option_labels option of the modules whose messages name their options (module_utils/common/names.py)."""
from __future__ import annotations


class ModuleDocFragment(object):
    # sglang_launch, sglang_preflight, sglang_replace, sglang_promote, sglang_smoke, sglang_weights,
    # sglang_router_worker, sglang_prefetch, sglang_textfile.
    DOCUMENTATION = r"""
options:
  option_labels:
    description:
      - What the caller calls this module's options, for the messages. A message about an option names it by the
        option's name (V(args.tp_size), V(cache_dir), V(adopt_pids)) unless this maps the option to another name.
      - The roles pass their variable names here (for example C(args) to C(sglang_server_args)), so a message read
        by an operator names the variable to fix (C(sglang_server_args.tp_size)).
      - Keys are option names of this module (or names the module's messages use for a role's input, such as
        C(host_args)), values the labels. An option not listed keeps its own name.
    type: dict
    default: {}
"""
