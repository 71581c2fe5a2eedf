"""What each engine flag a launch sets means to gplan: read and priced, read with no effect on the layout or
its cost (said so), or refused because gplan cannot price it (named).

A flag at its engine's default is never refused: it changes nothing. The defaults are the engines' own —
Megatron-LM's `megatron/training/arguments.py` (NVIDIA/Megatron-LM main at 000c4ac, 2026; the `default=` of
each `add_argument`, store_true switches default off) and torchtitan's job config
(`torchtitan/config/job_config.py`, the dataclass field defaults of Parallelism and ActivationCheckpoint,
torchtitan ≤ 0.2 whose launches are TOMLs). The launch readers (planner.launch_files) hold the flags they
read; this module holds the rest.
"""

from __future__ import annotations

import re
from typing import Any

# ---- Megatron-LM -----------------------------------------------------------------------------------

#: Flags read without an effect on the layout or its cost, with the reason said beside the prediction.
MEGATRON_NO_EFFECT = {
    # kernel fusions and numerics of the router: inside the per-layer efficiency gplan calibrates
    "--moe-permute-fusion": "a fused permutation kernel (in the calibrated MoE efficiency)",
    "--moe-router-fusion": "a fused router kernel (in the calibrated MoE efficiency)",
    "--moe-router-dtype": "the router's softmax precision (a [tokens, experts] tensor)",
    "--moe-aux-loss-coeff": "a loss weight", "--moe-z-loss-coeff": "a loss weight",
    "--moe-router-load-balancing-type": "the balancing loss (the imbalance priced is --expert-imbalance)",
    "--moe-router-pre-softmax": "the router's score order", "--moe-router-bias-update-rate": "a router update rate",
    "--moe-router-padding-for-fp8": "pads routed tokens to the fp8 tile (at most 15 tokens per expert)",
    "--moe-router-padding-for-quantization": "pads routed tokens to the quantization tile",
    "--moe-router-force-load-balancing": "routing forced balanced (priced at --expert-imbalance, 1.0 unless given)",
    "--moe-per-layer-logging": "logging", "--moe-input-jitter-eps": "router noise",
    "--moe-hybridep-num-sms": "HybridEP's SM count (its dispatcher is read as flex)",
    "--moe-deepep-num-sms": "DeepEP's SM count (its dispatcher is read as flex)",
    "--delay-wgrad-compute": "part of the expert all-to-all overlap (read with --overlap-moe-expert-parallel-comm)",
    "--combined-1f1b-recipe": "read with --combined-1f1b",
    "--distributed-timeout-minutes": "a timeout",
    "--no-create-attention-mask-in-dataloader": "data loading",
    "--cross-entropy-loss-fusion": "a fused loss kernel", "--cross-entropy-fusion-impl": "a fused loss kernel",
    "--use-mcore-models": "the default model implementation", "--use-flash-attn": "the attention kernel "
    "gplan prices", "--transformer-impl": "Transformer Engine, the implementation gplan prices",
    "--enable-experimental": "unlocks flags that are classified on their own",
    "--manual-gc": "Python garbage collection", "--manual-gc-interval": "Python garbage collection",
    "--use-precision-aware-optimizer": "the optimizer's dtypes are their own flags",
    "--main-grads-dtype": "read at fp32 (the default)", "--main-params-dtype": "read at fp32 (the default)",
    "--use-separate-send-recv-groups": "pipeline send/receive on separate groups (same bytes)",
    "--attention-backend": "the attention kernel", "--no-rope-fusion": "a fused kernel",
    "--no-gradient-accumulation-fusion": "a fused kernel", "--no-bias-swiglu-fusion": "a fused kernel",
    "--overlap-p2p-communication": "Megatron's default", "--no-overlap-p2p-communication": "pipeline sends "
    "are priced unoverlapped either way",
}
"""Flags not listed here nor read by the launch reader are data, tokenizer, checkpoint, learning-rate,
logging or evaluation settings: listed as not read, never refused — unless they look like they change the
layout (`MEGATRON_LAYOUT_LIKE`) and are not at their default."""

