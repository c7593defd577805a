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
      - Rendered to argv with C(sglang_args.to_argv) for O(version). Secret fields (C(api_key), C(admin_api_key) and any
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
      - V(systemd) starts, restarts or stops O(unit) with C(systemctl); the unit (its C(ExecStart) and environment) and its
        C(--config) file are rendered by the caller, for example the C(gpufleet.sglang.sglang_server) role. The PID is the
        unit's C(MainPID); the log is O(log_file) when the unit writes it, else the journal.
    type: str
    choices: [process, systemd]
    default: process
  unit:
    description:
      - systemd unit name for O(manager=systemd). Default C(sglang-<name>.service).
    type: str
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
      - With O(manager=process) the module writes it with mode C(0600) whenever there is a secret. With O(manager=systemd) the
        caller renders it (and references it in the unit); the module only hashes it.
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
    C(module_utils/sglang_process.py) (C(os.fork), C(os.setsid), C(os.execvpe), an argv list, no shell).
  - The stop path never matches processes by name. It signals the PIDs recorded at start (pinned by start time) and the members
    of the server's session, so schedulers reparented to PID 1 are found too.
  - A crashed server's leftover children are SIGKILLed at once, since they can hold GPU memory; O(keep_on_failure) does not
    apply to them.
  - SGLang prints C(server_args=...) with the API key in its log and returns it from C(/server_info). The module masks both.
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
      description: The SGLang rule that printed it (see C(sglang_args.OVERRIDE_LOG_PATTERNS)).
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

import json
import math
import os
import re
import socket
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.sglang.plugins.module_utils import http
from ansible_collections.gpufleet.sglang.plugins.module_utils import procfs
from ansible_collections.gpufleet.sglang.plugins.module_utils import sglang_args
from ansible_collections.gpufleet.sglang.plugins.module_utils import sglang_process as sp
from ansible_collections.gpufleet.sglang.plugins.module_utils import sockets

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 30000
LOG_TAIL_LINES = 40
JOURNAL_LINES = 200
MSG_LINE_MAX = 400
PROBE_TIMEOUT = 30.0
NAME_RE = re.compile(r"^[A-Za-z0-9_.@-]+$")
# Server modules that mark where SGLang's own flags begin in a command line.
ENTRY_TOKENS = ("sglang.launch_server", "serve")
WILDCARD_HOSTS = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1", "[::]": "::1"}
# Spellings SGLang normalises without changing behaviour (sglang.md section 1.2).
VALUE_ALIASES = {"speculative_algorithm": {"NEXTN": "EAGLE"}}


# --------------------------------------------------------------------------
# Pure helpers (unit tested)
# --------------------------------------------------------------------------

def supports_config(version):
    """True when ``version`` has ``--config`` (0.5.10 and later)."""
    try:
        return sglang_args.flag_available("config", version)
    except ValueError:
        return False


def norm_key(key):
    return str(key).strip().lstrip("-").replace("-", "_")


def is_path_arg(arg):
    return arg.endswith(("_path", "_dir", "_file")) or arg in ("model", "tokenizer", "download_dir")


def normalise(arg, value):
    """Comparable form of a value: numbers as float, booleans as bool,
    ``'true'``/``'16'`` strings converted, algorithm and backend names
    upper-cased, paths normalised, lists element-wise."""
    if value is None:
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [normalise(arg, v) for v in value]
    if isinstance(value, dict):
        return dict((norm_key(k), normalise(norm_key(k), v)) for k, v in value.items())
    text = str(value).strip()
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    try:
        return float(int(text))
    except ValueError:
        pass
    try:
        num = float(text)
        if not math.isnan(num):
            return num
    except ValueError:
        pass
    if arg.endswith(("_algorithm", "_backend")):
        text = text.upper()
        return VALUE_ALIASES.get(arg, {}).get(text, text)
    if is_path_arg(arg) and text:
        text = os.path.normpath(text)
    return text


def _maybe_json(value, other):
    """A JSON text compared with a dict or list is compared parsed (SGLang
    keeps --json-model-override-args and friends as text)."""
    if isinstance(value, str) and isinstance(other, (dict, list)):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def same_value(arg, intended, running):
    a = normalise(arg, _maybe_json(intended, running))
    b = normalise(arg, _maybe_json(running, intended))
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(a, bool) or isinstance(b, bool):
        # store_true flags: False and "not set" are the same thing.
        return bool(a) == bool(b) if (a in (None, False, True) and b in (None, False, True)) else a == b
    return a == b


def lookup_effective(info, arg):
    """(found, value) of ``arg`` in a server_info answer: top level first,
    then the first DP rank's ``internal_states``."""
    if arg in info:
        return True, info[arg]
    states = info.get("internal_states")
    if isinstance(states, list) and states and isinstance(states[0], dict) and arg in states[0]:
        return True, states[0][arg]
    return False, None


def compare(expect, info, version, args=None, explain=None):
    """Return ``(overrides, unverified)``: one dict per intended value the
    server does not run, and the names it does not report."""
    explain = explain or sglang_args.explain
    overrides = []
    unverified = []
    for raw_key in sorted(expect or {}):
        arg = norm_key(raw_key)
        intended = expect[raw_key]
        if intended is None:
            continue
        found, running = lookup_effective(info, arg)
        if not found:
            unverified.append(arg)
            continue
        if same_value(arg, intended, running):
            continue
        try:
            why = explain(arg, intended, running, version, args=args)
        except Exception as exc:  # explain must never hide the difference itself
            why = "no explanation available (%s)" % exc
        overrides.append({"arg": arg, "intended": intended, "running": running, "explanation": why})
    return overrides, unverified


def format_override(item):
    """One line per difference: ``sglang_args.explain`` already starts with
    ``<arg>: intended X, running Y``; anything else gets that prefix."""
    why = item.get("explanation") or ""
    if why.startswith("%s:" % item["arg"]):
        return why
    prefix = "%s: intended %s, running %s" % (item["arg"], _show(item["intended"]), _show(item["running"]))
    return "%s \u2014 %s" % (prefix, why) if why else prefix


def _show(value):
    if isinstance(value, str):
        return value
    return json.dumps(value)


def scan_log(text, version, secrets=()):
    """Known override warnings in the log (``sglang_args.scan_override_log``),
    once each, secrets masked: ``[{arg, rule, line}]``."""
    found = []
    seen = set()
    for item in sglang_args.scan_override_log(text, version):
        line = sp.mask_text(item["line"], secrets)
        if (line, item["arg"]) in seen:
            continue
        seen.add((line, item["arg"]))
        found.append({"arg": item["arg"], "rule": item.get("rule"), "line": line})
    return found


def flags_of(argv):
    """SGLang's own flags from a server command line: the tokens after
    ``-m sglang.launch_server`` / ``sglang serve``, else from the first
    ``--`` token on."""
    argv = list(argv or [])
    for i, token in enumerate(argv):
        if token in ENTRY_TOKENS or token.endswith("/sglang.launch_server"):
            return argv[i + 1:]
    for i, token in enumerate(argv):
        if token.startswith("--"):
            return argv[i:]
    return []


def probe_host(host):
    host = (host or "").strip()
    if host in WILDCARD_HOSTS:
        return WILDCARD_HOSTS[host]
    return host.strip("[]")


def base_url(host, port):
    host = probe_host(host)
    if ":" in host:
        host = "[%s]" % host
    return "http://%s:%d" % (host, port)


def port_in_use(host, port, timeout=0.5):
    """True when something accepts TCP connections on ``host:port``."""
    try:
        infos = socket.getaddrinfo(probe_host(host), port, 0, socket.SOCK_STREAM)
    except socket.gaierror:
        return False
    for family, socktype, proto, _canon, addr in infos:
        sock = socket.socket(family, socktype, proto)
        sock.settimeout(timeout)
        try:
            sock.connect(addr)
            return True
        except OSError:
            continue
        finally:
            sock.close()
    return False


def _short(lines):
    """Log lines for a message: very long ones (SGLang's server_args=...) are cut."""
    return "\n".join(line if len(line) <= MSG_LINE_MAX else line[:MSG_LINE_MAX] + " [... %d more characters]" % (
        len(line) - MSG_LINE_MAX) for line in lines)


def parse_properties(text):
    """``systemctl show`` key=value lines -> dict."""
    props = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            props[key.strip()] = value.strip()
    return props


# --------------------------------------------------------------------------
# The module
# --------------------------------------------------------------------------

class LaunchFailed(Exception):
    def __init__(self, msg, **extra):
        super().__init__(msg)
        self.msg = msg
        self.extra = extra


class Launcher(object):

    def __init__(self, module):
        self.module = module
        self.began = time.monotonic()
        p = module.params
        self.p = p
        self.name = p["name"]
        self.state = p["state"]
        self.manager = p["manager"]
        self.version = p["version"]
        self.unit = p["unit"] or "sglang-%s.service" % self.name
        self.state_dir = p["state_dir"] or os.path.join("/run/sglang", self.name)
        self.pid_file = p["pid_file"] or os.path.join(self.state_dir, "server.pid")
        self.state_file = sp.state_path_for(self.pid_file)
        if p["log_file"]:
            self.log_file = p["log_file"]
        elif self.manager == "process":
            self.log_file = os.path.join(self.state_dir, "server.log")
        else:
            self.log_file = None
        self.config_path = p["config_file"] or os.path.join(self.state_dir, "config.yaml")
        self.env = dict((str(k), "" if v is None else str(v)) for k, v in (p["env"] or {}).items())
        self.secrets = []
        self.result = {"changed": False, "action": "none"}
        self.blockers = []
        self.has_config = True
        # Filled by plan():
        self.args = {}
        self.secret_args = {}
        self.flags = []
        self.argv = []
        self.config_text = None
        self.fp = None
        self.host = DEFAULT_HOST
        self.port = DEFAULT_PORT
        self.url = None
        self.api_key = None
        self.python = p["python"]
        self.started_at = None      # monotonic, set when the server was started
        self.started_wall = None    # epoch seconds, for journalctl --since

    # ---------------- helpers ----------------

    def elapsed(self):
        return round(time.monotonic() - self.began, 3)

    def secret(self, value):
        if value:
            value = str(value)
            if value not in self.secrets:
                self.secrets.append(value)
            self.module.no_log_values.add(value)

    def masked(self, argv):
        return sp.mask_argv(argv, self.secrets)

    def fail(self, msg, **extra):
        res = dict(self.result)
        res.update(extra)
        res["elapsed"] = self.elapsed()
        self.module.fail_json(msg=sp.mask_text(msg, self.secrets), **sp.redact(res, self.secrets))

    def run_cmd(self, argv, check=True):
        rc, out, err = self.module.run_command(argv, environ_update={"LC_ALL": "C", "LANG": "C"})
        if check and rc != 0:
            raise LaunchFailed("%s failed (rc=%d): %s" % (" ".join(argv), rc, (err or out).strip()), rc=rc, stdout=out, stderr=err)
        return rc, out, err

    # ---------------- planning ----------------

    def plan_intended(self):
        p = self.p
        if not NAME_RE.match(self.name):
            self.blockers.append("name %r may contain only letters, digits, '.', '_', '-' and '@' (it is used in paths and the unit name)"
                                 % self.name)
        try:
            sglang_args.rule_version(self.version)
        except ValueError as exc:
            self.blockers.append("version: %s" % exc)
        self.has_config = supports_config(self.version)
        for key, value in self.env.items():
            if sp.is_secret_name(key):
                self.secret(value)
        self.api_key = p["api_key"]
        self.secret(self.api_key)
        if self.state == "stopped":
            return  # args do not matter for a stop
        args = {}
        for key, value in (p["args"] or {}).items():
            args[norm_key(key)] = value
        for key in sglang_args.SECRET_ARGS:
            value = args.pop(key, None)
            if value not in (None, ""):
                self.secret_args[key] = value
                self.secret(value)
        if self.api_key:
            if "api_key" in self.secret_args and str(self.secret_args["api_key"]) != self.api_key:
                self.blockers.append("api_key is given both as the api_key option and in args with different values; give it once")
            self.secret_args["api_key"] = self.api_key
        elif "api_key" in self.secret_args:
            self.api_key = str(self.secret_args["api_key"])

        if p["port"] is not None:
            if "port" in args and str(args["port"]) != str(p["port"]):
                self.blockers.append("port=%s conflicts with args.port=%s; give one of them" % (p["port"], args["port"]))
            args["port"] = p["port"]
        if p["host"]:
            if "host" in args and str(args["host"]) != p["host"]:
                self.blockers.append("host=%s conflicts with args.host=%s; give one of them" % (p["host"], args["host"]))
            args["host"] = p["host"]
        try:
            self.port = int(args.get("port", DEFAULT_PORT))
        except (TypeError, ValueError):
            self.blockers.append("port must be an integer, got %r" % (args.get("port"),))
        self.host = str(args.get("host", DEFAULT_HOST))
        self.url = base_url(self.host, self.port)
        self.args = args

        try:
            self.flags = list(sglang_args.to_argv(args, self.version, secrets="omit"))
        except ValueError as exc:
            self.blockers.append("args: %s" % exc)
            self.flags = []
        if self.secret_args:
            if self.has_config:
                try:
                    self.config_text = sglang_args.to_config_yaml(self.secret_args, self.version)
                except ValueError as exc:
                    self.blockers.append("args: %s" % exc)
                # Two tokens: SGLang silently ignores --config=FILE (sglang.md section 5).
                self.flags += ["--config", self.config_path]
            elif p["allow_api_key_in_argv"]:
                try:
                    self.flags += list(sglang_args.to_argv(self.secret_args, self.version, secrets="include"))
                except ValueError as exc:
                    self.blockers.append("args: %s" % exc)
                self.module.warn("SGLang %s has no --config (added in 0.5.10): the API key is on the server's command line, "
                                 "readable by every local user through ps and /proc/<pid>/cmdline" % self.version)
            else:
                self.blockers.append(
                    "SGLang %s has no --config option (added in 0.5.10), so %s would have to go on the command line where "
                    "ps shows it; upgrade SGLang, or set allow_api_key_in_argv=true to accept that"
                    % (self.version, ", ".join(sorted(self.secret_args))))
        python = self.python
        if self.manager == "process" and self.state != "stopped":
            if "/" in python:
                if not (os.path.isfile(python) and os.access(python, os.X_OK)):
                    self.blockers.append("python: %s is not an executable file" % python)
            else:
                path = self.env.get("PATH")
                found = self.module.get_bin_path(python, required=False, opt_dirs=path.split(os.pathsep) if path else [])
                if not found:
                    self.blockers.append("python: %s not found in PATH" % python)
                else:
                    python = found
            if p["chdir"] and not os.path.isdir(p["chdir"]):
                self.blockers.append("chdir: %s is not a directory" % p["chdir"])
        self.argv = [python, "-m", "sglang.launch_server"] + self.flags
        env_fp = self.env if self.manager == "process" else {}
        chdir_fp = p["chdir"] if self.manager == "process" else None
        self.fp = sp.fingerprint(self.flags, self.config_text if self.manager == "process" else self._config_on_disk(), env_fp, chdir_fp)

    def _config_on_disk(self):
        if not self.secret_args or not self.has_config:
            return None
        try:
            with open(self.config_path, "r", encoding="utf-8") as fh:
                return fh.read()
        except OSError:
            return None

    # ---------------- current state ----------------

    def unit_props(self):
        systemctl = self.module.get_bin_path("systemctl", required=True)
        rc, out, err = self.run_cmd(
            [systemctl, "show", "--property=MainPID,ActiveState,SubState,Result,ExecMainStatus,NeedDaemonReload,LoadState", self.unit],
            check=False)
        if rc != 0:
            raise LaunchFailed("systemctl show %s failed (rc=%d): %s" % (self.unit, rc, (err or out).strip()))
        return parse_properties(out)

    def current(self):
        """What runs now: dict(pid, start, record, matches, argv_masked)."""
        record = sp.read_state(self.state_file)
        cur = {"pid": None, "start": None, "record": record, "matches": False, "argv": None}
        if self.manager == "process":
            pid = sp.read_pid_file(self.pid_file)
            if pid and sp.alive(pid):
                start = sp.starttime(pid)
                if record and record.get("pid") == pid:
                    ours = record.get("starttime") == start
                else:
                    # No record for this PID: accept it only if it is an SGLang server.
                    ours = any("sglang" in token for token in sp.cmdline(pid))
                if ours:
                    cur["pid"], cur["start"] = pid, start
        else:
            props = self.unit_props()
            cur["unit"] = props
            try:
                pid = int(props.get("MainPID") or 0)
            except ValueError:
                pid = 0
            if pid and props.get("ActiveState") in ("active", "activating", "reloading") and sp.alive(pid):
                cur["pid"], cur["start"] = pid, sp.starttime(pid)
        if cur["pid"]:
            running_argv = sp.cmdline(cur["pid"])
            cur["argv"] = self.masked(running_argv)
            if record and record.get("pid") == cur["pid"] and record.get("starttime") == cur["start"]:
                cur["matches"] = record.get("fingerprint") == self.fp
            else:
                # Not started by this module (or restarted by systemd): compare what is visible.
                cur["matches"] = flags_of(running_argv) == self.flags and (
                    self.manager == "systemd" or not self.secret_args or self._config_on_disk() == self.config_text)
        return cur

    # ---------------- diff ----------------

    def render_launch(self, argv_masked, config_masked, env_masked):
        """Diff text of one launch; every input is already masked."""
        lines = ["argv: %s" % " ".join(argv_masked or [])]
        if config_masked:
            lines.append("config_file %s:" % self.config_path)
            lines.extend("  " + line for line in config_masked.splitlines())
        if env_masked:
            lines.append("env: %s" % ", ".join("%s=%s" % (k, v) for k, v in sorted(env_masked.items())))
        return "\n".join(lines) + "\n"

    def masked_env(self):
        if self.manager != "process":
            return None
        return dict((k, sp.MASK if sp.is_secret_name(k) else sp.mask_text(v, self.secrets)) for k, v in self.env.items())

    def masked_config(self):
        text = self.config_text if self.manager == "process" else self._config_on_disk()
        return sp.mask_text(text, self.secrets) if text else None

    def diff(self, action, cur):
        before = ""
        if cur["pid"]:
            record = cur["record"] or {}
            if record.get("pid") == cur["pid"] and record.get("argv"):
                before = self.render_launch(record["argv"], record.get("config_masked"), record.get("env"))
            else:
                before = self.render_launch(cur["argv"], None, None)
        after = ""
        if action in ("start", "restart"):
            after = self.render_launch(self.masked(self.argv), self.masked_config(), self.masked_env())
        return {"before": before, "after": after, "before_header": "%s (running)" % self.name,
                "after_header": "%s (intended)" % self.name}

    def launch_record(self):
        """What O(record_file) holds: enough to launch the same server again (the rollback reads it)."""
        record = dict(self.p["record_extra"] or {})
        record.update(
            name=self.name, version=self.version, manager=self.manager, args=sp.redact(self.p["args"] or {}, self.secrets),
            python=self.python,
            env=dict((k, v) for k, v in (self.p["env"] or {}).items() if k != "CUDA_VISIBLE_DEVICES"),
            cuda_visible_devices=self.env.get("CUDA_VISIBLE_DEVICES", ""),
        )
        return record

    # ---------------- main flow ----------------

    def run(self):
        self.plan_intended()
        if self.blockers:
            self.fail("sglang_launch %s: cannot proceed, nothing was changed:\n- %s" % (self.name, "\n- ".join(self.blockers)))
        try:
            cur = self.current()
        except LaunchFailed as exc:
            self.fail(exc.msg, **exc.extra)
        if self.state == "stopped":
            action = "stop" if cur["pid"] else "none"
        elif self.state == "restarted":
            action = "restart" if cur["pid"] else "start"
        else:
            action = "none" if cur["pid"] and cur["matches"] else ("restart" if cur["pid"] else "start")
        res = self.result
        res["action"] = action
        res["changed"] = action != "none"
        if self.state != "stopped":
            res["argv"] = self.masked(self.argv)
            res["url"] = self.url
            res["config_file"] = self.config_path if "--config" in self.flags else None
        if cur["pid"]:
            res["pid"] = cur["pid"]
        if self.module._diff and action != "none":
            res["diff"] = self.diff(action, cur)
        if action == "start" and self.module.check_mode:
            owner = self.port_owner()
            if owner is not None:
                self.module.warn("port %d is in use by %s: a start would fail unless it is freed first" % (self.port, owner))
        if self.module.check_mode:
            res["elapsed"] = self.elapsed()
            self.module.exit_json(**res)
        try:
            if action in ("stop", "restart"):
                res["stop"] = self.stop(cur)
                res.pop("pid", None)
                if action == "stop":
                    sp.remove_quietly(self.pid_file, self.state_file)
            if action in ("start", "restart"):
                pid, start, log_offset, is_child = self.start()
                res["pid"] = pid
                self.wait_healthy(pid, start, log_offset, is_child, started=True)
            elif action == "none" and cur["pid"]:
                record = cur["record"] or {}
                offset = record.get("log_offset", 0) if record.get("pid") == cur["pid"] else 0
                self.wait_healthy(cur["pid"], cur["start"], offset, False, started=False)
        except LaunchFailed as exc:
            self.fail(exc.msg, **exc.extra)
        res["elapsed"] = self.elapsed()
        self.module.exit_json(**sp.redact(res, self.secrets))

    # ---------------- stop ----------------

    def stop(self, cur):
        timeout = self.p["stop_timeout"]
        pid, start = cur["pid"], cur["start"]
        if self.manager == "process":
            report = sp.stop_tree(pid, start, timeout=timeout)
        else:
            members = sp.tree(pid)
            systemctl = self.module.get_bin_path("systemctl", required=True)
            began = time.monotonic()
            self.run_cmd([systemctl, "stop", self.unit])
            left = [(p, s) for p, s in members if sp.alive(p, s)]
            killed, still = sp.kill_leftovers(left) if left else ([], [])
            report = {"signalled": [pid], "killed": killed, "exited": sorted(set(p for p, _s in members) - set(still)),
                      "still_running": still, "elapsed": round(time.monotonic() - began, 3)}
        if report["still_running"]:
            raise LaunchFailed("could not stop SGLang server %s: PIDs %s survived SIGKILL (uninterruptible sleep or PID 1 in a container?)"
                               % (self.name, report["still_running"]), stop=report)
        return report

    # ---------------- start ----------------

    def port_owner(self):
        """None when the port is free, else a description of who holds it."""
        listening, pids = sockets.port_listeners(self.port)
        if not listening and not port_in_use(self.host, self.port):
            return None
        if not pids:
            return "another process"
        who = []
        for pid in pids[:3]:
            who.append("pid %d (%s)" % (pid, " ".join(self.masked(sp.cmdline(pid)))[:200] or "?"))
        return ", ".join(who)

    def _wait_port_free(self, seconds=10.0):
        deadline = procfs.Deadline(seconds)
        owner = self.port_owner()
        while owner is not None and not deadline.expired():
            time.sleep(deadline.clamp(0.2))
            owner = self.port_owner()
        return owner

    def start(self):
        """Start the server; returns (pid, starttime, log_offset, is_child)."""
        owner = self._wait_port_free(10.0 if self.result["action"] == "restart" else 0.0)
        if owner is not None:
            raise LaunchFailed(
                "port %d is already in use by %s: SGLang server %s would fail to bind it, or the health check would reach the "
                "other server. Stop that process or choose another port (port / args.port). Nothing was started."
                % (self.port, owner, self.name))
        for directory in set(os.path.dirname(x) for x in (self.pid_file, self.log_file, self.config_path, self.p["record_file"]) if x):
            sp.ensure_dir(directory)
        if self.p["record_file"]:
            sp.write_private(self.p["record_file"], json.dumps(self.launch_record(), indent=4, sort_keys=True) + "\n", mode=0o640)
            self.result["record_file"] = self.p["record_file"]
        if self.config_text is not None and self.manager == "process":
            if self._config_on_disk() != self.config_text or (os.stat(self.config_path).st_mode & 0o077):
                sp.write_private(self.config_path, self.config_text)
        started_wall = time.time()
        if self.manager == "process":
            env = dict(os.environ)
            env.update(self.env)
            log_offset = self._log_header()
            try:
                pid = sp.spawn_detached(self.argv, env, self.log_file, chdir=self.p["chdir"])
            except sp.SpawnError as exc:
                raise LaunchFailed("could not start SGLang server %s: %s" % (self.name, exc))
            is_child = True
            with open(self.pid_file, "w", encoding="utf-8") as fh:
                fh.write("%d\n" % pid)
        else:
            log_offset = sp.log_size(self.log_file) if self.log_file else 0
            props = self.unit_props()
            systemctl = self.module.get_bin_path("systemctl", required=True)
            if props.get("NeedDaemonReload") == "yes":
                self.run_cmd([systemctl, "daemon-reload"])
            # A running unit was stopped (and its leftovers killed by PID) above, so this is always a start.
            self.run_cmd([systemctl, "start", self.unit])
            props = self.unit_props()
            try:
                pid = int(props.get("MainPID") or 0)
            except ValueError:
                pid = 0
            is_child = False
            if not pid:
                raise LaunchFailed(
                    "systemd unit %s has no main process right after start (ActiveState=%s, Result=%s, ExecMainStatus=%s). "
                    "Last log lines:\n%s" % (self.unit, props.get("ActiveState"), props.get("Result"), props.get("ExecMainStatus"),
                                             _short(self.log_tail(log_offset, started_wall))),
                    log_tail=self.log_tail(log_offset, started_wall))
        start = sp.starttime(pid)
        self.started_at = time.monotonic()
        self.started_wall = started_wall
        if self.manager == "systemd" and flags_of(sp.cmdline(pid)) and flags_of(sp.cmdline(pid)) != self.flags:
            self.module.warn("the ExecStart of %s differs from the argv rendered from args; re-render the unit. Running: %s"
                             % (self.unit, " ".join(self.masked(sp.cmdline(pid)))))
        record = {
            "name": self.name, "manager": self.manager, "pid": pid, "starttime": start, "port": self.port, "url": self.url,
            "fingerprint": self.fp, "argv": self.masked(self.argv), "version": self.version, "log_offset": log_offset,
            "started_at": started_wall, "unit": self.unit if self.manager == "systemd" else None,
            "env": self.masked_env(), "config_masked": self.masked_config(),
        }
        sp.write_state(self.state_file, record)
        return pid, start, log_offset, is_child

    def _log_header(self):
        """Append a marker line to the log and return the offset after it."""
        line = "=== gpufleet.sglang sglang_launch: starting %s at %s: %s ===\n" % (
            self.name, time.strftime("%Y-%m-%dT%H:%M:%S%z"), " ".join(self.masked(self.argv)))
        fd = os.open(self.log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        try:
            os.write(fd, line.encode("utf-8"))
            return os.lseek(fd, 0, os.SEEK_END)
        finally:
            os.close(fd)

    # ---------------- logs ----------------

    def log_text(self, offset, since_wall=None):
        if self.log_file and (self.manager == "process" or os.path.exists(self.log_file) and sp.log_size(self.log_file) > (offset or 0)):
            return sp.read_log(self.log_file, offset)
        if self.manager == "systemd":
            journalctl = self.module.get_bin_path("journalctl", required=False)
            if not journalctl:
                return ""
            cmd = [journalctl, "-u", self.unit, "-n", str(JOURNAL_LINES), "--no-pager", "-o", "cat"]
            if since_wall:
                cmd += ["--since", "@%d" % int(since_wall)]
            rc, out, dummy = self.run_cmd(cmd, check=False)
            return out if rc == 0 else ""
        return ""

    def log_tail(self, offset, since_wall=None):
        text = self.log_text(offset, since_wall)
        return [sp.mask_text(line, self.secrets) for line in sp.tail(text, LOG_TAIL_LINES)]

    # ---------------- health ----------------

    def _exit_of(self, pid, start, is_child):
        """None while the server runs, else a description of how it ended."""
        if is_child:
            status = sp.reap(pid)
            if status is not None:
                return status
        if sp.alive(pid, start):
            return None
        return {}

    def wait_healthy(self, pid, start, log_offset, is_child, started):
        res = self.result
        timeout = float(self.p["health_timeout"])
        deadline = procfs.Deadline(timeout)
        since_wall = self.started_wall
        url = self.url + self.p["health_path"]
        members = sp.tree(pid)
        last = "no answer yet"
        delay = 0.1
        exit_info = None
        healthy = False
        while not deadline.expired():
            exit_info = self._exit_of(pid, start, is_child)
            if exit_info is not None:
                break
            try:
                status, dummy, dummy2 = http.request("GET", url, api_key=self.api_key, timeout=max(deadline.clamp(PROBE_TIMEOUT), 0.05))
                last = "HTTP %d" % status
                if 200 <= status < 300:
                    healthy = True
                    break
            except http.HTTPConnectionError as exc:
                last = exc.kind if exc.kind in ("refused", "timeout") else "%s (%s)" % (exc.kind, exc.reason)
            members = sp.tree(pid) or members
            time.sleep(deadline.clamp(delay))
            delay = min(delay * 1.5, 2.0)
        else:
            exit_info = self._exit_of(pid, start, is_child)
        waited = round(deadline.elapsed(), 3)
        if healthy:
            if started:
                res["startup_s"] = round(time.monotonic() - self.started_at, 3)
            self.verify(log_offset, since_wall)
            return
        res["last_status"] = last
        if exit_info is not None:
            # The server died before it became healthy: its children may still hold GPU memory.
            leftovers = [(p, s) for p, s in members if p != pid]
            killed, dummy = sp.kill_leftovers(leftovers, grace=5.0) if leftovers else ([], [])
            how = ("exited with code %s" % exit_info["code"]) if "code" in exit_info and "signal" not in exit_info else (
                "was killed by %s" % exit_info["signal"] if "signal" in exit_info else "exited")
            if self.manager == "systemd":
                try:
                    props = self.unit_props()
                    how = "exited (unit %s: ActiveState=%s, Result=%s, ExecMainStatus=%s)" % (
                        self.unit, props.get("ActiveState"), props.get("Result"), props.get("ExecMainStatus"))
                except LaunchFailed:
                    pass
            tail = self.log_tail(log_offset, since_wall)
            if self.manager == "process":
                sp.remove_quietly(self.pid_file)
            res.pop("pid", None)
            raise LaunchFailed(
                "SGLang server %s (pid %d) %s after %.1f s, before %s answered 2xx (last answer: %s).%s Last %d log lines:\n%s"
                % (self.name, pid, how, waited, url, last,
                   (" Killed leftover processes %s." % killed) if killed else "", len(tail), _short(tail)),
                log_tail=tail, exit=exit_info, killed=killed)
        tail = self.log_tail(log_offset, since_wall)
        if started and not self.p["keep_on_failure"]:
            try:
                cur = {"pid": pid, "start": start}
                if self.manager == "process":
                    report = sp.stop_tree(pid, start, timeout=self.p["stop_timeout"], is_child=is_child)
                    sp.remove_quietly(self.pid_file)
                else:
                    report = self.stop(cur)
                res["stop"] = report
                res.pop("pid", None)
                what = "stopped it (pid %d) so that it does not hold the GPUs; set keep_on_failure=true to keep it for debugging" % pid
            except LaunchFailed as exc:
                what = "tried to stop it but: %s" % exc.msg
        elif started:
            what = "left it running (pid %d) because keep_on_failure=true" % pid
        else:
            what = "left it running (pid %d): this run did not start it" % pid
        raise LaunchFailed(
            "SGLang server %s did not become healthy within %s s: %s never answered 2xx (last answer: %s); %s. Last %d log lines:\n%s"
            % (self.name, _num(timeout), url, last, what, len(tail), _short(tail)),
            log_tail=tail)

    # ---------------- effective config ----------------

    def server_info(self):
        # /server_info appeared in 0.5.10, together with --config (sglang.md section 2.3).
        order = ["/server_info", "/get_server_info"]
        if not self.has_config:
            order.reverse()
        last = None
        for path in order:
            try:
                status, dummy, body = http.request("GET", self.url + path, api_key=self.api_key, timeout=PROBE_TIMEOUT)
            except http.HTTPConnectionError as exc:
                raise LaunchFailed("the server is healthy but %s%s could not be read: %s" % (self.url, path, exc))
            if status == 404:
                last = "%s: HTTP 404" % path
                continue
            if status in (401, 403):
                raise LaunchFailed("%s%s answered HTTP %d: the server wants an API key%s" % (
                    self.url, path, status, " other than the one given" if self.api_key else "; set api_key"))
            if status != 200 or not isinstance(body, dict):
                raise LaunchFailed("%s%s answered HTTP %d with %s" % (self.url, path, status, type(body).__name__))
            return path, body
        raise LaunchFailed("the server answers neither /server_info nor /get_server_info (%s)" % last)

    def verify(self, log_offset, since_wall):
        res = self.result
        endpoint, info = self.server_info()
        res["server_info_endpoint"] = endpoint
        res["version"] = info.get("version")
        res["effective"] = sp.redact(info, self.secrets)
        expect = self.p["expect"]
        if expect is None:
            expect = self.args
        overrides, unverified = compare(expect, info, self.version, args=self.args)
        for item in overrides:
            item["intended"] = sp.redact(item["intended"], self.secrets)
            item["running"] = sp.redact(item["running"], self.secrets)
        res["overrides"] = overrides
        res["unverified"] = unverified
        res["log_warnings"] = scan_log(self.log_text(log_offset, since_wall), self.version, self.secrets)
        if not overrides:
            return
        lines = [format_override(item) for item in overrides]
        policy = self.p["on_override"]
        if policy == "warn":
            for line in lines:
                self.module.warn("SGLang server %s: %s" % (self.name, line))
        elif policy == "fail":
            warn_lines = ["  log: %s" % w["line"] for w in res["log_warnings"]]
            raise LaunchFailed(
                "SGLang server %s is healthy but does not run the intended configuration (%d difference%s). The server was left "
                "running (pid %s) so the playbook can roll back; set on_override=warn to accept it.\n- %s%s"
                % (self.name, len(lines), "" if len(lines) == 1 else "s", res.get("pid"), "\n- ".join(lines),
                   ("\nSGLang logged:\n" + "\n".join(warn_lines)) if warn_lines else ""))


def _num(value):
    return ("%d" % value) if float(value).is_integer() else ("%g" % value)


def argument_spec():
    return dict(
        name=dict(type="str", required=True),
        state=dict(type="str", default="started", choices=["started", "stopped", "restarted"]),
        args=dict(type="dict"),
        version=dict(type="str", default="0.5.23"),
        manager=dict(type="str", default="process", choices=["process", "systemd"]),
        unit=dict(type="str"),
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


def main():
    module = AnsibleModule(
        argument_spec=argument_spec(),
        required_if=[
            ("state", "started", ("args",)),
            ("state", "restarted", ("args",)),
        ],
        supports_check_mode=True,
    )
    Launcher(module).run()


if __name__ == "__main__":
    main()
