# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A launch's parameters: the defaults, their typing, and the error the launch engine raises."""

from __future__ import annotations

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 30000

DEFAULTS = {
    "name": "main", "version": "0.5.23", "manager": "process", "unit": None, "unit_dir": None, "python": "python3",
    "args": {}, "api_key": None, "env": {}, "chdir": None, "user": "", "group": "", "environment_file": "",
    "host": None, "port": None, "config_dir": None, "state_dir": None, "pid_file": None, "log_file": None,
    "config_file": None, "health_path": "/health_generate", "health_timeout": 1800.0, "stop_timeout": 60.0,
    "keep_on_failure": False, "expect": None, "adjustments": [], "on_override": "fail", "allow_api_key_in_argv": False,
    "record_file": None, "record_extra": {}, "check_config": True, "secret_env": None, "secret_args": None,
    "image": None, "image_ref": None, "image_digest": None, "container": None,
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
