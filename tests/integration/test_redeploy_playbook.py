"""The playbooks (``redeploy.yml``, ``status.yml``, ``verify.yml``,
``teardown.yml``) end to end, through ``ansible_runner``, against one
simulated 8 x H200 node on localhost (``playbook_helpers.SimNode``: its own
``GPUSIM_ROOT``, the fake SGLang server, ``sglang_server_manager: process``).

Assertions read runner events (task names, ``runner_on_ok`` /
``runner_on_failed``, ``event_data.res``), the play stats, the JSON/Markdown
run report and the node itself (``/server_info``, ``/health``, PIDs, GPU
memory), never printed text.

The tests share one node and run in file order, like an operator's day:
the incident server is replaced, a second run is a no-op, a check-mode run
plans, bad configs fail at preflight, a crashing candidate is rolled back,
two runs meet on the lock, the read-only playbooks look at the node, the
node is torn down, stuck GPU memory defeats both the redeploy and the
rollback. One more test uses a fresh node that was never deployed (the
rollback is unavailable). ``ensure_deployed`` brings the node back to the known-good config
when a test runs alone or after a failure. An unrelated Python process (the
decoy) must survive every test, and the API key marker must appear in no
event, artifact, report or server command line.
"""
from __future__ import annotations

import re
import json
import os
import pathlib

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils.server import prefetch as pf
from checkpoint_files import SMALL_LAYOUT, write_checkpoint
from playbook_helpers import (FAST_SERVER_ENV, HOST, REPORT_KEYS, RESOLVED_SPEC, SimNode, alive, cmdline,  # noqa: F401  # pylint: disable=unused-import
                              decoy_survives_fixture, environ_of, http_get, module_procs, node_with_decoy, session_members,
                              wait_for)

pytestmark = pytest.mark.slow

TARGET_GPUS = [0, 1]          # tp_size 2: the first two GPUs
OTHER_GPUS = (2, 3, 4, 5, 6, 7)
IDLE_MIB = 1                  # gpusim's idle used memory


# --------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def node(tmp_path_factory, procs):
    return node_with_decoy(tmp_path_factory.mktemp("redeploy-node"), procs)


def good_server_running(node, exact=True):
    """The managed server runs the resolved incident config, without a fault knob, and (``exact``) with the
    environment of ``node.host_vars()``, so that a run with the default host vars has nothing to do."""
    pid = node.server_pid()
    if not pid or not alive(pid) or node.health() != 200:
        return None
    status, info = http_get(node.url + "/server_info", api_key=node.api_key)
    if status != 200 or any(info.get(k) != v for k, v in RESOLVED_SPEC.items()):
        return None
    env = environ_of(pid).split("\0")
    if any(e.startswith(("SGLANG_SIM_CRASH", "SGLANG_SIM_HANG")) for e in env):
        return None
    if exact and any("%s=%s" % kv not in env for kv in FAST_SERVER_ENV.items()):
        return None
    return pid


def ensure_deployed(node, exact=False):
    """The PID of a healthy managed server with the good config; redeploys it (forced) when needed."""
    pid = good_server_running(node, exact)
    if pid:
        return pid
    run = node.run(extravars={"sglang_redeploy_force": True})
    assert run.rc == 0, run.summary()
    pid = good_server_running(node)
    assert pid, "the forced redeploy left no healthy server with the good config"
    return pid


def holds_by_pid(node):
    return sorted((h.get("pid"), tuple(h.get("gpus", [])), h.get("mib")) for h in node.holds())


def assert_gpus(node, busy, idle=OTHER_GPUS):
    used = node.used()
    for g in busy:
        assert used[g] > 100000, "GPU %d should hold the server: %s" % (g, used)
    for g in idle:
        assert used[g] == IDLE_MIB, "GPU %d should be idle: %s" % (g, used)


def assert_row_shape(row):
    missing = [k for k in REPORT_KEYS if k not in row]
    assert not missing, "report keys missing: %s in %s" % (missing, sorted(row))
    assert set(row["smoke"]) >= {"tokens_per_s", "accept_length"}
    assert set(row["rollback"]) >= {"status", "detail"}


PREFLIGHT = "Plan the redeploy (inspect the node, resolve the args as its SGLang will, take the lease)"
REPLACE = "Replace the server in one module run, candidate all"
ROLLBACK = "Replace the server in one module run, known_good all"
TEARDOWN = "Replace the server in one module run, candidate teardown"
SMOKE = "Run the smoke benchmark"
PROMOTE = "Promote the verified config to known-good and release the lease (the smoke gate first, when given)"


def adjustment_lines(run):
    """The plan's lines (the plan, the lease, every adjustment, every GPU holder) as the play showed them."""
    return run.task_result("Show the plan")["msg"]


# --------------------------------------------------------------------------
# Scenarios
# --------------------------------------------------------------------------

