"""Read the launch a team already runs: a Megatron-LM script or argument list (`--from FILE`).

The layout flags (degrees, micro- and global batch, recompute, precision, optimizer sharding, the
pipeline split) become a configuration gplan prices as Megatron runs it; the model flags are checked
against the model named beside `--from` (a launch that trains another model is refused, naming the
flag). A flag gplan does not read is listed; one that would change the layout or its cost is refused
(exit 3), never ignored silently. The flags and their meaning follow Megatron-LM's
`megatron/training/arguments.py` (the rules gplan's own export keeps, tests/backends/megatron_rules.py).

Read: Megatron-LM scripts and argument files (and NeMo/Megatron-Bridge runs launched through
`pretrain_gpt.py`), torchtitan TOMLs and override scripts, Megatron-DeepSpeed scripts with their
DeepSpeed JSON, MindFormers YAMLs, gplan's own SLURM and Kubernetes exports, and the engines' training
logs (planner.logs): a log says what configuration ran as completely as a launch does.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

from gplan.errors import InputError
from gplan.launch_text import arguments
from gplan.planner.engine_flags import (DS_READ, LAYOUT_FLAGS, MF_READ, MODEL_FLAGS, MODEL_SWITCHES, deepspeed_key_class,
                                        deepspeed_zero_class, megatron_class, mindformers_class, titan_class)
from gplan.planner.logs.detect import family
from gplan.spec.model import ModelSpec
from gplan.spec.parallel import PER_OP_MODULES, LayerCount, StageLayout, even_stage_sizes
from gplan.spec.training import MoeDispatcher

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
    """torchtitan's sequences per data-parallel rank per step, where the launch sets no global batch."""
    plan: Any = None
    """The gplan plan a launch of gplan's own worker runs (a SLURM or Kubernetes export): priced as written."""
    per_stage_recompute: tuple | None = None
    """MindFormers' (full, selective) recompute counts per stage (or True for every layer)."""
    engine_options: dict[str, bool | str] = field(default_factory=dict)
    """Megatron's engine options the launch sets (TrainingSpec's grad_reduce_in_bf16, fp8_param_gather,
    moe_a2a_overlap, cuda_graphs)."""
    no_effect: dict[str, str] = field(default_factory=dict)
    """Flags read that change neither the layout nor its cost, with why (planner.engine_flags)."""
    model: ModelSpec | None = None
    """The model the launch trains: the one named beside it, else the one its shape flags or its model name
    and flavor state."""
    model_from_launch: str | None = None
    """Where the model came from when MODEL was left out (said beside the prediction)."""
    measured_step_s: float | None = None
    """A log's own steady step (the readers `gplan calibrate` uses), shown beside the prediction."""
    measured_device_tokens_per_s: float | None = None
    """torchtitan logs tokens/s per device, not the step: the step follows from the batch and devices priced."""


def read_launch(path: Path, model: ModelSpec | None) -> Launch:
    """The launch in `path`, by its engine: a torchtitan TOML or script (`--parallelism.…` overrides,
    `torchtitan.train`), a Megatron-DeepSpeed script (`--deepspeed_config`), else a Megatron-LM script,
    argument file or YAML map; checked against `model`, or (None) its model read from the launch itself."""
    if not path.is_file():
        raise InputError(f"--from {path}: no such file", hint="pass a Megatron-LM or torchtitan launch")
    text = path.read_text(errors="replace")
    plan = gplan_plan_of(path, text)
    if plan is not None:
        if model is not None and plan.model.total_params() != model.total_params():
            raise InputError(f"--from {path}: it runs {plan.model.name}, not {model.name}",
                             hint="name the model the launch trains")
        return Launch(source=str(path), engine="torch", given={}, gbs=plan.training.gbs,
                      seq_length=plan.training.seq_length, precision=plan.training.precision, stage_sizes=None,
                      recompute_layers=None, world_size=plan.world_size, plan=plan, model=plan.model)
    if family(text):
        return read_log_launch(path, model, text)
    if path.suffix in (".yaml", ".yml") and "parallel_config:" in text:
        return read_mindformers_launch(path, model)
    if path.suffix == ".toml" or "torchtitan" in text or "--parallelism." in text:
        return read_torchtitan_launch(path, model)
    if re.search(r"--deepspeed[_-]config|--deepspeed\b", text):
        return read_deepspeed_launch(path, model, text)
    unread = not_a_launch(path, text)
    if unread:
        raise InputError(f"--from {path}: {unread[0]}", hint=unread[1])
    return read_megatron_launch(path, model, text)


def not_a_launch(path: Path, text: str) -> tuple[str, str] | None:
    """(what the file is, what gplan reads instead) for a file that is no launch gplan reads: a Python
    recipe or config module, a DeepSpeed JSON alone, a MaxText or NeMo YAML, another YAML; None otherwise."""
    reads = "gplan reads Megatron-LM scripts, argument files and YAML maps, torchtitan TOMLs and override lines, " \
            "Megatron-DeepSpeed scripts, MindFormers YAMLs and the engines' logs"
    if path.suffix == ".py":
        return ("a Python file (a Megatron-Bridge or NeMo recipe, or a torchtitan 0.3 config module), not a launch",
                "pass the script or command line that runs it; " + reads)
    if path.suffix == ".json":
        kind = "a DeepSpeed config, read with the script that names it (--deepspeed_config)" if re.search(
            r'"(train_batch_size|zero_optimization|train_micro_batch_size_per_gpu)"', text) else "a JSON file"
        return (kind + ", not a launch", "pass the launch script that runs it; " + reads)
    if path.suffix in (".yaml", ".yml") and not re.search(r"^MODEL_ARGS\s*:", text, re.MULTILINE):
        if re.search(r"^\s*(ici|dcn)_\w+_parallelism\s*:", text, re.MULTILINE):
            return "a MaxText config: gplan does not read MaxText's configs", "price its layout with gplan estimate " \
                   "MODEL --tp … --pp …, or pass a Megatron-LM or torchtitan launch"
        if re.search(r"^trainer\s*:", text, re.MULTILINE) and "tensor_model_parallel_size" in text:
            return "a NeMo YAML config: gplan does not read NeMo's YAML", "pass the pretrain_gpt.py command line it " \
                   "runs, or price its layout with gplan estimate MODEL --tp … --pp …"
        return "a YAML file that is neither a MindFormers config nor a Megatron YAML map (MODEL_ARGS)", reads
    return None


def read_log_launch(path: Path, model: ModelSpec | None, text: str) -> Launch:
    """The configuration an engine's log says it ran, as a launch: Megatron-LM / Megatron-DeepSpeed from
    the arguments block (and the DeepSpeed JSON), torchtitan from its printed job config, MindFormers from
    the training YAML beside the log; checked against `model`."""
    from gplan.planner.logs import megatron, mindformers

    engine = family(text)
    if engine == "mindformers":
        launch = read_mindformers_launch(mindformers.config_beside(path), model)
    elif engine == "torchtitan":
        launch = titan_log_launch(path, model, text)
    else:
        launch = megatron_log_launch(megatron.arguments_block(text, path), path, model)
    return dataclasses.replace(launch, **logged_speed(path, text, engine))


