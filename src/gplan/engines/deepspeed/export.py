"""DeepSpeed: a `ds_config.json` and a Megatron-DeepSpeed `pretrain_gpt.py` script for the plan.

DeepSpeed's batch rule is train_batch_size = micro_batch × accumulation × data-parallel ranks, the
plan's gbs = mbs × m × dp. The ZeRO stage goes both into the config and onto Megatron-DeepSpeed's
command line (`--zero-stage`: with 3 it builds the model under `deepspeed.zero.Init`, so no rank holds
the whole model). Names follow Megatron-DeepSpeed's `megatron/arguments.py` (its own fork of
Megatron's: `--num-key-value-heads`, `--use-rotary-position-embeddings`,
`--rotary-position-embeddings-theta`, lower-case `--normalization`). What it runs differently than a
plan of another target was decided before (`spec.targets.runs_as`: its pipeline engine splits the
layers evenly, ZeRO ≤ 1 with stages, no interleaving; recomputation is every layer, fully through
DeepSpeed's activation checkpointing or selectively through Megatron's core-attention recompute).

Mixtures of experts run as DeepSpeed-MoE layers in Megatron-DeepSpeed's GPT: `--num-experts`,
`--topk`, `--moe-expert-parallel-size`, every layer an MoE layer (`--expert-interval 1`), the experts
`--ffn-hidden-size` wide, their parameters in their own optimizer group (`--create-moe-param-group`,
which DeepSpeed's ZeRO needs), dropless unless the model sets a capacity factor. Its experts are never
tp-sharded here (etp 1) and its MoE examples run without pipeline stages (`spec.targets`).
"""

from __future__ import annotations

import json
from gplan.backends.exporters import Export, ExportContext, flag_lines, recompute_counts, stamp
from gplan.engines.megatron.export import rotary_base, switch_args, vocab_divisor
from gplan.backends.recipes import default_nodes, script_node_variables, script_torchrun_line
from gplan.errors import InputError
from gplan.plan import Plan
from gplan.spec.parallel import StageLayout

VERSIONS = {"0.19": "DeepSpeed 0.19 (DeepSpeedConfig) with Megatron-DeepSpeed (megatron/arguments.py as on its "
                    "main branch, 2025)"}

EXACT = (
    "ZeRO stage in both `ds_config.json` and `--zero-stage` (3 builds under `deepspeed.zero.Init`); "
    "micro-batch and accumulation; tp, pp, sp; full recompute through `--checkpoint-activations` + DeepSpeed "
    "activation checkpointing, selective through Megatron's core-attention recompute; rope base, GQA, "
    "vocabulary")
"""What its files run exactly as the plan priced it (docs/exporting.md's table, from bench/engine_tables.py)."""
APPROXIMATED = (
    "even split only (uneven is re-priced evenly), ZeRO ≤ 1 with pp, no interleaving, no cp (refused); "
    "Megatron-DeepSpeed has no synthetic data: the script requires `DATA_PATH`")
"""What it runs differently (re-priced, noted) or refuses."""


def export(plan: Plan, context: ExportContext) -> Export:
    notes: list[str] = []
    config = ds_config(plan, context.layouts, context.version)
    args = megatron_deepspeed_args(plan, context.layouts, notes)
    nnodes, per_node = default_nodes(plan)
    lines = [
        "#!/bin/bash",
        stamp(plan, context.version),
        "# Run from a Megatron-DeepSpeed checkout with ds_config.json beside this script, the same command on every",
        "# node. DATA_PATH: a Megatron-format dataset prefix (Megatron-DeepSpeed has no synthetic data).",
        *[f"# note: {n}" for n in context.notes + notes],
        "set -euo pipefail",
        *script_node_variables(nnodes),
        ': "${DATA_PATH:?set DATA_PATH to a Megatron-format dataset prefix (path/to/name_text_document)}"',
        'HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)',
        *(["export CUDA_DEVICE_MAX_CONNECTIONS=1  # Megatron-DeepSpeed requires it with sequence parallelism"]
          if plan.parallel.sp and plan.parallel.tp > 1 else []),
        "ARGS=(",
        *[f"  {line}" for line in flag_lines(args)],
        '  --data-path "$DATA_PATH"',
        '  --deepspeed --deepspeed_config "$HERE/ds_config.json"',
        ")",
        script_torchrun_line(per_node, ["pretrain_gpt.py", "${ARGS[@]}", "$@"]),
    ]
    files = {"ds_config.json": json.dumps(config, indent=2) + "\n",
             "megatron_deepspeed_pretrain_gpt.sh": "\n".join(lines) + "\n"}
    return Export(files, notes)




