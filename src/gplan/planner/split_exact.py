"""A bound and a start for the stage-split ILP on one or two node groups: the ILP's problem (planner/ilp.py,
same notation) solved exactly by dynamic programming, with structure a MIP solver does not see.

The ILP stays the solver. The search uses this program's optimum as a lower bound — a table whose
least objective cannot beat the best plan (or where nothing fits) needs no ILP — and hands the rest to
the ILP with the program's split as its first incumbent and its objective as a valid inequality, so
HiGHS closes the gap at the root (deep pipelines took it seconds to minutes of branching before).

With one node group a stage holds a contiguous range [s, e) of the layer sequence (the ILP's (1) and
(6): kinds in execution order, layers of a kind interchangeable), and the recompute mix it runs inside
that range concerns no other stage. So

    T*_i(s, e) = c_i + min { Σ_qk n_qk·t_qk  :  Σ_k n_qk = N_q(s, e),  stage i's memory (4) ≤ 0 }

is stage i's fastest memory-feasible mix over the range, and for a bound τ on the longest stage

    D(τ) = min over cuts 0 = s_0 < s_1 < … < s_p = L  of  Σ_i T*_i(s_i, s_{i+1}),   every T*_i ≤ τ,

each range at least `stage_min_layers(i)` long (exactly L/p with `equal_layers`): the ILP's (2). The
ILP's objective (m − 1/v)·T_max + Σ_i T_i / v is at least (m − 1/v)·τ + D(τ)/v at τ = its own T_max and
equals it for the optimal split, so

    OPT = min over τ ∈ {T*_i(s, e)} of (m − 1/v)·τ + D(τ)/v.

τ₀, the least feasible longest stage, is one min-max pass of the same recursion; D is non-increasing,
so past τ₀ only the τ with (m − 1/v)·(τ − τ₀) ≤ (D(τ₀) − D(∞))/v can do better, and they are scanned.

The inner minimum is exact too. For each set S of options a stage may hold (its working set W_S: the
largest of theirs and its loss's), one option's count is enumerated and the other two follow in closed
form — memory and time are linear in them, so the optimum sits at an end of the feasible interval. A
mix found under S really fits (its options' working sets are at most W_S), and the optimal mix is found
under its own S: the minimum over S is the exact one.

It covers one or two node groups (with two, the recursion also counts the stages on the first group,
each group hosting at most its capacity: the ILP's (5)) and at most two layer kinds (the first, at most
`SMALL_KIND` layers, enumerated); `solve` returns None otherwise and the ILP runs unaided. Tested against the ILP and brute force on random instances
(tests/planner/test_split_exact.py).
"""

from __future__ import annotations

import itertools
import time

import numpy as np

from gplan.planner.ilp import SolveResult
from gplan.planner.table import CostTable, Split, stage_time, working_set_bytes

SMALL_KIND = 8
"""With two kinds, the first may have at most this many layers: its mixes on a stage that straddles the
boundary are enumerated (DeepSeek's dense leading layers)."""
MAX_SCAN = 4000
"""Candidate longest-stage times scanned past τ₀ before handing the table to the ILP."""
INF = float("inf")


