"""Megatron-LM: `pretrain_gpt.py` arguments for the plan, in a ready torchrun script.

Names and rules follow `megatron/training/arguments.py` (`validate_args`); `tests/backends/
megatron_rules.py` encodes the rules these arguments depend on, each with the assertion it mirrors.
What Megatron runs differently than a plan of another target is decided before this module is called
(`spec.targets.runs_as`: `--recompute-method block` recomputes the first N layers of every chunk, or
`selective` every layer) and re-priced by `gplan export`; this module writes the split it is given.

- zero 1 is the distributed optimizer; zero 2 and 3 are Megatron-FSDP (`optim_grads`,
  `optim_grads_params`), which needs `--ckpt-format fsdp_dtensor` and CUDA_DEVICE_MAX_CONNECTIONS
  unset or above 1, while tp or cp without FSDP needs it at 1 (before Blackwell).
- The vocabulary: Megatron pads it to a multiple of `make-vocab-size-divisible-by × tp`, and its
  NullTokenizer adds one token (the end of document) to `--vocab-size`: the export asks for V − 1 and
  the largest divisor that pads nothing, so Megatron builds the plan's V rows.
"""

from __future__ import annotations

import shlex

from gplan.backends.exporters import Export, ExportContext, flag_lines, recompute_counts, stage_sizes, stamp
from gplan.backends.recipes import default_nodes, script_node_variables, script_torchrun_line
from gplan.errors import InputError
from gplan.plan import Plan
from gplan.spec.parallel import DEFAULT_RECOMPUTE_MODULES, StageLayout, chunk_sizes
from gplan.spec.targets import as_engine_runs, dp_overlaps, overlaps_tp_comm

VERSIONS = {"core_r0.16": "Megatron-LM core_r0.16 (pretrain_gpt.py; megatron/training/arguments.py as on main "
                          "at 000c4ac, 2026)"}

EXACT = (
    "dp tp pp cp sp; uneven splits (`--decoder-first/last-pipeline-num-layers` or "
    "`--pipeline-model-parallel-layout`); interleaving; zero 1 = distributed optimizer, zero 2/3 = "
    "Megatron-FSDP `optim_grads`/`optim_grads_params` with `--ckpt-format fsdp_dtensor` and "
    "CUDA_DEVICE_MAX_CONNECTIONS unset (set to 1 for tp/cp without FSDP before Blackwell); selective "
    "recompute (Megatron's core attention); rope base (`--rotary-base`), `--kv-channels`, GQA; the vocabulary"
    " (`--vocab-size V−1` for NullTokenizer's extra token, a `--make-vocab-size-divisible-by` that pads "
    "nothing)")
"""What its files run exactly as the plan priced it (docs/exporting.md's table, from bench/engine_tables.py)."""
APPROXIMATED = (
    "recompute is the first N layers of every chunk (`--recompute-method block`) or every layer selective: "
    "per-stage counts are re-priced as N = the largest count; a vocabulary tp does not divide is padded "
    "(noted); non-integer rope bases refused")
"""What it runs differently (re-priced, noted) or refuses."""

BLACKWELL = ("b200", "b300", "gb200", "gb300")
"""Hardware on which Megatron no longer needs CUDA_DEVICE_MAX_CONNECTIONS=1 for tp/cp (arch ≥ 10)."""


def export(plan: Plan, context: ExportContext) -> Export:
    args, notes = megatron_args(plan, context.layouts)
    nnodes, per_node = default_nodes(plan)
    lines = [
        "#!/bin/bash",
        stamp(plan, context.version),
        "# Run from a Megatron-LM checkout, the same command on every node (NODE_RANK 0..NNODES-1).",
        *[f"# note: {n}" for n in context.notes + notes],
        "set -euo pipefail",
        *script_node_variables(nnodes),
        *connections_lines(plan),
        "MEGATRON_ARGS=(",
        *[f"  {line}" for line in flag_lines(args)],
        ")",
        script_torchrun_line(per_node, ["pretrain_gpt.py", "${MEGATRON_ARGS[@]}", "$@"]),
    ]
    return Export({"megatron_pretrain_gpt.sh": "\n".join(lines) + "\n"}, notes)


def uses_fsdp(plan: Plan) -> bool:
    return plan.parallel.zero >= 2


