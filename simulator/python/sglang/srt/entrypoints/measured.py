"""What the real SGLang 0.5.23 server does, measured on it (tests/real_server, the conformance suite), for the
simulated engine: the ``embedding`` section of /model_info, the crash diagnostics, an update that kills the
schedulers, the port-conflict loser, and the metric families the older simulator lacked. A mixin of
:class:`sglang.srt.entrypoints.engine.Engine` (simulator/README.md, "Conformance with the real server")."""
from __future__ import annotations

import logging
import os
import shutil
import threading
import time

logger = logging.getLogger("sglang.srt.entrypoints.engine")
uvicorn_logger = logging.getLogger("uvicorn.error")


class Measured0523(object):
    def _embedding_info(self) -> dict:
        """0.5.23's ``embedding`` section of /model_info, as the real server answers it for a generative
        model (measured); the simulator serves no embedding models."""
        sizes = [4, 8, 12, 16, 20, 24, 28, 32, 48, 64, 80, 96, 112, 128] + list(range(144, 257, 16)) + \
            list(range(288, 513, 32)) + list(range(576, 1025, 64)) + list(range(1280, 4097, 256))
        return {"family": "none", "task": "none", "execution": "none", "attention": "none",
                "pooling": "model_defined", "normalize": False, "postprocessor": "none",
                "tokenizer_special_tokens": "model_default", "supports_dimensions": False,
                "supports_token_embeddings": False, "supports_multimodal": False, "requires_embedding_flag": False,
                "auto_enable_embedding": False, "bcg_eligibility": "disabled", "safe_disable_kv_cache": False,
                "safe_disable_radix_cache": False, "safe_disable_chunked_prefill": False, "enabled": False,
                "matryoshka_dimensions": [],
                "bcg": {"prefill_backend": "disabled", "enabled": False, "capture_token_budget": 4096,
                        "capture_batch_sizes": sizes},
                "cache": {"kv_cache_disabled": False, "radix_cache_disabled": False,
                          "chunked_prefill_disabled": False}}

    def crash_schedulers(self, error):
        """A failure inside every scheduler's loader (an update with tensors of other shapes): each raises, logs
        "Scheduler hit an exception", SIGQUITs this process and exits; the crash handling takes the tree down.
        The calling request thread never returns (the real HTTP request gets no answer)."""
        with self._chan_lock:
            for _proc, _name, chan in self.sched:
                try:
                    chan.send({"cmd": "load_fail", "error": error})
                except OSError:
                    pass
        while True:
            time.sleep(3600)

    def dump_requests_before_crash(self):
        """TokenizerManager.dump_requests_before_crash (0.5.23), the part that runs without a crash-dump folder:
        py-spy and CUDA coredumps of the schedulers (SGLANG_PYSPY_DUMP_BEFORE_CRASH, SGLANG_CUDA_COREDUMP_BEFORE_CRASH,
        both on by default) after a 5 s sleep; with a scheduler still alive, the coredump wait
        (SGLANG_CUDA_COREDUMP_BEFORE_CRASH_WAIT_SECS, 60 s). Meanwhile the port stays open and nothing answers."""
        if not self.knobs.at_least(0, 5, 23):
            return
        pyspy = self.sk.pyspy_dump_before_crash
        coredump = self.sk.cuda_coredump_before_crash
        if not (pyspy or coredump):
            return
        if self._crash_dump_performed:
            logger.info("SIGTERM/SIGQUIT/Exception triggered, but crash dump already performed, skipping.")
            return
        self._crash_dump_performed = True
        self.crashing = True  # the real handler blocks the event loop: the port listens, nothing answers
        logger.info("Sleeping 5 seconds before crash diagnostics to let GPU activity settle.")
        time.sleep(5)
        live = [p.pid for p, _n, _c in self.sched if p.poll() is None]
        if live:
            if pyspy and shutil.which("py-spy") is None:
                # the real lines where py-spy (an SGLang dependency) is not on PATH, as on the CPU test machine
                for pid in live:
                    for native in ("--native ", " "):
                        logger.error("Pyspy failed (py-spy dump %s--pid %s). Error: /bin/sh: 1: py-spy: not found\n",
                                     native, pid)
                    logger.error("All pyspy dump attempts failed for PID %s.", pid)
            if coredump and os.environ.get("CUDA_ENABLE_USER_TRIGGERED_COREDUMP") != "1":
                logger.error("CUDA user-triggered coredump is not enabled. Set CUDA_ENABLE_USER_TRIGGERED_COREDUMP=1 "
                             "before CUDA initialization.")
            if coredump and self.sk.cuda_coredump_wait_s > 0:
                logger.info("Waiting %.1f seconds for CUDA coredumps before exiting.", self.sk.cuda_coredump_wait_s)
                time.sleep(self.sk.cuda_coredump_wait_s)
        else:
            logger.error("No live scheduler processes found; skipping py-spy and CUDA coredump.")

    def _bind_failed(self, errno, exc) -> int:
        """0.5.23 (measured): uvicorn binds only after the whole startup, and the warmup thread started before
        it polls the port: with another server there, the warmup's requests reach *that* server, so the loser
        logs "fired up" too, then ends with uvicorn's startup failure (status 3) and SIGKILLs its children."""
        sa = self.server_args
        uvicorn_logger.info("INFO:     Started server process [%s]", os.getpid())
        uvicorn_logger.info("INFO:     Waiting for application startup.")
        uvicorn_logger.info("INFO:     Application startup complete.")
        warmup = threading.Thread(target=self._warmup, kwargs={"kill_on_error": False}, name="warmup", daemon=True)
        warmup.start()
        uvicorn_logger.error("ERROR:    [Errno %s] error while attempting to bind on address (%r, %s): %s",
                             errno, sa.host, sa.port, "address already in use" if errno == 98 else exc.strerror)
        uvicorn_logger.info("INFO:     Waiting for application shutdown.")
        warmup.join(timeout=130)
        uvicorn_logger.info("INFO:     Application shutdown complete.")
        self.kill_process_tree(include_parent=False)
        # Measured: its children gone, the main process still runs for about 1.75 s before the status 3.
        time.sleep(self.knobs.bind_fail_exit_s)
        return 3
