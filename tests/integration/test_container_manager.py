"""The server run in a container by the collection (manager podman), through ``redeploy.yml``, against REAL podman (issue 24).

The node is simulated (8 GPUs under its GPUSIM_ROOT); the container gets its GPUs through podman's own CDI code
(``--device nvidia.com/gpu=N`` from the spec of ``sim_cdi.cdi_gpus``), runs in its own PID namespace, and its server
holds the GPUs by its host PID as NVML reports it (simulator/README.md). The image is the node image with the simulated
SGLang inside (``container_images.sglang_sim_image``), so the preflight's oracle runs in the image itself.

* A first deploy starts the container: labels, the target GPUs only, the model read-only, no secret in ``inspect``,
  argv, records or the report; the plan says the image and which SGLang resolved the args.
* A config change stops the old container through its runtime (kept, exited, as ``<name>-previous``), then launches.
* A new tag that cannot be pulled is refused in the preflight; the running container is untouched.
* A candidate that fails its health gate rolls back to the known-good IMAGE ID after the tag was re-pointed.

Each container and image this module creates is removed by its ID at the end.
"""
from __future__ import annotations

import json
import os
import resource
import signal

import pytest

from conftest import SIM_PY, wait_until
from sim_cdi import cdi_gpus  # noqa: F401  # pylint: disable=unused-import
from container_images import sglang_sim_image
from test_containers import CONF, Engine, dockerd  # noqa: F401  # pylint: disable=unused-import
import playbook_helpers as ph

REPLACE = "Replace the server in one module run, candidate all"
PREFLIGHT = "Plan the redeploy (inspect the node, resolve the args as its SGLang will, take the lease)"
SECRET_ENV = "hf_boxtoken_6d1e0a"
MEMLOCK = min(resource.getrlimit(resource.RLIMIT_MEMLOCK)[1], 64 << 20)


@pytest.fixture(scope="module")
def podman_engine():
    return Engine("podman", {"CONTAINERS_CONF": str(CONF)}, None)


@pytest.fixture(scope="module")
def image(podman_engine):
    """``{"ref", "id"}`` of the simulated-SGLang image (built once, cached by the simulator's content hash)."""
    ref = sglang_sim_image(podman_engine.env)
    return {"ref": ref, "id": podman_engine.cli("image", "inspect", "--format", "{{.Id}}", ref).stdout.strip()}


@pytest.fixture
def node(tmp_path, podman_engine, cdi_gpus):  # noqa: F811  # pylint: disable=redefined-outer-name
    """A simulated node whose server runs in podman; every container of this server removed by ID at the end."""
    procs = ph.Procs()
    sim = ph.SimNode(tmp_path / "node", procs)
    sim.box_ids = set()
    yield sim
    for name in ("sglang-%s" % sim.name, "sglang-%s-previous" % sim.name):
        proc = podman_engine.cli("container", "inspect", name, check=False)
        if proc.returncode == 0:
            sim.box_ids.add(json.loads(proc.stdout)[0]["Id"])
    for cid in sorted(sim.box_ids):
        podman_engine.cli("rm", "--force", "--time", "5", cid, check=False)
    left = procs.cleanup()
    assert not left, "processes survived SIGKILL: %s" % left


def box_vars(node, engine, image_ref, **extra):
    env = engine.over(node.host_vars()["sglang_node_environment"])
    hv = node.host_vars(
        sglang_node_environment=env, sglang_server_manager="podman", sglang_server_image=image_ref, sglang_server_python="python3",
        sglang_server_container={"volumes": ["%s:%s" % (node.root, node.root), "%s:%s:ro" % (SIM_PY, SIM_PY)],
                                 # this machine's hard limits (no CAP_SYS_RESOURCE for more; the default is the guide's
                                 # memlock=-1): a --ulimit replaces podman's default_ulimits, nofile included.
                                 "ulimits": ["memlock=%d:%d" % (MEMLOCK, MEMLOCK), "stack=67108864", "nofile=1024:1024",
                                             "nproc=4096:4096"]},
        sglang_server_cuda_visible_devices="2,5",
        server_env=dict({"HF_TOKEN": SECRET_ENV}, **extra.pop("server_env", {})))
    hv["sglang_server_env"].pop("PYTHONPATH", None)            # the image's own SGLang (the simulated one, inside)
    hv.update(extra)
    return hv


