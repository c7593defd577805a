"""Fake ``nvidia-smi`` backed by the simulated node (driver 535.261.03 by default,
or the branch ``gpusim init --driver-version`` names).

Where a public capture exists (tests/captures/nvidia-smi/, sources in its
manifest.json) the output follows it byte for byte and a golden test
compares the two; elsewhere the literal strings and exit codes follow
docs/reference/nvidia-smi.md (cited "§N"), and what no source confirms is
marked [unconfirmed] or [assumed] here. Imports are kept to the bare minimum: this runs
on every poll.
"""
from __future__ import annotations

import os
import sys
import time

from . import node as _node

# §1.5 [verified]: literal stdout of the real binary, and its exit codes.
DRIVER_FAILURE = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                  "Make sure that the latest NVIDIA driver is installed and running.\n\n")
RC_DRIVER = 9
LIBRARY_MISSING = (
    "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure that the "
    "NVIDIA Display Driver is properly installed and present in your system.\n"
    "Please also try adding directory that contains libnvidia-ml.so to your system PATH.\n")
RC_LIBRARY = 12
# §1.5: "Failed to initialize NVML: %s" + "NVML library version: %d.%02d"; rc 18 [reported].
VERSION_MISMATCH = ("Failed to initialize NVML: Driver/library version mismatch\n"
                    "NVML library version: %s\n")
RC_MISMATCH = 18
# Captures nvml-unknown-error.txt (gpustack#2078: stdout, rc 255) and
# nvml-no-supported-gpus.txt (issue 14; the stream is unconfirmed).
NVML_UNKNOWN = "Failed to initialize NVML: Unknown Error\n"
NVML_NO_SUPPORTED = "Failed to initialize NVML: No supported GPUs were found\nUnable to determine the number of GPUs\n"
RC_NVML_INIT = 255

# Argument errors: rc 2 per the man page (§1.6); for unknown fields the rc is
# [unconfirmed] (§1.1).  The trailing empty line mirrors the driver message
# layout [unconfirmed for these messages].
INVALID_ARGS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n\n"
# Capture option-not-recognized.txt: an option nvidia-smi does not know at all.
# The trailing empty line and rc 2 follow the other argument errors [unconfirmed].
OPTION_UNKNOWN = "ERROR: Option %s is not recognized. Please run 'nvidia-smi -h' for help.\n\n"
FORMAT_MANDATORY = "Format modifier --format=csv is mandatory.\n\n"       # §1.5 [verified string]
FORMAT_UNKNOWN = "Format modifier is not recognized.\n\n"                 # §1.5 [verified string]
FIELD_INVALID = 'Field "%s" is not a valid field to query.\n\n'            # §1.5 [verified string]
RC_ARGS = 2
# -i matching nothing: "No devices were found" (§1.5 [verified string]); rc 6,
# "object query failed" (§1.6) [unconfirmed].
NO_DEVICES = "No devices were found\n"
RC_NOT_FOUND = 6
# The lost-GPU line in its real spellings (captures lost-*.txt): driver 610
# prints the index and a four-digit PCI domain ("for GPU1: 0000:34:00.0:"),
# drivers from 525 "for GPU0000:65:00.0:" and older ones "for GPU 0000:0B:00.0:";
# the NVML error text follows (Unknown Error after Xid 79, Not Found, GPU is
# lost). rc 15 [unconfirmed].
HANDLE_ERROR_INDEX = "Unable to determine the device handle for GPU%d: %s: %s\n"
HANDLE_ERROR_NOSPACE = "Unable to determine the device handle for GPU%s: %s\n"
HANDLE_ERROR_SPACE = "Unable to determine the device handle for GPU %s: %s\n"
RC_LOST = 15
# §1.8 reset.  Refusal, older drivers (capture reset-in-use-process-old.txt,
# gpu-operator#118): "GPU %s is currently in use by another process." and the
# paragraph; newer drivers (capture reset-in-use-client.txt, rc 255 per
# NVSentinel#1690): an empty line, "The following GPUs could not be reset:",
# one "  GPU %s: In use by another client" line per GPU, then the paragraph.
# Which driver switched is not known; the simulator uses the new form from 550.
RESET_IN_USE = "GPU %s is currently in use by another process.\n"
RESET_IN_USE_NEW = "\nThe following GPUs could not be reset:\n%s\n"
RESET_NEW_FROM = 550
RESET_IN_USE_TAIL = (
    "\n%d device%s currently being used by one or more other processes (e.g., Fabric Manager, "
    "CUDA application, graphics application such as an X server, or a monitoring application "
    "such as another instance of nvidia-smi). Please first kill all processes using this device "
    "and all compute applications running in the system.\n")
