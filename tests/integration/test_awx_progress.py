"""The runner example of docs/awx/ with an ``idle_timeout`` shorter than the server's startup (issue 25).

ansible-runner (and AWX, which runs it) ends a job that prints nothing for ``idle_timeout`` seconds. A real model
loads for minutes inside one module run (``sglang_replace``); its progress lines (every
``sglang_server_progress_interval`` seconds) keep the job alive. Here the simulated server loads for
SLOW_STARTUP_S seconds and ``idle_timeout`` is IDLE_TIMEOUT_S: with the progress lines the job succeeds and they are
in its stdout and job events; with them off (interval 0) the same job is ended by the runner as timed out, which
shows that the timeout really is shorter than the silent stretch. The job runs as ``test_awx_project`` runs the
example: the CLI, the collection installed from its tarball, the project as an SCM checkout.
"""
from __future__ import annotations

import json
import re
import shutil

import pytest
import yaml

from playbook_helpers import FAST_SERVER_ENV, VENV_BIN, SimNode, alive, module_procs, wait_for
from test_awx_project import EXAMPLE, TEMPLATE, _project, _run, installed  # noqa: F401 (fixtures)

__all__ = ["installed", "module_procs"]   # the fixtures (module_procs is the fixture "procs"), used as test parameters

pytestmark = pytest.mark.slow

SLOW_STARTUP_S = 24
IDLE_TIMEOUT_S = 10
INTERVAL_S = 3
PROGRESS = re.compile(r"^node1: replacing the server \(phase all\) \d+ s; step \w+", re.M)


@pytest.fixture(scope="module")
def job(tmp_path_factory, installed, procs):  # noqa: F811 (the imported fixtures)
    base = tmp_path_factory.mktemp("awx-progress")
    node = SimNode(base / "node", procs)
    answers = yaml.safe_load((EXAMPLE / "env" / "extravars").read_text())
    answers.pop("sglang_router_url")
    settings = yaml.safe_load((EXAMPLE / "env" / "settings").read_text())
    assert settings["idle_timeout"] > SLOW_STARTUP_S, "the example's own idle_timeout: %s" % settings
    settings["idle_timeout"] = IDLE_TIMEOUT_S
    return {"base": base, "project": _project(base / "checkout"), "node": node, "answers": answers,
            "settings": settings}


def _inventory(node, interval, policy):
    env = dict(FAST_SERVER_ENV, SGLANG_SIM_STARTUP_S=str(SLOW_STARTUP_S))
    hv = node.host_vars(server_env=env, sglang_server_progress_interval=interval)
    hv["sglang_server_args"] = node.server_args(schedule_policy=policy)
    return {"all": {"children": {"gpu-nodes": {"hosts": {"node1": hv}}}}}


def _runner(job, installed, ident, inventory):  # noqa: F811
    pdd = job["base"] / ident
    shutil.copytree(job["project"], pdd / "project")
    (pdd / "env").mkdir()
    (pdd / "env" / "settings").write_text(yaml.safe_dump(job["settings"]))
    (pdd / "env" / "extravars").write_text(yaml.safe_dump(job["answers"]))
    (pdd / "inventory").mkdir()
    (pdd / "inventory" / "hosts.yml").write_text(yaml.safe_dump(inventory))
    proc = _run([VENV_BIN / "ansible-runner", "run", pdd, "-p", TEMPLATE["playbook"], "--ident", ident],
                cwd=pdd, env=installed["env"])
    artifacts = pdd / "artifacts" / ident
    files = sorted((artifacts / "job_events").glob("*.json"), key=lambda p: int(p.name.split("-", 1)[0]))
    return {"rc": proc.returncode, "status": (artifacts / "status").read_text().strip(),
            "stdout": (artifacts / "stdout").read_text(errors="replace"),
            "events": [json.loads(p.read_text()) for p in files]}


def test_progress_lines_keep_a_job_alive_past_an_idle_timeout_shorter_than_the_startup(job, installed, procs):  # noqa: F811
    node = job["node"]
    old = node.start_server_by_hand(node.server_args(), log_name="by-hand.log")

    run = _runner(job, installed, "progress", _inventory(node, INTERVAL_S, "lpm"))
    procs.track_pid_file(node.pid_file)
    assert run["rc"] == 0 and run["status"] == "successful", "rc %s %s\n%s" % (run["rc"], run["status"], run["stdout"][-5000:])
    new = node.server_pid()
    assert new and alive(new) and not alive(old)
    assert node.server_info()["schedule_policy"] == "lpm"
    lines = PROGRESS.findall(run["stdout"])
    # At least one line per idle_timeout of the startup, or the runner would have ended the job.
    assert len(lines) >= SLOW_STARTUP_S // IDLE_TIMEOUT_S, run["stdout"][-5000:]
    assert "step launching" in run["stdout"] and "Load weight" in run["stdout"], run["stdout"][-5000:]
    events = [e for e in run["events"] if PROGRESS.search(e.get("stdout") or "")]
    assert len(events) >= len(lines) and {e["event"] for e in events} == {"verbose"}, [e.get("event") for e in events]
    assert node.api_key not in run["stdout"] + json.dumps(run["events"])

    # The same job with the progress lines off: the startup is silent for longer than idle_timeout.
    quiet = _runner(job, installed, "quiet", _inventory(node, 0, "fcfs"))
    procs.track_pid_file(node.pid_file)
    assert quiet["status"] == "timeout" and quiet["rc"] != 0, "rc %s %s\n%s" % (quiet["rc"], quiet["status"], quiet["stdout"][-3000:])
    assert not PROGRESS.search(quiet["stdout"])
    # The node goes on without the controller (docs/awx.md): the module finishes the launch and the journal says so.
    holder = node.lease_holder() or {}
    wait_for(lambda: node.journal().get("step") in ("launched", "rolled_back", "failed"), 120, 0.5,
             what="the replace module to finish on the node")
    if holder.get("node_pid"):
        wait_for(lambda: not alive(holder["node_pid"]), 30, what="the replace module to exit")
    procs.track_pid_file(node.pid_file)
    assert node.journal()["step"] == "launched", node.journal()
    assert node.server_info()["schedule_policy"] == "fcfs"
