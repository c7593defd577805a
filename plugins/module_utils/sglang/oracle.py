# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Ask the node's own SGLang how it resolves a set of arguments.

``resolve_on_node`` runs ``oracle_helper`` (shipped in the module's own
payload) with the node's SGLang interpreter in a separate process: an argv
list, the request as JSON on stdin, a timeout, and a kill of that process's
group by PID when it runs over; no shell. The helper never touches a GPU (see
its docstring). Standard library only, Python 3.9+.

``resolve_in_image`` (issue 24) runs the same helper with the Python inside a
container image (``<cli> run --rm -i --network none --pull never ...``): no
GPU, no network, the request on stdin; its result has ``"image"`` too.

Result::

    {"source": "node", "ok", "sglang_version", "args", "warnings", "error",
     "import_s", "resolve_s", "elapsed_s", "python"}

``ok`` False with ``error`` {type, message} is SGLang refusing the arguments
(an answer). ``OracleUnavailable`` is raised when no answer could be had: no
interpreter, SGLang does not import, a timeout, or output that is not the
helper's JSON.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

DEFAULT_TIMEOUT = 120.0
_MAX_OUTPUT = 32 * 1024 * 1024


class OracleUnavailable(Exception):
    """The node's SGLang could not be asked (not: it refused the arguments)."""


def helper_source():
    """The helper's source text, also from inside an AnsiballZ zip (through the module loader)."""
    try:
        from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import oracle_helper
    except ImportError as exc:  # pragma: no cover - the helper ships beside this module
        raise OracleUnavailable("the oracle helper is not in the module payload: %s" % exc)
    loader = getattr(oracle_helper, "__loader__", None)
    source = None
    if loader is not None and hasattr(loader, "get_source"):
        try:
            source = loader.get_source(oracle_helper.__name__)
        except (ImportError, OSError):
            source = None
    if isinstance(source, bytes):
        source = source.decode("utf-8")
    if source is None:
        path = getattr(oracle_helper, "__file__", None)
        if path and os.path.isfile(path):
            with open(path, "r") as handle:
                source = handle.read()
    if not source:
        raise OracleUnavailable("cannot read the oracle helper's source from the module payload")
    return source


def _argv_of(args_or_argv, version):
    if isinstance(args_or_argv, (list, tuple)):
        return [str(t) for t in args_or_argv]
    from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.render import to_argv

    # Secrets change nothing in the resolution: they are not sent to the helper.
    return to_argv(args_or_argv, version, secrets="omit")


def _kill(proc):
    """SIGKILL the helper's process group (it was started in its own session), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (OSError, ProcessLookupError):
        try:
            proc.kill()
        except OSError:
            pass
    try:
        proc.communicate(timeout=10)
    except (subprocess.TimeoutExpired, OSError, ValueError):
        pass


def run_helper(python, request, timeout=DEFAULT_TIMEOUT, cwd=None, env=None, python_label="python"):
    """Run the helper with ``python`` on ``request``; returns its decoded answer.

    Raises OracleUnavailable for a missing interpreter, a timeout (the process
    group is killed by PID), a non-zero exit without an answer, or garbage.
    """
    python = str(python)
    where = "the node's SGLang at %s could not resolve the arguments" % python
    if not os.path.isabs(python):
        raise OracleUnavailable("%s: the interpreter must be an absolute path" % where)
    if not os.access(python, os.X_OK) or os.path.isdir(python):
        raise OracleUnavailable("%s: no executable interpreter there; set the server's python (%s) "
                                "to the interpreter of the SGLang installation" % (where, python_label))
    return run_argv([python], request, where, timeout=timeout, cwd=cwd, env=env)


def run_argv(prefix, request, where, timeout=DEFAULT_TIMEOUT, cwd=None, env=None, on_timeout=None):
    """Run ``prefix + ["-c", helper source]`` (``prefix`` ends with a Python interpreter) on ``request`` (JSON on
    stdin); returns the helper's decoded answer. ``where`` starts every error; ``on_timeout()`` runs after the kill
    (a container runtime removes what the killed client left running). Raises OracleUnavailable."""
    source = helper_source()
    child_env = dict(os.environ if env is None else env)
    child_env.pop("PYTHONSTARTUP", None)
    payload = json.dumps(request)
    started = time.time()
    try:
        # Not AnsibleModule.run_command: the helper needs its own session (killed as a group on timeout) and a deadline.
        proc = subprocess.Popen(list(prefix) + ["-c", source], stdin=subprocess.PIPE, stdout=subprocess.PIPE,  # pylint: disable=ansible-bad-function
                                stderr=subprocess.PIPE, cwd=cwd, env=child_env, start_new_session=True,
                                close_fds=True)
    except OSError as exc:
        raise OracleUnavailable("%s: cannot start it (%s)" % (where, exc))
    try:
        out, err = proc.communicate(payload.encode(), timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        if on_timeout is not None:
            on_timeout()
        raise OracleUnavailable("%s: no answer within %.0f s (the helper, PID %d, was killed)" % (where, timeout, proc.pid))
    elapsed = time.time() - started
    text = out.decode("utf-8", "replace")
    tail = err.decode("utf-8", "replace").strip().splitlines()[-5:]
    if len(out) > _MAX_OUTPUT:
        raise OracleUnavailable("%s: the helper's answer is larger than %d bytes" % (where, _MAX_OUTPUT))
    try:
        answer = json.loads(text)
    except ValueError:
        raise OracleUnavailable("%s: the helper exited %s without a JSON answer (stdout %r; stderr: %s)"
                                % (where, proc.returncode, text[:200], " | ".join(tail) or "empty"))
    if not isinstance(answer, dict):
        raise OracleUnavailable("%s: the helper's answer is not a JSON object: %r" % (where, text[:200]))
    if answer.get("import_error"):
        error = answer["import_error"]
        raise OracleUnavailable("%s: importing SGLang failed with %s: %s" % (where, error.get("type"), error.get("message")))
    if proc.returncode != 0:
        raise OracleUnavailable("%s: the helper exited %s (stderr: %s)" % (where, proc.returncode, " | ".join(tail) or "empty"))
    answer["elapsed_s"] = round(elapsed, 3)
    return answer


def _masked(args):
    """The resolved fields with every secret field's value replaced (an argv list may have carried one)."""
    from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.flags import FLAGS

    out = {}
    for name, value in args.items():
        secret = name in FLAGS and FLAGS[name]["secret"]
        out[name] = "********" if secret and value not in (None, "", False) else value
    return out


