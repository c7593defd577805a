"""Show what one real release and the mirror make of one configuration (a debugging aid).

    .venv/bin/python tests/differential/probe.py VERSION sm90|sm100 MODEL '{"speculative_algorithm": "EAGLE"}' [FIELD ...]
"""
from __future__ import annotations

import json
import sys
import tempfile

import driver
import env as env_mod
import cases as cases_mod


def main(argv):
    version, gpu, model, args = argv[0], argv[1], argv[2], json.loads(argv[3])
    fields = argv[4:] or ["attention_backend", "page_size", "speculative_eagle_topk", "speculative_num_steps",
                          "speculative_num_draft_tokens", "dp_size", "attn_dp_size", "enable_dp_attention"]
    case = {"id": "probe", "gpu": gpu, "model": model, "args": args, "env": {}, "draft": None, "version": version}
    paths = cases_mod.write_models(tempfile.mkdtemp(prefix="probe-"))
    release = env_mod.ensure([version])[version]
    real, _t = driver.run_real(release, [case], paths)
    real = real["probe"]
    mirror = driver.run_mirror(version, case, paths)
    print("real ok=%s error=%s" % (real["ok"], json.dumps(real.get("error"), indent=1)))
    print("real warnings:", json.dumps(real["warnings"], indent=1))
    print("mirror errors:", mirror["errors"])
    for field in fields:
        print("  %-32s real=%-20r mirror=%r" % (field, (real.get("args") or {}).get(field), mirror["args"].get(field)))
    print("diff:", driver.compare(case, real, mirror))


if __name__ == "__main__":
    main(sys.argv[1:])
