"""Main-process life cycle of the fake server (docs/reference/sglang-processes.md).

Process tree (§3.1): the main process keeps its cmdline (``python -m
sglang.launch_server ...``); it starts one ``sglang::scheduler[_DP<d>][_TP<n>]``
child per local TP rank (the ``_TP<n>`` part only with tp_size > 1, as in
scheduler.py:6279-6294) and, on node rank 0, one ``sglang::detokenizer``.
With ``--dp-size > 1`` the schedulers are direct children of the main process
(real SGLang puts a ``sglang::data_parallel_controller`` in between).

Signals:

* loading (before the HTTP server runs): SIGTERM has its default action; the
  children follow through PDEATHSIG.  SIGQUIT (sent by a failing child):
  "Received sigquit from a child process. ..." and the whole tree, the main
  process included, is SIGKILLed.
* HTTP server running, no request handled yet: SIGTERM stops the server the
  way uvicorn does, the children are SIGKILLed (``finally:
  kill_process_tree``) and the process exits 0.
* after the first request (the warmup's): SIGTERM drains (§3.2): health
  endpoints answer 503, new requests are still accepted, "Gracefully
  exiting... Remaining number of requests N ..." every poll; then 0.5.23 sends
  the ShutdownReq (schedulers release their memory and exit), waits up to 15 s,
  SIGKILLs what is left and exits 0, while 0.4.6-0.5.10 SIGKILL the whole tree
  including the main process (exit status: signal 9, §3.5).
* SubprocessWatchdog (0.5.10+, §3.3): a child that exits non-zero is logged as
  "Subprocess <name> (pid=N) crashed with exit code C." and the tree is torn
  down through SIGQUIT.

Multi-node: node rank 0 listens on ``--dist-init-addr`` and waits for the
other ranks before it serves; ranks >= 1 connect, hold their GPUs, run only
the dummy health server and, on 0.5.23, ignore SIGTERM (warning only) until
rank 0's shutdown broadcast.
"""
from __future__ import annotations

import collections
import json
import logging
import os
import signal
import socket
import sys
import threading
import time

from sglang.srt import utils
from sglang.srt.entrypoints import ports
from sglang.srt.entrypoints.measured import Measured0523
from sglang.srt.entrypoints.metrics import EngineMetrics
from sglang.srt.managers.tokenizer_manager import ServerStatus, TokenizerManager
from sglang.srt.server_knobs import ServerKnobs
from sglang.srt.spec_model import SpecModel

logger = logging.getLogger("sglang.srt.entrypoints.engine")
uvicorn_logger = logging.getLogger("uvicorn.error")


class DistNetworkError(RuntimeError):
    """Stand-in for ``torch.distributed.DistNetworkError``."""


DistNetworkError.__module__ = "torch.distributed"


