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
  - "V(free): used memory at most O(max_used_mib) (idle H100 and H200 GPUs show 0 to 4 MiB; never C(used == 0)),
    and with O(require_no_processes=true) no compute process listed."
  - "V(allocated): used memory at least O(min_used_mib) on every target GPU, and with O(require_processes=true) at
    least one compute process. GPUs that are not targeted are not judged."
  - A placeholder such as C([N/A]) is unknown, never 0, so a GPU whose memory cannot be read never passes.
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
  backend:
    description:
      - How to read the GPUs. V(auto) uses NVML when the C(pynvml) module (nvidia-ml-py) imports and initialises,
        otherwise nvidia-smi.
    type: str
    default: auto
    choices: [auto, nvidia-smi, nvml]
  nvidia_smi:
    description:
      - Path of the nvidia-smi binary, or a bare command name that is searched on E(PATH).
      - By default C(nvidia-smi) is searched on E(PATH).
    type: path
  device_paths:
    description:
      - fnmatch patterns of the GPU device nodes, used by the diagnosis to find unlisted processes that keep a GPU
        open. When the environment variable C(GPUSIM_ROOT) is set (the gpusim simulator),
        C($GPUSIM_ROOT/dev/nvidia*) is added.
    type: list
    elements: str
    default: ['/dev/nvidia*']
  command_timeout:
    description:
      - Seconds after which one nvidia-smi run is abandoned (through coreutils C(timeout), when installed); the poll
        then counts as failed and the next one follows.
    type: float
    default: 60
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

import os
import time

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.gpufleet.sglang.plugins.module_utils import gpu_query
from ansible_collections.gpufleet.sglang.plugins.module_utils import procfs

DEFAULT_MIN_USED_MIB = 1024

RESET_PRECONDITIONS = ('as root, with no process using the GPU (CUDA applications, X, monitoring tools such as '
                       'another nvidia-smi, DCGM, Fabric Manager) and no compute application on any other GPU')


# ---------------------------------------------------------------------------
# Pure judgement
# ---------------------------------------------------------------------------

def judge(gpu, params):
    """Return the list of problems of one GPU reading (empty when it meets the condition)."""
    problems = []
    if gpu.get('lost'):
        return ['lost']
    used = gpu.get('used_mib')
    procs = gpu.get('processes') or []
    if params['state'] == 'free':
        if used is None:
            problems.append('unknown')
        elif used > params['max_used_mib']:
            problems.append('used')
        if params['require_no_processes'] and procs:
            problems.append('processes')
        if 'processes' in gpu.get('unknown_fields', {}):
            problems.append('unknown')
    else:
        minimum = params['min_used_mib']
        if used is None:
            problems.append('unknown')
        elif used < minimum:
            problems.append('not_allocated')
        if params['require_processes'] and not procs:
            problems.append('no_processes')
    return problems


def _proc_detail(proc, proc_root=procfs.PROC_ROOT):
    pid = proc.get('pid')
    detail = {'pid': pid, 'name': proc.get('name'), 'used_mib': proc.get('used_mib'), 'visible': False,
              'cmdline': None, 'comm': None, 'state': None}
    if pid is None:
        return detail
    info = procfs.read_proc(pid, proc_root, with_cgroup=False)
    if info is None:
        return detail
    detail.update({'visible': True, 'cmdline': ' '.join(procfs.mask_secrets(info.cmdline)) or None,
                   'comm': info.comm, 'state': procfs.state_name(info.state), 'ppid': info.ppid,
                   'exited': info.exited, 'state_code': info.state})
    return detail


def _describe_proc(detail):
    if detail['pid'] is None:
        return 'a process without PID (%s)' % (detail.get('name') or 'unknown')
    if not detail['visible']:
        return 'PID %d (%s, not visible in /proc: another PID namespace or a stale listing)' % (
            detail['pid'], detail.get('name') or '[Not Found]')
    label = detail.get('comm') or detail.get('name') or '?'
    cmd = detail.get('cmdline')
    if cmd and cmd != label:
        if len(cmd) > 80:
            cmd = cmd[:77] + '...'
        label = '%s: %s' % (label, cmd)
    extra = ''
    if detail.get('exited'):
        extra = ', exited; parent %s has not reaped it' % detail.get('ppid')
    elif detail.get('state_code') in ('D', 'T', 't', 'Z'):
        extra = ', state %s' % detail['state']
    return 'PID %d (%s%s)' % (detail['pid'], label, extra)


