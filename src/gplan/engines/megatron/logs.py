"""A Megatron-LM (or Megatron-DeepSpeed) training log as a calibration run: the configuration from the
arguments block it prints at start-up, the steady-state step from its iteration lines. Megatron-DeepSpeed
prints the same block (its fork of arguments.py) with `deepspeed`, `zero_stage` and
`checkpoint_activations`, and the same iteration lines; its runs are priced as DeepSpeed runs them.

Formats, from Megatron-LM's own logging (NVIDIA/Megatron-LM main, 2026):
  - `megatron/training/arguments.py`, `_print_args`: a block between `------------------------ arguments
    ------------------------` and `-------------------- end of arguments ---------------------`, one
    `  {name} {dots} {value}` line per argument, the dots padding the name to 48 characters;
  - `megatron/training/training.py`, `training_log`: ` iteration {:8d}/{:8d} | consumed samples: … |
    elapsed time per iteration (ms): {:.1f} | throughput per GPU (TFLOP/s/GPU): {:.1f} | … | number of
    skipped iterations: {:3d} | number of nan iterations: {:3d} |`, every `--log-interval` iterations,
    the elapsed time averaged over the interval;
  - `megatron/training/utils.py`, `report_memory`: `[Rank r] (after N iterations) memory (MB) | allocated: …
    | max allocated: … | reserved: … | max reserved: …`;
  - `megatron/training/tokenizer/tokenizer.py`, `_vocab_size_with_padding`: ` > padded vocab (size: V) with D
    dummy tokens (new size: P)`, the vocabulary the model was built with where the block has no
    `padded_vocab_size`.
Older Megatron-LM (2021–22) prints the same block with a flag since renamed, `checkpoint_activations`
(every layer recomputed, `--recompute-granularity full` today), and without `add_bias_linear` (its linears
always had biases).
The steady-state step is the median elapsed time of the logged intervals after the first `warmup`
(compilation, allocator warm-up), leaving out intervals that skipped iterations — as the iteration line
counts them, or, under DeepSpeed's engine (whose fp16 overflows Megatron-DeepSpeed's line does not
count), as DeepSpeed's own `step=N, skipped=K` lines do. A log whose
configuration is not complete, that logged too few intervals, or that ends in a traceback is refused
with what is missing — never guessed.
"""

from __future__ import annotations

import ast
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from gplan.errors import InputError
from gplan.engines.deepspeed import logs as deepspeed
from gplan.spec.model import ModelSpec

ARGS_BEGIN = re.compile(r"-{8,} arguments -{8,}")
ARGS_END = re.compile(r"-{8,} end of arguments -{8,}")
ARG_LINE = re.compile(r"(?:^|\]:|\s)\s*(\w+) \.{2,} (.*?)(?:\.{3,}(?:default|updated|\w+))?\s*$")
"""One argument line, after any launcher prefix (torchrun's `--tee` writes `[default0]:`), without the
`………default` marker Megatron-DeepSpeed appends."""
ITERATION = re.compile(r"iteration\s+(\d+)/\s*(\d+) \|.*?elapsed time per iteration \(ms\): ([\d.]+) \|(.*)$", re.MULTILINE)
SKIPPED = re.compile(r"number of skipped iterations:\s*(\d+)")
MEMORY = re.compile(r"\[Rank (\d+)\] \(after (\d+) iterations\) memory \(MB\) \| allocated: ([\d.]+) \| "
                    r"max allocated: ([\d.]+) \| reserved: ([\d.]+) \| max reserved: ([\d.]+)")
PADDED_VOCAB = re.compile(r"padded vocab \(size: \d+\) with \d+ dummy tokens \(new size: (\d+)\)")
REQUIRED = ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "micro_batch_size", "global_batch_size",
            "tensor_model_parallel_size", "pipeline_model_parallel_size", "world_size")
WARMUP_INTERVALS = 1
"""Logged intervals left out at the start (the first holds compilation and allocator warm-up)."""


@dataclass(frozen=True)
class MegatronLog:
    source: str
    args: dict[str, object]
    step_s: float
    """The steady-state step time: the median logged interval after warm-up, skipped ones left out."""
    intervals: int
    max_allocated_bytes: float | None


