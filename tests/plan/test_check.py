"""The one plan check: every command that reads a plan refuses a corrupted one with exit 3, naming the
field, before anything is written or started; `gplan validate --refresh` repairs a deliberate edit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gplan.plan import plan_json, read_plan

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden_plan.json"


def edit(data: dict, change: str) -> None:
    if change == "overlapping_stages":
        data["stages"][1]["layer_start"] = 15
    elif change == "uncovered_layers":
        data["stages"][1]["layer_end"] = 31
    elif change == "recompute_entries":
        data["stages"][0]["layers"][0]["count"] = 16
    elif change == "two_ranks_one_device":
        data["placement"]["stage_devices"][1]["first"] = data["placement"]["stage_devices"][0]["first"]
    elif change == "stage_missing_a_rank":
        data["stages"][0]["num_ranks"] -= 1
    elif change == "num_microbatches":
        data["parallel"]["num_microbatches"] = 16
    elif change == "dp_without_its_ranks":
        data["parallel"]["dp"] = 1
    elif change == "gbs_edited":
        data["training"]["gbs"] = 128
    elif change == "head_on_the_first_stage":
        data["stages"][0]["head"] = True
    elif change == "device_outside_its_node":
        data["placement"]["stage_devices"][0]["first"] = 10**6


FIELDS = {
    "overlapping_stages": "stages[1].layer_start", "uncovered_layers": "stages[1].layers",
    "recompute_entries": "stages[0].layers", "two_ranks_one_device": "placement.stage_devices",
    "stage_missing_a_rank": "stages[0].num_ranks", "num_microbatches": "parallel.num_microbatches",
    "dp_without_its_ranks": "parallel: dp·tp·pp·cp", "gbs_edited": "digest",
    "head_on_the_first_stage": "stages[0]", "device_outside_its_node": "placement.stage_devices[0]",
}


@pytest.fixture(params=sorted(FIELDS))
def corrupted(request, tmp_path):
    data = json.loads(plan_json(read_plan(GOLDEN)))  # the golden plan as this gplan writes it
    edit(data, request.param)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    return request.param, path


COMMANDS = [
    ["validate"], ["estimate"], ["explain"], ["export", "--to", "megatron"],
    ["launch", "--dry-run", "--nnodes", "2", "--nproc-per-node", "8", "--rdzv-endpoint", "n0:1"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_every_reader_refuses_a_corrupted_plan_naming_the_field(gplan, corrupted, command, tmp_path):
    change, path = corrupted
    out = tmp_path / "out"
    args = [command[0], str(path), *command[1:]]
    if command[0] == "export":
        args += ["-o", str(out)]
    if command[0] == "launch":
        args += ["--run-dir", str(out)]
    r = gplan(*args)
    assert r.code == 3, (change, r.stderr)
    assert FIELDS[change] in r.stderr and "Traceback" not in r.stderr
    assert "--refresh" in r.stderr
    assert not out.exists()


def test_compare_refuses_a_corrupted_plan(gplan, corrupted):
    _, path = corrupted
    assert gplan("compare", str(GOLDEN), str(path)).code == 3


def test_refresh_repairs_a_deliberate_edit_and_reprices_it(gplan, tmp_path):
    data = json.loads(GOLDEN.read_text())
    data["training"]["gbs"] = 128
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    assert gplan("estimate", str(path)).code == 3
    r = gplan("validate", str(path), "--refresh", "--json")
    assert r.code == 0, r.stderr
    assert r.json()["refreshed"]
    fixed = json.loads(path.read_text())
    assert fixed["parallel"]["num_microbatches"] == 64 and fixed["digest"] != data["digest"]
    assert gplan("validate", str(path)).code == 0
    before = json.loads(GOLDEN.read_text())["prediction"]["step_time_s"]
    assert fixed["prediction"]["step_time_s"] > 1.9 * before  # twice the batch, about twice the step


def test_refresh_rebuilds_stage_ranges_from_the_layer_counts(gplan, tmp_path):
    data = json.loads(GOLDEN.read_text())
    data["stages"][0]["layers"][0]["count"] = 16
    data["stages"][1]["layers"][0]["count"] = 16
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    assert gplan("validate", str(path)).code == 3
    assert gplan("validate", str(path), "--refresh").code == 0
    fixed = json.loads(path.read_text())
    assert [(s["layer_start"], s["layer_end"]) for s in fixed["stages"]] == [(0, 16), (16, 32)]


def test_the_target_is_held_once_in_the_plan_as_its_engine(gplan, tmp_path):
    """One engine per plan, held once: the plan file names it in `training.engine` (covered by the digest)
    and nowhere else. A plan written when a `target` stood beside it reads when the two agree and is
    refused, naming both, when they do not."""
    out = tmp_path / "plan.json"
    assert gplan("search", "llama3-8b", "--devices", "8", "--cluster", "dgx-a100-80g", "--out", str(out)).code == 0
    data = json.loads(out.read_text())
    assert "target" not in data and data["training"]["engine"] == "torch"
    assert gplan("validate", str(out)).code == 0
    out.write_text(json.dumps(data | {"target": "torch"}))  # as plans were written before
    assert gplan("validate", str(out)).code == 0
    out.write_text(json.dumps(data | {"target": "megatron"}))
    r = gplan("validate", str(out))
    assert r.code == 3 and "target megatron" in r.stderr and "training.engine" in r.stderr
