"""The node journal (module_utils/redeploy/journal.py) on real files under tmp_path."""
from __future__ import annotations

import json
import os
import stat
import time

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import journal

T0 = 1_800_000_000.0


@pytest.fixture
def jp(tmp_path):
    return str(tmp_path / "journal.json")


def on_disk(path):
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def test_path_for():
    assert journal.path_for("/var/lib/sglang") == os.path.join("/var/lib/sglang", journal.NAME)


def test_record_writes_entry_with_mode_0640(jp):
    entry = journal.record(jp, "run-1", journal.PLANNED, now=T0, detail="restart: config changed",
                           plan={"action": "restart"}, intended={"fingerprint": "sha256:aa"})
    assert on_disk(jp) == entry
    assert stat.S_IMODE(os.stat(jp).st_mode) == 0o640
    assert entry["run_id"] == "run-1" and entry["step"] == journal.PLANNED
    assert entry["at"] == T0 and entry["run_started_at"] == T0
    assert entry["format"] == journal.FORMAT
    assert entry["plan"] == {"action": "restart"} and entry["intended"] == {"fingerprint": "sha256:aa"}
    assert entry["previous_run"] is None
    assert entry["history"] == [{"run_id": "run-1", "step": journal.PLANNED, "at": T0, "detail": "restart: config changed"}]


def test_record_makes_missing_directory(tmp_path):
    path = str(tmp_path / "state" / "sub" / "journal.json")
    entry = journal.record(path, "run-1", journal.PLANNED, now=T0)
    assert on_disk(path) == entry
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) & 0o7777 == 0o750 & ~_umask()


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_record_replaces_the_file_atomically(jp, tmp_path):
    journal.record(jp, "run-1", journal.PLANNED, now=T0)
    first_inode = os.stat(jp).st_ino
    journal.record(jp, "run-1", journal.TEARDOWN, now=T0 + 1)
    # A new file renamed into place (a reader never sees a half-written journal), no temporary left.
    assert os.stat(jp).st_ino != first_inode
    assert os.listdir(str(tmp_path)) == ["journal.json"]
    assert stat.S_IMODE(os.stat(jp).st_mode) == 0o640


def test_record_failure_keeps_previous_entry(jp, tmp_path):
    before = journal.record(jp, "run-1", journal.LAUNCHING, now=T0, candidate={"pid": 10})
    with pytest.raises(TypeError):
        journal.record(jp, "run-1", journal.LAUNCHED, now=T0 + 1, candidate=object())
    assert on_disk(jp) == before
    assert os.listdir(str(tmp_path)) == ["journal.json"]


def test_record_merges_fields_within_a_run_and_none_removes(jp):
    journal.record(jp, "run-1", journal.PLANNED, now=T0, plan={"action": "restart"}, old={"pid": 5})
    journal.record(jp, "run-1", journal.LAUNCHING, now=T0 + 5, candidate={"pid": 42, "fingerprint": "fp-c"})
    entry = journal.record(jp, "run-1", journal.LAUNCHED, now=T0 + 9, old=None)
    assert entry["plan"] == {"action": "restart"}
    assert entry["candidate"] == {"pid": 42, "fingerprint": "fp-c"}
    assert "old" not in entry and "old" not in on_disk(jp)
    assert entry["step"] == journal.LAUNCHED and entry["at"] == T0 + 9
    assert entry["run_started_at"] == T0                    # the run's start is kept
    assert [h["step"] for h in entry["history"]] == [journal.PLANNED, journal.LAUNCHING, journal.LAUNCHED]


def test_none_for_a_missing_field_is_harmless(jp):
    entry = journal.record(jp, "run-1", journal.PLANNED, now=T0, candidate=None)
    assert "candidate" not in entry


def test_new_run_resets_per_run_fields_and_keeps_previous_run(jp):
    journal.record(jp, "run-1", journal.LAUNCHING, now=T0, candidate={"pid": 42}, detail="waiting for health")
    entry = journal.record(jp, "run-2", journal.PLANNED, now=T0 + 100)
    assert entry["previous_run"] == {"run_id": "run-1", "step": journal.LAUNCHING, "at": T0}
    assert "candidate" not in entry and "detail" not in entry
    assert entry["run_id"] == "run-2" and entry["run_started_at"] == T0 + 100
    # The history runs across runs.
    assert [(h["run_id"], h["step"]) for h in entry["history"]] == [("run-1", journal.LAUNCHING), ("run-2", journal.PLANNED)]
    assert entry["history"][0]["detail"] == "waiting for health"
    assert entry["history"][1]["detail"] is None
    # A third run names the second one, not the first.
    third = journal.record(jp, "run-3", journal.PLANNED, now=T0 + 200)
    assert third["previous_run"]["run_id"] == "run-2"


