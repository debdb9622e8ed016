"""One row per idle gap, with its cause and the attribution of every piece of it.

A **gap** is an interval of a device's window covered by none of its activities (all streams
merged; :func:`gap_bounds`): one row, whatever falls inside it.
Its pieces (README "Causes and levers"):

* **graph** — the next kernel comes from the same graph launch as the one before: the whole
  gap is ``graph`` (on ROCm the graph launch call runs during the replay: its timing says
  nothing);
* no launch call for the next activity: ``not_in_trace``; a launch call whose time is
  unusable (clock skew): ``unknown``;
* the **host part** ``[g0, min(g1, L.end)]`` (the next activity's launch call *L* ended after
  the GPU went idle): the host causes of :mod:`diagnose.analyzers.hostcause` for gaps of at
  least :data:`~diagnose.analyzers.hostcause.MIN_HOST_GAP_NS`, ``launch`` for shorter ones;
  untraced host time (``host_unknown``) in a host part no longer than
  :data:`~diagnose.analyzers.hostcause.LAUNCH_CEIL_NS` (what one launch can cost) is ``launch``,
  and in a host part whose traced time is mostly one-time setup it is that setup;
* the **queue part** ``[max(g0, L.end), g1]``: ``outside_trace`` when a stream/event wait on
  *L*'s thread precedes *L* by at most :data:`WAIT_CALL_LOOKBACK_NS` and the queue part is at
  least half the gap (the device was idle on every stream, so what it waited for is not in
  the trace); a wholly queued gap shorter than :data:`SWITCH_MAX_NS` is ``switch``; otherwise
  ``dependency``.

The gap's cause is the piece holding the most time (ties: host causes in precedence order,
then the others). Then: a ``launch`` gap next to a blocking call (issued by *L*'s thread
between the previous activity's launch and *L*'s end; polls excluded) or next to a copy from
or to pageable memory is ``host_blocked``: the host could not run ahead of the GPU there
(CUDA Runtime API, "API synchronization behavior"), and no graph can hold it.
"""
from __future__ import annotations

import re

import msgspec
import numpy as np
import pandas as pd

from diagnose.analyzers.hostcause import HOST_ID, LAUNCH_CEIL_NS, MIN_HOST_GAP_NS, HostCauses
from diagnose.analyzers.nesting import lexsort
from diagnose.trace.model import NO_TIME
from diagnose.vocab import GAP_CAUSES, GAP_KINDS, HOST_CAUSES

#: A wholly queued gap shorter than this is the GPU switching kernels, not a dependency:
#: back-to-back kernels on one stream start 1-3 µs apart (a Hugging Face forward on H100:
#: 1,164 such gaps: median 1.3 µs, max 2.8 µs).
SWITCH_MAX_NS = 5_000
#: How far before the launch a stream/event wait may be to explain a queued gap.
WAIT_CALL_LOOKBACK_NS = 10_000_000
#: A piece explains a gap when it holds at least this share of it (queue part -> outside_trace).
COVER_SHARE = 0.5

CAUSE_ID = {c: i for i, c in enumerate(GAP_CAUSES)}
N_CAUSES = len(GAP_CAUSES)
#: host cause id -> cause id
_HOST_TO_CAUSE = np.array([CAUSE_ID[c] for c in HOST_CAUSES], dtype=np.int64)
#: tie order of the argmax: host causes in precedence order, then the others
_TIE_RANK = np.array([HOST_CAUSES.index(c) if c in HOST_CAUSES else len(HOST_CAUSES) + i
                      for i, c in enumerate(GAP_CAUSES)], dtype=np.float64)
_WAIT_CALL = re.compile(r"StreamWaitEvent|StreamWaitValue|WaitExternalSemaphore", re.I)


