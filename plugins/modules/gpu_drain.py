# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_drain
short_description: Stop the processes that hold memory on selected NVIDIA GPUs, and only those
version_added: 0.1.0
description:
  - Finds the compute processes that hold memory on the target GPUs (one C(nvidia-smi --query-gpu) and one
    C(nvidia-smi --query-compute-apps) call, or NVML), works out the server each of them belongs to, and stops
    those servers gracefully, escalating to C(SIGKILL) after O(term_timeout).
  - Replaces C(pkill -f ...; pkill -9 -f python3; fuser -k /dev/nvidia*). A process that holds no memory on the
    target GPUs and belongs to no such server is never signalled, whatever its name or command line.
  - "B(Root selection.) For each holder the module signals the root of its server, so that the server can shut
    down gracefully. When the holder runs in the cgroup of a systemd system service, the root is the service's
    main process (C(systemctl show -p MainPID --value UNIT) when systemd runs, otherwise the oldest process of the
    cgroup). Otherwise the root is the holder's ancestor that leads its process group: the SGLang
    C(python -m sglang.launch_server) process when the server was started by systemd, by a shell's job control or
    by C(setsid), while its C(sglang::scheduler_TP*) children hold the memory. The walk never crosses a session
    boundary, so a GPU job that runs in its own session below a notebook or an agent is stopped alone."
  - A root is never PID 1, a shell, session or supervisor program (systemd, init, sshd, login, su, sudo, bash, sh,
    zsh, dash, tmux, screen, conmon, runc, containerd-shim, ...), Ansible's own processes, an O(exclude)d process,
    a process that holds memory only on GPUs outside O(gpus), or an ancestor of the module itself. In those
    cases the holder itself is signalled instead, and RV(not_signalled) says why the root was not used.
  - "B(Signals.) O(signal) (default C(SIGTERM)) goes to each root first. When every root has exited, the others
    get one more second; when O(term_timeout) expires, C(SIGKILL) goes to the roots, their descendants in the same
    session and the holders. The module then waits up to O(kill_timeout) for them to be gone; a zombie whose last
    thread has exited counts as gone. Each process is pinned by PID and start time (through a pidfd where the
    kernel has them), so a signal can never reach a process that reused a PID."
  - "B(Members.) Each server also takes every process of its session (when its root leads the session, as a
    server started with C(setsid) does), of its process group (when its root leads the group, as a shell job does)
    and of its systemd service's cgroup, including processes whose parent died before the drain (reparented to
    PID 1 or a subreaper) and processes that hold no GPU memory now, such as a scheduler that freed its memory but
    keeps its ports. When a holder's server is already dead, the other processes of that dead leader's process
    group (and of its session, when the leader also led the session) are taken with it. Members get O(signal)
    themselves (no root tears them down) and C(SIGKILL) after O(term_timeout); they are RV(signalled[].role)
    V(member)."
  - Holder PIDs that nvidia-smi lists but C(/proc) does not show (another PID namespace, process name
    C([Not Found])) and holders whose C(/proc) entry has no descriptor open on a GPU device (O(device_paths))
    are never signalled; they are reported in RV(not_signalled) with a hint.
  - "B(Unexpected holders.) With O(expected_pids), a GPU holder that would be signalled and belongs to none of
    them (not one of them, not their descendant, not in their process group or session) is unexpected: with
    O(on_unexpected=fail) the task fails before anything is signalled, naming each one (PID, user, command line
    with secrets masked, listening ports); with O(on_unexpected=signal) it is stopped too and a warning names it."
  - Any targeted process still running after O(kill_timeout) (for example in state C(D), stuck in the driver)
    makes the task fail with its PID, state and GPUs.
  - This module has nothing to do with the C(nvidia-smi teardown) subcommand, which sets a PCIe drain state so
    that a GPU accepts no new clients and never stops a process.
