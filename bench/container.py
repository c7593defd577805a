"""Container benchmark: the outage of a config-change redeploy of a server in a podman container (issue 24) next to the
same redeploy of a host-process server (manager ``process``), on the same simulated node setup.

Two simulated 8-GPU nodes (tests/integration/playbook_helpers.SimNode), set up alike: GPUs 2,5, the same server args
and server env. One runs its server in podman (``sglang_server_manager: podman``, the host vars of
tests/integration/test_container_manager.box_vars: the simulated-SGLang image of container_images.sglang_sim_image,
the simulated GPUs through the CDI spec of sim_cdi.cdi_spec), the other as a host process. Each is deployed once by
playbooks/redeploy.yml (not timed); then, per round (``--container-runs``, alternating the order), each gets the same
config change (``schedule_policy`` flipped between lpm and fcfs: a restart in place).

Per redeploy:

- outage = from the first to the last failed probe of the server's ``GET /health`` (overlap.outage_of, with the
  overlap part's rate), probed by the overlap part's open-loop client (test_router_rolling.Load) pointed at the
  server's own port with ``/health`` instead of ``/generate`` through a router;
- preflight = the preflight task's duration (the container's includes the image inspect and the oracle run in the
  image), from the runner's event;
- teardown_s and candidate_healthy_s = the replace module's own ``timings``;
- wall = the whole ``redeploy.yml`` run.

Needs root and podman (the CDI spec goes to /var/run/cdi); without them the part records ``skipped: why``. Every
container it creates is removed by its ID at the end, every process stopped by PID (playbook_helpers.Procs). The image
is left in podman's store: it is cached by the simulator's content hash and shared with the integration tests.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import _common as c
import overlap

KINDS = ("container", "host")
POLICIES = ("lpm", "fcfs")


def _imports():
    for path in (os.path.join(c.REPO, ".collections"), overlap.INTEGRATION):
        if path not in sys.path:
            sys.path.insert(0, path)
    import playbook_helpers  # pylint: disable=import-outside-toplevel
    import test_router_rolling  # pylint: disable=import-outside-toplevel
    import test_container_manager  # pylint: disable=import-outside-toplevel
    import sim_cdi  # pylint: disable=import-outside-toplevel
    import container_images  # pylint: disable=import-outside-toplevel
    return playbook_helpers, test_router_rolling, test_container_manager, sim_cdi, container_images


def missing():
    """Why this part cannot run here (root, podman), or None."""
    if os.geteuid() != 0:
        return "needs root (the simulated GPUs' CDI spec goes to /var/run/cdi), running as uid %d" % os.geteuid()
    if not shutil.which("podman"):
        return "podman is not installed (scripts/install-system-deps.sh, as root)"
    env = dict(os.environ, CONTAINERS_CONF=os.path.join(c.REPO, "molecule", "containers.conf"))
    try:
        proc = subprocess.run(["podman", "info", "--format", "{{.Host.OCIRuntime.Name}}"], env=env, capture_output=True,
                              text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "podman info did not answer: %s" % exc
    if proc.returncode != 0:
        return "podman info failed (%d): %s" % (proc.returncode, proc.stderr.strip()[-300:])
    return None


def health_probe(rr):
    """The overlap part's client, probing ``GET <url>/health`` instead of posting ``/generate``."""
    class HealthProbe(rr.Load):
        def __init__(self, url):
            super().__init__(url, rate=overlap.RATE, max_requests=int(overlap.RATE * 900), time_limit=900)
            self.url = url + "/health"

        def _one(self, index):
            try:
                status, _headers, _data = rr.request("GET", self.url, timeout=5)
            except rr.HTTPConnectionError as exc:
                status, why = None, str(exc)
            else:
                why = "HTTP %s" % status
            with self.lock:
                if status == 200:
                    self.ok += 1
                else:
                    self.failures.append((index, round(time.monotonic() - self.started, 2), why))
    return HealthProbe


def event_duration(run, task, host):
    """Seconds of the task's last ok/failed event on ``host`` (ansible-runner's ``duration``), or None."""
    events = run.task_events(task, ("runner_on_ok", "runner_on_failed"), host)
    if not events:
        return None
    dur = events[-1]["event_data"].get("duration")
    return round(float(dur), 3) if dur is not None else None


