# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""SGLang versions: parsing, and which documented rule set applies.

Rules are modelled for the releases 0.4.6 (read as 0.4.6.post5), 0.4.10
(0.4.10.post2), 0.5.1, 0.5.10 and 0.5.23 (docs/reference/sglang-rules.md,
"Versions"). Any other version gets the rules of the nearest documented
release at or below it; a pre-release or dev build counts as older than its
final release. Newer than 0.5.23: the 0.5.23 rules plus a note. Older than
0.4.6: refused. A version is a string with three release numbers, so that a
YAML float such as ``0.5`` is never taken for a release.
"""
from __future__ import annotations

import re

DEFAULT_VERSION = "0.5.23"
DOCUMENTED_VERSIONS = ("0.4.6", "0.4.10", "0.5.1", "0.5.10", "0.5.23")

V046, V0410, V051, V0510, V0523 = range(5)

_VERSION_RE = re.compile(
    r"^v?(\d+)\.(\d+)\.(\d+)"
    r"(?:[-_.]?(a|b|c|rc|alpha|beta|pre|preview)[-_.]?(\d*))?"
    r"(?:[-_.]?(post|rev|r)[-_.]?(\d*))?"
    r"(?:[-_.]?(dev)[-_.]?(\d*))?"
    r"(?:\+[0-9A-Za-z.]+)?$"
)


def parse_version(version):
    """Parse an SGLang version string into ``(release_tuple, is_final)``.

    ``is_final`` is False for pre-releases and dev builds; post-releases
    (``0.4.6.post5``) are final. Raises ValueError naming the value and its type.
    """
    if not isinstance(version, str) or isinstance(version, bool):
        raise ValueError(
            "SGLang version must be a string such as '0.5.10', got %s %r; quote it in YAML "
            "(an unquoted 0.5.10 is read as a string, but 0.5 or 1.0 become floats)" % (type(version).__name__, version)
        )
    match = _VERSION_RE.match(version.strip())
    if not match:
        raise ValueError(
            "cannot parse SGLang version %r (str): expected MAJOR.MINOR.PATCH with an optional "
            "pre-release, .postN or .devN suffix, for example '0.5.10' or '0.4.6.post5'" % (version,)
        )
    release = (int(match.group(1)), int(match.group(2)), int(match.group(3)))
    is_final = match.group(4) is None and match.group(8) is None
    return release, is_final


def release_tuple(version, default="0.0.0"):
    """``(major, minor, patch)`` of a version string, leniently: the leading digits of its first three parts.

    For comparisons with a threshold where a bad string must not raise (``0.5.23rc1`` -> (0, 5, 23), ``""``
    -> ``default``); use parse_version to validate.
    """
    parts = []
    for piece in str(version or default).split(".")[:3]:
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        parts.append(int(digits) if digits else 0)
    while len(parts) < 3:
        parts.append(0)
    return tuple(parts)


def version_key(version):
    """A sort key: the release tuple, then 1 for a final release, 0 before it."""
    release, is_final = parse_version(version)
    return release + (1 if is_final else 0,)


def rule_version(version):
    """The documented release whose rules apply to ``version``.

    Raises ValueError for unparseable versions and versions older than 0.4.6.
    """
    key = version_key(version)
    chosen = None
    for documented in DOCUMENTED_VERSIONS:
        if key >= version_key(documented):
            chosen = documented
    if chosen is None:
        raise ValueError(
            "SGLang %s is older than 0.4.6, the oldest release whose argument rules are modelled "
            "(docs/reference/sglang-rules.md, Versions); upgrade SGLang to 0.4.6 or newer" % (version,)
        )
    return chosen


def version_notes(version, documented=None):
    """Notes on how ``version`` is modelled (nearest documented release, newer than known)."""
    documented = documented or rule_version(version)
    release, is_final = parse_version(version)
    documented_release = version_key(documented)[:3]
    if documented == DOCUMENTED_VERSIONS[-1] and release > documented_release:
        return [
            "SGLang %s is newer than %s, the newest release whose rules were read; the %s rules are applied, "
            "check that release's notes for changes (docs/reference/sglang-rules.md, Versions)"
            % (version, documented, documented)
        ]
    if release != documented_release or not is_final:
        return [
            "SGLang %s is not one of the documented releases %s; the rules of %s, the nearest documented "
            "release at or below it, are applied (docs/reference/sglang-rules.md, Versions)"
            % (version, ", ".join(DOCUMENTED_VERSIONS), documented)
        ]
    return []
