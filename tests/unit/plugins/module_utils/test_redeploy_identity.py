"""A launch's identity and the plan's action (module_utils/redeploy/identity.py).

The decide() table is checked against a model written here from the docstrings and issue 12
("a healthy server counts as deployed only when its config is the promoted known-good").
"""
from __future__ import annotations

import itertools
import json
import os
import re
import stat

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import journal
from ansible_collections.gpufleet.sglang.plugins.module_utils.redeploy import identity
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import secrets

SALT = "a1" * 32
BASE_ARGS = {"model_path": "/models/llama", "tp_size": 2, "mem_fraction_static": 0.85, "enable_metrics": True,
             "served_model_name": "llama", "port": 30000}
BASE_ENV = {"CUDA_HOME": "/usr/local/cuda", "NCCL_DEBUG": "WARN"}


def ident(args=None, env=None, version="0.5.23", manager="systemd", python="/opt/venv/bin/python", chdir=None,
          salt=SALT, secret_args=("api_key",)):
    return identity.identity(version, manager, python, BASE_ARGS if args is None else args,
                             BASE_ENV if env is None else env, chdir, salt, secret_args=secret_args)


def fp(**kw):
    return identity.fingerprint(ident(**kw))


# ---------------------------------------------------------------------------
# identity / fingerprint
# ---------------------------------------------------------------------------

def test_fingerprint_form_and_determinism():
    one, two = fp(), fp()
    assert one == two
    assert re.match(r"^sha256:[0-9a-f]{64}$", one)


def test_order_of_args_and_env_does_not_matter():
    args = dict(reversed(list(BASE_ARGS.items())))
    env = dict(reversed(list(BASE_ENV.items())))
    assert list(args) != list(BASE_ARGS)
    assert fp(args=args, env=env) == fp()
    assert ident(args=args, env=env) == ident()


@pytest.mark.parametrize("value", [16, 16.0, "16", " 16 ", "16.0"])
def test_numbers_in_any_spelling_are_the_same(value):
    assert fp(args=dict(BASE_ARGS, cuda_graph_max_bs=value)) == fp(args=dict(BASE_ARGS, cuda_graph_max_bs=16))


@pytest.mark.parametrize("value", [0.85, "0.85", "0.850"])
def test_fractions_in_any_spelling_are_the_same(value):
    assert fp(args=dict(BASE_ARGS, mem_fraction_static=value)) == fp()


def test_different_numbers_differ():
    assert fp(args=dict(BASE_ARGS, tp_size=4)) != fp()
    assert fp(args=dict(BASE_ARGS, tp_size="4")) != fp()
    assert fp(args=dict(BASE_ARGS, mem_fraction_static=0.8)) != fp()
    assert fp(args=dict(BASE_ARGS, port=-30000)) != fp()


@pytest.mark.parametrize("key", ["--tp-size", "tp-size", "tp_size", " tp_size "])
def test_arg_names_in_any_spelling_are_the_same(key):
    args = dict((k, v) for k, v in BASE_ARGS.items() if k != "tp_size")
    args[key] = 2
    assert fp(args=args) == fp()


@pytest.mark.parametrize("unset", [False, None, []])
def test_false_none_and_empty_list_mean_unset(unset):
    assert fp(args=dict(BASE_ARGS, enable_dp_attention=unset)) == fp()
    assert "enable_dp_attention" not in ident(args=dict(BASE_ARGS, enable_dp_attention=unset))["args"]


def test_set_values_are_not_unset():
    assert fp(args=dict(BASE_ARGS, enable_dp_attention=True)) != fp()
    assert fp(args=dict(BASE_ARGS, disable_radix_cache=True)) != fp(args=dict(BASE_ARGS, disable_radix_cache=False))
    assert fp(args=dict(BASE_ARGS, chunked_prefill_size=0)) != fp()       # 0 is a value, not "unset"
    assert fp(args=dict(BASE_ARGS, json_model_override_args={"a": 1})) != fp()


