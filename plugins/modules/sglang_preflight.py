# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_preflight
short_description: Read-only checks of a GPU node before an SGLang redeploy
version_added: 0.1.0
description:
  - Inspects the node in one round trip and reports every problem that would make a redeploy fail
    after the running server is already gone. It never changes anything.
  - Reads C(architectures[0]) from the target model's C(config.json) (SGLang's auto-chosen speculative
    defaults depend on it, sglang.md section 1.6) and from the draft model's, when one is given.
  - Takes one GPU snapshot (nvidia-smi or NVML) and checks that the driver answers and that the
    target GPUs exist.
  - Finds who listens on the server port, and whether that is the managed server (its PID file, its
    systemd unit's main process, or a descendant of either).
  - Problems are returned in RV(problems), each naming the variable to fix; the module itself fails
    only on bad input, so a playbook can print every problem at once.
options:
  model_path:
    description: Target model directory on the node.
    type: path
    required: true
  draft_model_path:
    description: Draft model directory on the node (speculative decoding), when there is one.
    type: path
  host:
    description: Address the server binds to; used for the port check and the managed server's URL.
    type: str
    default: 127.0.0.1
  port:
    description: Server port.
    type: int
    default: 30000
  gpus:
    description: GPU indices or UUIDs the server will use. Empty means every GPU of the node.
    type: list
    elements: str
    default: []
  pid_file:
    description: PID file of the managed server (process manager).
    type: path
  unit:
    description: systemd unit of the managed server.
    type: str
  nvidia_smi:
    description: nvidia-smi command or path.
    type: str
    default: nvidia-smi
  backend:
    description: GPU query backend; V(auto) uses NVML when C(pynvml) imports, else nvidia-smi.
    type: str
    choices: [auto, nvidia-smi, nvml]
    default: auto
  api_key:
    description: Accepted for symmetry with M(gpufleet.sglang.sglang_launch); not used for any request.
    type: str
  lock_path:
    description:
      - The node lock of M(gpufleet.sglang.node_lock). Its state is returned in RV(lock), so that a run
        that takes the lock afterwards can tell whether another run held it since this inspection.
    type: path
  directories:
    description:
      - Directories the server needs (config, state, logs). Each is reported in RV(directories), with
        whether it already exists with O(directory_mode), O(directory_owner) and O(directory_group), so
        that a playbook only creates or fixes the others.
    type: list
    elements: path
    default: []
  directory_mode:
    description: Permission bits (octal string) the O(directories) should have.
    type: str
    default: "0750"
  directory_owner:
    description: Owner (name or uid) the O(directories) should have. Empty means any.
    type: str
    default: ""
  directory_group:
    description: Group (name or gid) the O(directories) should have. Empty means any.
    type: str
    default: ""
author:
  - gpufleet maintainers (@gpufleet)
extends_documentation_fragment:
  - action_common_attributes
attributes:
  check_mode:
    support: full
    details: The module is read-only and runs normally in check mode.
  diff_mode:
    support: none
  platform:
    platforms: posix
seealso:
  - module: gpufleet.sglang.sglang_launch
  - module: gpufleet.sglang.gpu_memory_assert
"""

EXAMPLES = r"""
- name: Inspect the node before touching it
  gpufleet.sglang.sglang_preflight:
    model_path: /models/Kimi-K2.5
    draft_model_path: /models/Kimi-K2.5-eagle3
    port: 30000
    gpus: ["0", "1", "2", "3", "4", "5", "6", "7"]
    pid_file: /var/lib/sglang/main/server.pid
    unit: sglang-main.service
  register: node

- name: Stop here when the node is not ready
  ansible.builtin.fail:
    msg: "{{ node.problems | join(' | ') }}"
  when: node.problems | length > 0
"""

RETURN = r"""
arch:
  description: C(architectures[0]) of the target model, or V(null) when config.json cannot be read.
  returned: always
  type: str
  sample: DeepseekV3ForCausalLM
draft_arch:
  description: C(architectures[0]) of the draft model.
  returned: always
  type: str
systemd:
  description: Whether systemd runs as PID 1 on the node.
  returned: always
  type: bool
gpus:
  description: Per-GPU readings (index, uuid, name, used_mib, reserved_mib, total_mib, processes) of the target GPUs.
  returned: always
  type: list
  elements: dict
gpu_count:
  description: Number of GPUs that answered.
  returned: always
  type: int
backend:
  description: Which GPU backend answered.
  returned: always
  type: str
  sample: nvidia-smi
port_owner:
  description:
    - The process listening on the port (pid, comm, cmdline with secrets masked, managed), or V(null).
    - C(adoptable) is true for an unrecorded server (started by hand) whose process tree holds the
      target GPUs; the redeploy tears it down like the managed server.
  returned: always
  type: dict
managed:
  description: The managed server, as far as the node knows it (pid, source, running).
  returned: always
  type: dict
lock:
  description:
    - The node lock at O(lock_path) (path, held, owner, generation), or V(null) without O(lock_path).
    - C(generation) counts the acquisitions so far (see M(gpufleet.sglang.node_lock)).
  returned: always
  type: dict
  sample: {"path": "/run/lock/gpufleet-sglang-main.lock", "held": false, "owner": null, "generation": 7}
directories:
  description:
    - One entry per O(directories) item, in order (path, exists, mode, owner, group, ok); C(path) is the
      item with C(~) and variables expanded, so an absolute path comes back as given.
    - C(ok) is true when the path is a directory with O(directory_mode) and, when they are given, the
      owner and group; the others need a change.
  returned: always
  type: list
  elements: dict
  sample: [{"path": "/etc/sglang/main", "exists": true, "mode": "0750", "owner": "root", "group": "root", "ok": true}]
problems:
  description: Everything that would make the redeploy fail, each naming what to fix. Empty when the node is ready.
  returned: always
  type: list
  elements: str
"""

import grp
import json
import os
import pwd
import stat

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.sglang.plugins.module_utils import gpu_query, procfs, sockets
from ansible_collections.gpufleet.sglang.plugins.module_utils import lock as node_lock_state
from ansible_collections.gpufleet.sglang.plugins.module_utils import sglang_process


def read_arch(path):
    """``(arch, error)`` from ``<path>/config.json``."""
    if not os.path.isdir(path):
        return None, "does not exist or is not a directory"
    cfg = os.path.join(path, "config.json")
    try:
        with open(cfg, encoding="utf-8") as fh:
            data = json.load(fh)
    except OSError as exc:
        return None, "has no readable config.json (%s)" % exc.strerror
    except ValueError as exc:
        return None, "has a config.json that is not valid JSON (%s)" % exc
    archs = data.get("architectures") if isinstance(data, dict) else None
    if isinstance(archs, list) and archs and isinstance(archs[0], str):
        return archs[0], None
    return None, None


def systemd_running():
    return os.path.isdir("/run/systemd/system")


def unit_main_pid(module, unit):
    systemctl = module.get_bin_path("systemctl")
    if not systemctl or not unit:
        return None
    rc, out, dummy = module.run_command([systemctl, "show", "--property=MainPID", "--value", unit], check_rc=False)
    if rc != 0:
        return None
    try:
        pid = int(out.strip() or 0)
    except ValueError:
        return None
    return pid or None


def pid_file_server(pid_file):
    """The PID recorded in ``pid_file`` when that process still runs, else None.

    A PID file outlives its server (a crash, a reboot) and the PID can be reused by an unrelated
    process; the teardown must never take that one for the server. When the state file that
    M(gpufleet.sglang.sglang_launch) writes next to the PID file records the same PID with its start
    time, the start time must match too; a zombie never counts.
    """
    pid = sglang_process.read_pid_file(pid_file)
    if not pid:
        return None
    state = sglang_process.read_state(sglang_process.state_path_for(pid_file)) or {}
    start = state.get("starttime") if state.get("pid") == pid else None
    try:
        return pid if sglang_process.alive(pid, start) else None
    except (TypeError, ValueError):  # a state file with a start time that is not a number
        return pid if sglang_process.alive(pid) else None


def _name(lookup, ident):
    try:
        return lookup(ident)[0]
    except KeyError:  # no name for this id on the node
        return str(ident)


def _matches(wanted, ident, name):
    """True when ``wanted`` (a name or a number, "" = any) is the id ``ident`` whose name is ``name``."""
    return not wanted or wanted == name or wanted == str(ident)


def inspect_directory(path, mode, owner, group):
    """``{path, exists, mode, owner, group, ok}`` for ``path``; ``mode`` is an int, ``owner``/``group`` "" for any."""
    entry = {"path": path, "exists": False, "mode": None, "owner": None, "group": None, "ok": False}
    try:
        st = os.stat(path)
    except OSError:
        return entry
    entry.update(exists=True, mode="%04o" % stat.S_IMODE(st.st_mode),
                 owner=_name(pwd.getpwuid, st.st_uid), group=_name(grp.getgrgid, st.st_gid))
    entry["ok"] = (stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == mode
                   and _matches(owner, st.st_uid, entry["owner"]) and _matches(group, st.st_gid, entry["group"]))
    return entry


def main():
    module = AnsibleModule(
        argument_spec=dict(
            model_path=dict(type="path", required=True),
            draft_model_path=dict(type="path"),
            host=dict(type="str", default="127.0.0.1"),
            port=dict(type="int", default=30000),
            gpus=dict(type="list", elements="str", default=[]),
            pid_file=dict(type="path"),
            unit=dict(type="str"),
            nvidia_smi=dict(type="str", default="nvidia-smi"),
            backend=dict(type="str", choices=["auto", "nvidia-smi", "nvml"], default="auto"),
            api_key=dict(type="str", no_log=True),
            lock_path=dict(type="path"),
            directories=dict(type="list", elements="path", default=[]),
            directory_mode=dict(type="str", default="0750"),
            directory_owner=dict(type="str", default=""),
            directory_group=dict(type="str", default=""),
        ),
        supports_check_mode=True,
    )
    p = module.params
    problems = []
    if not 1 <= p["port"] <= 65535:
        module.fail_json(msg="port must be between 1 and 65535, got %s" % p["port"])
    try:
        mode = int(p["directory_mode"], 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o7777:
        module.fail_json(msg="directory_mode must be an octal string such as '0750', got %r" % p["directory_mode"])

    arch, err = read_arch(p["model_path"])
    if err:
        problems.append("sglang_server_args.model_path: %s %s on this node; copy the model there or fix the path" % (p["model_path"], err))
    draft_arch = None
    if p["draft_model_path"]:
        draft_arch, err = read_arch(p["draft_model_path"])
        if err:
            problems.append("sglang_server_args.speculative_draft_model_path: %s %s on this node; copy the draft model there or fix the path"
                            % (p["draft_model_path"], err))

    # GPUs: one snapshot.
    wanted = p["gpus"]
    try:
        backend, dummy = gpu_query.open_backend(p["backend"], gpu_query.module_runner(module, timeout=60), p["nvidia_smi"])
    except gpu_query.BackendUnavailable as exc:
        module.fail_json(msg="backend=%s cannot be used: %s" % (p["backend"], exc))
    try:
        snap = backend.snapshot()
    finally:
        backend.close()
    driver = snap.get("driver") or {}
    selected = []
    if not driver.get("ok", False):
        problems.append("nvidia-smi does not answer: %s (%s)" % (
            gpu_query.STATUS_HINTS.get(driver.get("status"), driver.get("status")), (driver.get("message") or "").strip()[:200]))
    else:
        selected, errors = gpu_query.select_gpus(snap, wanted)
        answering = [g for g in snap.get("gpus", []) if not g.get("lost")]
        if errors:
            problems.append("sglang_server_cuda_visible_devices / tp_size: %s; the node has %d GPU(s)" % ("; ".join(errors), len(answering)))
        for gpu in selected:
            if gpu.get("lost"):
                problems.append("%s is lost (%s); the server cannot use it" % (gpu_query.gpu_label(gpu), gpu.get("lost_reason")))
    gpus = [gpu_query.summarize(g) for g in selected]

    # The managed server.
    managed = {"pid": None, "source": None, "running": False}
    if p["pid_file"]:
        pid = pid_file_server(p["pid_file"])
        if pid:
            managed = {"pid": pid, "source": "pid_file", "running": True}
    is_systemd = systemd_running()
    if managed["pid"] is None and p["unit"] and is_systemd:
        pid = unit_main_pid(module, p["unit"])
        if pid:
            managed = {"pid": pid, "source": "unit", "running": True}

    # The port.
    port_owner = None
    listening, owners = sockets.port_listeners(p["port"])
    if listening:
        table = procfs.process_table(with_cgroup=False)
        managed_tree = set()
        if managed["pid"]:
            managed_tree = {managed["pid"]} | set(procfs.descendants(table, managed["pid"]))
        owner = owners[0] if owners else None
        info = table.get(owner) if owner else None
        port_owner = {
            "pid": owner,
            "comm": info.comm if info else None,
            "cmdline": " ".join(sglang_process.mask_argv(list(info.cmdline))) if info else None,
            "managed": bool(owners) and all(o in managed_tree for o in owners),
        }
        if not port_owner["managed"]:
            who = ("PID %s (%s)" % (owner, port_owner["cmdline"] or port_owner["comm"])) if owner else "a process this user cannot see"
            holder_pids = set(gpu_query.holders(selected))
            owner_tree = ({owner} | set(procfs.descendants(table, owner))) if owner else set()
            if managed["pid"] is None and owner_tree & holder_pids:
                # A server nobody recorded (started by hand) that holds the target GPUs:
                # the teardown stops it together with its tree.
                port_owner["adoptable"] = True
            else:
                problems.append("sglang_server_args.port: port %d is held by %s, which is not the managed server; "
                                "stop it or choose another port" % (p["port"], who))

    module.exit_json(
        changed=False,
        arch=arch,
        draft_arch=draft_arch,
        systemd=is_systemd,
        gpus=gpus,
        gpu_count=len([g for g in snap.get("gpus", []) if not g.get("lost")]),
        backend=snap.get("backend"),
        port_owner=port_owner,
        managed=managed,
        lock=node_lock_state.inspect(p["lock_path"]) if p["lock_path"] else None,
        directories=[inspect_directory(d, mode, p["directory_owner"], p["directory_group"]) for d in p["directories"]],
        problems=problems,
    )


if __name__ == "__main__":
    main()
