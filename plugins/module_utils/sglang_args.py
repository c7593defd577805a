# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Compatibility facade: the old public names of the SGLang engine.

The engine lives in ``plugins/module_utils/sglang/`` (versions, flags, rules,
resolve, render); import from there in new code. This module only re-exports
the names that existing callers use and will be removed.
"""
from __future__ import annotations

from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.flags import (  # noqa: F401 - re-exported
    FLAGS,
    SECRET_ARGS,
    flag_available,
    suggest_field,
)
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.render import (  # noqa: F401 - re-exported
    to_argv,
    to_config_yaml,
    yaml_quote,
)
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.resolve import (  # noqa: F401 - re-exported
    DEFAULT_POLICY,
    POLICIES,
    explain,
    resolve,
)
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.rules import (  # noqa: F401 - re-exported
    BY_ID as _BY_ID,
    doc_ref as _doc_ref,
    log_patterns as _log_patterns,
    scan_override_log,
)
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.versions import (  # noqa: F401 - re-exported
    DEFAULT_VERSION,
    DOCUMENTED_VERSIONS,
    parse_version,
    rule_version,
)

__all__ = [
    "DEFAULT_POLICY", "DEFAULT_VERSION", "DOCUMENTED_VERSIONS", "FLAGS", "OVERRIDE_LOG_PATTERNS", "POLICIES", "RULES",
    "SECRET_ARGS", "explain", "flag_available", "parse_version", "resolve", "rule_version", "scan_override_log",
    "suggest_field", "to_argv", "to_config_yaml", "yaml_quote",
]

# The old shapes: rule id -> (doc, summary), and the flat list of log patterns.
RULES = dict((rule_id, (_doc_ref(rule_id), record["summary"])) for rule_id, record in _BY_ID.items())
OVERRIDE_LOG_PATTERNS = _log_patterns()
