"""MindFormers' PyNative trainer: a plan as its YAML's `training`, `parallelism`, `recompute` and `model` sections
(mindformers/pynative/config/config.py's TrainConfig, which refuses a key it does not know).

Its `ParallelDims` derives dp from the world size msrun starts (`worker_num`): the file sets the degrees beside it —
`data_parallel_shard` -1 (FSDP over every data-parallel rank; 1 for zero 0, plain replicas), `reshard_after_forward_
policy` "always" for zero 3 and "never" for zero 2, tp (with `sequence_parallel`, which its tensor parallelism
requires), cp, ep (carved from dp_shard·cp·tp). Stages: "auto" where the split is even, else each rank's chunks as
`start-end` layer ranges in its order (chunk v of rank r is virtual stage v·pp + r). Recompute: full, by layer
ranges (each rank's first layers, as the plan's per-stage counts). The batch: `local_batch_size` is the micro-batch,
`global_batch_size` the step (its trainer accumulates gbs / (dp · local) micro-batches, the pipeline's count).
"""

from __future__ import annotations

import yaml

from gplan.backends.exporters import Export, ExportContext, stamp
from gplan.engines.mindformers.export import COMPUTE_DTYPE, expert_model_config
from gplan.errors import InputError
from gplan.plan import Plan, layouts_of
from gplan.spec.parallel import StageLayout, chunk_sizes
from gplan.spec.targets import expert_family

VERSIONS = {"2.1": "MindFormers' PyNative trainer (mindformers/pynative, TrainConfig) on MindSpore 2.10"}

EXACT = ("dp_shard / tp / cp / pp / interleave / ep; FSDP level (reshard policy); each rank's layer ranges; full "
         "recompute by layer; micro-batch and global batch")
"""What its files run exactly as the plan priced it (docs/exporting.md's table, from bench/engine_tables.py)."""
APPROXIMATED = ("tp always with sequence parallelism (noted where the plan had none); its DeepSeek-V3 (MoE) and "
                "Qwen3 (dense) models only")
"""What it runs differently (re-priced, noted) or refuses."""

ZERO_RESHARD = {3: "always", 2: "never", 0: "default"}
"""FSDP's reshard policy per zero level (its distributed/fsdp.py get_fsdp_reshard_after_forward_policy)."""


def model_section(plan: Plan) -> dict:
    """The model in Hugging Face's names: its DeepSeek-V3 as MindFormers' graph-mode export writes it (the same
    config class), its dense Qwen3."""
    m = plan.model
    if m.is_moe:
        return {k: v for k, v in expert_model_config(plan, 0).items() if k != "offset"}
    return {"model_type": "qwen3", "architectures": "Qwen3ForCausalLM", "num_hidden_layers": m.num_layers,
            "seq_length": plan.training.seq_length, "hidden_size": m.hidden_size, "intermediate_size": m.ffn_size,
            "num_attention_heads": m.num_attention_heads, "num_key_value_heads": m.kv_heads, "head_dim": m.kv_channels,
            "vocab_size": m.vocab_size, "rope_theta": m.rope_theta, "tie_word_embeddings": m.tie_embeddings,
            "max_position_embeddings": max(plan.training.seq_length, m.seq_length), "qk_layernorm": True,
            "hidden_act": "silu", "gated_linear_unit": True, "compute_dtype": COMPUTE_DTYPE[plan.training.precision],
            "use_flash_attention": True}


def rank_ranges(layouts: list[StageLayout], pp: int, vpp: int) -> list[list[range]]:
    """Each rank's chunks as layer ranges, numbered in the order the virtual stages run (v·pp + r)."""
    sizes = [s.num_layers for s in layouts]
    chunks = [chunk_sizes(n, vpp, first=r == 0, last=r == pp - 1) if vpp > 1 else [n] for r, n in enumerate(sizes)]
    ranges, start = [[] for _ in range(pp)], 0
    for v in range(vpp):
        for r in range(pp):
            ranges[r].append(range(start, start + chunks[r][v]))
            start += chunks[r][v]
    return ranges


def recomputed(layouts: list[StageLayout], ranges: list[list[range]]) -> list[int]:
    """The layers recomputed: each rank's first `full` (and `selective`, which it runs fully) layers."""
    found = []
    for stage, chunks in zip(layouts, ranges):
        count = sum(c.count for c in stage.layers if c.recompute != "none")
        found += [layer for chunk in chunks for layer in chunk][:count]
    return found


def range_texts(layers: list[int]) -> list[str]:
    """Consecutive layers as MindFormers' `start-end` strings."""
    texts, run = [], []
    for layer in layers:
        if run and layer != run[-1] + 1:
            texts.append(f"{run[0]}-{run[-1]}")
            run = []
        run.append(layer)
    return texts + ([f"{run[0]}-{run[-1]}"] if run else [])


def sections(plan: Plan, layouts: list[StageLayout] | None = None) -> dict:
    c, layouts = plan.parallel, layouts or layouts_of(plan)
    family = expert_family(plan.model) if plan.model.is_moe else ("qwen3" if plan.model.qk_norm else None)
    if family not in ("deepseek_v3", "qwen3"):
        raise InputError(f"MindFormers' PyNative trainer builds DeepSeek-V3 (MoE) and Qwen3 (dense) models, not "
                         f"{plan.model.name}", hint="export --to mindformers, its graph-mode trainer")
    ranges = rank_ranges(layouts, c.pp, c.vpp)
    even = len({len(chunk) for chunks in ranges for chunk in chunks}) == 1
    layers = recomputed(layouts, ranges)
    parallelism = {"data_parallel_shard": 1 if c.zero == 0 else -1, "reshard_after_forward_policy": ZERO_RESHARD[c.zero],
                   "tensor_parallel": c.tp, "sequence_parallel": c.tp > 1, "context_parallel": c.cp,
                   "pipeline_parallel": c.pp, "pipeline_parallel_interleave_num": c.vpp,
                   "pipeline_parallel_schedule": c.schedule if c.pp > 1 else "1f1b",
                   "pipeline_parallel_layers_per_stage": "auto" if even or c.pp == 1 else
                   [",".join(f"{r.start}-{r.stop - 1}" for r in chunks) for chunks in ranges],
                   "expert_parallel": c.ep, "moe_token_dispatcher_type": "alltoall"}
    recompute = {"mode": "full", "full_recompute_layer": range_texts(layers)} if layers else {"mode": "None"}
    return {"training": {"local_batch_size": c.mbs, "global_batch_size": plan.training.gbs},
            "parallelism": parallelism, "recompute": recompute, "model": model_section(plan)}


def notes(plan: Plan) -> list[str]:
    found = []
    if plan.parallel.tp > 1 and not plan.parallel.sp:
        found.append("its tensor parallelism runs with sequence parallelism only (ParallelismConfig): "
                     "sequence_parallel true, which the plan did not price")
    if plan.model.is_moe:
        found.append("routing details gplan does not model (expert groups, route scaling, the auxiliary loss) take "
                     "MindFormers' defaults: set them under model if your run needs them")
    return found


def export(plan: Plan, context: ExportContext) -> Export:
    found = notes(plan)
    text = (stamp(plan, context.version) + f"\n# MindFormers' PyNative trainer: run with msrun --worker_num "
            f"{plan.world_size} (its dp follows from the world size); merge your dataset (its seq_length "
            f"{plan.training.seq_length}), optimizer and checkpoint sections.\n" + "".join(f"# note: {n}\n" for n in context.notes + found))
    return Export({"mindformers_pynative.yaml": text + yaml.safe_dump(sections(plan, context.layouts), sort_keys=False)},
                  found)