def resolve_on_node(python, args_or_argv, version, gpu, env=None, timeout=DEFAULT_TIMEOUT, cwd=None, python_label="python"):
    """Resolve ``args_or_argv`` (a dict of args, rendered for ``version``, or an argv list) with the node's SGLang.

    ``gpu``: {name, compute_capability, memory_mib, count} as nvidia-smi reports
    them; ``env``: the server's environment (SGLANG_* switches). Returns the
    result described in the module docstring; raises OracleUnavailable.
    """
    argv = _argv_of(args_or_argv, version)
    request = {"argv": argv, "gpu": dict(gpu or {}), "env": dict((str(k), str(v)) for k, v in (env or {}).items())}
    # The helper runs in the server's environment (PYTHONPATH, LD_LIBRARY_PATH, ...), so that it imports the
    # SGLang the server will import.
    process_env = dict(os.environ)
    process_env.update(request["env"])
    answer = run_helper(python, request, timeout=timeout, cwd=cwd, env=process_env, python_label=python_label)
    return _resolved(answer, "the node's SGLang at %s" % python, python=python)


def _resolved(answer, who, **extra):
    """The result of the module docstring from the helper's ``answer`` (``who``: the words of an error)."""
    if "args" not in answer or "ok" not in answer:
        raise OracleUnavailable("%s could not resolve the arguments: the helper's answer has no resolution (%r)"
                                % (who, sorted(answer)))
    if answer.get("cuda_guard"):
        raise OracleUnavailable("%s could not resolve the arguments: it tried to initialise CUDA (%s), which the "
                                "oracle refuses" % (who, ", ".join(answer["cuda_guard"])))
    result = {
        "source": "node",
        "ok": bool(answer.get("ok")),
        "sglang_version": answer.get("sglang_version"),
        "args": _masked(answer.get("args") or {}),
        "warnings": list(answer.get("warnings") or []),
        "error": answer.get("error"),
        "import_s": answer.get("import_s"),
        "resolve_s": answer.get("resolve_s"),
        "elapsed_s": answer.get("elapsed_s"),
    }
    result.update(extra)
    return result


def _mount_args(mounts):
    """``-v host:ctr:ro`` for each mount: a path (the same inside) or a (host, container) pair."""
    argv = []
    for mount in mounts or ():
        host, inside = (mount, mount) if isinstance(mount, str) else tuple(mount)
        for path in (host, inside):
            if not isinstance(path, str) or not os.path.isabs(path) or ":" in path or "," in path:
                raise OracleUnavailable("cannot mount %r into the image for the oracle: a mount is an absolute path "
                                        "without ':' or ','" % (path,))
        argv += ["-v", "%s:%s:ro" % (host, inside)]
    return argv


def resolve_in_image(cli, image_ref, args_or_argv, version, gpu, env=None, mounts=(), timeout=DEFAULT_TIMEOUT,
                     python="python3", cli_env=None):
    """Resolve ``args_or_argv`` with the SGLang inside the container image ``image_ref`` (best: the image ID).

    ``<cli> run --rm -i --network none --pull never --name gpufleet-oracle-<pid>-<hex> [-v host:ctr:ro ...]
    --entrypoint <python> <image_ref> -c <helper source>``: no GPU (no --gpus, no --device), no network, never a
    pull, the image's ENTRYPOINT bypassed (one that prints on stdout, such as a banner, would spoil the answer). The
    request, ``env`` included (the helper applies it inside before importing SGLang), goes on stdin: never in argv.
    On a timeout the client is killed by PID and the container removed by its name. ``cli_env``: the runtime
    client's environment (DOCKER_HOST, CONTAINERS_CONF; default this process's). Returns resolve_on_node's result
    with ``"python"`` the interpreter inside and ``"image": image_ref``; raises OracleUnavailable.
    """
    argv = _argv_of(args_or_argv, version)
    request = {"argv": argv, "gpu": dict(gpu or {}), "env": dict((str(k), str(v)) for k, v in (env or {}).items())}
    name = "gpufleet-oracle-%d-%s" % (os.getpid(), os.urandom(4).hex())
    runtime = os.path.basename(str(cli))
    prefix = [str(cli), "run", "--rm", "-i", "--network", "none", "--pull", "never", "--name", name,
              "--label", "gpufleet.sglang.role=oracle"] + _mount_args(mounts) + ["--entrypoint", str(python), str(image_ref)]
    client_env = dict(os.environ if cli_env is None else cli_env)

    def remove():
        try:
            subprocess.run([str(cli), "rm", "--force", name], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,  # pylint: disable=ansible-bad-function
                           stderr=subprocess.DEVNULL, env=client_env, timeout=60, check=False)
        except (OSError, subprocess.SubprocessError):
            pass

    who = "the SGLang of image %s (%s)" % (image_ref, runtime)
    answer = run_argv(prefix, request, "%s could not resolve the arguments" % who, timeout=timeout, env=client_env,
                      on_timeout=remove)
    return _resolved(answer, who, python=str(python), image=str(image_ref))
