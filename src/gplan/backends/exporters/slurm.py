"""SLURM: the batch script `gplan launch --slurm` writes, as an export."""

from __future__ import annotations

from pathlib import Path

from gplan.backends.exporters import Export, stamp
from gplan.backends.torch.launcher import LaunchOptions, slurm_script
from gplan.plan import Plan


def export(plan: Plan) -> Export:
    script = slurm_script(plan, Path("plan.json"), LaunchOptions(run_dir=Path("gplan-run")))
    lines = script.splitlines()
    return Export({"slurm_job.sh": "\n".join([lines[0], stamp(plan), *lines[1:]]) + "\n"})
