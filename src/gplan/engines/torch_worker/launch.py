"""gplan's own worker's launches read: a SLURM script or torchrun line of `gplan.backends.torch.worker`
with the plan it names, or a Kubernetes export whose ConfigMap carries the plan — priced as written."""

from __future__ import annotations

import re
from pathlib import Path

from gplan.errors import InputError
from gplan.planner.launch import Launch
from gplan.spec.model import ModelSpec

READS = "gplan's own SLURM and Kubernetes exports"

FROM_READS = (
    "the plan a SLURM script names or a Kubernetes ConfigMap carries")
"""What `--from` reads (docs/bring-your-own-runs.md's table, from bench/engine_tables.py)."""
CALIBRATE_READS = (
    "`run_report.json` of `gplan launch`")
"""What `gplan calibrate` reads (— : nothing)."""
"""What this reader takes, as gplan says when a file is no launch it reads."""
PRECEDENCE = -1
"""Asked first: a gplan export is read as the plan it runs, whatever else the script holds."""
WORKER_LINE = re.compile(r"gplan\.backends\.torch\.worker\b.*?--plan\s+(\S+)")


def claims(path: Path, text: str) -> bool:
    return bool(WORKER_LINE.search(text)) or ("kind: ConfigMap" in text and "plan.json" in text)


def read(path: Path, model: ModelSpec | None, text: str) -> Launch:
    plan = gplan_plan_of(path, text)
    if plan is None:
        raise InputError(f"--from {path}: a gplan export that carries no plan", hint="export the plan again")
    if model is not None and plan.model.total_params() != model.total_params():
        raise InputError(f"--from {path}: it runs {plan.model.name}, not {model.name}",
                         hint="name the model the launch trains")
    return Launch(source=str(path), engine="torch", given={}, gbs=plan.training.gbs,
                  seq_length=plan.training.seq_length, precision=plan.training.precision, stage_sizes=None,
                  recompute_layers=None, world_size=plan.world_size, plan=plan, model=plan.model)


def gplan_plan_of(path: Path, text: str):
    """The plan a launch of gplan's own worker runs: the `--plan FILE` of a SLURM script (or any torchrun
    line of `gplan.backends.torch.worker`), the plan.json a Kubernetes ConfigMap carries; None otherwise."""
    from gplan.plan import Plan, check_plan, read_plan

    named = WORKER_LINE.search(text)
    if named:
        file = Path(named.group(1).strip("\"'"))
        return read_plan(file if file.is_absolute() else path.parent / file)
    if "kind: ConfigMap" in text and "plan.json" in text:
        import json

        import yaml

        for document in yaml.safe_load_all(text):
            carried = ((document or {}).get("data") or {}).get("plan.json")
            if carried:
                plan = Plan.model_validate(json.loads(carried))
                check_plan(plan, str(path))
                return plan
    return None
