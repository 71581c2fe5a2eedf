"""Why a plan is what it is: what binds it, why the runner-ups lost, and what would change if.

A constraint *binds* when relaxing it would change the plan or its step time:
  - memory: a stage is within `MEMORY_TIGHT` of its budget, or layers recompute (recomputation only
    ever costs time, so the ILP chooses it only when memory forces it);
  - a link class: re-pricing the same plan with that bandwidth doubled saves time;
  - the bubble: the time stages wait at the pipeline's ends.
Each finding carries what relaxing it is worth, as a fraction of the step time.
"""

from __future__ import annotations

from dataclasses import dataclass

from gplan.cost_models import pipeline, timeline
from gplan.cost_models.step import StepModel
from gplan.errors import InputError
from gplan.plan import Plan, Prediction, RunnerUp, StepBreakdown, layouts_of
from gplan.planner.build import repredict
from gplan.planner.placement import axis_link_classes
from gplan.planner.space import SearchLimits
from gplan.profiles.schema import ClusterSpec
from gplan.spec.parallel import check_config

MEMORY_TIGHT = 0.97
"""A stage using this fraction of its budget or more leaves no room for a faster option."""

#: What a growing breakdown term means, in words.
TERM_REASON = {
    "compute": "more compute per device (recompute, or smaller and slower GEMMs)",
    "tp_comm": "more tensor-parallel communication",
    "cp_comm": "more context-parallel communication",
    "pp_comm": "more pipeline sends",
    "dp_comm": "more exposed data-parallel communication",
    "bubble": "a larger pipeline bubble",
    "optimizer": "a slower optimizer step (less sharding)",
    "overhead": "more fixed overhead",
}


@dataclass(frozen=True)
class Finding:
    constraint: str
    binds: bool
    saving_fraction: float
    """Step time saved by relaxing the constraint (2× bandwidth; no bubble), as a fraction."""
    detail: str


LARGE_BUBBLE = 0.10
"""A pipeline bubble above this fraction of the step is worth a word in the search summary."""
LARGE_EXPOSED_COMM = 0.20
"""Exposed communication above this fraction of the step, likewise."""

#: What shrinks each exposed communication term, in words.
COMM_REMEDY = {
    "tp_comm": "a smaller tp (--tp), or a target that overlaps tp's collectives with the GEMMs (--target megatron)",
    "cp_comm": "a smaller cp (--cp): each ring step's exchange is not hidden behind its attention block",
    "pp_comm": "fewer pipeline stages (--pp), or a larger micro-batch (--mbs)",
    "dp_comm": "a larger --gbs (one gradient reduction per step, amortised over more tokens)",
    "ep_comm": "a smaller ep (--ep) inside the scale-up domain",
}


def large_costs(config, prediction: Prediction) -> list[str]:
    """Warnings for a plan that idles: its bubble, scaling as (pp − 1)/(vpp·m) in 1F1B and its interleaved
    form (Narayanan et al., SC21, §2.2), so twice the batch halves it, as does twice the vpp; and its
    largest exposed communication term, with what would shrink it."""
    lines = []
    if prediction.bubble_fraction > LARGE_BUBBLE:
        lines.append(f"the pipeline bubble is {prediction.bubble_fraction:.0%} of the step (pp {config.pp}, "
                     f"{prediction.num_microbatches} micro-batches, vpp {config.vpp}); it scales as (pp−1)/(vpp·m): "
                     "a 2× --gbs halves it, as would a 2× --vpp where the layers per stage divide")
    comm = {k: v for k, v in prediction.breakdown.model_dump().items() if k.endswith("_comm")}
    exposed = sum(comm.values()) / prediction.step_time_s
    if exposed > LARGE_EXPOSED_COMM:
        term = max(comm, key=comm.get)
        share = comm[term] / prediction.step_time_s
        if term == "ep_comm" and config.ep == 1:  # no exchange at ep 1: the term is the MoE layers' host time alone
            lines.append(f"{exposed:.0%} of the step is exposed communication and host time, most of it the MoE "
                         f"layers' host time (ep_comm {share:.0%}: at ep 1 no token traffic, only the time the layers wait on "
                         f"the host, experts.host_time_s): {MOE_HOST_REMEDY} would shrink it")
        else:
            lines.append(f"{exposed:.0%} of the step is exposed communication, most of it {term} "
                         f"({share:.0%}): {COMM_REMEDY.get(term, 'faster links')} would shrink it")
    return lines


