"""run_report.json: what a launched job measured, written by rank 0 of any backend's worker and read
by `gplan launch` (measured versus predicted) and `gplan calibrate`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from gplan.errors import InputError

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
    """Model FLOPs (SC21 convention) / step time / peak of all devices (the plan's hardware)."""
    ranks: list[RankReport]
    predicted_step_time_s: float
    predicted_memory_bytes_per_stage: list[float]
    host: str
    created_at: str

    def stage_peak_bytes(self) -> list[float]:
        stages = max(r.stage for r in self.ranks) + 1
        return [max(r.peak_memory_bytes for r in self.ranks if r.stage == s) for s in range(stages)]


def write_report(report: RunReport, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(report.model_dump(mode="json"), indent=2) + "\n")
    os.replace(tmp, path)


def read_report(path: Path) -> RunReport:
    try:
        return RunReport.model_validate(json.loads(path.read_text()))
    except FileNotFoundError:
        raise InputError(f"{path}: no such run report", hint="gplan launch writes run_report.json into its run directory") from None
    except (json.JSONDecodeError, ValidationError) as exc:
        raise InputError(f"{path}: not a gplan run report ({str(exc).splitlines()[0]})",
                         hint="pass a run_report.json written by gplan launch") from None
