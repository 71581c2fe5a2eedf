"""A profiled run beside its prediction: `gplan explain PLAN --against RUN_DIR`.

`gplan launch --profile` leaves each rank's torch.profiler trace in RUN_DIR/profile/rank{R}.json, its
phases marked by the worker (`backends.torch.profiling`: gplan:step, gplan:forward, gplan:backward,
gplan:grad_sync, gplan:optimizer) and its collectives by the process group (`gloo:all_reduce`,
`nccl:all_gather`, ...). Per step, on each stage's first rank, the trace is cut into the terms the cost
model prices:

    forward, backward    the marked windows, less the collectives that ran inside them
    layer collectives    collectives inside a forward or backward (tp, cp, ep; FSDP's gathers)
    dp gradient sync     collectives inside gplan:grad_sync
    optimizer            gplan:optimizer
    pp waits + bubble    the rest of the step: waiting for a neighbour stage's activation or gradient
                         (its transfer and the pipeline bubble: a rank's receive is posted early and
                         waited for later, so the trace cannot tell the transfer from the wait), host work

and the same terms are read off the plan's prediction (`planner.trace.stage_tails` for the tail).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from gplan.errors import InputError
from gplan.plan import Plan, read_plan
from gplan.planner.build import repredict
from gplan.planner.trace import stage_tails

TERMS = ("forward", "backward", "layer collectives", "dp gradient sync", "optimizer", "pp waits + bubble")
IDLE = "pp waits + bubble"
COLLECTIVE_PREFIXES = ("gloo:", "nccl:", "hccl:")
POINT_TO_POINT = ("send", "recv", "isend", "irecv", "batch_isend_irecv", "recv_anysource")
"""Asynchronous: posted early, so their slices on the process group's thread span waits, not transfers."""


@dataclass(frozen=True)
class StageAgainst:
    stage: int
    rank: int
    predicted_s: dict[str, float]
    measured_s: dict[str, float]
    predicted_step_s: float
    measured_step_s: float
    collectives_s: dict[str, float]
    """Measured per step, each collective of the layers and the gradient sync by its name (`gloo:all_reduce`)."""


@dataclass(frozen=True)
class Against:
    run_dir: Path
    plan_note: str
    """Which plan was priced: the one given, or the scaled copy the run wrote."""
    steps_traced: int
    stages: list[StageAgainst]

    def worst(self) -> tuple[int, str, float]:
        """(stage, term, seconds off per step) of the largest absolute difference."""
        rows = [(s.stage, t, s.measured_s[t] - s.predicted_s[t]) for s in self.stages for t in TERMS]
        return max(rows, key=lambda r: abs(r[2]))

    def as_json(self) -> dict:
        return {"run_dir": str(self.run_dir), "plan": self.plan_note, "steps_traced": self.steps_traced,
                "stages": [{"stage": s.stage, "rank": s.rank, "predicted_step_s": s.predicted_step_s,
                            "measured_step_s": s.measured_step_s, "predicted_s": s.predicted_s,
                            "measured_s": s.measured_s, "collectives_s": s.collectives_s} for s in self.stages]}


def against_plan(plan: Plan, run_dir: Path) -> Against:
    """The run's measured terms per stage beside the plan's predicted ones; refuses a run directory
    without traces, or of another plan."""
    ran, note = plan_that_ran(plan, run_dir)
    prediction = repredict(ran)
    tails = stage_tails(ran, prediction)
    m = prediction.num_microbatches
    stages, traced = [], None
    for stage, tail in zip(ran.stages, tails):
        events = read_rank_trace(run_dir / "profile" / f"rank{stage.first_rank}.json")
        measured, steps = measured_terms(events, run_dir / "profile" / f"rank{stage.first_rank}.json")
        by_name = collective_breakdown(events, steps)
        traced = steps if traced is None else min(traced, steps)
        s = prediction.stages[stage.index]
        predicted = {"forward": m * s.forward_s, "backward": m * s.backward_s,
                     "layer collectives": m * (s.tp_comm_s + s.cp_comm_s + s.ep_comm_s),
                     "dp gradient sync": tail.dp_s, "optimizer": tail.optimizer_s}
        # the rest of the predicted step on this stage: its sends, the bubble, the wait for slower stages' tails
        predicted[IDLE] = max(0.0, prediction.step_time_s - sum(predicted.values()) - tail.overhead_s)
        stages.append(StageAgainst(stage.index, stage.first_rank, predicted, measured, prediction.step_time_s,
                                   measured["step"], by_name))
    return Against(run_dir, note, traced or 0, stages)


BARRIER_SHARE = 0.5
"""A stage whose forward and backward windows spend more than this share waiting in collectives: its
compute is a small difference of two large numbers, and the windows' length is set by the slowest rank
the collective waited for (a barrier equalises them) — not a measurement of this stage's compute."""


@dataclass(frozen=True)
class StageCompute:
    """One stage's measured forward + backward compute per step (collectives taken out), or why not."""

    stage: int
    compute_s: float | None
    why_not: str = ""


