"""The cost table one candidate configuration hands to the stage-split solvers (ILP, brute force).

Everything the stage split changes is linear in the layer counts, so the table holds per-layer and
per-stage constants taken from the cost model (StepModel); solvers never call the cost model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property

from gplan.cost_models import communication as comm
from gplan.cost_models import compute, memory
from gplan.cost_models.pipeline import pipeline_time_s
from gplan.cost_models.step import StepModel
from gplan.spec.parallel import LayerCount, StageLayout, empty_stage, even_stage_sizes, min_stage_layers


@dataclass(frozen=True)
class CostTable:
    """Indices: stage i < p, layer kind q (execution order), recompute option k, node group g."""

    kinds: list[str]
    layers_per_kind: list[int]
    options: list[str]
    groups: list[int]
    """Node groups a stage may use."""
    group_stage_capacity: list[int]
    """How many stages each group can host (its devices / devices per stage)."""
    pp: int
    vpp: int
    num_microbatches: int
    layer_time_s: dict[tuple[int, int, int], float]
    """(q, k, g) -> seconds per micro-batch: forward + backward + recompute + tp/cp communication."""
    layer_state_bytes: list[float]
    """q -> weights + grads + optimizer bytes per layer on one device."""
    layer_activation_bytes: dict[tuple[int, int], float]
    """(q, k) -> bytes kept per micro-batch in flight."""
    in_flight: list[float]
    fixed_time_s: dict[tuple[int, int], float]
    """(i, g) -> embedding/head time and p2p sends of stage i on group g."""
    fixed_memory_bytes: dict[tuple[int, int], float]
    """(i, g) -> allocated bytes of stage i without layers: embedding/head states and activations,
    gathered zero-3 units, the engine's buffers."""
    budget_bytes: list[float]
    """g -> bytes a device can allocate: its budget less the reserve and communicators, over
    (1 + its allocator's fragmentation) — so that allocated ≤ this ⇔ the total fits the budget."""
    equal_layers: bool = False
    """Interleaved schedules need the same number of layers on every stage (unless the target runs
    uneven chunks)."""

    def stage_min_layers(self, i: int) -> int:
        """One per chunk; the first and last stage's end chunks may hold only the embedding or the loss."""
        return min_stage_layers(i, self.pp, self.vpp)
    layer_transient_bytes: dict[tuple[int, int], float] = field(default_factory=dict)
    """(q, k) -> the working set while one such layer runs its backward (cost_models.memory)."""
    stage_transient_bytes: dict[int, float] = field(default_factory=dict)
    """i -> the working set of stage i's loss backward (the head's stage); the stage's transient is
    the largest of this and those of the options it holds."""
    outside_pipeline_floor_s: float = 0.0
    """A lower bound, over every split, of what the step adds to the pipeline time (`off_pipeline_floor_s`;
    0 — still a bound — until `floor_s` prices it)."""

    def option_transient(self, k: int) -> float:
        return self._option_transients[k]

    @cached_property
    def _option_transients(self) -> list[float]:
        return [max((v for (q, kk), v in self.layer_transient_bytes.items() if kk == k), default=0.0)
                for k in range(len(self.options))]

    @cached_property
    def least_work_s(self) -> float:
        """Σ T_i at its least: every layer at its cheapest option on its fastest group, every stage's
        fixed time on its fastest group."""
        work = sum(count * min(self.layer_time_s[q, k, g] for k in range(len(self.options)) for g in self.groups)
                   for q, count in enumerate(self.layers_per_kind))
        return work + sum(min(self.fixed_time_s[i, g] for g in self.groups) for i in range(self.pp))

    @cached_property
    def least_option_transient(self) -> float:
        return min(self._option_transients)

    def lightest_layer_bytes(self, i: int) -> float:
        """The least bytes a layer adds to stage i: its state and its activations in flight, at the
        lightest kind and option (in flight ≥ 0, so each kind's lightest option)."""
        return min(state + self.in_flight[i] * least for state, least in zip(self.layer_state_bytes,
                                                                            self._least_activations))

    @cached_property
    def _least_activations(self) -> list[float]:
        return [min(self.layer_activation_bytes[q, k] for k in range(len(self.options))) for q in range(len(self.kinds))]

    @property
    def total_layers(self) -> int:
        return sum(self.layers_per_kind)

    def objective(self, stage_times: list[float]) -> float:
        """`(m − 1/v)·T_max + Σ T_i / v`, the pipeline time of cost_models.pipeline."""
        return pipeline_time_s(stage_times, self.num_microbatches, self.vpp)


def time_table(step: StepModel, options: list[str], groups: list[int] | None = None,
               uneven_interleaved: bool = False) -> CostTable:
    """The time half of `build_table`: `pipeline_times` with the floor outside the pipeline priced
    (`floor_s`)."""
    times = pipeline_times(step, options, groups, uneven_interleaved)
    return replace(times, outside_pipeline_floor_s=floor_s(step, times))


