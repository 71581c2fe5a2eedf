"""torchtitan's launch rewritten: a TOML job config's keys, or a script's `--section.key` overrides
(engines.torchtitan.export's layout_values); a launch whose layout lives in a config module (a gplan export)
is refused with the export as the way.
"""

from __future__ import annotations

from pathlib import Path

from gplan.engines.torchtitan.export import layout_values
from gplan.errors import InputError
from gplan.launch_text import FlagStyle, file_and_member, rewrite_launch, rewrite_toml
from gplan.plan import Plan, layouts_of


WRITES_BACK = (
    "the TOML's keys, or the script's overrides")
"""What `--out-launch` writes (docs/bring-your-own-runs.md's table, from bench/engine_tables.py)."""


def write_back(plan: Plan, source: Path, target: Path, text: str) -> dict[Path, str]:
    if file_and_member(source)[0].suffix == ".py":
        raise InputError(f"{source}: a torchtitan 0.3 config registry keeps its layout in its function, which gplan "
                         "does not rewrite", hint="export the best plan as a 0.3 config module: gplan export PLAN --to "
                                                  "torchtitan")
    values = layout_values(plan, layouts_of(plan))
    if source.suffix == ".toml":
        return {target: rewrite_toml(text, toml_values(plan, values, source))}
    if "--module gplan_torchtitan" in text:
        raise InputError(f"{source} keeps its model and chunks in gplan_torchtitan.py, a gplan export",
                         hint="export the best plan instead: gplan export PLAN --to torchtitan")
    mode = values.pop("activation_checkpoint.mode")
    if mode != "none":
        raise InputError(f"the best plan recomputes every layer ({mode}), which torchtitan 0.3 sets in its "
                         "config function, not by an override", hint="export the best plan: gplan export PLAN --to torchtitan")
    return {target: rewrite_launch(text, titan_flags(values), FlagStyle(anchor=r"--parallelism\."))}


def titan_flags(values: dict[str, object]) -> dict[str, str | None]:
    """torchtitan job-config values as the overrides of a launch script (`--section.key value`; a boolean as
    its switch or its `no-` form, the other removed)."""
    flags: dict[str, str | None] = {}
    for dotted, item in values.items():
        section, key = dotted.rsplit(".", 1)
        if isinstance(item, bool):
            flags[f"--{section}.{key}"] = "" if item else None
            flags[f"--{section}.no-{key}"] = None if item else ""
        else:
            flags[f"--{dotted}"] = str(item)
    return flags


TOML_PARALLELISM = {"data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
                    "tensor_parallel_degree", "pipeline_parallel_degree", "pipeline_parallel_schedule",
                    "pipeline_parallel_microbatch_size", "pipeline_parallel_layers_per_stage", "context_parallel_degree",
                    "expert_parallel_degree", "expert_tensor_parallel_degree", "enable_async_tensor_parallel"}
"""The layout keys of [parallelism] in the job config a TOML is read by (torchtitan ≤ 0.2,
torchtitan/config/job_config.py `Parallelism`): no `enable_sequence_parallel` there — with tp > 1
sequence parallelism is always on."""



def toml_values(plan: Plan, values: dict[str, object], source: Path) -> dict[str, object]:
    """`values` as the TOML's torchtitan takes them: sequence parallelism left out (on with tp > 1, which is
    what the plan asks), a plan without it at tp > 1 refused — that torchtitan has no switch for it; async tp under
    [parallelism], where ≤ 0.2 reads it, and the compiled components as a TOML array."""
    sp = values.pop("parallelism.enable_sequence_parallel", None)
    if sp is False and plan.parallel.tp > 1:
        raise InputError(f"{source}: the best plan runs tp {plan.parallel.tp} without sequence parallelism, which the "
                         "TOML job config of torchtitan ≤ 0.2 cannot say (sequence parallel is always on with tp)",
                         hint="search with --sp, or export the plan for torchtitan 0.3: gplan export PLAN --to torchtitan")
    async_tp = values.pop("compile.enable_async_tensor_parallel", None)
    if async_tp is not None:  # ≤ 0.2 keeps the switch in [parallelism] (0.3 moved it to CompileConfig)
        values["parallelism.enable_async_tensor_parallel"] = async_tp
    if isinstance(values.get("compile.components"), str):  # a TOML array, not the command line's "a,b"
        values["compile.components"] = values["compile.components"].split(",")
    unknown = [k for k in values if k.startswith("parallelism.") and k.split(".", 1)[1] not in TOML_PARALLELISM]
    if unknown:
        raise InputError(f"{source}: the TOML's torchtitan has no {', '.join(unknown)}",
                         hint="export the plan for torchtitan 0.3: gplan export PLAN --to torchtitan")
    return values
