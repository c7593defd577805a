# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The outage window in one module run: tear down, prove the GPUs free, launch, health gate, config
check, prove the GPUs allocated, with the node journal written at every step and the lease renewed
while it works. No controller round trip happens while no server serves.

Used by the ``sglang_replace`` module (docs/design.md, "sglang_replace"). The GPU steps run the same
engines as the ``gpu_drain`` and ``gpu_memory_assert`` modules (``drain.py``, ``gpu_verify.py``), the
launch the same engine as ``sglang_launch`` (``launcher.py``).
"""

from __future__ import annotations

import os
import signal
import time

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import teardown
from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import target as gpu_target
from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import verify as gpu_verify
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import diff as diff_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import identity
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import journal as journal_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.server import launcher as launch_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import lease as lease_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import observe as node_observe
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import secrets as secret_rules
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import http
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import supervise as sp
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import sockets
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import containers
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import systemd
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import weights
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import names as names_mod

PHASES = ("all", "teardown", "launch", "verify", "weights")
# Fields that an in-place weight update changes while /server_info keeps the launch values (docs/reference/sglang-rules.md).
WEIGHT_FIELDS = ("model_path", "tokenizer_path", "served_model_name", "speculative_draft_model_path")
TARGETS = ("candidate", "known_good")
# Why a run failed, for the roles (machine-readable; ``failed_step`` says where): nothing on the node was changed, the
# teardown changed something and then failed, the candidate (or the known-good relaunch) failed, the failed candidate
# could not be stopped, a weight update failed, a signal stopped the module, the lease was lost.
REASONS = ("nothing_touched", "teardown_failed", "launch_failed", "stop_failed", "weights_failed", "interrupted",
           "lease_lost", "no_known_good", "spec_mismatch")


class NoKnownGood(launch_mod.LaunchError):
    """The known-good record that a rollback (target known_good) launches or updates back to does not exist."""


# The signal that stops a step (SIGTERM, SIGINT, SIGHUP), shared with sglang_promote's smoke gate.
Interrupted = journal_mod.Interrupted


class SpecMismatch(launch_mod.LaunchError):
    """The launch handed over is not the one the preflight planned (its fingerprint differs)."""


class ReplaceFailed(Exception):
    def __init__(self, msg, result):
        super(ReplaceFailed, self).__init__(msg)
        self.msg = msg
        self.result = result


def _typed(spec, params, what):
    """``params`` checked and converted by the engine's own argument spec: values in a dict option are not typed by
    Ansible (ansible-core 2.17 and 2.18 even render them all as strings)."""
    checked = ArgumentSpecValidator(spec).validate(dict(params))
    if checked.error_messages:
        raise launch_mod.LaunchError("%s: %s (nothing was touched)" % (what, "; ".join(checked.error_messages)))
    return checked.validated_parameters


def _flag(value, default=True):
    """A boolean of a dict option ("True", "false", "1", ... from older ansible-core)."""
    if value is None or value == "":
        return default
    try:
        return boolean(value)
    except TypeError:
        return default


def _runner(module):
    """The GPU engines' command runner (it honours their per-call timeouts: a hung nvidia-smi cannot hang the run)."""
    return gpu_target.module_run(module)


