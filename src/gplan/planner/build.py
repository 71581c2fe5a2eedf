"""Turn a configuration and its stage layout into a Plan: prediction, stage ranges, placement."""

from __future__ import annotations

from gplan.cost_models.step import StepModel
from gplan.plan import ParallelPlan, layouts_of, Plan, Provenance, SearchRecord, SolverInfo, StagePlan, inputs_digest
from gplan.planner.placement import place
from gplan.profiles.schema import ClusterSpec
from gplan.spec.model import ModelSpec
from gplan.spec.parallel import ParallelConfig, StageLayout, uniform_layout
from gplan.spec.targets import as_engine_runs
from gplan.spec.training import TrainingSpec


def make_plan(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, config: ParallelConfig,
              layouts: list[StageLayout] | None = None, solver: SolverInfo | None = None,
              devices_given: int | None = None, profile: str | None = None,
              search: SearchRecord | None = None) -> Plan:
    layouts = layouts or uniform_layout(model, config.pp, config.recompute, config.vpp)
    prediction = StepModel(model, training, cluster, config).predict(layouts)
    placement = place(cluster, config, [s.node_group for s in layouts])
    stages, start = [], 0
    for i, (layout, pred) in enumerate(zip(layouts, prediction.stages)):
        stages.append(StagePlan(
            index=i, layer_start=start, layer_end=start + layout.num_layers, layers=layout.layers,
            embedding=layout.embedding, head=layout.head, node_group=layout.node_group,
            first_rank=i * (config.world_size // config.pp),
            num_ranks=config.world_size // config.pp, time_s=pred.time_s, memory_bytes=pred.memory_bytes,
            memory=pred.memory,
        ))
        start += layout.num_layers
    return Plan(
        model=model, cluster=cluster, training=training, digest=inputs_digest(model, cluster, training),
        parallel=ParallelPlan(**config.model_dump(), num_microbatches=prediction.num_microbatches),
        stages=stages, placement=placement, prediction=prediction,
        provenance=Provenance(solver=solver or SolverInfo(name="none", status="none"),
                              devices_given=devices_given, profile=profile),
        search=search,
    )


def repredict(plan: Plan):
    """The prediction this gplan gives for a plan's exact configuration and stage split."""
    return StepModel(plan.model, plan.training, plan.cluster, plan.parallel).predict(layouts_of(plan))


def reprice_split(plan: Plan, layouts: list[StageLayout], engine: str | None = None) -> tuple[float, bool, str]:
    """The plan's configuration priced as `engine` runs it (default: the plan's own; its overlap,
    efficiency, low-precision kernels and memory accounting) with the stage split it runs: step seconds,
    whether every stage fits its budget, and, when one does not, which and by how much."""
    training = as_engine_runs(plan.training, engine, plan.parallel) if engine else plan.training
    prediction = StepModel(plan.model, training, plan.cluster, plan.parallel).predict(layouts)
    over = [s for s in prediction.stages if s.memory_bytes > s.memory_budget_bytes]
    binds = ""
    if over:
        s = over[0]
        binds = (f"stage {s.index} needs {s.memory_bytes / 2**30:.1f} GiB against its "
                 f"{s.memory_budget_bytes / 2**30:.1f} GiB budget")
    return prediction.step_time_s, not over, binds
