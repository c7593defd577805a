# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The node's last redeploy as a Prometheus node_exporter textfile (standard library only).

node_exporter's textfile collector reads every ``*.prom`` file of its directory on each scrape, so the file is
written whole and atomically: a temporary file in the same directory (a name that does not end in ``.prom``,
which the collector skips), fsync, mode 0644, then ``os.replace`` over the target. A scrape sees the old file
or the new one, never half of one.

The exposition format is Prometheus' text format 0.0.4: ``# HELP`` and ``# TYPE`` once per metric family,
before its samples; label values escape backslash, double quote and newline; HELP text escapes backslash
and newline.
"""

from __future__ import annotations

import math
import os
import re
import tempfile

PREFIX = "sglang_redeploy_"
STATUSES = ("deployed", "unchanged", "rolled_back", "failed")
MODES = ("restart", "weights", "none")
_NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


class TextfileError(Exception):
    """The textfile cannot be written (bad path, missing directory, no permission)."""


def escape_label(value):
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def escape_help(text):
    return str(text).replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value):
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def _labels(labels):
    if not labels:
        return ""
    return "{%s}" % ",".join('%s="%s"' % (k, escape_label(v)) for k, v in labels)


def _number(value, what):
    """A finite float, or None for an unknown figure (None, "", a non-number)."""
    if value is None or isinstance(value, bool) or value == "":
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise TextfileError("%s must be a number, got %r" % (what, value))
    return out if math.isfinite(out) else None


def families(record):
    """The metric families of ``record``: a list of ``(name, type, help, [(labels, value), ...])``.

    ``record``: ``server`` (the instance name), ``host``, ``run_id``, ``timestamp`` (seconds since the epoch),
    ``status`` (one of :data:`STATUSES`), ``mode`` (``restart``, ``weights`` or None), and the figures
    ``outage_s``, ``tokens_per_s``, ``accept_length`` and ``known_good_age_s`` (None when unknown: the sample is
    left out, never written as 0).
    """
    status = record.get("status")
    if status not in STATUSES:
        raise TextfileError("status must be one of %s, got %r" % (", ".join(STATUSES), status))
    mode = record.get("mode") or "none"
    if mode not in MODES:
        raise TextfileError("mode must be one of restart, weights or null, got %r" % (record.get("mode"),))
    base = [("server", record.get("server") or "main")]
    timestamp = _number(record.get("timestamp"), "timestamp")
    if timestamp is None:
        raise TextfileError("timestamp must be a number of seconds since the epoch, got %r" % (record.get("timestamp"),))
    out = [
        (PREFIX + "last_timestamp_seconds", "gauge", "When the last redeploy of this server ended (seconds since the epoch).",
         [(base, timestamp)]),
        (PREFIX + "last_info", "gauge", "The last redeploy of this server: its run id and inventory host (value 1).",
         [(base + [("run_id", record.get("run_id") or ""), ("host", record.get("host") or "")], 1)]),
        (PREFIX + "last_status", "gauge",
         "The outcome of the last redeploy: 1 for its status, 0 for the others (deployed, unchanged, rolled_back, failed).",
         [(base + [("status", s)], 1 if s == status else 0) for s in STATUSES]),
        (PREFIX + "last_mode", "gauge",
         "How the last redeploy changed the server: 1 for restart, weights (weights swapped in place) or none, 0 for the others.",
         [(base + [("mode", m)], 1 if m == mode else 0) for m in MODES]),
    ]
    figures = (
        ("last_outage_seconds", "outage_s",
         "Seconds the server did not serve during the last redeploy (teardown to healthy; the weight swap for mode weights)."),
        ("last_tokens_per_second", "tokens_per_s", "Output tokens per second the last redeploy's smoke gate measured."),
        ("last_accept_length", "accept_length", "Speculative accept length the last redeploy's smoke gate measured."),
        ("known_good_age_seconds", "known_good_age_s",
         "Age of the known-good config when the last redeploy ended (seconds since it was promoted)."),
    )
    for suffix, key, text in figures:
        value = _number(record.get(key), key)
        if value is not None:
            out.append((PREFIX + suffix, "gauge", text, [(base, value)]))
    return out


def render(record):
    """The textfile's content for ``record`` (see :func:`families`)."""
    lines = []
    for name, kind, text, samples in families(record):
        if not _NAME_RE.match(name):        # a programming error, not an input one
            raise ValueError("bad metric name %r" % name)
        lines.append("# HELP %s %s" % (name, escape_help(text)))
        lines.append("# TYPE %s %s" % (name, kind))
        for labels, value in samples:
            lines.append("%s%s %s" % (name, _labels(labels), format_value(value)))
    return "\n".join(lines) + "\n"


def check_path(path):
    """Why ``path`` cannot be a textfile for node_exporter, or None."""
    if not path or not os.path.isabs(path):
        return "must be an absolute path, got %r" % (path,)
    if not path.endswith(".prom"):
        return "must end in .prom (node_exporter's textfile collector reads only *.prom files), got %r" % (path,)
    return None


def write(path, content, mode=0o644, label="path"):
    """Write ``content`` to ``path`` atomically (temporary file in the same directory, fsync, chmod, rename).

    Returns True when the file changed. Raises :class:`TextfileError` with the path and the fix.
    """
    problem = check_path(path)
    if problem:
        raise TextfileError("%s %s" % (label, problem))
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        raise TextfileError("the directory %s of %s does not exist: create it, or point "
                            "%s into node_exporter's --collector.textfile.directory" % (directory, label, label))
    try:
        with open(path, encoding="utf-8") as fh:
            if fh.read() == content and (os.stat(path).st_mode & 0o777) == mode:
                return False
    except (OSError, ValueError):
        pass
    fd, tmp = None, None
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fd = None
            fh.write(content)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise TextfileError("cannot write %s %s: %s" % (label, path, exc))
    finally:
        if fd is not None:
            os.close(fd)
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return True


def known_good_age(config_dir, now):
    """Seconds since the known-good config was promoted (the newest file in ``<config_dir>/known-good``), or None."""
    directory = os.path.join(config_dir, "known-good")
    try:
        names = os.listdir(directory)
    except OSError:
        return None
    newest = None
    for name in names:
        try:
            st = os.stat(os.path.join(directory, name))
        except OSError:
            continue
        newest = st.st_mtime if newest is None else max(newest, st.st_mtime)
    return None if newest is None else max(0.0, now - newest)
