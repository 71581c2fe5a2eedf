"""The mixture-of-experts terms of the cost model (cost_models/experts.py and their use in StepModel),
each against a published number or the formula's own derivation."""

from __future__ import annotations

import pytest

from gplan.cost_models import communication as comm
from gplan.cost_models import experts
from gplan.cost_models.compute import model_flops_per_step, shard_of
from gplan.cost_models.step import StepModel
from gplan.errors import InputError
from gplan.profiles.catalogue import load_cluster, load_model
from gplan.spec.parallel import ParallelConfig, check_config
from gplan.spec.training import TrainingSpec

SEQ = 4096


def step_model(name: str, devices: int, precision: str = "bf16", imbalance: float = 1.0, graphs: str = "none",
               **degrees) -> StepModel:
    config = ParallelConfig(**{"zero": 1, **degrees})
    training = TrainingSpec(gbs=config.dp * config.mbs * 8, seq_length=SEQ, precision=precision,
                            engine="megatron", expert_imbalance=imbalance, cuda_graphs=graphs)
    cluster = load_cluster("dgx-h100").sized(devices)
    return StepModel(load_model(name), training, cluster, config)


@pytest.mark.parametrize("name, published_gflop_per_token", [
    # Megatron-Bridge's performance tables (../shared/reference/megatron_bridge_perf.csv): model TFLOP/s per GPU
    # over tokens/s per GPU; DeepSeek-V3 without MTP: 249.6 GFLOP/token (SOURCES.md)
    ("deepseek-v3", 249.6),
    ("qwen3-235b-a22b", 253e3 / 1712),  # row 96: 253 TFLOP/s/GPU at 1712 tokens/s/GPU
    ("qwen3-30b-a3b", 206e3 / 8960),    # row 91: 206 at 8960
])
def test_model_flops_count_the_routed_experts_as_the_published_tables_do(name, published_gflop_per_token):
    """6 FLOPs per active parameter per token with causal attention: MoE at its top-k experts, MLA at its
    own head widths."""
    flops = model_flops_per_step(load_model(name), TrainingSpec(gbs=1, seq_length=SEQ)) / SEQ / 1e9
    assert flops == pytest.approx(published_gflop_per_token, rel=0.01)


def test_ep_and_etp_move_the_routed_work_but_not_its_amount():
    """Balanced routing: every device computes k·tokens/tp pairs' worth of expert FLOPs whatever the grid."""
    base = step_model("qwen3-30b-a3b", 16, dp=16)
    flops = []
    for ep, etp in ((1, 1), (4, 1), (16, 1), (4, 2), (2, 8)):
        s = step_model("qwen3-30b-a3b", 16, dp=16, ep=ep, etp=etp)
        gemms = experts.expert_gemms(s.model, s.shard, s.config)
        flops.append(sum(g.flops for g in gemms))
        assert gemms[0].m == s.model.top_k * s.shard.tokens * etp  # rows: the etp group's tokens, k copies
    assert all(f == pytest.approx(flops[0]) for f in flops)
    assert experts.local_experts(base.model, step_model("qwen3-30b-a3b", 16, dp=16, ep=16).config) == 8


def test_expert_parameters_and_their_optimizer_state_shard_over_ep_etp_and_edp():
    one = step_model("mixtral-8x7b", 8, dp=8)
    eight = step_model("mixtral-8x7b", 8, dp=8, ep=8)
    m = one.model
    assert one.layer_expert_params("moe_decoder") == 8 * m.expert_params()
    assert eight.layer_expert_params("moe_decoder") == m.expert_params()
    assert eight.config.edp == 1
    # the dense part is the same; the routed part is 1/8; the distributed optimizer shards dense over dp=8,
    # experts over edp (8 with ep 1, 1 with ep 8): each device holds the same optimizer bytes per expert it owns
    dense = one.layer_params("moe_decoder") - one.layer_expert_params("moe_decoder")
    assert eight.layer_params("moe_decoder") - eight.layer_expert_params("moe_decoder") == pytest.approx(dense)
    opt = lambda s: s.states(s.layer_params("moe_decoder"), s.layer_expert_params("moe_decoder"))[2]
    assert opt(one) == pytest.approx(dense * 12 / 8 + 8 * m.expert_params() * 12 / 8)
    assert opt(eight) == pytest.approx(dense * 12 / 8 + m.expert_params() * 12)


