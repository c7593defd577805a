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
  - Holder PIDs that nvidia-smi lists but C(/proc) does not show (another PID namespace, process name
    C([Not Found])) and holders whose C(/proc) entry has no descriptor open on a GPU device (O(device_paths))
    are never signalled; they are reported in RV(not_signalled) with a hint.
  - Any targeted process still running after O(kill_timeout) (for example in state C(D), stuck in the driver)
    makes the task fail with its PID, state and GPUs.
  - This module has nothing to do with the C(nvidia-smi drain) subcommand, which sets a PCIe drain state so
    that a GPU accepts no new clients and never stops a process.
options:
  gpus:
    description:
      - GPUs to drain, each an index (V(3)), a UUID (V(GPU-...)) or a PCI bus id (V(00000000:18:00.0)).
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
        its schedulers, so leave it room.
    type: float
    default: 30
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
      - After the drain, reset each target GPU that still holds more than O(max_used_mib) with no process listed
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
  release_timeout:
    description:
      - With O(reset_orphaned=true), seconds to wait for memory of stopped processes to be released before a GPU
        counts as orphaned. Killed processes release their memory after they exit, usually within seconds.
    type: float
    default: 30
  device_paths:
    description:
      - fnmatch patterns of the GPU device nodes. A holder visible in C(/proc) must have one of them open, which
        protects against PIDs that nvidia-smi reports from another PID namespace.
      - When the environment variable C(GPUSIM_ROOT) is set (the gpusim simulator), C($GPUSIM_ROOT/dev/nvidia*) is
        added.
    type: list
    elements: str
    default: ['/dev/nvidia*']
  backend:
    description:
      - How to read the GPUs. V(auto) uses NVML when the C(pynvml) module (nvidia-ml-py) imports and initialises,
        otherwise nvidia-smi. GPU resets always use nvidia-smi.
    type: str
    default: auto
    choices: [auto, nvidia-smi, nvml]
  nvidia_smi:
    description:
      - Path of the nvidia-smi binary, or a bare command name that is searched on E(PATH).
      - By default C(nvidia-smi) is searched on E(PATH).
    type: path
  command_timeout:
    description:
      - Seconds after which one nvidia-smi run is abandoned (through coreutils C(timeout), when installed).
    type: float
    default: 60
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
  - Values of C(--api-key) and C(--admin-api-key) are masked in every returned command line.
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
      description: V(root), V(descendant) or V(holder).
      type: str
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
holders:
  description: The compute processes on the target GPUs before the drain, one entry per PID.
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

import os
import re
import signal as signal_mod
import time

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.gpufleet.sglang.plugins.module_utils import gpu_query
from ansible_collections.gpufleet.sglang.plugins.module_utils import procfs

DEFAULT_EXCLUDE = list(gpu_query.GPU_SYSTEM_DAEMONS)

# Programs that are never a server root: signalling them would end a login,
# a terminal multiplexer, a container or the whole machine.
SUPERVISOR_NAMES = frozenset((
    'systemd', 'init', '(sd-pam)', 'sshd', 'sshd-session', 'sshd-auth', 'login', 'su', 'sudo', 'doas', 'runuser',
    'bash', 'sh', 'zsh', 'dash', 'ksh', 'mksh', 'ash', 'fish', 'tcsh', 'csh', 'busybox',
    'tmux', 'screen', 'SCREEN', 'byobu', 'script', 'mosh-server',
    'conmon', 'runc', 'crun', 'containerd', 'dockerd', 'docker-init', 'docker-proxy', 'podman', 'tini', 'dumb-init',
    'catatonit', 'supervisord', 'runsv', 'runsvdir', 's6-supervise', 'agetty', 'cron', 'crond', 'atd',
))
SUPERVISOR_PREFIXES = ('containerd-shim', 'tmux:', 'systemd-', 'sshd:')

STATE_HINTS = {
    'D': 'uninterruptible sleep inside the kernel or driver: it dies when the call returns; '
         'otherwise only a GPU reset or a reboot frees it',
    'T': 'stopped: it exits as soon as it is continued (SIGCONT)',
    't': 'stopped by a tracer: detach the debugger',
    'Z': 'zombie leader whose other threads still run',
}

ROOT_GRACE_S = 1.0
POLL_S = 0.02


# ---------------------------------------------------------------------------
# Pure planning over a process-table snapshot
# ---------------------------------------------------------------------------

