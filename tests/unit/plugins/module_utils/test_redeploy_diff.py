"""module_utils/redeploy/diff.py: the ``--diff`` of a redeploy, and launcher.py's two sources of it
(``Launcher.diff_source``, ``running_diff_source``).

- the texts: the command line one argument per line, the environment as ``NAME=value`` lines, the ``--config`` file
  and the unit, every secret masked, a changed secret marked ``******** (changed)``;
- :func:`launch_diff`: Ansible's standard diff list, only the parts that differ, empty "before" on a first deploy,
  and what the default callback renders of it (a unified diff whose ``-``/``+`` lines name the changed flag);
- no secret value (API key, admin key, HF_TOKEN, a secret arg, a password inside a URL) in any diff;
- the round trip: the running server's record, rendered again, is the planned launch it was written from (no diff).
"""
from __future__ import annotations

import json
import subprocess
import sys

from ansible.plugins.callback import CallbackBase

from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import diff as diff_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.server import launcher as engine

KEY = "sk-diff-7c1e55"
NEW_KEY = "sk-diff-rotated-90ab"
TOKEN = "hf_diff_0d4f9a"
PASSWORD = "pw-diff-3377"
URL_PASSWORD = "urlpw-diff-5521"
SECRETS = (KEY, NEW_KEY, TOKEN, PASSWORD, URL_PASSWORD)


class Ctx(object):
    """The few AnsibleModule methods the launcher calls."""

    def __init__(self):
        self.no_log_values = set()
        self.warnings = []

    def warn(self, msg):
        self.warnings.append(msg)

    def run_command(self, argv, environ_update=None):
        return 0, "", ""

    def get_bin_path(self, name, required=False, opt_dirs=None):
        return "/fake/bin/" + name


def params(tmp_path, args=None, env=None, **extra):
    out = {"name": "main", "version": "0.5.23", "manager": "process", "python": sys.executable,
           "args": dict({"model_path": "/models/llama", "port": 31000, "mem_fraction_static": 0.85}, **(args or {})),
           "env": dict({"CUDA_VISIBLE_DEVICES": "0,1", "HF_TOKEN": TOKEN}, **(env or {})), "api_key": KEY,
           "config_dir": str(tmp_path / "etc"), "state_dir": str(tmp_path / "state"),
           "log_file": str(tmp_path / "log" / "server.log")}
    out.update(extra)
    return out


def planned(tmp_path, label="planned", **kw):
    launcher = engine.Launcher(Ctx(), params(tmp_path, **kw), check_mode=True)
    assert launcher.plan() == []
    return launcher, launcher.diff_source(label)


def rendered(diff):
    """What the default callback prints for a task result with this ``diff`` (ansible-playbook --diff)."""
    return CallbackBase()._get_diff([dict(item) for item in diff])


def assert_no_secret(value):
    text = json.dumps(value)
    leaked = [s for s in SECRETS if s in text]
    assert not leaked, "secret values in the diff: %s" % leaked


# ---------------------------------------------------------------------------
# The texts
# ---------------------------------------------------------------------------

def test_argv_text_is_one_argument_per_line_with_secrets_masked():
    argv = ["/usr/bin/python3", "-m", "sglang.launch_server", "--model-path", "/models/a b", "--enable-metrics",
            "--lora-paths", "x=/l/x", "y=/l/y", "--api-key", KEY, "--mem-fraction-static=-1",
            "--json-model-override-args", '{"rope":1}']
    assert diff_mod.argv_text(argv).splitlines() == [
        "/usr/bin/python3 -m sglang.launch_server",
        "    --model-path '/models/a b'",
        "    --enable-metrics",
        "    --lora-paths x=/l/x y=/l/y",
        "    --api-key ********",
        "    --mem-fraction-static=-1",
        "    --json-model-override-args '{\"rope\":1}'",
    ]
    # A literal secret given to the masking is masked wherever it stands.
    assert KEY not in diff_mod.argv_text(["python", "--served-model-name", "m-%s" % KEY], [KEY])
    assert diff_mod.argv_text([]) == ""


def test_env_text_masks_secret_names_and_marks_the_changed_ones():
    text = diff_mod.env_text({"CUDA_VISIBLE_DEVICES": "0", "OPENAI_API_KEY": "sk-x", "PROXY": "http://u:%s@p" % URL_PASSWORD},
                             {"HF_TOKEN": TOKEN}, {"HF_TOKEN"})
    assert text.splitlines() == ["CUDA_VISIBLE_DEVICES=0", "HF_TOKEN=******** (changed)", "OPENAI_API_KEY=********",
                                 "PROXY=http://u:********@p"]


