"""The rule records (plugins/module_utils/sglang/rules.py) and their reference page."""
from __future__ import annotations

import pathlib
import re
import runpy

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import flags, resolve, rules, versions

REPO = pathlib.Path(__file__).resolve().parents[4]
DOC = REPO / "docs" / "reference" / "sglang-rules.md"
PACKAGE = REPO / "plugins" / "module_utils" / "sglang"


def test_reference_page_is_generated_from_the_records():
    gen = runpy.run_path(str(REPO / "scripts" / "gen-sglang-flags.py"))
    text = DOC.read_text()
    block = text[text.index(gen["BEGIN"]):text.index(gen["END"]) + len(gen["END"])]
    assert block == gen["render_rules_block"]()


def test_every_record_has_a_heading_and_a_valid_shape():
    text = DOC.read_text()
    for record in rules.RECORDS:
        assert "\n### %s\n" % record["id"] in text
        assert rules.doc_ref(record["id"]) == "docs/reference/sglang-rules.md#" + record["id"].replace(".", "")
        assert set(record["versions"]) <= set(versions.DOCUMENTED_VERSIONS) and record["versions"]
        assert record["summary"] and record["why"] and record["fix"] and record["source"]
        assert record["arg"] is None or record["arg"] in flags.FLAGS
        for line in record["logs"]:
            assert line["arg"] in flags.FLAGS and line["text"]
            assert set(line["versions"]) <= set(record["versions"]), (record["id"], line)
    assert len(rules.BY_ID) == len(rules.RECORDS)


def test_code_cites_existing_sections():
    sections = set(re.findall(r"^## §(\d+) ", DOC.read_text(), re.M))
    cited = set()
    for path in list(PACKAGE.glob("*.py")) + [REPO / "plugins" / "filter" / "sglang.py"]:
        cited.update(re.findall(r"sglang-rules\.md §(\d+)", path.read_text()))
    assert cited and cited <= sections, cited - sections


@pytest.mark.parametrize("rule_id", sorted(rules.BY_ID))
def test_explain_uses_the_adjustment(rule_id):
    adj = {"arg": rules.BY_ID[rule_id]["arg"] or "speculative_num_steps", "from": 3, "to": 1, "rule": rule_id}
    line = resolve.explain(adj["arg"], 3, 1, version="0.5.23", adjustments=[adj])
    assert line.startswith("%s: intended 3, running 1 \u2014 " % adj["arg"])
    assert rules.rule_text(rule_id, adj["arg"], 3, 1) in line


def test_explain_falls_back_when_the_value_does_not_fit():
    adj = {"arg": "speculative_num_draft_tokens", "from": 16, "to": 2, "rule": "eagle.topk1_draft_tokens"}
    assert "set speculative_num_steps: 15" in resolve.explain(adj["arg"], 16, 2, adjustments=[adj])
    # the server runs something the rule did not produce: no rule claims it
    line = resolve.explain(adj["arg"], 16, 7, args={"speculative_eagle_topk": 4}, adjustments=[adj])
    assert "no known SGLang 0.5.23 rule" in line
    line = resolve.explain("max_running_requests", None, 48, version="0.5.10", adjustments=[])
    assert "resets an unset max_running_requests to 48" in line
    line = resolve.explain("api_key", "a", "b", adjustments=[])
    assert "intended ********, running ********" in line and "a," not in line
