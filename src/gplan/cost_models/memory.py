"""Memory per device: model states, activations in flight, buffers (docs/design.md, "Cost model").

Activations are derived term by term from the layer's dataflow as Korthikanti et al. 2022 (§4.1,
Table 2) count them, so that the familiar results fall out as special cases: with 16-bit
activations, 1-byte dropout masks, a 4h gelu MLP and no fused attention, one layer holds
`s·b·h·(34 + 5·a·s/h)` bytes; tp only `s·b·h·(10 + 24/t + 5·a·s/(h·t))`; tp + sp all of it / t;
full recompute `2·s·b·h`. Swiglu, GQA, fused attention and dropout-free models change the terms.
"""

from __future__ import annotations

from dataclasses import dataclass

from gplan.cost_models.compute import Shard
from gplan.spec.model import LayerKind, ModelSpec
from gplan.spec.parallel import ParallelConfig

#: fp32 main gradients, as Megatron-LM and FSDP with fp32 reduction keep them.
GRAD_BYTES = 4
#: Bytes of fused attention's saved log-sum-exp per (head, token): one fp32.
FLASH_LSE_BYTES = 4


def attention_block_activation_bytes(model: ModelSpec, shard: Shard, element_bytes: int,
                                     scores: str, kv_seq: int) -> float:
    """One attention block, per micro-batch: its norm input and the projection input (replicated
    unless sp), Q (b·s·h), K and V of this rank's own tokens (b·s·h_kv each: with cp the blocks that
    arrive round the ring are transient, ring attention saves only its own), the output-projection
    input, dropout mask;
    plus, by how the scores are handled: `stored` keeps `(2 + 1 + 2)·a·s·s_kv·b` (softmax, dropout
    mask, dropout output), `flash` keeps one fp32 log-sum-exp per head and token, `recomputed`
    (selective recompute) keeps nothing."""
    e, b, s, t = element_bytes, shard.batch, shard.seq, shard.tp
    h, hq, hkv, a = model.hidden_size, model.q_hidden_size, model.kv_hidden_size, model.num_attention_heads
    dropout = model.dropout > 0
    replicated = 2 * e * s * b * h + (s * b * h if dropout else 0)
    sharded = e * s * b * hq + 2 * e * s * b * hkv + e * s * b * hq
    if scores == "flash":
        sharded += FLASH_LSE_BYTES * a * s * b
    elif scores == "stored":
        sharded += (2 + (1 + 2 if dropout else 0)) * a * s * kv_seq * b
    return replicated / (t if shard.sp else 1) + sharded / t


def mlp_block_activation_bytes(model: ModelSpec, shard: Shard, element_bytes: int) -> float:
    """One MLP block: its norm input and first-GEMM input (replicated unless sp), the activation's
    input and output (gelu: 2·s·b·f; fused swiglu: gate and up in, product out: 3·s·b·f), dropout mask."""
    e, b, s, t = element_bytes, shard.batch, shard.seq, shard.tp
    h, f = model.hidden_size, model.ffn_size
    replicated = 2 * e * s * b * h + (s * b * h if model.dropout > 0 else 0)
    sharded = e * s * b * f * (3 if model.ffn_kind == "swiglu" else 2)
    return replicated / (t if shard.sp else 1) + sharded / t


def layer_activation_bytes(model: ModelSpec, kind: LayerKind, shard: Shard, element_bytes: int,
                           flash: bool, recompute: str) -> float:
    """Bytes one layer keeps for its backward, per micro-batch in flight.

    full: only the layer input `2·s·b·h` (/t with sp); selective: everything but the attention
    scores (they are recomputed); none: everything."""
    if recompute == "full":
        return element_bytes * shard.seq * shard.batch * model.hidden_size / (shard.tp if shard.sp else 1)
    scores = "flash" if flash else ("recomputed" if recompute == "selective" else "stored")
    blocks = 2 if kind.cross_attention else 1
    total = blocks * attention_block_activation_bytes(model, shard, element_bytes, scores, shard.kv_seq)
    return total + mlp_block_activation_bytes(model, shard, element_bytes)


def embedding_activation_bytes(model: ModelSpec, shard: Shard) -> float:
    """Embedding dropout mask `s·b·h` (1 byte) when the model uses dropout; the embedding output
    itself is the first layer's input and counted there."""
    return shard.seq * shard.batch * model.hidden_size / (shard.tp if shard.sp else 1) if model.dropout > 0 else 0.0


def head_activation_bytes(model: ModelSpec, shard: Shard, element_bytes: int) -> float:
    """Final norm input and logits-GEMM input (`2·e·s·b·h`), the 16-bit logits and their fp32 copy
    for the loss (`(e + 4)·s·b·V / t`, vocab-parallel)."""
    s, b = shard.seq, shard.batch
    hidden = 2 * element_bytes * s * b * model.hidden_size / (shard.tp if shard.sp else 1)
    return hidden + (element_bytes + 4) * s * b * model.vocab_size / shard.tp


# ---- model states ------------------------------------------------------------------------------

@dataclass(frozen=True)
class StateBytes:
    """Per-parameter bytes of weights, gradients and optimizer states on one device."""

    weights: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer


def state_bytes_per_param(element_bytes: int, zero: int, shard_ranks: int) -> StateBytes:
    """Weights (16-bit, or fp32), fp32 gradients, and Adam states (fp32 master + m + v = 12 bytes in
    mixed precision, m + v = 8 in fp32): 18 bytes unsharded in mixed precision (Megatron-LM's
    theoretical_memory_usage), `6 + 12/d` with zero 1 (distributed optimizer), gradients sharded too
    with zero 2, everything with zero 3 (FSDP full shard)."""
    optimizer = 12.0 if element_bytes < 4 else 8.0
    d = shard_ranks
    return StateBytes(
        weights=element_bytes / (d if zero >= 3 else 1),
        grads=GRAD_BYTES / (d if zero >= 2 else 1),
        optimizer=optimizer / (d if zero >= 1 else 1),
    )


def zero3_gather_buffer_bytes(layer_params_per_rank: float, element_bytes: int) -> float:
    """FSDP keeps the layer being computed and the prefetched next one unsharded (weights), plus one
    layer's unsharded fp32 gradients before reduce-scatter."""
    return layer_params_per_rank * (2 * element_bytes + GRAD_BYTES)


def zero_shard_ranks(config: ParallelConfig) -> int:
    """Megatron's distributed optimizer and FSDP shard over the data-parallel ranks, cp included."""
    return config.dp * config.cp
