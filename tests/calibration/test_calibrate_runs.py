"""`gplan calibrate` on real CPU launches: fit on three plans, report a fourth it has not seen.

The fit set varies the micro-batch size (mbs 1 and 2): with mbs 1 everywhere, the time per layer per
micro-batch and the compute speed grow together in every run and the fit cannot tell them apart. Held out:
the pipeline plan, whose bubble and sends no fitted run has.

How close the held-out prediction comes is an accuracy, and on two shared CPU cores it is noise-bound: 1–8%
on most clean-clone runs, 16%, 19.5% and 29% on others (medians of three launches each), the launches' own
speed drifting by a fifth between rounds. So these tests hold the mechanics (the fit never ends further from
the fitted runs than the catalogue began, each fitted run gets a leave-one-out prediction, the held-out plan
is priced with the fitted profile exactly as the report says), and the fit's accuracy is held where the truth
is known: runs made with known efficiencies (tests/calibration/test_runs.py) and real Megatron logs
(tests/calibration/test_engine_logs.py)."""

from __future__ import annotations

import json
import math

import pytest

from helpers import requires_engine
from helpers import SMALL_LLAMA, squared_log_misfit, tiny_plan
from typer.testing import CliRunner

from forked_ranks import launches_forked
from gplan.cli import app
from gplan.spec.training import TrainingSpec

pytestmark = [pytest.mark.slow, requires_engine("torch", "torch")]
TRAINING = TrainingSpec(gbs=8, seq_length=128, precision="fp32")
FIT = {"one": {}, "dp2": dict(dp=2), "dp2_mbs2": dict(dp=2, mbs=2)}
HELD_OUT = {"pp2": dict(pp=2)}


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """Each plan launched once: its noise is the fit's to bear, and the assertions below hold whatever the
    launches' speed (three rounds and their medians bought no certainty on two shared cores)."""
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for name, degrees in {**FIT, **HELD_OUT}.items():
        plan = tiny_plan(root / f"{name}.json", SMALL_LLAMA, None, TRAINING, **degrees)
        with launches_forked():  # ranks forked from a server that imported torch once (tests/forked_ranks.py)
            r = CliRunner().invoke(app, ["launch", str(plan), "--run-dir", str(root / name), "--steps", "14",
                                         "--warmup-steps", "3", "--device", "cpu"])
        assert r.exit_code == 0, r.stderr[-2000:]
        out[name] = root / name / "run_report.json"
    return out


def test_calibration_fits_real_launches_and_prices_a_held_out_plan(gplan, reports, tmp_path):
    out = tmp_path / "calibrated.yaml"
    args = [str(reports[n]) for n in FIT] + [a for n in HELD_OUT for a in ("--held-out", str(reports[n]))]
    data = gplan("calibrate", *args, "--out", str(out), "--json").json()
    # The fit minimises the runs' squared log errors: it never ends further from them than where it began.
    assert squared_log_misfit(data["runs"], "error_after") <= squared_log_misfit(data["runs"], "error_before") + 1e-3
    assert len(data["runs"]) == 3 and all(r["error_leave_one_out"] is not None for r in data["runs"])
    held = data["held_out"]
    assert [h["measured_s"] > 0 and math.isfinite(h["error_after"]) for h in held] == [True]
    # No bound on the held-out error here, not even a gross one: a CI run read -55% when one launch of the four
    # ran in a slow spell. How it is priced is checked exactly in the next test.


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
