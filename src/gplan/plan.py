"""plan.json: the contract between planning and execution (docs/design.md, "The plan").

A Plan is frozen and self-contained: the resolved model, cluster and training inputs with their
digest, the parallel configuration, the stage split, the rank placement, the prediction and the
provenance. Writing re-reads the file and compares; reading refuses unknown schema versions.
"""

from __future__ import annotations

import hashlib
import json
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gplan import __version__
from gplan.errors import InputError
from gplan.io import atomic_write_text, drop_defaults
from gplan.profiles.schema import ClusterSpec, DeviceSpec, NodeGroup
from gplan.spec.model import ModelSpec
from gplan.spec.parallel import LayerCount, ParallelConfig, StageLayout, check_config, split_violations
from gplan.spec.training import TrainingSpec

SCHEMA_VERSION = 1


# ---- the prediction (written by the cost model, read by every command and backend) --------------

class StageMemory(BaseModel):
    """Bytes one device of a stage holds at its peak."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    buffers_bytes: float
    """Gathered zero-3 units (layers, embedding, head) and the engine's own buffers."""
    reserve_bytes: float
    """The device's fixed reserve from the hardware catalogue (CUDA context, library workspaces)."""
    transient_bytes: float = 0.0
    """The largest working set of one step in the backward: a recomputed layer's activations, the
    loss gradient over the vocabulary, the sequence-parallel re-gather."""
    communicator_bytes: float = 0.0
    """NCCL/HCCL buffers of the communicators this device belongs to."""
    fragmentation_bytes: float = 0.0
    """What the caching allocator holds beyond what is allocated (its fragmentation)."""

    @property
    def allocated_bytes(self) -> float:
        return (self.weights_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes
                + self.buffers_bytes + self.transient_bytes)

    @property
    def total_bytes(self) -> float:
        return self.allocated_bytes + self.fragmentation_bytes + self.communicator_bytes + self.reserve_bytes


class StagePrediction(BaseModel):
    """One pipeline stage, per micro-batch (times) and at peak (memory)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int
    num_layers: int
    node_group: int
    forward_s: float
    backward_s: float
    """Backward including recomputation."""
    tp_comm_s: float
    cp_comm_s: float
    pp_comm_s: float
    ep_comm_s: float = 0.0
    """An MoE stage's all-to-all dispatch and combine (and etp gathers) per micro-batch."""
    time_s: float
    """T_i: forward + backward + communication of one micro-batch."""
    in_flight: float
    params: float
    """Parameters held by one device of this stage (after tp; routed experts after ep and etp)."""
    expert_params: float = 0.0
    """Of `params`, the routed experts' (sharded and reduced over the expert data-parallel ranks)."""
    memory: StageMemory
    memory_bytes: float
    memory_budget_bytes: float


class StepBreakdown(BaseModel):
    """Where the step's time goes; the terms add up to step_time_s."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    compute: float
    tp_comm: float
    cp_comm: float
    pp_comm: float
    dp_comm: float
    ep_comm: float = 0.0
    bubble: float
    optimizer: float
    overhead: float


class Prediction(BaseModel):
    """What gplan predicts for one configuration (the `prediction` block of plan.json)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    step_time_s: float
    tokens_per_s: float
    samples_per_s: float
    model_tflops_per_device: float
    mfu: float
    """Model FLOPs (no recompute, causal attention as half the scores, MoE at the top-k routed experts:
    Megatron-Bridge's convention, `compute.model_flops_per_step`) / the base-precision peak."""
    memory_bytes_per_device_max: float
    fits: bool
    num_microbatches: int
    breakdown: StepBreakdown
    stages: list[StagePrediction]

    @property
    def bubble_fraction(self) -> float:
        return self.breakdown.bubble / self.step_time_s

    @property
    def comm_fraction(self) -> float:
        b = self.breakdown
        return (b.tp_comm + b.cp_comm + b.ep_comm + b.pp_comm + b.dp_comm) / self.step_time_s



