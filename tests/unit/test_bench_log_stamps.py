"""The bench's outage parser (bench/_common.py: server_events, outage_from_events) on lines recorded from REAL
SGLang 0.5.23 servers (SGLANG_LOG_MS=1) in `bench/run.py --only real-outage`: the old server's log as the role's
launcher appends it (the next server's start banner glued to the old one's last, unterminated line), and a hand
restart's two logs. Only millisecond stamps count: uvicorn's access lines carry whole seconds."""
from __future__ import annotations

import datetime
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))

import _common as c  # noqa: E402

# Recorded from the real servers (bench/results/20261206T215634Z's run), paths shortened.
OURS_LOG = """\
=== gpufleet.sglang: starting real at 2026-12-06T21:56:53+0000: /venv/bin/python -m sglang.launch_server --model-path /m/base ===
[2026-12-06 21:57:21.411] Load weight end. elapsed=0.03 s, type=LlamaForCausalLM, avail mem=20.74 GB, mem usage=0.00 GB.
[2026-12-06 21:57:22] INFO:     127.0.0.1:40444 - "GET /health_generate HTTP/1.1" 503 Service Unavailable
[2026-12-06 21:57:23.171] The server is fired up and ready to roll!
[2026-12-06 21:59:34] INFO:     127.0.0.1:47854 - "GET /health HTTP/1.1" 200 OK
[2026-12-06 21:59:39.198] SIGTERM received. signum=None frame=None. Draining requests and shutting down...
[2026-12-06 21:59:42.819] Gracefully exiting... Remaining number of requests 0. Remaining requests remaining_rids=[].
nanobind: leaked 4 instances!
See https://nanobind.readthedocs.io/en/latest/refleaks.html=== gpufleet.sglang: starting real at 2026-12-06T21:59:44+0000: \
/venv/bin/python -m sglang.launch_server --model-path /m/base --max-total-tokens 8192 ===
[2026-12-06 22:00:31.291] Load weight end. elapsed=0.02 s, type=LlamaForCausalLM, avail mem=18.96 GB, mem usage=0.00 GB.
[2026-12-06 22:00:33] INFO:     127.0.0.1:40466 - "GET /health_generate HTTP/1.1" 200 OK
[2026-12-06 22:00:33.666] The server is fired up and ready to roll!
"""
MANUAL_OLD = """\
[2026-12-06 21:58:50.773] Load weight end. elapsed=0.04 s, type=LlamaForCausalLM, avail mem=18.40 GB, mem usage=0.00 GB.
[2026-12-06 21:58:53.424] The server is fired up and ready to roll!
[2026-12-06 22:00:39.295] SIGTERM received. signum=None frame=None. Draining requests and shutting down...
[2026-12-06 22:00:42.231] Gracefully exiting... Remaining number of requests 0. Remaining requests remaining_rids=[].
"""
MANUAL_NEW = """\
[2026-12-06 22:01:40.500] Load weight end. elapsed=0.03 s, type=LlamaForCausalLM, avail mem=18.40 GB, mem usage=0.00 GB.
[2026-12-06 22:01:43.250] The server is fired up and ready to roll!
"""


def at(h, m, s, ms):
    return datetime.datetime(2026, 12, 6, h, m, s, ms * 1000).timestamp()


def test_the_real_servers_stamps_read_as_one_restart(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(OURS_LOG)
    t0 = at(21, 59, 30, 0)                       # the redeploy's start: the first server's ready line is before it
    events = c.server_events([str(log)], t0, at(22, 1, 0, 0))
    assert events == [(at(21, 59, 39, 198), "sigterm"), (at(22, 0, 33, 666), "ready")]
    new_start = at(21, 59, 44, 400)
    out = c.outage_from_events(events, new_start)
    assert out["kind"] == "restart"
    assert out["outage_s"] == pytest.approx(54.468, abs=1e-3)
    assert out["added_s"] == pytest.approx(5.202, abs=1e-3)
    assert out["startup_s"] == pytest.approx(49.266, abs=1e-3)


def test_a_hand_restart_reads_across_the_old_and_the_new_log(tmp_path):
    old, new = tmp_path / "old.log", tmp_path / "new.log"
    old.write_text(MANUAL_OLD)
    new.write_text(MANUAL_NEW)
    events = c.server_events([str(old), str(new)], at(22, 0, 38, 0), at(22, 2, 0, 0))
    out = c.outage_from_events(events, at(22, 0, 50, 0))
    assert out["outage_s"] == pytest.approx(63.955, abs=1e-3) and out["added_s"] == pytest.approx(10.705, abs=1e-3)


def test_no_new_ready_line_yet_reads_as_no_outage(tmp_path):
    old = tmp_path / "old.log"
    old.write_text(MANUAL_OLD)
    events = c.server_events([str(old)], at(22, 0, 38, 0), at(22, 2, 0, 0))
    assert events == [(at(22, 0, 39, 295), "sigterm")]
    assert c.outage_from_events(events, at(22, 0, 50, 0)) is None
