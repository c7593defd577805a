"""Part 4 of the real-server stage (issue 22): ``playbooks/redeploy.yml`` end to end against REAL SGLang 0.5.23
servers on this CPU, holding the GPUs of a simulated node (the hook of tests/real_server/hooks registers the real
scheduler's memory with gpusim, so the collection's GPU census, drain and proof see it).

One node for the module, in file order, like an operator's day: an engineer's hand-started real server is adopted
and replaced by a config change; a weight-only update swaps the weights in place and one of other shapes is
refused with nothing touched; a candidate that crashes at init (a broken shard) is rolled back to the known-good;
``--check --diff`` plans against the real running server. The role launches the real server itself:
``sglang_server_python`` is the real venv's interpreter (the preflight's resolution asks that same SGLang).

Every assertion reads the real server's own answers (``/server_info``, ``/model_info``, ``/metrics``) and
``/proc``, besides the runner events and the report. An unrelated Python process (the decoy) survives every test.
Every process started is killed by PID at the end (``playbook_helpers.Procs``: PIDs, start times, the PID file,
and the sessions they lead).
"""
from __future__ import annotations

import json
import pathlib
import shutil
import sys

import pytest

import servers

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "integration"))
from playbook_helpers import Procs, SimNode, alive, cmdline, http_get, session_members, starttime, wait_for  # noqa: E402

PREFLIGHT = "Plan the redeploy (inspect the node, resolve the args as its SGLang will, take the lease)"
REPLACE = "Replace the server in one module run, candidate all"
PROMOTE = "Promote the verified config to known-good and release the lease (the smoke gate first, when given)"

