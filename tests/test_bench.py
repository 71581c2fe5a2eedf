"""Every benchmark script starts: the numbers in the docs come from them, and a script that no longer imports
(its helpers moved, a module renamed) would leave them stale without anyone noticing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
SCRIPTS = sorted(p for p in BENCH.glob("*.py") if "__main__" in p.read_text())


def test_there_are_benchmarks():
    assert {"accuracy.py", "search_speed.py", "calibration.py", "contract.py"} <= {p.name for p in SCRIPTS}


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_each_benchmark_script_starts(script, tmp_path):
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 0 and "usage" in done.stdout.lower(), done.stderr[-1500:]


def test_bench_cluster_files_price_their_rows():
    """The MoE rows kept apart on a variant the catalogue lacks are priced on its bench/data cluster file, not the
    nearest catalogue entry: the H800's halved NVLink slows the Pai thread's ep-8 exchange inside a node."""
    import csv

    sys.path.insert(0, str(BENCH))
    try:
        import moe_zoo
    finally:
        sys.path.remove(str(BENCH))
    rows = [r for r in csv.DictReader(moe_zoo.RUNS.open()) if r["cluster"] == "h800-pai"]
    assert rows and moe_zoo.cluster_of(rows[0]).endswith("h800-pai.yaml")
    on_h800 = moe_zoo.predicted_step_s(rows[0])
    on_dgx_h100 = moe_zoo.predicted_step_s(dict(rows[0], cluster="dgx-h100"))
    assert on_h800 > on_dgx_h100 * 1.05
