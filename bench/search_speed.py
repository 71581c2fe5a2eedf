"""Search speed and plan quality.

Wall time of the whole `gplan search` process for the instances of issue 3 (the median of `RUNS` runs,
after one that writes the bytecode caches, as an installed gplan runs), the solver status of the
best plan, its predicted throughput against the Megatron-style heuristic (tp = devices per node,
smallest pp that fits, mbs 1, uniform split) and against the uniform split of its own configuration;
and the ILP and the dynamic-programming split versus brute force on instances small enough for it, and
against each other on deep ones.

    python bench/search_speed.py [--readme]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gplan.cost_models.step import StepModel
from gplan.planner.inputs import resolve_inputs
from gplan.planner import ilp, split_exact
from gplan.planner.reference import brute_force, megatron_heuristic

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- search-speed:begin -->", "<!-- search-speed:end -->"
HEADLINE_BEGIN, HEADLINE_END = "<!-- search-speed-headline:begin -->", "<!-- search-speed-headline:end -->"
MIXED = str(ROOT / "bench" / "data" / "mixed-a100-v100.yaml")
#: (model, cluster, devices, gbs, seq_length, target): every row plans for gplan's torch backend, the
#: default on GPUs; issue 18's speed targets are llama3-70b/64 ≤ 1 s, gpt-1t/8192 ≤ 2 s,
#: llama3-405b/16384 at seq 8192 and gbs 2048 ≤ 3 s and the README's A100+V100 cluster ≤ 3 s; issue 17's
#: deepseek-v3 on 2048 H100 ≤ 5 s (for Megatron-LM, the target that runs every MoE configuration).
INSTANCES = [
    ("llama3-8b", "dgx-a100-80g", 8, None, None, "torch"), ("llama3-8b", "dgx-a100-80g", 64, None, None, "torch"),
    ("llama3-70b", "dgx-h100", 64, 512, None, "torch"), ("llama3-70b", "dgx-h100", 512, None, None, "torch"),
    ("llama3-70b", "dgx-h100", 1024, None, None, "torch"), ("gpt3-175b", "dgx-a100-80g", 1024, 1536, None, "torch"),
    ("gpt-1t", "dgx-a100-80g", 3072, None, None, "torch"), ("gpt-1t", "dgx-a100-80g", 8192, None, None, "torch"),
    ("llama3-405b", "dgx-h100", 16384, 2048, 8192, "torch"),
    ("llama3-8b", MIXED, 64, None, None, "torch"), ("llama3-70b", MIXED, 64, None, None, "torch"),
    ("qwen3-30b-a3b", "dgx-h100", 16, 1024, 4096, "megatron"), ("deepseek-v3", "dgx-h100", 2048, 8192, 4096, "megatron"),
]


RUNS = 5
"""Timed runs per instance: this 2-core VM's wall times vary by ±30% from run to run (its host's load
drifts over minutes), so the median of five."""


def run_instance(model: str, cluster: str, devices: int, gbs: int | None, seq_length: int | None, target: str) -> str:
    # bytecode caches written and read, as in an installed gplan (a shell that sets PYTHONDONTWRITEBYTECODE
    # would otherwise recompile every module on every run)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plan.json"
        cmd = ["gplan", "search", model, "--cluster", cluster, "--devices", str(devices), "--out", str(out), "--json",
               "--target", target]
        if gbs:
            cmd += ["--gbs", str(gbs)]
        if seq_length:
            cmd += ["--seq-length", str(seq_length)]
        subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
        walls = []
        for _ in range(RUNS):
            start = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
            walls.append(time.perf_counter() - start)
        wall = statistics.median(walls)
        plan = json.loads(out.read_text())
        ranked = json.loads(proc.stdout)["data"]
    inputs = resolve_inputs(model, devices, cluster, gbs=gbs, seq_length=seq_length)
    best = plan["prediction"]["step_time_s"]
    from gplan.plan import Plan
    p = Plan.model_validate(plan)
    if inputs.cluster.is_heterogeneous:
        # both references put every stage on the first node group, beyond what it hosts: no comparison
        heuristic_gain = uniform_gain = "n/a (node groups)"
    elif inputs.model.is_moe:  # the Megatron heuristic has no expert rule (the published layouts are compared instead)
        heuristic_gain = uniform_gain = "n/a (experts)"
    else:
        heuristic = megatron_heuristic(inputs.model, inputs.training, inputs.cluster, devices)
        heuristic_s = StepModel(inputs.model, inputs.training, inputs.cluster, heuristic).predict().step_time_s
        heuristic_gain = f"{heuristic_s / best:.3f}×"
        uniform = StepModel(p.model, p.training, p.cluster, p.parallel.model_copy(update={"recompute": _worst(p)})).predict()
        uniform_gain = f"{uniform.step_time_s / best:.3f}×" if uniform.fits else "uniform does not fit"
    solver = plan["provenance"]["solver"]
    proven = "proven" if plan["search"]["proven_optimal"] else f"best found (worst gap {plan['search']['worst_gap']:.1%})"
    return (f"| {model} | {Path(cluster).stem} | {devices} | {target} | {wall:.2f} s | {ranked['candidates']} / {ranked['ilps_solved']} | "
            f"{solver['name']} {solver['status']} (gap {solver['gap']:.0%}); {proven} | {p.parallel.label()} | "
            f"{heuristic_gain} | {uniform_gain} |")


def _worst(plan) -> str:
    """The uniform recompute a Megatron split of this configuration would need: the heaviest used."""
    used = {c.recompute for s in plan.stages for c in s.layers}
    return next(o for o in ("full", "selective", "none") if o in used)


def ilp_vs_brute_force() -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from helpers import random_table  # the same generator the tests use

    rows = []
    for layers, pp in [(6, 2), (6, 3), (8, 3), (9, 3), (3 + 58, 16), (61, 32)]:
        kinds = [3, layers - 3] if layers > 20 else [layers]  # the deep ones shaped like DeepSeek-V3
        table = random_table(random.Random(layers * 10 + pp), kinds, pp)
        t0 = time.perf_counter()
        exact = brute_force(table) if layers <= 9 else None
        t1 = time.perf_counter()
        solved = ilp.solve(table, time_limit_s=60)
        t2 = time.perf_counter()
        by_dp = split_exact.solve(table)
        t3 = time.perf_counter()
        reference = exact.objective if exact else (solved.split.objective if solved.split else None)
        same = all(x is None for x in (reference, by_dp.split)) or (
            by_dp.split is not None and reference is not None and abs(reference - by_dp.split.objective) < 1e-6 * reference)
        brute = f"{t1 - t0:.3f} s" if layers <= 9 else "—"
        shape = f"{layers} layers ({'+'.join(map(str, kinds))})" if len(kinds) > 1 else f"{layers} layers"
        rows.append(f"| {shape} × {pp} stages × 3 options | {brute} | {t2 - t1:.3f} s ({solved.status}) | "
                    f"{t3 - t2:.3f} s | {'yes' if same else 'NO'} |")
    return "\n".join(["| instance | brute force | ILP (HiGHS) | dynamic programming | same optimum |",
                      "|---|---:|---:|---:|---|"] + rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readme", "--docs", action="store_true",
                        help="write the table into docs/search-speed.md and its headline rows into README.md")
    args = parser.parse_args(argv)
    lines = [f"| model | cluster | devices | target | wall time (whole CLI, median of {RUNS}) | configs / splits | winner's split; search | best plan | vs heuristic | vs uniform split |",
             "|---|---|---:|---|---:|---:|---|---|---:|---:|"]
    lines += [run_instance(*inst) for inst in INSTANCES]
    text = "\n".join(lines) + "\n\n" + ilp_vs_brute_force()
    sys.stdout.write(text + "\n")
    if args.readme:
        from readme_section import write_section

        write_section(BEGIN, END, text)
        write_section(HEADLINE_BEGIN, HEADLINE_END, headline(text))
    return 0


HEADLINE = (("llama3-70b", "dgx-h100", "64"), ("gpt-1t", "dgx-a100-80g", "8192"), ("llama3-405b", "dgx-h100", "16384"),
            ("qwen3-30b-a3b", "dgx-h100", "16"), ("deepseek-v3", "dgx-h100", "2048"))
"""The README's rows of the full table (docs/search-speed.md): model, cluster, devices."""


def headline(text: str) -> str:
    """The full table's header and the HEADLINE rows, model to best plan."""
    lines = text.strip("\n").split("\n\n")[0].splitlines()
    keep = [line for line in lines[2:] if tuple(c.strip() for c in line.strip("|").split("|")[:3]) in HEADLINE]
    cut = [" | ".join(c.strip() for c in line.strip("|").split("|")[:8]) for line in lines[:2] + keep]
    return "\n".join(f"| {line} |" for line in cut)


if __name__ == "__main__":
    sys.exit(main())
