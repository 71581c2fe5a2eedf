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
