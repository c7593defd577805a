# -*- coding: utf-8 -*-
# Copyright (c) gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_launch
short_description: Start, stop or restart an SGLang server, gate on health and verify its effective config
version_added: 0.1.0
description:
  - Starts, restarts or stops one SGLang server, either as a systemd unit that a role rendered (O(manager=systemd)) or as a
    supervised, detached process in its own session (O(manager=process)).
  - After a start it polls O(health_path) under one monotonic deadline (O(health_timeout)). When the server process dies
    first it fails at once with the last 40 log lines; on timeout it stops the server it started (see O(keep_on_failure)).
  - "It also fails at once when the server crashed but its main process still runs, as SGLang 0.5.23 does through its
    crash diagnostics (5 s, then 60 s while a scheduler lives, its port in LISTEN and nothing answering): one of its
    C(sglang::scheduler*) or C(sglang::detokenizer) processes is gone, or its log says that a process failed. The main
    process gets up to 10 s to exit by itself (none once it logs its crash diagnostics); then it is stopped (SIGTERM,
    SIGKILL after 5 s), whatever O(keep_on_failure) says."
  - "A 2xx counts only when the socket listening on the port belongs to the server's process tree (C(/proc/net/tcp) inode,
    C(/proc/<pid>/fd)): with a port conflict, the losing SGLang server's warmup reaches the other server and logs
    C(fired up) before it exits with status 3."
  - Once healthy it reads C(/server_info) (falling back to C(/get_server_info)) and compares every intended argument
    (O(expect)) with the value the server really runs. SGLang rewrites some arguments at start-up with only a warning in its log,
    for example C(speculative_num_draft_tokens) becomes C(speculative_num_steps + 1) when C(speculative_eagle_topk == 1).
    Each difference is reported with an explanation, and the log is scanned for the known override warnings.
  - The argv is rendered from O(args) by the same module_utils code as the P(gpufleet.sglang.sglang_argv#filter) filter.
  - Secrets never reach argv on SGLang 0.5.10 and later, see O(api_key).
author:
  - gpufleet maintainers (@gpufleet)
extends_documentation_fragment:
  - action_common_attributes
  - gpufleet.sglang.tls
  - gpufleet.sglang.option_labels
  - gpufleet.sglang.container
attributes:
  check_mode:
    support: full
    details: Reports the planned RV(action) and the masked RV(argv); starts, stops and writes nothing.
  diff_mode:
    support: full
    details: Before/after argv (masked) and C(--config) file (masked) of the server.
  platform:
    support: full
    platforms: posix
    details: Linux only (reads C(/proc)).
  idempotent:
    description: Running the module twice with the same options changes nothing the second time.
    support: full
    details: A healthy server with the same argv, config file, environment and working directory is left alone.
options:
  name:
    description:
      - Instance name. Used in the default O(unit) and state paths.
      - Letters, digits, C(.), C(_), C(-) and C(@) only.
    type: str
    required: true
  state:
    description:
      - V(started) starts the server when it is not running and restarts it when it runs with different arguments, config
        file, environment or working directory.
      - V(restarted) always stops (when running) and starts the server.
      - V(stopped) stops it; nothing happens when it is not running.
    type: str
    choices: [started, stopped, restarted]
    default: started
  args:
    description:
      - The intended SGLang server arguments, keyed by field name (C(model_path), C(tp_size), C(speculative_num_steps), ...;
        dashes are accepted and turned into underscores).
      - Rendered to argv by C(module_utils/sglang/render.py) for O(version). Secret fields (C(api_key), C(admin_api_key) and any
        field named like a key, token, secret or password) are taken out of argv and handled like O(api_key).
      - Required when O(state) is V(started) or V(restarted).
    type: dict
  version:
    description:
      - The SGLang version that runs on the node. It decides the flag spellings, whether C(--config) exists (0.5.10 and later)
        and which info endpoint is asked first.
    type: str
    default: "0.5.23"
  manager:
    description:
      - V(process) runs C(O(python) -m sglang.launch_server <argv>) as a detached process in its own session (C(setsid)) with
        stdin from C(/dev/null) and stdout and stderr appended to O(log_file); its PID goes to O(pid_file).
      - V(systemd) starts, restarts or stops O(unit) with C(systemctl). With O(unit_dir) the module renders the unit file
        itself (C(ExecStart) from the same renderer as the argv, secrets through a 0600 C(--config) file and a 0600
        C(EnvironmentFile)) and reloads systemd when it changed; without it the unit must exist. The PID is the
        unit's C(MainPID); the log is O(log_file) when the unit writes it, else the journal.
      - V(docker) and V(podman) run it in a container from O(image) through the runtime's CLI (C(run -d), C(stop -t),
        C(logs)); see O(container). The PID is the host PID of the container's main process.
    type: str
    choices: [process, systemd, docker, podman]
    default: process
  unit:
    description:
      - systemd unit name for O(manager=systemd). Default C(sglang-<name>.service).
    type: str
  unit_dir:
    description:
      - With O(manager=systemd), the directory where the module writes the unit file (for example C(/etc/systemd/system)).
        Unset leaves the unit to the caller.
    type: path
  python:
    description:
      - Python interpreter that runs C(-m sglang.launch_server) with O(manager=process); a name is looked up in E(PATH).
    type: str
    default: python3
  env:
    description:
      - Extra environment variables for the server (O(manager=process)), for example C(CUDA_VISIBLE_DEVICES) or C(PYTHONPATH).
        They are added to the module's own environment.
      - Values of variables named like a secret (C(HF_TOKEN)) are masked in every output.
    type: dict
    default: {}
  chdir:
    description:
      - Working directory of the server (O(manager=process)).
    type: path
  host:
    description:
      - Address the server binds to; added to O(args) as C(host) when O(args) has none. Health checks go to C(127.0.0.1)
        (or C(::1)) when it is a wildcard address.
      - Defaults to C(host) in O(args), else C(127.0.0.1), which is also SGLang's default.
    type: str
  port:
    description:
      - Port of the server; added to O(args) as C(port) when O(args) has none. Defaults to C(port) in O(args), else C(30000).
    type: int
  api_key:
    description:
      - API key of the server. Sent as a C(Authorization) bearer token to C(/server_info); health paths are exempt from auth.
      - On SGLang 0.5.10 and later it is written, with the other secret fields of O(args), to O(config_file) (mode C(0600)) and passed as
        C(--config <file>); it never appears on the command line, so C(ps) and C(/proc/<pid>/cmdline) do not show it.
      - Older SGLang has no C(--config), so the key would have to go on argv, where every local user can read it. The module
        refuses that unless O(allow_api_key_in_argv=true).
      - It is masked (C(********)) in RV(argv), RV(effective), the log lines returned and every message.
    type: str
  allow_api_key_in_argv:
    description:
      - Accept C(--api-key) on the command line for SGLang older than 0.5.10, where C(--config) does not exist.
    type: bool
    default: false
  state_dir:
    description:
      - Directory for the default O(pid_file), O(log_file) and O(config_file); created with mode C(0700) when missing.
      - Default C(/run/sglang/<name>).
    type: path
  pid_file:
    description:
      - PID file of the server (O(manager=process)). A state file C(<pid_file without .pid>.state.json) (mode C(0600)) is kept next
        to it with the PID, start time, port and a hash of the launch (argv, config file, environment, working directory).
      - Default C(<state_dir>/server.pid). Used for the state file with O(manager=systemd) too.
    type: path
  log_file:
    description:
      - Log file of the server. With O(manager=process) stdout and stderr are appended to it (default C(<state_dir>/server.log)).
      - With O(manager=systemd) it is read when the unit writes it; otherwise the module reads C(journalctl -u <unit>).
    type: path
  config_file:
    description:
      - The C(--config) YAML file that carries the secrets (SGLang 0.5.10 and later). Default C(<state_dir>/config.yaml).
      - The module writes it with mode C(0600) whenever there is a secret.
      - Always passed as two tokens C(--config <file>); SGLang silently ignores the file when given as C(--config=<file>).
    type: path
  health_path:
    description:
      - Path polled until it answers 2xx. C(/health_generate) runs one real token through the model.
    type: str
    default: /health_generate
  health_timeout:
    description:
      - Seconds from the start until the server must be healthy. One monotonic deadline covers every probe.
    type: float
    default: 1800
  keep_on_failure:
    description:
      - Leave a server that did not become healthy in time running, for debugging. By default the module stops the server it
        started so that a half-started server does not keep the GPUs.
    type: bool
    default: false
  expect:
    description:
      - The values to verify against C(/server_info), keyed by field name. Default the non-secret fields of O(args).
      - Use V({}) to skip the comparison.
    type: dict
  on_override:
    description:
      - What to do when the running server differs from O(expect).
      - V(fail) fails the task with every difference and its explanation. The healthy server is B(left running) and its
        RV(pid) is returned, so that the playbook can roll back.
      - V(warn) adds a warning per difference; V(ignore) only reports them in RV(overrides).
    type: str
    choices: [fail, warn, ignore]
    default: fail
  stop_timeout:
    description:
      - Seconds to wait after SIGTERM (or C(systemctl stop)) before the remaining processes of the recorded tree (descendants
        and session members) are SIGKILLed, by PID.
    type: float
    default: 60
  record_file:
    description:
      - When set, a start or restart first writes the launch record there, as JSON (mode C(0640), atomically; the
        directory is made when missing). C(gpufleet.sglang.sglang_server) writes the candidate config this way, and its
        promote step keeps it as the known-good config that a rollback relaunches.
      - The record holds C(name), C(version), C(manager), C(args) (secret-named keys masked; give secrets through
        O(api_key)), C(env) without C(CUDA_VISIBLE_DEVICES), C(cuda_visible_devices), C(python) and the keys of
        O(record_extra). C(env) is written as given, so that a relaunch gets the same environment.
      - Nothing is written in check mode, or when the server already runs as intended.
    type: path
  record_extra:
    description: More keys for the launch record, for example the resolver's adjustments. Ignored without O(record_file).
    type: dict
    default: {}
