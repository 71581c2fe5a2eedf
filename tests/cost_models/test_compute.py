"""FLOP counts and compute times, checked against hand-worked numbers."""

from __future__ import annotations

import pytest

from gplan.cost_models import compute
from gplan.cost_models.compute import Gemm, Shard
from gplan.profiles.catalogue import hardware_entry
from gplan.profiles.schema import DeviceSpec
from gplan.spec.model import ModelSpec
from gplan.spec.training import TrainingSpec


def sc21_flops(B: int, s: int, L: int, h: int, V: int, causal: bool = False) -> float:
    """Narayanan et al. 2021, eq. 3 without recompute: 72·B·s·L·h²·(1 + s/(6h) + V/(12·L·h)); the
    attention term `s/(6h)` is the full score matrix, `s/(12h)` its causal half."""
    return 72 * B * s * L * h * h * (1 + s / ((12 if causal else 6) * h) + V / (12 * L * h))


@pytest.mark.parametrize("L,h,a,V,s,B", [(96, 12288, 96, 51200, 2048, 1536), (24, 2304, 24, 51200, 2048, 512),
                                         (4, 64, 4, 512, 64, 8)])
def test_model_flops_equal_sc21_for_gpt_with_causal_attention_halved(L, h, a, V, s, B):
    model = ModelSpec(name="gpt", num_layers=L, hidden_size=h, num_attention_heads=a, vocab_size=V, seq_length=s)
    assert compute.model_flops_per_step(model, TrainingSpec(gbs=B, seq_length=s)) == pytest.approx(
        sc21_flops(B, s, L, h, V, causal=True), rel=1e-12)


def test_mfu_counts_no_flop_the_kernels_skip_at_128k():
    """MFU counts FLOPs over step time × peak; the step takes at least each executed FLOP over its
    kernel's efficiency × peak, so MFU ≤ counted / Σ(executed_i / efficiency_i). Counting the causal
    half the kernels skip broke this at 128k (the issue's 87–89% MFU)."""
    from gplan.cost_models.step import predict
    from gplan.profiles.catalogue import load_cluster, load_model
    from gplan.spec.parallel import ParallelConfig

    model, training = load_model("llama3-8b"), TrainingSpec(gbs=64, seq_length=131072)
    cluster = load_cluster("dgx-h100", 512)
    prediction = predict(model, training, cluster, ParallelConfig(dp=4, tp=8, cp=16, sp=True, zero=1))
    whole = Shard(batch=training.gbs, seq=training.seq_length, kv_seq=training.seq_length, tp=1, sp=False)
    kind = model.layer_kinds()[0]
    gemm = 3 * (kind.count * sum(g.flops for g in compute.layer_gemms(model, kind, whole))
                + compute.head_gemm(model, whole).flops)
    attention = 3 * kind.count * compute.attention_core_flops(model, kind, whole, causal_skip=True)
    # the FLOPs MFU counts are the FLOPs the causal kernels execute — not the whole score matrix
    assert compute.model_flops_per_step(model, training) == pytest.approx(gemm + attention, rel=1e-12)
    eff = cluster.primary.hardware.efficiency
    assert prediction.mfu <= (gemm + attention) / (gemm / eff.gemm + attention / eff.attention)


def test_layer_flops_gqa_swiglu_by_hand():
    # h=4096, 32 heads, 8 kv heads (h_kv = 1024), f=14336, b=1, s=8192:
    # projections 2·b·s·h·(2h + 2h_kv) = 2·8192·4096·(8192 + 2048)
    # mlp 2·b·s·h·f·3; attention core 4·b·s²·h (not halved)
    model = ModelSpec(name="l", num_layers=1, hidden_size=4096, num_attention_heads=32, num_kv_heads=8,
                      ffn_hidden_size=14336, ffn_kind="swiglu", vocab_size=128256, seq_length=8192)
    shard = Shard(batch=1, seq=8192, kv_seq=8192, tp=1, sp=False)
    kind = model.layer_kinds()[0]
    projections = 2 * 8192 * 4096 * (8192 + 2048)
    mlp = 2 * 8192 * 4096 * 14336 * 3
    core = 4 * 8192 * 8192 * 4096
    assert compute.layer_forward_flops(model, kind, shard) == projections + mlp + core
    assert compute.layer_forward_flops(model, kind, shard, causal_skip=True) == projections + mlp + core / 2