def floor_s(step: StepModel, times: CostTable) -> float:
    """`off_pipeline_floor_s` of this configuration over the groups and options of its time table (the
    search prices it only for the candidates its pipeline bound alone does not prune)."""
    return off_pipeline_floor_s(step, times.groups, _fixed_params(step), times.options)


def pipeline_times(step: StepModel, options: list[str], groups: list[int] | None = None,
                   uneven_interleaved: bool = False) -> CostTable:
    """Layer and stage times, all the search's first bound needs, so that a candidate that bound prunes
    never prices its memory; the same for every zero level of one layout (zero changes only what the
    step adds outside the pipeline). Its memory fields are empty until `build_table` fills them, its
    floor 0 until `floor_s` prices it."""
    c = step.config
    kinds = [k.name for k in step.model.layer_kinds()]
    groups = groups if groups is not None else list(range(len(step.cluster.node_groups)))
    # a layer's time depends on the shard, the expert grid and the links of tp, cp and ep, which only the
    # scale-up domain's size changes: shared between configurations that agree on those
    domains = tuple(g.domain_devices for g in step.cluster.node_groups)
    modules = step.config.recompute_modules if "selective" in options else ()  # what selective layers replay
    layer_time = step.memo(("layer_table", tuple(options), tuple(groups), domains, modules),
                           lambda: _layer_times(step, kinds, options, groups))
    fixed_time = {}
    for i in range(c.pp):
        for g in groups:
            if 1 < i < c.pp - 1:  # every middle stage is the same
                fixed_time[i, g] = fixed_time[1, g]
                continue
            fixed_time[i, g] = step.stage_times(empty_stage(i == 0, i == c.pp - 1, g)).total_s
    return CostTable(
        kinds=kinds, layers_per_kind=[k.count for k in step.model.layer_kinds()], options=list(options),
        groups=groups, group_stage_capacity=[step.cluster.node_groups[g].devices // step.devices_per_stage()
                                             for g in groups],
        pp=c.pp, vpp=c.vpp, num_microbatches=step.num_microbatches, layer_time_s=layer_time,
        layer_state_bytes=[], layer_activation_bytes={}, in_flight=[], fixed_time_s=fixed_time,
        fixed_memory_bytes={}, budget_bytes=[], equal_layers=c.vpp > 1 and not uneven_interleaved)


def _layer_times(step: StepModel, kinds: list[str], options: list[str], groups: list[int]) -> dict:
    """(q, k, g) -> one layer's time per micro-batch (`StepModel.layer_times`, the composition the stages'
    times sum too)."""
    return {(q, k, g): step.layer_times(kind, opt, g).total_s
            for q, kind in enumerate(kinds) for k, opt in enumerate(options) for g in groups}


def _layer_param_sums(step: StepModel) -> tuple[float, float]:
    """(all, routed-expert) parameters of every layer on one device, each layer counted once (on the
    stage that holds it): what the model's states and the optimizer's work sum to over the stages."""
    def sums() -> tuple[float, float]:
        kinds = step.model.layer_kinds()
        return (sum(k.count * step.layer_params(k.name) for k in kinds),
                sum(k.count * step.layer_expert_params(k.name) for k in kinds))
    return step.memo(("layer_param_sums",), sums)  # a layer's parameters: its tp and expert grid's, shared


def _fixed_params(step: StepModel) -> list[float]:
    """Each stage's embedding, head and MTP parameters: by tp (shared) and pp."""
    pp = step.config.pp
    return step.memo(("fixed_params", pp), lambda: [step.stage_fixed_params(empty_stage(i == 0, i == pp - 1))
                                                    for i in range(pp)])


def build_table(step: StepModel, options: list[str], groups: list[int] | None = None,
                times: CostTable | None = None, outside_floor_s: float | None = None) -> CostTable:
    """Price one configuration's layers and stages on each allowed node group: its `time_table` (given,
    or priced here) with the memory terms added; `outside_floor_s`, when given, is its `floor_s`."""
    times = times or time_table(step, options, groups)
    if outside_floor_s is None:
        outside_floor_s = times.outside_pipeline_floor_s
    c, kinds, groups = step.config, times.kinds, times.groups
    widest = max(step.layer_params(k) for k in kinds)
    # an empty middle stage has no activations (its in-flight count multiplies nothing): all alike; and
    # nothing here depends on the node group
    by_stage = {i: _fixed_memory_bytes(step, i, widest) for i in {0, min(1, c.pp - 1), c.pp - 1}}
    fixed_mem = {(i, g): by_stage[i if i in by_stage else 1] for i in range(c.pp) for g in groups}
    budgets = [allocatable_bytes(step, g) for g in range(len(step.cluster.node_groups))]
    return replace(
        times,
        layer_state_bytes=[step.layer_state_bytes(k) for k in kinds],
        layer_activation_bytes={(q, k): step.layer_activation_bytes(kind, opt)
                                for q, kind in enumerate(kinds) for k, opt in enumerate(times.options)},
        in_flight=[step.in_flight(i) for i in range(c.pp)], fixed_memory_bytes=fixed_mem, budget_bytes=budgets,
        layer_transient_bytes={(q, k): step.layer_transient_bytes(kind, opt)
                               for q, kind in enumerate(kinds) for k, opt in enumerate(times.options)},
        stage_transient_bytes={i: step.head_transient_bytes(empty_stage(i == 0, i == c.pp - 1))
                               for i in range(c.pp)},
        outside_pipeline_floor_s=outside_floor_s,
    )


