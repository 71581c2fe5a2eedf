"""torchtitan's launches and logs read: a job TOML (torchtitan ≤ 0.2's `--job.config_file`), a script of
`--section.key value` overrides (with the TOML it names, and gplan's exported config module beside it), and
the job config its log prints (or the launch beside a log that prints none). Keys gplan does not read are
classified (flags.py); its model is the one named, else `model.name` + `model.flavor`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any

from gplan.engines.torchtitan import ENGINE, logs, registry
from gplan.engines.torchtitan.flags import titan_class
from gplan.errors import InputError
from gplan.launch_text import arguments, file_and_member
from gplan.planner.launch import with_speed, Launch, as_int, beside, classified, exported_model, flatten, module_constant, value, world_size
from gplan.spec.model import ModelSpec
from gplan.spec.parallel import PER_OP_MODULES
from gplan.spec.training import LOW_PRECISION

TITAN_ASYNC_TP = ("compile.enable_async_tensor_parallel", "parallelism.enable_async_tensor_parallel")
"""torch's asynchronous tp: 0.3's CompileConfig key, ≤ 0.2's ParallelismConfig one (read as TrainingSpec.async_tp)."""
#: torchtitan's job-config keys gplan reads (torchtitan/config/job_config.py: Parallelism, Training,
#: ActivationCheckpoint; 0.3's `local_batch_size`, before it `batch_size`).
TITAN_KEYS = {
    "parallelism.data_parallel_replicate_degree", "parallelism.data_parallel_shard_degree",
    "parallelism.tensor_parallel_degree", "parallelism.context_parallel_degree", "parallelism.pipeline_parallel_degree",
    "parallelism.expert_parallel_degree", "parallelism.enable_sequence_parallel", "parallelism.fsdp_reshard_after_forward",
    "parallelism.pipeline_parallel_schedule", "parallelism.pipeline_parallel_microbatch_size",
    "parallelism.pipeline_parallel_layers_per_stage", "training.local_batch_size", "training.batch_size",
    "training.global_batch_size", "training.seq_len", "training.mixed_precision_param", "activation_checkpoint.mode",
    "model.converters", "float8.recipe_name", "quantize.linear.float8.recipe_name", "model.name", "model.flavor",
    "training.disable_cuda_graphs", "activation_checkpoint.selective_ac_option",
    "parallelism.expert_tensor_parallel_degree", "model.hf_assets_path", "parallelism.expert_parallel_comm_backend",
    "training.mixed_precision_reduce", "training.dtype", "optimizer.early_step_in_backward", "training.enable_cpu_offload",
    "loss.num_chunks", "model.non_blocking_capacity_factor", *TITAN_ASYNC_TP,
    *(f"training.{k}" for k in ("max_context_length", "num_tokens_per_train_step", "num_tokens_per_dp_rank",
                                "num_tokens_per_microbatch_per_dp_rank")),
}



