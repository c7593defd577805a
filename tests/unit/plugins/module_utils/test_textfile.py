"""The node_exporter textfile of the last redeploy (module_utils/redeploy/textfile.py, modules/sglang_textfile.py).

The content is checked with a strict grammar of Prometheus' text exposition format 0.0.4 (prometheus_client is not
installed in the test environment; when it is, its parser reads the same content too): every line is a HELP, a TYPE
or a sample; HELP and TYPE come once per family, before its samples; label values are escaped; values are floats.
"""
from __future__ import annotations

import os
import re
import stat
import sys

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import textfile as textfile_mod
from ansible_collections.gpufleet.sglang.plugins.modules import sglang_textfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "modules"))

from redeploy_testlib import run_module  # noqa: E402 - after the modules test directory is put on sys.path

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL_VALUE = r'"(?:[^"\\\n]|\\\\|\\"|\\n)*"'
LABELS = r"\{(?:[a-zA-Z_][a-zA-Z0-9_]*=%s(?:,[a-zA-Z_][a-zA-Z0-9_]*=%s)*)?\}" % (LABEL_VALUE, LABEL_VALUE)
VALUE = r"(?:[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)|NaN|[+-]Inf)"
HELP_RE = re.compile(r"^# HELP (%s) ((?:[^\\\n]|\\\\|\\n)*)$" % NAME)
TYPE_RE = re.compile(r"^# TYPE (%s) (counter|gauge|histogram|summary|untyped)$" % NAME)
SAMPLE_RE = re.compile(r"^(%s)(%s)? (%s)$" % (NAME, LABELS, VALUE))
LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)=(%s)' % LABEL_VALUE)


def _unescape(quoted):
    body = quoted[1:-1]
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "\\": "\\", '"': '"'}[m.group(1)], body)


def parse(text):
    """``{family: {"help", "type", "samples": [(labels dict, float)]}}``; AssertionError on any invalid line."""
    assert text.endswith("\n"), "the exposition must end with a newline"
    families, current = {}, None
    for number, line in enumerate(text[:-1].split("\n"), 1):
        help_m, type_m, sample_m = HELP_RE.match(line), TYPE_RE.match(line), SAMPLE_RE.match(line)
        if help_m:
            name = help_m.group(1)
            assert name not in families, "line %d: a second HELP for %s" % (number, name)
            families[name] = {"help": help_m.group(2), "type": None, "samples": []}
            current = name
        elif type_m:
            name = type_m.group(1)
            assert name == current and families[name]["type"] is None and not families[name]["samples"], \
                "line %d: TYPE of %s not right after its HELP" % (number, name)
            families[name]["type"] = type_m.group(2)
        elif sample_m:
            name = sample_m.group(1)
            assert name == current and families[name]["type"], "line %d: sample of %s outside its family" % (number, name)
            labels = dict((k, _unescape(v)) for k, v in LABEL_RE.findall(sample_m.group(2) or ""))
            families[name]["samples"].append((labels, float(sample_m.group(3))))
        else:
            raise AssertionError("line %d is not valid exposition format: %r" % (number, line))
    for name, fam in families.items():
        seen = [tuple(sorted(labels.items())) for labels, _value in fam["samples"]]
        assert len(seen) == len(set(seen)), "%s repeats a label set" % name
    return families


def _with_prometheus_client(text):
    """The same content through prometheus_client's own parser, when it is installed (not in this venv)."""
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        return None
    return {f.name: [(s.labels, s.value) for s in f.samples] for f in text_string_to_metric_families(text)}


RECORD = dict(server="main", host="gpu-01", run_id="20261206T210000Z-1-abc", timestamp=1796000000.5, status="deployed",
              mode="restart", outage_s=41.25, tokens_per_s=812.5, accept_length=3.1, known_good_age_s=0.4)


def value(fams, name, **labels):
    got = [v for lab, v in fams[name]["samples"] if all(lab.get(k) == x for k, x in labels.items())]
    assert len(got) == 1, (name, labels, fams[name])
    return got[0]


