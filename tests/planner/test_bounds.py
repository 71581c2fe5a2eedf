"""The search's bounds are sound: on random instances — large vocabularies, tight budgets — the bounded
search returns the same best plan as solving every candidate's ILP with no bound at all."""

from __future__ import annotations

import random

import pytest

from gplan.errors import InfeasibleError
from gplan.cost_models.pipeline import pipeline_time_s
from gplan.planner import ilp
from gplan.planner.reuse import SolvedPool
from gplan.planner.bounds import lower_bound_s, memory_admits_a_split
from gplan.planner.search import search
from gplan.planner.space import SearchLimits, candidates
from gplan.planner.table import build_table, states_fit
from gplan.profiles.catalogue import load_cluster
from gplan.spec.model import ModelSpec
from gplan.spec.training import TrainingSpec
from gplan.cost_models.step import StepModel
from gplan.spec.parallel import LayerCount, ParallelConfig, StageLayout
from helpers import mixed_cluster_file


def random_instance(rng: random.Random):
    heads = rng.choice([8, 16, 32])
    model = ModelSpec(name="r", num_layers=rng.choice([8, 12, 16, 24]), hidden_size=heads * 128,
                      num_attention_heads=heads, num_kv_heads=rng.choice([heads, 8]),
                      ffn_hidden_size=rng.choice([3, 4]) * heads * 128, ffn_kind="swiglu",
                      vocab_size=rng.choice([32000, 128256, 256000]), seq_length=rng.choice([2048, 4096, 8192]),
                      norm="rmsnorm", position_embedding="rope")
    devices = rng.choice([8, 16])
    cluster = load_cluster(rng.choice(["dgx-a100-40g", "dgx-a100-80g", "dgx-v100"]), devices)
    memory = rng.uniform(0.25, 1.0)  # tight budgets, down to a quarter of the device
    training = TrainingSpec(gbs=rng.choice([16, 32, 64]), seq_length=model.seq_length,
                            precision="fp16" if "v100" in cluster.name else "bf16")
    return model, training, with_memory(cluster, memory), devices


def with_memory(cluster, factor: float):
    """The cluster with every device's memory scaled by `factor` (tight budgets)."""
    groups = [g.model_copy(update={"hardware": g.hardware.model_copy(update={"memory_GiB": g.hardware.memory_GiB * factor})})
              for g in cluster.node_groups]
    return cluster.model_copy(update={"node_groups": groups})


def assert_the_bounded_search_finds_the_unbounded_best(model, training, cluster, devices, limits) -> None:
    try:
        unbounded = search(model, training, cluster, devices, limits, top=1, bounds=False).best
    except InfeasibleError:
        with pytest.raises(InfeasibleError):
            search(model, training, cluster, devices, limits, top=1)
        return
    bounded = search(model, training, cluster, devices, limits, top=1).best
    assert bounded.prediction.step_time_s == pytest.approx(unbounded.prediction.step_time_s, rel=1e-6)


@pytest.mark.parametrize("seed", range(10))
def test_the_bounded_search_finds_the_unbounded_best(seed):
    """The default space (every vpp chunking, cp, zero 0-3) with the bounds, the floor outside the
    pipeline and the answers from solved ILPs (planner.reuse) against every ILP solved with none."""
    model, training, cluster, devices = random_instance(random.Random(seed))
    limits = SearchLimits(mbs=[1, 2], allow_fewer_devices=False)
    assert_the_bounded_search_finds_the_unbounded_best(model, training, cluster, devices, limits)


