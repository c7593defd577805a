# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The one place that talks to systemctl: properties of a unit, start/stop/enable, daemon-reload.

Every function takes ``run``: a callable ``run(argv) -> (rc, stdout, stderr)`` (an AnsibleModule's
``run_command`` wrapped by the caller, or a fake in tests), so that no module builds a ``systemctl``
command line of its own. argv lists only, never a shell.
"""

from __future__ import annotations

import os

# What the launcher and the preflight need to judge a unit.
UNIT_PROPERTIES = ("LoadState", "ActiveState", "SubState", "Result", "MainPID", "ExecMainStatus", "NeedDaemonReload",
                   "ControlGroup", "UnitFileState", "FragmentPath")
C_ENV = {"LC_ALL": "C", "LANG": "C"}


class SystemdError(Exception):
    pass


def running(root="/run/systemd/system"):
    """True when systemd is the init system here (sd_booted: the directory exists)."""
    return os.path.isdir(root)


def parse_properties(text):
    """``systemctl show`` ``Key=Value`` lines -> dict."""
    props = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            props[key.strip()] = value.strip()
    return props


def show(run, systemctl, unit, properties=UNIT_PROPERTIES):
    rc, out, err = run([systemctl, "show", "--property=" + ",".join(properties), "--", unit])
    if rc != 0:
        raise SystemdError("systemctl show %s failed (rc=%d): %s" % (unit, rc, (err or out).strip()))
    return parse_properties(out)


def main_pid(props):
    try:
        return int(props.get("MainPID") or 0) or None
    except ValueError:
        return None


def is_active(props):
    return props.get("ActiveState") in ("active", "activating", "reloading", "deactivating")


def loaded(props):
    return props.get("LoadState") == "loaded"


def _act(run, systemctl, verb, unit=None):
    argv = [systemctl, verb] + (["--", unit] if unit else [])
    rc, out, err = run(argv)
    if rc != 0:
        raise SystemdError("systemctl %s%s failed (rc=%d): %s" % (verb, (" " + unit) if unit else "", rc, (err or out).strip()))
    return out


def start(run, systemctl, unit):
    return _act(run, systemctl, "start", unit)


def stop(run, systemctl, unit):
    return _act(run, systemctl, "stop", unit)


def enable(run, systemctl, unit):
    return _act(run, systemctl, "enable", unit)


def daemon_reload(run, systemctl):
    return _act(run, systemctl, "daemon-reload")


def describe(props, unit):
    return "unit %s: LoadState=%s ActiveState=%s SubState=%s Result=%s ExecMainStatus=%s" % (
        unit, props.get("LoadState"), props.get("ActiveState"), props.get("SubState"), props.get("Result"),
        props.get("ExecMainStatus"))
