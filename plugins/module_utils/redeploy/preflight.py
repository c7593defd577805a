# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The ``sglang_preflight`` module's work: inspect, resolve, decide, lease (docs/design.md, "The plan")."""

from __future__ import annotations

import grp
import os
import pwd
import stat
import time


from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import backends as gpu_backends
from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import query as gpu_query
from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import target as gpu_target
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import http
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import metrics as metrics_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import diff as diff_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import journal as journal_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.server import caches as caches_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.server import launcher as launch_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.server import container_control
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import lease as lease_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import survey as pf
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import identity
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import image_plan
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import overlap
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import secrets as secret_rules
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import systemd
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import settings
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy.target_inspection import TargetInspection
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import weights as weights_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import node_or_mirror
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import serving
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import checkpoint as ckpt_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import names as names_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.common.names import PLAIN


WEIGHTS = "weights"
# Load formats whose weights the checkpoint check reads (headers only); the others are named in a note.
CHECKED_LOAD_FORMATS = ("auto", "safetensors", "fastsafetensors")
# A checkpoint of very many shards on a slow file system: past this many seconds the rest is left unchecked (a note).
CHECKPOINT_SECONDS = 120.0


def replace_fields():
    """Args an in-place weight update changes (the rest must be equal): the model path and what follows it."""
    return ("model_path", "tokenizer_path", "served_model_name", "speculative_draft_model_path", "weight_version")


def _name(lookup, ident):
    try:
        return lookup(ident)[0]
    except KeyError:
        return str(ident)


def _matches(wanted, ident, name):
    return not wanted or wanted == name or wanted == str(ident)


def inspect_directory(path, mode, owner, group):
    entry = {"path": path, "exists": False, "mode": None, "owner": None, "group": None, "ok": False}
    try:
        st = os.stat(path)
    except OSError:
        return entry
    entry.update(exists=True, mode="%04o" % stat.S_IMODE(st.st_mode),
                 owner=_name(pwd.getpwuid, st.st_uid), group=_name(grp.getgrgid, st.st_gid))
    entry["ok"] = (stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == mode
                   and _matches(owner, st.st_uid, entry["owner"]) and _matches(group, st.st_gid, entry["group"]))
    return entry