def logged_speed(path: Path, text: str, engine: str) -> dict:
    """The log's steady speed as `gplan calibrate` reads it: its step in seconds, or (torchtitan) its
    tokens/s per device; nothing where it logged no step (a log of a run's start still gives its layout)."""
    from gplan.planner.logs import megatron, mindformers, torchtitan

    try:
        if engine == "mindformers":
            return {"measured_step_s": mindformers.steady_step_s(path)}
        if engine == "torchtitan":
            return {"measured_device_tokens_per_s": torchtitan.read_steps(path, text)[0]}
        return {"measured_step_s": megatron.read_megatron_log(path).step_s}
    except InputError:
        return {}


def megatron_log_launch(args: dict, path: Path, model: ModelSpec | None) -> Launch:
    """A Megatron-LM or Megatron-DeepSpeed log's arguments (planner.logs.megatron) as a launch of `model`
    (None: the model the log built, its padded vocabulary as printed)."""
    from gplan.planner.logs import megatron

    logged = megatron.model_from_args(args, model.name if model is not None else path.stem)
    model = logged if model is None else model
    for field_name in ("num_layers", "hidden_size", "ffn_size", "num_attention_heads", "kv_heads",
                       "num_experts", "top_k", "expert_ffn_size"):
        if getattr(logged, field_name) != getattr(model, field_name):
            raise InputError(f"--from {path}: the log's model has {field_name} {getattr(logged, field_name)}, "
                             f"{model.name} has {getattr(model, field_name)}", hint="name the model the log trained")
    # Megatron pads the vocabulary to a multiple of make_vocab_size_divisible_by × tp: the log prints the padded one
    padding = int(args.get("make_vocab_size_divisible_by") or 128) * int(args["tensor_model_parallel_size"])
    if not 0 <= logged.vocab_size - model.vocab_size < padding:
        raise InputError(f"--from {path}: the log's model has a vocabulary of {logged.vocab_size} (padded), "
                         f"{model.name} has {model.vocab_size}", hint="name the model the log trained")
    values = megatron.config_values(args)
    block = values["recompute"] == "full" and args.get("recompute_method") == "block"
    engine_options = {"grad_reduce_in_bf16": bool(args.get("grad_reduce_in_bf16")),
                      "fp8_param_gather": bool(args.get("fp8_param_gather")),
                      "moe_a2a_overlap": bool(args.get("overlap_moe_expert_parallel_comm")),
                      "cuda_graphs": cuda_graphs_of(args.get("cuda_graph_impl"), args.get("cuda_graph_scope")),
                      "moe_dispatcher": dispatcher_of(args.get("moe_token_dispatcher_type"), model)}
    return Launch(source=str(path), engine=megatron.engine(args), given=values, gbs=int(args["global_batch_size"]),
                  engine_options=engine_options if megatron.engine(args) == "megatron" else {},
                  seq_length=int(args["seq_length"]), precision=megatron.precision(args),
                  stage_sizes=megatron_split(model, values["pp"], args.get("pipeline_model_parallel_layout"),
                                             args.get("decoder_first_pipeline_num_layers"),
                                             args.get("decoder_last_pipeline_num_layers")),
                  recompute_layers=int(args.get("recompute_num_layers") or 0) if block else None,
                  world_size=int(args["world_size"]), model=model)


def gplan_plan_of(path: Path, text: str):
    """The plan a launch of gplan's own worker runs: the `--plan FILE` of a SLURM script (or any torchrun
    line of `gplan.backends.torch.worker`), the plan.json a Kubernetes ConfigMap carries; None otherwise."""
    from gplan.plan import Plan, check_plan, read_plan

    named = re.search(r"gplan\.backends\.torch\.worker\b.*?--plan\s+(\S+)", text)
    if named:
        file = Path(named.group(1).strip("\"'"))
        return read_plan(file if file.is_absolute() else path.parent / file)
    if "kind: ConfigMap" in text and "plan.json" in text:
        import json

        import yaml

        for document in yaml.safe_load_all(text):
            carried = ((document or {}).get("data") or {}).get("plan.json")
            if carried:
                plan = Plan.model_validate(json.loads(carried))
                check_plan(plan, str(path))
                return plan
    return None


def read_megatron_launch(path: Path, model: ModelSpec | None, text: str) -> Launch:
    """The Megatron-LM launch in `path` (a script, a file of arguments, or the MoE model zoo's YAML map with
    the launch line that fills it), checked against `model` — or, without one, its model built from the
    shape flags."""
    from gplan.planner.model_zoo import zoo_arguments

    args, variables = zoo_arguments(path, text) or arguments(text)
    if "--num-layers" not in args and "--tensor-model-parallel-size" not in args:
        raise InputError(f"--from {path}: no Megatron-LM arguments found (no --num-layers, no "
                         "--tensor-model-parallel-size)", hint="pass the script that runs pretrain_gpt.py")
    model = model_of_flags(args, path) if model is None else model
    check_model(args, model, path)
    known = MODEL_FLAGS.keys() | LAYOUT_FLAGS | MODEL_SWITCHES | WORLD.keys()
    unread, no_effect = classified(path, {a: v for a, v in args.items() if a not in known}, megatron_class)
    a2a_overlap = "--overlap-moe-expert-parallel-comm" in args or (
        "--combined-1f1b" in args and value(args, "--combined-1f1b-recipe") == "ep_a2a")
    return Launch(source=str(path), engine="megatron", given=layout_of(args), gbs=integer(args, "--global-batch-size", path),
                  seq_length=optional_int(args, "--seq-length"), precision=precision_of(args),
                  stage_sizes=stage_sizes_of(args, model), recompute_layers=block_layers(args),
                  world_size=world_size(args, variables), unread=unread, no_effect=no_effect, model=model,
                  engine_options={"grad_reduce_in_bf16": "--grad-reduce-in-bf16" in args,
                                  "fp8_param_gather": "--fp8-param-gather" in args,
                                  "moe_a2a_overlap": a2a_overlap,
                                  "cuda_graphs": cuda_graphs_of(value(args, "--cuda-graph-impl"),
                                                                args.get("--cuda-graph-scope")),
                                  "moe_dispatcher": dispatcher_of(value(args, "--moe-token-dispatcher-type"), model)})


