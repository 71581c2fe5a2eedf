"""Selective recompute module by module (cost_models/recompute.py and StepModel): each module's drop is the
term the none-accounting keeps for that module, its replay the forward piece it recomputes."""

from __future__ import annotations

import pytest

from gplan.cost_models import compute, experts, memory
from gplan.cost_models.step import StepModel
from gplan.profiles.catalogue import load_cluster, load_model
from gplan.spec.parallel import ParallelConfig, config_violations, uniform_layout
from gplan.spec.training import TrainingSpec

SEQ = 4096


def step(name: str, modules: tuple[str, ...], devices: int = 8, **degrees) -> StepModel:
    config = ParallelConfig(**{"zero": 1, "recompute_modules": modules, **degrees})
    training = TrainingSpec(gbs=config.dp * config.mbs * 8, seq_length=SEQ, engine="megatron")
    return StepModel(load_model(name), training, load_cluster("dgx-h100").sized(devices), config)


def kind_of(s: StepModel, moe: bool) -> str:
    return next(k.name for k in s.model.layer_kinds() if k.moe == moe)


def drop(name: str, modules: tuple[str, ...], moe: bool = False, **degrees) -> float:
    """What a selective layer keeps less than a layer recomputing nothing."""
    s = step(name, modules, **degrees)
    kind = kind_of(s, moe)
    return s.layer_activation_bytes(kind, "none") - s.layer_activation_bytes(kind, "selective")


def test_no_module_keeps_what_no_recompute_keeps_and_replays_nothing():
    s = step("llama3-8b", (), tp=2, sp=True, dp=4)
    kind = kind_of(s, False)
    assert s.layer_activation_bytes(kind, "selective") == s.layer_activation_bytes(kind, "none")
    assert s.layer_recompute_s(kind, "selective", 0) == 0.0


def test_layernorm_drops_the_two_norm_outputs_each_e_s_b_h_over_tp_with_sp():
    # llama3-8b, mbs 1, tp 2 with sp: 2 outputs · 2 bytes · 4096 tokens · 4096 wide / 2
    assert drop("llama3-8b", ("layernorm",), tp=2, sp=True, dp=4) == 2 * 2 * SEQ * 4096 / 2


def test_mlp_drops_the_swiglu_intermediates_of_a_dense_layer_only():
    # gate and up in, product out: 3 · 2 bytes · 4096 tokens · 14336 / tp 2
    assert drop("llama3-8b", ("mlp",), tp=2, sp=True, dp=4) == 3 * 2 * SEQ * 14336 / 2
    assert drop("qwen3-30b-a3b", ("mlp",), moe=True, ep=8, dp=8) == 0.0  # an MoE layer has no dense MLP


def test_fused_attention_leaves_core_attn_nothing_to_drop_but_its_replay_costs_time():
    s = step("llama3-8b", ("core_attn",), dp=8)
    kind = kind_of(s, False)
    assert s.layer_activation_bytes(kind, "selective") == s.layer_activation_bytes(kind, "none")
    assert s.layer_recompute_s(kind, "selective", 0) == s.layer_time(kind, 0).attention_forward_s > 0


def test_moe_act_drops_one_activation_output_per_token_expert_pair():
    s = step("qwen3-30b-a3b", ("moe_act",), ep=8, dp=8)
    pairs = experts.routed_pairs(s.model, s.shard, 1)
    assert pairs == 8 * SEQ  # top-8 of each of the device's own tokens
    assert drop("qwen3-30b-a3b", ("moe_act",), moe=True, ep=8, dp=8) == pairs * 2 * s.model.expert_ffn_size


def test_moe_drops_the_routed_side_and_supersedes_moe_act():
    s = step("qwen3-30b-a3b", ("moe",), ep=8, dp=8)
    routed = experts.routed_activation_bytes(s.model, s.shard, s.config, 2)
    assert drop("qwen3-30b-a3b", ("moe",), moe=True, ep=8, dp=8) == routed
    assert drop("qwen3-30b-a3b", ("moe", "moe_act"), moe=True, ep=8, dp=8) == routed


