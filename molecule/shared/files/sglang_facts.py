"""Print what the redeploy scenarios verify on a container host, as one JSON.

Run with ansible.builtin.script and executable: python3 (one round trip per
host instead of one per check). What to look at comes from the environment:

  GPUFLEET_FACTS           JSON: {"units": [UNIT...],          systemctl show + is-enabled of each
                                  "files": {PATH: "stat"|"text"|"json"},  stat (+ text, + parsed JSON)
                                  "server_url": URL,            GET URL/server_info
                                  "pid_files": [PATH...],       PID read from each file
                                  "secret_scan": [DIR...],      files under DIR holding a secret
                                  "unit_env": [UNIT...]}        environment of each unit's main process
  GPUFLEET_FACTS_API_KEY   bearer token for /server_info (optional)
  GPUFLEET_FACTS_SECRETS   JSON list of secret values for secret_scan (optional)

Keys: pid1, system_state, failed_units, units {UNIT: {property: value}},
files {PATH: {exists, mode, owner, group, size, sha256[, text][, json]}} (a directory: no sha256),
processes [{pid, ppid, pgid, sid, uid, user, comm, cmdline, args (joined), cgroup}],
gpus [{index, bus_id, used_mib}] and apps [{pid, process_name,
gpu_bus_id, used_memory}] (nvidia-smi rows, strings), holds (gpusim status holds), server_info
(without secret fields) or server_info_error, pid_files {PATH: pid or null},
secret_files [{path, mode, owner, group, secrets}] (every regular file under a
secret_scan directory whose content holds one of the secrets; secrets: their
indexes in GPUFLEET_FACTS_SECRETS, never the values) and secret_processes
[{pid, secrets}] (processes whose command line holds one), unit_env {UNIT:
{pid, names, secrets}} (the variable names in /proc/<MainPID>/environ, and
the indexes of the secrets that are the value of one of them).
"""
import hashlib
import json
import os
import pwd
import grp
import re
import subprocess
import urllib.error
import urllib.request

UNIT_PROPS = ["LoadState", "ActiveState", "SubState", "Result", "MainPID", "ControlGroup", "UnitFileState",
              "FragmentPath", "NRestarts", "ExecMainStatus", "NeedDaemonReload", "User", "Group"]
SECRET_RE = re.compile(r"(^|_)(key|token|secret|password)$")  # api_key, hf_token; not ..._draft_tokens


def run(argv):
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, timeout=60, check=False)
        return proc.returncode, proc.stdout, proc.stderr
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, "", str(exc)


def csv_rows(text, keys):
    rows = []
    for line in text.splitlines():
        if line.strip():
            rows.append(dict(zip(keys, [v.strip() for v in line.split(",")])))
    return rows


def name_of(table, ident):
    try:
        return getattr(table(ident), "pw_name" if table is pwd.getpwuid else "gr_name")
    except KeyError:
        return str(ident)


def unit_facts(units):
    out = {}
    for unit in units:
        rc, text, err = run(["systemctl", "show", "--property=" + ",".join(UNIT_PROPS), unit])
        props = {}
        for line in text.splitlines():
            key, _sep, value = line.partition("=")
            props[key] = value
        if rc != 0:
            props["error"] = err.strip()
        # What `systemctl is-enabled` says (enabled, disabled, static, ...), as an operator would ask.
        props["is_enabled"] = run(["systemctl", "is-enabled", unit])[1].strip()
        out[unit] = props
    return out


def file_facts(files):
    out = {}
    for path, what in files.items():
        try:
            st = os.stat(path)
        except OSError:
            out[path] = {"exists": False}
            continue
        entry = {"exists": True, "mode": "%04o" % (st.st_mode & 0o7777), "size": st.st_size,
                 "owner": name_of(pwd.getpwuid, st.st_uid), "group": name_of(grp.getgrgid, st.st_gid)}
        if os.path.isfile(path):
            with open(path, "rb") as fh:
                data = fh.read()
            entry["sha256"] = hashlib.sha256(data).hexdigest()
            if what in ("text", "json"):
                entry["text"] = data.decode("utf-8", "replace")
            if what == "json":
                try:
                    entry["json"] = json.loads(entry["text"])
                except ValueError:
                    entry["json"] = None
        out[path] = entry
    return out


def secret_scan(roots, secrets):
    """Every regular file under ``roots`` whose bytes hold one of ``secrets`` (no symlinks followed)."""
    hits = []
    needles = [value.encode("utf-8") for value in secrets if value]
    for root in roots:
        for directory, _dirs, names in os.walk(root):
            for name in names:
                path = os.path.join(directory, name)
                try:
                    st = os.lstat(path)
                    if not os.path.isfile(path) or os.path.islink(path):
                        continue
                    with open(path, "rb") as fh:
                        data = fh.read()
                except OSError:
                    continue
                found = [i for i, needle in enumerate(needles) if needle in data]
                if found:
                    hits.append({"path": path, "mode": "%04o" % (st.st_mode & 0o7777), "secrets": found,
                                 "owner": name_of(pwd.getpwuid, st.st_uid), "group": name_of(grp.getgrgid, st.st_gid)})
    return sorted(hits, key=lambda hit: hit["path"])