class DeviceActs(msgspec.Struct):
    """One device's activities sorted by (start, end), with their launch columns (ns)."""

    start: np.ndarray
    end: np.ndarray
    launch_start: np.ndarray  # NO_TIME unknown
    launch_end: np.ndarray  # NO_TIME unknown (or clock skew)
    tid: np.ndarray  # launching thread, -1 unknown
    graph_followup: np.ndarray
    pageable: np.ndarray  # a copy from or to pageable memory
    names: np.ndarray
    step: np.ndarray  # row of the step table, -1 none
    graph_launched: np.ndarray  # launched by a graph launch (replayed)
    pos: np.ndarray  # each row's position in the frame it was built from
    phase: np.ndarray  # each row's phase (object)

    @classmethod
    def of(cls, acts: pd.DataFrame) -> "DeviceActs":
        """From activity rows of one device (any order): sorted by (start, end)."""
        n = len(acts)
        s0, e0 = acts["start_ns"].to_numpy(dtype=np.int64), acts["end_ns"].to_numpy(dtype=np.int64)
        o = lexsort((e0, s0))

        def col(name: str, default, dtype=np.int64) -> np.ndarray:
            return acts[name].to_numpy(dtype=dtype)[o] if name in acts else np.full(n, default, dtype=dtype)

        le = col("launch_end_ns", NO_TIME)
        if "clock_skewed" in acts:
            le = np.where(col("clock_skewed", False, bool), NO_TIME, le)
        names = acts["name"].to_numpy(dtype=object)[o] if n else np.zeros(0, dtype=object)
        kind = col("kind", "kernel", object)
        pageable = np.zeros(n, dtype=bool)
        cp = np.flatnonzero(kind == "memcpy")
        if len(cp):  # once per distinct name
            uniq, inv = np.unique(col("name_id", 0)[cp], return_inverse=True) if "name_id" in acts else (None, None)
            if uniq is None:
                pageable[cp] = ["pageable" in str(x).lower() for x in names[cp]]
            else:
                first = np.zeros(len(uniq), dtype=np.int64)
                first[inv.ravel()[::-1]] = cp[::-1]
                pageable[cp] = np.array(["pageable" in str(names[i]).lower() for i in first], dtype=bool)[inv.ravel()]
        return cls(s0[o], e0[o], col("launch_start_ns", NO_TIME), le, col("launch_tid", -1), col("graph_followup", False, bool),
                   pageable, names, col("step", -1), col("launch_kind", "", object) == "graph_launch", o,
                   col("phase", "unknown", object))

    def take(self, lo: int, hi: int) -> "DeviceActs":
        """Rows lo..hi-1."""
        return DeviceActs(*(getattr(self, f)[lo:hi] for f in self.__struct_fields__))

    def subset(self, m: np.ndarray) -> "DeviceActs":
        """The rows where ``m`` holds (still sorted)."""
        return DeviceActs(*(getattr(self, f)[m] for f in self.__struct_fields__))


