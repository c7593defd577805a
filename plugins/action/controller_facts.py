# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller-side facts of a redeploy run (documented in plugins/modules/controller_facts.py).

It runs in a worker process of ``ansible-playbook`` and executes no module. The worker is a fork of
the main process, so the main process is the worker's parent: its PID and start time identify the
controller of this run, and a node on the same machine (same boot id and PID namespace) can later
tell whether that controller is still alive (see module_utils/redeploy/lease.py).
"""

from __future__ import annotations

import getpass
import os
import random
import socket
import time

from ansible.plugins.action import ActionBase

from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import lease as lease_mod


def controller_identity(pid=None):
    pid = pid or os.getppid()
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name for this uid (a container)
        user = str(os.getuid())
    return {
        "host": socket.gethostname(),
        "pid": pid,
        "starttime": lease_mod.process_start(pid),
        "boot_id": lease_mod.boot_id(),
        "pidns": lease_mod.pid_namespace(),
        "user": user,
    }


def report_dir_problem(path):
    """None when a report can be written under ``path`` (made if missing), else why not. Changes nothing that exists."""
    probe_dir = path
    while probe_dir and not os.path.isdir(probe_dir):
        if os.path.exists(probe_dir):
            return "%s exists and is not a directory" % probe_dir
        parent = os.path.dirname(probe_dir.rstrip("/"))
        if parent == probe_dir:
            break
        probe_dir = parent
    name = os.path.join(probe_dir or ".", ".gpufleet-probe-%d" % os.getpid())
    try:
        fd = os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        return "cannot create a file in %s: %s" % (probe_dir, exc.strerror)
    return None


def new_run_id(now=None, pid=None):
    now = time.time() if now is None else now
    return "%s-%d-%04d" % (time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now)), pid or os.getppid(), random.randint(0, 9999))


class ActionModule(ActionBase):

    TRANSFERS_FILES = False
    _supports_check_mode = True
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        super().run(tmp, task_vars)
        dummy, args = self.validate_argument_spec(argument_spec=dict(
            run_id=dict(type="str", default=""),
            report_dir=dict(type="str", default=""),
        ))
        ident = controller_identity()
        run = {"run_id": args["run_id"] or new_run_id(pid=ident["pid"]), "controller": ident}
        if args["report_dir"]:
            problem = report_dir_problem(os.path.expanduser(args["report_dir"]))
            if problem:
                return dict(failed=True, msg="sglang_report_dir: the report directory %s is not usable: %s; fix it or choose "
                                             "another one (nothing was touched)" % (args["report_dir"], problem))
            run["report_dir"] = os.path.expanduser(args["report_dir"])
        return dict(changed=False, ansible_facts={"sglang_redeploy_run": run}, **run)