def test_alltoall_is_bounded_by_the_nic_once_the_group_leaves_the_node():
    g = load_cluster("dgx-h100").node_groups[0]
    size = 1e9
    inside = comm.alltoall_time_s(size, 8, 8, g.intra_node, g.inter_node)
    assert inside == pytest.approx(7 / 8 * size / g.intra_node.bytes_per_s + g.intra_node.latency_s)
    across = comm.alltoall_time_s(size, 16, 8, g.intra_node, g.inter_node)
    assert across == pytest.approx(8 / 16 * size / g.inter_node.bytes_per_s + g.inter_node.latency_s)
    assert across > 4 * inside  # half of it over a NIC 9× slower than NVLink
    assert comm.alltoall_time_s(size, 1, 1, g.intra_node, g.inter_node) == 0.0


def test_ep_traffic_is_priced_on_the_link_its_group_rides_and_scales_with_imbalance():
    # under a full-iteration graph the layer exposes no host time: its ep term is the traffic alone
    graphed = lambda step: _with(step, cuda_graphs="full_iteration")
    inside = graphed(step_model("qwen3-30b-a3b", 16, dp=16, ep=8))    # ep groups of 8 consecutive ranks: one node
    across = graphed(step_model("qwen3-30b-a3b", 16, dp=16, ep=16))   # two nodes
    dense = graphed(step_model("qwen3-30b-a3b", 16, dp=16, ep=1))
    assert dense.layer_ep_comm_s("moe_decoder", "none", 0) == 0.0
    assert across.layer_ep_comm_s("moe_decoder", "none", 0) > 4 * inside.layer_ep_comm_s("moe_decoder", "none", 0)
    skewed = graphed(step_model("qwen3-30b-a3b", 16, imbalance=1.5, dp=16, ep=16))
    assert skewed.layer_ep_comm_s("moe_decoder", "none", 0) == pytest.approx(
        1.5 * across.layer_ep_comm_s("moe_decoder", "none", 0), rel=5e-3)  # bytes scale, latencies do not
    full = across.layer_ep_comm_s("moe_decoder", "full", 0)
    assert full == pytest.approx(1.5 * across.layer_ep_comm_s("moe_decoder", "none", 0))  # the forward's replayed


def test_expert_grid_groups_match_megatron_core_rank_generator():
    """ep groups at stride etp inside a stage block, edp at stride etp·ep (Megatron-core's expert
    RankGenerator, order tp-ep-dp-pp) — the spans the link classes are read from."""
    rg = pytest.importorskip("megatron.core.parallel_state", reason="megatron-core (the dev extra) is not installed")
    c = ParallelConfig(dp=8, tp=2, pp=2, ep=4, etp=2, sp=True)
    generator = rg.RankGenerator(tp=c.etp, ep=c.ep, dp=c.edp, pp=c.pp, cp=1, order="tp-ep-dp-pp")
    for axis, name in (("ep", "ep"), ("etp", "tp"), ("edp", "dp")):
        size, stride = comm.expert_group(c, axis)
        for group in generator.get_ranks(name):
            assert len(group) == size and all(b - a == stride for a, b in zip(group, group[1:]))


def test_routed_activations_count_the_permuted_tokens_and_the_expert_intermediates():
    s = step_model("qwen3-30b-a3b", 16, dp=16, ep=16)
    m, pairs = s.model, 8 * SEQ
    expected = pairs * 2 * (m.hidden_size + 3 * m.expert_ffn_size) + 4 * m.num_experts * SEQ
    assert experts.routed_activation_bytes(m, s.shard, s.config, 2) == expected
    kept = s.layer_activation_bytes("moe_decoder", "none")
    assert kept - s.layer_activation_bytes("moe_decoder", "full") > expected  # full recompute keeps only the input


def test_an_all_to_all_in_flight_holds_what_it_sends_beside_what_it_receives():
    """The backward's working set of an MoE layer with ep: the routed gradients, and the dispatcher's send buffer
    beside the tokens it receives (k·s·h, 2 bytes) — none without ep, where no all-to-all runs."""
    spread, alone = step_model("qwen3-30b-a3b", 16, dp=16, ep=16), step_model("qwen3-30b-a3b", 16, dp=16)
    m, pairs = spread.model, 8 * SEQ
    assert experts.dispatch_buffer_bytes(m, spread.shard, spread.config, 2) == pairs * m.hidden_size * 2
    assert experts.dispatch_buffer_bytes(m, alone.shard, alone.config, 2) == 0.0
    routed = experts.routed_gradient_working_bytes(m, spread.shard, spread.config, 2)
    dense_part = spread.layer_transient_bytes("moe_decoder", "none") - routed - pairs * m.hidden_size * 2
    assert dense_part == pytest.approx(alone.layer_transient_bytes("moe_decoder", "none")
                                       - experts.routed_gradient_working_bytes(m, alone.shard, alone.config, 2))