MOE_HOST_REMEDY = "larger micro-batches (--mbs), or CUDA graphs where the engine captures the step (--cuda-graphs)"
"""What shrinks the MoE layers' host time: more tokens per pass, or a captured step (experts.host_time_s)."""


def findings(plan: Plan) -> list[Finding]:
    """Memory first, then the time terms by what relaxing them saves."""
    step = StepModel(plan.model, plan.training, plan.cluster, plan.parallel)
    prediction = step.predict(layouts_of(plan))
    total = prediction.step_time_s
    rides = axis_links(plan)
    timed = [_link_finding(plan, rides, "inter_node", total), _link_finding(plan, rides, "intra_node", total),
             Finding("bubble", False, prediction.breakdown.bubble / total,
                     f"stages wait {prediction.bubble_fraction:.1%} of the step (pp={plan.parallel.pp}, "
                     f"m={prediction.num_microbatches}, vpp={plan.parallel.vpp})")]
    timed = [f for f in timed if f is not None]
    timed.sort(key=lambda f: -f.saving_fraction)
    if timed and timed[0].saving_fraction > 0.01:
        timed[0] = Finding(timed[0].constraint, True, timed[0].saving_fraction, timed[0].detail)
    return [_memory_finding(plan)] + timed


def _memory_finding(plan: Plan) -> Finding:
    tightest = max(plan.prediction.stages, key=lambda s: s.memory_bytes / s.memory_budget_bytes)
    used = tightest.memory_bytes / tightest.memory_budget_bytes
    recomputed = sum(c.count for s in plan.stages for c in s.layers if c.recompute != "none")
    detail = (f"stage {tightest.index} uses {tightest.memory_bytes / 1024**3:.1f} of "
              f"{tightest.memory_budget_bytes / 1024**3:.1f} GiB ({used:.0%})")
    if recomputed:
        detail += f"; {recomputed} layers recompute to fit"
    return Finding("memory", used >= MEMORY_TIGHT or recomputed > 0, 0.0, detail)


def _link_finding(plan: Plan, rides: dict[str, str], link: str, total_s: float) -> Finding | None:
    """Re-price the same plan with `link` bandwidth doubled; name the axes that ride it."""
    axes = [axis for axis, ride in rides.items() if ride == link.replace("_node", "")]
    if not axes:
        return None
    faster = scale_links(plan.cluster, link, 2.0)
    saved = 1 - StepModel(plan.model, plan.training, faster, plan.parallel).predict(layouts_of(plan)).step_time_s / total_s
    name = link.replace("_", "-") + " bandwidth"
    group = plan.cluster.primary
    bandwidth = getattr(group, link).bandwidth_GBps
    return Finding(name, False, max(0.0, saved),
                   f"{', '.join(axes)} ride {link.replace('_', '-')} links ({bandwidth:g} GB/s per device); "
                   f"2× would save {max(0.0, saved):.1%}")


def axis_links(plan: Plan) -> dict[str, str]:
    """The link class (`intra`, `inter`) the slowest group of each parallel axis rides, from the
    plan's placement on the cluster's topology (per axis from the rank grid: seconds at any scale)."""
    links = axis_link_classes(plan.cluster, plan.placement, plan.parallel)
    return {axis: links[axis][0] for axis in plan.placement.axis_order if axis in links}


