"""A launch as gplan prices it, and what every engine's launch reader shares: reading values out of argument
lists, the world size, the stage layouts a launch's split and recompute give, and the configuration on the
devices priced. Each engine's reader is its folder's `launch.py` (gplan.engines); which one reads a file is
planner.launch_files' choice.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gplan.errors import InputError
from gplan.spec.model import ModelSpec
from gplan.spec.parallel import LayerCount, StageLayout, even_stage_sizes

#: Launcher arguments (torchrun) and the values of the variables scripts use for the world size.
WORLD = {"--nproc_per_node": "per_node", "--nproc-per-node": "per_node", "--nnodes": "nodes"}


VARIABLES = {"GPUS_PER_NODE": "per_node", "NPROC_PER_NODE": "per_node", "NNODES": "nodes", "NUM_NODES": "nodes",
             "NGPU": "per_node"}
"""NGPU: torchtitan's run_train.sh (`torchrun --nproc_per_node=${NGPU}`)."""


@dataclass(frozen=True)
class Launch:
    """A launch as gplan prices it."""

    source: str
    engine: str
    given: dict[str, Any]
    """ParallelConfig options the launch sets (dp from the world size when it says)."""
    gbs: int
    seq_length: int | None
    precision: str
    stage_sizes: list[int] | None
    """Layers per pipeline stage when the launch splits them unevenly; None: Megatron's even split."""
    recompute_layers: int | None
    """`--recompute-method block`: the layers of every chunk recomputed fully; None: per `given`."""
    world_size: int | None
    unread: list[str] = field(default_factory=list)
    """Flags gplan does not read (data, tokenizer, checkpoints, learning rate, logging…)."""
    local_batch: int | None = None
    """Sequences per data-parallel rank that one run of the pipeline schedule takes (torchtitan's
    `local_batch_size`, NeMo AutoModel's): the global batch over it and dp is how often the schedule runs in a
    step (`ParallelConfig.schedule_runs`); where the launch sets no global batch, torchtitan's step is one."""
    plan: Any = None
    """The gplan plan a launch of gplan's own worker runs (a SLURM or Kubernetes export): priced as written."""
    per_stage_recompute: tuple | None = None
    """MindFormers' (full, selective) recompute counts per stage (or True for every layer)."""
    engine_options: dict[str, bool | str] = field(default_factory=dict)
    """Megatron's engine options the launch sets (TrainingSpec's grad_reduce_in_bf16, fp8_param_gather,
    moe_a2a_overlap, cuda_graphs)."""
    no_effect: dict[str, str] = field(default_factory=dict)
    """Flags read that change neither the layout nor its cost, with why (engines.<engine>.flags)."""
    model: ModelSpec | None = None
    """The model the launch trains: the one named beside it, else the one its shape flags or its model name
    and flavor state."""
    model_from_launch: str | None = None
    """Where the model came from when MODEL was left out (said beside the prediction)."""
    measured_step_s: float | None = None
    """A log's own steady step (the readers `gplan calibrate` uses), shown beside the prediction."""
    measured_device_tokens_per_s: float | None = None
    """torchtitan logs tokens/s per device, not the step: the step follows from the batch and devices priced."""
    default_cluster: tuple[str, str] | None = None
    """(bundled cluster, why) where the launch names its devices' kind (MindFormers' `context.device_target`
    Ascend): priced there when the command line names no cluster or hardware, and said."""
    overridden: dict[str, Any] = field(default_factory=dict)
    """What the command line set over the launch (`estimate --from … --loss-chunks 8`): option -> the launch's
    own value, said beside the prediction."""


def classified(path: Path, flags: dict[str, Any], rule) -> tuple[list[str], dict[str, str]]:
    """The flags a reader does not read, by `rule` (engines.<engine>.flags): (not read, {read with no effect:
    why}); a flag gplan cannot price is refused, naming it and why."""
    refused, unread, no_effect = [], [], {}
    for flag, given in sorted(flags.items()):
        kind, why = rule(flag, given)
        if kind == "refused":
            refused.append(f"{flag} ({why})")
        elif why in ("not a layout setting",):
            unread.append(flag)
        else:
            no_effect[flag] = why
    if refused:
        raise InputError(f"--from {path}: gplan cannot price {'; '.join(refused)}",
                         hint="remove it, or price the launch without it (gplan estimate MODEL ...)")
    return unread, no_effect