notes:
  - Starting a long-lived daemon cannot go through C(run_command), which waits for the command to end. The spawn is isolated in
    C(module_utils/node/supervise.py) (C(os.fork), C(os.setsid), C(os.execvpe), an argv list, no shell).
  - The stop path never matches processes by name. It signals the PIDs recorded at start (pinned by start time) and the members
    of the server's session, so schedulers reparented to PID 1 are found too.
  - A crashed server's leftover children are SIGKILLed at once, since they can hold GPU memory; O(keep_on_failure) does not
    apply to them.
  - SGLang prints C(server_args=...) with the API key in its log and returns it from C(/server_info). The module masks both
    in what it returns, and keeps the log file at mode C(0600).
  - The launch itself (render, start, health gate, config check) is C(module_utils/server/launcher.py), shared with
    M(gpufleet.sglang.sglang_replace).
seealso:
  - module: gpufleet.sglang.gpu_memory_assert
  - module: gpufleet.sglang.gpu_drain
"""

EXAMPLES = r"""
- name: Start the incident config and fail if SGLang rewrites any argument
  gpufleet.sglang.sglang_launch:
    name: main
    version: "0.5.23"
    python: /opt/sglang/bin/python
    args:
      model_path: /models/Qwen3-32B
      tp_size: 8
      speculative_algorithm: EAGLE
      speculative_draft_model_path: /models/Qwen3-32B-eagle
      speculative_eagle_topk: 1
      speculative_num_steps: 1
      speculative_num_draft_tokens: 16
      host: 0.0.0.0
      port: 30000
    env:
      CUDA_VISIBLE_DEVICES: "0,1,2,3,4,5,6,7"
    api_key: "{{ vault_sglang_api_key }}"
    on_override: fail
  register: launch

