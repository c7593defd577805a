# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_promote
short_description: Promote the verified SGLang config to known-good, settle the node journal, release the lease
version_added: 0.2.0
description:
  - The last step of a redeploy, in one module run. With O(promote=true) it checks that the candidate record
    is the config that runs now, copies it (record, 0600 secrets, C(--config) file, env file, unit file) to
    C(<config_dir>/known-good/), enables the unit at boot (systemd), and writes C(promoted) into the node journal.
  - With O(promote=false) it only writes O(outcome) into the journal (when the run ends otherwise) and releases
    the lease.
  - Releases the node lease this run holds (O(release)).
  - With O(smoke_gate), it first runs the smoke gate of M(gpufleet.sglang.sglang_smoke) against the candidate
    (the same requests, figures and gates), keeping the lease alive meanwhile, and promotes only when the gate
    passes. This is the redeploy's last module run on a single-node server. A failed gate promotes nothing, keeps
    the lease for the caller's rollback, and returns RV(failed_step=smoke) with the figures in RV(smoke).
  - While the gate runs, the node journal says C(verifying). A SIGTERM, SIGINT or SIGHUP (a cancelled job, the
    hangup of a dead controller's connection) stops the gate, writes C(interrupted) into the journal, promotes
    nothing and returns RV(failed_step=smoke) with RV(interrupted=true). When the controller dies and the module
    goes on, the gate still decides on the node. A passed gate is promoted, a failed one leaves the journal
    unsettled, and the next redeploy verifies the candidate again, then promotes or rolls back.
options:
  name:
    description: Server instance name.
    type: str
    required: true
  config_dir:
    description: Config directory (candidate and known-good records).
    type: path
    required: true
  state_dir:
    description: State directory (state file and journal).
    type: path
    required: true
  manager:
    description: Process manager of the server.
    type: str
    choices: [process, systemd, docker, podman]
    default: process
  unit:
    description: systemd unit. Default C(sglang-<name>.service).
    type: str
  unit_dir:
    description: Directory of the unit file.
    type: path
    default: /etc/systemd/system
  promote:
    description: Promote the candidate (false only settles the journal and releases the lease).
    type: bool
    default: true
  outcome:
    description:
      - With O(promote=false), the journal step to record (V(failed), V(rolled_back), or V(stopped) after an
        intentional teardown) unless this run's journal entry already settled.
    type: str
    choices: [none, failed, rolled_back, stopped]
    default: none
  detail:
    description: A line for the journal entry (what happened).
    type: str
    default: ""
  smoke:
    description:
      - The smoke gate's figures, kept in the journal with the promotion (a gate run elsewhere).
      - Ignored with O(smoke_gate), whose own figures are kept.
    type: dict
    default: {}
  smoke_gate:
    description:
      - Run the smoke gate first and promote only when it passes. The options are those of
        M(gpufleet.sglang.sglang_smoke), which documents each one in full.
      - Only with O(promote=true). Skipped in check mode (nothing is sent).
    type: dict
    suboptions:
      url:
        description: Base URL of the server.
        type: str
        required: true
      api_key:
        description: Bearer key, when the server runs with C(--api-key).
        type: str
      requests:
        description: Number of requests (150 or more catches the hang after a relaunch that follows a SIGKILL).
        type: int
        default: 8
      concurrency:
        description: Requests in flight at once.
        type: int
        default: 1
      max_new_tokens:
        description: C(sampling_params.max_new_tokens) of every request.
        type: int
        default: 64
      prompt:
        description: Prompt text of every request.
        type: str
        default: Write one sentence about GPUs.
      min_tokens_per_s:
        description: Lowest acceptable throughput in completion tokens per second (V(0) disables the gate).
        type: float
        default: 0
      min_accept_length:
        description: Lowest acceptable speculative accept length (V(0) disables the gate).
        type: float
        default: 0
      accept_length_source:
        description: Which accept length gates (see M(gpufleet.sglang.sglang_smoke)).
        type: str
        choices: [auto, metrics, meta]
        default: auto
      metrics_interval:
        description: Seconds between two reads of C(/metrics) while requests run.
        type: float
        default: 1.0
      timeout:
        description: Overall budget of the gate in seconds.
        type: float
        default: 300
      request_timeout:
        description: Seconds one request may take before it counts as a hang.
        type: float
        default: 120
      disaggregation_mode:
        description: The server's C(--disaggregation-mode); a prefill server is not gated on throughput or accept length.
        type: str
        choices: ["null", prefill, decode]
        default: "null"
  run_id:
    description: This redeploy's run id.
    type: str
    required: true
  lease:
    description: The node lease (C(path)); released when O(release=true).
    type: dict
    default: {}
  release:
    description: Release the lease.
    type: bool
    default: true
  progress_interval:
    description:
      - With O(smoke_gate), seconds between two progress lines while the gate runs (the journal step C(verifying)
        against the gate's C(timeout), the server log's last line, secrets masked); V(0) turns them off. Handled by the
        C(sglang_promote) action, which then runs the module as an async job polled by M(gpufleet.sglang.sglang_progress)
        (docs/user-guide.md, "Progress while the server loads"). The result is the module's, as without progress.
      - Without O(smoke_gate), in check mode or with V(0), the module runs as one plain run.
    type: int
    default: 15
  log_file:
    description: The server's log file, whose last line the progress lines show (only read by the action's progress).
    type: path