class Replace(object):
    def __init__(self, module):
        self.module = module
        self.p = module.params
        self.began = time.monotonic()
        self.run_id = self.p["run_id"]
        launch = dict(self.p["launch"] or {})
        self.state_dir = launch.get("state_dir")
        self.config_dir = launch.get("config_dir")
        self.journal_path = journal_mod.path_for(self.state_dir) if self.state_dir else None
        lease = dict(self.p["lease"] or {})
        self.lease_path = lease.get("path")
        self.lease_ttl = lease.get("ttl")
        self.keepalive = None
        self.step = None
        self.secrets = []
        # In the launch phase of a multi-node group the teardown ran in an earlier module run. ``torn_down``: the old
        # server was stopped (or there was none); ``touched``: this run changed what runs on the node (it signalled a
        # process, stopped a unit or started a server), the condition for any rollback.
        launch_phase = self.p["phase"] == "launch"
        self.result = {"changed": False, "phase": self.p["phase"], "target": self.p["target"],
                       "torn_down": launch_phase, "touched": launch_phase,
                       "signalled": [], "steps": [], "timings": {}, "node_state": "unchanged"}
        self.candidate_pid = None
        self.started = []         # (label, PID) of every server this run started: candidate, known-good
        self.verify_launcher = None
        self.part = "launch"      # the report's name of the part running now: teardown, launch, verify allocated

    # ------------------------------------------------------------------
    def elapsed(self):
        return round(time.monotonic() - self.began, 3)

    def mark(self, step, **fields):
        self.step = step
        self.result["steps"].append({"step": step, "at": self.elapsed()})
        if self.keepalive is not None:
            self.keepalive.check()
        if self.journal_path and self.run_id and not self.module.check_mode:
            journal_mod.record(self.journal_path, self.run_id, step, **fields)

    def tick(self):
        """Called while waiting: fail fast when the lease was taken over."""
        if self.keepalive is not None:
            self.keepalive.check()

    def check_planned(self, probe):
        """Refuse, before anything is touched, a candidate launch that is not the one the preflight planned."""
        planned = self.p.get("planned") or {}
        if self.p["target"] != "candidate" or not planned.get("fingerprint") or probe.fp == planned["fingerprint"]:
            return
        # The planned identity came through the controller, its secret digests masked: compare it masked the same way,
        # and say "a secret" where only a secret value differs.
        fields = [d["field"] for d in identity.differences(planned.get("identity"), secret_rules.redact(probe.identity))] \
            if planned.get("identity") else []
        raise SpecMismatch("the launch handed to sglang_replace is not the one the preflight planned (fingerprint %s, "
                           "planned %s): it differs in %s. Something changed between the two (a variable, an edited plan); "
                           "run the redeploy again, so that one preflight plans what is launched"
                           % (probe.fp, planned["fingerprint"], ", ".join(fields) if fields
                              else "a secret value (the API key, a secret env variable or a secret field of the args)"))

    def show_diff(self, planned, params, cur=None):
        """With ``--diff``: the running server's recorded launch against the candidate (redeploy/diff.py), taken before
        anything is touched. Only the candidate's run shows it (the preflight shows it in check mode only, a rollback
        not at all): one diff per real run. A launch that cannot be read back costs the diff, never the redeploy."""
        if not getattr(self.module, "_diff", False) or self.p["target"] != "candidate":
            return
        try:
            cur = cur if cur is not None else planned.current()
            owner = None
            if not cur.get("pid"):
                # An unrecorded server on the port, which the preflight adopted.
                _listening, owners = sockets.port_listeners(planned.port)
                owner = owners[0] if owners else None
            before = launch_mod.running_diff_source(self.module, cur, params, port_owner=owner)
            self.result["diff"] = diff_mod.launch_diff(before, planned.diff_source("planned"))
        except (launch_mod.LaunchError, OSError) as exc:
            self.module.warn("the diff of the running server's launch could not be built: %s" % getattr(exc, "msg", exc))

    def touch(self):
        """This run changed what runs on the node (a signal, a stopped unit, a started server)."""
        self.result["touched"] = True
        self.result["changed"] = True

    # ------------------------------------------------------------------
    def launch_params(self, target):
        base = dict(self.p["launch"] or {})
        base["api_key"] = self.p["api_key"]
        if target == "candidate":
            # The launch's args come from the preflight's plan, where secret values are masked; the secret fields
            # come apart, unmasked, in the no_log option secret_args.
            secret_args = dict((launch_mod.norm_key(k), v) for k, v in (self.p.get("secret_args") or {}).items())
            if secret_args:
                for field in ("args", "expect"):      # the prediction the effective-config check compares with, too
                    if isinstance(base.get(field), dict):
                        values = dict((launch_mod.norm_key(k), v) for k, v in base[field].items())
                        values.update((k, v) for k, v in secret_args.items() if field == "args" or k in values)
                        base[field] = values
            secret_env = dict((str(k), v) for k, v in (self.p.get("secret_env") or {}).items())
            if secret_env and isinstance(base.get("env"), dict):
                base["env"] = dict(base["env"], **secret_env)
            return base
        record, stored = launch_mod.load_record(launch_mod.known_good_dir(self.config_dir))
        if record is None:
            return None
        params = launch_mod.launch_params_from_record(record, stored, base)
        params["on_override"] = "warn"
        # The rollback's health gate gets the configured timeout, never the candidate's tighter budget.
        params["health_timeout"] = base.get("health_timeout_configured") or base.get("health_timeout") or 1800
        return params

    def teardown(self):
        p = self.p
        td = dict(p["teardown"] or {})
        launch = dict(p["launch"] or {})
        t0 = time.monotonic()
        self.part = "teardown"
        boxes = td.get("containers") or [] if p["target"] == "candidate" else []
        self.mark(journal_mod.TEARDOWN, detail="%ssignalling %s on GPUs %s" % (
            "".join("stopping %s; " % containers.stopped_line(c) for c in boxes),
            ", ".join(str(x) for x in td.get("pids") or []) or "the holders", ",".join(str(g) for g in td.get("gpus") or [])))
        self.stop_containers(boxes, td)
        unit = launch.get("unit") or "sglang-%s.service" % launch.get("name", "main")
        if launch.get("manager") in launch_mod.CONTAINER_MANAGERS:
            self.stop_managed_container()
        elif launch.get("manager") == "systemd":
            systemctl = self.module.get_bin_path("systemctl", required=True)
            run = _runner(self.module)
            try:
                props = systemd.show(run, systemctl, unit)
                if systemd.loaded(props) and systemd.is_active(props):
                    self.result["unit_stopped"] = unit
                    self.touch()
                    systemd.stop(run, systemctl, unit)
            except systemd.SystemdError as exc:
                self.module.warn("stopping %s failed (%s); the drain stops its processes by PID" % (unit, exc))
        params = _typed(teardown.ARGUMENT_SPEC, dict((k, v) for k, v in td.items() if k in teardown.ARGUMENT_SPEC),
                        "teardown")
        kept = {}
        try:
            drained = teardown.run_drain(params, _runner(self.module), check_mode=False, warn=self.module.warn,
                                         keep=kept)
        except teardown.DrainError as exc:
            self.result["signalled"] = (exc.result or {}).get("signalled", [])
            self.result["drain"] = exc.result
            # A drain that failed before its first signal (nvidia-smi hung or cut short, a holder it may not stop)
            # changed nothing: the old server still runs as it did.
            if any(item.get("signals") for item in self.result["signalled"]):
                self.result["torn_down"] = True
                self.touch()
            else:
                self.result["signalled"] = []     # planned, never signalled: the plan stays in ``drain``
            raise
        self.result["signalled"] = drained.get("signalled", [])
        self.result["drain"] = drained
        self.result["torn_down"] = True
        if any(item.get("signals") for item in self.result["signalled"]) or drained.get("changed"):
            self.touch()
        self.result["timings"]["teardown_s"] = round(time.monotonic() - t0, 3)
        # The drain's last snapshot was taken after every process it stopped had exited: judged first, it saves a
        # second nvidia-smi round inside the outage when the GPUs are free already.
        self.verify_gpus("free", td.get("gpus") or [], first_snapshot=kept.get("last_snapshot"))
        self.wait_ports(td.get("ports") or [])
        self.mark(journal_mod.TORN_DOWN, detail="the target GPUs and ports are free")
        self.part = "launch"

    def stop_managed_container(self):
        """The server this collection runs in a container is stopped through its runtime (``<cli> stop -t``), never
        signalled from the host; the drain then finds its processes gone and proves the GPUs and ports free."""
        params = self.launch_params("candidate")
        launcher = launch_mod.Launcher(self.module, params, check_mode=True)
        cur = launcher.current()
        if not cur.get("pid"):
            return
        self.result["container_stopped"] = dict(cur.get("container") or {}, pid=cur["pid"])
        self.touch()
        self.result["torn_down"] = True
        try:
            launcher.stop(cur)
        except launch_mod.LaunchError as exc:
            raise teardown.DrainError("the server's container could not be stopped through its runtime: %s" % exc.msg,
                                      {"container_stopped": self.result["container_stopped"], "signalled": []})

    def stop_containers(self, boxes, td):
        """The adopted containers of the plan (the preflight's plan.containers) are stopped through their runtime with
        the drain's term_timeout, never signalled from the host (a restart policy would start them again): issue 24.
        The drain and the GPU and port checks then run as for any teardown."""
        done = self.result.setdefault("containers_stopped", [])
        for box in boxes:
            try:
                done.append(containers.stop_adopted(box, float(td.get("term_timeout") or teardown.stop.DEFAULT_TERM_TIMEOUT)))
            except containers.ContainerError as exc:
                if exc.record.get("restart_policy_set"):
                    done.append(exc.record)
                if done:
                    self.result["torn_down"] = True
                    self.touch()
                raise teardown.DrainError("the adopted container could not be stopped through its runtime: %s" % exc.msg,
                                          {"containers_stopped": done, "signalled": []})
            self.result["torn_down"] = True
            self.touch()

    def restart_containers(self):
        """Without a known-good config to roll back to, the containers this run stopped are started again (their
        restart policy restored first); returns the words for the rollback's detail."""
        records = [c for c in self.result.get("containers_stopped") or [] if c.get("stopped") or c.get("restart_policy_set")]
        if not records:
            return ""
        started = [containers.start_adopted(c) for c in records]
        self.result["containers_restarted"] = started
        return "; %s" % "; ".join(("started the adopted %s again" % containers.stopped_line(c)) if c["started"] else
                                  ("the adopted %s could not be started again: %s" % (containers.stopped_line(c), c.get("start_error")))
                                  for c in started)

    def wait_ports(self, ports):
        """Every port the new server binds must be free (a SIGKILLed server's children can keep them); sockets that
        only linger (TIME_WAIT) do not count, as SGLang binds with SO_REUSEADDR."""
        if not ports:
            return
        timeout = float((self.p["verify"] or {}).get("timeout") or 120)
        t0 = time.monotonic()
        ok, busy = sockets.wait_ports_free(ports, timeout, interval=0.2, allow_lingering=True)
        self.result["timings"]["ports_free_s"] = round(time.monotonic() - t0, 3)
        if not ok:
            raise gpu_verify.VerifyError("the new server's ports are still in use %.0f s after the teardown: %s" % (
                timeout, "; ".join(sockets.describe(b) for b in busy)), {"ports": busy})

    def verify_gpus(self, state, gpus, first_snapshot=None):
        if state == "allocated":
            self.part = "verify allocated"
        vp = dict(self.p["verify"] or {})
        given = dict((k, v) for k, v in vp.items() if k in gpu_verify.ARGUMENT_SPEC)
        td = dict(self.p["teardown"] or {})
        for key in ("nvidia_smi", "backend", "device_paths"):
            if key in td and key in gpu_verify.ARGUMENT_SPEC:
                given[key] = td[key]
        given["gpus"] = list(gpus)
        given["state"] = state
        if state != "free":
            given["require_no_processes"] = False
        params = _typed(gpu_verify.ARGUMENT_SPEC, given, "verify")
        t0 = time.monotonic()
        result = gpu_verify.run_assert(params, _runner(self.module), check_mode=False, warn=self.module.warn,
                                       first_snapshot=first_snapshot)
        self.result["gpus_%s" % state] = result.get("gpus", [])
        self.result["timings"]["verify_%s_s" % state] = round(time.monotonic() - t0, 3)
        if result.get("reused_snapshot"):
            self.result["timings"]["verify_%s_reused" % state] = True
        return result

    def launch(self, params, label):
        """Start ``params`` and gate it; returns the launcher (result in ``launcher.result``)."""
        self.part = "launch"
        launcher = launch_mod.Launcher(self.module, params)
        blockers = launcher.plan()
        self.secrets.extend(launcher.secrets)
        if blockers:
            raise launch_mod.LaunchError("the %s config cannot be launched: %s" % (label, "; ".join(blockers)))
        launcher.result["unit_changed"] = launcher.write_files()
        t0 = time.monotonic()
        pid, start, offset, is_child = launcher.start(port_grace=10.0 if self.result["torn_down"] else 0.0)
        self.candidate_pid = pid
        self.started.append((label, pid))
        launcher.result["pid"] = pid
        self.touch()
        self.mark(journal_mod.LAUNCHING if label == "candidate" else journal_mod.ROLLING_BACK,
                  detail="%s PID %d started, waiting for %s" % (label, pid, launcher.p["health_path"]),
                  candidate={"pid": pid, "starttime": start, "fingerprint": launcher.fp} if label == "candidate" else None,
                  rollback={"pid": pid, "starttime": start, "fingerprint": launcher.fp} if label != "candidate" else None)
        launcher.wait_healthy(pid, start, offset, is_child, started=True, on_poll=self.tick)
        self.result["timings"]["%s_healthy_s" % label] = round(time.monotonic() - t0, 3)
        return launcher

    def update_weights(self):
        """Swap the weights of the running server in place (``/update_weights_from_disk``), verify them
        (``/model_info``, ``/weights_checker``), check the config, and record the server as running the
        intended config; no teardown, no restart. ``target=known_good`` updates back to the known-good record.
        A failed update that leaves the old weights serving changes nothing; one that does not is rolled back to
        the previous checkpoint, and, when that fails too, the server is restarted with the known-good config."""
        p = self.p
        # "" is unset too (ansible-core < 2.19 renders a templated none as an empty string).
        wp = dict((k, v) for k, v in (p["weights"] or {}).items() if v not in (None, ""))
        params = self.launch_params(p["target"])
        if params is None:
            raise NoKnownGood("there is no known-good config to update back to")
        launcher = launch_mod.Launcher(self.module, params)
        blockers = launcher.plan()
        self.secrets.extend(launcher.secrets)
        if blockers:
            raise launch_mod.LaunchError("the %s config cannot be applied: %s" % (p["target"], "; ".join(blockers)))
        cur = launcher.current()
        if not cur["pid"]:
            raise launch_mod.LaunchError("no managed server runs, so its weights cannot be updated in place; redeploy with "
                                         "%s: restart" % names_mod.Names.of_module(self.module).of("redeploy_mode"))
        self.candidate_pid = cur["pid"]
        self.show_diff(launcher, params, cur)
        new_path = launcher.args.get("model_path")
        self.part = "weights"
        self.mark(journal_mod.LAUNCHING if p["target"] == "candidate" else journal_mod.ROLLING_BACK,
                  detail="updating the weights of PID %s in place to %s" % (cur["pid"], new_path),
                  candidate={"pid": cur["pid"], "starttime": cur["start"], "fingerprint": launcher.fp, "mode": "weights"})
        self.result["torn_down"] = False
        t0 = time.monotonic()
        if _flag(wp.get("issue")):
            version = wp.get("weight_version") or self.run_id
            try:
                if p["target"] == "candidate":
                    done = weights.update_in_place(launcher.url, launcher.api_key, new_path, weight_version=version,
                                                   abort_all_requests=_flag(wp.get("abort_all_requests")),
                                                   flush_cache=_flag(wp.get("flush_cache")),
                                                   timeout=float(wp.get("timeout") or 600))
                else:
                    done = weights.roll_back(launcher.url, launcher.api_key, new_path, wp.get("previous_weight_version"),
                                             expected_checksum=wp.get("previous_checksum"),
                                             timeout=float(wp.get("timeout") or 600))
            except weights.WeightsError as exc:
                self.result["weights"] = exc.result
                return self.weights_failed(exc, launcher)
            self.result["weights"] = done
            self.result["changed"] = bool(done.get("changed"))
        self.result["timings"]["weights_s"] = round(time.monotonic() - t0, 3)
        # The server now runs the new checkpoint: its records and unit must say so (a reboot starts what it runs).
        launcher.result["unit_changed"] = launcher.write_files()
        if launcher.result["unit_changed"] and launcher.manager == "systemd":
            systemd.daemon_reload(_runner(self.module), launcher.systemctl())
        state = sp.read_state(launcher.state_file) or {}
        state.update(fingerprint=launcher.fp, identity=launcher.identity, argv=launcher.masked(launcher.argv))
        sp.write_state(launcher.state_file, state)
        launcher.result["pid"] = cur["pid"]
        expect = launcher.p["expect"] if launcher.p["expect"] is not None else launcher.args
        launcher.p["expect"] = dict((k, v) for k, v in (expect or {}).items() if k not in WEIGHT_FIELDS)
        if launcher.p["check_config"]:
            launcher.verify(0, None)
            # /server_info keeps the launch's model path after an update; what serves now is in /model_info.
            served = ((self.result.get("weights") or {}).get("model_info") or {})
            effective = launcher.result.setdefault("effective_args", {})
            for key in ("model_path", "weight_version"):
                if served.get(key) is not None:
                    effective[key] = served[key]
        self.result["launch"] = secret_rules.redact(launcher.result, self.secrets)
        if _flag((p["verify"] or {}).get("allocated")):
            self.verify_gpus("allocated", (p["teardown"] or {}).get("gpus") or [])
        if p["target"] == "candidate":
            self.mark(journal_mod.LAUNCHED, detail="weights of PID %s updated in place, verified" % cur["pid"])
            self.result["node_state"] = "candidate weights serving (not yet promoted)"
        else:
            self.mark(journal_mod.ROLLED_BACK, detail="weights of PID %s updated back to the known-good checkpoint" % cur["pid"])
            self.result["node_state"] = "known-good running"
        return self.finish()

    def weights_failed(self, exc, launcher):
        """A failed in-place update: nothing to do when the old weights still serve; else update back, else restart."""
        if self.p["target"] != "candidate":
            # Updating back to the known-good checkpoint failed: restart the server with the known-good config.
            self.result["failed_step"] = "weights"
            self.teardown()
            self.rollback_in_place("updating back to the known-good checkpoint failed: %s" % exc.msg)
            if (self.result.get("rollback") or {}).get("status") == "succeeded":
                return self.finish()
            raise ReplaceFailed(exc.msg, self.finish_result())
        if exc.result.get("old_weights_serving") or exc.result.get("failure") in ("path",) and \
                exc.result.get("old_weights_serving") is not False:
            self.record_failure(journal_mod.FAILED, "weights update failed, the old weights still serve: %s" % exc.msg)
            self.result["node_state"] = "unchanged (the old weights still serve)"
            self.result["failed_step"] = "weights"
            raise ReplaceFailed("%s (the old weights still serve; nothing else was changed)" % exc.msg, self.finish_result())
        wp = dict((k, v) for k, v in (self.p["weights"] or {}).items() if v not in (None, ""))
        self.result["failed_step"] = "weights"
        if wp.get("previous_model_path"):
            try:
                back = weights.roll_back(launcher.url, launcher.api_key, wp["previous_model_path"],
                                         wp.get("previous_weight_version"), expected_checksum=wp.get("previous_checksum"),
                                         timeout=float(wp.get("timeout") or 600))
                self.result["rollback"] = {"status": "succeeded", "mode": "weights",
                                           "detail": "updated back to %s: %s" % (wp["previous_model_path"], back.get("message"))}
                self.record_failure(journal_mod.ROLLED_BACK, "weights update failed, updated back: %s" % exc.msg)
                self.result["node_state"] = "known-good weights serving"
                raise ReplaceFailed(exc.msg, self.finish_result())
            except weights.WeightsError as back_exc:
                self.module.warn("updating back to the previous checkpoint failed (%s); restarting the server with the "
                                 "known-good config" % back_exc.msg)
        # The server's weights are in an unknown state: restart it with the known-good config.
        self.teardown()
        self.rollback_in_place(exc.msg)
        raise ReplaceFailed(exc.msg, self.finish_result())

    def verify_running(self):
        """Gate the server that already runs the intended config (an interrupted run's candidate): health, config
        check, GPUs allocated; nothing is stopped or started."""
        launcher = launch_mod.Launcher(self.module, self.launch_params("candidate"))
        blockers = launcher.plan()
        self.secrets.extend(launcher.secrets)
        if blockers:
            raise launch_mod.LaunchError("the intended config cannot be checked: %s" % "; ".join(blockers))
        cur = launcher.current()
        if not cur["pid"] or cur.get("fingerprint") != launcher.fp:
            raise launch_mod.LaunchError("the server that runs now (PID %s) is not the intended config any more; run the "
                                         "redeploy again" % cur["pid"])
        self.candidate_pid = cur["pid"]
        self.result["torn_down"] = True     # the server under test is the unverified candidate: a failure rolls back
        self.result["touched"] = True
        self.mark(journal_mod.LAUNCHING, detail="verifying the running candidate PID %s" % cur["pid"],
                  candidate={"pid": cur["pid"], "starttime": cur["start"], "fingerprint": launcher.fp})
        record = cur.get("record") or {}
        offset = record.get("log_offset", 0) if record.get("pid") == cur["pid"] else 0
        launcher.result["pid"] = cur["pid"]
        t0 = time.monotonic()
        try:
            launcher.wait_healthy(cur["pid"], cur["start"], offset, False, started=False, on_poll=self.tick)
        except launch_mod.LaunchError:
            self.verify_launcher = launcher
            raise
        self.result["timings"]["candidate_healthy_s"] = round(time.monotonic() - t0, 3)
        self.reload_adapters(launcher)
        self.result["launch"] = secret_rules.redact(launcher.result, self.secrets)
        if _flag((self.p["verify"] or {}).get("allocated")):
            self.verify_gpus("allocated", (self.p["teardown"] or {}).get("gpus") or [])
        self.mark(journal_mod.LAUNCHED, detail="running candidate PID %s healthy, config checked, GPUs allocated" % cur["pid"])
        self.result["node_state"] = "candidate running (not yet promoted)"
        return self.finish()

    def reload_adapters(self, launcher):
        """Load again the LoRA adapters the old server had loaded at runtime (they vanish on a restart), before the
        smoke gate; a failure fails the launch (and rolls back)."""
        adapters = list(self.p["lora_adapters"] or [])
        if not adapters:
            return
        loaded = []
        for item in adapters:
            body = {"lora_name": item.get("name"), "lora_path": item.get("path")}
            try:
                status, _h, answer = http.request("POST", launcher.url + "/load_lora_adapter", body=body,
                                                  api_key=launcher.api_key, timeout=float(self.p["lora_timeout"]))
            except http.HTTPConnectionError as exc:
                raise launch_mod.LaunchError("loading the LoRA adapter %s (%s) again failed: %s" % (
                    item.get("name"), item.get("path"), exc))
            if status != 200 or (isinstance(answer, dict) and answer.get("success") is False):
                raise launch_mod.LaunchError("loading the LoRA adapter %s (%s) again failed: HTTP %d %s" % (
                    item.get("name"), item.get("path"), status, str(answer)[:300]))
            loaded.append({"name": item.get("name"), "path": item.get("path"), "loaded": True})
        launcher.result["lora_adapters"] = loaded

    def stop_failed(self, launcher):
        """Stop a candidate that failed its gate (it may still run), then prove the GPUs free again."""
        td = dict(self.p["teardown"] or {})
        pid = self.candidate_pid
        stopped = []
        if launcher is not None and pid and sp.alive(pid):
            try:
                report = launcher.stop({"pid": pid, "start": sp.starttime(pid)})
                stopped = report.get("signalled", []) + report.get("killed", [])
            except launch_mod.LaunchError as exc:
                self.module.warn("stopping the failed candidate: %s" % exc.msg)
        # Only what this run started or already stopped may be signalled: the candidate, and the rest of the old server
        # this run's teardown signalled. Any other holder of the GPUs makes the drain refuse (and the rollback fail).
        given = dict((k, v) for k, v in td.items() if k in teardown.ARGUMENT_SPEC)
        ours = set(x for x in td.get("expected_pids") or [] if isinstance(x, int))
        ours |= set(item.get("pid") for item in self.result.get("signalled") or [] if isinstance(item.get("pid"), int))
        if pid:
            ours.add(pid)
        given.update(pids=[pid] if pid else [], expected_pids=sorted(ours), on_unexpected="fail")
        params = _typed(teardown.ARGUMENT_SPEC, given, "teardown")
        drained = teardown.run_drain(params, _runner(self.module), check_mode=False, warn=self.module.warn)
        self.result.setdefault("rollback_signalled", []).extend(drained.get("signalled", []) or [{"pid": p} for p in stopped])
        self.verify_gpus("free", td.get("gpus") or [])

    # ------------------------------------------------------------------
    def run(self):
        p = self.p
        for sig in journal_mod.STOP_SIGNALS:
            signal.signal(sig, journal_mod.raise_interrupted)
        if p["api_key"]:
            self.secrets.append(p["api_key"])
        launcher = None
        label = "candidate" if p["target"] == "candidate" else "known-good"
        try:
            with lease_mod.KeepAlive(self.lease_path, self.run_id, self.lease_ttl) as keepalive:
                self.keepalive = keepalive if self.lease_path else None
                self.ensure_directories()
                params = None
                if p["phase"] == "verify":
                    return self.verify_running()
                if p["phase"] == "weights":
                    return self.update_weights()
                if p["phase"] in ("all", "launch") or (p["phase"] == "teardown" and p.get("planned")):
                    params = self.launch_params(p["target"])
                    if params is None:
                        raise NoKnownGood("there is no known-good config to launch under %s" %
                                          launch_mod.known_good_dir(self.config_dir))
                    probe = launch_mod.Launcher(self.module, params, check_mode=True)
                    blockers = probe.plan()
                    if blockers:
                        raise launch_mod.LaunchError("the %s config cannot be launched: %s"
                                                     % (label, "; ".join(blockers)))
                    self.check_planned(probe)
                    if p["phase"] in ("all", "teardown"):
                        self.show_diff(probe, params)
                if p["phase"] in ("all", "teardown"):
                    if p["target"] == "known_good":
                        pids = [str(x) for x in (p["teardown"] or {}).get("pids") or []]
                        self.mark(journal_mod.ROLLING_BACK, detail="tearing down the failed candidate (PID %s)" % ", ".join(pids)
                                  if pids else "freeing the target GPUs of what this run left (no candidate PID known)")
                    self.teardown()
                    self.result["node_state"] = "no server"
                if p["phase"] == "teardown":
                    return self.finish()
                launcher = self.launch(params, "candidate" if p["target"] == "candidate" else "known-good")
                self.reload_adapters(launcher)
                self.result["launch"] = secret_rules.redact(launcher.result, self.secrets)
                vp = dict(p["verify"] or {})
                if _flag(vp.get("allocated")):
                    self.verify_gpus("allocated", (p["teardown"] or {}).get("gpus") or [])
                if p["target"] == "candidate":
                    self.mark(journal_mod.LAUNCHED, detail="candidate PID %s healthy, config checked, GPUs allocated"
                              % launcher.result.get("pid"))
                    self.result["node_state"] = "candidate running (not yet promoted)"
                else:
                    self.mark(journal_mod.ROLLED_BACK, detail="known-good PID %s healthy" % launcher.result.get("pid"))
                    self.result["node_state"] = "known-good running"
                return self.finish()
        except Interrupted as exc:
            self.result["failed_step"] = self.part
            self.result["reason"] = "interrupted"
            self.record_failure(journal_mod.INTERRUPTED, "%s at step %s" % (exc, self.step))
            raise ReplaceFailed("sglang_replace was %s at step %s; the node journal records it, and the next run continues "
                                "from there" % (exc, self.step), self.finish_result())
        except lease_mod.LeaseLost as exc:
            self.result["reason"] = "lease_lost"
            raise ReplaceFailed(str(exc), self.finish_result())
        except (launch_mod.LaunchError, teardown.DrainError, gpu_verify.VerifyError) as exc:
            return self.failed_or_interrupted(exc, launcher)
        except OSError as exc:
            return self.failed_or_interrupted(launch_mod.LaunchError("%s: %s" % (
                getattr(exc, "filename", None) or "a file", exc.strerror)), launcher)

    def failed_or_interrupted(self, exc, launcher):
        """The failure path (stop the candidate, roll back), which a signal can interrupt too."""
        try:
            return self.failed(exc, launcher)
        except Interrupted as stop:
            self.result["failed_step"] = self.part
            self.result["reason"] = "interrupted"
            self.record_failure(journal_mod.INTERRUPTED, "%s at step %s (while handling: %s)" % (
                stop, self.step, getattr(exc, "msg", exc)))
            raise ReplaceFailed("sglang_replace was %s at step %s while it handled a failure (%s); the node journal records "
                                "it, and the next run continues from there" % (stop, self.step, getattr(exc, "msg", exc)),
                                self.finish_result())

    def failed(self, exc, launcher):
        p = self.p
        self.result["failed_step"] = self.part
        if isinstance(exc, (gpu_verify.VerifyError, teardown.DrainError)) and getattr(exc, "result", None):
            self.result["verify_failure" if isinstance(exc, gpu_verify.VerifyError) else "drain"] = exc.result
        msg = getattr(exc, "msg", str(exc))
        extra = getattr(exc, "extra", None) or {}
        launcher = launcher or getattr(self, "verify_launcher", None)
        if launcher is not None:
            self.result["launch"] = secret_rules.redact(launcher.result, self.secrets)
        elif extra:
            self.result["launch"] = secret_rules.redact(extra, self.secrets)
        if not self.result["touched"]:
            # Nothing was signalled, stopped or started (the checks before the teardown, or a drain that failed before its
            # first signal): a preflight-like failure. No rollback: there is nothing to roll back.
            self.result["reason"] = ("no_known_good" if isinstance(exc, NoKnownGood)
                                     else "spec_mismatch" if isinstance(exc, SpecMismatch)
                                     else "weights_failed" if p["phase"] == "weights" else "nothing_touched")
            self.observe()
            where = "before the teardown" if self.step is None else "%s failed before it changed anything" % self.part
            self.record_failure(journal_mod.FAILED, "%s: %s; nothing was touched" % (where, msg), settled=True)
            raise ReplaceFailed("%s (nothing was touched; %s)" % (msg, self.result["node_state"]), self.finish_result())
        step = self.step
        failed_launcher = launcher or (launch_mod.Launcher(self.module, self.launch_params(p["target"]) or {})
                                       if p["phase"] != "teardown" else None)
        if failed_launcher is not None:
            try:
                failed_launcher.plan()
            except Exception:  # noqa: BLE001 - the stop below works by PID
                pass
        if p["phase"] == "teardown" or step in (journal_mod.TEARDOWN,):
            self.result["reason"] = "teardown_failed"
            self.record_failure(journal_mod.FAILED, "teardown failed: %s" % msg)
            self.observe()
            raise ReplaceFailed(msg, self.finish_result())
        self.result["reason"] = "weights_failed" if p["phase"] == "weights" else "launch_failed"
        try:
            self.stop_failed(failed_launcher)
        except (teardown.DrainError, gpu_verify.VerifyError, launch_mod.LaunchError) as stop_exc:
            self.result["reason"] = "stop_failed"
            self.record_failure(journal_mod.FAILED, "%s; stopping it failed too: %s" % (msg, getattr(stop_exc, "msg", stop_exc)))
            self.observe()
            self.result["rollback"] = {"status": "failed", "detail": "the failed %s could not be stopped: %s"
                                       % (p["target"], getattr(stop_exc, "msg", stop_exc))}
            raise ReplaceFailed(msg, self.finish_result())
        self.result["node_state"] = "no server"
        if p["target"] == "candidate" and p["rollback"]:
            self.rollback_in_place(msg)
        else:
            self.record_failure(journal_mod.FAILED, msg)
            self.observe()
        raise ReplaceFailed(msg, self.finish_result())

    def observe(self):
        """Set ``node_state`` (words) and ``node`` (facts) from what the node shows now: who listens on the server's
        port and answers /health, and who has the target GPUs' device files open (node/observe.py)."""
        launch = dict(self.p["launch"] or {})
        td = dict(self.p["teardown"] or {})
        args = dict(launch.get("args") or {})
        try:
            port = int(args.get("port") or launch_mod.DEFAULT_PORT)
        except (TypeError, ValueError):
            port = None
        planned = [x for x in td.get("pids") or [] if isinstance(x, int)]
        groups = [("old server" if self.p["target"] == "candidate" else "failed candidate", planned)]
        groups += [("candidate" if label == "candidate" else "known-good server", [pid]) for label, pid in self.started]
        if self.p["phase"] == "verify" and self.candidate_pid:
            groups.append(("candidate", [self.candidate_pid]))
        try:
            text, facts = node_observe.observe(port, args.get("host"), td.get("gpus") or [],
                                               node_observe.patterns_for(td.get("device_paths")), groups,
                                               tls=bool(args.get("ssl_certfile")))
        except (OSError, ValueError) as exc:
            text, facts = "unknown (the node could not be inspected: %s)" % exc, {"port": port, "error": str(exc)}
        self.result["node_state"] = text
        self.result["node"] = facts
        return text

    def rollback_in_place(self, why):
        """The candidate failed before it was healthy: launch the known-good config in this same run."""
        params = self.launch_params("known_good")
        if params is None:
            self.record_failure(journal_mod.FAILED, why)
            self.result["rollback"] = {"status": "unavailable",
                                       "detail": "no known-good config under %s (this node was never deployed successfully by "
                                                 "this collection)%s"
                                                 % (launch_mod.known_good_dir(self.config_dir), self.restart_containers())}
            self.observe()
            return
        self.mark(journal_mod.ROLLING_BACK, detail="candidate failed: %s" % why[:300])
        self.candidate_pid = None
        try:
            launcher = self.launch(params, "known-good")
            if _flag((self.p["verify"] or {}).get("allocated")):
                self.verify_gpus("allocated", (self.p["teardown"] or {}).get("gpus") or [])
        except (launch_mod.LaunchError, gpu_verify.VerifyError, teardown.DrainError) as exc:
            detail = "the last known-good config did not come back healthy: %s" % getattr(exc, "msg", exc)
            self.record_failure(journal_mod.FAILED, "candidate failed, rollback failed: %s" % detail[:300])
            self.result["rollback"] = {"status": "failed", "detail": detail}
            self.observe()
            return
        self.mark(journal_mod.ROLLED_BACK, detail="known-good PID %s healthy" % launcher.result.get("pid"))
        self.result["rollback"] = {"status": "succeeded", "pid": launcher.result.get("pid"),
                                   "detail": "relaunched the last known-good config (pid %s, healthy after %s s)" % (
                                       launcher.result.get("pid"), launcher.result.get("startup_s"))}
        self.result["rollback_launch"] = secret_rules.redact(launcher.result, self.secrets)
        self.result["node_state"] = "known-good running"

    def record_failure(self, step, detail, settled=False):
        if self.journal_path and self.run_id and not self.module.check_mode:
            try:
                journal_mod.record(self.journal_path, self.run_id, step, detail=detail[:500])
            except OSError as exc:
                self.module.warn("the node journal %s could not be written: %s" % (self.journal_path, exc))

    def ensure_directories(self):
        """Create or fix the server's directories (mode, owner, group) that the preflight found missing or wrong."""
        spec = dict(self.p["directories"] or {})
        paths = [x for x in spec.get("paths") or [] if x]
        if not paths:
            return
        mode = int(str(spec.get("mode") or "0750"), 8)
        uid = gid = -1
        if spec.get("owner"):
            uid = launch_mod.uid_of(spec["owner"])
        if spec.get("group"):
            gid = launch_mod.gid_of(spec["group"])
        made = []
        for path in paths:
            if not os.path.isdir(path):
                os.makedirs(path, mode)
            os.chmod(path, mode)
            if uid != -1 or gid != -1:
                os.chown(path, uid, gid)
            made.append(path)
        self.result["directories"] = made
        self.result["changed"] = True

    def finish_result(self):
        self.result["elapsed"] = self.elapsed()
        self.result["lines"] = result_lines(self.result)
        return secret_rules.redact(self.result, self.secrets)

    def finish(self):
        return self.finish_result()


