"""Detached memory-holding processes for ``gpusim hold``.

Process structure (docs/design.md, simulator section)::

    gpusim hold  (CLI, exits once the hold is registered)
      └─ intermediate (setsid, exits at once: the double fork)
           └─ watcher  "gpusim-watch"  own session; child subreaper
                └─ holder  os.setsid(): leads its own session and group;
                   │       comm = NAME; fds open on $GPUSIM_ROOT/dev/nvidia*
                   └─ keepers (--children N): forked after the fds were opened,
                              they inherit them (docs/reference/nvidia-smi.md §3.2 b)

The watcher waits for the holder and stamps ``exited_at`` the moment it reaps
it (``Node.mark_exited``), then keeps reaping reparented keepers and stamps
``keepers_exited_at`` when the last one is gone.

The holder reports back to the CLI over a pipe with one JSON line, so the CLI
prints the PID only after the hold is registered (callers can immediately see
it in nvidia-smi) and turns an out-of-memory into rc 2 with nothing held.

``gpusim monitor`` starts a monitoring agent instead (:func:`spawn_monitor`): a
detached process, leader of its own session, that keeps ``dev/nvidiactl``,
``dev/nvidia<N>`` and (unless ``--no-uvm``) ``dev/nvidia-uvm`` open and polls
the node every ``--interval`` seconds, as NVML exporters, ``nvtop`` or
``gpustat --watch`` do. It registers no hold: nvidia-smi never lists it as a
compute process and it adds no memory (docs/reference/gpu-watchers.md).
"""
from __future__ import annotations

import json
import os
import select
import signal
import time

from . import node as _node
from . import procfs

READY_TIMEOUT_S = 60.0


class SpawnError(Exception):
    def __init__(self, message: str, rc: int = 1):
        super().__init__(message)
        self.rc = rc


def _write_msg(fd: int, msg: dict) -> None:
    data = (json.dumps(msg) + "\n").encode()
    try:
        while data:
            n = os.write(fd, data)
            data = data[n:]
    except OSError:
        pass


def _detach_stdio(keep) -> None:
    """stdin/stdout/stderr -> /dev/null; close every other inherited fd.

    Without this a caller capturing ``gpusim hold`` output would wait for
    EOF until the holder dies.
    """
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    if null > 2:
        os.close(null)
    try:
        fds = [int(x) for x in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 256))
    for fd in fds:
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


# Every signal a drain may send starts at its default action in the holder,
# whatever the caller's dispositions were: a process started from a
# non-interactive shell's background job (``cmd &``, as CI runners and
# ``make test &`` do) inherits SIGINT and SIGQUIT *ignored* across fork and
# exec, and a holder that silently ignored SIGQUIT made a drain test escalate
# to SIGKILL after term_timeout (issue 12 section 9).
RESET_SIGNALS = (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGPIPE, signal.SIGUSR1, signal.SIGUSR2,
                 signal.SIGALRM, signal.SIGTERM)


