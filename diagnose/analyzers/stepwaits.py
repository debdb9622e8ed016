"""The waits of each step (the step time model of :mod:`diagnose.analyzers.waits`): what lies
between its anchor and its first GPU activity, the idle gaps inside its GPU span, its own
time and its idle time by cause."""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from diagnose.analyzers.gapcause import CAUSE_ID, N_CAUSES, DeviceActs, Gaps, explain_gaps
from diagnose.analyzers.gapview import describe
from diagnose.analyzers.hostcause import HostCauses
from diagnose.analyzers.timeline import MIN_GAP_NS, union_busy_ns
from diagnose.trace.model import NO_TIME, Trace
from diagnose.vocab import EXTERNAL_CAUSES, GAP_CAUSES

STEP_WAIT_MIN_NS = 50_000  # as waits.STEP_WAIT_MIN_NS (kept here to avoid an import cycle)
LISTED = 5  # inside waits listed per step
_EXTERNAL = np.array([c in EXTERNAL_CAUSES for c in GAP_CAUSES], dtype=bool)


def before_stretches(d: DeviceActs, steps: pd.DataFrame) -> dict[str, Any]:
    """Per step with work on ``d``: the idle stretches between the step's anchor and its first
    GPU activity (each >= :data:`STEP_WAIT_MIN_NS`, with the activity after it), and the GPU
    time spent on earlier work there (``pipelined``). Arrays: step, p0, p1, k; and per step
    ``pipelined`` {step: (start, ns)}."""
    out: dict[str, Any] = {"step": [], "p0": [], "p1": [], "k": [], "pipelined": {}}
    if not len(steps) or not len(d.start):
        return _arrays(out)
    anchors = steps["anchor_ns"].to_numpy(dtype=np.int64) if "anchor_ns" in steps else steps["start_ns"].to_numpy(dtype=np.int64)
    marked = anchored(steps)
    s, e, le, stp = d.start, d.end, d.launch_end, d.step
    cm = np.maximum.accumulate(e)
    by_step = np.argsort(stp, kind="stable")
    sorted_steps = stp[by_step]
    for i in np.unique(stp[stp >= 0]).tolist():
        lo, hi = np.searchsorted(sorted_steps, [i, i + 1])
        own = by_step[lo:hi]
        first = int(own[0])
        gs0, anchor = int(s[own].min()), int(anchors[i])
        if gs0 - anchor < MIN_GAP_NS or not marked[i]:
            continue
        k0 = int(np.searchsorted(cm, anchor, side="right"))  # first activity still running at the anchor
        merged: list[list[int]] = []
        pipelined, first_p = 0, None
        for k in range(k0, first):
            if s[k] >= gs0:
                continue
            a, b = max(int(s[k]), anchor), min(int(e[k]), gs0)
            if b <= a:
                continue
            if (stp[k] >= 0 and stp[k] != i) or le[k] == NO_TIME or le[k] < anchor:  # earlier work
                pipelined += b - a
                first_p = a if first_p is None else min(first_p, a)
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        if pipelined >= STEP_WAIT_MIN_NS:
            out["pipelined"][i] = (first_p, pipelined)
        cur = anchor
        for a, b in sorted(merged) + [[gs0, gs0]]:
            if a - cur >= STEP_WAIT_MIN_NS:
                out["step"].append(i)
                out["p0"].append(cur)
                out["p1"].append(a)
                out["k"].append(min(int(np.searchsorted(s, a, side="left")), len(s) - 1))
            cur = max(cur, b)
    return _arrays(out)


def anchored(steps: pd.DataFrame) -> np.ndarray:
    """Per step: its anchor is a host range's (a marker, a ProfilerStep, an engine frame), not
    the whole trace taken as one step nor a step the GPU structure alone found: the lead-in
    before their first kernel is no step's wait."""
    if not len(steps):
        return np.zeros(0, dtype=bool)
    if "evidence" in steps:
        return steps["evidence"].isin(("marker", "profiler_step", "python_frame")).to_numpy()
    whole = (steps["grammar"].to_numpy(dtype=object) == "shapes") & (steps["name"].to_numpy(dtype=object) == "trace")
    return ~whole


def _arrays(out: dict[str, Any]) -> dict[str, Any]:
    for k in ("step", "p0", "p1", "k"):
        out[k] = np.asarray(out[k], dtype=np.int64)
    return out


def _explain_stretches(d: DeviceActs, st: dict[str, Any], host: HostCauses) -> Gaps:
    """Causes of the stretches before the steps' spans, each like a gap before its next
    activity; queued ones (``dependency``, ``switch``) are ``outside_trace``: the device was
    idle until the step's span, so what the work waited for is not on its timeline."""
    g = explain_gaps(d, st["p0"], st["p1"], st["k"], np.full(len(st["k"]), -1, dtype=np.int64), host)
    q = np.isin(g.cause, (CAUSE_ID["dependency"], CAUSE_ID["switch"]))
    if q.any():
        g.cause[q] = CAUSE_ID["outside_trace"]
        for c in ("dependency", "switch"):
            g.parts[q, CAUSE_ID["outside_trace"]] += g.parts[q, CAUSE_ID[c]]
            g.parts[q, CAUSE_ID[c]] = 0.0
    return g