def classified(path: Path, flags: dict[str, Any], rule) -> tuple[list[str], dict[str, str]]:
    """The flags a reader does not read, by `rule` (planner.engine_flags): (not read, {read with no effect:
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


def model_of_flags(args: dict, path: Path) -> ModelSpec:
    """The model a Megatron launch states with its shape flags: the bundled model of that shape when there is
    one (its vocabulary, norms and rope named there), else built from the flags (planner.logs.megatron's
    reading of Megatron's arguments), its vocabulary from --vocab-size or the tokenizer it names."""
    from gplan.planner.logs import megatron

    shape = {flag: optional_int(args, flag) for flag in MODEL_FLAGS if flag != "--window-attn-skip-freq"}
    for flag in ("--num-layers", "--hidden-size", "--num-attention-heads"):
        if shape[flag] is None:
            raise InputError(f"--from {path}: no MODEL given and the launch does not state {flag}",
                             hint="name the model the launch trains: gplan estimate MODEL --from FILE")
    logged: dict[str, Any] = {}
    for flag, values in args.items():
        key = flag[2:].replace("-", "_")
        logged[key] = True if not values else (_number(values[0]) if len(values) == 1 else values)
    logged["add_bias_linear"] = "--disable-bias-linear" not in args
    if "--moe-layer-freq" in args:
        logged["moe_layer_freq"] = _layer_freq(value(args, "--moe-layer-freq"), shape["--num-layers"])
    exported = exported_model(path)  # gplan's own export: the model it names, checked against the flags
    if exported is not None:
        return exported
    vocab = optional_int(args, "--vocab-size") or tokenizer_vocab(value(args, "--tokenizer-model"))
    found = bundled_of_shape(shape, vocab, path)
    if found is not None:
        return found
    if not logged.get("vocab_size"):
        if vocab is None:
            raise InputError(f"--from {path}: no MODEL given, and the launch states no --vocab-size (its tokenizer "
                             f"{value(args, '--tokenizer-model') or value(args, '--tokenizer-type')} is not one gplan knows)",
                             hint="name the model: gplan estimate MODEL --from FILE (a bundled name, model.yaml or config.json)")
        logged["vocab_size"], logged["tokenizer_type"] = vocab, None
    logged.setdefault("seq_length", optional_int(args, "--seq-length") or 4096)
    try:
        return megatron.model_from_args(logged, path.stem)
    except ValueError as exc:
        raise InputError(f"--from {path}: its model flags do not make a model: {exc}".splitlines()[0],
                         hint="name the model: gplan estimate MODEL --from FILE") from None


def bundled_of_shape(shape: dict[str, int | None], vocab: int | None, path: Path) -> ModelSpec | None:
    """The bundled model whose shape is every shape flag the launch gives (a dense launch, no --num-experts,
    matches only dense models) and, when the launch states it, its vocabulary; several: refused, naming them."""
    from gplan.profiles.catalogue import bundled_models, load_model

    found = []
    for name in bundled_models():
        model = load_model(name)
        if model.is_moe != (shape.get("--num-experts") is not None):
            continue
        if all(given is None or MODEL_FLAGS[flag](model) == given for flag, given in shape.items()) and (
                vocab is None or model.vocab_size == vocab):
            found.append(model)
    if len(found) > 1:
        raise InputError(f"--from {path}: no MODEL given, and its shape flags fit {', '.join(m.name for m in found)} "
                         "(the launch does not state its vocabulary)", hint=f"name one: gplan estimate {found[0].name} "
                         f"--from {path.name}")
    return found[0] if found else None


TOKENIZER_VOCABULARIES = {"qwen/qwen3": 151936, "deepseek-ai/deepseek-v3": 129280, "meta-llama/meta-llama-3": 128256,
                          "meta-llama/llama-3": 128256, "mistralai/mixtral": 32000, "openai/gpt-oss": 201088,
                          "moonshotai/kimi-k2": 163840}
"""Vocabularies of the Hugging Face tokenizers Megatron launches name (`--tokenizer-model`), by repository
prefix: each model family's config.json `vocab_size` (the same sources as the bundled models; Kimi K2:
moonshotai/Kimi-K2-Instruct config.json)."""


def tokenizer_vocab(named: str | None) -> int | None:
    if not named:
        return None
    lowered = named.lower()
    return next((v for prefix, v in TOKENIZER_VOCABULARIES.items() if lowered.startswith(prefix)), None)


def _number(text: str):
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def _layer_freq(text: str | None, layers: int):
    """--moe-layer-freq as Megatron reads it (moe_freq_type): an int N (one MoE layer in N) or a list pattern."""
    if text is None:
        return 1
    if "[" in text:
        if re.search(r"[^,\d\[\]()+*\s]", text):
            raise InputError(f"--moe-layer-freq {text!r}: not a list pattern", hint="write e.g. ([0]*3+[1]*58)")
        return eval(text, {"__builtins__": {}})  # noqa: S307 - digits, brackets, + and * only (checked above)
    return int(text)


def dispatcher_of(named: str | None, model: ModelSpec) -> str:
    """TrainingSpec.moe_dispatcher of Megatron's --moe-token-dispatcher-type: as named, else Megatron's default,
    allgather (arguments.py, _add_moe_args) — for a model with experts; a dense model's is moot (gplan's
    default). DeepEP and HybridEP (--moe-enable-deepep, --moe-flex-dispatcher-backend) are both `flex`."""
    if not model.is_moe:
        return "alltoall"
    known = get_args(MoeDispatcher)
    if named is not None and named not in known:
        raise InputError(f"--moe-token-dispatcher-type {named}: Megatron's dispatchers are {', '.join(known[:-1])} "
                         f"and {known[-1]}", hint="fix the launch's --moe-token-dispatcher-type")
    return named or "allgather"


def cuda_graphs_of(impl: str | None, scope) -> str:
    """TrainingSpec.cuda_graphs of Megatron's --cuda-graph-impl and --cuda-graph-scope: the whole iteration,
    a capture that holds the MoE router (`moe_router`, or an MoE layer whole), or none that gplan prices
    (no graph, or graphs of dense parts only: the host time it prices is the MoE layers')."""
    scopes = set(scope.split() if isinstance(scope, str) else scope or [])
    if impl in (None, "none"):
        return "none"
    if "full_iteration" in scopes:
        return "full_iteration"
    return "moe_router" if not scopes or scopes & {"moe_router", "moe"} else "none"


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


def check_model(args: dict, model: ModelSpec, path: Path) -> None:
    """The launch trains the model named: each model flag it sets equals the model's."""
    for flag, of in MODEL_FLAGS.items():
        given = optional_int(args, flag)
        if given is not None and of(model) is not None and given != of(model):
            raise InputError(f"--from {path}: {flag} {given}, but {model.name} has {of(model)}",
                             hint="name the model the launch trains (a bundled name, model.yaml or config.json)")


def layout_of(args: dict) -> dict[str, Any]:
    """The ParallelConfig options the flags set (Megatron's defaults for what they leave out)."""
    given: dict[str, Any] = {"tp": optional_int(args, "--tensor-model-parallel-size") or 1,
                             "pp": optional_int(args, "--pipeline-model-parallel-size") or 1,
                             "cp": optional_int(args, "--context-parallel-size") or 1,
                             "ep": optional_int(args, "--expert-model-parallel-size") or 1,
                             "mbs": optional_int(args, "--micro-batch-size") or 1,
                             "sp": "--sequence-parallel" in args}
    etp = optional_int(args, "--expert-tensor-parallel-size")
    given["etp"] = etp if etp is not None else given["tp"]  # Megatron: expert tp defaults to tp
    per_chunk, vpp = optional_int(args, "--num-layers-per-virtual-pipeline-stage"), \
        optional_int(args, "--virtual-pipeline-model-parallel-size")
    layers = optional_int(args, "--num-layers")
    layout = value(args, "--pipeline-model-parallel-layout")
    stages_per_rank = optional_int(args, "--num-virtual-stages-per-pipeline-rank")
    if layout:
        given["vpp"] = parse_layout(layout, given["pp"])[1]
    elif stages_per_rank:
        given["vpp"] = stages_per_rank
    elif vpp:
        given["vpp"] = vpp
    elif per_chunk and layers:  # the embedding and loss count as layers where the launch accounts them
        counted = layers + ("--account-for-embedding-in-pipeline-split" in args) + (
            "--account-for-loss-in-pipeline-split" in args)
        given["vpp"] = counted // (given["pp"] * per_chunk)
    given["zero"] = zero_of(args)
    granularity = value(args, "--recompute-granularity")
    if granularity is None and "--recompute-activations" in args:  # Megatron: selective, its shorthand
        granularity = "selective"
    if granularity is None and "--checkpoint-activations" in args:  # deprecated: every layer, fully
        granularity = "full"
    given["recompute"] = granularity if granularity in ("full", "selective") else "none"
    if "--recompute-modules" in args:
        given["recompute_modules"] = tuple(args["--recompute-modules"])
    if "--cpu-offloading" in args:
        given["offload_layers"] = optional_int(args, "--cpu-offloading-num-layers") or 0
    return given


def zero_of(args: dict) -> int:
    """--use-distributed-optimizer: zero 1; Megatron-FSDP's sharding strategies: 2 and 3."""
    if "--use-megatron-fsdp" in args or "--use-custom-fsdp" in args:  # --use-custom-fsdp: its name before 0.14
        return {"optim": 1, "optim_grads": 2, "optim_grads_params": 3}.get(
            value(args, "--data-parallel-sharding-strategy") or "optim_grads_params", 3)
    return 1 if "--use-distributed-optimizer" in args else 0


def block_layers(args: dict) -> int | None:
    """`--recompute-method block --recompute-num-layers N`: N layers of every chunk, fully."""
    if value(args, "--recompute-granularity") == "full" and value(args, "--recompute-method") == "block":
        return optional_int(args, "--recompute-num-layers")
    return None


def precision_of(args: dict) -> str:
    if "--fp4-format" in args:
        return "nvfp4"
    if "--fp8-format" in args:
        return "mxfp8" if value(args, "--fp8-recipe") == "mxfp8" else "fp8"
    return "fp16" if "--fp16" in args else ("bf16" if "--bf16" in args else "fp32")


def parse_layout(text: str, pp: int) -> tuple[list[int], int]:
    """Megatron's `--pipeline-model-parallel-layout` (megatron-core's PipelineParallelLayerLayout: `|` between
    virtual stages, `E` embedding, `t` a decoder layer, `m` an MTP depth, `L` the loss, `X*n` repeats,
    `(…)*n` repeats a group): the decoder layers of each pipeline rank, and the chunks per rank. Virtual
    stage j is chunk j // pp of rank j % pp."""
    flat = text.strip().strip("'\"")
    while True:  # expand the innermost groups first
        group = re.search(r"\(([^()]*)\)\*(\d+)", flat)
        if not group:
            break
        flat = flat[:group.start()] + group.group(1) * int(group.group(2)) + flat[group.end():]
    stages = flat.split("|")
    if len(stages) % pp:
        raise InputError(f"--pipeline-model-parallel-layout {text!r}: {len(stages)} virtual stages for pp={pp}",
                         hint="give pp × vpp stages separated by |")
    sizes = [0] * pp
    for j, stage in enumerate(stages):
        for count in re.findall(r"t(?:\*(\d+))?", stage):
            sizes[j % pp] += int(count or 1)
    return sizes, len(stages) // pp


def stage_sizes_of(args: dict, model: ModelSpec) -> list[int] | None:
    """The split a launch asks for (`megatron_split` of its flags, or `accounted_split`)."""
    pp = optional_int(args, "--pipeline-model-parallel-size") or 1
    layout = value(args, "--pipeline-model-parallel-layout")
    first, last = (optional_int(args, "--decoder-first-pipeline-num-layers"),
                   optional_int(args, "--decoder-last-pipeline-num-layers"))
    embedding, loss = "--account-for-embedding-in-pipeline-split" in args, "--account-for-loss-in-pipeline-split" in args
    if not layout and first is None and last is None and (embedding or loss) and pp > 1:
        return accounted_split(model.total_layers, pp, layout_of(args).get("vpp", 1), embedding, loss)
    return megatron_split(model, pp, layout, first, last)


def accounted_split(layers: int, pp: int, vpp: int, embedding: bool, loss: bool) -> list[int]:
    """Megatron's even split with the embedding and/or the loss counted as a layer
    (--account-for-embedding-in-pipeline-split, --account-for-loss-in-pipeline-split; megatron-core
    transformer_block.get_num_layers_to_build): every virtual stage holds (layers + embedding + loss) /
    (pp·vpp) of them, so the first virtual stage has one decoder layer fewer for the embedding and the last
    one fewer for the loss; virtual stage j is on rank j % pp."""
    stages = pp * vpp
    counted = layers + embedding + loss
    if counted % stages:
        raise InputError(f"{layers} layers + {int(embedding) + int(loss)} accounted (embedding, loss) do not divide "
                         f"into pp·vpp = {stages} virtual stages",
                         hint="Megatron refuses this split too: change pp, vpp or the accounted parts")
    per = counted // stages
    sizes = [0] * pp
    for j in range(stages):
        sizes[j % pp] += per - (embedding and j == 0) - (loss and j == stages - 1)
    return sizes


def megatron_split(model: ModelSpec, pp: int, layout: str | None, first: int | None, last: int | None) -> list[int] | None:
    """Megatron's stage split from its options: the pipeline layout, or the first/last stage sizes with the
    middle stages sharing the rest evenly; None for its even split."""
    if layout and layout != "None":
        return parse_layout(str(layout), pp)[0]
    if first is None and last is None or pp == 1:
        return None
    rest = model.total_layers - (first or 0) - (last or 0)
    middle = pp - (first is not None) - (last is not None)
    sizes = even_stage_sizes(rest, middle) if middle else []
    return ([first] if first is not None else []) + sizes + ([last] if last is not None else [])


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

    found = {}
    for key in ("dp", "tp", "pp", "vpp", "cp", "ep", "etp", "sp", "mbs", "zero", "recompute", "recompute_modules"):
        a, b = getattr(mine, key), getattr(best, key)
        if key == "recompute" and mine_layouts is not None and best_layouts is not None:
            a, b = recompute_mix(mine_layouts, mine.recompute_modules), recompute_mix(best_layouts, best.recompute_modules)
        if a != b:
            found[key] = (",".join(a) or "none", ",".join(b) or "none") if key == "recompute_modules" else (str(a), str(b))
    return found


# ---- torchtitan ----------------------------------------------------------------------------------------

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
}