def read_torchtitan_launch(path: Path, model: ModelSpec | None) -> Launch:
    """A torchtitan launch: a job TOML (torchtitan ≤ 0.2's `--job.config_file`), or a script of
    `--section.key value` overrides (with the TOML it names, and gplan's exported config module beside it);
    its model the one named, else torchtitan's `model.name` + `model.flavor` (or the config.json of its
    `model.hf_assets_path`)."""
    values, args, variables = titan_values(path)
    registry_chunks = values.pop(REGISTRY_CHUNKS, None)
    registry_file = values.pop(REGISTRY_FILE, None)
    trainer_class = values.pop(registry.TRAINER_CLASS, None)
    computed = sorted(k for k, v in values.items() if k in TITAN_KEYS and isinstance(v, registry.Unknown))
    if computed:
        raise InputError(f"--from {path}: {computed[0]} is computed ({values[computed[0]].text}): gplan reads the "
                         "values a config registry writes out", hint=f"write {computed[0]} as a value, or pass the "
                                                                     "script that runs it with the key overridden")
    values = titan_token_batch(path, values)
    unpriced = [c for c in titan_converters(values) if not any(kind in c.lower() for kind in ("float8", "mx"))]
    if unpriced:  # nvfp4, LoRA…: priced as bf16 they would change the answer unsaid
        raise InputError(f"--from {path}: model.converters {unpriced[0]!r}: gplan prices torchtitan's float8 and MX "
                         "converters only", hint="remove it, or price the launch without it")
    model = titan_model(path, values) if model is None else model
    _check_titan_model(path, values, model)
    _check_titan_experts_precision(path, values, model)
    module = path.parent / "gplan_torchtitan.py"
    parts = module_constant(module, "MODULE_FQNS_PER_MODEL_PART") if module.is_file() else None
    ac = module_constant(module, "ACTIVATION_CHECKPOINT") if module.is_file() else None
    given, notes = _titan_layout(values, model, parts, ac)
    notes += titan_overrides(path, values.pop("override.imports", None))
    if registry_file is not None:
        notes.append(f"(--module/--config read from {registry_file})")
    if trainer_class is not None:
        notes.append(f"(its trainer config is the registry's own {trainer_class}: the checks of its __post_init__ "
                     "are not read)")
    lowp_on = _titan_precision(values) in ("fp8", "fp8-rowwise", "mxfp8")
    unread_keys = {k: v for k, v in values.items() if k not in TITAN_KEYS
                   and not (not lowp_on and re.match(r"(float8|mx|quantize)\.", k))}
    rule = (lambda k, v: ("refused", "a low-precision setting gplan does not read")
            if lowp_on and re.match(r"(float8|mx|quantize)\.", k) and not k.endswith(("filter_fqns", "emulate"))
            else titan_class(k, v))
    unread, no_effect = classified(path, unread_keys, rule)
    unread += sorted(k for k in values if k not in TITAN_KEYS and k not in unread_keys)
    gbs = as_int(values.get("training.global_batch_size"))
    local = as_int(values.get("training.local_batch_size", values.get("training.batch_size")))
    if local is None and (gbs is None or gbs < 0 or given["pp"] == 1):  # it sets the batch, or the micro-batch
        notes.append(f"(training.local_batch_size not set: torchtitan's default, {TITAN_LOCAL_BATCH} a rank)")
    if gbs is None or gbs < 0:
        local = TITAN_LOCAL_BATCH if local is None else local
        gbs = None  # local × dp: fixed once the devices are known
    pp = given["pp"]
    sizes = None  # the chunks the module lists (virtual stage j on rank j % pp), summed per rank
    if parts and pp > 1:
        sizes = [0] * pp
        for j, part in enumerate(parts):
            sizes[j % pp] += sum(1 for name in part if name.startswith("layers."))
    comm = values.get("parallelism.expert_parallel_comm_backend",
                      module_constant(module, "MOE_COMM_BACKEND") if module.is_file() else None)
    # gplan's exported config module (0.3) states the loss's chunks (its trainer's ChunkedLossWrapper: 8 before the
    # module said); a ≤ 0.2 job config has none
    chunks = int(module_constant(module, "LOSS_CHUNKS") or TITAN_LOSS_CHUNKS) if module.is_file() else 1
    if registry_chunks is not None:  # a 0.3 config registry's loss: ChunkedLossWrapper's chunks, or the loss whole
        chunks = registry_chunks
    if module.is_file():  # gplan's config module states HybridEP's capacity, and the graphs its config function sets
        stated = {"model.non_blocking_capacity_factor": module_constant(module, "NON_BLOCKING_CAPACITY_FACTOR"),
                  "training.disable_cuda_graphs": module_constant(module, "DISABLE_CUDA_GRAPHS")}
        values = {**{k: v for k, v in stated.items() if v is not None}, **values}
    # 0.3's trainer (a config registry, gplan's exported module, or a job config that has the key) captures CUDA graphs
    options = titan_engine_options(path, values, model, comm, chunks, registry_chunks is not None or module.is_file()
                                   or "training.disable_cuda_graphs" in values, notes)
    for key in fork_state_dtypes(values, unread):  # said, not listed as having no effect
        unread.remove(key)
        notes.append(f"({key} {values[key]}: not a torchtitan key (a fork's?); Adam's states are priced in fp32, as "
                     "torchtitan keeps them" + (" — on the host here (training.enable_cpu_offload)"
                                                if options.get("fsdp_offload") else ": over-counted if the fork keeps "
                                                "them in 16 bits") + ")")
    # a 0.3 registry's attention (model_registry's attn_backend, "flex" by default): said, not listed as no effect
    backend = values.get("model.attn_backend", "flex" if registry_chunks is not None else None)
    if backend is not None:
        unread = [k for k in unread if k != "model.attn_backend"]
        notes.append(f"(model.attn_backend {backend}: attention masked per document — torchtitan 0.3's language "
                     "models always mask block-causally (models/common/config_utils.py get_attention_config) — priced "
                     "as causal attention over the whole training.seq_len: an upper bound where documents are shorter)")
    if options.get("fsdp_offload"):
        notes.append("(training.enable_cpu_offload: the host's Adam step is priced at the device's share of the host "
                     "memory bandwidth — an assumption no measured run checks; host memory is not checked)")
    seq = as_int(values.get("training.seq_len"))
    if seq is None:
        seq = TITAN_SEQ_LEN
        notes.append(f"(training.seq_len not set: torchtitan's default, {TITAN_SEQ_LEN})")
    return Launch(source=str(path), engine="torchtitan", given=given, gbs=gbs or 0,
                  seq_length=seq, precision=_titan_precision(values), stage_sizes=sizes, recompute_layers=None,
                  world_size=world_size(args, variables) or titan_world_size(given),
                  unread=unread + notes, local_batch=local, no_effect=no_effect, model=model,
                  engine_options=options)


