"""Under gplan's own model and at the same memory allowance, the search is at least as fast as each
layout NVIDIA published for Megatron-LM on H100 (bench/published_layouts.py prints the table)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "published_layouts.py"
spec = importlib.util.spec_from_file_location("published_layouts", BENCH)
published_layouts = sys.modules.setdefault("published_layouts", importlib.util.module_from_spec(spec))
spec.loader.exec_module(published_layouts)


@pytest.mark.parametrize("case", published_layouts.LAYOUTS, ids=lambda c: f"{c.model}-{c.devices}")
def test_the_search_is_no_slower_than_the_published_layout(case):
    row = published_layouts.compare(case)
    assert row["published_fits"]  # priced at an allowance where the published layout fits
    assert row["search_s"] <= row["published_s"] * (1 + 1e-9)
    assert row["proven"]


@pytest.mark.parametrize("case", [c for c in published_layouts.MOE_LAYOUTS if c.devices <= 16],
                         ids=lambda c: f"{c.model}-{c.devices}")
def test_the_search_is_no_slower_than_the_published_moe_layout(case):
    """Experts searched jointly with the rest: ep, etp and the attention side's degrees (the larger MoE
    layouts are in bench/published_layouts.py, their numbers in the README)."""
    row = published_layouts.compare(case)
    assert row["published_fits"]
    assert row["search_s"] <= row["published_s"] * (1 + 1e-9)
