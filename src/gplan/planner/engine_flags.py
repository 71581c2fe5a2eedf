"""What each engine flag a launch sets means to gplan: read and priced, read with no effect on the layout or
its cost (said so), or refused because gplan cannot price it (named).

A flag at its engine's default is never refused: it changes nothing. The defaults are the engines' own —
Megatron-LM's `megatron/training/arguments.py` (NVIDIA/Megatron-LM main at 000c4ac, 2026; the `default=` of
each `add_argument`, store_true switches default off) and torchtitan's job config
(`torchtitan/config/job_config.py`, the dataclass field defaults of Parallelism and ActivationCheckpoint,
torchtitan ≤ 0.2 whose launches are TOMLs). Megatron's flags are named here once: those the launch
readers (planner.launch_files, planner.model_zoo) read, and the rest.
"""

from __future__ import annotations

import re
from typing import Any

# ---- Megatron-LM -----------------------------------------------------------------------------------

#: Megatron flags that set the model, with the ModelSpec value they must agree with.
MODEL_FLAGS = {
    "--num-layers": lambda m: m.num_layers, "--hidden-size": lambda m: m.hidden_size,
    "--ffn-hidden-size": lambda m: m.ffn_size, "--num-attention-heads": lambda m: m.num_attention_heads,
    "--num-query-groups": lambda m: m.kv_heads, "--num-experts": lambda m: m.num_experts,
    "--moe-router-topk": lambda m: m.top_k, "--moe-ffn-hidden-size": lambda m: m.expert_ffn_size,
    "--mtp-num-layers": lambda m: m.mtp_layers,
    "--window-attn-skip-freq": lambda m: m.full_attention_every,  # one full layer every N (a list: refused)
}
#: Flags read for the layout, the batch or the precision.
LAYOUT_FLAGS = {
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
    "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--num-layers-per-virtual-pipeline-stage",
    "--virtual-pipeline-model-parallel-size", "--sequence-parallel", "--micro-batch-size", "--global-batch-size",
    "--seq-length", "--use-distributed-optimizer", "--recompute-granularity", "--recompute-method", "--recompute-modules",
    "--recompute-num-layers", "--bf16", "--fp16", "--fp8-format", "--fp8-recipe", "--use-megatron-fsdp",
    "--data-parallel-sharding-strategy", "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
    "--tp-comm-overlap", "--overlap-grad-reduce", "--overlap-param-gather", "--pipeline-model-parallel-layout",
    "--grad-reduce-in-bf16", "--fp8-param-gather", "--cpu-offloading", "--cpu-offloading-num-layers",
    "--overlap-moe-expert-parallel-comm", "--cuda-graph-impl", "--cuda-graph-scope", "--no-check-for-nan-in-loss-and-grad",
    "--moe-token-dispatcher-type", "--moe-enable-deepep", "--moe-flex-dispatcher-backend",
    "--use-custom-fsdp", "--num-virtual-stages-per-pipeline-rank", "--account-for-embedding-in-pipeline-split",
    "--account-for-loss-in-pipeline-split", "--combined-1f1b", "--fp4-format", "--recompute-activations",
    "--checkpoint-activations",
}
#: Model flags whose presence gplan reads through the named model (checked as switches).
MODEL_SWITCHES = {
    "--swiglu", "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--add-qkv-bias",
    "--group-query-attention", "--normalization", "--position-embedding-type", "--rotary-base", "--kv-channels",
    "--max-position-embeddings", "--vocab-size", "--make-vocab-size-divisible-by", "--qk-layernorm",
    "--attention-dropout", "--hidden-dropout", "--window-size", "--moe-layer-freq", "--moe-grouped-gemm",
    "--moe-router-score-function", "--moe-router-enable-expert-bias",
    "--moe-shared-expert-intermediate-size", "--moe-router-num-groups", "--moe-router-group-topk",
    "--moe-router-topk-scaling-factor", "--multi-latent-attention", "--q-lora-rank", "--kv-lora-rank",
    "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim", "--moe-expert-capacity-factor",
    "--moe-token-drop-policy", "--tokenizer-type", "--mock-data", "--softmax-type", "--quick-geglu",
    "--glu-linear-offset", "--activation-func-clamp-value",
}