def read_torchtitan_launch(path: Path, model: ModelSpec | None) -> Launch:
    """A torchtitan launch: a job TOML (torchtitan ≤ 0.2's `--job.config_file`), or a script of
    `--section.key value` overrides (with the TOML it names, and gplan's exported config module beside it);
    its model the one named, else torchtitan's `model.name` + `model.flavor` (or the config.json of its
    `model.hf_assets_path`)."""
    values, args, variables = titan_values(path)
    model = titan_model(path, values) if model is None else model
    _check_titan_model(path, values, model)
    module = path.parent / "gplan_torchtitan.py"
    parts = _module_constant(module, "MODULE_FQNS_PER_MODEL_PART") if module.is_file() else None
    ac = _module_constant(module, "ACTIVATION_CHECKPOINT") if module.is_file() else None
    given, notes = _titan_layout(values, model, parts, ac)
    lowp_on = _titan_precision(values) in ("fp8", "fp8-rowwise", "mxfp8")
    unread_keys = {k: v for k, v in values.items() if k not in TITAN_KEYS
                   and not (not lowp_on and re.match(r"(float8|mx|quantize)\.", k))}
    rule = (lambda k, v: ("refused", "a low-precision setting gplan does not read")
            if lowp_on and re.match(r"(float8|mx|quantize)\.", k) and not k.endswith(("filter_fqns", "emulate"))
            else titan_class(k, v))
    unread, no_effect = classified(path, unread_keys, rule)
    unread += sorted(k for k in values if k not in TITAN_KEYS and k not in unread_keys)
    gbs = _int(values.get("training.global_batch_size"))
    local = _int(values.get("training.local_batch_size", values.get("training.batch_size")))
    if gbs is None or gbs < 0:
        if local is None:
            raise InputError(f"--from {path}: no training.global_batch_size or local_batch_size",
                             hint="add --training.global_batch_size")
        gbs = None  # local × dp: fixed once the devices are known
    pp = given["pp"]
    sizes = None  # the chunks the module lists (virtual stage j on rank j % pp), summed per rank
    if parts and pp > 1:
        sizes = [0] * pp
        for j, part in enumerate(parts):
            sizes[j % pp] += sum(1 for name in part if name.startswith("layers."))
    comm = values.get("parallelism.expert_parallel_comm_backend",
                      _module_constant(module, "MOE_COMM_BACKEND") if module.is_file() else None)
    options = {"moe_dispatcher": titan_dispatcher(path, comm)} if model.is_moe else {}
    return Launch(source=str(path), engine="torchtitan", given=given, gbs=gbs or 0,
                  seq_length=_int(values.get("training.seq_len")), precision=_titan_precision(values),
                  stage_sizes=sizes, recompute_layers=None, world_size=world_size(args, variables),
                  unread=unread + notes, local_batch=local, no_effect=no_effect, model=model, engine_options=options)


