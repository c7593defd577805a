"""``gpusim``: control CLI of the GPU node simulator.

The command names and options below are a contract other tests rely on
(simulator/README.md).  Exit codes: 0 success, 1 error, 2 usage error or
CUDA out of memory.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from . import node as _node


def _die(msg: str, rc: int = 1):
    sys.stderr.write("gpusim: %s\n" % msg)
    return rc


def _node_from_env() -> "_node.Node":
    return _node.Node.from_env()


def _parse_gpus(node: "_node.Node", spec: str) -> list:
    count = len(node.config()["gpus"])
    if spec.strip().lower() == "all":
        return list(range(count))
    out = []
    for tok in spec.split(","):
        tok = tok.strip()
        if not tok.isdigit():
            raise ValueError("--gpus takes comma-separated GPU indices or 'all', got %r" % spec)
        i = int(tok)
        if i >= count:
            raise ValueError("GPU %d does not exist (this node has %d GPUs: 0-%d)"
                             % (i, count, count - 1))
        if i in out:
            raise ValueError("GPU %d listed twice in --gpus" % i)
        out.append(i)
    if not out:
        raise ValueError("--gpus is empty")
    return out


def _nonneg_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected seconds, got %r" % text)
    if v < 0:
        raise argparse.ArgumentTypeError("must be >= 0, got %r" % text)
    return v


def _pos_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected a whole number, got %r" % text)
    if v <= 0:
        raise argparse.ArgumentTypeError("must be > 0, got %r" % text)
    return v


def _nonneg_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected a whole number, got %r" % text)
    if v < 0:
        raise argparse.ArgumentTypeError("must be >= 0, got %r" % text)
    return v


def status_dict(node: "_node.Node") -> dict:
    snap = node.snapshot()
    cfg = snap["node"]
    gpus = []
    for g in snap["gpus"]:
        gpus.append({k: g.get(k) for k in (
            "index", "uuid", "name", "pci_bus_id", "serial", "total_mib", "reserved_mib",
            "used_mib", "free_mib", "idle_used_mib", "mig_mode", "lost", "lost_mode", "lost_reason", "persistence_mode",
            "reset_required", "drain_and_reset_recommended", "overrides")})
    holds = []
    for h in snap["holds"]:
        d = dict(h)
        d["alive"] = h["state"] == "alive"
        d["keepers"] = [dict(k, alive=_node.proc_alive(h, k.get("pid"), k.get("starttime")))
                        for k in h.get("keepers") or ()]
        if h.get("pid") is not None:
            d["display_pid"] = _node.pid_for_display(h)
        holds.append(d)
    return {"root": node.root, "model": cfg.get("model"), "driver": cfg.get("driver"),
            "driver_version": cfg.get("driver_version"), "time": snap["time"],
            "gpus": gpus, "holds": holds}


# ----------------------------------------------------------------- commands
def cmd_init(a) -> int:
    root = os.environ.get(_node.ROOT_ENV)
    if not root:
        return _die("%s is not set; export it to the node directory first" % _node.ROOT_ENV)
    old = _node.Node(root)
    live = []
    if old.initialised():
        try:
            live = [h for h in old.holds() if h["state"] in ("alive", "inherited")]
        except Exception:
            live = []
    try:
        n = _node.Node.create(root, gpus=a.gpus, model=a.model, reserved_mib=a.reserved_mib,
                              idle_used_mib=a.idle_used_mib, seed=a.seed, driver_version=a.driver_version,
                              mig=a.mig)
    except ValueError as e:
        return _die(str(e), 2)
    if live:
        sys.stderr.write("gpusim: warning: re-initialised with %d live holder(s) still running "
                         "(PIDs %s); their memory is no longer counted\n"
                         % (len(live), ", ".join(str(h["pid"]) for h in live)))
    cfg = n.config()
    print("initialised %d x %s%s (driver %s) at %s" % (
        len(cfg["gpus"]), _node.MODELS[a.model]["name"], " in MIG mode" if a.mig else "", cfg["driver_version"],
        n.root))
    return 0


def cmd_hold(a) -> int:
    from . import holder

    node = _node_from_env()
    try:
        gpus = _parse_gpus(node, a.gpus)
    except ValueError as e:
        return _die(str(e), 2)
    if a.ignore_sigterm and a.exit_delay:
        return _die("--ignore-sigterm and --exit-delay are mutually exclusive", 2)
    try:
        res = holder.spawn(node, gpus, a.mib, name=a.name, ignore_sigterm=a.ignore_sigterm,
                           exit_delay=a.exit_delay, release_delay=a.release_delay, stuck=a.stuck,
                           na_memory=a.na_memory, foreign_ns=a.foreign_ns, children=a.children)
    except holder.SpawnError as e:
        return _die(str(e), e.rc)
    if a.json:
        print(json.dumps(res))
    else:
        print(res["pid"])
    return 0


def cmd_monitor(a) -> int:
    from . import holder

    node = _node_from_env()
    try:
        gpus = _parse_gpus(node, a.gpus)
    except ValueError as e:
        return _die(str(e), 2)
    try:
        res = holder.spawn_monitor(node, gpus, name=a.name, uvm=not a.no_uvm, interval=a.interval)
    except holder.SpawnError as e:
        return _die(str(e), e.rc)
    if a.json:
        print(json.dumps(res))
    else:
        print(res["pid"])
    return 0


def cmd_attach(a) -> int:
    node = _node_from_env()
    try:
        gpus = _parse_gpus(node, a.gpus)
        hid = node.hold(a.pid, gpus, a.mib, name=a.name, release_delay=a.release_delay,
                        stuck=a.stuck, na_memory=a.na_memory, foreign_ns=a.foreign_ns,
                        meta={"source": "gpusim attach"})
    except _node.OutOfMemory as e:
        return _die(str(e), 2)
    except (ValueError, ProcessLookupError) as e:
        return _die(str(e), 2)
    print(hid)
    return 0


def cmd_orphan(a) -> int:
    node = _node_from_env()
    try:
        gpus = _parse_gpus(node, a.gpu)
        hid = node.orphan(gpus, a.mib)
    except _node.OutOfMemory as e:
        return _die(str(e), 2)
    except ValueError as e:
        return _die(str(e), 2)
    print(hid)
    return 0


def cmd_release(a) -> int:
    node = _node_from_env()
    if a.id:
        n = 1 if node.release(a.id) else 0
    else:
        n = node.release_pid(a.pid)
    if not n:
        return _die("nothing to release for %s" % ("hold %s" % a.id if a.id else "PID %d" % a.pid))
    print(n)
    return 0


def cmd_driver(a) -> int:
    state = {"load": "loaded", "unload": "unloaded"}.get(a.state, a.state)
    _node_from_env().set_driver(state)
    return 0


def cmd_lose(a) -> int:
    try:
        _node_from_env().lose(a.gpu, a.mode, {"unknown": _node.LOST_REASONS[0], "not-found": _node.LOST_REASONS[1],
                                              "gpu-is-lost": _node.LOST_REASONS[2]}[a.reason])
    except ValueError as e:
        return _die(str(e), 2)
    return 0


def cmd_recover(a) -> int:
    try:
        _node_from_env().recover(a.gpu)
    except ValueError as e:
        return _die(str(e), 2)
    return 0


def cmd_override(a) -> int:
    from .smi import GPU_ALIASES, GPU_FIELDS

    field = GPU_ALIASES.get(a.field, a.field)
    if field not in GPU_FIELDS:
        return _die("unknown --query-gpu field %r" % a.field, 2)
    if a.clear == (a.value is not None):
        return _die("give exactly one of --value TEXT or --clear", 2)
    try:
        _node_from_env().set_override(a.gpu, field, None if a.clear else a.value)
    except ValueError as e:
        return _die(str(e), 2)
    return 0


def cmd_set(a) -> int:
    value = a.value
    if a.attr in ("idle_used_mib", "reserved_mib"):
        try:
            value = int(value)
        except ValueError:
            return _die("%s needs a whole number of MiB" % a.attr, 2)
    try:
        _node_from_env().set_gpu_attr(a.gpu, a.attr, value)
    except ValueError as e:
        return _die(str(e), 2)
    return 0


def cmd_status(a) -> int:
    print(json.dumps(status_dict(_node_from_env()), indent=1 if a.pretty else None,
                     sort_keys=True))
    return 0


def cmd_checkpoint(a) -> int:
    from . import checkpoint
    try:
        files = checkpoint.write_checkpoint(a.directory, seed=a.seed, shards=a.shards)
    except OSError as e:
        return _die("cannot write a checkpoint into %s: %s" % (a.directory, e.strerror or e))
    print(json.dumps({"directory": a.directory, "files": files}))
    return 0


def cmd_cdi_spec(a) -> int:
    from . import cdi
    try:
        spec = cdi.write_spec(a.out, a.dev_dir, gpus=a.gpus, kind=a.kind)
    except ValueError as e:
        return _die(str(e), 2)
    except OSError as e:
        return _die("cannot write the CDI spec %s or its device files in %s: %s" % (a.out, a.dev_dir, e.strerror or e))
    print(json.dumps({"out": a.out, "kind": spec["kind"], "devices": [d["name"] for d in spec["devices"]]}))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpusim", description="Control the simulated GPU node in $GPUSIM_ROOT "
        "(see simulator/README.md).")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    sub.required = True

    s = sub.add_parser("init", help="(re)initialise the node: wipes every hold")
    s.add_argument("--gpus", type=_nonneg_int, required=True, help="number of GPUs")
    s.add_argument("--model", choices=sorted(_node.MODELS), required=True)
    s.add_argument("--reserved-mib", type=_nonneg_int, default=None,
                   help="default: what the model shows on the driver (H200 614 MiB on 590.48.01, 616 on "
                        "580.173.02, 530 otherwise; H100 479)")
    s.add_argument("--idle-used-mib", type=_nonneg_int, default=None,
                   help="default: 0 MiB from driver 580 on, 1 MiB before; 55-59 MiB with --mig")
    s.add_argument("--driver-version", choices=sorted(_node.DRIVERS), default=_node.DRIVER_VERSION,
                   help="the driver branch nvidia-smi behaves like (default %(default)s)")
    s.add_argument("--mig", action="store_true", help="every GPU in MIG mode (treated as whole GPUs)")
    s.add_argument("--seed", help="UUID/serial seed (default: the root's real path)")
    s.set_defaults(fn=cmd_init)

    s = sub.add_parser("hold", help="start a detached process holding GPU memory; prints its PID")
    s.add_argument("--gpus", required=True, help="comma list of indices, or 'all'")
    s.add_argument("--mib", type=_pos_int, required=True, help="MiB held on each listed GPU")
    s.add_argument("--name", help="process comm (15 chars) and nvidia-smi process_name")
    s.add_argument("--ignore-sigterm", action="store_true", help="survive SIGTERM")
    s.add_argument("--exit-delay", type=_nonneg_float, default=0.0,
                   help="seconds to exit after SIGTERM")
    s.add_argument("--release-delay", type=_nonneg_float, default=0.0,
                   help="seconds the memory stays counted after the process died")
    s.add_argument("--stuck", action="store_true",
                   help="memory (and the PID listing) stay until a GPU reset")
    s.add_argument("--na-memory", action="store_true",
                   help="nvidia-smi reports used_gpu_memory as [N/A]")
    s.add_argument("--foreign-ns", action="store_true",
                   help="holder is in another PID namespace: listed as an invisible PID "
                        "with name [Not Found]")
    s.add_argument("--children", type=_nonneg_int, default=0,
                   help="fork N children that inherit the device fds (keep memory, unlisted)")
    s.add_argument("--json", action="store_true",
                   help="print {pid, watcher_pid, id, keepers} as JSON instead of the PID")
    s.set_defaults(fn=cmd_hold)

    s = sub.add_parser("monitor", help="start a detached monitoring agent (device files open, no memory, "
                                       "never a compute process); prints its PID")
    s.add_argument("--gpus", default="all", help="comma list of indices, or 'all' (default)")
    s.add_argument("--name", default="gpu-monitor", help="process comm (15 chars), default %(default)s")
    s.add_argument("--no-uvm", action="store_true",
                   help="leave dev/nvidia-uvm closed (a pure NVML client; by default it is open, as some agents keep it)")
    s.add_argument("--interval", type=_nonneg_float, default=1.0, help="seconds between polls (default %(default)s)")
    s.add_argument("--json", action="store_true", help="print {pid, devices} as JSON instead of the PID")
    s.set_defaults(fn=cmd_monitor)

    s = sub.add_parser("attach", help="register a hold for an existing live process")
    s.add_argument("--pid", type=_pos_int, required=True)
    s.add_argument("--gpus", required=True)
    s.add_argument("--mib", type=_pos_int, required=True)
    s.add_argument("--name")
    s.add_argument("--release-delay", type=_nonneg_float, default=0.0)
    s.add_argument("--stuck", action="store_true")
    s.add_argument("--na-memory", action="store_true")
    s.add_argument("--foreign-ns", action="store_true")
    s.set_defaults(fn=cmd_attach)

    s = sub.add_parser("orphan", help="memory held by no process (freed only by a reset)")
    s.add_argument("--gpu", required=True, help="GPU index (or comma list)")
    s.add_argument("--mib", type=_pos_int, required=True)
    s.set_defaults(fn=cmd_orphan)

    s = sub.add_parser("release", help="free holds immediately (graceful cudaFree)")
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("--pid", type=_pos_int)
    g.add_argument("--id")
    s.set_defaults(fn=cmd_release)

    s = sub.add_parser("driver", help="driver fault injection")
    s.add_argument("state", choices=["load", "unload", "nolib", "mismatch", "nosupported", "nvml_unknown"])
    s.set_defaults(fn=cmd_driver)

    s = sub.add_parser("lose", help="a GPU falls off the bus (Xid 79)")
    s.add_argument("--gpu", type=_nonneg_int, required=True)
    s.add_argument("--mode", choices=list(_node.LOST_MODES), default="handle",
                   help="handle: no device handle (default); fields: values read [GPU is lost]")
    s.add_argument("--reason", choices=["unknown", "not-found", "gpu-is-lost"], default="unknown",
                   help="the NVML error text after the bus id (default: Unknown Error)")
    s.set_defaults(fn=cmd_lose)

    s = sub.add_parser("recover", help="bring a lost GPU back")
    s.add_argument("--gpu", type=_nonneg_int, required=True)
    s.set_defaults(fn=cmd_recover)

    s = sub.add_parser("override", help="force the text of one --query-gpu field")
    s.add_argument("--gpu", type=_nonneg_int, required=True)
    s.add_argument("--field", required=True)
    s.add_argument("--value")
    s.add_argument("--clear", action="store_true")
    s.set_defaults(fn=cmd_override)

    s = sub.add_parser("set", help="set a stored GPU attribute")
    s.add_argument("--gpu", type=_nonneg_int, required=True)
    s.add_argument("--attr", required=True,
                   choices=["persistence_mode", "reset_required", "drain_and_reset_recommended",
                            "idle_used_mib", "reserved_mib", "mig_mode", "pci_bus_id"])
    s.add_argument("--value", required=True)
    s.set_defaults(fn=cmd_set)

    s = sub.add_parser("checkpoint", help="write a tiny valid checkpoint (safetensors weights, tokenizer files) "
                                          "into a model directory; its config.json is left as it is")
    s.add_argument("directory")
    s.add_argument("--seed", default="1", help="the weights' bytes (same shapes for every seed)")
    s.add_argument("--shards", type=_nonneg_int, default=1, help="more than 1: shards and model.safetensors.index.json")
    s.set_defaults(fn=cmd_checkpoint)

    s = sub.add_parser("cdi-spec", help="write a CDI spec giving containers the simulated GPUs "
                                        "(devices KIND=0..N-1 and KIND=all); creates DIR/nvidia<N>")
    s.add_argument("--out", required=True, help="the spec file (.json), e.g. /var/run/cdi/gpusim.json")
    s.add_argument("--dev-dir", required=True, help="directory for the nvidia<N> files the spec bind-mounts")
    s.add_argument("--gpus", type=_pos_int, default=8, help="number of GPUs (default %(default)s)")
    s.add_argument("--kind", default="nvidia.com/gpu", help="CDI kind, vendor/class (default %(default)s)")
    s.set_defaults(fn=cmd_cdi_spec)

    s = sub.add_parser("status", help="JSON: GPUs, holds with liveness, driver state")
    s.add_argument("--pretty", action="store_true")
    s.set_defaults(fn=cmd_status)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except _node.DriverError as e:
        return _die(str(e))
    except BrokenPipeError:
        return 1
