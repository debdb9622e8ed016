"""GPU timeline: busy time as a union of intervals, idle gaps, and launch gaps.

Definitions (stated in the README, "Definitions"):

* **window** of a set of activities on one device = first activity start -> last activity end.
* **GPU busy** = length of the union of activity intervals (kernels, memcpy, memset; all
  streams merged): overlapping activities count once, zero-length ones count 0.
* **idle share** = 1 - busy / window.
* A **gap** is an interval inside the window covered by no activity; gaps shorter than 10 ns
  are timestamp rounding (µs with 3 decimals) and are not counted as gaps. The gap before
  activity *k* (in start order) is a **launch gap** when *k*'s host launch call ended after
  the GPU had finished everything before it (``launch_end_ns > previous busy end``): the GPU
  waited for the host. Only the host-late part plus a launch-latency allowance (20 µs, the
  order of a kernel's submit-to-start latency) counts as launch gap; whatever the GPU idled
  after that (the kernel was submitted but waited on an event or a copy) is **other**. A gap before a kernel replayed by the same CUDA/HIP graph launch as an earlier
  kernel is a **graph** gap (inside one replay), never a launch gap. A gap whose next
  activity was launched in time is **other** (dependency, sync, queueing); one whose next
  activity has no linked launch call is **unattributed**.
* **launch-gap share** = sum of launch gaps / window.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from diagnose.analyzers.base import declared
from diagnose.model import GapDistribution
from diagnose.trace.model import NO_TIME
from diagnose.vocab import GAP_KINDS

MIN_GAP_NS = 10
LAUNCH_LATENCY_NS = 20_000


def union_busy_ns(start_ns: np.ndarray, end_ns: np.ndarray) -> int:
    """Length of the union of [start, end) intervals in ns (int). Inputs need not be sorted."""
    if len(start_ns) == 0:
        return 0
    order = np.argsort(start_ns, kind="stable")
    s = np.asarray(start_ns)[order]
    e = np.asarray(end_ns)[order]
    cm = np.maximum.accumulate(e)
    # A new merged block starts where start > running max end of everything before it.
    prev_max = np.concatenate(([s[0]], cm[:-1]))
    new_block = s > prev_max
    new_block[0] = True
    block_id = np.cumsum(new_block) - 1
    block_start = s[new_block]
    block_end = block_start.astype(np.int64, copy=True)
    np.maximum.at(block_end, block_id, e)
    return int((block_end - block_start).sum())


def classify_gaps(
    s: np.ndarray, e: np.ndarray, launch_end_ns: np.ndarray, graph_followup: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Idle gaps of one device's activities and their kinds (module docstring).

    Args:
        s, e: int64 start/end ns, sorted by (start, end).
        launch_end_ns: end of each activity's launch call, NO_TIME when unknown.
        graph_followup: True for a non-first activity of one graph launch.

    Returns:
        (gap_start_ns, gap_end_ns, kind_code, next_index): kind_code indexes GAP_KINDS;
        next_index is the activity that follows each gap. A launch gap longer than its
        host-late part plus LAUNCH_LATENCY_NS is split: a launch interval, then an other one
        (same next_index).
    """
    z = np.zeros(0, dtype=np.int64)
    if len(s) < 2:
        return z, z, np.zeros(0, dtype=np.int8), z
    cm = np.maximum.accumulate(e)
    prev_end = cm[:-1]
    idx = np.nonzero(s[1:] - prev_end >= MIN_GAP_NS)[0] + 1
    g0, g1 = prev_end[idx - 1], s[idx]
    kind = np.full(len(idx), GAP_KINDS.index("other"), dtype=np.int8)
    unknown = launch_end_ns[idx] == NO_TIME
    kind[unknown] = GAP_KINDS.index("unattributed")
    late = (~unknown) & (launch_end_ns[idx] > g0)
    kind[late] = GAP_KINDS.index("launch")
    kind[graph_followup[idx]] = GAP_KINDS.index("graph")
    is_launch = kind == GAP_KINDS.index("launch")
    cut = np.where(is_launch, np.minimum(g1, launch_end_ns[idx] + LAUNCH_LATENCY_NS), g1)
    split = is_launch & (cut < g1)
    if split.any():
        starts = np.concatenate((g0, cut[split]))
        ends = np.concatenate((np.where(split, cut, g1), g1[split]))
        kinds = np.concatenate((kind, np.full(int(split.sum()), GAP_KINDS.index("other"), dtype=np.int8)))
        nexts = np.concatenate((idx, idx[split]))
        order = np.argsort(starts, kind="stable")
        return starts[order], ends[order], kinds[order], nexts[order]
    return g0, g1, kind, idx


