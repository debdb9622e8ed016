"""What the host was doing while the GPU waited: the host-cause classifier (README "Causes
and levers").

For an idle interval ``[g0, g1)`` on a device before activity *n*, launched by the runtime call
*L* on host thread *T* (linked by correlation id):

* the **host part** ``[g0, min(g1, L.end)]``: the host had not finished issuing *n*;
* the **queue part** ``[max(g0, L.end), g1]``: *n* was queued, the GPU did not start it
  (:mod:`diagnose.analyzers.waits` names that part: ``dependency``, ``outside_trace``...).

The host part is cut into elementary pieces at every start and end of *T*'s host events
(python frames, CPU operators, user ranges, runtime/driver calls) and of the profiler's
overhead events (any thread). Each piece gets the first host cause, in the precedence of the
cause table (``diagnose/data/causes.yaml``), whose test matches the chain of events enclosing
it (outermost to innermost; its test names are data: ``diagnose/data/host_calls.yaml``):

1. ``profiler_overhead``: a profiler overhead event covers it, or a chain frame is the
   profiler's own python;
2. ``first_call_setup``: a lazy-loading overhead event covers it; or a chain runtime call
   loads a module or library; or a chain launch call is the first launch of its kernel and
   lasts over :data:`LAUNCH_CEIL_NS`; or a chain operator is the **first call** of its
   (name, input shapes), costs at least :data:`FIRST_CALL_FACTOR` times the median of the
   other calls and :data:`LAUNCH_CEIL_NS` more (time blocked in synchronizing calls inside it
   left out), and launches something — unless the window follows iterations the profiler
   skipped (:func:`warmed_up`: no operator is on its first call there);
3. ``host_blocked``: the innermost event is a blocking runtime call, or a chain frame or
   operator synchronizes;
4. ``cold_start``: a chain event is a compilation range;
5. ``data_loading``: a chain event is DataLoader iteration;
6. ``compile_guard``: the innermost event is guard evaluation; or the piece lies in a step
   that replays graphs, before its first graph launch, under the torch.compile entry;
7. ``host_compute``: the outermost event of the chain that launches nothing on *T* during its
   whole life and is not a framework dispatch frame lasts at least :data:`LAUNCH_CEIL_NS`;
8. ``launch``: any other traced host time (the dispatch path);
9. ``host_unknown``: no host event of *T* covers the piece.

The interval's host causes are the time of each; its cause (:mod:`~diagnose.analyzers.waits`)
is the one with the most time. Its ``host_call`` is the event that named the winning cause's
pieces (the flagged event; for ``launch`` the innermost event that is not a C built-in; for
``compile_guard`` the innermost frame under the compile entry that is not the framework's),
its ``host_stack`` the chain of events at the middle of the host part.

Events on a thread nest, mostly (python frames, operators and ranges may overlap at their
edges; a record_function range opens inside ``__enter__`` and outlives it): the parent of an
event is the latest-started event that encloses it, the innermost event at a moment the
latest-started event still running then. Everything is vectorised over events and intervals: the only Python loops run over
threads and nesting levels. Only events overlapping the host parts that need explaining are
read (:meth:`HostCauses.build` takes those intervals).
"""
from __future__ import annotations

import re
from functools import lru_cache

import msgspec
import numpy as np
import pandas as pd

from diagnose.analyzers.hostsource import host_sources, thread_events
from diagnose.analyzers.nesting import lexsort, prev_exceeding, sorted_unique
from diagnose.trace.model import NO_TIME, Trace, per_unique
from diagnose.vocab import HOST_CAUSES

#: Runtime-call kinds (``Trace.runtime["api_kind"]``) that put work on the GPU: a kernel or
#: graph launch, a copy, a fill.
LAUNCH_API_KINDS = ("launch", "graph_launch", "memcpy", "memset")
#: The largest host time one kernel launch can explain: "Usually, the launch time on the CPU
#: side is between 5-20 microseconds" (HTA docs, cuda_kernel_launch_stats); 4-6 µs measured on
#: an RTX 5070 Ti with CUDA 13. A launchless event this long is host work, not dispatch; a
#: first call costing this much more than its later calls is setup.
LAUNCH_CEIL_NS = 20_000
#: A first call is setup when it costs at least this many times the median of its later calls
#: (at least its steady-state cost again; observed 20-100x: B200 first GEMMs 1,455-2,454 µs vs
#: 41-80 µs, the HTA fragment's first launch 1,414 µs vs 8-14 µs).
FIRST_CALL_FACTOR = 2.0
#: Idle intervals shorter than this are not read from the host: a kernel boundary costs the GPU
#: 0.6-1.3 µs (graph replay of no-op nodes ~0.58 µs, ocannl issue #488; 1.1-1.3 µs per small
#: kernel in a graph, pytorch issue #161104); 5 µs is 4x that (and waits.SWITCH_MAX_NS).
MIN_HOST_GAP_NS = 5_000

