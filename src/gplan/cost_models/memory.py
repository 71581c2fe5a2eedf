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
from gplan.engines.profile import NO_ENGINE, EngineProfile
from gplan.spec.model import LayerKind, ModelSpec
from gplan.spec.parallel import ParallelConfig
from gplan.spec.training import STATE_DTYPE_BYTES, TrainingSpec

#: fp32 main gradients, as Megatron-LM and FSDP with fp32 reduction keep them.
GRAD_BYTES = 4
#: Bytes of fused attention's saved log-sum-exp per (head, token): one fp32.
FLASH_LSE_BYTES = 4


#: Bytes per element of a linear layer's input kept for its weight gradient in the quantised form it ran in
#: (`MemoryAccounting.quantized_gemm_inputs`): FP8 one byte; MXFP8 one byte and a one-byte scale per 32
#: elements; NVFP4 half a byte and an FP8 scale per 16 — its recipe runs the weight-gradient GEMM in NVFP4 too,
#: on Hadamard-transformed 16×1 blocks (NVIDIA, "Pretraining Large Language Models with NVFP4", 2025, §4).
QUANTIZED_INPUT_BYTES = {"fp8": 1.0, "mxfp8": 1 + 1 / 32, "nvfp4": 0.5 + 1 / 16}


def gemm_input_bytes(training: TrainingSpec) -> float:
    """Bytes per element of a saved GEMM input: quantised where the engine keeps it so, else 16 bits."""
    if training.profile.memory.quantized_gemm_inputs and training.precision in QUANTIZED_INPUT_BYTES:
        return QUANTIZED_INPUT_BYTES[training.precision]
    return training.element_bytes


def attention_block_activation_bytes(model: ModelSpec, shard: Shard, element_bytes: int,
                                     scores: str, kv_seq: int, gemm_input: float | None = None) -> float:
    """One attention block, per micro-batch: its norm input and the projection input (replicated
    unless sp), Q (b·s·h), K and V of this rank's own tokens (b·s·h_kv each: with cp the blocks that
    arrive round the ring are transient, ring attention saves only its own), the output-projection
    input, dropout mask;
    plus, by how the scores are handled: `stored` keeps `(2 + 1 + 2)·a·s·s_kv·b` (softmax, dropout
    mask, dropout output), `flash` keeps one fp32 log-sum-exp per head and token, `recomputed`
    (selective recompute) keeps nothing. The two GEMM inputs (QKV's, the output projection's) at
    `gemm_input` bytes (`gemm_input_bytes`; e by default)."""
    e, b, s, t = element_bytes, shard.batch, shard.seq, shard.tp
    g = e if gemm_input is None else gemm_input
    h, hq, hkv, a = model.hidden_size, model.q_hidden_size, model.kv_hidden_size, model.num_attention_heads
    dropout = model.dropout > 0
    replicated = (e + g) * s * b * h + (s * b * h if dropout else 0)
    sharded = e * s * b * hq + 2 * e * s * b * hkv + g * s * b * hq
    if scores == "flash":
        sharded += FLASH_LSE_BYTES * a * s * b
    elif scores == "stored":
        sharded += (2 + (1 + 2 if dropout else 0)) * a * s * kv_seq * b
    return replicated / (t if shard.sp else 1) + sharded / t


def mlp_width(model: ModelSpec, kind: LayerKind) -> int:
    """The tp-split MLP a layer runs itself: the dense MLP, or in an MoE layer its shared experts (0
    without them; the routed experts are cost_models.experts')."""
    return model.shared_expert_ffn_size if kind.moe else model.ffn_size