def diagnose(gpu, problems, params, waited, device_users=None):
    """Explain one failing GPU. ``device_users``: ``{pid: comm}`` with its device file open (unlisted).

    ``waited`` is the time waited, normally the timeout.
    """
    label = gpu_query.gpu_label(gpu)
    used = gpu.get('used_mib')
    after = 'after %s s' % _fmt_seconds(waited) if waited > 0 else 'at the only check (timeout 0)'
    entry = {'gpu': gpu.get('index'), 'uuid': gpu.get('uuid'), 'bus_id': gpu.get('bus_id'), 'used_mib': used,
             'kind': None, 'summary': None, 'processes': [], 'hint': '', 'unknown_fields': dict(gpu.get('unknown_fields', {}))}
    if 'lost' in problems:
        entry['kind'] = 'lost'
        where = ' (%s)' % gpu['bus_id'] if gpu.get('bus_id') and gpu.get('index') is not None else ''
        entry['summary'] = '%s%s is lost: %s' % (label, where, gpu.get('lost_reason') or 'unknown error')
        entry['hint'] = 'the GPU fell off the bus or needs a reset; reboot the node (or reset the GPU) and check its health'
        return entry
    details = [_proc_detail(p) for p in gpu.get('processes') or []]
    entry['processes'] = details
    if params['state'] == 'allocated':
        parts = []
        if 'unknown' in problems:
            entry['kind'] = 'unknown'
            parts.append('memory.used is unknown (%s)' % entry['unknown_fields'].get('memory.used', 'placeholder'))
        if 'not_allocated' in problems:
            entry['kind'] = entry['kind'] or 'not_allocated'
            parts.append('%s MiB used, expected at least %d MiB' % (used, params['min_used_mib']))
        if 'no_processes' in problems:
            entry['kind'] = entry['kind'] or 'no_processes'
            parts.append('no compute process listed')
        entry['summary'] = '%s: %s %s' % (label, ', '.join(parts), after)
        entry['hint'] = 'check the server log: it may still be loading, or it failed to start'
        return entry
    if 'unknown' in problems and used is None:
        entry['kind'] = 'unknown'
        placeholder = entry['unknown_fields'].get('memory.used', 'placeholder')
        entry['summary'] = '%s: used memory is unknown (%s) %s; it cannot be verified' % (label, placeholder, after)
        entry['hint'] = 'nvidia-smi reports no value for memory.used on this GPU (MIG, permissions or an unsupported part)'
        if details:
            entry['summary'] += '; listed: %s' % ', '.join(_describe_proc(d) for d in details)
        return entry
    if details:
        entry['kind'] = 'held'
        pids = ', '.join(_describe_proc(d) for d in details)
        amount = '%d MiB held' % used if used is not None else 'held'
        entry['summary'] = '%s: %s by %s %s' % (label, amount, pids, after)
        hints = []
        if any(not d['visible'] for d in details):
            hints.append('PIDs not visible in /proc belong to another PID namespace (run in the host PID namespace), '
                         'or are stale listings that only a GPU reset clears')
        if any(d.get('state_code') == 'D' for d in details):
            hints.append('a process in state D is stuck in the kernel or driver; it cannot be killed until the call '
                         'returns; otherwise reset the GPU or reboot')
        if any(d.get('exited') for d in details):
            hints.append('an exited process keeps its listing until its memory is released')
        if not hints:
            hints.append('stop these processes (gpufleet.sglang.gpu_drain) or wait longer for them to exit')
        entry['hint'] = '; '.join(hints)
        return entry
    if 'unknown' in problems:
        entry['kind'] = 'unknown'
        entry['summary'] = '%s: the process list is unknown (%s) %s' % (
            label, entry['unknown_fields'].get('processes', 'placeholder'), after)
        return entry
    index = gpu.get('index')
    reset_cmd = 'nvidia-smi --gpu-reset -i %s' % (index if index is not None else gpu.get('bus_id'))
    if device_users:
        entry['kind'] = 'kept_open'
        users = ', '.join('PID %d (%s)' % (pid, name) for pid, name in sorted(device_users.items()))
        entry['summary'] = '%s: %d MiB held by no listed process %s; %s keep its device file open' % (
            label, used, after, users)
        entry['hint'] = ('unlisted processes with the device open (for example forked workers that inherited it) '
                         'keep the memory; stop them, then check again')
        entry['device_users'] = sorted(device_users)
        return entry
    entry['kind'] = 'orphaned'
    entry['summary'] = '%s: %d MiB held by no process %s (orphaned context); a GPU reset is needed' % (label, used, after)
    entry['hint'] = '%s: %s (gpufleet.sglang.gpu_drain reset_orphaned=true does this when it is safe)' % (
        RESET_PRECONDITIONS, reset_cmd)
    return entry


