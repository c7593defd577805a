"""Scheduler child process (``sglang::scheduler[_DP<d>][_TP<n>]``).

Started by the main process with ``utils.spawn_child`` (argv == [title]).
It holds the simulated GPU memory of its TP rank through ``gpusim``
(docs/reference/sglang-processes.md, Process tree: "They hold the GPU memory"), in two steps like the real
loader: weights first, then the KV cache plus CUDA graphs/context.  Protocol
with the parent (JSON lines over an inherited socketpair):

* child -> parent ``{"event": "ready", ...}`` once loaded;
* parent -> child ``{"cmd": "shutdown"}`` (the 0.5.23 ShutdownReq): the
  scheduler waits ``SGLANG_SIM_SHUTDOWN_S``, releases its holds
  (``node.release``, a graceful cudaFree) and exits 0.

On an exception it logs "Scheduler hit an exception: <traceback>" and sends
SIGQUIT to its parent (scheduler.py:6360-6373).  It calls
prctl(PR_SET_PDEATHSIG, SIGKILL) first, so it dies with the main process.
"""
from __future__ import annotations

import json
import logging
import os
import resource
import signal
import socket
import sys
import time
import traceback

from gpusim.checkpoint import load_problem
from sglang.srt import utils

logger = logging.getLogger("sglang.srt.managers.scheduler")


class OutOfMemoryError(RuntimeError):
    """Stand-in for ``torch.OutOfMemoryError`` (prints as such in tracebacks)."""


OutOfMemoryError.__module__ = "torch"
OutOfMemoryError.__qualname__ = "OutOfMemoryError"


def get_exception_traceback() -> str:
    etype, value, tb = sys.exc_info()
    return "".join(traceback.format_exception(etype, value, tb))


def _gib(mib: float) -> float:
    return mib / 1024.0


