"""Fully sharded data parallel as each engine runs it: DeepSpeed's ZeRO-3 (as SC21's runs measured it,
bench/data/sc21_zero3_runs.csv) gathers tensor by tensor and waits for each call — a ring latency, host time and
one copy per rank each (EngineProfile.zero3_gathers_per_tensor) — and it gathers submodule by submodule up to its live
parameter cap instead of whole layers, and keeps its own allocator reserve; the FSDP engines keep the shared
speed and overlap, FSDP1 as llm-foundry runs it (BACKWARD_POST) exposing its backward all-gathers."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gplan.cost_models import memory
from gplan.cost_models.step import StepModel
from gplan.profiles.catalogue import load_cluster, load_model
from gplan.engines import ENGINES
from gplan.spec.parallel import ParallelConfig, empty_stage, uniform_layout
from gplan.spec.training import TrainingSpec

MODEL = load_model("llama3-70b")
CONFIG = ParallelConfig(dp=512, mbs=1, zero=3, recompute="full")


def _step(engine: str) -> StepModel:
    training = TrainingSpec(gbs=512, seq_length=4096, precision="bf16", engine=engine)
    return StepModel(MODEL, training, load_cluster("dgx-a100-80g", 512), CONFIG)


def _zero3_s(step: StepModel) -> float:
    layout = uniform_layout(MODEL, 1, "full", 1)[0]
    return step.zero3_exposed_s(layout, 512, step.group(0).intra_node.model_copy(update={"bandwidth_GBps": 200.0}))


def test_the_fsdp_engines_keep_the_shared_default_and_deepspeed_gathers_tensor_by_tensor():
    for engine in ("torch", "torchtitan", "llm-foundry", "megatron"):
        profile = ENGINES[engine]
        assert (profile.zero3_comm_efficiency, profile.zero3_overlap) == (1.0, 1.0)
        assert not profile.zero3_gathers_per_tensor
    deepspeed = ENGINES["deepspeed"]
    assert deepspeed.zero3_gathers_per_tensor and deepspeed.zero3_overlap == 0.0
    assert deepspeed.zero3_gather_host_s > 0 and deepspeed.zero3_copy_launch_s > 0


def test_deepspeed_exposes_more_of_its_zero3_collectives_than_fsdp2_on_the_same_run():
    assert _zero3_s(_step("deepspeed")) > _zero3_s(_step("torchtitan"))


def test_a_gpt_layer_holds_twelve_tensors_and_a_llama_layer_six():
    """Megatron's GPT layer: fused QKV, projection, fc1, fc2 with biases, two LayerNorms with biases; Llama:
    the four linears (gate and up fused) and two RMSNorms."""
    gpt = MODEL.model_copy(update={"bias": True, "norm": "layernorm"})
    assert gpt.layer_param_tensors(gpt.layer_kinds()[0]) == 12
    assert MODEL.layer_param_tensors(MODEL.layer_kinds()[0]) == 6


def test_per_tensor_gathers_cost_what_grows_with_the_ranks(monkeypatch):
    """Each further tensor pays one more ring latency (n−1)·α, each call its host time and n copy launches:
    at twice the ranks the per-tensor surcharge more than doubles less the host part, and without per-tensor
    gathers it is gone (the unit model, DeepSpeed's overlap 0 kept)."""
    def surcharge(ranks: int) -> float:
        step = _step("deepspeed")
        link = step.group(0).inter_node
        return step.per_tensor_gather_s("decoder", ranks, link, ENGINES["deepspeed"])

    host = MODEL.layer_param_tensors(MODEL.layer_kinds()[0]) * ENGINES["deepspeed"].zero3_gather_host_s
    assert surcharge(1024) - host == pytest.approx(2 * (surcharge(512) - host), rel=0.01)
    with_tensors = _zero3_s(_step("deepspeed"))
    monkeypatch.setitem(ENGINES, "deepspeed", replace(ENGINES["deepspeed"], zero3_gathers_per_tensor=False))
    assert _zero3_s(_step("deepspeed")) < with_tensors


def test_slower_collectives_or_less_overlap_never_expose_less(monkeypatch):
    """A 70B layer's all-gather at 512 ranks hides behind half its forward: less overlap alone exposes
    nothing more there; slower collectives do."""
    exposed = []
    for efficiency, overlap in [(1.0, 1.0), (1.0, 0.5), (0.3, 1.0), (0.3, 0.5), (0.1, 0.5)]:
        monkeypatch.setitem(ENGINES, "torchtitan", replace(ENGINES["torchtitan"], zero3_comm_efficiency=efficiency,
                                                             zero3_overlap=overlap))
        exposed.append(_zero3_s(_step("torchtitan")))
    assert exposed[1] == pytest.approx(exposed[0])
    assert exposed[0] < exposed[2] <= exposed[3] < exposed[4]


def test_deepspeed_gathers_up_to_its_live_parameter_cap_and_reduces_through_its_bucket():
    """DeepSpeed's stage3_max_live_parameters (1e9) and reduce_bucket_size (5e8): a 70B layer (0.86e9) pair
    gathered is capped at 1e9 parameters; FSDP holds both layers and one layer's fp32 gradients."""
    layer = MODEL.layer_params_per_rank(MODEL.layer_kinds()[0], 1)
    assert memory.zero3_gather_buffer_bytes([layer] * 4, 2, ENGINES["deepspeed"]) == (1e9 + 5e8) * 2
    assert memory.zero3_gather_buffer_bytes([layer] * 4, 2, ENGINES["torchtitan"]) == 2 * layer * 2 + layer * 4


def test_deepspeed_zero3_reserves_its_own_fragmentation_not_the_pipeline_engines():
    """The BLOOM-fitted fraction is DeepSpeed's pipeline engine's (zero ≤ 1); ZeRO-3 runs without it and
    carries its own, smaller one; an engine without a ZeRO-3 fraction keeps its one fraction at zero 3."""
    accounting = ENGINES["deepspeed"].memory
    assert accounting.zero3_fragmentation < accounting.fragmentation
    zero3 = _step("deepspeed").predict().stages[0].memory
    assert zero3.fragmentation_bytes == pytest.approx(zero3.allocated_bytes * accounting.zero3_fragmentation)
    zero1 = StepModel(MODEL, _step("deepspeed").training, load_cluster("dgx-a100-80g", 512),
                      CONFIG.model_copy(update={"zero": 1, "tp": 8, "dp": 64})).predict().stages[0].memory
    assert zero1.fragmentation_bytes == pytest.approx(zero1.allocated_bytes * accounting.fragmentation)
    assert memory.fragmentation_fraction(0.0, ENGINES["torchtitan"], zero=3) == ENGINES["torchtitan"].memory.fragmentation
    assert memory.fragmentation_fraction(0.1, ENGINES["deepspeed"], zero=3) == max(0.1, accounting.zero3_fragmentation)


def test_fsdp1_backward_post_exposes_each_units_backward_all_gather():
    """llm-foundry runs FSDP1 with Composer's BACKWARD_POST: the next unit's all-gather waits for the current
    unit's gradients, so every layer's backward all-gather is exposed; FSDP2 (torchtitan) prefetches it
    behind the gradient computation, where a 70B layer's collectives at 512 ranks hide entirely."""
    from gplan.cost_models import communication as comm

    assert ENGINES["torchtitan"].zero3_backward_prefetch and not ENGINES["llm-foundry"].zero3_backward_prefetch
    titan, foundry = _step("torchtitan"), _step("llm-foundry")
    link = titan.group(0).intra_node.model_copy(update={"bandwidth_GBps": 200.0})
    layer = titan.layer_params(MODEL.layer_kinds()[0].name)
    gather_s = comm.allgather_time_s(layer * titan.training.element_bytes, 512, link)
    exposed_layers_s = titan.num_microbatches * MODEL.num_layers * gather_s
    assert _zero3_s(foundry) - _zero3_s(titan) == pytest.approx(exposed_layers_s)
    # what FSDP2 leaves exposed is the embedding's and the head's collectives, priced alike for both engines
    fixed = titan.stage_fixed_params(empty_stage(True, True))
    fixed_s = (2 * comm.allgather_time_s(fixed * titan.training.element_bytes, 512, link)
               + comm.reduce_scatter_time_s(fixed * titan.reduced_grad_bytes, 512, link))
    assert _zero3_s(titan) == pytest.approx(titan.num_microbatches * fixed_s)


def test_fsdp1_backward_post_holds_one_gathered_unit_where_fsdp2_holds_two():
    """BACKWARD_POST frees a unit's weights before gathering the next (torch's BackwardPrefetch docs): one
    gathered layer beside one layer's fp32 gradients; FSDP2's prefetch holds two."""
    layer = MODEL.layer_params_per_rank(MODEL.layer_kinds()[0], 1)
    assert memory.zero3_gather_buffer_bytes([layer] * 4, 2, ENGINES["llm-foundry"]) == layer * 2 + layer * 4
    assert memory.zero3_gather_buffer_bytes([layer] * 4, 2, ENGINES["torchtitan"]) == 2 * layer * 2 + layer * 4
