"""Dry validation of a plan at full scale in one CPU process: for one rank of every pipeline stage,
join a fake process group of the plan's world size, build the DeviceMesh and that rank's model chunks
on the meta device with tp, cp, recompute and FSDP applied as the worker applies them
(`parallelize.build_chunks`, which both use), build its pipeline
stages, schedule, optimizers and checkpoint save plan, and count what the rank holds.

No memory is allocated and no message is sent, so a 1024-rank llama3-70b plan checks in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from gplan.backends.protocol import Check, ValidationReport
from gplan.backends.torch import apply_pp, checkpoint
from gplan.backends.torch.parallelize import build_chunks, sixteen_bit
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
    """Build what the worker builds for `rank` — mesh, model chunks with tp, cp, recompute and FSDP,
    the pipeline stages and schedule, the optimizers, the checkpoint's save plan — short of
    materialising and running a step."""
    c = plan.parallel
    mesh = init_device_mesh("cpu", tuple(plan.placement.mesh_shape), mesh_dim_names=tuple(plan.placement.axis_order))
    # built as the worker builds it on the GPUs the plan is for: with its mixed-precision policy
    built = build_chunks(plan, mesh, stage, torch.device("cpu"), sixteen_bit(plan, torch.device("cuda")))
    if c.pp > 1:
        apply_pp.build_schedule(plan, built.stages, loss_fn=lambda logits, targets: logits.sum())
    optimizers = [torch.optim.AdamW(part.parameters(), lr=1e-3) for part in built.parts]
    checkpoint.local_save_plan(built.parts, optimizers, built.virtual_stages)
    predicted = plan.prediction.stages[stage]
    return StageCheck(stage, rank, built.params_after_tp, predicted.params, weight_bytes(built),
                      predicted.memory.weights_bytes)


def weight_bytes(built) -> float:
    """The weight bytes this rank keeps between steps, read from what was built: every parameter's local
    shard at its own dtype, and where FSDP keeps the weights gathered from the forward to the backward
    (zero 1/2: `reshard_after_forward=False`) each gathered weight at the dtype its mixed-precision policy
    gathers in. Nothing here restates the cost model's accounting: a worker that lost its policy (or
    kept 16-bit weights the plan did not price) shows as a difference."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    total = 0.0
    for part in built.parts:
        for param in part.parameters():
            local = param.to_local() if isinstance(param, DTensor) else param
            total += local.numel() * local.element_size()
        for module in part.modules():
            group = module._get_fsdp_state()._fsdp_param_group if isinstance(module, FSDPModule) else None
            if group is None or group.post_forward_mesh_info is not None:  # resharded after the forward
                continue
            for fsdp_param in group.fsdp_params:
                local = fsdp_param.sharded_param.to_local()
                dtype = group.mp_policy.param_dtype or local.dtype
                total += local.numel() * fsdp_param.mesh_info.shard_mesh_size * dtype.itemsize
    return total


def validation_report(plan: Plan) -> ValidationReport:
    """Every stage's built parameters and weight bytes against the plan, within TOLERANCE. The weight
    bytes are held only against a plan priced with the torch worker's own memory accounting
    (spec.engines: fsdp states); another engine's are shown beside what was built."""
    from gplan.backends.torch import ENGINE
    from gplan.engines import ENGINES, memory_accounting

    own = memory_accounting(plan.training.engine) == ENGINES[ENGINE].memory
    engine = plan.training.engine or "an engine-less plan"
    checks = []
    for s in validate_plan(plan):
        where = f"stage {s.stage} (rank {s.rank})"
        checks.append(Check(f"{where}: parameters after tp", f"{s.params:,}", f"{s.predicted_params:,.0f}",
                            s.error, abs(s.error) <= TOLERANCE))
        weight_error = s.weight_bytes / s.predicted_weight_bytes - 1 if s.predicted_weight_bytes else None
        held = weight_error is None or abs(weight_error) <= TOLERANCE
        # priced as another engine keeps weights: shown beside what was built, not held against the worker
        other = "" if own else (f" (the plan priced {engine}'s accounting, not the torch worker's: relaunch a plan "
                                "searched with --target torch to hold it)")
        checks.append(Check(f"{where}: weight bytes after zero{other}", f"{s.weight_bytes / 2**30:.3f} GiB",
                            f"{s.predicted_weight_bytes / 2**30:.3f} GiB", weight_error, held or not own))
    return ValidationReport("torch", f"sharded model on the meta device, fake process group of {plan.world_size} ranks",
                            checks)
