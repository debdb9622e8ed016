"""Host time on a critical path: its cause, what the host was in, and the frame that names it.

A host stretch of a path (:mod:`diagnose.analyzers.critpath`) is cut into pieces, one per
change of:

* **cause** (:func:`cause_timeline`): what the host time is, a host cause of the cause table
  (``diagnose/data/causes.yaml``, :data:`diagnose.vocab.HOST_CAUSES`), from the name tests of
  ``diagnose/data/host_calls.yaml`` that read one event's name (profiler ``overhead`` events,
  runtime/driver calls, CPU ops, user ranges) in the cause table's host precedence: a profiler
  overhead event (``profiler_overhead``; ``first_call_setup`` for lazy module loading), a
  module-loading call (``first_call_setup``), a blocking call or synchronizing op
  (``host_blocked``), a compile range (``cold_start``), DataLoader iteration
  (``data_loading``), guard evaluation (``compile_guard``), host work that launches nothing
  (``host_compute``: a python frame outside the framework's dispatch path, a CPU op or a range
  of 20 µs or more during which the thread launched nothing, as the gap classifier of
  :mod:`diagnose.analyzers.hostcause` tests it), a first call per shape or a slow first
  launch of a kernel (``first_call_setup``: the classifier's own test, when the analysis's
  classifier is on the graph); any other host time is ``launch``. The compile entry of a
  graph-replayed step (the classifier's ``graph_entry`` test) is not applied here.
  :func:`path_causes` are the causes a path can hold; :func:`host_cause` is the one place a
  host event's name becomes a cause.
* **activity**: the innermost host event: a launch or copy call (``launch``), another
  runtime call (``runtime``), a blocking call that did not wait (``sync``), a CPU op
  (``cpu_op``), a python frame outside any CPU op (``python``) or inside one
  (``python_in_op``), a user range (``range``), a profiler overhead event (``overhead``), or
  nothing at all (``untracked``).
* **frame**: the innermost python frame that is not library code (:data:`LIBRARY_FRAME`), else
  the innermost CPU op or user range: where in the program the time went.

The same cause timeline gives the what-if's removable host time
(:mod:`diagnose.analyzers.whatif`), so a path and a what-if never disagree on a cause.
"""
from __future__ import annotations

import re
from functools import lru_cache

import msgspec
import numpy as np

from diagnose.analyzers.nesting import lexsort, sorted_unique
from diagnose.trace.model import factorize, per_unique

#: Python frames of libraries and the interpreter: never "where the time went" in the user's
#: program (research on nano-vllm and HF traces: torch, triton, built-ins, typing...).
LIBRARY_FRAME = re.compile(r"^(torch/|triton/|<built-in|<frozen|json/|/tmp/torchinductor|contextlib|threading|typing|"
                           r"functools|importlib|nn\.Module:|.*(site|dist)-packages/)")
#: Host activities (innermost event class) of a host piece, in display order.
ACTIVITIES = ("launch", "runtime", "sync", "cpu_op", "python_in_op", "python", "range", "overhead", "untracked")
_ACTIVITY_VALUES = np.array(ACTIVITIES, dtype=object)
#: Which host activities HTA 0.6.1 gives a weight (its cpu_op and non-blocking runtime-call
#: spans, python nested in an op); the others are its zero-weight dependency edges or
#: blocking-call spans (README "Critical path: HTA").
HTA_WEIGHTED = frozenset({"launch", "runtime", "cpu_op", "python_in_op"})
DEFAULT_CAUSE = "launch"

_CLS_RANGE, _CLS_PY, _CLS_OP, _CLS_OVER, _CLS_RT = 0, 1, 2, 3, 4  # tie order: outer to inner


#: The host event kinds a path's cause timeline reads (``host_calls.yaml`` ``events``).
PATH_EVENT_KINDS = ("overhead", "runtime", "op", "range")