def random_mixed_instance(rng: random.Random, tmp_path):
    """Two node groups of different speed and memory (A100-80GB and V100-32GB), small enough that every
    ILP solves without a bound."""
    heads = rng.choice([8, 16])
    model = ModelSpec(name="r", num_layers=rng.choice([6, 8, 12]), hidden_size=heads * 128, num_attention_heads=heads,
                      num_kv_heads=8, ffn_hidden_size=3 * heads * 128, ffn_kind="swiglu",
                      vocab_size=rng.choice([32000, 256000]), seq_length=2048, norm="rmsnorm", position_embedding="rope")
    memory = rng.uniform(0.3, 1.0)
    cluster = load_cluster(str(mixed_cluster_file(tmp_path / "mixed.yaml", nodes=1, devices_per_node=4)))
    training = TrainingSpec(gbs=rng.choice([8, 16]), seq_length=2048, precision="fp16")
    return model, training, with_memory(cluster, memory), 8


@pytest.mark.parametrize("seed", range(6))
def test_the_bounded_search_finds_the_unbounded_best_on_two_node_groups(seed, tmp_path):
    """The slot bound and the two-group memory-aware bound (`_most_layers`) against every ILP solved."""
    model, training, cluster, devices = random_mixed_instance(random.Random(seed), tmp_path)
    limits = SearchLimits(mbs=[1], zero=[0, 1], cp=[1], allow_fewer_devices=False)
    assert_the_bounded_search_finds_the_unbounded_best(model, training, cluster, devices, limits)


def random_moe_instance(rng: random.Random):
    """A small mixture of experts (dense leading layers or not, shared experts or not) for Megatron-LM:
    ep in the space, uneven interleaved stages, the expert-state floor and tight budgets."""
    heads = rng.choice([16, 32])
    model = ModelSpec(name="moe", num_layers=rng.choice([7, 9, 12]), hidden_size=heads * 128, num_attention_heads=heads,
                      num_kv_heads=8, ffn_hidden_size=4 * heads * 128, ffn_kind="swiglu", vocab_size=32000,
                      seq_length=2048, norm="rmsnorm", position_embedding="rope", num_experts=rng.choice([8, 16]),
                      top_k=2, moe_ffn_hidden_size=2 * heads * 128, num_shared_experts=rng.choice([0, 1]),
                      first_dense_layers=rng.choice([0, 1]))
    cluster = with_memory(load_cluster("dgx-h100", 8), rng.uniform(0.08, 0.4))
    return model, TrainingSpec(gbs=32, seq_length=2048, engine="megatron"), cluster, 8


@pytest.mark.parametrize("seed", range(8))
def test_the_bounded_search_finds_the_unbounded_best_for_experts(seed):
    """ep and the state floor (`table.states_fit`), uneven interleaved stages and their
    per-stage least layers, against every ILP solved with no bound (winners here take ep 2-4, some pp 2;
    some instances fit nowhere, and both searches must say so)."""
    model, training, cluster, devices = random_moe_instance(random.Random(seed))
    training = training.model_copy(update={"engine": "megatron"})  # the target: the engine it is priced as
    limits = SearchLimits(mbs=[1], cp=[1], allow_fewer_devices=False)
    assert_the_bounded_search_finds_the_unbounded_best(model, training, cluster, devices, limits)


