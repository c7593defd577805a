"""Process and logging helpers of the fake server (Linux, standard library only)."""
from __future__ import annotations

import ctypes
import ctypes.util
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time

logger = logging.getLogger("sglang.srt.utils")

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
SIM_PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# --------------------------------------------------------------------------
# logging: "[%(asctime)s<prefix>] %(message)s" (utils/common.py configure_logger)
# --------------------------------------------------------------------------
def configure_logger(log_level: str = "info", prefix: str = "", log_ms: bool = False) -> None:
    maybe_ms = ".%(msecs)03d" if log_ms else ""
    fmt = f"[%(asctime)s{maybe_ms}{prefix}] %(message)s"
    level = getattr(logging, str(log_level).upper(), logging.INFO)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(fmt, datefmt="%Y-%m-%d %H:%M:%S"))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level)


# --------------------------------------------------------------------------
# prctl helpers
# --------------------------------------------------------------------------
def _libc():
    name = ctypes.util.find_library("c") or "libc.so.6"
    return ctypes.CDLL(name, use_errno=True)


def kill_itself_when_parent_died() -> None:
    """prctl(PR_SET_PDEATHSIG, SIGKILL), as utils/common.py:3432-3449 (docs/reference/sglang-processes.md, Signals)."""
    if sys.platform.startswith("linux"):
        _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def set_process_name(title: str) -> None:
    """Set ``/proc/self/comm`` (15 characters at most, like setproctitle does)."""
    raw = title.encode()[:15]
    try:
        _libc().prctl(PR_SET_NAME, ctypes.c_char_p(raw), 0, 0, 0)
    except Exception:
        try:
            with open("/proc/self/comm", "wb") as fh:
                fh.write(raw)
        except OSError:
            pass


# --------------------------------------------------------------------------
# children: exec'd with argv == [title] so /proc/<pid>/cmdline reads the title
# --------------------------------------------------------------------------
def _python_executable() -> str:
    exe = sys.executable
    if not exe or not os.path.exists(exe):
        exe = os.path.realpath("/proc/self/exe")
    return exe


def spawn_child(title: str, module: str, payload: dict, env=None):
    """Start ``python -m <module>`` whose whole argv is ``[title]``.

    Real SGLang retitles its children with setproctitle, so
    ``/proc/<pid>/cmdline`` of a scheduler reads ``sglang::scheduler_TP3``.
    Here the child is exec'd with ``argv == [title]`` and the interpreter
    given separately (``executable=``); with no arguments Python reads its
    program from stdin, which gets a three-line bootstrap that runs ``module``
    and is then closed.  ``PYTHONHOME`` is pinned to this interpreter's base
    prefix because Python can no longer derive it from ``argv[0]``.  The
    child sets ``/proc/self/comm`` itself (15 characters: ``sglang::schedul``).

    Returns ``(Popen, parent_socket)``: a socketpair carries JSON lines.
    """
    parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    child_env = dict(os.environ if env is None else env)
    paths = [SIM_PYTHON_DIR] + [p for p in child_env.get("PYTHONPATH", "").split(os.pathsep)
                                if p and p != SIM_PYTHON_DIR]
    child_env["PYTHONPATH"] = os.pathsep.join(paths)
    if "PYTHONHOME" not in child_env:
        home = sys.base_prefix
        if sys.base_exec_prefix != sys.base_prefix:
            home += os.pathsep + sys.base_exec_prefix
        child_env["PYTHONHOME"] = home
    child_env["SGLANG_SIM_CHILD_FD"] = str(child_sock.fileno())
    child_env["SGLANG_SIM_CHILD"] = json.dumps(payload)
    code = ("import runpy, sys\n"
            "sys.dont_write_bytecode = False\n"
            "runpy.run_module(%r, run_name='__main__', alter_sys=True)\n" % module)
    proc = subprocess.Popen([title], executable=_python_executable(), stdin=subprocess.PIPE,
                            pass_fds=(child_sock.fileno(),), env=child_env, close_fds=True)
    try:
        proc.stdin.write(code.encode())
        proc.stdin.close()
    except OSError:
        pass
    child_sock.close()
    return proc, parent_sock


class JsonLines:
    """Newline-delimited JSON over a stream socket (thread-safe send)."""

    def __init__(self, sock):
        import threading

        self.sock = sock
        self._buf = b""
        self._lock = threading.Lock()

    def send(self, obj) -> bool:
        data = (json.dumps(obj) + "\n").encode()
        with self._lock:
            try:
                self.sock.sendall(data)
                return True
            except OSError:
                return False

    def recv(self, timeout=None):
        """Next message, or None on EOF; raises socket.timeout on timeout."""
        self.sock.settimeout(timeout)
        while b"\n" not in self._buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line.decode())


# --------------------------------------------------------------------------
# process tree
# --------------------------------------------------------------------------
def children_of(pid: int) -> list:
    """Direct children of ``pid`` (scan of /proc/*/stat)."""
    out = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        rest = data[data.rfind(b")") + 2:].split()
        try:
            if int(rest[1]) == pid:
                out.append(int(name))
        except (IndexError, ValueError):
            continue
    return out


def descendants_of(pid: int) -> list:
    out, todo = [], [pid]
    while todo:
        cur = todo.pop()
        for child in children_of(cur):
            if child not in out:
                out.append(child)
                todo.append(child)
    return out


def pid_alive(pid: int) -> bool:
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            data = fh.read()
    except OSError:
        return False
    state = data[data.rfind(b")") + 2:].split()[0]
    return state not in (b"Z", b"X")


def wait_gone(pids, timeout: float) -> list:
    """Wait until none of ``pids`` is alive; returns the survivors."""
    deadline = time.monotonic() + timeout
    left = [p for p in pids if pid_alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = [p for p in left if pid_alive(p)]
    return left


def process_starttime(pid: int):
    """Field 22 of /proc/<pid>/stat (None when the process is gone or a zombie)."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            data = fh.read()
    except (OSError, ValueError):
        return None
    rest = data[data.rfind(b")") + 2:].split()
    if rest[0] in (b"Z", b"X"):
        return None
    return int(rest[19])
