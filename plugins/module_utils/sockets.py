# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Who listens on a TCP port, from /proc/net/tcp{,6} and /proc/<pid>/fd (standard library only)."""

from __future__ import annotations

import os

PROC_ROOT = "/proc"
_LISTEN = "0A"


def _decode_port(local_address):
    return int(local_address.rpartition(":")[2], 16)


def parse_net_tcp(text):
    """Yield ``(port, inode)`` for every listening socket in a /proc/net/tcp(6) table."""
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != _LISTEN:
            continue
        try:
            yield _decode_port(fields[1]), int(fields[9])
        except ValueError:
            continue


def listening_inodes(port, proc_root=PROC_ROOT):
    """Socket inodes listening on ``port`` (any address, IPv4 or IPv6)."""
    inodes = set()
    for name in ("tcp", "tcp6"):
        try:
            with open(os.path.join(proc_root, "net", name), encoding="ascii", errors="replace") as fh:
                text = fh.read()
        except OSError:
            continue
        for p, inode in parse_net_tcp(text):
            if p == port and inode:
                inodes.add(inode)
    return inodes


def socket_owners(inodes, proc_root=PROC_ROOT):
    """PIDs that have one of the socket ``inodes`` open (needs permission to read their fds)."""
    wanted = {"socket:[%d]" % i for i in inodes}
    owners = set()
    if not wanted:
        return owners
    for entry in os.listdir(proc_root):
        if not entry.isdigit():
            continue
        fd_dir = os.path.join(proc_root, entry, "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(os.path.join(fd_dir, fd)) in wanted:
                    owners.add(int(entry))
                    break
            except OSError:
                continue
    return owners


def port_listeners(port, proc_root=PROC_ROOT):
    """``(listening, pids)``: whether anything listens on ``port`` and which PIDs own it (may be empty
    when the owner's fds cannot be read, for example another user's process without root)."""
    inodes = listening_inodes(port, proc_root)
    return bool(inodes), sorted(socket_owners(inodes, proc_root))
