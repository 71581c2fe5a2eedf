"""Mixture-of-experts plans exported to Megatron-LM: the MoE and MLA flags through Megatron's own rules
(megatron_rules.py, from arguments.py) and megatron-core's configuration classes, the uneven interleaved
layout rank by rank; every dense-only target refuses them first."""

from __future__ import annotations

import pytest

from gplan.engines.megatron.export import interleaved_layout, megatron_args
from gplan.plan import layouts_of
from gplan.planner.build import make_plan
from gplan.profiles.catalogue import load_cluster
from gplan.spec.model import ModelSpec
from gplan.spec.parallel import ParallelConfig, layout_from_sizes
from gplan.spec.targets import TARGETS, config_refusals, runs_as
from gplan.spec.training import TrainingSpec
from helpers import requires_engine
import megatron_rules

#: A small DeepSeek-V3-shaped model: a dense first layer, 8 routed experts (top 2) and a shared one,
#: sigmoid routing, multi-head latent attention.
MINI_DEEPSEEK = ModelSpec(
    name="mini-deepseek", num_layers=9, hidden_size=512, num_attention_heads=8, ffn_hidden_size=1536,
    ffn_kind="swiglu", vocab_size=32000, seq_length=1024, norm="rmsnorm", position_embedding="rope",
    head_dim=64, num_experts=8, top_k=2, moe_ffn_hidden_size=256, num_shared_experts=1, first_dense_layers=1,
    router="sigmoid", q_lora_rank=192, kv_lora_rank=128, qk_rope_head_dim=32, v_head_dim=64,
    router_groups=4, router_group_topk=2, router_topk_scale=2.5)
CONFIG = ParallelConfig(dp=4, tp=2, pp=2, vpp=2, ep=4, sp=True, zero=1)
SIZES = [4, 5]  # uneven interleaved: 2+2 and 3+2 layers per chunk


def moe_plan():
    training = TrainingSpec(gbs=32, seq_length=1024, engine="megatron")
    layouts = layout_from_sizes(MINI_DEEPSEEK, SIZES, ["none", "none"])
    return make_plan(MINI_DEEPSEEK, training, load_cluster("dgx-h100", CONFIG.world_size), CONFIG, layouts)


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
    # DeepSeek-V3's grouped (device-limited) routing and its routed-weight scale
    assert (ns.moe_router_num_groups, ns.moe_router_group_topk, ns.moe_router_topk_scaling_factor) == (4, 2, 2.5)


def test_megatrons_rules_refuse_what_the_export_must_never_write():
    plan, args = exported_args()
    env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    broken = [a if a != "4" or args[i - 1] != "--expert-model-parallel-size" else "3" for i, a in enumerate(args)]
    with pytest.raises(megatron_rules.Violation, match="multiple of expert model parallel"):
        megatron_rules.validate(broken, plan.world_size, env, device_arch=9)
    without_sp = [a for a in args if a != "--sequence-parallel"]
    assert "--tp-comm-overlap" in args  # priced overlapped, so exported with it: it needs sp first
    with pytest.raises(megatron_rules.Violation, match="overlap can happen only when sequence parallelism"):
        megatron_rules.validate(without_sp, plan.world_size, env, device_arch=9)
    with pytest.raises(megatron_rules.Violation, match="sequence parallelism must be used"):
        megatron_rules.validate([a for a in without_sp if a != "--tp-comm-overlap"], plan.world_size, env, device_arch=9)


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
        moe_router_num_groups=ns.moe_router_num_groups, moe_router_group_topk=ns.moe_router_group_topk,
        moe_router_topk_scaling_factor=ns.moe_router_topk_scaling_factor,
        expert_model_parallel_size=ns.expert_model_parallel_size,
        expert_tensor_parallel_size=ns.expert_tensor_parallel_size,
        q_lora_rank=ns.q_lora_rank, kv_lora_rank=ns.kv_lora_rank, qk_head_dim=ns.qk_head_dim,
        qk_pos_emb_head_dim=ns.qk_pos_emb_head_dim, v_head_dim=ns.v_head_dim, multi_latent_attention=True)
    # megatron-core's layout is [pp rank][chunk] -> layer types
    per_rank = [sum(kind.name == "decoder" for chunk in rank for kind in chunk)
                for rank in config.pipeline_model_parallel_layout.layout]
    assert per_rank == SIZES


@pytest.mark.parametrize("target", ["mindspore", "deepspeed"])
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


def exported_and_read_back(tmp_path, gplan, plan) -> dict:
    """`plan` exported for torchtitan and priced again from the exported launch (--from, no MODEL): what it gives
    back, at the plan's own step and memory (asserted here)."""
    import json

    plan_path, out = tmp_path / "plan.json", tmp_path / "tt"
    plan_path.write_text(plan.model_dump_json())
    assert gplan("export", str(plan_path), "--to", "torchtitan", "--out-dir", str(out)).code == 0
    back = gplan("estimate", "--from", str(out / "torchtitan_train.sh"), "--cluster", "dgx-h100", "--json").json()
    written = json.loads(plan_path.read_text())["prediction"]
    assert back["step_time_s"] == pytest.approx(written["step_time_s"], rel=1e-6)
    assert back["memory_bytes_per_device_max"] == pytest.approx(written["memory_bytes_per_device_max"], rel=1e-6)
    return back


