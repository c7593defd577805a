"""Run a collection module through ``ansible`` ad hoc against localhost.

Equivalent of::

    ANSIBLE_COLLECTIONS_PATH=$REPO/.collections ANSIBLE_CALLBACK_RESULT_FORMAT=json \\
      ansible localhost -i localhost, -c local -m gpufleet.sglang.gpu_drain \\
        -a '{"gpus": [0], ...}' -e ansible_python_interpreter=$PYTHON

The module's result dict is read from the default callback's ad-hoc line
``localhost | SUCCESS => {...}``. That callback is in ansible-core itself;
the ``json`` stdout callback lives in ansible.posix, and ``-o`` / ``-t`` are
deprecated, so none of them is relied on.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

from . import REPO, ensure_collection_link


def find_ansible(python=None):
    """``ansible`` next to the interpreter (a venv's bin), else on PATH."""
    python = python or sys.executable
    cand = os.path.join(os.path.dirname(python), "ansible")
    if os.access(cand, os.X_OK):
        return cand
    return shutil.which("ansible")


def ansible_env(base_env=None):
    env = dict(os.environ if base_env is None else base_env)
    env.update({
        "ANSIBLE_COLLECTIONS_PATH": ensure_collection_link(),
        "ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg"),
        "ANSIBLE_STDOUT_CALLBACK": "default",
        "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",
        "ANSIBLE_CALLBACK_FORMAT_PRETTY": "1",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_RETRY_FILES_ENABLED": "0",
        "ANSIBLE_LOCALHOST_WARNING": "0",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "0",
        "ANSIBLE_DEPRECATION_WARNINGS": "0",
    })
    return env


class ModuleRun(object):
    def __init__(self, argv, rc, result, seconds, stdout, stderr):
        self.argv = argv
        self.rc = rc
        self.result = result or {}
        self.seconds = seconds
        self.stdout = stdout
        self.stderr = stderr

    @property
    def failed(self):
        return bool(self.result.get("failed")) or self.rc != 0

    def summary(self):
        msg = self.result.get("msg") or ""
        return "rc %d, %.1f s%s" % (self.rc, self.seconds, (": " + msg) if msg else "")


_ADHOC_RE = None


def parse_adhoc_output(stdout, host="localhost"):
    """The result dict from ``<host> | SUCCESS => {...}`` (default callback), or None."""
    import re
    global _ADHOC_RE
    if _ADHOC_RE is None:
        _ADHOC_RE = re.compile(r"^%s \| (?:SUCCESS|CHANGED|FAILED!|UNREACHABLE!|SKIPPED)(?: \| rc=-?\d+)? => "
                               % re.escape(host), re.MULTILINE)
    text = stdout or ""
    match = _ADHOC_RE.search(text)
    if match is None:
        return parse_json_callback(text, host)
    try:
        result, _end = json.JSONDecoder().raw_decode(text[match.end():])
    except ValueError:
        return None
    return result if isinstance(result, dict) else None


def parse_json_callback(stdout, host="localhost"):
    """The host's result from the ``json`` stdout callback (None when absent)."""
    text = stdout or ""
    start = text.find("{")
    if start < 0:
        return None
    try:
        data = json.loads(text[start:])
    except ValueError:
        return None
    for play in data.get("plays", []):
        for task in play.get("tasks", []):
            hosts = task.get("hosts", {})
            if host in hosts:
                return hosts[host]
    return None


def run_module(module, args, env=None, python=None, timeout=300, check=False):
    """Run ``gpufleet.sglang.<module>`` with ``args`` (a dict); returns :class:`ModuleRun`."""
    python = python or sys.executable
    ansible = find_ansible(python)
    if not ansible:
        raise RuntimeError("ansible is not installed next to %s nor on PATH" % python)
    fq = module if "." in module else "gpufleet.sglang." + module
    argv = [ansible, "localhost", "-i", "localhost,", "-c", "local", "-m", fq, "-a", json.dumps(args),
            "-e", "ansible_python_interpreter=%s" % python]
    if check:
        argv.append("--check")
    start = time.monotonic()
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ansible_env(env),
                          timeout=timeout, check=False, cwd=REPO)
    seconds = time.monotonic() - start
    stdout = proc.stdout.decode("utf-8", "replace")
    stderr = proc.stderr.decode("utf-8", "replace")
    result = parse_adhoc_output(stdout)
    if result is None:
        result = {"failed": True, "msg": "no JSON result from ansible (rc %d): %s" % (
            proc.returncode, (stderr or stdout).strip()[-2000:])}
    return ModuleRun(argv, proc.returncode, result, seconds, stdout, stderr)
