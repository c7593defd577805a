# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Who holds a TCP port, from /proc/net/tcp{,6} and /proc/<pid>/fd (standard library only).

* :func:`port_listeners` (``(listening, pids)``) answers "does anything
  listen on this port, and who";
* :func:`port_status` also says who owns each listening socket (PID, name,
  user) and whether the port is held only by sockets that are not listening
  (``TIME_WAIT`` after a killed server, ``FIN_WAIT``, an established
  connection), which the kernel lets a new server bind with ``SO_REUSEADDR``
  (SGLang sets it) once they are gone, and which hold it otherwise;
* :func:`wait_ports_free` waits (``wait.wait_for``) until none of the ports
  has a listener or a lingering socket, and names the holders when it times
  out;
* :func:`listening_ports` lists the ports a PID listens on (for reports);
* :func:`port_held_by` answers "is the listener on this port one of these
  PIDs" (the health gate's proof that the server answering is the candidate).

IPv4 and IPv6 tables are both read; an IPv4-mapped IPv6 listener counts for
the port like any other. A port counts as held whatever address it is bound
to: a wildcard bind (``0.0.0.0``, ``::``) takes the port on every interface,
as SGLang's scheduler does with its torch.distributed store port even when the
server runs with ``--host 127.0.0.1`` (measured on 0.5.23), so a new server
binding that port on any address fails. Listeners report their ``address``
(``0.0.0.0`` and ``::`` for all interfaces).
"""

from __future__ import annotations

import os
import pwd
import socket
import sys

from ansible_collections.gpufleet.sglang.plugins.module_utils.common import wait

PROC_ROOT = "/proc"

# The TCP states of /proc/net/tcp (include/net/tcp_states.h).
TCP_STATES = {
    "01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1", "05": "FIN_WAIT2",
    "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT", "09": "LAST_ACK", "0A": "LISTEN", "0B": "CLOSING",
    "0C": "NEW_SYN_RECV",
}


def _decode_port(local_address):
    return int(local_address.rpartition(":")[2], 16)


def decode_address(local_address):
    """The address of a /proc/net/tcp(6) ``local_address`` field: ``0100007F:1F90`` -> ``127.0.0.1``,
    ``00000000000000000000000000000000:1F90`` -> ``::``; None when it cannot be read. The kernel writes
    each 32-bit word in host byte order (little-endian on x86 and arm64)."""
    text = local_address.rpartition(":")[0]
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        return None
    if len(raw) not in (4, 16):
        return None
    order = "little" if sys.byteorder == "little" else "big"
    words = b"".join(int.from_bytes(raw[i:i + 4], "big").to_bytes(4, order) for i in range(0, len(raw), 4))
    try:
        return socket.inet_ntop(socket.AF_INET if len(words) == 4 else socket.AF_INET6, words)
    except (OSError, ValueError):
        return None


WILDCARD_ADDRESSES = ("0.0.0.0", "::")


def is_wildcard(address):
    """True for an address that binds every interface (``0.0.0.0``, ``::``)."""
    return address in WILDCARD_ADDRESSES


def parse_net_tcp_all(text):
    """Yield ``(local_port, state_name, inode, uid)`` for every row of a /proc/net/tcp(6) table."""
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10:
            continue
        try:
            yield _decode_port(fields[1]), TCP_STATES.get(fields[3].upper(), fields[3]), int(fields[9]), int(fields[7])
        except ValueError:
            continue


def parse_net_tcp(text):
    """Yield ``(port, inode)`` for every listening socket in a /proc/net/tcp(6) table."""
    for port, state, inode, dummy in parse_net_tcp_all(text):
        if state == "LISTEN":
            yield port, inode


def _tables(proc_root):
    for name in ("tcp", "tcp6"):
        try:
            with open(os.path.join(proc_root, "net", name), encoding="ascii", errors="replace") as fh:
                yield name, fh.read()
        except OSError:
            continue


def listening_inodes(port, proc_root=PROC_ROOT):
    """Socket inodes listening on ``port`` (any address, IPv4 or IPv6)."""
    inodes = set()
    for dummy, text in _tables(proc_root):
        for p, inode in parse_net_tcp(text):
            if p == port and inode:
                inodes.add(inode)
    return inodes


def _socket_map(inodes, proc_root):
    """``{inode: set(pids)}`` for the socket ``inodes`` (needs permission to read the fds)."""
    wanted = dict(("socket:[%d]" % i, i) for i in inodes)
    owners = {}
    if not wanted:
        return owners
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return owners
    for entry in entries:
        if not entry.isdigit():
            continue
        fd_dir = os.path.join(proc_root, entry, "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if target in wanted:
                owners.setdefault(wanted[target], set()).add(int(entry))
    return owners


def socket_owners(inodes, proc_root=PROC_ROOT):
    """PIDs that have one of the socket ``inodes`` open (needs permission to read their fds)."""
    owners = set()
    for pids in _socket_map(inodes, proc_root).values():
        owners |= pids
    return owners


def port_listeners(port, proc_root=PROC_ROOT):
    """``(listening, pids)``: whether anything listens on ``port`` and which PIDs own it (may be empty
    when the owner's fds cannot be read, for example another user's process without root)."""
    inodes = listening_inodes(port, proc_root)
    return bool(inodes), sorted(socket_owners(inodes, proc_root))


def _comm(pid, proc_root):
    try:
        with open(os.path.join(proc_root, str(pid), "comm"), "rb") as fh:
            return fh.read().decode("utf-8", "replace").rstrip("\n")
    except OSError:
        return None


def _user(uid):
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, TypeError):
        return None if uid is None else str(uid)


def port_status(port, proc_root=PROC_ROOT):
    """Everything that holds TCP ``port`` locally, IPv4 and IPv6.

    Returns ``{"port", "free", "listeners": [{"pid", "name", "user", "family"}], "listening",
    "lingering": {"TIME_WAIT": 2, ...}, "only_lingering", "summary"}``. A listener
    whose owner cannot be read (another user's process, without root) has
    ``pid`` None. ``only_lingering`` is True when no socket listens but sockets
    in other states (TIME_WAIT after a killed server) still use the port.
    """
    port = int(port)
    listen_inodes = {}
    lingering = {}
    addresses = {}
    tables = list(_tables(proc_root))
    for name, text in tables:
        for address, inode in _listen_addresses(text, port):
            addresses[(name, inode)] = address
    for name, text in tables:
        family = "ipv6" if name == "tcp6" else "ipv4"
        for p, state, inode, uid in parse_net_tcp_all(text):
            if p != port:
                continue
            if state == "LISTEN":
                listen_inodes[inode] = (family, uid, addresses.get((name, inode)))
            else:
                lingering[state] = lingering.get(state, 0) + 1
    owners = _socket_map([i for i in listen_inodes if i], proc_root)
    listeners = []
    for inode in sorted(listen_inodes):
        family, uid, address = listen_inodes[inode]
        pids = sorted(owners.get(inode) or [])
        if not pids:
            listeners.append({"pid": None, "name": None, "user": _user(uid), "family": family, "address": address})
        for pid in pids:
            listeners.append({"pid": pid, "name": _comm(pid, proc_root), "user": _user(uid), "family": family,
                              "address": address})
    seen = set()
    unique = []
    for entry in listeners:
        key = (entry["pid"], entry["family"], entry["address"])
        if key not in seen:
            seen.add(key)
            unique.append(entry)
    status = {"port": port, "listening": bool(listen_inodes), "listeners": unique, "lingering": lingering,
              "only_lingering": not listen_inodes and bool(lingering), "free": not listen_inodes and not lingering}
    status["summary"] = describe(status)
    return status


def _listen_addresses(text, port):
    """``(address, inode)`` of the listening sockets on ``port`` in one /proc/net/tcp(6) table."""
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3].upper() != "0A":
            continue
        try:
            if _decode_port(fields[1]) == port:
                yield decode_address(fields[1]), int(fields[9])
        except ValueError:
            continue


def _where(entry):
    address = entry.get("address")
    if address is None:
        return entry["family"]
    return "%s, %s" % (entry["family"], "all interfaces" if is_wildcard(address) else address)


def describe(status):
    """One sentence about a :func:`port_status` result."""
    port = status["port"]
    if status["free"]:
        return "port %d is free" % port
    parts = []
    if status["listening"]:
        who = []
        for entry in status["listeners"]:
            if entry["pid"] is None:
                who.append("an unreadable process of user %s (%s)" % (entry["user"] or "?", _where(entry)))
            else:
                who.append("PID %d (%s, user %s, %s)" % (entry["pid"], entry["name"] or "?", entry["user"] or "?",
                                                         _where(entry)))
        parts.append("listened on by %s" % ", ".join(who))
    if status["lingering"]:
        states = ", ".join("%d in %s" % (n, s) for s, n in sorted(status["lingering"].items()))
        parts.append(("held only by sockets that are not listening (%s), as a killed server leaves them" if
                      not status["listening"] else "with sockets in %s") % states)
    return "port %d is %s" % (port, "; ".join(parts))


def socket_inodes(pid, proc_root=PROC_ROOT):
    """The socket inodes ``pid`` has open; None when its fds cannot be read (gone, or another user's)."""
    fd_dir = os.path.join(proc_root, str(pid), "fd")
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return None
    inodes = set()
    for fd in fds:
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue
        if target.startswith("socket:["):
            try:
                inodes.add(int(target[8:-1]))
            except ValueError:
                continue
    return inodes


def port_held_by(port, pids, proc_root=PROC_ROOT):
    """Whether the listener on ``port`` belongs to one of ``pids`` (a server's process tree).

    Returns ``{"listening", "ours", "known", "others"}``: ``ours`` is True when one of the listening
    sockets on the port is open in one of ``pids``; ``known`` is False when none of ``pids`` had readable
    fds (then ``ours`` proves nothing); ``others`` lists the PIDs outside ``pids`` that hold a listener on the
    port (read only when it is not ours: a scan of every process's fds).
    """
    inodes = listening_inodes(int(port), proc_root)
    out = {"listening": bool(inodes), "ours": False, "known": False, "others": []}
    if not inodes:
        return out
    for pid in pids:
        held = socket_inodes(pid, proc_root)
        if held is None:
            continue
        out["known"] = True
        if held & inodes:
            out["ours"] = True
            return out
    out["others"] = sorted(set(socket_owners(inodes, proc_root)) - set(int(p) for p in pids))
    return out


def listening_ports(pid, proc_root=PROC_ROOT):
    """The TCP ports ``pid`` listens on (IPv4 and IPv6), sorted; [] when unknown."""
    inodes = socket_inodes(pid, proc_root)
    ports = set()
    if not inodes:
        return []
    for dummy, text in _tables(proc_root):
        for port, inode in parse_net_tcp(text):
            if inode in inodes:
                ports.add(port)
    return sorted(ports)


def wait_ports_free(ports, timeout, interval=0.5, allow_lingering=False, proc_root=PROC_ROOT, sleep=None, clock=None):
    """Wait until every port in ``ports`` is free; returns ``(ok, statuses)``.

    ``statuses`` are the last :func:`port_status` results of the ports that
    were not free (empty when ``ok``). With ``allow_lingering`` a port held
    only by TIME_WAIT-like sockets counts as free (a server that sets
    SO_REUSEADDR, as SGLang does, can bind it).
    """
    ports = sorted(set(int(p) for p in ports))
    last = {"busy": []}

    def check():
        busy = []
        for port in ports:
            status = port_status(port, proc_root)
            if status["free"] or (allow_lingering and status["only_lingering"]):
                continue
            busy.append(status)
        last["busy"] = busy
        return not busy

    res = wait.wait_for(check, timeout=timeout, interval=interval, sleep=sleep, clock=clock)
    return res.ok, ([] if res.ok else last["busy"])
