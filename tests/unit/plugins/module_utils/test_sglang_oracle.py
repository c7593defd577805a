"""The node-side oracle (plugins/module_utils/sglang/oracle.py, oracle_helper.py) and plan_resolution.

The "node's SGLang" here is the simulator's fake SGLang (simulator/python/sglang), whose
resolution is implemented independently of the collection; the helper talks to it through
the same API as to a real release (prepare_server_args, resolve_once, check_server_args).
The real releases are exercised by the differential stage (tests/differential).
"""
from __future__ import annotations

import json
import os
import pathlib
import stat
import subprocess
import sys
import time

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import oracle, resolve as engine

REPO = pathlib.Path(__file__).resolve().parents[4]
SIM_PY = REPO / "simulator" / "python"
SIM_BIN = REPO / "simulator" / "bin"
HELPER = REPO / "plugins" / "module_utils" / "sglang" / "oracle_helper.py"
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
    return {"model_path": str(path), "speculative_draft_model_path": str(draft)}


@pytest.fixture
def fake_node(monkeypatch, tmp_path):
    """The fake SGLang on PYTHONPATH, emulating 0.5.23, with HOME pointing at an empty directory."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("PYTHONPATH", str(SIM_PY))
    monkeypatch.setenv("SGLANG_SIM_VERSION", "0.5.23")
    monkeypatch.setenv("HOME", str(home))
    return home


def _script(tmp_path, name, body):
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_helper_source_comes_from_the_module_loader():
    source = oracle.helper_source()
    assert source == HELPER.read_text()
    compile(source, "oracle_helper", "exec")


def test_helper_module_level_is_stdlib_only():
    import ast

    tree = ast.parse(HELPER.read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = {(a.name if isinstance(n, ast.Import) else n.module).split(".")[0] for n in top for a in n.names}
    assert names <= {"__future__", "json", "logging", "math", "os", "shutil", "sys", "tempfile", "time", "traceback",
                     "warnings"}


@pytest.mark.parametrize("version, steps, draft, backend", [
    ("0.5.23", 1, 2, "fa3"),
    ("0.5.10", 1, 2, "fa3"),
    ("0.4.6", 1, 2, "flashinfer"),
])
def test_resolve_on_node_answers_with_the_nodes_sglang(fake_node, model, monkeypatch, version, steps, draft, backend):
    monkeypatch.setenv("SGLANG_SIM_VERSION", version)
    answer = oracle.resolve_on_node(sys.executable, dict(model, **INCIDENT), version, H200)
    assert answer["source"] == "node" and answer["ok"] is True and answer["error"] is None
    assert answer["sglang_version"].startswith(version)
    args = answer["args"]
    assert (args["speculative_num_steps"], args["speculative_num_draft_tokens"]) == (steps, draft)
    assert args["attention_backend"] == backend
    assert any("speculative_num_draft_tokens is adjusted" in w for w in answer["warnings"])
    assert answer["import_s"] >= 0 and answer["resolve_s"] >= 0 and answer["elapsed_s"] >= answer["resolve_s"]
    assert list(fake_node.iterdir()) == []  # nothing written under HOME


def test_resolve_on_node_reports_sglangs_refusal(fake_node, model):
    args = dict(model, speculative_algorithm="EAGLE", speculative_eagle_topk=4, speculative_num_steps=3,
                speculative_num_draft_tokens=8, attention_backend="trtllm_mha")
    answer = oracle.resolve_on_node(sys.executable, args, "0.5.23", H200)
    assert answer["ok"] is False and answer["error"]["type"] == "ValueError"
    assert "trtllm_mha backend only supports topk = 1" in answer["error"]["message"]


def test_argparse_refusal_is_an_answer(fake_node, model):
    answer = oracle.resolve_on_node(sys.executable, ["--model-path", model["model_path"], "--no-such-flag"],
                                    "0.5.23", H200)
    assert answer["ok"] is False and answer["error"]["type"] == "ArgumentError"
    assert "unrecognized arguments: --no-such-flag" in answer["error"]["message"]


def test_secrets_are_neither_sent_nor_returned(fake_node, model):
    answer = oracle.resolve_on_node(sys.executable, dict(model, api_key="s3cret-key"), "0.5.23", H200)
    assert answer["ok"] is True and answer["args"]["api_key"] is None
    answer = oracle.resolve_on_node(sys.executable, ["--model-path", model["model_path"], "--api-key", "s3cret-key"],
                                    "0.5.23", H200)
    assert answer["args"]["api_key"] == "********" and "s3cret-key" not in json.dumps(answer)


def test_missing_interpreter(tmp_path):
    with pytest.raises(oracle.OracleUnavailable) as err:
        oracle.resolve_on_node(str(tmp_path / "nope" / "python"), {"model_path": "/m"}, "0.5.23", H200)
    assert str(err.value).startswith("the node's SGLang at %s could not resolve the arguments: no executable "
                                     "interpreter there" % (tmp_path / "nope" / "python"))
    with pytest.raises(oracle.OracleUnavailable, match="absolute path"):
        oracle.resolve_on_node("python3", {"model_path": "/m"}, "0.5.23", H200)


def test_sglang_not_importable(monkeypatch, tmp_path, model):
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # no sglang there
    with pytest.raises(oracle.OracleUnavailable) as err:
        oracle.resolve_on_node(sys.executable, model, "0.5.23", H200)
    assert "importing SGLang failed with ModuleNotFoundError" in str(err.value)


def test_garbage_output(tmp_path):
    python = _script(tmp_path, "python", "echo 'Segmentation fault (not JSON)'; exit 0")
    with pytest.raises(oracle.OracleUnavailable, match="without a JSON answer"):
        oracle.resolve_on_node(python, {"model_path": "/m"}, "0.5.23", H200)
    python = _script(tmp_path, "python2", "echo '[1, 2]'")
    with pytest.raises(oracle.OracleUnavailable, match="not a JSON object"):
        oracle.resolve_on_node(python, {"model_path": "/m"}, "0.5.23", H200)
    python = _script(tmp_path, "python3", "echo '{\"x\": 1}'")
    with pytest.raises(oracle.OracleUnavailable, match="has no resolution"):
        oracle.resolve_on_node(python, {"model_path": "/m"}, "0.5.23", H200)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_timeout_kills_the_helper_by_pid(tmp_path):
    pid_file = tmp_path / "pid"
    # the "interpreter" records its PID and that of a child, then hangs
    python = _script(tmp_path, "python", "sleep 300 & echo $$ $! > %s; wait" % pid_file)
    started = time.monotonic()
    with pytest.raises(oracle.OracleUnavailable) as err:
        oracle.resolve_on_node(python, {"model_path": "/m"}, "0.5.23", H200, timeout=1.5)
    assert "no answer within 2 s" in str(err.value) and "was killed" in str(err.value)
    assert time.monotonic() - started < 60
    pids = [int(p) for p in pid_file.read_text().split()]
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids)  # the whole group is gone, the sleeping child included


def test_cuda_initialisation_is_refused_and_reported(tmp_path, model, monkeypatch):
    """A release whose resolution would initialise CUDA gets an error, and the oracle refuses the answer."""
    pkg = tmp_path / "sglang" / "srt"
    pkg.mkdir(parents=True)
    (tmp_path / "sglang" / "__init__.py").write_text("__version__ = '9.9.9'\n")
    (pkg / "__init__.py").write_text("")
    (pkg / "server_args.py").write_text(
        "import torch\n"
        "class ServerArgs:\n"
        "    def __init__(self, argv):\n"
        "        self.argv = argv\n"
        "    def check_server_args(self):\n"
        "        torch.cuda.init()\n"
        "    def resolved_dict(self):\n"
        "        return {'model_path': self.argv[1]}\n"
        "def prepare_server_args(argv):\n"
        "    assert torch.cuda.get_device_capability() == (9, 0) and torch.cuda.device_count() == 8\n"
        "    return ServerArgs(argv)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    request = {"argv": ["--model-path", model["model_path"]], "gpu": H200}
    answer = oracle.run_helper(sys.executable, request)
    assert answer["cuda_guard"] == ["torch.cuda.init"] and answer["ok"] is False
    assert "never initialises CUDA" in answer["error"]["message"]
    with pytest.raises(oracle.OracleUnavailable, match="tried to initialise CUDA"):
        oracle.resolve_on_node(sys.executable, model, "0.5.23", H200)


def test_helper_hides_the_gpus_and_leaves_no_compute_app(fake_node, model, monkeypatch, tmp_path):
    """CUDA_VISIBLE_DEVICES is empty in the helper, and the simulated node shows no compute app after it."""
    root = tmp_path / "node"
    env = dict(os.environ, GPUSIM_ROOT=str(root), PATH="%s:%s" % (SIM_BIN, os.environ["PATH"]))
    subprocess.run([str(SIM_BIN / "gpusim"), "init", "--gpus", "8", "--model", "H200"], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    monkeypatch.setenv("GPUSIM_ROOT", str(root))
    monkeypatch.setenv("PATH", env["PATH"])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    request = {"argv": ["--model-path", model["model_path"]], "gpu": H200}
    pkg = tmp_path / "probe" / "sglang" / "srt"
    pkg.mkdir(parents=True)
    (tmp_path / "probe" / "sglang" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "server_args.py").write_text(
        "import os\n"
        "class S:\n"
        "    def check_server_args(self): pass\n"
        "    def resolved_dict(self): return {'cuda_visible_devices': os.environ['CUDA_VISIBLE_DEVICES'],\n"
        "                                     'home': os.environ['HOME']}\n"
        "def prepare_server_args(argv): return S()\n")
    probe_env = dict(os.environ, PYTHONPATH=str(tmp_path / "probe"))
    answer = oracle.run_helper(sys.executable, request, env=probe_env)
    assert answer["args"]["cuda_visible_devices"] == ""
    assert not os.path.exists(answer["args"]["home"])  # its temporary HOME is removed
    oracle.resolve_on_node(sys.executable, dict(model, **INCIDENT), "0.5.23", H200)
    apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"], env=env,
                          stdout=subprocess.PIPE, text=True, check=True).stdout
    assert apps.strip() == ""


# ---------------------------------------------------------------------------
# plan_resolution
# ---------------------------------------------------------------------------
def _node(args):
    """An oracle answer: the fake node runs what the rendered args say, with SGLang's topk-1 rule."""
    running = dict(args)
    if running.get("speculative_eagle_topk") == 1:
        running["speculative_num_draft_tokens"] = running["speculative_num_steps"] + 1
    running.setdefault("max_running_requests", 48)
    running.setdefault("attention_backend", "fa3")
    return {"source": "node", "ok": True, "sglang_version": "0.5.23", "args": running, "python": "/usr/bin/python3",
            "warnings": ["speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
                         "speculative_eagle_topk == 1"], "error": None}