def test_lists_and_dicts_compare_element_wise():
    a = fp(args=dict(BASE_ARGS, cuda_graph_bs=[1, 2, 4], json_model_override_args={"x": 1, "y": "2"}))
    b = fp(args=dict(BASE_ARGS, cuda_graph_bs=["1", 2.0, "4"], json_model_override_args={"y": 2, "x": 1.0}))
    assert a == b
    assert fp(args=dict(BASE_ARGS, cuda_graph_bs=[4, 2, 1])) != fp(args=dict(BASE_ARGS, cuda_graph_bs=[1, 2, 4]))


def test_strings_are_compared_stripped_and_case_sensitive():
    assert fp(args=dict(BASE_ARGS, served_model_name=" llama ")) == fp()
    assert fp(args=dict(BASE_ARGS, served_model_name="Llama")) != fp()


def test_env_values_as_text():
    assert fp(env=dict(BASE_ENV, OMP_NUM_THREADS=8)) == fp(env=dict(BASE_ENV, OMP_NUM_THREADS="8"))
    assert fp(env=dict(BASE_ENV, NCCL_DEBUG="INFO")) != fp()
    assert fp(env=dict(BASE_ENV, EXTRA=None)) == fp(env=dict(BASE_ENV, EXTRA=""))


@pytest.mark.parametrize("part, value", [("version", "0.5.10"), ("manager", "process"), ("python", "/usr/bin/python3"),
                                         ("chdir", "/srv/sglang")])
def test_each_top_level_part_enters(part, value):
    assert fp(**{part: value}) != fp()


def test_no_chdir_is_empty_chdir():
    assert fp(chdir=None) == fp(chdir="")


SECRET = "sk-THE-api-key-value-123"
HF = "hf_TheHuggingFaceToken987"


def secret_ident(api_key=SECRET, hf=HF, salt=SALT, **kw):
    return ident(args=dict(BASE_ARGS, api_key=api_key), env=dict(BASE_ENV, HF_TOKEN=hf, MY_DB_PASSWORD="pw-42"),
                 salt=salt, **kw)


def test_secret_values_enter_only_as_salted_digests():
    record = secret_ident()
    blob = json.dumps(record)
    for value in (SECRET, HF, "pw-42"):
        assert value not in blob
    assert record["args"]["api_key"].startswith("hmac-sha256:")
    assert record["env"]["HF_TOKEN"].startswith("hmac-sha256:")
    assert record["env"]["MY_DB_PASSWORD"].startswith("hmac-sha256:")
    assert record["env"]["CUDA_HOME"] == "/usr/local/cuda"              # not secret: kept as is
    assert record["args"]["served_model_name"] == "llama"


def test_digest_is_not_a_plain_hash_of_the_secret():
    import hashlib
    digest = secret_ident()["args"]["api_key"].split(":", 1)[1]
    for plain in (hashlib.sha256(SECRET.encode()).hexdigest(), hashlib.md5(SECRET.encode()).hexdigest()):  # noqa: S324
        assert digest not in plain


def test_changed_secret_changes_fingerprint():
    base = identity.fingerprint(secret_ident())
    assert identity.fingerprint(secret_ident()) == base
    assert identity.fingerprint(secret_ident(api_key=SECRET + "x")) != base
    assert identity.fingerprint(secret_ident(hf=HF + "x")) != base


def test_other_salt_changes_fingerprint_of_secrets():
    assert identity.fingerprint(secret_ident(salt="b2" * 32)) != identity.fingerprint(secret_ident())


def test_salt_does_not_matter_without_secrets():
    assert fp(salt="b2" * 32) == fp()


def test_secret_args_by_name_and_by_list():
    record = ident(args=dict(BASE_ARGS, custom_field="open-sesame", admin_api_key="adm-1"),
                   secret_args=("api_key", "custom_field"))
    assert "open-sesame" not in json.dumps(record) and "adm-1" not in json.dumps(record)
    assert record["args"]["custom_field"].startswith("hmac-sha256:")
    assert record["args"]["admin_api_key"].startswith("hmac-sha256:")       # a secret name needs no listing


def test_secret_flag_spelling_is_digested():
    record = ident(args=dict(BASE_ARGS, **{"--api-key": SECRET}))
    assert SECRET not in json.dumps(record)
    assert record == ident(args=dict(BASE_ARGS, api_key=SECRET))


def test_secret_number_spellings():
    assert identity.fingerprint(secret_ident(api_key=1234)) == identity.fingerprint(secret_ident(api_key="1234"))


