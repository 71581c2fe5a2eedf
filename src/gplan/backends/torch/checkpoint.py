"""Distributed checkpoints with `torch.distributed.checkpoint`, written atomically.

Every rank writes its shards into `DIR/.step_N.tmp`; after a barrier rank 0 renames it to
`DIR/step_N` — a rename inside one directory is atomic, so a half-written checkpoint never looks
complete and never replaces a good one. `latest` picks the highest complete step.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

META = "gplan_checkpoint.json"


def _state(parts: list, optimizers: list, stages: list[int]) -> dict:
    """Model entries by global parameter name; optimizer state per virtual pipeline stage — DCP keeps
    one copy of each non-tensor entry (the param_groups), so ranks of different stages must not
    share a key."""
    model: dict = {}
    for part in parts:
        model.update(get_model_state_dict(part))
    optim = {f"stage{s}": get_optimizer_state_dict(part, opt) for s, part, opt in zip(stages, parts, optimizers)}
    return {"model": model, "optim": optim}


def local_save_plan(parts: list, optimizers: list, stages: list[int]):
    """The checkpoint's save plan for this rank, without writing (what `gplan launch --validate`
    builds): the state dict gathered as `save` gathers it, handed to DCP's default planner."""
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    planner = DefaultSavePlanner()
    planner.set_up_planner(_state(parts, optimizers, stages), is_coordinator=dist.get_rank() == 0)
    return planner.create_local_plan()


def save(directory: Path, step: int, parts: list, optimizers: list, stages: list[int], plan_digest: str) -> Path:
    final = directory / f"step_{step:08d}"
    tmp = directory / f".step_{step:08d}.tmp"
    if dist.get_rank() == 0:
        directory.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    dist.barrier()
    dcp.save(_state(parts, optimizers, stages), checkpoint_id=str(tmp))
    dist.barrier()
    if dist.get_rank() == 0:
        (tmp / META).write_text(json.dumps({"step": step, "plan_digest": plan_digest}))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    dist.barrier()
    return final


def latest(directory: Path) -> tuple[int, Path] | None:
    """The highest complete checkpoint: (steps done, path)."""
    if not directory.is_dir():
        return None
    found = []
    for path in directory.glob("step_*"):
        meta = path / META
        if meta.is_file():
            found.append((json.loads(meta.read_text())["step"], path))
    return max(found) if found else None


def load(path: Path, parts: list, optimizers: list, stages: list[int], plan_digest: str) -> int:
    meta = json.loads((path / META).read_text())
    if meta["plan_digest"] != plan_digest:
        raise ValueError(f"{path} was written by another plan (digest {meta['plan_digest']}, this plan {plan_digest})")
    state = _state(parts, optimizers, stages)
    dcp.load(state, checkpoint_id=str(path))
    for s, part, opt in zip(stages, parts, optimizers):
        names = set(get_model_state_dict(part))
        set_model_state_dict(part, {k: v for k, v in state["model"].items() if k in names})
        set_optimizer_state_dict(part, opt, state["optim"][f"stage{s}"])
    return meta["step"]
