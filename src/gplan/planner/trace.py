"""The predicted step as a trace: the Trace Event format that Perfetto and chrome://tracing open.

Everything here is read off the cost model that priced the plan (`repredict`, the schedule simulator of
`cost_models.timeline`, `StepModel`'s data-parallel and optimizer terms): no second copy of the model.

One process per pipeline stage (its first rank stands for all of them: the cost model prices a stage,
not a rank), or one per rank on request. Each process has one track (thread) per stream, so that no two
slices on a track overlap:

    step        the whole predicted step, one slice
    compute     each forward and backward of a micro-batch chunk, as the schedule plays it out
    tp / cp / ep / pp   the collectives a chunk waits on (exposed: the cost model adds them to T_i),
                each cut from its op in the op's share of the stage's time (`timeline.stage_split_s`)
    dp          the data-parallel gradient synchronisation left exposed after the pipeline
    optimizer   the optimizer step; then the step's fixed overhead

A pipeline send is a flow arrow from the sending chunk to the chunk that consumes it. A counter track
per stage plays out its memory: the states held all step, each micro-batch chunk's activations from its
forward until its backward ends, and the backward's transient working set while it runs — its peak is
the stage's predicted memory.

The pipeline phase ends at the cost model's formula `m·T_max + (ΣT_i − T_max)/v` (`pipeline.pipeline_time_s`);
the simulated schedule ends at or before it for the schedules gplan prices, and the gap is shown as the
formula's slack. So the last slice ends at the plan's predicted step time. Timestamps are microseconds,
as the format wants (Chakra's milliseconds are a known misreading).
"""

from __future__ import annotations

from dataclasses import dataclass

from gplan import __version__
from gplan.cost_models import pipeline, timeline
from gplan.cost_models.step import StepModel
from gplan.errors import InputError
from gplan.plan import Plan, Prediction, layouts_of
from gplan.planner.build import repredict

US = 1e6
"""Seconds to the format's microseconds."""
MAX_EVENTS = 4_000_000
"""A trace beyond this many events is more than Perfetto's browser build opens comfortably."""

#: (thread id, track name, the StagePrediction field it carries per micro-batch)
COLLECTIVE_TRACKS = ((2, "tp collectives", "tp_comm_s"), (3, "cp ring exchange", "cp_comm_s"),
                     (4, "ep all-to-all", "ep_comm_s"), (5, "pp send/recv", "pp_comm_s"))
STEP_TID, COMPUTE_TID, DP_TID, OPTIMIZER_TID = 0, 1, 6, 7
TRACK_NAMES = {STEP_TID: "step", COMPUTE_TID: "compute", DP_TID: "dp gradient sync", OPTIMIZER_TID: "optimizer & overhead",
               **{tid: name for tid, name, _ in COLLECTIVE_TRACKS}}


@dataclass(frozen=True)
class StageTail:
    """What a stage does after its last backward: exposed gradient sync, optimizer, overhead (seconds)."""

    dp_s: float
    optimizer_s: float
    overhead_s: float


def predicted_trace(plan: Plan, every_rank: bool = False) -> dict:
    """The plan's predicted step as a Trace Event document (a dict ready for `json.dumps`)."""
    prediction = repredict(plan)
    c = plan.parallel
    m = prediction.num_microbatches
    split = [timeline.stage_split_s(s.forward_s, s.backward_s, s.time_s) for s in prediction.stages]
    ops = timeline.simulate([f for f, _ in split], [b for _, b in split], m, c.schedule, c.vpp)
    pipeline_end_s = pipeline.pipeline_time_s([s.time_s for s in prediction.stages], m, c.vpp)
    tails = stage_tails(plan, prediction)
    simulated_s = timeline.makespan_s(ops)
    processes = _processes(plan, every_rank)
    _check_size(plan, len(ops), len(processes))
    events: list[dict] = []
    for pid, stage, label in processes:
        events += _process_metadata(pid, label)
        events += _stage_events(pid, prediction, stage, [op for op in ops if op.stage == stage], c.vpp)
        events.append(_step_event(pid, prediction.step_time_s, pipeline_end_s, simulated_s))
        events += _tail_events(pid, tails[stage], tails, pipeline_end_s)
        events += _memory_counter(pid, prediction, stage, [op for op in ops if op.stage == stage], pipeline_end_s,
                                  prediction.step_time_s)
    pids_of_stage: dict[int, list[int]] = {}
    for pid, stage, _ in processes:
        pids_of_stage.setdefault(stage, []).append(pid)
    events += _flows(ops, c.pp, c.vpp, pids_of_stage)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "gplan": __version__, "model": plan.model.name, "plan_digest": plan.digest,
            "parallel": c.label(), "schedule": c.schedule, "num_microbatches": m,
            "predicted_step_time_s": prediction.step_time_s,
            "pipeline_formula_s": pipeline_end_s, "pipeline_simulated_s": simulated_s,
            "stage_memory_bytes": [s.memory_bytes for s in prediction.stages],
            "processes": "every rank" if every_rank else "one per pipeline stage (its first rank)",
            "time_unit": "us",
        },
    }


