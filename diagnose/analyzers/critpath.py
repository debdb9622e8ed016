"""What sets the step time: the critical path of each step (or of the window without steps).

The path is the chain of events that determined when the step's last GPU activity ended,
walked backwards over the dependency graph (:mod:`diagnose.analyzers.depgraph`) from that
activity, each time to the predecessor that let it start last:

* at a GPU activity: its stream predecessor (the gap between them is ``gpu_gap``, cause
  ``graph`` inside one graph replay, else ``switch``), the activity another stream's wait
  released (``dependency``), or its launch call (``launch_latency`` from the call's start,
  then the host);
* on the host, back from the launch call's start to the latest call that blocked the thread
  on GPU work (the host time between is ``host``, split by cause, activity and frame:
  :mod:`diagnose.analyzers.hostpath`), then ``sync_return`` from the GPU activity that call
  waited for to its return, and on at that activity.

The path starts at the step's anchor (its marker; the outer marker for the first inner step)
or at the previous step's GPU end, whichever is later (the GPU cannot start this step's work
before the previous step's is done): under an overlap scheduler (vLLM async scheduling,
SGLang's overlap scheduler) the host prepares step N+1 while step N runs, and that host time
is off the path. An activity that started more than 1.5 ms after everything the trace shows
it waited for (:data:`~diagnose.analyzers.depgraph.UNEXPLAINED_NS`) waited for work the trace
does not hold (``outside_trace``: e.g. the previous step of a pipelined engine, a wait on an
event of another process): the path starts at it, so external time (``outside_trace``,
``cold_start`` and ``profiler_overhead`` before the step's work) never counts. Every segment
is contiguous: the path's length is its end minus its start.

``hta_comparable_ms`` is the length HTA 0.6.1's ``critical_path_analysis`` would give: the
path less the host time HTA weights zero (outside every CPU op and non-blocking runtime call:
python between top-level ops, untracked), the blocking calls' spans, cross-stream waits and
sync returns (README "Critical path").
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from diagnose.analyzers import depgraph as D
from diagnose.analyzers.hostpath import HTA_WEIGHTED, classify
from diagnose.model import CriticalPath, PathFrame, PathPhase, PathSection, PathSegment
from diagnose.trace.model import NO_TIME
from diagnose.vocab import PATH_KINDS

K_GAP, K_LAT, K_DEP, K_RET, K_HOST = (PATH_KINDS.index(k) for k in ("gpu_gap", "launch_latency", "dependency",
                                                                     "sync_return", "host"))
#: Segments listed per path in the JSON report (the longest, in time order).
TOP_SEGMENTS = 10
#: Host frames listed per phase.
TOP_FRAMES = 5


@dataclass
class Path:
    """One critical path: segments in time order (arrays, absolute ns) and where it starts.

    Attributes:
        t0, t1: segment bounds; kind: index into PATH_KINDS; cause: gap cause (None on GPU
            activities); activity: host activity (None off the host); name: what the
            segment is (activity, call, innermost host event); frame: host frame; op: graph
            index of the GPU activity of the segment (-1 none).
        start_ns, end_ns: where the path starts and ends; reason: one of PATH_STARTS;
        anchor_ns: the step's anchor (the window start without steps).
    """

    t0: np.ndarray
    t1: np.ndarray
    kind: np.ndarray
    cause: np.ndarray
    activity: np.ndarray
    name: np.ndarray
    frame: np.ndarray
    op: np.ndarray
    start_ns: int
    end_ns: int
    reason: str
    anchor_ns: int

    @property
    def dur(self) -> np.ndarray:
        return self.t1 - self.t0

    @property
    def length_ns(self) -> int:
        return self.end_ns - self.start_ns

    def ns_by_kind(self) -> dict[str, int]:
        tot = np.bincount(self.kind.astype(np.int64), weights=self.dur, minlength=len(PATH_KINDS))
        return {k: int(tot[i]) for i, k in enumerate(PATH_KINDS) if tot[i] > 0}

    def host_ns_by_cause(self) -> dict[str, int]:
        m = self.kind == K_HOST
        out: dict[str, int] = {}
        for c, d in zip(self.cause[m].tolist(), self.dur[m].tolist()):
            out[c] = out.get(c, 0) + d
        return out

    def hta_comparable_ns(self) -> int:
        """Length with HTA 0.6.1's zero-weight parts left out (module docstring)."""
        w = np.isin(self.kind, [K_DEP, K_RET], invert=True)
        host = self.kind == K_HOST
        w &= ~host | np.isin(self.activity, list(HTA_WEIGHTED))
        return int(self.dur[w].sum())