def _fixed_memory_bytes(step: StepModel, i: int, widest_layer_params: float) -> float:
    """Allocated bytes of stage i without layers: the states of its embedding or head and their
    activations; the engine's buffers at their largest and the zero-3 units as if the stage held the
    widest layers (both at least what any split allocates)."""
    c, t = step.config, step.training
    empty = empty_stage(i == 0, i == c.pp - 1)
    buffers = memory.engine_buffer_bytes(t.profile, c.zero, t.element_bytes, math.inf)
    if c.zero >= 3 and memory.zero_shard_ranks(c) > 1:
        units = step.unit_params(empty) + [widest_layer_params, widest_layer_params]
        buffers = buffers + memory.zero3_gather_buffer_bytes(units, t.element_bytes, t.profile)
    return sum(step.states(step.stage_fixed_params(empty), step.stage_fixed_expert_params(empty))) + \
        step.stage_activation_bytes(i, empty) + buffers


def allocatable_bytes(step: StepModel, g: int) -> float:
    """What a device of group g can allocate: its budget less the reserve and communicators, over
    (1 + its allocator's fragmentation) — so that allocated ≤ this ⇔ the total fits the budget."""
    device = step.cluster.node_groups[g].hardware
    usable = step.memory_budget(g) - device.reserve_GiB * 1024**3 - step.communicator_bytes(g)
    return usable / (1 + step.fragmentation(g))


def states_fit(step: StepModel) -> bool:
    """A necessary condition, checked before any pricing: the states (weights, gradients, optimizer, FP8
    copies of the layers' weights) of the whole model, averaged over the p stages, fit the largest
    device's allocatable bytes. Each stage allocates at least its own states, the states are linear in
    the parameters, and every layer sits on one stage, so some stage allocates at least the mean — and
    it must fit its own device. Most candidates without enough sharding (zero 0 on a large model; ep 1 on
    a large mixture of experts) fail here."""
    layer_params, routed = _layer_param_sums(step)
    total = sum(step.states(layer_params + sum(_fixed_params(step)), routed)) + \
        layer_params * memory.layer_weight_copy_bytes(step.training, step.config)
    return total / step.config.pp <= max(allocatable_bytes(step, g) for g in range(len(step.cluster.node_groups)))


def off_pipeline_floor_s(step: StepModel, groups: list[int], fixed_params: list[float], options: list[str]) -> float:
    """The least the step adds to the pipeline time whatever the split (StepModel.predict: pipeline +
    max_i dp_i + max_i optimizer_i + overhead). Each max is at least the mean over the p stages, and
    what the means need — Σ params, Σ forward, Σ backward — does not depend on the split (each layer
    sits on one stage), except the backward's recompute, taken at its most. The optimizer's time and
    the ring collectives are affine in the bytes of a non-empty stage, so their mean is their value at
    the mean stage; mean(max(0, x_i)) ≥ max(0, mean x_i). The data-parallel term counts 0 on a
    heterogeneous cluster (its stages' links differ)."""
    c = step.config
    layer_params, routed = _layer_param_sums(step)
    total = sum(fixed_params) + layer_params
    local = step.optimizer_local_params(total / c.pp, routed / c.pp)
    optimizer = min(compute.optimizer_time_s(step.device(g), local) for g in groups)
    overhead = min(step.cluster.node_groups[g].hardware.efficiency.step_overhead_s for g in groups)
    dp = dp_floor_s(step, groups[0], total, fixed_params, options) if len(groups) == 1 else 0.0
    return optimizer + overhead + dp


