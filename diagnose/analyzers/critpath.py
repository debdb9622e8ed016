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

from functools import cached_property

import msgspec
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


class Path(msgspec.Struct, dict=True):
    """One critical path: segments in time order (arrays, absolute ns) and where it starts.

    Attributes:
        t0, t1: segment bounds; kind: index into PATH_KINDS; cause: gap cause (None on GPU
            activities); activity: host activity (None off the host); name: what the
            segment is (activity, call, innermost host event); frame: host frame; op: graph
            index of the GPU activity of the segment (-1 none).
        start_ns, end_ns: where the path starts and ends; reason: one of PATH_STARTS;
        anchor_ns: the step's anchor (the window start without steps).
        hkey, hkeys: per segment, the index of its host piece's (frame, cause, activity) in
            ``hkeys`` (-1 off the host).
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
    hkey: np.ndarray  # per segment, a code into ``hkeys`` (-1: not host time)
    hkeys: list  # the (frame, cause, activity) triples of host pieces

    @property
    def dur(self) -> np.ndarray:
        return self.t1 - self.t0

    @property
    def length_ns(self) -> int:
        return self.end_ns - self.start_ns

    def ns_by_kind(self) -> dict[str, int]:
        tot = np.bincount(self.kind.astype(np.int64), weights=self.dur, minlength=len(PATH_KINDS))
        return {k: int(tot[i]) for i, k in enumerate(PATH_KINDS) if tot[i] > 0}

    @cached_property
    def host_ns_by_frame(self) -> dict[tuple[str, str, str], int]:
        """Host time (ns) by (frame, cause, activity), keys in order of first appearance."""
        m = self.kind == K_HOST
        if not m.any():
            return {}
        c, d = self.hkey[m], self.dur[m]  # sums per code, in order of first appearance
        o = np.argsort(c, kind="stable")
        cs = c[o]
        starts = np.flatnonzero(np.concatenate(([True], cs[1:] != cs[:-1])))
        sums = np.add.reduceat(d[o], starts)
        firsts = o[starts]
        return {self.hkeys[int(cs[starts[i]])]: int(sums[i]) for i in np.argsort(firsts, kind="stable").tolist()}

    def host_ns_by_cause(self) -> dict[str, int]:
        """Host time (ns) by cause, causes in order of first appearance."""
        out: dict[str, int] = {}
        for (_f, c, _a), v in self.host_ns_by_frame.items():
            out[c] = out.get(c, 0) + v
        return out

    def hta_comparable_ns(self) -> int:
        """Length with HTA 0.6.1's zero-weight parts left out (module docstring)."""
        w = (self.kind != K_DEP) & (self.kind != K_RET)
        host = self.kind == K_HOST
        weighted = np.array([a in HTA_WEIGHTED for _f, _c, a in self.hkeys] + [False], dtype=bool)
        w &= ~host | weighted[self.hkey]  # the host pieces' activities by code; -1: the appended False
        return int(self.dur[w].sum())


class Paths(msgspec.Struct):
    """The critical paths of an analysis: one per step with GPU work (``steps``: step row ->
    :class:`Path`), or one for the whole window when the trace has no steps (``window``)."""

    steps: dict[int, Path] = msgspec.field(default_factory=dict)
    window: Path | None = None
    graph: D.DepGraph | None = None

    def all(self) -> list[Path]:
        return list(self.steps.values()) + ([self.window] if self.window is not None else [])


# ---------------------------------------------------------------- the walk