def test_config_text_is_the_config_file_with_masked_values():
    assert diff_mod.config_text({"api_key": KEY}) == 'api-key: "********"\n'
    assert diff_mod.config_text({"api_key": KEY, "ssl_keyfile_password": PASSWORD}, {"api_key"}, "0.5.23") == \
        'api-key: "********" (changed)\nssl-keyfile-password: "********"\n'
    assert diff_mod.config_text({}) == ""


# ---------------------------------------------------------------------------
# launch_diff
# ---------------------------------------------------------------------------

def test_a_first_deploy_has_an_empty_before(tmp_path):
    _launcher, after = planned(tmp_path)
    diff = diff_mod.launch_diff({"label": "nothing runs"}, after)
    assert [set(item) for item in diff] == [{"before", "after", "before_header", "after_header"}] * 3
    argv, config, env = diff
    assert all(item["before"] == "" for item in diff)
    assert argv["before_header"] == "SGLang server main: command line (nothing runs)"
    assert argv["after_header"].startswith("SGLang server main: command line (planned, identity ")
    assert argv["after"].splitlines()[0] == "%s -m sglang.launch_server" % sys.executable
    assert "    --mem-fraction-static 0.85" in argv["after"].splitlines()
    assert argv["after"].splitlines()[-1] == "    --config %s" % (tmp_path / "etc" / "candidate" / "config.yaml")
    assert config["after"] == 'api-key: "********"\n'
    assert config["after_header"].startswith("%s (planned" % (tmp_path / "etc" / "candidate" / "config.yaml"))
    assert env["after"] == "CUDA_VISIBLE_DEVICES=0,1\nHF_TOKEN=********\n"
    assert_no_secret(diff)


def test_a_changed_arg_shows_as_its_own_line_in_the_unified_diff(tmp_path):
    _a, before = planned(tmp_path, label="running PID 4218")
    _b, after = planned(tmp_path, args={"mem_fraction_static": 0.8})
    diff = diff_mod.launch_diff(before, after)
    assert [item["before_header"].split(" (")[0] for item in diff] == ["SGLang server main: command line"]
    assert diff[0]["before_header"].startswith("SGLang server main: command line (running PID 4218, identity ")
    lines = rendered(diff).splitlines()
    assert "-    --mem-fraction-static 0.85" in lines and "+    --mem-fraction-static 0.8" in lines
    assert [line for line in lines if line.startswith(("+", "-")) and not line.startswith(("---", "+++"))] == [
        "-    --mem-fraction-static 0.85", "+    --mem-fraction-static 0.8"]
    assert_no_secret(diff)


def test_the_same_launch_has_no_diff(tmp_path):
    _a, before = planned(tmp_path, label="running PID 1")
    _b, after = planned(tmp_path)
    assert diff_mod.launch_diff(before, after) == []


def test_rotated_secrets_are_marked_changed_never_shown(tmp_path):
    _a, before = planned(tmp_path, label="running PID 1", args={"ssl_keyfile_password": PASSWORD},
                         env={"PROXY": "http://svc:%s@proxy:3128" % URL_PASSWORD})
    _b, after = planned(tmp_path, api_key=NEW_KEY, env={"HF_TOKEN": "hf_other_value", "PROXY": "http://svc:%s@proxy:3128" % URL_PASSWORD},
                        args={"ssl_keyfile_password": PASSWORD})
    diff = diff_mod.launch_diff(before, after)
    by_part = dict((item["before_header"].split(" (")[0].rsplit("/", 1)[-1], item) for item in diff)
    assert sorted(by_part) == ["SGLang server main: environment", "config.yaml"]
    config = by_part["config.yaml"]
    # The key changed, the password did not: only the key is marked.
    assert config["before"] == 'api-key: "********"\nssl-keyfile-password: "********"\n'
    assert config["after"] == 'api-key: "********" (changed)\nssl-keyfile-password: "********"\n'
    env = by_part["SGLang server main: environment"]
    assert "HF_TOKEN=******** (changed)" in env["after"].splitlines() and "HF_TOKEN=********" in env["before"].splitlines()
    assert "PROXY=http://svc:********@proxy:3128" in env["after"].splitlines()
    assert_no_secret(diff)
    assert "hf_other_value" not in json.dumps(diff)
    assert_no_secret(rendered(diff))


def test_an_old_release_with_the_key_on_argv_masks_it(tmp_path):
    _a, before = planned(tmp_path, label="running PID 1", version="0.5.6", allow_api_key_in_argv=True)
    _b, after = planned(tmp_path, version="0.5.6", allow_api_key_in_argv=True, api_key=NEW_KEY)
    diff = diff_mod.launch_diff(before, after)
    # Both command lines carry the key (that release has no --config): masked on both sides, so no line differs.
    assert "    --api-key ********" in diff_mod.texts(before, secrets=[KEY])["argv"].splitlines()
    assert diff == []
    assert_no_secret(diff_mod.texts(after, secrets=[NEW_KEY]))


