"""`gplan launch --profile` on a real 2-process gloo job, and `gplan explain PLAN --against RUN_DIR`: the
workers' torch.profiler traces are read back and cut into the terms the cost model prices."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gplan.calibration.measured import TERMS, measured_terms, read_rank_trace
from forked_ranks import launches_forked
from gplan.cli import app
from helpers import TINY_LLAMA, cli_json, requires_engine, squared_log_misfit, tiny_plan

pytestmark = [pytest.mark.slow, requires_engine("torch", "torch")]
STEPS, WARMUP = 4, 1


def run(*args: str):
    """A gplan command; a launch's ranks forked from a server that imported torch once (tests/forked_ranks.py)."""
    with launches_forked():
        return CliRunner().invoke(app, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """A 2-stage interleaved pipeline (2 processes) trained with --profile."""
    root = tmp_path_factory.mktemp("profiled")
    plan = tiny_plan(root / "plan.json", TINY_LLAMA, None, pp=2, vpp=2)
    result = run("launch", str(plan), "--run-dir", str(root / "run"), "--steps", str(STEPS), "--warmup-steps",
                 str(WARMUP), "--device", "cpu", "--profile", "--json")
    assert result.exit_code == 0, result.stderr[-3000:]
    return plan, root / "run", cli_json(result.stdout)


def test_each_rank_writes_its_trace_of_the_steps_after_the_warm_up(profiled):
    plan, run_dir, _ = profiled
    for rank in (0, 1):
        events = read_rank_trace(run_dir / "profile" / f"rank{rank}.json")
        names = [e["name"] for e in events]
        assert names.count("gplan:step") == STEPS - WARMUP
        m, vpp = json.loads(plan.read_text())["parallel"]["num_microbatches"], 2
        assert names.count("gplan:forward") == names.count("gplan:backward") == (STEPS - WARMUP) * m * vpp
        assert any(n.startswith("gloo:") for n in names), "the process group's collectives are traced"
    assert not list((run_dir / "profile").glob("*.partial")), "no half-written trace left"


def test_measured_terms_add_up_to_the_measured_step(profiled):
    _, run_dir, report = profiled
    path = run_dir / "profile" / "rank1.json"
    terms, steps = measured_terms(read_rank_trace(path), path)
    assert steps == STEPS - WARMUP
    assert sum(terms[t] for t in TERMS) == pytest.approx(terms["step"], rel=1e-6)
    assert terms["forward"] > 0 and terms["backward"] > 0 and terms["optimizer"] > 0
    # the traced steps are the run report's own steps (the profiler's overhead aside)
    measured = sorted(report["step_times_s"][WARMUP:])
    assert measured[0] * 0.5 < terms["step"] < measured[-1] * 2


def test_explain_against_shows_measured_beside_predicted_per_stage(profiled):
    plan, run_dir, _ = profiled
    result = run("explain", str(plan), "--against", str(run_dir), "--json")
    assert result.exit_code == 0, result.stderr
    data = cli_json(result.stdout)["against"]
    assert data["steps_traced"] == STEPS - WARMUP and [s["stage"] for s in data["stages"]] == [0, 1]
    for stage in data["stages"]:
        assert set(stage["predicted_s"]) == set(stage["measured_s"]) - {"step"} == set(TERMS)
        assert stage["predicted_step_s"] == pytest.approx(json.loads(plan.read_text())["prediction"]["step_time_s"])
    text = run("explain", str(plan), "--against", str(run_dir)).stderr
    assert "measured against predicted" in text and "largest miss" in text and "forward" in text


def test_against_a_directory_that_is_no_profiled_run_is_one_line(profiled, tmp_path):
    plan, run_dir, _ = profiled
    result = run("explain", str(plan), "--against", str(tmp_path))
    assert result.exit_code == 3 and "no plan.json" in result.stderr and "Traceback" not in result.stderr
    unprofiled = tmp_path / "unprofiled"
    unprofiled.mkdir()
    (unprofiled / "plan.json").write_text((run_dir / "plan.json").read_text())
    result = run("explain", str(plan), "--against", str(unprofiled))
    assert result.exit_code == 3 and "no profiler trace" in result.stderr and "--profile" in result.stderr


def test_profile_needs_steps_after_the_warm_up(profiled, tmp_path):
    plan, _, _ = profiled
    result = run("launch", str(plan), "--run-dir", str(tmp_path / "r"), "--steps", "2", "--warmup-steps", "2",
                 "--device", "cpu", "--profile")
    assert result.exit_code == 3 and "--profile traces the steps after the warm-up" in result.stderr
    assert not (tmp_path / "r").exists()


def test_one_traced_run_calibrates_from_its_stages_compute(profiled, tmp_path):
    _, run_dir, _ = profiled
    out = tmp_path / "calibrated.yaml"
    result = run("calibrate", str(run_dir / "run_report.json"), "--out", str(out), "--json")
    assert result.exit_code == 0, result.stderr
    import yaml

    report = yaml.safe_load(out.read_text())["calibration"]
    assert [s["stage"] for s in report["stage_compute"]] == [0, 1]
    assert len(report["fitted"]) == 3, "a step and two stages' compute: three equations, three parameters"
    # the fit minimises the step's and the stages' squared log errors together: it never ends further from
    # them than the catalogue began (a sum of absolute errors it does not promise)
    equations = report["runs"] + report["stage_compute"]
    assert len(equations) == 3
    assert squared_log_misfit(equations, "error_after") <= squared_log_misfit(equations, "error_before") + 1e-3


def test_compute_equalised_by_a_collective_is_not_fitted(profiled, tmp_path):
    """A trace whose forward and backward windows are mostly spent in a blocking collective measures the
    slowest rank, not this stage's compute: refused for compute, named; the step alone cannot calibrate."""
    _, run_dir, _ = profiled
    copy = tmp_path / "run"
    (copy / "profile").mkdir(parents=True)
    for name in ("plan.json", "run_report.json"):
        (copy / name).write_text((run_dir / name).read_text())
    for trace in (run_dir / "profile").glob("rank*.json"):
        document = json.loads(trace.read_text())
        waits = [dict(e, name="gloo:all_reduce", cat="user_annotation", tid=999999, ts=e["ts"] + 1, dur=e["dur"] - 2)
                 for e in document["traceEvents"] if e.get("name") in ("gplan:forward", "gplan:backward")]
        document["traceEvents"] += waits
        (copy / "profile" / trace.name).write_text(json.dumps(document))
    result = run("calibrate", str(copy / "run_report.json"), "--out", str(tmp_path / "c.yaml"))
    assert result.exit_code == 3 and "equalise it with the slowest rank" in result.stderr
    assert not (tmp_path / "c.yaml").exists()


def test_tensor_parallel_collectives_are_measured_inside_the_layers(tmp_path):
    """tp 2: the layers' all-reduces (the rank waits in them inside its forward and backward) are taken
    out of the compute and shown as layer collectives, by name, beside the predicted tp communication."""
    plan = tiny_plan(tmp_path / "plan.json", TINY_LLAMA, None, tp=2)
    result = run("launch", str(plan), "--run-dir", str(tmp_path / "run"), "--steps", "3", "--warmup-steps", "1",
                 "--device", "cpu", "--profile")
    assert result.exit_code == 0, result.stderr[-3000:]
    result = run("explain", str(plan), "--against", str(tmp_path / "run"), "--json")
    stage = cli_json(result.stdout)["against"]["stages"][0]
    assert stage["predicted_s"]["layer collectives"] > 0 and stage["measured_s"]["layer collectives"] > 0
    assert any(name.startswith("gloo:") for name in stage["collectives_s"])
    assert sum(stage["collectives_s"].values()) == pytest.approx(
        stage["measured_s"]["layer collectives"] + stage["measured_s"]["dp gradient sync"], rel=1e-6)
