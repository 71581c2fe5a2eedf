"""Mixture-of-experts plans exported to Megatron-LM: the MoE and MLA flags through Megatron's own rules
(megatron_rules.py, from arguments.py) and megatron-core's configuration classes, the uneven interleaved
layout rank by rank; every dense-only target refuses them first."""

from __future__ import annotations

import pytest

from gplan.backends.exporters.megatron import interleaved_layout, megatron_args
from gplan.plan import layouts_of
from gplan.planner.build import make_plan
from gplan.profiles.catalogue import load_cluster
from gplan.spec.model import ModelSpec
from gplan.spec.parallel import ParallelConfig, layout_from_sizes
from gplan.spec.targets import TARGETS, config_refusals, runs_as
from gplan.spec.training import TrainingSpec
from gplan.testing import requires_engine
import megatron_rules

#: A small DeepSeek-V3-shaped model: a dense first layer, 8 routed experts (top 2) and a shared one,
#: sigmoid routing, multi-head latent attention.
MINI_DEEPSEEK = ModelSpec(
    name="mini-deepseek", num_layers=9, hidden_size=512, num_attention_heads=8, ffn_hidden_size=1536,
    ffn_kind="swiglu", vocab_size=32000, seq_length=1024, norm="rmsnorm", position_embedding="rope",
    head_dim=64, num_experts=8, top_k=2, moe_ffn_hidden_size=256, num_shared_experts=1, first_dense_layers=1,
    router="sigmoid", q_lora_rank=192, kv_lora_rank=128, qk_rope_head_dim=32, v_head_dim=64)
CONFIG = ParallelConfig(dp=4, tp=2, pp=2, vpp=2, ep=4, sp=True, zero=1)
SIZES = [4, 5]  # uneven interleaved: 2+2 and 3+2 layers per chunk


def moe_plan():
    training = TrainingSpec(gbs=32, seq_length=1024, engine="megatron")
    layouts = layout_from_sizes(MINI_DEEPSEEK, SIZES, ["none", "none"])
    return make_plan(MINI_DEEPSEEK, training, load_cluster("dgx-h100", CONFIG.world_size), CONFIG, layouts,
                     target="megatron")


def exported_args():
    plan = moe_plan()
    return plan, megatron_args(plan, runs_as(TARGETS["megatron"], plan.model, plan.parallel, layouts_of(plan)))[0]


