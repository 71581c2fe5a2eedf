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