def _estimate_model(cfg: dict, tp: int):
    """(weights MiB per rank, KV bytes per token per rank) from an HF config."""
    hidden = int(cfg.get("hidden_size") or 4096)
    layers = int(cfg.get("num_hidden_layers") or 32)
    heads = int(cfg.get("num_attention_heads") or 32)
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or max(1, hidden // max(1, heads)))
    inter = int(cfg.get("intermediate_size") or 4 * hidden)
    vocab = int(cfg.get("vocab_size") or 32000)
    experts = int(cfg.get("num_experts") or cfg.get("n_routed_experts") or 1)
    attn = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    mlp = 3 * hidden * inter * min(experts, 256)
    params = vocab * hidden * 2 + layers * (attn + mlp)
    weights_mib = params * 2 / max(1, tp) / (1 << 20)
    kv_per_token = 2 * layers * max(1, kv_heads // max(1, tp)) * head_dim * 2
    return weights_mib, kv_per_token


class Engine(Measured0523, EngineMetrics):
    def __init__(self, server_args, knobs, model_config, ctx, node):
        self.server_args = server_args
        self.knobs = knobs
        self.model_config = model_config
        self.ctx = ctx
        self.node = node
        self.gpu_name = ctx.gpu_name
        self.start_time = time.time()
        self.procs = []           # [(Popen, name, JsonLines)]
        self.sched = []           # scheduler entries (subset of procs)
        self.exit_event = threading.Event()
        self.exit_code = 0
        self.tokenizer_manager = None
        self.http = None
        self.internal_overrides = {}
        self.scheduler_info = {}
        self._flap_count = 0
        self._flap_lock = threading.Lock()
        self._handlers_installed = False
        self._want_running_sigquit = False
        self._watchdog_stop = threading.Event()
        self.dist = None
        self.sk = ServerKnobs()
        self.port_plan = {}
        self.main_sockets = []
        self.scheduler_infos = []
        self.startup_time = None
        self.after_unclean = False
        self.marker_path = None
        self.access_log_enabled = str(server_args.log_level_http or server_args.log_level
                                      ).lower() in ("debug", "info")
        self.access_log_exclude = list(server_args.uvicorn_access_log_exclude_prefixes or [])
        sa = server_args
        self.nnodes = max(1, int(sa.nnodes or 1))
        self.node_rank = int(sa.node_rank or 0)
        self.dp_size = max(1, int(sa.dp_size or 1))
        self.tp_size = max(1, int(sa.tp_size or 1))
        self.pp_size = max(1, int(sa.pp_size or 1))
        self.spec = SpecModel(sa.speculative_algorithm, sa.speculative_num_steps,
                              sa.speculative_eagle_topk, sa.speculative_num_draft_tokens, knobs)
        from sglang.srt.disaggregation import PDState
        from sglang.srt.managers.lora import LoraRegistry
        from sglang.srt.managers.weights import WeightState

        self.weights = WeightState(self)
        self._crash_dump_performed = False
        self.crashing = False
        self.http_counts = collections.Counter()  # (route, method, status) -> responses (0.5.23 metrics)
        self.lora = LoraRegistry(sa)
        self.pd = PDState(self) if (sa.values.get("disaggregation_mode") or "null") != "null" else None
        self._chan_lock = threading.Lock()
        self._chan_seq = 0

    def free_gib(self) -> float:
        """Free memory of the first visible GPU in GiB (for log lines)."""
        try:
            first = self.visible[0]
            for g in self.node.gpus():
                if g["index"] == first:
                    return g["free_mib"] / 1024.0
        except Exception:
            pass
        return 0.0

    def disagg_mode(self) -> str:
        return self.pd.mode if self.pd is not None else "null"

    def stage_on_schedulers(self, mib):
        """A weight update's staging buffer on every local scheduler; the first OOM text or None."""
        if mib <= 0:
            return None
        with self._chan_lock:
            for proc, _name, chan in self.sched:
                self._chan_seq += 1
                chan.send({"cmd": "hold", "id": self._chan_seq, "mib": int(mib)})
                deadline = time.monotonic() + 30
                while True:
                    try:
                        msg = chan.recv(timeout=max(0.1, deadline - time.monotonic()))
                    except socket.timeout:
                        return "scheduler pid %s did not answer" % proc.pid
                    if msg is None:
                        return "scheduler pid %s is gone" % proc.pid
                    if msg.get("event") == "reply" and msg.get("id") == self._chan_seq:
                        break
                result = msg.get("result") or {}
                if not result.get("ok"):
                    return result.get("error") or "staging failed"
        return None

    # ================================================================ helpers
    # Command-line names that 0.5.23 does not report in /server_info (measured): --config is merged before
    # ServerArgs exists; --cuda-graph-max-bs is an alias of the per-phase cuda_graph_max_bs_* fields.
    NOT_REPORTED_0523 = ("config", "cuda_graph_max_bs")

    def resolved_args(self) -> dict:
        d = self.server_args.resolved_dict()
        d.update(self.internal_overrides)
        if self.knobs.at_least(0, 5, 23):
            for key in self.NOT_REPORTED_0523:
                d.pop(key, None)
        return d

    def schedulers_alive(self) -> bool:
        return all(p.poll() is None for p, _n, _c in self.sched)

    def wait_schedulers_or_hang(self):
        """Without schedulers a request never completes (it hangs, as in SGLang)."""
        while not self.schedulers_alive():
            if self.exit_event.wait(1.0):
                return

    def flap_fail(self) -> bool:
        n = self.knobs.health_flap
        if n <= 0:
            return False
        with self._flap_lock:
            self._flap_count += 1
            return self._flap_count % n == 0

    def _mark_exited(self, pid):
        try:
            self.node.mark_exited(pid)
        except Exception:
            pass

    # ================================================================ layout
    def plan(self):
        """Local ranks, GPUs and memory sizes for this node."""
        sa, knobs = self.server_args, self.knobs
        visible = self.visible
        world = self.tp_size * self.pp_size
        if world % self.nnodes:
            raise ValueError(f"tp_size * pp_size ({world}) must be divisible by nnodes "
                             f"({self.nnodes}).")
        local = world // self.nnodes
        total_mib = self.ctx.gpu_total_mib
        static_mib = int(float(sa.mem_fraction_static) * total_mib)
        weights_mib, kv_per_token = _estimate_model(self.model_config, self.tp_size)
        weights_mib = int(min(max(weights_mib, 1024), 0.6 * static_mib))
        if self.spec.enabled and sa.speculative_draft_model_path not in (None, sa.model_path):
            weights_mib = int(min(weights_mib * 1.08, 0.65 * static_mib))
        kv_cache_mib = max(1, static_mib - weights_mib)
        max_total = int(kv_cache_mib * (1 << 20) // max(1, kv_per_token))
        if sa.max_total_tokens:
            max_total = min(max_total, int(sa.max_total_tokens))
        context = int(sa.context_length or self.model_config.get("max_position_embeddings") or 4096)
        self.max_total_num_tokens = max_total
        self.max_req_input_len = max(1, min(context - 1, max_total - 1))
        self.context_length = context
        self.mem = {"weights_mib": weights_mib, "kv_cache_mib": kv_cache_mib,
                    "kv_mib": kv_cache_mib + knobs.overhead_mib}
        ranks = []
        dp_groups = self.dp_size if not self._attn_dp() else 1
        for d in range(dp_groups):
            for i in range(local):
                tp_rank = self.node_rank * local + i
                slot = sa.base_gpu_id + (d * local + i) * sa.gpu_id_step
                gpu = visible[slot] if 0 <= slot < len(visible) else None  # -> invalid device ordinal
                prefix = ""
                if dp_groups > 1:
                    prefix += f" DP{d}"
                if self.pp_size > 1:
                    prefix += f" PP{tp_rank // self.tp_size}"
                if self.tp_size > 1:
                    prefix += f" TP{tp_rank % self.tp_size}"
                ranks.append({"dp_rank": d if dp_groups > 1 else None, "tp_rank": tp_rank,
                              "gpu": gpu, "prefix": prefix,
                              "title": "sglang::scheduler" + prefix.replace(" ", "_")})
        return ranks

    def _attn_dp(self) -> bool:
        sa = self.server_args
        return bool(sa.values.get("enable_dp_attention")) or (sa.values.get("attn_dp_size") or 1) > 1

    # ================================================================ children
    def spawn_children(self, ranks):
        sa, knobs = self.server_args, self.knobs
        common = {"ppid": os.getpid(), "log_level": sa.log_level, "log_ms": knobs.log_ms}
        for n, r in enumerate(ranks):
            payload = dict(common)
            payload.update({
                "title": r["title"], "log_prefix": r["prefix"], "tp_rank": r["tp_rank"],
                "gpu": r["gpu"], "arch": self.ctx.arch,
                "weights_mib": self.mem["weights_mib"], "kv_mib": self.mem["kv_mib"],
                "kv_cache_mib": self.mem["kv_cache_mib"], "overhead_mib": knobs.overhead_mib,
                "max_total_num_tokens": self.max_total_num_tokens,
                "max_req_input_len": self.max_req_input_len,
                "startup_s": knobs.startup_s, "hang_load": knobs.hang == "load",
                "crash_on_load": knobs.crash_on_load and n == 0,
                "crash_after_s": knobs.crash_after_s if n == 0 else -1,
                "shutdown_s": knobs.shutdown_s, "kill_release_s": knobs.kill_release_s,
                "stuck": knobs.stuck_memory,
                "cuda_graph": not (sa.disable_cuda_graph or False),
                "kv_alloc_s": self.sk.kv_alloc_s, "cuda_graph_s": self.sk.cuda_graph_s,
                "spec": self.spec.enabled,
                # scheduler rank 0 hosts the TCPStore on the NCCL port (entrypoints/ports.py)
                "store": self.port_plan.get("store") if r["tp_rank"] == 0 and r["dp_rank"] in (None, 0) else None,
                "port_linger_s": self.sk.port_linger_s,
                "v0523": knobs.at_least(0, 5, 23),
                "eagle3_without_draft": (knobs.at_least(0, 5, 23) and sa.speculative_algorithm == "EAGLE3"
                                         and not sa.speculative_draft_model_path),
                "store_wildcard": knobs.at_least(0, 5, 23) and not sa.values.get("dist_init_addr"),
                "chunked_prefill_size": sa.values.get("chunked_prefill_size") or 8192,
                "max_prefill_tokens": sa.values.get("max_prefill_tokens") or 16384,
                "max_running_requests": max(1, (sa.max_running_requests or 4096) // self.dp_size),
                "context_len": self.context_length,
                # What the loader opens: the checkpoint (and the draft's), checked at load (gpusim/checkpoint.py).
                "model_path": sa.model_path, "draft_model_path": sa.speculative_draft_model_path,
                "load_format": sa.values.get("load_format") or "auto",
            })
            proc, sock = utils.spawn_child(r["title"], "sglang.srt.managers.scheduler", payload)
            entry = (proc, f"scheduler_{n}", utils.JsonLines(sock))
            self.procs.append(entry)
            self.sched.append(entry)
        if self.node_rank == 0:
            payload = dict(common)
            payload.update({"title": "sglang::detokenizer", "log_prefix": ""})
            if self.port_plan.get("attn_dp"):
                payload["bind"] = [(self.port_plan["dist_init_host"],
                                    self.port_plan["derived"]["detokenizer_port"])]
            proc, sock = utils.spawn_child("sglang::detokenizer",
                                           "sglang.srt.managers.detokenizer_manager", payload)
            self.procs.append((proc, "detokenizer", utils.JsonLines(sock)))
        threading.Thread(target=self._reaper, name="reaper", daemon=True).start()

    def _reaper(self):
        seen = set()
        while True:
            for proc, _name, _chan in list(self.procs):
                if proc.pid in seen:
                    continue
                if proc.poll() is not None:
                    seen.add(proc.pid)
                    self._mark_exited(proc.pid)
            if len(seen) == len(self.procs) and self.exit_event.is_set():
                return
            time.sleep(0.05)

    def wait_for_ready(self):
        infos = []
        for i, (proc, _name, chan) in enumerate(self.sched):
            while True:
                try:
                    msg = chan.recv(timeout=0.5)
                except socket.timeout:
                    continue
                if msg is None:
                    logger.error("Rank %s scheduler is dead. Please check if there are "
                                 "relevant logs.", i)
                    proc.wait()
                    if proc.returncode != 0:
                        logger.error("Exit code: %s", proc.returncode)
                    raise EOFError()
                if msg.get("event") == "ready":
                    infos.append(msg)
                    break
        self.scheduler_infos = infos
        self.scheduler_info = dict(infos[0]) if infos else {}
        for key in ("event", "pid", "startup_time"):
            self.scheduler_info.pop(key, None)

    def kill_process_tree(self, include_parent=True):
        """utils/common.py:2507-2564: SIGKILL the descendants, reap, maybe self."""
        pid = os.getpid()
        if self.knobs.at_least(0, 5, 23):
            logger.info("kill_process_tree called: parent_pid=%s, include_parent=%s, pid=%s",
                        pid, include_parent, pid)
        victims = utils.descendants_of(pid)
        for child in victims:
            try:
                os.kill(child, signal.SIGKILL)
            except OSError:
                pass
        for proc, _name, _chan in self.procs:
            try:
                proc.wait(timeout=60)
            except Exception:
                pass
            self._mark_exited(proc.pid)
        utils.wait_gone(victims, 10.0)
        if include_parent:
            sys.stdout.flush()
            sys.stderr.flush()
            for h in logging.getLogger().handlers:
                try:
                    h.flush()
                except Exception:
                    pass
            os.kill(pid, signal.SIGKILL)
            time.sleep(10)

    # ================================================================ signals
    def _launch_phase_sigquit(self, signum, frame):
        logger.error("Received sigquit from a child process. It usually means the child failed.")
        self.kill_process_tree(include_parent=True)

    def _running_phase_sigquit(self, signum, frame):
        logger.error("SIGQUIT received. signum=None, frame=None. It usually means one child failed.")
        self._watchdog_stop.set()
        self.dump_requests_before_crash()
        self.kill_process_tree(include_parent=True)

    def _sigterm_dispatch(self, signum, frame):
        if self._handlers_installed:
            # loop.add_signal_handler calls the handler without arguments, so the
            # real line reads "signum=None frame=None" (tokenizer_manager.py:2453-2458).
            logger.warning("SIGTERM received. signum=None frame=None. Draining requests and "
                           "shutting down...")
            self.tokenizer_manager.gracefully_exit = True
        elif self.knobs.at_least(0, 5, 23):
            # No SGLang handler yet (0.5.23, measured): the process dies by the signal (status 143); the
            # children follow through PDEATHSIG.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
        else:
            # No SGLang handler yet: uvicorn owns SIGTERM; the ``finally`` of
            # launch_server SIGKILLs the children (§3.2).
            uvicorn_logger.info("INFO:     Shutting down")
            uvicorn_logger.info("INFO:     Waiting for application shutdown.")
            uvicorn_logger.info("INFO:     Application shutdown complete.")
            uvicorn_logger.info("INFO:     Finished server process [%s]", os.getpid())
            self._clean_exit_marker()
            self.exit_code = 0
            self.exit_event.set()

    def _install_running_handlers(self):
        """TokenizerManager installs SIGTERM/SIGQUIT handling on its first request."""
        if self._handlers_installed:
            return
        self._handlers_installed = True
        # SIGQUIT: signal.signal only works from the main thread; the main
        # loop swaps the handler (see run()).
        self._want_running_sigquit = True
        threading.Thread(target=self._sigterm_watchdog, name="sigterm-watchdog",
                         daemon=True).start()

    def _sigterm_watchdog(self):
        tm, knobs = self.tokenizer_manager, self.knobs
        while not tm.gracefully_exit:
            time.sleep(knobs.drain_poll_s)
        while True:
            with tm.lock:
                remaining = [rid for rid, st in tm.rid_to_state.items() if not st.health]
            if tm.server_status == ServerStatus.UnHealthy:
                logger.error("Signal SIGTERM received while health check failed. Force exiting.")
                break
            if knobs.force_shutdown:
                logger.error("Signal SIGTERM received while force shutdown flag set. Force exiting.")
                break
            logger.info("Gracefully exiting... Remaining number of requests %s. "
                        "Remaining requests remaining_rids=%s.", len(remaining), remaining)
            if remaining:
                time.sleep(knobs.drain_poll_s)
            else:
                break
        self._watchdog_stop.set()
        self._clean_exit_marker()
        if not knobs.at_least(0, 5, 23):
            # 0.4.6 - 0.5.10: kill_process_tree(own pid, include_parent=True) (§3.5)
            self.kill_process_tree(include_parent=True)
            return
        # 0.5.23: ShutdownReq, wait up to 15 s, then SIGKILL the rest.
        for _proc, _name, chan in self.sched:
            chan.send({"cmd": "shutdown"})
        if self.dist is not None:
            self.dist.broadcast_shutdown()
        deadline = time.monotonic() + knobs.scheduler_exit_timeout_s
        while time.monotonic() < deadline and any(p.poll() is None for p, _n, _c in self.sched):
            time.sleep(0.1)
        stragglers = [p.pid for p, _n, _c in self.sched if p.poll() is None]
        if stragglers:
            logger.warning("Schedulers still alive %ss after ShutdownReq, killing them before they released: %s",
                           int(knobs.scheduler_exit_timeout_s), stragglers)
        self.kill_process_tree(include_parent=False)
        self.exit_code = 0
        self.exit_event.set()

    # ================================================================ watchdog
    def _subprocess_watchdog(self):
        while not self._watchdog_stop.wait(self.knobs.watchdog_interval_s):
            for proc, name, _chan in self.procs:
                code = proc.poll()
                if code is None or code == 0:
                    continue
                logger.error("Subprocess %s (pid=%s) crashed with exit code %s. "
                             "Triggering SIGQUIT for cleanup...", name, proc.pid, code)
                os.kill(os.getpid(), signal.SIGQUIT)
                return

    # ================================================================ info
    def model_card(self) -> dict:
        name = self.weights.served_model_name
        return {"id": name, "object": "model", "created": int(time.time()),
                "owned_by": "sglang", "root": name, "parent": None,
                "max_model_len": self.context_length}

    def model_cards(self) -> list:
        """``/v1/models``: the base model, then the loaded LoRA adapters."""
        base = self.model_card()
        return [base] + self.lora.model_cards(base["id"], base["created"])

    def model_info(self) -> dict:
        sa, vt = self.server_args, self.knobs.vt
        info = {"model_path": sa.model_path, "tokenizer_path": sa.tokenizer_path,
                "is_generation": not sa.is_embedding}
        if vt >= (0, 4, 10):
            info["preferred_sampling_params"] = sa.preferred_sampling_params
        if vt >= (0, 5, 10):
            w = self.weights
            info = {"model_path": w.model_path, "served_model_name": w.served_model_name,
                    "tokenizer_path": sa.tokenizer_path, "is_generation": not sa.is_embedding,
                    "preferred_sampling_params": sa.preferred_sampling_params,
                    "weight_version": w.weight_version, "load_format": w.load_format,
                    "reasoning_parser": sa.reasoning_parser,
                    "tool_call_parser": sa.tool_call_parser,
                    "disaggregation_mode": sa.values.get("disaggregation_mode", "null"),
                    "has_image_understanding": False, "has_audio_understanding": False,
                    "model_type": self.model_config.get("model_type"),
                    "architectures": self.model_config.get("architectures")}
            if vt >= (0, 5, 23):
                info["embedding"] = self._embedding_info()
        return info

    def _memory_usage(self) -> dict:
        if not self.knobs.at_least(0, 5, 23):
            return {"weight": round(self.mem["weights_mib"] / 1024, 2),
                    "kvcache": round(self.mem["kv_cache_mib"] / 1024, 2),
                    "token_capacity": self.max_total_num_tokens,
                    "graph": round(self.knobs.overhead_mib / 1024, 2)}
        # 0.5.23 (measured): the memory at startup, SWA capacity, and the CUDA graphs' memory per phase.
        graph = dict.fromkeys(("prefill", "decode", "target_verify", "draft_prefill", "draft_decode",
                               "draft_extend"), 0.0)
        if not self.server_args.disable_cuda_graph:
            for phase in (("target_verify", "draft_decode", "draft_extend") if self.spec.enabled else ("decode",)):
                graph[phase] = round(self.knobs.overhead_mib / 1024 / (3 if self.spec.enabled else 1), 3)
        return {"weight": round(self.mem["weights_mib"] / 1024, 3),
                "kvcache": round(self.mem["kv_cache_mib"] / 1024, 3),
                "startup_available": round(self.ctx.gpu_total_mib / 1024, 3),
                "token_capacity": self.max_total_num_tokens, "token_capacity_swa": None,
                "graph": graph}

    def internal_states(self) -> list:
        tm = self.tokenizer_manager
        out = []
        avg = tm.avg_spec_accept_length()
        for _d in range(tm.dp_size):
            if self.knobs.at_least(0, 5, 23):
                st = self.resolved_args()
                st.update({"world_size": self.tp_size * self.pp_size,
                           "startup_time": (self.scheduler_infos[0].get("startup_time")
                                            if self.scheduler_infos else None),
                           "effective_max_running_requests_per_dp": tm.max_running_per_dp,
                           "last_gen_throughput": tm.last_gen_throughput,
                           "memory_usage": self._memory_usage()})
            else:
                st = {"last_gen_throughput": tm.last_gen_throughput,
                      "memory_usage": self._memory_usage()}
            if avg is not None:
                st["avg_spec_accept_length"] = avg
            out.append(st)
        return out

    def server_info(self) -> dict:
        info = self.resolved_args()
        vt = self.knobs.vt
        if vt >= (0, 5, 23):
            info["launch_command"] = self.server_args.launch_command
        info.update({"status": "ready",
                     "max_total_num_tokens": self.max_total_num_tokens,
                     "max_req_input_len": self.max_req_input_len})
        if vt >= (0, 5, 23):
            info["hicache_object_layout"] = None
            info["kv_events"] = None
        info["startup_time"] = self.startup_time if vt >= (0, 5, 23) else self.startup_seconds
        info["internal_states"] = self.internal_states()
        info["version"] = self.knobs.version
        if vt >= (0, 5, 23):
            info["frontend"] = "python"
        return info

    def loads(self, include_set=None) -> list:
        tm = self.tokenizer_manager
        include_all = include_set is None or "all" in include_set
        acc_len, acc_rate = tm.window_accept()
        out = []
        for d in range(tm.dp_size):
            used = tm.used_tokens(d)
            total = self.max_total_num_tokens
            load = {"timestamp": time.time(), "dp_rank": d,
                    "num_running_reqs": tm.running[d], "num_waiting_reqs": tm.waiting[d],
                    "num_waiting_uncached_tokens": 0, "num_used_tokens": used,
                    "num_total_tokens": used, "num_active_tokens": used,
                    "num_prealloc_ready_tokens": 0, "max_total_num_tokens": total,
                    "max_running_requests": tm.max_running_per_dp,
                    "token_usage": round(used / float(max(1, total)), 4),
                    "gen_throughput": tm.gen_throughput() / tm.dp_size,
                    "cache_hit_rate": 0.0,
                    "utilization": round(tm.running[d] / float(tm.max_running_per_dp), 4),
                    "total_prefill_uncached_tokens": tm.prompt_tokens_total,
                    "total_prefill_busy_us": 0,
                    # load_inquirer.get_decode_moment_totals: six running totals once a decode step ran (None
                    # before); the simulator gives the step count and no timings.
                    "decode_moments": (
                        [float(tm.decode_steps_total)] * 2 + [0.0, float(tm.decode_steps_total), 0.0,
                                                              float(tm.decode_steps_total)]
                        if tm.decode_steps_total > 0 else None)}
            if include_set == {"core"}:
                out.append(load)
                continue
            if include_all or "memory" in include_set:
                load["memory"] = {"weight_gb": round(self.mem["weights_mib"] / 1024, 2),
                                  "kv_cache_gb": round(self.mem["kv_cache_mib"] / 1024, 2),
                                  "graph_gb": round(self.knobs.overhead_mib / 1024, 2),
                                  "token_capacity": total}
            if self.spec.enabled and (include_all or "spec" in include_set):
                load["speculative"] = {"accept_length": acc_len, "accept_rate": acc_rate}
            if include_all or "disagg" in include_set:
                q = self.pd.queue_depths() if (self.pd is not None and d == 0) else {}
                load["disaggregation"] = {
                    "mode": self.disagg_mode(),
                    "prefill_bootstrap_queue_reqs": q.get("prefill_bootstrap", 0),
                    "prefill_inflight_queue_reqs": q.get("prefill_inflight", 0),
                    "decode_prealloc_queue_reqs": q.get("decode_prealloc", 0),
                    "decode_transfer_queue_reqs": q.get("decode_transfer", 0),
                    "decode_retracted_queue_reqs": 0,
                    "kv_transfer_speed_gb_s": 0.0, "kv_transfer_latency_ms": 0.0}
            if include_all or "queues" in include_set:
                load["queues"] = {"waiting": tm.waiting[d], "grammar": 0, "paused": 0,
                                  "retracted": 0, "prealloc_ready": 0}
            out.append(load)
        return out

    # ================================================================ startup
    def _set_startup_time(self):
        """Engine._set_startup_time (0.5.23): critical path over the schedulers plus
        tokenizer_e2e, the "Engine startup timings (s): ..." line and the gauges."""
        agg = {"load_weight": 0.0, "kv_cache_allocation": 0.0, "scheduler_e2e": 0.0,
               "cuda_graph": {}}
        from sglang.srt.managers.scheduler import GRAPH_PHASES

        agg["cuda_graph"] = dict.fromkeys(GRAPH_PHASES, 0.0)
        for info in self.scheduler_infos:
            st = info.get("startup_time") or {}
            for key in ("load_weight", "kv_cache_allocation", "scheduler_e2e"):
                agg[key] = max(agg[key], float(st.get(key, 0.0)))
            for phase, dur in (st.get("cuda_graph") or {}).items():
                agg["cuda_graph"][phase] = max(agg["cuda_graph"].get(phase, 0.0), float(dur))
        agg["tokenizer_e2e"] = time.time() - self.start_time
        self.startup_time = agg
        self.tokenizer_manager.startup_time = agg
        if self.knobs.at_least(0, 5, 23):
            logger.info("Engine startup timings (s): load_weight=%.2f, kv_cache_allocation=%.2f, "
                        "scheduler_e2e=%.2f, cuda_graph={%s}, tokenizer_e2e=%.2f",
                        agg["load_weight"], agg["kv_cache_allocation"], agg["scheduler_e2e"],
                        ", ".join("%s=%.2f" % kv for kv in agg["cuda_graph"].items()),
                        agg["tokenizer_e2e"])

    def _check_previous_stop(self):
        """sglang#22779 model: was the last server on this port stopped uncleanly?

        A marker ``<state_dir>/server-<port>.json`` (pid, start time) lives while
        the server runs; a clean exit removes it.  Finding one whose process is
        gone means the previous server died without its shutdown (SIGKILL, a
        crash): then SGLANG_SIM_HANG_AFTER_REQUESTS applies (with
        SGLANG_SIM_HANG_WHEN=unclean, the default; ``always`` ignores the marker).
        """
        sk, tm = self.sk, self.tokenizer_manager
        if sk.state_dir:
            self.marker_path = os.path.join(sk.state_dir, "server-%s.json" % self.server_args.port)
            try:
                with open(self.marker_path) as fh:
                    old = json.load(fh)
                self.after_unclean = utils.process_starttime(int(old.get("pid", 0))) != old.get("starttime")
            except (OSError, ValueError, TypeError):
                self.after_unclean = False
            try:
                os.makedirs(sk.state_dir, exist_ok=True)
                tmp = self.marker_path + ".%d.tmp" % os.getpid()
                with open(tmp, "w") as fh:
                    json.dump({"pid": os.getpid(), "starttime": utils.process_starttime(os.getpid())}, fh)
                os.replace(tmp, self.marker_path)
            except OSError:
                self.marker_path = None
        if sk.hang_after_requests and (sk.hang_when == "always" or self.after_unclean):
            tm.hang_after = sk.hang_after_requests

    def _clean_exit_marker(self):
        if self.marker_path:
            try:
                os.unlink(self.marker_path)
            except OSError:
                pass

    # ================================================================ run
    def run(self) -> int:
        sa, knobs = self.server_args, self.knobs
        if knobs.at_least(0, 5, 23) and sa.tp_size is not None and int(sa.tp_size) < 1:
            # Resolution accepts --tp-size 0; the engine then indexes its empty list of scheduler ranks
            # (measured: IndexError, status 1, no child started).
            raise IndexError("list index out of range")
        ranks = self.plan()
        # PortArgs.init_new's checks come before anything binds (the rendezvous included)
        self.port_plan = ports.plan(sa)
        if self.node_rank == 0:
            ports.wait_available(self.port_plan, self.nnodes)
        if sa.nnodes > 1:
            from sglang.srt.entrypoints.dist import DistClient, DistServer

            if not sa.dist_init_addr:
                raise ValueError("--dist-init-addr is required when --nnodes > 1.")
            if self.node_rank == 0:
                self.dist = DistServer(sa.dist_init_addr, self.nnodes)
            else:
                self.dist = DistClient(sa.dist_init_addr, self.node_rank, knobs.dist_timeout_s,
                                       on_shutdown=self._remote_shutdown)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGQUIT, self._launch_phase_sigquit)
        for _name, host, port in ports.main_process_ports(self.port_plan, self.nnodes, self.node_rank):
            self.main_sockets.append(ports.listen(host, port))
        if knobs.at_least(0, 5, 23):
            # The real main process starts its children through multiprocessing (spawn), which starts
            # multiprocessing's resource_tracker: a third child, "python -B -c 'from
            # multiprocessing.resource_tracker import main;main(N)'", in the same session and process group; it
            # exits when the main process is gone (measured on the real server).
            from multiprocessing import resource_tracker

            resource_tracker.ensure_running()
        self.spawn_children(ranks)
        if self.node_rank >= 1:
            return self._run_follower()
        self.wait_for_ready()
        if self.dist is not None:
            self.dist.wait_ready(knobs.dist_timeout_s, alive=self.schedulers_alive)
        self.startup_seconds = round(time.time() - self.start_time, 3)
        self.tokenizer_manager = tm = TokenizerManager(
            sa, knobs, self.model_config, self.spec, self.dp_size, self.max_total_num_tokens)
        tm.first_request_hook = self._install_running_handlers
        tm.schedulers_alive = self.schedulers_alive
        self._set_startup_time()
        if self.pd is not None:
            self.pd.start_bootstrap_server()
        from sglang.srt.entrypoints.http_server import make_http_server

        try:
            if knobs.port_in_use:
                raise OSError(98, "Address already in use")
            self.http = make_http_server(self, sa.host, sa.port)
        except OSError as e:
            errno = e.errno if e.errno is not None else 98
            if knobs.at_least(0, 5, 23):
                return self._bind_failed(errno, e)
            uvicorn_logger.error("ERROR:    [Errno %s] error while attempting to bind on address (%r, %s): %s",
                                 errno, sa.host, sa.port, "address already in use" if errno == 98 else e.strerror)
            self.kill_process_tree(include_parent=False)
            return 1
        signal.signal(signal.SIGTERM, self._sigterm_dispatch)
        self._check_previous_stop()
        threading.Thread(target=self.http.serve_forever, kwargs={"poll_interval": 0.1},
                         name="http", daemon=True).start()
        uvicorn_logger.info("INFO:     Started server process [%s]", os.getpid())
        uvicorn_logger.info("INFO:     Waiting for application startup.")
        uvicorn_logger.info("INFO:     Application startup complete.")
        uvicorn_logger.info("INFO:     Uvicorn running on %s://%s:%s (Press CTRL+C to quit)",
                            "https" if sa.ssl_certfile else "http", sa.host, sa.port)
        if knobs.at_least(0, 5, 10):
            threading.Thread(target=self._subprocess_watchdog, name="subprocess-watchdog",
                             daemon=True).start()
        threading.Thread(target=self._warmup, name="warmup", daemon=True).start()
        while not self.exit_event.wait(0.1):
            if self._want_running_sigquit:
                self._want_running_sigquit = False
                signal.signal(signal.SIGQUIT, self._running_phase_sigquit)
        self._watchdog_stop.set()
        try:
            self.http.shutdown()
            self.http.server_close()
        except Exception:
            pass
        return self.exit_code

    def _warmup(self, kill_on_error=True):
        sa, knobs, tm = self.server_args, self.knobs, self.tokenizer_manager
        if sa.skip_server_warmup:
            tm.server_status = ServerStatus.Up
            if knobs.at_least(0, 5, 23):
                # _wait_and_warmup: the ready line and the checkpoint deletion run
                # with --skip-server-warmup too
                logger.info("The server is fired up and ready to roll!")
                self._maybe_delete_checkpoint()
            return
        time.sleep(knobs.warmup_s)
        if knobs.hang == "warmup":
            return  # SGLANG_SIM_HANG=warmup: never becomes healthy
        import http.client

        host = "127.0.0.1" if sa.host in ("0.0.0.0", "", None) else sa.host
        if host == "::":
            host = "::1"
        headers = {"Content-Type": "application/json"}
        if sa.api_key:
            headers["Authorization"] = f"Bearer {sa.api_key}"
        try:
            # Like the real warmup: poll the model info, then one short generate.
            # /model_info with a 5 s timeout as the real warmup polls it, then the generate with a long one
            if sa.ssl_certfile:   # like the real warmup over https: the server's own certificate is not checked
                import ssl
                conn = http.client.HTTPSConnection(host, sa.port, timeout=5, context=ssl._create_unverified_context())
            else:
                conn = http.client.HTTPConnection(host, sa.port, timeout=5)
            path = "/model_info" if knobs.at_least(0, 5, 10) else "/get_model_info"
            for method, url, body in ((
                    "GET", path, None),
                    ("POST", "/generate", json.dumps({
                        "text": "The capital city of France is",
                        "sampling_params": {"temperature": 0, "max_new_tokens": 8}}))) + ((
                    ("POST", "/freeze_gc", None),) if knobs.at_least(0, 5, 23) else ()):
                conn.request(method, url, body=body, headers=headers)
                resp = conn.getresponse()
                resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"{method} {url} returned {resp.status}")
                conn.sock.settimeout(120)
            conn.close()
        except Exception as e:
            logger.error("Initialization failed. warmup error: %r", e)
            if kill_on_error:
                self.kill_process_tree(include_parent=True)
            return
        tm.server_status = ServerStatus.Up
        logger.info("The server is fired up and ready to roll!")
        self._maybe_delete_checkpoint()

    def _maybe_delete_checkpoint(self):
        """--delete-ckpt-after-loading: utils/common.py delete_directory(model_path),
        a shutil.rmtree of the whole model directory after the ready line."""
        sa = self.server_args
        if not sa.values.get("delete_ckpt_after_loading"):
            return
        import shutil

        try:
            shutil.rmtree(sa.model_path)
        except OSError as e:
            logger.warning("Failed to delete directory %s: %s", sa.model_path, e.strerror)

    # ================================================================ followers
    def _remote_shutdown(self):
        """Rank 0 broadcast the ShutdownReq: stop the local schedulers."""
        for _proc, _name, chan in self.sched:
            chan.send({"cmd": "shutdown"})

    def _follower_sigterm(self, signum, frame):
        logger.warning("SIGTERM received on node_rank %s; waiting for the rank-0 "
                       "ShutdownReq broadcast to stop the schedulers.", self.node_rank)

    def _run_follower(self) -> int:
        sa, knobs = self.server_args, self.knobs
        self.dist.connect()
        self.wait_for_ready()
        self.dist.send_ready()
        if knobs.at_least(0, 5, 23):
            signal.signal(signal.SIGTERM, self._follower_sigterm)
        from sglang.srt.entrypoints.http_server import make_dummy_health_server

        try:
            self.http = make_dummy_health_server(self, sa.host, sa.port)
            threading.Thread(target=self.http.serve_forever, kwargs={"poll_interval": 0.1},
                             name="health-check-server", daemon=True).start()
            logger.info("Dummy health check server started in background thread at %s:%s", sa.host, sa.port)
        except OSError as e:
            logger.error("Dummy health check server failed to start: %s", e)
        # block_until_scheduler_exits
        while any(p.poll() is None for p, _n, _c in self.sched):
            time.sleep(0.1)
        self.exit_event.set()
        if self.http is not None:
            logger.info("Dummy health check server stopped at %s:%s", sa.host, sa.port)
        return 0