class Preflight(TargetInspection):
    def __init__(self, module):
        self.module = module
        self.p = module.params
        self.names = names_mod.Names.of_module(module)
        self.check_mode = module.check_mode
        self.problems = []
        self.notes = []
        self.secrets = []
        lease = dict(self.p["lease"] or {})
        self.lease_path = lease.get("path") or ""
        self.run_id = str(lease.get("run_id") or "")
        self.lease_opts = lease
        self.node = {}
        self.short_of_gpus = None
        self.manager = None
        self.image = None
        self.began = time.monotonic()
        # The compile caches (cache_dir): filled in by check_caches() before any launch spec is built.
        self.cache_info = {"dir": "", "env": {}, "kept": [], "dirs": []}

    def problem(self, text):
        if text and text not in self.problems:
            self.problems.append(text)

    # ------------------------------------------------------------------
    def runner(self):
        return gpu_query.module_runner(self.module, timeout=60)

    def snapshot(self):
        p = self.p
        try:
            backend, _note = gpu_backends.open_backend(p["backend"], self.runner(), p["nvidia_smi"])
        except gpu_query.BackendUnavailable as exc:
            self.problem("backend=%s cannot be used: %s" % (p["backend"], exc))
            return None, []
        try:
            snap = backend.snapshot()
        finally:
            backend.close()
        driver = snap.get("driver") or {}
        if not driver.get("ok", False):
            self.problem(gpu_target.driver_failure_text(driver, "nvidia-smi (%s)" % self.names.of("nvidia_smi"))[:600])
            return snap, []
        selected, errors = gpu_query.select_gpus(snap, p["gpus"])
        answering = [g for g in snap.get("gpus", []) if not g.get("lost")]
        if errors and not p["explicit_gpus"] and len(p["gpus"]) > len(snap.get("gpus", [])):
            # GPUs worked out from the layout that the node does not have: serving.check_layout says so with the layout.
            self.short_of_gpus = len(snap.get("gpus", []))
        elif errors:
            self.problem("%s / tp_size: %s; the node has %d GPU(s)" % (self.names.of("gpus"), "; ".join(errors), len(answering)))
        for gpu in selected:
            if gpu.get("lost"):
                self.problem("%s is lost (%s); the server cannot use it" % (gpu_query.gpu_label(gpu), gpu.get("lost_reason")))
        return snap, selected

    def launch_params(self, args, manager):
        p = self.p
        env = dict((str(k), "" if v is None else str(v)) for k, v in (p["env"] or {}).items())
        for key, value in self.cache_info["env"].items():
            env.setdefault(key, value)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in p["gpus"])
        return {
            "name": p["name"], "version": p["version"], "manager": manager, "unit": p["unit"],
            "unit_dir": p["unit_dir"] if manager == "systemd" else None, "python": p["python"], "args": args,
            "api_key": p["api_key"], "env": env, "chdir": p["chdir"], "user": p["user"], "group": p["group"],
            "environment_file": p["environment_file"], "config_dir": p["config_dir"], "state_dir": p["state_dir"],
            "log_file": p["log_file"], "container": p.get("container"),
            **image_plan.launch_fields(self.image),
        }

    def spec(self, args, manager):
        """The launch spec the deploy hands to sglang_replace: :meth:`launch_params` without the API key (a
        secret, passed as its own no_log option; the fingerprint covers it as a salted digest)."""
        return dict((k, v) for k, v in self.launch_params(args, manager).items() if k != "api_key")

    def check_caches(self):
        """The compile caches: where they go (added to the launch env), their size, the room left (a problem if short)."""
        p = self.p
        cache_dir = p["cache_dir"] or ""
        if cache_dir and not os.path.isabs(cache_dir):
            self.problem("%s must be an absolute path, got %r; set a path such as %s/cache, or '' to "
                         "leave SGLang's cache defaults" % (self.names.of("cache_dir"), cache_dir, p["state_dir"]))
            cache_dir = ""
        min_free = p["cache_min_free_gb"]
        if min_free is None or min_free < 0:
            self.problem("%s must be a number of GiB >= 0, got %r; set e.g. 20, or 0 to turn the "
                         "free-space check off" % (self.names.of("cache_min_free_gb"), min_free))
            min_free = 0
        operator_env = dict((str(k), v) for k, v in (p["env"] or {}).items())
        info, problem = caches_mod.describe(cache_dir, min_free, operator_env, self.names)
        if problem:
            self.problem(problem + " (nothing was touched)")
        self.cache_info = info

    # ------------------------------------------------------------------
    def resolve(self, gpu):
        p = self.p
        args = dict(p["args"] or {})
        model_path = args.get("model_path")
        arch = draft_arch = None
        if not model_path:
            self.problem("%s: not set; give the model directory on the node" % self.names.of("args", "model_path"))
        else:
            arch, err = pf.read_arch(str(model_path))
            if err:
                self.problem("%s: %s %s on this node; copy the model there or fix the path" % (
                    self.names.of("args", "model_path"), model_path, err))
            else:
                self.check_checkpoint("model_path", str(model_path), args)
        draft = args.get("speculative_draft_model_path")
        if draft:
            draft_arch, err = pf.read_arch(str(draft))
            if err:
                self.problem("%s: %s %s on this node; copy the draft model there "
                             "or fix the path" % (self.names.of("args", "speculative_draft_model_path"), draft, err))
            elif str(draft) != str(model_path):
                self.check_checkpoint("speculative_draft_model_path", str(draft), args, draft=True)
        self.node.update(arch=arch, draft_arch=draft_arch)
        env = dict((str(k), str(v)) for k, v in (p["env"] or {}).items())
        resolved = node_or_mirror.resolve_for_node(
            args, version=p["version"], arch=p["arch"] or arch, policy=p["spec_policy"], draft_arch=draft_arch, env=env,
            gpu=gpu, source=p["resolution"], python=p["python"], timeout=p["resolution_timeout"], names=self.names,
            image=self.image if self.image and self.image.get("id") else None, mounts=image_plan.model_mounts(args))
        for error in resolved.get("errors") or []:
            self.problem(error)
        return resolved

    def service_ids(self):
        """``(uid, gids)`` the server will run as: O(user)/O(group) under systemd (User=, Group=, the user's groups),
        else this module's user (a process-managed server runs as it); None when unknown."""
        user, group = (self.p["user"], self.p["group"]) if self.manager == "systemd" else ("", "")
        try:
            if user:
                pw = pwd.getpwuid(int(user)) if str(user).isdigit() else pwd.getpwnam(str(user))
                uid, gid = pw.pw_uid, pw.pw_gid
                gids = set(os.getgrouplist(pw.pw_name, gid))
            else:
                uid, gid = os.geteuid(), os.getegid()
                gids = set(os.getgroups()) | {gid}
            if group:
                # The unit's Group= (or the launch's setgid) replaces the primary group; the supplementary ones stay.
                gids.discard(gid)
                gids.add(int(group) if str(group).isdigit() else grp.getgrnam(str(group)).gr_gid)
        except (KeyError, OSError, ValueError):
            return None      # an unknown user or group: the launch plan names it
        return uid, gids

    def check_checkpoint(self, field, path, args, draft=False):
        """The checkpoint at ``path`` as the server will load it (sglang/checkpoint.py): the first broken file is a
        problem naming the variable, the file, what is wrong and the fix; nothing is read beyond the headers."""
        load_format = str(args.get("load_format") or "auto")
        checks = self.node.setdefault("checkpoints", {})
        if load_format not in CHECKED_LOAD_FORMATS:
            self.notes.append("%s: load_format %s, the checkpoint's weight files were not checked (only "
                              "the safetensors formats %s are)" % (self.names.of("args", field), load_format, ", ".join(CHECKED_LOAD_FORMATS)))
            checks[field] = {"path": path, "checked": False}
            return
        ids = self.service_ids()
        tokenizer = args.get("tokenizer_path")
        # The draft worker takes the target's tokenizer; a tokenizer_path elsewhere is checked as a tokenizer only.
        skip = bool(draft or args.get("skip_tokenizer_init") or (tokenizer and str(tokenizer) != path))
        try:
            info = ckpt_mod.verify(path, what=field, uid=ids[0] if ids else None, gids=ids[1] if ids else (),
                                   skip_tokenizer_init=skip, deadline=time.monotonic() + CHECKPOINT_SECONDS)
        except ckpt_mod.CheckpointError as exc:
            checks[field] = {"path": path, "checked": True, "ok": False, "file": exc.path}
            self.problem("%s: the checkpoint %s cannot be served: %s (SGLang would fail on it only while "
                         "loading, after the running server is gone; nothing was touched)" % (self.names.of("args", field), path, exc))
            return
        checks[field] = dict(info, path=path, checked=True, ok=True)
        if not draft and tokenizer and str(tokenizer) != path and os.path.isdir(str(tokenizer)):
            problem = ckpt_mod.tokenizer_problem(str(tokenizer), bool(args.get("skip_tokenizer_init")))
            if problem:
                self.problem("%s: %s; copy the tokenizer files there or fix the path (SGLang "
                             "would fail on it only while loading; nothing was touched)" % (self.names.of("args", "tokenizer_path"), problem))
        if not info["complete"]:
            self.notes.append("%s: the checkpoint %s has more shards than %d s allow to check; the rest "
                              "was not checked" % (self.names.of("args", field), path, CHECKPOINT_SECONDS))
        if ids is None:
            self.notes.append("%s: the server's user or group is unknown on this node, so read access "
                              "to %s was not checked" % (self.names.of("args", field), path))

    def check_arg_secrets(self, args):
        """Every secret in ``sglang_server_args`` (a secret-named field, a password or token inside a URL) is registered
        as a no_log value at once, so no output shows it, also one refused here. Refused, naming the field and the fix:
        the API key (sglang_server_api_key), the admin key, hf_token (not an SGLang flag: the environment's HF_TOKEN)
        and credentials in a URL (they would be on the command line and in records). Returns the names of the secret
        fields that are passed on (for example ssl_keyfile_password): sglang_replace gets their values apart, as a
        no_log option, and puts them into the 0600 --config file."""
        passed = []
        for key in sorted(args, key=str):
            value = args[key]
            name = launch_mod.norm_key(key)
            strings = [str(v) for v in (value if isinstance(value, (list, tuple)) else [value]) if v not in (None, "")]
            named = secret_rules.is_secret_name(name)
            carrying = [text for text in strings if named or secret_rules.mask_text(text) != text]
            for text in carrying:
                self.secrets.append(text)
                self.module.no_log_values.add(text)
            if not carrying:
                continue
            if name == "api_key":
                self.problem("%s: put the key in %s instead (a no_log variable "
                             "that goes into the 0600 --config file); args are shown in plans and reports"
                             % (self.names.of("args", "api_key"), self.names.of("api_key")))
            elif name == "admin_api_key":
                self.problem("%s: this collection runs the server with %s "
                             "only (args are shown in plans and reports, and its own calls carry that key); remove "
                             "admin_api_key" % (self.names.of("args", "admin_api_key"), self.names.of("api_key")))
            elif name == "hf_token":
                self.problem("%s: SGLang takes no such flag; it reads the Hugging Face token from "
                             "the environment: set HF_TOKEN in %s (a secret-named variable goes to a 0600 file, "
                             "never into records) and remove hf_token from the args"
                             % (self.names.of("args", "hf_token"), self.names.of("env")))
            elif not named:
                self.problem("%s: holds a URL with credentials (user:password@ or a token parameter), "
                             "which would be on the server's command line (ps) and in its records; use a URL without them "
                             "and give the credentials through the environment (%s) or a file"
                             % (self.names.of("args", key), self.names.of("env")))
            else:
                passed.append(str(key))
        return passed

    def running_record(self, fingerprint):
        """The launch record (candidate or known-good) of the config with ``fingerprint``, or None."""
        for directory in (launch_mod.candidate_dir(self.p["config_dir"]), launch_mod.known_good_dir(self.p["config_dir"])):
            try:
                record = launch_mod.read_json(os.path.join(directory, "server.json"))
            except launch_mod.LaunchError:
                record = None
            if record and record.get("fingerprint") == fingerprint:
                return record
        return None

    def choose_mode(self, decision, found, launcher):
        """Restart, or swap only the weights in place (sglang_redeploy_mode auto|restart|weights)."""
        mode = self.p["redeploy_mode"]
        running = found.get("running") or {}
        if decision["action"] != identity.RESTART or mode == "restart":
            if mode == "weights" and decision["action"] != identity.NONE:
                self.problem("%s: weights was asked for, but the plan is %s (%s); an in-place weight "
                             "update needs a healthy managed server that runs another checkpoint of the same config"
                             % (self.names.of("redeploy_mode"), decision["action"], decision["why"]))
            return decision, None
        record = self.running_record(running.get("fingerprint")) if running.get("fingerprint") else None
        if record is None:
            wplan = {"mode": "restart", "why": "the running server's launch record is not known (it was not started by "
                                               "this collection), so only a restart is safe", "reasons": [], "differences": []}
        elif running.get("healthy") is not True:
            wplan = {"mode": "restart", "why": "the running server does not answer its health check", "reasons": [],
                     "differences": []}
        else:
            wplan = weights_mod.weights_plan(record.get("args") or {}, launcher.args, version=self.p["version"])
            wplan["previous_model_path"] = (record.get("args") or {}).get("model_path")
            # Anything but the checkpoint (the environment, the interpreter, the version, a secret) needs a restart.
            state = (found.get("current") or {}).get("record") or {}
            others = [d["field"] for d in identity.differences(state.get("identity"), launcher.identity)
                      if d["field"] not in ("args.%s" % f for f in replace_fields())] if state.get("identity") else ["unknown"]
            if wplan["mode"] == "weights" and others:
                wplan = dict(wplan, mode="restart", why="more than the checkpoint changes (%s)" % ", ".join(others),
                             reasons=list(wplan.get("reasons") or []) + ["changes beyond the checkpoint: %s" % ", ".join(others)])
            wplan = self.container_sees_checkpoint(wplan, found, launcher)
        if mode == "weights" and wplan["mode"] != "weights":
            self.problem("%s: weights was asked for, but an in-place update cannot reach the intended "
                         "config: %s" % (self.names.of("redeploy_mode"), "; ".join(wplan.get("reasons") or []) or wplan["why"]))
        if wplan["mode"] == "weights":
            decision = dict(decision, action=WEIGHTS, why="only the weights change: %s" % wplan["why"])
        return decision, wplan

    def container_sees_checkpoint(self, wplan, found, launcher):
        """In a container, an in-place update loads the new path inside it: the running container must see that path
        (a volume over its parent, at the same path); else only a restart, which mounts the new model, applies it."""
        cur = found.get("current") or {}
        path = launcher.args.get("model_path")
        if wplan["mode"] != "weights" or launcher.box is None or not cur.get("container") or not path:
            return wplan
        if container_control.sees(cur.get("mounts"), path):
            return wplan
        reason = ("the running container %s does not see %s (its mounts: %s); mount the models' parent directory with "
                  "%s volumes to update weights in place" % (cur["container"].get("name"), path, ", ".join(
                      "%s:%s" % m for m in cur.get("mounts") or []) or "none", self.names.of("container")))
        return dict(wplan, mode="restart", why=reason, reasons=list(wplan.get("reasons") or []) + [reason])

    def runtime_adapters(self, launcher):
        """LoRA adapters the running server loaded at runtime (``/load_lora_adapter``): they vanish on a restart, so the
        launch loads them again before the smoke gate. Adapters of ``lora_paths`` come back with the args."""
        try:
            status, _h, body = http.request("GET", launcher.url + "/v1/models", api_key=launcher.api_key, timeout=5)
        except http.HTTPConnectionError:
            return []
        if status != 200 or not isinstance(body, dict):
            return []
        configured = set()
        for item in launcher.args.get("lora_paths") or []:
            configured.add(str(item).split("=", 1)[0])
        out = []
        for card in body.get("data") or []:
            if isinstance(card, dict) and card.get("parent") and card.get("id") not in configured:
                out.append({"name": card.get("id"), "path": card.get("root")})
        return out

    def startup_budget(self):
        """The health-gate budget of this launch: the previous successful launch's startup phases times a margin,
        within [60 s, the configured sglang_server_health_timeout]; the configured value on a first launch."""
        configured = (self.p["settings"] or {}).get("sglang_server_health_timeout") or 1800
        try:
            configured = float(configured)
        except (TypeError, ValueError):
            configured = 1800.0
        previous = launch_mod.read_json(os.path.join(self.p["state_dir"], "startup.json")) if os.path.isdir(
            self.p["state_dir"]) else None
        phases = (previous or {}).get("phases") or {}
        try:
            seconds, source = metrics_mod.startup_budget(phases, configured, margin=3.0, floor=min(60.0, configured),
                                                         cap=configured)
        except (ValueError, TypeError):
            seconds, source = configured, "default"
        return {"seconds": round(seconds, 1), "source": source, "phases": phases, "configured": configured}

    def known_good(self, manager):
        p = self.p
        kg_dir = launch_mod.known_good_dir(p["config_dir"])
        try:
            record, stored = launch_mod.load_record(kg_dir)
        except launch_mod.LaunchError as exc:
            return {"ready": False, "why": exc.msg, "fingerprint": None}
        if record is None:
            return {"ready": False, "why": "no known-good config under %s (never deployed by this collection)" % kg_dir,
                    "fingerprint": None}
        model = (record.get("args") or {}).get("model_path")
        if model and not os.path.isdir(str(model)):
            return {"ready": False, "why": "the known-good config's model %s is gone from this node (deleted after "
                                           "loading?)" % model, "fingerprint": record.get("fingerprint")}
        params = launch_mod.launch_params_from_record(record, stored, self.launch_params({}, manager))
        probe = launch_mod.Launcher(self.module, params, check_mode=True)
        blockers = probe.plan()
        if blockers:
            return {"ready": False, "why": "the known-good config cannot be launched again: %s" % "; ".join(blockers),
                    "fingerprint": record.get("fingerprint"), "version": record.get("version")}
        return {"ready": True, "why": "known-good config of %s" % time.strftime(
            "%Y-%m-%dT%H:%M:%SZ", time.gmtime(os.path.getmtime(os.path.join(kg_dir, "server.json")))),
            "fingerprint": record.get("fingerprint") or probe.fp, "version": record.get("version"),
            "manager": record.get("manager")}

    # ------------------------------------------------------------------
    def run(self):
        p = self.p
        mode, value_problems = self._check_inputs()
        manager, is_systemd = self._pick_manager()
        self.image = image_plan.check_image(self, manager)
        selected, resolved, args = self._resolve_on_node(is_systemd, value_problems)
        self.secret_arg_names = self.check_arg_secrets(p["args"] or {})
        self.check_caches()
        launcher = launch_mod.Launcher(self.module, self.launch_params(args, manager), check_mode=True)
        for blocker in launcher.plan():
            self.problem(blocker)
        self.secrets.extend(launcher.secrets)
        if self.image and self.image.get("id") and not self.problems:
            # The launch's container, created once before anything is touched (issue 24): what the runtime refuses
            # (GPUs, ulimits, volumes, the interpreter) is found here, not in the outage.
            error = launcher.probe()
            if error:
                self.problem("the %s container of this launch cannot be created: %s; fix %s, %s or %s (nothing was "
                             "touched)" % (manager, error, self.names.of("container"), self.names.of("image"),
                                           self.names.of("python")))
        self._probe_places(manager, mode)
        found = self.inspect_server(launcher, selected)
        for text in overlap.leftover(p["state_dir"], found["current"].get("pid")):
            self.problem(text)
        found, entry, kg, decision, lease_info = self._decide(launcher, manager, found)
        plan = self._plan(launcher, manager, args, found, entry, kg, decision)
        return self._result(launcher, manager, found, plan, resolved, decision, lease_info)

    def _check_inputs(self):
        """The settings, the secrets given, the directory mode and the args' values checked; the default GPUs picked.
        Returns ``(directory mode, value problems)``."""
        p = self.p
        for text in settings.check_settings(p["settings"]):
            self.problem(text)
        problem = settings.check_text_secret(self.names.of("api_key"), p["api_key"])
        if problem:
            self.problem(problem)
        if p["api_key"]:
            self.secrets.append(str(p["api_key"]))
        for key, value in (p["env"] or {}).items():
            if secret_rules.is_secret_name(str(key)) and value:
                self.secrets.append(str(value))
                self.module.no_log_values.add(str(value))
        try:
            mode = int(p["directory_mode"], 8)
        except ValueError:
            mode = -1
        if not 0 <= mode <= 0o7777:
            self.problem("directory_mode must be an octal string such as '0750', got %r" % p["directory_mode"])
        # The args as given: types and ranges SGLang's own resolution lets through (tp_size -1, mem_fraction_static 1.5).
        value_problems = serving.check_values(p["args"], self.names)
        for text in value_problems:
            self.problem(text)
        if not p["gpus"]:
            # No sglang_server_cuda_visible_devices: the first GPUs of the node, as many as one node of the layout uses.
            per_node = serving.gpus_per_node(p["args"], p["nnodes"] if (p["nnodes"] or 0) >= 1 else None)[1]
            p["gpus"] = [str(i) for i in range(max(1, per_node) if not value_problems else 1)]
        return mode, value_problems

    def _pick_manager(self):
        """``(manager, is_systemd)``: ``auto`` made explicit; systemd asked for where it does not run is a problem."""
        p = self.p
        manager = p["manager"]
        is_systemd = systemd.running()
        if manager == "auto":
            manager = "systemd" if is_systemd else "process"
        elif manager in launch_mod.CONTAINER_MANAGERS:
            pass                                   # the runtime's CLI and the image: image_plan.check_image
        elif manager == "systemd" and not is_systemd:
            self.problem("%s: systemd is not running on this node (PID 1 is not systemd); set "
                         "%s: process or auto" % (self.names.of("manager"), self.names.of("manager")))
        self.manager = manager
        return manager, is_systemd

    def _resolve_on_node(self, is_systemd, value_problems):
        """The node's GPUs read and the args resolved on them, and checked: ``(selected GPUs, resolved, args)``."""
        p = self.p
        snap, selected = self.snapshot()
        gpus = [gpu_query.summarize(g) for g in selected]
        gpu = pf.gpu_facts(selected)
        self.node.update(systemd=is_systemd, gpus=gpus, gpu=gpu, backend=(snap or {}).get("backend"),
                         gpu_count=len([g for g in (snap or {}).get("gpus", []) if not g.get("lost")]),
                         all_gpus=[gpu_query.summarize(g) for g in (snap or {}).get("gpus", [])])
        resolved = self.resolve(gpu)
        args = resolved.get("args") or dict(p["args"] or {})
        layout = settings.check_gpu_layout(args, p["gpus"], p["nnodes"], p["explicit_gpus"], self.names)
        if layout:
            self.problem(layout)
        if not value_problems and not resolved.get("errors"):
            # The resolved layout against this node: the GPUs it has, divisibility, the draft model.
            # A list that does not fit the layout is said above; the node's GPU count only when it is the reason.
            for text in serving.check_layout(args, [] if layout else p["gpus"], node_gpu_count=self.short_of_gpus,
                                             nnodes=p["nnodes"], gpu_memory_mib=(gpu or {}).get("memory_mib"),
                                             arch_known=bool(p["arch"] or self.node.get("arch")), names=self.names):
                self.problem(text)
        if args.get("delete_ckpt_after_loading") and p["rollback"]:
            self.problem("%s: SGLang deletes the checkpoint under %s after warmup, so "
                         "a later rollback could not load the known-good config from it; drop delete_ckpt_after_loading, or set "
                         "%s: false to accept redeploys without rollback"
                         % (self.names.of("args", "delete_ckpt_after_loading"), args.get("model_path"), self.names.of("rollback")))
        return selected, resolved, args

    def _probe_places(self, manager, mode):
        """Every place the run writes probed, and the directories it makes inspected (the node's facts)."""
        p = self.p
        places = [("config", p["config_dir"]), ("state", p["state_dir"]), ("log", os.path.dirname(p["log_file"]))]
        if manager == "systemd":
            places.append(("unit", p["unit_dir"]))
        probes = []
        for what, path in places:
            why = pf.probe_writable(path)
            probes.append({"what": what, "path": path, "ok": why is None, "why": why})
            if why:
                var = self.names.of({"config": "config_dir", "state": "state_dir", "log": "log_file", "unit": "unit_dir"}[what])
                self.problem("%s: the %s directory %s is not usable: %s; fix it before the redeploy (nothing was touched)"
                             % (var, what, path, why))
        wanted = list(p["directories"]) + [d for d in self.cache_info["dirs"] if d not in p["directories"]]
        directories = [inspect_directory(d, mode, p["directory_owner"], p["directory_group"]) for d in wanted]
        self.node.update(probes=probes, directories=directories)

    def _decide(self, launcher, manager, found):
        """The action (journal, known-good, what runs), under the lease when one is taken:
        ``(found, entry, kg, decision, lease_info)``."""
        p = self.p
        entry = journal_mod.read(journal_mod.path_for(p["state_dir"]))
        kg = self.known_good(manager)
        decision = identity.decide(launcher.fp, found["running"], kg.get("fingerprint"), entry, p["force"], self.names)
        decision, weights_plan = self.choose_mode(decision, found, launcher)
        lease_info = self.lease_state()
        self.weights_plan = weights_plan
        if not self.problems and not self.check_mode and self.wants_lease(decision["action"]):
            lease_info = self.take_lease(lease_info)
            try:
                found, entry, kg, decision = self.under_lease(lease_info, launcher, manager, found, entry, kg, decision)
            except Exception:
                # Whatever went wrong after the lease was taken, the lease must not outlive this run's failure.
                if lease_info.get("acquired"):
                    lease_mod.release(self.lease_path, self.run_id)
                raise
        return found, entry, kg, decision, lease_info

    def _plan(self, launcher, manager, args, found, entry, kg, decision):
        """The plan: the one launch spec, the action and why, what runs and what the drain stops."""
        p = self.p
        running_identity = None
        record = (found["current"].get("record") or {})
        if found["running"] and record.get("fingerprint") == found["running"].get("fingerprint"):
            running_identity = record.get("identity")
        budget = self.startup_budget()
        weights_plan = self.weights_plan
        running_fp = (found["running"] or {}).get("fingerprint")
        running_record = self.running_record(running_fp) if running_fp else None
        plan = {
            "mode": "weights" if decision["action"] == WEIGHTS else ("restart" if decision["action"] in ("start", "restart") else None),
            "weights": weights_plan,
            # The args the running server was launched with (its record; secrets are never in records).
            "running_args": (running_record or {}).get("args"),
            # The image the running server was started from (managers docker, podman): the report's "before".
            "running_image": (running_record or {}).get("image"),
            "health_timeout": budget["seconds"], "startup": budget,
            "lora_adapters": found.get("lora_adapters") or [],
            "action": decision["action"], "why": decision["why"], "recovering": decision["recovering"],
            "interrupted": decision["interrupted"], "target_gpus": list(p["gpus"]), "manager": manager,
            "image": dict((k, v) for k, v in (self.image or {}).items() if k != "cli") or None,
            "url": launcher.url, "argv": launcher.masked(launcher.argv), "fingerprint": launcher.fp,
            # The one launch spec (args after resolution, env, manager, unit, files), built here once: the deploy hands
            # it to sglang_replace with the fingerprint, and sglang_replace refuses, before the teardown, a spec that
            # is not the one planned (a variable changed between the two, an edited plan).
            "spec": self.spec(args, manager),
            "spec_fingerprint": launcher.fp,
            # What the fingerprint is made of (secrets as salted digests), so that a refused spec names the fields.
            "spec_identity": launcher.identity,
            "differences": identity.differences(running_identity, launcher.identity) if running_identity else [],
            "running": found["running"], "port_owner": found["port_owner"], "holders": found["holders"],
            "teardown_pids": found["teardown_pids"], "expected_pids": found["expected_pids"],
            "containers": found.get("containers") or [],     # adopted: stopped through their runtime (issue 24)
            "ports": [i["port"] for i in found["ports"]], "port_checks": found["ports"],
            "rollback_ready": kg.get("ready", False), "known_good": kg,
            "journal": {"entry": dict((k, v) for k, v in entry.items() if k != "history"), "summary": journal_mod.describe(entry)},
            "unit": launcher.unit,
            # Secret fields of the args that are passed on (their values never leave the node's inventory: the
            # deploy hands them to sglang_replace as a no_log option).
            "private_args": list(getattr(self, "secret_arg_names", []) or []),
            # Secret-named variables of the env (HF_TOKEN, ...): the spec shows them masked; the deploy hands their
            # values to sglang_replace as the no_log option secret_env.
            "private_env": sorted(str(k) for k in (p["env"] or {}) if secret_rules.is_secret_name(str(k))),
            # The compile caches: the variables added to the env, the directories to create, size and free space.
            "cache": self.cache_info,
            # Room for the new server beside the old one (redeploy/overlap.py; the controller picks the path).
            "overlap": overlap.node_facts(found["current"], found["running"], running_record, found["port_owner"],
                                          self.node.get("all_gpus"), p["gpus"], launcher.port,
                                          (p["settings"] or {}).get("gpu_verify_max_used_mib") or 16,
                                          probe=overlap.health_probe(launcher.api_key)),
        }
        return plan

    def _result(self, launcher, manager, found, plan, resolved, decision, lease_info):
        """The module's result (secrets redacted), with ``msg`` when the preflight failed."""
        p = self.p
        # A real run changes the node when it takes the lease for an action; check mode says whether one would.
        changes = decision["action"] != identity.NONE and not self.problems
        result = {
            "changed": changes and (self.check_mode or bool(lease_info.get("acquired"))),
            "plan": plan, "resolved": resolved, "node": self.node, "lease": lease_info, "problems": self.problems,
            "notes": self.notes, "elapsed": round(time.monotonic() - self.began, 3),
        }
        result["lines"] = plan_lines(p["label"] or p["name"], plan, resolved, lease_info, self.names)
        if self.check_mode and getattr(self.module, "_diff", False):
            # --check --diff: what a real run would change. A real run shows it once, on sglang_replace (the task
            # that changes the node), so the preflight returns it in check mode only.
            result["diff"] = self.launch_diff(launcher, found, manager) if changes else []
        result = secret_rules.redact(result, self.secrets)
        if self.problems:
            result["msg"] = "Preflight failed on %s; the running server was not touched. %s" % (
                p["label"] or p["name"], " | ".join(self.problems))
        return result

    def launch_diff(self, launcher, found, manager):
        """Ansible's diff of the running server's recorded launch against the planned one (redeploy/diff.py)."""
        running = found.get("running") or {}
        try:
            before = launch_mod.running_diff_source(self.module, found.get("current"), self.launch_params({}, manager),
                                                    port_owner=running.get("pid"))
        except launch_mod.LaunchError as exc:
            self.notes.append("the running server's launch could not be shown in the diff: %s" % exc.msg)
            before = {"label": "running PID %s, its launch unknown" % running.get("pid")}
        return diff_mod.launch_diff(before, launcher.diff_source("planned"))

    def under_lease(self, lease_info, launcher, manager, found, entry, kg, decision):
        p = self.p
        if lease_info.get("acquired") and (lease_info.get("waited", 0) > 0.5 or lease_info.get("took_over")):
            # Another run may have changed the node while this one waited: look again, under the lease.
            found = self.inspect_server(launcher, self.snapshot()[1])
            entry = journal_mod.read(journal_mod.path_for(p["state_dir"]))
            kg = self.known_good(manager)
            decision = identity.decide(launcher.fp, found["running"], kg.get("fingerprint"), entry, p["force"], self.names)
            decision, self.weights_plan = self.choose_mode(decision, found, launcher)
        if lease_info.get("acquired") and decision["action"] != identity.NONE:
            running = found["running"] or {}
            journal_mod.record(journal_mod.path_for(p["state_dir"]), self.run_id, journal_mod.PLANNED,
                               detail="%s: %s" % (decision["action"], decision["why"]),
                               plan={"action": decision["action"], "why": decision["why"]},
                               old={"pid": running.get("pid"), "fingerprint": running.get("fingerprint")},
                               known_good={"fingerprint": kg.get("fingerprint")},
                               intended={"fingerprint": launcher.fp},
                               controller=self.lease_opts.get("controller") or None)
        elif lease_info.get("acquired") and self.lease_opts.get("acquire") != "always":
            lease_mod.release(self.lease_path, self.run_id)
            lease_info["released"] = True
            lease_info["acquired"] = False
        return found, entry, kg, decision

    # ------------------------------------------------------------------
    def lease_state(self):
        if not self.lease_path:
            return {"acquired": False, "state": "none", "path": None}
        info = lease_mod.inspect(self.lease_path, self.run_id)
        holder = info.get("holder") or {}
        return {"acquired": info["state"] == lease_mod.MINE, "state": info["state"], "reason": info["reason"],
                "path": self.lease_path, "holder": holder, "generation": info["generation"], "waited": 0.0}

    def wants_lease(self, action):
        if not self.lease_path:
            return False
        mode = self.lease_opts.get("acquire") or "if_needed"
        if mode == "never":
            return False
        return mode == "always" or action != identity.NONE

    def take_lease(self, before):
        opts = self.lease_opts
        try:
            got = lease_mod.acquire(self.lease_path, self.run_id, controller=opts.get("controller"),
                                    ttl=float(opts.get("ttl") or lease_mod.DEFAULT_TTL), timeout=float(opts.get("timeout") or 0),
                                    break_lease=opts.get("break") or None)
        except lease_mod.LeaseBusy as exc:
            self.problem(exc.msg)
            out = dict(before)
            out.update(acquired=False, waited=exc.waited, holder=exc.holder)
            return out
        except OSError as exc:
            self.problem("%s: cannot take the node lease %s: %s" % (self.names.of("lease", "path"), self.lease_path, exc))
            return dict(before, acquired=False)
        out = {"acquired": True, "state": lease_mod.MINE, "path": self.lease_path, "waited": got["waited"],
               "generation": got["generation"], "holder": got["holder"], "took_over": got["took_over"],
               "took_over_reason": got["took_over_reason"], "already_held": got["already_held"],
               "waited_for": (before.get("holder") or {}).get("owner") if got["waited"] > 0.5 else None}
        if got["took_over"]:
            self.module.warn("took over the node lease %s from %s: %s; continuing from the node journal"
                             % (self.lease_path, lease_mod.describe(got["took_over"]), got["took_over_reason"]))
        return out


