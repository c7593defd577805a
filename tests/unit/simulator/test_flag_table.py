"""``sglang/srt/flag_table.py`` is generated: it must be exactly what the
generator renders for its own rows (no hand edits, no over-long lines)."""
from __future__ import annotations

import pathlib
import runpy

SIM_PY = pathlib.Path(__file__).resolve().parents[3] / "simulator" / "python"
TABLE = SIM_PY / "sglang" / "srt" / "flag_table.py"
GEN = SIM_PY / "sglang" / "tools" / "gen_flag_table.py"


def test_flag_table_is_the_generator_output():
    gen = runpy.run_path(str(GEN))
    table = runpy.run_path(str(TABLE))
    assert gen["render"](table["FIELDS"]) == TABLE.read_text()


def test_flag_table_lines_fit_pep8_limit():
    long_lines = [n for n, line in enumerate(TABLE.read_text().splitlines(), 1) if len(line) > 160]
    assert not long_lines
