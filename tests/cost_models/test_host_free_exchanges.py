"""torchtitan 0.3's two token exchanges that never wait on the host: HybridEP with a non-blocking capacity
(`moe_dispatch_capacity`: hybridep.py `_num_permuted_tokens_for_non_blocking`) and MinimalAsyncEP
(`moe_dispatcher = "symmetric_memory"`: minimal_async_ep/api.py). Both allocate the experts' input for a fixed share
of the worst case — `tokens·ep·min(E/ep, k)·c` rows each micro-batch — so the routed tensors hold those rows whatever
the router sends, while the grouped GEMMs compute the routed ones; MinimalAsyncEP adds two symmetric-memory receive
buffers sized by a rank's local batch. With neither waiting on the host, torchtitan captures CUDA graphs with ep > 1,
and its own rules are kept: ep > 1, MinimalAsyncEP under full recompute, a capacity that holds balanced routing."""

from __future__ import annotations

import pytest

from gplan.cost_models import experts
from gplan.cost_models.step import StepModel
from gplan.profiles.catalogue import load_cluster, load_model
from gplan.spec.parallel import ParallelConfig, config_violations
from gplan.spec.training import TrainingSpec

MODEL = load_model("deepseek-v3-16b")  # 64 experts, top 6: at ep 8 a rank holds 8, so min(E/ep, k) = 6
CLUSTER = load_cluster("dgx-h100", 8)


def _training(**options) -> TrainingSpec:
    return TrainingSpec(gbs=32, seq_length=4096, engine="torchtitan", **options)


def _step(config: ParallelConfig, **options) -> StepModel:
    return StepModel(MODEL, _training(**options), CLUSTER, config)


def _moe_kind(step: StepModel) -> str:
    return next(name for name, kind in step.kinds.items() if kind.moe)


EP8 = ParallelConfig(dp=8, ep=8, mbs=4, zero=3, recompute="none")


@pytest.mark.parametrize("options, load", [
    ({}, 1.0),  # sized to the routed tokens after a host sync
    ({"moe_dispatcher": "flex", "moe_dispatch_capacity": 1.0}, 8.0),  # 8·6·1/6: the worst case, as the registry sets
    ({"moe_dispatcher": "flex", "moe_dispatch_capacity": 0.25}, 2.0),
    ({"moe_dispatcher": "symmetric_memory"}, 8.0),  # MinimalAsyncEP's receive capacity: ep·T·min(k, E/ep)
])
def test_the_routed_rows_held_are_the_allocation_not_the_routed_tokens(options, load):
    assert experts.allocated_load(MODEL, _training(**options), 8) == pytest.approx(load)


def test_a_capacity_sized_exchange_holds_its_rows_in_memory_and_computes_the_routed_ones():
    """At capacity 1 on ep 8 the MoE layer keeps 8× the routed side's activations of the host-synced HybridEP,
    the rest of the layer alike; its compute is the same (the grouped GEMMs' offsets end at the routed rows)."""
    synced, sized = _step(EP8, moe_dispatcher="flex"), _step(EP8, moe_dispatcher="flex", moe_dispatch_capacity=1.0)
    kind = _moe_kind(synced)
    t = synced.training
    routed = experts.routed_activation_bytes(MODEL, synced.shard, EP8, t.element_bytes, None, t.profile.memory)
    grown = sized.layer_activation_bytes(kind, "none") - synced.layer_activation_bytes(kind, "none")
    assert grown == pytest.approx(7 * routed, rel=1e-6)
    assert sized.layer_transient_bytes(kind, "none") > synced.layer_transient_bytes(kind, "none")
    assert sized.layer_time(kind, 0) == synced.layer_time(kind, 0)


