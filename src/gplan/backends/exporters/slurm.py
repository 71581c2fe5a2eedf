"""SLURM: the batch script `gplan launch --slurm` writes, as an export."""

from __future__ import annotations

from pathlib import Path

from gplan.backends.exporters import Export, stamp
from gplan.backends.launch import LaunchOptions
from gplan.backends.torch.launcher import slurm_script
from gplan.plan import Plan


def export(plan: Plan) -> Export:
    script = slurm_script(plan, Path("plan.json"), LaunchOptions(run_dir=Path("gplan-run")), header=[stamp(plan)])
    return Export({"slurm_job.sh": script})