def layer_over(engine, image_id, tag=None):
    """A new image: one more (empty) layer over ``image_id``, tagged ``tag`` when given; its bare 64-hex ID."""
    work = engine.cli("create", "--pull", "never", image_id, "true").stdout.strip().splitlines()[-1]
    try:
        return engine.cli("commit", work, *([tag] if tag else [])).stdout.strip().splitlines()[-1].replace("sha256:", "")
    finally:
        engine.cli("rm", "--force", work)


def published(engine, image_id, registry, tag):
    """``(image ID, manifest digest)`` of a new image over ``image_id`` pushed to ``registry`` as gpufleet/sglang:<tag>
    and removed from the node again, so that a pull of it is a whole one (podman lists every name of an image it
    already holds with every digest)."""
    fresh = layer_over(engine, image_id)
    digest = registry.add(fresh, "gpufleet/sglang", tag)
    engine.cli("rmi", fresh)
    return fresh, digest


def running_box(engine, node):
    proc = engine.cli("container", "inspect", "sglang-%s" % node.name, check=False)
    if proc.returncode != 0:
        return None
    info = json.loads(proc.stdout)[0]
    node.box_ids.add(info["Id"])
    return info


def holders(node):
    """``{host pid: sorted GPU indices}`` as the simulated nvidia-smi reports them."""
    out = {}
    for hold in node.holds():
        pid = hold.get("display_pid") or hold.get("pid")             # the host PID, as NVML reports it
        if hold.get("state") in ("alive", "releasing") and pid:
            out.setdefault(pid, set()).update(hold.get("gpus") or [])
    return dict((pid, sorted(g)) for pid, g in out.items())


def no_secret_anywhere(node, engine, info):
    text = json.dumps(info)
    for secret in (node.api_key, SECRET_ENV):
        assert secret not in text, "a secret is in podman inspect"
        for pid in ph_tree(info["State"]["Pid"]):
            assert secret not in "\0".join(ph.cmdline(pid)), "a secret is on the command line of PID %d" % pid
    for path in list(node.etc.rglob("*.json")) + list(node.reports.glob("*")):
        body = path.read_text(errors="replace")
        if path.name not in ("secrets.json", "container-env.json"):
            assert node.api_key not in body and SECRET_ENV not in body, path
    for run in node.runs_done:
        assert SECRET_ENV not in run.everything() and node.api_key not in run.everything()


def ph_tree(pid):
    from ansible_collections.gpufleet.sglang.plugins.module_utils.node import supervise as sp
    return [p for p, _s in sp.tree(pid)] if pid else []


def test_first_deploy_then_a_config_change_run_the_server_in_podman_and_stop_the_old_container_through_it(
        node, podman_engine, image):
    engine = podman_engine
    run = node.run(host_vars=box_vars(node, engine, image["ref"]))
    assert run.rc == 0, run.summary()
    plan = run.task_result(PREFLIGHT)["plan"]
    assert plan["manager"] == "podman" and plan["image"]["id"] == image["id"] and plan["image"]["ref"] == image["ref"]
    resolved = run.task_result(PREFLIGHT)["resolved"]
    assert resolved["source"] == "node", resolved.get("fallback")           # the SGLang inside the image answered
    assert "args resolved by the SGLang %s of image %s" % (resolved["node_version"], plan["image"]["words"]) in \
        run.task_result(PREFLIGHT)["lines"][0]

    info = running_box(engine, node)
    assert info and info["State"]["Status"] == "running"
    assert info["Image"] == image["id"]
    labels = info["Config"]["Labels"]
    assert labels["io.gpufleet.sglang.server"] == node.name and labels["io.gpufleet.sglang.image"] == image["ref"]
    record = json.loads((node.etc / "known-good" / "server.json").read_text())
    assert labels["io.gpufleet.sglang.fingerprint"] == record["fingerprint"]        # the launch's (salted) identity
    pid = info["State"]["Pid"]
    # The GPUs the plan named (2 and 5), held by the container's processes under their HOST PIDs; nothing else.
    held = holders(node)
    assert held and set(g for gpus in held.values() for g in gpus) == {2, 5}, held
    tree = set(ph_tree(pid))
    assert set(held) <= tree, (held, tree)
    # The model read-only, at its path; CUDA_VISIBLE_DEVICES not passed in (the devices are the GPUs).
    mounts = dict((m["Destination"], m) for m in info["Mounts"])
    assert mounts[str(node.target)]["RW"] is False
    assert not any(e.startswith("CUDA_VISIBLE_DEVICES=") for e in info["Config"]["Env"])
    assert node.health() == 200
    assert record["image"]["id"] == image["id"] and record["manager"] == "podman"
    replaced = run.task_result(REPLACE)
    assert any("in container sglang-%s (id %s" % (node.name, info["Id"][:12]) in line for line in replaced["lines"]), replaced["lines"]
    assert image["ref"] in run.report_md
    no_secret_anywhere(node, engine, info)

    # A config change: the old container is stopped through podman (never signalled from the host) and kept.
    hv = box_vars(node, engine, image["ref"], server_env={"SGLANG_SIM_NOTE": "second"})
    run2 = node.run(host_vars=hv)
    assert run2.rc == 0, run2.summary()
    replaced = run2.task_result(REPLACE)
    assert replaced["container_stopped"]["id"] == info["Id"], replaced.get("container_stopped")
    assert all(item.get("pid") != pid for item in replaced.get("signalled") or [] if item.get("signals")), replaced["signalled"]
    old = json.loads(engine.cli("container", "inspect", info["Id"]).stdout)[0]
    assert old["Name"].lstrip("/") == "sglang-%s-previous" % node.name and old["State"]["Status"] == "exited"
    new = running_box(engine, node)
    assert new["Id"] != info["Id"] and new["State"]["Status"] == "running" and node.health() == 200
    assert "SGLANG_SIM_NOTE=second" in new["Config"]["Env"]
    no_secret_anywhere(node, engine, new)