options:
  gpus:
    description:
      - GPUs to teardown, each an index (V(3)), a UUID (V(GPU-...)) or a PCI bus id (V(00000000:18:00.0)).
      - An empty list means every GPU of the node.
    type: list
    elements: raw
    default: []
  match:
    description:
      - Python regular expressions that narrow the targets. A holder is drained only when one of them matches
        (C(re.search)) the command line or process name of the holder or of its root.
      - When set, explicit O(pids) must match too, which guards against a recorded PID that was reused.
      - An empty list drains every holder on the target GPUs.
    type: list
    elements: str
    default: []
  expected_pids:
    description:
      - The processes the caller planned to stop (for example the server PIDs a preflight classified as ours).
      - A GPU holder on the target GPUs that is not one of them, their descendant, or in the process group or session
        they lead is reported in RV(unexpected), and O(on_unexpected) decides what happens.
      - An empty list turns the check off.
    type: list
    elements: int
    default: []
  on_unexpected:
    description:
      - What to do when O(expected_pids) is set and an unexpected holder is found.
      - V(fail) fails before any signal is sent, naming each one; V(signal) stops it with the rest and warns.
    type: str
    default: signal
    choices: [fail, signal]
  pids:
    description:
      - Explicit roots, for example the recorded PID of a server's main process. They get O(signal) like the roots
        found from the GPU holders, and their trees get C(SIGKILL) after O(term_timeout).
      - They add to the holders found on the GPUs; they do not narrow them (use O(match) for that).
      - The same refusals apply as for found roots (PID 1, shells, supervisors, excluded processes, ancestors of
        the module, processes holding memory only outside O(gpus)).
    type: list
    elements: int
    default: []
  exclude:
    description:
      - Processes that are never signalled. Each entry is a process name or a Python regular expression that must
        match in full (C(re.fullmatch)) the process name (C(comm)), the basename of its executable (C(argv[0])) or
        the whole command line; use C(.*) to match part of a command line, for example C(.*my_job\.py.*).
      - The default protects the daemons that keep GPU device files open (persistence daemon, DCGM host engine
        and exporter, Fabric Manager, X servers, CUDA MPS control daemon and server). Setting this option
        replaces the list, so repeat the defaults you want to keep.
      - An excluded holder is reported in RV(not_signalled); its memory stays allocated.
    type: list
    elements: str
    default:
      - nvidia-persistenced
      - nv-hostengine
      - dcgm
      - dcgm-exporter
      - nvidia-fabricmanager
      - nv-fabricmanager
      - Xorg
      - Xwayland
      - nvidia-cuda-mps-control
      - nvidia-cuda-mps-server
  term_timeout:
    description:
      - Seconds to wait after O(signal) before C(SIGKILL). SGLang drains its requests and then waits up to 15 s for
        its schedulers, so leave it room. The same default as the roles' C(gpu_teardown_term_timeout).
    type: float
    default: 60
  kill_timeout:
    description:
      - Seconds to wait after C(SIGKILL) for the processes to be gone.
    type: float
    default: 15
  signal:
    description:
      - The first signal sent to each root. V(SIGQUIT) makes SGLang kill its whole tree at once; V(SIGKILL) skips
        the graceful phase.
    type: str
    default: SIGTERM
    choices: [SIGTERM, SIGINT, SIGQUIT, SIGHUP, SIGUSR1, SIGUSR2, SIGKILL]
  reset_orphaned:
    description:
      - After the teardown, reset each target GPU that still holds more than O(max_used_mib) with no process listed
        (orphaned memory), with C(nvidia-smi --gpu-reset -i N), after waiting up to O(release_timeout) for memory
        of stopped processes to come back.
      - A GPU is reset only when the preconditions of C(nvidia-smi --gpu-reset) hold. The module runs as root; no
        compute process is listed on any GPU of the node; no process has the GPU's device file open; the GPU
        is not lost. Otherwise the GPU is reported in RV(reset) with the reason and a warning.
    type: bool
    default: false
  max_used_mib:
    description:
      - Memory use at or below this many MiB counts as free when looking for orphaned memory (idle H100 and H200
        GPUs show 0 to 4 MiB).
    type: int
    default: 16
  mig_max_used_mib:
    description:
      - The same limit for a GPU in MIG mode (C(mig.mode.current) reads C(Enabled)), whose instances keep 55 to 59 MiB
        in use on an idle H200; the larger of this and O(max_used_mib) applies.
      - The collection treats a MIG GPU as one whole GPU; MIG instances are not selected or reset one by one.
    type: int
    default: 96
  release_timeout:
    description:
      - With O(reset_orphaned=true), seconds to wait for memory of stopped processes to be released before a GPU
        counts as orphaned. Killed processes release their memory after they exit, usually within seconds.
    type: float
    default: 30
