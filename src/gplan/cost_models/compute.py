"""Compute: FLOPs and time of one transformer layer, the embedding and the head, per micro-batch.

FLOP counts follow Narayanan et al. 2021, eq. 3, generalised to GQA and swiglu.
Times divide each GEMM's FLOPs by `peak × efficiency(GEMM size)`, each fused-attention call's by
`peak × attention efficiency`, and each element-wise kernel's bytes by achieved HBM bandwidth:
small hidden sizes lose to element-wise traffic and small GEMMs, which is why they run further from
peak (the trend in MosaicML's and Megatron's published tables).
"""

from __future__ import annotations

from dataclasses import dataclass

from gplan.numeric import fit_line
from gplan.profiles.schema import DeviceSpec
from gplan.spec.model import LayerKind, ModelSpec
from gplan.spec.parallel import ParallelConfig
from gplan.spec.training import TrainingSpec, tensor_core_format

#: FlashAttention-2 backward runs 5 GEMM-like products against the forward's 2 (it recomputes the
#: scores): 2.5× the forward FLOPs (Dao 2023, §3.1).
FLASH_BACKWARD_FLOP_RATIO = 2.5
#: A GEMM's backward computes the input gradient and the weight gradient: 2× the forward.
GEMM_BACKWARD_FLOP_RATIO = 2.0


@dataclass(frozen=True)
class Gemm:
    """One matrix product C[m×n] = A[m×k]·B[k×n]."""

    m: int
    n: int
    k: int

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k


@dataclass(frozen=True)
class Shard:
    """What one device computes of a micro-batch: tokens after cp, widths after tp."""

    batch: int
    seq: int
    """Query tokens per sequence on this device (s / cp)."""
    kv_seq: int
    """Key tokens each query attends to (the whole sequence, s)."""
    tp: int
    sp: bool

    @property
    def tokens(self) -> int:
        return self.batch * self.seq


def shard_of(training: TrainingSpec, config: ParallelConfig) -> Shard:
    return Shard(batch=config.mbs, seq=training.seq_length // config.cp, kv_seq=training.seq_length,
                 tp=config.tp, sp=config.sp and config.tp > 1)


# ---- FLOPs -------------------------------------------------------------------------------------

def layer_gemms(model: ModelSpec, kind: LayerKind, shard: Shard) -> list[Gemm]:
    """The weight GEMMs of one layer on one tp rank (Megatron column/row split):
    QKV `2·b·s·h·(h_q + 2·h_kv)`, output `2·b·s·h_q·h` (h_q = h unless head_dim says otherwise), MLP
    `2·b·s·h·f·k` (k = 2 gelu/relu, 3 swiglu). MLA: `latent_attention_gemms`. An MoE layer's MLP is its
    router and shared experts here; its routed experts are `cost_models.experts`' grouped GEMMs."""
    attention = latent_attention_gemms(model, shard) if model.is_mla else dense_attention_gemms(model, shard)
    mlp = moe_dense_gemms(model, shard) if kind.moe else mlp_gemms(model, model.ffn_size, shard)
    return attention * (2 if kind.cross_attention else 1) + mlp


