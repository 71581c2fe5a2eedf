"""Pipeline parallelism through `torch.distributed.pipelining`: the plan's (possibly uneven) stage
split, and its schedule.

Without interleaving, rank r of the pp axis runs the plan's stage r: layers [layer_start, layer_end).
With vpp = v chunks per rank (Megatron's interleaved schedule, equal stages), the L layers form p·v
virtual stages of L/(p·v) layers; rank r runs virtual stages r, r + p, …, r + (v − 1)·p.
"""

from __future__ import annotations

from dataclasses import dataclass

from gplan.plan import Plan


@dataclass(frozen=True)
class Chunk:
    virtual_stage: int
    layer_ids: list[int]
    first: bool
    last: bool


def rank_chunks(plan: Plan, pp_rank: int) -> list[Chunk]:
    """The model chunks of pipeline rank `pp_rank`, in virtual-stage order."""
    p, v = plan.parallel.pp, plan.parallel.vpp
    if v == 1:
        stage = plan.stages[pp_rank]
        return [Chunk(pp_rank, list(range(stage.layer_start, stage.layer_end)), pp_rank == 0, pp_rank == p - 1)]
    per_chunk = plan.model.num_layers // (p * v)
    chunks = []
    for c in range(v):
        s = c * p + pp_rank
        chunks.append(Chunk(s, list(range(s * per_chunk, (s + 1) * per_chunk)), s == 0, s == p * v - 1))
    return chunks


def recompute_by_layer(plan: Plan, pp_rank: int) -> dict[int, str]:
    """The plan gives each rank counts per recompute option; its layers take them in order."""
    layers = [i for chunk in rank_chunks(plan, pp_rank) for i in chunk.layer_ids]
    options = [c.recompute for c in plan.stages[pp_rank].layers for _ in range(c.count)]
    if len(options) != len(layers):
        raise ValueError(f"stage {pp_rank}: {len(options)} recompute entries for {len(layers)} layers")
    return dict(zip(layers, options))


def build_schedule(plan: Plan, stages: list, loss_fn):
    """The plan's schedule over this rank's PipelineStages."""
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    m = plan.parallel.num_microbatches
    if plan.parallel.schedule == "interleaved_1f1b":
        return ScheduleInterleaved1F1B(stages, m, loss_fn=loss_fn)
    kind = ScheduleGPipe if plan.parallel.schedule == "gpipe" else Schedule1F1B
    return kind(stages[0], m, loss_fn=loss_fn)


# ---- a tied embedding and head on different stages ---------------------------------------------------

def tied_pair_group(plan: Plan, rank: int):
    """The process group of this rank's embedding–head pair when the model ties them and they sit on
    different pipeline stages (Megatron's embedding group): for every (dp, cp, tp) position, the rank of
    the first stage and the rank of the last. Every rank creates every pair's group, in the same order
    (torch requires it); None when the plan has no such pair or this rank is in none."""
    import torch.distributed as dist

    c = plan.parallel
    if not plan.model.tie_embeddings or c.pp == 1:
        return None
    first, last = plan.stages[0].ranks, plan.stages[-1].ranks
    mine = None
    for a, b in zip(sorted(first), sorted(last)):
        group = dist.new_group([a, b])
        if rank in (a, b):
            mine = group
    return mine


def tied_weight(part) -> object | None:
    """The embedding (first stage) or the head's copy of it (last stage) in this model chunk."""
    if part.tok_embeddings is not None and part.output is None:
        return part.tok_embeddings.weight
    if part.output is not None and part.tok_embeddings is None:
        return part.output.weight
    return None


def reduce_tied_gradients(parts: list, group) -> None:
    """Sum the gradients of the embedding and of the head's copy over their pair: both copies then take
    the same step from the same initial value and stay equal (Megatron-LM does the same)."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    if group is None:
        return
    for part in parts:
        weight = tied_weight(part)
        if weight is not None and weight.grad is not None:
            if isinstance(weight.grad, DTensor):
                # A vocabulary-parallel embedding's gradient can come back replicated: shard it as the
                # weight is, so that both ends hold the same vocabulary slice.
                if weight.grad.placements != weight.placements:
                    weight.grad = weight.grad.redistribute(weight.device_mesh, weight.placements)
                grad = weight.grad.to_local()
            else:
                grad = weight.grad
            dist.all_reduce(grad, group=group)
