"""GPU timeline figure: activity per stream, idle gaps, phase bands; aggregated for big traces.

Drawing model (why it stays responsive at 1,000,000 kernels):

* Every drawn bar is a horizontal line segment ``(x0, y) -> (x1, y)`` of a ``go.Scatter``
  trace, segments separated by NaN. One trace per kernel category / gap cause / phase, never
  one per activity, and no layout shapes except a handful of phase shadings.
* When more than ``max_points`` elements would be drawn in the visible range, activities are
  binned by pixel-sized time bins (numpy ``bincount`` on a difference array): a bin is busy
  when any activity of the stream overlaps it; runs of busy bins become one block, coloured
  by its dominant category (by kernel time). Idle gaps are binned the same way per device:
  each bin gets its exact idle ns by gap cause (cumulative-sum over the disjoint gaps), and
  runs of bins with the same dominant cause and at least ``MIN_IDLE_SHARE`` idle become one
  block. The total number of drawn elements is at most ``max_points``.
* Zoomed (``x_range`` given) and below the budget, every activity and every gap is drawn.

Gaps and their causes are the analyzer's (:mod:`diagnose.analyzers.waits`: one bar per idle
interval of a device, all streams merged), each drawn in its cause's colour from the cause
table (``diagnose/data/causes.yaml``), the colour every other view uses.

Time axis: ms from the trace start (``t0_ns`` in ``fig.layout.meta``), the origin of ``start_ms``
and ``--window``: a gap of the overview's table sits at the same time here.
"""
from __future__ import annotations

import re

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from diagnose.app.causeview import CAUSE_LEGEND  # noqa: F401 (re-exported)
from diagnose.vocab import CATEGORY_COLORS, CAUSE_COLORS, GAP_CAUSES, PHASE_COLORS  # noqa: F401 (re-exported)

#: Bins (≈ pixels) across the visible range when aggregating.
MAX_BINS = 1600
#: In aggregated mode, an idle bin is drawn when at least this share of it is idle.
MIN_IDLE_SHARE = 0.02
#: Phase shading (layout shapes, slow in bulk) only when this few steps are visible.
MAX_SHADED_STEPS = 40
#: Step markers only when this few steps are visible.
MAX_STEP_MARKERS = 500
ROW_PX = 30
LINE_PX = 16
#: The x axis of every time plot: the report's origin (``Analysis.t0_ns``, the earliest event).
TIME_AXIS_TITLE = "ms from trace start"


def category_color(name: str) -> str:
    return CATEGORY_COLORS.get(name, "#555555")


@dataclass
class TimelineData:
    """Activities and gaps pre-sorted for fast re-rendering (computed once per trace).

    Times are int64 ns relative to ``t0_ns``. Activity arrays are sorted by (row, start).

    Attributes:
        t0_ns: absolute time of the trace start (ns): ``Analysis.t0_ns``, the origin of
            every ``start_ms`` of the report and of ``--window``.
        rows: y-axis labels, row 0 = phases/steps, then per device its streams and an
            "idle" row.
        act_row, act_start, act_end, act_cat: per activity; ``act_cat`` indexes ``categories``.
        act_src: per activity, its row position in the source frame (names/kinds are looked
            up lazily there, only for what is drawn in detail).
        names, kinds: the source frame's ``name`` and ``kind`` columns.
        gap_row, gap_start, gap_end, gap_cause: per idle gap; ``gap_cause`` indexes GAP_CAUSES.
        gap_next: source-frame position of the activity after each gap.
        step_start, step_end, step_phase, step_label: steps with a GPU range.
        phases: phase names indexed by ``step_phase``.
    """

    t0_ns: int
    rows: list[str]
    categories: list[str]
    act_row: np.ndarray
    act_start: np.ndarray
    act_end: np.ndarray
    act_cat: np.ndarray
    act_src: np.ndarray
    names: pd.Series
    kinds: pd.Series
    gap_row: np.ndarray
    gap_start: np.ndarray
    gap_end: np.ndarray
    gap_cause: np.ndarray
    gap_next: np.ndarray
    step_start: np.ndarray
    step_end: np.ndarray
    step_phase: np.ndarray
    step_label: list[str]
    phases: list[str]
    device_gap_rows: dict[int, int] = field(default_factory=dict)
    host_row: int | None = None
    host_start: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    host_end: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    host_kind: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int8))  # 0 marker, 1 call, 2 blocking call
    host_label: list[str] = field(default_factory=list)
    path: Any = None  # the critical-path lane (diagnose.app.pathlane.path_lane), drawn on row path_row
    path_row: int | None = None

    @property
    def n_activities(self) -> int:
        return int(len(self.act_start))

    @property
    def span_ns(self) -> int:
        ends = [int(self.act_end.max())] if len(self.act_end) else []
        if len(self.step_end):
            ends.append(int(self.step_end.max()))
        return max(ends) if ends else 0


