"""sglang_promote: the verified candidate becomes known-good, the journal is settled, the lease released.

``main()`` runs in-process (``patch_module_args``). No process is started: the "server that runs now" is
this test process itself, named in the state file by its PID and start time, as the launcher writes it.
``systemctl`` (the enable at boot) is a small script on PATH that records its argv.
"""
from __future__ import annotations

import json
import os
import re
import signal
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from redeploy_testlib import mode_of, run_module, starttime  # noqa: E402 - after this directory is put on sys.path

from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import journal as journal_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import lease as lease_mod
from ansible_collections.gpufleet.sglang.plugins.modules import sglang_promote

FP = "sha256:" + "ab" * 32
FILES = {"server.json": 0o640, "secrets.json": 0o600, "config.yaml": 0o600, "server.env": 0o600}


class Paths(object):
    def __init__(self, tmp_path):
        self.config_dir = tmp_path / "etc"
        self.candidate = self.config_dir / "candidate"
        self.known_good = self.config_dir / "known-good"
        self.state_dir = tmp_path / "state"
        self.unit_dir = tmp_path / "units"
        self.lease = tmp_path / "lock" / "gpufleet-sglang-unit.lock"
        for d in (self.candidate, self.state_dir, self.unit_dir):
            d.mkdir(parents=True)

    def candidate_files(self, fingerprint=FP, names=tuple(FILES)):
        contents = {
            "server.json": json.dumps({"name": "unit", "fingerprint": fingerprint, "args": {"model_path": "/m"}}) + "\n",
            "secrets.json": json.dumps({"args": {"api_key": "sk-promote-1"}, "env": {"HF_TOKEN": "hf-1"}}) + "\n",
            "config.yaml": 'api-key: "sk-promote-1"\n',
            "server.env": 'HF_TOKEN="hf-1"\n',
        }
        for name in names:
            path = self.candidate / name
            path.write_text(contents[name])
            path.chmod(0o644)          # the copies get their own modes whatever the source has
        return contents

    def running(self, fingerprint=FP, pid=None, start=None):
        pid = pid or os.getpid()
        state = {"pid": pid, "starttime": starttime(pid) if start is None else start, "fingerprint": fingerprint}
        (self.state_dir / "server.state.json").write_text(json.dumps(state))

    def journal(self):
        return journal_mod.read(journal_mod.path_for(str(self.state_dir)))

    def args(self, **extra):
        args = {"name": "unit", "config_dir": str(self.config_dir), "state_dir": str(self.state_dir), "run_id": "R1",
                "lease": {"path": str(self.lease)}}
        args.update(extra)
        return args


@pytest.fixture
def paths(tmp_path, monkeypatch):
    monkeypatch.setattr(sglang_promote.systemd, "running", lambda root="/run/systemd/system": False)
    return Paths(tmp_path)