RC_RESET_IN_USE = 255
# Non-root reset: rc 4 "insufficient permission" (§1.6); the layout follows
# the reported "The following GPUs could not be reset" form [unconfirmed].
RESET_NO_PERM = "The following GPUs could not be reset:\n%s\n"
RC_NO_PERM = 4
RESET_OK = "GPU %s was successfully reset.\n"
NO_DEVICES_LIST = "No devices found.\n"                                  # -L, §1.10

PLACEHOLDER_LOST = "[GPU is lost]"

HELP = """NVIDIA System Management Interface -- v%(v)s (gpusim fake)

NVSMI provides monitoring information for Tesla and select Quadro devices.
This is the gpusim simulator: state comes from $GPUSIM_ROOT.

nvidia-smi [OPTION1 [ARG1]] [OPTION2 [ARG2]] ...

    -h,   --help                Print usage information and exit.

  LIST OPTIONS:

    -L,   --list-gpus           Display a list of GPUs connected to the system.

  SUMMARY OPTIONS:

    -i,   --id=                 Target a specific GPU (index, UUID, PCI bus id or
                                serial; comma separated list accepted).

  SELECTIVE QUERY OPTIONS:

    --query-gpu=                Information about GPU.
                                Call --help-query-gpu for more info.
    --query-compute-apps=       List of currently active compute processes.
                                Call --help-query-compute-apps for more info.
    --format=                   Comma separated list of format options:
                                  csv - comma separated values (MANDATORY)
                                  noheader - skip the first line with column headers
                                  nounits - don't print units for numerical values

  DEVICE MODIFICATION OPTIONS:

    -r    --gpu-reset           Trigger reset of the GPU. Requires root.

    --version                   Print version information.
"""


# ---------------------------------------------------------------- fields
def _mem(key):
    return lambda g, ctx: g[key]


def _mig(g):
    return g.get("mig_mode") == "Enabled"


GPU_FIELDS = {
    # canonical name: (unit or None, getter, survives a "fields"-mode lost GPU)
    "timestamp": (None, lambda g, ctx: ctx["timestamp"], True),
    "driver_version": (None, lambda g, ctx: ctx["node"].get("driver_version", _node.DRIVER_VERSION), True),
    "count": (None, lambda g, ctx: str(ctx["count"]), True),
    "index": (None, lambda g, ctx: str(g["index"]), True),
    "name": (None, lambda g, ctx: g["name"], True),
    "uuid": (None, lambda g, ctx: g["uuid"], True),
    "serial": (None, lambda g, ctx: g["serial"], True),
    "pci.bus_id": (None, lambda g, ctx: g["pci_bus_id"], True),
    "pci.domain": (None, lambda g, ctx: "0x%04X" % int(g["pci_bus_id"].split(":")[0], 16), True),
    "pci.bus": (None, lambda g, ctx: "0x%02X" % int(g["pci_bus_id"].split(":")[1], 16), True),
    "pci.device": (None, lambda g, ctx: "0x%02X" % int(g["pci_bus_id"].split(":")[2].split(".")[0], 16), True),
    "pci.device_id": (None, lambda g, ctx: ctx["node"].get("pci_device_id", "0x233510DE"), True),
    "persistence_mode": (None, lambda g, ctx: g.get("persistence_mode", "Enabled"), False),
    "compute_mode": (None, lambda g, ctx: "Default", False),
    "mig.mode.current": (None, lambda g, ctx: g.get("mig_mode", "Disabled"), False),
    "mig.mode.pending": (None, lambda g, ctx: g.get("mig_mode", "Disabled"), False),
    "reset_status.reset_required": (None, lambda g, ctx: g.get("reset_required", "No"), False),
    "reset_status.drain_and_reset_recommended": (
        None, lambda g, ctx: g.get("drain_and_reset_recommended", "No"), False),
    "memory.total": ("MiB", _mem("total_mib"), False),
    "memory.reserved": ("MiB", _mem("reserved_mib"), False),
    "memory.used": ("MiB", _mem("used_mib"), False),
    "memory.free": ("MiB", _mem("free_mib"), False),
    # With MIG enabled the whole GPU has no utilisation figure: [N/A].
    "utilization.gpu": ("%", lambda g, ctx: "[N/A]" if _mig(g) else 0, False),
    "utilization.memory": ("%", lambda g, ctx: "[N/A]" if _mig(g) else 0, False),
    "temperature.gpu": (None, lambda g, ctx: "32", False),
    "power.draw": ("W", lambda g, ctx: "%.2f" % (69.5 + (0 if g["used_mib"] <= g["idle_used_mib"] else 48.3)), False),
    "power.limit": ("W", lambda g, ctx: "%.2f" % ctx["node"].get("power_limit_w", 700), False),
}
# Aliases accepted by the real binary (--help-query-gpu); headers use the canonical name.
GPU_ALIASES = {"gpu_name": "name", "gpu_uuid": "uuid", "gpu_serial": "serial",
               "gpu_bus_id": "pci.bus_id"}