def read_megatron_log(path: Path, warmup: int = WARMUP_INTERVALS) -> MegatronLog:
    text = path.read_text(errors="replace")
    args = arguments_block(text, path)
    skipped_by_engine = deepspeed.skipped_steps(text)
    iterations = [(int(m.group(1)), float(m.group(3)), _skipped(m.group(4)) or int(m.group(1)) in skipped_by_engine)
                  for m in ITERATION.finditer(text)]
    last = text.rstrip().splitlines()[-40:]
    if any("Traceback (most recent call last)" in line for line in last) or "CUDA out of memory" in text:
        raise InputError(f"{path}: the run crashed after iteration {iterations[-1][0] if iterations else 0} (a "
                         "traceback ends the log)", hint="calibrate on runs that completed their steps")
    steady = [ms for _, ms, skipped in iterations[warmup:] if not skipped]
    if not steady:
        raise InputError(f"{path}: {len(iterations)} iteration line(s) logged, none after the first {warmup} "
                         "(warm-up) without skipped iterations", hint="log more iterations (--log-interval, --train-iters)")
    peaks = [float(m.group(4)) * 2**20 for m in MEMORY.finditer(text)]
    peak = max(peaks) if peaks else deepspeed.max_allocated_bytes(text)
    return MegatronLog(str(path), args, statistics.median(steady) / 1000.0, len(steady), peak)


def arguments_block(text: str, path: Path) -> dict[str, object]:
    begin, end = ARGS_BEGIN.search(text), ARGS_END.search(text)
    if begin is None:
        if deepspeed.SIGNATURE.search(text):
            raise InputError(f"{path}: a DeepSpeed log without Megatron-DeepSpeed's arguments block: the model it "
                             "trained is not in it", hint="pass a Megatron-DeepSpeed log (its arguments block names "
                             "the model) or a gplan launch run report")
        raise InputError(f"{path}: no Megatron-LM arguments block (`---- arguments ----`)",
                         hint="pass the log of the rank that prints the arguments (rank 0), from its start")
    if end is None:
        raise InputError(f"{path}: the arguments block is cut short (no `end of arguments`)",
                         hint="pass the whole log from its start")
    args = {}
    for line in text[begin.end():end.start()].splitlines():
        match = ARG_LINE.search(line)
        if match:
            args[match.group(1)] = _value(match.group(2).strip())
    padded = PADDED_VOCAB.search(text, end.end())
    if padded and args.get("padded_vocab_size") is None:
        args["padded_vocab_size"] = int(padded.group(1))
    if args.get("deepspeed"):  # the engine ran its JSON's batch, ZeRO stage and precision
        ds_config = deepspeed.engine_config(text, str(path))
        args |= deepspeed.overrides(ds_config) if ds_config else {}
    missing = [name for name in REQUIRED if args.get(name) is None]
    if missing:
        raise InputError(f"{path}: the arguments block has no {', '.join(missing)}",
                         hint="the configuration must be complete to be priced; gplan does not guess it")
    return args


def _value(text: str) -> object:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _skipped(rest: str) -> int:
    found = SKIPPED.search(rest)
    return int(found.group(1)) if found else 0


def model_from_args(args: dict, name: str) -> ModelSpec:
    """The model Megatron built, from its arguments (the inverse of gplan's Megatron export)."""
    a = args.get
    layer_freq = a("moe_layer_freq", 1)
    first_dense = 0
    if isinstance(layer_freq, list):
        first_dense = next((i for i, v in enumerate(layer_freq) if v), len(layer_freq))
    fields = {
        "name": name, "num_layers": a("num_layers"), "hidden_size": a("hidden_size"),
        "ffn_hidden_size": a("ffn_hidden_size"), "num_attention_heads": a("num_attention_heads"),
        "num_kv_heads": (a("num_query_groups") if a("group_query_attention") else None) or a("num_key_value_heads"),
        "head_dim": a("kv_channels") if a("kv_channels") and a("kv_channels") != a("hidden_size") // a("num_attention_heads") else None,
        "vocab_size": _vocab(args), "seq_length": a("seq_length"),
        "ffn_kind": "swiglu" if a("swiglu") else "gelu",
        "norm": "rmsnorm" if str(a("normalization")).lower() == "rmsnorm" else "layernorm",
        "position_embedding": "rope" if a("position_embedding_type") == "rope" or a("use_rotary_position_embeddings")
        else "learned",
        "rope_theta": float(a("rotary_base") or a("rotary_position_embeddings_theta") or 10000),
        "tie_embeddings": not a("untie_embeddings_and_output_weights"),
        "bias": bool(a("add_bias_linear", True)),  # absent: a Megatron from before the flag, biases always on
        "qkv_bias": bool(a("add_qkv_bias", False)) and not a("add_bias_linear", True),
        "qk_norm": bool(a("qk_layernorm", False)), "mtp_layers": a("mtp_num_layers") or 0,
        "dropout": float(a("hidden_dropout") or 0.0),
    }
    if a("multi_latent_attention"):
        fields |= latent_attention(args)
    if experts(args):
        fields |= {"num_experts": experts(args), "top_k": a("moe_router_topk"),
                   "moe_ffn_hidden_size": a("moe_ffn_hidden_size"), "first_dense_layers": first_dense,
                   "shared_expert_ffn_hidden_size": a("moe_shared_expert_intermediate_size"),
                   "num_shared_experts": 1 if a("moe_shared_expert_intermediate_size") else 0,
                   "router": a("moe_router_score_function") or "softmax"}
    return ModelSpec.model_validate({k: v for k, v in fields.items() if v is not None})


