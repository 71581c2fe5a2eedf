"""The search (docs/design.md, "Search"): enumerate candidates, bound, solve the stage split, re-price, rank.

For every candidate configuration the cost table gives a lower bound on its pipeline time (all layers
at their cheapest option, perfectly balanced). Candidates are visited in order of that bound; the ILP
runs only while the bound beats the best step time found — branch and bound over configurations.
Every ILP result is re-priced by the cost model (the solver's objective is never the prediction).
"""

from __future__ import annotations

import contextlib
import gc
import heapq
import itertools
import math
import time
from dataclasses import dataclass, field, replace
from functools import cached_property

from gplan.cost_models.step import Prediction, StepModel
from gplan.errors import InfeasibleError
from gplan.plan import RunnerUp, SearchRecord, SolverInfo
from gplan.planner import ilp, split_exact
from gplan.planner.bounds import lower_bound_s, memory_admits_a_split, memory_aware_prunes
from gplan.planner.reuse import SolvedPool
from gplan.planner.space import SearchLimits, candidates, uneven_interleaved
from gplan.planner.table import CostTable, Split, build_table, floor_s, pipeline_times, states_fit, uniform_split
from gplan.profiles.schema import ClusterSpec
from gplan.spec.model import ModelSpec
from gplan.spec.parallel import DEFAULT_RECOMPUTE_MODULES, ParallelConfig, StageLayout
from gplan.spec.targets import TARGETS, config_refusals, runs_as
from gplan.spec.training import TrainingSpec


@dataclass(frozen=True)
class Candidate:
    config: ParallelConfig
    layouts: list[StageLayout]
    prediction: Prediction
    solver: SolverInfo
    cluster: ClusterSpec
    """The cluster it was priced on (a template sized to the configuration's world size)."""


@dataclass
class SearchResult:
    ranked: list[Candidate]
    candidates: int = 0
    solved: int = 0
    answered: int = 0
    """ILPs settled by one solved before with the same stage times and looser memory (planner.reuse)."""
    pruned: int = 0
    """Candidates whose ILP never ran: their bound could not beat the best plan."""
    memory_infeasible: int = 0
    time_s: float = 0.0
    solver_time_s: float = 0.0
    statuses: dict[str, int] = field(default_factory=dict)
    """ILPs by outcome (see SearchRecord.ilp_outcomes)."""
    solvers: dict[str, int] = field(default_factory=dict)
    """Stage splits solved, by solver: `exact` (planner.split_exact, exact on one node group) or the ILP's."""
    worst_gap: float = 0.0
    notes: list[str] = field(default_factory=list)
    """What the search says beside its table (why a layout family engines default to did not win)."""

    @property
    def proven_optimal(self) -> bool:
        """Every candidate solved to optimality, shown infeasible, or cut off by a valid bound."""
        return not self.statuses.get("time_limit") and not self.statuses.get("unsolved")

    def provenance_text(self) -> str:
        if self.proven_optimal:
            return "proven optimal under the model (every candidate solved or cut off by a valid bound)"
        parts = []
        if self.statuses.get("time_limit"):
            parts.append(f"{self.statuses['time_limit']} ILPs stopped at the time limit (worst gap {self.worst_gap:.1%})")
        if self.statuses.get("unsolved"):
            parts.append(f"{self.statuses['unsolved']} ILPs unsolved (no solution within the limit)")
        return "best found, not proven optimal: " + "; ".join(parts) + " — raise --time-limit"

    @property
    def best(self) -> Candidate:
        return self.ranked[0]


def search_record(result: SearchResult, limits: SearchLimits) -> SearchRecord:
    """What the plan keeps of its search: the limits asked and the runner-ups."""
    return SearchRecord(limits=limits.record(), candidates=result.candidates, ilps_solved=result.solved,
                        ilps_answered=result.answered,
                        time_s=result.time_s, runner_ups=[runner_up(c) for c in result.ranked[1:]],
                        ilp_outcomes=dict(result.statuses), proven_optimal=result.proven_optimal,
                        worst_gap=result.worst_gap)


