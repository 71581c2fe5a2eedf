"""torch's BF16 grouped GEMM (`torch._grouped_mm`) against the routed experts' GEMMs as gplan prices them.

`bench/data/grouped_mm_kernels.csv`: every published kernel timing of `torch._grouped_mm` in BF16 found (torchao's
MoE-training benchmarks and README on B200 and H100, PyTorch's SM100 GroupMM PR on H200), each row one grouped GEMM of M
rows split into G groups, (M, K) @ (G, K, N), timed forward and backward (`fwd_bwd`: its three products) or forward
alone (`fwd`). gplan prices the same GEMM as it prices routed experts (`cost_models.experts.grouped_gemm_time_s`: each
group at the efficiency of its own dense GEMM, the efficiencies fitted on Megatron-LM's runs). Per compute die (H100
and H200 share Hopper's, B200 and GB200 Blackwell's), the median of priced over measured on the forward-and-backward
rows is the catalogue's `torch_grouped_mm_ratio`, on the forward rows its `torch_grouped_mm_forward_ratio`: the
routed GEMMs' speeds, forward and together with the backward, of an engine that runs them on this kernel (torchtitan).

    python bench/grouped_mm.py [--readme]
"""

from __future__ import annotations

import csv
import functools
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from gplan.cost_models.compute import Gemm
from gplan.cost_models.experts import grouped_gemm_time_s
from gplan.profiles.catalogue import load_cluster

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "bench" / "data" / "grouped_mm_kernels.csv"
BEGIN, END = "<!-- grouped-mm:begin -->", "<!-- grouped-mm:end -->"
CLUSTERS = {"h100-sxm": "dgx-h100", "h200": "dgx-h200", "b200": "dgx-b200"}
DIES = {"h100-sxm": "hopper", "h200": "hopper", "b200": "blackwell"}
"""Devices whose timings stand for one another: the same compute die runs the same CUTLASS kernels."""
CATALOGUE = {"hopper": ("h100-sxm", "h200"), "blackwell": ("b200", "gb200")}
"""The catalogue's devices each die's ratios are written to (hardware.yaml)."""
PRODUCTS = {"fwd": 1, "fwd_bwd": 3}
"""Products a timing covers: the forward's, and with the backward the input's and the weights' gradients."""


@functools.cache
def device(name: str):
    """The catalogue's device as loaded, before any engine's factor (loaded once a device)."""
    return load_cluster(CLUSTERS[name], 8).node_groups[0].hardware


def priced_ms(row: dict) -> float:
    """gplan's price of the row's grouped GEMM, its products as timed, at the Megatron-fitted efficiencies."""
    whole = Gemm(int(row["M"]), int(row["N"]), int(row["K"]))
    one_pass = grouped_gemm_time_s(device(row["device"]), "bf16", whole, int(row["G"]))
    return 1e3 * PRODUCTS[row["passes"]] * one_pass


def slowdowns(passes: str) -> dict[str, list[float]]:
    """Die -> measured over priced, on the rows timing `passes`."""
    found: dict[str, list[float]] = defaultdict(list)
    for row in csv.DictReader(KERNELS.open()):
        if row["passes"] == passes:
            found[DIES[row["device"]]].append(float(row["measured_ms"]) / priced_ms(row))
    return found


def ratios() -> dict[str, dict[str, float]]:
    """Die -> {"torch_grouped_mm_ratio": forward and backward, "torch_grouped_mm_forward_ratio": forward}: priced
    over measured, the median row's."""
    both, forward = slowdowns("fwd_bwd"), slowdowns("fwd")
    return {die: {"torch_grouped_mm_ratio": 1 / statistics.median(both[die]),
                  "torch_grouped_mm_forward_ratio": 1 / statistics.median(forward[die])} for die in both}


def lines() -> list[str]:
    out = ["| device | source | passes | M, N, K, G | measured ms | priced ms | measured / priced |",
           "|---|---|---|---|---:|---:|---:|"]
    for row in csv.DictReader(KERNELS.open()):
        priced = priced_ms(row)
        out.append(f"| {row['device']} | {row['source']} ({row['date']}) | {row['passes']} | "
                   f"{row['M']}, {row['N']}, {row['K']}, {row['G']} | {float(row['measured_ms']):.2f} | {priced:.2f} | "
                   f"{float(row['measured_ms']) / priced:.2f} |")
    out.append("")
    for passes, what in (("fwd_bwd", "forward and backward"), ("fwd", "forward")):
        for die, values in slowdowns(passes).items():
            out.append(f"{die}, {what}: {len(values)} timing{'s' if len(values) > 1 else ''}, measured / priced "
                       f"{min(values):.2f} … {max(values):.2f}, median {statistics.median(values):.2f}: "
                       f"{'torch_grouped_mm_ratio' if passes == 'fwd_bwd' else 'torch_grouped_mm_forward_ratio'} "
                       f"{1 / statistics.median(values):.2f} ({', '.join(CATALOGUE[die])}).")
    return out


def main(argv: list[str] | None = None) -> int:
    from readme_section import table_main

    return table_main(__doc__.splitlines()[0], lambda: "\n".join(lines()), BEGIN, END, argv)


if __name__ == "__main__":
    sys.exit(main())