APP_FIELDS = ("timestamp", "gpu_name", "gpu_bus_id", "gpu_serial", "gpu_uuid", "pid",
              "process_name", "used_gpu_memory")
APP_UNITS = {"used_gpu_memory": "MiB"}
# §1.1: used_memory is an alias whose header still reads used_gpu_memory [MiB].
APP_ALIASES = {"used_memory": "used_gpu_memory", "name": "process_name"}


class Usage(Exception):
    """An argument error: ``text`` goes to stdout, ``rc`` is the exit code."""

    def __init__(self, text, rc=RC_ARGS):
        super().__init__(text)
        self.text = text
        self.rc = rc


# ------------------------------------------------------------- arguments
VALUE_LONG = {"--query-gpu": "query_gpu", "--query-compute-apps": "query_apps",
              "--format": "format", "--id": "id"}
FLAGS = {"-L": "list", "--list-gpus": "list", "-r": "reset", "--gpu-reset": "reset",
         "--help-query-gpu": "help_gpu", "--help-query-compute-apps": "help_apps",
         "--version": "version"}
NOT_SIMULATED = ("-q", "--query", "-l", "--loop", "-lms", "--loop-ms", "-f", "--filename",
                 "-x", "--xml-format", "-d", "--display", "-pm", "--persistence-mode",
                 "-c", "--compute-mode", "-e", "--ecc-config", "-mig", "--multi-instance-gpu",
                 "-u", "--unit", "-a", "dmon", "pmon", "topo", "nvlink", "drain", "mig")


def parse_args(argv):
    opts = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        key = None
        val = None
        if a.startswith("--") and "=" in a:
            name, val = a.split("=", 1)
            key = VALUE_LONG.get(name)
            if key is None:
                raise Usage(OPTION_UNKNOWN % a)
        elif a in VALUE_LONG or a == "-i":
            key = "id" if a == "-i" else VALUE_LONG[a]
            if i + 1 >= len(argv):
                raise Usage(INVALID_ARGS)
            i += 1
            val = argv[i]
        elif a.startswith("-i") and len(a) > 2 and not a.startswith("--"):
            key, val = "id", a[2:].lstrip("=")
        elif a in FLAGS:
            opts[FLAGS[a]] = True
            i += 1
            continue
        elif a in NOT_SIMULATED:
            raise Usage("gpusim: nvidia-smi option %r is not simulated (see simulator/README.md)\n"
                        % a, RC_ARGS)
        else:
            raise Usage(OPTION_UNKNOWN % a)
        if key in opts:
            raise Usage(INVALID_ARGS)
        opts[key] = val
        i += 1
    return opts


def parse_format(spec):
    mods = [m.strip() for m in spec.split(",") if m.strip()]
    known = ("csv", "noheader", "nounits")
    if "csv" not in mods:
        raise Usage(FORMAT_MANDATORY)
    for m in mods:
        if m not in known:
            raise Usage(FORMAT_UNKNOWN)
    return {"header": "noheader" not in mods, "units": "nounits" not in mods}