class _Walker:
    """Backward walk over the graph. Runs of GPU activities bound by stream order or a
    cross-stream wait are followed through one precomputed hop list (``nxt``) and turned into
    segments with numpy; launch calls and host stretches are walked one by one."""

    def __init__(self, g: D.DepGraph) -> None:
        self.g = g
        unexplained = (g.start - g.bind_ns) > D.UNEXPLAINED_NS
        hop = np.where(g.bind == D.BIND_STREAM, g.prev, np.where(g.bind == D.BIND_WAIT, g.wait_src, -1))
        self.nxt = np.where(unexplained, -1, hop)  # numpy: a walk reads only its own path's elements
        self.start = g.start
        self.block = g.blocking
        self.limit = 2 * (g.n + len(g.rt_start)) + 16
        self._keys: dict[bool, np.ndarray] = {}

    def _key(self, unlaunched_previous: bool) -> np.ndarray:
        """Per activity, the time it counts as launched: before a step's anchor, it is the
        previous step's work (never, for unlaunched work outside a step's view)."""
        k = self._keys.get(unlaunched_previous)
        if k is None:
            g = self.g
            alt = np.iinfo(np.int64).min if unlaunched_previous else g.start
            k = self._keys[unlaunched_previous] = np.where(g.launch_start != NO_TIME, g.launch_start, alt)
        return k

    def walk(self, last: int, floor: int, anchor: int, unlaunched_previous: bool = True) -> tuple[list, list, int, str]:
        """(chunks of segments in reverse time order, host stretches (tid, a, b), path start,
        start reason). A chunk is arrays (t0, t1, kind, ref): ``ref`` is the GPU activity for
        GPU kinds, gaps, latencies and waits, the stretch for host, the call for sync returns.
        An activity launched before ``anchor`` is the previous step's work, and so is one with
        no launch in the trace when ``unlaunched_previous`` (a step's view)."""
        g, nxt, start, key = self.g, self.nxt, self.start, self._key(unlaunched_previous)
        chunks: list = []
        stretches: list[tuple[int, int, int]] = []
        state = {"cur": int(g.end[last])}
        floor_reason = "anchor" if floor <= anchor else "previous_step"

        def seg(t0: int, t1: int, kind: int, ref: int) -> None:
            t1 = min(t1, state["cur"])
            t0 = min(max(t0, floor), t1)
            if t1 > t0:
                chunks.append((np.array([t0]), np.array([t1]), np.array([kind], dtype=np.int8), np.array([ref])))
                state["cur"] = t0

        i = last
        for _ in range(self.limit):
            run = [i]
            stop = None
            while True:
                if start[i] <= floor:
                    stop = (floor, floor_reason)
                    break
                j = nxt[i]
                if j < 0:
                    break
                if key[j] < anchor:
                    stop = (floor, "previous_step")
                    break
                i = j
                run.append(i)
            self._emit_run(run, chunks, state, floor, stop is not None)
            if stop is not None:
                return chunks, stretches, stop[0], stop[1]
            s_i, b = int(g.start[i]), int(g.bind[i])
            if b == D.BIND_NONE:
                return chunks, stretches, s_i, "not_in_trace"
            if s_i - int(g.bind_ns[i]) > D.UNEXPLAINED_NS:
                return chunks, stretches, s_i, "outside_trace"
            tb = min(int(g.bind_ns[i]), s_i)  # the launch call's start
            seg(tb, s_i, K_LAT, i)
            if tb <= floor:
                return chunks, stretches, floor, floor_reason
            nxt_op, at = self._host(int(g.rt_tid[g.launch[i]]), tb, floor, seg, stretches, key, anchor)
            if nxt_op is None:
                return chunks, stretches, at, floor_reason if at <= floor else "previous_step"
            i = nxt_op
        return chunks, stretches, state["cur"], "not_in_trace"  # pragma: no cover - the walk always ends

    def _emit_run(self, run: list[int], chunks: list, state: dict, floor: int, stopped: bool) -> None:
        """Segments of a run of activities (latest first), each with the gap or wait before
        it up to the previous one in the run (and, when the run stopped at the floor or at
        the previous step, up to the floor), clipped as the walk goes back in time."""
        g = self.g
        idx = np.array(run, dtype=np.int64)
        m = len(idx)
        t1 = np.empty(2 * m, dtype=np.int64)
        t0 = np.empty(2 * m, dtype=np.int64)
        t1[0::2], t0[0::2] = g.end[idx], g.start[idx]  # the activities
        t1[1::2] = g.start[idx]  # the gap or wait before each
        t0[1::2] = np.concatenate((g.end[idx[1:]], [floor if stopped else g.start[idx[-1]]]))
        kind = np.empty(2 * m, dtype=np.int8)
        kind[0::2] = g.kind[idx]
        kind[1::2] = np.where(g.bind[idx] == D.BIND_WAIT, K_DEP, K_GAP)
        ref = np.repeat(idx, 2)
        seq = np.empty(4 * m + 1, dtype=np.int64)
        seq[0] = state["cur"]
        seq[1::2], seq[2::2] = t1, np.maximum(t0, floor)
        c = np.minimum.accumulate(seq)
        c1, c0 = c[1::2], c[2::2]
        keep = c1 > c0
        if keep.any():
            chunks.append((c0[keep], c1[keep], kind[keep], ref[keep]))
        state["cur"] = int(c[-1])

    def _host(self, tid: int, t: int, floor: int, seg, stretches, key, anchor) -> tuple[int | None, int]:
        """Host walk on thread ``tid`` back from ``t``: (the next GPU activity: a blocking
        call's release, or None where the path starts; that start)."""
        g = self.g
        blk = self.block.get(tid)
        k = int(np.searchsorted(blk[0], t, side="right")) - 1 if blk is not None else -1
        if k < 0 or blk[0][k] <= floor:
            stretches.append((tid, floor, t))
            seg(floor, t, K_HOST, len(stretches) - 1)
            return None, floor
        b_end, call, rel = int(blk[0][k]), int(blk[1][k]), int(blk[2][k])
        stretches.append((tid, b_end, t))
        seg(b_end, t, K_HOST, len(stretches) - 1)
        r0 = max(int(g.end[rel]), floor)
        seg(r0, b_end, K_RET, call)
        if key[rel] < anchor or g.end[rel] <= floor:
            return None, r0
        return rel, r0


# ---------------------------------------------------------------- paths of an analysis


