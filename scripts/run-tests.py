#!/usr/bin/env python
"""Run the test stages of `make test` and summarise them.

Each stage writes its full output to tests/output/<stage>.log and prints one
summary line. pytest stages count their test cases (from JUnit XML); the other
stages (lint, sanity, molecule scenarios, ...) count as one check each, or as
the number of checks they report. The last line is the plain
``N passed, M failed`` that CI reads.

Usage: scripts/run-tests.py [STAGE ...]   (default: every stage)
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET

REPO = pathlib.Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "output"
VENV_BIN = REPO / ".venv" / "bin"


def _env() -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '')}"
    env["ANSIBLE_COLLECTIONS_PATH"] = str(REPO / ".collections")
    env["ANSIBLE_CONFIG"] = str(REPO / "ansible.cfg")
    env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    return env


def _workers() -> str:
    """pytest-xdist workers: GPUFLEET_TEST_WORKERS, else one per CPU (2 to 4).

    The suites mostly wait on processes they started (simulated servers,
    ansible-playbook), so two workers pay off even on a 2-core machine; every
    test uses its own ports, GPUSIM_ROOT, lock and report directories.
    """
    return os.environ.get("GPUFLEET_TEST_WORKERS") or str(min(4, max(2, os.cpu_count() or 1)))


def _pytest(name: str, args: list[str], parallel: bool = False) -> list[str]:
    # --dist loadfile: a file's tests run in order on one worker (module-scoped
    # fixtures such as a simulated node carry state from one test to the next).
    workers = _workers()
    xdist = ["-n", workers, "--dist", "loadfile"] if parallel and workers not in ("0", "1") else []
    return [str(VENV_BIN / "python"), "-m", "pytest", f"--junitxml={OUT / (name + '.xml')}", *xdist, *args]


CONTAINER_TESTS = ("tests/integration/test_containers.py", "tests/integration/test_sim_containers.py",
                   "tests/integration/test_images.py", "tests/integration/test_container_manager.py")

# name -> (argv, kind). kind "pytest" counts JUnit cases; "check" counts 1.
STAGES: dict[str, tuple[list[str], str]] = {
    "unit": (_pytest("unit", [
        "tests/unit",
        "--cov=ansible_collections.gpufleet.sglang.plugins",
        "--cov-report=term-missing:skip-covered",
        "--cov-fail-under=85",
    ], parallel=True), "pytest"),
    "integration": (_pytest("integration", ["tests/integration"] + ["--ignore=" + f for f in CONTAINER_TESTS], parallel=True),
                    "pytest"),
    # Real podman and a real Docker engine on the simulated node (issue 24): adopted containers, the simulator's
    # PID namespaces and CDI devices, images (inspect, pull, the oracle inside), and the docker/podman managers
    # through redeploy.yml. After the "image" stage, whose node image they run.
    "containers": (_pytest("containers", list(CONTAINER_TESTS), parallel=True), "pytest"),
    # The mirror against the real SGLang wheels (tests/differential; builds .cache/differential/ once).
    "differential": (_pytest("differential", ["tests/differential", "-p", "no:randomly"]), "pytest"),
    # The real SGLang 0.5.23 server on this CPU (tests/real_server; builds .cache/real-server/ once): the stand-ins,
    # real servers holding the simulated GPUs, and the conformance of the simulator with the real server.
    "real-server": (_pytest("real-server", ["tests/real_server", "-p", "no:randomly"]), "pytest"),
    "gpu-kit": (_pytest("gpu-kit", ["tests/gpu", "-m", "gpu or not gpu"]), "pytest"),
    "lint": ([str(VENV_BIN / "ansible-lint"), "--profile", "production"], "check"),
    "sanity": (["bash", "scripts/sanity.sh"], "check"),
    # Its own step, so that its time and any debootstrap/podman failure show apart from the scenarios.
    "image": (["bash", "scripts/build-image.sh"], "check"),
    # Support matrix (docs/development.md "Support matrix"): the node images of the other suites,
    # built beside lint/sanity like "image" and waited for before the first scenario.
    "image-bullseye": (["bash", "scripts/build-image.sh", "--suite", "bullseye"], "check"),
    "image-trixie": (["bash", "scripts/build-image.sh", "--suite", "trixie"], "check"),
    "molecule-default": (["bash", "scripts/run-molecule.sh", "default"], "check"),
    "molecule-faults": (["bash", "scripts/run-molecule.sh", "faults"], "check"),
    "molecule-multinode": (["bash", "scripts/run-molecule.sh", "multinode"], "check"),
    "molecule-containerised": (["bash", "scripts/run-molecule.sh", "containerised"], "check"),
    # Node matrix: the default scenario on Debian 11 (Python 3.9) and 13 (Python 3.13) hosts.
    "molecule-bullseye": (["bash", "scripts/matrix-node.sh", "bullseye"], "check"),
    "molecule-trixie": (["bash", "scripts/matrix-node.sh", "trixie"], "check"),
    # Controller matrix: ansible-core 2.17 and 2.18 (2.19 is .venv: the stages above).
    "core-2.17-unit": (["bash", "scripts/matrix-controller.sh", "2.17", "unit"], "pytest"),
    "core-2.18-unit": (["bash", "scripts/matrix-controller.sh", "2.18", "unit"], "pytest"),
    # ansible-core 2.20 and 2.21 need Python 3.12+: each leg runs in a container of its Debian 13 image, which the
    # -image stage builds beside lint (scripts/matrix-controller.sh; docs/development.md "Support matrix").
    "core-2.20-image": (["bash", "scripts/matrix-controller.sh", "2.20", "venv"], "check"),
    "core-2.21-image": (["bash", "scripts/matrix-controller.sh", "2.21", "venv"], "check"),
    "core-2.20-unit": (["bash", "scripts/matrix-controller.sh", "2.20", "unit"], "pytest"),
    "core-2.21-unit": (["bash", "scripts/matrix-controller.sh", "2.21", "unit"], "pytest"),
    "core-2.17-sanity": (["bash", "scripts/matrix-controller.sh", "2.17", "sanity"], "check"),
    "core-2.18-sanity": (["bash", "scripts/matrix-controller.sh", "2.18", "sanity"], "check"),
    "core-2.20-sanity": (["bash", "scripts/matrix-controller.sh", "2.20", "sanity"], "check"),
    "core-2.21-sanity": (["bash", "scripts/matrix-controller.sh", "2.21", "sanity"], "check"),
    # The execution environment (ansible-builder on a local base), built beside the two sanity legs.
    "ee-build": (["bash", "scripts/matrix-ee.sh"], "check"),
    "core-2.17-redeploy": (["bash", "scripts/matrix-controller.sh", "2.17", "redeploy"], "pytest"),
    "core-2.18-redeploy": (["bash", "scripts/matrix-controller.sh", "2.18", "redeploy"], "pytest"),
    "core-2.20-redeploy": (["bash", "scripts/matrix-controller.sh", "2.20", "redeploy"], "pytest"),
    "core-2.21-redeploy": (["bash", "scripts/matrix-controller.sh", "2.21", "redeploy"], "pytest"),
    # The tarball as a user installs it (clean venv with only ansible-core), and a redeploy inside the EE.
    "user-install": (_pytest("user-install", ["tests/matrix/test_user_install.py"]), "pytest"),
    "ee": (_pytest("ee", ["tests/matrix/test_execution_environment.py"]), "pytest"),
}


def _count_junit(path: pathlib.Path) -> tuple[int, int, int]:
    """Return (passed, failed, skipped) from a JUnit XML file."""
    if not path.exists():
        return 0, 0, 0
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    total = failed = skipped = 0
    for suite in suites:
        total += int(suite.get("tests", 0))
        failed += int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        skipped += int(suite.get("skipped", 0))
    return total - failed - skipped, failed, skipped


# A stage started early, in the background, next to another one of its lane: the image builds
# (debootstrap and podman: mostly disk and network) beside each other, the EE build beside the first
# scenario. It is still reported, and waited for, at its own place in its lane.
EARLY = {"image-bullseye": "image", "image-trixie": "image", "core-2.20-image": "image", "core-2.21-image": "image",
         # ansible-builder (podman build: apt and pip downloads) beside the first scenario.
         "ee-build": "molecule-default"}


class Started:
    """A stage process running with its output in tests/output/<name>.log."""

    def __init__(self, name: str):
        argv, _kind = STAGES[name]
        OUT.mkdir(parents=True, exist_ok=True)
        self.log = OUT / f"{name}.log"
        junit = OUT / f"{name}.xml"
        if junit.exists():
            junit.unlink()
        self.start = time.monotonic()
        self.end = None
        self._fh = self.log.open("w")
        self.proc = subprocess.Popen(argv, cwd=REPO, env=_env(), stdout=self._fh, stderr=subprocess.STDOUT)
        self.cpu = None
        # Stamp the end when it happens: a background stage is waited for later.
        self._reaper = threading.Thread(target=self._reap, daemon=True)
        self._reaper.start()

    def _reap(self) -> None:
        # wait4: the stage's own CPU time (its process and every descendant it waited for), apart from the
        # stages that run beside it.
        _pid, status, usage = os.wait4(self.proc.pid, 0)
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        self.cpu = usage.ru_utime + usage.ru_stime
        self.end = time.monotonic()

    def wait(self) -> tuple[int, float]:
        """The exit status and the stage's own duration (start to exit)."""
        self._reaper.join()
        self._fh.close()
        return self.proc.returncode, self.end - self.start