def test_minimal_async_ep_allocates_two_receive_buffers_of_a_ranks_local_batch():
    """2 × ep·T_max·min(k, E/ep) rows of h in bf16, T_max = local batch · seq / (cp·tp) (update_ep_token_dispatcher_
    config: 4 · 4096 = 16,384 for the registry's deepseek_v3_16b), beside an ep × E count matrix; with stages, the
    local batch is every micro-batch of the step."""
    full = EP8.model_copy(update={"recompute": "full"})
    symmetric, all_to_all = _step(full, moe_dispatcher="symmetric_memory"), _step(full)
    rows = 8 * 16384 * 6
    expected = 2 * rows * MODEL.hidden_size * 2 + 8 * 8 * MODEL.num_experts
    assert symmetric.communicator_bytes(0) - all_to_all.communicator_bytes(0) == pytest.approx(expected)
    staged = ParallelConfig(dp=4, pp=2, ep=4, mbs=1, zero=1, recompute="full")
    step = StepModel(MODEL, TrainingSpec(gbs=16, seq_length=4096, engine="torchtitan", moe_dispatcher="symmetric_memory"),
                     CLUSTER, staged)
    micro = staged.microbatches_for(16)
    assert step.communicator_bytes(0) - StepModel(MODEL, TrainingSpec(gbs=16, seq_length=4096, engine="torchtitan"),
                                                  CLUSTER, staged).communicator_bytes(0) == pytest.approx(
        2 * 4 * 4096 * micro * 6 * MODEL.hidden_size * 2 + 8 * 4 * MODEL.num_experts)


def test_minimal_async_eps_experts_run_on_its_receive_buffer():
    """MinimalAsyncEP hands the experts its whole receive buffer (api.py `_copy_rows_to_peers_and_wait_cuda` returns
    it): the replayed layer's routed tensors have the buffer's rows — with stages, every micro-batch of the local
    batch's — and its input is that buffer, counted once with the communicators, not again in the working set."""
    full = EP8.model_copy(update={"recompute": "full"})
    symmetric, hybrid = (_step(full, moe_dispatcher="symmetric_memory"),
                         _step(full, moe_dispatcher="flex", moe_dispatch_capacity=1.0))
    kind, t = _moe_kind(symmetric), symmetric.training
    assert symmetric.allocated_load == hybrid.allocated_load == 8.0
    held_in_buffer = 8.0 * experts.routed_input_bytes(MODEL, symmetric.shard, full, t.element_bytes)
    assert hybrid.layer_transient_bytes(kind, "full") - symmetric.layer_transient_bytes(kind, "full") == \
        pytest.approx(held_in_buffer, rel=1e-6)
    staged = ParallelConfig(dp=4, pp=2, ep=4, mbs=1, zero=1, recompute="full")
    training = TrainingSpec(gbs=16, seq_length=4096, engine="torchtitan", moe_dispatcher="symmetric_memory")
    step = StepModel(MODEL, training, CLUSTER, staged)
    assert step.allocated_load == pytest.approx(4 * 6 / 6 * staged.microbatches_for(16))


def test_the_host_free_exchanges_drop_the_host_time_under_graphs_with_ep():
    """With CUDA graphs an MoE layer waits on no host; the host-synced exchange is refused them at ep > 1 (0.3's
    _validate_cuda_graphs), these two are not."""
    full = EP8.model_copy(update={"recompute": "full"})
    for options in ({"moe_dispatcher": "flex", "moe_dispatch_capacity": 1.0}, {"moe_dispatcher": "symmetric_memory"}):
        graphed = _training(cuda_graphs="full_iteration", **options)
        assert not config_violations(MODEL, graphed, full, 8)
        assert experts.host_time_s(MODEL, full, graphed) == 0.0
    refused = config_violations(MODEL, _training(cuda_graphs="full_iteration", moe_dispatcher="flex"), full, 8)
    assert [v.rule for v in refused] == ["cuda_graphs"] and "ep=8" in refused[0].message


@pytest.mark.parametrize("options, config, says", [
    ({"moe_dispatcher": "symmetric_memory"}, ParallelConfig(dp=8, recompute="full"), "need expert parallelism"),
    ({"moe_dispatcher": "flex"}, ParallelConfig(dp=8, recompute="full"), "need expert parallelism"),
    ({"moe_dispatcher": "symmetric_memory"}, EP8.model_copy(update={"recompute": "selective"}), "requires full recompute"),
    ({"moe_dispatch_capacity": 1.0}, EP8, "sizes HybridEP's (the flex dispatcher's) output"),
    ({"moe_dispatcher": "flex", "moe_dispatch_capacity": 0.1}, EP8, "would drop tokens every step"),
])
def test_torchtitans_rules_for_its_kernel_exchanges_are_kept(options, config, says):
    found = config_violations(MODEL, _training(**options), config, 8)
    assert found and says in found[0].message and found[0].hint
