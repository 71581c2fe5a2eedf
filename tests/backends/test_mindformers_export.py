"""`gplan export --to mindformers`, read back by MindFormers' own code.

Each exported YAML goes through what a MindFormers training run does with it before the first step:
the YAML loader and its run-mode template (`MindFormerConfig`), the context validators,
`build_parallel_config` (which builds `TransformerOpParallelConfig` and `TransformerRecomputeConfig`),
the parallel operator that hands the `parallel` section to `mindspore.set_auto_parallel_context`,
`check_rules`, the trainer's global-batch rule, and `LayerSetting`, which gives every layer its
pipeline stage and recompute. The test install puts MindFormers 2.1 beside MindSpore 2.10 with
`--no-deps` (it asks for MindSpore 2.11, which is not published for this platform; see the README).
"""

from __future__ import annotations

import pytest
import yaml
from helpers import ASCEND_SHAPES, ascend_plan, requires_engine

from gplan.plan import layouts_of
from gplan.backends.exporters import recompute_counts, render_export, stage_sizes
from gplan.backends.mindspore.strategy import layout

pytestmark = [requires_engine("mindspore", "mindspore"), requires_engine("mindformers", "dev")]

SHAPES = {
    **ASCEND_SHAPES,
    "four_nodes_dp8_tp4": dict(dp=8, tp=4),  # the plan the msrun dry-run test prints
    "pp_vpp_zero1": dict(dp=2, tp=2, pp=2, vpp=2, zero=1, schedule="interleaved_1f1b"),
    "pp4_mixed_recompute": dict(tp=2, pp=4, stages=[[("selective", 7)], [("full", 3), ("none", 6)],
                                                    [("none", 9)], [("full", 7)]]),
}


@pytest.fixture(scope="module")
def mindformers(tmp_path_factory):
    """MindFormers, logging under a temporary folder (it reads the folder when first imported)."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("LOCAL_DEFAULT_PATH", str(tmp_path_factory.mktemp("mindformers")))
        import mindformers

        yield mindformers


@pytest.fixture
def read_back(mindformers, tmp_path, monkeypatch):
    """Export a plan, then run MindFormers' configuration path on the file; returns what it built."""
    import mindspore as ms
    from mindformers.core.context.build_context import MFContextOperator
    from mindformers.core.context.parallel import ParallelOperator
    from mindformers.core.context.validators import execute_validator
    from mindformers.core.parallel_config import build_parallel_config
    from mindformers.parallel_core.training_graph.transformer.utils import LayerSetting
    from mindformers.tools.check_rules import check_rules
    from mindformers.tools.register.config import MindFormerConfig
    from mindformers.trainer.base_trainer import BaseTrainer

    def run(plan, edit=lambda data: None):
        data = yaml.safe_load(render_export(plan, "mindformers").files["mindformers_parallel.yaml"])
        edit(data)
        path = tmp_path / "mindformers_parallel.yaml"
        path.write_text(yaml.safe_dump(data))
        monkeypatch.setenv("RANK_SIZE", str(plan.world_size))  # MindFormers' device number without HCCL
        config = MindFormerConfig(str(path))
        MFContextOperator.reset_instance()
        if config.use_legacy is False:  # parallel_core models: MindFormers' context says so to every builder
            MFContextOperator(config)
        execute_validator(config)
        build_parallel_config(config)
        operator = ParallelOperator(config)
        ms.reset_auto_parallel_context()
        operator.parallel_ctx["device_num"] = plan.world_size
        ParallelOperator._set_ms_auto_parallel_context(**operator.parallel_ctx)
        # The trainer passes its network and dataset, which skips the dataset-section checks.
        check_rules(config, mode="train", network=object(), dataset=object())
        trainer = BaseTrainer.__new__(BaseTrainer)
        trainer.config = config
        trainer._check_global_batch_size_for_auto_parallel()
        model = config.model.model_config
        if config.use_legacy is False:  # parallel_core: layers are set from the converted TransformerConfig
            transformer = transformer_config(config)
            setting = LayerSetting(transformer.num_layers, transformer.offset, transformer,
                                   transformer.virtual_pipeline_model_parallel_size or 1)
        else:
            setting = LayerSetting(model.num_layers, model.offset, config.parallel_config, model.pp_interleave_num or 1)
        return config, trainer, setting

    yield run
    MFContextOperator.reset_instance()  # a singleton: the next test starts from MindFormers' defaults
    ms.reset_auto_parallel_context()


