"""Rich renderings of predictions, plans and catalogues (to stderr; stdout is for --json data)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from gplan.cost_models.step import Prediction
from gplan.spec.parallel import ParallelConfig

GIB = 1024**3


def gib(value: float) -> str:
    return f"{value / GIB:.1f} GiB"


def seconds(value: float) -> str:
    if value >= 1:
        return f"{value:.2f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.1f} ms"
    return f"{value * 1e6:.0f} µs"


def prediction_summary(console: Console, title: str, config: ParallelConfig, p: Prediction, stages: bool = True) -> None:
    budget = min(s.memory_budget_bytes for s in p.stages)
    fits = "[green]fits[/]" if p.fits else "[red]does not fit[/]"
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    table.add_row("configuration", config.label() + f" schedule={config.schedule} m={p.num_microbatches}")
    table.add_row("step time", seconds(p.step_time_s))
    table.add_row("throughput", f"{p.tokens_per_s:,.0f} tokens/s   {p.samples_per_s:,.2f} samples/s")
    table.add_row("per device", f"{p.model_tflops_per_device:.1f} model TFLOP/s   MFU {p.mfu:.1%}")
    table.add_row("memory", f"{gib(p.memory_bytes_per_device_max)} max of {gib(budget)} budget — {fits}")
    b = p.breakdown
    parts = [(k, v) for k, v in b.model_dump().items() if v > 0]
    table.add_row("step breakdown", "   ".join(f"{k} {v / p.step_time_s:.1%}" for k, v in parts))
    console.print(table)
    if stages:
        console.print(stage_table(p))


def stage_table(p: Prediction) -> Table:
    table = Table(title="stages (per device; states = weights + grads + optimizer)", title_justify="left")
    for col in ("stage", "layers", "f+b/mb", "comm/mb", "in-flight", "states", "activ.", "memory", "budget"):
        table.add_column(col, justify="right")
    for s in p.stages:
        m = s.memory
        over = s.memory_bytes > s.memory_budget_bytes
        table.add_row(
            str(s.index), str(s.num_layers), seconds(s.forward_s + s.backward_s),
            seconds(s.tp_comm_s + s.cp_comm_s + s.pp_comm_s), f"{s.in_flight:g}",
            gib(m.weights_bytes + m.grads_bytes + m.optimizer_bytes), gib(m.activations_bytes),
            f"[red]{gib(s.memory_bytes)}[/]" if over else gib(s.memory_bytes), gib(s.memory_budget_bytes),
        )
    return table


def recompute_mix(layouts) -> str:
    """'none' / 'full' when uniform, else counts per option, e.g. 'none 62 · full 18'."""
    totals: dict[str, int] = {}
    for stage in layouts:
        for c in stage.layers:
            totals[c.recompute] = totals.get(c.recompute, 0) + c.count
    totals = {k: v for k, v in totals.items() if v}
    if len(totals) == 1:
        return next(iter(totals))
    return " · ".join(f"{k} {v}" for k, v in totals.items())


def split_text(layouts) -> str:
    sizes = [s.num_layers for s in layouts]
    if len(set(sizes)) == 1:
        return f"{len(sizes)}×{sizes[0]}"
    return "/".join(map(str, sizes)) if len(sizes) <= 8 else f"{sizes[0]}/…/{sizes[-1]} (uneven)"


def search_table(title: str, result) -> Table:
    table = Table(title=title, title_justify="left")
    cols = ("#", "dp", "tp", "pp", "vpp", "cp", "mbs", "zero", "recompute", "split", "step", "tokens/s", "MFU",
            "mem/dev", "bubble", "comm")
    for col in cols:
        table.add_column(col, justify="left" if col in ("recompute", "split") else "right")
    for rank, c in enumerate(result.ranked, 1):
        cfg, p = c.config, c.prediction
        style = "bold green" if rank == 1 else None
        table.add_row(str(rank), str(cfg.dp), str(cfg.tp) + ("+sp" if cfg.sp else ""), str(cfg.pp), str(cfg.vpp),
                      str(cfg.cp), str(cfg.mbs), str(cfg.zero), recompute_mix(c.layouts), split_text(c.layouts),
                      seconds(p.step_time_s), f"{p.tokens_per_s:,.0f}", f"{p.mfu:.1%}",
                      gib(p.memory_bytes_per_device_max), f"{p.bubble_fraction:.1%}", f"{p.comm_fraction:.1%}",
                      style=style)
    return table


#: (row label, value function, lower is better)
COMPARE_ROWS = [
    ("step time", lambda p: p.step_time_s, True, seconds),
    ("tokens/s", lambda p: p.tokens_per_s, False, lambda v: f"{v:,.0f}"),
    ("MFU", lambda p: p.mfu, False, lambda v: f"{v:.1%}"),
    ("memory / device", lambda p: p.memory_bytes_per_device_max, True, gib),
    ("bubble", lambda p: p.bubble_fraction, True, lambda v: f"{v:.1%}"),
    ("communication", lambda p: p.comm_fraction, True, lambda v: f"{v:.1%}"),
    ("fits", lambda p: p.fits, False, lambda v: "yes" if v else "[red]no[/]"),
]


def compare_table(entries) -> Table:
    table = Table(title="comparison (best of each row in green)", title_justify="left")
    table.add_column("")
    for name, _ in entries:
        table.add_column(name, justify="right")
    for label, value, lower, fmt in COMPARE_ROWS:
        values = [value(p) for _, p in entries]
        best = min(values) if lower else max(values)
        table.add_row(label, *[f"[bold green]{fmt(v)}[/]" if v == best else fmt(v) for v in values])
    for term in entries[0][1].breakdown.model_dump():
        values = [getattr(p.breakdown, term) for _, p in entries]
        if any(values):
            best = min(values)
            table.add_row(f"  {term}", *[f"[bold green]{seconds(v)}[/]" if v == best else seconds(v) for v in values])
    return table


def explain_differences(entries) -> list[str]:
    """For each entry slower than the fastest that fits: by how much, and which term grew most."""
    fitting = [e for e in entries if e[1].fits] or entries
    fastest_name, fastest = min(fitting, key=lambda e: e[1].step_time_s)
    lines = []
    for name, p in entries:
        if p is fastest:
            continue
        if not p.fits:
            lines.append(f"{name} does not fit: {gib(p.memory_bytes_per_device_max)} per device")
            continue
        growth = {k: v - getattr(fastest.breakdown, k) for k, v in p.breakdown.model_dump().items()}
        term = max(growth, key=growth.get)
        lines.append(f"{name} is {p.step_time_s / fastest.step_time_s - 1:.1%} slower than {fastest_name}: "
                     f"{term} grew most (+{seconds(growth[term])})")
    return lines


# ---- explain -------------------------------------------------------------------------------------

def plan_stage_table(plan, prediction) -> Table:
    """Per stage: its layers and options, time per micro-batch, and memory against the budget."""
    table = Table(title="stages (per micro-batch; memory per device)", title_justify="left")
    for col in ("stage", "layers", "recompute", "extras", "fwd+bwd", "comm", "T_i", "states", "activ.", "memory", "of budget"):
        table.add_column(col, justify="left" if col in ("layers", "recompute", "extras") else "right")
    slowest = max(s.time_s for s in prediction.stages)
    for stage, s in zip(plan.stages, prediction.stages):
        m = s.memory
        mix = " · ".join(f"{c.recompute} {c.count}" for c in stage.layers if c.count)
        extras = ", ".join(name for name, on in (("embedding", stage.embedding), ("head", stage.head)) if on)
        used = s.memory_bytes / s.memory_budget_bytes
        table.add_row(
            str(s.index), f"{stage.layer_start}–{stage.layer_end - 1}", mix, extras,
            seconds(s.forward_s + s.backward_s), seconds(s.tp_comm_s + s.cp_comm_s + s.pp_comm_s),
            f"[bold]{seconds(s.time_s)}[/]" if s.time_s == slowest else seconds(s.time_s),
            gib(m.weights_bytes + m.grads_bytes + m.optimizer_bytes), gib(m.activations_bytes), gib(s.memory_bytes),
            f"[red]{used:.0%}[/]" if used > 1 else (f"[yellow]{used:.0%}[/]" if used >= 0.97 else f"{used:.0%}"),
        )
    return table


def findings_table(items) -> Table:
    table = Table(title="what binds", title_justify="left")
    for col in ("constraint", "binds", "relaxing saves", "detail"):
        table.add_column(col, justify="right" if col == "relaxing saves" else "left")
    for f in items:
        saving = "—" if f.constraint == "memory" else f"{f.saving_fraction:.1%}"
        table.add_row(f.constraint, "[bold red]yes[/]" if f.binds else "no", saving, f.detail)
    return table


def runner_up_table(losers, source: str) -> Table:
    table = Table(title=f"runner-ups ({source})", title_justify="left")
    for col in ("#", "configuration", "split", "step", "slower", "why it lost"):
        table.add_column(col, justify="right" if col in ("#", "step", "slower") else "left")
    for rank, lo in enumerate(losers, 2):
        table.add_row(str(rank), lo.label, lo.split, seconds(lo.step_time_s), f"+{lo.slower_fraction:.1%}",
                      f"{lo.reason}: {lo.term} +{seconds(lo.term_growth_s)}")
    return table


def timeline_text(ops, pp: int, width: int) -> list:
    """The schedule as one line of coloured cells per stage; a cell shows the op at its middle
    (micro-batch number mod 10: blue forward, green backward, `·` waiting)."""
    from rich.text import Text

    end_s = max(op.end_s for op in ops)
    rows = [[None] * width for _ in range(pp)]
    for op in ops:
        first = int(op.start_s / end_s * width + 0.5)
        last = max(first + 1, int(op.end_s / end_s * width + 0.5))
        for col in range(first, min(last, width)):
            rows[op.stage][col] = op
    lines = []
    for stage, row in enumerate(rows):
        line = Text(f"stage {stage:>2} ")
        for op in row:
            if op is None:
                line.append("·", style="dim")
            else:
                line.append(str(op.microbatch % 10), style="white on blue" if op.kind == "F" else "black on green")
        lines.append(line)
    return lines


# ---- launch --------------------------------------------------------------------------------------

def run_report_table(report, plan) -> Table:
    """Measured against predicted, with the ratio."""
    table = Table(title=f"measured vs predicted — {report.parallel} on {report.world_size} × {report.device} "
                        f"({report.compute_dtype}, median of steps {report.warmup_steps + 1}–{len(report.losses)})",
                  title_justify="left")
    for col in ("", "measured", "predicted", "measured / predicted"):
        table.add_column(col, justify="right")
    p = plan.prediction

    def row(label, measured, predicted, fmt):
        table.add_row(label, fmt(measured), fmt(predicted), f"{measured / predicted:.2f}" if predicted else "—")

    row("step time", report.step_time_s, p.step_time_s, seconds)
    row("tokens/s", report.tokens_per_s, p.tokens_per_s, lambda v: f"{v:,.0f}")
    row("MFU", report.mfu, p.mfu, lambda v: f"{v:.2%}")
    kind = report.ranks[0].memory_kind
    for stage, (measured, predicted) in enumerate(zip(report.stage_peak_bytes(), report.predicted_memory_bytes_per_stage)):
        row(f"memory stage {stage} ({kind})", measured, predicted, gib)
    table.add_row("loss first → last", f"{report.losses[0]:.4f} → {report.losses[-1]:.4f}", "", "")
    return table


def validation_table(rows, world_size: int) -> Table:
    table = Table(title=f"dry validation: sharded model on the meta device, fake process group of {world_size} ranks",
                  title_justify="left")
    for col in ("stage", "rank", "parameters (after tp)", "plan", "error", "weight bytes (after zero)", "plan "):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r.stage), str(r.rank), f"{r.params:,.0f}", f"{r.predicted_params:,.0f}", f"{r.error:+.2%}",
                      gib(r.weight_bytes), gib(r.predicted_weight_bytes))
    return table


def calibration_table(runs, fit, held, held_before, held_after) -> Table:
    table = Table(title="calibration: predicted / measured − 1 per run", title_justify="left")
    for col in ("run", "measured", "before", "after", "leave-one-out"):
        table.add_column(col, justify="left" if col == "run" else "right")
    loo = fit.leave_one_out or [None] * len(runs)
    for r, before, after, out in zip(runs, fit.before, fit.after, loo):
        table.add_row(r.name, seconds(r.measured_step_s), f"{before:+.1%}", f"{after:+.1%}",
                      "—" if out is None else f"{out:+.1%}")
    for r, before, after in zip(held, held_before, held_after):
        table.add_row(f"{r.name} (held out)", seconds(r.measured_step_s), f"{before:+.1%}", f"{after:+.1%}", "—")
    theta = ", ".join(f"{k} {v:.3g}" for k, v in fit.theta.items())
    table.caption = f"fitted: {theta}"
    return table
