"""Memory of gplan's cost model against measured peaks and out-of-memory outcomes.

The BigScience BLOOM sweep (S12, shared/reference/bloom_sweep_runs.csv) is the only published set of
runs with the peak memory observed per GPU and runs that ran out of memory: ~176–206B GPT-style
candidates on 384 A100-80GB under Megatron-DeepSpeed with ZeRO-1 and full activation checkpointing.
Each row is priced as gplan would price that run (engine `deepspeed`, the row's precision and
pipeline partitioning) and compared with the measured peak; out-of-memory rows must be predicted not
to fit the device. Every completed run of published_runs.csv must be predicted within its device's
physical memory (those runs did run).

The allocator's fragmentation — the one memory knob the catalogue does not take from a datasheet — is
reported in-sample and leave-one-out: fitted on the other rows, predicting the one left out. DeepSpeed's
ZeRO-3 engine, which never runs in the pipeline engine those peaks measure, has its own fraction: the
interval calling SC21's 530B outcomes (ran on 640 A100s, did not fit 560; bench/data/sc21_zero3_runs.csv)
is printed with what the two priors it would have without them say.

    python bench/memory.py [--fit] [--readme]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from accuracy import BENCH_RUNS, FOUNDRY_H100_RUNS  # noqa: E402
from accuracy import DEFAULT_CSV as PUBLISHED_CSV  # noqa: E402
from accuracy import case_layouts, engines_as, load_bloom_cases, load_cases  # noqa: E402

from gplan.engines import ENGINES  # noqa: E402
from gplan.cost_models.step import StepModel  # noqa: E402
from gplan.spec.parallel import StageLayout  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BLOOM_CSV = ROOT.parent / "shared" / "reference" / "bloom_sweep_runs.csv"
README = ROOT / "README.md"
BEGIN, END = "<!-- memory:begin -->", "<!-- memory:end -->"
GIB = 1024**3


@dataclass
class Run:
    row_id: str
    label: str
    step: StepModel
    layouts: list[StageLayout]
    measured_GiB: float | None
    """nvidia-smi's peak as the log printed it (MiB / 1024: GiB)."""
    oom: bool


def bloom_runs() -> list[Run]:
    """The BLOOM rows as bench/accuracy.py prices them (`load_bloom_cases`: engine deepspeed, the
    row's precision and pipeline partition), with their measured peak and outcome."""
    runs = []
    for case, r in load_bloom_cases(BLOOM_CSV):
        measured = float(r["peak_mem_gb"]) if r["peak_mem_gb"] else None
        step = StepModel(case.model, case.training, case.cluster, case.config)
        runs.append(Run(case.row_id, case.label.removeprefix("BLOOM "), step, case.layouts, measured,
                        r["status"] == "OOM"))
    return runs


def predicted_GiB(run: Run, fragmentation: float | None = None) -> float:
    """The run's predicted peak; with `fragmentation`, as if the engine's fitted fraction were that."""
    if fragmentation is None:
        return run.step.predict(run.layouts).memory_bytes_per_device_max / GIB
    with memory_accounting_as(run.step.training.engine, fragmentation=fragmentation):
        return run.step.predict(run.layouts).memory_bytes_per_device_max / GIB


def memory_accounting_as(engine: str, **fields):
    """The engine's MemoryAccounting with `fields` replaced, for the block (`engines_as`)."""
    return engines_as({engine: dict(memory=replace(ENGINES[engine].memory, **fields))})


def fit_fragmentation(runs: list[Run]) -> float:
    """The fraction minimising the median absolute relative error over the measured rows (a grid: one
    parameter needs no optimiser)."""
    measured = [r for r in runs if r.measured_GiB]
    grid = [i / 200 for i in range(0, 61)]
    return min(grid, key=lambda f: statistics.median(abs(predicted_GiB(r, f) / r.measured_GiB - 1) for r in measured))


def leave_one_out(runs: list[Run]) -> list[float]:
    measured = [r for r in runs if r.measured_GiB]
    errors = []
    for i, held in enumerate(measured):
        f = fit_fragmentation(measured[:i] + measured[i + 1:])
        errors.append(predicted_GiB(held, f) / held.measured_GiB - 1)
    return errors


def published_over_physical(path: Path = PUBLISHED_CSV) -> list[tuple[str, float, float]]:
    """Completed runs of published_runs.csv (or the bench's own, `path`) gplan predicts above their device's
    physical memory."""
    cases, _ = load_cases(path)
    over = []
    for c in cases:
        prediction = StepModel(c.model, c.training, c.cluster, c.config).predict(case_layouts(c))
        physical = c.cluster.primary.hardware.memory_bytes
        if prediction.memory_bytes_per_device_max > physical:
            over.append((c.label, prediction.memory_bytes_per_device_max / GIB, physical / GIB))
    return over


