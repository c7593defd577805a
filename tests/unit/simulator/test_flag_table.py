"""The fake server's flag table is the collection's generated table, read as data.

``scripts/gen-sglang-flags.py flags`` writes the same JSON text into
``plugins/module_utils/sglang/flags_data.py`` (for the modules) and
``simulator/python/sglang/srt/flag_table.json`` (for the fake server, which never
imports the collection's code).
"""
from __future__ import annotations

import argparse
import ast
import pathlib

from sglang.srt import flag_table, server_args

REPO = pathlib.Path(__file__).resolve().parents[3]
DATA_PY = REPO / "plugins" / "module_utils" / "sglang" / "flags_data.py"
TABLE = REPO / "simulator" / "python" / "sglang" / "srt" / "flag_table.json"


def _embedded_text():
    tree = ast.parse(DATA_PY.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and node.targets[0].id == "DATA":
            return node.value.value
    raise AssertionError("no DATA in flags_data.py")


def test_simulator_table_is_the_collection_table():
    assert TABLE.read_text() == _embedded_text().lstrip("\n")


def test_fake_parser_follows_the_release():
    old = server_args.build_parser((0, 4, 6))
    new = server_args.build_parser((0, 5, 23))
    for parser in (old, new):
        assert parser.parse_args(["--model-path", "/m", "--tp", "2"]).tp_size == 2
    assert new.parse_args(["--model-path", "/m", "--attention-backend", "trtllm_mha"]).attention_backend == "trtllm_mha"
    for argv in (["--model-path", "/m", "--attention-backend", "trtllm_mha"], ["--model-path", "/m", "--config", "x.yaml"]):
        try:
            old.parse_args(argv)
        except SystemExit as exc:
            assert exc.code == 2
        else:
            raise AssertionError("0.4.6 must reject %s" % argv)
    names = server_args.field_names((0, 5, 23))
    assert len(names) > 500 and len(set(names)) == len(names)
    assert flag_table.release_index((0, 5, 5)) == flag_table.RELEASE_TUPLES.index((0, 5, 1))
    actions = dict((a.dest, a) for a in new._actions)
    assert isinstance(actions["enable_tf32_matmul"], argparse.BooleanOptionalAction)