def connections_lines(plan: Plan) -> list[str]:
    """Megatron-FSDP asserts CUDA_DEVICE_MAX_CONNECTIONS ≠ 1; tp or cp without it assert = 1 on Hopper
    and earlier (validate_args)."""
    c = plan.parallel
    if uses_fsdp(plan):
        return ["unset CUDA_DEVICE_MAX_CONNECTIONS  # Megatron-FSDP needs it unset or > 1"]
    if (c.tp > 1 or c.cp > 1) and not plan.cluster.primary.hardware.name.startswith(BLACKWELL):
        return ["export CUDA_DEVICE_MAX_CONNECTIONS=1  # tp/cp overlap order (Megatron asserts it before Blackwell)"]
    return []




def megatron_args(plan: Plan, layouts: list[StageLayout]) -> tuple[list[str], list[str]]:
    """The argument list for the split Megatron runs, and the notes on what was approximated."""
    notes: list[str] = []
    args = model_args(plan, notes) + parallel_args(plan, layouts) + recompute_args(plan, layouts) + run_args(plan)
    return args, notes


def model_args(plan: Plan, notes: list[str]) -> list[str]:
    m, t = plan.model, plan.training
    if m.num_encoder_layers:
        raise InputError("the Megatron export covers decoder-only models (pretrain_gpt.py)",
                         hint="export encoder–decoder plans to another target")
    if m.ffn_kind == "relu":
        raise InputError("Megatron-LM has no plain ReLU MLP", hint="use gelu or swiglu in the model file")
    if m.position_embedding not in ("rope", "learned"):
        raise InputError(f"Megatron-LM's GPT has no {m.position_embedding} positions",
                         hint="use rope or learned positions in the model file")
    args = ["--num-layers", str(m.num_layers), "--hidden-size", str(m.hidden_size),
            "--ffn-hidden-size", str(m.ffn_size), "--num-attention-heads", str(m.num_attention_heads),
            "--seq-length", str(t.seq_length), "--max-position-embeddings", str(max(t.seq_length, m.seq_length)),
            "--normalization", "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm",
            "--position-embedding-type", "rope" if m.position_embedding == "rope" else "learned_absolute",
            "--attention-dropout", str(m.dropout), "--hidden-dropout", str(m.dropout)]
    if m.head_dim:
        args += ["--kv-channels", str(m.kv_channels)]
    if m.sliding_window:
        args += ["--window-size", f"{m.sliding_window},0"]  # (left, right): causal
    if m.full_attention_every:
        args += ["--window-attn-skip-freq", str(m.full_attention_every)]  # one full layer after N−1 windowed
    if m.attention_sinks:
        args += ["--softmax-type", "learnable"]
    if m.position_embedding == "rope":
        args += ["--rotary-base", rotary_base(m.rope_theta)]
    if m.kv_heads != m.num_attention_heads:
        args += ["--group-query-attention", "--num-query-groups", str(m.kv_heads)]
    args += switch_args(plan) + expert_args(plan) + latent_attention_args(plan) + mtp_args(plan)
    if m.qk_norm:
        args.append("--qk-layernorm")
    if t.precision in LOW_PRECISION_ARGS:
        args += ["--bf16", *LOW_PRECISION_ARGS[t.precision]]
    args += ["--grad-reduce-in-bf16"] * t.grad_reduce_in_bf16 + ["--fp8-param-gather"] * t.fp8_param_gather
    args += ["--moe-use-legacy-grouped-gemm"] * t.legacy_grouped_gemm
    args += ["--overlap-moe-expert-parallel-comm"] * t.moe_a2a_overlap + CUDA_GRAPH_ARGS[t.cuda_graphs]
    args += ["--moe-shared-expert-overlap"] * t.moe_shared_expert_overlap
    if t.precision_aware_optimizer:  # Transformer Engine's FusedAdam keeps the states (on the distributed optimizer)
        args += ["--use-precision-aware-optimizer", "--main-params-dtype", t.master_weights,
                 "--exp-avg-dtype", t.adam_moments, "--exp-avg-sq-dtype", t.adam_moments]
    if t.optimizer_offload:  # HybridDeviceOptimizer: that share of the states on the host
        args += ["--optimizer-cpu-offload", "--optimizer-offload-fraction", f"{t.optimizer_offload:g}"]
        args += ["--overlap-cpu-optimizer-d2h-h2d"] * t.optimizer_offload_overlap
    return args + vocab_args(plan, notes)


CUDA_GRAPH_ARGS = {
    "none": [],
    "moe_router": ["--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope", "attn", "moe_router", "moe_preprocess"],
    "full_iteration": ["--cuda-graph-impl", "local", "--cuda-graph-scope", "full_iteration",
                       "--no-check-for-nan-in-loss-and-grad"],
}
"""TrainingSpec.cuda_graphs on Megatron's command line: partial scopes are Transformer Engine's, the whole
iteration the local implementation's, which asserts "--no-check-for-nan-in-loss-and-grad should be set
with full_iteration CUDA graph" (arguments.py, validate_args)."""