def titan_engine_options(path: Path, values: dict[str, Any], model: ModelSpec, comm: str | None,
                         chunks: int = 1, captures: bool = False, notes: list[str] | None = None) -> dict[str, Any]:
    """The engine switches a job config sets: the token exchange (and HybridEP's capacity), the reduce and training
    dtypes, the optimizer in the backward (≤ 0.2), a compiled loss, the chunks its loss runs in (0.3's
    ChunkedLossWrapper; ≤ 0.2: 1), and an MoE model's CUDA graphs where the trainer `captures` them (0.3, unless
    `training.disable_cuda_graphs`)."""
    options: dict[str, Any] = {"moe_dispatcher": titan_dispatcher(path, comm)} if model.is_moe else {}
    capacity = titan_dispatch_capacity(values, comm, [] if notes is None else notes) if model.is_moe else None
    if capacity is not None:
        options["moe_dispatch_capacity"] = capacity
    if model.is_moe and captures and str(values.get("training.disable_cuda_graphs", False)).lower() != "true":
        options["cuda_graphs"] = "full_iteration"
    if chunks != TITAN_LOSS_CHUNKS:
        options["loss_chunks"] = chunks
    if titan_dtype(path, values, "training.mixed_precision_reduce", TITAN_REDUCE_DTYPES):
        options["grad_reduce_in_bf16"] = True
    if titan_dtype(path, values, "training.dtype", TITAN_TRAINING_DTYPES):
        options["pure_bf16"] = True
    if str(values.get("optimizer.early_step_in_backward", False)).lower() == "true":  # ≤ 0.2
        options["optimizer_in_backward"] = True
    if titan_compiles(values, "loss"):  # components/loss.py build_cross_entropy_loss
        options["compiled_loss"] = True
    if titan_async_tp(path, values):
        options["async_tp"] = True
    if str(values.get("training.enable_cpu_offload", False)).lower() == "true":
        options["fsdp_offload"] = True
    return options


def fork_state_dtypes(values: dict[str, Any], unread: list[str]) -> list[str]:
    """Unread optimizer keys that name a dtype other than fp32 (a fork's `optimizer.state_dtype = "bfloat16"`):
    torchtitan has none (0.3's ConfigManager refuses a key it does not know), so gplan cannot say what they do."""
    return [k for k in unread if k.startswith("optimizer.") and "dtype" in k
            and str(values.get(k)).lower().removeprefix("torch.") not in ("float32", "fp32")]


REGISTRY_CHUNKS = "(registry loss chunks)"
"""The key titan_values hands a config registry's loss chunks under (not a job-config key)."""
TITAN_LOSS_CHUNKS = ENGINE.loss_chunks
"""torchtitan 0.3's ChunkedLossWrapper.Config.num_chunks default, its profile's (engines.torchtitan.ENGINE)."""
TITAN_COMPILE_COMPONENTS = ["model", "loss"]
"""torchtitan's `compile.components` default (CompileConfig): with `compile.enable`, the model and the loss."""


def titan_switched_on(values: dict[str, Any], key: str) -> bool:
    return str(values.get(key, False)).lower() == "true"


def titan_compiles(values: dict[str, Any], component: str) -> bool:
    """Whether torch.compile runs `component` ("model" or "loss"): `compile.enable` with it among
    `compile.components`, or ≤ 0.2's `training.compile`, which compiled both."""
    components = values.get("compile.components", TITAN_COMPILE_COMPONENTS)
    return titan_switched_on(values, "training.compile") or (titan_switched_on(values, "compile.enable")
                                                            and component in components)


def titan_async_tp(path: Path, values: dict[str, Any]) -> bool:
    """Whether the run pipelines tp's collectives with its matmuls (TITAN_ASYNC_TP) — which torch only does in a
    compiled model: without one torchtitan refuses it (0.3's CompileConfig.__post_init__), and so does gplan."""
    if not any(titan_switched_on(values, key) for key in TITAN_ASYNC_TP):
        return False
    if not titan_compiles(values, "model"):
        raise InputError(f"--from {path}: async tensor parallel without the model compiled — torchtitan refuses it "
                         "(\"Async TP requires 'model' in --compile.components and --compile.enable\")",
                         hint="set compile.enable with \"model\" among compile.components, or leave async tp off")
    return True


def titan_world_size(given: dict[str, Any]) -> int | None:
    """The ranks a job config fixes on its own: every degree stated, `data_parallel_shard_degree` too (not -1,
    which takes what the others leave) — torchtitan's ParallelDims asserts their product is the world size.
    Experts borrow their ranks from dp_shard·cp and add none."""
    if given["dp_shard"] in (None, -1):
        return None
    return given["dp_replicate"] * given["dp_shard"] * given["cp"] * given["tp"] * given["pp"]



TITAN_COMM_BACKENDS = {"standard": "alltoall", "deepep": "flex", "hybridep": "flex",
                       "minimal_async_ep": "symmetric_memory"}
"""torchtitan's token exchange (≤ 0.2 `parallelism.expert_parallel_comm_backend`, 0.3.0 `moe_comm_backend` of
make_token_dispatcher_config) -> TrainingSpec.moe_dispatcher: its all-to-all; DeepEP's or HybridEP's kernels, priced
as Megatron's flex dispatcher (the same de-duplicated exchange and buffers); MinimalAsyncEP's symmetric memory."""