def _signalled_line(items):
    parts = []
    for item in items or []:
        signals = item.get("signals") or []
        if signals:
            gone = item.get("seconds_to_exit")
            parts.append("PID %s %s: %s%s" % (item.get("pid"), item.get("name") or "?", " then ".join(signals),
                                              (", gone after %s s" % gone) if gone is not None else ""))
        else:
            parts.append("PID %s %s: exited with its server" % (item.get("pid"), item.get("name") or "?"))
    return "; ".join(parts) or "nothing held the target GPUs"


def _gpus_line(gpus):
    return ", ".join("%s=%s MiB" % (g.get("index"), g.get("used_mib")) for g in gpus or [])


def _launch_line(launch, label):
    if not launch or not launch.get("pid"):
        return None
    eff = launch.get("effective") or {}
    spec = "speculative %s steps %s topk %s draft tokens %s" % (
        eff.get("speculative_algorithm") or "off", eff.get("speculative_num_steps", "-"), eff.get("speculative_eagle_topk", "-"),
        eff.get("speculative_num_draft_tokens", "-"))
    overrides = launch.get("overrides") or []
    check = ("effective config matches the prediction (%d override(s)): %s" % (len(overrides), spec)) if eff else \
        "healthy (no effective-config check on this rank)"
    # An in-place weight update (phase weights) restarts nothing: no URL or start-up time to show, not "None".
    where = (" at %s" % launch["url"] if launch.get("url") else "") + \
        (" after %s s" % launch["startup_s"] if launch.get("startup_s") is not None else "")
    box = launch.get("container") or {}
    if box.get("name"):
        where += " in container %s (id %s, image %s)" % (box["name"], str(box.get("id") or "?")[:12], launch.get("image_words") or box.get("image"))
    return "%s PID %s healthy%s; %s" % (label, launch.get("pid"), where, check)