def runner_up(candidate: "Candidate") -> RunnerUp:
    """What a plan keeps of a candidate it beat."""
    p = candidate.prediction
    return RunnerUp(parallel=candidate.config, stage_layers=[s.layers for s in candidate.layouts], solver=candidate.solver,
                    step_time_s=p.step_time_s, memory_bytes_per_device_max=p.memory_bytes_per_device_max,
                    breakdown=p.breakdown)


def search(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, devices: int,
           limits: SearchLimits | None = None, top: int = 5, time_limit_s: float = 10.0,
           progress=None, bounds: bool = True) -> SearchResult:
    """Best configurations by predicted step time, fitting memory; raises InfeasibleError.

    1. Price every candidate's stage times (`pipeline_times`) for its lower bound; the floor outside
       the pipeline is added as the candidate comes up (`in_bound_order`).
    2. Seed the ranking with the even (Megatron) splits of the first candidates by bound.
    3. Visit candidates by lower bound, pricing their memory (`build_table`): drop those no split can
       fit (`memory_admits_a_split`); solve the ILP while the bound beats the best step time found.
       Proving the top K instead (K − 1 more near-ties solved to optimality) cost 5× the ILPs for
       runner-ups the table shows side by side; they are the best other configurations found, each
       with the split its solver gave (`RunnerUp.solver`) — a shown row still on its even seed gets its
       split solved first (`_solve_shown_seeds`).

    `bounds=False` solves every candidate's ILP with no bound and no cut-off: the reference the tests
    hold the bounded search to (same best plan), far too slow for real use."""
    with _collector_paused():
        return _search(model, training, cluster, devices, engine_limits(training, limits or SearchLimits()), top,
                       time_limit_s, progress, bounds)


def engine_limits(training: TrainingSpec, limits: SearchLimits) -> SearchLimits:
    """`limits` as the run's exchange allows: torchtitan's MinimalAsyncEP (`symmetric_memory`) runs with full
    recompute only (minimal_async_ep/api.py), so its layers are given no other option where full is allowed."""
    if training.moe_dispatcher == "symmetric_memory" and "full" in limits.recompute:
        return replace(limits, recompute=["full"])
    return limits


