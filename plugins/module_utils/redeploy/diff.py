# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The ``--diff`` of a redeploy: the running server's recorded launch against the planned one (pure functions).

A launch is shown as four texts, the way ``ansible.builtin.template`` shows a file: the server's command line
(one argument per line: the interpreter first, then each flag with its values), its ``--config`` file (the
secret args), its environment (``NAME=value`` lines) and, for ``manager: systemd``, its unit file.
:func:`launch_diff` returns Ansible's standard ``diff`` value (a list of ``{before, after, before_header,
after_header}``), one entry per text that differs, which the default and yaml callbacks render as a unified
diff when the play runs with ``--diff``.

Secret values never leave this module: the API key, every secret field of the args and every secret-named
environment variable show as ``********``; a secret whose value differs between the two launches is marked
`` (changed)`` after the mask on the planned side, so that a rotated key is visible without being shown. Every
text also goes through the collection's masking rules with the launch's secret values (a secret inside
another value, a URL with credentials).

A launch is given as a dict, as ``Launcher.diff_source`` (server/launcher.py) builds it:
``label`` (``running PID 4218``, ``planned``, ``nothing runs``), ``name``, ``fingerprint``, ``argv`` (list),
``env`` (the non-secret variables), ``secret_env`` and ``secret_args`` (name -> value), ``config_path`` (None
when the launch has no ``--config`` file), ``version``, ``unit_path`` and ``unit_text`` (None without a unit)
and ``secrets`` (more literal values to mask). Every key is optional: ``{"label": "nothing runs"}`` is a first
deploy's empty "before".
"""

from __future__ import annotations

import shlex

from ansible_collections.gpufleet.sglang.plugins.module_utils.common import secrets as secret_rules
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import flags as flag_table
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import render

MASK = secret_rules.MASK
CHANGED = MASK + " (changed)"
SECTIONS = ("argv", "config", "env", "unit", "image")
NOTHING = "nothing runs"


def _quote(word):
    if word.startswith(MASK) or word == "":
        return word or "''"
    return shlex.quote(word)


def argv_text(argv, secrets=()):
    """The command line, one argument per line: the interpreter and ``-m sglang.launch_server`` on the first
    line, then every flag with its values on its own line (indented), secrets masked."""
    lines = []
    for word in secret_rules.mask_argv([str(w) for w in argv or []], secrets):
        if not lines or word.startswith("--"):
            lines.append([])
        lines[-1].append(_quote(word))
    out = [" ".join(lines[0])] + ["    " + " ".join(line) for line in lines[1:]] if lines else []
    return "".join(line + "\n" for line in out)


def env_text(env, secret_env=None, changed=(), secrets=()):
    """``NAME=value`` lines, sorted; a secret-named variable shows ``********``, ``******** (changed)`` when its name
    is in ``changed``."""
    values = {}
    for key, value in (env or {}).items():
        key = str(key)
        value = "" if value is None else str(value)
        values[key] = (CHANGED if key in changed else MASK) if secret_rules.is_secret_name(key) \
            else secret_rules.mask_text(value, secrets)
    for key in (secret_env or {}):
        values[str(key)] = CHANGED if str(key) in changed else MASK
    return "".join("%s=%s\n" % (key, values[key]) for key in sorted(values))


def _secret_flag_name(key):
    spec = flag_table.FLAGS.get(key)
    return spec["flag"][2:] if spec else str(key).replace("_", "-")


def config_text(secret_args, changed=(), version=None):
    """The ``--config`` file as the launcher writes it, every value ``"********"``; the line of a field in ``changed``
    ends with `` (changed)``."""
    shown = dict((key, MASK) for key in secret_args or {})
    if not shown:
        return ""
    try:
        lines = render.to_config_yaml(shown, version).splitlines()
    except (ValueError, TypeError, KeyError):
        # A field the renderer does not type as text: its name and the mask, one line each.
        lines = ['%s: "%s"' % (_secret_flag_name(key), MASK) for key in sorted(shown)]
    marked = set("%s:" % _secret_flag_name(key) for key in changed or ())
    return "".join(line + (" (changed)" if line.split(" ", 1)[0] in marked else "") + "\n" for line in lines)


def changed_secrets(before, after):
    """``{"args": names, "env": names}``: the secret args and env variables whose value differs between the launches
    (both sides have it; one that is only on one side shows as an added or removed line)."""
    marks = {"args": set(), "env": set()}
    for part, field in (("args", "secret_args"), ("env", "secret_env")):
        left = (before or {}).get(field) or {}
        right = (after or {}).get(field) or {}
        for key in right:
            if key in left and str(left[key]) != str(right[key]):
                marks[part].add(key)
    return marks


def _secret_values(*launches):
    out = []
    for launch in launches:
        launch = launch or {}
        out.extend(str(v) for v in launch.get("secrets") or [] if v not in (None, ""))
        for field in ("secret_args", "secret_env"):
            for value in (launch.get(field) or {}).values():
                for item in (value if isinstance(value, (list, tuple)) else [value]):
                    if item not in (None, ""):
                        out.append(str(item))
    return sorted(set(out), key=len, reverse=True)


def texts(launch, changed=None, secrets=()):
    """The five texts of one launch (``""`` for a part it does not have), secrets masked; ``changed``:
    :func:`changed_secrets` (marked on this side)."""
    launch = launch or {}
    changed = changed or {"args": (), "env": ()}
    return {
        # The command line and the unit carry values: masked by the rules and the secret values once more. The config
        # file and the environment are built from the masks (their secret values are never rendered).
        "argv": secret_rules.mask_text(argv_text(launch.get("argv"), secrets), secrets),
        "config": config_text(launch.get("secret_args"), changed.get("args"), launch.get("version"))
        if launch.get("config_path") else "",
        "env": env_text(launch.get("env"), launch.get("secret_env"), changed.get("env"), secrets)
        if ("env" in launch or "secret_env" in launch) else "",
        "unit": secret_rules.mask_text(launch.get("unit_text") or "", secrets),
        # Managers docker and podman: the image (reference and digest or ID) and how its container runs.
        "image": secret_rules.mask_text(image_text(launch.get("image"), launch.get("container")), secrets),
    }


def image_text(image, container):
    """The image and the container options of a launch in a container, one per line (``""`` for a host process)."""
    if not image:
        return ""
    lines = ["image: %s" % image]
    for key, value in sorted((container or {}).items()):
        if key != "pull" and value not in (None, "", []):
            lines.append("%s: %s" % (key, ", ".join(str(v) for v in value) if isinstance(value, list) else value))
    return "\n".join(lines) + "\n"


def _short(fingerprint):
    text = str(fingerprint or "")
    return text.split(":", 1)[-1][:12] if text else ""


def _header(launch, part, other):
    launch = launch or {}
    label = launch.get("label") or NOTHING
    if launch.get("fingerprint"):
        label = "%s, identity %s" % (label, _short(launch["fingerprint"]))
    name = launch.get("name") or (other or {}).get("name") or "server"
    if part == "config":
        path = launch.get("config_path") or (other or {}).get("config_path")
        return "%s (%s)" % (path, label)
    if part == "unit":
        path = launch.get("unit_path") or (other or {}).get("unit_path")
        return "%s (%s)" % (path, label)
    if part == "image":
        return "SGLang server %s: container image (%s)" % (name, label)
    what = "command line" if part == "argv" else "environment"
    return "SGLang server %s: %s (%s)" % (name, what, label)


def launch_diff(before, after):
    """Ansible's ``diff`` between two launches: one ``{before, after, before_header, after_header}`` per part that
    differs (command line, config file, environment, unit file), in that order; ``[]`` when they are the same.
    ``before`` of a first deploy is ``{"label": "nothing runs"}``: its texts are empty."""
    secrets = _secret_values(before, after)
    marks = changed_secrets(before, after)
    left = texts(before, None, secrets)
    right = texts(after, marks, secrets)
    out = []
    for part in SECTIONS:
        if left[part] == right[part]:
            continue
        out.append({"before": left[part], "after": right[part], "before_header": _header(before, part, after),
                    "after_header": _header(after, part, before)})
    return out
