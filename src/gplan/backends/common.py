"""What both backends share, without a framework: the workers' command line, as launchers write it
and workers read it, and the training tokens.

Tokens are synthetic (seeded per step; each row an arithmetic progression modulo the vocabulary,
from a random start with a random stride of 1–8, so the loss falls quickly and a wrong gradient
shows) or a flat token file (nanoGPT's `.bin`: uint16 when the vocabulary fits, else uint32),
memory-mapped. Batches depend only on the step, so a resumed run sees the data an uninterrupted one
does, and the torch and MindSpore workers train on the same batches.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from gplan.plan import Plan


def add_worker_options(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options every worker takes (what `worker_argv` writes)."""
    parser.add_argument("--plan", type=Path, required=True)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--profile", action="store_true")
    return parser


def worker_argv(plan_path: Path, options) -> list[str]:
    """The worker's arguments for `options` (a LaunchOptions)."""
    args = ["--plan", str(plan_path), "--run-dir", str(options.run_dir), "--steps", str(options.steps),
            "--warmup-steps", str(options.warmup_steps), "--lr", repr(options.lr), "--seed", str(options.seed),
            "--device", options.device]
    if options.data:
        args += ["--data", str(options.data)]
    if getattr(options, "profile", False):
        args.append("--profile")
    return args


def global_batch(step: int, vocab_size: int, seq_length: int, gbs: int, seed: int, path: Path | None) -> np.ndarray:
    """(gbs, seq_length + 1) int64 tokens of `step`."""
    width = seq_length + 1
    if path is None:
        rng = np.random.default_rng(seed * 7919 + step)
        start = rng.integers(0, vocab_size, (gbs, 1))
        stride = rng.integers(1, 9, (gbs, 1))
        return (start + stride * np.arange(width)) % vocab_size
    array = np.memmap(path, dtype=np.uint16 if vocab_size <= 2**16 else np.uint32, mode="r")
    if len(array) < width:
        raise ValueError(f"{path}: {len(array)} tokens, fewer than one sequence of {width}")
    span = len(array) - width + 1
    return np.stack([np.asarray(array[((step * gbs + i) * width) % span:][:width], dtype=np.int64) for i in range(gbs)])


#: Vendors sell "80 GB" that the runtime reports as 79.2 GiB: a device this much below the plan's is its kind.
DEVICE_MEMORY_TOLERANCE = 0.05


def device_mismatch(plan: Plan, rank: int, device_name: str, total_bytes: float) -> str | None:
    """Why the device rank `rank` found cannot run the plan's part for it, or None: less memory than the
    hardware of its node group (by the placement rule) means the run would run out of memory after it
    started — on a heterogeneous cluster, a node started under the wrong node rank."""
    group = plan.device_of(rank).node_group
    planned = plan.cluster.node_groups[group].hardware
    if total_bytes >= planned.memory_bytes * (1 - DEVICE_MEMORY_TOLERANCE):
        return None
    return (f"rank {rank} runs on {device_name} with {total_bytes / 2**30:.1f} GiB; the plan put it on "
            f"{planned.name} ({planned.memory_GiB:g} GiB) of node group {group} — start each node under the node "
            "rank of its hardware, or re-plan for these devices")
