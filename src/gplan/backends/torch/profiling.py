"""`gplan launch --profile`: the torch worker's own profiler trace, labelled so the planner can read it.

torch.profiler (Kineto) traces the steps after the warm-up and writes `profile/rank{R}.json` in the run
directory, the Chrome trace format that Perfetto opens. The worker marks what the cost model prices as
user annotations — the names `calibration.measured` reads back:

    gplan:step          one training step (the profiler's own `ProfilerStep#N` marks it too)
    gplan:forward       one micro-batch chunk's forward (a pipeline stage's `forward_one_chunk`, or the
                        micro-batch loop's forward and loss without a pipeline)
    gplan:backward      its backward
    gplan:grad_sync     the gradient reductions after the last backward
    gplan:optimizer     the optimizer step

Collectives appear as the process group's own annotations (`gloo:all_reduce`, `nccl:...`), on the
threads that ran them.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, record_function

ANNOTATIONS = ("gplan:step", "gplan:forward", "gplan:backward", "gplan:grad_sync", "gplan:optimizer")


def labelled(method, name: str):
    """`method` run inside a profiler annotation `name`."""

    @functools.wraps(method)
    def run(*args, **kwargs):
        with record_function(name):
            return method(*args, **kwargs)

    return run


def label_pipeline_stages(stages: list) -> None:
    """Annotate every pipeline stage's forward and backward of one chunk: the schedules (1F1B, GPipe,
    interleaved) all call these two methods on the stage object, so wrapping them marks each op."""
    for stage in stages:
        stage.forward_one_chunk = labelled(stage.forward_one_chunk, "gplan:forward")
        stage.backward_one_chunk = labelled(stage.backward_one_chunk, "gplan:backward")


class StepProfiler:
    """Traces the steps from `first_traced` on; writes the trace when closed. Off: does nothing."""

    def __init__(self, enabled: bool, device: torch.device, first_traced: int, path: Path):
        self.enabled, self.first_traced, self.path = enabled, first_traced, path
        self.profiler = None
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        self.activities = activities

    def before_step(self, step: int) -> None:
        if self.enabled and self.profiler is None and step >= self.first_traced:
            self.profiler = torch.profiler.profile(activities=self.activities, record_shapes=False)
            self.profiler.__enter__()

    def after_step(self) -> None:
        if self.profiler is not None:
            self.profiler.step()

    def close(self) -> Path | None:
        if self.profiler is None:
            return None
        self.profiler.__exit__(None, None, None)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(self.path.name + ".partial")
        self.profiler.export_chrome_trace(str(partial))
        partial.replace(self.path)  # a reader never sees half a trace
        self.profiler = None
        return self.path
