"""NeMo AutoModel's recipe keys as gplan reads them: read, no effect (why), or refused away from their default
(why). A key at its default is never refused. Defaults: nemo_automodel 0.7.0's `FSDP2Config` and
`MoEParallelizerConfig` (components/distributed/config.py), `PipelineConfig`
(components/distributed/pipelining/config.py), and `parse_distributed_section` (recipes/_dist_utils.py)."""

from __future__ import annotations

from typing import Any

READ = frozenset({
    "distributed.strategy", "distributed.dp_size", "distributed.dp_replicate_size", "distributed.tp_size",
    "distributed.cp_size", "distributed.pp_size", "distributed.ep_size", "distributed.sequence_parallel",
    "distributed.activation_checkpointing", "distributed.reshard_after_forward", "distributed.zero_dp_strategy",
    "distributed.moe.reshard_after_forward",
    "distributed.pipeline.pp_schedule", "distributed.pipeline.pp_microbatch_size",
    "distributed.pipeline.layers_per_stage", "distributed.pipeline.pp_batch_size",
    "distributed.pipeline.round_virtual_stages_to_pp_multiple",
    "step_scheduler.global_batch_size", "step_scheduler.local_batch_size",
    "distributed.mp_policy.param_dtype", "distributed.mp_policy.reduce_dtype", "distributed.mp_policy._target_",
    "distributed._target_", "packed_sequence.packed_sequence_size", "dataset.seq_len", "dataset.seq_length",
    "model.backend.dispatcher", "model.torch_dtype", "model.dtype", "model.backend.attn",
    "loss_fn.fp32_upcast", "distributed.defer_fsdp_grad_sync", "distributed.enable_async_tensor_parallel",
})
"""Keys the reader reads: the layout, the batch, the sequence and the precision."""

DEFAULTS: dict[str, Any] = {
    "distributed.activation_checkpointing_scope": "all",
    "distributed.enable_async_tensor_parallel": False, "distributed.enable_compile": False,
    "distributed.enable_fsdp2_prefetch": False, "distributed.fsdp2_backward_prefetch_depth": 2,
    "distributed.fsdp2_forward_prefetch_depth": 1, "distributed.offload_policy": None,
    "distributed.autocast_dtype": None, "distributed.tp_plan": None, "distributed.patch_is_packed_sequence": False,
    "distributed.pipeline.pp_schedule_csv": None, "distributed.pipeline.round_virtual_stages_to_pp_multiple": None,
    "distributed.pipeline.module_fqns_per_model_part": None, "distributed.pipeline.scale_grads_in_schedule": False,
    "distributed.moe.mp_policy": None, "distributed.moe": None,
}
"""Field defaults of the keys gplan does not read."""

NO_EFFECT = {
    "distributed.enable_fsdp2_prefetch": "FSDP2's explicit prefetch (the gathers' overlap, within the efficiency "
                                         "gplan calibrates)",
    "distributed.fsdp2_backward_prefetch_depth": "FSDP2's prefetch depth", "distributed.fsdp2_forward_prefetch_depth":
    "FSDP2's prefetch depth", "distributed.enable_compile": "torch.compile: not priced apart — calibrate on your "
    "compiled runs (gplan calibrate)", "distributed.activation_checkpointing_scope": "which towers of a multimodal "
    "model are checkpointed (a language model has one)", "distributed.tp_plan": "a custom tensor-parallel plan "
    "(the same collectives)", "distributed.patch_is_packed_sequence": "packed-sequence attention masks",
    "distributed.pipeline.patch_inner_model": "how the stages are cut from the model",
    "distributed.pipeline.patch_causal_lm_model": "how the stages are cut from the model",
    "distributed.pipeline.pp_seq_len": "the sequence the stages' buffers are shaped for",
    "distributed.moe.ignore_router_for_ac": "the router left out of checkpointing",
    "distributed.moe.wrap_outer_model": "how FSDP wraps the model around its experts",
    "distributed.moe.lm_head_precision": "the head's dtype under expert parallelism",
    "model.backend.experts": "the experts' GEMM kernel: priced as one kernel for all local experts at the fitted "
    "grouped GEMMs' speed, what its published runs' grouped_gemm gmm reached (its CUDA default now, torch_mm, not at "
    "torch._grouped_mm's timed speed) — te's GroupedLinear and torch's loop launch per expert",
}
NOT_PRICED = {
    "distributed.offload_policy": "FSDP's parameters and optimizer on the host (CPUOffloadPolicy)",
    "distributed.autocast_dtype": "autocast over another parameter dtype",
    "distributed.pipeline.pp_schedule_csv": "a schedule from a CSV file",
    "distributed.pipeline.module_fqns_per_model_part": "a hand-made stage split",
    "distributed.moe.mp_policy": "another mixed precision for the experts",
}


def key_class(key: str, value: Any) -> tuple[str, str]:
    """("no effect", why) or ("refused", why) for a recipe key the reader does not read: sections other
    than `distributed` hold no layout (model, data, optimizer, checkpointing, logging)."""
    if key in DEFAULTS and at_default(value, DEFAULTS[key]):
        return "no effect", "at NeMo AutoModel's default"
    refused = next((why for named, why in NOT_PRICED.items() if key.startswith(named + ".")), NOT_PRICED.get(key))
    if refused:  # a section such as offload_policy arrives as its keys
        return "refused", refused
    if key in NO_EFFECT:
        return "no effect", NO_EFFECT[key]
    if key.startswith(("distributed.", "fp8.")):
        return "refused", "would change the layout or its cost"
    return "no effect", "not a layout setting"


def at_default(value: Any, default: Any) -> bool:
    if default is None:
        return value in (None, "None", "none", "null")
    if isinstance(default, bool):
        return str(value).lower() == str(default).lower()
    return value == default or str(value) == str(default)
