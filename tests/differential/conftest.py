"""Fixtures of the differential stage: each release is resolved once per session, and the
table of agreement per release is printed at the end (and written to tests/output/)."""
from __future__ import annotations

import pathlib
import sys
import tempfile
import time

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import driver  # noqa: E402 - after sys.path is set

_RESULTS = {}
_TIMES = {}


@pytest.fixture(scope="session")
def differential_results():
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="sglang-differential-"))

    def get(version):
        if version not in _RESULTS:
            started = time.monotonic()
            _RESULTS[version] = driver.run_version(version, workdir=workdir / version)
            _TIMES[version] = time.monotonic() - started
        return _RESULTS[version]

    return get


def pytest_terminal_summary(terminalreporter):
    if not _RESULTS:
        return
    summaries = [driver.summary(_RESULTS[v]) for v in driver.VERSIONS if v in _RESULTS]
    text = driver.table(summaries)
    lines = ["", "SGLang differential test: the mirror against the real releases", text]
    for version in driver.VERSIONS:
        if version in _RESULTS:
            timing = _RESULTS[version]["timings"]
            lines.append("%s: %.0f s (import %s s per GPU batch)" % (
                version, _TIMES[version], ", ".join(str(t["import_s"]) for t in timing.values())))
    for version in driver.VERSIONS:
        for row in (_RESULTS.get(version) or {"rows": []})["rows"]:
            if row["diff"] is not None:
                lines.append("  %s %s %s: %s" % (version, row["case"]["id"], "known" if row["known"] else "UNLISTED",
                                                 row["known"] or row["diff"]))
    for line in lines:
        terminalreporter.write_line(line)
    out = HERE.parents[1] / "tests" / "output"
    out.mkdir(parents=True, exist_ok=True)
    (out / "differential-table.txt").write_text("\n".join(lines) + "\n")
