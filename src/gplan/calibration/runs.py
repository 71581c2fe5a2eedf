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
Minimised over log θ by the one fitter (calibration.fit). Leave-one-out error (fit on all runs but
one, predict it) shows whether the fit generalises; a held-out run is never used for fitting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from gplan.calibration.apply import ENGINE_FACTOR, apply
from gplan.calibration.fit import fit_log
from gplan.cost_models.step import StepModel
from gplan.errors import InputError
from gplan.plan import Plan, layouts_of, read_plan
from gplan.profiles.schema import ClusterSpec, Profile
from gplan.report import read_report

PRIOR_WEIGHT = 1e-4
"""λ: small enough that a 5% misfit outweighs any move of the parameters, large enough to pin a
parameter the runs do not constrain."""
FLOOR = 1e-7
"""Smallest overhead the fit may choose (log-space parameters cannot reach zero)."""


@dataclass(frozen=True)
class Run:
    name: str
    plan: Plan
    measured_step_s: float
    stage_compute_s: tuple[float | None, ...] = ()
    """Per stage, its forward + backward compute per step from the run's profiler trace (`gplan launch
    --profile`; calibration.measured.stage_compute): an equation each for the compute terms, where the
    step time is one for everything. None where the trace cannot tell (a collective's barrier)."""
    trace_notes: tuple[str, ...] = ()

    @property
    def equations(self) -> int:
        return 1 + sum(s is not None for s in self.stage_compute_s)


@dataclass(frozen=True)
class Fit:
    theta: dict[str, float]
    before: list[float]
    """Relative error (pred/meas − 1) per run with the catalogue's values."""
    after: list[float]
    leave_one_out: list[float]
    fitted: tuple[str, ...] = ()
    """The parameters fitted; the others of PRIORITY kept their catalogue value (fewer runs than
    parameters cannot tell more apart)."""


PRIORITY = ("compute_scale", "layer_overhead_s", "step_overhead_s", "link_efficiency_scale", "link_latency_scale")
"""Which parameters to fit first when there are fewer runs than parameters: compute moves every
run's time, the overheads the small ones, the links only runs that communicate."""


def fitted_names(runs: int, engines: tuple[str, ...] = ()) -> tuple[str, ...]:
    """One parameter per run at most: each run is one equation. With runs of several engines, each engine
    but the reference one (`engine_factors`) gets its factor right after the compute speed."""
    order = PRIORITY[:1] + engines + PRIORITY[1:]
    return order[:max(1, min(len(order), runs))]


def engine_factors(runs: list[Run]) -> tuple[str, ...]:
    """The engine-factor parameters the runs can fit: every engine but the one most runs used (whose speed
    the compute scale fits), named `engine_factor:<engine>`."""
    counts: dict[str, int] = {}
    for r in runs:
        counts[str(r.plan.training.engine)] = counts.get(str(r.plan.training.engine), 0) + 1
    reference = max(sorted(counts), key=counts.get)
    return tuple(f"{ENGINE_FACTOR}{e}" for e in sorted(counts) if e != reference)


def prior(cluster: ClusterSpec) -> dict[str, float]:
    eff = cluster.primary.hardware.efficiency
    return {"compute_scale": 1.0, "layer_overhead_s": max(eff.layer_overhead_s, FLOOR),
            "step_overhead_s": max(eff.step_overhead_s, FLOOR), "link_efficiency_scale": 1.0,
            "link_latency_scale": 1.0}


def predict_s(run: Run, theta: dict[str, float]) -> float:
    return predicted(run, theta).step_time_s


def predicted(run: Run, theta: dict[str, float]):
    plan = run.plan
    step = StepModel(plan.model, plan.training, apply(plan.cluster, theta), plan.parallel.to_config())
    return step.predict(layouts_of(plan))


def run_misfit(run: Run, theta: dict[str, float]) -> float:
    """Σ (log predicted − log measured)² over the run's equations: its step, and each stage's compute
    where its trace measured it."""
    p = predicted(run, theta)
    total = (math.log(p.step_time_s) - math.log(run.measured_step_s)) ** 2
    m = p.num_microbatches
    for stage, measured in zip(p.stages, run.stage_compute_s):
        if measured is not None:
            total += (math.log(m * (stage.forward_s + stage.backward_s)) - math.log(measured)) ** 2
    return total


def relative_error(run: Run, theta: dict[str, float]) -> float:
    """Predicted over measured step time, minus one."""
    return predict_s(run, theta) / run.measured_step_s - 1


def fit(runs: list[Run], start: dict[str, float], names: tuple[str, ...] | None = None) -> dict[str, float]:
    """Fit `names` (default: as many as the runs allow, by PRIORITY); the rest stay at `start`."""
    names = names or fitted_names(len(runs))
    kept = {k: v for k, v in start.items() if k not in names}

    def misfit(theta: dict[str, float]) -> float:
        full = {**kept, **theta}
        return sum(run_misfit(r, full) for r in runs)

    return {**kept, **fit_log(misfit, {k: start[k] for k in names}, PRIOR_WEIGHT)}