def _fmt_seconds(value):
    if value >= 10 or float(value).is_integer():
        return '%d' % round(value)
    return '%.1f' % value


# ---------------------------------------------------------------------------
# The module
# ---------------------------------------------------------------------------

def _device_patterns(params, env):
    patterns = list(params['device_paths'] or [])
    root = env.get('GPUSIM_ROOT')
    if root:
        sim = os.path.join(root, 'dev', 'nvidia*')
        if sim not in patterns:
            patterns.append(sim)
    return patterns


def device_users(index, patterns, listed):
    """``{pid: comm}`` of processes not in ``listed`` that have GPU ``index``'s device file open.

    System daemons (persistenced, DCGM, Fabric Manager, X, MPS) keep the device
    open without holding compute memory and are left out.
    """
    paths = tuple(set(os.path.join(os.path.dirname(p), 'nvidia%d' % index) for p in patterns))
    daemons = set(gpu_query.GPU_SYSTEM_DAEMONS)
    users = {}
    for pid in procfs.list_pids():
        if pid in listed or pid == os.getpid():
            continue
        if procfs.device_fds(pid, paths):
            comm = procfs.read_comm(pid) or '?'
            args = procfs.read_cmdline(pid)
            if comm in daemons or (args and os.path.basename(args[0]) in daemons):
                continue
            users[pid] = comm
    return users


