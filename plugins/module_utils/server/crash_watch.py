# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""An SGLang server's processes and its crash: which process is the server, which are its children, and what says
that one of them failed."""

from __future__ import annotations

import os

from ansible_collections.gpufleet.sglang.plugins.module_utils.node import procfs
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import supervise as sp
from ansible_collections.gpufleet.sglang.plugins.module_utils.server.server_logs import MSG_LINE_MAX

# The processes of an SGLang server whose loss means that the server crashed: their titles (setproctitle, 0.5.23
# managers/scheduler.py, detokenizer_manager.py, data_parallel_controller.py: sglang::scheduler with _DP<d>/_TP<n>
# suffixes, sglang::detokenizer) and, cut to 15 characters, their comm.
CHILD_TITLES = ("sglang::scheduler", "sglang::detokenizer", "sglang::data_parallel_controller")
CHILD_COMMS = ("sglang::schedul", "sglang::detoken", "sglang::data_pa")
# What an SGLang server logs when one of its processes failed (0.5.23: tokenizer_manager.py, scheduler.py,
# detokenizer_manager.py, engine.py). After the first one the real server sleeps 5 s "before crash diagnostics",
# then 60 s more "for CUDA coredumps" while a scheduler lives: its port stays in LISTEN and nothing answers.
CRASH_LINES = ("Sleeping 5 seconds before crash diagnostics", "Scheduler hit an exception",
               "DetokenizerManager hit an exception", "DataParallelController hit an exception",
               "TokenizerManager hit an exception", "Received sigquit from a child process")
DIAGNOSTICS_LINE = "before crash diagnostics"


def is_server_argv(argv):
    """True for the command line of an SGLang server's main process: ``python -m sglang.launch_server ...``, or the
    ``sglang serve ...`` of 0.5.10+ (0.5.23 recommends it): the console script runs the server in its own process, so
    its command line is ``[python, .../bin/sglang, serve, ...]`` (through the script's shebang) or
    ``[.../bin/sglang, serve, ...]``; ``python -m sglang.cli.main serve ...`` too. Only the words before the first
    flag of the server are read (``--model-path`` and what follows never decide)."""
    words = [str(w) for w in argv or []]
    for i, word in enumerate(words):
        if word.startswith("--"):
            break
        nxt = words[i + 1] if i + 1 < len(words) else None
        if word == "-m" and nxt == "sglang.launch_server":
            return True
        if word == "-m" and nxt in ("sglang.cli.main", "sglang.cli") and words[i + 2:i + 3] == ["serve"]:
            return True
        if os.path.basename(word) == "sglang" and nxt == "serve" and i <= 1:
            return True
    return False


def child_role(pid):
    """The SGLang title of ``pid`` (``sglang::scheduler_TP0``, ``sglang::detokenizer``, or the 15-character comm when
    the command line is unreadable); None for any other process (the resource tracker, a helper)."""
    argv = sp.cmdline(pid)
    title = argv[0] if argv else ""
    if title.startswith(CHILD_TITLES):
        return title.split()[0]
    comm = procfs.read_comm(pid) or ""
    return comm if comm.startswith(CHILD_COMMS) else None


def _parent_of(pid):
    stat = procfs.read_stat(int(pid))
    return None if stat is None else stat["ppid"]


def crash_line(text):
    """The first line of ``text`` that says an SGLang process failed (:data:`CRASH_LINES`), or None."""
    for line in (text or "").splitlines():
        if any(marker in line for marker in CRASH_LINES):
            return line.strip()
    return None


class CrashWatch(object):
    """A candidate's crash, seen before its main process exits: one of its scheduler or detokenizer processes is gone
    while the main process still runs, or its log says that a process failed.

    ``check(main_pid, members)`` (``members``: :func:`supervise.tree`) notes every SGLang child it sees and returns
    why the server crashed, or None. Only the processes the server itself started count: a child of the main process
    or of its ``sglang::data_parallel_controller``; a process that a scheduler forks for a moment keeps its parent's
    title (setproctitle rewrites the command line that fork copies) and may end at any time. ``log_path`` is read
    from ``offset`` on, a little at each check.
    """

    def __init__(self, log_path=None, offset=0, role_of=child_role, alive=sp.alive, parent_of=None):
        self.parent_of = parent_of or _parent_of
        self.children = {}
        self.in_diagnostics = False
        self.log_path = log_path
        self.offset = offset or 0
        self.partial = ""
        self.role_of = role_of
        self.alive = alive

    def _new_log_text(self):
        if not self.log_path:
            return ""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                if fh.tell() < self.offset:
                    self.offset = 0           # rotated or truncated: from its start
                fh.seek(self.offset)
                data = fh.read(1024 * 1024)
                self.offset = fh.tell()
        except OSError:
            return ""
        text = self.partial + data.decode("utf-8", "replace")
        head, sep, self.partial = text.rpartition("\n")
        return head + sep

    def check(self, main_pid, members):
        dp_titles = ("sglang::data_parallel_controller", "sglang::data_pa")
        controllers = set([main_pid]) | set(p for p, (_s, role) in self.children.items() if role.startswith(dp_titles))
        roles = {}
        for pid, dummy in members:
            if pid != main_pid and pid not in self.children:
                roles[pid] = self.role_of(pid)
                if (roles[pid] or "").startswith(dp_titles):
                    controllers.add(pid)
        for pid, start in members:
            if roles.get(pid) and self.parent_of(pid) in controllers:
                self.children[pid] = (start, roles[pid])
        text = self._new_log_text()
        self.in_diagnostics = self.in_diagnostics or DIAGNOSTICS_LINE in text
        for pid, (start, role) in sorted(self.children.items()):
            if not self.alive(pid, start):
                return "its process %s (PID %d) is gone while the main process %d still runs" % (role, pid, main_pid)
        line = crash_line(text)
        if line:
            return "its log says: %s" % line[:MSG_LINE_MAX]
        return None
