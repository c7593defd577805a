# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_preflight
short_description: Inspect a GPU node, resolve the SGLang args as the node's SGLang will, plan the redeploy, take the lease
version_added: 0.1.0
description:
  - The first step of a redeploy, in one module run. It changes nothing on the node until every check
    passed; then, when there is something to do, it takes the node lease and writes the plan into the
    node journal. A failure leaves the running server untouched and serving.
  - Checks every setting it is given in O(settings) (ranges the role argument specs cannot express),
    the parallel layout against the target GPUs, the secrets (no newline), the model and draft paths,
    nvidia-smi and the target GPUs, who listens on the server port, and who holds the target GPUs.
  - Checks the checkpoints of C(model_path) and C(speculative_draft_model_path) as the server will load them, reading
    headers only (docs/reference/checkpoints.md) - every shard C(model.safetensors.index.json) names exists, each
    shard's safetensors header parses and its size matches its tensors' byte ranges, the tokenizer files
    C(tokenizer_config.json) needs are there (not for the draft), and the server's user (O(user)/O(group) with
    O(manager=systemd), else this module's user) can read every file and enter every directory above. A directory
    without weights is refused. The problem names the first broken file, what is wrong and the fix; the result's
    C(node.checkpoints) says what was checked. A O(args) C(load_format) other than C(auto), C(safetensors) or
    C(fastsafetensors) is noted, not checked.
  - Every holder of the target GPUs is classified as C(managed) (the managed server, by its PID file,
    unit, session or recorded session), C(adopted) (the unrecorded server on the managed port, or one
    named by O(adopt_pids) or O(adopt_patterns)), C(orphan) (a leftover whose session leader is gone),
    C(system) (a GPU daemon), C(watcher) (a monitoring agent that only has the device files open, with no compute
    context listed by nvidia-smi on the target GPUs, whose memory the listed processes account for; never
    signalled, never blocking, see docs/reference/gpu-watchers.md) or C(foreign). A foreign holder fails the
    preflight, naming its PID, user, command line (secrets masked) and ports, unless O(allow_foreign=true).
  - A port owner, GPU holder or teardown root that runs in a container (docker, podman, containerd/CRI, CRI-O or
    kubernetes, from its C(/proc/<pid>/cgroup); not this module's own container) is never adopted or signalled; the
    preflight fails naming the container (runtime, id and, where the docker/podman CLI answers C(container inspect),
    name, image and restart policy; the entry's C(container)) and the fix (stop it through its runtime), whatever
    O(allow_foreign) and O(adopt_pids) say, unless the plan adopts that container, a docker or podman container
    (inspected through its CLI) that serves on the managed port while no managed server runs, or one named in
    O(adopt_containers). An adopted container is listed in the plan's C(containers) (runtime, id, name, image, restart
    policy, why, its PIDs; never its environment or command line) and stopped by sglang_replace through its runtime
    (docs/user-guide.md, "Servers in containers").
  - Secrets in O(args) (a secret-named field, a password or token in a URL) are masked in every output from the
    start. Refused, naming the field and the fix, are C(api_key) (use O(api_key)), C(admin_api_key), C(hf_token) (the
    environment's C(HF_TOKEN)) and credentials in a URL. Other secret fields (C(ssl_keyfile_password)) are passed
    on, and C(plan.private_args) names them for M(gpufleet.sglang.sglang_replace).
  - Checks, without changing them, that the config, state and log directories are writable and have
    room (a small probe file, removed at once).
  - Resolves the server args as the node's SGLang will (O(resolution)), then decides the plan's action
    from what runs now, the known-good record and the node journal (RV(plan.action)).
  - With C(--check --diff), returns Ansible's standard RV(diff) (as M(ansible.builtin.template) does) between the launch the
    running server was started with (its record under O(config_dir), rendered again; its command line only for a
    server this collection did not start; empty on a first deploy) and the planned launch, for the server's command line
    (one argument per line), its C(--config) file, its environment and its systemd unit. Secret values (the API key,
    secret fields of the args, secret-named environment variables such as C(HF_TOKEN)) show as C(********),
    followed by "(changed)" where the planned value differs from the running one.
  - Takes the node lease (O(lease)) when the action is not V(none), waits for a live holder, takes over
    an expired lease or one whose controller is provably dead (reported in RV(lease.took_over)), and
    inspects the node again under the lease.
options:
  name:
    description: Server instance name (the unit is C(sglang-<name>.service) unless O(unit) is set).
    type: str
    required: true
  label:
    description: The inventory name of this host, for the messages.
    type: str
    default: ""
  args:
    description: The intended SGLang args (field name to value), as the inventory gives them.
    type: dict
    required: true
  version:
    description: SGLang version that runs on the node, as a string (V('0.5.23')).
    type: str
    default: "0.5.23"
  spec_policy:
    description: How speculative-decoding values that SGLang would change are handled (see the C(sglang_resolve) filter).
    type: str
    choices: [mirror, honor_draft_tokens, strict]
    default: honor_draft_tokens
  resolution:
    description:
      - Who resolves the args. V(node) runs the node's own SGLang (O(python)) on a helper that does what the
        launcher does, without touching the GPUs; V(mirror) uses the collection's model of the rules;
        V(auto) tries the node and falls back to the mirror, saying so in RV(resolved.source).
    type: str
    choices: [auto, node, mirror]
    default: auto
  resolution_timeout:
    description: Seconds the node's SGLang may take to resolve the args (import included).
    type: float
    default: 120
  arch:
    description: Model architecture to resolve with; empty reads it from the model's C(config.json).
    type: str
    default: ""
  manager:
    description:
      - V(systemd), V(process), or V(auto) (systemd when it runs as PID 1).
      - V(docker) or V(podman) run the server in a container from O(image) (see O(container)); the preflight finds or
        pulls the image before anything is touched, records its ID and digest, and resolves the args with the SGLang
        inside it.
    type: str
    choices: [auto, process, systemd, docker, podman]
    default: auto
  unit:
    description: systemd unit name. Default C(sglang-<name>.service).
    type: str
  unit_dir:
    description: Directory of the unit file.
    type: path
    default: /etc/systemd/system
  python:
    description: The server's Python interpreter (it must import C(sglang)).
    type: str
    default: python3
  env:
    description: Extra environment of the server; C(CUDA_VISIBLE_DEVICES) is set from O(gpus).
    type: dict
    default: {}
  chdir:
    description: Working directory of the server.
    type: path
  user:
    description: User the server runs as (systemd).
    type: str
    default: ""
  group:
    description: Group the server runs as (systemd).
    type: str
    default: ""
  environment_file:
    description: An extra EnvironmentFile for the unit.
    type: str
    default: ""
  api_key:
    description: The server's API key (goes through a 0600 C(--config) file, never the command line).
    type: str
  gpus:
    description:
      - GPU indices (or UUIDs) the server uses on this node.
      - Empty, the first GPUs of the node, as many as one node of the parallel layout uses (C(tp_size) x C(pp_size),
        x C(dp_size) without attention DP, over O(nnodes)), once the args passed their checks. The plan returns them as
        C(target_gpus).
    type: list
    elements: str
    default: []
  explicit_gpus:
    description: Whether O(gpus) was given by the user (C(sglang_server_cuda_visible_devices)), for the messages.
    type: bool
    default: false
  nnodes:
    description: Nodes of a multi-node server.
    type: int
    default: 1
  config_dir:
    description: Config directory (candidate and known-good records).
    type: path
    required: true
  state_dir:
    description: State directory (PID file, state file, journal).
    type: path
    required: true
  log_file:
    description: Server log file.
    type: path
    required: true
  nvidia_smi:
    description: nvidia-smi command or path.
    type: str
    default: nvidia-smi
  backend:
    description: GPU query backend.
    type: str
    choices: [auto, nvidia-smi, nvml]
    default: auto
  device_paths:
    description: Device files that GPU users hold open (globs).
    type: list
    elements: str
    default: ["/dev/nvidia*"]
  adopt_pids:
    description: PIDs (with their trees) of unrecorded servers that this deploy may replace.
    type: list
    elements: int
    default: []
  adopt_patterns:
    description: Regular expressions; a GPU holder whose command line (or its session leader's) matches is adopted.
    type: list
    elements: str
    default: []
  adopt_containers:
    description:
      - Names or ids (an id prefix of at least 12 hex digits) of docker or podman containers that hold the managed port
        or the target GPUs and that this deploy replaces. The teardown stops them through their runtime (C(docker update
        --restart=no), then C(docker stop -t) or C(podman stop -t)); a container that serves on the managed port is
        adopted without being named. An entry that names no such container is noted and ignored.
    type: list
    elements: str
    default: []
  allow_foreign:
    description: Let the teardown stop foreign holders of the target GPUs instead of failing.
    type: bool
    default: false
  redeploy_mode:
    description:
      - V(auto) swaps only the weights in place (no teardown) when the intended config differs from the running one in
        the checkpoint only and the checkpoints are compatible, else restarts; V(restart) always restarts;
        V(weights) requires the in-place update and fails the preflight, with the reasons, when it is not possible.
    type: str
    choices: [auto, restart, weights]
    default: auto
  rollback:
    description: Whether a failed redeploy rolls back (the preflight refuses what would make the rollback impossible).
    type: bool
    default: true
  force:
    description: Redeploy even when the healthy server already runs the promoted intended config.
    type: bool
    default: false
  settings:
    description: Role variables to range-check (name to value); see the user guide's variable table.
    type: dict
    default: {}
  lease:
    description:
      - The node lease. Keys C(path) (the lease directory), C(run_id), C(controller) (as the
        C(gpufleet.sglang.controller_facts) action returns it), C(ttl) (seconds), C(timeout) (seconds to
        wait for a live holder), C(acquire) (V(if_needed), V(always) or V(never)) and C(break) (a run id,
        or V(*), whose lease the operator breaks).
    type: dict
    default: {}
  directories:
    description: Directories the server needs; reported in RV(node.directories) with whether they are as they should be.
    type: list
    elements: path
    default: []
  directory_mode:
    description: Permission bits (octal string) of O(directories).
    type: str
    default: "0750"
  directory_owner:
    description: Owner (name or uid) of O(directories). Empty means any.
    type: str
    default: ""
  directory_group:
    description: Group (name or gid) of O(directories). Empty means any.
    type: str
    default: ""
  cache_dir:
    description:
      - Persistent directory of the server's JIT and compile caches (SGLang, DeepGEMM, torch inductor, Triton, CUDA,
        TileLang, FlashInfer, torch extensions), one sub-directory each (docs/reference/compile-caches.md). The launch
        spec's env points each cache variable there, except those set in O(env); the directories are checked like
        O(directories) and returned in the C(dirs) of RV(plan.cache) for the deploy to create.
      - Empty leaves SGLang's and the libraries' own defaults.
    type: path
    default: ""
  cache_min_free_gb:
    description:
      - Free space (GiB) the file system of O(cache_dir) must have; less is a problem (nothing is touched). V(0) turns
        the check off.
    type: float
    default: 20
author:
  - gpufleet maintainers (@gpufleet)
extends_documentation_fragment:
  - action_common_attributes
  - gpufleet.sglang.tls
  - gpufleet.sglang.option_labels
  - gpufleet.sglang.container
attributes:
  check_mode:
    support: full
    details:
      - In check mode the module inspects and plans, and takes no lease; RV(changed) says whether a real run would
        change the node (the plan's action is not V(none)).
  diff_mode:
    support: partial
    details:
      - In check mode with C(--diff) it returns RV(diff), the running server's recorded launch against the planned one.
        In a real run the diff is returned by M(gpufleet.sglang.sglang_replace), the task that changes the node, so a
        run shows it once.
  platform:
    platforms: posix
seealso:
  - module: gpufleet.sglang.sglang_replace
  - module: gpufleet.sglang.sglang_promote
"""

EXAMPLES = r"""
- name: Plan the redeploy and take the lease
  gpufleet.sglang.sglang_preflight:
    name: main
    args: "{{ sglang_server_args }}"
    gpus: ["0", "1", "2", "3", "4", "5", "6", "7"]
    config_dir: /etc/sglang/main
    state_dir: /var/lib/sglang/main
    log_file: /var/log/sglang/main.log
    lease:
      path: /run/lock/gpufleet-sglang-main.lock
      run_id: "{{ sglang_run_id }}"
      timeout: 900
  register: plan
"""

RETURN = r"""
plan:
  description:
    - The plan. Also C(target_gpus), C(manager), C(url), C(argv) (masked), C(fingerprint), C(differences) (field by
      field), C(running), C(holders), C(teardown_pids), C(expected_pids), C(rollback_ready), C(known_good), C(weights),
      C(journal), C(private_args) (the names of the secret fields of the args that are passed on, values never) and
      C(private_env) (the names of the secret-named variables of the env, likewise).
  returned: always
  type: dict
  contains:
    spec:
      description:
        - The one launch spec, built here once (C(name), C(version), C(manager), C(unit), C(unit_dir), C(python),
          C(args) after resolution, C(env) with C(CUDA_VISIBLE_DEVICES), C(chdir), C(user), C(group),
          C(environment_file), C(config_dir), C(state_dir), C(log_file)); secret values masked, the API key left out.
        - The deploy hands it to M(gpufleet.sglang.sglang_replace) with RV(plan.spec_fingerprint).
      returned: always
      type: dict
    spec_fingerprint:
      description: The launch's fingerprint (its identity's digest; secrets enter as salted digests).
      returned: always
      type: str
    spec_identity:
      description: What the fingerprint is made of, field by field (secrets as salted digests), so that a refused spec names the fields.
      returned: always
      type: dict
    action:
      description:
        - V(none) (the healthy server runs the promoted intended config), V(weights) (only the checkpoint changes,
          so the weights are swapped in place; C(weights) says why), V(verify) (the intended config runs but never
          passed the smoke gate, so finish it), V(start) or V(restart).
      returned: always
      type: str
    why:
      description: Why this action.
      returned: always
      type: str
    recovering:
      description: Whether an interrupted run is being finished or rolled back.
      returned: always
      type: bool
    cache:
      description:
        - The compile caches (O(cache_dir)) - C(dir), C(env) (the variables added to the launch env), C(kept) (cache
          variables O(env) sets, left as they are), C(dirs) (to create, owned by the server's user), C(size_bytes),
          C(files), C(size_complete) (false when counting stopped after 10 s), C(free_bytes) and C(min_free_gb).
      returned: always
      type: dict
resolved:
  description: How the args were resolved.
  returned: always
  type: dict
  contains:
    args:
      description: What will be rendered to the server's command line (the intended args after the policy).
      returned: always
      type: dict
    effective:
      description: What the server will run (the node's answer, or the mirror's prediction).
      returned: always
      type: dict
    adjustments:
      description: Every value that differs from the intended one, with the rule and SGLang's log line.
      returned: always
      type: list
      elements: dict
    source:
      description: V(node) (the node's SGLang answered), V(mirror), or V(none) (resolution node, and the node could not answer).
      returned: always
      type: str
    fallback:
      description: Why the node's SGLang was not used (null when it answered).
      returned: always
      type: str
    disagreements:
      description: Fields where the collection's mirror predicts another value than the node's SGLang runs.
      returned: always
      type: list
      elements: dict
node:
  description:
    - C(arch), C(draft_arch), C(systemd), C(gpus) (the target GPUs), C(all_gpus) (every GPU of the node, for a status view),
      C(gpu_count), C(backend), C(gpu), C(port_owner), C(probes).
    - At verbosity 0 each GPU of C(gpus) and C(all_gpus) has C(index), C(used_mib) and C(pids) (its compute processes);
      C(-v) returns the whole reading.
  returned: always
  type: dict
  contains:
    checkpoints:
      description:
        - The checkpoint checks, by arg (C(model_path), C(speculative_draft_model_path)), each with C(path) and
          C(checked); a checked one has C(ok), and C(file) (the first broken file) or C(files), C(tensors), C(bytes),
          C(complete) and C(seconds).
      returned: when a model directory was found
      type: dict
    directories:
      description: The directories the server needs, each with C(path), C(ok) and what is wrong with it.
      returned: always
      type: list
      elements: dict
lease:
  description: C(acquired), C(waited), C(took_over_reason), C(generation), C(state).
  returned: always
  type: dict
  contains:
    took_over:
      description: The previous holder when this run took over an expired lease or one whose controller is dead, else null.
      returned: always
      type: dict
changed:
  description:
    - In a real run, whether the lease was taken for an action; in check mode, whether a real run would change the
      node (the action is not V(none)).
  returned: always
  type: bool
diff:
  description:
    - Ansible's standard diff, one item per part of the launch that differs, in the order command line, C(--config)
      file, environment, systemd unit; empty when nothing differs. The C(--diff) option of C(ansible-playbook) shows
      it as a unified diff.
    - Secret values show as C(********) (followed by "(changed)" where the planned value differs from the running one).
  returned: in check mode with C(--diff)
  type: list
  elements: dict
  contains:
    before:
      description: The running server's text (one argument per line for the command line, C(NAME=value) lines for the environment); empty when nothing runs.
      type: str
      returned: always
    after:
      description: The planned text.
      type: str
      returned: always
    before_header:
      description: "What the before text is, for example C(SGLang server main: command line (running PID 4218, identity 0123456789ab))."
      type: str
      returned: always
    after_header:
      description: "What the after text is, for example C(SGLang server main: command line (planned, identity ba9876543210))."
      type: str
      returned: always
  sample:
    - before: "/usr/bin/python3 -m sglang.launch_server\n    --model-path /models/llama\n    --mem-fraction-static 0.85\n"
      after: "/usr/bin/python3 -m sglang.launch_server\n    --model-path /models/llama\n    --mem-fraction-static 0.8\n"
      before_header: "SGLang server main: command line (running PID 4218, identity 0123456789ab)"
      after_header: "SGLang server main: command line (planned, identity ba9876543210)"
lines:
  description: The plan in readable lines (action and why, the lease, the journal, every adjustment, every GPU holder, every changed field).
  returned: always
  type: list
  elements: str
problems:
  description:
    - Everything that stops the redeploy, each naming what to fix (the module fails when there is any).
    - A failed run at verbosity 0 returns only C(msg), RV(problems), RV(lease) (C(acquired), the waits, the take-over
      and the holder's run as C(holder.owner)), RV(resolved) (C(source), C(fallback)) and RV(plan) (C(action), and
      C(holders) but the managed server's), so that the message is what an operator reads first; C(-v) returns
      every key.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import http
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import names as names_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import lean
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import preflight as plan_mod


def argument_spec():
    return dict(
        name=dict(type="str", required=True),
        label=dict(type="str", default=""),
        args=dict(type="dict", required=True),
        version=dict(type="str", default="0.5.23"),
        spec_policy=dict(type="str", default="honor_draft_tokens", choices=["mirror", "honor_draft_tokens", "strict"]),
        resolution=dict(type="str", default="auto", choices=["auto", "node", "mirror"]),
        resolution_timeout=dict(type="float", default=120),
        arch=dict(type="str", default=""),
        manager=dict(type="str", default="auto", choices=["auto", "process", "systemd", "docker", "podman"]),
        image=dict(type="str"),
        container=dict(type="dict"),
        unit=dict(type="str"),
        unit_dir=dict(type="path", default="/etc/systemd/system"),
        python=dict(type="str", default="python3"),
        env=dict(type="dict", default={}),
        chdir=dict(type="path"),
        user=dict(type="str", default=""),
        group=dict(type="str", default=""),
        environment_file=dict(type="str", default=""),
        api_key=dict(type="str", no_log=True),
        gpus=dict(type="list", elements="str", default=[]),
        explicit_gpus=dict(type="bool", default=False),
        nnodes=dict(type="int", default=1),
        config_dir=dict(type="path", required=True),
        state_dir=dict(type="path", required=True),
        log_file=dict(type="path", required=True),
        nvidia_smi=dict(type="str", default="nvidia-smi"),
        backend=dict(type="str", default="auto", choices=["auto", "nvidia-smi", "nvml"]),
        device_paths=dict(type="list", elements="str", default=["/dev/nvidia*"]),
        adopt_pids=dict(type="list", elements="int", default=[]),
        adopt_patterns=dict(type="list", elements="str", default=[]),
        adopt_containers=dict(type="list", elements="str", default=[]),
        allow_foreign=dict(type="bool", default=False),
        redeploy_mode=dict(type="str", default="auto", choices=["auto", "restart", "weights"]),
        rollback=dict(type="bool", default=True),
        force=dict(type="bool", default=False),
        settings=dict(type="dict", default={}),
        lease=dict(type="dict", default={}),
        directories=dict(type="list", elements="path", default=[]),
        directory_mode=dict(type="str", default="0750"),
        directory_owner=dict(type="str", default=""),
        directory_group=dict(type="str", default=""),
        cache_dir=dict(type="path", default=""),
        cache_min_free_gb=dict(type="float", default=20.0),
    )


def main():
    module = AnsibleModule(argument_spec=dict(argument_spec(), **dict(http.TLS_ARGSPEC, **names_mod.ARGSPEC)), supports_check_mode=True)
    http.configure_module(module)
    result = plan_mod.Preflight(module).run()
    if result.get("problems"):
        msg = result.pop("msg")
        # At verbosity 0 a failure returns what the roles read (the problems, the lease) and not the plan and the
        # node, so that the message is the first thing an operator reads; -v returns everything.
        module.fail_json(msg=msg, **with_invocation(module, result if module._verbosity >= 1 else lean.preflight_failure(result)))
    module.exit_json(**with_invocation(module, result if module._verbosity >= 1 else lean.preflight_result(result)))


def with_invocation(module, result):
    """The result with its ``invocation`` trimmed below -vvv (lean.invocation)."""
    trimmed = lean.invocation(module)
    return dict(result, invocation=trimmed) if trimmed else result


if __name__ == "__main__":
    main()