# ---- the plan ---------------------------------------------------------------------------------------

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
    first_rank: int = Field(ge=0)
    num_ranks: int = Field(ge=1)
    """The stage's ranks are first_rank … first_rank + num_ranks − 1 (the rank grid's stage slice)."""
    time_s: float
    """Forward + backward + communication of one micro-batch."""
    memory_bytes: float
    memory: StageMemory

    @model_validator(mode="before")
    @classmethod
    def _from_rank_list(cls, data):
        """Plans written before listed every rank of a stage: read a consecutive list as its range; a
        list that is not one range is refused (an invalid plan at that stage)."""
        if isinstance(data, dict) and "ranks" in data and "first_rank" not in data:
            ranks = data["ranks"]
            data = {k: v for k, v in data.items() if k != "ranks"}
            if ranks and ranks == list(range(ranks[0], ranks[0] + len(ranks))):
                data.update(first_rank=ranks[0], num_ranks=len(ranks))
            else:
                raise ValueError("ranks: not one consecutive range (the rank grid's stage slice)")
        return data

    @property
    def ranks(self) -> range:
        return range(self.first_rank, self.first_rank + self.num_ranks)


class DeviceRef(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    node_group: int
    node: int
    """Node index across the whole cluster."""
    local: int
    """Device index inside its node (CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES order)."""


class DeviceRange(BaseModel):
    """`count` consecutive devices of one node group, counted node by node from the group's first
    device: device j of the group is local device j mod D of the group's node j div D."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node_group: int
    first: int = Field(ge=0)
    count: int = Field(ge=1)


class Placement(BaseModel):
    """The rank grid (axes outermost first, tp innermost) and the devices of every stage: a rule, not a
    list, so that a plan of a million ranks stays a few kilobytes. pp is the outermost axis, so stage i
    holds ranks i·S … (i+1)·S − 1 (S = dp·cp·tp), and they run in rank order on `stage_devices[i]`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    axis_order: list[str]
    mesh_shape: list[int]
    stage_devices: list[DeviceRange]

    def stage_size(self) -> int:
        return math.prod(self.mesh_shape) // self.mesh_shape[self.axis_order.index("pp")]


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
    solver: SolverInfo | None = None
    """Where its split came from: the ILP, or the even split ("uniform") of a configuration whose ILP the
    bound showed could not beat the winner. None in plans written before this was kept."""


class SearchRecord(BaseModel):
    """How the search that chose this plan was asked and what came second."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    limits: dict[str, list[int] | list[str] | bool | str | None]
    """The search limits (SearchLimits fields) the user gave."""
    candidates: int
    ilps_solved: int
    ilps_answered: int = 0
    """ILPs settled without solving, by one of the same stage times and looser memory (planner.reuse)."""
    time_s: float
    runner_ups: list[RunnerUp] = []
    ilp_outcomes: dict[str, int] = {}
    """ILPs by outcome: optimal, infeasible (no split fits), cutoff (cannot beat the best plan: a valid
    bound), time_limit (stopped with a solution, optimality not proven), unsolved (error or no solution
    within the limit, after a retry with the other solver)."""
    proven_optimal: bool | None = None
    """True only when every candidate was solved to optimality, shown infeasible, or cut off by a valid
    bound — then the plan is the best under gplan's model (the runner-ups are not proven second to
    fifth: the bound proves the winner). None in plans written before this was kept."""
    worst_gap: float = 0.0
    """The largest relative MIP gap of an ILP stopped at its time limit."""


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
    def target(self) -> str | None:
        """The engine the plan is priced and planned for: its training's, held there once (None: a plan
        priced for no engine — written before engines, or built by hand)."""
        return self.training.engine

    @model_validator(mode="before")
    @classmethod
    def _target_held_once(cls, data):
        """Plans written before the target was held once carried a `target` beside `training.engine`: read as
        the engine, which it must equal. A plan whose training names no engine keeps none — its old target
        only bounded the search that found it; it was priced for no engine, and is re-priced so."""
        if not isinstance(data, dict) or "target" not in data:
            return data
        data = dict(data)
        target, training = data.pop("target"), data.get("training")
        engine = training.get("engine") if isinstance(training, dict) else getattr(training, "engine", None)
        if target and engine and target != engine:
            raise ValueError(f"target {target}, but the plan is priced as {engine} runs it (training.engine): "
                             "one engine, the one it is priced and planned for")
        return data

    @model_validator(mode="before")
    @classmethod
    def _from_rank_list(cls, data):
        """Plans written before the rule listed every rank's device: read them as ranges when they are
        ranges (what gplan always wrote)."""
        placement = data.get("placement") if isinstance(data, dict) else None
        if isinstance(placement, dict) and "rank_to_device" in placement and "stage_devices" not in placement:
            placement = dict(placement)
            placement["stage_devices"] = _ranges_of(placement.pop("rank_to_device"), placement, data.get("cluster"))
            data = {**data, "placement": placement}
        return data

    @property
    def world_size(self) -> int:
        return self.parallel.world_size

    def label(self) -> str:
        """The configuration with what its stages recompute (`rc=none62·full18`), not the option the
        search seeded the split with."""
        from gplan.spec.parallel import recompute_mix

        return self.parallel.label(recompute=recompute_mix(self.stages, self.parallel.recompute_modules))

    def device_of(self, rank: int) -> DeviceRef:
        """The device rank `rank` runs on, from the placement's rule."""
        p = self.placement
        size = p.stage_size()
        stage, offset = divmod(rank, size)
        r = p.stage_devices[stage]
        return _group_device(self.cluster, r.node_group, r.first + offset)

    def rank_devices(self) -> list[DeviceRef]:
        """Every rank's device, in rank order (O(world size): for explain and small plans)."""
        return placement_devices(self.cluster, self.placement)

    @property
    def layout_digest(self) -> str:
        """sha256 (16 hex digits) of what the plan runs: its inputs' digest, the configuration, the
        stages' layers and the placement — different for every plan, where `digest` (the inputs) is
        shared by all plans of one model, cluster and batch."""
        parallel = {k: v for k, v in self.parallel.model_dump(mode="json").items() if not (k == "etp" and v == 1)}
        blob = json.dumps([self.digest, parallel,
                           [[lc.model_dump() for lc in s.layers] for s in self.stages],
                           self.placement.model_dump(mode="json")], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def placement_devices(cluster: ClusterSpec, placement: Placement) -> list[DeviceRef]:
    """Every rank's device under a placement's rule, in rank order."""
    return [_group_device(cluster, r.node_group, r.first + k) for r in placement.stage_devices for k in range(r.count)]


def _group_device(cluster: ClusterSpec, group: int, index: int) -> DeviceRef:
    """Device `index` of node group `group`, counted node by node."""
    first_node = sum(g.nodes for g in cluster.node_groups[:group])
    per_node = cluster.node_groups[group].devices_per_node
    return DeviceRef(node_group=group, node=first_node + index // per_node, local=index % per_node)


def _ranges_of(devices: list, placement: dict, cluster: dict | None) -> list[dict]:
    """An old plan's rank list as one device range per stage; ValueError when it is not one."""
    shape, order = placement.get("mesh_shape") or [], placement.get("axis_order") or []
    if not cluster or "pp" not in order or not shape:
        raise ValueError("placement: rank_to_device without a mesh or cluster")
    groups = cluster["node_groups"]
    pp = shape[order.index("pp")]
    size = len(devices) // max(pp, 1)
    ranges = []
    for stage in range(pp):
        chunk = devices[stage * size:(stage + 1) * size]
        g = chunk[0]["node_group"]
        first_node = sum(x["nodes"] for x in groups[:g])
        index = [(d["node"] - first_node) * groups[g]["devices_per_node"] + d["local"] for d in chunk]
        if any(d["node_group"] != g for d in chunk) or index != list(range(index[0], index[0] + size)):
            raise ValueError(f"placement: stage {stage}'s devices are not consecutive devices of one node group")
        ranges.append({"node_group": g, "first": index[0], "count": size})
    return ranges


def layouts_of(plan: Plan) -> list[StageLayout]:
    """The stage layouts a plan was priced with (to re-price it)."""
    return [StageLayout(layers=s.layers, embedding=s.embedding, head=s.head, node_group=s.node_group)
            for s in plan.stages]


def inputs_digest(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec) -> str:
    """sha256 of the canonical JSON of the resolved inputs (first 16 hex digits). Fields added after
    schema v1 plans were first written are left out while at their default (`DIGEST_OPTIONAL`), so
    those plans keep their digest."""
    blob = json.dumps([model.digest_dump(), _cluster_digest_dump(cluster), training.digest_dump()], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _cluster_digest_dump(cluster: ClusterSpec) -> dict:
    data = cluster.model_dump(mode="json")
    data["node_groups"] = [drop_defaults({**g, "hardware": drop_defaults(g["hardware"], DeviceSpec.DIGEST_OPTIONAL)},
                                         NodeGroup.DIGEST_OPTIONAL) for g in data["node_groups"]]
    return data


def plan_json(plan: Plan) -> str:
    return plan.model_dump_json(indent=2) + "\n"


def write_plan(plan: Plan, path: Path) -> None:
    """Write atomically, then re-read and compare: a plan that does not round-trip is a bug."""
    atomic_write_text(path, plan_json(plan))
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


def read_plan(path: Path, check: bool = True) -> Plan:
    """Read a plan; refuse unknown schema versions, malformed files and (unless `check=False`, which
    `gplan validate --refresh` uses to repair an edited plan) inconsistent ones, with one line (exit 3)."""
    plan = _parse_plan(path)
    if check:
        check_plan(plan, str(path))
    return plan


def _parse_plan(path: Path) -> Plan:
    if not path.is_file():
        raise InputError(f"{path}: no such plan file", hint="create one with: gplan search MODEL --devices N")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{exc.lineno}: malformed JSON: {exc.msg}", hint="regenerate the plan") from exc
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text", hint="regenerate the plan") from None
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


# ---- the plan check ----------------------------------------------------------------------------------

REFRESH_HINT = "regenerate it with gplan search, or after a deliberate edit run: gplan validate PLAN --refresh"


def check_plan(plan: Plan, source: str = "plan") -> None:
    """Everything a plan must keep to run as written, each refused with the field it breaks (exit 3):
    the digest of its inputs; the configuration's rules; stages contiguous, covering every layer once,
    with one recompute entry per layer and the embedding and head where they belong; ranks unique and
    covering the world, stage by stage as the rank grid says; devices unique and inside their nodes;
    `m·mbs·dp = gbs`; the schedule's own rules; one prediction per stage."""
    def bad(field: str, what: str) -> InputError:
        return InputError(f"{source}: {field}: {what}", hint=REFRESH_HINT)

    if inputs_digest(plan.model, plan.cluster, plan.training) != plan.digest:
        raise bad("digest", "does not match the plan's model, cluster and training (edited since it was written?)")
    c, t = plan.parallel, plan.training
    placed = sum(r.count for r in plan.placement.stage_devices)
    if c.world_size != placed:  # an edited degree: say so first, not the stage slice it breaks downstream
        raise bad("parallel", f"dp·tp·pp·cp = {c.dp}·{c.tp}·{c.pp}·{c.cp} = {c.world_size} ≠ the {placed} devices "
                              "the plan places (placement.stage_devices)")
    if c.num_microbatches * c.mbs * c.dp != t.gbs:
        raise bad("parallel.num_microbatches", f"m·mbs·dp = {c.num_microbatches}·{c.mbs}·{c.dp} ≠ gbs {t.gbs}")
    try:
        check_config(plan.model, t, c, c.world_size)
    except InputError as exc:
        raise bad("parallel", exc.message) from None
    _check_stages(plan, bad)
    _check_placement(plan, bad)
    if len(plan.prediction.stages) != c.pp:
        raise bad("prediction.stages", f"{len(plan.prediction.stages)} entries for pp={c.pp}")


def _check_stages(plan: Plan, bad) -> None:
    c, stages = plan.parallel, plan.stages
    if len(stages) != c.pp:
        raise bad("stages", f"{len(stages)} stages for pp={c.pp}")
    start, per_stage = 0, c.world_size // c.pp
    for i, s in enumerate(stages):
        where = f"stages[{i}]"
        if s.index != i:
            raise bad(f"{where}.index", f"is {s.index}")
        if s.layer_start != start or s.layer_end <= s.layer_start:
            raise bad(f"{where}.layer_start", f"layers {s.layer_start}..{s.layer_end} do not follow layer {start} "
                                              "(stages must be contiguous and non-empty)")
        if sum(lc.count for lc in s.layers) != s.layer_end - s.layer_start:
            raise bad(f"{where}.layers", f"recompute entries cover {sum(lc.count for lc in s.layers)} layers, "
                                         f"the range {s.layer_end - s.layer_start}")
        if s.embedding != (i == 0) or s.head != (i == c.pp - 1):
            raise bad(f"{where}", "the embedding belongs to the first stage and the head to the last")
        if s.node_group >= len(plan.cluster.node_groups):
            raise bad(f"{where}.node_group", f"{s.node_group} is not a node group of the cluster")
        if (s.first_rank, s.num_ranks) != (i * per_stage, per_stage):
            raise bad(f"{where}.{'num_ranks' if s.num_ranks != per_stage else 'first_rank'}",
                      f"must be ranks {i * per_stage}..{(i + 1) * per_stage - 1} (the rank grid's stage slice)")
        start = s.layer_end
    broken = split_violations(plan.model, c, [s.layer_end - s.layer_start for s in stages])
    if broken:  # the split rules `--stages` keeps too: the model's layers, each stage filling its chunks
        raise bad("stages", broken[0].message)
    kinds = [k.name for k in plan.model.layer_kinds()]
    for i, s in enumerate(stages):
        unknown = {lc.kind for lc in s.layers} - set(kinds)
        if unknown:
            raise bad(f"stages[{i}].layers", f"unknown layer kind {sorted(unknown)[0]!r}")
        if c.offload_layers and any(lc.recompute != "none" and lc.count for lc in s.layers):
            raise bad(f"stages[{i}].layers", "a layer recomputes while activations are offloaded (Megatron offloads "
                                             "without recomputation)")


def _check_placement(plan: Plan, bad) -> None:
    c, p = plan.parallel, plan.placement
    expected_shape = [getattr(c, axis) for axis in p.axis_order]
    if sorted(p.axis_order) != sorted(["pp", "dp", "cp", "tp"]) or p.mesh_shape != expected_shape:
        raise bad("placement.mesh_shape", f"{p.mesh_shape} over {p.axis_order} does not match the degrees")
    size = p.stage_size()
    if len(p.stage_devices) != c.pp or any(r.count != size for r in p.stage_devices):
        raise bad("placement.stage_devices", f"{len(p.stage_devices)} ranges for pp={c.pp}, each of {size} devices")
    groups = plan.cluster.node_groups
    for stage, r in enumerate(p.stage_devices):
        if r.node_group >= len(groups) or r.first + r.count > groups[r.node_group].devices:
            raise bad(f"placement.stage_devices[{stage}]", f"devices {r.first}…{r.first + r.count - 1} of node group "
                                                           f"{r.node_group} are not in the cluster")
        if r.node_group != plan.stages[stage].node_group:
            raise bad(f"placement.stage_devices[{stage}]", f"node group {r.node_group}, the stage's is "
                                                           f"{plan.stages[stage].node_group}")
    spans = sorted((r.node_group, r.first, r.first + r.count, stage) for stage, r in enumerate(p.stage_devices))
    for (g, _, end, s1), (g2, start, _, s2) in zip(spans, spans[1:]):
        if g == g2 and start < end:
            raise bad("placement.stage_devices", f"stages {s1} and {s2} share devices of node group {g}")
