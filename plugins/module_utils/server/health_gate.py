# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The health gate: wait for a started server's 2xx, tell its crash or exit from a slow start, fail with its log."""

from __future__ import annotations

import json
import os
import time

from ansible_collections.gpufleet.sglang.plugins.module_utils.common import http
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import wait
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import metrics
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import supervise as sp
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import sockets
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import systemd
from ansible_collections.gpufleet.sglang.plugins.module_utils.server.crash_watch import CrashWatch
from ansible_collections.gpufleet.sglang.plugins.module_utils.server.launch_params import LaunchError
from ansible_collections.gpufleet.sglang.plugins.module_utils.server.server_logs import short_lines

PROBE_TIMEOUT = 30.0
HEALTH_POLL_S = 0.2
# A crashed server has nothing to drain: SIGTERM, then SIGKILL after this many seconds (a server sleeping in its crash
# diagnostics does not act on SIGTERM before they end).
CRASH_STOP_GRACE_S = 5.0
# How long a server whose child is gone may take to exit by itself before the gate stops it: 0.5.23 kills its own
# children when it shuts down (the loser of a port conflict: measured 1.75 s from its "kill_process_tree called" line
# to its exit 3 on a loaded 2-core machine). A server that logs its crash diagnostics is stopped at once.
CRASH_EXIT_WAIT_S = 10.0


def num_text(value):
    return ("%d" % value) if float(value).is_integer() else ("%g" % value)