def expert_args(plan: Plan) -> list[str]:
    """Megatron-core's MoE layer as the plan prices it (cost_models.experts): E experts, top-k, the
    expert and shared widths, the leading dense layers as a `--moe-layer-freq` pattern, grouped GEMMs,
    the plan's token dispatcher (DeepEP's under flex), the router's score function (sigmoid with its expert
    bias, DeepSeek-V3's auxiliary-loss-free balancing), dropless unless the model sets a capacity factor."""
    m, c, dispatcher = plan.model, plan.parallel, plan.training.moe_dispatcher
    if not m.is_moe:
        return []
    moe_layers = m.num_layers - m.first_dense_layers
    args = ["--num-experts", str(m.num_experts), "--moe-router-topk", str(m.top_k),
            "--moe-ffn-hidden-size", str(m.expert_ffn_size),
            "--moe-layer-freq", f"([0]*{m.first_dense_layers}+[1]*{moe_layers})" if m.first_dense_layers else "1",
            "--moe-grouped-gemm", "--moe-token-dispatcher-type", dispatcher,
            *["--moe-enable-deepep"] * (dispatcher == "flex"),
            "--moe-router-score-function", m.router,
            "--expert-model-parallel-size", str(c.ep), "--expert-tensor-parallel-size", str(c.etp)]
    if m.shared_expert_ffn_size:
        args += ["--moe-shared-expert-intermediate-size", str(m.shared_expert_ffn_size)]
    if m.router == "sigmoid":
        args.append("--moe-router-enable-expert-bias")
    if m.router_groups:  # DeepSeek-V3's device-limited routing: top-k over the best groups
        args += ["--moe-router-num-groups", str(m.router_groups), "--moe-router-group-topk", str(m.router_group_topk)]
    if m.router_topk_scale:
        args += ["--moe-router-topk-scaling-factor", f"{m.router_topk_scale:g}"]
    if m.capacity_factor:
        args += ["--moe-expert-capacity-factor", str(m.capacity_factor), "--moe-token-drop-policy", "probs"]
        args += ["--moe-pad-expert-input-to-capacity"] * plan.training.moe_pad_to_capacity
    return args


def mtp_args(plan: Plan) -> list[str]:
    """DeepSeek-V3's multi-token prediction: `--mtp-num-layers` depths on the last stage (its layout's
    `m`, before the loss), as the plan prices them."""
    return ["--mtp-num-layers", str(plan.model.mtp_layers)] if plan.model.mtp_layers else []


def latent_attention_args(plan: Plan) -> list[str]:
    """MLA (Megatron's MLATransformerConfig): the ranks and head widths of `latent_attention_params`."""
    m = plan.model
    if not m.is_mla:
        return []
    args = ["--multi-latent-attention", "--kv-lora-rank", str(m.kv_lora_rank), "--qk-head-dim", str(m.kv_channels),
            "--qk-pos-emb-head-dim", str(m.qk_rope_head_dim), "--v-head-dim", str(m.v_head_dim or m.kv_channels)]
    return args + (["--q-lora-rank", str(m.q_lora_rank)] if m.q_lora_rank else [])


def switch_args(plan: Plan) -> list[str]:
    """The model switches Megatron-LM and its fork Megatron-DeepSpeed spell alike: swiglu, untied head,
    no biases, 16-bit training."""
    m, t = plan.model, plan.training
    if m.glu_clamp:  # gpt-oss's gated unit, which Megatron asserts is not also --swiglu
        args = ["--quick-geglu", "--glu-linear-offset", "1.0", "--activation-func-clamp-value", f"{m.glu_clamp:g}"]
    else:
        args = ["--swiglu"] if m.ffn_kind == "swiglu" else []
    args += [] if m.tie_embeddings else ["--untie-embeddings-and-output-weights"]
    args += [] if m.bias else ["--disable-bias-linear"]
    args += ["--add-qkv-bias"] if m.qkv_bias and not m.bias else []  # Qwen2: q/k/v biases only
    return args + ([f"--{t.precision}"] if t.precision in ("bf16", "fp16") else [])


LOW_PRECISION_ARGS = {
    "fp8": ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"],   # current (per-tensor) scaling: FP8-CS
    "mxfp8": ["--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"],       # 32-element block scales (Blackwell)
    "nvfp4": ["--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"],       # Transformer Engine ≥ 2.7
}
"""FP8 recipes on Megatron's command line (_add_transformer_engine_args), over BF16 weights and the rest."""