def transformer_config(config):
    """What a parallel_core model does with its model config first: MindFormers' converter into its
    TransformerConfig (an unknown key is an error there; __post_init__ checks recompute and MoE)."""
    from mindformers.models.build_config import get_model_config

    config.model.model_config.parallel_config = config.parallel_config
    model_config = get_model_config(config.model)
    return model_config.convert_to_transformer_config(is_mla_model=bool(config.model.model_config.multi_latent_attention))


def plan_stage_of_layer(plan) -> list[int]:
    """Pipeline rank of every layer in execution order; interleaved chunks go round the ranks
    (Megatron's virtual pipeline: chunk k of L / (pp·vpp) layers sits on rank k mod pp)."""
    from gplan.spec.parallel import chunk_sizes

    c = plan.parallel
    if c.vpp > 1:  # virtual stage v·pp + r holds chunk v of rank r (uneven chunks as spec.parallel.chunk_sizes)
        sizes = [s.layer_end - s.layer_start for s in plan.stages]
        chunks = [chunk_sizes(n, c.vpp, first=r == 0, last=r == c.pp - 1) for r, n in enumerate(sizes)]
        return [r for v in range(c.vpp) for r in range(c.pp) for _ in range(chunks[r][v])]
    return [s.index for s in plan.stages for _ in range(s.layer_end - s.layer_start)]


@pytest.mark.parametrize("name", list(SHAPES))
def test_mindformers_builds_the_plans_parallel_layout(name, read_back):
    import mindspore as ms
    from mindformers.modules.transformer import TransformerOpParallelConfig

    plan = ascend_plan(**SHAPES[name])
    c = plan.parallel
    config, trainer, setting = read_back(plan)

    parallel = config.parallel_config
    assert isinstance(parallel, TransformerOpParallelConfig)
    assert (parallel.data_parallel, parallel.model_parallel, parallel.pipeline_stage) == (c.dp, c.tp, c.pp)
    assert parallel.use_seq_parallel == (c.sp and c.tp > 1)
    assert config.parallel.parallel_mode == "semi_auto_parallel"
    assert ms.get_auto_parallel_context("pipeline_stages") == c.pp
    assert ms.get_auto_parallel_context("enable_parallel_optimizer") == (c.zero >= 1)
    assert trainer.global_batch_size == plan.training.gbs


@pytest.mark.parametrize("name", list(SHAPES))
def test_mindformers_puts_every_layer_and_its_recompute_where_the_plan_does(name, read_back):
    plan = ascend_plan(**SHAPES[name])
    c = plan.parallel
    _, _, setting = read_back(plan)

    assert [int(s) for s in setting.pp_ids] == plan_stage_of_layer(plan) == layout(plan).layer_stage
    layers_per_rank = setting.layer_list.sum(axis=0).tolist()
    assert layers_per_rank == stage_sizes(layouts_of(plan))  # uneven interleaved chunks too (per-chunk offsets)
    full_per_rank = [sum(chunk[rank] for chunk in setting.layer_recompute) for rank in range(c.pp)]
    assert full_per_rank == recompute_counts(layouts_of(plan), "full")
    for per_chunk in setting.select_recompute.values():
        assert [sum(chunk[rank] for chunk in per_chunk) for rank in range(c.pp)] == recompute_counts(layouts_of(plan), "selective")


