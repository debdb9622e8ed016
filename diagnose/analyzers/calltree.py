"""Operator of a kernel through the CPU call tree, where ``External id`` does not carry it.

Kineto stamps a kernel with the ``External id`` of the innermost operator open when it was
launched; some traces carry no such link: the kernel's ``External id`` equals its correlation
id and no ``cpu_op`` has it (PyTorch 1.13-2.0 traces such as HTA's ``trace_diff`` and
``critical_path_alexnet`` examples). The launch call is still there (same correlation id, on
the launching thread), and the operators on that thread nest by time: the operator that
launched the kernel is the innermost one open at the launch call's start. That is how
TraceLens links them (``Trace2Tree``: a runtime event's parent is the innermost ``cpu_op``
containing it on its thread; a kernel's parent is its launch).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from diagnose.analyzers.graphmap import ORIGIN_CALL_TREE, ORIGIN_CALL_TREE_NODIMS, OpSources
from diagnose.analyzers.nesting import last_above, lexsort
from diagnose.trace.model import NO_TIME


def enclosing_ops(ops: pd.DataFrame, tids: np.ndarray, times: np.ndarray) -> np.ndarray:
    """For each query (thread ``tids[i]``, time ``times[i]``, ns), the row of ``ops`` of the
    innermost operator on that thread open at that time (start <= t <= end), -1 where none.

    Operators on one thread nest (a child starts and ends inside its parent); the innermost
    open one is the latest started at or before ``t`` that still runs at ``t`` (what walking
    up the parents from the latest start finds), found with numpy
    (:func:`~diagnose.analyzers.nesting.last_above`). Only operators that can contain a query
    (on a queried thread, overlapping the queries' time range) are read.

    Args:
        ops: ``Trace.cpu_ops`` (tid, start_ns, end_ns).
        tids, times: int64 arrays of equal length.

    Returns:
        int64 array of ``ops`` row positions (``iloc``), -1 where no operator is open.
    """
    out = np.full(len(times), -1, dtype=np.int64)
    if len(times) == 0 or len(ops) == 0:
        return out
    o_tid = ops["tid"].to_numpy(dtype=np.int64)
    o_s = ops["start_ns"].to_numpy(dtype=np.int64)
    o_e = ops["end_ns"].to_numpy(dtype=np.int64)
    lo, hi = int(times.min()), int(times.max())
    cand = np.isin(o_tid, np.unique(tids)) & (o_s <= hi) & (o_e >= lo)
    for t in np.unique(tids):
        q = np.nonzero(tids == t)[0]
        m = np.nonzero(cand & (o_tid == t))[0]
        if len(m) == 0:
            continue
        order = lexsort((-o_e[m], o_s[m]))  # start ascending, the enclosing (longer) one first
        rows = m[order]
        s, e = o_s[rows], o_e[rows]
        # the last operator started at or before t that still runs at t (the one a walk up
        # the call tree from the last operator started reaches)
        c = last_above(e, np.searchsorted(s, times[q], side="right"), times[q], strict=False)
        live = c >= 0
        out[q[live]] = rows[c[live]]
    return out


def link_call_tree(g: pd.DataFrame, ops: pd.DataFrame, src: np.ndarray, inst: np.ndarray, origin: np.ndarray,
                   sources: OpSources) -> None:
    """In place: activities no ``External id`` linked get the innermost operator open at their
    launch call's start on the launching thread (:func:`~diagnose.analyzers.calltree.enclosing_ops`);
    graph replays keep their own mapping (their launch is the graph's, not a node's)."""
    if "launch_tid" not in g or "launch_start_ns" not in g:
        return
    need = (src < 0) & (g["launch_tid"].to_numpy(dtype=np.int64) >= 0) & (g["launch_start_ns"].to_numpy(dtype=np.int64) != NO_TIME)
    if "launch_kind" in g:
        need &= g["launch_kind"].to_numpy(dtype=object) != "graph_launch"
    idx = np.nonzero(need)[0]
    if len(idx) == 0:
        return
    row = enclosing_ops(ops, g["launch_tid"].to_numpy(dtype=np.int64)[idx], g["launch_start_ns"].to_numpy(dtype=np.int64)[idx])
    ok = row >= 0
    if not ok.any():
        return
    assign_ops(ops, idx[ok], row[ok], src, inst, origin, sources, ORIGIN_CALL_TREE, ORIGIN_CALL_TREE_NODIMS)


def assign_ops(ops: pd.DataFrame, sel, op_row: np.ndarray, src: np.ndarray, inst: np.ndarray, origin: np.ndarray,
               sources: OpSources, with_dims: int, without_dims: int) -> None:
    """In place: activities ``sel`` (positions or a boolean mask) get the operator rows
    ``op_row`` of ``ops``: one source per distinct op call (name, input dims/types, concrete
    inputs), the call's row as its instance, and the origin ``with_dims`` or ``without_dims``
    by whether the call carries input dims."""
    op_code, used = pd.factorize(op_row, sort=False)
    cols_used = [ops[c].take(used).to_numpy(dtype=object) if c in ops else np.full(len(used), None, dtype=object)
                 for c in ("name", "input_dims", "input_types", "concrete_inputs")]
    off = sources.extend(*cols_used)
    src[sel] = off + op_code
    inst[sel] = op_row
    has_dims = ~pd.isna(cols_used[1])
    origin[sel] = np.where(has_dims[op_code], with_dims, without_dims)
