# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The preflight's image (managers docker and podman, issue 24): found or pulled before anything is touched.

A pull of a 30 GB image takes minutes: it must never happen inside the outage. The preflight finds the image on the
node, or pulls it (the container option ``pull``: missing, always, never), refuses a missing image or one for another
architecture with the fix, and records what the launch runs: the image ID (a moved tag does not change what a
rollback starts) and the repository digest when the image has one. In check mode nothing is pulled: a missing image is
a note ("would pull").
"""

from __future__ import annotations

import time

from ansible_collections.gpufleet.sglang.plugins.module_utils.common import names as names_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import images
from ansible_collections.gpufleet.sglang.plugins.module_utils.server.container_control import MANAGERS, options

PULL_TIMEOUT = 3600.0
# The pull's last lines kept for the plan (its progress; the whole output goes nowhere else).
PULL_LINES = 20


def check_image(pf, manager):
    """``pf``: the Preflight (p, module, names, problem, notes, check_mode). Returns the plan's image dict
    ``{ref, id, digest, words, architecture, pulled, pull_s, cli}`` or None (not a container, or a problem noted)."""
    if manager not in MANAGERS:
        return None
    p = pf.p
    try:
        opts = options(p.get("container"))
    except ValueError as exc:
        pf.problem("%s: %s (nothing was touched)" % (pf.names.of("container"), exc))
        return None
    ref = p.get("image")
    if not ref:
        pf.problem("%s: not set; the %s manager runs the server from an image: set a tag or a digest such as "
                   "lmsysorg/sglang:v%s-cu129 (nothing was touched)" % (pf.names.of("image"), manager, p["version"]))
        return None
    cli = pf.module.get_bin_path(manager, required=False)
    if not cli:
        pf.problem("%s: %s is not installed on this node (or not in PATH); install it, or choose another manager "
                   "(nothing was touched)" % (pf.names.of("manager"), manager))
        return None

    def run(argv):
        return pf.module.run_command(argv)

    policy = opts["pull"]
    if pf.check_mode and policy != "never":
        try:
            found = images.inspect(run, cli, ref)
        except images.ImageError as exc:
            # The runtime could not say (not: the image is absent); images.check words a real run's refusal the same way.
            pf.problem("%s: %s (nothing was touched)" % (pf.names.of("image"), exc))
            return None
        if found is None:
            pf.notes.append("%s: %s is not on this node; a real run pulls it in the preflight, before anything is touched"
                            % (pf.names.of("image"), ref))
            return {"ref": ref, "id": None, "digest": None, "words": "%s (to pull)" % ref, "architecture": None,
                    "pulled": False, "pull_s": None, "cli": cli}
        policy = "never"
    lines = []

    def on_line(line):
        lines.append(line)
        del lines[:-PULL_LINES]

    t0 = time.monotonic()
    # images.check names the pull policy "pull_policy": here it is the container option's field "pull".
    names = names_mod.Names(dict(pf.names.labels, pull_policy=pf.names.of("container", "pull")))
    res = images.check(run, cli, ref, policy, PULL_TIMEOUT, on_line=on_line, names=names)
    if not res.get("ok"):
        pf.problem("%s (nothing was touched)" % res.get("error"))
        return None
    info = res["image"]
    out = {"ref": ref, "id": images.run_ref(info), "digest": info.get("digest"), "words": images.describe(info),
           "architecture": info.get("architecture"), "pulled": bool(res.get("pulled")),
           "pull_s": round(time.monotonic() - t0, 3) if res.get("pulled") else None, "cli": cli}
    if out["pulled"]:
        pf.notes.append("pulled %s in %.0f s, before anything was touched" % (out["words"], out["pull_s"]))
        out["pull_log"] = list(lines)
    return out


def launch_fields(image):
    """The launch params of the plan's image: what runs (the ID), the reference asked for, the digest."""
    if not image:
        return {}
    return {"image": image.get("id") or image["ref"], "image_ref": image["ref"], "image_digest": image.get("digest")}


def model_mounts(args):
    """The read-only mounts the oracle needs to read the model's config inside the image."""
    out = []
    for key in ("model_path", "tokenizer_path", "speculative_draft_model_path"):
        value = (args or {}).get(key)
        if isinstance(value, str) and value.startswith("/") and value not in out:
            out.append(value)
    return out