def process_facts():
    procs = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            with open("/proc/%d/stat" % pid, encoding="utf-8", errors="replace") as fh:
                stat = fh.read()
            with open("/proc/%d/cmdline" % pid, "rb") as fh:
                cmdline = [a.decode("utf-8", "replace") for a in fh.read().split(b"\0") if a]
            with open("/proc/%d/cgroup" % pid, encoding="utf-8") as fh:
                cgroups = fh.read().splitlines()
            uid = os.stat("/proc/%d" % pid).st_uid
        except OSError:
            continue  # gone meanwhile
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] == "Z":
            continue  # a zombie holds nothing
        cgroup = ""
        for line in cgroups:  # cgroup v1 (name=systemd) or v2 (0::)
            parts = line.split(":", 2)
            if len(parts) == 3 and (parts[1] == "name=systemd" or (parts[0] == "0" and not cgroup)):
                cgroup = parts[2]
        procs.append({"pid": pid, "ppid": int(fields[1]), "pgid": int(fields[2]), "sid": int(fields[3]),
                      "uid": uid, "user": name_of(pwd.getpwuid, uid), "comm": comm, "cmdline": cmdline, "args": " ".join(cmdline),
                      "cgroup": cgroup})
    return sorted(procs, key=lambda p: p["pid"])


def server_info(url, api_key):
    req = urllib.request.Request(url.rstrip("/") + "/server_info")
    if api_key:
        req.add_header("Authorization", "Bearer " + api_key)
    try:
        with urllib.request.urlopen(req, timeout=20) as resp:
            info = json.loads(resp.read().decode("utf-8"))
    except (OSError, ValueError, urllib.error.URLError) as exc:
        return None, str(exc)
    # /server_info returns api_key in clear text, at the top level, in each
    # internal state and in launch_command (argv after the --config merge):
    # keep only the fields the checks need.
    keep = {}
    for key, value in info.items():
        if SECRET_RE.search(key):
            continue
        if key in ("status", "version") or key.startswith("speculative_") \
                or key in ("tp_size", "model_path", "host", "port", "max_running_requests", "page_size",
                           "disaggregation_mode"):
            keep[key] = value
    keep["avg_spec_accept_length"] = [state.get("avg_spec_accept_length") for state in info.get("internal_states") or []
                                      if isinstance(state, dict)]
    return keep, None


def main():
    spec = json.loads(os.environ.get("GPUFLEET_FACTS") or "{}")
    secrets = json.loads(os.environ.get("GPUFLEET_FACTS_SECRETS") or "[]")
    facts = {}
    with open("/proc/1/comm", encoding="utf-8") as fh:
        facts["pid1"] = fh.read().strip()
    facts["system_state"] = run(["systemctl", "is-system-running"])[1].strip()
    facts["failed_units"] = [line.split()[0] for line in run(
        ["systemctl", "list-units", "--state=failed", "--plain", "--no-legend"])[1].splitlines() if line.strip()]
    facts["units"] = unit_facts(spec.get("units", []))
    facts["files"] = file_facts(spec.get("files", {}))
    facts["processes"] = process_facts()

    rc, out, err = run(["nvidia-smi", "--query-gpu=index,pci.bus_id,memory.used", "--format=csv,noheader,nounits"])
    facts["smi_rc"] = rc
    facts["smi_error"] = (err or (out if rc else "")).strip()
    facts["gpus"] = csv_rows(out, ["index", "bus_id", "used_mib"]) if rc == 0 else []
    app_keys = ["pid", "process_name", "gpu_bus_id", "used_memory"]
    rc, out, err = run(["nvidia-smi", "--query-compute-apps=" + ",".join(app_keys), "--format=csv,noheader,nounits"])
    facts["apps"] = csv_rows(out, app_keys) if rc == 0 else []
    rc, out, err = run(["gpusim", "status"])
    try:
        facts["holds"] = json.loads(out).get("holds", []) if rc == 0 else []
    except ValueError:
        facts["holds"] = []

    if spec.get("server_url"):
        facts["server_info"], facts["server_info_error"] = server_info(
            spec["server_url"], os.environ.get("GPUFLEET_FACTS_API_KEY", ""))

    facts["unit_env"] = {}
    for unit in spec.get("unit_env", []):
        pid = int(run(["systemctl", "show", "--property=MainPID", "--value", unit])[1].strip() or 0)
        env = {}
        try:
            with open("/proc/%d/environ" % pid, "rb") as fh:
                for item in fh.read().split(b"\0"):
                    key, sep, value = item.decode("utf-8", "replace").partition("=")
                    if sep:
                        env[key] = value
        except OSError:
            pass
        facts["unit_env"][unit] = {"pid": pid, "names": sorted(env),
                                   "secrets": [i for i, value in enumerate(secrets) if value and value in env.values()]}

    facts["pid_files"] = {}
    for path in spec.get("pid_files", []):
        try:
            with open(path, encoding="utf-8") as fh:
                facts["pid_files"][path] = int(fh.read().strip())
        except (OSError, ValueError):
            facts["pid_files"][path] = None
    facts["secret_files"] = secret_scan(spec.get("secret_scan", []), secrets)
    # This script and the shell that Ansible started it with carry the secrets in their environment
    # (and that shell perhaps on its command line): leave out this process and its ancestors.
    ppid_of = {proc["pid"]: proc["ppid"] for proc in facts["processes"]}
    mine, pid = set(), os.getpid()
    while pid and pid not in mine:
        mine.add(pid)
        pid = ppid_of.get(pid, 0)
    facts["secret_processes"] = [{"pid": proc["pid"], "secrets": [i for i, value in enumerate(secrets)
                                                                  if value and value in proc["args"]]}
                                 for proc in facts["processes"]
                                 if proc["pid"] not in mine and any(value and value in proc["args"] for value in secrets)]
    print(json.dumps(facts, sort_keys=True))


main()
