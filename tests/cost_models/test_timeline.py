"""The schedule simulator: it plays each schedule by its dependency rules and must agree with the
closed-form pipeline time on uniform stages."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gplan.cost_models.pipeline import in_flight_microbatches, pipeline_time_s
from gplan.cost_models.timeline import makespan_s, rank_order, simulate

CASES = [("gpipe", 1, 4, 8), ("1f1b", 1, 4, 8), ("1f1b", 1, 8, 8), ("1f1b", 1, 3, 7),
         ("interleaved_1f1b", 2, 4, 8), ("interleaved_1f1b", 4, 4, 16), ("interleaved_1f1b", 3, 2, 6)]


@pytest.mark.parametrize("schedule, vpp, pp, m", CASES)
def test_uniform_stages_take_the_closed_form_time(schedule, vpp, pp, m):
    ops = simulate([1.0] * pp, [2.0] * pp, m, schedule, vpp)
    assert makespan_s(ops) == pytest.approx(pipeline_time_s([3.0] * pp, m, vpp))


@pytest.mark.parametrize("schedule, vpp, pp, m", CASES)
def test_every_op_runs_once_in_dependency_order_without_overlap(schedule, vpp, pp, m):
    ops = simulate([1.0] * pp, [2.5] * pp, m, schedule, vpp)
    assert len(ops) == 2 * pp * m * vpp
    end = {(op.kind, op.microbatch, op.chunk * pp + op.stage): op for op in ops}
    assert len(end) == len(ops)
    last = pp * vpp - 1
    for (kind, b, virtual), op in end.items():
        if kind == "F" and virtual > 0:
            assert op.start_s >= end["F", b, virtual - 1].end_s
        if kind == "B":
            before = end["F", b, virtual] if virtual == last else end["B", b, virtual + 1]
            assert op.start_s >= before.end_s
    for stage in range(pp):
        mine = sorted((op for op in ops if op.stage == stage), key=lambda op: op.start_s)
        assert all(a.end_s <= b.start_s + 1e-12 for a, b in zip(mine, mine[1:]))


@pytest.mark.parametrize("schedule, vpp", [("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2),
                                           ("interleaved_1f1b", 4), ("interleaved_1f1b", 12)])
@pytest.mark.parametrize("pp, m", [(4, 8), (8, 16), (8, 64), (2, 2)])
def test_activations_held_match_the_memory_models_in_flight_count(schedule, vpp, pp, m):
    """Every rank's peak of forward chunks whose backward has not run, as the schedule plays out, equals
    the memory model's in-flight count (a chunk holds 1/v of the rank's layers)."""
    for rank in range(pp):
        held = peak = 0
        for kind, _, _ in rank_order(rank, pp, m, schedule, vpp):
            held += 1 if kind == "F" else -1
            peak = max(peak, held)
        assert peak / vpp == pytest.approx(in_flight_microbatches(rank, pp, m, schedule, vpp))


def test_the_last_interleaved_rank_holds_what_issue_14_measured():
    """pp = 8: the last rank holds 3.1× (v = 2), 5.1× (v = 4), 6.9× (v = 12) what the old factor
    `1 + (p − 1)/(p·v)` gave it."""
    for vpp, ratio in ((2, 3.1), (4, 5.1), (12, 6.9)):
        old = 1 + 7 / (8 * vpp)
        assert in_flight_microbatches(7, 8, 64, "interleaved_1f1b", vpp) / old == pytest.approx(ratio, abs=0.05)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.2, 3.0), min_size=2, max_size=6), st.integers(1, 10), st.sampled_from(["gpipe", "1f1b"]))
def test_uneven_stages_never_beat_the_bottleneck(forward, m, schedule):
    backward = [2 * f for f in forward]
    ops = simulate(forward, backward, m, schedule)
    assert makespan_s(ops) >= m * max(f + b for f, b in zip(forward, backward)) - 1e-9
