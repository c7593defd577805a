"""The repository as an AWX project, with the collection installed from its tarball somewhere else.

This is how AWX runs a job template of docs/awx.md: it checks the project (this repository) out, copies
it into the job's private data directory as ``project/``, and runs ``ansible-runner`` with the template's
playbook path relative to the project root (``docs/awx/runner-example/project/redeploy.yml``), from the
project root: so the repository's ``ansible.cfg`` applies. The collection is not in the checkout: it comes
from the execution environment's collection path. Here:

- the tarball of ``make build`` is installed with ``ansible-galaxy collection install`` into
  ``~/.ansible/collections`` of a home directory of this test (one of ansible-core's default collection
  paths; the EE's ``/usr/share/ansible/collections`` is the other one, which a test cannot write);
- ``project/`` is the checkout as git lists it (what an SCM checkout holds: no ``.collections`` link,
  no ``.venv``), ``inventory/`` holds the simulated node, ``env/`` the example's settings and its extra
  variables (the survey's answers) without the router URL (no router here);
- ``ansible-runner run`` (the CLI, as AWX's worker starts it) runs with an environment that names no
  collection path and no config file: what the project's ``ansible.cfg`` and ansible-core's defaults
  make of it decides where ``gpufleet.sglang`` comes from, and every task of it must come from the
  installed copy.

The job runs twice, as an operator would: job type *Check* (``--check``, what docs/awx.md says it shows)
and then *Run*; then the status playbook. Against a simulated node on this machine
(``playbook_helpers.SimNode``: a hand-started incident server, EAGLE3 topk 1, 16 draft tokens, which
SGLang runs with 2).
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess

import pytest
import yaml

from playbook_helpers import INCIDENT_SPEC, RESOLVED_SPEC, VENV_BIN, SimNode, alive, module_procs  # noqa: E402,F401  # pylint: disable=unused-import

REPO = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs" / "awx" / "runner-example"
TEMPLATE = json.loads((REPO / "docs" / "awx" / "job_template.json").read_text())
TIMEOUT = 540


def _run(argv, **kw):
    kw.setdefault("timeout", TIMEOUT)
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, check=False, **kw)


def _ok(proc, what):
    assert proc.returncode == 0, "%s: rc %d\n%s\n%s" % (what, proc.returncode, proc.stdout[-4000:], proc.stderr[-4000:])
    return proc


def _clean_env(home):
    """What AWX's worker gives a job: no collection path, no config file, a home of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "PYTHON", "VIRTUAL_ENV"))}
    env.update({"HOME": str(home), "PATH": "%s:/usr/local/bin:/usr/bin:/bin" % VENV_BIN, "NO_PROXY": "*", "no_proxy": "*"})
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """``make build``, then the tarball installed into ``~/.ansible/collections`` of a fresh home."""
    galaxy = yaml.safe_load((REPO / "galaxy.yml").read_text())
    tarball = REPO / ".cache" / "build" / ("%s-%s-%s.tar.gz" % (galaxy["namespace"], galaxy["name"], galaxy["version"]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    _ok(_run(["make", "--no-print-directory", "build"], cwd=REPO, env=env), "make build")
    home = tmp_path_factory.mktemp("awx-home")
    env = _clean_env(home)
    install = _ok(_run([VENV_BIN / "ansible-galaxy", "collection", "install", "--offline", tarball], cwd=home, env=env),
                  "ansible-galaxy collection install")
    assert "WARNING" not in install.stdout + install.stderr, install.stdout + install.stderr
    root = home / ".ansible" / "collections" / "ansible_collections" / "gpufleet" / "sglang"
    assert json.loads((root / "MANIFEST.json").read_text())["collection_info"]["version"] == galaxy["version"]
    return {"home": home, "env": env, "root": root}


def _project(dest):
    """The checkout as an SCM checkout holds it: the files git lists (tracked, and new ones it does not ignore)."""
    listing = _ok(_run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO),
                  "git ls-files").stdout
    for rel in filter(None, listing.split("\0")):
        source = REPO / rel
        if source.is_file() and not source.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / rel)
    assert (dest / "ansible.cfg").is_file() and not (dest / ".collections").exists()
    return dest