def mlp_block_activation_bytes(model: ModelSpec, shard: Shard, element_bytes: int, width: int | None = None,
                               gemm_input: float | None = None, unfused_swiglu: bool = False) -> float:
    """One MLP block: its norm input and first-GEMM input (replicated unless sp), the activation's
    input and output (gelu: 2·s·b·f; fused swiglu: gate and up in, product out: 3·s·b·f), dropout mask;
    f the block's own MLP width (`mlp_width`). The GEMM inputs (the first GEMM's, and the activation's
    output, the second's) at `gemm_input` bytes."""
    e, b, s, t = element_bytes, shard.batch, shard.seq, shard.tp
    g = e if gemm_input is None else gemm_input
    h, f = model.hidden_size, model.ffn_size if width is None else width
    replicated = (e + g) * s * b * h + (s * b * h if model.dropout > 0 else 0)
    return replicated / (t if shard.sp else 1) + mlp_intermediate_bytes(model, shard, e, f, g, unfused_swiglu)


def mlp_intermediate_bytes(model: ModelSpec, shard: Shard, element_bytes: int, width: int, gemm_input: float,
                           unfused_swiglu: bool = False) -> float:
    """An MLP's intermediates on one tp rank: the activation's input (swiglu: gate and up, 2·f; else f) and its
    output, the second GEMM's input, at `gemm_input` bytes: `s·b·f·(e·(2|1) + g)/t`; a SwiGLU run as separate
    ops (`MemoryAccounting.unfused_swiglu`) keeps the SiLU's output too, one more `e·f`."""
    return shard.tokens * width * (element_bytes * activation_inputs(model, unfused_swiglu) + gemm_input) / shard.tp


def activation_inputs(model: ModelSpec, unfused_swiglu: bool = False) -> int:
    """f-wide tensors an MLP's activation keeps for its backward besides its output: swiglu's gate and up (and the
    SiLU's output where it runs as its own op, `MemoryAccounting.unfused_swiglu`), else its one input."""
    return (3 if unfused_swiglu else 2) if model.ffn_kind == "swiglu" else 1


def layer_activation_bytes(model: ModelSpec, kind: LayerKind, shard: Shard, element_bytes: int,
                           flash: bool, recompute: str, gemm_input: float | None = None,
                           unfused_swiglu: bool = False) -> float:
    """Bytes one layer keeps for its backward, per micro-batch in flight.

    full: only the layer input `2·s·b·h` (/t with sp); selective: everything but the attention
    scores (they are recomputed); none: everything."""
    if recompute == "full":
        return element_bytes * shard.seq * shard.batch * model.hidden_size / (shard.tp if shard.sp else 1)
    scores = "flash" if flash else ("recomputed" if recompute == "selective" else "stored")
    blocks = 2 if kind.cross_attention else 1
    total = blocks * attention_block_activation_bytes(model, shard, element_bytes, scores, shard.kv_seq, gemm_input)
    return total + mlp_block_activation_bytes(model, shard, element_bytes, mlp_width(model, kind), gemm_input,
                                              unfused_swiglu)


def embedding_activation_bytes(model: ModelSpec, shard: Shard) -> float:
    """Embedding dropout mask `s·b·h` (1 byte) when the model uses dropout; the embedding output
    itself is the first layer's input and counted there."""
    return shard.seq * shard.batch * model.hidden_size / (shard.tp if shard.sp else 1) if model.dropout > 0 else 0.0


def head_activation_bytes(model: ModelSpec, shard: Shard, element_bytes: int, engine: EngineProfile = NO_ENGINE,
                          bf16_loss: bool = False, compiled_loss: bool = False, chunks: int = 1) -> float:
    """Final norm input and logits-GEMM input (`2·e·s·b·h`), the 16-bit logits and their fp32 copy
    for the loss (`(e + 4)·s·b·V / t`, vocab-parallel) — only the 16-bit logits where the engine's fused
    cross-entropy keeps no fp32 copy (`MemoryAccounting.fp32_logits`: llm-foundry's) or the loss is compiled
    (`compiled_loss`: Inductor replays the upcast in the backward from the 16-bit logits it saves); the copy in
    16 bits where the loss runs on the 16-bit logits (`bf16_loss`: `(e + e)·s·b·V / t`). With the loss in
    `chunks` > 1 (torchtitan 0.3's ChunkedLossWrapper: each chunk's logits made, lost and differentiated in the
    forward) no logits are kept to the backward: only the hidden states' gradient the chunks accumulated, cast to
    their dtype and saved for the decoder's backward (`e·s·b·h`, replicated over tp); the chunks' logits and the
    fp32 accumulator are `loss_working_bytes`."""
    s, b = shard.seq, shard.batch
    hidden = 2 * element_bytes * s * b * model.hidden_size / (shard.tp if shard.sp else 1)
    if chunks > 1:
        return hidden + element_bytes * s * b * model.hidden_size
    return hidden + kept_bytes_per_logit(element_bytes, engine, bf16_loss, compiled_loss) * s * b * model.vocab_size / shard.tp


