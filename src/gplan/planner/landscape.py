"""Every candidate of a search priced at its even split: the cloud of points behind the report's chart of
step time against memory.

The search itself prices only what its bounds let through and solves the stage split of few; the report
shows the whole space as a person would sweep it by hand — each configuration with Megatron's even split
and its recompute option on every layer (`StepModel.predict` with no layouts), fits or not. The ranked
plans are drawn over it with their solved splits, so a chosen plan can sit below the cloud: its split
is better than the even one.
"""

from __future__ import annotations

from dataclasses import dataclass

from gplan.cost_models.step import StepModel
from gplan.plan import Plan
from gplan.planner.space import SearchLimits, candidates

MOST_POINTS = 6000
"""Past this many configurations the cloud is every k-th (said in the report): the chart stays readable
and the report takes a few seconds."""


@dataclass(frozen=True)
class Point:
    label: str
    step_time_s: float
    memory_bytes: float
    """The fullest stage's memory per device."""
    budget_bytes: float
    fits: bool


@dataclass(frozen=True)
class Landscape:
    points: list[Point]
    candidates: int
    """Configurations in the space (more than `points` when thinned)."""
    note: str


def landscape(plan: Plan, most: int = MOST_POINTS) -> Landscape:
    """The plan's search space (its recorded limits; the default space for a plan written without a
    search) priced at even splits."""
    limits = SearchLimits.from_record(plan.search.limits) if plan.search else SearchLimits()
    devices = plan.provenance.devices_given or plan.world_size
    configs = list(candidates(plan.model, plan.training, plan.cluster, devices, limits))
    stride = max(1, -(-len(configs) // most))
    shared: dict = {}
    sized: dict = {}
    points = []
    for config in configs[::stride]:
        if plan.cluster.is_heterogeneous:
            cluster = plan.cluster
        else:
            cluster = sized.setdefault(config.world_size, plan.cluster.sized(config.world_size))
        p = StepModel.sharing(shared, plan.model, plan.training, cluster, config).predict()
        fullest = max(p.stages, key=lambda s: s.memory_bytes / s.memory_budget_bytes)
        points.append(Point(config.label(), p.step_time_s, fullest.memory_bytes, fullest.memory_budget_bytes, p.fits))
    note = (f"all {len(configs)} configurations" if stride == 1
            else f"every {stride}th of {len(configs)} configurations")
    return Landscape(points, len(configs), note + " of the search space, each at its even split")
