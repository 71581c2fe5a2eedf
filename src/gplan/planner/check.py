"""What `gplan validate` checks of a plan: it parses, its configuration keeps the rules, its digest
matches its inputs, its placement covers the world, and this gplan re-prices it to the prediction it
carries."""

from __future__ import annotations

from pathlib import Path

from gplan.errors import InputError
from gplan.plan import Plan, inputs_digest
from gplan.planner.build import repredict
from gplan.spec.parallel import check_config


def check_plan(plan: Plan, source: Path) -> None:
    check_config(plan.model, plan.training, plan.parallel, plan.world_size)
    if inputs_digest(plan.model, plan.cluster, plan.training) != plan.digest:
        raise InputError(f"{source}: digest does not match the plan's inputs (edited by hand?)",
                         hint="regenerate the plan with gplan search")
    if len(plan.placement.rank_to_device) != plan.world_size:
        raise InputError(f"{source}: placement has {len(plan.placement.rank_to_device)} ranks, world size is "
                         f"{plan.world_size}", hint="regenerate the plan")
    fresh = repredict(plan)
    if abs(fresh.step_time_s - plan.prediction.step_time_s) > 1e-9 * max(1.0, fresh.step_time_s):
        raise InputError(f"{source}: its prediction ({plan.prediction.step_time_s:.6g} s) differs from this gplan's "
                         f"({fresh.step_time_s:.6g} s)", hint="regenerate the plan with this gplan version")