def test_plan_uses_the_node_answer(model):
    args = dict(model, **INCIDENT)
    plan = engine.plan_resolution(args, "0.5.23", arch="LlamaForCausalLM", policy="mirror", gpu=H200, oracle=_node)
    assert plan["source"] == "node" and plan["fallback_reason"] is None and plan["errors"] == []
    assert plan["args"]["speculative_num_draft_tokens"] == 2
    adj = [a for a in plan["adjustments"] if a["arg"] == "speculative_num_draft_tokens"]
    assert adj == [{"arg": "speculative_num_draft_tokens", "from": 16, "to": 2, "rule": "eagle.topk1_draft_tokens",
                    "doc": "docs/reference/sglang-rules.md#eagletopk1_draft_tokens",
                    "log": "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
                           "speculative_eagle_topk == 1"}]
    assert plan["disagreements"] == [] and plan["log"] == _node(args)["warnings"]


def test_plan_honor_policy_renders_steps_and_the_node_keeps_the_draft_tokens(model):
    plan = engine.plan_resolution(dict(model, **INCIDENT), "0.5.23", arch="LlamaForCausalLM", gpu=H200, oracle=_node)
    assert plan["rendered"]["speculative_num_steps"] == 15
    assert plan["args"]["speculative_num_draft_tokens"] == 16
    rules = [a["rule"] for a in plan["adjustments"]]
    assert rules[0] == "policy.honor_draft_tokens" and "eagle.topk1_draft_tokens" not in rules
    assert set(rules) == {"policy.honor_draft_tokens", "attention.default_backend", "spec.max_running_requests",
                          "spec.draft_revision_main"}


