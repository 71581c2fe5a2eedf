"""Answering an ILP from one already solved (docs/design.md, "Search"): configurations that differ only in
what they keep in memory — zero 0/1/2/3 of one layout, above all — have the same stage times, so the same
objective for every split, and one ILP can settle several of them.

Let A be a new cost table and B a solved one with the same times (`times_key`), and A's memory within
B's (`memory_within`: A needs at least B's bytes in every term and may allocate at most B's budget). Then
every split that fits A fits B, so

    OPT(A) ≥ OPT(B).

- B optimal with split S: if S fits A, S is optimal for A (it attains the lower bound OPT(B)); if
  OPT(B) lies above A's cut-off, nothing of A can beat the cut-off either.
- B cut off at c_B (no split of B at or below c_B): A is cut off at any c_A ≤ c_B.
- B infeasible (no split fits B at all): A is infeasible.

Anything else (no containment, S not fitting A, a time-limited B) solves A's own ILP.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gplan.planner.ilp import SolveResult
from gplan.planner.table import CostTable, Split, stage_memory


def times_key(table: CostTable) -> tuple:
    """Equal keys: the same splits exist and each has the same objective."""
    return (table.pp, table.vpp, table.num_microbatches, table.equal_layers, tuple(table.kinds),
            tuple(table.layers_per_kind), tuple(table.options), tuple(table.groups),
            tuple(table.group_stage_capacity), tuple(sorted(table.layer_time_s.items())),
            tuple(sorted(table.fixed_time_s.items())))


def memory_within(a: CostTable, b: CostTable) -> bool:
    """Every split that fits `a` fits `b`: each term of a stage's bytes (fixed, per-layer state, in-flight
    activations, working sets) at least b's, and every budget at most b's."""
    return (all(x >= y for x, y in zip(a.layer_state_bytes, b.layer_state_bytes))
            and all(x >= y for x, y in zip(a.in_flight, b.in_flight))
            and all(a.layer_activation_bytes[key] >= v for key, v in b.layer_activation_bytes.items())
            and all(a.layer_transient_bytes.get(key, 0.0) >= v for key, v in b.layer_transient_bytes.items())
            and all(a.stage_transient_bytes.get(i, 0.0) >= v for i, v in b.stage_transient_bytes.items())
            and all(a.fixed_memory_bytes[key] >= v for key, v in b.fixed_memory_bytes.items())
            and all(x <= y for x, y in zip(a.budget_bytes, b.budget_bytes)))


def fits(table: CostTable, split: Split) -> bool:
    return all(stage_memory(table, counts, i, g) <= table.budget_bytes[g]
               for i, (counts, g) in enumerate(zip(split.counts, split.stage_groups)))


@dataclass
class Solved:
    table: CostTable
    result: SolveResult
    cutoff: float


@dataclass
class SolvedPool:
    """ILPs solved so far, by the stage times of their table."""

    by_times: dict[tuple, list[Solved]] = field(default_factory=dict)

    def add(self, table: CostTable, result: SolveResult, cutoff: float | None) -> None:
        if result.status in ("optimal", "cutoff", "infeasible"):
            entry = Solved(table, result, float("inf") if cutoff is None else cutoff)
            self.by_times.setdefault(times_key(table), []).append(entry)

    def answer(self, table: CostTable, cutoff: float | None) -> SolveResult | None:
        """A's result from a solved B of the module docstring, or None when A needs its own ILP."""
        c_a = float("inf") if cutoff is None else cutoff
        for b in self.by_times.get(times_key(table), []):
            if not memory_within(table, b.table):
                continue
            r = b.result
            if r.status == "infeasible":
                return SolveResult(None, r.solver, "infeasible", float("inf"), 0.0)
            if r.status == "cutoff" and c_a <= b.cutoff:
                return SolveResult(None, r.solver, "cutoff", float("inf"), 0.0)
            if r.status == "optimal":
                if r.split.objective > c_a:
                    return SolveResult(None, r.solver, "cutoff", float("inf"), 0.0)
                if fits(table, r.split):
                    return SolveResult(r.split, r.solver, "optimal", 0.0, 0.0)
        return None
