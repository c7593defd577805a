"""Tests of the fake SGLang server (simulator/python/sglang).

Part 1 exercises the pure pieces in-process (YAML subset, --config merging,
the flag parser, the resolution rules of sglang.md §1, the speculation
model).  Part 2 starts real server processes on free loopback ports against a
temporary GPUSIM_ROOT and checks them from the outside: logs, /proc, the fake
nvidia-smi and HTTP.  Every process is recorded by PID and start time and
SIGKILLed by PID at teardown (sglang_helpers.ProcessRegistry).
"""
from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from sglang_helpers import (  # noqa: E402 - after this directory is put on sys.path
    GpuNode, ProcessRegistry, Server, alive, cmdline, comm, descendants,
    free_port, is_resource_tracker, make_model, sglang_titles, wait_for,
)

from gpusim.checkpoint import write_checkpoint  # noqa: E402 - needs simulator/python on sys.path (conftest)
from sglang.srt import resolution, yaml_subset  # noqa: E402 - needs simulator/python on sys.path (conftest)
from sglang.srt.server_args import ConfigArgumentMerger, build_parser, prepare_server_args  # noqa: E402 - needs simulator/python on sys.path (conftest)
from sglang.srt.sim_config import VERSION_NAMES, Knobs, version_tuple  # noqa: E402 - needs simulator/python on sys.path (conftest)
from sglang.srt.spec_model import SpecModel  # noqa: E402 - needs simulator/python on sys.path (conftest)

TOPK1_LINE = ("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 "
              "when speculative_eagle_topk == 1")
MAXRUN_LINE = ("Max running requests is reset to 48 for speculative decoding. You can override "
               "this by explicitly setting --max-running-requests.")
INCIDENT = ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "1",
            "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "16"]
FIXED = ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "15",
         "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "16"]
TS = r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] "


# =============================================================================
# Part 1: in-process units
# =============================================================================
def resolve(argv, version="0.5.23", arch="Qwen2ForCausalLM", gpu="NVIDIA H200", draft_arch=None,
            spec_v2=False):
    full = VERSION_NAMES[version]
    vt = version_tuple(full)
    sa = prepare_server_args(["--model-path", "/models/m"] + list(argv), full, vt,
                             configure_logging=False)
    ctx = resolution.ResolveContext(vt, arch, draft_arch=draft_arch, gpu_name=gpu,
                                    gpu_total_mib=143771, enable_spec_v2=spec_v2)
    sa.resolve_once(ctx)
    return sa


def spec_of(sa):
    return (sa.speculative_algorithm, sa.speculative_num_steps, sa.speculative_eagle_topk,
            sa.speculative_num_draft_tokens)


class TestYamlSubset:
    def test_scalars_lists_and_mappings(self):
        doc = yaml_subset.loads(
            "---\n# comment\nmodel-path: /m   # trailing comment\ntp-size: 2\n"
            "enable-metrics: true\nskip: no\nmem: 0.85\nnot-a-float: 1e3\n"
            "name: \"a # b\"\nq: 'it''s'\nflow: [1, \"two\", 3.0]\nblock:\n  - a\n  - 2\n"
            "d: {a: 1, b: x}\nnested:\n  k: v\nempty:\noct: 017\nhex: 0x1F\n")
        assert doc == {"model-path": "/m", "tp-size": 2, "enable-metrics": True, "skip": False,
                       "mem": 0.85, "not-a-float": "1e3", "name": "a # b", "q": "it's",
                       "flow": [1, "two", 3.0], "block": ["a", 2], "d": {"a": 1, "b": "x"},
                       "nested": {"k": "v"}, "empty": None, "oct": 15, "hex": 31}

    def test_non_mapping_roots_are_returned_for_the_caller_to_reject(self):
        assert yaml_subset.loads("- a\n- b\n") == ["a", "b"]
        assert yaml_subset.loads("just text") == "just text"
        assert yaml_subset.loads("# only a comment\n") is None

    @pytest.mark.parametrize("text", ["a: &x 1\n", "a: |\n  text\n", "a: *x\n",
                                      "a:\n  b:\n    c: 1\n", "a: [1, [2]]\n", "a: [1,\n"])
    def test_unsupported_constructs_fail_with_the_line(self, text):
        with pytest.raises(yaml_subset.YamlSubsetError, match="line"):
            yaml_subset.loads(text)


class TestCommandLine:
    def test_aliases_and_abbreviation(self):
        vt = (0, 5, 23)
        ns = build_parser(vt).parse_args(
            ["--model", "/m", "--tensor-parallel-size", "4", "--speculative-draft-model", "/d",
             "--nccl-init-addr", "h:5000", "--data-parallel-size", "2"])
        assert (ns.model_path, ns.tp_size, ns.speculative_draft_model_path, ns.dist_init_addr,
                ns.dp_size) == ("/m", 4, "/d", "h:5000", 2)
        assert build_parser(vt).parse_args(["--model-path", "/m", "--tp", "8"]).tp_size == 8

    def test_unknown_flag_is_an_argparse_error(self, capsys):
        with pytest.raises(SystemExit) as e:
            build_parser((0, 5, 23)).parse_args(["--model-path", "/m", "--no-such-flag", "1"])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("usage: sglang serve ")
        assert "sglang serve: error: unrecognized arguments: --no-such-flag 1" in err

    def test_old_versions_use_an_upper_case_choice_list(self, capsys):
        with pytest.raises(SystemExit):
            build_parser((0, 5, 1)).parse_args(["--model-path", "/m",
                                                "--speculative-algorithm", "eagle"])
        # argparse's own wording: Python 3.12.8 and later stopped quoting the choices.
        assert "invalid choice: eagle (choose from EAGLE, EAGLE3, NEXTN)" in \
            capsys.readouterr().err.replace("'", "")
        with pytest.raises(SystemExit):
            build_parser((0, 5, 1)).parse_args(["--model-path", "/m",
                                                "--speculative-algorithm", "NGRAM"])
        assert build_parser((0, 5, 10)).parse_args(
            ["--model-path", "/m", "--speculative-algorithm", "NGRAM"]).speculative_algorithm == "NGRAM"
        with pytest.raises(SystemExit):  # adaptive only exists in 0.5.23
            build_parser((0, 5, 10)).parse_args(["--model-path", "/m", "--speculative-adaptive"])

    def test_model_path_is_required(self, capsys):
        with pytest.raises(SystemExit):
            build_parser((0, 5, 23)).parse_args([])
        assert "the following arguments are required: --model-path/--model" in capsys.readouterr().err