def test_plan_lists_mirror_node_disagreements(model):
    def node(args):
        answer = _node(args)
        answer["args"]["attention_backend"] = "flashinfer"
        return answer

    plan = engine.plan_resolution(dict(model, **INCIDENT), "0.5.23", arch="LlamaForCausalLM", policy="mirror",
                                  gpu=H200, oracle=node)
    assert {"arg": "attention_backend", "mirror": "fa3", "node": "flashinfer"} in plan["disagreements"]
    assert plan["args"]["attention_backend"] == "flashinfer"
    adj = [a for a in plan["adjustments"] if a["arg"] == "attention_backend"][0]
    assert adj["rule"] is None and adj["to"] == "flashinfer"


def test_plan_node_refusal_is_the_error(model):
    def node(args):
        return {"ok": False, "sglang_version": "0.5.23", "args": {}, "warnings": [], "python": "/p",
                "error": {"type": "ValueError", "message": "trtllm_mha backend only supports topk = 1"}}

    plan = engine.plan_resolution(dict(model, **INCIDENT), "0.5.23", arch="LlamaForCausalLM", gpu=H200, oracle=node)
    assert plan["source"] == "node"
    assert plan["errors"] == ["SGLang 0.5.23 on the node refuses the arguments at startup: ValueError: trtllm_mha "
                              "backend only supports topk = 1"]
    assert plan["disagreements"][0]["mirror"] == "starts"


