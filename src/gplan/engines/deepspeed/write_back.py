"""A Megatron-DeepSpeed launch rewritten: its script's layout flags and the DeepSpeed config it names (batch,
micro-batch, accumulation, ZeRO stage, activation checkpointing), written beside the new script under the
name the script uses.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from gplan.engines.deepspeed.export import ds_config, megatron_deepspeed_args
from gplan.engines.megatron.write_back import STYLE
from gplan.errors import InputError
from gplan.launch_text import rewrite_launch
from gplan.plan import Plan, layouts_of


WRITES_BACK = (
    "the script and its DeepSpeed config")
"""What `--out-launch` writes (docs/bring-your-own-runs.md's table, from bench/engine_tables.py)."""


def write_back(plan: Plan, source: Path, target: Path, text: str) -> dict[Path, str]:
    return deepspeed_files(plan, source, target, text)


DS_OWNED = ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--no-pipeline-parallel",
            "--micro-batch-size", "--global-batch-size", "--zero-stage", "--sequence-parallel",
            "--checkpoint-activations", "--deepspeed-activation-checkpointing", "--checkpoint-num-layers",
            "--recompute-granularity", "--recompute-method", "--recompute-num-layers", "--moe-expert-parallel-size")
"""The flags of a Megatron-DeepSpeed launch's layout."""



DS_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "zero_optimization",
           "activation_checkpointing")
"""The DeepSpeed config's keys of the layout (zero_optimization: its stage)."""



def deepspeed_files(plan: Plan, source: Path, target: Path, text: str) -> dict[Path, str]:
    layouts = layouts_of(plan)
    args = megatron_deepspeed_args(plan, layouts, [])
    flags: dict[str, str | None] = {flag: None for flag in DS_OWNED}
    for i, token in enumerate(args):
        if token in DS_OWNED:
            following = args[i + 1] if i + 1 < len(args) else "--"
            flags[token] = "" if following.startswith("--") else following
    named = re.search(r"--deepspeed[_-]config[= ]\"?([^\s\"]+)", text)
    if named is None:
        raise InputError(f"{source}: a DeepSpeed launch without --deepspeed_config", hint="name its ds_config.json")
    name = re.sub(r"^\$\{?HERE\}?/", "", named.group(1))
    original = json.loads((source.parent / name).read_text())
    fresh = ds_config(plan, layouts)
    updated = {k: v for k, v in original.items() if k not in DS_KEYS}
    updated["zero_optimization"] = {**original.get("zero_optimization", {}), "stage": plan.parallel.zero}
    updated |= {k: fresh[k] for k in DS_KEYS if k in fresh and k != "zero_optimization"}
    return {target: rewrite_launch(text, flags, STYLE), target.parent / Path(name).name: json.dumps(updated, indent=2) + "\n"}