@pytest.fixture
def systemctl(tmp_path, monkeypatch):
    """A ``systemctl`` on PATH that appends its argv to a file and exits with $FAKE_SYSTEMCTL_RC."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "systemctl.calls"
    script = bindir / "systemctl"
    script.write_text('#!/bin/sh\necho "$@" >> "%s"\n[ -z "$FAKE_SYSTEMCTL_RC" ] || { echo "no such unit" >&2; exit "$FAKE_SYSTEMCTL_RC"; }\n'
                      % log)
    script.chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (bindir, os.environ.get("PATH", "")))
    monkeypatch.setattr(sglang_promote.systemd, "running", lambda root="/run/systemd/system": True)
    return log


def journal_at(paths, run_id, step):
    journal_mod.record(journal_mod.path_for(str(paths.state_dir)), run_id, step, detail="set up by the test")


# ---------------------------------------------------------------------------
# promote=true
# ---------------------------------------------------------------------------

def test_promote_copies_every_file_with_its_mode_settles_the_journal_and_releases(paths, monkeypatch):
    contents = paths.candidate_files()
    paths.running()
    journal_at(paths, "R1", journal_mod.LAUNCHED)
    lease_mod.acquire(str(paths.lease), "R1", ttl=60)
    res = run_module(sglang_promote, paths.args(smoke={"accept_length": 2.9, "tokens_per_s": 1200}), monkeypatch)
    assert res["failed"] is False and res["changed"] is True
    assert res["promoted"] is True and res["known_good"] == {"dir": str(paths.known_good), "fingerprint": FP}
    assert mode_of(paths.known_good) == oct(0o750)
    for name, mode in FILES.items():
        assert (paths.known_good / name).read_text() == contents[name], name
        assert mode_of(paths.known_good / name) == oct(mode), name
    entry = paths.journal()
    assert res["journal_step"] == journal_mod.PROMOTED == entry["step"]
    assert [h["step"] for h in entry["history"]] == ["launched", "verified", "promoted"]
    assert entry["smoke"] == {"accept_length": 2.9, "tokens_per_s": 1200}
    assert entry["known_good"] == {"fingerprint": FP} and entry["candidate"] == {"fingerprint": FP, "pid": os.getpid()}
    assert entry["detail"] == "candidate promoted to known-good"
    assert res["released"] is True and not paths.lease.exists()


def test_promote_removes_a_stale_file_of_the_older_known_good(paths, monkeypatch):
    paths.known_good.mkdir()
    (paths.known_good / "server.env").write_text('HF_TOKEN="old-token"\n')
    (paths.known_good / "config.yaml").write_text('api-key: "old-key"\n')
    paths.candidate_files(names=("server.json", "secrets.json"))        # the new config has no --config file, no env file
    paths.running()
    res = run_module(sglang_promote, paths.args(), monkeypatch)
    assert res["promoted"] is True
    assert sorted(p.name for p in paths.known_good.iterdir()) == ["secrets.json", "server.json"]


def test_promote_of_a_systemd_server_copies_the_unit_0644_and_enables_it(paths, systemctl, monkeypatch):
    contents = paths.candidate_files()
    unit = paths.unit_dir / "sglang-unit.service"
    record = json.loads((paths.candidate / "server.json").read_text())
    unit.write_text("# gpufleet-identity: %s\n[Service]\nExecStart=/bin/true\n" % record["fingerprint"])
    unit.chmod(0o600)
    # systemd: without a state file (systemd started it, at boot), the unit file names the identity it runs.
    res = run_module(sglang_promote, paths.args(manager="systemd", unit_dir=str(paths.unit_dir)), monkeypatch)
    assert res["failed"] is False and res["promoted"] is True
    assert (paths.known_good / "sglang-unit.service").read_text() == unit.read_text()
    assert mode_of(paths.known_good / "sglang-unit.service") == oct(0o644)
    assert mode_of(paths.known_good / "server.env") == oct(0o600)
    assert (paths.known_good / "server.env").read_text() == contents["server.env"]
    assert systemctl.read_text().splitlines() == ["enable -- sglang-unit.service"]


def test_promote_says_so_when_the_enable_fails_after_the_copy(paths, systemctl, monkeypatch):
    paths.candidate_files()
    record = json.loads((paths.candidate / "server.json").read_text())
    (paths.unit_dir / "main.service").write_text("# gpufleet-identity: %s\n[Service]\nExecStart=/bin/true\n"
                                                 % record["fingerprint"])
    monkeypatch.setenv("FAKE_SYSTEMCTL_RC", "5")
    res = run_module(sglang_promote, paths.args(manager="systemd", unit="main.service", unit_dir=str(paths.unit_dir)),
                     monkeypatch)
    assert res["failed"] is True and res["promoted"] is True
    assert res["msg"].startswith("the verified config was promoted, but enabling main.service at boot failed: ")
    assert "no such unit" in res["msg"]
    assert (paths.known_good / "server.json").exists()


@pytest.mark.parametrize("what", ["other config runs", "nothing runs", "pid reused"])
def test_promote_refuses_a_candidate_that_is_not_what_runs(paths, monkeypatch, what):
    paths.candidate_files()
    journal_at(paths, "R1", journal_mod.LAUNCHED)
    lease_mod.acquire(str(paths.lease), "R1", ttl=60)
    if what == "other config runs":
        paths.running(fingerprint="sha256:" + "cd" * 32)
    elif what == "pid reused":
        paths.running(start=starttime(os.getpid()) + 1)
    res = run_module(sglang_promote, paths.args(), monkeypatch)
    assert res["failed"] is True and res["promoted"] is False
    assert res["msg"].startswith("the candidate record (%s) is not the config that runs now (" % FP)
    assert ("sha256:" + "cd" * 32 if what == "other config runs" else "nothing runs") in res["msg"]
    assert not paths.known_good.exists()
    assert paths.journal()["step"] == journal_mod.LAUNCHED
    assert lease_mod.read_holder(str(paths.lease))["owner"] == "R1"      # kept: the failure path settles and releases


def test_promote_without_a_candidate_record(paths, monkeypatch):
    res = run_module(sglang_promote, paths.args(), monkeypatch)
    assert res["failed"] is True and res["msg"] == "there is no candidate record under %s to promote" % paths.candidate


def test_check_mode_changes_nothing(paths, monkeypatch):
    paths.candidate_files()
    paths.running()
    journal_at(paths, "R1", journal_mod.LAUNCHED)
    lease_mod.acquire(str(paths.lease), "R1", ttl=60)
    before = paths.journal()
    res = run_module(sglang_promote, paths.args(), monkeypatch, check=True)
    assert res["failed"] is False and res["changed"] is False
    assert res["promoted"] is False and res["known_good"] == {"dir": str(paths.known_good), "fingerprint": FP}
    assert res["released"] is False and res["journal_step"] == journal_mod.LAUNCHED
    assert not paths.known_good.exists() and paths.journal() == before
    assert lease_mod.read_holder(str(paths.lease))["owner"] == "R1"
    # The outcome path in check mode: nothing recorded either.
    res = run_module(sglang_promote, paths.args(promote=False, outcome="failed"), monkeypatch, check=True)
    assert res["changed"] is False and paths.journal() == before and paths.lease.exists()


# ---------------------------------------------------------------------------
# promote=false: the outcome of a run that ended otherwise
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("outcome, step", [("failed", journal_mod.FAILED), ("rolled_back", journal_mod.ROLLED_BACK),
                                           ("stopped", journal_mod.STOPPED)])
def test_outcome_settles_this_runs_journal_entry(paths, monkeypatch, outcome, step):
    journal_at(paths, "R1", journal_mod.VERIFYING)
    res = run_module(sglang_promote, paths.args(promote=False, outcome=outcome, detail="smoke gate failed"), monkeypatch)
    assert res["failed"] is False and res["changed"] is True and res["promoted"] is False
    entry = paths.journal()
    assert entry["step"] == step == res["journal_step"] and entry["detail"] == "smoke gate failed"
    assert not paths.known_good.exists()


def test_outcome_never_touches_another_runs_entry_or_a_settled_one(paths, monkeypatch):
    journal_at(paths, "R0", journal_mod.LAUNCHING)
    before = paths.journal()
    res = run_module(sglang_promote, paths.args(promote=False, outcome="failed"), monkeypatch)
    assert res["changed"] is False and paths.journal() == before and res["journal_step"] == journal_mod.LAUNCHING
    journal_at(paths, "R1", journal_mod.ROLLED_BACK)                      # already settled by sglang_replace
    before = paths.journal()
    res = run_module(sglang_promote, paths.args(promote=False, outcome="failed"), monkeypatch)
    assert res["changed"] is False and paths.journal() == before and res["journal_step"] == journal_mod.ROLLED_BACK
    # The default outcome records nothing.
    journal_at(paths, "R1", journal_mod.LAUNCHED)
    before = paths.journal()
    res = run_module(sglang_promote, paths.args(promote=False), monkeypatch)
    assert res["changed"] is False and paths.journal() == before


def test_outcome_without_a_journal_writes_none(paths, monkeypatch):
    res = run_module(sglang_promote, paths.args(promote=False, outcome="failed"), monkeypatch)
    assert res["changed"] is False and res["journal_step"] is None
    assert not os.path.exists(journal_mod.path_for(str(paths.state_dir)))


# ---------------------------------------------------------------------------
# The lease
# ---------------------------------------------------------------------------

def test_release_only_this_runs_lease(paths, monkeypatch):
    lease_mod.acquire(str(paths.lease), "R1", ttl=60)
    res = run_module(sglang_promote, paths.args(promote=False, release=False), monkeypatch)
    assert res["released"] is False and res["changed"] is False and paths.lease.exists()
    res = run_module(sglang_promote, paths.args(promote=False), monkeypatch)
    assert res["released"] is True and res["changed"] is True and not paths.lease.exists()
    # Held by another run now (taken over while this run was away): warned, kept.
    lease_mod.acquire(str(paths.lease), "R9", ttl=60)
    res = run_module(sglang_promote, paths.args(promote=False), monkeypatch)
    assert res["failed"] is False and res["released"] is False and res["changed"] is False
    assert len(res["warnings"]) == 1 and "is held by run R9" in res["warnings"][0] and "not by run R1" in res["warnings"][0]
    assert lease_mod.read_holder(str(paths.lease))["owner"] == "R9"
    # No lease at all, or none named: nothing to release.
    res = run_module(sglang_promote, paths.args(promote=False, lease={}), monkeypatch)
    assert res["released"] is False and paths.lease.exists()


# ---------------------------------------------------------------------------
# Bugs found by these tests (they fail until the fix in plugins/modules/sglang_promote.py)
# ---------------------------------------------------------------------------

def test_bug_a_systemd_candidate_that_is_not_what_runs_is_refused_too(paths, monkeypatch):
    """DOCUMENTATION: "With promote=true it checks that the candidate record is the config that runs now". promote()
    compares only when manager == process; the launcher writes the same state record for a systemd server, and here
    it names a live server that runs another config."""
    paths.candidate_files()
    paths.running(fingerprint="sha256:" + "cd" * 32)
    res = run_module(sglang_promote, paths.args(manager="systemd", unit_dir=str(paths.unit_dir)), monkeypatch)
    assert res["failed"] is True and res["promoted"] is False and "is not the config that runs now" in res["msg"]
    assert not paths.known_good.exists()


# ---------------------------------------------------------------------------
# smoke_gate: the smoke gate, then the promotion, in one module run
# ---------------------------------------------------------------------------

@pytest.fixture
def fake_server():
    from test_sglang_smoke import FakeSGLang      # this directory is on sys.path (above)
    fake = FakeSGLang()
    yield fake
    fake.close()


def gate_args(fake, **extra):
    gate = {"url": fake.url, "requests": 4, "concurrency": 2, "max_new_tokens": 64, "metrics_interval": 0.2}
    gate.update(extra)
    return gate


def test_smoke_gate_passes_then_promotes_and_keeps_the_figures(paths, fake_server, monkeypatch):
    paths.candidate_files()
    paths.running()
    journal_at(paths, "R1", journal_mod.LAUNCHED)
    lease_mod.acquire(str(paths.lease), "R1", ttl=60)
    acting, steps = [], []

    def generate(index):
        # While the gate runs, the lease names this module run (this process) as the one acting for its holder,
        # and the journal says so.
        acting.append(lease_mod.read_holder(str(paths.lease)).get("node_pid"))
        steps.append(paths.journal()["step"])
        return 200, {"text": " GPUs are fast.", "meta_info": {"completion_tokens": 64, "spec_verify_ct": 22}}

    fake_server.generate = generate
    res = run_module(sglang_promote, paths.args(smoke_gate=gate_args(fake_server, min_accept_length=2.5)), monkeypatch)
    assert res["failed"] is False and res["promoted"] is True and res["released"] is True, res
    assert res["smoke"]["requests"] == {"sent": 4, "ok": 4, "failed": 0}
    assert res["smoke"]["accept_length"] == pytest.approx(64 / 22.0, abs=1e-3) and res["smoke"]["tokens_per_s"] > 0
    assert fake_server.paths("POST") == ["/generate"] * 4
    assert acting == [os.getpid()] * 4 and steps == ["verifying"] * 4
    entry = paths.journal()
    assert [h["step"] for h in entry["history"]] == ["launched", "verifying", "verified", "promoted"]
    assert entry["smoke"]["accept_length"] == res["smoke"]["accept_length"]
    assert (paths.known_good / "server.json").exists() and not paths.lease.exists()


def test_a_failed_smoke_gate_promotes_nothing_and_keeps_the_lease_for_the_rollback(paths, fake_server, monkeypatch):
    paths.candidate_files()
    paths.running()
    journal_at(paths, "R1", journal_mod.LAUNCHED)
    lease_mod.acquire(str(paths.lease), "R1", ttl=60)
    # The incident: 2 draft tokens, accept length 1.6 against a gate of 2.5.
    fake_server.generate = lambda index: (200, {"text": "x", "meta_info": {"completion_tokens": 64, "spec_verify_ct": 40}})
    res = run_module(sglang_promote, paths.args(smoke_gate=gate_args(fake_server, min_accept_length=2.5)), monkeypatch)
    assert res["failed"] is True and res["failed_step"] == "smoke" and res["promoted"] is False, res
    assert res["msg"] == "Smoke gate failed: accept length 1.60 is below min_accept_length 2.50", res["msg"]
    assert res["smoke"]["accept_length"] == 1.6 and res["released"] is False
    assert not paths.known_good.exists()
    assert paths.journal()["step"] == journal_mod.VERIFYING           # unsettled: the caller's rollback settles it
    assert lease_mod.read_holder(str(paths.lease))["owner"] == "R1"     # still this run's, for the rollback
    assert lease_mod.read_holder(str(paths.lease)).get("node_pid") is None


def test_a_hang_in_the_smoke_gate_names_the_request(paths, fake_server, monkeypatch):
    paths.candidate_files()
    paths.running()
    lease_mod.acquire(str(paths.lease), "R1", ttl=60)
    fake_server.delays = lambda index: 3.0 if index >= 3 else 0.0
    res = run_module(sglang_promote, paths.args(smoke_gate=gate_args(fake_server, concurrency=1, request_timeout=0.5)),
                     monkeypatch)
    assert res["failed"] is True and res["failed_step"] == "smoke", res
    assert re.match(r"Smoke gate failed: request 3 of 4 \(rid gpufleet-smoke-[0-9a-f]{12}-3\) did not answer within 0\.5 s",
                    res["msg"]), res["msg"]


def test_the_smoke_gate_runs_only_for_the_config_that_runs(paths, fake_server, monkeypatch):
    paths.candidate_files()
    paths.running(fingerprint="sha256:" + "cd" * 32)
    res = run_module(sglang_promote, paths.args(smoke_gate=gate_args(fake_server)), monkeypatch)
    assert res["failed"] is True and "is not the config that runs now" in res["msg"], res
    assert fake_server.requests == []                                  # no request sent to the wrong server


@pytest.mark.parametrize("gate, promote, expected", [
    ({"requests": 0}, True, "smoke_gate.requests must be at least 1, got 0; nothing was promoted"),
    ({"timeout": 0}, True, "smoke_gate.timeout must be a positive number of seconds, got 0.0; nothing was promoted"),
    ({}, False, "smoke_gate needs promote=true: the gate decides whether the candidate is promoted"),
])
def test_bad_smoke_gate_settings_are_refused_before_anything(paths, fake_server, monkeypatch, gate, promote, expected):
    paths.candidate_files()
    paths.running()
    lease_mod.acquire(str(paths.lease), "R1", ttl=60)
    res = run_module(sglang_promote, paths.args(promote=promote, smoke_gate=gate_args(fake_server, **gate)), monkeypatch)
    assert res["failed"] is True and res["msg"] == expected, res
    assert fake_server.requests == [] and not paths.known_good.exists() and paths.lease.exists()


def test_check_mode_sends_no_smoke_request(paths, fake_server, monkeypatch):
    paths.candidate_files()
    paths.running()
    res = run_module(sglang_promote, paths.args(smoke_gate=gate_args(fake_server)), monkeypatch, check=True)
    assert res["failed"] is False and res["promoted"] is False, res
    assert res["smoke"] == {"skipped": True, "why": "check mode sends no requests"}
    assert fake_server.requests == [] and not paths.known_good.exists()


def test_the_smoke_gates_api_key_is_sent_and_never_returned(paths, fake_server, monkeypatch):
    paths.candidate_files()
    paths.running()
    lease_mod.acquire(str(paths.lease), "R1", ttl=60)
    fake_server.api_key = "sk-smoke-gate-7"
    res = run_module(sglang_promote, paths.args(smoke_gate=gate_args(fake_server, api_key="sk-smoke-gate-7")), monkeypatch)
    assert res["failed"] is False and res["promoted"] is True, res.get("msg")
    assert {r["auth"] for r in fake_server.requests} == {"Bearer sk-smoke-gate-7"}
    assert "sk-smoke-gate-7" not in json.dumps(res)


def test_a_lease_lost_during_the_smoke_gate_promotes_nothing(paths, fake_server, monkeypatch):
    paths.candidate_files()
    paths.running()
    lease_mod.acquire(str(paths.lease), "R1", ttl=60)

    def generate(index):
        if index == 2:      # another run takes the node over while the gate runs
            lease_mod.release(str(paths.lease), "R1")
            lease_mod.acquire(str(paths.lease), "R2", ttl=60)
        return 200, {"text": "x", "meta_info": {"completion_tokens": 8, "spec_verify_ct": 3}}

    fake_server.generate = generate
    res = run_module(sglang_promote, paths.args(smoke_gate=gate_args(fake_server, concurrency=1)), monkeypatch)
    assert res["failed"] is True and res["promoted"] is False, res
    assert "no longer held by run R1" in res["msg"] and "nothing was promoted" in res["msg"], res["msg"]
    assert not paths.known_good.exists() and lease_mod.read_holder(str(paths.lease))["owner"] == "R2"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_during_the_smoke_gate_records_the_interruption_and_promotes_nothing(paths, fake_server, monkeypatch, sig):
    """A cancelled job (SIGTERM) or a dead controller's connection (SIGHUP) while the gate runs: the journal says
    interrupted at step verifying, nothing is promoted, the lease stays this run's for the rollback (or the next
    run's take-over), and the module's handlers are gone afterwards."""
    paths.candidate_files()
    paths.running()
    journal_at(paths, "R1", journal_mod.LAUNCHED)
    lease_mod.acquire(str(paths.lease), "R1", ttl=60)
    before = signal.getsignal(sig)

    def generate(index):
        if index == 2:
            os.kill(os.getpid(), sig)      # handled in the module's main thread, which waits for the requests
        return 200, {"text": "x", "meta_info": {"completion_tokens": 8, "spec_verify_ct": 3}}

    fake_server.generate = generate
    res = run_module(sglang_promote, paths.args(smoke_gate=gate_args(fake_server, concurrency=1)), monkeypatch)
    name = signal.Signals(sig).name
    assert res["failed"] is True and res["failed_step"] == "smoke" and res["interrupted"] is True, res
    assert res["promoted"] is False and res["released"] is False, res
    assert res["msg"] == "the smoke gate was interrupted by %s; nothing was promoted, the lease is kept for the rollback" % name
    entry = paths.journal()
    assert entry["step"] == journal_mod.INTERRUPTED, entry
    assert entry["detail"] == "interrupted by %s at step verifying (the smoke gate); nothing was promoted" % name
    assert [h["step"] for h in entry["history"]] == ["launched", "verifying", "interrupted"]
    assert not paths.known_good.exists()
    holder = lease_mod.read_holder(str(paths.lease))
    assert holder["owner"] == "R1" and holder.get("node_pid") is None, holder
    assert signal.getsignal(sig) == before


def test_a_lease_taken_over_before_the_gate_sends_nothing_and_leaves_the_journal_alone(paths, fake_server, monkeypatch):
    paths.candidate_files()
    paths.running()
    journal_at(paths, "R2", journal_mod.PLANNED)
    lease_mod.acquire(str(paths.lease), "R2", ttl=60)       # another run holds the node now
    res = run_module(sglang_promote, paths.args(smoke_gate=gate_args(fake_server)), monkeypatch)
    assert res["failed"] is True and res["promoted"] is False, res
    assert res["msg"].startswith("before the smoke gate, ") and "nothing was promoted" in res["msg"], res["msg"]
    assert fake_server.requests == [] and not paths.known_good.exists()
    assert paths.journal()["run_id"] == "R2" and paths.journal()["step"] == journal_mod.PLANNED
    assert lease_mod.read_holder(str(paths.lease))["owner"] == "R2"


def test_a_signal_during_an_http_call_is_not_swallowed_as_a_connection_error():
    """The root cause of a lost SIGHUP: the gate's first /metrics read maps every Exception of urllib to a
    connection error, so an Interrupted raised inside it must be no Exception (the gate went on and promoted)."""
    import http.server
    import threading
    import time as _time
    from ansible_collections.gpufleet.sglang.plugins.module_utils.common import http as http_mod

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the http.server API
            _time.sleep(2.0)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    before = signal.signal(signal.SIGALRM, journal_mod.raise_interrupted)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        started = _time.monotonic()
        with pytest.raises(journal_mod.Interrupted) as info:
            http_mod.request("GET", "http://127.0.0.1:%d/metrics" % server.server_address[1], timeout=10)
        assert _time.monotonic() - started < 1.5
        assert str(info.value) == "interrupted by SIGALRM"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
        server.shutdown()
        server.server_close()
