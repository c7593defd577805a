"""The effective-config check (module_utils/sglang/compare.py).

read_config_yaml is checked against render.to_config_yaml (the writer) and against PyYAML's
safe_load (how a YAML reader, SGLang's included, reads the same file).
"""
from __future__ import annotations

import pytest
import yaml

from ansible_collections.gpufleet.sglang.plugins.module_utils.common import secrets
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import compare, render, rules
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import resolve as resolve_mod

V = "0.5.23"


# ---------------------------------------------------------------------------
# normalise / same_value
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("arg, a, b", [
    ("tp_size", 16, "16"),
    ("tp_size", 16, 16.0),
    ("tp_size", "16", " 16 "),
    ("mem_fraction_static", 0.85, "0.85"),
    ("mem_fraction_static", 0.1 + 0.2, 0.3),
    ("mem_fraction_static", "1e-3", 0.001),
    ("enable_metrics", True, "true"),
    ("enable_metrics", True, "True"),
    ("enable_metrics", False, "false"),
    ("enable_metrics", False, None),
    ("enable_metrics", False, "None"),
    ("disable_radix_cache", True, 1),
    ("model_path", "/models/llama/", "/models/llama"),
    ("model_path", "/models/./llama", "/models/llama"),
    ("tokenizer_path", "/a//b", "/a/b"),
    ("download_dir", "/cache/hf/", "/cache/hf"),
    ("speculative_algorithm", "NEXTN", "EAGLE"),
    ("speculative_algorithm", "nextn", "EAGLE"),
    ("speculative_algorithm", "eagle3", "EAGLE3"),
    ("attention_backend", "fa3", "FA3"),
    ("json_model_override_args", '{"rope_scaling": {"factor": 2}}', {"rope_scaling": {"factor": 2.0}}),
    ("json_model_override_args", {"a": [1, 2]}, '{"a": [1, 2]}'),
    ("cuda_graph_bs", [1, 2, 4], ["1", "2", 4.0]),
    ("served_model_name", "llama", " llama "),
])
def test_same_value(arg, a, b):
    assert compare.same_value(arg, a, b)
    assert compare.same_value(arg, b, a)


@pytest.mark.parametrize("arg, a, b", [
    ("tp_size", 16, 8),
    ("tp_size", 2, True),
    ("mem_fraction_static", 0.85, 0.8),
    ("enable_metrics", True, False),
    ("enable_metrics", True, None),
    ("enable_metrics", True, "false"),
    ("served_model_name", "llama", "Llama"),          # not a path, not an algorithm: case counts
    ("model_path", "/models/llama", "/models/llama2"),
    ("speculative_algorithm", "EAGLE", "EAGLE3"),
    ("speculative_algorithm", "NEXTN", "NGRAM"),
    ("json_model_override_args", '{"a": 1}', {"a": 2}),
    ("json_model_override_args", "{not json", {"a": 1}),
    ("cuda_graph_bs", [1, 2, 4], [1, 2]),
    ("cuda_graph_bs", [1, 2, 4], [4, 2, 1]),
])
def test_different_values(arg, a, b):
    assert not compare.same_value(arg, a, b)
    assert not compare.same_value(arg, b, a)


def test_normalise_forms():
    assert compare.normalise("tp_size", "16") == 16.0 and isinstance(compare.normalise("tp_size", 16), float)
    assert compare.normalise("enable_metrics", "TRUE") is True
    assert compare.normalise("x", "null") is None and compare.normalise("x", None) is None
    assert compare.normalise("speculative_algorithm", "nextn") == "EAGLE"
    assert compare.normalise("model_path", "/a/b/../c/") == "/a/c"
    assert compare.normalise("served_model_name", "/a/b/../c/") == "/a/b/../c/"      # not a path argument
    assert compare.normalise("x", {"--Key-Name": "2"}) == {"Key_Name": 2.0}
    assert compare.normalise("x", ("1", True)) == [1.0, True]
    assert compare.normalise("x", "nan") == "nan"