def test_moe_args_pass_megatrons_rules():
    plan, args = exported_args()
    ns = megatron_rules.validate(args, plan.world_size, {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, device_arch=9)
    assert (ns.num_experts, ns.moe_router_topk, ns.expert_model_parallel_size, ns.expert_tensor_parallel_size) == \
        (8, 2, 4, 1)
    assert ns.expert_data_parallel_size == 2  # a stage's dp·tp = 8 ranks over ep = 4
    assert megatron_rules.moe_layer_pattern(ns) == [0] + [1] * 8
    assert ns.multi_latent_attention and (ns.q_lora_rank, ns.kv_lora_rank, ns.qk_head_dim, ns.qk_pos_emb_head_dim,
                                          ns.v_head_dim) == (192, 128, 64, 32, 64)
    assert ns.moe_router_score_function == "sigmoid" and ns.moe_router_enable_expert_bias
    assert ns.moe_shared_expert_intermediate_size == 256 and ns.moe_grouped_gemm


def test_megatrons_rules_refuse_what_the_export_must_never_write():
    plan, args = exported_args()
    env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    broken = [a if a != "4" or args[i - 1] != "--expert-model-parallel-size" else "3" for i, a in enumerate(args)]
    with pytest.raises(megatron_rules.Violation, match="multiple of expert model parallel"):
        megatron_rules.validate(broken, plan.world_size, env, device_arch=9)
    without_sp = [a for a in args if a != "--sequence-parallel"]
    with pytest.raises(megatron_rules.Violation, match="sequence parallelism must be used"):
        megatron_rules.validate(without_sp, plan.world_size, env, device_arch=9)


def test_uneven_interleaved_layout_gives_each_rank_the_plans_layers():
    """Virtual stage j is chunk j // pp of rank j % pp (Megatron's layout order)."""
    assert interleaved_layout([4, 5], 2) == "Et*2|t*3|t*2|t*2L"
    assert interleaved_layout([7, 8, 8, 8, 8, 8, 8, 6], 4).count("|") == 31


@requires_engine("megatron.core", "dev")
def test_moe_plan_builds_megatron_core_configs():
    import torch
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    plan, args = exported_args()
    ns = megatron_rules.validate(args, plan.world_size, {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, device_arch=9)
    layout = PipelineParallelLayerLayout(ns.pipeline_model_parallel_layout, ns.pipeline_model_parallel_size)
    config = MLATransformerConfig(
        num_layers=ns.num_layers, hidden_size=ns.hidden_size, ffn_hidden_size=ns.ffn_hidden_size,
        num_attention_heads=ns.num_attention_heads, gated_linear_unit=ns.swiglu,
        tensor_model_parallel_size=ns.tensor_model_parallel_size,
        pipeline_model_parallel_size=ns.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=ns.virtual_pipeline_model_parallel_size,
        sequence_parallel=ns.sequence_parallel, bf16=ns.bf16, pipeline_dtype=torch.bfloat16,
        pipeline_model_parallel_layout=layout,
        num_moe_experts=ns.num_experts, moe_router_topk=ns.moe_router_topk, moe_ffn_hidden_size=ns.moe_ffn_hidden_size,
        moe_shared_expert_intermediate_size=ns.moe_shared_expert_intermediate_size,
        moe_layer_freq=megatron_rules.moe_layer_pattern(ns), moe_grouped_gemm=ns.moe_grouped_gemm,
        moe_token_dispatcher_type=ns.moe_token_dispatcher_type,
        moe_router_score_function=ns.moe_router_score_function,
        moe_router_enable_expert_bias=ns.moe_router_enable_expert_bias,
        expert_model_parallel_size=ns.expert_model_parallel_size,
        expert_tensor_parallel_size=ns.expert_tensor_parallel_size,
        q_lora_rank=ns.q_lora_rank, kv_lora_rank=ns.kv_lora_rank, qk_head_dim=ns.qk_head_dim,
        qk_pos_emb_head_dim=ns.qk_pos_emb_head_dim, v_head_dim=ns.v_head_dim, multi_latent_attention=True)
    # megatron-core's layout is [pp rank][chunk] -> layer types
    per_rank = [sum(kind.name == "decoder" for chunk in rank for kind in chunk)
                for rank in config.pipeline_model_parallel_layout.layout]
    assert per_rank == SIZES


@pytest.mark.parametrize("target", ["mindspore", "torchtitan", "deepspeed", "mindformers"])
def test_dense_targets_refuse_experts_before_anything_else(target):
    refusals = config_refusals(TARGETS[target], MINI_DEEPSEEK, CONFIG, 8, "bf16")
    assert refusals and refusals[0].capability == "experts"
    assert "gplan export PLAN --to megatron" in refusals[0].hint(target)


def test_the_torch_worker_refuses_what_its_moe_layer_does_not_run():
    """Latent attention at tp = cp = 1, experts at tp = etp = 1 and zero 0 (backends/torch/moe.py)."""
    found = {r.capability for r in config_refusals(TARGETS["torch"], MINI_DEEPSEEK, CONFIG, 8, "bf16")}
    assert found == {"latent_attention", "expert_tp", "expert_zero", "uneven_interleaved"}  # 9 layers, pp·vpp 4
    runnable = ParallelConfig(dp=8, pp=2, ep=4, zero=0)
    assert config_refusals(TARGETS["torch"], MINI_DEEPSEEK, runnable, 8, "bf16") == []


def test_even_interleaved_split_counts_the_embedding_and_loss_as_layers():
    """Megatron's split when pp·vpp does not divide the layers: DeepSeek-V3's published layout
    (Et|(tt|)*30mL: 7/8/…/8/6 per rank) and Llama 3.1 405B's 126 layers on pp 16 × vpp 8 (the first
    chunk the embedding alone, the last the loss alone)."""
    from gplan.profiles.catalogue import load_model
    from gplan.spec.parallel import check_config, even_stage_sizes

    assert even_stage_sizes(61, 8, 4) == [7, 8, 8, 8, 8, 8, 8, 6]
    assert even_stage_sizes(126, 16, 8) == [7] + [8] * 14 + [7]
    assert even_stage_sizes(64, 8, 4) == [8] * 8  # divisible: the plain even split
    config = ParallelConfig(dp=9, tp=8, pp=16, vpp=8, sp=True, zero=1)
    check_config(load_model("llama3-405b"), TrainingSpec(gbs=1152, seq_length=8192), config, config.world_size)


@requires_engine("megatron.core", "dev")
def test_megatron_core_builds_the_405b_layout_with_an_embedding_only_and_a_loss_only_chunk():
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    sizes = [7] + [8] * 14 + [7]
    text = interleaved_layout(sizes, 8)
    assert text.startswith("E|") and text.endswith("|L")
    layout = PipelineParallelLayerLayout(text, 16)
    assert [sum(kind.name == "decoder" for chunk in rank for kind in chunk) for rank in layout.layout] == sizes
