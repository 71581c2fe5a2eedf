"""`gplan launch --validate` (backends/torch/validate.py) reads what it built — each parameter's dtype
and local element count, FSDP's gathered copies at its mixed-precision dtype — instead of restating the
cost model's accounting, so a worker that lost its mixed-precision policy fails it."""

from __future__ import annotations

import pytest

from gplan.plan import read_plan
from gplan.spec.training import TrainingSpec
from helpers import TINY_LLAMA, requires_engine, tiny_plan


def bf16_plan(tmp_path, zero: int):
    training = TrainingSpec(gbs=8, seq_length=32, precision="bf16", engine="torch")
    return read_plan(tiny_plan(tmp_path / "plan.json", TINY_LLAMA, None, training, cluster="dgx-a100-80g",
                               dp=4, zero=zero))


@requires_engine("torch", "torch")
@pytest.mark.parametrize("zero", [0, 1, 3])
def test_the_built_weight_bytes_are_what_the_plan_prices(tmp_path, zero):
    from gplan.backends.torch.validate import validation_report

    report = validation_report(bf16_plan(tmp_path, zero))
    weights = [c for c in report.checks if "weight bytes" in c.subject]
    assert weights and all(c.ok for c in weights), [(c.subject, c.built, c.planned) for c in weights]


@requires_engine("torch", "torch")
def test_a_worker_that_lost_its_mixed_precision_policy_fails_validation(tmp_path, monkeypatch):
    """zero 1 keeps every weight gathered from the forward to the backward in bf16: gathered in fp32
    instead (no policy), the rank holds more than the plan priced, and the validator says so."""
    from gplan.backends.torch import validate

    monkeypatch.setattr(validate, "sixteen_bit", lambda plan, device: None)
    report = validate.validation_report(bf16_plan(tmp_path, 1))
    failed = [c for c in report.checks if "weight bytes" in c.subject and not c.ok]
    assert failed and all(c.error > 0.02 for c in failed)


@pytest.mark.parametrize("degrees, backend, capability", [
    (dict(cp=2, dp=2), "mindspore", "(cp)"),
    (dict(dp=4, recompute="selective", recompute_modules=("op",)), "mindspore", "(recompute_modules)"),
])
def test_validation_refuses_what_the_backend_cannot_run_before_building_it(gplan, tmp_path, degrees, backend, capability):
    """`gplan launch --validate` asks the same capabilities a launch does: a plan the backend cannot run exits 3
    naming the capability, not a layout error from the fake process group."""
    plan = tiny_plan(tmp_path / "plan.json", TINY_LLAMA, None, **degrees)
    r = gplan("launch", str(plan), "--backend", backend, "--validate")
    assert r.code == 3 and capability in r.stderr and "hint:" in r.stderr and "Traceback" not in r.stderr