@pytest.fixture(scope="module")
def job(tmp_path_factory, installed, procs):
    """The project, the node and the job's files; each run gets a private data directory of its own."""
    base = tmp_path_factory.mktemp("awx-job")
    node = SimNode(base / "node", procs)
    # The survey's answers as the example passes them (EAGLE3, topk 1, 16 draft tokens), less the router.
    answers = yaml.safe_load((EXAMPLE / "env" / "extravars").read_text())
    answers.pop("sglang_router_url")
    spec = ("speculative_algorithm", "speculative_eagle_topk", "speculative_num_draft_tokens")
    assert {k: answers["sglang_survey_" + k] for k in spec} == {k: INCIDENT_SPEC[k] for k in spec}
    # The inventory says 8 draft tokens; the survey answer (16) must win, as docs/awx.md says.
    host_vars = node.host_vars(sglang_server_args=node.server_args(speculative_num_draft_tokens=8))
    inventory = {"all": {"children": {"gpu-nodes": {"hosts": {"node1": host_vars}}}}}
    return {"base": base, "project": _project(base / "checkout"), "node": node, "answers": answers,
            "inventory": inventory, "playbook": TEMPLATE["playbook"]}


def _runner(job, installed, ident, playbook=None, cmdline=None):
    """One job: a fresh private data directory (project, inventory, env), then ``ansible-runner run``."""
    pdd = job["base"] / ident
    shutil.copytree(job["project"], pdd / "project")
    (pdd / "env").mkdir()
    shutil.copy(EXAMPLE / "env" / "settings", pdd / "env" / "settings")
    (pdd / "env" / "extravars").write_text(yaml.safe_dump(job["answers"]))
    (pdd / "inventory").mkdir()
    (pdd / "inventory" / "hosts.yml").write_text(yaml.safe_dump(job["inventory"]))
    argv = [VENV_BIN / "ansible-runner", "run", pdd, "-p", playbook or job["playbook"], "--ident", ident]
    if cmdline:
        argv += ["--cmdline", cmdline]
    proc = _run(argv, cwd=pdd, env=installed["env"])
    artifacts = pdd / "artifacts" / ident
    stdout = (artifacts / "stdout").read_text(errors="replace") if (artifacts / "stdout").exists() else proc.stdout
    assert proc.returncode == 0, "ansible-runner run -p %s: rc %d\n%s\n%s" % (
        playbook or job["playbook"], proc.returncode, stdout[-5000:], proc.stderr[-2000:])
    assert (artifacts / "status").read_text().strip() == "successful"
    files = sorted((artifacts / "job_events").glob("*.json"), key=lambda p: int(p.name.split("-", 1)[0]))
    events = [json.loads(p.read_text()) for p in files]
    command = json.loads((artifacts / "command").read_text())
    assert command["cwd"] == str(pdd / "project"), command          # the project root, with its ansible.cfg
    for key in ("ANSIBLE_CONFIG", "ANSIBLE_COLLECTIONS_PATH", "ANSIBLE_COLLECTIONS_PATHS"):
        assert key not in command["env"], command["env"]
    return {"events": events, "artifacts": artifacts, "stdout": stdout, "pdd": pdd}


def _task_results(run, task):
    return [e["event_data"]["res"] for e in run["events"]
            if e.get("event") == "runner_on_ok" and e["event_data"].get("task") == task]


def _assert_from_the_installed_copy(run, installed):
    paths = {e["event_data"]["task_path"].rsplit(":", 1)[0] for e in run["events"]
             if e.get("event") == "playbook_on_task_start" and "/gpufleet/sglang/" in e["event_data"].get("task_path", "")}
    assert paths, "no task of gpufleet.sglang ran"
    stray = sorted(p for p in paths if not p.startswith(str(installed["root"]) + "/"))
    assert not stray, "tasks of gpufleet.sglang from outside the installed copy: %s" % stray
    text = "\n".join(e.get("stdout") or "" for e in run["events"])
    assert "[WARNING]" not in text and "[DEPRECATION WARNING]" not in text, text[-4000:]


