"""Steps from the structure of the GPU work alone (no markers, no ProfilerStep, no frames).

Works on GPU activities only (start, end, name), so it also runs on a trace whose CPU side is
missing. Every threshold is relative to the trace itself or semantic; none is fitted to a
trace:

1. Merge the activities of every stream into busy intervals; the idle gaps between them are
   the trace's own gap distribution.
2. **Natural breaks**: sort the gaps, longest first; a gap at least :data:`BREAK_RATIO` times
   the next shorter one is a candidate cut level (the gaps that bound steps are several times
   every gap inside a step, at any time scale: 10 µs or 50 ms). Gaps are floored at
   :data:`EPS_NS`, the 1 µs resolution of older Kineto JSON, so ratios between sub-µs gaps
   are noise, not breaks. Levels are tried from the one giving the most cuts to the fewest;
   the first whose bursts pass the guards wins (regular step boundaries survive one long
   external wait elsewhere in the trace).
3. Guards on a level's bursts (what two steps of one model have in common):
   a. a burst without a compute kernel (GEMM, attention, MoE, convolution) is auxiliary; it is
      dropped as a crumb only if it carries at most :data:`CRUMB_SHARE` of the GPU busy time,
      otherwise the level is rejected (a dropped burst must not carry work);
   b. with two or more compute bursts, neighbours (one or two apart) must repeat: the
      weighted Jaccard ``Σmin/Σmax`` of their kernel-name counts at least :data:`SIM` (steps
      run the same kernels the same number of times; it is scale-sensitive, so a 3-layer
      piece and a 1-layer piece are not alike);
   c. every inner compute burst runs at least :data:`COUNT_SHARE` of the kernels of the
      largest one (pieces of a step hold fewer; a prefill and a decode step of one model pass).
4. When no level passes, or one burst remains: the **exact kernel-name period** of the burst
   (the smallest p with name[i] == name[i + p]) cuts a window that starts or ends inside a
   step, when the repeated border n - p is at least :data:`MIN_BORDER_SHARE` of the period (a
   coincidental repeated prefix of a few kernels is not a step) and a period holds a layer
   repeated back to back (:func:`has_tandem_repeat`). The cut is at the position, modulo p,
   with the most idle time before it. A single burst without a period is a step when it
   holds a repeated layer (a model forward); a lone burst of a few kernels is not.
5. First and last bursts cut by the profiling window are **partial**: with the gap method,
   fewer than :data:`PARTIAL_SHARE` of the median kernel count (three bursts or more); with the
   period method, a piece of another length than p. They are reported, never timed as steps.

Known limits: steps back to back with no idle gap and no exact period (asynchronous
scheduling, overlapped schedulers) stay one burst; gaps inside a cold first iteration that
exceed the gaps between steps hide the boundaries; a step's tail that interleaves with the
next step's first copies on another stream breaks the exact period.
"""
from __future__ import annotations

import re

import msgspec
import numpy as np

BREAK_RATIO = 4.0
EPS_NS = 1_000
CRUMB_SHARE = 0.01
SIM = 0.9
COUNT_SHARE = 0.5
MIN_BORDER_SHARE = 0.1
PARTIAL_SHARE = 0.9
#: A layer is at least this many kernels (a norm, a projection, attention, an activation).
MIN_TANDEM = 4
#: Candidate layer lengths tried by :func:`has_tandem_repeat` (the most frequent distances
#: between repeats of a kernel name): bounds the work on long sequences.
TANDEM_CANDIDATES = 12
#: Candidate periods verified on the whole sequence by :func:`smallest_period`.
PERIOD_CANDIDATES = 64

#: Convolution kernels (cuDNN / MIOpen / cutlass conv) are compute.
CONV_KERNEL = re.compile(r"convolution|conv2d|_conv_|fprop|dgrad|wgrad|winograd|implicit_gemm|fft2d|cudnn::cnn|"
                         r"nchwToNhwc|scudnn|miopen.*conv|igemm", re.I)


class Burst(msgspec.Struct, frozen=True):
    """One burst of GPU work: activity positions [lo, hi) in the detector's sorted input."""

    lo: int
    hi: int
    partial: bool = False


class Structure(msgspec.Struct, frozen=True):
    """What :func:`detect` found: the bursts (steps and partial ones), the crumbs dropped and
    how (``method``: gaps | period | window | none; ``note``: the level or period used)."""

    bursts: tuple[Burst, ...] = ()
    method: str = "none"
    note: str = ""
    crumbs: tuple[Burst, ...] = msgspec.field(default_factory=tuple)

    @property
    def steps(self) -> tuple[Burst, ...]:
        return tuple(b for b in self.bursts if not b.partial)


