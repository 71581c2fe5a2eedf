"""SLURM: the batch script `gplan launch --slurm` writes, as an export, pointing at the exported plan
file by its absolute path (a batch script runs from SLURM's spool directory, not beside the plan).
A plan whose stages need different hardware becomes a heterogeneous job: one component per node group,
each node given a node rank of its own group (backends.slurm.hetero_slurm_script)."""

from __future__ import annotations

from pathlib import Path

from gplan.backends.exporters import Export, ExportContext, stamp
from gplan.backends.protocol import LaunchOptions
from gplan.backends.torch.launcher import notes as launch_notes
from gplan.backends.torch.launcher import check_hardware, slurm_script
from gplan.errors import InputError
from gplan.plan import Plan

VERSIONS = {"slurm": "SLURM (sbatch, srun) with torchrun c10d rendezvous (a heterogeneous job, one component per "
                      "node group, with static rendezvous when stages need different hardware)"}

TITLE = "SLURM"
"""How its users call it (docs/exporting.md's table)."""
EXACT = (
    "gplan's torch worker as `gplan launch` runs it, in an sbatch script: the launch recipe's environment and"
    " notes, the plan it names; a plan whose stages need different hardware becomes a heterogeneous job (one "
    "component per node group, `--constraint` the group's hardware name, each task's node rank read from a "
    "table by `SLURM_PROCID`, torchrun's static rendezvous)")
"""What its files run exactly as the plan priced it (docs/exporting.md's table, from bench/engine_tables.py)."""
APPROXIMATED = (
    "what the torch worker refuses is refused here too, and so is a plan priced on Ascend devices (`gplan "
    "launch --backend mindspore --slurm` writes MindSpore's batch script)")
"""What it runs differently or refuses."""


def export(plan: Plan, context: ExportContext) -> Export:
    if context.plan_path is None:
        raise InputError("the SLURM export needs the plan file's path", hint="export from a plan.json file")
    check_hardware(plan, "auto", "the SLURM export",
                   "gplan launch PLAN --backend mindspore --slurm job.sh writes its msrun batch script")
    found = launch_notes(plan)
    header = [stamp(plan, context.version), *[f"# note: {n}" for n in context.notes + found]]
    script = slurm_script(plan, context.plan_path, LaunchOptions(run_dir=Path("gplan-run")), header=header)
    return Export({"slurm_job.sh": script}, found)
