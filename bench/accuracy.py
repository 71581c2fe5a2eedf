"""Accuracy of gplan's cost model against published training runs.

Predicts every row of shared/reference/published_runs.csv whose configuration is complete, the
BLOOM sweep's step times (bloom_sweep_runs.csv, S12) and the bench's own public runs (bench/data/
sc21_zero3_runs.csv: SC21's DeepSpeed ZeRO-3 runs, S22; llm_foundry_h100_runs.csv: llm-foundry's own H100
table, S23), compares the predicted step time with the measured one, and prints per-row and aggregate errors
(median and mean absolute percentage error, per source) in-sample and leave-one-source-out, and the BLOOM sweep's
rank correlation. `--fit` refits the per-hardware efficiencies (four knobs per hardware kind on Megatron's rows,
never one per row, with `gplan.calibration`'s fitter), one factor per other engine and hardware generation and
DeepSpeed's ZeRO-3 constants, and prints them for
profiles/data/hardware.yaml; `--readme` writes the tables into README.md between the accuracy markers.

    python bench/accuracy.py [--csv PATH] [--fit] [--readme]
"""

from __future__ import annotations

import argparse
import ast
import csv
import math
import re
import statistics
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from gplan.calibration.apply import apply
from gplan.calibration.fit import fit_log
from gplan.cost_models.step import StepModel
from gplan.errors import GplanError
from gplan.profiles.catalogue import load_cluster
from gplan.profiles.schema import ClusterSpec, Efficiency
from gplan.engines import ENGINES
from gplan.spec.model import ModelSpec
from gplan.spec.parallel import (DEFAULT_RECOMPUTE_MODULES, PER_OP_MODULES, ParallelConfig, check_config, layout_from_sizes,
                                 uniform_layout)
from gplan.spec.training import TrainingSpec

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CSV = ROOT.parent / "shared" / "reference" / "published_runs.csv"
BENCH_RUNS = ROOT / "bench" / "data" / "sc21_zero3_runs.csv"
"""Public runs gathered for the bench, in published_runs.csv's columns: SC21's DeepSpeed ZeRO-3 runs (S22)."""
FOUNDRY_H100_RUNS = ROOT / "bench" / "data" / "llm_foundry_h100_runs.csv"
"""More of them: llm-foundry's own H100 BF16 table (S23, the README whose A100 rows are S21), its MPT models
under FSDP1 on 8–64 H100s — the only rows of a non-reference engine on H100 (they set llm-foundry's factor there)."""
README = ROOT / "README.md"
BEGIN, END = "<!-- accuracy:begin -->", "<!-- accuracy:end -->"
HEADLINE_BEGIN, HEADLINE_END = "<!-- accuracy-headline:begin -->", "<!-- accuracy-headline:end -->"

#: Published GPU names -> bundled cluster (the hardware and its fabric).
CLUSTERS = {
    "A100-SXM4-80GB": "dgx-a100-80g",
    "A100 80GB": "dgx-a100-80g",
    "A100 40GB": "dgx-a100-40g",
    "H100-SXM5-80GB (700 W)": "dgx-h100",
    "H100 80GB (llm-foundry)": "dgx-h100",
}
#: Sources whose stack runs fused (flash) attention; SC21 and the 2022 Megatron runs predate it.
FLASH_SOURCES = {"S10", "S19", "S21", "S23"}
LOSS_CHUNKS = {"S10": 1}
"""torchtitan's 2024 runs (≤ 0.2) computed the loss over the whole sequence; 0.3's ChunkedLossWrapper came later."""
#: The engine of each source (SOURCES.md): its memory accounting and, where fitted, its efficiency.
ENGINE = {"S1": "megatron", "S3": "megatron", "S4": "megatron", "S19": "megatron", "S10": "torchtitan",
          "S21": "llm-foundry", "S22": "deepspeed", "S23": "llm-foundry"}
#: Sources that ran another source's model and code (its GPT, its FLOP count): SC21's ZeRO-3 runs are S1's,
#: llm-foundry's H100 table runs S21's MPT models.
STACK = {"S22": "S1", "S23": "S21"}


@dataclass
class Case:
    row_id: str
    source: str
    label: str
    model: ModelSpec
    training: TrainingSpec
    config: ParallelConfig
    cluster: ClusterSpec
    selective_layer: bool
    measured_step_s: float
    layouts: list | None = None
    """The run's own stage split where it is not Megatron's even one (BLOOM's pipeline partitions)."""


def _int(value: str) -> int | None:
    return int(float(value)) if value.strip() else None


def measured_step_s(row: dict) -> float | None:
    """Step time from the measurement the row gives, preferring convention-free ones."""
    gbs, seq, gpus = _int(row["global_batch_size"]), _int(row["seq_len"]), _int(row["num_gpus"])
    if row["sec_per_iter"]:
        return float(row["sec_per_iter"])
    if row["tokens_per_sec_per_gpu"] and gbs and seq and gpus:
        return gbs * seq / (float(row["tokens_per_sec_per_gpu"]) * gpus)
    if row["tokens_per_sec_total"] and gbs and seq:
        return gbs * seq / float(row["tokens_per_sec_total"])
    if STACK.get(row["source_id"], row["source_id"]) == "S1" and row["tflops_per_gpu"] and gbs and gpus:
        # S1 counts 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) per iteration (SOURCES.md).
        l, h, v = _int(row["num_layers"]), _int(row["hidden_size"]), _int(row["vocab_size"])
        flops = 96 * gbs * seq * l * h * h * (1 + seq / (6 * h) + v / (16 * l * h))
        return flops / (float(row["tflops_per_gpu"]) * 1e12 * gpus)
    return None


def _zero(text: str) -> int:
    t = text.lower()
    if "full_shard" in t or "fsdp2" in t:
        return 3
    if "grad_op" in t:
        return 2
    if "distributed optimizer" in t:
        return 1
    return 0


def _recompute(text: str) -> tuple[str, tuple[str, ...], bool]:
    """(recompute, its modules, torchtitan's layer-level AC) of a row."""
    t = text.lower()
    if t.startswith("full"):
        return "full", DEFAULT_RECOMPUTE_MODULES, False
    if "selective op" in t:  # torchtitan's per-op SAC: the module `op`
        return "selective", PER_OP_MODULES, False
    if "selective layer" in t:
        # torchtitan's layer SAC (selective_ac_option "2"): every other block fully recomputed
        return "none", DEFAULT_RECOMPUTE_MODULES, True
    if t.startswith("selective"):
        return "selective", DEFAULT_RECOMPUTE_MODULES, False
    return "none", DEFAULT_RECOMPUTE_MODULES, False


#: Fields a source leaves empty but documents elsewhere: S3 trains Megatron's GPT with the same
#: 51200-token vocabulary as S1 (SC21 §5.1; Korthikanti et al. 2022 reuse that setup); S19's NeMo
#: recipes turn on sequence parallelism wherever tp > 1 (`sequence_parallel: True` in its GPT-3 and
#: Nemotron recipes; it has no effect at tp = 1).
ASSUMED = {"S3": {"vocab_size": "51200"}, "S19": {"sequence_parallel": "yes"}}
TP_COMM_OVERLAP_SOURCES: set[str] = set()
"""Published runs priced with Megatron's tp communication overlap (Transformer Engine's userbuffers). None
of published_runs.csv's: S1 and S3 (2021-22) precede it, S4's table does not say; S19's NeMo recipes
probably ran it but its rows do not state it (Megatron-Bridge's rows do: their recipes)."""


