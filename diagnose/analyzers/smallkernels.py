"""The small-kernel tax of a step phase, measured against the steps' own time, and what
fusing the small kernels could save.

A kernel under 15 µs (:data:`~diagnose.analyzers.phasestats.SMALL_KERNEL_NS`) costs about as
much to start as to run. Within one step, on one stream, a **run** is a maximal sequence of
consecutive GPU activities that are all such kernels; fusing a run of ``k`` kernels into one
removes ``k - 1`` per-kernel fixed costs and the idle gaps between them:

    saving = sum over runs of ((k - 1) * KERNEL_FIXED_COST_NS + sum of the gaps inside the run)

Each gap counts up to 15 µs: a longer one is a wait (host, dependency), not kernel-boundary
overhead, and fusion does not remove it. Kernels separated by a longer kernel (or a copy)
are not merged. The tax's stake is this saving, not the small kernels' whole duration (most
of which is their work).
"""
from __future__ import annotations

from diagnose.analyzers.base import declared


import msgspec
import numpy as np
import pandas as pd

#: Fixed cost of one kernel inside a CUDA graph, ns: 1.1-1.3 µs per 1,024-element add replayed
#: in a CUDA graph (pytorch/pytorch#161104) and 0.58 µs per no-op graph node (ahrefs/ocannl#488,
#: RTX 5070 Ti, CUDA 13); the upper published figure. Eager launches cost more (5-20 µs of host
#: time per launch, HTA documentation): that is the launch cause of the idle gaps, not this tax.
KERNEL_FIXED_COST_NS = 1_300
#: A kernel shorter than this is small (the phase table's threshold).
SMALL_NS = 15_000
#: Share of the steps' own time in small kernels from which the report mentions them next to
#: another finding (docs/prefill-decode.md §5.1's 15 %; the small-kernel-tax rule's max_share).
NOTABLE_OWN_SHARE = 0.15

FINDINGS = declared("smallkernels")


class SmallKernelTax(msgspec.Struct, frozen=True):
    """Small kernels of the steps' own work in one phase on one device.

    Attributes:
        ns: their summed duration, ns.
        count: how many.
        own_share: ``ns`` over the steps' own time (None without own time).
        saving_ns: what fusing their runs could save (module docstring), ns.
        merges: kernels that fusing would remove (sum of ``k - 1`` over runs).
    """

    ns: int
    count: int
    own_share: float | None
    saving_ns: float
    merges: int


def small_kernel_tax(sub: pd.DataFrame, own_ns: int | None) -> SmallKernelTax:
    """:class:`SmallKernelTax` of a phase's activities ``sub`` (columns kind, start_ns, end_ns,
    step, device, stream; pid optional): the activities of its steps (``step >= 0``) only."""
    if len(sub) == 0 or "step" not in sub:
        return SmallKernelTax(0, 0, None, 0.0, 0)
    step = sub["step"].to_numpy(dtype=np.int64)
    own = step >= 0
    if not own.any():
        return SmallKernelTax(0, 0, None, 0.0, 0)
    start = sub["start_ns"].to_numpy(dtype=np.int64)[own]
    end = sub["end_ns"].to_numpy(dtype=np.int64)[own]
    dur = end - start
    small = (sub["kind"].to_numpy(dtype=object)[own] == "kernel") & (dur < SMALL_NS)
    ns, count = int(dur[small].sum()), int(small.sum())
    share = ns / own_ns if own_ns else None
    keys = [step[own], sub["device"].to_numpy(dtype=np.int64)[own], sub["stream"].to_numpy(dtype=np.int64)[own]]
    if "pid" in sub:
        keys.append(sub["pid"].to_numpy(dtype=np.int64)[own])
    order = np.lexsort([start] + keys[::-1])
    same = np.ones(max(len(order) - 1, 0), dtype=bool)
    for k in keys:
        ks = k[order]
        same &= ks[1:] == ks[:-1]
    sm = small[order]
    pair = same & sm[1:] & sm[:-1]
    gaps = np.clip(start[order][1:] - end[order][:-1], 0, SMALL_NS)
    merges = int(pair.sum())
    saving = float(merges * KERNEL_FIXED_COST_NS + gaps[pair].sum())
    return SmallKernelTax(ns, count, share, saving, merges)