def titan_dispatcher(path: Path, comm: str | None) -> str:
    if comm is None or comm in TITAN_COMM_BACKENDS:
        return TITAN_COMM_BACKENDS[comm or "standard"]
    raise InputError(f"--from {path}: moe_comm_backend {comm!r}: torchtitan's are {', '.join(TITAN_COMM_BACKENDS)}",
                     hint="fix the launch's expert_parallel_comm_backend")


def titan_dispatch_capacity(values: dict[str, Any], comm: str | None, notes: list[str]) -> float | None:
    """HybridEP's `non_blocking_capacity_factor` (0.3's model_registry keyword; gplan's config module's constant):
    its output sized without a host sync (TrainingSpec.moe_dispatch_capacity). make_token_dispatcher_config hands it
    to HybridEP only: with another backend it is said and dropped."""
    capacity = values.get("model.non_blocking_capacity_factor")
    if capacity in (None, "None"):
        return None
    if comm != "hybridep":
        notes.append(f"(non_blocking_capacity_factor {capacity}: no effect — torchtitan hands it to HybridEP only, "
                     f"the exchange is {comm or 'standard'})")
        return None
    return float(capacity)


TITAN_REDUCE_DTYPES = {"float32": False, "bfloat16": True}
"""torchtitan's `training.mixed_precision_reduce` -> TrainingSpec.grad_reduce_in_bf16: the dtype FSDP2 reduce-scatters
the gradients in (its MixedPrecisionPolicy's reduce_dtype); the sharded gradients stay in their own dtype."""
TITAN_TRAINING_DTYPES = {"float32": False, "bfloat16": True}
"""torchtitan's `training.dtype` -> TrainingSpec.pure_bf16: the dtype the model and its optimizer states are kept in
(float32, its default: mixed precision over fp32 weights; bfloat16: full-bf16 training, no fp32 copy)."""


def titan_dtype(path: Path, values: dict[str, Any], key: str, known: dict[str, bool]) -> bool:
    """Whether the dtype `key` names is bfloat16 (float32, torchtitan's default, if absent); another refused."""
    dtype = str(values.get(key, "float32"))
    if dtype not in known:
        raise InputError(f"--from {path}: {key} {dtype!r}: gplan prices float32 or bfloat16",
                         hint=f"set {key} to float32 or bfloat16")
    return known[dtype]


TITAN_TOKEN_BATCH = {"training.num_tokens_per_train_step": "training.global_batch_size",
                     "training.num_tokens_per_dp_rank": "training.local_batch_size",
                     "training.num_tokens_per_microbatch_per_dp_rank": "parallelism.pipeline_parallel_microbatch_size"}
"""torchtitan main's batch in tokens (pull requests 4121 and 4326; what gplan's export for main writes) -> the
sequences of 0.3's options, each count over `training.max_context_length` (the sequence length)."""


def titan_token_batch(path: Path, values: dict[str, Any]) -> dict[str, Any]:
    """`values` with torchtitan main's token counts turned into sequences of `max_context_length` tokens."""
    if "training.max_context_length" not in values:
        return values
    values = dict(values)
    seq = as_int(values.pop("training.max_context_length"))
    values["training.seq_len"] = seq
    for tokens_key, key in TITAN_TOKEN_BATCH.items():
        if tokens_key in values:
            tokens = as_int(values.pop(tokens_key))
            if not seq or tokens is None or tokens % seq:
                raise InputError(f"--from {path}: {tokens_key} {tokens} is not a whole number of "
                                 f"{seq}-token sequences (training.max_context_length)",
                                 hint="gplan prices whole sequences: make it a multiple of max_context_length")
            values[key] = tokens // seq
    return values


def titan_values(path: Path) -> tuple[dict[str, Any], dict, dict]:
    """A torchtitan launch's `section.key` values (its TOML, then the script's overrides over it), and the
    script's arguments and variables."""
    file, member = file_and_member(path)
    if not file.is_file():
        raise InputError(f"--from {path}: no such file", hint="pass a torchtitan TOML or launch script")
    if member is not None or (file.suffix == ".py" and registry.is_registry(file.read_text(errors="replace"))):
        return registry_launch_values(path), {}, {}
    if path.suffix == ".toml":
        return flatten(_toml(path)), {}, {}
    values: dict[str, Any] = {}
    args, variables = arguments(path.read_text())
    toml = value(args, "--job.config_file") or variables.get("CONFIG_FILE")  # run_train.sh's CONFIG_FILE
    function = value(args, "--config") or variables.get("CONFIG")  # 0.3: run_train.sh --module M --config NAME
    module = value(args, "--module") or variables.get("MODULE")
    if not toml and function and module != "gplan_torchtitan":  # gplan's own export: its module beside, read below
        values = titan_03_registry(path, module, function)
    elif not toml and not any(flag[2:].count(".") and not flag.startswith("--job.") for flag in args):
        raise InputError(f"--from {path}: it names torchtitan but holds no job config (no TOML named, no "
                         "--section.key overrides)", hint="pass the torchtitan TOML or the script that runs it")
    if toml:
        values = flatten(_toml(beside(path, toml)))
    for flag, vals in args.items():
        key = flag[2:]
        if key.count(".") and not key.startswith("job."):
            name = key.replace("no-", "", 1) if ".no-" in key else key
            name = name.replace(".no-", ".")
            values[name] = (vals[0] if vals else ".no-" not in key)
    chosen = titan_ac_subcommand(path.read_text())
    if chosen is not None:  # 0.3 picks the checkpointing class by subcommand; its fields start at their defaults
        values = {k: v for k, v in values.items() if not k.startswith("activation_checkpoint.")}
        values["activation_checkpoint.mode"] = chosen
        if chosen == "selective":  # 0.3's SelectiveAC is the per-operator policy (registry.AC_MODES)
            values["activation_checkpoint.selective_ac_option"] = "op"
    return values, args, variables


