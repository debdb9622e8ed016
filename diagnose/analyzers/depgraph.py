"""The dependency graph of a trace: what each GPU activity and each host call waited for.

Built once per analysis from the normalized trace and the activity table
(:func:`build_graph`), as numpy arrays (no per-event Python loop but over the few
cross-stream waits and blocking calls). Its elements:

* **GPU activities** (kernels, memcpy, memset of every device) sorted by (start, end), with
  three possible predecessors each:

  - *stream order*: the activity of the same stream (process, device, stream) that ended last
    before it (``prev``);
  - *launch*: the host call with its correlation id (``launch``: a row of ``trace.runtime``;
    a CUDA/HIP graph launch is the launch of every activity of its replay);
  - *cross-stream wait*: CUDA ``cuda_sync`` "Stream Wait Event" records: the activity waited
    on is the last one launched on ``wait_on_stream`` by the thread of the ``cudaEventRecord``
    whose correlation is ``wait_on_cuda_event_record_corr_id``, before that record call; the
    waiting one is the first launched on the waiting stream after the ``cudaStreamWaitEvent``
    call (``wait_src``). ROCm's ``hipStreamWaitEvent`` names no event, and older traces have no
    ``cuda_sync`` records: such waits are kept per thread as *unresolved*
    (``unresolved_waits``), and the next activity the thread launches is taken to wait for the
    other stream's work that ended last before it started (``_inferred_waits``).

  The **binding** predecessor (``bind``, ``bind_ns``) is the one that allowed the activity to
  start last (ties: stream, then wait, then launch).
* **Host threads**: the runtime/driver calls of each thread (``rt_*``), and the calls that
  **blocked the host on GPU work** (``blocking``): a ``*Synchronize`` call, or a launch/copy
  call whose own GPU activity ended before it returned (a blocking copy such as
  ``hipMemcpyWithStream`` or a pageable ``cudaMemcpyAsync``). The activity it waited for (its
  *release*) is the one that ended last before it returned among those launched before it
  (the synchronized stream only, for a stream sync whose ``cuda_sync`` record names it); a
  call whose release ended before the call began did not wait and is not kept.
* Host time itself (CPU ops, python frames, ranges) is read from the trace when a path or a
  what-if needs it (:mod:`diagnose.analyzers.hostpath`).

The critical path (:mod:`diagnose.analyzers.critpath`) walks this graph backwards; the
what-if (:mod:`diagnose.analyzers.whatif`) re-times it forwards. Design note: a linear pass
over time-ordered arrays, not networkx: see the README's design section for the
measurement.
"""
from __future__ import annotations

import re
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from diagnose.analyzers.nesting import lexsort
from diagnose.trace.model import NO_TIME, Trace, per_unique

#: A GPU activity that starts this long after every in-trace predecessor allowed it waited for
#: something the trace does not hold. HTA 0.6.1 (``KERNEL_KERNEL_DELAY_THRESHOLD_US`` in
#: ``hta/analyzers/critical_path_analysis.py``) uses the same 1.5 ms: "anything beyond 1.5ms
#: probably indicates an unrecognized dependency".
UNEXPLAINED_NS = 1_500_000
#: A blocking call's release may end up to this after the call returned (Kineto writes µs,
#: host and GPU timestamps are rounded separately).
RETURN_SLACK_NS = 1_000
#: Most activities looked at backwards from a sync call for its release (bounded work).
RELEASE_LOOKBACK = 512

SYNC_CALL = re.compile(r"^(cuda|hip|cu)(Device|Stream|Event|Ctx)Synchroni[sz]e", re.I)
WAIT_CALL = re.compile(r"StreamWaitEvent", re.I)

#: Kinds of GPU activity on a path (indices into critpath.PATH_KINDS).
OP_COMPUTE, OP_COMM, OP_COPY = 0, 1, 2
#: Binding predecessor codes.
BIND_NONE, BIND_STREAM, BIND_WAIT, BIND_LAUNCH = -1, 0, 1, 2
_NEG = np.int64(-(2**62))


