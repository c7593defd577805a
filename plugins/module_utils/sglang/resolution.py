# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The preflight's resolution: the node's own SGLang when it can answer, the mirror otherwise.

A thin layer over ``resolve.plan_resolution`` (policy + oracle) that the ``sglang_preflight`` module
calls; it only adapts the module's options and guarantees the result keys the plan and the report use:
``args`` (what is rendered), ``effective`` (what the server will run), ``adjustments``, ``errors``,
``notes``, ``source`` (``node`` or ``mirror``) and ``fallback`` (why the node did not answer).
"""

from __future__ import annotations

from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import resolve as resolve_mod


def resolve_for_node(args, version, arch=None, policy="honor_draft_tokens", draft_arch=None, env=None, gpu=None,
                     source="auto", python="python3", timeout=120.0):
    planner = getattr(resolve_mod, "plan_resolution", None)
    if planner is not None:
        oracle = None
        if source != "mirror":
            try:
                from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import oracle as oracle_mod
            except ImportError:  # pragma: no cover - the oracle ships with this package
                oracle_mod = None
            if oracle_mod is not None:
                def _ask_node(resolve_args, resolve_version, resolve_gpu, resolve_env=None):
                    return oracle_mod.resolve_on_node(python, resolve_args, resolve_version, resolve_gpu,
                                                      env=resolve_env if resolve_env is not None else env, timeout=timeout)
                oracle = _ask_node
        result = planner(args, version=version, arch=arch, policy=policy, gpu=gpu, draft_arch=draft_arch, env=env,
                         oracle=oracle, oracle_policy=source)
    else:
        result = resolve_mod.resolve(args, version=version, arch=arch, policy=policy, draft_arch=draft_arch, env=env)
        result["source"] = "mirror"
        result["fallback"] = None if source == "mirror" else "this collection version has no node-side resolution"
        if source == "node":
            result.setdefault("errors", []).append(
                "sglang_resolution: node was asked for, but this collection version cannot run the node's SGLang; use auto or mirror")
    result.setdefault("effective", result.get("args"))
    result.setdefault("errors", [])
    result.setdefault("notes", [])
    result.setdefault("adjustments", [])
    result.setdefault("fallback", None)
    return result
