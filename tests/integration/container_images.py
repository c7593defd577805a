"""Container images for the tests of issue 24 (servers in containers), shared by the integration tests.

* :func:`sglang_sim_image` ``(engine_env=None, runtime="podman")``: an image that holds the simulated SGLang
  (this checkout's simulator/python in ``/opt/sglang-sim-python``, on ``PYTHONPATH``) on top of the molecule node
  image (scripts/build-image.sh); built with ``podman create`` + ``podman cp`` + ``podman commit`` and cached by a
  content hash of simulator/python in its tag. With ``runtime="docker"`` it is loaded into the Docker engine that
  ``engine_env`` (DOCKER_HOST, PATH with docker.io's client) points at (``podman save | docker load``) when missing
  there. Returns the image name.
* :class:`Registry`: a read-only Docker Registry HTTP API v2 on 127.0.0.1 (a thread of the test process), serving
  images written with ``podman push --format v2s2 --compress <image> dir:<path>``, so that ``docker pull`` and
  ``podman pull`` really pull (progress lines, RepoDigests) without the internet. Docker treats 127.0.0.0/8
  registries as insecure (plain HTTP) by default; podman needs ``[[registry]] insecure = true``, which
  :meth:`Registry.podman_env` writes in a registries.conf of its own (CONTAINERS_REGISTRIES_CONF).
"""
from __future__ import annotations

import hashlib
import http.server
import json
import os
import pathlib
import subprocess
import threading

from conftest import REPO, SIM_PY

CONF = REPO / "molecule" / "containers.conf"
SIM_REPO = "localhost/gpufleet-sglang-sim"


def podman_env():
    return dict(os.environ, CONTAINERS_CONF=str(CONF))


def _podman(*args, timeout=600, **kw):
    proc = subprocess.run(["podman"] + [str(a) for a in args], env=podman_env(), capture_output=True, text=True,
                          timeout=timeout, check=False, **kw)
    if proc.returncode != 0:
        raise AssertionError("podman %s failed (%d): %s" % (" ".join(str(a) for a in args), proc.returncode, proc.stderr))
    return proc.stdout


def node_image():
    """The molecule node image (scripts/build-image.sh prints its name, building it when missing)."""
    proc = subprocess.run(["bash", str(REPO / "scripts" / "build-image.sh")], env=podman_env(), capture_output=True,
                          text=True, timeout=1800, check=False)
    assert proc.returncode == 0, "scripts/build-image.sh failed (%d): %s" % (proc.returncode, proc.stderr[-2000:])
    name = proc.stdout.strip().splitlines()[-1]
    assert name.startswith("localhost/gpufleet-node:"), name
    return name


def sim_hash(base):
    """A hash of the base image's name and of every file under simulator/python (names, modes, contents)."""
    digest = hashlib.sha256(("base %s\n" % base).encode())
    for path in sorted(p for p in SIM_PY.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                       and not p.name.endswith((".pyc", ".pyo"))):
        digest.update(("%s %o\n" % (path.relative_to(SIM_PY), path.stat().st_mode & 0o777)).encode())
        digest.update(hashlib.sha256(path.read_bytes()).hexdigest().encode())
    return digest.hexdigest()[:16]


def _build_podman(name, base):
    cid = _podman("create", "--network", "none", base, "true").strip().splitlines()[-1]
    try:
        _podman("cp", str(SIM_PY), "%s:/opt/sglang-sim-python" % cid)
        _podman("commit", "-q", "--change", "ENV PYTHONPATH=/opt/sglang-sim-python", "--change",
                'CMD ["python3", "-m", "sglang.launch_server", "--help"]', "--change", "STOPSIGNAL SIGTERM",
                "--change", "LABEL org.opencontainers.image.title=gpufleet-sglang-sim", cid, name)
    finally:
        _podman("rm", "--force", cid)


