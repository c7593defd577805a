"""Tests for module_utils/node/sockets.py: /proc/net/tcp(6) parsing on literal kernel text, owners
from a synthetic /proc tree, and real loopback sockets this test opens (listeners on IPv4 and
IPv6, a port held only by TIME_WAIT, waiting for a port to be free).

No process is started here; the sockets belong to the test process, bound to port 0 on
loopback (the kernel picks a free port), and are closed by the test.
"""
from __future__ import annotations

import os
import socket

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils.node import sockets
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import wait

# Literal /proc/net/tcp text (kernel 5.15): port 0x7530 = 30000 listening on 127.0.0.1 (inode
# 707858), an ESTABLISHED connection to it (01, must be ignored), port 0x07E8 = 2024 listening on
# 0.0.0.0, and a TIME_WAIT entry (06) with inode 0.
NET_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:7530 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 707858 1 00000000f496e512 100 0 0 10 0
   1: 00000000:07E8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1129 1 000000005372adb1 100 0 0 10 0
   2: 0100007F:7530 0100007F:C350 01 00000000:00000000 00:00000000 00000000  1000        0 707999 1 00000000aa96e512 20 4 30 10 -1
   3: 0100007F:9C40 0100007F:7530 06 00000000:00000000 03:00000da0 00000000     0        0 0 3 0000000000000000
