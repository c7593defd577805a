"""oracle.resolve_in_image (issue 24): the node oracle run inside the server's container image.

A fake container CLI (a Python script) records its argv and stdin, and plays the container: it runs the helper with
this interpreter and the simulator's fake SGLang. The real runtimes are exercised by
tests/integration/test_images.py (podman and a private dockerd).
"""
from __future__ import annotations

import json
import os
import stat
import sys

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import oracle

H200 = {"name": "NVIDIA H200", "compute_capability": "9.0", "memory_mib": 143771, "count": 8}
FAKE = r'''#!%(python)s
import json, os, subprocess, sys, time
log = %(log)r
argv = sys.argv[1:]
data = sys.stdin.buffer.read() if argv[0] == "run" else b""
with open(log, "a") as fh:
    fh.write(json.dumps({"argv": argv, "stdin": data.decode(), "pid": os.getpid()}) + "\n")
if argv[0] != "run":
    sys.exit(0)
if os.environ.get("FAKE_HANG"):
    time.sleep(300)
image = argv.index(%(image)r)
source = argv[image + 2]
env = dict(os.environ, PYTHONPATH=%(sim)r)
proc = subprocess.run([sys.executable, "-c", source], input=data, env=env)
sys.exit(proc.returncode)
'''


@pytest.fixture
def cli(tmp_path):
    log = tmp_path / "calls.jsonl"
    path = tmp_path / "docker"
    sim = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..", "simulator", "python")
    path.write_text(FAKE % {"python": sys.executable, "log": str(log), "image": "sha256:" + "ab" * 32,
                            "sim": os.path.realpath(sim)})
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return {"path": str(path), "calls": lambda: [json.loads(line) for line in log.read_text().splitlines()]}


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "llama"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    return str(path)


IMAGE = "sha256:" + "ab" * 32


def test_the_image_answers_and_the_request_goes_on_stdin(cli, model):
    answer = oracle.resolve_in_image(cli["path"], IMAGE, {"model_path": model, "tp_size": 2, "api_key": "s3cret-key"},
                                     "0.5.10", H200, env={"SGLANG_SIM_VERSION": "0.5.10", "HF_TOKEN": "hf_s3cret"},
                                     mounts=[model, ("/host/x", "/ctr/x")])
    assert answer["ok"] is True and answer["sglang_version"] == "0.5.10"    # the env was applied inside
    assert answer["args"]["tp_size"] == 2 and answer["image"] == IMAGE and answer["python"] == "python3"
    assert answer["source"] == "node"
    (call,) = cli["calls"]()
    argv = call["argv"]
    i = argv.index(IMAGE)
    assert argv[:i] == ["run", "--rm", "-i", "--network", "none", "--pull", "never", "--name", argv[8], "--label",
                        "gpufleet.sglang.role=oracle", "-v", "%s:%s:ro" % (model, model), "-v", "/host/x:/ctr/x:ro",
                        "--entrypoint", "python3"]
    assert argv[8].startswith("gpufleet-oracle-%d-" % os.getpid())
    assert argv[i + 1] == "-c" and len(argv) == i + 3 and "def main():" in argv[i + 2]
    assert not any(a.startswith(("--gpus", "--device")) for a in argv)
    joined = "\0".join(argv)
    assert "s3cret" not in joined and "SGLANG_SIM_VERSION" not in joined       # never a secret, nor env, in argv
    request = json.loads(call["stdin"])
    assert request["env"] == {"SGLANG_SIM_VERSION": "0.5.10", "HF_TOKEN": "hf_s3cret"} and request["gpu"] == H200
    assert "s3cret-key" not in call["stdin"]                                  # secrets are not sent to the resolution


def test_an_argv_list_and_the_secret_masked(cli, model):
    answer = oracle.resolve_in_image(cli["path"], IMAGE, ["--model-path", model, "--api-key", "s3cret-key"], "0.5.23", H200)
    assert answer["ok"] is True and answer["args"]["api_key"] == "********" and "s3cret-key" not in json.dumps(answer)


def test_a_refusal_is_an_answer(cli, model):
    answer = oracle.resolve_in_image(cli["path"], IMAGE, ["--model-path", model, "--no-such-flag"], "0.5.23", H200)
    assert answer["ok"] is False and answer["error"]["type"] == "ArgumentError"


def test_the_runtime_failing_is_unavailable_and_named(tmp_path):
    path = tmp_path / "podman"
    path.write_text("#!/bin/sh\necho 'Error: localhost/x:1: image not known' >&2\nexit 125\n")
    path.chmod(0o755)
    with pytest.raises(oracle.OracleUnavailable) as err:
        oracle.resolve_in_image(str(path), "localhost/x:1", ["--model-path", "/m"], "0.5.23", H200)
    assert str(err.value) == ("the SGLang of image localhost/x:1 (podman) could not resolve the arguments: the helper "
                              "exited 125 without a JSON answer (stdout ''; stderr: Error: localhost/x:1: image not known)")


@pytest.mark.parametrize("mount", ["relative/path", "/a:b", "/a,b", ("/ok", "rel")])
def test_a_bad_mount_is_refused_before_anything_runs(cli, mount):
    with pytest.raises(oracle.OracleUnavailable) as err:
        oracle.resolve_in_image(cli["path"], IMAGE, ["--model-path", "/m"], "0.5.23", H200, mounts=[mount])
    assert "cannot mount" in str(err.value)
    assert not os.path.exists(os.path.join(os.path.dirname(cli["path"]), "calls.jsonl"))


def test_timeout_kills_the_client_and_removes_the_container_by_name(cli, monkeypatch):
    monkeypatch.setenv("FAKE_HANG", "1")
    with pytest.raises(oracle.OracleUnavailable) as err:
        oracle.resolve_in_image(cli["path"], IMAGE, ["--model-path", "/m"], "0.5.23", H200, timeout=2)
    assert "no answer within 2 s" in str(err.value) and "was killed" in str(err.value)
    run, rm = cli["calls"]()
    name = run["argv"][run["argv"].index("--name") + 1]
    assert rm["argv"] == ["rm", "--force", name]
    with pytest.raises(OSError):
        os.kill(run["pid"], 0)


def test_run_helper_still_checks_the_interpreter(tmp_path):
    with pytest.raises(oracle.OracleUnavailable) as err:
        oracle.run_helper("python3", {"argv": []})
    assert "the interpreter must be an absolute path" in str(err.value)
