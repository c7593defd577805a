#!/usr/bin/env python3
"""Generate the SGLang tables of the collection from the real wheels.

Usage::

    scripts/gen-sglang-flags.py flags [--check]   # flags_data.py + the simulator's copy
    scripts/gen-sglang-flags.py docs [--check]    # the rule records of docs/reference/sglang-rules.md

``flags`` installs each release's wheel with ``--no-deps`` into
``.cache/differential/`` (the differential test's environment, see
tests/differential/env.py), runs that release's own argparse parser
(``ServerArgs.add_cli_args``) in a subprocess and writes, per field: the flag
spelling, aliases, type, nargs, action, choices and default per release, and
the first and last release that has it. ``--check`` compares instead of
writing (exit 1 on a difference).

``docs`` renders the rule records of ``plugins/module_utils/sglang/rules.py``
between the markers of docs/reference/sglang-rules.md.
"""
from __future__ import annotations

import argparse
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
RULES_DOC = REPO / "docs" / "reference" / "sglang-rules.md"
BEGIN, END = "<!-- rules:begin -->", "<!-- rules:end -->"


def _collection_import():
    sys.path.insert(0, str(REPO / ".collections"))
    link = REPO / ".collections" / "ansible_collections" / "gpufleet" / "sglang"
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(pathlib.Path("..", "..", ".."))


def render_rules_block():
    """The Markdown of every rule record (one heading per rule, anchors as rules.anchor)."""
    _collection_import()
    from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import rules

    out = [BEGIN]
    for record in rules.RECORDS:
        out.append("")
        out.append("### %s" % record["id"])
        out.append("")
        out.append("- What: %s." % record["summary"])
        out.append("- Releases: %s. Source: %s." % (", ".join(record["versions"]), record["source"]))
        if record["arg"]:
            out.append("- Field: `%s`." % record["arg"])
        why = record["why"].replace("{algorithm}", record["id"].split(".")[0].upper())
        fix = record["fix_int"] or record["fix"]
        out.append("- Why the value differs: %s. Fix: %s." % (why, fix))
        for line in record["logs"]:
            out.append("- Log (%s): `%s`" % (", ".join(line["versions"]), line["text"]))
    out.append(END)
    return "\n".join(out)


def docs(check):
    text = RULES_DOC.read_text()
    head, rest = text.split(BEGIN, 1)
    _old, tail = rest.split(END, 1)
    new = head + render_rules_block() + tail
    if check:
        if new != text:
            print("%s is out of date; run scripts/gen-sglang-flags.py docs" % RULES_DOC.relative_to(REPO))
            return 1
        return 0
    RULES_DOC.write_text(new)
    return 0


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=("flags", "docs"))
    parser.add_argument("--check", action="store_true", help="compare with the committed files instead of writing")
    opts = parser.parse_args(argv)
    if opts.what == "docs":
        return docs(opts.check)
    from gen_sglang_flags_impl import main as flags_main  # noqa: E402 - only for the flags table

    return flags_main(opts.check)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