@pytest.mark.parametrize("degrees, message", [
    (dict(dp=16, ep=3), "does not divide the 128 experts"),
    (dict(dp=4, tp=4, sp=True, ep=32), "does not fold"),
    (dict(dp=8, tp=2, ep=8), "sequence parallelism"),
])
def test_expert_degrees_keep_megatrons_rules(degrees, message):
    model = load_model("qwen3-30b-a3b")
    with pytest.raises(InputError, match=message):
        check_config(model, TrainingSpec(gbs=256, seq_length=SEQ), ParallelConfig(**degrees), 16)


@pytest.mark.parametrize("zero", [2, 3])
def test_fsdp_with_expert_parallel_shards_the_experts_over_their_own_data_parallel_ranks(zero):
    """FSDP + EP (torchtitan's default, Megatron-FSDP): routed experts' weights, gradients and optimizer state
    live on 1/edp of the ranks (dp·cp/ep), the rest on 1/(dp·cp); zero 3 gathers each part over its own group,
    so the expert gather of an ep-16 layout moves 1/16 of what ep 1 moves (the same bytes per expert rank)."""
    # a captured iteration: no host time, whose wait (128 local experts' launches at ep 1) would hide every gather
    sharded = step_model("qwen3-30b-a3b", 16, graphs="full_iteration", dp=16, ep=16, zero=zero)
    alone = step_model("qwen3-30b-a3b", 16, graphs="full_iteration", dp=16, zero=zero)
    assert sharded.config.edp == 1 and alone.config.edp == 16
    kind = "moe_decoder"
    routed, rest = sharded.layer_expert_params(kind), sharded.layer_params(kind) - sharded.layer_expert_params(kind)
    weights, _, optimizer = sharded.states(sharded.layer_params(kind), routed)
    per_weight = 2 / (16 if zero >= 3 else 1)
    assert weights == pytest.approx(rest * per_weight + routed * 2 / (1 if zero >= 3 else 1))
    assert optimizer == pytest.approx(rest * sharded.state_bytes.optimizer + routed * sharded.expert_state_bytes.optimizer)
    assert sharded.expert_state_bytes.optimizer == pytest.approx(16 * sharded.state_bytes.optimizer)  # edp 1 vs 16
    # zero 3: an ep-16 rank holds its experts whole (edp 1): nothing of them to gather, so less exposed than ep 1's
    if zero == 3:
        assert sharded.predict().breakdown.dp_comm < alone.predict().breakdown.dp_comm


def test_fsdp_gathers_on_the_nics_hide_behind_the_token_exchange_on_nvlink_too():
    """A layer's FSDP collectives hide behind all of its neighbour's time when they ride another link: with ep
    inside a node and the data-parallel ranks across nodes the window is the layer's compute plus its exchange
    (one pass of it forward, the rest backward); with every rank inside one node, compute alone."""
    across = step_model("qwen3-30b-a3b", 64, dp=64, ep=8, zero=3, recompute="full")
    inside = step_model("qwen3-30b-a3b", 8, dp=8, ep=8, zero=3, recompute="full")
    kind, g = "moe_decoder", 0
    for s, widened in ((across, True), (inside, False)):
        lt = s.layer_time(kind, g)
        compute_only = (lt.forward_s, lt.backward_s + s.layer_recompute_s(kind, "full", g))
        fsdp_links = [comm.axis_link(s.group(g), s.config, "dp"), comm.expert_axis_link(s.group(g), s.config, "edp")]
        forward, backward = s.zero3_windows_s(kind, "full", g, fsdp_links)
        exchange = s.layer_ep_comm_s(kind, "full", g)
        if widened:
            assert (forward, backward) == pytest.approx((compute_only[0] + exchange / 3, compute_only[1] + 2 * exchange / 3))
        else:
            assert (forward, backward) == compute_only
    assert exchange > 0