def test_an_image_that_cannot_be_pulled_is_refused_before_anything_is_touched(node, podman_engine, image):
    engine = podman_engine
    run = node.run(host_vars=box_vars(node, engine, image["ref"]))
    assert run.rc == 0, run.summary()
    before = running_box(engine, node)
    bad = "localhost:1/gpufleet/sglang:no-such-tag"
    run2 = node.run(host_vars=box_vars(node, engine, bad))
    assert run2.rc != 0
    failed = run2.task_result(PREFLIGHT)
    assert "image" in failed["msg"] and bad in failed["msg"] and "nothing was touched" in failed["msg"], failed["msg"]
    after = running_box(engine, node)
    assert (after["Id"], after["State"]["Pid"], after["State"]["Status"]) == (before["Id"], before["State"]["Pid"], "running")
    assert node.health() == 200


def test_a_failed_candidate_rolls_back_to_the_recorded_image_id_after_the_tag_moved(node, podman_engine, image, tmp_path):
    engine = podman_engine
    tag = "localhost/gpufleet-test/moving:%d" % os.getpid()
    engine.cli("tag", image["id"], tag)
    try:
        run = node.run(host_vars=box_vars(node, engine, tag))
        assert run.rc == 0, run.summary()
        first = running_box(engine, node)
        assert first["Image"] == image["id"]
        # The tag moves to another image (one more layer), whose server crashes while loading.
        other = layer_over(engine, image["id"], tag)
        assert other != image["id"]
        hv = box_vars(node, engine, tag, server_env={"SGLANG_SIM_CRASH_ON_LOAD": "1"})
        run2 = node.run(host_vars=hv)
        assert run2.rc != 0
        replaced = run2.task_result(REPLACE)
        assert replaced["rollback"]["status"] == "succeeded", replaced.get("rollback")
        back = running_box(engine, node)
        # The failed candidate ran the re-pointed tag's image and is kept (exited) as <name>-previous, for its logs.
        failed = json.loads(engine.cli("container", "inspect", "sglang-%s-previous" % node.name).stdout)[0]
        assert failed["Image"].replace("sha256:", "") == other, (failed["Image"], other)
        assert failed["State"]["Status"] == "exited"
        assert back["State"]["Status"] == "running" and back["Image"] == image["id"], (back["Image"], image["id"])
        assert wait_until(lambda: node.health() == 200, timeout=30, interval=0.2)
        assert node.leaks() == []
    finally:
        engine.cli("rmi", "--force", tag, check=False)


