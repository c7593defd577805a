# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What SGLang's argument resolution accepts but a server cannot serve, checked against the node.

SGLang's argparse takes any integer, and its resolution (``ServerArgs.__post_init__``) lets through values
that fail only at launch, after the old server is gone (docs/reference/serving-checks.md):

* ``--tp-size 0`` and ``-1`` resolve; the real 0.5.23 server then fails with an ``IndexError`` (0) or runs
  on one GPU (-1, seen on the demo node before this check);
* ``--mem-fraction-static 1.5`` resolves; the scheduler dies while it sizes the KV pool;
* ``EAGLE``/``EAGLE3`` without a draft model resolves for a model that has no MTP head; the real server
  dies at scheduler init (rc 137).

The preflight runs :func:`check_values` on the args as given (types and ranges, independent of the
resolution) and :func:`check_layout` on the resolved args against the node's GPUs. Each message names the
field, the value, the node's facts where they matter and the fix.
"""

from __future__ import annotations

import math
from ansible_collections.gpufleet.sglang.plugins.module_utils.common.names import PLAIN

# Sizes of the parallel layout: each is a positive integer when set (SGLang: "world size" factors).
POSITIVE_INTS = ("tp_size", "pp_size", "dp_size", "ep_size", "nnodes", "attn_dp_size", "moe_dp_size", "attn_cp_size",
                 "gpu_id_step", "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")
NON_NEGATIVE_INTS = ("node_rank", "base_gpu_id")
# Fields that hold a TCP port the server binds.
PORT_FIELDS = ("port", "nccl_port", "metrics_port", "bootstrap_port", "disaggregation_bootstrap_port")
# Speculative algorithms whose draft model must be given (or filled in by SGLang for an MTP architecture).
NEEDS_DRAFT = ("EAGLE", "EAGLE3")

WHAT = {
    "tp_size": "the tensor-parallel width (GPUs per model replica)",
    "pp_size": "the pipeline-parallel depth",
    "dp_size": "the data-parallel replica count",
    "ep_size": "the expert-parallel width",
    "nnodes": "the number of nodes of this server",
    "attn_dp_size": "the attention data-parallel width",
    "moe_dp_size": "the MoE data-parallel width",
    "attn_cp_size": "the attention context-parallel width",
    "gpu_id_step": "the step between two GPU indices of one node",
    "speculative_num_steps": "the draft steps per verify",
    "speculative_eagle_topk": "the draft branches per step",
    "speculative_num_draft_tokens": "the draft tokens per verify",
    "node_rank": "this node's rank in a multi-node server",
    "base_gpu_id": "the first GPU index the server uses",
}


def as_int(value):
    """``(int, True)`` for an integer, an integral float or a string of one (Ansible passes numbers as
    strings from extra vars and surveys); ``(value, False)`` else (bools included)."""
    if isinstance(value, bool):
        return value, False
    if isinstance(value, int):
        return value, True
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value) or not value.is_integer():
            return value, False
        return int(value), True
    if isinstance(value, str):
        text = value.strip()
        try:
            return int(text), True
        except ValueError:
            try:
                number = float(text)
            except ValueError:
                return value, False
            return as_int(number)
    return value, False


def as_number(value):
    if isinstance(value, bool):
        return value, False
    if isinstance(value, (int, float)):
        return value, not (isinstance(value, float) and (math.isnan(value) or math.isinf(value)))
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return value, False
        return number, not (math.isnan(number) or math.isinf(number))
    return value, False


def check_values(args, names=PLAIN):
    """Types and ranges of the args as given, one message per bad field (SGLang would accept them)."""
    _field = names.field_of("args")
    args = args or {}
    problems = []
    minimums = [(name, 1) for name in POSITIVE_INTS] + [(name, 0) for name in NON_NEGATIVE_INTS]
    for name, minimum in minimums:
        value = args.get(name)
        if value is None:
            continue
        number, ok = as_int(value)
        if not ok or number < minimum:
            fix = ("SGLang's own argument check accepts it and the server fails or runs on another layout only at launch, "
                   "after the old server is gone; set a positive integer (or drop the field for SGLang's default 1)"
                   if minimum else "set 0 or more")
            problems.append("%s: must be an integer >= %d, got %r; it is %s. %s" % (_field(name), minimum, value, WHAT[name], fix))
    value = args.get("mem_fraction_static")
    if value is not None:
        number, ok = as_number(value)
        if not ok or not 0 < number < 1:
            problems.append("%s: must be a fraction between 0 and 1 (exclusive), got %r; it is the share of each GPU's memory "
                            "SGLang takes for the weights and the KV cache. A value outside it resolves but the scheduler "
                            "fails while it sizes the KV pool, after the teardown; typical values are 0.8 to 0.9"
                            % (_field("mem_fraction_static"), value))
    ports = {}
    for name in PORT_FIELDS:
        value = args.get(name)
        if value is None:
            continue
        number, ok = as_int(value)
        if not ok or not 1 <= number <= 65535:
            problems.append("%s: must be a TCP port between 1 and 65535, got %r" % (_field(name), value))
            continue
        ports.setdefault(number, []).append(name)
    for number, names in sorted(ports.items()):
        if len(names) > 1:
            problems.append("%s: all use port %d; the second bind fails with \"Address already in use\" at launch; give each "
                            "its own port" % (" and ".join(_field(n) for n in names), number))
    return problems


def _get(args, name, default=1):
    number, ok = as_int((args or {}).get(name))
    return number if ok else default


def attention_dp_width(args):
    """The attention-DP width: ``attn_dp_size`` (0.5.23), or ``dp_size`` with ``enable_dp_attention``; 1 without."""
    if _get(args, "attn_dp_size") > 1:
        return _get(args, "attn_dp_size")
    if (args or {}).get("enable_dp_attention"):
        return _get(args, "dp_size")
    return 1


def gpus_per_node(args, nnodes=None):
    """``(total, per node)`` GPUs of the layout: tp x pp (x dp without attention DP), spread over nnodes."""
    args = args or {}
    tp, pp, dp = _get(args, "tp_size"), _get(args, "pp_size"), _get(args, "dp_size")
    nodes = nnodes if nnodes is not None else _get(args, "nnodes")
    total = tp * pp * (1 if attention_dp_width(args) > 1 or args.get("enable_dp_attention") else dp)
    return total, (total // nodes if nodes >= 1 else total)


def check_layout(args, target_gpus, node_gpu_count=None, nnodes=None, gpu_memory_mib=None, arch_known=True, names=PLAIN):
    """The resolved layout against the node: divisibility, the GPUs given, the GPUs the node has, the draft model.

    ``target_gpus``: the GPU indices the server is given (CUDA_VISIBLE_DEVICES); ``node_gpu_count``: the GPUs that
    answer on the node; ``nnodes``: the group's node count (the args' own when None). Call it only when
    :func:`check_values` found nothing (it assumes positive sizes).
    """
    _field = names.field_of("args")
    args = args or {}
    problems = []
    nodes = int(nnodes) if nnodes else _get(args, "nnodes")
    tp, pp = _get(args, "tp_size"), _get(args, "pp_size")
    rank = _get(args, "node_rank", 0)
    if nodes >= 1 and not 0 <= rank < nodes:
        problems.append("%s: %d is not a rank of a %d-node server (ranks 0 to %d); set node_rank per host in "
                        "%s" % (_field("node_rank"), rank, nodes, nodes - 1, names.of("host_args")))
    if nodes > 1 and (tp * pp) % nodes:
        problems.append("%s: tp_size %d x pp_size %d does not split over %d nodes; SGLang stops with \"tp_size must be "
                        "divisible by number of nodes\"; use a tp_size that is a multiple of nnodes" % (
                            _field("tp_size"), tp, pp, nodes))
    width = attention_dp_width(args)
    if width > 1 and tp % width:
        name = "attn_dp_size" if _get(args, "attn_dp_size") > 1 else "dp_size"
        problems.append("%s: the attention-DP width %d does not divide tp_size %d; SGLang asserts tp_size %% dp == 0 at "
                        "startup; use a width that divides tp_size" % (_field(name), width, tp))
    dense = (args or {}).get("moe_dense_tp_size")
    if dense is not None and as_int(dense)[0] not in (1, tp):
        problems.append("%s: must be 1 or tp_size (%d), got %r; SGLang supports only those" % (
            _field("moe_dense_tp_size"), tp, dense))
    per_node = gpus_per_node(args, nodes)[1]
    gpus = list(target_gpus or [])
    if node_gpu_count is not None and per_node > node_gpu_count:
        memory = (", %d MiB each" % gpu_memory_mib) if gpu_memory_mib else ""
        problems.append("%s: the layout needs %d GPU(s) per node (tp_size %d x pp_size %d%s), but this node has %d GPU(s)%s; "
                        "lower tp_size/pp_size or spread the server over more nodes (nnodes)" % (
                            _field("tp_size"), per_node, tp, pp, (" over %d nodes" % nodes) if nodes > 1 else "",
                            node_gpu_count, memory))
    base, step = _get(args, "base_gpu_id", 0), _get(args, "gpu_id_step")
    if gpus and per_node >= 1 and base + (per_node - 1) * step >= len(gpus):
        problems.append("%s/%s: the server would use GPU indices %d to %d of CUDA_VISIBLE_DEVICES, which lists %d GPU(s) "
                        "(%s); SGLang fails with \"invalid device ordinal\". Drop base_gpu_id/gpu_id_step and choose the "
                        "GPUs with %s" % (
                            _field("base_gpu_id"), "gpu_id_step", base, base + (per_node - 1) * step, len(gpus),
                            ",".join(str(g) for g in gpus), names.of("gpus")))
    algorithm = str(args.get("speculative_algorithm") or "").upper()
    if arch_known and algorithm in NEEDS_DRAFT and not args.get("speculative_draft_model_path"):
        problems.append("%s: speculative_algorithm %s needs a draft model, and this model has no MTP head that SGLang "
                        "would use instead; SGLang accepts the args, then the server dies at scheduler init (seen on the "
                        "real 0.5.23: rc 137). Set speculative_draft_model_path to the draft checkpoint, or drop "
                        "speculative_algorithm" % (_field("speculative_draft_model_path"), algorithm))
    return problems
