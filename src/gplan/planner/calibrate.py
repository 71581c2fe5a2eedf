"""Fit the cost model's efficiency terms to measured runs (`gplan calibrate`).

Parameters θ, few on purpose (each run is one equation):
    c    compute speed: GEMM, attention and element-wise efficiencies are scaled by c (capped at 1)
         and the GEMM size at which efficiency halves by 1/c (small GEMMs are where devices differ most)
    o_l  fixed time per layer per micro-batch forward (kernel launches, framework hooks), seconds
    o_s  fixed time per step outside the model, seconds
    e    link efficiency scale (every link class of every node group, capped at 1)
    l    link latency scale (small messages: pipeline sends, gloo's per-call cost)

Objective: Σ_runs (log T_pred(θ) − log T_meas)² + λ · Σ_params (log θ − log θ₀)², with θ₀ the
catalogue's values — the prior keeps a parameter that the runs cannot tell apart where it was.
Minimised over log θ with Nelder–Mead. Leave-one-out error (fit on all runs but one, predict it)
shows whether the fit generalises; a held-out run is never used for fitting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gplan.cost_models.step import StepModel
from gplan.plan import Plan
from gplan.profiles.schema import ClusterSpec
from gplan.report import RunReport

PRIOR_WEIGHT = 1e-4
"""λ: small enough that a 5% misfit outweighs any move of the parameters, large enough to pin a
parameter the runs do not constrain."""
PARAMS = ("compute_scale", "layer_overhead_s", "step_overhead_s", "link_efficiency_scale", "link_latency_scale")
RESTARTS = 3
FLOOR = 1e-7
"""Smallest overhead the fit may choose (log-space parameters cannot reach zero)."""


@dataclass(frozen=True)
class Run:
    name: str
    plan: Plan
    measured_step_s: float


@dataclass(frozen=True)
class Fit:
    theta: dict[str, float]
    before: list[float]
    """Relative error (pred/meas − 1) per run with the catalogue's values."""
    after: list[float]
    leave_one_out: list[float]


def apply(cluster: ClusterSpec, theta: dict[str, float]) -> ClusterSpec:
    """The cluster with θ applied to every node group."""
    groups = []
    for g in cluster.node_groups:
        eff = g.hardware.efficiency
        c = theta["compute_scale"]
        efficiency = eff.model_copy(update={
            "gemm": min(1.0, eff.gemm * c), "attention": min(1.0, eff.attention * c), "memory": min(1.0, eff.memory * c),
            "gemm_half_gflop": eff.gemm_half_gflop / c,
            "layer_overhead_s": theta["layer_overhead_s"], "step_overhead_s": theta["step_overhead_s"]})
        links = {name: getattr(g, name).model_copy(update={
            "efficiency": min(1.0, getattr(g, name).efficiency * theta["link_efficiency_scale"]),
            "latency_us": getattr(g, name).latency_us * theta["link_latency_scale"]})
            for name in ("intra_node", "inter_node")}
        groups.append(g.model_copy(update={"hardware": g.hardware.model_copy(update={"efficiency": efficiency}), **links}))
    return cluster.model_copy(update={"node_groups": groups})


def prior(cluster: ClusterSpec) -> dict[str, float]:
    eff = cluster.primary.hardware.efficiency
    return {"compute_scale": 1.0, "layer_overhead_s": max(eff.layer_overhead_s, FLOOR),
            "step_overhead_s": max(eff.step_overhead_s, FLOOR), "link_efficiency_scale": 1.0,
            "link_latency_scale": 1.0}


def predict_s(run: Run, theta: dict[str, float]) -> float:
    from gplan.planner.build import layouts_of

    plan = run.plan
    step = StepModel(plan.model, plan.training, apply(plan.cluster, theta), plan.parallel.to_config())
    return step.predict(layouts_of(plan)).step_time_s


def fit(runs: list[Run], start: dict[str, float]) -> dict[str, float]:
    base = np.log([start[p] for p in PARAMS])

    def loss(x: np.ndarray) -> float:
        theta = dict(zip(PARAMS, np.exp(x)))
        misfit = sum((math.log(predict_s(r, theta)) - math.log(r.measured_step_s)) ** 2 for r in runs)
        return misfit + PRIOR_WEIGHT * float(np.sum((x - base) ** 2))

    best = base
    for _ in range(RESTARTS):  # a fresh simplex around the best point escapes a collapsed one
        best = nelder_mead(loss, best)
    return dict(zip(PARAMS, map(float, np.exp(best))))


def calibrate(runs: list[Run]) -> Fit:
    start = prior(runs[0].plan.cluster)
    theta = fit(runs, start)
    before = [predict_s(r, start) / r.measured_step_s - 1 for r in runs]
    after = [predict_s(r, theta) / r.measured_step_s - 1 for r in runs]
    loo = []
    if len(runs) > 2:
        for i, held in enumerate(runs):
            others = runs[:i] + runs[i + 1:]
            loo.append(predict_s(held, fit(others, start)) / held.measured_step_s - 1)
    return Fit(theta, before, after, loo)


def nelder_mead(f, x0: np.ndarray, step: float = 0.5, iterations: int = 400, tolerance: float = 1e-7) -> np.ndarray:
    """Minimise f from x0 (Nelder & Mead 1965, standard coefficients): derivative-free, enough for
    four parameters and a cost model that is not smooth everywhere (max, caps)."""
    n = len(x0)
    simplex = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    values = [f(x) for x in simplex]
    for _ in range(iterations):
        order = np.argsort(values)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if abs(values[-1] - values[0]) < tolerance:
            break
        centroid = np.mean(simplex[:-1], axis=0)
        reflected = centroid + (centroid - simplex[-1])
        fr = f(reflected)
        if fr < values[0]:
            expanded = centroid + 2 * (centroid - simplex[-1])
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = centroid + 0.5 * (simplex[-1] - centroid)
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                simplex = [simplex[0]] + [simplex[0] + 0.5 * (x - simplex[0]) for x in simplex[1:]]
                values = [values[0]] + [f(x) for x in simplex[1:]]
    return simplex[int(np.argmin(values))]


def run_of(report: RunReport, plan: Plan, name: str) -> Run:
    return Run(name, plan, report.step_time_s)


def as_profile(plan: Plan, fit_result: Fit, runs: list[Run], held: list[Run], held_before: list[float],
               held_after: list[float]):
    """The runs' cluster with θ applied, as a profile carrying the calibration report."""
    import socket
    from datetime import datetime, timezone

    from gplan import __version__
    from gplan.profiles.schema import Profile, ProfileProvenance

    cluster = apply(plan.cluster, fit_result.theta)
    provenance = ProfileProvenance(host=socket.gethostname(), devices=cluster.devices,
                                   device_name=cluster.primary.hardware.name, framework="calibration",
                                   framework_version="", gplan_version=__version__,
                                   created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    report = {
        "theta": fit_result.theta,
        "runs": [{"run": r.name, "measured_s": r.measured_step_s, "error_before": b, "error_after": a,
                  "error_leave_one_out": loo}
                 for r, b, a, loo in zip(runs, fit_result.before, fit_result.after,
                                         fit_result.leave_one_out or [None] * len(runs))],
        "held_out": [{"run": r.name, "measured_s": r.measured_step_s, "error_before": b, "error_after": a}
                     for r, b, a in zip(held, held_before, held_after)],
    }
    return Profile(name=f"{cluster.name}-calibrated", node_groups=cluster.node_groups, provenance=provenance,
                   calibration=report)