def parse_fields(spec, table, aliases):
    out = []
    for f in spec.split(","):
        f = f.strip()
        if not f:
            continue
        canon = aliases.get(f, f)
        if canon not in table:
            raise Usage(FIELD_INVALID % f)
        out.append(canon)
    if not out:
        raise Usage(FIELD_INVALID % spec)
    return out


# ------------------------------------------------------------- selection
def _parse_bus(tok):
    """``[domain:]bus:device[.function]`` in hex -> tuple, or None."""
    parts = tok.split(":")
    if len(parts) == 2:
        parts = ["0"] + parts
    if len(parts) != 3:
        return None
    dev, _dot, fn = parts[2].partition(".")
    try:
        return (int(parts[0], 16), int(parts[1], 16), int(dev, 16), int(fn or "0", 16))
    except ValueError:
        return None


def select(gpus, spec):
    """Resolve ``-i`` into GPU dicts; Usage(rc 6) when an entry matches nothing."""
    if spec is None:
        return list(gpus)
    out = []
    for tok in spec.split(","):
        tok = tok.strip()
        hits = []
        if tok.isdigit() and int(tok) < len(gpus):
            hits = [g for g in gpus if g["index"] == int(tok)]
        elif tok.upper().startswith("GPU-"):
            hits = [g for g in gpus if g["uuid"].lower() == tok.lower()]
        elif ":" in tok:
            want = _parse_bus(tok)
            hits = [g for g in gpus if want is not None and _parse_bus(g["pci_bus_id"]) == want]
        if not hits and tok:
            hits = [g for g in gpus if g["serial"] == tok]  # a board serial may name several GPUs
        if not hits:
            raise Usage(NO_DEVICES, RC_NOT_FOUND)
        for g in hits:
            if g not in out:
                out.append(g)
    return out


# ---------------------------------------------------------------- output
def _fmt(value, unit, units):
    if isinstance(value, str):
        if value.startswith("[") or not unit:
            return value
        return "%s %s" % (value, unit) if units else value
    if unit:
        return "%d %s" % (value, unit) if units else "%d" % value
    return str(value)


def _header(fields, units_of):
    cols = []
    for f in fields:
        u = units_of(f)
        cols.append("%s [%s]" % (f, u) if u else f)
    return ", ".join(cols)


def _timestamp():
    t = time.time()
    return time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(t)) + ".%03d" % (int(t * 1000) % 1000)


class Out:
    def __init__(self, env=None, driver_version=_node.DRIVER_VERSION):
        self.env = os.environ if env is None else env
        self.driver_version = driver_version
        self.chunks = []
        self.err = []
        self.rc = 0

    def w(self, s):
        self.chunks.append(s)


def short_bus_id(bus):
    """``00000000:18:00.0`` -> ``0000:18:00.0``: the four-digit domain the lost-GPU line prints."""
    domain, _sep, rest = bus.partition(":")
    return "%04X:%s" % (int(domain, 16), rest)


def lost_line(g, driver_version):
    major = _node.driver_major(driver_version)
    bus = short_bus_id(g["pci_bus_id"])
    reason = g.get("lost_reason") or _node.LOST_REASONS[0]
    if major >= 610:
        return HANDLE_ERROR_INDEX % (g["index"], bus, reason)
    if major >= 525:
        return HANDLE_ERROR_NOSPACE % (bus, reason)
    return HANDLE_ERROR_SPACE % (bus, reason)


def _lost_lines(out, lost):
    stream = out.env.get("GPUSIM_SMI_LOST_STREAM", "stdout")
    for g in lost:
        line = lost_line(g, out.driver_version)
        (out.err if stream == "stderr" else out.chunks).append(line)
    if lost:
        out.rc = RC_LOST


def _split_lost(sel):
    lost = [g for g in sel if g.get("lost") and g.get("lost_mode", "handle") == "handle"]
    ok = [g for g in sel if g not in lost]
    return ok, lost


def query_gpu(out, snap, sel, fields, fmt):
    ok, lost = _split_lost(sel)
    _lost_lines(out, lost)
    ctx = {"node": snap["node"], "count": len(snap["gpus"]), "timestamp": _timestamp()}
    if fmt["header"]:
        out.w(_header(fields, lambda f: GPU_FIELDS[f][0]) + "\n")
    for g in ok:
        vals = []
        overrides = g.get("overrides") or {}
        for f in fields:
            unit, getter, static = GPU_FIELDS[f]
            if f in overrides:
                vals.append(overrides[f])
            elif g.get("lost") and not static:
                vals.append(PLACEHOLDER_LOST)
            else:
                vals.append(_fmt(getter(g, ctx), unit, fmt["units"]))
        out.w(", ".join(vals) + "\n")