def figures(kind, run, probe_failures, outage_s, replaced, preflight_s):
    """One round's record from what the run and the probe saw; ``ok`` says whether it counts."""
    timings = (replaced or {}).get("timings") or {}
    out = {"kind": kind, "rc": run.rc, "wall": round(run.wall, 2), "outage_s": outage_s, "probe_failed": probe_failures,
           "preflight_s": preflight_s, "teardown_s": timings.get("teardown_s"),
           "candidate_healthy_s": timings.get("candidate_healthy_s")}
    stopped = (replaced or {}).get("container_stopped") or {}
    out["container_stopped"] = stopped.get("id")
    # A restart in place on the same port: the probe must have seen the port down; the container's old box must have
    # been stopped through podman.
    out["ok"] = bool(run.rc == 0 and replaced and not replaced.get("failed") and probe_failures > 0
                     and out["teardown_s"] is not None and (kind != "container" or out["container_stopped"]))
    return out


class _Setup(object):
    """The two nodes, their host vars and the containers seen, for one run of the part."""

    def __init__(self, ph, tcm, engine, base, procs, image):
        self.ph, self.tcm, self.engine, self.image = ph, tcm, engine, image
        self.nodes = {"container": ph.SimNode(os.path.join(base, "container-node"), procs, name="benchbox"),
                      "host": ph.SimNode(os.path.join(base, "host-node"), procs, name="benchhost")}
        self.policy = {"container": "fcfs", "host": "fcfs"}
        self.box_ids = set()

    def host_vars(self, kind):
        node = self.nodes[kind]
        args = node.server_args(schedule_policy=self.policy[kind])
        if kind == "container":
            return self.tcm.box_vars(node, self.engine, self.image, sglang_server_args=args)
        return node.host_vars(sglang_server_cuda_visible_devices="2,5", sglang_server_args=args,
                              server_env={"HF_TOKEN": self.tcm.SECRET_ENV})

    def see_boxes(self):
        name = "sglang-%s" % self.nodes["container"].name
        for each in (name, name + "-previous"):
            proc = self.engine.cli("container", "inspect", each, check=False)
            if proc.returncode == 0:
                self.box_ids.add(json.loads(proc.stdout)[0]["Id"])

    def remove_boxes(self):
        self.see_boxes()
        left = []
        for cid in sorted(self.box_ids):
            if self.engine.cli("rm", "--force", "--time", "5", cid, check=False).returncode != 0 and \
                    self.engine.cli("container", "exists", cid, check=False).returncode == 0:
                left.append(cid)
        return left


def _round(setup, rr, kind, n):
    node = setup.nodes[kind]
    setup.policy[kind] = POLICIES[0] if setup.policy[kind] == POLICIES[1] else POLICIES[1]
    hv = setup.host_vars(kind)
    probe = health_probe(rr)(node.url)
    load = c.loadavg()
    probe.start()
    try:
        run = node.run(host_vars=hv)
    finally:
        probe.stop()
    if kind == "container":
        setup.see_boxes()
    replaced = (run.task_results(setup.tcm.REPLACE) or [None])[-1]
    out = figures(kind, run, len(probe.failures), overlap.outage_of(probe), replaced,
                  event_duration(run, setup.tcm.PREFLIGHT, setup.ph.HOST))
    out.update({"round": n, "load": load, "probes": probe.sent})
    if run.rc != 0:
        out["error"] = run.summary()[-1500:]
    print("  container round %d %-10s %s wall %5.1f s, outage %s s (%d of %d probes failed), preflight %s s, teardown %s s,"
          " candidate healthy %s s, load %.1f" % (
              n + 1, kind + ":", "ok  " if out["ok"] else "FAIL", out["wall"], c.fmt(out["outage_s"]), out["probe_failed"],
              probe.sent, c.fmt(out["preflight_s"]), c.fmt(out["teardown_s"]), c.fmt(out["candidate_healthy_s"]), load[0]),
          flush=True)
    return out


