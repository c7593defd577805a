# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Range and type checks of every redeploy setting, run by the preflight before anything is touched.

The roles' argument specs check types when a role is entered; these rules add what argument specs
cannot say (ranges, cross-field rules), so that a value that would break the teardown, the launch,
the smoke gate or the rollback fails the preflight with a message that names the variable and the
fix, while the old server still serves. A setting the rollback also uses is checked here too, so a
rollback can never fail for the reason the candidate failed.
"""

from __future__ import annotations

import math

from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import serving
from ansible_collections.gpufleet.sglang.plugins.module_utils.common.names import PLAIN

# variable -> (kind, minimum, minimum is exclusive, what it means / the fix). The keys are the names of the
# sglang_preflight option ``settings`` (a dict of role variables to range-check, by design: the role passes
# sglang_redeploy_settings), so a message names the key the caller gave; tests/unit/test_no_role_names.py allows
# these keys as whole strings only.
RULES = {
    "sglang_server_health_timeout": ("number", 0, True, "seconds a new server may take to answer its health check (default 1800)"),
    "sglang_server_stop_timeout": ("number", 0, True, "seconds systemd waits for the server to stop (default 120)"),
    "gpu_teardown_term_timeout": ("number", 0, False, "seconds to wait after SIGTERM before SIGKILL (default 60)"),
    "gpu_teardown_kill_timeout": ("number", 0, True, "seconds to wait after SIGKILL (default 30)"),
    "gpu_verify_timeout": ("number", 0, True, "seconds to wait for the GPU memory to be released (default 120)"),
    "gpu_verify_sleep": ("number", 0, True, "seconds between two nvidia-smi polls (default 0.5)"),
    "gpu_verify_max_used_mib": ("number", 0, False, "MiB a free GPU may still show in use (default 16)"),
    "gpu_verify_min_used_mib": ("number", 0, False, "MiB each GPU must hold once the server runs (default 1024)"),
    "sglang_smoke_timeout": ("number", 0, True, "seconds the smoke gate may take in all (default 300)"),
    "sglang_smoke_request_timeout": ("number", 0, True, "seconds one smoke request may take"),
    "sglang_smoke_requests": ("int", 1, False, "number of smoke requests (150 or more catches the hang after ~100 requests)"),
    "sglang_smoke_concurrency": ("int", 1, False, "smoke requests in flight at once (default 1)"),
    "sglang_smoke_max_new_tokens": ("int", 1, False, "tokens generated per smoke request (default 64)"),
    "sglang_smoke_min_tokens_per_s": ("number", 0, False, "the throughput floor of the smoke gate (0: off)"),
    "sglang_smoke_min_accept_length": ("number", 0, False, "the accept-length floor of the smoke gate (0: off)"),
    "sglang_smoke_metrics_interval": ("number", 0, True, "seconds between two /metrics reads of the smoke gate (default 1)"),
    "sglang_lock_timeout": ("number", 0, False, "seconds to wait for another run's lease (default 900)"),
    "sglang_lease_ttl": ("number", 30, False, "seconds a lease lives without renewal (default 300)"),
    "sglang_router_drain_timeout": ("number", 0, True, "seconds to wait for the old server's in-flight requests (default 300)"),
    "sglang_router_health_timeout": ("number", 0, True, "seconds to wait for the router to list the worker Ready (default 120)"),
    "sglang_oracle_timeout": ("number", 0, True, "seconds the node's SGLang may take to resolve the arguments (default 120)"),
}


# Settings that take one of a few words: name -> (choices, meaning).
CHOICES = {
    "sglang_smoke_accept_length_source": (("auto", "metrics", "meta"),
                                          "figure the smoke gate's accept length comes from (default auto)"),
}


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not (
        isinstance(value, float) and (math.isnan(value) or math.isinf(value)))


def _coerce(kind, value):
    """``(number, ok)``: Ansible passes many numbers as strings (extra vars, surveys)."""
    if _is_number(value):
        if kind == "int" and isinstance(value, float) and not value.is_integer():
            return value, False
        return value, True
    if isinstance(value, str):
        text = value.strip()
        try:
            number = int(text) if kind == "int" else float(text)
        except ValueError:
            return value, False
        if isinstance(number, float) and (math.isnan(number) or math.isinf(number)):
            return value, False
        return number, True
    return value, False


def check_settings(settings):
    """One message per bad setting in ``settings`` (variable name -> value); unknown names are ignored."""
    problems = []
    for name in sorted(settings or {}):
        if name in CHOICES and settings[name] is not None:
            choices, meaning = CHOICES[name]
            if settings[name] not in choices:
                problems.append("%s: must be one of %s, got %r; it is the %s" % (
                    name, ", ".join(choices), settings[name], meaning))
            continue
        if name not in RULES:
            continue
        value = settings[name]
        # Unset is None only: the role hands the settings over as one dict expression, so an unset value stays
        # null on every supported core, and an explicit "" (e.g. ``-e sglang_smoke_timeout=``) is refused here.
        if value is None:
            continue
        kind, minimum, exclusive, meaning = RULES[name]
        number, ok = _coerce(kind, value)
        wanted = "%s %s %s" % ("an integer" if kind == "int" else "a number", ">" if exclusive else ">=", minimum)
        if not ok:
            problems.append("%s: must be %s, got %s %r; it is the %s" % (name, wanted, type(value).__name__, value, meaning))
            continue
        if (number <= minimum) if exclusive else (number < minimum):
            problems.append("%s: must be %s, got %s; it is the %s" % (name, wanted, value, meaning))
    return problems


def gpus_needed(args, nnodes=1):
    """How many GPUs one node of this server uses: tp_size * pp_size (* dp_size without attention DP) / nnodes."""
    return max(1, serving.gpus_per_node(args, max(1, int(nnodes or 1)))[1])


def check_gpu_layout(args, target_gpus, nnodes=1, explicit=False, names=PLAIN):
    """A message when the target GPUs do not fit the parallel layout, else None."""
    need = gpus_needed(args, nnodes)
    have = len(target_gpus or [])
    if have == need:
        return None
    layout = "tp_size %s" % (args or {}).get("tp_size", 1)
    if (args or {}).get("pp_size") not in (None, 1):
        layout += " x pp_size %s" % args.get("pp_size")
    if (args or {}).get("dp_size") not in (None, 1) and not (args or {}).get("enable_dp_attention"):
        layout += " x dp_size %s" % args.get("dp_size")
    if int(nnodes or 1) > 1:
        layout += " over %s nodes" % nnodes
    if explicit:
        return ("%s: %s needs %d GPU(s) per node, but it lists %d (%s); list %d GPU(s) or "
                "change the parallel layout" % (names.of("gpus"), layout, need, have, ",".join(str(g) for g in target_gpus), need))
    return "%s: %s needs %d GPU(s) per node, but %d are targeted" % (names.of("args"), layout, need, have)


def check_text_secret(name, value):
    """A message when a secret cannot travel in an HTTP header or a config file (newline, NUL), else None."""
    if value is None:
        return None
    text = str(value)
    if any(ch in text for ch in "\r\n\0"):
        return ("%s: contains a newline or NUL byte, which no HTTP Authorization header can carry (the health check and "
                "the router would fail with 'Invalid header value'); remove it" % name)
    if text != text.strip():
        return "%s: starts or ends with whitespace, which HTTP clients strip; remove it" % name
    return None