def test_happy_path_replaces_the_incident_server(node):
    """The incident server (started by hand: EAGLE3, topk 1, steps 1, 16 draft tokens, which SGLang runs
    with 2) is replaced by the honor_draft_tokens resolution (steps 15, 16 draft tokens)."""
    old_pid = node.start_server_by_hand(node.server_args(), log_name="incident.log")
    old_tree = session_members(old_pid)
    assert node.server_info()["speculative_num_draft_tokens"] == 2      # the incident, as SGLang runs it

    run = node.run()
    assert run.rc == 0 and run.status == "successful", run.summary()
    stats = run.host_stats()
    assert stats["failures"] == 0 and stats["changed"] > 0, stats
    # meta/runtime.yml's requires_ansible covers the core that ran it (the controller matrix legs also fail on
    # any warning or deprecation: tests/matrix/matrix_controller.py).
    assert "does not support Ansible version" not in run.everything()

    # Preflight showed the policy choice, and SGLang's own warning for the rest.
    lines = adjustment_lines(run)
    assert any(line.startswith("speculative_num_steps: 1 -> 15 [policy.honor_draft_tokens") for line in lines), lines
    pre = run.task_result(PREFLIGHT)
    assert {k: pre["resolved"]["args"][k] for k in RESOLVED_SPEC} == RESOLVED_SPEC
    assert pre["plan"]["action"] == "restart" and pre["plan"]["running"]["source"].startswith("adopted"), pre["plan"]

    # The plan was made once, under the lease it took (acquisition 1); the first deploy creates every directory.
    assert len(run.task_results(PREFLIGHT)) == 1
    assert pre["lease"]["acquired"] is True and pre["lease"]["generation"] == 1 and pre["lease"]["took_over"] is None
    assert not any(d["ok"] for d in pre["node"]["directories"]), pre["node"]["directories"]
    replaced = run.task_result(REPLACE)
    # The server's 5 directories, then the compile caches' (the cache directory and one per cache, docs/reference/compile-caches.md).
    assert replaced["directories"][5:] == pre["plan"]["cache"]["dirs"] and len(replaced["directories"]) == 14, replaced["directories"]

    # The drain signalled the incident server (adopted: it was not recorded anywhere) and nothing else (its list is
    # the result's signalled, at verbosity 0 not twice).
    drain = replaced["drain"]
    assert drain["changed"] is True and "signalled" not in drain
    signalled = replaced["signalled"]
    roots = [p for p in signalled if p["role"] == "root"]
    assert [p["pid"] for p in roots] == [old_pid] and roots[0]["signals"][0] == "SIGTERM", signalled
    assert sorted(p["pid"] for p in signalled) == sorted(old_tree), (signalled, old_tree)
    assert node.decoy not in [p["pid"] for p in signalled]
    assert not any(alive(p) for p in old_tree)
    assert [s["step"] for s in replaced["steps"]] == ["teardown", "torn_down", "launching", "launched"], replaced["steps"]

    # The launch verified the effective config against the prediction, in the same module run.
    launch = replaced["launch"]
    assert replaced["changed"] is True and launch["overrides"] == [], launch
    assert {k: launch["effective_args"][k] for k in RESOLVED_SPEC} == RESOLVED_SPEC
    new_pid = node.server_pid()
    assert launch["pid"] == new_pid and new_pid != old_pid and alive(new_pid)

    # The server itself says so.
    info = node.server_info()
    assert {k: info[k] for k in RESOLVED_SPEC} == RESOLVED_SPEC
    assert info["speculative_algorithm"] == "EAGLE3" and info["tp_size"] == 2
    assert http_get(node.url + "/server_info")[0] == 401        # the API key is in force ...
    for pid in node.server_tree(new_pid):                       # ... and on no command line
        assert node.api_key not in "\0".join(cmdline(pid))
    assert "--config" in cmdline(new_pid)
    assert_gpus(node, TARGET_GPUS)

    # The smoke gate ran in the promote module run (a single-node server), before anything was promoted.
    assert not run.ran(SMOKE)
    smoke = run.task_result(PROMOTE)["smoke"]
    assert smoke["accept_length"] >= 2.0 and smoke["tokens_per_s"] > 0, smoke
    assert smoke["requests"]["failed"] == 0 and smoke["hang"] is None, smoke

    # The report: documented keys, status deployed, masked args.
    row = run.row()
    assert_row_shape(row)
    assert row["status"] == "deployed" and row["step"] == "done" and row["error"] is None, row
    assert row["plan"] == "restart"         # the hand-started server on the managed port was adopted
    assert row["node_state"] == "promoted config running" and row["mode"] == "restart", row
    assert row["resolution"] == {"source": "node", "fallback": None}, row["resolution"]
    assert row["run_id"] and run.report_paths[0].name == "%s-redeploy.json" % row["run_id"]
    assert {k: row["effective_args"][k] for k in RESOLVED_SPEC} == RESOLVED_SPEC
    assert "api_key" not in row["effective_args"] or row["effective_args"]["api_key"] == "********"
    assert any(a["arg"] == "speculative_num_steps" and a["from"] == 1 and a["to"] == 15
               and a["rule"] == "policy.honor_draft_tokens" for a in row["adjustments"]), row["adjustments"]
    assert old_pid in [p["pid"] for p in row["signalled"]]
    assert [g["index"] for g in row["gpus_before"]] == TARGET_GPUS
    assert [g["index"] for g in row["gpus_after"]] == TARGET_GPUS
    assert all(g["used_mib"] > 100000 for g in row["gpus_after"])
    assert row["startup_s"] > 0 and row["smoke"]["accept_length"] == smoke["accept_length"]
    assert row["rollback"] == {"status": "not_needed", "detail": None}
    assert "| %s | deployed | done | EAGLE3 / 15 / 1 / 16 |" % HOST in run.report_md, run.report_md

    # The launch wrote the candidate record itself, 0640 (its secrets apart, 0600); promote kept both as known-good.
    assert launch["record_file"] == str(node.etc / "candidate" / "server.json")
    assert os.stat(launch["record_file"]).st_mode & 0o777 == 0o640
    assert os.stat(node.etc / "known-good" / "secrets.json").st_mode & 0o777 == 0o600
    assert json.loads(pathlib.Path(launch["record_file"]).read_text())["adjustments"] == row["adjustments"]
    assert run.task_result(PROMOTE)["promoted"] is True and not node.lock_path.exists()
    assert node.journal()["step"] == "promoted"

    # Three module runs on the node for the whole redeploy (preflight, replace, smoke gate + promote), and under 40
    # tasks (21 here: 14 executed, 7 skipped).
    module_tasks = [t for t in (PREFLIGHT, REPLACE, SMOKE, PROMOTE) if run.ran(t)]
    assert module_tasks == [PREFLIGHT, REPLACE, PROMOTE]
    stats = run.host_stats()
    assert stats["ok"] + stats["skipped"] <= 40, stats
    journal = node.journal()
    assert [h["step"] for h in journal["history"]][-2:] == ["verified", "promoted"], journal["history"]
    assert journal["smoke"]["accept_length"] == smoke["accept_length"], journal

    # The verified config is the node's known-good now.
    known_good = json.loads((node.etc / "known-good" / "server.json").read_text())
    assert {k: known_good["args"][k] for k in RESOLVED_SPEC} == RESOLVED_SPEC


