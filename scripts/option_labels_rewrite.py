#!/usr/bin/env python3
"""Issue 23 point 4: the engines' messages name module options (through common/names.py), not role variables.

Scope: the message texts of plugins/module_utils and of plugins/modules/sglang_prefetch.py (and their imports). The
rest of the change (module_utils/common/names.py, the option_labels option and doc fragment of the modules, the
roles' labels, the tests) is ordinary code that merges as it is.

Re-appliable: every rewrite is an exact (old -> new) text replacement, looked up in every file under plugins/ (so a
function moved to another file is still found); an old text that is gone and whose new text is there counts as
done. Run from the repository root: python3 scripts/option_labels_rewrite.py [--check]. Exit 1 when a rewrite
finds neither text (the moved code must then be edited by hand: the script names it).
"""
import os
import sys

IMP = "from ansible_collections.gpufleet.sglang.plugins.module_utils.common import names as names_mod\n"
IMP_PLAIN = "from ansible_collections.gpufleet.sglang.plugins.module_utils.common.names import PLAIN\n"

# (file hint for the import, old, new). The file hint only says where the import goes when the text is found there.
REWRITES = [
    # --- server/launcher.py: the Launcher knows its module (ctx) and so its labels.
    ("no HTTP header and no config file can carry; fix sglang_server_api_key / sglang_server_env\")",
     "no HTTP header and no config file can carry; fix %s / %s\" % (self.names.of(\"api_key\"), self.names.of(\"env\")))"),
    ("\"sglang_server_args.port: %d is not a TCP port; give a port from 1 to 65535\" % self.port)",
     "\"%s: %d is not a TCP port; give a port from 1 to 65535\" % (self.names.of(\"args\", \"port\"), self.port))"),
    ("\"sglang_server_args.port must be an integer from 1 to 65535, got %r\" % (args.get(\"port\"),))",
     "\"%s must be an integer from 1 to 65535, got %r\" % (self.names.of(\"args\", \"port\"), args.get(\"port\")))"),
    ("        self.ctx = ctx\n        self.p = with_defaults(params)\n",
     "        self.ctx = ctx\n        self.names = names_mod.Names.of_module(ctx)\n        self.p = with_defaults(params)\n"),
    # --- server/caches.py: the option names by default; the preflight passes its labels.
    ("def check_free(cache_dir, min_free_gb, var=\"sglang_server_cache_dir\", min_var=\"sglang_server_cache_min_free_gb\"):",
     "def check_free(cache_dir, min_free_gb, var=\"cache_dir\", min_var=\"cache_min_free_gb\"):"),
    ("def describe(cache_dir, min_free_gb, operator_env):", "def describe(cache_dir, min_free_gb, operator_env, names=PLAIN):"),
    ("    free, problem = check_free(cache_dir, min_free_gb)\n",
     "    free, problem = check_free(cache_dir, min_free_gb, names.of(\"cache_dir\"), names.of(\"cache_min_free_gb\"))\n"),
    ("def summary_line(info):", "def summary_line(info, names=PLAIN):"),
    ("        return \"compile caches: SGLang's defaults (sglang_server_cache_dir is empty)\"",
     "        return \"compile caches: SGLang's defaults (%s is empty)\" % names.of(\"cache_dir\")"),
    ("        line += \"; kept from sglang_server_env: %s\" % \", \".join(info[\"kept\"])",
     "        line += \"; kept from %s: %s\" % (names.of(\"env\"), \", \".join(info[\"kept\"]))"),
    # --- redeploy/replace.py
    ("                                         \"sglang_redeploy_mode: restart\")",
     "                                         \"%s: restart\" % names_mod.Names.of_module(self.module).of(\"redeploy_mode\"))"),
    # --- redeploy/identity.py
    ("def decide(intended_fp, running, known_good_fp, entry, force=False):",
     "def decide(intended_fp, running, known_good_fp, entry, force=False, names=PLAIN):"),
    ("\"why\": \"sglang_redeploy_force is set\"", "\"why\": \"%s is set\" % names.of(\"force\")"),
    # --- redeploy/survey.py
    ("                     exclude_names, watchers=None, suspects=None):",
     "                     exclude_names, watchers=None, suspects=None, names=PLAIN):"),
    ("\"why\": \"part of the server this deploy adopts (on the managed port, or named by \"\n"
     "                                                     \"sglang_adopt_pids)\"}",
     "\"why\": \"part of the server this deploy adopts (on the managed port, or named by \"\n"
     "                                                     \"%s)\" % names.of(\"adopt_pids\")}"),
    ("\"why\": \"matches sglang_adopt_patterns\"", "\"why\": \"matches %s\" % names.of(\"adopt_patterns\")"),
    ("def compile_patterns(patterns):", "def compile_patterns(patterns, names=PLAIN):"),
    ("\"sglang_adopt_patterns: %r is not a valid regular expression (%s)\" % (text, exc)",
     "\"%s: %r is not a valid regular expression (%s)\" % (names.of(\"adopt_patterns\"), text, exc)"),
    # --- redeploy/settings.py (the SETTINGS table stays: its keys are the caller's own names, passed in with values)
    ("def check_gpu_layout(args, target_gpus, nnodes=1, explicit=False):",
     "def check_gpu_layout(args, target_gpus, nnodes=1, explicit=False, names=PLAIN):"),
    ("        return (\"sglang_server_cuda_visible_devices: %s needs %d GPU(s) per node, but it lists %d (%s); list %d GPU(s) or \"\n"
     "                \"change the parallel layout\" % (layout, need, have,",
     "        return (\"%s: %s needs %d GPU(s) per node, but it lists %d (%s); list %d GPU(s) or \"\n"
     "                \"change the parallel layout\" % (names.of(\"gpus\"), layout, need, have,"),
    ("    return \"sglang_server_args: %s needs %d GPU(s) per node, but %d are targeted\" % (layout, need, have)",
     "    return \"%s: %s needs %d GPU(s) per node, but %d are targeted\" % (names.of(\"args\"), layout, need, have)"),
    # --- sglang/serving.py: _field names a field of the args option.
    ("def _field(name):\n    return \"sglang_server_args.%s\" % name\n\n\n", ""),
    ("def check_values(args):\n    \"\"\"Types and ranges of the args as given, one message per bad field (SGLang would accept them).\"\"\"\n",
     "def check_values(args, names=PLAIN):\n    \"\"\"Types and ranges of the args as given, one message per bad field (SGLang would accept them).\"\"\"\n"
     "    _field = names.field_of(\"args\")\n"),
    ("def check_layout(args, target_gpus, node_gpu_count=None, nnodes=None, gpu_memory_mib=None, arch_known=True):",
     "def check_layout(args, target_gpus, node_gpu_count=None, nnodes=None, gpu_memory_mib=None, arch_known=True, names=PLAIN):"),
    ("    :func:`check_values` found nothing (it assumes positive sizes).\n    \"\"\"\n",
     "    :func:`check_values` found nothing (it assumes positive sizes).\n    \"\"\"\n    _field = names.field_of(\"args\")\n"),
    ("set node_rank per host in \"\n                        \"sglang_server_host_args\" % (_field(\"node_rank\"), rank, nodes, nodes - 1))",
     "set node_rank per host in \"\n                        \"%s\" % (_field(\"node_rank\"), rank, nodes, nodes - 1, names.of(\"host_args\")))"),
    ("                        \"GPUs with sglang_server_cuda_visible_devices\" % (\n"
     "                            _field(\"base_gpu_id\"), \"gpu_id_step\", base, base + (per_node - 1) * step, len(gpus),\n"
     "                            \",\".join(str(g) for g in gpus)))",
     "                        \"GPUs with %s\" % (\n"
     "                            _field(\"base_gpu_id\"), \"gpu_id_step\", base, base + (per_node - 1) * step, len(gpus),\n"
     "                            \",\".join(str(g) for g in gpus), names.of(\"gpus\")))"),
    # --- sglang/node_or_mirror.py and sglang/oracle.py
    ("def version_mismatch(declared, answered, python):", "def version_mismatch(declared, answered, python, names=PLAIN):"),
    ("    return (\"sglang_server_version: %s, but %s has SGLang %s installed; set sglang_server_version: \\\"%s\\\" (flags, \"\n"
     "            \"defaults and rules differ between releases, so the plan would describe another server)\"\n"
     "            % (declared, python, answered, answered))",
     "    return (\"%s: %s, but %s has SGLang %s installed; set %s: \\\"%s\\\" (flags, \"\n"
     "            \"defaults and rules differ between releases, so the plan would describe another server)\"\n"
     "            % (names.of(\"version\"), declared, python, answered, names.of(\"version\"), answered))"),
    ("                     source=\"auto\", python=\"python3\", timeout=120.0):",
     "                     source=\"auto\", python=\"python3\", timeout=120.0, names=PLAIN):"),
    ("            return oracle_mod.resolve_on_node(python, rendered, version, gpu, env=env, timeout=timeout)",
     "            return oracle_mod.resolve_on_node(python, rendered, version, gpu, env=env, timeout=timeout,\n"
     "                                              python_label=names.of(\"python\"))"),
    ("        mismatch = version_mismatch(version, answer.get(\"sglang_version\"), python)",
     "        mismatch = version_mismatch(version, answer.get(\"sglang_version\"), python, names)"),
    ("def run_helper(python, request, timeout=DEFAULT_TIMEOUT, cwd=None, env=None):",
     "def run_helper(python, request, timeout=DEFAULT_TIMEOUT, cwd=None, env=None, python_label=\"python\"):"),
    ("\"%s: no executable interpreter there; set the server's python (sglang_server_python) \"\n"
     "                                \"to the interpreter of the SGLang installation\" % where)",
     "\"%s: no executable interpreter there; set the server's python (%s) \"\n"
     "                                \"to the interpreter of the SGLang installation\" % (where, python_label))"),
    ("def resolve_on_node(python, args_or_argv, version, gpu, env=None, timeout=DEFAULT_TIMEOUT, cwd=None):",
     "def resolve_on_node(python, args_or_argv, version, gpu, env=None, timeout=DEFAULT_TIMEOUT, cwd=None, python_label=\"python\"):"),
    ("    answer = run_helper(python, request, timeout=timeout, cwd=cwd, env=process_env)",
     "    answer = run_helper(python, request, timeout=timeout, cwd=cwd, env=process_env, python_label=python_label)"),
    # --- router/workers.py: the router's key is the module's api_key option.
    ("\"the router the servers' key (--api-key, and sglang_router_api_key), or run the PD servers \"\n"
     "                      \"without --api-key.%s\" % (role, self.router.base, untouched))",
     "\"the router the servers' key (--api-key, and %s), or run the PD servers \"\n"
     "                      \"without --api-key.%s\" % (role, self.router.base, self.names.of(\"api_key\"), untouched))"),
    ("\"servers' key (--api-key, and sglang_router_api_key), or run the PD servers without --api-key.\"\n"
     "                % (self.url, role)))",
     "\"servers' key (--api-key, and %s), or run the PD servers without --api-key.\"\n"
     "                % (self.url, role, self.names.of(\"api_key\"))))"),
    # --- common/http.py: the TLS hints name the options, or the caller's labels for them (tls_settings carries them).
    ("CA_HINT = \"tls_ca_path (role variable sglang_server_tls_ca_path, sglang_router_tls_ca_path for the router)\"\n"
     "CERT_HINT = \"tls_client_cert/tls_client_key (role variables sglang_server_tls_client_cert/_key)\"\n",
     ""),
    ("               \"server's certificate\" % (detail, CA_HINT))",
     "               \"server's certificate\" % (detail, _hint(\"tls_ca_path\")))"),
    ("        fix = \"the server asks for a client certificate; set %s\" % CERT_HINT",
     "        fix = \"the server asks for a client certificate; set %s\" % _hint(\"tls_client_cert\", \"tls_client_key\")"),
    ("               \"for a client certificate\" % (reason, CA_HINT, CERT_HINT))",
     "               \"for a client certificate\" % (reason, _hint(\"tls_ca_path\"), _hint(\"tls_client_cert\", \"tls_client_key\")))"),
    ("            \"validate_certs\": params.get(\"validate_certs\") is not False}",
     "            \"validate_certs\": params.get(\"validate_certs\") is not False, \"labels\": dict(params.get(\"option_labels\") or {})}"),
    ("# Where the options come from, for the messages: module option (role variable).\n",
     "# The messages name the TLS options, or what the caller calls them (option_labels): see _hint.\n"),
    ("def _classify(url, exc):\n",
     "def _hint(*options):\n"
     "    \"\"\"The options to set, as the module's caller calls them (its option_labels, kept by configure_tls).\"\"\"\n"
     "    names = names_mod.Names((_TLS[\"settings\"] or {}).get(\"labels\"))\n"
     "    return \"/\".join(names.of(option) for option in options)\n\n\n"
     "def _classify(url, exc):\n"),
    ("    def __init__(self, module):\n        self.module = module\n        p = module.params\n        self.p = p\n",
     "    def __init__(self, module):\n        self.module = module\n        self.names = names_mod.Names.of_module(module)\n"
     "        p = module.params\n        self.p = p\n"),
    # --- redeploy/textfile.py: the sglang_textfile module's path option (or its label).
    ("def write(path, content, mode=0o644):", "def write(path, content, mode=0o644, label=\"path\"):"),
    ("        raise TextfileError(\"sglang_textfile_path %s\" % problem)\n    directory = os.path.dirname(path)",
     "        raise TextfileError(\"%s %s\" % (label, problem))\n    directory = os.path.dirname(path)"),
    ("        raise TextfileError(\"the directory %s of sglang_textfile_path does not exist: create it, or point \"\n"
     "                            \"sglang_textfile_path into node_exporter's --collector.textfile.directory\" % directory)",
     "        raise TextfileError(\"the directory %s of %s does not exist: create it, or point \"\n"
     "                            \"%s into node_exporter's --collector.textfile.directory\" % (directory, label, label))"),
    ("        raise TextfileError(\"cannot write sglang_textfile_path %s: %s\" % (path, exc))",
     "        raise TextfileError(\"cannot write %s %s: %s\" % (label, path, exc))"),
    # --- plugins/modules/sglang_prefetch.py: the module's own options.
    ("            module.fail_json(msg=\"sglang_server_prefetch_%s: %s is negative; give 0 or more\" % (name, p[name]))",
     "            module.fail_json(msg=\"%s: %s is negative; give 0 or more\" % (names.of(name), p[name]))"),
    ("        module.fail_json(msg=\"sglang_server_prefetch_reserve_percent: %s is not between 0 and 100; give a percent of MemTotal\"\n"
     "                             % p[\"reserve_percent\"])",
     "        module.fail_json(msg=\"%s: %s is not between 0 and 100; give a percent of MemTotal\"\n"
     "                             % (names.of(\"reserve_percent\"), p[\"reserve_percent\"]))"),
    ("        result[\"skipped_why\"] = \"sglang_server_prefetch is off\"",
     "        result[\"skipped_why\"] = \"%s is off\" % names.of(\"mode\")"),
    ("                module.warn(\"sglang_server_prefetch on: nothing was read: %s\" % result[\"skipped_why\"])",
     "                module.warn(\"%s on: nothing was read: %s\" % (names.of(\"mode\"), result[\"skipped_why\"]))"),
    ("                module.warn(\"sglang_server_prefetch on: stopped at the %s with %.1f%% of the checkpoint resident; raise %s\"\n"
     "                            % (\"memory budget\"",
     "                module.warn(\"%s on: stopped at the %s with %.1f%% of the checkpoint resident; raise %s\"\n"
     "                            % (names.of(\"mode\"), \"memory budget\""),
    ("                               \"sglang_server_prefetch_max_gb or lower the reserve\" if result[\"stopped\"] == \"budget\"\n"
     "                               else \"sglang_server_prefetch_timeout\"))",
     "                               \"%s or lower the reserve\" % names.of(\"max_gb\") if result[\"stopped\"] == \"budget\"\n"
     "                               else names.of(\"timeout\")))"),
    ("                module.warn(\"sglang_server_prefetch on: %s\" % result[\"priority_note\"])",
     "                module.warn(\"%s on: %s\" % (names.of(\"mode\"), result[\"priority_note\"]))"),
    ("                module.warn(\"sglang_server_prefetch on: %s\" % error)",
     "                module.warn(\"%s on: %s\" % (names.of(\"mode\"), error))"),
]

