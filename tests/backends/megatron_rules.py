"""The rules of Megatron-LM's `megatron/training/arguments.py` that gplan's Megatron export depends on.

Megatron-LM's argument parser is not on the package index (only megatron-core is, without
`megatron/training`), so the parts the export uses are written down here from the file as it stands on
NVIDIA/Megatron-LM main at commit 000c4ac (2026): the argument definitions gplan emits, with their
types and choices, and the checks of `validate_args` and of the vocabulary padding. Each check quotes
the assertion message it mirrors so that it can be found in that file; a change there shows up as a
difference in wording. Line numbers are not cited: the stored copy of the file is read by offset.
"""

from __future__ import annotations

import argparse
import math

# ---- the arguments gplan emits: name -> (type, choices); None type = store_true switch ---------------
ARGUMENTS: dict[str, tuple[object, tuple | None]] = {
    # _add_network_size_args
    "--num-layers": (int, None), "--hidden-size": (int, None), "--ffn-hidden-size": (int, None),
    "--num-attention-heads": (int, None), "--kv-channels": (int, None), "--group-query-attention": (None, None),
    "--window-size": (lambda x: tuple(int(i) for i in x.strip("()").split(",")), None),  # tuple_type
    "--num-query-groups": (int, None), "--max-position-embeddings": (int, None),
    "--position-embedding-type": (str, ("learned_absolute", "rope", "mrope", "relative", "none")),
    "--rotary-base": (int, None), "--make-vocab-size-divisible-by": (int, None),
    "--normalization": (str, ("LayerNorm", "RMSNorm")), "--swiglu": (None, None),
    "--window-attn-skip-freq": (str, None),  # moe_freq_type
    "--softmax-type": (str, ("learnable", "vanilla", "off-by-one")),
    "--quick-geglu": (None, None), "--activation-func-clamp-value": (float, None), "--glu-linear-offset": (float, None),
    "--untie-embeddings-and-output-weights": (None, None),
    # _add_regularization_args
    "--attention-dropout": (float, None), "--hidden-dropout": (float, None),
    # _add_training_args
    "--micro-batch-size": (int, None), "--global-batch-size": (int, None),
    "--recompute-granularity": (str, ("full", "selective")), "--recompute-method": (str, ("uniform", "block")),
    "--recompute-num-layers": (int, None), "--train-iters": (int, None), "--log-interval": (int, None),
    "--disable-bias-linear": (None, None), "--add-qkv-bias": (None, None), "--sequence-parallel": (None, None),
    "--tp-comm-overlap": (None, None),
    "--cpu-offloading": (None, None), "--cpu-offloading-num-layers": (int, None),
    "--recompute-modules": (str, ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")),
    # _add_learning_rate_args, _add_mixed_precision_args
    "--lr": (float, None), "--bf16": (None, None), "--fp16": (None, None), "--grad-reduce-in-bf16": (None, None),
    "--use-precision-aware-optimizer": (None, None), "--main-grads-dtype": (str, ("fp32", "bf16")),
    "--main-params-dtype": (str, ("fp32", "fp16")), "--exp-avg-dtype": (str, ("fp32", "fp16", "bf16", "fp8")),
    "--exp-avg-sq-dtype": (str, ("fp32", "fp16", "bf16", "fp8")), "--optimizer-cpu-offload": (None, None),
    "--optimizer-offload-fraction": (float, None), "--overlap-cpu-optimizer-d2h-h2d": (None, None),
    # _add_distributed_args
    "--tensor-model-parallel-size": (int, None), "--pipeline-model-parallel-size": (int, None),
    "--decoder-first-pipeline-num-layers": (int, None), "--decoder-last-pipeline-num-layers": (int, None),
    "--pipeline-model-parallel-layout": (str, None), "--num-layers-per-virtual-pipeline-stage": (int, None),
    "--use-distributed-optimizer": (None, None), "--use-megatron-fsdp": (None, None),
    "--data-parallel-sharding-strategy": (str, ("no_shard", "optim", "optim_grads", "optim_grads_params")),
    "--context-parallel-size": (int, None), "--overlap-grad-reduce": (None, None),
    "--overlap-param-gather": (None, None),
    # _add_transformer_engine_args
    "--fp8-format": (str, ("e4m3", "hybrid")), "--fp8-recipe": (str, ("tensorwise", "delayed", "mxfp8", "blockwise", "custom")),
    "--fp4-format": (str, ("e2m1",)), "--fp4-recipe": (str, ("nvfp4", "custom")), "--fp8-param-gather": (None, None),
    # _add_checkpointing_args
    "--ckpt-format": (str, ("torch", "torch_dist", "zarr", "torch_dcp", "fsdp_dtensor")),
    # _add_moe_args
    "--num-experts": (int, None), "--moe-router-topk": (int, None), "--moe-ffn-hidden-size": (int, None),
    "--moe-shared-expert-intermediate-size": (int, None), "--moe-layer-freq": (str, None),  # moe_freq_type
    "--moe-grouped-gemm": (None, None), "--moe-use-legacy-grouped-gemm": (None, None),
    "--moe-token-dispatcher-type": (str, ("allgather", "alltoall", "flex")), "--moe-enable-deepep": (None, None),
    "--moe-router-score-function": (str, ("softmax", "sigmoid")), "--moe-router-enable-expert-bias": (None, None),
    "--moe-expert-capacity-factor": (float, None), "--moe-token-drop-policy": (str, ("probs", "position")),
    "--expert-model-parallel-size": (int, None), "--expert-tensor-parallel-size": (int, None),
    "--moe-router-num-groups": (int, None), "--moe-router-group-topk": (int, None),
    "--moe-router-topk-scaling-factor": (float, None), "--mtp-num-layers": (int, None),
    "--overlap-moe-expert-parallel-comm": (None, None), "--moe-shared-expert-overlap": (None, None),
    "--moe-pad-expert-input-to-capacity": (None, None),
    # _add_inference_args (CUDA graphs) and _add_logging_args (its store_false switch, as a store_true here)
    "--cuda-graph-impl": (str, ("none", "local", "transformer_engine")),
    "--cuda-graph-scope": (str, ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba", "full_iteration")),
    "--no-check-for-nan-in-loss-and-grad": (None, None),
    # _add_network_size_args (MLA) and the QK norm
    "--multi-latent-attention": (None, None), "--q-lora-rank": (int, None), "--kv-lora-rank": (int, None),
    "--qk-head-dim": (int, None), "--qk-pos-emb-head-dim": (int, None), "--v-head-dim": (int, None),
    "--qk-layernorm": (None, None),
    # _add_data_args, _add_tokenizer_args
    "--mock-data": (None, None), "--tokenizer-type": (str, None), "--vocab-size": (int, None),
    "--seq-length": (int, None),
}

DEFAULTS = {"pipeline_model_parallel_size": 1, "tensor_model_parallel_size": 1, "context_parallel_size": 1,
            "make_vocab_size_divisible_by": 128, "rotary_base": 10000,
            "data_parallel_sharding_strategy": "no_shard", "ckpt_format": "torch_dist", "num_query_groups": 1,
            "expert_model_parallel_size": 1, "moe_layer_freq": "1", "main_grads_dtype": "fp32",
            "main_params_dtype": "fp32", "exp_avg_dtype": "fp32", "exp_avg_sq_dtype": "fp32",
            "optimizer_offload_fraction": 1.0, "fp8_recipe": "delayed"}
"""Defaults of the arguments above that the rules read (their add_argument defaults)."""


NARGS_STAR = ("--recompute-modules", "--cuda-graph-scope")
"""Arguments defined with nargs='*' or '+' (a list of values)."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)  # Megatron's parse_args: allow_abbrev=False
    for flag, (kind, choices) in ARGUMENTS.items():
        if kind is None:
            p.add_argument(flag, action="store_true")
        elif flag in NARGS_STAR:
            p.add_argument(flag, type=kind, nargs="*", choices=choices)
        else:
            p.add_argument(flag, type=kind, choices=choices)
    p.set_defaults(**DEFAULTS)
    return p


class Violation(AssertionError):
    pass


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise Violation(message)


def padded_vocab_size(args: argparse.Namespace) -> int:
    """`_vocab_size_with_padding` (megatron/training/tokenizer): the tokenizer's vocabulary padded to a
    multiple of make_vocab_size_divisible_by × tp; NullTokenizer's vocabulary is --vocab-size + 1 (its
    `vocab_size` property returns `_vocab_size_without_eod + 1`)."""
    size = args.vocab_size + 1 if args.tokenizer_type == "NullTokenizer" else args.vocab_size
    multiple = args.make_vocab_size_divisible_by * args.tensor_model_parallel_size
    return math.ceil(size / multiple) * multiple


def validate(argv: list[str], world_size: int, env: dict[str, str], device_arch: int) -> argparse.Namespace:
    """Parse `argv` as Megatron does and apply the checks of validate_args the export relies on; raise
    Violation with Megatron's message when one fails. `device_arch` is get_device_arch_version()
    (9 Hopper, 10 Blackwell)."""
    a = parser().parse_args(argv)
    tp, pp, cp = a.tensor_model_parallel_size, a.pipeline_model_parallel_size, a.context_parallel_size
    _check(world_size % (tp * pp * cp) == 0,
           "world size ({world_size}) is not divisible by total_model_size ({total_model_size=})")
    dp = world_size // (tp * pp * cp)
    # "Uneven virtual pipeline parallelism"
    _check(sum(x is not None for x in (a.num_layers_per_virtual_pipeline_stage, a.pipeline_model_parallel_layout)) <= 1,
           "No more than one of the following arguments can be set at the same time: "
           "--num-layers-per-virtual-pipeline-stage, --num-virtual-stages-per-pipeline-rank,"
           "--pipeline-model-parallel-layout.")
    vpp = None
    if a.pipeline_model_parallel_layout is not None:
        stages = a.pipeline_model_parallel_layout.count("|") + 1
        _check(stages % pp == 0, "The length of pipeline_model_parallel_layout must be divisible by "
                                 "pipeline_model_parallel_size")
        vpp = stages // pp if stages // pp > 1 else None
    elif a.num_layers_per_virtual_pipeline_stage is not None:
        _check(a.decoder_first_pipeline_num_layers is None and a.decoder_last_pipeline_num_layers is None,
               "please use --num-virtual-stages-per-pipeline-rank to specify virtual pipeline parallel degree "
               "when enable uneven pipeline parallelism")
        _check(a.num_layers % pp == 0, "number of layers of the model must be divisible pipeline model parallel size")
        _check((a.num_layers // pp) % a.num_layers_per_virtual_pipeline_stage == 0,
               "number of layers per pipeline stage must be divisible number of layers per virtual pipeline stage")
        vpp = (a.num_layers // pp) // a.num_layers_per_virtual_pipeline_stage
        vpp = vpp if vpp > 1 else None
    elif a.decoder_first_pipeline_num_layers is None and a.decoder_last_pipeline_num_layers is None:
        _check(a.num_layers % pp == 0, "Number of layers should be divisible by the pipeline-model-parallel size")
    # overlap_p2p_comm defaults to True (--no-overlap-p2p-communication is store_false), so interleaving
    # needs pp > 1 only: "When interleaved schedule is used, pipeline-model-parallel size should be greater than 1".
    if vpp is not None:
        _check(pp > 1, "When interleaved schedule is used, pipeline-model-parallel size should be greater than 1")
    if a.overlap_param_gather:
        _check(a.use_distributed_optimizer or a.use_megatron_fsdp,
               "--overlap-param-gather only supported with distributed optimizer or megatron fsdp")
        _check(a.overlap_grad_reduce, "Must use --overlap-param-gather with --overlap-grad-reduce")
    # validate_args turns sequence parallelism off at tp = 1 before this check
    if a.tp_comm_overlap:
        _check(a.sequence_parallel and tp > 1, "Tensor parallel communication/GEMM overlap can happen only when "
                                               "sequence parallelism is enabled")
    if a.use_megatron_fsdp:
        _check(env.get("CUDA_DEVICE_MAX_CONNECTIONS") != "1",
               "FSDP always requires CUDA_DEVICE_MAX_CONNECTIONS value large than one")
        _check(a.ckpt_format == "fsdp_dtensor", "Megatron FSDP only supports fsdp_dtensor checkpoint format")
    if a.ckpt_format == "fsdp_dtensor":
        _check(a.use_megatron_fsdp, "--ckpt-format fsdp_dtensor is only tested with Megatron FSDP.")
    if a.cpu_offloading:  # megatron/core/transformer/transformer_config.py, TransformerConfig.__post_init__
        _check(pp == 1, "Currently there is no support for Pipeline parallelism with CPU offloading")
        _check(a.recompute_granularity is None, "CPU offloading does not work when activation recomputation is enabled")
        _check(0 <= a.cpu_offloading_num_layers < a.num_layers,
               f"CPU offloading can be done only for layers less than {a.num_layers}")
    _check(not (a.fp16 and a.bf16), "assert not args.bf16 (fp16 and bf16 are exclusive)")
    # core_transformer_config_from_args: `elif args.quick_geglu: assert not args.swiglu`
    _check(not (a.quick_geglu and a.swiglu), "assert not args.swiglu (quick_geglu is its own gated unit)")
    _check(not (a.fp4_format and a.fp8_format), "--fp4-format and --fp8-format cannot be used simultaneously. "
           "Please choose one.")
    if cp > 1:
        _check(a.seq_length % (cp * 2) == 0,
               "seq-length should be a multiple of 2 * context-parallel-size if context-parallel-size > 1.")
    _check(a.max_position_embeddings >= a.seq_length,
           f"max_position_embeddings ({a.max_position_embeddings}) must be greater than or equal to seq_length "
           f"({a.seq_length}).")
    if a.recompute_granularity == "selective":
        _check(a.recompute_method is None, "recompute method is not yet supported for selective recomputing granularity")
        # megatron/core/transformer/transformer_config.py, TransformerConfig.__post_init__ (the modules' checks)
        modules = a.recompute_modules if a.recompute_modules is not None else ["core_attn"]
        _check(not ("moe_act" in modules and not a.moe_grouped_gemm),
               "moe_act in recompute_modules is only supported with moe_grouped_gemm.")
        _check(not ("mla_up_proj" in modules and not a.multi_latent_attention),
               "mla_up_proj in recompute_modules is only supported with multi_latent_attention.")
    if (tp > 1 or cp > 1) and device_arch < 10 and not a.use_megatron_fsdp:
        _check(env.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1",
               "Using tensor model parallelism or context parallelism require setting the environment variable "
               "CUDA_DEVICE_MAX_CONNECTIONS to 1")
    _check(int(a.mock_data) <= 1, "A single data source must be provided in training mode, else None")
    _validate_experts(a, world_size)
    _validate_moe_overlap(a, pp, vpp)
    _validate_dispatcher(a)
    _validate_cuda_graphs(a)
    _validate_optimizer_dtypes(a)
    _validate_shared_expert_overlap(a)
    _validate_capacity(a)
    # megatron/core/num_microbatches_calculator.py (ConstantNumMicroBatchesCalculator):
    _check(a.global_batch_size % (a.micro_batch_size * dp) == 0,
           "global batch size ({}) is not divisible by micro batch size ({}) times data parallel size ({})")
    a.data_parallel_size, a.virtual_pipeline_model_parallel_size = dp, vpp
    return a


def _validate_optimizer_dtypes(a: argparse.Namespace) -> None:
    """megatron/core/optimizer/optimizer_config.py, OptimizerConfig.__post_init__ (the optimizer is Adam by default)."""
    if a.optimizer_cpu_offload:  # validate_args, "Optimizer CPU offload check"
        _check(a.use_precision_aware_optimizer, "The optimizer cpu offload must be used in conjunction with "
                                                "`--use-precision-aware-optimizer`")
        _check(not a.fp8_param_gather or a.fp8_recipe == "delayed", "When `--fp8-param-gather` is enabled, the "
               "optimizer cpu offload must be used in conjunction with `--fp8-recipe delayed`.")
    if a.use_precision_aware_optimizer:
        _check(a.use_distributed_optimizer, "--use-precision-aware-optimizer only supported with distributed optimizer")
        return
    for name in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
        _check(getattr(a, name) == "fp32", f"{name} can only be fp32 when not using precision-aware optimizer")


def _validate_capacity(a: argparse.Namespace) -> None:
    """megatron/core/transformer/transformer_config.py, TransformerConfig.__post_init__ on the expert capacity."""
    if a.moe_pad_expert_input_to_capacity:
        _check(a.moe_expert_capacity_factor is not None,
               "moe_expert_capacity_factor must be set to use moe_pad_expert_input_to_capacity")
        _check(not (a.moe_token_dispatcher_type == "flex" and a.moe_enable_deepep),
               "Flex token dispatcher with deepep backend does not support moe_pad_expert_input_to_capacity")


def _validate_shared_expert_overlap(a: argparse.Namespace) -> None:
    """megatron/core/transformer/transformer_config.py, TransformerConfig.__post_init__ on `moe_shared_expert_overlap`."""
    if not a.moe_shared_expert_overlap:
        return
    _check(a.moe_token_dispatcher_type == "alltoall", "moe_shared_expert_overlap only works with alltoall token dispatcher.")
    _check(not a.overlap_moe_expert_parallel_comm,
           "disable moe_shared_expert_overlap when enabling overlap_moe_expert_parallel_comm")
    _check(a.recompute_modules is None or "shared_experts" not in a.recompute_modules,
           "shared_experts recompute cannot work with --moe-shared-expert-overlap.")


def _validate_dispatcher(a: argparse.Namespace) -> None:
    """megatron/core/transformer/transformer_config.py, TransformerConfig.__post_init__ on `moe_enable_deepep`
    (--moe-enable-deepep: "Only works with flex token dispatcher", its help in arguments.py)."""
    if a.moe_enable_deepep:
        _check(a.moe_token_dispatcher_type == "flex", "DeepEP backend is only supported with flex token dispatcher.")


def _validate_moe_overlap(a: argparse.Namespace, pp: int, vpp: int | None) -> None:
    """megatron/core/transformer/transformer_config.py, TransformerConfig.__post_init__ on
    `overlap_moe_expert_parallel_comm`."""
    if not a.overlap_moe_expert_parallel_comm:
        return
    if pp > 1:
        _check(vpp is not None, "If enabling EP A2A overlap, virtual_pipeline_model_parallel_size must be specified "
                                "when pipeline_model_parallel_size > 1")
    _check(a.expert_model_parallel_size > 1,
           "overlap_moe_expert_parallel_comm is only supported with expert model parallelism")
    _check(a.moe_token_dispatcher_type in ("alltoall", "flex"),
           "overlap_moe_expert_parallel_comm is supported with alltoall/flex token dispatcher")
    _check(a.recompute_granularity != "full", "disable full recomputation when enabling overlap_moe_expert_parallel_comm")
    _check(a.recompute_method is None, "disable recomputation method when enabling overlap_moe_expert_parallel_comm")
    _check(a.recompute_modules is None or "moe" not in a.recompute_modules,
           "disable moe in recompute_modules when enabling overlap_moe_expert_parallel_comm")
    _check(a.bf16 or a.fp16, "overlap_moe_expert_parallel_comm is only supported with bf16 or fp16 model")


def _validate_cuda_graphs(a: argparse.Namespace) -> None:
    """The --cuda-graph-scope help ("full_iteration scope is only supported with --cuda-graph-impl=local,
    other scopes are only supported with --cuda-graph-impl=transformer_engine"; "moe_preprocess … Must be
    used together with moe_router") and validate_args ("--no-check-for-nan-in-loss-and-grad should be set
    with full_iteration CUDA graph")."""
    scopes = a.cuda_graph_scope or []
    if "full_iteration" in scopes:
        _check(a.cuda_graph_impl == "local", "full_iteration cuda graph is not supported for "
                                             "cuda_graph_impl=transformer_engine. Please use cuda_graph_impl=local instead.")
        _check(a.no_check_for_nan_in_loss_and_grad,
               "--no-check-for-nan-in-loss-and-grad should be set with full_iteration CUDA graph")
    elif scopes:
        _check(a.cuda_graph_impl == "transformer_engine", "other scopes are only supported with "
                                                          "--cuda-graph-impl=transformer_engine")
    if "moe_preprocess" in scopes:
        _check("moe_router" in scopes, "moe_preprocess must be used together with moe_router")


def moe_layer_pattern(a: argparse.Namespace) -> list[int]:
    """`moe_freq_type`: an int N (one MoE layer every N) or a Python list expression such as
    "([0]*3+[1]*58)"; Megatron asserts the pattern's length equals num_layers."""
    text = str(a.moe_layer_freq)
    if text.lstrip("-").isdigit():
        n = int(text)
        return [1 if i % n == 0 else 0 for i in range(a.num_layers)]
    pattern = eval(text, {"__builtins__": {}})  # the expression Megatron itself evaluates
    _check(len(pattern) == a.num_layers, f"Invalid length of moe_layer_pattern: {len(pattern)}, expected "
                                         f"{a.num_layers}, current moe layer pattern: {text}")
    return pattern


def _validate_experts(a: argparse.Namespace, world_size: int) -> None:
    """validate_args' expert checks, and the expert grid of initialize_model_parallel."""
    tp, pp, cp = a.tensor_model_parallel_size, a.pipeline_model_parallel_size, a.context_parallel_size
    ep = a.expert_model_parallel_size
    etp = a.expert_tensor_parallel_size if a.expert_tensor_parallel_size is not None else tp
    if ep > 1:
        _check(a.num_experts is not None, "num_experts must be non None to use expert model parallelism")
        _check(a.num_experts % ep == 0, "Number of experts should be a multiple of expert model parallel_size.")
        _check(not a.fp16, "Expert parallelism is not supported with fp16 training.")
    if a.num_experts is not None and tp > 1:
        _check(a.sequence_parallel, "When using MoE and tensor parallelism, sequence parallelism must be used.")
    if a.num_experts is not None:
        moe_layer_pattern(a)
    # parallel_state.initialize_model_parallel: the expert grid etp·ep·edp·pp over the world
    _check(world_size % (etp * ep * pp) == 0,
           f"world_size ({world_size}) is not divisible by expert_tensor_model_pipeline_parallel size "
           f"({etp * ep * pp})")
    a.expert_tensor_parallel_size = etp
    a.expert_data_parallel_size = world_size // (etp * ep * pp)
    del cp


def recompute_per_stage(a: argparse.Namespace, stage_layers: list[int]) -> list[dict[str, int]]:
    """What Megatron recomputes on each pipeline rank (TransformerBlock._checkpointed_forward): `block`
    recomputes the first recompute_num_layers layers of every model chunk fully; `selective` recomputes
    the core attention of every layer."""
    vpp = a.virtual_pipeline_model_parallel_size or 1
    out = []
    for layers in stage_layers:
        if a.recompute_granularity == "full" and a.recompute_method == "block":
            per_chunk = layers // vpp
            full = min(per_chunk, a.recompute_num_layers) * vpp
            out.append({"full": full, "selective": 0, "none": layers - full})
        elif a.recompute_granularity == "selective":
            out.append({"full": 0, "selective": layers, "none": 0})
        else:
            out.append({"full": 0, "selective": 0, "none": layers})
    return out
