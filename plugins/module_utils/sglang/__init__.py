# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""SGLang knowledge of the collection, one concern per module.

``versions``  release parsing and the documented rule sets
``flags``     the per-version flag table (generated from the real wheels into ``flags_data``)
``rules``     one record per resolution rule: log line, reference, explanation, fix
``resolve``   the mirror resolution engine and ``plan_resolution`` (node oracle or mirror)
``render``    the only place that builds the server argv, config.yaml and the unit's ExecStart
``oracle``    runs ``oracle_helper`` in the node's SGLang interpreter

The facts behind the rules are in ``docs/reference/sglang-rules.md``.
"""