def scale_links(cluster: ClusterSpec, link: str, factor: float) -> ClusterSpec:
    groups = [g.model_copy(update={link: getattr(g, link).model_copy(
        update={"bandwidth_GBps": getattr(g, link).bandwidth_GBps * factor})}) for g in cluster.node_groups]
    return cluster.model_copy(update={"node_groups": groups})


def grown_term(breakdown: StepBreakdown, reference: StepBreakdown) -> tuple[str, float]:
    """The breakdown term that grew most against `reference`, and by how many seconds."""
    growth = {k: v - getattr(reference, k) for k, v in breakdown.model_dump().items()}
    term = max(growth, key=growth.get)
    return term, growth[term]


@dataclass(frozen=True)
class Loser:
    label: str
    split: str
    step_time_s: float
    slower_fraction: float
    term: str
    term_growth_s: float
    reason: str


def runner_ups(plan: Plan) -> tuple[list[Loser], str]:
    """The plans the search ranked next, and why each lost; with where they came from."""
    if plan.search is not None:
        ups, source = plan.search.runner_ups, "recorded by the search"
    else:
        ups, source = _fresh_runner_ups(plan), "from a fresh search (the plan records none)"
    losers = []
    for up in ups:
        term, growth = grown_term(up.breakdown, plan.prediction.breakdown)
        sizes = [sum(c.count for c in layers) for layers in up.stage_layers]
        losers.append(Loser(up.parallel.label(), "/".join(map(str, sizes)), up.step_time_s,
                            up.step_time_s / plan.prediction.step_time_s - 1, term, growth, TERM_REASON[term]))
    return losers, source


def _fresh_runner_ups(plan: Plan, top: int = 5) -> list[RunnerUp]:
    from gplan.planner.search import runner_up, search

    devices = plan.provenance.devices_given or plan.world_size
    cluster = plan.cluster if plan.cluster.is_heterogeneous else plan.cluster.sized(devices)
    result = search(plan.model, plan.training, cluster, devices, top=top + 1)
    return [runner_up(c) for c in result.ranked if c.config != plan.parallel.to_config()][:top]


# ---- what-if -------------------------------------------------------------------------------------

WHAT_IF_KEYS = ("devices", "inter_node_bandwidth", "intra_node_bandwidth", "memory", "gbs", "seq_length")


@dataclass(frozen=True)
class WhatIf:
    key: str
    factor: float | None
    value: float | None

    def apply(self, current: float) -> float:
        return current * self.factor if self.factor is not None else self.value

    def __str__(self) -> str:
        return f"{self.key}={self.factor:g}x" if self.factor is not None else f"{self.key}={self.value:g}"


def parse_what_if(text: str) -> WhatIf:
    """`inter_node_bandwidth=2x` (a factor) or `devices=128` (a value)."""
    key, sep, value = text.replace(" ", "").partition("=")
    if not sep or key not in WHAT_IF_KEYS:
        raise InputError(f"--what-if {text!r}: expected KEY=VALUE with KEY one of {', '.join(WHAT_IF_KEYS)}",
                         hint='for example --what-if "inter_node_bandwidth=2x" or --what-if devices=128')
    try:
        number = float(value.lower().removesuffix("x"))
    except ValueError:
        raise InputError(f"--what-if {text!r}: {value!r} is not a number or a factor like 2x",
                         hint='for example --what-if "memory=1.5x"') from None
    if number <= 0:
        raise InputError(f"--what-if {text!r}: must be positive", hint="use a factor like 2x or 0.5x")
    factor = value.lower().endswith("x")
    return WhatIf(key, number if factor else None, None if factor else number)


@dataclass(frozen=True)
class Scenario:
    """The plan's inputs after what-ifs."""

    cluster: ClusterSpec
    training: object
    devices: int


