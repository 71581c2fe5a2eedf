"""NeMo AutoModel's recipe YAML read (`automodel recipe.yaml`): its `distributed` section (strategy, sizes,
pipeline, activation checkpointing, mixed precision) as `parse_distributed_section` reads it, the batch of
its `step_scheduler`, the sequence of its packing or dataset, and its model — the Hugging Face repository or
local config it names."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from gplan.engines.nemo_automodel import HF_MODELS
from gplan.engines.nemo_automodel.flags import READ, key_class
from gplan.errors import InputError
from gplan.planner.launch import Launch, as_int, classified, exported_model, flatten
from gplan.spec.model import ModelSpec

SCHEDULES = {"1f1b": "1f1b", "gpipe": "gpipe", "interleaved1f1b": "interleaved_1f1b",
             "interleaved_1f1b": "interleaved_1f1b"}
"""PipelineConfig.pp_schedule (torch.distributed.pipelining's names, any case) -> gplan's schedule."""
PRECISIONS = {"bfloat16": "bf16", "bf16": "bf16", "torch.bfloat16": "bf16", "float32": "fp32", "fp32": "fp32",
              "torch.float32": "fp32"}


def read_automodel_launch(path: Path, model: ModelSpec | None) -> Launch:
    import yaml

    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise InputError(f"--from {path}: not a whole YAML file ({str(exc).splitlines()[0]})",
                         hint="pass the recipe YAML as automodel reads it") from None
    values = flatten({k: v for k, v in data.items() if isinstance(v, dict)})
    model = recipe_model(path, data) if model is None else model
    given, notes = layout(path, values, model)
    if not values.get("fp8.enabled"):
        values = {k: v for k, v in values.items() if not k.startswith("fp8.")}
    unread, no_effect = classified(path, {k: v for k, v in values.items() if k not in READ}, key_class)
    gbs = as_int(values.get("step_scheduler.global_batch_size"))
    if not gbs:
        raise InputError(f"--from {path}: no step_scheduler.global_batch_size", hint="add the recipe's global batch")
    seq = as_int(values.get("packed_sequence.packed_sequence_size") or values.get("dataset.seq_len")
                 or values.get("dataset.seq_length"))
    dp = as_int(values.get("distributed.dp_size"))
    world = dp * given["tp"] * given["cp"] * given["pp"] if dp and dp > 0 else None
    return Launch(source=str(path), engine="nemo-automodel", given=given, gbs=gbs, seq_length=seq or None,
                  precision=precision(path, values), recompute_layers=None, world_size=world,
                  stage_sizes=rank_layers(model.total_layers, given["pp"], given["vpp"]) if given["pp"] > 1 else None,
                  unread=unread + notes, no_effect=no_effect, model=model,
                  engine_options={"moe_dispatcher": dispatcher(path, values)} if model.is_moe else {})


def layout(path: Path, values: dict[str, Any], model: ModelSpec) -> tuple[dict[str, Any], list[str]]:
    """The ParallelConfig options of the `distributed` section (parse_distributed_section's defaults)."""
    size = lambda key, default=1: as_int(values.get(f"distributed.{key}") or default)  # noqa: E731 - None: default
    tp, pp, cp, ep = size("tp_size"), size("pp_size"), size("cp_size"), size("ep_size")
    strategy = str(values.get("distributed.strategy", "fsdp2")).lower()
    if strategy == "fsdp2":
        zero = 2 if str(values.get("distributed.reshard_after_forward")).lower() == "false" else 3
    elif strategy == "megatron_fsdp":
        zero = as_int(values.get("distributed.zero_dp_strategy", 3))
    elif strategy == "ddp":
        raise InputError(f"--from {path}: distributed.strategy ddp (plain data parallel, no tp, pp, cp or ep) is "
                         "not priced as NeMo AutoModel", hint="price its layout as gplan's torch worker: gplan "
                         "estimate MODEL --target torch --zero 0")
    else:
        raise InputError(f"--from {path}: distributed.strategy {strategy!r}: NeMo AutoModel's are fsdp2, "
                         "megatron_fsdp and ddp", hint="fix the recipe's distributed.strategy")
    checkpointing = str(values.get("distributed.activation_checkpointing", False)).lower()
    if checkpointing == "selective":
        raise InputError(f"--from {path}: distributed.activation_checkpointing selective (torch's per-operator "
                         "selective checkpointing) is not priced by gplan for NeMo AutoModel",
                         hint="price it with activation_checkpointing true or false")
    recompute = "full" if checkpointing in ("true", "full", "on", "yes", "enabled") else "none"
    schedule = str(values.get("distributed.pipeline.pp_schedule", "1f1b")).lower()
    if pp > 1 and schedule not in SCHEDULES:
        raise InputError(f"--from {path}: distributed.pipeline.pp_schedule {schedule!r} is not priced by gplan",
                         hint="use 1f1b, interleaved1f1b or gpipe")
    vpp = chunks_per_rank(path, values, model, pp, schedule)
    local = as_int(values.get("step_scheduler.local_batch_size", 1))
    micro = as_int(values.get("distributed.pipeline.pp_microbatch_size", 1))
    replicate = as_int(values.get("distributed.dp_replicate_size") or 1)
    given = {"tp": tp, "pp": pp, "cp": cp, "ep": ep, "etp": 1, "vpp": vpp, "zero": zero, "recompute": recompute,
             "sp": bool(values.get("distributed.sequence_parallel", False)) and tp > 1,
             "mbs": micro if pp > 1 else local}
    if pp > 1:
        given["schedule"] = SCHEDULES[schedule]
    notes = [f"(dp_replicate_size {replicate}: HSDP, FSDP within {replicate} replicas, priced as FSDP over every "
             "data-parallel rank)"] if replicate > 1 else []
    return given, notes


def chunks_per_rank(path: Path, values: dict[str, Any], model: ModelSpec, pp: int, schedule: str) -> int:
    """Virtual stages per pipeline rank as AutoModel's pipelining cuts them: ceil(layers / layers_per_stage)
    stages, rounded to a multiple of pp as `round_virtual_stages_to_pp_multiple` says (down or up); without a
    `layers_per_stage`, one stage per rank, two for a looped schedule."""
    if pp == 1:
        return 1
    per_stage = as_int(values.get("distributed.pipeline.layers_per_stage"))
    if not per_stage:
        return 2 if SCHEDULES.get(schedule) == "interleaved_1f1b" else 1
    stages = -(-model.total_layers // per_stage)
    rounding = values.get("distributed.pipeline.round_virtual_stages_to_pp_multiple")
    if stages % pp and rounding not in ("down", "up"):
        raise InputError(f"--from {path}: {stages} virtual stages of {per_stage} layers do not divide over pp {pp}",
                         hint="set distributed.pipeline.round_virtual_stages_to_pp_multiple (down or up), as "
                              "AutoModel needs too")
    return max(1, (stages // pp) if rounding == "down" else -(-stages // pp))


DISPATCHERS = {"torch": "allgather", "deepep": "flex", "hybridep": "flex", "uccl_ep": "flex"}
"""AutoModel's `model.backend.dispatcher` (components/models/common/utils.py BackendConfig) -> TrainingSpec.moe_dispatcher:
its torch dispatcher all-gathers the tokens over ep and reduce-scatters them back (DTensor), DeepEP, HybridEP and
UCCL-EP send each token once per destination as Megatron's flex dispatcher does. Unstated: the all-to-all, gplan's
default (AutoModel takes DeepEP where it is installed, its torch dispatcher elsewhere)."""


def dispatcher(path: Path, values: dict[str, Any]) -> str:
    named = values.get("model.backend.dispatcher")
    if named is None:
        return "alltoall"
    if str(named) not in DISPATCHERS:
        raise InputError(f"--from {path}: model.backend.dispatcher {named!r} (its fused exchange) is not priced by "
                         "gplan", hint="use torch, deepep, hybridep or uccl_ep")
    return DISPATCHERS[str(named)]


def rank_layers(layers: int, pp: int, vpp: int) -> list[int]:
    """The layers each pipeline rank holds as AutoModel cuts them: pp·vpp virtual stages, the first `layers mod`
    of them one layer longer (pipelining/functional.py generate_hf_model_fqn_per_model_part), stage j on rank j mod pp."""
    stages = pp * vpp
    sizes = [layers // stages + (1 if j < layers % stages else 0) for j in range(stages)]
    return [sum(sizes[r::pp]) for r in range(pp)]


def precision(path: Path, values: dict[str, Any]) -> str:
    if values.get("fp8.enabled"):
        raise InputError(f"--from {path}: fp8.enabled: NeMo AutoModel's FP8 is not priced by gplan",
                         hint="price the recipe in bf16 (fp8.enabled: false)")
    named = str(values.get("distributed.mp_policy.param_dtype", "bfloat16"))
    if named not in PRECISIONS:
        raise InputError(f"--from {path}: mp_policy.param_dtype {named!r} is not priced by gplan",
                         hint="use bfloat16 or float32")
    return PRECISIONS[named]


def recipe_model(path: Path, data: dict) -> ModelSpec:
    """The model the recipe trains: gplan's own export names it; a local folder's config.json; else the bundled
    model of the Hugging Face repository it names (HF_MODELS)."""
    from gplan.profiles.catalogue import load_model

    exported = exported_model(path)
    if exported is not None:
        return exported
    section = data.get("model") or {}  # from_pretrained names it; from_config names it in its config
    named = str(section.get("pretrained_model_name_or_path") or (section.get("config") or {}).get(
        "pretrained_model_name_or_path") or "")
    for folder in (path.parent / named, Path(named)):
        if named and (folder / "config.json").is_file():
            return load_model(str(folder / "config.json"))
    found = {k.lower(): v for k, v in HF_MODELS.items()}.get(named.lower())
    if found is None:
        raise InputError(f"--from {path}: no MODEL given, and its model {named or '(none named)'} is not one gplan "
                         "bundles", hint="name the model: gplan estimate MODEL --from FILE (a bundled name, "
                         "model.yaml or the repository's config.json)")
    return load_model(found)


# ---- the reader's part (planner.launch_files) ---------------------------------------------------------

READS = "NeMo AutoModel recipes"

FROM_READS = (
    "a recipe YAML (`distributed`: strategy fsdp2 or megatron_fsdp, sizes, pipeline, activation "
    "checkpointing, mixed precision; `step_scheduler`'s batch; `packed_sequence` or the dataset's `seq_len`; "
    "the model its `pretrained_model_name_or_path` names)")
"""What `--from` reads (docs/bring-your-own-runs.md's table, from bench/engine_tables.py)."""
CALIBRATE_READS = (
    "—")
"""What `gplan calibrate` reads (— : nothing)."""
"""What this reader takes, as gplan says when a file is no launch it reads."""
PRECEDENCE = 3


def claims(path: Path, text: str) -> bool:
    """A YAML recipe with a top-level `distributed:` section beside `step_scheduler:` or AutoModel's targets."""
    return path.suffix in (".yaml", ".yml") and bool(re.search(r"^distributed\s*:", text, re.MULTILINE)) and (
        bool(re.search(r"^step_scheduler\s*:", text, re.MULTILINE)) or "nemo_automodel" in text)


def read(path: Path, model: ModelSpec | None, text: str) -> Launch:
    return read_automodel_launch(path, model)