# ---- torchtitan: its own qwen3 and deepseek_v3 MoE models ----------------------------------------------

def titan_plan(model_name: str, config: ParallelConfig):
    from gplan.profiles.catalogue import load_model

    training = TrainingSpec(gbs=256, seq_length=4096, engine="torchtitan")
    return make_plan(load_model(model_name), training, load_cluster("dgx-h100", config.world_size), config, None)


TITAN_MOE = {
    "qwen3-30b-a3b dp8 pp2 ep8": ("qwen3-30b-a3b", ParallelConfig(dp=8, pp=2, ep=8, zero=1)),
    "qwen3-30b-a3b dp4 tp2 etp2 (experts tp-sharded)": ("qwen3-30b-a3b", ParallelConfig(dp=4, tp=2, etp=2, sp=True,
                                                                                           zero=1)),
    "qwen3-235b-a22b dp8 tp4 pp2 ep32 (ep over fsdp × tp)": ("qwen3-235b-a22b",
                                                           ParallelConfig(dp=8, tp=4, pp=2, ep=32, sp=True, zero=1)),
    "deepseek-v3 dp16 pp4 ep16": ("deepseek-v3", ParallelConfig(dp=16, pp=4, ep=16, zero=1)),
    # no pipeline: torchtitan's CUDA graphs (on by default) refuse ep's host-synced exchange unless disabled
    "qwen3-30b-a3b dp8 ep8 zero3 (FSDP + EP, no pp)": ("qwen3-30b-a3b", ParallelConfig(dp=8, ep=8, zero=3)),
    # its gpt_oss model: windows on the even layers, sinks, biases, the clamped unit; FSDP + EP with stages
    "gpt-oss-20b dp8 pp2 ep8 zero3": ("gpt-oss-20b", ParallelConfig(dp=8, pp=2, ep=8, zero=3)),
    "gpt-oss-120b dp8 tp2 ep16 zero3": ("gpt-oss-120b", ParallelConfig(dp=8, tp=2, ep=16, sp=True, zero=3)),
}


@requires_engine("torchtitan", "dev")
@pytest.mark.parametrize("name", list(TITAN_MOE))
def test_torchtitan_builds_the_plans_moe_model_and_mesh(name, tmp_path):
    """torchtitan's ConfigManager parses the export, its model config validates it against the parallel
    degrees (update_from_config: tp over heads, ep token dispatch), its model builds on the meta device
    with the plan's parameter count, and its ParallelDims accepts the degrees with ep folded in."""
    import torch
    from torchtitan.distributed.parallel_dims import ParallelDims
    from test_exporters import titan_parse

    plan = titan_plan(*TITAN_MOE[name])
    config = titan_parse(tmp_path, plan)
    p, c = config.parallelism, plan.parallel
    assert config.model_spec.name == ("deepseek_v3" if plan.model.is_mla else "gpt_oss" if plan.model.attention_sinks
                                      else "qwen3")
    model_config = config.model_spec.model
    model_config.update_from_config(config=config)
    with torch.device("meta"):
        built = model_config.build()
    # the routing bias of sigmoid routing is a buffer in torchtitan (updated outside the optimizer, on every
    # router); gplan counts it as a parameter of sigmoid routers (Megatron's --moe-router-enable-expert-bias)
    bias = sum(b.numel() for n, b in built.named_buffers() if n.endswith("expert_bias_E"))
    counted_bias = bias if plan.model.router == "sigmoid" else 0
    assert sum(x.numel() for x in built.parameters()) + counted_bias == plan.model.total_params()
    assert p.expert_parallel_degree == c.ep
    dims = ParallelDims(dp_replicate=p.data_parallel_replicate_degree, dp_shard=p.data_parallel_shard_degree,
                        cp=p.context_parallel_degree, tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
                        ep=p.expert_parallel_degree, world_size=plan.world_size)
    efsdp, rest = divmod(dims.dp_shard * dims.cp * dims.tp, dims.ep)
    assert rest == 0 and efsdp == c.edp * c.etp  # torchtitan's expert-side sharding = gplan's etp · edp
    if c.pp > 1:
        parts = p.module_fqns_per_model_part
        per_rank = [sum(x.startswith("layers.") for x in parts[r]) for r in range(c.pp)]
        assert per_rank == [s.num_layers for s in layouts_of(plan)]