def solve(table: CostTable, cutoff: float | None = None) -> SolveResult | None:
    """The optimal split of `table` (status `optimal`), `infeasible`, or `cutoff` when its objective is
    above `cutoff` — as `ilp.solve` reports them; None where this program does not apply."""
    if len(table.groups) > 2 or len(table.kinds) > 2 or (len(table.kinds) == 2 and table.layers_per_kind[0] > SMALL_KIND):
        return None
    start = time.perf_counter()
    alpha, beta = table.num_microbatches - 1 / table.vpp, 1 / table.vpp
    # before any table: the longest stage is at least the average of the least work, so D(∞) is at least
    # alpha·W/p + beta·W — the cut-off most candidates meet, settled without building T*
    if cutoff is not None and (alpha / table.pp + beta) * table.least_work_s > cutoff * (1 + 1e-12):
        return SolveResult(None, "exact", "cutoff", INF, time.perf_counter() - start)
    per_group = [range_times(table, g) for g in table.groups]
    stage_s = np.stack([times for times, _ in per_group])  # (G, p, L + 1, L + 1)
    recursion = _Recursion(stage_s, table.group_stage_capacity if len(table.groups) > 1 else None)
    tau0 = recursion.bottleneck()
    if tau0 == INF:
        return SolveResult(None, "exact", "infeasible", INF, time.perf_counter() - start)
    def above_cutoff(least_sum: float) -> bool:
        return cutoff is not None and alpha * tau0 + beta * least_sum > cutoff * (1 + 1e-12)

    # D(∞) is at least the least work (each T*_i its fixed time and its layers' cheapest times): a bound
    # that settles most cut-offs before the min-sum pass
    if above_cutoff(table.least_work_s):
        return SolveResult(None, "exact", "cutoff", INF, time.perf_counter() - start)
    unbounded = recursion.least_sum(INF)[0]
    if above_cutoff(unbounded):
        return SolveResult(None, "exact", "cutoff", INF, time.perf_counter() - start)
    best_tau, best = tau0, alpha * tau0 + beta * recursion.least_sum(tau0)[0]
    finite = stage_s[np.isfinite(stage_s)]
    if alpha > 0:
        values = np.unique(finite)
        window = values[(values > tau0) & (values <= tau0 + (best - alpha * tau0 - beta * unbounded) / alpha)]
    else:  # one micro-batch, no interleaving: only Σ T_i counts
        window = np.array([finite.max()])
    if len(window) > MAX_SCAN:
        return None
    for tau in window:
        if alpha * tau + beta * unbounded >= best:
            break
        value = alpha * tau + beta * recursion.least_sum(tau)[0]
        if value < best:
            best_tau, best = tau, value
    stages = recursion.least_sum(best_tau, track=True)[1]  # (group index, start, end) per stage
    groups = [table.groups[j] for j, _, _ in stages]
    counts = [per_group[j][1][i](a, b) for i, (j, a, b) in enumerate(stages)]
    split = Split(counts=counts, stage_groups=groups,
                  objective=table.objective([stage_time(table, counts[i], i, groups[i]) for i in range(table.pp)]))
    elapsed = time.perf_counter() - start
    if cutoff is not None and split.objective > cutoff:
        return SolveResult(None, "exact", "cutoff", INF, elapsed)
    return SolveResult(split, "exact", "optimal", 0.0, elapsed)


# ---- the recursion over stages -----------------------------------------------------------------------

class _Recursion:
    """The min-max and min-sum recursions over cut points. With two node groups the state also counts
    the stages placed on the first group, which may host at most `capacity[0]` of them (the second
    `capacity[1]`): the ILP's (5)."""

    def __init__(self, stage_s: np.ndarray, capacity: list[int] | None):
        self.stage_s, self.capacity = stage_s, capacity
        self.groups, self.p, self.n = stage_s.shape[0], stage_s.shape[1], stage_s.shape[2]
        # one group: no count to track (a single column), p + 1 times less work per stage
        self.counts = self.p + 1 if capacity is not None else 1

    def _start(self) -> np.ndarray:
        first = np.full((self.n, self.counts), INF)  # (end of the stages so far, stages on group 0)
        first[0, 0] = 0.0
        return first

    def _admissible(self, i: int) -> np.ndarray:
        """Counts of group-0 stages possible after stage i."""
        on_first = np.arange(self.counts)
        if self.capacity is None:
            return on_first == 0
        return (on_first <= min(i + 1, self.capacity[0])) & (i + 1 - on_first <= self.capacity[1])

    def _step(self, state: np.ndarray, i: int, combine, tau: float = INF, track: bool = False):
        """One stage: each group's best predecessor (start s) for every (end, count)."""
        best, came_from, on_group = np.full_like(state, INF), None, None
        if track:
            came_from = np.zeros(state.shape, dtype=np.int64)
            on_group = np.zeros(state.shape, dtype=np.int64)
        for j in range(self.groups):
            times = self.stage_s[j, i]
            times = np.where(times <= tau, times, INF)
            shift = 1 if (j == 0 and self.capacity is not None) else 0
            before = state[:, :self.counts - shift]
            candidates = combine(before[:, None, :], times[:, :, None])  # (start, end, count before)
            value = candidates.min(axis=0)
            target = best[:, shift:]
            better = value < target
            best[:, shift:] = np.where(better, value, target)
            if track:
                came_from[:, shift:] = np.where(better, candidates.argmin(axis=0), came_from[:, shift:])
                on_group[:, shift:] = np.where(better, j, on_group[:, shift:])
        best[:, ~self._admissible(i)] = INF
        return best, came_from, on_group

    def bottleneck(self) -> float:
        """min over splits of max_i T*_i: the least feasible longest stage (∞ when nothing fits)."""
        state = self._start()
        for i in range(self.p):
            state = self._step(state, i, np.maximum)[0]
        return float(state[-1].min())

    def least_sum(self, tau: float, track: bool = False) -> tuple[float, list[tuple[int, int, int]]]:
        """D(τ) and, with `track`, each stage's (group index, start, end)."""
        state, trail = self._start(), []
        for i in range(self.p):
            state, came_from, on_group = self._step(state, i, np.add, tau, track)
            trail.append((came_from, on_group))
        total = float(state[-1].min())
        stages: list[tuple[int, int, int]] = []
        if track and total < INF:
            end, count = self.n - 1, int(state[-1].argmin())
            for came_from, on_group in reversed(trail):
                j, begin = int(on_group[end, count]), int(came_from[end, count])
                stages.append((j, begin, end))
                if j == 0 and self.capacity is not None:
                    count -= 1
                end = begin
            stages.reverse()
        return total, stages