def test_second_run_is_a_no_op(node):
    pid = ensure_deployed(node, exact=True)
    holds = holds_by_pid(node)
    run = node.run()
    assert run.rc == 0, run.summary()
    assert run.host_stats()["changed"] == 0, [e["event_data"]["task"] for e in run.results(("runner_on_ok",))
                                              if e["event_data"]["res"].get("changed")]
    row = run.row()
    assert row["status"] == "unchanged" and row["plan"] == "none" and row["error"] is None, row
    assert row["signalled"] == [] and row["rollback"]["status"] == "not_needed"
    assert row["node_state"] == "promoted config running (nothing to do)" and row["mode"] is None, row
    pre = run.task_result(PREFLIGHT)
    assert pre["lease"]["acquired"] is False and not run.ran(REPLACE) and not run.ran(SMOKE)
    assert node.server_pid() == pid and alive(pid) and node.health() == 200
    assert holds_by_pid(node) == holds


def test_check_mode_changes_nothing(node):
    pid = ensure_deployed(node)
    holds = holds_by_pid(node)
    watched = {d: node.files_under(d) for d in (node.etc, node.state, node.lock_dir)}
    # A real change (16 -> 8 draft tokens, which honor_draft_tokens runs with 7 steps), planned only.
    hv = node.host_vars(sglang_server_args=node.server_args(speculative_num_draft_tokens=8))
    run = node.run(host_vars=hv, check=True)
    assert run.rc == 0, run.summary()

    # What would be signalled: the managed server's tree, found from its PID file and its GPUs.
    pre = run.task_result(PREFLIGHT)
    assert pid in pre["plan"]["teardown_pids"], pre["plan"]
    assert set(node.server_tree(pid)) - {pid} <= {h["pid"] for h in pre["plan"]["holders"] if h["class"] == "managed"} | \
        set(node.server_tree(pid)), pre["plan"]["holders"]
    assert node.decoy not in pre["plan"]["teardown_pids"]
    # The effective args that would run.
    effective = pre["resolved"]["args"]
    assert (effective["speculative_num_steps"], effective["speculative_num_draft_tokens"]) == (7, 8)
    argv = pre["plan"]["argv"]
    assert pre["plan"]["action"] == "restart"
    assert argv[argv.index("--speculative-num-steps") + 1] == "7" and argv[argv.index("--speculative-num-draft-tokens") + 1] == "8"
    assert pre["lease"]["acquired"] is False and not run.ran(REPLACE)
    assert any(d["field"] == "args.speculative_num_steps" for d in pre["plan"]["differences"]), pre["plan"]["differences"]

    # Nothing changed on the node.
    assert {d: node.files_under(d) for d in watched} == watched
    assert node.server_pid() == pid and alive(pid) and node.health() == 200
    assert holds_by_pid(node) == holds
    assert node.server_info()["speculative_num_draft_tokens"] == 16

    row = run.row()
    assert row["status"] == "planned" and row["plan"] == "restart", row
    assert (row["effective_args"]["speculative_num_steps"], row["effective_args"]["speculative_num_draft_tokens"]) == (7, 8)
    assert row["effective_source"] == "prediction"
    assert pid in row["planned_teardown"]


BAD_CONFIGS = {
    # topk 1 and a draft-token count without steps: strict refuses what SGLang would silently change.
    "bad-strict": {"vars": {"sglang_server_spec_policy": "strict"}, "args": {"speculative_num_steps": None},
                   "expect": "speculative_num_steps: not set while speculative_eagle_topk and speculative_num_draft_tokens are set"},
    # trtllm_mha supports only topk 1.
    "bad-trtllm": {"vars": {}, "args": {"attention_backend": "trtllm_mha", "speculative_eagle_topk": 4, "speculative_num_steps": 3,
                                        "speculative_num_draft_tokens": 8},
                   "expect": "trtllm_mha backend only supports topk = 1"},
    # Values SGLang's resolution accepts and the server cannot serve (issue 25): refused with the field, not deployed.
    "tp-negative": {"vars": {"sglang_server_host_args": {"tp_size": -1}}, "args": {},
                    "expect": "sglang_server_args.tp_size: must be an integer >= 1, got -1"},
    "mem-fraction": {"vars": {}, "args": {"mem_fraction_static": 1.5},
                     "expect": "sglang_server_args.mem_fraction_static: must be a fraction between 0 and 1 (exclusive), got 1.5"},
    # The model is not on the node.
    "bad-model": {"vars": {}, "args": {"model_path": "/nonexistent/kimi-k2.5"},
                  "expect": "sglang_server_args.model_path: /nonexistent/kimi-k2.5 does not exist"},
}


def test_bad_configs_fail_at_preflight_and_the_server_keeps_serving(node):
    """The bad configs, as inventory hosts on the same node in one run (one batch)."""
    pid = ensure_deployed(node)
    tree = node.server_tree(pid)
    holds = holds_by_pid(node)
    used = node.used()
    hosts = {}
    for name, bad in BAD_CONFIGS.items():
        hosts[name] = node.host_vars(sglang_server_args=node.server_args(**bad["args"]), **bad["vars"])
    run = node.run(hosts=hosts, extravars={"sglang_serial": len(hosts)})
    assert run.rc != 0

    for name, bad in BAD_CONFIGS.items():
        expected = bad["expect"]
        stats = run.host_stats(name)
        assert stats["failures"] == 1 and stats["changed"] == 0, (name, stats)
        failed = run.task_result(PREFLIGHT, host=name)
        assert failed["failed"] is True and failed["lease"]["acquired"] is False
        assert "the running server was not touched" in failed["msg"] and expected in failed["msg"], (name, failed["msg"])
        for task in (REPLACE, SMOKE, PROMOTE):
            assert not run.ran(task, host=name), (name, task)
        row = run.row(name)
        assert_row_shape(row)
        assert row["status"] == "failed" and row["step"] == "preflight", row
        assert row["error"].startswith("preflight failed: Preflight failed on %s" % name) and expected in row["error"], row
        assert row["signalled"] == [] and row["rollback"] == {"status": "not_needed", "detail": None}
    assert len(run.report) == len(BAD_CONFIGS)

    # The old server is the same process tree, still serving, and its GPUs are untouched.
    assert node.server_pid() == pid and all(alive(p) for p in tree) and node.server_tree(pid) == tree
    assert node.health() == 200
    assert holds_by_pid(node) == holds and node.used() == used