#: Megatron-LM's defaults of flags whose value decides whether they change anything (arguments.py; a
#: store_true switch is False, so setting it is a change).
MEGATRON_DEFAULTS: dict[str, Any] = {
    "--num-virtual-stages-per-pipeline-rank": None, "--expert-tensor-parallel-size": None,
    "--moe-expert-capacity-factor": None, "--moe-pad-expert-input-to-capacity": False,
    "--moe-token-drop-policy": "probs", "--moe-layer-recompute": False, "--moe-extended-tp": False,
    "--moe-shared-expert-overlap": False, "--moe-use-legacy-grouped-gemm": False, "--moe-use-upcycling": False,
    "--exp-avg-dtype": "fp32", "--exp-avg-sq-dtype": "fp32", "--main-grads-dtype": "fp32",
    "--main-params-dtype": "fp32", "--optimizer-cpu-offload": False, "--fine-grained-activation-offloading": False,
    "--empty-unused-memory-level": 0, "--pipeline-model-parallel-comm-backend": None,
    "--decoder-first-pipeline-num-layers": None, "--decoder-last-pipeline-num-layers": None,
    "--recompute-num-layers": None, "--context-parallel-size": 1, "--tensor-model-parallel-size": 1,
    "--pipeline-model-parallel-size": 1, "--expert-model-parallel-size": 1, "--hierarchical-context-parallel-sizes": None,
    "--cp-comm-type": "p2p", "--microbatch-group-size-per-virtual-pipeline-stage": None,
    "--overlap-param-gather-with-optimizer-step": False, "--align-grad-reduce": True, "--align-param-gather": False,
}
#: Flags gplan cannot price when set away from their default (a change to memory or time it has no term for).
MEGATRON_NOT_PRICED = {
    "--exp-avg-dtype": "Adam moments in another dtype", "--exp-avg-sq-dtype": "Adam moments in another dtype",
    "--main-grads-dtype": "main gradients in another dtype", "--main-params-dtype": "main weights in another dtype",
    "--optimizer-cpu-offload": "the optimizer on the host", "--fine-grained-activation-offloading":
    "per-module activation offloading", "--offload-modules": "per-module activation offloading",
    "--moe-shared-expert-overlap": "the shared expert overlapped with the dispatch",
    "--moe-expert-capacity-factor": "token dropping at a capacity", "--moe-pad-expert-input-to-capacity":
    "experts padded to their capacity",
}
MEGATRON_LAYOUT_LIKE = re.compile(r"parallel|pipeline|recompute|checkpoint-activations|batch|expert|fsdp|offload|"
                                  r"zero|overlap|fp8|fp4|moe|mtp|cuda-graph|num-layers|seq-length|hidden|heads")
"""A flag gplan does not read that matches this could change the layout or its cost: refused unless at
its default."""


def megatron_class(flag: str, values: list[str]) -> tuple[str, str]:
    """("no effect", why) or ("refused", why) for a Megatron flag the launch reader does not read."""
    if flag in MEGATRON_DEFAULTS and at_default(values, MEGATRON_DEFAULTS[flag]):
        return "no effect", "at Megatron's default"
    if flag in MEGATRON_NOT_PRICED:
        return "refused", MEGATRON_NOT_PRICED[flag]
    if flag in MEGATRON_NO_EFFECT:
        return "no effect", MEGATRON_NO_EFFECT[flag]
    if MEGATRON_LAYOUT_LIKE.search(flag):
        return "refused", "would change the layout or its cost"
    return "no effect", "not a layout setting"


def at_default(values: list[str] | Any, default: Any) -> bool:
    """Whether a flag's values (a store_true switch has none: True) equal its default."""
    if isinstance(values, list):
        given: Any = True if not values else (values[0] if len(values) == 1 else values)
    else:
        given = values
    if isinstance(default, bool) or default is None:
        if default is None:
            return given in (None, "None", "none", "null")
        return str(given).lower() in (("true", "1") if default else ("false", "0"))
    try:
        return float(given) == float(default)
    except (TypeError, ValueError):
        return str(given) == str(default)


# ---- torchtitan ------------------------------------------------------------------------------------

