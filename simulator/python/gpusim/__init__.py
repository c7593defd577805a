"""gpusim: a faithful GPU node simulator (fake nvidia-smi + control CLI).

Public API: ``gpusim.node`` (``Node``, ``OutOfMemory``, ``DriverError``).
Kept import-free so that the fake nvidia-smi starts fast.
"""
__version__ = "1.0.0"
