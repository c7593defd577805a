"""redeploy.yml and the rest of the ecosystem (issue 25 part 5), end to end through ``ansible_runner`` against one
simulated node (``playbook_helpers.SimNode``):

- tags: ``--tags preflight`` is a dry preflight that touches nothing (no lease, no journal, no record, no report, the
  hand-started incident server keeps its PID and GPUs); ``--tags preflight,report`` adds a ``planned`` report row;
  a part of the redeploy alone (``--tags teardown``, ``--skip-tags smoke``) is refused before anything runs;
- play keywords: ``sglang_serial`` set in the inventory (group vars of ``all``) is refused loudly, naming the
  variable and the fix; the same value as an extra variable is accepted, and the play's name says what it used;
- set_stats: the runner's ``playbook_on_stats`` event carries ``artifact_data.gpufleet_sglang_redeploy`` per host;
- ``sglang_report_copy_to``: the report files are copied there;
- ``sglang_textfile_path``: the node's last redeploy as a node_exporter textfile, read with the strict exposition
  grammar of tests/unit/plugins/module_utils/test_textfile.py.

The tests share the node and run in file order: the dry runs and the refusals first (the incident server still
runs), then the redeploy that replaces it, then a run with nothing to do.
"""
from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest

from playbook_helpers import HOST, SimNode, alive, module_procs, starttime  # noqa: F401  # pylint: disable=unused-import

pytestmark = pytest.mark.slow

REPO = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "textfile_grammar", REPO / "tests" / "unit" / "plugins" / "module_utils" / "test_textfile.py")
grammar = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(grammar)

PREFLIGHT = "Plan the redeploy (inspect the node, resolve the args as its SGLang will, take the lease)"
CHECK = "Check the tags, the play settings (hosts, serial, max_fail_percentage) and the output paths before anything runs"
REPLACE = "Replace the server in one module run, candidate all"
TEXTFILE = "Export this host's last redeploy to node_exporter (sglang_textfile_path)"


@pytest.fixture(scope="module")
def node(tmp_path_factory, procs):
    n = SimNode(tmp_path_factory.mktemp("ecosystem-node"), procs)
    n.incident = n.start_server_by_hand(n.server_args(), log_name="incident.log")
    n.incident_start = starttime(n.incident)
    n.textfile_dir = n.base / "textfile"
    n.textfile_dir.mkdir()
    n.copy_to = n.base / "persistent" / "reports"
    return n


def run_with(node, cmdline=None, extravars=None, all_vars=None, host_vars=None):
    """A redeploy.yml run with extra ansible-playbook arguments and optional variables of the group ``all``."""
    kwargs = node._prepare("redeploy.yml", host_vars, extravars, False)
    if cmdline:
        kwargs["cmdline"] = cmdline
    if all_vars:
        inventory = pathlib.Path(kwargs["inventory"])
        data = json.loads(inventory.read_text())
        data["all"]["vars"] = all_vars
        inventory.write_text(json.dumps(data))
    return node._execute("redeploy.yml", kwargs)


def untouched(node):
    """What a run that touches nothing leaves as it was: the incident server, its GPUs, the node's records."""
    return {"incident": alive(node.incident, node.incident_start), "server_pid": node.server_pid(),
            "used": node.used(), "records": node.files_under(node.etc), "state": node.files_under(node.state),
            "lock": node.files_under(node.lock_dir), "reports": sorted(p.name for p in node.reports.iterdir()),
            "textfiles": sorted(p.name for p in node.textfile_dir.iterdir())}


def artifact_data(run):
    stats = [e for e in run.events if e.get("event") == "playbook_on_stats"]
    assert len(stats) == 1, [e.get("event") for e in run.events][-5:]
    return stats[0]["event_data"].get("artifact_data")


def failed_message(run, name=CHECK):
    events = run.task_events(name, kinds=("runner_on_failed",))
    assert events, "%s did not fail: %s" % (name, run.summary())
    return events[0]["event_data"]["res"]["msg"]


