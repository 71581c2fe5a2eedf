"""`--report report.html`: one self-contained page to look at a plan (and the search that chose it).

Charts are plotly figures with plotly.js embedded once in the page (no CDN: it opens offline). Each chart
is a `div` with a fixed id whose `data` holds the plan's own numbers, which the browser test reads back:

    pareto          every candidate as step time against memory (`planner.landscape`, even splits), those
                    that do not fit greyed, the memory budget drawn, the ranked plans and the chosen one
    stage-memory    each stage's memory per device, term by term, against its budget
    schedule        the pipeline schedule's first micro-batches, op by op (`cost_models.timeline`)
    breakdown       where the step's time goes

and a table of the ranked plans.
"""

from __future__ import annotations

import html
from datetime import datetime, timezone

from gplan import __version__
from gplan.plan import Plan

GIB = 1024 ** 3
FORWARD, BACKWARD, CHOSEN, RANKED, FITS, NOT_FITS = "#4c78a8", "#59a14f", "#d62728", "#ff7f0e", "#9ecae1", "#c7c7c7"
#: StageMemory's terms, bottom to top, with what a reader calls them.
MEMORY_TERMS = (("weights_bytes", "weights"), ("grads_bytes", "gradients"), ("optimizer_bytes", "optimizer states"),
                ("activations_bytes", "activations"), ("buffers_bytes", "buffers"), ("transient_bytes", "transient"),
                ("communicator_bytes", "communicators"), ("fragmentation_bytes", "fragmentation"),
                ("reserve_bytes", "reserve"))


