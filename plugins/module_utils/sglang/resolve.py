# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The mirror: SGLang's argument resolution re-implemented per documented release.

``resolve(args, version, arch, policy, draft_arch, env, gpu)`` returns
``{"args", "adjustments", "errors", "notes"}``. Each adjustment is
``{arg, from, to, rule, doc, log}``: ``rule`` is a record id of
``rules.RECORDS``, ``doc`` its reference in docs/reference/sglang-rules.md,
``log`` the line SGLang prints for it or None. An adjustment whose ``from``
equals ``to`` is informational (SGLang prints a line but keeps the value).

Fixed point: the returned ``args`` are what the server runs when started with
exactly those args, so ``resolve(result["args"], version, policy="mirror")``
changes nothing. Three choices keep that (each is noted when it applies): the
upper-case algorithm name is rendered; a defaulted MTP draft path is rendered
explicitly, so its revision follows the draft-path rule; with
``--enable-return-aux-hidden-states`` the algorithm stays in the args because
it names the capture convention.

Standard library only, Python 3.9+: runs on the controller (filters) and on
targets (modules).
"""
from __future__ import annotations

from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import rules as R_
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.flags import (
    FLAGS,
    fmt,
    plain,
    same,
)
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.versions import (
    DEFAULT_VERSION,
    parse_version,
)
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.mirror.algorithms import AlgorithmRules
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.mirror.backends import BackendRules
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.mirror.base import Base, normalize_gpu
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.mirror.eagle import EagleRules
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.mirror.layout import LayoutRules
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.mirror.speculative import SpeculativeRules


DEFAULT_POLICY = "honor_draft_tokens"
POLICIES = ("mirror", "honor_draft_tokens", "strict")


class _Resolver(SpeculativeRules, EagleRules, AlgorithmRules, BackendRules, LayoutRules, Base):
    """One resolution: the rule families (sglang/mirror/) over the shared state of ``Base``."""


def resolve(args, version=DEFAULT_VERSION, arch=None, policy=DEFAULT_POLICY, draft_arch=None, env=None, gpu=None):
    """Resolve intended SGLang args the way SGLang ``version`` would.

    :param args: dict of SGLang field names (snake_case) to intended values.
    :param version: SGLang version string (see the module docstring for ranges).
    :param arch: the target model's ``architectures[0]``; drives automatic
        defaults (sglang-rules.md §6) and MTP draft paths (§3 step 7).
    :param policy: ``mirror``, ``honor_draft_tokens`` (default) or ``strict``.
    :param draft_arch: the draft model's ``architectures[0]`` (Gemma4 promotion, §2).
    :param env: the server's environment variables (0.5.10 reads SGLANG_ENABLE_SPEC_V2).
    :param gpu: GPU facts {name, compute_capability, memory_mib, count} (see
        normalize_gpu); the default attention backend and what trtllm_mha
        allows depend on them (sglang-rules.md §11). None: an H200 is assumed
        and every outcome that depends on the GPU is noted.
    :returns: ``{"args", "adjustments", "errors", "notes"}``.
    :raises ValueError: only for malformed input (non-dict args, unparseable
        version, unknown policy, non-string arch); SGLang configuration errors
        are returned in ``errors``.
    """
    if not isinstance(args, dict) and not (hasattr(args, "items") and hasattr(args, "keys")):
        raise ValueError("SGLang args must be a dict of field names to values, got %s %r" % (type(args).__name__, args))
    if policy not in POLICIES:
        raise ValueError("unknown resolution policy %r (%s); use one of %s" % (policy, type(policy).__name__, ", ".join(POLICIES)))
    parse_version(version)
    for name, value in (("arch", arch), ("draft_arch", draft_arch)):
        if value is not None and not isinstance(value, str):
            raise ValueError("%s must be a string such as 'LlamaForCausalLM' (architectures[0]), got %s %r"
                             % (name, type(value).__name__, value))
    if env is not None and not hasattr(env, "get"):
        raise ValueError("env must be a dict of environment variables, got %s %r" % (type(env).__name__, env))
    for key in args:
        if not isinstance(key, str):
            raise ValueError("SGLang arg names must be strings, got %s %r" % (type(key).__name__, key))
    resolver = _Resolver(args, str(version), str(arch) if arch else None, policy,
                         str(draft_arch) if draft_arch else None, env, normalize_gpu(gpu))
    return resolver.run()


def explain(arg, intended, running, version=DEFAULT_VERSION, args=None, arch=None, adjustments=None):
    """One line explaining why ``arg`` runs with ``running`` instead of ``intended``.

    Form: ``<arg>: intended X, running Y — <why>; <fix>``. With ``adjustments``
    (a resolution already made) the adjustment that produced ``running`` is
    explained and nothing is resolved again. Otherwise, with ``args`` (the
    intended args), they are resolved under ``mirror`` to find it. Failing
    both, the usual rule for that argument is used when it fits the values,
    and any other difference gets a generic line. Secret values are masked.
    """
    rule = R_.find_rule(adjustments, arg, running) if adjustments is not None else None
    if rule is None and adjustments is None and args is not None and hasattr(args, "items"):
        probe = plain(dict(args))
        if intended is None:
            probe.pop(arg, None)
        else:
            probe[arg] = intended
        try:
            result = resolve(probe, version, arch=arch, policy="mirror")
        except ValueError:
            result = {"adjustments": []}
        rule = R_.find_rule(result["adjustments"], arg, running)
    if rule is None:
        rule = R_.default_rule(arg, intended, running, args)
    flag = FLAGS[arg]["flag"] if arg in FLAGS else None
    return R_.explain_line(arg, intended, running, rule, version, flag=flag, secret_args=_secret_args())


def _secret_args():
    return tuple(k for k, v in FLAGS.items() if v["secret"])


# ---------------------------------------------------------------------------
# The plan: the policy through the mirror, then the node's own SGLang (the oracle)
# ---------------------------------------------------------------------------
ORACLE_POLICIES = ("auto", "node", "mirror")


def _oracle_error_line(version, error):
    return "SGLang %s on the node refuses the arguments at startup: %s: %s" % (
        version, error.get("type") or "Error", error.get("message") or "(no message)")


def _compared_fields(rendered, mirror_args):
    fields = [k for k in rendered if not (k in FLAGS and FLAGS[k]["secret"])]
    fields += [k for k in mirror_args if k not in fields and not (k in FLAGS and FLAGS[k]["secret"])]
    return fields


def _log_for(rule, warnings):
    if not rule or rule not in R_.BY_ID:
        return None
    for line in warnings:
        for pattern in R_.BY_ID[rule]["logs"]:
            if pattern["text"] in line:
                return line
    return None


def plan_resolution(args, version=DEFAULT_VERSION, arch=None, policy=DEFAULT_POLICY, gpu=None, draft_arch=None,
                    env=None, oracle=None, oracle_policy="auto"):
    """What the server will run: the policy applied through the mirror, then the node's SGLang asked.

    ``oracle`` is a callable ``oracle(rendered_args) -> answer`` (for example
    ``lambda a: oracle.resolve_on_node(python, a, version, gpu, env)``); it may
    raise ``oracle.OracleUnavailable``. ``oracle_policy``: ``mirror`` never
    asks it; ``auto`` falls back to the mirror when it is unavailable and says
    why; ``node`` makes that an error.

    Returns ``{"source": "node"|"mirror", "fallback_reason", "args" (the
    effective config), "rendered" (what is rendered), "adjustments", "errors",
    "notes", "log" (SGLang's own warning lines), "disagreements" (mirror vs
    node per field), "mirror" (the mirror's prediction), "node" (the oracle's
    answer or None)}``. Adjustments are the policy's (intended -> rendered)
    followed by SGLang's (rendered -> running); an SGLang adjustment carries
    the mirror's rule id when the mirror explains the same change, else None.
    """
    if oracle_policy not in ORACLE_POLICIES:
        raise ValueError("oracle_policy must be one of %s, got %r" % (", ".join(ORACLE_POLICIES), oracle_policy))
    planned = resolve(args, version, arch=arch, policy=policy, draft_arch=draft_arch, env=env, gpu=gpu)
    rendered = planned["args"]
    predicted = resolve(rendered, version, arch=arch, policy="mirror", draft_arch=draft_arch, env=env, gpu=gpu)
    policy_errors = [e for e in planned["errors"] if e not in predicted["errors"]]
    policy_adjustments = [a for a in planned["adjustments"] if a["rule"].startswith("policy.")]
    result = {
        "source": "mirror", "fallback_reason": None, "rendered": rendered, "args": dict(planned["args"]),
        "adjustments": list(planned["adjustments"]), "errors": list(planned["errors"]),
        "notes": list(planned["notes"]), "log": [a["log"] for a in planned["adjustments"] if a["log"]],
        "disagreements": [], "mirror": predicted, "node": None,
    }
    if oracle is None or oracle_policy == "mirror":
        result["fallback_reason"] = "oracle_policy mirror" if oracle_policy == "mirror" else "no node oracle given"
        return result
    try:
        answer = oracle(rendered)
    except Exception as exc:  # OracleUnavailable, or anything the runner could not turn into an answer
        reason = str(exc) or type(exc).__name__
        if oracle_policy == "node":
            result["errors"].append("%s; oracle_policy node does not fall back to the mirror (use auto to allow it)"
                                    % reason)
            result["source"] = "none"
        result["fallback_reason"] = reason
        result["notes"].append("resolved by the collection's mirror of SGLang %s: %s" % (version, reason))
        return result
    result["source"] = "node"
    result["node"] = answer
    warnings = list(answer.get("warnings") or [])
    result["log"] = warnings
    result["notes"].append("resolved by the node's SGLang %s (%s)" % (answer.get("sglang_version"), answer.get("python")))
    if not answer.get("ok"):
        error = answer.get("error") or {}
        # SGLang's own refusal first; when the mirror predicted a refusal too, its lines follow: they say why and
        # what to set, where SGLang often says little (0.5.23's bare AssertionError for steps unset).
        result["errors"] = policy_errors + [_oracle_error_line(answer.get("sglang_version") or version, error)] + [
            "the collection's mirror of SGLang %s agrees: %s" % (version, e) for e in predicted["errors"] if e not in policy_errors]
        result["args"] = dict(rendered)
        result["adjustments"] = policy_adjustments
        if not predicted["errors"]:
            result["disagreements"].append({"arg": None, "mirror": "starts", "node": "refuses: %s" % error.get("message")})
        return result
    node_args = answer.get("args") or {}
    intended = plain(dict(args))
    effective = {}
    adjustments = []
    for field in _compared_fields(intended, rendered):
        if field not in node_args:
            continue  # a field this release does not have
        running = node_args[field]
        effective[field] = running
        before = intended.get(field)
        if same(before, running) or (before is None and field not in rendered and running is None):
            continue
        if field not in intended and not any(a["arg"] == field for a in planned["adjustments"]):
            continue  # an SGLang default that neither the operator nor the mirror named
        # the mirror's rule when it explains the same change (the policy's included)
        rule = R_.find_rule(planned["adjustments"], field, running)
        adjustments.append({"arg": field, "from": before, "to": running, "rule": rule,
                            "doc": R_.doc_ref(rule) if rule else None, "log": _log_for(rule, warnings)})
    for field, mirror_value in predicted["args"].items():
        if field in node_args and not same(mirror_value, node_args[field]) and not (field in FLAGS and FLAGS[field]["secret"]):
            result["disagreements"].append({"arg": field, "mirror": mirror_value, "node": node_args[field]})
    if predicted["errors"]:
        result["disagreements"].append({"arg": None, "mirror": "refuses: %s" % predicted["errors"][0], "node": "starts"})
    errors = list(policy_errors)
    if policy == "strict":
        raw = plain(dict(args))
        for adj in adjustments:
            if adj["arg"] in raw and raw[adj["arg"]] is not None and not adj["rule"] == "policy.honor_draft_tokens" \
                    and not same(raw[adj["arg"]], adj["to"]):
                line = ("%s: intended %s, but the node's SGLang %s runs %s%s; policy strict forbids changing a value you "
                        "set" % (adj["arg"], fmt(raw[adj["arg"]]), answer.get("sglang_version"), fmt(adj["to"]),
                                 " (rule %s)" % adj["rule"] if adj["rule"] else ""))
                if not any(e.startswith(adj["arg"] + ": intended") for e in errors):
                    errors.append(line)
    result["errors"] = errors
    result["args"] = dict(rendered, **effective)
    result["adjustments"] = adjustments
    return result