def case_from_row(row: dict) -> Case | str:
    """A Case, or the reason the row is incomplete."""
    src = row["source_id"]
    row = {**row, **{k: v for k, v in ASSUMED.get(src, {}).items() if not row[k].strip()}}
    stack = STACK.get(src, src)
    need = ["num_layers", "hidden_size", "vocab_size", "seq_len", "global_batch_size",
            "micro_batch_size", "num_gpus", "tp", "pp"]
    missing = [k for k in need if not row[k].strip()]
    if missing:
        return f"not stated: {', '.join(missing)}"
    if "float8" in row["precision"].lower():
        return "fp8 linears are not modelled"
    if row["gpu_type"] not in CLUSTERS:
        return f"hardware '{row['gpu_type']}' is not in the catalogue"
    step = measured_step_s(row)
    if step is None:
        return "no convention-free measurement"
    layers, hidden = _int(row["num_layers"]), _int(row["hidden_size"])
    heads = _int(row["num_heads"]) or hidden // 128
    swiglu = src == "S10"
    model = ModelSpec(
        name=row["model"], num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
        num_kv_heads=_int(row["num_kv_heads"]) or heads,
        ffn_hidden_size=_int(row["ffn_hidden_size"]) or 4 * hidden,
        ffn_kind="swiglu" if swiglu else ("relu" if "Nemotron" in row["model"] else "gelu"),
        vocab_size=_int(row["vocab_size"]), seq_length=_int(row["seq_len"]),
        tie_embeddings=stack in ("S1", "S3", "S21"), norm="rmsnorm" if swiglu else "layernorm",
        position_embedding="rope" if swiglu else ("alibi" if stack == "S21" else "learned"),
        dropout=0.1 if stack in ("S1", "S3") else 0.0, bias=stack in ("S1", "S3"),
    )
    precision = "fp16" if "fp16" in row["precision"].lower() else "bf16"
    gpus, tp, pp = _int(row["num_gpus"]), _int(row["tp"]), _int(row["pp"])
    cp = _int(row["cp"]) or 1
    dp = _int(row["dp"]) or gpus // (tp * pp * cp)
    vpp = _int(row["vpp"]) or 1
    if row["layers_per_virtual_stage"]:
        vpp = layers // (pp * _int(row["layers_per_virtual_stage"]))
    recompute, modules, selective_layer = _recompute(row["recompute"])
    config = ParallelConfig(dp=dp, tp=tp, pp=pp, vpp=vpp, cp=cp, mbs=_int(row["micro_batch_size"]),
                            sp=row["sequence_parallel"].lower().startswith("yes"),
                            zero=_zero(row["zero_or_fsdp"]) or (1 if src == "S19" else 0),
                            recompute=recompute, recompute_modules=modules)
    training = TrainingSpec(gbs=_int(row["global_batch_size"]), seq_length=_int(row["seq_len"]),
                            precision=precision, flash_attention=src in FLASH_SOURCES, engine=ENGINE.get(src),
                            tp_comm_overlap=src in TP_COMM_OVERLAP_SOURCES, loss_chunks=LOSS_CHUNKS.get(src))
    try:
        check_config(model, training, config, gpus)
    except GplanError as exc:
        return f"inconsistent configuration: {exc.message}"
    cluster = load_cluster(CLUSTERS[row["gpu_type"]], gpus)
    label = f"{row['model']} {gpus}×{row['gpu_type'].split()[0].split('-')[0]} {config.label()}"
    return Case(row["row_id"], src, label, model, training, config, cluster, selective_layer, step)


def load_cases(path: Path) -> tuple[list[Case], list[tuple[str, str, str]]]:
    cases, skipped = [], []
    with path.open() as fh:
        for row in csv.DictReader(fh):
            result = case_from_row(row)
            if isinstance(result, Case):
                cases.append(result)
            else:
                skipped.append((row["row_id"], row["source_id"], result))
    return cases, skipped


def case_layouts(case: Case):
    """The run's split: its own where given, else the uniform one — with every other layer fully
    recomputed for torchtitan's selective AC."""
    if case.layouts is not None:
        return case.layouts
    if not case.selective_layer:
        return None
    layouts = uniform_layout(case.model, case.config.pp, "none", case.config.vpp)
    return [s.model_copy(update={"layers": _half_full(s)}) for s in layouts]


def predict_case(case: Case, eff: Efficiency | None = None, engines: dict[str, float] | None = None) -> float:
    """Step time with the catalogue's knobs, or with fitted hardware knobs `eff` and engine factors."""
    cluster = apply(case.cluster, eff.model_dump()) if eff else case.cluster
    if engines is not None:
        cluster = with_engine_factors(cluster, engines)
    return StepModel(case.model, case.training, cluster, case.config).predict(case_layouts(case)).step_time_s


def with_engine_factors(cluster: ClusterSpec, engines: dict[str, float]) -> ClusterSpec:
    groups = [g.model_copy(update={"hardware": g.hardware.model_copy(update={"engine_efficiency": dict(engines)})})
              for g in cluster.node_groups]
    return cluster.model_copy(update={"node_groups": groups})


def _half_full(stage):
    out = []
    for c in stage.layers:
        full = c.count // 2
        out += [c.model_copy(update={"recompute": "full", "count": full}),
                c.model_copy(update={"count": c.count - full})]
    return out


def error(pred: float, meas: float) -> float:
    """Signed relative error of the predicted step time."""
    return pred / meas - 1


def hardware_of(case: Case) -> str:
    return case.cluster.primary.hardware.name


# ---- fitting ------------------------------------------------------------------------------------

FITTED = ("gemm", "gemm_half_gflop", "attention", "layer_overhead_s")
"""The knobs fitted per hardware kind (never one per row)."""
FLOOR = 1e-6
"""Smallest start value (log-space parameters cannot start at zero)."""


def source_misfit(rows: list[Case], eff: Efficiency, engines: dict[str, float] | None = None) -> float:
    """The fitters' misfit, weighing every source equally — the mean over sources of each source's median
    absolute log error, plus a quarter of its mean — so that one large table cannot outvote the others
    (engine factors `engines`, else the catalogue's)."""
    total = 0.0
    sources = sorted({c.source for c in rows})
    for src in sources:
        errs = [abs(math.log(predict_case(c, eff, engines) / c.measured_step_s)) for c in rows if c.source == src]
        total += statistics.median(errs) + 0.25 * statistics.fmean(errs)
    return total / len(sources)


def fit(cases: list[Case], hardware_names: set[str]) -> Efficiency:
    """The calibration's one fitter (log space, a weak prior toward the catalogue) over the knobs of
    one hardware kind, by `source_misfit`."""
    subset = [c for c in cases if hardware_of(c) in hardware_names]
    base = subset[0].cluster.primary.hardware.efficiency

    def efficiency(theta: dict[str, float]) -> Efficiency:
        return base.model_copy(update={k: min(1.0, v) if k in ("gemm", "attention") else v for k, v in theta.items()})

    start = {k: max(getattr(base, k), FLOOR) for k in FITTED}
    return efficiency(fit_log(lambda theta: source_misfit(subset, efficiency(theta)), start, prior_weight=1e-4,
                              step=0.2))


def fit_flash_attention(cases: list[Case], names: set[str], eff: Efficiency) -> Efficiency:
    """The fused-attention knob where the reference engine's rows of a hardware kind never run fused
    attention (Megatron's A100 rows, SC21 and 2022, predate it: `attention` moves none of their
    predictions): fitted alone on the kind's rows that do, whatever their engine, at engine factor 1 — on a
    grid, its misfit (`source_misfit`) being a step function of one knob."""
    if any(c.training.flash_attention for c in cases
           if hardware_of(c) in names and c.training.engine == REFERENCE_ENGINE):
        return eff
    flash = [c for c in cases if hardware_of(c) in names and c.training.flash_attention]
    if not flash:
        return eff
    grid = [eff.model_copy(update={"attention": a / 200}) for a in range(40, 121)]  # 0.20 … 0.60
    return min(grid, key=lambda e: source_misfit(flash, e, engines={}))


HARDWARE_GROUPS = {"A100": {"a100-80g", "a100-40g"}, "H100": {"h100-sxm"}}
"""Hardware generations -> their kinds: one set of knobs each, and an engine factor per generation."""
REFERENCE_ENGINE = "megatron"
"""The hardware knobs are fitted on this engine's rows; every other engine gets one factor on its
compute efficiencies per hardware generation, fitted on its own rows there with a prior toward 1 (the
reference) — never carried to another generation: llm-foundry's runs fit 1.0 on A100 and far below on H100
under the same code (S21, S23), its kernels being Ampere's."""
PRIOR_ROWS = 5.0
"""Strength of an engine factor's prior, in rows: with n rows its log is shrunk by n / (n + 5)."""


def generation_of(case: Case) -> str:
    name = hardware_of(case)
    return next((g for g, names in HARDWARE_GROUPS.items() if name in names), name)


EngineFactors = dict[tuple[str, str], float]
"""(engine, generation) -> factor on the compute efficiencies; absent: the prior, 1."""


def factors_for(engines: EngineFactors | None, case: Case) -> dict[str, float] | None:
    """The engine factors a case is priced with: those of its generation (None: the catalogue's)."""
    if engines is None:
        return None
    return {e: f for (e, g), f in engines.items() if g == generation_of(case)}


@dataclass
class Fit:
    hardware: dict[str, Efficiency]
    """Hardware name -> its fitted knobs (absent: the catalogue's)."""
    engines: EngineFactors
    zero3: dict[str, float] = field(default_factory=dict)
    """Engine -> its fitted `zero3_comm_efficiency` (absent: the prior, 1)."""

    def predict(self, case: Case) -> float:
        with zero3_constants({e: self.zero3.get(e, 1.0) for e in ZERO3_FITTED}):
            return predict_case(case, self.hardware.get(hardware_of(case)), factors_for(self.engines, case))


ZERO3_FITTED = ("deepspeed",)
"""Engines whose sharded-DP collectives' speed (EngineProfile.zero3_comm_efficiency) is fitted on their own ZeRO-3
runs at scale (S22: DeepSpeed's tensor-by-tensor gathers); the FSDP engines gather unit by unit at the shared
default (their S10, S21 and S23 rows fit at it, llm-foundry's with its backward all-gathers exposed)."""


@contextmanager
def engines_as(updates: dict[str, dict]):
    """ENGINES with these engines' profile fields replaced for the duration (the cost model reads them there)."""
    saved = {e: ENGINES[e] for e in updates}
    for e, fields in updates.items():
        ENGINES[e] = replace(ENGINES[e], **fields)
    try:
        yield
    finally:
        ENGINES.update(saved)


def zero3_constants(constants: dict[str, float]):
    """ENGINES with these engines' collective speed (`zero3_comm_efficiency`) for the duration (`engines_as`)."""
    return engines_as({e: dict(zero3_comm_efficiency=efficiency) for e, efficiency in constants.items()})


