"""The names a configuration is written in — recompute options and modules, schedules, precisions — kept
apart from the models that use them (spec.parallel, spec.training) so that the command line's help can be
written from them without building those models (start-up time)."""

from __future__ import annotations

from typing import Literal

Recompute = Literal["none", "selective", "full"]
Schedule = Literal["gpipe", "1f1b", "interleaved_1f1b"]
RECOMPUTE_OPTIONS: tuple[Recompute, ...] = ("none", "selective", "full")

RECOMPUTE_MODULES: dict[str, str] = {
    "core_attn": "the attention core (scores, softmax, context)",
    "mlp": "a dense layer's MLP",
    "moe": "the whole MoE layer (router, dispatch, experts, combine)",
    "moe_act": "the routed experts' activation function",
    "shared_experts": "the shared experts' MLP",
    "layernorm": "the two pre-norms (their outputs not kept)",
    "mla_up_proj": "latent attention's up-projections and rotary embedding",
    "op": "every operator but every other matmul, attention and the collectives (torchtitan's per-op policy)",
}
"""What `selective` layers may recompute, module by module: Megatron-core's `--recompute-modules`
(TransformerConfig.__post_init__'s allowed set; core_attn its default), and torchtitan's per-operator
selective AC (`op`, its `selective_ac_option = "op"`: a policy over the whole block, named alone). Each
module's saved and recomputed bytes and time are priced in cost_models.recompute."""
PER_OP_MODULES: tuple[str, ...] = ("op",)
"""torchtitan's per-operator policy as a module set."""
DEFAULT_RECOMPUTE_MODULES: tuple[str, ...] = ("core_attn",)

SCHEDULES: tuple[Schedule, ...] = ("gpipe", "1f1b", "interleaved_1f1b")

Precision = Literal["bf16", "fp16", "fp32", "fp8", "fp8-rowwise", "mxfp8", "nvfp4"]
"""fp8: FP8 GEMMs with per-tensor current scaling (Transformer Engine's `tensorwise`, Megatron-Bridge's
FP8-CS, torchao's `tensorwise`); fp8-rowwise: FP8 with a scale per row of each operand (torchao's
`rowwise`, torchtitan's float8 recipe); mxfp8: FP8 with 32-element block scales (Blackwell); nvfp4: FP4
with 16-element block scales (Blackwell). All keep BF16 activations, weights, attention, norms, softmax
and the loss."""