PRINT = threading.Lock()


def run_stage(name: str, started: Started | None = None) -> tuple[int, int, int]:
    kind = STAGES[name][1]
    started = started or Started(name)
    log = started.log
    junit = OUT / f"{name}.xml"
    returncode, elapsed = started.wait()
    if kind == "pytest":
        passed, failed, skipped = _count_junit(junit)
        if returncode not in (0, 5) and failed == 0:
            failed = 1  # the run failed outside any test (collection error, coverage floor)
    else:
        passed, failed, skipped = (1, 0, 0) if returncode == 0 else (0, 1, 0)
    status = "ok" if failed == 0 and returncode in (0, 5) else "FAILED"
    extra = f", {skipped} skipped" if skipped else ""
    with PRINT:
        print(f"[{status:>6}] {name:<20} {passed} passed, {failed} failed{extra} ({elapsed:.1f} s, CPU {started.cpu:.0f} s; "
              f"log {log.relative_to(REPO)})", flush=True)
        if status != "ok":
            tail = log.read_text(errors="replace").splitlines()[-40:]
            print("         last lines of the log:")
            for line in tail:
                print(f"         | {line}")
    return passed, failed, skipped


# The stages run in lanes: each lane runs its stages in order, the lanes run side by side (2 cores: the
# pytest suites, which wait on the processes they start, beside the container and matrix stages, which are
# mostly podman, downloads and ansible-test). A stage waits for the stages named in AFTER, in any lane.
LANES = (
    ("unit", "integration", "differential", "gpu-kit", "user-install"),
    # The real SGLang servers (about 30 s of CPU per start) beside the rest from the first minute: the longest
    # single stage, and mostly waiting on the servers it starts.
    ("real-server",),
    ("lint", "sanity", "core-2.17-unit", "core-2.18-unit", "core-2.17-sanity", "core-2.18-sanity",
     "core-2.17-redeploy", "core-2.18-redeploy"),
    ("image", "image-bullseye", "image-trixie", "core-2.20-image", "core-2.21-image", "containers", "molecule-default",
     "molecule-faults", "molecule-multinode", "molecule-containerised", "molecule-bullseye", "molecule-trixie", "ee-build", "ee",
     "core-2.20-unit", "core-2.21-unit", "core-2.20-sanity", "core-2.21-sanity", "core-2.20-redeploy",
     "core-2.21-redeploy"),
)
# (the image builds of lane 3 are also in EARLY: they start at once, beside each other)
AFTER = {
    # the matrix legs reuse the sanity venv's ansible-test requirements cache and the unit stage's .venv
    "core-2.17-sanity": ("sanity",),
}


