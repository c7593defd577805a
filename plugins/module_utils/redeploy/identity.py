# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What a launch *is*, and what a redeploy must do: pure functions, table-tested.

A launch's identity is the configuration it runs, compared as a configuration (field by field,
after resolution), never as text or argv order: the SGLang version, the process manager, the
interpreter, the rendered server args, the environment and the working directory. Secret values
(the API key, secret-named env variables) enter the identity only as keyed digests, with a random
salt kept on the node (``<state_dir>/.identity-salt``, 0600), so that no record carries a value from
which a short key could be guessed.

:func:`decide` turns what the preflight found (the running server, the known-good record, the
journal) into the plan's action and its reason (docs/design.md, "The plan").
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os

from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import journal as journal_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import secrets as secret_rules
from ansible_collections.gpufleet.sglang.plugins.module_utils.node.supervise import write_private
from ansible_collections.gpufleet.sglang.plugins.module_utils.common.names import PLAIN

SALT_NAME = ".identity-salt"

NONE = "none"          # the healthy server runs the promoted intended config
VERIFY = "verify"      # the intended config runs but was never promoted: finish the gates, no restart
START = "start"        # nothing of ours runs: launch
RESTART = "restart"    # something else runs on the target: replace it
ACTIONS = (NONE, VERIFY, START, RESTART)


# --------------------------------------------------------------------------
# Identity
# --------------------------------------------------------------------------

def read_salt(state_dir, create=False):
    """The node's identity salt (hex). ``""`` when missing and not ``create`` (nothing was fingerprinted with a salt yet)."""
    path = os.path.join(state_dir, SALT_NAME)
    try:
        with open(path, encoding="ascii") as fh:
            value = fh.read().strip()
        if value:
            return value
    except OSError:
        pass
    if not create:
        return ""
    value = os.urandom(32).hex()
    if not os.path.isdir(state_dir):
        os.makedirs(state_dir, 0o750)
    write_private(path, value + "\n", mode=0o600)
    return value


def secret_digest(salt, value):
    return "hmac-sha256:" + hmac.new(salt.encode("ascii"), str(value).encode("utf-8"), hashlib.sha256).hexdigest()[:32]


