"""Is there a GPU, which one, and a simulated twin of it.

``detect()`` is what decides whether the real checks run: ``nvidia-smi -L``
must exist, exit 0 and list at least one ``GPU <n>: <name> (UUID: ...)``
line. Everything else is a visible skip reason that starts with
``no NVIDIA GPU: nvidia-smi``.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile

from . import SIM_BIN, SIM_PY

LIST_RE = re.compile(r"^GPU (\d+): (.+?) \(UUID: ((?:GPU|MIG)-[0-9A-Fa-f-]+)\)\s*$")
C_LOCALE = {"LC_ALL": "C", "LANG": "C", "LANGUAGE": "C"}
# Simulator presets (simulator/python/gpusim/node.py MODELS).
SIM_MODELS = ("H200", "H100")
DEFAULT_SIM_MODEL = "H100"


class GpuInfo(object):
    """Result of :func:`detect`: ``ok``, ``reason`` and the listed GPUs."""

    def __init__(self, ok, reason, rc=None, output="", gpus=None, nvidia_smi=None):
        self.ok = ok
        self.reason = reason
        self.rc = rc
        self.output = output
        self.gpus = gpus or []          # [{"index", "name", "uuid"}]
        self.nvidia_smi = nvidia_smi

    @property
    def count(self):
        return len(self.gpus)

    @property
    def name(self):
        return self.gpus[0]["name"] if self.gpus else None

    @property
    def model(self):
        """The simulator preset matching GPU 0 (None when not H200/H100)."""
        return sim_model(self.name)

    def to_dict(self):
        return {"ok": self.ok, "reason": self.reason, "rc": self.rc, "count": self.count,
                "name": self.name, "model": self.model,
                "gpus": [{"index": g["index"], "name": g["name"]} for g in self.gpus]}


def sim_model(name):
    """``'NVIDIA H200'`` -> ``'H200'``, ``'NVIDIA H100 80GB HBM3'`` -> ``'H100'``, else None."""
    if not name:
        return None
    upper = name.upper()
    for model in SIM_MODELS:
        if re.search(r"\b%s\b" % model, upper):
            return model
    return None


def parse_list(text):
    """GPU dicts from ``nvidia-smi -L`` output (MIG lines are skipped)."""
    gpus = []
    for line in (text or "").splitlines():
        match = LIST_RE.match(line.strip())
        if match and match.group(3).upper().startswith("GPU-"):
            gpus.append({"index": int(match.group(1)), "name": match.group(2), "uuid": match.group(3)})
    return gpus


def detect(nvidia_smi="nvidia-smi", env=None, timeout=60):
    """Run ``nvidia-smi -L`` and decide whether real checks can run."""
    env = dict(os.environ if env is None else env)
    env.update(C_LOCALE)
    path = shutil.which(nvidia_smi, path=env.get("PATH")) if os.sep not in nvidia_smi else nvidia_smi
    if not path or not os.access(path, os.X_OK):
        return GpuInfo(False, "no NVIDIA GPU: nvidia-smi not found on PATH", nvidia_smi=nvidia_smi)
    try:
        proc = subprocess.run([path, "-L"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return GpuInfo(False, "no NVIDIA GPU: nvidia-smi -L did not answer within %d s" % timeout,
                       nvidia_smi=path)
    except OSError as exc:
        return GpuInfo(False, "no NVIDIA GPU: nvidia-smi -L could not run (%s)" % exc, nvidia_smi=path)
    out = proc.stdout.decode("utf-8", "replace")
    first = next((line.strip() for line in out.splitlines() if line.strip()), "(no output)")
    if proc.returncode != 0:
        return GpuInfo(False, "no NVIDIA GPU: nvidia-smi -L exited %d: %s" % (proc.returncode, first),
                       rc=proc.returncode, output=out, nvidia_smi=path)
    gpus = parse_list(out)
    if not gpus:
        return GpuInfo(False, "no NVIDIA GPU: nvidia-smi -L listed no GPU: %s" % first, rc=0, output=out,
                       nvidia_smi=path)
    return GpuInfo(True, "", rc=0, output=out, gpus=gpus, nvidia_smi=path)


class SimNode(object):
    """A private gpusim node in a temporary ``GPUSIM_ROOT`` (``gpusim init``).

    ``env`` puts the fake nvidia-smi first on ``PATH``. Call :meth:`close`
    (or use it as a context manager) to stop holders it started and remove
    the directory.
    """

    def __init__(self, gpus, model, root=None, seed="gpukit"):
        self.model = model
        self.count = gpus
        self._own_root = root is None
        self.root = root or tempfile.mkdtemp(prefix="gpukit-sim-")
        self.env = dict(os.environ)
        self.env["GPUSIM_ROOT"] = self.root
        self.env["PATH"] = SIM_BIN + os.pathsep + self.env.get("PATH", "")
        self.env["PYTHONPATH"] = SIM_PY + (os.pathsep + self.env["PYTHONPATH"] if self.env.get("PYTHONPATH") else "")
        self.spawned = []   # PIDs from `gpusim hold` (holder, watcher, keepers)
        self.gpusim(["init", "--gpus", str(gpus), "--model", model, "--seed", seed])

    def gpusim(self, args, timeout=60):
        proc = subprocess.run([os.path.join(SIM_BIN, "gpusim")] + list(args), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=self.env, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise RuntimeError("gpusim %s failed (rc %d): %s" % (" ".join(args), proc.returncode,
                                                                 proc.stderr.decode("utf-8", "replace").strip()))
        return proc.stdout.decode("utf-8", "replace")

    def hold(self, gpus="0", mib=1024, name=None):
        """``gpusim hold``; returns the JSON it prints (pid, watcher_pid, keepers)."""
        import json
        args = ["hold", "--gpus", str(gpus), "--mib", str(mib), "--json"]
        if name:
            args += ["--name", name]
        res = json.loads(self.gpusim(args))
        self.spawned.extend([res["pid"]] + list(res.get("keepers") or []) + [res.get("watcher_pid")])
        return res

    def close(self):
        from .procs import kill_pids
        kill_pids([p for p in self.spawned if p])
        self.spawned = []
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