def _setup_signals(opts: dict) -> None:
    for sig in RESET_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    if opts.get("ignore_sigterm"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    elif opts.get("exit_delay"):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    else:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _idle(opts: dict) -> None:
    """Hold on until a signal ends us (never returns)."""
    delay = float(opts.get("exit_delay") or 0.0)
    if delay and not opts.get("ignore_sigterm"):
        signal.sigwait({signal.SIGTERM})
        end = time.monotonic() + delay
        while True:  # sleep out the exit delay; nothing interrupts it but SIGKILL/SIGINT
            left = end - time.monotonic()
            if left <= 0:
                break
            time.sleep(left)
        os._exit(0)
    while True:
        signal.pause()


def _holder(node: "_node.Node", wfd: int, opts: dict, watcher: int) -> None:
    rc = 1
    keepers = []
    try:
        os.setsid()
        if opts.get("name"):
            procfs.set_comm(opts["name"])
        _setup_signals(opts)
        # Auto-reap keepers that die while we live.
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        devs = ["nvidiactl", "nvidia-uvm"] + ["nvidia%d" % g for g in opts["gpus"]]
        fds = []
        for d in devs:
            fds.append(os.open(os.path.join(node.dev_dir, d), os.O_RDWR))
        for _child in range(int(opts.get("children") or 0)):
            c = os.fork()
            if c == 0:
                try:
                    os.close(wfd)
                    _idle(opts)
                finally:
                    os._exit(0)
            keepers.append(c)
        try:
            hid = node.hold(os.getpid(), opts["gpus"], opts["mib"], name=opts.get("name"),
                            release_delay=opts.get("release_delay") or 0.0,
                            stuck=bool(opts.get("stuck")), na_memory=bool(opts.get("na_memory")),
                            foreign_ns=bool(opts.get("foreign_ns")), keepers=keepers,
                            watcher_pid=watcher,
                            meta={"ignore_sigterm": bool(opts.get("ignore_sigterm")),
                                  "exit_delay": float(opts.get("exit_delay") or 0.0),
                                  "children": len(keepers), "source": "gpusim hold"})
        except _node.OutOfMemory as e:
            rc = 2
            raise SpawnError(str(e), 2)
        _write_msg(wfd, {"ok": True, "pid": os.getpid(), "watcher_pid": watcher, "id": hid,
                         "keepers": keepers})
        os.close(wfd)
        wfd = -1
        _idle(opts)
    except BaseException as e:  # report anything to the CLI, then vanish
        for c in keepers:
            try:
                os.kill(c, signal.SIGKILL)
            except OSError:
                pass
        if wfd >= 0:
            msg = e.args[0] if isinstance(e, SpawnError) else "%s: %s" % (type(e).__name__, e)
            _write_msg(wfd, {"ok": False, "rc": getattr(e, "rc", rc), "error": msg})
    finally:
        os._exit(rc)


def _watcher(node: "_node.Node", wfd: int, opts: dict) -> None:
    try:
        _detach_stdio(keep={wfd})
        try:
            os.chdir("/")  # like any daemon: never pin the caller's directory
        except OSError:
            pass
        procfs.set_child_subreaper(True)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        me = os.getpid()
        hpid = os.fork()
        if hpid == 0:
            _holder(node, wfd, opts, me)
        procfs.set_comm("gpusim-watch")  # after the fork: the holder keeps the caller's comm
        os.close(wfd)
        holder_done = False
        while True:
            try:
                pid, _status = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            if pid == hpid:
                holder_done = True
                try:
                    node.mark_exited(hpid, at=time.time())
                except Exception:
                    pass
        if holder_done and opts.get("children"):
            try:
                node.mark_keepers_exited(pid=hpid, at=time.time())
            except Exception:
                pass
    finally:
        os._exit(0)


def spawn(node: "_node.Node", gpus, mib: int, name=None, ignore_sigterm=False,
          exit_delay=0.0, release_delay=0.0, stuck=False, na_memory=False,
          foreign_ns=False, children=0) -> dict:
    """Start a detached holder; returns ``{"pid", "watcher_pid", "id", "keepers"}``
    once the hold is registered.  Raises SpawnError (``rc`` 2: out of memory)."""
    opts = {"gpus": list(gpus), "mib": int(mib), "name": name,
            "ignore_sigterm": ignore_sigterm, "exit_delay": float(exit_delay or 0.0),
            "release_delay": float(release_delay or 0.0), "stuck": stuck,
            "na_memory": na_memory, "foreign_ns": foreign_ns, "children": int(children or 0)}
    r, w = os.pipe()
    inter = os.fork()
    if inter == 0:
        try:
            os.close(r)
            os.setsid()
            if os.fork() == 0:
                _watcher(node, w, opts)
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(inter, 0)
    buf = b""
    deadline = time.monotonic() + READY_TIMEOUT_S
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SpawnError("the holder did not report within %.0f s" % READY_TIMEOUT_S)
            ready, _w, _x = select.select([r], [], [], left)
            if not ready:
                continue
            chunk = os.read(r, 65536)
            if not chunk:
                break
            buf += chunk
    finally:
        os.close(r)
    line = buf.decode(errors="replace").strip()
    if not line:
        raise SpawnError("the holder exited before registering its hold")
    msg = json.loads(line.splitlines()[0])
    if not msg.get("ok"):
        raise SpawnError(msg.get("error") or "hold failed", int(msg.get("rc") or 1))
    return msg


# ---------------------------------------------------------------------------
# Monitoring agents (``gpusim monitor``)
# ---------------------------------------------------------------------------

def _monitor(node: "_node.Node", wfd: int, opts: dict) -> None:
    rc = 1
    try:
        _detach_stdio(keep={wfd})
        try:
            os.chdir("/")
        except OSError:
            pass
        os.setsid()     # a daemon of its own, as a service's main process is: it leads its session and group
        procfs.set_comm(opts.get("name") or "gpu-monitor")
        _setup_signals({})
        devs = ["nvidiactl"] + (["nvidia-uvm"] if opts.get("uvm", True) else []) + ["nvidia%d" % g for g in opts["gpus"]]
        fds = [os.open(os.path.join(node.dev_dir, d), os.O_RDWR) for d in devs]
        _write_msg(wfd, {"ok": True, "pid": os.getpid(), "devices": devs, "fds": len(fds)})
        os.close(wfd)
        wfd = -1
        interval = float(opts.get("interval") or 1.0)
        while True:
            # One poll, as an NVML exporter scrapes: read every GPU's memory, register nothing.
            try:
                node.gpus()
            except Exception:  # noqa: BLE001 - an exporter keeps polling when the driver fails
                pass
            time.sleep(interval)
    except BaseException as e:  # report anything to the CLI, then vanish
        if wfd >= 0:
            _write_msg(wfd, {"ok": False, "rc": rc, "error": "%s: %s" % (type(e).__name__, e)})
    finally:
        os._exit(rc)


def spawn_monitor(node: "_node.Node", gpus, name=None, uvm=True, interval=1.0) -> dict:
    """Start a detached monitoring agent with the device files of ``gpus`` open; returns ``{"pid", "devices"}`` once
    its descriptors are open. It holds no memory and is no compute process. Raises SpawnError."""
    opts = {"gpus": list(gpus), "name": name, "uvm": bool(uvm), "interval": float(interval)}
    r, w = os.pipe()
    inter = os.fork()
    if inter == 0:
        try:
            os.close(r)
            os.setsid()
            if os.fork() == 0:
                _monitor(node, w, opts)
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(inter, 0)
    buf = b""
    deadline = time.monotonic() + READY_TIMEOUT_S
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SpawnError("the monitor did not report within %.0f s" % READY_TIMEOUT_S)
            ready, _w, _x = select.select([r], [], [], left)
            if not ready:
                continue
            chunk = os.read(r, 65536)
            if not chunk:
                break
            buf += chunk
    finally:
        os.close(r)
    line = buf.decode(errors="replace").strip()
    if not line:
        raise SpawnError("the monitor exited before it opened the device files")
    msg = json.loads(line.splitlines()[0])
    if not msg.get("ok"):
        raise SpawnError(msg.get("error") or "monitor failed", int(msg.get("rc") or 1))
    return {"pid": msg["pid"], "devices": msg.get("devices", [])}