- name: Restart the systemd unit rendered by the role, only warn about overrides
  gpufleet.sglang.sglang_launch:
    name: main
    manager: systemd
    unit: sglang-main.service
    args: "{{ resolved.args }}"
    config_file: /etc/sglang/main/config.yaml
    api_key: "{{ vault_sglang_api_key }}"
    on_override: warn
    state: restarted

- name: Plan only (no process is started)
  gpufleet.sglang.sglang_launch:
    name: main
    args: "{{ resolved.args }}"
  check_mode: true
  register: plan

- name: Stop the server, SIGKILL what is left after 30 s
  gpufleet.sglang.sglang_launch:
    name: main
    state: stopped
    stop_timeout: 30
"""

RETURN = r"""
record_file:
  description: The launch record written before the start (O(record_file)).
  returned: when O(record_file) is set and the server was started or restarted
  type: str
  sample: /etc/sglang/main/candidate/server.json
action:
  description: What the module did (or would do in check mode).
  returned: always
  type: str
  choices: [start, restart, stop, none]
  sample: start
argv:
  description: The server command line with secrets masked.
  returned: when O(state) is not V(stopped)
  type: list
  elements: str
  sample: ["/usr/bin/python3", "-m", "sglang.launch_server", "--model-path", "/models/m", "--port", "30000",
           "--config", "/run/sglang/main/config.yaml"]