def test_tags_preflight_is_a_dry_preflight_that_touches_nothing(node):
    before = untouched(node)
    assert before["incident"]
    run = run_with(node, cmdline="--tags preflight")
    assert run.rc == 0, run.summary()
    pre = run.task_result(PREFLIGHT)
    # The preflight really ran and planned the replacement of the incident server ...
    assert pre["plan"]["action"] == "restart", pre["plan"]
    # ... without the lease, and nothing after it ran.
    assert pre["lease"]["acquired"] is False, pre["lease"]
    assert not run.ran(REPLACE) and not run.ran("Add this batch's hosts to the run report")
    assert run.host_stats()["changed"] == 0, run.host_stats()
    assert untouched(node) == before
    assert node.journal() == {} and node.lease_holder() is None
    assert run.report == []


def test_tags_preflight_report_writes_a_planned_row_and_nothing_else(node):
    before = untouched(node)
    run = run_with(node, cmdline="--tags preflight,report", host_vars=node.host_vars(
        sglang_textfile_path=str(node.textfile_dir / "sglang-it.prom")))
    assert run.rc == 0, run.summary()
    row = run.row()
    assert row["status"] == "planned" and row["plan"] == "restart" and row["signalled"] == [], row
    assert [p["pid"] for p in row["holders"]] and row["planned_teardown"], row
    after = untouched(node)
    assert after.pop("reports") != before.pop("reports")        # the report files are the only thing written
    assert after == before, "the dry run touched the node"
    assert not run.ran(TEXTFILE)                                # a dry run exports no last-redeploy metrics
    data = artifact_data(run)["gpufleet_sglang_redeploy"][HOST]
    assert data["status"] == "planned" and data["mode"] == "restart" and data["outage_s"] is None, data


@pytest.mark.parametrize("cmdline, words", [
    ("--tags teardown", "--tags teardown would run only a part of the redeploy"),
    ("--tags launch,smoke", "--tags launch,smoke would run only a part"),
    ("--tags report", "--tags report would run only a part"),
    ("--skip-tags smoke", "--skip-tags smoke would run only a part"),
])
def test_a_part_of_the_redeploy_alone_is_refused_before_anything_runs(node, cmdline, words):
    before = untouched(node)
    run = run_with(node, cmdline=cmdline)
    assert run.rc != 0, run.summary()
    msg = failed_message(run)
    assert words in msg and "Nothing was touched" in msg and "--tags preflight" in msg, msg
    assert not run.ran(PREFLIGHT) and not run.ran(REPLACE)
    assert untouched(node) == before


def test_play_settings_in_the_inventory_are_refused_loudly(node):
    before = untouched(node)
    run = run_with(node, all_vars={"sglang_serial": 2, "sglang_max_fail_percentage": 50})
    assert run.rc != 0, run.summary()
    msg = failed_message(run)
    assert "sglang_serial is 2 in the inventory variables of %s" % HOST in msg, msg
    assert "used 1" in msg and "-e sglang_serial=" in msg and "job template's extra variables or the survey" in msg, msg
    assert "sglang_max_fail_percentage is 50" in msg and "used 0" in msg, msg
    assert "sglang_hosts" not in msg, msg                   # not set anywhere: nothing to say about it
    assert not run.ran(PREFLIGHT)
    assert untouched(node) == before


@pytest.mark.parametrize("variable, value, words", [
    ("sglang_textfile_path", "relative/metrics.prom", "must be an absolute path ending in .prom"),
    ("sglang_textfile_path", "/var/lib/node_exporter/metrics.txt", "must be an absolute path ending in .prom"),
    ("sglang_report_copy_to", "reports", "must be an absolute directory on the controller"),
])
def test_bad_output_paths_are_refused_before_anything_runs(node, variable, value, words):
    before = untouched(node)
    run = run_with(node, host_vars=node.host_vars(**{variable: value}))
    assert run.rc != 0, run.summary()
    msg = failed_message(run)
    assert msg.startswith(variable) and words in msg and json.dumps(value) in msg, msg
    assert untouched(node) == before