@contextlib.contextmanager
def _collector_paused():
    """Python's cyclic garbage collector off while searching: the search allocates hundreds of thousands
    of short-lived objects without cycles (freed by reference counting), and each collection they
    trigger rescans every long-lived object of the process (modules, pydantic schemas) — 40% of the
    llama3-70b/64 search. Collections resume afterwards, catching any cycle it made."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _search(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, devices: int, limits: SearchLimits,
            top: int, time_limit_s: float, progress, bounds: bool) -> SearchResult:
    start = time.perf_counter()
    result = SearchResult(ranked=[])
    scored, layer_times, zero_free, fits, sized = [], {}, {}, {}, {}
    for config in candidates(model, training, cluster, devices, limits):
        result.candidates += 1
        if not cluster.is_heterogeneous and config.world_size not in sized:
            sized[config.world_size] = cluster.sized(config.world_size)
        step_cluster = cluster if cluster.is_heterogeneous else sized[config.world_size]
        # the states depend on the degrees and zero, not on mbs, vpp, recompute or the schedule
        grid = (config.dp, config.tp, config.pp, config.cp, config.ep, config.etp, config.zero, step_cluster.name)
        if bounds and fits.get(grid) is False:  # its states alone overflow: no split fits (most candidates)
            result.memory_infeasible += 1
            continue
        # a layer's times, bytes and parameters depend on the shard (mbs, cp, tp, sp), the expert grid (an
        # MoE layer's GEMM shapes) and the device, not on dp, pp or zero: shared (StepModel.memo; the layer
        # time table is keyed by the scale-up domains its links depend on as well)
        step = StepModel.sharing(layer_times, model, training, step_cluster, config)
        if bounds and grid not in fits:
            fits[grid] = states_fit(step)
            if not fits[grid]:
                result.memory_infeasible += 1
                continue
        # the first bound needs pipeline times only (memory is priced for the candidates the bounds let
        # through); the zero levels of one layout share them
        key = tuple(value for name, value in config.__dict__.items() if name != "zero")  # every field but zero
        if key not in zero_free:
            times = pipeline_times(step, limits.recompute, uneven_interleaved=uneven_interleaved(training.engine))
            zero_free[key] = times, lower_bound_s(times)
        times, pipeline_bound = zero_free[key]
        scored.append(_Scored(pipeline_bound, result.candidates, step, times))
    if not result.candidates:
        raise _no_candidate(model, training, cluster, devices, limits)
    found: dict[ParallelConfig, Candidate] = {}
    pool = SolvedPool()
    ordered = in_bound_order(scored)
    # seeds: the even splits of the first candidates by bound, so that the bound prunes from the start
    head = list(itertools.islice(ordered, SEED_WINDOW))
    for s in [s for s in head if s.uniform][:2 * top]:
        _keep(found, s.step, s.uniform.layouts(s.table), SolverInfo(name="uniform", status="none"), target=training.engine)
    for index, s in enumerate(itertools.chain(head, ordered)):
        best_s = min((c.prediction.step_time_s for c in found.values()), default=math.inf)
        if progress:
            progress(index + 1, len(scored), result.solved, best_s if best_s < math.inf else None)
        # the bound proves the best plan only: runner-ups are the best other configurations found
        incumbent = best_s if bounds else math.inf
        if s.bound >= incumbent:
            result.pruned += len(scored) - index
            break
        if bounds and not memory_admits_a_split(s.table):
            result.memory_infeasible += 1
            s.outcome = "memory"
            continue
        if bounds and memory_aware_prunes(s.table, s.times.least_work_s, incumbent):  # cached on the shared times
            result.pruned += 1
            s.outcome = "slower"
            continue
        # the ILP optimises the pipeline time: a split must beat the incumbent less the step's floor
        cutoff = incumbent - s.table.outside_pipeline_floor_s if bounds else None
        solved = pool.answer(s.table, cutoff) if bounds else None
        if solved is not None:
            result.answered += 1
        else:
            solved = _solve_split(s.table, time_limit_s, cutoff)
            if solved.status == "unsolved":  # one retry with the other solver before giving up on it
                solved = ilp.solve(s.table, time_limit_s, cutoff=cutoff, solver="cbc")
            pool.add(s.table, solved, cutoff)
            _tally(result, solved)
        result.statuses[solved.status] = result.statuses.get(solved.status, 0) + 1
        if solved.status == "time_limit":
            result.worst_gap = max(result.worst_gap, solved.gap if solved.gap == solved.gap else 1.0)
        if solved.status == "cutoff":  # counted with the ILPs solved (statuses), not again as pruned
            s.outcome = "slower"
            continue
        if solved.status == "infeasible":
            result.memory_infeasible += 1
            s.outcome = "memory"
            continue
        s.outcome = "priced"
        if s.uniform:  # the ILP's split never loses to the even split of its own configuration
            _keep(found, s.step, s.uniform.layouts(s.table), SolverInfo(name="uniform", status="none"),
                  target=training.engine)
        if solved.split is None:
            continue
        _keep(found, s.step, solved.split.layouts(s.table), _info(solved), replace=True, target=training.engine)
    result.time_s = time.perf_counter() - start
    if not found:
        raise _infeasible(model, training, cluster, devices, limits)
    result.ranked = _ranked(found, top)
    if bounds:
        result.ranked = _solve_shown_seeds(found, scored, top, time_limit_s, training.engine, result)
    result.notes += fsdp_ep_notes(model, found, scored, result.ranked[0], training.engine)
    return result


def _ranked(found: dict, top: int) -> list[Candidate]:
    return sorted(found.values(), key=lambda c: c.prediction.step_time_s)[:top]


def _solve_shown_seeds(found: dict, scored: list, top: int, time_limit_s: float, target: str | None,
                       result: SearchResult) -> list[Candidate]:
    """The top `top` with every row's split solved: a runner-up still on its even seed (its ILP cut off by the
    best plan, which the bound needs no more of) gets its own split solved, so that the row copied into
    `estimate` prices as shown (estimate solves that one configuration). A solved row may move and another come
    up: until no row shown is an unsolved seed (a seed the ILP's split does not beat stays, marked solver
    `uniform`)."""
    by_config = {s.step.config: s for s in scored}
    tried: set = set()
    ranked = _ranked(found, top)
    while seeds := [c for c in ranked if c.solver.name == "uniform" and c.config in by_config and c.config not in tried]:
        for c in seeds:
            tried.add(c.config)
            s = by_config[c.config]
            solved = _solve_split(s.table, time_limit_s, None)
            _tally(result, solved)
            if solved.split is not None:
                _keep(found, s.step, solved.split.layouts(s.table), _info(solved), replace=True, target=target)
        ranked = _ranked(found, top)
    return ranked


def _tally(result: SearchResult, solved: ilp.SolveResult) -> None:
    """One split solved, counted by its solver and time."""
    result.solved += 1
    result.solvers[solved.solver] = result.solvers.get(solved.solver, 0) + 1
    result.solver_time_s += solved.time_s


def _info(solved: ilp.SolveResult) -> SolverInfo:
    return SolverInfo(name=solved.solver, status=solved.status, gap=solved.gap, time_s=solved.time_s)


def fsdp_ep_notes(model: ModelSpec, found: dict, scored: list, best: Candidate, target: str | None) -> list[str]:
    """Why FSDP with expert parallel (weights sharded with ep > 1: torchtitan's default, Megatron-FSDP) did not
    win a mixture of experts' search: its best plan found and how much slower (or that it ties), or, where none
    was kept, why each of its layouts lost (`_Scored.outcome`: no split in memory, the recomputation it needs,
    a pipeline bound no faster than the best plan); nothing where the winner is one, or the target runs none.
    On an FSDP engine (`MemoryAccounting.states == "fsdp"`) every zero ≥ 1 is FSDP."""
    from gplan.engines import profile_of
    from gplan.spec.parallel import recompute_mix

    least = 1 if profile_of(target).memory.states == "fsdp" else 2

    def fsdp_ep(config: ParallelConfig) -> bool:
        return config.zero >= least and config.ep > 1

    if not model.is_moe or fsdp_ep(best.config):
        return []
    best_s = best.prediction.step_time_s
    priced = [c for c in found.values() if fsdp_ep(c.config)]
    if priced:
        c = min(priced, key=lambda c: c.prediction.step_time_s)
        change = c.prediction.step_time_s / best_s - 1
        said = "ties the best plan (it differs in what it shards)" if abs(change) < 1e-6 else f"{change:+.1%} on the best plan"
        label = c.config.label(recompute_mix(c.layouts, c.config.recompute_modules))  # what its stages recompute
        return [f"FSDP + EP at its best: {c.prediction.step_time_s:.2f} s, {said} — {label}"]
    layouts = [s for s in scored if fsdp_ep(s.step.config)]
    if not layouts:
        return []
    why = []
    if memory := sum(s.outcome in ("memory", "priced") for s in layouts):  # priced, yet not kept: did not fit
        why.append(f"{memory} leave no split within the memory budget")
    if slower := sum(s.outcome == "slower" for s in layouts):
        why.append(f"{slower} cannot beat it with the recomputation they need to fit")
    if bounded := [s.bound for s in layouts if s.outcome == "bound"]:
        why.append(f"{len(bounded)} are at least {min(bounded):.2f} s by their pipeline bound "
                   f"({min(bounded) / best_s - 1:+.1%})")
    return [f"FSDP + EP: none of its {len(layouts)} layouts searched beats the best plan — " + "; ".join(why)]


def in_bound_order(scored: list[_Scored]):
    """The candidates by `lower_bound_s` with their floor outside the pipeline (`floor_s`), priced
    lazily: each starts keyed by its pipeline bound alone — lower, since the floor is ≥ 0 — and is
    priced when that key reaches the front, then re-queued under its full bound. A candidate is yielded
    when its full bound leads the queue, so the order is that of the full bounds (ties by `order`),
    and one whose pipeline bound never reaches the front before the search stops is never priced. The
    full bound is the pipeline bound plus the floor (`lower_bound_s` adds the floor last)."""
    queue = [(s.bound, s.order, False, s) for s in scored]
    heapq.heapify(queue)
    while queue:
        _, order, priced, s = heapq.heappop(queue)
        if priced:
            yield s
            continue
        s.floor_s = floor_s(s.step, s.times)
        s.bound += s.floor_s
        heapq.heappush(queue, (s.bound, order, True, s))


def _solve_split(table: CostTable, time_limit_s: float, cutoff: float | None) -> ilp.SolveResult:
    """The ILP, bounded first by the exact dynamic program on one node group (planner.split_exact): a table
    whose least objective cannot beat the cut-off, or in which nothing fits, is settled by that bound;
    otherwise the ILP starts from the program's split with its objective as a lower bound, so HiGHS
    proves the optimum at the root instead of branching for it."""
    bound = split_exact.solve(table, cutoff)
    if bound is None:
        return ilp.solve(table, time_limit_s, cutoff=cutoff)
    if bound.split is None:  # `cutoff` or `infeasible`: the bound is the proof
        return bound
    return ilp.solve(table, time_limit_s, cutoff=cutoff, incumbent=bound.split, least=bound.split.objective)


#: Candidates, first by bound, whose even splits seed the ranking.
SEED_WINDOW = 64


@dataclass
class _Scored:
    bound: float
    """`lower_bound_s(times)`: the pipeline bound alone until `in_bound_order` prices the floor."""
    order: int
    step: StepModel
    times: CostTable
    """Its time table (shared by the zero levels of one layout, its floor 0); `table` adds the memory
    terms and the floor when the search visits it."""
    floor_s: float = 0.0
    """Its floor outside the pipeline, once `in_bound_order` prices it."""
    outcome: str = "bound"
    """What the search made of it: `bound` (never solved: its bound reached the best plan's time first), `memory`
    (no split fits the memory budget), `slower` (a split fits, but none beats the best plan once memory is priced:
    the recomputation it needs to fit) or `priced` (a plan was kept)."""

    @cached_property
    def table(self) -> CostTable:
        return build_table(self.step, self.times.options, times=self.times, outside_floor_s=self.floor_s)

    @cached_property
    def uniform(self) -> Split | None:
        """The best even split (one recompute option for every layer) that fits, or None."""
        splits = [u for k in range(len(self.table.options)) if (u := uniform_split(self.table, k))]
        return min(splits, key=lambda u: u.objective) if splits else None


def _keep(found: dict, step: StepModel, layouts: list[StageLayout], info: SolverInfo, replace: bool = False,
          target: str | None = None) -> None:
    """Re-price a split as the target runs it (its engine's recompute granularity and splitting rule,
    `targets.runs_as`) with the cost model, and keep it if it fits (the ILP's result supersedes the
    uniform seed of the same configuration when it is at least as fast)."""
    if target:
        layouts = runs_as(TARGETS[target], step.model, step.config, layouts)
    prediction = step.predict(layouts)
    if not prediction.fits:
        return
    config = step.config
    if config.recompute_modules != DEFAULT_RECOMPUTE_MODULES and not any(
            c.recompute == "selective" and c.count for s in layouts for c in s.layers):
        # no layer recomputes selectively, so its modules change nothing: one plan, written with the default
        config = config.model_copy(update={"recompute_modules": DEFAULT_RECOMPUTE_MODULES})
    old = found.get(config)
    if old is None or (replace and prediction.step_time_s <= old.prediction.step_time_s * (1 + 1e-9)):
        found[config] = Candidate(config, layouts, prediction, info, step.cluster)


def _no_candidate(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, devices: int,
                  limits: SearchLimits) -> InfeasibleError:
    """No configuration at all: the rules and limits leave none, or the target runs none of them (say
    which capability, and what avoids it)."""
    target = training.engine
    unbound = training.model_copy(update={"engine": None})
    refused = next(candidates(model, unbound, cluster, devices, limits), None) if target else None
    if refused is not None:  # there are configurations; the target runs none of them
        m = refused.microbatches_for(training.gbs)
        why = config_refusals(TARGETS[target], model, refused, m, training.precision)[0]
        runners = [name for name, t in TARGETS.items()
                   if name != target and not config_refusals(t, model, refused, m, training.precision)]
        return InfeasibleError(f"no configuration of {devices} devices that {target} runs as priced: "
                               f"{why.detail}" + (f"; {', '.join(runners)} run{'s' if len(runners) == 1 else ''} it"
                                                  if runners else ""),
                               hint=why.avoid if "--target" in why.avoid or not runners
                               else f"{why.avoid}, or --target {runners[0]}")
    return InfeasibleError(_no_candidate_message(model, training, devices, limits),
                           hint="relax --tp/--pp/--mbs/--gbs so that dp·tp·pp·cp can equal the devices")


def _no_candidate_message(model: ModelSpec, training: TrainingSpec, devices: int, limits: SearchLimits) -> str:
    asked = ", ".join(f"{name}={getattr(limits, name)}" for name in ("tp", "pp", "dp", "cp", "mbs", "vpp")
                      if getattr(limits, name))
    return (f"no configuration of {devices} devices satisfies the rules"
            + (f" and the limits {asked}" if asked else "")
            + f" (heads {model.num_attention_heads}, layers {model.total_layers}, gbs {training.gbs})")


def _infeasible(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, devices: int,
                limits: SearchLimits) -> InfeasibleError:
    """Say the least that would make it fit within the user's own limits: more devices of this kind, or
    more memory per device (only when that is more than the device has), or full recomputation."""
    device = cluster.primary.hardware
    need_memory = _least_memory_bytes(model, training, cluster, devices, limits)
    more = None
    if not cluster.is_heterogeneous:
        n = devices
        for _ in range(8):
            n *= 2
            if _any_fits(model, training, cluster.sized(n), n, replace(limits, dp=None)):
                more = n
                break
    parts = []
    if more:
        parts.append(f"needs ≥ {more} devices of {device.name}")
    if need_memory and need_memory > device.memory_bytes:
        parts.append(f"or devices with ≥ {math.ceil(need_memory / 1024**3)} GiB")
    if "full" not in limits.recompute:
        parts.append("or allow --recompute full")
    hint = "; ".join(parts) if parts else "lower --mbs or --seq-length, relax --tp/--pp/--zero, or add devices"
    return InfeasibleError(
        f"{model.name} does not fit on {devices} × {device.name} ({device.memory_GiB:g} GiB) with gbs {training.gbs}, "
        f"seq {training.seq_length}" + (" within the limits asked" if _asked(limits) else ""), hint=hint)


def _asked(limits: SearchLimits) -> bool:
    return any(getattr(limits, name) for name in ("tp", "pp", "dp", "cp", "mbs", "vpp", "zero"))


def _lightest(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, devices: int, limits: SearchLimits):
    """The configurations that minimise memory within the user's limits: the heaviest recompute and
    sharding allowed, the smallest micro-batch, no interleaving."""
    recompute = next(o for o in ("full", "selective", "none") if o in limits.recompute)
    zero = [z for z in (3, 2, 1, 0) if z in (limits.zero or [0, 1, 2, 3])]
    lightest = replace(limits, mbs=[min(limits.mbs or [1])], zero=zero, vpp=[1], recompute=[recompute],
                       allow_fewer_devices=False)
    for config in candidates(model, training, cluster, devices, lightest):
        yield config.model_copy(update={"recompute": recompute})


def _any_fits(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, devices: int,
              limits: SearchLimits) -> bool:
    return any(StepModel(model, training, cluster, c).predict().fits
               for c in _lightest(model, training, cluster, devices, limits))


def _least_memory_bytes(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, devices: int,
                        limits: SearchLimits) -> float | None:
    best = None
    for config in _lightest(model, training, cluster, devices, limits):
        p = StepModel(model, training, cluster, config).predict()
        need = p.memory_bytes_per_device_max / (1 - training.memory_headroom)
        best = need if best is None else min(best, need)
    return best
