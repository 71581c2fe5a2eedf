"""`gplan export`: the plan in the form another engine takes (no engine is imported here).

Every target is a function `plan -> Export` (files by name, and notes on what the engine cannot
express exactly); every file carries the plan's digest so a stale export is visible.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from gplan.plan import Plan


@dataclass(frozen=True)
class Export:
    files: dict[str, str]
    """File name -> contents."""
    notes: list[str] = field(default_factory=list)
    """What the target cannot express exactly, and what was chosen instead."""


def stamp(plan: Plan, comment: str = "#") -> str:
    """The header line every exported file starts with."""
    return (f"{comment} gplan export of plan {plan.digest} (layout {plan.layout_digest}; {plan.model.name}: "
            f"{plan.parallel.label()}, predicted {plan.prediction.step_time_s:.3f} s/step)")


def targets() -> dict[str, Callable[[Plan], Export]]:
    from gplan.backends.exporters import deepspeed, kubernetes, megatron, mindformers, slurm, torchtitan

    return {"megatron": megatron.export, "torchtitan": torchtitan.export, "deepspeed": deepspeed.export,
            "mindformers": mindformers.export, "k8s": kubernetes.export, "slurm": slurm.export}


def stage_sizes(plan: Plan) -> list[int]:
    return [s.layer_end - s.layer_start for s in plan.stages]


def recompute_counts(plan: Plan, option: str) -> list[int]:
    """Layers per pipeline rank that the plan recomputes with `option`."""
    return [sum(c.count for c in s.layers if c.recompute == option) for s in plan.stages]


ENGINE_OF = {"megatron": "megatron", "torchtitan": "torchtitan", "deepspeed": "deepspeed",
             "mindformers": "mindformers", "k8s": "torch", "slurm": "torch"}
"""The engine that runs each export (Kubernetes and SLURM run gplan's torch worker)."""


def check_runs(plan: Plan, target: str) -> list[str]:
    """Refuse (exit 3) a configuration the target's engine cannot run at all, naming the capability and
    the search option that avoids it; return, as notes, where it runs the stage split differently
    (its recompute granularity, even splits) than the plan priced."""
    from gplan.errors import InputError
    from gplan.plan import layouts_of
    from gplan.spec.targets import TARGETS, config_refusals, split_refusals

    engine = TARGETS[ENGINE_OF[target]]
    found = config_refusals(engine, plan.model, plan.parallel, plan.parallel.num_microbatches)
    if found:
        raise InputError(f"{engine.name} cannot run this plan ({found[0].capability}): {found[0].detail}",
                         hint=found[0].hint(engine.name))
    return [f"{r.detail}: the split runs differently than priced (search with --target {engine.name} for a plan "
            "it runs exactly)" for r in split_refusals(engine, layouts_of(plan))]


def export_files(plan: Plan, target: str, out_dir: Path) -> tuple[list[Path], list[str]]:
    """Export `plan` for `target` into `out_dir`: every file written atomically, or none (an unknown
    target or an `out_dir` that is a file is refused before anything is written)."""
    from gplan.errors import InputError
    from gplan.io import atomic_write_text

    exporters = targets()
    if target not in exporters:
        raise InputError(f"--to {target!r}: unknown target", hint="choose from " + ", ".join(exporters))
    split_notes = check_runs(plan, target)
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"-o {out_dir}: exists and is not a directory", hint="name a directory for the exported files")
    result = exporters[target](plan)
    result = Export(result.files, result.notes + [n for n in split_notes if n not in result.notes])
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"-o {out_dir}: cannot create it: {exc.strerror}", hint="choose a writable directory") from None
    written = []
    for name, text in result.files.items():
        atomic_write_text(out_dir / name, text)
        written.append(out_dir / name)
    return written, result.notes