@lru_cache(maxsize=1)
def _patterns() -> tuple[tuple[str, frozenset[str], re.Pattern], ...]:
    """(cause, event kinds, regex) of the ``host_calls.yaml`` tests that name a cause from one
    event's name, in the cause table's host precedence (first = highest), catch-all tests last."""
    from diagnose.tables import host_call_table
    from diagnose.vocab import HOST_CAUSES

    rows = [r for r in host_call_table().rows
            if r.cause is not None and r.scope != "graph_entry" and set(r.events) & set(PATH_EVENT_KINDS)]
    # a catch-all test ('.': "every other overhead event") comes after the specific ones
    rows.sort(key=lambda r: (r.pattern.strip() == ".", HOST_CAUSES.index(r.cause)))
    return tuple((r.cause, frozenset(r.events), re.compile(r.pattern.strip(), re.I)) for r in rows)


def host_cause(name: str, what: str) -> str | None:
    """The cause a host event's name gives host time it covers (``what``: the event's kind,
    one of :data:`PATH_EVENT_KINDS`), None when it gives none: the highest-precedence cause
    of a matching ``diagnose/data/host_calls.yaml`` test. The one mapping from host events to
    causes on a path."""
    for cause, kinds, rx in _patterns():
        if what in kinds and rx.search(name):
            return cause
    return None


def path_causes() -> tuple[str, ...]:
    """The causes a path's host time can have (cause table names, in host precedence)."""
    from diagnose.vocab import HOST_CAUSES

    named = {c for c, _, _ in _patterns()} | {DEFAULT_CAUSE, "host_compute"}
    return tuple(c for c in HOST_CAUSES if c in named)


