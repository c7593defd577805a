"""Run the real SGLang and the collection's mirror on the same configurations, and compare.

The real side goes through the collection's own oracle (``oracle.run_helper`` with
``oracle_helper``), in the release's interpreter (tests/differential/env.py), one batch
per GPU. The mirror is ``resolve(..., policy="mirror", gpu=...)``. Every field the mirror
reports is compared. An error on one side only is a disagreement; both refusing agrees
only when the reasons map to the same class (``REASONS``).

Run alone (prints the table; ``--list`` shows each disagreement)::

    .venv/bin/python tests/differential/driver.py [--list] [VERSION ...]
"""
from __future__ import annotations

import json
import pathlib
import re
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / ".collections"))

import cases as cases_mod  # noqa: E402 - after sys.path is set
import env as env_mod  # noqa: E402 - after sys.path is set

KNOWN_FILE = HERE / "known_differences.json"
VERSIONS = ("0.4.6.post5", "0.5.1", "0.5.10", "0.5.23")

# Reason classes of a refusal: (class, pattern on the real error "Type: message", pattern on the mirror's error).
REASONS = [
    ("choice", r"invalid choice", r"invalid choice|rejects '.*' at startup \(argparse"),
    ("unrecognized", r"unrecognized arguments", r"unrecognized arguments|not accepted after"),
    ("trtllm_topk", r"trtllm_mha backend only supports topk = 1", r"trtllm_mha backend only supports topk = 1"),
    ("trtllm_sm100", r"TRTLLM MHA backend.*(Blackwell|SM100)", r"TRTLLM MHA backend.*(Blackwell|SM100)"),
    ("trtllm_mla_sm100", r"TRTLLM MLA backend.*(Blackwell|SM100)", r"TRTLLM MLA backend.*(Blackwell|SM100)"),
    ("unknown_algorithm", r"Unknown speculative algorithm name", r"Unknown speculative algorithm name"),
    ("adaptive_steps", r"is not in the adaptive config candidate_steps", r"is not in the adaptive config candidate_steps"),
    ("dflash_draft", r"DFLASH speculative decoding requires setting", r"DFLASH speculative decoding requires setting"),
    ("page_topk", r"page_size > 1|page_size\(\d+\) > 1", r"with page_size > 1|page_size\(\d+\) > 1"),
    ("page_mtp_flashinfer", r"page_size != 1 is not supported", r"page_size != 1 is not supported"),
    ("bare_assert", r"^AssertionError: $", r"bare AssertionError"),
    ("dp_size_needed", r"Please set a dp-size > 1", r"Please set a dp-size > 1"),
    ("topk_missing", r"TypeError: '>' not supported between instances of 'NoneType' and 'int'", r"TypeError"),
    ("pp_spec", r"[Pp]ipeline parallel|PP \+ speculative", r"[Pp]ipeline parallel|PP \+ speculative"),
    ("model_unknown", r"does not recognize this architecture", r"cannot read a .* checkpoint"),
    ("standalone_dp", r"standalone speculative decoding does not support dp attention",
     r"standalone speculative decoding does not support dp attention"),
    ("ngram_dp", r"ngram speculative decoding does not support dp attention",
     r"ngram speculative decoding does not support dp attention"),
    ("spec_v2_topk", r"Spec v2 currently only supports topk = 1", r"Spec v2 currently only supports topk = 1"),
    ("ngram_device", r"Ngram speculative decoding only supports", r"Ngram speculative decoding only supports"),
    ("mixed_chunk", r"enable_mixed_chunk is not supported", r"enable_mixed_chunk is not supported"),
    ("dp_attention", r"dp_size|dp attention|data parallel", r"dp_size|dp attention|data parallel"),
]


def reason_of_real(error):
    text = "%s: %s" % (error.get("type"), error.get("message") or "")
    for name, real, _mirror in REASONS:
        if re.search(real, text):
            return name
    return "other: " + text[:160]


def reason_of_mirror(errors):
    text = " | ".join(errors)
    for name, _real, mirror in REASONS:
        if re.search(mirror, text):
            return name
    return "other: " + text[:160]


def naive_argv(args, paths):
    """argv tokens for ``args`` without the collection's renderer (the real parser decides)."""
    argv = ["--model-path", paths["model"]]
    if paths.get("draft"):
        argv += ["--speculative-draft-model-path", paths["draft"]]
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, list):
            argv += [flag] + [str(v) for v in value]
        else:
            argv += [flag, str(value)]
    return argv


def full_args(case, model_paths):
    args = {"model_path": model_paths[case["model"]]}
    if case.get("draft"):
        args["speculative_draft_model_path"] = model_paths[case["draft"]]
    args.update(case["args"])
    return args


def run_real(release, cases, model_paths, timeout=1200):
    """{case id: answer} from the real release, one helper process per GPU."""
    from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import oracle

    answers, timings = {}, {}
    for gpu in sorted({c["gpu"] for c in cases}):
        batch = [c for c in cases if c["gpu"] == gpu]
        request = {"gpu": cases_mod.GPUS[gpu], "requests": [
            {"argv": naive_argv(c["args"], {"model": model_paths[c["model"]],
                                            "draft": model_paths.get(c.get("draft"))}), "env": c["env"]}
            for c in batch]}
        started = time.time()
        answer = oracle.run_helper(release.python, request, timeout=timeout, env=release.env())
        timings[gpu] = {"import_s": answer.get("import_s"), "total_s": round(time.time() - started, 1),
                        "version": answer.get("sglang_version")}
        for case, result in zip(batch, answer["results"]):
            answers[case["id"]] = result
    return answers, timings


