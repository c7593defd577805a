"""module_utils/common/names.py: what a message calls a module option (issue 23 point 4)."""
from __future__ import annotations

from ansible_collections.gpufleet.sglang.plugins.module_utils.common.names import ARGSPEC, PLAIN, Names
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import identity, survey
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import serving


class FakeModule(object):
    def __init__(self, params):
        self.params = params


def test_an_option_without_a_label_is_named_by_itself():
    assert PLAIN.of("args") == "args" and PLAIN.of("args", "tp_size") == "args.tp_size"
    names = Names({"args": "sglang_server_args", "env": ""})
    assert names.of("args", "tp_size") == "sglang_server_args.tp_size"
    assert names.of("env") == "env" and names.of("cache_dir") == "cache_dir"     # empty or missing: the option
    assert names.field_of("args")("port") == "sglang_server_args.port"
    # A field the caller sets as a variable of its own.
    assert Names({"lease": "my_lease", "lease.path": "sglang_lock_dir"}).of("lease", "path") == "sglang_lock_dir"
    assert Names({"lease": "my_lease", "lease.path": "sglang_lock_dir"}).of("lease", "ttl") == "my_lease.ttl"


def test_of_module_reads_the_option_labels_option():
    assert Names.of_module(FakeModule({"option_labels": {"force": "sglang_redeploy_force"}})).of("force") == "sglang_redeploy_force"
    assert Names.of_module(FakeModule({"option_labels": None})).of("force") == "force"
    assert Names.of_module(object()).of("force") == "force"                    # no params at all
    assert ARGSPEC == {"option_labels": {"type": "dict", "default": {}}}


def test_engines_name_the_option_or_the_label():
    assert serving.check_values({"tp_size": -1})[0].startswith("args.tp_size: must be an integer >= 1, got -1")
    labelled = serving.check_values({"tp_size": -1}, Names({"args": "sglang_server_args"}))
    assert labelled[0].startswith("sglang_server_args.tp_size: must be an integer >= 1, got -1")
    assert serving.check_layout({"tp_size": 1, "nnodes": 2, "node_rank": 2}, ["0"])[0].endswith("per host in host_args")
    assert identity.decide("a", {"fingerprint": "b"}, None, {}, force=True)["why"] == "force is set"
    assert identity.decide("a", {"fingerprint": "b"}, None, {}, force=True,
                           names=Names({"force": "sglang_redeploy_force"}))["why"] == "sglang_redeploy_force is set"
    assert survey.compile_patterns(["("])[1][0].startswith("adopt_patterns: '(' is not a valid regular expression")
    assert survey.compile_patterns(["("], Names({"adopt_patterns": "sglang_adopt_patterns"}))[1][0].startswith(
        "sglang_adopt_patterns: '('")
