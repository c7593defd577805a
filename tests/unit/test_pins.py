"""The lock files (scripts/pins.py): every venv the project builds installs exactly what CI tested."""
from __future__ import annotations

import importlib.util
import os
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
REQ = REPO / "requirements"

_spec = importlib.util.spec_from_file_location("gpufleet_pins", REPO / "scripts" / "pins.py")
pins = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pins)

# The controller matrix legs (scripts/matrix-controller.sh): one requirements/core-VERSION.txt and .lock each.
CORE_LOCKS = sorted(p.name for p in REQ.glob("core-*.lock"))
# top-level requirements -> the lock that pins their closure
LOCKS = {"dev.txt": "dev.lock"}
LOCKS.update({lock[:-len(".lock")] + ".txt": lock for lock in CORE_LOCKS})
LOCKS.update({"real-server.txt": "real-server.lock", "real-server-nodeps.txt": "real-server.lock"})
# Files that are their own closure (every line an exact pin, checked after the install).
SELF_LOCKED = ("smg.txt", "differential.txt")


def _pins(name):
    return pins.parse((REQ / name).read_text().splitlines())


@pytest.mark.parametrize("top,lock", sorted(LOCKS.items()))
def test_every_top_level_pin_is_in_its_lock_at_the_same_version(top, lock):
    locked = _pins(lock)
    for name, version in _pins(top).items():
        assert locked.get(name) == version, "%s pins %s==%s, %s has %s" % (top, name, version, lock, locked.get(name))


def test_every_matrix_leg_has_its_lock():
    legs = sorted(p.name for p in REQ.glob("core-*.txt"))
    assert [t[:-len(".txt")] for t in legs] == [lock[:-len(".lock")] for lock in CORE_LOCKS]
    assert {"core-2.17.lock", "core-2.20.lock", "core-2.21.lock"} <= set(CORE_LOCKS), CORE_LOCKS


def test_the_matrix_locks_hold_the_test_tools_of_dev_txt():
    dev = _pins("dev.txt")
    for lock in CORE_LOCKS:
        locked = _pins(lock)
        for tool in ("pytest", "pytest-xdist", "pyyaml", "jinja2", "ansible-runner"):
            assert locked[tool] == dev[tool], (lock, tool)


def test_cryptography_is_pinned_below_the_release_that_warns_on_every_ansible_command():
    # cryptography 51.0.1 makes ansible-core 2.19's ssh-agent module print a CryptographyDeprecationWarning
    # (DSA) on stderr of every ansible command; the fresh machine of issue 28 got it through an unpinned
    # transitive dependency.
    for lock in ["dev.lock"] + CORE_LOCKS:
        assert _pins(lock)["cryptography"] == "50.0.2", lock


@pytest.mark.parametrize("name", SELF_LOCKED)
def test_self_locked_files_are_exact_pins(name):
    assert _pins(name)


def test_the_venv_of_this_run_matches_its_lock_exactly():
    """The venv these tests run in is what its lock says: no package the lock does not name, none at another
    version. The unit stage runs in .venv (requirements/dev.lock); a controller matrix leg
    (scripts/matrix-controller.sh sets GPUFLEET_MATRIX_CORE) in its own venv (requirements/core-VERSION.lock)."""
    core = os.environ.get("GPUFLEET_MATRIX_CORE")
    venv, lock = (pathlib.Path(sys.prefix), "core-%s.lock" % core) if core else (REPO / ".venv", "dev.lock")
    if pathlib.Path(sys.prefix).resolve() != venv.resolve():
        pytest.fail("the unit stage runs in .venv (make test); this runs in %s" % sys.prefix)
    problems = pins.differences(pins.frozen(venv), _pins(lock))
    assert not problems, problems


def test_differences_names_extra_missing_and_other_versions():
    installed = {"a": "1.0", "b": "2.0", "torch": "2.13.0+cpu", "pip": "25.0"}
    locked = {"a": "1.0", "b": "2.1", "c": "3.0", "torch": "2.13.0"}
    problems = pins.differences(installed, locked)
    assert any(p.startswith("b: installed 2.0, the lock pins 2.1") for p in problems), problems
    assert any(p.startswith("c==3.0 is in the lock but not installed") for p in problems), problems
    assert not any(p.startswith("a") or "torch" in p or "pip" in p for p in problems), problems
    assert pins.differences({"d": "1"}, {}) == [
        "d==1 is installed but not in the lock (a new transitive dependency? pin it deliberately)"]
    # --subset: what is installed must be locked; what is locked need not be installed.
    subset = pins.differences(installed, locked, subset=True)
    assert any(p.startswith("b: installed 2.0") for p in subset) and not any(p.startswith("c==") for p in subset)
    assert pins.differences({"d": "1"}, {}, subset=True) != []


def test_parse_refuses_a_range():
    with pytest.raises(SystemExit, match="not an exact pin"):
        pins.parse(["cryptography>=50"])
    assert pins.parse(["# c", "-c x.lock", "PyYAML==6.0.4  # why", "molecule-plugins[podman]==26.10.12"]) == {
        "pyyaml": "6.0.4", "molecule-plugins": "26.10.12"}


def test_setup_scripts_install_with_the_locks():
    assert '-c "$LOCK"' in (REPO / "scripts" / "setup-venv.sh").read_text()
    assert "pins.py check" in (REPO / "scripts" / "setup-venv.sh").read_text()
    assert '-c "$LOCK"' in (REPO / "scripts" / "matrix-controller.sh").read_text()
    assert "-c requirements/dev.lock" in (REPO / "scripts" / "sanity.sh").read_text()
