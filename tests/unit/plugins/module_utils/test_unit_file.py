"""The systemd unit of one server (module_utils/server/unit.py), read back the way systemd reads it.

The readers below follow systemd's own parsers (src/core/load-fragment.c, src/basic/env-file.c):

* ``Environment=``: words split with quotes and C escapes (EXTRACT_UNQUOTE|EXTRACT_CUNESCAPE),
  then ``%`` specifiers expanded (``%%`` is ``%``); ``$`` has no meaning there.
* ``ExecStart=``: the same word splitting and specifiers, and at exec time ``${NAME}`` anywhere and
  ``$NAME`` as a word of its own are replaced from the environment (``$$`` is ``$``).
* ``EnvironmentFile=`` and ``WorkingDirectory=``: one path, specifiers expanded, NOT unquoted.
* an EnvironmentFile: ``KEY="value"``; inside double quotes a backslash escapes one of `` "\\`$ ``
  and is kept before any other character.
"""
from __future__ import annotations

import re

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import identity
from ansible_collections.gpufleet.sglang.plugins.module_utils.server import unit

PY = "/opt/sglang/venv/bin/python"
FLAGS = ["--model-path", "/models/llama", "--tp-size", "2", "--port", "30000"]
FP = identity.fingerprint(identity.identity("0.5.23", "systemd", PY, {"model_path": "/models/llama", "tp_size": 2}))


def render(**kw):
    args = dict(name="llama", version="0.5.23", python=PY, flags=FLAGS, env={"NCCL_DEBUG": "WARN"}, fingerprint=FP)
    args.update(kw)
    return unit.render_unit(**args)


# ---------------------------------------------------------------------------
# Readers after systemd
# ---------------------------------------------------------------------------

_CESC = {"\\": "\\", '"': '"', "'": "'", "n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f",
         "v": "\v", "s": " "}


def _specifiers(word):
    out = []
    i = 0
    while i < len(word):
        if word[i] == "%":
            if word[i + 1:i + 2] != "%":
                raise AssertionError("systemd would expand the specifier %r in %r" % (word[i:i + 2], word))
            out.append("%")
            i += 2
        else:
            out.append(word[i])
            i += 1
    return "".join(out)


def systemd_words(value):
    words = []
    i, n = 0, len(value)
    while True:
        while i < n and value[i] in " \t":
            i += 1
        if i >= n:
            return [_specifiers(w) for w in words]
        word = []
        while i < n and value[i] not in " \t":
            c = value[i]
            if c in "\"'":
                i += 1
                while i < n and value[i] != c:
                    if value[i] == "\\":
                        assert value[i + 1] in _CESC, "unexpected escape in %r" % value
                        word.append(_CESC[value[i + 1]])
                        i += 2
                    else:
                        word.append(value[i])
                        i += 1
                assert i < n, "unterminated quote in %r" % value
                i += 1
            elif c == "\\":
                word.append(_CESC[value[i + 1]])
                i += 2
            else:
                word.append(c)
                i += 1
        words.append("".join(word))


def exec_words(value, env=None):
    """ExecStart words as the process gets them (after $ substitution from ``env``)."""
    env = env or {}
    out = []
    for word in systemd_words(value):
        if re.match(r"^\$[A-Za-z_][A-Za-z0-9_]*$", word):
            out.extend(env.get(word[1:], "").split())
            continue
        # Left to right, as systemd does: "$$" is a literal "$", "${NAME}" is substituted.
        word = re.sub(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}",
                      lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), ""), word)
        out.append(word)
    return out


def path_value(value):
    return _specifiers(value)


def env_file_values(text):
    out = {}
    for line in text.splitlines():
        match = re.match(r'^([A-Za-z_][A-Za-z0-9_]*)="(.*)"$', line)
        assert match, "not a KEY=\"value\" line: %r" % line
        body, value, i = match.group(2), [], 0
        while i < len(body):
            c = body[i]
            if c == "\\" and i + 1 < len(body):
                nxt = body[i + 1]
                value.append(nxt if nxt in '"\\`$' else "\\" + nxt)
                i += 2
            elif c == '"':
                raise AssertionError("an unescaped quote ends the value early: %r" % line)
            else:
                value.append(c)
                i += 1
        out[match.group(1)] = "".join(value)
    return out


def lines_of(text, key):
    return [line[len(key) + 1:] for line in text.splitlines() if line.startswith(key + "=")]


# ---------------------------------------------------------------------------
# The unit
# ---------------------------------------------------------------------------

def test_identity_round_trips():
    text = render()
    assert unit.identity_of(text) == FP
    other = identity.fingerprint(identity.identity("0.5.23", "systemd", PY, {"model_path": "/models/llama", "tp_size": 4}))
    assert other != FP and unit.identity_of(render(fingerprint=other)) == other


