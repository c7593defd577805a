# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Where a server's config records live on the node, and how to read one (standard library only).

The launcher writes ``<config_dir>/candidate/`` and the promote step copies it to
``<config_dir>/known-good/`` (docs/design.md, "Node state"). Kept apart from the launcher so that a
module that only reads or copies records (``sglang_promote``) does not carry the launcher, the
renderer and the resolution mirror to the node: a smaller AnsiballZ payload to build on the
controller and less source to compile on the node, on every module run (bench/README.md).
"""

from __future__ import annotations

import json
import os
import re

# The comment line a rendered systemd unit carries (sglang/unit.py writes it): the identity
# (redeploy.fingerprint) of the config the unit file names.
IDENTITY_PREFIX = "# gpufleet-identity: "
_IDENTITY_RE = re.compile(r"^# gpufleet-identity: (\S+)\s*$", re.MULTILINE)


class RecordError(Exception):
    """A record exists but cannot be read as a JSON object."""


def candidate_dir(config_dir):
    return os.path.join(config_dir, "candidate")


def known_good_dir(config_dir):
    return os.path.join(config_dir, "known-good")


def read_json(path):
    """The JSON object in ``path``, None when the file does not exist; RecordError when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise RecordError("%s cannot be read: %s" % (path, exc))
    if not isinstance(data, dict):
        raise RecordError("%s does not hold a JSON object" % path)
    return data


def identity_of(text):
    """The identity a unit file names, or None."""
    match = _IDENTITY_RE.search(text or "")
    return match.group(1) if match else None
