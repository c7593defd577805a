"""Conformance, part 2: how a server starts, fails and ends. Each test starts its own server of each kind
(the simulated one and the real SGLang 0.5.23) on a node of its own and checks the same behaviour on both:
signals, crashes, port conflicts, bad values that SGLang's resolution accepts, an update that kills it."""
from __future__ import annotations

import os
import re
import signal
import socket
import urllib.error

import pytest

import servers

KINDS = servers.KINDS


def _kids(srv):
    return dict((servers.sh.cmdline(pid)[0], pid) for pid in servers.sh.children(srv.pid))


def _gone(pids):
    return not any(servers.alive(p) for p in pids)


@pytest.mark.parametrize("kind", KINDS)
def test_sigkill_of_the_main_process_takes_every_child_and_frees_the_gpu(fleet, kind):
    srv = fleet.start(kind)
    tree = srv.tree()
    assert len(tree) == 3
    srv.signal(signal.SIGKILL)
    assert srv.wait(timeout=10) == -signal.SIGKILL
    servers.sh.wait_for(lambda: _gone(tree), timeout=10, what="the children to die with the main process")
    servers.sh.wait_for(lambda: fleet.node.compute_apps() == [], timeout=10, what="the GPU to be free")


@pytest.mark.parametrize("kind", KINDS)
def test_a_killed_scheduler_brings_the_server_down_after_the_5_s_diagnostics_sleep(fleet, kind):
    srv = fleet.start(kind)
    tree = srv.tree()
    os.kill(_kids(srv)["sglang::scheduler"], signal.SIGKILL)
    servers.sh.wait_for(lambda: "Sleeping 5 seconds before crash diagnostics to let GPU activity settle." in srv.log(),
                        timeout=20, what="the crash-diagnostics line")
    rc = srv.wait(timeout=30)
    assert rc == -signal.SIGKILL, (rc, srv.log()[-3000:])
    assert "No live scheduler processes found; skipping py-spy and CUDA coredump." in srv.log()
    servers.sh.wait_for(lambda: _gone(tree), timeout=10, what="the tree to be gone")
    servers.sh.wait_for(lambda: fleet.node.compute_apps() == [], timeout=10, what="the GPU to be free")


@pytest.mark.parametrize("kind", KINDS)
def test_a_killed_detokenizer_leaves_the_scheduler_holding_the_gpu_during_the_coredump_wait(fleet, kind):
    # SGLANG_CUDA_COREDUMP_BEFORE_CRASH_WAIT_SECS (real SGLang, default 60) shortens the wait for the test.
    srv = fleet.start(kind, env={"SGLANG_CUDA_COREDUMP_BEFORE_CRASH_WAIT_SECS": "8"})
    tree = srv.tree()
    kids = _kids(srv)
    os.kill(kids["sglang::detokenizer"], signal.SIGKILL)
    servers.sh.wait_for(lambda: "Waiting 8.0 seconds for CUDA coredumps before exiting." in srv.log(), timeout=30,
                        what="the coredump wait line")
    # Meanwhile: the scheduler lives and keeps its GPU memory, the port listens, nothing answers.
    assert servers.alive(kids["sglang::scheduler"]) and srv.poll() is None
    assert [a["pid"] for a in fleet.node.compute_apps()] == [kids["sglang::scheduler"]]
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5):
        pass
    with pytest.raises((urllib.error.URLError, socket.timeout, TimeoutError, ConnectionError)):
        srv.request("/health", timeout=2)
    rc = srv.wait(timeout=60)
    assert rc == -signal.SIGKILL, rc
    servers.sh.wait_for(lambda: _gone(tree), timeout=10, what="the tree to be gone")
    servers.sh.wait_for(lambda: fleet.node.compute_apps() == [], timeout=10, what="the GPU to be free")


@pytest.mark.parametrize("kind", KINDS)
def test_sigterm_before_the_handler_is_installed_kills_by_the_signal(fleet, kind):
    srv = fleet.start(kind, args=["--skip-server-warmup"], wait=False)
    srv.wait_listening(timeout=180)
    servers.sh.wait_for(lambda: srv.status("/model_info", timeout=5) == 200, timeout=60, what="/model_info 200")
    tree = srv.tree()
    srv.signal(signal.SIGTERM)
    assert srv.wait(timeout=30) == -signal.SIGTERM
    servers.sh.wait_for(lambda: _gone(tree), timeout=10, what="the children to follow")


