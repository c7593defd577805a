"""Print what molecule's verify steps check on a container host, as one JSON.

Run with ansible.builtin.script and executable: python3 (one round trip
instead of one per check):
    python3 node_facts.py [MODULE...]     MODULE: Python modules to try importing
Keys: pid1, system_state, failed_units, gpus (nvidia-smi --query-gpu rows),
apps (--query-compute-apps rows), smi_rc/smi_error, imports {module: "ok"|error}.
"""
import importlib
import json
import subprocess
import sys


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


facts = {}
with open("/proc/1/comm", encoding="utf-8") as f:
    facts["pid1"] = f.read().strip()
facts["system_state"] = run(["systemctl", "is-system-running"])[1].strip()
facts["failed_units"] = [line.split()[0] for line in run(
    ["systemctl", "list-units", "--state=failed", "--plain", "--no-legend"])[1].splitlines() if line.strip()]

gpu_keys = ["index", "name", "pci.bus_id", "memory.used", "memory.total"]
rc, out, err = run(["nvidia-smi", "--query-gpu=" + ",".join(gpu_keys), "--format=csv,noheader,nounits"])
facts["smi_rc"] = rc
facts["smi_error"] = (err or (out if rc else "")).strip()
facts["gpus"] = csv_rows(out, gpu_keys) if rc == 0 else []
app_keys = ["pid", "process_name", "gpu_bus_id", "used_memory"]
rc, out, err = run(["nvidia-smi", "--query-compute-apps=" + ",".join(app_keys), "--format=csv,noheader,nounits"])
facts["apps"] = csv_rows(out, app_keys) if rc == 0 else []

facts["imports"] = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
        facts["imports"][name] = "ok"
    except Exception as exc:  # pylint: disable=broad-except  # report any import failure
        facts["imports"][name] = "%s: %s" % (type(exc).__name__, exc)

print(json.dumps(facts, sort_keys=True))