class HealthGate(object):
    """The health methods of :class:`launcher.Launcher`."""

    def _exit_of(self, pid, start, is_child):
        if is_child:
            status = sp.reap(pid)
            if status is not None:
                return status
        if sp.alive(pid, start):
            return None
        return {}

    def _answered_by_candidate(self, pid, state):
        """True when the listener on the port is in the candidate's process tree (``/proc/net/tcp`` inode ->
        ``/proc/<pid>/fd``). A 2xx from the port proves nothing by itself: the loser of a port conflict goes through its
        whole startup, its warmup reaches the incumbent (and it logs "fired up"), then it exits 3 (0.5.23, measured)."""
        held = sockets.port_held_by(self.port, [p for p, _s in state["members"]] or [pid])
        if held["ours"] or not held["listening"]:
            # No listener seen: the server runs in another network namespace than this module, or closed the port
            # since; nothing to compare.
            return True
        if not held["known"]:
            # The candidate's descriptors cannot be read (another user's server, without root): nothing to compare.
            if not state.get("unverified"):
                state["unverified"] = True
                self.ctx.warn("the health check of SGLang server %s cannot tell which process listens on port %d (the "
                              "descriptors of PID %d are not readable); it trusts the answer" % (self.name, self.port, pid))
            return True
        others = held["others"]
        who = ", ".join("PID %d (%s)" % (o, " ".join(self.masked(sp.cmdline(o)))[:120] or "?") for o in others[:3]) or \
            "a process this user cannot see"
        state["impostor"] = others
        state["last"] = "%s from %s, which is not in the candidate's process tree (PID %d): another server holds port %d" % (
            state["last"], who, pid, self.port)
        return False

    def _fail_crashed(self, pid, start, is_child, started, state, waited, log_offset, url):
        """A candidate whose child crashed: stop it at once (SIGTERM, SIGKILL after :data:`CRASH_STOP_GRACE_S`), raise."""
        res = self.result
        res["crashed"] = state["crash"]
        what = "left it running (pid %d): this run did not start it" % pid
        if started:
            grace = min(float(self.p["stop_timeout"]), CRASH_STOP_GRACE_S)
            try:
                # By PID for a unit too: `systemctl stop` would wait its TimeoutStopSec for a server that does not act on
                # SIGTERM in its diagnostics; the stop after it only settles the unit (nothing is left to signal).
                report = sp.stop_tree(pid, start, timeout=grace, is_child=is_child)
                if self.manager == "systemd":
                    try:
                        systemd.stop(self.run, self.systemctl(), self.unit)
                    except systemd.SystemdError as exc:
                        self.ctx.warn("the crashed server's processes are stopped, but %s" % exc)
                else:
                    sp.remove_quietly(self.pid_file)
                if report["still_running"]:
                    raise LaunchError("PIDs %s survived SIGKILL (uninterruptible sleep or PID 1 in a container?)"
                                      % report["still_running"], stop=report)
                res["stop"] = report
                what = "stopped it (pid %d: SIGTERM, then SIGKILL after %s s) so that it does not hold the GPUs" % (
                    pid, num_text(grace))
            except LaunchError as exc:
                what = "tried to stop it but: %s" % exc.msg
        tail = self.log_tail(log_offset, self.started_wall)
        raise LaunchError(
            "SGLang server %s (pid %d) crashed %.1f s into its health check, before %s answered 2xx: %s; %s. Last %d log "
            "lines:\n%s" % (self.name, pid, waited, url, state["crash"], what, len(tail), short_lines(tail)),
            log_tail=tail, crashed=state["crash"], server_exited=bool(res.get("stop")))

    def wait_healthy(self, pid, start, log_offset, is_child, started, health_path=None, on_poll=None):
        """Wait for a 2xx on the health path; then check the effective config (``check_config``). Raises LaunchError."""
        res = self.result
        res["url"] = self.url
        timeout = float(self.p["health_timeout"])
        path = health_path or self.p["health_path"]
        url = self.url + path
        state = {"last": "no answer yet", "exit": None, "healthy": False, "members": sp.tree(pid), "crash": None,
                 "impostor": None}
        deadline = wait.Deadline(timeout)
        # The log of this start only; for a server this run did not start, only what it logs from now on (the log file
        # also holds the lines of earlier servers, their crashes included).
        watch_log = self.log_file if self.log_file and os.path.exists(self.log_file) else None
        watch = CrashWatch(watch_log, log_offset if started else sp.log_size(watch_log) if watch_log else 0)

        probe = self._health_probe(pid, start, is_child, url, state, deadline, watch, on_poll)
        wait.wait_for(probe, deadline=deadline, interval=HEALTH_POLL_S)
        if state["crash"] and state["exit"] is None:
            self._wait_crash_exit(pid, start, is_child, state, watch)
        if not state["healthy"] and state["exit"] is None:
            state["exit"] = self._exit_of(pid, start, is_child)
        waited = round(deadline.elapsed(), 3)
        if state["healthy"]:
            if started and self.started_at is not None:
                res["startup_s"] = round(time.monotonic() - self.started_at, 3)
                self.record_startup(log_offset)
            if self.p["check_config"]:
                self.verify(log_offset, self.started_wall)
            return
        res["last_status"] = state["last"]
        if state["crash"] and state["exit"] is None:
            self._fail_crashed(pid, start, is_child, started, state, waited, log_offset, url)
        if state["exit"] is not None:
            self._fail_exited(pid, state, waited, log_offset, url)
        self._fail_unhealthy(pid, start, is_child, started, state, timeout, log_offset, url)

    def _health_probe(self, pid, start, is_child, url, state, deadline, watch, on_poll):
        """One poll of :meth:`wait_healthy` (True: stop waiting), as a function for ``wait.wait_for``."""

        def probe():
            if on_poll is not None:
                on_poll()
            state["exit"] = self._exit_of(pid, start, is_child)
            if state["exit"] is not None:
                return True
            state["members"] = sp.tree(pid) or state["members"]
            # A crashed server keeps its port in LISTEN through its crash diagnostics (5 s, then 60 s while a scheduler
            # lives) and answers nothing: fail now rather than after the health budget.
            state["crash"] = watch.check(pid, state["members"])
            if state["crash"]:
                return True
            try:
                status, _h, _b = http.request("GET", url, api_key=self.api_key,
                                              timeout=max(deadline.clamp(PROBE_TIMEOUT), 0.05))
                state["last"] = "HTTP %d" % status
                if 200 <= status < 300:
                    state["healthy"] = self._answered_by_candidate(pid, state)
                    return state["healthy"]
            except http.TLSError as exc:   # a refused certificate stays refused: stop waiting (the fix is in the message)
                state["last"] = "the health gate cannot reach the server over HTTPS: %s" % exc
                return True
            except http.HTTPConnectionError as exc:
                state["last"] = exc.kind if exc.kind in ("refused", "timeout") else "%s (%s)" % (exc.kind, exc.reason)
            return False

        return probe

    def _wait_crash_exit(self, pid, start, is_child, state, watch):
        """After a crash seen while the main process runs: wait a moment for it to exit with its status."""

        # A server that ends by itself also loses its children first (0.5.23 kills its own tree, then exits: the
        # loser of a port conflict exits 3 that way): give its main process a moment to exit with its status.
        def exited():
            state["exit"] = self._exit_of(pid, start, is_child)
            if state["exit"] is None:
                watch.check(pid, [])
            return state["exit"] is not None or watch.in_diagnostics

        wait.wait_for(exited, timeout=CRASH_EXIT_WAIT_S, interval=0.1)

    def _fail_exited(self, pid, state, waited, log_offset, url):
        """The server exited before it answered 2xx: kill its leftovers, raise with its exit and its log."""
        exit_info = state["exit"]
        leftovers = [(p, s) for p, s in state["members"] if p != pid]
        killed, _still = sp.kill_leftovers(leftovers, grace=5.0) if leftovers else ([], [])
        how = sp.describe_exit(exit_info)
        if state["crash"]:
            how = "%s (%s first)" % (how, state["crash"].replace("still runs", "still ran"))
        if self.manager == "systemd":
            try:
                how = "exited (%s)" % systemd.describe(self.unit_props(), self.unit)
            except LaunchError:
                pass
        tail = self.log_tail(log_offset, self.started_wall)
        if self.manager == "process":
            sp.remove_quietly(self.pid_file)
        raise LaunchError(
            "SGLang server %s (pid %d) %s after %.1f s, before %s answered 2xx (last answer: %s).%s Last %d log lines:\n%s"
            % (self.name, pid, how, waited, url, state["last"],
               (" Killed leftover processes %s." % killed) if killed else "", len(tail), short_lines(tail)),
            log_tail=tail, exit=exit_info, killed=killed, server_exited=True)

    def _fail_unhealthy(self, pid, start, is_child, started, state, timeout, log_offset, url):
        """No 2xx within the health budget: stop the server this run started (unless keep_on_failure), raise."""
        res = self.result
        tail = self.log_tail(log_offset, self.started_wall)
        if started and not self.p["keep_on_failure"]:
            try:
                report = self.stop({"pid": pid, "start": start}) if self.manager == "systemd" else \
                    sp.stop_tree(pid, start, timeout=self.p["stop_timeout"], is_child=is_child)
                if self.manager == "process":
                    sp.remove_quietly(self.pid_file)
                res["stop"] = report
                what = "stopped it (pid %d) so that it does not hold the GPUs; set keep_on_failure=true to keep it for debugging" % pid
            except LaunchError as exc:
                what = "tried to stop it but: %s" % exc.msg
        elif started:
            what = "left it running (pid %d) because keep_on_failure=true" % pid
        else:
            what = "left it running (pid %d): this run did not start it" % pid
        raise LaunchError(
            "SGLang server %s did not become healthy within %s s: %s never answered 2xx (last answer: %s); %s. Last %d log lines:\n%s"
            % (self.name, num_text(timeout), url, state["last"], what, len(tail), short_lines(tail)),
            log_tail=tail, server_exited=bool(res.get("stop")))

    def record_startup(self, log_offset):
        """The server's own startup phases (``/metrics`` with --enable-metrics, else its "Engine startup timings" log
        line), kept in ``<state_dir>/startup.json`` so that the next launch's health budget follows this one."""
        phases = {}
        if self.args.get("enable_metrics"):
            try:
                status, _h, body = http.request("GET", self.url + "/metrics", api_key=self.api_key, timeout=10)
                if status == 200 and isinstance(body, str):
                    phases = metrics.startup_phases_from_metrics(body) or {}
            except http.HTTPConnectionError:
                phases = {}
        if not phases:
            try:
                phases = metrics.startup_phases_from_log(self.log_text(log_offset, self.started_wall)) or {}
            except Exception:  # noqa: BLE001 - a log line in an unknown format only costs the budget
                phases = {}
        self.result["startup_phases"] = phases
        if phases:
            try:
                sp.write_private(os.path.join(self.state_dir, "startup.json"), json.dumps(
                    {"phases": phases, "startup_s": self.result.get("startup_s"), "fingerprint": self.fp,
                     "at": time.time()}, sort_keys=True) + "\n", mode=0o640)
            except OSError:
                pass