def kept_bytes_per_logit(element_bytes: int, engine: EngineProfile = NO_ENGINE, bf16_loss: bool = False,
                         compiled_loss: bool = False) -> float:
    """The forward's bytes per logit kept for the loss's backward (`head_activation_bytes`): the 16-bit logits and,
    where the engine keeps one and the loss is not compiled, their copy in the loss's dtype."""
    copy = engine.memory.fp32_logits and not compiled_loss
    return element_bytes + ((element_bytes if bf16_loss else 4) if copy else 0)


# ---- working sets of the backward -------------------------------------------------------------

def recompute_working_bytes(model: ModelSpec, kind: LayerKind, shard: Shard, element_bytes: int, flash: bool,
                            recompute: str, unfused_swiglu: bool = False) -> float:
    """What recomputation recreates for one layer while its backward runs (one micro-batch): full
    recompute replays the whole forward, so the layer's full activations exist again beside the ones
    kept; selective replays the attention scores (nothing to keep with fused attention). Checkmate
    (Jain et al. 2020) and Megatron's `CheckpointFunction` hold exactly the recomputed segment."""
    if recompute == "full":
        return layer_activation_bytes(model, kind, shard, element_bytes, flash, "none", unfused_swiglu=unfused_swiglu)
    if recompute == "selective":
        return stored_scores_bytes(model, kind, shard, flash)
    return 0.0


def stored_scores_bytes(model: ModelSpec, kind: LayerKind, shard: Shard, flash: bool) -> float:
    """What unfused attention stores per layer past its Q, K, V: scores, softmax and dropout,
    `(2 + 1 + 2)·a·s·s_kv·b/t` (Korthikanti et al. 2022, §4.1) — the `stored` term of
    `attention_block_activation_bytes`; fused attention stores none of it."""
    if flash:
        return 0.0
    blocks = 2 if kind.cross_attention else 1
    per_score = 2 + (1 + 2 if model.dropout > 0 else 0)
    return blocks * per_score * model.num_attention_heads * shard.seq * shard.kv_seq * shard.batch / shard.tp


def gradient_working_bytes(model: ModelSpec, shard: Shard, element_bytes: int, kind: LayerKind | None = None) -> float:
    """The gradients in flight in one layer's backward: the incoming and outgoing activation gradients
    (`2·e·s·b·h`, /t with sp) and the MLP's widest intermediate gradient (`2·e·s·b·f/t`, gate and up for
    swiglu; f the layer's own MLP, `mlp_width`); with sequence parallelism, the layer input is all-gathered
    again for the weight gradients (`e·s·b·h`, not divided: Korthikanti et al. 2022, §4.2.2)."""
    e, s, b, t = element_bytes, shard.seq, shard.batch, shard.tp
    h, f = model.hidden_size, model.ffn_size if kind is None else mlp_width(model, kind)
    hidden = 2 * e * s * b * h / (t if shard.sp else 1)
    mlp = (3 if model.ffn_kind == "swiglu" else 2) * e * s * b * f / t
    regather = e * s * b * h if shard.sp else 0.0
    return hidden + mlp + regather


