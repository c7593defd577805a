"""Crash-consistent redeploys (issue 12), through the real playbook against a simulated node.

Every interruption here is a real one: ``ansible-playbook`` runs as a child of the test in its own
session, and the test SIGKILLs, SIGINTs or SIGTERMs it (its PID, or its whole process group, as Ctrl-C
and an AWX cancel do) at a step read from the node journal. Then the same inventory runs again, and
the tests check what the node looks like and what the rerun did: it never reports an unverified
server as fine, never leaves the node without a server, and says what it took over and why.

Each test starts from a fresh simulated node with the good config deployed and promoted.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import time

import pytest

import playbook_helpers
from playbook_helpers import FAST_SERVER_ENV, RESOLVED_SPEC, SimNode, alive, http_get, wait_for

pytestmark = pytest.mark.slow

# What the bad candidate runs: the incident config as SGLang resolves it (2 draft tokens), so the smoke gate
# (min accept length 2.0) fails it, while its prediction and its /server_info agree.
BAD = {"sglang_server_spec_policy": "mirror"}


procs = playbook_helpers.procs  # the shared fixture: what a test started is killed by PID at its end


@pytest.fixture
def node(tmp_path, procs):
    n = SimNode(tmp_path / "node", procs)
    run = n.run()
    assert run.rc == 0 and run.row()["status"] == "deployed", run.summary()
    n.good_pid = n.server_pid()
    return n


def server_spec(node):
    status, info = http_get(node.url + "/server_info", api_key=node.api_key)
    if status != 200:
        return None
    return dict((k, info.get(k)) for k in RESOLVED_SPEC)


def known_good_fingerprint(node):
    return json.loads((node.etc / "known-good" / "server.json").read_text())["fingerprint"]


def bad_vars(node, **extra):
    env = dict(FAST_SERVER_ENV)
    env.update(extra.pop("server_env", {}))
    hv = node.host_vars(server_env=env, **BAD)
    hv.update(extra)
    return hv


def assert_good_server_serves(node):
    assert node.health() == 200
    assert server_spec(node) == RESOLVED_SPEC, server_spec(node)


# --------------------------------------------------------------------------
# 1. An interrupted run never leaves an unverified server reported as fine
# --------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["sigkill-controller", "ctrl-c", "awx-cancel", "sighup-module"])
def test_interrupted_while_the_candidate_starts_then_the_rerun_verifies_and_rolls_back(node, how):
    """SIGKILL of the controller's process group, Ctrl-C (SIGINT to the group), an AWX cancel (SIGTERM to the group),
    and the end of the module's connection as a remote node sees it (SIGHUP to the module process itself, by the PID
    the lease names). Ansible's workers run the module in their own session, so signals to the controller's group
    do not reach it: the module finishes its step on the node (or is stopped by its hangup) and the journal says
    which step the node reached."""
    hv = bad_vars(node, server_env={"SGLANG_SIM_STARTUP_S": "3"})
    ctl = node.spawn_playbook(host_vars=hv)
    entry = ctl.wait_for_step("launching")
    assert entry["candidate"]["fingerprint"] != known_good_fingerprint(node)
    if how == "sighup-module":
        module_pid = node.lease_holder()["node_pid"]
        assert module_pid and alive(module_pid)
        os.kill(module_pid, signal.SIGHUP)
        wait_for(lambda: node.journal()["step"] == "interrupted", 30, what="the module to record its interruption")
        assert "launching" in node.journal()["detail"], node.journal()
    sig = {"sigkill-controller": signal.SIGKILL, "ctrl-c": signal.SIGINT, "awx-cancel": signal.SIGTERM,
           "sighup-module": signal.SIGKILL}[how]
    ctl.kill(sig, group=True)
    rc = ctl.wait()
    assert rc != 0
    journal = node.journal()
    assert journal["step"] in ("launching", "launched", "interrupted"), journal
    candidate = journal.get("candidate", entry["candidate"])
    assert alive(candidate["pid"]), "the candidate server should still be starting on its own"

    rerun = node.run(host_vars=hv)
    row = rerun.row()
    assert row["plan"] == "verify", row
    assert row["status"] == "rolled_back", row
    assert row["step"] == "smoke" and "accept length" in row["error"], row
    assert row["lease"]["took_over"] == entry["run_id"], row["lease"]
    assert "controller" in row["lease"]["took_over_reason"], row["lease"]
    assert_good_server_serves(node)
    assert not alive(candidate["pid"]), "the unverified candidate must be gone after the rollback"
    assert node.journal()["step"] == "rolled_back"
    assert node.lease_holder() is None, "the rerun must release the lease"


def test_interrupted_candidate_that_is_good_is_verified_and_promoted_not_restarted(node):
    hv = node.host_vars(sglang_server_env=dict(node.host_vars()["sglang_server_env"], SGLANG_SIM_STARTUP_S="3"),
                        sglang_smoke_min_accept_length=2.0)
    hv["sglang_server_args"] = dict(hv["sglang_server_args"], schedule_policy="lpm")
    ctl = node.spawn_playbook(host_vars=hv)
    entry = ctl.wait_for_step("launching")
    ctl.kill(signal.SIGKILL, group=True)
    ctl.wait()
    candidate_pid = entry["candidate"]["pid"]
    rerun = node.run(host_vars=hv)
    row = rerun.row()
    assert row["plan"] == "verify" and row["status"] == "deployed", row
    assert node.server_pid() == candidate_pid, "the verified candidate is promoted in place, not restarted"
    assert row["signalled"] == [], row["signalled"]
    assert known_good_fingerprint(node) == entry["candidate"]["fingerprint"]
    third = node.run(host_vars=hv)
    assert third.row()["status"] == "unchanged", third.row()


# A single-node server's smoke gate runs in sglang_promote, with the promotion, in one module run. A slow server
# (20 instead of 90 tok/s) keeps the gate running for a few seconds: long enough to kill something in the middle.
SLOW_GATE = {"SGLANG_SIM_BASE_TPS": "20"}


def slow_gate_vars(node, candidate):
    if candidate == "bad":
        return bad_vars(node, server_env=SLOW_GATE)
    hv = node.host_vars(sglang_server_env=dict(node.host_vars()["sglang_server_env"], **SLOW_GATE))
    hv["sglang_server_args"] = dict(hv["sglang_server_args"], schedule_policy="lpm")
    return hv


@pytest.mark.parametrize("candidate", ["bad", "good"])
def test_controller_killed_during_the_smoke_gate_the_node_decides_and_the_rerun_finishes(node, candidate):
    """The controller dies while promote runs the gate (journal verifying). The module goes on in its own session:
    a good candidate passes and is promoted on the node, and the rerun finds nothing to do; a bad one fails the
    gate, nothing is promoted, the journal stays unsettled, and the rerun verifies it again and rolls it back."""
    hv = slow_gate_vars(node, candidate)
    ctl = node.spawn_playbook(host_vars=hv)
    entry = ctl.wait_for_step("verifying")
    module_pid = node.lease_holder()["node_pid"]
    assert module_pid and alive(module_pid)
    ctl.kill(signal.SIGKILL, group=True)
    assert ctl.wait() != 0
    wait_for(lambda: not alive(module_pid), 120, what="the promote module to finish its gate on its own")
    candidate_pid = entry["candidate"]["pid"]
    assert alive(candidate_pid)
    journal = node.journal()
    if candidate == "good":
        assert journal["step"] == "promoted" and journal["run_id"] == entry["run_id"], journal
        assert node.lease_holder() is None, "the promotion releases the lease"
        assert known_good_fingerprint(node) == entry["candidate"]["fingerprint"]
        row = node.run(host_vars=hv).row()
        assert row["status"] == "unchanged" and row["plan"] == "none", row
        assert node.server_pid() == candidate_pid
        return
    assert journal["step"] == "verifying" and journal["run_id"] == entry["run_id"], journal
    assert node.lease_holder()["owner"] == entry["run_id"], "a failed gate keeps the lease for the rollback"
    assert known_good_fingerprint(node) != entry["candidate"]["fingerprint"]
    row = node.run(host_vars=hv).row()
    assert row["plan"] == "verify" and "stopped at step verifying" in row["plan_why"], row
    assert row["status"] == "rolled_back" and row["step"] == "smoke" and "accept length" in row["error"], row
    assert row["lease"]["took_over"] == entry["run_id"], row["lease"]
    assert_good_server_serves(node)
    assert not alive(candidate_pid), "the unverified candidate must be gone after the rollback"
    assert node.journal()["step"] == "rolled_back" and node.lease_holder() is None


def test_a_hangup_of_the_promote_module_during_the_gate_rolls_back_even_a_good_candidate(node):
    """SIGHUP to the module (a dropped connection, as a remote node sees it) while the gate runs: the journal says
    interrupted at step verifying, nothing is promoted, and the live controller rolls back to known-good: a
    candidate whose gate did not finish is unverified, however good it may be."""
    good_fp = known_good_fingerprint(node)
    hv = slow_gate_vars(node, "good")
    handle = node.start(host_vars=hv)
    wait_for(lambda: node.journal().get("step") == "verifying" or handle.done(), 120, 0.02, what="journal step verifying")
    entry = node.journal()
    assert entry["step"] == "verifying", entry
    module_pid = node.lease_holder()["node_pid"]
    os.kill(module_pid, signal.SIGHUP)
    run = handle.wait()
    assert run.rc != 0
    row = run.row()
    assert row["status"] == "rolled_back" and row["step"] == "smoke", row
    assert "the smoke gate was interrupted by SIGHUP" in row["error"], row["error"]
    steps = [h["step"] for h in node.journal()["history"] if h["run_id"] == entry["run_id"]]
    assert steps[steps.index("verifying"):][:2] == ["verifying", "interrupted"], steps
    assert steps[-1] == "rolled_back" and "promoted" not in steps, steps
    assert known_good_fingerprint(node) == good_fp
    assert_good_server_serves(node)
    assert not alive(entry["candidate"]["pid"])
    assert node.lease_holder() is None


# --------------------------------------------------------------------------
# 2. A dead controller does not block the node, and the node is never left down
# --------------------------------------------------------------------------

@pytest.mark.parametrize("what", ["controller", "controller-and-module"])
def test_controller_killed_during_the_teardown_rerun_takes_over_at_once_and_redeploys(node, what):
    """The old server drains for 4 s after SIGTERM, and the controller dies in the middle of it. Ansible's worker
    runs the module in a session of its own, so the module (sglang_replace) goes on and finishes the launch on
    the node: the rerun waits for it (the lease names it), takes the lease over (its controller is gone) and
    verifies the candidate it left. When the module dies too (SIGKILL by the PID the lease names, as a lost SSH
    connection can end it), the node is left with no server: the rerun takes over at once and deploys."""
    slow = node.host_vars(sglang_server_env=dict(node.host_vars()["sglang_server_env"], SGLANG_SIM_SHUTDOWN_S="4"))
    assert node.run(host_vars=slow, extravars={"sglang_redeploy_force": True}).rc == 0
    old = node.server_pid()
    change = dict(slow)
    change["sglang_server_args"] = dict(slow["sglang_server_args"], schedule_policy="lpm")
    change["sglang_lock_timeout"] = 600          # a wait for the lease would show in the wall time
    ctl = node.spawn_playbook(host_vars=change)
    log = node.logs / "server.log"
    seen = len(log.read_bytes()) if log.exists() else 0
    entry = ctl.wait_for_step("teardown")
    module_pid = node.lease_holder()["node_pid"]
    # The drain has signalled the old server once it logs the SIGTERM (it then drains for 4 s on its own).
    wait_for(lambda: b"SIGTERM received" in log.read_bytes()[seen:], 30, 0.02, what="the old server's SIGTERM")
    ctl.kill(signal.SIGKILL, group=True)
    if what == "controller-and-module":
        os.kill(module_pid, signal.SIGKILL)
    ctl.wait()
    wait_for(lambda: not alive(old), 30, what="the old server to finish its drain")
    holder = node.lease_holder()
    assert holder and holder["owner"] == entry["run_id"], "the dead run's lease stays behind"
    if what == "controller-and-module":
        wait_for(lambda: not alive(module_pid), 10, what="the killed module")
        assert node.health() is None, "no server runs: the old one drained away, no new one was started"
        assert node.journal()["step"] == "teardown"

    began = time.monotonic()
    rerun = node.run(host_vars=change)
    assert time.monotonic() - began < 120, "the rerun must not wait for the dead run's lease"
    row = rerun.row()
    expected_plan = "start" if what == "controller-and-module" else "verify"
    assert row["status"] == "deployed" and row["plan"] == expected_plan, row
    if what == "controller-and-module":
        assert "stopped at step teardown" in row["plan_why"], row["plan_why"]
    assert row["lease"]["took_over"] == entry["run_id"]
    assert "gone" in row["lease"]["took_over_reason"]
    assert any("TOOK OVER" in line for line in rerun.task_result("Show the plan")["msg"])
    assert node.health() == 200


def test_a_live_lease_of_another_machine_waits_then_names_the_holder_and_the_break(node):
    lease = node.lock_path
    lease.mkdir()
    controller = {"host": "ctl-elsewhere", "pid": 4242, "boot_id": "other-boot", "pidns": "pid:[1]"}
    holder = {"owner": "20261201T000000Z-1-0001", "controller": controller,
              "taken_at": time.time(), "renewed_at": time.time(), "expires_at": time.time() + 3600, "ttl": 3600}
    (lease / "holder.json").write_text(json.dumps(holder))
    hv = node.host_vars(sglang_lock_timeout=2)
    hv["sglang_server_args"] = dict(hv["sglang_server_args"], schedule_policy="lpm")
    run = node.run(host_vars=hv)
    row = run.row()
    assert run.rc != 0 and row["status"] == "failed" and row["step"] == "preflight", row
    assert holder["owner"] in row["error"] and "sglang_lease_break" in row["error"] and "ctl-elsewhere" in row["error"]
    assert node.server_pid() == node.good_pid and node.health() == 200, "nothing was touched"
    shown = node.run("break_lease.yml", host_vars=hv)
    assert shown.rc == 0 and (lease / "holder.json").exists(), "showing the holder breaks nothing"
    broken = node.run("break_lease.yml", host_vars=hv, extravars={"sglang_lease_break": holder["owner"]})
    assert broken.rc == 0 and not lease.exists()
    again = node.run(host_vars=hv)
    assert again.row()["status"] == "deployed", again.row()


def test_an_expired_lease_of_another_machine_is_taken_over_and_said(node):
    lease = node.lock_path
    lease.mkdir()
    controller = {"host": "ctl-elsewhere", "pid": 1, "boot_id": "other-boot", "pidns": "pid:[1]"}
    holder = {"owner": "20261201T000000Z-2-0002", "controller": controller,
              "taken_at": time.time() - 900, "renewed_at": time.time() - 900, "expires_at": time.time() - 600, "ttl": 300}
    (lease / "holder.json").write_text(json.dumps(holder))
    run = node.run()
    row = run.row()
    assert row["status"] == "unchanged" and row["lease"]["took_over"] is None, \
        "nothing to do: no lease is needed, so none is taken over"
    hv = node.host_vars()
    hv["sglang_server_args"] = dict(hv["sglang_server_args"], schedule_policy="lpm")
    run = node.run(host_vars=hv)
    row = run.row()
    assert row["status"] == "deployed" and row["lease"]["took_over"] == holder["owner"], row
    assert "deadline passed" in row["lease"]["took_over_reason"]


# --------------------------------------------------------------------------
# 2b. A teardown that signalled nothing changed nothing: no rollback (issue 28 part 2)
# --------------------------------------------------------------------------

REPLACE = "Replace the server in one module run, candidate all"
ROLLBACK = "Replace the server in one module run, known_good all"

# nvidia-smi that misbehaves once the journal shows a run past its plan (step planned and later, not yet settled):
# the preflight of the run still reads the node fine, the teardown's first nvidia-smi call does not. "once": only that
# first call (a marker file remembers it), later calls (the rollback's) work again.
FAULTY_SMI = """#!%(python)s
import json, os, subprocess, sys, time
real, journal, mode, marker = %(real)r, %(journal)r, %(mode)r, %(marker)r
try:
    with open(journal) as fh:
        step = json.load(fh).get("step")
