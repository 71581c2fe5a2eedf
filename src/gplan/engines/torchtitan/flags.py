"""torchtitan's job-config keys as gplan reads them: read, no effect (why), or refused away from their default (why). Defaults: torchtitan's job config (torchtitan/config/job_config.py ≤ 0.2, torchtitan/config/configs.py 0.3). A key at its default is never refused."""

from __future__ import annotations

import re
from typing import Any


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
    "compile.enable": "torch.compile of the model is not priced apart (calibrate on your compiled runs: gplan "
    "calibrate); of the loss, read as --compiled-loss",
    "compile.components": "what torch.compile compiles: \"loss\" read as --compiled-loss, \"model\" not priced apart",
    "training.compile": "torch.compile (torchtitan ≤ 0.2's switch) of the model is not priced apart (calibrate on your "
    "compiled runs: gplan calibrate); of the loss, read as --compiled-loss", "compile.backend": "torch.compile's backend",
}
TITAN_NOT_LAYOUT = {"training.max_norm", "training.steps", "training.gc_freq", "training.gc_debug",
                    "training.dataset", "training.dataset_path"}
"""Keys of the sections gplan reads that are no layout setting (clipping, schedule, garbage collection)."""
#: Keys gplan cannot price when set away from their default.
TITAN_NOT_PRICED = {
    "parallelism.pipeline_parallel_schedule_csv": "a schedule from a CSV file",
    "activation_checkpoint.memory_budget": "torch.compile's memory-budget recompute",
}
TITAN_LAYOUT_LIKE = re.compile(r"^(parallelism|activation_checkpoint)\.|batch|seq_len")
"""Unread keys that would change the layout or its cost. The float8/mx/quantize sections count only when
`model.converters` turns them on (torchtitan's TOMLs carry them switched off)."""


TITAN_ADAM = ("Adam", "AdamW")
"""The optimizers gplan prices (Adam's two fp32 moments and master weights; AdamW's decay costs nothing more):
≤ 0.2's `optimizer.name`, 0.3's `default_adamw(...)` param group (components/optimizer/optimizer.py)."""


def titan_optimizer_class(key: str, value: Any) -> tuple[str, str] | None:
    """An optimizer other than Adam would change the states and the step gplan prices (Adam's): refused, naming it."""
    text = str(getattr(value, "text", value))  # a registry's helper call is kept as its source text
    if key == "optimizer.name":
        adam = text in TITAN_ADAM
    elif key == "optimizer":  # a 0.3 registry's OptimizersContainer, as its helper builds it
        adam = text.startswith("default_adamw(")
    else:
        return None
    return ("no effect", "AdamW, as gplan prices it") if adam else (
        "refused", f"{text} is not Adam: gplan prices Adam's and AdamW's states and step")


def titan_class(key: str, value: Any) -> tuple[str, str]:
    """("no effect", why) or ("refused", why) for a torchtitan key the launch reader does not read."""
    optimizer = titan_optimizer_class(key, value)
    if optimizer is not None:
        return optimizer
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