def loss_working_bytes(model: ModelSpec, shard: Shard, element_bytes: int, engine: EngineProfile = NO_ENGINE,
                       bf16_loss: bool = False, compiled_loss: bool = False, chunks: int = 1) -> float:
    """The loss backward over the vocabulary (vocab-parallel), beside the 16-bit logits and fp32
    softmax the forward kept (head_activation_bytes), per logit: Megatron's vocab-parallel cross-entropy
    (Megatron-LM, Megatron-DeepSpeed, MindSpore's stack) writes the gradient into its softmax buffer and
    casts it to 16 bits for the head's backward: `e`; PyTorch's `F.cross_entropy` on fp32 logits (gplan's
    worker, torchtitan) allocates the fp32 gradient and its 16-bit copy: `4 + e`; llm-foundry's fused
    cross-entropy (flash-attn's, `inplace_backward`) works in place: nothing. On the 16-bit logits (`bf16_loss`)
    the gradient is 16-bit too: `e + e`. A compiled loss (`compiled_loss`) writes the 16-bit gradient from one fused
    kernel, no fp32 one before it: `e`. With the loss in `chunks` > 1, one chunk's logits, the copy and the gradient
    at a time — (kept + gradient) bytes per logit over `chunks` — beside the fp32 accumulator of the hidden states'
    gradient (`GradAccumulator`, `4·s·b·h`)."""
    fp32_grad = element_bytes if compiled_loss else (element_bytes if bf16_loss else 4) + element_bytes
    per_logit = {"in_place": element_bytes, "fp32_grad": fp32_grad, "fused": 0}[engine.memory.loss_grad]
    logits = shard.seq * shard.batch * model.vocab_size / shard.tp
    if chunks > 1:
        chunk = (per_logit + kept_bytes_per_logit(element_bytes, engine, bf16_loss, compiled_loss)) * logits / chunks
        return chunk + 4 * shard.seq * shard.batch * model.hidden_size
    return per_logit * logits


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


def deepspeed_bf16_optimizer(bf16: bool, zero: int) -> bool:
    """Whether DeepSpeed runs its BF16 optimizer (bf16 with ZeRO-1), which accumulates gradients in full-size
    fp32 buffers and reduces those."""
    return bf16 and zero == 1


#: Adam's fp32 master weight and its two fp32 moments, per parameter (Megatron's `theoretical_memory_usage`: 12).
MIXED_ADAM_STATE_BYTES = 12.0


def adam_state_bytes(training: TrainingSpec) -> float:
    """Bytes of Adam's state per parameter under mixed precision: master weight + first + second moment — 4 + 4 + 4,
    or as Megatron-LM's precision-aware optimizer keeps them (`TrainingSpec.precision_aware_optimizer`): the
    moments in their dtype (`adam_moments`: 4, 2 or 1 byte each); the master weights in fp16 (2), else as the
    16-bit remainder of the bf16 weight (2: Transformer Engine FusedAdam's `store_param_remainders`, default on,
    "works only when param type is BF16 and master weight type is FP32") where Megatron-core hands them to
    FusedAdam — not under an FP8 recipe, for which it keeps fp32 master shards itself (4: OptimizerConfig's
    `use_precision_aware_optimizer_no_fp8_or_ds_fp8`, delayed scaling excepted, which gplan's fp8 is not;
    `keeps_master_remainders`)."""
    if not training.precision_aware_optimizer:
        return MIXED_ADAM_STATE_BYTES
    moments = 2 * STATE_DTYPE_BYTES[training.adam_moments]
    return (2 if training.master_weights == "fp16" or keeps_master_remainders(training) else 4) + moments


def device_adam_bytes(training: TrainingSpec) -> float:
    """Adam's state per parameter left on the device: what the host does not keep (`optimizer_offload`)."""
    return adam_state_bytes(training) * (1 - training.optimizer_offload)


def keeps_master_remainders(training: TrainingSpec) -> bool:
    """Whether the fp32 master weights are kept as the bf16 weights' missing 16 bits: the precision-aware optimizer
    with fp32 master weights on a bf16 run (an FP8 or NVFP4 recipe's master shards stay whole: gplan prices NVFP4
    with the FP8 recipes, unverified)."""
    return training.precision_aware_optimizer and training.master_weights == "fp32" and training.precision == "bf16"


