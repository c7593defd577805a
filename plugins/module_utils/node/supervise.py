# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Process helpers for running an SGLang server as a supervised, detached
process: spawn, liveness, stop by PID with escalation, the per-server state
file, and secret masking for anything that is echoed back (argv, logs,
``/server_info``).

Why a fork here instead of ``module.run_command``: ``run_command`` waits for
the command to finish and collects its output, so it cannot start a server
that must outlive the module. ``spawn_detached`` is the one place in the
collection that starts a long-lived process; it uses ``os.fork`` +
``os.setsid`` + ``os.execvpe`` (no shell, an argv list), gives the server its
own session (so it is not killed with Ansible's process group and the server's
whole tree can be found again by session id), sends stdout+stderr to the log
file and stdin to ``/dev/null``, and closes every other descriptor, so the
Ansible connection's pipes never stay open in the daemon.

Everything that reads ``/proc`` goes through ``procfs`` (the shared helper).
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import tempfile

from ansible_collections.gpufleet.sglang.plugins.module_utils.node import procfs
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import secrets as secrets_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import stop

MASK = secrets_mod.MASK


class SpawnError(Exception):
    """The server could not be started (exec failed, log not writable, ...)."""


# --------------------------------------------------------------------------
# Secrets
# --------------------------------------------------------------------------

def is_secret_name(name):
    """True when a field or variable name denotes a secret (``module_utils.secrets``)."""
    return secrets_mod.is_secret_name(name)


def mask_text(text, secrets=()):
    """Mask secrets in free text (``module_utils.secrets.mask_text``)."""
    return secrets_mod.mask_text(text, secrets)


def mask_argv(argv, secrets=()):
    """Copy of ``argv`` with secrets masked (``module_utils.secrets.mask_argv``)."""
    return secrets_mod.mask_argv(argv, secrets)


def redact(obj, secrets=()):
    """Deep copy of ``obj`` with secrets masked (``module_utils.secrets.redact``)."""
    return secrets_mod.redact(obj, secrets)


# --------------------------------------------------------------------------
# State file
# --------------------------------------------------------------------------

