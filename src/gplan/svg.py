"""The pipeline schedule as an SVG picture: a row per stage, a block per forward or backward op."""

from __future__ import annotations

from xml.sax.saxutils import escape

from gplan.cost_models.timeline import Op

FORWARD_FILL = "#4c78a8"
BACKWARD_FILL = "#59a14f"
ROW_PX, LABEL_PX, WIDTH_PX = 28, 70, 1100


def timeline_svg(ops: list[Op], pp: int, title: str) -> str:
    end_s = max(op.end_s for op in ops)
    scale = (WIDTH_PX - LABEL_PX - 10) / end_s
    height = 40 + pp * ROW_PX + 30
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH_PX}" height="{height}" '
             f'font-family="sans-serif" font-size="11">',
             f'<text x="10" y="20" font-size="14">{escape(title)}</text>']
    for stage in range(pp):
        y = 35 + stage * ROW_PX
        parts.append(f'<text x="10" y="{y + 17}">stage {stage}</text>')
        parts.append(f'<rect x="{LABEL_PX}" y="{y}" width="{end_s * scale:.1f}" height="{ROW_PX - 4}" fill="#eeeeee"/>')
    for op in ops:
        x, w = LABEL_PX + op.start_s * scale, (op.end_s - op.start_s) * scale
        y = 35 + op.stage * ROW_PX
        fill = FORWARD_FILL if op.kind == "F" else BACKWARD_FILL
        label = f"{op.kind}{op.microbatch}" + (f".{op.chunk}" if op.chunk else "")
        parts.append(f'<rect x="{x:.2f}" y="{y}" width="{max(w - 0.5, 0.5):.2f}" height="{ROW_PX - 4}" '
                     f'fill="{fill}"><title>{label}: {op.start_s:.4g}–{op.end_s:.4g} s</title></rect>')
        if w > 7 * len(label):
            parts.append(f'<text x="{x + w / 2:.2f}" y="{y + 16}" fill="white" text-anchor="middle">{label}</text>')
    axis_y = 35 + pp * ROW_PX + 15
    parts.append(f'<text x="{LABEL_PX}" y="{axis_y}">0 s</text>')
    parts.append(f'<text x="{WIDTH_PX - 10}" y="{axis_y}" text-anchor="end">{end_s:.4g} s</text>')
    parts.append(f'<text x="{WIDTH_PX / 2}" y="{axis_y}" text-anchor="middle">'
                 f'<tspan fill="{FORWARD_FILL}">■ forward</tspan>  <tspan fill="{BACKWARD_FILL}">■ backward</tspan></text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def plan_timeline_svg(plan, explanation) -> str:
    """The schedule `gplan explain --svg` draws: the explanation's first micro-batches of the plan."""
    c = plan.parallel
    title = (f"{plan.model.name}: {c.label()} schedule={c.schedule}, "
             f"first {explanation.shown} of {explanation.prediction.num_microbatches} micro-batches")
    return timeline_svg(explanation.shown_ops, c.pp, title)
