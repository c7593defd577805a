"""The *shape* of nvidia-smi output, and the real-versus-simulator comparison.

Values differ between any two machines (memory figures, UUIDs, PIDs), so the
fidelity check compares shapes, not text:

* exit code, and whether stderr is empty;
* header present or not, header tokens in order (``memory.used [MiB]``);
* per row: the number of ``", "`` separators, and commas not followed by a space;
* per column: the classes of its values (``int``, ``uuid``, ``bus_id8``,
  ``text``, ...), the unit suffix (``MiB``, ``W``, ``%`` or none) and
  placeholder positions (``[N/A]``, bare ``N/A``, ``ERR!``, any ``[...]``);
* line endings (``\\n`` versus ``\\r\\n``), the trailing newline, blank lines;
* ``-L``: each line as a template (``GPU <n>: <name> (UUID: <uuid>)``);
* message lines (driver errors) as literal text.

:func:`compare` returns human-readable differences; an empty list means
"same shape".
"""
from __future__ import annotations

import re

UNITS = ("MiB", "KiB", "GiB", "W", "%", "MHz", "C")
_UNIT_RE = re.compile(r"^(-?\d+(?:\.\d+)?) (MiB|KiB|GiB|W|%|MHz|C)$")
_UUID_RE = re.compile(r"^(GPU|MIG)-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_BUS8_RE = re.compile(r"^[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]$")
_BUS4_RE = re.compile(r"^[0-9A-F]{4}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]$")
_TS_RE = re.compile(r"^\d{4}/\d{2}/\d{2} \d{2}:\d{2}:\d{2}\.\d{3}$")
_HEADER_TOKEN_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*(?: \[[^\]]+\])?$")
_LIST_RE = re.compile(r"^GPU (\d+): (.+?) \(UUID: (\S+)\)$")
_MIG_LIST_RE = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (\S+)\)$")


def is_placeholder(value):
    text = value.strip()
    return text.upper() in ("N/A", "ERR!") or (text.startswith("[") and text.endswith("]"))


def classify(value):
    """``(class, unit)`` of one CSV value."""
    text = value.strip()
    if text == "":
        return "empty", None
    if is_placeholder(text):
        return "placeholder", None
    match = _UNIT_RE.match(text)
    if match:
        return ("float" if "." in match.group(1) else "int"), match.group(2)
    if re.match(r"^-?\d+$", text):
        return "int", None
    if re.match(r"^-?\d+\.\d+$", text):
        return "float", None
    if _UUID_RE.match(text):
        return "uuid", None
    if _UUID_RE.match(text.lower()):
        return "uuid-uppercase", None
    if _BUS8_RE.match(text):
        return "bus_id8", None
    if _BUS4_RE.match(text):
        return "bus_id4", None
    if re.match(r"^0x[0-9A-Fa-f]+$", text):
        return "hex", None
    if _TS_RE.match(text):
        return "timestamp", None
    if text.startswith("/"):
        return "path", None
    return "text", None


def _is_message(line):
    low = line.lower()
    return any(m in low for m in ("nvidia-smi has failed", "couldn't find libnvidia-ml", "please also try adding",
                                  "failed to initialize nvml", "nvml library version", "no devices were found",
                                  "unable to determine the device handle", "is not a valid field",
                                  "format modifier", "invalid combination", "no devices found"))


def _split(line, ncols):
    if ncols <= 1:
        return [line]
    return line.split(", ", ncols - 1)


def shape_of(kind, fields, fmt, rc, stdout, stderr=""):
    """The shape of one capture (see the module docstring)."""
    text = stdout or ""
    shape = {
        "kind": kind,
        "rc": rc,
        "stderr_empty": not (stderr or "").strip(),
        "crlf": "\r\n" in text,
        "trailing_newline": text.endswith("\n") if text else None,
        "empty": text == "",
        "blank_lines": 0,
        "messages": [],
    }
    lines = text.replace("\r\n", "\n").split("\n")
    if lines and lines[-1] == "":
        lines = lines[:-1]
    content = []
    for line in lines:
        if line.strip() == "":
            shape["blank_lines"] += 1
        elif _is_message(line):
            shape["messages"].append(line.strip())
        else:
            content.append(line)
    if kind == "list":
        templates = []
        for line in content:
            m = _LIST_RE.match(line)
            mig = _MIG_LIST_RE.match(line)
            if m:
                templates.append("GPU <n>: <name> (UUID: <%s>)" % classify(m.group(3))[0])
            elif mig:
                templates.append("  MIG <profile> Device <n>: (UUID: <%s>)" % classify(mig.group(3))[0])
            else:
                templates.append("unrecognised: " + re.sub(r"\d+", "<n>", line))
        shape["templates"] = templates
        shape["rows"] = len(templates)
        return shape
    fields = list(fields or [])
    fmt = tuple(fmt or ())
    header = None
    rows = content
    if content and "noheader" not in fmt:
        first = content[0]
        tokens = first.split(", ")
        if all(_HEADER_TOKEN_RE.match(t) for t in tokens):
            header = tokens
            rows = content[1:]
    shape["header"] = header
    shape["header_units"] = [(_unit_of_header(t)) for t in header] if header else None
    ncols = len(header) if header else len(fields)
    shape["columns"] = ncols
    shape["rows"] = len(rows)
    seps = []
    bare = 0
    col_classes = [set() for _col in range(ncols)]
    col_units = [set() for _col in range(ncols)]
    placeholders = []
    for r, line in enumerate(rows):
        seps.append(line.count(", "))
        bare += len(re.findall(r",(?! )", line))
        values = _split(line, ncols)
        for c, value in enumerate(values[:ncols]):
            cls, unit = classify(value)
            col_classes[c].add(cls)
            col_units[c].add(unit)
            if cls == "placeholder":
                placeholders.append((r, c, value.strip()))
        for c in range(len(values), ncols):
            col_classes[c].add("missing")
    shape["separators"] = sorted(set(seps))
    shape["bare_commas"] = bare
    shape["column_classes"] = [sorted(s) for s in col_classes]
    shape["column_units"] = [sorted((u or "") for u in s) for s in col_units]
    shape["placeholders"] = placeholders
    return shape


