"""module_utils/server/container_control.py: the docker and podman managers' ``run`` argv, options and secrets (issue 24).

The argv is checked word by word (what the container gets: the target GPUs only, --ipc host, the ulimits, read-only model
mounts, the labels, --pull never), the secrets are in no argv word and no label (they go through the 0600 files), and the
bootstrap that loads the secret env inside the container is run for real with this Python. The runtime itself is
exercised against real podman in tests/integration/test_container_manager.py.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils.server import container_control as cc
from ansible_collections.gpufleet.sglang.plugins.module_utils.server import launcher as engine
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import identity

KEY = "sk-box-81c2aa"
TOKEN = "hf_box_c0ffee42"
IMAGE = "0123456789abcdef" * 4


class Ctx(object):
    def __init__(self):
        self.no_log_values = set()
        self.warnings = []
        self.commands = []

    def warn(self, msg):
        self.warnings.append(msg)

    def run_command(self, argv, environ_update=None):
        self.commands.append(list(argv))
        return 1, "", "no such container"

    def get_bin_path(self, name, required=False, opt_dirs=None):
        return "/usr/bin/%s" % name if name in ("podman", "docker") else None


def launcher(tmp_path, manager="podman", **extra):
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    params = {"name": "boxed", "version": "0.5.23", "manager": manager, "image": IMAGE, "image_ref": "lmsysorg/sglang:v0.5.23",
              "args": {"model_path": str(model), "port": 31000, "tp_size": 2}, "api_key": KEY,
              "env": {"CUDA_VISIBLE_DEVICES": "2,5", "HF_TOKEN": TOKEN, "SGLANG_TORCH_PROFILER_DIR": "/tmp/prof"},
              "config_dir": str(tmp_path / "etc"), "state_dir": str(tmp_path / "state")}
    params.update(extra)
    eng = engine.Launcher(Ctx(), params)
    assert eng.plan() == []
    return eng


def test_the_run_argv_gives_the_target_gpus_the_guide_s_options_and_read_only_model_mounts(tmp_path):
    eng = launcher(tmp_path)
    argv = eng.container_argv()
    assert argv[:6] == ["run", "-d", "--pull", "never", "--name", "sglang-boxed"]
    pairs = list(zip(argv, argv[1:]))
    assert ("--device", "nvidia.com/gpu=2") in pairs and ("--device", "nvidia.com/gpu=5") in pairs
    assert sum(1 for w in argv if w == "--device") == 2
    assert ("--ipc", "host") in pairs and ("--network", "host") in pairs and ("--restart", "no") in pairs
    assert ("--ulimit", "memlock=-1:-1") in pairs and ("--ulimit", "stack=67108864") in pairs
    assert ("-v", "%s:%s:ro" % (tmp_path / "model", tmp_path / "model")) in pairs
    assert ("-v", "%s:%s:ro" % (eng.config_path, eng.config_path)) in pairs          # the API key's --config file
    assert ("-v", "%s:%s:ro" % (eng.secret_json, cc.SECRETS_IN)) in pairs             # the secret env, as a file
    assert ("-e", "SGLANG_TORCH_PROFILER_DIR=/tmp/prof") in pairs
    assert not any(w.startswith("CUDA_VISIBLE_DEVICES") for w in argv)                # the devices are the GPUs
    labels = dict(w.split("=", 1) for a, w in pairs if a == "--label")
    assert labels == {"io.gpufleet.sglang.collection": "gpufleet.sglang", "io.gpufleet.sglang.server": "boxed",
                      "io.gpufleet.sglang.fingerprint": eng.fp, "io.gpufleet.sglang.image": "lmsysorg/sglang:v0.5.23"}
    assert argv[-1] == IMAGE                                                           # the image ID, not the tag
    inner = eng.container_inner_argv()
    assert inner[:2] == ["python3", "-c"] and inner[3:6] == [cc.SECRETS_IN, "-m", "sglang.launch_server"]
    assert "--config" in inner and "--tp-size" in inner
    words = argv + inner
    for secret in (KEY, TOKEN):
        assert not any(secret in w for w in words), secret
    record = eng.launch_record()
    assert record["image"] == {"ref": "lmsysorg/sglang:v0.5.23", "id": IMAGE, "digest": None}
    assert record["container"]["name"] == "sglang-boxed" and record["manager"] == "podman"
    assert KEY not in json.dumps(record) and TOKEN not in json.dumps(record)


def test_docker_before_25_gets_the_gpus_flag_with_its_csv_quotes_and_cdi_when_asked():
    assert cc.gpu_args("docker", "gpus", ["0", "3"]) == ["--gpus", '"device=0,3"']
    assert cc.gpu_args("docker", "auto", ["1"], server_version="20.10.24") == ["--gpus", '"device=1"']
    assert cc.gpu_args("docker", "auto", ["1"], server_version="28.2.2") == ["--device", "nvidia.com/gpu=1"]
    assert cc.gpu_args("podman", "auto", ["4"]) == ["--device", "nvidia.com/gpu=4"]
    assert cc.gpu_args("podman", "none", ["4"]) == []


@pytest.mark.parametrize("given, field", [
    ({"gpu_request": "all"}, "gpu_request"), ({"pull": "sometimes"}, "pull"), ({"restart_policy": "maybe"}, "restart_policy"),
    ({"volumes": ["relative:/x"]}, "volumes"), ({"volumes": "/a:/b"}, "volumes"), ({"run_args": ["-e", "X=1"]}, "run_args"),
    ({"run_args": ["--label=a=b"]}, "run_args"), ({"colour": "blue"}, "colour"), ({"network": "bridge"}, "network"),
])
def test_bad_container_options_are_blockers_that_name_the_key(tmp_path, given, field):
    eng = engine.Launcher(Ctx(), {"name": "boxed", "manager": "podman", "image": IMAGE, "container": given,
                                  "args": {"model_path": "/m"}, "state_dir": str(tmp_path)})
    blockers = eng.plan()
    assert any(b.startswith("container: ") and field in b for b in blockers), blockers


def test_no_image_is_a_blocker_with_the_fix(tmp_path):
    eng = engine.Launcher(Ctx(), {"name": "boxed", "manager": "docker", "args": {"model_path": "/m"}, "state_dir": str(tmp_path)})
    assert any(b.startswith("image: ") and "lmsysorg/sglang" in b for b in eng.plan())


def test_the_image_and_the_run_options_are_part_of_the_identity(tmp_path):
    a = launcher(tmp_path)
    b = launcher(tmp_path, image="f" * 64)
    c = launcher(tmp_path, container={"shm_size": "32g", "ipc": "private"})
    d = launcher(tmp_path, container={"pull": "always"})              # how the preflight finds it: not what runs
    assert len({a.fp, b.fp, c.fp}) == 3 and d.fp == a.fp
    assert identity.identity("0.5.23", "process", "python3", {"tp_size": 1}) == identity.identity(
        "0.5.23", "process", "python3", {"tp_size": 1}, container=None)


def test_the_bootstrap_loads_the_secret_env_and_runs_the_module_as_python_m_would(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "showenv.py").write_text("import os, sys, json\nprint(json.dumps({'argv': sys.argv[1:], 'tok': os.environ.get('HF_TOKEN'), "
                                    "'main': __name__}))\n")
    secrets = tmp_path / "s.json"
    secrets.write_text(json.dumps({"HF_TOKEN": TOKEN}))
    os.chmod(str(secrets), 0o600)
    out = subprocess.run([sys.executable, "-c", cc.BOOTSTRAP, str(secrets), "-m", "showenv", "--port", "1"],
                         capture_output=True, text=True, check=True, cwd=str(pkg), env=dict(os.environ, PYTHONPATH=str(pkg)))
    assert json.loads(out.stdout) == {"argv": ["--port", "1"], "tok": TOKEN, "main": "__main__"}


def test_a_record_of_a_container_launch_starts_the_recorded_image_id_again(tmp_path):
    from ansible_collections.gpufleet.sglang.plugins.module_utils.server import stored_launch
    eng = launcher(tmp_path, image_digest="docker.io/lmsysorg/sglang@sha256:" + "a" * 64)
    record = eng.launch_record()
    params = stored_launch.launch_params_from_record(record, {"args": {"api_key": KEY}, "env": {"HF_TOKEN": TOKEN}},
                                                     {"name": "boxed", "manager": "process"})
    assert params["manager"] == "podman" and params["image"] == IMAGE and params["image_ref"] == "lmsysorg/sglang:v0.5.23"
    assert params["image_digest"].endswith("a" * 64) and params["container"]["name"] == "sglang-boxed"
    again = engine.Launcher(Ctx(), dict(params, config_dir=str(tmp_path / "etc"), state_dir=str(tmp_path / "state")))
    assert again.plan() == [] and again.fp == eng.fp
    assert again.image_words() == "docker.io/lmsysorg/sglang@sha256:" + "a" * 64
