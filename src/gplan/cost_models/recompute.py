"""Selective recompute module by module: Megatron-core's `--recompute-granularity selective
--recompute-modules …` (spec.parallel.RECOMPUTE_MODULES).

A recomputed module keeps its input for the backward (a checkpoint holds the inputs of the function it
wraps) and drops what it saved inside; the backward replays its forward just before its own backward,
so what it dropped exists again for that moment. For each module, on one device and per micro-batch of
one layer, this file gives the bytes it no longer keeps (`dropped_bytes`) — the same terms
cost_models.memory counts for a layer that recomputes nothing, so a layer's selective bytes are its
`none` bytes minus these — and what its replay recreates (`working_bytes`). Replay times are priced by
`StepModel.layer_recompute_s` from the same forward pieces the layer's time is made of.

Where each module sits (megatron/core/transformer): `core_attn` wraps the attention core
(`attention.py`, `_checkpointed_attention_forward`); `layernorm` the two pre-norms, whose outputs are
released once the next GEMM has consumed them (`transformer_layer.py`, CheckpointWithoutOutput);
`mlp` a dense layer's MLP and `moe` the whole MoE layer (`transformer_layer.py`, `_forward_mlp`);
`moe_act` the routed experts' activation (`moe/experts.py`: the fc1 output is kept, its activation
recomputed); `shared_experts` the shared MLP (`moe/shared_experts.py`); `mla_up_proj` latent
attention's up-projections and rotary embedding (`multi_latent_attention.py`: the compressed latents
are kept, the per-head queries, keys and values recomputed).

`op` is torchtitan's per-operator selective AC instead (`SelectiveAC`, torchtitan 0.3.0
`distributed/activation_checkpoint.py`): one policy over the whole block that keeps the outputs of every
other matmul, of attention, of the reduce-scatters and all-to-alls, and replays the rest — priced from
what it keeps (`per_op_kept_bytes`) rather than from what it drops.
"""

from __future__ import annotations

from gplan.cost_models import compute, experts, memory
from gplan.cost_models.compute import Gemm, Shard
from gplan.spec.model import LayerKind, ModelSpec
from gplan.spec.parallel import ParallelConfig


def norm_output_bytes(model: ModelSpec, shard: Shard, element_bytes: int) -> float:
    """layernorm: the two pre-norms' outputs, the QKV GEMM's and the MLP's (or router's) input,
    `2·e·s·b·h` (/t with sp)."""
    return 2 * element_bytes * shard.tokens * model.hidden_size / (shard.tp if shard.sp else 1)


def dense_mlp_bytes(model: ModelSpec, kind: LayerKind, shard: Shard, element_bytes: int, gemm_input: float) -> float:
    """mlp: a dense layer's MLP intermediates (`memory.mlp_intermediate_bytes`); the MLP's input stays as
    the checkpoint's. An MoE layer has no dense MLP."""
    return 0.0 if kind.moe else memory.mlp_intermediate_bytes(model, shard, element_bytes, model.ffn_size, gemm_input)


def shared_experts_bytes(model: ModelSpec, kind: LayerKind, shard: Shard, element_bytes: int,
                         gemm_input: float) -> float:
    """shared_experts: the shared MLP's intermediates, as `dense_mlp_bytes` at their joint width."""
    if not kind.moe or not model.shared_expert_ffn_size:
        return 0.0
    return memory.mlp_intermediate_bytes(model, shard, element_bytes, model.shared_expert_ffn_size, gemm_input)


def moe_act_bytes(model: ModelSpec, kind: LayerKind, shard: Shard, config: ParallelConfig, gemm_input: float) -> float:
    """moe_act: the routed experts' activation output per token-expert pair, `g·f/etp` (kept as the second
    grouped GEMM's input) — the fc1 output it is recomputed from stays."""
    if not kind.moe:
        return 0.0
    return experts.routed_pairs(model, shard, config.etp) * gemm_input * model.expert_ffn_size / config.etp


