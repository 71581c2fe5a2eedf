"""Capabilities as data: the search bounded by what its target runs, the launch refusing what its
backend cannot run — before any process starts, naming the capability and the option that avoids it."""

from __future__ import annotations

import json

import pytest

from gplan.plan import layouts_of, read_plan
from gplan.spec.targets import TARGETS, refusals


def searched(gplan, tmp_path, *args: str) -> dict:
    out = tmp_path / "plan.json"
    r = gplan("search", *args, "--out", str(out), "--top", "5")
    assert r.code == 0, r.stderr
    return json.loads(out.read_text())


def test_the_pipeline_plan_of_issue_13_now_has_enough_microbatches(gplan, tmp_path):
    """`--pp 2 --vpp 1 --gbs 8` used to write one micro-batch, which torch's 1F1B refuses at step 1."""
    plan = searched(gplan, tmp_path, "tiny-llama", "--cluster", "local-cpu", "--devices", "2", "--pp", "2",
                    "--vpp", "1", "--gbs", "8")
    assert plan["training"]["engine"] == "torch"
    assert plan["parallel"]["num_microbatches"] >= plan["parallel"]["pp"] == 2


@pytest.mark.parametrize("model, cluster, devices", [("llama3-8b", "dgx-a100-40g", "8"), ("llama3-70b", "dgx-h100", "64"),
                                                     ("gpt-13b", "dgx-a100-80g", "64")])
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_every_ranked_plan_is_one_its_target_runs(gplan, tmp_path, model, cluster, devices, target):
    out = tmp_path / "plan.json"
    r = gplan("search", model, "--cluster", cluster, "--devices", devices, "--target", target, "--out", str(out),
              "--json")
    if r.code == 4:  # nothing this target runs fits, or it runs no configuration: the message says which
        assert "does not fit" in r.stderr or f"that {target} runs as priced" in r.stderr
        return
    assert r.code == 0, r.stderr
    plan = read_plan(out)
    assert plan.target == target
    assert refusals(TARGETS[target], plan.model, plan.parallel, plan.parallel.num_microbatches, layouts_of(plan)) == []
    for ranked in r.json()["ranked"]:
        from gplan.spec.parallel import LayerCount, ParallelConfig, StageLayout

        config = ParallelConfig(**ranked["parallel"])
        layouts = [StageLayout(layers=[LayerCount(**c) for c in stage], embedding=i == 0,
                               head=i == len(ranked["stage_layers"]) - 1)
                   for i, stage in enumerate(ranked["stage_layers"])]
        assert refusals(TARGETS[target], plan.model, config, ranked["prediction"]["num_microbatches"], layouts) == []


def test_a_target_that_runs_nothing_asked_says_which_capability(gplan, tmp_path):
    r = gplan("search", "gpt-1.7b", "--devices", "16", "--target", "mindspore", "--out", str(tmp_path / "p.json"))
    assert r.code == 4 and "mindspore runs the Llama family" in r.stderr and "--target torch" in r.stderr
    r = gplan("search", "llama3-8b", "--devices", "16", "--cp", "2", "--target", "deepspeed",
              "--out", str(tmp_path / "p.json"))
    assert r.code == 4 and "deepspeed does not run context parallelism" in r.stderr and "--cp 1" in r.stderr
    plan = searched(gplan, tmp_path, "llama3-8b", "--devices", "16", "--cp", "2")
    assert plan["parallel"]["cp"] == 2 and plan["training"]["engine"] == "torch"


def test_tied_embeddings_across_stages_run_in_torch_but_not_in_mindformers(gplan, tmp_path):
    plan = searched(gplan, tmp_path, "gpt-1.7b", "--devices", "16", "--pp", "2")
    assert plan["parallel"]["pp"] == 2 and plan["training"]["engine"] == "torch"
    r = gplan("search", "gpt-1.7b", "--devices", "16", "--pp", "2", "--target", "deepspeed", "--zero", "3",
              "--out", str(tmp_path / "q.json"))
    assert r.code == 4 and "deepspeed runs zero [0, 1] with pipeline stages" in r.stderr


def test_an_unknown_target_is_refused(gplan, tmp_path):
    r = gplan("search", "llama3-8b", "--devices", "8", "--target", "jax", "--out", str(tmp_path / "p.json"))
    assert r.code == 3 and "megatron" in r.stderr


def test_launch_refuses_what_its_backend_cannot_run_before_anything_starts(gplan, tmp_path):
    """A hand-built pp=2 plan with one micro-batch: torch's 1F1B needs two; refused, nothing started."""
    from gplan.spec.training import TrainingSpec
    from helpers import TINY_LLAMA, tiny_plan

    path = tiny_plan(tmp_path / "plan.json", TINY_LLAMA, None, TrainingSpec(gbs=1, seq_length=32, precision="fp32"),
                     pp=2)
    r = gplan("launch", str(path), "--device", "cpu", "--run-dir", str(tmp_path / "run"))
    assert r.code == 3 and "(microbatches)" in r.stderr and "--target torch" in r.stderr
    assert not (tmp_path / "run").exists()


def test_megatron_plans_recompute_the_same_layers_on_every_stage(gplan, tmp_path):
    plan = searched(gplan, tmp_path, "llama3-70b", "--cluster", "dgx-a100-40g", "--devices", "64", "--target",
                    "megatron", "--zero", "0,1")
    recomputed = [sorted((c["recompute"], c["count"]) for c in s["layers"] if c["recompute"] != "none")
                  for s in plan["stages"]]
    assert len({tuple(r) for r in recomputed}) == 1
