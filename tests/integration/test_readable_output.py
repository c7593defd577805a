"""Output a person can read (issue 25 part 4), through ``redeploy.yml`` and ``status.yml`` on one simulated
8 x H200 node (``playbook_helpers.SimNode``), read from what ``ansible-playbook`` printed (the runner's stdout
artifact) and from the runner's job events (what AWX stores):

- a refused config (``tp_size: -1``) prints its message first, in a short ``fatal:`` block; ``-v`` still
  returns the whole preflight result;
- every job event of a full redeploy stays under a few KB (the replace result was 58 KB in AWX), the full
  replace result is in the details file on the node, and the report lists only what was really signalled;
- ``status.yml`` prints a labelled table per host.
"""
from __future__ import annotations

import json
import pathlib
import re

import pytest

from playbook_helpers import HOST, alive, decoy_survives_fixture, module_procs, node_with_decoy, session_members  # noqa: F401  # pylint: disable=unused-import

pytestmark = pytest.mark.slow

PREFLIGHT = "Plan the redeploy (inspect the node, resolve the args as its SGLang will, take the lease)"
REPLACE = "Replace the server in one module run, candidate all"
FATAL = re.compile(r"^fatal: \[(?P<host>[^\]]+)\]: FAILED! => (?P<result>.*)$", re.M)

# Every job event of a redeploy stays under EVENT_LIMIT, but the preflight's own result, which carries the plan the
# later tasks read (the launch spec, its identity, the node's GPUs, the checkpoint and compile-cache checks): under
# PREFLIGHT_EVENT_LIMIT. It holds some 40 paths, each under this test's ~60-character temporary directory (a node's
# /etc/sglang or /var/lib/sglang/main is ~20): measured 19.3 KB here after the lean trims, 16.9 KB since the lean invocation (2026-12-07).
EVENT_LIMIT = 8 * 1024
PREFLIGHT_EVENT_LIMIT = 20 * 1024
# A failed host's fatal block: the message within its first MESSAGE_WITHIN characters, the block under BLOCK_LIMIT.
MESSAGE_WITHIN = 200
BLOCK_LIMIT = 4 * 1024


@pytest.fixture(scope="module")
def node(tmp_path_factory, procs):
    return node_with_decoy(tmp_path_factory.mktemp("readable-node"), procs)


def fatal_blocks(run, host=HOST):
    """The ``fatal: [host]: FAILED! => {...}`` lines the default callback printed, as text after ``=> ``."""
    return [m.group("result") for m in FATAL.finditer(run.stdout()) if m.group("host") == host]


def event_sizes(run):
    """``[(bytes of the event as JSON, event, task)]`` of every job event, largest first."""
    return sorted(((len(json.dumps(e)), e.get("event"), (e.get("event_data") or {}).get("task")) for e in run.events),
                  reverse=True)


def test_a_full_redeploy_keeps_every_job_event_small_and_the_details_on_the_node(node):
    # The incident server, started by hand: its schedulers exit with it when it is signalled.
    old_pid = node.start_server_by_hand(node.server_args(), log_name="incident.log")
    old_tree = session_members(old_pid)
    assert len(old_tree) > 1, old_tree
    run = node.run()
    assert run.rc == 0, run.summary()

    sizes = event_sizes(run)
    too_big = [s for s in sizes if s[0] > (PREFLIGHT_EVENT_LIMIT if s[2] == PREFLIGHT else EVENT_LIMIT)]
    assert not too_big, too_big
    assert sizes[0][0] > 1024                  # the sizes are real events, not empty ones

    # The replace result names its details file on the node: the full result, with the server's whole /server_info,
    # the secrets masked.
    replaced = run.task_result(REPLACE)
    assert "effective" not in replaced["launch"] and replaced["launch"]["effective_args"], replaced["launch"]
    details_path = pathlib.Path(replaced["details_file"])
    assert details_path.parent == node.state / "details" and (details_path.stat().st_mode & 0o777) == 0o600
    details = json.loads(details_path.read_text())
    assert details["launch"]["pid"] == replaced["launch"]["pid"] == node.server_pid()
    assert details["launch"]["effective"]["speculative_num_steps"] == 15
    assert node.api_key not in details_path.read_text()

    # The report: what was really signalled (the old server), apart from the children that exited with it (without
    # their command lines); the plan, the previous config and the details file.
    row = run.row()
    assert [p["pid"] for p in row["signalled"]] == [old_pid] and row["signalled"][0]["signals"], row["signalled"]
    assert sorted(p["pid"] for p in row["exited"]) == sorted(p for p in old_tree if p != old_pid), row["exited"]
    assert all(not p.get("signals") for p in row["exited"])
    # A hand-started server has no record of its launch: no previous config.
    assert row["plan"] == "restart" and row["plan_why"] and row["previous_args"] is None, row
    assert all("cmdline" not in p for p in row["exited"]) and row["signalled"][0]["cmdline"]
    assert set(row["gpus_before"][0]) == {"index", "used_mib", "pids"}, row["gpus_before"]
    assert row["details_files"] == [str(details_path)]
    markdown = pathlib.Path([p for p in run.report_paths if str(p).endswith(".md")][0]).read_text()
    assert "- Plan: restart: " in markdown and "- Exited with their server (not signalled): PID " in markdown
    assert "- Full module result on the node: `%s`" % details_path in markdown

    # A changed config: the report gives the config it replaced (the recorded launch, secrets masked).
    first = details["launch"]["effective_args"]
    run = node.run(host_vars=node.host_vars(sglang_server_args=node.server_args(mem_fraction_static=0.8)))
    assert run.rc == 0, run.summary()
    assert max(size for size, _kind, task in event_sizes(run) if task != PREFLIGHT) <= EVENT_LIMIT
    row = run.row()
    assert row["previous_args"]["speculative_num_steps"] == first["speculative_num_steps"] == 15, row["previous_args"]
    assert "mem_fraction_static" not in row["previous_args"] and row["previous_args"].get("api_key") in (None, "********")
    assert "- Previous config: " in run.report_md and "speculative_num_steps=15" in run.report_md
    assert node.leaks() == []


