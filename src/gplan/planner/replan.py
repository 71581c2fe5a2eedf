"""Re-planning on the devices left: `gplan replan`, `search --what-if-lost`, `launch --elastic`.

A node lost for hours leaves two questions that only a planner that also knows the checkpoint can answer
together: the best layout on the devices left, and which layouts the run's checkpoint can be loaded into.
The second is the engine's (`EngineProfile.resharding`): degrees it cannot change stay as they were
(pinned in the search's limits, named), the rest are searched as `gplan search` would. The model, the
training options and the target are kept; so is the global batch when a layout on the devices left can
take it, else the nearest batch one can (said so).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gplan.errors import InfeasibleError, InputError
from gplan.plan import Plan, layouts_of
from gplan.planner.inputs import Inputs
from gplan.planner.space import SearchLimits
from gplan.engines import ENGINES
from gplan.engines.profile import UNKNOWN_RESHARDING
from gplan.engines.profile import LAYOUT_DEGREES, Resharding

BATCH_TRIES = 8
"""Batches tried on each side of the plan's when no layout on the devices left takes it."""


@dataclass(frozen=True)
class Replanned:
    old: Plan
    new: Plan
    devices: int
    pinned: dict[str, str]
    """Degree -> why it was kept (the checkpoint format cannot change it)."""
    changed: dict[str, tuple]
    """Degree (or `split`) -> (old, new): what the checkpoint is resharded over."""
    gbs_note: str
    resharding: Resharding
    optimizer_resharded: bool

    @property
    def tokens_kept(self) -> float:
        return self.new.prediction.tokens_per_s / self.old.prediction.tokens_per_s


def devices_left(plan: Plan, lost_nodes: int) -> int:
    """The devices the plan offered (or ran on) less `lost_nodes` of its cluster's nodes."""
    return (plan.provenance.devices_given or plan.world_size) - lost_nodes * plan.cluster.primary.devices_per_node


def resharding_of(plan: Plan) -> Resharding:
    """What the plan's checkpoints load into: its target's (else its engine's) rule; a plan naming neither
    (built by hand) is launched on gplan's own worker for its hardware — the backend `gplan launch` picks
    for it (spec.targets.default_target) — whose checkpoints are that worker's."""
    from gplan.spec.targets import default_target

    name = plan.training.engine or default_target(plan.cluster.primary.hardware.kind)
    return ENGINES[name].resharding if name in ENGINES else UNKNOWN_RESHARDING


def pins(plan: Plan, optimizer_reshardable: bool = False) -> dict[str, str]:
    """The degrees the plan's checkpoint cannot change, each with the reason."""
    rule = resharding_of(plan)
    why: dict[str, str] = {}
    if rule.dense_only and plan.model.is_moe:
        return {d: f"{rule.format} does not convert routed experts" for d in (*LAYOUT_DEGREES, "split")}
    for degree in (*LAYOUT_DEGREES, "split"):
        if degree not in rule.free:
            why[degree] = f"{rule.format} cannot change it"
        elif degree in rule.optimizer_pins and not optimizer_reshardable:
            why[degree] = (f"the optimizer state of {rule.format} reshards over dp only"
                           + (f" (saved with {rule.unpinned_by}: pass --optimizer-reshardable)" if rule.unpinned_by else ""))
    return why


def replan(plan: Plan, devices: int, optimizer_reshardable: bool = False, time_limit_s: float = 10.0) -> Replanned:
    """The best plan for `devices` that the plan's checkpoint can be loaded into."""
    from gplan.planner import plan as search_plan

    if devices < 1:
        raise InputError(f"{devices} devices left", hint="a plan needs at least one device")
    if plan.cluster.is_heterogeneous:
        raise InputError("replan on a heterogeneous cluster", hint="edit the node counts of the cluster file and "
                         "run gplan search on it")
    kept = pins(plan, optimizer_reshardable)
    limits = SearchLimits.from_record(plan.search.limits) if plan.search else SearchLimits()
    limits = replace(limits, dp=None)
    c = plan.parallel
    for degree in kept:
        if degree in ("dp", "split"):
            continue
        if degree == "zero":
            limits = replace(limits, zero=[c.zero])
        else:
            limits = replace(limits, **{degree: [getattr(c, degree)]})
    if "dp" in kept and devices != plan.world_size:
        raise InputError(f"{resharding_of(plan).format} keeps every degree ({kept['dp']}): the run cannot continue "
                         f"on {devices} devices", hint="resume on the plan's own devices, or restart from the weights")
    inputs = Inputs(plan.model, plan.training, plan.cluster.sized(devices), devices, profile=plan.provenance.profile)
    planned, note = _search_with_batch(search_plan, inputs, limits, plan.training.gbs, time_limit_s)
    new = planned.plan
    if "split" in kept and new.parallel.pp == c.pp and _split(new) != _split(plan):
        new = _with_split(new, plan)
    changed = layout_changes(plan, new)
    optimizer = bool(changed)
    return Replanned(plan, new, devices, kept, changed, note, resharding_of(plan), optimizer)


def _search_with_batch(search_plan, inputs: Inputs, limits: SearchLimits, gbs: int, time_limit_s: float):
    """The search at the plan's batch; where nothing on these devices takes it, the nearest batch that
    something does (closest first, the smaller on a tie)."""
    try:
        return search_plan(inputs, limits, top=3, time_limit_s=time_limit_s), ""
    except InfeasibleError as first:
        tried = sorted({b for k in range(1, BATCH_TRIES + 1) for b in (gbs - k, gbs + k) if b >= 1},
                       key=lambda b: (abs(b - gbs), b))
        for batch in tried:
            other = replace(inputs, training=inputs.training.model_copy(update={"gbs": batch}))
            try:
                planned = search_plan(other, limits, top=3, time_limit_s=time_limit_s)
            except InfeasibleError:
                continue
            return planned, (f"global batch {gbs} → {batch}: no layout on {inputs.devices} devices takes {gbs} "
                             f"({first.message})")
        raise


def _split(plan: Plan) -> list[int]:
    return [s.layer_end - s.layer_start for s in plan.stages]


def _with_split(new: Plan, old: Plan) -> Plan:
    from gplan.planner.build import make_plan

    return make_plan(new.model, new.training, new.cluster, new.parallel.to_config(), layouts_of(old),
                     devices_given=new.provenance.devices_given)


def layout_changes(old: Plan, new: Plan) -> dict[str, tuple]:
    """What differs between two plans' layouts: each degree, and the layers per stage."""
    changes = {d: (getattr(old.parallel, d), getattr(new.parallel, d)) for d in LAYOUT_DEGREES
               if getattr(old.parallel, d) != getattr(new.parallel, d)}
    if _split(old) != _split(new):
        changes["split"] = ("/".join(map(str, _split(old))), "/".join(map(str, _split(new))))
    return changes


@dataclass(frozen=True)
class LostRow:
    nodes_lost: int
    devices: int
    replanned: Replanned | None
    why_not: str = ""


def failure_table(plan: Plan, nodes: list[int], optimizer_reshardable: bool = False) -> list[LostRow]:
    """For each number of nodes lost: the best layout on the devices left, or why there is none."""
    rows = []
    for lost in nodes:
        devices = devices_left(plan, lost)
        try:
            rows.append(LostRow(lost, devices, replan(plan, devices, optimizer_reshardable, time_limit_s=5.0)))
        except (InputError, InfeasibleError) as exc:
            rows.append(LostRow(lost, devices, None, exc.message))
    return rows