def compile_patterns(patterns, option):
    """Compile regexes; raises ValueError naming the option and the bad entry."""
    out = []
    for pattern in patterns or []:
        try:
            out.append(re.compile(pattern))
        except re.error as exc:
            raise ValueError('%s: invalid regular expression %r: %s' % (option, pattern, exc))
    return out


def exclude_match(info, exclude_res):
    """The pattern that excludes ``info``, or None.

    Each pattern must match in full (``re.fullmatch``) the process name
    (``comm``, at most 15 characters), the basename of ``argv[0]``, or the
    whole command line; ``.*`` matches part of a command line.
    """
    cmdline = ' '.join(info.cmdline)
    for regex in exclude_res:
        if regex.fullmatch(info.comm or '') or regex.fullmatch(info.exe_name or '') \
                or (cmdline and regex.fullmatch(cmdline)):
            return regex.pattern
    return None


def is_supervisor(info):
    """The shell/session/supervisor name of ``info`` (comm first, then argv[0]), or None."""
    for name in (info.comm or '', (info.exe_name or '').lstrip('-')):
        if name in SUPERVISOR_NAMES or name.startswith(SUPERVISOR_PREFIXES):
            return name
    return None


def is_ansible_process(info):
    for arg in info.cmdline[:3]:
        base = os.path.basename(arg)
        if base.startswith('AnsiballZ_') or base.startswith('ansible-') or base in ('ansible', 'ansible-runner'):
            return True
    return any('AnsiballZ_' in arg for arg in info.cmdline)


def matches_any(info, regexes):
    if not regexes:
        return True
    text = ' '.join(info.cmdline)
    return any((text and r.search(text)) or r.search(info.comm or '') for r in regexes)


class PlanContext(object):
    """Everything root selection needs besides the process table.

    ``self_chain``: the module's PID and its ancestors. ``unit_main_pids``:
    ``{unit: MainPID}`` from systemctl (missing or 0 when unknown).
    ``target_gpus``: the labels of the target GPUs. ``other_gpu_holders``:
    ``{pid: [gpus]}`` for processes that hold memory only outside the
    targets. ``device_fds``: ``pid -> list | None`` or None to skip the device
    check.
    """

    def __init__(self, self_chain=(), exclude_res=(), match_res=(), unit_main_pids=None, other_gpu_holders=None,
                 device_fds=None):
        self.self_chain = set(self_chain)
        self.exclude_res = list(exclude_res)
        self.match_res = list(match_res)
        self.unit_main_pids = dict(unit_main_pids or {})
        self.other_gpu_holders = dict(other_gpu_holders or {})
        self.device_fds = device_fds


def never_signal_reason(info, ctx):
    """Why ``info`` may never be signalled at all, or None."""
    if info.pid <= 1:
        return 'PID %d is init' % info.pid
    if info.pid in ctx.self_chain:
        return 'the module itself or one of its ancestors'
    pattern = exclude_match(info, ctx.exclude_res)
    if pattern is not None:
        return 'excluded by %r' % pattern
    if info.pid in ctx.other_gpu_holders:
        return 'holds memory only on GPUs outside the targets (%s)' % _gpu_list(ctx.other_gpu_holders[info.pid])
    return None


def root_refusal(info, ctx):
    """Why ``info`` cannot be a root, or None."""
    reason = never_signal_reason(info, ctx)
    if reason:
        return reason
    name = is_supervisor(info)
    if name:
        return 'a shell, session or supervisor program (%s)' % name
    if is_ansible_process(info):
        return "one of Ansible's own processes"
    return None


def _gpu_list(gpus):
    return ','.join(str(g) for g in gpus)


def _walk_to_group_leader(table, holder):
    """The ancestor (or the holder) that leads the holder's process group.

    Returns ``(pid, None)`` or ``(None, why)``; never crosses a session.
    """
    info = holder
    seen = set()
    while info is not None and info.pid not in seen:
        seen.add(info.pid)
        if info.sid != holder.sid:
            return None, 'process-group leader %d not found before the session boundary at PID %d' % (
                holder.pgid, info.pid)
        if info.pid == holder.pgid:
            return info.pid, None
        if info.ppid <= 0:
            break
        parent = table.get(info.ppid)
        if parent is None:
            return None, 'process-group leader %d is not an ancestor (parent %d not visible)' % (
                holder.pgid, info.ppid)
        info = parent
    return None, 'process-group leader %d is not an ancestor in the same session (orphaned or re-parented)' % holder.pgid