@dataclass
class Paths:
    """The critical paths of an analysis: one per step with GPU work (``steps``: step row ->
    :class:`Path`), or one for the whole window when the trace has no steps (``window``)."""

    steps: dict[int, Path] = field(default_factory=dict)
    window: Path | None = None
    graph: D.DepGraph | None = None

    def all(self) -> list[Path]:
        return list(self.steps.values()) + ([self.window] if self.window is not None else [])


# ---------------------------------------------------------------- the walk


class _Walker:
    """Backward walk over the graph's arrays (as Python lists: one walk touches each path
    element once)."""

    def __init__(self, g: D.DepGraph) -> None:
        self.g = g
        self.start, self.end = g.start.tolist(), g.end.tolist()
        self.bind, self.bind_ns = g.bind.tolist(), g.bind_ns.tolist()
        self.prev, self.wsrc, self.launch = g.prev.tolist(), g.wait_src.tolist(), g.launch.tolist()
        self.lstart, self.kind = g.launch_start.tolist(), g.kind.tolist()
        self.rt_tid, self.rt_end = g.rt_tid.tolist(), g.rt_end.tolist()
        self.block = {t: (e, c.tolist(), r.tolist()) for t, (e, c, r) in g.blocking.items()}
        self.limit = 4 * (len(self.start) + len(self.rt_end)) + 16

    def walk(self, last: int, floor: int, anchor: int, unlaunched_previous: bool = True
             ) -> tuple[list[tuple[int, int, int, int]], list, int, str]:
        """(segments (t0, t1, kind, ref) in reverse time order, host stretches (tid, a, b),
        path start, start reason). ``ref``: the GPU activity for GPU kinds, gaps, latencies and
        waits; the stretch for host; the call for sync returns. An activity launched before
        ``anchor`` is the previous step's work, and so is one with no launch in the trace
        when ``unlaunched_previous`` (a step's view: its own work was launched in it)."""
        start, end, bind, bind_ns = self.start, self.end, self.bind, self.bind_ns
        lstart = self.lstart
        segs: list[tuple[int, int, int, int]] = []
        stretches: list[tuple[int, int, int]] = []
        cur = end[last]
        floor_reason = "anchor" if floor <= anchor else "previous_step"

        def seg(t0: int, t1: int, kind: int, ref: int) -> None:
            nonlocal cur
            t1 = min(t1, cur)
            t0 = min(max(t0, floor), t1)
            if t1 > t0:
                segs.append((t0, t1, kind, ref))
                cur = t0

        def previous(op: int) -> bool:
            ls = lstart[op]
            return (ls < anchor) if ls != NO_TIME else (unlaunched_previous or start[op] < anchor)

        i = last
        for _ in range(self.limit):
            s_i = start[i]
            seg(s_i, end[i], self.kind[i], i)
            if s_i <= floor:
                return segs, stretches, floor, floor_reason
            b = bind[i]
            if b == D.BIND_NONE:
                return segs, stretches, s_i, "not_in_trace"
            tb = bind_ns[i]
            if s_i - tb > D.UNEXPLAINED_NS:
                return segs, stretches, s_i, "outside_trace"
            tb = min(tb, s_i)
            if b == D.BIND_STREAM or b == D.BIND_WAIT:
                p = self.prev[i] if b == D.BIND_STREAM else self.wsrc[i]
                seg(tb, s_i, K_GAP if b == D.BIND_STREAM else K_DEP, i)
                if tb <= floor or previous(p):
                    seg(floor, s_i, K_GAP if b == D.BIND_STREAM else K_DEP, i)
                    return segs, stretches, floor, "previous_step" if previous(p) else floor_reason
                i = p
                continue
            seg(tb, s_i, K_LAT, i)
            if tb <= floor:
                return segs, stretches, floor, floor_reason
            call = self.launch[i]
            tid = self.rt_tid[call]
            nxt, at = self._host(tid, tb, floor, seg, stretches, previous)
            if nxt is None:
                return segs, stretches, at, floor_reason if at <= floor else "previous_step"
            i = nxt
        return segs, stretches, cur, "not_in_trace"  # pragma: no cover - the walk always ends

    def _host(self, tid: int, t: int, floor: int, seg, stretches, previous) -> tuple[int | None, int]:
        """Host walk on thread ``tid`` back from ``t``: (the next GPU activity: a blocking
        call's release, or None where the path starts; that start)."""
        blk = self.block.get(tid)
        k = -1
        if blk is not None:
            k = int(np.searchsorted(blk[0], t, side="right")) - 1
        if k < 0 or blk[0][k] <= floor:
            stretches.append((tid, floor, t))
            seg(floor, t, K_HOST, len(stretches) - 1)
            return None, floor
        b_end, call, rel = int(blk[0][k]), blk[1][k], blk[2][k]
        stretches.append((tid, b_end, t))
        seg(b_end, t, K_HOST, len(stretches) - 1)
        r0 = max(self.end[rel], floor)
        seg(r0, b_end, K_RET, call)
        if previous(rel) or self.end[rel] <= floor:
            return None, r0
        return rel, r0