def number(text: str):
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def value(args: dict, flag: str) -> str | None:
    values = args.get(flag)
    return values[0] if values else None


def optional_int(args: dict, flag: str) -> int | None:
    text = value(args, flag)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise InputError(f"{flag} {text!r}: expected an integer", hint="gplan reads literal values, not "
                         "shell variables: write the number in the script, or pass it to gplan") from None


def integer(args: dict, flag: str, path: Path) -> int:
    found = optional_int(args, flag)
    if found is None:
        raise InputError(f"--from {path}: {flag} is missing", hint=f"add {flag} to the launch")
    return found


def world_size(args: dict, variables: dict[str, str]) -> int | None:
    """GPUs per node × nodes, from torchrun's arguments or the script's variables, when it says."""
    found: dict[str, int] = {}
    for flag, key in WORLD.items():
        text = value(args, flag) or ""
        text = variables.get(text.lstrip("$").strip("{}"), text) if text.startswith("$") else text
        if text.isdigit():
            found[key] = int(text)
    for name, key in VARIABLES.items():
        if key not in found and variables.get(name, "").isdigit():
            found[key] = int(variables[name])
    if "per_node" in found:
        return found["per_node"] * found.get("nodes", 1)
    return None


def block_layout(model: ModelSpec, sizes: list[int], vpp: int, recompute_layers: int) -> list[StageLayout]:
    """Megatron's block recompute: the first N layers of every chunk fully recomputed."""
    def flags(size: int) -> list[str]:
        per_chunk = max(1, size // vpp)
        return ["full" if (j % per_chunk) < recompute_layers else "none" for j in range(size)]

    return layouts_of_flags(model, [flags(size) for size in sizes])


def layouts_of_flags(model: ModelSpec, flags: list[list[str]]) -> list[StageLayout]:
    """Stage layouts from each stage's recompute option layer by layer, over the model's layer kinds in order."""
    kinds = [k.name for k in model.layer_kinds() for _ in range(k.count)]
    stages, start = [], 0
    for i, stage in enumerate(flags):
        counts: dict[tuple[str, str], int] = {}
        for kind, option in zip(kinds[start:start + len(stage)], stage):
            counts[(kind, option)] = counts.get((kind, option), 0) + 1
        start += len(stage)
        stages.append(StageLayout(layers=[LayerCount(kind=k, recompute=r, count=n) for (k, r), n in counts.items()],
                                  embedding=i == 0, head=i == len(flags) - 1))
    return stages


def launch_config(launch: Launch, model: ModelSpec, devices: int):
    """The launch's ParallelConfig on `devices` (dp = devices / (tp·pp·cp), as Megatron derives it)."""
    from gplan.spec.parallel import config_from_options

    given = dict(launch.given)
    shard, replicate = given.pop("dp_shard", None), given.pop("dp_replicate", None)
    if not model.is_moe:
        given["ep"] = given["etp"] = 1
    per_replica = given["tp"] * given["pp"] * given["cp"]
    if devices % per_replica:
        raise InputError(f"{devices} devices do not divide into tp·pp·cp = {per_replica} (from {launch.source})",
                         hint="pass the launch's --devices")
    dp = devices // per_replica
    if shard not in (None, -1) and (replicate or 1) * shard != dp:
        raise InputError(f"{launch.source}: data parallel replicate × shard = {(replicate or 1) * shard}, but "
                         f"{devices} devices over tp·pp·cp = {per_replica} leave dp = {dp}",
                         hint="pass the launch's --devices")
    if launch.local_batch and given["pp"] > 1:  # the schedule runs once per local batch (torch's pipelining)
        given["schedule_runs"] = max(1, (launch.gbs or launch.local_batch * dp) // (launch.local_batch * dp))
    return config_from_options(dp=dp, **given)


def launch_batch(launch: Launch, config) -> int:
    """The launch's global batch; torchtitan's default is its local batch on every data-parallel rank."""
    return launch.gbs or (launch.local_batch or 1) * config.dp


def launch_layouts(launch: Launch, model: ModelSpec, config, cluster=None) -> list[StageLayout]:
    """The stage split and recompute the engine runs for the launch; on a cluster of several node groups,
    each stage on the group its ranks fall in, the devices taken in the cluster's order (a launch names no
    node group: its launcher hands ranks out over the nodes in order)."""
    from gplan.spec.parallel import layout_from_sizes

    sizes = launch.stage_sizes or even_stage_sizes(model.total_layers, config.pp, config.vpp)
    if launch.per_stage_recompute is not None:
        layouts = per_stage_layout(model, sizes, *launch.per_stage_recompute)
    elif launch.recompute_layers is not None:
        layouts = block_layout(model, sizes, config.vpp, launch.recompute_layers)
    else:
        layouts = layout_from_sizes(model, sizes, [config.recompute] * config.pp)
    if cluster is not None and len(cluster.node_groups) > 1:
        per_stage, bounds, total = config.dp * config.tp * config.cp, [], 0
        for group in cluster.node_groups:
            total += group.devices
            bounds.append(total)
        layouts = [s.model_copy(update={"node_group": next(g for g, end in enumerate(bounds) if i * per_stage < end)})
                   for i, s in enumerate(layouts)]
    return layouts


def differences(mine, best, mine_layouts=None, best_layouts=None) -> dict[str, tuple[str, str]]:
    """Option by option, what the best plan changes in the launch's configuration; the recompute as each
    split runs it layer by layer where the layouts are given (a plan's per-stage recompute is not its
    configuration's `recompute`)."""
    from gplan.spec.parallel import recompute_mix

    found, recomputes = {}, ()
    for key in ("dp", "tp", "pp", "vpp", "cp", "ep", "etp", "sp", "mbs", "zero", "recompute", "recompute_modules"):
        a, b = getattr(mine, key), getattr(best, key)
        if key == "recompute" and mine_layouts is not None and best_layouts is not None:
            a, b = recompute_mix(mine_layouts, mine.recompute_modules), recompute_mix(best_layouts, best.recompute_modules)
        if key == "recompute":
            recomputes = (str(a), str(b))
        if key == "recompute_modules" and not all("selective" in r for r in recomputes):
            continue  # what selective layers recompute changes nothing where one side has none
        if a != b:
            found[key] = (",".join(a) or "none", ",".join(b) or "none") if key == "recompute_modules" else (str(a), str(b))
    return found


def beside(script: Path, named: str) -> Path:
    """A file a script names: at its path from the script's folder, else under its own name beside the
    script (a launch copied out of the engine's repository with the config it names)."""
    for candidate in (script.parent / named, script.parent / Path(named).name):
        if candidate.is_file():
            return candidate
    raise InputError(f"--from {script}: it runs {named}, which is neither there nor beside it",
                     hint=f"put {Path(named).name} beside {script.name}")


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, item in tree.items():
        if isinstance(item, dict):
            flat |= flatten(item, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = item
    return flat


def as_int(item) -> int | None:
    if item is None:
        return None
    try:
        return int(item)
    except (TypeError, ValueError):
        raise InputError(f"{item!r}: expected an integer", hint="write the number in the launch") from None


def module_constant(module: Path, name: str):
    import ast as syntax

    for node in syntax.parse(module.read_text()).body:
        if isinstance(node, syntax.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return syntax.literal_eval(node.value)
    return None


def exported_model(path: Path) -> ModelSpec | None:
    """The bundled model a gplan export names in its header (`# gplan export of plan … (layout …; NAME: …`)."""
    from gplan.profiles.catalogue import bundled_models, load_model

    named = re.search(r"# gplan export of plan \S+ \(layout \S+; ([\w.-]+):", path.read_text(errors="replace"))
    return load_model(named.group(1)) if named and named.group(1) in bundled_models() else None


def per_stage_layout(model: ModelSpec, sizes: list[int], full, selective) -> list[StageLayout]:
    """Each stage's first `full[i]` layers fully recomputed, the next `selective[i]` selectively (MindFormers'
    rule); True: every layer."""
    def flags(i: int, size: int) -> list[str]:
        n_full = size if full is True else (full[i] if full else 0)
        n_sel = size - n_full if selective is True else (min(selective[i], size - n_full) if selective else 0)
        return ["full"] * n_full + ["selective"] * n_sel + ["none"] * (size - n_full - n_sel)

    return layouts_of_flags(model, [flags(i, size) for i, size in enumerate(sizes)])


def with_speed(launch: Launch, speed, strict: bool) -> Launch:
    """`launch` with a log's steady speed (`speed()`: measured_step_s or measured_device_tokens_per_s); a log
    that logged no steady step is read without one, unless `strict` (calibrate), which refuses it."""
    try:
        return dataclasses.replace(launch, **speed())
    except InputError:
        if strict:
            raise
        return launch