def test_render_is_valid_exposition_with_every_metric():
    text = textfile_mod.render(RECORD)
    fams = parse(text)
    assert sorted(fams) == sorted("sglang_redeploy_" + n for n in (
        "last_timestamp_seconds", "last_info", "last_status", "last_mode", "last_outage_seconds",
        "last_tokens_per_second", "last_accept_length", "known_good_age_seconds"))
    assert all(f["type"] == "gauge" and f["help"] for f in fams.values())
    assert value(fams, "sglang_redeploy_last_timestamp_seconds", server="main") == 1796000000.5
    assert value(fams, "sglang_redeploy_last_outage_seconds") == 41.25
    assert value(fams, "sglang_redeploy_last_tokens_per_second") == 812.5
    assert value(fams, "sglang_redeploy_last_accept_length") == 3.1
    assert value(fams, "sglang_redeploy_known_good_age_seconds") == 0.4
    assert value(fams, "sglang_redeploy_last_info", run_id=RECORD["run_id"], host="gpu-01") == 1
    # One sample per status and per mode: 1 for this run's, 0 for the others (alerts compare with == 1).
    assert {lab["status"]: v for lab, v in fams["sglang_redeploy_last_status"]["samples"]} == {
        "deployed": 1, "unchanged": 0, "rolled_back": 0, "failed": 0}
    assert {lab["mode"]: v for lab, v in fams["sglang_redeploy_last_mode"]["samples"]} == {
        "restart": 1, "weights": 0, "none": 0}
    assert all(lab["server"] == "main" for f in fams.values() for lab, _value in f["samples"])
    other = _with_prometheus_client(text)
    if other is not None:
        assert sorted(other) == sorted(n[:-len("_total")] if n.endswith("_total") else n for n in fams)


def test_unknown_figures_are_left_out_not_zero():
    text = textfile_mod.render(dict(RECORD, status="failed", mode=None, outage_s=None, tokens_per_s=None,
                                    accept_length="", known_good_age_s=None))
    fams = parse(text)
    for name in ("last_outage_seconds", "last_tokens_per_second", "last_accept_length", "known_good_age_seconds"):
        assert "sglang_redeploy_" + name not in fams
    assert value(fams, "sglang_redeploy_last_status", status="failed") == 1
    assert value(fams, "sglang_redeploy_last_mode", mode="none") == 1


def test_label_values_are_escaped():
    nasty = 'a"b\\c\nd'
    text = textfile_mod.render(dict(RECORD, server=nasty, host=nasty))
    assert "\n" not in text.split("sglang_redeploy_last_info{")[1].split("} ")[0]
    fams = parse(text)
    assert value(fams, "sglang_redeploy_last_info", server=nasty, host=nasty) == 1


@pytest.mark.parametrize("bad, field", [(dict(status="planned"), "status"), (dict(mode="blue"), "mode"),
                                        (dict(timestamp=None), "timestamp"), (dict(outage_s="soon"), "outage_s")])
def test_bad_record_is_refused_with_the_field(bad, field):
    with pytest.raises(textfile_mod.TextfileError, match=field):
        textfile_mod.render(dict(RECORD, **bad))


def test_write_is_atomic_0644_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "sglang-main.prom"
    old_umask = os.umask(0o077)             # a strict umask must not make the file unreadable to node_exporter
    try:
        assert textfile_mod.write(str(path), "a 1\n") is True
    finally:
        os.umask(old_umask)
    assert path.read_text() == "a 1\n" and stat.S_IMODE(path.stat().st_mode) == 0o644
    inode = path.stat().st_ino
    assert textfile_mod.write(str(path), "a 1\n") is False          # unchanged: left alone
    assert textfile_mod.write(str(path), "a 2\n") is True
    assert path.read_text() == "a 2\n" and path.stat().st_ino != inode  # a new file renamed over the old one
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sglang-main.prom"]


@pytest.mark.parametrize("path, words", [("relative.prom", "absolute"), ("/tmp/x.txt", ".prom"),
                                         ("/nonexistent-dir-gpufleet/x.prom", "does not exist")])