def test_redeploy_publishes_stats_copies_the_report_and_writes_the_textfile(node):
    textfile = node.textfile_dir / "sglang-it.prom"
    hv = node.host_vars(sglang_textfile_path=str(textfile), sglang_report_copy_to=str(node.copy_to))
    # The same serial in the inventory and as an extra variable: the extra variable is what the play reads.
    run = run_with(node, extravars={"sglang_serial": 2}, all_vars={"sglang_serial": 2}, host_vars=hv)
    assert run.rc == 0, run.summary()
    plays = [e["event_data"]["play"] for e in run.events if e.get("event") == "playbook_on_play_start"]
    assert len(plays) == 1 and json.loads(plays[0][plays[0].index("{"):]) == {
        "sglang_hosts": "gpu-nodes", "sglang_serial": 2, "sglang_max_fail_percentage": 0}, plays
    assert not alive(node.incident, node.incident_start)        # the incident server was replaced
    row = run.row()
    assert row["status"] == "deployed", row

    # set_stats: artifact_data, what AWX keeps as the job's artifacts.
    data = artifact_data(run)["gpufleet_sglang_redeploy"]
    assert list(data) == [HOST], data
    got = data[HOST]
    assert got["status"] == "deployed" and got["mode"] == "restart" and got["step"] == "done", got
    assert got["run_id"] == run.run_id and pathlib.Path(got["report_path"]) in run.report_paths, got
    assert got["tokens_per_s"] == row["smoke"]["tokens_per_s"] and got["tokens_per_s"] > 0, got
    assert got["accept_length"] == row["smoke"]["accept_length"] and got["accept_length"] >= 2.0, got
    timings = run.task_result(REPLACE)["timings"]
    assert got["outage_s"] >= timings["teardown_s"] + timings["candidate_healthy_s"] - 0.002, (got, timings)
    assert node.api_key not in json.dumps(artifact_data(run))

    # sglang_report_copy_to: both files, as written.
    for path in run.report_paths:
        copy = node.copy_to / path.name
        assert copy.read_bytes() == path.read_bytes(), copy
    assert got["report_copy"] == str(node.copy_to / (run.run_id + "-redeploy.json"))

    # The textfile: valid exposition format, this run's figures, mode 0644, no temporary left beside it.
    fams = grammar.parse(textfile.read_text())
    assert textfile.stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in node.textfile_dir.iterdir()) == ["sglang-it.prom"]
    assert grammar.value(fams, "sglang_redeploy_last_status", status="deployed", server="it") == 1
    assert grammar.value(fams, "sglang_redeploy_last_status", status="failed") == 0
    assert grammar.value(fams, "sglang_redeploy_last_mode", mode="restart") == 1
    assert grammar.value(fams, "sglang_redeploy_last_info", run_id=run.run_id, host=HOST) == 1
    assert grammar.value(fams, "sglang_redeploy_last_tokens_per_second") == got["tokens_per_s"]
    assert grammar.value(fams, "sglang_redeploy_last_accept_length") == got["accept_length"]
    assert grammar.value(fams, "sglang_redeploy_last_outage_seconds") == got["outage_s"]
    assert 0 <= grammar.value(fams, "sglang_redeploy_known_good_age_seconds") < 600
    node.deployed_textfile = textfile.read_text()


def test_a_run_with_nothing_to_do_says_so_in_the_stats_and_the_textfile(node):
    textfile = node.textfile_dir / "sglang-it.prom"
    hv = node.host_vars(sglang_textfile_path=str(textfile))
    run = run_with(node, host_vars=hv)
    assert run.rc == 0, run.summary()
    got = artifact_data(run)["gpufleet_sglang_redeploy"][HOST]
    assert got["status"] == "unchanged" and got["mode"] is None and got["outage_s"] is None, got
    assert got["report_copy"] is None, got
    fams = grammar.parse(textfile.read_text())
    assert grammar.value(fams, "sglang_redeploy_last_status", status="unchanged") == 1
    assert grammar.value(fams, "sglang_redeploy_last_mode", mode="none") == 1
    # No replacement, no smoke gate: the figures are left out, never 0 (the known-good age stays).
    for name in ("last_outage_seconds", "last_tokens_per_second", "last_accept_length"):
        assert "sglang_redeploy_" + name not in fams, name
    assert "sglang_redeploy_known_good_age_seconds" in fams
