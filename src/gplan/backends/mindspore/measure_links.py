"""Time collectives with MindSpore, as an msrun job (HCCL on Ascend, MindSpore's own collective
library on CPU):

    msrun --worker_num N --local_worker_num N --join True links_mindspore.py --out links.json

All-reduce, all-gather and reduce-scatter over all ranks (those the device supports: MindSpore's CPU
library has no reduce-scatter), every size from 4 KiB up to --max-bytes
in steps of 4×; each point the median of repeats, the slowest rank's (the ranks' times gathered;
MindSpore's CPU all-reduce only sums). Rank 0 writes the measurements in the torch link job's format, so `fit_links` fits both.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import mindspore as ms
from mindspore import Tensor, ops
from mindspore.communication import get_group_size, get_rank, init

from gplan.backends.mindspore.device import has_ascend
from gplan.io import atomic_write_text
from gplan.profiles.shapes import link_sizes
from gplan.profiles.schema import LinkMeasurement


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gplan-mindspore-link-profiler")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--max-bytes", type=int, default=256 * 1024 * 1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--scope", choices=("intra", "inter"), default="intra")
    args = parser.parse_args(argv)

    target = "Ascend" if has_ascend() else "CPU"
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target=target)
    init()
    world, rank = get_group_size(), get_rank()
    collectives = {"allreduce": ops.AllReduce(), "allgather": ops.AllGather(), "reduce_scatter": ops.ReduceScatter()}
    gather_times = ops.AllGather()
    results = []
    for size in link_sizes(args.max_bytes):
        elements = max(world, size // 4)
        elements -= elements % world
        data = Tensor(np.ones(elements, np.float32))
        for name, op in list(collectives.items()):
            samples = []
            for i in range(args.repeats + 2):
                start = time.perf_counter()
                try:
                    op(data).asnumpy()
                except RuntimeError as exc:  # every rank fails alike, at kernel selection, before any message
                    if "Unsupported op" not in str(exc):
                        raise
                    del collectives[name]
                    break
                elapsed = gather_times(Tensor(np.array([time.perf_counter() - start], np.float32))).asnumpy().max()
                if i >= 2:
                    samples.append(float(elapsed))
            if samples:
                results.append(LinkMeasurement(collective=name, scope=args.scope, ranks=world, size_bytes=size,
                                               time_s=statistics.median(samples)).model_dump())
    if rank == 0:
        atomic_write_text(args.out, json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