def sglang_sim_image(engine_env=None, runtime="podman"):
    """The simulated-SGLang image's name, built (podman) or loaded (docker) when missing; see the module docstring."""
    base = node_image()
    name = "%s:%s" % (SIM_REPO, sim_hash(base))
    present = subprocess.run(["podman", "image", "exists", name], env=podman_env(), check=False).returncode == 0
    if not present:
        _build_podman(name, base)
    if runtime == "podman":
        return name
    env = dict(os.environ, **(engine_env or {}))
    if subprocess.run(["docker", "image", "inspect", name], env=env, capture_output=True, check=False).returncode != 0:
        save = subprocess.Popen(["podman", "save", name], env=podman_env(), stdout=subprocess.PIPE)
        load = subprocess.run(["docker", "load"], stdin=save.stdout, env=env, capture_output=True, text=True,
                              timeout=600, check=False)
        save.stdout.close()
        assert save.wait(timeout=600) == 0 and load.returncode == 0, load.stderr
    return name


class Registry(object):
    """A read-only registry on 127.0.0.1:<port>: :meth:`add` publishes a podman image as ``<repo>:<tag>``;
    ``host`` is ``127.0.0.1:<port>``. Stop it with :meth:`close` (the server thread is joined)."""

    def __init__(self, root):
        self.root = pathlib.Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.repos = {}          # repo -> {tag or digest: (media type, manifest bytes)}
        self.blobs = {}          # digest -> path
        registry = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                return None

            def do_HEAD(self):
                self.answer(head=True)

            def do_GET(self):
                self.answer(head=False)

            def answer(self, head):
                body, ctype, digest = registry.lookup(self.path)
                if body is None:
                    self.send_response(404)
                    self.send_header("Content-Type", "application/json")
                    data = b'{"errors": [{"code": "MANIFEST_UNKNOWN", "message": "unknown"}]}'
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    if not head:
                        self.wfile.write(data)
                    return
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Docker-Distribution-API-Version", "registry/2.0")
                if digest:
                    self.send_header("Docker-Content-Digest", digest)
                self.end_headers()
                if not head:
                    self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = "127.0.0.1:%d" % self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def lookup(self, path):
        path = path.split("?", 1)[0]
        if path in ("/v2/", "/v2"):
            return b"{}", "application/json", None
        if not path.startswith("/v2/"):
            return None, None, None
        rest = path[len("/v2/"):]
        if "/manifests/" in rest:
            repo, ref = rest.rsplit("/manifests/", 1)
            found = self.repos.get(repo, {}).get(ref)
            if found is None:
                return None, None, None
            ctype, body = found
            return body, ctype, "sha256:" + hashlib.sha256(body).hexdigest()
        if "/blobs/" in rest:
            digest = rest.rsplit("/blobs/", 1)[1]
            blob = self.blobs.get(digest)
            if blob is None:
                return None, None, None
            return blob.read_bytes(), "application/octet-stream", digest
        return None, None, None

    def add(self, image, repo, tag):
        """Publish the podman image ``image`` as ``<host>/<repo>:<tag>``; returns the manifest digest."""
        layout = self.root / ("%s-%s-%s" % (repo.replace("/", "_"), tag, os.urandom(4).hex()))
        _podman("push", "-q", "--format", "v2s2", "--compress", image, "dir:%s" % layout)
        body = (layout / "manifest.json").read_bytes()
        manifest = json.loads(body)
        for item in [manifest["config"]] + manifest["layers"]:
            self.blobs[item["digest"]] = layout / item["digest"].split(":", 1)[1]
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        entries = self.repos.setdefault(repo, {})
        entries[tag] = entries[digest] = (manifest["mediaType"], body)
        return digest

    def podman_env(self):
        """podman's environment with a registries.conf that lets it pull from this registry over plain HTTP."""
        conf = self.root / "registries.conf"
        conf.write_text('[[registry]]\nlocation = "%s"\ninsecure = true\n' % self.host)
        return dict(podman_env(), CONTAINERS_REGISTRIES_CONF=str(conf))

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=30)
