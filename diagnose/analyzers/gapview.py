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
    syncs = None
    if trace is not None and len(idx):
        syncs = host.cached("sorted_syncs", lambda: _sorted_syncs(trace)) if host is not None else _sorted_syncs(trace)
    for j, st in zip(idx.tolist(), stacks):
        cause = GAP_CAUSES[int(g.cause[j])]
        hc = g.host_call_of(j)
        if hc is None and cause != "launch":
            hc = _runtime_cover(trace, int(g.tid[j]), int(g.start[j]), int(g.end[j]))
        if hc is None and cause == "launch" and st:
            hc = st[-1]
        parts = {GAP_CAUSES[i]: round(float(v) / 1e6, 6) for i, v in enumerate(g.parts[j]) if v > 0}
        out.append({"host_call": None if hc is None else str(hc)[:200], "host_stack": shorten_stack(st),
                    "waited_on": _waited_on(trace, g, j, cause, syncs), "parts_ms": parts})
    return out


def _runtime_cover(trace: Trace | None, tid: int, a: int, b: int) -> str | None:
    """A runtime call of thread ``tid`` covering at least half of [a, b] (a host blocked
    behind queued work sat in it), else None."""
    if trace is None or tid < 0 or not len(trace.runtime):
        return None
    rt = trace.runtime
    s = rt["start_ns"].to_numpy()
    hi = int(np.searchsorted(s, b, side="right"))
    tids, ends = rt["tid"].to_numpy(), rt["end_ns"].to_numpy()
    best, cov = None, 0
    for i in range(hi - 1, max(hi - 200, 0) - 1, -1):
        if tids[i] != tid:
            continue
        c = min(int(ends[i]), b) - max(int(s[i]), a)
        if c > cov:
            best, cov = i, c
        if ends[i] < a and s[i] < a - 10 * (b - a):
            break
    if best is not None and cov * 2 >= b - a:
        return str(rt["name"].iloc[best])
    return None


def _waited_on(trace: Trace | None, g: Gaps, j: int, cause: str, sy: tuple | None = None) -> str | None:
    """For a queued gap (``dependency``, ``outside_trace``): the GPU-side wait (``cuda_sync``)
    covering it, else the last stream/event wait the launching thread issued within
    :data:`WAIT_CALL_LOOKBACK_NS` before queueing the work."""
    if cause not in ("dependency", "outside_trace") or trace is None:
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
    rt = trace.runtime
    if le == NO_TIME or tid < 0 or not len(rt):
        return None
    s = rt["start_ns"].to_numpy()
    hi = int(np.searchsorted(s, le, side="left"))
    lo = int(np.searchsorted(s, le - WAIT_CALL_LOOKBACK_NS, side="left"))
    tids = rt["tid"].to_numpy()[lo:hi]
    names = rt["name"].to_numpy(dtype=object)[lo:hi]
    for i in range(len(names) - 1, -1, -1):
        if tids[i] == tid and name_test("stream_wait", str(names[i]), "runtime"):
            return str(names[i])
    return None



def _sorted_syncs(trace: Trace) -> tuple | None:
    """The trace's ``cuda_sync`` events sorted by start: starts, ends, names and the running
    maximum of the ends."""
    sy = trace.gpu_syncs
    if not len(sy):
        return None
    o = np.argsort(sy["start_ns"].to_numpy(), kind="stable")
    s, e = sy["start_ns"].to_numpy()[o], sy["end_ns"].to_numpy()[o]
    return s, e, sy["name"].to_numpy(dtype=object)[o], np.maximum.accumulate(e)