class ModelRunner:
    """Loads the 'model': registers GPU memory with the simulated node."""

    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.gpu_id = cfg["gpu"]
        self.holds = []
        self.dev_files = []
        from gpusim.node import Node

        self.node = Node.from_env()

    def _free_mib(self) -> int:
        for g in self.node.gpus():
            if g["index"] == self.gpu_id:
                return int(g["free_mib"])
        # base_gpu_id + rank beyond CUDA_VISIBLE_DEVICES
        raise RuntimeError("CUDA error: invalid device ordinal\nCUDA kernel errors might be "
                           "asynchronously reported at some other API call, so the stacktrace "
                           "below might be incorrect.")

    def _allocate(self, mib: int) -> None:
        from gpusim.node import OutOfMemory

        try:
            hid = self.node.hold(os.getpid(), [self.gpu_id], int(mib),
                                 release_delay=self.cfg["kill_release_s"],
                                 stuck=self.cfg["stuck"])
        except OutOfMemory as e:
            others = []
            for h in self.node.holds():
                if h.get("listed") and self.gpu_id in h.get("gpus", ()) and h.get("pid"):
                    others.append("Process %d has %.2f GiB memory in use."
                                  % (h["pid"], _gib(h["mib"])))
            raise OutOfMemoryError(
                "CUDA out of memory. Tried to allocate %.2f GiB. GPU %d has a total capacity of "
                "%.2f GiB of which %.2f GiB is free. %s Of the allocated memory 0 bytes is "
                "allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. If "
                "reserved but unallocated memory is large try setting "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
                "documentation for Memory Management  "
                "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
                % (_gib(e.requested_mib), self.gpu_id, _gib(e.total_mib), _gib(e.free_mib),
                   " ".join(others) or "")) from None
        self.holds.append(hid)

    def _open_device_files(self) -> None:
        # A CUDA process keeps /dev/nvidia<N>, /dev/nvidiactl and /dev/nvidia-uvm open.
        for name in ("nvidia%d" % self.gpu_id, "nvidiactl", "nvidia-uvm"):
            path = os.path.join(self.node.dev_dir, name)
            try:
                self.dev_files.append(open(path, "rb"))
            except OSError:
                pass

    def load_model(self) -> None:
        cfg = self.cfg
        avail = self._free_mib()  # raises "invalid device ordinal" for a missing GPU
        self._open_device_files()
        logger.info("Load weight begin. avail mem=%.2f GB", _gib(avail))
        self._allocate(cfg["weights_mib"])
        for path in (cfg.get("model_path"), cfg.get("draft_model_path")):
            # The loader opens the shards the index names: a missing or truncated one fails the load, naming it
            # (a directory without any safetensors is tolerated here; the preflight refuses it).
            problem = load_problem(path, cfg.get("load_format") or "auto") if path else None
            if problem:
                raise RuntimeError("Failed to load the checkpoint %s: %s" % (path, problem))
        if cfg["crash_on_load"]:
            # A load that fails does so at its end, after the load time (SGLANG_SIM_STARTUP_S): the other ranks of a
            # multi-node group have joined by then, as on a real node where loading takes minutes.
            time.sleep(cfg["startup_s"])
            raise RuntimeError(
                "Error(s) in loading state_dict for %s: size mismatch for "
                "model.layers.0.self_attn.qkv_proj.weight (SGLANG_SIM_CRASH_ON_LOAD)"
                % cfg["arch"])
        if cfg["hang_load"]:
            while True:  # SGLANG_SIM_HANG=load: stuck in the loader, never ready
                time.sleep(3600)
        tic = time.perf_counter()
        time.sleep(cfg["startup_s"])
        if cfg.get("v0523"):
            logger.info("Load weight end. elapsed=%.2f s, type=%s, avail mem=%.2f GB, mem usage=%.2f GB.",
                        time.perf_counter() - tic, cfg['arch'], _gib(self._free_mib()), _gib(cfg['weights_mib']))
        else:
            logger.info(
                "Load weight end. type=%s, dtype=torch.bfloat16, avail mem=%.2f GB, mem usage=%.2f GB.",
                cfg['arch'], _gib(self._free_mib()), _gib(cfg['weights_mib']))

    def init_memory_pool(self) -> None:
        cfg = self.cfg
        self._allocate(cfg["kv_mib"])
        time.sleep(cfg.get("kv_alloc_s", 0.0))
        kv_gb = _gib(cfg["kv_cache_mib"]) / 2
        if cfg.get("v0523"):
            logger.info("KV Cache is allocated. dtype: torch.bfloat16, #tokens: %s, K size: %.2f GB, V size: %.2f GB",
                        cfg['max_total_num_tokens'], kv_gb, kv_gb)
        else:
            logger.info("KV Cache is allocated. #tokens: %s, K size: %.2f GB, V size: %.2f GB",
                        cfg['max_total_num_tokens'], kv_gb, kv_gb)
        logger.info("Memory pool end. avail mem=%.2f GB", _gib(self._free_mib()))
        if cfg.get("v0523"):
            logger.info("max_total_num_tokens=%s, chunked_prefill_size=%s, max_prefill_tokens=%s, "
                        "max_running_requests=%s, context_len=%s, available_gpu_mem=%.2f GB",
                        cfg['max_total_num_tokens'], cfg.get('chunked_prefill_size'), cfg.get('max_prefill_tokens'),
                        cfg.get('max_running_requests'), cfg.get('context_len'), _gib(self._free_mib()))

    def release(self) -> None:
        for hid in self.holds:
            self.node.release(hid)
        self.holds = []

    def temporary_hold(self, mib: int) -> dict:
        """Allocate and free ``mib`` (a weight update's staging buffer); reports an OOM."""
        if mib <= 0:
            return {"ok": True}
        try:
            self._allocate(mib)
        except OutOfMemoryError as e:
            return {"ok": False, "error": "torch.OutOfMemoryError: %s" % e}
        hid = self.holds.pop()
        self.node.release(hid)
        return {"ok": True}


GRAPH_PHASES = ("prefill", "decode", "target_verify", "draft_prefill", "draft_decode", "draft_extend")