#: Event kinds (``host_calls.yaml`` ``events``), in the order their frames are read.
KINDS = ("frame", "op", "range", "runtime", "os")
_K = {k: i for i, k in enumerate(KINDS)}
N_HOST = len(HOST_CAUSES)
HOST_ID = {c: i for i, c in enumerate(HOST_CAUSES)}
UNKNOWN_ID = HOST_ID["host_unknown"]
_FAR = np.int64(2**62)

# bits of the per-event flags
_B = {name: 1 << i for i, name in enumerate((
    "profiler_frame", "module_load", "blocking", "poll", "sync_frame", "compile", "data_loading", "guard", "dynamo_entry",
    "framework_frame", "first_launch", "first_call", "host_work", "launchless_user", "stream_wait", "launch_call", "builtin",
    "os_wait"))}


@lru_cache(maxsize=1)
def _tests() -> dict[str, tuple[re.Pattern, frozenset[str], str | None, str]]:
    """``{test: (regex, event kinds, cause, scope)}`` from ``host_calls.yaml``."""
    from diagnose.tables import host_call_table

    return {r.test: (re.compile(r.pattern.strip(), re.I), frozenset(r.events), r.cause, r.scope) for r in host_call_table().rows}


def name_test(test: str, name: str, kind: str) -> bool:
    """True when ``name`` (an event of ``kind``: overhead, runtime, op, range, frame) passes ``test``."""
    rx, kinds, _, _ = _tests()[test]
    return kind in kinds and bool(rx.search(name))


def _name_flags(names: np.ndarray, kinds: np.ndarray) -> np.ndarray:
    """Flag bits from the name tests, computed once per distinct (kind, name)."""
    tests = [(t, spec) for t, spec in _tests().items() if t in _B]
    out = np.zeros(len(names), dtype=np.int64)
    if not len(names):
        return out
    for k in np.unique(kinds):
        m = kinds == k
        kname = KINDS[int(k)]
        codes, uniq = pd.factorize(names[m], use_na_sentinel=False)
        fl = np.zeros(len(uniq), dtype=np.int64)
        for j, u in enumerate(uniq):
            s = str(u)
            v = 0
            for t, (rx, kinds_ok, _, _) in tests:
                if kname in kinds_ok and rx.search(s):
                    v |= _B[t]
            if kname == "frame" and s.startswith("<built-in"):
                v |= _B["builtin"]
            fl[j] = v
        out[m] = fl[codes]
    return out


