"""How a listed gap or wait is described: the host event that named its cause, the host's
stack, what queued work waited on, its pieces; and per cause the frame holding most of it.
Shared by the phase rows, the steps' waits and the notebook (:mod:`diagnose.analyzers.waits`)."""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from diagnose.analyzers.gapcause import WAIT_CALL_LOOKBACK_NS, DeviceActs, Gaps, host_time_for_stack
from diagnose.analyzers.hostcause import HostCauses, name_test
from diagnose.trace.model import NO_TIME, Trace
from diagnose.vocab import GAP_CAUSES

#: host_stack entries kept (outermost first); longer chains keep their first and last ones.
STACK_MAX = 14


def cause_frames(g: Gaps) -> dict[str, tuple[str, float]]:
    """Per host cause, the event that named most of its time over the gaps of that cause:
    ``{cause: (name, ms)}``."""
    nm = g.named
    if not len(nm):
        return {}
    q, c = nm["q"].to_numpy(dtype=np.int64), nm["c"].to_numpy(dtype=np.int64)
    own = g.cause[q].astype(np.int64) == c
    if not own.any():
        return {}
    codes, names = pd.factorize(nm["name"].to_numpy(dtype=object)[own], use_na_sentinel=False)
    key = c[own] * (len(names) + 1) + codes
    uk, inv = np.unique(key, return_inverse=True)
    ns = np.bincount(inv.ravel(), weights=nm["ns"].to_numpy(dtype=np.float64)[own])
    kc = uk // (len(names) + 1)
    best = np.lexsort((-ns, kc))
    first = best[np.concatenate(([True], kc[best][1:] != kc[best][:-1]))]
    return {GAP_CAUSES[int(kc[i])]: (str(names[uk[i] % (len(names) + 1)]), round(float(ns[i]) / 1e6, 6)) for i in first}


def short_frame(name: str, width: int = 90) -> str:
    """A host event's name for display: python frames keep the file's last path part, line
    and function (``nanovllm/layers/attention.py(363): attention_cpu`` ->
    ``attention.py(363): attention_cpu``); anything else is cut to ``width`` characters."""
    s = str(name)
    head, sep, tail = s.partition("(")
    if sep and "/" in head and ")" in tail:
        s = head.rsplit("/", 1)[-1] + sep + tail
    return s if len(s) <= width else s[: width - 1] + "…"


def shorten_stack(names: list[str]) -> list[str]:
    """A host stack for display: names shortened, at most :data:`STACK_MAX` entries (the
    outermost three and the innermost ones, ``…`` between)."""
    out = [short_frame(n, 80) for n in names]
    if len(out) > STACK_MAX:
        out = out[:3] + ["…"] + out[-(STACK_MAX - 4):]
    return out


def describe(g: Gaps, d: DeviceActs, host: HostCauses | None, trace: Trace | None, idx: np.ndarray) -> list[dict[str, Any]]:
    """host_call, host_stack, waited_on and parts_ms of gaps ``idx``."""
    idx = np.asarray(idx, dtype=np.int64)
    stacks = host.stacks(g.tid[idx], host_time_for_stack(g)[idx]) if host is not None and len(idx) else [[] for _ in idx]
    out = []
    syncs = rtv = None
    if trace is not None and len(idx):
        syncs = host.cached("sorted_syncs", lambda: _sorted_syncs(trace)) if host is not None else _sorted_syncs(trace)
        rtv = host.cached("runtime_view", lambda: _RuntimeView(trace)) if host is not None else _RuntimeView(trace)
    for j, st in zip(idx.tolist(), stacks):
        cause = GAP_CAUSES[int(g.cause[j])]
        hc = g.host_call_of(j)
        if hc is None and cause != "launch" and rtv is not None:
            hc = rtv.cover(int(g.tid[j]), int(g.start[j]), int(g.end[j]))
        if hc is None and cause == "launch" and st:
            hc = st[-1]
        parts = {GAP_CAUSES[i]: round(float(v) / 1e6, 6) for i, v in enumerate(g.parts[j]) if v > 0}
        out.append({"host_call": None if hc is None else str(hc)[:200], "host_stack": shorten_stack(st),
                    "waited_on": _waited_on(rtv, g, j, cause, syncs), "parts_ms": parts})
    return out