extends_documentation_fragment:
  - gpufleet.sglang.gpu
  - gpufleet.sglang.gpu.command_timeout
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details: Reports what would be signalled and which GPUs would be reset; signals nothing.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: full
    details: The GPU holders before and after the drain (predicted in check mode).
  platform:
    description: Target OS/families that can be operated against.
    support: N/A
    platforms: posix
notes:
  - Run it in the host PID namespace (on the host, or a container with C(--pid=host)); NVML always reports host PIDs.
  - Secrets are masked in every returned command line (C(--api-key), C(--hf-token), C(--admin-api-key), any
    secret-named flag, C(HF_TOKEN=...) words, tokens in URLs), by the collection's one set of rules.
  - The logic lives in C(module_utils/gpu/teardown.py) (C(run_drain)), which other modules run in-process.
  - Check the GPUs afterwards with M(gpufleet.sglang.gpu_memory_assert); memory comes back some time after a
    killed process exits.
seealso:
  - module: gpufleet.sglang.gpu_memory_assert
author:
  - gpufleet maintainers (@gpufleet)
"""

EXAMPLES = r"""
- name: Drain GPUs 0-7 before a redeploy (graceful SIGTERM, SIGKILL after 60 s)
  gpufleet.sglang.gpu_drain:
    gpus: [0, 1, 2, 3, 4, 5, 6, 7]
    term_timeout: 60
  register: drain

- name: Stop only SGLang servers, starting from the recorded main PID
  gpufleet.sglang.gpu_drain:
    gpus: "{{ sglang_gpus }}"
    pids: ["{{ sglang_main_pid | int }}"]
    match: ['sglang']

- name: Show what a drain would stop
  gpufleet.sglang.gpu_drain:
    gpus: [GPU-3c66932a-8c79-1827-26b4-9e54b9346a55]
  check_mode: true
  diff: true

- name: Stop only the server the preflight classified; fail on anyone else's holder
  gpufleet.sglang.gpu_drain:
    gpus: [2, 3]
    expected_pids: "{{ preflight.managed_pids }}"
    on_unexpected: fail

- name: Drain and reset GPUs left with orphaned memory
  gpufleet.sglang.gpu_drain:
    reset_orphaned: true
  become: true

- name: Then prove the GPUs are free
  gpufleet.sglang.gpu_memory_assert:
    timeout: 120
"""

RETURN = r"""
changed:
  description: Whether a signal was sent or a GPU was reset (in check mode, whether one would be).
  returned: always
  type: bool
signalled:
  description:
    - Every targeted process, in signalling order. Roots first, then their same-session descendants, then the
      holders. Descendants and holders that exited with their root have an empty RV(signalled[].signals).
    - In check mode, the processes that would be targeted, with the signals that would be sent first.
  returned: always
  type: list
  elements: dict
  contains:
    pid:
      description: Process id.
      type: int
    ppid:
      description: Parent process id when planned.
      type: int
    name:
      description: Process name (C(comm)).
      type: str
    cmdline:
      description: Command line, secrets masked.
      type: str
    role:
      description: V(root), V(descendant), V(holder) or V(member) (session, process group or cgroup of a server, outside
        its tree).
      type: str
    user:
      description: The process's user.
      type: str
    first_signal:
      description:
        - How the process disposed of O(signal) when it was sent (from C(/proc/PID/status)), for the processes that
          got it; V(ignored) explains an escalation to C(SIGKILL) (a process started from a background shell job
          inherits C(SIGINT) and C(SIGQUIT) ignored).
      type: str
      choices: [default, ignored, caught, blocked]
    root:
      description: PID of the root whose tree this process belongs to.
      type: int
    how:
      description: Why this process is the root, for roots (for example C(process-group leader of holder 4242)).
      type: str
    gpus:
      description: Target GPU indices on which it held memory (empty for non-holders).
      type: list
      elements: raw
    used_mib:
      description: MiB it held on the target GPUs, null when unknown or not a holder.
      type: int
    signals:
      description: Signals sent, in order.
      type: list
      elements: str
    seconds_to_exit:
      description: Seconds from the first signal of its tree until it was seen gone; null if it did not exit.
      type: float
  sample:
    - pid: 4242
      ppid: 1
      name: python3
      cmdline: python3 -m sglang.launch_server --model-path /models/m --api-key ********
      role: root
      root: 4242
      how: process-group leader of holder 4250
      gpus: []
      used_mib:
      signals: [SIGTERM]
      seconds_to_exit: 3.41
