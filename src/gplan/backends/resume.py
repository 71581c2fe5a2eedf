"""`gplan launch NEW_PLAN --resume-from RUN_DIR`: the checkpoint of a run under another layout, found and
checked before any process starts.

A checkpoint's metadata (`backends/torch/checkpoint.py`, format 2) records the layout and the model that
wrote it. The new plan may change any degree and the stage split (the weights and optimizer state are
keyed by parameter name and resharded on load); it may not change the model, and the data continue at the
checkpoint's step (batches depend on the step alone: `common.global_batch`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from gplan.errors import InputError
from gplan.plan import Plan
from gplan.engines.profile import LAYOUT_DEGREES

META = "gplan_checkpoint.json"
POINTER = "checkpoint_dir"
"""A run directory's note of where its checkpoints went (`gplan launch --checkpoint-dir`)."""


@dataclass(frozen=True)
class Resume:
    path: Path
    """The checkpoint (one complete `step_N` folder)."""
    step: int
    changes: dict[str, tuple]
    """Degree (or `split`) -> (old, new)."""
    notes: list[str]


def checkpoint_layout(plan: Plan) -> dict:
    """What a checkpoint's metadata records of the plan that wrote it."""
    return {"plan_digest": plan.digest, "model": plan.model.model_dump(mode="json"),
            "parallel": {d: getattr(plan.parallel, d) for d in LAYOUT_DEGREES},
            "split": [s.layer_end - s.layer_start for s in plan.stages],
            "gbs": plan.training.gbs, "seq_length": plan.training.seq_length,
            "precision": plan.training.precision, "label": plan.label()}


def find_checkpoint(path: Path) -> Path:
    """The latest complete checkpoint of a run directory (through its pointer) or of a checkpoint folder, or
    the checkpoint named."""
    if not path.is_dir():
        raise InputError(f"--resume-from {path}: no such directory", hint="pass the run directory of the run to "
                         "continue (or its --checkpoint-dir)")
    if (path / META).is_file():  # one checkpoint named directly
        return path
    folder = path
    if (path / POINTER).is_file():
        folder = Path((path / POINTER).read_text().strip())
    complete = []
    for step_dir in folder.glob("step_*"):
        meta = step_dir / META
        if meta.is_file():
            try:
                complete.append((json.loads(meta.read_text())["step"], step_dir))
            except (json.JSONDecodeError, KeyError):
                continue
    if not complete:
        raise InputError(f"--resume-from {path}: no complete checkpoint (a checkpoint is complete once its "
                         f"{META} is written)", hint="the run must have saved one: gplan launch … --checkpoint-dir "
                         "DIR --checkpoint-every K")
    return max(complete)[1]


def check_resume(plan: Plan, path: Path) -> Resume:
    """The checkpoint at `path` (a run or checkpoint directory) loaded into `plan`: refused, naming what
    differs, when the plan trains another model or the checkpoint predates reshardable checkpoints."""
    step_dir = find_checkpoint(path)
    meta = json.loads((step_dir / META).read_text())
    layout = meta.get("layout") or {}
    if meta.get("format", 1) < 2 or not layout:
        raise InputError(f"{step_dir}: written before gplan's checkpoints were reshardable (format 1)",
                         hint="resume it with the plan that wrote it: gplan launch PLAN --checkpoint-dir DIR --resume")
    differs = model_differences(layout["model"], plan.model.model_dump(mode="json"))
    if differs:
        raise InputError(f"{step_dir} holds another model than {plan.model.name}: {', '.join(differs)}",
                         hint="resume with a plan of the same model (gplan replan PLAN --devices N keeps it)")
    new = checkpoint_layout(plan)
    changes = {d: (layout["parallel"][d], new["parallel"][d]) for d in LAYOUT_DEGREES
               if layout["parallel"].get(d) != new["parallel"][d]}
    if layout["split"] != new["split"]:
        changes["split"] = ("/".join(map(str, layout["split"])), "/".join(map(str, new["split"])))
    notes = []
    if layout["gbs"] != plan.training.gbs:
        notes.append(f"global batch {layout['gbs']} → {plan.training.gbs}: the data continue at step {meta['step']}")
    if layout["precision"] != plan.training.precision:
        notes.append(f"precision {layout['precision']} → {plan.training.precision}")
    return Resume(step_dir, meta["step"], changes, notes)


def model_differences(old: dict, new: dict) -> list[str]:
    """The model fields that differ, as `field old → new` (the name aside: a renamed copy is the same model)."""
    keys = sorted((set(old) | set(new)) - {"name"})
    return [f"{k} {old.get(k)} → {new.get(k)}" for k in keys if old.get(k) != new.get(k)]
