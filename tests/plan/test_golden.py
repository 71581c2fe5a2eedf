"""A committed plan.json (schema v1) that every plan-reading command must keep accepting: validate,
estimate, explain, compare, export to every target, launch --dry-run / --slurm / --validate.

The plan is llama3-8b on 16 A100-80GB (dp 2, tp 4 + sp, pp 2 split 17/15, zero 1), written by
`gplan search llama3-8b --devices 16 --cluster dgx-a100-80g --tp 4 --pp 2 --zero 1 --gbs 64 --top 3`.
A change to the cost model that re-prices it must regenerate it with that command (validate checks
that this gplan reproduces the prediction the plan carries)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gplan.backends.exporters import targets
from gplan.plan import SCHEMA_VERSION, read_plan
from helpers import requires_engine

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden_plan.json"


def test_the_golden_plan_is_schema_v1_and_reads_back():
    data = json.loads(GOLDEN.read_text())
    assert data["schema_version"] == SCHEMA_VERSION == 1
    plan = read_plan(GOLDEN)
    assert plan.world_size == 16 and [s.layer_end - s.layer_start for s in plan.stages] == [17, 15]


def test_validate_accepts_it(gplan):
    r = gplan("validate", str(GOLDEN), "--json")
    assert r.code == 0, r.stderr
    assert r.json()["kind"] == "plan"


def test_estimate_reprices_it_to_its_own_prediction(gplan):
    r = gplan("estimate", str(GOLDEN), "--json")
    assert r.code == 0, r.stderr
    assert r.json()["step_time_s"] == pytest.approx(read_plan(GOLDEN).prediction.step_time_s, rel=1e-12)


def test_explain_shows_its_runner_ups(gplan):
    r = gplan("explain", str(GOLDEN), "--json")
    assert r.code == 0, r.stderr
    assert r.json()["runner_ups"]["source"] and len(r.json()["runner_ups"]["plans"]) == 2


def test_compare_reads_it(gplan):
    r = gplan("compare", str(GOLDEN), str(GOLDEN), "--json")
    assert r.code == 0, r.stderr
    assert len(r.json()) == 2


@pytest.mark.parametrize("target", sorted(targets()))
def test_every_export_target_reads_it(gplan, tmp_path, target):
    """Every target reads the golden plan; one whose engine cannot run its configuration (MindFormers' PyNative
    trainer has no zero 1: it shards with FSDP) refuses it in one line naming the capability, writing nothing."""
    from gplan.spec.targets import TARGETS, config_refusals

    plan = read_plan(GOLDEN)
    engine = targets()[target].engine
    refused = config_refusals(TARGETS[engine], plan.model, plan.parallel, plan.parallel.num_microbatches,
                              plan.training.precision)
    r = gplan("export", str(GOLDEN), "--to", target, "-o", str(tmp_path / "out"), "--json", "--image",
              "registry.example/gplan:0.1")
    if refused:
        assert r.code == 3 and f"({refused[0].capability})" in r.stderr and not (tmp_path / "out").exists(), r.stderr
        return
    assert r.code == 0, r.stderr
    files = [Path(f) for f in r.json()["files"]]
    assert files and all(plan.digest in f.read_text() for f in files)


@pytest.mark.parametrize("backend", ["torch", "mindspore"])
def test_launch_renders_it(gplan, tmp_path, backend):
    r = gplan("launch", str(GOLDEN), "--backend", backend, "--dry-run", "--json", "--nnodes", "2",
              "--nproc-per-node", "8", "--rdzv-endpoint", "node0:29500", "--run-dir", str(tmp_path))
    assert r.code == 0, r.stderr
    assert len(r.json()["nodes"]) == 2
    script = tmp_path / "job.sh"
    assert gplan("launch", str(GOLDEN), "--backend", backend, "--slurm", str(script), "--nproc-per-node", "8",
                 "--run-dir", str(tmp_path / "run")).code == 0
    assert "srun" in script.read_text()


@requires_engine("torch", "torch")
def test_launch_validate_builds_it_on_a_fake_process_group(gplan):
    r = gplan("launch", str(GOLDEN), "--validate", "--json")
    assert r.code == 0, r.stderr
    assert r.json()["ok"]


def test_the_run_report_counts_every_stage_and_takes_mfu_from_the_plan():
    """`report.build_report`, which both workers use: the slowest rank per step, the median after the
    warm-up, every stage's peak, MFU by the plan's own FLOPs and peaks."""
    from gplan.report import RankReport, build_report

    plan = read_plan(GOLDEN)
    ranks = [RankReport(rank=r, stage=0 if r in plan.stages[0].ranks else 1, step_times_s=[9.0, 2.0, 3.0, 4.0],
                        peak_memory_bytes=float(r), memory_kind="rss") for r in range(plan.world_size)]
    ranks[5] = ranks[5].model_copy(update={"step_times_s": [9.0, 2.0, 5.0, 4.0]})
    report = build_report(plan, backend="test", framework_version="0", device="cpu", compute_dtype="fp32",
                          first_step=0, steps=4, warmup_steps=1, losses=[1.0] * 4, ranks=ranks)
    assert report.step_times_s == [9.0, 2.0, 5.0, 4.0] and report.step_time_s == 4.0
    assert report.stage_peak_bytes() == [max(plan.stages[0].ranks), max(plan.stages[1].ranks)]
    assert report.mfu == pytest.approx(plan.prediction.mfu * plan.prediction.step_time_s / 4.0)
    assert report.tokens_per_s == pytest.approx(plan.training.tokens_per_step / 4.0)
