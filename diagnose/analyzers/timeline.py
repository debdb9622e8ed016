"""GPU timeline: busy time as a union of intervals, idle gaps, and launch gaps.

Definitions (stated in the README, "Definitions"):

* **window** of a set of activities on one device = first activity start -> last activity end.
* **GPU busy** = length of the union of activity intervals (kernels, memcpy, memset; all
  streams merged): overlapping activities count once, zero-length ones count 0.
* **idle share** = 1 - busy / window.
* A **gap** is an interval inside the window covered by no activity; gaps shorter than 10 ns
  are timestamp rounding (µs with 3 decimals) and are not counted as gaps. One idle interval
  is one gap, whatever boundaries fall inside it; its cause and the attribution of its pieces
  come from :mod:`diagnose.analyzers.waits`. Its **kind**: **graph** when the next kernel was
  replayed by the same CUDA/HIP graph launch as the one before (inside one replay, never a
  launch gap); **unattributed** when the next activity has no usable launch call; **launch**
  when its cause is ``launch`` (the host was late and was dispatching: the GPU waited for
  launches); **other** for every other cause (a host late for another reason, a dependency,
  a sync, queueing).
* **launch-gap share** = sum of launch gaps / window.
"""
from __future__ import annotations


import msgspec
import numpy as np

from diagnose.analyzers.base import declared
from diagnose.model import GapDistribution
from diagnose.vocab import GAP_KINDS

MIN_GAP_NS = 10


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


def union_by_group_ns(start_ns: np.ndarray, end_ns: np.ndarray, group: np.ndarray, n_groups: int) -> np.ndarray:
    """Length of the union of [start, end) intervals within each group, in ns (int64 array of
    ``n_groups``): one sort for every group. Each group is shifted past the others' span, so
    merged blocks never cross groups (``group`` holds indexes in [0, n_groups))."""
    out = np.zeros(n_groups, dtype=np.int64)
    if len(start_ns) == 0:
        return out
    s = np.asarray(start_ns, dtype=np.int64)
    e = np.asarray(end_ns, dtype=np.int64)
    lo = int(s.min())
    span = int(e.max()) - lo + 1
    shift = np.asarray(group, dtype=np.int64) * span - lo
    s, e = s + shift, e + shift
    order = np.argsort(s, kind="stable")
    s, e, g = s[order], e[order], np.asarray(group, dtype=np.int64)[order]
    cm = np.maximum.accumulate(e)
    new_block = np.empty(len(s), dtype=bool)
    new_block[0] = True
    new_block[1:] = s[1:] > cm[:-1]
    starts = np.nonzero(new_block)[0]
    block_end = np.maximum.reduceat(e, starts)
    np.add.at(out, g[starts], block_end - s[starts])
    return out


class GapStats(msgspec.Struct):
    """Idle gaps of one device/phase. Times in ns; shares are fractions of ``window_ns``.

    ``gap_start``/``gap_end``/``gap_kind`` (GAP_KINDS codes)/``gap_next`` describe every gap,
    one row per idle interval (:mod:`diagnose.analyzers.waits`); ``gap_next`` indexes the
    activities sorted by (start, end).
    """

    window_ns: int = 0
    busy_ns: int = 0
    gap_ns_by_kind: dict[str, int] = msgspec.field(default_factory=lambda: {k: 0 for k in GAP_KINDS})
    gap_count_by_kind: dict[str, int] = msgspec.field(default_factory=lambda: {k: 0 for k in GAP_KINDS})
    launch_gaps_ns: np.ndarray = msgspec.field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    all_gaps_ns: np.ndarray = msgspec.field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    order: np.ndarray = msgspec.field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    gap_start: np.ndarray = msgspec.field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    gap_end: np.ndarray = msgspec.field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    gap_kind: np.ndarray = msgspec.field(default_factory=lambda: np.zeros(0, dtype=np.int8))
    gap_next: np.ndarray = msgspec.field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def idle_share(self) -> float | None:
        return None if self.window_ns <= 0 else max(0.0, 1.0 - self.busy_ns / self.window_ns)

    @property
    def launch_gap_share(self) -> float | None:
        return None if self.window_ns <= 0 else self.gap_ns_by_kind["launch"] / self.window_ns


def gap_distribution(gaps_ns: np.ndarray) -> GapDistribution:
    """count, total, p50, p90, p99 and max of a gap sample, in µs (None when empty)."""
    if len(gaps_ns) == 0:
        return GapDistribution(count=0, total_us=0.0, p50_us=None, p90_us=None, p99_us=None, max_us=None)
    g = np.asarray(gaps_ns, dtype=np.float64) / 1e3
    p50, p90, p99 = np.percentile(g, [50, 90, 99])
    return GapDistribution(count=int(len(g)), total_us=round(float(g.sum()), 3), p50_us=round(float(p50), 3),
                           p90_us=round(float(p90), 3), p99_us=round(float(p99), 3), max_us=round(float(g.max()), 3))


FINDINGS = declared("timeline")