def test_write_refuses_bad_paths_naming_the_variable(path, words):
    with pytest.raises(textfile_mod.TextfileError) as info:
        textfile_mod.write(path, "a 1\n")
    assert str(info.value).startswith(("path ", "the directory")) and words in str(info.value)
    assert "sglang_" not in str(info.value)
    with pytest.raises(textfile_mod.TextfileError) as info:
        textfile_mod.write(path, "a 1\n", label="sglang_textfile_path")
    assert "sglang_textfile_path" in str(info.value) and words in str(info.value)


def test_write_failure_removes_the_temporary(tmp_path, monkeypatch):
    path = tmp_path / "m.prom"

    def refuse(src, dst):
        raise OSError(13, "Permission denied")

    monkeypatch.setattr(textfile_mod.os, "replace", refuse)
    with pytest.raises(textfile_mod.TextfileError, match="Permission denied"):
        textfile_mod.write(str(path), "a 1\n")
    assert list(tmp_path.iterdir()) == []


def test_known_good_age(tmp_path):
    assert textfile_mod.known_good_age(str(tmp_path), 1000.0) is None
    kg = tmp_path / "known-good"
    kg.mkdir()
    assert textfile_mod.known_good_age(str(tmp_path), 1000.0) is None       # empty: never promoted
    (kg / "server.json").write_text("{}")
    os.utime(kg / "server.json", (900.0, 900.0))
    assert textfile_mod.known_good_age(str(tmp_path), 1000.0) == 100.0


def test_module_writes_the_file(tmp_path, monkeypatch):
    path = tmp_path / "sglang-main.prom"
    (tmp_path / "etc" / "known-good").mkdir(parents=True)
    (tmp_path / "etc" / "known-good" / "server.json").write_text("{}")
    args = dict(path=str(path), server="main", host="gpu-01", run_id="r1", status="rolled_back", mode="restart",
                outage_s=2.5, config_dir=str(tmp_path / "etc"))
    result = run_module(sglang_textfile, args, monkeypatch)
    assert result["failed"] is False and result["changed"] is True, result
    fams = parse(path.read_text())
    assert path.read_text() == result["content"]
    assert value(fams, "sglang_redeploy_last_status", status="rolled_back") == 1
    assert value(fams, "sglang_redeploy_last_outage_seconds") == 2.5
    assert 0 <= value(fams, "sglang_redeploy_known_good_age_seconds") < 3600
    assert "sglang_redeploy_last_tokens_per_second" not in fams


def test_module_check_mode_writes_nothing(tmp_path, monkeypatch):
    path = tmp_path / "sglang-main.prom"
    result = run_module(sglang_textfile, dict(path=str(path), status="deployed"), monkeypatch, check=True)
    assert result["failed"] is False and result["changed"] is True and not path.exists()
    parse(result["content"])


def test_module_on_error_warn_and_fail(tmp_path, monkeypatch):
    missing = str(tmp_path / "no-such-dir" / "m.prom")
    warned = run_module(sglang_textfile, dict(path=missing, status="failed", on_error="warn"), monkeypatch)
    assert warned["failed"] is False and "does not exist" in warned["textfile_error"], warned
    assert warned["warnings"] == [warned["textfile_error"]]
    failed = run_module(sglang_textfile, dict(path=missing, status="failed"), monkeypatch)
    assert failed["failed"] is True and "of path does not exist" in failed["msg"], failed
    labelled = run_module(sglang_textfile, dict(path=missing, status="failed", option_labels={"path": "sglang_textfile_path"}),
                          monkeypatch)
    assert labelled["failed"] is True and "of sglang_textfile_path does not exist" in labelled["msg"], labelled


@pytest.mark.parametrize("text", ["a 1", "# HELP a x\n# TYPE a gauge\na{b=\"c\"} one\n", "# HELP a x\na 1\n",
                                  "# HELP a x\n# TYPE a gauge\na{b=\"c\nd\"} 1\n", "# TYPE a gauge\na 1\n",
                                  "# HELP a x\n# TYPE a gauge\na 1\na 2\n"])
def test_the_grammar_itself_rejects_invalid_exposition(text):
    with pytest.raises(AssertionError):
        parse(text)