# ---------------------------------------------------------------- paths of an analysis


def step_paths(g: D.DepGraph, steps: pd.DataFrame, t0_ns: int) -> Paths:
    """The critical path of every step with GPU work (``steps``: the step table, with
    ``anchor_ns``), or of the whole window (from ``t0_ns``, the trace start) without steps."""
    out = Paths(graph=g)
    if g.n == 0:
        return out
    w = _Walker(g)
    raw: list[tuple[int | None, list, list, int, str, int, int]] = []
    if len(steps):
        anchors = steps["anchor_ns"].to_numpy(dtype=np.int64) if "anchor_ns" in steps else steps["start_ns"].to_numpy(dtype=np.int64)
        has = g.step >= 0
        idx = np.flatnonzero(has)
        o = idx[np.lexsort((g.end[idx], g.step[idx]))]
        st = g.step[o]
        lasts = o[np.concatenate((st[1:] != st[:-1], [True]))] if len(o) else o
        for last in lasts.tolist():
            i = int(g.step[last])
            anchor = int(anchors[i])
            prev = g.previous_gpu_end(anchor)
            floor = max(anchor, min(prev if prev is not None else anchor, int(g.end[last])))
            segs, stretches, start, reason = w.walk(last, floor, anchor)
            raw.append((i, segs, stretches, start, reason, anchor, int(g.end[last])))
    else:
        last = int(np.argmax(g.end))
        segs, stretches, start, reason = w.walk(last, t0_ns, t0_ns, unlaunched_previous=False)
        raw.append((None, segs, stretches, start, reason, t0_ns, int(g.end[last])))
    for key, path in zip([r[0] for r in raw], _assemble(g, raw)):
        if key is None:
            out.window = path
        else:
            out.steps[key] = path
    return out


def window_path(g: D.DepGraph, start_ns: int, end_ns: int) -> Path | None:
    """The critical path of a window [start_ns, end_ns] (e.g. a user range): the activities
    launched in it (started in it, when not launched), from ``start_ns`` or the previous GPU
    end. None when nothing was launched in the window."""
    key = np.where(g.launch_start != NO_TIME, g.launch_start, g.start)
    ops = np.flatnonzero((key >= start_ns) & (key <= end_ns))
    if len(ops) == 0:
        return None
    last = int(ops[np.argmax(g.end[ops])])
    prev = g.previous_gpu_end(start_ns)
    floor = max(start_ns, min(prev if prev is not None else start_ns, int(g.end[last])))
    segs, stretches, start, reason = _Walker(g).walk(last, floor, start_ns, unlaunched_previous=False)
    return _assemble(g, [(None, segs, stretches, start, reason, start_ns, int(g.end[last]))])[0]


def _assemble(g: D.DepGraph, raw: list) -> list[Path]:
    """Paths from raw walks: host stretches classified in one batch."""
    flat: list[tuple[int, int, int]] = []
    base = []
    for r in raw:
        base.append(len(flat))
        flat.extend(r[2])
    pieces = classify(g, flat)
    out = []
    for (_, segs, _stretches, start, reason, anchor, end), b in zip(raw, base):
        t0, t1, kind, cause, act, name, frame, op = [], [], [], [], [], [], [], []
        for s0, s1, k, ref in reversed(segs):
            if k == K_HOST:
                for p in pieces[b + ref]:
                    lo, hi = max(p.t0, s0), min(p.t1, s1)
                    if hi > lo:
                        t0.append(lo), t1.append(hi), kind.append(K_HOST), cause.append(p.cause)
                        act.append(p.activity), name.append(p.name), frame.append(p.frame), op.append(-1)
                continue
            t0.append(s0), t1.append(s1), kind.append(k), op.append(ref if k != K_RET else -1)
            act.append(None), frame.append(None)
            if k == K_RET:
                cause.append("host_blocked"), name.append(str(g.rt_name[ref]))
            elif k == K_GAP:
                p = int(g.prev[ref])
                same = bool(g.graph[ref]) and p >= 0 and g.launch[p] == g.launch[ref]
                cause.append("graph" if same else "switch"), name.append(str(g.name[ref]))
            elif k == K_LAT:
                cause.append("launch"), name.append(str(g.rt_name[g.launch[ref]]) if g.launch[ref] >= 0 else "")
            elif k == K_DEP:
                src = int(g.wait_src[ref])
                cause.append("dependency"), name.append(str(g.name[src]) if src >= 0 else "")
            else:
                cause.append(None), name.append(str(g.name[ref]))
        out.append(Path(np.array(t0, dtype=np.int64), np.array(t1, dtype=np.int64), np.array(kind, dtype=np.int8),
                        np.array(cause, dtype=object), np.array(act, dtype=object), np.array(name, dtype=object),
                        np.array(frame, dtype=object), np.array(op, dtype=np.int64), int(start), int(end), reason,
                        int(anchor)))
    return out