def test_identity_of_other_texts():
    assert unit.identity_of(None) is None
    assert unit.identity_of("") is None
    assert unit.identity_of("[Service]\nExecStart=/bin/true\n") is None
    assert unit.identity_of("x\n# gpufleet-identity: sha256:abc  \ny") == "sha256:abc"
    assert unit.identity_of("#gpufleet-identity: sha256:abc") is None


def test_layout_and_sections():
    text = render(stop_timeout=95.7)
    lines = text.splitlines()
    assert lines.index("[Unit]") < lines.index("[Service]") < lines.index("[Install]")
    assert lines_of(text, "TimeoutStopSec") == ["95"]
    assert lines_of(text, "KillMode") == ["mixed"] and lines_of(text, "Restart") == ["no"]
    assert lines_of(text, "WantedBy") == ["multi-user.target"]
    assert "llama" in lines_of(text, "Description")[0]
    assert text.endswith("\n")
    assert len(lines_of(text, "ExecStart")) == 1


def test_exec_start_is_the_server_argv():
    text = render()
    assert exec_words(lines_of(text, "ExecStart")[0]) == [PY, "-m", "sglang.launch_server"] + FLAGS


def test_exec_start_hostile_words_survive_quoting():
    flags = ["--model-path", "/models/my model", "--chat-template", 'say "hi" \\ 100% done',
             "--served-model-name", "caf\u00e9 \u2603", "--tool-call-parser", "price$5"]
    text = render(flags=flags)
    assert exec_words(lines_of(text, "ExecStart")[0]) == [PY, "-m", "sglang.launch_server"] + flags


@pytest.mark.parametrize("value", ["WARN", "a b  c", 'say "hi"', "it's", "100%", "%h and %%", "back\\slash\\",
                                   "$HOME ${PATH}", "tab\there", "caf\u00e9", "", "=lead", "a=b=c"])
def test_environment_values_are_quoted(value):
    text = render(env={"MY_VAR": value, "AAA": "first"})
    envs = lines_of(text, "Environment")
    parsed = [systemd_words(v) for v in envs]
    assert parsed == [["AAA=first"], ["MY_VAR=" + value]]          # sorted by name, one word each


def test_environment_none_value_is_empty():
    text = render(env={"EMPTY": None})
    assert [systemd_words(v) for v in lines_of(text, "Environment")] == [["EMPTY="]]


def test_no_environment_lines_without_env():
    assert lines_of(render(env={}), "Environment") == []


def test_environment_files_in_order_and_empty_skipped():
    text = render(environment_files=["/etc/sglang/common.env", "", "-/etc/sglang/optional.env"])
    assert [path_value(v) for v in lines_of(text, "EnvironmentFile")] == ["/etc/sglang/common.env",
                                                                          "-/etc/sglang/optional.env"]
    assert lines_of(render(), "EnvironmentFile") == []


def test_environment_file_lines_come_before_environment_lines():
    lines = render(environment_files=["/etc/s.env"]).splitlines()
    first_env = min(i for i, line in enumerate(lines) if line.startswith("Environment="))
    assert lines.index("EnvironmentFile=/etc/s.env") < first_env


def test_user_and_group():
    text = render(user="sglang", group="gpu")
    assert lines_of(text, "User") == ["sglang"] and lines_of(text, "Group") == ["gpu"]
    plain = render()
    assert lines_of(plain, "User") == [] and lines_of(plain, "Group") == []
    only_user = render(user="svc")
    assert lines_of(only_user, "User") == ["svc"] and lines_of(only_user, "Group") == []


def test_working_directory():
    assert [path_value(v) for v in lines_of(render(chdir="/srv/sglang"), "WorkingDirectory")] == ["/srv/sglang"]
    assert lines_of(render(), "WorkingDirectory") == []


@pytest.mark.parametrize("field", ["name", "version", "user", "group", "chdir"])
@pytest.mark.parametrize("bad", ["x\ny", "x\r", "\nExecStartPre=/bin/sh"])
def test_newline_in_a_field_raises(field, bad):
    with pytest.raises(ValueError):
        render(**{field: bad})


def test_newline_in_environment_raises_naming_the_variable():
    with pytest.raises(ValueError) as info:
        render(env={"SAFE": "ok", "HF_HOME": "/data\n[Service]"})
    assert "HF_HOME" in str(info.value)
    with pytest.raises(ValueError):
        render(env={"BAD\nKEY": "v"})


def test_newline_in_environment_file_or_flags_raises():
    with pytest.raises(ValueError):
        render(environment_files=["/etc/a.env\nExecStartPre=/bin/sh"])
    with pytest.raises(ValueError):
        render(flags=["--served-model-name", "a\nExecStartPre=/bin/sh"])
    with pytest.raises(ValueError):
        render(python="/opt/py\n/bin/sh")