def process_rows(snap, sel, env=None):
    """Rows as the driver lists them: one per (GPU, PID), memory summed."""
    env = os.environ if env is None else env
    container = env.get("GPUSIM_SMI_CONTAINER", "") not in ("", "0")
    all_na = env.get("GPUSIM_SMI_PROCESS_MEMORY", "").lower() in ("na", "n/a", "[n/a]")
    rows = []
    for g in sel:
        by_pid = {}
        for h in snap["holds"]:
            if not h["listed"] or g["index"] not in h.get("gpus", ()):
                continue
            hidden = _node.hidden(h, container)
            pid = _node.pid_for_display(h, container)
            row = by_pid.get(pid)
            if row is None:
                row = {"gpu": g, "pid": pid, "mib": 0, "na": all_na, "hidden": hidden,
                       "name": "[Not Found]" if hidden else (h.get("name") or "[Not Found]"),
                       "holds": []}
                by_pid[pid] = row
                rows.append(row)
            row["mib"] += int(h["mib"])
            row["na"] = row["na"] or bool(h.get("na_memory"))
            row["holds"].append(h["id"])
    return rows


def query_apps(out, snap, sel, fields, fmt):
    ok, lost = _split_lost(sel)
    _lost_lines(out, lost)
    ok = [g for g in ok if not g.get("lost")]  # "fields"-mode lost GPU: no process list
    ts = _timestamp()
    if fmt["header"]:
        out.w(_header(fields, APP_UNITS.get) + "\n")
    for r in process_rows(snap, ok, out.env):
        g = r["gpu"]
        vals = []
        for f in fields:
            if f == "timestamp":
                vals.append(ts)
            elif f == "gpu_name":
                vals.append(g["name"])
            elif f == "gpu_bus_id":
                vals.append(g["pci_bus_id"])
            elif f == "gpu_serial":
                vals.append(g["serial"])
            elif f == "gpu_uuid":
                vals.append(g["uuid"])
            elif f == "pid":
                vals.append(str(r["pid"]))
            elif f == "process_name":
                vals.append(r["name"])
            elif f == "used_gpu_memory":
                vals.append("[N/A]" if r["na"] else _fmt(r["mib"], "MiB", fmt["units"]))
        out.w(", ".join(vals) + "\n")


def list_gpus(out, snap, sel):
    if not sel:
        out.w(NO_DEVICES_LIST)
        return
    for g in sel:
        if g.get("lost") and g.get("lost_mode", "handle") == "handle":
            _lost_lines(out, [g])
        else:
            out.w("GPU %d: %s (UUID: %s)\n" % (g["index"], g["name"], g["uuid"]))


def _cell(text, width, right=False):
    return text.rjust(width) if right else text.ljust(width)


def _gpu_name_cell(name):
    return name if len(name) <= 27 else name[:24] + "..."


