"""gpu_memory_assert polls on a fixed cadence: the poll's own duration comes off the wait.

A fake clock advances only through the module's sleeps and the simulated
duration of each poll, so the schedule is exact.
"""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.sglang.plugins.modules import gpu_memory_assert as gma


class Exit(Exception):
    def __init__(self, result):
        super().__init__(result)
        self.result = result


class FakeModule:
    def __init__(self, **params):
        self.params = dict(gpus=[], state="free", max_used_mib=16, min_used_mib=None, require_no_processes=True,
                           require_processes=False, timeout=10.0, sleep=0.5, delay=0.0, msg=None, backend="auto",
                           nvidia_smi=None, device_paths=["/dev/nvidia*"], command_timeout=60.0)
        self.params.update(params)

    def exit_json(self, **result):
        raise Exit(dict(result, failed=False))

    def fail_json(self, **result):
        raise Exit(dict(result, failed=True))


def run_schedule(poll_s, free_after_polls, **params):
    """Run the loop; every poll takes ``poll_s``; returns (result, poll start times, sleeps)."""
    now = [100.0]
    starts, sleeps = [], []

    def sleep(seconds):
        sleeps.append(round(seconds, 6))
        now[0] += seconds

    checker = gma.Assert(FakeModule(**params), clock=lambda: now[0], sleep=sleep)
    checker.setup = lambda: None

    def poll():
        starts.append(round(now[0] - 100.0, 6))
        now[0] += poll_s
        checker.result["polls"] += 1
        return {"driver": {"ok": True}}

    def evaluate(snap):
        done = checker.result["polls"] >= free_after_polls
        return done, [], []

    checker.poll = poll
    checker.evaluate = evaluate
    with pytest.raises(Exit) as exc:
        checker.run()
    return exc.value.result, starts, sleeps


def test_polls_start_every_sleep_seconds_whatever_a_poll_takes():
    res, starts, sleeps = run_schedule(poll_s=0.2, free_after_polls=4, sleep=0.5)
    assert not res["failed"] and res["polls"] == 4
    assert starts == [0.0, 0.5, 1.0, 1.5]
    assert sleeps == [0.3, 0.3, 0.3]


def test_a_poll_longer_than_sleep_is_followed_at_once():
    res, starts, sleeps = run_schedule(poll_s=0.7, free_after_polls=3, sleep=0.5)
    assert starts == [0.0, 0.7, 1.4] and sleeps == []


def test_the_last_poll_is_at_the_deadline_and_the_timeout_fails():
    res, starts, dummy = run_schedule(poll_s=0.2, free_after_polls=99, sleep=0.5, timeout=1.3)
    assert res["failed"]
    assert starts == [0.0, 0.5, 1.0, 1.3]
    # A poll that ends at the deadline is the last one.
    res, starts, dummy = run_schedule(poll_s=0.2, free_after_polls=99, sleep=0.5, timeout=1.2)
    assert res["failed"] and starts == [0.0, 0.5, 1.0]


def test_sleep_zero_still_checks_once():
    res, starts, sleeps = run_schedule(poll_s=0.1, free_after_polls=99, sleep=0.0, timeout=5)
    assert res["failed"] and starts == [0.0] and sleeps == []