def latent_attention(args: dict) -> dict:
    """The MLA fields of `--multi-latent-attention`, each flag the launch leaves out at Megatron's default
    (`engines.megatron.arguments`, its `_add_mla_args`: kv LoRA 32, qk 128 + rope 64, v 128, no q LoRA): the
    query-key width is `--qk-head-dim` (`--kv-channels` is not read by MLA), every head its own key and value."""
    from gplan.engines.megatron.arguments import arguments

    defaults = arguments()

    def given(flag: str) -> int | None:
        value = args.get(flag[2:].replace("-", "_"))
        if value is None:
            value = defaults[flag][1]
        return int(value) if value is not None else None

    return {"q_lora_rank": given("--q-lora-rank"), "kv_lora_rank": given("--kv-lora-rank"),
            "head_dim": given("--qk-head-dim"), "qk_rope_head_dim": given("--qk-pos-emb-head-dim"),
            "v_head_dim": given("--v-head-dim"), "num_kv_heads": args.get("num_attention_heads")}


def experts(args: dict) -> int | None:
    """The routed experts per MoE layer; None for a dense model. Megatron-DeepSpeed prints `num_experts` as a
    list (one entry per expert group, `[1]` for a dense model)."""
    found = args.get("num_experts")
    if isinstance(found, list):
        found = max(found) if found else None
    return found if found and found > 1 else None


def _vocab(args: dict) -> int:
    """The vocabulary Megatron built: the padded size when it printed one, else --vocab-size (plus the end
    of document token of its NullTokenizer)."""
    if args.get("padded_vocab_size"):
        return args["padded_vocab_size"]
    vocab = args.get("vocab_size")
    if not vocab:
        raise InputError("the arguments block has no vocab_size or padded_vocab_size",
                         hint="the vocabulary decides the embedding and head: it must be in the log")
    return vocab + (1 if args.get("tokenizer_type") == "NullTokenizer" else 0)


def config_values(args: dict) -> dict:
    """The ParallelConfig options the arguments set."""
    a = args.get
    fsdp = a("use_megatron_fsdp")
    zero = ({"optim": 1, "optim_grads": 2, "optim_grads_params": 3}.get(a("data_parallel_sharding_strategy"), 3)
            if fsdp else (1 if a("use_distributed_optimizer") else 0))
    # --checkpoint-activations (Megatron-DeepSpeed, and Megatron-LM before --recompute-granularity): every layer
    granularity = "full" if a("checkpoint_activations") else a("recompute_granularity")
    if a("deepspeed"):  # Megatron-DeepSpeed: ZeRO by stage
        zero = int(a("zero_stage") or 0)
    values = {"tp": a("tensor_model_parallel_size"), "pp": a("pipeline_model_parallel_size"),
              "cp": a("context_parallel_size") or 1, "vpp": a("virtual_pipeline_model_parallel_size") or 1,
              "sp": bool(a("sequence_parallel")), "mbs": a("micro_batch_size"), "zero": zero,
              "recompute": granularity if granularity in ("full", "selective") else "none"}
    if isinstance(a("recompute_modules"), (list, tuple)):  # printed as a list: ['core_attn']
        values["recompute_modules"] = tuple(a("recompute_modules"))
    if experts(args):
        values |= {"ep": a("expert_model_parallel_size") or a("moe_expert_parallel_size") or 1,
                   "etp": a("expert_tensor_parallel_size") or a("tensor_model_parallel_size")}
    return values


def precision(args: dict) -> str:
    if args.get("fp4"):
        return "nvfp4"
    if args.get("fp8"):
        return "mxfp8" if args.get("fp8_recipe") == "mxfp8" else "fp8"
    return "bf16" if args.get("bf16") else ("fp16" if args.get("fp16") else "fp32")


def engine(args: dict) -> str:
    return "deepspeed" if args.get("deepspeed") else "megatron"


def is_log(text: str) -> bool:
    """Megatron-LM's arguments block (Megatron-DeepSpeed's too), or its start where the log was cut short,
    or DeepSpeed's engine lines (read here to be refused: a DeepSpeed log alone names no model)."""
    return bool(ARGS_END.search(text) or ARGS_BEGIN.search(text) or deepspeed.SIGNATURE.search(text))
