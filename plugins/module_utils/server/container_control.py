# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A server run in a container by docker or podman (managers ``docker`` and ``podman``, issue 24).

The container is the runtime's: it is created with ``<cli> run -d`` (an argv list, never a shell string), found again by
its name and labels, stopped with ``<cli> stop -t <stop_timeout>`` (the runtime's stop signal, then SIGKILL: never a
signal from the host, so that no restart policy brings it back) and read with ``<cli> logs``. What it gets:

* the target GPUs only: CDI names (``--device nvidia.com/gpu=N``; podman, and Docker 25+) or ``--gpus "device=N,M"``
  (older Docker, the NVIDIA container toolkit's hook). CUDA_VISIBLE_DEVICES is not passed: inside, the GPUs are 0..k-1.
* what SGLang's install guide asks for: ``--ipc host`` (or ``--shm-size``), ``--ulimit memlock=-1:-1``, ``--ulimit
  stack=67108864``, the host network (the port is the server's own);
* the model directories (model, tokenizer, draft model: absolute paths) mounted read-only at the same paths, and the
  extra ``volumes`` of the container options;
* labels that name the collection, the server, the launch's fingerprint and the image reference;
* the secrets never in its argv, its labels or ``inspect``: the API key through the 0600 ``--config`` file (mounted
  read-only), the secret env variables through a 0600 JSON file, mounted read-only, that a small bootstrap (on the
  container's command line, no secret in it) loads into the environment before it runs ``sglang.launch_server``.

The host PID of the container's main process (``State.Pid``) is the server's PID for the health gate and the GPU
checks: NVML reports host PIDs, and the container's processes are its descendants.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

from ansible_collections.gpufleet.sglang.plugins.module_utils.node import containers
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import images
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import supervise as sp
from ansible_collections.gpufleet.sglang.plugins.module_utils.server.launch_params import LaunchError

MANAGERS = ("docker", "podman")
LABEL = "io.gpufleet.sglang"
GPU_REQUESTS = ("auto", "cdi", "gpus", "none")
DEFAULT_CONTAINER = {
    "name": None, "gpu_request": "auto", "ipc": "host", "shm_size": None, "network": "host", "restart_policy": "no",
    "volumes": [], "ulimits": ["memlock=-1:-1", "stack=67108864"], "pull": "missing", "run_args": [],
}
# The server's args whose values are local paths the container must see (mounted read-only at the same path).
PATH_ARGS = ("model_path", "tokenizer_path", "speculative_draft_model_path")
SECRETS_IN = "/run/gpufleet-secrets.json"
# Loads the secret env variables (a JSON object on a read-only mount) and runs the module named after -m with the rest
# of the command line as its argv, as ``python -m`` would. No secret is on this command line.
BOOTSTRAP = ("import json,os,runpy,sys\n"
             "with open(sys.argv[1]) as f: os.environ.update((str(k), str(v)) for k, v in json.load(f).items())\n"
             "mod = sys.argv[3]; sys.argv = [mod] + sys.argv[4:]\n"
             "runpy.run_module(mod, run_name='__main__', alter_sys=True)\n")
PROBE_TIMEOUT = 120
PULL_TIMEOUT = 3600
RUN_TIMEOUT = 300
CLI_TIMEOUT = 60


def options(given):
    """The container options with their defaults; ValueError names the key and the fix."""
    out = dict(DEFAULT_CONTAINER)
    given = dict(given or {})
    unknown = sorted(set(given) - set(DEFAULT_CONTAINER))
    if unknown:
        raise ValueError("unknown key(s) %s; known: %s" % (", ".join(unknown), ", ".join(sorted(DEFAULT_CONTAINER))))
    out.update((k, v) for k, v in given.items() if v is not None)
    if out["gpu_request"] not in GPU_REQUESTS:
        raise ValueError("gpu_request must be one of %s, got %r" % (", ".join(GPU_REQUESTS), out["gpu_request"]))
    if out["pull"] not in ("missing", "always", "never"):
        raise ValueError("pull must be one of missing, always, never, got %r" % (out["pull"],))
    if out["restart_policy"] not in ("no", "on-failure", "always", "unless-stopped"):
        raise ValueError("restart_policy must be one of no, on-failure, always, unless-stopped, got %r" % (out["restart_policy"],))
    if out["network"] != "host":
        # A published port answers through the runtime's proxy (docker-proxy, conmon, netavark's NAT): the health gate
        # could no longer prove that the answering socket is the candidate's, and a stale server could pass it.
        raise ValueError("network must be host (the server binds its own port on the node), got %r; published ports "
                         "are not supported" % (out["network"],))
    if out["ipc"] not in ("host", "private", "shareable", None, ""):
        raise ValueError("ipc must be host or private (with shm_size), got %r" % (out["ipc"],))
    for key in ("volumes", "ulimits", "run_args"):
        if not isinstance(out[key], list) or not all(isinstance(x, str) and x for x in out[key]):
            raise ValueError("%s must be a list of strings, got %r" % (key, out[key]))
    for vol in out["volumes"]:
        if not vol.startswith("/") or ":" not in vol:
            raise ValueError("volumes: %r is not HOST_PATH:CONTAINER_PATH[:ro]" % vol)
    for arg in out["run_args"]:
        low = arg.lower()
        if low.startswith(("-e", "--env", "--label", "-l")) and not low.startswith("--env-host"):
            raise ValueError("run_args: %r would put a value in the container's inspect output; give env through the server's env "
                             "(secret names go through a 0600 file) and never a label" % arg)
    return out


def gpu_args(runtime, request, gpus, server_version=None):
    """The argv that gives the container exactly ``gpus`` (host indices)."""
    gpus = [str(g) for g in gpus]
    if not gpus or request == "none":
        return []
    if request == "auto":
        request = "cdi" if runtime == "podman" or _major(server_version) >= 25 else "gpus"
    if request == "cdi":
        out = []
        for g in gpus:
            out += ["--device", "nvidia.com/gpu=%s" % g]
        return out
    # docker's --gpus value is CSV: a list of devices needs its own quotes.
    return ["--gpus", '"device=%s"' % ",".join(gpus)]


def _major(version):
    try:
        return int(str(version).split(".", maxsplit=1)[0])
    except (TypeError, ValueError):
        return 0


class ContainerControl(object):
    """The container methods of :class:`launcher.Launcher` (manager docker or podman)."""

    def container_setup(self):
        try:
            self.box = options(self.p.get("container"))
        except ValueError as exc:
            self.box = dict(DEFAULT_CONTAINER)
            self.blockers.append("%s: %s" % (self.names.of("container"), exc))
        self.container_name = self.box["name"] or "sglang-%s" % self.name
        self.image = self.p.get("image")
        if not self.image:
            self.blockers.append("%s: the %s manager runs the server from an image; set it to a tag or a digest "
                                 "(lmsysorg/sglang:<tag>)" % (self.names.of("image"), self.manager))
        self.secret_json = os.path.join(self.files_dir, "container-env.json")

    def container_identity(self):
        """What of the container is part of the launch's identity: the image (its ID when the preflight found it) and
        the run options (None for a host process)."""
        if self.box is None:
            return None
        opts = dict((k, v) for k, v in self.box.items() if k != "pull")
        opts["name"] = self.container_name
        return {"image": self.image, "options": opts}

    def image_record(self):
        """The record's image: the reference asked for, the image ID that ran, and its repository digest (if any)."""
        return {"ref": self.p.get("image_ref") or self.image, "id": self.image, "digest": self.p.get("image_digest")}

    def image_words(self):
        """``ref@digest`` (or ``ref (image id)``) for the plan, the diff and the report; None for a host process."""
        if self.box is None:
            return None
        rec = self.image_record()
        if rec["digest"]:
            return rec["digest"]
        if rec["ref"] and rec["id"] and rec["ref"] != rec["id"]:
            return "%s (image %s)" % (rec["ref"], str(rec["id"]).replace("sha256:", "")[:12])
        return rec["ref"] or rec["id"]

    def cli(self):
        found = getattr(self, "_cli_path", None)
        if not found:
            found = self.ctx.get_bin_path(self.manager, required=False)
            if not found:
                raise LaunchError("%s is not installed on this node (or not in PATH): install it, or set %s" % (
                    self.manager, self.names.of("manager")))
            self._cli_path = found
        return found

    def _cli_run(self, argv, timeout):
        """``(rc, out, err)`` of an argv with a deadline (AnsibleModule.run_command has none: a hung runtime must not
        hang the run); a timeout or a CLI that cannot start is rc 124 with the reason."""
        try:
            return containers.run_cli(argv, timeout)
        except subprocess.TimeoutExpired:
            return 124, "", "no answer within %d s" % timeout
        except OSError as exc:
            return 127, "", str(exc)

    def _box_call(self, args, timeout=CLI_TIMEOUT, what="", check=True):
        argv = [self.cli()] + list(args)
        rc, out, err = self._cli_run(argv, timeout)
        if check and rc != 0:
            words = " ".join(self.masked(list(args)))[:300]
            raise LaunchError("`%s %s` exited %s: %s%s" % (self.manager, words, rc, self.mask((err or out or "no output").strip())[:500],
                                                           what))
        return rc, out, err

    def box_inspect(self, ref=None):
        rc, out, _err = self._box_call(["container", "inspect", ref or self.container_name], check=False)
        if rc != 0:
            return None
        info = containers.parse_inspect(out)
        return info

    def _container_version(self):
        """The Docker server's version (CDI or --gpus), asked once per launch (the probe and the run share it)."""
        if self.manager != "docker":
            return None
        if getattr(self, "_server_version", None) is None:
            rc, out, _err = self._box_call(["version", "--format", "{{.Server.Version}}"], check=False)
            self._server_version = out.strip() if rc == 0 else ""
        return self._server_version or None

    def container_argv(self, probe_name=None):
        """The ``<cli> run`` argv (without the CLI) for this launch; ``self.argv`` is what runs inside. With
        ``probe_name``: the same container, run once with ``--rm`` under that name and without the files this launch
        writes later, to prove before the outage that the runtime can create it (see :meth:`probe`)."""
        box = self.box
        # --pull never: the preflight found or pulled the image; a pull never happens inside the outage.
        if probe_name:
            out = ["run", "--rm", "--pull", "never", "--name", probe_name, "--restart", "no",
                   "--label", "%s.role=probe" % LABEL]
        else:
            out = ["run", "-d", "--pull", "never", "--name", self.container_name, "--restart", box["restart_policy"] or "no"]
        out += ["--label", "%s.collection=gpufleet.sglang" % LABEL, "--label", "%s.server=%s" % (LABEL, self.name),
                "--label", "%s.fingerprint=%s" % (LABEL, self.fp or ""), "--label", "%s.image=%s" % (LABEL, self.p.get("image_ref") or self.image)]
        if box["network"]:
            out += ["--network", box["network"]]
        if box["ipc"] and box["ipc"] != "private":
            out += ["--ipc", box["ipc"]]
        if box["shm_size"]:
            out += ["--shm-size", str(box["shm_size"])]
        for lim in box["ulimits"]:
            out += ["--ulimit", lim]
        out += gpu_args(self.manager, box["gpu_request"], self.gpu_list(), self._container_version() if box["gpu_request"] == "auto" else None)
        for key, value in sorted(self.env.items()):
            if key != "CUDA_VISIBLE_DEVICES":
                out += ["-e", "%s=%s" % (key, value)]
        for mount in self.mounts(files=not probe_name):
            out += ["-v", mount]
        if self.p["chdir"]:
            out += ["-w", self.p["chdir"]]
        out += list(box["run_args"])
        if probe_name:
            out += ["--entrypoint", self.python or "python3"]
        out.append(self.image)
        return out

    def probe(self, timeout=PROBE_TIMEOUT):
        """Create and run the launch's container once (``--rm``, the server's interpreter running ``import os``
        instead of the server) and return None, or the runtime's error: a GPU request the runtime cannot serve (no
        NVIDIA toolkit for ``--gpus``, no CDI spec for ``nvidia.com/gpu=N``), a ulimit above the host's, a volume
        that is not there, an interpreter that is not in the image. It takes no GPU memory and binds no port, so it
        runs beside the old server; it is removed by its name whatever happens."""
        name = "gpufleet-probe-%s-%d-%s" % (self.name, os.getpid(), os.urandom(3).hex())
        argv = [self.cli()] + self.container_argv(probe_name=name) + ["-c", "import os"]
        try:
            rc, out, err = self._cli_run(argv, timeout)
        finally:
            self._cli_run([self.cli(), "rm", "--force", name], CLI_TIMEOUT)
        if rc == 0:
            return None
        return self.mask((err or out or "no output").strip())[-600:]

    def gpu_list(self):
        return [g for g in str(self.env.get("CUDA_VISIBLE_DEVICES", "")).split(",") if g.strip() != ""]

    def mounts(self, files=True):
        """The ``-v`` values: the model directories read-only, the 0600 files this launch writes (``files``), the
        configured volumes."""
        seen = []
        for key in PATH_ARGS:
            value = self.args.get(key)
            if isinstance(value, str) and value.startswith("/"):
                seen.append("%s:%s:ro" % (value, value))
        if self.config_text is not None and files:
            seen.append("%s:%s:ro" % (self.config_path, self.config_path))
        if self.secret_env and files:
            seen.append("%s:%s:ro" % (self.secret_json, SECRETS_IN))
        seen += list(self.box["volumes"])
        out = []
        for m in seen:
            if m not in out:
                out.append(m)
        return out

    def container_inner_argv(self):
        python = self.python or "python3"          # inside the image: its own interpreter, never a host path check
        if self.secret_env:
            return [python, "-c", BOOTSTRAP, SECRETS_IN, "-m", "sglang.launch_server"] + list(self.flags)
        return [python, "-m", "sglang.launch_server"] + list(self.flags)

    def box_write_secrets(self):
        if self.secret_env:
            sp.write_private(self.secret_json, json.dumps(self.secret_env, sort_keys=True) + "\n", mode=0o600)
        elif os.path.exists(self.secret_json):
            sp.remove_quietly(self.secret_json)

    def box_current(self, cur):
        info = self.box_inspect()
        if not info or info.get("status") != "running" or not info.get("pid"):
            if info:
                cur["container"] = _public(info)
            return cur
        labels = info.get("labels") or {}
        if labels.get("%s.server" % LABEL) != self.name:
            cur["container"] = _public(info)
            cur["foreign_container"] = True
            return cur
        pid = int(info["pid"])
        if not sp.alive(pid):
            return cur
        start = sp.starttime(pid)
        # The label names the launch's identity; the state file follows it after an in-place weight update (same
        # container, new checkpoint), so it wins when it names this very process.
        record = cur.get("record") or {}
        fingerprint = record.get("fingerprint") if (record.get("pid") == pid and record.get("starttime") == start) else None
        cur.update(pid=pid, start=start, source="container", fingerprint=fingerprint or labels.get("%s.fingerprint" % LABEL) or None,
                   container=_public(info), mounts=list(info.get("mounts") or []))
        return cur

    def box_stop(self, cur):
        timeout = self.p["stop_timeout"]
        box = (cur or {}).get("container") or {}
        ref = box.get("id") or getattr(self, "container_id", None) or self.container_name
        members = sp.tree(cur["pid"]) if cur.get("pid") else []
        began = time.monotonic()
        self._box_call(["stop", "-t", str(int(max(1, round(timeout)))), ref], timeout=timeout + CLI_TIMEOUT,
                       what=" (stopping the server's container)")
        left = [(p, s) for p, s in members if sp.alive(p, s)]
        killed, still = sp.kill_leftovers(left) if left else ([], [])
        return {"signalled": [cur["pid"]] if cur.get("pid") else [], "killed": killed,
                "exited": sorted(set(p for p, _s in members) - set(still)), "still_running": still,
                "elapsed": round(time.monotonic() - began, 3), "container": ref}

    def box_start(self):
        """Create and start the container; ``(pid, log_offset, is_child)``. A stopped container of this server keeps its
        logs as ``<name>-previous`` until the next launch; anything else with the name is refused."""
        old = self.box_inspect()
        if old:
            labels = old.get("labels") or {}
            if labels.get("%s.server" % LABEL) != self.name:
                raise LaunchError("a container named %s exists and is not this server's (image %s); rename it or set %s"
                                  % (self.container_name, old.get("image"), self.names.of("container", "name")))
            if old.get("status") == "running":
                raise LaunchError("the container %s of this server still runs (PID %s): stop it first" % (self.container_name, old.get("pid")))
            prev = self.container_name + "-previous"
            if self.box_inspect(prev):
                self._box_call(["rm", "--force", prev])
            self._box_call(["rename", old["id"], prev])
        self.ensure_image()
        self.box_write_secrets()
        argv = self.container_argv() + self.container_inner_argv()
        rc, out, err = self._box_call(argv, timeout=RUN_TIMEOUT, check=False)
        cid = (out or "").strip().splitlines()[-1:] if rc == 0 else []
        if rc != 0 or not cid:
            info = self.box_inspect()
            logs = self.log_tail(0, self.started_wall)
            error = self.mask((err or out or "no output").strip())[-600:]
            raise LaunchError("`%s run` of %s failed (exit %s): %s" % (self.manager, self.container_name, rc, error),
                              log_tail=logs, container=_public(info) if info else None)
        self.container_id = cid[0].strip()
        info = self.box_inspect(self.container_id)
        if not info or not info.get("pid"):
            tail = self.log_tail(0, self.started_wall)
            raise LaunchError("the container %s (id %s) has no running process right after start (%s). Last log lines:\n%s"
                              % (self.container_name, self.container_id[:12], (info or {}).get("status"), "\n".join(tail)),
                              log_tail=tail)
        self.result["container"] = _public(info)
        self.result["image_words"] = self.image_words()
        self.result["image"] = self.image_record()
        return int(info["pid"]), 0, False

    def ensure_image(self):
        """The image ID to run is on the node; a rollback whose image was removed meanwhile pulls it again by its
        recorded repository digest (inside the outage, but a rollback that cannot start is worse) and checks that the
        digest gives that very image ID."""
        rc, _out, _err = self._box_call(["image", "inspect", self.image], check=False)
        if rc == 0:
            return
        digest = self.p.get("image_digest")
        if not digest:
            raise LaunchError("the image %s (%s) is no longer on this node and has no repository digest to pull it by; "
                              "pull or load it again, or pin %s by digest" % (self.image_words(), self.image, self.names.of("image")))
        ok, error = images.pull(self.cli(), digest, PULL_TIMEOUT)
        if not ok:
            raise LaunchError("the image %s is no longer on this node and pulling %s failed: %s" % (self.image, digest, error))
        self.ctx.warn("the image %s was no longer on this node: pulled it again by its digest %s" % (self.image, digest))
        rc, out, _err = self._box_call(["image", "inspect", digest], check=False)
        info = images.parse_inspect(digest, out) if rc == 0 else None
        found = images.run_ref(info) if info else None
        if found and found != self.image.replace("sha256:", ""):
            raise LaunchError("the digest %s now gives image %s, not the recorded %s; nothing was started" % (digest, found, self.image))
        self.image = digest if not found else found

    def box_log_text(self, since_wall=None):
        args = ["logs"]
        if since_wall:
            args += ["--since", str(int(since_wall) - 1)]
        ref = getattr(self, "container_id", None) or self.container_name
        rc, out, err = self._box_call(args + [ref], check=False)
        if rc != 0:
            return ""
        return (out or "") + (err or "")


def sees(mounts, path):
    """True when a container with ``mounts`` (``[(host source, container destination)]``) sees the host's ``path`` at
    the same path (an in-place weight update loads the path it is given, inside the container)."""
    path = os.path.normpath(str(path))
    for source, dest in mounts or []:
        if not source or not dest:
            continue
        dest = os.path.normpath(dest)
        if path == dest or path.startswith(dest.rstrip("/") + "/"):
            return os.path.normpath(os.path.normpath(source) + path[len(dest):]) == path
    return False


def _public(info):
    """What a record or a report may show of a container (never its env or command line)."""
    return dict((k, info.get(k)) for k in ("id", "name", "image", "image_id", "status", "restart_policy"))
