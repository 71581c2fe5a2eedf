"""Pipeline schedules: step time from per-stage times, and micro-batches in flight per stage.

With T_i the time of stage i for one micro-batch (forward + backward + its sends), m micro-batches and
v virtual chunks per rank:

    step = m · max_i T_i + (Σ_i T_i − max_i T_i) / v

For v = 1 this is `Σ T_i + (m − 1)·max T_i` (docs/design.md, "Cost model"); for uniform stages it gives the bubble
fraction `(p − 1)/m` of 1F1B and GPipe and `(p − 1)/(m·v)` of interleaved 1F1B (Narayanan et al. 2021,
§2.2). The formula is linear in (T_max, T_i), which is what the ILP needs.
"""

from __future__ import annotations


def pipeline_time_s(stage_times_s: list[float], num_microbatches: int, vpp: int = 1) -> float:
    return pipeline_objective(max(stage_times_s), sum(stage_times_s), num_microbatches, vpp)


def pipeline_objective(longest_s, total_s, num_microbatches: int, vpp: int = 1):
    """The same formula in (T_max, Σ T_i): `m·T_max + (Σ T_i − T_max)/v`. Linear, so the ILP's objective
    and the search's bounds (with T_max and Σ T_i replaced by their bounds) are this one function; it
    takes numbers or solver expressions alike."""
    return num_microbatches * longest_s + (total_s - longest_s) / vpp


def bubble_time_s(stage_times_s: list[float], vpp: int = 1) -> float:
    """The part of the step a stage waits: `(Σ T_i − max T_i)/v`."""
    return (sum(stage_times_s) - max(stage_times_s)) / vpp


def in_flight_microbatches(stage: int, pp: int, num_microbatches: int, schedule: str, vpp: int = 1) -> float:
    """Micro-batches' worth of activations stage `stage` (0-based) holds at its peak.

    GPipe: all m. 1F1B: `min(p − i, m)` (the first stage holds p). Interleaved 1F1B: rank i runs a
    warm-up of `w_i = min(2·(p − i − 1) + (v − 1)·p, m·v)` forward chunks before its first backward
    (Megatron-LM's `get_num_warmup_microbatches`), so it holds `min(w_i + 1, m·v)` chunks of 1/v of its
    layers each: `min(w_i + 1, m·v)/v`. For the first rank that is `p + (p − 1)/v`, Korthikanti et al.'s
    `p·(1 + (p − 1)/(p·v))`; the later ranks hold more than that factor applied to `p − i` suggests — the
    last rank of p = 8 with v = 2 holds 4.5, not 1.44 (the schedule simulator counts the same)."""
    if schedule == "gpipe":
        return float(num_microbatches)
    if schedule == "interleaved_1f1b":
        total = num_microbatches * vpp
        warmup = min(2 * (pp - stage - 1) + (vpp - 1) * pp, total)
        return min(warmup + 1, total) / vpp
    return float(min(pp - stage, num_microbatches))