def test_torchtitan_refuses_what_its_moe_code_does_not_build_or_shard():
    from gplan.profiles.catalogue import load_model

    titan, qwen = TARGETS["torchtitan"], load_model("qwen3-30b-a3b")

    def refused(model, config):
        return {r.capability for r in config_refusals(titan, model, config, 8, "bf16")}

    assert refused(load_model("mixtral-8x7b"), ParallelConfig(dp=8, ep=8, zero=1)) == {"experts"}  # no Mixtral model
    assert refused(qwen, ParallelConfig(dp=4, tp=2, sp=True, zero=1)) == {"expert_tp"}  # tp without ep: etp = tp
    assert refused(qwen, ParallelConfig(dp=4, tp=2, ep=2, etp=2, sp=True, zero=1)) == {"expert_tp"}  # ep: etp = 1
    assert refused(qwen, ParallelConfig(dp=8, ep=8, zero=0)) == {"expert_zero"}  # DDP replicas hold no ep ranks
    assert refused(qwen, ParallelConfig(dp=4, tp=2, ep=2, sp=True, zero=0)) == set()  # ep inside tp
    # latent attention over tp: 0.3.0's deepseek_v3 sharding runs it (its up-projections colwise, wo rowwise)
    assert refused(load_model("deepseek-v3"), ParallelConfig(dp=4, tp=2, ep=8, sp=True, zero=1)) == set()
    dropping = qwen.model_copy(update={"capacity_factor": 1.25})  # torchtitan routes dropless
    assert refused(dropping, ParallelConfig(dp=8, ep=8, zero=1)) == {"experts"}
    assert config_refusals(TARGETS["megatron"], dropping, ParallelConfig(dp=8, ep=8, zero=1), 8, "bf16") == []


def test_a_torchtitan_search_pairs_each_ep_with_the_etp_torchtitan_runs():
    from gplan.planner.space import SearchLimits, expert_options
    from gplan.profiles.catalogue import load_model

    qwen = load_model("qwen3-30b-a3b")
    pairs = set(expert_options(qwen, 8, SearchLimits(), tp=2, engine="torchtitan"))
    assert pairs == {(1, 2), (2, 1), (4, 1), (8, 1)}
    assert set(expert_options(qwen, 8, SearchLimits(), tp=2, engine="megatron")) == {(1, 1), (2, 1), (4, 1), (8, 1)}


def test_deepspeed_runs_mixtral_shaped_experts_without_pipeline_stages():
    from gplan.profiles.catalogue import load_model

    ds, mixtral = TARGETS["deepspeed"], load_model("mixtral-8x7b")

    def refused(model, config):
        return {r.capability for r in config_refusals(ds, model, config, 8, "bf16")}

    assert refused(mixtral, ParallelConfig(dp=8, tp=2, ep=8, sp=True, zero=1)) == set()
    assert refused(mixtral, ParallelConfig(dp=8, ep=8, zero=2)) == set()  # its ZeRO-2 optimizer takes MoE layers
    assert refused(mixtral, ParallelConfig(dp=8, ep=8, zero=3)) == {"expert_zero"}  # "MoE not supported with Stage 3"
    assert refused(mixtral, ParallelConfig(dp=8, pp=2, ep=8, zero=1)) == {"experts"}  # no pp with MoE
    assert refused(mixtral, ParallelConfig(dp=8, tp=2, ep=4, etp=2, sp=True, zero=1)) == {"expert_tp"}
    assert refused(load_model("qwen3-30b-a3b"), ParallelConfig(dp=8, ep=8, zero=1)) == {"experts"}  # QK norm


def test_deepseek_v3_config_json_reads_and_exports_its_grouped_routing(tmp_path):
    """DeepSeek-V3's config.json: n_group 8, topk_group 4, routed_scaling_factor 2.5 — written as
    Megatron's --moe-router-num-groups / --moe-router-group-topk / --moe-router-topk-scaling-factor."""
    import json

    from gplan.profiles.catalogue import load_model

    config = deepseek_v3_config()
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    model = load_model(str(path))
    assert (model.router_groups, model.router_group_topk, model.router_topk_scale) == (8, 4, 2.5)
    bundled = load_model("deepseek-v3")
    assert (bundled.router_groups, bundled.router_group_topk, bundled.router_topk_scale) == (8, 4, 2.5)


def test_qwen2_exports_qkv_bias_only():
    """Qwen2's q/k/v biases: --add-qkv-bias beside --disable-bias-linear, which megatron-core builds
    (TransformerConfig.add_qkv_bias); the dense exports without biases refuse it."""
    from gplan.engines.megatron.export import switch_args

    qwen = ModelSpec(name="qwen2-mini", num_layers=4, hidden_size=256, num_attention_heads=4, num_kv_heads=2,
                     ffn_hidden_size=704, ffn_kind="swiglu", vocab_size=1024, seq_length=256, norm="rmsnorm",
                     position_embedding="rope", qkv_bias=True)
    training = TrainingSpec(gbs=8, seq_length=256, engine="megatron")
    plan = make_plan(qwen, training, load_cluster("dgx-h100", 8), ParallelConfig(dp=8), None)
    args = switch_args(plan)
    assert "--add-qkv-bias" in args and "--disable-bias-linear" in args
    for target in ("torchtitan", "mindspore", "mindformers"):
        assert any(r.capability == "model" for r in config_refusals(TARGETS[target], qwen, ParallelConfig(dp=8), 1, "bf16"))