# ---------------------------------------------------------------------------
# compare
# ---------------------------------------------------------------------------

def test_compare_equal_configs_in_other_spellings():
    expect = {"model_path": "/models/x", "tp_size": 2, "mem_fraction_static": 0.85, "speculative_algorithm": "NEXTN",
              "json_model_override_args": '{"a": 1}', "enable_metrics": True, "disable_radix_cache": False}
    info = {"model_path": "/models/x/", "tp_size": "2", "mem_fraction_static": 0.8500000000001,
            "speculative_algorithm": "EAGLE", "json_model_override_args": {"a": 1}, "enable_metrics": "true",
            "disable_radix_cache": None, "port": 30000}
    assert compare.compare(expect, info, V) == ([], [])


def test_compare_reports_override_and_unverified():
    expect = {"tp_size": 2, "mem_fraction_static": 0.85, "--chunked-prefill-size": 4096, "max_running_requests": None}
    info = {"tp_size": 2, "mem_fraction_static": 0.7}
    overrides, unverified = compare.compare(expect, info, V, adjustments=[])
    assert [(o["arg"], o["intended"], o["running"]) for o in overrides] == [("mem_fraction_static", 0.85, 0.7)]
    assert overrides[0]["explanation"].startswith("mem_fraction_static: intended 0.85, running 0.7")
    assert "--mem-fraction-static" in overrides[0]["explanation"]
    assert unverified == ["chunked_prefill_size"]              # normalised name; None (unset) is not checked


def test_compare_reads_first_dp_rank_internal_states():
    expect = {"max_total_num_tokens": 1000, "tp_size": 1}
    info = {"tp_size": 1, "internal_states": [{"max_total_num_tokens": 900}, {"max_total_num_tokens": 1000}]}
    overrides, unverified = compare.compare(expect, info, V, adjustments=[])
    assert [(o["arg"], o["running"]) for o in overrides] == [("max_total_num_tokens", 900)]
    assert unverified == []
    assert compare.lookup_effective({"internal_states": []}, "x") == (False, None)
    assert compare.lookup_effective({"internal_states": "junk"}, "x") == (False, None)
    assert compare.lookup_effective({"x": None}, "x") == (True, None)


def test_dp_size_reported_as_attn_dp_size_is_not_a_difference():
    # 0.5.23 reports --enable-dp-attention --dp-size 4 as attn_dp_size 4 and dp_size 1.
    expect = {"tp_size": 4, "dp_size": 4, "enable_dp_attention": True}
    info = {"tp_size": 4, "dp_size": 1, "attn_dp_size": 4, "enable_dp_attention": True}
    assert compare.compare(expect, info, V) == ([], [])


def test_dp_size_alias_only_when_it_matches():
    expect = {"dp_size": 4, "enable_dp_attention": True}
    info = {"dp_size": 1, "attn_dp_size": 2, "enable_dp_attention": True}
    overrides, dummy = compare.compare(expect, info, V, adjustments=[])
    assert [(o["arg"], o["intended"], o["running"]) for o in overrides] == [("dp_size", 4, 1)]
    no_alias = compare.compare({"dp_size": 4}, {"dp_size": 1}, V, adjustments=[])[0]
    assert [o["arg"] for o in no_alias] == ["dp_size"]


INCIDENT = {"model_path": "/models/llama-3.1-8b", "speculative_algorithm": "EAGLE",
            "speculative_draft_model_path": "/models/eagle-llama-3.1-8b", "speculative_eagle_topk": 1,
            "speculative_num_steps": 1, "speculative_num_draft_tokens": 16}


