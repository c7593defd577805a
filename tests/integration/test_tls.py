"""TLS (issue 27): the simulated SGLang server behind real TLS (--ssl-certfile/--ssl-keyfile, Python's ssl), with
certificates made at test time (tls_certs.py). The launch's health gate and effective-config check, the smoke gate
and the weights module speak https with certificate validation; a bad CA, an expired certificate and a wrong host
name are refused with a message that names the fix; the key's password (ssl_keyfile_password) stays a secret; smg
1.x serving TLS is reached by sglang_router_worker."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils.common import http
from launch_helpers import (  # noqa: E402,F401  # pylint: disable=unused-import
    SIM_PY, cmdlines, free_port, run_module_raw, servers, session_members, smg1_binary)
from playbook_helpers import SimNode, procs  # noqa: E402,F401  # pylint: disable=unused-import
import tls_certs  # noqa: E402

pytestmark = pytest.mark.slow

REPO = pathlib.Path(__file__).resolve().parents[2]

FAST = {"SGLANG_SIM_STARTUP_S": "0.3", "SGLANG_SIM_WARMUP_S": "0.05", "SGLANG_SIM_SHUTDOWN_S": "0.05",
        "SGLANG_SIM_DRAIN_POLL_S": "0.05"}


@pytest.fixture
def certs(tmp_path):
    return tls_certs.make(str(tmp_path / "pki"))


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "models" / "target"
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}))
    return str(path)


@pytest.fixture
def launch(sim_node, servers, model, tmp_path):
    """``launch(cert, key, **params)``: sglang_launch of a TLS server (``host`` 0.0.0.0, so the collection connects
    to 127.0.0.1)."""
    state = {"n": 0}

    def _launch(cert, key, args=None, **params):
        state["n"] += 1
        full = {
            "name": "tls%d" % state["n"],
            "args": dict({"model_path": model, "port": free_port(), "host": "0.0.0.0", "ssl_certfile": cert,
                          "ssl_keyfile": key}, **(args or {})),
            "state_dir": str(tmp_path / ("state%d" % state["n"])),
            "python": sys.executable,
            "env": dict(FAST, PYTHONPATH=str(SIM_PY), GPUSIM_ROOT=sim_node.root, CUDA_VISIBLE_DEVICES="0,1"),
            "health_timeout": 60,
            "stop_timeout": 20,
        }
        full.update(params)
        run = run_module_raw(full, tmp_path, env=sim_node.env)
        if run.get("pid"):
            servers.add(run["pid"])
        servers.add_pid_file(os.path.join(full["state_dir"], "server.pid"))
        run.port = full["args"]["port"]
        run.state_dir = full["state_dir"]
        return run

    return _launch


def _smoke(tmp_path, url, **params):
    return run_module_raw(dict({"url": url, "requests": 2, "max_new_tokens": 4, "timeout": 60}, **params), tmp_path,
                          module="gpufleet.sglang.sglang_smoke")


def test_tls_server_gates_pass_over_https_and_the_key_password_stays_secret(launch, certs, tmp_path):
    run = launch(certs["server_cert"], certs["server_key_encrypted"], tls_ca_path=certs["ca"],
                 args={"ssl_keyfile_password": tls_certs.KEY_PASSWORD})
    assert not run.failed, run
    # The health gate and the effective-config check ran over https, validated against the test CA.
    assert run["url"] == "https://127.0.0.1:%d" % run.port
    assert run["server_info_endpoint"] == "/server_info" and run["overrides"] == []
    assert run["effective"]["ssl_certfile"] == certs["server_cert"]
    # The key's password: only in the 0600 config file, never in ps, the result or the record.
    pid = run["pid"]
    for member, argv in cmdlines(session_members(pid)).items():
        assert tls_certs.KEY_PASSWORD not in "\0".join(argv), (member, argv)
    assert tls_certs.KEY_PASSWORD not in run.everything()
    assert tls_certs.KEY_PASSWORD in open(os.path.join(run.state_dir, "config.yaml")).read()
    assert tls_certs.KEY_PASSWORD not in open(os.path.join(run.state_dir, "server.state.json")).read()

    # The smoke gate over https: with the CA it passes ...
    url = run["url"]
    ok = _smoke(tmp_path, url, tls_ca_path=certs["ca"])
    assert not ok.failed, ok
    assert ok["requests"] == {"sent": 2, "ok": 2, "failed": 0}, ok
    # ... with a CA that did not sign the certificate it fails, naming the option to set (the module alone: its
    # option; the smoke role passes option_labels, and the message names sglang_smoke_tls_ca_path) ...
    bad = _smoke(tmp_path, url, tls_ca_path=certs["other_ca"])
    assert bad.failed, bad
    assert "set tls_ca_path to the CA bundle" in bad["msg"] and "sglang_" not in bad["msg"], bad["msg"]
    labelled = _smoke(tmp_path, url, tls_ca_path=certs["other_ca"], option_labels={"tls_ca_path": "sglang_smoke_tls_ca_path"})
    assert "set sglang_smoke_tls_ca_path to the CA bundle" in labelled["msg"], labelled["msg"]
    # ... and without validation it passes but says so.
    unchecked = _smoke(tmp_path, url, validate_certs=False)
    assert not unchecked.failed, unchecked
    assert any("validate_certs=false" in w for w in unchecked.get("warnings", [])), unchecked

    # sglang_weights reads /model_info over https (check mode: nothing is updated) with the CA, refuses without it.
    weights = {"url": url, "model_path": run["effective"]["model_path"]}
    checked = run_module_raw(dict(weights, tls_ca_path=certs["ca"]), tmp_path, check=True,
                             module="gpufleet.sglang.sglang_weights")
    assert not checked.failed, checked
    refused = run_module_raw(dict(weights, tls_ca_path=certs["other_ca"]), tmp_path, check=True,
                             module="gpufleet.sglang.sglang_weights")
    assert refused.failed and "tls_ca_path" in refused.everything(), refused


@pytest.mark.parametrize("case, cert, ca, words", [
    # sglang_launch used alone: the fix names its option (the roles' labels: test_redeploy_playbook_over_https).
    ("bad CA", "server", "other_ca", ["does not chain to a trusted CA", "set tls_ca_path to the CA bundle",
                                      "CA bundle that signed the server's certificate"]),
    ("expired", "expired", "ca", ["expired", "renew the certificate"]),
    ("wrong host", "wrong_host", "ca", ["not valid for 127.0.0.1", "subjectAltName IP:127.0.0.1",
                                        "set the server's host arg"]),
])
def test_refused_certificate_fails_the_health_gate_with_the_fix(launch, certs, case, cert, ca, words):
    run = launch(certs[cert + "_cert"], certs[cert + "_key"], tls_ca_path=certs[ca])
    assert run.failed, (case, run)
    assert "the health gate cannot reach the server over HTTPS" in run["msg"], run["msg"]
    for word in words:
        assert word in run["msg"], (case, word, run["msg"])
    # Refused at once, not after the health timeout, and the candidate was stopped.
    assert not run.get("pid") or not os.path.exists("/proc/%d" % run["pid"]) or \
        open("/proc/%d/stat" % run["pid"]).read().rsplit(")", 1)[1].split()[0] in ("Z", "X"), run


def test_unusable_tls_options_fail_before_anything_starts(launch, certs, tmp_path):
    missing = str(tmp_path / "no-such-ca.pem")
    run = launch(certs["server_cert"], certs["server_key"], tls_ca_path=missing)
    assert run.failed and "tls_ca_path=%s: no such file" % missing in run["msg"] and "nothing was changed" in run["msg"]
    assert not os.path.exists(os.path.join(run.state_dir, "server.pid")), run
    not_pem = launch(certs["server_cert"], certs["server_key"], tls_ca_path=certs["server_key"])
    assert not_pem.failed and "holds no PEM CA certificate" in not_pem["msg"], not_pem


# --------------------------------------------------------------------------
# Through playbooks/redeploy.yml: a TLS server config on the simulated node
# --------------------------------------------------------------------------

REPLACE = "Replace the server in one module run, candidate all"
PROMOTE = "Promote the verified config to known-good and release the lease (the smoke gate first, when given)"


def _tls_vars(node, certs, ca):
    args = node.server_args(host="0.0.0.0", ssl_certfile=certs["server_cert"], ssl_keyfile=certs["server_key_encrypted"],
                            ssl_keyfile_password=tls_certs.KEY_PASSWORD)
    return node.host_vars(sglang_server_args=args, sglang_server_tls_ca_path=certs[ca])


def test_redeploy_playbook_over_https(tmp_path, procs, certs):
    """Bad CA: the health gate refuses the certificate with the fix, the candidate is stopped, nothing stays on
    the GPUs. The CA that signed it: health gate, effective-config check and smoke gate pass over https."""
    node = SimNode(tmp_path / "node", procs)
    bad = node.run(host_vars=_tls_vars(node, certs, "other_ca"))
    assert bad.rc != 0, bad.summary()
    replaced = bad.task_result(REPLACE)
    assert replaced["failed"] is True and replaced["failed_step"] == "launch", replaced
    assert "the health gate cannot reach the server over HTTPS" in replaced["msg"], replaced["msg"]
    assert "sglang_server_tls_ca_path" in replaced["msg"] and "does not chain to a trusted CA" in replaced["msg"]
    assert node.server_tree() == [] and all(v == 1 for v in node.used().values()), node.used()

    good = node.run(host_vars=_tls_vars(node, certs, "ca"))
    assert good.rc == 0, good.summary()
    replaced = good.task_result(REPLACE)
    assert replaced["launch"]["url"] == "https://127.0.0.1:%d" % node.port, replaced["launch"]
    smoke = good.task_result(PROMOTE)["smoke"]
    assert smoke["requests"]["ok"] == smoke["requests"]["sent"] > 0, smoke
    row = good.row()
    assert row["status"] == "deployed" and row["error"] is None, row
    # The server answers over https, validated against the test CA, and not over plain http.
    url = "https://127.0.0.1:%d" % node.port
    status, _h, info = http.request("GET", url + "/server_info", api_key=node.api_key,
                                    tls=http.tls_settings({"tls_ca_path": certs["ca"]}))
    assert status == 200 and info["ssl_certfile"] == certs["server_cert"], info
    # The key's password: in no event, artifact or report, nor on a command line of the server.
    assert tls_certs.KEY_PASSWORD not in good.everything() and tls_certs.KEY_PASSWORD not in bad.everything()
    for member, argv in cmdlines(node.server_tree()).items():
        assert tls_certs.KEY_PASSWORD not in "\0".join(argv), (member, argv)


# --------------------------------------------------------------------------
# The router: smg 1.x serving TLS (--tls-cert-path/--tls-key-path), checking https workers (--ca-cert-paths)
# --------------------------------------------------------------------------

def _router_workers(url, certs):
    status, _h, data = http.request("GET", url + "/workers", tls=http.tls_settings({"tls_ca_path": certs["ca"]}))
    assert status == 200, (status, data)
    return data["workers"]


def test_router_worker_over_https_against_smg(launch, certs, servers, tmp_path):
    worker = launch(certs["server_cert"], certs["server_key"], tls_ca_path=certs["ca"], args={"host": "127.0.0.1"})
    assert not worker.failed, worker
    port = free_port()
    argv = [smg1_binary(), "launch", "--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(free_port()), "--policy", "round_robin", "--tls-cert-path", certs["server_cert"],
            "--tls-key-path", certs["server_key"], "--ca-cert-paths", certs["ca"], "--health-check-interval-secs", "30",
            "--worker-startup-timeout-secs", "30", "--worker-startup-check-interval", "1", "--log-level", "warn"]
    with open(str(tmp_path / "router.log"), "w") as fh:
        proc = subprocess.Popen(argv, env=dict(os.environ, HF_HUB_OFFLINE="1", NO_PROXY="*", no_proxy="*"),
                                stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    servers.add(proc.pid)
    router = "https://127.0.0.1:%d" % port
    end = time.monotonic() + 30
    while True:
        try:
            _router_workers(router, certs)
            break
        except http.HTTPConnectionError:
            assert time.monotonic() < end, open(str(tmp_path / "router.log")).read()[-3000:]
            time.sleep(0.2)
    params = {"router_url": router, "url": worker["url"], "timeout": 60}

    refused = run_module_raw(dict(params, tls_ca_path=certs["other_ca"]), tmp_path, module="gpufleet.sglang.sglang_router_worker")
    assert refused.failed and "tls_ca_path" in refused["msg"] and "does not chain to a trusted CA" in refused["msg"], refused
    assert _router_workers(router, certs) == []

    added = run_module_raw(dict(params, tls_ca_path=certs["ca"]), tmp_path, module="gpufleet.sglang.sglang_router_worker")
    assert not added.failed and added["changed"] is True, added
    listed = _router_workers(router, certs)
    assert [w["url"] for w in listed] == [worker["url"]] and listed[0]["is_healthy"], listed

    removed = run_module_raw(dict(params, tls_ca_path=certs["ca"], state="absent", allow_last=True), tmp_path,
                             module="gpufleet.sglang.sglang_router_worker")
    assert not removed.failed and removed["changed"] is True, removed
    assert _router_workers(router, certs) == []
