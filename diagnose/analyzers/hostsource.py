"""The host events the host-cause classifier reads, per thread, restricted to given intervals
(:mod:`diagnose.analyzers.hostcause`): python frames, CPU operators, CPU-side user ranges,
runtime/driver calls and OS runtime calls, with their kind and their row in the trace frame they
come from.

Names stay where they are until an event is selected (nsys exports hold millions of NVTX ranges
as a categorical column): only the rows of one thread that overlap the intervals are read.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from diagnose.trace.model import Trace

KINDS = ("frame", "op", "range", "runtime", "os")


def overlaps(s: np.ndarray, e: np.ndarray, ua: np.ndarray, ub: np.ndarray) -> np.ndarray:
    """Events [s, e) that overlap the union of disjoint sorted intervals [ua, ub)."""
    if len(ua) == 0:
        return np.zeros(len(s), dtype=bool)
    j = np.searchsorted(ua, s, side="right") - 1  # the interval starting last at or before s
    inside = (j >= 0) & (s < ub[np.maximum(j, 0)])
    k = j + 1  # the next interval start after s: covered when the event runs past it
    covers = (k < len(ua)) & (ua[np.minimum(k, len(ua) - 1)] < e)
    return inside | covers


def _names(col: pd.Series) -> Any:
    """A name column as (codes, values) when categorical, else the object array."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        # a missing name (code -1) reads the "" appended after the categories
        return (np.asarray(col.cat.codes, dtype=np.int64), np.append(np.asarray(col.cat.categories, dtype=object), ""))
    return col.to_numpy(dtype=object)


def host_sources(trace: Trace) -> list[dict[str, Any]]:
    """Per host frame: kind code, tid, start, end, names (see :func:`_names`), and each row's
    position in its trace frame (OS runtime calls of an nsys export are the runtime frame's
    rows of api_kind "os")."""
    out = []
    ann = trace.annotations
    cpu_ann = ann[(ann["scope"] == "cpu").to_numpy()] if len(ann) else ann
    rt = trace.runtime
    os_ = rt["api_kind"].isin(("os",)).to_numpy() if len(rt) else np.zeros(0, dtype=bool)
    for kind, f, rows in (("frame", trace.python_frames, None), ("op", trace.cpu_ops, None),
                          ("range", cpu_ann, np.flatnonzero((ann["scope"] == "cpu").to_numpy()) if len(ann) else None),
                          ("runtime", rt[~os_] if os_.any() else rt, np.flatnonzero(~os_) if os_.any() else None),
                          ("os", rt[os_] if os_.any() else None, np.flatnonzero(os_))):
        if f is None or not len(f):
            continue
        s, e = f["start_ns"].to_numpy(dtype=np.int64), f["end_ns"].to_numpy(dtype=np.int64)
        out.append({"kind": KINDS.index(kind), "tid": f["tid"].to_numpy(dtype=np.int64), "start": s, "end": e,
                    "names": _names(f["name"]), "rows": np.arange(len(f)) if rows is None else rows})
    return out


def thread_events(sources: list[dict[str, Any]], tid: int, ua: np.ndarray, ub: np.ndarray) -> dict[str, np.ndarray]:
    """Host events of thread ``tid`` overlapping the union of the sorted, disjoint intervals
    [ua, ub): start, end, kind (index into :data:`KINDS`), name, src (row in its frame)."""
    parts = []
    for src in sources:
        m = src["tid"] == tid
        if not m.any():
            continue
        idx = np.flatnonzero(m)
        s, e = src["start"][idx], src["end"][idx]
        keep = (e > s) & overlaps(s, e, ua, ub)
        idx, s, e = idx[keep], s[keep], e[keep]
        nm = src["names"]
        names = nm[1][nm[0][idx]] if isinstance(nm, tuple) else nm[idx]
        parts.append((s, e, np.full(len(idx), src["kind"], dtype=np.int64), names, src["rows"][idx]))
    if not parts:
        z = np.zeros(0, dtype=np.int64)
        return {"start": z, "end": z, "kind": z, "name": np.zeros(0, dtype=object), "src": z}
    return {"start": np.concatenate([p[0] for p in parts]), "end": np.concatenate([p[1] for p in parts]),
            "kind": np.concatenate([p[2] for p in parts]), "name": np.concatenate([p[3] for p in parts]).astype(object),
            "src": np.concatenate([p[4] for p in parts])}
