"""Lose a worker, keep training: what `gplan launch --elastic`, `--resume-from` and `gplan replan --export`
do beyond one library call (they join the planner and the backends, so they live at the command line's layer).

`gplan launch --elastic`:

The launch runs as usual; when the job fails naming a rank (`BackendError.failed_rank`), the devices that
rank ran on are taken as lost — its own device on one node, its whole node on several — and the plan is
re-planned on the devices left among the layouts the checkpoint can be loaded into (`planner.replan`). The
new plan is written beside the old (`RUN_DIR/elastic-K.plan.json`), the job restarts from the last
complete checkpoint resharded into it (`--resume-from`), and the run report lists every failure survived:
both plans, the rank lost, the step resumed from, the steps lost and the seconds the restart took.
Without `--elastic` a failure ends the launch (exit 5), as before.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

from gplan.backends.resume import META
from gplan.errors import BackendError, UsageError
from gplan.io import atomic_write_text
from gplan.plan import Plan, write_plan

MAX_RESTARTS = 3
"""Failures survived before the launch gives up (each costs a restart and the steps since a checkpoint)."""


def check_elastic(options, nnodes: int | None) -> None:
    if options.checkpoint_dir is None or not options.checkpoint_every:
        raise UsageError("--elastic resumes from the run's checkpoints", hint="add --checkpoint-dir DIR "
                         "--checkpoint-every K")
    if (nnodes or 1) > 1:
        raise UsageError("--elastic re-plans one node's job here: several nodes would need a new rendezvous on "
                         "the nodes left", hint="run without --elastic, then gplan replan PLAN --lost-nodes K and "
                         "launch the new plan with --resume-from RUN_DIR")


def launch_elastic(plan: Plan, run, options, note) -> tuple[object, list[dict]]:
    """Run `run(plan, options)` (gplan launch's call of `launch_plan`), re-planning and resuming after each
    failure that names a rank; returns the last outcome and the failures survived."""
    from gplan.backends.resume import find_checkpoint
    from gplan.planner.replan import replan

    survived: list[dict] = []
    while True:
        try:
            return run(plan, options), survived
        except BackendError as exc:
            rank = getattr(exc, "failed_rank", None)
            if rank is None or len(survived) >= MAX_RESTARTS:
                raise
            failed_at = time.time()
            try:
                checkpoint = find_checkpoint(options.checkpoint_dir)
            except Exception:  # noqa: BLE001 - no checkpoint yet: nothing to resume, the failure stands
                exc.message += "; --elastic found no complete checkpoint to resume from"
                raise exc from None
            lost = lost_devices(plan, rank)
            new = replan(plan, plan.world_size - lost).new
            path = options.run_dir / f"elastic-{len(survived) + 1}.plan.json"
            write_plan(new, path)
            step = json.loads((checkpoint / META).read_text())["step"]
            note(f"rank {rank} lost ({exc.message.split(';')[0]}): re-planned for {plan.world_size - lost} devices "
                 f"as {new.label()} ({path}); resuming from step {step}")
            survived.append({"failed_rank": rank, "devices_lost": lost, "plan_before": plan.label(),
                             "plan_after": new.label(), "plan_file": str(path), "resumed_from_step": step,
                             "steps_done_before": last_step(options.run_dir), "restart_s": time.time() - failed_at})
            options = replace(options, resume_from=checkpoint, resume=False, nproc_per_node=None, nnodes=None)
            plan = new


def lost_devices(plan: Plan, rank: int) -> int:
    """The devices a failed rank takes with it: its own on one node (a worker), its node's on several."""
    per_node = plan.cluster.primary.devices_per_node
    return 1 if plan.world_size <= per_node else per_node


def last_step(run_dir: Path) -> int | None:
    """The last step rank 0 logged before the failure."""
    log = run_dir / "logs" / "rank0.log"
    if not log.is_file():
        return None
    steps = [line.split("step ")[1].split("/")[0] for line in log.read_text().splitlines() if " step " in line
             and " loss " in line]
    return int(steps[-1]) if steps else None


def record(report_path: Path, survived: list[dict]) -> None:
    """Add the failures survived to the run report the last job wrote."""
    data = json.loads(report_path.read_text())
    data["elastic"] = survived
    atomic_write_text(report_path, json.dumps(data, indent=2) + "\n")


def resume_options(plan: Plan, options, resume_from: Path, resume: bool, backend: str, note):
    """`--resume-from RUN_DIR`: the run's last complete checkpoint, checked against the plan that will run
    (another model, or a checkpoint from before reshardable checkpoints: refused, exit 3)."""
    from gplan.backends.resume import check_resume

    if resume:
        raise UsageError("--resume continues this plan's own checkpoints, --resume-from another run's",
                         hint="pass one of them")
    from gplan.backends.registry import backend as backend_named

    if not backend_named(backend).loads_other_layouts:
        raise UsageError(f"--resume-from: the {backend} backend does not load checkpoints of another layout",
                         hint="launch with --backend torch")
    found = check_resume(plan, resume_from)
    moved = ", ".join(f"{k} {a}→{b}" for k, (a, b) in found.changes.items()) or "nothing (the same layout)"
    note(f"resuming from {found.path} (step {found.step}), resharded over {moved}")
    for line in found.notes:
        note(line)
    return replace(options, resume_from=found.path)


def export_replanned(result, target: str, folder: Path, plan_path: Path) -> list[Path]:
    """`gplan replan --export`: the new plan's launch files for `target` and RESUME.md (how to load the old
    checkpoint into them)."""
    from gplan.backends.exporters import export_files
    from gplan.planner.build import reprice_split
    from gplan.render import resume_steps

    written, _ = export_files(result.new, target, folder, plan_path=plan_path, reprice=reprice_split)
    atomic_write_text(folder / "RESUME.md", resume_steps(result, target))
    return written + [folder / "RESUME.md"]