# ---------------------------------------------------------------------------
# read_salt
# ---------------------------------------------------------------------------

def test_read_salt_missing_without_create(tmp_path):
    assert identity.read_salt(str(tmp_path)) == ""
    assert os.listdir(str(tmp_path)) == []


def test_read_salt_create_and_reuse(tmp_path):
    state = tmp_path / "state" / "deep"
    value = identity.read_salt(str(state), create=True)
    assert re.match(r"^[0-9a-f]{64}$", value)
    path = state / identity.SALT_NAME
    assert stat.S_IMODE(os.stat(str(path)).st_mode) == 0o600
    assert path.read_text().strip() == value
    assert identity.read_salt(str(state)) == value
    assert identity.read_salt(str(state), create=True) == value
    assert sorted(os.listdir(str(state))) == [identity.SALT_NAME]


def test_read_salt_each_node_its_own(tmp_path):
    assert identity.read_salt(str(tmp_path / "a"), create=True) != identity.read_salt(str(tmp_path / "b"), create=True)


def test_read_salt_empty_file_is_replaced_on_create(tmp_path):
    (tmp_path / identity.SALT_NAME).write_text("\n")
    assert identity.read_salt(str(tmp_path)) == ""
    value = identity.read_salt(str(tmp_path), create=True)
    assert len(value) == 64 and identity.read_salt(str(tmp_path)) == value


# ---------------------------------------------------------------------------
# differences / format_difference
# ---------------------------------------------------------------------------

def test_no_differences_for_equal_identities():
    assert identity.differences(ident(), ident(args=dict(reversed(list(BASE_ARGS.items()))))) == []


def test_differences_name_each_field():
    before = ident()
    after = ident(args=dict(BASE_ARGS, tp_size=4, enable_metrics=False, chunked_prefill_size=4096),
                  env=dict(BASE_ENV, NCCL_DEBUG="INFO"), version="0.5.10")
    diffs = identity.differences(before, after)
    by_field = dict((d["field"], (d["before"], d["after"])) for d in diffs)
    assert by_field == {
        "version": ("0.5.23", "0.5.10"),
        "args.tp_size": (2.0, 4.0),
        "args.enable_metrics": (True, None),
        "args.chunked_prefill_size": (None, 4096.0),
        "env.NCCL_DEBUG": ("WARN", "INFO"),
    }
    text = "; ".join(identity.format_difference(d) for d in diffs)
    assert "args.tp_size: 2 -> 4" in text
    assert "args.enable_metrics: True -> unset" in text
    assert "args.chunked_prefill_size: unset -> 4096" in text
    assert "version: 0.5.23 -> 0.5.10" in text


def test_differences_with_missing_identity():
    diffs = identity.differences(None, ident())
    assert {"field": "version", "before": None, "after": "0.5.23"} in diffs
    assert {"field": "args.tp_size", "before": None, "after": 2.0} in diffs


def test_secret_differences_are_masked():
    before = secret_ident()
    after = secret_ident(api_key="sk-another-one", hf=HF)
    diffs = identity.differences(before, after)
    assert [d["field"] for d in diffs] == ["args.api_key"]
    text = "; ".join(identity.format_difference(d) for d in diffs) + json.dumps(diffs)
    for leaked in (SECRET, "sk-another-one", before["args"]["api_key"], after["args"]["api_key"], "hmac-sha256"):
        assert leaked not in text
    assert secrets.MASK in text and "changed" in text


def test_secret_added_or_removed_is_masked():
    plain = ident()
    with_key = ident(args=dict(BASE_ARGS, api_key=SECRET))
    added = identity.differences(plain, with_key)
    assert added[0]["field"] == "args.api_key" and added[0]["before"] is None and secrets.MASK in added[0]["after"]
    removed = identity.differences(with_key, plain)
    assert removed[0]["before"] == secrets.MASK and removed[0]["after"] is None
    for diffs in (added, removed):
        text = "; ".join(identity.format_difference(d) for d in diffs)
        assert SECRET not in text and "hmac" not in text and "unset" in text