class DepGraph(msgspec.Struct):
    """The arrays of the graph (module docstring). Activity arrays are in (start, end) order;
    ``row`` maps them back to the activity table; ``rt_*`` are aligned with ``trace.runtime``.

    Attributes:
        start, end: activity times (int64 ns).
        row: position in the activity table.
        stream: stream key (int64 code of (pid, device, stream)).
        kind: OP_COMPUTE | OP_COMM | OP_COPY.
        category_id: kernel category code (``diagnose.analyzers.categories.CATEGORY_NAMES``).
        name: activity names (object).
        step: step of the activity (-1 none).
        launch: launch call (row of ``trace.runtime``, -1 none); launch_start its start
            (NO_TIME none); graph: launched by a graph launch.
        prev, wait_src: stream and cross-stream predecessors (-1 none).
        bind, bind_ns: binding predecessor code and the time it allowed the start.
        rt_start, rt_end, rt_tid, rt_name: runtime calls.
        blocking: per thread (tid): (ends sorted, call rows, release activities) of the calls
            that blocked on GPU work.
        unresolved_waits: per thread: sorted start times of stream-wait calls the trace
            cannot resolve.
        prev_key, prev_cummax: activities sorted by launch time (their start when not
            launched) and the running max of their ends: the previous step's GPU end.
    """

    start: np.ndarray
    end: np.ndarray
    row: np.ndarray
    stream: np.ndarray
    kind: np.ndarray
    category_id: np.ndarray
    name: np.ndarray
    step: np.ndarray
    launch: np.ndarray
    launch_start: np.ndarray
    graph: np.ndarray
    prev: np.ndarray
    wait_src: np.ndarray
    bind: np.ndarray
    bind_ns: np.ndarray
    rt_start: np.ndarray
    rt_end: np.ndarray
    rt_tid: np.ndarray
    rt_name: np.ndarray
    blocking: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]
    unresolved_waits: dict[int, np.ndarray]
    prev_key: np.ndarray
    prev_cummax: np.ndarray
    trace: Any = None
    cache: dict = msgspec.field(default_factory=dict)  # per-thread host indexes (hostpath), built on demand

    @property
    def n(self) -> int:
        return int(len(self.start))

    def previous_gpu_end(self, t_ns: int) -> int | None:
        """The latest end of the activities launched before ``t_ns`` (started before it, when
        not launched in the trace): the previous step's GPU end. None when there is none."""
        k = int(np.searchsorted(self.prev_key, t_ns, side="left"))
        return int(self.prev_cummax[k - 1]) if k > 0 else None

    def of_rows(self, rows: np.ndarray) -> np.ndarray:
        """Graph indices of activity-table rows."""
        inv = self.cache.get("row_inv")
        if inv is None:
            inv = np.empty(len(self.row), dtype=np.int64)
            inv[self.row] = np.arange(len(self.row))
            self.cache["row_inv"] = inv
        return inv[np.asarray(rows, dtype=np.int64)]


def build_graph(trace: Trace, activities: pd.DataFrame) -> DepGraph:
    """The dependency graph of ``trace`` (module docstring).

    Args:
        trace: the normalized trace.
        activities: the activity table (:func:`diagnose.analyzers.activities.activity_table`:
            ``trace.gpu`` plus category_id, launch_row, launch_start_ns, launch_kind, step).
    """
    a = activities
    n = len(a)
    start0 = a["start_ns"].to_numpy(dtype=np.int64)
    end0 = np.maximum(a["end_ns"].to_numpy(dtype=np.int64), start0)
    ident = n < 2 or bool(np.all((start0[1:] > start0[:-1]) | ((start0[1:] == start0[:-1]) & (end0[1:] >= end0[:-1]))))
    order = np.arange(n) if ident else lexsort((end0, start0))  # one device: the loader's order already

    def col(name: str, dtype=None, default=None) -> np.ndarray:
        if name not in a:
            return np.full(n, default)
        v = a[name].to_numpy(dtype=dtype)
        return v if ident else v[order]

    start, end = (start0, end0) if ident else (start0[order], end0[order])
    stream = _stream_keys(a)
    stream = stream if ident else stream[order]
    from diagnose.analyzers.categories import CATEGORY_NAMES

    cat = col("category_id", np.int64, 0)
    names = list(CATEGORY_NAMES)
    copy_ids = [names.index(c) for c in ("memcpy", "memset") if c in names]
    kind = np.where(np.isin(cat, copy_ids), OP_COPY, np.where(cat == names.index("communication"), OP_COMM, OP_COMPUTE))
    launch = col("launch_row", np.int64, -1)
    launch_start = np.where(launch >= 0, col("launch_start_ns", np.int64, NO_TIME), NO_TIME)
    graph = col("launch_kind", object, "") == "graph_launch"
    prev = _stream_prev(stream, end)
    rt = trace.runtime
    rt_start = rt["start_ns"].to_numpy(dtype=np.int64)
    rt_end = np.maximum(rt["end_ns"].to_numpy(dtype=np.int64), rt_start)
    rt_tid = rt["tid"].to_numpy(dtype=np.int64)
    rt_name = rt["name"].to_numpy(dtype=object) if len(rt) else np.zeros(0, dtype=object)
    g = DepGraph(
        start=start, end=end, row=order, stream=stream, kind=kind.astype(np.int8), category_id=cat,
        name=col("name", object, ""), step=col("step", np.int64, -1),
        launch=launch, launch_start=launch_start, graph=graph, prev=prev, wait_src=np.full(n, -1, dtype=np.int64),
        bind=np.full(n, BIND_NONE, dtype=np.int8), bind_ns=np.full(n, _NEG, dtype=np.int64),
        rt_start=rt_start, rt_end=rt_end, rt_tid=rt_tid, rt_name=rt_name, blocking={}, unresolved_waits={},
        prev_key=np.zeros(0, dtype=np.int64), prev_cummax=np.zeros(0, dtype=np.int64), trace=trace)
    dev, st = col("device", np.int64, 0), col("stream", np.int64, 0)
    if n:
        _cross_stream_waits(g, trace, dev, st)
        _inferred_waits(g, dev)
        _binding(g)
        key = np.where(launch_start != NO_TIME, launch_start, start)
        ko = np.argsort(key, kind="stable")
        g.prev_key, g.prev_cummax = key[ko], np.maximum.accumulate(end[ko])
    if len(rt):
        _blocking_calls(g, trace, dev, st)
    return g


