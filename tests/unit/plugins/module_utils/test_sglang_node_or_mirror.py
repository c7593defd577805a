"""The preflight's resolution adapter (plugins/module_utils/sglang/node_or_mirror.py).

The node's SGLang is the simulator's fake (simulator/python/sglang, its own implementation of the
resolution), reached the way the preflight reaches a real one: the server's interpreter (a bare name is
looked up on the server's PATH) in the server's environment (PYTHONPATH from sglang_server_env).
"""
from __future__ import annotations

import json
import os
import pathlib
import sys

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import node_or_mirror as resolution

REPO = pathlib.Path(__file__).resolve().parents[4]
SIM_PY = REPO / "simulator" / "python"
H200 = {"name": "NVIDIA H200", "compute_capability": "9.0", "memory_mib": 143771, "count": 8}
INCIDENT = {"speculative_algorithm": "EAGLE3", "speculative_eagle_topk": 1, "speculative_num_steps": 1,
            "speculative_num_draft_tokens": 16}


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "llama"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    return dict(INCIDENT, model_path=str(path), speculative_draft_model_path=str(draft), tp_size=8)


@pytest.fixture
def server_env(tmp_path, monkeypatch):
    """The server's environment as sglang_server_env gives it; this process itself cannot import the fake."""
    monkeypatch.delenv("PYTHONPATH", raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return {"PYTHONPATH": str(SIM_PY), "SGLANG_SIM_VERSION": "0.5.23"}


def _resolve(model, env, **kw):
    kw.setdefault("python", sys.executable)
    return resolution.resolve_for_node(model, "0.5.23", arch="LlamaForCausalLM", draft_arch="LlamaForCausalLMEagle3",
                                       env=env, gpu=H200, **kw)


def test_the_node_answers_in_the_servers_environment(model, server_env):
    res = _resolve(model, server_env)
    assert res["source"] == "node" and res["fallback"] is None, res["fallback"]
    assert res["node_version"] == "0.5.23" and res["errors"] == []
    # Rendered: the policy's choice; effective: what the node's ServerArgs made of it.
    assert res["args"]["speculative_num_steps"] == 15 and res["args"]["speculative_num_draft_tokens"] == 16
    assert res["effective"]["speculative_num_draft_tokens"] == 16
    assert any(a["arg"] == "speculative_num_steps" and a["rule"] == "policy.honor_draft_tokens" for a in res["adjustments"])
    assert set(res["timings"]) == {"import_s", "resolve_s", "elapsed_s"}


def test_mirror_policy_of_the_incident_is_what_the_node_runs(model, server_env):
    res = _resolve(model, server_env, policy="mirror")
    assert res["source"] == "node"
    assert res["effective"]["speculative_num_draft_tokens"] == 2          # the incident, from SGLang itself
    assert res["disagreements"] == [], res["disagreements"]


def test_a_bare_interpreter_name_is_found_on_the_servers_path(model, server_env, tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    os.symlink(sys.executable, str(bindir / "sglang-python"))
    env = dict(server_env, PATH=str(bindir))
    res = _resolve(model, env, python="sglang-python")
    assert res["source"] == "node", res["fallback"]


def test_auto_falls_back_to_the_mirror_and_says_why(model, tmp_path, monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    res = _resolve(model, {})                      # no PYTHONPATH: this interpreter has no SGLang
    assert res["source"] == "mirror" and "No module named 'sglang'" in res["fallback"], res["fallback"]
    assert res["errors"] == [] and res["args"]["speculative_num_steps"] == 15
    assert any("resolved by the collection's mirror" in n for n in res["notes"])


def test_node_resolution_without_an_answer_is_an_error(model, monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    res = _resolve(model, {}, source="node")
    assert res["source"] == "none"
    assert res["errors"] and "does not fall back to the mirror" in res["errors"][-1], res["errors"]


def test_mirror_never_asks_the_node(model, tmp_path):
    res = _resolve(model, {}, source="mirror", python=str(tmp_path / "no-such-python"))
    assert res["source"] == "mirror" and res["fallback"] is None and res["errors"] == []


def test_another_release_on_the_node_is_named_before_anything_is_touched(model, server_env):
    res = _resolve(model, dict(server_env, SGLANG_SIM_VERSION="0.5.10"))
    assert res["node_version"] == "0.5.10"
    assert res["errors"][0].startswith("version: 0.5.23, but %s has SGLang 0.5.10 installed; "
                                       "set version: \"0.5.10\"" % sys.executable), res["errors"]


def test_a_post_release_of_the_same_version_is_the_same_release():
    assert resolution.version_mismatch("0.4.6", "0.4.6.post5", "/py") is None
    assert resolution.version_mismatch("0.5.23", "0.5.23", "/py") is None
    assert "0.5.24" in resolution.version_mismatch("0.5.23", "0.5.24", "/py")
    assert resolution.version_mismatch("0.5.23", None, "/py") is None


def test_an_unknown_source_is_refused(model):
    with pytest.raises(ValueError, match="resolution must be one of auto, node, mirror"):
        _resolve(model, {}, source="sometimes")


def test_release_tuple_is_lenient_for_thresholds():
    from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import versions
    assert versions.release_tuple("0.5.23") == (0, 5, 23)
    assert versions.release_tuple("0.4.6.post5") == (0, 4, 6)
    assert versions.release_tuple("0.5.23rc1") == (0, 5, 23)
    assert versions.release_tuple("0.5") == (0, 5, 0)
    assert versions.release_tuple("") == (0, 0, 0)
    assert versions.release_tuple(None, default="0.5.23") == (0, 5, 23)
    assert versions.release_tuple("garbage") == (0, 0, 0)
