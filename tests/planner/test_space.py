"""The default search space holds what can win: zero 2, cp wherever each rank keeps enough tokens, and
every chunking of a stage's layers for interleaving."""

from __future__ import annotations

from gplan.planner.inputs import resolve_inputs
from gplan.planner.space import MIN_CP_CHUNK_TOKENS, SearchLimits, candidates, cp_options, vpp_options
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