_FUSION = "a kernel fusion switch (within the per-layer efficiency gplan calibrates)"
_ROPE = "RoPE's numerics (elementwise, no GEMM)"
_TP_OVERLAP = "a detail of --tp-comm-overlap (priced as the overlap whole)"
_PROFILE = "profiling or a run-time check"
_NCCL = "NCCL's buffers, registration or in-network reduction (within the calibrated link efficiency)"
_OFFLOAD_DETAIL = "a detail of --optimizer-cpu-offload (refused itself)"
_LOSS_SCALE = "fp16 loss scaling"

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
    "--moe-use-legacy-grouped-gemm": "an older grouped-GEMM module (the same GEMMs)",
    "--moe-apply-probs-on-input": "where the routing weights multiply (elementwise)",
    "--moe-upcycling-granularity": "read with --moe-use-upcycling only",
    "--moe-pad-experts-for-cuda-graph-inference": "inference only", "--cache-mla-latents": "inference only",
    "--delay-wgrad-compute": "part of the expert all-to-all overlap (read with --overlap-moe-expert-parallel-comm)",
    "--combined-1f1b-recipe": "read with --combined-1f1b",
    "--distributed-timeout-minutes": "a timeout", "--distributed-timeout-seconds-after-init": "a timeout",
    "--no-create-attention-mask-in-dataloader": "data loading",
    "--cross-entropy-loss-fusion": "a fused loss kernel", "--cross-entropy-fusion-impl": "a fused loss kernel",
    "--use-mcore-models": "the default model implementation", "--use-flash-attn": "the attention kernel "
    "gplan prices", "--transformer-impl": "Transformer Engine, the implementation gplan prices",
    "--attention-backend": "the attention kernel (gplan prices the engine's fused one)",
    "--enable-experimental": "unlocks flags that are classified on their own",
    "--manual-gc": "Python garbage collection", "--manual-gc-interval": "Python garbage collection",
    "--no-manual-gc-eval": "Python garbage collection",
    "--use-precision-aware-optimizer": "the optimizer's dtypes are their own flags",
    "--use-separate-send-recv-groups": "pipeline send/receive on separate groups (same bytes)",
    "--no-rope-fusion": _FUSION, "--no-gradient-accumulation-fusion": _FUSION, "--no-bias-swiglu-fusion": _FUSION,
    "--no-masked-softmax-fusion": _FUSION, "--no-bias-gelu-fusion": _FUSION, "--no-bias-dropout-fusion": _FUSION,
    "--use-fused-weighted-squared-relu": _FUSION, "--no-persist-layer-norm": _FUSION, "--use-te-activation-func": _FUSION,
    "--no-gradient-reduce-div-fusion": _FUSION,
    "--no-overlap-p2p-communication": "pipeline sends are priced unoverlapped either way",
    "--overlap-p2p-communication-warmup-flush": "pipeline sends are priced unoverlapped either way",
    "--use-ring-exchange-p2p": "pipeline sends are priced unoverlapped either way",
    "--rotary-percent": _ROPE, "--rotary-interleaved": _ROPE, "--rotary-seq-len-interpolation-factor": _ROPE,
    "--use-rope-scaling": _ROPE, "--rope-scaling-factor": _ROPE, "--no-rope-freq": _ROPE, "--mrope-section": _ROPE,
    "--rope-type": _ROPE, "--rotary-scaling-factor": _ROPE, "--mscale": _ROPE, "--mscale-all-dim": _ROPE,
    "--use-rotary-position-embeddings": "the old spelling of --position-embedding-type rope (the model's)",
    "--no-position-embedding": "the model's position embedding (read through the model)",
    "--norm-epsilon": "normalization numerics", "--apply-layernorm-1p": "normalization numerics",
    "--apply-residual-connection-post-layernorm": "the residual's order (same operations)",
    "--openai-gelu": "the activation (same GEMMs)", "--squared-relu": "the activation (same GEMMs)",
    "--relative-attention-num-buckets": "T5's relative attention (not a GPT's)",
    "--relative-attention-max-distance": "T5's relative attention (not a GPT's)",
    "--onnx-safe": "ONNX export", "--bert-no-binary-head": "BERT only", "--mtp-loss-scaling-factor": "a loss weight",
    "--decrease-batch-size-if-needed": "only after a failure", "--check-for-spiky-loss": _PROFILE,
    "--check-for-large-grads": _PROFILE, "--no-check-for-nan-in-loss-and-grad": _PROFILE,
    "--check-weight-hash-across-dp-replicas-interval": _PROFILE, "--profile": _PROFILE,
    "--profile-step-start": _PROFILE, "--profile-step-end": _PROFILE, "--iterations-to-skip": _PROFILE,
    "--use-pytorch-profiler": _PROFILE, "--profile-ranks": _PROFILE, "--record-memory-history": _PROFILE,
    "--no-clone-scatter-output-in-embedding": "one [tokens, hidden] copy of the embedding's output",
    "--disable-gloo-process-groups": "host-side process groups", "--use-cpu-initialization": "initialization only",
    "--init-model-with-meta-device": "initialization only", "--lazy-mpu-init": "initialization only",
    "--local-rank": "set by the launcher", "--calculate-per-token-loss": "the loss's normalization",
    "--train-sync-interval": "host-device synchronization", "--empty-unused-memory-level": "allocator cache calls",
    "--tp-comm-overlap-cfg": _TP_OVERLAP, "--disable-tp-comm-overlap-ag": _TP_OVERLAP,
    "--disable-tp-comm-overlap-rs": _TP_OVERLAP, "--tp-comm-overlap-rs-dgrad": _TP_OVERLAP,
    "--disable-tp-comm-bulk-dgrad": _TP_OVERLAP, "--disable-tp-comm-bulk-wgrad": _TP_OVERLAP,
    "--disable-tp-comm-split-ag": _TP_OVERLAP, "--disable-tp-comm-split-rs": _TP_OVERLAP,
    "--tp-comm-bootstrap-backend": _TP_OVERLAP,
    "--optimizer-offload-fraction": _OFFLOAD_DETAIL, "--use-torch-optimizer-for-cpu-offload": _OFFLOAD_DETAIL,
    "--overlap-cpu-optimizer-d2h-h2d": _OFFLOAD_DETAIL, "--no-pin-cpu-grads": _OFFLOAD_DETAIL,
    "--no-pin-cpu-params": _OFFLOAD_DETAIL,
    "--no-async-tensor-model-parallel-allreduce": "deprecated and ignored by Megatron",
    "--pipeline-model-parallel-comm-backend": "the pipeline's communicator library (same bytes)",
    "--high-priority-stream-groups": "stream priorities",
    "--loss-scale": _LOSS_SCALE, "--initial-loss-scale": _LOSS_SCALE, "--min-loss-scale": _LOSS_SCALE,
    "--loss-scale-window": _LOSS_SCALE, "--hysteresis": _LOSS_SCALE,
    "--apply-query-key-layer-scaling": "attention numerics", "--attention-softmax-in-fp32": "attention numerics",
    "--accumulate-allreduce-grads-in-fp32": "Megatron's own choice with bf16 (the reduction gplan prices)",
    "--fp16-lm-cross-entropy": "the loss's precision", "--disable-bf16-reduced-precision-matmul": "GEMM numerics",
    "--reuse-grad-buf-for-mxfp8-param-ag": "a buffer reuse of --fp8-param-gather with MXFP8",
    "--defer-embedding-wgrad-compute": "moves the head's weight-gradient GEMM to the pipeline flush",
    "--wgrad-deferral-limit": "read with --defer-embedding-wgrad-compute",
    "--no-align-grad-reduce": "when each stage starts its reduction", "--no-align-param-gather": "when each stage "
    "starts its gather", "--overlap-param-gather-with-optimizer-step": "the first bucket's gather timing",
    "--ddp-num-buckets": "bucketing (the sync is priced as its bucketed overlap)",
    "--ddp-bucket-size": "bucketing (the sync is priced as its bucketed overlap)",
    "--ddp-pad-buckets-for-high-nccl-busbw": "bucketing (the sync is priced as its bucketed overlap)",
    "--ddp-average-in-collective": "where the gradients are averaged",
    "--ddp-reduce-scatter-with-fp32-accumulation": "the reduction's accumulation",
    "--use-nccl-ub": _NCCL, "--disable-symmetric-registration": _NCCL, "--use-sharp": _NCCL,
    "--sharp-enabled-group": _NCCL, "--nccl-communicator-config-path": _NCCL,
    "--fsdp-double-buffer": "Megatron-FSDP's buffer reuse", "--suggested-communication-unit-size": "Megatron-FSDP's "
    "gather unit (priced layer by layer)",
    "--replication": "checkpoint replication", "--replication-jump": "checkpoint replication",
    "--replication-factor": "checkpoint replication",
    "--fp8-margin": "fp8 scaling numerics", "--fp8-interval": "fp8 scaling numerics (ignored by Megatron)",
    "--fp8-amax-history-len": "fp8 scaling numerics", "--fp8-amax-compute-algo": "fp8 scaling numerics",
    "--te-rng-tracker": "the random-number tracker", "--inference-rng-tracker": "inference only",
    "--cuda-graph-warmup-steps": "steps before the graphs are captured",
}
"""Flags of Megatron's layout groups (planner.megatron_arguments) that change neither the layout nor its
cost; flags of its other groups (data, tokenizer, checkpoints, learning rate, logging, evaluation, …) are
listed as not read."""