def test_a_truncated_shard_is_refused_at_preflight_and_the_server_keeps_serving(node):
    """A checkpoint with a shard cut to half (an interrupted copy): the preflight reads the shard headers against the
    file sizes and refuses, naming the shard, before anything is touched. The fake server would only fail on it
    while loading (tests/unit/simulator/test_sglang_server.py), i.e. after the old server's teardown."""
    pid = ensure_deployed(node)
    tree = node.server_tree(pid)
    holds = holds_by_pid(node)
    used = node.used()
    broken = node.models / "kimi-k2.5-truncated"
    write_checkpoint(broken, config=(node.target / "config.json").read_text(), seed="truncated", shards=4)
    shard = broken / "model-00003-of-00004.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[:len(data) // 2])
    run = node.run(host_vars=node.host_vars(sglang_server_args=node.server_args(model_path=str(broken))))
    assert run.rc != 0
    assert run.host_stats()["failures"] == 1 and run.host_stats()["changed"] == 0
    failed = run.task_result(PREFLIGHT)
    assert failed["failed"] is True and failed["lease"]["acquired"] is False
    assert "the running server was not touched" in failed["msg"], failed["msg"]
    expected = "sglang_server_args.model_path: the checkpoint %s cannot be served: %s: " % (broken, shard)
    assert expected in failed["msg"] and "the file was cut short" in failed["msg"], failed["msg"]
    for task in (REPLACE, SMOKE, PROMOTE):
        assert not run.ran(task)
    row = run.row()
    assert_row_shape(row)
    assert row["status"] == "failed" and row["step"] == "preflight" and expected in row["error"], row
    assert row["signalled"] == [] and row["rollback"] == {"status": "not_needed", "detail": None}
    # The old server is the same process tree, still serving, and its GPUs are untouched.
    assert node.server_pid() == pid and all(alive(p) for p in tree) and node.server_tree(pid) == tree
    assert node.health() == 200
    assert holds_by_pid(node) == holds and node.used() == used


def test_crash_on_launch_rolls_back_to_the_known_good_config(node):
    old_pid = ensure_deployed(node)
    # The candidate differs only by a fault knob: scheduler TP0 raises while loading.
    hv = node.host_vars(server_env={"SGLANG_SIM_CRASH_ON_LOAD": "1"})
    run = node.run(host_vars=hv)
    assert run.rc != 0
    assert run.host_stats()["failures"] == 1

    replaced = run.task_result(REPLACE)
    assert replaced["failed"] is True and replaced["failed_step"] == "launch", replaced
    # The single-node candidate failed before it was healthy: the same module run rolled back.
    relaunch = replaced["rollback_launch"]
    assert replaced["rollback"]["status"] == "succeeded" and relaunch["pid"], replaced["rollback"]
    assert not run.ran(ROLLBACK)
    fail_msg = run.task_result("Fail the host")["msg"]
    assert fail_msg.startswith("Redeploy of %s failed: launch failed: " % HOST), fail_msg
    assert "Rollback succeeded: relaunched the last known-good config (pid %d," % relaunch["pid"] in fail_msg, fail_msg

    row = run.row()
    assert_row_shape(row)
    assert row["status"] == "rolled_back" and row["step"] == "launch", row
    assert row["error"] == "launch failed: " + replaced["msg"], row
    assert row["rollback"]["status"] == "succeeded"
    assert "pid %d" % relaunch["pid"] in row["rollback"]["detail"]
    assert old_pid in [p["pid"] for p in row["signalled"]]
    assert node.journal()["step"] == "rolled_back"

    # The known-good config runs again, healthy, in a new process without the fault knob.
    new_pid = node.server_pid()
    assert new_pid == relaunch["pid"] and new_pid != old_pid and not alive(old_pid)
    assert node.health() == 200
    info = node.server_info()
    assert {k: info[k] for k in RESOLVED_SPEC} == RESOLVED_SPEC
    assert "SGLANG_SIM_CRASH_ON_LOAD=1" not in environ_of(new_pid).split("\0")
    for pid in node.server_tree(new_pid):
        assert node.api_key not in "\0".join(cmdline(pid))
    assert_gpus(node, TARGET_GPUS)
    known_good = json.loads((node.etc / "known-good" / "server.json").read_text())
    assert "SGLANG_SIM_CRASH_ON_LOAD" not in known_good["env"]


