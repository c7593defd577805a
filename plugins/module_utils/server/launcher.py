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
"""

from __future__ import annotations

import json
import os
import socket
import time

from ansible_collections.gpufleet.sglang.plugins.module_utils.common import http
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import records
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import identity
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import secrets as secret_rules
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import metrics
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import procfs
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import supervise as sp
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import sockets
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import systemd
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import wait
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import compare
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import flags as flag_table
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import render
from ansible_collections.gpufleet.sglang.plugins.module_utils.server import unit as unit_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import versions
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import names as names_mod

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 30000
LOG_TAIL_LINES = 40
JOURNAL_LINES = 200
MSG_LINE_MAX = 400
PROBE_TIMEOUT = 30.0
HEALTH_POLL_S = 0.2
WILDCARD_HOSTS = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1", "[::]": "::1"}
# The processes of an SGLang server whose loss means that the server crashed: their titles (setproctitle, 0.5.23
# managers/scheduler.py, detokenizer_manager.py, data_parallel_controller.py: sglang::scheduler with _DP<d>/_TP<n>
# suffixes, sglang::detokenizer) and, cut to 15 characters, their comm.
CHILD_TITLES = ("sglang::scheduler", "sglang::detokenizer", "sglang::data_parallel_controller")
CHILD_COMMS = ("sglang::schedul", "sglang::detoken", "sglang::data_pa")
# What an SGLang server logs when one of its processes failed (0.5.23: tokenizer_manager.py, scheduler.py,
# detokenizer_manager.py, engine.py). After the first one the real server sleeps 5 s "before crash diagnostics",
# then 60 s more "for CUDA coredumps" while a scheduler lives: its port stays in LISTEN and nothing answers.
CRASH_LINES = ("Sleeping 5 seconds before crash diagnostics", "Scheduler hit an exception",
               "DetokenizerManager hit an exception", "DataParallelController hit an exception",
               "TokenizerManager hit an exception", "Received sigquit from a child process")
# A crashed server has nothing to drain: SIGTERM, then SIGKILL after this many seconds (a server sleeping in its crash
# diagnostics does not act on SIGTERM before they end).
CRASH_STOP_GRACE_S = 5.0
# How long a server whose child is gone may take to exit by itself before the gate stops it: 0.5.23 kills its own
# children when it shuts down (the loser of a port conflict: measured 1.75 s from its "kill_process_tree called" line
# to its exit 3 on a loaded 2-core machine). A server that logs its crash diagnostics is stopped at once.
CRASH_EXIT_WAIT_S = 10.0
DIAGNOSTICS_LINE = "before crash diagnostics"

DEFAULTS = {
    "name": "main", "version": "0.5.23", "manager": "process", "unit": None, "unit_dir": None, "python": "python3",
    "args": {}, "api_key": None, "env": {}, "chdir": None, "user": "", "group": "", "environment_file": "",
    "host": None, "port": None, "config_dir": None, "state_dir": None, "pid_file": None, "log_file": None,
    "config_file": None, "health_path": "/health_generate", "health_timeout": 1800.0, "stop_timeout": 60.0,
    "keep_on_failure": False, "expect": None, "adjustments": [], "on_override": "fail", "allow_api_key_in_argv": False,
    "record_file": None, "record_extra": {}, "check_config": True, "secret_env": None, "secret_args": None,
}


class LaunchError(Exception):
    def __init__(self, msg, **extra):
        super(LaunchError, self).__init__(msg)
        self.msg = msg
        self.extra = extra


def uid_of(name):
    """A user name or numeric id -> uid (KeyError for an unknown name)."""
    import pwd
    try:
        return int(name)
    except ValueError:
        return pwd.getpwnam(name).pw_uid


def gid_of(name):
    """A group name or numeric id -> gid (KeyError for an unknown name)."""
    import grp
    try:
        return int(name)
    except ValueError:
        return grp.getgrnam(name).gr_gid


_BOOL_KEYS = ("keep_on_failure", "allow_api_key_in_argv", "check_config")
_FLOAT_KEYS = ("health_timeout", "stop_timeout", "health_timeout_configured")


def with_defaults(params):
    """The launch params with defaults, typed: a dict option's values arrive untyped (ansible-core 2.17 and 2.18
    render them as strings)."""
    out = dict(DEFAULTS)
    out.update(dict((k, v) for k, v in (params or {}).items() if v is not None or k not in DEFAULTS))
    for key in _BOOL_KEYS:
        if isinstance(out.get(key), str):
            out[key] = out[key].strip().lower() in ("1", "true", "yes", "on", "y")
    for key in _FLOAT_KEYS:
        if isinstance(out.get(key), str):
            try:
                out[key] = float(out[key]) if out[key].strip() else DEFAULTS.get(key)
            except ValueError:
                raise LaunchError("launch.%s must be a number of seconds, got %r" % (key, out[key]))
    for key in ("port",):
        if isinstance(out.get(key), str) and out[key].strip():
            try:
                out[key] = int(out[key])
            except ValueError:
                raise LaunchError("launch.%s must be an integer, got %r" % (key, out[key]))
    for key, value in list(out.items()):
        if value == "" and key in ("unit", "unit_dir", "config_file", "record_file", "pid_file", "log_file", "chdir", "host"):
            out[key] = None
    return out


def norm_key(key):
    return str(key).strip().lstrip("-").replace("-", "_")


def probe_host(host):
    host = (host or "").strip()
    if host in WILDCARD_HOSTS:
        return WILDCARD_HOSTS[host]
    return host.strip("[]")


def base_url(host, port, tls=False):
    """The URL the collection calls the server at: https when its args turn TLS on (ssl_certfile)."""
    host = probe_host(host)
    if ":" in host:
        host = "[%s]" % host
    return "%s://%s:%d" % ("https" if tls else "http", host, port)


def port_in_use(host, port, timeout=0.5):
    try:
        infos = socket.getaddrinfo(probe_host(host), port, 0, socket.SOCK_STREAM)
    except socket.gaierror:
        return False
    for family, socktype, proto, _canon, addr in infos:
        sock = socket.socket(family, socktype, proto)
        sock.settimeout(timeout)
        try:
            sock.connect(addr)
            return True
        except OSError:
            continue
        finally:
            sock.close()
    return False


def short_lines(lines):
    """Log lines for a message: very long ones (SGLang's server_args=...) are cut."""
    return "\n".join(line if len(line) <= MSG_LINE_MAX else line[:MSG_LINE_MAX] + " [... %d more characters]" % (
        len(line) - MSG_LINE_MAX) for line in lines)


def num_text(value):
    return ("%d" % value) if float(value).is_integer() else ("%g" % value)


candidate_dir = records.candidate_dir
known_good_dir = records.known_good_dir


def read_json(path):
    try:
        return records.read_json(path)
    except records.RecordError as exc:
        raise LaunchError(str(exc))


def load_record(directory):
    """``(record, secrets)`` of a stored launch (``known-good/``): secrets from ``secrets.json``, or, for records
    written before it existed, the API key from ``config.yaml``. ``(None, None)`` when there is no record."""
    record = read_json(os.path.join(directory, "server.json"))
    if record is None:
        return None, None
    stored = read_json(os.path.join(directory, "secrets.json"))
    if stored is None:
        stored = {"args": {}, "env": {}}
        legacy = compare.read_config_yaml(os.path.join(directory, "config.yaml"))
        for key, value in legacy.items():
            stored["args"][norm_key(key)] = value
    return record, {"args": dict(stored.get("args") or {}), "env": dict(stored.get("env") or {})}


def launch_params_from_record(record, stored, base):
    """Launcher params that start the stored record again, over ``base`` (paths, timeouts of this run)."""
    params = dict(base)
    args = dict(record.get("args") or {})
    for key, value in (stored.get("args") or {}).items():
        args[key] = value
    env = dict(record.get("env") or {})
    env.update(stored.get("env") or {})
    if record.get("cuda_visible_devices") not in (None, "") and "CUDA_VISIBLE_DEVICES" not in env:
        env["CUDA_VISIBLE_DEVICES"] = record["cuda_visible_devices"]
    params.update(
        name=record.get("name") or base.get("name"), version=record.get("version") or base.get("version"),
        manager=record.get("manager") or base.get("manager"), python=record.get("python") or base.get("python"),
        args=args, env=env, chdir=record.get("chdir"), api_key=None,
        expect=record.get("effective") or None, adjustments=record.get("adjustments") or [],
    )
    return params


def recorded_launch(config_dir, fingerprint):
    """``(record, secrets)`` of the stored launch (candidate, then known-good) whose fingerprint is ``fingerprint``;
    ``(None, None)`` when none is (a server this collection did not start, an unreadable record)."""
    if not config_dir or not fingerprint:
        return None, None
    for directory in (candidate_dir(config_dir), known_good_dir(config_dir)):
        try:
            record, stored = load_record(directory)
        except LaunchError:
            continue
        if record is not None and record.get("fingerprint") == fingerprint:
            return record, stored
    return None, None


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


def is_server_argv(argv):
    """True for the command line of an SGLang server's main process: ``python -m sglang.launch_server ...``, or the
    ``sglang serve ...`` of 0.5.10+ (0.5.23 recommends it): the console script runs the server in its own process, so
    its command line is ``[python, .../bin/sglang, serve, ...]`` (through the script's shebang) or
    ``[.../bin/sglang, serve, ...]``; ``python -m sglang.cli.main serve ...`` too. Only the words before the first
    flag of the server are read (``--model-path`` and what follows never decide)."""
    words = [str(w) for w in argv or []]
    for i, word in enumerate(words):
        if word.startswith("--"):
            break
        nxt = words[i + 1] if i + 1 < len(words) else None
        if word == "-m" and nxt == "sglang.launch_server":
            return True
        if word == "-m" and nxt in ("sglang.cli.main", "sglang.cli") and words[i + 2:i + 3] == ["serve"]:
            return True
        if os.path.basename(word) == "sglang" and nxt == "serve" and i <= 1:
            return True
    return False


def child_role(pid):
    """The SGLang title of ``pid`` (``sglang::scheduler_TP0``, ``sglang::detokenizer``, or the 15-character comm when
    the command line is unreadable); None for any other process (the resource tracker, a helper)."""
    argv = sp.cmdline(pid)
    title = argv[0] if argv else ""
    if title.startswith(CHILD_TITLES):
        return title.split()[0]
    comm = procfs.read_comm(pid) or ""
    return comm if comm.startswith(CHILD_COMMS) else None


def _parent_of(pid):
    stat = procfs.read_stat(int(pid))
    return None if stat is None else stat["ppid"]


def crash_line(text):
    """The first line of ``text`` that says an SGLang process failed (:data:`CRASH_LINES`), or None."""
    for line in (text or "").splitlines():
        if any(marker in line for marker in CRASH_LINES):
            return line.strip()
    return None


class CrashWatch(object):
    """A candidate's crash, seen before its main process exits: one of its scheduler or detokenizer processes is gone
    while the main process still runs, or its log says that a process failed.

    ``check(main_pid, members)`` (``members``: :func:`supervise.tree`) notes every SGLang child it sees and returns
    why the server crashed, or None. Only the processes the server itself started count: a child of the main process
    or of its ``sglang::data_parallel_controller``; a process that a scheduler forks for a moment keeps its parent's
    title (setproctitle rewrites the command line that fork copies) and may end at any time. ``log_path`` is read
    from ``offset`` on, a little at each check.
    """

    def __init__(self, log_path=None, offset=0, role_of=child_role, alive=sp.alive, parent_of=None):
        self.parent_of = parent_of or _parent_of
        self.children = {}
        self.in_diagnostics = False
        self.log_path = log_path
        self.offset = offset or 0
        self.partial = ""
        self.role_of = role_of
        self.alive = alive

    def _new_log_text(self):
        if not self.log_path:
            return ""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                if fh.tell() < self.offset:
                    self.offset = 0           # rotated or truncated: from its start
                fh.seek(self.offset)
                data = fh.read(1024 * 1024)
                self.offset = fh.tell()
        except OSError:
            return ""
        text = self.partial + data.decode("utf-8", "replace")
        head, sep, self.partial = text.rpartition("\n")
        return head + sep

    def check(self, main_pid, members):
        dp_titles = ("sglang::data_parallel_controller", "sglang::data_pa")
        controllers = set([main_pid]) | set(p for p, (_s, role) in self.children.items() if role.startswith(dp_titles))
        roles = {}
        for pid, dummy in members:
            if pid != main_pid and pid not in self.children:
                roles[pid] = self.role_of(pid)
                if (roles[pid] or "").startswith(dp_titles):
                    controllers.add(pid)
        for pid, start in members:
            if roles.get(pid) and self.parent_of(pid) in controllers:
                self.children[pid] = (start, roles[pid])
        text = self._new_log_text()
        self.in_diagnostics = self.in_diagnostics or DIAGNOSTICS_LINE in text
        for pid, (start, role) in sorted(self.children.items()):
            if not self.alive(pid, start):
                return "its process %s (PID %d) is gone while the main process %d still runs" % (role, pid, main_pid)
        line = crash_line(text)
        if line:
            return "its log says: %s" % line[:MSG_LINE_MAX]
        return None


class Launcher(object):
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

    # ---------------- planning ----------------

    def plan(self):
        """Render what this launch runs; fills ``blockers`` instead of raising."""
        try:
            versions.rule_version(self.version)
        except ValueError as exc:
            self.blockers.append("version: %s" % exc)
        args = self._split_secrets()
        self._place(args)
        self._render(args)
        self._find_python()
        self._identify()
        return self.blockers

    def _split_secrets(self):
        """Secret env variables and args apart from the others (they go to a 0600 file, never to argv)."""
        p = self.p
        for key, value in (p["env"] or {}).items():
            key = str(key)
            value = "" if value is None else str(value)
            if secret_rules.is_secret_name(key):
                self.secret_env[key] = value
                self.secret(value)
            else:
                self.env[key] = value
        self.api_key = p["api_key"]
        self.secret(self.api_key)
        args = {}
        for key, value in (p["args"] or {}).items():
            args[norm_key(key)] = value
        for key in list(args):
            if (key in flag_table.FLAGS and flag_table.FLAGS[key]["secret"]) or secret_rules.is_secret_name(key):
                value = args.pop(key)
                if value not in (None, ""):
                    self.secret_args[key] = value
                    self.secret(value)
        if self.api_key:
            if "api_key" in self.secret_args and str(self.secret_args["api_key"]) != self.api_key:
                self.blockers.append("api_key is given both as the api_key option and in args with different values; give it once")
            self.secret_args["api_key"] = self.api_key
        elif "api_key" in self.secret_args:
            self.api_key = str(self.secret_args["api_key"])
        for value in list(self.secret_args.values()) + list(self.secret_env.values()):
            if any(ch in str(value) for ch in "\r\n\0"):
                self.blockers.append("a secret value (API key or secret env variable) contains a newline or NUL byte, which "
                                     "no HTTP header and no config file can carry; fix %s / %s" % (self.names.of("api_key"), self.names.of("env")))
        return args

    def _place(self, args):
        """The port and host the server binds (the options win over args only when they agree)."""
        p = self.p
        if p["port"] is not None:
            if "port" in args and str(args["port"]) != str(p["port"]):
                self.blockers.append("port=%s conflicts with args.port=%s; give one of them" % (p["port"], args["port"]))
            args["port"] = p["port"]
        if p["host"]:
            if "host" in args and str(args["host"]) != p["host"]:
                self.blockers.append("host=%s conflicts with args.host=%s; give one of them" % (p["host"], args["host"]))
            args["host"] = p["host"]
        try:
            self.port = int(args.get("port", DEFAULT_PORT))
            if not 0 < self.port < 65536:
                self.blockers.append("%s: %d is not a TCP port; give a port from 1 to 65535" % (self.names.of("args", "port"), self.port))
        except (TypeError, ValueError):
            self.blockers.append("%s must be an integer from 1 to 65535, got %r" % (self.names.of("args", "port"), args.get("port")))
        self.host = str(args.get("host") or DEFAULT_HOST)
        self.url = base_url(self.host, self.port, tls=bool(args.get("ssl_certfile")))
        self.args = args

    def _render(self, args):
        """The server's flags; the secrets through the 0600 --config file where the release has one."""
        p = self.p
        try:
            self.flags = list(render.to_argv(args, self.version, secrets="omit"))
        except ValueError as exc:
            self.blockers.append("args: %s" % exc)
        if self.secret_args:
            if compare.supports_config(self.version):
                try:
                    self.config_text = render.to_config_yaml(self.secret_args, self.version)
                    self.flags = list(render.server_argv(dict(args, **self.secret_args), self.version, self.config_path))
                except ValueError as exc:
                    self.blockers.append("args: %s" % exc)
            elif p["allow_api_key_in_argv"]:
                try:
                    self.flags += list(render.to_argv(self.secret_args, self.version, secrets="include"))
                except ValueError as exc:
                    self.blockers.append("args: %s" % exc)
                self.ctx.warn("SGLang %s has no --config (added in 0.5.10): the API key is on the server's command line, "
                              "readable by every local user through ps and /proc/<pid>/cmdline" % self.version)
            else:
                self.blockers.append(
                    "SGLang %s has no --config option (added in 0.5.10), so %s would have to go on the command line where "
                    "ps shows it; upgrade SGLang, or set allow_api_key_in_argv=true to accept that"
                    % (self.version, ", ".join(sorted(self.secret_args))))

    def _find_python(self):
        """The interpreter (a path, or a name found on the server's PATH) and the argv it runs."""
        p = self.p
        python = self.python
        if self.manager == "process" or "/" not in python:
            if "/" in python:
                if not (os.path.isfile(python) and os.access(python, os.X_OK)):
                    self.blockers.append("python: %s is not an executable file" % python)
            else:
                path = self.env.get("PATH")
                found = self.ctx.get_bin_path(python, required=False, opt_dirs=path.split(os.pathsep) if path else [])
                if not found:
                    self.blockers.append("python: %s not found in PATH" % python)
                else:
                    python = found
            if p["chdir"] and not os.path.isdir(p["chdir"]):
                self.blockers.append("chdir: %s is not a directory" % p["chdir"])
        self.python_path = python
        self.argv = [python, "-m", "sglang.launch_server"] + self.flags

    def _identify(self):
        """The launch's identity and fingerprint, and the unit text that carries the fingerprint."""
        p = self.p
        salt = identity.read_salt(self.state_dir, create=False)
        all_args = dict(self.args)
        all_args.update(self.secret_args)
        all_env = dict(self.env)
        all_env.update(self.secret_env)
        self.identity = identity.identity(self.version, self.manager, self.python, all_args, all_env, p["chdir"], salt,
                                          secret_args=tuple(self.secret_args))
        self.fp = identity.fingerprint(self.identity)
        if self.unit_path:
            env_files = [p["environment_file"]] if p["environment_file"] else []
            if self.secret_env:
                env_files.append(self.env_file)
            try:
                self.unit_text = unit_mod.render_unit(self.name, self.version, self.python_path, self.flags, self.env, self.fp,
                                                      p["user"], p["group"], env_files, p["stop_timeout"], p["chdir"])
            except ValueError as exc:
                self.blockers.append("unit: %s" % exc)

    def refingerprint(self, salt):
        """Recompute the identity with the node's salt (made at the first real launch)."""
        all_args = dict(self.args)
        all_args.update(self.secret_args)
        all_env = dict(self.env)
        all_env.update(self.secret_env)
        self.identity = identity.identity(self.version, self.manager, self.python, all_args, all_env, self.p["chdir"], salt,
                                          secret_args=tuple(self.secret_args))
        self.fp = identity.fingerprint(self.identity)
        if self.unit_text is not None:
            env_files = [self.p["environment_file"]] if self.p["environment_file"] else []
            if self.secret_env:
                env_files.append(self.env_file)
            self.unit_text = unit_mod.render_unit(self.name, self.version, self.python_path, self.flags, self.env, self.fp,
                                                  self.p["user"], self.p["group"], env_files, self.p["stop_timeout"], self.p["chdir"])

    def diff_source(self, label):
        """This launch (after :meth:`plan`) as redeploy/diff.py shows it; secret values included (the diff masks them)."""
        return {"label": label, "name": self.name, "fingerprint": self.fp, "argv": list(self.argv), "env": dict(self.env),
                "secret_env": dict(self.secret_env), "secret_args": dict(self.secret_args), "version": self.version,
                "config_path": self.config_path if self.config_text is not None else None,
                "unit_path": self.unit_path if self.unit_text is not None else None, "unit_text": self.unit_text,
                "secrets": list(self.secrets)}

    # ---------------- current state ----------------

    def unit_props(self):
        try:
            return systemd.show(self.run, self.systemctl(), self.unit)
        except systemd.SystemdError as exc:
            raise LaunchError(str(exc))

    def current(self):
        """What runs now: ``{pid, start, record, fingerprint, source, argv}`` (pid None: nothing)."""
        record = sp.read_state(self.state_file)
        cur = {"pid": None, "start": None, "record": record, "fingerprint": None, "source": None, "argv": None}
        if self.manager == "process":
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

    # ---------------- record and files ----------------

    def launch_record(self):
        record = secret_rules.redact(dict(self.p["record_extra"] or {}), self.secrets)
        record.update(
            name=self.name, version=self.version, manager=self.manager, python=self.python,
            args=secret_rules.redact(dict(self.args), self.secrets), env=secret_rules.redact(dict(self.env), self.secrets),
            cuda_visible_devices=self.env.get("CUDA_VISIBLE_DEVICES", ""), chdir=self.p["chdir"], fingerprint=self.fp,
            unit=self.unit if self.manager == "systemd" else None,
        )
        # The names of the secrets (their values live in the 0600 secrets.json only); added after the masking,
        # which would mask the lists themselves (their keys are secret-named).
        record["secret_args"] = sorted(self.secret_args)
        record["env_secrets"] = sorted(self.secret_env)
        return record

    def write_files(self):
        """Write the candidate's files (record, secrets, config.yaml, env file, unit); True when the unit changed."""
        files = (self.pid_file, self.log_file, self.config_path, self.record_file, self.secrets_file)
        for directory in set(os.path.dirname(x) for x in files if x):
            sp.ensure_dir(directory)
        salt = identity.read_salt(self.state_dir, create=True)
        self.refingerprint(salt)
        if self.record_file:
            sp.write_private(self.record_file, json.dumps(self.launch_record(), indent=2, sort_keys=True) + "\n", mode=0o640)
            self.result["record_file"] = self.record_file
            sp.write_private(self.secrets_file, json.dumps({"args": self.secret_args, "env": self.secret_env}, sort_keys=True) + "\n",
                             mode=0o600)
        if self.config_text is not None:
            sp.write_private(self.config_path, self.config_text, mode=0o600)
            if self.manager == "systemd" and (self.p["user"] or self.p["group"]):
                # The server reads its --config file as the service user.
                os.chown(self.config_path, uid_of(self.p["user"]) if self.p["user"] else -1,
                         gid_of(self.p["group"]) if self.p["group"] else -1)
        if self.secret_env and self.manager == "systemd":
            sp.write_private(self.env_file, unit_mod.env_file_text(self.secret_env), mode=0o600)
        changed = False
        if self.unit_path and self.unit_text is not None:
            try:
                with open(self.unit_path, encoding="utf-8") as fh:
                    changed = fh.read() != self.unit_text
            except OSError:
                changed = True
            if changed:
                sp.write_private(self.unit_path, self.unit_text, mode=0o644)
        return changed

    # ---------------- stop ----------------

    def stop(self, cur):
        """Stop the server ``cur`` (:meth:`current`; ``is_child`` True when this process started it, so that the report
        has its exit status: a death by SIGTERM or exit status 143 is a normal stop, ``normal_stop``)."""
        timeout = self.p["stop_timeout"]
        pid, start = cur["pid"], cur["start"]
        if self.manager == "process":
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
        if self.manager == "process":
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
        sp.write_state(self.state_file, state)
        return pid, start, log_offset, is_child

    def _log_header(self):
        line = "=== gpufleet.sglang: starting %s at %s: %s ===\n" % (
            self.name, time.strftime("%Y-%m-%dT%H:%M:%S%z"), " ".join(self.masked(self.argv)))
        fd = os.open(self.log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, line.encode("utf-8"))
            return os.lseek(fd, 0, os.SEEK_END)
        finally:
            os.close(fd)

    # ---------------- logs ----------------

    def log_text(self, offset, since_wall=None):
        if self.log_file and (self.manager == "process" or os.path.exists(self.log_file) and sp.log_size(self.log_file) > (offset or 0)):
            return sp.read_log(self.log_file, offset)
        if self.manager == "systemd":
            journalctl = self.ctx.get_bin_path("journalctl", required=False)
            if not journalctl:
                return ""
            cmd = [journalctl, "-u", self.unit, "-n", str(JOURNAL_LINES), "--no-pager", "-o", "cat"]
            if since_wall:
                cmd += ["--since", "@%d" % int(since_wall)]
            rc, out, _err = self.run(cmd)
            return out if rc == 0 else ""
        return ""

    def log_tail(self, offset, since_wall=None):
        text = self.log_text(offset, since_wall)
        return [self.mask(line) for line in sp.tail(text, LOG_TAIL_LINES)]

    # ---------------- health ----------------

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

        wait.wait_for(probe, deadline=deadline, interval=HEALTH_POLL_S)
        if state["crash"] and state["exit"] is None:
            # A server that ends by itself also loses its children first (0.5.23 kills its own tree, then exits: the
            # loser of a port conflict exits 3 that way): give its main process a moment to exit with its status.
            def exited():
                state["exit"] = self._exit_of(pid, start, is_child)
                if state["exit"] is None:
                    watch.check(pid, [])
                return state["exit"] is not None or watch.in_diagnostics

            wait.wait_for(exited, timeout=CRASH_EXIT_WAIT_S, interval=0.1)
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

    # ---------------- effective config ----------------

    def server_info(self):
        order = ["/server_info", "/get_server_info"]
        if not compare.supports_config(self.version):
            order.reverse()
        last = None
        for path in order:
            try:
                status, _h, body = http.request("GET", self.url + path, api_key=self.api_key, timeout=PROBE_TIMEOUT)
            except http.HTTPConnectionError as exc:
                raise LaunchError("the server is healthy but %s%s could not be read: %s" % (self.url, path, exc))
            if status == 404:
                last = "%s: HTTP 404" % path
                continue
            if status in (401, 403):
                raise LaunchError("%s%s answered HTTP %d: the server wants an API key%s" % (
                    self.url, path, status, " other than the one given" if self.api_key else "; set api_key"))
            if status != 200 or not isinstance(body, dict):
                raise LaunchError("%s%s answered HTTP %d with %s" % (self.url, path, status, type(body).__name__))
            return path, body
        raise LaunchError("the server answers neither /server_info nor /get_server_info (%s)" % last)

    def verify(self, log_offset, since_wall):
        res = self.result
        endpoint, info = self.server_info()
        res["server_info_endpoint"] = endpoint
        res["version"] = info.get("version")
        res["effective"] = secret_rules.redact(info, self.secrets)
        expect = self.p["expect"]
        if expect is None:
            expect = self.args
        # What the server runs, for every field that was predicted (the report's effective_args).
        res["effective_args"] = secret_rules.redact(dict(
            (k, compare.lookup_effective(info, k)[1]) for k in sorted(expect or {}) if compare.lookup_effective(info, k)[0]),
            self.secrets)
        overrides, unverified = compare.compare(expect, info, self.version, args=self.args,
                                                adjustments=self.p["adjustments"] or [])
        for item in overrides:
            item["intended"] = secret_rules.redact(item["intended"], self.secrets)
            item["running"] = secret_rules.redact(item["running"], self.secrets)
        res["overrides"] = overrides
        res["unverified"] = unverified
        res["log_warnings"] = compare.scan_log(self.log_text(log_offset, since_wall), self.version, self.secrets)
        if not overrides:
            return
        lines = [compare.format_override(item) for item in overrides]
        policy = self.p["on_override"]
        if policy == "warn":
            for line in lines:
                self.ctx.warn("SGLang server %s: %s" % (self.name, line))
        elif policy == "fail":
            warn_lines = ["  log: %s" % w["line"] for w in res["log_warnings"]]
            raise LaunchError(
                "SGLang server %s is healthy but does not run the intended configuration (%d difference%s). The server was left "
                "running (pid %s) so the playbook can roll back; set on_override=warn to accept it.\n- %s%s"
                % (self.name, len(lines), "" if len(lines) == 1 else "s", res.get("pid"), "\n- ".join(lines),
                   ("\nSGLang logged:\n" + "\n".join(warn_lines)) if warn_lines else ""), config_mismatch=True)
