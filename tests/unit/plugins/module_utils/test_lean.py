"""Tests for module_utils/common/lean.py: the lean results a failed preflight and a replace return at verbosity 0
(the message first, every AWX job event small) and the details file the replace writes on the node."""
from __future__ import annotations

import json
import os
import stat
from types import SimpleNamespace

from ansible_collections.gpufleet.sglang.plugins.module_utils.common import lean

GPU = {"bus_id": "00000000:18:00.0", "free_mib": 13028, "index": 0, "lost": False, "lost_reason": None,
       "mig_mode": "Disabled", "name": "NVIDIA H200", "processes": [{"pid": 41, "used_mib": 130212, "name": "python3"}],
       "reserved_mib": 0, "total_mib": 143771, "used_mib": 130212, "uuid": "GPU-0"}


def _dump(result):
    """What the default callback prints after ``FAILED! => `` (keys sorted)."""
    return json.dumps(result, sort_keys=True)


def test_a_failed_preflight_keeps_what_the_roles_read_and_puts_the_message_first():
    msg = "Preflight failed on node1; the running server was not touched. sglang_server_args.tp_size: must be ..."
    full = {"changed": False, "msg": msg, "problems": ["sglang_server_args.tp_size: must be an integer >= 1, got -1"],
            "elapsed": 0.1, "lines": ["node1: start"] * 20, "node": {"all_gpus": [GPU] * 8, "gpus": [GPU]},
            "plan": {"argv": ["python3"] * 100, "spec": {"args": {"x": 1}}, "action": "restart",
                     "holders": [{"pid": 5, "class": "managed"}, {"pid": 6, "class": "foreign"}]},
            "resolved": {"source": "node", "fallback": None, "adjustments": [{"arg": "a"}] * 10},
            "lease": {"acquired": False, "generation": 0, "holder": {}, "path": "/run/lock/x.lock", "reason": "not held",
                      "state": "free", "waited": 0.0, "took_over": None}}
    lean_result = lean.preflight_failure(full)
    assert set(lean_result) == {"changed", "msg", "problems", "lease", "resolved", "plan"}
    assert lean_result["plan"] == {"action": "restart", "holders": [{"pid": 6, "class": "foreign"}]}
    assert lean_result["lease"] == {"acquired": False, "waited": 0.0}
    held = lean.preflight_failure(dict(full, lease={"acquired": False, "waited": 30.1, "holder": {"owner": "R0", "node_pid": 7}}))
    assert held["lease"] == {"acquired": False, "waited": 30.1, "holder": {"owner": "R0"}}
    assert lean_result["resolved"] == {"source": "node", "fallback": None}
    text = _dump(lean_result)
    assert text.index('"msg"') < 80 and len(text) < 1000, text
    assert _dump(full).index('"msg"') > 500           # the full result put it after the lease and the lines


def test_a_replace_result_leaves_out_the_bulk_and_names_the_details_file():
    signalled = [{"pid": 41, "signals": ["SIGTERM"], "cmdline": "python3 -m sglang.launch_server", "role": "root"},
                 {"pid": 42, "signals": [], "cmdline": "sglang::scheduler_TP0", "role": "descendant", "gpus": [0],
                  "root": 41, "how": "child", "seconds_to_exit": 0.4}]
    full = {"changed": True, "signalled": signalled,
            "drain": {"changed": True, "gpus": [GPU] * 2, "holders": [{"pid": 41}], "signalled": signalled, "elapsed": 1.0},
            "launch": {"pid": 7, "effective": {"k%d" % i: i for i in range(500)}, "effective_args": {"tp_size": 2},
                       "log_tail": ["line"] * 40, "startup_phases": [{"p": 1}], "overrides": []},
            "rollback_launch": {"pid": 8, "effective": {"a": 1}, "effective_args": {"tp_size": 2}},
            "gpus_free": [GPU] * 2, "gpus_allocated": [GPU] * 2, "weights": {"model_info": {"x": 1}, "changed": True}}
    out = lean.replace_result(full, "/s/details/r.json")
    assert out["details_file"] == "/s/details/r.json"
    assert out["launch"] == {"pid": 7, "effective_args": {"tp_size": 2}, "overrides": []}
    assert out["rollback_launch"] == {"pid": 8, "effective_args": {"tp_size": 2}}
    # The drain's signalled is the run's: kept once, at the top; a child that exited with its server without its
    # command line.
    assert out["drain"] == {"changed": True, "elapsed": 1.0}
    assert out["signalled"] == [signalled[0], {"pid": 42, "signals": [], "role": "descendant"}]
    assert out["gpus_free"] == [{"index": 0, "used_mib": 130212, "pids": [41]}] * 2
    assert out["weights"] == {"changed": True}
    assert len(_dump(out)) < len(_dump(full)) // 5
    # The full result is not changed.
    assert "effective" in full["launch"] and full["drain"]["gpus"]


