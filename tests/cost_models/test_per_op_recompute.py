"""torchtitan's per-operator selective AC, the recompute module `op` (cost_models/recompute.py, StepModel): what
its policy keeps, counted tensor by tensor, and what its replay costs beside recomputing nothing or all."""

from __future__ import annotations

import pytest

from gplan.cost_models import compute, experts, recompute
from gplan.cost_models.step import StepModel
from gplan.profiles.catalogue import load_cluster, load_model
from gplan.spec.parallel import PER_OP_MODULES, ParallelConfig, config_violations
from gplan.spec.training import TrainingSpec

SEQ = 4096


def titan(name: str, devices: int = 64, precision: str = "bf16", recompute_: str = "selective", **degrees) -> StepModel:
    config = ParallelConfig(**{"dp": devices, "zero": 3, "recompute": recompute_,
                               "recompute_modules": PER_OP_MODULES, **degrees})
    training = TrainingSpec(gbs=config.dp * config.mbs, seq_length=SEQ, engine="torchtitan", precision=precision)
    return StepModel(load_model(name), training, load_cluster("dgx-a100-80g").sized(devices), config)


def decoder(s: StepModel) -> str:
    return next(k.name for k in s.model.layer_kinds() if not k.moe)


def test_a_llama_block_keeps_its_input_wq_wv_w1_w2_and_attentions_output():
    """Llama 2 70B (h 8192, 8 kv heads of 128, f 28672, 64 heads), tp 1, mbs 1: the block's 7 matmuls run wq wk
    wv wo w1 w3 w2, the 1st 3rd 5th 7th kept; attention keeps its output and one fp32 log-sum-exp per head."""
    s = titan("llama2-70b")
    h, hkv, f, a = 8192, 1024, 28672, 64
    by_hand = 2 * SEQ * (h + h + hkv + f + h) + SEQ * (2 * h + 4 * a)
    assert s.layer_activation_bytes(decoder(s), "selective") == pytest.approx(by_hand)


def test_with_tp_and_sp_the_row_parallel_output_is_whole_and_the_reduce_scatters_are_kept():
    s = titan("llama2-70b", devices=16, dp=8, tp=2, sp=True)
    h, hkv, f, a, t = 8192, 1024, 28672, 64, 2
    gemms = h / t + hkv / t + f / t + h  # wq, wv, w1 column-parallel; w2's partial sum before its reduce-scatter
    by_hand = 2 * SEQ * (h / t + gemms + 2 * h / t) + SEQ * (2 * h + 4 * a) / t
    assert s.layer_activation_bytes(decoder(s), "selective") == pytest.approx(by_hand)


def test_torchaos_scaled_mm_is_not_a_counted_matmul_so_fp8_keeps_every_gemm_output_and_replays_none():
    model, shard = load_model("llama2-70b"), compute.Shard(batch=1, seq=SEQ, kv_seq=SEQ, tp=1, sp=False)
    kind = model.layer_kinds()[0]
    kept, replayed = recompute.per_op_split(model, kind, shard, "fp8")
    assert len(kept) == 7 and replayed == []
    kept, replayed = recompute.per_op_split(model, kind, shard, "bf16")
    assert [g.n for g in kept] == [8192, 1024, 28672, 8192] and [g.n for g in replayed] == [1024, 8192, 28672]


def test_op_keeps_more_than_full_and_less_than_none_and_costs_between_them():
    options = ("none", "selective", "full")
    s = titan("llama2-70b")
    kind = decoder(s)
    kept = [s.layer_activation_bytes(kind, o) for o in options]
    replay = [s.layer_recompute_s(kind, o, 0) for o in options]
    assert kept[0] > kept[1] > kept[2]
    assert replay[0] == 0 < replay[1] < 0.6 * replay[2]
    # the working set of its backward is what it replays: the block's bytes beyond what it kept
    assert s.layer_transient_bytes(kind, "selective") < s.layer_transient_bytes(kind, "full")


def test_torchtitans_70b_fits_80gb_at_local_batch_1_and_not_at_2():
    """torchtitan's docs/performance.md (Llama 2 70B, FSDP over 64 A100 80GB, seq 4096): per-op selective AC
    at local batch 1; "local batch 2 OOMs with selective AC"."""
    fits = titan("llama2-70b").predict().memory_bytes_per_device_max
    doubled = titan("llama2-70b", mbs=2).predict().memory_bytes_per_device_max
    physical = load_cluster("dgx-a100-80g").primary.hardware.memory_bytes
    assert fits < physical < doubled


def test_an_moe_layer_under_op_replays_its_experts_but_keeps_the_all_to_alls_outputs():
    s = titan("qwen3-30b-a3b", devices=8, dp=8, ep=8)
    moe = next(k.name for k in s.model.layer_kinds() if k.moe)
    # the token traffic is not replayed (its outputs kept): the same passes as recomputing nothing, but for the host
    # time of the block's forward run again from Python in the backward (one more pass of it)
    host_s = experts.host_time_s(s.model, s.config, s.training)
    assert s.layer_ep_comm_s(moe, "selective", 0) == pytest.approx(s.layer_ep_comm_s(moe, "none", 0) + host_s, rel=1e-12)
    assert s.layer_ep_comm_s(moe, "full", 0) > s.layer_ep_comm_s(moe, "selective", 0)  # full replays the exchange too
    routed_forward_s, _ = experts.routed_time_s(s.model, s.training, s.shard, s.config, s.device(0))
    assert s.layer_recompute_s(moe, "selective", 0) > routed_forward_s > 0
    # the received tokens of dispatch and combine are among what it keeps
    kept = recompute.per_op_kept_bytes(s.model, s.kinds[moe], s.shard, s.config, 2, "bf16")
    alone = recompute.per_op_kept_bytes(s.model, s.kinds[moe], s.shard, s.config.model_copy(update={"ep": 1}), 2, "bf16")
    assert kept - alone == pytest.approx(2 * experts.dispatch_bytes(s.model, s.shard, 2))


def test_op_is_a_policy_over_the_whole_block_not_a_module_beside_others():
    model = load_model("llama3-8b")
    training = TrainingSpec(gbs=8, seq_length=SEQ, engine="torchtitan")
    config = ParallelConfig(dp=8, recompute="selective", recompute_modules=("layernorm", "op"))
    broken = config_violations(model, training, config, 8)
    assert broken and broken[0].rule == "recompute_modules" and "op alone" in broken[0].hint
