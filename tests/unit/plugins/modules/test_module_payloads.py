"""What each module of the redeploy carries to the node, as ansible-core's own AnsiballZ builder packs it.

Every module run pays for its payload twice: the controller walks and packs the module_utils it imports
(once per module and run), and the node compiles the imported sources from the zip (every run: a zip
import writes no bytecode cache). bench/README.md measures both. These tests keep the modules that do
not resolve args from carrying the resolution mirror, and keep the mirror out of a replace's imports
until an override has to be explained.
"""
from __future__ import annotations

import base64
import inspect
import io
import os
import re
import subprocess
import sys
import zipfile

import pytest

from ansible.executor import module_common
from ansible.plugins.loader import init_plugin_loader, module_loader
from ansible.template import Templar

PREFIX = "ansible_collections/gpufleet/sglang/plugins/"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
MIRROR = {"module_utils/sglang/resolve.py", "module_utils/sglang/rules.py", "module_utils/sglang/flags_data.py"}
LAUNCHER = {"module_utils/server/%s.py" % name for name in (
    "launcher", "launch_params", "address", "stored_launch", "crash_watch", "server_logs", "launch_plan", "process_control",
    "health_gate", "config_check")} | {"module_utils/sglang/render.py", "module_utils/sglang/compare.py"}


def payload_files(name):
    """The collection files in the AnsiballZ zip of module ``name`` (relative to plugins/)."""
    init_plugin_loader()
    ctx = module_loader.find_plugin_with_context("gpufleet.sglang." + name)
    assert ctx.resolved, name
    kwargs = dict(module_name=ctx.resolved_fqcn, module_path=ctx.plugin_resolved_path, module_args={},
                  templar=Templar(loader=None), task_vars={"ansible_python_interpreter": sys.executable},
                  module_compression="ZIP_DEFLATED")
    params = inspect.signature(module_common.modify_module).parameters
    if "module_name" not in params or params["module_name"].kind != inspect.Parameter.KEYWORD_ONLY:
        # ansible-core 2.17/2.18: modify_module(module_name, module_path, module_args, templar, task_vars=...)
        positional = tuple(kwargs.pop(k) for k in ("module_name", "module_path", "module_args", "templar"))
        built = module_common.modify_module(*positional, **kwargs)
    else:
        built = module_common.modify_module(**kwargs)
    data = built.b_module_data if hasattr(built, "b_module_data") else built[0]
    names = set()
    for match in re.finditer(rb"[A-Za-z0-9+/=]{2000,}", data):
        with zipfile.ZipFile(io.BytesIO(base64.b64decode(match.group(0)))) as zf:
            names.update(n[len(PREFIX):] for n in zf.namelist() if n.startswith(PREFIX))
    assert "modules/%s.py" % name in names, sorted(names)
    return names


@pytest.mark.parametrize("name", ["sglang_promote", "sglang_smoke", "node_lock", "sglang_progress"])
def test_modules_that_resolve_nothing_carry_neither_the_mirror_nor_the_launcher(name):
    names = payload_files(name)
    assert not names & MIRROR, sorted(names & MIRROR)
    assert not names & LAUNCHER, sorted(names & LAUNCHER)


@pytest.mark.parametrize("name", ["sglang_preflight", "sglang_replace"])
def test_the_modules_that_resolve_or_explain_carry_the_mirror(name):
    # The check has teeth: these do import it (the preflight resolves, the replace explains overrides).
    names = payload_files(name)
    assert MIRROR <= names, sorted(MIRROR - names)


def test_the_replace_compiles_the_mirror_only_to_explain_an_override():
    code = (
        "import sys\n"
        "from ansible_collections.gpufleet.sglang.plugins.modules import sglang_replace\n"
        "mirror = 'ansible_collections.gpufleet.sglang.plugins.module_utils.sglang.resolve'\n"
        "print(mirror in sys.modules)\n"
        "from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import compare\n"
        "compare.explain('speculative_num_draft_tokens', 16, 2, '0.5.23', args={}, adjustments=[])\n"
        "print(mirror in sys.modules)\n"
    )
    # The collection's root as this test run finds it (a pytest plugin may hold it outside sys.path), and the
    # checkout's own .collections link (scripts/setup-venv.sh), for the child interpreter.
    from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import smoke
    found = os.path.abspath(smoke.__file__)
    for dummy in range(6):
        found = os.path.dirname(found)
    roots = [found, os.path.join(REPO, ".collections")] + [p for p in sys.path if p]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(roots)), check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"], out.stdout