class _RuntimeView:
    """The trace's runtime calls as arrays, read once per analysis by the per-gap lookups:
    starts, ends (ns), threads, name codes into ``names`` and the ``stream_wait`` name test."""

    def __init__(self, trace: Trace) -> None:
        rt = trace.runtime
        self.s = rt["start_ns"].to_numpy(dtype=np.int64)
        self.e = rt["end_ns"].to_numpy(dtype=np.int64)
        self.tid = rt["tid"].to_numpy(dtype=np.int64)
        codes, uniq = pd.factorize(rt["name"], use_na_sentinel=False) if len(rt) else (np.zeros(0, np.int64), [])
        self.code = np.asarray(codes, dtype=np.int64)
        self.names = np.array([str(u) for u in uniq], dtype=object)
        wait = np.array([name_test("stream_wait", n, "runtime") for n in self.names], dtype=bool)
        self.stream_wait = wait[self.code] if len(self.code) else np.zeros(0, dtype=bool)

    def cover(self, tid: int, a: int, b: int) -> str | None:
        """A runtime call of thread ``tid`` covering at least half of [a, b] (a host blocked
        behind queued work sat in it), else None: among the 200 calls starting last before
        ``b``, back to the first of the thread's that ended before ``a`` and started more than
        ten gap lengths before it, the one covering most (the latest of equals)."""
        if tid < 0 or not len(self.s):
            return None
        hi = int(np.searchsorted(self.s, b, side="right"))
        w = np.arange(hi - 1, max(hi - 200, 0) - 1, -1)  # latest first
        w = w[self.tid[w] == tid]
        if not len(w):
            return None
        stop = np.flatnonzero((self.e[w] < a) & (self.s[w] < a - 10 * (b - a)))
        if len(stop):
            w = w[: stop[0] + 1]
        c = np.minimum(self.e[w], b) - np.maximum(self.s[w], a)
        k = int(np.argmax(c))  # the first (latest) of the longest
        if c[k] <= 0 or c[k] * 2 < b - a:
            return None
        return str(self.names[self.code[w[k]]])

    def last_wait(self, tid: int, t: int) -> str | None:
        """The last stream/event wait call thread ``tid`` started within
        :data:`WAIT_CALL_LOOKBACK_NS` before ``t``, else None."""
        hi = int(np.searchsorted(self.s, t, side="left"))
        lo = int(np.searchsorted(self.s, t - WAIT_CALL_LOOKBACK_NS, side="left"))
        hit = np.flatnonzero((self.tid[lo:hi] == tid) & self.stream_wait[lo:hi])
        return str(self.names[self.code[lo + hit[-1]]]) if len(hit) else None


def _waited_on(rtv: _RuntimeView | None, g: Gaps, j: int, cause: str, sy: tuple | None = None) -> str | None:
    """For a queued gap (``dependency``, ``outside_trace``): the GPU-side wait (``cuda_sync``)
    covering it, else the last stream/event wait the launching thread issued within
    :data:`WAIT_CALL_LOOKBACK_NS` before queueing the work."""
    if cause not in ("dependency", "outside_trace") or rtv is None:
        return None
    a, b = int(g.start[j]), int(g.end[j])
    if sy is not None:
        s, e, names, cm = sy
        hi = int(np.searchsorted(s, b, side="left"))  # syncs starting before the gap's end ...
        if hi and cm[hi - 1] > a:  # ... one of which ends after its start
            k = hi - 1
            while k >= 0 and e[k] <= a:
                k -= 1
            return str(names[k])
    le, tid = int(g.launch_end[j]), int(g.tid[j])
    if le == NO_TIME or tid < 0 or not len(rtv.s):
        return None
    return rtv.last_wait(tid, le)


def _sorted_syncs(trace: Trace) -> tuple | None:
    """The trace's ``cuda_sync`` events sorted by start: starts, ends, names and the running
    maximum of the ends."""
    sy = trace.gpu_syncs
    if not len(sy):
        return None
    o = np.argsort(sy["start_ns"].to_numpy(), kind="stable")
    s, e = sy["start_ns"].to_numpy()[o], sy["end_ns"].to_numpy()[o]
    return s, e, sy["name"].to_numpy(dtype=object)[o], np.maximum.accumulate(e)
