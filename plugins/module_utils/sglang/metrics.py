# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Reading SGLang's ``/metrics`` and its startup log (standard library only).

* ``parse_prometheus(text)``: the Prometheus text exposition format into
  ``Sample(name, labels, value)`` tuples.
* Speculative decoding: ``sglang:spec_accept_length`` and
  ``sglang:spec_accept_rate`` are gauges that each scheduler sets once every
  ``--decode-log-interval`` decode iterations (default 40), to the mean over
  the verify steps of those iterations only (accepted tokens / requests per
  verify forward; SGLang 0.5.23 ``scheduler_components/metrics_reporter.py``).
  Between two reports the gauge keeps its value. ``AcceptWindow`` watches the
  gauges over a smoke window and keeps only the reports made inside it.
* Startup phases: ``sglang:startup_time_seconds{phase=...}`` and
  ``sglang:startup_cuda_graph_time_seconds{phase=...}`` (0.5.23,
  ``--enable-metrics``), or the log line ``Engine startup timings (s):
  load_weight=..., kv_cache_allocation=..., scheduler_e2e=...,
  cuda_graph={...}, tokenizer_e2e=...``; ``startup_budget`` turns the figures
  of a previous launch into a timeout.
* PD disaggregation queues: ``pd_queue_depths``.
"""

from __future__ import annotations

import math
import re
from collections import namedtuple

Sample = namedtuple("Sample", "name labels value")

ACCEPT_LENGTH = "sglang:spec_accept_length"
ACCEPT_RATE = "sglang:spec_accept_rate"
STARTUP_TIME = "sglang:startup_time_seconds"
STARTUP_CUDA_GRAPH_TIME = "sglang:startup_cuda_graph_time_seconds"
STARTUP_PHASES = ("load_weight", "kv_cache_allocation", "scheduler_e2e", "tokenizer_e2e")
PD_QUEUES = {
    "prefill_bootstrap": "sglang:num_prefill_bootstrap_queue_reqs",
    "prefill_inflight": "sglang:num_prefill_inflight_queue_reqs",
    "decode_prealloc": "sglang:num_decode_prealloc_queue_reqs",
    "decode_transfer": "sglang:num_decode_transfer_queue_reqs",
}
STARTUP_LOG_MARK = "Engine startup timings (s): "


class MetricsFormatError(ValueError):
    """A ``/metrics`` line that is not Prometheus text."""


_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,)?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def _value(text):
    low = text.lower()
    if low in ("+inf", "inf"):
        return math.inf
    if low == "-inf":
        return -math.inf
    if low == "nan":
        return math.nan
    return float(text)


def _parse_labels(text, lineno):
    labels = {}
    pos = 0
    while pos < len(text):
        if not text[pos:].strip():
            break
        m = _LABEL.match(text, pos)
        if not m:
            raise MetricsFormatError("line %d: bad label set {%s}" % (lineno, text))
        labels[m.group(1)] = re.sub(r'\\[\\"n]', lambda e: _UNESCAPE[e.group(0)], m.group(2))
        pos = m.end()
        if m.group(3) is None and text[pos:].strip():
            raise MetricsFormatError("line %d: bad label set {%s}" % (lineno, text))
    return labels


def parse_prometheus(text):
    """All samples of a Prometheus text page, in page order.

    Comments (``# HELP``, ``# TYPE``) and blank lines are skipped; a trailing
    timestamp is ignored. Raises MetricsFormatError on a malformed line.
    """
    out = []
    for lineno, raw in enumerate((text or "").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _NAME.match(line)
        if not m:
            raise MetricsFormatError("line %d: no metric name: %r" % (lineno, raw[:120]))
        name = m.group(0)
        rest = line[m.end():]
        labels = {}
        if rest.startswith("{"):
            close = _closing_brace(rest)
            if close < 0:
                raise MetricsFormatError("line %d: unclosed label set: %r" % (lineno, raw[:120]))
            labels = _parse_labels(rest[1:close], lineno)
            rest = rest[close + 1:]
        parts = rest.split()
        if not parts or len(parts) > 2:
            raise MetricsFormatError("line %d: expected a value: %r" % (lineno, raw[:120]))
        try:
            value = _value(parts[0])
        except ValueError:
            raise MetricsFormatError("line %d: bad value %r" % (lineno, parts[0]))
        out.append(Sample(name, labels, value))
    return out


def _closing_brace(text):
    quoted = escaped = False
    for i, ch in enumerate(text):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            quoted = not quoted
        elif ch == "}" and not quoted:
            return i
    return -1


def _samples(samples_or_text):
    if isinstance(samples_or_text, str):
        return parse_prometheus(samples_or_text)
    return list(samples_or_text or [])


def series_key(labels, ignore=()):
    """A hashable, stable key for a label set (``ignore``: label names left out)."""
    return tuple(sorted((k, v) for k, v in labels.items() if k not in ignore))


def series(samples_or_text, name, **match):
    """``{series_key: value}`` of metric ``name``; ``match``: labels that must equal."""
    out = {}
    for s in _samples(samples_or_text):
        if s.name != name:
            continue
        if any(s.labels.get(k) != v for k, v in match.items()):
            continue
        out[series_key(s.labels)] = s.value
    return out


def total(samples_or_text, name, **match):
    """Sum of metric ``name`` over its series (``None`` when the page has none)."""
    values = list(series(samples_or_text, name, **match).values())
    return sum(values) if values else None


# ---------------------------------------------------------------------------
# speculative decoding
# ---------------------------------------------------------------------------

def spec_gauges(samples_or_text):
    """``{series_key: {"accept_length": x, "accept_rate": y}}`` per scheduler series."""
    samples = _samples(samples_or_text)
    out = {}
    for key, value in series(samples, ACCEPT_LENGTH).items():
        out.setdefault(key, {})["accept_length"] = value
    for key, value in series(samples, ACCEPT_RATE).items():
        out.setdefault(key, {})["accept_rate"] = value
    return out


class AcceptWindow:
    """The windowed accept gauges seen over a smoke window.

    Call ``start(page)`` with the ``/metrics`` page read before the first
    request, ``observe(page)`` with each page sampled while requests run and
    once after the last answer. A series whose gauge pair changed since the
    previous page made a new report; only those reports count, so a value
    left over from before the window (a server that decoded fewer than
    ``decode_log_interval`` iterations during it) is never taken for a
    measurement. Two consecutive reports with exactly equal values read as one.
    """

    def __init__(self):
        self.last = {}
        self.reports = []      # [(series_key, accept_length, accept_rate)]
        self.pages = 0
        self.present = False

    def start(self, samples_or_text):
        self.last = spec_gauges(samples_or_text)
        self.present = self.present or bool(self.last)

    def observe(self, samples_or_text):
        current = spec_gauges(samples_or_text)
        self.pages += 1
        self.present = self.present or bool(current)
        for key, pair in current.items():
            if pair != self.last.get(key) and pair.get("accept_length", 0) > 0:
                self.reports.append((key, pair.get("accept_length"), pair.get("accept_rate")))
        self.last = current

    def result(self):
        """``{"accept_length", "accept_rate", "reports", "last_accept_length", "present"}``.

        ``accept_length``/``accept_rate`` are means over the reports made in the
        window (``None`` when there was none).
        """
        lengths = [r[1] for r in self.reports if r[1] is not None]
        rates = [r[2] for r in self.reports if r[2] is not None]
        return {
            "accept_length": round(sum(lengths) / len(lengths), 3) if lengths else None,
            "accept_rate": round(sum(rates) / len(rates), 3) if rates else None,
            "last_accept_length": round(lengths[-1], 3) if lengths else None,
            "reports": len(self.reports),
            "present": self.present,
        }


# ---------------------------------------------------------------------------
# startup phases
# ---------------------------------------------------------------------------

def startup_phases_from_metrics(samples_or_text):
    """``{"load_weight", "kv_cache_allocation", "scheduler_e2e", "tokenizer_e2e",
    "cuda_graph": {phase: s}}`` from ``/metrics``, or ``None`` when absent.

    With several series (DP ranks, labels) the largest value per phase is kept,
    as SGLang keeps the critical path over its schedulers.
    """
    samples = _samples(samples_or_text)
    phases, graphs = {}, {}
    for s in samples:
        phase = s.labels.get("phase")
        if phase is None:
            continue
        if s.name == STARTUP_TIME:
            phases[phase] = max(phases.get(phase, 0.0), s.value)
        elif s.name == STARTUP_CUDA_GRAPH_TIME:
            graphs[phase] = max(graphs.get(phase, 0.0), s.value)
    if not phases:
        return None
    out = {p: phases[p] for p in STARTUP_PHASES if p in phases}
    out.update({p: v for p, v in phases.items() if p not in out})
    out["cuda_graph"] = graphs
    return out


_KV = re.compile(r"([a-z_][a-z0-9_]*)=([0-9.eE+-]+|\{[^}]*\})")


def parse_startup_line(line):
    """Phases from one ``Engine startup timings (s): ...`` log line, or ``None``."""
    at = (line or "").find(STARTUP_LOG_MARK)
    if at < 0:
        return None
    body = line[at + len(STARTUP_LOG_MARK):]
    out, graphs = {}, {}
    for key, raw in _KV.findall(body):
        if raw.startswith("{"):
            for gkey, graw in _KV.findall(raw):
                try:
                    graphs[gkey] = float(graw)
                except ValueError:
                    return None
            continue
        try:
            out[key] = float(raw)
        except ValueError:
            return None
    if not all(p in out for p in STARTUP_PHASES):
        return None
    out["cuda_graph"] = graphs
    return out


def startup_phases_from_log(text):
    """Phases of the last ``Engine startup timings`` line of a log, or ``None``."""
    found = None
    for line in (text or "").splitlines():
        parsed = parse_startup_line(line)
        if parsed is not None:
            found = parsed
    return found


def startup_seconds(phases):
    """Engine startup in seconds from phases (``tokenizer_e2e`` spans the whole
    engine start up to the schedulers' readiness; never below ``scheduler_e2e``)."""
    if not phases:
        return None
    values = [phases.get("tokenizer_e2e"), phases.get("scheduler_e2e")]
    values = [float(v) for v in values if isinstance(v, (int, float))]
    return max(values) if values else None


def startup_budget(phases, default, margin=2.0, floor=60.0, cap=3600.0):
    """A startup timeout from the previous launch's ``phases``.

    ``startup_seconds(phases) * margin`` clamped to ``[floor, cap]``;
    ``default`` when there is no previous figure (a first launch). Returns
    ``(seconds, source)`` with source ``"previous"`` or ``"default"``.
    """
    if margin <= 0 or floor < 0 or cap < floor:
        raise ValueError("startup_budget needs margin > 0 and 0 <= floor <= cap (got %r, %r, %r)" % (margin, floor, cap))
    seconds = startup_seconds(phases)
    if seconds is None:
        return float(default), "default"
    return min(cap, max(floor, seconds * margin)), "previous"


# ---------------------------------------------------------------------------
# PD disaggregation
# ---------------------------------------------------------------------------

def pd_queue_depths(samples_or_text):
    """``{"prefill_bootstrap", "prefill_inflight", "decode_prealloc", "decode_transfer"}``:
    each queue summed over its series, ``None`` where the page lacks the gauge
    (a server that is not in that PD role, or metrics off)."""
    samples = _samples(samples_or_text)
    return {short: total(samples, name) for short, name in PD_QUEUES.items()}
