"""Unit tests for module_utils/sglang_metrics: Prometheus text, the windowed accept gauges,
the startup phases (metrics and the log line of SGLang 0.5.23) and the PD queue depths."""
from __future__ import annotations

import math

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import metrics as sm

# Label order and value format as prometheus_client writes them for SGLang 0.5.23's
# scheduler collector (labelnames model_name, engine_type, tp_rank, pp_rank, moe_ep_rank).
LABELS = 'model_name="qwen",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"'


def page(accept_length, accept_rate, extra=""):
    return (
        "# HELP sglang:spec_accept_length Mean acceptance length of speculative decoding "
        "(accepted drafts + bonus token per forward).\n"
        "# TYPE sglang:spec_accept_length gauge\n"
        "sglang:spec_accept_length{%s} %s\n"
        "# HELP sglang:spec_accept_rate Speculative acceptance rate (`accepted drafts / proposed drafts` in batch).\n"
        "# TYPE sglang:spec_accept_rate gauge\n"
        "sglang:spec_accept_rate{%s} %s\n%s" % (LABELS, accept_length, LABELS, accept_rate, extra))


def test_parse_labels_values_and_comments():
    text = ('# HELP x y\n\nsglang:a{model_name="m \\"q\\" \\\\ n\\n",tp_rank="0",} 1.5 1700000000\n'
            'sglang:b 2\nsglang:c{le="+Inf"} +Inf\nsglang:d NaN\nsglang:e{} -Inf\n')
    samples = sm.parse_prometheus(text)
    assert samples[0] == sm.Sample("sglang:a", {"model_name": 'm "q" \\ n\n', "tp_rank": "0"}, 1.5)
    assert samples[1] == sm.Sample("sglang:b", {}, 2.0)
    assert samples[2].labels == {"le": "+Inf"} and samples[2].value == math.inf
    assert math.isnan(samples[3].value)
    assert samples[4].value == -math.inf
    assert sm.total(text, "sglang:b") == 2.0 and sm.total(text, "sglang:zzz") is None


@pytest.mark.parametrize("bad", ["{x} 1", "sglang:a{tp_rank=0} 1", "sglang:a{x=\"1\" 1", "sglang:a",
                                 "sglang:a 1 2 3", "sglang:a one"])
def test_malformed_lines_raise(bad):
    with pytest.raises(sm.MetricsFormatError, match="line 1"):
        sm.parse_prometheus(bad)


def test_series_match_and_total_over_dp_ranks():
    text = ('sglang:num_running_reqs{model_name="m",dp_rank="0"} 2.0\n'
            'sglang:num_running_reqs{model_name="m",dp_rank="1"} 3.0\n'
            'sglang:num_running_reqs{model_name="other",dp_rank="0"} 7.0\n')
    assert sm.total(text, "sglang:num_running_reqs", model_name="m") == 5.0
    assert len(sm.series(text, "sglang:num_running_reqs")) == 3


def test_accept_window_counts_only_reports_made_inside_the_window():
    win = sm.AcceptWindow()
    win.start(page(2.9, 0.6))             # left over from before the window
    win.observe(page(2.9, 0.6))           # no report yet
    win.observe(page(1.66, 0.661))        # report 1
    win.observe(page(1.66, 0.661))        # same value: still report 1
    win.observe(page(1.70, 0.70))         # report 2
    res = win.result()
    assert res == {"accept_length": 1.68, "accept_rate": 0.68, "last_accept_length": 1.7, "reports": 2,
                   "present": True}


def test_accept_window_stale_and_absent():
    stale = sm.AcceptWindow()
    stale.start(page(2.9, 0.6))
    stale.observe(page(2.9, 0.6))
    assert stale.result()["accept_length"] is None and stale.result()["present"] is True
    absent = sm.AcceptWindow()
    absent.start("sglang:num_running_reqs 0\n")
    absent.observe("sglang:num_running_reqs 0\n")
    assert absent.result() == {"accept_length": None, "accept_rate": None, "last_accept_length": None,
                               "reports": 0, "present": False}
    off = sm.AcceptWindow()                # speculation off: the gauges read 0
    off.start(page(0.0, 0.0))
    off.observe(page(0.0, 0.0))
    assert off.result()["reports"] == 0


