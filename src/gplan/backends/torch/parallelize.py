"""The plan applied to one rank's model chunks, in one order, for both the worker and `gplan launch
--validate`: each chunk built on the meta device, then tensor parallelism, context parallelism,
recomputation and data parallelism (FSDP2) applied, then (in a run) materialised; one PipelineStage
per chunk when the plan has stages."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from gplan.backends.torch import apply_pp
from gplan.backends.torch.apply_ac import apply_recompute
from gplan.backends.torch.apply_cp import Ring, apply_cp
from gplan.backends.torch.apply_dp import apply_fsdp
from gplan.backends.torch.apply_lowp import apply_low_precision, recipe_of
from gplan.backends.torch.apply_tp import apply_tp
from gplan.backends.torch.model import ModelArgs, Transformer, keep_stage
from gplan.backends.torch.moe import ExpertGroup, apply_ep
from gplan.plan import Plan


@dataclass
class Chunks:
    """One rank's model chunks and their pipeline stages."""

    parts: list[torch.nn.Module] = field(default_factory=list)
    stages: list = field(default_factory=list)
    virtual_stages: list[int] = field(default_factory=list)
    params_after_tp: int = 0
    """Parameters this rank holds after tensor parallelism, before any FSDP sharding."""
    edp_group: object | None = None
    """Mixture of experts: the ranks holding the same experts (their gradients are summed there)."""
    low_precision_layers: int = 0
    """Linear layers per chunk running the plan's FP8/MXFP8 recipe (apply_lowp)."""


def fsdp_float8_all_gather(plan: Plan) -> bool:
    """FSDP2 all-gathers float8 weights where it shards them under the tensorwise recipe (torchtitan's
    `enable_fsdp_float8_all_gather`, on where dp_shard > 1)."""
    c = plan.parallel
    return recipe_of(plan.training.precision) == "tensorwise" and c.zero >= 1 and c.dp * c.cp > 1


def cp_ring(mesh: DeviceMesh) -> Ring:
    group = mesh["cp"].get_group()
    return Ring(group, dist.get_process_group_ranks(group), mesh["cp"].get_local_rank())


def grad_mesh(mesh: DeviceMesh, plan: Plan) -> DeviceMesh:
    """The ranks a gradient is averaged over: dp, and cp, whose ranks hold other tokens of the same
    sequences (Megatron's data-parallel-with-cp group)."""
    return mesh["dp", "cp"]._flatten("dp_cp") if plan.parallel.cp > 1 else mesh["dp"]


def expert_mesh(plan: Plan, device_type: str) -> DeviceMesh:
    """The expert grid (pp, edp, ep, etp) over the same ranks: a stage's dp·cp ranks (tp = 1 in the
    worker) regrouped with etp innermost, then ep — Megatron-core's expert tp-ep-dp-pp order
    (cost_models.communication)."""
    from torch.distributed.device_mesh import init_device_mesh

    c = plan.parallel
    return init_device_mesh(device_type, (c.pp, c.edp, c.ep, c.etp), mesh_dim_names=("pp", "edp", "ep", "etp"))


def local_numel(module: torch.nn.Module) -> int:
    from torch.distributed.tensor import DTensor

    return sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in module.parameters())


def build_chunks(plan: Plan, mesh: DeviceMesh, pp_rank: int, device: torch.device,
                 param_dtype: torch.dtype | None = None,
                 materialise: Callable[[torch.nn.Module], None] | None = None) -> Chunks:
    c = plan.parallel
    args = ModelArgs.from_spec(plan.model, plan.training.seq_length)
    recompute = apply_pp.recompute_by_layer(plan, pp_rank)
    ring = cp_ring(mesh) if c.cp > 1 else None
    built = Chunks()
    experts = None
    if plan.model.is_moe:
        grid = expert_mesh(plan, mesh.device_type)
        experts = ExpertGroup(grid["ep"].get_group(), c.ep, grid["ep"].get_local_rank(),
                              grid["etp"].get_group(), c.etp, grid["etp"].get_local_rank())
        built.edp_group = grid["edp"].get_group()
    for chunk in apply_pp.rank_chunks(plan, pp_rank):
        with torch.device("meta"):
            part = keep_stage(Transformer(args), chunk.layer_ids, chunk.first, chunk.last)
        if experts is not None:
            apply_ep(part, experts)
        built.low_precision_layers = apply_low_precision(part, plan.training.precision, emulate=device.type != "cuda",
                                                         fsdp_all_gather=fsdp_float8_all_gather(plan))
        if c.tp > 1:
            apply_tp(part, mesh["tp"], c.sp)  # bf16 collectives around float8 GEMMs, as the cost model prices tp
        if ring is not None:
            apply_cp(part, ring, plan.training.seq_length)
        apply_recompute(part, recompute, per_op=c.per_op)
        built.params_after_tp += local_numel(part)
        if c.zero >= 1 and c.dp * c.cp > 1:
            apply_fsdp(part, grad_mesh(mesh, plan), c.zero, param_dtype=param_dtype)
        if materialise is not None:
            materialise(part)
        built.parts.append(part)
        built.virtual_stages.append(chunk.virtual_stage)
        if c.pp > 1:
            from torch.distributed.pipelining import PipelineStage

            built.stages.append(PipelineStage(part, chunk.virtual_stage, c.pp * c.vpp, device,
                                              group=mesh["pp"].get_group()))
    return built


def sixteen_bit(plan: Plan, device: torch.device) -> torch.dtype | None:
    """The 16-bit type the plan priced, where the device computes in it (GPUs); None on CPU (fp32)."""
    if device.type != "cuda" or plan.training.base_precision not in ("bf16", "fp16"):
        return None
    return torch.bfloat16 if plan.training.base_precision == "bf16" else torch.float16
