"""Helpers for the sglang_launch integration tests: run the module through
Ansible (ad-hoc, local connection, ``minimal`` output parsed; the ``json``
stdout callback that conftest's ``run_module`` uses overwrites a result key
named ``action`` with the module name, and sglang_launch returns ``action``),
free ports, a minimal fake systemd (``systemctl``/``journalctl``) for the
``manager: systemd`` path, and clean-up of every process a test started, by
PID (never by name or pattern)."""
from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
SIM_PY = REPO / "simulator" / "python"
SIM_BIN = REPO / "simulator" / "bin"
VENV_BIN = REPO / ".venv" / "bin"
ANSIBLE = str(VENV_BIN / "ansible") if (VENV_BIN / "ansible").exists() else "ansible"
MODULE = "gpufleet.sglang.sglang_launch"


def free_port():
    """A TCP port nothing listens on right now (bind to 0, read it back)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


class Run(object):
    """The outcome of one module run through Ansible: ``result`` is the
    module result as Ansible printed it, plus ``failed``, ``warnings`` (the
    ``[WARNING]`` texts, whitespace-normalised) and ``_wall`` (seconds)."""

    def __init__(self, result, stdout, stderr, rc, elapsed):
        self.result = result
        self.stdout = stdout
        self.stderr = stderr
        self.rc = rc
        self.elapsed = elapsed

    @property
    def failed(self):
        return bool(self.result.get("failed"))

    def __getitem__(self, key):
        return self.result[key]

    def get(self, key, default=None):
        return self.result.get(key, default)

    def everything(self):
        """All text Ansible produced for this run: result JSON, stdout, stderr."""
        return "\n".join([json.dumps(self.result), self.stdout, self.stderr])

    def __repr__(self):
        return "Run(rc=%s, elapsed=%.1f, result=%s, stderr=%s)" % (
            self.rc, self.elapsed, json.dumps(self.result, indent=1)[:4000], self.stderr[-2000:])


_STATUS_RE = re.compile(r"^localhost \| (SUCCESS|CHANGED|FAILED!|UNREACHABLE!) => ", re.M)


def run_module_raw(params, tmp_path, check=False, diff=False, env=None, verbosity=0, timeout=300, module=MODULE):
    """Run ``module`` with ``params`` on localhost through ``ansible`` (ad-hoc,
    ``minimal`` callback) and return a :class:`Run`. The result is what
    Ansible printed, so secrets are already censored by its no_log handling:
    exactly what a user sees."""
    cmd = [ANSIBLE, "localhost", "-i", "localhost,", "-c", "local", "-m", module, "-a", json.dumps(params),
           "-e", "ansible_python_interpreter=%s" % sys.executable]
    if check:
        cmd.append("--check")
    if diff:
        cmd.append("--diff")
    if verbosity:
        cmd.append("-" + "v" * verbosity)
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env["ANSIBLE_COLLECTIONS_PATH"] = str(REPO / ".collections")
    full_env["ANSIBLE_CONFIG"] = str(REPO / "ansible.cfg")
    full_env["ANSIBLE_LOCAL_TEMP"] = str(pathlib.Path(tmp_path) / "ansible-local")
    full_env["ANSIBLE_NOCOLOR"] = "1"
    full_env["ANSIBLE_DEPRECATION_WARNINGS"] = "0"
    full_env.pop("ANSIBLE_STDOUT_CALLBACK", None)
    full_env.pop("ANSIBLE_LOAD_CALLBACK_PLUGINS", None)
    began = time.monotonic()
    proc = subprocess.run(cmd, cwd=str(REPO), env=full_env, capture_output=True, text=True, timeout=timeout, check=False)
    elapsed = time.monotonic() - began
    match = _STATUS_RE.search(proc.stdout)
    if match is None:
        raise AssertionError("no module result in the ansible output: rc=%d\nstdout=%s\nstderr=%s"
                             % (proc.returncode, proc.stdout[-4000:], proc.stderr[-4000:]))
    result, dummy = json.JSONDecoder().raw_decode(proc.stdout[match.end():])
    result["failed"] = match.group(1) in ("FAILED!", "UNREACHABLE!")
    warnings = re.findall(r"\[WARNING\]: (.*?)(?=\n\S|\Z)", proc.stderr + "\n" + proc.stdout, re.S)
    result["warnings"] = [" ".join(w.split()) for w in warnings]
    result["_wall"] = elapsed
    return Run(result, proc.stdout, proc.stderr, proc.returncode, elapsed)


# --------------------------------------------------------------------------
# Process bookkeeping (by PID)
# --------------------------------------------------------------------------

def _stat(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            data = fh.read().decode("utf-8", "replace")
    except OSError:
        return None
    rest = data[data.rfind(")") + 2:].split()
    return {"state": rest[0], "ppid": int(rest[1]), "sid": int(rest[3]), "starttime": int(rest[19])}


def alive(pid):
    st = _stat(pid)
    return st is not None and st["state"] not in ("Z", "X")


def session_members(sid):
    """PIDs in session ``sid`` (the server and everything it started)."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None and st["sid"] == sid and st["state"] not in ("Z", "X"):
                out.append(int(name))
    return sorted(out)


