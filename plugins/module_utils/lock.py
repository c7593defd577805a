# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The node lock's on-disk state, shared by node_lock (which changes it) and sglang_preflight (which reads it).

The lock is a directory ``<path>`` made with ``mkdir``; ``<path>/holder.json`` names its holder.
``<path>.generation`` (next to it, kept across releases) counts the acquisitions: every run that
takes the lock adds one, under the lock. A run that inspected the node at generation ``g`` with the
lock free, then took the lock and got ``g + 1``, knows that no other run held the lock in between,
so its plan is still current and need not be made again.
"""

from __future__ import annotations

import json
import os

from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang_process import write_private

HOLDER = "holder.json"
GENERATION_SUFFIX = ".generation"


def read_holder(path):
    """The holder record of the lock at ``path``, or None (no lock, no holder.json yet, not a JSON object)."""
    try:
        with open(os.path.join(path, HOLDER), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def generation_path(path):
    return path.rstrip("/") + GENERATION_SUFFIX


def read_generation(path):
    """How many times the lock at ``path`` was taken; 0 when never (or when the counter is unreadable)."""
    try:
        with open(generation_path(path), encoding="utf-8") as fh:
            value = int(fh.read().strip() or 0)
    except (OSError, ValueError):
        return 0
    return max(0, value)


def bump_generation(path):
    """Add one to the counter of the lock at ``path`` and return the new value. Call it only while holding the lock."""
    value = read_generation(path) + 1
    write_private(generation_path(path), "%d\n" % value, mode=0o644)
    return value


def inspect(path):
    """``{path, held, owner, generation}`` of the lock at ``path``, read-only."""
    held = os.path.isdir(path)
    holder = read_holder(path) if held else None
    return {
        "path": path,
        "held": held,
        "owner": (holder or {}).get("owner"),
        "generation": read_generation(path),
    }
