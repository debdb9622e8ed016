"""Why the GPU waited: the cause of every idle gap, and the step time model.

**Gap causes** (:data:`diagnose.vocab.GAP_CAUSES`). For an idle gap on a device, before the
next activity *n*, the host thread that launched *n* tells what the GPU waited for:

1. a profiler ``overhead`` event covering at least half of the gap: ``profiler_overhead``
   ("Activity Buffer Request") or ``cold_start`` ("Lazy Function Loading");
2. a runtime/driver call on that thread covering at least half of the gap: ``cold_start`` for
   module loading and runtime compilation (cuModuleLoad*, cuLibraryLoad*, NVRTC),
   ``host_blocked`` for blocking calls (synchronize, event/stream waits, synchronous copies);
3. a compile range (torch.compile, Inductor, Triton autotuning) covering half the gap: ``cold_start``;
4. otherwise the gap's kind (:mod:`diagnose.analyzers.timeline`): ``launch`` (the launch call
   ended after the GPU went idle: the host was late), ``graph`` (inside one graph replay),
   ``dependency`` (launched in time, it waited on another stream, an event or a copy),
   ``not_in_trace`` (no launch call in the trace), ``unknown`` (a launch call, but its time
   is unusable: clock skew); a queued gap shorter than
   :data:`SWITCH_MAX_NS` is ``switch`` (the GPU starting the next queued kernel).

Steps 1-3 apply only to host activity that began before the next activity's launch call
returned: once *n* is queued, what the host does next cannot delay it. A host blocked in a
copy *behind* a queued kernel (SGLang's overlap scheduler: ``hipStreamWaitEvent``, launch,
then a 60-byte ``hipMemcpyWithStream`` that waits 493 ms) is a consequence of the GPU-side
wait, not its cause; the gap stays ``dependency``, and ``host_call`` names the stream/event
wait the launching thread issued before the launch.

The name patterns are data (``diagnose/data/host_calls.yaml``). For the longest gaps the
report also names ``host_call``: the covering call or event, else for a launch gap the
innermost CPU op or user range the launching thread was in (e.g. "Torch-Compiled Region"),
for a dependency the ``cuda_sync`` wait on the GPU timeline.

**Step time model.** A step is the innermost step marker. Its *GPU span* runs from the first
to the last GPU activity launched from it; ``gpu_busy_ms`` is the union of those
activities. Its waits are the intervals before the span (from the step's anchor, see
:func:`diagnose.analyzers.phases.find_steps`) and the idle gaps inside it, each with a cause;
before the span, GPU work of the trace that is not the step's is ``pipelined`` (the previous
step still running: healthy), and an idle stretch whose work was launched in time with no
earlier activity in the trace is ``outside_trace`` (the GPU was busy with, or waiting for,
work the trace does not hold). ``own_ms`` = span minus the idle gaps inside it whose cause is
external to the step (:data:`diagnose.vocab.EXTERNAL_CAUSES`: cold start, profiler overhead,
work not in the trace). ``own_ms`` is the base of the TTFT proxy, MFU/MBU and the bound ratio.
A step that launched no GPU work costs its CPU range (CPU-only runs).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd

from diagnose.analyzers.base import declared
from diagnose.model import Gap
from diagnose.analyzers.timeline import LAUNCH_LATENCY_NS, MIN_GAP_NS, analyze_gaps, classify_gaps, union_busy_ns
from diagnose.trace.model import NO_TIME, Trace, concat_named, per_unique
from diagnose.vocab import EXTERNAL_CAUSES, GAP_CAUSES, GAP_KINDS

FINDINGS = declared("waits")


#: Longest gaps described per phase in the report.
LONGEST_GAPS = 5
#: A covering call or event explains a gap when it covers at least this share of it.
COVER_SHARE = 0.5
#: A gap whose next kernel was already queued and that is shorter than this is the GPU
#: switching kernels, not a dependency: back-to-back kernels on one stream start 1-3 µs apart
#: (a Hugging Face forward on H100: 1,164 such gaps: median 1.3 µs, max 2.8 µs).
SWITCH_MAX_NS = 5_000

#: How far before the launch the stream/event wait named for a dependency gap may be.
WAIT_CALL_LOOKBACK_NS = 10_000_000

#: Calls that make a stream wait (the GPU waits, not the host): the queued work waits on them.
_WAIT_CALL = re.compile(r"StreamWaitEvent|StreamWaitValue|WaitExternalSemaphore", re.I)

#: Inside a step's span, idle gaps shorter than this are summed by cause but not listed.
STEP_WAIT_MIN_NS = 50_000

_CAUSE_ID = {c: i for i, c in enumerate(GAP_CAUSES)}
_KIND_CAUSE = np.array([_CAUSE_ID["launch"], _CAUSE_ID["graph"], _CAUSE_ID["dependency"], _CAUSE_ID["not_in_trace"]], dtype=np.int8)
assert GAP_KINDS == ("launch", "graph", "other", "unattributed")


@lru_cache(maxsize=1)
def _patterns() -> tuple[tuple[str, str, re.Pattern], ...]:
    from diagnose.tables import host_call_table

    return tuple((r.cause, r.what, re.compile(r.pattern, re.I)) for r in host_call_table().rows)


def _cause_of(name: str, what: str) -> str | None:
    for cause, w, rx in _patterns():
        if w == what and rx.search(name):
            return cause
    return None


@dataclass
class _Intervals:
    """Sorted intervals of one kind on one thread (or of every thread: tid -2), with a cause."""

    start: np.ndarray
    end: np.ndarray
    name: np.ndarray
    cause: np.ndarray  # object: cause name or None

    @classmethod
    def of(cls, frame: pd.DataFrame, what: str, keep_all: bool = False, cause: np.ndarray | None = None) -> "_Intervals":
        """``cause``: the rows' causes when the caller classified them already."""
        if len(frame) == 0:
            z = np.zeros(0, dtype=np.int64)
            return cls(z, z, np.zeros(0, dtype=object), np.zeros(0, dtype=object))
        if cause is None:
            cause = per_unique(frame["name"], lambda u: _cause_of(str(u), what), dtype=object)
        keep = np.ones(len(frame), dtype=bool) if keep_all else pd.notna(cause)
        s = frame["start_ns"].to_numpy()[keep]
        order = np.argsort(s, kind="stable")
        return cls(s[order], frame["end_ns"].to_numpy()[keep][order],
                   frame["name"].to_numpy(dtype=object)[keep][order], cause[keep][order])

    def best_cover(self, gs: np.ndarray, ge: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each gap, the interval covering most of it among the two that start last
        before the gap's end: (index or -1, covered ns)."""
        n = len(gs)
        best = np.full(n, -1, dtype=np.int64)
        cov = np.zeros(n, dtype=np.int64)
        if len(self.start) == 0 or n == 0:
            return best, cov
        hi = np.searchsorted(self.start, ge, side="right") - 1
        for back in range(3):
            i = hi - back
            ok = i >= 0
            ii = np.where(ok, i, 0)
            c = np.minimum(self.end[ii], ge) - np.maximum(self.start[ii], gs)
            c = np.where(ok, c, 0)
            better = c > cov
            best[better] = ii[better]
            cov[better] = c[better]
        return best, cov


@dataclass
class HostIndex:
    """What the host was doing, per thread: runtime calls with a cause, compile ranges, all
    CPU ranges (for naming the innermost one), profiler overhead events, GPU-side waits."""

    runtime: dict[int, _Intervals] = field(default_factory=dict)
    compile_ranges: dict[int, _Intervals] = field(default_factory=dict)
    overhead: _Intervals | None = None
    syncs: _Intervals | None = None
    trace: Trace | None = None
    skip_names: frozenset = frozenset()  # step markers and containers: never "what the host was doing"
    _ranges: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)

    @classmethod
    def build(cls, trace: Trace) -> "HostIndex":
        h = cls(trace=trace)
        rt = trace.runtime
        if len(rt):
            cause = per_unique(rt["name"], lambda u: _cause_of(str(u), "runtime"), dtype=object)  # once for all threads
            for tid, idx in rt.groupby("tid", sort=False).indices.items():
                h.runtime[int(tid)] = _Intervals.of(rt.iloc[idx], "runtime", keep_all=True, cause=cause[idx])
        ranges = _cpu_ranges(trace)
        if len(ranges):
            is_compile = per_unique(ranges["name"], lambda u: _cause_of(str(u), "range") is not None)
            comp = ranges[is_compile]
            for tid, sub in comp.groupby("tid", sort=False):
                h.compile_ranges[int(tid)] = _Intervals.of(sub, "range")
        ov = getattr(trace, "overhead", None)
        if ov is not None and len(ov):
            h.overhead = _Intervals.of(ov, "overhead", keep_all=True)
        if len(trace.gpu_syncs):
            sy = trace.gpu_syncs
            h.syncs = _Intervals.of(sy, "sync", keep_all=True)
        return h

    def innermost_range(self, tid: int, t_ns: int) -> str | None:
        """Name of the innermost CPU op or user range on thread ``tid`` running at ``t_ns``."""
        if tid < 0 or self.trace is None:
            return None
        if tid not in self._ranges:
            r = _cpu_ranges(self.trace)
            r = r[r["tid"] == tid]
            order = np.argsort(r["start_ns"].to_numpy(), kind="stable")
            self._ranges[tid] = (r["start_ns"].to_numpy()[order], r["end_ns"].to_numpy()[order],
                                 r["name"].to_numpy(dtype=object)[order])
        s, e, n = self._ranges[tid]
        hi = int(np.searchsorted(s, t_ns, side="right"))
        # the latest-starting range still running at t: innermost (ranges on a thread nest)
        for i in range(hi - 1, max(hi - 2000, 0) - 1, -1):
            if e[i] >= t_ns:
                name = str(n[i])
                if name in self.skip_names or name.startswith("ProfilerStep#"):
                    return None
                return name
        return None


