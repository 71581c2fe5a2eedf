"""`gplan calibrate` on real CPU launches: fit on three plans, predict a fourth it has not seen.

The fit set varies the micro-batch size (mbs 1 and 2): with mbs 1 everywhere, the time per layer per
micro-batch and the compute speed grow together in every run, the fit cannot tell them apart, and a
held-out mbs-2 plan read whichever split the noise chose (29% off in one clean-clone run, 3–6% on two
other sets of the same launches). Held out: the pipeline plan, whose bubble and sends no fitted run has
(5–8% off on all three sets)."""

from __future__ import annotations

import json
import statistics

import pytest

from helpers import requires_engine
from helpers import SMALL_LLAMA, tiny_plan
from typer.testing import CliRunner

from gplan.cli import app
from gplan.spec.training import TrainingSpec

pytestmark = [pytest.mark.slow, requires_engine("torch", "torch")]
TRAINING = TrainingSpec(gbs=8, seq_length=128, precision="fp32")
FIT = {"one": {}, "dp2": dict(dp=2), "dp2_mbs2": dict(dp=2, mbs=2)}
HELD_OUT = {"pp2": dict(pp=2)}


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """Each plan launched three times, the rounds interleaved, and its median launch kept: on two shared CPU
    cores one launch's burst would otherwise read as a property of that plan's layout, and the speed drifts
    both ways (keeping the fastest, one launch 20% quicker than its two others threw the held-out error to
    16%; on the same launches the medians gave 1%)."""
    root = tmp_path_factory.mktemp("runs")
    plans = {name: tiny_plan(root / f"{name}.json", SMALL_LLAMA, None, TRAINING, **degrees)
             for name, degrees in {**FIT, **HELD_OUT}.items()}
    launches = {name: [] for name in plans}
    for round_ in range(3):
        for name, plan in plans.items():
            run_dir = root / f"{name}-{round_}"
            r = CliRunner().invoke(app, ["launch", str(plan), "--run-dir", str(run_dir), "--steps", "14",
                                         "--warmup-steps", "3", "--device", "cpu"])
            assert r.exit_code == 0, r.stderr[-2000:]
            launches[name].append(run_dir / "run_report.json")
    return {name: sorted(paths, key=lambda p: json.loads(p.read_text())["step_time_s"])[len(paths) // 2]
            for name, paths in launches.items()}


def test_calibration_predicts_a_held_out_plan_within_15_percent(gplan, reports, tmp_path):
    out = tmp_path / "calibrated.yaml"
    args = [str(reports[n]) for n in FIT] + [a for n in HELD_OUT for a in ("--held-out", str(reports[n]))]
    data = gplan("calibrate", *args, "--out", str(out), "--json").json()
    held = data["held_out"]
    before = statistics.median(abs(h["error_before"]) for h in held)
    after = statistics.median(abs(h["error_after"]) for h in held)
    assert after < 0.15
    assert after < before or after < 0.10  # it improves on the catalogue, unless that was already within 10%
    assert len(data["runs"]) == 3 and all(r["error_leave_one_out"] is not None for r in data["runs"])


def test_the_calibrated_profile_prices_the_held_out_plan_as_reported(gplan, reports, tmp_path):
    out = tmp_path / "calibrated.yaml"
    args = [str(reports[n]) for n in FIT] + ["--held-out", str(reports["pp2"])]
    data = gplan("calibrate", *args, "--out", str(out), "--json").json()
    plan = json.loads((reports["pp2"].parent / "plan.json").read_text())
    estimate = gplan("estimate", str(reports["pp2"].parent / "plan.json"), "--json").json()
    assert estimate["step_time_s"] == pytest.approx(plan["prediction"]["step_time_s"])
    measured = data["held_out"][0]["measured_s"]
    c = plan["parallel"]  # every option given, and the plan's split: nothing left for estimate to choose
    calibrated = gplan("estimate", str(small_llama_file(tmp_path)), "--profile", str(out), "--devices", "2",
                       "--pp", "2", "--schedule", c["schedule"], "--mbs", str(c["mbs"]), "--zero", str(c["zero"]),
                       "--recompute", c["recompute"], "--no-sp", "--vpp", str(c["vpp"]),
                       "--stages", ",".join(str(s["layer_end"] - s["layer_start"]) for s in plan["stages"]),
                       "--gbs", "8", "--seq-length", "128", "--precision", "fp32", "--json").json()
    assert calibrated["chosen"] == {}
    assert calibrated["step_time_s"] / measured - 1 == pytest.approx(data["held_out"][0]["error_after"], abs=1e-9)


def small_llama_file(tmp_path):
    import yaml

    path = tmp_path / "small-llama.yaml"
    path.write_text(yaml.safe_dump(SMALL_LLAMA.model_dump(mode="json")))
    return path


def test_calibrate_refuses_a_report_without_its_plan(gplan, reports, tmp_path):
    lonely = tmp_path / "run_report.json"
    lonely.write_text(reports["one"].read_text())
    r = gplan("calibrate", str(lonely), str(reports["dp2"]))
    assert r.code == 3 and "plan.json" in r.stderr


def test_one_run_fits_the_compute_speed_and_says_what_it_could_not(gplan, reports, tmp_path):
    """One run is one equation: it fits the compute speed (the run's own error goes to ~0), keeps the
    overheads and links at the catalogue's and says so."""
    out = tmp_path / "one.yaml"
    r = gplan("calibrate", str(reports["dp2"]), "--out", str(out))
    assert r.code == 0, r.stderr
    text = " ".join(r.stderr.split())
    assert "fit 1 of 5 parameters (compute_scale)" in text and "kept at the catalogue's" in text
    import yaml

    report = yaml.safe_load(out.read_text())["calibration"]
    assert report["fitted"] == ["compute_scale"] and abs(report["runs"][0]["error_after"]) < 0.02