def trace_json(plan: Plan, every_rank: bool = False) -> str:
    """`predicted_trace` as the compact JSON text `gplan explain --trace` writes."""
    import json

    return json.dumps(predicted_trace(plan, every_rank), separators=(",", ":"))


def stage_tails(plan: Plan, prediction: Prediction) -> list[StageTail]:
    """Each stage's exposed gradient synchronisation and optimizer step, as `StepModel.predict` prices them
    (the step waits for the slowest stage's: the breakdown's `dp_comm` and `optimizer` are the maxima)."""
    step = StepModel(plan.model, plan.training, plan.cluster, plan.parallel)
    layouts = layouts_of(plan)
    overhead = prediction.breakdown.overhead
    return [StageTail(step.dp_exposed_s(s, layout), step.optimizer_s(s), overhead)
            for s, layout in zip(prediction.stages, layouts)]


def _processes(plan: Plan, every_rank: bool) -> list[tuple[int, int, str]]:
    """(pid, stage, label): a stage's first rank, or every rank of every stage."""
    out = []
    for stage in plan.stages:
        ranks = stage.ranks if every_rank else [stage.first_rank]
        for rank in ranks:
            device = plan.device_of(rank)
            where = f", node {device.node} device {device.local}"
            label = (f"rank {rank} (stage {stage.index}{where})" if every_rank
                     else f"stage {stage.index}: rank {rank} of {stage.num_ranks}{where}")
            out.append((rank if every_rank else stage.index, stage.index, label))
    return out


def _check_size(plan: Plan, ops: int, processes: int) -> None:
    per_process = ops / max(plan.parallel.pp, 1) * (1 + len(COLLECTIVE_TRACKS)) * 2 + 10
    if per_process * processes > MAX_EVENTS:
        raise InputError(f"--trace-ranks all: {processes} ranks × ~{per_process:,.0f} events is more than a trace "
                         f"viewer opens ({MAX_EVENTS:,})",
                         hint="trace one process per stage (the default): every rank of a stage runs the same step")


def _process_metadata(pid: int, label: str) -> list[dict]:
    events = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": label}},
              {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}}]
    for tid, name in TRACK_NAMES.items():
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    return events


def _stage_events(pid: int, prediction: Prediction, stage: int, ops: list, vpp: int) -> list[dict]:
    """Each op of the stage: its compute, then the collectives it waits on, each on its own track."""
    s = prediction.stages[stage]
    forward_share = s.forward_s / (s.forward_s + s.backward_s)
    events = []
    for op in ops:
        share = forward_share if op.kind == "F" else 1 - forward_share
        compute_s = (s.forward_s if op.kind == "F" else s.backward_s) / vpp
        name = f"{'forward' if op.kind == 'F' else 'backward'} mb {op.microbatch}" + (f" chunk {op.chunk}" if vpp > 1 else "")
        args = {"microbatch": op.microbatch, "chunk": op.chunk, "stage": stage}
        at = op.start_s
        events.append(_slice(pid, COMPUTE_TID, name, "forward" if op.kind == "F" else "backward", at, compute_s, args))
        at += compute_s
        for tid, track, term in COLLECTIVE_TRACKS:
            seconds = getattr(s, term) * share / vpp
            if seconds > 0:
                events.append(_slice(pid, tid, f"{track.split()[0]} {name}", term.removesuffix("_s"), at, seconds, args))
                at += seconds
    return events


def _tail_events(pid: int, tail: StageTail, tails: list[StageTail], pipeline_end_s: float) -> list[dict]:
    """After the pipeline: the stage's exposed gradient sync; its optimizer step once every stage's sync
    is done (the step's global gradient norm waits for all of them); the fixed overhead once every
    optimizer is done — as `StepModel.predict` adds the slowest stage's dp and optimizer terms."""
    dp_end_s = pipeline_end_s + max(t.dp_s for t in tails)
    optimizer_end_s = dp_end_s + max(t.optimizer_s for t in tails)
    events = []
    if tail.dp_s > 0:
        events.append(_slice(pid, DP_TID, "gradient sync (exposed)", "dp_comm", pipeline_end_s, tail.dp_s, {}))
    events.append(_slice(pid, OPTIMIZER_TID, "optimizer step", "optimizer", dp_end_s, tail.optimizer_s, {}))
    if tail.overhead_s > 0:
        events.append(_slice(pid, OPTIMIZER_TID, "step overhead", "overhead", optimizer_end_s, tail.overhead_s, {}))
    return events