def _cpu_ranges(trace: Trace) -> pd.DataFrame:
    """CPU ops and CPU-side user ranges: name, start_ns, end_ns, tid."""
    cached = getattr(trace, "_cpu_ranges_cache", None)
    if cached is not None:
        return cached
    parts = []
    if len(trace.cpu_ops):
        parts.append(trace.cpu_ops[["name", "start_ns", "end_ns", "tid"]])
    ann = trace.annotations
    if len(ann):
        a = ann[ann["scope"] == "cpu"]
        parts.append(a[["name", "start_ns", "end_ns", "tid"]])
    out = concat_named(parts) if parts else pd.DataFrame({"name": [], "start_ns": [], "end_ns": [], "tid": []})
    trace._cpu_ranges_cache = out  # type: ignore[attr-defined]
    return out


@dataclass
class Gaps:
    """Idle gaps with causes. Arrays aligned: start/end ns, kind code (GAP_KINDS), cause code
    (GAP_CAUSES), index of the next activity (into the caller's arrays), and the covering
    host interval that explains the gap (kind of index, index) for naming it."""

    start: np.ndarray
    end: np.ndarray
    kind: np.ndarray
    cause: np.ndarray
    next_idx: np.ndarray
    cover: list = field(default_factory=list)
    launch_end: np.ndarray | None = None  # per gap: launch-call end ns of the next activity (NO_TIME unknown)

    @property
    def ms(self) -> np.ndarray:
        return (self.end - self.start) / 1e6