class Assert(object):
    def __init__(self, module, clock=time.monotonic, sleep=time.sleep):
        self.module = module
        self.params = dict(module.params)
        self.clock = clock
        self.sleep = sleep
        self.start = clock()
        self.result = {'changed': False, 'gpus': [], 'polls': 0, 'backend': None, 'driver': None}
        self.backend = None

    def elapsed(self):
        return round(self.clock() - self.start, 3)

    def fail(self, msg, **extra):
        self.result.update(extra)
        self.result['elapsed'] = self.elapsed()
        self.module.fail_json(msg=self.params['msg'] or msg, **self.result)

    def setup(self):
        p = self.params
        for name in ('timeout', 'sleep', 'delay', 'command_timeout'):
            if p[name] < 0:
                self.fail('%s must be >= 0, got %s' % (name, p[name]))
        if p['state'] == 'allocated' and p['min_used_mib'] is None:
            p['min_used_mib'] = DEFAULT_MIN_USED_MIB
        if p['min_used_mib'] is not None and p['min_used_mib'] < 0:
            self.fail('min_used_mib must be >= 0, got %s' % p['min_used_mib'])
        if p['max_used_mib'] < 0:
            self.fail('max_used_mib must be >= 0, got %s' % p['max_used_mib'])
        for sel in p['gpus']:
            try:
                gpu_query.parse_selector(sel)
            except ValueError as exc:
                self.fail('gpus: %s' % exc)
        if p['backend'] == gpu_query.BACKEND_NVML and not gpu_query.HAS_PYNVML:
            self.module.fail_json(msg=missing_required_lib('nvidia-ml-py (pynvml)'),
                                  exception=str(gpu_query.PYNVML_IMPORT_ERROR))
        try:
            nvidia_smi = gpu_query.resolve_nvidia_smi(self.module, p['nvidia_smi'])
        except ValueError as exc:
            self.fail('gpu_memory_assert: nvidia_smi: %s' % exc)
        if not nvidia_smi and (p['backend'] == gpu_query.BACKEND_NVIDIA_SMI or not gpu_query.HAS_PYNVML):
            self.fail('gpu_memory_assert: nvidia-smi was not found on PATH; install the NVIDIA driver utilities or '
                      'set nvidia_smi', diagnosis=[{'gpu': None, 'kind': 'driver', 'summary': 'nvidia-smi not found',
                                                   'processes': [], 'hint': gpu_query.STATUS_HINTS[gpu_query.STATUS_NOT_FOUND]}])
        runner = gpu_query.module_runner(self.module, p['command_timeout'])
        try:
            self.backend, dummy = gpu_query.open_backend(p['backend'], runner, nvidia_smi or 'nvidia-smi')
        except gpu_query.BackendUnavailable as exc:
            self.fail('gpu_memory_assert: backend %s unavailable: %s' % (p['backend'], exc))

    def poll(self):
        snap = self.backend.snapshot()
        self.result['polls'] += 1
        self.result['backend'] = snap['backend']
        self.result['driver'] = snap['driver']
        return snap

    def evaluate(self, snap):
        """Returns ``(done, targets, problems_by_position)``; fails at once for non-transient errors."""
        driver = snap['driver']
        if not driver['ok']:
            if driver['fatal']:
                summary = 'nvidia-smi: %s (%s, rc %s)' % (driver['hint'] or driver['status'], driver['status'], driver['rc'])
                self.fail('gpu_memory_assert: %s: %s' % (summary, driver['message']),
                          diagnosis=[{'gpu': None, 'kind': 'driver', 'summary': summary, 'processes': [],
                                      'hint': driver['hint'], 'message': driver['message']}])
            return False, None, None
        targets, errors = gpu_query.select_gpus(snap, self.params['gpus'])
        if errors:
            self.fail('gpu_memory_assert: gpus: %s' % '; '.join(errors))
        problems = [judge(g, self.params) for g in targets]
        return not any(problems), targets, problems

    def run(self):
        self.setup()
        p = self.params
        deadline = procfs.Deadline(p['timeout'], clock=self.clock)
        deadline.start = self.start
        deadline.end = self.start + p['timeout']
        if p['delay']:
            self.sleep(deadline.clamp(p['delay']))
        targets = problems = None
        while True:
            poll_started = self.clock()
            snap = self.poll()
            done, new_targets, new_problems = self.evaluate(snap)
            if new_targets is not None:
                targets, problems = new_targets, new_problems
            if done:
                break
            if deadline.clamp(p['sleep']) <= 0:
                break
            # Polls start every `sleep` seconds (the last one at the deadline): the time the poll itself took
            # (two nvidia-smi runs) comes off the wait, so a change is seen at most sleep + one poll after it
            # happens, not sleep + two.
            wait = min(poll_started + p['sleep'], deadline.end) - self.clock()
            if wait > 0:
                self.sleep(wait)
        if targets is not None:
            self.result['gpus'] = []
            for gpu, probs in zip(targets, problems):
                reading = gpu_query.summarize(gpu)
                reading['ok'] = not probs
                self.result['gpus'].append(reading)
        if done:
            self.result['elapsed'] = self.elapsed()
            self.module.exit_json(**self.result)
        waited = p['timeout']
        if targets is None:
            driver = self.result['driver'] or {}
            summary = 'nvidia-smi kept failing for %s s: %s (rc %s) %s' % (
                _fmt_seconds(waited), driver.get('status'), driver.get('rc'), driver.get('message', ''))
            self.fail('gpu_memory_assert: %s' % summary.strip(),
                      diagnosis=[{'gpu': None, 'kind': 'error', 'summary': summary.strip(), 'processes': [],
                                  'hint': driver.get('hint', '')}])
        patterns = _device_patterns(p, os.environ)
        diagnosis = []
        for gpu, probs in zip(targets, problems):
            if not probs:
                continue
            users = None
            if p['state'] == 'free' and not gpu.get('processes') and gpu.get('index') is not None \
                    and gpu.get('used_mib') is not None and not gpu.get('lost'):
                users = device_users(gpu['index'], patterns, set())
            diagnosis.append(diagnose(gpu, probs, p, waited, users))
        self.fail('; '.join(d['summary'] for d in diagnosis), diagnosis=diagnosis)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            gpus=dict(type='list', elements='raw', default=[]),
            state=dict(type='str', default='free', choices=['free', 'allocated']),
            max_used_mib=dict(type='int', default=16),
            min_used_mib=dict(type='int'),
            require_no_processes=dict(type='bool', default=True),
            require_processes=dict(type='bool', default=False),
            timeout=dict(type='float', default=120),
            sleep=dict(type='float', default=0.5),
            delay=dict(type='float', default=0),
            msg=dict(type='str'),
            backend=dict(type='str', default='auto', choices=['auto', 'nvidia-smi', 'nvml']),
            nvidia_smi=dict(type='path'),
            device_paths=dict(type='list', elements='str', default=['/dev/nvidia*']),
            command_timeout=dict(type='float', default=60),
        ),
        supports_check_mode=True,
    )
    Assert(module).run()


if __name__ == '__main__':
    main()