def fsdp_kept_bytes(element_bytes: int, pure_bf16: bool) -> float:
    """Bytes of one sharded weight, gradient or Adam moment under FSDP: fp32 shards beside a 16-bit param dtype,
    the training dtype itself under full-bf16 training (`pure_bf16`)."""
    return float(element_bytes) if pure_bf16 else 4.0


def state_bytes_per_param(element_bytes: int, zero: int, shard_ranks: int, engine: EngineProfile = NO_ENGINE,
                          bf16: bool = False, grad_bytes: int = GRAD_BYTES, pure_bf16: bool = False,
                          optimizer_in_backward: bool = False, unsharded_grads: bool = False,
                          stays_gathered: bool = False, adam_bytes: float = MIXED_ADAM_STATE_BYTES,
                          offloaded: bool = False) -> StateBytes:
    """What one parameter costs each device, as the engine keeps it (`MemoryAccounting.states`; d = the
    sharding ranks).

    mixed_precision — Megatron-LM (and MindSpore's optimizer parallel, and plans with no engine): 16-bit weights, fp32
    main gradients (`grad_bytes`: 2 where they are reduced in bf16), fp32 master + Adam m, v (`adam_bytes`: 12, less
    under Megatron's precision-aware optimizer, `adam_state_bytes`) — 18 bytes (Megatron's `theoretical_memory_usage`),
    `6 + 12/d` with the distributed optimizer (zero 1), gradients sharded with zero 2, everything
    with zero 3 (Megatron-FSDP); plain fp32 training keeps no master copy (8 bytes of optimizer).
    fsdp — torch (gplan's worker), torchtitan and llm-foundry: without FSDP the weights stay fp32 under autocast — fp32
    weights, gradients, m, v: 16 bytes; FSDP2 with a 16-bit param dtype shards fp32 weights, fp32
    gradients and m, v (16/d), and zero 1/2 (no resharding after the forward) also hold every 16-bit
    weight gathered from the forward to the backward; full-bf16 training (`pure_bf16`, torchtitan's
    `training.dtype = "bfloat16"`) keeps all of it in bf16, no fp32 copy: 2 + 2 + 4 bytes, sharded alike; with the
    optimizer stepped in the backward (`optimizer_in_backward`) each gradient is freed at its step: none held;
    where FSDP accumulates across micro-batches without reducing (`unsharded_grads`: torch's pipelining runs every
    backward of a run with `set_requires_gradient_sync(False)`, NeMo AutoModel every micro-batch but a step's last),
    each gradient is held whole until the reduction, beside the shard that reduction yields (FSDP2's
    `unsharded_accumulated_grad`, in the reduce dtype); under torch's pipelining the 16-bit weights stay gathered
    after each backward even with zero 3 (`stays_gathered`: `set_reshard_after_backward(False)`). With FSDP's CPU
    offload (`offloaded`) the shards, their gradients and Adam's states are the host's: the device keeps only what is
    gathered or accumulated whole.
    zero_optimizers — DeepSpeed: 16-bit weights and gradients; fp16 (and ZeRO ≥ 2) keeps fp32 master, m, v and an fp32
    gradient partition per rank (`stage_1_and_2.py`: `single_partition_of_fp32_groups`) — 16/d bytes;
    bf16 with ZeRO-1 runs the BF16 optimizer, which accumulates gradients in full-size fp32 buffers
    (`bf16_optimizer.py`: `fp32_groups_gradients`) — 4 more bytes, unsharded."""
    e, d, rule = element_bytes, shard_ranks, engine.memory.states
    if rule == "fsdp":
        kept = fsdp_kept_bytes(e, pure_bf16)  # the dtype weights and gradients are kept in; m and v alike
        grads = 0.0 if optimizer_in_backward else kept
        if offloaded and zero >= 3:  # CPUOffloadPolicy (even on a one-rank mesh): shards, gradients, Adam on the host
            gathered = e if stays_gathered and e < 4 else 0.0
            return StateBytes(weights=gathered, grads=grad_bytes if grads and unsharded_grads else 0.0, optimizer=0.0)
        if zero == 0 or d == 1:
            return StateBytes(weights=kept, grads=grads, optimizer=2 * kept)
        # zero 1/2 keep the 16-bit weights gathered from the forward to the backward; under torch's pipelining
        # zero 3's stay gathered too, each backward leaving them so (`set_reshard_after_backward(False)`)
        gathered = e if (zero < 3 or stays_gathered) and e < 4 else 0.0
        # FSDP2 accumulates an unreduced gradient in the reduce dtype (`to_accumulated_grad_if_needed`): grad_bytes
        held = (grad_bytes if grads else 0.0) + grads / d if unsharded_grads else grads / d
        return StateBytes(weights=kept / d + gathered, grads=held, optimizer=2 * kept / d)
    if rule == "zero_optimizers" and e < 4:
        if deepspeed_bf16_optimizer(bf16, zero):
            return StateBytes(weights=e, grads=e + 4.0, optimizer=12.0 / d)
        return StateBytes(weights=e / (d if zero >= 3 else 1), grads=e / (d if zero >= 2 else 1),
                          optimizer=16.0 / (d if zero >= 1 else 1))
    optimizer = adam_bytes if e < 4 else 8.0
    return StateBytes(
        weights=e / (d if zero >= 3 else 1),
        grads=grad_bytes / (d if zero >= 2 else 1),
        optimizer=optimizer / (d if zero >= 1 else 1),
    )