def choose_root(table, holder_pid, ctx):
    """Pick the process to signal for one GPU holder.

    Returns ``(root_pid, how, notes)``: ``how`` says why this process is the
    root; ``notes`` lists refused candidates as ``{'pid', 'reason'}`` (pid
    None when there was no candidate). The holder itself is the fallback.
    Pure over ``table`` and ``ctx``.
    """
    holder = table[holder_pid]
    notes = []
    # 1. A systemd system service: its main process.
    if holder.unit and holder.unit.endswith('.service') and holder.unit_manager == 'system':
        main = ctx.unit_main_pids.get(holder.unit) or 0
        source = 'MainPID'
        if not main or main not in table:
            unit_path = None
            if holder.cgroup:
                marker = '/' + holder.unit
                cut = holder.cgroup.find(marker)
                if cut >= 0:
                    unit_path = holder.cgroup[:cut + len(marker)]
            main = procfs.oldest(table, procfs.processes_in_cgroup(table, unit_path)) if unit_path else None
            source = 'oldest process in its cgroup'
        if main and main in table:
            cand = table[main]
            refusal = root_refusal(cand, ctx)
            if refusal is None and cand.sid != holder.sid:
                refusal = 'in another session (%d) than holder %d (%d)' % (cand.sid, holder_pid, holder.sid)
            if refusal is None:
                return main, 'main process of %s (%s)' % (holder.unit, source), notes
            notes.append({'pid': main, 'reason': 'not used as the root of holder %d (%s of %s): %s' % (
                holder_pid, source, holder.unit, refusal)})
        else:
            notes.append({'pid': None, 'reason': 'no main process found for %s (holder %d)' % (holder.unit, holder_pid)})
    # 2. The ancestor that leads the holder's process group, within its session.
    leader, why = _walk_to_group_leader(table, holder)
    if leader is None:
        notes.append({'pid': holder.pgid, 'reason': 'not used as the root of holder %d: %s' % (holder_pid, why)})
    elif leader == holder_pid:
        return holder_pid, 'holder leads its own process group', notes
    else:
        refusal = root_refusal(table[leader], ctx)
        if refusal is None:
            return leader, 'process-group leader of holder %d' % holder_pid, notes
        notes.append({'pid': leader, 'reason': 'not used as the root of holder %d (process-group leader): %s' % (
            holder_pid, refusal)})
    return holder_pid, 'holder itself (no usable root, see not_signalled)', notes


def tree_members(table, root_pid, ctx, kids=None):
    """Same-session descendants of a root that may be signalled, and the ones that may not.

    Returns ``(members, refused)`` where ``refused`` is ``[(pid, reason)]``.
    """
    root = table.get(root_pid)
    members = []
    refused = []
    if root is None:
        return members, refused
    for pid in procfs.descendants(table, root_pid, kids):
        info = table.get(pid)
        if info is None:
            continue
        if info.sid != root.sid:
            refused.append((pid, 'in another session than its root %d' % root_pid))
            continue
        reason = never_signal_reason(info, ctx)
        if reason:
            refused.append((pid, reason))
            continue
        members.append(pid)
    return members, refused