def moe_layer_bytes(model: ModelSpec, kind: LayerKind, shard: Shard, config: ParallelConfig,
                    element_bytes: int, gemm_input: float) -> float:
    """moe: everything the MoE layer saved past its input — the routed side (permuted tokens, expert
    intermediates, router scores: `experts.routed_activation_bytes`) and the shared experts."""
    if not kind.moe:
        return 0.0
    routed = experts.routed_activation_bytes(model, shard, config, element_bytes, gemm_input)
    return routed + shared_experts_bytes(model, kind, shard, element_bytes, gemm_input)


def latent_up_projection_bytes(model: ModelSpec, shard: Shard, element_bytes: int) -> float:
    """mla_up_proj: the per-head queries, keys and values `e·s·b·(h_q + 2·h_kv)/t` the up-projections made,
    less the compressed latents (`r_q + r_kv + d_rope`, replicated over tp) that stay to recompute them."""
    if not model.is_mla:
        return 0.0
    per_head = element_bytes * shard.tokens * (model.q_hidden_size + 2 * model.kv_hidden_size) / shard.tp
    latents = element_bytes * shard.tokens * ((model.q_lora_rank or 0) + model.kv_lora_rank + model.qk_rope_head_dim)
    return max(0.0, per_head - latents)


def dropped_bytes(module: str, model: ModelSpec, kind: LayerKind, shard: Shard, config: ParallelConfig,
                  element_bytes: int, flash: bool, gemm_input: float | None = None) -> float:
    """What recomputing `module` takes off a layer's kept activations (per micro-batch); the GEMM inputs it
    held at `gemm_input` bytes (`memory.gemm_input_bytes`, as the layer kept them; e by default)."""
    e = element_bytes
    g = e if gemm_input is None else gemm_input
    return {
        "core_attn": lambda: memory.stored_scores_bytes(model, kind, shard, flash),  # nothing under fused attention
        "layernorm": lambda: norm_output_bytes(model, shard, e),
        "mlp": lambda: dense_mlp_bytes(model, kind, shard, e, g),
        "moe": lambda: moe_layer_bytes(model, kind, shard, config, e, g),
        "moe_act": lambda: moe_act_bytes(model, kind, shard, config, g),
        "shared_experts": lambda: shared_experts_bytes(model, kind, shard, e, g),
        "mla_up_proj": lambda: latent_up_projection_bytes(model, shard, e),
    }[module]()


def effective_modules(modules: tuple[str, ...]) -> tuple[str, ...]:
    """`moe` recomputes the whole layer, so the experts' activation and the shared experts inside it are
    not counted twice (Megatron-core skips moe_act's own checkpoint under moe)."""
    if "moe" in modules:
        return tuple(m for m in modules if m not in ("moe_act", "shared_experts"))
    return modules


ROUTED_MODULES = ("moe", "moe_act")
"""Modules whose drops are the routed side's, scaled by the routing imbalance like the rest of it."""


def module_drops(modules: tuple[str, ...], model: ModelSpec, kind: LayerKind, shard: Shard, config: ParallelConfig,
                 element_bytes: int, flash: bool, imbalance: float = 1.0, gemm_input: float | None = None) -> list[float]:
    """Each recomputed module's drop on the busiest device. A layer keeps their sum less (each module's
    saved tensors are its own); the replays recreate the largest one at once (modules are replayed one at
    a time, each just before its own backward)."""
    return [(imbalance if m in ROUTED_MODULES else 1.0)
            * dropped_bytes(m, model, kind, shard, config, element_bytes, flash, gemm_input)
            for m in effective_modules(modules)]


# ---- torchtitan's per-operator selective AC (`op`) ----------------------------------------------------
# torchtitan 0.3.0 `SelectiveAC._wrap_block`: every output of an op in its save list is kept, except that
# matmuls (aten.mm, aten.linear) alternate — the 1st, 3rd, 5th… of the block kept, the others replayed;
# the save list holds torch's compute-intensive ops (`get_default_op_list`: mm, addmm, bmm, _scaled_mm,
# SDPA) and the reduce-scatter and all-to-all collectives; the router's gate is forced to replay and not
# counted. The same alternation as its 2024 releases (`_op_sac_save_list`, `mm_count_key`).