def titan_ac_subcommand(text: str) -> str | None:
    """torchtitan 0.3's checkpointing class as its command line picks it (tyro's subcommand of
    `Trainer.Config.activation_checkpoint`: `activation-checkpoint:full`, `:selective`, `:memory-budget`, `:none`)
    -> ≤ 0.2's `activation_checkpoint.mode`; the last one given, comments left out."""
    code = "\n".join(line.split(" #", 1)[0] for line in text.splitlines() if not line.lstrip().startswith("#"))
    found = re.findall(r"(?<![\w-])activation-checkpoint:(selective|full|memory-budget|none)\b", code)
    return found[-1].replace("-", "_") if found else None



def registry_launch_values(path: Path) -> dict[str, Any]:
    """A config registry function's `section.key` values, its loss chunks under REGISTRY_CHUNKS."""
    values, chunks = registry.registry_values(path)
    return {**values, REGISTRY_CHUNKS: chunks}


def titan_03_registry(path: Path, module: str | None, function: str) -> dict[str, Any]:
    """The values of a torchtitan 0.3 launch's `--module M --config NAME`: NAME in
    torchtitan/models/M/config_registry.py of the torchtitan checkout the script sits in, else of the installed
    torchtitan (the loss chunks under REGISTRY_CHUNKS, the file under REGISTRY_FILE); without either the script is
    asked for the registry."""
    candidates = (folder / "torchtitan" / "models" / str(module) / "config_registry.py"
                  for folder in (path.parent, *path.parent.parents, *installed_torchtitan()))
    registry_file = next((c for c in candidates if c.is_file()), None) if module else None
    if registry_file is None:
        raise InputError(f"--from {path}: a torchtitan 0.3 launch of --module {module} --config {function}, outside a "
                         "torchtitan checkout gplan can read its registry from, and no torchtitan installed",
                         hint=f"pass the registry's function: --from torchtitan/models/{module}/config_registry.py::"
                              f"{function}")
    return {**registry_launch_values(Path(f"{registry_file}::{function}")), REGISTRY_FILE: str(registry_file)}


TITAN_OVERRIDES = {
    "torchtitan.overrides.fused_swiglu.fused_swiglu": "the dense SwiGLU",
    "torchtitan.overrides.fused_swiglu.fused_grouped_experts": "the routed experts' SwiGLU",
}
"""torchtitan 0.3's module overrides (`override.imports`; torchtitan/overrides/) gplan prices as the modules they
replace: fused_swiglu.py's gate and up projections as one GEMM (the same FLOPs) and its Triton SiLU-and-mul."""


def titan_overrides(path: Path, imports: Any) -> list[str]:
    """The notes for a launch's `override.imports` (0.3: modules swapped for fused ones); one gplan does not price is
    refused, naming it."""
    if not imports:
        return []
    names = [str(name) for name in (imports if isinstance(imports, list) else str(imports).split(","))]
    unknown = next((name for name in names if name not in TITAN_OVERRIDES), None)
    if unknown is not None:
        raise InputError(f"--from {path}: override.imports {unknown}: a module override gplan does not price",
                         hint="price the launch without it (gplan reads "
                              + ", ".join(n.rsplit(".", 1)[-1] for n in TITAN_OVERRIDES) + ")")
    fused = " and ".join(TITAN_OVERRIDES[name] for name in names)
    return [f"(override.imports: {fused} fused — one gate-and-up GEMM, a Triton SiLU-and-mul — priced as torchtitan's "
            "stock SwiGLU: the same FLOPs, and its SiLU output counted as kept, which the fused kernel does not keep)"]


REGISTRY_FILE = "(registry file)"
"""The key titan_values hands the registry a script's `--module --config` was read from (said beside the price)."""


def installed_torchtitan() -> list[Path]:
    """The folder holding the installed torchtitan package, found without importing it (its spec only): where a
    script outside a torchtitan checkout has its registries, as run_train.sh run against a pip install does."""
    import importlib.util

    spec = importlib.util.find_spec("torchtitan")
    return [Path(spec.submodule_search_locations[0]).parent] if spec and spec.submodule_search_locations else []


