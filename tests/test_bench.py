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


def test_torchtitan_moe_outcomes_are_called_from_its_own_toml():
    """torchtitan issue 1789's DeepSeek-V3 16B TOML, read by gplan's torchtitan reader: as shipped (ep 8, local
    batch 8) it ran out of memory on 8 H100 and must be priced above the device; with ep 1 it completed at ~96%
    and must be priced within it, as must the run with its local batch lowered. Lambda's B200 sweep of the same
    model without checkpointing ran out of memory three times: each must be called (before torchtitan's
    unfused SwiGLU and fp32 routing weights were priced, none was)."""
    sys.path.insert(0, str(BENCH))
    try:
        import moe_zoo
    finally:
        sys.path.remove(str(BENCH))
    rows = [line for line in moe_zoo.torchtitan_lines() if line.startswith("| deepseek_v3_16b_2025-10 8×H100")]
    as_shipped, ep1, lowered = rows
    assert "| oom |" in as_shipped and "OOM called" in as_shipped
    assert "| completed |" in ep1 and "fits, as it ran" in ep1
    assert "| completed |" in lowered and "fits, as it ran" in lowered and "(assumed: local batch 4)" in lowered
    qwen3 = next(line for line in moe_zoo.torchtitan_lines() if line.startswith("| qwen3_30b_a3b"))
    assert "loss_chunks=8" in qwen3 and "fits, as it ran" in qwen3
    # every recorded torchtitan MoE outcome, Lambda's B200 sweep (PR 1993) with its three out-of-memory runs among them
    table = [line for line in moe_zoo.torchtitan_lines() if "| oom |" in line or "| completed |" in line]
    assert sum("| oom |" in line for line in table) == 4 and all("OOM called" in line for line in table if "| oom |" in line)
    assert all("fits, as it ran" in line for line in table if "| completed |" in line)