def rotary_base(theta: float) -> str:
    """`--rotary-base` is an int in Megatron's parser."""
    if theta != int(theta):
        raise InputError(f"rope_theta {theta} is not a whole number: Megatron's --rotary-base takes an int",
                         hint="round rope_theta in the model file, or export to another target")
    return str(int(theta))


def vocab_divisor(vocab: int, tp: int) -> int:
    """The largest power of two d ≤ 128 (Megatron's default) with d·tp dividing the vocabulary, so that
    Megatron's padding to a multiple of d·tp adds nothing; 1 when tp does not divide it."""
    d = 128
    while d > 1 and vocab % (d * tp):
        d //= 2
    return d


def vocab_args(plan: Plan, notes: list[str]) -> list[str]:
    vocab, tp = plan.model.vocab_size, plan.parallel.tp
    d = vocab_divisor(vocab, tp)
    if vocab % (d * tp):
        padded = -(-vocab // tp) * tp
        notes.append(f"Megatron pads the vocabulary to a multiple of tp={tp}: {padded} rows, not the plan's {vocab}")
    # NullTokenizer's vocabulary is --vocab-size + 1 (its end-of-document token).
    return ["--vocab-size", str(vocab - 1), "--make-vocab-size-divisible-by", str(d)]


def parallel_args(plan: Plan, layouts: list[StageLayout]) -> list[str]:
    c = plan.parallel
    args = ["--tensor-model-parallel-size", str(c.tp), "--pipeline-model-parallel-size", str(c.pp),
            "--context-parallel-size", str(c.cp), "--micro-batch-size", str(c.mbs),
            "--global-batch-size", str(plan.training.gbs)]
    if c.sp and c.tp > 1:
        args.append("--sequence-parallel")
    args += overlap_args(plan)
    sizes = stage_sizes(layouts)
    if c.vpp > 1 and len(set(sizes)) == 1 and sizes[0] % c.vpp == 0:
        args += ["--num-layers-per-virtual-pipeline-stage", str(sizes[0] // c.vpp)]
    elif c.vpp > 1:
        args += ["--pipeline-model-parallel-layout", interleaved_layout(sizes, c.vpp, plan.model.mtp_layers)]
    else:
        args += split_args(layouts, plan.model.mtp_layers)
    if c.zero == 1:
        args.append("--use-distributed-optimizer")
    elif uses_fsdp(plan):
        strategy = "optim_grads" if c.zero == 2 else "optim_grads_params"
        args += ["--use-distributed-optimizer", "--use-megatron-fsdp", "--data-parallel-sharding-strategy", strategy,
                 "--ckpt-format", "fsdp_dtensor"]
    return args


def overlap_args(plan: Plan) -> list[str]:
    """The communication overlap the plan was priced with (cost_models.step): tp's collectives behind
    the GEMMs where its engine's rule says so (`overlaps_tp_comm`; userbuffers bootstrapped over NCCL,
    Megatron's default), the data-parallel gradient reduction behind the backward (`--overlap-grad-
    reduce`; off by default in Megatron) and, with the distributed optimizer or Megatron-FSDP, the
    parameter all-gather behind the next forward (`--overlap-param-gather`, which needs both;
    `overlaps_param_gather`) — as Megatron-LM runs the plan (`as_engine_runs`: the re-priced step its note states,
    for a plan searched for another engine)."""
    c = plan.parallel
    t = as_engine_runs(plan.training, "megatron", c)
    args = ["--tp-comm-overlap"] if overlaps_tp_comm(t, c, plan.cluster.smallest_domain_devices) else []
    reduced, gathered = dp_overlaps(t, c)
    if c.dp * c.cp > 1 and reduced:
        args.append("--overlap-grad-reduce")
        if c.zero >= 1 and gathered:
            args.append("--overlap-param-gather")
    return args


def interleaved_layout(sizes: list[int], vpp: int, mtp: int = 0) -> str:
    """Uneven interleaved stages as Megatron's `--pipeline-model-parallel-layout`: the pp·vpp virtual
    stages in order, virtual stage j = chunk j // pp of rank j % pp, each rank's layers dealt over its
    chunks as evenly as possible (`chunk_sizes`: only the first rank's first chunk and the last rank's
    last may come out empty, holding the embedding E or the loss L alone)."""
    pp = len(sizes)
    chunks = [chunk_sizes(n, vpp, first=r == 0, last=r == pp - 1) for r, n in enumerate(sizes)]
    stages = []
    for j in range(pp * vpp):
        rank, chunk = j % pp, j // pp
        layers = chunks[rank][chunk]
        last = j == pp * vpp - 1  # the MTP depths, then the loss, close the last virtual stage (megatron-core's rule)
        stages.append(("E" if j == 0 else "") + (f"t*{layers}" if layers else "") + ("m" * mtp + "L" if last else ""))
    return "|".join(stages)


def split_args(layouts: list[StageLayout], mtp: int = 0) -> list[str]:
    """An uneven split: first/last stage sizes when the middle stages are equal, else the full
    `--pipeline-model-parallel-layout` (E embedding, t layer, L loss; `|` between stages)."""
    sizes = stage_sizes(layouts)
    if len(sizes) == 1 or len(set(sizes)) == 1:
        return []
    middle = sizes[1:-1]
    if len(set(middle)) <= 1:
        return ["--decoder-first-pipeline-num-layers", str(sizes[0]),
                "--decoder-last-pipeline-num-layers", str(sizes[-1])]
    stages = [("E" if i == 0 else "") + f"t*{n}" + ("m" * mtp + "L" if i == len(sizes) - 1 else "")
              for i, n in enumerate(sizes)]
    return ["--pipeline-model-parallel-layout", "|".join(stages)]


def recompute_args(plan: Plan, layouts: list[StageLayout]) -> list[str]:
    """The split arrives as Megatron runs it: the same number of fully recomputed layers per chunk
    (`block`), or every layer selective, recomputing the plan's modules (`--recompute-modules`, written
    only where they are not Megatron's default, core_attn)."""
    full = recompute_counts(layouts, "full")
    if any(full):
        per_chunk = max(-(-n // plan.parallel.vpp) for n in full)
        return ["--recompute-granularity", "full", "--recompute-method", "block",
                "--recompute-num-layers", str(per_chunk)]
    if plan.parallel.offload_layers:  # offloading runs without recomputation (spec.parallel's _offload)
        return ["--cpu-offloading", "--cpu-offloading-num-layers", str(plan.parallel.offload_layers)]
    if any(recompute_counts(layouts, "selective")):
        modules = plan.parallel.recompute_modules
        named = ["--recompute-modules", *modules] if modules != DEFAULT_RECOMPUTE_MODULES else []
        return ["--recompute-granularity", "selective", *named]
    return []


#: The flags a launch's layout consists of: what `gplan search --from … --out-launch` may change in a user's
#: own script (everything else in it is kept as it was).
LAYOUT_OWNED = ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
                "--micro-batch-size", "--sequence-parallel", "--tp-comm-overlap", "--overlap-grad-reduce",
                "--overlap-param-gather", "--num-layers-per-virtual-pipeline-stage",
                "--virtual-pipeline-model-parallel-size", "--pipeline-model-parallel-layout",
                "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
                "--use-distributed-optimizer", "--use-megatron-fsdp", "--data-parallel-sharding-strategy",
                "--recompute-granularity", "--recompute-method", "--recompute-num-layers", "--recompute-modules",
                "--cpu-offloading", "--cpu-offloading-num-layers", "--expert-model-parallel-size", "--expert-tensor-parallel-size")
KEEP_UNLESS_SET = ("--ckpt-format",)
"""Set only where the layout needs it (Megatron-FSDP's fsdp_dtensor checkpoints); else the launch's own."""


def layout_flags(plan: Plan, layouts: list[StageLayout]) -> dict[str, str | None]:
    """The layout flags of the plan as its export writes them (`parallel_args`, `recompute_args`: the
    arguments Megatron's rules were checked on): flag -> value ("" for a switch), None for an owned flag
    the plan does not use."""
    args = parallel_args(plan, layouts) + recompute_args(plan, layouts) + expert_parallel_args(plan)
    found: dict[str, str | None] = {flag: None for flag in LAYOUT_OWNED}
    for i, token in enumerate(args):
        if token.startswith("--"):
            following = next((j for j in range(i + 1, len(args)) if args[j].startswith("--")), len(args))
            # "" for a switch; several values for nargs="*"; shell-quoted as the export writes them (a layout's `|`)
            found[token] = " ".join(shlex.quote(v) for v in args[i + 1:following])
    return {k: v for k, v in found.items() if k in LAYOUT_OWNED or k in KEEP_UNLESS_SET}


def expert_parallel_args(plan: Plan) -> list[str]:
    c = plan.parallel
    if not plan.model.is_moe:
        return []
    return ["--expert-model-parallel-size", str(c.ep), "--expert-tensor-parallel-size", str(c.etp)]


def run_args(plan: Plan) -> list[str]:
    """Synthetic data, so the script runs as exported."""
    return ["--mock-data", "--tokenizer-type", "NullTokenizer", "--train-iters", "100", "--lr", "3.0e-4",
            "--log-interval", "1"]