class Lanes:
    """Run ``names`` in their lanes, side by side; collect the totals."""

    def __init__(self, names: list[str]):
        self.names = names
        self.done: dict[str, threading.Event] = dict((n, threading.Event()) for n in names)
        self.totals = [0, 0]
        self.lock = threading.Lock()

    def lane(self, stages: list[str]) -> None:
        early: dict[str, Started] = {}
        for i, name in enumerate(stages):
            for dep in AFTER.get(name, ()):
                if dep in self.done:
                    self.done[dep].wait()
            for stage, beside in EARLY.items():
                if beside == name and stage in stages[i + 1:] and stage not in early:
                    early[stage] = Started(stage)
            try:
                p, f, _skipped = run_stage(name, early.pop(name, None))
            finally:
                self.done[name].set()
            with self.lock:
                self.totals[0] += p
                self.totals[1] += f

    def run(self) -> tuple[int, int]:
        placed = set(n for lane in LANES for n in lane)
        lanes = [[n for n in lane if n in self.names] for lane in LANES]
        # A stage in no lane (a new one) runs in the first lane, after the others.
        lanes[0] += [n for n in self.names if n not in placed]
        threads = [threading.Thread(target=self.lane, args=(lane,)) for lane in lanes if lane]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return self.totals[0], self.totals[1]


def main(argv: list[str]) -> int:
    names = argv or list(STAGES)
    unknown = [n for n in names if n not in STAGES]
    if unknown:
        print(f"unknown stage(s) {unknown}; known: {', '.join(STAGES)}", file=sys.stderr)
        return 2
    start = time.monotonic()
    cpu0 = os.times()
    total_p, total_f = Lanes(names).run()
    cpu1 = os.times()
    cpu = (cpu1.children_user + cpu1.children_system) - (cpu0.children_user + cpu0.children_system)
    print(f"all stages took {time.monotonic() - start:.0f} s (CPU {cpu:.0f} s on {os.cpu_count()} cores)")
    print(f"{total_p} passed, {total_f} failed")
    return 1 if total_f else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