def reduced_grad_bytes(element_bytes: int, zero: int, engine: EngineProfile = NO_ENGINE, bf16: bool = False,
                       grad_bytes: int = GRAD_BYTES, pure_bf16: bool = False) -> int:
    """Bytes per gradient element the data-parallel reduction moves: the gradients as the engine keeps them
    (`state_bytes_per_param`). DeepSpeed reduces its 16-bit gradients (its engine's `allreduce_gradients`
    and ZeRO's reduce-scatter run in the model's dtype unless `communication_data_type` says otherwise), except
    that its BF16 optimizer (bf16 with ZeRO-1) reduces the fp32 buffers it accumulates into; the others
    their main gradients (`grad_bytes`: fp32 unless reduced in bf16) — on an FSDP engine the reduce dtype is FSDP2's
    (its MixedPrecisionPolicy), so without FSDP (zero 0: DDP) the gradients go in the dtype they are kept in:
    fp32, or bf16 in full-bf16 training."""
    if engine.memory.states == "zero_optimizers" and element_bytes < 4:
        return 4 if deepspeed_bf16_optimizer(bf16, zero) else element_bytes
    if engine.memory.states == "fsdp" and zero == 0:
        return element_bytes if pure_bf16 else GRAD_BYTES
    return grad_bytes


def low_precision_weight_bytes(precision: str) -> float:
    """Per parameter of a layer: the quantised copies Transformer Engine keeps of every layer weight for
    its GEMMs, beside the BF16 weight — FP8 with current scaling a row-wise copy and its transpose for the
    backward (1 + 1 bytes); MXFP8 row- and column-wise copies, each with a one-byte scale per 32 elements
    (2 + 2/32); NVFP4 two half-byte copies, each with an FP8 scale per 16 (1 + 2/16). The embedding and
    the output layer stay BF16 (TE `Float8Tensor`, `MXFP8Tensor`, `NVFP4Tensor` layouts)."""
    return {"fp8": 2.0, "mxfp8": 2 + 2 / 32, "nvfp4": 1 + 2 / 16}.get(precision, 0.0)


def layer_weight_copy_bytes(training: TrainingSpec, config: ParallelConfig) -> float:
    """Per parameter of a layer, what a low-precision recipe adds to its 16-bit weight: the quantised copies
    (`low_precision_weight_bytes`), less the 16-bit weight itself where the weights are kept only quantised
    (`fp8_param_gather`). With zero 3 a rank keeps them of its own shard only, as it keeps the weights
    (Megatron-FSDP and FSDP2 quantise the unit they gather; the gathered unit is `zero3_gather_buffer_bytes`'s)."""
    copies = low_precision_weight_bytes(training.precision)
    extra = copies - training.element_bytes if training.fp8_param_gather and copies else copies
    return extra / zero_shard_ranks(config) if config.zero >= 3 else extra