def published_oom() -> list[tuple[str, float, float]]:
    """Runs a published source says ran out of memory: torchtitan's Llama 2 70B on 64 A100 with
    selective AC "OOMs" at local batch 2 (S10, row 87's note)."""
    cases, _ = load_cases(PUBLISHED_CSV)
    found = []
    for c in cases:
        if c.row_id == "87":
            config = c.config.model_copy(update={"mbs": 2})
            training = c.training.model_copy(update={"gbs": c.training.gbs * 2})
            prediction = StepModel(c.model, training, c.cluster, config).predict(case_layouts(c))
            found.append((f"{c.label.replace('mbs=1', 'mbs=2')} (S10)", prediction.memory_bytes_per_device_max / GIB,
                          c.cluster.primary.hardware.memory_GiB))
    if BENCH_RUNS.is_file():  # SC21 Table 2's note: the 530B "did not fit on 560 GPUs" at micro-batch 4 with ZeRO-3
        label, step = sc21_530b(560)
        found.append((label, step.predict().memory_bytes_per_device_max / GIB,
                      step.cluster.primary.hardware.memory_GiB))
    return found


@functools.cache
def _sc21_z4():
    return next(c for c in load_cases(BENCH_RUNS)[0] if c.row_id == "Z4")


def sc21_530b(gpus: int) -> tuple[str, StepModel]:
    """SC21's GPT 530B with DeepSpeed ZeRO-3 at micro-batch 4 (row Z4) on `gpus` A100s: it ran on 640 and
    "did not fit" on 560 (Table 2's note)."""
    from gplan.profiles.catalogue import load_cluster

    c = _sc21_z4()
    config = c.config.model_copy(update={"dp": gpus})
    training = c.training.model_copy(update={"gbs": gpus * c.config.mbs})
    return (f"{c.model.name} {gpus}×A100 {config.label()} (S22)",
            StepModel(c.model, training, load_cluster("dgx-a100-80g", gpus), config))


def zero3_fragmentation_bracket() -> tuple[float, float]:
    """The fractions of DeepSpeed's ZeRO-3 engine under which SC21's 530B fits 640 GPUs and not 560
    (`sc21_530b`): above the first, the 560-GPU run does not fit; up to the second, the 640-GPU run does.
    The peak is allocated · (1 + f) + the reserve and communicators, so each bound is one division."""
    bounds = []
    for gpus in (560, 640):
        step = sc21_530b(gpus)[1]
        stage = max(step.predict().stages, key=lambda s: s.memory_bytes).memory
        physical = step.cluster.primary.hardware.memory_bytes
        bounds.append((physical - stage.reserve_bytes - stage.communicator_bytes) / stage.allocated_bytes - 1)
    return bounds[0], bounds[1]


def zero3_fragmentation_lines() -> list[str]:
    """SC21's 530B on 560 and 640 GPUs under the catalogue's ZeRO-3 fraction and the two it would have
    without SC21's outcomes (held out): the pipeline engine's, fitted on BLOOM, and none."""
    lowest, highest = zero3_fragmentation_bracket()
    accounting = ENGINES["deepspeed"].memory
    lines = ["", f"DeepSpeed's ZeRO-3 engine: every fragmentation in [{lowest:.3f}, {highest:.3f}] calls SC21's 530B "
             "outcomes at micro-batch 4 (ran on 640 A100s, did not fit 560); no other ZeRO-3 outcome or peak is "
             "public here, so held out it falls back to a prior that misses one of the two.", "",
             "| ZeRO-3 fragmentation | 560 GPUs (did not fit) | 640 GPUs (ran) |", "|---|---:|---:|"]
    for name, fraction in ((f"{accounting.zero3_fragmentation:.3f} (catalogue: the bracket's midpoint)",
                            accounting.zero3_fragmentation),
                           (f"{accounting.fragmentation:.3f} (held out: the pipeline engine's, BLOOM)",
                            accounting.fragmentation),
                           ("0 (held out: no engine reserve, the device's default)", 0.0)):
        with memory_accounting_as("deepspeed", zero3_fragmentation=fraction):
            cells = []
            for gpus, ran in ((560, False), (640, True)):
                step = sc21_530b(gpus)[1]
                peak = step.predict().memory_bytes_per_device_max
                fits = peak <= step.cluster.primary.hardware.memory_bytes
                cells.append(f"{peak / GIB:.1f} GiB {'✓' if fits == ran else '✗'}")
        lines.append(f"| {name} | {' | '.join(cells)} |")
    return lines