def ds_config(plan: Plan, layouts: list[StageLayout], version: str = "") -> dict:
    c, t = plan.parallel, plan.training
    config: dict = {
        "_comment": stamp(plan, version, comment="").strip(),
        "train_batch_size": t.gbs,
        "train_micro_batch_size_per_gpu": c.mbs,
        "gradient_accumulation_steps": c.num_microbatches,
        "zero_optimization": {"stage": c.zero},
        "bf16": {"enabled": t.precision == "bf16"},
        "fp16": {"enabled": t.precision == "fp16"},
        "gradient_clipping": 1.0,
        "steps_per_print": 10,
    }
    if any(recompute_counts(layouts, "full")):
        config["activation_checkpointing"] = {"partition_activations": c.tp > 1, "contiguous_memory_optimization": False,
                                              "cpu_checkpointing": False}
    return config


def expert_args(plan: Plan, notes: list[str]) -> list[str]:
    """DeepSpeed-MoE through Megatron-DeepSpeed's flags (megatron/arguments.py: --num-experts, --topk and
    --expert-interval in _add_network_size_args, --moe-expert-parallel-size in _add_distributed_args,
    the capacity and param-group flags in _add_training_args)."""
    m, c = plan.model, plan.parallel
    args = ["--num-experts", str(m.num_experts), "--topk", str(m.top_k), "--expert-interval", "1",
            "--mlp-type", "standard", "--moe-expert-parallel-size", str(c.ep), "--create-moe-param-group"]
    if m.capacity_factor is None:
        args.append("--disable-moe-token-dropping")
    else:
        args += ["--moe-train-capacity-factor", str(m.capacity_factor)]
    if m.top_k == 2:
        notes.append("DeepSpeed's top-2 gate samples the second expert unless told otherwise; newer Megatron-DeepSpeed "
                     "takes --disable-moe-top2-2nd-expert-sampling for the deterministic top-2 the model defines")
    return args


def megatron_deepspeed_args(plan: Plan, layouts: list[StageLayout], notes: list[str]) -> list[str]:
    m, c, t = plan.model, plan.parallel, plan.training
    if m.num_encoder_layers or m.ffn_kind == "relu" or m.position_embedding not in ("rope", "learned"):
        raise InputError("Megatron-DeepSpeed's pretrain_gpt.py runs decoder-only GPT and Llama models",
                         hint="export this model to another target")
    args = ["--num-layers", str(m.num_layers), "--hidden-size", str(m.hidden_size),
            "--ffn-hidden-size", str(m.expert_ffn_size if m.is_moe else m.ffn_size),  # MoE: the experts (every layer)
            "--num-attention-heads", str(m.num_attention_heads),
            "--num-key-value-heads", str(m.kv_heads), "--seq-length", str(t.seq_length),
            "--max-position-embeddings", str(max(t.seq_length, m.seq_length)),
            "--normalization", m.norm, "--attention-dropout", str(m.dropout), "--hidden-dropout", str(m.dropout)]
    if m.head_dim:
        args += ["--kv-channels", str(m.kv_channels)]
    if m.position_embedding == "rope":
        args += ["--use-rotary-position-embeddings", "--no-position-embedding",
                 "--rotary-position-embeddings-theta", rotary_base(m.rope_theta)]
    args += switch_args(plan)
    d = vocab_divisor(m.vocab_size, c.tp)
    if m.vocab_size % (d * c.tp):
        notes.append(f"Megatron-DeepSpeed pads the vocabulary to a multiple of tp={c.tp}")
    args += ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(m.vocab_size - 1),
             "--make-vocab-size-divisible-by", str(d)]
    args += ["--tensor-model-parallel-size", str(c.tp), "--pipeline-model-parallel-size", str(c.pp),
             "--micro-batch-size", str(c.mbs), "--global-batch-size", str(t.gbs), "--zero-stage", str(c.zero)]
    if m.is_moe:
        args += expert_args(plan, notes)
    if c.pp == 1:
        args.append("--no-pipeline-parallel")
    if c.sp and c.tp > 1:
        args.append("--sequence-parallel")
    if any(recompute_counts(layouts, "full")):
        # The pipeline engine checkpoints through DeepSpeed (--checkpoint-activations, one layer a unit); the
        # rest of Megatron-DeepSpeed through Megatron's recompute options: both say every layer, fully.
        args += ["--checkpoint-activations", "--deepspeed-activation-checkpointing", "--checkpoint-num-layers", "1",
                 "--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    elif any(recompute_counts(layouts, "selective")):
        args += ["--recompute-granularity", "selective"]
    return args + ["--train-iters", "100", "--lr", "3.0e-4", "--log-interval", "1"]