@requires_engine("torchtitan", "dev")
def test_a_moe_module_pins_the_torchtitan_whose_private_builder_it_calls(monkeypatch):
    import torchtitan

    from gplan.engines.torchtitan.export import PINNED

    from gplan.backends.exporters import render_export
    from gplan.planner.build import reprice_split

    plan = titan_plan("qwen3-30b-a3b", ParallelConfig(dp=8, pp=2, ep=8, zero=1))
    source = render_export(plan, "torchtitan", reprice=reprice_split).files["gplan_torchtitan.py"]
    assert f'torchtitan.__version__ != "{PINNED}"' in source
    monkeypatch.setattr(torchtitan, "__version__", "9.9.9")
    with pytest.raises(ImportError, match=f"pip install torchtitan=={PINNED}"):
        exec(compile(source, "gplan_torchtitan.py", "exec"), {})


def deepseek_v3_config(**extra) -> dict:
    """DeepSeek-V3's config.json (deepseek-ai/DeepSeek-V3), the fields gplan reads."""
    return {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
            "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_attention_heads": 128,
            "num_key_value_heads": 128, "num_hidden_layers": 61, "vocab_size": 129280, "n_routed_experts": 256,
            "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1,
            "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
            "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
            "v_head_dim": 128, "max_position_embeddings": 163840, "rope_theta": 10000, "hidden_act": "silu",
            "tie_word_embeddings": False, "num_nextn_predict_layers": 1, **extra}


def test_deepseek_v3_multi_token_prediction_is_read_and_counted(tmp_path):
    """One MTP depth (num_nextn_predict_layers 1): a MoE layer, the 2h → h projection and three norms —
    671.0B + 11.6B (Hugging Face's 685B also counts the MTP module's own copies of the embedding and the
    head, 2 × 0.93B, which Megatron shares with the model)."""
    import json

    from gplan.profiles.catalogue import load_model

    path = tmp_path / "config.json"
    path.write_text(json.dumps(deepseek_v3_config()))
    with_mtp = load_model(str(path))
    path.write_text(json.dumps(deepseek_v3_config(num_nextn_predict_layers=0)))
    without = load_model(str(path))
    assert with_mtp.mtp_layers == 1 and without.mtp_layers == 0
    extra = with_mtp.total_params() - without.total_params()
    assert extra == with_mtp.layer_params(with_mtp.mtp_kind) + 2 * 7168 * 7168 + 3 * 7168
    assert round(without.total_params() / 1e9) == 671 and 11.5e9 < extra < 11.7e9