#: Precisions whose linear layers run torchao's `torch._scaled_mm` (a compute-intensive op that is not a
#: counted matmul): every GEMM output of the block is kept.
SCALED_MM_PRECISIONS = frozenset({"fp8", "fp8-rowwise", "mxfp8"})


def per_op_matmuls(model: ModelSpec, kind: LayerKind, shard: Shard) -> list[Gemm]:
    """A block's weight GEMMs on one tp rank in the order torchtitan's models run them: wq, wk, wv, wo (MLA:
    wq_a, wq_b, wkv_a, wkv_b, wo); the dense MLP or the shared experts' w1, w3, w2. A row-parallel GEMM's
    output is the whole `s·b·h` partial sum before its reduce-scatter. Routed experts run `_grouped_mm`,
    not in the save list: replayed."""
    h, n, t = model.hidden_size, shard.tokens, shard.tp
    if model.is_mla:
        a, v, r_q = model.num_attention_heads, model.v_head_dim or model.kv_channels, model.q_lora_rank
        q_up, kv_up = compute.latent_up_gemms(model, shard)
        q_down = [Gemm(n, r_q, h)] if r_q else []
        attention = q_down + [q_up, Gemm(n, model.kv_lora_rank + model.qk_rope_head_dim, h), kv_up, Gemm(n, h, a * v // t)]
    else:
        hq, hkv = model.q_hidden_size, model.kv_hidden_size
        attention = [Gemm(n, hq // t, h), Gemm(n, hkv // t, h), Gemm(n, hkv // t, h), Gemm(n, h, hq // t)]
    width = model.shared_expert_ffn_size if kind.moe else model.ffn_size
    ups = 2 if model.ffn_kind == "swiglu" else 1
    mlp = [Gemm(n, width // t, h)] * ups + [Gemm(n, h, width // t)] if width else []
    return attention * (2 if kind.cross_attention else 1) + mlp


def per_op_split(model: ModelSpec, kind: LayerKind, shard: Shard, precision: str) -> tuple[list[Gemm], list[Gemm]]:
    """(kept, replayed) GEMMs of a block under the per-op policy: alternating from the first, or all kept
    where the linears run `_scaled_mm` (`SCALED_MM_PRECISIONS`)."""
    matmuls = per_op_matmuls(model, kind, shard)
    if precision in SCALED_MM_PRECISIONS:
        return matmuls, []
    return matmuls[0::2], matmuls[1::2]


def per_op_kept_bytes(model: ModelSpec, kind: LayerKind, shard: Shard, config: ParallelConfig, element_bytes: int,
                      precision: str, imbalance: float = 1.0) -> float:
    """What a block keeps under the per-op policy, per micro-batch: its input (the checkpoint's, /t with sp),
    the kept GEMM outputs, attention's output and fp32 log-sum-exp, with sp the two reduce-scatters' outputs,
    and in an MoE layer the all-to-all's received tokens, dispatch and combine (ep > 1)."""
    e, n, t = element_bytes, shard.tokens, shard.tp
    sp = t if shard.sp else 1
    kept_gemms, _ = per_op_split(model, kind, shard, precision)
    blocks = 2 if kind.cross_attention else 1
    a = model.num_attention_heads
    context = a * (model.v_head_dim or model.kv_channels) if model.is_mla else model.q_hidden_size
    attention_out = blocks * n * (e * context + memory.FLASH_LSE_BYTES * a) / t
    scattered = 2 * e * n * model.hidden_size / t if shard.sp else 0.0
    kept = e * n * model.hidden_size / sp + e * sum(g.m * g.n for g in kept_gemms) + attention_out + scattered
    if kind.moe and config.ep > 1:
        kept += imbalance * 2 * experts.dispatch_bytes(model, shard, e)
    return kept