def test_format_difference_values():
    diffs = [{"field": "args.f%02d" % i, "before": i, "after": i + 1} for i in range(2)]
    assert [identity.format_difference(d) for d in diffs] == ["args.f00: 0 -> 1", "args.f01: 1 -> 2"]
    assert identity.format_difference({"field": "args.tp_size", "before": 8.0, "after": -1.0}) == "args.tp_size: 8 -> -1"
    nested = identity.format_difference({"field": "args.x", "before": [1.0, 2.5], "after": {"b": 1, "a": 2}})
    assert nested == 'args.x: [1.0, 2.5] -> {"a": 2, "b": 1}'


# ---------------------------------------------------------------------------
# decide: the table
# ---------------------------------------------------------------------------

INTENDED = "sha256:intended"
OLD = "sha256:old"
UNSETTLED = [s for s in journal.STEPS if s not in journal.SETTLED]
# Steps after which the interrupted run may have started the server that runs now.
MAY_HAVE_LAUNCHED = set(journal.PAST_TEARDOWN)

RUNNING = {
    # name: (running, known_good_fp)
    "nothing": (None, INTENDED),
    "nothing, no known-good": (None, None),
    "intended promoted": ({"pid": 100, "fingerprint": INTENDED, "source": "managed", "healthy": True}, INTENDED),
    "intended promoted, health unknown": ({"pid": 100, "fingerprint": INTENDED, "source": "managed", "healthy": None},
                                          INTENDED),
    "intended unpromoted": ({"pid": 100, "fingerprint": INTENDED, "source": "managed", "healthy": True}, OLD),
    "intended, no known-good": ({"pid": 100, "fingerprint": INTENDED, "source": "managed", "healthy": True}, None),
    "other config": ({"pid": 100, "fingerprint": OLD, "source": "managed", "healthy": True}, OLD),
    "unrecorded": ({"pid": 100, "fingerprint": None, "source": "adopted (port owner)", "healthy": None}, OLD),
    "intended unhealthy": ({"pid": 100, "fingerprint": INTENDED, "source": "managed", "healthy": False}, INTENDED),
}

JOURNALS = [("none", {})]
JOURNALS += [("settled at %s" % s, {"run_id": "r-prev", "step": s, "candidate": {"fingerprint": INTENDED}})
             for s in sorted(journal.SETTLED)]
for _step in UNSETTLED:
    JOURNALS.append(("interrupted at %s, candidate intended" % _step,
                     {"run_id": "r-prev", "step": _step, "candidate": {"pid": 100, "fingerprint": INTENDED}}))
    JOURNALS.append(("interrupted at %s, candidate other" % _step,
                     {"run_id": "r-prev", "step": _step, "candidate": {"pid": 90, "fingerprint": "sha256:third"}}))
    JOURNALS.append(("interrupted at %s, no candidate" % _step, {"run_id": "r-prev", "step": _step}))


def model(running_name, entry, force):
    """(action, recovering) as the docstrings and issue 12 describe them."""
    running, kg = RUNNING[running_name]
    interrupted = bool(entry.get("run_id")) and entry.get("step") not in journal.SETTLED
    if running is None:
        return identity.START, interrupted
    if force:
        return identity.RESTART, interrupted
    if running["fingerprint"] != INTENDED or running["fingerprint"] is None:
        return identity.RESTART, interrupted
    candidate = (entry.get("candidate") or {}).get("fingerprint")
    launched = entry.get("step") in MAY_HAVE_LAUNCHED or (entry.get("step") == journal.INTERRUPTED and candidate)
    fresh = interrupted and candidate == INTENDED and launched
    if kg == INTENDED and not fresh and running["healthy"] is not False:
        return identity.NONE, False
    # Unpromoted, started by the interrupted run (never passed the smoke gate), or not answering its
    # health check: gate it again (health, config check, smoke), then promote or roll back.
    return identity.VERIFY, interrupted


def _table():
    for (rname, (jname, entry), force) in itertools.product(sorted(RUNNING), JOURNALS, (False, True)):
        if (entry.get("step") == journal.INTERRUPTED and rname.startswith("intended promoted") and not force
                and (entry.get("candidate") or {}).get("fingerprint") == INTENDED):
            continue    # see test_interrupted_step_after_launch_of_promoted_config_is_verified (a bug)
        yield pytest.param(rname, entry, force, id="%s | %s%s" % (rname, jname, " | force" if force else ""))