def calibrate(runs: list[Run]) -> Fit:
    engines = engine_factors(runs)
    hardware = runs[0].plan.cluster.primary.hardware
    start = prior(runs[0].plan.cluster) | {k: hardware.engine_efficiency.get(k[len(ENGINE_FACTOR):], 1.0)
                                            for k in engines}
    names = fitted_names(sum(r.equations for r in runs), engines)
    theta = fit(runs, start, names)
    before = [relative_error(r, start) for r in runs]
    after = [relative_error(r, theta) for r in runs]
    loo = []
    if len(runs) > 2:
        for i, held in enumerate(runs):
            others = runs[:i] + runs[i + 1:]
            loo.append(relative_error(held, fit(others, start, fitted_names(sum(r.equations for r in others),
                                                                            engines))))
    return Fit(theta, before, after, loo, names)


def read_run(path: Path) -> Run:
    """A run from its run_report.json and the plan.json beside it (the plan the run ran)."""
    report = read_report(path)
    plan_path = path.with_name("plan.json")
    plan = read_plan(plan_path)
    if plan.digest != report.plan_digest:
        raise InputError(f"{plan_path} is not the plan {path} ran (digest {plan.digest} ≠ {report.plan_digest})",
                         hint="keep run_report.json beside the plan.json of its run directory")
    if not (path.parent / "profile").is_dir():
        return Run(str(path), plan, report.step_time_s)
    from gplan.calibration.measured import stage_compute

    stages = stage_compute(plan, path.parent)
    return Run(str(path), plan, report.step_time_s, tuple(s.compute_s for s in stages),
               tuple(s.why_not for s in stages if s.why_not))


@dataclass(frozen=True)
class Calibration:
    """`gplan calibrate`'s whole result: the fit, the held-out runs' errors and the profile to write."""

    runs: list[Run]
    fit: Fit
    held: list[Run]
    held_before: list[float]
    held_after: list[float]
    profile: Profile
    stages: list[tuple[str, int, float, float, float]] = ()
    """Traced runs' stage compute: (run, stage, measured s, error before, error after)."""


def stage_errors(runs: list[Run], start: dict[str, float], theta: dict[str, float]) -> list[tuple]:
    """Each traced stage's compute, predicted / measured − 1 with the catalogue's values and the fitted ones."""
    rows = []
    for r in runs:
        if not any(s is not None for s in r.stage_compute_s):
            continue
        before, after = predicted(r, start), predicted(r, theta)
        m = before.num_microbatches
        for i, measured in enumerate(r.stage_compute_s):
            if measured is not None:
                b, a = before.stages[i], after.stages[i]
                rows.append((r.name, i, measured, m * (b.forward_s + b.backward_s) / measured - 1,
                             m * (a.forward_s + a.backward_s) / measured - 1))
    return rows


def calibrate_runs(runs: list[Run], held: list[Run]) -> Calibration:
    """Fit on `runs`, predict `held` before and after; the profile keeps the widest run's node shape
    (devices per node), so that sizing it again for any of the runs gives the links that run had."""
    if not runs:
        raise InputError("calibration needs a run report or an engine's log", hint="gplan calibrate RUN_DIR/run_report.json")
    refused = [note for r in runs for note in r.trace_notes]
    if refused and sum(r.equations for r in runs) < 2:
        # a traced run whose stages cannot be fitted: its step alone would fit the compute speed from waits
        raise InputError("calibration cannot fit compute from this trace (" + "; ".join(refused) + ")",
                         hint="launch a plan whose stages wait less in collectives, or pass more runs")
    for run in runs + held:
        check_possible(run)
    names = {r.plan.cluster.primary.hardware.name for r in runs + held}
    if len(names) > 1:
        raise InputError(f"the runs used different hardware ({', '.join(sorted(names))})",
                         hint="calibrate one hardware at a time")
    result = calibrate(runs)
    start = prior(runs[0].plan.cluster)
    before = [relative_error(r, start) for r in held]
    after = [relative_error(r, result.theta) for r in held]
    widest = max(runs + held, key=lambda r: r.plan.cluster.primary.devices_per_node).plan
    stages = stage_errors(runs, start, result.theta)
    profile = as_profile(widest, result, runs, held, before, after)
    profile.calibration["stage_compute"] = [
        {"run": run, "stage": i, "measured_s": s, "error_before": b, "error_after": a} for run, i, s, b, a in stages]
    profile.calibration["refused_stages"] = [note for r in runs for note in r.trace_notes]
    return Calibration(runs, result, held, before, after, profile, stages)