def bind_store(cfg):
    """Rank 0's torch.distributed TCPStore on the NCCL port (tcp://--host:nccl_port)."""
    store = cfg.get("store")
    if not store:
        return None
    from sglang.srt.entrypoints.ports import listen

    host, port = store[0], int(store[1])
    if cfg.get("store_wildcard"):
        # 0.5.23: torch's TCPStore listens on every interface, whatever --host says (measured on the real server).
        host = "::" if ":" in host else "0.0.0.0"
    try:
        return listen(host, port)
    except OSError as e:
        raise DistNetworkError(
            "The server socket has failed to listen on any local network address. "
            "port: %d, useIPv6: %d, code: -%d, name: EADDRINUSE, message: address already in use"
            % (port, int(":" in host), e.errno or 98)) from None


class DistNetworkError(RuntimeError):
    """Stand-in for ``torch.distributed.DistNetworkError``."""


DistNetworkError.__module__ = "torch.distributed"


def start_port_keeper(socks, linger_s, chan):
    """SGLANG_SIM_PORT_LINGER_S: a forked child that inherits the listening sockets.

    It has no PDEATHSIG (fork resets it) and stays in the server's session and
    process group.  When its scheduler is killed it is re-parented and keeps
    the ports ``linger_s`` more seconds, like a scheduler leftover that a tree
    walk from the main PID misses (sglang#16756, #31645).  A scheduler that
    exits gracefully kills it first.  It holds no GPU memory or device file.
    """
    pid = os.fork()
    if pid:
        return pid
    try:
        try:
            chan.sock.close()
        except OSError:
            pass
        keep = {s.fileno() for s in socks}
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        for fd in _open_fds():
            if fd > 2 and fd not in keep and fd != devnull:
                try:
                    os.close(fd)
                except OSError:
                    pass
        parent = os.getppid()
        while os.getppid() == parent:
            time.sleep(0.1)
        time.sleep(linger_s)
    finally:
        os._exit(0)