# --- redeploy/preflight.py: every message through self.names (set in __init__).
PREFLIGHT = [
    ("        self.p = module.params\n        self.check_mode = module.check_mode\n",
     "        self.p = module.params\n        self.names = names_mod.Names.of_module(module)\n        self.check_mode = module.check_mode\n"),
    ("\"nvidia-smi (sglang_server_nvidia_smi)\"", "\"nvidia-smi (%s)\" % self.names.of(\"nvidia_smi\")"),
    ("self.problem(\"sglang_server_cuda_visible_devices / tp_size: %s; the node has %d GPU(s)\" % (\"; \".join(errors), len(answering)))",
     "self.problem(\"%s / tp_size: %s; the node has %d GPU(s)\" % (self.names.of(\"gpus\"), \"; \".join(errors), len(answering)))"),
    ("            self.problem(\"sglang_server_cache_dir must be an absolute path, got %r; set a path such as %s/cache, or '' to \"\n"
     "                         \"leave SGLang's cache defaults\" % (cache_dir, p[\"state_dir\"]))",
     "            self.problem(\"%s must be an absolute path, got %r; set a path such as %s/cache, or '' to \"\n"
     "                         \"leave SGLang's cache defaults\" % (self.names.of(\"cache_dir\"), cache_dir, p[\"state_dir\"]))"),
    ("            self.problem(\"sglang_server_cache_min_free_gb must be a number of GiB >= 0, got %r; set e.g. 20, or 0 to turn the \"\n"
     "                         \"free-space check off\" % (min_free,))",
     "            self.problem(\"%s must be a number of GiB >= 0, got %r; set e.g. 20, or 0 to turn the \"\n"
     "                         \"free-space check off\" % (self.names.of(\"cache_min_free_gb\"), min_free))"),
    ("        info, problem = caches_mod.describe(cache_dir, min_free, operator_env)",
     "        info, problem = caches_mod.describe(cache_dir, min_free, operator_env, self.names)"),
    ("self.problem(\"sglang_server_args.model_path: not set; give the model directory on the node\")",
     "self.problem(\"%s: not set; give the model directory on the node\" % self.names.of(\"args\", \"model_path\"))"),
    ("self.problem(\"sglang_server_args.model_path: %s %s on this node; copy the model there or fix the path\" % (model_path, err))",
     "self.problem(\"%s: %s %s on this node; copy the model there or fix the path\" % (\n"
     "                    self.names.of(\"args\", \"model_path\"), model_path, err))"),
    ("self.problem(\"sglang_server_args.speculative_draft_model_path: %s %s on this node; copy the draft model there \"\n"
     "                             \"or fix the path\" % (draft, err))",
     "self.problem(\"%s: %s %s on this node; copy the draft model there \"\n"
     "                             \"or fix the path\" % (self.names.of(\"args\", \"speculative_draft_model_path\"), draft, err))"),
    ("            gpu=gpu, source=p[\"resolution\"], python=p[\"python\"], timeout=p[\"resolution_timeout\"])",
     "            gpu=gpu, source=p[\"resolution\"], python=p[\"python\"], timeout=p[\"resolution_timeout\"], names=self.names)"),
    ("self.notes.append(\"sglang_server_args.%s: load_format %s, the checkpoint's weight files were not checked (only \"\n"
     "                              \"the safetensors formats %s are)\" % (field, load_format,",
     "self.notes.append(\"%s: load_format %s, the checkpoint's weight files were not checked (only \"\n"
     "                              \"the safetensors formats %s are)\" % (self.names.of(\"args\", field), load_format,"),
    ("self.problem(\"sglang_server_args.%s: the checkpoint %s cannot be served: %s (SGLang would fail on it only while \"\n"
     "                         \"loading, after the running server is gone; nothing was touched)\" % (field, path, exc))",
     "self.problem(\"%s: the checkpoint %s cannot be served: %s (SGLang would fail on it only while \"\n"
     "                         \"loading, after the running server is gone; nothing was touched)\" % (self.names.of(\"args\", field), path, exc))"),
    ("self.problem(\"sglang_server_args.tokenizer_path: %s; copy the tokenizer files there or fix the path (SGLang \"\n"
     "                             \"would fail on it only while loading; nothing was touched)\" % problem)",
     "self.problem(\"%s: %s; copy the tokenizer files there or fix the path (SGLang \"\n"
     "                             \"would fail on it only while loading; nothing was touched)\" % (self.names.of(\"args\", \"tokenizer_path\"), problem))"),
    ("self.notes.append(\"sglang_server_args.%s: the checkpoint %s has more shards than %d s allow to check; the rest \"\n"
     "                              \"was not checked\" % (field, path, CHECKPOINT_SECONDS))",
     "self.notes.append(\"%s: the checkpoint %s has more shards than %d s allow to check; the rest \"\n"
     "                              \"was not checked\" % (self.names.of(\"args\", field), path, CHECKPOINT_SECONDS))"),
    ("self.notes.append(\"sglang_server_args.%s: the server's user or group is unknown on this node, so read access \"\n"
     "                              \"to %s was not checked\" % (field, path))",
     "self.notes.append(\"%s: the server's user or group is unknown on this node, so read access \"\n"
     "                              \"to %s was not checked\" % (self.names.of(\"args\", field), path))"),
    ("self.problem(\"sglang_server_args.port: port %d is held by %s, which is not the managed server; stop it \"\n"
     "                                 \"or choose another port\" % (launcher.port, who))",
     "self.problem(\"%s: port %d is held by %s, which is not the managed server; stop it \"\n"
     "                                 \"or choose another port\" % (self.names.of(\"args\", \"port\"), launcher.port, who))"),
    ("        adopt_res, problems = pf.compile_patterns(p[\"adopt_patterns\"])",
     "        adopt_res, problems = pf.compile_patterns(p[\"adopt_patterns\"], self.names)"),
    ("                                      watchers=watchers, suspects=suspects)",
     "                                      watchers=watchers, suspects=suspects, names=self.names)"),
    ("\"Move this server to other GPUs (sglang_server_cuda_visible_devices), name it in sglang_adopt_pids or \"\n"
     "                         \"sglang_adopt_patterns if this deploy replaces it, or set sglang_teardown_foreign: true to stop it\"\n"
     "                         % (len(foreign), \"; \".join(pf.describe_foreign(h) for h in foreign)))",
     "\"Move this server to other GPUs (%s), name it in %s or \"\n"
     "                         \"%s if this deploy replaces it, or set %s: true to stop it\"\n"
     "                         % (len(foreign), \"; \".join(pf.describe_foreign(h) for h in foreign), self.names.of(\"gpus\"),\n"
     "                            self.names.of(\"adopt_pids\"), self.names.of(\"adopt_patterns\"), self.names.of(\"allow_foreign\")))"),
    ("self.problem(\"sglang_server_args.api_key: put the key in sglang_server_api_key instead (a no_log variable \"\n"
     "                             \"that goes into the 0600 --config file); args are shown in plans and reports\")",
     "self.problem(\"%s: put the key in %s instead (a no_log variable \"\n"
     "                             \"that goes into the 0600 --config file); args are shown in plans and reports\"\n"
     "                             % (self.names.of(\"args\", \"api_key\"), self.names.of(\"api_key\")))"),
    ("self.problem(\"sglang_server_args.admin_api_key: this collection runs the server with sglang_server_api_key \"\n"
     "                             \"only (args are shown in plans and reports, and its own calls carry that key); remove \"\n"
     "                             \"admin_api_key\")",
     "self.problem(\"%s: this collection runs the server with %s \"\n"
     "                             \"only (args are shown in plans and reports, and its own calls carry that key); remove \"\n"
     "                             \"admin_api_key\" % (self.names.of(\"args\", \"admin_api_key\"), self.names.of(\"api_key\")))"),
    ("self.problem(\"sglang_server_args.hf_token: SGLang takes no such flag; it reads the Hugging Face token from \"\n"
     "                             \"the environment: set HF_TOKEN in sglang_server_env (a secret-named variable goes to a 0600 file, \"\n"
     "                             \"never into records) and remove hf_token from the args\")",
     "self.problem(\"%s: SGLang takes no such flag; it reads the Hugging Face token from \"\n"
     "                             \"the environment: set HF_TOKEN in %s (a secret-named variable goes to a 0600 file, \"\n"
     "                             \"never into records) and remove hf_token from the args\" % (self.names.of(\"args\", \"hf_token\"),\n"
     "                                                                                          self.names.of(\"env\")))"),
    ("self.problem(\"sglang_server_args.%s: holds a URL with credentials (user:password@ or a token parameter), \"\n"
     "                             \"which would be on the server's command line (ps) and in its records; use a URL without them \"\n"
     "                             \"and give the credentials through the environment (sglang_server_env) or a file\" % key)",
     "self.problem(\"%s: holds a URL with credentials (user:password@ or a token parameter), \"\n"
     "                             \"which would be on the server's command line (ps) and in its records; use a URL without them \"\n"
     "                             \"and give the credentials through the environment (%s) or a file\" % (self.names.of(\"args\", key),\n"
     "                                                                                                 self.names.of(\"env\")))"),
    ("self.problem(\"sglang_redeploy_mode: weights was asked for, but the plan is %s (%s); an in-place weight \"\n"
     "                             \"update needs a healthy managed server that runs another checkpoint of the same config\"\n"
     "                             % (decision[\"action\"], decision[\"why\"]))",
     "self.problem(\"%s: weights was asked for, but the plan is %s (%s); an in-place weight \"\n"
     "                             \"update needs a healthy managed server that runs another checkpoint of the same config\"\n"
     "                             % (self.names.of(\"redeploy_mode\"), decision[\"action\"], decision[\"why\"]))"),
    ("self.problem(\"sglang_redeploy_mode: weights was asked for, but an in-place update cannot reach the intended \"\n"
     "                         \"config: %s\" % (\"; \".join(wplan.get(\"reasons\") or []) or wplan[\"why\"]))",
     "self.problem(\"%s: weights was asked for, but an in-place update cannot reach the intended \"\n"
     "                         \"config: %s\" % (self.names.of(\"redeploy_mode\"), \"; \".join(wplan.get(\"reasons\") or []) or wplan[\"why\"]))"),
    ("\"with \\\"Port is already in use\\\". Stop it, or change the port in sglang_server_args\"\n"
     "                             % (item[\"port\"], item[\"what\"], sockets.describe(status)))",
     "\"with \\\"Port is already in use\\\". Stop it, or change the port in %s\"\n"
     "                             % (item[\"port\"], item[\"what\"], sockets.describe(status), self.names.of(\"args\")))"),
    ("        problem = settings.check_text_secret(\"sglang_server_api_key\", p[\"api_key\"])",
     "        problem = settings.check_text_secret(self.names.of(\"api_key\"), p[\"api_key\"])"),
    ("        value_problems = serving.check_values(p[\"args\"])", "        value_problems = serving.check_values(p[\"args\"], self.names)"),
    ("self.problem(\"sglang_server_manager: systemd is not running on this node (PID 1 is not systemd); set \"\n"
     "                         \"sglang_server_manager: process or auto\")",
     "self.problem(\"%s: systemd is not running on this node (PID 1 is not systemd); set \"\n"
     "                         \"%s: process or auto\" % (self.names.of(\"manager\"), self.names.of(\"manager\")))"),
    ("        layout = settings.check_gpu_layout(args, p[\"gpus\"], p[\"nnodes\"], p[\"explicit_gpus\"])",
     "        layout = settings.check_gpu_layout(args, p[\"gpus\"], p[\"nnodes\"], p[\"explicit_gpus\"], self.names)"),
    ("                                             arch_known=bool(p[\"arch\"] or self.node.get(\"arch\"))):",
     "                                             arch_known=bool(p[\"arch\"] or self.node.get(\"arch\")), names=self.names):"),
    ("self.problem(\"sglang_server_args.delete_ckpt_after_loading: SGLang deletes the checkpoint under %s after warmup, so \"\n"
     "                         \"a later rollback could not load the known-good config from it; drop delete_ckpt_after_loading, or set \"\n"
     "                         \"sglang_server_rollback: false to accept redeploys without rollback\" % args.get(\"model_path\"))",
     "self.problem(\"%s: SGLang deletes the checkpoint under %s after warmup, so \"\n"
     "                         \"a later rollback could not load the known-good config from it; drop delete_ckpt_after_loading, or set \"\n"
     "                         \"%s: false to accept redeploys without rollback\" % (self.names.of(\"args\", \"delete_ckpt_after_loading\"),\n"
     "                                                                              args.get(\"model_path\"), self.names.of(\"rollback\")))"),
    ("                var = {\"config\": \"sglang_server_config_dir\", \"state\": \"sglang_server_state_dir\", \"log\": \"sglang_server_log_file\",\n"
     "                       \"unit\": \"sglang_server_unit_dir\"}[what]",
     "                var = self.names.of({\"config\": \"config_dir\", \"state\": \"state_dir\", \"log\": \"log_file\", \"unit\": \"unit_dir\"}[what])"),
    ("            self.problem(\"sglang_lock_dir: cannot take the node lease %s: %s\" % (self.lease_path, exc))",
     "            self.problem(\"%s: cannot take the node lease %s: %s\" % (self.names.of(\"lease\", \"path\"), self.lease_path, exc))"),
    ("identity.decide(launcher.fp, found[\"running\"], kg.get(\"fingerprint\"), entry, p[\"force\"])",
     "identity.decide(launcher.fp, found[\"running\"], kg.get(\"fingerprint\"), entry, p[\"force\"], self.names)"),
    ("        lines.append(caches_mod.summary_line(plan[\"cache\"]))",
     "        lines.append(caches_mod.summary_line(plan[\"cache\"], names))"),
    ("def plan_lines(host, plan, resolved, lease_info):", "def plan_lines(host, plan, resolved, lease_info, names=PLAIN):"),
    ("plan_lines(p[\"label\"] or p[\"name\"], plan, resolved, lease_info)",
     "plan_lines(p[\"label\"] or p[\"name\"], plan, resolved, lease_info, self.names)"),
]


