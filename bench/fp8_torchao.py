"""torchao's FP8 recipes as gplan prices them, against the published torchtitan runs.

`bench/data/torchao_float8_runs.csv`: Llama 3 8B on one node of 8 GPUs (batch 1 × 8192 tokens per GPU,
FSDP2, torch.compile) in BF16 and in torchao's float8 tensorwise (with FSDP's float8 all-gather), rowwise
and MXFP8 recipes, from torchao's READMEs and a torchtitan commit. Each recipe's factor on the GEMM
efficiency of its tensor cores (`engine_precision_efficiency` of the torch and torchtitan engines in the
hardware catalogue) is fitted so that gplan's predicted speedup over its own BF16 prediction of the same
layout matches the published speedup: the runs' absolute throughput is an FSDP-stack question gplan
answers separately, and the ratio is what the recipe changes. Reported in-sample, and leave-one-source-out
where a GPU has two sources (H100), beside Transformer Engine's factors fitted on Megatron-Bridge's rows.

    python bench/fp8_torchao.py [--readme]
"""

from __future__ import annotations

import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from gplan.cost_models.step import predict
from gplan.planner.inputs import resolve_inputs
from gplan.profiles.catalogue import hardware_entry
from gplan.spec.parallel import ParallelConfig

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "bench" / "data" / "torchao_float8_runs.csv"
BEGIN, END = "<!-- fp8-torchao:begin -->", "<!-- fp8-torchao:end -->"
CLUSTERS = {"h100-sxm": "dgx-h100", "b200": "dgx-b200"}
LAYOUT = ParallelConfig(dp=8, zero=3, mbs=1)
"""FSDP over the node's 8 GPUs, one 8192-token sequence per GPU per step (the runs' batch size 1)."""


def load() -> dict[tuple[str, str], dict[str, float]]:
    """(source, hardware) -> recipe -> tokens/s per GPU."""
    found: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    with RUNS.open() as f:
        for row in csv.DictReader(f):
            found[(row["source"], row["hardware"])][row["recipe"]] = float(row["tokens_per_s_per_gpu"])
    return found


def speedup(hardware: str, recipe: str, factor: float | None) -> float:
    """gplan's predicted tokens/s of `recipe` over BF16 on the runs' layout, the recipe's factor set."""
    def tokens_per_s(precision: str, value: float | None) -> float:
        inputs = resolve_inputs("llama3-8b", 8, CLUSTERS[hardware], None, None, 8, 8192, precision, 0.1, None, "torch")
        cluster = inputs.cluster
        if value is not None:
            group = cluster.node_groups[0]
            table = {**group.hardware.engine_precision_efficiency}
            table["torch"] = {**table.get("torch", {}), precision: value}
            device = group.hardware.model_copy(update={"engine_precision_efficiency": table})
            cluster = cluster.model_copy(update={"node_groups": [group.model_copy(update={"hardware": device})]})
        return predict(inputs.model, inputs.training, cluster, LAYOUT).tokens_per_s

    return tokens_per_s(recipe, factor) / tokens_per_s("bf16", None)


def fit_factor(hardware: str, recipe: str, target: float) -> float:
    """The factor at which the predicted speedup is `target` (bisection: the speedup grows with it)."""
    low, high = 0.05, 1.0
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if speedup(hardware, recipe, middle) < target else (low, middle)
    return round((low + high) / 2, 3)


def run() -> tuple[str, dict]:
    runs = load()
    measured = {(source, hw, r): tps / recipes["bf16"] for (source, hw), recipes in runs.items()
                for r, tps in recipes.items() if r != "bf16"}
    per_source = {key: fit_factor(key[1], key[2], value) for key, value in measured.items()}
    fitted: dict[tuple[str, str], float] = {}
    for (source, hw, recipe), factor in per_source.items():
        fitted.setdefault((hw, recipe), [])
        fitted[(hw, recipe)].append(factor)
    fitted = {k: round(statistics.mean(v), 3) for k, v in fitted.items()}
    rows = ["| GPU | recipe | source | measured speedup | predicted (in-sample) | error | held out (other source's fit) | error | Megatron-TE factor |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for (source, hw, recipe), value in sorted(measured.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
        inside = speedup(hw, recipe, fitted[(hw, recipe)])
        others = [f for (s, h, r), f in per_source.items() if h == hw and r == recipe and s != source]
        held = speedup(hw, recipe, statistics.mean(others)) if others else None
        te = hardware_entry(hw).get("precision_efficiency", {}).get(recipe if recipe != "fp8-rowwise" else "fp8")
        rows.append(f"| {hw} | {recipe} | {source} | {value:.3f}× | {inside:.3f}× | {inside / value - 1:+.1%} | "
                    + (f"{held:.3f}× | {held / value - 1:+.1%}" if held else "— | —")
                    + f" | {te if te is not None else '—'} |")
    rows.append("")
    rows.append("One published source per GPU but the H100: the B200 rows are in-sample only (the factor is fitted "
                "on them, so their 0% is the fit, not a check); the H100's held-out column predicts each source "
                "with the other's factor.")
    rows.append("")
    rows.append("Fitted factors (the catalogue's `engine_precision_efficiency` of torch and torchtitan): "
                + ", ".join(f"{hw} {recipe} {f}" for (hw, recipe), f in sorted(fitted.items())))
    return "\n".join(rows), fitted


def main(argv: list[str] | None = None) -> int:
    from readme_section import table_main

    return table_main(__doc__.splitlines()[0], lambda: run()[0], BEGIN, END, argv)

if __name__ == "__main__":
    sys.exit(main())
