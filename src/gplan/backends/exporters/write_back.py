"""A better plan written back into the user's own launch (`gplan search --from FILE --out-launch NEW`):
the launch as it was, with only the flags or keys of its layout changed — as the plan's export writes
them for that engine (the arguments each engine's own code was checked on) — and everything else
(data, tokenizer, checkpoints, learning-rate schedule, logging, the flags gplan does not own) kept.

Megatron-LM: its script's layout flags (megatron.layout_flags). torchtitan: a TOML job config's keys, or a
script's `--section.key` overrides (torchtitan.layout_values); a launch whose layout lives in a config
module (a gplan export) is refused with the export as the way. Megatron-DeepSpeed: its script's layout
flags and the DeepSpeed config it names (batch, micro-batch, accumulation, ZeRO stage, activation
checkpointing), written beside the new script under the name the script uses. MindFormers: its training
YAML's layout keys (`parallel_config`, the optimizer-parallel switches, `recompute_config`'s counts, the
`offset` split, `runner_config`'s batch), rewritten line by line so comments and every other key stay.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from gplan.backends.exporters import megatron, torchtitan
from gplan.backends.exporters.deepspeed import ds_config, megatron_deepspeed_args
from gplan.errors import InputError
from gplan.launch_text import rewrite_launch, rewrite_toml, rewrite_yaml, titan_flags
from gplan.plan import Plan, layouts_of

DS_OWNED = ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--no-pipeline-parallel",
            "--micro-batch-size", "--global-batch-size", "--zero-stage", "--sequence-parallel",
            "--checkpoint-activations", "--deepspeed-activation-checkpointing", "--checkpoint-num-layers",
            "--recompute-granularity", "--recompute-method", "--recompute-num-layers", "--moe-expert-parallel-size")
"""The flags of a Megatron-DeepSpeed launch's layout."""
DS_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "zero_optimization",
           "activation_checkpointing")
"""The DeepSpeed config's keys of the layout (zero_optimization: its stage)."""


def write_back(plan: Plan, engine: str, source: Path, target: Path) -> dict[Path, str]:
    """The files to write: `target`, and for DeepSpeed its config beside it."""
    text, layouts = source.read_text(), layouts_of(plan)
    if engine == "megatron" and "sbatch_benchmarking.sh" in text:
        raise InputError(f"{source} is a Megatron-MoE-ModelZoo launch line: its layout lives in its variables, the "
                         "YAML map and runtime.conf, which gplan does not rewrite",
                         hint="export the best plan: gplan export PLAN --to megatron")
    if engine == "megatron":
        return {target: rewrite_launch(text, megatron.layout_flags(plan, layouts), megatron.KEEP_UNLESS_SET)}
    if engine == "torchtitan":
        values = torchtitan.layout_values(plan, layouts)
        if source.suffix == ".toml":
            return {target: rewrite_toml(text, toml_values(plan, values, source))}
        if "--module gplan_torchtitan" in text:
            raise InputError(f"{source} keeps its model and chunks in gplan_torchtitan.py, a gplan export",
                             hint="export the best plan instead: gplan export PLAN --to torchtitan")
        mode = values.pop("activation_checkpoint.mode")
        if mode != "none":
            raise InputError(f"the best plan recomputes every layer ({mode}), which torchtitan 0.3 sets in its "
                             "config function, not by an override", hint="export the best plan: gplan export PLAN --to torchtitan")
        return {target: rewrite_launch(text, titan_flags(values))}
    if engine == "deepspeed":
        return deepspeed_files(plan, source, target, text)
    if engine == "mindformers":
        return {target: rewrite_yaml(text, mindformers_values(plan, text))}
    raise InputError(f"--out-launch rewrites Megatron-LM, torchtitan, Megatron-DeepSpeed and MindFormers launches, "
                     f"not {engine}'s", hint=f"gplan export PLAN --to {engine}")


TOML_PARALLELISM = {"data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
                    "tensor_parallel_degree", "pipeline_parallel_degree", "pipeline_parallel_schedule",
                    "pipeline_parallel_microbatch_size", "pipeline_parallel_layers_per_stage", "context_parallel_degree",
                    "expert_parallel_degree", "expert_tensor_parallel_degree"}
"""The layout keys of [parallelism] in the job config a TOML is read by (torchtitan ≤ 0.2,
torchtitan/config/job_config.py `Parallelism`): no `enable_sequence_parallel` there — with tp > 1
sequence parallelism is always on."""


def toml_values(plan: Plan, values: dict[str, object], source: Path) -> dict[str, object]:
    """`values` as the TOML's torchtitan takes them: sequence parallelism left out (on with tp > 1, which is
    what the plan asks), a plan without it at tp > 1 refused — that torchtitan has no switch for it."""
    sp = values.pop("parallelism.enable_sequence_parallel", None)
    if sp is False and plan.parallel.tp > 1:
        raise InputError(f"{source}: the best plan runs tp {plan.parallel.tp} without sequence parallelism, which the "
                         "TOML job config of torchtitan ≤ 0.2 cannot say (sequence parallel is always on with tp)",
                         hint="search with --sp, or export the plan for torchtitan 0.3: gplan export PLAN --to torchtitan")
    unknown = [k for k in values if k.startswith("parallelism.") and k.split(".", 1)[1] not in TOML_PARALLELISM]
    if unknown:
        raise InputError(f"{source}: the TOML's torchtitan has no {', '.join(unknown)}",
                         hint="export the plan for torchtitan 0.3: gplan export PLAN --to torchtitan")
    return values


MF_OWNED = {"parallel_config": ("data_parallel", "model_parallel", "pipeline_stage", "context_parallel",
                                "use_seq_parallel", "micro_batch_num", "vocab_emb_dp", "expert_parallel"),
            "parallel": ("enable_parallel_optimizer",), "parallel.parallel_optimizer_config": ("gradient_accumulation_shard",),
            "parallel.pipeline_config": ("pipeline_interleave", "pipeline_scheduler"),
            "recompute_config": ("recompute", "select_recompute"),
            "model.model_config": ("offset", "pp_interleave_num"),
            "runner_config": ("batch_size", "gradient_accumulation_steps")}
"""The keys of a MindFormers YAML's layout (the export's sections), by section."""


def mindformers_values(plan: Plan, text: str) -> dict[str, object]:
    """The layout keys of the plan as MindFormers' export writes them; an optimizer shard size of the
    user's set to -1 (every data-parallel rank: the sharding gplan prices)."""
    import yaml

    from gplan.backends.exporters.mindformers import sections

    written, values = sections(plan), {}
    for section, keys in MF_OWNED.items():
        node = written
        for part in section.split("."):
            node = node.get(part) or {}
        values |= {f"{section}.{key}": node[key] for key in keys if key in node}
    options = ((yaml.safe_load(text) or {}).get("parallel") or {}).get("parallel_optimizer_config") or {}
    if options.get("optimizer_weight_shard_size", -1) != -1:
        values["parallel.parallel_optimizer_config.optimizer_weight_shard_size"] = -1
    return values


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
    return {target: rewrite_launch(text, flags), target.parent / Path(name).name: json.dumps(updated, indent=2) + "\n"}