author:
  - gpufleet maintainers (@gpufleet)
extends_documentation_fragment:
  - action_common_attributes
  - gpufleet.sglang.tls
  - gpufleet.sglang.option_labels
attributes:
  check_mode:
    support: full
    details: In check mode nothing is copied, recorded or released.
  diff_mode:
    support: none
  platform:
    platforms: posix
seealso:
  - module: gpufleet.sglang.sglang_replace
  - module: gpufleet.sglang.sglang_preflight
  - module: gpufleet.sglang.sglang_smoke
"""

EXAMPLES = r"""
- name: Promote the verified config and release the lease
  gpufleet.sglang.sglang_promote:
    name: main
    config_dir: /etc/sglang/main
    state_dir: /var/lib/sglang/main
    manager: systemd
    run_id: "{{ sglang_run_id }}"
    lease: {path: /run/lock/gpufleet-sglang-main.lock}
    smoke: "{{ smoke_result }}"

- name: Gate the candidate with the smoke requests, then promote it, in one module run
  gpufleet.sglang.sglang_promote:
    name: main
    config_dir: /etc/sglang/main
    state_dir: /var/lib/sglang/main
    run_id: "{{ sglang_run_id }}"
    lease: {path: /run/lock/gpufleet-sglang-main.lock}
    smoke_gate:
      url: http://127.0.0.1:30000
      requests: 150
      min_accept_length: 2.5
"""

RETURN = r"""
promoted:
  description: Whether the candidate became the known-good config.
  returned: always
  type: bool
known_good:
  description: C(dir) and C(fingerprint) of the known-good config after the module.
  returned: always
  type: dict
released:
  description: Whether the lease was released.
  returned: always
  type: bool
journal_step:
  description: The journal step after the module.
  returned: always
  type: str
smoke:
  description:
    - With O(smoke_gate), the gate's figures, as M(gpufleet.sglang.sglang_smoke) returns them
      (C(tokens_per_s), C(accept_length), C(hang), C(requests), ...); V({skipped, why}) in check mode.
  returned: when O(smoke_gate) is set
  type: dict
  sample: {"tokens_per_s": 131.4, "accept_length": 2.95, "accept_length_source": "metrics", "hang": null}
failed_step:
  description: V(smoke) when the smoke gate failed or was interrupted (nothing was promoted and the lease is still held).
  returned: when the smoke gate failed
  type: str
interrupted:
  description: True when a signal stopped the smoke gate (the journal says C(interrupted)).
  returned: when a signal stopped the smoke gate
  type: bool
