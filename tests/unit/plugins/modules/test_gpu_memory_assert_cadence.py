"""The memory assert (module_utils/gpu/verify.py) polls on a fixed cadence: a poll's own duration comes off the wait.

A fake clock advances only through the engine's sleeps and the simulated
duration of each poll, so the schedule is exact. The engine is the one
gpu_memory_assert and sglang_replace run.
"""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import query as gpu_query
from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import target as gpu_target
from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import verify as gpu_verify


def _gpu(used, mig="Disabled"):
    return {"index": 0, "uuid": "GPU-0", "name": "NVIDIA H200", "bus_id": "00000000:18:00.0", "used_mib": used,
            "reserved_mib": 614, "total_mib": 143771, "free_mib": 143771 - 614 - used, "processes": [],
            "unknown_fields": {}, "mig_mode": mig, "lost": False, "lost_reason": None}


class FakeTarget:
    def __init__(self, clock, poll_s, free_after, mig=False, busy_mib=5000):
        self.clock = clock
        self.poll_s = poll_s
        self.free_after = free_after
        self.mig = mig
        self.busy_mib = busy_mib
        self.starts = []
        self.device_patterns = ["/dev/nvidia*"]

    def snapshot(self):
        self.starts.append(round(self.clock.now - 100.0, 6))
        self.clock.now += self.poll_s
        idle = 57 if self.mig else 0
        used = idle if len(self.starts) >= self.free_after else self.busy_mib
        snap = gpu_query.empty_snapshot("nvidia-smi")
        snap["gpus"] = [_gpu(used, "Enabled" if self.mig else "Disabled")]
        return snap

    def close(self):
        pass


class Clock:
    def __init__(self):
        self.now = 100.0
        self.sleeps = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(round(seconds, 6))
        self.now += seconds


def run_schedule(monkeypatch, poll_s, free_after, **params):
    clock = Clock()
    target = FakeTarget(clock, poll_s, free_after, mig=params.pop("mig", False))
    monkeypatch.setattr(gpu_target, "setup", lambda *a, **kw: target)
    try:
        res = gpu_verify.run_assert(params, runner=None, clock=clock, sleep=clock.sleep)
        res["failed"] = False
    except gpu_verify.VerifyError as exc:
        res = dict(exc.result, failed=True, msg=exc.msg)
    return res, target.starts, clock.sleeps


def test_polls_start_every_sleep_seconds_whatever_a_poll_takes(monkeypatch):
    res, starts, sleeps = run_schedule(monkeypatch, poll_s=0.2, free_after=4, sleep=0.5, timeout=10)
    assert not res["failed"] and res["polls"] == 4
    assert starts == [0.0, 0.5, 1.0, 1.5]
    assert sleeps == [0.3, 0.3, 0.3]


def test_a_poll_longer_than_sleep_is_followed_at_once(monkeypatch):
    res, starts, sleeps = run_schedule(monkeypatch, poll_s=0.7, free_after=3, sleep=0.5, timeout=10)
    assert starts == [0.0, 0.7, 1.4] and sleeps == []


def test_the_last_poll_is_at_the_deadline_and_the_timeout_fails(monkeypatch):
    res, starts, dummy = run_schedule(monkeypatch, poll_s=0.2, free_after=99, sleep=0.5, timeout=1.3)
    assert res["failed"] and res["msg"].startswith("GPU 0: 5000 MiB held by no process after 1.3 s")
    assert starts == [0.0, 0.5, 1.0, 1.3]
    # A poll that ends at the deadline is the last one.
    res, starts, dummy = run_schedule(monkeypatch, poll_s=0.2, free_after=99, sleep=0.5, timeout=1.2)
    assert res["failed"] and starts == [0.0, 0.5, 1.0]


def test_sleep_zero_still_checks_once_and_delay_counts_against_the_timeout(monkeypatch):
    res, starts, sleeps = run_schedule(monkeypatch, poll_s=0.1, free_after=99, sleep=0.0, timeout=5)
    assert res["failed"] and starts == [0.0] and sleeps == []
    res, starts, sleeps = run_schedule(monkeypatch, poll_s=0.1, free_after=99, sleep=1, timeout=2, delay=1.5)
    assert starts == [1.5, 2.0] and sleeps[0] == 1.5   # the delay, a poll, and the last one at the deadline (2 s)


def test_an_idle_mig_gpu_is_free_at_its_own_baseline(monkeypatch):
    res, dummy, dummy2 = run_schedule(monkeypatch, poll_s=0.1, free_after=1, sleep=0.5, timeout=0, mig=True)
    assert not res["failed"] and res["gpus"][0]["used_mib"] == 57 and res["gpus"][0]["mig_mode"] == "Enabled"
    res, dummy, dummy2 = run_schedule(monkeypatch, poll_s=0.1, free_after=1, sleep=0.5, timeout=0, mig=True,
                                      mig_max_used_mib=16)
    assert res["failed"] and "(MIG mode: idle up to 16 MiB)" in res["msg"]


@pytest.mark.parametrize("params, words", [
    ({"timeout": -1}, "timeout must be >= 0"),
    ({"mig_max_used_mib": -1}, "mig_max_used_mib must be >= 0"),
])
def test_option_errors_before_any_poll(monkeypatch, params, words):
    res, starts, dummy = run_schedule(monkeypatch, poll_s=0.1, free_after=1, **params)
    assert res["failed"] and words in res["msg"] and starts == []
