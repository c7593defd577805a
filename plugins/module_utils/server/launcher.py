# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The launch engine: render, start, stop and health-gate one SGLang server, and check what it runs.

Used by the modules ``sglang_launch`` (one verb: start/stop/restart), ``sglang_replace`` (the whole
outage window in one run) and ``sglang_preflight`` (what runs now, read-only). It needs an object
``ctx`` with the few AnsibleModule methods it calls (``run_command``, ``get_bin_path``, ``warn``) and
a set ``ctx.no_log_values``; a module passes itself.

Files of one server (docs/design.md, "Node state"):

* ``<config_dir>/candidate/server.json`` (0640): the launch record, no secret values; the rollback
  launches ``known-good/server.json`` again.
* ``<config_dir>/candidate/secrets.json`` (0600): the secret args (API keys) and secret env values.
* ``<config_dir>/candidate/config.yaml`` (0600): SGLang's ``--config`` file carrying the API keys
  (0.5.10+), so that they never show in ``ps``.
* ``<config_dir>/candidate/server.env`` (0600): the secret env values, as the unit's EnvironmentFile.
* ``<unit_dir>/<unit>`` (0644, systemd): rendered here, with the launch identity in a comment.
* ``<state_dir>/server.pid`` and ``server.state.json`` (0600): what runs, with its identity.
* the log file (0600: SGLang prints its server args at startup, see docs/user-guide.md, "Secrets").