def _open_fds():
    try:
        return [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        return []


class Scheduler:
    def __init__(self, cfg: dict, chan=None):
        self.cfg = cfg
        self.store = bind_store(cfg)
        self.keeper_pid = None
        if self.store is not None and cfg.get("port_linger_s", 0) > 0 and chan is not None:
            self.keeper_pid = start_port_keeper([self.store], cfg["port_linger_s"], chan)
        tic = time.perf_counter()
        self.model_runner = ModelRunner(cfg)
        self.model_runner.load_model()
        load_weight = time.perf_counter() - tic
        if cfg.get("eagle3_without_draft"):
            # EAGLE3 with no draft model (0.5.23, measured): the draft worker reads the target's hot-token map.
            raise AttributeError("'%s' object has no attribute 'hot_token_id'" % cfg["arch"])
        tic_kv = time.perf_counter()
        self.model_runner.init_memory_pool()
        kv_alloc = time.perf_counter() - tic_kv
        graphs = dict.fromkeys(GRAPH_PHASES, 0.0)
        if cfg.get("cuda_graph"):
            logger.info("Capture cuda graph begin. This can take up to several minutes. avail mem=%.2f GB",
                        _gib(self.model_runner._free_mib()))
            tic_graph = time.perf_counter()
            time.sleep(cfg.get("cuda_graph_s", 0.0))
            elapsed = time.perf_counter() - tic_graph
            logger.info("Capture cuda graph end. Time elapsed: %.2f s. mem usage=%.2f GB. avail mem=%.2f GB.",
                        elapsed, _gib(cfg['overhead_mib']), _gib(self.model_runner._free_mib()))
            # speculation: the target captures verify graphs, the draft its own
            for phase in (("target_verify", "draft_decode", "draft_extend") if cfg.get("spec")
                          else ("decode",)):
                graphs[phase] = elapsed
        # build_scheduler_startup_time (observability/startup_time.py)
        self.startup_time = {"load_weight": load_weight, "kv_cache_allocation": kv_alloc,
                             "scheduler_e2e": time.perf_counter() - cfg.get("t_start", tic),
                             "cuda_graph": graphs}

    def get_init_info(self) -> dict:
        cfg = self.cfg
        return {"event": "ready", "status": "ready", "pid": os.getpid(),
                "max_total_num_tokens": cfg["max_total_num_tokens"],
                "max_req_input_len": cfg["max_req_input_len"],
                "startup_time": self.startup_time}

    def run_event_loop(self, chan) -> None:
        cfg = self.cfg
        crash_at = None
        if cfg.get("crash_after_s", -1) >= 0:
            crash_at = time.monotonic() + cfg["crash_after_s"]
        while True:
            timeout = 0.5
            if crash_at is not None:
                timeout = max(0.0, min(timeout, crash_at - time.monotonic()))
            try:
                msg = chan.recv(timeout=timeout)
            except socket.timeout:
                msg = {}
            if crash_at is not None and time.monotonic() >= crash_at:
                self._hard_crash()
            if msg is None:
                # The parent closed its end: it is exiting.  PDEATHSIG normally
                # kills us first; leave without a graceful release.
                os._exit(0)
            if msg.get("cmd") == "shutdown":
                time.sleep(cfg["shutdown_s"])  # SGLANG_SIM_SHUTDOWN_S
                self.model_runner.release()
                self.stop_keeper()
                return
            if msg.get("cmd") == "hold":
                self.reply(chan, msg, self.model_runner.temporary_hold(int(msg["mib"])))
            if msg.get("cmd") == "load_fail":
                # update_weights_from_disk: the loader raises inside load_weights (a tensor of another shape);
                # run_scheduler_process logs it, SIGQUITs the main process and returns.
                raise RuntimeError(msg["error"])

    def reply(self, chan, msg, result):
        chan.send({"event": "reply", "id": msg.get("id"), "result": result})

    def stop_keeper(self):
        if self.keeper_pid:
            try:
                os.kill(self.keeper_pid, signal.SIGKILL)
                os.waitpid(self.keeper_pid, 0)
            except OSError:
                pass
            self.keeper_pid = None

    def _hard_crash(self) -> None:
        # SGLANG_SIM_CRASH_AFTER_S: a C++-level failure (NCCL watchdog ->
        # std::terminate) that no Python handler sees: the process dies by
        # SIGABRT and only the SubprocessWatchdog (0.5.10+) notices (§3.3).
        logger.error("[PG ID 0 PG GUID 0(default_pg) Rank %d] Watchdog caught collective "
                     "operation timeout: WorkNCCL(SeqNum=42, OpType=ALLREDUCE) ran for 600000 "
                     "milliseconds before timing out. (SGLANG_SIM_CRASH_AFTER_S)",
                     self.cfg["tp_rank"])
        sys.stderr.flush()
        try:
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        except (ValueError, OSError):
            pass
        signal.signal(signal.SIGABRT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGABRT)
        time.sleep(5)
        os._exit(134)


def child_bootstrap():
    """Common start of every child: PDEATHSIG, parent check, title, logging, channel."""
    utils.kill_itself_when_parent_died()
    cfg = json.loads(os.environ.pop("SGLANG_SIM_CHILD"))
    fd = int(os.environ.pop("SGLANG_SIM_CHILD_FD"))
    if os.getppid() != cfg["ppid"]:
        os._exit(1)  # the parent died before PDEATHSIG was armed
    utils.set_process_name(cfg["title"])
    utils.configure_logger(cfg.get("log_level", "info"), cfg.get("log_prefix", ""),
                           cfg.get("log_ms", False))
    sock = socket.socket(fileno=fd)
    return cfg, utils.JsonLines(sock)


def run_scheduler_process():
    t_start = time.perf_counter()
    cfg, chan = child_bootstrap()
    cfg["t_start"] = t_start
    scheduler = None
    try:
        scheduler = Scheduler(cfg, chan)
        chan.send(scheduler.get_init_info())
        scheduler.run_event_loop(chan)
    except Exception:
        tb = get_exception_traceback()
        logger.error("Scheduler hit an exception: %s", tb)
        if scheduler is not None:
            scheduler.stop_keeper()
        try:
            os.kill(cfg["ppid"], signal.SIGQUIT)
        except OSError:
            pass
        # Like the real process function, return normally after signalling.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    run_scheduler_process()