def merge_intervals(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of intervals [a, b) as sorted, disjoint (starts, ends)."""
    if len(a) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    o = np.argsort(a, kind="stable")
    a, b = np.asarray(a, dtype=np.int64)[o], np.asarray(b, dtype=np.int64)[o]
    cm = np.maximum.accumulate(b)
    new = np.ones(len(a), dtype=bool)
    new[1:] = a[1:] > cm[:-1]
    starts = a[new]
    idx = np.flatnonzero(new)
    ends = cm[np.append(idx[1:] - 1, len(a) - 1)]
    return starts, ends


def _covered(t: np.ndarray, ua: np.ndarray, ub: np.ndarray) -> np.ndarray:
    """Index of the interval of the union [ua, ub) containing each t (-1 none)."""
    if len(ua) == 0:
        return np.full(len(t), -1, dtype=np.int64)
    j = np.searchsorted(ua, t, side="right") - 1
    ok = (j >= 0) & (t < ub[np.maximum(j, 0)])
    return np.where(ok, j, -1)


class _Thread(msgspec.Struct):
    """The host events of one thread that overlap the intervals to explain, nested, with each
    event's host cause and the event that names it, and the elementary pieces of time."""

    tid: int
    start: np.ndarray
    end: np.ndarray
    names: np.ndarray  # event names, then the overhead events' names
    depth: np.ndarray
    parent: np.ndarray  # the latest-started earlier event that ends at or after this one's end (-1 none)
    bounds: np.ndarray
    seg_cls: np.ndarray
    seg_name: np.ndarray
    covered_a: np.ndarray
    covered_b: np.ndarray

    def innermost(self, t: np.ndarray) -> np.ndarray:
        """Index of the innermost event covering each time ``t`` (-1 none): the latest-started
        event still running at ``t``, the largest ``j`` with ``start[j] <= t < end[j]``.

        From the last event started at or before ``t``, up the parents while the event has
        ended (a step per level; most instants need none). The parent ``p`` of an event ``k``
        ending at or before ``t`` is the largest ``j < k`` with ``end[j] >= end[k]``: every
        event between them ends before ``end[k]`` (so before ``t``), and every event still
        running at ``t`` ends after ``end[k]``, so is ``p`` or earlier."""
        t = np.asarray(t, dtype=np.int64)
        k = np.searchsorted(self.start, t, side="right") - 1
        e, parent = self.end, self.parent
        todo = np.flatnonzero((k >= 0) & (e[np.maximum(k, 0)] <= t)) if len(e) else np.zeros(0, dtype=np.int64)
        while len(todo):
            k[todo] = kt = parent[k[todo]]
            todo = todo[(kt >= 0) & (e[np.maximum(kt, 0)] <= t[todo])]
        return k

    def chain(self, i: int) -> list[int]:
        """Event ``i`` and its ancestors, outermost first."""
        out = []
        while i >= 0:
            out.append(i)
            i = int(self.parent[i])
        return out[::-1]


class HostCauses(msgspec.Struct):
    """What the host was doing, per thread, over the intervals it was built for (and any
    other it is asked about: :meth:`explain` extends a thread when needed)."""

    trace: Trace | None = None
    sources: dict = msgspec.field(default_factory=dict)
    threads: dict[int, _Thread] = msgspec.field(default_factory=dict)
    graph_ctx: tuple[np.ndarray, np.ndarray] = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    overhead: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = msgspec.field(default_factory=dict)
    launch_starts: dict[int, np.ndarray] = msgspec.field(default_factory=dict)
    blocking: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = msgspec.field(default_factory=dict)
    first_launch_rows: np.ndarray = msgspec.field(default_factory=lambda: np.zeros(0, dtype=bool))
    acts: pd.DataFrame | None = None
    _first_call_done: set = msgspec.field(default_factory=set)
    first_call_rows: np.ndarray = msgspec.field(default_factory=lambda: np.zeros(0, dtype=bool))
    _stream_waits: dict | None = None
    _cache: dict = msgspec.field(default_factory=dict)
    warm: bool = False  # the window follows iterations the profiler skipped: no operator is on its first call

    @classmethod
    def build(cls, trace: Trace, acts: pd.DataFrame, steps: pd.DataFrame | None,
              need: dict[int, tuple[np.ndarray, np.ndarray]]) -> "HostCauses":
        """Index ``trace``'s host events for the intervals ``need`` (``{tid: (starts, ends)}``,
        ns): the host parts of the gaps and waits to explain. ``acts``: the activity table
        (launch columns: first launches per kernel); ``steps``: the step table (graph steps)."""

        h = cls(trace=trace, acts=acts)
        h.sources = host_sources(trace)
        h._index_runtime(trace, acts)
        h._index_overhead(trace)
        h.graph_ctx = _graph_entry_ranges(trace, steps)
        h.first_call_rows = np.zeros(len(trace.cpu_ops), dtype=bool)
        h.warm = warmed_up(trace)
        for tid, (a, b) in need.items():
            if tid >= 0 and len(a):
                h._build_thread(int(tid), *merge_intervals(np.asarray(a), np.asarray(b)))
        return h

    # ------------------------------------------------------------ trace-wide indexes

    def _index_runtime(self, trace: Trace, acts: pd.DataFrame) -> None:
        rt = trace.runtime
        if not len(rt):
            return
        tid = rt["tid"].to_numpy()
        s, e = rt["start_ns"].to_numpy(), rt["end_ns"].to_numpy()
        is_launch = rt["api_kind"].isin(LAUNCH_API_KINDS).to_numpy()
        for t in np.unique(tid[is_launch]):
            m = is_launch & (tid == t)
            self.launch_starts[int(t)] = np.sort(s[m])
        bm = per_unique(rt["name"], lambda u: name_test("blocking", str(u), "runtime") and not name_test("poll", str(u), "runtime"))
        for t in np.unique(tid[bm]):
            m = bm & (tid == t)
            o = np.argsort(s[m], kind="stable")
            ss, ee = s[m][o], e[m][o]
            self.blocking[int(t)] = (ss, ee, np.concatenate(([0], np.cumsum(ee - ss))))
        self.first_launch_rows = _first_launches(rt, acts)

    def _index_overhead(self, trace: Trace) -> None:
        ov = trace.overhead
        if not len(ov):
            return
        names = ov["name"].to_numpy(dtype=object)
        lazy = np.array([name_test("lazy_loading", str(n), "overhead") for n in names], dtype=bool)
        s, e = ov["start_ns"].to_numpy(), ov["end_ns"].to_numpy()
        for key, m in (("first_call_setup", lazy), ("profiler_overhead", ~lazy)):
            if m.any():
                o = np.argsort(s[m], kind="stable")
                self.overhead[key] = (s[m][o], e[m][o], names[m][o])

    def launches_in(self, tid: int, s: np.ndarray, e: np.ndarray) -> np.ndarray:
        """Launch calls (kernels, graphs, copies, fills) thread ``tid`` issued in each [s, e]."""
        lt = self.launch_starts.get(int(tid))
        if lt is None:
            return np.zeros(len(s), dtype=np.int64)
        return np.searchsorted(lt, e, side="right") - np.searchsorted(lt, s, side="left")

    def blocked_ns(self, tid: int, s: np.ndarray, e: np.ndarray) -> np.ndarray:
        """Time thread ``tid`` spent in blocking calls that started inside each [s, e]."""
        b = self.blocking.get(int(tid))
        if b is None:
            return np.zeros(len(s), dtype=np.int64)
        ss, _, cum = b
        return cum[np.searchsorted(ss, e, side="right")] - cum[np.searchsorted(ss, s, side="left")]

    def blocking_between(self, tid: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Per interval, whether its thread issued a blocking call (not a poll) in [a, b]."""
        out = np.zeros(len(a), dtype=bool)
        for t in np.unique(tid):
            blk = self.blocking.get(int(t))
            if blk is None:
                continue
            m = tid == t
            ss, ee = blk[0], blk[1]
            # a call overlapping [a, b]: started before b and ended after a
            hi = np.searchsorted(ss, b[m], side="right")
            lo = np.searchsorted(ss, a[m], side="left")
            started_inside = hi > lo
            prev = np.maximum(lo - 1, 0)
            running = (lo > 0) & (ee[prev] > a[m])
            out[m] = started_inside | running
        return out

    # ------------------------------------------------------------ per thread

    def _build_thread(self, tid: int, ua: np.ndarray, ub: np.ndarray) -> None:

        ev = thread_events(self.sources, tid, ua, ub)
        s, e, kind, names, src = ev["start"], ev["end"], ev["kind"], ev["name"], ev["src"]
        n = len(s)
        order = lexsort((-(e - s), s))
        s, e, kind, names, src = s[order], e[order], kind[order], names[order], src[order]
        depth, parent = _nesting(s, e)
        flags = _name_flags(names, kind)
        launches = self.launches_in(tid, s, e)
        flags |= np.where(launches > 0, 0, _B["launchless_user"]) * (kind <= _K["range"])
        flags &= ~np.where((flags & _B["framework_frame"]) != 0, _B["launchless_user"], 0)
        flags |= np.where(kind == _K["runtime"], _B["launch_call"], 0) * (launches > 0)
        if len(self.first_launch_rows):
            rt_rows = np.where(kind == _K["runtime"], src, -1)
            fl = np.zeros(n, dtype=bool)
            ok = rt_rows >= 0
            fl[ok] = self.first_launch_rows[rt_rows[ok]]
            flags |= np.where(fl & (e - s > LAUNCH_CEIL_NS), _B["first_launch"], 0)
        op_rows = np.where(kind == _K["op"], src, -1)
        cand = (op_rows >= 0) & (e - s >= LAUNCH_CEIL_NS) & (launches > 0) & (not self.warm)
        if cand.any():
            self._first_calls(op_rows[cand])
            flags[cand] |= np.where(self.first_call_rows[op_rows[cand]], _B["first_call"], 0)
        cls_e, cls_g, nm_e, nm_g = _event_causes(s, e, depth, parent, flags)
        ov_s, ov_e, ov_cls, ov_names = self._overhead_arrays()
        gs, ge = self.graph_ctx
        bounds = sorted_unique(np.concatenate((s, e, ov_s, ov_e, gs, ge, [-_FAR, _FAR])))
        th = _Thread(tid, s, e, np.concatenate((names, ov_names)), depth, parent, bounds,
                     np.zeros(0, dtype=np.int8), np.zeros(0, dtype=np.int64), ua, ub)
        t = bounds[:-1]
        inner = th.innermost(t)
        in_graph = _covered(t, gs, ge) >= 0
        seg_cls = np.full(len(t), UNKNOWN_ID, dtype=np.int8)
        seg_name = np.full(len(t), -1, dtype=np.int64)
        if n:
            ii = np.maximum(inner, 0)
            seg_cls = np.where(inner >= 0, np.where(in_graph, cls_g[ii], cls_e[ii]), UNKNOWN_ID).astype(np.int8)
            seg_name = np.where(inner >= 0, np.where(in_graph, nm_g[ii], nm_e[ii]), -1)
        ov = _covered(t, ov_s, ov_e) if len(ov_s) else np.full(len(t), -1)
        hit = ov >= 0
        if hit.any():  # overhead events are tested first (any thread): precedence 1 and 2
            seg_cls[hit] = ov_cls[ov[hit]]
            seg_name[hit] = n + ov[hit]
        th.seg_cls, th.seg_name = seg_cls, seg_name
        self.threads[tid] = th

    def _overhead_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Overhead events of every thread, sorted, non-overlapping by construction of the
        lookup (``_covered`` takes the last one starting before t): starts, ends, host cause
        id, names."""
        parts = [(s, e, np.full(len(s), HOST_ID[c], dtype=np.int8), nm) for c, (s, e, nm) in self.overhead.items()]
        if not parts:
            z = np.zeros(0, dtype=np.int64)
            return z, z, np.zeros(0, dtype=np.int8), np.zeros(0, dtype=object)
        s = np.concatenate([p[0] for p in parts])
        o = np.argsort(s, kind="stable")
        return (s[o], np.concatenate([p[1] for p in parts])[o], np.concatenate([p[2] for p in parts])[o],
                np.concatenate([p[3] for p in parts])[o])

    def _first_calls(self, rows: np.ndarray) -> None:
        """Mark which of the CPU-op ``rows`` are first-call setup (module docstring, rule 2)."""
        todo = np.setdiff1d(rows, np.fromiter(self._first_call_done, dtype=np.int64, count=len(self._first_call_done)))
        if not len(todo):
            return
        self._first_call_done.update(int(r) for r in todo)
        ops = self.trace.cpu_ops
        names = ops["name"]
        wanted = pd.unique(names.to_numpy(dtype=object)[todo])
        sub = np.flatnonzero(names.isin(wanted).to_numpy())  # every call of the candidates' operators
        codes = np.zeros(len(ops), dtype=np.int64)
        codes[sub] = pd.factorize(names.to_numpy(dtype=object)[sub], use_na_sentinel=False)[0]
        dcode = pd.factorize(ops["input_dims"].to_numpy(dtype=object)[sub], use_na_sentinel=False)[0]
        s = ops["start_ns"].to_numpy()[sub]
        dur = (ops["end_ns"].to_numpy() - ops["start_ns"].to_numpy())[sub]
        df = pd.DataFrame({"row": sub, "name": codes[sub], "dims": dcode, "s": s, "dur": dur}).sort_values(["s", "row"], kind="stable")
        df["first"] = ~df.duplicated(["name", "dims"])
        later = df[~df["first"]].groupby(["name", "dims"], sort=False)["dur"].median()
        firsts = df[df["first"] & df["row"].isin(todo)]
        if not len(firsts):
            return
        ref = later.reindex(pd.MultiIndex.from_arrays([firsts["name"], firsts["dims"]])).to_numpy().astype(np.float64, copy=True)
        lone = np.flatnonzero(np.isnan(ref))
        if len(lone):  # no later call of these shapes: the operator's other calls (other shapes)
            groups = df.groupby("name", sort=False)
            for nm, ii in pd.Series(lone).groupby(firsts["name"].to_numpy()[lone]):
                g = groups.get_group(nm)
                durs, rws = g["dur"].to_numpy(), g["row"].to_numpy()
                for i in ii.to_numpy():
                    rest = durs[rws != firsts["row"].iloc[i]]
                    ref[i] = float(np.median(rest)) if len(rest) else np.nan
        tids = ops["tid"].to_numpy()[firsts["row"].to_numpy()]
        fs = firsts["s"].to_numpy()
        fe = fs + firsts["dur"].to_numpy()
        blocked = np.zeros(len(firsts), dtype=np.int64)
        for t in np.unique(tids):
            m = tids == t
            blocked[m] = self.blocked_ns(int(t), fs[m], fe[m])
        d = firsts["dur"].to_numpy() - blocked
        ok = ~np.isnan(ref) & (d - np.nan_to_num(ref) >= LAUNCH_CEIL_NS) & (d >= FIRST_CALL_FACTOR * np.nan_to_num(ref))
        self.first_call_rows[firsts["row"].to_numpy()[ok]] = True

    # ------------------------------------------------------------ queries

    def _thread_for(self, tid: int, a: np.ndarray, b: np.ndarray) -> _Thread | None:
        """The thread's index, extended when an interval lies outside what it was built for."""
        th = self.threads.get(tid)
        if th is not None:
            j = _covered(a, th.covered_a, th.covered_b)
            inside = (j >= 0) & (b <= th.covered_b[np.maximum(j, 0)])
            if inside.all():
                return th
            ua, ub = merge_intervals(np.concatenate((th.covered_a, a)), np.concatenate((th.covered_b, b)))
        else:
            ua, ub = merge_intervals(a, b)
        self._build_thread(tid, ua, ub)
        return self.threads.get(tid)

    def explain(self, tid: np.ndarray, a: np.ndarray, b: np.ndarray) -> "Explained":
        """Host causes of the intervals [a, b] of threads ``tid`` (ns; a >= b or tid < 0: nothing
        to explain): the time of each host cause, and per interval and cause the event naming
        most of it.

        Returns:
            :class:`Explained` aligned with the inputs.
        """
        n = len(a)
        parts = np.zeros((n, N_HOST), dtype=np.float64)
        named = []
        tid = np.asarray(tid, dtype=np.int64)
        for t in np.unique(tid[(tid >= 0) & (b > a)]):
            idx = np.flatnonzero((tid == t) & (b > a))
            th = self._thread_for(int(t), a[idx], b[idx])
            if th is not None:
                named.append(_explain_thread(th, idx, a[idx], b[idx], parts))
        nm = pd.concat(named, ignore_index=True) if named else pd.DataFrame(
            {"q": np.zeros(0, dtype=np.int64), "c": np.zeros(0, dtype=np.int64), "name": np.zeros(0, dtype=object),
             "ns": np.zeros(0)})
        return Explained(parts, nm)

    def cached(self, key: str, make):
        """A value computed once per analysis (e.g. the trace's sorted cuda_sync events)."""
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def stream_waits(self) -> dict[int, np.ndarray]:
        """Per thread, the sorted start times of its stream/event-wait calls."""
        if self._stream_waits is None:
            self._stream_waits = {}
            rt = self.trace.runtime if self.trace is not None else None
            if rt is not None and len(rt):
                hit = per_unique(rt["name"], lambda u: name_test("stream_wait", str(u), "runtime"))
                tid, s = rt["tid"].to_numpy(), rt["start_ns"].to_numpy()
                for t in np.unique(tid[hit]):
                    self._stream_waits[int(t)] = np.sort(s[hit & (tid == t)])
        return self._stream_waits

    def stacks(self, tid: np.ndarray, t: np.ndarray) -> list[list[str]]:
        """The chain of host events (outermost first, C built-in frames left out) of thread
        ``tid`` at time ``t``, per query; [] where the thread shows nothing."""
        out: list[list[str]] = [[] for _ in range(len(t))]
        tid = np.asarray(tid, dtype=np.int64)
        t = np.asarray(t, dtype=np.int64)
        for th_id in np.unique(tid[tid >= 0]):
            idx = np.flatnonzero(tid == th_id)
            th = self._thread_for(int(th_id), t[idx], t[idx] + 1)
            if th is None:
                continue
            inner = th.innermost(t[idx])
            for j, i in zip(idx.tolist(), inner.tolist()):
                out[j] = [str(th.names[k]) for k in th.chain(i) if not str(th.names[k]).startswith("<built-in")]
        return out


class Explained(msgspec.Struct):
    """Host causes of intervals: ``parts`` (n x len(HOST_CAUSES) ns), and ``named``: per
    interval ``q`` and host cause id ``c``, the ``name`` of the event holding most (``ns``) of
    that cause's time in it."""

    parts: np.ndarray
    named: pd.DataFrame


def _explain_thread(th: _Thread, idx: np.ndarray, a: np.ndarray, b: np.ndarray, parts: np.ndarray) -> pd.DataFrame:
    """Add each interval's host-cause time (pieces of ``th``) into ``parts`` rows ``idx``;
    return the naming events (rows q, c, name, ns; q indexes ``parts``)."""
    k0 = np.searchsorted(th.bounds, a, side="right") - 1
    k1 = np.searchsorted(th.bounds, b, side="left")
    cnt = np.maximum(k1 - k0, 0)
    rep = np.repeat(np.arange(len(idx)), cnt)
    k = np.repeat(k0, cnt) + (np.arange(cnt.sum()) - np.repeat(np.cumsum(cnt) - cnt, cnt))
    ov = np.minimum(th.bounds[k + 1], b[rep]) - np.maximum(th.bounds[k], a[rep])
    keep = ov > 0
    rep, k, ov = rep[keep], k[keep], ov[keep]
    cls = th.seg_cls[k].astype(np.int64)
    sums = np.bincount(rep * N_HOST + cls, weights=ov.astype(np.float64), minlength=len(idx) * N_HOST)
    parts[idx] += sums.reshape(len(idx), N_HOST)
    nm = th.seg_name[k]
    has = nm >= 0
    m = np.int64(len(th.names) + 1)
    qc = rep[has] * N_HOST + cls[has]
    key, inv = np.unique(qc * m + nm[has], return_inverse=True)  # per (interval, cause, naming event)
    ns = np.bincount(inv.ravel(), weights=ov[has].astype(np.float64), minlength=len(key))
    kqc = key // m
    best = np.lexsort((-ns, kqc))  # per (interval, cause): the event with the most time first
    first = best[np.concatenate(([True], kqc[best][1:] != kqc[best][:-1]))] if len(best) else best
    return pd.DataFrame({"q": idx[kqc[first] // N_HOST], "c": kqc[first] % N_HOST,
                         "name": th.names[key[first] % m].astype(object), "ns": ns[first]})


def _nesting(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For events sorted by (start, -duration): depth (1 = outermost) and parent (the latest
    event started before it that runs until its end or later: it encloses it; -1 none).
    Tolerates events that overlap without nesting: a range that starts inside a frame and
    outlives it (a record_function range opened in ``__enter__``) is not that frame's child."""
    n = len(s)
    if n == 0:
        z = np.zeros(0, dtype=np.int64)
        return z, z
    parent = prev_exceeding(e, e - 1)  # the latest-started event running until its end
    depth = np.ones(n, dtype=np.int64)
    anc = parent.copy()
    while (anc >= 0).any():
        has = anc >= 0
        depth += has
        anc = np.where(has, parent[np.maximum(anc, 0)], -1)
    return depth, parent


def _levels(depth: np.ndarray) -> list[np.ndarray]:
    """Event indices per depth, shallowest first (parents before children)."""
    o = np.argsort(depth, kind="stable")
    d = depth[o]
    cuts = np.flatnonzero(np.diff(d)) + 1
    return np.split(o, cuts)


#: Tests computed from the trace rather than from names (module docstring, rules 2 and 7),
#: with the cause they give.
_DERIVED = (("first_launch", "first_call_setup"), ("first_call", "first_call_setup"), ("host_work", "host_compute"))


def _event_causes(s: np.ndarray, e: np.ndarray, depth: np.ndarray, parent: np.ndarray,
                  flags: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Host cause id of time whose innermost event is each event (outside / inside a graph
    step's entry), and the event naming it (module docstring). The tests and their causes
    come from ``host_calls.yaml`` (overhead events are tested per piece, not here)."""
    n = len(s)
    ar = np.arange(n)
    rows = [(t, cause, scope) for t, (_, kinds, cause, scope) in _tests().items()
            if cause is not None and kinds != frozenset({"overhead"})]
    chain_bits = {_B[t] for t, _, scope in rows if scope != "innermost"} | {_B["launchless_user"]}
    chain_bits |= {_B[t] for t, _ in _DERIVED if t != "host_work"}
    anc = flags.copy()  # flags of the event and its ancestors
    outer = {b: np.where((flags & b) != 0, ar, -1) for b in chain_bits}  # outermost event with the flag
    meaningful = (flags & _B["builtin"]) == 0
    user = meaningful & ((flags & _B["framework_frame"]) == 0)
    inner_m = np.where(meaningful, ar, -1)
    inner_u = np.where(user, ar, -1)
    for lvl in (_levels(depth)[1:] if n else []):
        c = lvl[parent[lvl] >= 0]
        if not len(c):
            continue
        pp = parent[c]
        anc[c] |= anc[pp]
        for arr in outer.values():
            arr[c] = np.where(arr[pp] >= 0, arr[pp], arr[c])
        inner_m[c] = np.where(inner_m[c] >= 0, inner_m[c], inner_m[pp])
        inner_u[c] = np.where(inner_u[c] >= 0, inner_u[c], inner_u[pp])
    top_user = outer[_B["launchless_user"]]  # the outermost launchless event that is not the framework's
    tu = np.maximum(top_user, 0)
    work = (top_user >= 0) & (e[tu] - s[tu] >= LAUNCH_CEIL_NS)
    inner_name = np.where(inner_m >= 0, inner_m, ar)
    guard_name = np.where(inner_u >= 0, inner_u, ar)
    tests = []  # (precedence, cause, condition outside graph entry, inside, naming event)
    for t, cause, scope in rows:
        b = _B[t]
        if scope == "innermost":
            cond = (flags & b) != 0
            tests.append((cause, cond, cond, ar))
        elif scope == "chain":
            cond = (anc & b) != 0
            tests.append((cause, cond, cond, outer[b]))
        else:  # graph_entry: under the compile entry, before a graph-replayed step's first replay
            tests.append((cause, np.zeros(n, dtype=bool), (anc & b) != 0, guard_name))
    for t, cause in _DERIVED:
        if t == "host_work":
            tests.append((cause, work, work, top_user))
        else:
            cond = (anc & _B[t]) != 0
            tests.append((cause, cond, cond, outer[_B[t]]))
    order = {c: i for i, c in enumerate(HOST_CAUSES)}
    tests.sort(key=lambda x: order[x[0]])  # stable: within a cause, the file's order
    out = []
    for graph in (False, True):
        cls = np.full(n, HOST_ID["launch"], dtype=np.int8)
        nm = inner_name.copy()
        done = np.zeros(n, dtype=bool)
        for cause, cond_e, cond_g, name in tests:
            m = (cond_g if graph else cond_e) & ~done
            cls[m] = HOST_ID[cause]
            nm[m] = np.where(name[m] >= 0, name[m], ar[m])
            done |= m
        out += [cls, nm]
    return out[0], out[2], out[1], out[3]


_PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")


def warmed_up(trace: Trace) -> bool:
    """True when the window follows iterations the process already ran: torch.profiler numbers
    the steps it has seen (``ProfilerStep#N``, counting from 0 at ``profiler.start()``), so a
    first recorded step numbered N > 0 comes after N skipped or warm-up iterations; an
    operator's first call in the window is then not its first call in the process."""
    ann = trace.annotations
    if not len(ann):
        return False
    names = ann["name"]
    cats = names.cat.categories if isinstance(names.dtype, pd.CategoricalDtype) else pd.unique(names.to_numpy(dtype=object))
    nums = [int(m.group(1)) for m in (_PROFILER_STEP.match(str(c)) for c in cats) if m]
    return bool(nums) and min(nums) > 0


def _first_launches(rt: pd.DataFrame, acts: pd.DataFrame) -> np.ndarray:
    """Per runtime row: it is the first launch (in time) of its kernel's name (kernels only,
    not graph launches)."""
    out = np.zeros(len(rt), dtype=bool)
    if acts is None or not len(acts) or "launch_start_ns" not in acts:
        return out
    ls = acts["launch_start_ns"].to_numpy()
    ok = ((ls != NO_TIME) & ~acts["graph_followup"].to_numpy(dtype=bool) & acts["kind"].isin(("kernel",)).to_numpy()
          & acts["launch_kind"].isin(("launch",)).to_numpy())
    rows = np.flatnonzero(ok)
    if not len(rows):
        return out
    rows = rows[np.argsort(ls[rows], kind="stable")]
    _, first = np.unique(acts["name_id"].to_numpy()[rows], return_index=True)
    corr = acts["correlation"].to_numpy()[rows[first]]
    rc = rt["correlation"].to_numpy()
    o = np.argsort(rc, kind="stable")
    pos = np.searchsorted(rc[o], corr)
    hit = (pos < len(rc)) & (rc[o][np.minimum(pos, len(rc) - 1)] == corr) & (corr >= 0)
    out[o[pos[hit]]] = True
    return out


def _graph_entry_ranges(trace: Trace, steps: pd.DataFrame | None) -> tuple[np.ndarray, np.ndarray]:
    """[step start, first graph launch in the step) of every CPU step that launches a graph:
    the time a compiled, graph-replayed step spends before its replay (compile_guard)."""
    z = np.zeros(0, dtype=np.int64)
    rt = trace.runtime
    if steps is None or not len(steps) or not len(rt):
        return z, z
    g = np.sort(rt["start_ns"].to_numpy()[rt["api_kind"].to_numpy(dtype=object) == "graph_launch"])
    if not len(g):
        return z, z
    st = steps[steps["scope"] == "cpu"] if "scope" in steps else steps
    s, e = st["start_ns"].to_numpy(dtype=np.int64), st["end_ns"].to_numpy(dtype=np.int64)
    i = np.searchsorted(g, s, side="left")
    ok = (i < len(g)) & (g[np.minimum(i, len(g) - 1)] <= e)
    return merge_intervals(s[ok], g[np.minimum(i, len(g) - 1)][ok])
