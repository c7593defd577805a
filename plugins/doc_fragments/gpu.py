# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The options every module that reads the node's GPUs shares (module_utils/gpu/target.py checks them)."""
from __future__ import annotations


class ModuleDocFragment(object):
    # How the node's GPUs are read: gpu_drain, gpu_memory_assert, sglang_preflight.
    DOCUMENTATION = r"""
options:
  backend:
    description:
      - How to read the GPUs. V(auto) uses NVML when the C(pynvml) module (nvidia-ml-py) imports and initialises,
        otherwise nvidia-smi. GPU resets always use nvidia-smi.
    type: str
    default: auto
    choices: [auto, nvidia-smi, nvml]
  nvidia_smi:
    description:
      - Path of the nvidia-smi binary, or a bare command name that is searched on E(PATH).
      - By default C(nvidia-smi) is searched on E(PATH).
    type: path
  device_paths:
    description:
      - fnmatch patterns (absolute) of the GPU device nodes. A GPU holder visible in C(/proc) must have one of them
        open, which protects against PIDs that nvidia-smi reports from another PID namespace; the diagnosis of a GPU
        that stays busy lists the processes that keep one open.
      - The roles set it from the inventory variable C(gpufleet_gpu_device_paths); a simulated node passes its own
        device directory here.
    type: list
    elements: str
    default: ['/dev/nvidia*']
"""

    # One nvidia-smi run's time limit: gpu_drain, gpu_memory_assert.
    COMMAND_TIMEOUT = r"""
options:
  command_timeout:
    description:
      - Seconds after which one nvidia-smi run is abandoned (through coreutils C(timeout), when installed). In a
        wait loop the poll then counts as failed and the next one follows.
    type: float
    default: 60
"""
