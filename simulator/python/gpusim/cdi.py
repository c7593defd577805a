"""CDI (Container Device Interface) spec for the simulated GPUs: ``gpusim cdi-spec``.

A real node's NVIDIA Container Toolkit writes a spec (``nvidia-ctk cdi
generate``) whose devices ``nvidia.com/gpu=<index>`` put ``/dev/nvidia<index>``
(plus the control nodes and driver libraries) into a container; CUDA there
sees only those GPUs, numbered 0..k-1 in index order.  The simulator's
stand-ins are regular files, and a CDI ``deviceNodes`` entry must name a
character or block device (podman 4.3.1: ``failed to stat CDI host device
...: not a device node``), so each device bind-mounts DIR/nvidia<N> onto
/dev/nvidia<N> instead, and the spec sets ``GPUSIM_CDI=1`` so that
``Node.resolve_visible`` counts only the GPUs present in /dev.

cdiVersion 0.3.0: the oldest with ``mounts`` and ``env``; podman 4.3.1
accepts up to 0.5.0 (0.6.0 makes the device unresolvable).
"""
from __future__ import annotations

import json
import os

CDI_VERSION = "0.3.0"
DEFAULT_KIND = "nvidia.com/gpu"


def _mount(dev_dir: str, index: int) -> dict:
    return {"hostPath": os.path.join(dev_dir, "nvidia%d" % index), "containerPath": "/dev/nvidia%d" % index,
            "options": ["ro", "nosuid", "nodev", "bind"]}


def build_spec(dev_dir: str, gpus: int, kind: str = DEFAULT_KIND) -> dict:
    """The spec as a dict: devices "0".."gpus-1" and "all"."""
    dev_dir = os.path.abspath(dev_dir)
    devices = [{"name": str(i), "containerEdits": {"mounts": [_mount(dev_dir, i)]}} for i in range(gpus)]
    if gpus:
        devices.append({"name": "all", "containerEdits": {"mounts": [_mount(dev_dir, i) for i in range(gpus)]}})
    return {"cdiVersion": CDI_VERSION, "kind": kind, "devices": devices,
            "containerEdits": {"env": ["GPUSIM_CDI=1"]}}


def write_spec(out: str, dev_dir: str, gpus: int = 8, kind: str = DEFAULT_KIND) -> dict:
    """Create DIR/nvidia<N> (regular files) and write the spec to ``out`` atomically.

    ``out`` must end in ``.json`` (CDI reads only ``.json`` and ``.yaml``
    files).  Returns the spec.
    """
    if not out.endswith(".json"):
        raise ValueError("--out must name a .json file (CDI reads only .json and .yaml specs), got %r" % out)
    if "/" not in kind or kind.count("/") != 1 or not all(kind.split("/")):
        raise ValueError("--kind must be vendor/class such as nvidia.com/gpu, got %r" % kind)
    if gpus < 1 or gpus > 64:
        raise ValueError("--gpus must be between 1 and 64, got %d" % gpus)
    os.makedirs(dev_dir, exist_ok=True)
    for i in range(gpus):
        path = os.path.join(dev_dir, "nvidia%d" % i)
        if not os.path.exists(path):
            with open(path, "w"):
                pass
    spec = build_spec(dev_dir, gpus, kind)
    d = os.path.dirname(os.path.abspath(out))
    os.makedirs(d, exist_ok=True)
    # The temporary name must not end in .json: podman would read a half-written spec.
    tmp = os.path.join(d, ".%s.%d.tmp" % (os.path.basename(out), os.getpid()))
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(spec, fh, indent=1)
        fh.write("\n")
    os.replace(tmp, out)
    return spec