not_signalled:
  description:
    - Holders and root candidates that were not signalled, each with the reason.
    - (Named so because Ansible reserves the result key C(skipped) for the task status.)
  returned: always
  type: list
  elements: dict
  sample:
    - pid: 4194999
      name: '[Not Found]'
      gpus: [2]
      reason: listed by nvidia-smi but not visible in /proc (another PID namespace?); run the task in the host PID namespace
survivors:
  description: Targeted processes still running after O(kill_timeout) (the task fails when this is not empty).
  returned: always
  type: list
  elements: dict
  sample:
    - pid: 4250
      name: sglang::schedul
      state: D (uninterruptible sleep)
      gpus: [0, 1]
unexpected:
  description: With O(expected_pids), the GPU holders outside them (PID, user, name, command line, GPUs, root, ports).
  returned: always
  type: list
  elements: dict
  sample:
    - pid: 5120
      user: alice
      name: python3
      cmdline: python3 -m sglang.launch_server --port 31000 --api-key ********
      gpus: [2, 3]
      root: 5120
      ports: [31000]
holders:
  description: The compute processes on the target GPUs before the teardown, one entry per PID.
  returned: always
  type: list
  elements: dict
remaining:
  description:
    - The compute processes still listed on the target GPUs after the drain (a process that has exited can stay
      listed while its memory is being released).
    - In check mode, the holders that would not be targeted.
  returned: always
  type: list
  elements: dict
reset:
  description: One entry per GPU with orphaned memory, saying whether it was reset.
  returned: when O(reset_orphaned=true)
  type: list
  elements: dict
  sample:
    - gpu: 3
      bus_id: 00000000:5D:00.0
      used_mib_before: 512
      used_mib_after: 1
      result: reset
      reason: 512 MiB held by no process
gpus:
  description: Per-GPU readings of the target GPUs after the drain (before it, in check mode).
  returned: always
  type: list
  elements: dict
elapsed:
  description: Seconds the module ran.
  returned: always
  type: float
  sample: 4.21
backend:
  description: Which backend answered the GPU queries (V(nvidia-smi) or V(nvml)).
  returned: always
  type: str
  sample: nvidia-smi
"""

import copy

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import teardown
from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import backends as gpu_backends
from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import target as gpu_target


def main():
    module = AnsibleModule(argument_spec=copy.deepcopy(teardown.ARGUMENT_SPEC), supports_check_mode=True)
    try:
        result = teardown.run_drain(module.params, gpu_target.module_run(module), check_mode=module.check_mode,
                                    warn=module.warn, which=module.get_bin_path)
    except teardown.DrainError as exc:
        result = dict(exc.result)
        if result.pop('missing_lib', None):
            module.fail_json(msg=missing_required_lib('nvidia-ml-py (pynvml)'),
                             exception=str(gpu_backends.PYNVML_IMPORT_ERROR), **result)
        module.fail_json(msg=exc.msg, **result)
    if module._diff:
        result['diff'] = {'before': teardown.holder_lines(result['holders']),
                          'after': teardown.holder_lines(result['remaining'])}
    module.exit_json(**result)


if __name__ == '__main__':
    main()