@pytest.mark.parametrize("target, runs", [("megatron", True), ("torchtitan", True), ("deepspeed", False),
                                          ("mindformers", False)])
def test_which_engines_run_zero_3_with_experts(target, runs):
    """Megatron-FSDP and torchtitan shard experts with FSDP; DeepSpeed-MoE stops at zero 2 (its engine asserts
    "MoE not supported with Stage 3") and MindFormers at zero 1: the refusal names the engine's rule."""
    from gplan.engines import ENGINES
    from gplan.spec.targets import config_refusals

    refused = config_refusals(ENGINES[target].capabilities, load_model("qwen3-30b-a3b"),
                              ParallelConfig(dp=16, ep=8, zero=3), 8)
    assert (not any(r.capability == "expert_zero" for r in refused)) == runs, refused


def test_ep_on_a_dense_model_is_refused():
    with pytest.raises(InputError, match="needs a mixture-of-experts model"):
        check_config(load_model("llama3-8b"), TrainingSpec(gbs=64, seq_length=SEQ), ParallelConfig(dp=8, ep=2), 8)


def test_shard_of_is_unchanged_by_the_expert_grid():
    t = TrainingSpec(gbs=64, seq_length=SEQ)
    assert shard_of(t, ParallelConfig(dp=8, ep=8)) == shard_of(t, ParallelConfig(dp=8))


def _ep_s(step: StepModel) -> float:
    return step.layer_ep_comm_s(next(k.name for k in step.model.layer_kinds() if k.moe), "none", 0)


def _with(step: StepModel, **options) -> StepModel:
    return StepModel(step.model, step.training.model_copy(update=options), step.cluster, step.config)


def test_an_moe_pass_exposes_host_time_unless_a_graph_captures_the_iteration():
    """experts.host_time_s: the dispatcher's sync per pass, plus a launch per local expert — both gone under a
    full-iteration graph, so the two passes of a layer (forward, backward) differ by twice that time."""
    step = step_model("qwen3-30b-a3b", 16, dp=16, ep=16)
    plain, graphed = _ep_s(step), _ep_s(_with(step, cuda_graphs="full_iteration"))
    per_pass = experts.HOST_SYNC_S["none"] + experts.EXPERT_LAUNCH_S * experts.local_experts(step.model, step.config)
    assert plain - graphed == pytest.approx(2 * per_pass, rel=1e-9)
    assert per_pass > 0