def test_mindformers_rejects_an_export_that_breaks_its_rules(read_back):
    """The read-back can fail: a wrong offset, a device product off the device number, and a wrong
    micro-batch count are each caught by MindFormers itself."""
    plan = ascend_plan(**SHAPES["pp_uneven"])

    def shift_offset(data):
        data["model"]["model_config"]["offset"][0] += 1

    def double_dp(data):
        data["parallel_config"]["data_parallel"] *= 2

    with pytest.raises(ValueError, match="offset"):
        read_back(plan, shift_offset)
    with pytest.raises(ValueError, match="device_num"):
        read_back(plan, double_dp)

    def halve_microbatches(data):
        data["parallel_config"]["micro_batch_num"] //= 2

    _, trainer, _ = read_back(plan, halve_microbatches)
    assert trainer.global_batch_size == plan.training.gbs // 2


@pytest.mark.parametrize("name, expected", [("pp4_mixed_recompute", "select_recompute"), ("pp_vpp_zero1", "zero 3"),
                                            ("dp_x_tp", None)])
def test_export_notes_where_mindformers_runs_other_than_priced(name, expected):
    result = render_export(ascend_plan(**SHAPES[name]), "mindformers")
    text = result.files["mindformers_parallel.yaml"]
    if expected is None:
        assert result.notes == [] and "# note:" not in text
    else:
        assert any(expected in n for n in result.notes)
        assert all(f"# note: {n}" in text for n in result.notes)


# ---- mixtures of experts: MindFormers' parallel_core Qwen3-MoE and DeepSeek-V3 -----------------------------

MOE_PLANS = {
    "qwen3-30b-a3b dp8 tp2 pp2 ep8": ("qwen3-30b-a3b", dict(dp=8, tp=2, pp=2, ep=8, sp=True, zero=1)),
    "qwen3-30b-a3b dp8 ep4 (ep inside dp)": ("qwen3-30b-a3b", dict(dp=8, ep=4, zero=0)),
    "deepseek-v3 dp8 tp4 pp8 ep32": ("deepseek-v3", dict(dp=8, tp=4, pp=8, ep=32, sp=True, zero=1)),
    # a DeepSeek-V3 shape away from its config class's defaults (64 experts, top 6, 2 shared, 1 dense layer)
    "deepseek-v3-16b dp8 ep8": ("deepseek-v3-16b", dict(dp=8, ep=8, zero=1)),
    "qwen3-30b-a3b pp2 uneven, recompute per stage": ("qwen3-30b-a3b", dict(dp=8, pp=2, ep=8, zero=1),
                                                       [[("full", 10), ("selective", 4), ("none", 12)],
                                                        [("full", 2), ("none", 20)]]),
}


def moe_plan(name: str):
    from gplan.planner.build import make_plan
    from gplan.profiles.catalogue import load_cluster, load_model
    from gplan.spec.parallel import ParallelConfig
    from gplan.spec.training import TrainingSpec

    from helpers import stage_layouts

    model, degrees, *stages = MOE_PLANS[name]
    config, spec = ParallelConfig(**degrees), load_model(model)
    layouts = stage_layouts(stages[0], spec) if stages else None
    return make_plan(spec, TrainingSpec(gbs=256, seq_length=4096, engine="mindformers"),
                     load_cluster("atlas-800-910b", config.world_size), config, layouts)