#: Megatron's defaults of flags newer than the arguments snapshot (planner.megatron_arguments) or from
#: development branches whose recipes use them; the snapshot holds the rest.
MEGATRON_DEFAULTS: dict[str, Any] = {
    "--fine-grained-activation-offloading": False, "--offload-modules": None, "--moe-flex-dispatcher-backend": None,
}
#: Flags gplan cannot price when set away from their default (a change to memory or time it has no term for).
MEGATRON_NOT_PRICED = {
    "--exp-avg-dtype": "Adam moments in another dtype", "--exp-avg-sq-dtype": "Adam moments in another dtype",
    "--main-grads-dtype": "main gradients in another dtype", "--main-params-dtype": "main weights in another dtype",
    "--optimizer-cpu-offload": "the optimizer on the host", "--fine-grained-activation-offloading":
    "per-module activation offloading", "--offload-modules": "per-module activation offloading",
    "--moe-shared-expert-overlap": "the shared expert overlapped with the dispatch",
    "--moe-expert-capacity-factor": "token dropping at a capacity", "--moe-pad-expert-input-to-capacity":
    "experts padded to their capacity", "--moe-token-drop-policy": "which tokens a capacity drops",
    "--optimizer": "another optimizer than Adam (its state differs)",
    "--batch-size": "the old spelling of --micro-batch-size: write --micro-batch-size",
    "--model-parallel-size": "the old spelling of --tensor-model-parallel-size: write that",
    "--rampup-batch-size": "a batch that ramps up (gplan prices one batch)",
    "--distribute-saved-activations": "recompute inputs split over the tp ranks",
    "--deterministic-mode": "deterministic (slower) kernels", "--use-legacy-models": "Megatron's legacy models",
    "--fp32-residual-connection": "the residual stream in fp32",
    "--microbatch-group-size-per-virtual-pipeline-stage": "another interleaving of the micro-batches",
    "--distributed-backend": "collectives over gloo", "--no-scatter-gather-tensors-in-pipeline":
    "pipeline sends of the whole activation on every tp rank", "--keep-fp8-transpose-cache":
    "Megatron-FSDP's fp8 transpose cache", "--enable-full-sharding-in-hsdp": "hybrid sharding (HSDP)",
    "--num-distributed-optimizer-instances": "several distributed-optimizer instances (HSDP-like)",
    "--use-torch-fsdp2": "Megatron over torch FSDP2 (gplan prices Megatron-FSDP)",
    "--torch-fsdp2-no-reshard-after-forward": "Megatron over torch FSDP2 (gplan prices Megatron-FSDP)",
    "--cp-comm-type": "another context-parallel exchange than the p2p ring",
    "--hierarchical-context-parallel-sizes": "hierarchical context parallelism",
    "--use-tp-pp-dp-mapping": "another rank order (the links each group rides)",
    "--fp8-quantizer-factory": "a custom fp8 quantizer", "--fp4-quantizer-factory": "a custom fp4 quantizer",
    "--fp4-recipe": "another fp4 recipe than NVFP4", "--fp4-param-gather": "fp4 weights kept and gathered",
    "--no-fp8-wgrad": "weight gradients in higher precision", "--first-last-layers-bf16": "some layers kept in bf16",
    "--num-layers-at-start-in-bf16": "some layers kept in bf16", "--num-layers-at-end-in-bf16": "some layers kept in bf16",
    "--enable-cuda-graph": "its deprecated spelling: write --cuda-graph-impl local",
    "--external-cuda-graph": "its deprecated spelling: write --cuda-graph-impl transformer_engine",
    "--moe-layer-recompute": "its deprecated spelling: write --recompute-granularity selective --recompute-modules moe",
    "--moe-extended-tp": "its deprecated spelling: write --expert-tensor-parallel-size",
    "--moe-use-upcycling": "a checkpoint conversion, not a training run",
    "--encoder-num-layers": "an encoder-decoder model", "--decoder-num-layers": "an encoder-decoder model",
    "--heterogeneous-layers-config-path": "layers of different shapes",
    "--heterogeneous-layers-config-encoded-json": "layers of different shapes",
    "--spec": "a custom layer spec", "--yaml-cfg": "arguments in a YAML the launch names: pass that file",
    "--hybrid-attention-ratio": "a hybrid Mamba model", "--hybrid-mlp-ratio": "a hybrid Mamba model",
    "--hybrid-override-pattern": "a hybrid Mamba model", "--mamba-state-dim": "a hybrid Mamba model",
    "--mamba-head-dim": "a hybrid Mamba model", "--mamba-num-groups": "a hybrid Mamba model",
    "--mamba-num-heads": "a hybrid Mamba model", "--is-hybrid-model": "a hybrid Mamba model",
    "--disable-mamba-mem-eff-path": "a hybrid Mamba model",
}
MEGATRON_LAYOUT_LIKE = re.compile(r"parallel|pipeline|recompute|checkpoint-activations|batch|expert|fsdp|offload|"
                                  r"zero|overlap|fp8|fp4|moe|mtp|cuda-graph|num-layers|seq-length|hidden|heads")
