# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_replace
short_description: Replace an SGLang server in one module run (teardown, GPUs free, launch, health and config gate)
version_added: 0.2.0
description:
  - The outage window of a redeploy as one target-side run, so that no controller round trip happens
    while no server serves.
  - Step 1 stops the managed unit (systemd) and drains the target GPUs (the engine of M(gpufleet.sglang.gpu_drain)).
  - Step 2 proves the target GPUs free (the engine of M(gpufleet.sglang.gpu_memory_assert)) and waits for the
    ports the new server binds.
  - Step 3 writes the candidate's files (record, 0600 secrets, C(--config), unit) and starts it (the engine of
    M(gpufleet.sglang.sglang_launch)).
  - Step 4 waits for the health check, compares the server's C(/server_info) with the predicted effective
    config, and proves the GPUs allocated.
  - Writes the node journal (C(<state_dir>/journal.json)) at every step and renews the node lease while it
    works, so that an interrupted run (SIGKILL of the controller, Ctrl-C, an AWX cancel) leaves a state the
    next run recognises.
  - With O(rollback=true), a candidate that fails before it is healthy and verified is stopped, the GPUs are
    proven free again, and the last known-good config is relaunched in the same run. Stopping the failed candidate
    signals only what this run started or already stopped (the candidate, the rest of the old server); any other
    holder of the GPUs makes the rollback fail, naming it, and is never signalled.
  - A run that fails before it changed anything (a check before the teardown, or a drain that failed before its first
    signal, for example because nvidia-smi hung or printed a cut-off table) touched nothing, rolls nothing back and
    says so (RV(touched) false, RV(reason) V(nothing_touched)).
  - After a failure, RV(node_state) and RV(node) say what the node shows (who listens on the server's port and answers
    C(/health), which processes hold the target GPUs' device files), never what the run meant to leave.
  - With C(--diff), returns Ansible's standard RV(diff) between the running server's recorded launch and the candidate
    (the same as M(gpufleet.sglang.sglang_preflight) returns in check mode) for the command line, the C(--config) file, the
    environment and the systemd unit, secret values masked.
  - O(target=known_good) relaunches the known-good record (the rollback after a failed smoke gate).
  - O(phase) splits the run for a multi-node server, whose ranks must all be torn down before any starts.
options:
  phase:
    description:
      - V(all), V(teardown) (steps 1-2 only), V(launch) (steps 3-4 only), or V(verify) (step 4 only, on the server
        that already runs the intended config, that is the candidate an interrupted run left unverified).
      - V(weights) swaps the running server's weights in place (C(/update_weights_from_disk)), verifies them with
        C(/model_info) and C(/weights_checker), checks the config and records the new checkpoint; no teardown.
        A failed update that leaves the old weights serving changes nothing; otherwise the module updates back to
        the previous checkpoint (C(previous_model_path) in O(weights)) and, when that fails, restarts the known-good config.
    type: str
    choices: [all, teardown, launch, verify, weights]
    default: all
  target:
    description: V(candidate) (the O(launch) config) or V(known_good) (the record under C(<config_dir>/known-good)).
    type: str
    choices: [candidate, known_good]
    default: candidate
  launch:
    description:
      - The launch, as for M(gpufleet.sglang.sglang_launch), by keys (C(name), C(version), C(manager), C(unit),
        C(unit_dir), C(python), C(args), C(env), C(chdir), C(user), C(group), C(environment_file), C(config_dir),
        C(state_dir), C(log_file), C(health_path), C(health_timeout), C(stop_timeout), C(on_override), C(expect),
        C(adjustments), C(check_config), C(allow_api_key_in_argv), C(record_extra)).
    type: dict
    required: true
  planned:
    description:
      - What the preflight planned, C(fingerprint) (its RV(gpufleet.sglang.sglang_preflight#module:plan.spec_fingerprint))
        and C(identity) (RV(gpufleet.sglang.sglang_preflight#module:plan.spec_identity)).
      - With a fingerprint, a candidate launch (O(target=candidate)) whose own fingerprint differs is refused before
        anything is touched (RV(reason) V(spec_mismatch)), naming the fields that differ.
    type: dict
    default: {}
  api_key:
    description: The server's API key (never on the command line; it goes into the 0600 C(--config) file).
    type: str
  secret_args:
    description:
      - Secret fields of the candidate's args (for example C(ssl_keyfile_password)), by name, with their values; they
        replace the masked values of O(launch) C(args) (a plan shows secrets masked) and go into the 0600 C(--config)
        file, never onto a command line or into a record. The preflight names them (C(plan.private_args)).
    type: dict
    default: {}
  secret_env:
    description:
      - Secret-named variables of the candidate's environment (C(HF_TOKEN), ...) with their values; they replace the
        masked values of O(launch) C(env) (a plan shows secrets masked). The preflight names them (C(plan.private_env)).
    type: dict
    default: {}
  teardown:
    description:
      - The drain, by the keys of M(gpufleet.sglang.gpu_drain) (C(gpus), C(pids), C(match), C(exclude),
        C(term_timeout), C(kill_timeout), C(reset_orphaned), C(nvidia_smi), C(backend), C(device_paths),
        C(expected_pids), C(on_unexpected)), and C(ports), the TCP ports the new server binds, waited for after the
        drain (sockets that only linger in TIME_WAIT do not count).
      - C(containers), the preflight's C(plan.containers) (adopted docker/podman containers with C(runtime), C(id),
        C(name), C(image), C(restart_policy)). With O(target=candidate) each is stopped through its runtime before the
        drain, never signalled from the host (docker C(update --restart=no) first when it has a restart policy, then
        C(<cli> stop -t <term_timeout>), which sends SIGKILL after that), and must be stopped after it. Without a
        known-good config the in-place rollback starts them again (their restart policy restored).
    type: dict
    default: {}
  verify:
    description:
      - The GPU checks, by the keys of M(gpufleet.sglang.gpu_memory_assert) (C(max_used_mib), C(min_used_mib),
        C(require_no_processes), C(timeout), C(sleep)); C(allocated=false) skips the check after the launch.
    type: dict
    default: {}
  lora_adapters:
    description:
      - LoRA adapters (C(name), C(path)) the old server had loaded at runtime; they are loaded again once the new
        server is healthy, before the smoke gate (a runtime adapter vanishes on a restart).
    type: list
    elements: dict
    default: []
  lora_timeout:
    description: Seconds one C(/load_lora_adapter) call may take.
    type: float
    default: 300
  directories:
    description:
      - Directories to create or fix before anything else, as C(paths) with C(mode), C(owner), C(group)
        (what the preflight found missing or wrong).
    type: dict
    default: {}
  weights:
    description:
      - For O(phase=weights), by keys C(weight_version) (default the run id), C(previous_model_path),
        C(previous_weight_version), C(previous_checksum), C(abort_all_requests) (true), C(flush_cache) (true),
        C(timeout) (600), C(issue) (false on ranks 1 and up of a multi-node group, whose update goes through rank 0).
    type: dict
    default: {}
  rollback:
    description: Relaunch the known-good config in this run when the candidate fails before it is verified.
    type: bool
    default: false
  run_id:
    description: This redeploy's run id (journal entries and the lease).
    type: str
    required: true
  lease:
    description: The node lease this run holds (C(path), C(ttl)); renewed while the module works.
    type: dict
    default: {}
  progress_interval:
    description:
      - Seconds between two progress lines while the module runs (the journal step against its budget, the GPU holders,
        the server log's last line, secrets masked); V(0) turns them off. Handled by the C(sglang_replace) action, which then
        runs the module as an async job and polls it with M(gpufleet.sglang.sglang_progress) (docs/user-guide.md,
        "Progress while the server loads"). The result is the module's, as without progress.
      - Without progress (V(0), check mode, a task with C(async), a connection with native async) the module runs as one
        plain run.
    type: int
    default: 15
author:
  - gpufleet maintainers (@gpufleet)
extends_documentation_fragment:
  - action_common_attributes
  - gpufleet.sglang.tls
  - gpufleet.sglang.option_labels
attributes:
  check_mode:
    support: none
  diff_mode:
    support: full
    details:
      - With C(--diff), a candidate's run (O(target=candidate), O(phase) V(all), V(teardown) or V(weights)) returns
        RV(diff), taken before anything is touched. A rollback (O(target=known_good)) returns none.
  platform:
    platforms: posix
seealso:
  - module: gpufleet.sglang.sglang_preflight
  - module: gpufleet.sglang.sglang_promote
  - module: gpufleet.sglang.gpu_drain
  - module: gpufleet.sglang.gpu_memory_assert
  - module: gpufleet.sglang.sglang_launch
"""

EXAMPLES = r"""
- name: Replace the server
  gpufleet.sglang.sglang_replace:
    run_id: "{{ sglang_run_id }}"
    lease: {path: /run/lock/gpufleet-sglang-main.lock}
    launch:
      name: main
      version: "0.5.23"
      manager: systemd
      args: "{{ plan.resolved.args }}"
      config_dir: /etc/sglang/main
      state_dir: /var/lib/sglang/main
      log_file: /var/log/sglang/main.log
    teardown:
      gpus: "{{ plan.plan.target_gpus }}"
      pids: "{{ plan.plan.teardown_pids }}"
    rollback: true
"""

RETURN = r"""
torn_down:
  description: Whether the old server was stopped (or there was none), that is the drain signalled something or finished.
  returned: always
  type: bool
touched:
  description:
    - Whether this run changed what runs on the node (it signalled a process, stopped the unit or started a server).
      A rollback is only ever needed, and only ever runs, after a run that touched the node.
  returned: always
  type: bool
failed_step:
  description: The part that failed (V(teardown), V(launch), V(verify allocated), V(weights)).
  returned: on failure
  type: str
reason:
  description:
    - Why the run failed, as a code for the roles (they never parse the message); V(nothing_touched), V(teardown_failed),
      V(launch_failed), V(stop_failed), V(weights_failed), V(interrupted), V(lease_lost), V(no_known_good) (O(target=known_good)
      and the node has no known-good record) or V(spec_mismatch) (the launch is not the one O(planned) names).
  returned: on failure
  type: str
node:
  description:
    - What the node shows after a failure, C(port), C(listener) (C(pid), C(name), C(owner) such as V(old server) or
      V(candidate); null when nothing listens), C(health) (the HTTP status of C(/health), null when it does not
      answer) and C(gpu_users) (C(pid), C(name), C(gpus), C(owner) of each process with a target GPU's device file open).
  returned: on failure
  type: dict
signalled:
  description: What the teardown signalled (as M(gpufleet.sglang.gpu_drain) returns it).
  returned: always
  type: list
  elements: dict
containers_stopped:
  description:
    - The adopted containers the teardown stopped through their runtime (O(teardown) C(containers)), each with
      C(runtime), C(id), C(name), C(image), C(restart_policy) (as it was), C(restart_policy_set) (docker's policy was
      turned off), C(stopped) and C(status).
  returned: when the teardown ran
  type: list
  elements: dict
containers_restarted:
  description: The same records with C(started) (and C(start_error)), when the rollback had no known-good config.
  returned: when adopted containers were started again
  type: list
  elements: dict
gpus_free:
  description: The target GPUs after the teardown.
  returned: when the teardown ran
  type: list
  elements: dict
gpus_allocated:
  description: The target GPUs once the new server runs.
  returned: when the launch passed
  type: list
  elements: dict
launch:
  description: The launch (pid, url, startup_s, effective, overrides, unverified, log_warnings, record_file), as M(gpufleet.sglang.sglang_launch) returns it.
  returned: when a launch started
  type: dict
weights:
  description: For O(phase=weights), the update (weight versions and checksums before and after, C(/model_info), timings).
  returned: when O(phase=weights)
  type: dict
rollback:
  description: C(status) (succeeded, failed, unavailable) and C(detail) of an in-place rollback.
  returned: when O(rollback=true) and the candidate failed
  type: dict
node_state:
  description:
    - What runs on the node when the module ends, in words; after a failure it is read from the node (RV(node)).
    - "For example: V(the old server still serves: PID 4218 listens on port 30000 and /health answers 200; GPU 0,1
      open by the old server's PIDs 4235,4236) or V(no server: nothing listens on port 30000; no process has GPU 0,1
      open)."
  returned: always
  type: str
steps:
  description: The journal steps this run passed, with seconds since the module started.
  returned: always
  type: list
  elements: dict
lines:
  description: What the run did, in readable lines (signalled, GPUs free, the launch, GPUs allocated, the rollback, the node).
  returned: always
  type: list
  elements: str
diff:
  description:
    - Ansible's standard diff between the running server's recorded launch (its record, rendered again; empty when
      nothing ran) and the candidate, one item (C(before), C(after), C(before_header), C(after_header)) per part that
      differs, in the order command line (one argument per line), C(--config) file, environment, systemd unit, as
      RV(gpufleet.sglang.sglang_preflight#module:diff) describes it.
    - Secret values show as C(********) (followed by "(changed)" where the candidate's value differs from the running one).
  returned: with C(--diff), for O(target=candidate) and O(phase) V(all), V(teardown) or V(weights)
  type: list
  elements: dict
timings:
  description: Seconds per part (teardown_s, verify_free_s, candidate_healthy_s, verify_allocated_s).
  returned: always
  type: dict
details_file:
  description:
    - The node's file (C(<state_dir>/details/<run_id>-replace-<target>-<phase>.json), mode 0600, secrets masked) with
      this run's full result. At verbosity 0 the result leaves out its bulk, so that a failure prints its message
      first and every AWX job event stays small; C(-v) returns the full result instead, and no file.
    - "Left out at verbosity 0: C(effective) (the whole C(/server_info)), C(log_tail) and C(startup_phases) of RV(launch)
      and C(rollback_launch) (the message quotes the last log lines), the drain's C(gpus) and C(holders) (and its
      C(signalled) when it is RV(signalled)), C(model_info) of RV(weights); RV(gpus_free) and RV(gpus_allocated) keep
      C(index), C(used_mib) and C(pids) per GPU."
  returned: at verbosity 0, when the state directory is writable
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import http
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import names as names_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import lean
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import replace as engine


def main():
    module = AnsibleModule(
        argument_spec=dict(
            phase=dict(type="str", default="all", choices=list(engine.PHASES)),
            target=dict(type="str", default="candidate", choices=list(engine.TARGETS)),
            launch=dict(type="dict", required=True),
            api_key=dict(type="str", no_log=True),
            secret_args=dict(type="dict", default={}, no_log=True),
            secret_env=dict(type="dict", default={}, no_log=True),
            teardown=dict(type="dict", default={}),
            verify=dict(type="dict", default={}),
            directories=dict(type="dict", default={}),
            lora_adapters=dict(type="list", elements="dict", default=[]),
            lora_timeout=dict(type="float", default=300),
            weights=dict(type="dict", default={}),
            rollback=dict(type="bool", default=False),
            run_id=dict(type="str", required=True),
            lease=dict(type="dict", default={}),
            planned=dict(type="dict", default={}),
            progress_interval=dict(type="int", default=15),   # read by the action plugin (plugins/action/sglang_replace.py)
            **dict(http.TLS_ARGSPEC, **names_mod.ARGSPEC)
        ),
        supports_check_mode=False,
    )
    http.configure_module(module)
    try:
        result = engine.Replace(module).run()
    except engine.ReplaceFailed as exc:
        module.fail_json(msg=exc.msg, **lean_result(module, exc.result, exc.msg))
    module.exit_json(**lean_result(module, result))


def lean_result(module, result, msg=None):
    """At verbosity 0, the result without its bulk, the full one in a details file on the node (-v returns it whole)."""
    if module._verbosity < 1:
        launch = module.params["launch"] or {}
        details = lean.write_details(launch.get("state_dir"), module.params["run_id"],
                                     "replace-%s-%s" % (module.params["target"], module.params["phase"]),
                                     dict(result, msg=msg) if msg else result)
        result = lean.replace_result(result, details)
    trimmed = lean.invocation(module)
    return dict(result, invocation=trimmed) if trimmed else result


if __name__ == "__main__":
    main()
