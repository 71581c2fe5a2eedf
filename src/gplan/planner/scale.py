"""A plan cut down to a smaller model (fewer layers, narrower hidden, shorter sequence, smaller
batch) with the same parallel layout — to try a plan's layout on a small machine or in tests.

The stage split keeps its proportions (largest remainder, at least one layer per stage), every stage
keeps its share of recomputed layers, and the result is priced again, so measured-versus-predicted
compares like with like.
"""

from __future__ import annotations

from gplan.errors import InputError
from gplan.plan import Plan
from gplan.plan import layouts_of
from gplan.planner.build import make_plan
from gplan.spec.parallel import LayerCount, StageLayout, check_config


def scaled_plan(plan: Plan, layers: int | None = None, hidden: int | None = None,
                seq_length: int | None = None, gbs: int | None = None) -> Plan:
    if not any((layers, hidden, seq_length, gbs)):
        return plan
    model = _scaled_model(plan, layers, hidden, seq_length)
    training = plan.training.model_copy(update={k: v for k, v in (("seq_length", seq_length), ("gbs", gbs)) if v})
    config = plan.parallel.to_config()
    check_config(model, training, config, config.world_size)
    layouts = _scaled_layouts(plan, model.num_layers)
    return make_plan(model, training, plan.cluster, config, layouts, plan.provenance.solver,
                     devices_given=plan.world_size, profile=plan.provenance.profile)


def _scaled_model(plan: Plan, layers: int | None, hidden: int | None, seq_length: int | None):
    model = plan.model
    update: dict = {"name": f"{model.name} (scaled)"}
    if model.num_encoder_layers and layers:
        raise InputError("--layers scales decoder-only models", hint="drop --layers for encoder–decoder plans")
    if layers:
        update["num_layers"] = layers
    if hidden:
        if hidden % model.num_attention_heads:
            raise InputError(f"--hidden {hidden} is not divisible by the {model.num_attention_heads} attention heads",
                             hint=f"use a multiple of {model.num_attention_heads}")
        update["hidden_size"] = hidden
        update["ffn_hidden_size"] = max(1, round(model.ffn_size * hidden / model.hidden_size))
    if seq_length:
        update["seq_length"] = seq_length
    return model.model_validate({**model.model_dump(), **update})


def _scaled_layouts(plan: Plan, layers: int) -> list[StageLayout]:
    old = layouts_of(plan)
    p, v = plan.parallel.pp, plan.parallel.vpp
    if layers < p * v or (v > 1 and layers % (p * v)):
        raise InputError(f"--layers {layers} does not fit pp={p} × vpp={v}",
                         hint=f"use a multiple of {p * v}" if v > 1 else f"use at least {p}")
    sizes = _proportional([s.num_layers for s in old], layers)
    return [StageLayout(layers=_scaled_counts(s.layers, n), embedding=s.embedding, head=s.head,
                        node_group=s.node_group) for s, n in zip(old, sizes)]


def _proportional(sizes: list[int], total: int) -> list[int]:
    """`total` split in proportion to `sizes`, each part ≥ 1."""
    return [1 + x for x in _largest_remainder(sizes, total - len(sizes))]


def _scaled_counts(counts: list[LayerCount], n: int) -> list[LayerCount]:
    new = _largest_remainder([c.count for c in counts], n)
    return [c.model_copy(update={"count": k}) for c, k in zip(counts, new) if k]


def _largest_remainder(weights: list[int], total: int) -> list[int]:
    """Non-negative integers summing to `total`, in proportion to `weights` (Hamilton's method)."""
    exact = [w * total / sum(weights) for w in weights]
    parts = [int(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: exact[i] - parts[i], reverse=True)
    for i in order[:total - sum(parts)]:
        parts[i] += 1
    return parts


CPU_STEP_WORTH_A_WORD_S = 30.0
"""A step on this machine's CPUs longer than this gets a note before the launch starts."""


def cpu_step_note(plan: Plan, device: str) -> str | None:
    """Before a launch on CPUs (`--device cpu`, or `auto` with a plan priced on CPUs): how long one step of
    `plan` (as it will run: its batch, fp32) takes by the CPU catalogue, and the batch that brings it down — a
    plan searched for GPUs keeps its ~4M-token batch, hundreds of micro-batches per step, and a CPU run of it
    would otherwise sit with no word."""
    from gplan.cost_models.step import StepModel
    from gplan.profiles.catalogue import load_cluster

    if not (device == "cpu" or (device == "auto" and plan.cluster.primary.hardware.kind == "cpu")):
        return None
    c = plan.parallel
    cluster = load_cluster("local-cpu", c.world_size).sized(c.world_size)
    training = plan.training.model_copy(update={"precision": "fp32"})
    step_s = StepModel(plan.model, training, cluster, c.to_config()).predict(layouts_of(plan)).step_time_s
    if step_s <= CPU_STEP_WORTH_A_WORD_S:
        return None
    smallest = c.dp * c.mbs * max(c.pp, 1)  # one micro-batch per stage and data-parallel rank: 1F1B's least
    scaled = step_s * smallest / plan.training.gbs
    return (f"one step of this plan on CPUs takes about {step_s:,.0f} s by gplan's CPU catalogue (gbs "
            f"{plan.training.gbs}: {plan.training.gbs // (c.dp * c.mbs)} micro-batches of {c.mbs} × "
            f"{plan.training.seq_length} tokens per data-parallel rank); --gbs {smallest} brings it to about "
            f"{scaled:,.0f} s, and --layers/--hidden/--seq-length scale the model down too")
