"""``results.json`` and ``summary.md`` of one kit run.

The JSON is rewritten after every check, so a run cut short (timeout, crash)
still leaves what it measured. Everything that goes in is masked with the
run's :class:`mask.Masker` (no host name, serial or real UUID).

Schema (``format`` 1)::

    {
      "format": 1,
      "kit": "gpufleet.sglang tests/gpu",
      "mode": "real" | "sim",            # sim: the rehearsal against the simulator
      "started_at": "...Z", "finished_at": "...Z" | null, "seconds": 12.3,
      "environment": {"gpu": {...}, "driver_version": "...", "python": "...", "allocator": "...", ...},
      "checks": [{"name", "status": "passed|failed|skipped|error", "seconds", "message", "details": {...}}],
      "measurements": {"idle_used_mib": ..., "release_latency": {...}, "nvml_vs_smi": {...}, ...},
      "fidelity": {"<slug>@<state>": ["difference", ...]},
      "summary": {"passed": n, "failed": n, "skipped": n, "error": n}
    }
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import sys
import time

FORMAT = 1
STATUSES = ("passed", "failed", "skipped", "error")


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def default_out_dir(base, mode="real"):
    """``<base>/<UTC timestamp>`` (``sim-<UTC timestamp>`` for a rehearsal), as run.sh names it."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return os.path.join(base, ("sim-" if mode == "sim" else "") + stamp)


class Results(object):
    """Collects checks and measurements; :meth:`write` produces both files."""

    def __init__(self, out_dir, masker=None, mode="real"):
        self.out_dir = out_dir
        self.masker = masker
        self.start = time.monotonic()
        self.data = {
            "format": FORMAT,
            "kit": "gpufleet.sglang tests/gpu",
            "mode": mode,
            "started_at": utc_now(),
            "finished_at": None,
            "seconds": 0.0,
            "environment": {"python": platform.python_version(), "platform": platform.platform(terse=True),
                            "argv": list(sys.argv[:1])},
            "checks": [],
            "measurements": {},
            "fidelity": {},
            "summary": dict((s, 0) for s in STATUSES),
        }

    def _mask(self, obj):
        return self.masker.mask_obj(obj) if self.masker is not None else obj

    def set_env(self, **values):
        self.data["environment"].update(self._mask(values))

    def measure(self, key, value):
        self.data["measurements"][key] = self._mask(value)

    def set_fidelity(self, diffs):
        self.data["fidelity"] = self._mask(diffs)

    def check(self, name, status, seconds=0.0, message="", details=None):
        if status not in STATUSES:
            raise ValueError("status must be one of %s, got %r" % (", ".join(STATUSES), status))
        entry = {"name": name, "status": status, "seconds": round(float(seconds), 3),
                 "message": self._mask(message or ""), "details": self._mask(details or {})}
        self.data["checks"] = [c for c in self.data["checks"] if c["name"] != name] + [entry]
        self._recount()
        return entry

    def _recount(self):
        summary = dict((s, 0) for s in STATUSES)
        for c in self.data["checks"]:
            summary[c["status"]] += 1
        self.data["summary"] = summary

    @property
    def ok(self):
        s = self.data["summary"]
        return s["failed"] == 0 and s["error"] == 0 and s["passed"] > 0

    def finish(self):
        self.data["finished_at"] = utc_now()
        return self.write()

    def write(self):
        """Write ``results.json`` and ``summary.md``; returns their paths."""
        self.data["seconds"] = round(time.monotonic() - self.start, 2)
        os.makedirs(self.out_dir, exist_ok=True)
        json_path = os.path.join(self.out_dir, "results.json")
        md_path = os.path.join(self.out_dir, "summary.md")
        tmp = json_path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(self.data, fh, indent=1, sort_keys=True, default=str)
            fh.write("\n")
        os.replace(tmp, json_path)
        with open(md_path, "w", encoding="utf-8") as fh:
            fh.write(render_markdown(self.data))
        return json_path, md_path