@pytest.mark.parametrize("case", ["ulimit", "python"])
def test_a_container_the_runtime_refuses_is_found_in_the_preflight_and_nothing_is_touched(case, node, podman_engine, image):
    """The preflight creates the launch's container once (``--rm``, ``import os`` instead of the server): a limit above
    the host's (here the guide's memlock=-1 without CAP_SYS_RESOURCE: runc refuses it) or an interpreter the image
    does not have is refused before the teardown, with the runtime's words; the running container is untouched."""
    engine = podman_engine
    run = node.run(host_vars=box_vars(node, engine, image["ref"]))
    assert run.rc == 0, run.summary()
    before = running_box(engine, node)
    hv = box_vars(node, engine, image["ref"], server_env={"SGLANG_SIM_NOTE": "changed"})
    if case == "ulimit":
        limits = ["memlock=-1:-1", "nofile=1024:1024", "nproc=4096:4096"]
        hv["sglang_server_container"] = dict(hv["sglang_server_container"], ulimits=limits)
        words = "rlimit"
    else:
        hv["sglang_server_python"] = "/opt/no-such-venv/bin/python"
        words = "/opt/no-such-venv/bin/python"
    run2 = node.run(host_vars=hv)
    assert run2.rc != 0
    msg = run2.task_result(PREFLIGHT)["msg"]
    assert "the podman container of this launch cannot be created" in msg and words in msg, msg
    assert "sglang_server_container" in msg and "nothing was touched" in msg
    after = running_box(engine, node)
    assert (after["Id"], after["State"]["Pid"], after["State"]["Status"]) == (before["Id"], before["State"]["Pid"], "running")
    assert node.health() == 200
    probes = engine.cli("ps", "-a", "--filter", "label=io.gpufleet.sglang.role=probe", "--format", "{{.ID}}").stdout.split()
    assert probes == [], "a probe container was left: %s" % probes


def test_the_docker_engine_runs_stops_and_keeps_the_server_s_container_and_refuses_gpus_it_cannot_give(
        node, dockerd, tmp_path):  # noqa: F811  # pylint: disable=redefined-outer-name
    """Against a REAL Docker engine (Debian's docker.io 20.10, private dockerd). Docker before 25 has no CDI: the GPUs
    go through ``--gpus``, which needs the NVIDIA container toolkit; without it docker refuses the container, and the
    preflight says so with docker's words before anything is touched. With ``gpu_request: none`` (the simulated GPUs
    need no device plumbing) the server runs, is replaced through ``docker stop`` and its container kept."""
    engine = Engine("docker", dockerd["env"], None, dockerd["bin"])
    ref = sglang_sim_image(engine.over(dict(os.environ)), runtime="docker")
    image_id = engine.cli("image", "inspect", "--format", "{{.Id}}", ref).stdout.strip()
    try:
        hv = box_vars(node, engine, ref, sglang_server_manager="docker", sglang_server_cuda_visible_devices="0,1")
        run = node.run(host_vars=hv)
        assert run.rc != 0
        msg = run.task_result(PREFLIGHT)["msg"]
        assert "the docker container of this launch cannot be created" in msg and "could not select device driver" in msg, msg
        assert running_box(engine, node) is None                   # nothing was created

        hv["sglang_server_container"] = dict(hv["sglang_server_container"], gpu_request="none")
        run = node.run(host_vars=hv)
        assert run.rc == 0, run.summary()
        info = running_box(engine, node)
        assert info["State"]["Status"] == "running" and info["Image"] == image_id
        assert info["HostConfig"]["RestartPolicy"]["Name"] == "no" and info["HostConfig"]["IpcMode"] == "host"
        assert node.health() == 200
        no_secret_anywhere(node, engine, info)
        run2 = node.run(host_vars=box_vars(node, engine, ref, sglang_server_manager="docker",
                                           sglang_server_cuda_visible_devices="0,1",
                                           sglang_server_container=dict(hv["sglang_server_container"]),
                                           server_env={"SGLANG_SIM_NOTE": "second"}))
        assert run2.rc == 0, run2.summary()
        assert run2.task_result(REPLACE)["container_stopped"]["id"] == info["Id"]
        old = engine.inspect(info["Id"])
        assert old["Name"] == "/sglang-%s-previous" % node.name and old["State"]["Status"] == "exited"
        assert running_box(engine, node)["Id"] != info["Id"] and node.health() == 200
    finally:
        for name in ("sglang-%s" % node.name, "sglang-%s-previous" % node.name):
            engine.cli("rm", "--force", name, check=False)         # the fixture removes podman's; these are docker's