TITAN_COMM_BACKENDS = {"standard": "alltoall", "deepep": "flex", "hybridep": "flex"}
"""torchtitan's token exchange (≤ 0.2 `parallelism.expert_parallel_comm_backend`, 0.3.0 `moe_comm_backend` of
make_token_dispatcher_config) -> TrainingSpec.moe_dispatcher: its all-to-all, or DeepEP's / HybridEP's kernels,
priced as Megatron's flex dispatcher (the same de-duplicated exchange and buffers)."""


def titan_dispatcher(path: Path, comm: str | None) -> str:
    if comm is None or comm in TITAN_COMM_BACKENDS:
        return TITAN_COMM_BACKENDS[comm or "standard"]
    if comm == "minimal_async_ep":
        raise InputError(f"--from {path}: moe_comm_backend minimal_async_ep (torchtitan's MinimalAsyncEP exchange) "
                         "is not priced by gplan", hint="use standard, deepep or hybridep")
    raise InputError(f"--from {path}: moe_comm_backend {comm!r}: torchtitan's are standard, deepep, hybridep and "
                     "minimal_async_ep", hint="fix the launch's expert_parallel_comm_backend")


def titan_values(path: Path) -> tuple[dict[str, Any], dict, dict]:
    """A torchtitan launch's `section.key` values (its TOML, then the script's overrides over it), and the
    script's arguments and variables."""
    if not path.is_file():
        raise InputError(f"--from {path}: no such file", hint="pass a torchtitan TOML or launch script")
    if path.suffix == ".toml":
        return _flatten(_toml(path)), {}, {}
    values: dict[str, Any] = {}
    args, variables = arguments(path.read_text())
    toml = value(args, "--job.config_file") or variables.get("CONFIG_FILE")  # run_train.sh's CONFIG_FILE
    if not toml and not any(flag[2:].count(".") and not flag.startswith("--job.") for flag in args):
        raise InputError(f"--from {path}: it names torchtitan but holds no job config (no TOML named, no "
                         "--section.key overrides)", hint="pass the torchtitan TOML or the script that runs it")
    if toml:
        values = _flatten(_toml(_beside(path, toml)))
    for flag, vals in args.items():
        key = flag[2:]
        if key.count(".") and not key.startswith("job."):
            name = key.replace("no-", "", 1) if ".no-" in key else key
            name = name.replace(".no-", ".")
            values[name] = (vals[0] if vals else ".no-" not in key)
    return values, args, variables


def titan_log_launch(path: Path, model: ModelSpec | None, text: str) -> Launch:
    """A torchtitan log as a launch: its printed job config, or (torchtitan's default, no config printed)
    the launch beside it under its name, its world size from the log's mesh line."""
    from gplan.planner.logs import torchtitan

    if "Running with configs:" not in text:
        beside = titan_launch_beside(path)
        launch = read_torchtitan_launch(beside, model)
        mesh = torchtitan.mesh_degrees(text)
        if mesh is None:
            return dataclasses.replace(launch, source=str(path))
        stated = {"tensor_parallel_degree": "tp", "pipeline_parallel_degree": "pp", "context_parallel_degree": "cp"}
        for key, degree in stated.items():
            if key in mesh and mesh[key] != launch.given[degree]:
                raise InputError(f"{path}: its mesh line has {degree} {mesh[key]}, but {beside.name} sets "
                                 f"{launch.given[degree]}", hint="put the launch that ran this log beside it")
        return dataclasses.replace(launch, source=str(path), world_size=math.prod(mesh.values()))
    log = torchtitan.read_torchtitan_config(path, text)
    if model is None:
        from gplan.profiles.catalogue import load_model

        model = load_model(log.model)
    if log.model != model.name:
        raise InputError(f"--from {path}: the log trained {log.model}, not {model.name}",
                         hint="name the model the log trained")
    values = torchtitan.flat_values(log.config)
    given, notes = _titan_layout(values, model, None, None)
    t = log.config.get("training", {})
    gbs = int(t.get("global_batch_size", -1))
    return Launch(source=str(path), engine="torchtitan", given=given, gbs=max(gbs, 0),
                  seq_length=int(t.get("seq_len", model.seq_length)), precision=_titan_precision(values),
                  stage_sizes=None, recompute_layers=None, world_size=torchtitan.world_size(log.config),
                  unread=notes, local_batch=int(t.get("local_batch_size", t.get("batch_size", 1))), model=model)


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
    from gplan.planner.logs import torchtitan

    if "Running with configs:" in text:
        return torchtitan.read_torchtitan_config(log, text).model
    values, _, _ = titan_values(titan_launch_beside(log))
    name, flavor = values.get("model.name", "llama3"), values.get("model.flavor")
    found = torchtitan.bundled(name, flavor)
    if found is None:
        raise InputError(f"{log}: model {name}/{flavor} has no bundled model of its shape",
                         hint="the bundled torchtitan shapes: " + ", ".join(f"{n}/{f}" for n, f in torchtitan.BUNDLED))
    return found