def test_plan_node_refusal_keeps_the_mirrors_explanation(model):
    # 0.5.23 refuses steps unset (topk and draft tokens set) with a bare AssertionError: the mirror, which
    # predicted the same refusal, says why and what to set, after SGLang's own line.
    def node(args):
        return {"ok": False, "sglang_version": "0.5.23", "args": {}, "warnings": [], "python": "/p",
                "error": {"type": "AssertionError", "message": ""}}

    args = dict(model, speculative_algorithm="EAGLE3", speculative_eagle_topk=1, speculative_num_draft_tokens=16)
    plan = engine.plan_resolution(args, "0.5.23", arch="LlamaForCausalLM", policy="mirror", gpu=H200, oracle=node)
    assert plan["source"] == "node" and len(plan["errors"]) == 2, plan["errors"]
    assert plan["errors"][0].startswith("SGLang 0.5.23 on the node refuses the arguments at startup: AssertionError")
    assert plan["errors"][1].startswith("the collection's mirror of SGLang 0.5.23 agrees: speculative_num_steps: not set "
                                        "while speculative_eagle_topk and speculative_num_draft_tokens are set")
    assert not any(d["arg"] is None for d in plan["disagreements"])     # both refuse: no disagreement


@pytest.mark.parametrize("oracle_policy, source, errors", [("auto", "mirror", 0), ("node", "none", 1)])
def test_plan_fallback(model, oracle_policy, source, errors):
    def unavailable(args):
        raise oracle.OracleUnavailable("the node's SGLang at /opt/sglang/bin/python could not resolve the arguments: "
                                       "no answer within 120 s")

    plan = engine.plan_resolution(dict(model, **INCIDENT), "0.5.23", arch="LlamaForCausalLM", gpu=H200,
                                  oracle=unavailable, oracle_policy=oracle_policy)
    assert plan["source"] == source and len(plan["errors"]) == errors
    assert "no answer within 120 s" in plan["fallback_reason"]
    assert plan["args"]["speculative_num_steps"] == 15  # the mirror's answer all the same
    if errors:
        assert "oracle_policy node does not fall back" in plan["errors"][0]