def test_an_interrupted_container_redeploy_is_continued_from_the_journal(node, podman_engine, image):
    """The controller is SIGKILLed (its process group, as a dead AWX job) while the candidate container starts. The
    container runs on by itself; the rerun reads the journal, finds that container (by its name and labels), verifies
    it and promotes it in place: same container, same PID, nothing signalled."""
    engine = podman_engine
    run = node.run(host_vars=box_vars(node, engine, image["ref"]))
    assert run.rc == 0, run.summary()
    hv = box_vars(node, engine, image["ref"], server_env={"SGLANG_SIM_STARTUP_S": "3"})
    ctl = node.spawn_playbook(host_vars=hv)
    entry = ctl.wait_for_step("launching")
    ctl.kill(signal.SIGKILL, group=True)
    assert ctl.wait() != 0
    box = running_box(engine, node)
    assert box["State"]["Pid"] == entry["candidate"]["pid"] and box["State"]["Status"] == "running"
    rerun = node.run(host_vars=hv)
    row = rerun.row()
    assert row["plan"] == "verify" and row["status"] == "deployed", row
    assert row["signalled"] == [], row["signalled"]
    after = running_box(engine, node)
    assert (after["Id"], after["State"]["Pid"]) == (box["Id"], box["State"]["Pid"])
    record = json.loads((node.etc / "known-good" / "server.json").read_text())
    assert record["fingerprint"] == entry["candidate"]["fingerprint"] and record["image"]["id"] == image["id"]


def test_a_weight_only_update_in_a_container_swaps_in_place_when_the_container_sees_the_new_checkpoint(
        node, podman_engine, image, tmp_path):
    """The models' parent directory is a volume of the container: a new checkpoint of the same config is loaded in place
    (same container, same PID, nothing signalled). A checkpoint outside every mount of the running container cannot be
    loaded from inside it: the plan restarts (the new container mounts it) and says why."""
    from test_weights_redeploy import NO_SPECULATION, checkpoint
    from checkpoint_files import write_weights
    engine = podman_engine
    write_weights(node.target, seed="launch")

    def plain(path=None, **extra):
        hv = box_vars(node, engine, image["ref"], sglang_smoke_min_accept_length=0, **extra)
        hv["sglang_server_container"]["volumes"].append("%s:%s:ro" % (node.models, node.models))
        hv["sglang_server_args"] = dict(node.server_args(**NO_SPECULATION), **({"model_path": str(path)} if path else {}))
        return hv

    run = node.run(host_vars=plain())
    assert run.rc == 0, run.summary()
    box = running_box(engine, node)
    new = checkpoint(node, "kimi-k2.5-step2")
    run = node.run(host_vars=plain(new))
    row = run.row()
    assert run.rc == 0 and row["status"] == "deployed" and row["mode"] == "weights", row
    assert row["signalled"] == [], row["signalled"]
    after = running_box(engine, node)
    assert (after["Id"], after["State"]["Pid"]) == (box["Id"], box["State"]["Pid"])
    assert row["effective_args"]["model_path"] == str(new)

    outside = tmp_path / "elsewhere" / "kimi-k2.5-step3"
    outside.parent.mkdir()
    node_models, node.models = node.models, outside.parent
    try:
        other = checkpoint(node, outside.name)
    finally:
        node.models = node_models
    check = node.run(host_vars=plain(other), check=True)
    row = check.row()
    assert row["plan"] == "restart", row
    result = check.task_result(PREFLIGHT)
    why = result["plan"]["weights"]["why"]
    assert result["plan"]["weights"]["mode"] == "restart" and "does not see %s" % other in why, why
    assert "sglang_server_container volumes" in why
    assert any(line.startswith("no in-place weight update: ") and "does not see" in line for line in result["lines"]), result["lines"]


