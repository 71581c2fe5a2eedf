"""`gplan export`: the plan in the form another engine takes (no engine is imported here).

Every target is a function `plan -> Export` (files by name, and notes on what the engine cannot
express exactly); every file carries the plan's digest so a stale export is visible.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from gplan.plan import Plan


@dataclass(frozen=True)
class Export:
    files: dict[str, str]
    """File name -> contents."""
    notes: list[str] = field(default_factory=list)
    """What the target cannot express exactly, and what was chosen instead."""


def stamp(plan: Plan, comment: str = "#") -> str:
    """The header line every exported file starts with."""
    return (f"{comment} gplan export of plan {plan.digest} ({plan.model.name}: {plan.parallel.label()}, "
            f"predicted {plan.prediction.step_time_s:.3f} s/step)")


def targets() -> dict[str, Callable[[Plan], Export]]:
    from gplan.backends.exporters import deepspeed, kubernetes, megatron, mindformers, slurm, torchtitan

    return {"megatron": megatron.export, "torchtitan": torchtitan.export, "deepspeed": deepspeed.export,
            "mindformers": mindformers.export, "k8s": kubernetes.export, "slurm": slurm.export}


def stage_sizes(plan: Plan) -> list[int]:
    return [s.layer_end - s.layer_start for s in plan.stages]


def recompute_counts(plan: Plan, option: str) -> list[int]:
    """Layers per pipeline rank that the plan recomputes with `option`."""
    return [sum(c.count for c in s.layers if c.recompute == option) for s in plan.stages]


def nodes_of(plan: Plan) -> tuple[int, int]:
    """(nodes, processes per node) the plan's world size takes on its cluster."""
    per_node = min(plan.world_size, plan.cluster.primary.devices_per_node)
    return -(-plan.world_size // per_node), per_node