config_file:
  description: The C(--config) file passed to the server, or V(null) when there is no secret to pass.
  returned: when O(state) is not V(stopped)
  type: str
  sample: /run/sglang/main/config.yaml
pid:
  description:
    - PID of the server's main process. Also returned on a failed O(on_override=fail) check, where the server is left running.
  returned: when a server runs at the end
  type: int
  sample: 41877
url:
  description: Base URL the module used to reach the server.
  returned: when O(state) is not V(stopped)
  type: str
  sample: http://127.0.0.1:30000
startup_s:
  description: Seconds from the start of the process until O(health_path) answered 2xx.
  returned: when the module started the server
  type: float
  sample: 83.4
effective:
  description:
    - The server's C(/server_info) (or C(/get_server_info)) answer. Values of fields named like a key, token, secret or
      password (C(api_key), C(admin_api_key), C(hf_token), ...) are replaced by C(********), and secret literals are masked
      in every string (C(launch_command)).
  returned: when the server is healthy
  type: dict
  sample: {"speculative_num_draft_tokens": 2, "speculative_num_steps": 1, "api_key": "********", "version": "0.5.23"}
overrides:
  description: Every intended value the server does not run, with the reason.
  returned: when the server is healthy
  type: list
  elements: dict
  contains:
    arg:
      description: Field name.
      type: str
    intended:
      description: The value in O(expect).
      type: raw
    running:
      description: The value reported by the server.
      type: raw
    explanation:
      description: Why SGLang changed it and how to get the intended behaviour.
      type: str
  sample:
    - arg: speculative_num_draft_tokens
      intended: 16
      running: 2
      explanation: >-
        speculative_num_draft_tokens: intended 16, running 2 — SGLang sets it to num_steps + 1 when
        speculative_eagle_topk == 1; set speculative_num_steps: 15
unverified:
  description: Fields of O(expect) that the server does not report, so they could not be compared.
  returned: when the server is healthy
  type: list
  elements: str
log_warnings:
  description: Log lines of this server run that match a known SGLang override warning (secrets masked).
  returned: when the server is healthy
  type: list
  elements: dict
  contains:
    line:
      description: The log line.
      type: str
    arg:
      description: The field the warning is about.
      type: str
    rule:
      description: The SGLang rule that printed it (see C(module_utils/sglang/rules.py), C(log_patterns)).
      type: str
version:
  description: The SGLang version reported by the server.
  returned: when the server is healthy
  type: str
  sample: 0.5.23
server_info_endpoint:
  description: The endpoint that answered, C(/server_info) or C(/get_server_info).
  returned: when the server is healthy
  type: str