@dataclass
class GapStats:
    """Idle gaps of one device/phase. Times in ns; shares are fractions of ``window_ns``.

    ``gap_start``/``gap_end``/``gap_kind`` (GAP_KINDS codes)/``gap_next`` describe every gap
    (a launch gap longer than its host-late part is split in two, see :func:`classify_gaps`);
    ``gap_next`` indexes the activities in ``order`` (start, end) order.
    """

    window_ns: int = 0
    busy_ns: int = 0
    gap_ns_by_kind: dict[str, int] = field(default_factory=lambda: {k: 0 for k in GAP_KINDS})
    gap_count_by_kind: dict[str, int] = field(default_factory=lambda: {k: 0 for k in GAP_KINDS})
    launch_gaps_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    all_gaps_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    order: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    gap_start: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    gap_end: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    gap_kind: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int8))
    gap_next: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def idle_share(self) -> float | None:
        return None if self.window_ns <= 0 else max(0.0, 1.0 - self.busy_ns / self.window_ns)

    @property
    def launch_gap_share(self) -> float | None:
        return None if self.window_ns <= 0 else self.gap_ns_by_kind["launch"] / self.window_ns


def analyze_gaps(
    start_ns: np.ndarray,
    end_ns: np.ndarray,
    launch_end_ns: np.ndarray,
    graph_followup: np.ndarray,
) -> GapStats:
    """Busy time, idle gaps and their kinds for activities of one device.

    Args:
        start_ns, end_ns: int64 arrays, one row per activity (any order).
        launch_end_ns: int64 end of each activity's host launch call; NO_TIME when unknown.
        graph_followup: bool, True for an activity replayed by a graph launch that already
            produced an earlier activity (same correlation id).

    Returns:
        GapStats with window, busy, per-kind gap totals and every gap.
    """
    st = GapStats()
    n = len(start_ns)
    if n == 0:
        return st
    order = np.lexsort((end_ns, start_ns))
    st.order = order
    s = np.asarray(start_ns, dtype=np.int64)[order]
    e = np.asarray(end_ns, dtype=np.int64)[order]
    le = np.asarray(launch_end_ns, dtype=np.int64)[order]
    gf = np.asarray(graph_followup, dtype=bool)[order]
    cm = np.maximum.accumulate(e)
    st.window_ns = int(cm[-1] - s[0])
    st.busy_ns = union_busy_ns(s, e)
    if n == 1:
        return st
    gap_start, gap_end, codes, idx = classify_gaps(s, e, le, gf)
    st.gap_start, st.gap_end, st.gap_kind, st.gap_next = gap_start, gap_end, codes, idx
    prev_end = cm[:-1]
    g = gap_end - gap_start
    whole = s[1:] - prev_end
    whole = whole[whole >= MIN_GAP_NS]  # each idle gap once, for the "all" distribution
    for i, k in enumerate(GAP_KINDS):
        m = codes == i
        st.gap_ns_by_kind[k] = int(g[m].sum())
        st.gap_count_by_kind[k] = int(m.sum())
    st.launch_gaps_ns = g[codes == GAP_KINDS.index("launch")]
    st.all_gaps_ns = whole
    return st


def gap_distribution(gaps_ns: np.ndarray) -> GapDistribution:
    """count, total, p50, p90, p99 and max of a gap sample, in µs (None when empty)."""
    if len(gaps_ns) == 0:
        return GapDistribution(count=0, total_us=0.0, p50_us=None, p90_us=None, p99_us=None, max_us=None)
    g = np.asarray(gaps_ns, dtype=np.float64) / 1e3
    p50, p90, p99 = np.percentile(g, [50, 90, 99])
    return GapDistribution(count=int(len(g)), total_us=round(float(g.sum()), 3), p50_us=round(float(p50), 3),
                           p90_us=round(float(p90), 3), p99_us=round(float(p99), 3), max_us=round(float(g.max()), 3))


FINDINGS = declared("timeline")
