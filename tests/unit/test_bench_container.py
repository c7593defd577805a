"""The container part's own logic (bench/container.py): which round counts, the medians and ratios over the rounds
that count, and what the report says when the part was skipped or failed. The measurement itself needs root and
podman (``bench/run.py --only container``)."""
from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))

import container  # noqa: E402


class FakeRun(object):
    def __init__(self, rc=0, wall=10.0):
        self.rc = rc
        self.wall = wall


def replaced(teardown=0.3, healthy=2.0, stopped="abc123"):
    out = {"failed": False, "timings": {"teardown_s": teardown, "candidate_healthy_s": healthy}}
    if stopped:
        out["container_stopped"] = {"id": stopped, "name": "sglang-benchbox"}
    return out


def test_a_container_round_counts_when_the_run_succeeded_the_port_was_seen_down_and_the_old_box_was_stopped():
    out = container.figures("container", FakeRun(), 12, 1.3, replaced(), 3.2)
    assert out["ok"] is True
    assert (out["outage_s"], out["preflight_s"], out["teardown_s"], out["candidate_healthy_s"], out["wall"]) == \
        (1.3, 3.2, 0.3, 2.0, 10.0)
    assert out["container_stopped"] == "abc123"


def test_a_round_does_not_count_without_an_outage_seen_a_failed_run_or_the_replace_timings():
    assert container.figures("host", FakeRun(), 0, 0.0, replaced(stopped=None), 3.0)["ok"] is False
    assert container.figures("host", FakeRun(rc=2), 5, 0.6, replaced(stopped=None), 3.0)["ok"] is False
    assert container.figures("host", FakeRun(), 5, 0.6, None, 3.0)["ok"] is False
    assert container.figures("host", FakeRun(), 5, 0.6, dict(replaced(stopped=None), failed=True), 3.0)["ok"] is False
    assert container.figures("host", FakeRun(), 5, 0.6, replaced(stopped=None), 3.0)["ok"] is True


def test_a_container_round_without_the_old_container_stopped_through_podman_does_not_count():
    assert container.figures("container", FakeRun(), 5, 0.6, replaced(stopped=None), 3.0)["ok"] is False


def test_the_summary_takes_medians_of_the_rounds_that_count_and_the_ratios_container_over_host():
    ok = [container.figures("container", FakeRun(wall=w), 9, o, replaced(), 3.0) for w, o in ((12.0, 1.2), (14.0, 1.6))]
    bad = container.figures("container", FakeRun(rc=2, wall=99.0), 9, 50.0, replaced(), 3.0)
    host = [container.figures("host", FakeRun(wall=w), 7, o, replaced(stopped=None), 2.0) for w, o in ((10.0, 0.8), (10.0, 0.8))]
    s = container.summarise({"container": ok + [bad], "host": host})
    assert s["failures"] == 1
    assert s["container_outage_s"] == 1.4 and s["container_wall"] == 13.0
    assert abs(s["outage_ratio"] - 1.4 / 0.8) < 1e-9 and abs(s["wall_ratio"] - 1.3) < 1e-9
    assert abs(s["preflight_ratio"] - 1.5) < 1e-9
    text = container.report({"config": {"rounds": 2, "rate": 10.0, "change": "x", "gpus": "2,5", "image": "img"},
                             "summary": s})
    assert "container / host: outage 1.75, whole run 1.30" in text and "1 round(s) did not count" in text


def test_no_ratio_without_a_host_round_that_counts():
    s = container.summarise({"container": [container.figures("container", FakeRun(), 9, 1.0, replaced(), 3.0)], "host": []})
    assert s["outage_ratio"] is None and s["wall_ratio"] is None and s["host_outage_s"] is None


def test_skipped_and_failed_parts_say_so():
    assert container.report({"skipped": "needs root"}) == "Container: skipped (needs root)"
    assert container.report({"error": "boom", "summary": {}}).startswith("Container: FAILED (boom")


def test_without_root_or_podman_the_part_is_skipped_with_the_reason_not_failed(monkeypatch, tmp_path):
    monkeypatch.setattr(container.os, "geteuid", lambda: 1000)
    result = container.run(None, str(tmp_path))
    assert result == {"skipped": container.missing()} and "needs root" in result["skipped"] and "1000" in result["skipped"]
    monkeypatch.setattr(container.os, "geteuid", lambda: 0)
    monkeypatch.setattr(container.shutil, "which", lambda name: None)
    assert "podman is not installed" in container.run(None, str(tmp_path))["skipped"]
    assert list(tmp_path.iterdir()) == []                      # nothing was set up