class TestConfigFile:
    def merge(self, tmp_path, text, argv, name="c.yaml"):
        cfg = tmp_path / name
        cfg.write_text(text)
        argv = [a if a != "CFG" else str(cfg) for a in argv]
        return ConfigArgumentMerger(build_parser((0, 5, 23))).merge_config_with_args(argv)

    def test_config_precedence_booleans_and_lists(self, tmp_path):
        merged = self.merge(tmp_path, "tp-size: 4\nport: 31000\nenable-metrics: true\n"
                                      "trust-remote-code: false\nlora-paths: [a, b]\n",
                            ["--model-path", "/m", "--config", "CFG", "--port", "32000"])
        assert merged == ["--tp-size", "4", "--port", "31000", "--enable-metrics",
                          "--lora-paths", "a", "b", "--model-path", "/m", "--port", "32000"]
        ns = build_parser((0, 5, 23)).parse_args(merged)
        assert (ns.tp_size, ns.port, ns.enable_metrics, ns.trust_remote_code) == (4, 32000, True, False)

    def test_underscore_keys_are_emitted_as_written_like_the_real_merger(self, tmp_path, capsys):
        merged = self.merge(tmp_path, "tp_size: 2\nenable_metrics: true\n",
                            ["--model-path", "/m", "--config", "CFG"])
        assert merged[:3] == ["--tp_size", "2", "--enable_metrics"]
        with pytest.raises(SystemExit):
            build_parser((0, 5, 23)).parse_args(merged)
        assert "unrecognized arguments: --tp_size 2 --enable_metrics" in capsys.readouterr().err

    @pytest.mark.parametrize("text,argv,message", [
        ("a: 1\n", ["--config", "CFG", "--config", "CFG"], "Multiple config files specified"),
        ("a: 1\n", ["--model-path", "/m", "--config"], "No config file specified after --config"),
        ("- a\n", ["--config", "CFG"], "Config file must contain a dictionary at root level"),
        ("enable-tf32-matmul: true\n", ["--config", "CFG"],
         "Unsupported config option 'enable_tf32_matmul' with action 'BooleanOptionalAction'"),
    ])
    def test_config_errors(self, tmp_path, text, argv, message):
        with pytest.raises(ValueError, match=re.escape(message)):
            self.merge(tmp_path, text, argv)

    def test_suffix_and_existence(self, tmp_path):
        with pytest.raises(ValueError, match="Config file must be YAML format, got: .json"):
            self.merge(tmp_path, "{}", ["--config", "CFG"], name="c.json")
        with pytest.raises(ValueError, match="Config file not found"):
            ConfigArgumentMerger(build_parser((0, 5, 23))).merge_config_with_args(
                ["--config", str(tmp_path / "missing.yml")])

    def test_equals_form_is_silently_ignored(self, tmp_path):
        cfg = tmp_path / "c.yaml"
        cfg.write_text("tp-size: 4\n")
        sa = prepare_server_args(["--model-path", "/m", f"--config={cfg}"], "0.5.23", (0, 5, 23),
                                 configure_logging=False)
        assert sa.tp_size == 1


