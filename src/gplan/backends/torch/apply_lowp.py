"""Low-precision GEMMs with torchao — the library of torchtitan's float8 and MX converters — applied to one
rank's model chunk on the meta device, before tensor parallelism and FSDP (torchtitan's order: convert,
then parallelise).

The plan's precision names the recipe (spec.training.LOW_PRECISION_RECIPES):
  - `fp8`: float8 with per-tensor dynamic scaling (torchao `tensorwise`; Transformer Engine's current
    scaling); with FSDP sharding the weights, they are all-gathered in float8 (torchao's
    `enable_fsdp_float8_all_gather`, one amax all-reduce per step: `precompute_float8_dynamic_scale_for_fsdp`);
  - `fp8-rowwise`: float8 with a scale per row of each operand (torchao `rowwise`, torchtitan's default);
  - `mxfp8`: 8-bit blocks of 32 with a shared power-of-two scale (torchao's MXFP8Linear; Blackwell).
Converted: the layers' linear projections (attention q/k/v/o, MLA's projections, the dense MLPs and the
shared experts) whose both dimensions are multiples of 16 (the FP8 tensor cores' shape rule, which
torchtitan's filter applies too; 32 for MXFP8, its block). Kept in 16 bits, as the cost model prices them: the embedding, the
output head (torchtitan's `filter_fqns=["lm_head"]`), the router, the routed experts' grouped weights,
the attention core and the norms. Tensor parallelism keeps its 16-bit collectives around the float8
GEMMs (DTensor's column/row styles, as the cost model prices tp): torchao's float8 styles would
all-gather float8 inputs, which gloo cannot carry and gplan does not price. On CPU torchao's emulated
kernels run the same casts in software.
"""

from __future__ import annotations

import torch
from torch import nn

from gplan.spec.training import LOW_PRECISION_RECIPES

NEEDS_CAPABILITY = {"fp8": (8, 9), "fp8-rowwise": (8, 9), "mxfp8": (10, 0)}
"""CUDA compute capability each recipe's kernels need: float8 tensor cores from Ada/Hopper (sm_89;
torchtitan's float8 converter checks `has_cuda_capability(8, 9)`), MX block scales from Blackwell
(sm_100; its MXFP8 converter checks `has_cuda_capability(10, 0)`)."""

KEPT = ("output", "router")
"""Linear modules left in 16 bits whatever their shape: the head and the MoE router."""


def recipe_of(precision: str) -> str | None:
    """The torchao recipe a plan's precision runs (None: no low-precision GEMMs)."""
    return LOW_PRECISION_RECIPES.get(precision)


def converts(module: nn.Module, fqn: str, multiple: int = 16) -> bool:
    """A linear projection of the layers whose dimensions the recipe's kernels take: multiples of 16 for
    float8 (the tensor cores' shape rule), of 32 for MXFP8 (its scaling blocks)."""
    return (isinstance(module, nn.Linear) and fqn.rsplit(".", 1)[-1] not in KEPT
            and module.in_features % multiple == 0 and module.out_features % multiple == 0)


def shape_multiple(precision: str) -> int:
    return 32 if recipe_of(precision) == "mxfp8" else 16


def check_capability(precision: str, device: torch.device) -> None:
    """Refuse, before the first step, a GPU whose tensor cores lack the recipe's format."""
    if precision not in NEEDS_CAPABILITY or device.type != "cuda":
        return
    have = torch.cuda.get_device_capability(device)
    need = NEEDS_CAPABILITY[precision]
    if have < need:
        name = torch.cuda.get_device_name(device)
        raise RuntimeError(f"{precision} ({recipe_of(precision)}) needs CUDA compute capability {need[0]}.{need[1]} "
                           f"or newer ({'Blackwell' if need[0] >= 10 else 'Ada/Hopper'}); {name} is "
                           f"{have[0]}.{have[1]}: plan with --precision bf16, or run on newer GPUs")


def apply_low_precision(part: nn.Module, precision: str, emulate: bool, fsdp_all_gather: bool) -> int:
    """Swap the chunk's eligible linear layers for torchao's low-precision ones; returns how many.
    `emulate`: software casts and GEMMs (CPU); `fsdp_all_gather`: float8 weights all-gathered by FSDP2
    (the tensorwise recipe only, where FSDP shards the weights)."""
    recipe = recipe_of(precision)
    if recipe is None:
        return 0
    before = sum(1 for _ in _eligible(part, shape_multiple(precision)))
    if recipe == "mxfp8":
        _swap_mxfp8(part, emulate)
    else:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        config = Float8LinearConfig.from_recipe_name(recipe)
        extra = {"emulate": emulate}
        if recipe == "tensorwise":
            extra["enable_fsdp_float8_all_gather"] = fsdp_all_gather
        import dataclasses

        convert_to_float8_training(part, config=dataclasses.replace(config, **extra), module_filter_fn=converts)
    return before


def _eligible(part: nn.Module, multiple: int = 16):
    return ((fqn, m) for fqn, m in part.named_modules() if converts(m, fqn, multiple))


def _swap_mxfp8(part: nn.Module, emulate: bool) -> None:
    """torchao's MXFP8Linear (what torchtitan's MXFP8 converter builds) in place of each eligible
    nn.Linear, the same parameters kept (so meta-device building and initialisation are unchanged)."""
    from torchao.prototype.moe_training.mxfp8_linear import MXFP8Linear
    from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

    preference = KernelPreference.EMULATED if emulate else KernelPreference.AUTO
    for fqn, linear in list(_eligible(part, 32)):
        parent_name, _, name = fqn.rpartition(".")
        parent = part.get_submodule(parent_name) if parent_name else part
        swapped = MXFP8Linear(linear.in_features, linear.out_features, bias=linear.bias is not None,
                              device="meta", kernel_preference=preference)
        swapped.weight, swapped.bias = linear.weight, linear.bias
        setattr(parent, name, swapped)


def after_optimizer_step(parts: list[nn.Module], precision: str, fsdp_all_gather: bool) -> None:
    """Tensorwise float8 with FSDP's float8 all-gather: every weight's scale from one all-reduce of the
    amaxes after the update (torchao's `precompute_float8_dynamic_scale_for_fsdp`)."""
    if recipe_of(precision) == "tensorwise" and fsdp_all_gather:
        from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

        for part in parts:
            precompute_float8_dynamic_scale_for_fsdp(part)


def describe(precision: str, emulate: bool, converted: int, fsdp_all_gather: bool) -> str | None:
    """The recipe as the run report names it."""
    recipe = recipe_of(precision)
    if recipe is None:
        return None
    library = "torchao MXFP8Linear" if recipe == "mxfp8" else f"torchao float8 {recipe}"
    return (f"{library} on {converted} linear layers per rank"
            + (", float8 FSDP all-gather" if fsdp_all_gather else "") + (" (emulated on CPU)" if emulate else ""))