stop:
  description: What stopping did, by PID.
  returned: when a server was stopped
  type: dict
  contains:
    signalled:
      description: PIDs sent SIGTERM.
      type: list
      elements: int
    killed:
      description: PIDs sent SIGKILL after O(stop_timeout).
      type: list
      elements: int
    exited:
      description: PIDs of the tree that are gone.
      type: list
      elements: int
    still_running:
      description: PIDs that survived SIGKILL.
      type: list
      elements: int
    elapsed:
      description: Seconds the stop took.
      type: float
    exit:
      description:
        - "The exit status of a server this run started and stopped: C(code) (the exit code, or minus the signal number)
          and C(signal) (its name, when a signal ended it); null when it was not collected."
      returned: when the stopped server was started by this run
      type: dict
    normal_stop:
      description:
        - "True when the server ended as a stop should: exit status 0, death by SIGTERM (SGLang 0.5.23 before its signal
          handler is installed, status 143 in a shell) or exit code 143. False for any other status."
      returned: when the stopped server was started by this run
      type: bool
crashed:
  description: Why the health gate took the server for crashed (a process gone, or the log line that says so).
  returned: when the server crashed during the health gate
  type: str
log_tail:
  description: The last 40 lines of the server log with secrets masked.
  returned: on failure to become healthy
  type: list
  elements: str
last_status:
  description: The last health answer seen (C(HTTP 503), C(refused), C(timeout)).
  returned: on failure to become healthy
  type: str
exit:
  description: How the server process ended (C(code), and C(signal) when a signal killed it; empty when it was not our child).
  returned: when the server died before it became healthy
  type: dict
killed:
  description: PIDs of the dead server's leftover processes (same session) that were SIGKILLed.
  returned: when the server died before it became healthy
  type: list
  elements: int
elapsed:
  description: Seconds the module ran.
  returned: always
  type: float