def stage_compute(plan: Plan, run_dir: Path) -> list[StageCompute]:
    """Each stage's compute per step from its first rank's trace (`measured_terms`); a stage whose windows
    are mostly collective waits is refused for compute (BARRIER_SHARE), saying so."""
    out = []
    for stage in plan.stages:
        path = run_dir / "profile" / f"rank{stage.first_rank}.json"
        terms, _ = measured_terms(read_rank_trace(path), path)
        compute = terms["forward"] + terms["backward"]
        waited = terms["layer collectives"]
        if compute <= 0 or waited > BARRIER_SHARE * (compute + waited):
            out.append(StageCompute(stage.index, None,
                                    f"stage {stage.index}: {waited / (compute + waited):.0%} of its forward and "
                                    "backward waited in collectives, which equalise it with the slowest rank"))
        else:
            out.append(StageCompute(stage.index, compute))
    return out


def plan_that_ran(plan: Plan, run_dir: Path) -> tuple[Plan, str]:
    """The plan the run executed: PLAN itself, or the scaled-down copy `gplan launch` wrote into the run
    directory (its digest in the run report). A run of another model is refused."""
    if not run_dir.is_dir():
        raise InputError(f"--against {run_dir}: no such run directory", hint="gplan launch PLAN --profile --run-dir DIR")
    ran_path = run_dir / "plan.json"
    if not ran_path.is_file():
        raise InputError(f"--against {run_dir}: no plan.json (not a gplan launch run directory)",
                         hint="gplan launch PLAN --profile --run-dir DIR writes one")
    ran = read_plan(ran_path)
    if ran.digest == plan.digest:
        return plan, "the plan given"
    if ran.model.name != plan.model.name:
        raise InputError(f"--against {run_dir}: that run trained {ran.model.name}, this plan is {plan.model.name}",
                         hint="pass the run directory of a launch of this plan")
    return ran, f"the run's own plan ({ran_path}: {plan.model.name} as launched, scaled or changed)"


def read_rank_trace(path: Path) -> list[dict]:
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: no profiler trace for this rank",
                         hint="launch with --profile (and more --steps than --warmup-steps)") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not a JSON trace ({exc.msg}, line {exc.lineno})",
                         hint="a torch.profiler trace written by gplan launch --profile") from None
    events = document.get("traceEvents") if isinstance(document, dict) else document
    if not isinstance(events, list):
        raise InputError(f"{path}: no traceEvents", hint="a torch.profiler (Chrome trace format) file")
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and "dur" in e]


def measured_terms(events: list[dict], where: Path) -> tuple[dict[str, float], int]:
    """Seconds per step of each term (TERMS, plus `step`), averaged over the traced steps."""
    steps = [e for e in events if e["name"] == "gplan:step"]
    if not steps:
        raise InputError(f"{where}: no gplan:step in the trace (not traced by gplan launch --profile)",
                         hint="gplan launch PLAN --profile --steps 5")
    windows = {name: _intervals(events, f"gplan:{name}") for name in ("forward", "backward", "grad_sync", "optimizer")}
    totals = dict.fromkeys(TERMS, 0.0)
    collective_in = {"forward": 0.0, "backward": 0.0}
    for e in events:
        if not e["name"].startswith(COLLECTIVE_PREFIXES) or e["name"].split(":", 1)[1] in POINT_TO_POINT:
            continue
        start, end = e["ts"], e["ts"] + e["dur"]
        if _overlap(start, end, windows["grad_sync"]):
            totals["dp gradient sync"] += _overlap(start, end, windows["grad_sync"])
        for phase in collective_in:  # a blocking collective: the rank waits in its window while it runs
            collective_in[phase] += _overlap(start, end, windows[phase])
    totals["layer collectives"] = collective_in["forward"] + collective_in["backward"]
    totals["forward"] = sum(b - a for a, b in windows["forward"]) - collective_in["forward"]
    totals["backward"] = sum(b - a for a, b in windows["backward"]) - collective_in["backward"]
    totals["optimizer"] = sum(b - a for a, b in windows["optimizer"])
    step_us = sum(e["dur"] for e in steps)
    busy = sum(totals[t] for t in TERMS if t != IDLE)
    totals[IDLE] = max(0.0, step_us - busy)
    per_step = {k: v / len(steps) / 1e6 for k, v in totals.items()}
    per_step["step"] = step_us / len(steps) / 1e6
    return per_step, len(steps)


def collective_breakdown(events: list[dict], steps: int) -> dict[str, float]:
    """Seconds per step of each blocking collective the rank waited on inside its marked phases (the
    layers' and the gradient sync's), by the process group's name for it."""
    phases = [w for name in ("forward", "backward", "grad_sync") for w in _intervals(events, f"gplan:{name}")]
    out: dict[str, float] = {}
    for e in events:
        if not e["name"].startswith(COLLECTIVE_PREFIXES) or e["name"].split(":", 1)[1] in POINT_TO_POINT:
            continue
        waited = _overlap(e["ts"], e["ts"] + e["dur"], phases)
        if waited > 0:
            out[e["name"]] = out.get(e["name"], 0.0) + waited / max(steps, 1) / 1e6
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _intervals(events: list[dict], name: str) -> list[tuple[float, float]]:
    return sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["name"] == name)


def _overlap(start: float, end: float, intervals: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(end, b) - max(start, a)) for a, b in intervals)
