# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A server's log: the header of each start, the text and tail of one start (log file or journal), cut for messages."""

from __future__ import annotations

import os
import time

from ansible_collections.gpufleet.sglang.plugins.module_utils.node import supervise as sp

LOG_TAIL_LINES = 40
JOURNAL_LINES = 200
MSG_LINE_MAX = 400


def short_lines(lines):
    """Log lines for a message: very long ones (SGLang's server_args=...) are cut."""
    return "\n".join(line if len(line) <= MSG_LINE_MAX else line[:MSG_LINE_MAX] + " [... %d more characters]" % (
        len(line) - MSG_LINE_MAX) for line in lines)


class ServerLogs(object):
    """The log methods of :class:`launcher.Launcher`."""

    def _log_header(self):
        line = "=== gpufleet.sglang: starting %s at %s: %s ===\n" % (
            self.name, time.strftime("%Y-%m-%dT%H:%M:%S%z"), " ".join(self.masked(self.argv)))
        fd = os.open(self.log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, line.encode("utf-8"))
            return os.lseek(fd, 0, os.SEEK_END)
        finally:
            os.close(fd)

    def log_text(self, offset, since_wall=None):
        if getattr(self, "box", None) is not None:
            return self.box_log_text(since_wall)
        if self.log_file and (self.manager == "process" or os.path.exists(self.log_file) and sp.log_size(self.log_file) > (offset or 0)):
            return sp.read_log(self.log_file, offset)
        if self.manager == "systemd":
            journalctl = self.ctx.get_bin_path("journalctl", required=False)
            if not journalctl:
                return ""
            cmd = [journalctl, "-u", self.unit, "-n", str(JOURNAL_LINES), "--no-pager", "-o", "cat"]
            if since_wall:
                cmd += ["--since", "@%d" % int(since_wall)]
            rc, out, _err = self.run(cmd)
            return out if rc == 0 else ""
        return ""

    def log_tail(self, offset, since_wall=None):
        text = self.log_text(offset, since_wall)
        return [self.mask(line) for line in sp.tail(text, LOG_TAIL_LINES)]
