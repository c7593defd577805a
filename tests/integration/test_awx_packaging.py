"""AWX / Automation Controller / ansible-runner packaging.

- ``execution-environment.yml`` is valid ansible-builder v3 input: ``ansible-builder
  create`` (offline) writes a build context whose Containerfile pins the
  controller versions of ``requirements/dev.txt``, and whose copy of the
  collection installs offline, the way the image's galaxy stage does, into a
  collection that ``ansible-doc`` and ``--syntax-check`` accept. The image build
  itself needs a registry and is not run.
- ``docs/awx/survey.json`` asks only for variables declared in the roles'
  ``meta/argument_specs.yml`` or in ``docs/awx/variables.yml``, with
  compatible types, choices and defaults; every entry of variables.yml is
  still read where it says; the credential type injects only declared secrets.

The runner example itself runs in tests/integration/test_awx_project.py (the repository as an AWX
project, the collection from the installed tarball) and, inside the built execution environment, in
tests/matrix/test_execution_environment.py.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile

import pytest
import yaml


REPO = pathlib.Path(__file__).resolve().parents[2]
AWX = REPO / "docs" / "awx"
VENV_BIN = pathlib.Path(sys.executable).parent

# AWX survey question type -> the spec types it can feed.
SURVEY_TYPES = {
    "text": {"str", "path", "raw"},
    "textarea": {"str", "raw", "dict", "list"},
    "password": {"str"},
    "integer": {"int", "raw"},
    "float": {"float", "raw"},
    "multiplechoice": {"str", "raw"},
    "multiselect": {"list"},
}
SECRET_NAME = re.compile(r"(api_key|password|secret|token)$")


def _yaml(path):
    return yaml.safe_load(pathlib.Path(path).read_text())


def _galaxy():
    return _yaml(REPO / "galaxy.yml")


def _pin(name):
    for line in (REPO / "requirements" / "dev.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith(name + "=="):
            return line
    raise AssertionError("%s is not pinned in requirements/dev.txt" % name)


def declared_variables():
    """name -> {type, default?, choices?, secret?, where} from the role specs and variables.yml."""
    out = {}
    for spec_file in sorted((REPO / "roles").glob("*/meta/argument_specs.yml")):
        for entry, spec in (_yaml(spec_file).get("argument_specs") or {}).items():
            for name, opt in (spec.get("options") or {}).items():
                out.setdefault(name, dict(opt, where="%s (%s)" % (spec_file.relative_to(REPO), entry)))
    for name, opt in _yaml(AWX / "variables.yml")["variables"].items():
        assert name not in out, "%s is declared both in a role spec and in variables.yml" % name
        out[name] = dict(opt, where="docs/awx/variables.yml")
    return out


def _env(**extra):
    env = dict(os.environ)
    env.update({
        "ANSIBLE_COLLECTIONS_PATH": str(REPO / ".collections"),
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "PATH": "%s:%s" % (VENV_BIN, os.environ.get("PATH", "")),
        "ANSIBLE_NOCOLOR": "1",
    })
    env.update(extra)
    return env


# --------------------------------------------------------------------------
# Execution environment
# --------------------------------------------------------------------------

def test_execution_environment_definition():
    ee = _yaml(REPO / "execution-environment.yml")
    assert ee["version"] == 3
    assert ee["images"]["base_image"]["name"]
    deps = ee["dependencies"]
    assert deps["ansible_core"]["package_pip"] == _pin("ansible-core")
    assert deps["ansible_runner"]["package_pip"] == _pin("ansible-runner")
    assert deps["python_interpreter"]["python_path"].endswith("python3.11")
    assert "python" not in deps, "the collection needs no controller-side Python packages beyond ansible-core"
    g = _galaxy()
    tarball = "%s-%s-%s.tar.gz" % (g["namespace"], g["name"], g["version"])
    assert deps["galaxy"]["collections"] == [{"name": "collections/" + tarball, "type": "file"}], (
        "execution-environment.yml must install the tarball of galaxy.yml's version (%s)" % tarball)
    assert ee["additional_build_files"] == [{"src": ".cache/build/" + tarball, "dest": "collections"},
                                            {"src": "requirements/dev.lock", "dest": "constraints"}]
    # Every pip step of the build is constrained by the lock (ansible-core's transitive dependencies too).
    base_steps = ee["additional_build_steps"]["prepend_base"]
    assert "COPY _build/constraints/dev.lock /etc/gpufleet-ee-constraints.txt" in base_steps
    assert "ENV PIP_CONSTRAINT=/etc/gpufleet-ee-constraints.txt" in base_steps


def _stage_checkout(dest):
    listing = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=str(REPO),
                             capture_output=True, timeout=60, check=True).stdout.decode()
    for rel in filter(None, listing.split("\0")):
        source = REPO / rel
        if not source.exists() and not source.is_symlink():
            continue   # deleted in the working tree
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            os.symlink(os.readlink(source), target)
        elif source.is_file():
            shutil.copy2(source, target)
    return dest


def test_build_ignore_keeps_generated_directories_out():
    """ansible-lint writes collections/ansible_collections/<ns>/<name> links into the checkout and
    ansible-builder's default context is context/; a `make build` after either must not pack them
    (a packed link makes the tarball uninstallable: "linkname ... not found")."""
    ignored = set(_galaxy().get("build_ignore") or [])
    for generated in ("collections", "context"):
        assert generated in ignored, "add %r to build_ignore in galaxy.yml" % generated


@pytest.mark.slow
def test_ansible_builder_create_offline(tmp_path):
    g = _galaxy()
    tarball = "%s-%s-%s.tar.gz" % (g["namespace"], g["name"], g["version"])
    work = tmp_path / "ee"
    (work / ".cache" / "build").mkdir(parents=True)
    shutil.copy(REPO / "execution-environment.yml", work / "execution-environment.yml")
    (work / "requirements").mkdir()
    shutil.copy(REPO / "requirements" / "dev.lock", work / "requirements" / "dev.lock")

    # What `make build` does, from the files a clone would have (tracked, plus new files git does not ignore;
    # tool output such as ansible-lint's collections/ links stays out), into the temporary tree.
    src = _stage_checkout(tmp_path / "src")
    build = subprocess.run([str(VENV_BIN / "ansible-galaxy"), "collection", "build", "--force", "--output-path",
                            str(work / ".cache" / "build"), str(src)], env=_env(), capture_output=True, text=True, timeout=300, check=False)
    assert build.returncode == 0, build.stdout + build.stderr
    assert (work / ".cache" / "build" / tarball).exists()

    ctx = work / "context"
    create = subprocess.run([str(VENV_BIN / "ansible-builder"), "create", "-f", str(work / "execution-environment.yml"),
                             "-c", str(ctx), "--output-filename", "Containerfile"],
                            cwd=str(work), env=_env(), capture_output=True, text=True, timeout=300, check=False)
    assert create.returncode == 0, create.stdout + create.stderr
    containerfile = (ctx / "Containerfile").read_text()
    assert 'ARG EE_BASE_IMAGE="registry.access.redhat.com/ubi9/ubi:latest"' in containerfile
    assert 'ARG ANSIBLE_INSTALL_REFS="%s %s"' % (_pin("ansible-core"), _pin("ansible-runner")) in containerfile
    assert 'ARG PYCMD="/usr/bin/python3.11"' in containerfile
    assert "ansible-galaxy collection install $ANSIBLE_GALAXY_CLI_COLLECTION_OPTS -r requirements.yml" in containerfile
    assert "ENV ANSIBLE_GALAXY_SERVER_LIST=" in containerfile
    # The constraints come before the first pip step of the base stage.
    assert containerfile.index("ENV PIP_CONSTRAINT=/etc/gpufleet-ee-constraints.txt") < containerfile.index("pip_install")
    assert "FROM base AS final" in containerfile and 'LABEL org.opencontainers.image.title="gpufleet-sglang-ee"' in containerfile

    build_dir = ctx / "_build"
    assert _yaml(build_dir / "requirements.yml") == {"collections": [{"name": "collections/" + tarball, "type": "file"}]}
    copied = build_dir / "collections" / tarball
    assert copied.exists()
    with tarfile.open(copied) as tar:
        manifest = json.load(tar.extractfile("MANIFEST.json"))
        names = set(tar.getnames())
    info = manifest["collection_info"]
    assert (info["namespace"], info["name"], info["version"]) == (g["namespace"], g["name"], g["version"])
    for needed in ("plugins/modules/sglang_router_worker.py", "playbooks/redeploy.yml", "roles/sglang_router/tasks/remove.yml",
                   "roles/sglang_router/tasks/add.yml", "roles/sglang_server/meta/argument_specs.yml"):
        assert needed in names, needed

    # The galaxy stage, offline: `cd /build && ansible-galaxy collection install -r requirements.yml`.
    installed = tmp_path / "ee-collections"
    # --force: the image starts empty; this machine may already have the collection elsewhere.
    inst = subprocess.run([str(VENV_BIN / "ansible-galaxy"), "collection", "install", "--force", "-r", "requirements.yml",
                           "--collections-path", str(installed)],
                          cwd=str(build_dir), env=_env(ANSIBLE_GALAXY_SERVER_LIST="", ANSIBLE_GALAXY_DISABLE_GPG_VERIFY="1"),
                          capture_output=True, text=True, timeout=300, check=False)
    assert inst.returncode == 0, inst.stdout + inst.stderr
    # The builder stage then introspects the installed collections (meta/execution-environment.yml): the EE gets
    # the OpenSSH client that the playbooks need to reach the nodes, and no Python package beyond ansible-core.
    intro = subprocess.run([str(VENV_BIN / "ansible-builder"), "introspect", str(installed)], env=_env(),
                           capture_output=True, text=True, timeout=120, check=False)
    assert intro.returncode == 0, intro.stdout + intro.stderr
    deps = yaml.safe_load(intro.stdout[intro.stdout.index("---"):])
    assert deps == {"python": [], "system": ["openssh-clients [platform:rpm]  # from collection gpufleet.sglang",
                                             "openssh-client [platform:dpkg]  # from collection gpufleet.sglang"]}, deps
    ee_env = _env(ANSIBLE_COLLECTIONS_PATH=str(installed))
    doc = subprocess.run([str(VENV_BIN / "ansible-doc"), "-t", "module", "gpufleet.sglang.sglang_router_worker"],
                         env=ee_env, capture_output=True, text=True, timeout=120, check=False)
    assert doc.returncode == 0 and "drain_timeout" in doc.stdout, doc.stderr
    syntax = subprocess.run([str(VENV_BIN / "ansible-playbook"), "--syntax-check", "-i", "localhost,",
                             str(AWX / "runner-example" / "project" / "redeploy.yml")],
                            env=ee_env, capture_output=True, text=True, timeout=120, check=False)
    assert syntax.returncode == 0, syntax.stdout + syntax.stderr


# --------------------------------------------------------------------------
# Survey, variables, credential type, job template
# --------------------------------------------------------------------------

def _choices(question):
    raw = question.get("choices")
    if isinstance(raw, str):
        return [c for c in raw.split("\n") if c]
    return list(raw or [])


def test_survey_matches_the_variable_specs():
    survey = json.loads((AWX / "survey.json").read_text())
    declared = declared_variables()
    assert survey["name"] and survey["description"]
    seen = set()
    for q in survey["spec"]:
        for key in ("question_name", "type", "variable", "required"):
            assert key in q, "survey question %r lacks %s" % (q.get("variable"), key)
        var = q["variable"]
        assert var not in seen, "duplicate survey variable %s" % var
        seen.add(var)
        assert var in declared, ("survey variable %s is neither in a role's meta/argument_specs.yml nor in "
                                 "docs/awx/variables.yml" % var)
        spec = declared[var]
        where = spec["where"]
        assert q["type"] in SURVEY_TYPES, q["type"]
        assert spec.get("type", "str") in SURVEY_TYPES[q["type"]], (
            "survey type %s cannot feed %s (%s, from %s)" % (q["type"], var, spec.get("type"), where))
        assert q["type"] != "password" and not spec.get("secret") and not SECRET_NAME.search(var), (
            "%s is a secret; inject it with the credential type, not the survey" % var)
        if q["type"] == "multiplechoice":
            allowed = spec.get("choices")
            assert allowed, "%s: a multiple-choice question needs choices in %s" % (var, where)
            assert set(_choices(q)) <= {str(c) for c in allowed}, (var, _choices(q), allowed)
            if q.get("default") not in (None, ""):
                assert q["default"] in _choices(q)
        if q["type"] in ("integer", "float"):
            for bound in ("min", "max"):
                if bound in q:
                    assert isinstance(q[bound], (int, float)), (var, bound)
            if q.get("default") not in (None, ""):
                assert q.get("min", float("-inf")) <= q["default"] <= q.get("max", float("inf")), var
        if q["required"]:
            assert q.get("default") not in (None, ""), "required question %s needs a default" % var
        if "default" in spec and q.get("default") not in (None, ""):
            assert str(q["default"]) == str(spec["default"]), (
                "survey default of %s (%r) differs from %s (%r)" % (var, q["default"], where, spec["default"]))
    # The questions the job needs (target, model, speculative settings, policy, serial, router).
    for var in ("sglang_hosts", "sglang_survey_model_path", "sglang_survey_speculative_algorithm",
                "sglang_survey_speculative_num_draft_tokens", "sglang_server_spec_policy", "sglang_serial",
                "sglang_router_url"):
        assert var in seen, var


def test_declared_variables_are_read_where_listed():
    for name, opt in _yaml(AWX / "variables.yml")["variables"].items():
        assert opt.get("description"), name
        assert opt.get("type") in ("str", "int", "float", "bool", "dict", "list", "raw"), (name, opt.get("type"))
        assert opt.get("used_in"), name
        for rel in opt["used_in"]:
            path = REPO / rel
            assert path.exists(), "%s: used_in names %s, which does not exist" % (name, rel)
            assert re.search(r"\b%s\b" % re.escape(name), path.read_text()), "%s is not read in %s" % (name, rel)


def test_router_and_survey_variables_are_all_declared():
    declared = declared_variables()
    registered = {"sglang_router_worker_url_effective", "sglang_router_remove_result", "sglang_router_drain_result",
                  "sglang_router_add_result", "sglang_router_worker_config_effective"}
    for rel in ("roles/sglang_router/tasks/remove.yml", "roles/sglang_router/tasks/add.yml"):
        for name in set(re.findall(r"(?<![.\w])sglang_router_[a-z_]+", (REPO / rel).read_text())) - registered:
            assert name in declared, "%s reads %s, which docs/awx/variables.yml does not declare" % (rel, name)
    project = (AWX / "runner-example" / "project" / "redeploy.yml").read_text()
    survey_vars = {q["variable"] for q in json.loads((AWX / "survey.json").read_text())["spec"]}
    for name in set(re.findall(r"\bsglang_survey_[a-z_]+", project)):
        assert name in declared and name in survey_vars, name
    extravars = _yaml(AWX / "runner-example" / "env" / "extravars")
    for name in extravars:
        assert name in declared, "env/extravars sets %s, which is not declared" % name


def test_credential_type_injects_declared_secrets():
    ct = json.loads((AWX / "credential_type.json").read_text())
    declared = declared_variables()
    assert ct["kind"] in ("cloud", "net")
    fields = {f["id"]: f for f in ct["inputs"]["fields"]}
    assert set(ct["inputs"]["required"]) <= set(fields)
    injected = ct["injectors"]["extra_vars"]
    assert set(injected) == set(fields)
    for var, template in injected.items():
        assert template == "{{ %s }}" % var
        assert fields[var]["secret"] is True
        assert var in declared, var
        assert SECRET_NAME.search(var)
    assert "sglang_server_api_key" in injected and "sglang_router_api_key" in injected


def test_job_template_definition():
    jt = json.loads((AWX / "job_template.json").read_text())
    playbook = REPO / jt["playbook"]
    assert playbook.exists()
    assert "import_playbook: gpufleet.sglang.redeploy" in playbook.read_text()
    assert jt["limit"] == "gpu-nodes" and jt["ask_limit_on_launch"] is True
    assert jt["survey_enabled"] is True and jt["allow_simultaneous"] is False
    assert jt["job_type"] == "run" and jt["ask_job_type_on_launch"] is True
    inventory = _yaml(AWX / "runner-example" / "inventory" / "hosts.yml")
    assert "gpu-nodes" in inventory["all"]["children"]
    awx_md = (REPO / "docs" / "awx.md").read_text()
    for name in [jt["execution_environment"], jt["project"]] + jt["credentials"]:
        assert name in awx_md, "%s is not explained in docs/awx.md" % name
    ct = json.loads((AWX / "credential_type.json").read_text())
    assert ct["name"] in awx_md