def cmdlines(pids):
    out = {}
    for pid in pids:
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as fh:
                out[pid] = fh.read().decode("utf-8", "replace").split("\0")
        except OSError:
            pass
    return out


class Procs(object):
    """Remembers the server PIDs a test caused, and kills their sessions by PID at the end."""

    def __init__(self):
        self.pids = []

    def add(self, pid):
        if pid and pid not in self.pids:
            self.pids.append(int(pid))
        return pid

    def add_pid_file(self, path):
        try:
            self.add(int(pathlib.Path(path).read_text().split()[0]))
        except (OSError, ValueError, IndexError):
            pass

    def cleanup(self, grace=5.0):
        targets = set()
        for pid in self.pids:
            if alive(pid):
                targets.add(pid)
            targets.update(session_members(pid))
        for pid in sorted(targets):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(alive(p) for p in targets):
            time.sleep(0.05)
        return sorted(p for p in targets if alive(p))


@pytest.fixture
def servers():
    """A :class:`Procs` for the servers one test causes (``from launch_helpers import servers``); fails the test if
    any of them survives SIGKILL."""
    tracker = Procs()
    yield tracker
    left = tracker.cleanup()
    assert not left, "processes survived SIGKILL: %s" % left


def smg1_binary():
    """The ``smg`` binary of smg 1.x from its own venv, installed on first use by scripts/setup-smg.sh
    (requirements/smg.txt; GPUFLEET_SMG_VENV points at another venv)."""
    out = subprocess.run([str(REPO / "scripts" / "setup-smg.sh")], capture_output=True, text=True, timeout=600,
                         check=False)
    assert out.returncode == 0, "scripts/setup-smg.sh failed:\n%s" % out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


# --------------------------------------------------------------------------
# A minimal systemd stand-in for the manager: systemd path
# --------------------------------------------------------------------------