@pytest.mark.parametrize("name", list(MOE_PLANS))
def test_mindformers_converts_a_moe_export_into_its_transformer_config(name, read_back):
    """The export's model config goes through MindFormers' own converter into its parallel_core
    TransformerConfig, with the plan's model and degrees; its LayerSetting gives each rank the plan's
    layers."""
    plan = moe_plan(name)
    c, m = plan.parallel, plan.model
    config, trainer, setting = read_back(plan)
    assert trainer.global_batch_size == plan.training.gbs
    assert setting.layer_list.sum(axis=0).tolist() == stage_sizes(layouts_of(plan))
    full_per_rank = [sum(chunk[rank] for chunk in setting.layer_recompute) for rank in range(c.pp)]
    assert full_per_rank == recompute_counts(layouts_of(plan), "full")
    selective = recompute_counts(layouts_of(plan), "selective")
    assert setting.select_recompute or not any(selective)
    for per_chunk in setting.select_recompute.values():
        assert [sum(chunk[rank] for chunk in per_chunk) for rank in range(c.pp)] == selective
    mla = m.is_mla
    transformer = transformer_config(config)
    assert (transformer.data_parallel_size, transformer.tensor_model_parallel_size,
            transformer.pipeline_model_parallel_size, transformer.expert_model_parallel_size) == (c.dp, c.tp, c.pp, c.ep)
    assert (transformer.num_layers, transformer.hidden_size, transformer.num_attention_heads,
            transformer.num_query_groups) == (m.num_layers, m.hidden_size, m.num_attention_heads, m.kv_heads)
    assert (transformer.num_moe_experts, transformer.moe_router_topk, transformer.moe_ffn_hidden_size) == \
        (m.num_experts, m.top_k, m.expert_ffn_size)
    assert transformer.ffn_hidden_size == m.ffn_size and transformer.vocab_size == m.vocab_size
    # the rules MindFormers' MoE layer applies when it builds (moe_layer.py:60, ffn.py:189): gplan's plan keeps them
    assert transformer.num_moe_experts % transformer.expert_model_parallel_size == 0
    assert (transformer.data_parallel_size * transformer.tensor_model_parallel_size) % transformer.expert_model_parallel_size == 0
    if mla:
        assert (transformer.q_lora_rank, transformer.kv_lora_rank, transformer.qk_pos_emb_head_dim,
                transformer.v_head_dim) == (m.q_lora_rank, m.kv_lora_rank, m.qk_rope_head_dim, m.v_head_dim)
        assert transformer.first_k_dense_replace == m.first_dense_layers and transformer.mtp_num_layers in (0, None)
        assert transformer.moe_router_score_function == m.router
        assert transformer.moe_router_enable_expert_bias == (m.router == "sigmoid")
        assert (transformer.num_moe_experts, transformer.moe_router_num_groups) == (m.num_experts, m.router_groups or 1)
    else:
        assert transformer.kv_channels == m.kv_channels and transformer.qk_layernorm


def test_mindformers_refuses_a_moe_export_that_breaks_its_rules(read_back):
    """The read-back can fail: MindFormers' TransformerConfig refuses biases in a MoE model and a routing
    bias without sigmoid routing."""
    plan = moe_plan("qwen3-30b-a3b dp8 tp2 pp2 ep8")

    def biases(data):
        data["model"]["model_config"]["add_bias_linear"] = True

    def softmax_with_routing_bias(data):
        data["model"]["model_config"]["moe_router_enable_expert_bias"] = True

    with pytest.raises(ValueError, match="Bias is not supported for MoE"):
        read_back(plan, biases)
    with pytest.raises(ValueError, match="sigmoid"):
        read_back(plan, softmax_with_routing_bias)


def test_a_capacity_factor_reaches_mindformers(read_back):
    plan = moe_plan("qwen3-30b-a3b dp8 ep4 (ep inside dp)")
    plan = plan.model_copy(update={"model": plan.model.model_copy(update={"capacity_factor": 1.25})})
    config, _, _ = read_back(plan)
    assert transformer_config(config).moe_expert_capacity_factor == 1.25


def test_an_uneven_interleaved_split_goes_to_mindformers_as_per_chunk_offsets_and_reads_back(tmp_path):
    """19/21/21/19-style splits were written as `offset: 0` (MindFormers then ran them even): now each chunk's
    offset row is written, and `--from` reads the same per-stage sizes back."""
    from gplan.planner.launch_files import read_launch

    plan = ascend_plan(**SHAPES["pp_interleaved_uneven"])
    text = render_export(plan, "mindformers").files["mindformers_parallel.yaml"]
    offset = yaml.safe_load(text)["model"]["model_config"]["offset"]
    assert offset == [[-1, 1], [0, 0]]  # chunks 7/9 then 8/8 over base 32 // 4 = 8
    path = tmp_path / "train.yaml"
    path.write_text(text)
    assert read_launch(path, plan.model).stage_sizes == stage_sizes(layouts_of(plan)) == [15, 17]
