"""Request bookkeeping of the fake server (the TokenizerManager's role).

Runs in the main process.  Requests are served by HTTP handler threads; each
``generate`` call really takes ``verify_steps * step_seconds * TIME_SCALE``
wall seconds (``spec_model``), counts as running while it holds one of the
``max_running_requests`` slots of its DP rank and as waiting before that, so
``/v1/loads``, ``/metrics`` and the SIGTERM drain (docs/reference/sglang-processes.md, Signals) see real
in-flight numbers.  Reported latencies and throughputs are in *simulated*
seconds (wall time / ``SGLANG_SIM_TIME_SCALE``), so they do not depend on the
time scale used by a test.
"""
from __future__ import annotations

import collections
import hashlib
import logging
import random
import threading
import time
import uuid

logger = logging.getLogger("sglang.srt.managers.tokenizer_manager")

WORDS = ("the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with",
         "be", "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which",
         "but", "have", "an", "had", "they", "you", "were", "their", "one", "all", "we",
         "can", "her", "has", "there", "been", "if", "more", "when", "will", "would", "who",
         "so", "no", "GPU", "model", "token", "server", "draft", "verify", "kernel", "cache")

E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0)


class ServerStatus:
    Starting = "Starting"
    Up = "Up"
    UnHealthy = "UnHealthy"


class AbortedError(Exception):
    pass


