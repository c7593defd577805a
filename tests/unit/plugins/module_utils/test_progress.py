"""Tests for module_utils/redeploy/progress.py: the server log's last line (masked, cut, progress bars), the async
job's state as async_status reads it, the wait that ends with the job, the node read (journal step and its age,
GPU holders) and the progress line."""
from __future__ import annotations

import json

from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import journal as journal_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import progress

KEY = "sk-progress-" + "7" * 20


def test_last_log_line_is_the_last_non_empty_line_masked(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("[TP0] Load weight begin. avail mem=139.88 GB\n[TP0] Load weight end. --api-key %s used\n\n\n" % KEY)
    line = progress.last_log_line(str(log), secrets=[KEY])
    assert line.startswith("[TP0] Load weight end.") and KEY not in line, line


def test_last_log_line_masks_secret_patterns_without_the_literal(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("server_args=ServerArgs(model_path='/m', api_key='%s', port=30000)\n" % KEY)
    line = progress.last_log_line(str(log))
    assert KEY not in line and "model_path='/m'" in line, line


def test_a_progress_bar_shows_its_last_update_and_a_long_line_is_cut(tmp_path):
    log = tmp_path / "server.log"
    log.write_bytes(b"Capture cuda graph bs [1, 2]:  10%|#\rCapture cuda graph bs [1, 2]:  60%|######\r")
    assert progress.last_log_line(str(log)) == "Capture cuda graph bs [1, 2]:  60%|######"
    log.write_text("x" * 5000 + "\n")
    line = progress.last_log_line(str(log))
    assert len(line) == progress.LINE_MAX and line.endswith("...")


def test_only_the_tail_is_read_and_a_missing_log_is_none(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("first\n" + "y" * (progress.TAIL_BYTES * 2) + "\nlast line\n")
    assert progress.last_log_line(str(log)) == "last line"
    assert progress.last_log_line(str(tmp_path / "none.log")) is None
    assert progress.last_log_line(None) is None
    (tmp_path / "empty.log").write_text("\n\n")
    assert progress.last_log_line(str(tmp_path / "empty.log")) is None


def test_job_state_reads_the_job_file_as_async_status_does(tmp_path):
    assert progress.job_state(str(tmp_path), "j1.1") == "missing"
    job = tmp_path / "j1.1"
    job.write_text(json.dumps({"started": True, "finished": False, "ansible_job_id": "j1.1"}))
    assert progress.job_state(str(tmp_path), "j1.1") == "running"
    job.write_text('{"started": tr')           # half written
    assert progress.job_state(str(tmp_path), "j1.1") == "running"
    job.write_text(json.dumps({"changed": True, "failed": False, "steps": []}))
    assert progress.job_state(str(tmp_path), "j1.1") == "finished"
    job.write_text(json.dumps({"msg": "Timeout exceeded", "failed": True, "child_pid": 4}))
    assert progress.job_state(str(tmp_path), "j1.1") == "finished"


def test_wait_job_returns_when_the_job_ends_not_at_the_deadline(tmp_path):
    job = tmp_path / "j2.2"
    job.write_text(json.dumps({"started": True, "finished": False}))
    now = [0.0]
    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        now[0] += seconds
        if now[0] >= 1.0:
            job.write_text(json.dumps({"changed": False}))

    assert progress.wait_job(str(tmp_path), "j2.2", 15, sleep=sleep, clock=lambda: now[0]) == "finished"
    assert now[0] < 1.5 and all(s <= progress.POLL_S for s in sleeps), (now, sleeps)

    job.write_text(json.dumps({"started": True, "finished": False}))
    now[0] = 0.0
    assert progress.wait_job(str(tmp_path), "j2.2", 0.5, sleep=lambda s: now.__setitem__(0, now[0] + s),
                             clock=lambda: now[0]) == "running"
    assert abs(now[0] - 0.5) < 1e-9


def test_read_gives_the_journal_step_its_age_and_the_masked_detail(tmp_path):
    path = journal_mod.path_for(str(tmp_path))
    journal_mod.record(path, "R1", journal_mod.LAUNCHING, now=1000.0, detail="candidate PID 7 started with %s" % KEY)
    node = progress.read(path, None, gpus=(), secrets=[KEY], now=1042.5)
    assert node["step"] == "launching" and node["run_id"] == "R1" and node["step_s"] == 42.5, node
    assert KEY not in node["detail"] and node["detail"].startswith("candidate PID 7 started"), node
    assert node["gpu_holders"] == [] and node["log"] is None


def test_read_without_a_journal_and_with_a_corrupt_one(tmp_path):
    assert progress.read(None)["step"] is None
    bad = tmp_path / "journal.json"
    bad.write_text("{not json")
    node = progress.read(str(bad))
    assert node["step"] is None and "not valid JSON" in node["detail"], node


def test_gpu_holders_are_read_from_proc_by_device_file(tmp_path, monkeypatch):
    class Info(object):
        comm = "sglang::schedul"

    monkeypatch.setattr(progress.procfs, "process_table", lambda with_cgroup=False: {11: Info(), 12: Info()})
    monkeypatch.setattr(progress.observe, "gpu_users", lambda table, gpus, patterns: {12: ["1"], 11: ["0"]})
    assert progress.gpu_holders(["0", "1"]) == [{"pid": 11, "name": "sglang::schedul", "gpus": ["0"]},
                                                {"pid": 12, "name": "sglang::schedul", "gpus": ["1"]}]
    assert progress.gpu_holders([]) == []


def test_the_line_names_host_time_step_budget_holders_and_log():
    node = {"step": "launching", "step_s": 62.4, "detail": "candidate PID 4321 started, waiting for /health",
            "log": "[TP0] Load weight end. type=DeepseekV3ForCausalLM", "gpu_holders": [
                {"pid": 4330, "name": "sglang::schedul", "gpus": ["0"]}, {"pid": 4331, "name": "sglang::schedul", "gpus": ["1"]}]}
    line = progress.line("gpu-01", "replacing the server (phase all)", 95.7, node, {"launching": 1800}, ["0", "1"])
    assert line == ("gpu-01: replacing the server (phase all) 95 s; step launching for 62 s of 1800 s (candidate PID 4321 "
                    "started, waiting for /health); GPUs held: PID 4330 (sglang::schedul) on GPU 0, PID 4331 "
                    "(sglang::schedul) on GPU 1; log: [TP0] Load weight end. type=DeepseekV3ForCausalLM")


def test_the_line_says_free_gpus_and_leaves_out_what_is_unknown():
    line = progress.line("n", "replacing the server (phase all)", 3, {"step": "teardown", "step_s": 2}, {}, ["0", "1"])
    assert line == "n: replacing the server (phase all) 3 s; step teardown for 2 s; GPU 0,1 free"
    assert progress.line("n", "x", 1, {}, None, []) == "n: x 1 s"
    many = [{"pid": p, "name": "p", "gpus": ["0"]} for p in range(6)]
    assert progress.line("n", "x", 1, {"gpu_holders": many}, {}, ["0"]).endswith("PID 3 (p) on GPU 0 and 2 more")