@pytest.mark.parametrize("kind", KINDS)
def test_the_loser_of_a_port_conflict_starts_warms_up_against_the_incumbent_and_exits_3(fleet, kind):
    incumbent = fleet.start("sim")
    generates = incumbent.log().count('"POST /generate HTTP/1.1" 200')
    # The loser on the other GPU, the same port.
    loser = fleet.start(kind, port=incumbent.port, env={"CUDA_VISIBLE_DEVICES": "1"}, wait=False)
    rc = loser.wait(timeout=180)
    text = loser.log()
    assert rc == 3, (rc, text[-3000:])
    # uvicorn's bind comes after the whole startup; the warmup thread, started before it, reaches the incumbent.
    lines = [line.split("] ", 1)[-1] for line in text.splitlines()]
    bind = "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', %d): address already in use" \
        % incumbent.port
    assert bind in lines, text[-3000:]
    assert lines.index("INFO:     Application startup complete.") < lines.index(bind) < \
        lines.index("The server is fired up and ready to roll!") < lines.index("INFO:     Application shutdown complete.")
    assert incumbent.log().count('"POST /generate HTTP/1.1" 200') == generates + 1
    assert incumbent.status("/model_info") == 200 and incumbent.poll() is None
    servers.sh.wait_for(lambda: [a["pid"] for a in fleet.node.compute_apps()] == [_kids(incumbent)["sglang::scheduler"]],
                        timeout=10, what="only the incumbent on the GPUs")


@pytest.mark.parametrize("kind", KINDS)
def test_tp_size_0_fails_with_an_index_error_before_any_child(fleet, kind):
    srv = fleet.start(kind, args=["--tp-size", "0"], wait=False)
    assert srv.wait(timeout=120) == 1
    assert "IndexError" in srv.log()
    assert fleet.node.compute_apps() == [] and "sglang::scheduler" not in srv.log()


# With speculation the KV pool's init runs sgl_kernel's CPU copy kernel (no CPU build of sgl_kernel exists): on this
# machine the stand-in would stop the scheduler there, before the failure that a GPU node shows. The test lets exactly
# that call be a no-op and checks it was the only stand-in call.
KV_COPY = "sgl_kernel.copy_all_layer_kv_cache_cpu"


@pytest.mark.parametrize("kind", KINDS)
def test_eagle3_without_a_draft_model_crashes_the_scheduler_at_init(fleet, kind):
    srv = fleet.start(kind, args=["--speculative-algorithm", "EAGLE3", "--speculative-eagle-topk", "1",
                                  "--speculative-num-steps", "1", "--speculative-num-draft-tokens", "16"],
                      env={"GPUFLEET_STANDIN_NOOP": KV_COPY}, wait=False)
    rc = srv.wait(timeout=180)
    text = srv.log()
    assert rc == -signal.SIGKILL, (rc, text[-3000:])
    assert "Scheduler hit an exception" in text and "object has no attribute 'hot_token_id'" in text, text[-3000:]
    assert "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1" in text
    if kind == "real":
        assert set(c["name"] for c in servers.standin_calls(srv)) == {KV_COPY}
        os.unlink(srv.calls_path)                      # the one permitted call, checked above
    servers.sh.wait_for(lambda: fleet.node.compute_apps() == [], timeout=10, what="the GPU to be free")


@pytest.mark.parametrize("kind", KINDS)
def test_a_missing_model_path_fails_at_resolution(fleet, kind, tmp_path):
    srv = servers.launch(kind, fleet.registry, fleet.node, tmp_path / ("missing-%s.log" % kind), str(tmp_path / "nope"))
    fleet.started.append(srv)
    assert srv.wait(timeout=120) == 1
    assert re.search(r"OSError: .*%s" % re.escape(str(tmp_path / "nope")), srv.log())


@pytest.mark.parametrize("kind", KINDS)
def test_an_update_with_other_tensor_shapes_kills_the_server_without_an_answer(fleet, kind, models):
    srv = fleet.start(kind)
    tree = srv.tree()
    with pytest.raises((urllib.error.URLError, ConnectionError, socket.timeout, TimeoutError)):
        srv.request("/update_weights_from_disk", method="POST", body={"model_path": models.path("wide")}, timeout=60)
    rc = srv.wait(timeout=60)
    assert rc == -signal.SIGKILL, rc
    text = srv.log()
    assert "Scheduler hit an exception" in text and "must match the size of tensor b" in text, text[-3000:]
    servers.sh.wait_for(lambda: _gone(tree), timeout=10, what="the tree to be gone")
    servers.sh.wait_for(lambda: fleet.node.compute_apps() == [], timeout=10, what="the GPU to be free")
