# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The preflight's resolution: the node's own SGLang when it can answer, the mirror otherwise.

A thin layer over ``resolve.plan_resolution`` (policy, then the node's ``ServerArgs`` through
``oracle.resolve_on_node``) that the ``sglang_preflight`` module calls. It adapts the module's options
and names the result keys the plan, the launch and the report use:

- ``args``: what is rendered to the server's command line (the intended args after the policy);
- ``effective``: what the server will run (the node's answer, or the mirror's prediction);
- ``adjustments``, ``errors``, ``notes``, ``log`` (SGLang's own warning lines), ``disagreements``
  (mirror vs node, per field);
- ``source``: ``node``, ``mirror`` or ``none`` (resolution node was required and the node could not answer);
- ``fallback``: why the node was not asked or did not answer (None when it answered, or for ``mirror``).
"""

from __future__ import annotations

import os
import shutil

from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import oracle as oracle_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import resolve as resolve_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import versions as versions_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.common.names import PLAIN

SOURCES = ("auto", "node", "mirror")


def _release(version):
    try:
        return versions_mod.parse_version(str(version))[0]
    except ValueError:
        return None


def version_mismatch(declared, answered, python, names=PLAIN):
    """The error line when the node's SGLang is another release than sglang_server_version, else None."""
    if not answered or _release(answered) is None or _release(answered) == _release(declared):
        return None
    return ("%s: %s, but %s has SGLang %s installed; set %s: \"%s\" (flags, "
            "defaults and rules differ between releases, so the plan would describe another server)"
            % (names.of("version"), declared, python, answered, names.of("version"), answered))


def resolve_for_node(args, version, arch=None, policy="honor_draft_tokens", draft_arch=None, env=None, gpu=None,
                     source="auto", python="python3", timeout=120.0, names=PLAIN, image=None, mounts=()):
    """``image``: the plan's image (managers docker and podman): the oracle runs inside it (no GPU, no network)."""
    if source not in SOURCES:
        raise ValueError("resolution must be one of %s, got %r" % (", ".join(SOURCES), source))
    oracle = None
    inner_python = str(python or "python3")         # in an image: its own interpreter, as the container runs it
    if python and not image and not os.path.isabs(str(python)):
        # sglang_server_python may be a bare name: the server finds it on its PATH, so does the oracle.
        found = shutil.which(str(python), path=(env or {}).get("PATH") or os.environ.get("PATH", os.defpath))
        python = found or python
    if source != "mirror" and image:
        def ask_node(rendered):
            return oracle_mod.resolve_in_image(image["cli"], image["id"], rendered, version, gpu, env=env, mounts=mounts,
                                               timeout=timeout, python=inner_python)
        oracle = ask_node
        python = "image %s" % image.get("words")
    elif source != "mirror":
        def ask_node(rendered):
            return oracle_mod.resolve_on_node(python, rendered, version, gpu, env=env, timeout=timeout,
                                              python_label=names.of("python"))
        oracle = ask_node
    planned = resolve_mod.plan_resolution(args, version=version, arch=arch, policy=policy, gpu=gpu,
                                          draft_arch=draft_arch, env=env, oracle=oracle, oracle_policy=source)
    result = {
        "source": planned["source"],
        "fallback": None if source == "mirror" else planned.get("fallback_reason"),
        "args": dict(planned["rendered"]),
        "effective": dict(planned["args"]),
        "adjustments": list(planned.get("adjustments") or []),
        "errors": list(planned.get("errors") or []),
        "notes": list(planned.get("notes") or []),
        "log": list(planned.get("log") or []),
        "disagreements": list(planned.get("disagreements") or []),
        "node_version": None,
    }
    answer = planned.get("node")
    if answer:
        result["node_version"] = answer.get("sglang_version")
        mismatch = version_mismatch(version, answer.get("sglang_version"), python, names)
        if mismatch:
            result["errors"].insert(0, mismatch)
        result["timings"] = dict((k, answer.get(k)) for k in ("import_s", "resolve_s", "elapsed_s"))
    return result