"""A flag outside the snapshot that matches this could change the layout or its cost: refused unless at
its default."""


def megatron_class(flag: str, values: list[str]) -> tuple[str, str]:
    """("no effect", why) or ("refused", why) for a Megatron flag the launch reader does not read: at its
    default (Megatron's arguments.py, planner.megatron_arguments) it changes nothing; else as classified."""
    from gplan.planner.megatron_arguments import arguments

    known = arguments()
    default = known[flag][1] if flag in known else MEGATRON_DEFAULTS.get(flag, "<none>")
    if default != "<none>" and at_default(values, default):
        return "no effect", "at Megatron's default"
    if flag in MEGATRON_NOT_PRICED:
        return "refused", MEGATRON_NOT_PRICED[flag]
    if flag in MEGATRON_NO_EFFECT:
        return "no effect", MEGATRON_NO_EFFECT[flag]
    if flag in known or MEGATRON_LAYOUT_LIKE.search(flag):
        return "refused", "would change the layout or its cost"
    return "no effect", "not a layout setting"


def at_default(values: list[str] | Any, default: Any) -> bool:
    """Whether a flag's values (a store_true switch has none: True) equal its default."""
    if isinstance(values, list):
        if not values and not (isinstance(default, bool) or default is None):
            return False  # a bare flag where the parser wants a value: not the default
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


