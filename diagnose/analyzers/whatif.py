"""What-if: how much shorter each step would be if some of its time went away.

A :class:`Scenario` removes host time of some causes (all of it, or only under python frames,
CPU ops or ranges whose name matches a regex: ``--remove CAUSE[:FRAME-REGEX]``), the waits
of some causes (``launch``: launch latency; ``switch``/``graph``: gaps between queued
kernels; ``dependency``: cross-stream waits; ``host_blocked``: blocking calls return as
soon as they are called; ``collective_wait``: the part of collective kernels spent waiting for
peers), and speeds up kernel categories (``--speedup CATEGORY=FACTOR``, ``inf`` removes them;
a faster interconnect shortens a collective's transfer, never its wait for peers). ``idle``
removes every internal (not external) cause of idle time at once. The causes are the cause
table's (``diagnose/data/causes.yaml``), named on the path as the gap classifier names them.

Each step is **re-timed** on the dependency graph (:mod:`diagnose.analyzers.depgraph`), from
its path's start (held fixed: the anchor or the previous step's GPU end) to its last GPU
end, in time order: a GPU activity starts at the latest of what it waited for (stream
predecessor, cross-stream source, launch call) plus the lag it had (its launch latency, the
gap after its predecessor, or a wait the trace cannot explain), less the removed lag; a host
call starts after the previous call of its thread plus the host time between them less the
removed part; a blocking call returns at the later of its start and the end of the GPU work
it waited for, plus its return latency. With nothing removed every time is the trace's own;
the saving of a step is its last GPU end minus the re-timed one. Max and plus only, so a
saving is never negative, never more than the time removed on the step's path (the path is
still a chain of the re-timed graph), and zero when nothing on the path is removed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from pandas import unique as pd_unique

from diagnose.analyzers import depgraph as D
from diagnose.analyzers.hostpath import DEFAULT_CAUSE, cause_timeline, path_causes
from diagnose.analyzers.nesting import lexsort, sorted_unique
from diagnose.errors import DiagnoseError
from diagnose.patterns import check_pattern, clip, outside_pattern
from diagnose.vocab import CATEGORIES, EXTERNAL_CAUSES, GAP_CAUSES

#: Causes of waits the re-timing removes besides host time (module docstring), and
#: ``collective_wait``: the part of collective kernels spent waiting for peers.
WAIT_CAUSES = ("launch", "switch", "graph", "dependency", "host_blocked", "collective_wait")
#: Causes ``--remove`` takes (names of the cause table, ``diagnose/data/causes.yaml``): those a
#: path's host time can have (:func:`diagnose.analyzers.hostpath.path_causes`) and the waits
#: above, in the table's order; and ``idle`` for every internal one.
REMOVABLE = tuple(c for c in GAP_CAUSES if c in WAIT_CAUSES or c in path_causes()) + ("idle",)
#: What ``idle`` removes: the internal causes of idle time (not collective_wait: busy GPU time).
INTERNAL = tuple(c for c in REMOVABLE if c not in ("idle", "collective_wait") and c not in EXTERNAL_CAUSES)
#: When set (tests only): the event-by-event walk to re-time with instead of
#: :func:`_walk_fast`, called as ``REFERENCE_WALK(order, typ, ref, d_op, d_cs, d_ce, op_args,
#: cs_args, ce_args, floor)`` with lists (``tests/whatif_reference.py``).
REFERENCE_WALK = None
_CALL_END, _CALL_START, _OP_START = 0, 1, 2  # order of simultaneous events: what each depends on first


@dataclass(frozen=True)
class Scenario:
    """What to remove: ``remove`` ((cause, frame regex or None), ...), ``speedup``
    ((category, factor >= 1; inf: removed), ...). ``ops``: explicit per-activity duration
    factors in [0, 1] (graph index -> factor kept; tests and rules that name activities)."""

    remove: tuple[tuple[str, str | None], ...] = ()
    speedup: tuple[tuple[str, float], ...] = ()
    ops: tuple[tuple[int, float], ...] = ()
    host: tuple[tuple[int, int, int], ...] = ()  # explicit host intervals (tid, start, end) removed

    @property
    def label(self) -> str:
        parts = [f"--remove {c}" + (f":{rx}" if rx else "") for c, rx in self.remove]
        parts += [f"--speedup {c}={'inf' if math.isinf(f) else f'{f:g}'}" for c, f in self.speedup]
        return " ".join(parts) or "(nothing removed)"

    def causes(self) -> set[str]:
        out: set[str] = set()
        for c, _ in self.remove:
            out |= set(INTERNAL) if c == "idle" else {c}
        return out


def parse_remove(spec: str) -> tuple[str, str | None]:
    """``CAUSE[:FRAME-REGEX]`` -> (cause, regex or None).

    Raises:
        DiagnoseError: an unknown cause, or a regex that does not compile or nests repeats
            (:func:`diagnose.patterns.check_pattern`; it is matched on the first
            :data:`~diagnose.patterns.MATCH_PREFIX_CHARS` characters of each name).
    """
    cause, _, rx = spec.partition(":")
    cause = cause.strip()
    if cause not in REMOVABLE:
        raise DiagnoseError(f"--remove {spec!r}: unknown cause {cause!r} (one of: {', '.join(REMOVABLE)})")
    if rx:
        if len(rx) > 500:
            raise DiagnoseError(f"--remove {spec[:40]!r}...: the frame regex is longer than 500 characters")
        check_pattern(rx, f"--remove {cause}: frame regex")
    return cause, rx or None


def parse_speedup(spec: str) -> tuple[str, float]:
    """``CATEGORY=FACTOR`` (a kernel category, a factor >= 1 or ``inf``) -> (category, factor).

    Raises:
        DiagnoseError: an unknown category or a factor that is not a number >= 1.
    """
    cat, eq, fac = spec.partition("=")
    cat = cat.strip()
    if not eq or cat not in CATEGORIES:
        raise DiagnoseError(f"--speedup {spec!r}: expected CATEGORY=FACTOR with a category among {', '.join(CATEGORIES)}")
    try:
        f = float(fac)
    except ValueError:
        f = float("nan")
    if not f >= 1:
        raise DiagnoseError(f"--speedup {spec!r}: the factor must be a number >= 1 (or inf: the kernels take no time)")
    return cat, f


def scenario(removes: list[str] | tuple[str, ...] = (), speedups: list[str] | tuple[str, ...] = ()) -> Scenario:
    """A scenario from ``--remove`` and ``--speedup`` specs (:func:`parse_remove`, :func:`parse_speedup`)."""
    return Scenario(remove=tuple(parse_remove(s) for s in removes), speedup=tuple(parse_speedup(s) for s in speedups))


# ---------------------------------------------------------------- what a scenario removes


@dataclass
class _Removal:
    """A scenario applied to a graph: per activity the duration removed and whether its lag
    goes, whether blocking calls still wait, and per thread the host time removed."""

    op_removed: np.ndarray  # ns, per activity
    lag_removed: np.ndarray  # bool, per activity
    unblock: bool
    host: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)  # tid -> (starts, ends, cumulative ns)

    def measure(self, tid: int, x: int) -> int:
        """Host time removed on ``tid`` before ``x`` (ns)."""
        h = self.host.get(tid)
        if h is None:
            return 0
        s, e, cum = h
        k = int(np.searchsorted(s, x, side="right")) - 1
        if k < 0:
            return 0
        return int(cum[k] + min(max(x - int(s[k]), 0), int(e[k] - s[k])))


def _removal(g: D.DepGraph, sc: Scenario) -> _Removal:
    causes = sc.causes()
    dur = g.end - g.start
    keep = np.ones(g.n, dtype=np.float64)
    for cat, f in sc.speedup:
        m = g.category_id == CATEGORIES.index(cat)
        keep[m] = np.minimum(keep[m], 0.0 if math.isinf(f) else 1.0 / f)
    if sc.ops:  # per-activity scales (a roofline what-if: one per kernel)
        idx, f = zip(*sc.ops)
        np.minimum.at(keep, np.asarray(idx, dtype=np.int64), np.asarray(f, dtype=np.float64))
    # a faster interconnect shortens a collective's transfer, not its wait for peers
    wait = g.cache.get("collective_wait_ns")
    wait = np.zeros(g.n, dtype=np.int64) if wait is None else np.minimum(wait, dur)
    op_removed = np.rint((dur - wait) * (1.0 - keep)).astype(np.int64)
    if any(c == "collective_wait" for c, _ in sc.remove):
        op_removed += wait
    lag = np.zeros(g.n, dtype=bool)
    plain = [c for c, rx in sc.remove if rx is None]
    plain_causes = set(INTERNAL) if "idle" in plain else set(plain)
    if plain_causes & {"launch", "switch", "graph", "dependency"}:
        p = np.maximum(g.prev, 0)
        same = g.graph & (g.prev >= 0) & (g.launch[p] == g.launch)
        if "launch" in plain_causes:
            lag |= g.bind == D.BIND_LAUNCH
        if "dependency" in plain_causes:
            lag |= g.bind == D.BIND_WAIT
        if "graph" in plain_causes:
            lag |= (g.bind == D.BIND_STREAM) & same
        if "switch" in plain_causes:
            lag |= (g.bind == D.BIND_STREAM) & ~same
    r = _Removal(op_removed, lag, "host_blocked" in plain_causes)
    tids = set(pd_unique(g.rt_tid).tolist()) | {t for t, _, _ in sc.host}
    if causes or sc.host:
        for tid in tids:
            s, e = _host_removed(g, int(tid), sc)
            if len(s):
                r.host[int(tid)] = (s, e, np.concatenate(([0], np.cumsum(e - s)))[:-1])
    return r


def _host_removed(g: D.DepGraph, tid: int, sc: Scenario) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint sorted host intervals of thread ``tid`` the scenario removes."""
    from diagnose.analyzers.hostpath import _merge

    tl = cause_timeline(g, tid)
    lo, hi = _thread_span(g, tid)
    parts_s, parts_e = [], []
    for cause, rx in sc.remove:
        cs = set(INTERNAL) if cause == "idle" else {cause}
        s, e = _cause_set(tl, cs, lo, hi)
        if rx is not None and len(s):
            fs, fe = _frame_set(g, tid, rx)
            s, e = _intersect(s, e, fs, fe)
        parts_s.append(s)
        parts_e.append(e)
    ex = [(a, b) for t, a, b in sc.host if t == tid]
    if ex:
        parts_s.append(np.array([a for a, _ in ex], dtype=np.int64))
        parts_e.append(np.array([b for _, b in ex], dtype=np.int64))
    if not parts_s:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return _merge(np.concatenate(parts_s), np.concatenate(parts_e))


