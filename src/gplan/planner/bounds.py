"""The bounds the search prunes candidates with (docs/design.md, "Search"): each a valid lower bound on
a candidate's step time, or a necessary condition for any of its splits to fit, proven in its docstring
(tests/planner/test_bounds.py checks each against the exact split on random cost tables).

  - `lower_bound_s`: the pipeline objective at the least work, perfectly balanced (T_max ≥ Σ T_i / p),
    and on node groups of different speeds at the fastest stage slots (`slot_bound_s`);
  - `memory_aware_prunes`: the least T_max at which the stages, each within its memory, can hold every
    layer — one test against the incumbent, no bisection;
  - `memory_admits_a_split`: every stage's layer capacity within its budget against the layers it must
    hold.
"""

from __future__ import annotations

import math

from gplan.cost_models.pipeline import pipeline_objective
from gplan.planner.table import CostTable


def lower_bound_s(table: CostTable) -> float:
    """`(m − 1/v)·W/p + W/v + F` with W the work at the cheapest option on the fastest group and F the
    step's floor outside the pipeline (`table.outside_pipeline_floor_s`): a valid bound on the step
    time since T_max ≥ Σ T_i / p."""
    work = table.least_work_s
    t_max = max(work / table.pp, slot_bound_s(table))
    return pipeline_objective(t_max, work, table.num_microbatches, table.vpp) + table.outside_pipeline_floor_s


def slot_bound_s(table: CostTable) -> float:
    """T_max on node groups of different speeds: stage i on group g holds n_i ≤ T_max / t_g layers (t_g a
    layer's least time there), so L ≤ T_max · Σ_i 1/t_{g_i} ≤ T_max · R, R the sum over the p fastest
    stage slots the groups' capacities allow. Without it a cluster half of V100s is bounded as if every
    stage ran on an A100."""
    per_group = {g: min(table.layer_time_s[q, k, g] for q in range(len(table.kinds)) for k in range(len(table.options)))
                 for g in table.groups}
    slots = sorted((1 / per_group[g] for g, cap in zip(table.groups, table.group_stage_capacity) for _ in range(cap)),
                   reverse=True)[:table.pp]
    return table.total_layers / sum(slots) if slots and len(slots) == table.pp else 0.0


def _stage_capacity(t: list[float], mu: list[float], time_s: float, memory_bytes: float) -> float:
    """Most layers (fractional) a stage can hold within `time_s` and `memory_bytes`, layers of option k
    costing t[k] seconds and mu[k] bytes: a two-constraint LP, optimal at ≤ 2 non-zero options."""
    if time_s <= 0 or memory_bytes < 0:
        return 0.0
    best = max(min(time_s / tk, memory_bytes / mk) for tk, mk in zip(t, mu))
    for a in range(len(t)):
        for b in range(a + 1, len(t)):
            det = t[a] * mu[b] - t[b] * mu[a]
            if det == 0:
                continue
            na = (time_s * mu[b] - memory_bytes * t[b]) / det
            nb = (t[a] * memory_bytes - mu[a] * time_s) / det
            if na >= 0 and nb >= 0:
                best = max(best, na + nb)
    return best


def _memory_aware_holds(table: CostTable):
    """`holds(T_max)`: whether the stages, each limited by T_max and by its memory on the node group it
    runs on, can hold all layers between them (each layer priced at the most favourable kind; a stage
    holds whole layers, so at most the floor of its relaxation's count) — monotone in T_max — and the
    interval [lo, hi] the least such T_max lies in (lo never holds; hi holds unless nothing fits). On
    two node groups the stages are assigned to the groups as their capacities allow (`_most_layers`);
    on more, each stage takes its best group."""
    K, p = len(table.options), table.pp
    t = {g: [min(table.layer_time_s[q, k, g] for q in range(len(table.kinds))) for k in range(K)] for g in table.groups}
    stages = []
    for i in range(p):
        mu = [min(table.layer_state_bytes[q] + table.in_flight[i] * table.layer_activation_bytes[q, k]
                  for q in range(len(table.kinds))) for k in range(K)]
        per_group = {g: (table.budget_bytes[g] - table.fixed_memory_bytes[i, g] - least_working(table, i),
                         table.fixed_time_s[i, g]) for g in table.groups}
        stages.append((mu, per_group))
    need = table.total_layers / p if table.equal_layers else None

    def holds(t_max: float) -> bool:
        # whole layers: the floor of the relaxation's count (1e-6 absorbs its rounding)
        caps = [{g: min(math.floor(_stage_capacity(t[g], mu, t_max - fixed, room) + 1e-6), table.total_layers)
                 for g, (room, fixed) in per_group.items()} for mu, per_group in stages]
        return _most_layers(caps, table, need) >= table.total_layers - 1e-9

    lo = max(min(fixed for _, fixed in per_group.values()) for _, per_group in stages)  # T_max ≥ each T_i
    hi = lo + table.total_layers * max(max(ts) for ts in t.values())
    return holds, lo, hi