def _beside(script: Path, named: str) -> Path:
    """A file a script names: at its path from the script's folder, else under its own name beside the
    script (a launch copied out of the engine's repository with the config it names)."""
    for candidate in (script.parent / named, script.parent / Path(named).name):
        if candidate.is_file():
            return candidate
    raise InputError(f"--from {script}: it runs {named}, which is neither there nor beside it",
                     hint=f"put {Path(named).name} beside {script.name}")


def _toml(path: Path) -> dict:
    import tomllib

    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"--from {path}: not a complete TOML job config ({exc})",
                         hint="a torchtitan TOML as torchtitan reads it: check the file is whole") from None


def _flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, item in tree.items():
        if isinstance(item, dict):
            flat |= _flatten(item, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = item
    return flat


def _int(item) -> int | None:
    if item is None:
        return None
    try:
        return int(item)
    except (TypeError, ValueError):
        raise InputError(f"{item!r}: expected an integer", hint="write the number in the launch") from None


def _module_constant(module: Path, name: str):
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


def titan_model(path: Path, values: dict) -> ModelSpec:
    """The model a torchtitan launch names: the config.json of its `model.hf_assets_path` when there is one
    beside it, else gplan's bundled model of its `model.name` + `model.flavor` (planner.logs.torchtitan)."""
    from gplan.planner.logs import torchtitan
    from gplan.profiles.catalogue import load_model

    exported = exported_model(path)
    if exported is not None and "model.name" not in values:
        return exported
    assets = values.get("model.hf_assets_path")
    if assets:
        for folder in (path.parent / str(assets), path.parent / Path(str(assets)).name):
            if (folder / "config.json").is_file():
                return load_model(str(folder / "config.json"))
    name, flavor = values.get("model.name", "llama3"), values.get("model.flavor")
    found = torchtitan.bundled(name, flavor)
    if found is None:
        raise InputError(f"--from {path}: no MODEL given, and torchtitan's {name} flavor {flavor} has no bundled "
                         "model of its shape", hint="name the model (gplan estimate MODEL --from FILE); bundled: "
                         + ", ".join(f"{n}/{f}" for n, f in torchtitan.BUNDLED))
    return load_model(found)


def _check_titan_model(path: Path, values: dict, model: ModelSpec) -> None:
    """The model named is the launch's: the bundled shape of its flavor when gplan has it, else (a flavor
    gplan does not bundle) at least dense or MoE as its model family is (deepseek_v3 always has experts)."""
    from gplan.planner.logs import torchtitan
    from gplan.profiles.catalogue import load_model

    if "model.name" not in values:
        return
    name, flavor = str(values["model.name"]), values.get("model.flavor")
    found = torchtitan.bundled(name, flavor)
    if found is not None:
        stated = load_model(found)
        if stated.total_params() != model.total_params():
            raise InputError(f"--from {path}: it trains torchtitan's {name} {flavor} ({found}), not {model.name}",
                             hint="leave MODEL out to price the launch's own model, or name the one it trains")
    elif name == "deepseek_v3" and not model.is_moe:
        raise InputError(f"--from {path}: model.name {name} has experts, but {model.name} is dense",
                         hint="name the model the launch trains")


SINGLE_STAGE_SCHEDULES = {"GPipe", "1F1B"}
"""torch.distributed.pipelining's schedules with one stage per rank; the others (Interleaved1F1B, LoopedBFS,
InterleavedZeroBubble, ZBVZeroBubble, DualPipeV) loop over several."""


def _titan_layout(values: dict, model: ModelSpec, parts, ac) -> tuple[dict[str, Any], list[str]]:
    notes = []
    tp = _int(values.get("parallelism.tensor_parallel_degree", 1))
    pp = _int(values.get("parallelism.pipeline_parallel_degree", 1))
    cp = _int(values.get("parallelism.context_parallel_degree", 1))
    replicate = _int(values.get("parallelism.data_parallel_replicate_degree", 1))
    shard = _int(values.get("parallelism.data_parallel_shard_degree", -1))
    reshard = str(values.get("parallelism.fsdp_reshard_after_forward", "default"))
    zero = 0 if shard == 1 else (2 if reshard == "never" else 3)
    mode = str(values.get("activation_checkpoint.mode", ac or "none")).lower()
    option = str(values.get("activation_checkpoint.selective_ac_option", "op"))
    if mode == "selective" and option != "op":
        notes.append(f"(activation_checkpoint selective, option {option}: torchtitan's layer-level AC, every "
                     f"{option}th block fully recomputed, is priced as full recompute of every layer — more time "
                     "and less memory than it takes)")
    per_op = mode == "selective" and option == "op"
    recompute = "none" if mode in ("none", "") else ("selective" if per_op else "full")
    sp = str(values.get("parallelism.enable_sequence_parallel", True)).lower() not in ("false", "0")
    micro = _int(values.get("parallelism.pipeline_parallel_microbatch_size", 1))
    local = _int(values.get("training.local_batch_size", values.get("training.batch_size", 1)))
    vpp = 1
    if pp > 1 and parts:
        vpp = len(parts) // pp
    elif pp > 1 and values.get("parallelism.pipeline_parallel_layers_per_stage"):
        vpp = model.total_layers // (pp * _int(values["parallelism.pipeline_parallel_layers_per_stage"]))
    schedule = str(values.get("parallelism.pipeline_parallel_schedule", "1F1B"))
    if pp > 1 and vpp == 1 and schedule not in SINGLE_STAGE_SCHEDULES:
        vpp = 2  # torchtitan's looped schedules without a split given: two stages per rank (pipeline_module_split)
    given = {"tp": tp, "pp": pp, "cp": cp, "sp": sp and tp > 1, "zero": zero, "recompute": recompute,
             **({"recompute_modules": PER_OP_MODULES} if per_op else {}),
             "mbs": micro if pp > 1 else local, "vpp": vpp, "ep": _int(values.get("parallelism.expert_parallel_degree", 1)),
             "dp_shard": shard, "dp_replicate": replicate}
    if pp > 1:
        given["schedule"] = {"GPipe": "gpipe", "1F1B": "1f1b"}.get(schedule, "interleaved_1f1b" if vpp > 1 else "1f1b")
    # torchtitan's experts follow tp at ep 1 (spec.targets); with ep, expert_tensor_parallel_degree (1 or tp)
    given["etp"] = tp if given["ep"] == 1 else _int(values.get("parallelism.expert_tensor_parallel_degree", 1))
    return given, notes


def _titan_precision(values: dict) -> str:
    converters = values.get("model.converters") or []
    converters = [converters] if isinstance(converters, str) else list(converters)
    if any("float8" in c for c in converters):
        recipe = values.get("quantize.linear.float8.recipe_name", values.get("float8.recipe_name", "tensorwise"))
        return "fp8" if recipe == "tensorwise" else "fp8-rowwise"
    if any("mx" in c for c in converters):
        return "mxfp8"
    return "fp32" if str(values.get("training.mixed_precision_param", "bfloat16")) == "float32" else "bf16"


# ---- DeepSpeed (Megatron-DeepSpeed) ------------------------------------------------------------------

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


# ---- MindFormers ---------------------------------------------------------------------------------------

def read_mindformers_launch(path: Path, model: ModelSpec | None) -> Launch:
    """A MindFormers training YAML (its `parallel_config`, `parallel`, `recompute_config`, `model_config`
    and `runner_config`, as MindFormers 2.1's trainer reads them — the rules gplan's MindFormers export
    writes by): the degrees, the batch (with stages `batch_size × data_parallel × micro_batch_num`, without
    them `× gradient_accumulation_steps`), the per-stage `offset` split and recompute counts."""
    import yaml

    data = yaml.safe_load(path.read_text()) or {}
    pc, par = data.get("parallel_config") or {}, data.get("parallel") or {}
    mc = ((data.get("model") or {}).get("model_config")) or {}
    runner = data.get("runner_config") or {}
    model = (exported_model(path) or mindformers_model(mc, data, path)) if model is None else model
    for key, of in (("num_layers", lambda m: m.num_layers), ("hidden_size", lambda m: m.hidden_size),
                    ("num_heads", lambda m: m.num_attention_heads), ("num_attention_heads", lambda m: m.num_attention_heads),
                    ("n_kv_heads", lambda m: m.kv_heads), ("intermediate_size", lambda m: m.ffn_size if not m.is_moe else None),
                    ("num_experts", lambda m: m.num_experts)):
        given = mc.get(key)
        if given is not None and of(model) is not None and int(given) != of(model):
            raise InputError(f"--from {path}: model_config.{key} {given}, but {model.name} has {of(model)}",
                             hint="name the model the launch trains")
    for key in ("data_parallel", "model_parallel", "pipeline_stage"):
        if key not in pc:
            raise InputError(f"--from {path}: parallel_config.{key} is missing",
                             hint="the layout must be complete to be priced; gplan does not guess it")
    dp, tp, pp = int(pc["data_parallel"]), int(pc["model_parallel"]), int(pc["pipeline_stage"])
    mbs = int(runner.get("batch_size", 1))
    steps = int(pc.get("micro_batch_num", 1)) if pp > 1 else int(runner.get("gradient_accumulation_steps", 1))
    options = par.get("parallel_optimizer_config") or {}
    # optimizer parallel slices weights and states; sliced accumulated gradients make it zero 3 (spec/engines/mindformers)
    zero = (3 if options.get("gradient_accumulation_shard") else 1) if par.get("enable_parallel_optimizer") else 0
    vpp = int(mc.get("pp_interleave_num", 1) or 1)
    given = {"tp": tp, "pp": pp, "cp": int(pc.get("context_parallel", 1)), "sp": bool(pc.get("use_seq_parallel")),
             "mbs": mbs, "zero": zero, "vpp": vpp, "ep": int(pc.get("expert_parallel", 1)), "etp": 1,
             "recompute": "none"}
    offsets = mc.get("offset", 0)
    sizes = None
    if isinstance(offsets, list) and vpp == 1 and pp > 1:
        sizes = [model.num_layers // pp + int(o) for o in offsets]
    elif isinstance(offsets, list) and offsets and isinstance(offsets[0], list) and pp > 1:  # (vpp, pp) rows
        sizes = [sum(model.num_layers // (pp * vpp) + int(row[r]) for row in offsets) for r in range(pp)]
    rc = data.get("recompute_config") or {}
    keys = {k: v for k, v in _flatten({"parallel_config": pc, "recompute_config": rc, "parallel": par}).items()
            if k not in MF_READ}
    shard = "parallel.parallel_optimizer_config.optimizer_weight_shard_size"
    size = keys.pop(shard, -1)
    unread, no_effect = classified(path, keys, mindformers_class)
    if size not in (-1, int(pc["data_parallel"])):  # said, not refused: the run this reader was built on sets it
        no_effect[shard] = (f"optimizer state sharded over {size} of the {pc['data_parallel']} data-parallel ranks: "
                            f"priced over all of them (its optimizer memory is under-priced {int(pc['data_parallel']) // size}×)")
    return Launch(source=str(path), engine="mindformers", unread=unread, no_effect=no_effect, given=given, gbs=mbs * dp * steps,
                  seq_length=mc.get("seq_length"), precision={"bfloat16": "bf16", "float16": "fp16"}.get(
                      str(mc.get("compute_dtype", "bfloat16")), "fp32"),
                  stage_sizes=sizes, recompute_layers=None, world_size=dp * tp * pp * given["cp"], model=model,
                  per_stage_recompute=(_counts(rc.get("recompute"), pp), _counts(rc.get("select_recompute"), pp)))


def mindformers_model(mc: dict, data: dict, path: Path) -> ModelSpec:
    """The dense Llama-family model a MindFormers YAML's `model_config` states (MindFormers 2.1's LlamaConfig
    names: num_layers, hidden_size, num_heads, n_kv_heads, intermediate_size, vocab_size, seq_length,
    rms_norm_eps, theta); a mixture of experts (`moe_config`) needs its model named."""
    missing = [k for k in ("num_layers", "hidden_size", "num_heads", "vocab_size", "intermediate_size") if not mc.get(k)]
    if missing or data.get("moe_config"):
        what = f"its model_config has no {', '.join(missing)}" if missing else "its experts (moe_config) are not read"
        raise InputError(f"--from {path}: no MODEL given, and {what}",
                         hint="name the model: gplan estimate MODEL --from FILE (a bundled name, model.yaml or config.json)")
    fields = {"name": path.stem, "num_layers": mc["num_layers"], "hidden_size": mc["hidden_size"],
              "num_attention_heads": mc["num_heads"], "num_kv_heads": mc.get("n_kv_heads") or mc["num_heads"],
              "ffn_hidden_size": mc["intermediate_size"], "ffn_kind": "swiglu", "vocab_size": mc["vocab_size"],
              "seq_length": mc.get("seq_length") or 4096, "norm": "rmsnorm", "position_embedding": "rope",
              "rope_theta": float(mc.get("theta") or 10000)}
    try:
        return ModelSpec.model_validate(fields)
    except ValueError as exc:
        raise InputError(f"--from {path}: its model_config does not make a model: {str(exc).splitlines()[0]}",
                         hint="name the model: gplan estimate MODEL --from FILE") from None


def _counts(item, pp: int) -> list[int] | bool:
    """MindFormers' recompute value: False, True (every layer) or per-stage counts."""
    if isinstance(item, list):
        return [int(n) for n in item] + [0] * (pp - len(item))
    return bool(item)


def per_stage_layout(model: ModelSpec, sizes: list[int], full, selective) -> list[StageLayout]:
    """Each stage's first `full[i]` layers fully recomputed, the next `selective[i]` selectively (MindFormers'
    rule); True: every layer."""
    def flags(i: int, size: int) -> list[str]:
        n_full = size if full is True else (full[i] if full else 0)
        n_sel = size - n_full if selective is True else (min(selective[i], size - n_full) if selective else 0)
        return ["full"] * n_full + ["selective"] * n_sel + ["none"] * (size - n_full - n_sel)

    return layouts_of_flags(model, [flags(i, size) for i, size in enumerate(sizes)])


# ---- pricing a launch, and beside the best plan ---------------------------------------------------

def priced_launch(from_file: Path, model: str | None, devices, cluster, hardware, devices_per_node, seq_length, headroom,
                  profile, target, expert_imbalance):  # noqa: PLR0913 - the CLI's options, passed through
    """A launch file read, its inputs resolved (its batch, sequence and precision; priced as its engine runs
    it unless --target says otherwise) and its configuration priced: (launch, inputs, config, layouts, prediction)."""
    from gplan.cost_models.step import predict
    from gplan.planner.inputs import resolve_inputs
    from gplan.profiles.catalogue import load_model
    from gplan.spec.parallel import check_config

    launch = read_launch(from_file, load_model(model) if model else None)
    if not model and launch.model is not None:
        from gplan.profiles.catalogue import bundled_models

        kind = "the bundled model of that shape" if launch.model.name in bundled_models() else "built from its flags"
        launch = dataclasses.replace(launch, model_from_launch=f"{launch.model.name}, read from the launch ({kind})")
    if launch.plan is not None:  # gplan's own worker runs the plan it names, as written, priced as it runs it
        from gplan.plan import layouts_of
        from gplan.planner.inputs import Inputs

        p = launch.plan
        training = p.training.model_copy(update={"engine": "torch"})
        config, layouts = p.parallel.to_config(), layouts_of(p)
        return (launch, Inputs(model=p.model, training=training, cluster=p.cluster, devices=p.world_size), config,
                layouts, predict(p.model, training, p.cluster, config, layouts))
    devices = devices or launch.world_size
    if devices is None:
        raise InputError(f"--from {from_file}: the launch does not say how many GPUs it runs on",
                         hint="pass --devices N")
    spec = launch.model or load_model(model)
    gbs = launch_batch(launch, launch_config(launch, spec, devices))
    inputs = resolve_inputs(spec, devices, cluster, hardware, devices_per_node, gbs, seq_length or launch.seq_length,
                            launch.precision, headroom, str(profile) if profile else None, target or launch.engine,
                            expert_imbalance, **launch.engine_options)
    config = launch_config(launch, inputs.model, inputs.devices)
    check_config(inputs.model, inputs.training, config, inputs.devices)
    refuse_what_its_engine_does_not_run(from_file, launch, inputs, config)
    layouts = launch_layouts(launch, inputs.model, config, inputs.cluster)
    return launch, inputs, config, layouts, predict(inputs.model, inputs.training, inputs.cluster, config, layouts)


def refuse_what_its_engine_does_not_run(path: Path, launch: Launch, inputs, config) -> None:
    """A launch priced as its own engine runs it, in a layout that engine refuses (an expert grid its FSDP
    cannot fold, experts tp-sharded where it forbids it, a zero it does not run with experts …): exit 3,
    naming the engine's rule (spec.targets.config_refusals)."""
    from gplan.spec.targets import TARGETS, config_refusals

    engine = inputs.training.engine
    if engine != launch.engine or engine not in TARGETS:
        return
    microbatches = inputs.training.gbs // (config.mbs * config.dp)
    found = config_refusals(TARGETS[engine], inputs.model, config, microbatches, inputs.training.precision)
    if found:
        raise InputError(f"--from {path}: {engine} does not run this layout ({found[0].capability}): {found[0].detail}",
                         hint=f"fix the launch ({found[0].avoid}), or price it as another engine runs it: --target ENGINE")


def launch_defaults(mine, gbs, target, seq_length, precision, options: dict):
    """What `search --from` takes from the priced launch (`priced_launch`'s tuple) unless the command line
    says otherwise: (devices, gbs, target, seq_length, precision, engine options) — an engine switch the
    command line leaves at its default (False, "none") is the launch's."""
    from gplan.spec.targets import switch_default

    launch, training = mine[0], mine[1].training
    options = {key: given if given != switch_default(key) else getattr(training, key) for key, given in options.items()}
    return (mine[1].devices, gbs or training.gbs, target or launch.engine, seq_length or training.seq_length,
            precision or launch.precision, options)


def launch_versus(mine, planned) -> dict:
    """The user's launch beside the best plan: its configuration and prediction, what differs, the gain."""
    from gplan.planner.launch_files import differences

    from gplan.plan import layouts_of

    launch, _, config, layouts, prediction = mine
    best = planned.plan.prediction
    return {"source": launch.source, "engine": launch.engine, "parallel": config.model_dump(mode="json"),
            "prediction": prediction.model_dump(mode="json"), "not_read": launch.unread,
            "differences": differences(config, planned.plan.parallel, layouts, layouts_of(planned.plan)),
            "gain": best.tokens_per_s / prediction.tokens_per_s - 1}


def compare_launches(paths: list[Path], model: str, devices, cluster, hardware, devices_per_node, seq_length,
                     headroom, target):
    """`compare MODEL --from a.sh --from b.toml …`: each launch priced as its engine runs it; launches of
    different models (no MODEL given) are named with their model, since their steps are not one job's."""
    from gplan.planner.complete import Entry

    entries, models = [], []
    for path in paths:
        launch, inputs, config, layouts, prediction = priced_launch(path, model, devices, cluster, hardware,
                                                                    devices_per_node, seq_length, headroom, None,
                                                                    target, 1.0)
        models.append(inputs.model.name)
        entries.append(Entry(path.name, prediction, config, inputs.training.gbs, inputs.training.seq_length, layouts,
                             [], {}, target=inputs.training.engine))
    if len(set(models)) > 1:
        entries = [dataclasses.replace(entry, name=f"{entry.name} ({name})") for entry, name in zip(entries, models)]
    return entries
