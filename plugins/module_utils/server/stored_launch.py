# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A stored launch (``candidate/`` or ``known-good/server.json`` with its ``secrets.json``), read back to start it again."""

from __future__ import annotations

import os

from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import records
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import compare
from ansible_collections.gpufleet.sglang.plugins.module_utils.server.launch_params import LaunchError, norm_key

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
    if record.get("image"):
        # A container's record: the image ID starts exactly the image that ran, even after its tag moved (issue 24).
        image = record["image"]
        params.update(image=image.get("id") or image.get("ref"), image_ref=image.get("ref"), image_digest=image.get("digest"),
                      container=dict(record.get("container") or {}))
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
