"""Simulator knobs (environment variables ``SGLANG_SIM_*``) and emulated versions.

Everything the fake server reads from the environment goes through this
module, so ``simulator/README.md`` ("Fake SGLang server") can list it from one
place.  Standard library only.
"""
from __future__ import annotations

import os

# Emulated SGLang releases (docs/reference/sglang-rules.md, Versions).  Short names are accepted too.
VERSION_NAMES = {
    "0.4.6": "0.4.6.post5",
    "0.4.6.post5": "0.4.6.post5",
    "0.4.10": "0.4.10.post2",
    "0.4.10.post2": "0.4.10.post2",
    "0.5.1": "0.5.1",
    "0.5.10": "0.5.10",
    "0.5.23": "0.5.23",
}
DEFAULT_VERSION = "0.5.23"


class SimConfigError(Exception):
    """A simulator knob has an invalid value (not an SGLang error)."""


def version_tuple(version: str) -> tuple:
    """``"0.4.10.post2"`` -> ``(0, 4, 10)``."""
    parts = []
    for piece in version.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def emulated_version(env=None) -> str:
    """Full version string of the emulated release (``SGLANG_SIM_VERSION``)."""
    env = os.environ if env is None else env
    raw = (env.get("SGLANG_SIM_VERSION") or DEFAULT_VERSION).strip()
    if raw not in VERSION_NAMES:
        raise SimConfigError(
            "SGLANG_SIM_VERSION=%r is not emulated; choose one of %s"
            % (raw, ", ".join(sorted(set(VERSION_NAMES.values()), key=version_tuple))))
    return VERSION_NAMES[raw]


def _float(env, name, default, minimum=None):
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SimConfigError("%s=%r is not a number" % (name, raw))
    if minimum is not None and value < minimum:
        raise SimConfigError("%s=%r must be >= %s" % (name, raw, minimum))
    return value


def _int(env, name, default, minimum=None):
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SimConfigError("%s=%r is not an integer" % (name, raw))
    if minimum is not None and value < minimum:
        raise SimConfigError("%s=%r must be >= %s" % (name, raw, minimum))
    return value


def _flag(env, name) -> bool:
    return (env.get(name) or "").strip().lower() in ("1", "true", "yes", "on")


class Knobs:
    """All ``SGLANG_SIM_*`` knobs, read once.  See simulator/README.md."""

    def __init__(self, env=None):
        env = dict(os.environ if env is None else env)
        self.version = emulated_version(env)
        self.vt = version_tuple(self.version)
        # --- timing -------------------------------------------------------
        self.time_scale = _float(env, "SGLANG_SIM_TIME_SCALE", 1.0, 0.0)
        self.startup_s = _float(env, "SGLANG_SIM_STARTUP_S", 1.0, 0.0)
        self.warmup_s = _float(env, "SGLANG_SIM_WARMUP_S", 0.2, 0.0)
        self.shutdown_s = _float(env, "SGLANG_SIM_SHUTDOWN_S", 0.2, 0.0)
        self.drain_poll_s = _float(env, "SGLANG_SIM_DRAIN_POLL_S", 5.0, 0.01)
        self.scheduler_exit_timeout_s = _float(env, "SGLANG_SIM_SCHEDULER_EXIT_TIMEOUT_S", 15.0, 0.0)
        self.watchdog_interval_s = _float(env, "SGLANG_SIM_WATCHDOG_INTERVAL_S", 1.0, 0.01)
        self.kill_release_s = _float(env, "SGLANG_SIM_KILL_RELEASE_S", 2.0, 0.0)
        # 0.5.23 (measured): the port-conflict loser exits 3 about 1.75 s after it killed its own children.
        self.bind_fail_exit_s = _float(env, "SGLANG_SIM_BIND_FAIL_EXIT_S", 1.5, 0.0)
        self.dist_timeout_s = _float(env, "SGLANG_SIM_DIST_TIMEOUT_S", 600.0, 0.0)
        # --- faults -------------------------------------------------------
        self.crash_on_load = _flag(env, "SGLANG_SIM_CRASH_ON_LOAD")
        self.crash_after_s = _float(env, "SGLANG_SIM_CRASH_AFTER_S", -1.0)
        self.hang = (env.get("SGLANG_SIM_HANG") or "").strip().lower()
        if self.hang not in ("", "load", "warmup"):
            raise SimConfigError("SGLANG_SIM_HANG=%r: use 'load' or 'warmup'" % self.hang)
        self.port_in_use = _flag(env, "SGLANG_SIM_PORT_IN_USE")
        self.health_flap = _int(env, "SGLANG_SIM_HEALTH_FLAP", 0, 0)
        self.stuck_memory = _flag(env, "SGLANG_SIM_STUCK_MEMORY")
        # --- memory -------------------------------------------------------
        self.overhead_mib = _int(env, "SGLANG_SIM_OVERHEAD_MIB", 1536, 0)
        # --- speculation / throughput model --------------------------------
        self.accept_p = _float(env, "SGLANG_SIM_ACCEPT_P", 0.661, 0.0)
        if self.accept_p >= 1.0:
            raise SimConfigError("SGLANG_SIM_ACCEPT_P must be below 1.0")
        self.ngram_accept_p = _float(env, "SGLANG_SIM_NGRAM_ACCEPT_P", 0.35, 0.0)
        if self.ngram_accept_p >= 1.0:
            raise SimConfigError("SGLANG_SIM_NGRAM_ACCEPT_P must be below 1.0")
        self.base_tps = _float(env, "SGLANG_SIM_BASE_TPS", 90.0, 0.001)
        self.verify_cost = _float(env, "SGLANG_SIM_VERIFY_COST", 2.628, 0.0)
        self.draft_token_cost = _float(env, "SGLANG_SIM_DRAFT_TOKEN_COST", 0.004, 0.0)
        self.seed = _int(env, "SGLANG_SIM_SEED", 0)
        # --- real SGLang environment variables the fake honours -------------
        self.health_check_timeout = _float(env, "SGLANG_HEALTH_CHECK_TIMEOUT", 20.0, 0.0)
        self.enable_spec_v2 = (env.get("SGLANG_ENABLE_SPEC_V2") or "").lower() in ("1", "true")
        self.force_shutdown = bool(env.get("SGL_FORCE_SHUTDOWN"))
        self.log_ms = (env.get("SGLANG_LOG_MS") or "").lower() in ("1", "true")

    def at_least(self, *version) -> bool:
        return self.vt >= tuple(version)

    def sleep_s(self, simulated_seconds: float) -> float:
        """Wall-clock seconds for ``simulated_seconds`` of model time."""
        return max(0.0, simulated_seconds * self.time_scale)