def titan_log_launch(path: Path, model: ModelSpec | None, text: str) -> Launch:
    """A torchtitan log as a launch: its printed job config, or (torchtitan's default, no config printed)
    the launch beside it under its name, its world size from the log's mesh line."""
    if "Running with configs:" not in text:
        beside = titan_launch_beside(path)
        launch = read_torchtitan_launch(beside, model)
        mesh = logs.mesh_degrees(text)
        if mesh is None:
            return dataclasses.replace(launch, source=str(path))
        stated = {"tensor_parallel_degree": "tp", "pipeline_parallel_degree": "pp", "context_parallel_degree": "cp"}
        for key, degree in stated.items():
            if key in mesh and mesh[key] != launch.given[degree]:
                raise InputError(f"{path}: its mesh line has {degree} {mesh[key]}, but {beside.name} sets "
                                 f"{launch.given[degree]}", hint="put the launch that ran this log beside it")
        return dataclasses.replace(launch, source=str(path), world_size=math.prod(mesh.values()))
    log = logs.read_torchtitan_config(path, text)
    if model is None:
        from gplan.profiles.catalogue import load_model

        model = load_model(log.model)
    if log.model != model.name:
        raise InputError(f"--from {path}: the log trained {log.model}, not {model.name}",
                         hint="name the model the log trained")
    values = logs.flat_values(log.config)
    given, notes = _titan_layout(values, model, None, None)
    t = log.config.get("training", {})
    gbs = int(t.get("global_batch_size", -1))
    return Launch(source=str(path), engine="torchtitan", given=given, gbs=max(gbs, 0),
                  seq_length=int(t.get("seq_len", model.seq_length)), precision=_titan_precision(values),
                  stage_sizes=None, recompute_layers=None, world_size=logs.world_size(log.config),
                  unread=notes, local_batch=int(t.get("local_batch_size", t.get("batch_size", 1))), model=model,
                  engine_options=titan_engine_options(path, values, model,
                                                      values.get("parallelism.expert_parallel_comm_backend"),
                                                      printed_loss_chunks(log.config),
                                                      "training.disable_cuda_graphs" in values))


def printed_loss_chunks(config: dict) -> int:
    """The chunks of the loss a printed job config ran: 0.3's `loss` section holds ChunkedLossWrapper's
    `num_chunks` (a whole CrossEntropyLoss has none); ≤ 0.2 prints no loss section: 1."""
    loss = config.get("loss")
    return int(loss.get("num_chunks") or 1) if isinstance(loss, dict) else 1



def titan_launch_beside(log: Path) -> Path:
    for candidate in (log.with_suffix(".toml"), log.with_suffix(".sh")):
        if candidate.is_file():
            return candidate
    raise InputError(f"{log}: a torchtitan log that does not print its job config, and no launch beside it "
                     f"({log.stem}.toml or {log.stem}.sh)", hint="put the TOML or script that ran it beside the "
                     "log under its name, or run with --debug.print_config")



def titan_model_name(log: Path, text: str) -> str:
    """The bundled model a torchtitan log trained: its printed model_spec, or its launch's model.name and
    model.flavor."""
    if "Running with configs:" in text:
        return logs.read_torchtitan_config(log, text).model
    values, _, _ = titan_values(titan_launch_beside(log))
    name, flavor = values.get("model.name", "llama3"), values.get("model.flavor")
    found = logs.bundled(name, flavor)
    if found is None:
        raise InputError(f"{log}: model {name}/{flavor} has no bundled model of its shape",
                         hint="the bundled torchtitan shapes: " + ", ".join(f"{n}/{f}" for n, f in logs.BUNDLED))
    return found



def _toml(path: Path) -> dict:
    import tomllib

    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"--from {path}: not a complete TOML job config ({exc})",
                         hint="a torchtitan TOML as torchtitan reads it: check the file is whole") from None



def titan_model(path: Path, values: dict) -> ModelSpec:
    """The model a torchtitan launch names: the config.json of its `model.hf_assets_path` when there is one
    beside it, else gplan's bundled model of its `model.name` + `model.flavor` (engines.torchtitan.logs)."""
    from gplan.profiles.catalogue import load_model

    exported = exported_model(file_and_member(path)[0])
    if exported is not None and "model.name" not in values:
        return exported
    assets = values.get("model.hf_assets_path")
    if assets:
        for folder in (path.parent / str(assets), path.parent / Path(str(assets)).name):
            if (folder / "config.json").is_file():
                return load_model(str(folder / "config.json"))
    name, flavor = values.get("model.name", "llama3"), values.get("model.flavor")
    found = logs.bundled(name, flavor)
    if found is None and (spelled := logs.flavor_spelled_otherwise(name, flavor)):
        raise InputError(f"--from {path}: model.flavor {flavor!r}: torchtitan's {name} flavor is {spelled!r} (it looks "
                         "flavors up by their exact name: this config does not start as written)",
                         hint=f'set model.flavor = "{spelled}"')
    if found is None:
        raise InputError(f"--from {path}: no MODEL given, and torchtitan's {name} flavor {flavor} has no bundled "
                         "model of its shape", hint="name the model (gplan estimate MODEL --from FILE); bundled: "
                         + ", ".join(f"{n}/{f}" for n, f in logs.BUNDLED))
    return load_model(found)