class Gaps(msgspec.Struct):
    """One row per idle gap. Arrays aligned: start/end ns, kind (GAP_KINDS code), cause
    (GAP_CAUSES code), next/prev activity (indexes into the :class:`DeviceActs`), ``parts``
    (ns per cause, n x len(GAP_CAUSES): every piece's attribution), the next activity's
    launching thread, launch start and end, and the host causes' naming events (``named``:
    rows q (gap), c (cause id), name, ns)."""

    start: np.ndarray
    end: np.ndarray
    kind: np.ndarray
    cause: np.ndarray
    next_idx: np.ndarray
    prev_idx: np.ndarray
    parts: np.ndarray
    tid: np.ndarray
    launch_start: np.ndarray
    launch_end: np.ndarray
    named: pd.DataFrame
    _calls: dict | None = None  # gap -> the event that named its cause (built on first use)

    @property
    def ms(self) -> np.ndarray:
        return (self.end - self.start) / 1e6

    def __len__(self) -> int:
        return len(self.start)

    def subset(self, m: np.ndarray) -> "Gaps":
        """The gaps where ``m`` (bool) holds."""
        idx = np.flatnonzero(m)
        remap = np.full(len(self.start), -1, dtype=np.int64)
        remap[idx] = np.arange(len(idx))
        nm = self.named[np.isin(self.named["q"].to_numpy(), idx)].copy()
        nm["q"] = remap[nm["q"].to_numpy()]
        return Gaps(*(getattr(self, f)[idx] for f in ("start", "end", "kind", "cause", "next_idx", "prev_idx", "parts", "tid",
                                                     "launch_start", "launch_end")), named=nm)

    def copy(self) -> "Gaps":
        """A copy whose causes and pieces can be relabelled without touching this one."""
        return Gaps(self.start, self.end, self.kind, self.cause.copy(), self.next_idx, self.prev_idx, self.parts.copy(),
                    self.tid, self.launch_start, self.launch_end, self.named)

    def host_call_of(self, j: int) -> str | None:
        """The event that named gap ``j``'s cause (host causes only)."""
        if self._calls is None:
            nm = self.named
            q, c = nm["q"].to_numpy(dtype=np.int64), nm["c"].to_numpy(dtype=np.int64)
            own = c == self.cause[q].astype(np.int64) if len(q) else np.zeros(0, dtype=bool)
            self._calls = dict(zip(q[own].tolist(), nm["name"].to_numpy(dtype=object)[own].tolist()))
        name = self._calls.get(int(j))
        return None if name is None else str(name)


def empty_gaps() -> Gaps:
    z = np.zeros(0, dtype=np.int64)
    return Gaps(z, z, np.zeros(0, dtype=np.int8), np.zeros(0, dtype=np.int8), z, z, np.zeros((0, N_CAUSES)), z, z, z,
                pd.DataFrame({"q": z, "c": z, "name": np.zeros(0, dtype=object), "ns": np.zeros(0)}))