# ---- DeepSpeed -------------------------------------------------------------------------------------

#: The ZeRO keys of a DeepSpeed config (DeepSpeed 0.19's `DeepSpeedZeroConfig`, its field names and their
#: `stage3_…` aliases) gplan cannot price away from their defaults, with why.
DS_ZERO_NOT_PRICED = {
    "offload_param": ("parameters on the host or NVMe", None), "offload_optimizer": ("the optimizer on the host or NVMe", None),
    "cpu_offload": ("the optimizer on the host", None), "cpu_offload_param": ("parameters on the host", None),
    "cpu_offload_use_pin_memory": ("host offload", None), "zenflow": ("ZenFlow's host optimizer", None),
    "zero_hpz_partition_size": ("ZeRO++ hierarchical weight partitions", 1),
    "zero_quantized_weights": ("ZeRO++ quantized weight gathers", False),
    "zero_quantized_nontrainable_weights": ("ZeRO++ quantized weights", False),
    "zero_quantized_gradients": ("ZeRO++ quantized gradients", False),
    "reduce_scatter": ("gradients all-reduced rather than reduce-scattered", True),
    "use_all_reduce_for_fetch_params": ("weights fetched by all-reduce", False),
    "stage3_use_all_reduce_for_fetch_params": ("weights fetched by all-reduce", False),
}
DS_ZERO_NO_EFFECT = {
    "stage": "read", "contiguous_gradients": "buffer layout", "reduce_bucket_size": "bucketing (priced as DeepSpeed's "
    "bucketed reduction)", "use_multi_rank_bucket_allreduce": "bucketing", "allgather_partitions": "how the gather "
    "runs (same bytes)", "allgather_bucket_size": "bucketing", "overlap_comm": "overlap as DeepSpeed's profile prices it",
    "compute_grad_norm": "the norm's computation", "load_from_fp32_weights": "checkpoint loading",
    "elastic_checkpoint": "checkpointing", "sub_group_size": "the optimizer's step grouping",
    "prefetch_bucket_size": "ZeRO-3 prefetch (priced as its profile's)", "stage3_prefetch_bucket_size": "ZeRO-3 prefetch "
    "(priced as its profile's)", "param_persistence_threshold": "small parameters kept whole (a rounding)",
    "stage3_param_persistence_threshold": "small parameters kept whole (a rounding)",
    "model_persistence_threshold": "small parameters kept whole", "stage3_model_persistence_threshold": "small "
    "parameters kept whole", "max_live_parameters": "ZeRO-3's live-parameter cap (its profile's)",
    "stage3_max_live_parameters": "ZeRO-3's live-parameter cap (its profile's)", "max_reuse_distance": "ZeRO-3 caching",
    "stage3_max_reuse_distance": "ZeRO-3 caching", "gather_16bit_weights_on_model_save": "checkpointing",
    "stage3_gather_16bit_weights_on_model_save": "checkpointing", "stage3_gather_fp16_weights_on_model_save":
    "checkpointing", "module_granularity_threshold": "ZeRO-3 hooks", "stage3_module_granularity_threshold": "ZeRO-3 hooks",
    "allgather_sequential": "gather order", "stage3_allgather_sequential": "gather order",
    "ignore_unused_parameters": "a check", "legacy_stage1": "an older stage 1 (same states)",
    "round_robin_gradients": "gradient order", "parameter_alignment": "padding", "memory_efficient_linear": "a kernel",
    "pipeline_loading_checkpoint": "checkpointing", "override_module_apply": "hooks",
    "log_trace_cache_warnings": "logging", "enable_sanity_checks": "a check", "save_muon_momentum_buffer_in_memory":
    "Muon only", "leaf_module": "ZeRO-3 leaf modules (gathered whole, as priced)", "mics_shard_size": "MiCS",
}


