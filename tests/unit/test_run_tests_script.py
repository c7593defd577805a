"""scripts/run-tests.py: stage summaries, the final count line, the early background stage, and lanes."""
import importlib.util
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[2]


def load(tmp_path, stages, early, lanes=None, after=None):
    spec = importlib.util.spec_from_file_location("run_tests_under_test", REPO / "scripts" / "run-tests.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.STAGES = stages
    mod.EARLY = early
    mod.LANES = lanes if lanes is not None else (tuple(stages),)
    mod.AFTER = after or {}
    mod.OUT = tmp_path / "out"
    mod.REPO = tmp_path
    return mod


def test_early_stage_runs_beside_another_and_is_reported_in_its_place(tmp_path, capsys):
    stamp, lint_end = tmp_path / "img-started", tmp_path / "lint-ended"
    mod = load(tmp_path, {
        "lint": (["bash", "-c", "sleep 1.5; date +%s.%N > " + str(lint_end)], "check"),
        "sanity": (["bash", "-c", "exit 0"], "check"),
        "image": (["bash", "-c", "date +%s.%N > " + str(stamp)], "check"),
        "molecule": (["bash", "-c", "echo boom; exit 3"], "check"),
    }, {"image": "lint"})
    assert mod.main(["lint", "sanity", "image", "molecule"]) == 1
    out = capsys.readouterr().out.splitlines()
    # the image build started while lint ran, not after sanity
    assert float(stamp.read_text()) < float(lint_end.read_text())
    # ... and its line gives its own duration (it ended long before its turn came)
    image_line = [line for line in out if re.match(r"^\[\s*ok\] image ", line)][0]
    assert float(re.search(r"\((\d+\.\d) s,", image_line).group(1)) < 1.4, image_line  # lint alone sleeps 1.5 s
    stages = [m.group(2) for m in map(re.compile(r"^\[\s*(ok|FAILED)\] (\S+)").match, out) if m]
    assert stages == ["lint", "sanity", "image", "molecule"]
    assert any(line.startswith("[FAILED] molecule") for line in out)
    assert "         | boom" in out
    assert out[-1] == "3 passed, 1 failed"


def test_early_stage_not_requested_is_not_started(tmp_path, capsys):
    stamp = tmp_path / "img-started"
    mod = load(tmp_path, {
        "lint": (["bash", "-c", "exit 0"], "check"),
        "image": (["bash", "-c", "touch %s" % stamp], "check"),
    }, {"image": "lint"})
    assert mod.main(["lint"]) == 0
    assert not stamp.exists()
    assert capsys.readouterr().out.splitlines()[-1] == "1 passed, 0 failed"


def test_lanes_run_side_by_side_and_wait_for_their_dependencies(tmp_path, capsys):
    def stamp(name, seconds=0.0):
        return ["bash", "-c", "date +%%s.%%N > %s/%s.start; sleep %s; date +%%s.%%N > %s/%s.end"
                % (tmp_path, name, seconds, tmp_path, name)]
    mod = load(tmp_path, {
        "a1": (stamp("a1", 1.0), "check"),
        "a2": (stamp("a2"), "check"),
        "b1": (stamp("b1", 1.0), "check"),
        "b2": (stamp("b2"), "check"),
        "stray": (stamp("stray"), "check"),
    }, {}, lanes=(("a1", "a2"), ("b1", "b2")), after={"b2": ("a2",)})
    assert mod.main(["a1", "a2", "b1", "b2", "stray"]) == 0

    def t(name, edge):
        return float((tmp_path / ("%s.%s" % (name, edge))).read_text())
    # the two lanes overlap: b1 started before a1 ended
    assert t("b1", "start") < t("a1", "end")
    # in a lane, in order; across lanes, after the dependency
    assert t("a2", "start") >= t("a1", "end") and t("b2", "start") >= t("a2", "end")
    # a stage in no lane runs in the first lane, after the others
    assert t("stray", "start") >= t("a2", "end")
    out = capsys.readouterr().out.splitlines()
    assert all(re.search(r"\(\d+\.\d s, CPU \d+ s; log ", line) for line in out if line.startswith("[")), out
    assert re.match(r"^all stages took \d+ s \(CPU \d+ s on \d+ cores\)$", out[-2]) and out[-1] == "5 passed, 0 failed"