# The real server on a CPU: no py-spy dump and no 60 s wait for CUDA core dumps when a child dies (docs/real-server.md).
CRASH_ENV = {"SGLANG_PYSPY_DUMP_BEFORE_CRASH": "0", "SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "0"}


class RealNode(SimNode):
    """A simulated node whose server is the real SGLang 0.5.23 (tp 1, no speculation, the tiny models)."""

    def __init__(self, base, procs, models, real_python):
        self.real_models = models
        self.real_python = str(real_python)
        super().__init__(base, procs, gpus=2, tp_size=1, name="real")
        self.calls = self.logs / "standin-calls.jsonl"

    def server_args(self, **overrides):
        # attention_backend: what the real server picks on a CPU. Left unset, the preflight resolves it for the node's
        # (simulated) H200 as SGLang would there, fa3, and pins it; the real server on this CPU then refuses fa3.
        args = {"model_path": self.real_models.path("base"), "tp_size": 1, "port": self.port, "max_total_tokens": 8192,
                "enable_metrics": True, "attention_backend": "torch_native"}
        args.update(overrides)
        return {k: v for k, v in args.items() if v is not None}

    def server_env(self):
        env = dict(servers.REAL_ENV, GPUFLEET_STANDIN_CALLS=str(self.calls), **CRASH_ENV)
        return env

    def host_vars(self, server_env=None, **overrides):
        hv = super().host_vars(**overrides)
        env = self.server_env()
        env.update(server_env or {})
        hv.update(sglang_server_python=self.real_python, sglang_server_env=env, sglang_server_health_timeout=240,
                  sglang_smoke_min_accept_length=0, sglang_smoke_requests=4, sglang_smoke_max_new_tokens=16,
                  sglang_server_on_override="warn")
        hv.update(overrides)
        return hv

    def start_real_by_hand(self, args):
        """An engineer's server: the real venv's ``python -m sglang.launch_server`` in its own session, not recorded
        anywhere the collection looks; returns its PID once it logged that it is ready."""
        env = dict(self.env)
        env.pop("PYTHONPATH", None)            # the simulator's fake sglang package must not shadow the real one
        env.update(self.server_env())
        log = self.logs / "by-hand.log"
        proc = self.procs.spawn([self.real_python, "-m", "sglang.launch_server"] + self._flags(args), env=env, log=log)
        wait_for(lambda: servers.READY_LINE in log.read_text(errors="replace") or proc.poll() is not None, 240, 0.2,
                 "the hand-started real server")
        assert proc.poll() is None, log.read_text(errors="replace")[-4000:]
        return proc.pid

    @staticmethod
    def _flags(args):
        out = []
        for key, value in args.items():
            flag = "--" + key.replace("_", "-")
            out += [flag] if value is True else [flag, str(value)]
        return out

    def get(self, path, api_key=None):
        status, body = http_get(self.url + path, api_key=api_key or self.api_key, timeout=30)
        assert status == 200, (path, status, body)
        return body

    def scheduler_pids(self, pid):
        return sorted(p for p in session_members(pid) if (cmdline(p) or [""])[0].startswith("sglang::scheduler"))

    def gpu_holders(self):
        return sorted(h.get("pid") for h in self.holds())


@pytest.fixture(scope="module")
def procs():
    tracker = Procs()
    yield tracker
    left = tracker.cleanup()
    assert not left, "processes survived SIGKILL: %s" % left


@pytest.fixture(scope="module")
def node(tmp_path_factory, procs, models, real_python):
    n = RealNode(tmp_path_factory.mktemp("real-redeploy"), procs, models, real_python)
    n.decoy = n.start_decoy()
    n.decoy_start = starttime(n.decoy)
    yield n
    calls = [json.loads(line) for line in n.calls.read_text().splitlines()] if n.calls.exists() else []
    assert not calls, "a CUDA stand-in was called on the serving path: %s" % calls


@pytest.fixture(autouse=True)
def decoy_survives(node):
    yield
    assert alive(node.decoy, node.decoy_start), "the unrelated process %d (python3 -c sleep) was killed" % node.decoy


def metric_values(node, name):
    """The values of metric ``name`` on the real server's own ``/metrics`` page (Prometheus text)."""
    page = node.get("/metrics")
    assert isinstance(page, str) and "sglang:" in page, page
    return [float(line.rsplit(" ", 1)[1]) for line in page.splitlines()
            if line.startswith(name + "{") or line.startswith(name + " ")]


def ensure_deployed(node):
    """A managed real server (when a test runs alone: a forced redeploy of the base checkpoint first)."""
    pid = node.server_pid()
    if not (pid and alive(pid) and node.health() == 200):
        run = node.run(host_vars=with_model(node, node.real_models.path("base")), extravars={"sglang_redeploy_force": True})
        assert run.rc == 0 and run.row()["status"] == "deployed", run.summary()
    return real_running(node)


def real_running(node):
    """The PID of the real managed server that serves on the node's port (its own /server_info says so)."""
    pid = node.server_pid()
    assert pid and alive(pid), "no managed server (pid file %s)" % node.pid_file
    assert cmdline(pid)[0] == node.real_python and cmdline(pid)[1:3] == ["-m", "sglang.launch_server"], cmdline(pid)
    info = node.get("/server_info")
    assert info["version"] == "0.5.23" and info["port"] == node.port, {k: info.get(k) for k in ("version", "port")}
    return pid


# --------------------------------------------------------------------------
# 1. An engineer's hand-started real server is adopted and replaced
# --------------------------------------------------------------------------

def test_a_hand_started_real_server_is_adopted_and_a_config_change_redeployed(node):
    old_pid = node.start_real_by_hand(node.server_args())
    old_tree = session_members(old_pid)
    old_sched = node.scheduler_pids(old_pid)
    assert len(old_sched) == 1 and node.gpu_holders() == old_sched          # the real scheduler holds GPU 0
    assert http_get(node.url + "/server_info")[0] == 200                     # started by hand: no API key
    assert node.get("/server_info")["max_total_num_tokens"] == 8192

    hv = node.host_vars(sglang_server_args=node.server_args(max_total_tokens=6144))
    run = node.run(host_vars=hv)
    pre = run.task_result(PREFLIGHT)
    assert run.rc == 0 and run.status == "successful", (run.summary()[:3000], pre["plan"].get("argv"))
    assert pre["plan"]["action"] == "restart" and pre["plan"]["running"]["source"].startswith("adopted"), pre["plan"]
    assert old_pid in pre["plan"]["teardown_pids"] and node.decoy not in pre["plan"]["teardown_pids"]

    # The drain signalled the hand-started real server (SIGTERM first) and its tree, nothing else; all gone.
    # (the result's own list: at verbosity 0 the drain's copy of it is left out)
    signalled = run.task_result(REPLACE)["signalled"]
    roots = [p for p in signalled if p["role"] == "root"]
    assert [p["pid"] for p in roots] == [old_pid] and roots[0]["signals"][0] == "SIGTERM", signalled
    assert set(p["pid"] for p in signalled) <= set(old_tree), (signalled, old_tree)
    assert not any(alive(p) for p in old_tree)

    # The role launched the real server (the real venv's python), and the server itself runs the change.
    new_pid = real_running(node)
    assert new_pid != old_pid and run.task_result(REPLACE)["launch"]["pid"] == new_pid
    info = node.get("/server_info")
    assert info["max_total_num_tokens"] == 6144 and info["enable_metrics"] is True and info["tp_size"] == 1, info
    assert http_get(node.url + "/server_info")[0] == 401                     # the managed server has the API key ...
    for pid in session_members(new_pid):                                     # ... on no command line
        assert node.api_key not in "\0".join(cmdline(pid))
    assert node.gpu_holders() == node.scheduler_pids(new_pid)               # the new real scheduler holds GPU 0

    # The smoke gate ran against the real server before the promotion, and read its real /metrics: the page
    # carries the speculative gauges (so the gate saw them), at 0 without speculation (so no report in the window,
    # and no accept length); the server counted the gate's generated tokens.
    smoke = run.task_result(PROMOTE)["smoke"]
    assert smoke["requests"] == {"sent": 4, "ok": 4, "failed": 0} and smoke["hang"] is None, smoke
    assert smoke["tokens_per_s"] > 0 and smoke["completion_tokens"] > 0, smoke
    gauges = metric_values(node, "sglang:spec_accept_length")
    assert gauges and all(v == 0 for v in gauges), gauges
    assert smoke["metrics_available"] is True and smoke["metrics_reports"] == 0, smoke
    assert smoke["accept_length"] is None and smoke["accept_length_source"] is None, smoke
    assert sum(metric_values(node, "sglang:generation_tokens_total")) >= smoke["completion_tokens"]
    row = run.row()
    assert row["status"] == "deployed" and row["plan"] == "restart" and row["rollback"]["status"] == "not_needed", row
    assert node.leaks() == []
    node.deployed_pid = new_pid


# --------------------------------------------------------------------------
# 2. Weights: same shapes in place; other shapes refused with nothing touched
# --------------------------------------------------------------------------

def with_model(node, path, max_total_tokens=6144, **extra):
    return node.host_vars(sglang_server_args=node.server_args(max_total_tokens=max_total_tokens, model_path=str(path)),
                          **extra)


def test_a_weight_only_update_swaps_in_place_and_other_shapes_are_refused(node):
    pid = ensure_deployed(node)
    tree = session_members(pid)
    reseeded = node.real_models.path("reseeded")
    run = node.run(host_vars=with_model(node, reseeded))
    row = run.row()
    assert run.rc == 0 and row["status"] == "deployed" and row["mode"] == "weights", run.summary()
    assert row["signalled"] == []
    # The same real process tree serves, and says it serves the new checkpoint.
    assert node.server_pid() == pid and session_members(pid) == tree and all(alive(p) for p in tree)
    info = node.get("/model_info")
    assert info["model_path"] == reseeded and info["weight_version"] == row["run_id"], info
    assert node.get("/server_info")["model_path"] == node.real_models.path("base")     # the launch value stays
    assert row["weights"]["checksums_before"] != row["weights"]["checksums_after"]

    # Other shapes (hidden 96): asked to update in place, the preflight refuses before anything is touched
    # (the real server would die of such an update).
    wide = node.real_models.path("wide")
    before = node.get("/model_info")
    forced = node.run(host_vars=with_model(node, wide, sglang_redeploy_mode="weights"))
    frow = forced.row()
    assert forced.rc != 0 and frow["step"] == "preflight" and "sglang_redeploy_mode" in frow["error"], frow
    assert "lm_head.weight: BF16 [1024, 64] running, BF16 [1024, 96] in the new checkpoint" in frow["error"], frow
    assert not forced.ran(REPLACE) and frow["signalled"] == []
    assert node.server_pid() == pid and session_members(pid) == tree
    assert node.get("/model_info") == before


def test_a_smoke_failure_after_a_real_weight_update_rolls_the_weights_back_in_place(node):
    pid = ensure_deployed(node)
    tree = session_members(pid)
    serving = node.get("/model_info")["model_path"]
    other = node.real_models.path("base" if serving != node.real_models.path("base") else "reseeded")
    run = node.run(host_vars=with_model(node, other, sglang_smoke_min_tokens_per_s=1e9))     # a gate no server passes
    row = run.row()
    assert run.rc != 0 and row["status"] == "rolled_back" and row["step"] == "smoke" and row["mode"] == "weights", row
    assert "min_tokens_per_s" in row["error"] and row["signalled"] == [], row
    # The gate measured the real server serving the new weights; then the same process was updated back.
    assert row["weights"]["version_after"] == row["run_id"], row["weights"]
    assert node.server_pid() == pid and session_members(pid) == tree
    info = node.get("/model_info")
    assert info["model_path"] == serving and info["weight_version"] != row["run_id"], info
    assert node.journal()["step"] == "rolled_back"
    assert row["rollback"]["status"] == "succeeded" and row["rollback"]["detail"].startswith(
        "known-good PID %d healthy; effective config matches the prediction" % pid), row["rollback"]


# --------------------------------------------------------------------------
# 3. A candidate that crashes at init is rolled back to the known-good
# --------------------------------------------------------------------------

def broken_shard(node):
    """The base checkpoint's config and tokenizer with the weights of ``wide`` (the same tensor names, other shapes): a
    complete, well-formed checkpoint, so the preflight's checkpoint check (index, headers, sizes, tokenizer files)
    passes it, but its tensors do not fit the model the config describes. The real scheduler fails while it loads
    the weights, after the old server is gone. (A shard cut short is refused by the preflight, before the teardown.)"""
    src = pathlib.Path(node.real_models.path("base"))
    dst = node.models / "base-wide-weights"
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    shutil.copyfile(pathlib.Path(node.real_models.path("wide")) / "model.safetensors", dst / "model.safetensors")
    return dst


def test_a_candidate_that_crashes_at_init_is_rolled_back_to_the_known_good(node):
    old_pid = ensure_deployed(node)
    known_good = json.loads((node.etc / "known-good" / "server.json").read_text())["args"]
    broken = broken_shard(node)
    run = node.run(host_vars=with_model(node, broken, sglang_redeploy_mode="restart"))
    assert run.rc != 0, run.summary()
    replaced = run.task_result(REPLACE)
    assert replaced["failed"] is True and replaced["failed_step"] == "launch", replaced
    assert replaced["rollback"]["status"] == "succeeded", replaced["rollback"]
    row = run.row()
    assert row["status"] == "rolled_back" and row["step"] == "launch", row
    assert old_pid in [p["pid"] for p in row["signalled"]] and not alive(old_pid)
    # The real candidate died at init (its own log says how: the part of the log from its start line on), and the
    # known-good runs again in a new real process, with the API key in force.
    log = (node.logs / "server.log").read_text(errors="replace")
    starts = log.split("=== gpufleet.sglang: starting ")
    candidate = [part for part in starts if part.split("\n", 1)[0].find("--model-path %s " % broken) >= 0]
    assert len(candidate) == 1, [part.split("\n", 1)[0] for part in starts]
    assert "Traceback (most recent call last)" in candidate[0] and "Scheduler hit an exception" in candidate[0], \
        candidate[0][-3000:]
    new_pid = real_running(node)
    assert new_pid == replaced["rollback_launch"]["pid"] and new_pid != old_pid
    assert node.get("/model_info")["model_path"] == known_good["model_path"]
    assert node.get("/server_info")["max_total_num_tokens"] == 6144
    assert node.gpu_holders() == node.scheduler_pids(new_pid)
    assert http_get(node.url + "/server_info")[0] == 401
    assert node.journal()["step"] == "rolled_back"


# --------------------------------------------------------------------------
# 4. --check --diff against the real running server
# --------------------------------------------------------------------------

def test_check_diff_plans_against_the_real_running_server(node):
    pid = ensure_deployed(node)
    tree = session_members(pid)
    info = node.get("/server_info")
    watched = {d: node.files_under(d) for d in (node.etc, node.state, node.lock_dir)}
    serving = node.get("/model_info")["model_path"]                   # the known-good's checkpoint (test 2)
    check = node.run(host_vars=with_model(node, serving, max_total_tokens=4096), check=True)
    assert check.rc == 0, check.summary()
    pre = check.task_result(PREFLIGHT)
    assert pre["changed"] is True and pre["plan"]["action"] == "restart" and not check.ran(REPLACE)
    assert pid in pre["plan"]["teardown_pids"]
    out = check.stdout()
    assert "--- before: SGLang server %s: command line (running PID %d, identity " % (node.name, pid) in out, out
    changed = [line for line in out.splitlines() if line.startswith(("-", "+")) and not line.startswith(("---", "+++"))]
    # The "before" side is what the real server runs: its /server_info says 6144 tokens.
    assert info["max_total_num_tokens"] == 6144 and sorted(changed) == sorted(
        ["-    --max-total-tokens 6144", "+    --max-total-tokens 4096"]), changed
    assert node.api_key not in check.everything()
    # Nothing touched: the same real tree, the same answers, the same files.
    assert node.server_pid() == pid and session_members(pid) == tree
    assert node.get("/server_info")["max_total_num_tokens"] == info["max_total_num_tokens"]
    assert {d: node.files_under(d) for d in watched} == watched
    for r in node.runs_done:  # the cost of each run (pytest -s shows it)
        print("%-34s rc=%s wall %6.1f s  cpu %5.1f s" % (r.artifacts.parent.name, r.rc, r.wall, r.cpu))