def test_a_planned_drain_that_never_signalled_keeps_its_plan():
    planned = [{"pid": 41, "signals": []}]
    out = lean.replace_result({"signalled": [], "drain": {"signalled": planned, "gpus": []}})
    assert out["drain"] == {"signalled": planned} and "details_file" not in out


def test_invocation_below_vvv_replaces_long_values_and_secrets():
    module = SimpleNamespace(_verbosity=0, argument_spec={"api_key": {"no_log": True}, "launch": {}, "run_id": {}, "env": {}},
                             params={"api_key": "sk-secret", "launch": {"args": ["x" * 50] * 20}, "run_id": "R1",
                                     "env": {"HF_TOKEN": "hf_learnt"}}, no_log_values={"hf_learnt"})
    inv = lean.invocation(module)["module_args"]
    assert inv["api_key"] == "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER" and inv["run_id"] == "R1"
    assert "hf_learnt" not in json.dumps(inv) and "sk-secret" not in json.dumps(inv)
    assert inv["launch"].startswith("(") and inv["launch"].endswith(" bytes; -vvv shows it)")
    module._verbosity = 3
    assert lean.invocation(module) is None         # -vvv: AnsibleModule's own invocation


def test_invocation_below_vvv_lists_the_options_left_at_their_default_by_name():
    spec = {"directory_mode": {"default": "0750"}, "rollback": {"type": "bool", "default": True}, "gpus": {"type": "list"},
            "timeout": {"type": "float", "default": 120.0}, "force": {"type": "bool", "default": False}}
    module = SimpleNamespace(_verbosity=0, argument_spec=spec, no_log_values=set(),
                             params={"directory_mode": "0750", "rollback": True, "gpus": None, "timeout": 60.0, "force": 0})
    inv = lean.invocation(module)
    assert inv["module_args"] == {"timeout": 60.0, "force": 0}        # a changed value, and 0 is not the bool False
    assert inv["defaulted"] == 3                                       # directory_mode, gpus, rollback


def test_details_are_written_private_under_the_state_dir(tmp_path):
    path = lean.write_details(str(tmp_path), "R1/../x", "replace-candidate-all", {"launch": {"pid": 7}})
    assert path == str(tmp_path / "details" / "R1_.._x-replace-candidate-all.json")
    assert json.loads(open(path).read()) == {"launch": {"pid": 7}}
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert lean.write_details("", "R1", "x", {}) is None
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert lean.write_details(str(blocked), "R1", "x", {}) is None       # never fails the run


def test_only_the_newest_details_files_are_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(lean, "DETAILS_KEEP", 3)
    for i in range(5):
        path = lean.write_details(str(tmp_path), "R%d" % i, "replace-candidate-all", {"i": i})
        os.utime(path, (1000 + i, 1000 + i))
    assert sorted(p.name for p in (tmp_path / "details").iterdir()) == ["R%d-replace-candidate-all.json" % i for i in (2, 3, 4)]
