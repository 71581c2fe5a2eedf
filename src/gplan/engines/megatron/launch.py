"""Megatron-LM's launches and logs read: a script, a file of arguments, the MoE model zoo's YAML map with the
launch line that fills it (NeMo / Megatron-Bridge runs launched through `pretrain_gpt.py` too), and the
arguments block its log prints. The layout flags (degrees, micro- and global batch, recompute, precision,
optimizer sharding, the pipeline split) become a configuration priced as Megatron runs it; the model flags
are checked against the model named beside `--from` (or, with none, make the model). Every other flag is
classified (flags.py): no effect (said), or refused away from its default. The flags' meanings follow
Megatron-LM's `megatron/training/arguments.py` (the rules gplan's own export keeps,
tests/backends/megatron_rules.py).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, get_args

from gplan.engines.megatron import ENGINE, logs
from gplan.engines.megatron.flags import LAYOUT_FLAGS, MODEL_FLAGS, MODEL_SWITCHES, megatron_class
from gplan.errors import InputError
from gplan.launch_text import arguments, called_script
from gplan.planner.launch import with_speed, WORLD, Launch, classified, exported_model, integer, number, optional_int, value, world_size
from gplan.spec.model import ModelSpec
from gplan.spec.parallel import even_stage_sizes
from gplan.spec.targets import sharded_overlaps
from gplan.spec.training import STATE_DTYPE_BYTES, MoeDispatcher

OVERLAP_SWITCHES = {"tp_comm_overlap": "tp_comm_overlap", "grad_reduce_overlap": "overlap_grad_reduce",
                    "param_gather_overlap": "overlap_param_gather"}
"""TrainingSpec's overlaps -> Megatron-LM's switches (arguments.py: each off unless passed), read as the launch
passes them: a launch without one runs that communication exposed."""


def megatron_log_launch(args: dict, path: Path, model: ModelSpec | None) -> Launch:
    """A Megatron-LM or Megatron-DeepSpeed log's arguments (engines.megatron.logs) as a launch of `model`
    (None: the model the log built, its padded vocabulary as printed)."""
    logged = logs.model_from_args(args, model.name if model is not None else path.stem)
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
    model = with_capacity(model, args.get("moe_expert_capacity_factor"))
    values = logs.config_values(args)
    block = values["recompute"] == "full" and args.get("recompute_method") == "block"
    engine_options = {"grad_reduce_in_bf16": bool(args.get("grad_reduce_in_bf16")),
                      **{key: bool(args.get(flag)) for key, flag in OVERLAP_SWITCHES.items()},
                      "fp8_param_gather": bool(args.get("fp8_param_gather")),
                      "legacy_grouped_gemm": model.is_moe and bool(args.get("moe_use_legacy_grouped_gemm") or (
                          args.get("transformer_impl") == "local" and args.get("moe_grouped_gemm"))),
                      "moe_a2a_overlap": bool(args.get("overlap_moe_expert_parallel_comm")),
                      "cuda_graphs": cuda_graphs_of(args.get("cuda_graph_impl"), args.get("cuda_graph_scope")),
                      "moe_dispatcher": dispatcher_of(args.get("moe_token_dispatcher_type"), model),
                      **optimizer_states_of(bool(args.get("use_precision_aware_optimizer")),
                                            {flag: args.get(flag.removeprefix("--").replace("-", "_"))
                                             for flag in STATE_DTYPE_FLAGS}, path),
                      "moe_shared_expert_overlap": model.is_moe and bool(args.get("moe_shared_expert_overlap")),
                      "moe_pad_to_capacity": model.is_moe and bool(args.get("moe_pad_expert_input_to_capacity")),
                      **optimizer_offload_of(bool(args.get("optimizer_cpu_offload")),
                                             args.get("optimizer_offload_fraction"),
                                             bool(args.get("overlap_cpu_optimizer_d2h_h2d")))}
    return Launch(source=str(path), engine=logs.engine(args), given=values, gbs=int(args["global_batch_size"]),
                  engine_options=engine_options if logs.engine(args) == "megatron" else {},
                  seq_length=int(args["seq_length"]), precision=logs.precision(args),
                  stage_sizes=megatron_split(model, values["pp"], args.get("pipeline_model_parallel_layout"),
                                             args.get("decoder_first_pipeline_num_layers"),
                                             args.get("decoder_last_pipeline_num_layers")),
                  recompute_layers=int(args.get("recompute_num_layers") or 0) if block else None,
                  world_size=int(args["world_size"]), model=model)



def read_megatron_launch(path: Path, model: ModelSpec | None, text: str) -> Launch:
    """The Megatron-LM launch in `path` (a script, a file of arguments, or the MoE model zoo's YAML map with
    the launch line that fills it), checked against `model` — or, without one, its model built from the
    shape flags."""
    from gplan.engines.megatron.model_zoo import ZOO_NOTE, zoo_arguments

    args, variables = zoo_arguments(path, text) or arguments(text)
    notes = [variables.pop(ZOO_NOTE)] if ZOO_NOTE in variables else []
    called = called_script(path, text) if "--num-layers" not in args else None
    if called is not None:  # a line that runs a script with positional arguments (Pai-Megatron-Patch's launches)
        script, positional, environment = called
        args, variables = arguments(script.read_text(), positional, environment)
        notes = [f"(read {script.name} as {path.name} calls it, with its {len(positional)} arguments as $1…)"]
    positional = sorted(f for f, vals in args.items() if f in LAYOUT_FLAGS | MODEL_FLAGS.keys()
                        and any(re.search(r"\$\{?\d+\}?", v) for v in vals))
    if called is None and positional:  # a layout flag filled from the script's own arguments
        raise InputError(f"--from {path}: {positional[0]} comes from the script's arguments ($1, ${{10}} …), which the "
                         "file alone does not give", hint=f"pass a file holding the line that runs it, e.g. "
                         f"`sh {path.name} dlc A3B 1 8 …`, beside {path.name}")
    if "--num-layers" not in args and "--tensor-model-parallel-size" not in args:
        raise InputError(f"--from {path}: no Megatron-LM arguments found (no --num-layers, no "
                         "--tensor-model-parallel-size)", hint="pass the script that runs pretrain_gpt.py")
    model = model_of_flags(args, path) if model is None else model
    check_model(args, model, path)
    model = with_capacity(model, value(args, "--moe-expert-capacity-factor"))
    known = MODEL_FLAGS.keys() | LAYOUT_FLAGS | MODEL_SWITCHES | WORLD.keys()
    unread, no_effect = classified(path, {a: v for a, v in args.items() if a not in known}, megatron_class)
    notes += ramp_note(args.get(RAMP))
    given = layout_of(args)
    overlaps = overlaps_of(args, given, path)
    a2a_overlap = "--overlap-moe-expert-parallel-comm" in args or (
        "--combined-1f1b" in args and value(args, "--combined-1f1b-recipe") == "ep_a2a")
    return Launch(source=str(path), engine="megatron", given=given, gbs=integer(args, "--global-batch-size", path),
                  seq_length=optional_int(args, "--seq-length"), precision=precision_of(args),
                  stage_sizes=stage_sizes_of(args, model), recompute_layers=block_layers(args),
                  world_size=world_size(args, variables), unread=unread + notes, no_effect=no_effect, model=model,
                  engine_options={"grad_reduce_in_bf16": "--grad-reduce-in-bf16" in args,
                                  **overlaps,
                                  "fp8_param_gather": "--fp8-param-gather" in args,
                                  "legacy_grouped_gemm": legacy_grouped_gemm(args, model),
                                  "moe_a2a_overlap": a2a_overlap,
                                  "cuda_graphs": cuda_graphs_of(value(args, "--cuda-graph-impl"),
                                                                args.get("--cuda-graph-scope")),
                                  "moe_dispatcher": dispatcher_of(value(args, "--moe-token-dispatcher-type"), model),
                                  **optimizer_states_of("--use-precision-aware-optimizer" in args,
                                                        {flag: value(args, flag) for flag in STATE_DTYPE_FLAGS}, path),
                                  "moe_shared_expert_overlap": model.is_moe and "--moe-shared-expert-overlap" in args,
                                  "moe_pad_to_capacity": model.is_moe and "--moe-pad-expert-input-to-capacity" in args,
                                  **optimizer_offload_of("--optimizer-cpu-offload" in args,
                                                         value(args, "--optimizer-offload-fraction"),
                                                         "--overlap-cpu-optimizer-d2h-h2d" in args)})


RAMP = "--rampup-batch-size"


def ramp_note(values: list[str] | None) -> list[str]:
    """Megatron's batch ramp-up (`--rampup-batch-size START INCREMENT SAMPLES`, microbatches.py
    RampupBatchsizeNumMicroBatchesCalculator): the first SAMPLES samples run batches from START up by INCREMENT, every
    later step the global batch — the steady state gplan prices, said."""
    if not values:
        return []
    start, step, samples = (values + ["?", "?", "?"])[:3]
    return [f"({RAMP} {' '.join(values)}: the first {samples} samples run batches from {start} up by {step}; priced at "
            "--global-batch-size, which every step after them runs)"]


def with_capacity(model: ModelSpec, factor: Any) -> ModelSpec:
    """The model as the launch routes it: with the expert capacity its --moe-expert-capacity-factor sets (tokens over
    it dropped; a negative factor is none, as Megatron-core's TransformerConfig reads it) — a run's choice, not the
    architecture's, so it replaces the model's own."""
    if factor in (None, "None") or not model.is_moe:
        return model
    capacity = float(factor)
    return model.model_copy(update={"capacity_factor": capacity if capacity >= 0 else None})


def optimizer_offload_of(offload: bool, fraction: Any, overlap: bool) -> dict:
    """Megatron's optimizer on the host (TrainingSpec.optimizer_offload, optimizer_offload_overlap): the fraction
    --optimizer-offload-fraction gives (1.0, its default), its copies overlapped with --overlap-cpu-optimizer-d2h-h2d
    (which without the offload does nothing)."""
    if not offload:
        return {}
    share = float(fraction) if fraction not in (None, "None") else 1.0
    return {"optimizer_offload": share, "optimizer_offload_overlap": overlap} if share else {}


#: Megatron-LM's optimizer-state dtype flags (arguments.py: fp32 by default; `fp8` is kept as torch.uint8).
STATE_DTYPE_FLAGS = ("--exp-avg-dtype", "--exp-avg-sq-dtype", "--main-params-dtype", "--main-grads-dtype")
_DTYPE_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "uint8": "fp8", "half": "fp16", "float": "fp32"}


def dtype_name(given: Any) -> str:
    """A dtype as its flag names it (`bf16`), from the flag's value or the `torch.bfloat16` a log prints."""
    name = str(given or "fp32").removeprefix("torch.")
    return _DTYPE_NAMES.get(name, name)


def optimizer_states_of(precision_aware: bool, dtypes: dict[str, Any], path: Path) -> dict:
    """The precision-aware optimizer's options (TrainingSpec.precision_aware_optimizer, adam_moments, master_weights)
    from Megatron's switch and dtype flags. Its main-gradient dtype is read as --grad-reduce-in-bf16 (validate_args:
    a bf16 main gradient turns off the fp32 accumulation, so the gradient buffer is bf16). Both moments are priced in
    one dtype: a launch that keeps them in two is refused."""
    names = {flag: dtype_name(given) for flag, given in dtypes.items()}
    m, v = names["--exp-avg-dtype"], names["--exp-avg-sq-dtype"]
    if m != v:
        raise InputError(f"--from {path}: --exp-avg-dtype {m} and --exp-avg-sq-dtype {v} keep Adam's moments in two "
                         "dtypes; gplan prices both in one", hint="price it with both at the larger, e.g. --adam-moments "
                         f"{max((m, v), key=lambda d: STATE_DTYPE_BYTES.get(d, 4))}")
    if not precision_aware and any(name != "fp32" for name in names.values()):
        flag = next(f for f, name in names.items() if name != "fp32")
        # Megatron-core's OptimizerConfig: "... can only be fp32 when not using precision-aware optimizer"
        raise InputError(f"--from {path}: {flag} {names[flag]} without --use-precision-aware-optimizer — Megatron "
                         "refuses it (its dtype flags need that optimizer)", hint="add --use-precision-aware-optimizer")
    if not precision_aware:
        return {}
    bf16_grads = {"grad_reduce_in_bf16": True} if names["--main-grads-dtype"] == "bf16" else {}
    return {"precision_aware_optimizer": True, "adam_moments": m, "master_weights": names["--main-params-dtype"],
            **bf16_grads}



def legacy_grouped_gemm(args: dict, model: ModelSpec) -> bool:
    """Whether Megatron-core builds its legacy GroupedMLP (grouped_gemm's one kernel for all local experts):
    asked for (`--moe-use-legacy-grouped-gemm`), or the grouped GEMM of its local layers (`--transformer-impl local`
    with `--moe-grouped-gemm`; core's get_gpt_layer_local_spec)."""
    local = value(args, "--transformer-impl") == "local" and "--moe-grouped-gemm" in args
    return model.is_moe and ("--moe-use-legacy-grouped-gemm" in args or local)


def model_of_flags(args: dict, path: Path) -> ModelSpec:
    """The model a Megatron launch states with its shape flags: the bundled model of that shape when there is
    one (its vocabulary, norms and rope named there), else built from the flags (engines.megatron.logs's
    reading of Megatron's arguments), its vocabulary from --vocab-size or the tokenizer it names."""
    shape = {flag: optional_int(args, flag) for flag in MODEL_FLAGS if flag != "--window-attn-skip-freq"}
    for flag in ("--num-layers", "--hidden-size", "--num-attention-heads"):
        if shape[flag] is None:
            raise InputError(f"--from {path}: no MODEL given and the launch does not state {flag}",
                             hint="name the model the launch trains: gplan estimate MODEL --from FILE")
    logged: dict[str, Any] = {}
    for flag, values in args.items():
        key = flag[2:].replace("-", "_")
        logged[key] = True if not values else (number(values[0]) if len(values) == 1 else values)
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
        return logs.model_from_args(logged, path.stem)
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
                          "moonshotai/kimi-k2": 163840, "unsloth/deepseek-v3": 129280}
