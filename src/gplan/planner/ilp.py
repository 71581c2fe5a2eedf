"""The stage-split ILP: how many layers of each kind, with which recompute option, on each stage,
and (heterogeneous clusters) which node group runs each stage.

Notation
    i < p       pipeline stages;  q < Q layer kinds in execution order (encoder, decoder, ...)
    k < K       recompute options (none, selective, full);  g < G node groups
    L_q         layers of kind q;  m micro-batches;  v virtual chunks per rank
    t_qkg       seconds of one layer (kind q, option k, group g) per micro-batch, incl. tp/cp comm
    c_ig        fixed seconds of stage i on group g (embedding, head, pipeline sends)
    w_q         state bytes of one layer (weights, grads, optimizer) on one device
    a_qk        activation bytes of one layer per micro-batch in flight;  f_i in-flight micro-batches
    M_ig        fixed allocated bytes of stage i on group g (embedding/head, buffers);  B_g the bytes a
                device of group g can allocate (its budget less reserve and communicators, over 1 +
                its allocator's fragmentation)
    X_k         the working set of a layer with option k in its backward;  X⁰_i that of stage i's loss
    C_g         stages group g can host

Variables
    n[i,q,k,g] ∈ ℤ≥0   layers;  u[i,g] ∈ {0,1} stage i runs on group g (fixed when G = 1)
    z[i,q] ∈ {0,1}     stage i may hold kind q (only when Q > 1);  T_i, T_max ≥ 0
    y[i,k] ∈ {0,1}     stage i holds layers with option k;  W_i ≥ 0 its working set (when any X > 0)

Objective
    minimise (m − 1/v)·T_max + (1/v)·Σ_i T_i       — the pipeline time of cost_models.pipeline;
    data-parallel and optimizer terms are re-added when the cost model re-prices the result.

Constraints
    (1) Σ_{i,k,g} n[i,q,k,g] = L_q                                  every layer placed
    (2) Σ_{q,k,g} n[i,q,k,g] ≥ 1  (= L/p when the schedule is interleaved)   no empty stage
    (3) T_i = Σ n[i,q,k,g]·t_qkg + Σ_g u[i,g]·c_ig ;  T_i ≤ T_max       stage time
    (4) Σ n[i,q,k,g]·(w_q + f_i·a_qk) + W_i + Σ_g u[i,g]·(M_ig − B_g) ≤ 0    stage memory under budget
        W_i ≥ X⁰_i ;  W_i ≥ X_k·y[i,k] ;  Σ_{q,g} n[i,q,k,g] ≤ L·y[i,k]  the largest working set held
    (5) Σ_g u[i,g] = 1 ;  n[i,q,k,g] ≤ L_q·u[i,g] ;  Σ_i u[i,g] ≤ C_g    one group per stage, capacity
    (6) z[i,q] ≤ z[i+1,q] ;  n[i,q,·,·] ≤ L_q·z[i,q] ;  n[i,q,·,·] ≤ L_q·(1 − z[i−1,q+1])
                                                                     kinds stay contiguous, in order

Layers of one kind are interchangeable, so counts (not per-layer binaries) describe a split exactly:
contiguity is free, and the model has O(p·Q·K·G) variables — a 96-layer, 8-stage, 3-option model has
24 integers and solves in milliseconds, where a per-layer binary model takes minutes.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import warnings
from dataclasses import dataclass

import pulp

from gplan.cost_models.pipeline import pipeline_objective
from gplan.planner.table import CostTable, Split, stage_time, working_set_bytes


@dataclass(frozen=True)
class SolveResult:
    split: Split | None
    solver: str
    status: str
    """`optimal`, `time_limit` (feasible, optimality not proven), `infeasible`, `cutoff` (nothing at
    or below the cut-off) or `unsolved` (no solution: an error, or the time limit before a first one)."""
    gap: float
    time_s: float


@contextlib.contextmanager
def _quiet_stdout():
    """HiGHS prints its banner on the process's stdout, which must carry only --json data."""
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


class _StartedHiGHS(pulp.HiGHS):
    """HiGHS given the variables' initial values as its first incumbent (PuLP's in-process HiGHS has
    no warm start of its own)."""

    def callSolver(self, lp):
        import highspy

        start = highspy.HighsSolution()
        start.col_value = [v.varValue if v.varValue is not None else 0.0 for v in lp.variables()]
        start.value_valid = True
        lp.solverModel.setSolution(start)
        lp.solverModel.run()