def test_moe_recompute_replays_the_routed_forward_and_its_token_traffic():
    none, moe = step("qwen3-30b-a3b", (), ep=8, dp=8), step("qwen3-30b-a3b", ("moe",), ep=8, dp=8)
    kind = kind_of(moe, True)
    routed_forward, _ = experts.routed_time_s(moe.model, moe.training, moe.shard, moe.config, moe.device(0))
    assert moe.layer_recompute_s(kind, "selective", 0) > routed_forward
    assert moe.layer_ep_comm_s(kind, "selective", 0) == pytest.approx(1.5 * none.layer_ep_comm_s(kind, "selective", 0))


def test_mla_up_proj_drops_the_per_head_tensors_less_the_latents_they_are_rebuilt_from():
    s = step("deepseek-v3", ("mla_up_proj",), devices=64, ep=64, dp=64)
    m = s.model
    per_head = 2 * SEQ * (m.q_hidden_size + 2 * m.kv_hidden_size)
    latents = 2 * SEQ * (m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim)
    assert drop("deepseek-v3", ("mla_up_proj",), moe=True, devices=64, ep=64, dp=64) == per_head - latents
    up = compute.latent_up_gemms(m, s.shard)
    expected = sum(compute.gemm_time_s(s.device(0), "bf16", g) for g in up)
    assert s.layer_recompute_s(kind_of(s, True), "selective", 0) == pytest.approx(expected)


def test_modules_add_and_the_working_set_is_the_largest_replay():
    both = drop("qwen3-30b-a3b", ("moe_act", "layernorm"), moe=True, ep=8, dp=8)
    assert both == drop("qwen3-30b-a3b", ("moe_act",), moe=True, ep=8, dp=8) + \
        drop("qwen3-30b-a3b", ("layernorm",), moe=True, ep=8, dp=8)
    s = step("qwen3-30b-a3b", ("moe_act", "layernorm"), ep=8, dp=8)
    assert max(s.module_drops(kind_of(s, True))) == drop("qwen3-30b-a3b", ("moe_act",), moe=True, ep=8, dp=8)


def test_an_moe_layer_keeps_no_dense_mlp_activations():
    """An MoE layer runs its shared experts (none in Qwen3-30B), not the model's dense MLP width: its kept
    bytes do not change with ffn_hidden_size (6144 for Qwen3-30B, used by no layer)."""
    s = step("qwen3-30b-a3b", (), ep=8, dp=8)
    wider = s.model.model_copy(update={"ffn_hidden_size": 4 * s.model.ffn_size})
    t = StepModel(wider, s.training, s.cluster, s.config)
    kind = kind_of(s, True)
    assert t.layer_activation_bytes(kind, "none") == s.layer_activation_bytes(kind, "none")
    assert memory.mlp_width(s.model, s.kinds[kind]) == 0


def test_the_search_prices_each_module_set_on_its_own():
    """Configurations that differ only in their modules share nothing they price differently."""
    pool: dict = {}
    model, training = load_model("qwen3-30b-a3b"), TrainingSpec(gbs=64, seq_length=SEQ, engine="megatron")
    cluster = load_cluster("dgx-h100").sized(8)
    a = StepModel.sharing(pool, model, training, cluster, ParallelConfig(dp=8, ep=8, zero=1, recompute_modules=()))
    b = StepModel.sharing(pool, model, training, cluster, ParallelConfig(dp=8, ep=8, zero=1, recompute_modules=("moe",)))
    kind = kind_of(a, True)
    assert a.layer_activation_bytes(kind, "selective") > b.layer_activation_bytes(kind, "selective")


# ---- Megatron's memory options and activation offloading ------------------------------------------------

def megatron_step(name: str, precision: str = "bf16", devices: int = 8, training_options: dict | None = None,
                  **degrees) -> StepModel:
    config = ParallelConfig(**{"zero": 1, **degrees})
    training = TrainingSpec(gbs=config.dp * config.mbs * 8, seq_length=SEQ, engine="megatron", precision=precision,
                            **(training_options or {}))
    return StepModel(load_model(name), training, load_cluster("dgx-h100").sized(devices), config)