def fit_zero3(rows: list[Case], hardware: dict[str, Efficiency], engines: EngineFactors | None) -> float:
    """The collective speed minimising the median absolute log error of an engine's ZeRO-3 rows (a grid of 0.02
    steps; no rows: the prior, 1)."""
    if not rows:
        return 1.0
    engine = rows[0].training.engine
    grid = [x / 50 for x in range(5, 51)]  # 0.10 … 1.00

    def misfit(efficiency: float) -> float:
        with zero3_constants({engine: efficiency}):
            return statistics.median(abs(math.log(predict_case(c, hardware.get(hardware_of(c)), factors_for(engines, c))
                                                  / c.measured_step_s)) for c in rows)

    return min(grid, key=misfit)


def fit_all(cases: list[Case]) -> Fit:
    """Stage 1: per hardware kind, the four knobs on the reference engine's rows (`fit`), the fused-attention
    one on the rows that run it where those do not (`fit_flash_attention`); a kind with none borrows
    another kind's fit. Stage 2: per other engine, the factor minimising the median absolute log error of
    its rows on each hardware generation, shrunk toward 1 by their number (no rows there: 1)."""
    hardware: dict[str, Efficiency] = {}
    missing = []
    for names in HARDWARE_GROUPS.values():
        reference = [c for c in cases if hardware_of(c) in names and c.training.engine == REFERENCE_ENGINE]
        if reference:
            eff = fit_flash_attention(cases, names, fit(reference, names))
            hardware.update({n: eff for n in names})
        else:
            missing.append(names)
    if hardware:
        # A kind without reference rows borrows another kind's fitted knobs: never the catalogue's, which
        # were fitted on the rows a leave-one-source-out run has just left out.
        borrowed = next(iter(hardware.values()))
        for names in missing:
            hardware.update({n: borrowed for n in names})
    engines: EngineFactors = {}
    for engine in sorted({c.training.engine for c in cases} - {REFERENCE_ENGINE, None}):
        # an engine whose ZeRO-3 constants are fitted: its compute factor on its other rows (the prior without)
        rows = [c for c in cases if c.training.engine == engine and not (engine in ZERO3_FITTED and c.config.zero >= 3)]
        for generation in sorted({generation_of(c) for c in rows}):
            engines[(engine, generation)] = _engine_factor([c for c in rows if generation_of(c) == generation],
                                                           hardware)
    zero3 = {e: fit_zero3([c for c in cases if c.training.engine == e and c.config.zero >= 3], hardware, engines)
             for e in ZERO3_FITTED}
    return Fit(hardware, engines, zero3)


def _engine_factor(rows: list[Case], hardware: dict[str, Efficiency]) -> float:
    engine = rows[0].training.engine
    grid = [math.exp(x / 40) for x in range(-40, 41)]  # 0.37 … 2.7

    def misfit(factor: float) -> float:
        errs = [abs(math.log(predict_case(c, hardware.get(hardware_of(c)), {engine: factor}) / c.measured_step_s))
                for c in rows]
        return statistics.median(errs)

    best = min(grid, key=misfit)
    shrink = len(rows) / (len(rows) + PRIOR_ROWS)
    return math.exp(math.log(best) * shrink)


def leave_one_source_out(cases: list[Case]) -> dict[str, list[float]]:
    """Per source: its errors when everything is fitted on the other sources (its engine's factor from
    that engine's other sources, or the prior)."""
    out = {}
    for src in sorted({c.source for c in cases}, key=lambda s: int(s[1:])):
        fitted = fit_all([c for c in cases if c.source != src])
        out[src] = [error(fitted.predict(c), c.measured_step_s) for c in cases if c.source == src]
    return out


def spearman(xs: list[float], ys: list[float]) -> float:
    """Rank correlation (average ranks for ties)."""
    def ranks(v):
        order = sorted(range(len(v)), key=v.__getitem__)
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    return cov / math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))


# ---- the BLOOM sweep (S12) ------------------------------------------------------------------------

BLOOM_CSV = ROOT.parent / "shared" / "reference" / "bloom_sweep_runs.csv"


