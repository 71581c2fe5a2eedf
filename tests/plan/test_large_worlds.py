"""A plan's placement is a rule (one device range per stage), so a plan of a million ranks stays small, and
plans written with a device per rank still read."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from gplan.errors import InputError
from gplan.plan import DeviceRef, check_plan, plan_json, read_plan
from gplan.planner.build import make_plan
from gplan.profiles.catalogue import load_cluster, load_model
from gplan.spec.parallel import ParallelConfig
from gplan.spec.training import TrainingSpec

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden_plan.json"
PEAK_READ_BYTES = 16 << 20


def test_a_plan_of_a_million_ranks_is_small_and_checks_without_a_list_of_its_ranks(tmp_path):
    devices = 1 << 20
    cluster = load_cluster("dgx-h100", devices)
    config = ParallelConfig(dp=1 << 13, tp=8, pp=16, sp=True, zero=1)
    plan = make_plan(load_model("llama3-70b"), TrainingSpec(gbs=1 << 15, seq_length=8192), cluster, config)
    text = plan_json(plan)
    assert len(text) < 100_000  # the old list of every rank's device was ~100 MB
    path = tmp_path / "plan.json"
    path.write_text(text)
    tracemalloc.start()
    read = read_plan(path)
    peak_bytes = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    # Reading and checking it never builds a per-rank list: a DeviceRef per rank would be over 100 MB.
    assert peak_bytes < PEAK_READ_BYTES
    last = devices - 1
    assert read.device_of(last) == DeviceRef(node_group=0, node=last // 8, local=last % 8)
    assert read.device_of(65536) == DeviceRef(node_group=0, node=65536 // 8, local=0)  # stage 1's first rank


def test_a_plan_with_a_device_per_rank_still_reads():
    """The golden plan was written with `rank_to_device` and `ranks` lists; read as ranges, same devices."""
    data = json.loads(GOLDEN.read_text())
    listed = [DeviceRef(**d) for d in data["placement"]["rank_to_device"]]
    plan = read_plan(GOLDEN)
    assert plan.rank_devices() == listed
    assert [list(s.ranks) for s in plan.stages] == [s["ranks"] for s in data["stages"]]


def test_a_listed_placement_that_is_not_a_rule_is_refused(tmp_path):
    data = json.loads(GOLDEN.read_text())
    devices = data["placement"]["rank_to_device"]
    devices[0], devices[1] = devices[1], devices[0]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match="placement"):
        read_plan(path)


def test_two_stages_on_one_device_range_are_refused():
    plan = read_plan(GOLDEN)
    ranges = plan.placement.stage_devices
    moved = plan.placement.model_copy(update={"stage_devices": [ranges[0], ranges[0]]})
    with pytest.raises(InputError, match="share devices"):
        check_plan(plan.model_copy(update={"placement": moved}))