def report(do_fit: bool) -> str:
    runs = bloom_runs()
    measured = [r for r in runs if r.measured_GiB]
    catalogue = ENGINES["deepspeed"].memory.fragmentation
    errors = [predicted_GiB(r) / r.measured_GiB - 1 for r in measured]
    loo = leave_one_out(runs)
    fitted = fit_fragmentation(runs) if do_fit else None
    physical = runs[0].step.cluster.primary.hardware.memory_GiB
    ooms = [(r, predicted_GiB(r)) for r in runs if r.oom]
    lines = [
        f"BLOOM sweep (S12): {len(measured)} runs with a measured peak, {len(ooms)} out-of-memory runs; "
        f"Megatron-DeepSpeed's allocator fragmentation {catalogue:.3f} (cost_models.memory)"
        + (f", refit here {fitted:.3f}" if fitted is not None else "") + ".", "",
        "| | median abs error | mean abs error | worst |", "|---|---:|---:|---:|",
        f"| in-sample (fitted on every row) | {_median(errors):.1%} | {_mean(errors):.1%} | {_worst(errors):+.1%} |",
        f"| leave-one-out (fragmentation refit without the row) | {_median(loo):.1%} | {_mean(loo):.1%} | {_worst(loo):+.1%} |",
        "", "| out-of-memory run | predicted peak | device |", "|---|---:|---:|",
        *[f"| row {r.row_id}: {r.label} | {p:.1f} GiB {'✓ does not fit' if p > physical else '✗ predicted to fit'} | "
          f"{physical:g} GiB |" for r, p in ooms],
        *[f"| {label} | {p:.1f} GiB {'✓ does not fit' if p > m else '✗ predicted to fit'} | {m:g} GiB |"
          for label, p, m in published_oom()],
    ]
    over = published_over_physical()
    bloom_over = [(f"BLOOM row {r.row_id}: {r.label}", p, physical) for r in runs if not r.oom
                  for p in [predicted_GiB(r)] if p > physical]
    completed = sum(not r.oom for r in runs)
    bench_over = published_over_physical(BENCH_RUNS) if BENCH_RUNS.is_file() else []
    lines += ["", f"Completed runs of published_runs.csv predicted above their device's physical memory: {len(over)}"
              + "".join(f"\n- {label}: {p:.1f} of {m:g} GiB" for label, p, m in over),
              "", f"Completed runs of the BLOOM sweep (all {completed}, with a measured peak or not) predicted above "
              f"their device's physical memory: {len(bloom_over)}"
              + "".join(f"\n- {label}: {p:.1f} of {m:g} GiB" for label, p, m in bloom_over),
              "", f"Completed runs of the bench's own data ({BENCH_RUNS.name}: DeepSpeed ZeRO-3, S22) predicted above "
              f"their device's physical memory: {len(bench_over)}"
              + "".join(f"\n- {label}: {p:.1f} of {m:g} GiB" for label, p, m in bench_over)]
    if FOUNDRY_H100_RUNS.is_file():
        foundry_over = published_over_physical(FOUNDRY_H100_RUNS)
        lines += ["", f"Completed runs of llm-foundry's H100 table ({FOUNDRY_H100_RUNS.name}, S23) predicted "
                  f"above their device's physical memory: {len(foundry_over)}"
                  + "".join(f"\n- {label}: {p:.1f} of {m:g} GiB" for label, p, m in foundry_over)]
    if BENCH_RUNS.is_file():
        lines += zero3_fragmentation_lines()
    lines += ["", "<details><summary>Per row (predicted vs measured peak)</summary>", "",
              "| row | run | measured GiB | predicted GiB | error |", "|---|---|---:|---:|---:|"]
    for r in measured:
        p = predicted_GiB(r)
        lines.append(f"| {r.row_id} | {r.label} | {r.measured_GiB:g} | {p:.1f} | {p / r.measured_GiB - 1:+.1%} |")
    lines += ["", "</details>"]
    return "\n".join(lines)


def _median(errors):
    return statistics.median(abs(e) for e in errors)


def _mean(errors):
    return statistics.fmean(abs(e) for e in errors)


def _worst(errors):
    return max(errors, key=abs)


def write_readme(table: str) -> None:
    from readme_section import write_section

    write_section(BEGIN, END, table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="also refit the fragmentation on every row")
    parser.add_argument("--readme", action="store_true", help="write the tables into docs/accuracy.md")
    args = parser.parse_args(argv)
    for path in (BLOOM_CSV, PUBLISHED_CSV):
        if not path.is_file():
            sys.stderr.write(f"error: {path}: no such file\n")
            return 3
    table = report(args.fit)
    sys.stdout.write(table + "\n")
    if args.readme:
        write_readme(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