def scenario(plan: Plan, changes: list[WhatIf]) -> Scenario:
    devices = plan.provenance.devices_given or plan.world_size
    cluster, training = plan.cluster, plan.training
    for change in changes:
        if change.key == "devices":
            if cluster.is_heterogeneous:
                raise InputError("--what-if devices= needs a single-kind cluster",
                                 hint="edit the node counts of the cluster file and search again")
            devices = int(change.apply(devices))
        elif change.key in ("inter_node_bandwidth", "intra_node_bandwidth"):
            link = change.key.removesuffix("_bandwidth")
            current = getattr(cluster.primary, link).bandwidth_GBps
            cluster = scale_links(cluster, link, change.apply(current) / current)
        elif change.key == "memory":
            cluster = _scale_memory(cluster, change)
        else:
            training = training.model_copy(update={change.key: int(change.apply(getattr(training, change.key)))})
    if not cluster.is_heterogeneous:
        cluster = cluster.sized(devices)
    return Scenario(cluster, training, devices)


def _scale_memory(cluster: ClusterSpec, change: WhatIf) -> ClusterSpec:
    groups = [g.model_copy(update={"hardware": g.hardware.model_copy(
        update={"memory_GiB": change.apply(g.hardware.memory_GiB)})}) for g in cluster.node_groups]
    return cluster.model_copy(update={"node_groups": groups})


@dataclass(frozen=True)
class WhatIfResult:
    changes: list[WhatIf]
    devices: int
    this_plan: object
    """The plan's own configuration and split re-priced under the changes; None when it cannot run."""
    this_plan_note: str
    best: object
    """The search's best candidate under the changes."""


def what_if(plan: Plan, changes: list[WhatIf]) -> WhatIfResult:
    from gplan.planner.search import search

    case = scenario(plan, changes)
    this, note = None, ""
    config = plan.parallel.to_config()
    try:
        if config.world_size > case.devices:
            raise InputError(f"the plan needs {config.world_size} devices")
        check_config(plan.model, case.training, config, config.world_size)
        own_cluster = case.cluster if case.cluster.is_heterogeneous else case.cluster.sized(config.world_size)
        this = StepModel(plan.model, case.training, own_cluster, config).predict(layouts_of(plan))
    except InputError as exc:
        note = exc.message
    limits = SearchLimits.from_record(plan.search.limits) if plan.search else SearchLimits()
    result = search(plan.model, case.training, case.cluster, case.devices, limits, top=1)
    return WhatIfResult(changes, case.devices, this, note, result.best)


@dataclass(frozen=True)
class Explanation:
    """Everything `gplan explain` shows of a plan."""

    prediction: Prediction
    findings: list[Finding]
    losers: list[Loser]
    runner_up_source: str
    what_if: WhatIfResult | None
    shown_ops: list
    """The schedule's first `shown` micro-batches, op by op (the picture)."""
    shown: int
    simulated_s: float | None
    """The whole schedule played out (None beyond 4096 micro-batches)."""
    formula_s: float
    """The cost model's pipeline formula for the same stage times."""


def explain(plan: Plan, changes: list[WhatIf]) -> Explanation:
    c = plan.parallel
    prediction = repredict(plan)
    losers, source = runner_ups(plan)
    m = prediction.num_microbatches
    split = [timeline.stage_split_s(s.forward_s, s.backward_s, s.time_s) for s in prediction.stages]
    forward, backward = [f for f, _ in split], [b for _, b in split]
    shown = timeline.shown_microbatches(c.pp, m)
    ops = timeline.simulate(forward, backward, shown, c.schedule, c.vpp)
    simulated = timeline.makespan_s(timeline.simulate(forward, backward, m, c.schedule, c.vpp)) if m <= 4096 else None
    return Explanation(prediction, findings(plan), losers, source, what_if(plan, changes) if changes else None,
                       ops, shown, simulated,
                       pipeline.pipeline_time_s([s.time_s for s in prediction.stages], m, c.vpp))
