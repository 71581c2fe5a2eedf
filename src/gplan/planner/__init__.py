"""The planner: candidates, cost tables, the stage-split ILP, bounds, placement — and `plan()`, the one
entry point that turns resolved inputs and search limits into the annotated Plan (the winner, its
prediction, placement and provenance, with its runner-ups recorded), as SkyPilot's `optimize()` returns
the annotated plan. The CLI only parses, calls this and renders."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from gplan.plan import Plan
    from gplan.planner.inputs import Inputs
    from gplan.planner.search import SearchResult
    from gplan.planner.space import SearchLimits


@dataclass(frozen=True)
class Planned:
    plan: Plan
    """The winner, written as plan.json; its `search.runner_ups` hold the candidates it beat."""
    search: SearchResult
    """Every ranked candidate (with the cluster it was priced on) and the search's counts."""


def plan(inputs: Inputs, limits: SearchLimits | None = None, top: int = 5, time_limit_s: float = 10.0,
         progress: Callable[[int, int, int, float | None], None] | None = None) -> Planned:
    """Search, then build the Plan of the best candidate; raises InfeasibleError when nothing fits.
    The space is bounded by what the target runs: the inputs' engine, resolved once, with its default, by
    `resolve_inputs` (or here, for inputs built by hand)."""
    from gplan.planner.build import make_plan
    from gplan.planner.inputs import with_target
    from gplan.planner.search import search, search_record
    from gplan.planner.space import SearchLimits
    from gplan.spec.parallel import captured_graphs
    from gplan.spec.targets import check_recompute_modules

    limits = limits or SearchLimits()
    inputs = with_target(inputs)  # Inputs built by hand name no engine: the one resolution gives it
    for modules in limits.recompute_modules or []:
        check_recompute_modules(inputs.model, inputs.training.engine, modules)
    result = search(inputs.model, inputs.training, inputs.cluster, inputs.devices, limits, top=top,
                    time_limit_s=time_limit_s, progress=progress)
    best = result.best
    # the graphs the winner runs with: none where the engine cannot capture its layout, as it was priced
    training = inputs.training.model_copy(update={"cuda_graphs": captured_graphs(inputs.training, best.config)})
    winner = make_plan(inputs.model, training, best.cluster, best.config, best.layouts, best.solver,
                       devices_given=inputs.devices, profile=inputs.profile, search=search_record(result, limits))
    return Planned(winner, result)