def run(opts, workdir):
    why = missing()
    if why:
        print("  container: skipped: %s" % why, flush=True)
        return {"skipped": why}
    try:
        ph, rr, tcm, sim_cdi, images = _imports()
    except Exception as exc:  # pylint: disable=broad-except
        return {"skipped": "the integration test helpers cannot be imported: %s" % str(exc)[-500:]}
    base = os.path.join(workdir, "container")
    os.makedirs(base)
    rounds = opts.container_runs
    result = {"config": {"rounds": rounds, "rate": overlap.RATE, "change": "schedule_policy lpm <-> fcfs",
                         "gpus": "2,5"}, "container": [], "host": []}
    procs = ph.Procs()
    setup = None
    try:
        engine = tcm.Engine("podman", {"CONTAINERS_CONF": str(tcm.CONF)}, None)
        image = images.sglang_sim_image(engine.env)
        result["config"]["image"] = image
        result["config"]["image_id"] = engine.cli("image", "inspect", "--format", "{{.Id}}", image).stdout.strip()
        with sim_cdi.cdi_spec():
            try:
                setup = _Setup(ph, tcm, engine, base, procs, image)
                for kind in KINDS:
                    first = setup.nodes[kind].run(host_vars=setup.host_vars(kind))
                    if kind == "container":
                        setup.see_boxes()
                    if first.rc != 0:
                        raise RuntimeError("container benchmark: the first deploy (%s) failed: %s" % (kind, first.summary()[-2000:]))
                for n in range(rounds):
                    for kind in (KINDS if n % 2 == 0 else KINDS[::-1]):
                        result[kind].append(_round(setup, rr, kind, n))
            finally:
                if setup is not None:
                    left = setup.remove_boxes()
                    result["containers_removed"] = len(setup.box_ids) - len(left)
                    if left:
                        result["containers_left"] = left
    except Exception as exc:  # pylint: disable=broad-except
        # Reported (and make bench fails); the other parts' figures are still written.
        result["error"] = str(exc)[-3000:]
    finally:
        left = procs.cleanup()
        if left:
            result["left"] = left
    result["summary"] = summarise(result)
    return result


def ratio(a, b):
    return (a / b) if a is not None and b else None


def summarise(result):
    def med(kind, key):
        return c.median([r.get(key) for r in result.get(kind, []) if r.get("ok")])
    s = {"failures": sum(1 for k in KINDS for r in result.get(k, []) if not r.get("ok"))}
    for kind in KINDS:
        for key in ("outage_s", "preflight_s", "teardown_s", "candidate_healthy_s", "wall", "probe_failed"):
            s["%s_%s" % (kind, key)] = med(kind, key)
    s["outage_ratio"] = ratio(s["container_outage_s"], s["host_outage_s"])
    s["wall_ratio"] = ratio(s["container_wall"], s["host_wall"])
    s["preflight_ratio"] = ratio(s["container_preflight_s"], s["host_preflight_s"])
    return s


def report(result):
    if "skipped" in result:
        return "Container: skipped (%s)" % result["skipped"]
    if "error" in result:
        return "Container: FAILED (%s)" % result["error"]
    s = result["summary"]
    cfg = result["config"]

    def row(kind, label):
        return [label, c.fmt(s["%s_outage_s" % kind]), c.fmt(s["%s_preflight_s" % kind]), c.fmt(s["%s_teardown_s" % kind]),
                c.fmt(s["%s_candidate_healthy_s" % kind]), c.fmt(s["%s_wall" % kind], 1)]
    lines = [
        "Container: a config-change redeploy (%s, GPUs %s) of a server in podman against the same redeploy of a host"
        " process, on the same simulated node setup (medians of %d round(s), alternating; outage = first to last failed"
        " GET /health on the server's port, %.0f probes/s; image %s)"
        % (cfg["change"], cfg["gpus"], cfg["rounds"], cfg["rate"], cfg.get("image")),
        c.table(["server", "outage s", "preflight s", "teardown_s", "candidate_healthy_s", "playbook wall s"],
                [row("container", "podman container"), row("host", "host process")]),
        "container / host: outage %s, whole run %s, preflight %s%s" % (
            c.fmt(s["outage_ratio"]), c.fmt(s["wall_ratio"]), c.fmt(s["preflight_ratio"]),
            ("; %d round(s) did not count (see the round lines)" % s["failures"]) if s["failures"] else ""),
    ]
    return "\n".join(lines)
