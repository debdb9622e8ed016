"""Post-load normalization shared by every loader (Kineto, nsys): one place where suspect
timestamps are excluded or clipped, each reported in ``trace.quality``.

* **Outside the trace window** — an activity more than 24 h from the median GPU start (e.g.
  a kernel with ``ts`` 0 in an epoch-based trace) is excluded, so the window is not 50 years
  long (code ``outside_trace_window``).
* **Deferred completion** — an activity whose end runs more than 1 ms past the start of the
  next activity on its stream (a stream is one process's: (pid, device, stream), so two
  processes sharing a GPU through MPS never clip each other) (a completion timestamp recorded late) is clipped to that start;
  the time removed is reported (``deferred_completion_clipped``). Smaller overlaps on one
  stream are real (programmatic dependent launch, PDL): kept, counted (``same_stream_overlap``),
  and busy time stays a union.
* **Exact duplicates** — a GPU record that repeats another in every column (activity buffers
  read twice) is dropped and counted (``duplicate_records``).
"""
from __future__ import annotations

import numpy as np

from diagnose.trace.model import FRAMES, Trace, as_categorical

OUTLIER_NS = 24 * 3600 * 10**9
CLIP_OVERLAP_NS = 1_000_000


def normalize(trace: Trace) -> Trace:
    """Apply the rules above to ``trace`` in place and return it; every name column leaves as
    a categorical in first-seen order (:func:`~diagnose.trace.model.as_categorical`), whatever
    rows were excluded or re-sorted."""
    _clip(trace)
    for attr in FRAMES:
        f = getattr(trace, attr)
        if "name" in f.columns and len(f):
            cat = as_categorical(f["name"])
            if cat is not f["name"].array:
                f["name"] = cat
    return trace


def _clip(trace: Trace) -> None:
    g = trace.gpu
    if len(g) == 0:
        return
    med = int(np.median(g["start_ns"].to_numpy()))
    for attr in ("gpu", "runtime", "annotations", "gpu_syncs", "overhead", "python_frames"):
        f = getattr(trace, attr)
        if len(f) == 0:
            continue
        far = (f["start_ns"] - med).abs().to_numpy() > OUTLIER_NS
        if far.any():
            n = int(far.sum())
            setattr(trace, attr, f[~far].reset_index(drop=True))
            trace.note("outside_trace_window", f"{n} event(s) more than 24 h away from the trace's other GPU activity (e.g. ts 0) were excluded", n)
    # a stream is (process, device, stream): co-located processes each have their own stream 7
    keys = [c for c in ("rank", "pid") if c in trace.gpu.columns] + ["device", "stream"]
    g = trace.gpu.sort_values(keys + ["start_ns", "end_ns"], kind="stable")
    same = _same_stream(g, keys)
    g, same = _drop_exact_duplicates(trace, g, same)
    start = g["start_ns"].to_numpy()
    end = g["end_ns"].to_numpy().copy()
    overlap = np.zeros(len(g), dtype=np.int64)
    overlap[:-1] = np.where(same, end[:-1] - start[1:], 0)
    big = overlap > CLIP_OVERLAP_NS
    small = (overlap > 0) & ~big
    if big.any():
        removed = int(overlap[big].sum())
        end[:-1][big[:-1]] = np.maximum(start[:-1][big[:-1]], start[1:][big[:-1]])
        g = g.assign(end_ns=end)
        trace.note("deferred_completion_clipped",
                   f"{int(big.sum())} activit(y/ies) ended more than 1 ms after the next one on their stream started (late completion timestamp): clipped, {removed / 1e6:.3f} ms removed",
                   int(big.sum()))
    if small.any():
        trace.note("same_stream_overlap",
                   f"{int(small.sum())} activit(y/ies) overlap the next one on their stream by up to 1 ms (programmatic dependent launch): kept; busy time counts the union",
                   int(small.sum()))
    trace.gpu = g.sort_values(["device", "start_ns", "end_ns"], kind="stable").reset_index(drop=True)


def _same_stream(g, keys: list[str]) -> np.ndarray:
    """For each row of ``g`` but the first: whether it is on the previous row's stream."""
    same = np.ones(max(len(g) - 1, 0), dtype=bool)
    for c in keys:
        v = g[c].to_numpy()
        same &= v[1:] == v[:-1]
    return same


def _drop_exact_duplicates(trace: Trace, g, same: np.ndarray):
    """Drop GPU records that repeat another one exactly (every column: name, stream, start,
    end, correlation...): a profiler that re-reads its activity buffers writes each record
    twice (CUPTI per-thread buffers, Fuser#5402), which would double kernel time and count
    and show as same-stream overlap. ``g`` is sorted by stream, start and end, so a repeat
    sits in a run of rows with the same stream, start and end; only such runs are compared
    column by column. Reported as ``duplicate_records``. Returns (g, same) without them."""
    if len(g) < 2:
        return g, same
    st, en = g["start_ns"].to_numpy(), g["end_ns"].to_numpy()
    cand = same & (st[1:] == st[:-1]) & (en[1:] == en[:-1])
    if not cand.any():
        return g, same
    rows = np.zeros(len(g), dtype=bool)
    rows[1:] |= cand
    rows[:-1] |= cand
    sub = g[rows]
    dup = np.zeros(len(g), dtype=bool)
    dup[np.nonzero(rows)[0]] = sub.duplicated(keep="first").to_numpy()
    if not dup.any():
        return g, same
    n = int(dup.sum())
    trace.note("duplicate_records", f"{n} GPU record(s) repeat another record exactly (same name, stream, start, end and "
               "ids: activity buffers read twice): counted once", n)
    g = g[~dup]
    return g, _same_stream(g, [c for c in ("rank", "pid") if c in g.columns] + ["device", "stream"])