FAKE_SYSTEMCTL = r'''#!PYTHON
"""Fake systemctl for tests: units are JSON files $FAKE_SYSTEMD_ROOT/<unit>.json
with "argv", "env" and "log"; supports show/start/stop/restart/daemon-reload."""
import json, os, signal, sys, time
root = os.environ["FAKE_SYSTEMD_ROOT"]
calls = os.path.join(root, "calls.log")
with open(calls, "a") as fh:
    fh.write(" ".join(sys.argv[1:]) + "\n")


def stat(pid):
    try:
        data = open("/proc/%d/stat" % pid).read()
    except OSError:
        return None
    rest = data[data.rfind(")") + 2:].split()
    return rest[0], int(rest[3])


def alive(pid):
    st = stat(pid)
    return st is not None and st[0] not in "ZX"


def main_pid(unit):
    try:
        pid = int(open(os.path.join(root, unit + ".pid")).read())
    except (OSError, ValueError):
        return 0
    return pid if alive(pid) else 0


def start(unit):
    if main_pid(unit):
        return 0
    spec = json.load(open(os.path.join(root, unit + ".json")))
    env = dict(os.environ)
    env.update(spec.get("env", {}))
    log = os.open(spec["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
    pid = os.fork()
    if pid == 0:
        pid2 = os.fork()  # double fork: the service is not our child, like under PID 1
        if pid2:
            open(os.path.join(root, unit + ".pid"), "w").write(str(pid2))
            os._exit(0)
        os.setsid()  # like systemd: the service leads its own session
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0); os.dup2(log, 1); os.dup2(log, 2)
        os.closerange(3, 1024)
        os.execvpe(spec["argv"][0], spec["argv"], env)
    os.waitpid(pid, 0)
    return 0


def stop(unit):
    pid = main_pid(unit)
    if pid:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        for name in os.listdir("/proc"):  # KillMode=mixed: SIGKILL the rest of the unit, by PID
            if name.isdigit():
                st = stat(int(name))
                if st and st[1] == pid:
                    try:
                        os.kill(int(name), signal.SIGKILL)
                    except OSError:
                        pass
    try:
        os.unlink(os.path.join(root, unit + ".pid"))
    except OSError:
        pass
    return 0


args = [a for a in sys.argv[1:] if not a.startswith("--") or a.startswith("--property")]
verb = args[0]
if verb == "daemon-reload":
    sys.exit(0)
unit = args[-1]
if verb == "show":
    pid = main_pid(unit)
    had = os.path.exists(os.path.join(root, unit + ".pid"))
    props = {"MainPID": str(pid), "ActiveState": "active" if pid else ("failed" if had else "inactive"),
             "SubState": "running" if pid else "dead", "Result": "success" if pid or not had else "exit-code",
             "ExecMainStatus": "0", "NeedDaemonReload": "no", "LoadState": "loaded"}
    wanted = None
    for a in sys.argv[1:]:
        if a.startswith("--property="):
            wanted = a.split("=", 1)[1].split(",")
    for key in wanted or sorted(props):
        print("%s=%s" % (key, props.get(key, "")))
    sys.exit(0)
if verb == "start":
    sys.exit(start(unit))
if verb == "stop":
    sys.exit(stop(unit))
if verb == "restart":
    stop(unit)
    sys.exit(start(unit))
sys.stderr.write("fake systemctl: unsupported %s\n" % sys.argv[1:])
sys.exit(1)
'''

FAKE_JOURNALCTL = r'''#!PYTHON
"""Fake journalctl: prints the tail of the unit's log file."""
import json, os, sys
root = os.environ["FAKE_SYSTEMD_ROOT"]
argv = sys.argv[1:]
unit = argv[argv.index("-u") + 1]
lines = int(argv[argv.index("-n") + 1]) if "-n" in argv else 10
spec = json.load(open(os.path.join(root, unit + ".json")))
try:
    text = open(spec["log"], errors="replace").read()
except OSError:
    text = ""
sys.stdout.write("\n".join(text.splitlines()[-lines:]) + "\n")
'''


def fake_systemd(tmp_path):
    """Create ``bin/systemctl`` and ``bin/journalctl`` under ``tmp_path``;
    returns ``(bin_dir, root)``. Put ``bin_dir`` first on PATH and set
    ``FAKE_SYSTEMD_ROOT=root`` for the module run."""
    base = pathlib.Path(tmp_path)
    bin_dir = base / "fake-bin"
    root = base / "fake-systemd"
    bin_dir.mkdir(exist_ok=True)
    root.mkdir(exist_ok=True)
    for name, text in (("systemctl", FAKE_SYSTEMCTL), ("journalctl", FAKE_JOURNALCTL)):
        path = bin_dir / name
        path.write_text(textwrap.dedent(text).replace("#!PYTHON", "#!" + sys.executable, 1))
        path.chmod(0o755)
    return bin_dir, root


def write_unit(root, unit, argv, env, log):
    pathlib.Path(root, unit + ".json").write_text(json.dumps({"argv": argv, "env": env, "log": str(log)}))


def unit_pid(root, unit):
    try:
        return int(pathlib.Path(root, unit + ".pid").read_text())
    except (OSError, ValueError):
        return None