def test_accept_window_per_series():
    two = ('sglang:spec_accept_length{dp_rank="0"} %s\nsglang:spec_accept_length{dp_rank="1"} %s\n')
    win = sm.AcceptWindow()
    win.start(two % (0.0, 0.0))
    win.observe(two % (2.0, 0.0))
    win.observe(two % (2.0, 3.0))
    assert win.result()["accept_length"] == 2.5 and win.result()["accept_rate"] is None


# The line as SGLang 0.5.23 entrypoints/engine.py formats it.
LINE = ("[2026-12-01 10:00:00] Engine startup timings (s): load_weight=12.34, kv_cache_allocation=1.50, "
        "scheduler_e2e=40.25, cuda_graph={prefill=0.00, decode=9.87, target_verify=3.00, draft_prefill=0.00, "
        "draft_decode=0.00, draft_extend=0.00}, tokenizer_e2e=41.02")


def test_startup_line():
    phases = sm.parse_startup_line(LINE)
    assert phases == {"load_weight": 12.34, "kv_cache_allocation": 1.5, "scheduler_e2e": 40.25,
                      "tokenizer_e2e": 41.02,
                      "cuda_graph": {"prefill": 0.0, "decode": 9.87, "target_verify": 3.0, "draft_prefill": 0.0,
                                     "draft_decode": 0.0, "draft_extend": 0.0}}
    assert sm.parse_startup_line("no timings here") is None
    assert sm.parse_startup_line("Engine startup timings (s): load_weight=1.0") is None
    log = "\n".join(["x", LINE.replace("41.02", "50.00"), "y", LINE, "z"])
    assert sm.startup_phases_from_log(log)["tokenizer_e2e"] == 41.02          # the last launch
    assert sm.startup_phases_from_log("nothing") is None


def test_startup_metrics():
    text = ('sglang:startup_time_seconds{model_name="m",engine_type="unified",phase="load_weight"} 12.0\n'
            'sglang:startup_time_seconds{model_name="m",engine_type="unified",phase="kv_cache_allocation"} 1.0\n'
            'sglang:startup_time_seconds{model_name="m",engine_type="unified",phase="scheduler_e2e"} 30.0\n'
            'sglang:startup_time_seconds{model_name="m",engine_type="unified",phase="tokenizer_e2e"} 31.5\n'
            'sglang:startup_cuda_graph_time_seconds{model_name="m",engine_type="unified",phase="decode"} 9.0\n')
    phases = sm.startup_phases_from_metrics(text)
    assert phases == {"load_weight": 12.0, "kv_cache_allocation": 1.0, "scheduler_e2e": 30.0,
                      "tokenizer_e2e": 31.5, "cuda_graph": {"decode": 9.0}}
    assert sm.startup_phases_from_metrics("sglang:num_running_reqs 1\n") is None
    assert sm.startup_seconds(phases) == 31.5


def test_startup_budget():
    phases = {"scheduler_e2e": 100.0, "tokenizer_e2e": 101.0}
    assert sm.startup_budget(phases, default=900) == (202.0, "previous")
    assert sm.startup_budget(phases, default=900, margin=1.5, floor=300) == (300.0, "previous")
    assert sm.startup_budget(phases, default=900, margin=100, cap=1800) == (1800.0, "previous")
    assert sm.startup_budget(None, default=900) == (900.0, "default")
    assert sm.startup_budget({"load_weight": 3.0}, default=600) == (600.0, "default")
    with pytest.raises(ValueError, match="margin"):
        sm.startup_budget(phases, default=1, margin=0)


def test_pd_queue_depths():
    text = ('sglang:num_decode_prealloc_queue_reqs{engine_type="decode",tp_rank="0"} 2.0\n'
            'sglang:num_decode_transfer_queue_reqs{engine_type="decode",tp_rank="0"} 1.0\n'
            'sglang:num_decode_transfer_queue_reqs{engine_type="decode",tp_rank="1"} 3.0\n')
    assert sm.pd_queue_depths(text) == {"prefill_bootstrap": None, "prefill_inflight": None,
                                        "decode_prealloc": 2.0, "decode_transfer": 4.0}
