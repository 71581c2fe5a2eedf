"""Time collectives over message sizes, as a torchrun job (NCCL on GPUs, gloo on CPU):

    torchrun --nproc-per-node N -m gplan.backends.torch.measure_links --out links.json [--max-bytes B]

All-reduce, all-gather and reduce-scatter run over all ranks, send/recv between ranks 0 and 1 (on
the first and last rank when there are several nodes, so the pair crosses nodes); every size from
4 KiB up to `--max-bytes` in steps of 4×. Each point is the median of repeats of the slowest rank.
Rank 0 writes the measurements; `gplan.calibration.profile.fit_links` fits α and β of the ring
formulas of cost_models.communication to them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

from gplan.io import atomic_write_text
from gplan.profiles.schema import LinkMeasurement
from gplan.profiles.shapes import link_sizes

# ---- the job -------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    import torch
    import torch.distributed as dist

    parser = argparse.ArgumentParser(prog="gplan-link-profiler")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--max-bytes", type=int, default=256 * 1024 * 1024)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=120))
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    world, rank = dist.get_world_size(), dist.get_rank()
    nnodes = int(os.environ.get("GROUP_WORLD_SIZE", os.environ.get("NNODES", "1")) or 1)
    scope = "inter" if nnodes > 1 else "intra"
    results = []
    for size in link_sizes(args.max_bytes):
        for collective in ("allreduce", "allgather", "reduce_scatter", "sendrecv"):
            if collective == "sendrecv" and world < 2:
                continue
            seconds = _time(collective, size, world, rank, device, args.repeats)
            results.append(LinkMeasurement(collective=collective, scope=scope, ranks=world if collective != "sendrecv" else 2,
                                           size_bytes=size, time_s=seconds).model_dump())
    if rank == 0:
        atomic_write_text(args.out, json.dumps(results, indent=1))
    dist.destroy_process_group()
    return 0


def _time(collective: str, size: int, world: int, rank: int, device, repeats: int) -> float:
    import torch
    import torch.distributed as dist

    elements = max(world, size // 4)
    elements -= elements % world
    data = torch.ones(elements, device=device)
    chunks = list(data.chunk(world))
    peer = world - 1

    def once():
        if collective == "allreduce":
            dist.all_reduce(data)
        elif collective == "allgather":
            dist.all_gather(chunks, chunks[rank].clone())
        elif collective == "reduce_scatter":
            dist.reduce_scatter(chunks[rank].clone(), chunks)
        elif rank == 0:
            dist.send(data, peer)
            dist.recv(data, peer)
        elif rank == peer:
            dist.recv(data, 0)
            dist.send(data, 0)

    samples = []
    for i in range(repeats + 2):
        dist.barrier()
        _sync(device)
        start = time.perf_counter()
        once()
        _sync(device)
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        if i >= 2:
            samples.append(float(elapsed) / (2 if collective == "sendrecv" else 1))
    return statistics.median(samples)


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)