def attribute(gs: np.ndarray, ge: np.ndarray, kind: np.ndarray, tids: np.ndarray, host: HostIndex,
              launch_end: np.ndarray | None = None) -> tuple[np.ndarray, list]:
    """Cause code per gap (see the module docstring) and, per gap, the explaining interval
    (("runtime", tid, i) | ("overhead", i) | ("compile", tid, i) | None).

    Args:
        gs, ge: gap start/end ns; kind: GAP_KINDS codes; tids: launching thread of the
            activity after each gap (-1 unknown); launch_end: end ns of that activity's
            launch call (NO_TIME unknown; None: all unknown). Host activity that starts after
            the launch returned does not explain the gap.
    """
    n = len(gs)
    cause = _KIND_CAUSE[kind.astype(np.int64)] if n else np.zeros(0, dtype=np.int8)
    cover: list = [None] * n
    if n == 0:
        return cause, cover
    le = np.full(n, NO_TIME, dtype=np.int64) if launch_end is None else np.asarray(launch_end, dtype=np.int64)
    queued_short = (cause == _CAUSE_ID["dependency"]) & (ge - gs < SWITCH_MAX_NS)
    cause[queued_short] = _CAUSE_ID["switch"]
    # no usable launch time although the launch call is linked (clock skew): the work is the
    # trace's own, the cause unknown; not "not_in_trace" (which leaves the step's own time)
    cause[(kind == GAP_KINDS.index("unattributed")) & (np.asarray(tids) >= 0)] = _CAUSE_ID["unknown"]
    need = np.maximum((ge - gs) * COVER_SHARE, 1)
    graph = kind == GAP_KINDS.index("graph")
    decided = graph.copy()

    def before_launch(iv: _Intervals, best: np.ndarray, j: np.ndarray) -> np.ndarray:
        """True where the covering interval began before the next activity was queued."""
        return (le[j] == NO_TIME) | (iv.start[np.maximum(best, 0)] < le[j])

    if host.overhead is not None:
        best, cov = host.overhead.best_cover(gs, ge)
        hit = (~decided) & (best >= 0) & (cov >= need) & before_launch(host.overhead, best, np.arange(n))
        for j in np.flatnonzero(hit):
            cause[j] = _CAUSE_ID[host.overhead.cause[best[j]] or "profiler_overhead"]
            cover[j] = ("overhead", int(best[j]))
        decided |= hit
    for tid in np.unique(tids):
        m = (tids == tid) & ~decided
        if not m.any():
            continue
        idx = np.flatnonzero(m)
        iv = host.runtime.get(int(tid))
        if iv is not None:
            best, cov = iv.best_cover(gs[idx], ge[idx])
            ok = (best >= 0) & (cov >= need[idx]) & before_launch(iv, best, idx)
            for j, b in zip(idx[ok], best[ok]):
                c = iv.cause[b]
                if c is not None:
                    cause[j] = _CAUSE_ID[c]
                    cover[j] = ("runtime", int(tid), int(b))
                    decided[j] = True
        cr = host.compile_ranges.get(int(tid))
        if cr is not None:
            idx = idx[~decided[idx]]
            best, cov = cr.best_cover(gs[idx], ge[idx])
            ok = (best >= 0) & (cov >= need[idx]) & before_launch(cr, best, idx)
            for j, b in zip(idx[ok], best[ok]):
                cause[j] = _CAUSE_ID["cold_start"]
                cover[j] = ("compile", int(tid), int(b))
                decided[j] = True
    return cause, cover


