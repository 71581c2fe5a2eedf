"""Calibration on synthetic runs: measurements made by the cost model itself under known efficiencies
must be matched after the fit, and a held-out configuration predicted."""

from __future__ import annotations

import numpy as np
import pytest

from gplan.planner.build import make_plan
from gplan.calibration.apply import apply
from gplan.calibration.runs import Run, calibrate, predict_s, prior
from gplan.numeric import nelder_mead
from gplan.profiles.catalogue import load_cluster
from gplan.profiles.catalogue import load_model
from gplan.spec.parallel import ParallelConfig
from gplan.spec.training import TrainingSpec

TRUE = {"compute_scale": 1.8, "layer_overhead_s": 4e-4, "step_overhead_s": 0.02, "link_efficiency_scale": 0.6,
        "link_latency_scale": 3.0}


def synthetic_run(config: ParallelConfig) -> Run:
    model = load_model("tiny-llama")
    training = TrainingSpec(gbs=16, seq_length=64, precision="fp32")
    plan = make_plan(model, training, load_cluster("local-cpu", config.world_size).sized(config.world_size), config)
    truth = Run("truth", plan, 1.0)
    return Run(config.label(), plan, predict_s(truth, TRUE))


def test_nelder_mead_finds_a_quadratic_minimum():
    best = nelder_mead(lambda x: float(np.sum((x - np.array([1.0, -2.0, 0.5])) ** 2)), np.zeros(3))
    assert best == pytest.approx([1.0, -2.0, 0.5], abs=1e-3)


def test_fit_matches_runs_made_with_known_efficiencies_and_predicts_a_held_out_one():
    runs = [synthetic_run(c) for c in (ParallelConfig(), ParallelConfig(dp=2), ParallelConfig(pp=2),
                                       ParallelConfig(dp=4, zero=1), ParallelConfig(tp=2))]
    fit = calibrate(runs)
    assert max(abs(e) for e in fit.before) > 0.3
    assert max(abs(e) for e in fit.after) < 0.05
    held = synthetic_run(ParallelConfig(dp=2, pp=2, mbs=2))
    assert abs(predict_s(held, fit.theta) / held.measured_step_s - 1) < 0.05


def test_apply_changes_only_what_it_fits():
    cluster = load_cluster("local-cpu", 2)
    theta = prior(cluster)
    same = apply(cluster, theta)
    assert same.primary.hardware.efficiency == cluster.primary.hardware.efficiency
    assert same.primary.intra_node == cluster.primary.intra_node


def test_two_runs_fit_two_parameters_and_keep_the_rest_at_the_catalogue():
    """Each run is one equation: two runs cannot tell five parameters apart, so the fit takes the first
    two by priority and says which it kept."""
    runs = [synthetic_run(ParallelConfig()), synthetic_run(ParallelConfig(dp=2))]
    fit = calibrate(runs)
    assert fit.fitted == ("compute_scale", "layer_overhead_s")
    start = prior(runs[0].plan.cluster)
    assert all(fit.theta[k] == start[k] for k in ("step_overhead_s", "link_efficiency_scale", "link_latency_scale"))
    assert max(abs(e) for e in fit.after) < max(abs(e) for e in fit.before)