def test_smoke_gate_failure_rolls_back_to_the_known_good_config(node):
    """The candidate starts, is healthy and runs the intended config, but its drafts are mostly rejected
    (SGLANG_SIM_ACCEPT_P=0.2: accept length ~1.25 against the gate's 2.0). The smoke gate fails after
    the teardown, so the known-good server comes back."""
    old_pid = ensure_deployed(node)
    run = node.run(host_vars=node.host_vars(server_env={"SGLANG_SIM_ACCEPT_P": "0.2"}))
    assert run.rc != 0 and run.host_stats()["failures"] == 1, run.summary()
    # A node deployed before has every directory as it should be: nothing is created.
    pre = run.task_result(PREFLIGHT)
    assert all(d["ok"] for d in pre["node"]["directories"]), pre["node"]["directories"]
    assert "directories" not in run.task_result(REPLACE)

    launch = run.task_result(REPLACE)["launch"]
    assert run.task_result(REPLACE)["failed"] is False and launch["overrides"] == [], launch
    gate = run.task_result(PROMOTE)        # the smoke gate runs first in the promote module run
    assert gate["failed"] is True and gate["failed_step"] == "smoke" and gate["promoted"] is False, gate
    assert re.fullmatch(r"Smoke gate failed: accept length (\d+\.\d+) is below min_accept_length 2\.00.*", gate["msg"],
                        re.S), gate["msg"]
    assert float(gate["smoke"]["accept_length"]) < 2.0, gate
    rollback = run.task_result(ROLLBACK)
    assert rollback["failed"] is False and rollback["target"] == "known_good", rollback

    row = run.row()
    assert_row_shape(row)
    assert row["status"] == "rolled_back" and row["step"] == "smoke", row
    assert row["error"].startswith("smoke failed: Smoke gate failed: accept length"), row
    assert row["rollback"]["status"] == "succeeded", row["rollback"]
    # The rollback stopped the failed candidate (started by this run) and relaunched the known-good config.
    assert launch["pid"] in [p["pid"] for p in row["signalled"]], row["signalled"]
    assert old_pid in [p["pid"] for p in row["signalled"]]
    new_pid = node.server_pid()
    assert new_pid not in (old_pid, launch["pid"]) and not alive(launch["pid"]) and node.health() == 200
    assert "SGLANG_SIM_ACCEPT_P=0.2" not in environ_of(new_pid).split("\0")
    assert "SGLANG_SIM_ACCEPT_P" not in json.loads((node.etc / "known-good" / "server.json").read_text())["env"]
    assert_gpus(node, TARGET_GPUS)


def test_concurrent_runs_meet_on_the_lock(node):
    """Two operators push the same change (a slower-starting server, SGLANG_SIM_STARTUP_S=5). Run A takes
    the lock and redeploys. B (lock timeout 1 s) fails naming A's run and touches nothing. C (long timeout)
    planned a restart before A's new server was up, waits for the lock, plans again under it and finds
    nothing left to do."""
    ensure_deployed(node)
    # The 5 s start-up keeps A's new server unhealthy while B and C make their first plan, and A's lock
    # held (with a longer smoke benchmark) while they arrive at the lock.
    change = {"SGLANG_SIM_STARTUP_S": "5"}
    run_a = node.start(host_vars=node.host_vars(server_env=change, sglang_smoke_requests=6, sglang_smoke_max_new_tokens=128))
    holder = wait_for(lambda: read_json(node.lock_path / "holder.json"), 240, 0.05, "run A to take the lock")
    run_b = node.start(host_vars=node.host_vars(server_env=change, sglang_lock_timeout=1))
    run_c = node.start(host_vars=node.host_vars(server_env=change, sglang_lock_timeout=240))
    a, b, c = run_a.wait(), run_b.wait(), run_c.wait()

    assert a.rc == 0, a.summary()
    row_a = a.row()
    assert row_a["status"] == "deployed" and row_a["plan"] == "restart" and row_a["run_id"] == holder["owner"], row_a

    # B: fails on the lease at its preflight, naming A's run; touches nothing.
    assert b.rc != 0
    pre_b = b.task_result(PREFLIGHT)
    assert pre_b["failed"] is True and pre_b["lease"]["acquired"] is False
    assert "another redeploy holds the node lease %s: run %s" % (node.lock_path, holder["owner"]) in pre_b["msg"], pre_b["msg"]
    assert pre_b["lease"]["holder"]["owner"] == holder["owner"]
    assert not b.ran(REPLACE)
    row_b = b.row()
    assert row_b["status"] == "failed" and row_b["step"] == "preflight", row_b
    assert row_b["error"] == "preflight failed: " + pre_b["msg"]

    # C: planned a restart, waited for A's lease, looked again under it, found the change deployed.
    assert c.rc == 0, c.summary()
    pre_c = c.task_result(PREFLIGHT)
    assert pre_c["lease"]["waited"] > 0.5 and pre_c["lease"]["waited_for"] == holder["owner"], pre_c["lease"]
    assert pre_c["plan"]["action"] == "none" and pre_c["lease"].get("released") is True, pre_c["plan"]["why"]
    assert not c.ran(REPLACE)
    row_c = c.row()
    assert row_c["status"] == "unchanged" and row_c["plan"] == "none" and row_c["signalled"] == [], row_c
    assert row_c["lease"]["waited_for"] == holder["owner"] and row_c["lease"]["waited_s"] > 0.5

    assert not node.lock_path.exists()
    pid = node.server_pid()
    assert pid == a.task_result(REPLACE)["launch"]["pid"]
    assert "SGLANG_SIM_STARTUP_S=5" in environ_of(pid).split("\0")
    assert good_server_running(node, exact=False) == pid


DRIFT_PLAYBOOK = """
- name: The server role's preflight and deploy, with a variable changed between the two
  hosts: all
  gather_facts: false
  environment: "{{ sglang_node_environment | default({}) }}"
  tasks:
    - name: Preflight
      ansible.builtin.include_role:
        name: gpufleet.sglang.sglang_server
        tasks_from: preflight.yml
    - name: Change variables after the preflight
      no_log: true
      ansible.builtin.set_fact:
        sglang_server_api_key: "{{ drift_api_key | default(sglang_server_api_key) }}"
        sglang_server_env: "{{ sglang_server_env | combine({'NCCL_DEBUG': 'INFO'}) }}"
    - name: Deploy
      ansible.builtin.include_role:
        name: gpufleet.sglang.sglang_server
        tasks_from: deploy.yml
"""


