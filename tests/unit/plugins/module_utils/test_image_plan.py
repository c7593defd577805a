"""redeploy/image_plan.py: the preflight's image step, with a fake module (the runtime answers through run_command).

Check mode never pulls: an absent image is a note ("a real run pulls it"), and a runtime that cannot say whether it has
the image is a problem naming the variable, never a traceback. The real engines are exercised in
tests/integration/test_container_manager.py.
"""
from __future__ import annotations

from ansible_collections.gpufleet.sglang.plugins.module_utils.common import names as names_mod
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import image_plan


class Module(object):
    def __init__(self, answer):
        self.answer = answer
        self.commands = []

    def get_bin_path(self, name, required=False):
        return "/usr/bin/" + name

    def run_command(self, argv):
        self.commands.append(list(argv))
        return self.answer


class Preflight(object):
    def __init__(self, answer, check_mode=True):
        self.p = {"container": {}, "image": "lmsysorg/sglang:v0.5.23", "version": "0.5.23"}
        self.module = Module(answer)
        self.names = names_mod.Names({"image": "sglang_server_image", "container": "sglang_server_container"})
        self.check_mode = check_mode
        self.problems = []
        self.notes = []

    def problem(self, text):
        self.problems.append(text)


def test_check_mode_notes_an_absent_image_and_pulls_nothing():
    pf = Preflight((125, "", "Error: lmsysorg/sglang:v0.5.23: image not known"))
    image = image_plan.check_image(pf, "podman")
    assert image["id"] is None and image["words"] == "lmsysorg/sglang:v0.5.23 (to pull)"
    assert pf.problems == [] and "a real run pulls it" in pf.notes[0]
    assert [c[1] for c in pf.module.commands] == ["image"]                 # inspect only: no pull


def test_check_mode_with_a_runtime_that_cannot_answer_is_a_problem_not_a_traceback():
    pf = Preflight((1, "", "Cannot connect to the Docker daemon at unix:///var/run/docker.sock"))
    assert image_plan.check_image(pf, "docker") is None
    assert len(pf.problems) == 1 and pf.problems[0].startswith("sglang_server_image: ") and "Cannot connect" in pf.problems[0]
    assert pf.problems[0].endswith("(nothing was touched)")


def test_a_host_manager_has_no_image_step():
    pf = Preflight((0, "", ""))
    assert image_plan.check_image(pf, "process") is None and pf.module.commands == []
