"""The roles claim only the node platforms that the support matrix tests (README, "Tested support matrix").

A node leg is a Debian suite that scripts/matrix-node.sh (molecule on that suite's image) or the bookworm
scenarios test: bullseye (Debian 11), bookworm (Debian 12), trixie (Debian 13). A platform in a role's
``galaxy_info.platforms`` that no stage tests (EL, Ubuntu) is a claim this file refuses.
"""
from __future__ import annotations

import pathlib
import re

import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
ROLES = sorted(p.parent.parent.name for p in (REPO / "roles").glob("*/meta/main.yml"))


def _tested_suites():
    """Debian suites with a node stage in scripts/run-tests.py (molecule-<suite>), plus bookworm (the default)."""
    stages = (REPO / "scripts" / "run-tests.py").read_text()
    return {"bookworm"} | set(re.findall(r'"molecule-([a-z]+)": \(\["bash", "scripts/matrix-node.sh"', stages))


def test_the_node_legs_are_the_three_debian_suites():
    assert _tested_suites() == {"bullseye", "bookworm", "trixie"}


@pytest.mark.parametrize("role", ROLES)
def test_a_role_claims_only_tested_node_platforms(role):
    info = yaml.safe_load((REPO / "roles" / role / "meta" / "main.yml").read_text())["galaxy_info"]
    platforms = {p["name"]: p["versions"] for p in info["platforms"]}
    assert set(platforms) == {"Debian"}, "%s claims untested platforms: %s" % (role, sorted(set(platforms) - {"Debian"}))
    assert set(platforms["Debian"]) <= _tested_suites(), (role, platforms["Debian"])
    assert info["min_ansible_version"] == "2.17"


def test_requires_ansible_is_the_lowest_tested_core_without_a_cap():
    runtime = yaml.safe_load((REPO / "meta" / "runtime.yml").read_text())
    cores = sorted(re.search(r"^ansible-core==(\d+\.\d+)\.", (p.read_text()), re.M).group(1)
                   for p in (REPO / "requirements").glob("core-*.txt"))
    lowest = min(cores, key=lambda v: tuple(int(x) for x in v.split(".")))
    assert runtime["requires_ansible"] == ">=%s.0" % lowest, runtime["requires_ansible"]
    assert {"2.20", "2.21"} <= set(cores)
