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

from diagnose.analyzers import depgraph as D
from diagnose.analyzers.hostpath import DEFAULT_CAUSE, cause_timeline, path_causes
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
    for i, f in sc.ops:
        keep[i] = min(keep[i], f)
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
    tids = set(np.unique(g.rt_tid).tolist()) | {t for t, _, _ in sc.host}
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
    m = g.rt_tid == tid
    lo = int(g.rt_start[m].min()) if m.any() else 0
    hi = int(g.rt_end[m].max()) if m.any() else 0
    tr = g.trace
    for f in (tr.cpu_ops, tr.python_frames, tr.annotations):
        if f is not None and len(f):
            sub = f[f["tid"].to_numpy() == tid]
            if len(sub):
                lo = min(lo, int(sub["start_ns"].min()))
                hi = max(hi, int(sub["end_ns"].max()))
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
    pts = np.unique(np.concatenate((a0, a1, b0, b1)))
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
        rows = np.unique(np.concatenate(rows)) if rows else np.zeros(0, np.int64)
        o = np.lexsort((rows, g.rt_start[rows]))
        self.row = rows[o]
        self.start, self.end, self.tid = g.rt_start[self.row], g.rt_end[self.row], g.rt_tid[self.row]
        self.release = rel[self.row]
        prev = np.full(len(self.row), -1, dtype=np.int64)
        by = np.lexsort((np.arange(len(self.row)), self.tid))
        same = np.zeros(len(by), dtype=bool)  # no host call at all (a kernels-only trace): none
        same[1:] = self.tid[by][1:] == self.tid[by][:-1]
        prev[by[same]] = by[np.flatnonzero(same) - 1]
        self.prev = prev
        self.of_row = {int(r): i for i, r in enumerate(self.row.tolist())}


def _chains(g: D.DepGraph) -> _Chains:
    c = g.cache.get("chains")
    if c is None:
        c = g.cache["chains"] = _Chains(g)
    return c


def retime(g: D.DepGraph, start_ns: int, end_ns: int, members: np.ndarray, removal: _Removal) -> tuple[int, int]:
    """Re-time the window [start_ns, end_ns] (a path's span) under ``removal``: (the new end
    of ``members``' GPU work, the time removed in the window: host time on every thread, GPU
    work and lags of activities starting in it)."""
    ch = _chains(g)
    o_lo = int(np.searchsorted(g.start, start_ns, side="left"))
    o_hi = int(np.searchsorted(g.start, end_ns, side="right"))
    c_lo, c_hi = np.searchsorted(ch.start, [start_ns, end_ns + 1])
    ops = np.arange(o_lo, o_hi)
    calls = np.arange(int(c_lo), int(c_hi))
    lag_all = g.start - g.bind_ns
    removed = int(removal.op_removed[ops].sum()) + int(np.where(removal.lag_removed[ops] & (lag_all[ops] > 0), lag_all[ops], 0).sum())
    for tid in removal.host:
        removed += removal.measure(tid, end_ns) - removal.measure(tid, start_ns)
    if removed == 0:
        return int(g.end[members].max()), 0
    t = np.concatenate((ch.end[calls], ch.start[calls], g.start[ops]))
    typ = np.concatenate((np.full(len(calls), _CALL_END), np.full(len(calls), _CALL_START), np.full(len(ops), _OP_START)))
    ref = np.concatenate((calls, calls, ops))
    order = np.lexsort((typ, t))
    d_op: dict[int, int] = {}  # activity -> how much earlier it ends
    d_cs: dict[int, int] = {}  # call -> how much earlier it starts
    d_ce: dict[int, int] = {}  # call -> how much earlier it returns
    launch_chain = ch.of_row
    for k in order.tolist():
        ty, i = int(typ[k]), int(ref[k])
        if ty == _OP_START:
            d_op[i] = _op_shift(g, i, d_op, d_cs, launch_chain, removal, start_ns)
        elif ty == _CALL_START:
            d_cs[i] = _call_start_shift(ch, i, d_cs, d_ce, removal, start_ns)
        else:
            d_ce[i] = _call_end_shift(g, ch, i, d_cs, d_op, removal)
    ends = g.end[members] - np.array([d_op.get(int(m), 0) for m in members.tolist()], dtype=np.int64)
    return int(ends.max()), removed


def _op_shift(g: D.DepGraph, i: int, d_op, d_cs, launch_chain, removal: _Removal, floor: int) -> int:
    """How much earlier activity ``i`` ends: it starts at the latest of what it waited for,
    the binding predecessor plus the lag it had (less a removed lag), the others as soon as
    they allow (their own latency is not in the trace)."""
    b = int(g.bind[i])
    s_i = int(g.start[i])
    if b == D.BIND_NONE or s_i < floor:
        return int(removal.op_removed[i])
    lag = s_i - int(g.bind_ns[i])
    if removal.lag_removed[i] and lag > 0:
        lag = 0
    new = []
    p = int(g.prev[i])
    if p >= 0:
        new.append(int(g.end[p]) - d_op.get(p, 0) + (lag if b == D.BIND_STREAM else 0))
    w = int(g.wait_src[i])
    if w >= 0:
        new.append(int(g.end[w]) - d_op.get(w, 0) + (lag if b == D.BIND_WAIT else 0))
    if int(g.launch[i]) >= 0:
        ci = launch_chain.get(int(g.launch[i]))
        new.append(int(g.launch_start[i]) - (d_cs.get(ci, 0) if ci is not None else 0) + (lag if b == D.BIND_LAUNCH else 0))
    new_start = min(max(max(new), floor), s_i)
    return s_i - new_start + int(removal.op_removed[i])


def _call_start_shift(ch: _Chains, k: int, d_cs, d_ce, removal: _Removal, floor: int) -> int:
    """How much earlier host call ``k`` starts: the previous call's shift plus the host time
    removed between them (within the window)."""
    s_k, tid = int(ch.start[k]), int(ch.tid[k])
    p = int(ch.prev[k])
    if p < 0:
        base_t, base_d = floor, 0
    elif int(ch.end[p]) <= s_k:
        base_t, base_d = int(ch.end[p]), d_ce.get(p, 0)
    else:  # nested in the previous call
        base_t, base_d = int(ch.start[p]), d_cs.get(p, 0)
    if base_t < floor:
        base_t, base_d = floor, 0
    return base_d + removal.measure(tid, s_k) - removal.measure(tid, base_t)


def _call_end_shift(g: D.DepGraph, ch: _Chains, k: int, d_cs, d_op, removal: _Removal) -> int:
    """How much earlier host call ``k`` returns."""
    s_k, e_k, tid = int(ch.start[k]), int(ch.end[k]), int(ch.tid[k])
    ds = d_cs.get(k, 0)
    r = int(ch.release[k])
    if r < 0:
        return ds + removal.measure(tid, e_k) - removal.measure(tid, s_k)
    if removal.unblock:
        return e_k - (s_k - ds)
    g_end = int(g.end[r])
    ret = e_k - max(s_k, g_end)
    new_end = max(s_k - ds, g_end - d_op.get(r, 0)) + ret
    return e_k - new_end


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
    explain (it then holds only the window's tail)."""
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
    return round(sum(c.saving_ns for c in step_changes(paths, sc, keys)) / 1e6, 6)


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
