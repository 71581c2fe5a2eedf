"""Megatron-LM: `pretrain_gpt.py` arguments for the plan, in a ready torchrun script.

Names follow `megatron/training/arguments.py`. What Megatron cannot express exactly:
- recomputation is one setting for all stages: `full` with the `block` method recomputes the first
  N layers of every stage (chunk); N is the largest count the plan gives any stage, so every stage
  fits; a plan with only `selective` layers becomes `--recompute-granularity selective`;
- zero 2 runs as the distributed optimizer (zero 1, which already reduce-scatters gradients);
  zero 3 as Megatron-FSDP sharding optimizer state, gradients and weights.
"""

from __future__ import annotations

import shlex

from gplan.backends.exporters import Export, recompute_counts, stage_sizes, stamp
from gplan.backends.launch import default_nodes, script_node_variables, script_torchrun_line
from gplan.errors import InputError
from gplan.plan import Plan


def export(plan: Plan) -> Export:
    args, notes = megatron_args(plan)
    nnodes, per_node = default_nodes(plan)
    lines = [
        "#!/bin/bash",
        stamp(plan),
        "# Run from a Megatron-LM checkout, the same command on every node (NODE_RANK 0..NNODES-1).",
        *[f"# note: {n}" for n in notes],
        "set -euo pipefail",
        *script_node_variables(nnodes),
        "export CUDA_DEVICE_MAX_CONNECTIONS=1",
        "MEGATRON_ARGS=(",
        *[f"  {line}" for line in _pairs(args)],
        ")",
        script_torchrun_line(per_node, ["pretrain_gpt.py", "${MEGATRON_ARGS[@]}", "$@"]),
    ]
    return Export({"megatron_pretrain_gpt.sh": "\n".join(lines) + "\n"}, notes)


def _pairs(args: list[str]) -> list[str]:
    """One flag per line, with its value."""
    lines: list[str] = []
    for arg in args:
        if arg.startswith("--") or not lines:
            lines.append(shlex.quote(arg))
        else:
            lines[-1] += " " + shlex.quote(arg)
    return lines


def megatron_args(plan: Plan) -> tuple[list[str], list[str]]:
    """The argument list and the notes on what was approximated."""
    notes: list[str] = []
    return model_args(plan) + parallel_args(plan, notes) + recompute_args(plan, notes) + run_args(plan), notes


def model_args(plan: Plan) -> list[str]:
    m, t = plan.model, plan.training
    if m.num_encoder_layers:
        raise InputError("the Megatron export covers decoder-only models (pretrain_gpt.py)",
                         hint="export encoder–decoder plans to another target")
    if m.ffn_kind == "relu":
        raise InputError("Megatron-LM has no plain ReLU MLP", hint="use gelu or swiglu in the model file")
    args = ["--num-layers", str(m.num_layers), "--hidden-size", str(m.hidden_size),
            "--ffn-hidden-size", str(m.ffn_size), "--num-attention-heads", str(m.num_attention_heads),
            "--seq-length", str(t.seq_length), "--max-position-embeddings", str(max(t.seq_length, m.seq_length)),
            "--normalization", "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm",
            "--position-embedding-type", "rope" if m.position_embedding == "rope" else "learned_absolute",
            "--attention-dropout", str(m.dropout), "--hidden-dropout", str(m.dropout)]
    if m.kv_heads != m.num_attention_heads:
        args += ["--group-query-attention", "--num-query-groups", str(m.kv_heads)]
    if m.ffn_kind == "swiglu":
        args.append("--swiglu")
    if not m.tie_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if not m.bias:
        args.append("--disable-bias-linear")
    if t.precision in ("bf16", "fp16"):
        args.append(f"--{t.precision}")
    return args


def parallel_args(plan: Plan, notes: list[str]) -> list[str]:
    c = plan.parallel
    args = ["--tensor-model-parallel-size", str(c.tp), "--pipeline-model-parallel-size", str(c.pp),
            "--context-parallel-size", str(c.cp), "--micro-batch-size", str(c.mbs),
            "--global-batch-size", str(plan.training.gbs)]
    if c.sp and c.tp > 1:
        args.append("--sequence-parallel")
    if c.vpp > 1:
        args += ["--num-layers-per-virtual-pipeline-stage", str(plan.model.num_layers // (c.pp * c.vpp))]
    else:
        args += split_args(plan)
    if c.zero in (1, 2):
        args.append("--use-distributed-optimizer")
        if c.zero == 2:
            notes.append("zero 2 runs as Megatron's distributed optimizer (optimizer state sharded, "
                         "gradients reduce-scattered)")
    elif c.zero == 3:
        args += ["--use-distributed-optimizer", "--use-megatron-fsdp",
                 "--data-parallel-sharding-strategy", "optim_grads_params"]
    return args


def split_args(plan: Plan) -> list[str]:
    """The plan's uneven split: first/last stage sizes when the middle stages are equal, else the
    full `--pipeline-model-parallel-layout` (E embedding, t layer, L head; `|` between stages)."""
    sizes = stage_sizes(plan)
    if len(sizes) == 1 or len(set(sizes)) == 1:
        return []
    middle = sizes[1:-1]
    if len(set(middle)) <= 1:
        return ["--decoder-first-pipeline-num-layers", str(sizes[0]),
                "--decoder-last-pipeline-num-layers", str(sizes[-1])]
    stages = [("E" if i == 0 else "") + f"t*{n}" + ("L" if i == len(sizes) - 1 else "") for i, n in enumerate(sizes)]
    return ["--pipeline-model-parallel-layout", "|".join(stages)]


def recompute_args(plan: Plan, notes: list[str]) -> list[str]:
    full = recompute_counts(plan, "full")
    per_chunk = [-(-n // plan.parallel.vpp) for n in full]
    if any(full):
        if len(set(full)) > 1:
            notes.append(f"the plan recomputes {full} layers per stage; Megatron's block method takes one "
                         f"count for all stages: {max(per_chunk)} per {'chunk' if plan.parallel.vpp > 1 else 'stage'}")
        return ["--recompute-granularity", "full", "--recompute-method", "block",
                "--recompute-num-layers", str(max(per_chunk))]
    if any(recompute_counts(plan, "selective")):
        return ["--recompute-granularity", "selective"]
    return []


def run_args(plan: Plan) -> list[str]:
    """Synthetic data with the model's vocabulary, so the script runs as exported."""
    return ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", str(plan.model.vocab_size),
            "--train-iters", "100", "--lr", "3.0e-4", "--log-interval", "1"]
