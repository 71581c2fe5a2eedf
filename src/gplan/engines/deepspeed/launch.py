"""Megatron-DeepSpeed's launches read: its Megatron arguments and the DeepSpeed config JSON it names
(`--deepspeed_config`). Its logs are Megatron-LM's format (engines.megatron reads them, naming this engine).
"""

from __future__ import annotations

import re
from pathlib import Path

from gplan.engines.deepspeed.flags import DS_READ, deepspeed_key_class, deepspeed_zero_class
from gplan.engines.megatron.flags import MODEL_SWITCHES, megatron_class
from gplan.engines.megatron.launch import model_of_flags, precision_of
from gplan.errors import InputError
from gplan.launch_text import arguments
from gplan.planner.launch import WORLD, Launch, classified, optional_int, value, world_size
from gplan.spec.model import ModelSpec

#: Megatron-DeepSpeed's flags gplan reads beside Megatron-LM's (deepspeedai/Megatron-DeepSpeed
#: megatron/arguments.py: --num-key-value-heads, --zero-stage, --checkpoint-activations, the MoE flags).
DS_MODEL_FLAGS = {"--num-layers": lambda m: m.num_layers, "--hidden-size": lambda m: m.hidden_size,
                  "--ffn-hidden-size": lambda m: m.expert_ffn_size if m.is_moe else m.ffn_size,
                  "--num-attention-heads": lambda m: m.num_attention_heads,
                  "--num-key-value-heads": lambda m: m.kv_heads, "--num-experts": lambda m: m.num_experts,
                  "--topk": lambda m: m.top_k}


DS_LAYOUT_FLAGS = {"--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--no-pipeline-parallel",
                   "--micro-batch-size", "--global-batch-size", "--seq-length", "--zero-stage", "--sequence-parallel",
                   "--checkpoint-activations", "--deepspeed-activation-checkpointing", "--checkpoint-num-layers",
                   "--recompute-granularity", "--recompute-method", "--recompute-num-layers", "--bf16", "--fp16",
                   "--moe-expert-parallel-size", "--deepspeed", "--deepspeed_config", "--deepspeed-config",
                   "--create-moe-param-group", "--disable-moe-token-dropping", "--moe-train-capacity-factor",
                   "--expert-interval", "--mlp-type"}


DS_MODEL_SWITCHES = MODEL_SWITCHES | {"--use-rotary-position-embeddings", "--no-position-embedding",
                                      "--rotary-position-embeddings-theta"}


def read_deepspeed_launch(path: Path, model: ModelSpec | None, text: str) -> Launch:
    """A Megatron-DeepSpeed launch: its Megatron arguments and the DeepSpeed config JSON it names
    (`--deepspeed_config`, `$HERE/…` resolved beside the script). The JSON decides the batch, the
    micro-batch, the ZeRO stage and the precision, as DeepSpeed's own DeepSpeedConfig reads them."""
    import json

    args, variables = arguments(text)
    named = value(args, "--deepspeed_config") or value(args, "--deepspeed-config")
    if not named:
        raise InputError(f"--from {path}: a DeepSpeed launch without --deepspeed_config",
                         hint="pass the script that names its ds_config.json")
    config_path = path.parent / re.sub(r"^\$\{?HERE\}?/", "", named)
    if not config_path.is_file():
        raise InputError(f"--from {path}: its DeepSpeed config {named} is not at {config_path}",
                         hint="keep ds_config.json where the script names it")
    ds = json.loads(config_path.read_text())
    model = model_of_flags(args, path) if model is None else model
    for flag, of in DS_MODEL_FLAGS.items():
        given = optional_int(args, flag)
        if given is not None and of(model) is not None and given != of(model):
            raise InputError(f"--from {path}: {flag} {given}, but {model.name} has {of(model)}",
                             hint="name the model the launch trains")
    known = DS_MODEL_FLAGS.keys() | DS_LAYOUT_FLAGS | DS_MODEL_SWITCHES | WORLD.keys()
    unread, no_effect = classified(path, {a: v for a, v in args.items() if a not in known}, megatron_class)
    zero_keys = {f"zero_optimization.{k}": v for k, v in (ds.get("zero_optimization") or {}).items() if k != "stage"}
    more_unread, more_no_effect = classified(config_path, zero_keys,
                                             lambda key, v: deepspeed_zero_class(key.split(".", 1)[1], v))
    top = {k: v for k, v in ds.items() if k not in DS_READ} | {
        f"activation_checkpointing.{k}": v for k, v in (ds.get("activation_checkpointing") or {}).items()}
    top_unread, top_no_effect = classified(config_path, top, deepspeed_key_class)
    unread, no_effect = unread + more_unread + top_unread, no_effect | more_no_effect | top_no_effect
    pp = 1 if "--no-pipeline-parallel" in args else (optional_int(args, "--pipeline-model-parallel-size") or 1)
    full = "--checkpoint-activations" in args or "activation_checkpointing" in ds
    granularity = value(args, "--recompute-granularity")
    given = {"tp": optional_int(args, "--tensor-model-parallel-size") or 1, "pp": pp, "cp": 1,
             "sp": "--sequence-parallel" in args,
             "mbs": ds.get("train_micro_batch_size_per_gpu") or optional_int(args, "--micro-batch-size") or 1,
             "zero": int(ds.get("zero_optimization", {}).get("stage", optional_int(args, "--zero-stage") or 0)),
             "recompute": "full" if full else ("selective" if granularity == "selective" else "none"),
             "ep": optional_int(args, "--moe-expert-parallel-size") or 1, "etp": 1}
    precision = ("bf16" if ds.get("bf16", {}).get("enabled") else "fp16" if ds.get("fp16", {}).get("enabled")
                 else precision_of(args))
    gbs = ds.get("train_batch_size") or optional_int(args, "--global-batch-size")
    if not gbs:
        raise InputError(f"--from {path}: no train_batch_size in {config_path.name} and no --global-batch-size",
                         hint="set train_batch_size in the DeepSpeed config")
    return Launch(source=str(path), engine="deepspeed", given=given, gbs=int(gbs),
                  seq_length=optional_int(args, "--seq-length"), precision=precision, stage_sizes=None,
                  recompute_layers=None, world_size=world_size(args, variables), unread=unread,
                  no_effect=no_effect, model=model)


# ---- the reader's part (planner.launch_files) ---------------------------------------------------------

READS = "Megatron-DeepSpeed scripts"

FROM_READS = (
    "its Megatron-DeepSpeed script with the DeepSpeed config it names, or its log")
"""What `--from` reads (docs/bring-your-own-runs.md's table, from bench/engine_tables.py)."""
CALIBRATE_READS = (
    "its log: the same arguments block and iteration lines as Megatron-LM's, the `DeepSpeedEngine "
    "configuration` JSON (which decides), `MaxMemAllocated`")
"""What `gplan calibrate` reads (— : nothing)."""
"""What this reader takes, as gplan says when a file is no launch it reads."""
PRECEDENCE = 2


def claims(path: Path, text: str) -> bool:
    """A script that hands Megatron-DeepSpeed its DeepSpeed config."""
    return bool(re.search(r"--deepspeed[_-]config|--deepspeed\b", text))


def read(path: Path, model: ModelSpec | None, text: str) -> Launch:
    return read_deepspeed_launch(path, model, text)
