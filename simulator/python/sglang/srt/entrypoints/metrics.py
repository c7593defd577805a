"""``/metrics`` of the simulated engine: Prometheus text like SGLang's collectors (a mixin of
:class:`sglang.srt.entrypoints.engine.Engine`)."""
from __future__ import annotations

from sglang.srt.managers.tokenizer_manager import E2E_BUCKETS


class EngineMetrics(object):
    def metrics_text(self) -> str:
        """Prometheus text like SGLang's collectors (labels in the real order:
        model_name, engine_type, then tp_rank, pp_rank, moe_ep_rank[, dp_rank] for
        scheduler metrics).  The speculative gauges hold the last
        ``decode_log_interval`` report (tokenizer_manager.SpecWindow)."""
        import functools

        from sglang.srt.entrypoints.http_server import metric_block

        tm, vt = self.tokenizer_manager, self.knobs.vt
        metric_block = functools.partial(metric_block, sort_labels=vt >= (0, 5, 23))
        sa = self.server_args
        engine_type = {"prefill": "prefill", "decode": "decode"}.get(self.disagg_mode(), "unified")
        base = {"model_name": sa.served_model_name, "engine_type": engine_type}
        scheds = []
        for d in range(tm.dp_size):
            labels = dict(base, tp_rank="0", pp_rank="0", moe_ep_rank="0")
            if tm.dp_size > 1:
                labels["dp_rank"] = str(d)
            scheds.append((d, labels))

        def per_rank(fn):
            return [(labels, fn(d), "") for d, labels in scheds]

        with tm.lock:
            running = list(tm.running)
            waiting = list(tm.waiting)
        gauges = [
            ("sglang:num_running_reqs", "The number of running requests.", lambda d: running[d]),
            ("sglang:num_queue_reqs", "The number of requests in the waiting queue.", lambda d: waiting[d]),
            ("sglang:gen_throughput", "The generation throughput (token/s).",
             lambda d: tm.gen_throughput() / tm.dp_size),
            ("sglang:cache_hit_rate", "The prefix cache hit rate.", lambda d: 0.0),
            ("sglang:token_usage", "The token usage.", lambda d: tm._token_usage()),
            ("sglang:num_used_tokens", "The number of used tokens.", tm.used_tokens),
        ]
        lines = []
        for name, help_text, fn in gauges:
            lines += metric_block(name, "gauge", help_text, per_rank(fn))
        lines += metric_block("sglang:spec_accept_length", "gauge",
                              "Mean acceptance length of speculative decoding (accepted drafts + bonus "
                              "token per forward).", per_rank(lambda d: tm.spec_gauges(d)[0]))
        if vt >= (0, 5, 10):
            lines += metric_block("sglang:spec_accept_rate", "gauge",
                                  "Speculative acceptance rate (`accepted drafts / proposed drafts` in batch).",
                                  per_rank(lambda d: tm.spec_gauges(d)[1]))
        steps = (sa.speculative_num_steps or 0) if self.spec.enabled else 0
        drafts = (sa.speculative_num_draft_tokens or 0) if self.spec.enabled else 0
        if vt >= (0, 5, 23):
            lines += metric_block("sglang:spec_num_steps", "gauge", "Currently active speculative_num_steps.",
                                  per_rank(lambda d: steps))
        lines += metric_block("sglang:spec_num_draft_tokens", "gauge",
                              "Currently active speculative_num_draft_tokens (decouples from steps under topk>1).",
                              per_rank(lambda d: drafts))
        if vt >= (0, 5, 23):
            queues = self.pd.queue_depths() if self.pd is not None else {}
            for key, name, help_text in (
                    ("prefill_bootstrap", "sglang:num_prefill_bootstrap_queue_reqs",
                     "The number of requests in the prefill bootstrap queue."),
                    ("prefill_inflight", "sglang:num_prefill_inflight_queue_reqs",
                     "The number of requests in the prefill inflight queue."),
                    ("decode_prealloc", "sglang:num_decode_prealloc_queue_reqs",
                     "The number of requests in the decode prealloc queue."),
                    ("decode_transfer", "sglang:num_decode_transfer_queue_reqs",
                     "The number of requests in the decode transfer queue.")):
                lines += metric_block(name, "gauge", help_text, per_rank(lambda d, k=key: queues.get(k, 0)))
            if self.pd is not None:
                lines += metric_block("sglang:num_bootstrap_failed_reqs_total", "counter",
                                      "The number of bootstrap failed requests.",
                                      [(scheds[0][1], self.pd.bootstrap_failed, "")])
                lines += metric_block("sglang:num_transfer_failed_reqs_total", "counter",
                                      "The number of transfer failed requests.",
                                      [(scheds[0][1], self.pd.transfer_failed, "")])
            if self.weights.last_load_s is not None:
                lines += metric_block(
                    "sglang:weight_load_duration_seconds", "gauge",
                    "Wall time of the most recent update_weights_from_<source> call on this scheduler "
                    "rank (seconds). `source` label is one of: disk, distributed, tensor, ipc. "
                    "Event-detection via changes(...[<range>]) > 0 \u2014 no separate counter needed.",
                    [(dict(labels, source="disk"), self.weights.last_load_s, "") for _d, labels in scheds])
            st = self.startup_time or {}
            if st:
                lines += metric_block("sglang:startup_time_seconds", "gauge",
                                      "Engine startup duration by phase in seconds.",
                                      [(dict(base, phase=p), st[p], "") for p in
                                       ("load_weight", "kv_cache_allocation", "scheduler_e2e", "tokenizer_e2e")])
                lines += metric_block("sglang:startup_cuda_graph_time_seconds", "gauge",
                                      "CUDA graph capture duration by phase in seconds.",
                                      [(dict(base, phase=p), v, "") for p, v in st["cuda_graph"].items()])
        lines += self._tokenizer_metrics(metric_block, base, scheds, per_rank)
        return "\n".join(lines) + "\n"

    def _tokenizer_metrics(self, metric_block, base, scheds, per_rank):
        """The TokenizerManager's counters and histograms (and the 0.5.23 families)."""
        tm, vt = self.tokenizer_manager, self.knobs.vt
        lines = []
        streaming = dict(base, is_streaming="false") if vt >= (0, 5, 23) else base
        lines += metric_block("sglang:prompt_tokens_total", "counter",
                              "Number of prefill tokens processed.", [(streaming, tm.prompt_tokens_total, "")])
        lines += metric_block("sglang:generation_tokens_total", "counter",
                              "Number of generation tokens processed.",
                              [(streaming, tm.generation_tokens_total, "")])
        if vt < (0, 5, 23):
            lines += metric_block("sglang:cached_tokens_total", "counter",
                                  "Number of cached prompt tokens by source (device/host/storage).",
                                  [(base, tm.cached_tokens_total, "")])
            lines += metric_block("sglang:num_requests_total", "counter", "Number of requests processed.",
                                  [(base, tm.num_requests_total, "")])
        else:
            # 0.5.23 (multiprocess collector): a family appears with its first sample.
            if tm.cached_tokens_total:
                lines += metric_block("sglang:cached_tokens_total", "counter",
                                      "Number of cached prompt tokens by source (device/host/storage).",
                                      [(dict(base, cache_source="device"), tm.cached_tokens_total, "")])
            lines += metric_block("sglang:num_requests_total", "counter", "Number of requests processed.",
                                  [(streaming, tm.num_requests_total, "")])
            if tm.spec_verify_total:
                lines += metric_block("sglang:spec_verify_calls_total", "counter",
                                      "Number of speculative decoding verification calls.",
                                      [(base, tm.spec_verify_total, "")])
            lines += self._metrics_0523(metric_block, per_rank, scheds, streaming)
        samples, cum = [], 0
        for bound, count in zip(E2E_BUCKETS, tm.e2e_hist):
            cum += count
            samples.append((dict(streaming, le=str(float(bound))), cum, "_bucket"))
        cum += tm.e2e_hist[-1]
        samples.append((dict(streaming, le="+Inf"), cum, "_bucket"))
        samples.append((streaming, tm.e2e_count, "_count"))
        samples.append((streaming, tm.e2e_sum, "_sum"))
        lines += metric_block("sglang:e2e_request_latency_seconds", "histogram",
                              "Histogram of End-to-end request latency in seconds", samples)
        return lines

    TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0,
                    400.0)
    QUEUE_BUCKETS = (0.0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 15.0, 20.0, 30.0,
                     40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0, 200.0, 300.0, 400.0, 500.0, 600.0, 700.0, 800.0,
                     900.0, 1000.0, 1200.0, 1400.0, 1600.0, 1800.0, 2000.0, 2500.0, 3000.0)

    @staticmethod
    def _histogram(labels, values, bounds):
        samples = [(labels, sum(values), "_sum")]
        for bound in bounds:
            samples.append((dict(labels, le=str(float(bound))), sum(1 for v in values if v <= bound), "_bucket"))
        samples.append((dict(labels, le="+Inf"), len(values), "_bucket"))
        samples.append((labels, len(values), "_count"))
        return samples

    def _metrics_0523(self, metric_block, per_rank, scheds, streaming):
        """The 0.5.23 families the real server serves on a plain run and the older simulator lacked
        (measured: the pool, the KV slots, paused/retracted requests, utilization, the HTTP counters,
        TTFT and queue-time histograms, weight memory, CUDA graph use, the context length)."""
        tm = self.tokenizer_manager
        lines = []
        gauges = (
            ("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.",
             lambda d: self.max_total_num_tokens),
            ("sglang:kv_used_tokens", "Number of actively used token slots in the KV cache pool.", tm.used_tokens),
            ("sglang:kv_available_tokens", "Number of free token slots in the KV cache pool.",
             lambda d: self.max_total_num_tokens - tm.used_tokens(d)),
            ("sglang:utilization", "The utilization.",
             lambda d: round(tm.running[d] / float(max(1, tm.max_running_per_dp)), 4)),
            ("sglang:weight_memory_usage_gb", "Memory used by model weights in GB.",
             lambda d: self.mem["weights_mib"] / 1024.0),
            ("sglang:is_cuda_graph", "Whether the batch is using CUDA graph.",
             lambda d: 0.0 if self.server_args.disable_cuda_graph else 1.0),
            ("sglang:context_len", "Maximum context length.", lambda d: self.context_length),
        )
        for name, help_text, fn in gauges:
            lines += metric_block(name, "gauge", help_text, per_rank(fn))
        pids = dict((i, str(p.pid)) for i, (p, _n, _c) in enumerate(self.sched))
        for name, help_text in (("sglang:num_paused_reqs", "The number of paused requests by async weight sync."),
                                ("sglang:num_retracted_reqs", "The number of retracted requests.")):
            lines += metric_block(name, "gauge", help_text,
                                  [(dict(labels, pid=pids.get(d, "0")), 0, "") for d, labels in scheds])
        with tm.lock:
            counts = sorted(self.http_counts.items())
            ttft = list(tm.ttft_observed)
            queue = list(tm.queue_observed)
        requests = {}
        for (path, method, _code), n in counts:
            requests[(path, method)] = requests.get((path, method), 0) + n
        if requests:
            lines += metric_block("sglang:http_requests_total", "counter",
                                  "Total number of HTTP requests by endpoint and method",
                                  [({"endpoint": p, "method": m}, n, "") for (p, m), n in sorted(requests.items())])
            lines += metric_block("sglang:http_responses_total", "counter",
                                  "Total number of HTTP responses by endpoint and status code",
                                  [({"endpoint": p, "method": m, "status_code": c}, n, "") for (p, m, c), n in counts])
        if ttft:
            lines += metric_block("sglang:time_to_first_token_seconds", "histogram",
                                  "Histogram of time to first token in seconds.",
                                  self._histogram(streaming, ttft, self.TTFT_BUCKETS))
        if queue:
            lines += metric_block("sglang:queue_time_seconds", "histogram", "Histogram of queueing time in seconds.",
                                  self._histogram(scheds[0][1], queue, self.QUEUE_BUCKETS))
        return lines
