# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Where a long module run stands, read from the node without touching anything (``sglang_progress``).

The ``sglang_replace`` action runs its module as an Ansible async job and, every ``progress_interval`` seconds,
runs ``sglang_progress``, which waits on the node for the job to end (at most the interval) and otherwise reads
what this file reads: the node journal's step, the last line of the server's log (secrets masked), the processes
that hold the target GPUs' device files, and whether the async job has finished. The line the controller prints
is built by :func:`line` (docs/user-guide.md, "Progress while the server loads").
"""

from __future__ import annotations

import json
import os
import time

from ansible_collections.gpufleet.sglang.plugins.module_utils.common import secrets as secret_rules
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import observe
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import procfs
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import journal as journal_mod

TAIL_BYTES = 16384
LINE_MAX = 200
POLL_S = 0.2


def last_log_line(path, secrets=(), max_bytes=TAIL_BYTES):
    """The last non-empty line of the file at ``path``, secrets masked and cut to LINE_MAX characters; None when the
    file is missing, unreadable or empty."""
    if not path:
        return None
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except OSError:
        return None
    return last_line(data.decode("utf-8", errors="replace"), secrets)


def last_line(text, secrets=()):
    """The last non-empty line of ``text`` (progress bars end their updates with ``\\r``), masked and cut."""
    for raw in reversed((text or "").replace("\r", "\n").split("\n")):
        raw = raw.strip()
        if raw:
            masked = secret_rules.mask_text(raw, secrets)
            return masked if len(masked) <= LINE_MAX else masked[:LINE_MAX - 3] + "..."
    return None


def job_state(async_dir, jid):
    """``"running"``, ``"finished"`` or ``"missing"`` for the async job ``jid`` (as ``async_status`` reads it: the
    job file holds ``started`` until the module's own result replaces it)."""
    path = os.path.join(os.path.expanduser(async_dir), jid)
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        return "missing"
    except OSError:
        return "running"
    try:
        data = json.loads(text)
    except ValueError:
        return "running"          # being written (the wrapper writes a temporary file and renames it)
    return "running" if isinstance(data, dict) and "started" in data and not data.get("finished") else "finished"


def wait_job(async_dir, jid, seconds, sleep=time.sleep, clock=time.monotonic):
    """Wait at most ``seconds`` for the job to leave ``running``; returns its state."""
    deadline = clock() + max(0.0, float(seconds))
    while True:
        state = job_state(async_dir, jid)
        if state != "running" or clock() >= deadline:
            return state
        sleep(min(POLL_S, max(0.0, deadline - clock())))


def gpu_holders(gpus, device_paths=()):
    """``[{"pid", "name", "gpus"}]`` of the processes with a target GPU's device file open (read from /proc)."""
    if not gpus:
        return []
    table = procfs.process_table(with_cgroup=False)
    out = []
    for pid, indices in sorted(observe.gpu_users(table, gpus, observe.patterns_for(device_paths)).items()):
        info = table.get(pid)
        out.append({"pid": pid, "name": info.comm if info else None, "gpus": indices})
    return out


def read(journal_path=None, log_file=None, gpus=(), device_paths=(), secrets=(), now=None):
    """What the node shows now: ``{"step", "detail", "step_s", "run_id", "log", "gpu_holders"}``."""
    now = time.time() if now is None else now
    entry = journal_mod.read(journal_path) if journal_path else {}
    out = {"step": entry.get("step"), "detail": entry.get("detail"), "run_id": entry.get("run_id"), "step_s": None,
           "log": last_log_line(log_file, secrets), "gpu_holders": gpu_holders(gpus, device_paths)}
    if entry.get("corrupt"):
        out["detail"] = entry["corrupt"]
    if entry.get("at"):
        out["step_s"] = round(max(0.0, now - float(entry["at"])), 1)
    if out["detail"]:
        out["detail"] = secret_rules.mask_text(str(out["detail"]), secrets)
    return out


def _holders(holders, gpus):
    if not holders:
        return "GPU %s free" % ",".join(str(g) for g in gpus) if gpus else None
    by_pid = ["PID %s (%s) on GPU %s" % (h["pid"], h.get("name") or "?", ",".join(str(g) for g in h.get("gpus") or []))
              for h in holders[:4]]
    more = " and %d more" % (len(holders) - 4) if len(holders) > 4 else ""
    return "GPUs held: %s%s" % (", ".join(by_pid), more)


def line(host, what, elapsed, node, budgets=None, gpus=()):
    """One progress line: the host, the run, the seconds so far, the journal step against its budget, the GPU
    holders and the server log's last line."""
    budgets = budgets or {}
    parts = ["%s: %s %d s" % (host, what, int(elapsed))]
    step = node.get("step")
    if step:
        text = "step %s" % step
        if node.get("step_s") is not None:
            text += " for %d s" % int(node["step_s"])
            if budgets.get(step):
                text += " of %d s" % int(budgets[step])
        if node.get("detail"):
            text += " (%s)" % node["detail"]
        parts.append(text)
    held = _holders(node.get("gpu_holders") or [], gpus)
    if held:
        parts.append(held)
    if node.get("log"):
        parts.append("log: %s" % node["log"])
    return "; ".join(parts)