"""

# Literal /proc/net/tcp6 text: [::]:30001 listening (0x7531, inode 22222), [::1]:8080 listening
# (0x1F90), and an established IPv6 connection.
NET_TCP6 = "".join(line + "\n" for line in (
    "  sl  local_address                         remote_address                        st tx_queue rx_queue "
    "tr tm->when retrnsmt   uid  timeout inode",
    "   0: 00000000000000000000000000000000:7531 00000000000000000000000000000000:0000 0A 00000000:00000000 "
    "00:00000000 00000000     0        0 22222 1 0000000000000000 100 0 0 10 0",
    "   1: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 "
    "00:00000000 00000000  1000        0 33333 1 0000000000000000 100 0 0 10 0",
    "   2: 00000000000000000000000001000000:1F90 00000000000000000000000001000000:D431 01 00000000:00000000 "
    "00:00000000 00000000  1000        0 33334 1 0000000000000000 20 4 0 10 -1",
))


def test_parse_net_tcp_ipv4_listen_only():
    assert list(sockets.parse_net_tcp(NET_TCP)) == [(30000, 707858), (2024, 1129)]


def test_parse_net_tcp_ipv6():
    assert list(sockets.parse_net_tcp(NET_TCP6)) == [(30001, 22222), (8080, 33333)]


def test_parse_net_tcp_skips_header_short_and_garbled_lines():
    text = "\n".join([
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode",
        "   0: 0100007F:7530 00000000:0000 0A",                                            # truncated
        "   1: 0100007F:ZZZZ 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 5 1",   # bad port
        "   2: 0100007F:7530 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 x 1",   # bad inode
        "   3: 0100007F:7532 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 77 1",
        "",
    ])
    assert list(sockets.parse_net_tcp(text)) == [(30002, 77)]
    assert list(sockets.parse_net_tcp("")) == []
    # The first line is always the header, even when it looks like data.
    assert list(sockets.parse_net_tcp(NET_TCP.splitlines()[1])) == []


def _fake_proc(tmp_path, tcp=NET_TCP, tcp6=NET_TCP6, fds=None):
    """A /proc tree: net/tcp, net/tcp6 and ``fds`` = {pid: [link targets]}."""
    root = tmp_path / "proc"
    (root / "net").mkdir(parents=True)
    if tcp is not None:
        (root / "net" / "tcp").write_text(tcp)
    if tcp6 is not None:
        (root / "net" / "tcp6").write_text(tcp6)
    for pid, targets in (fds or {}).items():
        fd_dir = root / str(pid) / "fd"
        fd_dir.mkdir(parents=True)
        for n, target in enumerate(targets):
            os.symlink(target, str(fd_dir / str(n)))
    (root / "self").mkdir()              # not a PID: ignored
    (root / "999").mkdir()               # a PID without a readable fd directory: ignored
    return str(root)


def test_listening_inodes_ipv4_and_ipv6(tmp_path):
    root = _fake_proc(tmp_path)
    assert sockets.listening_inodes(30000, root) == {707858}
    assert sockets.listening_inodes(30001, root) == {22222}
    assert sockets.listening_inodes(8080, root) == {33333}
    assert sockets.listening_inodes(50000, root) == set()     # only a client port of an established socket


def test_listening_inodes_same_port_on_both_families_and_missing_tables(tmp_path):
    tcp6 = NET_TCP6.replace(":7531 ", ":7530 ")
    root = _fake_proc(tmp_path, tcp6=tcp6)
    assert sockets.listening_inodes(30000, root) == {707858, 22222}
    bare = tmp_path / "bare"
    bare.mkdir()
    (tmp_path / "v6only").mkdir()
    root6 = _fake_proc(tmp_path / "v6only", tcp=None)
    assert sockets.listening_inodes(30000, str(bare)) == set()
    assert sockets.listening_inodes(30001, root6) == {22222}


def test_listening_inodes_ignores_inode_zero(tmp_path):
    text = NET_TCP.splitlines()[0] + "\n   0: 0100007F:7530 00000000:0000 0A 0:0 00:0 0 0 0 0 1\n"
    root = _fake_proc(tmp_path, tcp=text, tcp6=None)
    assert sockets.listening_inodes(30000, root) == set()


def test_socket_owners_and_port_listeners_on_a_fake_proc(tmp_path):
    root = _fake_proc(tmp_path, fds={
        4242: ["/dev/null", "socket:[707858]", "socket:[707858]"],   # the owner (counted once)
        4343: ["socket:[707999]", "pipe:[12]"],                      # the client side: not listening
        4444: ["socket:[22222]"],                                    # listens on 30001
    })
    assert sockets.socket_owners({707858}, root) == {4242}
    assert sockets.socket_owners({707858, 22222}, root) == {4242, 4444}
    assert sockets.socket_owners(set(), root) == set()
    assert sockets.port_listeners(30000, root) == (True, [4242])
    assert sockets.port_listeners(30001, root) == (True, [4444])
    assert sockets.port_listeners(40000, root) == (False, [])


def test_port_listeners_listening_but_owner_not_visible(tmp_path):
    # Another user's server: the socket is listed, its fds cannot be read.
    root = _fake_proc(tmp_path, fds={4343: ["socket:[1]"]})
    assert sockets.port_listeners(2024, root) == (True, [])


def test_socket_owners_skips_unreadable_links(tmp_path, monkeypatch):
    root = _fake_proc(tmp_path, fds={4242: ["socket:[707858]"], 4343: ["socket:[707858]"]})
    real = os.readlink

    def readlink(path):
        if "/4242/" in path:
            raise PermissionError(13, "Permission denied", path)
        return real(path)

    monkeypatch.setattr(sockets.os, "readlink", readlink)
    assert sockets.socket_owners({707858}, root) == {4343}


@pytest.mark.parametrize("family,address", [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")])
def test_port_listeners_live_socket_of_this_process(family, address):
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError:
        pytest.skip("address family not available")
    with sock:
        try:
            sock.bind((address, 0))
        except OSError:
            pytest.skip("%s is not configured" % address)
        port = sock.getsockname()[1]
        assert sockets.port_listeners(port) == (False, [])     # bound, not yet listening
        sock.listen(1)
        assert sockets.port_listeners(port) == (True, [os.getpid()])
    assert sockets.port_listeners(port) == (False, [])


# ---------------------------------------------------------------------------
# port_status / wait_ports_free / listening_ports
# ---------------------------------------------------------------------------

def test_port_status_from_literal_tables(tmp_path):
    root = _fake_proc(tmp_path, fds={4242: ["socket:[707858]"], 5151: ["socket:[22222]"]})
    st = sockets.port_status(30000, root)
    assert st["listening"] and not st["free"] and not st["only_lingering"]
    assert [(e["pid"], e["family"]) for e in st["listeners"]] == [(4242, "ipv4")]
    assert st["lingering"] == {"ESTABLISHED": 1}                 # the accepted connection on port 30000
    assert "listened on by PID 4242" in st["summary"]
    v6 = sockets.port_status(30001, root)
    assert [(e["pid"], e["family"]) for e in v6["listeners"]] == [(5151, "ipv6")]
    unreadable = sockets.port_status(8080, root)                 # nobody's fds show the inode
    assert unreadable["listeners"][0]["pid"] is None and "unreadable process" in unreadable["summary"]
    assert sockets.port_status(50000, root)["free"]
    tw = sockets.port_status(40000, root)                        # only a TIME_WAIT socket uses it
    assert tw["only_lingering"] and tw["lingering"] == {"TIME_WAIT": 1} and "TIME_WAIT" in tw["summary"]


def _listen(family=socket.AF_INET, host="127.0.0.1"):
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.listen(4)
    return sock


def test_port_status_of_real_loopback_sockets():
    v4 = _listen()
    port = v4.getsockname()[1]
    try:
        st = sockets.port_status(port)
        assert [(e["pid"], e["family"]) for e in st["listeners"]] == [(os.getpid(), "ipv4")]
        assert st["listeners"][0]["name"] and st["listeners"][0]["user"]
        assert port in sockets.listening_ports(os.getpid())
    finally:
        v4.close()
    assert sockets.port_status(port)["listening"] is False
    if socket.has_ipv6:
        try:
            v6 = _listen(socket.AF_INET6, "::1")
        except OSError:
            pytest.skip("no IPv6 loopback here")
        try:
            st = sockets.port_status(v6.getsockname()[1])
            assert [(e["pid"], e["family"]) for e in st["listeners"]] == [(os.getpid(), "ipv6")]
        finally:
            v6.close()


def test_a_port_held_only_by_time_wait_after_the_server_closed():
    server = _listen()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port), timeout=5)
    conn, dummy = server.accept()
    conn.close()                     # the server side closes first: its end (local port = `port`) enters TIME_WAIT
    client.recv(1)
    client.close()
    server.close()
    # The last ACK of the close crosses loopback asynchronously: FIN_WAIT2 becomes TIME_WAIT a moment later.
    seen = wait.wait_for(lambda: sockets.port_status(port)["lingering"].get("TIME_WAIT"), timeout=10, interval=0.02)
    assert seen.ok
    st = sockets.port_status(port)
    assert not st["listening"] and st["only_lingering"] and st["lingering"]["TIME_WAIT"] >= 1
    assert "held only by sockets that are not listening" in st["summary"]
    ok, busy = sockets.wait_ports_free([port], timeout=0)
    assert not ok and busy[0]["port"] == port and busy[0]["only_lingering"]
    assert sockets.wait_ports_free([port], timeout=0, allow_lingering=True) == (True, [])


def test_wait_ports_free_sees_the_listener_go_away():
    import threading

    sock = _listen()
    port = sock.getsockname()[1]
    timer = threading.Timer(0.3, sock.close)
    timer.start()
    try:
        ok, busy = sockets.wait_ports_free([port, port], timeout=30, interval=0.05)
    finally:
        timer.cancel()
        sock.close()
    assert ok and busy == []


def test_wait_ports_free_names_the_holder_when_it_times_out():
    sock = _listen()
    port = sock.getsockname()[1]
    try:
        ok, busy = sockets.wait_ports_free([port], timeout=0.1, interval=0.05)
    finally:
        sock.close()
    assert not ok and busy[0]["listeners"][0]["pid"] == os.getpid()
    assert ("listened on by PID %d" % os.getpid()) in busy[0]["summary"]


# ---------------------------------------------------------------------------
# Addresses, wildcard binds, port_held_by
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("field,address", [
    ("0100007F:7530", "127.0.0.1"),
    ("00000000:07E8", "0.0.0.0"),
    ("0501A8C0:1F90", "192.168.1.5"),
    ("00000000000000000000000000000000:7531", "::"),
    ("00000000000000000000000001000000:1F90", "::1"),
    ("0000000000000000FFFF00000100007F:1F90", "::ffff:127.0.0.1"),
    ("ZZ:1F90", None),
    ("0100:1F90", None),
])
def test_decode_address_of_literal_kernel_fields(field, address):
    if field[0] != "Z" and len(field.split(":")[0]) in (8, 32) and socket.htonl(1) == 1:
        pytest.skip("the literal fields are of a little-endian kernel")
    assert sockets.decode_address(field) == address


def test_port_status_names_the_address_and_a_wildcard_bind_of_literal_tables(tmp_path):
    root = _fake_proc(tmp_path, fds={4242: ["socket:[707858]"], 5151: ["socket:[22222]"], 6161: ["socket:[1129]"]})
    assert [e["address"] for e in sockets.port_status(30000, root)["listeners"]] == ["127.0.0.1"]
    wild4 = sockets.port_status(2024, root)          # 0.0.0.0:2024: the store port of a scheduler, say
    assert [(e["pid"], e["address"]) for e in wild4["listeners"]] == [(6161, "0.0.0.0")]
    assert "all interfaces" in wild4["summary"] and not wild4["free"]
    wild6 = sockets.port_status(30001, root)         # [::]:30001
    assert [(e["pid"], e["address"]) for e in wild6["listeners"]] == [(5151, "::")] and "all interfaces" in wild6["summary"]
    assert sockets.is_wildcard("0.0.0.0") and sockets.is_wildcard("::") and not sockets.is_wildcard("127.0.0.1")


def test_a_live_wildcard_bind_holds_the_port_for_every_address():
    """A derived port bound on all interfaces (SGLang's scheduler store port, even with --host 127.0.0.1) is not free
    for a server that binds it on 127.0.0.1: the check sees it whatever address the new server will use."""
    wild = _listen(host="0.0.0.0")
    port = wild.getsockname()[1]
    try:
        st = sockets.port_status(port)
        assert st["listening"] and not st["free"]
        assert [(e["pid"], e["address"]) for e in st["listeners"]] == [(os.getpid(), "0.0.0.0")]
        assert "all interfaces" in st["summary"]
        ok, busy = sockets.wait_ports_free([port], timeout=0.2, interval=0.05)
        assert not ok and busy[0]["port"] == port
        probe = socket.socket()
        try:
            with pytest.raises(OSError):                 # what the new server would meet: EADDRINUSE on loopback
                probe.bind(("127.0.0.1", port))
        finally:
            probe.close()
    finally:
        wild.close()


def test_port_held_by_tells_the_candidates_listener_from_anothers(tmp_path):
    root = _fake_proc(tmp_path, fds={4242: ["socket:[707858]", "pipe:[1]"], 4343: ["socket:[5]"],
                                     5151: ["socket:[22222]"]})
    ours = sockets.port_held_by(30000, [4343, 4242], root)
    assert ours == {"listening": True, "ours": True, "known": True, "others": []}
    theirs = sockets.port_held_by(30000, [4343], root)            # the candidate's tree does not hold the listener
    assert theirs == {"listening": True, "ours": False, "known": True, "others": [4242]}
    unreadable = sockets.port_held_by(30000, [777], root)         # no fd directory: nothing proven either way
    assert unreadable["known"] is False and unreadable["ours"] is False
    assert sockets.port_held_by(50000, [4242], root) == {"listening": False, "ours": False, "known": False, "others": []}


def test_port_held_by_on_a_live_socket():
    sock = _listen()
    port = sock.getsockname()[1]
    try:
        assert sockets.port_held_by(port, [os.getpid()])["ours"] is True
        other = sockets.port_held_by(port, [os.getppid()])
        assert other["ours"] is False and os.getpid() in other["others"]
    finally:
        sock.close()
