"""The launcher's own path in a fresh process, without the oracle helper's machinery.

Run with a release's interpreter (tests/differential/env.py): reads
``{"gpu", "requests": [{"argv"}, ...]}`` as JSON on stdin and, for each request in a child
forked after the import and before any resolution (so each one starts from a fresh SGLang), does what ``python -m sglang.launch_server`` does before it starts
serving (``prepare_server_args(argv)``; ``resolve_once()`` where it exists;
``check_server_args()``) and writes one ``{"ok", "args", "error", "log_line"}`` per request (a JSON list), where
``log_line`` is the ``server_args=...`` line the engine logs at startup, formatted as that
release's engine formats it (0.4.6-0.5.10: ``f"{server_args=}"``; 0.5.23: the resolved
dict through ``redact_watermark_secrets``).

Only the GPU queries are answered, with the helper's own ``install_cuda_guard`` (there is
no GPU here); no batching, no fork, no log capture, no stdout redirection.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "plugins", "module_utils", "sglang"))


def resolve(argv):
    import oracle_helper

    out = {"ok": False, "args": None, "error": None, "log_line": None}
    try:
        from sglang.srt.server_args import prepare_server_args

        server_args = prepare_server_args(argv)
        if hasattr(server_args, "resolve_once"):
            server_args.resolve_once()
        server_args.check_server_args()
        if hasattr(server_args, "resolved_dict"):
            from sglang.srt.sampling.watermarking.core import redact_watermark_secrets

            values = server_args.resolved_dict()
            out["log_line"] = "server_args=%s" % (redact_watermark_secrets(values),)
        else:
            values = dict((f.name, getattr(server_args, f.name)) for f in dataclasses.fields(server_args))
            out["log_line"] = f"{server_args=}"
        out["args"] = dict((k, oracle_helper._json_safe(v)) for k, v in values.items())
        out["ok"] = True
    except SystemExit as exc:
        out["error"] = {"type": "ArgumentError", "message": "argparse exit %s" % exc.code}
    except Exception as exc:
        out["error"] = {"type": type(exc).__name__, "message": str(exc)}
    return out


def main():
    request = json.loads(sys.stdin.read())
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import oracle_helper

    import torch

    gpu = oracle_helper._gpu_facts(request.get("gpu"))
    oracle_helper.install_cuda_guard(torch, gpu)
    oracle_helper.install_smi_answer(gpu)
    real_stdout = os.dup(1)
    os.dup2(2, 1)
    # import once in the parent (no resolution has run, so every child still starts fresh)
    import sglang.srt.server_args  # noqa: F401

    try:
        __import__("sglang.srt.arg_groups.pipeline")
    except ImportError:
        pass
    answers = []
    for item in request["requests"]:
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            data = json.dumps(resolve(item["argv"]), default=str).encode()
            while data:
                data = data[os.write(write_fd, data):]
            os._exit(0)
        os.close(write_fd)
        chunks = []
        while True:
            chunk = os.read(read_fd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
        os.close(read_fd)
        os.waitpid(pid, 0)
        answers.append(json.loads(b"".join(chunks)))
    os.write(real_stdout, json.dumps(answers).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