def _canon(value):
    """Comparable form: numbers as floats, strings stripped, lists element-wise, dicts sorted."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        value = float(value)
        return None if math.isnan(value) else value
    if isinstance(value, (list, tuple)):
        return [_canon(v) for v in value]
    if isinstance(value, dict):
        return dict((str(k), _canon(v)) for k, v in sorted(value.items(), key=lambda kv: str(kv[0])))
    text = str(value).strip()
    try:
        return float(text) if text and text.lstrip("-").replace(".", "", 1).isdigit() else text
    except ValueError:
        return text


def identity(version, manager, python, args, env=None, chdir=None, salt="", secret_args=(), container=None):
    """The canonical, order-free form of a launch (secrets digested); see the module docstring.

    ``args``: the rendered server args (field -> value; False and None mean "not set").
    ``secret_args``: names of args whose values are secret (the API keys); env variables with a
    secret name are digested too.
    """
    out_args = {}
    for key, value in (args or {}).items():
        key = str(key).strip().lstrip("-").replace("-", "_")
        if value is None or value is False or value == []:
            continue
        if key in secret_args or secret_rules.is_secret_name(key):
            out_args[key] = secret_digest(salt, value)
        else:
            out_args[key] = _canon(value)
    out_env = {}
    for key, value in (env or {}).items():
        key = str(key)
        value = "" if value is None else str(value)
        out_env[key] = secret_digest(salt, value) if secret_rules.is_secret_name(key) else value
    out = {
        "version": str(version),
        "manager": str(manager),
        "python": str(python),
        "args": dict(sorted(out_args.items())),
        "env": dict(sorted(out_env.items())),
        "chdir": chdir or "",
    }
    if container:
        # A container's launch (issue 24): its image ID and run options are part of what runs.
        out["container"] = _canon(container)
    return out


def fingerprint(ident):
    blob = json.dumps(ident, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(blob.encode("utf-8")).hexdigest()


def differences(before, after):
    """``[{field, before, after}]`` between two identities (secret digests show as changed/unchanged only)."""
    out = []
    for part in ("version", "manager", "python", "chdir"):
        if (before or {}).get(part) != (after or {}).get(part):
            out.append({"field": part, "before": (before or {}).get(part), "after": (after or {}).get(part)})
    for part in ("args", "env"):
        left = (before or {}).get(part) or {}
        right = (after or {}).get(part) or {}
        for key in sorted(set(left) | set(right)):
            if left.get(key) == right.get(key):
                continue
            show_l, show_r = left.get(key), right.get(key)
            if any(isinstance(v, str) and v.startswith("hmac-sha256:") for v in (show_l, show_r)):
                show_l = secret_rules.MASK if show_l is not None else None
                show_r = secret_rules.MASK + " (changed)" if show_r is not None else None
            out.append({"field": "%s.%s" % (part, key), "before": show_l, "after": show_r})
    return out


def format_difference(diff):
    """``field: before -> after`` for one entry of :func:`differences` (secrets are already masked there)."""
    return "%s: %s -> %s" % (diff["field"], _show(diff["before"]), _show(diff["after"]))


def _show(value):
    if value is None:
        return "unset"
    if isinstance(value, float) and value.is_integer():
        return "%d" % value
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


# --------------------------------------------------------------------------
# The plan's action
# --------------------------------------------------------------------------

def decide(intended_fp, running, known_good_fp, entry, force=False, names=PLAIN):
    """The action for this host and why: ``{action, why, recovering, interrupted}``.

    ``running``: None when nothing of ours or adoptable serves on the target, else
    ``{pid, fingerprint (None when unknown), source, healthy}``.
    ``entry``: the node journal (``{}`` when none).
    """
    interrupted = journal_mod.unfinished(entry)
    note = ""
    if interrupted:
        note = "run %s stopped at step %s without settling the node" % (entry.get("run_id"), entry.get("step"))
    if running is None:
        why = "no server of ours runs on the target GPUs"
        if interrupted:
            why = "%s and left no server running: redeploying" % note
        return {"action": START, "why": why, "recovering": interrupted, "interrupted": interrupted}
    if force:
        return {"action": RESTART, "why": "%s is set" % names.of("force"), "recovering": interrupted, "interrupted": interrupted}
    if running.get("fingerprint") and running.get("fingerprint") == intended_fp:
        fresh_candidate = interrupted and (entry.get("candidate") or {}).get("fingerprint") == intended_fp \
            and entry.get("step") in journal_mod.PAST_TEARDOWN | {journal_mod.INTERRUPTED}
        if known_good_fp == intended_fp and not fresh_candidate and running.get("healthy") is not False:
            return {"action": NONE, "why": "the healthy server already runs the promoted (known-good) intended config",
                    "recovering": False, "interrupted": interrupted}
        if running.get("healthy") is False and known_good_fp == intended_fp and not fresh_candidate:
            why = "the server runs the promoted intended config but does not answer its health check; gating it again " \
                  "(health, config check, smoke), and rolling back if it fails"
        elif interrupted:
            why = "%s: the server it started runs the intended config, which never passed the smoke gate; finishing the " \
                  "verification (health, config check, smoke), then promote or roll back" % note
        elif known_good_fp:
            why = "the server runs the intended config, which was never promoted (the known-good config is another one); " \
                  "verifying it (health, config check, smoke), then promote or roll back"
        else:
            why = "the server runs the intended config, but this node has no known-good config; verifying it (health, " \
                  "config check, smoke), then promote"
        return {"action": VERIFY, "why": why, "recovering": interrupted, "interrupted": interrupted}
    why = "the running server (PID %s, %s) runs another config" % (running.get("pid"), running.get("source") or "managed")
    if not running.get("fingerprint"):
        why = "the running server (PID %s, %s) was not started by this collection; replacing it" % (
            running.get("pid"), running.get("source") or "adopted")
    if interrupted:
        why = "%s; %s" % (note, why)
    return {"action": RESTART, "why": why, "recovering": interrupted, "interrupted": interrupted}