def result_lines(result):
    """What the run did, in readable lines (the play's output)."""
    lines = []
    for box in result.get("containers_stopped") or []:
        lines.append("stopped through its runtime: %s" % containers.stopped_line(box))
    old = result.get("container_stopped")
    if old:
        lines.append("stopped the server's container %s (id %s, image %s) through its runtime" % (
            old.get("name"), str(old.get("id") or "?")[:12], old.get("image")))
    if result.get("torn_down"):
        lines.append("signalled: %s" % _signalled_line(result.get("signalled")))
    if "gpus_free" in result:
        how = ("on the teardown's last nvidia-smi reading, after its processes exited"
               if result["timings"].get("verify_free_reused") else "after %s s" % result["timings"].get("verify_free_s"))
        lines.append("%d GPU(s) free %s: %s" % (len(result["gpus_free"]), how, _gpus_line(result["gpus_free"])))
    line = _launch_line(result.get("launch"), "candidate" if result.get("target") == "candidate" else "known-good")
    if line:
        lines.append(line)
    if "gpus_allocated" in result:
        lines.append("%d GPU(s) allocated: %s" % (len(result["gpus_allocated"]), _gpus_line(result["gpus_allocated"])))
    rollback = result.get("rollback")
    if rollback:
        lines.append("rollback %s: %s" % (rollback.get("status"), rollback.get("detail")))
    lines.append("node: %s (%.1f s in this module run)" % (result.get("node_state"), result.get("elapsed") or 0))
    return lines
