"""`gplan launch`, whole: validate a plan on a fake process group, write a SLURM script, print the
commands, or run it on a backend (backends.registry) under the run supervisor."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from gplan.backends.capability import refuse_unsupported
from gplan.backends.protocol import LaunchOptions, LaunchSpec
from gplan.errors import InputError
from gplan.plan import Plan


def check_launch_flags(steps: int, warmup_steps: int, data: Path | None, checkpoint_dir: Path | None,
                       checkpoint_every: int, resume: bool, device: str, profile: bool = False) -> None:
    """The worker options `gplan launch` takes, refused with a hint before anything starts."""
    if steps < 1 or warmup_steps < 0:
        raise InputError(f"--steps {steps} --warmup-steps {warmup_steps}: steps ≥ 1, warm-up ≥ 0", hint="for example --steps 10")
    if data is not None and not data.is_file():
        raise InputError(f"--data {data}: no such file", hint="a flat binary array of token ids")
    if (checkpoint_every or resume) and checkpoint_dir is None:
        raise InputError("--checkpoint-every and --resume need --checkpoint-dir", hint="add --checkpoint-dir DIR")
    if profile and steps <= warmup_steps:
        raise InputError(f"--profile traces the steps after the warm-up: --steps {steps} leaves none after "
                         f"--warmup-steps {warmup_steps}", hint=f"for example --steps {warmup_steps + 3}")
    if device not in ("auto", "cpu", "cuda"):
        raise InputError(f"--device {device!r}", hint="auto | cpu | cuda")


SLURM_RENDEZVOUS = "slurm-head:0"
"""What a launch rendered for a SLURM script rendezvouses at: the allocation's head node, which the
script resolves at run time — rendered only for the checks and notes."""


@dataclass(frozen=True)
class LaunchOutcome:
    """What `gplan launch` did."""

    kind: str
    """validated | slurm | dry_run | ran | node_finished (a node other than 0, the report on node 0)."""
    backend: str
    validation: object = None
    """The backend's ValidationReport (kind validated)."""
    spec: LaunchSpec | None = None
    written: list[Path] = field(default_factory=list)
    report_path: Path | None = None
    plan: Plan | None = None
    """The plan that ran (scaled down when asked)."""
    node_rank: int = 0


def launch_plan(plan: Plan, backend_name: str, options: LaunchOptions, *, validate_only: bool = False,
                slurm: Path | None = None, dry_run: bool = False, scale=None, note=None, echo=None) -> LaunchOutcome:
    """Validate, write a SLURM script, print the commands, or run `plan` on `backend_name`: the layout
    checked on a fake process group (validate_only, the plan as written), else the plan scaled down as
    asked (`scale`), rendered for every node — its notes said (`note`) before anything runs — and then
    written down or run, the plan that ran and its run report in `options.run_dir`."""
    from gplan.backends.registry import backend, require_framework
    from gplan.io import atomic_write_text
    from gplan.plan import write_plan

    impl = backend(backend_name)
    if validate_only:  # what the backend cannot run is refused first, as a launch would
        refuse_unsupported(plan, backend_name)
        return LaunchOutcome("validated", backend_name, validation=impl.validate(plan), plan=plan)
    plan = scale(plan) if scale else plan
    plan_path = options.run_dir / "plan.json"
    rendered = options if not slurm or options.rdzv_endpoint else replace(options, rdzv_endpoint=SLURM_RENDEZVOUS)
    spec = impl.render(plan, plan_path, rendered)
    for line in spec.notes:
        (note or (lambda _: None))(line)
    if slurm:
        script = impl.slurm_script(plan, plan_path, options)
        options.run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(slurm, script)
        write_plan(plan, plan_path)
        return LaunchOutcome("slurm", backend_name, spec=spec, written=[slurm, plan_path], plan=plan)
    if dry_run:
        return LaunchOutcome("dry_run", backend_name, spec=spec, plan=plan)
    require_framework(backend_name)
    options.run_dir.mkdir(parents=True, exist_ok=True)
    write_plan(plan, plan_path)
    if options.checkpoint_dir:  # where `--resume-from RUN_DIR` finds this run's checkpoints
        from gplan.backends.resume import POINTER

        atomic_write_text(options.run_dir / POINTER, str(options.checkpoint_dir) + "\n")
    impl.run(spec, options, echo=echo or (lambda _: None))
    report_path = options.run_dir / "run_report.json"
    if spec.nnodes > 1 and options.node_rank != 0 and not report_path.exists():
        return LaunchOutcome("node_finished", backend_name, spec=spec, plan=plan, node_rank=options.node_rank)
    return LaunchOutcome("ran", backend_name, spec=spec, report_path=report_path, plan=plan)