def random_split(rng: random.Random, table, options: list[str]) -> list[StageLayout]:
    """Any split of the table's layers (interleaved: equal counts), each stage with random options."""
    total, p = table.total_layers, table.pp
    if table.equal_layers:
        sizes = [total // p] * p
    else:
        cuts = sorted(rng.sample(range(1, total), p - 1))
        sizes = [b - a for a, b in zip([0] + cuts, cuts + [total])]
    layouts = []
    for i, size in enumerate(sizes):
        counts = {}
        for _ in range(size):
            option = rng.choice(options)
            counts[option] = counts.get(option, 0) + 1
        layouts.append(StageLayout(layers=[LayerCount(kind="decoder", recompute=o, count=n) for o, n in counts.items()],
                                   embedding=i == 0, head=i == p - 1))
    return layouts


@pytest.mark.parametrize("seed", range(6))
def test_the_floor_outside_the_pipeline_is_below_every_splits(seed):
    """`off_pipeline_floor_s` (optimizer, overhead, data-parallel exposure) is at most what the cost model
    adds to the pipeline time for any split, and `lower_bound_s` at most the step time: random
    configurations of the default space, random splits and recompute mixes."""
    rng = random.Random(seed)
    model, training, cluster, devices = random_instance(rng)
    options = ["none", "selective", "full"]
    configs = list(candidates(model, training, cluster, devices, SearchLimits(allow_fewer_devices=False)))
    for config in rng.sample(configs, min(25, len(configs))):
        step = StepModel(model, training, cluster.sized(config.world_size), config)
        table = build_table(step, options)
        for _ in range(4):
            layouts = random_split(rng, table, options)
            predicted = step.predict(layouts)
            pipeline = pipeline_time_s([s.time_s for s in predicted.stages], step.num_microbatches, config.vpp)
            assert predicted.step_time_s - pipeline >= table.outside_pipeline_floor_s * (1 - 1e-9), config.label()
            assert lower_bound_s(table) <= predicted.step_time_s * (1 + 1e-9), config.label()


def test_a_configuration_whose_states_overflow_fits_no_split():
    """`states_fit` is necessary: where it fails, no split of any recompute mix fits (random
    configurations of the default space on tight budgets), and it does fail on some of them."""
    options, refused = ["none", "selective", "full"], 0
    for seed in range(8):
        rng = random.Random(seed)
        model, training, cluster, devices = random_instance(rng)
        configs = list(candidates(model, training, cluster, devices, SearchLimits(allow_fewer_devices=False)))
        for config in rng.sample(configs, min(40, len(configs))):
            step = StepModel(model, training, cluster.sized(config.world_size), config)
            if states_fit(step):
                continue
            refused += 1
            table = build_table(step, options)
            for _ in range(3):
                assert not step.predict(random_split(rng, table, options)).fits, config.label()
    assert refused > 0


@pytest.mark.parametrize("seed", range(6))
def test_an_answer_from_a_solved_ilp_equals_solving_it(seed):
    """planner.reuse: the zero levels of one layout share their stage times; what the pool answers for one
    from another's solved ILP is what its own ILP gives (same status; same objective when optimal)."""
    rng = random.Random(seed)
    model, training, cluster, devices = random_instance(rng)
    configs = list(candidates(model, training, cluster, devices, SearchLimits(allow_fewer_devices=False)))
    answered = 0
    for config in rng.sample(configs, min(30, len(configs))):
        pool = SolvedPool()
        tables = [build_table(StepModel(model, training, cluster.sized(config.world_size),
                                        config.model_copy(update={"zero": z})), ["none", "selective", "full"])
                  for z in (3, 2, 1, 0) if z == 0 or config.dp * config.cp > 1]
        cutoff = rng.choice([None, ilp.solve(tables[-1]).split.objective * rng.uniform(0.97, 1.05)
                             if ilp.solve(tables[-1]).split else None])
        for table in tables:
            own = ilp.solve(table, cutoff=cutoff)
            answer = pool.answer(table, cutoff)
            if answer is not None:
                answered += 1
                assert answer.status == own.status
                if own.status == "optimal":
                    assert answer.split.objective == pytest.approx(own.split.objective, rel=1e-6)
            pool.add(table, own, cutoff)
    assert answered > 0


def test_the_stage_holding_the_head_may_take_fewer_layers():
    """The old bound charged the head's stage the mean layer memory; with a 256k vocabulary on a tight
    budget that stage fits only if the ILP gives it fewer layers — the candidate must survive."""
    model = ModelSpec(name="v256k", num_layers=32, hidden_size=4096, num_attention_heads=32, num_kv_heads=8,
                      ffn_hidden_size=14336, ffn_kind="swiglu", vocab_size=256000, seq_length=4096,
                      norm="rmsnorm", position_embedding="rope")
    cluster = load_cluster("dgx-a100-40g", 8)
    training = TrainingSpec(gbs=64, seq_length=4096)
    config = ParallelConfig(dp=1, tp=1, pp=8, mbs=1)
    table = build_table(StepModel(model, training, cluster, config), ["none", "selective", "full"])
    assert memory_admits_a_split(table)
    limits = SearchLimits(tp=[1], pp=[8], mbs=[1], vpp=[1], zero=[0])
    best = search(model, training, cluster, 8, limits, top=1).best
    sizes = [s.num_layers for s in best.layouts]
    assert best.prediction.fits and sizes[-1] < max(sizes)


def test_the_exit_4_hint_keeps_the_users_limits(gplan, tmp_path):
    """With --tp 1 --pp 8 on 40 GiB devices the hint used to name devices of 26 GiB (a size that had
    fitted with tp it was not allowed): the memory it names is more than the device has, or absent."""
    import re

    r = gplan("search", "llama3-70b", "--cluster", "dgx-a100-40g", "--devices", "16", "--tp", "1", "--pp", "8",
              "--out", str(tmp_path / "p.json"))
    assert r.code == 4 and "within the limits asked" in r.stderr
    named = re.search(r"devices with ≥ (\\d+) GiB", r.stderr)
    assert named is None or int(named.group(1)) > 40


@pytest.mark.parametrize("seed", range(40))
def test_the_memory_aware_bound_never_prunes_a_table_that_beats_the_incumbent(seed):
    """`memory_aware_prunes` against brute force on random tables (one or two kinds, one or two node
    groups, interleaved, tight budgets): at an incumbent just above a table's exact optimum it never
    prunes. Its stage capacities are the floors of a relaxation (a stage holds whole layers): were they
    rounded any further down, an optimum would be pruned here."""
    from gplan.planner.reference import brute_force
    from gplan.planner.bounds import memory_aware_prunes
    from helpers import random_table

    rng = random.Random(seed)
    shape = seed % 4
    if shape == 0:
        table = random_table(rng, [rng.randint(3, 8)], rng.randint(2, 3))
    elif shape == 1:
        table = random_table(rng, [rng.randint(1, 3), rng.randint(2, 4)], rng.randint(2, 3))
    elif shape == 2:
        table = random_table(rng, [rng.randint(3, 6)], rng.randint(2, 3), groups=2)
    else:
        pp = rng.choice([2, 3])
        table = random_table(rng, [pp * rng.randint(1, 3)], pp, equal=True)
    exact = brute_force(table)
    if exact is None:
        return
    above = exact.objective * (1 + 1e-7) + table.outside_pipeline_floor_s
    assert not memory_aware_prunes(table, table.least_work_s, above)


def test_the_memory_aware_bound_counts_whole_layers():
    """Three 1-second layers on two stages, two micro-batches: the best split (2/1) takes
    (m − 1)·2 + 3 = 5 s. Below that incumbent, at a longest stage of 1.6 s, the relaxation lets each
    stage hold 1.6 layers — 3.2 in all, enough; whole layers, 1 + 1 — so the bound prunes (it did not
    before it counted whole layers), and at 5 s it must not."""
    from gplan.planner.bounds import memory_aware_prunes
    from gplan.planner.table import CostTable

    table = CostTable(kinds=["k"], layers_per_kind=[3], options=["none"], groups=[0], group_stage_capacity=[2],
                      pp=2, vpp=1, num_microbatches=2, layer_time_s={(0, 0, 0): 1.0}, layer_state_bytes=[1.0],
                      layer_activation_bytes={(0, 0): 1.0}, in_flight=[2.0, 1.0],
                      fixed_time_s={(0, 0): 0.0, (1, 0): 0.0}, fixed_memory_bytes={(0, 0): 0.0, (1, 0): 0.0},
                      budget_bytes=[100.0])
    assert table.objective([2.0, 1.0]) == pytest.approx(5.0)
    assert not memory_aware_prunes(table, table.least_work_s, 5.0 * (1 + 1e-9))
    assert memory_aware_prunes(table, table.least_work_s, 4.6)