except (OSError, ValueError):
    step = None
if step not in (None, "promoted", "rolled_back", "failed", "stopped") and not (marker and os.path.exists(marker)):
    if marker:
        open(marker, "w").close()
    if mode == "truncate":
        out = subprocess.run([real] + sys.argv[1:], stdout=subprocess.PIPE, check=False).stdout
        sys.stdout.buffer.write(out[:130])
        sys.exit(0)
    time.sleep(120)
os.execv(real, [real] + sys.argv[1:])
"""


def faulty_nvidia_smi(node, mode, once):
    """A directory with a misbehaving ``nvidia-smi`` (FAULTY_SMI) in front of the simulator's; returns host vars that
    put it first on ``sglang_node_environment.PATH`` for a run with a changed config."""
    bindir = node.base / ("faulty-smi-%s-%s" % (mode, "once" if once else "always"))
    bindir.mkdir()
    script = bindir / "nvidia-smi"
    script.write_text(FAULTY_SMI % {"python": str(playbook_helpers.VENV_BIN / "python"),
                                    "real": str(playbook_helpers.SIM_BIN / "nvidia-smi"),
                                    "journal": str(node.state / "journal.json"), "mode": mode,
                                    "marker": str(bindir / "fired") if once else ""})
    script.chmod(0o755)
    hv = node.host_vars()
    hv["sglang_server_args"] = dict(hv["sglang_server_args"], schedule_policy="lpm")
    hv["sglang_node_environment"] = dict(hv["sglang_node_environment"], PATH="%s:%s" % (bindir, node.path_env))
    return hv


@pytest.mark.parametrize("once", [False, True], ids=["every-call", "first-call"])
def test_a_teardown_that_fails_before_any_signal_touches_nothing_and_rolls_nothing_back(node, once):
    """nvidia-smi output cut short (``head -c 130``) from the teardown on: the drain fails before it signals anything.
    Nothing was touched, so nothing is rolled back (the old code "rolled back": it SIGTERMed the healthy old server
    and relaunched it, or, with every call failing, reported "no server" while the old server served); the report's
    node state is what the node shows: the old server listens on its port and answers."""
    hv = faulty_nvidia_smi(node, "truncate", once)
    old = node.server_pid()
    old_tree = node.server_tree()
    run = node.run(host_vars=hv)
    row = run.row()
    replaced = run.task_result(REPLACE)
    assert run.rc != 0 and row["status"] == "failed", row
    assert replaced["failed"] and replaced["failed_step"] == "teardown" and replaced["reason"] == "nothing_touched", replaced
    assert replaced["touched"] is False and replaced["torn_down"] is False
    assert all(not s.get("signals") for s in replaced["signalled"]), replaced["signalled"]
    assert not run.ran(ROLLBACK), "no rollback may run: nothing was torn down"
    assert row["rollback"]["status"] == "not_needed" and row["step"] == "teardown", row
    assert row["signalled"] == [] or all(not s.get("signals") for s in row["signalled"]), row["signalled"]
    fail_msg = run.task_result("Fail the host")["msg"]
    assert "(nothing was touched; the old server still serves: PID %d listens on port %d" % (old, node.port) in fail_msg
    assert fail_msg.endswith(" No rollback: nothing was touched.") and "Rollback" not in fail_msg, fail_msg
    # The node state is observed: the old server's PID on the port, healthy.
    assert row["node_state"].startswith("the old server still serves: PID %d listens on port %d" % (old, node.port)), \
        row["node_state"]
    assert replaced["node"]["listener"]["pid"] == old and replaced["node"]["listener"]["owner"] == "old server"
    assert replaced["node"]["health"] == 200
    # And it is true: the same processes, healthy, with the good config.
    assert node.server_pid() == old and all(alive(pid) for pid in old_tree)
    assert_good_server_serves(node)
    entry = node.journal()
    assert entry["run_id"] == run.run_id and entry["step"] == "failed", entry
    steps = [h["step"] for h in entry["history"] if h["run_id"] == run.run_id]
    assert "rolling_back" not in steps and "torn_down" not in steps, steps
    assert node.lease_holder() is None
    # The next run (nvidia-smi fine again) finds the old server untouched and replaces it as planned.
    again = node.run(host_vars=dict(hv, sglang_node_environment=node.host_vars()["sglang_node_environment"]))
    assert again.row()["status"] == "deployed", again.row()


# --------------------------------------------------------------------------
# 3. Everything is validated before anything is touched
# --------------------------------------------------------------------------

BAD_SETTINGS = [
    ({"sglang_server_health_timeout": 0}, "sglang_server_health_timeout"),
    ({"sglang_server_health_timeout": -5}, "sglang_server_health_timeout"),
    ({"gpu_verify_timeout": -1}, "gpu_verify_timeout"),
    ({"gpu_teardown_term_timeout": -10}, "gpu_teardown_term_timeout"),
    ({"sglang_smoke_timeout": 0}, "sglang_smoke_timeout"),
    ({"sglang_smoke_timeout": ""}, "sglang_smoke_timeout"),          # an explicit -e sglang_smoke_timeout=
    ({"sglang_server_cuda_visible_devices": "0,1", "tp_size": 4}, "sglang_server_cuda_visible_devices"),
    ({"sglang_server_api_key": "sk-line\nbreak"}, "sglang_server_api_key"),
    ({"sglang_server_args": "model_path=/m tp_size=2"}, "sglang_server_args"),
]


@pytest.mark.parametrize("override,names", BAD_SETTINGS, ids=[b[1] + "-" + str(i) for i, b in enumerate(BAD_SETTINGS)])
def test_a_bad_setting_fails_the_preflight_names_the_variable_and_touches_nothing(node, override, names):
    hv = node.host_vars()
    override = dict(override)
    if "tp_size" in override:
        hv["sglang_server_args"] = dict(hv["sglang_server_args"], tp_size=override.pop("tp_size"))
    hv.update(override)
    hv["sglang_server_args"] = hv["sglang_server_args"] if not isinstance(hv["sglang_server_args"], dict) else \
        dict(hv["sglang_server_args"], schedule_policy="lpm")
    before = node.server_pid()
    run = node.run(host_vars=hv)
    row = run.row()
    assert run.rc != 0 and row["status"] == "failed", row
    assert names in row["error"], row["error"]
    assert "Rollback failed" not in row["error"] and row["rollback"]["status"] == "not_needed", row
    assert node.server_pid() == before and node.health() == 200, "the running server must be untouched"
    assert node.lease_holder() is None
    assert "sk-line" not in json.dumps(run.report) and "sk-line" not in run.everything()


# --------------------------------------------------------------------------
# 4. Every place the run writes is checked first
# --------------------------------------------------------------------------

@pytest.mark.parametrize("place", ["sglang_server_config_dir", "sglang_server_state_dir", "sglang_report_dir"])
def test_an_unwritable_place_fails_before_the_teardown(node, place, tmp_path):
    blocker = tmp_path / "a-regular-file"
    blocker.write_text("not a directory\n")
    hv = node.host_vars()
    hv["sglang_server_args"] = dict(hv["sglang_server_args"], schedule_policy="lpm")
    hv[place] = str(blocker / "sub")
    before = node.server_pid()
    run = node.run(host_vars=hv)
    assert run.rc != 0
    assert node.server_pid() == before and node.health() == 200, "nothing may be torn down"
    text = run.everything()
    assert place in text and "not a directory" in text.lower()
    if place != "sglang_report_dir":
        row = run.row()
        assert row["step"] == "preflight" and place in row["error"], row


# --------------------------------------------------------------------------
# 5. Another team's server is never stopped without consent
# --------------------------------------------------------------------------

def test_a_foreign_server_on_the_target_gpus_fails_the_preflight_unless_allowed(node):
    other_port = _free_port()
    foreign_args = dict(model_path=str(node.target), tp_size=2, port=other_port)
    env = dict(node.env, CUDA_VISIBLE_DEVICES="2,3", **FAST_SERVER_ENV)
    proc = node.procs.spawn(node.server_argv(foreign_args), env=env, log=node.logs / "foreign.log")
    wait_for(lambda: http_get("http://127.0.0.1:%d/health" % other_port)[0] == 200, 60, what="the foreign server")
    hv = node.host_vars(sglang_server_cuda_visible_devices="2,3")
    check = node.run(host_vars=hv, check=True)
    holders = check.row()["holders"]
    assert any(h["class"] == "foreign" and h["pid"] != proc.pid for h in holders) or \
        any(h["class"] == "foreign" for h in holders), holders
    run = node.run(host_vars=hv)
    row = run.row()
    assert run.rc != 0 and row["step"] == "preflight", row
    assert "sglang_teardown_foreign" in row["error"] and str(other_port) in row["error"], row["error"]
    assert alive(proc.pid) and http_get("http://127.0.0.1:%d/health" % other_port)[0] == 200
    assert node.server_pid() == node.good_pid and node.health() == 200
    allowed = node.run(host_vars=dict(hv, sglang_teardown_foreign=True))
    assert allowed.row()["status"] == "deployed", allowed.row()
    wait_for(lambda: not alive(proc.pid), 30, what="the foreign server to be stopped")


def test_monitoring_agents_watch_and_never_block_while_a_real_foreign_user_is_refused(node):
    """Issue 28 part 1. Two monitoring agents keep every GPU's device files open and poll (one with /dev/nvidia-uvm,
    one a pure NVML client); another team's process really uses target GPU 1. In the same run the user is refused,
    the agents are watchers (the old preflight refused them too and offered to stop them). With
    sglang_teardown_foreign the user is stopped and the redeploy goes through: the agents are never signalled, and the
    drain and the GPU gates do not wait for them."""
    agents = [node.monitor(name="nv-exporter"), node.monitor(name="gpustat", uvm=False)]
    starts = dict((pid, playbook_helpers.starttime(pid)) for pid in agents)
    user = node.hold([1], 4000, name="other-team")["pid"]
    hv = node.host_vars()
    hv["sglang_server_args"] = dict(hv["sglang_server_args"], schedule_policy="lpm")
    run = node.run(host_vars=hv)
    row = run.row()
    assert run.rc != 0 and row["step"] == "preflight", row
    assert "held by 1 process(es) that are not this server's: PID %d " % user in row["error"], row["error"]
    assert all("PID %d " % pid not in row["error"] for pid in agents), row["error"]
    classes = dict((h["pid"], h["class"]) for h in row["holders"])
    assert classes[user] == "foreign" and [classes[pid] for pid in agents] == ["watcher", "watcher"], row["holders"]
    assert node.server_pid() == node.good_pid and node.health() == 200, "the running server must be untouched"
    assert node.lease_holder() is None

    allowed = node.run(host_vars=dict(hv, sglang_teardown_foreign=True))
    row = allowed.row()
    assert row["status"] == "deployed", allowed.summary()
    wait_for(lambda: not alive(user), 30, what="the foreign user to be stopped")
    signalled = [s["pid"] for s in row["signalled"]]
    assert user in signalled and not set(agents) & set(signalled), row["signalled"]
    assert [h["class"] for h in row["holders"] if h["pid"] in agents] == ["watcher", "watcher"], row["holders"]
    lines = allowed.task_result("Show the plan")["msg"]
    assert any(line.startswith("GPU holder PID %d (watcher, " % agents[0]) for line in lines), lines
    for pid in agents:
        assert alive(pid, starts[pid]), "monitoring agent %d was signalled" % pid
    assert node.health() == 200

    # And with only the agents on the GPUs, a plain redeploy neither refuses nor waits for them.
    back = node.run()
    assert back.row()["status"] == "deployed", back.summary()
    assert all(alive(pid, starts[pid]) for pid in agents)


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --------------------------------------------------------------------------
# 6. Secrets stay out of records and logs
# --------------------------------------------------------------------------

def test_a_secret_environment_value_is_in_no_record_and_the_log_is_private(node):
    token = "hf_itmarker_" + os.urandom(6).hex()
    hv = node.host_vars(sglang_server_env=dict(node.host_vars()["sglang_server_env"], HF_TOKEN=token))
    run = node.run(host_vars=hv)
    assert run.row()["status"] == "deployed", run.row()
    for rel in ("candidate/server.json", "known-good/server.json"):
        text = (node.etc / rel).read_text()
        assert token not in text and "HF_TOKEN" in text, rel
    secrets_file = node.etc / "known-good" / "secrets.json"
    assert secrets_file.stat().st_mode & 0o077 == 0 and token in secrets_file.read_text()
    assert (node.logs / "server.log").stat().st_mode & 0o077 == 0, "the server log holds SGLang's echo of its args"
    assert token not in run.everything() and token not in json.dumps(run.report)
    assert token in open("/proc/%d/environ" % node.server_pid(), "rb").read().decode("utf-8", "replace")


def test_no_secret_is_printed_at_vvv_on_the_happy_the_refused_and_the_rollback_path(node):
    """Issue 28 part 3: every secret form, grepped in everything three ``-vvv`` runs produced (events, stdout, artifacts):
    the API key, the HF token, the admin key, URL credentials, a key password. The happy path deploys with the API key
    variable, HF_TOKEN in the environment and ssl_keyfile_password in the args (which reaches the server unmasked, in
    its 0600 config file); the refused path puts the key, the admin key, hf_token and a URL with a password into the
    args (each refused, by name, before anything is touched); the rollback path crashes a candidate of the happy config
    and relaunches the known-good one with its secrets. The old code printed the merged args at -v."""
    tag = os.urandom(5).hex()
    marks = {"api key": "sk-vvvapi-" + tag, "hf token": "hf_vvvtok" + tag, "admin key": "sk-vvvadmin-" + tag,
             "url password": "urlpw" + tag, "key password": "keypw" + tag}
    env = dict(node.host_vars()["sglang_server_env"], HF_TOKEN=marks["hf token"])
    happy_hv = node.host_vars(sglang_server_api_key=marks["api key"], sglang_server_env=env)
    happy_hv["sglang_server_args"] = dict(happy_hv["sglang_server_args"], ssl_keyfile_password=marks["key password"])
    happy = node.run(host_vars=happy_hv, verbosity=3)
    assert happy.row()["status"] == "deployed", happy.summary()
    config = node.etc / "known-good" / "config.yaml"
    assert marks["key password"] in config.read_text() and config.stat().st_mode & 0o077 == 0
    assert http_get(node.url + "/server_info", api_key=marks["api key"])[0] == 200
    good = node.server_pid()

    refused_hv = dict(happy_hv, sglang_server_args=dict(
        happy_hv["sglang_server_args"], api_key=marks["api key"], admin_api_key=marks["admin key"],
        hf_token=marks["hf token"], encoder_urls=["http://enc:%s@127.0.0.1:9/" % marks["url password"]]))
    refused = node.run(host_vars=refused_hv, verbosity=3)
    row = refused.row()
    assert refused.rc != 0 and row["step"] == "preflight", row
    for field, fix in (("api_key", "sglang_server_api_key"), ("admin_api_key", "remove admin_api_key"),
                       ("hf_token", "HF_TOKEN in sglang_server_env"), ("encoder_urls", "a URL with credentials")):
        assert "sglang_server_args.%s: " % field in row["error"] and fix in row["error"], (field, row["error"])
    assert node.server_pid() == good and node.health() == 200, "nothing may be touched"

    crash_env = dict(env, SGLANG_SIM_CRASH_ON_LOAD="1")
    crash_hv = dict(happy_hv, sglang_server_env=crash_env)
    rolled = node.run(host_vars=crash_hv, verbosity=3)
    assert rolled.row()["status"] == "rolled_back", rolled.summary()
    assert http_get(node.url + "/server_info", api_key=marks["api key"])[0] == 200, "the known-good key must work again"

    for run in (happy, refused, rolled):
        text = run.everything()
        assert "ESTABLISH LOCAL CONNECTION" in text, "not a -vvv run"        # positive control: verbosity 3 printed
        assert marks["key password"] in (run.artifacts.parent / "inventory.json").read_text()
        leaked = [name for name, value in marks.items() if value in text]
        assert not leaked, "%s printed by %s" % (leaked, run.artifacts)
        assert not [name for name, value in marks.items() if value in json.dumps(run.report)]


# --------------------------------------------------------------------------
# 7. Idempotent after a rollback
# --------------------------------------------------------------------------

def test_after_a_rollback_the_known_good_config_is_unchanged_on_the_next_run(node):
    bad = bad_vars(node)
    failed = node.run(host_vars=bad)
    assert failed.row()["status"] == "rolled_back", failed.row()
    good = node.run()
    assert good.row()["status"] == "unchanged", good.row()
    assert good.row()["signalled"] == []


# --------------------------------------------------------------------------
# 8. Messages say what happened
# --------------------------------------------------------------------------

def test_the_report_records_a_wait_for_another_runs_lease(node):
    slow = node.host_vars(sglang_server_env=dict(node.host_vars()["sglang_server_env"], SGLANG_SIM_STARTUP_S="2"))
    slow["sglang_server_args"] = dict(slow["sglang_server_args"], schedule_policy="lpm")
    first = node.spawn_playbook(host_vars=slow)
    entry = first.wait_for_step(("planned", "teardown", "torn_down", "launching"))
    second = node.run(host_vars=slow)
    assert first.wait() == 0
    row = second.row()
    assert row["lease"]["waited_for"] == entry["run_id"] and row["lease"]["waited_s"] > 0, row["lease"]
    assert row["status"] == "unchanged", row