def test_check_mode_shows_the_container_the_image_change_and_its_digest_and_changes_nothing(node, podman_engine, image):
    """``--check --diff`` after the tag moved: the plan line names the new image (its ID), the diff shows the image
    before and after, the check-mode report shows both, and the running container is untouched."""
    engine = podman_engine
    tag = "localhost/gpufleet-test/checked:%d" % os.getpid()
    engine.cli("tag", image["id"], tag)
    try:
        run = node.run(host_vars=box_vars(node, engine, tag))
        assert run.rc == 0, run.summary()
        before = running_box(engine, node)
        other = layer_over(engine, image["id"], tag)
        check = node.run(host_vars=box_vars(node, engine, tag), check=True)
        assert check.rc == 0, check.summary()
        pre = check.task_result(PREFLIGHT)
        assert pre["plan"]["image"]["id"] == other and pre["plan"]["running_image"]["id"] == image["id"]
        # The words name the new image: its repository digest (podman gives a committed image one), else its ID.
        digests = json.loads(engine.cli("image", "inspect", other).stdout)[0].get("RepoDigests") or []
        words = pre["plan"]["image"]["words"]
        assert words in digests or other[:12] in words, (words, digests)
        assert "manager podman, image %s;" % words in pre["lines"][0], pre["lines"][0]
        diffs = [d for d in pre["diff"] if "container image" in d["after_header"]]
        assert diffs and "image: %s\n" % words in diffs[0]["after"], pre["diff"]
        assert "image: " in diffs[0]["before"] and diffs[0]["before"] != diffs[0]["after"], diffs[0]
        row = check.row()
        assert row["status"] == "planned" and row["image"]["before"]["id"] == image["id"] and row["image"]["after"]["id"] == other
        assert "- Image: before %s (" % tag in check.report_md and "; after %s (" % tag in check.report_md, check.report_md
        after = running_box(engine, node)
        assert (after["Id"], after["State"]["Pid"]) == (before["Id"], before["State"]["Pid"])
    finally:
        engine.cli("rmi", "--force", tag, check=False)


def test_the_preflight_pulls_a_missing_image_before_anything_is_touched_and_records_the_registry_digest(
        node, podman_engine, image, tmp_path):
    """A tag that is not on the node is pulled, for real, from a registry on 127.0.0.1 (container_images.Registry) by
    the preflight, before the teardown: the plan says it was pulled and keeps the pull's last lines (its progress),
    and the plan, the record and the report carry the registry's digest."""
    from container_images import Registry
    engine = podman_engine
    registry = Registry(tmp_path / "registry")
    ref = "%s/gpufleet/sglang:v1" % registry.host
    fresh = None
    try:
        fresh, digest = published(engine, image["id"], registry, "v1")
        hv = box_vars(node, engine, ref)
        hv["sglang_node_environment"]["CONTAINERS_REGISTRIES_CONF"] = registry.podman_env()["CONTAINERS_REGISTRIES_CONF"]
        assert engine.cli("image", "exists", ref, check=False).returncode != 0
        run = node.run(host_vars=hv)
        assert run.rc == 0, run.summary()
        pre = run.task_result(PREFLIGHT)
        plan_image = pre["plan"]["image"]
        assert plan_image["pulled"] is True and plan_image["pull_log"], plan_image
        assert plan_image["digest"] == "%s/gpufleet/sglang@%s" % (registry.host, digest), plan_image
        assert any(note.startswith("pulled %s in " % plan_image["digest"]) for note in pre["notes"]), pre["notes"]
        record = json.loads((node.etc / "known-good" / "server.json").read_text())
        assert record["image"] == {"ref": ref, "id": fresh, "digest": plan_image["digest"]}
        assert running_box(engine, node)["Image"] == fresh
        assert "(digest %s)" % digest in run.report_md, run.report_md
    finally:
        for box in sorted(node.box_ids):                      # the image is in use by this test's containers
            engine.cli("rm", "--force", box, check=False)
        if fresh:
            engine.cli("rmi", "--force", fresh, check=False)
        registry.close()