def _unit_of_header(token):
    m = re.search(r"\[([^\]]+)\]$", token)
    return m.group(1) if m else None


def shape_of_capture(rec):
    """Shape of a capture dict (``kind``, ``fields``, ``format``, ``rc``, ``stdout``, ``stderr``)."""
    return shape_of(rec.get("kind"), rec.get("fields"), rec.get("format"), rec.get("rc"), rec.get("stdout"),
                    rec.get("stderr"))


def compare(a, b, names=("real", "sim"), compare_rows=True):
    """Differences between two shapes, as strings; empty when the shapes agree.

    ``compare_rows=False`` skips the row count (process lists differ between
    any two machines). Column classes and units are compared only where both
    sides have rows.
    """
    na, nb = names
    diffs = []

    def diff(what, va, vb):
        if va != vb:
            diffs.append("%s: %s=%r %s=%r" % (what, na, va, nb, vb))

    diff("exit code", a.get("rc"), b.get("rc"))
    diff("stderr empty", a.get("stderr_empty"), b.get("stderr_empty"))
    diff("line endings CRLF", a.get("crlf"), b.get("crlf"))
    if not a.get("empty") and not b.get("empty"):
        diff("trailing newline", a.get("trailing_newline"), b.get("trailing_newline"))
    elif compare_rows or a.get("kind") == "query-gpu":
        diff("empty output", a.get("empty"), b.get("empty"))
    diff("blank lines", a.get("blank_lines"), b.get("blank_lines"))
    diff("message lines", a.get("messages"), b.get("messages"))
    if a.get("kind") == "list" or b.get("kind") == "list":
        ta, tb = a.get("templates") or [], b.get("templates") or []
        if compare_rows:
            diff("-L line count", len(ta), len(tb))
        diff("-L line templates", sorted(set(ta)), sorted(set(tb)))
        return diffs
    ha, hb = a.get("header"), b.get("header")
    diff("header present", ha is not None, hb is not None)
    if ha is not None and hb is not None:
        for i in range(max(len(ha), len(hb))):
            diff("header token %d" % i, ha[i] if i < len(ha) else None, hb[i] if i < len(hb) else None)
    diff("column count", a.get("columns"), b.get("columns"))
    if compare_rows:
        diff("row count", a.get("rows"), b.get("rows"))
    both_rows = a.get("rows") and b.get("rows")
    if both_rows:
        diff("', ' separators per row", a.get("separators"), b.get("separators"))
        diff("commas without a following space", a.get("bare_commas"), b.get("bare_commas"))
        ca, cb = a.get("column_classes") or [], b.get("column_classes") or []
        ua, ub = a.get("column_units") or [], b.get("column_units") or []
        label = ha or hb or []
        for i in range(min(len(ca), len(cb))):
            name = label[i] if i < len(label) else "column %d" % i
            diff("value class of %s" % name, ca[i], cb[i])
            if i < len(ua) and i < len(ub):
                diff("unit suffix of %s" % name, ua[i], ub[i])
        pa = [(r, c) for r, c, _text in a.get("placeholders") or []]
        pb = [(r, c) for r, c, _text in b.get("placeholders") or []]
        if compare_rows:
            diff("placeholder positions (row, column)", pa, pb)
        else:
            diff("placeholder columns", sorted(set(c for _row, c in pa)), sorted(set(c for _row, c in pb)))
    return diffs


def compare_captures(real, sim, names=("real", "sim")):
    """Pair captures by slug and state; returns ``{key: [differences]}`` (every key present)."""
    by_key = {(r["slug"], r.get("state")): r for r in sim}
    out = {}
    for r in real:
        key = (r["slug"], r.get("state"))
        label = "%s@%s" % key if key[1] else key[0]
        other = by_key.get(key)
        if other is None:
            out[label] = ["no %s capture for %s" % (names[1], label)]
            continue
        compare_rows = r["kind"] != "query-apps"
        out[label] = compare(shape_of_capture(r), shape_of_capture(other), names=names, compare_rows=compare_rows)
    return out