def test_explanation_comes_from_the_adjustments_given(monkeypatch):
    resolved = resolve_mod.resolve(INCIDENT, V, arch="LlamaForCausalLM", policy="mirror")
    adj = [a for a in resolved["adjustments"] if a["arg"] == "speculative_num_draft_tokens"]
    assert adj and adj[0]["from"] == 16
    running = adj[0]["to"]

    def no_second_resolution(*a, **kw):
        raise AssertionError("compare resolved the args a second time")

    monkeypatch.setattr(resolve_mod, "resolve", no_second_resolution)
    overrides, dummy = compare.compare({"speculative_num_draft_tokens": 16}, {"speculative_num_draft_tokens": running}, V,
                                       args=INCIDENT, adjustments=resolved["adjustments"])
    assert len(overrides) == 1
    why = overrides[0]["explanation"]
    assert rules.rule_text(adj[0]["rule"], "speculative_num_draft_tokens", 16, running) in why
    assert why.startswith("speculative_num_draft_tokens: intended 16, running %s" % running)
    assert compare.format_override(overrides[0]) == why


def test_adjustment_for_another_value_does_not_explain():
    adjustments = [{"arg": "speculative_num_draft_tokens", "from": 16, "to": 2, "rule": "eagle.topk1_draft_tokens"}]
    overrides, dummy = compare.compare({"speculative_num_draft_tokens": 16}, {"speculative_num_draft_tokens": 5}, V,
                                       args={"speculative_eagle_topk": 4}, adjustments=adjustments)
    text = rules.rule_text("eagle.topk1_draft_tokens", "speculative_num_draft_tokens", 16, 5)
    assert text not in overrides[0]["explanation"]


def test_explanation_failure_never_hides_the_difference(monkeypatch):
    def broken(*a, **kw):
        raise RuntimeError("rules table broken")

    monkeypatch.setattr(compare, "explain", broken)
    overrides, dummy = compare.compare({"tp_size": 2}, {"tp_size": 1}, V)
    assert len(overrides) == 1 and overrides[0]["arg"] == "tp_size"
    assert "no explanation available" in overrides[0]["explanation"] and "rules table broken" in overrides[0]["explanation"]
    assert compare.format_override(overrides[0]).startswith("tp_size: intended 2, running 1")


def test_format_override_without_explanation():
    line = compare.format_override({"arg": "x", "intended": {"a": 1}, "running": None, "explanation": ""})
    assert line == 'x: intended {"a": 1}, running null'


def test_supports_config():
    assert compare.supports_config("0.5.10") and compare.supports_config("0.5.23")
    assert not compare.supports_config("0.4.6") and not compare.supports_config("0.5.1")
    assert not compare.supports_config("not-a-version")


# ---------------------------------------------------------------------------
# read_config_yaml: round trip with render.to_config_yaml
# ---------------------------------------------------------------------------

HOSTILE = [
    "plain", 'with "double" quotes', "it's", "back\\slash", "trailing backslash \\", "\\\\server\\share",
    "tab\there", "new\nline", "cr\rlf", "nul\0byte", "ctrl \x01\x1b\x1f\x7f\x9f", "caf\u00e9 \u2603 \u65e5\u672c",
    "emoji \U0001F600", "line\u2028sep\u2029para", "next\x85line", "  spaces  ", "#hash", "key: value",
    "- dash", "{}", "[]", "", "'", '"', "\\n (a backslash and an n)", "\\u0041 not an escape",
    "mixed \"'\\\n\t end",
]


def _write(tmp_path, args):
    text = render.to_config_yaml(args, V)
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path), text


@pytest.mark.parametrize("value", HOSTILE, ids=[ascii(v)[1:-1][:40] for v in HOSTILE])
def test_read_config_yaml_round_trips_hostile_strings(tmp_path, value):
    path, text = _write(tmp_path, {"served_model_name": value, "model_path": "/models/x"})
    assert yaml.safe_load(text) == {"served-model-name": value, "model-path": "/models/x"}      # the writer is right
    assert compare.read_config_yaml(path) == {"served-model-name": value, "model-path": "/models/x"}