def test_the_launch_is_the_one_the_preflight_planned(node, tmp_path):
    """One launch spec, built by the preflight, handed over with its fingerprint (issue 23): a variable that changes
    between the preflight and the deploy either does not reach the launch (the spec is the preflight's), or, where
    it does (the API key travels as its own no_log option), is refused before the teardown."""
    old = ensure_deployed(node)
    playbook = tmp_path / "drift.yml"
    playbook.write_text(DRIFT_PLAYBOOK)
    # A secret env variable travels masked in the plan's spec and unmasked beside it (secret_env): the launch gets it.
    secret_env = node.host_vars(server_env={"HF_TOKEN": "hf-drift-4b1e9d"})
    refused = node.run(str(playbook), host_vars=secret_env,
                       extravars={"sglang_server_force": True, "drift_api_key": "sk-drift-7f3a0c"})
    assert refused.rc != 0
    res = refused.task_result("Replace the server in one module run, candidate all")
    assert res["failed"] is True and res["reason"] == "spec_mismatch" and res["touched"] is False, res.get("msg")
    assert "is not the one the preflight planned" in res["msg"] and "it differs in a secret value" in res["msg"]
    assert res["signalled"] == []
    assert "sk-drift-7f3a0c" not in refused.everything()
    # Nothing was touched: the old server serves on, with its key.
    assert node.server_pid() == old and alive(old) and node.health() == 200
    assert http_get(node.url + "/server_info", api_key=node.api_key)[0] == 200

    # The same change of sglang_server_env alone: the deploy launches the preflight's spec, not the changed variable.
    launched = node.run(str(playbook), host_vars=secret_env, extravars={"sglang_server_force": True})
    assert launched.rc == 0, launched.summary()
    pid = launched.task_result("Replace the server in one module run, candidate all")["launch"]["pid"]
    assert pid != old and alive(pid)
    environ = environ_of(pid).split("\0")
    assert "NCCL_DEBUG=INFO" not in environ
    assert "HF_TOKEN=hf-drift-4b1e9d" in environ          # the real value, not the plan's mask
    assert "hf-drift-4b1e9d" not in launched.everything()
    # Back to a promoted known-good server for the tests that follow (the role alone does not promote).
    again = node.run(extravars={"sglang_redeploy_force": True})
    assert again.rc == 0 and again.row()["status"] == "deployed", again.summary()