"""

import os
import signal
import shutil

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import http
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import names as names_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import journal as journal_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import lease as lease_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import records
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import smoke as smoke_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import supervise as sp
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import systemd

FILES = (("server.json", 0o640), ("secrets.json", 0o600), ("config.yaml", 0o600), ("server.env", 0o600))


def copy_private(src, dst, mode):
    with open(src, encoding="utf-8") as fh:
        text = fh.read()
    sp.write_private(dst, text, mode=mode)


def running_fingerprint(state_dir):
    state = sp.read_state(os.path.join(state_dir, "server.state.json")) or {}
    pid = state.get("pid")
    if pid and sp.alive(pid, state.get("starttime")):
        return state.get("fingerprint"), pid
    return None, None


def promote(module, p, gate=None):
    """Check that the candidate record is the config that runs now, run the smoke gate (``gate``, with
    smoke_gate), then copy the record to known-good, enable the unit and settle the journal."""
    candidate = records.candidate_dir(p["config_dir"])
    known_good = records.known_good_dir(p["config_dir"])
    try:
        record = records.read_json(os.path.join(candidate, "server.json"))
    except records.RecordError as exc:
        module.fail_json(msg="the candidate record cannot be promoted: %s; nothing was promoted, run the redeploy again" % exc,
                         promoted=False)
    if record is None:
        module.fail_json(msg="there is no candidate record under %s to promote" % candidate, promoted=False)
    fp, pid = running_fingerprint(p["state_dir"])
    if fp != record.get("fingerprint") and p["manager"] == "systemd":
        # A unit systemd started itself (at boot) names the identity of the config it runs in its unit file.
        unit_file = os.path.join(p["unit_dir"], p["unit"] or "sglang-%s.service" % p["name"])
        try:
            with open(unit_file, encoding="utf-8") as fh:
                fp = records.identity_of(fh.read()) or fp
        except OSError:
            pass
    if fp != record.get("fingerprint"):
        module.fail_json(msg="the candidate record (%s) is not the config that runs now (%s): promote only what was verified; "
                             "run the redeploy again" % (record.get("fingerprint"), fp or "nothing runs"), promoted=False)
    extra = {}
    if p["smoke_gate"] is not None:
        extra["smoke"] = p["smoke"] = gate()
    if module.check_mode:
        return dict(extra, promoted=False, known_good={"dir": known_good, "fingerprint": record.get("fingerprint")})
    if not os.path.isdir(known_good):
        os.makedirs(known_good, 0o750)
    for name, mode in FILES:
        src = os.path.join(candidate, name)
        dst = os.path.join(known_good, name)
        if os.path.exists(src):
            copy_private(src, dst, mode)
        elif os.path.exists(dst):
            os.unlink(dst)     # a stale secrets/config file from an older known-good must not come back
    if p["manager"] == "systemd":
        unit = p["unit"] or "sglang-%s.service" % p["name"]
        src = os.path.join(p["unit_dir"], unit)
        if os.path.exists(src):
            shutil.copyfile(src, os.path.join(known_good, unit))
            os.chmod(os.path.join(known_good, unit), 0o644)
        systemctl = module.get_bin_path("systemctl", required=True)
        try:
            systemd.enable(lambda argv: module.run_command(argv, environ_update=dict(systemd.C_ENV)), systemctl, unit)
        except systemd.SystemdError as exc:
            module.fail_json(msg="the verified config was promoted, but enabling %s at boot failed: %s" % (unit, exc),
                             promoted=True)
    journal_path = journal_mod.path_for(p["state_dir"])
    journal_mod.record(journal_path, p["run_id"], journal_mod.VERIFIED, detail="smoke gate passed", smoke=p["smoke"] or None)
    journal_mod.record(journal_path, p["run_id"], journal_mod.PROMOTED, detail=p["detail"] or "candidate promoted to known-good",
                       known_good={"fingerprint": record.get("fingerprint")},
                       candidate={"fingerprint": record.get("fingerprint"), "pid": pid})
    return dict(extra, promoted=True, known_good={"dir": known_good, "fingerprint": record.get("fingerprint")})


def smoke_gate(module, p):
    """Run the smoke gate against the candidate, the lease kept alive meanwhile: its figures, or fail the module
    (nothing promoted, the lease kept for the caller's rollback).

    The journal says V(verifying) while the gate runs, and V(interrupted) when a signal (a cancelled job, the
    hangup of a dead controller's connection) stops it: the next run verifies the candidate again, then
    promotes or rolls back."""
    gate = p["smoke_gate"]
    if module.check_mode:
        return {"skipped": True, "why": "check mode sends no requests"}
    lease_path = (p["lease"] or {}).get("path")
    journal_path = journal_mod.path_for(p["state_dir"])
    previous = dict((sig, signal.signal(sig, journal_mod.raise_interrupted)) for sig in journal_mod.STOP_SIGNALS)
    try:
        with lease_mod.KeepAlive(lease_path, p["run_id"]) as keepalive:
            if lease_path and keepalive.lost is not None:
                # Taken over before the gate: the journal is the new holder's now.
                module.fail_json(msg="before the smoke gate, %s; nothing was promoted" % keepalive.lost, promoted=False,
                                 released=False, known_good={})
            _journal(module, journal_path, p["run_id"], journal_mod.VERIFYING,
                     "smoke gate: %d request(s) against %s" % (gate["requests"], gate["url"]))
            summary, problems = smoke_mod.run(gate)
            if lease_path:
                keepalive.beat()       # one last renewal: a take-over between two beats is seen before anything is copied
    except journal_mod.Interrupted as exc:
        _journal(module, journal_path, p["run_id"], journal_mod.INTERRUPTED,
                 "%s at step verifying (the smoke gate); nothing was promoted" % exc)
        module.fail_json(msg="the smoke gate was %s; nothing was promoted, the lease is kept for the rollback" % exc,
                         failed_step="smoke", interrupted=True, promoted=False, released=False, known_good={})
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if problems:
        module.fail_json(msg=smoke_mod.failure_message(problems), failed_step="smoke", smoke=summary, promoted=False,
                         released=False, known_good={})
    if lease_path and keepalive.lost is not None:
        module.fail_json(msg="the smoke gate passed, but %s; nothing was promoted" % keepalive.lost, promoted=False,
                         released=False, known_good={}, smoke=summary)
    return summary


def _journal(module, path, run_id, step, detail):
    """Record ``step``; a journal that cannot be written only warns here (the gate still decides, and the next
    step's write fails the run)."""
    try:
        journal_mod.record(path, run_id, step, detail=detail)
    except OSError as exc:
        module.warn("could not write the node journal %s (step %s): %s" % (path, step, exc))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            config_dir=dict(type="path", required=True),
            state_dir=dict(type="path", required=True),
            manager=dict(type="str", default="process", choices=["process", "systemd", "docker", "podman"]),
            unit=dict(type="str"),
            unit_dir=dict(type="path", default="/etc/systemd/system"),
            promote=dict(type="bool", default=True),
            outcome=dict(type="str", default="none", choices=["none", "failed", "rolled_back", "stopped"]),
            detail=dict(type="str", default=""),
            smoke=dict(type="dict", default={}),
            smoke_gate=dict(type="dict", options=smoke_mod.OPTIONS),
            run_id=dict(type="str", required=True),
            lease=dict(type="dict", default={}),
            release=dict(type="bool", default=True),
            progress_interval=dict(type="int", default=15),   # read by the action plugin (plugins/action/sglang_promote.py)
            log_file=dict(type="path"),                         # read by the action's progress only
            **dict(http.TLS_ARGSPEC, **names_mod.ARGSPEC)
        ),
        supports_check_mode=True,
    )
    http.configure_module(module)
    p = module.params
    result = {"changed": False, "promoted": False, "released": False, "known_good": {}}
    if p["smoke_gate"] is not None:
        if not p["promote"]:
            module.fail_json(msg="smoke_gate needs promote=true: the gate decides whether the candidate is promoted")
        problem = smoke_mod.check_params(p["smoke_gate"], prefix="smoke_gate.")
        if problem:
            module.fail_json(msg=problem + "; nothing was promoted", promoted=False, released=False)
    if p["promote"]:
        result.update(promote(module, p, gate=lambda: smoke_gate(module, p)))
        result["changed"] = result["promoted"]
    elif p["outcome"] != "none" and not module.check_mode:
        path = journal_mod.path_for(p["state_dir"])
        entry = journal_mod.read(path)
        if entry.get("run_id") == p["run_id"] and entry.get("step") not in journal_mod.SETTLED:
            step = {"failed": journal_mod.FAILED, "rolled_back": journal_mod.ROLLED_BACK, "stopped": journal_mod.STOPPED}
            journal_mod.record(path, p["run_id"], step[p["outcome"]], detail=p["detail"] or p["outcome"])
            result["changed"] = True
    lease_path = (p["lease"] or {}).get("path")
    if p["release"] and lease_path and not module.check_mode:
        try:
            released, _holder = lease_mod.release(lease_path, p["run_id"])
        except lease_mod.LeaseLost as exc:
            module.warn(str(exc))
            released = False
        result["released"] = released
        result["changed"] = result["changed"] or released
    result["journal_step"] = journal_mod.read(journal_mod.path_for(p["state_dir"])).get("step")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
