"""torchtitan (0.3): command-line overrides of its Trainer config, in a ready torchrun script.

dp maps to FSDP sharding (`data_parallel_shard_degree`) for zero ≥ 1 — weights resharded after the
forward only for zero 3 — and to replication (`data_parallel_replicate_degree`) for zero 0. What the
command line cannot express: a per-stage list of modules (torchtitan's `module_fqns_per_model_part`
takes a list of lists, set from a config function), so an uneven split is written into a note with
the exact modules of every stage; recomputation is one policy for every layer: `full` when the plan
recomputes any layer fully, else `selective` when it recomputes any selectively.
"""

from __future__ import annotations

import json
import shlex

from gplan.backends.exporters import Export, recompute_counts, stage_sizes, stamp
from gplan.backends.launch import default_nodes, script_node_variables, script_torchrun_line
from gplan.plan import Plan

SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved_1f1b": "Interleaved1F1B"}
"""gplan schedule -> torch.distributed.pipelining's schedule name (what torchtitan takes)."""


def export(plan: Plan) -> Export:
    args, notes = overrides(plan)
    files = {}
    if any("uneven split" in n for n in notes):
        files["torchtitan_module_fqns.json"] = json.dumps(
            {"_comment": stamp(plan, comment="").strip(), "module_fqns_per_model_part": module_fqns(plan)}, indent=1) + "\n"
    nnodes, per_node = default_nodes(plan)
    config = "llama3_8b"  # a registered config to start from; the overrides carry the plan
    lines = [
        "#!/bin/bash",
        stamp(plan),
        "# Run from a torchtitan (0.3) checkout or install, the same command on every node.",
        *[f"# note: {n}" for n in notes],
        "set -euo pipefail",
        *script_node_variables(nnodes),
        "MODULE=${MODULE:-llama3}",
        f"CONFIG=${{CONFIG:-{config}}}",
        "OVERRIDES=(",
        *[f"  {' '.join(shlex.quote(a) for a in pair)}" for pair in _pairs(args)],
        ")",
        script_torchrun_line(per_node, ["-m", "torchtitan.train", "--module", "$MODULE", "--config", "$CONFIG", "${OVERRIDES[@]}", "$@"]),
    ]
    files["torchtitan_train.sh"] = "\n".join(lines) + "\n"
    return Export(files, notes)


def _pairs(args: list[str]) -> list[list[str]]:
    pairs: list[list[str]] = []
    for arg in args:
        if arg.startswith("--") or ":" in arg or not pairs:
            pairs.append([arg])
        else:
            pairs[-1].append(arg)
    return pairs


def overrides(plan: Plan) -> tuple[list[str], list[str]]:
    c, t = plan.parallel, plan.training
    notes: list[str] = []
    replicate, shard = (c.dp, 1) if c.zero == 0 else (1, c.dp)
    args = [
        "--training.global_batch_size", str(t.gbs), "--training.local_batch_size", str(t.gbs // c.dp),
        "--training.seq_len", str(t.seq_length),
        "--parallelism.data_parallel_replicate_degree", str(replicate),
        "--parallelism.data_parallel_shard_degree", str(shard),
        "--parallelism.fsdp_reshard_after_forward", "always" if c.zero == 3 else "never",
        "--parallelism.tensor_parallel_degree", str(c.tp),
        "--parallelism.enable_sequence_parallel" if c.sp else "--parallelism.no-enable_sequence_parallel",
        "--parallelism.context_parallel_degree", str(c.cp),
        "--parallelism.pipeline_parallel_degree", str(c.pp),
    ]
    if c.pp > 1:
        args += ["--parallelism.pipeline_parallel_schedule", SCHEDULES[c.schedule],
                 "--parallelism.pipeline_parallel_microbatch_size", str(c.mbs)]
        sizes = stage_sizes(plan)
        if c.vpp > 1 or len(set(sizes)) == 1:
            args += ["--parallelism.pipeline_parallel_layers_per_stage", str(plan.model.num_layers // (c.pp * c.vpp))]
        else:
            notes.append(f"uneven split {'/'.join(map(str, sizes))}: torchtitan's command line cannot take "
                         "parallelism.module_fqns_per_model_part; set it in a config function from "
                         "torchtitan_module_fqns.json")
    if c.zero in (1, 2):
        notes.append(f"zero {c.zero} runs as FSDP without resharding after the forward (weights stay gathered "
                     "for the backward; optimizer state and gradients sharded)")
    args.append(f"activation_checkpoint:{ac_mode(plan, notes)}")
    return args, notes


def ac_mode(plan: Plan, notes: list[str]) -> str:
    full, selective = recompute_counts(plan, "full"), recompute_counts(plan, "selective")
    mode = "full" if any(full) else ("selective" if any(selective) else "none")
    mixed = sum(full) + sum(selective)
    if mode != "none" and mixed < plan.model.num_layers:
        notes.append(f"the plan recomputes {mixed} of {plan.model.num_layers} layers; torchtitan applies "
                     f"`{mode}` to every layer")
    return mode


def module_fqns(plan: Plan) -> list[list[str]]:
    """Module names of every pipeline stage, torchtitan's naming (tok_embeddings, layers.i, norm, output)."""
    parts = []
    for i, stage in enumerate(plan.stages):
        names = (["tok_embeddings"] if i == 0 else []) + [f"layers.{j}" for j in range(stage.layer_start, stage.layer_end)]
        parts.append(names + (["norm", "output"] if i == len(plan.stages) - 1 else []))
    return parts
