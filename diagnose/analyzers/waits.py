"""Why the GPU waited: one row per idle gap with its cause, and the step time model.

**Gaps and causes.** Every idle gap of a device is one row (:mod:`diagnose.analyzers.gapcause`):
its pieces are attributed (the host part to what the host was doing,
:mod:`diagnose.analyzers.hostcause`; the queue part to what the queued work waited for), its
cause is the piece holding the most time. The causes, whether each is the step's own cost,
their colours and levers are the cause table (``diagnose/data/causes.yaml``). A listed gap
carries ``host_call`` (the event that named its cause; for a queued gap, a runtime call the
launching thread sat in for most of it), ``host_stack`` (the chain of host events,
outermost first, at the middle of the host part), ``waited_on`` (for queued gaps: the GPU-side
wait or the last stream/event wait before the launch) and ``parts_ms`` (every piece).

**Step time model.** A step is the innermost step marker. Its *GPU span* runs from the first
to the last GPU activity launched from it; ``gpu_busy_ms`` is the union of those
activities. Its waits are the intervals before the span (from the step's anchor, see
:func:`diagnose.analyzers.phases.find_steps`) and the idle gaps inside it, each with a cause;
before the span, GPU work of the trace that is not the step's is ``pipelined`` (the previous
step still running: healthy), and an idle stretch whose work was queued in time is
``outside_trace`` (the GPU was busy with, or waiting for, work the trace does not hold).
``own_ms`` = span minus the idle gaps inside it whose cause is external, plus the waits
before the span whose cause is internal (the step's own host work before its first kernel:
a torch.compile guard, CPU work, launches): the base of the TTFT proxy, TPOT of a single
step, MFU/MBU, the bound ratio and every stake. A step that launched no GPU work costs its
CPU range (CPU-only runs).
"""
from __future__ import annotations

import msgspec
import numpy as np
import pandas as pd

from diagnose.analyzers.base import declared
from diagnose.analyzers.gapcause import (
    CAUSE_ID,
    N_CAUSES,
    DeviceActs,
    Gaps,
    empty_gaps,
    explain_gaps,
    gap_bounds,
    host_need,
    kinds_from_causes,
)
from diagnose.analyzers.gapview import STACK_MAX, cause_frames, describe, short_frame, shorten_stack
from diagnose.analyzers.hostcause import HostCauses, merge_intervals
from diagnose.analyzers.timeline import MIN_GAP_NS, GapStats, union_busy_ns
from diagnose.model import Gap
from diagnose.trace.model import Trace
from diagnose.vocab import EXTERNAL_CAUSES, GAP_CAUSES, GAP_KINDS

FINDINGS = declared("waits")

#: Longest gaps described per phase in the report.
LONGEST_GAPS = 5
#: Waits shorter than this are summed by cause but not listed, and before a step's span not counted.
STEP_WAIT_MIN_NS = 50_000

_EXTERNAL = np.array([c in EXTERNAL_CAUSES for c in GAP_CAUSES], dtype=bool)
_QUEUED = (CAUSE_ID["dependency"], CAUSE_ID["switch"])


def device_gaps(d: DeviceActs, host: HostCauses | None, outside: tuple[np.ndarray, np.ndarray] | None = None) -> Gaps:
    """Every idle gap of one device's activities ``d`` with its cause (``outside``: the steps'
    ``outside_trace`` waits, :func:`outside_waits_ns`: a queued gap mostly inside one is
    ``outside_trace`` here too)."""
    gs, ge, nxt, prv = gap_bounds(d)
    g = explain_gaps(d, gs, ge, nxt, prv, host)
    if outside is not None and len(outside[0]) and len(g):
        relabel_outside(g, *outside)
    return g


def caused_gaps(acts: pd.DataFrame, host: HostCauses | None, outside: tuple[np.ndarray, np.ndarray] | None = None,
                pre: tuple[DeviceActs, Gaps] | None = None) -> tuple[GapStats, Gaps, DeviceActs]:
    """The gaps of one device's activities ``acts`` (any order) with their causes, and the
    timeline's gap statistics (window, busy, gap time and count per kind, launch gaps).
    ``pre``: the same activities as a :class:`DeviceActs` and their gaps already explained
    (:attr:`StepWaits.devices`), or None for the gaps (:attr:`StepWaits.phase_acts`).

    Returns:
        (stats, gaps, the activities sorted as the gaps index them).
    """
    if pre is not None and pre[1] is not None:
        d, g = pre[0], pre[1].copy()
        if outside is not None and len(outside[0]) and len(g):
            relabel_outside(g, *outside)
    elif pre is not None:
        d = pre[0]
        g = device_gaps(d, host, outside)
    else:
        d = DeviceActs.of(acts)
        g = device_gaps(d, host, outside)
    return gap_stats(d, g), g, d


