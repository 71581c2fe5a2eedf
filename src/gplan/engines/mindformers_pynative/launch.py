"""MindFormers' PyNative trainer YAML (mindformers/pynative/config/config.py, its DeepSeek-V3 and DeepSeek-V4
recipes): torchtitan's layout ported to MindSpore — its `ParallelDims` (mindformers/pynative/distributed/
parallel_dims.py) shards weights, gradients and optimizer states over `data_parallel_shard` ranks (FSDP: zero 3,
zero 2 where `reshard_after_forward_policy` keeps them gathered), carves expert parallelism out of those ranks
× cp × tp, and runs tp with sequence parallelism, cp and pipeline stages. Sections: `training` (the batch),
`parallelism` (the degrees), `recompute` (full recompute by layer ranges), `model` (Hugging Face's names)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gplan.engines.mindformers.launch import (ASCEND_CLUSTER, check_model, class_defaults_said, dataset_seq_length,
                                             mindformers_model, swapped_optimizer)
from gplan.engines.mindformers_pynative.flags import DISPATCHERS, READ, SCHEDULES, key_class
from gplan.errors import InputError
from gplan.io import load_yaml
from gplan.planner.launch import Launch, classified, flatten
from gplan.spec.model import ModelSpec


def is_pynative(data: Any) -> bool:
    """Its sections: `parallelism` and a `model` naming a `model_type` at the top level (the graph-mode YAMLs
    have `parallel_config` and `model.model_config`)."""
    return (isinstance(data, dict) and isinstance(data.get("parallelism"), dict)
            and isinstance(data.get("model"), dict) and "model_type" in data["model"])


def read_pynative_launch(path: Path, data: dict, model: ModelSpec | None) -> Launch:
    """Its degrees (dp_shard -1: all the data-parallel ranks; ep inside them), its batch (`local_batch_size` a
    micro-batch, `global_batch_size` the step: its trainer accumulates the rest), its FSDP level (zero 3, or zero 2
    where the weights stay gathered: `reshard_after_forward_policy`), its split and full recompute by layer ranges,
    the model in `model` (Hugging Face's names, its config class's defaults for what it leaves out). The world
    size is the launcher's (msrun's worker_num), not the YAML's: `--devices` says it."""
    par, training = data.get("parallelism") or {}, data.get("training") or {}
    recompute = data.get("recompute") or {}
    mc = data["model"]
    defaults = class_defaults_said(mc, "model") if model is None else None
    model = mindformers_model(mc, data, path, section="model") if model is None else model
    check_model(path, mc, model, "model")
    tp, cp, pp = (int(par.get(k, 1)) for k in ("tensor_parallel", "context_parallel", "pipeline_parallel"))
    vpp = int(par.get("pipeline_parallel_interleave_num", 1))
    shard = int(par.get("data_parallel_shard", -1))
    keys = {k: v for k, v in flatten({"parallelism": par, "recompute": recompute, "swap": data.get("swap") or {},
                                      "recompute_comm": data.get("recompute_comm") or {}}).items() if k not in READ}
    unread, no_effect = classified(path, keys, key_class)
    dispatcher = str(par.get("moe_token_dispatcher_type", "alltoall"))
    schedule = str(par.get("pipeline_parallel_schedule", "interleaved_1f1b" if vpp > 1 else "1f1b"))
    for what, value, known in (("moe_token_dispatcher_type", dispatcher, DISPATCHERS), ("pipeline_parallel_schedule",
                                                                                        schedule, SCHEDULES)):
        if value not in known:
            raise InputError(f"--from {path}: gplan cannot price parallelism.{what} {value}",
                             hint=f"use {' or '.join(known)}, or price the layout without it (gplan estimate MODEL ...)")
    policy = str(par.get("reshard_after_forward_policy", "default"))
    # its fsdp.get_fsdp_reshard_after_forward_policy: "default" keeps the weights gathered with pipeline stages
    reshards = policy == "always" or (policy == "default" and pp == 1)
    ranks = rank_layers(par.get("pipeline_parallel_layers_per_stage"), model.num_layers, pp, vpp, path)
    explicit = par.get("pipeline_parallel_layers_per_stage") not in (None, "auto") and pp > 1
    given = {"tp": tp, "pp": pp, "cp": cp, "vpp": vpp, "sp": bool(par.get("sequence_parallel")) and tp > 1,
             # dp_shard 1: each rank's own whole copy, replicas over dp (its HSDP with one rank a shard)
             "mbs": int(training.get("local_batch_size", 1)), "zero": 0 if shard == 1 else 3 if reshards else 2,
             "recompute": "none",
             "ep": int(par.get("expert_parallel", 1)), "etp": 1,
             **({"schedule": SCHEDULES[schedule]} if pp > 1 else {})}
    no_effect.update(swapped_optimizer(data))
    if str((data.get("optimizer") or {}).get("type", "AdamW")) != "AdamW":
        no_effect["optimizer.type"] = (f"{data['optimizer']['type']}: priced as AdamW's two fp32 moments a parameter "
                                       "(its states and step not priced apart)")
    if shard > 1:
        no_effect["parallelism.data_parallel_shard"] = (f"HSDP: sharded over {shard} ranks, replicated across the rest "
                                                         "of dp — priced sharded over all of dp (its weights, gradients "
                                                         "and optimizer states under-priced dp/" f"{shard}×)")
    return Launch(source=str(path), engine="mindformers-pynative", unread=unread, no_effect=no_effect, given=given,
                  gbs=int(training.get("global_batch_size", 1)), seq_length=mc.get("seq_length") or dataset_seq_length(data, "dataloader"),
                  precision={"bfloat16": "bf16", "float16": "fp16"}.get(str(mc.get("compute_dtype", "bfloat16")), "fp32"),
                  stage_sizes=[len(r) for r in ranks] if explicit else None, recompute_layers=None, world_size=None, model=model,
                  model_from_launch=defaults,
                  per_stage_recompute=per_stage_counts(recomputed_layers(recompute, model, path), ranks),
                  default_cluster=ascend_cluster((data.get("context") or {}).get("device_target")))