def assemble_steps(steps: pd.DataFrame, gaps: dict[int, tuple[DeviceActs, Gaps]], stretches: dict[int, dict],
                   host: HostCauses, trace: Trace, t0: int) -> pd.DataFrame:
    """Add gpu_span_ms, gpu_busy_ms, own_ns, waits, idle_by_cause_ms and graph_step to ``steps``."""
    n = len(steps)
    span_ms = np.full(n, np.nan)
    busy_ms = np.full(n, np.nan)
    own_ns = (steps["end_ns"].to_numpy(dtype=np.int64) - steps["start_ns"].to_numpy(dtype=np.int64)) if n else np.zeros(0, np.int64)
    waits: list[list[dict]] = [[] for _ in range(n)]
    by_cause: list[dict] = [{} for _ in range(n)]
    for dev, (d, g) in gaps.items():
        st = stretches.get(dev)
        sg = _explain_stretches(d, st, host) if st is not None and len(st["k"]) else None
        listed: list[tuple[int, str, int, dict]] = []  # (gap index, "inside"/"before", step, wait)
        dur = (g.end - g.start).astype(np.float64)
        gcause = g.cause.astype(np.int64)
        by_step = np.argsort(d.step, kind="stable")
        sorted_steps = d.step[by_step]
        for i in np.unique(d.step[d.step >= 0]).tolist():
            lo_s, hi_s = np.searchsorted(sorted_steps, [i, i + 1])
            own = by_step[lo_s:hi_s]
            gs0, ge0 = int(d.start[own].min()), int(d.end[own].max())
            span_ms[i] = (ge0 - gs0) / 1e6
            busy_ms[i] = union_busy_ns(d.start[own], d.end[own]) / 1e6
            lo = int(np.searchsorted(g.start, gs0, side="left"))
            hi = int(np.searchsorted(g.end, ge0, side="right"))
            hi = max(hi, lo)
            inside = np.bincount(gcause[lo:hi], weights=dur[lo:hi], minlength=N_CAUSES)  # gap time by cause (exact: integer ns)
            c = inside.copy()
            w: list[dict] = []
            pipe = st["pipelined"].get(i) if st is not None else None
            if pipe is not None:
                w.append({"where": "before", "start_ms": round((pipe[0] - t0) / 1e6, 6), "ms": round(pipe[1] / 1e6, 6),
                          "cause": "pipelined", "host_call": None, "host_stack": [], "waited_on": None,
                          "parts_ms": {"pipelined": round(pipe[1] / 1e6, 6)}})
                c[CAUSE_ID["pipelined"]] += pipe[1]
            before_internal = 0
            if sg is not None:
                for j in np.flatnonzero(st["step"] == i).tolist():
                    ci, ns = int(sg.cause[j]), int(sg.end[j] - sg.start[j])
                    c[ci] += ns
                    before_internal += 0 if _EXTERNAL[ci] else ns
                    wait = {"where": "before", "start_ms": round((int(sg.start[j]) - t0) / 1e6, 6),
                            "ms": round(ns / 1e6, 6), "cause": GAP_CAUSES[ci]}
                    w.append(wait)
                    listed.append((j, "before", i, wait))
            own_ns[i] = (ge0 - gs0) - int(inside[_EXTERNAL].sum()) + before_internal
            dd = dur[lo:hi]
            big = np.flatnonzero(dd >= max(STEP_WAIT_MIN_NS, 0.01 * (ge0 - gs0)))
            for j in big[np.argsort(-dd[big], kind="stable")][:LISTED].tolist():
                wait = {"where": "inside", "start_ms": round((int(g.start[lo + j]) - t0) / 1e6, 6),
                        "ms": round(float(dd[j]) / 1e6, 6), "cause": GAP_CAUSES[int(g.cause[lo + j])]}
                w.append(wait)
                listed.append((lo + j, "inside", i, wait))
            waits[i] = w
            by_cause[i] = {GAP_CAUSES[k]: round(float(c[k]) / 1e6, 6) for k in range(N_CAUSES) if c[k] > 0}
        for where, src in (("inside", g), ("before", sg)):
            sel = [(j, wait) for j, wh, _, wait in listed if wh == where]
            if src is None or not sel:
                continue
            for (j, wait), info in zip(sel, describe(src, d, host, trace, np.array([j for j, _ in sel], dtype=np.int64))):
                wait.update(info)
    steps["gpu_span_ms"] = span_ms
    steps["gpu_busy_ms"] = busy_ms
    steps["own_ns"] = own_ns
    steps["waits"] = pd.Series(waits, index=steps.index, dtype=object) if n else pd.Series([], dtype=object)
    steps["idle_by_cause_ms"] = pd.Series(by_cause, index=steps.index, dtype=object) if n else pd.Series([], dtype=object)
    steps["graph_step"] = _graph_steps(steps, gaps)
    return steps


def _graph_steps(steps: pd.DataFrame, gaps: dict[int, tuple[DeviceActs, Gaps]]) -> np.ndarray:
    """Per step: some of its GPU work was replayed from a graph launch."""
    out = np.zeros(len(steps), dtype=bool)
    for d, _ in gaps.values():
        m = (d.step >= 0) & (d.graph_followup | d.graph_launched)
        out[np.unique(d.step[m])] = True
    return out
