"""Fixtures of the real-server stage: the venv and the tiny models once per session, a simulated
node per test (or per module for the shared servers), and every process started killed at the end
by PID (``ProcessRegistry``: recorded PIDs and start times, never a name or a pattern).

A real server's stand-ins must never be called: every fixture that stops a real server fails the
test if its processes recorded a call (``servers.standin_calls``)."""
from __future__ import annotations

import pathlib
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import real_env  # noqa: E402
import servers  # noqa: E402


@pytest.fixture(scope="session")
def real_python():
    return real_env.ensure()


@pytest.fixture(scope="session")
def models(real_python, tmp_path_factory):
    return servers.Models.build(tmp_path_factory.mktemp("models"), python=str(real_python))


class Fleet(object):
    """Servers of one test (or module) on one simulated node: ``start(kind, ...)``; all killed at the end."""

    def __init__(self, root: pathlib.Path, models, gpus=2):
        self.root = root
        self.models = models
        self.registry = servers.ProcessRegistry()
        self.node = servers.GpuNode(root / "node", gpus=gpus, model="H100")
        self.started = []
        self._n = 0

    def start(self, kind, args=(), model="base", env=None, port=None, wait=True):
        self._n += 1
        log = self.root / ("%s-%d.log" % (kind, self._n))
        srv = servers.launch(kind, self.registry, self.node, log, self.models.path(model), args=args, env=env, port=port)
        self.started.append(srv)
        if wait:
            srv.wait_ready()
        return srv

    def close(self):
        for srv in self.started:
            srv.tree()
        self.registry.kill_all()
        calls = []
        for srv in self.started:
            if srv.proc.poll() is None:
                try:
                    srv.proc.wait(timeout=10)
                except Exception:  # noqa: BLE001 - reported by the registry's kill above
                    pass
            srv.close()
            calls.extend(servers.standin_calls(srv))
        assert not calls, "a CUDA stand-in was called on the serving path: %s" % calls


@pytest.fixture
def fleet(tmp_path, models):
    f = Fleet(tmp_path, models)
    yield f
    f.close()


@pytest.fixture(scope="module")
def module_fleet(tmp_path_factory, models):
    f = Fleet(tmp_path_factory.mktemp("fleet"), models)
    yield f
    f.close()