def test_a_server_this_collection_did_not_start_shows_its_command_line(tmp_path):
    before = {"label": "running PID 77, not started by this collection",
              "argv": ["python3", "-m", "sglang.launch_server", "--model-path", "/models/llama", "--api-key", KEY]}
    _b, after = planned(tmp_path)
    diff = diff_mod.launch_diff(before, after)
    assert diff[0]["before"] == "python3 -m sglang.launch_server\n    --model-path /models/llama\n    --api-key ********\n"
    assert diff[0]["before_header"] == "SGLang server main: command line (running PID 77, not started by this collection)"
    assert [item["before"] for item in diff[1:]] == ["", ""]      # its config file and environment are not known
    assert_no_secret(diff)


def test_the_systemd_unit_is_a_part_of_the_diff(tmp_path):
    units = tmp_path / "units"
    _a, before = planned(tmp_path, label="running PID 1", manager="systemd", unit_dir=str(units), python="/usr/bin/python3")
    _b, after = planned(tmp_path, manager="systemd", unit_dir=str(units), python="/usr/bin/python3",
                        args={"mem_fraction_static": 0.8})
    diff = diff_mod.launch_diff(before, after)
    unit = diff[-1]
    assert unit["before_header"].startswith("%s (running PID 1, identity " % (units / "sglang-main.service"))
    changed = [line for line in rendered([unit]).splitlines() if line.startswith(("+", "-")) and not line.startswith(("---", "+++"))]
    assert [line.split(" ")[0].split("=")[0] for line in changed] == ["-#", "+#", "-ExecStart", "+ExecStart"]
    assert changed[0].startswith("-# gpufleet-identity: ") and changed[1].startswith("+# gpufleet-identity: ")
    assert "--mem-fraction-static 0.85 " in changed[2] and "--mem-fraction-static 0.8 " in changed[3]
    # The unit names the secret env file, never a value.
    assert "EnvironmentFile=%s" % (tmp_path / "etc" / "candidate" / "server.env") in unit["after"]
    assert_no_secret(diff)


# ---------------------------------------------------------------------------
# The running server's launch, rendered again from its record
# ---------------------------------------------------------------------------

def test_the_record_of_the_running_server_renders_the_launch_it_was_written_from(tmp_path):
    units = tmp_path / "units"
    kw = dict(manager="systemd", unit_dir=str(units), python="/usr/bin/python3", args={"ssl_keyfile_password": PASSWORD})
    units.mkdir()
    written = engine.Launcher(Ctx(), params(tmp_path, **kw))
    assert written.plan() == []
    written.write_files()
    cur = {"pid": 4218, "fingerprint": written.fp, "argv": None}
    ctx = Ctx()
    before = engine.running_diff_source(ctx, cur, params(tmp_path, **kw))
    assert before["label"] == "running PID 4218" and before["fingerprint"] == written.fp
    # The same config planned again: nothing differs, the unit included.
    again, after = planned(tmp_path, **kw)
    assert again.fp == written.fp and diff_mod.launch_diff(before, after) == []
    # Its secrets came back from the 0600 secrets.json, and are no_log values of the module.
    assert {KEY, TOKEN, PASSWORD} <= ctx.no_log_values
    # A changed arg: the command line and the unit differ.
    _c, changed = planned(tmp_path, **{**kw, "args": {"ssl_keyfile_password": PASSWORD, "mem_fraction_static": 0.8}})
    diff = diff_mod.launch_diff(before, changed)
    assert [item["after_header"].split(" (")[0] for item in diff] == ["SGLang server main: command line",
                                                                      str(units / "sglang-main.service")]
    assert_no_secret(diff)


def test_the_running_launch_of_nothing_and_of_an_unrecorded_server(tmp_path):
    base = params(tmp_path)
    assert engine.running_diff_source(Ctx(), {"pid": None}, base) == {"label": "nothing runs"}
    unknown = engine.running_diff_source(Ctx(), {"pid": 99, "fingerprint": "sha256:nope",
                                                 "argv": ["python3", "--api-key", KEY]}, base)
    assert unknown == {"label": "running PID 99, not started by this collection", "argv": ["python3", "--api-key", "********"]}
    # An adopted server on the port (no PID file): its command line is read from /proc.
    # A child of known argv (pytest-xdist retitles this process, so its own /proc cmdline is not argv).
    code = "import sys; print('up', flush=True); sys.stdin.read()"
    child = subprocess.Popen([sys.executable, "-c", code, "--api-key", KEY], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"up\n"   # it runs its own argv now (right after the fork, /proc may not show it yet)
        adopted = engine.running_diff_source(Ctx(), {"pid": None}, base, port_owner=child.pid)
    finally:
        child.communicate(b"", timeout=30)
    assert adopted["label"] == "running PID %d, not started by this collection" % child.pid
    assert adopted["argv"] == [sys.executable, "-c", code, "--api-key", "********"]