def plan_report(plan: Plan, explanation, space=None) -> str:
    """The page for `plan` (its explanation from `planner.explain`; `space`: a `planner.landscape` result)."""
    import plotly

    figures = [("pareto", "Candidates: step time against memory", pareto_figure(plan, space)) if space else None,
               ("stage-memory", "Memory per stage, term by term", stage_memory_figure(plan, explanation.prediction)),
               ("schedule", f"Pipeline schedule (first {explanation.shown} of "
                            f"{explanation.prediction.num_microbatches} micro-batches)", schedule_figure(plan, explanation)),
               ("breakdown", "Where the step's time goes", breakdown_figure(explanation.prediction))]
    body, first = [], True
    for entry in filter(None, figures):
        div_id, heading, figure = entry
        body.append(f"<h2>{html.escape(heading)}</h2>")
        if div_id == "pareto":
            body.append(f"<p class=note>{html.escape(space.note)}; the ranked plans with their solved splits.</p>")
        body.append(figure.to_html(full_html=False, include_plotlyjs=first, div_id=div_id,
                                   config={"displaylogo": False, "responsive": True}))
        first = False
    c = plan.parallel
    title = f"gplan: {plan.model.name} on {plan.world_size} × {plan.cluster.primary.hardware.name}"
    return PAGE.format(
        title=html.escape(title), summary=summary_table(plan, explanation.prediction), body="\n".join(body),
        ranked=ranked_table(plan), version=html.escape(__version__), digest=html.escape(plan.digest),
        plotly=html.escape(plotly.__version__), schedule=html.escape(c.schedule),
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"))


def report_page(plan: Plan, explanation=None) -> str:
    """The page `--report` writes: the plan's explanation (computed when not given) and its search space."""
    from gplan.planner.explain import explain
    from gplan.planner.landscape import landscape

    return plan_report(plan, explanation or explain(plan, []), landscape(plan))


def pareto_figure(plan: Plan, space):
    import plotly.graph_objects as go

    figure = go.Figure()
    for fits, name, colour in ((False, "does not fit", NOT_FITS), (True, "fits (even split)", FITS)):
        points = [p for p in space.points if p.fits == fits]
        figure.add_trace(go.Scattergl(
            x=[p.memory_bytes / GIB for p in points], y=[p.step_time_s for p in points], mode="markers", name=name,
            text=[p.label for p in points], marker={"color": colour, "size": 6},
            hovertemplate="%{text}<br>%{y:.4g} s, %{x:.1f} GiB<extra></extra>"))
    ups = plan.search.runner_ups if plan.search else []
    if ups:
        figure.add_trace(go.Scatter(
            x=[u.memory_bytes_per_device_max / GIB for u in ups], y=[u.step_time_s for u in ups], mode="markers",
            name="ranked (solved split)", text=[u.parallel.label() for u in ups],
            marker={"color": RANKED, "size": 10, "symbol": "diamond"},
            hovertemplate="%{text}<br>%{y:.4g} s, %{x:.1f} GiB<extra></extra>"))
    p = plan.prediction
    figure.add_trace(go.Scatter(
        x=[p.memory_bytes_per_device_max / GIB], y=[p.step_time_s], mode="markers", name="chosen plan",
        text=[plan.label()], marker={"color": CHOSEN, "size": 16, "symbol": "star"},
        hovertemplate="%{text}<br>%{y:.4g} s, %{x:.1f} GiB<extra></extra>"))
    budget = min(s.memory_budget_bytes for s in p.stages) / GIB
    times = [q.step_time_s for q in space.points] + [p.step_time_s]
    # a line trace, not a shape: shapes on a log axis take log10 coordinates
    figure.add_trace(go.Scatter(x=[budget, budget], y=[min(times), max(times)], mode="lines", name="memory budget",
                                line={"color": CHOSEN, "dash": "dash"},
                                hovertemplate=f"memory budget {budget:.1f} GiB<extra></extra>"))
    figure.update_layout(xaxis_title="memory per device, fullest stage (GiB)", yaxis_title="step time (s)",
                         xaxis_type="log", yaxis_type="log", height=520, margin={"t": 30}, legend={"orientation": "h", "y": -0.18})
    return figure


def stage_memory_figure(plan: Plan, prediction):
    import plotly.graph_objects as go

    stages = [f"stage {s.index}" for s in prediction.stages]
    figure = go.Figure()
    for field, name in MEMORY_TERMS:
        figure.add_trace(go.Bar(x=stages, y=[getattr(s.memory, field) / GIB for s in prediction.stages], name=name,
                                hovertemplate=f"{name}: %{{y:.2f}} GiB<extra></extra>"))
    figure.add_trace(go.Scatter(x=stages, y=[s.memory_budget_bytes / GIB for s in prediction.stages],
                                mode="lines+markers", name="budget", line={"color": CHOSEN, "dash": "dash"},
                                hovertemplate="budget %{y:.1f} GiB<extra></extra>"))
    figure.update_layout(barmode="stack", yaxis_title="GiB per device", height=420, margin={"t": 30})
    return figure


def schedule_figure(plan: Plan, explanation):
    import plotly.graph_objects as go

    figure = go.Figure()
    for kind, name, colour in (("F", "forward", FORWARD), ("B", "backward", BACKWARD)):
        ops = [op for op in explanation.shown_ops if op.kind == kind]
        figure.add_trace(go.Bar(
            orientation="h", base=[op.start_s for op in ops], x=[op.end_s - op.start_s for op in ops],
            y=[f"stage {op.stage}" for op in ops], name=name, marker={"color": colour, "line": {"width": 0.5, "color": "white"}},
            text=[f"{kind}{op.microbatch}" + (f".{op.chunk}" if plan.parallel.vpp > 1 else "") for op in ops],
            textposition="inside", insidetextanchor="middle",
            hovertemplate="%{text}: %{base:.4g}–%{x:.4g} s<extra></extra>"))
    figure.update_layout(barmode="overlay", xaxis_title="seconds into the step", height=120 + 40 * plan.parallel.pp,
                         yaxis={"autorange": "reversed"}, margin={"t": 30})
    return figure


def breakdown_figure(prediction):
    import plotly.graph_objects as go

    terms = {k: v for k, v in prediction.breakdown.model_dump().items() if v > 0}
    figure = go.Figure(go.Bar(orientation="h", x=list(terms.values()), y=list(terms), marker={"color": FORWARD},
                              hovertemplate="%{y}: %{x:.4g} s<extra></extra>"))
    figure.update_layout(xaxis_title=f"seconds of the {prediction.step_time_s:.4g} s step", height=300,
                         yaxis={"autorange": "reversed"}, margin={"t": 30})
    return figure


def summary_table(plan: Plan, p) -> str:
    provenance = plan.provenance.solver
    rows = [("configuration", f"{plan.label()} schedule={plan.parallel.schedule} m={p.num_microbatches}"),
            ("step time", f"{p.step_time_s:.4g} s"), ("throughput", f"{p.tokens_per_s:,.0f} tokens/s"),
            ("MFU", f"{p.mfu:.1%}"), ("memory", f"{p.memory_bytes_per_device_max / GIB:.1f} GiB per device at most "
                                                f"({'fits' if p.fits else 'does not fit'})"),
            ("target", plan.target or "any"),
            ("split", "/".join(str(s.layer_end - s.layer_start) for s in plan.stages)),
            ("solver", f"{provenance.name} ({provenance.status})")]
    cells = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f"<table class=summary>{cells}</table>"


def ranked_table(plan: Plan) -> str:
    p = plan.prediction
    rows = [("chosen", plan.label(), "/".join(str(s.layer_end - s.layer_start) for s in plan.stages),
             p.step_time_s, p.memory_bytes_per_device_max)]
    for i, up in enumerate(plan.search.runner_ups if plan.search else [], start=2):
        split = "/".join(str(sum(c.count for c in layers)) for layers in up.stage_layers)
        rows.append((str(i), up.parallel.label(), split, up.step_time_s, up.memory_bytes_per_device_max))
    head = "<tr><th>#</th><th>configuration</th><th>split</th><th>step</th><th>vs chosen</th><th>memory</th></tr>"
    body = "".join(f"<tr><td>{html.escape(r)}</td><td>{html.escape(label)}</td><td>{html.escape(split)}</td>"
                   f"<td>{step:.4g} s</td><td>{step / p.step_time_s - 1:+.1%}</td><td>{memory / GIB:.1f} GiB</td></tr>"
                   for r, label, split, step, memory in rows)
    return f"<table class=ranked id=ranked>{head}{body}</table>"


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }}
h1 {{ font-size: 1.5em; }} h2 {{ font-size: 1.15em; margin-top: 2em; }}
table {{ border-collapse: collapse; }} th, td {{ padding: 0.25em 0.8em; border-bottom: 1px solid #ddd; text-align: left; }}
table.ranked td:nth-child(n+4) {{ text-align: right; font-variant-numeric: tabular-nums; }}
.note, footer {{ color: #666; font-size: 0.9em; }}
</style></head>
<body>
<h1>{title}</h1>
{summary}
{body}
<h2>Ranked plans</h2>
{ranked}
<footer><p>gplan {version}; plan digest {digest}; schedule {schedule}; charts by plotly {plotly}, embedded;
written {created}.</p></footer>
</body></html>
"""
