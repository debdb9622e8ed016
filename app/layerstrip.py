"""The layer heat strip under the timeline: layers (pre, 0..L-1, post) across, op classes down,
kernel time as colour; clicking a cell highlights that cell's kernels on the timeline (the web
report zooms to them and draws them in full detail; the HTML report highlights and zooms in the
page, with plotly.js).

One strip: the segmentation with the most forward time (``report["layer_segmentation"]``);
the coverage line of its device is printed above it. The kernels of a cell come from
``Analysis.layer_frame`` (per kernel activity: part, layer, op class) and the timeline's rows
(:class:`~diagnose.app.timeline.TimelineData`); at most :data:`MAX_PER_CELL` per cell are
highlighted (the earliest), the rest are counted.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from diagnose.analyzers.layerseg import OP_CLASSES

MAX_PER_CELL = 400
HIGHLIGHT_NAME = "selected layer cell"
HIGHLIGHT_COLOR = "rgba(255, 193, 7, 0.75)"


def main_segmentation(report: Mapping) -> dict | None:
    """The segmentation the strip shows: the one with the most forward time."""
    segs = report.get("layer_segmentation") or []
    return max(segs, key=lambda s: s.get("forward_ms") or 0.0) if segs else None


def coverage_texts(report: Mapping) -> list[str]:
    """The coverage line of every device (the same text as the terminal's)."""
    return [str(c.get("text")) for c in report.get("coverage") or []]


def _label(part: str, layer: Any) -> str:
    return part if part != "layer" else str(layer)


def strip_data(report: Mapping, layer_frame: pd.DataFrame | None = None, activities: pd.DataFrame | None = None,
               td: Any = None, max_per_cell: int = MAX_PER_CELL) -> dict | None:
    """The strip of the main segmentation: ``x`` labels (pre, 0.., post), ``y`` op classes,
    ``z`` (ms, y by x), the title, and ``cells`` ({"x|y": [[x0_ms, x1_ms, row], ...]} on the
    timeline's axes, when ``layer_frame``, ``activities`` and ``td`` are given) with
    ``cell_counts`` (kernels per cell, all forwards); None without layers."""
    seg = main_segmentation(report)
    if seg is None:
        return None
    rows = [r for r in report.get("layers") or [] if r.get("device") == seg["device"] and r.get("phase") == seg["phase"]]
    if not rows:
        return None
    x = [_label(r["part"], r.get("layer")) for r in rows]
    ys = [c for c in OP_CLASSES if any((r.get("op_class_ms") or {}).get(c) for r in rows)]
    z = [[(r.get("op_class_ms") or {}).get(c, 0.0) for r in rows] for c in ys]
    out = {"device": seg["device"], "phase": seg["phase"], "x": x, "y": ys, "z": z, "cells": {}, "cell_counts": {},
           "title": (f"Layers × op class — {seg['phase']}, GPU {seg['device']}: {seg['layers']} layers from {seg['source']} "
                     f"(confidence {seg['confidence']}); kernel ms summed over {seg['forwards']} forward(s); "
                     "click a cell to highlight its kernels on the timeline")}
    if layer_frame is not None and activities is not None and td is not None and len(layer_frame):
        out["cells"], out["cell_counts"] = _cells(seg, layer_frame, activities, td, max_per_cell)
    return out


def _cells(seg: Mapping, lf: pd.DataFrame, acts: pd.DataFrame, td: Any, cap: int) -> tuple[dict, dict]:
    pos = lf.index.to_numpy(np.int64)
    part = lf["part"].to_numpy()
    keep = (part > 0) & (acts["device"].to_numpy()[pos] == seg["device"]) & \
           (acts["phase"].to_numpy(dtype=object)[pos] == seg["phase"])
    pos, part = pos[keep], part[keep]
    layer, op = lf["layer"].to_numpy()[keep], lf["op_class"].to_numpy()[keep]
    row_of = np.full(len(acts), -1, dtype=np.int64)
    row_of[np.asarray(td.act_src, dtype=np.int64)] = np.asarray(td.act_row, dtype=np.int64)
    start = acts["start_ns"].to_numpy(np.int64)[pos]
    end = acts["end_ns"].to_numpy(np.int64)[pos]
    rows = row_of[pos]
    n_lay = int(layer.max()) + 2 if len(layer) else 1
    cell = (part.astype(np.int64) * (n_lay + 1) + layer + 1) * len(OP_CLASSES) + op
    order = np.lexsort((start, cell))
    cs = cell[order]
    first = np.r_[True, cs[1:] != cs[:-1]]
    starts = np.flatnonzero(first)
    rank = np.arange(len(cs)) - np.repeat(starts, np.diff(np.r_[starts, len(cs)]))
    take = order[(rank < cap) & (rows[order] >= 0)]
    names = np.asarray(OP_CLASSES, dtype=object)
    part_name = {1: "pre", 2: "layer", 3: "post"}

    def key(i: int) -> str:
        return f"{_label(part_name[int(part[i])], int(layer[i]))}|{names[op[i]]}"

    counts = {key(order[s0]): int(n) for s0, n in zip(starts, np.diff(np.r_[starts, len(cs)]))}
    cells: dict[str, list] = {k: [] for k in counts}
    x0 = np.round((start[take] - td.t0_ns) / 1e6, 6)
    x1 = np.round((end[take] - td.t0_ns) / 1e6, 6)
    for i, a, b, r in zip(take.tolist(), x0.tolist(), x1.tolist(), rows[take].tolist()):
        cells[key(i)].append([a, b, int(r)])
    return cells, counts


def strip_figure(strip: Mapping) -> go.Figure:
    """The heat strip (a plotly heatmap; each cell's ``customdata`` is its key)."""
    keys = [[f"{x}|{y}" for x in strip["x"]] for y in strip["y"]]
    fig = go.Figure(go.Heatmap(
        z=strip["z"], x=strip["x"], y=strip["y"], customdata=keys, colorscale="YlOrRd", xgap=1, ygap=1,
        colorbar=dict(title="ms", thickness=12), hovertemplate="layer %{x} · %{y}: %{z:.3f} ms<extra></extra>"))
    fig.update_layout(title=dict(text=strip["title"], font=dict(size=13)), height=120 + 24 * len(strip["y"]),
                      margin=dict(l=110, r=20, t=50, b=40), xaxis=dict(type="category", title="layer"),
                      yaxis=dict(type="category", autorange="reversed"), meta={"strip": True})
    return fig


def highlight_trace(intervals: list | None = None) -> go.Scatter:
    """The timeline trace that shows a cell's kernels (segments at their rows; empty at first)."""
    xs: list = []
    ys: list = []
    for x0, x1, row in intervals or []:
        xs += [x0, x1, None]
        ys += [row, row, None]
    return go.Scatter(x=xs, y=ys, mode="lines", name=HIGHLIGHT_NAME, line=dict(color=HIGHLIGHT_COLOR, width=26),
                      hoverinfo="skip", showlegend=True, meta={"segments": len(intervals or [])})


def zoom_range(intervals: list) -> list[float] | None:
    """An x range (ms) around ``intervals`` with 5 % padding, None when empty."""
    if not intervals:
        return None
    lo = min(i[0] for i in intervals)
    hi = max(i[1] for i in intervals)
    pad = max((hi - lo) * 0.05, 0.001)
    return [lo - pad, hi + pad]


#: The HTML report's click handler: restyles the timeline's last trace (the highlight) with the
#: clicked cell's kernels and zooms to them. ``cells`` is the strip's ``cells`` as JSON.
CLICK_JS = """
window.addEventListener('load', function () {
  var strip = document.getElementById('layer-strip'), tl = document.getElementById('timeline-graph');
  var cells = JSON.parse(document.getElementById('layer-strip-cells').textContent);
  if (!strip || !tl || !strip.on) { return; }
  strip.on('plotly_click', function (ev) {
    var p = ev.points[0], iv = cells[p.x + '|' + p.y] || [], xs = [], ys = [], lo = Infinity, hi = -Infinity;
    iv.forEach(function (k) { xs.push(k[0], k[1], null); ys.push(k[2], k[2], null); lo = Math.min(lo, k[0]); hi = Math.max(hi, k[1]); });
    Plotly.restyle(tl, {x: [xs], y: [ys]}, [tl.data.length - 1]);
    if (iv.length) { var pad = Math.max((hi - lo) * 0.05, 0.001); Plotly.relayout(tl, {'xaxis.range': [lo - pad, hi + pad]}); }
    tl.setAttribute('data-highlighted', String(iv.length));
    tl.setAttribute('data-cell', p.x + '|' + p.y);
  });
});
"""