def test_tp_divides_each_rank_share():
    model = ModelSpec(name="m", num_layers=2, hidden_size=1024, num_attention_heads=16, vocab_size=1000)
    kind = model.layer_kinds()[0]
    full = compute.layer_forward_flops(model, kind, Shard(2, 512, 512, 1, False))
    assert compute.layer_forward_flops(model, kind, Shard(2, 512, 512, 4, False)) == pytest.approx(full / 4)


def test_cross_attention_adds_a_non_causal_attention_block():
    model = ModelSpec(name="t", num_layers=6, num_encoder_layers=6, hidden_size=512, num_attention_heads=8,
                      vocab_size=1000, seq_length=128)
    enc, dec = model.layer_kinds()
    shard = Shard(1, 128, 128, 1, False)
    projections = 2 * 128 * 512 * (2 * 512 + 2 * 512)
    core = 4 * 128 * 128 * 512
    # decoder: causal self-attention (core/2) + cross-attention (projections + full core) + MLP;
    # encoder: bidirectional self-attention (core) + MLP.
    difference = compute.layer_forward_flops(model, dec, shard, causal_skip=True) - compute.layer_forward_flops(
        model, enc, shard, causal_skip=True)
    assert difference == projections + core / 2


def device(**efficiency) -> DeviceSpec:
    entry = hardware_entry("a100-80g")
    entry["efficiency"] = {**entry["efficiency"], **efficiency}
    return DeviceSpec.model_validate(entry)


def test_gemm_time_is_flops_over_peak_times_efficiency():
    d = device(gemm=0.5, gemm_half_gflop=0.0)
    g = Gemm(4096, 4096, 4096)
    assert compute.gemm_time_s(d, "bf16", g) == pytest.approx(g.flops / (312e12 * 0.5))


def test_small_gemms_run_further_from_peak():
    d = device(gemm=0.8, gemm_half_gflop=1.0)
    big, small = Gemm(8192, 8192, 8192), Gemm(128, 128, 128)
    assert compute.gemm_efficiency(d, big) > 0.79
    # W = 2·128³ = 4.19 MFLOP -> 0.8 · 0.00419/1.00419
    assert compute.gemm_efficiency(d, small) == pytest.approx(0.8 * 0.004194304 / 1.004194304)


def test_backward_is_twice_forward_for_gemms_and_recompute_adds_a_forward():
    model = ModelSpec(name="m", num_layers=2, hidden_size=2048, num_attention_heads=16, vocab_size=1000)
    d = device(layer_overhead_s=0.0)
    t = compute.layer_time(model, model.layer_kinds()[0], TrainingSpec(gbs=8, seq_length=1024, flash_attention=True),
                           Shard(4, 1024, 1024, 1, False), d)
    attention_bwd_extra = (compute.FLASH_BACKWARD_FLOP_RATIO - 2) * t.attention_forward_s
    assert t.backward_s == pytest.approx(2 * t.forward_s + attention_bwd_extra)
    assert t.recompute_s("full") == t.forward_s
    assert t.recompute_s("selective") == t.attention_forward_s
    assert t.recompute_s("none") == 0


def test_optimizer_time_is_bandwidth_bound():
    d = device(memory=0.5)
    assert compute.optimizer_time_s(d, 1e9) == pytest.approx(34e9 / (2039e9 * 0.5))


def test_a_sliding_window_prices_the_keys_a_causal_kernel_visits():
    """Σ_i min(i, w) keys over a 32k sequence with Mistral 7B v0.1's 4096-token window: 23.4% of the
    causal score matrix."""
    full = ModelSpec(name="m", num_layers=1, hidden_size=4096, num_attention_heads=32, vocab_size=32000)
    windowed = full.model_copy(update={"sliding_window": 4096})
    shard = Shard(batch=1, seq=32768, kv_seq=32768, tp=1, sp=False)
    kind = full.layer_kinds()[0]
    causal = compute.attention_core_flops(full, kind, shard, causal_skip=True)
    exact = sum(min(i, 4096) for i in range(1, 32769)) / (32768 * 32769 / 2)
    assert compute.attention_core_flops(windowed, kind, shard, causal_skip=True) / causal == pytest.approx(exact, rel=1e-3)
    assert exact == pytest.approx(0.234, abs=1e-3)
