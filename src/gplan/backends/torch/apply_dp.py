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


def apply_fsdp(model: Transformer, dp_mesh: DeviceMesh, zero: int) -> None:
    reshard = zero >= 3
    for block in model.layers.values():
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard)


def average_gradients(parts: list[torch.nn.Module], dp_group, dp: int) -> None:
    """zero 0: all-reduce every gradient over the dp group and divide by dp."""
    if dp == 1:
        return
    for part in parts:
        for param in part.parameters():
            if param.grad is None:
                continue
            grad = param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad
            dist.all_reduce(grad, group=dp_group)
            grad.div_(dp)
