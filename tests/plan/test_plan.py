"""plan.json: round trip, schema version, self-containedness."""

from __future__ import annotations

import json

import pytest

from gplan.errors import InputError
from gplan.planner.inputs import resolve_inputs
from gplan.plan import read_plan, write_plan
from gplan.planner.build import make_plan
from gplan.spec.parallel import ParallelConfig


@pytest.fixture
def plan():
    inputs = resolve_inputs("llama3-8b", devices=16, cluster="dgx-a100-80g", gbs=64)
    return make_plan(inputs.model, inputs.training, inputs.cluster, ParallelConfig(dp=2, tp=4, pp=2, mbs=1))


def test_round_trip_is_exact(plan, tmp_path):
    path = tmp_path / "plan.json"
    write_plan(plan, path)
    assert read_plan(path) == plan
    data = json.loads(path.read_text())
    assert data["schema_version"] == 1
    for key in ("model", "cluster", "training", "digest", "parallel", "stages", "placement", "prediction", "provenance"):
        assert key in data
    assert data["cluster"]["node_groups"][0]["hardware"]["peak_tflops"]["bf16"] == 312  # self-contained


def test_plan_shape(plan):
    assert plan.world_size == 16 and len(plan.rank_devices()) == 16
    assert [s.layer_start for s in plan.stages] == [0, 16] and plan.stages[-1].layer_end == 32
    assert plan.stages[0].embedding and plan.stages[1].head
    assert list(plan.stages[1].ranks) == list(range(8, 16))
    assert plan.parallel.num_microbatches == 32


def test_newer_schema_is_refused(plan, tmp_path):
    path = tmp_path / "plan.json"
    write_plan(plan, path)
    data = json.loads(path.read_text())
    data["schema_version"] = 2
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match="schema version 2 is not supported"):
        read_plan(path)


def test_plans_are_frozen(plan):
    with pytest.raises(Exception):
        plan.parallel.dp = 4  # type: ignore[misc]
