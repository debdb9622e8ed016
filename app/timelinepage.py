"""The web report's timeline page: its layout (the timeline, the coverage line of each device
and the layer heat strip under it) and the figures its callbacks return for a zoom and for a
click on the strip. Pure functions of a served trace (``entry``: a
:class:`~diagnose.app.server.TraceEntry`; ``state``: the :class:`~diagnose.app.server.AppState`)
that the tests call directly; :func:`diagnose.app.server.create_app` wires them.
"""
from __future__ import annotations

import math
from typing import Any

import dash
from dash import dcc, html

from diagnose.app import layerstrip as LST
from diagnose.app.cards import cause_legend
from diagnose.app.causeview import legend_entries
from diagnose.app.timeline import legend_causes, parse_relayout, timeline_figure


def _graph(id: str, fig) -> dcc.Graph:
    return dcc.Graph(id=id, figure=fig, config={"displaylogo": False, "responsive": True})


def timeline_page(entry: Any, max_points: int = 20000) -> html.Div:
    fig = timeline_figure(entry.timeline, max_points=max_points)
    return html.Div([
        html.H2("GPU timeline"),
        html.P("One row per device:stream; the idle row shows each gap on the device (all streams merged) in the "
               "colour of its cause (the causes legend below: the cause table's colours, as on the overview). The top row shows steps "
               "coloured by phase; the host row what the host was doing: step markers, and runtime calls of 20 µs or "
               "more (blocking calls in the host_blocked colour), so a gap lines up with the call it waited on. Drag "
               "to zoom: the zoomed range is re-rendered in full detail; double-click to reset.", className="dg-muted"),
        cause_legend(legend_entries(legend_causes(entry.timeline)), "timeline-cause-legend"),
        dcc.Loading(_graph("timeline-graph", fig), type="default"),
        *layer_section(entry),
    ])


def layer_section(entry: Any) -> list[Any]:
    """Under the timeline: the coverage line of each device and the layer heat strip (a click
    on a cell zooms the timeline to that cell's kernels and highlights them)."""
    cov = LST.coverage_texts(entry.report)
    out: list[Any] = [html.H3("Layers and coverage"),
                      html.Ul([html.Li(t) for t in cov], id="coverage") if cov else
                      html.P("no GPU kernels: nothing to attribute", className="dg-muted", id="coverage")]
    strip = entry.strip
    if strip is not None:
        out.append(_graph("layer-strip", LST.strip_figure(strip)))
    return out


def timeline_highlight(state: Any, click: dict | None, trace_key: Any, max_points: int = 20000):
    """Figure for a click on the layer strip: the timeline zoomed to the clicked cell's kernels,
    drawn in full detail, with them highlighted; ``dash.no_update`` for a click that names no cell."""
    entry = state.get(trace_key)
    pts = (click or {}).get("points") if isinstance(click, dict) else None
    strip = entry.strip
    if not pts or strip is None or not isinstance(pts[0], dict):
        return dash.no_update
    key = f"{pts[0].get('x')}|{pts[0].get('y')}"
    cells = strip["cells"].get(key) or []
    fig = timeline_figure(entry.timeline, max_points=max_points, x_range=LST.zoom_range(cells))
    fig.add_trace(LST.highlight_trace(cells))
    fig.update_layout(meta={**(fig.layout.meta or {}), "highlighted_cell": key, "highlighted": len(cells)})
    return fig


def timeline_zoom(state: Any, relayout: dict | None, trace_key: Any, max_points: int = 20000):
    """Figure for a timeline relayout event, or ``dash.no_update`` when the x axis did not change.

    The range comes from the browser: one that is not two finite numbers, or lies wholly
    outside the trace, gives the whole trace with a note on the figure; a range reaching
    past the trace is clipped to one trace span on either side."""
    action, rng = parse_relayout(relayout if isinstance(relayout, dict) else None)
    if action == "none":
        return dash.no_update
    td = state.get(trace_key).timeline
    note = None
    if action == "zoom":
        span_ms = max(int(getattr(td, "span_ns", 0) or 0), 1) / 1e6
        lo, hi = sorted(rng)
        if not (math.isfinite(lo) and math.isfinite(hi)):
            rng, note = None, "zoom ignored: the range was not two finite numbers"
        elif hi < 0 or lo > span_ms:
            rng, note = None, f"zoom ignored: the range lies outside the trace (0 to {span_ms:,.3f} ms)"
        else:
            rng = [max(lo, -span_ms), min(hi, 2 * span_ms)]
    fig = timeline_figure(td, max_points=max_points, x_range=rng if action == "zoom" else None)
    if note is not None:
        fig.add_annotation(text=note, xref="paper", yref="paper", x=0, y=1.06, showarrow=False,
                           font={"color": "#c62828"}, name="zoom-note")
    return fig
