"""The dynamic-programming split (planner/split_exact.py) against brute force and the ILP on random cost
tables: the same optimum, memory respected, the same answers to a cut-off."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from gplan.planner import ilp, split_exact
from gplan.planner.reference import brute_force
from gplan.planner.table import CostTable, stage_memory
from helpers import random_table
from test_ilp import check_against_brute_force


def check(table: CostTable) -> None:
    check_against_brute_force(table, split_exact.solve)


@pytest.mark.parametrize("seed", range(30))
def test_one_kind_matches_brute_force(seed):
    rng = random.Random(seed)
    check(random_table(rng, [rng.randint(1, 7)], rng.randint(1, 4)))


@pytest.mark.parametrize("seed", range(20))
def test_two_kinds_in_order_match_brute_force(seed):
    rng = random.Random(500 + seed)
    check(random_table(rng, [rng.randint(1, 3), rng.randint(1, 4)], rng.randint(1, 3)))


@pytest.mark.parametrize("seed", range(8))
def test_equal_and_uneven_interleaved_stages_match_brute_force(seed):
    rng = random.Random(900 + seed)
    pp = rng.choice([2, 3])
    check(random_table(rng, [pp * rng.randint(1, 2)], pp, equal=True))
    vpp = rng.choice([2, 3])
    check(replace(random_table(rng, [rng.randint(pp * vpp - 2, 8)], pp), vpp=vpp))


@pytest.mark.parametrize("seed", range(12))
def test_larger_tables_match_the_ilp(seed):
    """Beyond brute force: 20–60 layers on 4–16 stages, two kinds like DeepSeek's dense-then-MoE."""
    rng = random.Random(1300 + seed)
    layers = [rng.randint(1, 3), rng.randint(20, 58)] if seed % 2 else [rng.randint(20, 60)]
    table = random_table(rng, layers, rng.choice([4, 8, 16]))
    by_ilp, by_dp = ilp.solve(table, time_limit_s=60), split_exact.solve(table)
    assert by_dp.status == by_ilp.status or {by_dp.status, by_ilp.status} == {"optimal", "time_limit"}
    if by_ilp.split is not None and by_ilp.status == "optimal":
        assert by_dp.split.objective == pytest.approx(by_ilp.split.objective, rel=1e-6)
    if by_dp.split is not None and by_ilp.split is not None:
        assert by_dp.split.objective <= by_ilp.split.objective * (1 + 1e-6)


@pytest.mark.parametrize("seed", range(8))
def test_a_cutoff_is_answered_as_the_ilp_answers_it(seed):
    rng = random.Random(1700 + seed)
    table = random_table(rng, [rng.randint(2, 6)], rng.randint(1, 3))
    exact = brute_force(table)
    if exact is None:
        return
    above = split_exact.solve(table, cutoff=exact.objective * 0.999)
    assert above.status == "cutoff" and above.split is None
    at = split_exact.solve(table, cutoff=exact.objective * 1.001)
    assert at.status == "optimal" and at.split.objective == pytest.approx(exact.objective)


@pytest.mark.parametrize("seed", range(24))
def test_two_node_groups_match_brute_force(seed):
    """Which group runs each stage, each group hosting at most its capacity of stages (the ILP's (5))."""
    rng = random.Random(3100 + seed)
    layers = [rng.randint(1, 2), rng.randint(1, 3)] if seed % 3 == 0 else [rng.randint(2, 6)]
    check(random_table(rng, layers, rng.randint(1, 3), groups=2))


def test_three_node_groups_are_left_to_the_ilp():
    table = random_table(random.Random(3), [4], 2, groups=3)
    assert split_exact.solve(table) is None


@pytest.mark.parametrize("seed", range(10))
def test_the_ilp_started_from_the_program_proves_the_same_optimum(seed):
    """How the search uses the program: the ILP, given its split and its objective as a lower bound,
    returns an optimal split of that objective, within memory."""
    rng = random.Random(2100 + seed)
    layers = [rng.randint(1, 3), rng.randint(10, 40)] if seed % 2 else [rng.randint(10, 40)]
    table = random_table(rng, layers, rng.choice([2, 4, 8]))
    bound = split_exact.solve(table)
    if bound.split is None:
        return
    solved = ilp.solve(table, time_limit_s=60, incumbent=bound.split, least=bound.split.objective)
    assert solved.status == "optimal" and solved.solver == "highs"
    assert solved.split.objective == pytest.approx(bound.split.objective, rel=1e-6)
    assert all(stage_memory(table, c, i, 0) <= table.budget_bytes[0] * (1 + 1e-9) for i, c in enumerate(solved.split.counts))


@pytest.mark.parametrize("seed", range(4))
def test_a_looser_lower_bound_leaves_the_ilps_optimum_alone(seed):
    """The inequality is valid below the optimum: the ILP, started from a worse split and bounded below
    at 90% of the optimum, still returns the optimum."""
    rng = random.Random(2500 + seed)
    table = random_table(rng, [rng.randint(8, 16)], 4)
    exact = split_exact.solve(table).split
    if exact is None:
        return
    from gplan.planner.table import Split

    slow = Split(counts=[[[0, 0, sum(c[0])]] for c in exact.counts], stage_groups=exact.stage_groups,
                 objective=0.0)  # every layer fully recomputed: slower (and perhaps not even fitting)
    solved = ilp.solve(table, time_limit_s=30, incumbent=slow, least=exact.objective * 0.9)
    assert solved.status == "optimal" and solved.split.objective == pytest.approx(exact.objective, rel=1e-6)


def test_the_search_settles_most_splits_by_the_bound_and_proves_the_rest_by_the_ilp():
    from gplan.planner.inputs import resolve_inputs
    from gplan.planner.search import search
    from gplan.planner.space import SearchLimits

    inputs = resolve_inputs("llama3-70b", 64, "dgx-h100", target="megatron")
    result = search(inputs.model, inputs.training, inputs.cluster, 64, SearchLimits())
    assert result.proven_optimal and result.best.solver.name in ("highs", "uniform")
    assert result.solvers.get("exact", 0) > 0 and result.solvers.get("highs", 0) > 0
    assert set(result.statuses) <= {"optimal", "cutoff", "infeasible"}
