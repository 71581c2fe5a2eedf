"""Published layouts against gplan's search, under gplan's own model and at the same memory allowance.

For each layout NVIDIA published for Megatron-LM on H100 (mbs 1, distributed optimizer, sequence
parallelism; issue 18's list), price it with the cost model as Megatron runs it; give the devices the
memory that layout needs under the model (when that is more than an H100 has, so the comparison is at
the published layout's allowance, not a smaller one); search the same devices, batch and sequence for
Megatron-LM; report both step times.

    python bench/published_layouts.py [--readme]
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from gplan.cost_models.step import StepModel
from gplan.planner import plan as best_plan
from gplan.planner.inputs import resolve_inputs
from gplan.planner.space import SearchLimits
from gplan.spec.parallel import ParallelConfig, even_stage_sizes, layout_from_sizes
from gplan.spec.targets import TARGETS, runs_as

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- published-layouts:begin -->", "<!-- published-layouts:end -->"
BRIDGE_BEGIN, BRIDGE_END = "<!-- bridge-moe-search:begin -->", "<!-- bridge-moe-search:end -->"


@dataclass(frozen=True)
class Published:
    model: str
    devices: int
    gbs: int
    seq_length: int
    tp: int
    pp: int
    vpp: int
    cp: int
    ep: int = 1
    precision: str | None = None
    stages: tuple[int, ...] | None = None
    """Layers per pipeline rank where the published layout is uneven (Megatron's pipeline layout)."""
    recompute: str = "none"
    source: str = "NVIDIA Megatron-LM H100 performance table (issue 18)"
    bridge: bool = False
    """A Megatron-Bridge recipe: bf16 gradient reduction, FP8 parameters with an FP8 recipe (its performance
    scripts' settings, bench/accuracy.py `BRIDGE_LOW_PRECISION_PARAMS`)."""

    @property
    def config(self) -> ParallelConfig:
        dp = self.devices // (self.tp * self.pp * self.cp)
        return ParallelConfig(dp=dp, tp=self.tp, pp=self.pp, vpp=self.vpp, cp=self.cp, ep=self.ep, mbs=1, sp=True,
                              zero=1, schedule="interleaved_1f1b" if self.vpp > 1 else "1f1b", recompute=self.recompute)

    @property
    def label(self) -> str:
        return f"tp{self.tp} pp{self.pp} vpp{self.vpp} cp{self.cp}" + (f" ep{self.ep}" if self.ep > 1 else "")


#: Megatron-LM's published H100 layouts (NVIDIA Megatron-LM performance tables), as quoted in issue 18.
LAYOUTS = [Published("llama3-70b", 512, 1024, 8192, 4, 4, 5, 2), Published("llama3-405b", 2304, 1008, 8192, 8, 9, 7, 2),
           Published("gpt3-175b", 1024, 1024, 2048, 4, 8, 12, 1)]

BRIDGE = "Megatron-Bridge performance summary (megatron_bridge_perf.csv row {})"
#: Mixture-of-experts layouts of Megatron-Bridge on H100 (../shared/reference/megatron_bridge_perf.csv). DeepSeek-V3:
#: row 280 (25.09, 1024 H100, layout Et|(tt|)*30mL: rank 0 one layer fewer with the embedding, the last rank
#: two fewer with the loss; MTP not modelled), selective recompute; Qwen3: rows 96 and 91 (FP8 current scaling).
MOE_LAYOUTS = [
    Published("deepseek-v3", 1024, 8192, 4096, 2, 8, 4, 1, ep=64, stages=(7, 8, 8, 8, 8, 8, 8, 6),
              recompute="selective", source=BRIDGE.format(280), bridge=True),
    Published("qwen3-235b-a22b", 256, 8192, 4096, 2, 8, 4, 1, ep=32, precision="fp8", source=BRIDGE.format(96),
              bridge=True),
    Published("qwen3-30b-a3b", 16, 1024, 4096, 1, 1, 1, 1, ep=16, precision="fp8", source=BRIDGE.format(91),
              bridge=True),
]


def compare(case: Published) -> dict:
    inputs = resolve_inputs(case.model, case.devices, "dgx-h100", gbs=case.gbs, seq_length=case.seq_length,
                            precision=case.precision, target="megatron", grad_reduce_in_bf16=case.bridge,
                            fp8_param_gather=case.bridge and case.precision in ("fp8", "mxfp8"))
    config = case.config
    sizes = list(case.stages) if case.stages else even_stage_sizes(inputs.model.total_layers, config.pp, config.vpp)
    layouts = runs_as(TARGETS["megatron"], inputs.model, config,
                      layout_from_sizes(inputs.model, sizes, [case.recompute] * config.pp))
    published = StepModel(inputs.model, inputs.training, inputs.cluster, config).predict(layouts)
    allowance = max(s.memory_bytes for s in published.stages) / (1 - inputs.training.memory_headroom)
    cluster = inputs.cluster
    if not published.fits:  # raise every device's memory to what the published layout needs
        gib = math.ceil(allowance / 2**30)
        groups = [g.model_copy(update={"hardware": g.hardware.model_copy(update={"memory_GiB": gib})})
                  for g in cluster.node_groups]
        cluster = cluster.model_copy(update={"node_groups": groups})
        inputs = replace(inputs, cluster=cluster)
        published = StepModel(inputs.model, inputs.training, cluster, config).predict(layouts)
    # uneven interleaved splits make a few ILPs hard: 60 s each, so that every search is proven
    inputs = replace(inputs, training=inputs.training.model_copy(update={"engine": "megatron"}))  # the target
    planned = best_plan(inputs, SearchLimits(allow_fewer_devices=False), top=1, time_limit_s=60)
    return {"case": case, "published_s": published.step_time_s, "published_fits": published.fits,
            "memory_GiB": cluster.primary.hardware.memory_GiB, "search_s": planned.plan.prediction.step_time_s,
            "search": planned.plan.parallel.label(), "proven": planned.search.proven_optimal}


def bridge_moe(path: Path) -> list[dict]:
    """Every Megatron-Bridge MoE recipe of the shared table (bench/accuracy.py's `load_moe_cases`: the row's
    layout, recompute modules, bf16 gradients and FP8 parameters), once per (model, system, gbs, seq,
    precision): its layout priced as Megatron runs it, and gplan's search on the same inputs for
    Megatron-LM — at the recipe's own memory (no allowance raised)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from accuracy import load_moe_cases

    seen, out = set(), []
    for b in load_moe_cases(path)[0]:
        c = b.case
        key = (c.model.name, b.system, c.training.gbs, c.training.seq_length, c.training.precision)
        if key in seen:
            continue
        seen.add(key)
        step = StepModel(c.model, c.training, c.cluster, c.config)
        layouts = runs_as(TARGETS["megatron"], c.model, c.config,
                          layout_from_sizes(c.model, even_stage_sizes(c.model.total_layers, c.config.pp, c.config.vpp),
                                            [c.config.recompute] * c.config.pp))
        published = step.predict(layouts)
        from gplan.planner.inputs import Inputs

        training = c.training.model_copy(update={"engine": "megatron"})  # the target: Megatron, as published
        inputs = Inputs(model=c.model, training=training, cluster=c.cluster, devices=c.config.world_size)
        planned = best_plan(inputs, SearchLimits(allow_fewer_devices=False), top=1, time_limit_s=10)
        out.append({"row": c.row_id, "label": f"{c.model.name} {c.config.world_size}×{b.system} {c.training.precision}",
                    "published": c.config.label(), "published_s": published.step_time_s, "fits": published.fits,
                    "search": planned.plan.parallel.label(), "search_s": planned.plan.prediction.step_time_s,
                    "proven": planned.search.proven_optimal})
    return out


def bridge_table(rows: list[dict]) -> str:
    lines = ["| row | run | published layout | fits | its step (model) | gplan search | its step | speed-up |",
             "|---|---|---|---|---:|---|---:|---:|"]
    lines += [f"| {r['row']} | {r['label']} | {r['published']} | {'yes' if r['fits'] else '**no**'} | "
              f"{r['published_s']:.2f} s | {r['search']} | {r['search_s']:.2f} s | {r['published_s'] / r['search_s']:.3f}× |"
              for r in rows]
    refused = sum(not r["fits"] for r in rows)
    slower = sum(r["search_s"] > r["published_s"] * (1 + 1e-9) for r in rows)
    lines += ["", f"{len(rows)} recipes: {refused} published layouts refused for memory; the search slower than the "
              f"published layout on {slower}."]
    return "\n".join(lines)


def table(rows: list[dict]) -> str:
    lines = ["| model | H100s | gbs × seq | published layout | its step (model) | memory allowance | gplan search | "
             "its step | speed-up |", "|---|---:|---|---|---:|---:|---|---:|---:|"]
    for r in rows:
        c = r["case"]
        lines.append(f"| {c.model} | {c.devices} | {c.gbs} × {c.seq_length} | {c.label} | "
                     f"{r['published_s']:.2f} s | {r['memory_GiB']:g} GiB | {r['search']} | {r['search_s']:.2f} s | "
                     f"{r['published_s'] / r['search_s']:.3f}× |")
    return "\n".join(lines)


def write_between(begin: str, end: str, text: str) -> None:
    from readme_section import write_section

    write_section(begin, end, text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readme", action="store_true", help="rewrite the README's table")
    parser.add_argument("--dense-only", action="store_true", help="leave out the mixture-of-experts layouts")
    parser.add_argument("--bridge-moe", type=Path, metavar="CSV", help="instead: every Megatron-Bridge MoE recipe of "
                        "this table (../shared/reference/megatron_bridge_perf.csv) against the search on its inputs")
    args = parser.parse_args()
    if args.bridge_moe:
        rows = bridge_moe(args.bridge_moe)
        print(bridge_table(rows))
        if args.readme:
            write_between(BRIDGE_BEGIN, BRIDGE_END, bridge_table(rows))
        return 0 if all(r["fits"] and r["search_s"] <= r["published_s"] * (1 + 1e-9) for r in rows) else 1
    rows = [compare(c) for c in LAYOUTS + ([] if args.dense_only else MOE_LAYOUTS)]
    text = table(rows)
    print(text)
    if args.readme:
        write_between(BEGIN, END, text)
    return 0 if all(r["search_s"] <= r["published_s"] * (1 + 1e-9) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