def dense_attention_gemms(model: ModelSpec, shard: Shard) -> list[Gemm]:
    h, hq, hkv, t, n = model.hidden_size, model.q_hidden_size, model.kv_hidden_size, shard.tp, shard.tokens
    return [Gemm(n, (hq + 2 * hkv) // t, h), Gemm(n, h, hq // t)]


def latent_attention_gemms(model: ModelSpec, shard: Shard) -> list[Gemm]:
    """MLA (DeepSeek-V2 §2.1): the down-projections to the query rank r_q and to the joint key/value
    rank r_kv (+ the shared rotary key) are replicated on every tp rank (Megatron-core's MLA keeps them
    duplicated); the up-projections to a heads of d_nope + d_rope (queries) and d_nope + d_v (keys and
    values) and the output projection from a·d_v are split over tp."""
    h, a, t, n = model.hidden_size, model.num_attention_heads, shard.tp, shard.tokens
    rope, v, r_q, r_kv = model.qk_rope_head_dim, model.v_head_dim or model.kv_channels, model.q_lora_rank, model.kv_lora_rank
    down = ([Gemm(n, r_q, h)] if r_q else []) + [Gemm(n, r_kv + rope, h)]
    return down + latent_up_gemms(model, shard) + [Gemm(n, h, a * v // t)]


def latent_up_gemms(model: ModelSpec, shard: Shard) -> list[Gemm]:
    """MLA's up-projections (what Megatron's `mla_up_proj` recompute replays): queries from r_q (from h
    without a query rank) and keys and values from r_kv, per head, split over tp."""
    h, a, t, n = model.hidden_size, model.num_attention_heads, shard.tp, shard.tokens
    nope, rope, v = model.kv_channels, model.qk_rope_head_dim, model.v_head_dim or model.kv_channels
    r_q, r_kv = model.q_lora_rank, model.kv_lora_rank
    return [Gemm(n, a * (nope + rope) // t, r_q or h), Gemm(n, a * (nope + v) // t, r_kv)]


def mlp_gemms(model: ModelSpec, width: int, shard: Shard) -> list[Gemm]:
    """A dense MLP of inner width f, column- then row-parallel over tp."""
    up_width = 2 * width if model.ffn_kind == "swiglu" else width
    return [Gemm(shard.tokens, up_width // shard.tp, model.hidden_size),
            Gemm(shard.tokens, model.hidden_size, width // shard.tp)]


def moe_dense_gemms(model: ModelSpec, shard: Shard) -> list[Gemm]:
    """The router's `h × E` scores over the device's own tokens (replicated weights; with sequence
    parallelism each tp rank routes its slice), and the shared experts as one tp-split MLP of their
    joint width."""
    routed_from = shard.tokens // (shard.tp if shard.sp else 1)
    router = [Gemm(routed_from, model.num_experts, model.hidden_size)]
    shared = mlp_gemms(model, model.shared_expert_ffn_size, shard) if model.shared_expert_ffn_size else []
    return router + shared


def routed_expert_flops(model: ModelSpec, shard: Shard) -> float:
    """Forward FLOPs of an MoE layer's routed experts on one device, balanced: `2·k·(b·s/cp)·P_e/tp`,
    P_e one expert's weights — ep and etp move the work, not its amount (`cost_models.experts`)."""
    return 2.0 * model.top_k * shard.tokens * model.expert_params() / shard.tp


def score_context_width(model: ModelSpec) -> int:
    """Σ over heads of the query/key width plus the value width: `2·h_q` for standard attention;
    `a·(d_nope + d_rope + d_v)` for MLA."""
    if model.is_mla:
        v = model.v_head_dim or model.kv_channels
        return model.num_attention_heads * (model.kv_channels + model.qk_rope_head_dim + v)
    return 2 * model.q_hidden_size


def attention_core_flops(model: ModelSpec, kind: LayerKind, shard: Shard, causal_skip: bool) -> float:
    """Scores and context `4·b·s·s_kv·h_q / t` forward (h_q = heads × head width; `2·b·s·s_kv` times
    `score_context_width` in general, MLA's a·(d_qk + d_v)); causal flash
    attention skips half (`causal_skip`). With a sliding window w < s_kv, a causal fused kernel visits
    `w − w²/(2·s_kv)` keys per query on average (Σ_i min(i, w) over the sequence: the full window but
    for the first w tokens) — Mistral 7B's 4096-token window at 32k does 23% of the causal work.
    Cross-attention is never causal."""
    def core(causal: bool) -> float:
        full = 2.0 * shard.batch * shard.seq * shard.kv_seq * score_context_width(model) / shard.tp
        if not (causal and causal_skip):
            return full
        w, kv = model.sliding_window, shard.kv_seq
        if w and w < kv:
            windowed, share = full * (w - w * w / (2 * kv)) / kv, windowed_share(model)
            return share * windowed + (1 - share) * full / 2
        return full / 2
    cross = core(False) if kind.cross_attention else 0.0
    return core(kind.causal) + cross


def windowed_share(model: ModelSpec) -> float:
    """The share of layers attending through the sliding window: all of them, or (N−1)/N with a full layer
    every N (`full_attention_every`). One layer kind carries the mean, exact over the model; a stage's
    share differs from it by at most one layer's attention."""
    n = model.full_attention_every
    return (n - 1) / n if n else 1.0


def head_gemm(model: ModelSpec, shard: Shard) -> Gemm:
    """Logits `2·b·s·h·V`, vocab split over tp (vocab-parallel output layer)."""
    return Gemm(shard.tokens, model.vocab_size // shard.tp, model.hidden_size)


def layer_forward_flops(model: ModelSpec, kind: LayerKind, shard: Shard, causal_skip: bool = False) -> float:
    routed = routed_expert_flops(model, shard) if kind.moe else 0.0
    return sum(g.flops for g in layer_gemms(model, kind, shard)) + routed + attention_core_flops(
        model, kind, shard, causal_skip)


def model_flops_per_step(model: ModelSpec, training: TrainingSpec) -> float:
    """Model FLOPs of one step, forward + backward = 3 × forward, no recompute, causal attention
    counted as half the score matrix — what the kernels the step time prices compute, and the
    convention of Megatron-Bridge's published tables (so MFU cannot pass 100% at long sequences, as
    the SC21 count, which has no causal halving, does at 128k); multi-token prediction adds per depth a
    layer, its 2h → h projection and the head (Megatron counts them too). Without the halving, for GPT with
    f = 4h this is `72·B·s·L·h²·(1 + s/(6h) + V/(12·L·h))` (Narayanan et al. 2021, eq. 3)."""
    whole = Shard(batch=training.gbs, seq=training.seq_length, kv_seq=training.seq_length, tp=1, sp=False)
    layers = sum(k.count * layer_forward_flops(model, k, whole, causal_skip=True) for k in model.layer_kinds())
    mtp = model.mtp_layers * (layer_forward_flops(model, model.mtp_kind, whole, causal_skip=True)
                              + 2 * whole.tokens * 2 * model.hidden_size * model.hidden_size + head_gemm(model, whole).flops)
    return 3.0 * (layers + head_gemm(model, whole).flops + mtp)


# ---- time --------------------------------------------------------------------------------------

def gemm_efficiency(device: DeviceSpec, gemm: Gemm) -> float:
    """`e_max · W / (W + W_half)` with W the GEMM's GFLOP: small (and tp-sharded) GEMMs fill fewer
    tensor cores and amortise less launch and tail time."""
    eff = device.efficiency
    work_gflop = gemm.flops / 1e9
    return eff.gemm * work_gflop / (work_gflop + eff.gemm_half_gflop)


def gemm_time_s(device: DeviceSpec, precision: str, gemm: Gemm) -> float:
    """At the peak of the GEMM's precision and the efficiency of its size, times the device's factor for
    that precision (FP8's scaling and casts); a recipe without its own factor (fp8-rowwise where no run
    measured it) takes its tensor-core format's, never a faster one than the tensorwise recipe's."""
    factor = device.precision_efficiency.get(precision, device.precision_efficiency.get(tensor_core_format(precision), 1.0))
    return gemm.flops / (device.peak_flops(precision) * min(1.0, gemm_efficiency(device, gemm) * factor))


def memory_time_s(device: DeviceSpec, moved_bytes: float) -> float:
    """Element-wise kernels are bandwidth-bound: bytes / (HBM bandwidth × achieved fraction)."""
    return moved_bytes / (device.hbm_bandwidth_GBps * 1e9 * device.efficiency.memory)


def layer_elementwise_elements(model: ModelSpec, kind: LayerKind, shard: Shard) -> float:
    """Elements read + written by one layer's forward element-wise kernels, on one device.

    Norms (read + write h, twice), residual adds (read 2h, write h, twice), the MLP activation
    (gelu/relu: read + write f; swiglu: read 2f, write f), rotary embedding on q and k, dropout
    (read + write + mask, twice) — from the layer's dataflow (Korthikanti et al. 2022, Fig. 4 and 5).
    Norms and residuals are split over tp only with sequence parallelism. An MoE layer's MLP here is
    its shared experts (the routed side: `cost_models.experts.routed_elementwise_elements`)."""
    h, t = model.hidden_size, shard.tp
    f = model.shared_expert_ffn_size if kind.moe else model.ffn_size
    blocks = 2 if kind.cross_attention else 1
    replicated = (blocks + 1) * (4 * h + 6 * h) / 2
    if model.dropout > 0:
        replicated += (blocks + 1) * 2.5 * h
    sharded = (3 * f if model.ffn_kind == "swiglu" else 2 * f)
    if model.position_embedding == "rope":
        sharded += 2 * (model.q_hidden_size + 2 * model.kv_hidden_size)
    per_token = replicated / (t if shard.sp else 1) + sharded / t
    return per_token * shard.tokens


@dataclass(frozen=True)
class LayerTime:
    """Seconds of one layer for one micro-batch on one device."""

    forward_s: float
    backward_s: float
    attention_forward_s: float
    """The attention core alone (what selective recompute replays)."""

    def recompute_s(self, option: str) -> float:
        if option == "full":
            return self.forward_s
        if option == "selective":
            return self.attention_forward_s
        return 0.0


def measured_times(device: DeviceSpec, part: str, model: ModelSpec, training: TrainingSpec,
                   shard: Shard) -> tuple[float, float, float] | None:
    """(forward, backward, attention forward) seconds from the device's measured shapes: the exact
    micro-batch when measured, else a straight line through the measured micro-batches (time is
    affine in the tokens of a shape: fixed launches plus work ∝ tokens); None when not measured."""
    if not device.measured:
        return None
    key = (part, model.hidden_size, model.ffn_size, model.num_attention_heads, model.kv_heads, model.ffn_kind,
           model.vocab_size, shard.seq, shard.tp, training.precision)
    points = sorted((m.mbs, m) for m in device.measured if m.status == "ok" and m.shape_key() == key)
    exact = [m for mbs, m in points if mbs == shard.batch]
    if exact:
        m = exact[0]
        return m.forward_s, m.backward_s, m.attention_forward_s or 0.0
    if len(points) < 2:
        return None
    fields = ("forward_s", "backward_s", "attention_forward_s")
    return tuple(_affine([(mbs, getattr(m, f) or 0.0) for mbs, m in points], shard.batch) for f in fields)


def _affine(points: list[tuple[int, float]], x: float) -> float:
    """Least-squares line through `points`, evaluated at x (never below zero)."""
    return max(0.0, fit_line(points).at(x))


def layer_time(model: ModelSpec, kind: LayerKind, training: TrainingSpec, shard: Shard,
               device: DeviceSpec) -> LayerTime:
    """Measured when the device's profile has this shape (decoder layers); else forward: GEMMs +
    attention core + element-wise + a fixed launch overhead; backward: 2× GEMMs, 2.5× flash
    attention, 2× element-wise and launches."""
    measured = measured_times(device, "layer", model, training, shard) if kind.name == "decoder" else None
    if measured:
        return LayerTime(*measured)
    # the layers' GEMMs at the training precision (FP8 recipes quantise exactly these); attention,
    # norms and the rest at the base precision (BF16 for FP8 recipes)
    precision = training.base_precision
    gemm_s = sum(gemm_time_s(device, training.precision, g) for g in layer_gemms(model, kind, shard))
    flash = training.flash_attention
    core_flops = attention_core_flops(model, kind, shard, causal_skip=flash)
    if flash:
        attention_s = core_flops / (device.peak_flops(precision) * device.efficiency.attention)
        attention_bwd_ratio = FLASH_BACKWARD_FLOP_RATIO
    else:
        bmm = Gemm(shard.batch * model.num_attention_heads // shard.tp * shard.seq, shard.kv_seq,
                   model.kv_channels)
        scores_bytes = 3 * shard.batch * model.num_attention_heads // shard.tp * shard.seq * shard.kv_seq
        attention_s = core_flops / (device.peak_flops(precision) * gemm_efficiency(device, bmm)) + \
            memory_time_s(device, scores_bytes * training.element_bytes)
        attention_bwd_ratio = GEMM_BACKWARD_FLOP_RATIO
    elementwise_s = memory_time_s(
        device, layer_elementwise_elements(model, kind, shard) * training.element_bytes)
    launch_s = device.efficiency.layer_overhead_s
    forward = gemm_s + attention_s + elementwise_s + launch_s
    backward = GEMM_BACKWARD_FLOP_RATIO * (gemm_s + elementwise_s + launch_s) + attention_bwd_ratio * attention_s
    return LayerTime(forward_s=forward, backward_s=backward, attention_forward_s=attention_s)


#: Bytes per logit element moved by a fused cross-entropy, forward and backward together: the
#: logits are written (2), upcast and read for max/sum/exp (4 + 4), and the gradient written (2).
CROSS_ENTROPY_BYTES_PER_LOGIT = 12


def cross_entropy_bytes_per_logit(training: TrainingSpec) -> float:
    """CROSS_ENTROPY_BYTES_PER_LOGIT, its two fp32 reads 16-bit where the loss runs on the 16-bit logits
    (`TrainingSpec.bf16_loss`) or is compiled (`TrainingSpec.compiled_loss`: the upcast fused into the reads):
    2 + 2 + 2 + 2."""
    sixteen_bit_reads = training.bf16_loss or training.compiled_loss
    return CROSS_ENTROPY_BYTES_PER_LOGIT - (2 * (4 - training.element_bytes) if sixteen_bit_reads else 0)


def head_time(model: ModelSpec, training: TrainingSpec, shard: Shard, device: DeviceSpec) -> tuple[float, float]:
    """(forward, backward) seconds of the final norm, logits GEMM and cross-entropy (measured when
    the device's profile has this shape)."""
    measured = measured_times(device, "head", model, training, shard)
    if measured:
        return measured[0], measured[1]
    gemm_s = gemm_time_s(device, training.base_precision, head_gemm(model, shard))  # the output layer stays BF16
    logits = shard.tokens * model.vocab_size / shard.tp
    loss_s = memory_time_s(device, logits * cross_entropy_bytes_per_logit(training))
    norm_s = memory_time_s(device, 4 * shard.tokens * model.hidden_size * training.element_bytes)
    return gemm_s + loss_s / 2 + norm_s, GEMM_BACKWARD_FLOP_RATIO * (gemm_s + norm_s) + loss_s / 2


def embedding_time(model: ModelSpec, training: TrainingSpec, shard: Shard, device: DeviceSpec) -> tuple[float, float]:
    """(forward, backward) seconds of the token lookup (a gather) and its gradient (a scatter-add)."""
    measured = measured_times(device, "embedding", model, training, shard)
    if measured:
        return measured[0], measured[1]
    moved = 2 * shard.tokens * model.hidden_size * training.element_bytes
    return memory_time_s(device, moved), memory_time_s(device, 2 * moved)


#: Adam with fp32 master weights moves per parameter: fp32 grad (4) read, master weight (4 + 4),
#: m and v (8 + 8) read and written, the 16-bit copy (2) written, plus the grad-norm read (4).
ADAM_BYTES_PER_PARAM = 34

#: In full-bf16 training (TrainingSpec.pure_bf16) everything is bf16 and there is no master copy: grad (2)
#: read, weight (2 + 2), m and v (4 + 4), the grad-norm read (2).
PURE_BF16_ADAM_BYTES_PER_PARAM = 16


def adam_bytes_moved_per_param(state_bytes: float, master_remainders: bool) -> float:
    """What mixed-precision Adam moves per parameter with `state_bytes` of master weight and moments: the fp32
    gradient read (4) and read again for its norm (4), the states read and written, the 16-bit weight written (2)
    — and read, where the master weight is its 16-bit remainder (FusedAdam's `store_param_remainders` rebuilds the
    fp32 value from both). 34 bytes at fp32 states (`ADAM_BYTES_PER_PARAM`)."""
    return 4 + 4 + 2 * state_bytes + 2 + (2 if master_remainders else 0)


def optimizer_time_s(device: DeviceSpec, local_params: float, bytes_per_param: float = ADAM_BYTES_PER_PARAM) -> float:
    """Adam is bandwidth-bound: bytes per parameter × local (sharded) parameters / HBM bandwidth."""
    return memory_time_s(device, bytes_per_param * local_params)