def dp_floor_s(step: StepModel, g: int, total_params: float, fixed_params: list[float], options: list[str]) -> float:
    """Mean over stages of StepModel.dp_exposed_s (tied-embedding all-reduce counted 0), the argument of
    `off_pipeline_floor_s`: the cost model's own terms at the whole model's sums. zero 3's exposure is a
    sum over units (every layer, each stage's embedding or head), so its mean is exact up to recompute."""
    c, p = step.config, step.config.pp
    ranks = memory.zero_shard_ranks(c)
    if ranks == 1 and c.edp == 1:
        return 0.0
    # every layer at its heaviest recompute: the most backward, so the least exposure (shard-level values)
    modules = step.config.recompute_modules if "selective" in options else ()
    body = step.memo(("heaviest_layers", tuple(options), g, modules), lambda: _heaviest_layers(step, options, g))
    if c.zero >= 3:
        link = comm.axis_link(step.group(g), c, "dp")
        units = [body] + [empty_stage(i == 0, i == p - 1, g) for i, fixed in enumerate(fixed_params) if fixed]
        return sum(step.zero3_exposed_s(u, ranks, link) for u in units) / p
    forward, backward = step.memo(("model_compute", tuple(options), g, modules), lambda: step.compute_times(
        body.model_copy(update={"embedding": True, "head": True})))
    routed = sum(k.count * step.layer_expert_params(k.name) for k in step.model.layer_kinds())
    return step.dp_sync_exposed_s(total_params / p, forward / p, backward / p, g, routed / p)


def _heaviest_layers(step: StepModel, options: list[str], g: int) -> StageLayout:
    """Every layer of the model on group g, each kind at the recompute option of most backward time."""
    layers = [LayerCount(kind=k.name, count=k.count,
                         recompute=max(options, key=lambda o, k=k: step.layer_recompute_s(k.name, o, g)))
              for k in step.model.layer_kinds()]
    return StageLayout(layers=layers, embedding=False, head=False, node_group=g)


@dataclass(frozen=True)
class Split:
    """A solution: counts[i][q][k] layers, the node group of each stage, and its objective."""

    counts: list[list[list[int]]]
    stage_groups: list[int]
    objective: float

    def layouts(self, table: CostTable) -> list[StageLayout]:
        out = []
        for i, per_kind in enumerate(self.counts):
            layers = [LayerCount(kind=table.kinds[q], recompute=table.options[k], count=n)
                      for q, per_opt in enumerate(per_kind) for k, n in enumerate(per_opt) if n > 0]
            out.append(StageLayout(layers=layers, embedding=i == 0, head=i == table.pp - 1,
                                   node_group=self.stage_groups[i]))
        return out


def stage_time(table: CostTable, counts_i: list[list[int]], i: int, g: int) -> float:
    return table.fixed_time_s[i, g] + sum(n * table.layer_time_s[q, k, g]
                                          for q, per in enumerate(counts_i) for k, n in enumerate(per))


def working_set_bytes(table: CostTable, i: int, options) -> float:
    """Stage i's backward working set holding layers of `options`: the largest of theirs and its loss's."""
    return max([table.stage_transient_bytes.get(i, 0.0)] + [table.option_transient(k) for k in options])


def stage_memory(table: CostTable, counts_i: list[list[int]], i: int, g: int) -> float:
    """Allocated bytes of stage i on group g: fixed, per layer, and the largest working set of the
    options it holds (or of its loss)."""
    used = {k for per in counts_i for k, n in enumerate(per) if n > 0}
    return table.fixed_memory_bytes[i, g] + working_set_bytes(table, i, used) + sum(
        n * (table.layer_state_bytes[q] + table.in_flight[i] * table.layer_activation_bytes[q, k])
        for q, per in enumerate(counts_i) for k, n in enumerate(per))


def uniform_split(table: CostTable, option: int) -> Split | None:
    """Megatron's even split, every layer with one recompute option; on several node groups the stages
    fill the groups in order (then in reverse order), as many as each group hosts. None when nothing
    fits."""
    sizes = even_stage_sizes(table.total_layers, table.pp, table.vpp)
    sequence = [q for q, count in enumerate(table.layers_per_kind) for _ in range(count)]
    counts, start = [], 0
    for size in sizes:
        chunk = sequence[start:start + size]
        start += size
        counts.append([[chunk.count(q) if k == option else 0 for k in range(len(table.options))]
                       for q in range(len(table.kinds))])
    best = None
    for order in ([table.groups] if len(table.groups) == 1 else [table.groups, table.groups[::-1]]):
        slots = [g for g in order for _ in range(table.group_stage_capacity[table.groups.index(g)])]
        if len(slots) < table.pp:
            continue
        stage_groups = slots[:table.pp]
        if any(stage_memory(table, c, i, g) > table.budget_bytes[g] for i, (c, g) in enumerate(zip(counts, stage_groups))):
            continue
        times = [stage_time(table, c, i, g) for i, (c, g) in enumerate(zip(counts, stage_groups))]
        split = Split(counts=counts, stage_groups=stage_groups, objective=table.objective(times))
        if best is None or split.objective < best.objective:
            best = split
    return best
