# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Prefill/decode disaggregation: what the two roles must share, and the order a redeploy may take.

A PD router pairs any prefill server with any decode server, so every prefill in service must be
compatible with every decode in service, at every moment of a rollout.

Sources: ``srt/arg_groups/fields/disagg.py`` and ``srt/disaggregation/common/conn.py`` of the 0.5.23
wheel (``CommonKVReceiver.try_ensure_parallel_info`` and ``init``, ``PrefillServerInfo``), the
same file in 0.5.10 and its absence in 0.5.1 and older, ``srt/disaggregation/decode.py``
(``_kv_checksum_comparable``), and the simulator's measurements (simulator/README.md, "PD
disaggregation"):

* ``page_size`` and the KV cache dtype: the decode scheduler raises ``RuntimeError`` ("Page size
  mismatch" / "KV cache dtype mismatch") on its first request from that prefill, which takes the
  decode server down (0.5.10+; 0.5.23 compares the resolved dtype, so ``kv_cache_dtype auto``
  follows ``dtype`` and the model's ``torch_dtype``; 0.5.10 compares the arg as given). Before
  0.5.10 nothing checks them and pages of different sizes are copied as if equal.
* ``disaggregation_transfer_backend`` and (0.5.23) ``disaggregation_decode_allocation_policy``:
  the handshake fails and so does each request, HTTP 500.
* ``disaggregation_enable_kv_checksum`` (0.5.23): a one-sided setting only leaves the transfers
  unverified (a warning, no failure).
* ``model_path``: nothing checks it; a decode continuing KV computed by other weights answers
  wrongly without any error. Compared as paths: give every host of a PD fleet the same path.

Not modelled here: DeepSeek-V4 ``kv_layout``, MLA KV sharding, decode context parallelism, and
attention TP sizes (they may differ; SGLang maps the ranks).

Standard library only (Python 3.9+).
"""

from __future__ import annotations

import json

from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import versions

CRASH = "decode_crash"        # the decode server dies on the first transfer
FAILS = "request_fails"       # each request through the pair fails (HTTP 500)
SILENT = "silent"             # no error: wrong KV or wrong answers
WARNING = "warning"           # works, with a warning (unverified transfers)
BLOCKING = (CRASH, FAILS, SILENT)

ROLLING = "rolling"
PAIR = "pair"
BLUE_GREEN = "blue_green"
STOP_BOTH = "stop_both"

_DTYPE_ALIASES = {"bf16": "bfloat16", "half": "float16", "float": "float32", "fp16": "float16", "fp32": "float32"}


def _vt(version):
    return versions.release_tuple(version, default="0.5.23")


def layout_fields(version="0.5.23"):
    """The fields prefill and decode must share on ``version``: ``[{field, consequence, detail}]``.

    ``consequence`` is one of ``decode_crash``, ``request_fails``, ``silent`` (a mismatch that
    blocks a plan) or ``warning`` (reported, does not block).
    """
    vt = _vt(version)
    checked = vt >= (0, 5, 10)
    out = []
    if checked:
        out.append({"field": "page_size", "consequence": CRASH,
                    "detail": "the decode scheduler raises \"Page size mismatch\" on its first request from that "
                              "prefill and the decode server goes down"})
        out.append({"field": "kv_cache_dtype", "consequence": CRASH,
                    "detail": "the decode scheduler raises \"KV cache dtype mismatch\" on its first request from that "
                              "prefill and the decode server goes down"
                              + (" (compared after resolution: auto is the dtype or the model's torch_dtype)"
                                 if vt >= (0, 5, 23) else " (compared as given: auto is not resolved)")})
    else:
        for field in ("page_size", "kv_cache_dtype"):
            out.append({"field": field, "consequence": SILENT,
                        "detail": "SGLang %s does not check it: KV pages are copied as if the layouts were equal "
                                  "(wrong answers or a failed transfer)" % version})
    out.append({"field": "disaggregation_transfer_backend", "consequence": FAILS,
                "detail": "the two backends cannot connect: every request through the pair fails with HTTP 500"})
    if vt >= (0, 5, 23):
        out.append({"field": "disaggregation_decode_allocation_policy", "consequence": FAILS,
                    "detail": "\"Disaggregation decode allocation policy mismatch\": every request through the pair "
                              "fails with HTTP 500"})
        out.append({"field": "disaggregation_enable_kv_checksum", "consequence": WARNING,
                    "detail": "only one side digests the KV pages: transfers are admitted unverified"})
    out.append({"field": "model_path", "consequence": SILENT,
                "detail": "nothing checks it: the decode continues KV computed by other weights and answers wrongly"})
    return out


def _norm(args):
    return dict((str(k).strip().lstrip("-").replace("-", "_"), v) for k, v in (args or {}).items())


def _text(value):
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value).strip()


def _default(field):
    return {"page_size": "1", "kv_cache_dtype": "auto", "disaggregation_transfer_backend": "mooncake",
            "disaggregation_decode_allocation_policy": "early", "disaggregation_enable_kv_checksum": "false"}.get(field)


def effective(args, field, version="0.5.23", model_dtype=None):
    """The value of ``field`` the role's server compares, as text (None: unknown)."""
    a = _norm(args)
    value = _text(a.get(field))
    if field == "disaggregation_enable_kv_checksum":
        return "true" if value in ("true", "1", "yes", "on") else "false"
    if value is None:
        value = _default(field)
    if field == "kv_cache_dtype":
        value = _DTYPE_ALIASES.get(value, value)
        if value == "auto" and _vt(version) >= (0, 5, 23):
            dtype = _text(a.get("dtype")) or "auto"
            dtype = _DTYPE_ALIASES.get(dtype, dtype)
            if dtype != "auto":
                return dtype
            if model_dtype:
                return _DTYPE_ALIASES.get(str(model_dtype), str(model_dtype))
            return "auto (the model's torch_dtype)"
    if field == "disaggregation_transfer_backend" and value == "mooncake_tcp" and _vt(version) >= (0, 5, 23):
        return "mooncake"      # handle_pd_disaggregation rewrites it (TCP forced through MC_FORCE_TCP)
    return value


def check_pair(prefill_args, decode_args, version="0.5.23", model_dtype=None):
    """Problems of one prefill/decode pair: ``[{field, prefill, decode, consequence, blocking, message}]``.

    Also checks the roles themselves (``disaggregation_mode`` prefill and decode). ``model_dtype``:
    the checkpoint's ``torch_dtype``, used for ``kv_cache_dtype auto`` (0.5.23).
    """
    problems = []
    p, d = _norm(prefill_args), _norm(decode_args)
    for side, args, want in (("prefill", p, "prefill"), ("decode", d, "decode")):
        mode = _text(args.get("disaggregation_mode")) or "null"
        if mode != want:
            problems.append({"field": "disaggregation_mode", "prefill": _text(p.get("disaggregation_mode")) or "null",
                             "decode": _text(d.get("disaggregation_mode")) or "null", "consequence": FAILS,
                             "blocking": True,
                             "message": "disaggregation_mode: the %s server runs %s, not %s" % (side, mode, want)})
    for entry in layout_fields(version):
        field = entry["field"]
        left = effective(p, field, version, model_dtype)
        right = effective(d, field, version, model_dtype)
        if left == right:
            continue
        problems.append({"field": field, "prefill": left, "decode": right, "consequence": entry["consequence"],
                         "blocking": entry["consequence"] in BLOCKING,
                         "message": "%s: prefill %s, decode %s: %s" % (field, left, right, entry["detail"])})
    return problems


def blocking(problems):
    return [x for x in problems if x.get("blocking")]


# --------------------------------------------------------------------------
# The rollout order
# --------------------------------------------------------------------------

def _entries(role, hosts):
    """``hosts``: {host: (old, new)} or {host: {"old", "new"}} or [(host, old, new)]; old None = not serving yet."""
    out = []
    items = hosts.items() if isinstance(hosts, dict) else [(h[0], tuple(h[1:])) for h in (hosts or [])]
    for host, value in items:
        if isinstance(value, dict):
            old, new = value.get("old"), value.get("new")
        else:
            old, new = (list(value) + [None, None])[:2]
        if new is None:
            raise ValueError("%s host %s: no new args given" % (role, host))
        out.append({"host": str(host), "role": role, "old": old, "new": new, "changes": _norm(old) != _norm(new)})
    return out


def _state_problems(prefills, decodes, version, model_dtype, label, need_roles=True):
    """Every (prefill, decode) combination in service: the blocking problems, and (``need_roles``) an empty role."""
    out = []
    if need_roles and not prefills:
        out.append("%s: no prefill server in service" % label)
    if need_roles and not decodes:
        out.append("%s: no decode server in service" % label)
    seen = set()
    for ph, pa in prefills:
        for dh, da in decodes:
            for prob in blocking(check_pair(pa, da, version, model_dtype)):
                key = (prob["field"], prob["prefill"], prob["decode"])
                if key in seen:
                    continue
                seen.add(key)
                out.append("%s: prefill %s with decode %s: %s" % (label, ph, dh, prob["message"]))
    return out


def rollout_order(prefill_hosts_old_new, decode_hosts_old_new, layout_changed=None, version="0.5.23",
                  model_dtype=None, separate_router=False, min_ready=1):
    """The order of a PD redeploy and the proof that no state in between pairs incompatible servers.

    ``prefill_hosts_old_new`` / ``decode_hosts_old_new``: ``{host: (old_args, new_args)}`` (also
    ``{host: {"old", "new"}}`` or ``[(host, old, new)]``); ``old_args`` None for a host not serving
    yet. ``layout_changed``: None computes it (an old server of one role would be incompatible with a
    new one of the other); True forces the pair order. ``separate_router``: a second (green) router
    the new pairs can be put behind, so that a layout change is blue/green instead of stopping both
    roles. ``min_ready``: Ready servers to keep per role during a rolling redeploy.

    Returns ``{order, pair_mode, why, layout_changed, layout_differences, mixed_pairs, steps, states,
    problems, outage, notes}``; ``layout_differences``: ``[{field, old, new, consequence}]`` (the
    values in the fleet before and after); ``mixed_pairs``: check_pair's blocking problems of an old
    server of one role with a new one of the other. ``order``: ``rolling`` replaces one host at a
    time, role by role (prefill, then decode), keeping ``min_ready`` Ready servers of each role (a
    role with fewer hosts makes ``outage`` true and says so in ``notes``); ``pair`` is ``blue_green`` (pairs move from the blue router to the
    green one, and traffic is switched once the first new pair is up; needs two serving hosts of each
    role, else ``stop_both``) or ``stop_both`` (both roles leave the router, are replaced, and come
    back: an outage). ``steps``: ``[{step, action, role, hosts}]``; ``states``: who is in service
    after each step (per router for blue/green) and its problems; ``problems``: why the plan must be
    refused (the new fleet incompatible with itself, any state that pairs incompatible servers, a
    live router without a role).
    """
    prefills = _entries("prefill", prefill_hosts_old_new)
    decodes = _entries("decode", decode_hosts_old_new)
    problems = []
    # The target fleet must be compatible with itself.
    problems.extend(_state_problems([(e["host"], e["new"]) for e in prefills], [(e["host"], e["new"]) for e in decodes],
                                    version, model_dtype, "the new fleet"))
    # Layout change: would an old server of one role meet a new server of the other?
    mixed = []
    for a_role, b_role in ((prefills, decodes), (decodes, prefills)):
        for a in a_role:
            for b in b_role:
                if a["old"] is None:
                    continue
                pa, da = (a["old"], b["new"]) if a["role"] == "prefill" else (b["new"], a["old"])
                for prob in blocking(check_pair(pa, da, version, model_dtype)):
                    prob = dict(prob)
                    prob["pair"] = "%s %s (old) with %s %s (new)" % (a["role"], a["host"], b["role"], b["host"])
                    if not [m for m in mixed if m["field"] == prob["field"] and m["prefill"] == prob["prefill"]
                            and m["decode"] == prob["decode"]]:
                        mixed.append(prob)
    computed = bool(mixed)
    changed = computed if layout_changed is None else bool(layout_changed) or computed
    notes = []
    if layout_changed is False and computed:
        notes.append("layout_changed was given as false, but the args change the shared layout (%s)"
                     % ", ".join(sorted(set(m["field"] for m in mixed))))
    differences = []
    for entry in layout_fields(version):
        field = entry["field"]
        before = sorted(set(effective(e["old"], field, version, model_dtype) for e in prefills + decodes
                            if e["old"] is not None))
        after = sorted(set(effective(e["new"], field, version, model_dtype) for e in prefills + decodes))
        if before != after:
            differences.append({"field": field, "old": before, "new": after, "consequence": entry["consequence"]})
    result = {"order": None, "pair_mode": None, "why": "", "layout_changed": changed, "layout_differences": differences,
              "mixed_pairs": mixed, "steps": [], "states": [], "problems": problems, "outage": False, "notes": notes}
    serving = [len([e for e in role if e["old"] is not None]) for role in (prefills, decodes)]
    if not changed:
        _plan_rolling(result, prefills, decodes, version, model_dtype, min_ready)
    elif separate_router and min(serving) >= 2:
        _plan_blue_green(result, prefills, decodes, version, model_dtype)
    else:
        if separate_router:
            notes.append("blue/green needs at least 2 serving servers of each role (prefill %d, decode %d): the old "
                         "router must keep both roles while the first pair moves" % tuple(serving))
        _plan_stop_both(result, prefills, decodes, version, model_dtype)
    return result


def _layout_text(differences):
    return "; ".join("%s %s -> %s" % (d["field"], "/".join(d["old"]) or "none", "/".join(d["new"]))
                     for d in differences[:4]) or "forced by layout_changed"


def _plan_rolling(result, prefills, decodes, version, model_dtype, min_ready):
    result.update(order=ROLLING, why="the change does not touch the shared KV layout: one role at a time, one host at a "
                                     "time, keeping at least %d Ready server(s) of each role" % min_ready)
    current = dict((e["host"], e) for e in prefills + decodes)
    serving = dict((e["host"], e["old"]) for e in prefills + decodes if e["old"] is not None)
    step = 0
    for role_entries in (prefills, decodes):
        for entry in role_entries:
            if not entry["changes"]:
                continue
            step += 1
            out_of_service = dict(serving)
            out_of_service.pop(entry["host"], None)
            label = "step %d (%s %s out)" % (step, entry["role"], entry["host"])
            ps = [(h, a) for h, a in out_of_service.items() if current[h]["role"] == "prefill"]
            ds = [(h, a) for h, a in out_of_service.items() if current[h]["role"] == "decode"]
            state_problems = _state_problems(ps, ds, version, model_dtype, label, need_roles=False)
            ready = len(ps) if entry["role"] == "prefill" else len(ds)
            gaps = []
            if ready < min_ready and entry["old"] is not None:
                gaps.append("%s: %d Ready %s server(s) left while it is replaced, fewer than %d: requests fail meanwhile "
                            "(add a %s server to avoid it)" % (label, ready, entry["role"], min_ready, entry["role"]))
                result["outage"] = True
                result["notes"].extend(gaps)
            result["steps"].append({"step": step, "action": "replace", "role": entry["role"], "hosts": [entry["host"]]})
            serving[entry["host"]] = entry["new"]
            result["states"].append({"step": step, "router": sorted(out_of_service), "problems": state_problems,
                                     "gaps": gaps})
            result["problems"].extend(state_problems)
    if not result["steps"]:
        result["why"] = "nothing changes on any prefill or decode host"


def _plan_blue_green(result, prefills, decodes, version, model_dtype):
    result.update(order=PAIR, pair_mode=BLUE_GREEN,
                  why="the change alters the shared KV layout (%s): old and new servers must never be paired, so pairs "
                      "move from the blue router to a separate green router, and traffic is switched to green once "
                      "the first new pair is up" % _layout_text(result["layout_differences"]))
    n = max(len(prefills), len(decodes))
    batches = []
    for i in range(n):
        batch = []
        if i < len(prefills):
            batch.append(prefills[i])
        if i < len(decodes):
            batch.append(decodes[i])
        batches.append(batch)
    blue = dict((e["host"], e) for e in prefills + decodes if e["old"] is not None)
    green = {}
    live = "blue"
    step = 0
    for i, batch in enumerate(batches):
        for e in batch:
            blue.pop(e["host"], None)
        step += 1
        result["steps"].append({"step": step, "action": "replace_into_green", "role": "pair",
                                "hosts": [e["host"] for e in batch]})
        for e in batch:
            green[e["host"]] = e
        state = _bg_state(step, blue, green, version, model_dtype, live=live)
        result["states"].append(state)
        result["problems"].extend(state["problems"])
        if i == 0:
            # the first new pair is up and verified behind green: green takes the traffic from here on
            step += 1
            live = "green"
            result["steps"].append({"step": step, "action": "switch_traffic", "role": "pair", "hosts": sorted(green)})
            state = _bg_state(step, blue, green, version, model_dtype, live=live)
            result["states"].append(state)
            result["problems"].extend(state["problems"])


def _bg_state(step, blue, green, version, model_dtype, live):
    label = "step %d" % step
    problems = []
    for name, members, key in (("blue", blue, "old"), ("green", green, "new")):
        ps = [(h, e[key]) for h, e in members.items() if e["role"] == "prefill"]
        ds = [(h, e[key]) for h, e in members.items() if e["role"] == "decode"]
        # the router that takes no traffic may lack a role
        problems.extend(_state_problems(ps, ds, version, model_dtype, "%s, %s router" % (label, name),
                                        need_roles=name == live))
    return {"step": step, "blue": sorted(blue), "green": sorted(green), "live": live, "problems": problems}


def _plan_stop_both(result, prefills, decodes, version, model_dtype):
    result.update(order=PAIR, pair_mode=STOP_BOTH, outage=True,
                  why="the change alters the shared KV layout (%s) and no separate router is available: a router pairs "
                      "any prefill with any decode, so both roles leave it, are replaced, and come back together "
                      "(an outage of the PD service)" % _layout_text(result["layout_differences"]))
    everyone = [e["host"] for e in prefills + decodes]
    result["steps"] = [
        {"step": 1, "action": "remove_from_router", "role": "pair", "hosts": everyone},
        {"step": 2, "action": "replace", "role": "pair", "hosts": everyone},
        {"step": 3, "action": "add_to_router", "role": "pair", "hosts": everyone},
    ]
    final = _state_problems([(e["host"], e["new"]) for e in prefills], [(e["host"], e["new"]) for e in decodes],
                            version, model_dtype, "step 3")
    result["states"] = [{"step": 1, "router": [], "problems": []}, {"step": 2, "router": [], "problems": []},
                        {"step": 3, "router": sorted(everyone), "problems": final}]