class SpecWindow:
    """One scheduler's decode statistics between two reports (metrics_reporter.py).

    Real SGLang reports every ``decode_log_interval`` decode iterations: the
    gauges ``sglang:spec_accept_length`` (accepted tokens / requests summed
    over those iterations' verify forwards) and ``sglang:spec_accept_rate``
    (correct drafts / (requests x drafts per round)), then resets the
    counters.  Here an iteration is one verify step of the batch: a request
    that takes a step while ``n`` requests run on its rank advances the
    rank's iteration count by ``1 / n``.
    """

    def __init__(self, interval, drafts_per_round):
        self.interval = max(1, int(interval))
        self.drafts_per_round = max(0, int(drafts_per_round))
        self.iterations = 0.0
        self.reports = 0
        self.accepted = 0
        self.correct = 0
        self.forwards = 0
        self.generated = 0
        self.accept_length = 0.0
        self.accept_rate = 0.0
        self.gen_throughput = 0.0
        self.last_report = time.time()

    def step(self, tokens, running):
        """Record one verify step of one request; True when a report is due."""
        self.accepted += tokens
        self.correct += max(0, tokens - 1)
        self.forwards += 1
        self.generated += tokens
        self.iterations += 1.0 / max(1, running)
        if int(self.iterations // self.interval) > self.reports:
            self.reports = int(self.iterations // self.interval)
            return True
        return False

    def report(self, spec_enabled, time_scale):
        now = time.time()
        if spec_enabled and self.forwards:
            self.accept_length = self.accepted / float(self.forwards)
            total = self.forwards * self.drafts_per_round
            self.accept_rate = self.correct / float(total) if total else 0.0
        gap = (now - self.last_report) / time_scale if time_scale > 0 else 0.0
        self.gen_throughput = self.generated / gap if gap > 0 else 0.0
        self.last_report = now
        self.accepted = self.correct = self.forwards = self.generated = 0


class RWLock:
    """Writer-preferring readers/writer lock (the TokenizerManager's model_update_lock):
    requests hold it shared; a weight update waits for them and holds new ones back."""

    def __init__(self):
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    class _Ctx:
        def __init__(self, enter, leave):
            self._enter, self._leave = enter, leave

        def __enter__(self):
            self._enter()

        def __exit__(self, *exc):
            self._leave()

    def _acquire_read(self):
        with self._cond:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            self._readers += 1

    def _release_read(self):
        with self._cond:
            self._readers -= 1
            self._cond.notify_all()

    def _acquire_write(self):
        with self._cond:
            self._writers_waiting += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._writers_waiting -= 1
            self._writer = True

    def _release_write(self):
        with self._cond:
            self._writer = False
            self._cond.notify_all()

    def reader(self):
        return self._Ctx(self._acquire_read, self._release_read)

    def writer(self):
        return self._Ctx(self._acquire_write, self._release_write)


class ReqState:
    def __init__(self, rid, dp_rank, prompt_tokens, health=False):
        self.rid = rid
        self.dp_rank = dp_rank
        self.prompt_tokens = prompt_tokens
        self.health = health
        self.running = False
        self.generated = 0
        self.rate = 0.0
        self.abort = threading.Event()
        self.created = time.time()


class TokenizerManager:
    def __init__(self, server_args, knobs, model_config, spec_model, dp_size, max_total_num_tokens):
        self.server_args = server_args
        self.knobs = knobs
        self.model_config = model_config
        self.spec = spec_model
        self.dp_size = max(1, int(dp_size))
        self.max_total_num_tokens = max_total_num_tokens
        mrr = server_args.max_running_requests
        self.max_running_per_dp = max(1, (mrr // self.dp_size) if mrr else 4096)
        self.lock = threading.Condition()
        self.server_status = ServerStatus.Starting
        self.gracefully_exit = False
        self.paused = False
        self.first_request_hook = None
        self._first_request_done = False
        self.rid_to_state = {}
        self.running = [0] * self.dp_size
        self.waiting = [0] * self.dp_size
        self._rr = 0
        self.rng = random.Random(knobs.seed)
        self._req_counter = 0
        self.seen_prompts = set()
        self.schedulers_alive = lambda: True
        self.last_receive_tstamp = 0.0
        # cumulative statistics
        self.num_requests_total = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.cached_tokens_total = 0
        self.spec_accepted_total = 0   # tokens produced by verify steps
        self.spec_verify_total = 0
        self.spec_correct_total = 0
        self.spec_proposed_total = 0
        self.window = collections.deque(maxlen=max(1, int(server_args.decode_log_interval or 40)) * 8)
        drafts = max(0, (spec_model.num_draft_tokens or 1) - 1) if spec_model.enabled else 0
        self.spec_windows = [SpecWindow(server_args.decode_log_interval or 40, drafts)
                             for _d in range(self.dp_size)]
        self.decode_steps_total = 0
        # sglang#22779 (SGLANG_SIM_HANG_AFTER_REQUESTS): requests after the N-th never answer
        self.hang_after = 0
        self.user_requests = 0
        self.hung = False
        self.weight_version = server_args.values.get("weight_version") or "default"
        self.served_model_name = server_args.served_model_name
        self.model_update_lock = RWLock()
        self.startup_time = None
        self.last_gen_throughput = 0.0
        self.e2e_hist = [0] * (len(E2E_BUCKETS) + 1)
        self.ttft_observed = []   # simulated seconds per request (0.5.23's TTFT histogram)
        self.queue_observed = []  # simulated seconds waiting for a running slot
        self.e2e_sum = 0.0
        self.e2e_count = 0

    # ------------------------------------------------------------------ status
    def is_ready(self) -> bool:
        return self.server_status == ServerStatus.Up and not self.paused and not self.gracefully_exit

    def num_running(self) -> int:
        with self.lock:
            return sum(self.running)

    def num_waiting(self) -> int:
        with self.lock:
            return sum(self.waiting)

    def used_tokens(self, dp_rank=None) -> int:
        with self.lock:
            return sum(s.prompt_tokens + s.generated for s in self.rid_to_state.values()
                       if s.running and (dp_rank is None or s.dp_rank == dp_rank))

    def gen_throughput(self) -> float:
        with self.lock:
            running = [s.rate for s in self.rid_to_state.values() if s.running and not s.health]
        if running:
            return float(sum(running))
        return self.last_gen_throughput

    def window_accept(self):
        """(accept_length, accept_rate) over the last logging window."""
        with self.lock:
            steps = list(self.window)
        if not steps or not self.spec.enabled:
            return 0.0, 0.0
        accepted = sum(steps)
        proposed = len(steps) * max(1, (self.spec.num_draft_tokens or 1) - 1)
        return accepted / len(steps), (accepted - len(steps)) / proposed

    def avg_spec_accept_length(self):
        with self.lock:
            if not self.spec.enabled or self.spec_verify_total == 0:
                return None
            return self.spec_accepted_total / self.spec_verify_total

    # ---------------------------------------------------------------- tokens
    @staticmethod
    def count_prompt_tokens(text=None, input_ids=None) -> int:
        if input_ids is not None:
            return max(1, len(input_ids))
        text = text or ""
        return max(1, (len(text) + 3) // 4)

    def _token_words(self, rid: str, n: int):
        h = int(hashlib.sha256(("%s:%d" % (rid, self.knobs.seed)).encode()).hexdigest()[:12], 16)
        r = random.Random(h)
        ids = [r.randrange(1000, 32000) for _i in range(n)]
        words = [WORDS[i % len(WORDS)] for i in ids]
        return ids, words

    # -------------------------------------------------------------- generate
    def auto_create_handle_loop(self):
        """SGLang's TokenizerManager.auto_create_handle_loop: the first call of
        any control or generate path installs the SIGTERM/SIGQUIT handlers."""
        with self.lock:
            if self._first_request_done:
                return
            self._first_request_done = True
        hook = self.first_request_hook
        if hook is not None:
            hook()

    _on_first_request = auto_create_handle_loop

    def abort_request(self, rid=None, abort_all=False) -> int:
        n = 0
        with self.lock:
            for state in self.rid_to_state.values():
                if abort_all or state.rid == rid:
                    state.abort.set()
                    n += 1
        return n

    def flush_cache(self) -> bool:
        """Scheduler.flush_cache: only when idle."""
        with self.lock:
            if any(self.running) or any(self.waiting):
                logger.warning("Cache not flushed because there are pending requests. #queue-req: %s, "
                               "#running-req: %s", sum(self.waiting), sum(self.running))
                return False
            self.seen_prompts.clear()
        logger.info("Cache flushed successfully!")
        return True

    def generate(self, rid, prompt_tokens, max_new_tokens, on_progress=None, health=False,
                 prompt_key=None, cached_prompt=False):
        """Run one request; returns ``(output_ids, text, meta_info)``.

        ``on_progress(output_ids, text, verify_steps_done)`` is called after
        each verify step when streaming.  Holds the model_update_lock shared.
        """
        self._on_first_request()
        if health:
            return self._generate(rid, prompt_tokens, max_new_tokens, on_progress, health, prompt_key,
                                  cached_prompt)
        with self.model_update_lock.reader():
            return self._generate(rid, prompt_tokens, max_new_tokens, on_progress, health, prompt_key,
                                  cached_prompt)

    def _generate(self, rid, prompt_tokens, max_new_tokens, on_progress, health, prompt_key, cached_prompt):
        rid = rid or uuid.uuid4().hex
        max_new_tokens = max(0, int(max_new_tokens))
        with self.lock:
            if rid in self.rid_to_state:
                raise ValueError(f"Duplicate request ID detected: {rid}")
            dp_rank = self._rr % self.dp_size
            self._rr += 1
            state = ReqState(rid, dp_rank, prompt_tokens, health)
            t_enqueue = time.time()
            self.rid_to_state[rid] = state
            self.waiting[dp_rank] += 1
            while ((self.running[dp_rank] >= self.max_running_per_dp or self.paused)
                   and not state.abort.is_set()):
                self.lock.wait(0.05)
            self.waiting[dp_rank] -= 1
            self.running[dp_rank] += 1
            state.running = True
            queue_wall = time.time() - t_enqueue
            # Radix cache: a prompt seen before is served from cache except its last token.
            cached = max(0, prompt_tokens - 1) if cached_prompt else 0
            if prompt_key is not None and not health and not cached_prompt:
                if prompt_key in self.seen_prompts:
                    cached = max(0, prompt_tokens - 1)
                else:
                    self.seen_prompts.add(prompt_key)
            self._req_counter += 1
            hang = False
            if not health and self.server_status == ServerStatus.Up:
                self.user_requests += 1
                if self.hang_after and self.user_requests > self.hang_after:
                    hang = self.hung = True
            plan = self.spec.plan(max_new_tokens, self.rng)
            running_now, queued_now = sum(self.running), sum(self.waiting)
        if not health:
            if self.knobs.at_least(0, 5, 23):
                logger.info("Prefill batch, #new-seq: 1, #new-token: %s, #cached-token: %s, token usage: %.2f, "
                            "#running-req: %s, #queue-req: %s, #pending-token: 0, cuda graph: False, "
                            "input throughput (token/s): 0.00",
                            prompt_tokens, cached, self._token_usage(), running_now - 1, queued_now)
            else:
                logger.info("Prefill batch. #new-seq: 1, #new-token: %s, #cached-token: %s, token usage: %.2f, "
                            "#running-req: %s, #queue-req: %s,",
                            prompt_tokens, cached, self._token_usage(), running_now - 1, queued_now)
        step_s = self.spec.step_seconds()
        sim_elapsed = 0.0
        ids, words = self._token_words(rid, max_new_tokens)
        produced = 0
        aborted = False
        i = 0
        try:
            if hang:
                # the scheduler stopped producing: the request never finishes
                # (only an abort or the shutdown ends it)
                state.abort.wait()
                plan = []
                aborted = True
            if plan:
                state.rate = (sum(plan) / (len(plan) * step_s)) if step_s > 0 else 0.0
            # Sleep in slices: per verify step when streaming, else in ~50 ms slices.
            slice_steps = 1 if on_progress else max(1, int(0.05 / max(1e-9, step_s * self.knobs.time_scale)))
            while i < len(plan):
                chunk = plan[i:i + slice_steps]
                wall = self.knobs.sleep_s(len(chunk) * step_s)
                if state.abort.wait(wall) if wall > 0 else state.abort.is_set():
                    aborted = True
                    break
                produced += sum(chunk)
                sim_elapsed += len(chunk) * step_s
                i += len(chunk)
                lines = []
                with self.lock:
                    state.generated = produced
                    self.last_receive_tstamp = time.time()
                    if not health:
                        win = self.spec_windows[dp_rank]
                        for n in chunk:
                            if win.step(n, self.running[dp_rank]):
                                win.report(self.spec.enabled, self.knobs.time_scale)
                                lines.append(self._decode_log_line(dp_rank))
                for line in lines:
                    logger.info(line)
                if on_progress is not None:
                    on_progress(ids[:produced], " " + " ".join(words[:produced]) if produced else "",
                                i)
        finally:
            with self.lock:
                state.running = False
                self.running[dp_rank] -= 1
                self.rid_to_state.pop(rid, None)
                self.last_receive_tstamp = time.time()
                self.lock.notify_all()
        verify_ct = i
        text = (" " + " ".join(words[:produced])) if produced else ""
        meta = {"id": rid}
        if aborted:
            meta["finish_reason"] = {"type": "abort", "message": "Abort before prefill"
                                     if produced == 0 else "Abort in running batch"}
        else:
            meta["finish_reason"] = {"type": "length", "length": max_new_tokens}
        meta["prompt_tokens"] = prompt_tokens
        vt = self.knobs.vt
        # Simulated seconds: time waiting for a running slot plus decode time.
        scale = self.knobs.time_scale
        queue_s = queue_wall / scale if scale > 0 else 0.0
        e2e = sim_elapsed + queue_s
        if vt >= (0, 5, 23):
            # The 23 keys of the real 0.5.23 (tokenizer_manager's meta_info, measured on the real server).
            finished = time.time()
            first = step_s if produced else 0.0
            meta.update({"weight_version": self.weight_version, "num_retractions": 0,
                         "storage_prefetch_wait": 0.0, "storage_staging_wait": 0.0,
                         "forward_entry_time": t_enqueue + queue_wall, "prefill_finished_time": t_enqueue + queue_wall,
                         "queue_time": queue_s, "reasoning_tokens": 0,
                         "completion_tokens": produced, "cached_tokens": cached,
                         "weight_versions": [{"version": self.weight_version, "start": 0, "end": produced}],
                         "cached_tokens_details": {"device": cached, "host": 0},
                         "dp_rank": dp_rank if self.dp_size > 1 else None, "e2e_latency": e2e,
                         "request_received_ts": t_enqueue, "first_token_latency": queue_s + first,
                         "api_server_dispatch_finish_ts": t_enqueue, "request_finished_ts": finished,
                         "decode_throughput": (produced / sim_elapsed) if sim_elapsed > 0 else 0.0,
                         "response_sent_to_client_ts": finished})
        else:
            if vt >= (0, 5, 10):
                meta.update({"weight_version": self.weight_version, "num_retractions": 0, "reasoning_tokens": 0})
            meta.update({"completion_tokens": produced, "cached_tokens": cached})
            meta["e2e_latency"] = e2e
        if self.spec.enabled and verify_ct > 0:
            proposed = verify_ct * max(0, (self.spec.num_draft_tokens or 1) - 1)
            correct = produced - verify_ct
            if vt < (0, 4, 10):
                meta["spec_verify_ct"] = verify_ct
            elif proposed > 0:
                meta["spec_accept_rate"] = correct / proposed
                meta["spec_accept_length"] = produced / verify_ct
                meta["spec_num_correct_drafts"] = correct
                meta["spec_num_proposed_drafts"] = proposed
                meta["spec_verify_ct"] = verify_ct
                hist = [0] * (max(0, (self.spec.num_draft_tokens or 1) - 1) + 1)
                for n in plan[:verify_ct]:
                    hist[min(n - 1, len(hist) - 1)] += 1
                meta["spec_correct_drafts_histogram"] = hist
        if not health:
            self._account(prompt_tokens, produced, cached, plan[:verify_ct], e2e, sim_elapsed)
            with self.lock:
                self.queue_observed.append(queue_s)
                if produced:
                    self.ttft_observed.append(queue_s + step_s)
        return ids[:produced], text, meta

    def _token_usage(self) -> float:
        total = max(1, self.max_total_num_tokens or 1)
        return min(1.0, self.used_tokens() / float(total))

    def _account(self, prompt_tokens, produced, cached, steps, e2e, decode_s):
        with self.lock:
            self.num_requests_total += 1
            self.prompt_tokens_total += prompt_tokens
            self.generation_tokens_total += produced
            self.cached_tokens_total += cached
            if decode_s > 0 and produced > 0:
                self.last_gen_throughput = produced / decode_s
            self.e2e_sum += e2e
            self.e2e_count += 1
            for bi, bound in enumerate(E2E_BUCKETS):
                if e2e <= bound:
                    self.e2e_hist[bi] += 1
                    break
            else:
                self.e2e_hist[-1] += 1
            if self.spec.enabled:
                self.spec_accepted_total += sum(steps)
                self.spec_verify_total += len(steps)
                self.spec_correct_total += sum(steps) - len(steps)
                self.spec_proposed_total += len(steps) * max(0, (self.spec.num_draft_tokens or 1) - 1)
                self.window.extend(steps)
            self.decode_steps_total += len(steps)

    def _decode_log_line(self, dp_rank=0) -> str:
        """The scheduler's periodic line (metrics_reporter.py report_decode_stats); lock held."""
        win = self.spec_windows[dp_rank]
        parts = [f"Decode batch, #running-req: {self.running[dp_rank]}",
                 f"#token: {sum(s.prompt_tokens + s.generated for s in self.rid_to_state.values() if s.dp_rank == dp_rank)}",
                 "token usage: 0.00"]
        if self.spec.enabled:
            parts.append(f"accept len: {win.accept_length:.2f}")
            parts.append(f"accept rate: {win.accept_rate:.2f}")
        parts.append("cuda graph: True")
        parts.append(f"gen throughput (token/s): {win.gen_throughput:.2f}")
        parts.append(f"#queue-req: {self.waiting[dp_rank]}")
        return ", ".join(parts)

    def spec_gauges(self, dp_rank=0):
        """(accept_length, accept_rate) as the last report set them (0 before any)."""
        with self.lock:
            win = self.spec_windows[dp_rank]
            if not self.spec.enabled:
                return 0.0, 0.0
            return win.accept_length, win.accept_rate
