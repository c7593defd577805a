"""Differential test: the collection's mirror against the real SGLang releases (issue 11 §3).

The real wheels of 0.4.6.post5, 0.5.1, 0.5.10 and 0.5.23 are installed by env.py (with
--no-deps, next to the CPU build of torch 2.13.0; the import-only stand-ins for the CUDA
packages are explained in standins/sitecustomize.py). For each release, the seeded
configurations of cases.py (every rule of the shared case table, the classes found
against the real code, random combinations; SM90 and SM100; Llama, Qwen2, DeepseekV3,
Kimi-K2.5) are resolved by the release itself, through the collection's own oracle, and
by the mirror. The table per release is printed at the end of the run and written to
tests/output/differential-table.txt.

Run alone: ``scripts/run-tests.py differential`` (or ``pytest tests/differential``).
"""
from __future__ import annotations

import json
import pathlib
import random
import subprocess

import pytest

import cases as cases_mod
import driver
import env as env_mod

HERE = pathlib.Path(__file__).resolve().parent
VERSIONS = driver.VERSIONS
GOAL = 99.0
# What each release prints of the API key in its startup "server_args=..." line, measured on
# the real wheels with launcher_path.py: (key given on the command line, key given in --config).
# None: the release has no --config. Every release prints it: the server's log holds the key.
API_KEY_IN_STARTUP_LOG = {
    "0.4.6.post5": (True, None),
    "0.5.1": (True, None),
    "0.5.10": (True, True),
    "0.5.23": (True, True),
}


@pytest.fixture(scope="session")
def results(differential_results):
    return differential_results


@pytest.mark.parametrize("version", VERSIONS)
def test_agreement(results, version):
    result = results(version)
    summary = driver.summary(result)
    unlisted = [r for r in result["rows"] if r["diff"] is not None and not r["known"]]
    assert summary["configs"] >= 300
    assert not unlisted, "disagreements not in known_differences.json:\n" + "\n".join(
        "%s %s %s %s -> %s" % (r["case"]["id"], r["case"]["gpu"], r["case"]["model"], json.dumps(r["case"]["args"]),
                               json.dumps(r["diff"], default=str)) for r in unlisted)
    assert summary["percent"] >= GOAL, driver.table([summary])


@pytest.mark.parametrize("version", VERSIONS)
def test_the_comparison_is_not_vacuous(results, version):
    """Both outcomes occur, and the started configs compare real fields."""
    rows = results(version)["rows"]
    started = [r for r in rows if r["real_ok"]]
    refused = [r for r in rows if not r["real_ok"]]
    assert len(started) >= 100 and len(refused) >= 20
    assert sum(r["compared"] for r in started) >= 5 * len(started)
    assert {r["case"]["gpu"] for r in rows} == set(cases_mod.GPUS)
    assert {r["case"]["model"] for r in rows} == set(cases_mod.MODELS)


@pytest.mark.parametrize("version", VERSIONS)
def test_cuda_is_never_initialised(results, version):
    """The oracle's guard (torch.cuda.init / _lazy_init refused and recorded) never tripped."""
    tripped = [(r["case"]["id"], r["guard"]) for r in results(version)["rows"] if r["guard"]]
    assert tripped == []


def test_every_known_difference_still_occurs(results):
    known = driver.load_known()
    seen = set()
    for version in VERSIONS:
        for row in results(version)["rows"]:
            if row["diff"] is not None and row["known"]:
                seen.add(row["known"])
    assert [k["case"] for k in known if k["reason"] not in seen] == []


_FRESH = {}


def _fresh_runs(version, result):
    """The sample of configs and the API-key probes, through launcher_path.py (one process per release)."""
    if version in _FRESH:
        return _FRESH[version]
    release = env_mod.ensure([version])[version]
    rng = random.Random(version)
    # one GPU, so that one fresh process (one import) serves the whole sample
    started = [r for r in result["rows"] if r["real_ok"] and r["case"]["gpu"] == "sm90"]
    refused = [r for r in result["rows"] if not r["real_ok"] and r["case"]["gpu"] == "sm90"]
    sample = rng.sample(started, 6) + rng.sample(refused, 3)
    models = result["models"]
    config = pathlib.Path(models["llama"]).parent / "secret.yaml"
    config.write_text('api-key: "config-secret-42"\n')
    requests = [{"argv": driver.naive_argv(r["case"]["args"], {"model": models[r["case"]["model"]],
                                                               "draft": models.get(r["case"].get("draft"))}),
                 "gpu": r["case"]["gpu"]} for r in sample]
    requests.append({"argv": ["--model-path", models["llama"], "--api-key", "argv-secret-42"], "gpu": "sm90"})
    requests.append({"argv": ["--model-path", models["llama"], "--config", str(config)], "gpu": "sm90"})
    answers = []
    for gpu in sorted({r["gpu"] for r in requests}):
        batch = [r for r in requests if r["gpu"] == gpu]
        proc = subprocess.run([release.python, str(HERE / "launcher_path.py")],
                              input=json.dumps({"gpu": cases_mod.GPUS[gpu], "requests": batch}),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=release.env(), timeout=900,
                              check=False)
        assert proc.returncode == 0, proc.stderr[-2000:]
        for request, answer in zip(batch, json.loads(proc.stdout)):
            request["answer"] = answer
    by_argv = dict((json.dumps(r["argv"]), r["answer"]) for r in requests)
    _FRESH[version] = {"sample": [(row, by_argv[json.dumps(req["argv"])]) for row, req in zip(sample, requests)],
                       "argv_key": requests[-2]["answer"], "config_key": requests[-1]["answer"]}
    return _FRESH[version]


@pytest.mark.parametrize("version", VERSIONS)
def test_oracle_answer_equals_the_launcher_path(results, version):
    """For a sample of configs, the oracle's batched answer equals a fresh run of the launcher's path."""
    for row, fresh in _fresh_runs(version, results(version))["sample"]:
        case, answer = row["case"], row["real"]
        assert fresh["ok"] == answer["ok"], (case["id"], fresh["error"], answer["error"])
        if not fresh["ok"]:
            if answer["error"]["type"] != "ArgumentError":
                assert (fresh["error"]["type"], fresh["error"]["message"]) == (
                    answer["error"]["type"], answer["error"]["message"]), case["id"]
            continue
        # random_seed is drawn at random when unset; everything else must match
        differ = sorted(k for k in fresh["args"] if k != "random_seed" and fresh["args"][k] != answer["args"].get(k))
        assert differ == [], (case["id"], [(k, fresh["args"][k], answer["args"].get(k)) for k in differ])


@pytest.mark.parametrize("version", VERSIONS)
def test_api_key_in_the_startup_log(results, version):
    """Pins what the release prints of the API key in its startup log (figures for issue 12 §6)."""
    runs = _fresh_runs(version, results(version))
    on_argv, in_config = runs["argv_key"], runs["config_key"]
    assert on_argv["ok"]
    measured = ["argv-secret-42" in on_argv["log_line"], None]
    if in_config["ok"]:
        measured[1] = "config-secret-42" in in_config["log_line"]
        assert in_config["args"]["api_key"] == "config-secret-42"
    else:
        assert in_config["error"]["type"] == "ArgumentError"  # no --config before 0.5.10
    assert tuple(measured) == API_KEY_IN_STARTUP_LOG[version]