def test_a_rollback_whose_image_was_removed_pulls_it_again_by_its_recorded_digest(node, podman_engine, image, tmp_path):
    """The known-good server came from a registry (its digest recorded). Someone removes its image from the node
    (``podman rmi --force``, which takes the container with it). The next candidate fails its health gate: the rollback
    pulls the recorded digest again, checks it gives the recorded image ID, and serves."""
    from container_images import Registry
    engine = podman_engine
    registry = Registry(tmp_path / "registry")
    ref = "%s/gpufleet/sglang:kg" % registry.host
    fresh = None
    try:
        fresh = published(engine, image["id"], registry, "kg")[0]
        conf = registry.podman_env()["CONTAINERS_REGISTRIES_CONF"]
        hv = box_vars(node, engine, ref)
        hv["sglang_node_environment"]["CONTAINERS_REGISTRIES_CONF"] = conf
        run = node.run(host_vars=hv)
        assert run.rc == 0, run.summary()
        running_box(engine, node)
        engine.cli("rmi", "--force", fresh)                   # the image and the container that uses it
        assert engine.cli("image", "exists", fresh, check=False).returncode != 0
        bad = box_vars(node, engine, image["ref"], server_env={"SGLANG_SIM_CRASH_ON_LOAD": "1"})
        bad["sglang_node_environment"]["CONTAINERS_REGISTRIES_CONF"] = conf
        run2 = node.run(host_vars=bad)
        assert run2.rc != 0
        replaced = run2.task_result(REPLACE)
        assert replaced["rollback"]["status"] == "succeeded", replaced.get("rollback")
        back = running_box(engine, node)
        assert back["Image"].replace("sha256:", "") == fresh and back["State"]["Status"] == "running"
        assert any("pulled it again by its digest" in w for w in replaced.get("warnings") or []), replaced.get("warnings")
        assert node.health() == 200
    finally:
        for box in sorted(node.box_ids):
            engine.cli("rm", "--force", box, check=False)
        if fresh:
            engine.cli("rmi", "--force", fresh, check=False)
        registry.close()


def test_a_two_node_group_runs_one_container_per_rank_and_is_redeployed_as_one_unit(tmp_path, podman_engine, image,
                                                                                   cdi_gpus):  # noqa: F811
    """A multi-node server (nnodes 2, one GPU per node; test_multinode.Group: two simulated nodes on this host) with
    each rank in its own podman container (named per rank here, as two ranks share this one machine): the group is
    deployed, then a config change replaces both containers through podman, rank 0 first, and both serve again."""
    from test_multinode import HOSTS, Group
    engine = podman_engine
    procs = ph.Procs()
    group = Group(tmp_path / "group", procs)
    names = dict((host, "sglang-mn-%s-%d" % (host, os.getpid())) for host in HOSTS)

    def vars_for(host, **args):
        node = group[host]
        hv = group.host_vars(host, args=group.shared_args(**args))
        box = box_vars(node, engine, image["ref"], sglang_server_cuda_visible_devices="0")
        for key in ("sglang_node_environment", "sglang_server_manager", "sglang_server_image", "sglang_server_python",
                    "sglang_server_container", "sglang_server_cuda_visible_devices"):
            hv[key] = box[key]
        hv["sglang_server_container"] = dict(hv["sglang_server_container"], name=names[host])
        hv["sglang_server_env"] = dict(hv["sglang_server_env"], GPUSIM_ROOT=str(node.root))
        hv["sglang_server_env"].pop("PYTHONPATH", None)
        return hv

    def boxes():
        out = {}
        for host in HOSTS:
            proc = engine.cli("container", "inspect", names[host], check=False)
            out[host] = json.loads(proc.stdout)[0] if proc.returncode == 0 else None
        return out

    try:
        run = group.run(dict((h, vars_for(h)) for h in HOSTS))
        assert run.rc == 0, run.summary()
        first = boxes()
        for host in HOSTS:
            assert first[host]["State"]["Status"] == "running", (host, first[host]["State"])
            assert first[host]["Config"]["Labels"]["io.gpufleet.sglang.server"] == "mn"
            assert group[host].used()[0] > 100000 and group[host].used()[1] == 1, (host, group[host].used())
        assert group[HOSTS[1]].health() == 200
        info = group.info()
        assert info["nnodes"] == 2 and info["node_rank"] == 0, info
        run = group.run(dict((h, vars_for(h, chunked_prefill_size=4096)) for h in HOSTS))
        assert run.rc == 0, run.summary()
        second = boxes()
        for host in HOSTS:
            assert second[host]["Id"] != first[host]["Id"] and second[host]["State"]["Status"] == "running"
            old = engine.inspect(first[host]["Id"])
            assert old["State"]["Status"] == "exited" and old["Name"].lstrip("/") == names[host] + "-previous"
        assert group.info()["chunked_prefill_size"] == 4096
    finally:
        for host in HOSTS:
            for name in (names[host], names[host] + "-previous"):
                engine.cli("rm", "--force", "--time", "5", name, check=False)
        left = procs.cleanup()
        assert not left, "processes survived SIGKILL: %s" % left
