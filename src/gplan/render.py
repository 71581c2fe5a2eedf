"""Rich renderings of predictions, plans and catalogues (to stderr; stdout is for --json data)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from gplan.plan import Prediction
from gplan.spec.parallel import ParallelConfig, recompute_mix, split_text

GIB = 1024**3


WIDE = 10_000
"""Console width under --wide: every column shown, lines as long as they need to be."""


def fit(table: Table, width: int, drop: tuple[str, ...] = (), wrap: tuple[str, ...] = (),
        fold: tuple[str, ...] = ()) -> Table:
    """Make `table` fit `width` columns without cutting a number. Rich's own fitting shrinks every
    column and cuts `1,934,567` to `1,9…`; here every column but those in `wrap` keeps its widest cell,
    `wrap` columns (names, details) break between words, and while the table is still too wide, `fold`
    columns that hold one value in every row go to the caption (`every row: vpp 1`), then `drop` columns
    go in order (named in the caption, with `--wide`). A `fold` column that tells rows apart stays."""
    from rich.text import Text

    def plain(cell) -> str:
        return Text.from_markup(cell).plain if isinstance(cell, str) else str(cell)

    def needed(column) -> int:
        words = column.header in wrap  # a column that wraps may break its cells and header between words
        cells = [*column._cells, column.header]
        parts = [w for c in cells for w in (plain(c).split() if words else plain(c).splitlines())]
        return max(Text(p).cell_len for p in parts + [""])

    def total() -> int:  # the left border, then per column its padding and right border
        return 1 + sum(needed(c) + table.padding[1] + table.padding[3] + 1 for c in table.columns)

    for column in table.columns:
        if column.header not in wrap:
            column.no_wrap, column.min_width = True, needed(column)
        else:  # a word longer than the column (a path) folds onto the next line instead of ending in `…`
            column.overflow = "fold"
    constant, dropped = [], []
    for only_constant, names in ((True, fold), (False, drop)):
        for name in names:
            column = next((c for c in table.columns if c.header == name), None)
            if total() <= width or column is None:
                continue
            values = {plain(c) for c in column._cells}
            if only_constant and len(values) != 1:
                continue
            table.columns.remove(column)
            (constant if only_constant else dropped).append(f"{name} {values.pop()}" if only_constant else name)
    notes = ([f"every row: {', '.join(constant)}"] if constant else []) + (
        [f"not shown at {width} columns: {', '.join(dropped)} (--wide shows all)"] if dropped else [])
    if notes:
        table.caption = "; ".join(([table.caption] if table.caption else []) + notes)
        table.caption_justify = "left"
    return table


def gib(value: float) -> str:
    return f"{value / GIB:.1f} GiB"


def seconds(value: float) -> str:
    if value >= 1:
        return f"{value:.2f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.1f} ms"
    return f"{value * 1e6:.0f} µs"


def title(inputs) -> str:
    """What was planned: model, devices, cluster, and where the costs came from."""
    default = f" ({inputs.cluster_note})" if inputs.cluster_note else ""
    if inputs.profile:
        default = f" (measured profile {inputs.profile})"
    t = inputs.training
    batch = f" ({inputs.gbs_note}; choose with --gbs)" if inputs.gbs_note else ""
    return (f"{inputs.model.name} ({model_size_text(inputs.model)}) on {devices_label(inputs.cluster, inputs.devices)}, "
            f"cluster {inputs.cluster.name}{default}; gbs {t.gbs} × seq {t.seq_length} = "
            f"{tokens(t.tokens_per_step)} tokens/step{batch}, {t.precision}"
            + (f", priced as {t.engine} runs it (choose with --target)" if t.engine else "")
            + (f"; the loss in {t.loss_chunks_run} chunks (choose with --loss-chunks)" if t.loss_chunks_run > 1 else "")
            + (f"; routing {'balanced' if t.expert_imbalance == 1 else f'imbalance {t.expert_imbalance:g}'}"
               " (choose with --expert-imbalance)" if inputs.model.is_moe else "")
            + (f", experts' capacity {inputs.model.capacity_factor:g}×{' (padded to it)' if t.moe_pad_to_capacity else ''}"
               if inputs.model.is_moe and inputs.model.capacity_factor is not None else "")
            + (f"; {inputs.hardware_note}" if getattr(inputs, "hardware_note", "") else "")
            + expert_kernel_note(t, inputs.model, inputs.cluster)
            + moe_host_note(t, inputs.model)
            + unfitted_speed(t.engine, inputs.cluster))


def moe_host_note(training, model) -> str:
    """Said where the engine's MoE layers wait on the host by its own measure (`EngineProfile.moe_host_s`): without
    CUDA graphs, the host time priced and the capture that would remove it; with them, on an engine that captures only
    a host-free step, that a layout it cannot capture is priced without them (`spec.parallel.captured_graphs`)."""
    engine = training.profile
    if not model.is_moe or engine.moe_host_s is None:
        return ""
    if training.cuda_graphs != "none":
        return (f"; CUDA graphs where {engine.title} captures the step (no pipeline stages; ep 1 or an exchange that "
                f"never waits on the host), a layout it cannot capture priced without them — its MoE layers waiting "
                f"{engine.moe_host_s * 1e3:.1f} ms on the host a pass — as its export runs it"
                if engine.capabilities.cuda_graphs_host_free else "")
    graphs = (" (--cuda-graphs full_iteration: 0.3's default capture, without stages, and with ep only through an "
              "exchange that never waits on the host: --moe-dispatcher symmetric_memory, or flex with "
              "--moe-dispatch-capacity)" if engine.capabilities.cuda_graphs_host_free else "")
    return (f"; its MoE layers wait {engine.moe_host_s * 1e3:.1f} ms on the host a pass, priced without CUDA "
            f"graphs{graphs}")


def expert_kernel_note(training, model, cluster) -> str:
    """Said where the engine's routed experts run on `torch._grouped_mm` and a device prices that kernel below the
    grouped GEMMs the MoE constants were fitted on (`DeviceSpec.torch_grouped_mm_ratio`, from kernel timings)."""
    from gplan.cost_models.experts import kernel_ratios

    if not model.is_moe:
        return ""
    ratios = {g.hardware.name: kernel_ratios(training, g.hardware) for g in cluster.node_groups}
    return "".join(f"; routed experts on torch._grouped_mm at {forward:.2g} of the grouped GEMMs' speed forward, "
                   f"{backward:.2g} backward on {name} (its timings: docs/moe.md)"
                   for name, (forward, backward) in sorted(ratios.items()) if (forward, backward) != (1.0, 1.0))


def unfitted_speed(engine: str | None, cluster) -> str:
    """Said where an engine's speed is priced at Megatron-LM's efficiency for lack of its own runs on a device
    (`DeviceSpec.engine_efficiency` has no factor for it there: the prior, 1)."""
    from gplan.engines import profile_of

    if engine is None or profile_of(engine).speed_reference:
        return ""
    names = sorted({g.hardware.name for g in cluster.node_groups if engine not in g.hardware.engine_efficiency})
    return (f"; {engine}'s speed on {', '.join(names)} not fitted on its own runs: Megatron-LM's efficiency "
            "(docs/accuracy.md)" if names else "")


def model_size_text(m) -> str:
    """What gplan understood of a model: `70.6B params; 80 layers, hidden 8192, 64 heads (8 kv)`, with the
    active parameters and experts of a mixture of experts."""
    params = (f"{count_text(m.total_params())} params, {count_text(m.active_params())} active" if m.is_moe
              else f"{count_text(m.total_params())} params")
    heads = f"{m.num_attention_heads} MLA heads" if m.is_mla else f"{m.num_attention_heads} heads ({m.kv_heads} kv)"
    layers = f"{m.num_encoder_layers}+{m.num_layers}" if m.is_encoder_decoder else str(m.num_layers)
    text = f"{params}; {layers} layers, hidden {m.hidden_size}, {heads}"
    return text + (f", experts {experts_text(m)}" if m.is_moe else "")


def count_text(n: float) -> str:
    """`70.6B`, `3.69M`, `812k`: three significant figures."""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:g}"


def model_facts(m) -> dict:
    """The same, for --json."""
    return {"params": m.total_params(), "active_params": m.active_params(), "layers": m.total_layers,
            "hidden_size": m.hidden_size, "attention_heads": m.num_attention_heads, "kv_heads": m.kv_heads,
            "experts": m.num_experts if m.is_moe else 0, "top_k": m.top_k if m.is_moe else 0}


def devices_label(cluster, devices: int) -> str:
    """`64 × h100-sxm`, or every node group of a heterogeneous cluster: `32 × a100-80g + 32 × v100-32g`."""
    if cluster.is_heterogeneous:
        return " + ".join(f"{g.devices} × {g.hardware.name}" for g in cluster.node_groups)
    return f"{devices} × {cluster.primary.hardware.name}"


def tokens(count: float) -> str:
    for unit, size in (("M", 2**20), ("k", 2**10)):
        if count >= size:
            return f"{count / size:.3g}{unit}"
    return f"{count:g}"


def memory_text(p: Prediction) -> str:
    """The fullest stage against its own device's budget: stages on different hardware have different
    budgets, and the largest memory beside the smallest budget would read as not fitting."""
    budgets = {s.memory_budget_bytes for s in p.stages}
    if len(budgets) == 1:
        return f"{gib(p.memory_bytes_per_device_max)} max of {gib(budgets.pop())} budget"
    fullest = max(p.stages, key=lambda s: s.memory_bytes / s.memory_budget_bytes)
    return (f"{fullest.memory_bytes / fullest.memory_budget_bytes:.0%} of its budget at most (stage {fullest.index}: "
            f"{gib(fullest.memory_bytes)} of {gib(fullest.memory_budget_bytes)})")


def prediction_summary(console: Console, title: str, config: ParallelConfig, p: Prediction, stages: bool = True,
                       label: str | None = None) -> None:
    """`label`: the configuration as a plan states it (`Plan.label`: its stages' recompute mix)."""
    fits = "[green]fits[/]" if p.fits else "[red]does not fit[/]"
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    table.add_row("configuration", (label or config.label()) + f" schedule={config.schedule} m={p.num_microbatches}")
    table.add_row("step time", seconds(p.step_time_s))
    table.add_row("throughput", f"{p.tokens_per_s:,.0f} tokens/s   {p.samples_per_s:,.2f} samples/s")
    table.add_row("per device", f"{p.model_tflops_per_device:.1f} model TFLOP/s   MFU {p.mfu:.1%}")
    table.add_row("memory", memory_text(p) + f" — {fits}")
    b = p.breakdown
    parts = [(k, v) for k, v in b.model_dump().items() if v > 0]
    table.add_row("step breakdown", "   ".join(f"{k} {v / p.step_time_s:.1%}" for k, v in parts))
    console.print(fit(table, console.width, wrap=("value",)))
    if stages:
        console.print(stage_table(p, console.width))


def stage_table(p: Prediction, width: int = WIDE) -> Table:
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
    return fit(table, width, drop=("in-flight", "comm/mb", "states", "activ."))


def search_table(title: str, result, width: int = WIDE) -> Table:
    table = Table(title=title, title_justify="left")
    experts = any(c.config.ep > 1 or c.config.etp > 1 for c in result.ranked)
    cols = ("#", "dp", "tp", "pp", "vpp", "cp") + (("ep", "etp") if experts else ()) + (
        "mbs", "zero", "recompute", "split", "step", "tokens/s", "MFU", "mem/dev", "bubble", "comm")
    for col in cols:
        table.add_column(col, justify="left" if col in ("recompute", "split") else "right")
    shown, ties = fold_ties(result.ranked)
    if ties:
        table.caption = "tied (same step, memory, recompute and split), folded into the row shown: " + "; ".join(
            f"{differs} (row {row})" for row, differs in ties)
    for rank, c in shown:
        cfg, p = c.config, c.prediction
        style = "bold green" if rank == 1 else None
        expert_cells = (str(cfg.ep), str(cfg.etp)) if experts else ()
        table.add_row(str(rank), str(cfg.dp), str(cfg.tp) + ("+sp" if cfg.sp else ""), str(cfg.pp), str(cfg.vpp),
                      str(cfg.cp), *expert_cells, str(cfg.mbs), str(cfg.zero),
                      recompute_mix(c.layouts, cfg.recompute_modules), split_text(c.layouts),
                      seconds(p.step_time_s), f"{p.tokens_per_s:,.0f}", f"{p.mfu:.1%}",
                      gib(p.memory_bytes_per_device_max), f"{p.bubble_fraction:.1%}", f"{p.comm_fraction:.1%}",
                      style=style)
    return fit(table, width, drop=("comm", "bubble", "MFU", "#", "split"), wrap=("recompute", "split"),
               fold=("vpp", "cp", "etp", "ep", "zero", "mbs"))


TIE_FIELDS = ("dp", "tp", "pp", "vpp", "cp", "ep", "etp", "mbs", "zero")


def fold_ties(ranked) -> tuple[list, list[tuple[int, str]]]:
    """The ranked candidates with ties folded: a candidate whose step time, memory, recompute and split
    read the same as the row shown above it (zero 1 and 2 with the same memory, dp × cp swaps on one
    node) is not a row of its own; it is listed as (shown row, what differs)."""
    shown, ties = [], []

    def key(c):
        p = c.prediction
        return (seconds(p.step_time_s), gib(p.memory_bytes_per_device_max),
                recompute_mix(c.layouts, c.config.recompute_modules), split_text(c.layouts))

    for rank, c in enumerate(ranked, 1):
        if shown and key(shown[-1][1]) == key(c):
            kept = shown[-1][1].config
            differs = " ".join(f"{f} {getattr(c.config, f)}" for f in TIE_FIELDS if getattr(c.config, f) != getattr(kept, f))
            ties.append((len(shown), differs or c.config.label()))
        else:
            shown.append((rank, c))
    return shown, ties


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


def compare_table(entries, width: int = WIDE, setups: list[dict] | None = None) -> Table:
    """Entries side by side: their configuration rows (`setups`, when given), then the prediction's. When
    the entries train different batches, a row of time per million tokens is the one to rank by."""
    table = Table(title="comparison (best of each row in green)", title_justify="left")
    table.add_column("")
    headers = compare_headers([name for name, _ in entries], entries, setups, width)
    for header in headers:
        table.add_column(header, justify="right")
    for label in (setups[0] if setups else {}):
        table.add_row(label, *[str(s.get(label, "—")) for s in setups])
    rows = COMPARE_ROWS[:1] + (PER_TOKEN_ROW if batches_differ(entries) else []) + COMPARE_ROWS[1:]
    for label, value, lower, fmt in rows:
        values = [value(p) for _, p in entries]
        best = min(values) if lower else max(values)
        table.add_row(label, *[f"[bold green]{fmt(v)}[/]" if v == best else fmt(v) for v in values])
    for term in entries[0][1].breakdown.model_dump():
        values = [getattr(p.breakdown, term) for _, p in entries]
        if any(values):
            best = min(values)
            table.add_row(f"  {term}", *[f"[bold green]{seconds(v)}[/]" if v == best else seconds(v) for v in values])
    # the letters' legend, printed under the table at the console's width (a caption wraps at the table's)
    table.legend = [] if headers == [name for name, _ in entries] else [
        f"{h}  {name}" for h, (name, _) in zip(headers, entries)]
    return fit(table, width)


def compare_headers(names: list[str], entries, setups, width: int) -> list[str]:
    """The entries' names as column headers, or A, B, … (named in the caption) when the names would make
    the table wider than the terminal: a header never breaks a file name mid-word."""
    from rich.text import Text

    cells = [[Text.from_markup(str(v)).plain for v in (s.values() if setups else [])] for s in (setups or [{}] * len(names))]
    widest_value = [max([len(c) for c in column] + [12]) for column in cells]  # 12: "1,234,567.89"
    label = 18  # the row labels ("memory / device")
    needed = 1 + label + 3 + sum(max(len(n), w) + 3 for n, w in zip(names, widest_value))
    if needed <= width:
        return names
    return [chr(ord("A") + i) if i < 26 else f"#{i + 1}" for i in range(len(names))]


def tokens_per_step(p: Prediction) -> float:
    return p.tokens_per_s * p.step_time_s


def batches_differ(entries) -> bool:
    """Whether the entries' steps train different token counts: their step times do not compare."""
    counts = [tokens_per_step(p) for _, p in entries]
    return max(counts) > min(counts) * 1.0001


PER_TOKEN_ROW = [("time / 1M tokens", lambda p: 2**20 / p.tokens_per_s, True, seconds)]


def setup_rows(config, gbs: int, seq_length: int, layouts=None) -> dict:
    """A configuration as compare's rows: the degrees, the batch and, with a split, the recompute mix."""
    rows = {"dp tp pp": f"{config.dp} {config.tp}{'+sp' if config.sp else ''} {config.pp}",
            "vpp cp": f"{config.vpp} {config.cp}"}
    if config.ep > 1 or config.etp > 1:
        rows["ep etp"] = f"{config.ep} {config.etp}"
    rows |= {"mbs zero": f"{config.mbs} {config.zero}", "gbs × seq": f"{gbs} × {seq_length}",
             "recompute": recompute_mix(layouts, config.recompute_modules) if layouts else config.recompute}
    return rows


def chosen_line(done) -> str:
    """What `estimate`/`compare --config` chose for the options not given (planner.complete)."""
    if not done.chosen:
        return "every option given"
    values = ", ".join(f"{k} {v}" for k, v in done.chosen.items())
    if done.by_search:
        return f"chosen as gplan search would for these degrees: {values}"
    return f"gplan's defaults (the search found no plan: {done.why}): {values}"


def explain_differences(entries) -> list[str]:
    """For each entry slower than the fastest that fits: by how much, and which term grew most — per
    step when every entry trains the same batch, per token when batches differ (a step of twice the
    tokens may take longer and still be the faster plan)."""
    per_token = batches_differ(entries)

    def cost(p):  # seconds per step, or per million tokens
        return 2**20 / p.tokens_per_s if per_token else p.step_time_s

    def terms(p) -> dict:
        scale = 2**20 / tokens_per_step(p) if per_token else 1.0
        return {k: v * scale for k, v in p.breakdown.model_dump().items()}

    fitting = [e for e in entries if e[1].fits] or entries
    fastest_name, fastest = min(fitting, key=lambda e: cost(e[1]))
    unit = " per token" if per_token else ""
    lines = [f"note: the batches differ ({', '.join(f'{tokens(tokens_per_step(p))} tokens' for _, p in entries)} "
             "per step): ranked by time per token"] if per_token else []
    for name, p in entries:
        if p is fastest:
            continue
        if not p.fits:
            lines.append(f"{name} does not fit: {gib(p.memory_bytes_per_device_max)} per device")
            continue
        growth = {k: v - terms(fastest)[k] for k, v in terms(p).items()}
        term = max(growth, key=growth.get)
        lines.append(f"{name} is {cost(p) / cost(fastest) - 1:.1%} slower{unit} than {fastest_name}: "
                     f"{term} grew most (+{seconds(growth[term])}{' per 1M tokens' if per_token else ''})")
    return lines


# ---- explain -------------------------------------------------------------------------------------

def plan_stage_table(plan, prediction, width: int = WIDE) -> Table:
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
    return fit(table, width, drop=("states", "activ.", "comm", "fwd+bwd"), wrap=("recompute", "extras"))


def findings_table(items, width: int = WIDE) -> Table:
    table = Table(title="what binds", title_justify="left")
    for col in ("constraint", "binds", "relaxing saves", "detail"):
        table.add_column(col, justify="right" if col == "relaxing saves" else "left")
    for f in items:
        saving = "—" if f.constraint == "memory" else f"{f.saving_fraction:.1%}"
        table.add_row(f.constraint, "[bold red]yes[/]" if f.binds else "no", saving, f.detail)
    return fit(table, width, wrap=("constraint", "detail"))


def runner_up_table(losers, source: str, width: int = WIDE) -> Table:
    table = Table(title=f"runner-ups ({source})", title_justify="left")
    for col in ("#", "configuration", "split", "step", "slower", "why it lost"):
        table.add_column(col, justify="right" if col in ("#", "step", "slower") else "left")
    for rank, lo in enumerate(losers, 2):
        table.add_row(str(rank), lo.label, lo.split, seconds(lo.step_time_s), f"{lo.slower_fraction:+.1%}",
                      f"{lo.reason}: {lo.term} +{seconds(lo.term_growth_s)}")
    return fit(table, width, drop=("split",), wrap=("configuration", "why it lost"))


#: Cell styles by virtual chunk: forward in blues, backward in greens (chunk 1, 2, … of each rank).
FORWARD_STYLES = ("white on blue", "black on cyan", "white on magenta", "black on bright_blue")
BACKWARD_STYLES = ("black on green", "black on yellow", "black on bright_green", "black on bright_yellow")
BACKWARD_LETTERS = "abcdefghij"
"""A backward cell shows its micro-batch as a letter (a = 0 … j = 9) and a forward cell as a digit, so
the picture reads without colour too (a log, a pipe)."""


def timeline_cell(op) -> tuple[str, str]:
    """(character, style) of one op: the micro-batch mod 10, a digit forward and a letter backward; the
    colour tells the virtual chunk apart under the interleaved schedule."""
    if op.kind == "F":
        return str(op.microbatch % 10), FORWARD_STYLES[op.chunk % len(FORWARD_STYLES)]
    return BACKWARD_LETTERS[op.microbatch % 10], BACKWARD_STYLES[op.chunk % len(BACKWARD_STYLES)]


def timeline_legend(vpp: int):
    """What the cells mean: forward digits, backward letters, one colour per chunk."""
    from rich.text import Text

    legend = Text("forward ")
    for chunk in range(vpp):
        legend.append(f" F{chunk + 1} " if vpp > 1 else " 0-9 ", style=FORWARD_STYLES[chunk % len(FORWARD_STYLES)])
        legend.append(" ")
    legend.append("  backward ")
    for chunk in range(vpp):
        legend.append(f" B{chunk + 1} " if vpp > 1 else " a-j ", style=BACKWARD_STYLES[chunk % len(BACKWARD_STYLES)])
        legend.append(" ")
    legend.append("  · waiting; digit/letter = micro-batch mod 10 (a = 0)"
                  + (f"; F1…F{vpp}, B1…B{vpp}: each rank's virtual chunks" if vpp > 1 else ""))
    return legend


def timeline_text(ops, pp: int, width: int) -> list:
    """The schedule as one line of cells per stage, `width` columns with its label (a line never wraps);
    a cell shows the op at its middle (`timeline_cell`), `·` waiting."""
    from rich.text import Text

    width = max(8, width - len(f"stage {pp - 1:>2} "))
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
                line.append(*timeline_cell(op))
        lines.append(line)
    return lines


# ---- launch --------------------------------------------------------------------------------------

def run_report_table(report, plan, width: int = WIDE) -> Table:
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
    if report.gemm_recipe:
        table.add_row("GEMM recipe", report.gemm_recipe, plan.training.precision, "")
    return fit(table, width, wrap=("", "measured"))


def validation_table(report, width: int = WIDE) -> Table:
    """A backend's ValidationReport: what it built against what the plan says."""
    table = Table(title=f"dry validation ({report.backend}): {report.title}", title_justify="left")
    for col in ("check", "built", "plan", "error", ""):
        table.add_column(col, justify="left" if col == "check" else "right")
    for c in report.checks:
        table.add_row(c.subject, c.built, c.planned, "—" if c.error is None else f"{c.error:+.2%}",
                      "[green]ok[/]" if c.ok else "[red]differs[/]")
    return fit(table, width, wrap=("check",))


def models_table(specs, width: int = WIDE) -> Table:
    table = Table(title="bundled models", title_justify="left")
    for col in ("name", "params", "active", "layers", "hidden", "heads (kv)", "ffn", "experts", "vocab", "seq"):
        table.add_column(col, justify="right" if col != "name" else "left")
    for m in specs:
        layers = f"{m.num_encoder_layers}+{m.num_layers}" if m.is_encoder_decoder else str(m.num_layers)
        heads = f"{m.num_attention_heads} MLA" if m.is_mla else f"{m.num_attention_heads} ({m.kv_heads})"
        table.add_row(m.name, f"{m.total_params() / 1e9:.2f} B", f"{m.active_params() / 1e9:.2f} B", layers,
                      str(m.hidden_size), heads, ffn_text(m), experts_text(m),
                      str(m.vocab_size), str(m.seq_length))
    return fit(table, width, drop=("seq", "vocab", "ffn", "hidden"), wrap=("experts",))


def ffn_text(m) -> str:
    """The dense MLP's width; `— swiglu` when every layer is an MoE layer (its dense width unused)."""
    unused = m.is_moe and not m.first_dense_layers
    return f"{'—' if unused else m.ffn_size} {m.ffn_kind}"


def experts_text(m) -> str:
    """`256×2048 top 8 +1 shared, 3 dense first` for a mixture of experts; `—` for a dense model."""
    if not m.is_moe:
        return "—"
    text = f"{m.num_experts}×{m.expert_ffn_size} top {m.top_k}"
    if m.num_shared_experts or m.shared_expert_ffn_hidden_size:
        text += f" +{m.num_shared_experts or 1} shared"
    return text + (f", {m.first_dense_layers} dense first" if m.first_dense_layers else "")


def hardware_tables(devices, clusters: dict, width: int = WIDE) -> list[Table]:
    table = Table(title="bundled hardware (dense peak)", title_justify="left")
    for col in ("name", "kind", "memory", "bf16", "fp16", "fp32", "HBM", "gemm eff", "attn eff"):
        table.add_column(col, justify="left" if col in ("name", "kind") else "right")
    for d in devices:
        def peak(p: str) -> str:
            return f"{d.peak_tflops[p]:g} TF" if p in d.peak_tflops else "—"

        table.add_row(d.name, d.kind, f"{d.memory_GiB:g} GiB", peak("bf16"), peak("fp16"), peak("fp32"),
                      f"{d.hbm_bandwidth_GBps:g} GB/s", f"{d.efficiency.gemm:.2f}", f"{d.efficiency.attention:.2f}")
    ctable = Table(title="bundled clusters (node templates; --devices sets the node count)", title_justify="left")
    for col in ("name", "hardware", "per node", "intra GB/s", "inter GB/s"):
        ctable.add_column(col)
    for name, c in clusters.items():
        g = c["node_groups"][0]
        ctable.add_row(name, g["hardware"], str(g["devices_per_node"]), f"{g['intra_node']['bandwidth_GBps']:g}",
                       f"{g['inter_node']['bandwidth_GBps']:g}")
    return [fit(table, width, drop=("attn eff", "fp32", "fp16")), fit(ctable, width)]


def calibration_table(runs, fit_result, held, held_before, held_after, width: int = WIDE) -> Table:
    table = Table(title="calibration: predicted / measured − 1 per run", title_justify="left")
    for col in ("run", "measured", "before", "after", "leave-one-out"):
        table.add_column(col, justify="left" if col == "run" else "right")
    loo = fit_result.leave_one_out or [None] * len(runs)
    for r, before, after, out in zip(runs, fit_result.before, fit_result.after, loo):
        table.add_row(r.name, seconds(r.measured_step_s), f"{before:+.1%}", f"{after:+.1%}",
                      "—" if out is None else f"{out:+.1%}")
    fitted_engines = {r.plan.training.engine for r in runs}
    for r, before, after in zip(held, held_before, held_after):
        other = r.plan.training.engine not in fitted_engines
        table.add_row(f"{r.name} (held out{f', another engine: {r.plan.training.engine}' if other else ''})",
                      seconds(r.measured_step_s), f"{before:+.1%}", f"{after:+.1%}", "—")
    theta = ", ".join(f"{k} {v:.3g}" for k, v in fit_result.theta.items())
    table.caption = f"fitted: {theta}"
    return fit(table, width, wrap=("run",))


# ---- explain ---------------------------------------------------------------------------------------

def wrote_lines(console: Console, paths) -> None:
    for path in paths:
        console.print(f"[green]wrote[/] {path}", highlight=False)


def explain_output(console: Console, plan, e, width: int, against=None, written=()) -> None:
    """`gplan explain` for people: stages, what binds, the schedule, runner-ups, what-ifs; a profiled run
    beside the prediction (`against`); the files written."""
    c = plan.parallel
    prediction = e.prediction
    prediction_summary(console, f"{plan.model.name}: {plan.label()}", c, prediction, stages=False, label=plan.label())
    console.print(plan_stage_table(plan, prediction, console.width))
    console.print(findings_table(e.findings, console.width))
    from gplan.planner.explain import large_costs

    for line in large_costs(c, prediction):
        console.print(f"[yellow]warning:[/] {line}", highlight=False)
    console.print(f"[bold]pipeline schedule[/] ({c.schedule}, first {e.shown} of {prediction.num_microbatches} "
                  f"micro-batches{f', {c.vpp} chunks per rank' if c.vpp > 1 else ''})")
    console.print(timeline_legend(c.vpp))
    for line in timeline_text(e.shown_ops, c.pp, width):
        console.print(line)
    if e.simulated_s is not None:
        console.print(f"simulated pipeline: {e.simulated_s:.3f} s; the cost model's formula: {e.formula_s:.3f} s",
                      highlight=False)
    if e.losers:
        console.print(runner_up_table(e.losers, e.runner_up_source, console.width))
    scenario = e.what_if
    if scenario:
        title = ", ".join(map(str, scenario.changes))
        entries = [("this plan now", prediction)]
        if scenario.this_plan is not None:
            entries.append((f"this plan, {title}", scenario.this_plan))
        entries.append((f"best, {title}", scenario.best.prediction))
        console.print(f"[bold]what if {title}[/] ({scenario.devices} devices)")
        if scenario.this_plan_note:
            console.print(f"this plan cannot run: {scenario.this_plan_note}", highlight=False)
        console.print(f"best plan then: {scenario.best.config.label()}", highlight=False)
        console.print(compare_table(entries, console.width))
    if against:
        against_output(console, against)
    wrote_lines(console, written)


def explain_json(plan_file, e) -> dict:
    from dataclasses import asdict

    scenario = e.what_if
    return {
        "plan": str(plan_file), "step_time_s": e.prediction.step_time_s, "simulated_pipeline_s": e.simulated_s,
        "findings": [asdict(f) for f in e.findings],
        "runner_ups": {"source": e.runner_up_source, "plans": [asdict(lo) for lo in e.losers]},
        "what_if": None if not scenario else {
            "changes": [str(x) for x in scenario.changes], "devices": scenario.devices,
            "this_plan": scenario.this_plan.model_dump(mode="json") if scenario.this_plan else None,
            "this_plan_note": scenario.this_plan_note,
            "best": {"parallel": scenario.best.config.model_dump(mode="json"),
                     "prediction": scenario.best.prediction.model_dump(mode="json")}},
    }


def search_json(out, result) -> dict:
    return {"plan": str(out), "candidates": result.candidates, "ilps_solved": result.solved,
            "ilps_answered": result.answered,
            "search_time_s": result.time_s, "notes": result.notes,
            "ranked": [{"parallel": c.config.model_dump(mode="json"),
                        "stage_layers": [[lc.model_dump() for lc in s.layers] for s in c.layouts],
                        "solver": c.solver.model_dump(), "prediction": c.prediction.model_dump(mode="json")}
                       for c in result.ranked]}


def _by_solver(result) -> str:
    """`(12 by the ILP (HiGHS), 88 settled by the exact bound)`: who settled the splits — the ILP, or
    the dynamic-programming bound (planner.split_exact) where no split could beat the best plan or fit."""
    names = {"exact": "settled by the exact bound", "highs": "by the ILP (HiGHS)", "cbc": "by the ILP (CBC)"}
    parts = [f"{n} {names.get(k, k)}" for k, n in sorted(result.solvers.items()) if n]
    return f" ({', '.join(parts)})" if parts else ""


def search_summary(result, devices: int) -> list[str]:
    best = result.best
    lines = []
    if best.config.world_size < devices:
        lines.append(f"[yellow]note:[/] the best plan uses {best.config.world_size} of the {devices} devices "
                     "(faster than any layout of all of them)")
    from gplan.planner.explain import large_costs

    lines += [f"[yellow]warning:[/] {line}" for line in large_costs(best.config, best.prediction)]
    answered = f", {result.answered} more answered by a solved one" if result.answered else ""
    cut = result.statuses.get("cutoff", 0)
    lines += [f"[dim]{note}[/]" for note in result.notes]
    lines.append(f"searched {result.candidates} configurations ({result.pruned} pruned by bounds, "
                 f"{result.memory_infeasible} cannot fit), solved {result.solved} splits{_by_solver(result)}{answered}"
                 f"{f' ({cut} cut off by the best plan)' if cut else ''} in {result.time_s:.2f} s; "
                 f"best split from {best.solver.name} ({best.solver.status}); {result.provenance_text()}")
    return lines


def overlap_lines(plan) -> list[str]:
    """What the plan's prediction takes as overlapped and its export turns on (spec.targets)."""
    from gplan.spec.targets import overlaps_tp_comm

    if not overlaps_tp_comm(plan.training, plan.parallel, plan.cluster.smallest_domain_devices):
        return []
    if plan.training.async_tp:
        return ["[dim]tp's collectives priced pipelined with the matmuls (torch's async tp: its export compiles the "
                "model with compile.enable_async_tensor_parallel)[/]"]
    return [f"[dim]tp's collectives priced overlapped with the GEMMs, as {plan.training.engine} runs them "
            "(--tp-comm-overlap in its export; tp_comm_overlap: false in the plan prices them exposed)[/]"]


def exposed_overlaps(training, config, cluster) -> list[str]:
    """What a run leaves exposed by leaving off an overlap its engine would run (Megatron-LM's --tp-comm-overlap,
    --overlap-grad-reduce, --overlap-param-gather: each off by default), each with the switch that would hide it."""
    from gplan.spec.targets import dp_overlaps, overlaps_tp_comm

    c, t, said = config, training, []
    asked = t.model_copy(update={"tp_comm_overlap": True, "grad_reduce_overlap": True, "param_gather_overlap": True})
    if not t.tp_comm_overlap and overlaps_tp_comm(asked, c, cluster.smallest_domain_devices):
        said.append("tp's collectives beside the GEMMs (--tp-comm-overlap: Transformer Engine's userbuffers hide them)")
    synced = c.dp * c.cp > 1 and c.zero < 3
    (reduced, gathered), could = dp_overlaps(t, c), dp_overlaps(asked, c)
    if synced and not reduced:
        said.append("the gradient reduction after the backward (--overlap-grad-reduce: bucket by bucket behind it)")
    if synced and c.zero >= 1 and not gathered and could[1]:
        said.append("the parameter all-gather before the forward (--overlap-param-gather: behind it)")
    return said


def exposed_overlap_lines(training, config, cluster) -> list[str]:
    """A launch's `exposed_overlaps`, said beside its estimate: priced as it runs, where a plan of the same layout
    hides them."""
    said = exposed_overlaps(training, config, cluster)
    return [f"priced exposed, as the launch runs them without the switch ({training.profile.title}'s default is "
            "off): " + "; ".join(said)] if said else []


def kept_overlap_lines(plan) -> list[str]:
    """`search --from`: the best plan keeps the launch's overlap switches (none on the command line), so it pays what
    they leave exposed — said, with the switches that would hide it."""
    said = exposed_overlaps(plan.training, plan.parallel, plan.cluster)
    return [f"the best plan keeps your launch's switches, so it too pays exposed ({plan.training.profile.title}'s "
            "default is off): " + "; ".join(said) + " — add them to your launch to hide that"] if said else []


def attention_lines(plan) -> list[str]:
    """Where the plan's engine runs FlashAttention-2's class on a device that has a faster fused kernel, the
    ratio its attention is priced at (DeviceSpec.fa2_attention_ratio), said once per device kind."""
    if not (plan.training.flash_attention and plan.training.attention_kernel_run == "fa2"):
        return []
    slower = {g.hardware.name: g.hardware.fa2_attention_ratio for g in plan.cluster.node_groups
              if g.hardware.fa2_attention_ratio < 1}
    return [f"[dim]attention priced at FlashAttention-2's speed on {name}, {ratio:.3g} of the fused kernel's "
            f"(cuDNN / FlashAttention-3), as {plan.training.engine} runs it (--target megatron prices Transformer "
            "Engine's)[/]" for name, ratio in sorted(slower.items())]


def profile_summary(profile, out) -> list[str]:
    group = profile.node_groups[0]
    return [f"gemm efficiency {group.hardware.efficiency.gemm:.3f}, launch per layer "
            f"{group.hardware.efficiency.layer_overhead_s * 1e6:.0f} µs, intra-node {group.intra_node.bandwidth_GBps:.2f} "
            f"GB/s + {group.intra_node.latency_us:.0f} µs",
            f"[green]wrote[/] {out}: {len(group.hardware.measured)} layer shapes, {len(profile.links)} link points"]


class SearchProgress:
    """A one-line progress display on a terminal for a search that runs past a second: candidates
    visited, ILPs solved, the best step time so far. Silent when the search is quick or stderr is not
    a terminal (nothing to erase in a log)."""

    def __init__(self, console: Console, after_s: float = 1.0):
        import time

        self.console, self.after_s, self.start, self.live = console, after_s, time.perf_counter(), None
        self.shown = console.is_terminal  # asked once: the search calls this for every candidate it visits

    def __call__(self, visited: int, total: int, solved: int, best_s: float | None) -> None:
        import time

        if self.live is None:
            if not self.shown or time.perf_counter() - self.start < self.after_s:
                return
            from rich.live import Live

            self.live = Live(console=self.console, transient=True, refresh_per_second=8)
            self.live.start()
        best = f", best {seconds(best_s)}" if best_s is not None else ""
        self.live.update(f"searching: {visited}/{total} candidates by bound, {solved} splits solved{best}")

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.stop()


# ---- what each command prints (cli.py calls one of these per command) ------------------------------------

def estimate_json(e) -> dict:
    done, inputs = e.done, e.inputs
    return {**done.prediction.model_dump(mode="json"), "parallel": done.config.model_dump(mode="json"),
            "chosen": done.chosen, "chosen_by": "search" if done.by_search else "defaults", "profile": inputs.profile,
            "target": inputs.training.engine, "target_runs_it": not e.refused,
            "target_refusals": [r.detail for r in e.refused], "targets_that_run_it": e.runners}


def estimate_output(console: Console, e) -> None:
    prediction_summary(console, title(e.inputs), e.done.config, e.done.prediction)
    console.print(chosen_line(e.done), highlight=False)
    for r in e.refused:
        console.print(f"note: {e.inputs.training.engine} would not run this as written: {r.detail}"
                      + (f"; {', '.join(e.runners)} would (--target {e.runners[0]})" if e.runners else ""),
                      highlight=False)


def launch_json(launch, config, prediction, source, layouts=None) -> dict:
    return {**prediction.model_dump(mode="json"), "parallel": config.model_dump(mode="json"), "from": str(source),
            "recompute_run": launch_recompute(config, layouts),
            "engine": launch.engine, "engine_options": launch.engine_options, "not_read": launch.unread,
            "no_effect": launch.no_effect, "model_from_launch": launch.model_from_launch,
            "overridden": launch.overridden, "measured_step_s": measured_step_of(launch, config, prediction)}


def measured_step_of(launch, config, prediction) -> float | None:
    """A log's measured step: as it logged it, or from its tokens/s per device (torchtitan) at the batch
    and devices priced; none where the command line changed the batch (the log ran another)."""
    if "gbs" in launch.overridden:
        return None
    if launch.measured_step_s:
        return launch.measured_step_s
    if launch.measured_device_tokens_per_s:
        tokens_per_step = prediction.tokens_per_s * prediction.step_time_s
        return tokens_per_step / (launch.measured_device_tokens_per_s * config.world_size)
    return None


def command_line_name(option: str) -> str:
    """An option's command-line spelling: --gbs, --precision, or the engine switch's (ENGINE_OPTIONS)."""
    from gplan.spec.targets import ENGINE_OPTIONS

    return {"gbs": "--gbs", "precision": "--precision"}.get(option) or ENGINE_OPTIONS[option]


def command_line_value(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "the engine's default"
    return f"{value:g}" if isinstance(value, float) else str(value)


def launch_recompute(config, layouts) -> str:
    """The recompute the launch's stages run, layer by layer (MindFormers' per-stage counts, Megatron's block
    method): its configuration's own where the layouts agree with it."""
    from gplan.spec.parallel import recompute_mix

    return recompute_mix(layouts, config.recompute_modules) if layouts else config.recompute


def launch_output(console: Console, launch, inputs, config, prediction, source, layouts=None) -> None:
    from gplan.spec.targets import ENGINE_OPTIONS, switch_default

    prediction_summary(console, title(inputs) + f"; read from {source}", config, prediction,
                       label=config.label(launch_recompute(config, layouts)))
    if launch.model_from_launch:
        console.print(f"model: {launch.model_from_launch}", highlight=False)
    measured = measured_step_of(launch, config, prediction)
    if measured:
        console.print(f"the log's measured step: {seconds(measured)}; predicted {seconds(prediction.step_time_s)} "
                      f"({prediction.step_time_s / measured - 1:+.1%}: predicted / measured − 1)", highlight=False)
    options = [f"{ENGINE_OPTIONS[k]}{'' if v is True else f' {v}'}" for k, v in launch.engine_options.items()
               if k in ENGINE_OPTIONS and v != switch_default(k) and k not in launch.overridden]
    if options:  # what the launch sets, or its engine defaults to, that prices it (Megatron's allgather dispatcher)
        console.print(f"engine options read: {', '.join(options)}", highlight=False)
    for line in exposed_overlap_lines(inputs.training, config, inputs.cluster):
        console.print(line, highlight=False)
    if launch.overridden:
        console.print("set on the command line, over the launch: " + ", ".join(
            f"{command_line_name(k)} {command_line_value(getattr(launch, k) if k in ('gbs', 'precision') else launch.engine_options[k])}"
            f" (the launch's: {command_line_value(was)})" for k, was in launch.overridden.items()), highlight=False)
    if launch.no_effect:
        console.print(f"read, no effect on the layout or its cost: {', '.join(launch.no_effect)} (why: --json)",
                      highlight=False)
    if launch.unread:
        console.print(f"not read (no effect on the layout or its cost): {', '.join(launch.unread)}", highlight=False)


def search_output(console: Console, inputs, planned, mine, versus, out) -> None:
    """The ranked table, the search's account, and with --from the user's launch beside the best plan."""
    from gplan.plan import layouts_of

    console.print(search_table(title(inputs), planned.search, console.width))
    for line in search_summary(planned.search, inputs.devices) + overlap_lines(planned.plan) + \
            attention_lines(planned.plan):
        console.print(line)
    if versus:
        _, launch_inputs, config, layouts, prediction = mine
        t, best = launch_inputs.training, planned.plan
        console.print(compare_table([(f"your launch ({versus['source'].rsplit('/', 1)[-1]})", prediction),
                                     ("best plan", best.prediction)], console.width,
                                    [setup_rows(config, t.gbs, t.seq_length, layouts),
                                     setup_rows(best.parallel, t.gbs, t.seq_length, layouts_of(best))]))
        changes = ", ".join(f"{k} {a} → {b}" for k, (a, b) in versus["differences"].items()) or "nothing"
        console.print(f"the best plan changes {changes}: {versus['gain']:+.1%} tokens/s over your launch",
                      highlight=False)
        for line in kept_overlap_lines(best):
            console.print(line, highlight=False)
    console.print(f"[green]wrote[/] {out}")


def _setup(entry) -> dict:
    return {"target": entry.target or "—"} | setup_rows(entry.config, entry.gbs, entry.seq_length, entry.layouts)


def compare_json(entries) -> list[dict]:
    return [{"name": e.name, "prediction": e.prediction.model_dump(mode="json"), "configuration": _setup(e)}
            | ({"target_refusals": e.refusals} if e.completed is not None else {}) for e in entries]


def compare_output(console: Console, entries, engine: str | None) -> None:
    pairs = [(e.name, e.prediction) for e in entries]
    table = compare_table(pairs, console.width, [_setup(e) for e in entries])
    console.print(table)
    for line in table.legend:
        console.print(line, highlight=False, soft_wrap=True)
    for line in explain_differences(pairs):
        console.print(line, highlight=False)
    for e in entries:
        if e.completed is not None and e.chosen:
            console.print(f"{e.name}: {chosen_line(e.completed)}", highlight=False)
    for e in entries:
        for detail in e.refusals:
            console.print(f"note: {engine} would not run {e.name!r} as written: {detail}", highlight=False)


def launch_outcome_json(outcome) -> dict:
    spec = outcome.spec
    if outcome.kind == "dry_run":
        return {"backend": outcome.backend, "nnodes": spec.nnodes, "nproc_per_node": spec.nproc_per_node,
                "env": spec.env, "nodes": [{"node_rank": n.node_rank, "argv": n.argv} for n in spec.nodes],
                "notes": spec.notes}
    if outcome.kind == "node_finished":
        return {"node_rank": outcome.node_rank, "finished": True, "run_report": None}
    from gplan.report import read_report

    return read_report(outcome.report_path).model_dump(mode="json")


def launch_outcome(console: Console, outcome) -> None:
    import sys

    from gplan.backends.recipes import shell_line

    if outcome.kind == "slurm":
        script, plan_path = outcome.written
        console.print(f"[green]wrote[/] {script} and {plan_path}; submit with: sbatch {script}")
    elif outcome.kind == "dry_run":
        for node in outcome.spec.nodes:
            sys.stdout.write(f"# node {node.node_rank}\n{shell_line(node.argv, outcome.spec.env)}\n")
    elif outcome.kind == "node_finished":
        console.print(f"[green]node {outcome.node_rank} finished[/]; node 0 writes run_report.json into its run "
                      "directory")
    else:
        from gplan.report import read_report

        console.print(run_report_table(read_report(outcome.report_path), outcome.plan, console.width))
        console.print(f"[green]wrote[/] {outcome.report_path}")


def calibration_output(console: Console, c, out) -> None:
    console.print(calibration_table(c.runs, c.fit, c.held, c.held_before, c.held_after, console.width))
    if c.stages:
        table = Table(title="stage compute from the runs' profiler traces (forward + backward per step)",
                      title_justify="left")
        for col in ("run", "stage", "measured", "before", "after"):
            table.add_column(col, justify="left" if col == "run" else "right")
        for run, stage, measured, before, after in c.stages:
            table.add_row(run, str(stage), seconds(measured), f"{before:+.1%}", f"{after:+.1%}")
        console.print(fit(table, console.width, wrap=("run",)))
    for r in c.runs:
        for note in r.trace_notes:
            console.print(f"[yellow]note:[/] {r.name}: not fitted on {note}", highlight=False)
    kept = [k for k in c.fit.theta if k not in c.fit.fitted]
    if kept:
        why = ("each run (and each traced stage) is one equation; runs of other sizes and layouts tell the overheads "
               "and the links apart from the compute speed")
        console.print(f"[yellow]note:[/] {len(c.runs)} runs fit {len(c.fit.fitted)} of {len(c.fit.theta)} parameters "
                      f"({', '.join(c.fit.fitted)}); kept at the catalogue's: {', '.join(kept)} — {why}",
                      highlight=False)
    console.print(f"[green]wrote[/] {out}")


def models_json(specs) -> list[dict]:
    return [{"name": m.name, "params": m.total_params(), "active_params": m.active_params(), **m.model_dump(mode="json")}
            for m in specs]


def validated_json(path, found) -> dict:
    return ({"file": str(path), "kind": found.kind, "name": found.name, "valid": True, "refreshed": found.refreshed}
            | ({"model": model_facts(found.model)} if found.kind == "model" else {}))


def validated_line(path, found) -> str:
    size = f": {model_size_text(found.model)}" if found.kind == "model" else ""
    return f"[green]{'refreshed' if found.refreshed else 'ok'}:[/] {path} is a valid {found.kind} ({found.name}{size})"


# ---- a profiled run beside its prediction (`gplan explain --against`) ----------------------------------

def against_output(console: Console, against) -> None:
    """Per stage: each term predicted and measured per step, and how far off; then the largest miss."""
    from gplan.calibration.measured import TERMS

    console.print(f"[bold]measured against predicted[/] ({against.run_dir}: {against.steps_traced} traced steps on "
                  f"each stage's first rank; priced: {against.plan_note})", highlight=False)
    for s in against.stages:
        console.print(f"stage {s.stage} (rank {s.rank}): step {seconds(s.measured_step_s)} measured, "
                      f"{seconds(s.predicted_step_s)} predicted ({off_text(s.measured_step_s, s.predicted_step_s)})",
                      highlight=False)
        table = Table()
        for col in ("term", "predicted", "measured", "off"):
            table.add_column(col, justify="left" if col == "term" else "right")
        for term in TERMS:
            p, m = s.predicted_s[term], s.measured_s[term]
            table.add_row(term, seconds(p) if p else "—", seconds(m) if m else "—", off_text(m, p))
            if term == "dp gradient sync":  # the collectives measured, by name (the prediction prices axes)
                for name, waited in s.collectives_s.items():
                    table.add_row(f"  {name}", "", seconds(waited), "")
        console.print(fit(table, console.width, wrap=("term",)))
    stage, term, delta = against.worst()
    console.print(f"largest miss: stage {stage} {term}, {seconds(abs(delta))} per step "
                  f"{'more' if delta > 0 else 'less'} than predicted", highlight=False)


def off_text(measured: float, predicted: float) -> str:
    """Measured against predicted as a signed percentage of the prediction ('—' with nothing predicted)."""
    if predicted <= 0:
        return "—" if measured <= 0 else "unpredicted"
    return f"{measured / predicted - 1:+.0%}"


# ---- re-planning on the devices left (`gplan replan`, `search --what-if-lost`) ---------------------------

def replan_output(console: Console, r, out, written=()) -> None:
    """The old plan beside the new, what the checkpoint is resharded over, what was kept and why."""
    console.print(f"[bold]{r.old.model.name}: {r.old.world_size} → {r.devices} devices[/] "
                  f"({r.tokens_kept:.0%} of the tokens/s kept)", highlight=False)
    table = compare_table([("before", r.old.prediction), ("on the devices left", r.new.prediction)], console.width,
                          [setup_rows(p.parallel, p.training.gbs, p.training.seq_length, p.stages) for p in (r.old, r.new)])
    console.print(table)
    for line in replan_lines(r):
        console.print(line, highlight=False)
    console.print(f"[green]wrote[/] {out} — resume the run with: gplan launch {out} --resume-from RUN_DIR",
                  highlight=False)
    wrote_lines(console, written)


def replan_lines(r) -> list[str]:
    rule = r.resharding
    lines = []
    if r.changed:
        changes = ", ".join(f"{k} {a}→{b}" for k, (a, b) in r.changed.items())
        lines.append(f"the checkpoint ({rule.format}) is resharded over: {changes}")
    else:
        lines.append("the same layout: the checkpoint loads as it is")
    if r.pinned:
        reasons: dict[str, list[str]] = {}
        for degree, why in r.pinned.items():
            reasons.setdefault(why, []).append(degree)
        lines += [f"kept: {', '.join(degrees)} — {why}" for why, degrees in reasons.items()]
    if r.gbs_note:
        lines.append(f"note: {r.gbs_note}")
    if r.changed and rule.conversion:
        lines.append(f"before loading: {rule.conversion}")
    lines.append(f"source: {rule.source}")
    return lines


def replan_json(r, out) -> dict:
    return {"plan": str(out), "devices": r.devices, "before": r.old.parallel.label(), "after": r.new.label(),
            "tokens_per_s_kept": r.tokens_kept, "resharded": {k: list(v) for k, v in r.changed.items()},
            "kept": r.pinned, "gbs": r.new.training.gbs, "gbs_note": r.gbs_note,
            "checkpoint_format": r.resharding.format, "conversion": r.resharding.conversion or None,
            "step_time_s": r.new.prediction.step_time_s}


def failure_table(rows, plan, width: int = WIDE) -> Table:
    from gplan.planner.replan import resharding_of

    table = Table(title=f"if nodes are lost (nodes of {plan.cluster.primary.devices_per_node}; layouts its "
                        f"{resharding_of(plan).format} checkpoint loads into)", title_justify="left")
    for col in ("lost", "devices", "best layout then", "tokens/s", "kept", "optimizer state"):
        table.add_column(col, justify="left" if col in ("best layout then", "optimizer state") else "right")
    for row in rows:
        r = row.replanned
        if r is None:
            table.add_row(str(row.nodes_lost), str(row.devices), row.why_not, "—", "—", "—")
            continue
        moved = ", ".join(k for k in r.changed) or "as it is"
        table.add_row(str(row.nodes_lost), str(row.devices), r.new.label(), f"{r.new.prediction.tokens_per_s:,.0f}",
                      f"{r.tokens_kept:.0%}", "resharded over " + moved if r.changed else moved)
    return fit(table, width, wrap=("best layout then", "optimizer state"))


def lost_row_json(row) -> dict:
    r = row.replanned
    return {"nodes_lost": row.nodes_lost, "devices": row.devices,
            **(replan_json(r, None) | {"plan": None} if r else {"best": None, "why_not": row.why_not})}


def resume_steps(r, target: str) -> str:
    """RESUME.md beside a replanned plan's exported launch files: what changed, the engine's conversion
    step and what keeps the old checkpoint loadable."""
    rule = r.resharding
    lines = [f"# Resuming {r.old.model.name} on {r.devices} devices", "",
             f"Before: {r.old.label()} on {r.old.world_size} devices.", f"After: {r.new.label()} on "
             f"{r.new.world_size} devices ({r.tokens_kept:.0%} of the tokens/s).", "",
             f"The checkpoint ({rule.format}) is resharded over: "
             + (", ".join(f"{k} {a} → {b}" for k, (a, b) in r.changed.items()) or "nothing (the same layout)") + "."]
    if r.pinned:
        lines.append("Kept as they were: " + ", ".join(r.pinned) + f" ({next(iter(r.pinned.values()))}).")
    if r.gbs_note:
        lines.append(f"Note: {r.gbs_note}.")
    lines += ["", "## Steps", ""]
    if r.changed and rule.conversion:
        lines.append(f"1. Convert the checkpoint: `{rule.conversion}`")
    lines.append(f"{'2' if r.changed and rule.conversion else '1'}. Launch the files here ({target}) pointing them at "
                 "the old run's checkpoint directory, which the engine loads resharded.")
    if rule.optimizer_pins and not set(rule.optimizer_pins) & set(r.changed):
        lines.append("   Only dp changed: the default optimizer format loads as it is.")
    elif rule.optimizer_pins:
        lines.append(f"   The optimizer state reshards over {', '.join(set(rule.optimizer_pins) & set(r.changed))} only "
                     f"if the run saved with `{rule.unpinned_by}`.")
    lines += ["", f"Source: {rule.source}.", ""]
    return "\n".join(lines)

