# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_memory_assert
short_description: Wait until NVIDIA GPUs are free (or allocated), and explain why when they are not
version_added: 0.1.0
description:
  - Polls the GPU memory and compute processes until every target GPU is in the wanted O(state), or fails after
    O(timeout) seconds with a per-GPU diagnosis and a one-line message a person can act on.
  - Each poll makes at most one C(nvidia-smi --query-gpu) and one C(nvidia-smi --query-compute-apps) call for all GPUs
    together (or reads NVML). There is one deadline on monotonic time, each wait is clamped to the time left,
    and there is no sleep after success.
  - "V(free): used memory within the GPU's own idle baseline, and with O(require_no_processes=true) no compute
    process listed. The baseline is O(max_used_mib) (idle H100 and H200 GPUs show 0 to 4 MiB; never C(used == 0)),
    and for a GPU in MIG mode O(mig_max_used_mib), because its instances keep 55 to 59 MiB in use when idle."
  - "B(MIG.) The module reads C(mig.mode.current) with the memory. A GPU in MIG mode is judged as one whole GPU:
    its memory and processes are the sums over its instances, and MIG instances cannot be selected one by one
    (a C(MIG-...) UUID in O(gpus) is an error naming the fix)."
  - "V(allocated): used memory at least O(min_used_mib) on every target GPU, and with O(require_processes=true) at
    least one compute process. GPUs that are not targeted are not judged."
  - A placeholder such as C([N/A]) or a bare C(N/A) is unknown, never 0, so a GPU whose memory cannot be read never
    passes. Output that does not parse (garbage, a truncated row) is reported as
    C(nvidia-smi output could not be parsed) and polled again; a lost GPU is always in the result (by index when
    the driver names it, as driver 610 does).
  - When the driver is not loaded (nvidia-smi rc 9), the library is missing (rc 12) or does not match the driver
    (rc 18), or no GPU is visible, the module fails at once with a clear message instead of polling.
  - "On failure RV(diagnosis) says for each GPU why. Memory is held by named PIDs (with their command line and
    state from C(/proc), for example C(D) for a process stuck in the driver), or by PIDs that C(/proc) cannot
    see (another PID namespace). Or it is held by no listed process: orphaned, with the C(nvidia-smi --gpu-reset)
    hint and its preconditions, or kept by unlisted processes that have the GPU's device file open. Values
    may be unknown, or the GPU may be lost."
options:
  gpus:
    description:
      - GPUs to check, each an index (V(3)), a UUID (V(GPU-...)) or a PCI bus id (V(00000000:18:00.0)).
      - An empty list means every GPU of the node.
    type: list
    elements: raw
    default: []
  state:
    description:
      - V(free) waits until the GPUs are free, V(allocated) until they hold memory (a server has loaded).
    type: str
    default: free
    choices: [free, allocated]
  max_used_mib:
    description:
      - With O(state=free), the most memory in MiB a GPU may show and still count as free.
    type: int
    default: 16
  mig_max_used_mib:
    description:
      - With O(state=free), the same limit for a GPU in MIG mode; the larger of this and O(max_used_mib) applies.
      - An idle H200 in MIG mode reads 55 to 59 MiB used (driver 590), so O(max_used_mib) alone would never pass.
    type: int
    default: 96
  min_used_mib:
    description:
      - With O(state=allocated), the least memory in MiB every target GPU must show.
      - When not set, V(1024) is used.
    type: int
  require_no_processes:
    description:
      - With O(state=free), also require that no compute process is listed on the GPU.
    type: bool
    default: true
  require_processes:
    description:
      - With O(state=allocated), also require at least one compute process on each target GPU.
    type: bool
    default: false
  timeout:
    description:
      - Seconds to wait, counted from the start of the task (including O(delay)). V(0) checks once.
    type: float
    default: 120
  sleep:
    description:
      - Seconds from the start of one poll to the start of the next (clamped to the time left). A poll that takes
        longer than this is followed at once, so a change is seen at most O(sleep) plus one poll after it happens.
    type: float
    default: 0.5
  delay:
    description:
      - Seconds to wait before the first poll.
    type: float
    default: 0
  msg:
    description:
      - Message to fail with instead of the generated one (the diagnosis is returned either way).
    type: str
extends_documentation_fragment:
  - gpufleet.sglang.gpu
  - gpufleet.sglang.gpu.command_timeout
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details: The module only reads; it runs normally in check mode.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: none
  platform:
    description: Target OS/families that can be operated against.
    support: N/A
    platforms: posix
notes:
  - Memory comes back some time after a killed process exits (seconds, sometimes tens of seconds), so give
    O(timeout) room after M(gpufleet.sglang.gpu_drain).
  - The logic lives in C(module_utils/gpu/verify.py) (C(run_assert)), which other modules run in-process.
  - Run it in the host PID namespace to get useful process details in the diagnosis.
seealso:
  - module: gpufleet.sglang.gpu_drain