"""Vocabularies of the Hugging Face tokenizers Megatron launches name (`--tokenizer-model`), by repository
prefix: each model family's config.json `vocab_size` (the same sources as the bundled models; Kimi K2:
moonshotai/Kimi-K2-Instruct config.json; unsloth/DeepSeek-V3, which the MoE model zoo's DeepSeek-V3 config
names, re-hosts deepseek-ai/DeepSeek-V3's files)."""



def tokenizer_vocab(named: str | None) -> int | None:
    if not named:
        return None
    lowered = named.lower()
    return next((v for prefix, v in TOKENIZER_VOCABULARIES.items() if lowered.startswith(prefix)), None)



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
    known = sorted(ENGINE.capabilities.moe_dispatcher, key=get_args(MoeDispatcher).index)
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
    # Megatron's validate_args: "Disabling sequence parallelism because tensor model parallelism is disabled"
    given["sp"] = given["sp"] and given["tp"] > 1
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



def overlaps_of(args: dict, given: dict, path: Path) -> dict[str, bool]:
    """TrainingSpec's overlaps as Megatron-LM's validate_args leaves them: each switch off unless passed, but
    Megatron-FSDP's sharded strategies turn the gradient reduction's on (optim_grads) and the parameter gather's too
    (optim_grads_params); the combinations it asserts against refused (exit 3), naming its rule."""
    said = {key: f"--{flag.replace('_', '-')}" in args for key, flag in OVERLAP_SWITCHES.items()}
    zero = zero_of(args)
    reduced, gathered = sharded_overlaps(ENGINE.capabilities, zero)  # Megatron-FSDP's (zero 2 and 3)
    said["grad_reduce_overlap"] |= reduced
    said["param_gather_overlap"] |= gathered
    rule = None
    # at tp 1 it has nothing to overlap (the model zoo's bf16 launches pass it at tp 1 and ran): only tp > 1 is checked
    if said["tp_comm_overlap"] and given["tp"] > 1 and not given["sp"]:
        rule = ("--tp-comm-overlap", "Tensor parallel communication/GEMM overlap can happen only when sequence "
                "parallelism is enabled", "add --sequence-parallel")
    elif said["param_gather_overlap"] and not said["grad_reduce_overlap"]:
        rule = ("--overlap-param-gather", "Must use --overlap-param-gather with --overlap-grad-reduce",
                "add --overlap-grad-reduce")
    elif said["param_gather_overlap"] and zero == 0:
        rule = ("--overlap-param-gather", "--overlap-param-gather only supported with distributed optimizer or "
                "megatron fsdp", "add --use-distributed-optimizer")
    if rule is not None:
        raise InputError(f"--from {path}: {rule[0]} — Megatron-LM's validate_args refuses it: '{rule[1]}'",
                         hint=f"{rule[2]}, or leave {rule[0]} out")
    return said


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