def _busy_intervals(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(interval id per activity, interval start, interval end) of the union of [start, end)
    (activities sorted by start)."""
    cm = np.maximum.accumulate(end)
    new = np.ones(len(start), dtype=bool)
    new[1:] = start[1:] > cm[:-1]
    iv = np.cumsum(new) - 1
    last = np.r_[np.flatnonzero(new)[1:] - 1, len(start) - 1]
    return iv, start[new], cm[last]


def weighted_jaccard_pairs(burst: np.ndarray, codes: np.ndarray, n_bursts: int, d: int) -> np.ndarray:
    """Σmin/Σmax of the kernel-name counts of bursts i and i + d, for every i (float array of
    n_bursts - d; activities with burst -1 are ignored)."""
    if n_bursts <= d:
        return np.zeros(0)
    ok = burst >= 0
    if not ok.any():
        return np.zeros(n_bursts - d)
    k = int(codes.max()) + 1 if len(codes) else 1
    key, cnt = np.unique(burst[ok].astype(np.int64) * k + codes[ok], return_counts=True)
    b = key // k
    tot = np.bincount(b, weights=cnt, minlength=n_bursts)
    pos = np.searchsorted(key, key + d * k)
    pos_c = np.minimum(pos, len(key) - 1)
    match = (pos < len(key)) & (key[pos_c] == key + d * k)
    mins = np.where(match, np.minimum(cnt, cnt[pos_c]), 0)
    smin = np.bincount(b, weights=mins, minlength=n_bursts)[: n_bursts - d]
    smax = tot[: n_bursts - d] + tot[d:] - smin
    return np.divide(smin, smax, out=np.zeros(len(smin), dtype=np.float64), where=smax > 0)


def _longest_true_run(eq: np.ndarray) -> int:
    if not eq.any():
        return 0
    idx = np.flatnonzero(~eq)
    edges = np.r_[-1, idx, len(eq)]
    return int(np.diff(edges).max() - 1)


def has_tandem_repeat(codes: np.ndarray, min_q: int = MIN_TANDEM) -> bool:
    """True when the sequence holds some x + x with len(x) >= ``min_q``: a layer repeated back
    to back. Candidate lengths q are the most frequent distances between consecutive
    occurrences of one name (a layer of q kernels puts each of its names q apart)."""
    n = len(codes)
    if n < 2 * min_q:
        return False
    order = np.argsort(codes, kind="stable")
    sc = codes[order]
    same = sc[1:] == sc[:-1]
    dist = (order[1:] - order[:-1])[same]
    dist = dist[(dist >= min_q) & (dist <= n // 2)]
    if len(dist) == 0:
        return False
    qs, cnt = np.unique(dist, return_counts=True)
    for q in qs[np.argsort(-cnt, kind="stable")][:TANDEM_CANDIDATES]:
        if _longest_true_run(codes[q:] == codes[:-q]) >= q:
            return True
    return False


def smallest_period(codes: np.ndarray, max_period: int) -> int | None:
    """The smallest p <= ``max_period`` with codes[i] == codes[i + p] for every i, or None.
    Candidates are the positions of the first name (codes[p] == codes[0]) that also agree at
    the last position and at evenly spaced probes; the survivors are checked on the whole
    sequence, shortest first."""
    n = len(codes)
    if n < 2 or max_period < 1:
        return None
    cand = np.flatnonzero(codes[1:max_period + 1] == codes[0]) + 1
    if len(cand) == 0:
        return None
    cand = cand[codes[n - 1 - cand] == codes[n - 1]]
    for j in np.linspace(0, n - 1, 33, dtype=np.int64)[1:-1]:
        if len(cand) == 0:
            return None
        inside = j + cand < n
        cand = cand[~inside | (codes[np.minimum(j + cand, n - 1)] == codes[j])]
    for p in cand[:PERIOD_CANDIDATES]:
        if np.array_equal(codes[p:], codes[:n - p]):
            return int(p)
    return None


def _period_cut(start: np.ndarray, end: np.ndarray, codes: np.ndarray, lo: int, hi: int) -> tuple[list[Burst], str] | None:
    """Step 4 of the module docstring on the activities [lo, hi)."""
    seq = codes[lo:hi]
    n = len(seq)
    p = smallest_period(seq, int(n / (1 + MIN_BORDER_SHARE)))
    if p is None or n - p < MIN_BORDER_SHARE * p or not has_tandem_repeat(seq[:p]):
        return None
    s, e = start[lo:hi], end[lo:hi]
    cm = np.maximum.accumulate(e)
    idle = np.r_[0, np.maximum(0, s[1:] - cm[:-1])]
    r0 = int(np.argmax(np.bincount(np.arange(n) % p, weights=idle, minlength=p)))
    cuts = sorted({0, *range(r0, n, p), n})
    pieces = [Burst(lo + a, lo + b, partial=(b - a) != p) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]
    return pieces, f"the kernel sequence repeats with period {p} (border {n - p}), cut where the most idle time precedes"


def detect(start: np.ndarray, end: np.ndarray, codes: np.ndarray, compute: np.ndarray) -> Structure:
    """Bursts of GPU work that look like steps (module docstring).

    Args:
        start, end: int64 ns of the activities, sorted by start (one device, all streams).
        codes: int64 kernel-name codes (equal names, equal codes).
        compute: bool, True for compute kernels (GEMM, attention, MoE, convolution).
    """
    n = len(start)
    if n == 0 or not compute.any():
        return Structure(note="no GEMM, attention or convolution kernel: no model step")
    iv, iv_s, iv_e = _busy_intervals(start, end)
    gaps = iv_s[1:] - iv_e[:-1]
    iv_len = (iv_e - iv_s).astype(np.float64)
    total_busy = float(iv_len.sum())
    levels: list[tuple[int, float, int]] = []
    if len(gaps) >= 2:
        gs = np.sort(gaps)[::-1]
        fl = np.maximum(gs, EPS_NS).astype(np.float64)
        ratio = fl[:-1] / fl[1:]
        for k in np.flatnonzero(ratio >= BREAK_RATIO)[::-1]:  # most cuts first
            levels.append((int(k), float(ratio[k]), int(gs[k])))
    rejected = []
    for _k, r, thr in levels:
        cut_iv = np.r_[0, np.cumsum(gaps >= thr)]
        burst = cut_iv[iv]
        nb = int(burst[-1]) + 1
        cnt = np.bincount(burst, minlength=nb)
        has_c = np.bincount(burst, weights=compute, minlength=nb) > 0
        busy = np.bincount(cut_iv, weights=iv_len, minlength=nb)
        if (busy[~has_c] > CRUMB_SHARE * total_busy).any():
            rejected.append(f"{thr / 1e6:.3f} ms: an auxiliary burst carries > {CRUMB_SHARE:.0%} of the busy time")
            continue
        real = np.flatnonzero(has_c)
        if len(real) >= 2:
            rc = cnt[real]
            if len(real) > 2 and (rc[1:-1] < COUNT_SHARE * rc.max()).any():
                rejected.append(f"{thr / 1e6:.3f} ms: pieces of a step")
                continue
            rank = np.full(nb, -1, dtype=np.int64)
            rank[real] = np.arange(len(real))
            rb = rank[burst]
            sim = np.r_[weighted_jaccard_pairs(rb, codes, len(real), 1), weighted_jaccard_pairs(rb, codes, len(real), 2)]
            if not (sim >= SIM).any():
                rejected.append(f"{thr / 1e6:.3f} ms: the bursts do not repeat")
                continue
        first = np.r_[0, np.flatnonzero(np.diff(burst)) + 1]
        bounds = np.r_[first, n]
        bursts = [Burst(int(bounds[b]), int(bounds[b + 1])) for b in real]
        crumbs = tuple(Burst(int(bounds[b]), int(bounds[b + 1])) for b in np.flatnonzero(~has_c))
        note = f"idle gaps >= {thr / 1e6:.3f} ms ({r:.1f}x the next shorter gap) bound {len(bursts)} burst(s)"
        if len(bursts) >= 3:
            med = float(np.median(rc))
            for j in (0, len(bursts) - 1):
                if rc[j] < PARTIAL_SHARE * med:
                    bursts[j] = Burst(bursts[j].lo, bursts[j].hi, partial=True)
        if len(bursts) >= 2:
            return Structure(tuple(bursts), "gaps", note, crumbs)
        return _single(start, end, codes, bursts[0], note, crumbs)
    note = "no natural break in the idle gaps" + (f" (rejected: {'; '.join(rejected[:3])})" if rejected else "")
    return _single(start, end, codes, Burst(0, n), note, ())


def _single(start, end, codes, b: Burst, note: str, crumbs: tuple) -> Structure:
    cut = _period_cut(start, end, codes, b.lo, b.hi)
    if cut is not None:
        pieces, how = cut
        return Structure(tuple(pieces), "period", f"{note}; {how}", crumbs)
    if has_tandem_repeat(codes[b.lo:b.hi]):
        return Structure((b,), "window", f"{note}; one burst holding a repeated layer", crumbs)
    return Structure((), "none", f"{note}; one burst without a repeated layer: not a model step", crumbs)
