"""Data parallelism with the plan's optimizer sharding.

zero 0: every rank keeps whole weights, gradients and optimizer state; gradients are averaged over
    the dp group after the backward (what DDP does; DDP itself does not wrap tp-sharded modules).
zero 1, 2: FSDP2 `fully_shard` keeping weights gathered between forward and backward
    (`reshard_after_forward=False`): gradients are reduce-scattered and optimizer state is sharded —
    FSDP2 has no mode that shards the optimizer state alone, so zero 1 runs as zero 2.
zero 3: FSDP2 with weights resharded after the forward, gathered again for the backward.
Each transformer block is its own FSDP unit so gathers overlap with compute; the stage's remaining
parameters (embedding, final norm, head) form the root unit.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from gplan.backends.torch.model import Transformer
from gplan.backends.torch.moe import is_expert_param


def apply_fsdp(model: Transformer, dp_mesh: DeviceMesh, zero: int, param_dtype: torch.dtype | None = None) -> None:
    """`param_dtype` (bf16 or fp16 on GPUs): FSDP2's mixed precision — weights gathered and computed in
    16 bits, gradients reduced in fp32, the fp32 master copy sharded — the precision the plan prices."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    reshard = zero >= 3
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32) if param_dtype else \
        MixedPrecisionPolicy()
    for block in model.layers.values():
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=policy)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=policy)


def average_gradients(parts: list[torch.nn.Module], dp_group, dp: int) -> None:
    """zero 0: average the gradients over the dp group in one all-reduce of one flat buffer per
    dtype (as DDP's buckets do; one collective per tensor would pay the latency hundreds of times)."""
    if dp == 1:
        return
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for part in parts:
        for name, param in part.named_parameters():
            if param.grad is not None and not is_expert_param(name):  # experts: average_expert_gradients
                grad = param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad
                by_dtype.setdefault(grad.dtype, []).append(grad)
    for grads in by_dtype.values():
        sum_and_divide(grads, dp_group, dp)


def average_expert_gradients(parts: list[torch.nn.Module], edp_group, edp: int, divisor: int) -> None:
    """Expert gradients: each rank's backward already sums its experts' gradients over the tokens of its
    ep group (the all-to-all carries them back), so summing over the edp replicas covers every token;
    dividing by dp·cp makes it the mean the dense gradients take."""
    grads = [p.grad for part in parts for name, p in part.named_parameters() if is_expert_param(name)
             and p.grad is not None]
    if grads:
        sum_and_divide(grads, edp_group if edp > 1 else None, divisor)


def sum_and_divide(grads: list[torch.Tensor], group, divisor: int) -> None:
    """Sum `grads` over `group` (None: no sum) in one flat buffer, then divide them by `divisor`."""
    flat = torch.cat([g.reshape(-1) for g in grads])
    if group is not None:
        dist.all_reduce(flat, group=group)
    flat.div_(divisor)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