def _step_event(pid: int, step_s: float, pipeline_end_s: float, simulated_s: float) -> dict:
    return _slice(pid, STEP_TID, "step (predicted)", "step", 0.0, step_s,
                  {"pipeline_formula_s": pipeline_end_s, "pipeline_simulated_s": simulated_s})


def _slice(pid: int, tid: int, name: str, category: str, start_s: float, duration_s: float, args: dict) -> dict:
    return {"ph": "X", "name": name, "cat": category, "pid": pid, "tid": tid, "ts": start_s * US,
            "dur": duration_s * US, "args": args}


def _flows(ops: list, pp: int, vpp: int, pids_of_stage: dict[int, list[int]]) -> list[dict]:
    """A pipeline send as an arrow: from the chunk that produced the activation (or its gradient) to the
    chunk of the next virtual stage that consumes it — rank to rank at the same place in the stages'
    grids (the i-th rank of one stage sends to the i-th of the next), when every rank is traced."""
    at = {(op.kind, op.microbatch, op.chunk * pp + op.stage): op for op in ops}
    events, flow_id = [], 0
    last = pp * vpp - 1
    for (kind, b, virtual), op in at.items():
        target = virtual + 1 if kind == "F" else virtual - 1
        if not 0 <= target <= last or (kind, b, target) not in at:
            continue
        to = at[kind, b, target]
        for source, sink in zip(pids_of_stage[op.stage], pids_of_stage[to.stage]):
            flow_id += 1
            events.append({"ph": "s", "id": flow_id, "name": "pp send", "cat": "pp", "pid": source,
                           "tid": COMPUTE_TID, "ts": op.end_s * US - 0.001})
            events.append({"ph": "f", "bp": "e", "id": flow_id, "name": "pp send", "cat": "pp", "pid": sink,
                           "tid": COMPUTE_TID, "ts": to.start_s * US})
    return events


def _memory_counter(pid: int, prediction: Prediction, stage: int, ops: list, pipeline_end_s: float,
                    step_s: float) -> list[dict]:
    """The stage's memory over the step, GiB in three stacked series: states and buffers held all step,
    activations of the chunks in flight, the backward's transient working set. The activations are the
    stage's predicted activation bytes shared over the most chunks the schedule holds at once, so the
    counter's peak is the stage's predicted memory."""
    mem = prediction.stages[stage].memory
    gib = 1024 ** 3
    held_bytes = mem.total_bytes - mem.activations_bytes - mem.transient_bytes
    changes = []
    for op in ops:
        if op.kind == "F":
            changes.append((op.start_s, 0, +1, 0))
        else:
            changes.append((op.start_s, 1, 0, +1))
            changes.append((op.end_s, 0, -1, -1))
    changes.sort(key=lambda c: (c[0], c[1]))
    chunks, most = 0, 0
    for _, _, d_chunks, _ in changes:
        chunks += d_chunks
        most = max(most, chunks)
    per_chunk = mem.activations_bytes / most if most else 0.0
    events, chunks, in_backward = [], 0, 0

    def sample(t_s: float) -> dict:
        return {"ph": "C", "name": "memory (GiB)", "pid": pid, "ts": t_s * US,
                "args": {"states and buffers": held_bytes / gib, "activations": chunks * per_chunk / gib,
                         "transient": in_backward * mem.transient_bytes / gib}}

    events.append(sample(0.0))
    for t_s, _, d_chunks, d_backward in changes:
        chunks, in_backward = chunks + d_chunks, in_backward + d_backward
        events.append(sample(t_s))
    events.append(sample(max(pipeline_end_s, step_s)))
    return events


def trace_totals(trace: dict) -> dict:
    """What a trace adds up to, per process: its last slice's end (µs), each category's total (µs) and
    its memory counter's peak (GiB) — the numbers a test holds against the plan's prediction."""
    out: dict[int, dict] = {}
    for e in trace["traceEvents"]:
        entry = out.setdefault(e["pid"], {"end_us": 0.0, "by_category_us": {}, "memory_peak_GiB": 0.0})
        if e["ph"] == "X":
            entry["end_us"] = max(entry["end_us"], e["ts"] + e["dur"])
            entry["by_category_us"][e["cat"]] = entry["by_category_us"].get(e["cat"], 0.0) + e["dur"]
        elif e["ph"] == "C":
            entry["memory_peak_GiB"] = max(entry["memory_peak_GiB"], sum(e["args"].values()))
    return out
