# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filters ``gpufleet.sglang.sglang_resolve`` and ``gpufleet.sglang.sglang_argv``.

Documentation lives in the sidecar files ``sglang_resolve.yml`` and
``sglang_argv.yml``. All SGLang logic is in
``plugins/module_utils/sglang/`` (``resolve`` and ``render``); these wrappers
only validate input and turn malformed input into AnsibleFilterError.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.render import to_argv
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.resolve import (
    DEFAULT_POLICY,
    POLICIES,
    resolve,
)
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.versions import (
    DEFAULT_VERSION,
    parse_version,
)


def _type_name(value):
    """The plain type name, also for Ansible's lazy and tagged subclasses."""
    for plain in (bool, int, float, str, bytes):
        if isinstance(value, plain):
            return plain.__name__
    if isinstance(value, Mapping):
        return "dict"
    if isinstance(value, Sequence):
        return "list"
    return type(value).__name__


def _describe(value):
    return "%r (type %s)" % (value, _type_name(value))


def _check_args(name, args):
    if not isinstance(args, Mapping):
        raise AnsibleFilterError(
            "%s: the input must be a dict of SGLang arguments (field name -> value), got %s" % (name, _describe(args))
        )


def _check_version(name, version):
    try:
        parse_version(version)
    except ValueError as exc:
        raise AnsibleFilterError("%s: invalid version %s: %s" % (name, _describe(version), exc))


def sglang_resolve(args, version=DEFAULT_VERSION, policy=DEFAULT_POLICY, arch=None, draft_arch=None, env=None, gpu=None):
    """Resolve SGLang arguments as SGLang ``version`` would; see sglang_resolve.yml."""
    _check_args("sglang_resolve", args)
    _check_version("sglang_resolve", version)
    if policy not in POLICIES:
        raise AnsibleFilterError(
            "sglang_resolve: unknown policy %s; use one of %s" % (_describe(policy), ", ".join(POLICIES))
        )
    for option, value in (("arch", arch), ("draft_arch", draft_arch)):
        if value is not None and not isinstance(value, str):
            raise AnsibleFilterError(
                "sglang_resolve: %s must be a string such as 'LlamaForCausalLM' (architectures[0] of the model's "
                "config.json), got %s" % (option, _describe(value))
            )
    if env is not None and not isinstance(env, Mapping):
        raise AnsibleFilterError(
            "sglang_resolve: env must be a dict of the server's environment variables, got %s" % _describe(env)
        )
    if gpu is not None and not isinstance(gpu, Mapping):
        raise AnsibleFilterError(
            "sglang_resolve: gpu must be a dict {name, compute_capability, memory_mib, count} as nvidia-smi reports "
            "them, got %s" % _describe(gpu)
        )
    try:
        return resolve(dict(args), version=version, arch=arch, policy=policy, draft_arch=draft_arch,
                       env=dict(env) if env is not None else None, gpu=dict(gpu) if gpu is not None else None)
    except ValueError as exc:
        raise AnsibleFilterError("sglang_resolve: %s" % exc)


def sglang_argv(args, version=DEFAULT_VERSION, secrets="include"):
    """Render SGLang arguments as an argv token list; see sglang_argv.yml."""
    _check_args("sglang_argv", args)
    _check_version("sglang_argv", version)
    try:
        return to_argv(dict(args), version=version, secrets=secrets)
    except ValueError as exc:
        raise AnsibleFilterError("sglang_argv: %s" % exc)


class FilterModule(object):
    """SGLang argument filters."""

    def filters(self):
        return {
            "sglang_resolve": sglang_resolve,
            "sglang_argv": sglang_argv,
        }
