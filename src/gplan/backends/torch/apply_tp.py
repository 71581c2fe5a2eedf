"""Tensor parallelism (Megatron-LM's column/row split) with optional sequence parallelism, through
DTensor's `parallelize_module`.

Attention: wq, wk, wv split by output columns (heads), wo by input rows; MLP: w1 (and w3) by columns,
w2 by rows — one all-reduce per block half, or with `sp` a reduce-scatter/all-gather pair and the
norms working on a sequence shard (Korthikanti et al. 2022). The embedding is split over the
vocabulary (rows), the head over the vocabulary (columns); its output stays sharded for the
vocabulary-parallel loss.
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from gplan.backends.torch.model import Transformer


def apply_tp(model: Transformer, tp_mesh: DeviceMesh, sp: bool) -> None:
    """Shard `model` (a whole model or one pipeline stage) over `tp_mesh`."""
    between_blocks = Shard(1) if sp else Replicate()
    top: dict = {}
    if model.tok_embeddings is not None:
        learned_positions = model.pos_embeddings is not None
        # Learned positions are added to the full sequence, so the embedding sum is sharded after.
        top["tok_embeddings"] = RowwiseParallel(
            input_layouts=Replicate(), output_layouts=Replicate() if learned_positions else between_blocks)
        if learned_positions and sp:
            top["embed_out"] = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1))
    if model.norm is not None and sp:
        top["norm"] = SequenceParallel()
    if model.output is not None:
        top["output"] = ColwiseParallel(input_layouts=between_blocks, output_layouts=Shard(-1), use_local_output=True)
    parallelize_module(model, tp_mesh, top)
    # Embedding and head both split the shared [vocab, dim] weight over the vocabulary (Shard(0)).
    model.tie_weights()
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, _block_plan(sp, between_blocks, swiglu=block.feed_forward.w3 is not None))


def _block_plan(sp: bool, between_blocks, swiglu: bool) -> dict:
    plan = {
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=between_blocks),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=between_blocks),
    }
    if swiglu:
        plan["feed_forward.w3"] = ColwiseParallel()
    if sp:
        plan.update({
            "attention_norm": SequenceParallel(),
            "ffn_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        })
    return plan
