"""The timeline's critical-path lane: every segment of every step's critical path (README
"Critical path") on its own row, coloured by kind, and the longest segments -- the ones the
JSON report lists in ``steps[].critical_path.segments`` -- highlighted.

:func:`path_lane` turns an analysis's paths (:class:`diagnose.analyzers.critpath.Paths`) into
a frame; :func:`path_traces` draws the visible part of it (every segment, or pixel-sized
runs by dominant kind when there are too many), each trace's ``meta`` naming what it holds.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from diagnose.analyzers.critpath import TOP_SEGMENTS
from diagnose.vocab import PATH_KIND_COLORS, PATH_KIND_LABELS, PATH_KINDS

#: Name of the highlight trace (the browser test reads it).
TOP_TRACE = "critical path · longest segments"
ROW_LABEL = "critical path"


def path_lane(paths: Any, top: int = TOP_SEGMENTS) -> pd.DataFrame | None:
    """Every path segment: start_ns, end_ns, kind (index into PATH_KINDS), label, top (one
    of the ``top`` longest of its path: the segments the JSON report lists). None without
    paths."""
    if paths is None or not paths.all():
        return None
    parts = []
    for p in paths.all():
        d = p.dur
        top_mask = np.zeros(len(d), dtype=bool)
        top_mask[np.argsort(-d, kind="stable")[:top]] = True
        labels = [str(n)[:100] + (f" · {c}" if c else "") + (f" · {a}" if a else "") + (f" · {str(f)[:80]}" if f else "")
                  for n, c, a, f in zip(p.name.tolist(), p.cause.tolist(), p.activity.tolist(), p.frame.tolist())]
        parts.append(pd.DataFrame({"start_ns": p.t0, "end_ns": p.t1, "kind": p.kind.astype(np.int64),
                                   "label": labels, "top": top_mask}))
    return pd.concat(parts, ignore_index=True).sort_values("start_ns", kind="stable").reset_index(drop=True)


def _seg(x0, x1, y: int, text, name: str, color: str, width: int, group: str, meta: dict) -> go.Scatter:
    m = len(x0)
    x = np.empty(3 * m)
    x[0::3], x[1::3], x[2::3] = x0, x1, np.nan
    yy = np.empty(3 * m)
    yy[0::3], yy[1::3], yy[2::3] = y, y, np.nan
    t = [""] * (3 * m)
    t[0::3] = text
    t[1::3] = text
    return go.Scatter(x=x, y=yy, text=t, mode="lines", name=name, legendgroup=group, line=dict(color=color, width=width),
                      connectgaps=False, hovertemplate="%{text}<extra></extra>", meta=meta)


def _fmt_us(ns: float) -> str:
    us = ns / 1e3
    return f"{us:,.1f} µs" if us < 1e4 else f"{us / 1e3:,.2f} ms"


def _runs(s: np.ndarray, e: np.ndarray, k: np.ndarray, lo: int, hi: int, n_bins: int):
    """Contiguous segments (sorted) merged into runs of pixel bins with the same dominant kind
    (by time): (run start, run end, kind, segments per run)."""
    w = max((hi - lo) / n_bins, 1.0)
    b = np.clip(((np.clip(s, lo, hi) - lo) / w).astype(np.int64), 0, n_bins - 1)
    dur = (np.minimum(e, hi) - np.maximum(s, lo)).astype(np.float64)
    wgt = np.bincount(b * len(PATH_KINDS) + k, weights=dur + 1e-9, minlength=n_bins * len(PATH_KINDS))
    dom_bin = wgt.reshape(n_bins, len(PATH_KINDS)).argmax(axis=1)
    cls = dom_bin[b]
    new = np.concatenate(([True], (cls[1:] != cls[:-1]) | (b[1:] - b[:-1] > 1)))
    first = np.flatnonzero(new)
    last = np.concatenate((first[1:], [len(s)])) - 1
    return np.maximum(s[first], lo), np.minimum(e[last], hi), cls[first], last - first + 1


def path_traces(lane: pd.DataFrame, row: int, t0_ns: int, lo: int, hi: int, budget: int, line_px: int) -> list[go.Scatter]:
    """Traces of the visible path segments (times relative to ``t0_ns``, range [lo, hi] ns):
    one per kind, at most ``budget`` drawn elements (runs of pixel bins by dominant kind
    beyond), and the highlight of the longest segments (always drawn exactly)."""
    s = lane["start_ns"].to_numpy(dtype=np.int64) - t0_ns
    e = lane["end_ns"].to_numpy(dtype=np.int64) - t0_ns
    k = lane["kind"].to_numpy(dtype=np.int64)
    vis = np.flatnonzero((s < hi) & (e > lo))
    out: list[go.Scatter] = []
    if len(vis) <= budget:
        for ki, kind in enumerate(PATH_KINDS):
            sel = vis[k[vis] == ki]
            if len(sel):
                txt = [f"{lane['label'].iat[i]}<br>{PATH_KIND_LABELS[kind]} · {_fmt_us(e[i] - s[i])}" for i in sel.tolist()]
                out.append(_seg(s[sel] / 1e6, e[sel] / 1e6, row, txt, f"path: {PATH_KIND_LABELS[kind]}",
                                PATH_KIND_COLORS[kind], line_px, "path:" + kind, {"segments": int(len(sel))}))
    elif len(vis):
        rs, re_, dom, cnt = _runs(s[vis], e[vis], k[vis], lo, hi, max(1, min(1600, budget)))
        for ki, kind in enumerate(PATH_KINDS):
            m = dom == ki
            if m.any():
                txt = [f"{c:,} path segments merged · mostly {PATH_KIND_LABELS[kind]}" for c in cnt[m].tolist()]
                out.append(_seg(rs[m] / 1e6, re_[m] / 1e6, row, txt, f"path: {PATH_KIND_LABELS[kind]}",
                                PATH_KIND_COLORS[kind], line_px, "path:" + kind, {"segments": int(m.sum())}))
    topi = np.flatnonzero(lane["top"].to_numpy(dtype=bool))
    topi = topi[(s[topi] < hi) & (e[topi] > lo)]
    if len(topi):
        txt = [f"longest on the path: {lane['label'].iat[i]}<br>{_fmt_us(e[i] - s[i])}" for i in topi.tolist()]
        out.append(_seg(s[topi] / 1e6, e[topi] / 1e6, row, txt, TOP_TRACE, "#000000", max(line_px // 3, 3), "path:top",
                        {"segments": int(len(topi)), "critical_path_top": [[round(float(a) / 1e6, 6), round(float(b - a) / 1e6, 6)]
                                                                            for a, b in zip(s[topi], e[topi])]}))
    return out
