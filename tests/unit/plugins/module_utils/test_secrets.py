"""The collection's one set of secret rules (plugins/module_utils/common/secrets.py).

Each secret form is fed through every public entry point (argv, text, env,
redact), through the helpers other files delegate to (node/supervise.py,
the sglang_mask filter), and checked to come out masked
while look-alike names and values stay as they are.
"""
from __future__ import annotations

import json

import pytest

from ansible_collections.gpufleet.sglang.plugins.filter.sglang_mask import mask as filter_mask
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import secrets as s
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import supervise as sp

M = s.MASK
KEY = "sk-live-4f9a0c"
TOKEN = "hf_AbCdEf012345"
ADMIN = "adm-77x"


@pytest.mark.parametrize("name,secret", [
    ("api_key", True), ("admin_api_key", True), ("hf_token", True), ("HF_TOKEN", True), ("OPENAI_API_KEY", True),
    ("--api-key", True), ("--hf-token", True), ("--admin-api-key", True), ("ssl_keyfile_password", True),
    ("db_password", True), ("client_secret_file", True), ("aws_credentials", True), ("access_token", True),
    ("authorization", True), ("token", True), ("key", True),
    ("speculative_num_draft_tokens", False), ("speculative_token_map", False), ("tokenizer_path", False),
    ("max_total_tokens", False), ("ssl_keyfile", False), ("TOKENIZERS_PARALLELISM", False), ("PWD", False),
    ("eos_token", False), ("CUDA_VISIBLE_DEVICES", False), ("model_path", False), ("", False), (None, False),
])
def test_is_secret_name(name, secret):
    assert s.is_secret_name(name) is secret


ARGV_CASES = [
    (["--api-key", KEY], ["--api-key", M]),
    (["--api-key=" + KEY], ["--api-key=" + M]),
    (["--hf-token", TOKEN], ["--hf-token", M]),
    (["--hf-token=" + TOKEN], ["--hf-token=" + M]),
    (["--admin-api-key", ADMIN], ["--admin-api-key", M]),
    (["--admin-api-key=" + ADMIN], ["--admin-api-key=" + M]),
    (["--ssl-keyfile-password", "pw1"], ["--ssl-keyfile-password", M]),        # any secret-named flag
    (["--my-service-secret=abc"], ["--my-service-secret=" + M]),
    (["env", "HF_TOKEN=" + TOKEN, "python3"], ["env", "HF_TOKEN=" + M, "python3"]),
    (["--model-path", "https://user:%s@hub.example/m" % KEY], ["--model-path", "https://user:%s@hub.example/m" % M]),
    (["--url", "https://%s@hub.example/m" % TOKEN], ["--url", "https://%s@hub.example/m" % M]),
    (["--url", "https://h/x?token=%s&rev=main" % TOKEN], ["--url", "https://h/x?token=%s&rev=main" % M]),
    (["--url", "https://h/x?rev=main&access_token=%s" % TOKEN], ["--url", "https://h/x?rev=main&access_token=%s" % M]),
    (["--api-key"], ["--api-key"]),                                          # nothing after it
    (["--api-key", "--port", "1"], ["--api-key", "--port", "1"]),            # a flag is never a value
    (["--speculative-num-draft-tokens", "16", "--tokenizer-path", "/t", "--speculative-token-map", "/m.pt"],
     ["--speculative-num-draft-tokens", "16", "--tokenizer-path", "/t", "--speculative-token-map", "/m.pt"]),
]


@pytest.mark.parametrize("argv,expected", ARGV_CASES)
def test_mask_argv_every_form(argv, expected):
    assert s.mask_argv(argv) == expected
    assert sp.mask_argv(argv) == expected                   # the launch module's entry point
    assert filter_mask(argv) == expected                    # the sglang_mask filter
    assert s.redact({"argv": argv}) == {"argv": expected}   # reports and module results


