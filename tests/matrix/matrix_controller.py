"""pytest plugin for a controller-matrix leg (scripts/matrix-controller.sh VERSION unit|redeploy).

Loaded with ``-p matrix_controller`` (tests/matrix on PYTHONPATH), in the leg's own virtualenv
(.cache/matrix/core-VERSION). It makes sure that what the leg claims to test is what ran:

- the ``ansible`` that pytest imports (module_utils under test, the collection loader) is the leg's
  ansible-core (``GPUFLEET_MATRIX_CORE``, e.g. ``2.17``), else the session fails at its start;
- the module unit tests feed module args through ``ansible.module_utils.testing.patch_module_args``,
  which ansible-core 2.19 added. On an older core the plugin provides that one helper, the way
  tests did it before 2.19 (``basic._ANSIBLE_ARGS`` holds the JSON that ``AnsibleModule`` reads);
  the module code under test is the leg's own ``module_utils.basic``. Nothing else is back-ported;
- the playbook tests' helpers (tests/integration/playbook_helpers.py) look for their tools in the
  project's .venv (ansible-core 2.19) first. Here they use the leg's virtualenv instead: its
  ``python`` for the node side and its ``bin`` first on the PATH that ``ansible_runner.run`` gets
  (runner starts the bare ``ansible-playbook`` through pexpect, which looks it up on that PATH;
  runner's ``binary=`` would switch it to raw mode, without the playbook argument). Before every
  run that PATH must resolve ``ansible-playbook`` to the leg's, and after it the runner's record
  of the command (``artifacts/<ident>/command``) must be the playbook run, with deprecation warnings
  turned on (the helpers turn them off), and its output must hold no ``[WARNING]`` and no
  ``[DEPRECATION WARNING]`` (a collection that claims not to support this core, an injected fact
  read as a variable, ...); the session fails if a playbook test ran no playbook at all this way.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import sys

import pytest

MATRIX_BIN = pathlib.Path(sys.executable).parent
_RUNS: list[str] = []


def _expected_core() -> str:
    want = os.environ.get("GPUFLEET_MATRIX_CORE", "")
    if not want:
        raise pytest.UsageError("GPUFLEET_MATRIX_CORE is not set (scripts/matrix-controller.sh sets it)")
    return want


def pytest_configure(config):
    import ansible.release

    want = _expected_core()
    have = ansible.release.__version__
    if have != want and not have.startswith(want + "."):
        raise pytest.UsageError("this leg is ansible-core %s, but pytest imports ansible %s from %s"
                                % (want, have, ansible.release.__file__))
    config._matrix_core = have
    _backport_patch_module_args()


def _backport_patch_module_args():
    try:
        import ansible.module_utils.testing  # noqa: F401  (ansible-core 2.19 and later)
        return
    except ImportError:
        pass
    import contextlib
    import types
    from unittest import mock

    from ansible.module_utils import basic

    @contextlib.contextmanager
    def patch_module_args(args=None):
        """Expose ``args`` to the AnsibleModule instances created within this context."""
        if not isinstance(args, (dict, type(None))):
            raise TypeError("The `args` arg must be a dict or None.")
        payload = json.dumps({"ANSIBLE_MODULE_ARGS": args or {}}).encode()
        with mock.patch.object(basic, "_ANSIBLE_ARGS", payload):
            yield

    testing = types.ModuleType("ansible.module_utils.testing")
    testing.__doc__ = "patch_module_args for ansible-core < 2.19 (tests/matrix/matrix_controller.py)"
    testing.patch_module_args = patch_module_args
    sys.modules["ansible.module_utils.testing"] = testing
    import ansible.module_utils
    ansible.module_utils.testing = testing


def _warnings(stdout):
    """The warning and deprecation lines of a playbook run's output (with their continuation lines)."""
    found = []
    for line in stdout.splitlines():
        if line.startswith(("[WARNING]", "[DEPRECATION WARNING]")):
            found.append(line)
        elif found and line.startswith((" ", "Origin:", "Use `")) and found[-1] is not None:
            found[-1] += "\n" + line
        else:
            found.append(None)
    return [w for w in found if w]


def pytest_report_header(config):
    return "controller matrix: ansible-core %s from %s" % (getattr(config, "_matrix_core", "?"), MATRIX_BIN)


@pytest.fixture(autouse=True, scope="session")
def _matrix_controller_tools():
    helpers = sys.modules.get("playbook_helpers")
    if helpers is None:
        yield
        return
    import ansible_runner

    playbook = MATRIX_BIN / "ansible-playbook"
    assert playbook.exists(), playbook
    helpers.VENV_BIN = MATRIX_BIN
    original = ansible_runner.run

    def run(**kwargs):
        envvars = dict(kwargs.get("envvars") or {})
        path = envvars.get("PATH", "")
        found = shutil.which("ansible-playbook", path=path)
        assert found and pathlib.Path(found) == playbook, (
            "ansible-runner would start %s, not this leg's %s (PATH %s)" % (found, playbook, path))
        # Deprecation warnings on (the playbook helpers turn them off): a leg shows what this core says.
        envvars["ANSIBLE_DEPRECATION_WARNINGS"] = "1"
        kwargs["envvars"] = envvars
        result = original(**kwargs)
        artifacts = pathlib.Path(kwargs["private_data_dir"]) / "artifacts" / kwargs.get("ident", "")
        command = json.loads((artifacts / "command").read_text())["command"]
        assert command[0] == "ansible-playbook" and command[-1] == kwargs.get("playbook"), command
        # Warnings reach the runner as "verbose" events (the stdout artifact may not hold them).
        warnings = _warnings("\n".join(e.get("stdout") or "" for e in result.events))
        assert not warnings, "ansible-core %s warned in %s:\n%s" % (
            _expected_core(), kwargs.get("playbook"), "\n".join(warnings))
        _RUNS.append(kwargs.get("playbook", "?"))
        return result

    ansible_runner.run = run
    try:
        yield
    finally:
        ansible_runner.run = original


def _runs_playbook_tests(session):
    """True when this session ran the playbook tests (tests/integration); unit tests import the helpers too."""
    return any("tests/integration/" in item.nodeid or item.nodeid.startswith("integration/")
               for item in getattr(session, "items", []))


def pytest_sessionfinish(session, exitstatus):
    if _runs_playbook_tests(session) and session.testscollected and not _RUNS and exitstatus == 0:
        session.exitstatus = 1
        sys.stderr.write("controller matrix: the playbook tests passed without running a playbook through %s\n"
                         % (MATRIX_BIN / "ansible-playbook"))