def bloom_partition(num_layers: int, pp: int, embedding_aware: bool) -> list[int]:
    """Megatron-DeepSpeed's pipeline partition of the transformer layers. `type:transformer` (the
    sweep's default) spreads them as DeepSpeed's `partition_uniform` does (the remainder on the last
    stages); `type:transformer|embedding` (the 02-28 rows) counts each tied embedding copy as one more
    layer, so the first and last stages hold one layer fewer."""
    units = num_layers + 2 if embedding_aware else num_layers
    sizes = [units // pp + (1 if i >= pp - units % pp else 0) for i in range(pp)]
    if embedding_aware:
        sizes[0] -= 1
        sizes[-1] -= 1
    return sizes


JEAN_ZAY = ROOT / "bench" / "data" / "jean-zay-a100.yaml"
"""The sweep's cluster: DGX-like A100 nodes with a quarter of a DGX's inter-node bandwidth (Omni-Path)."""


def load_bloom_cases(path: Path = BLOOM_CSV) -> list[tuple[Case, dict]]:
    """(case, row) for every BLOOM row with a configuration (measured step time, or 0 when it has none:
    the out-of-memory rows): GPT-style (gelu 4h, LayerNorm, ALiBi, tied), Megatron-DeepSpeed ZeRO-1,
    full recompute, its pipeline partition, no flash attention (2022), on Jean Zay's nodes (`JEAN_ZAY`)."""
    out = []
    for r in csv.DictReader(path.open()):
        if not r["dp"] or not r["micro_batch_size"] or "no measurement" in r["status"]:
            continue
        L, h = int(r["num_layers"]), int(r["hidden_size"])
        heads = int(r["num_heads"]) if r["num_heads"] else 64  # "all NHEADS=64" (the sweep's notes)
        model = ModelSpec(name=r["model"], num_layers=L, hidden_size=h, num_attention_heads=heads,
                          vocab_size=int(r["vocab_size"]), seq_length=int(r["seq_len"]), tie_embeddings=True,
                          position_embedding="alibi", bias=True)
        precision = "bf16" if r["precision"].upper().startswith("BF16") else "fp16"
        config = ParallelConfig(dp=int(r["dp"]), tp=int(r["tp"]), pp=int(r["pp"]), mbs=int(r["micro_batch_size"]),
                                zero=1, recompute="full")
        training = TrainingSpec(gbs=int(r["global_batch_size"]), seq_length=int(r["seq_len"]), precision=precision,
                                flash_attention=False, engine="deepspeed")
        layouts = layout_from_sizes(model, bloom_partition(L, config.pp, "embedding" in r["notes"]), ["full"] * config.pp)
        label = f"BLOOM {r['model'].split('(')[1].rstrip(')')} {config.label()} {precision}"
        step = float(r["sec_per_iter"]) if r["sec_per_iter"] else 0.0
        out.append((Case(r["row_id"], "S12", label, model, training, config,
                         load_cluster(str(JEAN_ZAY)).sized(config.world_size), False, step, layouts), r))
    return out


# ---- reporting ----------------------------------------------------------------------------------

@dataclass
class FamilyErrors:
    """One engine's rows of one family (dense / MoE) in one table, by median absolute error."""
    engine: str
    family: str
    table: str
    rows: int
    in_sample: float
    held_source: float | None
    """Held out by source (published runs: leave-one-source-out; Megatron-Bridge, one source: by release)."""
    held_model: float | None
    """Held out by model (None: not computed for that table)."""


def family_table(entries: list[FamilyErrors]) -> str:
    """Every engine and family side by side: in-sample beside held out by source and by model."""
    cell = lambda x: "—" if x is None else f"{x:.1%}"
    lines = ["By engine and family (median absolute step-time error; held out by source: leave-one-source-out on "
             "the published runs, leave-one-release-out on Megatron-Bridge's single source; held out by model: "
             "refitted without the model's rows — not run on the published runs, whose BLOOM sweep alone has "
             "dozens of shapes):", "",
             "| engine | family | table | rows | in-sample | held out by source | held out by model |",
             "|---|---|---|---:|---:|---:|---:|"]
    lines += [f"| {e.engine} | {e.family} | {e.table} | {e.rows} | {e.in_sample:.1%} | {cell(e.held_source)} | "
              f"{cell(e.held_model)} |" for e in entries]
    return "\n".join(lines)


def summarize(errors: list[float]) -> tuple[float, float]:
    absolute = [abs(e) for e in errors]
    return statistics.median(absolute), statistics.fmean(absolute)


def report(cases: list[Case], skipped: list, fitted: Fit, loso: dict[str, list[float]],
           families: list[FamilyErrors] | None = None) -> str:
    """In-sample (the catalogue's fitted knobs and engine factors) beside leave-one-source-out; each engine's
    rows summed up into `families`."""
    rows = [(c, predict_case(c)) for c in cases]
    by_source: dict[str, list[float]] = {}
    for c, p in rows:
        by_source.setdefault(c.source, []).append(error(p, c.measured_step_s))
    engines = {c.source: c.training.engine for c in cases}
    for engine in sorted({engines[s] for s in by_source}):
        sources = [s for s in by_source if engines[s] == engine]
        if families is not None:
            families.append(FamilyErrors(engine, "dense", "published runs", sum(len(by_source[s]) for s in sources),
                                         summarize([e for s in sources for e in by_source[s]])[0],
                                         summarize([e for s in sources for e in loso[s]])[0], None))
    lines = [f"{len(cases)} rows predicted, {len(skipped)} skipped (incomplete configuration). In-sample: the "
             "catalogue's knobs (fitted on every source); leave-one-source-out: everything refitted without the "
             "source, its engine's factor from that engine's other sources on the same hardware generation or, with "
             "none, the prior (1).", "",
             "| source | engine | rows | in-sample median | in-sample mean | leave-one-source-out median | LOSO mean |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for src in sorted(by_source, key=lambda s: int(s[1:])):
        med, mean = summarize(by_source[src])
        lmed, lmean = summarize(loso[src])
        lines.append(f"| {src} | {engines[src]} | {len(by_source[src])} | {med:.1%} | {mean:.1%} | {lmed:.1%} | {lmean:.1%} |")
    med, mean = summarize([e for errs in by_source.values() for e in errs])
    lmed, lmean = summarize([e for errs in loso.values() for e in errs])
    lines.append(f"| **all** | | {len(rows)} | **{med:.1%}** | {mean:.1%} | **{lmed:.1%}** | {lmean:.1%} |")
    bloom = [(c, p) for c, p in rows if c.source == "S12"]
    if bloom:
        rho = spearman([p for _, p in bloom], [c.measured_step_s for c, _ in bloom])
        rho_loso = spearman([c.measured_step_s * (1 + e) for (c, _), e in zip(bloom, loso["S12"])],
                            [c.measured_step_s for c, _ in bloom])
        lines += ["", f"Ranking within the BLOOM sweep (S12, {len(bloom)} runs of one cluster): Spearman "
                  f"ρ = {rho:.2f} in-sample, {rho_loso:.2f} leave-one-source-out."]
    lines += ["", "Engine factors on the compute efficiencies (fitted per hardware generation, prior 1): "
              + ", ".join(f"{e} on {g} {f:.3f}" for (e, g), f in sorted(fitted.engines.items())) + "."]
    lines += ["", "<details><summary>Per row (predicted vs measured step time)</summary>", "",
              "| row | source | run | measured s | predicted s | error |", "|---|---|---|---:|---:|---:|"]
    for c, p in rows:
        lines.append(f"| {c.row_id} | {c.source} | {c.label} | {c.measured_step_s:.3g} | {p:.3g} | "
                     f"{error(p, c.measured_step_s):+.1%} |")
    lines += ["", "Assumed where the source is silent: "
              + "; ".join(f"{src} {k} = {v}" for src, kv in ASSUMED.items() for k, v in kv.items()), "",
              "Skipped rows:", ""]
    reasons: dict[str, list[str]] = {}
    for row_id, src, why in skipped:
        reasons.setdefault(f"{src}: {why}", []).append(row_id)
    lines += [f"- {why} (rows {', '.join(ids)})" for why, ids in sorted(reasons.items())]
    lines += ["", "</details>"]
    return "\n".join(lines)


def zero3_report(cases: list[Case]) -> str:
    """The engines' ZeRO-3 runs at scale (S22): each priced with the shipped constants, with the prior (what
    gplan would say without these runs: leave-one-source-out), and with the constants refitted without the
    row's model, resp. without the row."""
    lines = []
    for engine in ZERO3_FITTED:
        rows = [c for c in cases if c.training.engine == engine and c.config.zero >= 3]
        if not rows:
            continue
        hardware, engines = {}, None  # the catalogue's knobs and engine factors
        errors = {"shipped": [], "prior": [], "model": [], "row": []}
        as_fsdp = []
        for c in rows:
            errors["shipped"].append(error(predict_case(c), c.measured_step_s))
            with zero3_constants({engine: 1.0}):
                errors["prior"].append(error(predict_case(c), c.measured_step_s))
            with engines_as({engine: dict(zero3_overlap=1.0, zero3_gathers_per_tensor=False, zero3_comm_efficiency=1.0)}):
                as_fsdp.append(error(predict_case(c), c.measured_step_s))
            for key, kept in (("model", [r for r in rows if r.model.name != c.model.name]),
                              ("row", [r for r in rows if r is not c])):
                with zero3_constants({engine: fit_zero3(kept, hardware, engines)}):
                    errors[key].append(error(predict_case(c), c.measured_step_s))
        shipped = ENGINES[engine]
        slow = [1 / (1 + e) for e in as_fsdp]
        lines += [f"{engine}: ZeRO-3 at scale ({len(rows)} runs of SC21's Table 2, S22, "
                  "`bench/data/sc21_zero3_runs.csv`). Priced as FSDP2 runs it (one prefetched collective per layer, "
                  f"the shared default) they would be {min(slow):.1f}–{max(slow):.1f}× too fast: the DeepSpeed they "
                  "ran gathered each parameter tensor by a call of its own and waited for it (issue #1069, PR #1188), "
                  "so nothing hides and every call pays the ring's latency, "
                  f"{shipped.zero3_gather_host_s * 1e3:.2f} ms of host time (#1069) and one copy kernel per rank "
                  "(the list `all_gather`) — a cost that grows with the GPUs, as the runs' flat step times do "
                  f"(`EngineProfile.zero3_gathers_per_tensor`; the copies' launch taken as {shipped.zero3_copy_launch_s * 1e6:g} µs, "
                  "a kernel launch, not fitted). At the ring's speed (the prior column: what gplan says without these "
                  "runs, as leave-one-source-out) that is the whole model; fitted on them, its list all-gathers of "
                  f"one tensor's slices reach {shipped.zero3_comm_efficiency:.0%} of the ring's speed "
                  "(`zero3_comm_efficiency`).", "",
                  "| row | run | measured s | shipped | prior (held out by source) | held out by model | held out by row |",
                  "|---|---|---:|---:|---:|---:|---:|"]
        for i, c in enumerate(rows):
            lines.append(f"| {c.row_id} | {c.label} | {c.measured_step_s:.3g} | {errors['shipped'][i]:+.1%} | "
                         f"{errors['prior'][i]:+.1%} | {errors['model'][i]:+.1%} | {errors['row'][i]:+.1%} |")
        med = {k: summarize(v)[0] for k, v in errors.items()}
        lines.append(f"| **median** | | | **{med['shipped']:.1%}** | {med['prior']:.1%} | **{med['model']:.1%}** | "
                     f"{med['row']:.1%} |")
    shares = {}
    for c in cases:  # why the FSDP engines keep the shared default: their rows barely see the collectives
        if c.training.engine not in ZERO3_FITTED and c.config.zero >= 3:
            p = StepModel(c.model, c.training, c.cluster, c.config).predict(case_layouts(c))
            shares.setdefault(c.training.engine, []).append(p.breakdown.dp_comm / p.step_time_s)
    if shares:
        lines += ["", "The FSDP engines' fully sharded rows expose at most "
                  + ", ".join(f"{max(v):.1%} ({e}, {len(v)} rows)" for e, v in sorted(shares.items()))
                  + " of their step in sharded-DP collectives: they keep the shared speed and overlap (the prior), "
                  "and differ in structure only — FSDP1 as llm-foundry runs it (Composer's BACKWARD_POST) exposes "
                  "each unit's backward all-gather, FSDP2 prefetches it (`EngineProfile.zero3_backward_prefetch`)."]
    return "\n".join(lines)


def write_readme(table: str) -> None:
    """The full tables into docs/accuracy.md, the by-engine-and-family headline into the README."""
    from readme_section import write_section

    write_section(BEGIN, END, table)
    write_section(HEADLINE_BEGIN, HEADLINE_END, headline(table))


def headline(table: str) -> str:
    """The README's accuracy table: the by-engine-and-family block of the full tables."""
    from readme_section import first_block

    return first_block(table)


def all_cases(path: Path) -> tuple[list[Case], list]:
    cases, skipped = load_cases(path)
    for more_runs in (BENCH_RUNS, FOUNDRY_H100_RUNS):
        if more_runs.is_file():
            more, more_skipped = load_cases(more_runs)
            cases, skipped = cases + more, skipped + more_skipped
    if BLOOM_CSV.is_file():
        cases += [c for c, _ in load_bloom_cases() if c.measured_step_s]
    return cases, skipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    parser.add_argument("--fit", action="store_true", help="refit the knobs and engine factors and print them")
    parser.add_argument("--readme", action="store_true", help="write the tables into docs/accuracy.md and the headline into README.md")
    args = parser.parse_args(argv)
    if not args.csv.is_file():
        sys.stderr.write(f"error: {args.csv}: no such file (pass --csv)\n")
        return 3
    cases, skipped = all_cases(args.csv)
    fitted = fit_all(cases)
    if args.fit:
        for name, eff in sorted(fitted.hardware.items()):
            sys.stdout.write(f"{name}: {eff.model_dump()}\n")
        sys.stdout.write(f"engine_efficiency: {fitted.engines}\n")
        sys.stdout.write(f"zero3_comm_efficiency: {fitted.zero3}\n")
        if BRIDGE_CSV.is_file():
            factors = fit_precision_factors(load_bridge_cases()[0])
            sys.stdout.write(f"precision_efficiency: { {f'{k[0]}/{k[1]}': round(v, 3) for k, v in factors.items()} }\n")
            moe = load_moe_cases()[0]
            sys.stdout.write(f"experts: {fit_moe_constants(moe, {b.case.row_id: moe_parts(b) for b in moe})}\n")
        return 0
    families: list[FamilyErrors] = []
    table = report(cases, skipped, fitted, leave_one_source_out(cases), families) + "\n\n" + zero3_report(cases)
    if BRIDGE_CSV.is_file():
        table += "\n\n" + bridge_report(families=families) + "\n\n" + moe_report(families=families) + "\n\n" + memory_report()
    table = family_table(families) + "\n\n" + table
    sys.stdout.write(table + "\n")
    if args.readme:
        write_readme(table)
    return 0



# ---- Megatron-Bridge's dense rows (megatron_bridge_perf.csv): FP8 recipes on H100 and Blackwell ----------

BRIDGE_CSV = ROOT.parent / "shared" / "reference" / "megatron_bridge_perf.csv"
BRIDGE_MODELS = {"LLAMA3_8B": "llama3-8b", "LLAMA3_70B": "llama3-70b", "LLAMA3.1_405B": "llama3-405b"}
BRIDGE_SYSTEMS = {"H100": "dgx-h100", "B200": "dgx-b200", "B300": "dgx-b300", "GB200": "gb200-nvl72",
                  "GB300": "gb300-nvl72"}
BRIDGE_PRECISION = {"FP8": "fp8", "FP8-CS": "fp8", "FP8-MX": "mxfp8", "MXFP8": "mxfp8", "NVFP4": "nvfp4", "BF16": "bf16"}


BRIDGE_LOW_PRECISION_PARAMS = ("fp8", "mxfp8")
"""The recipes whose weights Megatron-Bridge keeps only quantised: `bf16_with_fp8_current_scaling_mixed` and
`bf16_with_mxfp8_mixed` set `fp8_param_gather = True`, `bf16_with_nvfp4_mixed` sets it False
(Megatron-Bridge, src/megatron/bridge/training/mixed_precision.py). Every performance recipe of the table
also reduces gradients in bf16 (`grad_reduce_in_fp32 = False` in each model's
scripts/performance/configs/*_llm_pretrain.py common settings): the rows are priced with both."""


@dataclass
class BridgeCase:
    case: Case
    release: str
    system: str
    stated: ParallelConfig | None = None
    """Where the row is priced at its recipe's layout (`layout_donor`): the layout its table states."""


def load_bridge_cases(path: Path = BRIDGE_CSV) -> tuple[list[BridgeCase], list[tuple[str, str]]]:
    """The dense rows: the bundled Llama 3 shapes, Megatron-Core (distributed optimizer; Megatron-FSDP
    where the row gives an FSDP degree or its settings `use_megatron_fsdp=True`), sequence parallelism with
    tp > 1 (the recipes' setting), flash attention, the recompute and activation offloading
    (`cpu_offloading_num_layers`) its settings state; step time = gbs·seq / (tokens/s/GPU · GPUs)."""
    from gplan.profiles.catalogue import load_model

    out, skipped = [], []
    table = list(csv.DictReader(path.open()))
    for r in table:
        if r["is_moe"] == "true":
            continue
        if not r["precision"]:
            skipped.append((r["row_id"], "precision not stated (25.09 tables)"))
            continue
        model = load_model(BRIDGE_MODELS[r["model"]])
        stated = None
        donor = settings_donor(r, table)
        if donor is not None:
            r = {**r, "fsdp": donor["fsdp"], "other_settings": donor["other_settings"], "inherited": donor["row_id"]}
        elif (recipe := layout_donor(r, table)) is not None:
            stated = r
            r = {**r, **{k: recipe[k] for k in LAYOUT_FIELDS}, "fsdp": recipe["fsdp"],
                 "other_settings": recipe["other_settings"], "relaid": recipe["row_id"], "stated": layout_text(r)}
        fsdp = int(r["fsdp"]) if r["fsdp"] else 0
        settings = r["other_settings"]
        recompute, modules = recompute_of(settings)
        offload = re.search(r"cpu_offloading_num_layers=(\d+)", settings)
        config = ParallelConfig(**row_layout(r), zero=3 if fsdp or "use_megatron_fsdp=True" in settings else 1,
                                recompute=recompute, recompute_modules=modules,
                                offload_layers=int(offload.group(1)) if offload else 0)
        case = _add_bridge_case(r, model, config, out, skipped)
        if case is not None and stated is not None:  # the same settings at the layout the table states
            case.stated = ParallelConfig(**config.model_dump(exclude={"schedule"}) | row_layout(stated))
    return out, skipped


def row_vpp(r: dict) -> int:
    """A Bridge row's virtual stages per pipeline rank (`n/a` or empty: 1)."""
    return int(r["vp"]) if r["vp"] not in ("", "n/a") else 1


def row_layout(r: dict) -> dict:
    """A Bridge row's layout as ParallelConfig fields: dp from its GPU count, sp wherever tp > 1 (the recipes')."""
    tp, pp, cp = int(r["tp"]), int(r["pp"]), int(r["cp"])
    return dict(dp=int(r["num_gpus"]) // (tp * pp * cp), tp=tp, pp=pp, cp=cp, vpp=row_vpp(r),
                mbs=int(r["micro_batch_size"]), sp=tp > 1)


RECIPE_SETTINGS = re.compile(r"\[from |recompute_|cpu_offloading|use_megatron_fsdp")
"""What a row's `other_settings` hold when its table states the recipe (its source, recompute, offloading,
Megatron-FSDP); a row with none of it — the 25.11 tables' `GA=…` notes, empty 26.02.01 rows — states none."""


def _release_key(release: str) -> tuple[int, ...]:
    return tuple(int(x) for x in release.split("."))


def settings_donor(r: dict, table: list[dict]) -> dict | None:
    """For a dense row whose table states no recipe settings: the row of the same model, system and layout
    (tp pp cp vp mbs) in the nearest release that states them — at the same precision if one does, else at
    any — whose memory settings (Megatron-FSDP, offloading, recompute) it is priced with; None where the
    row states its own or none matches. Megatron-Bridge keeps one performance preset per (model, system,
    layout) across releases (scripts/performance/configs/llama/llama3_workload_base_configs.py), and a
    70B layout at tp1 pp1 cannot run without sharding its states: the README names each row priced so."""
    if RECIPE_SETTINGS.search(r["other_settings"]):
        return None
    def layout(row: dict) -> tuple:
        return row["model"], row["system"], row["tp"], row["pp"], row["cp"], row_vpp(row), row["micro_batch_size"]

    same = [d for d in table if d["is_moe"] != "true" and d["row_id"] != r["row_id"] and
            layout(d) == layout(r) and RECIPE_SETTINGS.search(d["other_settings"])]
    precise = [d for d in same if BRIDGE_PRECISION.get(d["precision"]) == BRIDGE_PRECISION.get(r["precision"])]
    pool = precise or same
    if not pool:
        return None
    here = _release_key(r["release"])
    return min(pool, key=lambda d: (abs(_release_key(d["release"])[0] - here[0]) * 100
                                    + abs(_release_key(d["release"])[1] - here[1]), d["row_id"]))


LAYOUT_FIELDS = ("tp", "pp", "cp", "vp", "micro_batch_size")


def layout_text(r: dict) -> str:
    vp = f" vp{row_vpp(r)}" if row_vpp(r) > 1 else ""
    return f"tp{r['tp']} pp{r['pp']}{vp} cp{r['cp']} mbs{r['micro_batch_size']}"


def layout_donor(r: dict, table: list[dict]) -> dict | None:
    """For a dense row that states no recipe and has no settings donor: the row whose layout its model,
    system and precision run in every other release — when every row of them that names its preset
    (`[from …]`) gives one layout, unlike the row's own — in the nearest release; else None.

    Megatron-Bridge keeps one preset per (model, system, precision): where every release around a row
    runs one layout and the row's stated layout is in no preset of any release, the table mis-states
    the row rather than the run changing layout for one release. The README lists each row priced so,
    with its prediction at the layout the table states."""
    if RECIPE_SETTINGS.search(r["other_settings"]):
        return None
    kin = [d for d in table if d["row_id"] != r["row_id"] and "[from " in d["other_settings"] and
           (d["model"], d["system"], d["num_gpus"]) == (r["model"], r["system"], r["num_gpus"]) and
           BRIDGE_PRECISION.get(d["precision"]) == BRIDGE_PRECISION.get(r["precision"])]
    layouts = {layout_text(d) for d in kin}
    if len(kin) < 2 or len(layouts) != 1 or layout_text(r) in layouts:
        return None
    here = _release_key(r["release"])
    return min(kin, key=lambda d: (abs(_release_key(d["release"])[0] - here[0]) * 100
                                   + abs(_release_key(d["release"])[1] - here[1]), d["row_id"]))


def _add_bridge_case(r: dict, model, config: ParallelConfig, out: list, skipped: list,
                     **options) -> BridgeCase | None:
    """The row as a case (Megatron-LM, its precision, the engine `options` its settings state; step time =
    gbs·seq / (tokens/s/GPU · GPUs)) added to `out` and returned, or skipped with the rule it breaks."""
    gpus = int(r["num_gpus"])
    precision = BRIDGE_PRECISION[r["precision"]]
    training = TrainingSpec(gbs=int(r["global_batch_size"]), seq_length=int(r["seq_len"]), precision=precision,
                            engine="megatron", grad_reduce_in_bf16=True,
                            fp8_param_gather=precision in BRIDGE_LOW_PRECISION_PARAMS, **options)
    try:
        check_config(model, training, config, gpus)
    except GplanError as exc:
        skipped.append((r["row_id"], f"not expressible yet: {exc.message}"))
        return None
    step = training.gbs * training.seq_length / (float(r["tokens_per_sec_per_gpu"]) * gpus)
    inherited = (f"; settings of row {r['inherited']}" if r.get("inherited") else
                 f"; layout of row {r['relaid']}, stated {r['stated']}" if r.get("relaid") else "")
    label = f"{r['model']} {gpus}×{r['system']} {r['precision']} {config.label()} ({r['release']}{inherited})"
    cluster = load_cluster(BRIDGE_SYSTEMS[r["system"]], gpus)
    out.append(BridgeCase(Case(r["row_id"], "MB", label, model, training, config, cluster, False, step),
                          r["release"], r["system"]))
    return out[-1]


PRECISION_PRIOR_ROWS = 2.0
"""A (system, precision) factor's prior strength in rows (toward the H100 FP8 factor)."""


def fit_precision_factors(rows: list[BridgeCase]) -> dict[tuple[str, str], float]:
    """One factor on the GEMM efficiency per (system, precision), fitted on its rows (median absolute log
    error, a grid) and shrunk toward the H100 FP8 factor — itself shrunk toward 1 — by its row count."""
    def best(group: list[BridgeCase], prior: float) -> float:
        grid = [prior * math.exp(x / 40) for x in range(-60, 41)]

        def misfit(f: float) -> float:
            return statistics.median(abs(math.log(_bridge_predict(b, f) / b.case.measured_step_s)) for b in group)

        shrink = len(group) / (len(group) + PRECISION_PRIOR_ROWS)
        return prior * math.exp(math.log(min(grid, key=misfit) / prior) * shrink)

    groups: dict[tuple[str, str], list[BridgeCase]] = {}
    for b in rows:
        groups.setdefault((b.system, b.case.training.precision), []).append(b)
    reference = best(groups[("H100", "fp8")], 1.0) if ("H100", "fp8") in groups else 1.0
    return {key: best(group, reference) for key, group in groups.items()} | {("*", "*"): reference}


def _bridge_predict(b: BridgeCase, factor: float) -> float:
    precision = b.case.training.precision
    groups = [g.model_copy(update={"hardware": g.hardware.model_copy(update={
        "precision_efficiency": {**g.hardware.precision_efficiency, precision: factor}})}) for g in b.case.cluster.node_groups]
    cluster = b.case.cluster.model_copy(update={"node_groups": groups})
    return StepModel(b.case.model, b.case.training, cluster, b.case.config).predict().step_time_s


def bridge_errors(rows: list[BridgeCase], factors: dict[tuple[str, str], float]) -> list[float]:
    return [error(_bridge_predict(b, factors.get((b.system, b.case.training.precision), factors[("*", "*")])),
                  b.case.measured_step_s) for b in rows]


def bridge_report(path: Path = BRIDGE_CSV, families: list[FamilyErrors] | None = None) -> str:
    rows, skipped = load_bridge_cases(path)
    factors = fit_precision_factors(rows)
    in_sample = bridge_errors(rows, factors)
    by_release, by_model = {}, {}
    for key_of, store in ((lambda b: b.release, by_release), (lambda b: b.case.model.name, by_model)):
        for key in sorted({key_of(b) for b in rows}):
            held = [b for b in rows if key_of(b) == key]
            store[key] = bridge_errors(held, fit_precision_factors([b for b in rows if key_of(b) != key]))
    # as gplan ships: the catalogue's own factors (what `gplan estimate` at each published layout gives)
    shipped = [error(StepModel(b.case.model, b.case.training, b.case.cluster, b.case.config).predict().step_time_s,
                     b.case.measured_step_s) for b in rows]
    lines = [f"Megatron-Bridge's dense rows: {len(rows)} priced, {len(skipped)} skipped "
             f"({'; '.join(sorted({why.split(':')[0] for _, why in skipped}))}); Megatron's tp communication "
             "overlap priced as the recipes run it (all but NVFP4).", "",
             "| system | precision | rows | factor | in-sample median | leave-one-release-out | leave-one-model-out | "
             "shipped catalogue |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    loro = {b.case.row_id: e for key, errs in by_release.items()
            for b, e in zip([b for b in rows if b.release == key], errs)}
    lomo = {b.case.row_id: e for key, errs in by_model.items()
            for b, e in zip([b for b in rows if b.case.model.name == key], errs)}
    def medians(idx: list[int]) -> str:
        """In-sample, held-out by release and by model, and shipped medians of the rows `idx`."""
        errors = (in_sample, [loro[b.case.row_id] for b in rows], [lomo[b.case.row_id] for b in rows], shipped)
        return " | ".join(f"{summarize([e[i] for i in idx])[0]:.1%}" for e in errors)

    for key in sorted({(b.system, b.case.training.precision) for b in rows}):
        idx = [i for i, b in enumerate(rows) if (b.system, b.case.training.precision) == key]
        lines.append(f"| {key[0]} | {key[1]} | {len(idx)} | {factors[key]:.3f} | {medians(idx)} |")
    for system in sorted({b.system for b in rows}):
        lines.append(f"| {system} | all | {sum(b.system == system for b in rows)} | | "
                     f"{medians([i for i, b in enumerate(rows) if b.system == system])} |")
    if families is not None:
        families.append(FamilyErrors("megatron", "dense", "Megatron-Bridge", len(rows), summarize(in_sample)[0],
                                     summarize(list(loro.values()))[0], summarize(list(lomo.values()))[0]))
    everything = medians(list(range(len(rows)))).split(" | ", 1)
    lines.append(f"| **all** | | {len(rows)} | | **{everything[0]}** | {everything[1]} |")
    lines += ["", "<details><summary>Per row</summary>", "", "| row | run | measured s | in-sample error |",
              "|---|---|---:|---:|"]
    lines += [f"| {b.case.row_id} | {b.case.label} | {b.case.measured_step_s:.3g} | {e:+.1%} |" for b, e in zip(rows, in_sample)]
    lines += ["", "Skipped: " + "; ".join(f"row {rid} ({why})" for rid, why in skipped), "", "</details>"]
    return "\n".join(lines)


def memory_report(path: Path = BRIDGE_CSV) -> str:
    """Every priced Bridge row ran to completion: none may be predicted above its device's physical memory,
    and each should fit gplan's budget (physical less the headroom). A row that does not is named with the
    term that decides: its states alone, or its activations."""
    lines = ["Peak memory of Megatron-Bridge's rows, each priced as its recipe states it (recompute modules, "
             "activation offloading, Megatron-FSDP, bf16 gradient reduction, FP8 parameters (`BRIDGE_LOW_PRECISION_PARAMS`) "
             "and the flex dispatcher's DeepEP buffers (`moe_options_of`) where its recipe sets them):", "",
             "| rows | priced | above physical memory | above gplan's budget (headroom 10%) |", "|---|---:|---:|---:|"]
    named, relaid = [], []
    table = {r["row_id"]: r for r in csv.DictReader(path.open())}
    for family, loader in (("dense", load_bridge_cases), ("MoE", load_moe_cases)):
        rows = loader(path)[0]
        over = budget = 0
        for b in rows:
            c = b.case
            p = StepModel(c.model, c.training, c.cluster, c.config).predict()
            physical = c.cluster.node_groups[0].hardware.memory_bytes
            peak = p.memory_bytes_per_device_max
            if b.stated is not None:
                as_stated = StepModel(c.model, c.training, c.cluster, b.stated).predict()
                relaid.append(f"| {c.row_id} | {layout_text(table[c.row_id])}: {as_stated.memory_bytes_per_device_max / 2**30:.0f} "
                              f"GiB, {as_stated.step_time_s / c.measured_step_s - 1:+.1%} | {c.label} | "
                              f"{peak / 2**30:.0f} GiB, {p.step_time_s / c.measured_step_s - 1:+.1%} | "
                              f"{physical / 2**30:.0f} GiB |")
            over += peak > physical
            budget += not p.fits
            if not p.fits:
                stage = max(p.stages, key=lambda s: s.memory_bytes)
                m = stage.memory
                states = m.weights_bytes + m.grads_bytes + m.optimizer_bytes
                term = (f"states alone {states / 2**30:.0f} GiB" if states > physical * 0.9 else
                        f"activations {m.activations_bytes / 2**30:.0f} GiB beside {states / 2**30:.0f} GiB of states")
                elsewhere = other_layouts(table[c.row_id], table.values()) if peak > physical else ""
                named.append(f"| {c.row_id} | {c.label} | {peak / 2**30:.0f} of {physical / 2**30:.0f} GiB | {term} | "
                             f"{elsewhere} |")
        lines.append(f"| {family} | {len(rows)} | {over} | {budget} |")
    if relaid:
        lines += ["", "Rows priced at their preset's layout, not the one their table states (`layout_donor`: the row "
                  "names no preset, and every release that names one runs its model, system and precision at one "
                  "other layout — a table's slip, not a run that changed layout for one release; its throughput "
                  "sits with those releases'). Each with its prediction (peak memory, step-time error) both ways:",
                  "", "| row | as the table states it | priced as | at the preset's layout | device |",
                  "|---|---|---|---|---:|", *relaid]
    if named:
        lines += ["", "The rows gplan does not fit, and the term that decides (a row whose table states no recipe "
                  "settings is priced with those of the same model, system and layout in the nearest release that "
                  "states them — `settings_donor`, shown as \"settings of row N\"; a row with no such neighbour, or "
                  "stating `WorkloadBaseConfig overrides only`, as written):",
                  "", "| row | run | predicted peak | deciding term | above physical: the same model, system and "
                  "precision in the table's other releases |", "|---|---|---:|---|---|", *named]
    return "\n".join(lines)


def other_layouts(r: dict, table) -> str:
    """The layouts (tp pp vp mbs) the table gives the row's model, system and precision in other releases,
    with their rows: where a row's own layout is unlike all of them, its table likely mis-states it."""
    found: dict[str, list[str]] = {}
    for d in table:
        if (d["model"], d["system"]) != (r["model"], r["system"]) or d["row_id"] == r["row_id"] or \
                BRIDGE_PRECISION.get(d["precision"]) != BRIDGE_PRECISION.get(r["precision"]):
            continue
        found.setdefault(f"tp{d['tp']} pp{d['pp']} vp{d['vp'] or '-'} mbs{d['micro_batch_size']}", []).append(d["row_id"])
    found.pop(f"tp{r['tp']} pp{r['pp']} vp{r['vp'] or '-'} mbs{r['micro_batch_size']}", None)
    return "; ".join(f"{layout} (rows {', '.join(rows)})" for layout, rows in found.items()) or "none"


# ---- Megatron-Bridge's mixture-of-experts rows ------------------------------------------------------

BRIDGE_MOE_MODELS = {"DeepSeekV3": "deepseek-v3", "DeepSeekV3 (dropless)": "deepseek-v3",
                     "Qwen3_30B_a3B": "qwen3-30b-a3b", "Qwen3_235B_a22B": "qwen3-235b-a22b"}
"""Bundled shapes of the rows' models; "(tokendrop)" rows dropped tokens at an unstated capacity: left out."""


def recompute_of(settings: str) -> tuple[str, tuple[str, ...]]:
    """A row's recompute as its `other_settings` state it: the granularity, and the modules selective layers
    recompute (`recompute_modules=[...]`; listed without a granularity — a WorkloadBaseConfig override of a
    base recipe that recomputes selectively — they mean selective; `[]`: selective recomputes nothing)."""
    modules = re.search(r"recompute_modules=(\[[^\]]*\])", settings)
    named = tuple(ast.literal_eval(modules.group(1))) if modules else DEFAULT_RECOMPUTE_MODULES
    for option in ("full", "selective"):
        if f"recompute_granularity={option}" in settings:
            return option, named
    return ("selective", named) if modules else ("none", DEFAULT_RECOMPUTE_MODULES)


def load_moe_cases(path: Path = BRIDGE_CSV) -> tuple[list[BridgeCase], list[tuple[str, str]]]:
    """The MoE rows with a bundled shape: Megatron-Core with the distributed optimizer, sp with tp, the
    row's ep and etp (etp = tp where the row leaves it empty, Megatron's default), recompute as its
    recipe says, balanced routing (the rows force it), even stage split; MTP layers not modelled."""
    from gplan.profiles.catalogue import load_model

    out, skipped = [], []
    for r in csv.DictReader(path.open()):
        if r["is_moe"] != "true":
            continue
        if r["model"] not in BRIDGE_MOE_MODELS or not r["tokens_per_sec_per_gpu"]:
            skipped.append((r["row_id"], "token-dropping, unbundled shape or no throughput"))
            continue
        if not r["precision"]:
            skipped.append((r["row_id"], "precision not stated (25.09 tables)"))
            continue
        model = load_model(BRIDGE_MOE_MODELS[r["model"]])
        gpus, tp, pp, cp, ep = (int(r[k]) for k in ("num_gpus", "tp", "pp", "cp", "ep"))
        etp = int(r["etp"]) if r["etp"] else tp
        vpp = row_vpp(r)
        recompute, modules = recompute_of(r["other_settings"])
        config = ParallelConfig(dp=gpus // (tp * pp * cp), tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp,
                                mbs=int(r["micro_batch_size"]), sp=tp > 1, zero=1, recompute=recompute,
                                recompute_modules=modules)
        _add_bridge_case(r, model, config, out, skipped, **moe_options_of(r["other_settings"]))
    return out, skipped


def moe_options_of(settings: str) -> dict:
    """The MoE engine options a row's settings state (TrainingSpec.moe_a2a_overlap, cuda_graphs,
    moe_dispatcher): the all-to-all overlap (`moe_a2a_overlap=True`, or `ep_a2a_overlap=True` in the 26.08
    recipes), what `cuda_graph_impl` captures (`full_iteration`; `transformer_engine` with the router in its
    scope), and the flex dispatcher where a DeepEP or HybridEP backend is named (Megatron-Bridge's
    `apply_flex_dispatcher_backend` sets `moe_token_dispatcher_type = "flex"` for it); else the all-to-all
    its model providers set. A row that states none — the 25.11 tables, rows without settings — is priced
    without: it may have run them, which shows as a row predicted faster than it ran only if it did not."""
    scope = re.search(r"cuda_graph_scope=(\[[^\]]*\])", settings)
    scopes = set(ast.literal_eval(scope.group(1))) if scope else set()
    graphs = ("full_iteration" if "cuda_graph_impl=full_iteration" in settings else
              "moe_router" if "cuda_graph_impl=transformer_engine" in settings and "moe_router" in scopes else "none")
    flex = re.search(r"moe_flex_dispatcher_backend=|moe_token_dispatcher_type=flex", settings)
    return {"moe_a2a_overlap": bool(re.search(r"\b(moe|ep)_a2a_overlap=True", settings)), "cuda_graphs": graphs,
            "moe_dispatcher": "flex" if flex else "alltoall"}


@dataclass(frozen=True)
class MoeParts:
    """A row's prediction split by the MoE constants of cost_models.experts (the step is affine in each
    while its critical stage stays the same, which extra predictions pin down): `rest` — all but the
    routed GEMMs, the all-to-all and the host time; `gemm` at grouped-GEMM efficiency 1; `alltoall`
    at efficiency 1, fully exposed; `host_per_s` — step seconds per second of host time per MoE-layer
    pass; its graphs, overlap and local experts."""

    rest: float
    gemm: float
    alltoall: float
    host_per_s: float
    graphs: str
    overlap: bool
    local_experts: int


@dataclass(frozen=True)
class MoeConstants:
    """cost_models.experts' fitted constants."""

    gemm: float
    alltoall: float
    overlapped: float
    sync_none_s: float
    sync_router_s: float
    launch_s: float

    @classmethod
    def shipped(cls) -> "MoeConstants":
        from gplan.cost_models import experts as x

        return cls(x.GROUPED_GEMM_EFFICIENCY, x.ALLTOALL_EFFICIENCY, x.OVERLAPPED_ALLTOALL_EXPOSED,
                   x.HOST_SYNC_S["none"], x.HOST_SYNC_S["moe_router"], x.EXPERT_LAUNCH_S)

    def apply(self) -> None:
        from gplan.cost_models import experts as x

        x.GROUPED_GEMM_EFFICIENCY, x.ALLTOALL_EFFICIENCY = self.gemm, self.alltoall
        x.OVERLAPPED_ALLTOALL_EXPOSED, x.EXPERT_LAUNCH_S = self.overlapped, self.launch_s
        x.HOST_SYNC_S = {"none": self.sync_none_s, "moe_router": self.sync_router_s, "full_iteration": 0.0}

    def step_s(self, p: MoeParts) -> float:
        exposed = self.overlapped if p.overlap else 1.0
        sync = {"none": self.sync_none_s, "moe_router": self.sync_router_s, "full_iteration": 0.0}[p.graphs]
        launch = 0.0 if p.graphs == "full_iteration" else self.launch_s * p.local_experts
        return p.rest + p.gemm / self.gemm + p.alltoall * exposed / self.alltoall + p.host_per_s * (sync + launch)


def _predict(b: BridgeCase, constants: MoeConstants) -> float:
    saved = MoeConstants.shipped()
    constants.apply()
    try:
        return StepModel(b.case.model, b.case.training, b.case.cluster, b.case.config).predict().step_time_s
    finally:
        saved.apply()


def moe_parts(b: BridgeCase) -> MoeParts:
    """The row's `MoeParts`, from four predictions: at the base point (no host time, overlap and
    efficiencies 1), with the grouped GEMMs twice as fast, the all-to-all twice as fast, and 1 ms of host
    time per pass without a captured iteration (no launches: a graphed row's `host_per_s` is 0, as its
    host time is)."""
    from gplan.cost_models.experts import local_experts

    base = MoeConstants(1.0, 1.0, 1.0, 0.0, 0.0, 0.0)
    at = _predict(b, base)
    gemm = 2 * (at - _predict(b, replace(base, gemm=2.0)))
    alltoall = 2 * (at - _predict(b, replace(base, alltoall=2.0)))
    host = _predict(b, replace(base, sync_none_s=1e-3, sync_router_s=1e-3))
    t = b.case.training
    return MoeParts(at - gemm - alltoall, gemm, alltoall, (host - at) / 1e-3, t.cuda_graphs, t.moe_a2a_overlap,
                    local_experts(b.case.model, b.case.config))


MOE_GRIDS = {"gemm": [2 ** (x / 16) for x in range(-32, 33)], "alltoall": [2 ** (x / 16) for x in range(-16, 49)],
             "overlapped": [x / 20 for x in range(0, 21)], "sync_none_s": [x * 1e-4 for x in range(0, 41)],
             "sync_router_s": [x * 1e-4 for x in range(0, 41)], "launch_s": [x * 1e-5 for x in range(0, 31)]}
"""The search grids of each constant: efficiencies 0.25–4 (all-to-all 0.5–8) in steps of 2^(1/16), the
exposed share 0–1, the host times 0–4 ms per pass and 0–0.3 ms per local expert."""


def fit_moe_constants(rows: list[BridgeCase], parts: dict[str, MoeParts]) -> MoeConstants:
    """The constants minimising the mean absolute log error over `rows` (the median's flat optimum leaves a
    held-out model to chance): coordinate descent over the grids from the shipped values, until no
    constant moves."""
    def misfit(c: MoeConstants) -> float:
        return statistics.fmean(abs(math.log(c.step_s(parts[b.case.row_id]) / b.case.measured_step_s)) for b in rows)

    best = MoeConstants.shipped()
    for _ in range(8):
        moved = False
        for name, grid in MOE_GRIDS.items():
            value = min(grid, key=lambda v: (misfit(replace(best, **{name: v})), abs(v - getattr(best, name))))
            moved |= value != getattr(best, name)
            best = replace(best, **{name: value})
        if not moved:
            break
    return best


CURRENT_RELEASES = ("26.06", "26.06.01", "26.08")
"""Megatron-Bridge's releases of 2026 H2: the software a run planned today uses."""


def release_of(b: BridgeCase) -> str:
    return b.case.label.rsplit("(", 1)[1].rstrip(")")


def release_factor(rows: list[BridgeCase], errors: dict[str, float]) -> float:
    """Measured over predicted step, the geometric median of `rows`: one release's software speed."""
    return math.exp(statistics.median(-math.log(1 + errors[b.case.row_id]) for b in rows))


def release_lines(rows: list[BridgeCase], errors: list[float]) -> list[str]:
    """The same layouts ran up to 1.5× faster from Megatron-Bridge 25.11 to 26.08: the error by release,
    and what one software factor per release (measured/predicted over the release's rows, fitted on the
    other models' rows of that release) would still add — none is needed where the rows' CUDA graphs and
    all-to-all overlap, which the releases turned on, are priced."""
    by_id = {b.case.row_id: e for b, e in zip(rows, errors)}
    med = lambda xs: statistics.median(abs(x) for x in xs)
    lines = ["By release — the shipped model, and with a per-release software factor on top:", "",
             "| release | rows | shipped | release factor | with it, leave-one-model-out |", "|---|---:|---:|---:|---:|"]
    held: dict[str, float] = {}
    for release in sorted({release_of(b) for b in rows}):
        same = [b for b in rows if release_of(b) == release]
        for b in same:
            others = [x for x in same if x.case.model.name != b.case.model.name]
            factor = release_factor(others, by_id) if others else 1.0
            held[b.case.row_id] = (1 + by_id[b.case.row_id]) * factor - 1
        lines.append(f"| {release} | {len(same)} | {med([by_id[b.case.row_id] for b in same]):.1%} | "
                     f"{release_factor(same, by_id):.3f} | {med([held[b.case.row_id] for b in same]):.1%} |")
    current = [b for b in rows if release_of(b) in CURRENT_RELEASES]
    lines.append(f"| **all** | {len(rows)} | {med(errors):.1%} | | **{med(list(held.values())):.1%}** |")
    lines += ["", f"On the current releases ({', '.join(CURRENT_RELEASES)}: {len(current)} rows) the shipped model is "
              f"within **{med([by_id[b.case.row_id] for b in current]):.1%}** (median). gplan applies no release factor: "
              "the releases' speed-ups are the CUDA graphs and overlap their recipes turned on, which a plan states "
              "(`--cuda-graphs`, `--moe-a2a-overlap`)."]
    return lines


def moe_report(path: Path = BRIDGE_CSV, families: list[FamilyErrors] | None = None) -> str:
    """Every MoE row: as the catalogue ships (cost_models.experts' constants), in-sample (refitted on all
    rows) and leave-one-model-out (fitted on the other models' rows), by model and system and by release."""
    rows, skipped = load_moe_cases(path)
    parts = {b.case.row_id: moe_parts(b) for b in rows}
    shipped = MoeConstants.shipped()
    errors = [error(_predict(b, shipped), b.case.measured_step_s) for b in rows]
    fitted = fit_moe_constants(rows, parts)
    in_sample = [error(fitted.step_s(parts[b.case.row_id]), b.case.measured_step_s) for b in rows]
    lomo: dict[str, float] = {}
    for name in sorted({b.case.model.name for b in rows}):
        held = [b for b in rows if b.case.model.name == name]
        constants = fit_moe_constants([b for b in rows if b.case.model.name != name], parts)
        lomo.update({b.case.row_id: error(constants.step_s(parts[b.case.row_id]), b.case.measured_step_s) for b in held})
    med = lambda xs: statistics.median(abs(x) for x in xs)
    if families is not None:
        by_release: dict[str, float] = {}  # the constants refitted without each release's rows
        for release in sorted({release_of(b) for b in rows}):
            constants = fit_moe_constants([b for b in rows if release_of(b) != release], parts)
            by_release.update({b.case.row_id: error(constants.step_s(parts[b.case.row_id]), b.case.measured_step_s)
                               for b in rows if release_of(b) == release})
        families.append(FamilyErrors("megatron", "MoE", "Megatron-Bridge", len(rows), med(errors),
                                     med(list(by_release.values())), med(list(lomo.values()))))
    c = shipped
    lines = [f"Megatron-Bridge's mixture-of-experts rows: {len(rows)} priced, {len(skipped)} skipped, each with the "
             "all-to-all overlap and CUDA graphs its settings state. Shipped constants (cost_models/experts.py, the "
             f"in-sample fit): grouped GEMM efficiency {c.gemm:.3g}, all-to-all efficiency {c.alltoall:.3g}, "
             f"{c.overlapped:.0%} of it exposed under overlap, host time per MoE-layer pass {c.sync_none_s * 1e3:.2g} ms "
             f"without graphs and {c.sync_router_s * 1e3:.2g} ms with the router captured, plus "
             f"{c.launch_s * 1e6:.0f} µs per local expert outside a captured iteration.", "",
             "| model | system | rows | shipped | in-sample (refit) | leave-one-model-out |", "|---|---|---:|---:|---:|---:|"]
    for key in sorted({(b.case.model.name, b.system) for b in rows}):
        idx = [i for i, b in enumerate(rows) if (b.case.model.name, b.system) == key]
        lines.append(f"| {key[0]} | {key[1]} | {len(idx)} | {med([errors[i] for i in idx]):.1%} | "
                     f"{med([in_sample[i] for i in idx]):.1%} | {med([lomo[rows[i].case.row_id] for i in idx]):.1%} |")
    for name in sorted({b.case.model.name for b in rows}):
        idx = [i for i, b in enumerate(rows) if b.case.model.name == name]
        lines.append(f"| **{name}** | all | {len(idx)} | {med([errors[i] for i in idx]):.1%} | "
                     f"{med([in_sample[i] for i in idx]):.1%} | **{med([lomo[rows[i].case.row_id] for i in idx]):.1%}** |")
    lines.append(f"| **all** | | {len(rows)} | **{med(errors):.1%}** | {med(in_sample):.1%} | "
                 f"**{med(list(lomo.values())):.1%}** |")
    faster = sum(e < 0 for e in errors)
    lines += ["", f"Predicted faster than measured: {faster} of {len(rows)} rows (shipped).", ""]
    lines += release_lines(rows, errors)
    lines += ["", "<details><summary>Per row</summary>", "", "| row | run | graphs | a2a overlap | measured s | error |",
              "|---|---|---|---|---:|---:|"]
    lines += [f"| {b.case.row_id} | {b.case.label} | {b.case.training.cuda_graphs} | "
              f"{'yes' if b.case.training.moe_a2a_overlap else 'no'} | {b.case.measured_step_s:.3g} | {e:+.1%} |"
              for b, e in zip(rows, errors)]
    lines += ["", "Skipped: " + "; ".join(f"row {rid} ({why})" for rid, why in skipped), "", "</details>"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