def check_possible(run: Run) -> None:
    """A measured step shorter than the model's FLOPs allow at the device's peak cannot be of the
    configuration the run says it ran (a log beside a YAML it did not run, a step line of another job):
    refused rather than fitted, which would teach the profile a speed above the hardware's."""
    p, device = run.plan.prediction, run.plan.cluster.primary.hardware
    implied_tflops = p.model_tflops_per_device * p.step_time_s / run.measured_step_s
    peak = device.peak_flops(run.plan.training.precision) / 1e12 if device.supports(run.plan.training.precision) else 0
    if peak and implied_tflops > peak:
        raise InputError(f"{run.name}: a step of {run.measured_step_s:.3f} s would be {implied_tflops:,.0f} model "
                         f"TFLOP/s per device for this configuration, above {device.name}'s peak of {peak:,.0f}: the "
                         "configuration read is not what ran", hint="check the launch or YAML beside the log (its "
                         "batch, sequence length and degrees) against the job that wrote the log")


def as_profile(plan: Plan, fit_result: Fit, runs: list[Run], held: list[Run], held_before: list[float],
               held_after: list[float]):
    """The runs' cluster with θ applied, as a profile carrying the calibration report."""
    import socket
    from datetime import datetime, timezone

    from gplan import __version__
    from gplan.profiles.schema import ProfileProvenance

    cluster = apply(plan.cluster, fit_result.theta)
    provenance = ProfileProvenance(host=socket.gethostname(), devices=cluster.devices,
                                   device_name=cluster.primary.hardware.name, framework="calibration",
                                   framework_version="", gplan_version=__version__,
                                   created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    report = {
        "theta": fit_result.theta,
        "fitted": list(fit_result.fitted),
        "kept_at_catalogue": [k for k in fit_result.theta if k not in fit_result.fitted],
        "engines": sorted({str(r.plan.training.engine) for r in runs}),
        "runs": [{"run": r.name, "engine": r.plan.training.engine, "measured_s": r.measured_step_s,
                  "error_before": b, "error_after": a, "error_leave_one_out": loo}
                 for r, b, a, loo in zip(runs, fit_result.before, fit_result.after,
                                         fit_result.leave_one_out or [None] * len(runs))],
        # a held-out run of an engine no fitted run used predicts across engines: reported as such
        "held_out": [{"run": r.name, "engine": r.plan.training.engine, "measured_s": r.measured_step_s,
                      "error_before": b, "error_after": a,
                      "other_engine": r.plan.training.engine not in {f.plan.training.engine for f in runs}}
                     for r, b, a in zip(held, held_before, held_after)],
    }
    return Profile(name=f"{cluster.name}-calibrated", node_groups=cluster.node_groups, provenance=provenance,
                   calibration=report)


def read_log_run(path: Path, cluster: str | None, hardware: str | None, devices_per_node: int | None) -> Run:
    """A run from an engine's log (its folder's logs.py): the configuration it says it ran, read as `--from`
    reads it (its `launch.read_log`, strict: a log with no steady step is refused), priced as that engine runs
    it on the cluster given (a log does not name its hardware), and its steady step."""
    from gplan.planner.launch_files import read_log_launch

    if not path.is_file():
        raise InputError(f"{path}: no such file", hint="pass run_report.json files or Megatron-LM logs")
    if not (cluster or hardware):
        raise InputError(f"{path}: an engine's log does not name its hardware",
                         hint="pass --cluster (or --hardware and --devices-per-node)")
    launch = read_log_launch(path, None, path.read_text(errors="replace"), strict=True)
    plan = plan_of_launch(launch, launch.model, cluster, hardware, devices_per_node)
    if launch.measured_step_s is not None:
        return Run(str(path), plan, launch.measured_step_s)
    t = plan.training  # tokens/s per device (torchtitan's logs): a step is gbs·seq over tps × devices
    return Run(str(path), plan, t.gbs * t.seq_length / (launch.measured_device_tokens_per_s * launch.world_size))


def plan_of_launch(launch, model, cluster: str | None, hardware: str | None, devices_per_node: int | None) -> Plan:
    """The plan of a launch read from a log, on its own world size, priced as its engine runs it (with the
    engine switches it sets: bf16 gradients, FP8 parameters, the MoE overlap, CUDA graphs)."""
    from gplan.planner.build import make_plan
    from gplan.planner.inputs import resolve_cluster
    from gplan.planner.launch import launch_batch, launch_config, launch_layouts
    from gplan.spec.parallel import check_config
    from gplan.spec.training import TrainingSpec

    world = launch.world_size
    spec, devices, _ = resolve_cluster(world, cluster, hardware, devices_per_node)
    config = launch_config(launch, model, world)
    training = TrainingSpec(gbs=launch_batch(launch, config), seq_length=launch.seq_length or model.seq_length,
                            precision=launch.precision, engine=launch.engine, **launch.engine_options)
    check_config(model, training, config, world)
    sized = spec.sized(devices)
    return make_plan(model, training, sized, config, launch_layouts(launch, model, config, sized))


def read_any_run(path: Path, cluster: str | None, hardware: str | None, devices_per_node: int | None) -> Run:
    """A run report (JSON, its plan beside it), or an engine's training log (its engine folder's logs.py)."""
    if path.suffix == ".json":
        return read_run(path)
    return read_log_run(path, cluster, hardware, devices_per_node)
