"""plan.json: the contract between planning and execution (DESIGN.md §5).

A Plan is frozen and self-contained: the resolved model, cluster and training inputs with their
digest, the parallel configuration, the stage split, the rank placement, the prediction and the
provenance. Writing re-reads the file and compares; reading refuses unknown schema versions.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gplan import __version__
from gplan.cost_models.step import Prediction, StageMemory, StepBreakdown
from gplan.errors import InputError
from gplan.profiles.schema import ClusterSpec
from gplan.spec.model import ModelSpec
from gplan.spec.parallel import LayerCount, ParallelConfig
from gplan.spec.training import TrainingSpec

SCHEMA_VERSION = 1


class ParallelPlan(ParallelConfig):
    """The configuration plus what follows from it for the batch."""

    num_microbatches: int = Field(ge=1)

    def to_config(self) -> ParallelConfig:
        return ParallelConfig(**self.model_dump(exclude={"num_microbatches"}))


class StagePlan(BaseModel):
    """One pipeline stage: which layers (execution order, 0-based, end exclusive), where, and its cost."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int
    layer_start: int
    layer_end: int
    layers: list[LayerCount]
    embedding: bool
    head: bool
    node_group: int
    ranks: list[int]
    time_s: float
    """Forward + backward + communication of one micro-batch."""
    memory_bytes: float
    memory: StageMemory


class DeviceRef(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    node_group: int
    node: int
    """Node index across the whole cluster."""
    local: int
    """Device index inside its node (CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES order)."""


class Placement(BaseModel):
    """The rank grid (axes outermost first, tp innermost) and the device of every rank."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    axis_order: list[str]
    mesh_shape: list[int]
    rank_to_device: list[DeviceRef]


class SolverInfo(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    status: str
    """`optimal`, `time_limit` (feasible, not proven), or `none` (no solver ran)."""
    gap: float = 0.0
    time_s: float = 0.0


class Provenance(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    gplan_version: str = __version__
    profile: str | None = None
    """The measured profile the costs came from; None = the bundled catalogue."""
    solver: SolverInfo = SolverInfo(name="none", status="none")
    created_at: str = Field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    devices_given: int | None = None
    """Devices the user offered; more than the plan's world size when fewer run faster."""


class RunnerUp(BaseModel):
    """A plan the search ranked below the winner, kept so `gplan explain` can say why it lost."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    parallel: ParallelConfig
    stage_layers: list[list[LayerCount]]
    step_time_s: float
    memory_bytes_per_device_max: float
    breakdown: StepBreakdown


class SearchRecord(BaseModel):
    """How the search that chose this plan was asked and what came second."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    limits: dict[str, list[int] | list[str] | bool | None]
    """The search limits (SearchLimits fields) the user gave."""
    candidates: int
    ilps_solved: int
    time_s: float
    runner_ups: list[RunnerUp] = []


class Plan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = SCHEMA_VERSION
    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    digest: str
    parallel: ParallelPlan
    stages: list[StagePlan]
    placement: Placement
    prediction: Prediction
    provenance: Provenance
    search: SearchRecord | None = None
    """Present when `gplan search` wrote the plan."""

    @property
    def world_size(self) -> int:
        return self.parallel.world_size


def inputs_digest(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec) -> str:
    """sha256 of the canonical JSON of the resolved inputs (first 16 hex digits)."""
    blob = json.dumps([model.model_dump(mode="json"), cluster.model_dump(mode="json"),
                       training.model_dump(mode="json")], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def plan_json(plan: Plan) -> str:
    return plan.model_dump_json(indent=2) + "\n"


def write_plan(plan: Plan, path: Path) -> None:
    """Write atomically, then re-read and compare: a plan that does not round-trip is a bug."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(plan_json(plan))
    tmp.replace(path)
    if read_plan(path) != plan:
        raise RuntimeError(f"{path}: the written plan does not read back identically")


def is_plan_file(path: Path) -> bool:
    """A JSON file whose top level carries a schema_version (the mark of a plan)."""
    if path.suffix != ".json" or not path.is_file():
        return False
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False
    return isinstance(data, dict) and "schema_version" in data


def read_plan(path: Path) -> Plan:
    """Read a plan; refuse unknown schema versions and malformed files with one line (exit 3)."""
    if not path.is_file():
        raise InputError(f"{path}: no such plan file", hint="create one with: gplan search MODEL --devices N")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{exc.lineno}: malformed JSON: {exc.msg}", hint="regenerate the plan") from exc
    if not isinstance(data, dict) or "schema_version" not in data:
        raise InputError(f"{path}: not a gplan plan (no schema_version)", hint="pass a plan.json written by gplan search")
    version = data["schema_version"]
    if version != SCHEMA_VERSION:
        raise InputError(
            f"{path}: plan schema version {version} is not supported (this gplan {__version__} reads {SCHEMA_VERSION})",
            hint="regenerate the plan with this gplan, or upgrade gplan",
        )
    try:
        return Plan.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise InputError(f"{path}: invalid plan at '{loc}': {err['msg']}", hint="regenerate the plan") from exc