class CauseTimeline(msgspec.Struct):
    """A thread's host time as disjoint pieces [start, end) with a cause; time outside
    every piece has :data:`DEFAULT_CAUSE`."""

    start: np.ndarray
    end: np.ndarray
    cause: np.ndarray  # object

    def at(self, t: np.ndarray) -> np.ndarray:
        """Cause at each instant of ``t``."""
        codes, names = self.codes_at(t)
        return names[codes]

    def codes_at(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(code at each instant of ``t``, the causes the codes index: object array)."""
        codes, names = pd_factorize(np.append(self.cause, DEFAULT_CAUSE).astype(object))
        out = np.full(len(t), codes[-1], dtype=np.int64)  # outside every piece: the default cause
        if len(self.start):
            k = np.searchsorted(self.start, t, side="right") - 1
            ok = (k >= 0) & (t < self.end[np.maximum(k, 0)])
            out[ok] = codes[k[ok]]
        return out, names


def pd_factorize(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``pandas.factorize`` (codes, uniques as an object array), pandas imported here."""
    import pandas as pd

    codes, uniq = pd.factorize(values)
    return np.asarray(codes, dtype=np.int64), np.asarray(uniq, dtype=object)


def _merge(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals as sorted disjoint ones."""
    if len(s) == 0:
        return s, e
    o = np.argsort(s, kind="stable")
    s, e = s[o], np.maximum.accumulate(e[o])
    new = np.concatenate(([True], s[1:] > e[:-1]))
    first = np.flatnonzero(new)
    last = np.concatenate((first[1:], [len(s)])) - 1
    return s[first], e[last]


def _layers(graph, tid: int) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(cause, merged starts, merged ends) in precedence order (highest first)."""
    tr = graph.trace
    out: list[tuple[str, np.ndarray, np.ndarray]] = []

    def add(frame, what: str, any_thread: bool = False) -> None:
        if frame is None or not len(frame):
            return
        codes, uniq = factorize(frame["name"])  # a categorical's own codes: no string per row
        cause_u = np.array([host_cause(str(u), what) for u in uniq], dtype=object)
        s, e = frame["start_ns"].to_numpy(dtype=np.int64), frame["end_ns"].to_numpy(dtype=np.int64)
        if "tid" in frame and not any_thread:
            mine = frame["tid"].to_numpy() == tid
            codes, s, e = codes[mine], s[mine], e[mine]
        if not len(codes):
            return
        used = np.bincount(codes, minlength=len(uniq)) > 0
        for c in dict.fromkeys(x for x in cause_u[used] if x is not None):  # one layer per cause
            m = (cause_u == c)[codes]
            out.append((c, *_merge(s[m], e[m])))

    add(getattr(tr, "overhead", None), "overhead", any_thread=True)  # the profiler's, on no host thread
    add(tr.runtime, "runtime")
    ann = tr.annotations
    add(tr.cpu_ops, "op")  # not python frames: their file names say "inductor" while compiled code runs
    add(ann[ann["scope"] == "cpu"] if len(ann) else None, "range")
    hc = _host_compute(graph, tid)
    if len(hc[0]):
        out.append(("host_compute", *hc))
    fc = _first_calls(graph, tid)
    if len(fc[0]):
        out.append(("first_call_setup", *fc))
    from diagnose.vocab import HOST_CAUSES

    out.sort(key=lambda x: HOST_CAUSES.index(x[0]))  # the cause table's host precedence (stable)
    return out


def _first_calls(graph, tid: int) -> tuple[np.ndarray, np.ndarray]:
    """First-call setup of thread ``tid`` as merged intervals, from the analysis's gap
    classifier (:class:`~diagnose.analyzers.hostcause.HostCauses`, ``graph.cache
    ["host_causes"]``): CPU ops on the first call of their (name, input shapes) that cost at
    least twice their other calls and 20 µs more and launch something, and first launches of
    a kernel lasting over 20 µs. None without the classifier (a graph built alone)."""
    from diagnose.analyzers.hostcause import LAUNCH_CEIL_NS

    z = np.zeros(0, np.int64)
    host = graph.cache.get("host_causes")
    if host is None or host.trace is not graph.trace:
        return z, z
    ss, es = [], []
    ops = graph.trace.cpu_ops
    if len(ops) and not host.warm:
        s = ops["start_ns"].to_numpy(dtype=np.int64)
        e = ops["end_ns"].to_numpy(dtype=np.int64)
        rows = np.flatnonzero((ops["tid"].to_numpy() == tid) & (e - s >= LAUNCH_CEIL_NS))
        rows = rows[host.launches_in(tid, s[rows], e[rows]) > 0]
        if len(rows):
            host._first_calls(rows)
            rows = rows[host.first_call_rows[rows]]
            ss.append(s[rows])
            es.append(e[rows])
    rt = graph.trace.runtime
    if len(host.first_launch_rows) == len(rt) and len(rt):
        s = rt["start_ns"].to_numpy(dtype=np.int64)
        e = rt["end_ns"].to_numpy(dtype=np.int64)
        m = host.first_launch_rows & (rt["tid"].to_numpy() == tid) & (e - s > LAUNCH_CEIL_NS)
        ss.append(s[m])
        es.append(e[m])
    if not ss:
        return z, z
    return _merge(np.concatenate(ss), np.concatenate(es))


def _host_compute(graph, tid: int) -> tuple[np.ndarray, np.ndarray]:
    """Host work of thread ``tid`` as merged intervals: python frames (not the framework's
    dispatch frames), CPU ops and ranges lasting at least
    :data:`~diagnose.analyzers.hostcause.LAUNCH_CEIL_NS` during which the thread launched
    nothing (no kernel, graph, copy or fill call): the gap classifier's ``host_compute``."""
    from diagnose.analyzers.hostcause import LAUNCH_API_KINDS, LAUNCH_CEIL_NS, name_test

    tr = graph.trace
    rt = tr.runtime
    z = np.zeros(0, np.int64)
    host = graph.cache.get("host_causes")
    if host is not None and host.trace is tr:  # the gap classifier's index: the same launch calls, sorted
        ls = host.launch_starts.get(int(tid), z)
    elif len(rt):
        m = (rt["tid"].to_numpy() == tid) & rt["api_kind"].isin(LAUNCH_API_KINDS).to_numpy()
        ls = np.sort(rt["start_ns"].to_numpy(dtype=np.int64)[m])
    else:
        ls = z
    ann = tr.annotations
    ss, es = [], []
    for f, kind in ((tr.python_frames, "frame"), (tr.cpu_ops, "op"), (ann[ann["scope"] == "cpu"] if len(ann) else None, "range")):
        if f is None or not len(f):
            continue
        s = f["start_ns"].to_numpy(dtype=np.int64)
        e = f["end_ns"].to_numpy(dtype=np.int64)
        keep = (f["tid"].to_numpy() == tid) & (e - s >= LAUNCH_CEIL_NS)
        if not keep.any():
            continue
        idx = np.flatnonzero(keep)
        s, e = s[idx], e[idx]
        ok = (np.searchsorted(ls, e, side="right") - np.searchsorted(ls, s, side="left")) == 0
        if kind == "frame" and ok.any():
            fw = per_unique(f["name"].iloc[idx], lambda u: name_test("framework_frame", str(u), "frame"))
            ok &= ~fw
        ss.append(s[ok])
        es.append(e[ok])
    if not ss:
        return z, z
    return _merge(np.concatenate(ss), np.concatenate(es))


def cause_timeline(graph, tid: int) -> CauseTimeline:
    """The cause of every instant of thread ``tid``'s host time (module docstring), cached
    on the graph."""
    key = ("causes", tid)
    hit = graph.cache.get(key)
    if hit is not None:
        return hit
    layers = _layers(graph, tid)
    if not layers:
        tl = CauseTimeline(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, dtype=object))
    else:
        pts = sorted_unique(np.concatenate([np.concatenate((s, e)) for _, s, e in layers]))
        a, b = pts[:-1], pts[1:]
        mid = a + (b - a) // 2
        cause = np.full(len(a), None, dtype=object)
        for c, s, e in reversed(layers):  # highest precedence written last
            k = np.searchsorted(s, mid, side="right") - 1
            cause[(k >= 0) & (mid < e[np.maximum(k, 0)])] = c
        keep = cause != None  # noqa: E711 (object array)
        a, b, cause = a[keep], b[keep], cause[keep]
        if len(a):  # merge neighbours of one cause
            new = np.concatenate(([True], (a[1:] != b[:-1]) | (cause[1:] != cause[:-1])))
            first = np.flatnonzero(new)
            last = np.concatenate((first[1:], [len(a)])) - 1
            a, b, cause = a[first], b[last], cause[first]
        tl = CauseTimeline(a, b, cause)
    graph.cache[key] = tl
    return tl


class HostPieces(msgspec.Struct):
    """Pieces of host stretches, one row per piece, sorted by (stretch, start): arrays of
    equal length (absolute ns for times; codes into small tables for the text, which
    :meth:`text_at` and the properties turn into object arrays of str).

    Attributes:
        owner: the stretch (index into the stretches classified) a piece belongs to.
        t0, t1: the piece's bounds.
        cause_code: index into ``causes`` (a host cause); act_code: index into
            :data:`ACTIVITIES`; name_code: index into ``names`` of the innermost host event's
            name ("" when untracked); frame_code: index into ``names`` of the program frame
            ("" when none).
        kcode, ktable: per piece, a code of its (frame, cause, activity) and the triples the
            codes index (None: :meth:`keys` finds them from the strings).
    """

    owner: np.ndarray
    t0: np.ndarray
    t1: np.ndarray
    cause_code: np.ndarray
    act_code: np.ndarray
    name_code: np.ndarray
    frame_code: np.ndarray
    causes: np.ndarray
    names: np.ndarray
    kcode: np.ndarray | None = None
    ktable: list | None = None

    @property
    def cause(self) -> np.ndarray:
        return self.causes[self.cause_code]

    @property
    def activity(self) -> np.ndarray:
        return _ACTIVITY_VALUES[self.act_code]

    @property
    def name(self) -> np.ndarray:
        return self.names[self.name_code]

    @property
    def frame(self) -> np.ndarray:
        return self.names[self.frame_code]

    def text_at(self, row: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(cause, activity, name, frame) of pieces ``row``: object arrays of str."""
        return (self.causes[self.cause_code[row]], _ACTIVITY_VALUES[self.act_code[row]], self.names[self.name_code[row]],
                self.names[self.frame_code[row]])

    @classmethod
    def empty(cls) -> "HostPieces":
        z = np.zeros(0, dtype=np.int64)
        o = np.zeros(0, dtype=object)
        return cls(z, z, z, z, np.zeros(0, dtype=np.int8), z, z, o, o, z, [])

    @classmethod
    def concat(cls, parts: list["HostPieces"]) -> "HostPieces":
        """One table from tables of disjoint stretches, sorted by (stretch, start)."""
        if not parts:
            return cls.empty()
        cols = [np.concatenate([getattr(p, f) for p in parts]) for f in ("owner", "t0", "t1", "act_code")]
        at_c = np.cumsum([0] + [len(p.causes) for p in parts])
        at_n = np.cumsum([0] + [len(p.names) for p in parts])
        cols.append(np.concatenate([p.cause_code + int(k) for p, k in zip(parts, at_c)]))  # each part's table appended
        cols.append(np.concatenate([p.name_code + int(k) for p, k in zip(parts, at_n)]))
        cols.append(np.concatenate([p.frame_code + int(k) for p, k in zip(parts, at_n)]))
        o = lexsort((cols[1], cols[0]))
        kcode, ktable = None, None
        if all(p.kcode is not None for p in parts):  # the parts' triple codes, made one table's
            ids: dict[tuple, int] = {}
            kcode = np.concatenate([np.array([ids.setdefault(t, len(ids)) for t in p.ktable] + [0], dtype=np.int64)[p.kcode]
                                    for p in parts])[o]
            ktable = list(ids)
        owner, t0, t1, act, cause, name, frame = (c[o] for c in cols)
        return cls(owner, t0, t1, cause, act, name, frame, np.concatenate([p.causes for p in parts]),
                   np.concatenate([p.names for p in parts]), kcode, ktable)

    def keys(self) -> tuple[np.ndarray, list[tuple[str, str, str]]]:
        """(per piece, a code of its (frame, cause, activity), in first-seen order; the triples
        the codes index)."""
        if self.kcode is not None:
            key, first = pd_factorize(self.kcode)
            return key, [self.ktable[x] for x in np.asarray(first, dtype=np.int64).tolist()]
        codes, uniqs = [], []
        for col in (self.frame, self.cause, self.activity):
            c, u = pd_factorize(col)
            codes.append(c)
            uniqs.append(u)
        nc, na = max(len(uniqs[1]), 1), max(len(uniqs[2]), 1)
        key, first = pd_factorize((codes[0] * nc + codes[1]) * na + codes[2])
        first = np.asarray(first, dtype=np.int64)
        table = [(uniqs[0][x // (nc * na)], uniqs[1][(x // na) % nc], uniqs[2][x % na]) for x in first.tolist()]
        return key, table

    def clipped(self, owner: np.ndarray, s0: np.ndarray, s1: np.ndarray) -> tuple[np.ndarray, ...]:
        """The pieces of stretch ``owner[i]`` clipped to [s0[i], s1[i]), for every i in order,
        empty clips dropped: (segment i, t0, t1, piece row) arrays."""
        lo = np.searchsorted(self.owner, owner, side="left")
        cnt = np.searchsorted(self.owner, owner, side="right") - lo
        seg = np.repeat(np.arange(len(owner), dtype=np.int64), cnt)
        row = np.arange(len(seg), dtype=np.int64) - np.repeat(np.cumsum(cnt) - cnt, cnt) + np.repeat(lo, cnt)
        a = np.maximum(self.t0[row], s0[seg])
        b = np.minimum(self.t1[row], s1[seg])
        k = b > a
        return seg[k], a[k], b[k], row[k]


def classify(graph, stretches: list[tuple[int, int, int]]) -> HostPieces:
    """Cut each host stretch (tid, start ns, end ns) into pieces (:class:`HostPieces`, the
    stretch's index as ``owner``)."""
    by_tid: dict[int, list[int]] = {}
    for j, (tid, a, b) in enumerate(stretches):
        if b > a:
            by_tid.setdefault(tid, []).append(j)
    parts = []
    for tid, js in by_tid.items():
        sa = np.array([stretches[j][1] for j in js], dtype=np.int64)
        sb = np.array([stretches[j][2] for j in js], dtype=np.int64)
        nest = _Nesting.of(graph, tid, sa, sb)
        parts.append(nest.pieces(np.array(js, dtype=np.int64), sa, sb, cause_timeline(graph, tid)))
    return HostPieces.concat(parts)


def _local_codes(col, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``idx`` of a name column as (codes, the values they index: object array); a
    categorical column's own codes (a missing value: NaN, the last value), else factorized."""
    import pandas as pd

    if isinstance(col.dtype, pd.CategoricalDtype):
        codes = col.cat.codes.to_numpy()[idx].astype(np.int64)
        cats = np.append(col.cat.categories.to_numpy(dtype=object), np.nan).astype(object)
        return np.where(codes < 0, len(cats) - 1, codes), cats
    codes, uniq = pd.factorize(col.to_numpy(dtype=object)[idx], use_na_sentinel=False)
    return np.asarray(codes, dtype=np.int64), np.asarray(uniq, dtype=object)


def _str_codes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes, names): ``values`` as ``str`` (``str(x)`` of each), equal strings one code."""
    import pandas as pd

    codes, uniq = pd.factorize(values, use_na_sentinel=False)
    names = np.array([str(u) for u in uniq], dtype=object)
    again, names2 = pd.factorize(names)
    return again[codes] if len(codes) else codes.astype(np.int64), np.asarray(names2, dtype=object)


class _Nesting:
    """The host events of one thread that overlap some stretches, nested (parent = the
    innermost event open at an event's start, :func:`~diagnose.analyzers.nesting.prev_exceeding`),
    with inherited attributes."""

    def __init__(self, s, e, cls, name_code, linked, names) -> None:
        from diagnose.analyzers.nesting import nearest_marked, prev_exceeding

        o = lexsort((cls, -e, s))
        self.s, self.e, self.cls = s[o], e[o], cls[o]
        self.linked = linked[o]
        # one code per distinct str(name) (names of several frames: a name can repeat in ``names``)
        remap, names = _str_codes(names)
        code = remap[name_code[o]] if len(o) else np.zeros(0, dtype=np.int64)
        if len(names) and (names == "").any():
            code = np.where(code == int(np.flatnonzero(names == "")[0]), -1, code)
        self.code = code  # name of event i: names[code[i]]; -1: "" (also "no name", "no frame")
        self.names = np.concatenate((names, [""])).astype(object)
        self.parent = prev_exceeding(self.e, self.s, strict=True)
        lib = np.array([bool(LIBRARY_FRAME.match(x)) for x in self.names], dtype=bool)
        self.in_op = nearest_marked(self.parent, self.cls == _CLS_OP) >= 0
        self.user = nearest_marked(self.parent, (self.cls == _CLS_PY) & ~lib[self.code])
        self.op = nearest_marked(self.parent, (self.cls == _CLS_OP) | (self.cls == _CLS_RANGE))

    @classmethod
    def of(cls, graph, tid: int, sa: np.ndarray, sb: np.ndarray) -> "_Nesting":
        tr = graph.trace
        parts = []
        o = np.argsort(sa)
        ms, me = sa[o], sb[o]

        uniqs: list[np.ndarray] = []
        base = [0]

        def take(frame, c: int, linked=None) -> None:
            if frame is None or not len(frame):
                return
            m = frame["tid"].to_numpy() == tid
            s = frame["start_ns"].to_numpy(dtype=np.int64)
            e = frame["end_ns"].to_numpy(dtype=np.int64)
            k = np.searchsorted(me, s, side="right")  # first stretch ending after the event starts
            ov = m & (k < len(ms)) & (ms[np.minimum(k, len(ms) - 1)] < e)
            idx = np.flatnonzero(ov)
            lk = np.zeros(len(idx), dtype=bool) if linked is None else linked[idx]
            codes, uniq = _local_codes(frame["name"], idx)
            parts.append((s[idx], np.maximum(e[idx], s[idx]), np.full(len(idx), c, dtype=np.int8), codes + base[0], lk))
            uniqs.append(uniq)
            base[0] += len(uniq)

        ann = tr.annotations
        take(ann[ann["scope"] == "cpu"] if len(ann) else None, _CLS_RANGE)
        take(tr.python_frames, _CLS_PY)
        take(tr.cpu_ops, _CLS_OP)
        take(getattr(tr, "overhead", None), _CLS_OVER)
        take(tr.runtime, _CLS_RT, _launch_like(graph))
        if not parts:
            z = np.zeros(0, dtype=np.int64)
            return cls(z, z, np.zeros(0, dtype=np.int8), z, np.zeros(0, dtype=bool), np.zeros(0, dtype=object))
        return cls(*(np.concatenate([p[i] for p in parts]) for i in range(5)), np.concatenate(uniqs))

    def pieces(self, owner: np.ndarray, sa: np.ndarray, sb: np.ndarray, tl: CauseTimeline) -> HostPieces:
        """The pieces of stretches [sa, sb) (``owner``: their indices), cut at every event
        and cause boundary, adjacent pieces alike merged."""
        allpts = sorted_unique(np.concatenate((self.s, self.e, tl.start, tl.end)))
        lo = np.searchsorted(allpts, sa, side="right")
        cnt = np.maximum(np.searchsorted(allpts, sb, side="left") - lo, 0) + 1  # inner points + 1
        own = np.repeat(np.arange(len(sa), dtype=np.int64), cnt)
        pos = np.arange(len(own), dtype=np.int64) - np.repeat(np.cumsum(cnt) - cnt, cnt)
        last = pos == cnt[own] - 1
        inner = np.minimum(lo[own] + pos, max(len(allpts) - 1, 0))
        x1 = np.where(last, sb[own], allpts[inner] if len(allpts) else sb[own])
        x0 = np.empty_like(x1)
        x0[:] = sa[own]
        x0[pos > 0] = x1[np.flatnonzero(pos > 0) - 1]
        mid = x0 + (x1 - x0) // 2
        ccode, cnames = tl.codes_at(mid)
        k = self._innermost(mid)
        act, name_code, frame_code = self._describe(k)
        new = np.ones(len(own), dtype=bool)
        new[1:] = ((own[1:] != own[:-1]) | (ccode[1:] != ccode[:-1]) | (act[1:] != act[:-1])
                   | (name_code[1:] != name_code[:-1]) | (frame_code[1:] != frame_code[:-1]))
        first = np.flatnonzero(new)
        end = np.concatenate((first[1:], [len(own)])) - 1
        fc, cc, ac = frame_code[first], ccode[first], act[first].astype(np.int64)
        nc, na = max(len(cnames), 1), len(ACTIVITIES)
        kcode, kint = pd_factorize(((fc + 1) * nc + cc) * na + ac)  # one code per (frame, cause, activity)
        kint = np.asarray(kint, dtype=np.int64)
        ktable = [(self.names[f - 1], cnames[c], ACTIVITIES[a])
                  for f, c, a in zip((kint // (nc * na)).tolist(), ((kint // na) % nc).tolist(), (kint % na).tolist())]
        blank = len(self.names) - 1  # -1: "" (the last name)
        return HostPieces(owner[own[first]], x0[first], x1[end], ccode[first], act[first],
                          np.where(name_code[first] < 0, blank, name_code[first]),
                          np.where(frame_code[first] < 0, blank, frame_code[first]), np.asarray(cnames, dtype=object),
                          self.names, kcode, ktable)

    def _innermost(self, t: np.ndarray) -> np.ndarray:
        """Index of the innermost event open at each instant (-1 none): the last one started
        at or before it, then up its parents until one has not ended (a step per level; most
        instants need none)."""
        if len(self.s) == 0:
            return np.full(len(t), -1, dtype=np.int64)
        k = np.searchsorted(self.s, t, side="right") - 1
        bad = np.flatnonzero((k >= 0) & (self.e[np.maximum(k, 0)] <= t))
        while len(bad):
            k[bad] = self.parent[k[bad]]
            kb = k[bad]
            bad = bad[(kb >= 0) & (self.e[np.maximum(kb, 0)] <= t[bad])]
        return k

    def _activities(self) -> np.ndarray:
        """Per event, its activity (index into :data:`ACTIVITIES`) when innermost."""
        A = {a: i for i, a in enumerate(ACTIVITIES)}
        sync = np.array([bool(_SYNC_LIKE.search(x)) for x in self.names], dtype=bool)
        c = self.cls
        act = np.full(len(c), A["overhead"], dtype=np.int8)
        rt = c == _CLS_RT
        act[rt] = np.where(self.linked[rt], A["launch"], np.where(sync[self.code[rt]], A["sync"], A["runtime"]))
        act[c == _CLS_OP] = A["cpu_op"]
        py = c == _CLS_PY
        act[py] = np.where(self.in_op[py], A["python_in_op"], A["python"])
        rg = c == _CLS_RANGE
        act[rg] = np.where(self.in_op[rg], A["cpu_op"], A["range"])
        return act

    def _describe(self, k: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(activity index, name code, frame code) of each innermost event ``k`` (-1: none:
        ``untracked``, codes -1 for "")."""
        none = k < 0
        kk = np.maximum(k, 0)
        if not len(self.s):
            m = len(k)
            return np.full(m, ACTIVITIES.index("untracked"), dtype=np.int8), np.full(m, -1, np.int64), np.full(m, -1, np.int64)
        act = np.where(none, ACTIVITIES.index("untracked"), self._activities()[kk]).astype(np.int8)
        name = np.where(none, -1, self.code[kk])
        ev = np.where(self.user >= 0, self.user, self.op)  # the frame's event: user python frame, else op or range
        fev = ev[kk]
        frame = np.where(none | (fev < 0), -1, self.code[np.maximum(fev, 0)])
        return act, name, frame


#: Calls that block or poll the host (HTA 0.6.1's ``BLOCKING_SYNC_CALLS`` but the async copy, plus
#: HIP's synchronous copies): a piece of host time inside one that did not wait is ``sync``.
_SYNC_LIKE = re.compile(r"synchroni[sz]e|eventquery|streamquery|^(cuda|hip)memcpy$|withstream", re.I)


def _launch_like(graph) -> np.ndarray:
    """Per runtime call: it launched GPU work (linked by correlation) or is a launch/copy API."""
    key = "launch_like"
    hit = graph.cache.get(key)
    if hit is None:
        rt = graph.trace.runtime
        hit = np.zeros(len(rt), dtype=bool)
        hit[graph.launch[graph.launch >= 0]] = True
        if len(rt):
            from diagnose.analyzers.hostcause import LAUNCH_API_KINDS

            hit |= rt["api_kind"].isin(LAUNCH_API_KINDS).to_numpy()
            # a copy that blocked by API (hipMemcpyWithStream...) is still a copy call
        graph.cache[key] = hit
    return hit
