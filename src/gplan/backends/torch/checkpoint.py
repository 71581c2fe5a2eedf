"""Distributed checkpoints with `torch.distributed.checkpoint`, written atomically, readable by any layout.

Every rank writes its shards into `DIR/.step_N.tmp`; after a barrier rank 0 renames it to
`DIR/step_N` — a rename inside one directory is atomic, so a half-written checkpoint never looks
complete and never replaces a good one. `latest` picks the highest complete step.

Everything is keyed by the parameter's global name (`layers.17.attention.wq.weight`: layer ids are the
model's, whatever stage holds them): the weights, and each parameter's optimizer state (AdamW's step and
moments). DCP stores DTensor shards with their global shape, so a checkpoint written under one layout
loads under another — dp, tp, pp, vpp, cp, zero and the stage split may all change (DCP reshards on
load). The optimizer's hyperparameters are not stored: they are the launch's. The metadata (`META`) names
the layout and model that wrote it, so a launch can say what it reshards, or refuse a checkpoint of
another model, before any process starts (`planner`-free: `compatibility`).
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
FORMAT = 2
"""1: optimizer state per virtual stage (loads only under the layout that wrote it); 2: by parameter name."""


def _state(parts: list, optimizers: list, stages: list[int]) -> dict:
    """Model entries and optimizer state, both by global parameter name (this rank's parts merged)."""
    model: dict = {}
    optim: dict = {}
    for part, opt in zip(parts, optimizers):
        model.update(get_model_state_dict(part))
        optim.update(get_optimizer_state_dict(part, opt)["state"])
    return {"model": model, "optim": optim}


def _legacy_state(parts: list, optimizers: list, stages: list[int]) -> dict:
    """Format 1: the optimizer state per virtual pipeline stage, param_groups included."""
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


def save(directory: Path, step: int, parts: list, optimizers: list, stages: list[int], plan_digest: str,
         layout: dict | None = None) -> Path:
    """`layout`: what the metadata records of the plan that wrote it (`worker.checkpoint_layout`)."""
    final = directory / f"step_{step:08d}"
    tmp = directory / f".step_{step:08d}.tmp"
    if dist.get_rank() == 0:
        directory.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    dist.barrier()
    dcp.save(_state(parts, optimizers, stages), checkpoint_id=str(tmp))
    dist.barrier()
    if dist.get_rank() == 0:
        (tmp / META).write_text(json.dumps({"step": step, "plan_digest": plan_digest, "format": FORMAT,
                                            "layout": layout or {}}))
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


def read_meta(path: Path) -> dict:
    return json.loads((path / META).read_text())


def load(path: Path, parts: list, optimizers: list, stages: list[int], plan_digest: str,
         other_layout: bool = False) -> int:
    """Load `path` into this rank's parts and optimizers; returns the steps it had done. A checkpoint of
    another plan loads only when asked (`other_layout`: `gplan launch --resume-from`), resharded."""
    meta = read_meta(path)
    if meta["plan_digest"] != plan_digest and not (other_layout and meta.get("format", 1) >= 2):
        raise ValueError(f"{path} was written by another plan (digest {meta['plan_digest']}, this plan {plan_digest})")
    if meta.get("format", 1) < 2:
        return _load_legacy(path, parts, optimizers, stages, meta)
    state = _state(parts, optimizers, stages)  # the template: this layout's shards, optimizer state initialised
    dcp.load(state, checkpoint_id=str(path))
    for part, opt in zip(parts, optimizers):
        names = set(get_model_state_dict(part))
        set_model_state_dict(part, {k: v for k, v in state["model"].items() if k in names})
        groups = get_optimizer_state_dict(part, opt)["param_groups"]
        mine = {k for g in groups for k in g["params"]}
        set_optimizer_state_dict(part, opt, {"state": {k: v for k, v in state["optim"].items() if k in mine},
                                             "param_groups": groups})
    return meta["step"]


def _load_legacy(path: Path, parts: list, optimizers: list, stages: list[int], meta: dict) -> int:
    state = _legacy_state(parts, optimizers, stages)
    dcp.load(state, checkpoint_id=str(path))
    for s, part, opt in zip(stages, parts, optimizers):
        names = set(get_model_state_dict(part))
        set_model_state_dict(part, {k: v for k, v in state["model"].items() if k in names})
        set_optimizer_state_dict(part, opt, state["optim"][f"stage{s}"])
    return meta["step"]
