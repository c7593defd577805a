"""Valid safetensors weights for test checkpoints: the simulator's writer (simulator/python/gpusim/checkpoint.py).

Used by tests/integration/test_weights_redeploy.py, the playbook and launch fixtures, and the unit tests of the
weights plan, the preflight, the sglang_weights module and sglang_replace (they put this directory on sys.path).
"""
from __future__ import annotations

from gpusim.checkpoint import (BYTES, SMALL_LAYOUT, load_problem, safetensors_bytes, tensor_bytes,  # noqa: F401
                               write_checkpoint, write_safetensors, write_weights)

__all__ = ["BYTES", "SMALL_LAYOUT", "load_problem", "safetensors_bytes", "tensor_bytes", "write_checkpoint",
           "write_safetensors", "write_weights"]
