"""What a backend can run of a plan: the target's capabilities (spec.targets) checked before anything starts,
and the engine switches its worker runs without (said as notes)."""

from __future__ import annotations

from gplan.errors import InputError
from gplan.plan import Plan, layouts_of
from gplan.spec.targets import ENGINE_OPTIONS, TARGETS, lacked_options, refusals


def refuse_unsupported(plan: Plan, target: str) -> None:
    """Exit 3 before anything starts when the target cannot run the plan as priced, naming the
    capability and the search option that avoids it."""
    found = refusals(TARGETS[target], plan.model, plan.parallel, plan.parallel.num_microbatches, layouts_of(plan),
                     plan.training.precision)
    if found:
        raise InputError(f"the {target} backend cannot run this plan ({found[0].capability}): {found[0].detail}",
                         hint=found[0].hint(target, plan.target))


def lacked_switch_notes(plan: Plan, target: str) -> list[str]:
    """The plan's engine switches (TrainingSpec: CUDA graphs, the MoE overlap, bf16 gradients, FP8 parameters)
    the backend's worker does not have: it runs without them, so the measured step and memory differ."""
    lacked = lacked_options(plan.training, target, plan.parallel)
    if not lacked:
        return []
    flags = ", ".join(ENGINE_OPTIONS[o] for o in lacked)
    whose = f" ({plan.training.engine}'s)" if plan.training.engine else ""
    return [f"the plan was priced with {flags}{whose}; the {target} worker runs "
            f"without: measured step and memory differ from the plan's (search with --target {target} to match)"]
