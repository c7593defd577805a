# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What a launch runs, rendered: its secrets apart, its port and URL, argv, ``--config`` file, env, unit and identity;
and the candidate's files written from them."""

from __future__ import annotations

import json
import os

from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import identity
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import secrets as secret_rules
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import supervise as sp
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import compare
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import flags as flag_table
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import render
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import versions
from ansible_collections.gpufleet.sglang.plugins.module_utils.server import unit as unit_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.server.address import base_url
from ansible_collections.gpufleet.sglang.plugins.module_utils.server.launch_params import DEFAULT_HOST, DEFAULT_PORT, gid_of, norm_key, uid_of


class LaunchPlan(object):
    """The planning and file methods of :class:`launcher.Launcher`."""

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
        if self.box is not None:
            # Inside the image: its own interpreter (no host path to check); the runtime's CLI is checked instead.
            self.python_path = python or "python3"
            self.argv = self.container_inner_argv()
            if not self.ctx.get_bin_path(self.manager, required=False):
                self.blockers.append("%s: %s is not installed on this node (or not in PATH); install it or choose another manager"
                                     % (self.names.of("manager"), self.manager))
            return
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
                                          secret_args=tuple(self.secret_args), container=self.container_identity())
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
                                          secret_args=tuple(self.secret_args), container=self.container_identity())
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
                "secrets": list(self.secrets), "image": self.image_words(),
                "container": dict(self.box, name=self.container_name) if self.box is not None else None}

    # ---------------- record and files ----------------

    def launch_record(self):
        record = secret_rules.redact(dict(self.p["record_extra"] or {}), self.secrets)
        record.update(
            name=self.name, version=self.version, manager=self.manager, python=self.python,
            args=secret_rules.redact(dict(self.args), self.secrets), env=secret_rules.redact(dict(self.env), self.secrets),
            cuda_visible_devices=self.env.get("CUDA_VISIBLE_DEVICES", ""), chdir=self.p["chdir"], fingerprint=self.fp,
            unit=self.unit if self.manager == "systemd" else None,
        )
        if self.box is not None:
            record.update(image=self.image_record(), container=dict(self.box, name=self.container_name))
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