def test_a_refused_config_prints_its_message_first_and_short(node):
    """``sglang_server_host_args: {tp_size: -1}`` (tests/integration/test_redeploy_playbook.py BAD_CONFIGS): the
    fatal block of the preflight was 11-25 KB with the message at its 1,000th-2,000th character."""
    expected = "sglang_server_args.tp_size: must be an integer >= 1, got -1"
    run = node.run(host_vars=node.host_vars(sglang_server_host_args={"tp_size": -1}))
    assert run.rc != 0
    blocks = fatal_blocks(run)
    # The preflight's (rescued) and the host's final one; both say what failed, first.
    assert len(blocks) == 2, run.stdout_tail()
    for block in blocks:
        at = block.find('"msg": "Preflight failed on %s; the running server was not touched. ' % HOST)
        assert 0 <= at < MESSAGE_WITHIN and expected in block, block[:400]
        assert len(block) < BLOCK_LIMIT, (len(block), block[:400])
    failed = run.task_result(PREFLIGHT)
    assert failed["lease"]["acquired"] is False and expected in failed["problems"][0]
    for size, event, task in event_sizes(run):
        assert size <= EVENT_LIMIT, (size, event, task)
    row = run.row()
    assert row["status"] == "failed" and row["step"] == "preflight" and expected in row["error"]
    # Nothing was touched: the server of the previous test still serves.
    assert node.health() == 200

    # -v: the whole result, the plan and the node included.
    verbose = node.run(host_vars=node.host_vars(sglang_server_host_args={"tp_size": -1}), verbosity=1)
    full = verbose.task_result(PREFLIGHT)
    assert full["failed"] is True and full["plan"]["action"] and full["node"]["all_gpus"], sorted(full)
    assert len(json.dumps(full)) > 2 * len(json.dumps(failed))


def test_status_prints_a_labelled_table(node):
    pid = node.server_pid()
    assert pid and alive(pid)
    run = node.run("status.yml")
    assert run.rc == 0, run.summary()
    status = run.task_result("Show the status")["msg"]
    assert status["gpus"][0] == {"gpu": 0, "used_mib": status["gpus"][0]["used_mib"], "processes": 1}
    assert [g["gpu"] for g in status["gpus"]] == list(range(8))
    table = status["table"]
    assert table[0] == "GPU   used MiB  processes", table
    assert table[9:] == [
        "server      PID %d healthy (pid_file); /health 200" % pid,
        table[10], table[11], "lease       free"], table
    # The server runs the first test's changed config (mem_fraction_static 0.8), not the inventory's: a restart.
    assert re.match(r"config      sha256:[0-9a-f]{12}; next redeploy: restart \(the running server \(PID %d, pid_file\) "
                    r"runs another config\)$" % pid, table[10]), table
    assert re.match(r"known-good  ready: known-good config of .* \(sha256:[0-9a-f]{12}\)$", table[11]), table
    # What ansible-playbook printed: the table's lines, one per line.
    assert '"server      PID %d healthy (pid_file); /health 200",' % pid in run.stdout()