def deepspeed_zero_class(key: str, value: Any) -> tuple[str, str]:
    """("no effect", why) or ("refused", why) for a key of a DeepSpeed config's zero_optimization."""
    if key in DS_ZERO_NOT_PRICED:
        why, default = DS_ZERO_NOT_PRICED[key]
        off = value in (None, default, {}) or (isinstance(value, dict) and str(value.get("device", "none")) == "none")
        return ("no effect", "at DeepSpeed's default") if off else ("refused", why)
    if key in DS_ZERO_NO_EFFECT:
        return "no effect", DS_ZERO_NO_EFFECT[key]
    return "refused", "a ZeRO setting gplan does not read"


#: The top-level keys of a DeepSpeed config JSON its launch reader reads (batch, micro-batch, ZeRO, precision,
#: activation checkpointing); every other key DeepSpeed 0.19's `DeepSpeedConfig` reads is classified below.
DS_READ = frozenset({"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                     "zero_optimization", "bf16", "bfloat16", "fp16", "activation_checkpointing"})
#: Top-level keys that change nothing gplan prices, with why.
DS_NO_EFFECT = {
    "scheduler": "the learning-rate schedule", "gradient_clipping": "a norm over the gradients",
    "steps_per_print": "logging", "wall_clock_breakdown": "timers", "memory_breakdown": "logging", "dump_state":
    "logging", "log_level": "logging", "timers": "timers", "flops_profiler": "a profiler run on one step",
    "tensorboard": "monitoring", "wandb": "monitoring", "csv_monitor": "monitoring", "comet": "monitoring",
    "comms_logger": "logging", "checkpoint": "checkpointing", "nebula": "checkpointing", "datastates_ckpt":
    "checkpointing", "prescale_gradients": "where the gradients are scaled (same bytes)", "gradient_predivide_factor":
    "where the gradients are scaled (same bytes)", "gradient_allreduce_op": "mean or sum (same bytes)",
    "dataloader_drop_last": "the data loader", "disable_allgather": "ZeRO 1/2 broadcast in place of all-gather "
    "(same bytes)", "disable_python_gc": "host-side garbage collection", "zero_allow_untested_optimizer": "a check",
    "zero_force_ds_cpu_optimizer": "a check for offload (offload itself is refused)", "aio": "NVMe offload's I/O "
    "(offload itself is refused)", "vocabulary_size": "a hint for its own profiler", "autotuning": "DeepSpeed's "
    "autotuner (a separate run)", "use_data_before_expert_parallelism": "the data order", "pipeline": "the pipeline "
    "engine's options (Megatron-DeepSpeed splits by its own arguments)", "managed_gradient_accumulation":
    "who counts the accumulation steps",
}
#: Top-level keys gplan cannot price away from DeepSpeed's default, with why and that default (OFF: absent or
#: `enabled: false`); `optimizer` is read by type (`deepspeed_key_class`).
OFF = "off"
DS_NOT_PRICED = {
    "communication_data_type": ("gradients reduced in another dtype", None),
    "seq_parallel_communication_data_type": ("DeepSpeed-Ulysses sequence parallel", "fp32"),
    "data_types": ("gradients accumulated in another dtype", OFF), "amp": ("NVIDIA Apex AMP", OFF),
    "sparse_attention": ("block-sparse attention", OFF), "sparse_gradients": ("sparse embedding gradients", False),
    "elasticity": ("elastic batch sizes", OFF), "curriculum_learning": ("sequence lengths that grow in training", OFF),
    "data_efficiency": ("curriculum and random layer-token dropping", OFF),
    "progressive_layer_drop": ("layers skipped in training", OFF), "compression_training": ("compression", OFF),
    "quantize_training": ("quantized training", OFF), "weight_quantization": ("quantized weights", OFF),
    "eigenvalue": ("eigenvalue computation in training", OFF), "hybrid_engine": ("RLHF's inference engine", OFF),
    "torch_autocast": ("torch.autocast mixed precision", OFF), "tensor_parallel": ("DeepSpeed's AutoTP", OFF),
    "expert_parallel": ("DeepSpeed's AutoEP", OFF), "compile": ("DeepSpeed's compiled engine (DeepCompile)", OFF),
    "graph_harvesting": ("CUDA-graph capture", False),
}
#: Optimizers with Adam's two moments (what gplan prices); others change the states or the communication.
DS_ADAM_LIKE = frozenset({"adam", "adamw", "fusedadam", "lamb", "fusedlamb"})


def _ds_off(value: Any, default: Any) -> bool:
    if default == OFF:
        return value in (None, {}, False) or (isinstance(value, dict) and not value.get("enabled", True)) or (
            isinstance(value, dict) and value.get("autotp_size", 1) in (0, 1) and "autotp_size" in value) or (
            isinstance(value, dict) and set(value) <= {"deepcompile"} and not value.get("deepcompile"))
    return value == default or str(value).lower() == str(default).lower()


def deepspeed_key_class(key: str, value: Any) -> tuple[str, str]:
    """("no effect", why) or ("refused", why) for a top-level key of a DeepSpeed config JSON."""
    if key == "optimizer":
        kind = str((value or {}).get("type", "adam")).lower()
        return (("no effect", "Adam's states, as priced") if kind in DS_ADAM_LIKE else
                ("refused", f"optimizer {kind} (gplan prices Adam's two moments and a plain reduction)"))
    if key in DS_NO_EFFECT:
        return "no effect", DS_NO_EFFECT[key]
    if key == "activation_checkpointing.cpu_checkpointing":
        return ("refused", "checkpointed activations kept on the host") if value else ("no effect", "off")
    if key.startswith("activation_checkpointing."):  # partition_activations only lowers what is priced
        return "no effect", "how the checkpointed layers are stored (priced as whole recomputed layers)"
    if key in DS_NOT_PRICED:
        why, default = DS_NOT_PRICED[key]
        return ("no effect", "at DeepSpeed's default") if _ds_off(value, default) else ("refused", why)
    return "no effect", "DeepSpeed 0.19 does not read it (an unknown top-level key is ignored there)"


# ---- MindFormers -----------------------------------------------------------------------------------

#: The layout keys of a MindFormers training YAML beside the ones its reader reads: MindFormers 2.1's
#: `TransformerOpParallelConfig` and `TransformerRecomputeConfig` arguments and the `parallel` section
#: MindSpore's auto-parallel context takes — key -> (why it has no effect, or None: refused away from the
#: default; its default).
MF_KEYS: dict[str, tuple[str | None, Any]] = {
    "parallel_config.gradient_aggregation_group": ("gradient fusion grouping", 4),
    "parallel_config.vocab_emb_dp": ("the embedding's data-parallel layout (MindFormers sets it under pipelines)", True),
    "parallel_config.mem_coeff": ("the sequence pipeline's memory coefficient", 0.1),
    "parallel_config.optimizer_shard": (None, None), "parallel_config.seq_split_num": (None, 1),
    "parallel_config.context_parallel_algo": (None, "colossalai_cp"), "parallel_config.ulysses_degree_in_cp": (None, 1),
    "parallel_config.swap": (None, None), "parallel_config.recompute": ("recompute_config is read", None),
    "recompute_config.parallel_optimizer_comm_recompute": ("the optimizer gathers' recompute", False),
    "recompute_config.mp_comm_recompute": ("tp collectives' recompute", True),
    "recompute_config.recompute_slice_activation": ("recompute's saved-input slicing", False),
    "recompute_config.select_comm_recompute": ("communication ops' recompute", False),
    "recompute_config.select_recompute_exclude": ("operators left out of select_recompute", False),
    "recompute_config.select_comm_recompute_exclude": ("operators left out of select_comm_recompute", False),
    "parallel.parallel_mode": (None, 1), "parallel.gradients_mean": ("the gradients' mean or sum", False),
    "parallel.full_batch": ("how the batch is handed to the ranks", True), "parallel.search_mode": ("the strategy "
    "search (semi-auto: the configured one)", "sharding_propagation"), "parallel.strategy_ckpt_save_file":
    ("checkpointing", None), "parallel.strategy_ckpt_config": ("checkpointing", None), "parallel.enable_alltoall":
    ("the expert all-to-all (read with expert_parallel)", False), "parallel.dataset_strategy": ("data loading", None),
    "parallel.parallel_optimizer_config.parallel_optimizer_threshold": ("small parameters left unsharded", 64),
    "parallel.parallel_optimizer_config.optimizer_weight_shard_size": (None, -1),
}
MF_READ = {"parallel_config.data_parallel", "parallel_config.model_parallel", "parallel_config.pipeline_stage",
           "parallel_config.context_parallel", "parallel_config.use_seq_parallel", "parallel_config.micro_batch_num",
           "parallel_config.expert_parallel", "recompute_config.recompute", "recompute_config.select_recompute",
           "parallel.enable_parallel_optimizer", "parallel.parallel_optimizer_config.gradient_accumulation_shard",
           "parallel.pipeline_config.pipeline_interleave", "parallel.pipeline_config.pipeline_scheduler"}


def mindformers_class(key: str, value: Any) -> tuple[str, str]:
    """("no effect", why) or ("refused", why) for a MindFormers layout key its reader does not read."""
    if key not in MF_KEYS:
        return "refused", "a layout key gplan does not read"
    why, default = MF_KEYS[key]
    if value == default or (default is None and value in (None, False, {}, "")):
        return "no effect", "at MindFormers' default"
    return ("no effect", why) if why else ("refused", "a layout setting gplan does not price")


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