def host_call(g: Gaps, j: int, host: HostIndex, tids: np.ndarray) -> str | None:
    """What the host was doing during gap ``j`` (see the module docstring), or None: the
    interval that explains it; else, for a launch gap, the innermost CPU op or range the
    launching thread was in; for other gaps, a runtime call of the launching thread spanning
    most of it (a host blocked *behind* queued work is named: it was in that call). What queued
    work waited on is :func:`waited_on`."""
    c = g.cover[j]
    if c is not None:
        if c[0] == "overhead":
            return str(host.overhead.name[c[1]])
        if c[0] == "runtime":
            return str(host.runtime[c[1]].name[c[2]])
        return str(host.compile_ranges[c[1]].name[c[2]])
    cause = GAP_CAUSES[int(g.cause[j])]
    tid = int(tids[j]) if len(tids) else -1
    if cause == "launch":
        # the innermost range the launching thread was in; None when the trace shows nothing
        # there (not the next work's own launch call: the host was not in it during the gap)
        return host.innermost_range(tid, int((g.start[j] + g.end[j]) // 2))
    iv = host.runtime.get(tid)
    if iv is not None:
        best, cov = iv.best_cover(g.start[j:j + 1], g.end[j:j + 1])
        if best[0] >= 0 and cov[0] * 2 >= g.end[j] - g.start[j]:
            return str(iv.name[best[0]])
    return None


def waited_on(g: Gaps, j: int, host: HostIndex, tids: np.ndarray) -> str | None:
    """For a gap whose next work was queued in time (``dependency``, ``outside_trace``): what
    it waited on, as far as the trace tells: the GPU-side wait (``cuda_sync`` events) covering
    it, else the last stream/event wait the launching thread issued before queueing the work
    (within :data:`WAIT_CALL_LOOKBACK_NS`); None otherwise."""
    if GAP_CAUSES[int(g.cause[j])] not in ("dependency", "outside_trace"):
        return None
    if host.syncs is not None:
        best, cov = host.syncs.best_cover(g.start[j:j + 1], g.end[j:j + 1])
        if best[0] >= 0 and cov[0] > 0:
            return str(host.syncs.name[best[0]])
    le = int(g.launch_end[j]) if g.launch_end is not None else NO_TIME
    iv = host.runtime.get(int(tids[j]) if len(tids) else -1)
    if le != NO_TIME and iv is not None:
        hi = int(np.searchsorted(iv.start, le, side="left"))
        for i in range(hi - 1, -1, -1):
            if iv.start[i] < le - WAIT_CALL_LOOKBACK_NS:
                break
            if _WAIT_CALL.search(str(iv.name[i])):
                return str(iv.name[i])
    return None


def device_gaps(s: np.ndarray, e: np.ndarray, launch_end: np.ndarray, graph_followup: np.ndarray, tids: np.ndarray,
                host: HostIndex) -> Gaps:
    """Idle gaps of one device's activities (sorted by start, end) with their causes."""
    gs, ge, kind, nxt = classify_gaps(s, e, launch_end, graph_followup)
    le = launch_end[nxt] if len(nxt) else np.zeros(0, dtype=np.int64)
    cause, cover = attribute(gs, ge, kind, tids[nxt] if len(nxt) else np.zeros(0, dtype=np.int64), host, le)
    return Gaps(gs, ge, kind, cause, nxt, cover, le)


def caused_gaps(acts: pd.DataFrame, host: HostIndex, outside: tuple[np.ndarray, np.ndarray] | None = None):
    """The gaps of one device's activities (``acts``, any order) with their causes: the
    timeline's gap statistics (kinds and launch-gap share corrected for late launches with
    another cause) and the :class:`Gaps`, with ``tids`` of the activities in time order.
    ``outside``: the steps' ``outside_trace`` waits (:func:`outside_waits_ns`).

    Returns:
        (stats: :class:`~.timeline.GapStats`, gaps: :class:`Gaps`, tids: np.ndarray in
        ``stats.order``).
    """
    launch_end = launch_end_for_gaps(acts)
    stats = analyze_gaps(acts["start_ns"].to_numpy(), acts["end_ns"].to_numpy(), launch_end, acts["graph_followup"].to_numpy())
    tids = acts["launch_tid"].to_numpy()[stats.order] if len(acts) else np.zeros(0, dtype=np.int64)
    gap_le = launch_end[stats.order][stats.gap_next] if len(stats.gap_next) else launch_end[:0]
    cause, cover = attribute(stats.gap_start, stats.gap_end, stats.gap_kind, tids[stats.gap_next] if len(stats.gap_next) else tids[:0],
                             host, gap_le)
    if outside is not None and len(outside[0]) and len(cause):
        relabel_outside(stats.gap_start, stats.gap_end, cause, *outside)
    reclassify_late_launches(stats, cause)
    return stats, Gaps(stats.gap_start, stats.gap_end, stats.gap_kind, cause, stats.gap_next, cover, gap_le), tids


def launch_end_for_gaps(acts: pd.DataFrame) -> np.ndarray:
    """Launch-call ends for gap classification: unknown (NO_TIME) for activities whose start
    precedes their launch call (clock skew), so the gaps before them are unattributed."""
    le = acts["launch_end_ns"].to_numpy()
    if "clock_skewed" in acts:
        le = np.where(acts["clock_skewed"].to_numpy(dtype=bool), NO_TIME, le)
    return le


def reclassify_late_launches(stats, cause: np.ndarray) -> None:
    """A gap the host was late for because of something other than launching (the profiler's
    own overhead, a cold start, a blocking call) is not a launch gap: make it "other" in the
    gap kinds (and the launch-gap share) of ``stats`` (a :class:`~.timeline.GapStats`)."""
    k_launch, k_other = GAP_KINDS.index("launch"), GAP_KINDS.index("other")
    move = (stats.gap_kind == k_launch) & (cause != _CAUSE_ID["launch"])
    if not move.any():
        return
    stats.gap_kind = np.where(move, k_other, stats.gap_kind).astype(np.int8)
    ms = stats.gap_end - stats.gap_start
    for i, k in enumerate(GAP_KINDS):
        m = stats.gap_kind == i
        stats.gap_ns_by_kind[k] = int(ms[m].sum())
        stats.gap_count_by_kind[k] = int(m.sum())
    stats.launch_gaps_ns = ms[stats.gap_kind == k_launch]


def outside_waits_ns(steps: pd.DataFrame, t0: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (start_ns, end_ns) of the steps' ``outside_trace`` waits (absolute ns)."""
    iv = sorted((t0 + round(w["start_ms"] * 1e6), t0 + round((w["start_ms"] + w["ms"]) * 1e6))
                for ws in (steps["waits"] if "waits" in steps else ()) if isinstance(ws, list)
                for w in ws if w.get("cause") == "outside_trace")
    return (np.array([a for a, _ in iv], dtype=np.int64), np.array([b for _, b in iv], dtype=np.int64))


def relabel_outside(gs: np.ndarray, ge: np.ndarray, cause: np.ndarray, os_: np.ndarray, oe: np.ndarray) -> None:
    """In place: a queued gap (``dependency``/``switch``) at least half inside one of the
    intervals [os_, oe) (a step's ``outside_trace`` wait) becomes ``outside_trace``."""
    queued = np.isin(cause, [_CAUSE_ID["dependency"], _CAUSE_ID["switch"]])
    if not queued.any():
        return
    k = np.searchsorted(os_, ge, side="right") - 1  # the last interval starting before the gap's end
    ok = k >= 0
    kk = np.where(ok, k, 0)
    cov = np.where(ok, np.minimum(oe[kk], ge) - np.maximum(os_[kk], gs), 0)
    cause[queued & (cov * 2 >= (ge - gs))] = _CAUSE_ID["outside_trace"]


def idle_by_cause_ms(g: Gaps) -> dict[str, float]:
    """Idle ms per cause (only causes with time), in vocabulary order."""
    if len(g.start) == 0:
        return {}
    tot = np.bincount(g.cause.astype(np.int64), weights=(g.end - g.start).astype(np.float64), minlength=len(GAP_CAUSES))
    return {c: round(float(tot[i]) / 1e6, 6) for i, c in enumerate(GAP_CAUSES) if tot[i] > 0}


def longest(g: Gaps, host: HostIndex, tids_next: np.ndarray, names_next: np.ndarray,
            t0_ns: int, n: int = LONGEST_GAPS) -> list[Gap]:
    """The ``n`` longest gaps (start_ms from the trace start), with cause, host_call, waited_on
    and the next activity."""
    out: list[Gap] = []
    if len(g.start) == 0:
        return out
    dur = g.end - g.start
    for j in np.argsort(-dur, kind="stable")[:n]:
        out.append(Gap(
            start_ms=round((int(g.start[j]) - t0_ns) / 1e6, 6),
            duration_ms=round(float(dur[j]) / 1e6, 6),
            kind=GAP_KINDS[int(g.kind[j])],
            cause=GAP_CAUSES[int(g.cause[j])],
            host_call=host_call(g, int(j), host, tids_next),
            waited_on=waited_on(g, int(j), host, tids_next),
            next=str(names_next[j])[:120],
        ))
    return out


def trace_t0(trace: Trace) -> int:
    """The trace start (ns): the earliest event, the origin of ``--window`` and every ``start_ms``."""
    from diagnose.trace.slice import trace_start_ns

    t0 = trace_start_ns(trace)
    return 0 if t0 is None else int(t0)


@dataclass(frozen=True)
class StepWaits:
    """The step table with each step's span, busy and own time, waits and idle by cause
    (columns gpu_span_ms, gpu_busy_ms, own_ns, waits, idle_by_cause_ms), the host index the
    gap causes were read from, and the trace start every ``start_ms`` counts from."""

    steps: pd.DataFrame
    host: HostIndex
    t0_ns: int


def step_waits(trace: Trace, activities: pd.DataFrame, steps: pd.DataFrame, containers: pd.DataFrame | None) -> StepWaits:
    """Per step: gpu_span_ms, gpu_busy_ms, own_ms (own_ns), waits and idle_by_cause_ms
    (module docstring); ``containers``: the outer markers (never "what the host was doing")."""
    g = activities
    steps = steps.copy()
    host = HostIndex.build(trace)
    host.skip_names = frozenset(list(steps["name"]) + (list(containers["name"]) if containers is not None else []))
    t0 = trace_t0(trace)
    n = len(steps)
    span_ms = np.full(n, np.nan)
    busy_ms = np.full(n, np.nan)
    own_ns = np.zeros(n, dtype=np.int64)
    waits: list[list[dict]] = [[] for _ in range(n)]
    by_cause: list[dict] = [{} for _ in range(n)]
    if n:
        cpu = (steps["end_ns"].to_numpy(dtype=np.int64) - steps["start_ns"].to_numpy(dtype=np.int64))
        own_ns[:] = cpu
    if n and len(g):
        gg = g.sort_values(["device", "start_ns", "end_ns"], kind="stable")
        dev_arr = gg["device"].to_numpy()
        s_all, e_all = gg["start_ns"].to_numpy(), gg["end_ns"].to_numpy()
        le_all, gf_all = launch_end_for_gaps(gg), gg["graph_followup"].to_numpy()
        tid_all = gg["launch_tid"].to_numpy() if "launch_tid" in gg else np.full(len(gg), -1)
        step_all = gg["step"].to_numpy()
        anchors = steps["anchor_ns"].to_numpy(dtype=np.int64) if "anchor_ns" in steps else steps["start_ns"].to_numpy(dtype=np.int64)
        for dev in np.unique(dev_arr):
            lo, hi = np.searchsorted(dev_arr, [dev, dev + 1])
            sel = slice(int(lo), int(hi))
            s, e, le, gf = s_all[sel], e_all[sel], le_all[sel], gf_all[sel]
            tids, stp = tid_all[sel], step_all[sel]
            cm = np.maximum.accumulate(e)
            by_step = np.argsort(stp, kind="stable")  # positions grouped by step, in time order
            sorted_steps = stp[by_step]
            for i in np.unique(stp[stp >= 0]):
                lo_s, hi_s = np.searchsorted(sorted_steps, [i, i + 1])
                own = by_step[lo_s:hi_s]
                a = int(own[0])
                gs0, ge0 = int(s[own].min()), int(e[own].max())
                span_ms[i] = (ge0 - gs0) / 1e6
                busy_ms[i] = union_busy_ns(s[own], e[own]) / 1e6
                # every activity of the device inside the span counts as busy (true GPU idle)
                lo_i = int(np.searchsorted(s, gs0, side="left"))
                hi_i = int(np.searchsorted(s, ge0, side="left"))
                gap = device_gaps(s[lo_i:hi_i], e[lo_i:hi_i], le[lo_i:hi_i], gf[lo_i:hi_i], tids[lo_i:hi_i], host)
                ext = np.isin(gap.cause, [_CAUSE_ID[c] for c in EXTERNAL_CAUSES])
                own_ns[i] = (ge0 - gs0) - int((gap.end[ext] - gap.start[ext]).sum())
                cause_ms = idle_by_cause_ms(gap)
                w = _before_span(int(anchors[i]), gs0, s, e, cm, le, tids, stp, i, a, host, t0)
                for x in w:
                    cause_ms[x["cause"]] = round(cause_ms.get(x["cause"], 0.0) + x["ms"], 6)
                dur = gap.end - gap.start
                big = np.flatnonzero(dur >= max(STEP_WAIT_MIN_NS, 0.01 * (ge0 - gs0)))
                for j in big[np.argsort(-dur[big], kind="stable")][:5]:
                    nx = int(gap.next_idx[j]) + lo_i
                    w.append({"where": "inside", "start_ms": round((int(gap.start[j]) - t0) / 1e6, 6),
                              "ms": round(float(dur[j]) / 1e6, 6), "cause": GAP_CAUSES[int(gap.cause[j])],
                              "host_call": host_call(gap, int(j), host, tids[lo_i:hi_i][gap.next_idx])
                              if nx >= 0 else None,
                              "waited_on": waited_on(gap, int(j), host, tids[lo_i:hi_i][gap.next_idx]) if nx >= 0 else None})
                waits[i] = w
                by_cause[i] = cause_ms
    steps["gpu_span_ms"] = span_ms
    steps["gpu_busy_ms"] = busy_ms
    steps["own_ns"] = own_ns
    steps["waits"] = pd.Series(waits, index=steps.index, dtype=object) if n else pd.Series([], dtype=object)
    steps["idle_by_cause_ms"] = pd.Series(by_cause, index=steps.index, dtype=object) if n else pd.Series([], dtype=object)
    return StepWaits(steps, host, t0)


def _before_span(anchor: int, gs0: int, s, e, cm, le, tids, stp, i: int, first: int, host: HostIndex,
                 t0: int) -> list[dict[str, Any]]:
    """Waits between the step's anchor and its first GPU activity (index ``first`` into the
    device's sorted arrays): GPU time on earlier steps' work (``pipelined``) and idle
    stretches, each attributed like a gap before the next activity. Stretches shorter than
    :data:`STEP_WAIT_MIN_NS` are left out."""
    out: list[dict[str, Any]] = []
    if gs0 - anchor < MIN_GAP_NS:
        return out
    k0 = int(np.searchsorted(cm, anchor, side="right"))  # first activity still running at the anchor
    # earlier work: another step's, or launched before the anchor (or with no launch in the trace)
    iv = [(max(int(s[k]), anchor), min(int(e[k]), gs0), (stp[k] >= 0 and stp[k] != i) or le[k] == NO_TIME or le[k] < anchor)
          for k in range(k0, first) if s[k] < gs0]
    merged: list[list[int]] = []
    pipelined = 0
    first_pipelined = None
    for a, b, earlier in sorted(iv):
        if b <= a:
            continue
        if earlier:
            pipelined += b - a
            first_pipelined = a if first_pipelined is None else first_pipelined
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    if pipelined >= STEP_WAIT_MIN_NS:
        out.append({"where": "before", "start_ms": round((first_pipelined - t0) / 1e6, 6), "ms": round(pipelined / 1e6, 6),
                    "cause": "pipelined", "host_call": None, "waited_on": None})
    cur = anchor
    for a, b in merged + [[gs0, gs0]]:
        if a - cur >= MIN_GAP_NS:
            k = min(int(np.searchsorted(s, a, side="left")), len(s) - 1)
            parts = []
            queued = a - int(le[k]) if le[k] != NO_TIME else 0
            if le[k] != NO_TIME and le[k] > cur and queued > max(LAUNCH_LATENCY_NS, int(le[k]) - cur):
                # queued, the work still waited longer than the host was late: launching
                # earlier would not have started it sooner, the whole stretch is that wait
                parts.append((cur, a, GAP_KINDS.index("other")))
            elif le[k] != NO_TIME and le[k] > cur:
                # the host was late: the launch part (with the launch-latency allowance, as in
                # the gap list), then whatever the queued work still waited
                cut = min(a, int(le[k]) + LAUNCH_LATENCY_NS)
                parts.append((cur, cut, GAP_KINDS.index("launch")))
                if cut < a:
                    parts.append((cut, a, GAP_KINDS.index("other")))
            else:
                parts.append((cur, a, GAP_KINDS.index("other" if le[k] != NO_TIME else "unattributed")))
            for p0, p1, kd in parts:
                if p1 - p0 < STEP_WAIT_MIN_NS:
                    continue
                kind = np.array([kd], dtype=np.int8)
                lk = np.array([le[k]])
                cause, cover = attribute(np.array([p0]), np.array([p1]), kind, np.array([tids[k]]), host, lk)
                cname = GAP_CAUSES[int(cause[0])]
                if cname in ("dependency", "switch"):
                    # queued in time, the device idle until the step's span: it waited for work
                    # this device's timeline does not hold (launched before the trace window, an
                    # event of another device or process)
                    cname = "outside_trace"
                gg = Gaps(np.array([p0]), np.array([p1]), kind, cause, np.array([0]), cover, lk)
                out.append({"where": "before", "start_ms": round((p0 - t0) / 1e6, 6), "ms": round((p1 - p0) / 1e6, 6),
                            "cause": cname, "host_call": host_call(gg, 0, host, np.array([tids[k]])),
                            "waited_on": waited_on(gg, 0, host, np.array([tids[k]]))})
        cur = max(cur, b)
    return out