def test_mtp_is_priced_on_the_last_stage_and_exported_as_megatron_builds_it():
    from gplan.engines.megatron.export import megatron_args

    mtp_model = MINI_DEEPSEEK.model_copy(update={"mtp_layers": 1})
    training = TrainingSpec(gbs=32, seq_length=1024, engine="megatron")
    layouts = layout_from_sizes(MINI_DEEPSEEK, SIZES, ["none", "none"])
    cluster = load_cluster("dgx-h100", CONFIG.world_size)
    plain = make_plan(MINI_DEEPSEEK, training, cluster, CONFIG, layouts).prediction
    mtp_layouts = layout_from_sizes(mtp_model, SIZES, ["none", "none"])
    priced = make_plan(mtp_model, training, cluster, CONFIG, mtp_layouts)
    with_mtp = priced.prediction
    first, last = (with_mtp.stages[i].forward_s - plain.stages[i].forward_s for i in (0, -1))
    assert first == 0 and last > plain.stages[-1].forward_s / SIZES[-1]  # more than one layer's forward
    assert with_mtp.stages[-1].memory_bytes > plain.stages[-1].memory_bytes
    assert with_mtp.stages[0].memory_bytes == plain.stages[0].memory_bytes
    args = megatron_args(priced, runs_as(TARGETS["megatron"], mtp_model, CONFIG, layouts_of(priced)))[0]
    ns = megatron_rules.validate(args, priced.world_size, {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, device_arch=9)
    assert ns.mtp_num_layers == 1 and ns.pipeline_model_parallel_layout.endswith("mL")
    assert {r.capability for r in config_refusals(TARGETS["torch"], mtp_model, ParallelConfig(dp=8, ep=4), 8, "bf16")} \
        >= {"mtp"}


@requires_engine("megatron.core", "dev")
def test_megatron_core_accepts_the_mtp_layout():
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    layout = PipelineParallelLayerLayout(interleaved_layout([4, 5], 2, mtp=1), 2)
    layout.validate_layer_layout(num_layers=9, mtp_num_layers=1)
    with pytest.raises(AssertionError, match="mtp"):
        PipelineParallelLayerLayout(interleaved_layout([4, 5], 2, mtp=0), 2).validate_layer_layout(9, 1)


@requires_engine("torchtitan", "dev")
def test_torchtitan_builds_a_deepep_plans_token_dispatcher(tmp_path):
    """A plan priced with the flex dispatcher exports moe_comm_backend "deepep": torchtitan's own config
    builder gives each MoE layer its DeepEP token dispatcher (built on the meta device; the kernels run
    only on GPUs with DeepEP installed)."""
    from test_exporters import titan_parse
    from torchtitan.models.common.token_dispatcher import DeepEPTokenDispatcher

    from gplan.profiles.catalogue import load_model

    config = ParallelConfig(dp=8, ep=8, zero=1)
    training = TrainingSpec(gbs=256, seq_length=4096, engine="torchtitan", moe_dispatcher="flex")
    plan = make_plan(load_model("qwen3-30b-a3b"), training, load_cluster("dgx-h100", 8), config, None)
    parsed = titan_parse(tmp_path, plan)
    found = [c for c in _walk(parsed.model_spec.model) if isinstance(c, DeepEPTokenDispatcher.Config)]
    assert len(found) == plan.model.num_layers - plan.model.first_dense_layers


def _walk(config, seen=None):
    """Every config object reachable from a torchtitan model config."""
    import dataclasses

    seen = set() if seen is None else seen
    if id(config) in seen:
        return
    seen.add(id(config))
    yield config
    children = ([getattr(config, f.name) for f in dataclasses.fields(config)] if dataclasses.is_dataclass(config)
                else list(config) if isinstance(config, (list, tuple)) else [])
    for child in children:
        if dataclasses.is_dataclass(child) or isinstance(child, (list, tuple)):
            yield from _walk(child, seen)


def test_a_plan_reducing_in_bf16_exports_torchtitans_reduce_dtype_for_main_and_reads_back(tmp_path, gplan):
    """A torchtitan plan with the gradients reduce-scattered in bf16 (torchtitan main's
    training.mixed_precision_reduce = "bfloat16", which its own MoE recipes set): the export for 0.3.0, whose
    config takes float32 only, refuses it naming the rule (exit 3, nothing written); for main it writes the
    option, and --from of that export gives it back at the same step."""
    import json

    from gplan.profiles.catalogue import load_model

    config = ParallelConfig(dp=8, ep=8, zero=3)
    training = TrainingSpec(gbs=64, seq_length=4096, engine="torchtitan", grad_reduce_in_bf16=True)
    plan = make_plan(load_model("qwen3-30b-a3b"), training, load_cluster("dgx-h100", 8), config, None)
    plan_path, out = tmp_path / "plan.json", tmp_path / "tt"
    plan_path.write_text(plan.model_dump_json())
    refused = gplan("export", str(plan_path), "--to", "torchtitan", "--out-dir", str(out))
    assert refused.code == 3 and "float32 only" in refused.stderr and "--target-version main" in refused.stderr
    assert not out.exists()
    r = gplan("export", str(plan_path), "--to", "torchtitan", "--target-version", "main", "--out-dir", str(out))
    assert r.code == 0, r.stderr
    assert "--training.mixed_precision_reduce bfloat16" in (out / "torchtitan_train.sh").read_text()
    back = gplan("estimate", "--from", str(out / "torchtitan_train.sh"), "--cluster", "dgx-h100", "--json").json()
    assert back["engine_options"]["grad_reduce_in_bf16"] is True
    assert back["step_time_s"] == pytest.approx(json.loads(plan_path.read_text())["prediction"]["step_time_s"], rel=1e-6)


@requires_engine("torchtitan", "dev")
def test_a_full_bf16_plan_exports_torchtitans_training_dtype_and_reads_back(tmp_path, gplan):
    """A plan trained in full bf16 (--pure-bf16): its export for torchtitan 0.3.0 sets training.dtype, which
    torchtitan's own ConfigManager takes; --from of the export gives it back at the same step and memory."""
    from test_exporters import titan_parse

    from gplan.profiles.catalogue import load_model

    training = TrainingSpec(gbs=64, seq_length=4096, engine="torchtitan", pure_bf16=True)
    plan = make_plan(load_model("qwen3-30b-a3b"), training, load_cluster("dgx-h100", 8), ParallelConfig(dp=8, ep=8, zero=3),
                     None)
    (tmp_path / "parsed").mkdir()
    assert titan_parse(tmp_path / "parsed", plan).training.dtype == "bfloat16"
    back = exported_and_read_back(tmp_path, gplan, plan)
    assert back["engine_options"]["pure_bf16"] is True


@requires_engine("torchtitan", "dev")
@requires_engine("torchtitan", "dev")
@pytest.mark.parametrize("chunks", [None, 4, 1])
def test_the_export_runs_the_loss_in_the_chunks_it_was_priced_in_and_reads_them_back(tmp_path, gplan, chunks):
    """torchtitan 0.3's trainer configs wrap the loss in ChunkedLossWrapper (8 chunks): the export keeps it at the
    plan's chunks, or runs the loss whole where the plan priced it so (--loss-chunks 1); torchtitan's ConfigManager
    takes either, and --from of the export prices it again at the same step and memory."""
    from test_exporters import titan_parse
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss

    from gplan.profiles.catalogue import load_model

    training = TrainingSpec(gbs=16, seq_length=8192, engine="torchtitan", loss_chunks=chunks)
    plan = make_plan(load_model("llama3-8b"), training, load_cluster("dgx-h100", 8), ParallelConfig(dp=8, zero=3),
                     None)
    (tmp_path / "parsed").mkdir()
    loss = titan_parse(tmp_path / "parsed", plan).loss
    if training.loss_chunks_run == 1:
        assert isinstance(loss, CrossEntropyLoss.Config)
    else:
        assert isinstance(loss, ChunkedLossWrapper.Config) and loss.num_chunks == training.loss_chunks_run
    back = exported_and_read_back(tmp_path, gplan, plan)


def test_a_compiled_loss_exports_torchtitans_compile_of_the_loss_alone_and_reads_back(tmp_path, gplan):
    """A plan with the loss compiled (--compiled-loss): its export for torchtitan 0.3.0 compiles the loss and not
    the model (what was priced), which torchtitan's own ConfigManager takes; --from of the export gives it back at
    the same step and memory, below the eager loss's (both over the whole sequence: --loss-chunks 1)."""
    from test_exporters import titan_parse

    from gplan.profiles.catalogue import load_model

    training = TrainingSpec(gbs=8, seq_length=32768, engine="torchtitan", compiled_loss=True, loss_chunks=1)
    plan = make_plan(load_model("llama3-8b"), training, load_cluster("dgx-h100", 8), ParallelConfig(dp=8, zero=3,
                     recompute="full"), None)
    (tmp_path / "parsed").mkdir()
    compile_config = titan_parse(tmp_path / "parsed", plan).compile
    assert compile_config.enable and list(compile_config.components) == ["loss"]
    back = exported_and_read_back(tmp_path, gplan, plan)
    assert back["engine_options"]["compiled_loss"] is True
    eager = gplan("estimate", "llama3-8b", "--cluster", "dgx-h100", "--devices", "8", "--dp", "8", "--zero", "3",
                  "--recompute", "full", "--gbs", "8", "--seq-length", "32768", "--target", "torchtitan", "--loss-chunks",
                  "1", "--json").json()
    logits = 32768 * load_model("llama3-8b").vocab_size
    # the fp32 copy kept to the backward is gone: 4 bytes a logit fewer activations
    kept = [d["stages"][0]["memory"]["activations_bytes"] for d in (eager, back)]
    assert kept[0] - kept[1] == pytest.approx(4 * logits, rel=0.01)
    # and the loss backward's fp32 gradient (4 more) with it, unless a layer's full replay is then the larger transient
    saved = eager["memory_bytes_per_device_max"] - back["memory_bytes_per_device_max"]
    assert 4 * logits < saved <= 8 * logits * 1.01


@requires_engine("torchtitan", "dev")
def test_an_fsdp_offload_plan_exports_torchtitans_cpu_offload_and_reads_back(tmp_path, gplan):
    """A plan with FSDP's CPU offload (--fsdp-offload): its export for torchtitan 0.3.0 sets
    training.enable_cpu_offload, which torchtitan's own ConfigManager takes; --from of the export gives it back
    at the same step and memory, with the note that the host's step is assumed."""
    import json

    from test_exporters import titan_parse

    from gplan.profiles.catalogue import load_model

    training = TrainingSpec(gbs=8, seq_length=8192, engine="torchtitan", fsdp_offload=True)
    plan = make_plan(load_model("llama3-70b"), training, load_cluster("dgx-h100", 8), ParallelConfig(dp=8, zero=3,
                     recompute="full"), None)
    (tmp_path / "parsed").mkdir()
    assert titan_parse(tmp_path / "parsed", plan).training.enable_cpu_offload is True
    back = exported_and_read_back(tmp_path, gplan, plan)
    assert back["engine_options"]["fsdp_offload"] is True
    assert "an assumption no measured run checks" in json.dumps(back["not_read"])


@pytest.mark.parametrize("argv, says", [
    (["--target", "megatron", "--fsdp-offload"], "capability fsdp_offload"),
    (["--target", "torchtitan", "--zero", "1", "--fsdp-offload"], "CPU offload with the weights resharded"),
    (["--target", "torchtitan", "--dp", "1", "--tp", "8", "--zero", "3", "--fsdp-offload"], "nothing is sharded"),
    (["--target", "megatron", "--compiled-loss"], "capability compiled_loss"),
    (["--target", "megatron"], "capability pure_bf16"),
    (["--target", "torchtitan", "--precision", "fp32"], "the run trains in fp32"),
])
def test_pure_bf16_where_it_cannot_run_is_refused_with_a_hint(gplan, argv, says):
    options = [a for a in argv if a in ("--compiled-loss", "--fsdp-offload")] or ["--pure-bf16"]
    argv = [a for a in argv if a not in options]
    r = gplan("estimate", "llama3-8b", "--cluster", "dgx-h100", "--devices", "8", *options, *argv)
    assert r.code == 3 and says in r.stderr and "hint:" in r.stderr
    assert "Traceback" not in r.stderr


@requires_engine("torchtitan", "dev")
def test_torchtitan_runs_latent_attention_with_tp_and_cp(tmp_path, gplan):
    """torchtitan 0.3.0 shards DeepSeek-V3's latent attention over tp (its sharding.py: up-projections colwise,
    wo rowwise) and runs cp around its inner attention (parallelize.py, apply_cp_to_forward): such a layout is
    priced for --target torchtitan, and its export is taken by torchtitan's own parser with those degrees."""
    from test_exporters import titan_parse

    from gplan.profiles.catalogue import load_model

    r = gplan("estimate", "deepseek-v3-16b", "--cluster", "dgx-h100", "--devices", "16", "--tp", "2", "--cp", "2",
              "--dp", "4", "--ep", "8", "--zero", "3", "--target", "torchtitan", "--json")
    assert r.code == 0, r.stderr
    assert r.json()["target_runs_it"] is True
    config = ParallelConfig(dp=4, tp=2, cp=2, ep=8, sp=True, zero=3)
    training = TrainingSpec(gbs=32, seq_length=4096, engine="torchtitan")
    plan = make_plan(load_model("deepseek-v3-16b"), training, load_cluster("dgx-h100", 16), config, None)
    parsed = titan_parse(tmp_path, plan).parallelism
    assert (parsed.tensor_parallel_degree, parsed.context_parallel_degree, parsed.expert_parallel_degree) == (2, 2, 8)


def graphed_titan_plans() -> dict:
    """qwen3-30b-a3b on 8 H100 under FSDP at ep 1, no stages, priced by torchtitan without and with 0.3's CUDA graphs."""
    from gplan.profiles.catalogue import load_model

    config = ParallelConfig(dp=8, zero=3, recompute="full")
    return {graphs: make_plan(load_model("qwen3-30b-a3b"), TrainingSpec(gbs=64, seq_length=4096, engine="torchtitan",
                                                                       cuda_graphs=graphs),
                              load_cluster("dgx-h100", 8), config, None) for graphs in ("none", "full_iteration")}


def test_torchtitans_cuda_graphs_are_priced_exported_and_read_back_as_03_runs_them(tmp_path, gplan):
    """torchtitan 0.3 captures a step's forward and backward in one CUDA graph unless told not to: an MoE plan priced
    with them (no host time in its MoE layers) exports with 0.3's default and is read back with them; one priced
    without them exports --training.disable_cuda_graphs and is read back without — each at its own step."""
    plans = graphed_titan_plans()
    assert plans["full_iteration"].prediction.step_time_s < plans["none"].prediction.step_time_s
    for graphs, plan in plans.items():
        folder = tmp_path / graphs
        folder.mkdir()
        back = exported_and_read_back(folder, gplan, plan)
        assert ("--training.disable_cuda_graphs" in (folder / "tt" / "torchtitan_train.sh").read_text()) == (graphs == "none")
        assert back["engine_options"].get("cuda_graphs", "none") == graphs


@requires_engine("torchtitan", "dev")
def test_torchtitan_validates_the_cuda_graphs_of_the_export(tmp_path):
    """torchtitan's own Trainer.Config._validate_cuda_graphs accepts both exports: graphs at ep 1 without stages,
    and, disabled, an ep 8 plan's (which with 0.3's default it refuses)."""
    from test_exporters import titan_parse

    for name, plan in (("graphed", graphed_titan_plans()["full_iteration"]),
                       ("ep8", titan_plan("qwen3-30b-a3b", ParallelConfig(dp=8, ep=8, zero=3)))):
        folder = tmp_path / name
        folder.mkdir()
        config = titan_parse(folder, plan)
        assert config.training.disable_cuda_graphs == (plan.training.cuda_graphs == "none")
        config._validate_cuda_graphs()
        if plan.parallel.ep > 1:
            config.training.disable_cuda_graphs = False
            with pytest.raises(ValueError, match="without CPU synchronization"):
                config._validate_cuda_graphs()


@requires_engine("torchtitan", "dev")
def test_torchtitan_builds_an_fp8_moe_export_with_its_experts_in_fp8(tmp_path, monkeypatch):
    """An fp8 mixture of experts for torchtitan, priced with its experts' grouped GEMMs in the recipe: its export
    converts them too (Float8GroupedExpertsConverter beside the linears' converter), and torchtitan's parser builds
    every routed experts' module as its float8 grouped-GEMM class."""
    import torchtitan.components.quantization.float8 as float8
    from torchtitan.models.common.moe import GroupedExperts

    from gplan.profiles.catalogue import load_model
    from test_exporters import titan_parse

    training = TrainingSpec(gbs=256, seq_length=4096, engine="torchtitan", precision="fp8-rowwise")
    plan = make_plan(load_model("qwen3-30b-a3b"), training, load_cluster("dgx-h100", 8), ParallelConfig(dp=8, ep=8, zero=3),
                     None)
    monkeypatch.setattr(float8, "has_cuda_capability", lambda major, minor: True)
    config = titan_parse(tmp_path, plan)
    experts = [type(c).__qualname__ for _, c, _, _ in config.model_spec.model.traverse(GroupedExperts.Config)]
    assert len(experts) == plan.model.num_layers and all("Float8" in name for name in experts), set(experts)


def host_free_titan_plans() -> dict:
    """deepseek-v3-16b on 8 H100 under FSDP + EP 8 with 0.3's CUDA graphs, through its two exchanges that never wait
    on the host: HybridEP at a non-blocking capacity, MinimalAsyncEP (full recompute, its rule)."""
    from gplan.profiles.catalogue import load_model

    config = ParallelConfig(dp=8, ep=8, mbs=2, zero=3, recompute="full")
    exchanges = {"hybridep": {"moe_dispatcher": "flex", "moe_dispatch_capacity": 0.5},
                 "minimal_async_ep": {"moe_dispatcher": "symmetric_memory"}}
    return {name: make_plan(load_model("deepseek-v3-16b"),
                            TrainingSpec(gbs=32, seq_length=4096, engine="torchtitan", cuda_graphs="full_iteration",
                                         **options), load_cluster("dgx-h100", 8), config, None)
            for name, options in exchanges.items()}


def test_the_host_free_exchanges_export_and_read_back_with_their_graphs(tmp_path, gplan):
    """Each exports its moe_comm_backend (and HybridEP's capacity) in the config module, keeps 0.3's CUDA graphs at
    ep 8, and reads back with the same exchange and graphs at its own step and memory."""
    for name, plan in host_free_titan_plans().items():
        folder = tmp_path / name
        folder.mkdir()
        back = exported_and_read_back(folder, gplan, plan)
        module = (folder / "tt" / "gplan_torchtitan.py").read_text()
        assert f"MOE_COMM_BACKEND = {name!r}" in module and "DISABLE_CUDA_GRAPHS = False" in module
        assert "--training.disable_cuda_graphs" not in (folder / "tt" / "torchtitan_train.sh").read_text()
        t = plan.training
        assert back["engine_options"]["moe_dispatcher"] == t.moe_dispatcher
        assert back["engine_options"].get("moe_dispatch_capacity") == t.moe_dispatch_capacity
        assert back["engine_options"]["cuda_graphs"] == "full_iteration"


@requires_engine("torchtitan", "dev")
def test_torchtitan_builds_the_host_free_exchanges_of_the_export(tmp_path):
    """torchtitan's own parser and runtime config over each export: the dispatcher the plan priced (HybridEP with its
    capacity, MinimalAsyncEP), its buffer sized for a rank's local batch as gplan prices it (update_ep_token_
    dispatcher_config: local batch · seq / (cp·tp)), MinimalAsyncEP's full-recompute rule passed, and its CUDA graphs
    at ep 8 accepted (_validate_cuda_graphs) where the all-to-all's are refused."""
    from test_exporters import titan_parse
    from torchtitan.models.common.token_dispatcher import (HybridEPTokenDispatcher, MinimalAsyncEPTokenDispatcher,
                                                           update_ep_token_dispatcher_config)

    kinds = {"hybridep": HybridEPTokenDispatcher.Config, "minimal_async_ep": MinimalAsyncEPTokenDispatcher.Config}
    for name, plan in host_free_titan_plans().items():
        folder = tmp_path / name
        folder.mkdir()
        config = titan_parse(folder, plan)
        model = config.model_spec.model
        update_ep_token_dispatcher_config(model, config)  # MinimalAsyncEP: refuses anything but full recompute
        dispatchers = [layer.moe.routed_experts.token_dispatcher for layer in model.layers if getattr(layer, "moe", None)]
        assert dispatchers and all(isinstance(d, kinds[name]) for d in dispatchers)
        assert dispatchers[0].num_max_tokens_per_rank == plan.parallel.mbs * plan.training.seq_length
        if name == "hybridep":
            assert dispatchers[0].non_blocking_capacity_factor == plan.training.moe_dispatch_capacity
        assert config.training.disable_cuda_graphs is False
        config._validate_cuda_graphs()
