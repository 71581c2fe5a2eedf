"""The docs' per-engine tables are written from the engine folders (bench/engine_tables.py): the pages hold
what it writes, and every engine — or every engine with the part a table describes — has its row."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gplan.engines import ENGINES, engine_parts

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import engine_tables  # noqa: E402


def test_the_pages_hold_the_tables_the_folders_write():
    done = subprocess.run([sys.executable, str(BENCH / "engine_tables.py"), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def first_cells(text: str) -> list[str]:
    return [line.split(" | ")[0].lstrip("| ") for line in text.splitlines()[2:]]


def test_every_engine_has_its_row_in_the_order_lists_show_them():
    assert first_cells(engine_tables.design()) == [f"`{name}`" for name in ENGINES]
    assert first_cells(engine_tables.replan()) == [e.title for e in ENGINES.values()]


def test_every_part_a_table_describes_has_its_row():
    exported = [c for c in first_cells(engine_tables.exporting()) if "`--to " in c]
    assert [c.split("`--to ")[1].split("`")[0] for c in exported][:len(engine_parts("export"))] == list(engine_parts("export"))
    assert first_cells(engine_tables.bring_your_own()) == [ENGINES[n].title for n in engine_parts("launch")]


def test_a_resharding_is_said_as_its_fields_say_it():
    from gplan.engines.profile import DCP_RESHARDS, Resharding

    pinned = Resharding("f", DCP_RESHARDS, "s", optimizer_pins=frozenset({"tp", "pp"}), unpinned_by="--flag")
    assert engine_tables.may_change(pinned).startswith("dp, vpp, cp, ep, etp, zero, split; the weights any degree")
    assert "tp, pp: the optimizer state; free with `--flag`" in engine_tables.kept_unless(pinned)
    dense = Resharding("f", DCP_RESHARDS, "s", dense_only=True)
    assert engine_tables.may_change(dense) == "every degree and the split (dense models)"
    assert engine_tables.may_change(Resharding("f", frozenset({"zero", "dp"}), "s")) == "dp, zero"
