"""DeepSpeed's config keys as gplan reads them: read, no effect (why), or refused away from their default (why). A key at its default is never refused."""

from __future__ import annotations

from typing import Any


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