# ---------------------------------------------------------------- report records


def _ms(ns: float) -> float:
    return round(float(ns) / 1e6, 6)


def path_record(p: Path, t0_ns: int, top: int = TOP_SEGMENTS) -> CriticalPath:
    """The report's record of a path (times from the trace start ``t0_ns``): its kinds, the
    host time by cause, the HTA-comparable length and its ``top`` longest segments."""
    d = p.dur
    pick = np.sort(np.argsort(-d, kind="stable")[:top])
    segs = [PathSegment(start_ms=_ms(p.t0[j] - t0_ns), duration_ms=_ms(d[j]), kind=PATH_KINDS[int(p.kind[j])],
                        cause=p.cause[j], activity=p.activity[j], name=str(p.name[j])[:200],
                        frame=None if p.frame[j] is None else str(p.frame[j])[:200]) for j in pick.tolist()]
    return CriticalPath(start_ms=_ms(p.start_ns - t0_ns), end_ms=_ms(p.end_ns - t0_ns), length_ms=_ms(p.length_ns),
                        start_reason=p.reason, ms_by_kind={k: _ms(v) for k, v in p.ns_by_kind().items()},
                        host_ms_by_cause={k: _ms(v) for k, v in sorted(p.host_ns_by_cause().items(), key=lambda kv: -kv[1])},
                        hta_comparable_ms=_ms(p.hta_comparable_ns()), segment_count=int(len(d)), segments=segs)


def host_frames(paths: list[Path], top: int = TOP_FRAMES) -> list[PathFrame]:
    """Host time on ``paths`` by (frame, cause, activity), longest first."""
    acc: dict[tuple, int] = {}
    for p in paths:
        m = np.flatnonzero(p.kind == K_HOST)
        for f, c, a, d in zip(p.frame[m].tolist(), p.cause[m].tolist(), p.activity[m].tolist(), p.dur[m].tolist()):
            k = (f or "", c, a)
            acc[k] = acc.get(k, 0) + d
    rows = sorted(acc.items(), key=lambda kv: -kv[1])[:top]
    return [PathFrame(frame=f, cause=c, activity=a, duration_ms=_ms(v)) for (f, c, a), v in rows]


def phase_summaries(paths: Paths, steps: pd.DataFrame) -> list[PathPhase]:
    """Per step phase: the steps' path lengths (p50), time by kind and host cause summed
    over the steps, the host frames on the paths, and where the overlap breaks (steps whose
    path holds host time)."""
    out = []
    if not paths.steps:
        return out
    ph = steps["phase"].to_numpy(dtype=object)
    names = steps["name"].to_numpy(dtype=object)
    for phase in dict.fromkeys(ph[i] for i in sorted(paths.steps)):
        keys = [i for i in sorted(paths.steps) if ph[i] == phase]
        ps = [paths.steps[i] for i in keys]
        lengths = np.array([p.length_ns for p in ps], dtype=np.float64)
        kinds: dict[str, int] = {}
        causes: dict[str, int] = {}
        host_steps = []
        for i, p in zip(keys, ps):
            for k, v in p.ns_by_kind().items():
                kinds[k] = kinds.get(k, 0) + v
            hc = p.host_ns_by_cause()
            for k, v in hc.items():
                causes[k] = causes.get(k, 0) + v
            h = sum(hc.values())
            if h > 0:
                host_steps.append((h, i, p))
        total = float(lengths.sum())
        host_steps.sort(key=lambda x: -x[0])
        breaks = [f"{str(names[i])[:80]}: {_ms(h):.3f} ms host" + (f" in {fr[0].frame}" if (fr := host_frames([p], 1)) and fr[0].frame else "")
                  for h, i, p in host_steps[:3]]
        out.append(PathPhase(
            phase=phase, steps=len(ps), length_p50_ms=_ms(float(np.median(lengths))), length_total_ms=_ms(total),
            ms_by_kind={k: _ms(v) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
            share_by_kind={k: round(v / total, 6) if total > 0 else 0.0 for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
            host_ms_by_cause={k: _ms(v) for k, v in sorted(causes.items(), key=lambda kv: -kv[1])},
            host_frames=host_frames(ps), steps_with_host=len(host_steps), host_breaks=breaks))
    return out


def path_section(paths: Paths, steps: pd.DataFrame, t0_ns: int) -> PathSection:
    """The report's ``critical_path`` section."""
    return PathSection(phases=phase_summaries(paths, steps),
                       window=None if paths.window is None else path_record(paths.window, t0_ns))
