"""run_report.json: what a launched job measured, built by `build_report` for both backends' workers
(rank 0 writes it after gathering every rank) and read by `gplan launch` (measured versus predicted)
and `gplan calibrate`."""

from __future__ import annotations

import json
import socket
import statistics
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from gplan.errors import InputError
from gplan.io import atomic_write_text
from gplan.plan import Plan

REPORT_SCHEMA_VERSION = 1


class RankReport(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int
    stage: int
    step_times_s: list[float]
    peak_memory_bytes: float
    memory_kind: str
    """`cuda_max_allocated` (the allocator's peak) or `rss` (the process's peak resident set, on CPU)."""


class RunReport(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = REPORT_SCHEMA_VERSION
    backend: str
    framework_version: str
    device: str
    compute_dtype: str
    gemm_recipe: str | None = None
    """The low-precision GEMM recipe the layers ran (torchao float8 tensorwise/rowwise, MXFP8), if any."""
    plan_digest: str
    parallel: str
    world_size: int
    first_step: int
    """0, or the step a resumed run continued from."""
    steps: int
    warmup_steps: int
    gbs: int
    seq_length: int
    losses: list[float]
    """Mean training loss of every step run, first_step onwards."""
    step_times_s: list[float]
    """Wall time of every step (the slowest rank's)."""
    step_time_s: float
    """Median step time after the warm-up steps."""
    tokens_per_s: float
    mfu: float
    """Model FLOPs (SC21 convention) / step time / peak of the plan's devices, every stage's node group
    counted at its own peak — the convention of the plan's predicted MFU."""
    ranks: list[RankReport]
    predicted_step_time_s: float
    predicted_memory_bytes_per_stage: list[float]
    host: str
    created_at: str
    resumed: dict | None = None
    """`gplan launch --resume-from`: the checkpoint (of another layout) the run continued from, its step, and
    what it was resharded over."""
    elastic: list[dict] | None = None
    """`gplan launch --elastic`: each failure the run survived — the plan before and after, the ranks lost,
    the step resumed from, and the seconds from the failure to the new job's start."""

    def stage_peak_bytes(self) -> list[float]:
        stages = max(r.stage for r in self.ranks) + 1
        return [max(r.peak_memory_bytes for r in self.ranks if r.stage == s) for s in range(stages)]


def stage_of_rank(plan: Plan, rank: int) -> int:
    """The pipeline stage whose ranks include `rank`."""
    return next(s.index for s in plan.stages if rank in s.ranks)


def measured_mfu(plan: Plan, step_time_s: float) -> float:
    """MFU of a measured step from the plan alone: the plan's MFU is F/(T_pred·P), so F/P is
    `mfu · T_pred` and the measured MFU is `mfu · T_pred / T_meas` — the same FLOPs and peak (per-stage
    node groups included) the cost model counted, without a backend importing it."""
    return plan.prediction.mfu * plan.prediction.step_time_s / step_time_s


def build_report(plan: Plan, *, backend: str, framework_version: str, device: str, compute_dtype: str,
                 first_step: int, steps: int, warmup_steps: int, losses: list[float],
                 ranks: list[RankReport], gemm_recipe: str | None = None, resumed: dict | None = None) -> RunReport:
    """The run report every worker writes (rank 0, after gathering every rank's RankReport): the step
    time is the slowest rank's, its median taken after the warm-up steps."""
    per_step = [max(r.step_times_s[i] for r in ranks) for i in range(min(len(r.step_times_s) for r in ranks))]
    measured = per_step[warmup_steps:] if len(per_step) > warmup_steps else per_step
    step_s = statistics.median(measured) if measured else float("nan")
    return RunReport(
        backend=backend, framework_version=framework_version, device=device, compute_dtype=compute_dtype,
        gemm_recipe=gemm_recipe,
        plan_digest=plan.digest, parallel=plan.parallel.label(), world_size=plan.world_size, first_step=first_step,
        steps=steps, warmup_steps=warmup_steps, gbs=plan.training.gbs, seq_length=plan.training.seq_length,
        losses=losses, step_times_s=per_step, step_time_s=step_s,
        tokens_per_s=plan.training.tokens_per_step / step_s, mfu=measured_mfu(plan, step_s),
        ranks=sorted(ranks, key=lambda r: r.rank), predicted_step_time_s=plan.prediction.step_time_s,
        predicted_memory_bytes_per_stage=[s.memory_bytes for s in plan.prediction.stages],
        host=socket.gethostname(), created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        resumed=resumed)


def write_report(report: RunReport, path: Path) -> None:
    atomic_write_text(path, json.dumps(report.model_dump(mode="json"), indent=2) + "\n")


def read_report(path: Path) -> RunReport:
    try:
        return RunReport.model_validate(json.loads(path.read_text()))
    except FileNotFoundError:
        raise InputError(f"{path}: no such run report", hint="gplan launch writes run_report.json into its run directory") from None
    except (json.JSONDecodeError, ValidationError) as exc:
        raise InputError(f"{path}: not a gplan run report ({str(exc).splitlines()[0]})",
                         hint="pass a run_report.json written by gplan launch") from None
