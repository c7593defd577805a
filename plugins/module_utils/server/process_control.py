# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A server's process: what runs now, starting it (process or systemd unit) and stopping it."""

from __future__ import annotations

import os
import time

from ansible_collections.gpufleet.sglang.plugins.module_utils.common import http
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import wait
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import supervise as sp
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import sockets
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import systemd
from ansible_collections.gpufleet.sglang.plugins.module_utils.server.address import port_in_use
from ansible_collections.gpufleet.sglang.plugins.module_utils.server import unit as unit_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.server.crash_watch import is_server_argv
from ansible_collections.gpufleet.sglang.plugins.module_utils.server.launch_params import LaunchError
from ansible_collections.gpufleet.sglang.plugins.module_utils.server.server_logs import short_lines


class ProcessControl(object):
    """The process methods of :class:`launcher.Launcher`."""

    def unit_props(self):
        try:
            return systemd.show(self.run, self.systemctl(), self.unit)
        except systemd.SystemdError as exc:
            raise LaunchError(str(exc))

    def current(self):
        """What runs now: ``{pid, start, record, fingerprint, source, argv}`` (pid None: nothing)."""
        record = sp.read_state(self.state_file)
        cur = {"pid": None, "start": None, "record": record, "fingerprint": None, "source": None, "argv": None}
        if self.box is not None:
            self.box_current(cur)
        elif self.manager == "process":
            pid = sp.read_pid_file(self.pid_file)
            if pid and sp.alive(pid):
                start = sp.starttime(pid)
                if record and record.get("pid") == pid and record.get("starttime") == start:
                    cur.update(pid=pid, start=start, fingerprint=record.get("fingerprint"), source="pid_file")
                elif is_server_argv(sp.cmdline(pid)):
                    cur.update(pid=pid, start=start, source="pid_file (no launch record)")
        else:
            # manager systemd is explicit here (the plan picks it for auto only where systemd is PID 1): ask systemctl.
            props = self.unit_props()
            cur["unit"] = props
            pid = systemd.main_pid(props)
            if pid and systemd.is_active(props) and sp.alive(pid):
                start = sp.starttime(pid)
                cur.update(pid=pid, start=start, source="unit")
                if record and record.get("pid") == pid and record.get("starttime") == start:
                    cur["fingerprint"] = record.get("fingerprint")
                elif self.unit_path and props.get("NeedDaemonReload") != "yes":
                    # Started by systemd itself (at boot): the unit file names the identity it runs.
                    try:
                        with open(self.unit_path, encoding="utf-8") as fh:
                            cur["fingerprint"] = unit_mod.identity_of(fh.read())
                        cur["source"] = "unit (started by systemd)"
                    except OSError:
                        pass
        if cur["pid"]:
            cur["argv"] = self.masked(sp.cmdline(cur["pid"]))
        return cur

    def healthy_now(self, timeout=3.0):
        """One quick health probe: True, False (answers non-2xx or refuses), or None (timed out: busy)."""
        try:
            status, _h, _b = http.request("GET", self.url + "/health", api_key=self.api_key, timeout=timeout)
        except http.RequestTimeout:
            return None
        except http.HTTPConnectionError:
            return False
        return 200 <= status < 300

    # ---------------- stop ----------------

    def stop(self, cur):
        """Stop the server ``cur`` (:meth:`current`; ``is_child`` True when this process started it, so that the report
        has its exit status: a death by SIGTERM or exit status 143 is a normal stop, ``normal_stop``)."""
        timeout = self.p["stop_timeout"]
        pid, start = cur["pid"], cur["start"]
        if self.box is not None:
            report = self.box_stop(cur)
        elif self.manager == "process":
            report = sp.stop_tree(pid, start, timeout=timeout, is_child=bool(cur.get("is_child")))
        else:
            members = sp.tree(pid)
            began = time.monotonic()
            try:
                systemd.stop(self.run, self.systemctl(), self.unit)
            except systemd.SystemdError as exc:
                raise LaunchError(str(exc))
            left = [(p, s) for p, s in members if sp.alive(p, s)]
            killed, still = sp.kill_leftovers(left) if left else ([], [])
            report = {"signalled": [pid], "killed": killed, "exited": sorted(set(p for p, _s in members) - set(still)),
                      "still_running": still, "elapsed": round(time.monotonic() - began, 3)}
        if report["still_running"]:
            raise LaunchError("could not stop SGLang server %s: PIDs %s survived SIGKILL (uninterruptible sleep or PID 1 in a "
                              "container?)" % (self.name, report["still_running"]), stop=report)
        if self.manager == "process":
            sp.remove_quietly(self.pid_file, self.state_file)
        return report

    # ---------------- start ----------------

    def port_owner(self):
        listening, pids = sockets.port_listeners(self.port)
        if not listening and not port_in_use(self.host, self.port):
            return None
        if not pids:
            return "another process"
        return ", ".join("pid %d (%s)" % (pid, " ".join(self.masked(sp.cmdline(pid)))[:200] or "?") for pid in pids[:3])

    def wait_port_free(self, seconds):
        found = {"owner": self.port_owner()}

        def free():
            found["owner"] = self.port_owner()
            return found["owner"] is None

        if found["owner"] is not None and seconds > 0:
            wait.wait_for(free, timeout=seconds, interval=0.2)
        return found["owner"]

    def start(self, port_grace=0.0):
        """Start the server (files already written); returns ``(pid, starttime, log_offset, is_child)``."""
        owner = self.wait_port_free(port_grace)
        if owner is not None:
            raise LaunchError(
                "port %d is already in use by %s: SGLang server %s would fail to bind it, or the health check would reach the "
                "other server. Stop that process or choose another port (port / args.port). Nothing was started."
                % (self.port, owner, self.name))
        started_wall = time.time()
        self.result["url"] = self.url
        self.started_wall = started_wall
        if self.box is not None:
            pid, log_offset, is_child = self.box_start()
        elif self.manager == "process":
            env = dict(os.environ)
            env.update(self.env)
            env.update(self.secret_env)
            log_offset = self._log_header()
            try:
                pid = sp.spawn_detached(self.argv, env, self.log_file, chdir=self.p["chdir"])
            except sp.SpawnError as exc:
                raise LaunchError("could not start SGLang server %s: %s" % (self.name, exc))
            is_child = True
            sp.write_private(self.pid_file, "%d\n" % pid, mode=0o644)
        else:
            log_offset = sp.log_size(self.log_file) if self.log_file else 0
            props = self.unit_props()
            try:
                if props.get("NeedDaemonReload") == "yes" or self.result.get("unit_changed"):
                    systemd.daemon_reload(self.run, self.systemctl())
                systemd.start(self.run, self.systemctl(), self.unit)
            except systemd.SystemdError as exc:
                raise LaunchError(str(exc), log_tail=self.log_tail(log_offset, started_wall))
            props = self.unit_props()
            pid = systemd.main_pid(props)
            is_child = False
            if not pid:
                tail = self.log_tail(log_offset, started_wall)
                raise LaunchError("systemd unit %s has no main process right after start (%s). Last log lines:\n%s"
                                  % (self.unit, systemd.describe(props, self.unit), short_lines(tail)), log_tail=tail)
        start = sp.starttime(pid)
        self.started_at = time.monotonic()
        self.started_wall = started_wall
        state = {
            "name": self.name, "manager": self.manager, "pid": pid, "starttime": start, "port": self.port, "url": self.url,
            "fingerprint": self.fp, "identity": self.identity, "argv": self.masked(self.argv), "version": self.version,
            "log_offset": log_offset,
            "started_at": started_wall, "unit": self.unit if self.manager == "systemd" else None,
        }
        if self.box is not None:
            state["container"] = self.result.get("container")
        sp.write_state(self.state_file, state)
        return pid, start, log_offset, is_child