def _stream_keys(a: pd.DataFrame) -> np.ndarray:
    """One int64 code per (pid, device, stream)."""
    code = np.zeros(len(a), dtype=np.int64)
    for c in ("pid", "device", "stream"):
        if c in a:
            codes, uniq = pd.factorize(a[c].to_numpy(dtype=np.int64))
            code = code * max(len(uniq), 1) + codes
    return pd.factorize(code)[0].astype(np.int64)


def _stream_prev(stream: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per activity (in start order), the activity of its stream that ended last among the
    earlier ones (-1 for the first)."""
    n = len(stream)
    prev = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return prev
    by = np.argsort(stream, kind="stable")  # per stream, in start order
    s = stream[by]
    bounds = np.flatnonzero(np.concatenate(([True], s[1:] != s[:-1], [True])))
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        idx = by[lo:hi]
        e = end[idx]
        cm = np.maximum.accumulate(e)
        holder = np.maximum.accumulate(np.where(e >= cm, np.arange(len(e)), 0))  # position of the running max
        prev[idx[1:]] = idx[holder[:-1]]
    return prev


def _binding(g: DepGraph) -> None:
    """The binding predecessor of every activity (ties: stream, wait, launch)."""
    c_stream = np.where(g.prev >= 0, g.end[np.maximum(g.prev, 0)], _NEG)
    c_wait = np.where(g.wait_src >= 0, g.end[np.maximum(g.wait_src, 0)], _NEG)
    c_launch = np.where(g.launch_start != NO_TIME, g.launch_start, _NEG)
    best = np.maximum(np.maximum(c_stream, c_wait), c_launch)
    bind = np.where(c_stream == best, BIND_STREAM, np.where(c_wait == best, BIND_WAIT, BIND_LAUNCH))
    g.bind_ns = best
    g.bind = np.where(best == _NEG, BIND_NONE, bind).astype(np.int8)


def _first_by_corr(corr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct correlation ids >= 0, the first row having each)."""
    rows = np.flatnonzero(corr >= 0)
    o = np.argsort(corr[rows], kind="stable")
    sc = corr[rows][o]
    first = np.concatenate(([True], sc[1:] != sc[:-1])) if len(sc) else np.zeros(0, dtype=bool)
    return sc[first], rows[o][first]


def _lookup(keys: np.ndarray, rows: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Row of each ``want`` id among sorted ``keys`` (-1 when absent)."""
    if len(keys) == 0:
        return np.full(len(want), -1, dtype=np.int64)
    pos = np.minimum(np.searchsorted(keys, want), len(keys) - 1)
    return np.where((keys[pos] == want) & (want >= 0), rows[pos], -1)


def _cross_stream_waits(g: DepGraph, trace: Trace, dev: np.ndarray, st: np.ndarray) -> None:
    """``wait_src`` from CUDA "Stream Wait Event" records; stream-wait calls the trace cannot
    resolve (ROCm) into ``unresolved_waits``."""
    rt = trace.runtime
    sy = trace.gpu_syncs
    resolved_calls: set[int] = set()
    if len(sy) and len(rt) and "wait_stream" in sy:
        w = sy[(sy["name"].astype(str) == "Stream Wait Event") & (sy["wait_stream"] >= 0)
               & (sy["wait_record_correlation"] >= 0) & (sy["correlation"] >= 0)]
        if len(w):
            keys, rows = _first_by_corr(rt["correlation"].to_numpy(dtype=np.int64))
            rec = _lookup(keys, rows, w["wait_record_correlation"].to_numpy(dtype=np.int64))
            call = _lookup(keys, rows, w["correlation"].to_numpy(dtype=np.int64))
            # launched activities per (thread, device, stream), in launch order
            launched = np.flatnonzero(g.launch >= 0)
            tid = g.rt_tid
            groups = pd.DataFrame({"t": tid[g.launch[launched]], "d": dev[launched], "s": st[launched],
                                   "ls": g.launch_start[launched], "i": launched}).sort_values("ls", kind="stable")
            by = {k: (v["ls"].to_numpy(), v["i"].to_numpy()) for k, v in groups.groupby(["t", "d", "s"], sort=False)}
            rs = rt["start_ns"].to_numpy(dtype=np.int64)
            best_end: dict[int, int] = {}
            for r, c, d, ws, s in zip(rec.tolist(), call.tolist(), w["device"].tolist(), w["wait_stream"].tolist(),
                                      w["stream"].tolist()):
                if r < 0 or c < 0:
                    continue
                resolved_calls.add(c)
                src_l = by.get((int(tid[r]), d, ws))
                dst_l = by.get((int(tid[c]), d, s))
                if src_l is None or dst_l is None:
                    continue
                i = int(np.searchsorted(src_l[0], rs[r], side="left")) - 1
                j = int(np.searchsorted(dst_l[0], rs[c], side="right"))
                if i < 0 or j >= len(dst_l[0]):
                    continue
                src, dst = int(src_l[1][i]), int(dst_l[1][j])
                if g.end[src] > best_end.get(dst, _NEG):
                    best_end[dst] = int(g.end[src])
                    g.wait_src[dst] = src
    if len(rt):
        is_wait = per_unique(rt["name"], lambda u: bool(WAIT_CALL.search(str(u))))
        rows = np.flatnonzero(is_wait)
        if resolved_calls:
            rows = rows[~np.isin(rows, np.fromiter(resolved_calls, dtype=np.int64))]
        tids = rt["tid"].to_numpy(dtype=np.int64)[rows]
        starts = rt["start_ns"].to_numpy(dtype=np.int64)[rows]
        for t in np.unique(tids):
            g.unresolved_waits[int(t)] = np.sort(starts[tids == t])


def _inferred_waits(g: DepGraph, dev: np.ndarray) -> None:
    """A stream wait the trace cannot resolve (no ``cuda_sync`` record: ROCm, older Kineto)
    still made the next activity its thread launched wait for another stream: its wait source
    is taken to be the activity of another stream of its device that ended last before it
    started (it then binds only if it ended after the activity's other predecessors)."""
    if not g.unresolved_waits:
        return
    launched = np.flatnonzero(g.launch >= 0)
    ltid = g.rt_tid[g.launch[launched]]
    waiting = []
    for t, waits in g.unresolved_waits.items():
        mine = launched[ltid == t]
        if len(mine):
            mine = mine[np.argsort(g.launch_start[mine], kind="stable")]
            j = np.searchsorted(g.launch_start[mine], waits, side="right")
            waiting.append(mine[j[j < len(mine)]])
    if not waiting:
        return
    w = np.unique(np.concatenate(waiting))
    w = w[g.wait_src[w] < 0]
    for d in np.unique(dev[w]).tolist():
        wi = w[dev[w] == d]
        idx = np.flatnonzero(dev == d)
        idx = idx[np.argsort(g.end[idx], kind="stable")]
        k = np.searchsorted(g.end[idx], g.start[wi] + RETURN_SLACK_NS, side="right") - 1
        found = np.full(len(wi), -1, dtype=np.int64)
        for _ in range(16):  # back over activities of the waiting stream itself
            ok = k >= 0
            c = idx[np.maximum(k, 0)]
            hit = ok & (found < 0) & (g.stream[c] != g.stream[wi]) & (c != wi)
            found[hit] = c[hit]
            k = np.where(found < 0, k - 1, k)
            if not ((found < 0) & (k >= 0)).any():
                break
        g.wait_src[wi[found >= 0]] = found[found >= 0]


def _blocking_calls(g: DepGraph, trace: Trace, dev: np.ndarray, st: np.ndarray) -> None:
    """Per thread, the calls that blocked the host on GPU work, with their release activity."""
    rt = trace.runtime
    nrt = len(rt)
    release = np.full(nrt, -1, dtype=np.int64)
    # blocking copies: a launch/copy call whose one activity ran and ended within the call
    lo = g.launch
    has = lo >= 0
    if has.any():
        cnt = np.bincount(lo[has], minlength=nrt)
        single = has & (cnt[np.maximum(lo, 0)] == 1)
        within = single & (g.start >= g.rt_start[np.maximum(lo, 0)]) & (g.end <= g.rt_end[np.maximum(lo, 0)] + RETURN_SLACK_NS)
        release[lo[within]] = np.flatnonzero(within)
    # synchronize calls
    is_sync = per_unique(rt["name"], lambda u: bool(SYNC_CALL.search(str(u))))
    sync_rows = np.flatnonzero(is_sync)
    if len(sync_rows) and g.n:
        want_stream = _synced_streams(g, trace, sync_rows, dev, st)
        eo = np.argsort(g.end, kind="stable")
        ends = g.end[eo]
        # the activity that ended last before each call returned: usually the release
        cs_all, ce_all = g.rt_start[sync_rows], g.rt_end[sync_rows]
        k0 = np.searchsorted(ends, ce_all + RETURN_SLACK_NS, side="right") - 1
        i0 = eo[np.maximum(k0, 0)]
        ls0 = g.launch_start[i0]
        ok = (k0 >= 0) & (ends[np.maximum(k0, 0)] >= cs_all) & ((ls0 == NO_TIME) | (ls0 < cs_all)) \
            & ((want_stream < 0) | (g.stream[i0] == want_stream))
        release[sync_rows[ok]] = i0[ok]
        pend = np.flatnonzero(~ok & (k0 >= 0) & (ends[np.maximum(k0, 0)] >= cs_all))  # look further back
        k = k0[pend] - 1
        for _ in range(RELEASE_LOOKBACK):
            alive = (k >= 0) & (ends[np.maximum(k, 0)] >= cs_all[pend])
            pend, k = pend[alive], k[alive]
            if not len(pend):
                break
            i = eo[k]
            ls = g.launch_start[i]
            hit = ((ls == NO_TIME) | (ls < cs_all[pend])) & ((want_stream[pend] < 0) | (g.stream[i] == want_stream[pend]))
            release[sync_rows[pend[hit]]] = i[hit]
            pend, k = pend[~hit], k[~hit] - 1
    rows = np.flatnonzero(release >= 0)
    rel = release[rows]
    waited = g.end[rel] >= g.rt_start[rows]
    rows, rel = rows[waited], rel[waited]
    tids = g.rt_tid[rows]
    for t in np.unique(tids):
        m = tids == t
        e = g.rt_end[rows[m]]
        o = np.argsort(e, kind="stable")
        g.blocking[int(t)] = (e[o], rows[m][o], rel[m][o])


def _synced_streams(g: DepGraph, trace: Trace, sync_rows: np.ndarray, dev: np.ndarray, st: np.ndarray) -> np.ndarray:
    """Per sync call, the stream key it synchronizes (from a "Stream Sync" ``cuda_sync``
    record with its correlation), -1 for any stream."""
    out = np.full(len(sync_rows), -1, dtype=np.int64)
    sy = trace.gpu_syncs
    if not len(sy) or "correlation" not in sy:
        return out
    ss = sy[(sy["name"].astype(str) == "Stream Sync") & (sy["correlation"] >= 0)]
    if not len(ss):
        return out
    keys, rows = _first_by_corr(ss["correlation"].to_numpy(dtype=np.int64))
    corr = trace.runtime["correlation"].to_numpy(dtype=np.int64)[sync_rows]
    hit = _lookup(keys, rows, corr)
    # (device, stream) of the record -> the stream key of the activities on it
    pairs, first = np.unique(np.stack([dev, st], axis=1), axis=0, return_index=True)
    acts_key = {(int(d), int(s)): int(g.stream[i]) for (d, s), i in zip(pairs.tolist(), first.tolist())}
    sd = ss["device"].to_numpy(dtype=np.int64)
    sst = ss["stream"].to_numpy(dtype=np.int64)
    for j, h in enumerate(hit.tolist()):
        if h >= 0:
            out[j] = acts_key.get((int(sd[h]), int(sst[h])), -2)
    return out