def _check_titan_model(path: Path, values: dict, model: ModelSpec) -> None:
    """The model named is the launch's: the bundled shape of its flavor when gplan has it, else (a flavor
    gplan does not bundle) at least dense or MoE as its model family is (deepseek_v3 always has experts)."""
    from gplan.profiles.catalogue import load_model

    if "model.name" not in values:
        return
    name, flavor = str(values["model.name"]), values.get("model.flavor")
    found = logs.bundled(name, flavor)
    if found is not None:
        stated = load_model(found)
        if stated.total_params() != model.total_params():
            raise InputError(f"--from {path}: it trains torchtitan's {name} {flavor} ({found}), not {model.name}",
                             hint="leave MODEL out to price the launch's own model, or name the one it trains")
    elif name == "deepseek_v3" and not model.is_moe:
        raise InputError(f"--from {path}: model.name {name} has experts, but {model.name} is dense",
                         hint="name the model the launch trains")



TITAN_SEQ_LEN = 2048
"""torchtitan ≤ 0.2's `training.seq_len` where a job config leaves it out (config/job_config.py `Training`)."""

TITAN_LOCAL_BATCH = 8
"""torchtitan ≤ 0.2's `training.local_batch_size` (`batch_size` before) where a job config leaves it out
(config/job_config.py `Training`); the global batch then defaults to it times the data-parallel ranks."""

TITAN_AC_MODE, TITAN_AC_OPTION = "selective", "2"
"""torchtitan ≤ 0.2's activation checkpointing where a job config leaves it out (config/job_config.py
`ActivationCheckpoint`: `mode = "selective"`, `selective_ac_option = "2"`, every second block fully recomputed)."""

SINGLE_STAGE_SCHEDULES = {"GPipe", "1F1B"}
"""torch.distributed.pipelining's schedules with one stage per rank; the others (Interleaved1F1B, LoopedBFS,
InterleavedZeroBubble, ZBVZeroBubble, DualPipeV) loop over several."""



def _titan_layout(values: dict, model: ModelSpec, parts, ac) -> tuple[dict[str, Any], list[str]]:
    notes = []
    tp = as_int(values.get("parallelism.tensor_parallel_degree", 1))
    pp = as_int(values.get("parallelism.pipeline_parallel_degree", 1))
    cp = as_int(values.get("parallelism.context_parallel_degree", 1))
    replicate = as_int(values.get("parallelism.data_parallel_replicate_degree", 1))
    shard = as_int(values.get("parallelism.data_parallel_shard_degree", -1))
    reshard = str(values.get("parallelism.fsdp_reshard_after_forward", "default"))
    # "default" reshards after the forward without pipeline stages only: with them torchtitan keeps the weights
    # gathered, saving an all-gather per micro-batch (distributed/fsdp.py, get_fsdp_reshard_after_forward_policy)
    reshards = reshard == "always" or (reshard == "default" and pp == 1)
    zero = 0 if shard == 1 else (3 if reshards else 2)
    if shard != 1 and reshard == "default" and pp > 1:
        notes.append("(fsdp_reshard_after_forward \"default\" with pipeline stages: torchtitan keeps each stage's "
                     "weights gathered through the step — zero 2)")
    # torchtitan ≤ 0.2's defaults (config/job_config.py ActivationCheckpoint): mode "selective", option "2" — a
    # job config without the section checkpoints every second block; a gplan export's module says its own
    mode = str(values.get("activation_checkpoint.mode", ac or TITAN_AC_MODE)).lower()
    # an export's module names 0.3's SelectiveAC, its per-operator policy (`op`); ≤ 0.2's option defaults to "2"
    option = str(values.get("activation_checkpoint.selective_ac_option", "op" if ac else TITAN_AC_OPTION))
    if "activation_checkpoint.mode" not in values and ac is None:
        notes.append(f"(activation_checkpoint.mode not set: torchtitan's default, {TITAN_AC_MODE} with option "
                     f"{TITAN_AC_OPTION})")
    if mode == "selective" and option != "op":
        notes.append(f"(activation_checkpoint selective, option {option}: torchtitan's layer-level AC, every "
                     f"{option}th block fully recomputed, is priced as full recompute of every layer — more time "
                     "and less memory than it takes)")
    per_op = mode == "selective" and option == "op"
    recompute = "none" if mode in ("none", "") else ("selective" if per_op else "full")
    sp = str(values.get("parallelism.enable_sequence_parallel", True)).lower() not in ("false", "0")
    micro = as_int(values.get("parallelism.pipeline_parallel_microbatch_size", 1))
    local = as_int(values.get("training.local_batch_size", values.get("training.batch_size", TITAN_LOCAL_BATCH)))
    vpp = 1
    if pp > 1 and parts:
        vpp = len(parts) // pp
    elif pp > 1 and values.get("parallelism.pipeline_parallel_layers_per_stage"):
        vpp = model.total_layers // (pp * as_int(values["parallelism.pipeline_parallel_layers_per_stage"]))
    schedule = str(values.get("parallelism.pipeline_parallel_schedule", "1F1B"))
    if pp > 1 and vpp == 1 and schedule not in SINGLE_STAGE_SCHEDULES:
        vpp = 2  # torchtitan's looped schedules without a split given: two stages per rank (pipeline_module_split)
    given = {"tp": tp, "pp": pp, "cp": cp, "sp": sp and tp > 1, "zero": zero, "recompute": recompute,
             **({"recompute_modules": PER_OP_MODULES} if per_op else {}),
             "mbs": micro if pp > 1 else local, "vpp": vpp, "ep": as_int(values.get("parallelism.expert_parallel_degree", 1)),
             "dp_shard": shard, "dp_replicate": replicate}
    if pp > 1:
        given["schedule"] = {"GPipe": "gpipe", "1F1B": "1f1b"}.get(schedule, "interleaved_1f1b" if vpp > 1 else "1f1b")
    # torchtitan's experts follow tp at ep 1 (spec.targets); with ep, expert_tensor_parallel_degree (1 or tp)
    given["etp"] = tp if given["ep"] == 1 else as_int(values.get("parallelism.expert_tensor_parallel_degree", 1))
    return given, notes