def _report(node, before):
    new = sorted(set(node.reports.glob("*-redeploy.json")) - before)
    assert len(new) == 1, new
    rows = json.loads(new[0].read_text())
    assert [r["host"] for r in rows] == ["node1"], rows
    return rows[0]


def test_the_project_runs_the_runner_example_from_the_installed_tarball(job, installed, procs):
    node = job["node"]
    old_pid = node.start_server_by_hand(node.server_args(), log_name="incident.log")
    assert node.server_info()["speculative_num_draft_tokens"] == 2          # the incident, as SGLang runs it

    # Job type "Check" (--check, as AWX passes it; "Show changes" adds --diff): the read-only preflight.
    before = set(node.reports.glob("*-redeploy.json"))
    check = _runner(job, installed, "check", cmdline="--check --diff")
    _assert_from_the_installed_copy(check, installed)
    plan = _task_results(check, "Show the plan")
    assert len(plan) == 1, check["stdout"][-4000:]
    lines = plan[0]["msg"]
    # What it shows (docs/awx.md): the action and the running server by PID, the changes SGLang would make, and
    # every process holding a target GPU by PID with its class: the incident server's, which the teardown would stop.
    assert lines[0].startswith("node1: restart (the running server (PID %d, adopted" % old_pid), lines
    assert any(line.startswith("speculative_num_steps: 1 -> 15 [policy.honor_draft_tokens") for line in lines), lines
    assert any(line.startswith("GPU holder PID ") and "(adopted," in line for line in lines), lines
    row = _report(node, before)
    assert row["status"] == "planned" and row["plan"] == "restart", row
    assert row["planned_teardown"] == [old_pid], row["planned_teardown"]
    assert node.server_pid() is None and alive(old_pid)                     # nothing was touched
    assert node.server_info()["speculative_num_draft_tokens"] == 2

    # Job type "Run".
    before = set(node.reports.glob("*-redeploy.json"))
    run = _runner(job, installed, "run")
    procs.track_pid_file(node.pid_file)
    _assert_from_the_installed_copy(run, installed)
    row = _report(node, before)
    assert row["status"] == "deployed" and row["step"] == "done", row
    # The survey's 16 draft tokens won over the inventory's 8; honor_draft_tokens ran them with 15 steps.
    assert {k: row["effective_args"][k] for k in RESOLVED_SPEC} == RESOLVED_SPEC
    assert old_pid in [p["pid"] for p in row["signalled"]] and not alive(old_pid)
    new_pid = node.server_pid()
    assert new_pid and alive(new_pid)
    assert {k: node.server_info()[k] for k in RESOLVED_SPEC} == RESOLVED_SPEC
    # set_stats: what AWX shows as the job's artifacts, in the runner's playbook_on_stats event (docs/awx.md).
    for job_run, status in ((check, "planned"), (run, "deployed")):
        stats = [e["event_data"] for e in job_run["events"] if e.get("event") == "playbook_on_stats"]
        published = stats[-1]["artifact_data"]["gpufleet_sglang_redeploy"]
        assert list(published) == ["node1"] and published["node1"]["status"] == status, published
    assert published["node1"]["mode"] == "restart" and published["node1"]["tokens_per_s"] > 0, published
    for path in run["artifacts"].rglob("*"):                                # the API key reached no artifact
        if path.is_file():
            assert node.api_key not in path.read_text(errors="replace"), path

    # The project's status playbook shows the new server.
    status = _runner(job, installed, "status", playbook="docs/awx/runner-example/project/status.yml")
    _assert_from_the_installed_copy(status, installed)
    shown = _task_results(status, "Show the status")
    assert len(shown) == 1, status["stdout"][-4000:]
    msg = shown[0]["msg"]
    assert str(msg["health"]) == "200"
    assert msg["speculative"]["speculative_algorithm"] == "EAGLE3"
    assert int(msg["speculative"]["speculative_num_draft_tokens"]) == 16
    assert len(msg["gpus"]) == len(node.status()["gpus"])