def gap_stats(d: DeviceActs, g: Gaps) -> GapStats:
    """Window, busy time and gap statistics of ``d`` whose gaps are ``g`` (one per idle gap;
    kinds as :func:`~diagnose.analyzers.gapcause.kinds_from_causes`)."""
    st = GapStats()
    if len(d.start) == 0:
        return st
    st.window_ns = int(d.end.max() - d.start[0])
    st.busy_ns = union_busy_ns(d.start, d.end)
    kind = kinds_from_causes(g)
    ns = g.end - g.start
    for i, k in enumerate(GAP_KINDS):
        m = kind == i
        st.gap_ns_by_kind[k] = int(ns[m].sum())
        st.gap_count_by_kind[k] = int(m.sum())
    st.launch_gaps_ns = ns[kind == GAP_KINDS.index("launch")]
    st.all_gaps_ns = ns
    st.gap_start, st.gap_end, st.gap_kind, st.gap_next = g.start, g.end, kind, g.next_idx
    return st


def relabel_outside(g: Gaps, os_: np.ndarray, oe: np.ndarray) -> None:
    """In place: a queued gap (``dependency``/``switch``) at least half inside one of the
    intervals [os_, oe) (a step's ``outside_trace`` wait) becomes ``outside_trace`` (its queued
    pieces too)."""
    queued = np.isin(g.cause, _QUEUED)
    if not queued.any():
        return
    k = np.searchsorted(os_, g.end, side="right") - 1
    ok = k >= 0
    kk = np.where(ok, k, 0)
    cov = np.where(ok, np.minimum(oe[kk], g.end) - np.maximum(os_[kk], g.start), 0)
    m = queued & (cov * 2 >= (g.end - g.start))
    if m.any():
        g.cause[m] = CAUSE_ID["outside_trace"]
        for c in _QUEUED:
            g.parts[m, CAUSE_ID["outside_trace"]] += g.parts[m, c]
            g.parts[m, c] = 0.0


def idle_by_cause_ms(g: Gaps) -> dict[str, float]:
    """Idle ms per cause, each gap wholly to its cause (only causes with time), in table order."""
    if len(g.start) == 0:
        return {}
    tot = np.bincount(g.cause.astype(np.int64), weights=(g.end - g.start).astype(np.float64), minlength=N_CAUSES)
    return {c: round(float(tot[i]) / 1e6, 6) for i, c in enumerate(GAP_CAUSES) if tot[i] > 0}


def longest(g: Gaps, d: DeviceActs, host: HostCauses | None, trace: Trace | None, t0_ns: int, n: int = LONGEST_GAPS) -> list[Gap]:
    """The ``n`` longest gaps (start_ms from the trace start), one row per gap, with cause,
    its pieces, host_call, host_stack, waited_on and the next activity."""
    if len(g.start) == 0:
        return []
    dur = g.end - g.start
    top = np.argsort(-dur, kind="stable")[:n]
    kinds = kinds_from_causes(g)
    out = []
    for j, info in zip(top.tolist(), describe(g, d, host, trace, top)):
        out.append(Gap(start_ms=round((int(g.start[j]) - t0_ns) / 1e6, 6), duration_ms=round(float(dur[j]) / 1e6, 6),
                       kind=GAP_KINDS[int(kinds[j])], cause=GAP_CAUSES[int(g.cause[j])], host_call=info["host_call"],
                       host_stack=info["host_stack"], waited_on=info["waited_on"], parts_ms=info["parts_ms"],
                       next=str(d.names[g.next_idx[j]])[:120]))
    return out


def trace_t0(trace: Trace) -> int:
    """The trace start (ns): the earliest event, the origin of ``--window`` and every ``start_ms``."""
    from diagnose.trace.slice import trace_start_ns

    t0 = trace_start_ns(trace)
    return 0 if t0 is None else int(t0)


