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
    values, notes = current_keys(flatten({k: v for k, v in data.items() if isinstance(v, dict)}))
    model = recipe_model(path, data) if model is None else model
    given, layout_notes = layout(path, values, model)
    notes += layout_notes
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
    options = {"moe_dispatcher": dispatcher(path, values)} if model.is_moe else {}
    trained_in = precision(path, values)
    if storage_dtype(path, values, trained_in) == "bf16":
        options["pure_bf16"] = True
    if str(values.get("distributed.mp_policy.reduce_dtype", "float32")).removeprefix("torch.") in ("bfloat16", "bf16"):
        options["grad_reduce_in_bf16"] = True
    if str(values.get("loss_fn.fp32_upcast", True)).lower() == "false":
        options["bf16_loss"] = True
    if str(values.get("distributed.defer_fsdp_grad_sync", True)).lower() == "false":
        options["grad_sync_each_microbatch"] = True
    if async_tp(path, values, given):
        options["async_tp"] = True
    kernel = attention(path, values)
    if kernel is not None:
        options["attention_kernel"] = kernel
    notes += optimizer_notes(values, options.get("pure_bf16", False))
    return Launch(source=str(path), engine="nemo-automodel", given=given, gbs=gbs, seq_length=seq or None,
                  precision=trained_in, recompute_layers=None, world_size=world,
                  stage_sizes=rank_layers(model.total_layers, given["pp"], given["vpp"]) if given["pp"] > 1 else None,
                  unread=unread + notes, no_effect=no_effect, model=model, engine_options=options,
                  local_batch=as_int(values.get("step_scheduler.local_batch_size")) if given["pp"] > 1 else None)


def async_tp(path: Path, values: dict, given: dict) -> bool:
    """`distributed.enable_async_tensor_parallel` (read as TrainingSpec.async_tp where tp > 1: AutoModel compiles each
    block for it, model_parallelizer.py compile_parallelized_model); without sequence parallelism AutoModel raises
    (parallelizer.py: "enable_async_tensor_parallel=True requires sequence_parallel=True"), and so does gplan."""
    if str(values.get("distributed.enable_async_tensor_parallel", False)).lower() != "true" or given["tp"] == 1:
        return False
    if not given["sp"]:
        raise InputError(f"--from {path}: distributed.enable_async_tensor_parallel without sequence_parallel — NeMo "
                         "AutoModel refuses it (\"enable_async_tensor_parallel=True requires sequence_parallel=True\")",
                         hint="set distributed.sequence_parallel: true, or leave async tensor parallel off")
    return True


def optimizer_notes(values: dict[str, Any], bf16_model: bool) -> list[str]:
    """What the pricing leaves out of the recipe's optimizer, said beside the prediction: Transformer Engine's FusedAdam
    (`optimizer._target_`) keeps its moments in `exp_avg_dtype` (fp32 by default) and, with `master_weights`, a master
    copy, where gplan prices AutoModel's torch Adam, whose states follow a bfloat16 model's dtype — not priced yet."""
    target = str(values.get("optimizer._target_", ""))
    if "FusedAdam" not in target or not bf16_model:
        return []
    moments = str(values.get("optimizer.exp_avg_dtype", "float32")).removeprefix("torch.")
    master = " and fp32 master weights" if str(values.get("optimizer.master_weights", False)).lower() == "true" else ""
    return [f"(optimizer {target.rsplit('.', 1)[-1]}: Transformer Engine's keeps its moments in {moments}{master}; "
            "priced as torch Adam's bf16 states, so its memory is under-counted by the difference over the sharding "
            "ranks — not priced yet)"]


def layout(path: Path, values: dict[str, Any], model: ModelSpec) -> tuple[dict[str, Any], list[str]]:
    """The ParallelConfig options of the `distributed` section (parse_distributed_section's defaults)."""
    size = lambda key, default=1: as_int(values.get(f"distributed.{key}") or default)  # noqa: E731 - None: default
    tp, pp, cp, ep = size("tp_size"), size("pp_size"), size("cp_size"), size("ep_size")
    strategy = str(values.get("distributed.strategy", "fsdp2")).lower()
    if strategy == "fsdp2":
        zero = 3 if reshards_after_forward(values, pp, ep) else 2
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


LEGACY_KEYS = {"autopipeline.": "distributed.pipeline.",
               "parallelizer.activation_checkpointing": "distributed.activation_checkpointing",
               "parallelizer.reshard_after_forward": "distributed.moe.reshard_after_forward",
               "parallelizer.wrap_outer_model": "distributed.moe.wrap_outer_model",
               "parallelizer.ignore_router_for_ac": "distributed.moe.ignore_router_for_ac",
               "parallelizer.lm_head_precision": "distributed.moe.lm_head_precision"}
"""Keys of the recipes AutoModel's own benchmark configs and its performance summary ran
(examples/benchmark/configs, 2025: `distributed._target_: ...FSDP2Manager`, the pipeline in an
`autopipeline:` section, the MoE parallelizer's arguments in a `parallelizer:` section) -> the names
`parse_distributed_section` reads in 0.7 (which ignores the old sections)."""
LEGACY_MANAGERS = {"FSDP2Manager": "fsdp2", "MegatronFSDPManager": "megatron_fsdp", "NVFSDPManager": "megatron_fsdp",
                   "DDPManager": "ddp"}