def table(out, snap, sel):
    """The default boxed table, in the layout the captures show (table-*.txt): 89
    columns inside the frame; below 580 the line under the banner starts with
    "|", from 580 on with "+"; from 610 the banner reads "KMD Version" and
    "CUDA UMD Version", and a lost GPU's line comes before a table of the GPUs
    that still answer (before 610 the summary prints only the lost lines
    [reported])."""
    ok, lost = _split_lost(sel)
    node = snap["node"]
    ver = node.get("driver_version", _node.DRIVER_VERSION)
    major = _node.driver_major(ver)
    cuda = _node.DRIVERS.get(ver, {}).get("cuda", _node.CUDA_VERSION)
    if lost:
        _lost_lines(out, lost)
        if major < 610:
            return
    border = "+" + "-" * 89 + "+"
    cells = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"
    now = time.localtime()
    out.w(time.strftime("%a %b ", now) + "%2d" % now.tm_mday + time.strftime(" %H:%M:%S %Y", now) + "       \n")
    out.w(border + "\n")
    if major >= 610:
        out.w("| NVIDIA-SMI %-23sKMD Version: %-14sCUDA UMD Version: %-9s|\n" % (ver, ver, cuda))
    else:
        out.w("| NVIDIA-SMI %-23sDriver Version: %-15sCUDA Version: %-9s|\n" % (ver, ver, cuda))
    out.w(("|" + cells[1:] if major < 580 else cells) + "\n")
    out.w("| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |\n")
    out.w("| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |\n")
    out.w("|                                         |                        |               MIG M. |\n")
    out.w("|" + "=" * 41 + "+" + "=" * 24 + "+" + "=" * 22 + "|\n")
    for g in ok:
        pm = "On" if g.get("persistence_mode", "Enabled") == "Enabled" else "Off"
        out.w("|%4d  %-29s%4s  |   %-16s %3s | %20s |\n"
              % (g["index"], _gpu_name_cell(g["name"]), pm, g["pci_bus_id"], "Off", "0"))
        if g.get("lost"):
            fan, temp, perf, power, mem, util = "ERR!", "ERR!", "ERR!", "ERR! /  ERR!", "ERR!", "ERR!"
            out.w("|%4s%6s%6s%24s |%23s | %7s%13s |\n" % (fan, temp, perf, power, mem, util, "Default"))
        else:
            busy = g["used_mib"] > g["idle_used_mib"]
            util = "N/A" if _mig(g) else "0%"
            out.w("| %3s%6s%6s%16s / %4sW |%11s / %9s | %7s%13s |\n" % (
                "N/A", "32C", "P0", "%dW" % (118 if busy else 70), node.get("power_limit_w", 700),
                "%dMiB" % g["used_mib"], "%dMiB" % g["total_mib"], util, "Default"))
        out.w("|                                         |                        | %20s |\n" % (
            g.get("mig_mode", "Disabled")))
        out.w(cells + "\n")
    out.w(("" if major >= 610 else " " * 89) + "\n")
    out.w(border + "\n")
    out.w("| Processes:" + " " * 78 + "|\n")
    out.w("|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |\n")
    out.w("|        ID   ID                                                               Usage      |\n")
    out.w("|" + "=" * 89 + "|\n")
    rows = [r for r in process_rows(snap, [g for g in ok if not g.get("lost")], out.env)
            if not r["hidden"]]
    if not rows:
        out.w("|  No running processes found" + " " * 61 + "|\n")
    for r in rows:
        name = r["name"]
        if len(name) > 37:
            name = "..." + name[-34:]
        mem = "N/A" if r["na"] else "%dMiB" % r["mib"]
        out.w("|%5d   N/A  N/A%16d      C   %-37s%9s |\n" % (r["gpu"]["index"], r["pid"], name, mem))
    out.w(border + "\n")


def reset(out, snap, sel, all_selected, node_obj):
    euid_env = out.env.get("GPUSIM_SMI_EUID")
    euid = int(euid_env) if euid_env not in (None, "") else os.geteuid()
    ok, lost = _split_lost(sel)
    lost += [g for g in ok if g.get("lost")]
    if lost:
        _lost_lines(out, lost)
        return
    if euid != 0:
        out.w(RESET_NO_PERM % "\n".join("  GPU %s: Insufficient Permissions" % g["pci_bus_id"]
                                        for g in sel))
        out.rc = RC_NO_PERM
        return
    try:
        node_obj.reset([g["index"] for g in sel])
    except _node.GpuInUse as e:
        busy = [g for g in sel if g["index"] in e.gpus]
        if _node.driver_major(out.driver_version) >= RESET_NEW_FROM:
            out.w(RESET_IN_USE_NEW % "\n".join("  GPU %s: In use by another client" % g["pci_bus_id"] for g in busy))
        else:
            for g in busy:
                out.w(RESET_IN_USE % g["pci_bus_id"])
        n = len(busy)
        out.w(RESET_IN_USE_TAIL % (n, " is" if n == 1 else "s are"))
        out.rc = RC_RESET_IN_USE
        return
    for g in sel:
        out.w(RESET_OK % g["pci_bus_id"])
    if all_selected:
        out.w("All done.\n")


