"""`--profile`: where the module runs spend their time, from cProfile files.

Two kinds of profile are summed per module (action):

- the fork worker of each task (bench/_playbook.py, GPUFLEET_BENCH_WORKER_PROFILE): the controller's
  side of a module run (templating the arguments, the action plugin, building the AnsiballZ payload,
  the local connection, waiting for the module process);
- the module process itself (the interpreter wrapper runs it under cProfile, <recdir>/<pid>.prof).

Per module it prints the time in imports (``_find_and_load``, counted once however deep), waiting for
child processes (nvidia-smi, the oracle), sleeping, and the functions with the most own time.
"""
from __future__ import annotations

import glob
import os
import pstats

import _common as c

WAITS = {
    "imports": ("_find_and_load",),
    "child processes": ("waitpid", "communicate", "_communicate", "wait"),
    "sleep / poll / select": ("sleep", "poll", "select"),
    "AnsiballZ build": ("_find_module_utils", "modify_module", "_build_ansiballz"),
    "templating": ("template", "_template"),
}


def _load(paths):
    stats = None
    for path in paths:
        try:
            if stats is None:
                stats = pstats.Stats(path)
            else:
                stats.add(path)
        except (OSError, TypeError, EOFError, ValueError):
            continue
    return stats


def _summary(stats, runs):
    out = {"runs": runs, "total": 0.0, "parts": {}, "top": []}
    if stats is None:
        return out
    out["total"] = stats.total_tt / max(1, runs)
    for part, names in WAITS.items():
        best = 0.0
        for (filename, dummy_line, func), (dummy_cc, dummy_nc, tt, ct, dummy_callers) in stats.stats.items():
            del filename, tt
            if func in names or func.split(" ")[-1].rstrip(">").split(".")[-1] in names:
                best = max(best, ct)
        out["parts"][part] = best / max(1, runs)
    own = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:6]
    out["top"] = [("%s:%s(%s)" % (os.path.basename(k[0]), k[1], k[2]), v[2] / max(1, runs)) for k, v in own]
    return out


def summarise(worker_dir, module_profiles):
    """``module_profiles``: {action: [module process profile paths]}."""
    by_action = {}
    for path in glob.glob(os.path.join(worker_dir, "*.prof")):
        action = os.path.basename(path).rsplit("-", 1)[0]
        by_action.setdefault(action, []).append(path)
    workers = dict((a, _summary(_load(p), len(p))) for a, p in by_action.items())
    modules = dict((a, _summary(_load(p), len(p))) for a, p in module_profiles.items() if p)
    return {"workers": workers, "modules": modules}


def report(summary):
    lines = ["Profiles (--profile; cProfile slows everything down, compare the parts, not the totals):"]
    rows = []
    for action, s in sorted(summary["workers"].items(), key=lambda kv: -kv[1]["total"] * kv[1]["runs"]):
        if not action.startswith("gpufleet.sglang."):
            continue
        rows.append([action.replace("gpufleet.sglang.", ""), s["runs"], c.fmt(s["total"])]
                    + [c.fmt(s["parts"][p]) for p in WAITS])
    lines.append("fork workers of the module tasks (per run):")
    lines.append(c.table(["module", "runs", "total s"] + list(WAITS), rows))
    rows = []
    for action, s in sorted(summary["modules"].items(), key=lambda kv: -kv[1]["total"] * kv[1]["runs"]):
        rows.append([action.replace("gpufleet.sglang.", ""), s["runs"], c.fmt(s["total"])]
                    + [c.fmt(s["parts"][p]) for p in WAITS if p not in ("AnsiballZ build", "templating")])
    lines.append("module processes (per run):")
    lines.append(c.table(["module", "runs", "total s"] + [p for p in WAITS if p not in ("AnsiballZ build", "templating")],
                         rows))
    for action, s in sorted(summary["modules"].items()):
        lines.append("  %s, most own time: %s" % (action.replace("gpufleet.sglang.", ""),
                                                  "; ".join("%s %s s" % (f, c.fmt(t, 3)) for f, t in s["top"][:4])))
    return "\n".join(lines)