def test_bf16_gradients_keep_two_bytes_per_parameter_and_move_half_the_bytes():
    fp32, bf16 = megatron_step("llama3-8b", dp=8), megatron_step("llama3-8b", dp=8,
                                                                 training_options={"grad_reduce_in_bf16": True})
    assert fp32.state_bytes.grads == 4 and bf16.state_bytes.grads == 2
    # the reduce-scatter of 1e9 parameters' gradients, nothing to hide it behind
    assert bf16.dp_sync_exposed_s(1e9, 0.0, 0.0, 0, 0.0) < fp32.dp_sync_exposed_s(1e9, 0.0, 0.0, 0, 0.0)


def test_fp8_param_gather_keeps_the_layer_weights_only_quantised():
    kept = megatron_step("llama3-8b", "fp8", dp=8)
    only = megatron_step("llama3-8b", "fp8", dp=8, training_options={"fp8_param_gather": True})
    kind = kind_of(kept, False)
    params = kept.layer_params(kind)
    # FP8 current scaling: a row-wise copy and its transpose (2 bytes) beside the 16-bit weight, or instead of it
    assert kept.layer_state_bytes(kind) - only.layer_state_bytes(kind) == pytest.approx(2 * params)


def test_transformer_engine_keeps_gemm_inputs_quantised_and_torchao_does_not():
    bf16, fp8 = megatron_step("llama3-8b", dp=8), megatron_step("llama3-8b", "fp8", dp=8)
    kind = kind_of(bf16, False)
    m = bf16.model
    # QKV, output-projection, fc1 and fc2 inputs: h + h_q + h + f elements per token, one byte instead of two
    saved = SEQ * (m.hidden_size + m.q_hidden_size + m.hidden_size + m.ffn_size)
    assert bf16.layer_activation_bytes(kind, "none") - fp8.layer_activation_bytes(kind, "none") == saved
    config = ParallelConfig(dp=8, zero=1)
    torch = StepModel(m, TrainingSpec(gbs=64, seq_length=SEQ, precision="fp8", engine="torch"),
                      load_cluster("dgx-h100").sized(8), config)
    # torchao keeps the 16-bit inputs: the torch worker keeps what Megatron's bf16 layer keeps, and the SiLU output
    # its unfused SwiGLU keeps beside (MemoryAccounting.unfused_swiglu: 2 bytes per token and f)
    assert torch.layer_activation_bytes(kind, "none") == bf16.layer_activation_bytes(kind, "none") + 2 * SEQ * m.ffn_size


def test_offloaded_layers_leave_the_device_but_one_in_transit():
    kept, off = megatron_step("llama3-8b", dp=8), megatron_step("llama3-8b", dp=8, offload_layers=10)
    layout = uniform_layout(off.model, 1, "none")[0]
    per_layer = kept.layer_activation_bytes(kind_of(kept, False), "none")
    assert kept.stage_activation_bytes(0, layout) - off.stage_activation_bytes(0, layout) == pytest.approx(9 * per_layer)


def test_offloading_shows_only_what_the_host_link_cannot_hide():
    off = megatron_step("llama3-8b", dp=8, offload_layers=10)
    layout = uniform_layout(off.model, 1, "none")[0]
    moved = sum(off.offloaded_layer_bytes(layout))
    transfer_s = moved / (off.group(0).hardware.host_link_GBps * 1e9)
    assert off.offload_exposed_s(layout, 0.0, 0.0) == (pytest.approx(transfer_s), pytest.approx(transfer_s))
    assert off.offload_exposed_s(layout, transfer_s * 2, transfer_s * 2) == (0.0, 0.0)


@pytest.mark.parametrize("degrees, words", [
    ({"dp": 4, "pp": 2, "offload_layers": 4}, "without pipeline stages"),
    ({"dp": 8, "recompute": "full", "offload_layers": 4}, "without recomputation"),
    ({"dp": 8, "offload_layers": 32}, "at most 31"),
])
def test_offloading_keeps_megatron_cores_rules(degrees, words):
    found = config_violations(load_model("llama3-8b"), TrainingSpec(gbs=64, seq_length=SEQ), ParallelConfig(**degrees))
    assert any(v.rule == "offload_layers" and words in v.message for v in found)