def _check_titan_experts_precision(path: Path, values: dict, model: ModelSpec) -> None:
    """A low-precision MoE launch runs its routed experts in the recipe only with 0.3's grouped-experts converter
    (Float8GroupedExpertsConverter, MXFP8GroupedExpertsConverter: torchao's scaled grouped GEMMs); without it they
    stay BF16, which gplan does not price under a low-precision recipe (its experts are priced in it)."""
    precision, converters = _titan_precision(values), [c.lower() for c in titan_converters(values)]
    if model.is_moe and precision in LOW_PRECISION and not any("groupedexperts" in c for c in converters):
        raise InputError(f"--from {path}: its routed experts stay in BF16 under {precision} (no "
                         "grouped-experts converter), which gplan prices in the recipe",
                         hint="add Float8GroupedExpertsConverter (or MXFP8GroupedExpertsConverter) to its converters, "
                              "or price it without the converters (bf16)")


def titan_converters(values: dict) -> list[str]:
    """`model.converters` as a list (a TOML may give one as a string)."""
    converters = values.get("model.converters") or []
    return [converters] if isinstance(converters, str) else [str(c) for c in converters]


def _titan_precision(values: dict) -> str:
    converters = titan_converters(values)
    if any("float8" in c for c in converters):
        recipe = values.get("quantize.linear.float8.recipe_name", values.get("float8.recipe_name", "tensorwise"))
        return "fp8" if recipe == "tensorwise" else "fp8-rowwise"
    if any("mx" in c for c in converters):
        return "mxfp8"
    return "fp32" if str(values.get("training.mixed_precision_param", "bfloat16")) == "float32" else "bf16"


# ---- the reader's part (planner.launch_files) ---------------------------------------------------------

READS = "torchtitan TOMLs, override lines and 0.3 config registries (config_registry.py::function)"

FROM_READS = (
    "a job TOML, a script of `--section.key` overrides (`run_train.sh`'s `CONFIG_FILE`/`NGPU` too), a 0.3 config "
    "registry's function (`config_registry.py::qwen3_30b_a3b`), or its log")
"""What `--from` reads (docs/bring-your-own-runs.md's table, from bench/engine_tables.py)."""
CALIBRATE_READS = (
    "its log: the job config it prints (`--debug.print_config`), else the launch beside it (`run.log` + "
    "`run.toml`/`run.sh`); the mesh line, step lines (every rank's)")
"""What `gplan calibrate` reads (— : nothing)."""
"""What this reader takes, as gplan says when a file is no launch it reads."""
PRECEDENCE = 1


def claims(path: Path, text: str) -> bool:
    """A TOML job config, a script that runs torchtitan or passes `--parallelism.…` overrides, or a torchtitan 0.3
    config registry (`config_registry.py::function`)."""
    if file_and_member(path)[0].suffix == ".py":
        return registry.is_registry(text)
    return path.suffix == ".toml" or "torchtitan" in text or "--parallelism." in text


def read(path: Path, model: ModelSpec | None, text: str) -> Launch:
    return read_torchtitan_launch(path, model)


def read_log(path: Path, model: ModelSpec | None, text: str, strict: bool = False) -> Launch:
    """A torchtitan log as a launch, with its steady tokens/s per device; `strict` (calibrate): a log with
    no steady steps, or none that says how many devices ran, is refused."""
    launch = titan_log_launch(path, model, text)
    if strict and launch.world_size is None:
        raise InputError(f"{path}: neither the log (a mesh line) nor its launch says how many devices ran",
                         hint="pass the log from its start, or set NGPU / --nproc_per_node in the launch")
    return with_speed(launch, lambda: {"measured_device_tokens_per_s": logs.read_steps(path, text)[0]}, strict)
