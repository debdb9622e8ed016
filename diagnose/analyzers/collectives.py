"""Collective kernels split into communication and waiting for peers (``collective_wait``).

A collective (all-reduce, all-gather, all-to-all...) finishes on a rank only when every rank
has arrived: a rank that arrives early spends the difference inside the kernel. Within one
rank's file, the calls of **the same collective and size** — the same kernel name, launched by
the same operator with the same input shapes (``Input Dims``) — move the same bytes; the
fastest of them is taken as the communication, and each call's excess over it as time waiting
for peers. This is a lower bound of the wait (the fastest call may have waited too) and needs
the sizes: a collective kernel without a linked operator carrying input shapes is counted as
communication only. Across ranks (several files of one job) the i-th call of each rank is the
same collective (NCCL requires the same order); this module reads one file. The operator is
the one the kernel's External id names, else the innermost one with input shapes enclosing
its launch call.
"""
from __future__ import annotations

import re

import msgspec
import numpy as np
import pandas as pd

from diagnose.analyzers.base import declared
from diagnose.analyzers.nesting import last_above, lexsort
from diagnose.trace.model import Trace, factorize
from diagnose.vocab import CATEGORIES

FINDINGS = declared("collectives")

_COMM = CATEGORIES.index("communication")


class Collectives(msgspec.Struct, frozen=True):
    """Per activity row (aligned with the activity table): ``wait_ns`` (excess over the fastest
    call of its collective and size; 0 for anything else) and ``comm_ns`` (its communication
    part: the fastest call's duration, or its whole duration when its size is unknown);
    ``label`` per row: the collective (operator and kernel) for naming."""

    wait_ns: np.ndarray
    comm_ns: np.ndarray
    label: np.ndarray


def collective_split(trace: Trace, acts: pd.DataFrame) -> Collectives:
    """Communication and waiting of every collective kernel of ``acts`` (module docstring)."""
    n = len(acts)
    wait = np.zeros(n, dtype=np.int64)
    comm = np.zeros(n, dtype=np.int64)
    label = np.full(n, None, dtype=object)
    if n == 0 or "category_id" not in acts:
        return Collectives(wait, comm, label)
    is_comm = acts["category_id"].to_numpy() == _COMM
    dur = (acts["end_ns"] - acts["start_ns"]).to_numpy()
    comm[is_comm] = dur[is_comm]
    idx = np.flatnonzero(is_comm)
    ops = trace.cpu_ops
    if not len(idx) or not len(ops):
        return Collectives(wait, comm, label)
    rows = _sized_ops(trace, acts, idx)
    ok = rows >= 0
    idx, rows = idx[ok], rows[ok]
    if not len(idx):
        return Collectives(wait, comm, label)
    dims = ops["input_dims"].to_numpy(dtype=object)[rows]
    op_names = ops["name"].to_numpy(dtype=object)[rows]
    kname = acts["name_id"].to_numpy()[idx] if "name_id" in acts else factorize(acts["name"].to_numpy(dtype=object)[idx])[0]
    keys = np.stack([np.asarray(kname, dtype=np.int64), factorize(op_names)[0], factorize(dims)[0]], axis=1)
    _, grp = np.unique(keys, axis=0, return_inverse=True)
    grp = grp.ravel()
    d = dur[idx]
    mins = np.full(grp.max() + 1, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(mins, grp, d)
    mn, cnt = mins[grp], np.bincount(grp)[grp]
    w = np.where(cnt >= 2, d - mn, 0)
    wait[idx] = w
    comm[idx] = d - w
    names = acts["name"].to_numpy(dtype=object)[idx]
    label[idx] = [f"{op} ({str(k)[:60]})" for op, k in zip(op_names, names)]
    return Collectives(wait, comm, label)


def _sized_ops(trace: Trace, acts: pd.DataFrame, idx: np.ndarray) -> np.ndarray:
    """Per collective kernel ``idx``: the CPU op carrying its input shapes (row of
    ``trace.cpu_ops``, -1 none): the op its External id names when that op has shapes, else
    the innermost op with shapes enclosing its launch call on the launching thread (NCCL
    kernels are often linked to a bookkeeping op while ``nccl:all_reduce`` holds the shapes)."""
    ops = trace.cpu_ops
    dims = ops["input_dims"].to_numpy(dtype=object)
    has_shape = re.compile(rb"\d")  # at least one tensor dimension ("[[], []]" holds no size)

    def sized(rows: np.ndarray) -> np.ndarray:
        return np.fromiter((dims[r] is not None and bool(has_shape.search(bytes(dims[r]))) for r in rows.tolist()),
                           dtype=bool, count=len(rows))

    out = np.full(len(idx), -1, dtype=np.int64)
    ext = acts["external_id"].to_numpy()[idx]
    op_ext = ops["external_id"].to_numpy()
    o = np.argsort(op_ext, kind="stable")
    pos = np.searchsorted(op_ext[o], ext)
    hit = (pos < len(o)) & (op_ext[o][np.minimum(pos, len(o) - 1)] == ext) & (ext >= 0)
    cand = np.where(hit, o[np.minimum(pos, len(o) - 1)], -1)
    ok = cand >= 0
    ok[ok] = sized(cand[ok])
    out[ok] = cand[ok]
    ls = acts["launch_start_ns"].to_numpy()[idx] if "launch_start_ns" in acts else np.full(len(idx), -1)
    tids = acts["launch_tid"].to_numpy()[idx] if "launch_tid" in acts else np.full(len(idx), -1)
    todo = (out < 0) & (tids >= 0) & (ls > 0)
    if not todo.any():
        return out
    op_tid, s, e = ops["tid"].to_numpy(), ops["start_ns"].to_numpy(), ops["end_ns"].to_numpy()
    for t in np.unique(tids[todo]):
        q = np.flatnonzero(todo & (tids == t))
        lq = np.sort(ls[q])
        rows = np.flatnonzero(op_tid == t)
        # the thread's ops that enclose some of these launches, then those with shapes
        rows = rows[np.searchsorted(lq, s[rows], side="left") < np.searchsorted(lq, e[rows], side="right")]
        rows = rows[sized(rows)]
        if not len(rows):
            continue
        rows = rows[lexsort((-(e[rows] - s[rows]), s[rows]))]
        j = last_above(e[rows], np.searchsorted(s[rows], ls[q], side="right"), ls[q])
        out[q[j >= 0]] = rows[j[j >= 0]]
    return out


def phase_collectives(c: Collectives, rows: np.ndarray) -> tuple[int, int, int, str | None]:
    """(communication ns, wait ns, calls waiting, the collective holding most of the wait) of
    the activity ``rows`` (positions in the activity table)."""
    if len(rows) == 0 or len(c.wait_ns) == 0:
        return 0, 0, 0, None
    w = c.wait_ns[rows]
    top = None
    if (w > 0).any():
        lab = pd.Series(w[w > 0]).groupby(c.label[rows][w > 0]).sum()
        top = str(lab.idxmax())
    return int(c.comm_ns[rows].sum()), int(w.sum()), int((w > 0).sum()), top