def _solver(time_limit_s: float, cutoff: float | None, prefer: str = "highs", started: bool = False):
    # objective_bound lets HiGHS prune every node that cannot beat the search's incumbent.
    options = {"objective_bound": cutoff} if cutoff is not None and cutoff < float("inf") else {}
    if started:  # its primal heuristic hunts for a first solution, which the start already is: 4-5 ms a solve
        options["mip_heuristic_run_feasibility_jump"] = False
    highs = (_StartedHiGHS if started else pulp.HiGHS)(msg=False, timeLimit=time_limit_s, **options)
    if prefer == "highs" and highs.available():
        return "highs", highs
    with warnings.catch_warnings():  # PuLP 3 deprecates the bundled CBC's class name, not the solver
        warnings.simplefilter("ignore", DeprecationWarning)
        return "cbc", pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s)


def solve(table: CostTable, time_limit_s: float = 10.0, cutoff: float | None = None,
          solver: str = "highs", incumbent: Split | None = None, least: float | None = None) -> SolveResult:
    """Build and solve the ILP of the module docstring. With `cutoff`, only splits whose objective is
    at most the cutoff are of interest: HiGHS prunes with it, and when the best split found lies above
    it (or none is found), the result is status `cutoff` without a split. `incumbent`: a split HiGHS
    starts from; `least`: a proven lower bound on the objective (planner.split_exact's), added as
    the valid inequality objective ≥ least — with a start that meets it, the root closes the gap."""
    start = time.perf_counter()
    p, Q, K, G = table.pp, len(table.kinds), len(table.options), table.groups
    prob = pulp.LpProblem("stage_split", pulp.LpMinimize)
    n = {(i, q, k, g): pulp.LpVariable(f"n_{i}_{q}_{k}_{g}", 0, table.layers_per_kind[q], cat="Integer")
         for i in range(p) for q in range(Q) for k in range(K) for g in G}
    multi_group = len(G) > 1
    u = {(i, g): (pulp.LpVariable(f"u_{i}_{g}", cat="Binary") if multi_group else 1)
         for i in range(p) for g in G}
    T = [pulp.LpVariable(f"T_{i}", 0) for i in range(p)]
    t_max = pulp.LpVariable("T_max", 0)
    objective = pipeline_objective(t_max, pulp.lpSum(T), table.num_microbatches, table.vpp)
    prob += objective
    if least is not None:  # valid: no split has a smaller objective (1e-9 leaves the solver its tolerance)
        prob += objective >= least * (1 - 1e-9)

    for q in range(Q):  # (1)
        prob += pulp.lpSum(n[i, q, k, g] for i in range(p) for k in range(K) for g in G) == table.layers_per_kind[q]
    for i in range(p):
        layers_i = pulp.lpSum(n[i, q, k, g] for q in range(Q) for k in range(K) for g in G)
        if table.equal_layers:  # (2)
            prob += layers_i == table.total_layers // p
        else:
            prob += layers_i >= table.stage_min_layers(i)
        prob += T[i] == pulp.lpSum(n[i, q, k, g] * table.layer_time_s[q, k, g]  # (3)
                                   for q in range(Q) for k in range(K) for g in G) + \
            pulp.lpSum(u[i, g] * table.fixed_time_s[i, g] for g in G)
        prob += T[i] <= t_max
        working = _working_set(prob, table, n, i, Q, K, G)
        prob += pulp.lpSum(  # (4)
            n[i, q, k, g] * (table.layer_state_bytes[q] + table.in_flight[i] * table.layer_activation_bytes[q, k])
            for q in range(Q) for k in range(K) for g in G) + working + pulp.lpSum(
            u[i, g] * (table.fixed_memory_bytes[i, g] - table.budget_bytes[g]) for g in G) <= 0
    if multi_group:  # (5)
        for i in range(p):
            prob += pulp.lpSum(u[i, g] for g in G) == 1
            for q in range(Q):
                for k in range(K):
                    for g in G:
                        prob += n[i, q, k, g] <= table.layers_per_kind[q] * u[i, g]
        for g, capacity in zip(G, table.group_stage_capacity):
            prob += pulp.lpSum(u[i, g] for i in range(p)) <= capacity
    if Q > 1:  # (6)
        z = {(i, q): pulp.LpVariable(f"z_{i}_{q}", cat="Binary") for i in range(p) for q in range(Q)}
        for i in range(p):
            prob += z[i, 0] == 1
            for q in range(Q):
                held = pulp.lpSum(n[i, q, k, g] for k in range(K) for g in G)
                prob += held <= table.layers_per_kind[q] * z[i, q]
                if i + 1 < p:
                    prob += z[i, q] <= z[i + 1, q]
                if i >= 1 and q + 1 < Q:
                    prob += held <= table.layers_per_kind[q] * (1 - z[i - 1, q + 1])

    if incumbent is not None:
        _set_start(prob, table, incumbent)
    name, backend = _solver(time_limit_s, cutoff, solver, started=incumbent is not None)
    with _quiet_stdout():
        prob.solve(backend)
    elapsed = time.perf_counter() - start
    if prob.sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        # Infeasible with a cut-off means "nothing at or below the cut-off": a valid bound, not a proof
        # that no split fits. Anything else without a solution (an error, or the time limit reached
        # before a first solution) proves nothing: "unsolved".
        status = "infeasible" if prob.status == pulp.LpStatusInfeasible else "unsolved"
        if status == "infeasible" and cutoff is not None and cutoff < float("inf"):
            status = "cutoff"
        return SolveResult(None, name, status, float("inf"), elapsed)
    optimal = prob.sol_status == pulp.LpSolutionOptimal
    gap = _gap(prob, name) if not optimal else 0.0
    gap = gap if gap == gap and gap != float("inf") else 1.0  # no dual bound yet: nothing proven
    counts = [[[sum(round(pulp.value(n[i, q, k, g])) for g in G) for k in range(K)] for q in range(Q)]
              for i in range(p)]
    groups = [next(g for g in G if not multi_group or pulp.value(u[i, g]) > 0.5) for i in range(p)]
    # Price the integer solution exactly; the solver's T_i carry its feasibility tolerance.
    stage_times = [stage_time(table, counts[i], i, groups[i]) for i in range(p)]
    split = Split(counts=counts, stage_groups=groups, objective=table.objective(stage_times))
    if not optimal and least is not None:  # the given lower bound may close what HiGHS left open
        gap = min(gap, max(0.0, (split.objective - least) / split.objective))
        optimal = gap <= 1e-9
    if cutoff is not None and split.objective > cutoff:
        # proven above the cut-off only when optimal; a time-limited incumbent above it proves nothing
        if optimal:
            return SolveResult(None, name, "cutoff", float("inf"), elapsed)
        return SolveResult(None, name, "time_limit", gap, elapsed)
    return SolveResult(split, name, "optimal" if optimal else "time_limit", gap, elapsed)