def step_paths(g: D.DepGraph, steps: pd.DataFrame, t0_ns: int) -> Paths:
    """The critical path of every step with GPU work (``steps``: the step table, with
    ``anchor_ns``), or of the GPU window (from the first GPU activity's start) without steps.
    ``t0_ns``: the trace start (kept for callers; times stay absolute)."""
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
    else:  # the GPU window (README "Definitions"): from the first GPU activity to the last
        last = int(np.argmax(g.end))
        first = int(g.start.min())
        segs, stretches, start, reason = w.walk(last, first, first, unlaunched_previous=False)
        raw.append((None, segs, stretches, start, reason, first, int(g.end[last])))
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
    """Paths from raw walks: host stretches classified in one batch, segment names and
    causes read with numpy."""
    flat: list[tuple[int, int, int]] = []
    base = []
    for r in raw:
        base.append(len(flat))
        flat.extend(r[2])
    pieces = classify(g, flat)
    pkey, ptable = pieces.keys()
    out = []
    for (_, chunks, _stretches, start, reason, anchor, end), b in zip(raw, base):
        if chunks:
            t0 = np.concatenate([c[0] for c in reversed(chunks)])
            t1 = np.concatenate([c[1] for c in reversed(chunks)])
            kind = np.concatenate([c[2] for c in reversed(chunks)])
            ref = np.concatenate([c[3] for c in reversed(chunks)])
            o = np.argsort(t0, kind="stable")  # each chunk is in reverse time order
            t0, t1, kind, ref = t0[o], t1[o], kind[o], ref[o]
        else:
            t0 = t1 = ref = np.zeros(0, dtype=np.int64)
            kind = np.zeros(0, dtype=np.int8)
        out.append(_described(g, t0, t1, kind, ref, pieces, b, int(start), int(end), reason, int(anchor), pkey, ptable))
    return out


def _described(g: D.DepGraph, t0, t1, kind, ref, pieces, base: int, start: int, end: int, reason: str, anchor: int,
               pkey: np.ndarray, ptable: list) -> Path:
    """A :class:`Path` from raw segments: names and causes; host segments cut into pieces
    (``pkey``, ``ptable``: the pieces' (frame, cause, activity) codes and triples, carried)."""
    n = len(t0)
    cause = np.full(n, None, dtype=object)
    name = np.full(n, "", dtype=object)
    op = np.where(np.isin(kind, [K_RET, K_HOST]), -1, ref)
    gpu = kind < K_GAP
    name[gpu] = g.name[ref[gpu]]
    m = kind == K_GAP
    if m.any():
        r = ref[m]
        p = np.maximum(g.prev[r], 0)
        same = g.graph[r] & (g.prev[r] >= 0) & (g.launch[p] == g.launch[r])
        cause[m] = np.where(same, "graph", "switch")
        name[m] = g.name[r]
    m = kind == K_LAT
    if m.any():
        cause[m] = "launch"
        name[m] = np.where(g.launch[ref[m]] >= 0, g.rt_name[np.maximum(g.launch[ref[m]], 0)], "")
    m = kind == K_DEP
    if m.any():
        src = g.wait_src[ref[m]]
        cause[m] = "dependency"
        name[m] = np.where(src >= 0, g.name[np.maximum(src, 0)], "")
    m = kind == K_RET
    if m.any():
        cause[m] = "host_blocked"
        name[m] = g.rt_name[ref[m]]
    act = np.full(n, None, dtype=object)
    frame = np.full(n, None, dtype=object)
    host = np.flatnonzero(kind == K_HOST)
    if len(host) == 0:
        return Path(t0, t1, kind, cause, act, name, frame, op, start, end, reason, anchor, np.full(n, -1, dtype=np.int64), [])
    # host segments: replaced by their pieces
    keep = np.ones(n, dtype=bool)
    keep[host] = False
    parts = [(t0[keep], t1[keep], kind[keep], cause[keep], act[keep], name[keep], frame[keep], op[keep],
              np.full(int(keep.sum()), -1, dtype=np.int64))]
    seg, h0, h1, row = pieces.clipped(base + ref[host], t0[host], t1[host])
    if len(seg):
        k = len(seg)
        parts.append((h0, h1, np.full(k, K_HOST, dtype=np.int8), *pieces.text_at(row), np.full(k, -1, dtype=np.int64),
                      pkey[row]))
    cols = [np.concatenate([p[i] for p in parts]) for i in range(9)]
    o = np.argsort(cols[0], kind="stable")
    return Path(*(c[o] for c in cols[:8]), start, end, reason, anchor, cols[8][o], ptable)


# ---------------------------------------------------------------- report records


def _ms(ns: float) -> float:
    return round(float(ns) / 1e6, 6)


def path_record(p: Path, t0_ns: int, top: int = TOP_SEGMENTS) -> CriticalPath:
    """The report's record of a path (times from the trace start ``t0_ns``): its kinds, the
    host time by cause, the HTA-comparable length and its ``top`` longest segments."""
    d = p.dur
    if len(d) > top:  # the ``top`` longest (ties: the earlier), as a stable argsort's first ``top``
        cand = np.flatnonzero(d >= np.partition(d, len(d) - top)[len(d) - top])
        pick = np.sort(cand[np.argsort(-d[cand], kind="stable")[:top]])
    else:
        pick = np.arange(len(d))
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
        for k, v in p.host_ns_by_frame.items():
            acc[k] = acc.get(k, 0) + v
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