class TestResolution:
    def test_incident_topk1_rule_with_warning(self, caplog):
        caplog.set_level(logging.INFO)
        sa = resolve(INCIDENT)
        assert spec_of(sa) == ("EAGLE", 1, 1, 2)
        assert sa.max_running_requests == 48
        assert sa.disable_overlap_schedule is False  # 0.5.23 keeps overlap on CUDA
        messages = [r.getMessage() for r in caplog.records]
        assert TOPK1_LINE in messages and MAXRUN_LINE in messages

    def test_upper_casing_and_nextn_alias(self):
        assert resolve(["--speculative-algorithm", "nextn"]).speculative_algorithm == "EAGLE"
        assert resolve(["--speculative-algorithm", "eagle3"]).speculative_algorithm == "EAGLE3"
        with pytest.raises(ValueError, match="Unknown speculative algorithm name: FOO"):
            resolve(["--speculative-algorithm", "foo"])

    def test_gemma4_draft_promotion(self):
        assert resolve(["--speculative-algorithm", "NEXTN", "--speculative-draft-model-path", "/d"],
                       draft_arch="Gemma4AssistantForCausalLM").speculative_algorithm == "FROZEN_KV_MTP"
        with pytest.raises(ValueError, match="requires --speculative-algorithm NEXTN or EAGLE"):
            resolve(["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/d"],
                    draft_arch="Gemma4AssistantForCausalLM")

    @pytest.mark.parametrize("version,arch,expected", [
        ("0.5.23", "Qwen2ForCausalLM", (3, 1, 4)),
        ("0.5.23", "LlamaForCausalLM", (5, 4, 8)),
        ("0.5.23", "DeepseekV3ForCausalLM", (3, 1, 4)),
        ("0.5.23", "Grok1ForCausalLM", (5, 4, 8)),
        ("0.5.10", "Qwen2ForCausalLM", (3, 1, 4)),
        ("0.5.1", "Qwen2ForCausalLM", (5, 4, 8)),
        ("0.5.1", "GptOssForCausalLM", (3, 1, 4)),
        ("0.4.10", "DeepseekV3ForCausalLM", (3, 1, 4)),
        ("0.4.10", "GptOssForCausalLM", (5, 4, 8)),
        ("0.4.6", "DeepseekV3ForCausalLM", (5, 4, 8)),
    ])
    def test_automatic_defaults(self, version, arch, expected):
        sa = resolve(["--speculative-algorithm", "EAGLE"], version=version, arch=arch)
        assert spec_of(sa)[1:] == expected

    def test_standalone_defaults_and_dp_attention(self):
        assert spec_of(resolve(["--speculative-algorithm", "STANDALONE"],
                               arch="LlamaForCausalLM"))[1:] == (3, 1, 4)
        with pytest.raises(ValueError, match="standalone speculative decoding does not support dp"):
            # tp 2: real 0.5.23 first asserts that tp_size is a multiple of the attention-DP width
            resolve(["--speculative-algorithm", "STANDALONE", "--tp-size", "2", "--dp-size", "2",
                     "--enable-dp-attention"])

    @pytest.mark.parametrize("version", ["0.4.6", "0.5.1", "0.5.10", "0.5.23"])
    def test_topk_or_draft_without_steps_is_a_bare_assertion(self, version):
        with pytest.raises(AssertionError) as e:
            resolve(["--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "1"],
                    version=version)
        assert str(e.value) == ""

    def test_steps_without_topk_is_a_type_error(self):
        with pytest.raises(TypeError, match="'>' not supported between instances of 'NoneType' and 'int'"):
            resolve(["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3"])

    def test_max_running_requests_warning_only_from_0510(self, caplog):
        caplog.set_level(logging.INFO)
        sa = resolve(INCIDENT, version="0.5.1")
        assert sa.max_running_requests == 48
        assert MAXRUN_LINE not in [r.getMessage() for r in caplog.records]
        assert TOPK1_LINE in [r.getMessage() for r in caplog.records]
        caplog.clear()
        resolve(INCIDENT, version="0.5.10")
        assert MAXRUN_LINE in [r.getMessage() for r in caplog.records]
        assert resolve(INCIDENT + ["--max-running-requests", "7"]).max_running_requests == 7

    @pytest.mark.parametrize("version,overlap_off,mixed", [
        ("0.4.6", True, True), ("0.4.10", True, False), ("0.5.1", True, False),
        ("0.5.10", True, False), ("0.5.23", False, True)])
    def test_overlap_and_mixed_chunk_per_version(self, version, overlap_off, mixed):
        sa = resolve(INCIDENT + ["--enable-mixed-chunk"], version=version)
        assert sa.disable_overlap_schedule is overlap_off
        assert sa.enable_mixed_chunk is mixed

    def test_spec_v2_env_in_0510(self):
        assert resolve(INCIDENT, version="0.5.10", spec_v2=True).disable_overlap_schedule is False
        with pytest.raises(ValueError, match="Spec v2 currently only supports topk = 1"):
            resolve(["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
                     "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "8"],
                    version="0.5.10", spec_v2=True)

    def test_standalone_mixed_chunk_off_in_0523(self, caplog):
        caplog.set_level(logging.INFO)
        sa = resolve(["--speculative-algorithm", "STANDALONE", "--enable-mixed-chunk",
                      "--speculative-draft-model-path", "/d"])
        assert sa.enable_mixed_chunk is False
        assert ("Mixed chunked prefill is disabled: STANDALONE speculative decoding does not "
                "support it.") in [r.getMessage() for r in caplog.records]

    def test_page_size_rules(self):
        tree = ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
                "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "8",
                "--page-size", "16"]
        # 0.4.6: topk silently forced to 1 (with its warning), then draft = steps + 1
        assert spec_of(resolve(tree, version="0.4.6"))[1:] == (3, 1, 4)
        # 0.4.10 / 0.5.1: no rule
        assert spec_of(resolve(tree, version="0.5.1"))[1:] == (3, 4, 8)
        # 0.5.10: only flashinfer / fa3; 0.5.23 adds triton
        with pytest.raises(ValueError, match="only supported for the 'flashinfer' backend"):
            resolve(tree + ["--attention-backend", "triton"], version="0.5.10")
        assert spec_of(resolve(tree + ["--attention-backend", "triton"]))[1:] == (3, 4, 8)
        with pytest.raises(ValueError, match=r"only supported on \('flashinfer', 'fa3', 'triton'\); "
                                             r"got attention_backend='flashmla'"):
            resolve(tree + ["--attention-backend", "flashmla"])

    def test_trtllm_mha_with_topk_above_one(self):
        argv = ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
                "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "8",
                "--attention-backend", "trtllm_mha"]
        # 0.5.1 and 0.5.10 refuse trtllm_mha below SM100 first (real wheels): the topk check needs a B200 there.
        for version in ("0.5.1", "0.5.10", "0.5.23"):
            with pytest.raises(ValueError, match="trtllm_mha backend only supports topk = 1"):
                resolve(argv, version=version, gpu="NVIDIA B200")
        # the real 0.4.10.post2 parser has no trtllm_mha choice (flag table from the wheels)
        with pytest.raises(SystemExit):
            resolve(argv, version="0.4.10")

    def test_default_attention_backend_depends_on_gpu_and_topk(self):
        assert resolve([]).attention_backend == "fa3"
        assert resolve(["--speculative-algorithm", "EAGLE"], arch="LlamaForCausalLM").attention_backend == "fa3"
        assert resolve(["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
                        "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "4"]
                       ).attention_backend == "flashinfer"
        b200 = "NVIDIA B200"
        assert resolve([], gpu=b200).attention_backend == "trtllm_mha"
        assert resolve(["--speculative-algorithm", "EAGLE"], gpu=b200).attention_backend == "flashinfer"
        assert resolve(INCIDENT, gpu=b200).attention_backend == "trtllm_mha"

    def test_ngram(self, caplog):
        caplog.set_level(logging.INFO)
        sa = resolve(["--speculative-algorithm", "NGRAM", "--speculative-eagle-topk", "3"])
        assert spec_of(sa) == ("NGRAM", 1, 10, 12)
        assert sa.enable_mixed_chunk is False and sa.max_running_requests == 48
        messages = [r.getMessage() for r in caplog.records]
        assert "The mixed chunked prefill are disabled because of using ngram speculative decoding." in messages
        assert TOPK1_LINE not in messages
        sa = resolve(["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "8",
                      "--speculative-ngram-max-bfs-breadth", "4"])
        assert spec_of(sa) == ("NGRAM", 2, 4, 8)
        assert resolve(["--speculative-algorithm", "NGRAM"], version="0.5.10").speculative_num_steps is None
        with pytest.raises(ValueError, match="ngram speculative decoding does not support dp attention"):
            # tp 2: real 0.5.23 first asserts that tp_size is a multiple of the attention-DP width
            resolve(["--speculative-algorithm", "NGRAM", "--tp-size", "2", "--dp-size", "2", "--enable-dp-attention"])

    def test_adaptive(self, caplog):
        caplog.set_level(logging.INFO)
        assert spec_of(resolve(["--speculative-algorithm", "EAGLE", "--speculative-adaptive"])) == \
            ("EAGLE", 3, 1, 4)
        assert spec_of(resolve(["--speculative-algorithm", "EAGLE", "--speculative-adaptive",
                                "--speculative-num-steps", "7"])) == ("EAGLE", 7, 1, 8)
        with pytest.raises(ValueError, match=r"--speculative-num-steps=4 is not in the adaptive "
                                             r"config candidate_steps \[0, 1, 3, 5, 7\]"):
            resolve(["--speculative-algorithm", "EAGLE", "--speculative-adaptive",
                     "--speculative-num-steps", "4"])
        sa = resolve(["--speculative-algorithm", "EAGLE", "--speculative-adaptive",
                      "--speculative-num-steps", "3", "--speculative-eagle-topk", "4",
                      "--speculative-num-draft-tokens", "8"])
        assert sa.speculative_adaptive is False and spec_of(sa)[1:] == (3, 4, 8)
        assert ("speculative_adaptive disabled: speculative_eagle_topk=4 (only topk=1 is "
                "supported). Falling back to static speculative params.") in \
            [r.getMessage() for r in caplog.records]

    def test_deepseek_mtp_draft_defaults_to_the_model(self, caplog):
        caplog.set_level(logging.INFO)
        sa = resolve(["--speculative-algorithm", "EAGLE"], arch="DeepseekV3ForCausalLM")
        assert sa.speculative_draft_model_path == "/models/m"
        resolve(["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "/d"],
                arch="DeepseekV3ForCausalLM")
        assert "DeepSeek MTP does not require setting speculative_draft_model_path." in \
            [r.getMessage() for r in caplog.records]

    def test_dflash_and_dspark(self):
        with pytest.raises(ValueError, match="DFLASH speculative decoding requires setting"):
            resolve(["--speculative-algorithm", "DFLASH"])
        assert spec_of(resolve(["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path",
                                "/d", "--speculative-num-steps", "4"])) == ("DFLASH", 1, 1, 16)
        assert spec_of(resolve(["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path",
                                "/d", "--speculative-dspark-block-size", "5"])) == ("DSPARK", 1, 1, 6)
        with pytest.raises(ValueError, match="must equal gamma \\+ 1"):
            resolve(["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", "/d",
                     "--speculative-dspark-block-size", "5", "--speculative-num-draft-tokens", "4"])

    def test_no_speculation_defaults(self):
        sa = resolve([])
        assert sa.served_model_name == "/models/m" and sa.max_running_requests is None
        assert 0.8 < sa.mem_fraction_static < 0.95 and sa.page_size == 1


class TestSpecModel:
    def test_incident_numbers(self):
        knobs = Knobs({})
        bad = SpecModel("EAGLE", 1, 1, 2, knobs)
        good = SpecModel("EAGLE", 15, 1, 16, knobs)
        assert bad.expected_accept_length() == pytest.approx(1.661, abs=1e-3)
        assert good.expected_accept_length() == pytest.approx(2.946, abs=1e-3)
        assert bad.expected_tps() == pytest.approx(56.8, abs=0.05)
        assert good.expected_tps() > 95.0
        assert SpecModel(None, None, None, None, knobs).expected_tps() == 90.0

    def test_sampling_matches_expectation(self):
        import random

        knobs = Knobs({})
        for model in (SpecModel("EAGLE", 1, 1, 2, knobs), SpecModel("EAGLE", 15, 1, 16, knobs),
                      SpecModel("EAGLE", 5, 4, 8, knobs)):
            rng = random.Random(1)
            steps = [model.sample_step(rng) for _step in range(20000)]
            assert sum(steps) / len(steps) == pytest.approx(model.expected_accept_length(), rel=0.02)
            assert max(steps) <= model.k + 1
        plan = SpecModel("EAGLE", 15, 1, 16, knobs).plan(100, random.Random(0))
        assert sum(plan) == 100

    def test_knobs_validate(self):
        with pytest.raises(Exception, match="SGLANG_SIM_VERSION='0.4.7' is not emulated"):
            Knobs({"SGLANG_SIM_VERSION": "0.4.7"})
        assert Knobs({"SGLANG_SIM_VERSION": "0.4.10"}).version == "0.4.10.post2"


# =============================================================================
# Part 2: server processes
# =============================================================================
@pytest.fixture
def registry():
    reg = ProcessRegistry()
    try:
        yield reg
    finally:
        reg.kill_all()


@pytest.fixture
def node(tmp_path):
    return GpuNode(tmp_path / "gpusim", gpus=4)


@pytest.fixture
def model(tmp_path):
    return make_model(tmp_path / "models" / "qwen")


@pytest.fixture
def start(tmp_path, registry, node, model):
    servers = []

    def _start(args=(), env=None, with_model=True, api_key=None, port=None, name=None):
        args = list(args)
        if with_model:
            args = ["--model-path", model] + args
        if api_key:
            args += ["--api-key", api_key]
        log = tmp_path / ("%s.log" % (name or "server%d" % len(servers)))
        srv = Server(registry, node, log, args, env=env, api_key=api_key, port=port)
        servers.append(srv)
        return srv

    try:
        yield _start
    finally:
        registry.kill_all()  # by recorded PID (and start time) only
        for srv in servers:
            try:
                srv.proc.wait(timeout=10)  # reap: no zombies left behind
            except Exception:
                pass
            srv.close()


def run_to_exit(start, args, env=None, timeout=20, with_model=True, port=None):
    srv = start(args, env=env, with_model=with_model, port=port)
    rc = srv.wait(timeout)
    return srv, rc


class TestStartupFailures:
    def test_unknown_flag_exits_2(self, start):
        srv, rc = run_to_exit(start, ["--tp-size", "1", "--bogus-flag", "x"])
        assert rc == 2
        log = srv.log()
        assert "usage: sglang serve [-h]" in log
        assert "sglang serve: error: unrecognized arguments: --bogus-flag x" in log

    def test_assertion_error_before_any_memory(self, start, node):
        srv, rc = run_to_exit(start, ["--speculative-algorithm", "EAGLE",
                                      "--speculative-eagle-topk", "1"])
        assert rc == 1
        log = srv.log()
        assert "Traceback (most recent call last):" in log
        assert log.rstrip().splitlines()[-1] == "AssertionError"
        assert node.compute_apps() == [] and set(node.used().values()) == {1}

    def test_type_error_pitfall(self, start):
        srv, rc = run_to_exit(start, ["--speculative-algorithm", "EAGLE",
                                      "--speculative-num-steps", "2"])
        assert rc == 1
        assert srv.log().rstrip().splitlines()[-1] == \
            "TypeError: '>' not supported between instances of 'NoneType' and 'int'"

    def test_value_error_page_size(self, start):
        srv, rc = run_to_exit(start, ["--speculative-algorithm", "EAGLE",
                                      "--speculative-num-steps", "3", "--speculative-eagle-topk",
                                      "4", "--speculative-num-draft-tokens", "8", "--page-size",
                                      "64", "--attention-backend", "flashmla"])
        assert rc == 1
        assert "ValueError: speculative_eagle_topk > 1 with page_size > 1 is only supported on" in srv.log()

    def test_model_path_must_hold_config_json(self, start, tmp_path):
        (tmp_path / "empty").mkdir()
        srv, rc = run_to_exit(start, ["--model-path", str(tmp_path / "empty")], with_model=False)
        assert rc == 1
        assert "OSError: %s does not appear to have a file named config.json" % (tmp_path / "empty") \
            in srv.log()
        srv, rc = run_to_exit(start, ["--speculative-algorithm", "EAGLE",
                                      "--speculative-draft-model-path", str(tmp_path / "nope")])
        assert rc == 1 and "OSError: Can't load the configuration of" in srv.log()


class TestProcessTreeAndMemory:
    def test_titles_tree_and_memory_on_visible_gpus(self, start, node):
        uuid3 = node.gpus()[3]["uuid"]
        srv = start(["--tp-size", "2", "--mem-fraction-static", "0.8"],
                    env={"CUDA_VISIBLE_DEVICES": "2,%s" % uuid3})
        srv.wait_healthy()
        main_cmd = cmdline(srv.pid)
        assert main_cmd[1:3] == ["-m", "sglang.launch_server"]
        kids = {tuple(cmdline(p)): p for p in descendants(srv.pid)}
        trackers = [k for k in kids if is_resource_tracker(list(k))]
        assert len(trackers) == 1 and trackers[0][0] == sys.executable   # multiprocessing's, as the real 0.5.23
        assert set(kids) - set(trackers) == {("sglang::scheduler_TP0",), ("sglang::scheduler_TP1",),
                                             ("sglang::detokenizer",)}
        assert comm(kids[("sglang::scheduler_TP0",)]) == "sglang::schedul"
        assert comm(kids[("sglang::detokenizer",)]) == "sglang::detoken"
        apps = node.compute_apps()
        uuids = {g["index"]: g["uuid"] for g in node.gpus()}
        by_pid = {a["pid"]: a for a in apps}
        assert set(by_pid) == {kids[("sglang::scheduler_TP0",)], kids[("sglang::scheduler_TP1",)]}
        assert by_pid[kids[("sglang::scheduler_TP0",)]]["uuid"] == uuids[2]
        assert by_pid[kids[("sglang::scheduler_TP1",)]]["uuid"] == uuids[3]
        expected = int(0.8 * 143771) + 1536
        for app in apps:
            assert app["mib"] == expected
            assert app["name"].startswith("/") and "python" in app["name"]
        used = node.used()
        assert used[0] == 1 and used[1] == 1 and used[2] == expected + 1

    def test_single_rank_title_has_no_tp_suffix(self, start):
        srv = start([])
        srv.wait_healthy()
        titles = sglang_titles(descendants(srv.pid))
        assert titles == ["sglang::detokenizer", "sglang::scheduler"]

    def test_data_parallel_titles_and_invalid_device_ordinal(self, start, node):
        srv = start(["--dp-size", "2"])
        srv.wait_healthy()
        titles = sglang_titles(srv.tree())
        assert titles == ["sglang::detokenizer", "sglang::scheduler_DP0", "sglang::scheduler_DP1"]
        used = node.used()
        assert used[0] > 1000 and used[1] > 1000 and used[2] == 1
        assert [l["dp_rank"] for l in srv.request("/v1/loads").json()["loads"]] == [0, 1]
        srv, rc = run_to_exit(start, ["--tp-size", "2"], env={"CUDA_VISIBLE_DEVICES": "3"})
        assert rc == -signal.SIGKILL
        assert "RuntimeError: CUDA error: invalid device ordinal" in srv.log()

    def test_sigkill_of_main_takes_children_down(self, start, node):
        srv = start(["--tp-size", "2"])
        srv.wait_healthy()
        kids = descendants(srv.pid)
        assert len(kids) == 4  # two schedulers, the detokenizer, multiprocessing's resource_tracker
        os.kill(srv.pid, signal.SIGKILL)
        assert srv.wait(10) == -signal.SIGKILL
        wait_for(lambda: not any(alive(p) for p in kids), 10, what="PDEATHSIG kills the children")
        # memory outlives the kill for SGLANG_SIM_KILL_RELEASE_S, then goes
        wait_for(lambda: node.compute_apps() == [], 10, what="memory released after SIGKILL")

    def test_stale_holder_makes_startup_fail_with_cuda_oom(self, start, node):
        node.gpusim("orphan", "--gpu", "0", "--mib", "100000")
        srv, rc = run_to_exit(start, ["--tp-size", "2"], env={"CUDA_VISIBLE_DEVICES": "0,1"})
        assert rc == -signal.SIGKILL
        log = srv.log()
        assert "Scheduler hit an exception: Traceback (most recent call last):" in log
        assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate" in log
        assert "Received sigquit from a child process. It usually means the child failed." in log
        wait_for(lambda: node.compute_apps() == [], 10, what="no process left on the GPUs")


class TestSignals:
    def test_sigterm_graceful_0523(self, start, node):
        srv = start(["--tp-size", "2"])
        srv.wait_healthy()
        kids = srv.tree()
        assert len(node.compute_apps()) == 2
        srv.signal(signal.SIGTERM)
        assert srv.wait(20) == 0
        log = srv.log()
        assert re.search(TS + re.escape("SIGTERM received. signum=None frame=None. Draining "
                                        "requests and shutting down...") + "$", log, re.M)
        assert "Gracefully exiting... Remaining number of requests 0. Remaining requests " \
               "remaining_rids=[]." in log
        assert not any(alive(p) for p in kids)
        # schedulers released their holds themselves: nothing lingers
        assert node.compute_apps() == [] and set(node.used().values()) == {1}

    def test_sigterm_drains_in_flight_requests(self, start):
        srv = start([], env={"SGLANG_SIM_TIME_SCALE": "0.1"})
        srv.wait_healthy()
        results = {}

        def long_request():  # 9000 tokens at 90 tok/s, time scale 0.1: ~10 s of wall time (room for a loaded CI)
            results["r"] = srv.request("/generate", "POST",
                                       {"text": "x", "sampling_params": {"max_new_tokens": 9000}})

        t = threading.Thread(target=long_request)
        t.start()
        wait_for(lambda: srv.request("/v1/loads").json()["loads"][0]["num_running_reqs"] == 1, 5,
                 what="request running")
        srv.signal(signal.SIGTERM)
        wait_for(lambda: "Draining requests" in srv.log(), 5, what="drain start")
        assert srv.status("/health") == 503
        assert srv.status("/health_generate") == 503
        assert srv.status("/ready") == 503
        # new work is still accepted while draining (§3.2)
        late = srv.request("/generate", "POST", {"text": "y", "sampling_params": {"max_new_tokens": 4}})
        assert late.status == 200 and late.json()["meta_info"]["completion_tokens"] == 4
        assert srv.poll() is None
        wait_for(lambda: "Remaining number of requests 1." in srv.log(), 8, what="drain progress line")
        t.join(30)
        assert results["r"].status == 200
        assert srv.wait(20) == 0

    def test_sigterm_during_loading_is_fatal_default_action(self, start):
        srv = start(["--tp-size", "2"], env={"SGLANG_SIM_STARTUP_S": "5"})
        wait_for(lambda: "Load weight begin" in srv.log(), 10, what="loading")
        kids = srv.tree()
        srv.signal(signal.SIGTERM)
        assert srv.wait(10) == -signal.SIGTERM
        wait_for(lambda: not any(alive(p) for p in kids), 10, what="children die with the parent")

    def test_sigterm_before_any_request_kills_by_the_signal(self, start, node):
        # --skip-server-warmup: Up at once, but nothing has installed SGLang's
        # SIGTERM handler yet (/ready, /ping, /model_info, /v1/models, /metrics
        # never do): 0.5.23 dies by the signal (measured on the real server: status 143),
        # the children follow through PDEATHSIG.
        srv = start(["--skip-server-warmup", "--enable-metrics"])
        srv.wait_healthy(path="/ready", ready_line=False)
        for path in ("/ping", "/model_info", "/v1/models", "/metrics"):
            assert srv.status(path) == 200, path
        kids = srv.tree()
        srv.signal(signal.SIGTERM)
        assert srv.wait(10) == -signal.SIGTERM
        log = srv.log()
        assert "Draining requests" not in log and "Finished server process" not in log
        wait_for(lambda: not any(alive(p) for p in kids), 10, what="children killed")
        wait_for(lambda: node.compute_apps() == [], 10, what="memory released")

    def test_sigterm_before_any_request_stops_like_uvicorn_before_0523(self, start, node):
        # The emulated 0.5.10: uvicorn stops, the finally SIGKILLs the children, status 0.
        srv = start(["--skip-server-warmup"], env={"SGLANG_SIM_VERSION": "0.5.10"})
        wait_for(lambda: srv.status("/model_info") == 200, 20, what="the port")
        kids = srv.tree()
        srv.signal(signal.SIGTERM)
        assert srv.wait(10) == 0
        assert "Finished server process" in srv.log()
        wait_for(lambda: not any(alive(p) for p in kids), 10, what="children killed")

    @pytest.mark.parametrize("path", ["/server_info", "/health", "/v1/loads", "/flush_cache"])
    def test_a_control_call_installs_the_drain_handler(self, start, node, path):
        # tokenizer_control_mixin.py: every control call (get_internal_state for
        # /server_info, get_loads, flush_cache) and every generate -- /health
        # included, SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION defaults to true --
        # runs auto_create_handle_loop, which installs the SIGTERM drain handler.
        srv = start(["--skip-server-warmup"])
        srv.wait_healthy(path="/ready", ready_line=False)
        assert srv.status(path) == 200
        kids = srv.tree()
        srv.signal(signal.SIGTERM)
        assert srv.wait(15) == 0
        log = srv.log()
        assert "SIGTERM received. signum=None frame=None. Draining requests and shutting down..." in log
        assert "Gracefully exiting... Remaining number of requests 0." in log
        assert "Finished server process" not in log
        wait_for(lambda: not any(alive(p) for p in kids), 10, what="children gone")
        assert node.compute_apps() == []

    def test_health_without_generation_does_not_install_the_handler(self, start):
        srv = start(["--skip-server-warmup"], env={"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "false"})
        srv.wait_healthy(ready_line=False)
        srv.signal(signal.SIGTERM)
        assert srv.wait(10) == -signal.SIGTERM     # no handler: the default action (0.5.23)
        assert "Draining requests" not in srv.log()

    def test_unhealthy_server_force_exits_without_draining(self, start, node):
        # The second request hangs (sglang#22779 knob); the health check then gets no
        # answer and marks the server UnHealthy; SIGTERM force-exits without waiting
        # for the hung request (sigterm_watchdog), through the ShutdownReq path.
        srv = start([], env={"SGLANG_SIM_HANG_AFTER_REQUESTS": "1", "SGLANG_SIM_HANG_WHEN": "always",
                             "SGLANG_HEALTH_CHECK_TIMEOUT": "0.2"})
        srv.wait_healthy()
        body = {"text": "x", "sampling_params": {"max_new_tokens": 4}}
        assert srv.request("/generate", "POST", body).status == 200
        hung = threading.Thread(target=lambda: srv.status("/generate", method="POST", body=body, timeout=30))
        hung.daemon = True
        hung.start()
        wait_for(lambda: srv.request("/v1/loads").json()["loads"][0]["num_running_reqs"] == 1, 5,
                 what="the hung request")
        assert srv.status("/health", timeout=10) == 503
        assert "Health check failed. Server couldn't get a response from detokenizer" in srv.log()
        kids = srv.tree()
        srv.signal(signal.SIGTERM)
        assert srv.wait(20) == 0
        log = srv.log()
        assert "Signal SIGTERM received while health check failed. Force exiting." in log
        assert "Gracefully exiting... Remaining number of requests" not in log
        wait_for(lambda: not any(alive(p) for p in kids), 10, what="children gone")
        assert node.compute_apps() == []

    def test_pause_makes_ready_fail(self, start):
        srv = start([])
        srv.wait_healthy()
        assert srv.status("/ready") == 200
        assert srv.request("/pause_generation", "POST", {"mode": "in_place"}).status == 200
        assert srv.status("/ready") == 503 and srv.status("/ping") == 200
        assert srv.request("/continue_generation", "POST", {}).status == 200
        assert srv.status("/ready") == 200

    @pytest.mark.parametrize("version", ["0.5.10", "0.4.6"])
    def test_old_versions_sigkill_themselves_after_draining(self, start, node, version):
        srv = start([], env={"SGLANG_SIM_VERSION": version})
        srv.wait_healthy()
        srv.signal(signal.SIGTERM)
        assert srv.wait(20) == -signal.SIGKILL
        assert "kill_process_tree called" not in srv.log()  # that log line is 0.5.23's
        wait_for(lambda: node.compute_apps() == [], 10, what="memory released after the SIGKILL")

    def test_scheduler_crash_tears_down_the_tree(self, start):
        srv = start(["--tp-size", "2"])
        srv.wait_healthy()
        kids = srv.tree()
        sched = [p for p in kids if cmdline(p)[0] == "sglang::scheduler_TP1"][0]
        os.kill(sched, signal.SIGKILL)
        assert srv.wait(10) == -signal.SIGKILL
        log = srv.log()
        assert "Subprocess scheduler_1 (pid=%d) crashed with exit code -9. Triggering SIGQUIT " \
               "for cleanup..." % sched in log
        assert "SIGQUIT received. signum=None, frame=None. It usually means one child failed." in log
        wait_for(lambda: not any(alive(p) for p in kids), 10, what="tree gone")

    def test_old_version_without_watchdog_keeps_running_unhealthy(self, start):
        srv = start([], env={"SGLANG_SIM_VERSION": "0.5.1", "SGLANG_HEALTH_CHECK_TIMEOUT": "0.3"})
        srv.wait_healthy(path="/health_generate")
        sched = [p for p in srv.tree() if cmdline(p)[0] == "sglang::scheduler"][0]
        os.kill(sched, signal.SIGKILL)
        wait_for(lambda: srv.status("/health_generate") == 503, 10, what="health fails")
        assert srv.poll() is None
        assert "Health check failed. Server couldn't get a response from detokenizer" in srv.log()


class TestHttpApi:
    def test_api_key_and_exemptions(self, start):
        srv = start(["--enable-metrics"], api_key="sk-test")
        srv.wait_healthy()
        for path in ("/generate", "/server_info", "/model_info", "/v1/models", "/get_server_info",
                     "/v1/loads", "/no/such/path"):
            method = "POST" if path == "/generate" else "GET"
            body = {"text": "a"} if method == "POST" else None
            r = srv.request(path, method, body, key=None)
            assert r.status == 401 and r.json() == {"error": "Unauthorized"}, path
            assert srv.request(path, method, body, key="wrong").status == 401
        assert srv.request("/server_info").status == 200
        assert srv.request("/generate", "POST", {"text": "a", "sampling_params":
                                                 {"max_new_tokens": 2}}).status == 200
        for path in ("/health", "/health_generate", "/ready", "/metrics"):
            assert srv.request(path, key=None).status == 200, path
        assert srv.request("/health_anything", key=None).status == 404
        assert srv.request("/generate", "OPTIONS", key=None).status != 401

    def test_api_key_exemptions_in_051(self, start):
        srv = start([], api_key="k", env={"SGLANG_SIM_VERSION": "0.5.1"})
        srv.wait_healthy()
        assert srv.request("/health", key=None).status == 200
        assert srv.request("/ready", key=None).status == 401  # not exempt (and not a route)
        assert srv.request("/ready").status == 404

    def test_server_info_reports_effective_values_and_secrets(self, start):
        srv = start(INCIDENT + ["--served-model-name", "qwen"], api_key="sk-secret")
        srv.wait_healthy()
        log = srv.log()
        assert re.search(TS + re.escape(TOPK1_LINE) + "$", log, re.M)
        assert re.search(TS + re.escape(MAXRUN_LINE) + "$", log, re.M)
        line = [l for l in log.splitlines() if "server_args={" in l][0]
        assert "'api_key': 'sk-secret'" in line and "'speculative_num_draft_tokens': 2" in line
        info = srv.request("/server_info").json()
        assert (info["speculative_algorithm"], info["speculative_num_steps"],
                info["speculative_eagle_topk"], info["speculative_num_draft_tokens"]) == ("EAGLE", 1, 1, 2)
        assert info["max_running_requests"] == 48 and info["api_key"] == "sk-secret"
        assert info["launch_command"].startswith("--model-path ")
        assert "--speculative-num-draft-tokens 16" in info["launch_command"]
        assert info["version"] == "0.5.23" and info["status"] == "ready"
        assert info["served_model_name"] == "qwen" and info["tp_size"] == 1
        assert info["port"] == srv.port and info["host"] == "127.0.0.1"
        assert "watchdog_timeout" in info and "enable_metrics" in info  # every parsed field
        assert isinstance(info["internal_states"], list) and len(info["internal_states"]) == 1
        mi = srv.request("/model_info").json()
        assert mi["architectures"] == ["Qwen2ForCausalLM"] and mi["is_generation"] is True
        assert mi["served_model_name"] == "qwen"
        models = srv.request("/v1/models").json()
        assert models["object"] == "list" and models["data"][0]["id"] == "qwen"
        assert srv.request("/v1/models/qwen").status == 200
        assert srv.request("/v1/models/other").status == 404

    def test_generate_meta_info_and_internal_state(self, start):
        srv = start(FIXED)
        srv.wait_healthy()
        r = srv.request("/generate", "POST", {"text": "Hello there", "sampling_params":
                                              {"max_new_tokens": 40}, "rid": "req-1"})
        meta = r.json()["meta_info"]
        assert r.json()["text"] and len(r.json()["output_ids"]) == 40
        assert meta["id"] == "req-1" and meta["finish_reason"] == {"type": "length", "length": 40}
        assert meta["completion_tokens"] == 40 and meta["prompt_tokens"] >= 1
        for key in ("cached_tokens", "e2e_latency", "spec_verify_ct", "spec_accept_length",
                    "spec_accept_rate", "spec_num_correct_drafts", "spec_num_proposed_drafts"):
            assert key in meta, key
        assert meta["spec_accept_length"] == pytest.approx(40 / meta["spec_verify_ct"])
        assert meta["spec_num_proposed_drafts"] == meta["spec_verify_ct"] * 15
        assert meta["spec_num_correct_drafts"] == 40 - meta["spec_verify_ct"]
        again = srv.request("/generate", "POST", {"text": "Hello there",
                                                  "sampling_params": {"max_new_tokens": 1}})
        assert again.json()["meta_info"]["cached_tokens"] > 0
        states = srv.request("/server_info").json()["internal_states"]
        assert states[0]["avg_spec_accept_length"] > 1.0
        ids = srv.request("/generate", "POST", {"input_ids": [1, 2, 3]}).json()
        assert ids["meta_info"]["prompt_tokens"] == 3 and ids["meta_info"]["completion_tokens"] == 128
        assert srv.request("/generate", "POST", {"sampling_params": {}}).status == 400

    def test_incident_versus_fixed_accept_length_and_throughput(self, start):
        results = {}
        for name, args in (("incident", INCIDENT), ("fixed", FIXED)):
            srv = start(args, name=name, env={"SGLANG_SIM_TIME_SCALE": "0.01"})
            srv.wait_healthy()
            metas = []

            def one(i):
                metas.append(srv.request("/generate", "POST", {
                    "text": "prompt %d" % i, "sampling_params": {"max_new_tokens": 256}}).json()["meta_info"])

            threads = [threading.Thread(target=one, args=(i,)) for i in range(12)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            info = srv.request("/server_info").json()
            results[name] = {
                "accept": sum(m["spec_accept_length"] for m in metas) / len(metas),
                "tps": sum(m["completion_tokens"] for m in metas) / sum(m["e2e_latency"] for m in metas),
                "avg": info["internal_states"][0]["avg_spec_accept_length"],
            }
            srv.signal(signal.SIGTERM)
            srv.wait(20)
        assert results["incident"]["accept"] == pytest.approx(1.66, abs=0.06)
        assert results["fixed"]["accept"] == pytest.approx(2.95, abs=0.15)
        assert results["incident"]["avg"] == pytest.approx(1.66, abs=0.06)
        assert results["fixed"]["avg"] == pytest.approx(2.95, abs=0.15)
        assert results["incident"]["tps"] == pytest.approx(56.8, abs=3.0)
        assert results["fixed"]["tps"] > 90.0

    def test_metrics_loads_and_concurrency(self, start):
        srv = start(INCIDENT + ["--enable-metrics", "--served-model-name", "m1"],
                    env={"SGLANG_SIM_TIME_SCALE": "0.2"})
        srv.wait_healthy()
        done = []

        def long_request():
            # ~600 verify steps of 29 ms at time scale 0.2: ~3.5 s of wall time
            done.append(srv.request("/generate", "POST", {"text": "x", "sampling_params":
                                                          {"max_new_tokens": 1000}}).status)

        threads = [threading.Thread(target=long_request) for _thread in range(2)]
        for t in threads:
            t.start()

        def two_running():
            load = srv.request("/v1/loads").json()["loads"][0]
            return load if load["num_running_reqs"] == 2 else None

        loads = wait_for(two_running, 5, what="two running requests")
        assert loads["num_waiting_reqs"] == 0 and loads["dp_rank"] == 0
        text = srv.request("/metrics").body.decode()
        assert re.search(r'^sglang:num_running_reqs\{[^}]*model_name="m1"[^}]*\} 2\.0$', text, re.M)
        for t in threads:
            t.join(30)
        assert done == [200, 200]
        text = srv.request("/metrics").body.decode()
        for name in ("sglang:spec_accept_length", "sglang:spec_accept_rate", "sglang:num_running_reqs",
                     "sglang:num_queue_reqs", "sglang:gen_throughput", "sglang:spec_num_draft_tokens"):
            assert re.search(r'^%s\{[^}]*model_name="m1"[^}]*\} [0-9.]+$' % re.escape(name), text, re.M), name
        acc = float(re.search(r'^sglang:spec_accept_length\{[^}]*\} ([0-9.]+)$', text, re.M).group(1))
        assert 1.3 < acc < 2.0
        assert re.search(r'^sglang:spec_num_draft_tokens\{[^}]*\} 2\.0$', text, re.M)
        loads = srv.request("/v1/loads").json()
        assert loads["version"] == "0.5.23" and loads["loads"][0]["num_running_reqs"] == 0
        assert "speculative" in loads["loads"][0]

    def test_metrics_absent_without_flag(self, start):
        srv = start([])
        srv.wait_healthy()
        assert srv.status("/metrics") == 404

    @pytest.mark.parametrize("version", ["0.5.1", "0.4.6"])
    def test_old_versions_only_have_get_server_info(self, start, version):
        srv = start([], env={"SGLANG_SIM_VERSION": version})
        srv.wait_healthy()
        assert srv.status("/server_info") == 404 and srv.status("/model_info") == 404
        assert srv.status("/v1/loads") == 404 and srv.status("/ready") == 404
        info = srv.request("/get_server_info").json()
        assert info["version"] == {"0.5.1": "0.5.1", "0.4.6": "0.4.6.post5"}[version]
        assert "launch_command" not in info
        assert srv.request("/get_model_info").json()["model_path"].endswith("qwen")
        assert "deprecated" not in srv.log()
        assert "server_args=ServerArgs(model_path=" in srv.log()

    def test_get_server_info_is_deprecated_from_0510(self, start):
        srv = start([])
        srv.wait_healthy()
        assert srv.request("/get_server_info").json()["version"] == "0.5.23"
        assert "Endpoint '/get_server_info' is deprecated and will be removed in a future version. " \
               "Please use '/server_info' instead." in srv.log()

    def test_health_semantics_0446(self, start):
        srv = start([], env={"SGLANG_SIM_VERSION": "0.4.6", "SGLANG_SIM_HANG": "warmup"})
        wait_for(lambda: srv.status("/health") == 200, 10, what="0.4.6 /health is liveness only")

    def test_streaming_generate(self, start):
        srv = start([])
        srv.wait_healthy()
        r = srv.request("/generate", "POST", {"text": "hi", "stream": True,
                                              "sampling_params": {"max_new_tokens": 5}})
        assert r.status == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [l[len("data: "):] for l in r.body.decode().splitlines() if l.startswith("data: ")]
        assert events[-1] == "[DONE]" and len(events) >= 3
        last = json.loads(events[-2])
        assert last["meta_info"]["completion_tokens"] == 5 and len(last["output_ids"]) == 5

    def test_openai_endpoints(self, start):
        srv = start(["--served-model-name", "qwen"])
        srv.wait_healthy()
        r = srv.request("/v1/chat/completions", "POST", {"model": "qwen", "max_tokens": 5,
                                                         "messages": [{"role": "user", "content": "hi"}]})
        assert r.status == 200 and r.json()["usage"]["completion_tokens"] == 5
        r = srv.request("/v1/completions", "POST", {"model": "qwen", "prompt": "hi", "max_tokens": 3})
        assert r.json()["choices"][0]["finish_reason"] == "length"


class TestFaultKnobs:
    def test_crash_on_load(self, start, node):
        srv, rc = run_to_exit(start, ["--tp-size", "2"], env={"SGLANG_SIM_CRASH_ON_LOAD": "1"})
        assert rc not in (0, None)
        log = srv.log()
        assert "Scheduler hit an exception: Traceback (most recent call last):" in log
        assert "RuntimeError: Error(s) in loading state_dict" in log
        wait_for(lambda: node.compute_apps() == [], 10, what="memory released")

    @pytest.mark.parametrize("damage", ["missing", "truncated", "draft-truncated"])
    def test_a_missing_or_truncated_shard_fails_the_load_naming_it(self, start, node, tmp_path, damage):
        """What the preflight's checkpoint check prevents: the server fails while loading, after the teardown."""
        ckpt = tmp_path / "models" / "sharded"
        write_checkpoint(ckpt, config={"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}, shards=3)
        shard = ckpt / "model-00002-of-00003.safetensors"
        args = ["--model-path", str(ckpt), "--tp-size", "2"]
        if damage == "draft-truncated":
            draft = tmp_path / "models" / "draft"
            write_checkpoint(draft, config={"architectures": ["LlamaForCausalLMEagle3"]}, shards=3)
            shard = draft / "model-00002-of-00003.safetensors"
            args += ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(draft),
                     "--speculative-num-steps", "1", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "2"]
        if damage == "missing":
            shard.unlink()
        else:
            data = shard.read_bytes()
            shard.write_bytes(data[:len(data) // 2])
        srv, rc = run_to_exit(start, args, with_model=False)
        assert rc not in (0, None)
        log = srv.log()
        assert "Scheduler hit an exception: Traceback (most recent call last):" in log
        line = [text for text in log.splitlines() if text.startswith("RuntimeError: Failed to load the checkpoint")]
        assert line and str(shard) in line[0], log[-2000:]
        assert ("No such file or directory" if damage == "missing" else "MetadataIncompleteBuffer") in line[0]
        wait_for(lambda: node.compute_apps() == [], 10, what="memory released")

    def test_a_complete_sharded_checkpoint_loads(self, start, tmp_path):
        ckpt = tmp_path / "models" / "sharded"
        write_checkpoint(ckpt, config={"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}, shards=3)
        srv = start(["--model-path", str(ckpt)], with_model=False)
        srv.wait_healthy()

    def test_hang_on_load_never_listens(self, start):
        srv = start([], env={"SGLANG_SIM_HANG": "load"})
        wait_for(lambda: "Load weight begin" in srv.log(), 10, what="loading")
        time.sleep(0.8)
        assert srv.status("/health") is None  # nothing listens while loading
        assert srv.poll() is None

    def test_hang_in_warmup_stays_unhealthy(self, start):
        srv = start([], env={"SGLANG_SIM_HANG": "warmup"})
        wait_for(lambda: srv.status("/health", key=None) == 503, 10, what="HTTP up, 503")
        time.sleep(0.5)
        assert srv.status("/health") == 503 and srv.status("/health_generate") == 503
        assert "fired up" not in srv.log()

    def test_port_in_use(self, start, node):
        port = free_port()
        blocker = socket.socket()
        blocker.bind(("127.0.0.1", port))
        blocker.listen(1)
        try:
            srv, rc = run_to_exit(start, [], port=port)
        finally:
            blocker.close()
        # 0.5.23 (measured): the bind fails after the whole startup; the warmup reaches whatever holds the port
        # (here a socket that never answers: "Initialization failed"); uvicorn's startup failure is status 3.
        assert rc == 3
        assert "[Errno 98] error while attempting to bind on address ('127.0.0.1', %d): " \
               "address already in use" % port in srv.log()
        # The killed schedulers' memory comes back after the driver's release delay;
        # a second server started before that would run out of memory instead.
        wait_for(lambda: node.compute_apps() == [] and set(node.used().values()) == {1}, 10, what="GPUs free")
        srv, rc = run_to_exit(start, [], env={"SGLANG_SIM_PORT_IN_USE": "1"})
        assert rc == 3 and "address already in use" in srv.log(), srv.log()[-3000:]

    def test_health_flaps(self, start):
        srv = start([], env={"SGLANG_SIM_HEALTH_FLAP": "2"})
        srv.wait_healthy(ready_line=True, path="/ready")
        codes = [srv.status("/health") for _probe in range(6)]
        assert 503 in codes and 200 in codes
        assert codes[0::2] != codes[1::2]

    def test_crash_after_ready_is_seen_by_the_watchdog(self, start):
        srv = start([], env={"SGLANG_SIM_CRASH_AFTER_S": "2"})
        srv.wait_healthy()
        assert srv.wait(15) == -signal.SIGKILL
        assert re.search(r"Subprocess scheduler_0 \(pid=\d+\) crashed with exit code -6", srv.log())

    def test_slow_scheduler_release_is_killed_after_the_timeout(self, start, node):
        srv = start([], env={"SGLANG_SIM_SHUTDOWN_S": "5", "SGLANG_SIM_SCHEDULER_EXIT_TIMEOUT_S": "0.5"})
        srv.wait_healthy()
        srv.signal(signal.SIGTERM)
        assert srv.wait(20) == 0
        assert re.search(r"Schedulers still alive 0s after ShutdownReq, killing them before they "
                         r"released: \[\d+\]", srv.log())


class TestConfigFileServer:
    def test_config_file_0523(self, start, tmp_path, model):
        cfg = tmp_path / "server.yaml"
        cfg.write_text("model-path: %s\nserved-model-name: from-config\nenable-metrics: true\n"
                       "mem-fraction-static: 0.7\n" % model)
        srv = start(["--config", str(cfg), "--served-model-name", "from-cli"], with_model=False)
        srv.wait_healthy()
        info = srv.request("/server_info").json()
        assert info["served_model_name"] == "from-cli" and info["enable_metrics"] is True
        assert info["mem_fraction_static"] == 0.7
        assert srv.status("/metrics") == 200

    def test_no_config_flag_in_051(self, start, tmp_path):
        cfg = tmp_path / "server.yaml"
        cfg.write_text("tp-size: 1\n")
        srv, rc = run_to_exit(start, ["--config", str(cfg)], env={"SGLANG_SIM_VERSION": "0.5.1"})
        assert rc == 2 and "unrecognized arguments: --config" in srv.log()


class TestMultiNode:
    def test_two_nodes_graceful(self, start, node):
        dist = "127.0.0.1:%d" % free_port()
        common = ["--tp-size", "2", "--nnodes", "2", "--dist-init-addr", dist]
        r0 = start(common + ["--node-rank", "0"], env={"CUDA_VISIBLE_DEVICES": "0"}, name="rank0")
        wait_for(lambda: "Waiting for 1 more node(s)" in r0.log(), 10, what="rank 0 waits")
        time.sleep(0.3)
        assert r0.status("/health") is None  # not serving before the other node joined
        r1 = start(common + ["--node-rank", "1"], env={"CUDA_VISIBLE_DEVICES": "1"}, name="rank1")
        r0.wait_healthy()
        wait_for(lambda: r1.status("/health") == 200, 10, what="rank 1 dummy health server")
        assert r1.status("/health_generate") == 200 and r1.status("/ping") == 200
        assert r1.status("/generate", method="POST", body={"text": "a"}) == 404
        kids1 = r1.tree()
        assert sglang_titles(kids1) == ["sglang::scheduler_TP1"]
        assert {a["pid"] for a in node.compute_apps()} == {
            p for p in r0.tree() + kids1 if cmdline(p)[0].startswith("sglang::scheduler")}
        r1.signal(signal.SIGTERM)
        wait_for(lambda: "SIGTERM received on node_rank 1; waiting for the rank-0 ShutdownReq "
                         "broadcast to stop the schedulers." in r1.log(), 5, what="rank-1 warning")
        time.sleep(0.3)
        assert r1.poll() is None
        r0.signal(signal.SIGTERM)
        assert r0.wait(20) == 0
        assert r1.wait(20) == 0
        assert node.compute_apps() == []

    def test_rank0_sigkill_leaves_other_ranks_holding_gpus(self, start, node):
        dist = "127.0.0.1:%d" % free_port()
        common = ["--tp-size", "2", "--nnodes", "2", "--dist-init-addr", dist]
        r0 = start(common + ["--node-rank", "0"], env={"CUDA_VISIBLE_DEVICES": "0"}, name="rank0")
        r1 = start(common + ["--node-rank", "1"], env={"CUDA_VISIBLE_DEVICES": "1"}, name="rank1")
        r0.wait_healthy()
        wait_for(lambda: r1.status("/health") == 200, 10, what="rank 1 up")
        r1_sched = [p for p in r1.tree() if not is_resource_tracker(cmdline(p))]
        r0.signal(signal.SIGKILL)
        r0.wait(10)
        wait_for(lambda: "lost without a ShutdownReq" in r1.log(), 5, what="rank 1 notices")
        # rank 0's scheduler memory goes after its release delay; rank 1 keeps its GPU
        wait_for(lambda: {a["pid"] for a in node.compute_apps()} == set(r1_sched), 10,
                 what="only rank 1's scheduler left on the GPUs")
        time.sleep(0.5)
        assert r1.poll() is None
        assert {a["pid"] for a in node.compute_apps()} == set(r1_sched)
