"""Server-side ``SGLANG_SIM_*`` knobs added for today's SGLang (0.5.23).

``sim_config.Knobs`` holds the original knobs; this module holds the ones of
the smoke gate, ports, weights, LoRA and PD features (simulator/README.md,
"Knobs").  Both read the environment once, at startup.  Standard library
only.
"""
from __future__ import annotations

import os

from sglang.srt.sim_config import SimConfigError, _float, _int


def _bool_env(env, name, default):
    raw = (env.get(name) or "").strip().lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise SimConfigError("%s=%r: use true or false" % (name, raw))


class ServerKnobs:
    def __init__(self, env=None):
        env = dict(os.environ if env is None else env)
        # --- sglang#22779: a relaunch after SIGKILL hangs after N requests ----
        self.hang_after_requests = _int(env, "SGLANG_SIM_HANG_AFTER_REQUESTS", 0, 0)
        self.hang_when = (env.get("SGLANG_SIM_HANG_WHEN") or "unclean").strip().lower()
        if self.hang_when not in ("unclean", "always"):
            raise SimConfigError("SGLANG_SIM_HANG_WHEN=%r: use 'unclean' or 'always'" % self.hang_when)
        self.state_dir = env.get("SGLANG_SIM_STATE_DIR") or ""
        if not self.state_dir and env.get("GPUSIM_ROOT"):
            self.state_dir = os.path.join(env["GPUSIM_ROOT"], "sglang-sim")
        # --- startup phases -------------------------------------------------
        self.kv_alloc_s = _float(env, "SGLANG_SIM_KV_ALLOC_S", 0.02, 0.0)
        self.cuda_graph_s = _float(env, "SGLANG_SIM_CUDA_GRAPH_S", 0.05, 0.0)
        # --- ports ----------------------------------------------------------
        self.port_linger_s = _float(env, "SGLANG_SIM_PORT_LINGER_S", 0.0, 0.0)
        # --- weights --------------------------------------------------------
        self.update_weights_s = _float(env, "SGLANG_SIM_UPDATE_WEIGHTS_S", 0.1, 0.0)
        self.update_buffer_mib = _int(env, "SGLANG_SIM_UPDATE_BUFFER_MIB", 0, 0)
        # --- PD disaggregation ------------------------------------------------
        self.pd_transfer_s = _float(env, "SGLANG_SIM_PD_TRANSFER_S", 0.05, 0.0)
        self.pd_bootstrap_timeout_s = _float(env, "SGLANG_SIM_PD_BOOTSTRAP_TIMEOUT_S", 30.0, 0.1)
        # --- real SGLang environment variables ---------------------------------
        self.health_endpoint_generation = _bool_env(env, "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", True)
        # crash diagnostics before the tree goes (0.5.23 dump_requests_before_crash)
        self.pyspy_dump_before_crash = _bool_env(env, "SGLANG_PYSPY_DUMP_BEFORE_CRASH", True)
        self.cuda_coredump_before_crash = _bool_env(env, "SGLANG_CUDA_COREDUMP_BEFORE_CRASH", True)
        self.cuda_coredump_wait_s = _float(env, "SGLANG_CUDA_COREDUMP_BEFORE_CRASH_WAIT_SECS", 60.0, 0.0)
