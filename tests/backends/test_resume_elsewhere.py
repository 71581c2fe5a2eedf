"""Lose a worker, keep training — for real on CPU with gloo: a checkpoint written under one layout loads
under another (weights and AdamW state resharded by DCP), and the losses go on as an uninterrupted run's
(every layout gives one process's losses: tests/backends/test_torch_runs.py), whether resumed by hand
(`gplan replan` + `gplan launch --resume-from`) or by `gplan launch --elastic` after a worker is killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from forked_ranks import launches_forked
from gplan.cli import app
from helpers import TINY_GPT, TINY_LLAMA, cli_json, requires_engine, tiny_plan

pytestmark = [pytest.mark.slow, requires_engine("torch", "torch")]
STEPS = 6
ATOL = 1e-5


def launch(*args: str):
    """`gplan launch`, its ranks forked from a server that imported torch once (tests/forked_ranks.py); the
    `--elastic` test below runs torchrun as a user's launch does."""
    with launches_forked():
        return CliRunner().invoke(app, ["launch", *args, "--device", "cpu", "--json"], catch_exceptions=False)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, one_process):
    """dp 2 × pp 2 with zero 1 (4 processes) stopped after a checkpoint at step 3, and the losses of an
    uninterrupted run: one process's, which every layout reproduces (tests/backends/test_torch_runs.py)."""
    root = tmp_path_factory.mktemp("resume")
    plan = tiny_plan(root / "a.json", TINY_LLAMA, None, dp=2, pp=2, zero=1)
    first = launch(str(plan), "--steps", "3", "--run-dir", str(root / "first"), "--checkpoint-dir", str(root / "ckpt"),
                   "--checkpoint-every", "3")
    assert first.exit_code == 0, first.stderr[-2000:]
    assert cli_json(first.stdout)["losses"] == pytest.approx(one_process(TINY_LLAMA, 3), abs=ATOL)
    return root, plan, one_process(TINY_LLAMA, STEPS)


@pytest.mark.parametrize("layout, moved", [(dict(tp=2, sp=True), {"dp", "tp", "pp", "zero", "split"}),
                                           (dict(pp=2, vpp=2), {"dp", "vpp", "zero"}),
                                           (dict(dp=2, zero=3), {"pp", "zero", "split"})])
def test_a_checkpoint_resumes_under_another_layout(uninterrupted, tmp_path, layout, moved):
    root, _, losses = uninterrupted
    new = tiny_plan(tmp_path / "b.json", TINY_LLAMA, None, **layout)
    result = launch(str(new), "--steps", str(STEPS), "--run-dir", str(tmp_path / "run"), "--resume-from",
                    str(root / "first"))
    assert result.exit_code == 0, result.stderr[-3000:]
    report = cli_json(result.stdout)
    assert report["first_step"] == 3 and report["resumed"]["step"] == 3
    assert "resharded over" in result.stderr and set(report["resumed"]["resharded"]) == moved
    assert report["losses"] == pytest.approx(losses[3:], abs=ATOL)


def test_replan_by_hand_then_resume_from(uninterrupted, tmp_path):
    root, plan, losses = uninterrupted
    r = CliRunner().invoke(app, ["replan", str(plan), "--devices", "2", "-o", str(tmp_path / "new.json"), "--json"])
    assert r.exit_code == 0, r.stderr
    replanned = cli_json(r.stdout)
    assert replanned["devices"] == 2 and replanned["resharded"]
    result = launch(str(tmp_path / "new.json"), "--steps", str(STEPS), "--run-dir", str(tmp_path / "run"),
                    "--resume-from", str(root / "first"))
    assert result.exit_code == 0, result.stderr[-3000:]
    assert cli_json(result.stdout)["losses"] == pytest.approx(losses[3:], abs=ATOL)


def test_elastic_replans_for_the_processes_left_and_goes_on(uninterrupted, tmp_path):
    """4 processes train and checkpoint; one is killed; --elastic re-plans for the devices left, resumes
    from the last complete checkpoint, and the losses continue the uninterrupted run's."""
    root, plan, _ = uninterrupted
    steps = 16
    whole = launch(str(plan), "--steps", str(steps), "--run-dir", str(tmp_path / "whole"))
    expected = cli_json(whole.stdout)["losses"]
    run, ckpt = tmp_path / "run", tmp_path / "ckpt"
    job = subprocess.Popen([sys.executable, "-m", "gplan.cli", "launch", str(plan), "--run-dir", str(run),
                            "--steps", str(steps), "--device", "cpu", "--checkpoint-dir", str(ckpt),
                            "--checkpoint-every", "2", "--elastic", "--json"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    victim = run / "logs" / "rank1.log"
    deadline = time.monotonic() + 120
    while not (victim.exists() and "step 3/" in victim.read_text()):
        assert job.poll() is None and time.monotonic() < deadline, "the job did not reach step 3"
        time.sleep(0.05)
    os.kill(int((run / "logs" / "rank1.pid").read_text()), signal.SIGKILL)
    stdout, stderr = job.communicate(timeout=180)
    assert job.returncode == 0, stderr[-3000:]
    report = cli_json(stdout)
    [survived] = report["elastic"]
    assert survived["failed_rank"] == 1 and survived["devices_lost"] == 1
    assert report["world_size"] < 4 and report["parallel"].split(" rc=")[0] == survived["plan_after"].split(" rc=")[0]
    assert (run / "elastic-1.plan.json").is_file() and (run / "plan.json").is_file()
    start = report["first_step"]
    assert start == survived["resumed_from_step"] and start % 2 == 0
    assert report["losses"] == pytest.approx(expected[start:], abs=ATOL)
    assert "re-planned for 3 devices" in stderr


def test_a_run_without_a_complete_checkpoint_is_refused_before_anything_starts(uninterrupted, tmp_path):
    root, plan, _ = uninterrupted
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "step_00000004").mkdir()  # half-written: no metadata
    result = launch(str(plan), "--run-dir", str(tmp_path / "run"), "--resume-from", str(empty))
    assert result.exit_code == 3 and "no complete checkpoint" in result.stderr
    assert not (tmp_path / "run").exists(), "nothing started, nothing written"


def test_a_checkpoint_of_another_model_is_refused_naming_what_differs(uninterrupted, tmp_path):
    root, _, _ = uninterrupted
    other = tiny_plan(tmp_path / "gpt.json", TINY_GPT, None, dp=2)
    result = launch(str(other), "--run-dir", str(tmp_path / "run"), "--resume-from", str(root / "first"))
    assert result.exit_code == 3 and "holds another model" in result.stderr and "→" in result.stderr
    assert not (tmp_path / "run").exists()


def test_elastic_needs_checkpoints(uninterrupted, tmp_path):
    _, plan, _ = uninterrupted
    result = launch(str(plan), "--run-dir", str(tmp_path / "run"), "--elastic")
    assert result.exit_code == 2 and "--checkpoint-dir" in result.stderr


def test_a_plan_whose_digest_does_not_match_is_refused_before_resuming(uninterrupted, tmp_path):
    root, plan, _ = uninterrupted
    data = json.loads(plan.read_text())
    data["training"]["gbs"] = data["training"]["gbs"] * 2  # edited by hand, digest not refreshed
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(data))
    result = launch(str(edited), "--run-dir", str(tmp_path / "run"), "--resume-from", str(root / "first"))
    assert result.exit_code == 3 and "digest" in result.stderr and not (tmp_path / "run").exists()