def _fmt(value, unit=""):
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return "%.3f%s" % (value, unit)
    return "%s%s" % (value, unit)


def render_markdown(data):
    """A short human summary of a results dict."""
    env = data.get("environment", {})
    gpu = env.get("gpu") or {}
    s = data.get("summary", {})
    if s.get("passed") and not s.get("failed") and not s.get("error"):
        verdict = "PASSED"
    elif s.get("failed") or s.get("error"):
        verdict = "FAILED"
    else:
        verdict = "NOTHING RAN"
    lines = ["# GPU validation kit: %s" % verdict, ""]
    lines.append("- mode: %s%s" % (data.get("mode"), " (simulator rehearsal, not a real GPU)" if data.get("mode") == "sim" else ""))
    lines.append("- started: %s, finished: %s, %.1f s"
                 % (data.get("started_at"), data.get("finished_at") or "(unfinished)", float(data.get("seconds") or 0)))
    if gpu:
        lines.append("- GPU: %s x %s (simulator preset %s)" % (gpu.get("count"), gpu.get("name"), gpu.get("model")))
    for key in ("driver_version", "allocator", "python", "ansible"):
        if env.get(key):
            lines.append("- %s: %s" % (key.replace("_", " "), env[key]))
    lines.append("- checks: %d passed, %d failed, %d error, %d skipped" % (
        s.get("passed", 0), s.get("failed", 0), s.get("error", 0), s.get("skipped", 0)))
    lines += ["", "| check | status | seconds | message |", "|---|---|---|---|"]
    for c in data.get("checks", []):
        msg = (c.get("message") or "").replace("|", "\\|").replace("\n", " ")
        if len(msg) > 160:
            msg = msg[:157] + "..."
        lines.append("| %s | %s | %.1f | %s |" % (c["name"], c["status"], c.get("seconds") or 0, msg))
    m = data.get("measurements", {})
    if m:
        lines += ["", "## Measurements", ""]
        if "idle_used_mib" in m:
            lines.append("- idle memory.used on GPU 0: %s MiB" % _fmt(m["idle_used_mib"]))
        rl = m.get("release_latency") or {}
        if rl.get("samples"):
            lines.append("- memory release after SIGKILL (%d x %s MiB): median %s s, max %s s (process gone after median %s s)" % (
                len(rl["samples"]), rl.get("mib"), _fmt(rl.get("median_s")), _fmt(rl.get("max_s")),
                _fmt(rl.get("median_exit_s"))))
        keeper = m.get("forked_keeper") or {}
        if keeper:
            lines.append("- forked child keeping the device fds after its parent's SIGKILL: memory held %s, keeper listed %s" % (
                keeper.get("memory_held_while_keeper_alive"), keeper.get("keeper_listed")))
        nv = m.get("nvml_vs_smi") or {}
        if nv:
            lines.append("- NVML vs nvidia-smi: %s; per poll: NVML %s ms, nvidia-smi %s ms (median of %s)" % (
                "same numbers" if nv.get("same") else "DIFFERENT: %s" % "; ".join(nv.get("differences", [])[:3]),
                _fmt(nv.get("nvml_ms_median")), _fmt(nv.get("smi_ms_median")), nv.get("polls")))
        esc = m.get("sigterm_escalation") or {}
        if esc:
            lines.append("- SIGTERM ignored -> SIGKILL: signals %s, gone after %s s" % (
                esc.get("signals"), _fmt(esc.get("seconds_to_exit"))))
    fid = data.get("fidelity") or {}
    if fid:
        bad = dict((k, v) for k, v in fid.items() if v)
        lines += ["", "## Format fidelity (real vs simulator)", ""]
        lines.append("- %d queries compared, %d with differences" % (len(fid), len(bad)))
        for key in sorted(bad):
            for d in bad[key][:5]:
                lines.append("  - `%s`: %s" % (key, d))
    lines.append("")
    return "\n".join(lines)
