"""Dry validation of a plan at full scale in one CPU process: for one rank of every pipeline stage,
join a fake process group of the plan's world size, build the DeviceMesh and that rank's model chunks
on the meta device, apply tp, recompute and FSDP exactly as the worker does, build its pipeline
stages, schedule, optimizers and checkpoint save plan, and count what the rank holds.

No memory is allocated and no message is sent, so a 1024-rank llama3-70b plan checks in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from gplan.backends.base import Check, ValidationReport
from gplan.backends.torch import apply_pp, checkpoint
from gplan.backends.torch.apply_ac import apply_recompute
from gplan.backends.torch.apply_cp import apply_cp
from gplan.backends.torch.apply_dp import apply_fsdp
from gplan.backends.torch.apply_tp import apply_tp
from gplan.backends.torch.model import ModelArgs, Transformer, keep_stage
from gplan.backends.torch.worker import cp_ring, grad_mesh
from gplan.plan import Plan

TOLERANCE = 0.02
"""Largest accepted relative difference between built and predicted parameters per rank."""


@dataclass(frozen=True)
class StageCheck:
    stage: int
    rank: int
    params: int
    """Parameters this rank holds after tensor parallelism (before any zero sharding)."""
    predicted_params: float
    weight_bytes: float
    """Bytes of weights this rank keeps between steps (after zero 3 sharding), at the plan's precision."""
    predicted_weight_bytes: float

    @property
    def error(self) -> float:
        return self.params / self.predicted_params - 1


def validate_plan(plan: Plan) -> list[StageCheck]:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from gplan.backends.torch.launcher import check_supported

    check_supported(plan)
    checks = []
    for stage in range(plan.parallel.pp):
        rank = plan.stages[stage].ranks[0]
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=plan.world_size)
        try:
            checks.append(_check_rank(plan, stage, rank))
        finally:
            dist.destroy_process_group()
    return checks


def _check_rank(plan: Plan, stage: int, rank: int) -> StageCheck:
    """Build what the worker builds for `rank` — mesh, model chunks with tp, recompute and FSDP, the
    pipeline stages and schedule, the optimizers — short of materialising and running a step."""
    c = plan.parallel
    mesh = init_device_mesh("cpu", tuple(plan.placement.mesh_shape), mesh_dim_names=tuple(plan.placement.axis_order))
    args = ModelArgs.from_spec(plan.model, plan.training.seq_length)
    recompute = apply_pp.recompute_by_layer(plan, stage)
    params = weights = 0
    parts, stages = [], []
    for chunk in apply_pp.rank_chunks(plan, stage):
        with torch.device("meta"):
            part = keep_stage(Transformer(args), chunk.layer_ids, chunk.first, chunk.last)
        if c.tp > 1:
            apply_tp(part, mesh["tp"], c.sp)
        if c.cp > 1:
            apply_cp(part, cp_ring(mesh), plan.training.seq_length)
        apply_recompute(part, recompute)
        params += _local_numel(part)
        if c.zero >= 1 and c.dp * c.cp > 1:
            apply_fsdp(part, grad_mesh(mesh, c), c.zero)
        # zero 1/2 keep whole weights between steps (FSDP2 reshards them only at zero 3)
        weights += _local_numel(part) if c.zero >= 3 else 0
        parts.append(part)
        if c.pp > 1:
            from torch.distributed.pipelining import PipelineStage

            stages.append(PipelineStage(part, chunk.virtual_stage, c.pp * c.vpp, torch.device("cpu"),
                                        group=mesh["pp"].get_group()))
    if c.pp > 1:
        apply_pp.build_schedule(plan, stages, loss_fn=lambda logits, targets: logits.sum())
    optimizers = [torch.optim.AdamW(part.parameters(), lr=1e-3) for part in parts]
    checkpoint.local_save_plan(parts, optimizers, [ch.virtual_stage for ch in apply_pp.rank_chunks(plan, stage)])
    predicted = plan.prediction.stages[stage]
    weights = weights if c.zero >= 3 and c.dp * c.cp > 1 else params
    return StageCheck(stage, rank, params, predicted.params, weights * plan.training.element_bytes,
                      predicted.memory.weights_bytes)


def _local_numel(module: torch.nn.Module) -> int:
    from torch.distributed.tensor import DTensor

    return sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in module.parameters())


def validation_report(plan: Plan) -> ValidationReport:
    """Every stage's built parameters and weight bytes against the plan, within TOLERANCE."""
    checks = []
    for s in validate_plan(plan):
        where = f"stage {s.stage} (rank {s.rank})"
        checks.append(Check(f"{where}: parameters after tp", f"{s.params:,}", f"{s.predicted_params:,.0f}",
                            s.error, abs(s.error) <= TOLERANCE))
        weight_error = s.weight_bytes / s.predicted_weight_bytes - 1 if s.predicted_weight_bytes else None
        checks.append(Check(f"{where}: weight bytes after zero", f"{s.weight_bytes / 2**30:.3f} GiB",
                            f"{s.predicted_weight_bytes / 2**30:.3f} GiB", weight_error,
                            weight_error is None or abs(weight_error) <= TOLERANCE))
    return ValidationReport("torch", f"sharded model on the meta device, fake process group of {plan.world_size} ranks",
                            checks)
