"""What `gplan validate` adds to the plan check every reader runs (`plan.check_plan`): this gplan
re-prices the plan to the prediction it carries. And `--refresh`, for a plan edited on purpose: the
plan rebuilt from its inputs, configuration and stage split — ranges, ranks, placement, prediction and
digest derived again — and checked like any other."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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
                     search=plan.search)


@dataclass(frozen=True)
class Validated:
    """`gplan validate`: what the file is, and that it holds."""

    kind: str
    """plan | cluster | model"""
    name: str
    model: object = None
    """The ModelSpec of a model file."""
    refreshed: bool = False


def validate_file(path: Path, refresh: bool = False) -> Validated:
    """A model.yaml, HF config.json, cluster.yaml or plan.json, told apart by what it holds and checked as
    every command that reads it checks it; `refresh` rebuilds an edited plan from its inputs, degrees and
    split and writes it back."""
    from gplan.errors import UsageError
    from gplan.io import read_data_file
    from gplan.plan import read_plan, write_plan
    from gplan.profiles.catalogue import load_cluster, load_model

    data = read_data_file(path)
    if isinstance(data, dict) and "schema_version" in data:
        plan = refreshed(read_plan(path, check=False)) if refresh else read_plan(path)
        check_prediction(plan, str(path))
        if refresh:
            write_plan(plan, path)
        return Validated("plan", f"{plan.model.name}, {plan.parallel.label()}", refreshed=refresh)
    if refresh:
        raise UsageError("--refresh rewrites a plan.json", hint="drop --refresh for model and cluster files")
    if isinstance(data, dict) and "node_groups" in data:
        return Validated("cluster", load_cluster(str(path)).name)
    spec = load_model(str(path))
    return Validated("model", spec.name, model=spec)
