"""The default search space holds what can win: zero 2, cp wherever each rank keeps enough tokens, and
every chunking of a stage's layers for interleaving."""

from __future__ import annotations

import pytest

from gplan.planner.inputs import resolve_inputs
from gplan.planner.space import MIN_CP_CHUNK_TOKENS, SearchLimits, candidates, cp_options, vpp_options
from gplan.spec.parallel import check_config
from gplan.spec.targets import TARGETS, config_refusals
from gplan.spec.training import TrainingSpec


def test_cp_is_searched_at_8k_tokens_up_to_the_smallest_chunk():
    assert cp_options(TrainingSpec(gbs=8, seq_length=8192), SearchLimits()) == [1, 2, 4, 8]
    assert cp_options(TrainingSpec(gbs=8, seq_length=131072), SearchLimits())[-1] == 131072 // MIN_CP_CHUNK_TOKENS
    assert cp_options(TrainingSpec(gbs=8, seq_length=1024), SearchLimits()) == [1]
    assert cp_options(TrainingSpec(gbs=8, seq_length=8192), SearchLimits(cp=[2])) == [2]


def test_vpp_covers_every_chunking_of_a_stage():
    """Llama 3.1 405B's 126 layers on 9 stages: 14 per stage, chunks of 14, 7, 2 and 1 layers (NVIDIA's
    published vpp 7 among them)."""
    assert vpp_options(126, 9, SearchLimits()) == [1, 2, 7, 14]
    assert vpp_options(80, 1, SearchLimits()) == [1]
    assert vpp_options(80, 4, SearchLimits(vpp=[1, 5])) == [1, 5]


def test_the_default_space_holds_zero_2_cp_and_vpp_7():
    inputs = resolve_inputs("llama3-405b", 2304, "dgx-h100", gbs=1008)
    configs = list(candidates(inputs.model, inputs.training, inputs.cluster, 2304, SearchLimits(allow_fewer_devices=False)))
    assert {c.zero for c in configs} == {0, 1, 2, 3}
    assert any(c.tp == 8 and c.pp == 9 and c.vpp == 7 and c.cp == 2 and c.mbs == 1 for c in configs)


def test_vpp_counts_the_embedding_and_the_loss_as_a_layer_each_where_the_target_runs_uneven_chunks():
    """Meta's Llama 3.1 405B layout, 126 layers on pp 16 × vpp 8 with the first and last stage one layer
    fewer (L + 2 = pp·vpp: the first chunk the embedding alone, the last the loss alone), is in the space of
    a target running uneven chunks (Megatron's pipeline layout) and only there."""
    assert vpp_options(126, 16, SearchLimits(), uneven=True) == [1, 2, 4, 7, 8]
    assert vpp_options(126, 16, SearchLimits()) == [1]  # 16 does not divide 126: equal chunks impossible
    assert vpp_options(62, 8, SearchLimits(), uneven=True) == [1, 2, 4, 7, 8]  # 64 = 8·8 chunks, or 8·4 of two
    assert vpp_options(61, 8, SearchLimits(), uneven=True) == [1, 2, 4, 7]  # 63 is odd: none accounted
    inputs = resolve_inputs("llama3-405b", 2048, "dgx-h100", gbs=2048)
    meta = dict(tp=[8], pp=[16], cp=[1], mbs=[1], allow_fewer_devices=False)

    def pp16_vpps(target):
        training = inputs.training.model_copy(update={"engine": target})
        configs = candidates(inputs.model, training, inputs.cluster, 2048, SearchLimits(**meta))
        return {c.vpp for c in configs}

    assert 8 in pp16_vpps("megatron")
    assert pp16_vpps("torch") == {1}


def test_the_search_finds_metas_405b_layout_and_megatron_gets_it_as_written():
    """Held to Meta's degrees (tp 8, pp 16, vpp 8) on a Megatron target, the search returns 7/8/…/8/7 per
    stage, and the export writes it as Megatron's pipeline layout: the embedding and the loss a chunk each."""
    from gplan.engines.megatron.export import interleaved_layout
    from helpers import meta_405b_plan

    best = meta_405b_plan()
    sizes = [sum(count.count for count in stage.layers) for stage in best.stages]
    assert (best.parallel.pp, best.parallel.vpp, sum(sizes)) == (16, 8, 126)
    assert sizes == [7] + [8] * 14 + [7]
    assert interleaved_layout(sizes, 8) == "E|" + "t*1|" * 126 + "L"


SPACES = [("llama3-8b", "dgx-a100-80g", 64, None, None), ("qwen3-30b-a3b", "dgx-h100", 16, None, None),
          ("deepseek-v3", "dgx-h100", 256, 4096, 4096), ("llama3-405b", "dgx-h100", 2048, 2048, None),
          ("llama3-70b", "atlas-800-910b", 64, 512, None), ("gpt3-175b", "dgx-a100-80g", 1024, None, 2048)]


@pytest.mark.parametrize("target", [*TARGETS, None])
@pytest.mark.parametrize("case", SPACES, ids=[f"{m}/{n}" for m, _, n, _, _ in SPACES])
def test_every_candidate_passes_the_plan_rules_and_its_targets(case, target):
    """The space generates configurations with its own filters (faster than trying each); every one it
    yields must pass what a plan is checked against — spec.parallel's rules (Megatron's asserts) and the
    target's capabilities — or a searched plan would be refused when read back. Dense, MoE, latent
    attention, uneven interleaving and Ascend; each target and none."""
    model, cluster, devices, gbs, seq = case
    inputs = resolve_inputs(model, devices, cluster, gbs=gbs, seq_length=seq)
    seen = 0
    training = inputs.training.model_copy(update={"engine": target})  # None: every configuration gplan prices
    for config in candidates(inputs.model, training, inputs.cluster, devices, SearchLimits()):
        check_config(inputs.model, inputs.training, config, config.world_size)
        if target:
            m = config.microbatches_for(inputs.training.gbs)
            assert config_refusals(TARGETS[target], inputs.model, config, m, inputs.training.precision) == [], config
        seen += 1
    assert seen > 0 or (target, model) in NOTHING_RUNS


#: Pairs whose target builds none of the model's configurations: MindSpore's worker and llm-foundry build
#: dense models, DeepSpeed's MoE only Mixtral's shapes, MindFormers' PyNative trainer only DeepSeek-V3's (no
#: qwen3_moe there), and these four only the Llama family (GPT-3 has GELU and biases).
NOTHING_RUNS = {("mindspore", "qwen3-30b-a3b"), ("deepspeed", "qwen3-30b-a3b"), ("llm-foundry", "qwen3-30b-a3b"),
                ("llm-foundry", "deepseek-v3"),
                ("mindspore", "deepseek-v3"), ("deepspeed", "deepseek-v3"),
                ("mindspore", "gpt3-175b"), ("torchtitan", "gpt3-175b"), ("mindformers", "gpt3-175b"),
                ("mindformers-pynative", "qwen3-30b-a3b"), ("mindformers-pynative", "gpt3-175b")}