"""

import re
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import http
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import names as names_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.server import launcher as engine
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import secrets as secret_rules
from ansible_collections.gpufleet.sglang.plugins.module_utils.node import supervise as sp
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import render

NAME_RE = re.compile(r"^[A-Za-z0-9_.@-]+$")
PASSED = ("name", "version", "manager", "unit", "unit_dir", "python", "args", "api_key", "env", "chdir", "host", "port",
          "state_dir", "pid_file", "log_file", "config_file", "health_path", "health_timeout", "stop_timeout",
          "keep_on_failure", "expect", "on_override", "allow_api_key_in_argv", "record_file", "record_extra", "image", "container")


def argument_spec():
    return dict(
        name=dict(type="str", required=True),
        state=dict(type="str", default="started", choices=["started", "stopped", "restarted"]),
        args=dict(type="dict"),
        version=dict(type="str", default="0.5.23"),
        manager=dict(type="str", default="process", choices=["process", "systemd", "docker", "podman"]),
        image=dict(type="str"),
        container=dict(type="dict"),
        unit=dict(type="str"),
        unit_dir=dict(type="path"),
        python=dict(type="str", default="python3"),
        env=dict(type="dict", default={}),
        chdir=dict(type="path"),
        host=dict(type="str"),
        port=dict(type="int"),
        api_key=dict(type="str", no_log=True),
        allow_api_key_in_argv=dict(type="bool", default=False),
        state_dir=dict(type="path"),
        pid_file=dict(type="path"),
        log_file=dict(type="path"),
        config_file=dict(type="path"),
        health_path=dict(type="str", default="/health_generate"),
        health_timeout=dict(type="float", default=1800),
        keep_on_failure=dict(type="bool", default=False),
        expect=dict(type="dict"),
        on_override=dict(type="str", default="fail", choices=["fail", "warn", "ignore"]),
        stop_timeout=dict(type="float", default=60),
        record_file=dict(type="path"),
        record_extra=dict(type="dict", default={}),
    )


def _diff(launcher, cur, action):
    before = ""
    if cur["pid"]:
        record = cur.get("record") or {}
        argv = record.get("argv") if record.get("pid") == cur["pid"] else cur.get("argv")
        before = "argv: %s\n" % " ".join(argv or [])
    after = ""
    if action in ("start", "restart"):
        after = "argv: %s\n" % " ".join(launcher.masked(launcher.argv))
        if launcher.config_text is not None:
            # The --config file as it will be written, every secret value masked (rendered from masked values:
            # masking the rendered text would miss a value that YAML escaped).
            masked = render.to_config_yaml(dict((k, "********") for k in launcher.secret_args), launcher.version)
            after += "config %s (0600):\n%s" % (launcher.config_path, "".join("  " + line + "\n" for line in masked.splitlines()))
    return {"before": before, "after": after, "before_header": "%s (running)" % launcher.name,
            "after_header": "%s (intended)" % launcher.name}


def main():
    module = AnsibleModule(argument_spec=dict(argument_spec(), **dict(http.TLS_ARGSPEC, **names_mod.ARGSPEC)), supports_check_mode=True,
                           required_if=[("state", "started", ("args",)), ("state", "restarted", ("args",))])
    http.configure_module(module)
    p = module.params
    began = time.monotonic()
    params = dict((k, p[k]) for k in PASSED)
    params["args"] = p["args"] or {}
    launcher = engine.Launcher(module, params, check_mode=module.check_mode)
    blockers = [] if NAME_RE.match(p["name"]) else [
        "name %r may contain only letters, digits, '.', '_', '-' and '@' (it is used in paths and the unit name)" % p["name"]]
    blockers += launcher.plan() if p["state"] != "stopped" or p["args"] else []
    result = {"changed": False, "action": "none"}

    def fail(msg, **extra):
        result.update(extra)
        result["elapsed"] = round(time.monotonic() - began, 3)
        module.fail_json(msg=secret_rules.mask_text(msg, launcher.secrets), **secret_rules.redact(result, launcher.secrets))

    if blockers:
        fail("sglang_launch %s: cannot proceed, nothing was changed:\n- %s" % (p["name"], "\n- ".join(blockers)))
    try:
        cur = launcher.current()
    except engine.LaunchError as exc:
        fail(exc.msg, **exc.extra)
    if p["state"] == "stopped":
        action = "stop" if cur["pid"] else "none"
    elif p["state"] == "restarted":
        action = "restart" if cur["pid"] else "start"
    else:
        matches = cur["pid"] and cur.get("fingerprint") and cur["fingerprint"] == launcher.fp
        action = "none" if matches else ("restart" if cur["pid"] else "start")
    result.update(action=action, changed=action != "none")
    if p["state"] != "stopped":
        result.update(argv=launcher.masked(launcher.argv), url=launcher.url,
                      config_file=launcher.config_path if "--config" in launcher.flags else None)
    if cur["pid"]:
        result["pid"] = cur["pid"]
    if module._diff and action != "none":
        result["diff"] = _diff(launcher, cur, action)
    if module.check_mode:
        if action == "start":
            owner = launcher.port_owner()
            if owner is not None:
                module.warn("port %d is in use by %s: a start would fail unless it is freed first" % (launcher.port, owner))
        result["elapsed"] = round(time.monotonic() - began, 3)
        module.exit_json(**secret_rules.redact(result, launcher.secrets))
    try:
        if action in ("stop", "restart"):
            result["stop"] = launcher.stop(cur)
            result.pop("pid", None)
        if action in ("start", "restart"):
            launcher.result["unit_changed"] = launcher.write_files()
            if p["record_file"]:
                result["record_file"] = p["record_file"]
            pid, start, offset, is_child = launcher.start(port_grace=10.0 if action == "restart" else 0.0)
            result["pid"] = pid
            launcher.result["pid"] = pid
            launcher.wait_healthy(pid, start, offset, is_child, started=True)
        elif action == "none" and cur["pid"]:
            record = cur.get("record") or {}
            offset = record.get("log_offset", 0) if record.get("pid") == cur["pid"] else 0
            launcher.result["pid"] = cur["pid"]
            launcher.wait_healthy(cur["pid"], cur["start"], offset, False, started=False)
    except engine.LaunchError as exc:
        result.update(launcher.result)
        if exc.extra.get("server_exited"):
            result.pop("pid", None)
        fail(exc.msg, **dict((k, v) for k, v in exc.extra.items() if k not in ("server_exited", "config_mismatch")))
    launcher.result.pop("unit_changed", None)
    result.update(launcher.result)
    if action == "stop":
        sp.remove_quietly(launcher.pid_file, launcher.state_file)
    result["elapsed"] = round(time.monotonic() - began, 3)
    module.exit_json(**secret_rules.redact(result, launcher.secrets))


if __name__ == "__main__":
    main()
