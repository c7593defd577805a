"""Tests for the gpufleet.sglang.sglang_resolve and sglang_argv filters."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.sglang.plugins.filter.sglang import FilterModule
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import resolve as sa

PLUGINS_TESTS = pathlib.Path(__file__).resolve().parents[1]
if str(PLUGINS_TESTS) not in sys.path:
    sys.path.insert(0, str(PLUGINS_TESTS))

from sglang_cases import CASES, INCIDENT, LOG_TOPK1  # noqa: E402 - after tests/unit/plugins is put on sys.path

REPO = pathlib.Path(__file__).resolve().parents[4]
BIN = pathlib.Path(sys.executable).parent
FILTERS = FilterModule().filters()


def ansible_env(tmp_path):
    env = dict(os.environ)
    env.update({
        "ANSIBLE_COLLECTIONS_PATH": str(REPO / ".collections"),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
        "ANSIBLE_HOME": str(tmp_path / "home"),
        "ANSIBLE_LOCALHOST_WARNING": "0",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "0",
        "ANSIBLE_NOCOLOR": "1",
        # minimal ships with ansible-core on every supported release (json is ansible.posix's, absent from a
        # bare ansible-core 2.17/2.18 matrix venv); it prints "host | STATUS => {json}".
        "ANSIBLE_STDOUT_CALLBACK": "minimal",
        "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
    })
    return env


def test_filters_registered():
    assert set(FILTERS) == {"sglang_resolve", "sglang_argv"}
    assert all(callable(f) for f in FILTERS.values())


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_resolve_filter_matches_engine(case):
    kwargs = {"version": case["version"], "policy": case["policy"], "arch": case["arch"]}
    for optional in ("draft_arch", "env", "gpu"):
        if case.get(optional):
            kwargs[optional] = case[optional]
    got = FILTERS["sglang_resolve"](case["args"], **kwargs)
    want = sa.resolve(case["args"], case["version"], arch=case["arch"], policy=case["policy"],
                      draft_arch=case.get("draft_arch"), env=case.get("env"), gpu=case.get("gpu"))
    assert got == want


def test_resolve_filter_defaults_and_positional():
    default = FILTERS["sglang_resolve"](INCIDENT)
    assert default["args"]["speculative_num_steps"] == 15
    assert default["args"]["speculative_num_draft_tokens"] == 16
    mirror = FILTERS["sglang_resolve"](INCIDENT, "0.5.10", "mirror", "LlamaForCausalLM")
    assert mirror["args"]["speculative_num_draft_tokens"] == 2
    assert LOG_TOPK1 in [a["log"] for a in mirror["adjustments"]]


def test_resolve_filter_returns_sglang_errors():
    result = FILTERS["sglang_resolve"](INCIDENT, version="0.5.23", policy="strict")
    assert result["errors"] and "speculative_num_steps: 15" in result["errors"][0]
    result = FILTERS["sglang_resolve"]({"speculative_algorithm": "MEDUSA"})
    assert "Unknown speculative algorithm name" in result["errors"][0]


@pytest.mark.parametrize("value, kwargs, fragment", [
    (["--tp-size", "8"], {}, "got ['--tp-size', '8'] (type list)"),
    ("EAGLE", {}, "got 'EAGLE' (type str)"),
    (None, {}, "got None (type NoneType)"),
    ({}, {"version": 0.5}, "invalid version 0.5 (type float)"),
    ({}, {"version": "latest"}, "invalid version 'latest' (type str)"),
    ({}, {"policy": "lenient"}, "unknown policy 'lenient' (type str)"),
    ({}, {"arch": ["LlamaForCausalLM"]}, "arch must be a string"),
    ({}, {"draft_arch": 1}, "draft_arch must be a string"),
    ({}, {"policy": None}, "unknown policy None (type NoneType)"),
    ({}, {"env": "SGLANG_ENABLE_SPEC_V2=1"}, "env must be a dict"),
])
def test_resolve_filter_malformed(value, kwargs, fragment):
    with pytest.raises(AnsibleFilterError) as err:
        FILTERS["sglang_resolve"](value, **kwargs)
    assert fragment in str(err.value)
    assert str(err.value).startswith("sglang_resolve:")


def test_resolve_filter_wraps_engine_value_errors(monkeypatch):
    from ansible_collections.gpufleet.sglang.plugins.filter import sglang as filter_module

    def broken(*args, **kwargs):
        raise ValueError("SGLang arg names must be strings, got int 1")

    monkeypatch.setattr(filter_module, "resolve", broken)
    with pytest.raises(AnsibleFilterError, match="sglang_resolve: SGLang arg names must be strings"):
        FILTERS["sglang_resolve"]({1: 2})


def test_argv_filter():
    resolved = FILTERS["sglang_resolve"](INCIDENT, "0.5.23", arch="LlamaForCausalLM")
    argv = FILTERS["sglang_argv"](resolved["args"], "0.5.23")
    assert argv[:2] == ["--model-path", INCIDENT["model_path"]]
    assert argv[argv.index("--speculative-num-steps") + 1] == "15"
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "16"
    assert FILTERS["sglang_argv"]({"tp_size": 8, "api_key": "k"}, secrets="omit") == ["--tp-size", "8"]


@pytest.mark.parametrize("value, kwargs, fragment", [
    ({"tp": 8}, {}, "unknown SGLang argument 'tp'; did you mean 'tp_size'"),
    ({"config": "/c.yaml"}, {"version": "0.5.1"}, "needs SGLang 0.5.10 or newer"),
    ({"tp_size": 8}, {"version": 0.5}, "invalid version 0.5 (type float)"),
    ({"tp_size": 8}, {"secrets": "hide"}, "secrets must be 'include' or 'omit'"),
    ("--tp-size 8", {}, "(type str)"),
])
def test_argv_filter_errors(value, kwargs, fragment):
    with pytest.raises(AnsibleFilterError) as err:
        FILTERS["sglang_argv"](value, **kwargs)
    assert fragment in str(err.value)
    assert str(err.value).startswith("sglang_argv:")


def run_adhoc(tmp_path, expression):
    proc = subprocess.run(
        [str(BIN / "ansible"), "localhost", "-m", "ansible.builtin.debug", "-a", "msg={{ %s }}" % expression],
        env=ansible_env(tmp_path), cwd=str(tmp_path), capture_output=True, text=True, timeout=120, check=False,
    )
    return proc


def adhoc_result(proc):
    """The one host's result from the minimal callback's "localhost | SUCCESS => {...}"."""
    head, sep, body = proc.stdout.partition(" => ")
    assert sep and head.startswith("localhost | "), proc.stdout + proc.stderr
    return json.loads(body)


def test_filters_through_ansible_templating(tmp_path):
    """Real Jinja/Ansible path: the filters load by FQCN from the collection checkout."""
    args = json.dumps(INCIDENT)
    expression = (
        "{'resolved': (%s | gpufleet.sglang.sglang_resolve(version='0.5.23', arch='LlamaForCausalLM')),"
        " 'argv': ((%s | gpufleet.sglang.sglang_resolve('0.5.23', 'mirror')).args | gpufleet.sglang.sglang_argv('0.5.23'))}"
        % (args, args)
    )
    proc = run_adhoc(tmp_path, expression)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = adhoc_result(proc)["msg"]
    assert result["resolved"]["args"]["speculative_num_steps"] == 15
    assert result["resolved"]["errors"] == []
    argv = result["argv"]
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "2"


def test_filter_error_through_ansible_templating(tmp_path):
    proc = run_adhoc(tmp_path, "[1, 2] | gpufleet.sglang.sglang_resolve")
    assert proc.returncode != 0
    # 2.17/2.18 print the failed result as JSON on stdout, 2.19 prints the error on stderr: read both.
    text = proc.stdout + proc.stderr
    assert "sglang_resolve: the input must be a dict" in text and "(type list)" in text, text


@pytest.mark.parametrize("name", ["sglang_resolve", "sglang_argv"])
def test_ansible_doc_renders(tmp_path, name):
    env = ansible_env(tmp_path)
    fqcn = "gpufleet.sglang." + name
    text = subprocess.run([str(BIN / "ansible-doc"), "-t", "filter", fqcn], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert text.returncode == 0, text.stderr
    # What matters is the page and no warning from Ansible about our plugin. Third-party libraries may
    # print their own deprecation notes on stderr (cryptography 51 did, for ansible-core's ssh-agent
    # module): those are not ours, and requirements/dev.lock keeps them out of the tested venv anyway.
    ours = [line for line in text.stderr.splitlines()
            if "[WARNING]" in line or "[DEPRECATION WARNING]" in line or "ERROR" in line or "gpufleet" in line]
    assert not ours, text.stderr
    assert fqcn in text.stdout and "EXAMPLES" in text.stdout and "RETURN VALUES" in text.stdout
    as_json = subprocess.run([str(BIN / "ansible-doc"), "-t", "filter", "--json", fqcn], env=env,
                             capture_output=True, text=True, timeout=120, check=False)
    assert as_json.returncode == 0, as_json.stderr
    doc = json.loads(as_json.stdout)[fqcn]
    assert doc["doc"]["name"] == name
    assert "_input" in doc["doc"]["options"] and "version" in doc["doc"]["options"]
    assert doc["doc"]["options"]["version"]["default"] == sa.DEFAULT_VERSION
    assert "_value" in doc["return"]
    if name == "sglang_resolve":
        assert doc["doc"]["options"]["policy"]["default"] == sa.DEFAULT_POLICY
        assert set(doc["doc"]["options"]["policy"]["choices"]) == set(sa.POLICIES)
        assert doc["doc"]["positional"] == "version, policy, arch"


def test_resolve_filter_gpu_changes_the_outcome():
    args = {"model_path": "/m", "speculative_algorithm": "EAGLE", "speculative_draft_model_path": "/d",
            "speculative_eagle_topk": 1, "speculative_num_steps": 3, "speculative_num_draft_tokens": 4}
    h200 = FILTERS["sglang_resolve"](args, version="0.5.23", arch="LlamaForCausalLM",
                                     gpu={"name": "NVIDIA H200", "compute_capability": "9.0", "memory_mib": 143771,
                                          "count": 8})
    b200 = FILTERS["sglang_resolve"](args, version="0.5.23", arch="LlamaForCausalLM",
                                     gpu={"name": "NVIDIA B200", "compute_capability": "10.0", "memory_mib": 183359,
                                          "count": 8})
    assert h200["args"]["attention_backend"] == "fa3" and b200["args"]["attention_backend"] == "trtllm_mha"
    assert h200["notes"] == [] and b200["notes"] == []
    guessed = FILTERS["sglang_resolve"](args, version="0.5.23", arch="LlamaForCausalLM")
    assert guessed["args"]["attention_backend"] == "fa3"
    assert any("depends on the GPU" in n for n in guessed["notes"])
    # 0.5.1 refuses trtllm_mha below SM100
    old = FILTERS["sglang_resolve"](dict(args, attention_backend="trtllm_mha", speculative_draft_model_path="/d"),
                                    version="0.5.1", arch="LlamaForCausalLM", gpu={"compute_capability": "9.0"})
    assert "only supported on Blackwell" in old["errors"][0]


@pytest.mark.parametrize("gpu, fragment", [
    ("H200", "gpu must be a dict"),
    ({"compute_capability": "nine"}, "compute_capability must look like '9.0'"),
])
def test_resolve_filter_bad_gpu(gpu, fragment):
    with pytest.raises(AnsibleFilterError, match=fragment):
        FILTERS["sglang_resolve"]({"model_path": "/m"}, gpu=gpu)
