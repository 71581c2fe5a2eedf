"""MindFormers' PyNative trainer's layout keys (mindformers/pynative/config/config.py: ParallelismConfig,
RecomputeConfig, SwapConfig, RecomputeCommConfig), named once: read, no effect (why), refused away from their
default (gplan does not price them)."""

from __future__ import annotations

from typing import Any

from gplan.engines.mindformers.flags import by_default

READ = {"parallelism.data_parallel_shard", "parallelism.tensor_parallel", "parallelism.context_parallel",
        "parallelism.pipeline_parallel", "parallelism.pipeline_parallel_interleave_num",
        "parallelism.pipeline_parallel_schedule", "parallelism.pipeline_parallel_layers_per_stage",
        "parallelism.sequence_parallel", "parallelism.expert_parallel", "parallelism.moe_token_dispatcher_type",
        "parallelism.reshard_after_forward_policy", "recompute.mode", "recompute.full_recompute_layer"}
"""The keys this reader prices; the others of `parallelism` and `recompute` are classified by `KEYS`."""

KEYS: dict[str, tuple[str | None, Any]] = {
    # key -> (why it has no effect, or None: refused away from its default; ParallelismConfig's default)
    "parallelism.data_parallel_shard_strategy": ("declared, not read by its trainer (always FSDP)", "optim_grads_params"),
    "parallelism.disable_gradient_division": ("the gradients' sum or mean", True),
    "parallelism.cpu_offload": (None, False), "parallelism.dense_fsdp_shard_size": (None, None),
    "parallelism.context_parallel_method": (None, "colossal"), "parallelism.context_parallel_async": (None, False),
    "parallelism.ulysses_degree_in_cp": (None, None), "parallelism.context_parallel_mask_type": ("the mask", "causal"),
    "parallelism.pipeline_parallel_microbatch_size": ("set by its trainer: the accumulation steps", 1),
    "parallelism.pipeline_parallel_overlap_p2p": (None, False), "parallelism.pipeline_parallel_overlap_b_f": (None, False),
    "parallelism.pipeline_parallel_enable_dxdw_split": (None, False),
    "parallelism.pipeline_parallel_p2p_transport": ("how stages' sends are issued", "plain"),
    "parallelism.enable_mc2": (None, False), "parallelism.enable_loss_parallel": (None, False),
    "parallelism.npu_nums_per_device": ("the NPUs of a server", 8),
    "parallelism.expert_parallel_async_d2h": ("a host copy's overlap", False),
    "parallelism.expert_parallel_use_safe_tokens": ("one zero-weight token per expert", True),
    "parallelism.full_dtensor": (None, False),
    "recompute.select_module": (None, None), "recompute.exclude_op": (None, None),
    "swap.enable": (None, False), "swap.default_prefetch": ("the swaps' prefetch", 1), "swap.layer_swap": (None, None),
    "swap.op_swap": (None, None), "recompute_comm.enable": (None, False), "recompute_comm.select_module": (None, None),
}
SCHEDULES = {"1f1b": "1f1b", "interleaved_1f1b": "interleaved_1f1b", "gpipe": "gpipe"}
"""Its `pipeline_parallel_schedule` values (ParallelismConfig's docstring) as gplan's schedules."""
DISPATCHERS = {"alltoall": "alltoall"}
"""Its token dispatchers gplan prices: `alltoall_deredundancy` (one copy per destination server) is not."""


def key_class(key: str, value: Any) -> tuple[str, str]:
    """("no effect", why) or ("refused", why) for a key the reader does not read (planner.launch.classified)."""
    if key not in KEYS:
        return "refused", "a layout key gplan does not read"
    return by_default(*KEYS[key], value, empty=(None, False, {}, [], ""))