def plan_drain(table, target_holders, ctx, explicit_pids=()):
    """Decide what to signal. Pure over the process table.

    ``target_holders``: ``{pid: {'pid', 'gpus', 'used_mib', 'name'}}`` for the
    processes nvidia-smi lists on the target GPUs. Returns a dict:

    * ``roots``: PIDs that get the first signal, in order;
    * ``targets``: ``{pid: {'pid', 'role', 'root', 'how', 'gpus', 'used_mib'}}``
      for every process that may get SIGKILL (roots, their same-session
      descendants, holders);
    * ``skipped``: ``[{'pid', 'name', 'gpus', 'used_mib', 'reason'}]``.
    """
    roots = []
    targets = {}
    skipped = []
    kids = procfs.children_map(table)

    def skip(pid, reason, holder=None):
        info = table.get(pid)
        skipped.append({
            'pid': pid,
            'name': (holder or {}).get('name') if info is None else info.comm,
            'cmdline': None if info is None else ' '.join(procfs.mask_secrets(info.cmdline)),
            'gpus': list((holder or {}).get('gpus', [])),
            'used_mib': (holder or {}).get('used_mib'),
            'reason': reason,
        })

    def add_root(pid, how):
        if pid not in roots:
            roots.append(pid)
        entry = targets.get(pid)
        if entry is None or entry['role'] != 'root':
            holder = target_holders.get(pid) or {}
            targets[pid] = {'pid': pid, 'role': 'root', 'root': pid, 'how': how,
                            'gpus': list(holder.get('gpus', [])), 'used_mib': holder.get('used_mib')}

    # Explicit roots first: they are the caller's intent.
    for pid in explicit_pids:
        info = table.get(pid)
        if info is None:
            skip(pid, 'pids: not running')
            continue
        if info.exited:
            skip(pid, 'pids: already exited (zombie, waiting for its parent %d)' % info.ppid)
            continue
        refusal = root_refusal(info, ctx)
        if refusal:
            skip(pid, 'pids: refused: %s' % refusal)
            continue
        if not matches_any(info, ctx.match_res):
            skip(pid, 'pids: does not match the match patterns')
            continue
        add_root(pid, 'explicit in pids')

    for pid in sorted(target_holders, key=lambda p: (p is None, p or 0)):
        holder = target_holders[pid]
        if pid is None:
            skip(None, 'nvidia-smi listed a process without a PID; it cannot be signalled', holder)
            continue
        info = table.get(pid)
        if info is None:
            skip(pid, 'listed by nvidia-smi but not visible in /proc (another PID namespace, or a stale listing); '
                      'run the task in the host PID namespace (on the host or with --pid=host)', holder)
            continue
        if info.exited:
            skip(pid, 'already exited (zombie, not yet reaped by its parent %d); its memory is being released' % info.ppid,
                 holder)
            continue
        reason = never_signal_reason(info, ctx)
        if reason:
            skip(pid, reason, holder)
            continue
        if ctx.device_fds is not None:
            fds = ctx.device_fds(pid)
            if fds is not None and not fds:
                skip(pid, 'has no GPU device file open although nvidia-smi lists it: the PID probably names another '
                          'process in this PID namespace; run the task in the host PID namespace', holder)
                continue
        root, how, notes = choose_root(table, pid, ctx)
        if ctx.match_res and not (matches_any(info, ctx.match_res) or matches_any(table[root], ctx.match_res)):
            skip(pid, 'neither it nor its root %d matches the match patterns' % root, holder)
            continue
        for note in notes:
            skip(note['pid'], note['reason'])
        add_root(root, how)
        if root != pid:
            targets.setdefault(pid, {'pid': pid, 'role': 'holder', 'root': root, 'how': None,
                                     'gpus': list(holder.get('gpus', [])), 'used_mib': holder.get('used_mib')})

    for root in list(roots):
        members, refused = tree_members(table, root, ctx, kids)
        for pid in members:
            if pid in targets:
                continue
            holder = target_holders.get(pid) or {}
            targets[pid] = {'pid': pid, 'role': 'holder' if holder else 'descendant', 'root': root, 'how': None,
                            'gpus': list(holder.get('gpus', [])), 'used_mib': holder.get('used_mib')}
        for pid, reason in refused:
            if pid not in targets:
                skip(pid, 'in the tree of root %d but not signalled: %s' % (root, reason), target_holders.get(pid))
    return {'roots': roots, 'targets': targets, 'skipped': skipped}


# ---------------------------------------------------------------------------
# The module
# ---------------------------------------------------------------------------

def _holder_lines(holder_list):
    lines = []
    for h in holder_list:
        used = '?' if h.get('used_mib') is None else '%d MiB' % h['used_mib']
        lines.append('PID %s %s on GPU %s: %s' % (h.get('pid'), h.get('name') or '?', _gpu_list(h.get('gpus', [])), used))
    return '\n'.join(sorted(lines)) + ('\n' if lines else '')


def _holder_list(by_pid):
    """``{pid: holder}`` -> list ordered by PID (unknown PID last), without internal keys."""
    out = []
    for pid in sorted(by_pid, key=lambda p: (p is None, p or 0)):
        entry = dict(by_pid[pid])
        entry.pop('unknown', None)
        out.append(entry)
    return out


def _device_patterns(params, env):
    patterns = list(params['device_paths'] or [])
    root = env.get('GPUSIM_ROOT')
    if root:
        sim = os.path.join(root, 'dev', 'nvidia*')
        if sim not in patterns:
            patterns.append(sim)
    return patterns


def _systemd_running():
    return os.path.isdir('/run/systemd/system')


