# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What a message calls a module option (the ``option_labels`` option, doc fragment ``gpufleet.sglang.option_labels``).

Engines name the module OPTION in their messages (``args.tp_size``, ``cache_dir``, ``adopt_pids``); a caller that
knows the option under another name (a role: ``sglang_server_args``) passes ``option_labels`` and the message says
that name instead. The engines never know the roles' variable names.
"""

from __future__ import annotations

# The argument spec of the gpufleet.sglang.option_labels doc fragment.
ARGSPEC = dict(option_labels=dict(type="dict", default={}))


class Names(object):
    """``of(option)``: the caller's label for a module option, or the option's own name."""

    def __init__(self, labels=None):
        self.labels = dict((str(k), str(v)) for k, v in (labels or {}).items() if v not in (None, ""))

    def of(self, option, field=None):
        """The label of ``option``; with ``field``, of that field of a dict option (``args.port``): the label of
        ``option.field`` when the caller gave one (a field the caller sets as a variable of its own), else the
        option's label and the field."""
        if field is not None and "%s.%s" % (option, field) in self.labels:
            return self.labels["%s.%s" % (option, field)]
        label = self.labels.get(option, option)
        return "%s.%s" % (label, field) if field is not None else label

    def field_of(self, option):
        """A function of a field name: its label as a field of the dict option ``option``."""
        return lambda field: self.of(option, field)

    @classmethod
    def of_module(cls, module):
        """The labels a module was given (none when it has no option_labels option)."""
        params = getattr(module, "params", None) or {}
        return cls(params.get("option_labels") if isinstance(params, dict) else None)


# A module used directly: every message names the option itself.
PLAIN = Names()