def test_more_local_experts_mean_more_launches():
    """Fewer ep ranks hold more experts each: E/ep launches per pass outside a captured iteration."""
    model, megatron = load_model("qwen3-30b-a3b"), TrainingSpec(gbs=64, seq_length=SEQ, engine="megatron")
    few = experts.host_time_s(model, ParallelConfig(dp=16, ep=16), megatron)
    many = experts.host_time_s(model, ParallelConfig(dp=16, ep=4), megatron)
    assert many - few == pytest.approx(experts.EXPERT_LAUNCH_S * (128 // 4 - 128 // 16))
    graphed = megatron.model_copy(update={"cuda_graphs": "full_iteration"})
    assert experts.host_time_s(model, ParallelConfig(dp=16, ep=4), graphed) == 0.0
    # torchtitan's torch._grouped_mm runs the group as one kernel: its own measured host time alone, however many
    # experts — and none under its CUDA graphs
    torchtitan = megatron.model_copy(update={"engine": "torchtitan"})
    for ep in (4, 16):
        assert experts.host_time_s(model, ParallelConfig(dp=16, ep=ep), torchtitan) == torchtitan.profile.moe_host_s
    assert torchtitan.profile.moe_host_s > experts.HOST_SYNC_S["none"]
    graphed = torchtitan.model_copy(update={"cuda_graphs": "full_iteration"})
    assert experts.host_time_s(model, ParallelConfig(dp=16, ep=1), graphed) == 0.0


def test_the_overlapped_alltoall_exposes_its_fitted_share():
    """--moe-a2a-overlap scales the all-to-all (not the host time) by OVERLAPPED_ALLTOALL_EXPOSED."""
    step = _with(step_model("qwen3-30b-a3b", 16, dp=16, ep=16), cuda_graphs="full_iteration")
    overlapped = _ep_s(_with(step, moe_a2a_overlap=True))
    assert overlapped == pytest.approx(_ep_s(step) * experts.OVERLAPPED_ALLTOALL_EXPOSED, rel=1e-9)


@pytest.mark.parametrize("degrees, message", [
    (dict(dp=16, ep=1), "ep is 1"),
    (dict(dp=8, pp=2, ep=8), "interleaved schedule"),
    (dict(dp=16, ep=16, recompute="full"), "cannot replay the MoE layer"),
    (dict(dp=16, ep=16, recompute="selective", recompute_modules=("moe",)), "cannot replay the MoE layer"),
])
def test_the_alltoall_overlap_keeps_megatron_cores_rules(degrees, message):
    """TransformerConfig.__post_init__ on overlap_moe_expert_parallel_comm (spec.parallel._a2a_overlap)."""
    config = ParallelConfig(**{"zero": 1, **degrees})
    training = TrainingSpec(gbs=256, seq_length=SEQ, engine="megatron", moe_a2a_overlap=True)
    with pytest.raises(InputError, match=message):
        check_config(load_model("qwen3-30b-a3b"), training, config, 16)


@pytest.mark.parametrize("target, devices, chunks, said", [
    ("megatron", 16, None, "FSDP + EP at its best"), ("torchtitan", 16, 1, "FSDP + EP at its best"),
    ("torchtitan", 32, 1, "FSDP + EP at its best"),
    ("torchtitan", 8, 1, "layouts searched beats the best plan"), ("torchtitan", 32, None, "FSDP + EP at its best")])
def test_the_search_says_where_fsdp_with_expert_parallel_stands(target, devices, chunks, said):
    """A mixture of experts' search says how FSDP + EP fared when it did not win (Megatron: Megatron-FSDP's
    zero 2 ties the distributed optimizer's plan on 16 H100; torchtitan with its loss whole (≤ 0.2) on 8, where
    pipeline stages win: why each of its layouts lost — memory, the recomputation it needs, or a bound no faster
    than the best plan; on 32, where FSDP alone over ep 1 with its per-op checkpointing wins, with its loss whole or
    in chunks; on 16, where pipeline stages over ep 1 amortise its MoE layers' host time over bigger micro-batches),
    nothing where it won."""
    import re

    from gplan.planner import plan as best_plan
    from gplan.planner.inputs import resolve_inputs
    from gplan.planner.space import limits_from_options

    inputs = resolve_inputs("qwen3-30b-a3b", devices, "dgx-h100", target=target, loss_chunks=chunks)
    limits = limits_from_options(None, None, None, None, None, None, None, "none,selective,full", None, False,
                                 None, None, None)
    notes = best_plan(inputs, limits, top=3).search.notes
    if said is None:
        assert notes == []
    elif "at its best" in said:
        assert len(notes) == 1 and said in notes[0] and ("ties the best plan" in notes[0] or "%" in notes[0])
    else:
        # every layout counted once, in one of the reasons; a bound below the best plan's time is never the reason
        assert len(notes) == 1 and said in notes[0]
        total = int(re.search(r"none of its (\d+) layouts", notes[0]).group(1))
        counted = [int(n) for n in re.findall(r"[;—] (\d+) ", notes[0])]
        assert sum(counted) == total and "memory budget" in notes[0]
        assert all(float(pct) >= 0 for pct in re.findall(r"\(([+-][\d.]+)%\)", notes[0]))


@pytest.mark.parametrize("capacity, pad, imbalance, load", [
    (None, False, 1.5, 1.5),   # dropless: the routing's imbalance
    (1.25, False, 1.5, 1.25),  # tokens over the capacity are dropped: the busiest expert stops at it
    (1.25, False, 1.1, 1.1),   # under it, nothing is dropped
    (1.0, True, 1.0, 1.0),     # padded to a capacity of 1.0: the balanced shape exactly
    (1.25, True, 1.0, 1.25),   # padded above balance: every expert computes its capacity
])
def test_an_expert_capacity_caps_or_pads_the_busiest_devices_load(capacity, pad, imbalance, load):
    """experts.routed_load: what the routed GEMMs, the exchange and the buffers scale with."""
    model = load_model("mixtral-8x7b").model_copy(update={"capacity_factor": capacity})
    t = TrainingSpec(gbs=64, seq_length=SEQ, engine="megatron", expert_imbalance=imbalance, moe_pad_to_capacity=pad)
    assert experts.routed_load(model, t, 8) == load
    config, cluster = ParallelConfig(dp=16, ep=8, zero=1), load_cluster("dgx-h100").sized(16)
    step, balanced = (StepModel(model, t, cluster, config),
                      StepModel(model.model_copy(update={"capacity_factor": None}),
                                t.model_copy(update={"expert_imbalance": 1.0, "moe_pad_to_capacity": False}), cluster, config))
    f, _ = experts.routed_time_s(step.model, step.training, step.shard, config, step.device(0))
    f1, _ = experts.routed_time_s(balanced.model, balanced.training, balanced.shard, config, balanced.device(0))
    assert f == pytest.approx(load * f1)


@pytest.mark.parametrize("capacity, pad, load", [(None, False, 1.0), (1.25, False, 1.0), (1.25, True, 1.25)])
def test_without_expert_parallelism_routing_cannot_load_one_device_more(capacity, pad, load):
    """At ep 1 each device runs every expert over its own tokens: its routed pairs are k·tokens whatever the
    routing's imbalance, so the imbalance prices nothing there (a padded capacity still does) — the same
    --expert-imbalance slows the ep-8 layout, not the ep-1 one."""
    model = load_model("mixtral-8x7b").model_copy(update={"capacity_factor": capacity})
    skewed = TrainingSpec(gbs=64, seq_length=SEQ, engine="megatron", expert_imbalance=1.8, moe_pad_to_capacity=pad)
    assert experts.routed_load(model, skewed, 1) == load
    cluster = load_cluster("dgx-h100").sized(16)
    for ep in (1, 8):
        config = ParallelConfig(dp=16, ep=ep, zero=1)
        times = [StepModel(model, t, cluster, config) for t in (skewed, skewed.model_copy(update={"expert_imbalance": 1.0}))]
        f, f1 = (experts.routed_time_s(s.model, s.training, s.shard, config, s.device(0))[0] for s in times)
        if ep == 1 or pad:  # nothing for the imbalance to load: the same time
            assert f == pytest.approx(f1)
        else:
            assert f > f1 * 1.2


def test_the_fsdp_with_expert_parallel_note_names_what_its_stages_recompute():
    """The note labels FSDP + EP's best plan by what its stages recompute (the split the search solved), not by the
    option the search seeded that split with."""
    from types import SimpleNamespace

    from gplan.planner.search import fsdp_ep_notes
    from gplan.spec.parallel import uniform_layout

    model = load_model("qwen3-30b-a3b")
    fsdp_ep = ParallelConfig(dp=16, ep=8, zero=1, mbs=4)  # seeded with no recompute, solved with every layer full
    best = SimpleNamespace(config=ParallelConfig(dp=2, pp=8, zero=1, mbs=8), prediction=SimpleNamespace(step_time_s=10.0))
    found = {"a": SimpleNamespace(config=fsdp_ep, layouts=uniform_layout(model, 1, "full"),
                                  prediction=SimpleNamespace(step_time_s=11.0))}
    notes = fsdp_ep_notes(model, found, [], best, "torchtitan")
    assert len(notes) == 1 and "+10.0% on the best plan" in notes[0]
    assert notes[0].endswith(fsdp_ep.label("full")) and "rc=none" not in notes[0]


@pytest.mark.parametrize("target, argv, said", [
    ("torchtitan", ["--ep", "8"], True), ("torchtitan", ["--ep", "1", "--cuda-graphs", "full_iteration"], False),
    ("megatron", ["--ep", "8"], False)])
def test_the_header_says_the_host_time_an_engine_measured_and_how_graphs_remove_it(target, argv, said):
    """No silent default: where the engine's own host time is priced (torchtitan's, without CUDA graphs) the header
    names it and the capture that removes it; captured, or on Megatron's fitted constants, it says nothing."""
    from typer.testing import CliRunner

    from gplan.cli import app

    done = CliRunner().invoke(app, ["estimate", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--devices", "8",
                                    "--target", target, *argv])
    assert done.exit_code == 0, done.output
    text = " ".join(done.output.split())
    host_ms = TrainingSpec(gbs=16, seq_length=SEQ, engine="torchtitan").profile.moe_host_s * 1e3
    assert (f"its MoE layers wait {host_ms:.1f} ms on the host a pass, priced without CUDA graphs "
            "(--cuda-graphs full_iteration" in text) == said