author:
  - gpufleet maintainers (@gpufleet)
"""

EXAMPLES = r"""
- name: Wait until all GPUs are free (at most 16 MiB used, no compute process)
  gpufleet.sglang.gpu_memory_assert:
    timeout: 120

- name: Check GPUs 0-3 once, allowing 64 MiB
  gpufleet.sglang.gpu_memory_assert:
    gpus: [0, 1, 2, 3]
    max_used_mib: 64
    timeout: 0

- name: Wait until the new server has loaded its weights on its GPUs
  gpufleet.sglang.gpu_memory_assert:
    gpus: "{{ sglang_gpus }}"
    state: allocated
    min_used_mib: 20000
    require_processes: true
    timeout: 900
    sleep: 5

- name: Gate a relaunch, with a custom message
  gpufleet.sglang.gpu_memory_assert:
    timeout: 60
    msg: GPUs are still busy; see the diagnosis and do not relaunch
  register: gpu_check
"""

RETURN = r"""
gpus:
  description: The last reading of each target GPU.
  returned: always
  type: list
  elements: dict
  contains:
    index:
      description: GPU index (null for a lost GPU nvidia-smi could not enumerate).
      type: int
    uuid:
      description: GPU UUID.
      type: str
    name:
      description: Product name.
      type: str
    bus_id:
      description: PCI bus id.
      type: str
    used_mib:
      description: Used memory in MiB, null when unknown.
      type: int
    reserved_mib:
      description: Memory reserved by the driver in MiB, null when unknown.
      type: int
    total_mib:
      description: Total memory in MiB, null when unknown.
      type: int
    free_mib:
      description: Free memory in MiB, null when unknown.
      type: int
    processes:
      description: Compute processes on this GPU (C(pid), C(used_mib), C(name)).
      type: list
      elements: dict
    unknown_fields:
      description: Fields that read as a placeholder, with the placeholder text.
      type: dict
    lost:
      description: Whether the GPU is lost.
      type: bool
    mig_mode:
      description: C(mig.mode.current) (V(Enabled), V(Disabled)), null when the GPU or driver has no MIG.
      type: str
    ok:
      description: Whether this GPU meets the condition.
      type: bool
  sample:
    - index: 0
      uuid: GPU-3c66932a-8c79-1827-26b4-9e54b9346a55
      name: NVIDIA H200
      bus_id: 00000000:18:00.0
      used_mib: 1
      reserved_mib: 530
      total_mib: 143771
      free_mib: 143240
      processes: []
      unknown_fields: {}
      mig_mode: Disabled
      lost: false
      ok: true
diagnosis:
  description: One entry per GPU that does not meet the condition, or one node-wide entry for a driver failure.
  returned: failure
  type: list
  elements: dict
  contains:
    gpu:
      description: GPU index (null for a node-wide failure).
      type: int
    kind:
      description:
        - V(held), V(orphaned), V(kept_open), V(unknown), V(lost), V(driver), V(error), V(not_allocated) or
          V(no_processes).
      type: str
    summary:
      description: The sentence used in the failure message.
      type: str
    processes:
      description: Listed processes with C(/proc) details (C(cmdline), C(state), C(visible)).
      type: list
      elements: dict
    hint:
      description: What to do about it.
      type: str
  sample:
    - gpu: 3
      kind: orphaned
      used_mib: 512
      summary: 'GPU 3: 512 MiB held by no process after 120 s (orphaned context); a GPU reset is needed'
      hint: 'as root, with no process using the GPU: nvidia-smi --gpu-reset -i 3'
elapsed:
  description: Seconds the module ran, including O(delay).
  returned: always
  type: float
  sample: 2.48
polls:
  description: Number of snapshots taken.
  returned: always
  type: int
  sample: 5
backend:
  description: Which backend answered (V(nvidia-smi) or V(nvml)).
  returned: always
  type: str
  sample: nvidia-smi
driver:
  description: Driver status of the last poll (C(ok), C(status), C(rc), C(message), C(hint)).
  returned: always
  type: dict
"""

import copy

from ansible.module_utils.basic import AnsibleModule, missing_required_lib


from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import backends as gpu_backends
from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import target as gpu_target
from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import verify as gpu_verify


def main():
    module = AnsibleModule(argument_spec=copy.deepcopy(gpu_verify.ARGUMENT_SPEC), supports_check_mode=True)
    try:
        result = gpu_verify.run_assert(module.params, gpu_target.module_run(module), check_mode=module.check_mode,
                                       warn=module.warn, which=module.get_bin_path)
    except gpu_verify.VerifyError as exc:
        result = dict(exc.result)
        if result.pop('missing_lib', None):
            module.fail_json(msg=missing_required_lib('nvidia-ml-py (pynvml)'),
                             exception=str(gpu_backends.PYNVML_IMPORT_ERROR), **result)
        module.fail_json(msg=exc.msg, **result)
    module.exit_json(**result)


if __name__ == '__main__':
    main()