def run_mirror(version, case, model_paths):
    from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import resolve

    draft_arch = cases_mod.DRAFTS[case["draft"]]["architectures"][0] if case.get("draft") in cases_mod.DRAFTS else None
    return resolve.resolve(full_args(case, model_paths), version, arch=cases_mod.ARCH[case["model"]],
                           policy="mirror", draft_arch=draft_arch, env=case["env"] or None,
                           gpu=cases_mod.GPUS[case["gpu"]])


def _same(a, b):
    if isinstance(a, bool) or isinstance(b, bool):
        return bool(a) == bool(b) if (a is None or b is None) else a == b
    if isinstance(a, float) or isinstance(b, float):
        try:
            return abs(float(a) - float(b)) < 1e-9
        except (TypeError, ValueError):
            return False
    return a == b


def compare(case, real, mirror):
    """None when they agree, else a short description of the difference."""
    if not real["ok"] and mirror["errors"]:
        real_reason, mirror_reason = reason_of_real(real["error"]), reason_of_mirror(mirror["errors"])
        if real_reason == mirror_reason:
            return None
        return {"kind": "both refuse, different reasons", "real": real_reason, "mirror": mirror_reason}
    if not real["ok"]:
        return {"kind": "real refuses, mirror starts", "real": reason_of_real(real["error"])}
    if mirror["errors"]:
        return {"kind": "mirror refuses, real starts", "mirror": reason_of_mirror(mirror["errors"])}
    fields = {}
    for field, value in mirror["args"].items():
        if field not in real["args"]:
            continue
        if not _same(value, real["args"][field]):
            fields[field] = {"mirror": value, "real": real["args"][field]}
    if fields:
        return {"kind": "fields differ", "fields": fields}
    return None


def load_known():
    if not KNOWN_FILE.exists():
        return []
    return json.loads(KNOWN_FILE.read_text())["differences"]


def known_reason(known, version, case_id):
    release = ".".join(version.split(".")[:3])
    for entry in known:
        if entry["version"] in (version, release, "*") and re.fullmatch(entry["case"], case_id):
            return entry["reason"]
    return None


def run_version(version, count=300, workdir=None, log=print):
    releases = env_mod.ensure([version], log=log)
    workdir = pathlib.Path(workdir or tempfile.mkdtemp(prefix="sglang-differential-"))
    model_paths = cases_mod.write_models(workdir / "models")
    cases = cases_mod.generate(version, count)
    real, timings = run_real(releases[version], cases, model_paths)
    known = load_known()
    rows = []
    for case in cases:
        mirror = run_mirror(version, case, model_paths)
        answer = real[case["id"]]
        diff = compare(case, answer, mirror)
        compared = len([f for f in mirror["args"] if f in (answer.get("args") or {})]) if answer["ok"] else 0
        rows.append({"case": case, "diff": diff, "known": known_reason(known, version, case["id"]) if diff else None,
                     "guard": answer.get("cuda_guard"), "real_ok": bool(answer["ok"]), "compared": compared,
                     "real": answer})
    return {"version": version, "rows": rows, "timings": timings, "models": model_paths}


def summary(result):
    rows = result["rows"]
    agree = sum(1 for r in rows if r["diff"] is None)
    known = sum(1 for r in rows if r["diff"] is not None and r["known"])
    return {"version": result["version"], "configs": len(rows), "agree": agree,
            "percent": 100.0 * agree / len(rows) if rows else 0.0, "known": known,
            "unknown": len(rows) - agree - known, "refused": sum(1 for r in rows if not r["real_ok"]),
            "fields": sum(r["compared"] for r in rows)}


def table(summaries):
    lines = ["%-12s %8s %8s %8s %8s %8s %12s %10s" % ("version", "configs", "agree", "%", "known", "unlisted",
                                                      "real refuses", "fields")]
    for s in summaries:
        lines.append("%-12s %8d %8d %8.1f %8d %8d %12d %10d" % (
            s["version"], s["configs"], s["agree"], s["percent"], s["known"], s["unknown"], s["refused"], s["fields"]))
    return "\n".join(lines)


def main(argv):
    show = "--list" in argv
    versions = [a for a in argv if not a.startswith("--")] or list(VERSIONS)
    summaries = []
    for version in versions:
        started = time.time()
        result = run_version(version)
        summaries.append(summary(result))
        print("%s: %.0f s %s" % (version, time.time() - started, json.dumps(result["timings"])))
        if show:
            for row in result["rows"]:
                if row["diff"] is not None:
                    print("  %s%s %s %s args=%s -> %s" % ("[known] " if row["known"] else "", row["case"]["id"],
                                                          row["case"]["gpu"], row["case"]["model"],
                                                          json.dumps(row["case"]["args"]),
                                                          json.dumps(row["diff"], default=str)))
    print(table(summaries))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