@pytest.mark.parametrize("rname, entry, force", list(_table()))
def test_decide_table(rname, entry, force):
    running, kg = RUNNING[rname]
    got = identity.decide(INTENDED, running, kg, entry, force)
    action, recovering = model(rname, entry, force)
    interrupted = journal.unfinished(entry)
    assert set(got) == {"action", "why", "recovering", "interrupted"}
    assert got["action"] == action, got["why"]
    assert got["recovering"] is recovering
    assert got["interrupted"] is interrupted
    assert got["action"] in identity.ACTIONS
    assert got["why"]
    # The reason names the interrupted run where the action continues from it.
    if interrupted and not force and (got["action"] == identity.START or (
            got["action"] == identity.VERIFY and running["healthy"] is not False)):
        assert "r-prev" in got["why"] and entry["step"] in got["why"]
    if got["action"] == identity.VERIFY and running["healthy"] is False and kg == INTENDED:
        assert "health check" in got["why"] or "r-prev" in got["why"]
    if got["action"] == identity.RESTART and not force and running["fingerprint"] != INTENDED:
        assert str(running["pid"]) in got["why"]
        if interrupted:
            assert "r-prev" in got["why"]
    if force and running is not None:
        assert "force" in got["why"]


def test_decide_reasons_distinguish_the_cases():
    healthy = {"pid": 7, "fingerprint": INTENDED, "source": "managed", "healthy": True}
    none = identity.decide(INTENDED, healthy, INTENDED, {})
    assert "promoted" in none["why"]
    unpromoted = identity.decide(INTENDED, healthy, OLD, {})
    assert "never promoted" in unpromoted["why"] and "smoke" in unpromoted["why"]
    no_kg = identity.decide(INTENDED, healthy, None, {})
    assert "no known-good" in no_kg["why"]
    adopted = identity.decide(INTENDED, {"pid": 8, "fingerprint": None, "source": "adopted", "healthy": True}, OLD, {})
    assert "not started by this collection" in adopted["why"] and "8" in adopted["why"]
    unhealthy = identity.decide(INTENDED, dict(healthy, healthy=False), INTENDED, {})
    assert unhealthy["action"] == identity.VERIFY and "health check" in unhealthy["why"]
    start = identity.decide(INTENDED, None, INTENDED, {"run_id": "r9", "step": journal.TORN_DOWN})
    assert "left no server running" in start["why"] and "r9" in start["why"]


def test_decide_issue_12_case_1_interrupted_candidate_is_not_reported_fine():
    # SIGKILL during the health wait of a candidate that is the intended config: the rerun must
    # finish the verification, never say "unchanged".
    entry = {"run_id": "r1", "step": journal.LAUNCHING, "candidate": {"pid": 55, "fingerprint": INTENDED},
             "known_good": {"fingerprint": OLD}}
    got = identity.decide(INTENDED, {"pid": 55, "fingerprint": INTENDED, "source": "managed", "healthy": True}, OLD, entry)
    assert got["action"] == identity.VERIFY and got["recovering"] and got["interrupted"]
    assert "r1" in got["why"] and "smoke" in got["why"]


# ===========================================================================
# BUGS FOUND (tests below fail until the lead's fix; see H6's report)
# ===========================================================================

def test_interrupted_step_after_launch_of_promoted_config_is_verified():
    # A forced restart of the promoted config: the candidate (== intended == known-good) was
    # launched, then the module got SIGTERM in the health wait and wrote step "interrupted"
    # (replace.py record_failure(INTERRUPTED)). A SIGKILL at the same moment leaves step
    # "launching", for which decide() says VERIFY; the SIGTERM case must not say NONE.
    running = {"pid": 100, "fingerprint": INTENDED, "source": "managed", "healthy": True}
    killed = {"run_id": "r-prev", "step": journal.LAUNCHING, "candidate": {"pid": 100, "fingerprint": INTENDED}}
    termed = dict(killed, step=journal.INTERRUPTED)
    assert identity.decide(INTENDED, running, INTENDED, killed)["action"] == identity.VERIFY
    got = identity.decide(INTENDED, running, INTENDED, termed)
    assert got["action"] == identity.VERIFY, got["why"]
    assert got["recovering"] is True
