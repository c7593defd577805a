"""Tests for the gpufleet.sglang.sglang_mask filter (plugins/filter/sglang_mask.py).

The rules themselves live in module_utils/node/supervise.py; these tests check that the filter
applies them to every shape it is documented for: nested dicts (SGLang's /server_info), argv
lists (``--api-key X`` and ``--api-key=X``, numbers among the strings) and free text (the
``server_args=...`` log line), and that look-alike names such as ``speculative_token_map`` stay.
"""
from __future__ import annotations

import copy
import json

import pytest

from ansible_collections.gpufleet.sglang.plugins.filter import sglang_mask
from ansible_collections.gpufleet.sglang.plugins.filter.sglang_mask import FilterModule, mask
from ansible_collections.gpufleet.sglang.plugins.module_utils.node.supervise import MASK

SECRET = "sk-live-0123456789"


def test_filter_is_registered_under_its_documented_name():
    filters = FilterModule().filters()
    assert filters == {"sglang_mask": mask}
    assert "name: sglang_mask" in sglang_mask.DOCUMENTATION


def test_nested_server_info_dict():
    # The shape of SGLang's /server_info (sglang.md 2.1): api_key in clear at the top level.
    info = {
        "model_path": "/models/Qwen2",
        "api_key": SECRET,
        "admin_api_key": None,                  # not set: shown as it is
        "ssl_keyfile_password": "",             # empty: shown as it is
        "speculative_token_map": "/models/token_map.pt",
        "speculative_num_draft_tokens": 16,
        "tokenizer_path": "/models/Qwen2",
        "internal_states": [
            {"avg_spec_accept_length": 2.95, "hf_token": "hf_abc", "memory_usage": {"weight": 14.2}},
        ],
        "launch_command": ["python3", "-m", "sglang.launch_server", "--api-key", SECRET, "--port", "30000"],
        "env": {"HF_TOKEN": "hf_xyz", "CUDA_VISIBLE_DEVICES": "0,1", "nested": {"db_password": "pw"}},
    }
    before = copy.deepcopy(info)
    out = mask(info)
    assert info == before                       # the input is not modified
    assert out["api_key"] == MASK
    assert out["admin_api_key"] is None
    assert out["ssl_keyfile_password"] == ""
    assert out["speculative_token_map"] == "/models/token_map.pt"
    assert out["speculative_num_draft_tokens"] == 16
    assert out["tokenizer_path"] == "/models/Qwen2"
    assert out["internal_states"][0] == {"avg_spec_accept_length": 2.95, "hf_token": MASK, "memory_usage": {"weight": 14.2}}
    assert out["launch_command"] == ["python3", "-m", "sglang.launch_server", "--api-key", MASK, "--port", "30000"]
    assert out["env"] == {"HF_TOKEN": MASK, "CUDA_VISIBLE_DEVICES": "0,1", "nested": {"db_password": MASK}}
    text = json.dumps(out)
    assert SECRET not in text and "hf_abc" not in text and "hf_xyz" not in text and '"pw"' not in text


def test_secret_key_holding_a_structure_is_masked_whole():
    assert mask({"secret": {"a": 1}, "token": ["x", "y"], "password": 0}) == {"secret": MASK, "token": MASK, "password": 0}


@pytest.mark.parametrize("argv,expected", [
    (["--api-key", SECRET, "--port", "30000"], ["--api-key", MASK, "--port", "30000"]),
    (["--api-key=" + SECRET, "--tp-size", "2"], ["--api-key=" + MASK, "--tp-size", "2"]),
    (["--admin-api-key", "adm", "--hf-token=hf_x", "--ssl-keyfile-password", "pw"],
     ["--admin-api-key", MASK, "--hf-token=" + MASK, "--ssl-keyfile-password", MASK]),
    (["--speculative-token-map", "/m.pt", "--tokenizer-path", "/tok", "--speculative-num-draft-tokens", "16"],
     ["--speculative-token-map", "/m.pt", "--tokenizer-path", "/tok", "--speculative-num-draft-tokens", "16"]),
    (["--api-key"], ["--api-key"]),                                # a flag at the very end masks nothing
    (("--api-key", SECRET), ["--api-key", MASK]),                  # a tuple works like a list
])
def test_argv_lists(argv, expected):
    assert mask(argv) == expected


def test_argv_list_with_numbers_keeps_them_and_masks_the_key():
    # YAML gives ints for unquoted numbers: the list is still an argv list.
    argv = ["--port", 30000, "--api-key", SECRET, "--tp-size", 8, "--enable-metrics", True]
    assert mask(argv) == ["--port", 30000, "--api-key", MASK, "--tp-size", 8, "--enable-metrics", True]
    assert mask(["--api-key", 123456]) == ["--api-key", MASK]      # a numeric key is a secret too


def test_lists_of_non_strings_and_nested_lists():
    assert mask([1, 2.5, None, True]) == [1, 2.5, None, True]
    assert mask([]) == []
    assert mask([{"api_key": SECRET}, ["--api-key", SECRET]]) == [{"api_key": MASK}, ["--api-key", MASK]]


@pytest.mark.parametrize("text,expected", [
    ("api_key='x'", "api_key='%s'" % MASK),
    ("server_args=ServerArgs(model_path='/m', api_key='%s', speculative_token_map='/t.pt', admin_api_key=None)" % SECRET,
     "server_args=ServerArgs(model_path='/m', api_key='%s', speculative_token_map='/t.pt', admin_api_key=None)" % MASK),
    ('{"api_key": "%s", "port": 30000}' % SECRET, '{"api_key": "%s", "port": 30000}' % MASK),
    ("python3 -m sglang.launch_server --api-key %s --port 30000" % SECRET,
     "python3 -m sglang.launch_server --api-key %s --port 30000" % MASK),
    ("launch --api-key=%s" % SECRET, "launch --api-key=%s" % MASK),
    ("speculative_token_map='/t.pt' tokenizer_path='/tok'", "speculative_token_map='/t.pt' tokenizer_path='/tok'"),
    ("nothing secret here", "nothing secret here"),
    ("", ""),
])
def test_free_text(text, expected):
    assert mask(text) == expected


@pytest.mark.parametrize("value", [None, 0, 3.5, True])
def test_scalars_pass_through(value):
    assert mask(value) is value


def test_masking_is_idempotent():
    data = {"api_key": SECRET, "argv": ["--api-key", SECRET], "log": "api_key='%s'" % SECRET}
    once = mask(data)
    assert mask(once) == once