def test_history_is_bounded_newest_last(jp):
    total = journal.HISTORY_MAX + 7
    for i in range(total):
        entry = journal.record(jp, "run-%d" % (i // 3), journal.STEPS[i % len(journal.STEPS)], now=T0 + i, detail="n%d" % i)
    assert len(entry["history"]) == journal.HISTORY_MAX
    assert [h["detail"] for h in entry["history"]] == ["n%d" % i for i in range(total - journal.HISTORY_MAX, total)]
    assert len(on_disk(jp)["history"]) == journal.HISTORY_MAX


@pytest.mark.parametrize("step", ["done", "", None, "PLANNED", "launch"])
def test_unknown_step_raises_and_writes_nothing(jp, step):
    with pytest.raises(ValueError) as info:
        journal.record(jp, "run-1", step, now=T0)
    assert repr(step) in str(info.value)
    assert journal.PLANNED in str(info.value)
    assert not os.path.exists(jp)


def test_every_listed_step_is_accepted(jp):
    for i, step in enumerate(journal.STEPS):
        assert journal.record(jp, "run-1", step, now=T0 + i)["step"] == step
    assert journal.SETTLED <= set(journal.STEPS) and journal.PAST_TEARDOWN <= set(journal.STEPS)


def test_record_rounds_time(jp):
    entry = journal.record(jp, "run-1", journal.PLANNED, now=T0 + 0.123456)
    assert entry["at"] == round(T0 + 0.123456, 3)


def test_record_uses_wall_clock_by_default(jp):
    before = time.time()
    entry = journal.record(jp, "run-1", journal.PLANNED)
    assert before - 0.01 <= entry["at"] <= time.time() + 0.01


# ---------------------------------------------------------------------------
# read
# ---------------------------------------------------------------------------

def test_read_missing_is_empty(jp):
    assert journal.read(jp) == {}


def test_read_round_trip(jp):
    written = journal.record(jp, "run-1", journal.VERIFYING, now=T0, candidate={"pid": 3})
    assert journal.read(jp) == written


@pytest.mark.parametrize("text", ["{not json", "", '{"run_id": "r", ', "\x00\x01"])
def test_read_corrupt_json(jp, text):
    with open(jp, "w", encoding="utf-8") as fh:
        fh.write(text)
    entry = journal.read(jp)
    assert set(entry) == {"corrupt"}
    assert jp in entry["corrupt"] and "JSON" in entry["corrupt"]


@pytest.mark.parametrize("value", [[1, 2], "text", 3, None, True])
def test_read_non_object(jp, value):
    with open(jp, "w", encoding="utf-8") as fh:
        json.dump(value, fh)
    entry = journal.read(jp)
    assert set(entry) == {"corrupt"} and jp in entry["corrupt"]


def test_read_unreadable_path(tmp_path):
    path = tmp_path / "journal.json"
    path.mkdir()            # a directory where the file should be
    entry = journal.read(str(path))
    assert set(entry) == {"corrupt"} and "cannot read" in entry["corrupt"]


def test_record_over_a_corrupt_journal_writes_a_valid_one(jp):
    with open(jp, "w", encoding="utf-8") as fh:
        fh.write("garbage")
    entry = journal.record(jp, "run-1", journal.PLANNED, now=T0)
    assert on_disk(jp) == entry and entry["run_id"] == "run-1"
    assert "corrupt" not in entry


# ---------------------------------------------------------------------------
# unfinished / describe
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("step", journal.STEPS)
def test_unfinished_by_step(step):
    assert journal.unfinished({"run_id": "r", "step": step}) is (step not in journal.SETTLED)


def test_unfinished_without_run():
    assert journal.unfinished({}) is False
    assert journal.unfinished({"corrupt": "x"}) is False
    assert journal.unfinished({"run_id": "", "step": journal.LAUNCHING}) is False


def test_unfinished_after_record(jp):
    assert journal.unfinished(journal.record(jp, "r", journal.TORN_DOWN, now=T0))
    assert not journal.unfinished(journal.record(jp, "r", journal.PROMOTED, now=T0 + 1))


@pytest.fixture
def frozen(monkeypatch):
    monkeypatch.setattr(journal.time, "time", lambda: T0)
    return T0


def test_describe(frozen):
    assert "no journal" in journal.describe({})
    text = journal.describe({"corrupt": "/x/journal.json is not valid JSON"})
    assert "unreadable" in text and "/x/journal.json" in text
    line = journal.describe({"run_id": "run-9", "step": journal.LAUNCHING, "at": frozen - 120, "detail": "PID 77"})
    assert "run-9" in line and journal.LAUNCHING in line and "PID 77" in line
    assert " 120 s ago" in line
    assert "(" not in journal.describe({"run_id": "run-9", "step": journal.PLANNED, "at": frozen})


def test_describe_future_time_is_not_negative(frozen):
    line = journal.describe({"run_id": "r", "step": journal.PLANNED, "at": frozen + 3600})
    assert " 0 s ago" in line


# ===========================================================================
# BUGS FOUND (tests below fail until the lead's fix; see H6's report)
# ===========================================================================

def test_record_over_a_corrupt_journal_says_it_replaced_one(jp):
    # record() sets entry = {"replaced_corrupt": ...} for a corrupt journal, but the new-run reset
    # right after it drops that marker, so the node's record never says its journal was corrupt.
    with open(jp, "w", encoding="utf-8") as fh:
        fh.write("garbage")
    entry = journal.record(jp, "run-1", journal.PLANNED, now=T0)
    assert "replaced_corrupt" in entry and jp in entry["replaced_corrupt"]
    assert on_disk(jp)["replaced_corrupt"] == entry["replaced_corrupt"]
