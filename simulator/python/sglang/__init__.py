"""Fake SGLang package of the gpufleet.sglang simulator.

Not the real SGLang: ``python -m sglang.launch_server <flags>`` starts a
simulated server (see ``simulator/README.md``, section "Fake SGLang server").
Standard library only; the GPU memory it "uses" lives in the ``gpusim`` node
named by ``GPUSIM_ROOT``.
"""
from sglang.version import __version__  # noqa: F401 - re-exported as sglang.__version__
