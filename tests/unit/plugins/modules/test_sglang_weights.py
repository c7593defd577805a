"""The sglang_weights module, main() run in-process (``patch_module_args``, exit_json/fail_json patched to
raise) against the fake SGLang server (simulator/python, free loopback port, temporary GPUSIM_ROOT, fast
knobs of playbook_helpers; every process recorded and SIGKILLed by PID)."""
from __future__ import annotations

import json
import os
import sys

import pytest

from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

from ansible_collections.gpufleet.sglang.plugins.modules import sglang_weights

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "simulator"))

from sglang_helpers import QWEN_CONFIG, GpuNode, ProcessRegistry, Server  # noqa: E402 - after sys.path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "integration"))

from playbook_helpers import FAST_SERVER_ENV  # noqa: E402 - after sys.path
from checkpoint_files import write_weights  # noqa: E402 - after sys.path

KEY = "sk-module-weights-91c2"


@pytest.fixture
def run(monkeypatch):
    class ExitJson(Exception):
        pass

    def exit_json(self, **kwargs):
        kwargs.setdefault("changed", False)
        kwargs["failed"] = False
        raise ExitJson(kwargs)

    def fail_json(self, msg, **kwargs):
        kwargs.update(failed=True, msg=msg)
        raise ExitJson(kwargs)

    monkeypatch.setattr(basic.AnsibleModule, "exit_json", exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)

    def _run(args, check=False):
        args = dict(args)
        if check:
            args["_ansible_check_mode"] = True
        with patch_module_args(args):
            with pytest.raises(ExitJson) as info:
                sglang_weights.main()
        return info.value.args[0]

    return _run


def checkpoint(path, seed):
    """config.json and valid safetensors weights, their bytes derived from ``seed`` (the same shapes for every seed)."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(QWEN_CONFIG))
    write_weights(path, seed=seed)
    return str(path)


@pytest.fixture
def server(tmp_path):
    registry = ProcessRegistry()
    node = GpuNode(tmp_path / "gpusim", gpus=2)
    v1 = checkpoint(tmp_path / "ckpt" / "v1", "step 1000")
    srv = Server(registry, node, tmp_path / "server.log", ["--model-path", v1, "--tp-size", "2", "--api-key", KEY],
                 env=dict(FAST_SERVER_ENV), api_key=KEY)
    try:
        srv.wait_healthy()
        yield srv, v1
    finally:
        registry.kill_all()
        try:
            srv.proc.wait(timeout=10)
        except Exception:
            pass
        srv.close()


def test_update_idempotence_check_mode_rollback_and_failure(run, server, tmp_path):
    srv, v1 = server
    v2 = checkpoint(tmp_path / "ckpt" / "v2", "step 2000")
    base = {"url": "http://127.0.0.1:%d/" % srv.port, "api_key": KEY}
    would = run(dict(base, model_path=v2, weight_version="step-2000"), check=True)
    assert would["changed"] is True and would["message"] == "would update %s to %s" % (v1, v2)
    assert srv.request("/model_info").json()["model_path"] == v1                   # check mode touched nothing
    done = run(dict(base, model_path=v2, weight_version="step-2000"))
    assert done["changed"] is True and done["failed"] is False
    assert done["weight_version"] == {"before": "default", "after": "step-2000"}
    assert done["model_info"]["model_path"] == v2 and done["checksums_changed"] is True
    assert len(done["checksums"]["after"]["ranks"]) == 2 and "failure" not in done
    assert KEY not in json.dumps(done)
    again = run(dict(base, model_path=v2, weight_version="step-2000"))
    assert again["changed"] is False and "already serves" in again["message"]
    before = done["checksums"]["before"]["per_engine_checksum"]
    previous = {"model_path": v1, "weight_version": "default", "checksum": before}
    back = run(dict(base, state="rolled_back", previous=previous))
    assert back["changed"] is True and back["checksums"]["after"]["per_engine_checksum"] == before
    assert run(dict(base, state="rolled_back", previous={"model_path": v1, "weight_version": "default"}))["changed"] is False
    failed = run(dict(base, model_path=str(tmp_path / "nowhere")))
    assert failed["failed"] is True and failed["changed"] is False
    assert failed["failure"] == "path" and failed["old_weights_serving"] is True
    assert "the old weights still serve" in failed["msg"] and KEY not in json.dumps(failed)


def test_bad_options_touch_nothing(run):
    out = run({"url": "127.0.0.1:30000", "model_path": "/m"})
    assert out["failed"] is True and out["msg"].startswith("url: 127.0.0.1:30000 is not an http(s) URL")
    out = run({"url": "http://127.0.0.1:1", "model_path": "/m", "timeout": 0})
    assert out["msg"] == "timeout: must be a positive number of seconds, got 0.0"
    out = run({"url": "http://127.0.0.1:1", "state": "rolled_back"})
    assert out["failed"] is True and "previous" in out["msg"]
    out = run({"url": "http://127.0.0.1:1", "model_path": "/m", "timeout": 2})
    assert out["failed"] is True and out["failure"] == "http" and "nothing was changed" in out["msg"]
