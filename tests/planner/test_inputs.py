"""Defaults a user can see: the default batch stays near its target on any device count, the header
says what was chosen, CPU clusters get a small batch; absurd sizes are refused at once."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gplan.planner.inputs import DEFAULT_BATCH_TOKENS, default_gbs, resolve_inputs


@given(devices=st.integers(1, 2**20), seq=st.sampled_from([512, 1024, 2048, 4096, 8192, 32768, 131072]))
def test_the_default_batch_is_near_the_target_and_keeps_power_of_two_dp(devices, seq):
    gbs = default_gbs(devices, seq)
    target = DEFAULT_BATCH_TOKENS / seq
    assert 0.5 * DEFAULT_BATCH_TOKENS <= gbs * seq <= 1.5 * DEFAULT_BATCH_TOKENS or gbs == 1
    # every power-of-two dp that divides the devices and is not above the target divides the batch
    dp = 1
    while devices % dp == 0 and dp <= target:
        assert gbs % dp == 0
        dp *= 2


def test_llama3_8b_on_16384_gpus_keeps_a_4m_token_batch():
    inputs = resolve_inputs("llama3-8b", 16384, "dgx-h100")
    assert inputs.training.gbs * inputs.training.seq_length == DEFAULT_BATCH_TOKENS  # was 134M tokens
    assert "default" in inputs.gbs_note


def test_cpu_clusters_get_a_small_default_batch():
    inputs = resolve_inputs("tiny-llama", 2, "local-cpu")
    assert inputs.training.tokens_per_step <= 8192


def test_the_search_header_shows_batch_sequence_and_tokens(gplan, tmp_path):
    r = gplan("search", "llama3-8b", "--devices", "8", "--out", str(tmp_path / "p.json"))
    assert r.code == 0
    assert "gbs 512 × seq 8192 = 4M tokens/step" in r.stderr and "choose with --gbs" in r.stderr
    r = gplan("search", "llama3-8b", "--devices", "8", "--gbs", "256", "--out", str(tmp_path / "q.json"))
    assert "gbs 256 × seq 8192 = 2M tokens/step" in r.stderr and "choose with --gbs" not in r.stderr


@pytest.mark.parametrize("args", [["--devices", "2000000"], ["--cluster", "{huge}"]])
def test_absurd_cluster_sizes_are_refused_at_once(gplan, tmp_path, args):
    huge = tmp_path / "huge.yaml"
    huge.write_text("node_groups:\n  - {hardware: h100-sxm, nodes: 1000000000, devices_per_node: 8, "
                    "intra_node: {bandwidth_GBps: 450}, inter_node: {bandwidth_GBps: 50}}\n")
    r = gplan("search", "llama3-8b", *[a.format(huge=huge) for a in args], "--out", str(tmp_path / "p.json"))
    assert r.code == 3 and "1,048,576" in r.stderr
    assert not (tmp_path / "p.json").exists()


def test_inputs_built_by_hand_are_searched_for_the_resolved_default_target():
    """planner.plan() on Inputs that name no engine asks the one target resolution (planner.inputs), not
    "any target": a CPU cluster's plans are the torch worker's (hypothesis found a pp 2 plan of 1
    micro-batch, which torch's schedule refuses, when plan() took a missing engine as no target)."""
    import random

    from gplan.plan import layouts_of
    from gplan.spec.targets import TARGETS, refusals
    from helpers import random_case, ranked_plans

    plans = ranked_plans(random_case(random.Random(8192)))
    assert plans and all(p.target == "torch" for p in plans)
    assert all(refusals(TARGETS["torch"], p.model, p.parallel, p.parallel.num_microbatches, layouts_of(p)) == []
               for p in plans)
