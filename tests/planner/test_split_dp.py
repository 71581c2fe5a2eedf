"""The dynamic-programming split (planner/split_dp.py) against brute force and the ILP on random cost
tables: the same optimum, memory respected, the same answers to a cut-off."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from gplan.planner import ilp, split_dp
from gplan.planner.reference import brute_force
from gplan.planner.table import CostTable, stage_memory
from gplan.testing import random_table


def check(table: CostTable) -> None:
    exact = brute_force(table)
    solved = split_dp.solve(table)
    assert solved is not None
    if exact is None:
        assert solved.split is None and solved.status == "infeasible"
        return
    assert solved.status == "optimal" and solved.solver == "dp"
    assert solved.split.objective == pytest.approx(exact.objective, rel=1e-9)
    for i, counts in enumerate(solved.split.counts):
        assert stage_memory(table, counts, i, 0) <= table.budget_bytes[0]
        held = sum(map(sum, counts))
        assert held == table.total_layers // table.pp if table.equal_layers else held >= table.stage_min_layers(i)
    assert [sum(sum(c[q]) for c in solved.split.counts) for q in range(len(table.kinds))] == table.layers_per_kind


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
    by_ilp, by_dp = ilp.solve(table, time_limit_s=60), split_dp.solve(table)
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
    above = split_dp.solve(table, cutoff=exact.objective * 0.999)
    assert above.status == "cutoff" and above.split is None
    at = split_dp.solve(table, cutoff=exact.objective * 1.001)
    assert at.status == "optimal" and at.split.objective == pytest.approx(exact.objective)


def test_several_node_groups_are_left_to_the_ilp():
    table = random_table(random.Random(3), [4], 2, groups=2)
    assert split_dp.solve(table) is None
