"""`gplan export`: the plan in the form another engine takes (no engine is imported here).

Every target is a function `(plan, context) -> Export` (files by name, and notes on what the engine
runs differently); every file carries the plan's digests and the engine version it was written for.
Before anything is written, the engine's capabilities (`spec.targets`) are checked: a configuration it
cannot run is refused, and a stage split it runs differently (its recompute granularity, an even split)
is handed to the exporter as the engine will run it — `export_files` re-prices that split with the
caller's pricing function and refuses it when it no longer fits.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from gplan.errors import InputError
from gplan.plan import Plan, layouts_of
from gplan.spec.parallel import StageLayout


@dataclass(frozen=True)
class Export:
    files: dict[str, str]
    """File name -> contents (names ending in .sh are written executable)."""
    notes: list[str] = field(default_factory=list)
    """What the target runs differently than the plan priced, and what was chosen instead."""


@dataclass(frozen=True)
class ExportContext:
    """What an exporter needs beside the plan."""

    layouts: list[StageLayout]
    """The stage split the engine runs (the plan's own when it runs it exactly)."""
    plan_path: Path | None = None
    """The exported plan file, absolute (SLURM and the scripts point at it)."""
    image: str | None = None
    """Container image (Kubernetes)."""
    version: str = ""
    """The engine version the files are written for."""
    notes: list[str] = field(default_factory=list)
    """What was found before exporting (the split the engine runs differently), for the files' headers."""


@dataclass(frozen=True)
class Target:
    exporter: Callable[[Plan, ExportContext], Export]
    engine: str
    """The `spec.targets` capabilities that bound it (Kubernetes and SLURM run gplan's torch worker)."""
    versions: dict[str, str]
    """`--target-version` choices -> what the header names; the first is the default."""


from gplan.backends.deployments import DEPLOYMENTS  # noqa: E402,F401 - export targets that are not engines


def targets() -> dict[str, Target]:
    """Every engine with an exporter (its folder's export.py, gplan.engines), then the deployments."""
    import importlib

    from gplan.engines import engine_parts

    found = {name: Target(module.export, name, module.VERSIONS) for name, module in engine_parts("export").items()}
    for name, module_name in DEPLOYMENTS.items():
        module = importlib.import_module(f"gplan.backends.exporters.{module_name}")
        found[name] = Target(module.export, "torch", module.VERSIONS)
    return found


def stamp(plan: Plan, version: str = "", comment: str = "#") -> str:
    """The header every exported file starts with: the plan, its layout and recompute, the prediction,
    and the engine version the file was written for."""
    line = (f"{comment} gplan export of plan {plan.digest} (layout {plan.layout_digest}; {plan.model.name}: "
            f"{plan.parallel.label(recompute=False)}, recompute {recompute_summary(layouts_of(plan))}, "
            f"predicted {plan.prediction.step_time_s:.3f} s/step)")
    return line + (f"\n{comment} written for {version}" if version else "")


def recompute_summary(layouts: list[StageLayout]) -> str:
    """Recomputed layers of the whole model: `none`, or `17 full + 4 selective of 32 layers`."""
    total = sum(s.num_layers for s in layouts)
    count = {o: sum(c.count for s in layouts for c in s.layers if c.recompute == o) for o in ("full", "selective")}
    parts = [f"{n} {o}" for o, n in count.items() if n]
    return f"{' + '.join(parts)} of {total} layers" if parts else "none"


def flag_lines(args: list[str]) -> list[str]:
    """An argument list as script lines: one flag per line with its values, shell-quoted."""
    lines: list[str] = []
    for arg in args:
        if arg.startswith("--") or not lines:
            lines.append(shlex.quote(arg))
        else:
            lines[-1] += " " + shlex.quote(arg)
    return lines


def stage_sizes(layouts: list[StageLayout]) -> list[int]:
    return [s.num_layers for s in layouts]


def recompute_counts(layouts: list[StageLayout], option: str) -> list[int]:
    """Layers per pipeline rank recomputed with `option`."""
    return [sum(c.count for c in s.layers if c.recompute == option) for s in layouts]


Reprice = Callable[[Plan, list[StageLayout], str], tuple[float, bool, str]]
"""(plan, split) -> (step seconds, fits, what binds when it does not fit) — the CLI's cost model."""


def engine_split(plan: Plan, engine: str, reprice: Reprice | None,
                 over_budget: bool = False) -> tuple[list[StageLayout], list[str]]:
    """Refuse (exit 3) a configuration the engine cannot run at all, naming the capability and the
    option that avoids it. Return the split it runs and, where the engine runs the plan otherwise — its
    own split, or the same split at its own speed (another engine's overlap, efficiency, kernels, memory
    accounting) — a note with the step re-priced as it runs; refuse when that no longer fits by the
    engine's own memory accounting, unless `over_budget` (`gplan export --over-budget`) asks for it."""
    from gplan.spec.targets import (ENGINE_OPTIONS, TARGETS, config_refusals, lacked_options, runs_as, same_split,
                                    split_refusals)

    caps = TARGETS[engine]
    found = config_refusals(caps, plan.model, plan.parallel, plan.parallel.num_microbatches, plan.training.precision)
    if found:
        raise InputError(f"{engine} cannot run this plan ({found[0].capability}): {found[0].detail}",
                         hint=found[0].hint(engine, plan.target))
    planned = layouts_of(plan)
    layouts = runs_as(caps, plan.model, plan.parallel, planned)
    same = same_split(layouts, planned)
    # a plan priced for no engine in particular is exported as it is; one priced for another engine is
    # re-priced as this one runs it
    if same and plan.training.engine in (None, engine):
        return planned, []
    why = (f"priced for {plan.training.engine}, run by {engine}" if same
           else split_refusals(caps, plan.model, plan.parallel, planned)[0].detail)
    lacked = lacked_options(plan.training, engine, plan.parallel)
    if lacked:  # the plan's engine switches this engine has not: it runs without them
        why += f" without {', '.join(ENGINE_OPTIONS[o] for o in lacked)} ({engine} has no such option)"
    if reprice is None:
        return layouts, [] if same else [f"{why}: not re-priced"]
    step_s, fits, binds = reprice(plan, layouts, engine)
    if not fits and not over_budget:
        what = f"would run this plan differently ({why}) and then" if not same else f"runs this plan ({why}):"
        raise InputError(f"{engine} {what} by its memory accounting {binds}",
                         hint=f"search again with --target {engine} for a plan it runs as priced, or write it "
                              "anyway with --over-budget")
    change = step_s / plan.prediction.step_time_s - 1
    if same and abs(change) < 1e-4 and fits:
        return planned, []
    memory = f"; by its memory accounting {binds} (written as asked: --over-budget)" if not fits else ""
    return layouts, [f"{why}; re-priced as {engine} runs it: {step_s:.3f} s/step ({change:+.1%} on the plan's "
                     f"{plan.prediction.step_time_s:.3f}){memory}; search with --target {engine} for a plan it runs "
                     "exactly"]


def render_export(plan: Plan, target: str, plan_path: Path | None = None, image: str | None = None,
                  version: str | None = None, reprice: Reprice | None = None, over_budget: bool = False) -> Export:
    """The files and notes of exporting `plan` for `target`, nothing written: an unknown target or
    version, a configuration the engine cannot run, or a split it would run out of memory is refused."""
    known = targets()
    if target not in known:
        raise InputError(f"--to {target!r}: unknown target", hint="choose from " + ", ".join(known))
    spec = known[target]
    version = version or next(iter(spec.versions))
    if version not in spec.versions:
        raise InputError(f"--target-version {version!r}: {target} exports are written for "
                         f"{', '.join(spec.versions)}", hint=f"choose one of {', '.join(spec.versions)}")
    layouts, notes = engine_split(plan, spec.engine, reprice, over_budget)
    context = ExportContext(layouts, plan_path.resolve() if plan_path else None, image, spec.versions[version], notes)
    result = spec.exporter(plan, context)
    return Export(result.files, notes + [n for n in result.notes if n not in notes])


def export_files(plan: Plan, target: str, out_dir: Path, **options) -> tuple[list[Path], list[str]]:
    """Export `plan` for `target` into `out_dir` (`render_export`'s options): every file written
    atomically, nothing when the export is refused or `out_dir` is a file."""
    from gplan.io import atomic_write_text

    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"-o {out_dir}: exists and is not a directory", hint="name a directory for the exported files")
    result = render_export(plan, target, **options)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"-o {out_dir}: cannot create it: {exc.strerror}", hint="choose a writable directory") from None
    written = []
    for name, text in result.files.items():
        atomic_write_text(out_dir / name, text)
        if name.endswith(".sh"):
            os.chmod(out_dir / name, 0o755)
        written.append(out_dir / name)
    return written, result.notes