def read_json(path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def test_status_playbook_reports_the_running_server(node):
    pid = ensure_deployed(node)
    run = node.run("status.yml")
    assert run.rc == 0, run.summary()
    assert run.host_stats()["changed"] == 0
    status = run.task_result("Show the status")["msg"]
    assert status["health"] == 200
    assert status["running"]["pid"] == pid and status["running"]["healthy"] is True, status
    assert any(line.startswith("%s: " % HOST) for line in status["plan"]), status["plan"]
    assert status["lease"] == "free" and status["journal"].startswith("run ") and "promoted" in status["journal"]
    assert status["speculative"] == dict(RESOLVED_SPEC, speculative_algorithm="EAGLE3")
    # A labelled table: every GPU of the node (the server's two hold memory and a process each), then the server,
    # its config, the known-good config and the lease.
    table = status["table"]
    assert table[0].split() == ["GPU", "used", "MiB", "processes"], table
    gpus = [line.split() for line in table[1:9]]
    assert [int(g[0]) for g in gpus] == list(range(8)), table
    assert all(int(g[1]) > 100000 and g[2] == "1" for g in gpus[:2]) and all(g[2] == "0" for g in gpus[2:]), table
    assert table[9] == "server      PID %d healthy (pid_file); /health 200" % pid, table
    inspected = run.task_result("Inspect the node, the managed server, the journal and the lease (read-only)")["plan"]
    assert table[10] == "config      %s; next redeploy: %s (%s)" % (
        inspected["running"]["fingerprint"][:19], inspected["action"], inspected["why"]), table
    assert table[11].startswith("known-good  ready: known-good config of "), table
    assert table[12] == "lease       free" and len(table) == 13, table
    assert node.server_pid() == pid and alive(pid)


def test_verify_playbook_checks_allocated_and_free(node):
    pid = ensure_deployed(node)
    run = node.run("verify.yml", extravars={"gpu_verify_state": "allocated", "gpu_verify_gpus": ["0", "1"]})
    assert run.rc == 0, run.summary()
    assert run.task_result("Verify GPU memory is allocated").get("failed") is not True

    # The server's GPUs are not free: the diagnosis names its scheduler PIDs; nothing is touched.
    run = node.run("verify.yml", extravars={"gpu_verify_state": "free", "gpu_verify_gpus": ["0", "1"],
                                            "gpu_verify_timeout": 1})
    assert run.rc != 0
    res = run.task_result("Verify GPU memory is free")
    assert res["failed"] is True
    schedulers = [p for p in node.server_tree(pid) if p != pid]
    assert any(str(p) in res["msg"] for p in schedulers), res["msg"]
    assert node.server_pid() == pid and alive(pid) and node.health() == 200


def test_teardown_playbook_frees_the_gpus(node):
    pid = ensure_deployed(node)
    tree = node.server_tree(pid)
    run = node.run("teardown.yml")
    assert run.rc == 0, run.summary()
    torn = run.task_result(TEARDOWN)
    assert [p["pid"] for p in torn["signalled"] if p["role"] == "root"] == [pid]
    assert node.decoy not in [p["pid"] for p in torn["signalled"]]
    assert [g["index"] for g in torn["gpus_free"]] == TARGET_GPUS
    assert run.task_result(PREFLIGHT)["lease"]["acquired"] is True
    assert run.task_result("Record the stop in the node journal and release the lease")["released"] is True
    assert not node.lock_path.exists() and node.journal()["step"] == "stopped"
    assert not any(alive(p) for p in tree)
    assert all(v == IDLE_MIB for v in node.used().values()), node.used()


ORPHAN_MIB = 2048
ORPHAN_TEXT = "GPU 1: %d MiB held by no process" % (IDLE_MIB + ORPHAN_MIB)     # used memory includes the idle MiB
ORPHAN_SUMMARY = ORPHAN_TEXT + " after 2 s (orphaned context); a GPU reset is needed"


def test_stuck_gpu_memory_fails_verify_and_the_rollback(node):
    """Orphaned memory (a context the driver kept after its process died) on GPU 1: the teardown cannot free
    it, the verify-free step fails with the diagnosis, and the rollback cannot relaunch the known-good config
    either, because the GPUs are still not free. A server runs first (after the teardown test none does): a
    run that signalled nothing would have touched nothing, and nothing would be rolled back (test_crash_consistency)."""
    old_pid = ensure_deployed(node)
    node.gpusim("orphan", "--gpu", 1, "--mib", ORPHAN_MIB)
    try:
        run = node.run(host_vars=node.host_vars(gpu_verify_timeout=2), extravars={"sglang_redeploy_force": True})
    finally:
        used = node.used()
        reset = node.smi("--gpu-reset", "-i", "1")         # the fix the diagnosis names
    assert run.rc != 0
    assert reset.returncode == 0 and node.used()[1] == IDLE_MIB, reset.stdout + reset.stderr

    replaced = run.task_result(REPLACE)
    rollback = run.task_result(ROLLBACK)
    assert replaced["failed"] and replaced["failed_step"] == "teardown", replaced
    assert rollback["failed"] and rollback["failed_step"] == "teardown", rollback     # the rollback's teardown
    for res in (replaced, rollback):
        diagnosis = res["verify_failure"]["diagnosis"]
        assert [(d["gpu"], d["kind"]) for d in diagnosis] == [(1, "orphaned")], diagnosis
        assert ORPHAN_SUMMARY in res["msg"], res["msg"]
        assert "launch" not in res or not res["launch"].get("pid"), res.get("launch")

    fail_msg = run.task_result("Fail the host")["msg"]
    assert fail_msg.startswith("Redeploy of %s failed: teardown failed: " % HOST), fail_msg
    head, _sep, rolled = fail_msg.partition(" Rollback failed: ")
    assert ORPHAN_TEXT in head and ORPHAN_TEXT in rolled, fail_msg

    row = run.row()
    assert_row_shape(row)
    assert row["status"] == "failed" and row["step"] == "teardown", row
    assert row["error"].startswith("teardown failed: ") and ORPHAN_TEXT in row["error"]
    assert row["rollback"]["status"] == "failed"
    assert row["rollback"]["detail"].startswith(
        "the teardown before the relaunch failed, so the last known-good config was not relaunched: "), row["rollback"]
    assert ORPHAN_TEXT in row["rollback"]["detail"], row["rollback"]
    # What the node shows: nothing listens on the port, and no process holds the GPUs (the orphaned memory has none).
    assert row["node_state"] == "no server: nothing listens on port %d; no process has GPU 0,1 open" % node.port, row
    assert replaced["reason"] == "teardown_failed" and replaced["touched"] is True
    assert old_pid in [p["pid"] for p in row["signalled"]]
    assert node.journal()["step"] == "failed"

    # The honest end state: no server runs; GPU 1 kept the orphaned 2 GiB until the reset above.
    assert node.health() is None and not alive(old_pid)
    assert used[0] == IDLE_MIB and used[1] == IDLE_MIB + ORPHAN_MIB, used


def test_crash_on_a_never_deployed_node_has_no_rollback(tmp_path, procs):
    """A fresh node (no known-good config): the crashed candidate is cleaned up and the rollback is
    ``unavailable``, with the reason; no GPU stays held."""
    fresh = SimNode(tmp_path / "fresh", procs)
    run = fresh.run(host_vars=fresh.host_vars(server_env={"SGLANG_SIM_CRASH_ON_LOAD": "1"}))
    assert run.rc != 0
    replaced = run.task_result(REPLACE)
    assert replaced["failed"] is True and replaced["failed_step"] == "launch"
    assert replaced["rollback"]["status"] == "unavailable", replaced["rollback"]
    assert not run.ran(ROLLBACK)
    row = run.row()
    assert row["status"] == "failed" and row["step"] == "launch" and row["plan"] == "start", row
    assert row["rollback"]["status"] == "unavailable"
    assert row["rollback"]["detail"].startswith("no known-good config under %s/known-good" % fresh.etc), row["rollback"]
    fail_msg = run.task_result("Fail the host")["msg"]
    assert " Rollback unavailable: no known-good config under " in fail_msg, fail_msg
    assert fresh.health() is None and not fresh.server_tree()
    assert all(v == IDLE_MIB for v in fresh.used().values()), fresh.used()
    assert fresh.leaks() == []


def changed_lines(text):
    """The ``-``/``+`` lines of the unified diffs the default callback printed (``---``/``+++`` headers left out)."""
    return [line for line in text.splitlines() if line.startswith(("-", "+")) and not line.startswith(("---", "+++"))]


def test_check_diff_shows_the_changed_args_and_a_real_diff_run_shows_them_once(node):
    """``--check --diff`` after a deploy, with a changed arg and a secret env variable: the default callback prints the
    unified diff of the running server's recorded launch against the plan, the recap says changed=1, nothing is touched.
    Then a real run with ``--diff`` prints its diff once (on the replace task). This test reads the printed output:
    how the callback renders the diff is what it checks."""
    pid = ensure_deployed(node)
    holds = holds_by_pid(node)
    hf_token = "hf-diff-e7a20c55"
    hv = node.host_vars(server_env={"HF_TOKEN": hf_token},
                        sglang_server_args=node.server_args(speculative_num_draft_tokens=8))
    check = node.run(host_vars=hv, check=True)
    assert check.rc == 0, check.summary()
    assert check.host_stats()["changed"] == 1, [e["event_data"]["task"] for e in check.results(("runner_on_ok",))
                                                if e["event_data"]["res"].get("changed")]
    pre = check.task_result(PREFLIGHT)
    assert pre["changed"] is True and pre["plan"]["action"] == "restart" and not check.ran(REPLACE)
    assert [d["after_header"].split(" (")[0] for d in pre["diff"]] == [
        "SGLang server %s: command line" % node.name, "SGLang server %s: environment" % node.name]
    out = check.stdout()
    assert "--- before: SGLang server %s: command line (running PID %d, identity " % (node.name, pid) in out
    assert "+++ after: SGLang server %s: command line (planned, identity " % node.name in out
    # 16 draft tokens -> 8, which honor_draft_tokens runs with 7 steps (15 before); HF_TOKEN is new, and masked.
    assert sorted(changed_lines(out)) == sorted([
        "-    --speculative-num-steps 15", "+    --speculative-num-steps 7",
        "-    --speculative-num-draft-tokens 16", "+    --speculative-num-draft-tokens 8",
        "+HF_TOKEN=********"]), out
    assert node.api_key not in check.everything() and hf_token not in check.everything()
    # Nothing was touched.
    assert node.server_pid() == pid and alive(pid) and node.health() == 200 and holds_by_pid(node) == holds
    assert node.server_info()["speculative_num_draft_tokens"] == 16
    # The report says what a real run would signal.
    assert "would signal PID %d" % pid in check.report_md, check.report_md

    # A real run with --diff: the diff once, on the task that changes the node (not on the preflight).
    hv = node.host_vars(sglang_server_args=node.server_args(mem_fraction_static=0.7))
    real = node.run(host_vars=hv, diff=True)
    assert real.rc == 0 and real.row()["status"] == "deployed", real.summary()
    assert "diff" not in real.task_result(PREFLIGHT)
    assert [d["before_header"].split(" (")[0] for d in real.task_result(REPLACE)["diff"]] == [
        "SGLang server %s: command line" % node.name]
    out = real.stdout()
    assert changed_lines(out) == ["+    --mem-fraction-static 0.7"], out
    assert out.count("--- before: SGLang server %s: command line (running PID %d, identity " % (node.name, pid)) == 1
    assert node.api_key not in real.everything()
    assert node.server_pid() != pid and node.server_info()["mem_fraction_static"] == 0.7


PREFETCH = "Warm the checkpoint into the page cache while the old server serves"
MIB = 1024 * 1024


def evict(path):
    """Drop a file's clean pages from the page cache (the node's tmp dir is on a disk-backed file system)."""
    fd = os.open(str(path), os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def test_prefetch_warms_the_new_checkpoint_before_the_teardown_within_its_budget(node):
    """A new checkpoint of four ~2 MiB shards: the first is resident (just written and read), the others dropped from
    the page cache. With sglang_server_prefetch on and a 2 MiB cap, the prefetch runs after the preflight and before the
    replace (while the old server serves), skips the resident shard, reads up to the budget and stops there."""
    pid = ensure_deployed(node)
    ckpt = node.models / "kimi-k2.5-prefetch"
    layout = dict(SMALL_LAYOUT, **{"model.layers.0.mlp.extra_%d.weight" % i: ("BF16", (1024, 1024)) for i in range(4)})
    write_checkpoint(ckpt, config=(node.target / "config.json").read_text(), layout=layout, seed="prefetch", shards=4)
    shards = sorted(str(p) for p in ckpt.glob("model-*.safetensors"))
    assert len(shards) == 4
    for shard in shards[1:]:
        evict(shard)
    pathlib.Path(shards[0]).read_bytes()
    cold = [pf.residency(s)[0] for s in shards[1:]]
    assert all(r < os.path.getsize(s) // 2 for r, s in zip(cold, shards[1:])), \
        "the test's file system keeps dropped pages (%s): the prefetch test needs a disk-backed one" % cold
    assert pf.residency(shards[0])[0] == os.path.getsize(shards[0])
    budget = 2 * MIB
    run = node.run(host_vars=node.host_vars(sglang_server_args=node.server_args(model_path=str(ckpt))),
                   extravars={"sglang_server_prefetch": "on", "sglang_server_prefetch_max_gb": budget / 1024.0 ** 3})
    assert run.rc == 0 and run.row()["status"] == "deployed", run.summary()
    names = run.task_names()
    replace = [i for i, n in enumerate(names) if n and n.startswith("Replace the server in one module run, candidate")]
    assert names.index(PREFLIGHT) < names.index(PREFETCH) < replace[0], names
    res = run.task_result(PREFETCH)
    got = res["prefetch"]
    assert res["changed"] is False and got["budget_bytes"] == budget
    # The draft model's shards come after the model's.
    assert got["files"] >= 4 and got["errors"] == []
    assert {"path": shards[0], "why": "resident"} in got["skipped"]
    # The reads stopped at the budget: whole shards until 2 MiB were read, then nothing more.
    assert got["stopped"] == "budget" and got["bytes_read"] == budget
    read, expect_skipped = 0, []
    for shard in shards[1:]:
        if read >= budget:
            expect_skipped.append({"path": shard, "why": "budget"})
        else:
            read += min(os.path.getsize(shard), budget - read)
    assert expect_skipped and all(s in got["skipped"] for s in expect_skipped), (expect_skipped, got["skipped"])
    assert got["resident_after"]["bytes"] > got["resident_before"]["bytes"]
    assert any("stopped at the memory budget" in w for w in res.get("warnings") or []), res.get("warnings")
    assert run.row()["prefetch"] == got["line"] and "stopped at the memory budget" in got["line"]
    assert node.server_info()["model_path"] == str(ckpt)


def test_api_key_appears_in_no_event_report_or_command_line(node):
    """Every run of this module (all scenarios above), every report file, and the server's command lines."""
    if not node.runs_done:
        ensure_deployed(node)
    assert node.runs_done and list(node.reports.glob("*"))
    # Positive control: the marker really went in (the inventory holds it in clear text).
    assert node.api_key in (node.runs_done[0].artifacts.parent / "inventory.json").read_text()
    assert node.leaks() == []
    # The cost of each run, for the record (pytest -rA or -s shows it).
    for run in node.runs_done:
        print("%-34s rc=%s wall %6.1f s  cpu %5.1f s" % (run.artifacts.parent.name, run.rc, run.wall, run.cpu))