class Drain(object):
    """One run of the module."""

    def __init__(self, module):
        self.module = module
        self.params = module.params
        self.start = time.monotonic()
        self.result = {'changed': False, 'signalled': [], 'not_signalled': [], 'survivors': [], 'holders': [],
                       'remaining': [], 'gpus': [], 'backend': None}
        self.warnings = []
        self.exclude_res = []
        self.match_res = []
        self.signal = signal_mod.SIGTERM
        self.device_patterns = []
        self.runner = None
        self.nvidia_smi = None
        self.backend = None
        self.smi = None

    # -- helpers ----------------------------------------------------------
    def elapsed(self):
        return round(time.monotonic() - self.start, 3)

    def fail(self, msg, **extra):
        self.result.update(extra)
        self.result['elapsed'] = self.elapsed()
        self.module.fail_json(msg=msg, **self.result)

    def snapshot(self):
        snap = self.backend.snapshot()
        self.result['backend'] = snap['backend']
        return snap

    def check_driver(self, snap):
        driver = snap['driver']
        if not driver['ok']:
            self.fail(('gpu_drain: cannot read the GPUs: %s (%s): %s' % (
                driver['hint'] or driver['status'], driver['status'], driver['message'])).strip(), driver=driver)

    # -- setup ------------------------------------------------------------
    def setup(self):
        p = self.params
        for name in ('term_timeout', 'kill_timeout', 'release_timeout', 'command_timeout'):
            if p[name] is not None and p[name] < 0:
                self.fail('%s must be >= 0, got %s' % (name, p[name]))
        if p['max_used_mib'] < 0:
            self.fail('max_used_mib must be >= 0, got %s' % p['max_used_mib'])
        try:
            self.exclude_res = compile_patterns(p['exclude'], 'exclude')
            self.match_res = compile_patterns(p['match'], 'match')
        except ValueError as exc:
            self.fail(str(exc))
        for sel in p['gpus']:
            try:
                gpu_query.parse_selector(sel)
            except ValueError as exc:
                self.fail('gpus: %s' % exc)
        self.signal = procfs.parse_signal(p['signal'])
        self.device_patterns = _device_patterns(p, os.environ)
        try:
            nvidia_smi = gpu_query.resolve_nvidia_smi(self.module, p['nvidia_smi'])
        except ValueError as exc:
            self.fail('gpu_drain: nvidia_smi: %s' % exc)
        self.runner = gpu_query.module_runner(self.module, p['command_timeout'])
        if p['backend'] == gpu_query.BACKEND_NVML and not gpu_query.HAS_PYNVML:
            self.module.fail_json(msg=missing_required_lib('nvidia-ml-py (pynvml)'),
                                  exception=str(gpu_query.PYNVML_IMPORT_ERROR))
        if not nvidia_smi and (p['backend'] == gpu_query.BACKEND_NVIDIA_SMI or not gpu_query.HAS_PYNVML):
            self.fail('gpu_drain: nvidia-smi was not found on PATH; install the NVIDIA driver utilities or set nvidia_smi')
        self.nvidia_smi = nvidia_smi or 'nvidia-smi'
        try:
            self.backend, note = gpu_query.open_backend(p['backend'], self.runner, self.nvidia_smi)
        except gpu_query.BackendUnavailable as exc:
            self.fail('gpu_drain: backend %s unavailable: %s' % (p['backend'], exc))
        if note and p['backend'] != 'auto':
            self.warnings.append(note)
        self.smi = gpu_query.NvidiaSmiBackend(self.runner, self.nvidia_smi)

    def unit_main_pids(self, table, pids):
        units = set()
        for pid in pids:
            info = table.get(pid)
            if info is not None and info.unit and info.unit.endswith('.service') and info.unit_manager == 'system':
                units.add(info.unit)
        out = {}
        if not units or not _systemd_running():
            return out
        systemctl = self.module.get_bin_path('systemctl')
        if not systemctl:
            return out
        for unit in sorted(units):
            rc, stdout, dummy = self.module.run_command([systemctl, 'show', '-p', 'MainPID', '--value', unit],
                                                        environ_update=dict(gpu_query.C_LOCALE))
            if rc == 0 and stdout.strip().isdigit():
                out[unit] = int(stdout.strip())
        return out

    # -- reporting helpers -------------------------------------------------
    def describe(self, pid, entry, info):
        return {
            'pid': pid,
            'ppid': info.ppid if info else None,
            'name': info.comm if info else None,
            'cmdline': ' '.join(procfs.mask_secrets(info.cmdline)) if info else None,
            'role': entry['role'],
            'root': entry['root'],
            'how': entry.get('how'),
            'gpus': entry['gpus'],
            'used_mib': entry['used_mib'],
            'signals': [],
            'seconds_to_exit': None,
        }

    # -- main flow ---------------------------------------------------------
    def run(self):
        self.setup()
        p = self.params
        snap = self.snapshot()
        self.check_driver(snap)
        targets, errors = gpu_query.select_gpus(snap, p['gpus'])
        if errors:
            self.fail('gpu_drain: gpus: %s' % '; '.join(errors))
        for gpu in targets:
            if gpu.get('lost'):
                self.warnings.append('%s is lost (%s): its processes cannot be listed' % (
                    gpu_query.gpu_label(gpu), gpu.get('lost_reason')))
        target_holders = gpu_query.holders(targets)
        target_pids = set(target_holders)
        all_holders = gpu_query.holders(snap['gpus'])
        other = dict((pid, h['gpus']) for pid, h in all_holders.items()
                     if pid is not None and pid not in target_pids)
        self.result['holders'] = _holder_list(target_holders)

        table = procfs.process_table()
        ctx = PlanContext(
            self_chain=procfs.self_and_ancestors(),
            exclude_res=self.exclude_res,
            match_res=self.match_res,
            unit_main_pids=self.unit_main_pids(table, list(target_pids) + list(p['pids'])),
            other_gpu_holders=other,
            device_fds=lambda pid: procfs.device_fds(pid, self.device_patterns),
        )
        plan = plan_drain(table, target_holders, ctx, explicit_pids=p['pids'])
        self.result['not_signalled'] = plan['skipped']
        order = self.ordered_targets(plan)
        reports = {}
        for pid in order:
            reports[pid] = self.describe(pid, plan['targets'][pid], table.get(pid))
        self.result['signalled'] = [reports[pid] for pid in order]
        for entry in plan['skipped']:
            if entry.get('gpus'):
                self.warnings.append('PID %s on GPU %s not signalled: %s' % (entry['pid'], _gpu_list(entry['gpus']), entry['reason']))

        if self.module.check_mode:
            first = procfs.signal_name(self.signal)
            for pid in plan['roots']:
                reports[pid]['signals'] = [first]
            self.result['changed'] = bool(plan['roots'])
            self.result['remaining'] = [h for h in self.result['holders'] if h['pid'] not in plan['targets']]
            self.result['gpus'] = [gpu_query.summarize(g) for g in targets]
            if p['reset_orphaned']:
                self.result['reset'] = self.plan_resets(snap, targets, signalled_gpus=set(), check_only=True,
                                                        planned_pids=plan['targets'])
                if any(r['result'] == 'would reset' for r in self.result['reset']):
                    self.result['changed'] = True
            self.finish()
            return

        handles = self.open_handles(plan, table, reports)
        if plan['roots']:
            self.terminate(plan, handles, reports, ctx)
        survivors = [pid for pid in order if pid in handles and not handles[pid].gone()]
        for handle in handles.values():
            handle.close()
        self.result['changed'] = any(r['signals'] for r in reports.values())

        after = self.snapshot()
        if after['driver']['ok']:
            after_targets, dummy = gpu_query.select_gpus(after, p['gpus'])
            self.result['remaining'] = _holder_list(gpu_query.holders(after_targets))
            self.result['gpus'] = [gpu_query.summarize(g) for g in after_targets]
        if survivors:
            self.report_survivors(survivors, reports)
        if p['reset_orphaned'] and after['driver']['ok']:
            signalled_gpus = set()
            for r in reports.values():
                signalled_gpus.update(r['gpus'])
            self.result['reset'] = self.plan_resets(after, after_targets, signalled_gpus, check_only=False)
        elif p['reset_orphaned']:
            self.result['reset'] = []
        self.finish()

    def ordered_targets(self, plan):
        order = list(plan['roots'])
        rest = [pid for pid in plan['targets'] if pid not in order]
        descendants = sorted((pid for pid in rest if plan['targets'][pid]['role'] == 'descendant'))
        holders = sorted((pid for pid in rest if plan['targets'][pid]['role'] != 'descendant'))
        return order + descendants + holders

    def open_handles(self, plan, table, reports):
        handles = {}
        for pid, entry in plan['targets'].items():
            info = table.get(pid)
            handle = procfs.ProcessHandle.open(pid, info.starttime) if info is not None else None
            if handle is None:
                reports[pid]['seconds_to_exit'] = 0.0
                continue
            handles[pid] = handle
        return handles

    def terminate(self, plan, handles, reports, ctx):
        """Graceful signal to the roots, then SIGKILL for what is left."""
        p = self.params
        t0 = time.monotonic()

        def seen_gone(handle):
            report = reports[handle.pid]
            if report['seconds_to_exit'] is None:
                report['seconds_to_exit'] = round(time.monotonic() - t0, 3)

        root_handles = []
        for pid in plan['roots']:
            handle = handles.get(pid)
            if handle is None:
                continue
            try:
                if handle.send(self.signal):
                    reports[pid]['signals'].append(procfs.signal_name(self.signal))
                    root_handles.append(handle)
                else:
                    seen_gone(handle)
            except OSError as exc:
                self.warnings.append('PID %d: %s failed: %s' % (pid, procfs.signal_name(self.signal), exc))
        pending = list(handles.values())
        if self.signal != signal_mod.SIGKILL:
            deadline = procfs.Deadline(p['term_timeout'])
            roots_down = []

            def on_poll(still):
                if not roots_down and not any(h in still for h in root_handles):
                    # Every server is down; what is left gets a short grace.
                    roots_down.append(True)
                    deadline.shorten(ROOT_GRACE_S)

            pending = procfs.wait_gone(pending, deadline, interval=POLL_S, on_exit=seen_gone, on_poll=on_poll)
        if not pending:
            return
        # Children spawned after the plan, still attached to a live root.
        fresh = procfs.process_table(with_cgroup=False)
        kids = procfs.children_map(fresh)
        for pid in plan['roots']:
            handle = handles.get(pid)
            if handle is None or handle.gone():
                continue
            members, dummy = tree_members(fresh, pid, ctx, kids)
            for member in members:
                if member in handles or member not in fresh:
                    continue
                new = procfs.ProcessHandle.open(member, fresh[member].starttime)
                if new is not None:
                    handles[member] = new
                    entry = {'pid': member, 'role': 'descendant', 'root': pid, 'how': None, 'gpus': [], 'used_mib': None}
                    reports[member] = self.describe(member, entry, fresh[member])
                    self.result['signalled'].append(reports[member])
                    pending.append(new)
        for handle in pending:
            try:
                if handle.send(signal_mod.SIGKILL):
                    reports[handle.pid]['signals'].append('SIGKILL')
                else:
                    seen_gone(handle)
            except OSError as exc:
                self.warnings.append('PID %d: SIGKILL failed: %s' % (handle.pid, exc))
        procfs.wait_gone(pending, procfs.Deadline(p['kill_timeout']), interval=POLL_S, on_exit=seen_gone)

    def report_survivors(self, survivors, reports):
        out = []
        parts = []
        for pid in survivors:
            stat = procfs.read_stat(pid)
            state = stat['state'] if stat else None
            report = reports[pid]
            entry = {'pid': pid, 'name': report['name'], 'state': procfs.state_name(state), 'gpus': report['gpus'],
                     'signals': report['signals'], 'hint': STATE_HINTS.get(state, '')}
            out.append(entry)
            text = 'PID %d (%s, state %s' % (pid, report['name'], procfs.state_name(state))
            if report['gpus']:
                text += ', GPUs %s' % _gpu_list(report['gpus'])
            text += ')'
            parts.append(text)
        self.result['survivors'] = out
        hints = sorted(set(e['hint'] for e in out if e['hint']))
        msg = 'gpu_drain: %d process(es) still running %.1f s after SIGKILL: %s' % (
            len(out), self.params['kill_timeout'], '; '.join(parts))
        if hints:
            msg += '. ' + '; '.join(hints)
        self.warnings_to_result()
        self.fail(msg)

    # -- GPU reset ---------------------------------------------------------
    def device_users(self, index):
        """PIDs with the device file of GPU ``index`` open (under any device pattern directory)."""
        paths = set()
        for pattern in self.device_patterns:
            paths.add(os.path.join(os.path.dirname(pattern), 'nvidia%d' % index))
        users = []
        for pid in procfs.list_pids():
            fds = procfs.device_fds(pid, tuple(paths))
            if fds:
                users.append(pid)
        return users

    def plan_resets(self, snap, targets, signalled_gpus, check_only, planned_pids=()):
        """Find orphaned memory on the target GPUs and reset each one where the preconditions hold.

        Before judging, waits up to ``release_timeout`` for the GPUs whose
        processes were just stopped to release their memory. In check mode,
        ``planned_pids`` (the processes the drain would stop) do not count as
        blockers.
        """
        limit = self.params['max_used_mib']

        def orphaned(gpu):
            return (not gpu.get('lost') and not gpu.get('processes') and gpu.get('used_mib') is not None
                    and gpu['used_mib'] > limit)

        def settling(gpus):
            return [g for g in gpus if g.get('index') in signalled_gpus and not g.get('lost')
                    and (g.get('processes') or g.get('used_mib') is None or g['used_mib'] > limit)]

        if not check_only and signalled_gpus and settling(targets):
            deadline = procfs.Deadline(self.params['release_timeout'])
            while True:
                wait = deadline.clamp(0.2)
                if wait <= 0:
                    break
                time.sleep(wait)
                fresh = self.snapshot()
                if not fresh['driver']['ok']:
                    break
                snap = fresh
                targets, dummy = gpu_query.select_gpus(snap, self.params['gpus'])
                if not settling(targets):
                    break
            self.result['gpus'] = [gpu_query.summarize(g) for g in targets]
        entries = []
        planned = set(planned_pids)
        busy = sorted(set(pr.get('pid') for g in snap['gpus'] for pr in g.get('processes', [])
                          if pr.get('pid') not in planned))
        for gpu in targets:
            if not orphaned(gpu):
                continue
            index = gpu.get('index')
            entry = {'gpu': index, 'bus_id': gpu.get('bus_id'), 'used_mib_before': gpu['used_mib'],
                     'used_mib_after': None, 'result': None,
                     'reason': '%d MiB held by no process' % gpu['used_mib']}
            blockers = []
            if os.geteuid() != 0:
                blockers.append('not running as root (use become: true)')
            if busy:
                blockers.append('compute processes are listed on the node (PIDs %s) and nvidia-smi --gpu-reset needs '
                                'none on any GPU' % ', '.join(str(x) for x in busy))
            users = [pid for pid in self.device_users(index) if pid not in planned] if index is not None else []
            if users:
                blockers.append('PIDs %s have the device file of GPU %s open' % (', '.join(str(x) for x in users), index))
            if blockers:
                entry['result'] = 'skipped'
                entry['reason'] += '; not reset: ' + '; '.join(blockers)
                self.warnings.append('GPU %s: %s' % (index, entry['reason']))
                entries.append(entry)
                continue
            if check_only:
                entry['result'] = 'would reset'
                entries.append(entry)
                continue
            rc, out, err = self.smi.reset(index)
            entry['rc'] = rc
            entry['output'] = ' '.join(('%s %s' % (out, err)).split())
            entry['result'] = 'reset' if rc == 0 else 'failed'
            entries.append(entry)
        if any(e['result'] in ('reset', 'failed') for e in entries):
            self.result['changed'] = True
            after = self.snapshot()
            if after['driver']['ok']:
                for e in entries:
                    for gpu in after['gpus']:
                        if gpu.get('index') == e['gpu']:
                            e['used_mib_after'] = gpu.get('used_mib')
                after_targets, dummy = gpu_query.select_gpus(after, self.params['gpus'])
                self.result['gpus'] = [gpu_query.summarize(g) for g in after_targets]
        failed = [e for e in entries if e['result'] == 'failed']
        if failed:
            self.result['reset'] = entries
            self.warnings_to_result()
            self.fail('gpu_drain: GPU reset failed: %s' % '; '.join(
                'GPU %s: rc %s: %s' % (e['gpu'], e['rc'], e['output']) for e in failed))
        return entries

    # -- finish ------------------------------------------------------------
    def warnings_to_result(self):
        for warning in self.warnings:
            self.module.warn(warning)
        self.warnings = []

    def finish(self):
        if self.module._diff:
            self.result['diff'] = {'before': _holder_lines(self.result['holders']),
                                   'after': _holder_lines(self.result['remaining'])}
        self.warnings_to_result()
        self.result['elapsed'] = self.elapsed()
        self.module.exit_json(**self.result)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            gpus=dict(type='list', elements='raw', default=[]),
            match=dict(type='list', elements='str', default=[]),
            pids=dict(type='list', elements='int', default=[]),
            exclude=dict(type='list', elements='str', default=list(DEFAULT_EXCLUDE)),
            term_timeout=dict(type='float', default=30),
            kill_timeout=dict(type='float', default=15),
            signal=dict(type='str', default='SIGTERM',
                        choices=['SIGTERM', 'SIGINT', 'SIGQUIT', 'SIGHUP', 'SIGUSR1', 'SIGUSR2', 'SIGKILL']),
            reset_orphaned=dict(type='bool', default=False),
            max_used_mib=dict(type='int', default=16),
            release_timeout=dict(type='float', default=30),
            device_paths=dict(type='list', elements='str', default=['/dev/nvidia*']),
            backend=dict(type='str', default='auto', choices=['auto', 'nvidia-smi', 'nvml']),
            nvidia_smi=dict(type='path'),
            command_timeout=dict(type='float', default=60),
        ),
        supports_check_mode=True,
    )
    Drain(module).run()


if __name__ == '__main__':
    main()
