"""Oracles and baselines: exhaustive search of the stage split (for tests on small instances), and
the Megatron-style heuristic plan that users write by hand (for benchmarks)."""

from __future__ import annotations

import itertools

from gplan.cost_models.step import StepModel
from gplan.errors import InfeasibleError
from gplan.planner.table import CostTable, Split, stage_memory, stage_time
from gplan.profiles.schema import ClusterSpec
from gplan.spec.model import ModelSpec
from gplan.spec.parallel import ParallelConfig, check_config
from gplan.spec.training import TrainingSpec


def _compositions(total: int, parts: int, equal: bool, least: list[int] | None = None):
    """Stage sizes summing to `total`, each at least its `least` (1 by default)."""
    if equal:
        if total % parts == 0:
            yield (total // parts,) * parts
        return
    for cuts in itertools.combinations(range(1, total), parts - 1):
        bounds = (0,) + cuts + (total,)
        sizes = tuple(b - a for a, b in zip(bounds, bounds[1:]))
        if all(n >= m for n, m in zip(sizes, least or [1] * parts)):
            yield sizes


def _option_splits(count: int, options: int):
    """Every way to give `count` layers one of `options` recompute options (as counts)."""
    for cuts in itertools.combinations_with_replacement(range(count + 1), options - 1):
        bounds = (0,) + cuts + (count,)
        yield [b - a for a, b in zip(bounds, bounds[1:])]


def brute_force(table: CostTable) -> Split | None:
    """The best split by enumeration: every stage size, every recompute mix, every group choice."""
    sequence = [q for q, count in enumerate(table.layers_per_kind) for _ in range(count)]
    best: Split | None = None
    least = [table.stage_min_layers(i) for i in range(table.pp)]
    for sizes in _compositions(len(sequence), table.pp, table.equal_layers, least):
        starts = [sum(sizes[:i]) for i in range(table.pp)]
        kinds_per_stage = [[sequence[s:s + n].count(q) for q in range(len(table.kinds))]
                           for s, n in zip(starts, sizes)]
        for groups in itertools.product(table.groups, repeat=table.pp):
            if any(groups.count(g) > cap for g, cap in zip(table.groups, table.group_stage_capacity)):
                continue
            choices = []
            for i, per_kind in enumerate(kinds_per_stage):
                stage_choices = []
                for mix in itertools.product(*[list(_option_splits(n, len(table.options))) for n in per_kind]):
                    counts_i = [list(m) for m in mix]
                    if stage_memory(table, counts_i, i, groups[i]) <= table.budget_bytes[groups[i]]:
                        stage_choices.append((counts_i, stage_time(table, counts_i, i, groups[i])))
                choices.append(stage_choices)
            for combo in itertools.product(*choices):
                objective = table.objective([t for _, t in combo])
                if best is None or objective < best.objective - 1e-12:
                    best = Split(counts=[c for c, _ in combo], stage_groups=list(groups), objective=objective)
    return best


def megatron_heuristic(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, devices: int) -> ParallelConfig:
    """What a Megatron-LM user writes by hand: tp = devices per node (the largest that divides the
    heads), the smallest pp that fits with a uniform split, mbs 1, the distributed optimizer, and
    recompute only when needed (none, then selective, then full)."""
    per_node = cluster.primary.devices_per_node
    tp = max(t for t in range(1, min(per_node, devices) + 1)
             if devices % t == 0 and model.tp_divides(t))
    for pp in range(1, model.total_layers + 1):
        if devices % (tp * pp):
            continue
        dp = devices // (tp * pp)
        for recompute in ("none", "selective", "full"):
            config = ParallelConfig(dp=dp, tp=tp, pp=pp, mbs=1, sp=tp > 1, zero=1 if dp > 1 else 0,
                                    recompute=recompute)
            try:
                check_config(model, training, config, devices)
            except Exception:  # noqa: BLE001 - this pp/dp does not divide the batch: try the next
                break
            if StepModel(model, training, cluster, config).predict().fits:
                return config
    raise InfeasibleError(f"the Megatron-style heuristic finds no fitting configuration on {devices} devices",
                          hint="add devices")