"""`distributed._target_` of those recipes -> 0.7's `distributed.strategy` (nvFSDP is Megatron-FSDP's old name)."""
LEGACY_DISPATCH = {"true": "deepep", "false": "torch"}
"""`model.backend.enable_deepep` of those recipes -> 0.7's `model.backend.dispatcher` (0.7's BackendConfig: "enable_deepep=True
was equivalent to experts=gmm + dispatcher=deepep, and enable_deepep=False to dispatcher=torch"; it now ignores it)."""


def current_keys(values: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A recipe in AutoModel's earlier layout read as the release that wrote it ran it, its keys renamed to 0.7's
    (said in a note: 0.7 itself would ignore them); a recipe in 0.7's layout unchanged."""
    renamed, old = {}, []
    for key, value in values.items():
        new = next((v + key[len(k):] for k, v in LEGACY_KEYS.items() if key == k or (k.endswith(".") and
                                                                                 key.startswith(k))), None)
        if key.startswith(("autopipeline.", "parallelizer.")):
            old.append(key.split(".")[0])
            if new is None or new.endswith("._target_") or new in values or (
                    key.startswith("autopipeline.") and any(k.startswith("distributed.pipeline.") for k in values)):
                continue  # the section's own class (its keys say the rest), or what 0.7's layout sets itself
        renamed[new or key] = value
    manager = str(values.get("distributed._target_", "")).rsplit(".", 1)[-1]
    if manager in LEGACY_MANAGERS and "distributed.strategy" not in values:
        renamed["distributed.strategy"] = LEGACY_MANAGERS[manager]
        old.append(f"distributed._target_ {manager}")
    deepep = values.get("model.backend.enable_deepep")
    if deepep is not None:
        renamed.pop("model.backend.enable_deepep")
        if str(deepep).lower() not in LEGACY_DISPATCH:
            raise InputError(f"model.backend.enable_deepep {deepep!r}: true or false",
                             hint="set it to true or false, or name model.backend.dispatcher")
        renamed.setdefault("model.backend.dispatcher", LEGACY_DISPATCH[str(deepep).lower()])
        old.append("model.backend.enable_deepep")
    if not old:
        return values, []
    return renamed, [f"(read as the earlier AutoModel release it was written for ran it — "
                     f"{', '.join(sorted(set(old)))}; NeMo AutoModel 0.7 ignores these: move them to "
                     "distributed.pipeline, distributed.activation_checkpointing, distributed.moe, "
                     "distributed.strategy and model.backend.dispatcher)"]


def reshards_after_forward(values: dict[str, Any], pp: int, ep: int) -> bool:
    """Whether FSDP2 reshards each layer after its forward (zero 3; else the weights stay gathered to the backward,
    zero 2), as 0.7 decides (components/distributed/model_parallelizer.py, parallelizer.py): `distributed.
    reshard_after_forward` where set; else with ep > 1 its MoE parallelizer's `distributed.moe.reshard_after_forward`
    (default false); else false with pipeline stages and true without (every layer but the last)."""
    named = values.get("distributed.reshard_after_forward")
    if named is None and ep > 1:
        named = values.get("distributed.moe.reshard_after_forward", False)
    if named is None:
        return pp == 1
    return str(named).lower() == "true"


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


ATTENTION = {"te": None, "sdpa": "fa2", "flex": "fa2"}
"""`model.backend.attn` (BackendConfig) -> TrainingSpec.attention_kernel: te, its default on CUDA, is Transformer
Engine's fused (cuDNN) attention, the engine's own (EngineProfile.attention_kernel); sdpa (torch SDPA's flash
backend) and flex (FlexAttention, a Triton kernel) are FlashAttention-2's class."""


def attention(path: Path, values: dict[str, Any]) -> str | None:
    named = str(values.get("model.backend.attn", "te"))
    if named not in ATTENTION:
        raise InputError(f"--from {path}: model.backend.attn {named!r} is not priced by gplan",
                         hint="use te, sdpa or flex")
    return ATTENTION[named]


STORAGE_DTYPES = {"auto": "bf16", **PRECISIONS}
"""`model.torch_dtype` (or `model.dtype`), the dtype AutoModel builds the parameters in: "auto", its default, is
bfloat16 (_transformers/auto_model.py; its own models take the config's torch_dtype, bfloat16 for every model gplan
maps, HF_MODELS). Adam's states follow the parameters, so a bfloat16 model trains with no fp32 copy anywhere
(TrainingSpec.pure_bf16; AutoModel's FSDP2Config: "pair with model.torch_dtype: float32 for fp32 optimizer state")."""


def storage_dtype(path: Path, values: dict[str, Any], trained_in: str) -> str:
    named = str(values.get("model.dtype") or values.get("model.torch_dtype") or "auto")
    if named not in STORAGE_DTYPES:
        raise InputError(f"--from {path}: model.torch_dtype {named!r} is not priced by gplan",
                         hint="use bfloat16 (AutoModel's default) or float32")
    stored = STORAGE_DTYPES[named]
    if trained_in == "fp32" and stored == "bf16":
        raise InputError(f"--from {path}: mp_policy.param_dtype float32 over a bfloat16 model (model.torch_dtype "
                         f"{named}) is not priced by gplan", hint="set model.torch_dtype: float32 beside it")
    return stored


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
    "checkpointing, resharding, mixed precision; `step_scheduler`'s batch; `packed_sequence` or the dataset's "
    "`seq_len`; the model its `pretrained_model_name_or_path` names and its `torch_dtype`; the MoE dispatcher; "
    "the earlier `autopipeline:` / `parallelizer:` / `enable_deepep` layout of its 2025 benchmark recipes)")
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