# ---- the reader's part (planner.launch_files) ---------------------------------------------------------

READS = "Megatron-LM scripts, argument files and YAML maps"

FROM_READS = (
    "a launch script or argument file (`pretrain_gpt.py`: Megatron-LM, NeMo, Megatron-Bridge), a line that runs "
    "one with its settings as arguments (Pai-Megatron-Patch's `sh run_mcore_qwen3.sh dlc A3B …`), or its log")
"""What `--from` reads (docs/bring-your-own-runs.md's table, from bench/engine_tables.py)."""
CALIBRATE_READS = (
    "its log: the arguments block (and the padded-vocabulary line), iteration and memory lines")
"""What `gplan calibrate` reads (— : nothing)."""
"""What this reader takes, as gplan says when a file is no launch it reads."""
PRECEDENCE = 9
"""Asked last: a script or argument list no other reader claims is Megatron-LM's."""


def claims(path: Path, text: str) -> bool:
    """A shell script or argument file, or the MoE model zoo's YAML map (MODEL_ARGS)."""
    if path.suffix in (".py", ".json"):
        return False
    return path.suffix not in (".yaml", ".yml") or bool(re.search(r"^MODEL_ARGS\s*:", text, re.MULTILINE))


def read(path: Path, model: ModelSpec | None, text: str) -> Launch:
    return read_megatron_launch(path, model, text)


def read_log(path: Path, model: ModelSpec | None, text: str, strict: bool = False) -> Launch:
    """A Megatron-LM or Megatron-DeepSpeed log as a launch, with its steady step; `strict` (calibrate): a log
    with no steady step is refused, not read without one."""
    launch = megatron_log_launch(logs.arguments_block(text, path), path, model)
    return with_speed(launch, lambda: {"measured_step_s": logs.read_megatron_log(path).step_s}, strict)