@pytest.mark.parametrize("text,expected", [
    ("python3 -m sglang.launch_server --api-key %s --port 1" % KEY, "python3 -m sglang.launch_server --api-key %s --port 1" % M),
    ("x --hf-token %s y" % TOKEN, "x --hf-token %s y" % M),
    ("x --hf-token=%s" % TOKEN, "x --hf-token=%s" % M),
    ("x --admin-api-key %s" % ADMIN, "x --admin-api-key %s" % M),
    ("HF_TOKEN=%s OPENAI_API_KEY=%s PATH=/usr/bin" % (TOKEN, KEY), "HF_TOKEN=%s OPENAI_API_KEY=%s PATH=/usr/bin" % (M, M)),
    ("server_args=ServerArgs(api_key='%s', admin_api_key=None, hf_token=\"%s\", tp_size=2)" % (KEY, TOKEN),
     "server_args=ServerArgs(api_key='%s', admin_api_key=None, hf_token=\"%s\", tp_size=2)" % (M, M)),
    ('{"api_key": "%s", "port": 1}' % KEY, '{"api_key": "%s", "port": 1}' % M),
    ('["--api-key", "%s", "--port", "1"]' % KEY, '["--api-key", "%s", "--port", "1"]' % M),
    ("['--hf-token', '%s']" % TOKEN, "['--hf-token', '%s']" % M),
    ("clone https://bob:%s@git.example/r.git" % KEY, "clone https://bob:%s@git.example/r.git" % M),
    ("GET /v1/x?access_token=%s&a=1" % TOKEN, "GET /v1/x?access_token=%s&a=1" % M),
    ("Authorization: Bearer %s" % KEY, "Authorization: Bearer %s" % M),
    ("speculative_num_draft_tokens=16 tokenizer_path='/t' eos_token='</s>'",
     "speculative_num_draft_tokens=16 tokenizer_path='/t' eos_token='</s>'"),
    ("Token count 1234, basic usage", "Token count 1234, basic usage"),
])
def test_mask_text_every_form(text, expected):
    assert s.mask_text(text) == expected
    assert sp.mask_text(text) == expected
    assert filter_mask(text) == expected


def test_literal_secrets_anywhere():
    assert s.mask_text("path /m/%s/x" % KEY, [KEY]) == "path /m/%s/x" % M
    assert s.mask_argv(["--model-path", "/m/%s" % KEY], [KEY]) == ["--model-path", "/m/%s" % M]
    assert s.redact({"note": "uses %s" % KEY}, secrets=[KEY]) == {"note": "uses %s" % M}
    assert s.mask_text(None) is None


def test_mask_env_dict_and_list():
    env = {"HF_TOKEN": TOKEN, "CUDA_VISIBLE_DEVICES": "0,1", "HTTPS_PROXY": "http://u:%s@proxy:3128" % KEY, "EMPTY_KEY": ""}
    assert s.mask_env(env) == {"HF_TOKEN": M, "CUDA_VISIBLE_DEVICES": "0,1", "HTTPS_PROXY": "http://u:%s@proxy:3128" % M,
                               "EMPTY_KEY": ""}
    assert s.mask_env(["HF_TOKEN=" + TOKEN, "A=1"]) == ["HF_TOKEN=" + M, "A=1"]


def test_redact_keys_values_and_idempotence():
    data = {"api_key": KEY, "admin_api_key": None, "ssl_keyfile_password": "", "password": 0,
            "env": {"HF_TOKEN": TOKEN}, "log": ["--api-key", KEY],
            "nested": [{"hf_token": TOKEN, "speculative_num_draft_tokens": 16}],
            "cmdline": "python3 x.py --api-key %s" % KEY}
    once = s.redact(data)
    assert once["api_key"] == M and once["admin_api_key"] is None and once["ssl_keyfile_password"] == ""
    assert once["password"] == 0
    assert once["nested"][0] == {"hf_token": M, "speculative_num_draft_tokens": 16}
    assert once["log"] == ["--api-key", M]
    text = json.dumps(once)
    assert KEY not in text and TOKEN not in text
    assert s.redact(once) == once
    assert s.mask_text(s.mask_text(data["cmdline"])) == s.mask_text(data["cmdline"])
    assert data["api_key"] == KEY                      # the input is left alone


def test_mask_cmdline_joins_masked_words():
    assert s.mask_cmdline(["python3", "--hf-token", TOKEN]) == "python3 --hf-token %s" % M
