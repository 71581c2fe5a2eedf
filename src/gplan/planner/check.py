"""What `gplan validate` adds to the plan check every reader runs (`plan.check_plan`): this gplan
re-prices the plan to the prediction it carries. And `--refresh`, for a plan edited on purpose: the
plan rebuilt from its inputs, configuration and stage split — ranges, ranks, placement, prediction and
digest derived again — and checked like any other."""

from __future__ import annotations

from gplan.errors import InputError
from gplan.plan import Plan, layouts_of
from gplan.planner.build import make_plan, repredict


def check_prediction(plan: Plan, source: str) -> None:
    fresh = repredict(plan)
    if abs(fresh.step_time_s - plan.prediction.step_time_s) > 1e-9 * max(1.0, fresh.step_time_s):
        raise InputError(f"{source}: its prediction ({plan.prediction.step_time_s:.6g} s) differs from this gplan's "
                         f"({fresh.step_time_s:.6g} s)", hint=f"re-price it: gplan validate {source} --refresh")


def refreshed(plan: Plan) -> Plan:
    """The plan rebuilt from what a user may edit (model, cluster, training, degrees, the layer counts
    and recompute of every stage); everything derived is derived again. Its search record is kept."""
    config = plan.parallel.to_config()
    return make_plan(plan.model, plan.training, plan.cluster, config, layouts_of(plan), plan.provenance.solver,
                     devices_given=plan.provenance.devices_given, profile=plan.provenance.profile,
                     search=plan.search, target=plan.target)