def fingerprint(argv_flags, config_text=None, env=None, chdir=None):
    """Stable hash of what makes a launch different: the SGLang flags, the
    config file content, the extra environment and the working directory."""
    blob = json.dumps(
        {"argv": [str(a) for a in argv_flags], "config": config_text or "", "env": env or {}, "chdir": chdir or ""},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def state_path_for(pid_file):
    """The state JSON sits next to the pid file: ``server.pid`` -> ``server.state.json``."""
    base, ext = os.path.splitext(pid_file)
    if ext != ".pid":
        base = pid_file
    return base + ".state.json"


def write_private(path, text, mode=0o600):
    """Write ``text`` to ``path`` atomically with ``mode`` (the file never
    exists with wider permissions, not even for a moment)."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".%s." % os.path.basename(path))
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_state(path):
    """Parsed state JSON, or None when missing or unreadable."""
    try:
        with open(path, "r", encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_state(path, data):
    write_private(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def read_pid_file(path):
    try:
        with open(path, "r", encoding="utf-8") as fh:
            text = fh.read().strip()
    except OSError:
        return None
    try:
        pid = int(text.split()[0])
    except (ValueError, IndexError):
        return None
    return pid if pid > 0 else None


def remove_quietly(*paths):
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass


def ensure_dir(path, mode=0o700):
    """Create ``path`` (and parents) when missing; new directories get ``mode``."""
    if path and not os.path.isdir(path):
        os.makedirs(path, mode)


# --------------------------------------------------------------------------
# Processes (all /proc access goes through procfs)
# --------------------------------------------------------------------------

def starttime(pid):
    """Start time (``/proc/<pid>/stat`` field 22) of ``pid``, or None when gone."""
    stat = procfs.read_stat(int(pid)) if pid else None
    return None if stat is None else stat["starttime"]


def alive(pid, start=None):
    """True while ``pid`` runs (not exited) and, if given, still has ``start``."""
    if not pid:
        return False
    stat = procfs.read_stat(int(pid))
    if stat is None or procfs.is_exited(stat["state"], stat["num_threads"]):
        return False
    return start is None or stat["starttime"] == int(start)


def cmdline(pid):
    """argv list of ``pid`` (empty when gone)."""
    return procfs.read_cmdline(int(pid)) if pid else []


def spawn_detached(argv, env, log_path, chdir=None):
    """Start ``argv`` (an argv list, no shell) as a daemon in its own session.

    stdin is ``/dev/null``, stdout and stderr append to ``log_path``, every
    other descriptor is closed, signal dispositions and mask are reset. The
    child stays a direct child of the caller until the caller exits, so
    ``reap()`` can collect its exit status while we wait for health.

    Returns the PID. Raises SpawnError when the log cannot be opened or the
    exec fails (the error comes back through a close-on-exec pipe).
    """
    try:
        log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
    except OSError as exc:
        raise SpawnError("cannot open log file %s: %s" % (log_path, exc.strerror))
    null_fd = os.open(os.devnull, os.O_RDONLY)
    err_r, err_w = os.pipe()  # both close-on-exec (PEP 446)
    try:
        pid = os.fork()
    except OSError as exc:
        for fd in (log_fd, null_fd, err_r, err_w):
            os.close(fd)
        raise SpawnError("fork failed: %s" % exc.strerror)
    if pid == 0:  # pragma: no cover - runs in the child, which execs or _exits
        _exec_child(argv, env, chdir, log_fd, null_fd, err_r, err_w)
    os.close(err_w)
    os.close(log_fd)
    os.close(null_fd)
    chunks = []
    while True:
        try:
            chunk = os.read(err_r, 4096)
        except InterruptedError:
            continue
        if not chunk:
            break
        chunks.append(chunk)
    os.close(err_r)
    if chunks:
        reap(pid, block=True)
        raise SpawnError("cannot execute %s: %s" % (argv[0], b"".join(chunks).decode("utf-8", "replace")))
    return pid


def _exec_child(argv, env, chdir, log_fd, null_fd, err_r, err_w):  # pragma: no cover - child side of the fork
    try:
        os.close(err_r)
        os.setsid()
        if chdir:
            os.chdir(chdir)
        os.dup2(null_fd, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        max_fd = os.sysconf("SC_OPEN_MAX")
        if max_fd <= 0 or max_fd > 65536:
            max_fd = 65536
        os.closerange(3, err_w)
        os.closerange(err_w + 1, max_fd)
        for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        os.execvpe(argv[0], argv, env)
    except BaseException as exc:  # noqa: B036 - report anything, then _exit
        try:
            msg = "%s: %s" % (type(exc).__name__, getattr(exc, "strerror", None) or exc)
            os.write(err_w, msg.encode("utf-8", "replace")[:4000])
        except BaseException:  # noqa: B036 - nothing may escape the forked child before os._exit
            pass
    finally:
        os._exit(127)


def reap(pid, block=False):
    """Collect ``pid`` if it is our exited child.

    Returns None while it runs or when it is not our child, otherwise
    ``{"code": N}`` or ``{"code": -N, "signal": "SIGKILL"}``.
    """
    try:
        got, status = os.waitpid(int(pid), 0 if block else os.WNOHANG)
    except (ChildProcessError, InterruptedError):
        return None
    if got == 0:
        return None
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return {"signal": procfs.signal_name(sig), "code": -sig}
    return {"code": os.WEXITSTATUS(status)}


# The exit statuses of a normal stop: 0 (SGLang's SIGTERM handler drained and exited), death by SIGTERM itself
# (0.5.23 before its handler is installed, for example with --skip-server-warmup right after the port opens:
# measured on the real server, status 143 in a shell) and 143 as an exit code (128 + 15: the same death reported
# by a shell or a wrapper script that runs the server).
NORMAL_STOP_CODES = (0, -signal.SIGTERM, 128 + signal.SIGTERM)


def normal_stop(exit_info):
    """True when ``exit_info`` (:func:`reap`) is how a server ends when it is stopped with SIGTERM: 0, killed by
    SIGTERM or exit code 143; False for any other status; None when it is not known (not our child)."""
    if not exit_info or exit_info.get("code") is None:
        return None
    return exit_info["code"] in NORMAL_STOP_CODES


def describe_exit(exit_info):
    """``"was killed by SIGKILL"``, ``"exited with code 3"``, ``"was stopped by SIGTERM (exit status 143)"``."""
    if not exit_info:
        return "exited"
    if exit_info.get("signal") == "SIGTERM" or exit_info.get("code") == 128 + signal.SIGTERM:
        return "was stopped by SIGTERM (exit status 143)"
    if "signal" in exit_info:
        return "was killed by %s" % exit_info["signal"]
    if "code" in exit_info:
        return "exited with code %s" % exit_info["code"]
    return "exited"


def tree(pid):
    """``[(pid, starttime), ...]``: ``pid``, its descendants and the other
    members of its session (children reparented to PID 1 keep the session id
    of the server, which ran ``setsid``), ``pid`` first. Exited processes are
    left out. Empty when ``pid`` is not a session leader and not running."""
    pid = int(pid)
    table = procfs.process_table(with_cgroup=False)
    found = {}
    if pid in table and not table[pid].exited:
        found[pid] = table[pid].starttime
    members = procfs.descendants(table, pid)
    members += [info.pid for info in table.values() if info.sid == pid and info.pid != pid]
    for member in members:
        info = table.get(member)
        if info is not None and not info.exited:
            found.setdefault(member, info.starttime)
    return sorted(found.items(), key=lambda item: (item[0] != pid, item[0]))


def stop_tree(pid, start=None, timeout=60.0, kill_grace=10.0, is_child=False, term_signal=signal.SIGTERM, orphan_grace=3.0):
    """Stop the server ``pid`` and its whole tree, by PID, through the stop engine (``stop.py``).

    The tree (``tree()``: descendants and session members) is pinned by PID
    and start time; ``term_signal`` goes to the main process only (SGLang
    drains and tears its children down itself, docs/reference/sglang-processes.md, Signals); the
    rest get ``orphan_grace`` seconds once it is gone, at most ``timeout`` in
    all; then SIGKILL for each survivor and the members that appeared
    meanwhile, and up to ``kill_grace`` seconds more.

    Returns ``{"signalled", "killed", "exited", "still_running", "elapsed"}``;
    ``still_running`` is non-empty only when a process survived SIGKILL
    (D state, PID 1 in a container). With ``is_child`` it also has ``exit``
    (:func:`reap`: the main process's status, None when it was not
    collected) and ``normal_stop`` (:func:`normal_stop`: 0, death by SIGTERM
    and exit status 143 are a normal stop, not a failure).
    """
    pid = int(pid)
    if start is None:
        start = starttime(pid)
    members = tree(pid) if alive(pid, start) else []
    if not members or members[0][0] != pid:
        if is_child:
            reap(pid)
        return {"signalled": [], "killed": [], "exited": [], "still_running": [], "elapsed": 0.0}

    def before_kill(live):
        return [stop.Target(p, s) for p, s in tree(pid)] if pid in live else []

    status = {}

    def collect():
        got = reap(pid)
        if got is not None:
            status["exit"] = got

    def on_exit(gone_pid):
        if is_child and gone_pid == pid:
            collect()

    res = stop.stop([stop.Target(p, s, first=(p == pid)) for p, s in members], first_signal=term_signal,
                    term_timeout=max(float(timeout), 0.0), kill_timeout=kill_grace, grace=orphan_grace,
                    before_kill=before_kill, on_exit=on_exit)
    stop.close_all(res)
    if is_child:
        collect()
    first = procfs.signal_name(term_signal)
    signalled, killed = [], []
    for report in res["reports"]:
        later = list(report["signals"])
        if report["pid"] == pid and later and later[0] == first:
            signalled.append(pid)
            later = later[1:]
        if "SIGKILL" in later:
            killed.append(report["pid"])
    still = sorted(set(res["survivors"]))
    report = {
        "signalled": signalled,
        "killed": sorted(set(killed)),
        "exited": sorted(set(p for p, _s in members) - set(still)),
        "still_running": still,
        "elapsed": res["elapsed"],
    }
    if is_child:
        report["exit"] = status.get("exit")
        report["normal_stop"] = normal_stop(status.get("exit"))
    return report


def kill_leftovers(members, grace=5.0):
    """SIGKILL every ``(pid, start)`` still running (a crashed server's
    children that may still hold GPU memory); returns ``(killed, still_running)``."""
    return stop.kill(members, grace=grace)


# --------------------------------------------------------------------------
# Logs
# --------------------------------------------------------------------------

def read_log(path, offset=0, max_bytes=4 * 1024 * 1024):
    """Text of ``path`` from ``offset`` on (at most the last ``max_bytes``).
    A log that shrank (rotated, truncated) is read from its start."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            if offset is None or offset > size:
                offset = 0
            begin = max(offset, size - max_bytes)
            fh.seek(begin)
            data = fh.read()
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return ""
        raise
    return data.decode("utf-8", errors="replace")


def log_size(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def tail(text, lines=40):
    """The last ``lines`` lines of ``text`` as a list."""
    rows = text.splitlines()
    return rows[-lines:] if lines else rows
