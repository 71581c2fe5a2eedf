"""Accuracy of gplan's cost model against published training runs.

Predicts every row of shared/reference/published_runs.csv whose configuration is complete, compares
the predicted step time with the measured one, and prints per-row and aggregate errors (median and
mean absolute percentage error, per source). `--fit` refits the per-hardware efficiencies (four
knobs per hardware kind, never one per row, with `gplan.calibration`'s fitter) and prints them for profiles/data/hardware.yaml;
`--readme` writes the tables into README.md between the accuracy markers.

    python bench/accuracy.py [--csv PATH] [--fit] [--readme]
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from gplan.calibration.apply import apply
from gplan.calibration.fit import fit_log
from gplan.cost_models.step import StepModel
from gplan.errors import GplanError
from gplan.profiles.catalogue import load_cluster
from gplan.profiles.schema import ClusterSpec, Efficiency
from gplan.spec.model import ModelSpec
from gplan.spec.parallel import ParallelConfig, check_config, uniform_layout
from gplan.spec.training import TrainingSpec

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CSV = ROOT.parent / "shared" / "reference" / "published_runs.csv"
README = ROOT / "README.md"
BEGIN, END = "<!-- accuracy:begin -->", "<!-- accuracy:end -->"

#: Published GPU names -> bundled cluster (the hardware and its fabric).
CLUSTERS = {
    "A100-SXM4-80GB": "dgx-a100-80g",
    "A100 80GB": "dgx-a100-80g",
    "A100 40GB": "dgx-a100-40g",
    "H100-SXM5-80GB (700 W)": "dgx-h100",
}
#: Sources whose stack runs fused (flash) attention; SC21 and the 2022 Megatron runs predate it.
FLASH_SOURCES = {"S10", "S19", "S21"}


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
    if row["source_id"] == "S1" and row["tflops_per_gpu"] and gbs and gpus:
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


def _recompute(text: str) -> tuple[str, bool]:
    t = text.lower()
    if t.startswith("full"):
        return "full", False
    if "selective layer" in t:
        return "none", True  # torchtitan: full checkpointing of every other layer
    if t.startswith("selective"):
        return "selective", False
    return "none", False


#: Fields a source leaves empty but documents elsewhere: S3 trains Megatron's GPT with the same
#: 51200-token vocabulary as S1 (SC21 §5.1; Korthikanti et al. 2022 reuse that setup).
ASSUMED = {"S3": {"vocab_size": "51200"}}


def case_from_row(row: dict) -> Case | str:
    """A Case, or the reason the row is incomplete."""
    src = row["source_id"]
    row = {**row, **{k: v for k, v in ASSUMED.get(src, {}).items() if not row[k].strip()}}
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
        tie_embeddings=src in ("S1", "S3", "S21"), norm="rmsnorm" if swiglu else "layernorm",
        position_embedding="rope" if swiglu else ("alibi" if src == "S21" else "learned"),
        dropout=0.1 if src in ("S1", "S3") else 0.0, bias=src in ("S1", "S3"),
    )
    precision = "fp16" if "fp16" in row["precision"].lower() else "bf16"
    gpus, tp, pp = _int(row["num_gpus"]), _int(row["tp"]), _int(row["pp"])
    cp = _int(row["cp"]) or 1
    dp = _int(row["dp"]) or gpus // (tp * pp * cp)
    vpp = _int(row["vpp"]) or 1
    if row["layers_per_virtual_stage"]:
        vpp = layers // (pp * _int(row["layers_per_virtual_stage"]))
    recompute, selective_layer = _recompute(row["recompute"])
    config = ParallelConfig(dp=dp, tp=tp, pp=pp, vpp=vpp, cp=cp, mbs=_int(row["micro_batch_size"]),
                            sp=row["sequence_parallel"].lower().startswith("yes"),
                            zero=_zero(row["zero_or_fsdp"]) or (1 if src == "S19" else 0),
                            recompute=recompute)
    training = TrainingSpec(gbs=_int(row["global_batch_size"]), seq_length=_int(row["seq_len"]),
                            precision=precision, flash_attention=src in FLASH_SOURCES)
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


def predict_case(case: Case, eff: Efficiency | None = None) -> float:
    cluster = apply(case.cluster, eff.model_dump()) if eff else case.cluster
    step = StepModel(case.model, case.training, cluster, case.config)
    layouts = None
    if case.selective_layer:
        # every other layer fully recomputed: per stage, half the layers "full", half "none"
        layouts = uniform_layout(case.model, case.config.pp, "none")
        layouts = [s.model_copy(update={"layers": _half_full(s)}) for s in layouts]
    return step.predict(layouts).step_time_s


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


def fit(cases: list[Case], hardware_names: set[str]) -> Efficiency:
    """The calibration's one fitter (log space, a weak prior toward the catalogue) over the knobs of
    one hardware kind. The misfit weighs every source equally — the mean over sources of each source's
    median absolute log error, plus a quarter of its mean — so that one large table cannot outvote the
    others."""
    subset = [c for c in cases if hardware_of(c) in hardware_names]
    sources = sorted({c.source for c in subset})
    base = subset[0].cluster.primary.hardware.efficiency

    def efficiency(theta: dict[str, float]) -> Efficiency:
        return base.model_copy(update={k: min(1.0, v) if k in ("gemm", "attention") else v for k, v in theta.items()})

    def misfit(theta: dict[str, float]) -> float:
        e = efficiency(theta)
        total = 0.0
        for src in sources:
            errs = [abs(math.log(predict_case(c, e) / c.measured_step_s)) for c in subset if c.source == src]
            total += statistics.median(errs) + 0.25 * statistics.fmean(errs)
        return total / len(sources)

    start = {k: max(getattr(base, k), FLOOR) for k in FITTED}
    return efficiency(fit_log(misfit, start, prior_weight=1e-4, step=0.2))


# ---- reporting ----------------------------------------------------------------------------------

def summarize(errors: list[float]) -> tuple[float, float]:
    absolute = [abs(e) for e in errors]
    return statistics.median(absolute), statistics.fmean(absolute)


def report(cases: list[Case], skipped: list) -> str:
    rows = [(c, predict_case(c)) for c in cases]
    lines = [f"{len(cases)} rows predicted, {len(skipped)} skipped (incomplete configuration).", ""]
    lines += ["| source | rows | median abs error | mean abs error |", "|---|---:|---:|---:|"]
    by_source: dict[str, list[float]] = {}
    for c, p in rows:
        by_source.setdefault(c.source, []).append(error(p, c.measured_step_s))
    for src in sorted(by_source, key=lambda s: int(s[1:])):
        med, mean = summarize(by_source[src])
        lines.append(f"| {src} | {len(by_source[src])} | {med:.1%} | {mean:.1%} |")
    med, mean = summarize([e for errs in by_source.values() for e in errs])
    lines.append(f"| **all** | {len(rows)} | **{med:.1%}** | {mean:.1%} |")
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


def write_readme(table: str) -> None:
    text = README.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    README.write_text(text[:start] + "\n" + table + "\n" + text[end:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    parser.add_argument("--fit", action="store_true", help="refit per-hardware efficiencies and print them")
    parser.add_argument("--readme", action="store_true", help="write the tables into README.md")
    args = parser.parse_args(argv)
    if not args.csv.is_file():
        sys.stderr.write(f"error: {args.csv}: no such file (pass --csv)\n")
        return 3
    cases, skipped = load_cases(args.csv)
    if args.fit:
        for names in ({"a100-80g", "a100-40g"}, {"h100-sxm"}):
            eff = fit(cases, names)
            sys.stdout.write(f"{sorted(names)}: {eff.model_dump()}\n")
        return 0
    table = report(cases, skipped)
    sys.stdout.write(table + "\n")
    if args.readme:
        write_readme(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