def memory_aware_prunes(table: CostTable, work_s: float, incumbent: float) -> bool:
    """Whether the memory-aware bound — `(m − 1/v)·T + W/v + F` at the least T_max that holds — reaches
    `incumbent`: the objective rises with T_max, so it does exactly when the T_max at which it would
    equal the incumbent, T*, does not hold (the least T_max that holds then lies above T*); one test, no
    bisection."""
    alpha = table.num_microbatches - 1 / table.vpp
    rest = pipeline_objective(0.0, work_s, table.num_microbatches, table.vpp) + table.outside_pipeline_floor_s
    if alpha <= 0:
        return rest >= incumbent
    holds, lo, _ = _memory_aware_holds(table)
    t_star = (incumbent - rest) / alpha
    return t_star <= lo or not holds(t_star)


def _most_layers(caps: list[dict[int, float]], table: CostTable, need: float | None) -> float:
    """The most layers the stages can hold (caps[i][g]: stage i on group g), every stage on one group and
    group g hosting at most its capacity C_g of them; with `need` (interleaving: L/p on every stage), L
    when such an assignment gives every stage its need, else 0. Exact for one or two groups (two: the
    stages that gain most from the first group take it, between p − C_b and C_a of them); an upper
    bound — still a valid relaxation — for more."""
    groups, capacity = table.groups, dict(zip(table.groups, table.group_stage_capacity))
    if need is not None:
        ok = [{g for g, c in cap.items() if c >= need - 1e-9} for cap in caps]
        if any(not o for o in ok):
            return 0.0
        if len(groups) == 2:
            a, b = groups
            only_a, only_b = sum(o == {a} for o in ok), sum(o == {b} for o in ok)
            if only_a > capacity[a] or only_b > capacity[b] or len(caps) > capacity[a] + capacity[b]:
                return 0.0
        return table.total_layers
    if len(groups) == 1:
        return sum(cap[groups[0]] for cap in caps)
    if len(groups) == 2:
        a, b = groups
        gains = sorted((cap[a] - cap[b] for cap in caps), reverse=True)
        base = sum(cap[b] for cap in caps)
        least, most = max(0, len(caps) - capacity[b]), min(len(caps), capacity[a])
        if least > most:
            return 0.0
        taken = sum(gains[:least]) + sum(x for x in gains[least:most] if x > 0)
        return base + taken
    return sum(max(cap.values()) for cap in caps)


def least_working(table: CostTable, i: int) -> float:
    """The least working set stage i can have: it holds at least one layer, so at least the lightest
    option's working set, and its loss's."""
    return max(table.stage_transient_bytes.get(i, 0.0), table.least_option_transient)


def stage_layer_capacity(table: CostTable, i: int) -> int:
    """The most layers stage i can hold within its budget: a stage holding n ≥ 1 layers needs at least
    `M_i + W_i + n·μ_i` bytes, μ_i the lightest layer at its lightest option (state + in-flight
    activations) and W_i its least working set (`least_working`), on the node group that leaves it the
    most room. −1 when even its fixed bytes do not fit."""
    lightest = table.lightest_layer_bytes(i)
    room = max(table.budget_bytes[g] - table.fixed_memory_bytes[i, g] for g in table.groups) - least_working(table, i)
    if room < 0:
        return -1
    return int(room / lightest * (1 + 1e-9)) if lightest > 0 else table.total_layers


def memory_admits_a_split(table: CostTable) -> bool:
    """A necessary condition for any split to fit, hence a valid bound: a split gives every stage
    n_i ≥ 1 layers (exactly L/p when interleaved) with Σ n_i = L, and n_i ≤ capacity_i by the
    inequality above; so if some capacity is below its least n_i, or the capacities sum below L, no
    split fits. (The old bound added the mean layer memory to the largest fixed stage memory, as if the
    stage holding the head had to take L/p layers: it threw away candidates whose ILP gives that stage
    fewer.)"""
    caps = [stage_layer_capacity(table, i) for i in range(table.pp)]
    least = [table.total_layers // table.pp if table.equal_layers else table.stage_min_layers(i) for i in range(table.pp)]
    return all(c >= n for c, n in zip(caps, least)) and sum(min(c, table.total_layers) for c in caps) >= table.total_layers