def _fmt(value):
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def plan_lines(host, plan, resolved, lease_info, names=PLAIN):
    """The plan in readable lines, for the play's output."""
    image = plan.get("image") or {}
    lines = ["%s: %s (%s); GPUs %s; manager %s%s; args resolved by the %s%s; rollback %s" % (
        host, plan["action"], plan["why"], ",".join(str(g) for g in plan["target_gpus"]), plan["manager"],
        (", image %s" % image["words"]) if image.get("words") else "",
        (("SGLang %s of image %s" % (resolved.get("node_version") or "", image.get("words"))) if image.get("id") else
         ("node's SGLang %s" % (resolved.get("node_version") or "")).strip()) if resolved.get("source") == "node"
        else "collection's mirror",
        (" (%s)" % resolved["fallback"]) if resolved.get("fallback") else "",
        "ready" if plan["rollback_ready"] else "not possible: %s" % plan["known_good"].get("why"))]
    for dis in resolved.get("disagreements") or []:
        # The node decides; a disagreement is the mirror's gap, shown so that it gets reported and fixed.
        lines.append("mirror differs from the node's SGLang: %s: mirror %s, node %s (the node's answer is used)" % (
            dis.get("arg") or "outcome", _fmt(dis.get("mirror")), _fmt(dis.get("node"))))
    if lease_info.get("waited_for"):
        lines.append("lease: waited %s s for run %s" % (lease_info.get("waited"), lease_info["waited_for"]))
    if lease_info.get("took_over"):
        lines.append("lease: TOOK OVER the lease of run %s (%s)" % (
            lease_info["took_over"].get("owner"), lease_info.get("took_over_reason")))
    if plan.get("interrupted"):
        lines.append("journal: %s" % plan["journal"]["summary"])
    wplan = plan.get("weights") or {}
    if wplan.get("mode") == "restart" and plan["action"] == "restart" and any(
            d.get("field") == "args.model_path" for d in wplan.get("differences") or []):
        # The checkpoint changes, but not in place (sglang_redeploy_mode auto): say why.
        lines.append("no in-place weight update: %s" % ("; ".join(wplan.get("reasons") or []) or wplan.get("why")))
    for adj in resolved.get("adjustments") or []:
        line = "%s: %s -> %s [%s; %s]" % (
            adj.get("arg"), _fmt(adj.get("from")), _fmt(adj.get("to")), adj.get("rule"), adj.get("doc"))
        if adj.get("log"):
            line += ' SGLang logs: "%s"' % adj["log"]
        lines.append(line)
    for holder in plan.get("holders") or []:
        lines.append("GPU holder PID %s (%s, user %s, GPUs %s): %s; %s" % (
            holder["pid"], holder["class"], holder.get("user"), ",".join(str(g) for g in holder.get("gpus") or []),
            holder.get("why"), (holder.get("cmdline") or "")[:160]))
    for diff in plan.get("differences") or []:
        lines.append("changes " + identity.format_difference(diff))
    if plan.get("cache") is not None:
        lines.append(caches_mod.summary_line(plan["cache"], names))
    return lines