def _device_gaps(acts: pd.DataFrame, host: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Gaps of one device's activities (``acts``, any order) as the analyzer finds them: start,
    end (absolute ns), cause code (GAP_CAUSES) and the position in ``acts`` of the activity
    after each gap. ``host``: the analysis's host causes (None: launch times only)."""
    from diagnose.analyzers.gapcause import DeviceActs
    from diagnose.analyzers.waits import device_gaps

    d = DeviceActs.of(acts)
    g = device_gaps(d, host)
    return g.start, g.end, g.cause.astype(np.int16), d.pos[g.next_idx]


#: The blocking-call colour of the host lane: the host_blocked cause's.
BLOCKED_COLOR = CAUSE_COLORS["host_blocked"]


def legend_causes(td: TimelineData) -> list[str]:
    """The causes the timeline draws in a cause's colour: its gaps' causes, and host_blocked
    when the host lane has a blocking call (drawn in that cause's colour). Names, in the
    cause table's order (for :func:`diagnose.app.causeview.legend_entries`)."""
    drawn = {GAP_CAUSES[int(c)] for c in np.unique(td.gap_cause)}
    if td.host_row is not None and bool((td.host_kind == 2).any()):
        drawn.add("host_blocked")
    return [c for c in GAP_CAUSES if c in drawn]


HOST_KINDS = ("step marker", "runtime call", "blocking call")
HOST_COLORS = ("#37474f", "#90a4ae", BLOCKED_COLOR)
#: Runtime calls shorter than this are not drawn on the host lane (launches take ~5-10 µs).
HOST_MIN_CALL_NS = 20_000
HOST_MAX_CALLS = 20_000
_BLOCKING = re.compile(r"synchroniz|eventquery|streamwaitevent|memcpy(?:(?!async|memcpy)[\s\S])*\Z|memset(?:(?!async|memset)[\s\S])*\Z|withstream", re.I)  # linear: see diagnose/data/host_calls.yaml


def host_lane(trace: Any, report: dict | None) -> pd.DataFrame:
    """What the host did, for the timeline's host lane: the steps' CPU marker ranges and the
    runtime/driver calls of at least :data:`HOST_MIN_CALL_NS` (the longest
    :data:`HOST_MAX_CALLS`), blocking calls (synchronize, event waits, synchronous copies)
    marked. Columns: name, start_ns, end_ns, kind (0 marker, 1 call, 2 blocking call)."""
    parts = []
    steps = [s for s in (report or {}).get("steps") or [] if s.get("scope", "cpu") == "cpu"
             and s.get("start_ns") is not None and s.get("end_ns") is not None]
    if steps:
        parts.append(pd.DataFrame({"name": [str(s.get("name")) for s in steps],
                                   "start_ns": [int(s["start_ns"]) for s in steps],
                                   "end_ns": [int(s["end_ns"]) for s in steps], "kind": 0}))
    rt = getattr(trace, "runtime", None)
    if rt is not None and len(rt):
        dur = (rt["end_ns"] - rt["start_ns"]).to_numpy()
        sel = rt[dur >= HOST_MIN_CALL_NS]
        if len(sel) > HOST_MAX_CALLS:
            sel = sel.iloc[np.argsort(-(sel["end_ns"] - sel["start_ns"]).to_numpy(), kind="stable")[:HOST_MAX_CALLS]]
        names = sel["name"].to_numpy(dtype=object)
        kind = np.array([2 if _BLOCKING.search(str(n)) else 1 for n in names], dtype=np.int8)
        parts.append(pd.DataFrame({"name": names, "start_ns": sel["start_ns"].to_numpy(), "end_ns": sel["end_ns"].to_numpy(),
                                   "kind": kind}))
    if not parts:
        return pd.DataFrame({"name": [], "start_ns": [], "end_ns": [], "kind": []})
    return pd.concat(parts, ignore_index=True)


def prepare_timeline(activities: pd.DataFrame | None, report: dict | None = None, host: pd.DataFrame | None = None,
                     host_index: Any = None, path: pd.DataFrame | None = None, t0_ns: int | None = None) -> TimelineData:
    """Sort activities per stream, compute idle gaps per device and step bands.

    Args:
        activities: ``Analysis.activities`` (columns kind, name, device, stream, start_ns,
            end_ns, category; optional launch_end_ns, graph_followup). None or empty is allowed.
        report: ``Analysis.to_dict()``; its ``steps`` give the phase bands.
        host: :func:`host_lane` of the trace: drawn on a "host" row under the steps, so a gap
            on the GPU lines up with what the host was doing (a blocking call, a marker).
        host_index: the analysis's :class:`~diagnose.analyzers.hostcause.HostCauses`, so the
            drawn gap causes are the report's; None: causes from launch times only.
        path: the critical-path lane (:func:`diagnose.app.pathlane.path_lane`): drawn on a
            "critical path" row, its longest segments highlighted.
        t0_ns: the trace start (``Analysis.t0_ns``: the axis origin, as every ``start_ms``);
            None: the earliest activity, step or host-lane event given.

    Returns:
        A :class:`TimelineData` to pass to :func:`timeline_figure` (any number of times).
    """
    acts = activities if activities is not None else pd.DataFrame()
    n = len(acts)
    steps = (report or {}).get("steps") or []
    step_rows = [s for s in steps if s.get("gpu_start_ns") is not None and s.get("gpu_end_ns") is not None]
    t0_candidates = []
    if n:
        t0_candidates.append(int(acts["start_ns"].min()))
    if step_rows:
        t0_candidates.append(min(int(s["gpu_start_ns"]) for s in step_rows))
    if host is not None and len(host):
        t0_candidates.append(int(host["start_ns"].min()))
    t0 = int(t0_ns) if t0_ns is not None else min(t0_candidates) if t0_candidates else 0

    rows = ["steps / phases"]
    host_row = None
    if host is not None and len(host):
        host_row = len(rows)
        rows.append("host · markers, calls")
    path_row = None
    if path is not None and len(path):
        path_row = len(rows)
        rows.append("critical path")
    device_gap_rows: dict[int, int] = {}
    empty_i = np.zeros(0, dtype=np.int64)
    if n == 0:
        categories: list[str] = []
        act = dict(row=np.zeros(0, dtype=np.int32), start=empty_i, end=empty_i, cat=np.zeros(0, dtype=np.int16),
                   src=empty_i)
        gaps = dict(row=np.zeros(0, dtype=np.int32), start=empty_i, end=empty_i, cause=np.zeros(0, dtype=np.int16),
                    next=empty_i)
    else:
        dev = acts["device"].to_numpy(dtype=np.int64)
        stream = acts["stream"].to_numpy(dtype=np.int64)
        start = acts["start_ns"].to_numpy(dtype=np.int64) - t0
        end = np.maximum(acts["end_ns"].to_numpy(dtype=np.int64) - t0, start)
        cat_col = acts["category"] if "category" in acts else pd.Series(["other"] * n)
        cat_codes, cat_uniques = pd.factorize(cat_col)  # fast on arrow-backed strings
        categories = [str(c) for c in cat_uniques]

        # Rows: per device its streams (sorted), then the device's idle row.
        smin = int(stream.min())
        kk = int(stream.max()) - smin + 1
        key = dev * kk + (stream - smin)
        ukeys, inv = np.unique(key, return_inverse=True)
        udev = ukeys // kk
        ustream = ukeys % kk + smin
        key_row = np.zeros(len(ukeys), dtype=np.int32)
        for i, (d, st) in enumerate(zip(udev.tolist(), ustream.tolist())):
            if i and udev[i - 1] != d:
                device_gap_rows[int(udev[i - 1])] = len(rows)
                rows.append(f"GPU {int(udev[i - 1])} · idle")
            key_row[i] = len(rows)
            rows.append(f"GPU {d} · stream {st}")
        device_gap_rows[int(udev[-1])] = len(rows)
        rows.append(f"GPU {int(udev[-1])} · idle")
        row = key_row[inv.ravel()]

        order = np.lexsort((start, row))
        act = dict(row=row[order], start=start[order], end=end[order], cat=cat_codes[order].astype(np.int16),
                   src=order)

        gaps = _gap_rows(acts, device_gap_rows, dev, host_index, t0)

    phases, sp, labels = _step_lanes(step_rows)
    return TimelineData(
        t0_ns=t0,
        rows=rows,
        categories=categories,
        act_row=act["row"], act_start=act["start"], act_end=act["end"], act_cat=act["cat"],
        act_src=act["src"],
        names=acts["name"] if n else pd.Series([], dtype=object),
        kinds=acts["kind"] if n and "kind" in acts else pd.Series(["kernel"] * n, dtype=object),
        gap_row=gaps["row"], gap_start=gaps["start"], gap_end=gaps["end"], gap_cause=gaps["cause"],
        gap_next=gaps["next"],
        step_start=np.array([int(s["gpu_start_ns"]) - t0 for s in step_rows], dtype=np.int64),
        step_end=np.array([int(s["gpu_end_ns"]) - t0 for s in step_rows], dtype=np.int64),
        step_phase=np.array(sp, dtype=np.int16),
        step_label=labels,
        phases=phases,
        device_gap_rows=device_gap_rows,
        host_row=host_row,
        host_start=(host["start_ns"].to_numpy(dtype=np.int64) - t0) if host_row is not None else np.zeros(0, dtype=np.int64),
        host_end=(host["end_ns"].to_numpy(dtype=np.int64) - t0) if host_row is not None else np.zeros(0, dtype=np.int64),
        host_kind=host["kind"].to_numpy(dtype=np.int8) if host_row is not None else np.zeros(0, dtype=np.int8),
        host_label=[str(x)[:120] for x in host["name"]] if host_row is not None else [],
        path=path if path_row is not None else None,
        path_row=path_row,
    )


def _gap_rows(acts: pd.DataFrame, device_gap_rows: dict[int, int], dev: np.ndarray, host_index, t0: int) -> dict[str, np.ndarray]:
    """The idle gaps of each device (times from ``t0``), on the device's idle row: row, start,
    end, cause and the activity after each gap: one bar per idle interval, as the report."""
    g_rows, g_s, g_e, g_c, g_next = [], [], [], [], []
    for d, grow in device_gap_rows.items():
        m = np.nonzero(dev == d)[0] if len(device_gap_rows) > 1 else np.arange(len(dev))
        gs, ge, gc, gi = _device_gaps(acts.iloc[m], host_index)
        g_rows.append(np.full(len(gs), grow, dtype=np.int32))
        g_s.append(gs - t0)
        g_e.append(ge - t0)
        g_c.append(gc)
        g_next.append(m[gi])
    return dict(row=np.concatenate(g_rows), start=np.concatenate(g_s), end=np.concatenate(g_e),
                cause=np.concatenate(g_c), next=np.concatenate(g_next))


def _step_lanes(step_rows: list) -> tuple[list[str], list[int], list[str]]:
    """(phases in order of appearance, each step's phase index, each step's hover label)."""
    phases: list[str] = []
    sp = []
    for s in step_rows:
        ph = str(s.get("phase") or "unknown")
        if ph not in phases:
            phases.append(ph)
        sp.append(phases.index(ph))
    labels = [
        f"{s.get('phase')} step {i}: {str(s.get('name'))[:80]}"
        + (f" · batch {s['batch']}" if s.get("batch") is not None else "")
        + (f" · tokens {s['tokens']}" if s.get("tokens") is not None else "")
        for i, s in enumerate(step_rows)
    ]
    return phases, sp, labels


# -- segment helpers -------------------------------------------------------------------


def _segments(x0_ms: np.ndarray, x1_ms: np.ndarray, y: np.ndarray, text: Sequence[str] | None):
    """Interleave segments as x=[a0, b0, nan, a1, b1, nan, ...] (NaN breaks the line)."""
    m = len(x0_ms)
    x = np.empty(3 * m, dtype=np.float64)
    x[0::3], x[1::3], x[2::3] = x0_ms, x1_ms, np.nan
    yy = np.empty(3 * m, dtype=np.float64)
    yy[0::3], yy[1::3], yy[2::3] = y, y, np.nan
    t = None
    if text is not None:
        t = [""] * (3 * m)
        t[0::3] = text
        t[1::3] = text
    return x, yy, t


def _seg_trace(name: str, color: str, x0_ms, x1_ms, y, text, *, width: int = LINE_PX, legendgroup: str | None = None,
               opacity: float = 1.0) -> go.Scatter:
    x, yy, t = _segments(np.asarray(x0_ms, dtype=np.float64), np.asarray(x1_ms, dtype=np.float64), np.asarray(y), text)
    return go.Scatter(
        x=x, y=yy, text=t, mode="lines", name=name, legendgroup=legendgroup or name,
        line=dict(color=color, width=width), opacity=opacity, connectgaps=False,
        hovertemplate="%{text}<extra></extra>", hoverlabel=dict(namelength=0),
        meta={"segments": int(len(x0_ms))},
    )


def _fmt_us(ns: float) -> str:
    us = ns / 1e3
    return f"{us:,.1f} µs" if us < 1e4 else f"{us / 1e3:,.2f} ms"


# -- binning -------------------------------------------------------------------------


def _occupancy(row: np.ndarray, s: np.ndarray, e: np.ndarray, lo: int, hi: int, n_rows: int, n_bins: int):
    """Clip items to [lo, hi], find each item's first bin, and which (row, bin) cells any item
    overlaps. Returns (start_clipped, end_clipped, first_bin, last_bin, bin_width_ns,
    occupied[n_rows, n_bins])."""
    w = (hi - lo) / n_bins
    sc = np.clip(s, lo, hi)
    ec = np.clip(e, lo, hi)
    b0 = np.minimum(((sc - lo) / w).astype(np.int64), n_bins - 1)
    b1 = np.minimum(np.maximum(np.ceil((ec - lo) / w).astype(np.int64) - 1, b0), n_bins - 1)
    width = n_bins + 1
    flat_len = n_rows * width
    diff = np.bincount(row * width + b0, minlength=flat_len) - np.bincount(row * width + b1 + 1, minlength=flat_len)
    occ = np.cumsum(diff.reshape(n_rows, width), axis=1)[:, :n_bins] > 0
    return sc, ec, b0, b1, w, occ


def _bin_blocks(row: np.ndarray, s: np.ndarray, e: np.ndarray, lo: int, hi: int, n_rows: int, n_bins: int):
    """Merge intervals per row into runs of occupied bins.

    ``row`` must be sorted, and ``s`` sorted within each row. Returns (block_row,
    block_start_ns, block_end_ns, block_of_item) where block edges are tightened to the
    items' true extents (clipped to [lo, hi]).
    """
    sc, ec, b0, b1, w, occ = _occupancy(row, s, e, lo, hi, n_rows, n_bins)
    starts = occ & ~np.concatenate([np.zeros((n_rows, 1), dtype=bool), occ[:, :-1]], axis=1)
    block_num = np.cumsum(starts.ravel()) - 1
    item_block = block_num[row * n_bins + b0]
    n_blocks = int(starts.sum())
    # Items are sorted by (row, start), so block ids are non-decreasing: first item per block.
    first = np.nonzero(np.concatenate(([True], item_block[1:] != item_block[:-1])))[0]
    bstart = sc[first]
    bend = np.maximum.reduceat(ec, first)
    brow = row[first]
    assert len(first) == n_blocks, (len(first), n_blocks)
    return brow, bstart, bend, item_block


def _bin_class_runs(row: np.ndarray, s: np.ndarray, e: np.ndarray, cls: np.ndarray, lo: int, hi: int,
                    n_rows: int, n_bins: int, ncls: int):
    """Pixel-bin aggregation with colour: runs of occupied bins with the same dominant class.

    Each bin of a row is occupied when an item overlaps it; its class is the one with the most
    item time among items starting in it (a bin only covered by an item that started earlier
    inherits the previous bin's class). Consecutive occupied bins of the same class form one
    run. Run edges are bin edges, except where a run meets idle time: there the edge is the
    items' true start/end, so isolated activities keep their exact extent.

    Returns:
        (run_row, run_start_ns, run_end_ns, run_cls, run_count, run_busy_ns); at most
        ``n_bins`` runs per row.
    """
    sc, ec, b0, b1, w, occ = _occupancy(row, s, e, lo, hi, n_rows, n_bins)
    fb0 = row * n_bins + b0
    dur = (ec - sc).astype(np.float64)
    wgt = np.bincount(fb0 * ncls + cls, weights=dur + 1e-9, minlength=n_rows * n_bins * ncls).reshape(n_rows, n_bins, ncls)
    has = wgt.sum(axis=2) > 0
    dom = wgt.argmax(axis=2)
    idx = np.where(has, np.arange(n_bins)[None, :], 0)
    idx = np.maximum.accumulate(idx, axis=1)
    dom = np.take_along_axis(dom, idx, axis=1)
    c = np.where(occ, dom, -1).ravel()
    rr = np.repeat(np.arange(n_rows), n_bins)
    change = np.ones(len(c), dtype=bool)
    change[1:] = (c[1:] != c[:-1]) | (rr[1:] != rr[:-1])
    first = np.nonzero(change)[0]
    last = np.append(first[1:], len(c)) - 1
    keep = c[first] >= 0
    first, last = first[keep], last[keep]
    run_row = rr[first]
    edges = lo + w * np.arange(n_bins + 1, dtype=np.float64)
    fbin, lbin = first - run_row * n_bins, last - run_row * n_bins
    rs = edges[fbin]
    re_ = edges[lbin + 1]
    # Tighten edges that touch idle time (or the range ends) to the items' true extents.
    min_start = np.full(n_rows * n_bins, np.inf)
    np.minimum.at(min_start, fb0, sc.astype(np.float64))
    max_end = np.full(n_rows * n_bins, -np.inf)
    np.maximum.at(max_end, row * n_bins + b1, ec.astype(np.float64))
    occ_f = occ.ravel()
    starts_block = (fbin == 0) | ~occ_f[np.maximum(first - 1, 0)]
    ends_block = (lbin == n_bins - 1) | ~occ_f[np.minimum(last + 1, len(occ_f) - 1)]
    ms = min_start[first]
    me = max_end[last]
    rs = np.where(starts_block & np.isfinite(ms), np.maximum(rs, ms), rs)
    re_ = np.where(ends_block & np.isfinite(me), np.minimum(re_, me), re_)
    re_ = np.maximum(re_, rs)
    # Per-run count and busy time of the items starting in it.
    bin_cnt = np.bincount(fb0, minlength=n_rows * n_bins)
    bin_busy = np.bincount(fb0, weights=dur, minlength=n_rows * n_bins)
    csum_c = np.concatenate(([0], np.cumsum(bin_cnt)))
    csum_b = np.concatenate(([0.0], np.cumsum(bin_busy)))
    run_count = csum_c[last + 1] - csum_c[first]
    run_busy = csum_b[last + 1] - csum_b[first]
    return run_row, rs, re_, c[first], run_count, run_busy


def _idle_by_bin(gs: np.ndarray, ge: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Exact idle ns per bin from sorted, disjoint gaps [gs, ge) and bin edges (len n_bins+1)."""
    if len(gs) == 0:
        return np.zeros(len(edges) - 1)
    ln = (ge - gs).astype(np.float64)
    cum = np.concatenate(([0.0], np.cumsum(ln)))
    j = np.searchsorted(ge, edges, side="right")  # gaps entirely before each edge
    partial = np.zeros(len(edges))
    inside = j < len(gs)
    jj = j[inside]
    partial[inside] = np.clip(edges[inside] - gs[jj], 0, ln[jj])
    f = cum[j] + partial
    return np.diff(f)


# -- figure ----------------------------------------------------------------------------


def _empty_figure(message: str, title: str = "GPU timeline") -> go.Figure:
    fig = go.Figure()
    fig.update_layout(
        title=title, height=260, xaxis=dict(visible=False), yaxis=dict(visible=False),
        annotations=[dict(text=message, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                          font=dict(size=14))],
        meta={"mode": "empty", "drawn": 0, "visible_activities": 0, "reason": message},
    )
    return fig


def timeline_figure(
    activities: pd.DataFrame | TimelineData | None,
    report: dict | None = None,
    max_points: int = 20000,
    x_range: Sequence[float] | None = None,
) -> go.Figure:
    """GPU activity per stream with idle gaps and phase bands.

    Args:
        activities: ``Analysis.activities`` or a :class:`TimelineData` from
            :func:`prepare_timeline` (prefer the latter when re-rendering).
        report: the report dict (for step bands); ignored when ``activities`` is prepared.
        max_points: most drawn elements (segments + step markers) in the figure; above it
            the visible activities are merged into pixel-sized busy blocks.
        x_range: visible [start, end] in ms from the trace start (from a zoom); None = whole trace.

    Returns:
        A figure; ``fig.layout.meta`` holds ``mode`` ("detail", "aggregated" or "empty"),
        ``visible_activities``, ``drawn`` (elements drawn), ``n_bins`` and ``t0_ns``.
    """
    td = activities if isinstance(activities, TimelineData) else prepare_timeline(activities, report)
    if td.n_activities == 0:
        return _empty_figure(
            "No GPU activity in this trace (kernels, memcpy, memset): nothing to draw. "
            "Profile with CUDA/ROCm activities enabled (torch.profiler ProfilerActivity.CUDA)."
        )
    max_points = max(int(max_points), 16)
    span = max(td.span_ns, 1)
    if x_range is not None and len(x_range) == 2 and x_range[0] is not None and x_range[1] is not None:
        lo = int(np.floor(float(min(x_range)) * 1e6))
        hi = int(np.ceil(float(max(x_range)) * 1e6))
        if hi <= lo:
            hi = lo + 1
    else:
        lo, hi = 0, span
        x_range = None

    vis = (td.act_start < hi) & (td.act_end > lo) | ((td.act_start == td.act_end) & (td.act_start >= lo) & (td.act_start <= hi))
    gvis = (td.gap_start < hi) & (td.gap_end > lo)
    svis = (td.step_start < hi) & (td.step_end > lo)
    n_vis, n_gvis, n_svis = int(vis.sum()), int(gvis.sum()), int(svis.sum())
    n_rows = len(td.rows)
    traces, shapes, drawn = _step_traces(td, svis, lo, hi, max_points)
    if td.host_row is not None:
        host, n_host = _host_traces(td, lo, hi, max_points)
        traces += host
        drawn += n_host
    if td.path_row is not None:
        from diagnose.app.pathlane import path_traces

        for t in path_traces(td.path, td.path_row, td.t0_ns, lo, hi, max_points // 5, LINE_PX):
            traces.append(t)
            drawn += int(t.meta["segments"])

    budget = max_points - drawn
    ai = np.nonzero(vis)[0]
    gi = np.nonzero(gvis)[0]
    mode = "detail" if n_vis + n_gvis <= budget else "aggregated"
    n_bins = None
    if mode == "detail":
        more, n_more = _detail_traces(td, ai, gi)
        traces += more
        drawn += n_more
    else:
        more, n_more, n_bins = _aggregated_traces(td, ai, gi, lo, hi, budget)
        traces += more
        drawn += n_more

    # Each legend group once.
    seen = set()
    for t in traces:
        t.showlegend = t.legendgroup not in seen
        seen.add(t.legendgroup)

    fig = go.Figure(traces)
    xr = [lo / 1e6, hi / 1e6] if x_range is not None else [0, span / 1e6]
    title = "GPU timeline"
    if mode == "aggregated":
        title += f" — {n_vis:,} activities merged into pixel-sized blocks (zoom in for detail)"
    else:
        title += f" — {n_vis:,} activities"
    fig.update_layout(
        title=dict(text=title, font=dict(size=14), y=0.98, yanchor="top"),
        height=max(300, 170 + ROW_PX * n_rows),
        margin=dict(l=150, r=20, t=90, b=50),
        xaxis=dict(title=TIME_AXIS_TITLE, range=xr, showgrid=True, zeroline=False),
        yaxis=dict(tickvals=list(range(n_rows)), ticktext=td.rows, range=[n_rows - 0.5, -0.5],
                   fixedrange=True, showgrid=False, zeroline=False),
        legend=dict(orientation="h", y=1.0, yanchor="bottom", x=0, font=dict(size=11)),
        shapes=shapes,
        hovermode="closest",
        uirevision="timeline",
        dragmode="zoom",
        plot_bgcolor="white",
        meta={"mode": mode, "visible_activities": n_vis, "visible_gaps": n_gvis, "visible_steps": n_svis,
              "drawn": drawn, "n_bins": n_bins, "t0_ns": td.t0_ns, "max_points": max_points},
    )
    return fig


def _step_traces(td: TimelineData, svis: np.ndarray, lo: int, hi: int, max_points: int) -> tuple[list, list, int]:
    """Row 0: one segment per visible step (merged into blocks above a tenth of the budget),
    step-start markers and shaded step bands when few: (traces, shapes, elements drawn)."""
    traces: list = []
    drawn = 0
    n_svis = int(svis.sum())
    # -- steps / phases (row 0) --------------------------------------------------------
    shapes = []
    step_budget = max_points // 10
    si = np.nonzero(svis)[0]
    if n_svis:
        if n_svis <= step_budget:
            for p, ph in enumerate(td.phases):
                sel = si[td.step_phase[si] == p]
                if len(sel) == 0:
                    continue
                txt = [td.step_label[i] + f"<br>GPU {_fmt_us(td.step_end[i] - td.step_start[i])}" for i in sel]
                traces.append(_seg_trace(f"{ph} step", PHASE_COLORS.get(ph, "#999999"), td.step_start[sel] / 1e6,
                                         td.step_end[sel] / 1e6, np.zeros(len(sel)), txt, width=LINE_PX + 4,
                                         legendgroup="phase:" + ph))
                drawn += len(sel)
            if n_svis <= MAX_STEP_MARKERS and drawn + n_svis <= step_budget:
                traces.append(go.Scatter(
                    x=td.step_start[si] / 1e6, y=np.zeros(n_svis), mode="markers", name="step start",
                    marker=dict(symbol="line-ns-open", size=22, color="#222222", line=dict(width=2)),
                    text=[td.step_label[i] for i in si], hovertemplate="%{text}<extra>step start</extra>",
                    meta={"segments": n_svis},
                ))
                drawn += n_svis
            if n_svis <= MAX_SHADED_STEPS:
                for i in si:
                    ph = td.phases[td.step_phase[i]]
                    shapes.append(dict(type="rect", xref="x", yref="paper", x0=td.step_start[i] / 1e6,
                                       x1=td.step_end[i] / 1e6, y0=0, y1=1, layer="below", line=dict(width=0),
                                       fillcolor=PHASE_COLORS.get(ph, "#999999"), opacity=0.07))
        else:
            n_bins_s = max(1, min(MAX_BINS, step_budget // max(len(td.phases), 1)))
            order = np.lexsort((td.step_start[si], td.step_phase[si]))
            sel = si[order]
            brow, bs, be, item_block = _bin_blocks(td.step_phase[sel].astype(np.int64), td.step_start[sel], td.step_end[sel],
                                                   lo, hi, len(td.phases), n_bins_s)
            counts = np.bincount(item_block, minlength=len(bs))
            for p, ph in enumerate(td.phases):
                m = brow == p
                if not m.any():
                    continue
                txt = [f"{ph}: {c} steps merged" for c in counts[m]]
                traces.append(_seg_trace(f"{ph} steps", PHASE_COLORS.get(ph, "#999999"), bs[m] / 1e6, be[m] / 1e6,
                                         np.zeros(int(m.sum())), txt, width=LINE_PX + 4, legendgroup="phase:" + ph))
                drawn += int(m.sum())

    return traces, shapes, drawn


def _host_traces(td: TimelineData, lo: int, hi: int, max_points: int) -> tuple[list, int]:
    """The host lane: step markers and runtime calls per kind (merged when many)."""
    traces: list = []
    drawn = 0
    # -- host lane: step markers and runtime calls --------------------------------------
    if td.host_row is not None:
        hvis = np.nonzero((td.host_start < hi) & (td.host_end > lo))[0]
        host_budget = max_points // 5
        for k, kname in enumerate(HOST_KINDS):
            sel = hvis[td.host_kind[hvis] == k]
            if len(sel) == 0:
                continue
            if len(sel) <= host_budget // len(HOST_KINDS):
                txt = [f"{td.host_label[i]}<br>{kname} · {_fmt_us(td.host_end[i] - td.host_start[i])}" for i in sel]
                traces.append(_seg_trace(kname, HOST_COLORS[k], td.host_start[sel] / 1e6, td.host_end[sel] / 1e6,
                                         np.full(len(sel), td.host_row), txt, legendgroup="host:" + kname))
                drawn += len(sel)
            else:
                nb = max(1, min(MAX_BINS, host_budget // len(HOST_KINDS)))
                order = np.argsort(td.host_start[sel], kind="stable")
                s_ = sel[order]
                _, bs, be, item_block = _bin_blocks(np.zeros(len(s_), dtype=np.int64), td.host_start[s_], td.host_end[s_],
                                                    lo, hi, 1, nb)
                counts = np.bincount(item_block, minlength=len(bs))
                traces.append(_seg_trace(kname, HOST_COLORS[k], bs / 1e6, be / 1e6, np.full(len(bs), td.host_row),
                                         [f"{c} {kname}s merged" for c in counts], legendgroup="host:" + kname))
                drawn += len(bs)

    return traces, drawn


def _detail_traces(td: TimelineData, ai: np.ndarray, gi: np.ndarray) -> tuple[list, int]:
    """Every visible activity (per category) and gap (per cause, in its colour) as its own segment."""
    traces: list = []
    drawn = 0
    for c, cname in enumerate(td.categories):
        sel = ai[td.act_cat[ai] == c]
        if len(sel) == 0:
            continue
        src = td.act_src[sel]
        txt = [f"{str(nm)[:120]}<br>{cname} · {kd} · {_fmt_us(d)}" for nm, kd, d in
               zip(td.names.iloc[src].tolist(), td.kinds.iloc[src].tolist(),
                   (td.act_end[sel] - td.act_start[sel]).tolist())]
        traces.append(_seg_trace(cname, category_color(cname), td.act_start[sel] / 1e6, td.act_end[sel] / 1e6,
                                 td.act_row[sel], txt, legendgroup="cat:" + cname))
        drawn += len(sel)
    for k, cname in enumerate(GAP_CAUSES):
        sel = gi[td.gap_cause[gi] == k]
        if len(sel) == 0:
            continue
        txt = [f"{cname} gap {_fmt_us(d)}<br>before {str(nx)[:100]}" for nx, d in
               zip(td.names.iloc[td.gap_next[sel]].tolist(), (td.gap_end[sel] - td.gap_start[sel]).tolist())]
        traces.append(_seg_trace(CAUSE_LEGEND[cname], CAUSE_COLORS[cname], td.gap_start[sel] / 1e6,
                                 td.gap_end[sel] / 1e6, td.gap_row[sel], txt, legendgroup="gap:" + cname))
        drawn += len(sel)
    return traces, drawn


def _aggregated_traces(td: TimelineData, ai: np.ndarray, gi: np.ndarray, lo: int, hi: int, budget: int) -> tuple[list, int, int]:
    """Activities merged into pixel-sized blocks coloured by their dominant category, and idle
    runs per gap row coloured by their dominant cause: (traces, elements drawn, bins per row)."""
    traces: list = []
    drawn = 0
    n_rows = len(td.rows)
    n_vis, n_gvis = len(ai), len(gi)
    rows_drawn = n_rows - 1 - (td.host_row is not None) - (td.path_row is not None)
    n_bins = int(max(1, min(MAX_BINS, budget // max(rows_drawn, 1))))
    if n_vis:
        row = td.act_row[ai].astype(np.int64)
        s, e = td.act_start[ai], td.act_end[ai]
        ncat = max(len(td.categories), 1)
        brow, bs, be, dom, cnt, busy = _bin_class_runs(row, s, e, td.act_cat[ai].astype(np.int64), lo, hi,
                                                       n_rows, n_bins, ncat)
        for c, cname in enumerate(td.categories):
            m = dom == c
            if not m.any():
                continue
            txt = [f"{n:,} activities merged · mostly {cname}<br>{_fmt_us(b)} of activity in {_fmt_us(ln)}"
                   for n, b, ln in zip(cnt[m].tolist(), busy[m].tolist(), (be[m] - bs[m]).tolist())]
            traces.append(_seg_trace(cname, category_color(cname), bs[m] / 1e6, be[m] / 1e6, brow[m], txt,
                                     legendgroup="cat:" + cname))
            drawn += int(m.sum())
    if n_gvis:
        t2, d2 = _idle_runs(td, gi, lo, hi, n_bins)
        traces += t2
        drawn += d2
    return traces, drawn, n_bins


def _idle_runs(td: TimelineData, gi: np.ndarray, lo: int, hi: int, n_bins: int) -> tuple[list, int]:
    """Per device idle row: runs of pixel bins with the same dominant gap cause (each bin's
    exact idle ns by cause) and at least ``MIN_IDLE_SHARE`` idle, in that cause's colour."""
    traces: list = []
    drawn = 0
    edges = lo + (hi - lo) * np.arange(n_bins + 1, dtype=np.float64) / n_bins
    binw = (hi - lo) / n_bins
    for grow in sorted(set(td.device_gap_rows.values())):
        g = gi[td.gap_row[gi] == grow]
        if len(g) == 0:
            continue
        present = np.unique(td.gap_cause[g])
        idle = np.zeros((len(present), n_bins))
        for r, k in enumerate(present.tolist()):
            gk = g[td.gap_cause[g] == k]
            idle[r] = _idle_by_bin(td.gap_start[gk].astype(np.float64), td.gap_end[gk].astype(np.float64), edges)
        total = idle.sum(axis=0)
        show = total >= MIN_IDLE_SHARE * binw
        dom = np.where(show, present[np.argmax(idle, axis=0)], -1)  # the dominant cause per bin
        first = np.nonzero(np.concatenate(([True], dom[1:] != dom[:-1])))[0]
        run_c = dom[first]
        run_end = np.append(first[1:], n_bins)
        tot_run = np.add.reduceat(total, first)
        for k in np.unique(run_c[run_c >= 0]).tolist():
            cname = GAP_CAUSES[k]
            m = run_c == k
            x0 = edges[first[m]]
            x1 = edges[run_end[m]]
            dom_run = np.add.reduceat(idle[int(np.flatnonzero(present == k)[0])], first)[m]
            txt = [f"idle {t / l:.0%} of this span ({_fmt_us(t)} in {_fmt_us(l)}), mostly {cname} ({dt / t:.0%})"
                   for t, dt, l in zip(tot_run[m].tolist(), dom_run.tolist(), (x1 - x0).tolist())]
            traces.append(_seg_trace(CAUSE_LEGEND[cname], CAUSE_COLORS[cname], x0 / 1e6, x1 / 1e6,
                                     np.full(int(m.sum()), grow), txt, legendgroup="gap:" + cname))
            drawn += int(m.sum())
    return traces, drawn


def figure_drawn_elements(fig: go.Figure) -> int:
    """Number of drawn elements (segments or markers) over all traces of a timeline figure."""
    total = 0
    for t in fig.data:
        x = np.asarray(t.x, dtype=np.float64) if t.x is not None else np.zeros(0)
        if t.mode == "lines":
            total += int(np.count_nonzero(~np.isnan(x)) // 2)
        else:
            total += int(np.count_nonzero(~np.isnan(x)))
    return total


def parse_relayout(relayout: dict | None) -> tuple[str, list[float] | None]:
    """Read a plotly ``relayoutData`` dict.

    Returns:
        ("zoom", [x0, x1]) for a new x range, ("reset", None) for autorange/double-click,
        ("none", None) when the event does not concern the x axis.
    """
    if not relayout:
        return "none", None
    if relayout.get("xaxis.autorange"):
        return "reset", None
    r0, r1 = relayout.get("xaxis.range[0]"), relayout.get("xaxis.range[1]")
    if r0 is None and isinstance(relayout.get("xaxis.range"), (list, tuple)) and len(relayout["xaxis.range"]) == 2:
        r0, r1 = relayout["xaxis.range"]
    if r0 is not None and r1 is not None:
        try:
            return "zoom", [float(r0), float(r1)]
        except (TypeError, ValueError):
            return "none", None
    return "none", None