def test_read_config_yaml_secret_and_scalars(tmp_path):
    args = {"api_key": 'sk-"q"\\x', "tp_size": 2, "mem_fraction_static": 0.85, "enable_metrics": True,
            "json_model_override_args": {"rope": {"factor": 2}}, "chunked_prefill_size": 4096}
    path, text = _write(tmp_path, args)
    read = compare.read_config_yaml(path)
    loaded = yaml.safe_load(text)
    assert read["api-key"] == args["api_key"] == loaded["api-key"]
    for key, value in args.items():
        name = key.replace("_", "-")
        assert compare.same_value(key, value, read[name]), (key, read[name])
        assert compare.same_value(key, value, loaded[name])


def test_read_config_yaml_skips_lists_and_empty(tmp_path):
    path, text = _write(tmp_path, {"model_path": "/m", "allowed_media_domains": ["a.example", "b.example"]})
    assert "allowed-media-domains:" in text
    assert compare.read_config_yaml(path) == {"model-path": "/m"}
    empty = tmp_path / "empty.yaml"
    empty.write_text(render.to_config_yaml({}, V))
    assert compare.read_config_yaml(str(empty)) == {}


def test_read_config_yaml_missing(tmp_path):
    assert compare.read_config_yaml(str(tmp_path / "none.yaml")) == {}
    assert compare.read_config_yaml(str(tmp_path)) == {}


def test_read_config_yaml_single_quoted(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("api-key: 'it''s'\nport: 30000\n")
    assert compare.read_config_yaml(str(path)) == {"api-key": "it's", "port": "30000"}


# ---------------------------------------------------------------------------
# scan_log
# ---------------------------------------------------------------------------

def _pattern(version, exclude_version=None):
    for pattern in rules.log_patterns(version):
        if exclude_version is None or exclude_version not in pattern["versions"]:
            return pattern
    raise AssertionError("no log pattern for %s without %s" % (version, exclude_version))


def test_scan_log_finds_each_warning_once_with_secrets_masked():
    pats = rules.log_patterns(V)[:2]
    assert len(pats) == 2
    secret = "sk-supersecret-123"
    lines = [
        "[2026-12-01 10:00:00] INFO server_args.py:1: starting",
        "[2026-12-01 10:00:01] WARNING server_args.py:2: %s (api_key=%s)" % (pats[0]["text"], secret),
        "[2026-12-01 10:00:02] WARNING server_args.py:3: %s" % pats[1]["text"],
        "[2026-12-01 10:00:01] WARNING server_args.py:2: %s (api_key=%s)" % (pats[0]["text"], secret),
        "unrelated",
    ]
    found = compare.scan_log("\n".join(lines), V, secrets=[secret])
    assert [(f["arg"], f["rule"]) for f in found] == [(p["arg"], p["rule"]) for p in pats]
    assert secret not in repr(found)
    assert secrets.MASK in found[0]["line"] and pats[0]["text"] in found[0]["line"]


def test_scan_log_only_the_versions_lines():
    only_new = _pattern(V, exclude_version="0.5.10")
    text = "WARNING: %s\n" % only_new["text"]
    assert [f["rule"] for f in compare.scan_log(text, V)] == [only_new["rule"]]
    assert compare.scan_log(text, "0.5.10") == []


def test_scan_log_nothing():
    assert compare.scan_log("", V) == [] and compare.scan_log("all good\n", V) == []


# ===========================================================================
# BUGS FOUND (tests below fail until the lead's fix; see H6's report)
# ===========================================================================

@pytest.mark.parametrize("value", ["C:\\0dir", "group \\0 of a regex", "\\\\0"])
def test_read_config_yaml_backslash_then_zero(tmp_path, value):
    # _yaml_unquote turns every "\0" of the quoted body into "\u0000" before json.loads, also
    # when the backslash is the second half of an escaped backslash ("\\0" for a literal "\0").
    path, text = _write(tmp_path, {"served_model_name": value})
    assert yaml.safe_load(text) == {"served-model-name": value}
    assert compare.read_config_yaml(path) == {"served-model-name": value}