#: torchtitan's job-config defaults of the keys gplan does not read (torchtitan/config/job_config.py).
TITAN_DEFAULTS: dict[str, Any] = {
    "parallelism.disable_loss_parallel": False, "parallelism.enable_async_tensor_parallel": False,
    "parallelism.enable_compiled_autograd": False, "parallelism.pipeline_parallel_first_stage_less_layers": 1,
    "parallelism.pipeline_parallel_last_stage_less_layers": 1, "parallelism.pipeline_parallel_schedule_csv": "",
    "parallelism.pipeline_parallel_split_points": [], "parallelism.module_fqns_per_model_part": None,
    "parallelism.context_parallel_rotate_method": "allgather", "parallelism.context_parallel_load_balancer": "headtail",
    "parallelism.pipeline_parallel_expert_parallel_overlap": True, "parallelism.expert_parallel_comm_backend": "standard",
    "parallelism.enable_fsdp_symm_mem": False,
    "activation_checkpoint.early_stop": False, "activation_checkpoint.memory_budget": 0.5,
    "activation_checkpoint.visualize_memory_budget_pareto": False, "activation_checkpoint.preserve_rng_state": False,
    "activation_checkpoint.determinism_check": "default", "activation_checkpoint.debug": False,
    "activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns": ["moe.router.gate"],
    # torchtitan 0.3 (torchtitan/config/configs.py: ParallelismConfig, TrainingConfig, CompileConfig)
    "parallelism.spmd_backend": "spmd_types", "parallelism.context_parallel_ptrr_mask_key": None,
    "training.enable_cpu_offload": False, "training.dtype": "float32", "training.mixed_precision_reduce": "float32",
    "compile.enable_async_tensor_parallel": False,
}
#: Keys read without an effect on the layout or its cost.
TITAN_NO_EFFECT = {
    "parallelism.context_parallel_rotate_method": "the kv exchange's collective (same bytes)",
    "parallelism.disable_loss_parallel": "the loss over the tp ranks or gathered (a [tokens, vocab/tp] tensor)",
    "activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns": "matmuls of the router recomputed",
    "activation_checkpoint.preserve_rng_state": "RNG state kept for recompute",
    "activation_checkpoint.early_stop": "stops recompute early (no memory or time change priced)",
    "activation_checkpoint.determinism_check": "a debug check", "activation_checkpoint.debug": "a debug check",
    "parallelism.spmd_backend": "the tensor-parallel implementation (the same collectives)",
    "parallelism.context_parallel_ptrr_mask_key": "the PTRR load balancer's mask",
    "compile.enable": "torch.compile: not priced apart — calibrate on your compiled runs (gplan calibrate)",
    "compile.components": "what torch.compile compiles", "training.compile": "torch.compile (torchtitan ≤ 0.2's "
    "switch): not priced apart — calibrate on your compiled runs (gplan calibrate)", "compile.backend": "torch.compile's backend",
}
TITAN_NOT_LAYOUT = {"training.max_norm", "training.steps", "training.gc_freq", "training.gc_debug",
                    "training.dataset", "training.dataset_path"}
"""Keys of the sections gplan reads that are no layout setting (clipping, schedule, garbage collection)."""
#: Keys gplan cannot price when set away from their default.
TITAN_NOT_PRICED = {
    "parallelism.enable_async_tensor_parallel": "async tensor parallel (tp collectives fused into matmuls)",
    "parallelism.pipeline_parallel_schedule_csv": "a schedule from a CSV file",
    "activation_checkpoint.memory_budget": "torch.compile's memory-budget recompute",
    "parallelism.expert_parallel_comm_backend": "torchtitan's DeepEP token exchange",
    "training.enable_cpu_offload": "FSDP's parameters and optimizer on the host",
    "training.dtype": "parameters kept in another dtype than fp32",
    "training.mixed_precision_reduce": "gradients reduced in another dtype than fp32",
    "compile.enable_async_tensor_parallel": "async tensor parallel (tp collectives fused into matmuls)",
}
TITAN_LAYOUT_LIKE = re.compile(r"^(parallelism|activation_checkpoint)\.|batch|seq_len")
"""Unread keys that would change the layout or its cost. The float8/mx/quantize sections count only when
`model.converters` turns them on (torchtitan's TOMLs carry them switched off)."""


def titan_class(key: str, value: Any) -> tuple[str, str]:
    """("no effect", why) or ("refused", why) for a torchtitan key the launch reader does not read."""
    if key in TITAN_DEFAULTS and _titan_at_default(value, TITAN_DEFAULTS[key]):
        return "no effect", "at torchtitan's default"
    if key in TITAN_NOT_PRICED:
        return "refused", TITAN_NOT_PRICED[key]
    if key in TITAN_NO_EFFECT:
        return "no effect", TITAN_NO_EFFECT[key]
    if TITAN_LAYOUT_LIKE.search(key):
        return "refused", "would change the layout or its cost"
    return "no effect", "not a layout setting"


def _titan_at_default(value: Any, default: Any) -> bool:
    if isinstance(default, list) or isinstance(value, list):
        return value == default
    if isinstance(default, bool):
        return str(value).lower() == str(default).lower()
    if default is None:
        return value in (None, "None", "none")
    try:
        return float(value) == float(default)
    except (TypeError, ValueError):
        return str(value) == str(default)