The engine is :class:`Launcher`, put together from one class per concern (all in this folder): ``launch_plan.py``
(rendering and files), ``process_control.py`` (what runs, start, stop), ``server_logs.py``, ``health_gate.py`` (waiting
for health) and ``config_check.py`` (the effective config); ``launch_params.py``, ``address.py``, ``stored_launch.py``
and ``crash_watch.py`` hold the functions they share.
"""

from __future__ import annotations

import os

from ansible_collections.gpufleet.sglang.plugins.module_utils.common import names as names_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import secrets as secret_rules
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import supervise as sp
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import systemd
from ansible_collections.gpufleet.sglang.plugins.module_utils.server.config_check import ConfigCheck
from ansible_collections.gpufleet.sglang.plugins.module_utils.server.container_control import MANAGERS as CONTAINER_MANAGERS, ContainerControl
from ansible_collections.gpufleet.sglang.plugins.module_utils.server.health_gate import HealthGate
from ansible_collections.gpufleet.sglang.plugins.module_utils.server.launch_plan import LaunchPlan
from ansible_collections.gpufleet.sglang.plugins.module_utils.server.launch_params import (
    DEFAULT_HOST, DEFAULT_PORT, DEFAULTS, LaunchError, gid_of, norm_key, uid_of, with_defaults)
from ansible_collections.gpufleet.sglang.plugins.module_utils.server.process_control import ProcessControl
from ansible_collections.gpufleet.sglang.plugins.module_utils.server.server_logs import ServerLogs
from ansible_collections.gpufleet.sglang.plugins.module_utils.server.stored_launch import (
    candidate_dir, known_good_dir, launch_params_from_record, load_record, read_json, recorded_launch)

# The engine's API as its callers (sglang_launch, redeploy/replace.py, redeploy/preflight.py) name it.
__all__ = ["DEFAULTS", "DEFAULT_PORT", "LaunchError", "Launcher", "candidate_dir", "gid_of", "known_good_dir",
           "launch_params_from_record", "load_record", "norm_key", "read_json", "running_diff_source", "uid_of", "CONTAINER_MANAGERS"]


class Launcher(LaunchPlan, ContainerControl, ProcessControl, ServerLogs, HealthGate, ConfigCheck):
    """One server's launch, from ``params`` (see DEFAULTS). ``ctx``: the module (run_command, get_bin_path, warn)."""

    def __init__(self, ctx, params, check_mode=False):
        self.ctx = ctx
        self.names = names_mod.Names.of_module(ctx)
        self.p = with_defaults(params)
        self.check_mode = check_mode
        p = self.p
        self.name = p["name"]
        self.version = p["version"]
        self.manager = p["manager"]
        self.unit = p["unit"] or "sglang-%s.service" % self.name
        self.state_dir = p["state_dir"] or os.path.join("/run/sglang", self.name)
        self.pid_file = p["pid_file"] or os.path.join(self.state_dir, "server.pid")
        self.state_file = sp.state_path_for(self.pid_file)
        self.log_file = p["log_file"] or (os.path.join(self.state_dir, "server.log") if self.manager == "process" else None)
        if self.manager in CONTAINER_MANAGERS:
            self.log_file = None                   # the runtime keeps the container's log (``<cli> logs``)
        files = candidate_dir(p["config_dir"]) if p["config_dir"] else self.state_dir
        self.files_dir = files
        self.config_path = p["config_file"] or os.path.join(files, "config.yaml")
        self.env_file = os.path.join(files, "server.env")
        self.secrets_file = os.path.join(files, "secrets.json")
        self.record_file = p["record_file"] or (os.path.join(files, "server.json") if p["config_dir"] else None)
        self.unit_path = os.path.join(p["unit_dir"], self.unit) if (p["unit_dir"] and self.manager == "systemd") else None
        self.secrets = []
        self.blockers = []
        self.args = {}
        self.secret_args = {}
        self.env = {}
        self.secret_env = {}
        self.flags = []
        self.argv = []
        self.config_text = None
        self.unit_text = None
        self.identity = None
        self.fp = None
        self.host = DEFAULT_HOST
        self.port = DEFAULT_PORT
        self.url = None
        self.api_key = None
        self.python = p["python"]
        self.python_path = p["python"]
        self.started_at = None
        self.started_wall = None
        self.result = {}
        self._systemctl = None
        self.box = None
        self.image = None
        if self.manager in CONTAINER_MANAGERS:
            self.container_setup()

    # ---------------- helpers ----------------

    def secret(self, value):
        if value not in (None, ""):
            value = str(value)
            if value not in self.secrets:
                self.secrets.append(value)
            try:
                self.ctx.no_log_values.add(value)
            except AttributeError:
                pass

    def masked(self, argv):
        return secret_rules.mask_argv(argv, self.secrets)

    def mask(self, text):
        return secret_rules.mask_text(text, self.secrets)

    def run(self, argv):
        return self.ctx.run_command(argv, environ_update=dict(systemd.C_ENV))

    def systemctl(self):
        if self._systemctl is None:
            self._systemctl = self.ctx.get_bin_path("systemctl", required=True)
        return self._systemctl


def running_diff_source(ctx, cur, base, port_owner=None):
    """What runs now, for the ``--diff`` (redeploy/diff.py): the launch the running server was started with, rendered
    again from its record (:func:`recorded_launch`, :func:`launch_params_from_record` over ``base``, this run's
    params); its command line only (masked) when it has no record; ``{"label": "nothing runs"}`` when nothing runs.
    ``cur``: :meth:`Launcher.current`; ``port_owner``: the PID of an unmanaged server on the port (adopted), if any."""
    pid = (cur or {}).get("pid") or port_owner
    if not pid:
        return {"label": "nothing runs"}
    label = "running PID %s" % pid
    record, stored = recorded_launch((base or {}).get("config_dir"), (cur or {}).get("fingerprint")) \
        if (cur or {}).get("pid") else (None, None)
    if record is None:
        argv = (cur or {}).get("argv") if (cur or {}).get("pid") else None
        return {"label": "%s, not started by this collection" % label,
                "argv": secret_rules.mask_argv(argv if argv is not None else sp.cmdline(pid))}
    params = launch_params_from_record(record, stored, dict(base, manager=record.get("manager") or base.get("manager")))
    before = Launcher(ctx, params, check_mode=True)
    before.plan()
    return before.diff_source(label)
