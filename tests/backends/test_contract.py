"""validate ⇒ launch: every plan the search ranks for random small cases builds on a fake process
group exactly as a run builds it, and a sample of them trains real CPU steps (bench/contract.py runs
the same over 200 cases)."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gplan.backends.registry import backend
from gplan.plan import layouts_of, write_plan
from gplan.spec.targets import TARGETS, refusals
from helpers import random_case, ranked_plans, requires_engine

pytestmark = requires_engine("torch", "torch")


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_every_ranked_plan_of_a_random_case_validates(seed):
    for plan in ranked_plans(random_case(random.Random(seed))):
        assert refusals(TARGETS["torch"], plan.model, plan.parallel, plan.parallel.num_microbatches,
                        layouts_of(plan)) == []
        report = backend("torch").validate(plan)
        assert report.ok, [c for c in report.checks if not c.ok]


@pytest.mark.slow
def test_a_sample_of_ranked_plans_trains_two_cpu_steps(gplan, tmp_path):
    rng = random.Random(7)
    plans = [p for _ in range(6) for p in ranked_plans(random_case(rng))[:1] if p.world_size <= 4][:3]
    assert plans, "the random cases gave no plan to launch"
    for i, plan in enumerate(plans):
        path = tmp_path / f"plan{i}.json"
        write_plan(plan, path)
        r = gplan("launch", str(path), "--steps", "2", "--warmup-steps", "0", "--device", "cpu",
                  "--run-dir", str(tmp_path / f"run{i}"), "--json")
        assert r.code == 0, (plan.parallel.label(), r.stderr[-1500:])
        assert len(r.json()["losses"]) == 2