def test_relative_python_raises():
    with pytest.raises(ValueError):
        render(python="python3")


# ---------------------------------------------------------------------------
# env_file_text
# ---------------------------------------------------------------------------

HOSTILE = {
    "HF_TOKEN": 'hf_a"b\\c$d`e',
    "PLAIN": "value",
    "SPACES": "  lead and trail  ",
    "DOLLARS": "$HOME ${PATH} $$",
    "QUOTES": "'single' \"double\"",
    "HASH": "#not-a-comment ;neither",
    "TRAILING_BACKSLASH": "ends with \\",
    "BACKSLASH_N": "literal \\n not a newline",
    "UNICODE": "\u00fcml\u00e4ut \u2603",
    "EMPTY": "",
    "NUMBER": 42,
    "NONE": None,
}


def test_env_file_round_trips_hostile_values():
    text = unit.env_file_text(HOSTILE)
    expected = dict((k, "" if v is None else str(v)) for k, v in HOSTILE.items())
    assert env_file_values(text) == expected
    assert [line.split("=", 1)[0] for line in text.splitlines()] == sorted(HOSTILE)
    assert text.endswith("\n")


def test_env_file_quotes_each_special_character():
    line = unit.env_file_text({"K": '"'})
    assert line == 'K="\\""\n'
    assert unit.env_file_text({"K": "\\"}) == 'K="\\\\"\n'
    assert unit.env_file_text({"K": "$"}) == 'K="\\$"\n'


def test_env_file_empty():
    assert unit.env_file_text({}) == ""


@pytest.mark.parametrize("name", ["1ABC", "A-B", "A B", "", "A=B", "\u00c4X", "A\nB", "A.B"])
def test_env_file_invalid_names_raise(name):
    with pytest.raises(ValueError) as info:
        unit.env_file_text({name: "v"})
    assert repr(name) in str(info.value)


@pytest.mark.parametrize("value", ["a\nb", "a\r", "\n"])
def test_env_file_newline_raises_naming_the_variable_not_the_value(value):
    with pytest.raises(ValueError) as info:
        unit.env_file_text({"OK": "fine", "HF_TOKEN": "hf_secret" + value})
    msg = str(info.value)
    assert "HF_TOKEN" in msg and "hf_secret" not in msg


# ===========================================================================
# BUGS FOUND (tests below fail until the lead's fix; see H6's report)
# ===========================================================================

@pytest.mark.parametrize("field, bad", [("name", "llama\nx"), ("version", "0.5\n23"), ("user", "svc\nx"),
                                        ("group", "gpu\nx"), ("chdir", "/srv\nx"), ("python", "/opt/py3\nx"),
                                        ("environment_files", ["/etc/a.env\nx"])])
def test_newline_error_names_the_field(field, bad):
    # "Bad input: a clear error naming the field": the message shows the value only.
    with pytest.raises(ValueError) as info:
        render(**{field: bad})
    names = {"environment_files": ("environment_files", "EnvironmentFile")}.get(field, (field,))
    assert any(n in str(info.value) for n in names), str(info.value)


def test_newline_in_fingerprint_raises():
    # The identity comment is a unit line too: a newline in it would inject the next line.
    with pytest.raises(ValueError):
        render(fingerprint="sha256:abc\nExecStartPre=/bin/sh -c id")


@pytest.mark.parametrize("path", ["/srv/my models/env file.env", "/etc/sglang/100%.env", '/etc/"q".env'])
def test_environment_file_paths_are_not_quoted(path):
    # systemd does not unquote EnvironmentFile=: a quoted path is "not absolute" and ignored.
    text = render(environment_files=[path])
    assert [path_value(v) for v in lines_of(text, "EnvironmentFile")] == [path]


@pytest.mark.parametrize("path", ["/srv/my models", "/srv/100%"])
def test_working_directory_is_not_quoted(path):
    # Neither does WorkingDirectory=.
    assert [path_value(v) for v in lines_of(render(chdir=path), "WorkingDirectory")] == [path]


@pytest.mark.parametrize("value", ["/templates/${MODEL}.jinja", "$HOME"])
def test_exec_start_dollar_is_literal(value):
    # render.systemd_quote (H1) leaves "$" alone, and systemd substitutes ${NAME} and a lone $NAME
    # in ExecStart from the environment ("$$" is a literal "$").
    flags = ["--model-path", "/models/llama", "--chat-template", value]
    text = render(flags=flags)
    words = exec_words(lines_of(text, "ExecStart")[0], env={"MODEL": "other", "HOME": "/root"})
    assert words == [PY, "-m", "sglang.launch_server"] + flags