# ---- T*_i(s, e) ----------------------------------------------------------------------------------------

def range_times(table: CostTable, g: int) -> tuple[np.ndarray, list]:
    """T*_i(s, e) for every stage and allowed range (∞ elsewhere), and a function giving the mix
    counts[q][k] of stage i over (s, e)."""
    p, total = table.pp, table.total_layers
    least = [total // p if table.equal_layers else max(1, table.stage_min_layers(i)) for i in range(p)]
    starts, ends = np.meshgrid(np.arange(total + 1), np.arange(total + 1), indexing="ij")
    allowed = np.zeros((p, total + 1, total + 1), dtype=bool)
    for i in range(p):
        lo, hi = sum(least[:i]), total - sum(least[i + 1:])
        ok = (starts >= lo) & (ends <= hi) & (ends - starts >= least[i])
        if table.equal_layers:
            ok &= (ends - starts == total // p) & (starts == i * (total // p))
        allowed[i] = ok
    fixed_s = np.array([table.fixed_time_s[i, g] for i in range(p)])
    if len(table.kinds) == 1:
        times, mix = _kind_table(table, g, 0, _stage_caps(table, g))
        stage_s = np.where(allowed, times[:, np.clip(ends - starts, 0, total)], INF) + fixed_s[:, None, None]
        return stage_s, [lambda s, e, i=i: [mix[i, e - s].tolist()] for i in range(p)]
    return _two_kinds(table, g, allowed, starts, ends, fixed_s)


def _masks(k: int) -> list[tuple[int, ...]]:
    """Every non-empty set of options a stage may hold."""
    return [c for r in range(1, k + 1) for c in itertools.combinations(range(k), r)]


def _stage_caps(table: CostTable, g: int) -> np.ndarray:
    """(p, masks): bytes left for the layers of stage i holding options S — the budget less the fixed
    bytes and the working set W_S (the largest of S's and the stage's loss's)."""
    return np.array([[table.budget_bytes[g] - table.fixed_memory_bytes[i, g] - working_set_bytes(table, i, mask)
                       for mask in _masks(len(table.options))] for i in range(table.pp)])


def _per_layer(table: CostTable, g: int, q: int) -> tuple[np.ndarray, np.ndarray]:
    """Kind q's seconds per option (K,) and bytes per option on each stage (p, K): state plus the
    stage's in-flight micro-batches of activations."""
    K = len(table.options)
    t = np.array([table.layer_time_s[q, k, g] for k in range(K)])
    m = np.array([[table.layer_state_bytes[q] + table.in_flight[i] * table.layer_activation_bytes[q, k]
                   for k in range(K)] for i in range(table.pp)])
    return t, m


def _kind_table(table: CostTable, g: int, q: int, caps: np.ndarray, rows: np.ndarray | None = None,
                only: tuple[int, ...] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The fastest mix of n layers of kind q within each row's bytes: (rows, n) seconds (∞ where none
    fits) and (rows, n, K) counts. Rows are stages (caps (p, masks)) or, with `rows` giving each row's
    stage, a batch with its own caps; `only`: the one option set to use (the mixes over a set include
    those over its subsets)."""
    t, m = _per_layer(table, g, q)
    m = m if rows is None else m[rows]
    K, R, full = len(table.options), caps.shape[0], table.layers_per_kind[q]
    tol = 1e-12 * max(abs(b) for b in table.budget_bytes)
    best = np.full((R, full + 1), INF)
    mix = np.zeros((R, full + 1, K), dtype=np.int64)
    nmax = _most_layers(caps, m, full)  # more than this fits on no row: left at ∞
    n = np.arange(nmax + 1)[None, :]
    for j, mask in enumerate(_masks(K)):
        if only is not None and mask != only:
            continue
        cap = caps[:, j][:, None]
        if len(mask) == 1:
            (a,) = mask
            secs = np.where(n * m[:, a:a + 1] <= cap + tol, n * t[a], INF)
            counts = np.zeros((R, nmax + 1, K), dtype=np.int64)
            counts[:, :, a] = n
        else:
            secs, counts = _enumerated(n, cap, t, m, mask, K, tol)
        better = secs < best[:, :nmax + 1]
        best[:, :nmax + 1] = np.where(better, secs, best[:, :nmax + 1])
        mix[:, :nmax + 1] = np.where(better[:, :, None], counts, mix[:, :nmax + 1])
    return best, mix


def _most_layers(caps: np.ndarray, m: np.ndarray, full: int) -> int:
    """The most layers any row could hold: its largest cap over its lightest option's bytes."""
    lightest = m.min(axis=1)
    room = np.max(np.where(lightest > 0, caps.max(axis=1) / np.where(lightest > 0, lightest, 1.0), full))
    return int(min(full, max(0, np.floor(room + 1e-9)))) if np.isfinite(room) else full


def _enumerated(n, cap, t, m, mask, K, tol):
    """Masks of two options: the split between them in closed form; of three: the first option's
    count x enumerated (a third axis), the other two in closed form over the rest."""
    R, N = cap.shape[0], n.shape[1]
    if len(mask) == 2:
        (b, c), rest, cap3, base_s = mask, n[:, :, None], cap[:, :, None], 0.0
    else:
        a, b, c = mask
        x_count = np.arange(N)[None, None, :]
        rest = n[:, :, None] - x_count
        cap3 = cap[:, :, None] - x_count * m[:, a][:, None, None]
        base_s = x_count * t[a]
    secs, on_c, ok = _pair(rest, cap3, t[b], t[c], m[:, b][:, None, None], m[:, c][:, None, None], tol)
    ok &= rest >= 0
    secs = np.where(ok, secs + base_s, INF)
    pick = secs.argmin(axis=2)
    best = np.take_along_axis(secs, pick[:, :, None], 2)[:, :, 0]
    counts = np.zeros((R, N, K), dtype=np.int64)
    rest_b = np.broadcast_to(rest, secs.shape)
    on_c_b = np.broadcast_to(on_c, secs.shape)
    chosen_rest = np.take_along_axis(rest_b, pick[:, :, None], 2)[:, :, 0]
    chosen_c = np.take_along_axis(on_c_b, pick[:, :, None], 2)[:, :, 0]
    counts[:, :, c] = chosen_c
    counts[:, :, b] = chosen_rest - chosen_c
    if len(mask) == 3:
        counts[:, :, mask[0]] = np.broadcast_to(n, (R, N)) - chosen_rest
    return best, counts


def _pair(rest, cap, tb, tc, mb, mc, tol):
    """`rest` layers between options b and c within `cap` bytes: (seconds, layers on c, feasible).
    The lighter option's count has a least feasible value; time is linear in it, so the optimum is
    that value, or all of the rest when the lighter option is also the faster."""
    heavy_b = mb >= mc
    mh, ml = np.where(heavy_b, mb, mc), np.where(heavy_b, mc, mb)
    th, tl = np.where(heavy_b, tb, tc), np.where(heavy_b, tc, tb)
    span = mh - ml
    with np.errstate(divide="ignore", invalid="ignore"):
        need = np.where(span > 0, np.ceil((rest * mh - cap) / np.where(span > 0, span, 1.0) - 1e-9),
                        np.where(rest * mh <= cap + tol, 0.0, INF))
    need = np.maximum(need, 0.0)
    finite = np.isfinite(need)
    need = np.where(finite, need, 0.0)
    over = (rest - need) * mh + need * ml > cap + tol  # the ceiling's rounding, either way
    need = np.where(over, need + 1, need)
    under = (need >= 1) & ((rest - need + 1) * mh + (need - 1) * ml <= cap + tol)
    need = np.where(under, need - 1, need)
    light = np.where(tl < th, np.maximum(rest, 0), need)
    ok = finite & (need <= rest)
    light = np.where(ok, light, 0.0)
    secs = (rest - light) * th + light * tl
    ok &= (rest - light) * mh + light * ml <= cap + tol
    on_c = np.where(heavy_b, light, rest - light)
    return secs, on_c.astype(np.int64), ok


def _two_kinds(table, g, allowed, starts, ends, fixed_s):
    """Two kinds: ranges within one kind from that kind's table; ranges across the boundary (possible
    only on the first stages) combine every mix of the first kind's layers with the second's table
    under the bytes the first leaves."""
    p, total = table.pp, table.total_layers
    boundary = table.layers_per_kind[0]
    caps = _stage_caps(table, g)
    first_s, first_mix = _kind_table(table, g, 0, caps)
    second_s, second_mix = _kind_table(table, g, 1, caps)
    n1 = np.clip(np.minimum(ends, boundary) - starts, 0, None)
    n2 = np.clip(ends - np.maximum(starts, boundary), 0, None)
    both = np.full((p, boundary + 1, total - boundary + 1), INF)
    both_mix: dict = {}
    both[:, :, 0] = first_s
    both[:, 0, :] = second_s
    for i in range(p):
        straddles = allowed[i] & (n1 > 0) & (n2 > 0)
        if not straddles.any():
            continue
        # only the first-kind counts a straddling range of this stage can have (one stage: all of them)
        _straddle(table, g, i, caps[i], both[i], both_mix, needed=sorted(set(n1[straddles].tolist())))
    stage_s = np.where(allowed, both[np.arange(p)[:, None, None], n1[None], n2[None]], INF) + fixed_s[:, None, None]

    def mix_of(i):
        def at(s, e):
            a, b = int(n1[s, e]), int(n2[s, e])
            if a and b:
                return both_mix[i, a, b]
            return [first_mix[i, a].tolist(), [0] * len(table.options)] if a else \
                [[0] * len(table.options), second_mix[i, b].tolist()]
        return at
    return stage_s, [mix_of(i) for i in range(p)]


def _straddle(table, g, i, caps_i, both_i, both_mix, needed: list[int] | None = None):
    """Stage i over n1 > 0 layers of the first kind and n2 > 0 of the second: for each option set and
    each mix of the first kind within it, the second kind's fastest mix in the bytes left — for the
    first-kind counts `needed` (the ones the stage's allowed ranges can straddle with; default every one)."""
    K, boundary = len(table.options), table.layers_per_kind[0]
    t1, m1 = _per_layer(table, g, 0)
    for j, mask in enumerate(_masks(K)):
        rows, caps, base, firsts = [], [], [], []
        for n1 in (needed if needed is not None else range(1, boundary + 1)):
            for split in itertools.product(range(n1 + 1), repeat=len(mask)):
                if sum(split) != n1:
                    continue
                counts = [0] * K
                for k, c in zip(mask, split):
                    counts[k] = c
                rows.append(i)
                caps.append(caps_i[j] - float(np.dot(counts, m1[i])))
                base.append(float(np.dot(counts, t1)))
                firsts.append((n1, counts))
        sub_caps = np.full((len(rows), len(_masks(K))), -INF)
        sub_caps[:, j] = caps  # W_S already paid
        secs, mix2 = _kind_table(table, g, 1, sub_caps, rows=np.array(rows), only=mask)
        for r, (n1, counts) in enumerate(firsts):
            total_s = secs[r] + base[r]
            for n2 in range(1, secs.shape[1]):
                if total_s[n2] < both_i[n1, n2]:
                    both_i[n1, n2] = total_s[n2]
                    both_mix[i, n1, n2] = [counts, mix2[r, n2].tolist()]
