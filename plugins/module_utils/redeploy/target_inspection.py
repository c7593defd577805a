# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What runs on a preflight's target: the managed or adoptable server, who holds its ports, every process that holds
a target GPU, the containers among them, and what the drain is to stop (docs/design.md, "The plan")."""

from __future__ import annotations

import os

from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import query as gpu_query
from ansible_collections.gpufleet.sglang.plugins.module_utils.server import launcher as launch_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import survey as pf
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import procfs
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import containers
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import secrets as secret_rules
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import sockets
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import ports as ports_mod


class TargetInspection(object):
    """The inspection methods of :class:`preflight.Preflight`."""

    # ------------------------------------------------------------------
    def inspect_server(self, launcher, selected, table=None):
        """What runs on the target: the managed/adoptable server, the port owner, the GPU holders."""
        try:
            cur = launcher.current()
        except launch_mod.LaunchError as exc:
            self.problem(exc.msg)
            cur = {"pid": None, "start": None, "record": None, "fingerprint": None, "source": None}
        table = table if table is not None else procfs.process_table(with_cgroup=True)
        managed_pids = [cur["pid"]] if cur["pid"] else []
        record = cur.get("record") or {}
        recorded = [(record.get("pid"), record.get("starttime"))] if record.get("pid") else []
        listening, owners = sockets.port_listeners(launcher.port)
        # The server this collection runs in a container (managers docker, podman) is the managed server, not a
        # container to adopt or refuse: its processes are the managed tree, and the teardown stops it through its runtime.
        boxed = self.container_lookup(((cur.get("container") or {}).get("id")) if cur["pid"] else None)
        port_owner, adopt_from_port = self._port_owner(launcher, table, selected, managed_pids, listening, owners, boxed)
        holders = self._gpu_holders(launcher, selected, table, managed_pids, recorded, adopt_from_port)
        self._check_holders(holders, boxed)
        running = None
        adapters = []
        if cur["pid"]:
            running = {"pid": cur["pid"], "fingerprint": cur.get("fingerprint"), "source": cur.get("source"),
                       "healthy": launcher.healthy_now()}
        elif adopt_from_port or (port_owner or {}).get("container") and port_owner["adoptable"]:
            running = {"pid": port_owner["pid"], "fingerprint": None, "source": "adopted (port owner%s)" % (
                "" if adopt_from_port else ", in a container"), "healthy": None}
        if (running and running["healthy"]) or adopt_from_port:
            adapters = self.runtime_adapters(launcher)
        expected, teardown = self._drain_roots(holders, managed_pids, adopt_from_port, table, boxed)
        adopted = self.report_containers()                               # stopped through their runtime instead
        expected = sorted(set(expected) | set(x for c in adopted for x in c["pids"]))
        ports = self.check_ports(launcher, table, expected)
        return {"current": cur, "running": running, "port_owner": port_owner, "holders": holders, "teardown_pids": teardown,
                "expected_pids": expected, "ports": ports, "lora_adapters": adapters, "containers": adopted}

    def _port_owner(self, launcher, table, selected, managed_pids, listening, owners, boxed):
        """Who holds the server's port: ``(port_owner, adopt_from_port)``; a port held by another server is a problem."""
        port_owner = None
        adopt_from_port = []
        if listening:
            managed_tree = set()
            for pid in managed_pids:
                managed_tree |= {pid} | set(procfs.descendants(table, pid))
            owner = owners[0] if owners else None
            info = table.get(owner) if owner else None
            port_owner = {
                "pid": owner, "comm": info.comm if info else None,
                "cmdline": " ".join(secret_rules.mask_argv(list(info.cmdline))) if info else None,
                "managed": bool(owners) and all(o in managed_tree for o in owners), "adoptable": False,
            }
            box = boxed(owner) if owner and not port_owner["managed"] else None
            if box:
                port_owner["container"] = box
                port_owner["adoptable"] = self.refuse_container(box, "PID %s (%s) on port %d" % (
                    owner, port_owner["cmdline"] or port_owner["comm"], launcher.port), owner, port_owner=not managed_pids)
            elif not port_owner["managed"]:
                holder_pids = set(gpu_query.holders(selected))
                owner_tree = ({owner} | set(procfs.descendants(table, owner))) if owner else set()
                if info is not None and info.sid == owner:
                    owner_tree |= set(pf._session(table, owner))
                if not managed_pids and owner_tree & holder_pids:
                    port_owner["adoptable"] = True
                    adopt_from_port = [owner]
                else:
                    who = ("PID %s (%s)" % (owner, port_owner["cmdline"] or port_owner["comm"])) if owner else \
                        "a process this user cannot see"
                    self.problem("%s: port %d is held by %s, which is not the managed server; stop it "
                                 "or choose another port" % (self.names.of("args", "port"), launcher.port, who))
        return port_owner, adopt_from_port

    def _gpu_holders(self, launcher, selected, table, managed_pids, recorded, adopt_from_port):
        """Every process that holds a target GPU (listed by the GPUs or holding its device files), classified."""
        p = self.p
        holder_gpus = {}
        for gpu in selected:
            for proc in gpu.get("processes", []):
                if proc.get("pid") is not None:
                    holder_gpus.setdefault(proc["pid"], set()).add(gpu.get("index"))
        listed = dict((pid, set(gpus)) for pid, gpus in holder_gpus.items())
        index_by_minor = dict((str(g.get("index")), g.get("index")) for g in selected)

        def index_of(path):
            minor = procfs.device_gpu_index(path)
            return index_by_minor.get(str(minor)) if minor is not None else None

        patterns = tuple(p["device_paths"])
        try:
            users = procfs.device_holders(table, patterns)
        except TypeError:
            users = {}
        for pid, paths in users.items():
            for path in paths:
                if index_of(path) is not None:
                    holder_gpus.setdefault(pid, set()).add(index_of(path))
        # Monitoring agents keep the device files open without using the GPUs: told apart by what nvidia-smi lists
        # and by the GPUs' memory (docs/reference/gpu-watchers.md).
        accounting = pf.memory_accounting(selected, table, lambda pid: procfs.device_fds(pid, patterns),
                                          max_used_mib=(p["settings"] or {}).get("gpu_verify_max_used_mib") or 16)
        watchers, suspects = pf.find_watchers(table, listed, dict((pid, paths) for pid, paths in users.items()
                                                                  if pid in holder_gpus), accounting, index_of)
        adopt_res, problems = pf.compile_patterns(p["adopt_patterns"], self.names)
        for text in problems:
            self.problem(text)
        exclude = set(gpu_query.GPU_SYSTEM_DAEMONS)
        own = set(procfs.self_and_ancestors()) if hasattr(procfs, "self_and_ancestors") else {os.getpid()}
        for pid in list(holder_gpus):
            if pid in own:
                holder_gpus.pop(pid)
        holders = pf.classify_holders(table, holder_gpus, managed_pids, launcher.unit if launcher.manager == "systemd" else None,
                                      recorded, list(p["adopt_pids"] or []), adopt_res, adopt_from_port, exclude,
                                      watchers=watchers, suspects=suspects, names=self.names)
        return holders

    def _check_holders(self, holders, boxed):
        """GPU holders in containers are named, never signalled; foreign holders are a problem unless allowed."""
        p = self.p
        for h in holders:
            box = boxed(h["pid"]) if h["class"] != "gone" else None
            if box:
                h["container"] = box
                if h["class"] not in ("watcher", "system"):     # never signalled: only named (or adopted)
                    self.refuse_container(box, "GPU holder PID %d (%s, GPUs %s)" % (
                        h["pid"], h["class"], ",".join(str(g) for g in h["gpus"])), h["pid"])
        foreign = [h for h in holders if h["class"] == "foreign" and not h.get("container")]
        if foreign and not p["allow_foreign"]:
            self.problem("the target GPUs are held by %d process(es) that are not this server's: %s. Another team's server? "
                         "Move this server to other GPUs (%s), name it in %s or "
                         "%s if this deploy replaces it, or set %s: true to stop it"
                         % (len(foreign), "; ".join(pf.describe_foreign(h) for h in foreign), self.names.of("gpus"),
                            self.names.of("adopt_pids"), self.names.of("adopt_patterns"), self.names.of("allow_foreign")))

    def _drain_roots(self, holders, managed_pids, adopt_from_port, table, boxed):
        """``(expected, teardown)``: the PIDs the drain expects on the GPUs and the roots it signals."""
        p = self.p
        # The drain signals the roots it is given (SGLang stops its own schedulers on SIGTERM); every holder that
        # belongs to the plan is expected, any other one makes the drain refuse to signal anything.
        wanted = [h for h in holders if h["class"] in ("managed", "adopted", "orphan")
                  or (h["class"] == "foreign" and p["allow_foreign"])]
        roots = set(managed_pids + adopt_from_port + [x for x in (p["adopt_pids"] or []) if x in table])
        for h in wanted:
            if h["class"] == "orphan":
                roots.add(h["pid"])
            elif h["class"] == "foreign":
                roots.add(h.get("root") or h["pid"])
            elif not managed_pids and not adopt_from_port:
                roots.add(h["pid"])
        expected = sorted(roots | set(h["pid"] for h in wanted))
        teardown = sorted(roots)
        for pid in list(teardown):
            box = boxed(pid)
            if box:
                self.refuse_container(box, "teardown root PID %d" % pid, pid)
                teardown.remove(pid)                                    # never signalled from the host
        return expected, teardown

    def container_lookup(self, managed_id=None):
        """``boxed(pid)``: the container (inspected, once per container) a process runs in, unless it is this module's
        own; None on the host. Starts the per-run list of containers to refuse (:meth:`refuse_container`)."""
        own = containers.container_of("self")
        seen = {}
        self._boxed = {}
        self._adopted = {}

        def boxed(pid):
            found = containers.foreign_container(pid, own=own or {})
            if not found or (managed_id and found["id"] == managed_id):
                return None
            key = (found["runtime"], found["id"], found["part"])
            if key not in seen:
                seen[key] = containers.inspect(found)
            return seen[key]
        return boxed

    def refuse_container(self, box, who, pid=None, port_owner=False):
        """Note ``who`` (a PID and its role in the plan) as a process in ``box`` that the plan would adopt or signal,
        unless the plan adopts ``box`` (it serves on the managed port, ``port_owner``, or is named in adopt_containers:
        containers.adoptable); then ``pid`` is noted as one of its processes and True returned."""
        if self._adopted.get(box["id"]) or containers.adoptable(box, port_owner, self.p.get("adopt_containers")):
            entry = self._adopted.setdefault(box["id"], containers.adopted_entry(
                box, containers.adoptable(box, port_owner, self.p.get("adopt_containers"))))
            entry["pids"] = sorted(set(entry["pids"]) | ({pid} if pid else set()))
            return True
        whos = self._boxed.setdefault((box["runtime"], box["id"], box["part"]), [box, []])[1]
        if who not in whos:
            whos.append(who)
        return False

    def report_containers(self):
        """One problem per refused container: what runs there, why the host must not signal it, and the fix (issue 24).
        Returns the adopted containers (containers.adopted_entry), stopped through their runtime by the teardown."""
        adopted = containers.check_adopt_refs(self.p.get("adopt_containers"), self._adopted.values(), self.problem,
                                              self.notes.append, self.names.of("adopt_containers"))
        for box, whos in self._boxed.values():
            engine = "the kubelet" if box["runtime"] not in containers.CLIS else box["runtime"]
            policy = (" (restart policy %s)" % box["restart_policy"]) if box.get("restart_policy") else ""
            self.problem(
                "%s %s in the %s. The preflight does not adopt, stop or signal a process in a container: a signal from "
                "the host ends only that process, and %s%s starts it again, so it takes the port and the GPUs back after "
                "the outage has begun. Stop the container with %s, then run again, or name it in %s "
                "to have the teardown stop it through its runtime (docs/user-guide.md, \"Servers "
                "in containers\"); nothing was touched" % (
                    "; ".join(whos), "runs" if len(whos) == 1 else "run", containers.describe(box), engine, policy,
                    containers.fix(box), self.names.of("adopt_containers")))
        return adopted

    def check_ports(self, launcher, table, teardown):
        """Every port the new server binds must be free, or held by what the teardown stops (or only lingering)."""
        ours = set()
        for pid in teardown:
            if pid in table:
                ours |= {pid} | set(procfs.descendants(table, pid)) | set(pf._session(table, table[pid].sid))
        out = []
        for item in ports_mod.bound_ports(launcher.args, node_rank=int(launcher.args.get("node_rank") or 0)):
            status = sockets.port_status(item["port"])
            strangers = [l for l in status["listeners"] if l.get("pid") not in ours]
            entry = dict(item, free=status["free"], lingering=status.get("lingering") or {},
                         held_by=[l.get("pid") for l in status["listeners"]])
            out.append(entry)
            if strangers and item["port"] != launcher.port:
                self.problem("port %d (%s) is held by %s, which this deploy does not replace; the new server would fail "
                             "with \"Port is already in use\". Stop it, or change the port in %s"
                             % (item["port"], item["what"], sockets.describe(status), self.names.of("args")))
        return out