def zero3_gather_buffer_bytes(unit_params: list[float], element_bytes: int, engine: EngineProfile = NO_ENGINE) -> float:
    """FSDP keeps the unit being computed and the prefetched next one gathered (16-bit weights), plus one
    unit's unsharded fp32 gradients before its reduce-scatter: the two largest units of the stage (layers,
    the embedding, the head — a 250k vocabulary's embedding is larger than a layer) and the largest one's
    gradients. FSDP1's BACKWARD_POST frees a unit's weights before it gathers the next: one unit and the
    gradients (`EngineProfile.zero3_backward_prefetch`; `torch.distributed.fsdp.BackwardPrefetch`).
    DeepSpeed's ZeRO-3 gathers submodule by submodule, at most `zero3_live_params` at once, and
    reduces through its 16-bit bucket (`MemoryAccounting.zero3_live_params`, `reduce_bucket_elements`)."""
    gathered = 2 if engine.zero3_backward_prefetch else 1
    largest = sorted(unit_params, reverse=True)[:gathered]
    accounting = engine.memory
    if accounting.zero3_live_params:
        live = min(sum(largest), accounting.zero3_live_params)
        return (live + min(accounting.reduce_bucket_elements, largest[0] if largest else 0.0)) * element_bytes
    return sum(largest) * element_bytes + (largest[0] if largest else 0.0) * GRAD_BYTES


def zero_shard_ranks(config: ParallelConfig) -> int:
    """Megatron's distributed optimizer and FSDP shard over the data-parallel ranks, cp included."""
    return config.dp * config.cp


def engine_buffer_bytes(engine: EngineProfile, zero: int, element_bytes: int, stage_params: float) -> float:
    """Buffers an engine allocates besides the states: a ZeRO 1/2 reduce bucket (DeepSpeed's; at most the
    stage's own gradients)."""
    bucket = engine.memory.reduce_bucket_elements
    if bucket and zero in (1, 2):
        return min(bucket, stage_params) * element_bytes
    return 0.0


def communicator_count(config: ParallelConfig, tied_pair: bool, experts: bool = False) -> int:
    """NCCL communicators one device holds: one per group of more than one member it communicates in —
    tp, cp, the data-parallel gradient group (dp·cp), the pipeline neighbours (one per direction; a
    p2p pair is its own communicator), the tied embedding's first/last pair, and with experts the ep
    group, etp, and the expert data-parallel group where it is not the dp·cp one. ProcessGroupNCCL builds
    each lazily at its first collective, so groups never used cost nothing."""
    c = config
    groups = [c.tp > 1, c.cp > 1, c.dp * c.cp > 1, c.pp > 1, c.pp > 1, tied_pair]
    if experts:
        groups += [c.ep > 1, c.etp > 1, c.edp > 1 and (c.ep > 1 or c.etp > 1)]
    return sum(groups)


def fragmentation_fraction(device_fraction: float, engine: EngineProfile, zero: int = 0) -> float:
    """The device's allocator reserve, or the engine's where its measured peaks show more
    (`MemoryAccounting.fragmentation`: Megatron-DeepSpeed's pipeline engine, fitted on the BLOOM sweep;
    `zero3_fragmentation`: its ZeRO-3 engine, bracketed by SC21's runs; README)."""
    accounting = engine.memory
    engine_fraction = accounting.fragmentation
    if zero >= 3 and accounting.zero3_fragmentation is not None:
        engine_fraction = accounting.zero3_fragmentation
    return max(device_fraction, engine_fraction)


def fragmentation_bytes(allocated_bytes: float, fraction: float) -> float:
    """The caching allocator's reserve beyond what is allocated: a fraction of it."""
    return allocated_bytes * fraction