def gap_bounds(d: DeviceActs) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(start, end, next, prev) of every idle gap of ``d`` (module docstring): ``prev`` is the
    activity whose end opens the gap (the latest-ending one before it)."""
    from diagnose.analyzers.timeline import MIN_GAP_NS

    n = len(d.start)
    z = np.zeros(0, dtype=np.int64)
    if n < 2:
        return z, z, z, z
    cm = np.maximum.accumulate(d.end)
    who = np.where(d.end >= cm, np.arange(n), 0)
    last = np.maximum.accumulate(who)  # index attaining the running max end
    idx = np.flatnonzero(d.start[1:] - cm[:-1] >= MIN_GAP_NS) + 1
    return cm[idx - 1], d.start[idx], idx, last[idx - 1]


def explain_gaps(d: DeviceActs, gs: np.ndarray, ge: np.ndarray, nxt: np.ndarray, prv: np.ndarray,
                 host: HostCauses | None) -> Gaps:
    """Causes of the intervals [gs, ge) before activities ``nxt`` of ``d`` (``prv``: the
    activity that opened each, -1 none): one row each (module docstring)."""
    n = len(gs)
    if n == 0:
        return empty_gaps()
    le, ls, tid = d.launch_end[nxt], d.launch_start[nxt], d.tid[nxt]
    dur = ge - gs
    parts = np.zeros((n, N_CAUSES), dtype=np.float64)
    kind = np.full(n, GAP_KINDS.index("other"), dtype=np.int8)
    graph = d.graph_followup[nxt]
    unknown = (le == NO_TIME) & ~graph
    late = ~graph & ~unknown & (le > gs)
    kind[late] = GAP_KINDS.index("launch")
    kind[unknown] = GAP_KINDS.index("unattributed")
    kind[graph] = GAP_KINDS.index("graph")
    parts[graph, CAUSE_ID["graph"]] = dur[graph]
    parts[unknown & (tid < 0), CAUSE_ID["not_in_trace"]] = dur[unknown & (tid < 0)]
    parts[unknown & (tid >= 0), CAUSE_ID["unknown"]] = dur[unknown & (tid >= 0)]
    host_end = np.where(late, np.minimum(ge, le), gs)
    queue = ge - host_end
    queued = ~graph & ~unknown
    waits = _stream_wait_before(host, tid, ls) if host is not None else np.zeros(n, dtype=bool)
    q_cause = np.where(waits & (queue >= COVER_SHARE * dur), CAUSE_ID["outside_trace"],
                       np.where(~late & (dur < SWITCH_MAX_NS), CAUSE_ID["switch"], CAUSE_ID["dependency"]))
    qm = np.flatnonzero(queued & (queue > 0))
    parts[qm, q_cause[qm]] += queue[qm]
    small = late & (dur < MIN_HOST_GAP_NS)
    parts[small, CAUSE_ID["launch"]] += (host_end - gs)[small]
    big = late & ~small
    named = pd.DataFrame({"q": np.zeros(0, dtype=np.int64), "c": np.zeros(0, dtype=np.int64),
                          "name": np.zeros(0, dtype=object), "ns": np.zeros(0)})
    if big.any():
        bi = np.flatnonzero(big)
        if host is not None:
            ex = host.explain(tid[bi], gs[bi], host_end[bi])
            # untraced host time no longer than one launch can cost is that launch's
            short = (host_end - gs)[bi] <= LAUNCH_CEIL_NS
            ex.parts[short, HOST_ID["launch"]] += ex.parts[short, HOST_ID["host_unknown"]]
            ex.parts[short, HOST_ID["host_unknown"]] = 0.0
            _untraced_setup(ex.parts)
            parts[bi[:, None], _HOST_TO_CAUSE[None, :]] += ex.parts
            if len(ex.named):
                named = ex.named.assign(q=bi[ex.named["q"].to_numpy()], c=_HOST_TO_CAUSE[ex.named["c"].to_numpy()])
        else:
            parts[bi, CAUSE_ID["launch"]] += (host_end - gs)[bi]
    cause = np.full(n, CAUSE_ID["switch"], dtype=np.int8)
    cause[graph] = CAUSE_ID["graph"]
    cause[unknown] = np.where(tid[unknown] < 0, CAUSE_ID["not_in_trace"], CAUSE_ID["unknown"])
    qo = ~graph & ~unknown & ~late
    cause[qo] = q_cause[qo]
    li = np.flatnonzero(late)  # the pieces compete only where the host was late
    if len(li):
        p = parts[li]
        cause[li] = np.argmax(p - _TIE_RANK[None, :] * 1e-9 * (p > 0), axis=1)
    _serialized(d, host, cause, nxt, prv, gs, le, tid)
    return Gaps(gs, ge, kind, cause, nxt, prv, parts, tid, ls, le, named)


def _untraced_setup(parts: np.ndarray) -> None:
    """In place, per interval (rows of host-cause ns): untraced host time in an interval whose
    traced host time is mostly one-time setup (first-call setup, compilation) is that setup:
    between library-loading or compile calls the host runs the loader's or compiler's own code
    (nsys without OS or CPU sampling: the 121 ms of cuBLAS initialisation around 15
    cuLibraryLoadData calls)."""
    unk = parts[:, HOST_ID["host_unknown"]]
    traced = parts.sum(axis=1) - unk
    setup = parts[:, HOST_ID["first_call_setup"]] + parts[:, HOST_ID["cold_start"]]
    m = (unk > 0) & (traced > 0) & (setup >= COVER_SHARE * traced)
    if m.any():
        to = np.where(parts[:, HOST_ID["first_call_setup"]] >= parts[:, HOST_ID["cold_start"]],
                      HOST_ID["first_call_setup"], HOST_ID["cold_start"])
        rows = np.flatnonzero(m)
        parts[rows, to[rows]] += unk[rows]
        parts[rows, HOST_ID["host_unknown"]] = 0.0


def _stream_wait_before(host: HostCauses, tid: np.ndarray, ls: np.ndarray) -> np.ndarray:
    """Whether the launching thread issued a stream/event wait in the lookback before each launch."""
    out = np.zeros(len(tid), dtype=bool)
    idx = host.stream_waits()
    for t in np.unique(tid[tid >= 0]):
        w = idx.get(int(t))
        if w is None:
            continue
        m = (tid == t) & (ls != NO_TIME)
        hi = np.searchsorted(w, ls[m], side="right")
        lo = np.searchsorted(w, ls[m] - WAIT_CALL_LOOKBACK_NS, side="left")
        out[m] = hi > lo
    return out


def _serialized(d: DeviceActs, host: HostCauses | None, cause: np.ndarray, nxt: np.ndarray, prv: np.ndarray,
                gs: np.ndarray, le: np.ndarray, tid: np.ndarray) -> None:
    """In place: a launch gap next to a blocking call or a pageable copy is host_blocked."""
    m = cause == CAUSE_ID["launch"]
    if not m.any():
        return
    pag = d.pageable[nxt] | np.where(prv >= 0, d.pageable[np.maximum(prv, 0)], False)
    blk = np.zeros(len(cause), dtype=bool)
    if host is not None:
        lp = np.where(prv >= 0, d.launch_start[np.maximum(prv, 0)], NO_TIME)
        a = np.where(lp != NO_TIME, np.minimum(lp, gs), gs)
        idx = np.flatnonzero(m)
        blk[idx] = host.blocking_between(tid[idx], a[idx], np.maximum(le[idx], gs[idx]))
    cause[m & (pag | blk)] = CAUSE_ID["host_blocked"]


def kinds_from_causes(g: Gaps) -> np.ndarray:
    """Gap kinds as the gap lists and the timeline show them: ``launch`` only for gaps whose
    cause is launch (a host late for another reason is not a launch gap), ``graph`` and
    ``unattributed`` as found, the rest ``other``."""
    k = np.full(len(g.start), GAP_KINDS.index("other"), dtype=np.int8)
    k[g.cause == CAUSE_ID["launch"]] = GAP_KINDS.index("launch")
    k[g.kind == GAP_KINDS.index("graph")] = GAP_KINDS.index("graph")
    k[g.kind == GAP_KINDS.index("unattributed")] = GAP_KINDS.index("unattributed")
    return k


def host_time_for_stack(g: Gaps) -> np.ndarray:
    """Per gap, the moment whose host chain is its ``host_stack``: the middle of the host part
    before the launch call (``[g0, min(L.start, g1)]``), else the middle of the gap."""
    a = g.start
    b = np.where((g.launch_start != NO_TIME) & (g.launch_start > g.start), np.minimum(g.launch_start, g.end), g.end)
    return (a + b) // 2


#: Gaps at least this long may be listed (a step's waits): their host stack is prepared.
LISTED_MIN_NS = 50_000
#: The longest gaps of each set get their host stack prepared whatever their length.
LONGEST_PREPARED = 5


def host_need(d: DeviceActs, gs: np.ndarray, ge: np.ndarray, nxt: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tid, start, end) of the host time these gaps may be explained from: the host parts of
    those the host classifier reads, and the moment of the host stack of those that may be
    listed (the longest, and any of :data:`LISTED_MIN_NS` or more)."""
    le, tid = d.launch_end[nxt], d.tid[nxt]
    dur = ge - gs
    ok = tid >= 0
    late = ok & (le != NO_TIME) & (le > gs) & ~d.graph_followup[nxt] & (dur >= MIN_HOST_GAP_NS)
    a1, b1 = gs[late], np.minimum(ge, le)[late]
    listed = ok & (dur >= LISTED_MIN_NS)
    if len(dur) > LONGEST_PREPARED:
        top = np.argpartition(-dur, LONGEST_PREPARED)[:LONGEST_PREPARED]
        listed[top] = ok[top]
    else:
        listed = ok.copy()
    ls = d.launch_start[nxt]
    mid = (gs + np.where((ls != NO_TIME) & (ls > gs), np.minimum(ls, ge), ge)) // 2
    return (np.concatenate((tid[late], tid[listed])), np.concatenate((a1, mid[listed])), np.concatenate((b1, mid[listed] + 1)))