def test_plan_mirror_never_asks(model):
    def boom(args):
        raise AssertionError("must not be called")

    plan = engine.plan_resolution(dict(model, **INCIDENT), "0.5.23", arch="LlamaForCausalLM", gpu=H200, oracle=boom,
                                  oracle_policy="mirror")
    assert plan["source"] == "mirror" and plan["fallback_reason"] == "oracle_policy mirror"
    with pytest.raises(ValueError, match="oracle_policy"):
        engine.plan_resolution(model, "0.5.23", oracle_policy="sometimes")


def test_plan_strict_refuses_what_the_node_changes(model):
    plan = engine.plan_resolution(dict(model, **INCIDENT), "0.5.23", arch="LlamaForCausalLM", policy="strict",
                                  gpu=H200, oracle=_node)
    assert any(e.startswith("speculative_num_draft_tokens: intended 16") for e in plan["errors"])


def test_plan_with_the_fake_node_end_to_end(fake_node, model):
    def node(args):
        return oracle.resolve_on_node(sys.executable, args, "0.5.23", H200)

    plan = engine.plan_resolution(dict(model, **INCIDENT), "0.5.23", arch="LlamaForCausalLM", policy="mirror",
                                  gpu=H200, oracle=node)
    assert plan["source"] == "node" and plan["errors"] == []
    assert plan["args"]["speculative_num_draft_tokens"] == 2 and plan["args"]["max_running_requests"] == 48
    assert plan["disagreements"] == []


# ---------------------------------------------------------------------------
# The helper's pieces, in this process (the subprocess runs above cover main())
# ---------------------------------------------------------------------------
def test_helper_pieces_in_process(monkeypatch):
    import enum
    import subprocess as sp
    import types

    from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import oracle_helper as helper

    class Color(enum.Enum):
        RED = "red"

    assert helper._json_safe({"a": (1, 2.5, float("inf")), "b": {3, 1}, "c": Color.RED, "d": pathlib.Path("/x")}) == {
        "a": [1, 2.5, "inf"], "b": [1, 3], "c": "red", "d": "/x"}
    gpu = helper._gpu_facts({"name": "NVIDIA B200", "compute_capability": "10.0", "memory_mib": 1024, "count": 2})
    assert (gpu["major"], gpu["minor"], gpu["count"]) == (10, 0, 2)
    torch = types.SimpleNamespace(cuda=types.SimpleNamespace(), version=types.SimpleNamespace(cuda=None))
    trips = len(helper.GUARD_TRIPS)
    helper.install_cuda_guard(torch, gpu)
    assert torch.cuda.is_available() and torch.cuda.device_count() == 2
    assert torch.cuda.get_device_capability() == (10, 0) and torch.cuda.get_device_name(0) == "NVIDIA B200"
    assert torch.cuda.get_device_properties(0).total_memory == 1024 * 1024 * 1024
    assert torch.cuda.mem_get_info() == (1024 ** 3, 1024 ** 3) and not torch.cuda.is_initialized()
    assert torch.version.cuda == "12.9"
    with pytest.raises(RuntimeError, match="never initialises CUDA"):
        torch.cuda._lazy_init()
    assert helper.GUARD_TRIPS[trips:] == ["torch.cuda._lazy_init"]
    del helper.GUARD_TRIPS[trips:]
    real_run = sp.run
    try:
        helper.install_smi_answer(gpu)
        done = sp.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                      stdout=sp.PIPE, text=True, check=False)
        assert done.returncode == 0 and done.stdout == "1024\n1024\n"
        assert sp.run([sys.executable, "-c", "print(7)"], stdout=sp.PIPE, text=True, check=True).stdout == "7\n"
    finally:
        sp.run = real_run
    assert helper._argparse_message("usage: x\nx: error: unrecognized arguments: --y\n") == \
        "unrecognized arguments: --y"
    with helper._Env({"GPUFLEET_ORACLE_TEST": "1"}):
        assert os.environ["GPUFLEET_ORACLE_TEST"] == "1"
    assert "GPUFLEET_ORACLE_TEST" not in os.environ
