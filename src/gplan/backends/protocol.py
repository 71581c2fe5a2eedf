"""What every execution backend provides, and the types a launch passes between gplan and a backend;
`gplan launch --backend NAME` picks one (backends.registry).

    render(plan, plan_path, options) -> LaunchSpec         argv and environment of every node; pure
    slurm_script(plan, plan_path, options) -> str           one batch script for the whole job
    validate(plan) -> ValidationReport                       the built layout against the plan, no accelerator
    run(spec, options, echo) -> None                         this node's processes; BackendError when one fails

A launcher module implements `render`, `slurm_script` and `run` without importing its framework;
`validate` imports it on use. Backends read only the plan (and spec, profiles, io): nothing here
imports the cost model or the planner.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

from gplan.errors import BackendError
from gplan.plan import Plan


@dataclass(frozen=True)
class LaunchOptions:
    """How to run a plan; the worker's options are passed through unchanged."""

    run_dir: Path
    nproc_per_node: int | None = None
    """Processes per node; default: the plan cluster's devices per node (or the world size)."""
    nnodes: int | None = None
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    """HOST:PORT of the rendezvous (node 0) for several nodes."""
    rdzv_id: str = "gplan"
    steps: int = 10
    warmup_steps: int = 2
    lr: float = 3e-3
    seed: int = 0
    data: Path | None = None
    device: str = "auto"
    checkpoint_dir: Path | None = None
    checkpoint_every: int = 0
    resume: bool = False
    resume_from: Path | None = None
    """A checkpoint written under another plan (`backends.resume.check_resume`), loaded resharded."""
    profile: bool = False
    """Trace the steps after the warm-up with the framework's profiler (`profile/rank{R}.json` in the run
    directory)."""


@dataclass(frozen=True)
class NodeCommand:
    node_rank: int
    argv: list[str]


@dataclass(frozen=True)
class LaunchSpec:
    world_size: int
    nnodes: int
    nproc_per_node: int
    nodes: list[NodeCommand]
    env: dict[str, str] = field(default_factory=dict)
    """Added to the environment of every node."""
    notes: list[str] = field(default_factory=list)
    """Where the engine runs something other than what the plan priced (printed before the run)."""


@dataclass(frozen=True)
class JobRecipe:
    """One job: `nnodes` × `nproc_per_node` processes, each running `program` with `env` added."""

    nnodes: int | str
    """A count, or a shell variable (`$NNODES`) in a script that takes it at run time."""
    nproc_per_node: int
    program: list[str]
    """What each process runs: `["-m", module, *args]` or `[script, *args]`."""
    env: dict[str, str] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return int(self.nnodes) * self.nproc_per_node


@dataclass(frozen=True)
class Check:
    """One thing a backend built, against what the plan says."""

    subject: str
    """What was checked, e.g. `stage 1 (rank 4): parameters after tp` or `operator attention_q`."""
    built: str
    planned: str
    error: float | None = None
    """Relative difference built/planned − 1 where both are numbers."""
    ok: bool = True


@dataclass(frozen=True)
class ValidationReport:
    """What `gplan launch --validate` reports, the same shape for every backend."""

    backend: str
    title: str
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def raise_if_failed(self) -> None:
        bad = [c for c in self.checks if not c.ok]
        if bad:
            worst = max(bad, key=lambda c: abs(c.error or 0.0))
            raise BackendError(f"{worst.subject}: built {worst.built}, the plan has {worst.planned}"
                               + (f" ({worst.error:+.1%})" if worst.error is not None else ""),
                               hint=f"the {self.backend} backend and the cost model disagree; report it")


class Backend(Protocol):
    name: str
    writes_traces: bool
    """`gplan launch --profile`: its workers write profiler traces with gplan's phase marks."""
    loads_other_layouts: bool
    """`--resume-from`: it loads a checkpoint written under another layout (resharded on load)."""

    def render(self, plan: Plan, plan_path: Path, options: LaunchOptions) -> LaunchSpec: ...

    def slurm_script(self, plan: Plan, plan_path: Path, options: LaunchOptions) -> str: ...

    def validate(self, plan: Plan) -> ValidationReport: ...

    def run(self, spec: LaunchSpec, options: LaunchOptions, echo: Callable[[str], None]) -> None: ...