def _set_start(prob: pulp.LpProblem, table: CostTable, start: Split) -> None:
    """Every variable's value at `start`: layer counts, stage times, the kinds begun by each stage (z),
    the options each holds (y) and its working set (W)."""
    values: dict[str, float] = {}
    p, Q, K = table.pp, len(table.kinds), len(table.options)
    times = [stage_time(table, start.counts[i], i, start.stage_groups[i]) for i in range(p)]
    for i in range(p):
        g = start.stage_groups[i]
        for q in range(Q):
            for k in range(K):
                values[f"n_{i}_{q}_{k}_{g}"] = start.counts[i][q][k]
            values[f"z_{i}_{q}"] = float(any(sum(start.counts[j][q]) for j in range(i + 1)))
        for gg in table.groups:
            values[f"u_{i}_{gg}"] = float(gg == g)
        used = [k for k in range(K) if any(start.counts[i][q][k] for q in range(Q))]
        for k in range(K):
            values[f"y_{i}_{k}"] = float(k in used)
        values[f"W_{i}"] = working_set_bytes(table, i, used)
        values[f"T_{i}"] = times[i]
    values["T_max"] = max(times)
    for v in prob.variables():
        v.setInitialValue(values.get(v.name, 0.0))


def _working_set(prob: pulp.LpProblem, table: CostTable, n: dict, i: int, Q: int, K: int, G: list[int]):
    """W_i of (4): the largest working set among the options stage i holds, and its loss's — a
    constant when every option's is the same, else one binary per option."""
    loss = table.stage_transient_bytes.get(i, 0.0)
    per_option = [table.option_transient(k) for k in range(K)]
    if len(set(per_option)) <= 1:
        return max([loss] + per_option)
    w = pulp.LpVariable(f"W_{i}", 0)
    prob += w >= loss
    for k in range(K):
        y = pulp.LpVariable(f"y_{i}_{k}", cat="Binary")
        prob += pulp.lpSum(n[i, q, k, g] for q in range(Q) for g in G) <= table.total_layers * y
        prob += w >= per_option[k] * y
    return w


def _gap(prob: pulp.LpProblem, name: str) -> float:
    model = getattr(prob, "solverModel", None)
    if name == "highs" and model is not None:
        return float(model.getInfo().mip_gap)
    return float("nan")