def ascend_cluster(device_target: str | None) -> tuple[str, str] | None:
    """Its ContextConfig's device_target defaults to Ascend: a YAML that names none runs there too."""
    if device_target is None:
        return ASCEND_CLUSTER[0], "its device_target left at its ContextConfig's default, Ascend"
    return ASCEND_CLUSTER if str(device_target) == "Ascend" else None


def layer_range(text: Any, path: Path) -> range:
    """`a-b` (inclusive) or one layer `a`, as its pipeline_parallel.py and recompute ranges write them."""
    parts = str(text).strip().split("-")
    try:
        start, end = int(parts[0]), int(parts[-1])
    except ValueError:
        raise InputError(f"--from {path}: layer range {text!r} is not 'start-end'",
                         hint="write layer ranges as MindFormers does: '0-15'") from None
    return range(start, end + 1)


def rank_layers(per_stage: Any, layers: int, pp: int, vpp: int, path: Path) -> list[list[int]]:
    """The decoder layers on each pipeline rank, its chunks in order: from `pipeline_parallel_layers_per_stage`
    (one string a rank of `vpp` comma-separated ranges, its pipeline_parallel.py) or, at "auto", its even split
    (chunk v·pp + r of L/(pp·vpp) layers on rank r)."""
    if per_stage in (None, "auto") or pp == 1:
        if layers % (pp * vpp):  # its _compute_auto's rule
            raise InputError(f"--from {path}: {layers} layers do not split evenly into pp·interleave = {pp * vpp} "
                             "stages, and pipeline_parallel_layers_per_stage is 'auto' (MindFormers refuses it too)",
                             hint="give pipeline_parallel_layers_per_stage, one 'start-end' range a chunk")
        size = layers // (pp * vpp)
        return [[layer for v in range(vpp) for layer in range((v * pp + r) * size, (v * pp + r + 1) * size)]
                for r in range(pp)]
    if not isinstance(per_stage, list) or len(per_stage) != pp:
        raise InputError(f"--from {path}: pipeline_parallel_layers_per_stage needs one entry a pipeline rank ({pp})",
                         hint="write it as MindFormers does: ['0-7', '8-15', …], or 'auto'")
    return [[layer for chunk in str(entry).split(",") for layer in layer_range(chunk, path)] for entry in per_stage]


def recomputed_layers(recompute: dict, model: ModelSpec, path: Path) -> set[int]:
    """The decoder layers its `full` recompute names (`full_recompute_layer` ranges; none named: every layer)."""
    mode = str(recompute.get("mode", "None"))
    if mode == "None":
        return set()
    if mode != "full":
        raise InputError(f"--from {path}: recompute mode {mode} (named modules) is not priced",
                         hint="use mode full or None, or price it with --recompute selective (gplan estimate MODEL ...)")
    ranges = recompute.get("full_recompute_layer")
    if not ranges:
        return set(range(model.num_layers))
    ranges = ranges if isinstance(ranges, (list, tuple)) else [ranges]
    return {layer for text in ranges for layer in layer_range(text, path) if layer < model.num_layers}


def per_stage_counts(recomputed: set[int], ranks: list[list[int]]) -> tuple[list[int], list[int]]:
    """(full, selective) recompute counts per pipeline rank, as the MindFormers reader's per-stage counts are."""
    return [sum(1 for layer in on_rank if layer in recomputed) for on_rank in ranks], [0] * len(ranks)


# ---- the reader's part (planner.launch_files) ---------------------------------------------------------

READS = "MindFormers PyNative trainer YAMLs"

FROM_READS = "a PyNative trainer YAML (`training`, `parallelism`, `recompute` and `model` sections), with --devices"
"""What `--from` reads (docs/bring-your-own-runs.md's table, from bench/engine_tables.py)."""
CALIBRATE_READS = "—"
"""What `gplan calibrate` reads (— : nothing)."""
PRECEDENCE = 0


def claims(path: Path, text: str) -> bool:
    """A YAML with a top-level `parallelism` section and a `model` naming its model_type (`is_pynative`): its DeepSeek
    recipes say "name refers to torchtitan" in their comments, which the torchtitan reader must not take."""
    return (path.suffix in (".yaml", ".yml") and "\nparallelism:" in "\n" + text and "model_type:" in text
            and is_pynative(_yaml(text)))


def _yaml(text: str):
    import yaml

    try:
        return load_yaml(text)
    except yaml.YAMLError:
        return None


def read(path: Path, model: ModelSpec | None, text: str) -> Launch:
    return read_pynative_launch(path, _yaml(text), model)
