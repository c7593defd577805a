# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The systemd unit of one SGLang server, rendered in Python (the launcher writes it).

The ExecStart value comes from ``render.systemd_exec_start`` (the only renderer of the server's
argv); this module only lays out the unit around it. The unit carries the launch's identity
(``redeploy.fingerprint``) in a comment, so that a server systemd started at boot from this file is
recognised as the config the file names (docs/design.md, "Node state").
"""

from __future__ import annotations

import re

from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import records as _records
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import render

# The identity comment is read back by modules that must not carry the renderer (records.py).
IDENTITY_PREFIX = _records.IDENTITY_PREFIX
identity_of = _records.identity_of


def _path(path):
    return str(path).replace("%", "%%")


def render_unit(name, version, python, flags, env, fingerprint, user="", group="", environment_files=(),
                stop_timeout=120, chdir=None):
    """The unit file text. ``env`` holds no secret values (those go through an EnvironmentFile)."""
    fields = [("name", name), ("version", version), ("python", python), ("user", user), ("group", group),
              ("chdir", chdir or ""), ("fingerprint", fingerprint)]
    fields += [("environment_files (EnvironmentFile)", path) for path in environment_files]
    for field, value in fields:
        if any(ch in str(value) for ch in "\n\r\0"):
            raise ValueError("%s: %r holds a newline, carriage return or NUL, which a systemd unit line cannot carry; "
                             "remove it" % (field, value))
    lines = [
        "# Managed by gpufleet.sglang: rendered by the sglang_replace/sglang_launch module; do not edit.",
        "# Instance: %s; SGLang %s" % (name, version),
        IDENTITY_PREFIX + fingerprint,
        "[Unit]",
        "Description=SGLang server %s (gpufleet.sglang)" % name,
        "After=network-online.target",
        "Wants=network-online.target",
        "",
        "[Service]",
        "Type=simple",
    ]
    if user:
        lines.append("User=%s" % user)
    if group:
        lines.append("Group=%s" % group)
    # systemd takes these two paths as written (no unquoting); only its % specifiers need escaping.
    if chdir:
        lines.append("WorkingDirectory=%s" % _path(chdir))
    for path in environment_files:
        if path:
            lines.append("EnvironmentFile=%s" % _path(path))
    for key in sorted(env):
        value = "" if env[key] is None else str(env[key])
        if "\n" in value or "\r" in value:
            raise ValueError("the environment variable %s holds a newline, which a systemd unit cannot carry" % key)
        lines.append("Environment=%s" % render.systemd_quote("%s=%s" % (key, value), exec_word=False))
    lines += [
        "ExecStart=%s" % render.systemd_exec_start(python, flags),
        "# SGLang drains on SIGTERM and stops its own schedulers (docs/reference/sglang-processes.md):",
        "# signal the main process only, and SIGKILL what is left after the timeout.",
        "KillMode=mixed",
        "KillSignal=SIGTERM",
        "# Killed by SIGTERM before SGLang installs its handler (0.5.23), or 143 from a wrapper: a normal stop, not a failure.",
        "SuccessExitStatus=143",
        "TimeoutStopSec=%d" % int(stop_timeout),
        "Restart=no",
        "StandardOutput=journal",
        "StandardError=journal",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ]
    return "\n".join(lines)


def env_file_text(values):
    """An EnvironmentFile for systemd: one ``KEY="value"`` line each, quoted for systemd's parser."""
    lines = []
    for key in sorted(values):
        value = "" if values[key] is None else str(values[key])
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            raise ValueError("environment variable name %r is not valid" % key)
        if "\n" in value or "\r" in value:
            raise ValueError("the environment variable %s holds a newline, which an EnvironmentFile cannot carry" % key)
        lines.append('%s="%s"' % (key, value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")))
    return "\n".join(lines) + ("\n" if lines else "")
