"""Unit tests for plugins/module_utils/sglang/render.py: server_argv and systemd_exec_start.

to_argv / to_config_yaml / yaml_quote are covered in test_sglang_resolve.py. The
ExecStart quoting must follow the ``q()`` macro that the role's unit template used
(roles/sglang_server/templates/sglang.service.j2 before render.py took over); the
macro, kept verbatim below, is rendered with Jinja2 and compared word for word.
"""
from __future__ import annotations

import re
import shlex

import jinja2
import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import render

UNIT_MACRO = (
    "{%- macro q(token) -%}\n"
    "{%- set t = token | string -%}\n"
    "{%- if t is match('^[A-Za-z0-9_@+=:,./-]+$') -%}{{ t }}\n"
    "{%- else -%}\"{{ t | replace('\\\\', '\\\\\\\\') | replace('\"', '\\\\\"') | replace('%', '%%') }}\"\n"
    "{%- endif -%}\n"
    "{%- endmacro -%}"
)

ARGS = {
    "model_path": "/models/llama",
    "tp_size": 8,
    "api_key": "s3cret",
    "admin_api_key": "adm1n",
    "speculative_algorithm": "EAGLE",
}

HOSTILE = [
    "plain",
    "with space",
    'quo"te',
    "back\\slash",
    "50%",
    "%h%n",
    "$HOME",
    "${X}",
    "`id`",
    "semi;colon",
    "a'b",
    "tab\there",
    "ünïcödé",
    "",
    "--flag=-1",
    "\\\"%",
]


def test_server_argv_omits_secrets_and_adds_config():
    argv = render.server_argv(ARGS, "0.5.23", config_path="/etc/sglang/main.yaml")
    # model_path first, then by field name (speculative_algorithm < tp_size)
    assert argv == ["--model-path", "/models/llama", "--speculative-algorithm", "EAGLE", "--tp-size", "8",
                    "--config", "/etc/sglang/main.yaml"]
    assert "s3cret" not in argv and "adm1n" not in argv
    config = render.to_config_yaml({k: ARGS[k] for k in render.secret_fields(ARGS)}, "0.5.23")
    assert config == 'admin-api-key: "adm1n"\napi-key: "s3cret"\n'


def test_server_argv_without_secrets():
    args = {k: v for k, v in ARGS.items() if k not in ("api_key", "admin_api_key")}
    assert render.server_argv(args, "0.4.6") == render.to_argv(args, "0.4.6")
    assert render.server_argv(args, "0.5.10", config_path="c.yaml")[-2:] == ["--config", "c.yaml"]


@pytest.mark.parametrize("version", ["0.4.6", "0.4.10", "0.5.1", "0.5.5", "0.5.10rc1"])
def test_server_argv_secrets_need_config_support(version):
    args = {"model_path": "/m", "api_key": "k"}
    with pytest.raises(ValueError) as err:
        render.server_argv(args, version, config_path="/etc/x.yaml")
    message = str(err.value)
    assert "api_key" in message and "--config" in message and "0.5.10" in message and "upgrade SGLang" in message
    assert "k'" not in message


def test_server_argv_secrets_need_a_config_path():
    with pytest.raises(ValueError, match="give config_path"):
        render.server_argv({"model_path": "/m", "api_key": "k"}, "0.5.23")


@pytest.mark.parametrize("path", ["-c.yaml", ""])
def test_server_argv_bad_config_path(path):
    with pytest.raises(ValueError, match="config_path"):
        render.server_argv({"model_path": "/m", "api_key": "k"}, "0.5.23", config_path=path)


def test_server_argv_empty_secret_is_no_secret():
    assert render.server_argv({"model_path": "/m", "api_key": ""}, "0.4.6") == ["--model-path", "/m"]


def _macro_words(tokens):
    """The template's own q() macro, rendered for each token."""
    macro = UNIT_MACRO
    env = jinja2.Environment()
    env.tests["match"] = lambda value, pattern: re.match(pattern, value) is not None
    template = env.from_string(macro + "{% for t in tokens %}{{ q(t) }}\n{% endfor %}")
    return template.render(tokens=tokens).split("\n")[:-1]


def test_systemd_quote_is_the_template_macro():
    # The old unit template's q() macro, except for "$", which it left for systemd to substitute (a bug):
    # an ExecStart word doubles it, an Environment= assignment (no substitution there) keeps it.
    plain = [t for t in HOSTILE if "$" not in t]
    assert [render.systemd_quote(t) for t in plain] == _macro_words(plain)
    assert [render.systemd_quote(t, exec_word=False) for t in HOSTILE] == _macro_words(HOSTILE)
    assert all("$$" in render.systemd_quote(t) for t in HOSTILE if "$" in t)


@pytest.mark.parametrize("token, quoted", [
    ("plain", "plain"),
    ("/a/b-c_d@e+f=g:h,i.j", "/a/b-c_d@e+f=g:h,i.j"),
    ("with space", '"with space"'),
    ('quo"te', '"quo\\"te"'),
    ("back\\slash", '"back\\\\slash"'),
    ("50%", '"50%%"'),
    ("", '""'),
    ("$HOME", '"$$HOME"'),
    ("${MODEL}.jinja", '"$${MODEL}.jinja"'),
])
def test_systemd_quote_examples(token, quoted):
    assert render.systemd_quote(token) == quoted


@pytest.mark.parametrize("token", ["two\nlines", "cr\r", "nul\0"])
def test_systemd_quote_refuses_line_breaks(token):
    with pytest.raises(ValueError, match="newline"):
        render.systemd_quote(token)


def _systemd_split(line):
    """Undo systemd's quoting for the words this renderer produces (quotes, \\\\, \\", %%, $$)."""
    words = []
    for word in shlex.split(line.replace("%%", "\0").replace("$$", "\1"), posix=True):
        words.append(word.replace("\0", "%").replace("\1", "$"))
    return words


def test_systemd_exec_start_round_trips_hostile_tokens():
    argv = ["--model-path", "/m"] + HOSTILE
    line = render.systemd_exec_start("/opt/sglang/bin/python", argv)
    assert line.startswith("/opt/sglang/bin/python -m sglang.launch_server --model-path /m plain ")
    assert "\n" not in line
    assert _systemd_split(line) == ["/opt/sglang/bin/python", "-m", "sglang.launch_server"] + argv


def test_systemd_exec_start_with_server_argv():
    argv = render.server_argv(ARGS, "0.5.23", config_path="/etc/sglang/main.yaml")
    line = render.systemd_exec_start("/usr/bin/python3", argv)
    assert line == ("/usr/bin/python3 -m sglang.launch_server --model-path /models/llama "
                    "--speculative-algorithm EAGLE --tp-size 8 --config /etc/sglang/main.yaml")
    assert "s3cret" not in line


@pytest.mark.parametrize("python", ["python3", "", "bin/python"])
def test_systemd_exec_start_needs_an_absolute_python(python):
    with pytest.raises(ValueError, match="absolute path"):
        render.systemd_exec_start(python, [])


def test_one_config_renders_to_one_argv_whatever_the_dict_order():
    """A record written with sorted keys (the known-good copy) renders the argv that was verified."""
    args = {"tp_size": 8, "speculative_num_steps": 15, "model_path": "/models/llama", "port": 31000,
            "speculative_algorithm": "EAGLE3"}
    shuffled = dict(sorted(args.items(), reverse=True))
    assert list(args) != list(shuffled)
    assert render.to_argv(args, "0.5.23") == render.to_argv(shuffled, "0.5.23")
    assert render.to_argv(args, "0.5.23")[:2] == ["--model-path", "/models/llama"]