def run(argv, env=None):
    """Return ``(rc, stdout_text, stderr_text)`` for an nvidia-smi command line."""
    env = os.environ if env is None else env
    if "-h" in argv or "--help" in argv:  # works without a driver (§1.5)
        return 0, HELP % {"v": _node.DRIVER_VERSION}, ""
    root = env.get(_node.ROOT_ENV)
    hint = ""
    state = None
    node_obj = None
    if not root:
        hint = "gpusim: %s is not set, so there is no simulated NVIDIA stack\n" % _node.ROOT_ENV
    else:
        node_obj = _node.Node(root)
        try:
            cfg = node_obj.config()
            state = cfg.get("driver", "loaded")
        except _node.DriverError as e:
            hint = "gpusim: %s\n" % e
    if state is None:
        return RC_LIBRARY, LIBRARY_MISSING, hint
    version = cfg.get("driver_version", _node.DRIVER_VERSION)
    # On 535 the driver check runs before argument validation (§1.5).
    if state == "unloaded":
        return RC_DRIVER, DRIVER_FAILURE, ""
    if state == "nolib":
        return RC_LIBRARY, LIBRARY_MISSING, ""
    if state == "mismatch":
        return RC_MISMATCH, VERSION_MISMATCH % _node.DRIVERS.get(version, {}).get("nvml", _node.NVML_VERSION), ""
    if state == "nvml_unknown":
        return RC_NVML_INIT, NVML_UNKNOWN, ""
    if state == "nosupported":
        return RC_NVML_INIT, NVML_NO_SUPPORTED, ""
    out = Out(env, driver_version=version)
    try:
        opts = parse_args(argv)
        if opts.get("version"):
            info = _node.DRIVERS.get(version, {})
            return 0, ("\nNVIDIA-SMI version  : %s\nNVML version        : %s\n"
                       "DRIVER version      : %s\nCUDA Version        : %s\n\n"
                       % (version, info.get("nvml", _node.NVML_VERSION), version,
                          info.get("cuda", _node.CUDA_VERSION))), ""
        if opts.get("help_gpu"):
            return 0, "".join("%s\n" % f for f in GPU_FIELDS), ""
        if opts.get("help_apps"):
            return 0, "".join("%s\n" % f for f in APP_FIELDS), ""
        qg, qa = opts.get("query_gpu"), opts.get("query_apps")
        modes = [m for m in ("list", "reset") if opts.get(m)] + (["q"] if qg or qa else [])
        if (qg and qa) or len(modes) > 1:
            raise Usage(INVALID_ARGS)
        if (qg or qa) and "format" not in opts:
            raise Usage(FORMAT_MANDATORY)
        if "format" in opts and not (qg or qa):
            raise Usage(INVALID_ARGS)
        fmt = parse_format(opts["format"]) if "format" in opts else None
        if qg:
            fields = parse_fields(qg, GPU_FIELDS, GPU_ALIASES)
        elif qa:
            fields = parse_fields(qa, APP_FIELDS, APP_ALIASES)
        snap = node_obj.snapshot()
        gpus = snap["gpus"]
        if not gpus and not opts.get("list"):
            raise Usage(NO_DEVICES, RC_NOT_FOUND)
        sel = select(gpus, opts.get("id"))
        if qg:
            query_gpu(out, snap, sel, fields, fmt)
        elif qa:
            query_apps(out, snap, sel, fields, fmt)
        elif opts.get("list"):
            list_gpus(out, snap, sel)
        elif opts.get("reset"):
            reset(out, snap, sel, opts.get("id") is None, node_obj)
        else:
            table(out, snap, sel)
    except Usage as u:
        return u.rc, u.text, ""
    except _node.DriverError as e:  # node vanished mid-call
        return RC_LIBRARY, LIBRARY_MISSING, "gpusim: %s\n" % e
    return out.rc, "".join(out.chunks), "".join(out.err)


def main(argv=None):
    delay = os.environ.get("GPUSIM_SMI_DELAY")
    if delay:
        try:
            time.sleep(max(0.0, float(delay)))
        except ValueError:
            sys.stderr.write("gpusim: ignoring bad GPUSIM_SMI_DELAY=%r\n" % delay)
    argv = sys.argv[1:] if argv is None else argv
    rc, out, err = run(argv)
    try:
        if out:
            sys.stdout.write(out)
            sys.stdout.flush()
        if err:
            sys.stderr.write(err)
            sys.stderr.flush()
    except BrokenPipeError:  # e.g. `nvidia-smi | head -1`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return rc