def _thread_span(g: D.DepGraph, tid: int) -> tuple[int, int]:
    """(first start, last end) of thread ``tid``'s runtime calls, operators, python frames and
    ranges (0 for what it lacks), once per graph."""
    key = ("thread_span", tid)
    hit = g.cache.get(key)
    if hit is not None:
        return hit
    m = g.rt_tid == tid
    lo = int(g.rt_start[m].min()) if m.any() else 0
    hi = int(g.rt_end[m].max()) if m.any() else 0
    tr = g.trace
    for f in (tr.cpu_ops, tr.python_frames, tr.annotations):
        if f is not None and len(f):
            mine = f["tid"].to_numpy() == tid
            if mine.any():
                lo = min(lo, int(f["start_ns"].to_numpy()[mine].min()))
                hi = max(hi, int(f["end_ns"].to_numpy()[mine].max()))
    g.cache[key] = (lo, hi)
    return lo, hi


def _cause_set(tl, causes: set[str], lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """Host time of ``causes`` within [lo, hi] as disjoint intervals."""
    if DEFAULT_CAUSE not in causes:
        m = np.isin(tl.cause, list(causes))
        return tl.start[m], tl.end[m]
    other = ~np.isin(tl.cause, list(causes))  # the complement of the other causes' pieces
    bs, be = tl.start[other], tl.end[other]
    s = np.concatenate(([lo], be))
    e = np.concatenate((bs, [hi]))
    s, e = np.maximum(s, lo), np.minimum(e, hi)
    keep = e > s
    return s[keep], e[keep]


def _frame_set(g: D.DepGraph, tid: int, rx: str) -> tuple[np.ndarray, np.ndarray]:
    """Union of the host events of ``tid`` (python frames, CPU ops, ranges, runtime calls)
    whose name matches ``rx``."""
    from diagnose.analyzers.hostpath import _merge
    from diagnose.trace.model import per_unique

    pat = outside_pattern(rx)
    if pat is None:  # parse_remove refused it already: match nothing
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    tr = g.trace
    ss, es = [], []
    for f in (tr.python_frames, tr.cpu_ops, tr.annotations, tr.runtime):
        if f is None or not len(f):
            continue
        sub = f[f["tid"].to_numpy() == tid]
        if not len(sub):
            continue
        hit = per_unique(sub["name"], lambda u: bool(pat.search(clip(str(u)))))
        ss.append(sub["start_ns"].to_numpy(dtype=np.int64)[hit])
        es.append(sub["end_ns"].to_numpy(dtype=np.int64)[hit])
    if not ss:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return _merge(np.concatenate(ss), np.concatenate(es))


def _intersect(a0, a1, b0, b1) -> tuple[np.ndarray, np.ndarray]:
    """Intersection of two sets of disjoint sorted intervals."""
    if not len(a0) or not len(b0):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    pts = sorted_unique(np.concatenate((a0, a1, b0, b1)))
    x0, x1 = pts[:-1], pts[1:]
    mid = x0 + (x1 - x0) // 2

    def covered(s, e):
        k = np.searchsorted(s, mid, side="right") - 1
        return (k >= 0) & (mid < e[np.maximum(k, 0)])

    m = covered(a0, a1) & covered(b0, b1)
    return x0[m], x1[m]


# ---------------------------------------------------------------- re-timing


class _Chains:
    """The host calls the re-timing follows: the launch calls of GPU work and the calls that
    blocked on it, per thread in start order, with the previous one of the thread."""

    def __init__(self, g: D.DepGraph) -> None:
        rows = [g.launch[g.launch >= 0]]
        rel = np.full(len(g.rt_start), -1, dtype=np.int64)
        for _t, (_e, calls, rels) in g.blocking.items():
            rel[calls] = rels
            rows.append(calls)
        rows = sorted_unique(np.concatenate(rows)) if rows else np.zeros(0, np.int64)
        o = lexsort((rows, g.rt_start[rows]))
        self.row = rows[o]
        self.start, self.end, self.tid = g.rt_start[self.row], g.rt_end[self.row], g.rt_tid[self.row]
        self.release = rel[self.row]
        prev = np.full(len(self.row), -1, dtype=np.int64)
        by = np.lexsort((np.arange(len(self.row)), self.tid))
        same = np.zeros(len(by), dtype=bool)  # no host call at all (a kernels-only trace): none
        same[1:] = self.tid[by][1:] == self.tid[by][:-1]
        prev[by[same]] = by[np.flatnonzero(same) - 1]
        self.prev = prev
        self.of_row = np.full(len(g.rt_start), -1, dtype=np.int64)  # runtime row -> its position (-1: none)
        self.of_row[self.row] = np.arange(len(self.row))
        self._orders: dict[tuple[int, int, int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def walk_order(self, g: D.DepGraph, o_lo: int, o_hi: int, c_lo: int, c_hi: int) -> tuple[np.ndarray, ...]:
        """The events of the window of activities [o_lo, o_hi) and calls [c_lo, c_hi) as
        :func:`retime` walks them: (type, window position, walk order) of the call ends, call
        starts and activity starts concatenated, ordered by time then type. Kept per window:
        every scenario re-timing a step walks the same order."""
        key = (o_lo, o_hi, c_lo, c_hi)
        got = self._orders.get(key)
        if got is None:
            calls, ops = np.arange(c_lo, c_hi), np.arange(o_lo, o_hi)
            t = np.concatenate((self.end[calls], self.start[calls], g.start[ops]))
            typ = np.concatenate((np.full(len(calls), _CALL_END), np.full(len(calls), _CALL_START),
                                  np.full(len(ops), _OP_START)))
            ref = np.concatenate((calls - c_lo, calls - c_lo, ops - o_lo))
            got = self._orders[key] = (typ, ref, lexsort((typ, t)))
        return got


def _chains(g: D.DepGraph) -> _Chains:
    c = g.cache.get("chains")
    if c is None:
        c = g.cache["chains"] = _Chains(g)
    return c


def retime(g: D.DepGraph, start_ns: int, end_ns: int, members: np.ndarray, removal: _Removal) -> tuple[int, int]:
    """Re-time the window [start_ns, end_ns] (a path's span) under ``removal``: (the new end
    of ``members``' GPU work, the time removed in the window: host time on every thread, GPU
    work and lags of activities starting in it).

    The events (host call ends, call starts, activity starts, in that order when simultaneous)
    are walked in time order; each one's shift (how much earlier it happens) reads the shifts
    of the events it waited for that were walked before it (0 for the others and for those
    outside the window). What does not depend on other shifts (their indices, lags, the host
    time removed between two times) is computed for the whole window first."""
    ch = _chains(g)
    o_lo = int(np.searchsorted(g.start, start_ns, side="left"))
    o_hi = int(np.searchsorted(g.start, end_ns, side="right"))
    c_lo, c_hi = (int(x) for x in np.searchsorted(ch.start, [start_ns, end_ns + 1]))
    ops = np.arange(o_lo, o_hi)
    calls = np.arange(c_lo, c_hi)
    lag = g.start[ops] - g.bind_ns[ops]
    lag_gone = removal.lag_removed[ops] & (lag > 0)
    removed = int(removal.op_removed[ops].sum()) + int(np.where(lag_gone, lag, 0).sum())
    for tid in removal.host:
        removed += removal.measure(tid, end_ns) - removal.measure(tid, start_ns)
    if removal.unblock:  # a blocking call returns at once (_call_end_terms): its time in the window not removed above
        blk = calls[ch.release[calls] >= 0]
        if len(blk):
            s, e = ch.start[blk], np.minimum(ch.end[blk], end_ns)
            removed += int(np.maximum(e - s - (_measure(removal, ch.tid[blk], e) - _measure(removal, ch.tid[blk], s)), 0).sum())
    if removed == 0:
        return int(g.end[members].max()), 0
    typ, ref, order = ch.walk_order(g, o_lo, o_hi, c_lo, c_hi)
    op_args = _op_terms(g, ch, ops, np.where(lag_gone, 0, lag), removal, start_ns, (o_lo, o_hi), (c_lo, c_hi))
    cs_args = _call_start_terms(ch, calls, removal, start_ns, c_lo)
    ce_args = _call_end_terms(g, ch, calls, removal, (o_lo, o_hi))
    d_op = [0] * len(ops)  # activity -> how much earlier it ends (0 until walked)
    d_cs = [0] * len(calls)  # call -> how much earlier it starts
    d_ce = [0] * len(calls)  # call -> how much earlier it returns
    if REFERENCE_WALK is None:
        _walk_fast(order, typ, ref, len(ops), d_op, d_ce, op_args, cs_args, ce_args, start_ns)
    else:
        lists = ([a.tolist() for a in args] for args in (op_args, cs_args[:3], ce_args))  # the reference reads lists
        REFERENCE_WALK(order.tolist(), typ.tolist(), ref.tolist(), d_op, d_cs, d_ce, *lists, start_ns)
    m = members - o_lo
    inside = (m >= 0) & (m < len(ops))
    shift = np.zeros(len(members), dtype=np.int64)
    if inside.any():
        shift[inside] = np.asarray(d_op, dtype=np.int64)[m[inside]]
    return int((g.end[members] - shift).max()), removed


_NONE = -(1 << 62)  # an absent term of a max


def _in(idx: np.ndarray, lo_hi: tuple[int, int]) -> np.ndarray:
    """Window positions of graph indices ``idx`` (-1: none, or outside [lo, hi))."""
    lo, hi = lo_hi
    return np.where((idx >= lo) & (idx < hi), idx - lo, -1)


def _op_terms(g: D.DepGraph, ch: _Chains, ops: np.ndarray, lag: np.ndarray, removal: _Removal, floor: int,
              o_win: tuple[int, int], c_win: tuple[int, int]) -> tuple[np.ndarray, ...]:
    """Per activity of the window, what its shift reads (:func:`_walk_fast`): whether it binds,
    its start, removed duration, and per predecessor (stream, cross-stream, launch call) the
    time it allowed with the activity's lag added when it binds (:data:`_NONE`: none) and its
    window position (-1: its shift is 0)."""
    b = g.bind[ops]
    p, w, lc = g.prev[ops], g.wait_src[ops], g.launch[ops]
    t_p = np.where(p >= 0, g.end[np.maximum(p, 0)] + np.where(b == D.BIND_STREAM, lag, 0), _NONE)
    t_w = np.where(w >= 0, g.end[np.maximum(w, 0)] + np.where(b == D.BIND_WAIT, lag, 0), _NONE)
    t_l = np.where(lc >= 0, g.launch_start[ops] + np.where(b == D.BIND_LAUNCH, lag, 0), _NONE)
    ci = np.where(lc >= 0, ch.of_row[np.maximum(lc, 0)], -1) if len(ch.of_row) else np.full(len(ops), -1, dtype=np.int64)
    binds = (b != D.BIND_NONE) & (g.start[ops] >= floor)
    return (binds, g.start[ops], removal.op_removed[ops], t_p, _in(p, o_win), t_w, _in(w, o_win), t_l,
            np.where(ci >= 0, _in(ci, c_win), -1))


def _measure(removal: _Removal, tid: np.ndarray, x: np.ndarray) -> np.ndarray:
    """:meth:`_Removal.measure` of every (tid, x) pair."""
    out = np.zeros(len(x), dtype=np.int64)
    for t, (s, e, cum) in removal.host.items():
        m = np.flatnonzero(tid == t)
        if not len(m):
            continue
        k = np.searchsorted(s, x[m], side="right") - 1
        kk = np.maximum(k, 0)
        out[m] = np.where(k < 0, 0, cum[kk] + np.minimum(np.maximum(x[m] - s[kk], 0), e[kk] - s[kk]))
    return out


def _call_start_terms(ch: _Chains, calls: np.ndarray, removal: _Removal, floor: int, c_lo: int) -> tuple[np.ndarray, ...]:
    """Per host call of the window, what its start shift reads: which shift of the previous
    call of its thread it adds (0: none, 1: its return, 2: its start: the call is nested in
    it), that call's window position, the host time removed since the base time, and its
    thread."""
    s = ch.start[calls]
    p = ch.prev[calls]
    pp = np.maximum(p, 0)
    after = ch.end[pp] <= s
    kind = np.where(p < 0, 0, np.where(after, 1, 2))
    base_t = np.where(p < 0, floor, np.where(after, ch.end[pp], ch.start[pp]))
    early = base_t < floor
    kind = np.where(early, 0, kind)
    base_t = np.where(early, floor, base_t)
    tid = ch.tid[calls]
    add = _measure(removal, tid, s) - _measure(removal, tid, base_t)
    return kind, np.where(p >= c_lo, p - c_lo, -1), add, tid


def _call_end_terms(g: D.DepGraph, ch: _Chains, calls: np.ndarray, removal: _Removal,
                    o_win: tuple[int, int]) -> tuple[np.ndarray, ...]:
    """Per host call of the window, what its return shift reads: whether it blocked on GPU
    work (and still does), the host time it keeps or loses, and the GPU work's end and
    window position."""
    s, e, r = ch.start[calls], ch.end[calls], ch.release[calls]
    tid = ch.tid[calls]
    blocked = r >= 0
    g_end = np.where(blocked, g.end[np.maximum(r, 0)], 0)
    if removal.unblock:
        plain = np.where(blocked, e - s, _measure(removal, tid, e) - _measure(removal, tid, s))
        blocked = np.zeros(len(calls), dtype=bool)
    else:
        plain = _measure(removal, tid, e) - _measure(removal, tid, s)
    ret = e - np.maximum(s, g_end)
    return (blocked, plain, s, e, g_end, ret,
            np.where(blocked, _in(r, o_win), -1))


def _walk_fast(order, typ, ref, n_ops: int, d_op, d_ce, op_args, cs_args, ce_args, floor: int) -> None:
    """The shifts of every event of a window in ``order`` (:func:`retime`): an activity starts
    at the latest of what it waited for (the binding one plus its lag), within [floor, its
    start]; a call starts after the previous call of its thread plus the host time kept
    between them; a blocking call returns at the later of its start and its GPU work's end
    plus its return latency. Only the activities and the blocking calls' returns are walked
    (the event-by-event walk, ``tests/whatif_reference.py``, gives the same shifts): a call's
    start shift is a sum along its thread's chain of calls (each call in
    that walk adds its host time removed, and a call that did not block returns with its
    start's shift plus the host time removed in it) from the chain's last source: where the
    chain starts (in the window, or after a call starting before the floor: 0) or resumes
    after a blocking call (that call's return shift). Sources and sums come from numpy
    (:func:`~diagnose.analyzers.nesting.sum_to_marked_chains`: each thread's calls are one
    chain); in the walk, each read is of what
    that walk would have read then (0 for an event not walked yet): a Python step per
    activity and blocking call instead of three per call."""
    from diagnose.analyzers.nesting import sum_to_marked_chains

    bind_a, s_a, rem_a, tp_a, wp_a, tw_a, ww_a, tl_a, wl = op_args  # arrays (:func:`_op_terms`)
    kind, prv, add, ctid = cs_args  # arrays (:func:`_call_start_terms`, :func:`_call_end_terms`)
    blk, pln, cs_a, ce_a, gend_a, ret_a, rel_a = ce_args
    n_calls = len(kind)
    pos = np.empty(len(order), dtype=np.int64)
    pos[order] = np.arange(len(order))  # event -> its place in the walk
    # events were concatenated as: call ends, call starts, activity starts
    pos_ce, pos_cs, pos_op = pos[:n_calls], pos[n_calls:2 * n_calls], pos[2 * n_calls:]
    reset = (kind == 0) | (prv < 0)
    pp = np.maximum(prv, 0)
    after_block = ~reset & (kind == 1) & blk[pp] if n_calls else np.zeros(0, dtype=bool)
    # a call of no duration walked its return before its start: its return shift is its host
    # time removed alone, and the call after it starts a new sum from there
    zero = pos_ce < pos_cs
    after_zero = ~reset & (kind == 1) & ~blk[pp] & zero[pp] if n_calls else np.zeros(0, dtype=bool)
    base = np.where(after_zero, pln[pp], 0) if n_calls else np.zeros(0, dtype=np.int64)
    # any other call: its start shift is its previous call's start shift, plus that call's
    # host time removed when it returned first (kind 1), plus its own
    w = add + np.where(~reset & (kind == 1), pln[pp] if n_calls else 0, 0)
    root, acc = sum_to_marked_chains(ctid, np.where(reset, -1, prv), reset | after_block | after_zero, w)
    rr = np.maximum(root, 0)
    src = np.where((root >= 0) & after_block[rr], prv[rr], -1)  # the blocking call whose return shift starts the sum
    off = np.where(root >= 0, base[rr] + add[rr] + acc, 0) if n_calls else np.zeros(0, dtype=np.int64)
    wlc = np.maximum(wl, 0)
    ok_l = (wl >= 0) & (pos_cs[wlc] < pos_op) if n_calls else np.zeros(n_ops, dtype=bool)
    l_src_a = np.where(ok_l, src[wlc] if n_calls else -1, -1)  # an activity's launch call, when walked
    l_off_a = np.where(ok_l, off[wlc] if n_calls else 0, 0)
    l_src, l_off = l_src_a.tolist(), l_off_a.tolist()
    ok_b = pos_cs < pos_ce  # a blocking call's start walked before its return
    b_src = np.where(ok_b, src, -1).tolist()
    b_off = np.where(ok_b, off, 0).tolist()
    # Per activity, the terms of its max that read no shift, folded with numpy: the floor, a
    # cross-stream wait outside the window, a launch call whose chain has no blocking source.
    # An activity whose other terms all read no shift either is a "lone" one (its shift is
    # known before the walk, and set when walked: a read before then gives 0, as in the
    # reference walk); one reading only its stream predecessor's shift is a "chain" one.
    const = np.maximum(np.maximum(np.where(ww_a < 0, tw_a, _NONE), np.where(l_src_a < 0, tl_a - l_off_a, _NONE)), floor)
    alone = (ww_a < 0) & (l_src_a < 0)
    new_a = np.maximum(tp_a, const)
    lone_d = np.where(bind_a, np.maximum(s_a - new_a, 0), 0) + rem_a
    op_code = np.where(~bind_a | (alone & (wp_a < 0)), _LONE, np.where(alone, _CHAIN, _ANY)).astype(np.int8)
    t = np.asarray(typ)
    r_all = np.asarray(ref)
    to = t[order]
    is_blk_end = (to == _CALL_END) & blk[np.minimum(r_all[order], n_calls - 1)] if n_calls else np.zeros(len(order), dtype=bool)
    walk = order[(to == _OP_START) | is_blk_end]
    r_walk = r_all[walk]
    code = np.where(t[walk] == _OP_START, op_code[np.minimum(r_walk, max(n_ops - 1, 0))] if n_ops else _ANY, _BLOCKED)
    lone, const_l = lone_d.tolist(), const.tolist()
    o_s, o_rem, t_p, w_p, t_w, w_w, t_l = (a.tolist() for a in (s_a, rem_a, tp_a, wp_a, tw_a, ww_a, tl_a))
    c_s, c_e, c_gend, c_ret, c_rel = (a.tolist() for a in (cs_a, ce_a, gend_a, ret_a, rel_a))
    for c, i in zip(code.tolist(), r_walk.tolist()):
        if c == _CHAIN:  # the stream predecessor's shift, or the constant terms
            new = t_p[i] - d_op[w_p[i]]
            x = const_l[i]
            if x > new:
                new = x
            s = o_s[i]
            d_op[i] = (s - new if new < s else 0) + o_rem[i]
        elif c == _LONE:
            d_op[i] = lone[i]
        elif c == _ANY:
            j = w_p[i]
            new = t_p[i] - (d_op[j] if j >= 0 else 0)
            j = w_w[i]
            x = t_w[i] - (d_op[j] if j >= 0 else 0)
            if x > new:
                new = x
            j = l_src[i]
            x = t_l[i] - ((d_ce[j] if j >= 0 else 0) + l_off[i])
            if x > new:
                new = x
            s = o_s[i]
            if new < floor:
                new = floor
            d_op[i] = (s - new if new < s else 0) + o_rem[i]
        else:
            j = c_rel[i]
            ge = c_gend[i] - (d_op[j] if j >= 0 else 0)
            j = b_src[i]
            ns = c_s[i] - ((d_ce[j] if j >= 0 else 0) + b_off[i])
            d_ce[i] = c_e[i] - ((ns if ns > ge else ge) + c_ret[i])


_CHAIN, _LONE, _ANY, _BLOCKED = 0, 1, 2, 3  # walk steps of _walk_fast: activities by what they read; a blocking call's return


# ---------------------------------------------------------------- per step


@dataclass(frozen=True)
class StepChange:
    """One step (or the window) under a scenario: its path length now, the predicted one,
    the saving and the time the scenario removed in its span (all ns)."""

    key: int | None  # step row, None for the window
    length_ns: int
    new_length_ns: int
    removed_ns: int

    @property
    def saving_ns(self) -> int:
        return self.length_ns - self.new_length_ns


def step_changes(paths, sc: Scenario, keys: list[int | None] | None = None) -> list[StepChange]:
    """Re-time every path of ``paths`` (:class:`~diagnose.analyzers.critpath.Paths`), or the
    ones of ``keys`` (step rows; None for the window), under ``sc``."""
    g = paths.graph
    if g is None:
        return []
    removal = _removal(g, sc)
    items = [(k, p) for k, p in paths.steps.items()] + ([(None, paths.window)] if paths.window is not None else [])
    if keys is not None:
        want = set(keys)
        items = [(k, p) for k, p in items if k in want]
    members_of = _members(g, [k for k, _ in items if k is not None])
    out = []
    for k, p in items:
        if k is None:
            key = np.where(g.launch_start != D.NO_TIME, g.launch_start, g.start)
            mem = np.flatnonzero(key >= p.anchor_ns)
            if not len(mem):  # every activity launched before the first one ran (launched up front)
                mem = np.flatnonzero(g.start >= p.anchor_ns)
        else:
            mem = members_of[k]
        new_end, removed = retime(g, p.start_ns, p.end_ns, mem, removal)
        new_end = min(max(new_end, p.start_ns), p.end_ns)
        out.append(StepChange(k, p.length_ns, new_end - p.start_ns, removed))
    return out


def _members(g: D.DepGraph, keys: list[int]) -> dict[int, np.ndarray]:
    if not keys:
        return {}
    idx = np.flatnonzero(g.step >= 0)
    o = idx[np.argsort(g.step[idx], kind="stable")]
    st = g.step[o]
    want = set(keys)
    out = {}
    bounds = np.flatnonzero(np.concatenate(([True], st[1:] != st[:-1], [True])))
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        k = int(st[lo])
        if k in want:
            out[k] = o[lo:hi]
    return out


def rule_saving_ms(paths, steps, phase: str, spec, main_phase: str | None = None) -> float | None:
    """A rule's predicted saving (ms): its ``whatif`` spec (``remove``, ``speedup``,
    ``phase``) re-timed on the critical paths of the steps of its phase (``main``: the step
    phase with the most own time; ``all``/``any``: every step), summed; on the window's path
    when the trace has no steps. None without a path that stands for the time at stake: no
    GPU work, no steps of the phase, or a window path cut short by a wait the trace cannot
    explain (it then holds only the window's tail). Each distinct (scenario, steps) is re-timed
    once per graph (kept in its cache)."""
    if paths is None or paths.graph is None or (not paths.steps and paths.window is None):
        return None
    if not paths.steps and paths.window.reason in ("outside_trace", "not_in_trace"):
        return None
    sc = scenario(tuple(spec.get("remove") or ()), tuple(f"{k}={v}" for k, v in (spec.get("speedup") or {}).items()))
    ph = spec.get("phase") or phase
    if ph == "main":
        ph = main_phase if main_phase in ("prefill", "decode", "mixed") else "all"
    if paths.steps:
        phases = steps["phase"].to_numpy(dtype=object) if len(steps) else np.zeros(0, dtype=object)
        keys = [k for k in paths.steps if ph in ("all", "any") or (k < len(phases) and phases[k] == ph)]
        if not keys:
            return None
    else:
        keys = [None]
    memo = paths.graph.cache.setdefault("rule_savings", {})  # rules that remove the same share one re-timing
    hit = memo.get((sc, tuple(keys)))
    if hit is None or hit[0] is not paths:
        hit = memo[sc, tuple(keys)] = (paths, round(sum(c.saving_ns for c in step_changes(paths, sc, keys)) / 1e6, 6))
    return hit[1]


def scenario_table(paths, steps, sc: Scenario) -> dict:
    """Every step's path length now and under ``sc`` (ms), and per phase the p50s and the
    summed saving: what ``diagnose whatif`` prints. Without steps, one row for the window."""
    names = steps["name"].to_numpy(dtype=object) if len(steps) else np.zeros(0, dtype=object)
    phases = steps["phase"].to_numpy(dtype=object) if len(steps) else np.zeros(0, dtype=object)
    rows = []
    for c in step_changes(paths, sc):
        rows.append({"step": c.key, "name": "(whole window: no steps)" if c.key is None else str(names[c.key]),
                     "phase": "all" if c.key is None else str(phases[c.key]), "path_ms": c.length_ns / 1e6,
                     "new_ms": c.new_length_ns / 1e6, "saving_ms": c.saving_ns / 1e6, "removed_ms": c.removed_ns / 1e6})
    out_phases = []
    for ph in dict.fromkeys(r["phase"] for r in rows):
        rs = [r for r in rows if r["phase"] == ph]
        out_phases.append({"phase": ph, "steps": len(rs),
                           "path_p50_ms": float(np.median([r["path_ms"] for r in rs])),
                           "new_p50_ms": float(np.median([r["new_ms"] for r in rs])),
                           "saving_p50_ms": float(np.median([r["saving_ms"] for r in rs])),
                           "saving_ms": float(sum(r["saving_ms"] for r in rs))})
    rnd = (lambda d: {k: round(v, 6) if isinstance(v, float) else v for k, v in d.items()})
    return {"scenario": sc.label, "phases": [rnd(p) for p in out_phases], "steps": [rnd(r) for r in rows]}
