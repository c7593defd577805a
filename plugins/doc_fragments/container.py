# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The options of a server run in a container (managers docker and podman): sglang_launch, sglang_preflight."""
from __future__ import annotations


class ModuleDocFragment(object):
    DOCUMENTATION = r"""
options:
  image:
    description:
      - With O(manager=docker) or O(manager=podman), the image that runs the server, a tag (C(lmsysorg/sglang:v0.5.23))
        or a digest (C(lmsysorg/sglang@sha256:...)). Required for those managers, ignored by the others.
      - The container runs C(python3 -m sglang.launch_server <argv>) from it; its SGLang must be O(version).
    type: str
  container:
    description:
      - How the container runs (managers V(docker) and V(podman)). Unknown keys are refused.
      - C(name) (default C(sglang-<name>)). A stopped container of this server is kept as C(<name>-previous) (its logs)
        until the next launch.
      - C(gpu_request) V(auto) (CDI C(--device nvidia.com/gpu=N) for podman and Docker 25+, C(--gpus "device=N,M") for
        older Docker), V(cdi), V(gpus) or V(none). Only the target GPUs are given; inside they are numbered 0..k-1.
      - C(ipc) (default V(host), as SGLang's install guide asks; V(private) with C(shm_size)), C(shm_size).
      - C(network) (only V(host), the server binds its own port on the node; a published port would answer through the
        runtime's proxy, and the health gate could not tell the candidate's socket from another), C(restart_policy)
        (default V(no)).
      - C(ulimits) (default C(memlock=-1:-1) and C(stack=67108864)). A C(--ulimit) replaces podman's C(default_ulimits).
      - C(volumes) (C(HOST:CONTAINER[:ro]), more than the model directories, which are mounted read-only at their paths).
      - C(pull) (V(missing), V(always) or V(never)) says what the preflight does when the image is not on the node.
      - C(run_args) (more C(run) options). C(-e) and C(--label) are refused, as their values show in C(inspect).
      - The secrets never reach the container's command line, labels or C(inspect) output. The API key goes through the
        0600 C(--config) file, the secret env variables through a 0600 file that a bootstrap reads inside.
    type: dict
"""