def files():
    for root, _dirs, names in os.walk("plugins"):
        for name in names:
            if name.endswith(".py"):
                yield os.path.join(root, name)


def main():
    texts = dict((path, open(path).read()) for path in files())
    missing = []
    for old, new in REWRITES + PREFLIGHT:
        # Done where the new text is there (a new text may hold the old one: an inserted line).
        hits = [path for path, text in texts.items() if old in text and not (new and new in text)]
        if not hits:
            if not any(new in text if new else old not in text for text in texts.values()):
                missing.append(old)
            continue
        for path in hits:
            texts[path] = texts[path].replace(old, new)
    for path, text in texts.items():
        if "names_mod." in text and IMP not in text:
            text = _add_import(text, IMP)
        if "=PLAIN" in text and IMP_PLAIN not in text and "class Names" not in text:
            text = _add_import(text, IMP_PLAIN)
        if "sglang_prefetch.py" in path and "names.of(" in text and "Names.of_module(module)" not in text:
            text = text.replace("    p = module.params\n", "    p = module.params\n    names = Names.of_module(module)\n", 1)
            text = _add_import(text, "from ansible_collections.gpufleet.sglang.plugins.module_utils.common.names import Names\n")
        texts[path] = text
    if "--check" in sys.argv:
        changed = [p for p, t in texts.items() if open(p).read() != t]
        print("would change: %s" % ", ".join(sorted(changed)) if changed else "nothing to change")
    else:
        for path, text in texts.items():
            if open(path).read() != text:
                with open(path, "w") as handle:
                    handle.write(text)
    for old in missing:
        print("NOT FOUND (edit by hand): %r" % old[:160])
    return 1 if missing else 0


def _add_import(text, line):
    """After the last ``from ansible_collections`` / ``import`` line of the module's header."""
    lines = text.splitlines(True)
    last = None
    for i, item in enumerate(lines):
        if item.startswith(("from ansible_collections.", "from ansible.", "import ")):
            last = i
        elif item.startswith(("def ", "class ")):
            break
    if last is None:
        for i, item in enumerate(lines):
            if item.startswith("from __future__"):
                last = i
    lines.insert(last + 1, line)
    return "".join(lines)


if __name__ == "__main__":
    sys.exit(main())
