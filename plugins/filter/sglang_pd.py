# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filter ``gpufleet.sglang.sglang_pd_plan`` (documentation in ``sglang_pd_plan.yml``).

The rules are in ``plugins/module_utils/redeploy/pd.py``; this wrapper turns the play's hosts into the rollout's
inputs and adds the batch rule: a layout change can only be rolled with every prefill and decode host in
the same batch.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import pd


def sglang_pd_plan(hosts, version="0.5.23", batch=None):
    """The PD rollout of ``hosts`` (``[{host, role, old, new}]``); see sglang_pd_plan.yml."""
    if isinstance(hosts, Sequence) and not isinstance(hosts, (str, bytes)):
        hosts = [dict(item) if isinstance(item, Mapping) else item for item in hosts]
    try:
        return pd.play_plan(list(hosts) if isinstance(hosts, Sequence) and not isinstance(hosts, (str, bytes)) else hosts,
                            version=version, batch=list(batch) if batch is not None else None)
    except ValueError as exc:
        raise AnsibleFilterError("sglang_pd_plan: %s" % exc)


class FilterModule(object):
    """Prefill/decode rollout filter."""

    def filters(self):
        return {"sglang_pd_plan": sglang_pd_plan}