def outside_waits_ns(steps: pd.DataFrame, t0: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (start_ns, end_ns) of the steps' ``outside_trace`` waits (absolute ns)."""
    iv = sorted((t0 + round(w["start_ms"] * 1e6), t0 + round((w["start_ms"] + w["ms"]) * 1e6))
                for ws in (steps["waits"] if "waits" in steps else ()) if isinstance(ws, list)
                for w in ws if w.get("cause") == "outside_trace")
    return (np.array([a for a, _ in iv], dtype=np.int64), np.array([b for _, b in iv], dtype=np.int64))


class StepWaits(msgspec.Struct, frozen=True):
    """The step table with each step's span, busy and own time, waits and idle by cause
    (columns gpu_span_ms, gpu_busy_ms, own_ns, waits, idle_by_cause_ms, graph_step), the host
    causes the gaps were read from, each device's activities and gaps, and the trace start
    every ``start_ms`` counts from."""

    steps: pd.DataFrame
    host: HostCauses
    t0_ns: int
    devices: dict[int, tuple[DeviceActs, Gaps]]
    phase_acts: dict[tuple[int, str], DeviceActs]


def step_waits(trace: Trace, activities: pd.DataFrame, steps: pd.DataFrame, containers: pd.DataFrame | None) -> StepWaits:
    """Per step: gpu_span_ms, gpu_busy_ms, own_ms (own_ns), waits and idle_by_cause_ms (module
    docstring); builds the host causes once for every gap the report describes."""
    from diagnose.analyzers.stepwaits import assemble_steps, before_stretches

    t0 = trace_t0(trace)
    devs = {int(dev): DeviceActs.of(sub) for dev, sub in activities.groupby("device", sort=True)} if len(activities) else {}
    stretches = {dev: before_stretches(d, steps) for dev, d in devs.items()}
    phase_acts = phase_subsets(devs)
    need = _need(devs, phase_acts, stretches)
    host = HostCauses.build(trace, activities, steps, need)
    gaps = {dev: (d, device_gaps(d, host)) for dev, d in devs.items()}
    steps = assemble_steps(steps.copy(), gaps, stretches, host, trace, t0)
    return StepWaits(steps, host, t0, gaps, phase_acts)


def phase_subsets(devs: dict[int, DeviceActs]) -> dict[tuple[int, str], DeviceActs]:
    """Each device's activities of each phase (when the device holds more than one)."""
    out = {}
    for dev, d in devs.items():
        phases = pd.unique(d.phase)
        if len(phases) > 1:
            for ph in phases:
                out[(dev, str(ph))] = d.subset(d.phase == ph)
    return out


def _need(devs: dict[int, DeviceActs], phase_acts: dict, stretches: dict) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per launching thread, the host time any gap of the report may be explained from: the
    gaps of each device, of each phase on it, and the stretches before each step's span."""
    tids, a, b = [], [], []

    def add(d: DeviceActs, gs, ge, nxt) -> None:
        t, x, y = host_need(d, gs, ge, nxt)
        tids.append(t)
        a.append(x)
        b.append(y)

    for dev, d in devs.items():
        gs, ge, nxt, _ = gap_bounds(d)
        add(d, gs, ge, nxt)
        st = stretches.get(dev)
        if st is not None and len(st["k"]):
            add(d, st["p0"], st["p1"], st["k"])
    for (_dev, _ph), d in phase_acts.items():
        gs, ge, nxt, _ = gap_bounds(d)
        add(d, gs, ge, nxt)
    if not tids:
        return {}
    t, x, y = np.concatenate(tids), np.concatenate(a), np.concatenate(b)
    out = {}
    for tid in np.unique(t[t >= 0]):
        m = t == tid
        out[int(tid)] = merge_intervals(x[m], np.maximum(y[m], x[m] + 1))
    return out


__all__ = ["LONGEST_GAPS", "MIN_GAP_NS", "STACK_MAX", "STEP_WAIT_MIN_NS", "StepWaits", "caused_gaps", "cause_frames", "describe",
           "device_gaps", "empty_gaps", "gap_stats", "idle_by_cause_ms", "longest", "outside_waits_ns", "relabel_outside",
           "short_frame", "shorten_stack", "step_waits", "trace_t0"]
